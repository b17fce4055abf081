// The cache client against a real cache server in this process (gRPC on loopback, data over tcp
// or shm): round trips, partial hits, duplicates, foreign and corrupt blocks, a dead server, a
// full cache and the write-behind queue.
#include "compute_nodes/cache_client/cache_client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "cache_service/cache_server.h"
#include "common/checksum.h"
#include "common/metrics.h"
#include "common/strings.h"
#include "transfer/fault/fault_transport.h"

namespace strata::cache_client {
namespace {

using transfer::TransportKind;

constexpr char kHost[] = "host-1";
constexpr char kSecret[] = "cluster-secret";

// bf16, 2 layers, 16 tokens, rank 32, rope 16: 3,072 payload bytes, 3,248 stored bytes.
BlockLayout Layout() {
  return {.codec = KvCodec::kBf16,
          .n_layers = 2,
          .block_tokens = 16,
          .kv_lora_rank = 32,
          .rope_dim = 16};
}

Namespace Ns(const std::string& salt) {
  return MakeNamespace({}, {.codec = KvCodec::kBf16, .block_tokens = 16}, salt);
}

std::string FreshDir(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = ::testing::TempDir() + "/cache-client-" + name + "-" +
                          std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// `n` blocks of tokens picked by `seed`.
std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n * Layout().block_tokens);
  for (size_t i = 0; i < t.size(); ++i) t[i] = seed * 7919u + static_cast<uint32_t>(i);
  return t;
}

// Payload bytes determined by the key, so any mix-up shows.
std::vector<uint8_t> Payload(const BlockKey& key) {
  std::vector<uint8_t> out(Layout().PayloadBytes());
  uint64_t state = Checksum64(key.View());
  for (size_t i = 0; i < out.size(); i += 8) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(out.data() + i, &state, std::min<size_t>(8, out.size() - i));
  }
  return out;
}

struct Chain {
  std::vector<uint32_t> tokens;
  std::vector<BlockKey> keys;
  std::vector<BlockToSave> blocks;
};

Chain MakeChain(const Namespace& ns, size_t n, uint32_t seed) {
  Chain c;
  c.tokens = Tokens(n, seed);
  c.keys = ComputeBlockKeys(ns, c.tokens, Layout().block_tokens);
  for (size_t i = 0; i < n; ++i) {
    const auto* t = c.tokens.data() + i * Layout().block_tokens;
    c.blocks.push_back({.key = c.keys[i],
                        .parent = i == 0 ? BlockKey{} : c.keys[i - 1],
                        .tokens = std::vector<uint32_t>(t, t + Layout().block_tokens)});
    c.blocks.back().OwnPayload(Payload(c.keys[i]));
  }
  return c;
}

std::vector<BlockToSave> Prefix(const Chain& c, size_t n) {
  return {c.blocks.begin(), c.blocks.begin() + static_cast<std::ptrdiff_t>(n)};
}

cache::CacheServerOptions ServerOptions(const std::string& name, uint32_t dram_slots) {
  cache::CacheServerOptions o;
  o.store.server_id = "srv-" + name;
  o.store.data_dir = FreshDir(name);
  o.store.slot_bytes = 4096;
  o.store.dram_capacity_bytes = uint64_t{dram_slots} * 4096;
  o.http_listen = "";
  o.host_id = kHost;
  o.cluster_secret = kSecret;
  o.shm_socket_path = o.store.data_dir + "/shm.sock";
  return o;
}

class CacheClientTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(256); }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  void StartServer(uint32_t dram_slots) { StartServer(ServerOptions("s", dram_slots)); }
  void StartServer(const cache::CacheServerOptions& options) {
    if (server_) server_->Shutdown();
    server_.reset();  // a restart on the same data_dir needs the index closed first
    server_ = std::make_unique<cache::CacheServer>(options);
    ASSERT_TRUE(server_->Start().ok());
  }

  CacheClientOptions Options(TransportKind kind = TransportKind::kTcp) {
    return {.address = "127.0.0.1:" + std::to_string(server_->grpc_port()),
            .client_id = "worker-1",
            .host_id = kHost,
            .cluster_secret = kSecret,
            .force_transport = kind,
            .wrap_transport = nullptr,
            .rpc_timeout = absl::Seconds(3),
            .transfer_timeout = absl::Seconds(10)};
  }

  std::unique_ptr<CacheClient> Connect(CacheClientOptions o) {
    auto client = CacheClient::Connect(std::move(o));
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  uint64_t ActiveLeases() {
    v1::GetStatsResponse stats;
    server_->store().GetStats(&stats);
    return stats.active_leases();
  }

  FetchResult FetchChain(CacheClient& client, const Namespace& ns, const Chain& c) {
    return client.Fetch(ns, c.keys, c.tokens, Layout(), "req");
  }

  std::unique_ptr<cache::CacheServer> server_;
};

