// CUDA kernels of the attention layer's prep (launchers in attention_launch.h): kv_append writes K and V
// rows at the device position into the paged cache (F32, F16, or Q8_0 / Q4_0 blocks, a row quantized by a
// warp);
// attention_prep does an attention layer's q/k RMSNorm, RoPE at the device position and the KV append in
// one kernel.
// Non-obvious choice: attention_prep gives a warp to each (token, head row) of q, k and v, so every
// row's norm is one warp's butterfly (kern::prep_head_row, shared with the fused decode kernel of
// attention.cu): no CTA barrier, and the bits of the unfused norm, rotation and append.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/attention_launch.h"
#include "ops/cuda/attention_prep.cuh"
#include "ops/cuda/launch.cuh"

namespace ds::cuda {
namespace {

// ---- KV append ----

template <typename T>
__global__ void kv_append_kernel(const float* k, const float* v, const uint8_t* const* k_base,
                                 const uint8_t* const* v_base, int64_t k_off, int64_t v_off, int C, int64_t row,
                                 const int32_t* d_pos, int64_t total) {
  kern::dependency_sync();
  const int pos0 = *d_pos;
  if (pos0 < 0) return;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / row, rem = i - t * row;
    const int64_t pos = pos0 + t;
    const int64_t c = pos / C, r = pos - c * C;
    const int64_t off = (r * row + rem) * static_cast<int64_t>(sizeof(T));
    kern::store_kv(reinterpret_cast<T*>(const_cast<uint8_t*>(k_base[c]) + k_off + off), k[i]);
    kern::store_kv(reinterpret_cast<T*>(const_cast<uint8_t*>(v_base[c]) + v_off + off), v[i]);
  }
}

// Q8_0 / Q4_0 KV (KV = kern::KvQ8 / kern::KvQ4): one warp per (token, head) row of k or v, the row's
// blocks quantized by the warp.
constexpr int kAppendBlockWarps = 8;

template <typename KV>
__global__ void __launch_bounds__(32 * kAppendBlockWarps) kv_append_blocks_kernel(const float* k, const float* v,
                                                                                  PagedKvArgs kv, const int32_t* d_pos,
                                                                                  int64_t n_rows) {
  kern::dependency_sync();
  const int pos0 = *d_pos;
  if (pos0 < 0) return;
  const int lane = threadIdx.x % 32, D = kv.head_dim, Hkv = kv.n_head_kv;
  const int rb = kern::kv_row_bytes<KV>(D);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kAppendBlockWarps + threadIdx.x / 32; i < 2 * n_rows;
       i += static_cast<int64_t>(gridDim.x) * kAppendBlockWarps) {
    const bool is_v = i >= n_rows;
    const int64_t th = is_v ? i - n_rows : i, t = th / Hkv, h = th - t * Hkv;
    const int64_t pos = pos0 + t, c = pos / kv.chunk_tokens, r = pos - c * kv.chunk_tokens;
    uint8_t* dst = const_cast<uint8_t*>(is_v ? kv.v_base[c] : kv.k_base[c]) + (is_v ? kv.v_offset : kv.k_offset) +
                   (r * Hkv + h) * rb;
    kern::store_kv_row<KV>(dst, (is_v ? v : k) + th * D, D, lane);
  }
}

// ---- attention prep: q/k RMSNorm + RoPE + KV append ----

// One warp per (token, head slot): slots [0, n_head) are q heads, then n_head_kv k heads, then n_head_kv
// v heads. The norm is norm_kernel's arithmetic for a row of at most 256 (kern::warp_row_rms_inv), the
// rotation kern::rope_neox_pair, the stores kv_append's: the result has the bits of rms_norm,
// rope_neox_at and kv_append in sequence.
constexpr int kPrepWarps = 4;

