// Instantiations and launchers of the CUDA matrix kernels (kernels in matvec_kernels.cuh): the staged
// matrix-vector kernel per (type, token bucket), the generic fallback and the BF16 conversions.
// Non-obvious choice: n_tokens is bucketed to 1, 2, 4, 8 or 16 accumulator columns (predicated), which
// bounds the instantiations at 5 per type and keeps CI compile time small.
#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/matvec_launch.h"

namespace ds::cuda {
namespace {

template <DType T>
cudaError_t launch_typed(const MatvecLaunch& l, bool force_generic, cudaStream_t stream) {
  kern::MatvecArgs a{static_cast<const uint8_t*>(l.w), l.w_stride, l.x, l.x_stride, l.y, l.y_stride,
                     l.n_rows, l.k, l.n_tokens};
  if (force_generic || !matvec_fast_ok(T, l)) {
    constexpr int kWarps = 4;
    const dim3 grid(static_cast<unsigned>((l.n_rows + kWarps - 1) / kWarps), static_cast<unsigned>(l.n_tokens));
    kern::matvec_generic<T><<<grid, 32 * kWarps, 0, stream>>>(a);
    return cudaGetLastError();
  }
  const unsigned grid = static_cast<unsigned>((l.n_rows + kern::kStagedRows - 1) / kern::kStagedRows);
  if (l.n_tokens <= 1) {
    kern::matvec_staged<T, 1><<<grid, kern::kStagedThreads, 0, stream>>>(a);
  } else if (l.n_tokens <= 2) {
    kern::matvec_staged<T, 2><<<grid, kern::kStagedThreads, 0, stream>>>(a);
  } else if (l.n_tokens <= 4) {
    kern::matvec_staged<T, 4><<<grid, kern::kStagedThreads, 0, stream>>>(a);
  } else if (l.n_tokens <= 8) {
    kern::matvec_staged<T, 8><<<grid, kern::kStagedThreads, 0, stream>>>(a);
  } else {
    kern::matvec_staged<T, 16><<<grid, kern::kStagedThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <DType T>
cudaError_t dequant_typed(const void* w, int64_t w_stride, int64_t n_rows, int64_t k, void* out,
                          cudaStream_t stream) {
  constexpr qdec::TypeTraits tr = qdec::traits(T);
  const uintptr_t base = reinterpret_cast<uintptr_t>(w);
  const bool aligned = k % 8 == 0 && base % tr.row_align == 0 && w_stride % tr.row_align == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const auto* wb = static_cast<const uint8_t*>(w);
  auto* o = static_cast<__nv_bfloat16*>(out);
  constexpr int kThreads = 256;
  if (aligned) {
    const int64_t n = n_rows * (k / 8);
    kern::dequant_bf16<T, true><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        wb, w_stride, n_rows, k, o);
  } else {
    const int64_t n = n_rows * k;
    kern::dequant_bf16<T, false><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        wb, w_stride, n_rows, k, o);
  }
  return cudaGetLastError();
}

#define DS_MATVEC_TYPES(X) X(F32) X(F16) X(BF16) X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)

}  // namespace

bool matvec_supports(DType t) {
  switch (t) {
#define X(name) case DType::name:
    DS_MATVEC_TYPES(X)
#undef X
    return true;
    default:
      return false;
  }
}

bool matvec_fast_ok(DType t, const MatvecLaunch& a) {
  const qdec::TypeTraits tr = qdec::traits(t);
  if (tr.block_elems == 0) return false;
  const uintptr_t w = reinterpret_cast<uintptr_t>(a.w), x = reinterpret_cast<uintptr_t>(a.x);
  return a.k % 8 == 0 && a.k % tr.block_elems == 0 && w % tr.row_align == 0 && a.w_stride % tr.row_align == 0 &&
         x % 16 == 0 && a.x_stride % 4 == 0 && a.n_tokens >= 1 && a.n_tokens <= kMatvecMaxTokens;
}

cudaError_t matvec_launch(DType t, const MatvecLaunch& a, bool force_generic, cudaStream_t stream) {
  if (a.n_rows <= 0 || a.n_tokens <= 0) return cudaSuccess;
  switch (t) {
#define X(name) \
  case DType::name: return launch_typed<DType::name>(a, force_generic, stream);
    DS_MATVEC_TYPES(X)
#undef X
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t dequant_bf16_launch(DType t, const void* w, int64_t w_stride, int64_t n_rows, int64_t k, void* out,
                                cudaStream_t stream) {
  if (n_rows <= 0 || k <= 0) return cudaSuccess;
  switch (t) {
#define X(name) \
  case DType::name: return dequant_typed<DType::name>(w, w_stride, n_rows, k, out, stream);
    DS_MATVEC_TYPES(X)
#undef X
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t f32_to_bf16_launch(const float* x, int64_t x_stride, int64_t n_rows, int64_t k, void* out,
                               cudaStream_t stream) {
  const int64_t n = n_rows * k;
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  kern::f32_to_bf16<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      x, x_stride, n_rows, k, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace ds::cuda