void ExpectPayloads(const FetchResult& r, const Chain& c, size_t n, HitTier tier = HitTier::kDram) {
  ASSERT_EQ(r.blocks.size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(std::ranges::equal(r.blocks[i].payload, c.blocks[i].payload)) << "block " << i;
    EXPECT_EQ(r.blocks[i].tier, tier);
  }
}

TEST_F(CacheClientTest, SaveThenFetchRoundTripsOverTcpAndShm) {
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(std::string(transfer::TransportKindName(kind)));
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->transport(), kind);
    EXPECT_EQ(client->server_id(), "srv-s");
    const Namespace ns = Ns(std::string(transfer::TransportKindName(kind)));
    const Chain c = MakeChain(ns, 4, 1);

    absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->stored, 4);
    EXPECT_EQ(saved->present, 0);
    EXPECT_EQ(saved->failed, 0);
    EXPECT_TRUE(saved->first_error.ok());
    EXPECT_EQ(saved->keys_in_cache, c.keys);

    const FetchResult r = FetchChain(*client, ns, c);
    EXPECT_EQ(r.hit_blocks, 4);
    EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
    ExpectPayloads(r, c, 4);
    EXPECT_EQ(ActiveLeases(), 0u) << "the read lease outlived Fetch";
  }
}

TEST_F(CacheClientTest, FetchReadsIntoTheCallersBuffer) {
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(std::string(transfer::TransportKindName(kind)));
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns(std::string("buf-") + std::string(transfer::TransportKindName(kind)));
    const Chain c = MakeChain(ns, 3, 31);
    ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());

    std::shared_ptr<HostBuffer> given;
    size_t asked = 0;
    const FetchResult r =
        client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                      {.buffer = [&](size_t bytes) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
                        asked = bytes;
                        given = HostBuffer::Allocate(bytes + 4096);
                        return given;
                      }});
    ExpectPayloads(r, c, 3);
    EXPECT_EQ(asked, 3 * Layout().TotalBytes());
    EXPECT_EQ(r.buffer, given);
    for (const FetchedBlock& b : r.blocks) {
      EXPECT_GE(b.payload.data(), given->data());
      EXPECT_LE(b.payload.data() + b.payload.size(), given->data() + asked);
    }

    // A provider that fails, or gives too little, leaves the fetch on heap memory.
    for (const bool fails : {true, false}) {
      std::shared_ptr<HostBuffer> small;
      const FetchResult h = client->Fetch(
          ns, c.keys, c.tokens, Layout(), "req",
          {.buffer = [&](size_t bytes) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
            if (fails) return absl::ResourceExhaustedError("no pinned memory");
            small = HostBuffer::Allocate(bytes - 1);
            return small;
          }});
      ExpectPayloads(h, c, 3);
      ASSERT_NE(h.buffer, nullptr);
      EXPECT_NE(h.buffer, small);
      EXPECT_GE(h.buffer->size(), 3 * Layout().TotalBytes());
    }
    EXPECT_EQ(ActiveLeases(), 0u);
  }
}

TEST_F(CacheClientTest, PartialHitReturnsThePresentPrefix) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("partial");
  const Chain c = MakeChain(ns, 5, 2);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 2), "req").ok());

  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_EQ(r.hit_blocks, 2);
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  ExpectPayloads(r, c, 2);

  // A miss is not a failure.
  const Chain other = MakeChain(ns, 3, 3);
  const FetchResult miss = FetchChain(*client, ns, other);
  EXPECT_EQ(miss.hit_blocks, 0);
  EXPECT_TRUE(miss.blocks.empty());
  EXPECT_TRUE(miss.first_failure.ok()) << miss.first_failure;
  // Another namespace does not see these blocks.
  const Namespace ns2 = Ns("partial-2");
  const FetchResult foreign_ns = client->Fetch(ns2, c.keys, c.tokens, Layout(), "req");
  EXPECT_EQ(foreign_ns.hit_blocks, 0);
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(CacheClientTest, SavingPresentBlocksCountsThemPresent) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("present");
  const Chain c = MakeChain(ns, 5, 4);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 3), "req").ok());

  absl::StatusOr<SaveResult> again = client->Save(ns, "t", Layout(), Prefix(c, 3), "req");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stored, 0);
  EXPECT_EQ(again->present, 3);
  EXPECT_EQ(again->failed, 0);
  EXPECT_EQ(again->keys_in_cache, std::vector<BlockKey>(c.keys.begin(), c.keys.begin() + 3));

  absl::StatusOr<SaveResult> longer = client->Save(ns, "t", Layout(), c.blocks, "req");
  ASSERT_TRUE(longer.ok()) << longer.status();
  EXPECT_EQ(longer->stored, 2);
  EXPECT_EQ(longer->present, 3);
  EXPECT_EQ(longer->keys_in_cache, c.keys);
  ExpectPayloads(FetchChain(*client, ns, c), c, 5);
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(CacheClientTest, MalformedSavesAreRefusedBeforeAnyRpc) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("malformed");
  Chain c = MakeChain(ns, 3, 5);
  std::vector<BlockToSave> lying = c.blocks;
  lying[1].tokens[0] ^= 1;  // the key no longer names the tokens
  EXPECT_TRUE(absl::IsInvalidArgument(client->Save(ns, "t", Layout(), lying, "r").status()));
  std::vector<BlockToSave> broken = {c.blocks[0], c.blocks[2]};  // not a chain
  EXPECT_TRUE(absl::IsInvalidArgument(client->Save(ns, "t", Layout(), broken, "r").status()));
  std::vector<BlockToSave> short_payload = Prefix(c, 1);
  short_payload[0].payload = short_payload[0].payload.first(short_payload[0].payload.size() - 1);
  EXPECT_TRUE(
      absl::IsInvalidArgument(client->Save(ns, "t", Layout(), short_payload, "r").status()));
  EXPECT_EQ(FetchChain(*client, ns, c).hit_blocks, 0);
}