template <typename T>
__global__ void __launch_bounds__(32 * kPrepWarps) attention_prep_kernel(AttnPrepArgs a) {
  __shared__ float rows[kPrepWarps][kAttnPrepMaxHeadDim];
  kern::dependency_sync();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = blockIdx.x * kPrepWarps + warp, t = blockIdx.y;
  const int H = a.n_head, Hkv = a.kv.n_head_kv, D = a.kv.head_dim;
  if (slot >= H + 2 * Hkv) return;  // warp-uniform
  const int pos0 = *a.d_pos;
  const int64_t pos = static_cast<int64_t>(pos0) + t;
  const int64_t row = static_cast<int64_t>(Hkv) * D;
  const int64_t c = pos / a.kv.chunk_tokens, r = pos - c * a.kv.chunk_tokens;
  if (slot >= H + Hkv) {  // v head: append only
    const int hv = slot - H - Hkv;
    if (pos0 < 0) return;
    const float* src = a.v + t * row + static_cast<int64_t>(hv) * D;
    uint8_t* dst = const_cast<uint8_t*>(a.kv.v_base[c]) + a.kv.v_offset +
                   (r * Hkv + hv) * static_cast<int64_t>(kern::kv_row_bytes<T>(D));
    kern::store_kv_row<T>(dst, src, D, lane);
    return;
  }
  const bool is_q = slot < H;
  const int h = is_q ? slot : slot - H;
  const float* src = is_q ? a.q_in + t * a.q_ts + static_cast<int64_t>(h) * a.q_hs : a.k + t * row + static_cast<int64_t>(h) * D;
  const float* w = is_q ? a.q_norm : a.k_norm;
  float* y = rows[warp];
  kern::prep_head_row(src, w, D, a.eps, pos, a.n_rot, a.log2_base, y, lane);
  float* out = is_q ? a.q + (static_cast<int64_t>(t) * H + h) * D : a.k + t * row + static_cast<int64_t>(h) * D;
  for (int i = lane; i < D; i += 32) out[i] = y[i];
  if (is_q || pos0 < 0) return;
  uint8_t* dst = const_cast<uint8_t*>(a.kv.k_base[c]) + a.kv.k_offset +
                 (r * Hkv + h) * static_cast<int64_t>(kern::kv_row_bytes<T>(D));
  kern::store_kv_row<T>(dst, y, D, lane);
}

}  // namespace

cudaError_t kv_append_launch(const float* k, const float* v, const PagedKvArgs& kv, const int32_t* d_pos,
                             int64_t n_tokens, cudaStream_t s) {
  const int64_t row = static_cast<int64_t>(kv.n_head_kv) * kv.head_dim;
  const int64_t total = n_tokens * row;
  if (total <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  if (kv.dtype == DType::F16) {
    launch_kernel(kv_append_kernel<__half>, blocks, 256, 0, s, k, v, kv.k_base, kv.v_base, kv.k_offset, kv.v_offset,
                  kv.chunk_tokens, row, d_pos, total);
  } else if (kv.dtype == DType::F32) {
    launch_kernel(kv_append_kernel<float>, blocks, 256, 0, s, k, v, kv.k_base, kv.v_base, kv.k_offset, kv.v_offset,
                  kv.chunk_tokens, row, d_pos, total);
  } else if (kern::kv_dtype_blocks(kv.dtype) && kv.head_dim % kern::kKvBlock == 0) {
    const int64_t n_rows = n_tokens * kv.n_head_kv;
    const unsigned ctas =
        static_cast<unsigned>(std::min<int64_t>((2 * n_rows + kAppendBlockWarps - 1) / kAppendBlockWarps, 4096));
    if (kv.dtype == DType::Q8_0) {
      launch_kernel(kv_append_blocks_kernel<kern::KvQ8>, ctas, 32 * kAppendBlockWarps, 0, s, k, v, kv, d_pos, n_rows);
    } else {
      launch_kernel(kv_append_blocks_kernel<kern::KvQ4>, ctas, 32 * kAppendBlockWarps, 0, s, k, v, kv, d_pos, n_rows);
    }
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t attention_prep_launch(const AttnPrepArgs& a, int64_t n_tokens, cudaStream_t s) {
  if (n_tokens <= 0) return cudaSuccess;
  if (a.kv.head_dim < 1 || a.kv.head_dim > kAttnPrepMaxHeadDim || a.n_rot < 2 || a.n_rot % 2 != 0 ||
      a.n_rot > a.kv.head_dim || a.n_head < 1 || a.kv.n_head_kv < 1 || a.kv.chunk_tokens < 1 || n_tokens > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((a.n_head + 2 * a.kv.n_head_kv + kPrepWarps - 1) / kPrepWarps),
                  static_cast<unsigned>(n_tokens));
  if (a.kv.dtype == DType::F16) {
    launch_kernel(attention_prep_kernel<__half>, grid, 32 * kPrepWarps, 0, s, a);
  } else if (a.kv.dtype == DType::F32) {
    launch_kernel(attention_prep_kernel<float>, grid, 32 * kPrepWarps, 0, s, a);
  } else if (a.kv.dtype == DType::Q8_0 && a.kv.head_dim % kern::kKvBlock == 0) {
    launch_kernel(attention_prep_kernel<kern::KvQ8>, grid, 32 * kPrepWarps, 0, s, a);
  } else if (a.kv.dtype == DType::Q4_0 && a.kv.head_dim % kern::kKvBlock == 0) {
    launch_kernel(attention_prep_kernel<kern::KvQ4>, grid, 32 * kPrepWarps, 0, s, a);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace ds::cuda
