// Declarations of the CUDA backend's op entry points. Compiles without CUDA: op dispatchers call
// these only when DS_HAVE_CUDA is defined and the context's device is CUDA. Each has the same
// contract as the public op of the same name (see the op headers).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/delta_net.h"
#include "ops/moe.h"
#include "ops/op_context.h"
#include "ops/top_k.h"

namespace ds::cuda {

Status matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y);
Status matmul_many(const OpContext& ctx, std::span<const TensorView> ws, const TensorView& x,
                   std::span<const TensorView> ys);
Status matmul_swiglu(const OpContext& ctx, const TensorView& w, const TensorView& gate, const TensorView& up,
                     const TensorView& y);
Status get_rows(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y);
Status rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y);
Status l2_norm(const OpContext& ctx, const TensorView& x, float eps, const TensorView& y);
Status rms_norm_gated(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z, float eps,
                      const TensorView& y);
Status add_rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w, float eps,
                    const TensorView& y);
Status rope_neox(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, int64_t pos0);
Status attention(const OpContext& ctx, const TensorView& q, std::span<const TensorView> k_chunks,
                 std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
                 const TensorView& o);
Status delta_net_gates(const OpContext& ctx, const TensorView& alpha, const TensorView& b,
                       const TensorView& dt_bias, const TensorView& ssm_a, const TensorView& g,
                       const TensorView& beta);
Status delta_net(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& g, const TensorView& beta, const TensorView& state,
                 const TensorView& out, DeltaNetMode mode);
Status delta_net_prep(const OpContext& ctx, const DeltaNetPrep& p);
Status conv1d_causal(const OpContext& ctx, const TensorView& x, const TensorView& w,
                     const TensorView& state, const TensorView& y);
Status conv1d_causal_silu(const OpContext& ctx, const TensorView& x, const TensorView& w,
                          const TensorView& state, const TensorView& y);
Status add(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y);
Status mul(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y);
Status silu(const OpContext& ctx, const TensorView& x, const TensorView& y);
Status sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& y);
Status swiglu(const OpContext& ctx, const TensorView& gate, const TensorView& up, const TensorView& y);
Status mul_sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& gate, const TensorView& y);
Status copy(const OpContext& ctx, const TensorView& src, const TensorView& dst);
Status moe_ffn(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
               const TensorView& weights, const TensorView& y);
Status moe_route(const OpContext& ctx, const TensorView& logits, int64_t k, const TensorView& ids,
                 const TensorView& weights);

// ---- The model's CUDA path: the position and the KV block table live on the device ----
// These entries never synchronize with the host and never allocate device memory, so a decode step
// made of them can be captured once as a CUDA graph and replayed: everything that changes from step to
// step (token ids, position, block table entries) is read from device memory at run time.

// One attention layer's view of a sequence's chunked KV: logical chunk c holds tokens
// [c * chunk_tokens, (c + 1) * chunk_tokens); its K starts at slot_base[c] + k_offset and its V at
// slot_base[c] + v_offset, each [chunk_tokens, n_head_kv, head_dim] of `dtype` (F32, F16, or Q8_0 blocks
// along head_dim, a multiple of 32).
struct KvTable {
  const void* const* slot_base = nullptr;  // device array, one entry per allocated chunk
  int64_t k_offset = 0;                    // bytes
  int64_t v_offset = 0;                    // bytes
  int64_t chunk_tokens = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  DType dtype = DType::F16;
};

// Writes k and v [head_dim, n_head_kv, n] (F32, contiguous) at positions [*d_pos, *d_pos + n) of the
// table, converted to its dtype (Q8_0: quant::quantize_row_q8_0's bits). The chunks for those positions
// must exist.
Status kv_append(const OpContext& ctx, const TensorView& k, const TensorView& v, const KvTable& kv,
                 const int32_t* d_pos);
