// Host entries of the CUDA attention path (ops/cuda/cuda_ops.h): kv_append, attention_paged,
// attention_paged_gated_q8, attention_prep, attention_decode_q8, rope_neox_at, get_rows_trusted, and the
// public attention op over a list of chunks. The model-path entries are called directly (no op
// dispatcher in front), so they check every shape, dtype and limit here and report a Status naming the op
// and the shapes; then they launch on the context's stream.
// Compiled by the C++ compiler; empty without DS_HAVE_CUDA.
// Non-obvious choice: attention_paged takes its split scratch from the caching allocator on every
// call (no host synchronization; after the first call of a shape the block comes from the cache). A
// CUDA graph captured around it keeps that address, so the graph's owner must keep such blocks from
// being handed to longer-lived users while the graph can be replayed (see attention_paged below).
#if DS_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "ops/attention.h"
#include "ops/cuda/attention_launch.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_matmul.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/ops_launch.h"
#include "ops/op_check.h"
#include "ops/op_registry.h"
#include "ops/rms_norm.h"

namespace ds::cuda {
namespace {

cudaStream_t stream_of(const OpContext& ctx) { return static_cast<cudaStream_t>(ctx.cuda_stream); }

// Debug builds: every operand must be device (or managed) memory (as in cuda_ops.cpp).
Status check_device_memory(const char* op, std::initializer_list<const void*> ptrs) {
#ifndef NDEBUG
  for (const void* p : ptrs) {
    if (p == nullptr) continue;
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) (void)cudaGetLastError();
    if (e != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
      return invalid_argument("{}: operand {} is not device memory", op, p);
    }
  }
#else
  (void)op;
  (void)ptrs;
#endif
  return Status::ok();
}

Status check_cuda_ctx(const char* op, const OpContext& ctx) {
  if (ctx.device.kind != DeviceKind::kCuda) {
    return invalid_argument("{}: context device {} is not a CUDA device", op, ctx.device.to_string());
  }
  return device_status(ctx.device.index);
}

// The alignment of a KV row's start: its element, or a Q8_0 / Q4_0 block's fp16 scale.
int64_t kv_elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

Status check_table(const char* op, const KvTable& kv) {
  if (kv.slot_base == nullptr) return invalid_argument("{}: KV table has no slot array", op);
  if (!attention_kv_dtype_supported(kv.dtype)) {
    return unsupported("{}: KV dtype {} (f32, f16, q8_0 or q4_0 only)", op, dtype_name(kv.dtype));
  }
  if (kv.head_dim % dtype_block_size(kv.dtype) != 0) {
    return unsupported("{}: a {} KV cache needs head_dim a multiple of {}, not {}", op, dtype_name(kv.dtype),
                       dtype_block_size(kv.dtype), kv.head_dim);
  }
  if (kv.chunk_tokens <= 0 || kv.chunk_tokens > INT32_MAX || kv.n_head_kv <= 0 || kv.n_head_kv > 65535 ||
      kv.head_dim <= 0) {
    return invalid_argument("{}: KV table chunk_tokens {} n_head_kv {} head_dim {}", op, kv.chunk_tokens,
                            kv.n_head_kv, kv.head_dim);
  }
  if (kv.head_dim > kAttnMaxHeadDim) {
    return unsupported("{}: head_dim {} > {} on CUDA", op, kv.head_dim, kAttnMaxHeadDim);
  }
  const int64_t es = kv_elem_bytes(kv.dtype);
  if (kv.k_offset < 0 || kv.v_offset < 0 || kv.k_offset % es != 0 || kv.v_offset % es != 0) {
    return invalid_argument("{}: KV offsets k {} v {} bytes must be non-negative multiples of {}", op, kv.k_offset,
                            kv.v_offset, es);
  }
  return Status::ok();
}

PagedKvArgs table_args(const KvTable& kv) {
  PagedKvArgs a;
  a.k_base = reinterpret_cast<const uint8_t* const*>(kv.slot_base);
  a.v_base = a.k_base;
  a.k_offset = kv.k_offset;
  a.v_offset = kv.v_offset;
  a.dtype = kv.dtype;
  a.chunk_tokens = static_cast<int32_t>(kv.chunk_tokens);
  a.n_head_kv = static_cast<int32_t>(kv.n_head_kv);
  a.head_dim = static_cast<int32_t>(kv.head_dim);
  return a;
}

// k and v [head_dim, n_head_kv, n] (F32, contiguous, one shape) for the table, and a device position:
// what an append into the table needs.
Status check_kv_rows(const char* op, const OpContext& ctx, const TensorView& k, const TensorView& v,
                     const KvTable& kv, const int32_t* d_pos) {
  DS_TRY(ops::check_contig(op, "k", ctx, k, DType::F32));
  DS_TRY(ops::check_contig(op, "v", ctx, v, DType::F32));
  DS_TRY(ops::check_same_shape(op, "k", k, "v", v));
  if (k.ne[0] != kv.head_dim || k.ne[1] != kv.n_head_kv || k.ne[3] != 1) {
    return invalid_argument("{}: k {} must be [head_dim {}, n_head_kv {}, n_tokens]", op, k.shape_string(),
                            kv.head_dim, kv.n_head_kv);
  }
  if (d_pos == nullptr) return invalid_argument("{}: no device position", op);
  return Status::ok();
}

// A rotation of the first n_rot of x's head_dim (ne0) at the device position.
Status check_rope(const char* op, const TensorView& x, int64_t n_rot, float base, const int32_t* d_pos) {
  if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > x.ne[0]) {
    return invalid_argument("{}: n_rot {} must be even and in (0, head_dim {}]", op, n_rot, x.ne[0]);
  }
  if (!(base > 0.0f)) return invalid_argument("{}: base {} must be positive", op, base);
  if (x.ne[3] != 1) return invalid_argument("{}: x {} must be 3-D", op, x.shape_string());
  if (d_pos == nullptr) return invalid_argument("{}: no device position", op);
  return Status::ok();
}

