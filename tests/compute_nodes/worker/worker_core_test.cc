// WorkerCore in process, without a cache server: continuous batching with chunked prefill equals
// one request at a time, swaps by recomputation keep outputs, bad requests are refused, cancel and
// stop end requests and free their pages; ended sequences' full blocks stay resident in the pool,
// are reused by later prompts (shared between concurrent ones) and give their pages back under
// pressure, tail first.
#include "compute_nodes/worker/worker_core.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/runtime/generate.h"
#include "tests/compute_nodes/worker/tiny_model.h"

namespace strata::worker {
namespace {

using testutil::TinyModel;

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 100000);
  return ids;
}

std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens) {
  cpu::CpuEngine engine(TinyModel(), (prompt.size() + max_tokens) / 64 + 2, 64,
                        runtime::KvPrecision::kBf16);
  runtime::SamplingParams params;
  params.max_tokens = max_tokens;
  auto result = runtime::Generate(engine, prompt, params, 512);
  EXPECT_TRUE(result.ok()) << result.status();
  return result->tokens;
}

// Collects one request's tokens and outcome.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::optional<RequestOutcome> done;

  RequestEvents Events() {
    return {.on_tokens =
                [this](std::span<const int32_t> ids) {
                  std::lock_guard<std::mutex> lock(mu);
                  tokens.insert(tokens.end(), ids.begin(), ids.end());
                  cv.notify_all();
                },
            .on_done =
                [this](const RequestOutcome& o) {
                  std::lock_guard<std::mutex> lock(mu);
                  done = o;
                  cv.notify_all();
                }};
  }
  RequestOutcome Wait() {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done.has_value(); }));
    return done.value_or(RequestOutcome{});
  }
  size_t TokenCount() {
    std::lock_guard<std::mutex> lock(mu);
    return tokens.size();
  }
};

RequestSpec Spec(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  RequestSpec spec;
  spec.id = id;
  spec.prompt = std::move(prompt);
  spec.sampling.max_tokens = max_tokens;
  return spec;
}

class WorkerCoreTest : public testing::Test {
 protected:
  void Make(int64_t pages, WorkerCoreOptions options = {}) {
    core_.reset();  // before the engine it uses
    engine_ = std::make_unique<cpu::CpuEngine>(TinyModel(), pages, 64, runtime::KvPrecision::kBf16);
    core_ = std::make_unique<WorkerCore>(*engine_, caches_, options);
    core_->Start();
  }

  // Every page is free or held only by an idle resident block: no sequence holds one.
  void ExpectNoPageHeld(int64_t pages) {
    EXPECT_EQ(engine_->kv_pool().free_pages() + core_->resident().idle_blocks(), pages);
    EXPECT_EQ(core_->resident().resident_blocks(), core_->resident().idle_blocks());
    // The load report is refreshed after the step that ended the last request.
    for (int i = 0; i < 200 && core_->Load().free_kv_pages() != pages; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(core_->Load().free_kv_pages(), static_cast<uint32_t>(pages));
  }

  CacheDirectory caches_{cache_client::CacheClientOptions{}};  // no cache server
  std::unique_ptr<cpu::CpuEngine> engine_;
  std::unique_ptr<WorkerCore> core_;
};

TEST_F(WorkerCoreTest, ContinuousBatchingEqualsOneAtATime) {
  // A budget of 96 tokens per step: long prompts are chunked and share steps with decodes.
  Make(64, {.token_budget = 96});
  const std::vector<int> lengths = {30, 300, 64, 150, 7, 200};
  std::vector<Collector> out(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_TRUE(
        core_->Submit(Spec("r" + std::to_string(i), Prompt(lengths[i], i + 1), 20), out[i].Events())
            .ok());
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    const RequestOutcome o = out[i].Wait();
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.finish, Finish::kLength);
    EXPECT_EQ(o.computed_tokens, lengths[i]);
    EXPECT_EQ(o.completion_tokens, 20);
    EXPECT_EQ(out[i].tokens, Reference(Prompt(lengths[i], i + 1), 20)) << i;
  }
  ExpectNoPageHeld(64);
  EXPECT_GT(core_->stats().steps, 20);
}

