// Launchers of the gated DeltaNet kernels (ops/cuda/delta_net.cu), called by the host entry delta_net in
// ops/cuda/cuda_ops.cpp after the op dispatcher validated shapes (ops/delta_net.h). Needs the CUDA
// runtime headers: include only under DS_HAVE_CUDA. Launchers return the launch error only; the
// *_fast / *_chunked_ok predicates say which kernel a shape and alignment can take.
// Non-obvious choice: the chunked form runs in windows of kDeltaNetWindowTokens tokens (one prep and
// one scan launch each), so its scratch is bounded by the window, not by n_tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/ops_launch.h"

namespace ds::cuda {

// One delta_net call: q, k [n_tokens, nk, dk]; v, out [n_tokens, nv, dv]; g, beta [n_tokens, nv];
// state [nv, dk, dv] read and written. All F32, device memory, contiguous except v, whose head and
// token strides may be given (a view of the conv output rows).
struct DeltaNetArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  float* state = nullptr;
  float* out = nullptr;
  int64_t dk = 0, nk = 0, dv = 0, nv = 0, n_tokens = 0;
  int64_t v_head_stride = 0;   // elements between v's heads; 0 = dv (contiguous)
  int64_t v_token_stride = 0;  // elements between v's tokens; 0 = nv * dv (contiguous)
};

constexpr int64_t kDeltaNetChunk = 64;              // tokens per chunk, as in the CPU chunked form
constexpr int64_t kDeltaNetWindowTokens = 16 * 64;  // tokens per prep + scan launch pair
// kAuto: chunked from here. H100, 27B layer shape: recurrent 58 us vs chunked 65 us at 64 tokens, 212 vs
// 153 us at 256 (kernels/delta_net_bench.cu).
constexpr int64_t kDeltaNetChunkedMinTokens = 96;
constexpr int64_t kDeltaNetMaxHeads = 65535;        // nv is a grid dimension
constexpr int64_t kDeltaNetGenericMaxDk = 6144;     // generic recurrent kernel: q and k rows in 48 KB smem

// The recurrent kernel with the state in registers: dk in {32, 64, 128, 256}, dv % 32 == 0, state,
// v and out 16-byte aligned, v's strides multiples of 4 elements. Other shapes take the generic recurrent kernel (state in device memory).
bool delta_net_recurrent_fast(const DeltaNetArgs& a);
// The chunked kernels: dk in {32, 64, 128}, dv % 32 == 0, q and k 16-byte aligned, and their shared memory
// within the device's opt-in limit (smem_optin_limit: dk 128 needs 110 KB, more than sm_86 / sm_89 have).
bool delta_net_chunked_ok(const DeltaNetArgs& a);
// Scratch of the chunked form (bytes) for this call: per chunk and v-head of one window, T diag(beta)
// and the masked decayed scale * Q K^T [64 x 64] and the cumulative log decays [64].
int64_t delta_net_chunked_scratch_bytes(const DeltaNetArgs& a);

// The DeltaNet output norm fused into the recurrence (delta_net_norm_q8_launch): per (token, v-head) row
// of o [n_tokens, nv, dv], y = RMSNorm(o; w) * silu(z) (w [dv], z like o) and y's q8 activations
// (q8 codes [n_tokens * nv * dv], then float2 (d, d * sum) per 32 at q8_ds), as rms_norm_gated_q8.
constexpr int64_t kDeltaNetNormQ8MaxDv = 128;
struct DeltaNetNormQ8 {
  const float* w = nullptr;
  const float* z = nullptr;
  float eps = 0.0f;
  float* y = nullptr;
  int8_t* q8 = nullptr;
  float2* q8_ds = nullptr;
};
// The fused form takes the fast recurrent shapes with dk <= 128 and dv <= kDeltaNetNormQ8MaxDv.
bool delta_net_norm_q8_fused(const DeltaNetArgs& a);
// The recurrence (as delta_net_recurrent_launch, same bits of out and state) and then each token's
// output norm (the bits of rms_norm_gated_q8 on out), one launch; requires delta_net_norm_q8_fused(a).
cudaError_t delta_net_norm_q8_launch(const DeltaNetArgs& a, const DeltaNetNormQ8& nq, cudaStream_t s);

// One token's whole DeltaNet core in one launch (delta_net_step_q8_launch): delta_net_prep (p, the conv
// channels exactly q, k and v: n_ch = 2 nk dk + nv dv) in front of delta_net_norm_q8_launch (a, whose q, k,
// g and beta are p's outputs and whose v is the v channels of p.conv), with the bits of the two launches
// in every output (conv, q, k, g, beta, conv_state, out, state, y, q8). One thread-block cluster of
// nv / nk CTAs per q/k head (at most kDeltaNetStepMaxCluster, the portable cluster size), so it needs
// cluster_launch_enabled(). The kernel reads the SSM state and the carried conv inputs before waiting
// for the previous kernel of the stream (launch.cuh): that kernel must not write them (in the model it
// is the layer's input product; two steps of one layer never run back to back).
constexpr int64_t kDeltaNetStepMaxCluster = 8;
bool delta_net_step_q8_fits(const DeltaNetPrepArgs& p, const DeltaNetArgs& a);
cudaError_t delta_net_step_q8_launch(const DeltaNetPrepArgs& p, const DeltaNetArgs& a, const DeltaNetNormQ8& nq,
                                     cudaStream_t s);

// Token-by-token recurrence over all n_tokens (fast or generic kernel). Allocates nothing and never
// synchronizes: safe inside CUDA graph capture.
cudaError_t delta_net_recurrent_launch(const DeltaNetArgs& a, cudaStream_t s);
// Chunked form; requires delta_net_chunked_ok(a) and `scratch` of delta_net_chunked_scratch_bytes(a)
// bytes, 16-byte aligned, which the launches use in stream order.
cudaError_t delta_net_chunked_launch(const DeltaNetArgs& a, float* scratch, cudaStream_t s);

}  // namespace ds::cuda
