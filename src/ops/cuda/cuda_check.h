// CUDA and cuBLAS error checking for host code of the CUDA backend: a failed call becomes a Status that
// names the op, the call and the shapes. Needs the CUDA headers: include only under DS_HAVE_CUDA.
// Non-obvious choice: the context message is a format string formatted only on failure, so the
// checks cost nothing on the hot path.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "core/status.h"

namespace ds::cuda {

// Errors after which the context cannot be used again (the device is marked unusable).
bool error_is_sticky(cudaError_t e);

// "cuda: <context>: <call>: cudaErrorX (text)"; marks the current device unusable on sticky errors and
// clears the thread's last error on the others. Allocation failures map to kOutOfMemory, the rest to
// kInternal.
Status cuda_error(cudaError_t e, const char* call, const std::string& context);
Status cublas_error(cublasStatus_t s, const char* call, const std::string& context);

}  // namespace ds::cuda

#define DS_CUDA_TRY(call, ...)                                                             \
  do {                                                                                     \
    const cudaError_t ds_cuda_e_ = (call);                                                 \
    if (ds_cuda_e_ != cudaSuccess) [[unlikely]] {                                          \
      return ::ds::cuda::cuda_error(ds_cuda_e_, #call, ::fmt::format(__VA_ARGS__));        \
    }                                                                                      \
  } while (0)

#define DS_CUBLAS_TRY(call, ...)                                                           \
  do {                                                                                     \
    const cublasStatus_t ds_cublas_s_ = (call);                                            \
    if (ds_cublas_s_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                              \
      return ::ds::cuda::cublas_error(ds_cublas_s_, #call, ::fmt::format(__VA_ARGS__));    \
    }                                                                                      \
  } while (0)
