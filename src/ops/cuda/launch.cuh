// Kernel launch with programmatic dependent launch (PDL, sm_90+), and the two device-side calls every
// kernel launched this way makes. With PDL the next kernel of a stream is launched while the previous
// one drains: its CTAs become resident, issue whatever does not depend on earlier kernels (weight loads
// of a matrix-vector product) and then block in dependency_wait() until the previous kernel has
// completed and its writes are visible. A decode step is about a thousand dependent kernels, each with
// microseconds of launch, ramp-up and drain; PDL overlaps those with the neighbours' work.
// Rules for a kernel launched through launch_kernel (all of ops/cuda's kernels):
//  - call dependency_wait() before the first read of another kernel's output and before the first
//    global write (an earlier kernel may still read what this one overwrites);
//  - call allow_dependents() only after dependency_wait(): then every kernel before the previous one has
//    completed when a kernel starts, and at most two kernels of a stream are resident at once;
//  - the wait is reached by at least one thread of the grid (early exits of idle warps are fine), so a
//    kernel never completes before its predecessor: completion stays ordered along the stream.
// Both calls are no-ops below sm_90, and when the launch carried no programmatic dependency (cuBLAS,
// memset and copy nodes in between keep full ordering).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "ops/cuda/pdl.h"

namespace ds::cuda {
namespace kern {

#if DS_TIMELINE
// The timeline's device buffer (timeline.h), null unless one runs: [count, capacity, then records of
// kTimelineRecordWords u64 (pdl.h)]. Only in a build configured with DELTASERVE_TIMELINE=ON (its
// records change the kernels' code). Each CUDA source has its own copy (no relocatable device code);
// the binder registered below points it.
static __device__ unsigned long long* g_timeline = nullptr;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// CTA 0's record of the running launch, kept by its thread 0 (null when no timeline runs).
__device__ __forceinline__ unsigned long long*& timeline_record_ptr() {
  __shared__ unsigned long long* record;
  return record;
}

// The thread that records a launch: thread 0 of CTA 0.
__device__ __forceinline__ bool timeline_thread() {
  return (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0;
}
#endif

__device__ __forceinline__ void dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if DS_TIMELINE
  // Thread 0 of CTA 0 takes its launch's record before the wait (the atomic's round trip overlaps it)
  // and after it stores the two times, fire and forget.
  const bool first = timeline_thread();
  unsigned long long* tl = first ? *static_cast<unsigned long long* volatile*>(&g_timeline) : nullptr;
  unsigned long long entry_ns = 0, slot = 0, capacity = 0;
  if (tl != nullptr) {
    entry_ns = global_ns();
    slot = atomicAdd(tl, 1ull);
    capacity = tl[1];
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (first) {
    unsigned long long* rec = tl != nullptr && slot < capacity ? tl + 2 + kTimelineRecordWords * slot : nullptr;
    timeline_record_ptr() = rec;
    if (rec != nullptr) {
      rec[0] = entry_ns;
      rec[1] = global_ns();
    }
  }
#else
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#endif
}

// A point inside a kernel, for the timeline (a timeline build only; nothing otherwise): thread 0 of CTA
// 0 stores the time it reaches mark i (< 4) in its launch's record, after its dependency_wait. The
// summary gives each mark's median time after the release.
__device__ __forceinline__ void timeline_mark(int i) {
#if DS_TIMELINE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (timeline_thread()) {
    unsigned long long* rec = timeline_record_ptr();
    if (rec != nullptr) rec[2 + i] = global_ns();
  }
#else
  (void)i;
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, at the top of a kernel with nothing to do before its inputs are ready.
__device__ __forceinline__ void dependency_sync() {
  dependency_wait();
  allow_dependents();
}

// The barrier of a thread-block cluster (launch_kernel_cluster, sm_90+), split in its two halves: every
// thread of every CTA of the cluster calls cluster_arrive() once (convergent per warp), and each thread's
// cluster_wait() returns when all have arrived; memory accesses before an arrive are visible after the
// wait. A CTA that has arrived waits before it exits. No-ops below sm_90, where no cluster is launched.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

}  // namespace kern

// Launches a kernel chosen at run time, its arguments packed as for cudaLaunchKernel, with the
// programmatic-serialization attribute when pdl_enabled() and, for a cluster other than 1 x 1 x 1, the
// cluster dimension (callers check cluster_launch_enabled() first); returns the launch's error. A kernel
// the diagnostic filter drops (set_kernel_filter) is not launched.
inline cudaError_t launch_kernel_packed(const void* kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                        cudaStream_t s, dim3 cluster = dim3(1, 1, 1)) {
  if (kernel_filtered(kernel)) return cudaSuccess;  // diagnostic only (pdl.h)
#if DS_TIMELINE
  if (timeline_logging()) timeline_log_launch(kernel, int64_t{grid.x} * grid.y * grid.z, int64_t{block.x} * block.y * block.z);
#endif
  cudaLaunchAttribute attr[2];
  unsigned n_attr = 0;
  if (pdl_enabled()) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
    ++n_attr;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = cluster.x;
    attr[n_attr].val.clusterDim.y = cluster.y;
    attr[n_attr].val.clusterDim.z = cluster.z;
    ++n_attr;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = n_attr;
  return cudaLaunchKernelExC(&cfg, kernel, args);
}

// kernel<<<grid, block, smem, s>>>(args...) through launch_kernel_packed (arguments converted to the
// kernel's parameter types first, as a triple-chevron launch does), in thread-block clusters of
// `cluster` CTAs (each grid dimension a multiple of the cluster's; only where cluster_launch_enabled()).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_cluster(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block, size_t smem,
                                  cudaStream_t s, Args&&... args) {
  static_assert(sizeof...(Params) > 0 && sizeof...(Params) == sizeof...(Args), "one argument per parameter");
  return [&](Params... coerced) {
    void* packed[] = {static_cast<void*>(&coerced)...};
    return launch_kernel_packed(reinterpret_cast<const void*>(kernel), grid, block, packed, smem, s, cluster);
  }(std::forward<Args>(args)...);
}

// launch_kernel_cluster without clusters: the launch every ops/cuda kernel takes.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                          Args&&... args) {
  return launch_kernel_cluster(kernel, grid, dim3(1, 1, 1), block, smem, s, std::forward<Args>(args)...);
}

#if DS_TIMELINE
// This source's timeline binder (timeline.h): points its copy of kern::g_timeline at `buffer`.
namespace timeline_detail {
[[maybe_unused]] static int bind_this_source(void* buffer) {
  return static_cast<int>(cudaMemcpyToSymbol(kern::g_timeline, &buffer, sizeof(buffer)));
}
[[maybe_unused]] static const bool registered = timeline_register_binder(&bind_this_source);
}  // namespace timeline_detail
#endif

}  // namespace ds::cuda
