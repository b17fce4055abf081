// The cuda transport on a real GPU (label gpu): host <-> device through the engine, device
// segments in the registry, peer copies, capability refusals, checksums. Skips without a GPU.
#include "transfer/cuda/cuda_transport.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>

#include "common/checksum.h"
#include "transfer/transfer_engine.h"

namespace strata::transfer {
namespace {

class CudaTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    auto engine = TransferEngine::Create({.host_id = "h", .secret = secret_});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    auto peer = engine_->OpenPeer(engine_->LocalPeerSpec());
    ASSERT_TRUE(peer.ok()) << peer.status();
    ASSERT_EQ((*peer)->transport(), TransportKind::kCuda);
    peer_ = *peer;
  }

  std::string Cap(std::string seg, uint64_t bytes, Access a = Access::kReadWrite) {
    return *IssueCapability(secret_, {.segment = std::move(seg),
                                      .offset = 0,
                                      .length = bytes,
                                      .access = a,
                                      .expires = absl::Now() + absl::Minutes(5)});
  }

  absl::Status Run(std::vector<TransferOp> ops) {
    auto batch = engine_->Submit(*peer_, std::move(ops), {.timeout = absl::Seconds(30)});
    if (!batch->Wait(absl::Seconds(60))) return absl::DeadlineExceededError("batch hung");
    return batch->FirstError();
  }

  ClusterSecret secret_{"gpu-secret"};
  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<Peer> peer_;
};

TEST_F(CudaTransportTest, DramSegmentToGpuAndBackIsExact) {
  constexpr uint64_t kBytes = 64 << 20;
  auto dram = CreateSharedHostSegment("dram", kBytes);  // pageable memfd memory, like the cache
  ASSERT_TRUE(dram.ok()) << dram.status();
  auto* host = static_cast<uint8_t*>(dram->base);
  std::mt19937_64 gen(3);
  for (uint64_t i = 0; i < kBytes; i += 8) *reinterpret_cast<uint64_t*>(host + i) = gen();
  ASSERT_TRUE(engine_->segments().Register(*dram).ok());
  auto gpu = AllocateDeviceSegment("gpu", kBytes, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(engine_->segments().Register(*gpu).ok());
  const std::string dram_cap = Cap("dram", kBytes);

  // DRAM segment -> GPU (reads into device pointers), 64 random blocks, with checksums.
  std::vector<TransferOp> ops;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (int i = 0; i < 64; ++i) {
    const uint64_t len = 1 + gen() % (1 << 20);
    const uint64_t off = gen() % (kBytes - len);
    const uint64_t dst = static_cast<uint64_t>(i) << 20;
    ranges.push_back({off, len});
    ops.push_back({.op = OpKind::kRead,
                   .local = static_cast<char*>(gpu->base) + dst,
                   .segment = "dram",
                   .offset = off,
                   .length = len,
                   .capability = dram_cap,
                   .checksum = Checksum64(host + off, len)});
  }
  ASSERT_TRUE(Run(ops).ok()) << Run(ops);
  // GPU -> host buffer through the device segment (D2H), compared with the DRAM source.
  const std::string gpu_cap = Cap("gpu", kBytes, Access::kRead);
  std::vector<uint8_t> back(1 << 20);
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(Run({{.op = OpKind::kRead,
                      .local = back.data(),
                      .segment = "gpu",
                      .offset = static_cast<uint64_t>(i) << 20,
                      .length = ranges[i].second,
                      .capability = gpu_cap}})
                    .ok());
    ASSERT_EQ(0, std::memcmp(back.data(), host + ranges[i].first, ranges[i].second)) << i;
  }
  // Write host -> device segment, then read it back.
  std::vector<uint8_t> src(300000, 0x3C);
  ASSERT_TRUE(Run({{.op = OpKind::kWrite,
                    .local = src.data(),
                    .segment = "gpu",
                    .offset = 12345,
                    .length = src.size(),
                    .capability = Cap("gpu", kBytes, Access::kWrite),
                    .checksum = Checksum64(src.data(), src.size())}})
                  .ok());
  std::vector<uint8_t> check(src.size());
  ASSERT_EQ(cudaSuccess, cudaMemcpy(check.data(), static_cast<char*>(gpu->base) + 12345,
                                    check.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(check, src);
  ASSERT_TRUE(engine_->segments().Unregister("gpu").ok());
  ASSERT_TRUE(engine_->segments().Unregister("dram").ok());
}

TEST_F(CudaTransportTest, RefusesBadCapabilitiesBoundsAndChecksums) {
  auto gpu = AllocateDeviceSegment("gpu", 1 << 20, 0);
  ASSERT_TRUE(gpu.ok());
  ASSERT_TRUE(engine_->segments().Register(*gpu).ok());
  std::vector<uint8_t> buf(4096, 1);
  auto op = [&](OpKind k, uint64_t off, std::string cap) {
    return TransferOp{.op = k,
                      .local = buf.data(),
                      .segment = "gpu",
                      .offset = off,
                      .length = buf.size(),
                      .capability = std::move(cap)};
  };
  EXPECT_TRUE(
      absl::IsPermissionDenied(Run({op(OpKind::kWrite, 0, Cap("gpu", 1 << 20, Access::kRead))})));
  EXPECT_TRUE(absl::IsPermissionDenied(Run({op(OpKind::kRead, 0, "bogus")})));
  EXPECT_TRUE(absl::IsOutOfRange(Run({op(OpKind::kRead, (1 << 20) - 100, Cap("gpu", 2 << 20))})));
  TransferOp bad = op(OpKind::kWrite, 0, Cap("gpu", 1 << 20));
  bad.checksum = Checksum64(buf.data(), buf.size()) ^ 1;
  EXPECT_TRUE(absl::IsDataLoss(Run({bad})));
  ASSERT_TRUE(engine_->segments().Unregister("gpu").ok());
}

TEST_F(CudaTransportTest, PeerCopyBetweenTwoGpus) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs two GPUs on one host";
  constexpr uint64_t kBytes = 8 << 20;
  auto a = AllocateDeviceSegment("gpu0", kBytes, 0);
  auto b = AllocateDeviceSegment("gpu1", kBytes, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(engine_->segments().Register(*a).ok());
  std::vector<uint8_t> pattern(kBytes);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 31);
  ASSERT_EQ(cudaSuccess, cudaMemcpy(a->base, pattern.data(), kBytes, cudaMemcpyHostToDevice));
  // Read gpu0's segment into a device-1 buffer.
  ASSERT_TRUE(Run({{.op = OpKind::kRead,
                    .local = b->base,
                    .segment = "gpu0",
                    .offset = 0,
                    .length = kBytes,
                    .capability = Cap("gpu0", kBytes, Access::kRead)}})
                  .ok());
  std::vector<uint8_t> out(kBytes);
  cudaSetDevice(1);
  ASSERT_EQ(cudaSuccess, cudaMemcpy(out.data(), b->base, kBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(out, pattern);
  ASSERT_TRUE(engine_->segments().Unregister("gpu0").ok());
}

}  // namespace
}  // namespace strata::transfer
