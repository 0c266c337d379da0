// CUDA delta_net (ops/cuda/delta_net.cu: chunked prefill, recurrent decode, generic fallback) against the
// CPU recurrent reference (double accumulation) and the CPU chunked form, on the same inputs: outputs
// and final state, real model shapes (dk = dv = 128, nk = 16, nv = 48 / 32) and edge sizes (1 token, one
// chunk +- 1, several chunks, a partial last chunk), a non-zero initial state, realistic inputs
// (L2-normalized q/k, log decays in [-5, 0) with values near 0 and near -5, beta in (0, 1)). Outputs
// start as NaN, so an unwritten element fails. Mismatches print the first offending element with its
// coordinates and values and the max error. Also delta_net_gated_q8 (the recurrence and the gated output
// norm with int8 activations in one kernel) against the two ops it fuses, and delta_net_step_q8 (the
// prologue too) against delta_net_prep and delta_net_gated_q8, bit for bit. Skipped without a CUDA build
// or device.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_test_util.h"
#include "ops_test_util.h"

#if DS_HAVE_CUDA
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/delta_net_launch.h"
#include "ops/cuda/pdl.h"
#include "ops/delta_net.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

using test::Host;

// max |cuda - ref| / max |ref|: F32 sums over dk and over the 64 tokens of a chunk, against a double
// reference (recurrent) or a differently ordered F32 one (CPU chunked).
constexpr double kTol = 1e-4;

struct Shape {
  const char* name;
  int64_t dk, dv, nk, nv;
};
constexpr Shape k27B{"27B", 128, 128, 16, 48};
constexpr Shape k35B{"35B-A3B", 128, 128, 16, 32};
constexpr Shape kSmall{"small", 32, 32, 2, 4};

// A fresh Host with the same values (Host's view points into its own vector, so it is not copyable).
Host clone(const Host& h) {
  Host c({1});
  c.v = h.v;
  c.t = h.t;
  c.t.data = c.v.data();
  return c;
}

// Tokens [t0, t0 + n) of a tensor whose last used dimension (dim `tok_dim`) is the token axis.
Host token_slice(const Host& h, int tok_dim, int64_t t0, int64_t n) {
  int64_t row = 1;
  for (int d = 0; d < tok_dim; ++d) row *= h.t.ne[d];
  Host s({row * n});
  std::copy(h.v.begin() + t0 * row, h.v.begin() + (t0 + n) * row, s.v.begin());
  TensorView t = h.t;
  t.data = s.v.data();
  t.ne[tok_dim] = n;
  for (int d = tok_dim + 1; d < 4; ++d) t.nb[d] = t.nb[tok_dim] * n;
  s.t = t;
  return s;
}

struct Inputs {
  Host q, k, v, g, beta, state;
};

// g: a third uniform in [-5, 0), a third in [-1e-3, 0) (decay ~1), a third in [-5, -4) (strong decay;
// cumulative sums over a chunk underflow exp to 0). g_floor < -5 widens the strong-decay band.
Inputs make_inputs(std::mt19937& rng, const Shape& s, int64_t n, float g_floor = -5.0f) {
  Inputs in{Host({s.dk, s.nk, n}), Host({s.dk, s.nk, n}), Host({s.dv, s.nv, n}), Host({s.nv, n}),
            Host({s.nv, n}),       Host({s.dv, s.dk, s.nv})};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Host* x : {&in.q, &in.k}) {
    for (float& e : x->v) e = normal(rng);
    for (int64_t r = 0; r < s.nk * n; ++r) {  // L2-normalize each head row, as the model does
      float* row = x->v.data() + r * s.dk;
      double ss = 0.0;
      for (int64_t i = 0; i < s.dk; ++i) ss += static_cast<double>(row[i]) * row[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
      for (int64_t i = 0; i < s.dk; ++i) row[i] *= inv;
    }
  }
  in.v.random(rng, -1.0f, 1.0f);
  std::uniform_int_distribution<int> band(0, 2);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (float& e : in.g.v) {
    const float u = u01(rng);
    switch (band(rng)) {
      case 0: e = -5.0f * std::max(u, 1e-6f); break;
      case 1: e = -1e-3f * std::max(u, 1e-6f); break;
      default: e = -4.0f + (g_floor + 4.0f) * u; break;
    }
  }
  in.beta.random(rng, 0.01f, 0.99f);
  in.state.random(rng, -0.5f, 0.5f);
  return in;
}