// Stores `bytes` under `key` straight through the store, as a buggy or hostile writer could.
void PutRaw(cache::BlockStore& store, const Namespace& ns, const BlockKey& key,
            const BlockKey& parent, const std::vector<uint8_t>& bytes) {
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.View()));
  req.set_tenant("t");
  auto* b = req.add_blocks();
  b->set_key(std::string(key.View()));
  b->set_parent_key(std::string(parent.View()));
  b->set_payload_bytes(bytes.size());
  v1::ReserveResponse resp;
  ASSERT_TRUE(store.Reserve(req, &resp).ok());
  ASSERT_EQ(resp.slots(0).status().code(), 0);
  std::memcpy(store.dram().base() + resp.slots(0).location().offset(), bytes.data(), bytes.size());
  v1::CommitRequest commit;
  commit.set_lease_id(resp.lease().lease_id());
  auto* cb = commit.add_blocks();
  cb->set_key(std::string(key.View()));
  cb->set_checksum(Checksum64(bytes.data(), bytes.size()));
  v1::CommitResponse cresp;
  ASSERT_TRUE(store.Commit(commit, &cresp).ok());
  ASSERT_EQ(cresp.results(0).code(), 0);
}

TEST_F(CacheClientTest, AForeignBlockEndsThePrefixAsAnIdentityMismatch) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("foreign");
  const Chain c = MakeChain(ns, 3, 6);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 1), "req").ok());
  // Block 1 is stored under its right key but carries other tokens (a collision or a forgery).
  std::vector<uint32_t> other_tokens = c.blocks[1].tokens;
  other_tokens[3] += 1;
  absl::StatusOr<std::vector<uint8_t>> foreign =
      EncodeBlock(Layout(), c.keys[1], c.keys[0], ns, other_tokens, c.blocks[1].payload);
  ASSERT_TRUE(foreign.ok());
  PutRaw(server_->store(), ns, c.keys[1], c.keys[0], *foreign);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), {c.blocks[2]}, "req").ok());

  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_EQ(r.hit_blocks, 3);
  ExpectPayloads(r, c, 1);
  EXPECT_TRUE(absl::IsNotFound(r.first_failure)) << r.first_failure;
  EXPECT_TRUE(IsBlockIdentityMismatch(r.first_failure));
  EXPECT_EQ(ActiveLeases(), 0u);

  // A block whose stored bytes are not a block at all ends the prefix as DataLoss.
  const Chain d = MakeChain(ns, 1, 7);
  std::vector<uint8_t> garbage(Layout().TotalBytes(), 0x5a);
  PutRaw(server_->store(), ns, d.keys[0], BlockKey{}, garbage);
  const FetchResult g = FetchChain(*client, ns, d);
  EXPECT_EQ(g.hit_blocks, 1);
  EXPECT_TRUE(g.blocks.empty());
  EXPECT_TRUE(absl::IsDataLoss(g.first_failure)) << g.first_failure;
}

// Every (first, count) on_blocks was called with, and whether its spans are the result's.
struct Runs {
  std::vector<std::pair<size_t, size_t>> seen;
  std::vector<const uint8_t*> payloads;  // in the order handed over
  size_t stop_after = SIZE_MAX;          // runs to accept before returning false

