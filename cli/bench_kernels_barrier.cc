#include "cli/bench_kernels_barrier.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "cli/bench_kernels_timing.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/graph_capture.h"
#include "common/status.h"
#include "kernels/common/grid_barrier.h"
#include "kernels/common/sm90_device.h"

namespace strata::cli::bench_kernels {
namespace {

using kernels::GridRoundsParams;
using kernels::GridSync;

constexpr int kRoundsPerLaunch = 2000;  // one persistent launch: the launch cost amortized
constexpr int kGraphLaunches = 100;     // launches captured into one graph
constexpr int kGraphRounds = 20;        // rounds per barrier launch inside the graph

// A graph of kGraphLaunches launches of Capture's `p`, rounds numbered on from one launch to
// the next.
class RoundsGraph {
 public:
  ~RoundsGraph() {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  }
  absl::Status Capture(GridRoundsParams p) {
    cudaStream_t stream;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    absl::StatusOr<cudaGraphExec_t> exec = CaptureGraph(
        stream,
        [&]() -> absl::Status {
          for (int i = 0; i < kGraphLaunches; ++i) {
            RETURN_IF_ERROR(kernels::LaunchGridRounds(p, stream));
            p.first_round += p.rounds;
          }
          return absl::OkStatus();
        },
        "grid rounds");
    (void)cudaStreamDestroy(stream);
    if (!exec.ok()) return exec.status();
    exec_ = *exec;
    return absl::OkStatus();
  }
  absl::Status Launch() const {
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, nullptr));
    return absl::OkStatus();
  }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

absl::Status BenchGridBarrier(int iters, nlohmann::json& report) {
  const int most = kernels::GridRoundsMaxCtas(), sms = kernels::CurrentDeviceSmCount();
  if (most <= 0 || sms <= 0) return absl::InternalError("cannot size the grid");
  std::cout << fmt::format("{:>6}", "ctas");
  for (const char* name : {"barrier", "coop", "cg", "graph+pdl", "launch+pdl", "launch"}) {
    std::cout << fmt::format(" {:>11}", name);
  }
  std::cout << "   (us per round)\n";
  nlohmann::json points = nlohmann::json::array();
  for (int ctas : {sms, 2 * sms, most}) {
    DeviceBuffer word, slots, errors;
    RETURN_IF_ERROR(word.Allocate(4));
    RETURN_IF_ERROR(slots.Allocate(size_t{2} * ctas * 4));
    RETURN_IF_ERROR(errors.Allocate(4));
    CUDA_RETURN_IF_ERROR(cudaMemset(word.ptr, 0, 4));
    CUDA_RETURN_IF_ERROR(cudaMemset(errors.ptr, 0, 4));
    GridRoundsParams base;
    base.num_ctas = ctas;
    base.barrier_word = static_cast<uint32_t*>(word.ptr);
    base.slots = static_cast<int32_t*>(slots.ptr);
    base.errors = static_cast<int32_t*>(errors.ptr);
    auto persistent = [&](GridSync sync, bool cooperative) {
      GridRoundsParams p = base;
      p.sync = sync;
      p.rounds = kRoundsPerLaunch;
      p.cooperative_launch = cooperative;
      return p;
    };
    const GridRoundsParams barrier = persistent(GridSync::kBarrier, false);
    const GridRoundsParams coop = persistent(GridSync::kBarrier, true);
    const GridRoundsParams cg = persistent(GridSync::kCooperativeGroups, true);
    GridRoundsParams in_graph = base;
    in_graph.rounds = kGraphRounds;
    in_graph.programmatic = true;
    in_graph.cooperative_launch = true;
    GridRoundsParams launch = base;
    launch.sync = GridSync::kLaunch;
    launch.programmatic = true;
    RoundsGraph barrier_graph, launch_pdl_graph, launch_graph;
    RETURN_IF_ERROR(barrier_graph.Capture(in_graph));
    RETURN_IF_ERROR(launch_pdl_graph.Capture(launch));
    launch.programmatic = false;
    RETURN_IF_ERROR(launch_graph.Capture(launch));
    const std::vector<std::function<absl::Status()>> fns = {
        [&] { return kernels::LaunchGridRounds(barrier, nullptr); },
        [&] { return kernels::LaunchGridRounds(coop, nullptr); },
        [&] { return kernels::LaunchGridRounds(cg, nullptr); },
        [&] { return barrier_graph.Launch(); },
        [&] { return launch_pdl_graph.Launch(); },
        [&] { return launch_graph.Launch(); }};
    ASSIGN_OR_RETURN(const std::vector<double> ms, MedianMsInTurns(fns, 3, iters));
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    int32_t failed = 0;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(&failed, errors.ptr, 4, cudaMemcpyDeviceToHost));
    if (failed != 0) {
      return absl::InternalError(
          fmt::format("grid barrier: {} failed round checks at {} CTAs", failed, ctas));
    }
    const double per_round[] = {
        ms[0] * 1e3 / kRoundsPerLaunch, ms[1] * 1e3 / kRoundsPerLaunch,
        ms[2] * 1e3 / kRoundsPerLaunch, ms[3] * 1e3 / (kGraphLaunches * kGraphRounds),
        ms[4] * 1e3 / kGraphLaunches,   ms[5] * 1e3 / kGraphLaunches};
    std::cout << fmt::format("{:>6}", ctas);
    for (double us : per_round) std::cout << fmt::format(" {:>11.3f}", us);
    std::cout << "\n";
    points.push_back({{"ctas", ctas},
                      {"barrier_us", per_round[0]},
                      {"barrier_cooperative_us", per_round[1]},
                      {"cooperative_groups_us", per_round[2]},
                      {"barrier_in_graph_pdl_us", per_round[3]},
                      {"launch_in_graph_pdl_us", per_round[4]},
                      {"launch_in_graph_us", per_round[5]}});
  }
  report["barrier"] = points;
  return absl::OkStatus();
}

}  // namespace strata::cli::bench_kernels
