// Host entries of the CUDA backend for every op in ops/cuda/cuda_ops.h: the op dispatchers have checked
// shapes, dtypes and devices; these check what only the CUDA path needs (ids in range, kernel limits),
// launch on the context's stream and turn CUDA errors into a Status naming the op and shapes.
// Compiled by the C++ compiler; empty without DS_HAVE_CUDA.
// Non-obvious choice: get_rows copies its small index tensor to the host (a stream synchronization) to
// report a bad id as a Status; so does moe_ffn for F32 experts only, to group tokens per expert on the
// host. Everything else is asynchronous (moe_ffn groups on the device: moe_ffn_grouped).
#if DS_HAVE_CUDA

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_registry.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_matmul.h"
#include "ops/cuda/delta_net_launch.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/matvec_q8_args.h"
#include "ops/cuda/ops_launch.h"
#include "ops/cuda/top_k_launch.h"
#include "ops/op_registry.h"
#include "ops/rms_norm.h"

namespace ds::cuda {
namespace {

cudaStream_t stream_of(const OpContext& ctx) { return static_cast<cudaStream_t>(ctx.cuda_stream); }
float* f32(const TensorView& t) { return t.as<float>(); }

// Debug builds: every operand must be device (or managed) memory. Host memory labelled as a CUDA
// tensor would otherwise fault inside a kernel and leave the context unusable. Release builds skip
// the check (one driver call per operand per op).
Status check_device_memory(const char* op, std::initializer_list<const TensorView*> ts) {
#ifndef NDEBUG
  for (const TensorView* t : ts) {
    if (t->data == nullptr || t->n_elements() == 0) continue;
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, t->data);
    if (e != cudaSuccess) (void)cudaGetLastError();
    if (e != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
      return invalid_argument("{}: operand {} on {} is not device memory", op, t->shape_string(),
                              t->device.to_string());
    }
  }
#else
  (void)op;
  (void)ts;
#endif
  return Status::ok();
}

// Copies n int32 from device memory to the host (synchronizes the stream).
Status ids_to_host(const OpContext& ctx, const TensorView& ids, int64_t n, std::vector<int32_t>* out,
                   const char* op) {
  out->resize(static_cast<size_t>(n));
  DS_CUDA_TRY(cudaMemcpyAsync(out->data(), ids.data, static_cast<size_t>(4 * n), cudaMemcpyDeviceToHost,
                              stream_of(ctx)),
              "{}: ids {}", op, ids.shape_string());
  DS_CUDA_TRY(cudaStreamSynchronize(stream_of(ctx)), "{}: ids {}", op, ids.shape_string());
  return Status::ok();
}

Status elt(const OpContext& ctx, const char* op, EltKind kind, const TensorView& a, const TensorView* b,
           const TensorView& y, bool b_per_row = false, int64_t b_row_stride = 0) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory(op, {&a, b ? b : &a, &y}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(eltwise_launch(kind, f32(a), b ? f32(*b) : nullptr, f32(y), y.n_elements(), y.ne[0], b_per_row,
                             stream_of(ctx), b_row_stride),
              "{} {}", op, y.shape_string());
  return Status::ok();
}

// The rows of x (contiguous rows, dims 1..3 strided; the op dispatchers checked the strides).
RowMap row_map(const TensorView& x) { return RowMap{x.ne[1], x.ne[2], x.nb[1] / 4, x.nb[2] / 4, x.nb[3] / 4}; }

Status row_norm(const OpContext& ctx, const char* op, const TensorView& x, const TensorView* w, const TensorView* z,
            float eps, bool l2, const TensorView& y, const TensorView* r = nullptr, const TensorView* act = nullptr) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory(op, {&x, w ? w : &x, z ? z : &x, r ? r : &x, &y, act ? act : &x}));
  if (x.n_rows() > INT32_MAX) return unsupported("{}: x {}: more than 2^31 - 1 rows on CUDA", op, x.shape_string());
  if (act != nullptr) {
    if (!norm_q8_fits(x.ne[0]) || !y.is_contiguous()) {
      return invalid_argument("{}: q8 activations for y {}: need rows of a multiple of 32 up to 8192 and contiguous y",
                              op, y.shape_string());
    }
    DS_TRY(check_q8_act(op, *act, x.ne[0], x.n_rows()));
  }
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(norm_launch(f32(x), row_map(x), w ? f32(*w) : nullptr, z ? f32(*z) : nullptr, f32(y), x.ne[0],
                          x.n_rows(), eps, l2, stream_of(ctx), r ? f32(*r) : nullptr, act ? act->data : nullptr),
              "{} x {} (strides {}, {}, {})", op, x.shape_string(), x.nb[1], x.nb[2], x.nb[3]);
  return Status::ok();
}

