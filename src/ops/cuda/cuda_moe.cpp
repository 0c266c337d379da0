// Host entries of moe_ffn_gathered and moe_ffn_grouped (ops/cuda/cuda_ops.h): the expert FFN without a
// host round trip. Each checks the moe_ffn contract, then enqueues, all asynchronous on the context's
// stream. Gathered (a decode step): quantize x (q8 projections) -> gate and up of every slot -> SwiGLU
// (fused with the q8 quantization of h when the down projection is q8) -> down of every slot -> y =
// weighted sum of the slots. Grouped (a prefill batch): the plan (pairs sorted per expert, tiles) ->
// x in BF16 -> gate and up of every tile -> h = SwiGLU in BF16 once per pair -> down of every tile -> the
// weighted sum.
// Compiled by the C++ compiler; empty without DS_HAVE_CUDA.
// Non-obvious choice: the scratch is one block from the device's caching allocator, returned on exit:
// no cudaMalloc once the cache is warm and no synchronization, so a step can be captured into a CUDA
// graph; the graph then keeps using that block's address after this call returns, so its owner must
// keep the cache from handing the block to work that overlaps a replay (the model path reserves it).
#if DS_HAVE_CUDA

#include <cstdint>
#include <string>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_matmul.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/moe_launch.h"
#include "ops/cuda/ops_launch.h"
#include "ops/op_check.h"