// Compares got with ref (same layout, ne0 x ne1 x rest); reports NaNs (unwritten elements), the first
// element over tolerance and the max error, with coordinates.
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, int64_t ne0,
                                 int64_t ne1, double tol, const std::string& what) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  }
  auto coord = [&](size_t i) {
    const int64_t a = static_cast<int64_t>(i);
    return fmt::format("[{}, {}, {}]", a % ne0, a / ne0 % ne1, a / (ne0 * ne1));
  };
  double mx = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i])) return ::testing::AssertionFailure() << what << ": reference NaN at " << coord(i);
    mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
  }
  if (mx == 0.0) mx = 1.0;
  double err = 0.0;
  size_t worst = 0, first_bad = ref.size();
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      return ::testing::AssertionFailure() << what << ": got " << got[i] << " at " << coord(i) << " (flat " << i
                                           << "; ref " << ref[i] << "): unwritten or overflowed";
    }
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (e > err) err = e, worst = i;
    if (e > tol * mx && first_bad == ref.size()) first_bad = i;
  }
  if (first_bad == ref.size()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << err / mx << " (> " << tol << ") relative to max|ref| "
                                       << mx << "; first bad " << coord(first_bad) << " got " << got[first_bad]
                                       << " ref " << ref[first_bad] << "; worst " << coord(worst) << " got "
                                       << got[worst] << " ref " << ref[worst];
}

const char* mode_name(DeltaNetMode m) {
  return m == DeltaNetMode::kChunked ? "chunked" : m == DeltaNetMode::kRecurrent ? "recurrent" : "auto";
}

class CudaDeltaNetTest : public test::CudaTest {
 protected:

  // A device copy of a host tensor; `offset_floats` shifts the data inside the buffer (misalignment).
  TensorView up(const Host& h, int64_t offset_floats = 0) {
    const int64_t bytes = static_cast<int64_t>(4 * h.v.size());
    auto b = cuda::CudaBuffer::allocate(0, bytes + 4 * offset_floats);
    EXPECT_TRUE(b.is_ok());
    float* dst = static_cast<float*>(b->data()) + offset_floats;
    EXPECT_TRUE(cuda::copy_to_device(dst, h.v.data(), bytes, stream_).is_ok());
    TensorView d = h.t;
    d.data = dst;
    d.device = ctx_.device;
    bufs_.push_back(std::move(*b));
    return d;
  }

  struct Run {
    std::vector<float> out, state;
  };
  // CPU run (reference or fast context) from a copy of the initial state.
  static Run run_cpu(const OpContext& ctx, const Inputs& in, int64_t n, DeltaNetMode mode) {
    Host st = clone(in.state), out({in.v.t.ne[0], in.v.t.ne[1], n});
    const Status s = delta_net(ctx, in.q.t, in.k.t, in.v.t, in.g.t, in.beta.t, st.t, out.t, mode);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return {out.v, st.v};
  }
  // CUDA run from a fresh device copy of the initial state; the output buffer starts as NaN.
  Run run_cuda(const Inputs& in, int64_t n, DeltaNetMode mode, int64_t misalign_qk = 0) {
    Host out({in.v.t.ne[0], in.v.t.ne[1], n});
    const TensorView dst = up(in.state), dout = up(out);
    const Status s = delta_net(ctx_, up(in.q, misalign_qk), up(in.k, misalign_qk), up(in.v), up(in.g),
                               up(in.beta), dst, dout, mode);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    Run r{down(dout), down(dst)};
    bufs_.clear();
    return r;
  }

