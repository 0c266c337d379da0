// Workbench: what a kernel boundary costs inside a decode graph when the two kernels want different
// shared-memory carveouts. A decode step alternates matrix-vector products (CTAs of 128 threads with up
// to 48 KB of static shared memory, several per SM) with kernels that take most of an SM's shared
// memory (the attention decode kernel: about 143 KB at head_dim 256, one CTA per SM). An SM runs one
// L1 / shared split at a time, so a CTA that needs more shared memory than the running split holds can
// only start once the SM has drained, and under programmatic dependent launch its early residency is lost.
// The bench captures 40 pairs (product-like kernel, big kernel) in a graph with PDL, both reading fresh
// DRAM, and times a pair for a range of the big kernel's dynamic shared memory, with and without the
// products asking for the largest carveout; "P only" / "B only" are 80 launches of one kind.
// Finding (H100, docs/perf-gpu.md): the split costs nothing measurable. A pair takes 9.4 us with the big
// kernel at 16 KB and 9.5 us at 143 KB (9.7 at 200 KB), the same with the products at the largest
// carveout; a product-like launch streaming 8.7 MB takes 3.1 us, 2.8 of them bytes.
// Build: nvcc -std=c++17 -O3 -arch=sm_90 kernels/carveout_bench.cu -o build-gpu/carveout_bench
//   (scripts/gpu-check builds it with the others; it uses nothing of the library)
// Run:   build-gpu/carveout_bench
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

__device__ __forceinline__ void pdl_sync() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

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
  pdl_sync();
  stream(src + static_cast<size_t>(blockIdx.x) * n4, n4, buf, kProdSmem / 16, out);
}

__global__ void __launch_bounds__(kThreads, 1) big_kernel(const float4* src, int n4, int smem4, float* out) {
  extern __shared__ float4 dyn[];
  pdl_sync();
  stream(src + static_cast<size_t>(blockIdx.x) * n4, n4, dyn, smem4, out);
}

void launch(const void* fn, dim3 grid, size_t smem, cudaStream_t s, void** args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelExC(&cfg, fn, args));
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
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  // kinds: 0 = pairs (P, B), 1 = P only, 2 = B only
  auto time_graph = [&](int kind, int big_smem) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < kPairs; ++i) {
      const float4* base = src + per_pair * i;
      const float4* pb = base + static_cast<size_t>(prod_ctas) * prod_n4;
      int n4p = prod_n4, n4b = big_n4, s4 = big_smem / 16;
      void* pa[] = {&base, &n4p, &out};
      void* ba[] = {&pb, &n4b, &s4, &out};
      for (int h = 0; h < 2; ++h) {
        const bool prod = kind == 1 || (kind == 0 && h == 0);
        if (prod) {
          launch(reinterpret_cast<const void*>(prod_kernel), dim3(prod_ctas), 0, s, pa);
        } else {
          launch(reinterpret_cast<const void*>(big_kernel), dim3(big_ctas), big_smem, s, ba);
        }
      }
    }
    cudaGraph_t g;
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    float best = 1e30f;
    for (int r = 0; r < kReps; ++r) {
      CK(cudaEventRecord(e0, s));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms = 0.0f;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      best = ms < best ? ms : best;
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return best * 1000.0f / kPairs;  // us per pair of launches
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
