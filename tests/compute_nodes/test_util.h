// Helpers shared by the compute_nodes tests: fixture paths, base64 float arrays, error norms.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"

namespace strata::testutil {

inline std::string FixtureDir() {
  const char* dir = std::getenv("STRATA_SOURCE_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/tests/compute_nodes/fixtures";
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// base64 of little-endian float32, as scripts/hf_reference.py writes it.
inline std::vector<float> DecodeFloats(const std::string& b64) {
  std::string raw;
  EXPECT_TRUE(absl::Base64Unescape(absl::string_view(b64.data(), b64.size()), &raw));
  std::vector<float> out(raw.size() / 4);
  std::memcpy(out.data(), raw.data(), out.size() * 4);
  return out;
}

// ‖a − b‖ / ‖b‖.
inline double RelError(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

inline double MaxAbsDiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace strata::testutil