DeltaNetArgs dn_args(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                     const TensorView& beta, const TensorView& state, const TensorView& out) {
  return DeltaNetArgs{f32(q),  f32(k),  f32(v),  f32(g),  f32(beta), f32(state), f32(out), q.ne[0],
                      q.ne[1], v.ne[0], v.ne[1], q.ne[2], v.nb[1] / 4, v.nb[2] / 4};
}

// The v heads the step reads: the conv channels after q and k.
TensorView step_v(const DeltaNetPrep& p, const TensorView& out) {
  return delta_net_conv_heads(p.conv, 2 * p.q.ne[0] * p.q.ne[1], out.ne[0], out.ne[1]);
}
DeltaNetPrepArgs prep_args(const DeltaNetPrep& p) {
  return DeltaNetPrepArgs{f32(p.mixed), f32(p.conv_w), f32(p.conv_state), f32(p.conv), f32(p.q), f32(p.k),
                          f32(p.alpha), f32(p.b), f32(p.dt_bias), f32(p.ssm_a), f32(p.g), f32(p.beta),
                          p.mixed.ne[0], p.q.ne[0], p.q.ne[1], p.alpha.ne[0], static_cast<int>(p.conv_w.ne[0]),
                          p.eps};
}
// The step kernel's conditions that its launch arguments do not carry: one token, conv channels exactly
// q, k and v, an output norm row the q8 store takes. (delta_net_step_q8_fits checks the rest, the fused
// recurrence's shapes included.)
bool step_q8_shape(const DeltaNetPrep& p, const TensorView& out) {
  const int64_t dv = out.ne[0], nv = out.ne[1];
  return p.mixed.ne[1] == 1 && p.mixed.ne[0] == 2 * p.q.ne[0] * p.q.ne[1] + nv * dv && p.q.ne[1] > 0 &&
         norm_q8_fits(dv);
}

// The output norm operands of the fused DeltaNet kernels (y and the q8 activations of out's rows),
// after checking y and the q8 buffer.
Result<DeltaNetNormQ8> gated_norm_args(const char* op, const TensorView& out, const TensorView& w,
                                       const TensorView& z, float eps, const TensorView& y, const TensorView& act) {
  const int64_t dv = out.ne[0], rows = out.n_rows();
  if (!y.is_contiguous() || y.data == out.data) {
    return invalid_argument("{}: y {} must be contiguous and apart from out", op, y.shape_string());
  }
  DS_TRY(check_q8_act(op, act, dv, rows));
  DeltaNetNormQ8 nq;
  nq.w = f32(w);
  nq.z = f32(z);
  nq.eps = eps;
  nq.y = f32(y);
  nq.q8 = static_cast<int8_t*>(act.data);
  nq.q8_ds = reinterpret_cast<float2*>(static_cast<uint8_t*>(act.data) + kern::q8_ds_offset(dv, rows));
  return nq;
}

}  // namespace

Status matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y) {
  DS_TRY(check_device_memory("matmul", {&w, &x, &y}));
  return matmul_on(w, x, y, ctx.device.index, ctx.cuda_stream);
}

Status matmul_many(const OpContext& ctx, std::span<const TensorView> ws, const TensorView& x,
                   std::span<const TensorView> ys) {
  DS_TRY(check_device_memory("matmul_many", {&x}));
  for (size_t i = 0; i < ws.size() && i < ys.size(); ++i) {
    DS_TRY(check_device_memory("matmul_many", {&ws[i], &ys[i]}));
  }
  return matmul_many_on(ws, x, ys, ctx.device.index, ctx.cuda_stream);
}

