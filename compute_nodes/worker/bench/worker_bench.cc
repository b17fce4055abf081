#include "compute_nodes/worker/bench/worker_bench.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "cache_service/cache_server.h"
#include "common/block_format.h"
#include "common/block_key.h"
#include "common/scratch_dir.h"
#include "common/status.h"
#include "common/strings.h"
#include "compute_nodes/backend/cpu/cpu_engine.h"
#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/weights.h"
#include "compute_nodes/worker/cache_directory.h"
#include "compute_nodes/worker/worker_core.h"

namespace strata::worker {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr int64_t kMinContext = 16384;  // the bench model's context (the preset has 2048)

// CPU time of the whole process (engine, loader, cache client and the in-process cache server):
// unlike wall time, it does not count time lost to other processes on a shared machine.
double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Token ids and timestamps of one request, filled by its callbacks.
struct Tracked {
  std::vector<std::pair<Clock::time_point, int64_t>> token_events;  // (when, how many)
  double cpu_ms_at_submit = 0;
  double cpu_ms_at_first_token = 0;  // process CPU time when the first token arrived
  RequestOutcome outcome;
  bool done = false;
};

// Runs requests on the core and waits for them, recording when their tokens arrived.
class Runner {
 public:
  explicit Runner(WorkerCore& core) : core_(core) {}

  // Submits every spec at once and waits until every one is done (their saves committed).
  absl::StatusOr<std::vector<Tracked>> Run(std::vector<RequestSpec> specs) {
    auto tracked = std::make_shared<std::vector<Tracked>>(specs.size());
    std::vector<std::string> submitted;
    for (size_t i = 0; i < specs.size(); ++i) {
      RequestEvents events;
      events.on_tokens = [this, tracked, i](std::span<const int32_t> tokens) {
        const auto now = Clock::now();
        const double cpu = ProcessCpuMs();
        std::lock_guard<std::mutex> lock(mu_);
        Tracked& t = (*tracked)[i];
        if (t.token_events.empty()) t.cpu_ms_at_first_token = cpu;
        t.token_events.emplace_back(now, static_cast<int64_t>(tokens.size()));
      };
      events.on_done = [this, tracked, i](const RequestOutcome& o) {
        std::lock_guard<std::mutex> lock(mu_);
        (*tracked)[i].outcome = o;
        (*tracked)[i].done = true;
        cv_.notify_all();
      };
      const std::string id = specs[i].id;
      {
        std::lock_guard<std::mutex> lock(mu_);
        (*tracked)[i].cpu_ms_at_submit = ProcessCpuMs();
      }
      if (absl::Status st = core_.Submit(std::move(specs[i]), std::move(events)); !st.ok()) {
        // Already submitted requests are cancelled so the core is idle for the next case.
        for (const std::string& done : submitted) core_.Cancel(done);
        Wait(*tracked, i);
        return Annotate(st, StrCat("submitting ", id));
      }
      submitted.push_back(id);
    }
    Wait(*tracked, specs.size());
    for (const Tracked& t : *tracked) {
      if (!t.outcome.status.ok()) return Annotate(t.outcome.status, "a bench request failed");
    }
    return std::move(*tracked);
  }

 private:
  void Wait(const std::vector<Tracked>& tracked, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      for (size_t i = 0; i < n; ++i) {
        if (!tracked[i].done) return false;
      }
      return true;
    });
  }

  WorkerCore& core_;
  std::mutex mu_;
  std::condition_variable cv_;
};

std::vector<int32_t> RandomTokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  // Ids 2.. (0 and 1 are bos/eos of the bench model; no stop ids are set either way).
  for (auto& id : ids) id = static_cast<int32_t>(2 + rng() % 100000);
  return ids;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return std::string(StripWhitespace(line.substr(colon + 1)));
    }
  }
  return "unknown";
}

