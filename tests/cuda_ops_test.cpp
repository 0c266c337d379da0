// CUDA ops against the CPU scalar references through the public op entry points (the dispatchers'
// CUDA path vs OpContext::reference): element-wise family, copy, norms, RoPE, get_rows, conv1d,
// DeltaNet gates and recurrence, attention over chunks, MoE routing and expert FFN. Outputs start as
// NaN. Skipped without a CUDA build or device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "core/half.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "quant/quant.h"

#if DS_HAVE_CUDA
#include "ops/attention.h"
#include "ops/conv1d.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_registry.h"
#include "ops/cuda/pdl.h"
#include "ops/delta_net.h"
#include "ops/elementwise.h"
#include "ops/get_rows.h"
#include "ops/moe.h"
#include "ops/op_registry.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

using test::Host;

// Tolerances (max |cuda - ref| / max(1, max |ref|)), stated once:
constexpr double kTol = test::kTolF32;  // single-pass ops: F32 arithmetic vs the double reference
constexpr double kTolLong = 1e-4;       // attention / DeltaNet: F32 sums over positions and tokens

class CudaOpsTest : public test::CudaTest {
 protected:
  // Routes logits [n_expert, n_tokens] with moe_route on the CPU reference (into ids_ref, w_ref) and on
  // the device, which must pick the same ids and weights within kTol; returns the device's ids.
  TensorView route_both(const Host& logits, int64_t k, std::vector<int32_t>& ids_ref, Host& w_ref) {
    const int64_t n_tokens = logits.t.ne[1];
    ids_ref.assign(static_cast<size_t>(k * n_tokens), 0);
    const TensorView ids_ref_t = TensorView::contiguous(ids_ref.data(), DType::I32, {k, n_tokens});
    EXPECT_TRUE(moe_route(test::ref_ctx(), logits.t, k, ids_ref_t, w_ref.t).is_ok());
    std::vector<int32_t> ids_out(ids_ref.size(), -7);
    const TensorView dids = up(TensorView::contiguous(ids_out.data(), DType::I32, {k, n_tokens}), 4 * k * n_tokens);
    Host w_out({k, n_tokens});
    const TensorView dw = up(w_out);
    EXPECT_TRUE(moe_route(ctx_, up(logits), k, dids, dw).is_ok());
    EXPECT_LE(test::rel_err(down(dw, k * n_tokens), w_ref.v), kTol);
    std::vector<int32_t> got(ids_ref.size());
    EXPECT_TRUE(cuda::copy_to_host(got.data(), dids.data, 4 * k * n_tokens, stream_).is_ok());
    EXPECT_TRUE(stream_.synchronize().is_ok());
    EXPECT_EQ(got, ids_ref);
    return dids;
  }

  std::mt19937 rng_{1234};
};

TEST_F(CudaOpsTest, ElementwiseFamily) {
  for (int64_t n0 : {1, 7, 1000}) {
    Host a({n0, 3}), b({n0, 3}), g1({1, 3});
    a.random(rng_, -4, 4);
    b.random(rng_, -4, 4);
    g1.random(rng_, -4, 4);
    const TensorView da = up(a), db = up(b), dg1 = up(g1);
    using Bin = Status (*)(const OpContext&, const TensorView&, const TensorView&, const TensorView&);
    using Un = Status (*)(const OpContext&, const TensorView&, const TensorView&);
    const std::pair<const char*, Bin> bins[] = {{"add", add}, {"mul", mul}, {"swiglu", swiglu}, {"mul_sigmoid", mul_sigmoid}};
    for (auto [name, f] : bins) {
      Host ref({n0, 3}), out({n0, 3});
      const TensorView dy = up(out);
      ASSERT_TRUE(f(test::ref_ctx(), a.t, b.t, ref.t).is_ok());
      ASSERT_TRUE(f(ctx_, da, db, dy).is_ok()) << name;
      EXPECT_LE(test::rel_err(down(dy, 3 * n0), ref.v), kTol) << name << " n0=" << n0;
    }
    const std::pair<const char*, Un> uns[] = {{"silu", silu}, {"sigmoid", sigmoid}};
    for (auto [name, f] : uns) {
      Host ref({n0, 3}), out({n0, 3});
      const TensorView dy = up(out);
      ASSERT_TRUE(f(test::ref_ctx(), a.t, ref.t).is_ok());
      ASSERT_TRUE(f(ctx_, da, dy).is_ok()) << name;
      EXPECT_LE(test::rel_err(down(dy, 3 * n0), ref.v), kTol) << name << " n0=" << n0;
    }
    Host ref({n0, 3}), out({n0, 3});  // one gate per row
    const TensorView dy = up(out);
    ASSERT_TRUE(mul_sigmoid(test::ref_ctx(), a.t, g1.t, ref.t).is_ok());
    ASSERT_TRUE(mul_sigmoid(ctx_, da, dg1, dy).is_ok());
    EXPECT_LE(test::rel_err(down(dy, 3 * n0), ref.v), kTol) << "mul_sigmoid per row n0=" << n0;
  }
}