// q / o [head_dim, n_head, n_tokens] F32, contiguous, same shape, not aliased, n_head a multiple of
// n_head_kv.
Status check_q_o(const char* op, const OpContext& ctx, const TensorView& q, const TensorView& o, int64_t head_dim,
                 int64_t n_head_kv) {
  DS_TRY(ops::check_contig(op, "q", ctx, q, DType::F32));
  DS_TRY(ops::check_contig(op, "o", ctx, o, DType::F32));
  DS_TRY(ops::check_same_shape(op, "q", q, "o", o));
  if (q.ne[3] != 1 || q.ne[0] != head_dim || q.ne[1] % n_head_kv != 0) {
    return invalid_argument("{}: q {} does not fit KV heads of head_dim {} x {} (3-D, GQA)", op, q.shape_string(),
                            head_dim, n_head_kv);
  }
  if (q.ne[1] > INT32_MAX / 2 || q.ne[2] > INT32_MAX / 2 || q.ne[1] * q.ne[2] > INT32_MAX / 2) {
    return invalid_argument("{}: q {} is too large", op, q.shape_string());
  }
  if (q.data == o.data && q.n_elements() > 0) return invalid_argument("{}: o must not alias q", op);
  return Status::ok();
}

// What both paged entries check: the context, the table, q / o, the position and the host bound.
Status check_paged(const char* op, const OpContext& ctx, const TensorView& q, const KvTable& kv, const int32_t* d_pos,
                   int64_t max_kv, const TensorView& o) {
  DS_TRY(check_cuda_ctx(op, ctx));
  DS_TRY(check_table(op, kv));
  DS_TRY(check_q_o(op, ctx, q, o, kv.head_dim, kv.n_head_kv));
  if (d_pos == nullptr) return invalid_argument("{}: no device position", op);
  const int64_t n_tokens = q.ne[2];
  if (max_kv < n_tokens || max_kv > INT32_MAX) {
    return invalid_argument("{}: max_kv {} must cover the {} query tokens and fit in 32 bits", op, max_kv, n_tokens);
  }
  return Status::ok();
}

AttnPagedArgs paged_args(const TensorView& q, const KvTable& kv, const int32_t* d_pos, int64_t max_kv, float scale,
                         const TensorView& o) {
  AttnPagedArgs a;
  a.q = q.as<float>();
  a.o = o.as<float>();
  a.kv = table_args(kv);
  a.n_head = static_cast<int32_t>(q.ne[1]);
  a.n_tokens = static_cast<int32_t>(q.ne[2]);
  a.d_pos = d_pos;
  a.max_kv = max_kv;
  a.scale = scale;
  return a;
}

