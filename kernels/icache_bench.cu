// Workbench: what a small kernel's code size costs in a decode graph. A decode step runs each of its
// small kernels (norms, router, attention, DeltaNet step) once a layer, about once per CTA, so their
// instructions come from a cold instruction cache while the products beside them stream weights; some
// of those kernels are 30-100 KB of straight-line code (fully unrolled loops). This bench times chains
// in a CUDA graph with programmatic dependent launch, the same dynamic work in two code shapes:
//   - code<N, straight>: one CTA of 256 threads runs N instructions of straight-line code (8 independent
//     funnel-shift chains, N * 16 bytes of code);
//   - code<N, loop>: the same N instructions as a loop of 64 (1 KB of code), so the two differ only in
//     the code fetched.
// Each link is [evict, stream, code]: `evict` runs 64 KB of straight-line code on every SM (the other
// kernels of a layer, which push the small kernel's code out of the SMs' caches), `stream` reads 16 MB
// of "weights" on 4 CTAs an SM with its first loads issued before its dependency wait (as the products
// issue their first copies while the kernel before them runs), then `code`. The straight-minus-loop
// time of a link at each N is what fetching N * 16 bytes of cold code costs on the chain's critical
// path; rows without `stream` give the same on an idle memory system.
// Stand-alone (its own launch code, the PDL attribute as in ops/cuda/launch.cuh). Build and run:
//   nvcc -std=c++17 -O3 -arch=sm_90 kernels/icache_bench.cu -o build-gpu/icache_bench && build-gpu/icache_bench
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "workbench.cuh"