  FetchedBlocksFn Fn() {
    return [this](size_t first, std::span<const FetchedBlock> blocks) {
      seen.emplace_back(first, blocks.size());
      for (const FetchedBlock& b : blocks) payloads.push_back(b.payload.data());
      return seen.size() < stop_after;
    };
  }
  void ExpectCover(const FetchResult& r) const {
    ASSERT_EQ(payloads.size(), r.blocks.size());
    for (size_t i = 0; i < r.blocks.size(); ++i) EXPECT_EQ(payloads[i], r.blocks[i].payload.data());
  }
};

TEST_F(CacheClientTest, FetchHandsOverRunsOfBlocksInOrder) {
  const uint64_t block = Layout().TotalBytes();
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    SCOPED_TRACE(std::string(transfer::TransportKindName(kind)));
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns(std::string("runs-") + std::string(transfer::TransportKindName(kind)));
    const Chain c = MakeChain(ns, 10, 41);
    ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());

    // Runs of three blocks (a run size that is not a multiple of the block rounds down).
    Runs threes;
    const FetchResult r =
        client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                      {.on_blocks = threes.Fn(), .run_bytes = 3 * block + 100, .read_ahead = true});
    EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
    ExpectPayloads(r, c, 10);
    EXPECT_EQ(threes.seen,
              (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
    threes.ExpectCover(r);

    // A run size below one block reads block by block (here one run after the other); the
    // default is one run here.
    Runs ones, whole;
    ExpectPayloads(client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                                 {.on_blocks = ones.Fn(), .run_bytes = 1, .read_ahead = false}),
                   c, 10);
    EXPECT_EQ(ones.seen.size(), 10u);
    ExpectPayloads(client->Fetch(ns, c.keys, c.tokens, Layout(), "req", {.on_blocks = whole.Fn()}),
                   c, 10);
    EXPECT_EQ(whole.seen, (std::vector<std::pair<size_t, size_t>>{{0, 10}}));
    EXPECT_EQ(ActiveLeases(), 0u);
  }
}

// Records the region offered for reads in place and answers `take`.
struct InPlace {
  bool take = true;
  int asked = 0;
  std::span<const uint8_t> region;
  InPlaceFn Fn() {
    return [this](std::span<const uint8_t> r, const std::shared_ptr<const void>& owner) {
      ++asked;
      region = r;
      EXPECT_NE(owner, nullptr);
      return take;
    };
  }
  bool Holds(std::span<const uint8_t> bytes) const {
    return bytes.data() >= region.data() &&
           bytes.data() + bytes.size() <= region.data() + region.size();
  }
};

// strata_cache_client_in_place_blocks_total (registering an existing family again returns it).
double InPlaceBlocks() {
  return MetricsRegistry::Default()
      .AddCounter("strata_cache_client_in_place_blocks_total", "", {})
      .Labels({})
      .Value();
}

TEST_F(CacheClientTest, FetchReadsInPlaceFromAMappedServer) {
  for (const TransportKind kind : {TransportKind::kShm, TransportKind::kTcp}) {
    for (const bool take : {true, false}) {
      SCOPED_TRACE(std::string(transfer::TransportKindName(kind)) + (take ? "" : ", declined"));
      auto client = Connect(Options(kind));
      ASSERT_NE(client, nullptr);
      const Namespace ns =
          Ns(std::string("inplace-") + std::string(transfer::TransportKindName(kind)));
      const Chain c = MakeChain(ns, 7, 53);
      ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());

      InPlace in_place{.take = take};
      const double in_place0 = InPlaceBlocks();
      int buffers = 0;
      bool all_in_region = true, all_equal = true;
      Runs runs;
      FetchedBlocksFn record = runs.Fn();
      const FetchResult r = client->Fetch(
          ns, c.keys, c.tokens, Layout(), "req",
          {.buffer = [&](size_t bytes) -> absl::StatusOr<std::shared_ptr<HostBuffer>> {
             ++buffers;
             return HostBuffer::Allocate(bytes);
           },
           .on_blocks =
               [&](size_t first, std::span<const FetchedBlock> blocks) {
                 for (size_t i = 0; i < blocks.size(); ++i) {
                   all_in_region &= in_place.Holds(blocks[i].payload);
                   all_equal &= std::ranges::equal(blocks[i].payload, c.blocks[first + i].payload);
                 }
                 return record(first, blocks);
               },
           .in_place = in_place.Fn(),
           .run_bytes = 3 * Layout().TotalBytes(),
           .read_ahead = true});
      EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
      EXPECT_EQ(r.blocks.size(), 7u);
      EXPECT_TRUE(all_equal);
      EXPECT_EQ(runs.seen.size(), 3u);
      const bool mapped = kind == TransportKind::kShm && take;
      EXPECT_EQ(in_place.asked, kind == TransportKind::kShm ? 1 : 0);
      EXPECT_EQ(all_in_region, mapped);
      EXPECT_EQ(r.mapping != nullptr, mapped);
      EXPECT_EQ(r.buffer != nullptr, !mapped);
      EXPECT_EQ(buffers, mapped ? 0 : 1);
      EXPECT_EQ(InPlaceBlocks() - in_place0, mapped ? 7 : 0);
      EXPECT_EQ(ActiveLeases(), 0u);
    }
  }
}