TEST_F(WorkerCoreTest, SwapWithoutACacheRecomputesAndKeepsOutputs) {
  // 6 pages; three sequences of 100 + 120 tokens need 12. With resident blocks a swapped-out
  // sequence may find some of its blocks still in the pool when it comes back; without them
  // every swap-in recomputes.
  for (const bool resident : {false, true}) {
    SCOPED_TRACE(resident ? "resident blocks on" : "resident blocks off");
    Make(6, {.resident_blocks = resident});
    std::vector<Collector> out(3);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(
          core_->Submit(Spec("s" + std::to_string(i), Prompt(100, 40 + i), 120), out[i].Events())
              .ok());
    }
    for (int i = 0; i < 3; ++i) {
      const RequestOutcome o = out[i].Wait();
      EXPECT_TRUE(o.status.ok()) << o.status;
      EXPECT_EQ(out[i].tokens, Reference(Prompt(100, 40 + i), 120)) << i;
    }
    const WorkerStats stats = core_->stats();
    EXPECT_GT(stats.swapped_out, 0);
    EXPECT_EQ(stats.swapped_in, stats.swapped_out);
    if (resident) {
      EXPECT_LE(stats.recomputed_swaps, stats.swapped_in);
    } else {
      EXPECT_EQ(stats.recomputed_swaps, stats.swapped_in);
      EXPECT_EQ(stats.resident_tokens, 0);
    }
    ExpectNoPageHeld(6);
    core_->Stop();  // which lets the idle blocks go
    EXPECT_EQ(engine_->kv_pool().free_pages(), 6);
  }
}

// A decode request continuing from a first token drawn elsewhere samples the same seeded stream
// as one request that did both.
TEST_F(WorkerCoreTest, SeededSamplingSurvivesTheHandOver) {
  Make(16);
  RequestSpec whole = Spec("whole", Prompt(90, 8), 24);
  whole.sampling.temperature = 0.9f;
  whole.sampling.top_k = 50;
  whole.sampling.seed = 1234;
  Collector a;
  ASSERT_TRUE(core_->Submit(whole, a.Events()).ok());
  ASSERT_TRUE(a.Wait().status.ok());
  ASSERT_EQ(a.tokens.size(), 24u);

  RequestSpec decode = whole;
  decode.id = "decode";
  decode.kind = RequestKind::kDecode;
  decode.first_token = a.tokens[0];
  Collector b;
  ASSERT_TRUE(core_->Submit(decode, b.Events()).ok());
  ASSERT_TRUE(b.Wait().status.ok());
  EXPECT_EQ(b.tokens, a.tokens);
}

