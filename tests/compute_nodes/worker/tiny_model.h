// The `tiny` preset's random checkpoint (seed 3), written once per test binary and shared.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "compute_nodes/model/make_random.h"
#include "compute_nodes/model/weights.h"

namespace strata::worker::testutil {

inline std::shared_ptr<const model::ModelWeights> TinyModel() {
  static std::shared_ptr<const model::ModelWeights> w;
  if (w) return w;
  const std::string dir = testing::TempDir() + "/worker_tiny_model";
  model::MakeRandomOptions o;
  o.seed = 3;
  EXPECT_TRUE(model::MakeRandomCheckpoint(*model::PresetConfig("tiny"), o, dir).ok());
  auto loaded = model::LoadModel(dir);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  w = std::shared_ptr<const model::ModelWeights>(std::move(*loaded));
  return w;
}

}  // namespace strata::worker::testutil
