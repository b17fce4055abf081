// WorkerBackend against scripted in-process Worker services (the real workers are exercised in
// scheduler_cluster_test): what it sends (namespace, block keys, sampling, the prefill → decode
// handoff), what it streams to the sink, retry and mid-stream resume, cancellation, no workers.
#include "scheduler/server/worker_backend.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "common/metrics.h"
#include "common/paths.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::scheduler {
namespace {

// A Worker service whose Generate/Prefill/Decode behaviour the test scripts.
class ScriptedWorker final : public v1::Worker::Service {
 public:
  using StreamFn =
      std::function<grpc::Status(grpc::ServerContext*, grpc::ServerWriter<v1::TokenChunk>*)>;

  ScriptedWorker() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedWorker() override { server_->Shutdown(std::chrono::system_clock::now()); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::TokenChunk>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++generate_calls;
      last_generate = *req;
    }
    return stream(ctx, writer);
  }
  grpc::Status Prefill(grpc::ServerContext*, const v1::PrefillRequest* req,
                       v1::PrefillResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu);
    ++prefill_calls;
    last_prefill = *req;
    *resp = prefill_response;
    return grpc::Status::OK;
  }
  grpc::Status Decode(grpc::ServerContext* ctx, const v1::DecodeRequest* req,
                      grpc::ServerWriter<v1::TokenChunk>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++decode_calls;
      last_decode = *req;
    }
    return stream(ctx, writer);
  }

  // Streams `texts`, then the final chunk (finish + usage).
  static StreamFn Texts(std::vector<std::string> texts, v1::FinishReason finish,
                        uint32_t cached = 0) {
    return [texts, finish, cached](grpc::ServerContext*, grpc::ServerWriter<v1::TokenChunk>* w) {
      uint32_t n = 0;
      for (const std::string& t : texts) {
        v1::TokenChunk c;
        c.add_tokens(n++);
        c.set_text(t);
        w->Write(c);
      }
      v1::TokenChunk last;
      last.set_finish_reason(finish);
      last.mutable_usage()->set_completion_tokens(n);
      last.mutable_usage()->mutable_cached()->set_total(cached);
      last.mutable_usage()->mutable_cached()->set_dram(cached);
      w->Write(last);
      return grpc::Status::OK;
    };
  }

  std::mutex mu;
  int generate_calls = 0, prefill_calls = 0, decode_calls = 0;
  v1::GenerateRequest last_generate;
  v1::PrefillRequest last_prefill;
  v1::DecodeRequest last_decode;
  v1::PrefillResponse prefill_response;
  StreamFn stream = Texts({"Hel", "lo"}, v1::FINISH_LENGTH);

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class TestSink : public CompletionSink {
 public:
  void OnText(std::string text) override {
    std::lock_guard<std::mutex> lock(mu_);
    text_ += text;
    if (cancel_after_text_) cancelled_ = true;
  }
  void OnDone(absl::Status status, FinishReason finish, CompletionUsage usage) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_calls_;
    status_ = status;
    finish_ = finish;
    usage_ = usage;
    cv_.notify_all();
  }
  bool Cancelled() const override { return cancelled_.load(); }

  bool WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [this] { return done_calls_ > 0; });
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  FinishReason finish() {
    std::lock_guard<std::mutex> lock(mu_);
    return finish_;
  }
  CompletionUsage usage() {
    std::lock_guard<std::mutex> lock(mu_);
    return usage_;
  }
  int done_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_calls_;
  }
  std::atomic<bool> cancel_after_text_{false};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  absl::Status status_;
  FinishReason finish_ = FinishReason::kStop;
  CompletionUsage usage_;
  int done_calls_ = 0;
  std::atomic<bool> cancelled_{false};
};