namespace ds::cuda {
namespace {

constexpr const char* kOp = "moe_ffn_gathered";

// What the CUDA kernels add to moe_ffn's contract for an expert stack (checked by check_moe_experts).
Status check_cuda_stack(const TensorView& t, const char* name) {
  if (!matmul_supported(t.dtype)) {
    return unsupported("{}: {} {}: dtype {} is not supported on CUDA", kOp, name, t.shape_string(),
                       dtype_name(t.dtype));
  }
  if (t.ne[0] % dtype_block_size(t.dtype) != 0) {
    return invalid_argument("{}: {} {}: rows are not whole {} blocks", kOp, name, t.shape_string(),
                            dtype_name(t.dtype));
  }
  return Status::ok();
}

// Projection of stack t (rows [row0, row0 + n_rows) of every expert) for n_slots slots.
MoeMatvecLaunch projection(const TensorView& t, int64_t row0, int64_t n_rows, const int32_t* ids, int n_slots) {
  MoeMatvecLaunch m{static_cast<const uint8_t*>(t.data) + row0 * t.nb[1], t.nb[1], t.nb[2]};
  m.n_rows = n_rows;
  m.k = t.ne[0];
  m.ids = ids;
  m.n_expert = static_cast<int>(t.ne[2]);
  m.n_slots = n_slots;
  return m;
}

// The fastest kernel for m; `x_stand_in` is used as x when m.x is not allocated yet (16-byte aligned).
MatvecKernel pick(DType t, MoeMatvecLaunch m, const float* x_stand_in) {
  if (moe_matvec_q8_fits(t, m)) return MatvecKernel::kQ8;
  if (m.x == nullptr) m.x = x_stand_in;
  return moe_matvec_staged_fits(t, m) ? MatvecKernel::kStaged : MatvecKernel::kGeneric;
}

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// What both entries check first: a CUDA context and moe_ffn's contract.
Status check_entry(const char* op, const OpContext& ctx, const TensorView& x, const MoeExperts& experts,
                   const TensorView& ids, const TensorView& weights, const TensorView& y) {
  if (ctx.device.kind != DeviceKind::kCuda) {
    return invalid_argument("{}: context device {} is not a CUDA device", op, ctx.device.to_string());
  }
  DS_TRY(check_moe_io(op, ctx, x, ids, weights, y, ids.ne[0]));
  return check_moe_experts(op, ctx, experts, x.ne[0]);
}

}  // namespace

Status moe_ffn_gathered(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
                        const TensorView& weights, const TensorView& y) {
  DS_TRY(check_entry(kOp, ctx, x, experts, ids, weights, y));
  const int64_t n_embd = x.ne[0], n_tokens = x.ne[1], k = ids.ne[0];
  const int64_t n_ff = experts.down.ne[0], n_expert = experts.down.ne[2];
  const bool fused = experts.gate_up.data != nullptr;
  DS_TRY(check_cuda_stack(experts.down, "down"));
  if (fused) {
    DS_TRY(check_cuda_stack(experts.gate_up, "gate_up"));
  } else {
    DS_TRY(check_cuda_stack(experts.gate, "gate"));
    DS_TRY(check_cuda_stack(experts.up, "up"));
  }
  const int64_t n_slots = n_tokens * k;
  if (n_slots > kMoeGatheredMaxSlots) {
    return invalid_argument("{}: {} tokens x {} experts = {} slots > {}; use moe_ffn", kOp, n_tokens, k, n_slots,
                            kMoeGatheredMaxSlots);
  }
  if (n_expert > INT32_MAX) return invalid_argument("{}: {} experts", kOp, n_expert);
  if (n_tokens == 0 || n_embd == 0) return Status::ok();
  const int dev = ctx.device.index;
  DS_TRY(device_status(dev));
  DeviceGuard guard(dev);
  const auto s = static_cast<cudaStream_t>(ctx.cuda_stream);
  const auto* d_ids = ids.as<int32_t>();
  const int slots = static_cast<int>(n_slots);
  if (k == 0 || n_ff == 0) {
    DS_CUDA_TRY(cudaMemsetAsync(y.data, 0, static_cast<size_t>(4 * n_embd * n_tokens), s), "{} y {}", kOp,
                y.shape_string());
    return Status::ok();
  }

  const TensorView& gate_t = fused ? experts.gate_up : experts.gate;
  const TensorView& up_t = fused ? experts.gate_up : experts.up;
  MoeMatvecLaunch gate = projection(gate_t, 0, n_ff, d_ids, slots);
  MoeMatvecLaunch up = projection(up_t, fused ? n_ff : 0, n_ff, d_ids, slots);
  MoeMatvecLaunch down = projection(experts.down, 0, n_embd, d_ids, slots);
  for (MoeMatvecLaunch* m : {&gate, &up}) {
    m->x = x.as<float>();
    m->x_stride = n_embd;
    m->x_div = static_cast<int>(k);
    m->act_rows = n_tokens;
  }
  down.x_stride = n_ff;
  down.act_rows = n_slots;
  alignas(16) static const float stand_in[4] = {};
  const MatvecKernel kg = pick(gate_t.dtype, gate, nullptr);
  const MatvecKernel ku = pick(up_t.dtype, up, nullptr);
  const MatvecKernel kd = pick(experts.down.dtype, down, stand_in);
  const bool x_q8 = kg == MatvecKernel::kQ8 || ku == MatvecKernel::kQ8, h_q8 = kd == MatvecKernel::kQ8;

  // Scratch, 16-byte aligned pieces: xq | g [slots, n_ff] | u [slots, n_ff] | h (q8 or F32) | d [slots, n_embd].
  const int64_t xq_bytes = x_q8 ? align16(matvec_q8_act_bytes(n_embd, n_tokens)) : 0;
  const int64_t gu_bytes = align16(4 * n_slots * n_ff);
  const int64_t h_bytes = align16(h_q8 ? matvec_q8_act_bytes(n_ff, n_slots) : 4 * n_slots * n_ff);
  const int64_t d_bytes = align16(4 * n_slots * n_embd);
  DS_ASSIGN_OR_RETURN(CudaBuffer scratch, CudaBuffer::allocate(dev, xq_bytes + 2 * gu_bytes + h_bytes + d_bytes));
  auto* base = static_cast<uint8_t*>(scratch.data());
  uint8_t* xq = base;
  auto* g = reinterpret_cast<float*>(base + xq_bytes);
  auto* u = reinterpret_cast<float*>(base + xq_bytes + gu_bytes);
  uint8_t* h = base + xq_bytes + 2 * gu_bytes;
  auto* d = reinterpret_cast<float*>(h + h_bytes);
  gate.act = up.act = xq;
  gate.y = g;
  up.y = u;
  gate.y_stride = up.y_stride = n_ff;
  down.act = h;
  down.x = h_q8 ? nullptr : reinterpret_cast<const float*>(h);
  down.y = d;
  down.y_stride = n_embd;

  // Formatted only when a launch fails.
  const auto shapes = [&] {
    return fmt::format("x {} ids {} gate {} down {}", x.shape_string(), ids.shape_string(), gate_t.shape_string(),
                       experts.down.shape_string());
  };
  if (x_q8) {
    DS_CUDA_TRY(quantize_q8_launch(x.as<float>(), n_embd, nullptr, n_tokens, n_embd, xq, nullptr, 0, s),
                "{}: quantize x: {}", kOp, shapes());
  }
  DS_CUDA_TRY(moe_matvec_launch(gate_t.dtype, gate, kg, s), "{}: gate: {}", kOp, shapes());
  DS_CUDA_TRY(moe_matvec_launch(up_t.dtype, up, ku, s), "{}: up: {}", kOp, shapes());
  if (h_q8) {  // h = silu(g) * u, quantized; slots with invalid ids get zeros
    DS_CUDA_TRY(quantize_q8_launch(g, n_ff, u, n_slots, n_ff, h, d_ids, static_cast<int>(n_expert), s),
                "{}: swiglu + quantize h: {}", kOp, shapes());
  } else {  // rows of unused slots hold garbage that nothing reads
    DS_CUDA_TRY(eltwise_launch(EltKind::kSwiglu, g, u, reinterpret_cast<float*>(h), n_slots * n_ff, n_ff, false, s),
                "{}: swiglu: {}", kOp, shapes());
  }
  DS_CUDA_TRY(moe_matvec_launch(experts.down.dtype, down, kd, s), "{}: down: {}", kOp, shapes());
  DS_CUDA_TRY(moe_combine_launch(d, d_ids, weights.as<float>(), n_tokens, k, n_embd, static_cast<int>(n_expert),
                                 y.as<float>(), s),
              "{}: combine: {}", kOp, shapes());
  return Status::ok();
}

namespace {

// Projection rows [row0, row0 + n_rows) of every expert of stack t, for the grouped product.
MoeGroupedLaunch grouped(const TensorView& t, int64_t row0, int64_t n_rows) {
  MoeGroupedLaunch p;
  p.w = static_cast<const uint8_t*>(t.data) + row0 * t.nb[1];
  p.w_stride = t.nb[1];
  p.w_expert_stride = t.nb[2];
  p.n_rows = n_rows;
  p.k = t.ne[0];
  return p;
}

bool grouped_stack_fits(const TensorView& t) {
  return t.data != nullptr && moe_grouped_fits(t.dtype, t.data, t.nb[1], t.nb[2], t.ne[0]);
}

}  // namespace

bool moe_ffn_grouped_takes(const TensorView& x, const MoeExperts& experts) {
  const bool fused = experts.gate_up.data != nullptr;
  const bool stacks = fused ? grouped_stack_fits(experts.gate_up)
                            : grouped_stack_fits(experts.gate) && grouped_stack_fits(experts.up);
  return stacks && grouped_stack_fits(experts.down) && experts.down.ne[2] <= kMoeGroupMaxExperts &&
         reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && x.ne[0] % 8 == 0;
}

Status moe_ffn_grouped(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
                       const TensorView& weights, const TensorView& y, int tile_m) {
  constexpr const char* kGroupedOp = "moe_ffn_grouped";
  DS_TRY(check_entry(kGroupedOp, ctx, x, experts, ids, weights, y));
  if (tile_m != 0 && !moe_group_tile_m_valid(tile_m)) {
    return invalid_argument("{}: tiles of {} pairs (0: automatic, {}, {} or {})", kGroupedOp, tile_m, kMoeGroupM,
                            kMoeGroupMLarge, kMoeGroupMMax);
  }
  const int64_t n_embd = x.ne[0], n_tokens = x.ne[1], k = ids.ne[0];
  const int64_t n_ff = experts.down.ne[0], n_expert = experts.down.ne[2];
  const bool fused = experts.gate_up.data != nullptr;
  if (!moe_ffn_grouped_takes(x, experts)) {
    return unsupported("{}: gate/up {} {} down {} {} x {}: types or alignment the grouped products do not take",
                       kGroupedOp, dtype_name(fused ? experts.gate_up.dtype : experts.gate.dtype),
                       (fused ? experts.gate_up : experts.gate).shape_string(), dtype_name(experts.down.dtype),
                       experts.down.shape_string(), x.shape_string());
  }
  const int64_t n_slots = n_tokens * k;
  if (n_slots > INT32_MAX) return invalid_argument("{}: {} tokens x {} slots", kGroupedOp, n_tokens, k);
  if (n_tokens == 0 || n_embd == 0) return Status::ok();
  const int dev = ctx.device.index;
  DS_TRY(device_status(dev));
  DeviceGuard guard(dev);
  const auto s = static_cast<cudaStream_t>(ctx.cuda_stream);
  if (k == 0 || n_ff == 0) {
    DS_CUDA_TRY(cudaMemsetAsync(y.data, 0, static_cast<size_t>(4 * n_embd * n_tokens), s), "{} y {}", kGroupedOp,
                y.shape_string());
    return Status::ok();
  }

  // Scratch, 16-byte aligned pieces: order [slots] | tiles [max_tiles] | n_tiles | xb [tokens, n_embd] BF16 |
  // gu [slots, 2 n_ff] by place (gate then up) | h [slots, n_ff] BF16 by place | d [slots, n_embd] by slot.
  if (tile_m == 0) tile_m = moe_group_tile_m(n_slots, n_expert);
  const int64_t max_tiles = moe_group_max_tiles(n_slots, n_expert, tile_m);
  const int64_t order_bytes = align16(4 * n_slots), tiles_bytes = 16 * max_tiles, count_bytes = 16;
  const int64_t xb_bytes = align16(2 * n_tokens * n_embd);
  const int64_t gu_bytes = align16(4 * n_slots * 2 * n_ff), h_bytes = align16(2 * n_slots * n_ff);
  const int64_t d_bytes = 4 * n_slots * n_embd;
  DS_ASSIGN_OR_RETURN(CudaBuffer scratch, CudaBuffer::allocate(dev, order_bytes + tiles_bytes + count_bytes +
                                                                        xb_bytes + gu_bytes + h_bytes + d_bytes));
  uint8_t* next = static_cast<uint8_t*>(scratch.data());
  const auto take = [&](int64_t bytes) {
    uint8_t* r = next;
    next += bytes;
    return r;
  };
  auto* order = reinterpret_cast<int32_t*>(take(order_bytes));
  auto* tiles = reinterpret_cast<int4*>(take(tiles_bytes));
  auto* n_tiles = reinterpret_cast<int*>(take(count_bytes));
  auto* xb = reinterpret_cast<uint16_t*>(take(xb_bytes));
  auto* gu = reinterpret_cast<float*>(take(gu_bytes));
  auto* h = reinterpret_cast<uint16_t*>(take(h_bytes));
  auto* d = reinterpret_cast<float*>(take(d_bytes));

  const auto shapes = [&] {
    return fmt::format("x {} ids {} gate {} down {}", x.shape_string(), ids.shape_string(),
                       (fused ? experts.gate_up : experts.gate).shape_string(), experts.down.shape_string());
  };
  DS_CUDA_TRY(moe_group_plan_launch(ids.as<int32_t>(), static_cast<int>(n_slots), static_cast<int>(n_expert), tile_m,
                                    order, tiles, n_tiles, s),
              "{}: plan: {}", kGroupedOp, shapes());
  const auto with_plan = [&](MoeGroupedLaunch p) {
    p.order = order;
    p.tiles = tiles;
    p.n_tiles = n_tiles;
    p.max_tiles = max_tiles;
    p.tile_m = tile_m;
    return p;
  };
  // gu[place] = [gate x | up x] of the pair's token, x in BF16 once.
  DS_CUDA_TRY(f32_to_bf16_launch(x.as<float>(), n_embd, n_tokens, n_embd, xb, s), "{}: x to bf16: {}", kGroupedOp,
              shapes());
  const auto gate_up = [&](MoeGroupedLaunch p, DType t, int64_t col0) -> Status {
    p = with_plan(p);
    p.h = xb;
    p.h_stride = n_embd;
    p.x_div = static_cast<int>(k);
    p.y = gu + col0;
    p.y_stride = 2 * n_ff;
    DS_CUDA_TRY(moe_grouped_product_launch(t, p, s), "{}: {} products: {}", kGroupedOp,
                col0 == 0 ? "gate" : "up", shapes());
    return Status::ok();
  };
  if (fused) {
    DS_TRY(gate_up(grouped(experts.gate_up, 0, 2 * n_ff), experts.gate_up.dtype, 0));
  } else {
    DS_TRY(gate_up(grouped(experts.gate, 0, n_ff), experts.gate.dtype, 0));
    DS_TRY(gate_up(grouped(experts.up, 0, n_ff), experts.up.dtype, n_ff));
  }
  // h[place] = silu(gate x) * up x in BF16, once; d[slot] = down h.
  DS_CUDA_TRY(moe_swiglu_bf16_launch(gu, n_ff, n_slots, tiles, n_tiles, h, s), "{}: swiglu: {}", kGroupedOp,
              shapes());
  MoeGroupedLaunch down = with_plan(grouped(experts.down, 0, n_embd));
  down.h = h;
  down.h_stride = n_ff;
  down.x_div = 0;  // h by place
  down.y = d;
  down.y_stride = n_embd;
  down.y_by_slot = true;
  DS_CUDA_TRY(moe_grouped_product_launch(experts.down.dtype, down, s), "{}: down products: {}", kGroupedOp,
              shapes());
  DS_CUDA_TRY(moe_combine_launch(d, ids.as<int32_t>(), weights.as<float>(), n_tokens, k, n_embd,
                                 static_cast<int>(n_expert), y.as<float>(), s),
              "{}: combine: {}", kGroupedOp, shapes());
  // The scratch returns to the cache here; later work on this stream is ordered after the launches.
  return Status::ok();
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