absl::Status Validate(const WorkerBenchOptions& o) {
  if (o.block_tokens < 16 || (o.block_tokens & (o.block_tokens - 1)) != 0) {
    return absl::InvalidArgumentError("block tokens must be a power of two >= 16");
  }
  if (o.prompt_tokens < 4 * o.block_tokens) {
    return absl::InvalidArgumentError(
        StrCat("--prompt-tokens must be at least ", 4 * o.block_tokens, " (four blocks)"));
  }
  if (!(o.cached_fraction > 0 && o.cached_fraction < 1)) {
    return absl::InvalidArgumentError("--cached-fraction must be in (0, 1)");
  }
  if (static_cast<int64_t>(o.prompt_tokens * o.cached_fraction) < o.block_tokens) {
    return absl::InvalidArgumentError("--cached-fraction leaves less than one block to cache");
  }
  if (o.repeats < 1) return absl::InvalidArgumentError("--repeats must be at least 1");
  if (o.batches.empty()) return absl::InvalidArgumentError("--batches is empty");
  for (int b : o.batches) {
    if (b < 1 || b > 4096) return absl::InvalidArgumentError("--batches: each in 1..4096");
  }
  if (o.decode_tokens < 2) return absl::InvalidArgumentError("--decode-tokens must be >= 2");
  if (o.decode_prompt_tokens < 1) return absl::InvalidArgumentError("decode prompt is empty");
  if (o.token_budget < 1) return absl::InvalidArgumentError("--token-budget must be >= 1");
  if (o.layers < 0) return absl::InvalidArgumentError("--layers must be >= 0");
  return absl::OkStatus();
}

// Loads the checkpoint in `dir`, or writes the bench model there first (the preset with a context
// long enough for the prompt, cut to `layers` layers when > 0) when `dir` holds none.
absl::StatusOr<std::shared_ptr<const model::ModelWeights>> BenchModel(const std::string& dir,
                                                                      const std::string& preset,
                                                                      int64_t layers,
                                                                      int64_t context,
                                                                      json* facts) {
  const bool existing = std::filesystem::exists(std::filesystem::path(dir) / "config.json");
  // Says that the checkpoint in `dir` is one this bench wrote (a later run reuses it).
  const std::string marker =
      (std::filesystem::path(dir) / "strata-bench-worker-model.txt").string();
  if (!existing) {
    ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetConfig(preset));
    const int64_t preset_context = config.max_position_embeddings;
    config.max_position_embeddings = std::max(preset_context, context);
    std::string cut;
    if (layers > 0 && layers < config.num_hidden_layers) {
      cut = StrCat(", ", layers, " of its ", config.num_hidden_layers, " layers");
      config.num_hidden_layers = layers;
      config.first_k_dense_replace = std::min(config.first_k_dense_replace, layers);
    }
    model::MakeRandomOptions o;
    o.seed = 7;
    RETURN_IF_ERROR_WITH(model::MakeRandomCheckpoint(config, o, dir),
                         StrCat("writing the bench model into ", dir));
    std::ofstream(marker) << "the `" << preset << "` preset (random weights, seed 7" << cut
                          << ", max_position_embeddings " << config.max_position_embeddings
                          << ", preset " << preset_context << ")\n";
  }
  std::string note = "a checkpoint given with --model";
  if (std::ifstream in(marker); in) std::getline(in, note);
  (*facts)["note"] = note;
  ASSIGN_OR_RETURN_WITH(auto weights, model::LoadModel(dir), StrCat("loading the model in ", dir));
  const model::ModelConfig& c = weights->config;
  (*facts)["dir"] = dir;
  (*facts)["layers"] = c.num_hidden_layers;
  (*facts)["hidden_size"] = c.hidden_size;
  (*facts)["attention_heads"] = c.num_attention_heads;
  (*facts)["moe_layers"] = c.num_hidden_layers - c.first_k_dense_replace;
  (*facts)["routed_experts"] = c.n_routed_experts;
  (*facts)["experts_per_token"] = c.num_experts_per_tok;
  (*facts)["kv_lora_rank"] = c.kv_lora_rank;
  (*facts)["qk_rope_head_dim"] = c.qk_rope_head_dim;
  (*facts)["vocab_size"] = c.vocab_size;
  (*facts)["max_position_embeddings"] = c.max_position_embeddings;
  return std::shared_ptr<const model::ModelWeights>(std::move(weights));
}

}  // namespace