TEST_F(CacheClientTest, ACallerThatStopsTheFetchGetsNoMoreBlocks) {
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("stop");
  const Chain c = MakeChain(ns, 8, 43);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  Runs runs;
  runs.stop_after = 2;
  const FetchResult r = client->Fetch(
      ns, c.keys, c.tokens, Layout(), "req",
      {.on_blocks = runs.Fn(), .run_bytes = 2 * Layout().TotalBytes(), .read_ahead = true});
  EXPECT_EQ(r.hit_blocks, 8);
  EXPECT_TRUE(absl::IsCancelled(r.first_failure)) << r.first_failure;
  ExpectPayloads(r, c, 4);
  EXPECT_EQ(runs.seen, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 2}}));
  runs.ExpectCover(r);
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(CacheClientTest, ABadBlockInALaterRunEndsThePrefixThere) {
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("bad-run");
  const Chain c = MakeChain(ns, 8, 47);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), Prefix(c, 5), "req").ok());
  std::vector<uint8_t> garbage(Layout().TotalBytes(), 0x5a);  // block 5: not a block at all
  PutRaw(server_->store(), ns, c.keys[5], c.keys[4], garbage);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), {c.blocks[6], c.blocks[7]}, "req").ok());

  for (const bool mapped : {false, true}) {
    SCOPED_TRACE(mapped ? "in place" : "copied");
    Runs runs;
    InPlace in_place;
    const FetchResult r = client->Fetch(ns, c.keys, c.tokens, Layout(), "req",
                                        {.on_blocks = runs.Fn(),
                                         .in_place = mapped ? in_place.Fn() : InPlaceFn(),
                                         .run_bytes = 2 * Layout().TotalBytes(),
                                         .read_ahead = true});
    EXPECT_EQ(r.mapping != nullptr, mapped);
    EXPECT_EQ(r.hit_blocks, 8);
    EXPECT_TRUE(absl::IsDataLoss(r.first_failure)) << r.first_failure;
    EXPECT_NE(r.first_failure.message().find("block 5"), std::string::npos) << r.first_failure;
    // The run holding block 5 is handed over up to it; nothing after it is handed over.
    EXPECT_EQ(runs.seen, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 2}, {4, 1}}));
    runs.ExpectCover(r);
    if (!mapped) ExpectPayloads(r, c, 5);  // in place, the payloads were valid in on_blocks only
    EXPECT_EQ(ActiveLeases(), 0u);
  }
}

TEST_F(CacheClientTest, CorruptReadsAreCaughtAndTheServerStillServesOthers) {
  auto clean = Connect(Options());
  ASSERT_NE(clean, nullptr);
  const Namespace ns = Ns("corrupt");
  const Chain c = MakeChain(ns, 3, 8);
  ASSERT_TRUE(clean->Save(ns, "t", Layout(), c.blocks, "req").ok());

  auto counters = std::make_shared<transfer::FaultCounters>();
  CacheClientOptions o = Options();
  o.client_id = "faulty";
  o.wrap_transport = [counters](std::unique_ptr<transfer::Transport> t) {
    return std::make_unique<transfer::FaultInjectingTransport>(
        std::move(t), transfer::FaultPolicy{.corrupt = 1.0}, counters);
  };
  auto faulty = Connect(std::move(o));
  ASSERT_NE(faulty, nullptr);
  const FetchResult bad = FetchChain(*faulty, ns, c);
  EXPECT_EQ(bad.hit_blocks, 3);
  EXPECT_TRUE(bad.blocks.empty());
  EXPECT_TRUE(absl::IsDataLoss(bad.first_failure)) << bad.first_failure;
  EXPECT_GT(counters->corrupted.load(), 0);
  EXPECT_EQ(ActiveLeases(), 0u);

  // Corrupt writes do not get committed either.
  const Chain w = MakeChain(ns, 2, 9);
  absl::StatusOr<SaveResult> saved = faulty->Save(ns, "t", Layout(), w.blocks, "req");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->stored, 0);
  EXPECT_EQ(saved->failed, 2);
  EXPECT_TRUE(absl::IsDataLoss(saved->first_error)) << saved->first_error;
  EXPECT_EQ(FetchChain(*clean, ns, w).hit_blocks, 0);

  ExpectPayloads(FetchChain(*clean, ns, c), c, 3);
}

