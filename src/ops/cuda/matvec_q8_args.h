// Arguments of the int8-activation matrix-vector kernels (v4 in matvec_q8.cuh, v5 in matvec_q8v5.cuh), and
// the occupancy cap of v4's launches (occupancy_cap_pad).
// Non-obvious choice: no CUDA type appears here (xds is a void pointer to float2 pairs), so the host
// emulation of v5 in the tests compiles without the CUDA headers.
#pragma once

#include <cstdint>

namespace ds::cuda::kern {

struct MatvecQ8Args {
  const uint8_t* w;       // [n_rows] rows of k elements of the weight type (gathered: expert 0)
  int64_t w_stride;       // bytes between rows
  const int8_t* xq;       // [activation rows, k] codes (quantize_q8)
  const void* xds;        // float2 [activation rows, k / 32] (d, d * sum q)
  float* y;               // [n_tokens or slots, y_stride]
  int64_t y_stride;       // elements between output rows
  int64_t n_rows;
  int64_t k;              // multiple of the type's block (256 for K-quants, else 32)
  int n_tokens;           // activation rows 1 .. kNT (gathered: 1)
  const int32_t* ids = nullptr;  // gathered: expert id of slot blockIdx.y; ids outside [0, n_expert) skip it
  int64_t w_expert_stride = 0;   // bytes between experts
  int n_expert = 0;
  int x_div = 1;                 // gathered: slot s multiplies activation row s / x_div, writes y row s
};

// Bytes from the start of an activation scratch of n_rows rows of k elements to its (d, d * sum q)
// pairs: the int8 codes [n_rows, k] come first, rounded up to 16 bytes.
constexpr int64_t q8_ds_offset(int64_t k, int64_t n_rows) { return (n_rows * k + 15) / 16 * 16; }

// Dynamic shared memory that leaves room for at most `ctas` CTAs per SM of a kernel with static_bytes of
// static shared memory, on an SM of sm_bytes that reserves reserved_bytes per CTA: the kernel does not
// use it, it only caps the occupancy (0 when the kernel's own memory already caps it there).
constexpr int64_t occupancy_cap_pad(int64_t static_bytes, int64_t sm_bytes, int64_t reserved_bytes, int ctas) {
  const int64_t per_cta = sm_bytes / (ctas + 1) + 1;  // one byte more than ctas + 1 CTAs fit
  const int64_t pad = per_cta - reserved_bytes - static_bytes;
  return pad > 0 ? pad : 0;
}

// The product's arguments over an activation scratch `act` of act_rows rows (quantize_q8's layout);
// the gathered-mode fields keep their defaults.
inline MatvecQ8Args q8_args(const void* w, int64_t w_stride, const void* act, int64_t k, int64_t act_rows, float* y,
                            int64_t y_stride, int64_t n_rows, int n_tokens) {
  const auto* a = static_cast<const uint8_t*>(act);
  return MatvecQ8Args{static_cast<const uint8_t*>(w), w_stride, reinterpret_cast<const int8_t*>(a),
                      a + q8_ds_offset(k, act_rows), y, y_stride, n_rows, k, n_tokens};
}

}  // namespace ds::cuda::kern