class WorkerBackendTest : public testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::Tokenizer::Load(DeepSeekV3TokenizerDir());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    SchedulerOptions o;
    o.policy = "round_robin";
    scheduler_ = *Scheduler::Create(o);
    for (size_t i = 0; i < fingerprint_.bytes.size(); ++i) fingerprint_.bytes[i] = uint8_t(i * 7);
    backend_ = std::make_unique<WorkerBackend>(
        scheduler_.get(), &directory_, &channels_,
        WorkerBackendOptions{.model_id = "m", .tokenizer = tokenizer_.get()});
  }

  void AddNode(const std::string& id, v1::NodeRole role, const ScriptedWorker& worker,
               const std::string& cache_address = "cache-1", KvCodec codec = KvCodec::kBf16) {
    WorkerNode n;
    n.id = id;
    n.role = role;
    n.grpc_address = worker.address();
    n.cache_address = cache_address;
    n.fingerprint = fingerprint_;
    n.has_fingerprint = true;
    n.block_tokens = 16;
    n.codec = codec;
    const NodeRoleKind kind = role == v1::ROLE_PREFILL  ? NodeRoleKind::kPrefill
                              : role == v1::ROLE_DECODE ? NodeRoleKind::kDecode
                                                        : NodeRoleKind::kBoth;
    n.index = scheduler_->load().Register(id, "host", kind, absl::Now());
    directory_.Upsert(n);
  }

  std::shared_ptr<TestSink> Run(CompletionRequest request) {
    auto sink = std::make_shared<TestSink>();
    backend_->Generate(request, sink);
    EXPECT_TRUE(sink->WaitDone());
    return sink;
  }

  static CompletionRequest Prompt(const std::string& text) {
    CompletionRequest r;
    r.model = "m";
    r.chat = false;
    r.prompt = text;
    r.max_tokens = 5;
    r.temperature = 0.5;
    r.stop = {"END"};
    return r;
  }

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<Scheduler> scheduler_;
  NodeDirectory directory_;
  ChannelPool channels_;
  ModelFingerprint fingerprint_;
  std::unique_ptr<WorkerBackend> backend_;
};

TEST_F(WorkerBackendTest, NoWorkerIsUnavailable) {
  auto sink = Run(Prompt("hello"));
  EXPECT_TRUE(absl::IsUnavailable(sink->status())) << sink->status();
  EXPECT_EQ(sink->done_calls(), 1);
}

TEST_F(WorkerBackendTest, GenerateSendsThePlanAndStreamsTextAndUsage) {
  ScriptedWorker w;
  w.stream = ScriptedWorker::Texts({"Hel", "lo"}, v1::FINISH_LENGTH, /*cached=*/32);
  AddNode("w0", v1::ROLE_BOTH, w);
  CompletionRequest req = Prompt(std::string(200, 'x') + " and more words to make blocks");
  req.cache_salt = "tenant-a";
  auto sink = Run(req);
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->text(), "Hello");
  EXPECT_EQ(sink->finish(), FinishReason::kLength);
  EXPECT_EQ(sink->usage().completion_tokens, 2u);
  EXPECT_EQ(sink->usage().cached_tokens, 32u);
  EXPECT_EQ(sink->usage().cached_tokens_by_tier[static_cast<int>(CacheTier::kDram)], 32u);

  std::lock_guard<std::mutex> lock(w.mu);
  ASSERT_EQ(w.generate_calls, 1);
  const v1::GenerateRequest& g = w.last_generate;
  auto ids = tokenizer_->Encode(req.prompt, true);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(g.prompt_tokens_size(), static_cast<int>(ids->size()));
  EXPECT_EQ(sink->usage().prompt_tokens, ids->size());
  KvFormat format;
  format.block_tokens = 16;
  const Namespace ns = MakeNamespace(fingerprint_, format, "tenant-a");
  EXPECT_EQ(g.cache().namespace_id(), std::string(ns.View()));
  EXPECT_EQ(g.cache().tenant(), "tenant-a");
  const std::vector<uint32_t> u32(ids->begin(), ids->end());
  const std::vector<BlockKey> keys = ComputeBlockKeys(ns, u32, 16);
  ASSERT_EQ(g.cache().block_keys_size(), static_cast<int>(keys.size()));
  ASSERT_GT(keys.size(), 0u);
  EXPECT_EQ(g.cache().block_keys(0), std::string(keys[0].View()));
  EXPECT_EQ(g.sampling().max_tokens(), 5u);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  ASSERT_EQ(g.sampling().stop_size(), 1);
  EXPECT_EQ(g.sampling().stop(0), "END");
}

// Workers that cache fp8 blocks get the fp8 namespace (and its keys) in their plans.
TEST_F(WorkerBackendTest, ThePlanNamesBlocksInTheWorkersCodec) {
  ScriptedWorker w;
  w.stream = ScriptedWorker::Texts({"ok"}, v1::FINISH_LENGTH, /*cached=*/0);
  AddNode("w0", v1::ROLE_BOTH, w, "cache-1", KvCodec::kFp8E4M3);
  CompletionRequest req = Prompt(std::string(100, 'y'));
  req.cache_salt = "tenant-b";
  ASSERT_TRUE(Run(req)->status().ok());
  std::lock_guard<std::mutex> lock(w.mu);
  ASSERT_EQ(w.generate_calls, 1);
  KvFormat format;
  format.codec = KvCodec::kFp8E4M3;
  format.block_tokens = 16;
  const Namespace ns = MakeNamespace(fingerprint_, format, "tenant-b");
  EXPECT_EQ(w.last_generate.cache().namespace_id(), std::string(ns.View()));
  KvFormat bf16 = format;
  bf16.codec = KvCodec::kBf16;
  EXPECT_NE(ns, MakeNamespace(fingerprint_, bf16, "tenant-b"));
  auto ids = tokenizer_->Encode(req.prompt, true);
  ASSERT_TRUE(ids.ok());
  const std::vector<uint32_t> u32(ids->begin(), ids->end());
  const std::vector<BlockKey> keys = ComputeBlockKeys(ns, u32, 16);
  ASSERT_GT(keys.size(), 0u);
  ASSERT_EQ(w.last_generate.cache().block_keys_size(), static_cast<int>(keys.size()));
  EXPECT_EQ(w.last_generate.cache().block_keys(0), std::string(keys[0].View()));
}

