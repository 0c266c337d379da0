// TensorView: a non-owning view of tensor data on some device. Shapes use ggml order:
// ne[0] is the contiguous (row) dimension, so a PyTorch [rows, cols] matrix has ne = {cols, rows}.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ds {

enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string to_string() const;  // "cpu", "cuda:0"
};

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int n_dims = 1;
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // elements per dim
  std::array<int64_t, kMaxDims> nb{0, 0, 0, 0};  // bytes per step in each dim (nb[0] = block bytes)
  Device device{};

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t row_bytes() const { return dtype_row_bytes(dtype, ne[0]); }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  bool is_contiguous() const;
  int64_t n_bytes() const;  // bytes spanned, for contiguous tensors
  std::string shape_string() const;  // "[4096, 1024] q4_K"

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  // Row i1 of a 2-D view (or of the flattened rows of a higher-dim view when contiguous).
  uint8_t* row(int64_t i1) const { return static_cast<uint8_t*>(data) + i1 * nb[1]; }

  // A contiguous view with the given shape (dims beyond n_dims are 1).
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> ne,
                               Device device = {});
};

// Heads of every row of a 2-D F32 tensor t [n, row] (rows at t.nb[1]): n_head runs of head_dim
// elements, the first at column c0, head_stride elements apart, as a strided view [n, n_head,
// head_dim] (a fused projection's q / k / v heads, or the q / gate halves of interleaved heads).
// No copy; the heads must lie within the row.
TensorView row_heads(const TensorView& t, int64_t c0, int64_t head_dim, int64_t n_head, int64_t head_stride);

}  // namespace ds
