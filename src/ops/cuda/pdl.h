// Whether the CUDA kernels launch with programmatic dependent launch (ops/cuda/launch.cuh). A plain
// header, so the CUDA sources, the device runtime and the stand-alone workbenches can all see it.
#pragma once

namespace ds::cuda {

// True on devices of compute capability 9.0 or later (the calling thread's current device), unless the
// environment sets DELTASERVE_PDL=0 (to measure without it, or to rule it out).
bool pdl_enabled();

}  // namespace ds::cuda