TEST_F(WorkerBackendTest, ChatIsRenderedWithTheTemplate) {
  ScriptedWorker w;
  AddNode("w0", v1::ROLE_BOTH, w);
  CompletionRequest req;
  req.model = "m";
  req.messages = {{"user", "Hi"}};
  auto sink = Run(req);
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  std::lock_guard<std::mutex> lock(w.mu);
  // BOS, then the user turn and the assistant prompt.
  ASSERT_GT(w.last_generate.prompt_tokens_size(), 2);
  EXPECT_EQ(static_cast<int32_t>(w.last_generate.prompt_tokens(0)), tokenizer_->bos_id());
}

TEST_F(WorkerBackendTest, PrefillThenDecodeHandsTheBlocksOver) {
  ScriptedWorker p, d;
  p.prefill_response.set_first_token(42);
  p.prefill_response.add_block_keys(std::string(16, 'a'));
  p.prefill_response.add_block_keys(std::string(16, 'b'));
  p.prefill_response.mutable_cached()->set_total(16);
  p.prefill_response.mutable_cached()->set_ssd(16);
  p.prefill_response.set_computed_tokens(20);
  p.prefill_response.set_prefill_ms(3);
  d.stream = ScriptedWorker::Texts({"a", "b", "c"}, v1::FINISH_STOP);
  AddNode("p0", v1::ROLE_PREFILL, p, "cache-p");
  AddNode("d0", v1::ROLE_DECODE, d, "cache-d");
  auto sink = Run(Prompt("some prompt text"));
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->text(), "abc");
  EXPECT_EQ(sink->finish(), FinishReason::kStop);
  EXPECT_EQ(sink->usage().cached_tokens, 16u);
  EXPECT_EQ(sink->usage().cached_tokens_by_tier[static_cast<int>(CacheTier::kSsd)], 16u);
  EXPECT_EQ(sink->usage().completion_tokens, 3u);
  std::lock_guard<std::mutex> lp(p.mu);
  std::lock_guard<std::mutex> ld(d.mu);
  EXPECT_EQ(p.prefill_calls, 1);
  EXPECT_EQ(d.decode_calls, 1);
  EXPECT_EQ(p.generate_calls + d.generate_calls, 0);
  const v1::DecodeRequest& dr = d.last_decode;
  EXPECT_EQ(dr.first_token(), 42u);
  EXPECT_EQ(dr.prompt_tokens_size(), p.last_prefill.prompt_tokens_size());
  ASSERT_EQ(dr.cache().block_keys_size(), 2);
  EXPECT_EQ(dr.cache().block_keys(1), std::string(16, 'b'));
  EXPECT_EQ(dr.cache().cached_blocks(), 2u);
  // The decode worker uses another cache server: it loads from the prefill worker's.
  EXPECT_EQ(dr.cache().cache_address(), "cache-p");
  EXPECT_EQ(dr.cache().namespace_id(), p.last_prefill.cache().namespace_id());
}

TEST_F(WorkerBackendTest, ANodeServingBothRolesRunsTheWholeRequest) {
  ScriptedWorker both, decode_only;
  AddNode("both", v1::ROLE_BOTH, both);
  AddNode("decode", v1::ROLE_DECODE, decode_only);
  // Round robin puts the second request's decode on `decode`; `both` keeps it.
  for (int i = 0; i < 2; ++i) {
    auto sink = Run(Prompt("hello"));
    ASSERT_TRUE(sink->status().ok()) << sink->status();
  }
  {
    std::lock_guard<std::mutex> lb(both.mu);
    std::lock_guard<std::mutex> ld(decode_only.mu);
    EXPECT_EQ(both.generate_calls, 2);
    EXPECT_EQ(both.prefill_calls + decode_only.decode_calls, 0);
  }
  for (const NodeView& v : scheduler_->load().Snapshot()) {
    EXPECT_EQ(v.outstanding.decode_requests, 0u) << v.id;
    EXPECT_EQ(v.outstanding.decode_tokens, 0u) << v.id;
  }
}

