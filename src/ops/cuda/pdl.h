// Launch policy of the CUDA kernels launched through launch_kernel (ops/cuda/launch.cuh): programmatic
// dependent launch, and the kernel filter of the in-graph attribution diagnostic. A plain header, so
// the CUDA sources, the device runtime and the stand-alone workbenches can all see it.
#pragma once

#include <string>

namespace ds::cuda {

// True on devices of compute capability 9.0 or later (the calling thread's current device), unless the
// environment sets DELTASERVE_PDL=0 (to measure without it, or to rule it out).
bool pdl_enabled();

// Diagnostic (`deltaserve bench --skip-kernels / --only-kernels`): from now on launch_kernel does not
// launch a kernel whose name contains one of the comma-separated substrings of `skip`, nor, when
// `only` is not empty, one whose name contains none of the substrings of `only`. What a decode step
// costs without those kernels, inside the replayed graph, is what they cost there (a profiler times
// kernels one by one, outside the graph). Results are meaningless while a filter is set. Empty
// strings clear it. Kernels launched by libraries (cuBLAS) are never filtered.
void set_kernel_filter(const std::string& skip, const std::string& only);
// True when the filter drops `kernel` (a __global__ function); one atomic load when none is set.
bool kernel_filtered(const void* kernel);

}  // namespace ds::cuda