// Plans, takes the split scratch from the caching allocator and launches.
// The split partials of a plan (none for one split) from the caching allocator, set in a->scratch; the
// caller holds the block until its launches are enqueued.
Result<CudaBuffer> split_scratch(const OpContext& ctx, const AttnPlan& plan, AttnPagedArgs* a) {
  CudaBuffer scratch;
  if (plan.scratch_bytes > 0) {
    DS_ASSIGN_OR_RETURN(scratch, CudaBuffer::allocate(ctx.device.index, plan.scratch_bytes));
    a->scratch = static_cast<float*>(scratch.data());
  }
  return scratch;
}

Status run_paged(const OpContext& ctx, AttnPagedArgs a, AttnPath path, const char* op, const TensorView& q) {
  AttnPlan plan;
  DS_CUDA_TRY(attention_paged_plan(a, path, ctx.device.index, &plan), "{} plan q {} head_dim {} {}", op,
              q.shape_string(), a.kv.head_dim, dtype_name(a.kv.dtype));
  DS_ASSIGN_OR_RETURN(CudaBuffer scratch, split_scratch(ctx, plan, &a));
  DS_CUDA_TRY(attention_paged_launch(a, plan, stream_of(ctx)), "{} q {} KV {} head_dim {} chunk {} splits {}", op,
              q.shape_string(), dtype_name(a.kv.dtype), a.kv.head_dim, a.kv.chunk_tokens, plan.n_split);
  // The scratch returns to the cache here; later work on this stream is ordered after the kernels.
  return Status::ok();
}

}  // namespace

