// DeviceKvPool::ReadsInPlace: host memory another process shares (as a cache server's shm arena
// is: a memfd mapped MAP_SHARED) is registered with CUDA once (in the background by default),
// imported from in place, and unregistered when it falls out of the pool's window or nothing but
// the pool holds it any more. Pinned payloads move by the copy engine or by the kernels in place
// alike. Label gpu; skipped without a GPU.
#include "compute_nodes/backend/cuda/device_kv_pool.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "tests/compute_nodes/kv_pool_checks.h"

namespace strata::cuda {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// `bytes` of memfd-backed shared memory, unmapped when the last owner goes.
struct Shared {
  std::span<uint8_t> bytes;
  std::shared_ptr<const void> owner;
};

Shared MapShared(size_t bytes) {
  const int fd = memfd_create("device-kv-pool-test", 0);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  EXPECT_NE(p, MAP_FAILED);
  auto* base = static_cast<uint8_t*>(p);
  return {{base, bytes}, std::shared_ptr<const void>(base, [bytes](const void* q) {
            munmap(const_cast<void*>(q), bytes);
          })};
}

bool Registered(const void* p) {
  cudaPointerAttributes a{};
  const bool ok = cudaPointerGetAttributes(&a, p) == cudaSuccess;
  (void)cudaGetLastError();
  return ok && a.type == cudaMemoryTypeHost;
}

constexpr runtime::KvLayout kLayout{/*num_layers=*/3, /*block_tokens=*/64, /*latent_dim=*/512,
                                    /*rope_dim=*/64};

// Pages [0, n) loaded from payloads inside `shared` (at an odd page-aligned offset) match them.
void ExpectImportsFrom(DeviceKvPool& pool, const Shared& shared, int n, uint32_t seed) {
  const size_t bytes = pool.PayloadBytes(runtime::PayloadDtype::kBf16);
  ASSERT_GE(shared.bytes.size(), 4096 + n * bytes);
  std::mt19937 rng(seed);
  std::vector<int32_t> pages;
  std::vector<std::span<const uint8_t>> in;
  for (int i = 0; i < n; ++i) {
    pages.push_back(i);
    uint8_t* at = shared.bytes.data() + 4096 + i * bytes;
    for (size_t k = 0; k < bytes; k += 2) {
      const uint16_t b = static_cast<uint16_t>(rng() & 0xbf7f);  // finite bf16
      std::memcpy(at + k, &b, 2);
    }
    in.emplace_back(at, bytes);
  }
  int64_t done = 0;
  ASSERT_TRUE(pool.ImportPages(pages, runtime::PayloadDtype::kBf16, in, &done).ok());
  std::vector<std::vector<uint8_t>> out;
  ASSERT_TRUE(pool.ExportPages(pages, runtime::PayloadDtype::kBf16, &out, &done).ok());
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(std::equal(out[i].begin(), out[i].end(), in[i].begin())) << "page " << i;
  }
}

TEST(DeviceKvPoolTest, SharedRegionsAreRegisteredOnceAndReadInPlace) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto pool = DeviceKvPool::Create(
      kLayout, 12, {.register_shared_regions = true, .register_in_background = false});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const size_t bytes = (*pool)->PayloadBytes(runtime::PayloadDtype::kBf16);
  Shared a = MapShared(4096 + 11 * bytes + 4096);
  EXPECT_FALSE(Registered(a.bytes.data()));
  EXPECT_TRUE((*pool)->ReadsInPlace(a.bytes, a.owner));
  EXPECT_TRUE(Registered(a.bytes.data()));
  EXPECT_TRUE((*pool)->ReadsInPlace(a.bytes, a.owner));  // remembered
  ExpectImportsFrom(**pool, a, 11, 1);                   // 8 + 3: two launches, in place

  // Off by default: the pool declines and registers nothing.
  auto plain = DeviceKvPool::Create(kLayout, 4);
  ASSERT_TRUE(plain.ok());
  Shared b = MapShared(4096 + 3 * bytes);
  EXPECT_FALSE((*plain)->ReadsInPlace(b.bytes, b.owner));
  EXPECT_FALSE(Registered(b.bytes.data()));
  ExpectImportsFrom(**plain, b, 3, 2);  // staged
}

