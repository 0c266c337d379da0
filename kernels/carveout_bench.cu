// Workbench: what a kernel boundary costs inside a decode graph when the two kernels want different
// shared-memory carveouts. A decode step alternates matrix-vector products (CTAs of 128 threads with up
// to 48 KB of static shared memory, several per SM) with kernels that take most of an SM's shared
// memory (the attention decode kernel: about 143 KB at head_dim 256, one CTA per SM). An SM runs one
// L1 / shared split at a time, so a CTA that needs more shared memory than the running split holds can
// only start once the SM has drained, and under programmatic dependent launch its early residency is lost.
// The bench captures 40 pairs (product-like kernel, big kernel) in a graph with PDL, both reading fresh
// DRAM, and times a pair (median replay) for a range of the big kernel's dynamic shared memory, with and
// without the products asking for the largest carveout; "P only" / "B only" are 80 launches of one kind.
// Finding (H100, docs/perf-gpu.md): the split costs little. Median of 20 replays: a pair takes 9.48 us
// with the big kernel at 16 KB, 9.99 at 143 KB and 9.82 at 200 KB (9.44 / 9.58 / 9.77 with the products
// at the largest carveout); the best of 20 had shown 9.4 / 9.5 / 9.7. A product-like launch streaming
// 8.7 MB takes 3.1 us, 2.8 of them bytes.
// Build (after the CMake build in build-gpu; scripts/gpu-check builds it so):
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Isrc -I.deps/include -DFMT_HEADER_ONLY=1 \
//     kernels/carveout_bench.cu build-gpu/libdeltaserve_lib.a build-gpu/libdeltaserve_cuda.a -lcublas \
//     -o build-gpu/carveout_bench
// Run:   build-gpu/carveout_bench
#include <cuda_runtime.h>

#include <cstdio>

#include "ops/cuda/launch.cuh"
#include "workbench.cuh"

namespace {

using ds::cuda::launch_kernel;
using ds::cuda::kern::dependency_sync;

constexpr int kThreads = 128;
constexpr int kProdSmem = 27 * 1024;  // a one-token Q4_K product's rings (3 stages, 4 warps of 4 rows)

// Reads n4 float4 of its CTA's share through shared memory (smem4 float4 of it) and sums them.
__device__ __forceinline__ void stream(const float4* src, int n4, float4* buf, int smem4, float* out) {
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n4; i += kThreads) {
    const float4 v = __ldcg(src + i);
    buf[i % smem4] = v;
    acc += v.x + v.y + v.z + v.w;
  }
  __syncthreads();
  acc += buf[(threadIdx.x * 7) % smem4].y;
  if (acc == 1234.5f) out[blockIdx.x] = acc;  // never: keeps the loads
}

__global__ void __launch_bounds__(kThreads) prod_kernel(const float4* src, int n4, float* out) {
  __shared__ float4 buf[kProdSmem / 16];
  dependency_sync();
  stream(src + static_cast<size_t>(blockIdx.x) * n4, n4, buf, kProdSmem / 16, out);
}

__global__ void __launch_bounds__(kThreads, 1) big_kernel(const float4* src, int n4, int smem4, float* out) {
  extern __shared__ float4 dyn[];
  dependency_sync();
  stream(src + static_cast<size_t>(blockIdx.x) * n4, n4, dyn, smem4, out);
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int prod_ctas = 4 * sms, big_ctas = 64;
  const int prod_n4 = 16 * 1024 / 16, big_n4 = 64 * 1024 / 16;  // 16 KB and 64 KB per CTA
  const size_t per_pair = static_cast<size_t>(prod_ctas) * prod_n4 + static_cast<size_t>(big_ctas) * big_n4;
  constexpr int kPairs = 40, kReps = 20;
  float4* src = nullptr;
  float* out = nullptr;
  CK(cudaMalloc(&src, per_pair * kPairs * 16));
  CK(cudaMemset(src, 0, per_pair * kPairs * 16));
  CK(cudaMalloc(&out, 4096 * 4));
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(big_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                          220 * 1024));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // kinds: 0 = pairs (P, B), 1 = P only, 2 = B only; the median replay, in us per pair of launches.
  auto time_graph = [&](int kind, int big_smem) {
    const float ms = graph_median_ms(s, [&] {
      for (int i = 0; i < kPairs; ++i) {
        const float4* base = src + per_pair * i;
        const float4* pb = base + static_cast<size_t>(prod_ctas) * prod_n4;
        for (int h = 0; h < 2; ++h) {
          if (kind == 1 || (kind == 0 && h == 0)) {
            CK(launch_kernel(prod_kernel, dim3(prod_ctas), dim3(kThreads), 0, s, base, prod_n4, out));
          } else {
            CK(launch_kernel(big_kernel, dim3(big_ctas), dim3(kThreads), big_smem, s, pb, big_n4, big_smem / 16, out));
          }
        }
      }
    }, kReps);
    return ms * 1000.0f / kPairs;
  };

  const int smems[] = {16 * 1024, 48 * 1024, 80 * 1024, 100 * 1024, 120 * 1024, 143 * 1024, 200 * 1024};
  for (int carve : {-1, 100}) {
    CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(prod_kernel), cudaFuncAttributePreferredSharedMemoryCarveout,
                            carve));
    std::printf("products' preferred carveout %d\n", carve);
    std::printf("  P only (2 launches)          %7.2f us\n", time_graph(1, 0));
    for (int sm : smems) {
      std::printf("  P + B, B smem %3d KB: %7.2f us   B only %7.2f us\n", sm / 1024, time_graph(0, sm),
                  time_graph(2, sm));
    }
  }
  return 0;
}