TEST_F(WorkerCoreTest, RefusesBadRequests) {
  Make(4, {.max_queued = 1});
  Collector c;
  EXPECT_EQ(core_->Submit(Spec("a", {}, 4), c.Events()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->Submit(Spec("b", {1, 2, 200000}, 4), c.Events()).code(),
            absl::StatusCode::kInvalidArgument);
  RequestSpec decode = Spec("c", {1, 2, 3}, 4);
  decode.kind = RequestKind::kDecode;  // without first_token
  EXPECT_EQ(core_->Submit(decode, c.Events()).code(), absl::StatusCode::kInvalidArgument);
  // 4 pages of 64 tokens cannot hold a 300-token prompt.
  EXPECT_EQ(core_->Submit(Spec("d", Prompt(300, 1), 4), c.Events()).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core_->Submit(Spec("e", Prompt(3000, 1), 4), c.Events()).code(),
            absl::StatusCode::kInvalidArgument);  // past the context limit (2048)
  Collector long_running, dup;
  ASSERT_TRUE(core_->Submit(Spec("f", Prompt(10, 1), 100000), long_running.Events()).ok());
  EXPECT_EQ(core_->Submit(Spec("f", Prompt(10, 1), 4), dup.Events()).code(),
            absl::StatusCode::kInvalidArgument);
  core_->Cancel("f");
  long_running.Wait();
  core_->Stop();
  EXPECT_EQ(core_->Submit(Spec("g", Prompt(10, 1), 4), c.Events()).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(c.done.has_value());  // refused requests get no callbacks
}

TEST_F(WorkerCoreTest, CancelAndStopEndRequestsAndFreePages) {
  Make(8);
  Collector a, b;
  ASSERT_TRUE(core_->Submit(Spec("a", Prompt(50, 1), 100000), a.Events()).ok());
  ASSERT_TRUE(core_->Submit(Spec("b", Prompt(50, 2), 100000), b.Events()).ok());
  for (int i = 0; i < 2000 && a.TokenCount() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(core_->Cancel("a"));
  const RequestOutcome oa = a.Wait();
  EXPECT_EQ(oa.finish, Finish::kCancelled);
  EXPECT_EQ(oa.status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(core_->Cancel("a"));  // gone
  core_->Stop();
  const RequestOutcome ob = b.Wait();
  EXPECT_EQ(ob.finish, Finish::kError);
  EXPECT_EQ(ob.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine_->kv_pool().free_pages(), 8);
}

TEST_F(WorkerCoreTest, LoadReportsQueueAndPages) {
  Make(8);
  const v1::WorkerLoad idle = core_->Load();
  EXPECT_EQ(idle.total_kv_pages(), 8u);
  EXPECT_EQ(idle.free_kv_pages(), 8u);
  Collector a;
  ASSERT_TRUE(core_->Submit(Spec("a", Prompt(100, 1), 100000), a.Events()).ok());
  for (int i = 0; i < 2000 && a.TokenCount() < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const v1::WorkerLoad busy = core_->Load();
  EXPECT_EQ(busy.running_requests(), 1u);
  EXPECT_LT(busy.free_kv_pages(), 8u);
  EXPECT_GT(busy.running_tokens(), 100u);
  EXPECT_GT(busy.decode_step_ms(), 0);
  core_->Cancel("a");
  a.Wait();
}

// The next turn of a chat finds turn 1's blocks (prompt and answer) in the pool itself.
TEST_F(WorkerCoreTest, ResidentBlocksServeTheNextTurn) {
  Make(16);
  const std::vector<int32_t> turn1 = Prompt(100, 5);
  Collector a;
  ASSERT_TRUE(core_->Submit(Spec("turn1", turn1, 60), a.Events()).ok());
  const RequestOutcome oa = a.Wait();
  ASSERT_TRUE(oa.status.ok()) << oa.status;
  EXPECT_EQ(oa.cached.total, 0);
  // 159 tokens had KV: two full blocks stay.
  EXPECT_EQ(core_->resident().resident_blocks(), 2);
  EXPECT_EQ(core_->resident().idle_blocks(), 2);

  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), a.tokens.begin(), a.tokens.end());
  const std::vector<int32_t> message = Prompt(30, 6);
  turn2.insert(turn2.end(), message.begin(), message.end());
  Collector b;
  ASSERT_TRUE(core_->Submit(Spec("turn2", turn2, 12), b.Events()).ok());
  const RequestOutcome ob = b.Wait();
  ASSERT_TRUE(ob.status.ok()) << ob.status;
  EXPECT_EQ(ob.cached.total, 128);
  EXPECT_EQ(ob.cached.gpu, 128);
  EXPECT_EQ(ob.computed_tokens, static_cast<int64_t>(turn2.size()) - 128);
  EXPECT_EQ(b.tokens, Reference(turn2, 12));
  EXPECT_EQ(core_->stats().resident_tokens, 128);
  ExpectNoPageHeld(16);

  // Off: nothing is kept, every page is free once a request ends.
  Make(16, {.resident_blocks = false});
  Collector c, d;
  ASSERT_TRUE(core_->Submit(Spec("off1", turn1, 60), c.Events()).ok());
  c.Wait();
  EXPECT_EQ(engine_->kv_pool().free_pages(), 16);
  ASSERT_TRUE(core_->Submit(Spec("off2", turn2, 12), d.Events()).ok());
  const RequestOutcome od = d.Wait();
  EXPECT_EQ(od.cached.total, 0);
  EXPECT_EQ(d.tokens, b.tokens);
}

// Concurrent requests that share a resident prefix read the same pages; each gets its own output.
TEST_F(WorkerCoreTest, ConcurrentRequestsShareResidentPages) {
  Make(24);
  const std::vector<int32_t> system = Prompt(192, 9);  // three full blocks
  Collector first;
  ASSERT_TRUE(core_->Submit(Spec("system", system, 1), first.Events()).ok());
  ASSERT_TRUE(first.Wait().status.ok());
  ASSERT_EQ(core_->resident().resident_blocks(), 3);

  std::vector<std::vector<int32_t>> prompts;
  std::vector<Collector> out(3);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = system;
    const std::vector<int32_t> q = Prompt(40 + 30 * i, 20 + i);
    p.insert(p.end(), q.begin(), q.end());
    prompts.push_back(p);
    ASSERT_TRUE(core_->Submit(Spec("q" + std::to_string(i), p, 30), out[i].Events()).ok());
  }
  for (int i = 0; i < 3; ++i) {
    const RequestOutcome o = out[i].Wait();
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.cached.gpu, 192) << i;
    EXPECT_EQ(out[i].tokens, Reference(prompts[i], 30)) << i;
  }
  EXPECT_EQ(core_->resident().hit_blocks(), 9);
  ExpectNoPageHeld(24);
}

// Idle blocks give their pages back when a sequence needs them, a chain's tail first: what is
// left of it is still a usable prefix.
TEST_F(WorkerCoreTest, IdleBlocksGiveTheirPagesBackTailFirst) {
  Make(8);
  const std::vector<int32_t> a = Prompt(300, 31);  // 4 full blocks + 44 tokens: 5 pages
  Collector ca;
  ASSERT_TRUE(core_->Submit(Spec("a", a, 4), ca.Events()).ok());
  ASSERT_TRUE(ca.Wait().status.ok());
  ASSERT_EQ(core_->resident().idle_blocks(), 4);
  ASSERT_EQ(engine_->kv_pool().free_pages(), 4);

  // 6 pages for another prompt: two of a's blocks must go, its last two.
  const std::vector<int32_t> b = Prompt(340, 32);
  Collector cb;
  ASSERT_TRUE(core_->Submit(Spec("b", b, 4), cb.Events()).ok());
  const RequestOutcome ob = cb.Wait();
  ASSERT_TRUE(ob.status.ok()) << ob.status;
  EXPECT_EQ(cb.tokens, Reference(b, 4));

  Collector again;
  ASSERT_TRUE(core_->Submit(Spec("a-again", a, 4), again.Events()).ok());
  const RequestOutcome oa = again.Wait();
  ASSERT_TRUE(oa.status.ok()) << oa.status;
  EXPECT_EQ(oa.cached.gpu, 128) << "a's first two blocks were kept";
  EXPECT_EQ(again.tokens, ca.tokens);
  ExpectNoPageHeld(8);
}

// Many requests over two shared system prompts in a pool too small for all of them: resident
// pages are shared, taken back, swapped sequences come back (from their resident blocks or by
// recomputation), and every output is still the one-at-a-time reference; no page leaks.
TEST_F(WorkerCoreTest, SharedPrefixesUnderPagePressureKeepOutputs) {
  Make(14, {.token_budget = 128});
  const std::vector<std::vector<int32_t>> systems = {Prompt(128, 70), Prompt(192, 71)};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p = systems[i % 2];
    const std::vector<int32_t> q = Prompt(20 + 17 * i, 80 + i);
    p.insert(p.end(), q.begin(), q.end());
    prompts.push_back(p);
  }
  // One of each first, so that later ones find resident blocks; then the rest at once.
  for (int i = 0; i < 2; ++i) {
    Collector c;
    ASSERT_TRUE(core_->Submit(Spec("warm" + std::to_string(i), prompts[i], 4), c.Events()).ok());
    ASSERT_TRUE(c.Wait().status.ok());
  }
  std::vector<Collector> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(core_->Submit(Spec("p" + std::to_string(i), prompts[i], 90), out[i].Events()).ok());
  }
  int64_t from_pool = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestOutcome o = out[i].Wait();
    ASSERT_TRUE(o.status.ok()) << o.status;
    from_pool += o.cached.gpu;
    EXPECT_EQ(out[i].tokens, Reference(prompts[i], 90)) << i;
  }
  EXPECT_GT(from_pool, 0);
  EXPECT_GT(core_->stats().swapped_out, 0) << "the pool should have been too small";
  ExpectNoPageHeld(14);
}