TEST_F(CudaOpsTest, CopyIntoStridedRows) {
  Host src({5, 4}), dst_ref({8, 6}), dst({8, 6});
  src.random(rng_);
  std::fill(dst_ref.v.begin(), dst_ref.v.end(), 0.5f);
  dst.v = dst_ref.v;
  TensorView sub_ref = dst_ref.t;  // rows 1..4, columns 2..6 of an [6, 8] matrix
  sub_ref.data = dst_ref.v.data() + 8 + 2;
  sub_ref.ne = {5, 4, 1, 1};
  ASSERT_TRUE(copy(test::ref_ctx(), src.t, sub_ref).is_ok());
  const TensorView dd = up(dst);
  TensorView sub = sub_ref;
  sub.data = static_cast<float*>(dd.data) + 8 + 2;
  sub.device = ctx_.device;
  ASSERT_TRUE(copy(ctx_, up(src), sub).is_ok());
  EXPECT_EQ(down(dd, 48), dst_ref.v);
}

TEST_F(CudaOpsTest, Norms) {
  for (int64_t n : {1, 33, 5120}) {
    Host x({n, 2, 3}), w({n}), ref({n, 2, 3}), out({n, 2, 3}), ref2({n, 2, 3}), out2({n, 2, 3});
    x.random(rng_, -3, 3);
    w.random(rng_);
    const TensorView dx = up(x), dw = up(w), dy = up(out), dy2 = up(out2);
    ASSERT_TRUE(rms_norm(test::ref_ctx(), x.t, w.t, 1e-6f, ref.t).is_ok());
    ASSERT_TRUE(rms_norm(ctx_, dx, dw, 1e-6f, dy).is_ok());
    EXPECT_LE(test::rel_err(down(dy, 6 * n), ref.v), kTol) << "rms_norm n=" << n;
    ASSERT_TRUE(l2_norm(test::ref_ctx(), x.t, 1e-6f, ref2.t).is_ok());
    ASSERT_TRUE(l2_norm(ctx_, dx, 1e-6f, dy2).is_ok());
    EXPECT_LE(test::rel_err(down(dy2, 6 * n), ref2.v), kTol) << "l2_norm n=" << n;
  }
}