Status matmul_swiglu(const OpContext& ctx, const TensorView& w, const TensorView& gate, const TensorView& up,
                     const TensorView& y) {
  DS_TRY(check_device_memory("matmul_swiglu", {&w, &gate, &up, &y}));
  return matmul_swiglu_on(w, gate, up, y, ctx.device.index, ctx.cuda_stream);
}

Status get_rows(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory("get_rows", {&table, &ids, &y}));
  if (!matmul_supported(table.dtype)) {
    return unsupported("get_rows: table {}: dtype {} is not supported on CUDA", table.shape_string(),
                       dtype_name(table.dtype));
  }
  DeviceGuard guard(ctx.device.index);
  const int64_t n_tokens = ids.n_elements();
  std::vector<int32_t> host;
  DS_TRY(ids_to_host(ctx, ids, n_tokens, &host, "get_rows"));
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (host[t] < 0 || host[t] >= table.ne[1]) {
      return invalid_argument("get_rows: ids[{}] = {} is outside the table {}", t, host[t], table.shape_string());
    }
  }
  DS_CUDA_TRY(get_rows_launch(table.dtype, table.data, table.nb[1], table.ne[0], ids.as<int32_t>(), n_tokens, f32(y),
                              stream_of(ctx)),
              "get_rows table {} ids {}", table.shape_string(), ids.shape_string());
  return Status::ok();
}

Status rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y) {
  return row_norm(ctx, "rms_norm", x, &w, nullptr, eps, false, y);
}

Status l2_norm(const OpContext& ctx, const TensorView& x, float eps, const TensorView& y) {
  return row_norm(ctx, "l2_norm", x, nullptr, nullptr, eps, true, y);
}

Status rms_norm_gated(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z, float eps,
                      const TensorView& y) {
  return row_norm(ctx, "rms_norm_gated", x, &w, &z, eps, false, y);
}

Status add_rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w, float eps,
                    const TensorView& y) {
  return row_norm(ctx, "add_rms_norm", x, &w, nullptr, eps, false, y, &r);
}

bool norm_q8_applies(int64_t n) { return norm_q8_fits(n); }
int64_t norm_q8_act_bytes(int64_t n, int64_t rows) { return matvec_q8_act_bytes(n, rows); }

Status rms_norm_q8(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                   const TensorView& act) {
  DS_TRY(rms_norm_check(ctx, x, w, y));
  return row_norm(ctx, "rms_norm_q8", x, &w, nullptr, eps, false, y, nullptr, &act);
}

Status add_rms_norm_q8(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w,
                       float eps, const TensorView& y, const TensorView& act) {
  DS_TRY(add_rms_norm_check(ctx, x, r, w, y));
  return row_norm(ctx, "add_rms_norm_q8", x, &w, nullptr, eps, false, y, &r, &act);
}

Status rms_norm_gated_q8(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z,
                         float eps, const TensorView& y, const TensorView& act) {
  DS_TRY(rms_norm_gated_check(ctx, x, w, z, y));
  return row_norm(ctx, "rms_norm_gated_q8", x, &w, &z, eps, false, y, nullptr, &act);
}

bool delta_net_gated_q8_applies(const TensorView& q, const TensorView& v, const TensorView& state,
                                const TensorView& out) {
  const DeltaNetArgs a = dn_args(q, q, v, q, q, state, out);  // the predicate reads shapes and these pointers
  return norm_q8_fits(v.ne[0]) && delta_net_norm_q8_fused(a);
}

Status delta_net_gated_q8(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& g, const TensorView& beta, const TensorView& state, const TensorView& out,
                          const TensorView& w, const TensorView& z, float eps, const TensorView& y,
                          const TensorView& act) {
  constexpr const char* op = "delta_net_gated_q8";
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(delta_net_check(ctx, q, k, v, g, beta, state, out).with_context(op));
  DS_TRY(rms_norm_gated_check(ctx, out, w, z, y).with_context(op));
  DS_TRY(check_device_memory(op, {&q, &k, &v, &g, &beta, &state, &out, &w, &z, &y, &act}));
  if (!delta_net_gated_q8_applies(q, v, state, out)) {
    return unsupported("{}: q {} v {} (strides {}, {}): not a shape of the fused kernel", op, q.shape_string(),
                       v.shape_string(), v.nb[1], v.nb[2]);
  }
  DS_ASSIGN_OR_RETURN(const DeltaNetNormQ8 nq, gated_norm_args(op, out, w, z, eps, y, act));
  if (q.ne[2] == 0) return Status::ok();
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(delta_net_norm_q8_launch(dn_args(q, k, v, g, beta, state, out), nq, stream_of(ctx)),
              "{} q {} v {} state {}", op, q.shape_string(), v.shape_string(), state.shape_string());
  return Status::ok();
}