// Causal GQA attention of q [head_dim, n_head, n] (F32) for positions [*d_pos, *d_pos + n) over the
// first *d_pos + n tokens of the table: o = softmax(scale q k^T) v, o like q. `max_kv` is a host-side
// upper bound of *d_pos + n that sizes the launch (a graph stays valid while the bound holds).
Status attention_paged(const OpContext& ctx, const TensorView& q, const KvTable& kv, const int32_t* d_pos,
                       int64_t max_kv, float scale, const TensorView& o);
// attention_paged, then o *= sigmoid(gate) (gate [head_dim, n_head, n], strided like a row_heads view),
// and act gets the int8 activations of o's [n, n_head * head_dim] rows for matmul_q8: the bits of
// attention_paged, mul_sigmoid and quantize_q8 in sequence, with two launches fewer. Needs
// attention_gated_q8_applies(head_dim); act holds norm_q8_act_bytes(n_head * head_dim, n) bytes.
bool attention_gated_q8_applies(int64_t head_dim);
Status attention_paged_gated_q8(const OpContext& ctx, const TensorView& q, const KvTable& kv, const int32_t* d_pos,
                                int64_t max_kv, float scale, const TensorView& gate, const TensorView& o,
                                const TensorView& act);
// The attention layer's prep in one kernel, for head_dim <= 256 (attention_prep_applies): q_heads [head_dim,
// n_head, n] (F32, rows contiguous, any head / token strides) RMS-normalized with q_norm and rotated into q
// (contiguous, same shape); k [head_dim, n_head_kv, n] normalized with k_norm and rotated in place; then k
// and v appended at [*d_pos, *d_pos + n) of the table. Rotation: NeoX over the first n_rot dims at the
// device position. The same bits as rms_norm, rms_norm, rope_neox_at, rope_neox_at and kv_append.
bool attention_prep_applies(int64_t head_dim);
Status attention_prep(const OpContext& ctx, const TensorView& q_heads, const TensorView& q_norm, const TensorView& k,
                      const TensorView& k_norm, const TensorView& v, float eps, int64_t n_rot, float base,
                      const KvTable& kv, const int32_t* d_pos, const TensorView& q);
// attention_prep, then attention_paged_gated_q8 on its q, with one kernel launch fewer (the prep is done
// by the attention kernel's CTAs): the same bits of q, k (into k_out, k's shape, not k: k is read only),
// the appended KV rows, o and act, except that one token under a bound max_kv <= 256 attends in one split
// (one CTA per query row), where attention_paged_gated_q8 may split the positions (another order of sums).
// Where attention_decode_q8_applies: F16 KV of head_dim 32, 64, 128 or 256 (Q8_0: 64, 128 or 256),
// n_tokens * n_head / n_head_kv <= 16 (the model's one-token decode), n_head_kv <= 256. Arguments as in the two entries.
bool attention_decode_q8_applies(DType kv_dtype, int64_t head_dim, int64_t n_head, int64_t n_head_kv,
                                 int64_t n_tokens);
Status attention_decode_q8(const OpContext& ctx, const TensorView& q_heads, const TensorView& q_norm,
                           const TensorView& k, const TensorView& k_norm, const TensorView& v, float eps,
                           int64_t n_rot, float base, const KvTable& kv, const int32_t* d_pos, int64_t max_kv,
                           float scale, const TensorView& gate, const TensorView& q, const TensorView& k_out,
                           const TensorView& o, const TensorView& act);
