// GPU label: runs on the device machine. Without a GPU it reports SKIPPED, never passed.
#include <gtest/gtest.h>

#include "common/cuda/device_info.h"

namespace strata {
namespace {

TEST(CudaDeviceTest, EveryDeviceRunsAKernel) {
  auto devices = ListCudaDevices();
  if (!devices.ok() || devices->empty()) GTEST_SKIP() << "no CUDA device";
  for (const auto& d : *devices) {
    EXPECT_GT(d.num_sms, 0);
    EXPECT_GT(d.total_memory_bytes, 0u);
    const absl::Status st = SelfTestCudaDevice(d.index, 1 << 22);
    EXPECT_TRUE(st.ok()) << d.name << ": " << st;
  }
}

}  // namespace
}  // namespace strata