bool delta_net_step_q8_applies(const DeltaNetPrep& p, const TensorView& state, const TensorView& out) {
  return step_q8_shape(p, out) &&
         delta_net_step_q8_fits(prep_args(p), dn_args(p.q, p.k, step_v(p, out), p.g, p.beta, state, out));
}

Status delta_net_step_q8(const OpContext& ctx, const DeltaNetPrep& p, const TensorView& state, const TensorView& out,
                         const TensorView& w, const TensorView& z, float eps, const TensorView& y,
                         const TensorView& act) {
  constexpr const char* op = "delta_net_step_q8";
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(delta_net_prep_check(ctx, p).with_context(op));
  if (out.ne[0] < 1 || out.ne[1] < 1 || 2 * p.q.ne[0] * p.q.ne[1] + out.ne[1] * out.ne[0] != p.mixed.ne[0]) {
    return invalid_argument("{}: out {} and q {} do not split the {} conv channels into q, k and v", op,
                            out.shape_string(), p.q.shape_string(), p.mixed.ne[0]);
  }
  const TensorView v = step_v(p, out);
  DS_TRY(delta_net_check(ctx, p.q, p.k, v, p.g, p.beta, state, out).with_context(op));
  DS_TRY(rms_norm_gated_check(ctx, out, w, z, y).with_context(op));
  DS_TRY(check_device_memory(op, {&p.mixed, &p.conv_w, &p.alpha, &p.b, &p.dt_bias, &p.ssm_a, &p.conv_state, &p.conv,
                                  &p.q, &p.k, &p.g, &p.beta, &state, &out, &w, &z, &y, &act}));
  const DeltaNetPrepArgs pa = prep_args(p);
  const DeltaNetArgs da = dn_args(p.q, p.k, v, p.g, p.beta, state, out);
  if (!step_q8_shape(p, out) || !delta_net_step_q8_fits(pa, da)) {
    return unsupported("{}: mixed {} q {} out {}: not a shape of the fused kernel on this device", op,
                       p.mixed.shape_string(), p.q.shape_string(), out.shape_string());
  }
  DS_ASSIGN_OR_RETURN(const DeltaNetNormQ8 nq, gated_norm_args(op, out, w, z, eps, y, act));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(delta_net_step_q8_launch(pa, da, nq, stream_of(ctx)),
              "{} mixed {} q {} state {}", op, p.mixed.shape_string(), p.q.shape_string(), state.shape_string());
  return Status::ok();
}

Status matmul_many_q8(const OpContext& ctx, std::span<const TensorView> ws, const TensorView& x,
                      const TensorView& act, std::span<const TensorView> ys) {
  DS_TRY(check_device_memory("matmul_many_q8", {&x, &act}));
  for (size_t i = 0; i < ws.size() && i < ys.size(); ++i) {
    DS_TRY(check_device_memory("matmul_many_q8", {&ws[i], &ys[i]}));
  }
  return matmul_many_on(ws, x, ys, ctx.device.index, ctx.cuda_stream, MatmulPath::kAuto, &act);
}

Status matmul_q8(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& act,
                 const TensorView& y) {
  const TensorView ws[] = {w};
  const TensorView ys[] = {y};
  return matmul_many_q8(ctx, ws, x, act, ys);
}

Status rope_neox(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, int64_t pos0) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory("rope_neox", {&x}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(rope_neox_launch(f32(x), x.ne[0], x.ne[1], x.ne[2], n_rot, base, pos0, stream_of(ctx)),
              "rope_neox x {} n_rot {}", x.shape_string(), n_rot);
  return Status::ok();
}