double CounterValue(const std::string& name, const std::vector<std::string>& label_names,
                    const std::vector<std::string>& values) {
  // Registering an existing family again returns it.
  return MetricsRegistry::Default().AddCounter(name, "", label_names).Labels(values).Value();
}

TEST_F(CacheClientTest, MetricsCountBlocksBytesAndFailures) {
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("metrics");
  const Chain c = MakeChain(ns, 3, 16);
  const double block = static_cast<double>(Layout().TotalBytes());
  auto stored = [] {
    return CounterValue("strata_cache_client_saved_blocks_total", {"outcome"}, {"stored"});
  };
  auto present = [] {
    return CounterValue("strata_cache_client_saved_blocks_total", {"outcome"}, {"present"});
  };
  auto fetched = [] {
    return CounterValue("strata_cache_client_fetched_blocks_total", {"tier"}, {"dram"});
  };
  auto bytes = [](const std::string& direction) {
    return CounterValue("strata_cache_client_bytes_total", {"direction", "transport"},
                        {direction, "tcp"});
  };
  auto data_loss = [] {
    return CounterValue("strata_cache_client_fetch_failures_total", {"reason"}, {"data_loss"});
  };
  const double stored0 = stored(), present0 = present(), fetched0 = fetched();
  const double written0 = bytes("write"), read0 = bytes("read"), loss0 = data_loss();

  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  ASSERT_EQ(FetchChain(*client, ns, c).blocks.size(), 3u);
  EXPECT_EQ(stored() - stored0, 3);
  EXPECT_EQ(present() - present0, 3);
  EXPECT_EQ(fetched() - fetched0, 3);
  EXPECT_EQ(bytes("write") - written0, 3 * block);
  EXPECT_EQ(bytes("read") - read0, 3 * block);

  CacheClientOptions o = Options();
  o.wrap_transport = [](std::unique_ptr<transfer::Transport> t) {
    return std::make_unique<transfer::FaultInjectingTransport>(
        std::move(t), transfer::FaultPolicy{.corrupt = 1.0});
  };
  auto faulty = Connect(std::move(o));
  ASSERT_NE(faulty, nullptr);
  EXPECT_TRUE(absl::IsDataLoss(FetchChain(*faulty, ns, c).first_failure));
  EXPECT_EQ(data_loss() - loss0, 1);
  const std::string text = MetricsRegistry::Default().RenderPrometheus();
  EXPECT_NE(text.find("strata_cache_client_fetched_blocks_total{tier=\"dram\"}"),
            std::string::npos);
}

TEST_F(CacheClientTest, ReadsThatNeverCompleteEndAtTheTransferTimeout) {
  auto clean = Connect(Options());
  ASSERT_NE(clean, nullptr);
  const Namespace ns = Ns("drop");
  const Chain c = MakeChain(ns, 2, 14);
  ASSERT_TRUE(clean->Save(ns, "t", Layout(), c.blocks, "req").ok());
  CacheClientOptions o = Options();
  o.transfer_timeout = absl::Milliseconds(500);
  o.wrap_transport = [](std::unique_ptr<transfer::Transport> t) {
    return std::make_unique<transfer::FaultInjectingTransport>(std::move(t),
                                                               transfer::FaultPolicy{.drop = 1.0});
  };
  auto dropping = Connect(std::move(o));
  ASSERT_NE(dropping, nullptr);
  const FetchResult r = FetchChain(*dropping, ns, c);
  EXPECT_EQ(r.hit_blocks, 2);
  EXPECT_TRUE(r.blocks.empty());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.first_failure)) << r.first_failure;
  EXPECT_EQ(ActiveLeases(), 0u);
}

TEST_F(CacheClientTest, BlocksOnSsdAfterARestartArePromotedAndReadBack) {
  cache::CacheServerOptions o = ServerOptions("ssd", 64);
  o.store.ssd_capacity_bytes = 64 * 4096;
  StartServer(o);
  const Namespace ns = Ns("ssd");
  const Chain c = MakeChain(ns, 3, 15);
  {
    auto client = Connect(Options());
    ASSERT_NE(client, nullptr);
    absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(saved->stored, 3);
  }
  // DRAM residency does not survive a restart; the SSD copies do.
  StartServer(o);
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_EQ(r.hit_blocks, 3);
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  // Lookup(promote) copies SSD hits to DRAM and serves them from there; they count as SSD hits.
  ExpectPayloads(r, c, 3, HitTier::kSsd);
  EXPECT_EQ(ActiveLeases(), 0u);
  // Now in DRAM: the next fetch is a DRAM hit.
  ExpectPayloads(FetchChain(*client, ns, c), c, 3, HitTier::kDram);
}

