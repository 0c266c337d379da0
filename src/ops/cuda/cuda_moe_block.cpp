// Host entry of moe_block_decode (ops/cuda/cuda_ops.h): the qwen35moe FFN block of a decode step
// (router, routing, routed experts, sigmoid-gated shared expert) in five launches on the context's
// stream, none of which waits for the host:
//   1. moe_route_fused: router + shexp_gate logits, int8 x, routing, selectors, coefficients;
//   2. gate and up of every (token, expert) pair incl. the shared expert: one gathered q8 launch;
//      where it fits (one gate/up group, down with its sum in one launch), the routing moves from 1's
//      last CTA into these CTAs (moe_gate_up_routed) and 4 writes res += delta: no fence, ticket or
//      selector round trip between the router and the expert products;
//   3. h = silu(g) * u quantized to int8 (quantize_q8 SwiGLU mode) for every pair;
//   4. down of every pair: one gathered q8 launch;
//   5. y = weighted sum of the routed pairs + sigmoid(shexp_gate . x) * shared pair.
// Launches 2 and 4 split in two when the shared expert's type differs from the routed experts'. With
// one down group and rows of at most 1024 (moe_down_combine_fits), 4 and 5 are one launch.
// moe_block_decode_add_norm takes the input as the residual add and norm before the block: launch 1 then
// computes the norm itself (moe_route_norm_fits), or a norm launch comes first.
// Compiled by the C++ compiler; empty without DS_HAVE_CUDA.
// Non-obvious choices:
//  - The gathered kernels take a slot's weight address as base + selector * 16 bytes (the "expert id"
//    of MoeMatvecLaunch with a 16-byte expert stride), so the shared expert, a separate tensor, is one
//    more slot of the routed experts' launch; the plan checks that every selector fits in int32.
//  - The routing kernel's last-CTA counter is one word per (device, stream), allocated and zeroed on the
//    first call on that stream and never freed (graphs keep its address); the kernel leaves it at 0.
//    Work on one stream is ordered, so two launches never share a counter at the same time.
//  - Scratch is one block from the caching allocator, as in moe_ffn_gathered (cuda_moe.cpp).
#if DS_HAVE_CUDA

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/moe_launch.h"
#include "ops/op_check.h"

