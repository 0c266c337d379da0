// Launchers of the CUDA kernels of the model's attention path (defined in ops/cuda/attention.cu, and the
// device-position RoPE in ops/cuda/ops_kernels.cu), called by the host entries in
// ops/cuda/cuda_attention.cpp and by the workbench kernels/attention_bench.cu. Needs the CUDA runtime
// headers: include only under DS_HAVE_CUDA. The host entries validate arguments; launchers only check
// the kernel limits they rely on and return the launch error.
// Non-obvious choice: paged attention is planned in two steps (attention_paged_plan, then
// attention_paged_launch) so the caller can allocate the split scratch from its own allocator and the
// workbench can force a path; the plan depends only on host values (shapes, max_kv, the device), never
// on the position, so a captured CUDA graph stays valid while those hold.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ds::cuda {

// The KV chunks of one attention layer: logical chunk c holds tokens [c * chunk_tokens, (c + 1) *
// chunk_tokens); its K rows start at k_base[c] + k_offset, its V rows at v_base[c] + v_offset, each
// [chunk_tokens, n_head_kv, head_dim] of dtype (F32 or F16). k_base / v_base are device arrays; the
// KvTable form passes the same slot array for both. Chunk bases must be 16-byte aligned.
struct PagedKvArgs {
  const uint8_t* const* k_base = nullptr;
  const uint8_t* const* v_base = nullptr;
  int64_t k_offset = 0;  // bytes
  int64_t v_offset = 0;  // bytes
  DType dtype = DType::F16;
  int32_t chunk_tokens = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
};

// Causal GQA attention of q [n_tokens, n_head, head_dim] (F32) at positions [pos0, pos0 + n_tokens)
// over the first pos0 + n_tokens positions of kv; o like q. pos0 = *d_pos when d_pos is not null
// (read on the device), else pos0_host. Scores are scale * q.k.
struct AttnPagedArgs {
  const float* q = nullptr;
  float* o = nullptr;
  PagedKvArgs kv;
  int32_t n_head = 0;
  int32_t n_tokens = 0;
  const int32_t* d_pos = nullptr;
  int32_t pos0_host = 0;
  int64_t max_kv = 0;        // host bound of pos0 + n_tokens (sizes the split count)
  float scale = 1.0f;
  float* scratch = nullptr;  // AttnPlan::scratch_bytes of device memory when n_split > 1
  // Optional output gate: o = o * sigmoid(gate) (gate of head h of token t at gate + t * gate_ts + h *
  // gate_hs, head_dim contiguous), and q8 (matvec_q8_act_bytes(n_head * head_dim, n_tokens) bytes,
  // 16-byte aligned) gets the int8 activations of o's rows, the bits of quantize_q8. Needs head_dim a
  // multiple of 32; the kernel that writes the final rows applies it (the attention kernel with one
  // split, else the combine kernel).
  const float* gate = nullptr;
  int64_t gate_hs = 0;
  int64_t gate_ts = 0;
  void* q8 = nullptr;
};

enum class AttnPath : int {
  kAuto,        // tensor cores when the shape allows, else SIMT
  kTensorCore,  // F16 KV, head_dim in {32, 64, 128, 256}, or Q8_0 in {64, 128, 256}: mma.sync m16n8k16
  kSimt,        // any dtype (F32 / F16 / Q8_0), head_dim <= kAttnMaxHeadDim: F32 FMA
};

constexpr int kAttnMaxHeadDim = 512;

struct AttnPlan {
  AttnPath path = AttnPath::kSimt;
  int rows_per_cta = 0;        // packed (token, head-in-group) rows per CTA
  int64_t n_row_blocks = 0;    // grid y (x = KV head)
  int n_split = 1;             // grid z: KV ranges per (row block, kv head), merged by a second kernel
  int64_t scratch_bytes = 0;   // 0 when n_split == 1
};

// Chooses the kernel and the split count. cudaErrorInvalidValue: a forced path the shape does not
// allow, head_dim > kAttnMaxHeadDim, or more than 65535 row blocks (about 500K query tokens).
cudaError_t attention_paged_plan(const AttnPagedArgs& a, AttnPath force, int device, AttnPlan* plan);
// Runs the plan on stream s (a plan made on the same device: planning configures the kernel): the
// attention kernel, then (n_split > 1) the combine kernel.
cudaError_t attention_paged_launch(const AttnPagedArgs& a, const AttnPlan& plan, cudaStream_t s);

