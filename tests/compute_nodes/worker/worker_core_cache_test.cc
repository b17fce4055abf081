// WorkerCore in process with an in-process cache server: a prompt's full blocks are saved after
// the first request and loaded by the second, whose tokens equal the first's; once with the
// pool's reusable load and save buffers (the default) and once with both turned off (fetches to
// heap buffers, saves from heap vectors), over shm and over tcp; and with fp8 blocks, which the
// cache then holds (in the fp8 namespace) and every later request loads alike.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include "cache_service/cache_server.h"
#include "common/block_format.h"
#include "common/block_key.h"
#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/worker/cache_directory.h"
#include "compute_nodes/worker/worker_core.h"
#include "tests/compute_nodes/worker/tiny_model.h"

namespace strata::worker {
namespace {

using testutil::TinyModel;

struct Done {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::optional<RequestOutcome> outcome;

  RequestEvents Events() {
    return {.on_tokens =
                [this](std::span<const int32_t> ids) {
                  std::lock_guard<std::mutex> lock(mu);
                  tokens.insert(tokens.end(), ids.begin(), ids.end());
                },
            .on_done =
                [this](const RequestOutcome& o) {
                  std::lock_guard<std::mutex> lock(mu);
                  outcome = o;
                  cv.notify_all();
                }};
  }
  RequestOutcome Wait() {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return outcome.has_value(); }));
    return outcome.value_or(RequestOutcome{});
  }
};

struct Case {
  bool buffers;
  transfer::TransportKind transport;
  KvCodec codec = KvCodec::kBf16;
};

class WorkerCoreCacheTest : public testing::TestWithParam<Case> {};

TEST_P(WorkerCoreCacheTest, SecondRequestLoadsTheSavedBlocksAndAgrees) {
  const Case c = GetParam();
  const std::string dir = testing::TempDir() + "/worker-core-cache-" + std::to_string(getpid()) +
                          (c.buffers ? "-buf" : "-heap") +
                          std::to_string(static_cast<int>(c.transport)) +
                          std::string(KvCodecName(c.codec));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::shared_ptr<const model::ModelWeights> weights = TinyModel();
  const model::ModelConfig& config = weights->config;
  KvFormat format;
  format.codec = c.codec;
  const BlockLayout layout = MakeBlockLayout(
      format, static_cast<uint32_t>(config.num_hidden_layers),
      static_cast<uint32_t>(config.kv_lora_rank), static_cast<uint32_t>(config.qk_rope_head_dim));
  cache::CacheServerOptions so;
  so.store.data_dir = dir + "/cache";
  so.store.slot_bytes = (layout.TotalBytes() + 4095) / 4096 * 4096;
  so.store.dram_capacity_bytes = 64 * so.store.slot_bytes;
  so.host_id = "worker-core-cache";
  so.http_listen = "";
  so.cluster_secret = "test";
  so.transfer_listen = "127.0.0.1:0";
  so.shm_socket_path = dir + "/shm.sock";
  cache::CacheServer server(so);
  ASSERT_TRUE(server.Start().ok());
  CacheDirectory caches(
      cache_client::CacheClientOptions{.address = "127.0.0.1:" + std::to_string(server.grpc_port()),
                                       .client_id = "worker-core-cache",
                                       .host_id = "worker-core-cache",
                                       .cluster_secret = "test",
                                       .force_transport = c.transport});

  cpu::CpuEngine engine(weights, 32, 64, runtime::KvPrecision::kBf16);
  WorkerCoreOptions options;
  if (!c.buffers) options.load_buffer_bytes = options.save_buffer_bytes = 0;
  options.cache_codec = c.codec;
  WorkerCore core(engine, caches, options);
  core.Start();

  std::mt19937 rng(11);
  std::vector<int32_t> prompt(200);
  for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % 100000);
  auto run = [&](const std::string& id, Done* done) {
    RequestSpec spec;
    spec.id = id;
    spec.prompt = prompt;
    spec.sampling.max_tokens = 8;
    spec.ns = MakeNamespace(weights->fingerprint, format, "t");
    spec.tenant = "t";
    ASSERT_TRUE(core.Submit(std::move(spec), done->Events()).ok());
  };
  Done first, second;
  run("first", &first);
  const RequestOutcome a = first.Wait();  // after its blocks are committed
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.cached.total, 0);
  run("second", &second);
  const RequestOutcome b = second.Wait();
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_EQ(b.cached.total, 192) << "three full blocks of 64 tokens";
  EXPECT_EQ(b.computed_tokens, 8);
  if (c.codec == KvCodec::kBf16) {
    EXPECT_EQ(second.tokens, first.tokens);  // bf16 blocks restore the pages bit for bit
  } else {
    // fp8 blocks restore them at fp8 precision: every request that loads them agrees.
    Done third;
    run("third", &third);
    const RequestOutcome t = third.Wait();
    ASSERT_TRUE(t.status.ok()) << t.status;
    EXPECT_EQ(t.cached.total, 192);
    EXPECT_EQ(third.tokens, second.tokens);
    EXPECT_EQ(second.tokens.size(), first.tokens.size());
  }
  // The cache holds the three blocks in this codec's layout, under this codec's namespace.
  const std::vector<uint32_t> ids(prompt.begin(), prompt.begin() + 192);
  const Namespace ns = MakeNamespace(weights->fingerprint, format, "t");
  const std::vector<BlockKey> keys = ComputeBlockKeys(ns, ids, 64);
  cache_client::CacheClient* client = caches.Get("");
  ASSERT_NE(client, nullptr);
  const cache_client::FetchResult stored = client->Fetch(ns, keys, ids, layout, "check");
  EXPECT_EQ(stored.blocks.size(), 3u) << stored.first_failure;
  for (const cache_client::FetchedBlock& blk : stored.blocks) {
    EXPECT_EQ(blk.payload.size(), layout.PayloadBytes());
  }
  core.Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

INSTANTIATE_TEST_SUITE_P(
    BuffersAndTransports, WorkerCoreCacheTest,
    testing::Values(Case{true, transfer::TransportKind::kShm},
                    Case{false, transfer::TransportKind::kShm},
                    Case{true, transfer::TransportKind::kTcp},
                    Case{false, transfer::TransportKind::kTcp},
                    Case{true, transfer::TransportKind::kShm, KvCodec::kFp8E4M3},
                    Case{false, transfer::TransportKind::kTcp, KvCodec::kFp8E4M3}),
    [](const testing::TestParamInfo<Case>& i) {
      return std::string(i.param.buffers ? "PoolBuffers" : "HeapOnly") +
             (i.param.transport == transfer::TransportKind::kShm ? "Shm" : "Tcp") +
             (i.param.codec == KvCodec::kFp8E4M3 ? "Fp8" : "");
    });

}  // namespace
}  // namespace strata::worker