  // Every CUDA mode against the CPU reference, and the chunked mode against the CPU chunked form too.
  void check_all_modes(const Shape& s, int64_t n, float g_floor = -5.0f) {
    SCOPED_TRACE(std::string(s.name) + " n=" + std::to_string(n));
    const Inputs in = make_inputs(rng_, s, n, g_floor);
    const Run ref = run_cpu(test::ref_ctx(), in, n, DeltaNetMode::kRecurrent);
    const Run cpu_chunked = run_cpu(test::fast_ctx(), in, n, DeltaNetMode::kChunked);
    for (DeltaNetMode mode : {DeltaNetMode::kChunked, DeltaNetMode::kRecurrent, DeltaNetMode::kAuto}) {
      const Run got = run_cuda(in, n, mode);
      const std::string tag = std::string(mode_name(mode)) + " ";
      EXPECT_TRUE(close(got.out, ref.out, s.dv, s.nv, kTol, tag + "out [j, h, t] vs reference"));
      EXPECT_TRUE(close(got.state, ref.state, s.dv, s.dk, kTol, tag + "state [j, i, h] vs reference"));
      if (mode == DeltaNetMode::kChunked) {
        EXPECT_TRUE(close(got.out, cpu_chunked.out, s.dv, s.nv, kTol, tag + "out vs CPU chunked"));
        EXPECT_TRUE(close(got.state, cpu_chunked.state, s.dv, s.dk, kTol, tag + "state vs CPU chunked"));
      }
    }
  }

  std::mt19937 rng_{20240611};
};

TEST_F(CudaDeltaNetTest, SmallShapeAllModes) {
  for (int64_t n : {1, 2, 63, 64, 65, 200, 1024}) check_all_modes(kSmall, n);
}

TEST_F(CudaDeltaNetTest, Qwen27BShapeAllModes) {
  for (int64_t n : {1, 2, 63, 64, 65, 200, 1024}) check_all_modes(k27B, n);
}

TEST_F(CudaDeltaNetTest, Qwen35BShapeAllModes) {
  for (int64_t n : {1, 2, 64, 65, 200}) check_all_modes(k35B, n);
}

// More than one window of the chunked form (kDeltaNetWindowTokens = 1024) with a partial last chunk.
TEST_F(CudaDeltaNetTest, SeveralWindows) { check_all_modes(Shape{"small-nv8", 64, 64, 2, 8}, 2 * 1024 + 77); }

// Decays far below the realistic range: exp underflows inside every chunk, nothing may turn NaN.
TEST_F(CudaDeltaNetTest, ExtremeDecay) {
  check_all_modes(kSmall, 130, -60.0f);
  check_all_modes(k27B, 70, -60.0f);
}

// dk != dv on the fast kernels (the state slice is [dk, 32] of a [dk, dv] state).
TEST_F(CudaDeltaNetTest, UnequalHeadDims) {
  for (int64_t n : {1, 70}) {
    check_all_modes(Shape{"dk64-dv128", 64, 128, 1, 2}, n);
    check_all_modes(Shape{"dk128-dv32", 128, 32, 2, 2}, n);
  }
}

// Shapes the fast kernels do not take: dk = 48 / dv = 40 (generic recurrent kernel for every mode) and
// dk = 256 (fast recurrent kernel; chunked falls back to it).
TEST_F(CudaDeltaNetTest, FallbackShapes) {
  for (int64_t n : {1, 20, 65}) {
    check_all_modes(Shape{"dk48-dv40", 48, 40, 1, 2}, n);
    check_all_modes(Shape{"dk256-dv64", 256, 64, 2, 4}, n);
  }
}