Status top_k(const OpContext& ctx, const TensorView& x, const TensorView& scratch, TopKResult* out) {
  constexpr const char* op = "top_k";
  DS_TRY(device_status(ctx.device.index));
  if (x.dtype != DType::F32 || !x.is_contiguous() || !top_k_fits(x.n_elements())) {
    return unsupported("{}: x {} {}: a contiguous F32 row of 1 to {} values", op, dtype_name(x.dtype),
                       x.shape_string(), kTopKMaxBlocks * kTopKBlock);
  }
  if (scratch.dtype != DType::F32 || !scratch.is_contiguous() ||
      scratch.n_elements() < top_k_scratch_floats(x.n_elements())) {
    return invalid_argument("{}: scratch {} for x {}: needs {} contiguous floats", op, scratch.shape_string(),
                            x.shape_string(), top_k_scratch_floats(x.n_elements()));
  }
  DS_TRY(check_device_memory(op, {&x, &scratch}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(top_k_launch(f32(x), x.n_elements(), f32(scratch), out, stream_of(ctx)), "{} x {}", op,
              x.shape_string());
  return Status::ok();
}

Status delta_net_gates(const OpContext& ctx, const TensorView& alpha, const TensorView& b,
                       const TensorView& dt_bias, const TensorView& ssm_a, const TensorView& g,
                       const TensorView& beta) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory("delta_net_gates", {&alpha, &b, &dt_bias, &ssm_a, &g, &beta}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(delta_net_gates_launch(f32(alpha), f32(b), f32(dt_bias), f32(ssm_a), f32(g), f32(beta), alpha.ne[0],
                                     alpha.n_rows(), stream_of(ctx)),
              "delta_net_gates alpha {}", alpha.shape_string());
  return Status::ok();
}

// kChunked (or kAuto from kDeltaNetChunkedMinTokens tokens) runs the chunked form where its kernels
// support the shape (dk 32/64/128, dv % 32, aligned q/k), with window scratch from the caching
// allocator; everything else runs the recurrence, which allocates nothing and never synchronizes (so a
// decode step can be graph-captured). Both match the CPU forms up to rounding, as the contract allows.
Status delta_net(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& g, const TensorView& beta, const TensorView& state,
                 const TensorView& out, DeltaNetMode mode) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory("delta_net", {&q, &k, &v, &g, &beta, &state, &out}));
  const DeltaNetArgs a = dn_args(q, k, v, g, beta, state, out);
  if (a.nv > kDeltaNetMaxHeads) {
    return unsupported("delta_net: nv {} > {} on CUDA (v {})", a.nv, kDeltaNetMaxHeads, v.shape_string());
  }
  DeviceGuard guard(ctx.device.index);
  const bool want_chunked =
      mode == DeltaNetMode::kChunked || (mode == DeltaNetMode::kAuto && a.n_tokens >= kDeltaNetChunkedMinTokens);
  if (want_chunked && delta_net_chunked_ok(a)) {
    DS_ASSIGN_OR_RETURN(CudaBuffer scratch,
                        CudaBuffer::allocate(ctx.device.index, delta_net_chunked_scratch_bytes(a)));
    DS_CUDA_TRY(delta_net_chunked_launch(a, static_cast<float*>(scratch.data()), stream_of(ctx)),
                "delta_net (chunked) q {} v {} state {}", q.shape_string(), v.shape_string(), state.shape_string());
    // The scratch returns to the cache now; later users on this stream are ordered after the launches.
    return Status::ok();
  }
  if (!delta_net_recurrent_fast(a) && a.dk > kDeltaNetGenericMaxDk) {
    return unsupported("delta_net: dk {} too large for the CUDA kernel (q {})", a.dk, q.shape_string());
  }
  DS_CUDA_TRY(delta_net_recurrent_launch(a, stream_of(ctx)), "delta_net (recurrent) q {} v {} state {}",
              q.shape_string(), v.shape_string(), state.shape_string());
  return Status::ok();
}

namespace {
Status conv1d(const OpContext& ctx, const char* op, const TensorView& x, const TensorView& w, const TensorView& state,
              const TensorView& y, bool silu) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory(op, {&x, &w, &state, &y}));
  if (w.ne[0] > kConvMaxKernel) {
    return unsupported("{}: kernel {} > {} on CUDA (w {})", op, w.ne[0], kConvMaxKernel, w.shape_string());
  }
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(conv1d_launch(f32(x), f32(w), f32(state), f32(y), x.ne[0], x.ne[1], w.ne[0], stream_of(ctx), silu),
              "{} x {} w {}", op, x.shape_string(), w.shape_string());
  return Status::ok();
}
}  // namespace