TEST_F(WorkerBackendTest, AFailureBeforeTextIsRetriedElsewhere) {
  ScriptedWorker bad, good;
  bad.stream = [](grpc::ServerContext*, grpc::ServerWriter<v1::TokenChunk>*) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is going away");
  };
  good.stream = ScriptedWorker::Texts({"ok"}, v1::FINISH_STOP);
  AddNode("bad", v1::ROLE_BOTH, bad);  // round robin places the first request here
  AddNode("good", v1::ROLE_BOTH, good);
  auto sink = Run(Prompt("hello"));
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->text(), "ok");
  EXPECT_EQ(backend_->retries(), 1u);
  EXPECT_FALSE(scheduler_->load().Snapshot()[0].alive);  // marked dead after UNAVAILABLE
  // Every booking was released: nothing outstanding anywhere.
  for (const NodeView& v : scheduler_->load().Snapshot()) {
    EXPECT_EQ(v.outstanding.prefill_requests, 0u) << v.id;
    EXPECT_EQ(v.outstanding.decode_requests, 0u) << v.id;
  }
}

// Streams one chunk per (ids, text) pair, then fails as a killed worker does.
ScriptedWorker::StreamFn DiesAfter(
    std::vector<std::pair<std::vector<int32_t>, std::string>> chunks) {
  return [chunks](grpc::ServerContext*, grpc::ServerWriter<v1::TokenChunk>* writer) {
    for (const auto& [ids, text] : chunks) {
      v1::TokenChunk c;
      for (int32_t id : ids) c.add_tokens(static_cast<uint32_t>(id));
      c.set_text(text);
      writer->Write(c);
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "died mid-stream");
  };
}

TEST_F(WorkerBackendTest, AStreamThatDiesResumesElsewhereWithWhatWasStreamed) {
  ScriptedWorker a, b;
  const std::vector<int32_t> hello = *tokenizer_->Encode("Hello world", false);
  a.stream = DiesAfter({{hello, "Hello world"}});
  b.stream = ScriptedWorker::Texts({"!", "?"}, v1::FINISH_LENGTH);
  AddNode("a", v1::ROLE_BOTH, a);  // round robin places the first attempt here
  AddNode("b", v1::ROLE_BOTH, b);
  CompletionRequest request = Prompt("Say hello");
  request.max_tokens = 8;
  auto sink = Run(request);
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->text(), "Hello world!?");  // one answer, nothing repeated
  EXPECT_EQ(backend_->retries(), 1u);
  EXPECT_EQ(backend_->resumed(), 1u);
  const std::string metrics = MetricsRegistry::Default().RenderPrometheus();
  EXPECT_NE(metrics.find("strata_scheduler_retries_total{when=\"mid_stream\"} "), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("strata_scheduler_ttft_seconds_count "), std::string::npos) << metrics;
  std::lock_guard<std::mutex> la(a.mu);
  std::lock_guard<std::mutex> lb(b.mu);
  ASSERT_EQ(b.generate_calls, 1);
  // The resumed prompt is the original one followed by the tokens the client already has.
  const std::vector<int32_t> original = *tokenizer_->Encode("Say hello", true);
  std::vector<uint32_t> expected(original.begin(), original.end());
  expected.insert(expected.end(), hello.begin(), hello.end());
  EXPECT_EQ(std::vector<uint32_t>(b.last_generate.prompt_tokens().begin(),
                                  b.last_generate.prompt_tokens().end()),
            expected);
  EXPECT_EQ(b.last_generate.sampling().max_tokens(), 8 - hello.size());
  EXPECT_EQ(b.last_generate.cache().block_keys_size(), static_cast<int>(expected.size() / 16));
  // Usage counts the original prompt and every generated token.
  EXPECT_EQ(sink->usage().prompt_tokens, original.size());
  EXPECT_EQ(sink->usage().completion_tokens, hello.size() + 2);
}