// On a device whose CTAs may opt into 99 KB of shared memory (sm_86 / sm_89, emulated with
// set_smem_optin_cap), the chunked form at dk 128 (110 KB) does not fit: every mode runs the recurrence
// and still matches the CPU; dk 64 keeps the chunked form.
TEST_F(CudaDeltaNetTest, SmallSharedMemoryDeviceRunsTheRecurrenceAtDk128) {
  const auto chunked_ok = [](int64_t dk) {
    cuda::DeltaNetArgs a{};
    a.q = a.k = reinterpret_cast<const float*>(uintptr_t{256});
    a.dk = dk;
    a.dv = 128;
    a.nk = 2;
    a.nv = 4;
    return cuda::delta_net_chunked_ok(a);
  };
  EXPECT_TRUE(chunked_ok(128));
  const test::SmemOptinCap cap(99 * 1024);
  EXPECT_FALSE(chunked_ok(128));
  EXPECT_TRUE(chunked_ok(64));
  check_all_modes(k27B, 200);
}

// q and k 4 bytes off 16-byte alignment: the chunked path must refuse them and fall back correctly.
TEST_F(CudaDeltaNetTest, MisalignedQkFallsBack) {
  const int64_t n = 100;
  const Inputs in = make_inputs(rng_, k27B, n);
  const Run ref = run_cpu(test::ref_ctx(), in, n, DeltaNetMode::kRecurrent);
  const Run got = run_cuda(in, n, DeltaNetMode::kChunked, /*misalign_qk=*/1);
  EXPECT_TRUE(close(got.out, ref.out, k27B.dv, k27B.nv, kTol, "out"));
  EXPECT_TRUE(close(got.state, ref.state, k27B.dv, k27B.dk, kTol, "state"));
}

// Prefill with the chunked form, then decode token by token (kAuto, n = 1: the recurrent kernel) on the
// same device state == the whole sequence through the CPU recurrence.
TEST_F(CudaDeltaNetTest, ChunkedPrefillThenRecurrentDecode) {
  const Shape s = k27B;
  const int64_t n_prefill = 200, n_decode = 4, n = n_prefill + n_decode;
  const Inputs in = make_inputs(rng_, s, n);
  const Run ref = run_cpu(test::ref_ctx(), in, n, DeltaNetMode::kRecurrent);

  const TensorView dst = up(in.state);
  std::vector<float> out_all;
  auto step = [&](int64_t t0, int64_t len, DeltaNetMode mode) {
    Host q = token_slice(in.q, 2, t0, len), k = token_slice(in.k, 2, t0, len), v = token_slice(in.v, 2, t0, len);
    Host g = token_slice(in.g, 1, t0, len), beta = token_slice(in.beta, 1, t0, len);
    Host out({s.dv, s.nv, len});
    const TensorView dout = up(out);
    const Status st = delta_net(ctx_, up(q), up(k), up(v), up(g), up(beta), dst, dout, mode);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const std::vector<float> o = down(dout);
    out_all.insert(out_all.end(), o.begin(), o.end());
  };
  step(0, n_prefill, DeltaNetMode::kChunked);
  for (int64_t t = n_prefill; t < n; ++t) step(t, 1, DeltaNetMode::kAuto);
  EXPECT_TRUE(close(out_all, ref.out, s.dv, s.nv, kTol, "out [j, h, t]"));
  EXPECT_TRUE(close(down(dst), ref.state, s.dv, s.dk, kTol, "state [j, i, h]"));
}

// Each form is deterministic for a given n_tokens: two runs agree bit for bit.
TEST_F(CudaDeltaNetTest, Deterministic) {
  const int64_t n = 300;
  const Inputs in = make_inputs(rng_, k27B, n);
  for (DeltaNetMode mode : {DeltaNetMode::kChunked, DeltaNetMode::kRecurrent}) {
    const Run a = run_cuda(in, n, mode), b = run_cuda(in, n, mode);
    EXPECT_TRUE(a.out == b.out) << mode_name(mode) << " out";
    EXPECT_TRUE(a.state == b.state) << mode_name(mode) << " state";
  }
}