// Writes k, v [n_tokens, n_head_kv, head_dim] (F32, contiguous) at positions [*d_pos, *d_pos + n_tokens)
// of kv (converted to its dtype, round to nearest even for F16).
cudaError_t kv_append_launch(const float* k, const float* v, const PagedKvArgs& kv, const int32_t* d_pos,
                             int64_t n_tokens, cudaStream_t s);

// The fused attention prep of n_tokens tokens at positions [*d_pos, *d_pos + n_tokens): per head, q
// (read through q_in's strides) and k RMS-normalized with q_norm / k_norm, the first n_rot dims of each
// rotated (NeoX), q written to q, k back in place, then k and v appended to kv as kv_append does. The same
// bits as norm, rope_neox_at and kv_append launched in sequence. head_dim <= kAttnPrepMaxHeadDim.
constexpr int kAttnPrepMaxHeadDim = 256;
struct AttnPrepArgs {
  const float* q_in = nullptr;  // q head h of token t: q_in + t * q_ts + h * q_hs, head_dim contiguous
  int64_t q_hs = 0;
  int64_t q_ts = 0;
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;  // [head_dim]
  float* q = nullptr;             // [n_tokens, n_head, head_dim]
  float* k = nullptr;             // [n_tokens, n_head_kv, head_dim], normalized and rotated in place
  const float* v = nullptr;       // [n_tokens, n_head_kv, head_dim]
  PagedKvArgs kv;
  int32_t n_head = 0;
  int32_t n_rot = 0;
  double log2_base = 0.0;
  float eps = 0.0f;
  const int32_t* d_pos = nullptr;
};
cudaError_t attention_prep_launch(const AttnPrepArgs& a, int64_t n_tokens, cudaStream_t s);

// The attention layer's decode in one launch: attention_prep_launch, then attention_paged_launch with
// the output gate and q8 activations. Each CTA preps the query rows it attends with and appends the new
// positions its split holds; with more than one split attn_combine_kernel follows (a second launch).
// Same bits as the two in sequence for q, k (into k_out), the appended KV rows, o and the activations. Fits where
// attention_decode_fits: F16 KV of head_dim 32, 64, 128 or 256, or Q8_0 of 64, 128 or 256, within the
// device's shared memory, at most 16 query rows per KV head (n_tokens * n_head / n_head_kv), n_head_kv <=
// kAttnDecodeMaxKvHeads.
// A plan for one token under a launch bound (attn.max_kv) of at most kAttnDecodeRowMaxKv takes one CTA
// per query row and one split (no combine launch): a short context's prep and attention spread over
// n_head CTAs instead of one row block per KV head. The same bits as the row-block plan of one split.
constexpr int kAttnDecodeMaxKvHeads = 256;
constexpr int64_t kAttnDecodeRowMaxKv = 256;
struct AttnDecodeArgs {
  // Read from prep: q_in, q_hs, q_ts, q_norm, k_norm, q (the prepared q out), k (read only), v, n_rot,
  // log2_base, eps. Everything else (KV, head counts, position) from attn, whose gate and q8 are required
  // and whose q is not read.
  AttnPrepArgs prep;
  AttnPagedArgs attn;
  float* k_out = nullptr;  // [n_tokens, n_head_kv, head_dim]: prep.k normalized and rotated; not prep.k
};
bool attention_decode_fits(DType kv_dtype, int head_dim, int n_head, int n_head_kv, int n_tokens);
// cudaErrorNotSupported where attention_decode_fits does not hold (or the K/V offsets are not 16-byte
// aligned).
cudaError_t attention_decode_plan(const AttnPagedArgs& a, int device, AttnPlan* plan);
cudaError_t attention_decode_launch(const AttnDecodeArgs& a, const AttnPlan& plan, cudaStream_t s);

// rope_neox_launch (ops_launch.h) with the first token's position read from d_pos on the device.
cudaError_t rope_neox_at_launch(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                                float base, const int32_t* d_pos, cudaStream_t s);

}  // namespace ds::cuda
