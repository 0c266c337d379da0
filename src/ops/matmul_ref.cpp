// Scalar reference of matmul and get_rows: dequantize each weight row with the reference
// dequantizer, then dot in double. Slow and obvious on purpose.
#include <vector>

#include "ops/op_impl.h"
#include "quant/quant.h"

namespace ds::ops::ref {

void matmul(const OpContext&, const TensorView& w, const TensorView& x, const TensorView& y) {
  const int64_t n_in = w.ne[0], n_out = w.ne[1], n_tokens = x.ne[1];
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t r = 0; r < n_out; ++r) {
    quant::dequantize_row(w.dtype, w.row(r), row.data(), n_in);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x.as<float>() + t * n_in;
      double acc = 0.0;
      for (int64_t i = 0; i < n_in; ++i) acc += static_cast<double>(row[i]) * xt[i];
      y.as<float>()[t * n_out + r] = static_cast<float>(acc);
    }
  }
}

void get_rows(const OpContext&, const TensorView& table, const TensorView& ids, const TensorView& y) {
  const int64_t n = table.ne[0];
  for (int64_t t = 0; t < ids.n_elements(); ++t) {
    quant::dequantize_row(table.dtype, table.row(ids.as<int32_t>()[t]), y.as<float>() + t * n, n);
  }
}

}  // namespace ds::ops::ref
