// AVX-512 VNNI build of the SIMD dot products (vec_dot_simd_impl.h): 512-bit vpdpbusd for the
// K-quants, 256-bit vpdpbusd for the 32-element types. Called only when the CPU reports the ISA.
#define DS_SIMD_NS avx512
#include "ops/cpu/vec_dot_internal.h"
#include "ops/cpu/vec_dot_simd_impl.h"

namespace ds::cpu {

void gemm_tile_avx512(DType t, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                      const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride) {
  avx512::gemm_tile_impl(t, n, w, w_row_bytes, r0, r1, act, act_row_bytes, n_tokens, y, y_stride);
}

float vec_dot_avx512(DType t, int64_t n, const void* w_row, const void* act_row) {
  return avx512::vec_dot_impl(t, n, w_row, act_row);
}

}  // namespace ds::cpu
