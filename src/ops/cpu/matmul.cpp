// Fast CPU matmul and get_rows. Each activation row is quantized once to the type paired with the
// weight type, then threads take disjoint ranges of weight rows and run gemm_tile over all tokens.
// Non-obvious choice: tiles of kRowTile weight rows keep a tile's weights in L1/L2 while every
// token's activation row streams past, so weights are read from memory once per call.
#include <algorithm>
#include <vector>

#include "ops/cpu/vec_dot.h"
#include "ops/op_impl.h"
#include "quant/quant.h"

namespace ds::ops::cpu {

namespace {
constexpr int64_t kRowTile = 16;  // weight rows per gemm_tile call
}

void matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y) {
  const int64_t n_in = w.ne[0], n_out = w.ne[1], n_tokens = x.ne[1];
  const int64_t act_bytes = ds::cpu::vec_dot_act_row_bytes(w.dtype, n_in);
  thread_local std::vector<uint8_t> act;
  act.resize(static_cast<size_t>(n_tokens * act_bytes));
  uint8_t* act_data = act.data();
  ThreadPool& pool = ctx.threads();
  const float* xd = x.as<float>();
  if (n_tokens == 1) {
    ds::cpu::vec_dot_quantize_act(w.dtype, xd, act_data, n_in);
  } else {
    pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) ds::cpu::vec_dot_quantize_act(w.dtype, xd + t * n_in, act_data + t * act_bytes, n_in);
    });
  }
  float* yd = y.as<float>();
  const size_t w_row_bytes = static_cast<size_t>(w.nb[1]);
  pool.parallel_for(
      n_out,
      [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r += kRowTile) {
          ds::cpu::gemm_tile(w.dtype, n_in, w.data, w_row_bytes, r, std::min(r1, r + kRowTile), act_data,
                             static_cast<size_t>(act_bytes), n_tokens, yd, n_out);
        }
      },
      kRowTile);
}

void get_rows(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y) {
  const int64_t n = table.ne[0];
  const int32_t* id = ids.as<int32_t>();
  ctx.threads().parallel_for(ids.n_elements(), [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) quant::dequantize_row(table.dtype, table.row(id[t]), y.as<float>() + t * n, n);
  });
}

}  // namespace ds::ops::cpu