namespace {

constexpr int kLinks = 64;
constexpr int kCodeThreads = 256;
constexpr int kEvictN = 4096;              // instructions of the evicting kernel (64 KB)
constexpr int64_t kStreamBytes = 16 << 20;  // one stream launch's reads
constexpr int kStreamThreads = 128;

__device__ __forceinline__ void pdl_wait_and_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// N funnel shifts over 8 registers, chain i % 8 (independent chains, one instruction each).
template <int N>
__device__ __forceinline__ void shifts(unsigned (&a)[8]) {
#pragma unroll
  for (int i = 0; i < N; ++i) a[i & 7] = __funnelshift_l(a[i & 7], a[(i + 3) & 7], (i * 7 + 1) & 31);
}

template <int N, bool kStraight>
__global__ void __launch_bounds__(kCodeThreads) code_kernel(const unsigned* in, unsigned* out) {
  pdl_wait_and_release();
  unsigned a[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] = in[(threadIdx.x + k) % 64] + k;
  if constexpr (kStraight) {
    shifts<N>(a);
  } else {
#pragma unroll 1
    for (int r = 0; r < N / 64; ++r) shifts<64>(a);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

__global__ void __launch_bounds__(kCodeThreads) evict_kernel(const unsigned* in, unsigned* out) {
  pdl_wait_and_release();
  unsigned a[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) a[k] = in[(threadIdx.x + k) % 64] ^ k;
  shifts<kEvictN>(a);
  if (threadIdx.x < 32) out[blockIdx.x * 32 + threadIdx.x] = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

// Reads its CTA's share of w once (16-byte loads, 4 in flight a thread), the first 4 before its wait.
__global__ void __launch_bounds__(kStreamThreads) stream_kernel(const uint4* w, int64_t n, unsigned* out) {
  const int64_t per = n / gridDim.x;
  const uint4* p = w + blockIdx.x * per;
  uint4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = __ldcs(p + threadIdx.x + k * kStreamThreads);
  pdl_wait_and_release();
  unsigned acc = 0;
  for (int64_t i = 4 * kStreamThreads + threadIdx.x; i < per; i += 4 * kStreamThreads) {
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = i + k * kStreamThreads < per ? __ldcs(p + i + k * kStreamThreads) : v[k];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  if (acc == 0x9E3779B9u) out[0] = acc;
}

template <typename K, typename... Args>
void launch(K kernel, int ctas, int threads, cudaStream_t s, Args... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

struct Bufs {
  unsigned* in;
  unsigned* out;
  uint4* w;
  int sms;
};

// us a link of kLinks links [evict?, stream?, code?] in one graph (median of 20 replays).
template <typename Code>
float link_us(const Bufs& b, cudaStream_t s, bool evict, bool stream, Code code) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  const int64_t n16 = kStreamBytes / 16;
  for (int i = 0; i < kLinks; ++i) {
    if (evict) launch(evict_kernel, b.sms, kCodeThreads, s, static_cast<const unsigned*>(b.in), b.out);
    if (stream) {
      // Rotate over 4 buffers so the reads come from device memory, not L2.
      launch(stream_kernel, 4 * b.sms, kStreamThreads, s, static_cast<const uint4*>(b.w + (i % 4) * n16), n16, b.out);
    }
    code(s);
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const float ms = median_event_ms(s, 20, [&](int) { CK(cudaGraphLaunch(ge, s)); }, 3);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return 1e3f * ms / kLinks;
}

template <int N>
void row(const Bufs& b, cudaStream_t s) {
  auto straight = [&](cudaStream_t st) {
    launch(code_kernel<N, true>, 1, kCodeThreads, st, static_cast<const unsigned*>(b.in), b.out + 4096);
  };
  auto loop = [&](cudaStream_t st) {
    launch(code_kernel<N, false>, 1, kCodeThreads, st, static_cast<const unsigned*>(b.in), b.out + 4096);
  };
  for (int stream = 0; stream <= 1; ++stream) {
    const float ls = link_us(b, s, true, stream != 0, straight);
    const float ll = link_us(b, s, true, stream != 0, loop);
    const float ws = link_us(b, s, false, stream != 0, straight);
    const float wl = link_us(b, s, false, stream != 0, loop);
    std::printf("%6d %6d KB  %-6s %10.3f %10.3f %10.3f   %10.3f %10.3f %10.3f\n", N, N * 16 / 1024,
                stream ? "yes" : "no", ls, ll, ls - ll, ws, wl, ws - wl);
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  Bufs b{};
  b.sms = prop.multiProcessorCount;
  CK(cudaMalloc(&b.in, 64 * sizeof(unsigned)));
  CK(cudaMemset(b.in, 1, 64 * sizeof(unsigned)));
  CK(cudaMalloc(&b.out, (4096 + kCodeThreads * 8) * sizeof(unsigned) + b.sms * 32 * sizeof(unsigned)));
  CK(cudaMalloc(&b.w, 4 * kStreamBytes));
  CK(cudaMemset(b.w, 3, 4 * kStreamBytes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("icache_bench: %s, %d SMs; us a link of a chain of %d in a graph (median of 20 replays)\n", prop.name,
              b.sms, kLinks);
  std::printf("a link: [evict (64 KB of code on every SM)?, stream (16 MB read, 4 CTAs an SM)?, code (1 CTA, N instructions)]\n");
  std::printf("%6s %9s  %-6s %10s %10s %10s   %10s %10s %10s\n", "N", "code", "stream", "ev+strt", "ev+loop",
              "cold cost", "strt", "loop", "diff");
  row<64>(b, s);
  row<512>(b, s);
  row<1024>(b, s);
  row<2048>(b, s);
  row<4096>(b, s);
  // The chain parts alone, to read the rows against.
  const float e = link_us(b, s, true, false, [](cudaStream_t) {});
  const float st = link_us(b, s, false, true, [](cudaStream_t) {});
  const float es = link_us(b, s, true, true, [](cudaStream_t) {});
  std::printf("without code: evict %.3f, stream %.3f, evict + stream %.3f us a link\n", e, st, es);
  CK(cudaStreamDestroy(s));
  CK(cudaFree(b.in));
  CK(cudaFree(b.out));
  CK(cudaFree(b.w));
  return 0;
}