// By default the registration runs on a thread of its own: the region is declined until it is
// done, then read in place. A pool destroyed while one still runs waits for it and undoes it.
TEST(DeviceKvPoolTest, RegistrationRunsInTheBackground) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto pool = DeviceKvPool::Create(kLayout, 12, {.register_shared_regions = true});
  ASSERT_TRUE(pool.ok()) << pool.status();
  Shared a = MapShared(size_t{512} << 20);  // registering it takes milliseconds
  EXPECT_FALSE((*pool)->ReadsInPlace(a.bytes, a.owner)) << "registered within the first offer";
  bool taken = false;
  for (int i = 0; i < 1000 && !taken; ++i) {
    taken = (*pool)->ReadsInPlace(a.bytes, a.owner);
    if (!taken) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(taken) << "not registered within 10 s";
  EXPECT_TRUE(Registered(a.bytes.data()));
  ExpectImportsFrom(**pool, a, 11, 5);

  Shared b = MapShared(size_t{512} << 20);
  EXPECT_FALSE((*pool)->ReadsInPlace(b.bytes, b.owner));
  pool->reset();  // while b may still be registering
  EXPECT_FALSE(Registered(a.bytes.data()));
  EXPECT_FALSE(Registered(b.bytes.data()));
  EXPECT_EQ(a.owner.use_count(), 1);
  EXPECT_EQ(b.owner.use_count(), 1);
}

// fp8 payloads: the kernels quantize on export and dequantize on import, as the block format's
// own codec does (19 pages: batches of 8 + 8 + 3; staged and in place).
TEST(DeviceKvPoolTest, Fp8PayloadsAreTheBlockFormatsCodec) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto pool = DeviceKvPool::Create(kLayout, 40);
  ASSERT_TRUE(pool.ok()) << pool.status();
  testutil::CheckFp8PageMoves(**pool, 19, 31);
  testutil::CheckFp8PageMoves(**pool, 1, 32);
}

// Pinned payloads cross PCIe by the copy engine into device staging slots (the default; runs of
// adjacent payloads as one copy) or are read and written by the kernels in place (zero copy):
// both move exactly the bytes the checks expect, in batches of 8 with odd tails, adjacent in one
// buffer or mixed with ordinary vectors (staged on the host), bf16, fp32 and fp8.
TEST(DeviceKvPoolTest, CopyEngineAndZeroCopyMoveTheSameBytes) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (const bool copy_engine : {true, false}) {
    SCOPED_TRACE(copy_engine ? "copy engine" : "zero copy");
    auto pool = DeviceKvPool::Create(kLayout, 48, {.copy_engine = copy_engine});
    ASSERT_TRUE(pool.ok()) << pool.status();
    testutil::CheckBatchedPageMoves(**pool, 19, 51);
    testutil::CheckHostBufferPageMoves(**pool, 19, 52);
    testutil::CheckHostBufferPageMoves(**pool, 1, 53);
    testutil::CheckFp8PageMoves(**pool, 11, 54);
  }
}

TEST(DeviceKvPoolTest, TheOldestRegionIsUnregisteredPastTheWindow) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto pool = DeviceKvPool::Create(kLayout, 4,
                                   {.register_shared_regions = true,
                                    .register_in_background = false,
                                    .max_registered_regions = 1});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const size_t bytes = (*pool)->PayloadBytes(runtime::PayloadDtype::kBf16);
  Shared a = MapShared(4096 + 3 * bytes), b = MapShared(4096 + 3 * bytes);
  ASSERT_TRUE((*pool)->ReadsInPlace(a.bytes, a.owner));
  ASSERT_TRUE((*pool)->ReadsInPlace(b.bytes, b.owner));
  EXPECT_FALSE(Registered(a.bytes.data()));
  EXPECT_TRUE(Registered(b.bytes.data()));
  ExpectImportsFrom(**pool, a, 3, 3);  // staged now
  ExpectImportsFrom(**pool, b, 3, 4);  // in place
  // The pool held the old region's mapping while it was registered, and let it go after.
  EXPECT_EQ(a.owner.use_count(), 1);
  EXPECT_EQ(b.owner.use_count(), 2);
  pool->reset();  // unregisters before it lets the mapping go
  EXPECT_FALSE(Registered(b.bytes.data()));
  EXPECT_EQ(b.owner.use_count(), 1);
}

// A region whose last other holder let it go (a restarted server's old arena, once the client's
// data path is re-opened) is unregistered and unmapped at the next offer, not kept pinned.
TEST(DeviceKvPoolTest, ARegionOnlyThePoolHoldsIsLetGo) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto pool = DeviceKvPool::Create(
      kLayout, 4, {.register_shared_regions = true, .register_in_background = false});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const size_t bytes = (*pool)->PayloadBytes(runtime::PayloadDtype::kBf16);
  Shared a = MapShared(4096 + 3 * bytes), b = MapShared(4096 + 3 * bytes);
  ASSERT_TRUE((*pool)->ReadsInPlace(a.bytes, a.owner));
  const std::weak_ptr<const void> old = a.owner;
  a.owner.reset();  // the transport's reference goes: only the pool holds the mapping
  ASSERT_FALSE(old.expired());
  ASSERT_TRUE((*pool)->ReadsInPlace(b.bytes, b.owner));
  EXPECT_TRUE(old.expired()) << "the old region is still held";
  EXPECT_TRUE(Registered(b.bytes.data()));
  ExpectImportsFrom(**pool, b, 3, 6);  // in place from the new one
}

}  // namespace
}  // namespace strata::cuda