Status kv_append(const OpContext& ctx, const TensorView& k, const TensorView& v, const KvTable& kv,
                 const int32_t* d_pos) {
  constexpr const char* op = "kv_append";
  DS_TRY(check_cuda_ctx(op, ctx));
  DS_TRY(check_table(op, kv));
  DS_TRY(check_kv_rows(op, ctx, k, v, kv, d_pos));
  if (k.ne[2] == 0) return Status::ok();
  DS_TRY(check_device_memory(op, {k.data, v.data, d_pos, kv.slot_base}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(kv_append_launch(k.as<float>(), v.as<float>(), table_args(kv), d_pos, k.ne[2], stream_of(ctx)),
              "{} k {} into {} chunks of {}", op, k.shape_string(), dtype_name(kv.dtype), kv.chunk_tokens);
  return Status::ok();
}

// The scratch address of the split partials is part of a captured graph: capture after a warm-up
// call of the same shapes (so the block comes from the cache, not from cudaMalloc) and keep the
// allocator's blocks of that size from long-lived owners while the graph is replayed.
Status attention_paged(const OpContext& ctx, const TensorView& q, const KvTable& kv, const int32_t* d_pos,
                       int64_t max_kv, float scale, const TensorView& o) {
  constexpr const char* op = "attention_paged";
  DS_TRY(check_paged(op, ctx, q, kv, d_pos, max_kv, o));
  if (q.ne[2] == 0) return Status::ok();
  DS_TRY(check_device_memory(op, {q.data, o.data, d_pos, kv.slot_base}));
  DeviceGuard guard(ctx.device.index);
  return run_paged(ctx, paged_args(q, kv, d_pos, max_kv, scale, o), AttnPath::kAuto, op, q);
}

bool attention_gated_q8_applies(int64_t head_dim) {
  return head_dim >= 32 && head_dim <= kAttnMaxHeadDim && head_dim % 32 == 0;  // whole q8 blocks per head
}

namespace {

// attention_paged_gated_q8's checks; fills *a for a launch.
Status check_gated(const char* op, const OpContext& ctx, const TensorView& q, const KvTable& kv, const int32_t* d_pos,
                   int64_t max_kv, float scale, const TensorView& gate, const TensorView& o, const TensorView& act,
                   AttnPagedArgs* a) {
  DS_TRY(check_paged(op, ctx, q, kv, d_pos, max_kv, o));
  DS_TRY(ops::check_tensor(op, "gate", ctx, gate, DType::F32));
  DS_TRY(ops::check_same_shape(op, "gate", gate, "o", o));
  if (!attention_gated_q8_applies(kv.head_dim)) {
    return unsupported("{}: head_dim {} must be a multiple of 32 up to {}", op, kv.head_dim, kAttnMaxHeadDim);
  }
  if (gate.nb[0] != 4) return invalid_argument("{}: gate {} rows must be contiguous", op, gate.shape_string());
  DS_TRY(check_q8_act(op, act, q.ne[0] * q.ne[1], q.ne[2]));
  *a = paged_args(q, kv, d_pos, max_kv, scale, o);
  a->gate = gate.as<float>();
  a->gate_hs = gate.nb[1] / 4;
  a->gate_ts = gate.nb[2] / 4;
  a->q8 = act.data;
  return Status::ok();
}

// attention_prep's checks; fills *a for a launch.
Status check_prep(const char* op, const OpContext& ctx, const TensorView& q_heads, const TensorView& q_norm,
                  const TensorView& k, const TensorView& k_norm, const TensorView& v, float eps, int64_t n_rot,
                  float base, const KvTable& kv, const int32_t* d_pos, const TensorView& q, AttnPrepArgs* a) {
  DS_TRY(check_cuda_ctx(op, ctx));
  DS_TRY(check_table(op, kv));
  const int64_t D = kv.head_dim, n = q.ne[2];
  if (!attention_prep_applies(D)) return unsupported("{}: head_dim {} > {} on CUDA", op, D, kAttnPrepMaxHeadDim);
  DS_TRY(check_kv_rows(op, ctx, k, v, kv, d_pos));
  DS_TRY(rms_norm_check(ctx, q_heads, q_norm, q).with_context(op));
  DS_TRY(rms_norm_check(ctx, k, k_norm, k).with_context(op));
  DS_TRY(check_rope(op, q, n_rot, base, d_pos));
  if (q.ne[0] != D || k.ne[2] != n || q.ne[1] % kv.n_head_kv != 0 || q.ne[1] > INT32_MAX) {
    return invalid_argument("{}: q {} and k {} must be [head_dim {}, n_head, n] and [head_dim, n_head_kv {}, n], "
                            "n_head a multiple of n_head_kv",
                            op, q.shape_string(), k.shape_string(), D, kv.n_head_kv);
  }
  if (n > 65535) return unsupported("{}: {} tokens > 65535 in one call on CUDA", op, n);
  a->q_in = q_heads.as<float>();
  a->q_hs = q_heads.nb[1] / 4;
  a->q_ts = q_heads.nb[2] / 4;
  a->q_norm = q_norm.as<float>();
  a->k_norm = k_norm.as<float>();
  a->q = q.as<float>();
  a->k = k.as<float>();
  a->v = v.as<float>();
  a->kv = table_args(kv);
  a->n_head = static_cast<int32_t>(q.ne[1]);
  a->n_rot = static_cast<int32_t>(n_rot);
  a->log2_base = std::log2(static_cast<double>(base));
  a->eps = eps;
  a->d_pos = d_pos;
  return Status::ok();
}

}  // namespace

Status attention_paged_gated_q8(const OpContext& ctx, const TensorView& q, const KvTable& kv, const int32_t* d_pos,
                                int64_t max_kv, float scale, const TensorView& gate, const TensorView& o,
                                const TensorView& act) {
  constexpr const char* op = "attention_paged_gated_q8";
  AttnPagedArgs a;
  DS_TRY(check_gated(op, ctx, q, kv, d_pos, max_kv, scale, gate, o, act, &a));
  if (q.ne[2] == 0) return Status::ok();
  DS_TRY(check_device_memory(op, {q.data, o.data, gate.data, act.data, d_pos, kv.slot_base}));
  DeviceGuard guard(ctx.device.index);
  return run_paged(ctx, a, AttnPath::kAuto, op, q);
}

bool attention_prep_applies(int64_t head_dim) { return head_dim >= 1 && head_dim <= kAttnPrepMaxHeadDim; }

Status attention_prep(const OpContext& ctx, const TensorView& q_heads, const TensorView& q_norm, const TensorView& k,
                      const TensorView& k_norm, const TensorView& v, float eps, int64_t n_rot, float base,
                      const KvTable& kv, const int32_t* d_pos, const TensorView& q) {
  constexpr const char* op = "attention_prep";
  AttnPrepArgs a;
  DS_TRY(check_prep(op, ctx, q_heads, q_norm, k, k_norm, v, eps, n_rot, base, kv, d_pos, q, &a));
  const int64_t n = q.ne[2];
  if (n == 0) return Status::ok();
  DS_TRY(check_device_memory(op, {q_heads.data, q.data, k.data, v.data, q_norm.data, k_norm.data, d_pos,
                                  kv.slot_base}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(attention_prep_launch(a, n, stream_of(ctx)), "{} q {} k {} n_rot {} into {} chunks of {}", op,
              q.shape_string(), k.shape_string(), n_rot, dtype_name(kv.dtype), kv.chunk_tokens);
  return Status::ok();
}

bool attention_decode_q8_applies(DType kv_dtype, int64_t head_dim, int64_t n_head, int64_t n_head_kv,
                                 int64_t n_tokens) {
  if (head_dim > kAttnPrepMaxHeadDim || !attention_gated_q8_applies(head_dim) || n_head > INT32_MAX ||
      n_head_kv > INT32_MAX || n_tokens > INT32_MAX) {
    return false;
  }
  return attention_decode_fits(kv_dtype, static_cast<int>(head_dim), static_cast<int>(n_head),
                               static_cast<int>(n_head_kv), static_cast<int>(n_tokens));
}

int64_t attention_launch_bound(int64_t n_kv, int64_t n_ctx) {
  const int64_t bound = n_kv <= kAttnDecodeRowMaxKv ? kAttnDecodeRowMaxKv : (n_kv + 1023) / 1024 * 1024;
  return std::max(std::min(bound, n_ctx), n_kv);
}

// The split scratch as in attention_paged (see there for graphs).
Status attention_decode_q8(const OpContext& ctx, const TensorView& q_heads, const TensorView& q_norm,
                           const TensorView& k, const TensorView& k_norm, const TensorView& v, float eps,
                           int64_t n_rot, float base, const KvTable& kv, const int32_t* d_pos, int64_t max_kv,
                           float scale, const TensorView& gate, const TensorView& q, const TensorView& k_out,
                           const TensorView& o, const TensorView& act) {
  constexpr const char* op = "attention_decode_q8";
  AttnDecodeArgs a;
  DS_TRY(check_prep(op, ctx, q_heads, q_norm, k, k_norm, v, eps, n_rot, base, kv, d_pos, q, &a.prep));
  DS_TRY(check_gated(op, ctx, q, kv, d_pos, max_kv, scale, gate, o, act, &a.attn));
  DS_TRY(ops::check_contig(op, "k_out", ctx, k_out, DType::F32));
  if (k_out.ne[0] != k.ne[0] || k_out.ne[1] != k.ne[1] || k_out.ne[2] != k.ne[2] || k_out.data == k.data) {
    return invalid_argument("{}: k_out {} must be a buffer of k's shape {} other than k", op, k_out.shape_string(),
                            k.shape_string());
  }
  a.k_out = k_out.as<float>();
  const int64_t n = q.ne[2];
  if (!attention_decode_q8_applies(kv.dtype, kv.head_dim, q.ne[1], kv.n_head_kv, std::max<int64_t>(n, 1))) {
    return unsupported("{}: q {} over {} KV heads of head_dim {} ({}) does not fit the fused decode kernel", op,
                       q.shape_string(), kv.n_head_kv, kv.head_dim, dtype_name(kv.dtype));
  }
  if (n == 0) return Status::ok();
  DS_TRY(check_device_memory(op, {q_heads.data, q_norm.data, k.data, k_norm.data, v.data, q.data, k_out.data, o.data,
                                  gate.data, act.data, d_pos, kv.slot_base}));
  DeviceGuard guard(ctx.device.index);
  AttnPlan plan;
  DS_CUDA_TRY(attention_decode_plan(a.attn, ctx.device.index, &plan), "{} plan q {} head_dim {} chunk {}", op,
              q.shape_string(), kv.head_dim, kv.chunk_tokens);
  DS_ASSIGN_OR_RETURN(CudaBuffer scratch, split_scratch(ctx, plan, &a.attn));
  DS_CUDA_TRY(attention_decode_launch(a, plan, stream_of(ctx)), "{} q {} k {} KV head_dim {} chunk {} splits {}",
              op, q.shape_string(), k.shape_string(), kv.head_dim, kv.chunk_tokens, plan.n_split);
  return Status::ok();
}

Status rope_neox_at(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, const int32_t* d_pos) {
  constexpr const char* op = "rope_neox_at";
  DS_TRY(check_cuda_ctx(op, ctx));
  DS_TRY(ops::check_contig(op, "x", ctx, x, DType::F32));
  DS_TRY(check_rope(op, x, n_rot, base, d_pos));
  if (x.n_elements() == 0) return Status::ok();
  DS_TRY(check_device_memory(op, {x.data, d_pos}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(rope_neox_at_launch(x.as<float>(), x.ne[0], x.ne[1], x.ne[2], n_rot, base, d_pos, stream_of(ctx)),
              "{} x {} n_rot {}", op, x.shape_string(), n_rot);
  return Status::ok();
}

Status get_rows_trusted(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y) {
  constexpr const char* op = "get_rows_trusted";
  DS_TRY(check_cuda_ctx(op, ctx));
  if (!matmul_supported(table.dtype)) {
    return unsupported("{}: table {}: dtype {} is not supported on CUDA", op, table.shape_string(),
                       dtype_name(table.dtype));
  }
  DS_TRY(ops::check_tensor(op, "table", ctx, table, table.dtype));
  if (table.ne[2] != 1 || table.ne[3] != 1 || table.nb[0] != dtype_block_bytes(table.dtype)) {
    return invalid_argument("{}: table {} must be 2-D with contiguous rows", op, table.shape_string());
  }
  DS_TRY(ops::check_contig(op, "ids", ctx, ids, DType::I32));
  DS_TRY(ops::check_contig(op, "y", ctx, y, DType::F32));
  const int64_t n_tokens = ids.n_elements();
  DS_TRY(ops::check_shape(op, "y", y, table.ne[0], n_tokens));
  if (n_tokens == 0) return Status::ok();
  DS_TRY(check_device_memory(op, {table.data, ids.data, y.data}));
  DeviceGuard guard(ctx.device.index);
  DS_CUDA_TRY(get_rows_launch(table.dtype, table.data, table.nb[1], table.ne[0], ids.as<int32_t>(), n_tokens,
                              y.as<float>(), stream_of(ctx)),
              "{} table {} ids {}", op, table.shape_string(), ids.shape_string());
  return Status::ok();
}

// The public attention op (checked by its dispatcher): the chunk pointers and pos0 come from the host,
// so this uploads the pointer lists (not a hot path) and runs the paged kernels on them.
Status attention(const OpContext& ctx, const TensorView& q, std::span<const TensorView> k_chunks,
                 std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
                 const TensorView& o) {
  constexpr const char* op = "attention";
  DS_TRY(device_status(ctx.device.index));
  const TensorView& k0 = k_chunks[0];
  if (q.ne[0] > kAttnMaxHeadDim) {
    return unsupported("{}: head_dim {} > {} on CUDA (q {})", op, q.ne[0], kAttnMaxHeadDim, q.shape_string());
  }
  if (pos0 + q.ne[2] > INT32_MAX || k0.ne[2] > INT32_MAX || q.ne[1] * q.ne[2] > INT32_MAX / 2) {
    return invalid_argument("{}: q {} at pos0 {} is too large for the CUDA kernels", op, q.shape_string(), pos0);
  }
  DS_TRY(check_device_memory(op, {q.data, o.data, k0.data}));
  DeviceGuard guard(ctx.device.index);
  const int64_t n_chunks = static_cast<int64_t>(k_chunks.size());
  std::vector<const void*> ptrs(static_cast<size_t>(2 * n_chunks));
  for (int64_t c = 0; c < n_chunks; ++c) {
    ptrs[c] = k_chunks[c].data;
    ptrs[n_chunks + c] = v_chunks[c].data;
  }
  DS_ASSIGN_OR_RETURN(CudaBuffer dptrs, CudaBuffer::allocate(ctx.device.index, 8 * 2 * n_chunks));
  // From pageable memory: the call returns once the pointers are staged, so `ptrs` may go.
  DS_CUDA_TRY(cudaMemcpyAsync(dptrs.data(), ptrs.data(), static_cast<size_t>(8 * 2 * n_chunks),
                              cudaMemcpyHostToDevice, stream_of(ctx)),
              "{}: {} chunk pointers", op, 2 * n_chunks);
  const auto* base = static_cast<const uint8_t* const*>(dptrs.data());
  AttnPagedArgs a;
  a.q = q.as<float>();
  a.o = o.as<float>();
  a.kv.k_base = base;
  a.kv.v_base = base + n_chunks;
  a.kv.dtype = k0.dtype;
  a.kv.chunk_tokens = static_cast<int32_t>(k0.ne[2]);
  a.kv.n_head_kv = static_cast<int32_t>(k0.ne[1]);
  a.kv.head_dim = static_cast<int32_t>(k0.ne[0]);
  // The tensor-core path loads 16-byte pieces of each chunk; a misaligned chunk takes the SIMT path.
  AttnPath path = AttnPath::kAuto;
  for (const void* p : ptrs) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) path = AttnPath::kSimt;
  }
  a.n_head = static_cast<int32_t>(q.ne[1]);
  a.n_tokens = static_cast<int32_t>(q.ne[2]);
  a.pos0_host = static_cast<int32_t>(pos0);
  a.max_kv = n_kv;
  a.scale = scale;
  return run_paged(ctx, a, path, op, q);
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