// The in-graph attribution filter (`bench --skip-kernels / --only-kernels`): a dropped kernel leaves its
// output as it was (NaN here), and clearing the filter launches it again.
TEST_F(CudaOpsTest, KernelFilterDropsLaunchesUntilCleared) {
  Host x({64, 2}), w({64}), ref({64, 2});
  x.random(rng_, -3, 3);
  w.random(rng_);
  ASSERT_TRUE(rms_norm(test::ref_ctx(), x.t, w.t, 1e-6f, ref.t).is_ok());
  const TensorView dx = up(x), dw = up(w);
  const std::pair<const char*, const char*> filters[] = {{"norm_kernel", ""}, {"eltwise,copy", "eltwise"}, {"", "copy"}};
  for (const auto& [skip, only] : filters) {
    Host out({64, 2});
    const TensorView dy = up(out);
    cuda::set_kernel_filter(skip, only);
    const Status st = rms_norm(ctx_, dx, dw, 1e-6f, dy);
    cuda::set_kernel_filter("", "");
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (float v : down(dy, 128)) EXPECT_TRUE(std::isnan(v)) << "skip '" << skip << "' only '" << only << "'";
  }
  Host out({64, 2});
  const TensorView dy = up(out);
  ASSERT_TRUE(rms_norm(ctx_, dx, dw, 1e-6f, dy).is_ok());
  EXPECT_LE(test::rel_err(down(dy, 128), ref.v), kTol);
}

TEST_F(CudaOpsTest, RopeNeoxAtLargePositions) {
  for (int64_t pos0 : {0, 5, 200000}) {
    Host x({256, 3, 4});
    x.random(rng_);
    const TensorView dx = up(x);
    ASSERT_TRUE(rope_neox(test::ref_ctx(), x.t, 64, 1e7f, pos0).is_ok());
    ASSERT_TRUE(rope_neox(ctx_, dx, 64, 1e7f, pos0).is_ok());
    EXPECT_LE(test::rel_err(down(dx, 256 * 12), x.v), kTol) << "pos0=" << pos0;
  }
}