TEST_F(WorkerBackendTest, AResumeStartsAfterTheLastWholeCharacter) {
  // A 4-byte character spread over several byte tokens: the worker sent the text of "Hi" and
  // held back the first bytes of the rocket, so the resumed attempt must not take those tokens.
  const std::vector<int32_t> hi = *tokenizer_->Encode("Hi", false);
  const std::vector<int32_t> rocket = *tokenizer_->Encode("\xF0\x9F\x9A\x80", false);
  ASSERT_GT(rocket.size(), 1u) << "the test needs a character split over tokens";
  ScriptedWorker a, b;
  a.stream = DiesAfter({{hi, "Hi"}, {{rocket[0]}, ""}});
  b.stream = ScriptedWorker::Texts({" there"}, v1::FINISH_STOP);
  AddNode("a", v1::ROLE_BOTH, a);
  AddNode("b", v1::ROLE_BOTH, b);
  auto sink = Run(Prompt("greet"));
  ASSERT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->text(), "Hi there");
  std::lock_guard<std::mutex> lb(b.mu);
  const std::vector<int32_t> original = *tokenizer_->Encode("greet", true);
  ASSERT_EQ(b.last_generate.prompt_tokens_size(), static_cast<int>(original.size() + hi.size()));
  EXPECT_EQ(b.last_generate.prompt_tokens(b.last_generate.prompt_tokens_size() - 1),
            static_cast<uint32_t>(hi.back()));
}

TEST_F(WorkerBackendTest, AStreamThatDiesTwiceFailsClearly) {
  ScriptedWorker a, b;
  const std::vector<int32_t> part = *tokenizer_->Encode("partial", false);
  for (ScriptedWorker* w : {&a, &b}) w->stream = DiesAfter({{part, "partial"}});
  AddNode("a", v1::ROLE_BOTH, a);
  AddNode("b", v1::ROLE_BOTH, b);
  CompletionRequest request = Prompt("hello");
  request.max_tokens = 16;
  auto sink = Run(request);
  EXPECT_TRUE(absl::IsUnavailable(sink->status())) << sink->status();
  EXPECT_NE(sink->status().message().find("mid-stream"), std::string::npos) << sink->status();
  EXPECT_EQ(sink->text(), "partialpartial");  // the first attempt's text, then the resumed one's
  std::lock_guard<std::mutex> la(a.mu);
  std::lock_guard<std::mutex> lb(b.mu);
  EXPECT_EQ(a.generate_calls + b.generate_calls, 2);  // one retry, no more
}

TEST_F(WorkerBackendTest, ABadRequestIsNotRetried) {
  ScriptedWorker a, b;
  for (ScriptedWorker* w : {&a, &b}) {
    w->stream = [](grpc::ServerContext*, grpc::ServerWriter<v1::TokenChunk>*) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt at the context limit");
    };
  }
  AddNode("a", v1::ROLE_BOTH, a);
  AddNode("b", v1::ROLE_BOTH, b);
  auto sink = Run(Prompt("hello"));
  EXPECT_TRUE(absl::IsInvalidArgument(sink->status())) << sink->status();
  EXPECT_EQ(backend_->retries(), 0u);
}

TEST_F(WorkerBackendTest, AClientThatGoesAwayCancelsTheWorkerCall) {
  ScriptedWorker w;
  std::atomic<bool> saw_cancel{false};
  w.stream = [&saw_cancel](grpc::ServerContext* ctx, grpc::ServerWriter<v1::TokenChunk>* writer) {
    v1::TokenChunk c;
    c.add_tokens(1);
    c.set_text("first");
    writer->Write(c);
    for (int i = 0; i < 3000 && !ctx->IsCancelled(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    saw_cancel = ctx->IsCancelled();
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  };
  AddNode("w", v1::ROLE_BOTH, w);
  auto sink = std::make_shared<TestSink>();
  sink->cancel_after_text_ = true;
  backend_->Generate(Prompt("hello"), sink);
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_TRUE(absl::IsCancelled(sink->status())) << sink->status();
  EXPECT_EQ(sink->text(), "first");
  // The worker's handler sees the cancellation (it polls for up to 30 s).
  for (int i = 0; i < 3000 && !saw_cancel; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(saw_cancel.load());
}

TEST_F(WorkerBackendTest, ShutdownEndsRequestsInFlight) {
  ScriptedWorker w;
  w.stream = [](grpc::ServerContext* ctx, grpc::ServerWriter<v1::TokenChunk>*) {
    for (int i = 0; i < 3000 && !ctx->IsCancelled(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  };
  AddNode("w", v1::ROLE_BOTH, w);
  auto sink = std::make_shared<TestSink>();
  backend_->Generate(Prompt("hello"), sink);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  backend_->Shutdown();
  EXPECT_EQ(sink->done_calls(), 1);
  EXPECT_FALSE(sink->status().ok());
  // Later requests fail at once.
  auto late = std::make_shared<TestSink>();
  backend_->Generate(Prompt("hello"), late);
  EXPECT_EQ(late->done_calls(), 1);
  EXPECT_TRUE(absl::IsUnavailable(late->status()));
}

}  // namespace
}  // namespace strata::scheduler
