// Internal to the CPU attention: the arguments of the per-ISA block kernel (attention_kernel.h) and
// its three builds.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace ds::ops::cpu {

struct AttnArgs {
  const float* q;  // [n_tokens, n_head, head_dim]
  std::span<const TensorView> k_chunks, v_chunks;
  int64_t head_dim, n_head, n_head_kv, chunk, pos0;
  float scale;
};

using AttendBlockFn = void (*)(const AttnArgs& a, int64_t t0, int64_t t1, int64_t g, int64_t j0, int64_t j1,
                               float* m, float* l, float* acc, float* scores);
void attend_block_base(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, float*, float*);
void attend_block_avx2(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, float*, float*);
void attend_block_avx512(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, float*, float*, float*,
                         float*);

}  // namespace ds::ops::cpu