// delta_net_gated_q8 gives the bits of delta_net (recurrent) followed by rms_norm_gated_q8: out, state,
// y and the q8 activations, v read as a strided view (as the model's conv rows), one and three tokens.
TEST_F(CudaDeltaNetTest, GatedQ8MatchesTheChain) {
  const float eps = 1e-6f;
  for (const Shape& s : {k35B, k27B, kSmall, Shape{"dk64-dv64", 64, 64, 2, 6}}) {
    for (int64_t n : {1, 3}) {
      SCOPED_TRACE(std::string(s.name) + " n=" + std::to_string(n));
      const Inputs in = make_inputs(rng_, s, n);
      const int64_t dv = s.dv, nv = s.nv, rows = nv * n, v_ts = nv * dv + 64;
      Host vwide({v_ts * n}), w({dv}), z({dv, nv, n});
      for (int64_t t = 0; t < n; ++t) {
        std::copy(in.v.v.begin() + t * nv * dv, in.v.v.begin() + (t + 1) * nv * dv, vwide.v.begin() + t * v_ts + 32);
      }
      w.random(rng_, 0.5f, 1.5f);
      z.random(rng_, -3.0f, 3.0f);
      const TensorView dq = up(in.q), dk = up(in.k), dg = up(in.g), dbeta = up(in.beta), dw = up(w), dz = up(z);
      TensorView dv_view = up(vwide);
      dv_view.data = static_cast<float*>(dv_view.data) + 32;
      dv_view.ne = {dv, nv, n, 1};
      dv_view.nb = {4, 4 * dv, 4 * v_ts, 4 * v_ts * n};
      const int64_t act_bytes = cuda::norm_q8_act_bytes(dv, rows);
      Host act_host({(act_bytes + 3) / 4});
      std::memset(act_host.v.data(), 0x5A, 4 * act_host.v.size());

      const TensorView st1 = up(in.state), o1 = up(Host({dv, nv, n})), y1 = up(Host({dv, nv, n})), a1 = up(act_host);
      ASSERT_TRUE(delta_net(ctx_, dq, dk, dv_view, dg, dbeta, st1, o1, DeltaNetMode::kRecurrent).is_ok());
      ASSERT_TRUE(cuda::rms_norm_gated_q8(ctx_, o1, dw, dz, eps, y1, a1).is_ok());

      const TensorView st2 = up(in.state), o2 = up(Host({dv, nv, n})), y2 = up(Host({dv, nv, n})), a2 = up(act_host);
      ASSERT_TRUE(cuda::delta_net_gated_q8_applies(dq, dv_view, st2, o2));
      const Status st = cuda::delta_net_gated_q8(ctx_, dq, dk, dv_view, dg, dbeta, st2, o2, dw, dz, eps, y2, a2);
      ASSERT_TRUE(st.is_ok()) << st.to_string();

      const auto bits_equal = [&](const TensorView& a, const TensorView& b, const char* what) {
        const std::vector<float> x = down(a), y = down(b);
        EXPECT_EQ(0, std::memcmp(x.data(), y.data(), 4 * x.size())) << what;
      };
      bits_equal(o1, o2, "out");
      bits_equal(st1, st2, "state");
      bits_equal(y1, y2, "y");
      bits_equal(a1, a2, "q8 activations");
      const std::vector<float> a_got = down(a2);
      EXPECT_NE(0, std::memcmp(a_got.data(), act_host.v.data(), static_cast<size_t>(act_bytes))) << "nothing written";
      bufs_.clear();
    }
  }
  // Shapes outside the fused kernel: dv 256 (the model falls back to the two ops).
  const Inputs big = make_inputs(rng_, Shape{"dv256", 128, 256, 1, 2}, 1);
  Host o({256, 2, 1}), y({256, 2, 1}), w({256}), act({1024});
  const TensorView dst = up(big.state), dout = up(o);
  EXPECT_FALSE(cuda::delta_net_gated_q8_applies(up(big.q), up(big.v), dst, dout));
  const Status s = cuda::delta_net_gated_q8(ctx_, up(big.q), up(big.k), up(big.v), up(big.g), up(big.beta), dst, dout,
                                            up(w), up(o), 1e-6f, up(y), up(act));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
}

