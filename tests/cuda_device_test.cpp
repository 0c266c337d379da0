// CUDA device runtime: caching allocator (reuse, size classes, high-water marks, out-of-memory as a
// Status), owning buffers, streams and events, copies. Skipped without a CUDA build or device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#if DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_device.h"
#include "ops/cuda/pdl.h"
#include "ops/cuda/timeline.h"
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

// Batched copies (device_copy_regions): pieces of every size, scattered in a shuffled order across
// more than both staging buffers, one larger than a buffer, runs adjacent on the device, empty pieces;
// device -> host, host -> device and device -> device against the plain copies; untouched bytes stay;
// and the batch is ordered after work on another (non-blocking) stream.
TEST_F(CudaDeviceTest, BatchedCopiesScatterAndGatherThroughStaging) {
  const Device gpu{DeviceKind::kCuda, 0};
  const int64_t n = (int64_t{90} << 20) + 12345;  // more than two 32 MiB staging buffers
  std::mt19937 rng(7);
  // Cut [0, n) into pieces: mostly small, some adjacent runs, one of 40 MiB, some empty.
  struct Cut {
    int64_t at, bytes;
  };
  std::vector<Cut> cuts;
  for (int64_t at = 0; at < n;) {
    int64_t len = 1 + static_cast<int64_t>(rng() % (3u << 20));
    if (cuts.size() == 5) len = int64_t{40} << 20;
    if (rng() % 7 == 0) cuts.push_back({at, 0});
    len = std::min(len, n - at);
    cuts.push_back({at, len});
    at += len;
  }
  // Host positions: the same pieces in a shuffled order, with a gap of 16 poisoned bytes after each.
  std::vector<size_t> order(cuts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Keep some neighbours in order so runs adjacent on the device are also adjacent in the batch.
  for (size_t i = 0; i + 1 < order.size(); i += 3) std::swap(order[i], order[std::min(order.size() - 1, i + 1 + rng() % 8)]);
  std::vector<int64_t> host_at(cuts.size());
  int64_t h = 0;
  for (size_t i : order) {
    host_at[i] = h;
    h += cuts[i].bytes + 16;
  }
  std::vector<uint8_t> ref(static_cast<size_t>(n));
  for (auto& v : ref) v = static_cast<uint8_t>(rng());
  auto dev = cuda::CudaBuffer::allocate(0, n);
  auto dev2 = cuda::CudaBuffer::allocate(0, n);
  ASSERT_TRUE(dev.is_ok() && dev2.is_ok());
  auto* d = static_cast<uint8_t*>(dev->data());
  auto* d2 = static_cast<uint8_t*>(dev2->data());
  // The device's bytes arrive by a copy on a non-blocking stream the batch does not know of.
  auto stream = cuda::Stream::create(0);
  auto pinned = cuda::PinnedBuffer::allocate(n);
  ASSERT_TRUE(stream.is_ok() && pinned.is_ok());
  std::memcpy(pinned->data(), ref.data(), static_cast<size_t>(n));
  ASSERT_TRUE(cuda::fill_bytes(d, 0, n, *stream).is_ok());
  ASSERT_TRUE(cuda::copy_to_device(d, pinned->data(), n, *stream).is_ok());

  std::vector<uint8_t> host(static_cast<size_t>(h), 0xA5);
  std::vector<CopyRegion> down;
  for (size_t i : order) down.push_back({host.data() + host_at[i], d + cuts[i].at, cuts[i].bytes});
  ASSERT_TRUE(device_copy_regions(Device{}, gpu, down).is_ok());
  for (size_t i = 0; i < cuts.size(); ++i) {
    ASSERT_EQ(std::memcmp(host.data() + host_at[i], ref.data() + cuts[i].at, static_cast<size_t>(cuts[i].bytes)), 0)
        << "piece " << i << " at " << cuts[i].at << " of " << cuts[i].bytes << " bytes";
    for (int g = 0; g < 16; ++g) ASSERT_EQ(host[static_cast<size_t>(host_at[i] + cuts[i].bytes + g)], 0xA5);
  }

  // Back up, changed, into the second buffer; the last piece left out keeps the buffer's bytes.
  for (auto& v : host) v = static_cast<uint8_t>(v ^ 0x5C);
  ASSERT_EQ(cudaMemset(d2, 0x11, static_cast<size_t>(n)), cudaSuccess);
  std::vector<CopyRegion> up;
  for (size_t i : order) {
    if (i + 1 < cuts.size()) up.push_back({d2 + cuts[i].at, host.data() + host_at[i], cuts[i].bytes});
  }
  ASSERT_TRUE(device_copy_regions(gpu, Device{}, up).is_ok());
  std::vector<uint8_t> back(static_cast<size_t>(n));
  ASSERT_EQ(cudaMemcpy(back.data(), d2, static_cast<size_t>(n), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < cuts.size(); ++i) {
    for (int64_t j = 0; j < cuts[i].bytes; j += 997) {
      const uint8_t want = i + 1 < cuts.size() ? static_cast<uint8_t>(ref[static_cast<size_t>(cuts[i].at + j)] ^ 0x5C) : 0x11;
      ASSERT_EQ(back[static_cast<size_t>(cuts[i].at + j)], want) << "piece " << i << " byte " << j;
    }
  }

  // Device to device, in the shuffled order: d2 becomes d again.
  std::vector<CopyRegion> across;
  for (size_t i : order) across.push_back({d2 + cuts[i].at, d + cuts[i].at, cuts[i].bytes});
  ASSERT_TRUE(device_copy_regions(gpu, gpu, across).is_ok());
  ASSERT_EQ(cudaMemcpy(back.data(), d2, static_cast<size_t>(n), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), ref.data(), static_cast<size_t>(n)), 0);
}

// Small allocations often lie back to back in the device's address space, yet one copy may not span
// two of them: a batch over pieces that end and start at adjacent allocations (a KV pool's small slots)
// copies each allocation's pieces on their own.
TEST_F(CudaDeviceTest, BatchedCopiesDoNotSpanAdjacentAllocations) {
  const Device gpu{DeviceKind::kCuda, 0};
  constexpr int kBlocks = 64;
  constexpr int64_t kBytes = 4096;
  std::vector<cuda::CudaBuffer> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    auto b = cuda::CudaBuffer::allocate(0, kBytes);
    ASSERT_TRUE(b.is_ok());
    blocks.push_back(std::move(*b));
  }
  std::sort(blocks.begin(), blocks.end(), [](const cuda::CudaBuffer& a, const cuda::CudaBuffer& b) { return a.data() < b.data(); });
  int adjacent = 0;
  for (int i = 0; i + 1 < kBlocks; ++i) {
    adjacent += static_cast<const uint8_t*>(blocks[i].data()) + kBytes == blocks[i + 1].data();
  }
  std::printf("[batched-copy] %d of %d small allocations end where the next begins\n", adjacent, kBlocks - 1);
  std::vector<uint8_t> host(kBlocks * kBytes), back(kBlocks * kBytes, 0);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 31 + 7);
  std::vector<CopyRegion> up, down;
  for (int i = 0; i < kBlocks; ++i) {
    up.push_back({blocks[i].data(), host.data() + i * kBytes, kBytes});
    down.push_back({back.data() + i * kBytes, blocks[i].data(), kBytes});
  }
  ASSERT_TRUE(device_copy_regions(gpu, Device{}, up).is_ok());
  ASSERT_TRUE(device_copy_regions(Device{}, gpu, down).is_ok());
  EXPECT_EQ(host, back);
  // Device to device: each block onto its neighbour's place in a second set.
  std::vector<cuda::CudaBuffer> others;
  std::vector<CopyRegion> across;
  for (int i = 0; i < kBlocks; ++i) {
    auto b = cuda::CudaBuffer::allocate(0, kBytes);
    ASSERT_TRUE(b.is_ok());
    others.push_back(std::move(*b));
  }
  std::sort(others.begin(), others.end(), [](const cuda::CudaBuffer& a, const cuda::CudaBuffer& b) { return a.data() < b.data(); });
  for (int i = 0; i < kBlocks; ++i) across.push_back({others[i].data(), blocks[i].data(), kBytes});
  ASSERT_TRUE(device_copy_regions(gpu, gpu, across).is_ok());
  std::fill(back.begin(), back.end(), 0);
  for (int i = 0; i < kBlocks; ++i) down[i].src = others[i].data();
  ASSERT_TRUE(device_copy_regions(Device{}, gpu, down).is_ok());
  EXPECT_EQ(host, back);
}