// The attention launch bound max_kv of a step whose last position is n_kv - 1 in a context of n_ctx:
// 256 up to there (attention_decode_q8 then takes one CTA per query row), then multiples of 1024. A
// captured decode graph is keyed on it, so a sequence is recaptured at 256 and every 1024 positions.
int64_t attention_launch_bound(int64_t n_kv, int64_t n_ctx);
// rope_neox with the first token's position read from device memory.
Status rope_neox_at(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, const int32_t* d_pos);
// The kTopKMax best values of the contiguous F32 row x (ops/top_k.h) into *out, device memory; scratch:
// at least (n + 127) / 128 floats of device memory. Asynchronous on the context's stream.
Status top_k(const OpContext& ctx, const TensorView& x, const TensorView& scratch, TopKResult* out);
// get_rows whose ids the caller has already validated (no copy to the host).
Status get_rows_trusted(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y);
// moe_ffn for few tokens (n_tokens * k <= kMoeGatheredMaxSlots): every (token, slot) pair reads its
// expert id from `ids` on the device and multiplies with that expert's rows (gathered matrix-vector
// products), so the step needs no host round trip. Same contract as moe_ffn otherwise.
constexpr int64_t kMoeGatheredMaxSlots = 64;
Status moe_ffn_gathered(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
                        const TensorView& weights, const TensorView& y);
// moe_ffn for many tokens: the pairs are grouped per expert on the device and each expert's weights are
// read once per tile of up to tile_m of its pairs by tensor-core products (activations and weights
// rounded to BF16, F32 sums, as the dense prefill GEMM); no host round trip. Takes the expert stacks
// moe_ffn_grouped_takes accepts (F16, BF16 and quantized types; the CUDA moe_ffn runs F32 experts with
// F32 products); kUnsupported otherwise. Same contract as moe_ffn otherwise; slots with ids outside
// [0, n_expert) are unused. tile_m: 0 picks by the pairs per expert (moe_group_tile_m), else
// a size moe_group_tile_m_valid accepts (moe_launch.h); every tile size gives the same bits.
bool moe_ffn_grouped_takes(const TensorView& x, const MoeExperts& experts);
Status moe_ffn_grouped(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
                       const TensorView& weights, const TensorView& y, int tile_m = 0);

// ---- Activations quantized by the op that produces them ----
// A norm whose output feeds only int8-activation products can write those activations itself (one
// kernel less per product input). `act` is a device byte buffer of norm_q8_act_bytes(n, rows) bytes
// (16-byte aligned: the products' activation scratch, matvec_q8_act_bytes), filled with the q8
// activations of y exactly as the products' own quantizer would write them (bit for bit); y is written
// as well. Needs norm_q8_applies(n).
bool norm_q8_applies(int64_t n);
int64_t norm_q8_act_bytes(int64_t n, int64_t rows);
Status rms_norm_q8(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                   const TensorView& act);
Status add_rms_norm_q8(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w,
                       float eps, const TensorView& y, const TensorView& act);
Status rms_norm_gated_q8(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z,
                         float eps, const TensorView& y, const TensorView& act);
// delta_net (recurrent form) then rms_norm_gated_q8(out, w, z, eps, y, act) in one kernel, with the same
// bits of out, state, y and act, where delta_net_gated_q8_applies (the register-state recurrent kernel's
// shapes with dk <= 128 and dv <= 128, rows of a multiple of 32).
bool delta_net_gated_q8_applies(const TensorView& q, const TensorView& v, const TensorView& state,
                                const TensorView& out);
Status delta_net_gated_q8(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& g, const TensorView& beta, const TensorView& state, const TensorView& out,
                          const TensorView& w, const TensorView& z, float eps, const TensorView& y,
                          const TensorView& act);
// delta_net_prep (p, one token) then delta_net_gated_q8 (q, k, g, beta from p; v the v channels of p.conv,
// delta_net_conv_heads(p.conv, 2 nk dk, dv, nv)) in one kernel, with the bits of the two ops in every
// output, where delta_net_step_q8_applies (one token, delta_net_gated_q8's shapes, conv channels exactly
// q, k and v, nv / nk <= 8, a GPU with thread-block clusters). It reads the SSM state and p.conv_state
// before the previous kernel on the stream completes: that kernel must not write them (the model runs
// it right after the layer's input products).
bool delta_net_step_q8_applies(const DeltaNetPrep& p, const TensorView& state, const TensorView& out);
Status delta_net_step_q8(const OpContext& ctx, const DeltaNetPrep& p, const TensorView& state, const TensorView& out,
                         const TensorView& w, const TensorView& z, float eps, const TensorView& y,
                         const TensorView& act);
