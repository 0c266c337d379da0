// Physical limits of one CUDA device, measured rather than taken from a data sheet, so benchmarks can
// state results as a fraction of what this device reaches in this run: streaming read bandwidth (the
// ceiling of decode, which reads every weight once per token), the BF16 tensor-core GEMM peak (the
// ceiling of prefill), and the device memory in use. Declarations compile without CUDA; definitions
// exist only in builds with DS_HAVE_CUDA (cuda_limits.cpp, kernels in membw.cu).
// Non-obvious choice: the measurement buffers bypass the caching DeviceAllocator (plain cudaMalloc /
// cudaFree in the measurement's scope), so measuring leaves no cached blocks and no high-water mark
// in the allocator statistics that a benchmark reports as the model's peak memory.
#pragma once

#include <cstdint>
#include <utility>

#include "core/status.h"

namespace ds::cuda {

// GB/s (1e9 bytes) of a streaming read with 16-byte loads over a buffer of 2-4 GiB (far beyond the L2),
// best of several runs timed with events. kOutOfMemory when less than ~2.3 GiB is free.
Result<double> measure_read_bandwidth_gbps(int device);

// TFLOP/s (1e12) of cublasGemmEx on 8192^3 BF16 inputs with F32 accumulation and F32 output (random
// data: zeros run faster), best of several runs timed with events; 2 * 8192^3 FLOPs per GEMM.
Result<double> measure_bf16_peak_tflops(int device);

// {used, total} bytes of the device as cudaMemGetInfo reports them (used = total - free: every
// process and context on the device, this one's CUDA context and library workspaces included).
Result<std::pair<int64_t, int64_t>> device_memory_used(int device);

}  // namespace ds::cuda
