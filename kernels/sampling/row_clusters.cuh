// Row-parallel sampling kernels on thread block clusters (sm_90): a row of `vocab` elements gets
// a cluster of up to kMaxRowCluster blocks when the rows leave SMs idle, each block over a slice
// of `per` elements (a multiple of 4, so 16-byte loads stay aligned). A kernel finds its row as
// blockIdx.x / the cluster's size and its slice from its rank in the cluster.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::kernels::sampling_detail {

inline constexpr int kMaxRowCluster = 8;   // the portable cluster size
inline constexpr int kMinRowSlice = 8192;  // elements per block worth a block of its own

struct RowClusters {
  int blocks = 1;   // per row
  int per = 0;      // elements of each block's slice
  size_t smem = 0;  // dynamic shared memory per block
};

// A launch of `grid` blocks of `threads` in clusters of `blocks` (`attr` holds the cluster
// dimension and must outlive the config).
inline cudaLaunchConfig_t ClusterLaunch(unsigned grid, int threads, int blocks, size_t smem,
                                        cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  *attr = cudaLaunchAttribute{};
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(blocks);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

// As many blocks per row as fill the device's SMs with `rows` rows (up to kMaxRowCluster), none
// with fewer than kMinRowSlice elements; one block a row when rows x kMaxRowCluster blocks would
// not fit in one grid. Fewer when the device cannot hold a cluster of that many blocks of
// `kernel` at once (a MIG slice, where a cluster must fit in the slice's share of a GPC): halved
// until it can, down to one block a row.
template <typename... Params>
absl::StatusOr<RowClusters> PlanRowClusters(const char* who, int rows, int vocab, int threads,
                                            void (*kernel)(Params...), size_t smem = 0) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return absl::InternalError(std::string(who) + cudaGetErrorString(err));
  RowClusters c;
  c.smem = smem;
  c.blocks = std::min({kMaxRowCluster, std::max(1, sms / std::max(1, rows)),
                       std::max(1, (vocab + kMinRowSlice - 1) / kMinRowSlice)});
  if (rows > 0x7fffffff / kMaxRowCluster) c.blocks = 1;
  // The query is no stream work; relaxed, so that it cannot invalidate a graph being captured
  // on this thread (the decode steps' graphs launch these kernels).
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (smem > 48 * 1024) {  // past the default limit: the kernel's opt-in, on this device
    err = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) {
      cudaThreadExchangeStreamCaptureMode(&mode);
      return absl::InternalError(std::string(who) + cudaGetErrorString(err));
    }
  }
  while (c.blocks > 1) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config =
        ClusterLaunch(static_cast<unsigned>(c.blocks), threads, c.blocks, smem, nullptr, &cluster);
    int clusters = 0;
    err = cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(kernel), &config);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // the query is advice: keep the plan, the launch will tell
      break;
    }
    if (clusters > 0) break;
    c.blocks /= 2;
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  c.per = ((vocab + c.blocks - 1) / c.blocks + 3) / 4 * 4;
  return c;
}

// kernel<<<rows x c.blocks, threads>>>(args...) in clusters of c.blocks.
template <typename... Params, typename... Args>
absl::Status LaunchRowClusters(const char* who, const RowClusters& c, int rows, int threads,
                               cudaStream_t stream, void (*kernel)(Params...), Args... args) {
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config =
      ClusterLaunch(static_cast<unsigned>(rows) * static_cast<unsigned>(c.blocks), threads,
                    c.blocks, c.smem, stream, &cluster);
  cudaError_t err = cudaLaunchKernelEx(&config, kernel, args...);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) return absl::InternalError(std::string(who) + cudaGetErrorString(err));
  return absl::OkStatus();
}

}  // namespace strata::kernels::sampling_detail