Status conv1d_causal(const OpContext& ctx, const TensorView& x, const TensorView& w,
                     const TensorView& state, const TensorView& y) {
  return conv1d(ctx, "conv1d_causal", x, w, state, y, false);
}

Status conv1d_causal_silu(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& state,
                          const TensorView& y) {
  return conv1d(ctx, "conv1d_causal_silu", x, w, state, y, true);
}

// One token within the kernel's limits (delta_net_prep_fits): one launch. Otherwise the four ops'
// kernels (qualified calls: ds:: has the public ops of the same signatures).
Status delta_net_prep(const OpContext& ctx, const DeltaNetPrep& p) {
  const int64_t dk = p.q.ne[0], nk = p.q.ne[1], n_ch = p.mixed.ne[0], kernel = p.conv_w.ne[0], nv = p.alpha.ne[0];
  if (p.mixed.ne[1] == 1 && delta_net_prep_fits(n_ch, kernel, dk, nk, nv)) {
    DS_TRY(device_status(ctx.device.index));
    DS_TRY(check_device_memory("delta_net_prep", {&p.mixed, &p.conv_w, &p.alpha, &p.b, &p.dt_bias, &p.ssm_a,
                                                  &p.conv_state, &p.conv, &p.q, &p.k, &p.g, &p.beta}));
    DeviceGuard guard(ctx.device.index);
    DS_CUDA_TRY(delta_net_prep_launch(prep_args(p), stream_of(ctx)), "delta_net_prep mixed {} conv_w {} q {} alpha {}",
                p.mixed.shape_string(), p.conv_w.shape_string(), p.q.shape_string(), p.alpha.shape_string());
    return Status::ok();
  }
  DS_TRY(cuda::delta_net_gates(ctx, p.alpha, p.b, p.dt_bias, p.ssm_a, p.g, p.beta));
  DS_TRY(cuda::conv1d_causal_silu(ctx, p.mixed, p.conv_w, p.conv_state, p.conv));
  DS_TRY(cuda::l2_norm(ctx, delta_net_conv_heads(p.conv, 0, dk, nk), p.eps, p.q));
  return cuda::l2_norm(ctx, delta_net_conv_heads(p.conv, nk * dk, dk, nk), p.eps, p.k);
}

Status add(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y) {
  return elt(ctx, "add", EltKind::kAdd, a, &b, y);
}
Status mul(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y) {
  return elt(ctx, "mul", EltKind::kMul, a, &b, y);
}
Status silu(const OpContext& ctx, const TensorView& x, const TensorView& y) {
  return elt(ctx, "silu", EltKind::kSilu, x, nullptr, y);
}
Status sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& y) {
  return elt(ctx, "sigmoid", EltKind::kSigmoid, x, nullptr, y);
}
Status swiglu(const OpContext& ctx, const TensorView& gate, const TensorView& up, const TensorView& y) {
  return elt(ctx, "swiglu", EltKind::kSwiglu, gate, &up, y);
}
Status mul_sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& gate, const TensorView& y) {
  const bool per_row = gate.ne[0] == 1 && x.ne[0] != 1;
  // A row-strided gate (the dispatcher checked one stride for all rows) is indexed by that stride.
  const int64_t b_row_stride = !per_row && !gate.is_contiguous() ? gate.nb[1] / 4 : 0;
  return elt(ctx, "mul_sigmoid", EltKind::kMulSigmoid, x, &gate, y, per_row, b_row_stride);
}

Status copy(const OpContext& ctx, const TensorView& src, const TensorView& dst) {
  if (dst.dtype == DType::Q8_0 || dst.dtype == DType::Q4_0) {  // the KV append quantizes on CUDA (kv_append)
    return unsupported("copy: to {} {} on CUDA", dtype_name(dst.dtype), dst.shape_string());
  }
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory("copy", {&src, &dst}));
  DeviceGuard guard(ctx.device.index);
  CopyShape sh{};
  for (int d = 0; d < 4; ++d) {
    sh.ne[d] = src.ne[d];
    sh.src_nb[d] = src.nb[d];
    sh.dst_nb[d] = dst.nb[d];
  }
  DS_CUDA_TRY(copy_launch(src.data, dst.data, sh, stream_of(ctx)), "copy {} -> {}", src.shape_string(),
              dst.shape_string());
  return Status::ok();
}

