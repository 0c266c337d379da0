// Launchers of the CUDA kernels for the non-matrix ops (defined in ops/cuda/ops_kernels.cu), called by
// the host entries in ops/cuda/cuda_ops.cpp. Needs the CUDA runtime headers: include only under
// DS_HAVE_CUDA. Arguments are validated by the op dispatchers and
// cuda_ops.cpp before these run; launchers only return the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ds::cuda {

enum class EltKind : int { kAdd, kMul, kSilu, kSigmoid, kSwiglu, kMulSigmoid };

// y[i] = f(a[i], b[i]) over n elements; kMulSigmoid with b_per_row: b[i / row]. b_row_stride > 0: b is
// row-strided, element i at b[(i / row) * b_row_stride + i % row] (rows of `row` contiguous).
cudaError_t eltwise_launch(EltKind kind, const float* a, const float* b, float* y, int64_t n, int64_t row,
                           bool b_per_row, cudaStream_t s, int64_t b_row_stride = 0);
// Row-wise strided copy: rows of ne0 floats; row (i1, i2, i3) at byte offsets i1*nb1 + i2*nb2 + i3*nb3.
struct CopyShape {
  int64_t ne[4];
  int64_t src_nb[4], dst_nb[4];
};
cudaError_t copy_launch(const void* src, void* dst, const CopyShape& shape, cudaStream_t s);
// Rows of a strided view: row r = (i1, i2, i3) = (r % ne1, r / ne1 % ne2, r / (ne1 ne2)) starts at
// element i1 s1 + i2 s2 + i3 s3. Contiguous rows of n: {rows, 1, n, 0, 0} (row_map_contiguous).
struct RowMap {
  int64_t ne1 = 1, ne2 = 1;
  int64_t s1 = 0, s2 = 0, s3 = 0;  // elements
};
inline RowMap row_map_contiguous(int64_t n, int64_t rows) { return RowMap{rows, 1, n, 0, 0}; }
// y = x / sqrt(mean(x^2) + eps) * w (w may be null), or l2: x / sqrt(sum(x^2) + eps); then, with gate,
// y = silu(gate) * y. rows of n; x rows at `xmap`; y and gate contiguous [rows, n]. With `res`
// (contiguous [rows, n]; x then contiguous too): x += res first, written back to x, and normalized.
// With `act` (norm_q8_fits(n)): y is also written as the int8 activations of the q8 matrix-vector
// kernels (quantize_q8's layout and arithmetic, bit for bit: matvec_q8_act_bytes(n, rows) bytes).
cudaError_t norm_launch(const float* x, const RowMap& xmap, const float* w, const float* gate, float* y, int64_t n,
                        int64_t rows, float eps, bool l2, cudaStream_t s, const float* res = nullptr,
                        void* act = nullptr);
// True when norm_launch can write the q8 activations of rows of n: n a multiple of 32, the row held in
// registers by one block (n <= 8192).
bool norm_q8_fits(int64_t n);
// In place NeoX rotary embedding on x [n_tokens, n_head, head_dim].
cudaError_t rope_neox_launch(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                             float base, int64_t pos0, cudaStream_t s);
// y[t, :] = dequantized table row ids[t] (ids already validated), rows of n elements at row stride.
cudaError_t get_rows_launch(DType t, const void* table, int64_t row_stride, int64_t n, const int32_t* ids,
                            int64_t n_tokens, float* y, cudaStream_t s);
// Causal depthwise conv with state (see ops/conv1d.h); kernel <= kConvMaxKernel. silu: y = silu(conv).
constexpr int kConvMaxKernel = 8;
cudaError_t conv1d_launch(const float* x, const float* w, float* state, float* y, int64_t n_ch, int64_t n_tokens,
                          int64_t kernel, cudaStream_t s, bool silu = false);
// g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(b); rows of nv.
cudaError_t delta_net_gates_launch(const float* alpha, const float* b, const float* dt_bias, const float* ssm_a,
                                   float* g, float* beta, int64_t nv, int64_t rows, cudaStream_t s);
// delta_net_prep (ops/delta_net.h) for ONE token in one kernel: conv1d_causal_silu of the n_ch channels of
// mixed into conv (conv_state shifted), l2_norm of the nk q heads and nk k heads of dk (conv channels
// [0, 2 nk dk), q heads first) into q and k, and the nv gates, with the formulas of the separate
// kernels. Blocks of delta_net_prep_threads(dk): one per q / k head, then the v channels, then one for
// the gates. Call only when delta_net_prep_fits; the launcher returns cudaErrorInvalidValue otherwise.
struct DeltaNetPrepArgs {
  const float* mixed;
  const float* conv_w;
  float* conv_state;
  float* conv;
  float* q;
  float* k;
  const float* alpha;
  const float* b;
  const float* dt_bias;
  const float* ssm_a;
  float* g;
  float* beta;
  int64_t n_ch, dk, nk, nv;
  int kernel;
  float eps;
};
constexpr int64_t kDeltaNetPrepMaxDk = 1024;  // one thread per channel of a head
// dk rounded up to whole warps, at least 128 (the v-channel blocks), at most 1024.
inline int delta_net_prep_threads(int64_t dk) {
  const int64_t t = (dk + 31) / 32 * 32;
  return static_cast<int>(t < 128 ? 128 : (t > 1024 ? 1024 : t));
}
inline bool delta_net_prep_fits(int64_t n_ch, int64_t kernel, int64_t dk, int64_t nk, int64_t nv) {
  if (kernel < 1 || kernel > kConvMaxKernel || dk < 1 || dk > kDeltaNetPrepMaxDk || nk < 1 || nv < 0) return false;
  if (2 * nk * dk > n_ch) return false;
  const int64_t threads = delta_net_prep_threads(dk);
  const int64_t blocks = 2 * nk + (n_ch - 2 * nk * dk + threads - 1) / threads + 1;
  return blocks <= 0x7FFFFFFF;
}
cudaError_t delta_net_prep_launch(const DeltaNetPrepArgs& a, cudaStream_t s);
// moe_route for n_tokens rows of n_expert logits; k <= kRouteMaxK, n_expert <= kRouteMaxExperts.
constexpr int kRouteMaxK = 32;
constexpr int64_t kRouteMaxExperts = 2048;
cudaError_t moe_route_launch(const float* logits, int64_t n_expert, int64_t n_tokens, int64_t k, int32_t* ids,
                             float* weights, float floor, cudaStream_t s);
// y[dst_rows[i], :] += scale[i] * x[i, :] for i < n (rows of n_embd); rows are distinct per launch.
cudaError_t scatter_add_rows_launch(const float* x, const int32_t* dst_rows, const float* scale, float* y,
                                    int64_t n, int64_t n_embd, cudaStream_t s);
// y[i, :] = x[src_rows[i], :].
cudaError_t gather_rows_launch(const float* x, const int32_t* src_rows, float* y, int64_t n, int64_t n_embd,
                               cudaStream_t s);

}  // namespace ds::cuda
