// CUDA device runtime: caching allocator (reuse, size classes, high-water marks, out-of-memory as a
// Status), owning buffers, streams and events, copies. Skipped without a CUDA build or device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_device.h"
#include "ops/cuda/pdl.h"
#include "ops/device_buffer.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST(CudaAllocatorSizes, RoundingClasses) {
  using A = cuda::DeviceAllocator;
  EXPECT_EQ(A::round_size(0), 512);
  EXPECT_EQ(A::round_size(1), 512);
  EXPECT_EQ(A::round_size(513), 1024);
  EXPECT_EQ(A::round_size((1 << 20) - 1), 1 << 20);
  EXPECT_EQ(A::round_size((1 << 20) + 1), 2 << 20);
  EXPECT_EQ(A::round_size((5 << 20) + 7), 6 << 20);
}

TEST_F(CudaDeviceTest, DeviceInfoIsReadable) {
  auto info = cuda::device_info(0);
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_FALSE(info->name.empty());
  EXPECT_GT(info->sm_count, 0);
  EXPECT_GT(info->total_bytes, 0);
  EXPECT_TRUE(cuda::device_usable(0));
}

// A failed call is reported once, as its Status: it does not resurface at the next launch check (a bad
// ordinal at model load once failed the first kernel launch of the next model).
TEST_F(CudaDeviceTest, AFailedCallLeavesNoErrorBehind) {
  const auto bad = cuda::device_info(cuda::device_count() + 3);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cudaErrorInvalidDevice"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(cuda::device_usable(0));
}

// Programmatic dependent launch needs kernels that wait for their predecessor (griddepcontrol, compiled
// for compute_90 and later): device code the driver compiled from older PTX runs in plain stream order
// even on an sm_90 GPU.
TEST_F(CudaDeviceTest, DependentLaunchOnlyWithDeviceCodeThatWaits) {
  auto info = cuda::device_info(0);
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  const int ptx = cuda::device_code_ptx_version();
  EXPECT_GE(ptx, 80) << "device code for compute_80 or later";
  const char* env = std::getenv("DELTASERVE_PDL");
  const bool env_off = env != nullptr && std::strcmp(env, "0") == 0;
  EXPECT_EQ(cuda::pdl_enabled(), info->cc_major >= 9 && ptx >= 90 && !env_off)
      << "cc " << info->cc_major << "." << info->cc_minor << ", device code PTX " << ptx;
  std::printf("[cuda-device] cc %d.%d, device code PTX %d, dependent launch %s\n", info->cc_major, info->cc_minor, ptx,
              cuda::pdl_enabled() ? "on" : "off");
}

TEST_F(CudaDeviceTest, AllocatorReusesFreedBlocksAndTracksPeaks) {
  auto& alloc = cuda::DeviceAllocator::for_device(0);
  ASSERT_TRUE(alloc.trim().is_ok());
  alloc.reset_peaks();
  const auto before = alloc.stats();
  {
    auto a = cuda::CudaBuffer::allocate(0, 3 << 20);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    auto b = cuda::CudaBuffer::allocate(0, 1000);
    ASSERT_TRUE(b.is_ok());
    const auto mid = alloc.stats();
    EXPECT_EQ(mid.in_use_bytes - before.in_use_bytes, (4 << 20) + 1024);
    EXPECT_EQ(mid.n_device_allocs - before.n_device_allocs, 2);
  }
  const auto after_free = alloc.stats();
  EXPECT_EQ(after_free.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after_free.peak_in_use_bytes - before.in_use_bytes, (4 << 20) + 1024);
  {
    auto c = cuda::CudaBuffer::allocate(0, (3 << 20) + 5);  // same class as the freed 3 MiB block
    ASSERT_TRUE(c.is_ok());
    EXPECT_EQ(alloc.stats().n_device_allocs, after_free.n_device_allocs) << "cached block not reused";
    auto big = cuda::CudaBuffer::allocate(0, 9 << 20);  // the 4 MiB block is too small for it
    ASSERT_TRUE(big.is_ok());
    EXPECT_EQ(alloc.stats().n_device_allocs, after_free.n_device_allocs + 1);
  }
  ASSERT_TRUE(alloc.trim().is_ok());
  EXPECT_EQ(alloc.stats().reserved_bytes, alloc.stats().in_use_bytes);
}

