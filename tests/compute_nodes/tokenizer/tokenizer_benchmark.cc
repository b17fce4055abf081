// Tokenizer throughput on one core: bytes of text encoded per second (target >= 5 MB/s), on the
// parity corpus (mixed scripts, code, emoji) and on English prose, plus decoding.
//
//   tokenizer_benchmark [--benchmark_min_time=1]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/paths.h"
#include "compute_nodes/tokenizer/tokenizer.h"

namespace strata::tokenizer {
namespace {

const Tokenizer& Tok() {
  static const Tokenizer* tok = [] {
    auto loaded = Tokenizer::Load(DeepSeekV3TokenizerDir());
    if (!loaded.ok()) {
      fprintf(stderr, "cannot load the tokenizer: %s\n", loaded.status().ToString().c_str());
      std::exit(1);
    }
    return loaded->release();
  }();
  return *tok;
}

std::string MixedText() {
  const char* src = std::getenv("STRATA_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") +
                   "/tests/compute_nodes/tokenizer/testdata/parity_corpus.json");
  std::stringstream s;
  s << in.rdbuf();
  const auto corpus = nlohmann::json::parse(s.str(), nullptr, false);
  std::string text;
  if (corpus.is_array()) {
    for (const auto& line : corpus) text += line.get<std::string>() + "\n";
  }
  if (text.empty()) {
    fprintf(stderr, "set STRATA_SOURCE_DIR to the repository (parity_corpus.json)\n");
    std::exit(1);
  }
  return text;
}

std::string EnglishText() {
  const std::string paragraph =
      "Strata keeps the attention cache of every request in a tiered store, so that a prompt "
      "which shares a prefix with an earlier one (a system prompt, a document, a long chat) "
      "skips the prefill of that prefix. The scheduler routes each request to the worker that "
      "already holds the longest matching prefix, weighing it against the load of the fleet; "
      "the decode workers then stream tokens back, 42 at a time, over HTTP/2.\n";
  std::string text;
  while (text.size() < (1 << 20)) text += paragraph;
  return text;
}

void EncodeBench(benchmark::State& state, const std::string& text) {
  const Tokenizer& tok = Tok();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.Encode(text);
    benchmark::DoNotOptimize(ids);
    tokens += ids->size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

void BM_EncodeMixed(benchmark::State& state) {
  static const std::string text = MixedText();
  EncodeBench(state, text);
}
BENCHMARK(BM_EncodeMixed)->Unit(benchmark::kMillisecond);

void BM_EncodeEnglish(benchmark::State& state) {
  static const std::string text = EnglishText();
  EncodeBench(state, text);
}
BENCHMARK(BM_EncodeEnglish)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  static const std::string text = MixedText();
  const std::vector<int32_t> ids = *Tok().Encode(text);
  for (auto _ : state) benchmark::DoNotOptimize(Tok().Decode(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace strata::tokenizer

BENCHMARK_MAIN();
