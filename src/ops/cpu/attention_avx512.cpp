// avx512 build of the CPU attention block kernel (attention_kernel.h); called only when the CPU has it.
#define DS_ATTN_NS avx512
#include "ops/cpu/attention_kernel.h"

namespace ds::ops::cpu {

void attend_block_avx512(const AttnArgs& a, int64_t t0, int64_t t1, int64_t g, int64_t j0, int64_t j1, float* m,
                       float* l, float* acc, float* scores) {
  avx512::attend_block(a, t0, t1, g, j0, j1, m, l, acc, scores);
}

}  // namespace ds::ops::cpu