// delta_net_step_q8 gives the bits of delta_net_prep followed by delta_net_gated_q8 in every output (conv,
// q, k, g, beta, the carried conv inputs, out, state, y, q8), for clusters of 1 to 8 v-heads per q/k head
// and conv kernels of 2 to 4. Outputs start as NaN in both runs, so an element neither writes shows.
TEST_F(CudaDeltaNetTest, StepQ8MatchesTheChain) {
  if (!cuda::cluster_launch_enabled()) GTEST_SKIP() << "no thread-block clusters on this device";
  struct StepShape {
    int64_t nk, nv, dk, dv, kernel;
  };
  const float eps = 1e-6f;
  for (const StepShape& c : {StepShape{16, 32, 128, 128, 4}, StepShape{16, 48, 128, 128, 4},
                             StepShape{2, 4, 32, 32, 4}, StepShape{2, 6, 64, 64, 2}, StepShape{4, 4, 64, 64, 4},
                             StepShape{1, 8, 32, 32, 3}, StepShape{2, 2, 128, 96, 4}}) {
    SCOPED_TRACE(fmt::format("nk {} nv {} dk {} dv {} kernel {}", c.nk, c.nv, c.dk, c.dv, c.kernel));
    const int64_t n_ch = 2 * c.nk * c.dk + c.nv * c.dv;
    Host mixed({n_ch, 1}), conv_w({c.kernel, n_ch}), conv_state({n_ch, c.kernel - 1}), alpha({c.nv, 1}),
        b({c.nv, 1}), dt_bias({c.nv}), ssm_a({c.nv}), state({c.dv, c.dk, c.nv}), w({c.dv}), z({c.dv, c.nv, 1});
    mixed.random(rng_, -2.0f, 2.0f);
    conv_w.random(rng_, -0.6f, 0.6f);
    conv_state.random(rng_, -2.0f, 2.0f);
    alpha.random(rng_, -3.0f, 3.0f);
    b.random(rng_, -3.0f, 3.0f);
    dt_bias.random(rng_, -1.0f, 1.0f);
    ssm_a.random(rng_, -2.0f, -0.1f);
    state.random(rng_, -0.5f, 0.5f);
    w.random(rng_, 0.5f, 1.5f);
    z.random(rng_, -3.0f, 3.0f);
    const int64_t rows = c.nv, act_bytes = cuda::norm_q8_act_bytes(c.dv, rows);
    Host act_host({(act_bytes + 3) / 4});
    std::memset(act_host.v.data(), 0x5A, 4 * act_host.v.size());

    struct Outs {
      DeltaNetPrep p;
      TensorView state, out, y, act;
    };
    const auto make = [&] {
      Outs o;
      o.p.mixed = up(mixed);
      o.p.conv_w = up(conv_w);
      o.p.alpha = up(alpha);
      o.p.b = up(b);
      o.p.dt_bias = up(dt_bias);
      o.p.ssm_a = up(ssm_a);
      o.p.conv_state = up(conv_state);
      o.p.eps = eps;
      o.p.conv = up(Host({n_ch, 1}));
      o.p.q = up(Host({c.dk, c.nk, 1}));
      o.p.k = up(Host({c.dk, c.nk, 1}));
      o.p.g = up(Host({c.nv, 1}));
      o.p.beta = up(Host({c.nv, 1}));
      o.state = up(state);
      o.out = up(Host({c.dv, c.nv, 1}));
      o.y = up(Host({c.dv, c.nv, 1}));
      o.act = up(act_host);
      return o;
    };
    const TensorView dw = up(w), dz = up(z);

    const Outs chain = make();
    ASSERT_TRUE(delta_net_prep(ctx_, chain.p).is_ok());
    const TensorView v = delta_net_conv_heads(chain.p.conv, 2 * c.nk * c.dk, c.dv, c.nv);
    const Status s1 = cuda::delta_net_gated_q8(ctx_, chain.p.q, chain.p.k, v, chain.p.g, chain.p.beta, chain.state,
                                               chain.out, dw, dz, eps, chain.y, chain.act);
    ASSERT_TRUE(s1.is_ok()) << s1.to_string();

    const Outs step = make();
    ASSERT_TRUE(cuda::delta_net_step_q8_applies(step.p, step.state, step.out));
    const Status s2 = cuda::delta_net_step_q8(ctx_, step.p, step.state, step.out, dw, dz, eps, step.y, step.act);
    ASSERT_TRUE(s2.is_ok()) << s2.to_string();

    const auto bits_equal = [&](const TensorView& x, const TensorView& y, const char* what) {
      const std::vector<float> a = down(x), e = down(y);
      EXPECT_EQ(0, std::memcmp(a.data(), e.data(), 4 * a.size())) << what;
      if (std::string_view(what) != "q8 activations") {
        EXPECT_TRUE(std::all_of(e.begin(), e.end(), [](float f) { return std::isfinite(f); })) << what << " written";
      }
    };
    bits_equal(chain.p.conv, step.p.conv, "conv");
    bits_equal(chain.p.q, step.p.q, "q");
    bits_equal(chain.p.k, step.p.k, "k");
    bits_equal(chain.p.g, step.p.g, "g");
    bits_equal(chain.p.beta, step.p.beta, "beta");
    bits_equal(chain.p.conv_state, step.p.conv_state, "conv state");
    bits_equal(chain.out, step.out, "out");
    bits_equal(chain.state, step.state, "state");
    bits_equal(chain.y, step.y, "y");
    bits_equal(chain.act, step.act, "q8 activations");
    const std::vector<float> st_got = down(step.p.conv_state);
    if (c.kernel > 1) {
      EXPECT_NE(st_got, conv_state.v) << "conv state not updated";
    }
    bufs_.clear();
  }
}