// A prompt admitted while another with the same prefix still runs shares the blocks that one has
// filled so far (published as they fill), without waiting for it to end.
TEST_F(WorkerCoreTest, ARunningSequenceSharesItsFilledBlocks) {
  Make(16, {.token_budget = 64});
  const std::vector<int32_t> prompt = Prompt(300, 90);  // 4 full blocks
  Collector a;
  ASSERT_TRUE(core_->Submit(Spec("long", prompt, 400), a.Events()).ok());
  for (int i = 0; i < 4000 && a.TokenCount() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(a.TokenCount(), 2u) << "the first request should be decoding by now";
  EXPECT_EQ(core_->resident().resident_blocks(), 4);
  EXPECT_EQ(core_->resident().idle_blocks(), 0) << "held by the running sequence";
  std::vector<int32_t> other = prompt;
  const std::vector<int32_t> tail = Prompt(10, 91);
  other.insert(other.end(), tail.begin(), tail.end());
  Collector b;
  ASSERT_TRUE(core_->Submit(Spec("while-running", other, 12), b.Events()).ok());
  const RequestOutcome ob = b.Wait();
  ASSERT_TRUE(ob.status.ok()) << ob.status;
  EXPECT_EQ(ob.cached.gpu, 256);
  EXPECT_EQ(b.tokens, Reference(other, 12));
  {
    std::lock_guard<std::mutex> lock(a.mu);
    EXPECT_FALSE(a.done.has_value()) << "the first request should still be running";
  }
  core_->Cancel("long");
  a.Wait();
  ExpectNoPageHeld(16);
}

}  // namespace
}  // namespace strata::worker