Status moe_route(const OpContext& ctx, const TensorView& logits, int64_t k, const TensorView& ids,
                 const TensorView& weights) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory("moe_route", {&logits, &ids, &weights}));
  if (k > kRouteMaxK) return unsupported("moe_route: k {} > {} on CUDA", k, kRouteMaxK);
  if (logits.ne[0] > kRouteMaxExperts) {
    return unsupported("moe_route: {} experts > {} on CUDA (logits {})", logits.ne[0], kRouteMaxExperts,
                       logits.shape_string());
  }
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(moe_route_launch(f32(logits), logits.ne[0], logits.ne[1], k, ids.as<int32_t>(), f32(weights),
                               kMoeWeightSumFloor, stream_of(ctx)),
              "moe_route logits {} k {}", logits.shape_string(), k);
  return Status::ok();
}

Status moe_ffn(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
               const TensorView& weights, const TensorView& y) {
  DS_TRY(device_status(ctx.device.index));
  DS_TRY(check_device_memory("moe_ffn", {&x, &ids, &weights, &y}));
  if (moe_ffn_grouped_takes(x, experts)) return moe_ffn_grouped(ctx, x, experts, ids, weights, y);
  // F32 experts (or unaligned stacks): grouped on the host, F32 products per expert.
  DeviceGuard guard(ctx.device.index);
  const int dev = ctx.device.index;
  const cudaStream_t s = stream_of(ctx);
  const bool fused = experts.gate_up.data != nullptr;
  const TensorView& stack = fused ? experts.gate_up : experts.gate;
  const int64_t n_embd = x.ne[0], n_tokens = x.ne[1], k = ids.ne[0];
  const int64_t n_ff = fused ? stack.ne[1] / 2 : stack.ne[1], n_expert = stack.ne[2];
  std::vector<int32_t> host_ids;
  DS_TRY(ids_to_host(ctx, ids, n_tokens * k, &host_ids, "moe_ffn"));
  // Per expert: the tokens routed to it and the (token, slot) entries, in token order.
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(n_expert)), slots(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = host_ids[t * k + j];
      if (e < 0) continue;  // an unused slot
      if (e >= n_expert) return invalid_argument("moe_ffn: ids[{}, {}] = {} >= n_expert {}", t, j, e, n_expert);
      rows[e].push_back(static_cast<int32_t>(t));
      slots[e].push_back(static_cast<int32_t>(t * k + j));
    }
  }
  // One upload: token rows then weight slots of every expert, back to back.
  std::vector<int32_t> index;
  std::vector<int64_t> first(static_cast<size_t>(n_expert));
  int64_t max_n = 0;
  for (int64_t e = 0; e < n_expert; ++e) {
    first[e] = static_cast<int64_t>(index.size());
    index.insert(index.end(), rows[e].begin(), rows[e].end());
    index.insert(index.end(), slots[e].begin(), slots[e].end());
    max_n = std::max<int64_t>(max_n, static_cast<int64_t>(rows[e].size()));
  }
  DS_CUDA_TRY(cudaMemsetAsync(y.data, 0, static_cast<size_t>(4 * n_embd * n_tokens), s), "moe_ffn y {}",
              y.shape_string());
  if (max_n == 0) return Status::ok();
  DS_ASSIGN_OR_RETURN(CudaBuffer d_index, CudaBuffer::allocate(dev, 4 * static_cast<int64_t>(index.size())));
  DS_CUDA_TRY(cudaMemcpyAsync(d_index.data(), index.data(), 4 * index.size(), cudaMemcpyHostToDevice, s),
              "moe_ffn index");
  DS_ASSIGN_OR_RETURN(CudaBuffer d_scale, CudaBuffer::allocate(dev, 4 * max_n));
  DS_ASSIGN_OR_RETURN(CudaBuffer xe, CudaBuffer::allocate(dev, 4 * n_embd * max_n));
  DS_ASSIGN_OR_RETURN(CudaBuffer ge, CudaBuffer::allocate(dev, 4 * n_ff * max_n));
  DS_ASSIGN_OR_RETURN(CudaBuffer ue, CudaBuffer::allocate(dev, 4 * n_ff * max_n));
  DS_ASSIGN_OR_RETURN(CudaBuffer de, CudaBuffer::allocate(dev, 4 * n_embd * max_n));
  auto slice = [&](const TensorView& st, int64_t e, int64_t row0, int64_t n_rows) {
    TensorView v = st;
    v.data = static_cast<uint8_t*>(st.data) + e * st.nb[2] + row0 * st.nb[1];
    v.n_dims = 2;
    v.ne = {st.ne[0], n_rows, 1, 1};
    v.nb[2] = v.nb[3] = v.nb[1] * n_rows;
    return v;
  };
  for (int64_t e = 0; e < n_expert; ++e) {
    const int64_t n = static_cast<int64_t>(rows[e].size());
    if (n == 0) continue;
    const int32_t* d_rows = static_cast<const int32_t*>(d_index.data()) + first[e];
    const int32_t* d_slots = d_rows + n;
    DS_CUDA_TRY(gather_rows_launch(f32(weights), d_slots, static_cast<float*>(d_scale.data()), n, 1, s),
                "moe_ffn expert {} weights", e);
    DS_CUDA_TRY(gather_rows_launch(f32(x), d_rows, static_cast<float*>(xe.data()), n, n_embd, s),
                "moe_ffn expert {} gather", e);
    const TensorView xv = xe.view(DType::F32, {n_embd, n});
    const TensorView gv = ge.view(DType::F32, {n_ff, n}), uv = ue.view(DType::F32, {n_ff, n});
    const TensorView wg = fused ? slice(stack, e, 0, n_ff) : slice(experts.gate, e, 0, n_ff);
    const TensorView wu = fused ? slice(stack, e, n_ff, n_ff) : slice(experts.up, e, 0, n_ff);
    DS_TRY(matmul_on(wg, xv, gv, dev, ctx.cuda_stream).with_context(fmt::format("moe_ffn expert {} gate", e)));
    DS_TRY(matmul_on(wu, xv, uv, dev, ctx.cuda_stream).with_context(fmt::format("moe_ffn expert {} up", e)));
    DS_CUDA_TRY(eltwise_launch(EltKind::kSwiglu, f32(gv), f32(uv), f32(gv), n_ff * n, n_ff, false, s),
                "moe_ffn expert {} swiglu", e);
    const TensorView dv = de.view(DType::F32, {n_embd, n});
    DS_TRY(matmul_on(slice(experts.down, e, 0, n_embd), gv, dv, dev, ctx.cuda_stream)
               .with_context(fmt::format("moe_ffn expert {} down", e)));
    DS_CUDA_TRY(scatter_add_rows_launch(f32(dv), d_rows, static_cast<float*>(d_scale.data()), f32(y), n, n_embd, s),
                "moe_ffn expert {} scatter", e);
  }
  // The per-expert scratch buffers return to the cache here; later work on this stream is ordered
  // after the launches above, and the host index copy completed before the first launch.
  return Status::ok();
}

void register_ops() {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K}) {
    if (!matmul_supported(t)) continue;
    op_register("matmul", DeviceKind::kCuda, t);
    op_register("matmul_many", DeviceKind::kCuda, t);
    op_register("matmul_swiglu", DeviceKind::kCuda, t);
    op_register("get_rows", DeviceKind::kCuda, t);
    op_register("moe_ffn", DeviceKind::kCuda, t);
  }
  // The device layout of Q6_K (core/dtype.h), made at upload for the products' weights only.
  for (const char* op : {"matmul", "matmul_many", "matmul_swiglu"}) op_register(op, DeviceKind::kCuda, DType::Q6_K_G4);
  for (const char* op : {"rms_norm", "l2_norm", "rms_norm_gated", "add_rms_norm", "rope_neox", "attention", "delta_net_gates",
                         "delta_net", "delta_net_prep",
                         "conv1d_causal", "conv1d_causal_silu", "add", "mul", "silu", "sigmoid", "swiglu", "mul_sigmoid", "copy",
                         "moe_route"}) {
    op_register(op, DeviceKind::kCuda, DType::F32);
  }
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