TEST_F(CudaDeviceTest, OutOfMemoryIsAStatusNotACrash) {
  auto& alloc = cuda::DeviceAllocator::for_device(0);
  const auto before = alloc.stats();
  auto huge = cuda::CudaBuffer::allocate(0, int64_t{1} << 50);  // 1 PiB
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kOutOfMemory) << huge.status().to_string();
  EXPECT_NE(huge.status().message().find("1125899906842624"), std::string::npos) << huge.status().message();
  EXPECT_EQ(alloc.stats().in_use_bytes, before.in_use_bytes);
  EXPECT_TRUE(cuda::device_usable(0)) << "out of memory is not a sticky error";
  auto ok = cuda::CudaBuffer::allocate(0, 4096);
  EXPECT_TRUE(ok.is_ok()) << "device must stay usable after an allocation failure";
}

TEST_F(CudaDeviceTest, PinnedRoundTripThroughDeviceWithEvents) {
  const int64_t n = 1 << 20;
  auto stream = cuda::Stream::create(0);
  ASSERT_TRUE(stream.is_ok());
  auto host = cuda::PinnedBuffer::allocate(n);
  auto back = cuda::PinnedBuffer::allocate(n);
  auto dev = cuda::CudaBuffer::allocate(0, n);
  ASSERT_TRUE(host.is_ok() && back.is_ok() && dev.is_ok());
  auto* h = static_cast<uint8_t*>(host->data());
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<uint8_t>(i * 7 + 3);
  std::memset(back->data(), 0, n);
  auto e0 = cuda::Event::create(0);
  auto e1 = cuda::Event::create(0);
  ASSERT_TRUE(e0.is_ok() && e1.is_ok());
  ASSERT_TRUE(e0->record(*stream).is_ok());
  ASSERT_TRUE(cuda::copy_to_device(dev->data(), host->data(), n, *stream).is_ok());
  ASSERT_TRUE(cuda::copy_to_host(back->data(), dev->data(), n, *stream).is_ok());
  ASSERT_TRUE(e1->record(*stream).is_ok());
  ASSERT_TRUE(e1->synchronize().is_ok());
  EXPECT_EQ(std::memcmp(host->data(), back->data(), n), 0);
  auto ms = cuda::Event::elapsed_ms(*e0, *e1);
  ASSERT_TRUE(ms.is_ok()) << ms.status().to_string();
  EXPECT_GE(*ms, 0.0f);
}

// A HostBuffer for a CUDA device is page-locked: an asynchronous copy from the device lands in it
// (the decode step copies its logits straight into the sequence's buffer so).
TEST_F(CudaDeviceTest, HostBufferForCudaIsPageLocked) {
  const int64_t n = 1 << 20;
  auto host = HostBuffer::alloc(Device{DeviceKind::kCuda, 0}, n, /*zero=*/true);
  ASSERT_TRUE(host.is_ok()) << host.status().to_string();
  EXPECT_TRUE(host->pinned());
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, host->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  const auto* z = static_cast<const uint8_t*>(host->data());
  EXPECT_TRUE(std::all_of(z, z + n, [](uint8_t v) { return v == 0; }));
  std::vector<uint8_t> src(n);
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
  auto stream = cuda::Stream::create(0);
  auto dev = cuda::CudaBuffer::allocate(0, n);
  ASSERT_TRUE(stream.is_ok() && dev.is_ok());
  ASSERT_EQ(cudaMemcpy(dev->data(), src.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(cuda::copy_to_host(host->data(), dev->data(), n, *stream).is_ok());
  ASSERT_TRUE(stream->synchronize().is_ok());
  EXPECT_EQ(std::memcmp(host->data(), src.data(), n), 0);
}

#else  // !DS_HAVE_CUDA

TEST(CudaDeviceTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