TEST_F(CacheClientTest, AClientFindsARestartedServerAgain) {
  for (const TransportKind kind : {TransportKind::kTcp, TransportKind::kShm}) {
    const std::string name(transfer::TransportKindName(kind));
    SCOPED_TRACE(name);
    cache::CacheServerOptions o = ServerOptions("restart-" + name, 256);
    StartServer(o);
    auto client = Connect(Options(kind));
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns("restart-" + name);
    ASSERT_TRUE(client->Save(ns, "t", Layout(), MakeChain(ns, 2, 20).blocks, "req").ok());

    // Same gRPC address; new transfer ports and a new DRAM arena.
    o.listen = "127.0.0.1:" + std::to_string(server_->grpc_port());
    StartServer(o);
    const Chain c = MakeChain(ns, 2, 21);
    // The first calls may fail while the client notices; bounded retries, no timing asserted.
    bool round_trip = false;
    for (int attempt = 0; attempt < 30 && !round_trip; ++attempt) {
      absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
      if (saved.ok() && saved->stored + saved->present == 2) {
        const FetchResult r = FetchChain(*client, ns, c);
        round_trip = r.blocks.size() == 2 &&
                     std::ranges::equal(r.blocks[0].payload, c.blocks[0].payload) &&
                     std::ranges::equal(r.blocks[1].payload, c.blocks[1].payload);
      }
      if (!round_trip) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    EXPECT_TRUE(round_trip);
    EXPECT_EQ(client->transport(), kind);
  }
}

// A fetch in place through a data path gone stale (the old arena is still mapped) finds the
// restarted server's new arena and reads there.
TEST_F(CacheClientTest, AFetchInPlaceFindsTheRestartedServersArena) {
  cache::CacheServerOptions o = ServerOptions("restart-in-place", 256);
  StartServer(o);
  auto client = Connect(Options(TransportKind::kShm));
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("restart-in-place");
  const Chain before = MakeChain(ns, 2, 60);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), before.blocks, "req").ok());
  InPlace first;
  ASSERT_EQ(client->Fetch(ns, before.keys, before.tokens, Layout(), "req", {.in_place = first.Fn()})
                .blocks.size(),
            2u);

  o.listen = "127.0.0.1:" + std::to_string(server_->grpc_port());
  StartServer(o);
  const Chain c = MakeChain(ns, 3, 61);
  {
    auto other = Connect(Options(TransportKind::kShm));  // stores the blocks; `client` is stale
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(other->Save(ns, "t", Layout(), c.blocks, "req").ok());
  }
  InPlace again;
  bool equal = true;
  const FetchResult r = client->Fetch(
      ns, c.keys, c.tokens, Layout(), "req",
      {.on_blocks =
           [&](size_t first_block, std::span<const FetchedBlock> blocks) {
             for (size_t i = 0; i < blocks.size(); ++i) {
               equal &= std::ranges::equal(blocks[i].payload, c.blocks[first_block + i].payload);
             }
             return true;
           },
       .in_place = again.Fn()});
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  EXPECT_EQ(r.blocks.size(), 3u);
  EXPECT_TRUE(equal);
  EXPECT_NE(r.mapping, nullptr);
  EXPECT_EQ(again.asked, 2);  // the old arena, then the new one (maybe at the same address)
}

