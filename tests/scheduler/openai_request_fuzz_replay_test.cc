// Replays the fuzz corpus, and deterministic mutations of it, through the libFuzzer target of
// the OpenAI request parser, so the target runs in every build (g++ has no libFuzzer).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int FuzzOne(const std::string& input) {
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

TEST(OpenAiRequestFuzzReplayTest, CorpusAndMutations) {
  const char* source = std::getenv("STRATA_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "STRATA_SOURCE_DIR is not set (run through ctest)";
  const std::filesystem::path dir = std::filesystem::path(source) / "tests/scheduler/fuzz_corpus";
  std::vector<std::string> corpus;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    corpus.push_back(ss.str());
  }
  ASSERT_GE(corpus.size(), 4u) << "fuzz corpus missing in " << dir;
  std::mt19937 rng(1234);
  const std::string dictionary[] = {"{",
                                    "}",
                                    "[",
                                    "]",
                                    "\"",
                                    ":",
                                    ",",
                                    "null",
                                    "true",
                                    "-1",
                                    "1e999",
                                    "\\u0000",
                                    "\xff\xfe",
                                    "\"model\"",
                                    "\"messages\"",
                                    "\"stream\"",
                                    "\"max_tokens\"",
                                    "\"stop\"",
                                    "\"cache_salt\""};
  int runs = 0;
  for (const std::string& seed : corpus) {
    ASSERT_EQ(FuzzOne(seed), 0);
    ++runs;
    for (int i = 0; i < 3000; ++i) {
      std::string m = seed;
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits && !m.empty(); ++e) {
        const size_t pos = rng() % m.size();
        switch (rng() % 4) {
          case 0:
            m[pos] = char(rng());
            break;
          case 1:
            m.erase(pos, 1 + rng() % 8);
            break;
          case 2:
            m.insert(pos, dictionary[rng() % std::size(dictionary)]);
            break;
          case 3:
            m.resize(pos);
            break;
        }
      }
      ASSERT_EQ(FuzzOne(m), 0);
      ++runs;
    }
  }
  EXPECT_GT(runs, 10000);
}

}  // namespace
