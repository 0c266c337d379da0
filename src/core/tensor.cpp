// TensorView helpers.
#include "core/tensor.h"

#include <fmt/format.h>

#include "core/check.h"

namespace ds {

std::string Device::to_string() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

bool TensorView::is_contiguous() const {
  int64_t expect = dtype_block_bytes(dtype);
  if (nb[0] != expect) return false;
  expect = row_bytes();
  for (int d = 1; d < kMaxDims; ++d) {
    if (ne[d] > 1 && nb[d] != expect) return false;
    expect *= ne[d];
  }
  return true;
}

int64_t TensorView::n_bytes() const { return row_bytes() * n_rows(); }

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < n_dims; ++d) s += fmt::format("{}{}", d ? ", " : "", ne[d]);
  return s + "] " + dtype_name(dtype);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  DS_CHECK(shape.size() >= 1 && shape.size() <= kMaxDims, "bad rank {}", shape.size());
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.n_dims = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t n : shape) t.ne[d++] = n;
  t.nb[0] = dtype_block_bytes(dtype);
  t.nb[1] = dtype_row_bytes(dtype, t.ne[0]);
  for (int i = 2; i < kMaxDims; ++i) t.nb[i] = t.nb[i - 1] * t.ne[i - 1];
  return t;
}

TensorView row_heads(const TensorView& t, int64_t c0, int64_t head_dim, int64_t n_head, int64_t head_stride) {
  DS_CHECK(t.dtype == DType::F32 && c0 >= 0 && head_dim >= 0 && n_head >= 0 && head_stride >= head_dim &&
               (n_head == 0 || c0 + head_stride * (n_head - 1) + head_dim <= t.ne[0]),
           "row_heads: {} heads of {} every {} from column {} exceed t {}", n_head, head_dim, head_stride, c0,
           t.shape_string());
  TensorView r = t;
  r.data = t.as<float>() + c0;
  r.n_dims = 3;
  r.ne = {head_dim, n_head, t.ne[1], 1};
  r.nb = {4, 4 * head_stride, t.nb[1], t.nb[1] * t.ne[1]};
  return r;
}

}  // namespace ds
