// Instantiations and launchers of the CUDA matrix kernels (kernels in matvec_kernels.cuh and
// matvec_q8.cuh): the int8-activation kernel and the staged F32 kernel per (type, token bucket), the
// generic fallback, the activation quantizer and the BF16 conversions.
// Non-obvious choice: n_tokens is bucketed to 1, 2, 4, 8 (q8) or 1, 2, 4, 8, 16 (staged) accumulator
// columns (predicated), which bounds the instantiations per type and keeps CI compile time small.
#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/matvec_q8.cuh"

namespace ds::cuda {
namespace {

static_assert(kern::kQ8MaxTokens == kMatvecQ8MaxTokens, "q8 token limit");

// Runs matvec_q8 on activations already quantized into l.act; matvec_q8_ok(T, l) holds.
template <DType T>
cudaError_t launch_q8_product(const MatvecLaunch& l, cudaStream_t stream) {
  auto* act = static_cast<uint8_t*>(l.act);
  const kern::MatvecQ8Args a{static_cast<const uint8_t*>(l.w),
                             l.w_stride,
                             reinterpret_cast<const int8_t*>(act),
                             reinterpret_cast<const float2*>(act + kern::q8_ds_offset(l.k, l.n_tokens)),
                             l.y,
                             l.y_stride,
                             l.n_rows,
                             l.k,
                             l.n_tokens};
  constexpr int kRowsPerCta = kern::kQ8Warps * kern::kQ8Rows;
  const unsigned grid = static_cast<unsigned>((l.n_rows + kRowsPerCta - 1) / kRowsPerCta);
  if (l.n_tokens <= 1) {
    kern::matvec_q8<T, 1><<<grid, kern::kQ8Threads, 0, stream>>>(a);
  } else if (l.n_tokens <= 2) {
    kern::matvec_q8<T, 2><<<grid, kern::kQ8Threads, 0, stream>>>(a);
  } else if (l.n_tokens <= 4) {
    kern::matvec_q8<T, 4><<<grid, kern::kQ8Threads, 0, stream>>>(a);
  } else {
    kern::matvec_q8<T, 8><<<grid, kern::kQ8Threads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

// Quantizes x, then runs matvec_q8; matvec_q8_ok(T, l) holds.
template <DType T>
cudaError_t launch_q8(const MatvecLaunch& l, cudaStream_t stream) {
  const cudaError_t e = quantize_q8_launch(l.x, l.x_stride, nullptr, l.n_tokens, l.k, l.act, nullptr, 0, stream);
  return e != cudaSuccess ? e : launch_q8_product<T>(l, stream);
}

template <DType T>
cudaError_t launch_typed(const MatvecLaunch& l, MatvecKernel fastest, cudaStream_t stream) {
  const MatvecKernel kernel = matvec_pick(T, l, fastest);
  if constexpr (qdec::q8_supported(T)) {
    if (kernel == MatvecKernel::kQ8) return launch_q8<T>(l, stream);
  }
  kern::MatvecArgs a{static_cast<const uint8_t*>(l.w), l.w_stride, l.x, l.x_stride, l.y, l.y_stride,
                     l.n_rows, l.k, l.n_tokens};
  if (kernel == MatvecKernel::kGeneric) {
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

bool matvec_q8_supports(DType t) { return qdec::q8_supported(t); }

bool matvec_q8_ok(DType t, const MatvecLaunch& a) {
  if (!qdec::q8_supported(t) || a.k <= 0 || a.k % qdec::traits(t).block_elems != 0) return false;
  const uintptr_t w = reinterpret_cast<uintptr_t>(a.w), act = reinterpret_cast<uintptr_t>(a.act);
  const int64_t row_align = qdec::q8_aligned16(t) ? 16 : 2;
  return w % 16 == 0 && a.w_stride % row_align == 0 && a.n_tokens >= 1 && a.n_tokens <= kMatvecQ8MaxTokens &&
         act != 0 && act % 16 == 0 && a.act_bytes >= matvec_q8_act_bytes(a.k, a.n_tokens);
}

MatvecKernel matvec_pick(DType t, const MatvecLaunch& a, MatvecKernel fastest) {
  if (fastest == MatvecKernel::kQ8 && matvec_q8_ok(t, a)) return MatvecKernel::kQ8;
  if (fastest != MatvecKernel::kGeneric && matvec_fast_ok(t, a)) return MatvecKernel::kStaged;
  return MatvecKernel::kGeneric;
}

int64_t matvec_q8_act_bytes(int64_t k, int64_t n_rows) { return kern::q8_act_bytes(k, n_rows); }
int64_t matvec_q8_ds_offset(int64_t k, int64_t n_rows) { return kern::q8_ds_offset(k, n_rows); }

cudaError_t quantize_q8_launch(const float* x, int64_t x_stride, const float* up, int64_t n_rows, int64_t k,
                               void* act, const int32_t* ids, int n_expert, cudaStream_t stream) {
  if (n_rows <= 0 || k <= 0) return cudaSuccess;
  if (k % kern::kQ8Block != 0) return cudaErrorInvalidValue;
  auto* base = static_cast<uint8_t*>(act);
  kern::QuantizeQ8Args a{x, x_stride, up, n_rows, k, reinterpret_cast<int8_t*>(base),
                         reinterpret_cast<float2*>(base + kern::q8_ds_offset(k, n_rows)), ids, n_expert};
  const int64_t threads = n_rows * (k / kern::kQ8Block) * 8;
  const unsigned grid = static_cast<unsigned>((threads + kern::kQuantThreads - 1) / kern::kQuantThreads);
  if (up != nullptr) {
    kern::quantize_q8<true><<<grid, kern::kQuantThreads, 0, stream>>>(a);
  } else {
    kern::quantize_q8<false><<<grid, kern::kQuantThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

bool matvec_fast_ok(DType t, const MatvecLaunch& a) {
  const qdec::TypeTraits tr = qdec::traits(t);
  if (tr.block_elems == 0) return false;
  const uintptr_t w = reinterpret_cast<uintptr_t>(a.w), x = reinterpret_cast<uintptr_t>(a.x);
  return a.k % 8 == 0 && a.k % tr.block_elems == 0 && w % tr.row_align == 0 && a.w_stride % tr.row_align == 0 &&
         x % 16 == 0 && a.x_stride % 4 == 0 && a.n_tokens >= 1 && a.n_tokens <= kMatvecMaxTokens;
}

cudaError_t matvec_launch(DType t, const MatvecLaunch& a, MatvecKernel fastest, cudaStream_t stream) {
  if (a.n_rows <= 0 || a.n_tokens <= 0) return cudaSuccess;
  switch (t) {
#define X(name) \
  case DType::name: return launch_typed<DType::name>(a, fastest, stream);
    DS_MATVEC_TYPES(X)
#undef X
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t matvec_q8_product_launch(DType t, const MatvecLaunch& a, cudaStream_t stream) {
  if (a.n_rows <= 0 || a.n_tokens <= 0) return cudaSuccess;
  if (!matvec_q8_ok(t, a)) return cudaErrorInvalidValue;
  switch (t) {
#define X(name) \
  case DType::name: return launch_q8_product<DType::name>(a, stream);
    X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
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