TEST_F(CacheClientTest, ADeadServerEndsFetchesAndFailsSaves) {
  CacheClientOptions o = Options();
  o.rpc_timeout = absl::Seconds(2);
  o.transfer_timeout = absl::Seconds(2);
  auto client = Connect(o);
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("dead");
  const Chain c = MakeChain(ns, 3, 10);
  ASSERT_TRUE(client->Save(ns, "t", Layout(), c.blocks, "req").ok());
  server_->Shutdown();

  const auto start = std::chrono::steady_clock::now();
  const FetchResult r = FetchChain(*client, ns, c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(r.blocks.empty());
  EXPECT_TRUE(absl::IsUnavailable(r.first_failure) || absl::IsDeadlineExceeded(r.first_failure))
      << r.first_failure;
  // Bounded by the RPC and transfer timeouts, with generous slack for a loaded machine.
  EXPECT_LT(seconds, 30.0);

  absl::StatusOr<SaveResult> saved =
      client->Save(ns, "t", Layout(), MakeChain(ns, 2, 11).blocks, "req");
  EXPECT_FALSE(saved.ok());
  std::atomic<int> calls{0};
  absl::Status async_status;
  client->SaveAsync(ns, "t", Layout(), MakeChain(ns, 2, 12).blocks, "req",
                    [&](absl::StatusOr<SaveResult> result) {
                      async_status = result.status();
                      calls.fetch_add(1);
                    });
  client->FlushSaves();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(async_status.ok());
}

TEST(CacheClientConnectTest, UnreachableServerIsUnavailableAndNamesTheAddress) {
  CacheClientOptions o;
  o.address = "127.0.0.1:1";
  o.client_id = "w";
  o.host_id = kHost;
  o.rpc_timeout = absl::Seconds(2);
  auto client = CacheClient::Connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_NE(client.status().message().find("127.0.0.1:1"), absl::string_view::npos);
}

TEST_F(CacheClientTest, SaveAsyncCompletesEveryBatchWithinTheByteBound) {
  constexpr int kThreads = 2;
  constexpr int kBatchesPerThread = 12;
  constexpr int kBlocks = 2;
  const uint64_t batch_bytes = kBlocks * (Layout().PayloadBytes() + 4ull * Layout().block_tokens);
  // Smaller than one batch (batches go one at a time, none deadlocks), then room for two and a
  // half (callers and the save thread overlap).
  for (const uint64_t bound : {uint64_t{1000}, batch_bytes * 5 / 2}) {
    SCOPED_TRACE(bound);
    CacheClientOptions o = Options(TransportKind::kShm);
    o.max_pending_save_bytes = bound;
    auto client = Connect(o);
    ASSERT_NE(client, nullptr);
    const Namespace ns = Ns(StrCat("async-", bound));
    std::vector<Chain> chains;
    for (int i = 0; i < kThreads * kBatchesPerThread; ++i) {
      chains.push_back(MakeChain(ns, kBlocks, 100 + i));
    }
    std::vector<std::atomic<int>> calls(chains.size());
    std::vector<std::atomic<int64_t>> stored(chains.size());
    std::atomic<uint64_t> max_pending{0};
    auto observe_pending = [&] {
      const uint64_t p = client->pending_save_bytes();
      uint64_t seen = max_pending.load();
      while (p > seen && !max_pending.compare_exchange_weak(seen, p)) {
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int b = 0; b < kBatchesPerThread; ++b) {
          const size_t i = t * kBatchesPerThread + b;
          client->SaveAsync(ns, "t", Layout(), chains[i].blocks, "req",
                            [&, i](absl::StatusOr<SaveResult> r) {
                              calls[i].fetch_add(1);
                              stored[i].store(r.ok() ? r->stored : -1);
                              observe_pending();
                            });
          observe_pending();
        }
      });
    }
    for (auto& th : threads) th.join();
    client->FlushSaves();
    EXPECT_EQ(client->pending_save_bytes(), 0u);
    for (size_t i = 0; i < chains.size(); ++i) {
      EXPECT_EQ(calls[i].load(), 1) << "batch " << i;
      EXPECT_EQ(stored[i].load(), kBlocks) << "batch " << i;
    }
    EXPECT_LE(max_pending.load(), std::max(bound, batch_bytes));
    for (const Chain& c : chains) ExpectPayloads(FetchChain(*client, ns, c), c, kBlocks);

    // The destructor drains what is still queued.
    std::atomic<int> late{0};
    for (int i = 0; i < 4; ++i) {
      client->SaveAsync(ns, "t", Layout(), MakeChain(ns, 1, 500 + i).blocks, "req",
                        [&](absl::StatusOr<SaveResult> r) { late.fetch_add(r.ok() ? 1 : 100); });
    }
    client.reset();
    EXPECT_EQ(late.load(), 4);
  }
}

TEST_F(CacheClientTest, AFullCacheRefusesSomeBlocksAndStoresTheRest) {
  StartServer(4);
  auto client = Connect(Options());
  ASSERT_NE(client, nullptr);
  const Namespace ns = Ns("full");
  const Chain c = MakeChain(ns, 8, 13);
  absl::StatusOr<SaveResult> saved = client->Save(ns, "t", Layout(), c.blocks, "req");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_GT(saved->failed, 0);
  EXPECT_GT(saved->stored, 0);
  EXPECT_EQ(saved->stored + saved->failed, 8);
  EXPECT_TRUE(absl::IsResourceExhausted(saved->first_error)) << saved->first_error;
  ASSERT_EQ(saved->keys_in_cache.size(), static_cast<size_t>(saved->stored));
  EXPECT_EQ(saved->keys_in_cache[0], c.keys[0]);
  EXPECT_EQ(ActiveLeases(), 0u);
  // Whatever prefix is still resident reads back intact.
  const FetchResult r = FetchChain(*client, ns, c);
  EXPECT_TRUE(r.first_failure.ok()) << r.first_failure;
  ExpectPayloads(r, c, r.blocks.size());
}

}  // namespace
}  // namespace strata::cache_client