// Shapes the step kernel does not take are refused with a clear status, not run.
TEST_F(CudaDeltaNetTest, StepQ8RefusesOtherShapes) {
  const int64_t nk = 1, dk = 32, dv = 32, kernel = 4;
  for (const int64_t nv : {int64_t{9}, int64_t{2}}) {  // a cluster of 9 v-heads; then two tokens
    const int64_t n = nv == 9 ? 1 : 2, n_ch = 2 * nk * dk + nv * dv;
    DeltaNetPrep p;
    p.mixed = up(Host({n_ch, n}));
    p.conv_w = up(Host({kernel, n_ch}));
    p.alpha = up(Host({nv, n}));
    p.b = up(Host({nv, n}));
    p.dt_bias = up(Host({nv}));
    p.ssm_a = up(Host({nv}));
    p.conv_state = up(Host({n_ch, kernel - 1}));
    p.conv = up(Host({n_ch, n}));
    p.q = up(Host({dk, nk, n}));
    p.k = up(Host({dk, nk, n}));
    p.g = up(Host({nv, n}));
    p.beta = up(Host({nv, n}));
    const TensorView st = up(Host({dv, dk, nv})), out = up(Host({dv, nv, n})), y = up(Host({dv, nv, n})),
                     z = up(Host({dv, nv, n})), w = up(Host({dv}));
    const TensorView act = up(Host({(cuda::norm_q8_act_bytes(dv, nv * n) + 3) / 4}));
    EXPECT_FALSE(cuda::delta_net_step_q8_applies(p, st, out));
    const Status s = cuda::delta_net_step_q8(ctx_, p, st, out, w, z, 1e-6f, y, act);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
    // out's heads do not cover the v channels: an argument error.
    TensorView short_out = out;
    short_out.ne[1] = nv - 1;
    const Status s2 = cuda::delta_net_step_q8(ctx_, p, st, short_out, w, z, 1e-6f, y, act);
    EXPECT_EQ(s2.code(), StatusCode::kInvalidArgument) << s2.to_string();
    bufs_.clear();
  }
}

#endif  // DS_HAVE_CUDA

}  // namespace
}  // namespace ds