// The timeline's summary (no device needed): steps of three launches with known times.
TEST(CudaTimeline, SummaryMediansSpansWaitsAndLags) {
  cuda::Timeline t;
  t.step = {{"norm", 1, 256}, {"matvec_q8<Q4_K, 1>", 528, 128}, {"norm", 1, 256}};
  // Step s starts at 10000 s ns; launch i: resident at +1000 i + 100, released at +1000 i + 400 (the
  // middle launch of step 1 an outlier the medians ignore).
  for (uint64_t s = 0; s < 5; ++s) {
    for (uint64_t i = 0; i < 3; ++i) {
      const uint64_t base = 10000 * s + 1000 * i;
      const uint64_t late = s == 1 && i == 1 ? 5000 : 0;
      cuda::TimelineRecord r;
      r.entry_ns = base + 100;
      r.release_ns = base + 400 + late;
      if (i == 2) r.mark_ns[1] = r.release_ns + 250 * (s + 1);  // the last launch marks point 1
      t.records.push_back(r);
    }
  }
  auto sum = cuda::timeline_summarize(t);
  ASSERT_TRUE(sum.is_ok()) << sum.status().to_string();
  EXPECT_EQ(sum->steps, 5);
  EXPECT_DOUBLE_EQ(sum->step_us, 10.0);
  ASSERT_EQ(sum->positions.size(), 3u);
  EXPECT_DOUBLE_EQ(sum->positions[0].span_us, 1.0);
  EXPECT_DOUBLE_EQ(sum->positions[1].span_us, 1.0);
  EXPECT_DOUBLE_EQ(sum->positions[2].span_us, 8.0);  // to the next step's first release
  EXPECT_DOUBLE_EQ(sum->positions[1].wait_us, 0.3);
  EXPECT_DOUBLE_EQ(sum->positions[1].lag_us, 0.7);   // previous release (+400) to resident (+1100)
  EXPECT_DOUBLE_EQ(sum->positions[0].lag_us, 0.0);   // the first has no previous launch
  EXPECT_DOUBLE_EQ(sum->positions[2].mark_us[1], 0.75);  // the median of 0.25, 0.5, ..., 1.25 us
  EXPECT_DOUBLE_EQ(sum->positions[2].mark_us[0], -1.0);  // never reached
  EXPECT_DOUBLE_EQ(sum->positions[0].mark_us[1], -1.0);
  ASSERT_EQ(sum->by_kernel.size(), 2u);
  EXPECT_EQ(sum->by_kernel[0].name, "norm");  // 1 + 8 us
  EXPECT_EQ(sum->by_kernel[0].launches, 2);
  EXPECT_DOUBLE_EQ(sum->by_kernel[0].span_us, 9.0);
  EXPECT_EQ(sum->by_kernel[1].ctas, 528);

  cuda::Timeline odd = t;
  odd.records.pop_back();  // a launch that recorded nothing
  EXPECT_FALSE(cuda::timeline_summarize(odd).is_ok());
  cuda::Timeline one = t;
  one.records.resize(3);
  EXPECT_FALSE(cuda::timeline_summarize(one).is_ok());
  EXPECT_FALSE(cuda::timeline_summarize(cuda::Timeline{}).is_ok());
}

TEST(CudaTimeline, KernelNamesAreShortened) {
  EXPECT_EQ(cuda::timeline_kernel_name("_ZN2ds4cuda4kern11quantize_q8ENS1_14QuantizeQ8ArgsE"), "quantize_q8");
  EXPECT_EQ(cuda::timeline_kernel_name("not_mangled"), "not_mangled");
  EXPECT_EQ(cuda::timeline_kernel_name(""), "?");
  EXPECT_EQ(cuda::timeline_kernel_name(nullptr), "?");
}

#else  // !DS_HAVE_CUDA

TEST(CudaDeviceTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