absl::StatusOr<json> RunWorkerBench(const WorkerBenchOptions& options) {
  RETURN_IF_ERROR(Validate(options));
  const WorkerBenchOptions& o = options;
  std::optional<ScratchDir> scratch;  // without a work dir: removed on every way out
  if (o.work_dir.empty()) {
    ASSIGN_OR_RETURN(ScratchDir made, ScratchDir::Create("strata-bench-worker-"));
    scratch = std::move(made);
  }
  const std::string work = scratch ? scratch->path() : o.work_dir;
  std::filesystem::create_directories(work);

  json result;
  result["bench"] = "worker";
  const int64_t context = std::max<int64_t>(kMinContext, 2 * (o.prompt_tokens + o.decode_tokens));
  json model_facts;
  ASSIGN_OR_RETURN(auto weights, BenchModel(o.model_dir.empty() ? work + "/model" : o.model_dir,
                                            o.preset, o.layers, context, &model_facts));
  result["model"] = model_facts;
  const model::ModelConfig& config = weights->config;
  if (o.prompt_tokens + 2 > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        StrCat("the model's context (", config.max_position_embeddings,
               " tokens) is too short for --prompt-tokens ", o.prompt_tokens));
  }

  // Cache server: DRAM only, blocks of this model's layout, room for every block the run saves.
  KvFormat format;
  format.codec = o.cache_codec;
  format.block_tokens = static_cast<uint32_t>(o.block_tokens);
  const BlockLayout layout = MakeBlockLayout(
      format, static_cast<uint32_t>(config.num_hidden_layers),
      static_cast<uint32_t>(config.kv_lora_rank), static_cast<uint32_t>(config.qk_rope_head_dim));
  const uint64_t slot = (layout.TotalBytes() + 4095) / 4096 * 4096;
  const int64_t prompt_blocks = o.prompt_tokens / o.block_tokens + 1;
  const uint64_t cache_blocks = uint64_t(o.repeats) * 3 * prompt_blocks + 64;
  cache::CacheServerOptions server_options;
  server_options.store.data_dir = work + "/cache";
  server_options.store.slot_bytes = slot;
  server_options.store.dram_capacity_bytes = cache_blocks * slot;
  server_options.host_id = "bench-cache";
  server_options.http_listen = "";
  server_options.cluster_secret = "bench";
  server_options.transfer_listen = "127.0.0.1:0";
  cache::CacheServer server(server_options);
  RETURN_IF_ERROR_WITH(server.Start(), "starting the cache server");

  CacheDirectory caches(
      cache_client::CacheClientOptions{.address = StrCat("127.0.0.1:", server.grpc_port()),
                                       .client_id = "bench-worker",
                                       .host_id = "bench-worker",
                                       .cluster_secret = "bench",
                                       .force_transport = transfer::TransportKind::kTcp});

  // KV pool: the long prompt alone, or the largest decode batch, with room to spare (no swaps).
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  auto pages = [&](int64_t tokens) { return (tokens + o.block_tokens - 1) / o.block_tokens + 1; };
  const int64_t kv_pages = std::max(pages(o.prompt_tokens + 2),
                                    max_batch * pages(o.decode_prompt_tokens + o.decode_tokens)) *
                               5 / 4 +
                           4;
  cpu::CpuEngine engine(weights, kv_pages, o.block_tokens, runtime::KvPrecision::kBf16);
  WorkerCore core(engine, caches,
                  WorkerCoreOptions{.token_budget = o.token_budget,
                                    .max_running = std::max<int64_t>(64, max_batch),
                                    .cache_codec = o.cache_codec});
  core.Start();
  Runner runner(core);

  const std::string tenant = "bench";
  const Namespace ns = MakeNamespace(weights->fingerprint, format, tenant);
  int serial = 0;
  auto spec = [&](std::vector<int32_t> prompt, int64_t max_tokens, bool save) {
    RequestSpec s;
    s.id = StrCat("bench-", serial++);
    s.prompt = std::move(prompt);
    s.sampling.max_tokens = max_tokens;
    s.ns = ns;
    s.tenant = tenant;
    s.save_blocks = save;
    return s;
  };
  auto one = [&](std::vector<int32_t> prompt, int64_t max_tokens,
                 bool save) -> absl::StatusOr<Tracked> {
    std::vector<RequestSpec> specs;
    specs.push_back(spec(std::move(prompt), max_tokens, save));
    ASSIGN_OR_RETURN(auto done, runner.Run(std::move(specs)));
    return std::move(done[0]);
  };
  auto cpu_ttft = [](const Tracked& t) { return t.cpu_ms_at_first_token - t.cpu_ms_at_submit; };

  // Warm-up: connects the cache client and touches the engine's buffers once.
  RETURN_IF_ERROR_WITH(one(RandomTokens(2 * o.block_tokens, 1), 2, true).status(), "warm-up");

  // ---- TTFT: cold vs cached --------------------------------------------------------------------
  const int64_t shared =
      static_cast<int64_t>(static_cast<double>(o.prompt_tokens) * o.cached_fraction);
  std::vector<double> cold_ms, cached_ms, resident_ms, tail_ms, fetch_ms, cold_cpu_ms,
      cached_cpu_ms;
  // Where the engine's time went in each run (medians over repeats, per part).
  std::map<std::string, std::vector<double>> engine_s;
  auto engine_part = [&](const std::string& run, const cpu::CpuEngine::Times& before) {
    const cpu::CpuEngine::Times after = engine.times();
    engine_s[run + ".forward"].push_back(after.forward_s - before.forward_s);
    engine_s[run + ".decompress"].push_back(after.decompress_s - before.decompress_s);
    engine_s[run + ".attention"].push_back(after.attention_s - before.attention_s);
  };
  int64_t cached_tokens = -1, computed_tokens = -1, resident_tokens = -1;
  for (int r = 0; r < o.repeats; ++r) {
    // Cold: a fresh prompt, nothing of it cached. Its blocks are saved (on_done waits for that).
    const std::vector<int32_t> cold_prompt = RandomTokens(o.prompt_tokens, 1000 + r);
    cpu::CpuEngine::Times before = engine.times();
    ASSIGN_OR_RETURN(Tracked cold_run, one(cold_prompt, 1, true));
    engine_part("cold", before);
    const RequestOutcome& cold = cold_run.outcome;
    if (cold.cached.total != 0) {
      return absl::InternalError(
          StrCat("the cold request hit ", cold.cached.total, " cached tokens"));
    }
    cold_ms.push_back(cold.ttft_ms);
    cold_cpu_ms.push_back(cpu_ttft(cold_run));

    // Resident: the same first `shared` tokens and a fresh tail, while the worker's KV pool still
    // holds the cold run's blocks (ResidentBlocks): nothing is fetched.
    std::vector<int32_t> resident_prompt(cold_prompt.begin(), cold_prompt.begin() + shared);
    const std::vector<int32_t> resident_tail = RandomTokens(o.prompt_tokens - shared, 4000 + r);
    resident_prompt.insert(resident_prompt.end(), resident_tail.begin(), resident_tail.end());
    before = engine.times();
    ASSIGN_OR_RETURN(Tracked resident_run, one(resident_prompt, 1, false));
    engine_part("resident", before);
    resident_ms.push_back(resident_run.outcome.ttft_ms);
    resident_tokens = resident_run.outcome.cached.gpu;
    // The pool lets its idle blocks go, so the next run loads its prefix from the cache server.
    core.resident().DropIdle();

    // Cached: the same first `shared` tokens, then a fresh tail, from the cache server.
    std::vector<int32_t> cached_prompt(cold_prompt.begin(), cold_prompt.begin() + shared);
    const std::vector<int32_t> tail = RandomTokens(o.prompt_tokens - shared, 2000 + r);
    cached_prompt.insert(cached_prompt.end(), tail.begin(), tail.end());
    before = engine.times();
    ASSIGN_OR_RETURN(Tracked cached_run, one(cached_prompt, 1, true));
    engine_part("cached", before);
    const RequestOutcome& cached = cached_run.outcome;
    cached_ms.push_back(cached.ttft_ms);
    cached_cpu_ms.push_back(cpu_ttft(cached_run));
    cached_tokens = cached.cached.total;
    computed_tokens = cached.computed_tokens;
    if (cached.cached.gpu != 0 || resident_tokens != cached_tokens) {
      return absl::InternalError(StrCat("the resident run found ", resident_tokens,
                                        " tokens in the pool and the cached run ",
                                        cached.cached.gpu, " of its ", cached_tokens));
    }
    core.resident().DropIdle();  // the next cold run starts from an empty pool

    // Where the cached TTFT goes: fetching + verifying the cached prefix alone, and computing
    // as many tokens as the cached run computed but without the long context in front of them.
    if (cache_client::CacheClient* client = caches.Get(""); client != nullptr) {
      const std::vector<uint32_t> u32(cached_prompt.begin(), cached_prompt.end());
      const std::vector<BlockKey> keys = ComputeBlockKeys(ns, u32, format.block_tokens);
      const int64_t n = cached_tokens / o.block_tokens;
      const auto t0 = Clock::now();
      cache_client::FetchResult f = client->Fetch(
          ns, std::span<const BlockKey>(keys).first(static_cast<size_t>(n)),
          std::span<const uint32_t>(u32).first(static_cast<size_t>(n) * format.block_tokens),
          layout, StrCat("bench-fetch-", r));
      if (static_cast<int64_t>(f.blocks.size()) == n) {
        fetch_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    }
    ASSIGN_OR_RETURN(Tracked short_cold,
                     one(RandomTokens(std::max<int64_t>(1, computed_tokens), 3000 + r), 1, false));
    tail_ms.push_back(short_cold.outcome.ttft_ms);
  }
  const double cold = Median(cold_ms), cached = Median(cached_ms), resident = Median(resident_ms);
  result["ttft_ms"] = {{"cold", cold},
                       {"cached", cached},
                       {"resident", resident},
                       {"cold_samples", cold_ms},
                       {"cached_samples", cached_ms},
                       {"resident_samples", resident_ms},
                       {"computed_part_without_context", Median(tail_ms)},
                       {"fetch_cached_prefix", Median(fetch_ms)}};
  json engine_json = json::object();
  for (const auto& [part, samples] : engine_s) {
    const size_t dot = part.find('.');
    engine_json[part.substr(0, dot)][part.substr(dot + 1)] = Median(samples);
  }
  result["engine_s"] = engine_json;
  result["prefill_tokens_per_s"] = cold > 0 ? o.prompt_tokens / (cold / 1000) : 0.0;
  result["cached_tokens"] = cached_tokens;
  result["resident_tokens"] = resident_tokens;
  result["computed_tokens"] = computed_tokens;
  result["cached_run_computed_tokens_per_s"] = cached > 0 ? computed_tokens / (cached / 1000) : 0.0;
  const double ratio = cold > 0 ? cached / cold : 0;
  const double cold_cpu = Median(cold_cpu_ms), cached_cpu = Median(cached_cpu_ms);
  result["ttft_cpu_ms"] = {{"cold", cold_cpu},
                           {"cached", cached_cpu},
                           {"cold_samples", cold_cpu_ms},
                           {"cached_samples", cached_cpu_ms}};
  result["ratios"] = {{"ttft_cached_vs_cold_8k", ratio},
                      {"ttft_cpu_cached_vs_cold_8k", cold_cpu > 0 ? cached_cpu / cold_cpu : 0},
                      {"ttft_resident_vs_cold_8k", cold > 0 ? resident / cold : 0},
                      {"ttft_resident_vs_cached_8k", cached > 0 ? resident / cached : 0}};
  result["target"] = {{"ttft_cached_vs_cold_8k_max", kTtftRatioTarget},
                      {"pass", ratio <= kTtftRatioTarget}};

  // ---- Decode throughput by batch size ---------------------------------------------------------
  json decode = json::object();
  json decode_detail = json::object();
  for (int batch : o.batches) {
    std::vector<RequestSpec> specs;
    for (int i = 0; i < batch; ++i) {
      // Not saved: the measurement is the decode loop, and the cache stays sized for the TTFT.
      specs.push_back(spec(RandomTokens(o.decode_prompt_tokens, 5000 + 100000ull * batch + i),
                           o.decode_tokens, false));
    }
    ASSIGN_OR_RETURN(std::vector<Tracked> done, runner.Run(std::move(specs)));
    Clock::time_point all_first = Clock::time_point::min(), last = Clock::time_point::min();
    for (const Tracked& t : done) {
      if (t.token_events.empty()) return absl::InternalError("a decode request had no tokens");
      all_first = std::max(all_first, t.token_events.front().first);
      last = std::max(last, t.token_events.back().first);
    }
    int64_t in_window = 0, generated = 0;
    for (const Tracked& t : done) {
      for (const auto& [when, n] : t.token_events) {
        generated += n;
        if (when > all_first) in_window += n;
      }
    }
    const double window = Seconds(all_first, last);
    const double rate = window > 0 ? in_window / window : 0.0;
    decode[std::to_string(batch)] = rate;
    decode_detail[std::to_string(batch)] = {
        {"window_s", window}, {"tokens_in_window", in_window}, {"generated", generated}};
  }
  result["decode_tokens_per_s"] = decode;
  result["decode_detail"] = decode_detail;
  result["decode_method"] =
      "tokens delivered after every request of the batch had its first token, up to the last "
      "token, divided by that window (prefill excluded)";

  const WorkerStats stats = core.stats();
  core.Stop();
  result["worker_stats"] = {{"swapped_out", stats.swapped_out},
                            {"fetch_failures", stats.fetch_failures},
                            {"blocks_saved", stats.blocks_saved}};
  result["machine"] = {{"cores", std::thread::hardware_concurrency()}, {"cpu", CpuModel()}};
  result["options"] = {{"prompt_tokens", o.prompt_tokens},
                       {"cached_fraction", o.cached_fraction},
                       {"repeats", o.repeats},
                       {"batches", o.batches},
                       {"decode_tokens", o.decode_tokens},
                       {"decode_prompt_tokens", o.decode_prompt_tokens},
                       {"token_budget", o.token_budget},
                       {"block_tokens", o.block_tokens},
                       {"kv_pages", kv_pages},
                       {"kv_precision", "bf16"},
                       {"cache_codec", std::string(KvCodecName(o.cache_codec))},
                       {"cache", "in-process CacheServer, DRAM tier, tcp on loopback"}};
  return result;
}

