// AVX2 build of the SIMD dot products (vec_dot_simd_impl.h): vpmaddubsw + vpmaddwd in place of
// VNNI, 64-byte vectors as register pairs. Called only when the CPU reports AVX2, FMA and F16C.
#define DS_SIMD_NS avx2
#include "ops/cpu/vec_dot_internal.h"
#include "ops/cpu/vec_dot_simd_impl.h"

namespace ds::cpu {

void gemm_tile_avx2(DType t, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                    const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride) {
  avx2::gemm_tile_impl(t, n, w, w_row_bytes, r0, r1, act, act_row_bytes, n_tokens, y, y_stride);
}

float vec_dot_avx2(DType t, int64_t n, const void* w_row, const void* act_row) {
  return avx2::vec_dot_impl(t, n, w_row, act_row);
}

}  // namespace ds::cpu
