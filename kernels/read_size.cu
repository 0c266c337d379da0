// Workbench: how much of the streaming read bandwidth one kernel can reach when it reads a buffer of a
// decode product's size (0.1 to 100 MB) instead of gigabytes, and whether reading it row by row (a
// warp per weight row, as the matrix-vector kernels do) costs anything over a flat stream. It answers
// whether 80% of the bandwidth is reachable per product at all, or only by fusing products.
// Build:  nvcc -std=c++17 -O3 -arch=sm_90 kernels/read_size.cu -o build-gpu/read_size
// Run:    build-gpu/read_size
// Versions (pure reads, XOR-reduced so the loads stay, nothing written back):
//   flat:     grid of 4 x 512-thread CTAs per SM, grid-stride over the buffer, 4 independent 16-byte loads
//             in flight per thread (the measurement in ops/cuda/membw.cu);
//   flat-all: one CTA of 128 threads per 8 KB, no grid stride (every CTA launched at once);
//   rows:     a warp per row of 2880 bytes (a 5120-element Q4_K row), 4 warps per CTA, every load of the
//             row issued before any is used.
// Each version is timed with CUDA events as the median of 20 launches after 3 warm-ups, rotating over
// copies of the buffer that together exceed 4 x the L2, so every launch reads device memory; the
// "of 4 GiB" column is against flat on a 4 GiB buffer in the same run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>
#include "workbench.cuh"


// Each 128-thread CTA reads 8 KB: 4 loads of 16 bytes per thread, all in flight together.
__global__ void flat_all_kernel(const uint4* __restrict__ p, int64_t n, unsigned* sink) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * 512 + threadIdx.x;
  uint4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t i = base + 128 * k;
    v[k] = i < n ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
  }
  uint32_t acc = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);
}

constexpr int kRowBytes = 2880;              // 20 Q4_K blocks of 144 bytes
constexpr int kRowVecs = kRowBytes / 16;     // 180 16-byte pieces
constexpr int kRowLoads = (kRowVecs + 31) / 32;  // 6 per lane

__global__ void rows_kernel(const uint4* __restrict__ p, int64_t n_rows, unsigned* sink) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  const uint4* r = p + row * kRowVecs;
  uint4 v[kRowLoads];
#pragma unroll
  for (int k = 0; k < kRowLoads; ++k) {
    const int i = lane + 32 * k;
    v[k] = i < kRowVecs ? __ldg(r + i) : make_uint4(0, 0, 0, 0);
  }
  uint32_t acc = 0;
#pragma unroll
  for (int k = 0; k < kRowLoads; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);
}

enum class Version { kFlat, kFlatAll, kRows };

void launch(Version v, const uint4* p, int64_t bytes, unsigned* sink, int sms) {
  const int64_t n = bytes / 16;
  switch (v) {
    case Version::kFlat: flat_read<<<sms * 4, 512>>>(p, n, sink); break;
    case Version::kFlatAll: flat_all_kernel<<<static_cast<unsigned>((n + 511) / 512), 128>>>(p, n, sink); break;
    case Version::kRows: {
      const int64_t rows = bytes / kRowBytes;
      rows_kernel<<<static_cast<unsigned>((rows + 3) / 4), 128>>>(p, rows, sink);
      break;
    }
  }
}

// Median ms of 20 launches over rotating copies (>= 4 x L2 in all).
double time_ms(Version v, const std::vector<uint8_t*>& bufs, int64_t bytes, unsigned* sink, int sms) {
  return median_event_ms(
      nullptr, 20,
      [&](int i) {
        launch(v, reinterpret_cast<const uint4*>(bufs[static_cast<size_t>(i) % bufs.size()]), bytes, sink, sms);
      },
      3);
}

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&sink, sizeof(unsigned)));
  // Reference: flat over 4 GiB.
  const int64_t big = int64_t{4} << 30;
  uint8_t* bigbuf = nullptr;
  CK(cudaMalloc(&bigbuf, big));
  CK(cudaMemset(bigbuf, 0x5A, big));
  const double ref_gbs = big / (time_ms(Version::kFlat, {bigbuf}, big, sink, sms) * 1e-3) / 1e9;
  CK(cudaFree(bigbuf));
  std::printf("%s, %d SMs, L2 %d MB; flat read of 4 GiB: %.0f GB/s\n", prop.name, sms, prop.l2CacheSize >> 20, ref_gbs);
  std::printf("%-10s %10s %10s %10s %8s\n", "version", "MB", "us", "GB/s", "of 4 GiB");
  const char* names[] = {"flat", "flat-all", "rows"};
  for (const double mb : {0.15, 3.0, 17.7, 29.5, 50.1, 100.3, 400.0}) {
    const int64_t bytes = static_cast<int64_t>(mb * 1e6) / kRowBytes * kRowBytes;
    const int copies = static_cast<int>(std::max<int64_t>(2, (4 * static_cast<int64_t>(prop.l2CacheSize)) / bytes + 1));
    std::vector<uint8_t*> bufs(static_cast<size_t>(std::min(copies, 1000)));
    for (auto& p : bufs) {
      CK(cudaMalloc(&p, bytes));
      CK(cudaMemset(p, 0x5A, bytes));
    }
    for (Version v : {Version::kFlat, Version::kFlatAll, Version::kRows}) {
      const double ms = time_ms(v, bufs, bytes, sink, sms);
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf("%-10s %10.2f %10.2f %10.0f %7.1f%%\n", names[static_cast<int>(v)], bytes / 1e6, ms * 1e3, gbs,
                  100 * gbs / ref_gbs);
    }
    for (auto p : bufs) CK(cudaFree(p));
  }
  return 0;
}