namespace ds::cuda {
namespace {

constexpr const char* kOp = "moe_block_decode";
std::atomic<bool> g_route_in_products{true};

// One gathered launch: weights of one type, rows at one stride, selectors from `base`.
struct SelGroup {
  DType dtype = DType::F32;
  const uint8_t* base = nullptr;
  int64_t w_stride = 0;
};

// A projection's rows for the plan: expert 0's first row, the expert stride (0: the shared expert).
struct Rows {
  const uint8_t* first;
  int64_t expert_stride;
  int64_t n_expert;
  int64_t w_stride;
  DType dtype;
};

struct Plan {
  int64_t n_embd = 0, n_ff = 0, n_expert = 0;
  SelGroup gu[2], down[2];
  int n_gu = 1, n_down = 1;
  MoeWeightSel gate, up, shexp_gate, shexp_up, down_sel, shexp_down;
};

Status check_rows(const TensorView& t, const char* name, int64_t ne0, int64_t ne1, int64_t ne2) {
  if (t.data == nullptr) return unsupported("{}: {} is missing", kOp, name);
  DS_TRY(ops::check_shape(kOp, name, t, ne0, ne1, ne2));
  if (!matvec_q8_supports(t.dtype)) {
    return unsupported("{}: {} {}: dtype {} has no int8-activation kernel", kOp, name, t.shape_string(),
                       dtype_name(t.dtype));
  }
  if (ne0 % dtype_block_size(t.dtype) != 0) {
    return unsupported("{}: {} {}: rows are not whole {} blocks", kOp, name, t.shape_string(), dtype_name(t.dtype));
  }
  if (t.nb[0] != dtype_block_bytes(t.dtype) || t.nb[1] < t.row_bytes() || (ne2 > 1 && t.nb[2] < t.nb[1] * ne1)) {
    return invalid_argument("{}: {} {} has overlapping rows", kOp, name, t.shape_string());
  }
  return Status::ok();
}

// Puts the projections `rows` (all of `g`'s type and row stride) into group g: base = the lowest
// address; each selector base_units + e * expert_units must fit in int32.
Status place(const char* what, SelGroup& g, std::initializer_list<std::pair<const Rows*, MoeWeightSel*>> rows,
             int group, int64_t k) {
  const uint8_t* lo = nullptr;
  for (const auto& [r, sel] : rows) lo = lo == nullptr ? r->first : std::min(lo, r->first);
  g.base = lo;
  for (const auto& [r, sel] : rows) {
    const auto addr = reinterpret_cast<uintptr_t>(r->first);
    if (addr % kMoeSelUnit != 0 || r->expert_stride % kMoeSelUnit != 0) {
      return unsupported("{}: {} weights are not {}-byte aligned", kOp, what, kMoeSelUnit);
    }
    const int64_t base_units = (r->first - lo) / kMoeSelUnit, expert_units = r->expert_stride / kMoeSelUnit;
    if (base_units + (r->n_expert - 1) * expert_units > INT32_MAX) {
      return unsupported("{}: {} weights span more than {} GiB", kOp, what, (INT32_MAX * kMoeSelUnit) >> 30);
    }
    *sel = MoeWeightSel{group, base_units, expert_units};
  }
  MoeMatvecLaunch m{g.base, g.w_stride, kMoeSelUnit};
  m.k = k;
  if (!moe_matvec_q8_fits(g.dtype, m)) {
    return unsupported("{}: {} {} rows of {} elements at stride {} do not fit the int8 kernel", kOp, what,
                       dtype_name(g.dtype), k, g.w_stride);
  }
  return Status::ok();
}

Result<Plan> make_plan(const MoeBlockWeights& w, int64_t n_tokens, int64_t k) {
  const MoeExperts& ex = w.experts;
  Plan p;
  if (ex.down.data == nullptr) return unsupported("{}: down experts are missing", kOp);
  p.n_ff = ex.down.ne[0];
  p.n_embd = ex.down.ne[1];
  p.n_expert = ex.down.ne[2];
  const int64_t E = p.n_embd, F = p.n_ff, X = p.n_expert;
  if (X < 1 || X > kMoeBlockMaxExperts) return unsupported("{}: {} experts (1 .. {})", kOp, X, kMoeBlockMaxExperts);
  if (k < 1 || k > std::min<int64_t>(X, kMoeBlockMaxK)) {
    return unsupported("{}: k {} with {} experts (at most {})", kOp, k, X, kMoeBlockMaxK);
  }
  if (n_tokens * k > kMoeGatheredMaxSlots) {
    return unsupported("{}: {} tokens x {} experts = {} slots > {}", kOp, n_tokens, k, n_tokens * k,
                       kMoeGatheredMaxSlots);
  }
  if (w.router.dtype != DType::F32 || w.router.data == nullptr) return unsupported("{}: router is not F32", kOp);
  DS_TRY(ops::check_shape(kOp, "router", w.router, E, X));
  if (w.router.nb[0] != 4 || w.router.nb[1] % 4 != 0 || w.router.nb[1] < 4 * E) {
    return unsupported("{}: router {} rows are not dense F32", kOp, w.router.shape_string());
  }
  if (w.shexp_gate.dtype != DType::F32 || w.shexp_gate.data == nullptr || w.shexp_gate.n_elements() != E ||
      !w.shexp_gate.is_contiguous()) {
    return unsupported("{}: shexp_gate {} is not {} contiguous F32", kOp, w.shexp_gate.shape_string(), E);
  }
  const bool fused = ex.gate_up.data != nullptr;
  const TensorView& gt = fused ? ex.gate_up : ex.gate;
  DS_TRY(check_rows(ex.down, "down", F, E, X));
  if (fused) {
    DS_TRY(check_rows(ex.gate_up, "gate_up", E, 2 * F, X));
  } else {
    DS_TRY(check_rows(ex.gate, "gate", E, F, X));
    DS_TRY(check_rows(ex.up, "up", E, F, X));
    if (ex.up.dtype != ex.gate.dtype || ex.up.nb[1] != ex.gate.nb[1]) {
      return unsupported("{}: gate {} and up {} differ in type or row stride", kOp, dtype_name(ex.gate.dtype),
                         dtype_name(ex.up.dtype));
    }
  }
  DS_TRY(check_rows(w.gate_shexp, "gate_shexp", E, F, 1));
  DS_TRY(check_rows(w.up_shexp, "up_shexp", E, F, 1));
  DS_TRY(check_rows(w.down_shexp, "down_shexp", F, E, 1));
  if (w.up_shexp.dtype != w.gate_shexp.dtype || w.up_shexp.nb[1] != w.gate_shexp.nb[1]) {
    return unsupported("{}: gate_shexp {} and up_shexp {} differ in type or row stride", kOp,
                       dtype_name(w.gate_shexp.dtype), dtype_name(w.up_shexp.dtype));
  }

  const auto* g0 = static_cast<const uint8_t*>(gt.data);
  const Rows gate{g0, gt.nb[2], X, gt.nb[1], gt.dtype};
  const Rows up{fused ? g0 + F * gt.nb[1] : static_cast<const uint8_t*>(ex.up.data), gt.nb[2], X, gt.nb[1], gt.dtype};
  const Rows sgate{static_cast<const uint8_t*>(w.gate_shexp.data), 0, 1, w.gate_shexp.nb[1], w.gate_shexp.dtype};
  const Rows sup{static_cast<const uint8_t*>(w.up_shexp.data), 0, 1, w.up_shexp.nb[1], w.up_shexp.dtype};
  const Rows down{static_cast<const uint8_t*>(ex.down.data), ex.down.nb[2], X, ex.down.nb[1], ex.down.dtype};
  const Rows sdown{static_cast<const uint8_t*>(w.down_shexp.data), 0, 1, w.down_shexp.nb[1], w.down_shexp.dtype};

  p.gu[0] = {gate.dtype, nullptr, gate.w_stride};
  if (sgate.dtype == gate.dtype && sgate.w_stride == gate.w_stride) {
    DS_TRY(place("gate/up", p.gu[0], {{&gate, &p.gate}, {&up, &p.up}, {&sgate, &p.shexp_gate}, {&sup, &p.shexp_up}}, 0,
                 E));
  } else {
    p.n_gu = 2;
    p.gu[1] = {sgate.dtype, nullptr, sgate.w_stride};
    DS_TRY(place("gate/up", p.gu[0], {{&gate, &p.gate}, {&up, &p.up}}, 0, E));
    DS_TRY(place("shared gate/up", p.gu[1], {{&sgate, &p.shexp_gate}, {&sup, &p.shexp_up}}, 1, E));
  }
  p.down[0] = {down.dtype, nullptr, down.w_stride};
  if (sdown.dtype == down.dtype && sdown.w_stride == down.w_stride) {
    DS_TRY(place("down", p.down[0], {{&down, &p.down_sel}, {&sdown, &p.shexp_down}}, 0, F));
  } else {
    p.n_down = 2;
    p.down[1] = {sdown.dtype, nullptr, sdown.w_stride};
    DS_TRY(place("down", p.down[0], {{&down, &p.down_sel}}, 0, F));
    DS_TRY(place("shared down", p.down[1], {{&sdown, &p.shexp_down}}, 1, F));
  }
  return p;
}

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// What both entries check about the context, the weights and the block's input `in` [n_embd, n_tokens];
// the plan of the block.
Result<Plan> check_block(const OpContext& ctx, const MoeBlockWeights& w, const TensorView& in, int64_t k) {
  if (ctx.device.kind != DeviceKind::kCuda) {
    return invalid_argument("{}: context device {} is not a CUDA device", kOp, ctx.device.to_string());
  }
  DS_ASSIGN_OR_RETURN(Plan p, make_plan(w, in.ne[1], k));
  if (in.ne[0] != p.n_embd) {
    return invalid_argument("{}: input {} against down experts {}", kOp, in.shape_string(),
                            w.experts.down.shape_string());
  }
  const MoeExperts& ex = w.experts;
  for (const auto& [t, name] : {std::pair{&w.router, "router"},
                                {&w.shexp_gate, "shexp_gate"},
                                {&w.gate_shexp, "gate_shexp"},
                                {&w.up_shexp, "up_shexp"},
                                {&w.down_shexp, "down_shexp"},
                                {&ex.down, "down"},
                                {ex.gate_up.data != nullptr ? &ex.gate_up : &ex.gate, "gate"}}) {
    DS_TRY(ops::check_tensor(kOp, name, ctx, *t, t->dtype));
  }
  if (ex.gate_up.data == nullptr) DS_TRY(ops::check_tensor(kOp, "up", ctx, ex.up, ex.up.dtype));
  return p;
}

// The launches of both entries, after their checks: the block's input is `in`, or with norm the input
// norm of norm->res (= in) and norm->delta.
Status run_block(const OpContext& ctx, const TensorView& in, const MoeBlockAddNorm* norm,
                 const MoeBlockWeights& w, const Plan& p, int64_t k, const TensorView& ids, const TensorView& weights,
                 const TensorView& y) {
  const int64_t n_tokens = in.ne[1];
  const MoeExperts& ex = w.experts;
  const int dev = ctx.device.index;
  DS_TRY(device_status(dev));
  DeviceGuard guard(dev);
  const auto s = static_cast<cudaStream_t>(ctx.cuda_stream);
  DS_ASSIGN_OR_RETURN(void* counter_mem, stream_resident_buffer(dev, s, "moe_route_fused", sizeof(unsigned int)));
  auto* counter = static_cast<unsigned int*>(counter_mem);
  const int64_t E = p.n_embd, F = p.n_ff, X = p.n_expert, P = k + 1, T = n_tokens;

  // Scratch, 16-byte aligned pieces: logits | shexp logit | x q8 | coef | selectors | g/u | h q8 | d.
  const int64_t logits_b = align16(4 * T * X), shl_b = align16(4 * T), xq_b = align16(matvec_q8_act_bytes(E, T));
  const int64_t coef_b = align16(4 * T * P), selgu_b = align16(4 * T * 2 * P), seld_b = align16(4 * T * P);
  const int64_t gu_b = align16(4 * T * 2 * P * F), hq_b = align16(matvec_q8_act_bytes(F, T * P));
  // Down and combine in one launch where the fused kernel takes the shape (one down group).
  const bool down_combined = p.n_down == 1 && moe_down_combine_fits(p.down[0].dtype, F, static_cast<int>(k));
  const int64_t d_b = down_combined ? 0 : align16(4 * T * P * E);
  // The input norm in the router kernel where it takes the shape; else add_rms_norm first, into x_b.
  const auto a16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool norm_fused = norm != nullptr && moe_route_norm_fits(E, static_cast<int>(T), static_cast<int>(X)) &&
                          a16(norm->res.data) && a16(norm->delta.data);
  const int64_t x_b = norm != nullptr && !norm_fused ? align16(4 * T * E) : 0;
  // The routing in the gate/up products where they take it (one group each way, down + sum in one launch).
  const bool route_in_products = g_route_in_products.load(std::memory_order_relaxed) && p.n_gu == 1 &&
                                 down_combined &&
                                 moe_gate_up_routed_fits(p.gu[0].dtype, static_cast<int>(X), static_cast<int>(k));
  const int n_sel_gu = route_in_products ? 0 : p.n_gu;  // the routing products find their own selectors
  const int64_t total =
      logits_b + shl_b + xq_b + coef_b + n_sel_gu * selgu_b + p.n_down * seld_b + gu_b + hq_b + d_b + x_b;
  DS_ASSIGN_OR_RETURN(CudaBuffer scratch, CudaBuffer::allocate(dev, total));
  auto* next = static_cast<uint8_t*>(scratch.data());
  const auto take = [&](int64_t bytes) {
    uint8_t* r = next;
    next += bytes;
    return r;
  };

  MoeRouteFusedLaunch r;
  if (norm_fused) {
    r.res = norm->res.as<float>();
    r.delta = norm->delta.as<float>();
    r.norm_w = norm->norm_w.as<float>();
    r.eps = norm->eps;
  } else if (norm != nullptr) {
    auto* xn = reinterpret_cast<float*>(take(x_b));
    DS_CUDA_TRY(norm_launch(norm->res.as<float>(), row_map_contiguous(E, T), norm->norm_w.as<float>(), nullptr, xn, E,
                            T, norm->eps, false, s, norm->delta.as<float>()),
                "{}: input norm of res {}", kOp, in.shape_string());
    r.x = xn;
  } else {
    r.x = in.as<float>();
  }
  r.n_embd = E;
  r.n_tokens = static_cast<int>(T);
  r.router = static_cast<const float*>(w.router.data);
  r.router_stride = w.router.nb[1] / 4;
  r.shexp_gate = static_cast<const float*>(w.shexp_gate.data);
  r.n_expert = static_cast<int>(X);
  r.k = static_cast<int>(k);
  r.floor = kMoeWeightSumFloor;
  r.logits = reinterpret_cast<float*>(take(logits_b));
  r.shexp_logit = reinterpret_cast<float*>(take(shl_b));
  r.xq = take(xq_b);
  r.ids = ids.as<int32_t>();
  r.weights = weights.as<float>();
  r.coef = reinterpret_cast<float*>(take(coef_b));
  for (int g = 0; g < n_sel_gu; ++g) r.sel_gu[g] = reinterpret_cast<int32_t*>(take(selgu_b));
  for (int g = 0; g < p.n_down; ++g) r.sel_down[g] = reinterpret_cast<int32_t*>(take(seld_b));
  r.gate = p.gate;
  r.up = p.up;
  r.shexp_gate_w = p.shexp_gate;
  r.shexp_up_w = p.shexp_up;
  r.down = p.down_sel;
  r.shexp_down_w = p.shexp_down;
  r.counter = counter;
  r.route = !route_in_products;
  auto* gu = reinterpret_cast<float*>(take(gu_b));
  uint8_t* hq = take(hq_b);
  auto* d = reinterpret_cast<float*>(take(d_b));

  // Formatted only when a launch fails.
  const auto shapes = [&] {
    return fmt::format("x {} k {} router {} gate {} {} down {} {} shared gate {} down {}", in.shape_string(), k,
                       w.router.shape_string(), dtype_name(p.gu[0].dtype),
                       (ex.gate_up.data ? ex.gate_up : ex.gate).shape_string(), dtype_name(ex.down.dtype),
                       ex.down.shape_string(), dtype_name(w.gate_shexp.dtype), dtype_name(w.down_shexp.dtype));
  };
  DS_CUDA_TRY(moe_route_fused_launch(r, s), "{}: route: {}", kOp, shapes());
  for (int g = 0; g < p.n_gu; ++g) {  // slot 2 pair (+ 1): gate (up) of the pair, activation row = token
    MoeMatvecLaunch m{p.gu[g].base, p.gu[g].w_stride, kMoeSelUnit};
    m.n_rows = F;
    m.k = E;
    m.ids = r.sel_gu[g];
    m.n_expert = INT32_MAX;
    m.n_slots = static_cast<int>(T * 2 * P);
    m.x_div = static_cast<int>(2 * P);
    m.act = r.xq;
    m.act_rows = T;
    m.y = gu;
    m.y_stride = F;
    if (route_in_products) {
      DS_CUDA_TRY(moe_gate_up_routed_launch(p.gu[g].dtype, m, r, s), "{}: routing + gate/up: {}", kOp, shapes());
    } else {
      DS_CUDA_TRY(moe_matvec_launch(p.gu[g].dtype, m, MatvecKernel::kQ8, s), "{}: gate/up: {}", kOp, shapes());
    }
  }
  // h[pair] = silu(g[2 pair]) * g[2 pair + 1]: rows of F at stride 2F, up rows F further.
  DS_CUDA_TRY(quantize_q8_launch(gu, 2 * F, gu + F, T * P, F, hq, nullptr, 0, s), "{}: swiglu + quantize h: {}", kOp,
              shapes());
  if (down_combined) {
    MoeDownCombineLaunch dc;
    dc.w = p.down[0].base;
    dc.w_stride = p.down[0].w_stride;
    dc.sel = r.sel_down[0];
    dc.hq = hq;
    dc.coef = r.coef;
    dc.y = y.as<float>();
    dc.n_embd = E;
    dc.n_ff = F;
    dc.n_tokens = static_cast<int>(T);
    dc.k = static_cast<int>(k);
    if (route_in_products && norm_fused) {  // the router kernel did not add the residual
      dc.res = norm->res.as<float>();
      dc.delta = norm->delta.as<float>();
    }
    DS_CUDA_TRY(moe_down_combine_launch(p.down[0].dtype, dc, s), "{}: down + combine: {}", kOp, shapes());
    return Status::ok();
  }
  for (int g = 0; g < p.n_down; ++g) {
    MoeMatvecLaunch m{p.down[g].base, p.down[g].w_stride, kMoeSelUnit};
    m.n_rows = E;
    m.k = F;
    m.ids = r.sel_down[g];
    m.n_expert = INT32_MAX;
    m.n_slots = static_cast<int>(T * P);
    m.act = hq;
    m.act_rows = T * P;
    m.y = d;
    m.y_stride = E;
    DS_CUDA_TRY(moe_matvec_launch(p.down[g].dtype, m, MatvecKernel::kQ8, s), "{}: down: {}", kOp, shapes());
  }
  DS_CUDA_TRY(moe_block_combine_launch(d, r.coef, T, k, E, y.as<float>(), s), "{}: combine: {}", kOp, shapes());
  return Status::ok();
}

}  // namespace

void set_moe_block_route_in_products(bool on) { g_route_in_products.store(on, std::memory_order_relaxed); }

Status moe_block_decode_check(const MoeBlockWeights& w, int64_t n_tokens, int64_t k) {
  return make_plan(w, n_tokens, k).status();
}

Status moe_block_decode(const OpContext& ctx, const TensorView& x, const MoeBlockWeights& w, int64_t k,
                        const TensorView& ids, const TensorView& weights, const TensorView& y) {
  DS_ASSIGN_OR_RETURN(const Plan p, check_block(ctx, w, x, k));
  DS_TRY(check_moe_io(kOp, ctx, x, ids, weights, y, k));
  if (x.ne[1] == 0) return Status::ok();
  return run_block(ctx, x, nullptr, w, p, k, ids, weights, y);
}

Status moe_block_decode_add_norm(const OpContext& ctx, const MoeBlockAddNorm& in, const MoeBlockWeights& w, int64_t k,
                                 const TensorView& ids, const TensorView& weights, const TensorView& y) {
  DS_ASSIGN_OR_RETURN(const Plan p, check_block(ctx, w, in.res, k));
  DS_TRY(check_moe_io(kOp, ctx, in.res, ids, weights, y, k));  // y must not alias res
  DS_TRY(ops::check_contig(kOp, "delta", ctx, in.delta, DType::F32));
  DS_TRY(ops::check_same_shape(kOp, "res", in.res, "delta", in.delta));
  if (in.delta.data == in.res.data && in.res.ne[1] > 0) return invalid_argument("{}: delta must not alias res", kOp);
  DS_TRY(ops::check_contig(kOp, "norm_w", ctx, in.norm_w, DType::F32));
  if (in.norm_w.n_elements() != p.n_embd) {
    return invalid_argument("{}: norm_w {} against n_embd {}", kOp, in.norm_w.shape_string(), p.n_embd);
  }
  if (in.res.ne[1] == 0) return Status::ok();
  return run_block(ctx, in.res, &in, w, p, k, ids, weights, y);
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