std::string FormatWorkerBench(const json& r) {
  std::string out;
  const json& t = r["ttft_ms"];
  const double ratio = r["ratios"]["ttft_cached_vs_cold_8k"].get<double>();
  const int64_t prompt = r["options"]["prompt_tokens"].get<int64_t>();
  StrAppend(&out, "strata bench worker — ", r["model"]["note"].get<std::string>(), "\n");
  StrAppend(&out, absl::StrFormat("machine: %d cores, %s\n", r["machine"]["cores"].get<int>(),
                                  r["machine"]["cpu"].get<std::string>()));
  StrAppend(&out, absl::StrFormat("%-44s %12s\n", "measure", "value"));
  StrAppend(&out,
            absl::StrFormat("%-44s %10.1f ms\n", StrCat("TTFT cold (", prompt, " tokens, median)"),
                            t["cold"].get<double>()));
  StrAppend(&out,
            absl::StrFormat("%-44s %10.1f ms\n",
                            StrCat("TTFT cached (", r["cached_tokens"].get<int64_t>(), " cached, ",
                                   r["computed_tokens"].get<int64_t>(), " computed)"),
                            t["cached"].get<double>()));
  StrAppend(&out, absl::StrFormat("%-44s %10.1f ms\n",
                                  StrCat("TTFT resident (", r["resident_tokens"].get<int64_t>(),
                                         " in the worker's pool)"),
                                  t["resident"].get<double>()));
  StrAppend(&out, absl::StrFormat("%-44s %10.1f ms\n", "  fetching the cached prefix alone",
                                  t["fetch_cached_prefix"].get<double>()));
  StrAppend(&out, absl::StrFormat("%-44s %10.1f ms\n", "  computing as many tokens, no context",
                                  t["computed_part_without_context"].get<double>()));
  StrAppend(&out, absl::StrFormat("%-44s %10.0f tok/s\n", "prefill (cold)",
                                  r["prefill_tokens_per_s"].get<double>()));
  for (const auto& [batch, rate] : r["decode_tokens_per_s"].items()) {
    StrAppend(&out, absl::StrFormat("%-44s %10.1f tok/s\n", StrCat("decode, batch ", batch),
                                    rate.get<double>()));
  }
  StrAppend(&out, absl::StrFormat("%-44s %10.1f ms\n", "process CPU time to first token, cold",
                                  r["ttft_cpu_ms"]["cold"].get<double>()));
  StrAppend(&out, absl::StrFormat("%-44s %10.1f ms\n", "process CPU time to first token, cached",
                                  r["ttft_cpu_ms"]["cached"].get<double>()));
  StrAppend(&out, absl::StrFormat("ratio TTFT cached / cold = %.3f (target <= %.2f): %s\n", ratio,
                                  kTtftRatioTarget, ratio <= kTtftRatioTarget ? "PASS" : "MISS"));
  StrAppend(&out,
            absl::StrFormat("ratio of process CPU time to first token, cached / cold = %.3f\n",
                            r["ratios"]["ttft_cpu_cached_vs_cold_8k"].get<double>()));
  StrAppend(&out, absl::StrFormat("ratio TTFT resident / cached = %.3f, resident / cold = %.3f\n",
                                  r["ratios"]["ttft_resident_vs_cached_8k"].get<double>(),
                                  r["ratios"]["ttft_resident_vs_cold_8k"].get<double>()));
  return out;
}

}  // namespace strata::worker
