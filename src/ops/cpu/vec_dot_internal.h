// Entry points of the per-ISA dot-product implementations behind vec_dot.h. Each ISA file
// (vec_dot_avx2.cpp, vec_dot_avx512.cpp) is compiled with its own flags and must only be called
// after a run-time CPU check; vec_dot.cpp does that check and dispatches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ds::cpu {

// Same contract as gemm_tile in vec_dot.h; weight_type is any type vec_dot supports.
using GemmTileFn = void (*)(DType weight_type, int64_t n, const void* w, size_t w_row_bytes, int64_t r0,
                            int64_t r1, const void* act, size_t act_row_bytes, int64_t n_tokens, float* y,
                            int64_t y_stride);

using VecDotFn = float (*)(DType weight_type, int64_t n, const void* w_row, const void* act_row);

float vec_dot_scalar(DType weight_type, int64_t n, const void* w_row, const void* act_row);
float vec_dot_avx2(DType weight_type, int64_t n, const void* w_row, const void* act_row);
float vec_dot_avx512(DType weight_type, int64_t n, const void* w_row, const void* act_row);
void gemm_tile_scalar(DType weight_type, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                      const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride);
void gemm_tile_avx2(DType weight_type, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                    const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride);
void gemm_tile_avx512(DType weight_type, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                      const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride);

// Which paths this CPU can run (tests loop over them).
bool cpu_has_avx2();
bool cpu_has_avx512vnni();
// Overrides the dispatch: "scalar", "avx2", "avx512vnni", or nullptr for the automatic choice.
// DS_CHECKs that the CPU supports the requested path.
void vec_dot_force_isa(const char* isa);

}  // namespace ds::cpu