// matmul_many / matmul whose int8-activation products read `act`, the q8 activations of x written by
// one of the norms above (the caller guarantees they are x's: same values, same k and token count);
// products the q8 kernel does not take read x.
Status matmul_many_q8(const OpContext& ctx, std::span<const TensorView> ws, const TensorView& x,
                      const TensorView& act, std::span<const TensorView> ys);
Status matmul_q8(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& act,
                 const TensorView& y);

// The weights of a qwen35moe FFN block for moe_block_decode (device tensors).
struct MoeBlockWeights {
  TensorView router;      // {n_embd, n_expert} F32
  MoeExperts experts;     // gate + up or gate_up {n_embd, .., n_expert}, down {n_ff, n_embd, n_expert}
  TensorView shexp_gate;  // {n_embd} or {n_embd, 1} F32: one logit per token
  TensorView gate_shexp;  // {n_embd, n_ff}: the shared expert, n_ff as the routed experts'
  TensorView up_shexp;    // {n_embd, n_ff}
  TensorView down_shexp;  // {n_ff, n_embd}
};
// The whole MoE FFN of a decode step in four or five launches, no host round trip (capturable):
//   logits = router x; ids, weights = moe_route(logits, k)   (also written to `ids`, `weights`)
//   y = sum_j weights_j down_j(silu(gate_j x) * up_j x) + sigmoid(shexp_gate . x) * shared(x)
// x, y [n_tokens, n_embd] F32 contiguous (y must not alias x); ids I32 / weights F32 [n_tokens, k].
// Applies when moe_block_decode_check is ok: n_tokens * k <= kMoeGatheredMaxSlots, F32 router and
// shexp_gate, every projection of a type with an int8-activation kernel (q4_0, q5_0, q8_0, q4_K, q5_K,
// q6_K; gate and up of one type, shared gate and up of one type), shared n_ff = routed n_ff, 16-byte
// aligned weights; kUnsupported otherwise (the caller runs the op chain).
Status moe_block_decode_check(const MoeBlockWeights& w, int64_t n_tokens, int64_t k);
Status moe_block_decode(const OpContext& ctx, const TensorView& x, const MoeBlockWeights& w, int64_t k,
                        const TensorView& ids, const TensorView& weights, const TensorView& y);
// The block's input as the residual add and norm before it (add_rms_norm(res, delta, norm_w, eps)).
struct MoeBlockAddNorm {
  TensorView res;     // [n_embd, n_tokens] F32 contiguous: the residual stream, res += delta
  TensorView delta;   // [n_embd, n_tokens] F32 contiguous
  TensorView norm_w;  // [n_embd] F32
  float eps = 0.0f;
};
// add_rms_norm(res, delta, norm_w, eps) into x, then moe_block_decode(x), with the same bits of res, ids,
// weights and y, and no x to allocate: for one to a few tokens the block's router kernel computes the
// norm itself (one launch less a MoE layer); otherwise the norm runs first into the block's scratch.
// y may alias delta (the layer's FFN output over its mixer output), not res. Applies as moe_block_decode.
Status moe_block_decode_add_norm(const OpContext& ctx, const MoeBlockAddNorm& in, const MoeBlockWeights& w, int64_t k,
                                 const TensorView& ids, const TensorView& weights, const TensorView& y);
// Where moe_block_decode routes (same bits either way): in the gate/up products' CTAs (the default, where
// moe_gate_up_routed_fits and the down products run with their sum in one launch), or in the router
// kernel's last CTA. A process-wide switch for tests.
void set_moe_block_route_in_products(bool on);

}  // namespace ds::cuda
