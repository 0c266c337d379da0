// Workbench: what one kernel boundary of a decode graph costs when nothing else does. A decode step is a
// chain of dependent kernels (about 8 a layer on the 35B-A3B); this bench captures chains of 256
// launches of a kernel that does almost nothing, in a CUDA graph, and times a link (median of 20
// replays / 256) for:
//   - grid sizes from 1 CTA to 8 a SM (the chain's kernels range from 32 CTAs, the DeltaNet step, to
//     576, the MoE gate/up products), 128 threads each;
//   - with programmatic dependent launch (the production launch: the next kernel resident and waiting
//     in griddepcontrol.wait) and without it (plain stream order);
//   - with and without a dependent read: after its wait, thread 0 of each CTA reads one word the
//     previous kernel wrote and writes one word (one L2 round trip on the critical path, the least a
//     kernel that consumes its predecessor's output does).
// Stand-alone (its own launch code, the PDL attribute as in ops/cuda/launch.cuh). Build and run:
//   nvcc -std=c++17 -O3 -arch=sm_90 kernels/boundary_bench.cu -o build-gpu/boundary_bench && build-gpu/boundary_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "workbench.cuh"

namespace {

constexpr int kLinks = 256;
constexpr int kThreads = 128;
constexpr int kWords = 8192;  // per buffer: one word a CTA

__global__ void link_kernel(const unsigned* prev, unsigned* next, int read) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (threadIdx.x == 0) {
    const unsigned v = read ? __ldcg(prev + blockIdx.x % kWords) : 0u;
    next[blockIdx.x % kWords] = v + 1u;
  }
}

void launch(int ctas, bool pdl, const unsigned* prev, unsigned* next, int read, cudaStream_t s) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, link_kernel, prev, next, read));
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("boundary_bench: %s, %d SMs; a link = one launch of a chain of %d in a graph (median of 20 replays)\n",
              prop.name, sms, kLinks);
  unsigned *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, sizeof(unsigned) * kWords));
  CK(cudaMalloc(&b, sizeof(unsigned) * kWords));
  CK(cudaMemset(a, 0, sizeof(unsigned) * kWords));
  CK(cudaMemset(b, 0, sizeof(unsigned) * kWords));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("%-6s %-5s %-5s %10s\n", "CTAs", "PDL", "read", "us a link");
  for (int ctas : {1, 32, sms / 2, sms, 2 * sms, 4 * sms, 8 * sms}) {
    for (int pdl = 1; pdl >= 0; --pdl) {
      for (int read = 0; read <= 1; ++read) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        for (int i = 0; i < kLinks; ++i) {
          launch(ctas, pdl != 0, i % 2 ? b : a, i % 2 ? a : b, read, s);
        }
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = median_event_ms(s, 20, [&](int) { CK(cudaGraphLaunch(ge, s)); }, 3);
        std::printf("%-6d %-5s %-5s %10.3f\n", ctas, pdl ? "yes" : "no", read ? "yes" : "no", 1e3f * ms / kLinks);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
    }
  }
  CK(cudaStreamDestroy(s));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 0;
}
