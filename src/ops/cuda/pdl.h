// Launch policy of the CUDA kernels launched through launch_kernel (ops/cuda/launch.cuh): programmatic
// dependent launch, the shared memory a CTA may opt into, and the kernel filter of the in-graph
// attribution diagnostic. A plain header, so the CUDA sources, the device runtime and the stand-alone
// workbenches can all see it.
#pragma once

#include <string>

namespace ds::cuda {

// True on devices of compute capability 9.0 or later (the calling thread's current device) running
// device code compiled for compute_90 or later (device_code_ptx_version), unless the environment sets
// DELTASERVE_PDL=0 (to measure without it, or to rule it out). Kernels compiled for an older target have
// no dependency wait (launch.cuh), so a later GPU running them (the driver compiling a build's
// compute_80 PTX) must launch them in plain stream order.
bool pdl_enabled();
// True on devices of compute capability 9.0 or later running device code compiled for compute_90 or
// later: thread-block clusters (launch_kernel_cluster) are available, and the kernels' cluster barriers
// are compiled in (launch.cuh). Independent of DELTASERVE_PDL.
bool cluster_launch_enabled();
// The PTX version the device code of this build takes on the current device (cudaFuncAttributes::
// ptxVersion of one of its kernels: 90 for sm_90 code, 80 where the driver compiled compute_80 PTX);
// 0 when it cannot be queried.
int device_code_ptx_version();

// The shared memory of the calling thread's current device, in bytes, queried once per device (every
// one-token product launch sizes its occupancy pad from it); zeros when the device cannot be queried.
struct DeviceSmem {
  long long per_sm = 0;            // cudaDevAttrMaxSharedMemoryPerMultiprocessor
  long long reserved_per_cta = 0;  // cudaDevAttrReservedSharedMemoryPerBlock
  long long optin_per_cta = 0;     // cudaDevAttrMaxSharedMemoryPerBlockOptin
};
DeviceSmem current_device_smem();
// The most dynamic shared memory one CTA may opt into on the current device (optin_per_cta: 227 KB on
// sm_90, 163 KB on sm_80, 99 KB on sm_86 / sm_89, the consumer cards), at most the cap of
// set_smem_optin_cap; 0 when the device cannot be queried. Kernels whose staging is larger (tensor-core
// attention at head_dim 256, the chunked DeltaNet) yield to a path that fits.
long long smem_optin_limit();
// Caps smem_optin_limit on every device (0: no cap), so tests on a large GPU take the paths of a smaller one.
void set_smem_optin_cap(long long bytes);

// Diagnostic (`deltaserve bench --skip-kernels / --only-kernels`): from now on launch_kernel does not
// launch a kernel whose name contains one of the comma-separated substrings of `skip`, nor, when
// `only` is not empty, one whose name contains none of the substrings of `only`. What a decode step
// costs without those kernels, inside the replayed graph, is what they cost there (a profiler times
// kernels one by one, outside the graph). Results are meaningless while a filter is set. Empty
// strings clear it. Kernels launched by libraries (cuBLAS) are never filtered.
void set_kernel_filter(const std::string& skip, const std::string& only);
// True when the filter drops `kernel` (a __global__ function); one atomic load when none is set.
bool kernel_filtered(const void* kernel);

// The decode-step timeline's record layout and hooks for launch.cuh (timeline.h has the rest): a launch's
// record is kTimelineRecordWords u64 (entry, release, kTimelineMarks marks); every CUDA source
// registers the function that points its copy of the device-side buffer pointer at a buffer (returns a
// cudaError_t, 0 on success), and launch_kernel logs each launch while a step graph is being captured.
constexpr int kTimelineMarks = 4;  // kern::timeline_mark points a kernel may record
constexpr int kTimelineRecordWords = 2 + kTimelineMarks;
bool timeline_register_binder(int (*bind)(void* buffer));
bool timeline_logging();
void timeline_log_launch(const void* kernel, long long ctas, long long threads);

}  // namespace ds::cuda
