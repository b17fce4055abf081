// The grid barrier (kernels/common/grid_barrier.cuh) through the rounds kernel: every round after a
// barrier must see what another CTA wrote before it, over thousands of rounds, one CTA to every CTA
// the device holds, ordinary and cooperative launches, programmatic launches back to back, and
// launches captured into a CUDA graph (label gpu: SKIPPED without a GPU).
#include "kernels/common/grid_barrier.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "kernels/common/sm90_device.h"
#include "tests/kernels/gpu_test_util.h"

namespace strata::kernels {
namespace {

using testing::DeviceBuffer;

struct Buffers {
  explicit Buffers(int ctas) : word(4), slots(size_t{2} * ctas * 4), errors(4) {
    EXPECT_EQ(cudaMemset(word.get(), 0, 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(errors.get(), 0, 4), cudaSuccess);
  }
  GridRoundsParams Params(int ctas, GridSync sync, int rounds) const {
    GridRoundsParams p;
    p.num_ctas = ctas;
    p.rounds = rounds;
    p.sync = sync;
    p.barrier_word = word.get<uint32_t>();
    p.slots = slots.get<int32_t>();
    p.errors = errors.get<int32_t>();
    return p;
  }
  int Errors() const { return errors.Download<int32_t>()[0]; }
  uint32_t Word() const { return word.Download<uint32_t>()[0]; }
  DeviceBuffer word, slots, errors;
};

// After rounds 0..last every CTA's slot of round `last` holds `last`.
void ExpectLastRound(const Buffers& b, int ctas, int last) {
  const std::vector<int32_t> slots = b.slots.Download<int32_t>();
  int wrong = 0;
  for (int c = 0; c < ctas; ++c) wrong += slots[(last & 1) * ctas + c] != last;
  EXPECT_EQ(wrong, 0) << "ctas=" << ctas << " last round " << last;
}

std::vector<int> CtaCounts() {
  const int sms = CurrentDeviceSmCount();
  EXPECT_GT(sms, 1);
  return {1, 2, sms - 1, sms, 2 * sms, GridRoundsMaxCtas()};
}

TEST(GridBarrierTest, EveryRoundSeesTheOneBefore) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_GT(GridRoundsMaxCtas(), 0);
  constexpr int kRounds = 4000;
  struct Variant {
    const char* name;
    GridSync sync;
    bool cooperative;
  };
  const Variant variants[] = {{"barrier", GridSync::kBarrier, false},
                              {"barrier, cooperative launch", GridSync::kBarrier, true},
                              {"cooperative groups", GridSync::kCooperativeGroups, true}};
  for (const Variant& v : variants) {
    for (int ctas : CtaCounts()) {
      Buffers b(ctas);
      GridRoundsParams p = b.Params(ctas, v.sync, kRounds);
      p.cooperative_launch = v.cooperative;
      const absl::Status st = LaunchGridRounds(p, nullptr);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(b.Errors(), 0) << v.name << " ctas=" << ctas;
      ExpectLastRound(b, ctas, kRounds - 1);
      // Each of the kRounds - 1 barriers adds exactly 2^31: the low bits are back at 0.
      if (v.sync == GridSync::kBarrier) {
        EXPECT_EQ(b.Word(), (kRounds - 1) % 2 == 1 ? 0x80000000u : 0u) << v.name;
      }
      std::printf("grid_barrier %s ctas=%d rounds=%d errors=%d\n", v.name, ctas, kRounds,
                  b.Errors());
    }
  }
}

// Launches back to back, programmatic (each may start while the one before finishes): the
// launch boundary orders kLaunch's rounds, and a barrier kernel's first round sees the previous
// launch's last. The same sequence captured into a graph and replayed.
TEST(GridBarrierTest, ProgrammaticLaunchesAndGraphs) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const int ctas = GridRoundsMaxCtas();
  ASSERT_GT(ctas, 0);
  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (bool cooperative : {false, true}) {
    Buffers b(ctas);
    // 60 one-round launches, then 20 launches of 50 rounds, numbered on from there.
    auto enqueue = [&]() -> absl::Status {
      int round = 0;
      for (int i = 0; i < 60; ++i) {
        GridRoundsParams p = b.Params(ctas, GridSync::kLaunch, 1);
        p.first_round = round++;
        p.programmatic = true;
        if (absl::Status st = LaunchGridRounds(p, stream); !st.ok()) return st;
      }
      for (int i = 0; i < 20; ++i) {
        GridRoundsParams p = b.Params(ctas, GridSync::kBarrier, 50);
        p.first_round = round;
        round += 50;
        p.programmatic = true;
        p.cooperative_launch = cooperative;
        if (absl::Status st = LaunchGridRounds(p, stream); !st.ok()) return st;
      }
      return absl::OkStatus();
    };
    constexpr int kLast = 60 + 20 * 50 - 1;
    absl::Status st = enqueue();
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(b.Errors(), 0) << "stream, cooperative=" << cooperative;
    ExpectLastRound(b, ctas, kLast);

    cudaGraph_t graph;
    ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    st = enqueue();
    ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st;
    cudaGraphExec_t exec;
    ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(b.Errors(), 0) << "graph, cooperative=" << cooperative;
    ExpectLastRound(b, ctas, kLast);
    EXPECT_EQ(b.Word() & 0x7fffffffu, 0u);
    ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
    ASSERT_CUDA_OK(cudaGraphDestroy(graph));
  }
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

TEST(GridBarrierTest, RefusesMoreCtasThanTheDeviceHolds) {
  if (!testing::HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const int most = GridRoundsMaxCtas();
  Buffers b(most + 1);
  const absl::Status st = LaunchGridRounds(b.Params(most + 1, GridSync::kBarrier, 2), nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  // A launch boundary needs no co-residency.
  GridRoundsParams p = b.Params(most + 1, GridSync::kLaunch, 1);
  EXPECT_TRUE(LaunchGridRounds(p, nullptr).ok());
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(b.Errors(), 0);
}

}  // namespace
}  // namespace strata::kernels