TEST_F(CudaOpsTest, GetRowsDequantizesAndChecksIds) {
  const int64_t n = 512, rows = 9;
  for (DType t : {DType::F32, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    Host src({n, rows});
    src.random(rng_);
    std::vector<uint8_t> table(static_cast<size_t>(dtype_row_bytes(t, n) * rows));
    quant::quantize_rows(t, src.v.data(), table.data(), rows, n);
    TensorView th = TensorView::contiguous(table.data(), t, {n, rows});
    std::vector<int32_t> ids = {3, 0, 8, 3};
    TensorView ih = TensorView::contiguous(ids.data(), DType::I32, {4});
    Host ref({n, 4}), out({n, 4});
    ASSERT_TRUE(get_rows(test::ref_ctx(), th, ih, ref.t).is_ok());
    const TensorView dt = up(th, static_cast<int64_t>(table.size())), di = up(ih, 16), dy = up(out);
    ASSERT_TRUE(get_rows(ctx_, dt, di, dy).is_ok()) << dtype_name(t);
    EXPECT_LE(test::rel_err(down(dy, 4 * n), ref.v), 1e-6) << dtype_name(t);  // the same decode, exactly
    ids[2] = 9;
    const TensorView bad = up(ih, 16);
    const Status s = get_rows(ctx_, dt, bad, dy);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  }
}

TEST_F(CudaOpsTest, Conv1dCarriesState) {
  // 1 and 2 tokens shift the carried state; 33 and 100 span several token tiles of the kernel.
  for (int64_t n_tokens : {1, 2, 5, 33, 100}) {
    Host x({300, n_tokens}), w({4, 300}), st({300, 3}), ref({300, n_tokens}), out({300, n_tokens});
    x.random(rng_);
    w.random(rng_);
    st.random(rng_);
    const TensorView dx = up(x), dw = up(w), dst = up(st), dy = up(out);
    ASSERT_TRUE(conv1d_causal(test::ref_ctx(), x.t, w.t, st.t, ref.t).is_ok());
    ASSERT_TRUE(conv1d_causal(ctx_, dx, dw, dst, dy).is_ok());
    EXPECT_LE(test::rel_err(down(dy, 300 * n_tokens), ref.v), kTol);
    EXPECT_LE(test::rel_err(down(dst, 900), st.v), kTol) << "state";
  }
}

TEST_F(CudaOpsTest, DeltaNetGatesAndRecurrence) {
  const int64_t n_tokens = 6, nk = 2, nv = 4, dk = 64, dv = 96;
  Host alpha({nv, n_tokens}), b({nv, n_tokens}), dtb({nv}), ssm_a({nv});
  alpha.random(rng_, -3, 3);
  b.random(rng_, -3, 3);
  dtb.random(rng_);
  ssm_a.random(rng_, -1.0f, -0.1f);
  Host g({nv, n_tokens}), beta({nv, n_tokens}), g_out({nv, n_tokens}), beta_out({nv, n_tokens});
  ASSERT_TRUE(delta_net_gates(test::ref_ctx(), alpha.t, b.t, dtb.t, ssm_a.t, g.t, beta.t).is_ok());
  const TensorView dg = up(g_out), dbeta = up(beta_out);
  ASSERT_TRUE(delta_net_gates(ctx_, up(alpha), up(b), up(dtb), up(ssm_a), dg, dbeta).is_ok());
  EXPECT_LE(test::rel_err(down(dg, nv * n_tokens), g.v), kTol);
  EXPECT_LE(test::rel_err(down(dbeta, nv * n_tokens), beta.v), kTol);

  Host q({dk, nk, n_tokens}), k({dk, nk, n_tokens}), v({dv, nv, n_tokens}), st({dv, dk, nv});
  q.random(rng_, -0.2f, 0.2f);
  k.random(rng_, -0.2f, 0.2f);
  v.random(rng_);
  st.random(rng_, -0.1f, 0.1f);
  Host st_ref = st, ref({dv, nv, n_tokens}), out({dv, nv, n_tokens});
  st_ref.t.data = st_ref.v.data();
  const TensorView dq = up(q), dk_ = up(k), dv_ = up(v), dst = up(st), dout = up(out);
  ASSERT_TRUE(delta_net(test::ref_ctx(), q.t, k.t, v.t, g.t, beta.t, st_ref.t, ref.t, DeltaNetMode::kRecurrent).is_ok());
  for (DeltaNetMode mode : {DeltaNetMode::kRecurrent}) {
    ASSERT_TRUE(delta_net(ctx_, dq, dk_, dv_, up(g), up(beta), dst, dout, mode).is_ok());
  }
  EXPECT_LE(test::rel_err(down(dout, dv * nv * n_tokens), ref.v), kTolLong) << "out";
  EXPECT_LE(test::rel_err(down(dst, dv * dk * nv), st_ref.v), kTolLong) << "state";
}

TEST_F(CudaOpsTest, AttentionOverChunksWithGqa) {
  const int64_t D = 128, n_head = 8, n_head_kv = 2, chunk = 16;
  for (auto [pos0, n_tokens] : {std::pair<int64_t, int64_t>{0, 5}, {37, 1}, {20, 12}}) {
    const int64_t n_kv = pos0 + n_tokens, n_chunks = (n_kv + chunk - 1) / chunk;
    Host q({D, n_head, n_tokens}), ref({D, n_head, n_tokens}), out({D, n_head, n_tokens});
    q.random(rng_);
    std::vector<Host> kc, vc;
    for (int64_t c = 0; c < n_chunks; ++c) {
      kc.emplace_back(std::initializer_list<int64_t>{D, n_head_kv, chunk});
      vc.emplace_back(std::initializer_list<int64_t>{D, n_head_kv, chunk});
      kc.back().random(rng_);
      vc.back().random(rng_);
    }
    std::vector<TensorView> kh, vh, kd, vd;
    for (int64_t c = 0; c < n_chunks; ++c) {
      kh.push_back(kc[c].t);
      vh.push_back(vc[c].t);
      kd.push_back(up(kc[c]));
      vd.push_back(up(vc[c]));
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    ASSERT_TRUE(attention(test::ref_ctx(), q.t, kh, vh, n_kv, pos0, scale, ref.t).is_ok());
    const TensorView dout = up(out);
    ASSERT_TRUE(attention(ctx_, up(q), kd, vd, n_kv, pos0, scale, dout).is_ok());
    EXPECT_LE(test::rel_err(down(dout, D * n_head * n_tokens), ref.v), kTolLong) << "pos0=" << pos0;
  }
}

// The real routers: 256 experts, top 8 (35B-A3B) and 128/8, with ties broken towards the lowest id.
// cuda::top_k against a sort on the host: the kTopKMax best (value desc, index asc), NaN never taken,
// -1 when the values at the threshold tie past the candidate capacity. Output poisoned first.
TEST_F(CudaOpsTest, TopKMatchesAHostSort) {
  const auto run = [&](const std::vector<float>& row, TopKResult* got) {
    const int64_t n = static_cast<int64_t>(row.size());
    const TensorView x = up(TensorView::contiguous(const_cast<float*>(row.data()), DType::F32, {n}));
    const TensorView scratch = TensorView::contiguous(dev(4 * ((n + 127) / 128)), DType::F32, {(n + 127) / 128},
                                                      ctx_.device);
    auto* out = static_cast<TopKResult*>(dev(sizeof(TopKResult)));
    EXPECT_TRUE(cuda::fill_bytes(out, 0xFF, sizeof(TopKResult), stream_).is_ok());  // n = -1, NaN values
    const Status st = cuda::top_k(ctx_, x, scratch, out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_TRUE(cuda::copy_to_host(got, out, sizeof(TopKResult), stream_).is_ok());
    EXPECT_TRUE(stream_.synchronize().is_ok());
  };
  const auto expect_sorted = [&](const std::vector<float>& row, const char* what) {
    std::vector<std::pair<float, int32_t>> want;
    for (int32_t i = 0; i < static_cast<int32_t>(row.size()); ++i) {
      if (!std::isnan(row[i])) want.emplace_back(row[i], i);
    }
    std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    TopKResult got;
    run(row, &got);
    const int n = static_cast<int>(std::min<size_t>(want.size(), kTopKMax));
    ASSERT_EQ(got.n, n) << what;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(got.ids[i], want[i].second) << what << ", entry " << i;
      ASSERT_EQ(got.values[i], want[i].first) << what << ", entry " << i;
    }
  };
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> row(248320);
  for (float& v : row) v = nd(rng);
  expect_sorted(row, "normal row of 248320");
  for (int i = 0; i < 5000; ++i) row[(static_cast<size_t>(i) * 7919) % row.size()] = 30.0f;  // ties by index
  expect_sorted(row, "5000 ties at the top");
  for (size_t i = 0; i < row.size(); i += 5) row[i] = std::numeric_limits<float>::quiet_NaN();
  expect_sorted(row, "NaN in every fifth");
  for (int64_t n : {1, 77, 128, 1000, 8191, 100003}) {
    std::vector<float> r(static_cast<size_t>(n));
    for (float& v : r) v = nd(rng);
    r[static_cast<size_t>(n) / 2] = -std::numeric_limits<float>::infinity();
    expect_sorted(r, "short row");
  }
  std::vector<float> nan_row(1000, std::numeric_limits<float>::quiet_NaN());
  nan_row[999] = -1.0f;
  expect_sorted(nan_row, "one value that is not NaN");
  // More equal values at the threshold than one CTA sorts: the caller must take the whole row.
  std::vector<float> flat(248320, 1.0f);
  TopKResult got;
  run(flat, &got);
  EXPECT_EQ(got.n, -1);
  // Rows past the block maxima's capacity are refused clearly.
  const TensorView big = TensorView::contiguous(dev(4 * 600000), DType::F32, {600000}, ctx_.device);
  const TensorView sc = TensorView::contiguous(dev(4 * 5000), DType::F32, {5000}, ctx_.device);
  const Status st = cuda::top_k(ctx_, big, sc, static_cast<TopKResult*>(dev(sizeof(TopKResult))));
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
}

TEST_F(CudaOpsTest, MoeRouteRealExpertCounts) {
  for (auto [n_expert, k, n_tokens] : {std::tuple<int64_t, int64_t, int64_t>{256, 8, 1}, {256, 8, 37}, {128, 8, 3},
                                       {64, 4, 2}}) {
    SCOPED_TRACE(::testing::Message() << n_expert << " experts, k " << k << ", " << n_tokens << " tokens");
    Host logits({n_expert, n_tokens});
    logits.random(rng_, -3, 3);
    for (int64_t t = 0; t < n_tokens; ++t) logits.v[static_cast<size_t>(t * n_expert + 40)] = logits.v[static_cast<size_t>(t * n_expert + 7)];
    std::vector<int32_t> ids_ref;
    Host w_ref({k, n_tokens});
    route_both(logits, k, ids_ref, w_ref);
  }
}

TEST_F(CudaOpsTest, MoeRouteAndExperts) {
  const int64_t n_tokens = 7, n_expert = 16, k = 4, E = 256, F = 96;
  Host logits({n_expert, n_tokens});
  logits.random(rng_, -3, 3);
  std::vector<int32_t> ids_ref;
  Host w_ref({k, n_tokens});
  const TensorView dids = route_both(logits, k, ids_ref, w_ref);
  ASSERT_FALSE(HasFatalFailure());
  const TensorView ids_ref_t = TensorView::contiguous(ids_ref.data(), DType::I32, {k, n_tokens});

  for (bool fused : {false, true}) {
    Host x({E, n_tokens}), gate({E, F, n_expert}), upw({E, F, n_expert}), gu({E, 2 * F, n_expert}),
        down_w({F, E, n_expert}), ref({E, n_tokens}), out({E, n_tokens});
    for (Host* h : {&x, &gate, &upw, &gu, &down_w}) h->random(rng_, -0.5f, 0.5f);
    MoeExperts eh, ed;
    if (fused) {
      eh.gate_up = gu.t;
      ed.gate_up = up(gu);
    } else {
      eh.gate = gate.t;
      eh.up = upw.t;
      ed.gate = up(gate);
      ed.up = up(upw);
    }
    eh.down = down_w.t;
    ed.down = up(down_w);
    ASSERT_TRUE(moe_ffn(test::ref_ctx(), x.t, eh, ids_ref_t, w_ref.t, ref.t).is_ok());
    const TensorView dy = up(out);
    const Status s = moe_ffn(ctx_, up(x), ed, dids, up(w_ref), dy);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_LE(test::rel_err(down(dy, E * n_tokens), ref.v), kTolLong) << "fused=" << fused;
  }
}

// Mutates the process-wide registry, so it runs only with a device (gpu-check runs the CUDA suites in
// their own process; other suites check CPU-only registration).
TEST_F(CudaOpsTest, RegistryListsCudaOps) {
  cuda::register_ops();
  cuda::register_ops();  // idempotent
  EXPECT_TRUE(op_supported("matmul", DeviceKind::kCuda, DType::Q4_K));
  EXPECT_TRUE(op_supported("get_rows", DeviceKind::kCuda, DType::Q6_K));
  EXPECT_TRUE(op_supported("delta_net", DeviceKind::kCuda, DType::F32));
  EXPECT_FALSE(op_supported("matmul", DeviceKind::kCuda, DType::Q5_1));
  // The device layout Q6_K_G4: the products only, and never on the CPU.
  for (const char* op : {"matmul", "matmul_many", "matmul_swiglu"}) {
    EXPECT_TRUE(op_supported(op, DeviceKind::kCuda, DType::Q6_K_G4)) << op;
    EXPECT_FALSE(op_supported(op, DeviceKind::kCpu, DType::Q6_K_G4)) << op;
  }
  EXPECT_FALSE(op_supported("get_rows", DeviceKind::kCuda, DType::Q6_K_G4));
  int64_t n = 0;
  for (const OpSupport& e : op_support_table()) n += e.device == DeviceKind::kCuda;
  // matmul, matmul_many, matmul_swiglu, get_rows, moe_ffn per type, the 3 products of Q6_K_G4, 19 F32 ops
  EXPECT_EQ(n, 5 * 9 + 3 + 19);
}

#else  // !DS_HAVE_CUDA

TEST(CudaOpsTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
