// moe_ffn_gathered (ops/cuda/cuda_ops.h) against the CPU reference moe_ffn and against the CUDA
// moe_ffn (which groups tokens per expert on the host): split and fused gate/up stacks, q4_K, q8_0,
// q6_K and f32 experts, 1..8 tokens, k = 8 of 64 experts and k = 2 of 4, unused slots (-1, and ids
// >= n_expert, which only the gathered path accepts) whose weights are NaN, so reading one shows.
// Outputs start as NaN. Skipped without a CUDA build or device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/half.h"
#include "ops/moe.h"
#include "ops_test_util.h"
#include "quant/quant.h"

#if DS_HAVE_CUDA
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

// Tolerances (max |a - b| / max(1, max |b|)), stated once:
//  - against a float64 reference that quantizes the activations of the quantized projections to int8
//    blocks the way the device does (x for gate / up, h for down): kTolQ8Reference. What remains is F32
//    rounding (1e-7 in CPU emulation of the kernels), except that the device's h (F32 sums, __expf)
//    differs from the float64 one by ~1e-7 relative, so now and then an h code lands on the other side
//    of a rounding boundary: one element moves by one step, 1/127 of its block's largest |h|, which can
//    reach ~2.5e-3 of the largest output;
//  - against the CPU reference op (exact activations): quantized experts kTolExact, since h = silu(g) * u
//    is heavy-tailed (a product of two sums), so the int8 step of a block (its largest |h| / 127) is
//    large against most of its elements: about 1e-2 of the largest output was measured on these data;
//    f32 experts run F32 kernels: kTolF32Experts;
//  - against the CUDA moe_ffn: both quantize the same rows the same way and run the same kernels, so
//    only the order of the weighted sum over slots differs: kTolSameKernels.
constexpr double kTolQ8Reference = 5e-3;
constexpr double kTolExact = 6e-2;
constexpr double kTolF32Experts = 1e-4;
constexpr double kTolSameKernels = 1e-4;

// Random rows of type t (k elements each): floats for F32, random bytes with fp16 scales in
// [0.002, 0.02) for quantized types, so every code pattern occurs.
std::vector<uint8_t> random_rows(DType t, int64_t n_rows, int64_t k, std::mt19937& rng) {
  const int64_t rb = dtype_row_bytes(t, k);
  std::vector<uint8_t> w(static_cast<size_t>(rb * n_rows));
  std::uniform_real_distribution<float> uni(-0.5f, 0.5f), sc(0.002f, 0.02f);
  if (t == DType::F32) {
    for (int64_t i = 0; i < n_rows * k; ++i) {
      const float f = uni(rng);
      std::memcpy(w.data() + 4 * i, &f, 4);
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const int64_t bb = dtype_block_bytes(t);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t b = 0; b < k / dtype_block_size(t); ++b) {
      uint8_t* blk = w.data() + r * rb + b * bb;
      auto put16 = [&](int64_t off, float v) {
        const uint16_t h = f32_to_fp16(v);
        std::memcpy(blk + off, &h, 2);
      };
      if (t == DType::Q6_K) {
        put16(208, sc(rng));
      } else {
        put16(0, sc(rng));
        if (t == DType::Q4_K || t == DType::Q5_K) put16(2, sc(rng));
      }
    }
  }
  return w;
}

// The device's int8 activation blocks of 32, applied in place: q = round(v * 127 / amax), v = q * amax / 127.
void q8_round_trip(std::vector<double>& v) {
  for (size_t b = 0; b + 32 <= v.size(); b += 32) {
    float amax = 0.0f;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(static_cast<float>(v[b + i])));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (size_t i = 0; i < 32; ++i) v[b + i] = std::nearbyint(static_cast<float>(v[b + i]) * id) * d;
  }
}

// y = sum over used slots of w * down(silu(gate x) * up x) in float64 on dequantized weights
// ([X][rows][cols]); q8_gate / q8_up / q8_down: that projection sees int8-quantized activations.
std::vector<float> moe_reference(const std::vector<float>& gate, const std::vector<float>& up,
                                 const std::vector<float>& down, const std::vector<float>& x,
                                 const std::vector<int32_t>& ids, const std::vector<float>& wts, int64_t E, int64_t F,
                                 int64_t X, int64_t k, int64_t n_tokens, bool q8_gate, bool q8_up, bool q8_down) {
  std::vector<float> y(static_cast<size_t>(E * n_tokens), 0.0f);
  std::vector<double> acc(static_cast<size_t>(E));
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<double> xe(x.begin() + t * E, x.begin() + (t + 1) * E), xq = xe;
    q8_round_trip(xq);
    const std::vector<double>& xg = q8_gate ? xq : xe;
    const std::vector<double>& xu = q8_up ? xq : xe;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[static_cast<size_t>(t * k + j)];
      if (e < 0 || e >= X) continue;
      std::vector<double> h(static_cast<size_t>(F));
      for (int64_t r = 0; r < F; ++r) {
        double g = 0.0, u = 0.0;
        for (int64_t c = 0; c < E; ++c) {
          g += static_cast<double>(gate[static_cast<size_t>((e * F + r) * E + c)]) * xg[static_cast<size_t>(c)];
          u += static_cast<double>(up[static_cast<size_t>((e * F + r) * E + c)]) * xu[static_cast<size_t>(c)];
        }
        h[static_cast<size_t>(r)] = g / (1.0 + std::exp(-g)) * u;
      }
      if (q8_down) q8_round_trip(h);
      const double wt = wts[static_cast<size_t>(t * k + j)];
      for (int64_t c = 0; c < E; ++c) {
        double o = 0.0;
        for (int64_t r = 0; r < F; ++r) o += static_cast<double>(down[static_cast<size_t>((e * E + c) * F + r)]) * h[static_cast<size_t>(r)];
        acc[static_cast<size_t>(c)] += wt * o;
      }
    }
    for (int64_t c = 0; c < E; ++c) y[static_cast<size_t>(t * E + c)] = static_cast<float>(acc[static_cast<size_t>(c)]);
  }
  return y;
}

std::vector<float> dequantized(DType t, const std::vector<uint8_t>& b, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  quant::dequantize_rows(t, b.data(), out.data(), rows, cols, 1);
  return out;
}

struct MoeCase {
  DType gate, up, down;  // up is ignored when fused
  bool fused;
  int64_t n_embd, n_ff, n_expert, k;
};

std::string describe(const MoeCase& c, int64_t n_tokens) {
  return fmt::format("gate {} up {} down {} fused {} n_embd {} n_ff {} experts {} k {} tokens {}", dtype_name(c.gate),
                     dtype_name(c.fused ? c.gate : c.up), dtype_name(c.down), c.fused, c.n_embd, c.n_ff, c.n_expert,
                     c.k, n_tokens);
}

class CudaMoeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto s = cuda::Stream::create(0);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    stream_ = std::move(*s);
    ctx_.device = Device{DeviceKind::kCuda, 0};
    ctx_.cuda_stream = stream_.handle();
  }

  // A device copy of host bytes, viewed like `like`, kept alive by the fixture.
  TensorView up(const TensorView& like, const void* host, int64_t bytes) {
    auto b = cuda::CudaBuffer::allocate(0, bytes);
    EXPECT_TRUE(b.is_ok());
    EXPECT_TRUE(cuda::copy_to_device(b->data(), host, bytes, stream_).is_ok());
    TensorView d = like;
    d.data = b->data();
    d.device = ctx_.device;
    bufs_.push_back(std::move(*b));
    return d;
  }
  std::vector<float> down(const TensorView& d, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    EXPECT_TRUE(cuda::copy_to_host(out.data(), d.data, 4 * n, stream_).is_ok());
    const Status s = stream_.synchronize();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
  }

  // One case: gathered vs the CPU reference, and (unless ids hold values >= n_expert) vs the CUDA moe_ffn.
  void run(const MoeCase& c, int64_t n_tokens, bool out_of_range_ids) {
    const std::string where = describe(c, n_tokens);
    const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert, k = c.k;
    std::vector<uint8_t> gate_b, up_b, gu_b, down_b;
    MoeExperts eh;
    if (c.fused) {
      gu_b = random_rows(c.gate, 2 * F * X, E, rng_);
      eh.gate_up = TensorView::contiguous(gu_b.data(), c.gate, {E, 2 * F, X});
    } else {
      gate_b = random_rows(c.gate, F * X, E, rng_);
      up_b = random_rows(c.up, F * X, E, rng_);
      eh.gate = TensorView::contiguous(gate_b.data(), c.gate, {E, F, X});
      eh.up = TensorView::contiguous(up_b.data(), c.up, {E, F, X});
    }
    down_b = random_rows(c.down, E * X, F, rng_);
    eh.down = TensorView::contiguous(down_b.data(), c.down, {F, E, X});

    test::Host x({E, n_tokens});
    x.random(rng_, -1.0f, 1.0f);
    // Routing: k distinct experts per token; every 5th slot (from the 4th) unused; with
    // out_of_range_ids, slot 1 gets an id past the last expert. Unused slots weigh NaN.
    std::vector<int32_t> ids(static_cast<size_t>(n_tokens * k)), ids_ref(ids.size());
    std::vector<float> wts(ids.size()), wts_ref(ids.size());
    std::uniform_real_distribution<float> wd(0.1f, 1.0f);
    std::vector<int32_t> perm(static_cast<size_t>(X));
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      for (int64_t j = 0; j < k; ++j) {
        const size_t s = static_cast<size_t>(t * k + j);
        ids[s] = perm[static_cast<size_t>(j)];
        wts[s] = wd(rng_);
        if (s % 5 == 3) ids[s] = -1;
        if (out_of_range_ids && s == 1) ids[s] = static_cast<int32_t>(X + 3);
        const bool used = ids[s] >= 0 && ids[s] < X;
        if (!used) wts[s] = std::numeric_limits<float>::quiet_NaN();
        ids_ref[s] = used ? ids[s] : 0;  // the CPU op has no unused slots: expert 0 with weight 0
        wts_ref[s] = used ? wts[s] : 0.0f;
      }
    }
    const TensorView ids_t = TensorView::contiguous(ids.data(), DType::I32, {k, n_tokens});
    const TensorView ids_ref_t = TensorView::contiguous(ids_ref.data(), DType::I32, {k, n_tokens});
    const TensorView wts_t = TensorView::contiguous(wts.data(), DType::F32, {k, n_tokens});
    const TensorView wts_ref_t = TensorView::contiguous(wts_ref.data(), DType::F32, {k, n_tokens});
    test::Host ref({E, n_tokens});
    ASSERT_TRUE(moe_ffn(test::ref_ctx(), x.t, eh, ids_ref_t, wts_ref_t, ref.t).is_ok()) << where;

    MoeExperts ed;
    if (c.fused) {
      ed.gate_up = up(eh.gate_up, gu_b.data(), static_cast<int64_t>(gu_b.size()));
    } else {
      ed.gate = up(eh.gate, gate_b.data(), static_cast<int64_t>(gate_b.size()));
      ed.up = up(eh.up, up_b.data(), static_cast<int64_t>(up_b.size()));
    }
    ed.down = up(eh.down, down_b.data(), static_cast<int64_t>(down_b.size()));
    const TensorView dx = up(x.t, x.v.data(), 4 * E * n_tokens);
    const TensorView dids = up(ids_t, ids.data(), 4 * k * n_tokens);
    const TensorView dwts = up(wts_t, wts.data(), 4 * k * n_tokens);
    test::Host out({E, n_tokens});  // NaN
    const TensorView dy = up(out.t, out.v.data(), 4 * E * n_tokens);
    const Status s = cuda::moe_ffn_gathered(ctx_, dx, ed, dids, dwts, dy);
    ASSERT_TRUE(s.is_ok()) << where << ": " << s.to_string();
    const std::vector<float> got = down(dy, E * n_tokens);
    const bool all_f32 = c.gate == DType::F32 && (c.fused || c.up == DType::F32) && c.down == DType::F32;
    EXPECT_LE(test::rel_err(got, ref.v), all_f32 ? kTolF32Experts : kTolExact) << where << " (vs CPU reference op)";
    // The float64 reference with the device's int8 activations (unused slots: weight NaN, skipped).
    std::vector<float> gate_f, up_f;
    if (c.fused) {
      const std::vector<float> all = dequantized(c.gate, gu_b, 2 * F * X, E);
      gate_f.resize(static_cast<size_t>(F * X * E));
      up_f.resize(gate_f.size());
      for (int64_t e = 0; e < X; ++e) {
        std::copy_n(all.begin() + (2 * e * F) * E, F * E, gate_f.begin() + e * F * E);
        std::copy_n(all.begin() + (2 * e * F + F) * E, F * E, up_f.begin() + e * F * E);
      }
    } else {
      gate_f = dequantized(c.gate, gate_b, F * X, E);
      up_f = dequantized(c.up, up_b, F * X, E);
    }
    const DType up_type = c.fused ? c.gate : c.up;
    const std::vector<float> ref_q8 =
        moe_reference(gate_f, up_f, dequantized(c.down, down_b, E * X, F), x.v, ids, wts, E, F, X, k, n_tokens,
                      c.gate != DType::F32, up_type != DType::F32, c.down != DType::F32);
    EXPECT_LE(test::rel_err(got, ref_q8), all_f32 ? kTolF32Experts : kTolQ8Reference)
        << where << " (vs float64 reference on int8 activations)";
    for (size_t i = 0; i < got.size(); ++i) {
      if (!std::isfinite(got[i])) {
        ADD_FAILURE() << where << ": y[token " << i / E << ", " << i % E << "] = " << got[i];
        break;
      }
    }
    if (out_of_range_ids) return;
    test::Host out2({E, n_tokens});
    const TensorView dy2 = up(out2.t, out2.v.data(), 4 * E * n_tokens);
    const Status s2 = moe_ffn(ctx_, dx, ed, dids, dwts, dy2);
    ASSERT_TRUE(s2.is_ok()) << where << ": " << s2.to_string();
    EXPECT_LE(test::rel_err(got, down(dy2, E * n_tokens)), kTolSameKernels) << where << " (vs CUDA moe_ffn)";
    bufs_.clear();
  }

  cuda::Stream stream_;
  OpContext ctx_;
  std::vector<cuda::CudaBuffer> bufs_;
  std::mt19937 rng_{4321};
};

TEST_F(CudaMoeTest, QuantizedExpertsEightOfSixtyFour) {
  for (bool fused : {false, true}) {
    const MoeCase q4k{DType::Q4_K, DType::Q4_K, DType::Q4_K, fused, 512, 256, 64, 8};
    const MoeCase q8{DType::Q8_0, DType::Q8_0, DType::Q8_0, fused, 256, 96, 64, 8};
    for (int64_t n_tokens : {1, 2, 3, 5, 8}) {
      run(q4k, n_tokens, false);
      run(q8, n_tokens, false);
    }
  }
}

TEST_F(CudaMoeTest, MixedTypesTwoOfFour) {
  const MoeCase mixed{DType::Q4_K, DType::Q8_0, DType::Q6_K, false, 512, 256, 4, 2};
  const MoeCase f32_down{DType::Q4_K, DType::Q4_K, DType::F32, true, 256, 256, 4, 2};
  for (int64_t n_tokens : {1, 4, 7, 8}) {
    run(mixed, n_tokens, false);
    run(f32_down, n_tokens, false);
  }
}

TEST_F(CudaMoeTest, F32Experts) {
  for (bool fused : {false, true}) {
    // n_ff 96: the down projection's k is not a multiple of 32, so h stays F32 (no q8 kernel anywhere).
    const MoeCase f32{DType::F32, DType::F32, DType::F32, fused, 256, 96, 64, 8};
    const MoeCase f32_small{DType::F32, DType::F32, DType::F32, fused, 40, 24, 4, 2};
    for (int64_t n_tokens : {1, 4, 8}) {
      run(f32, n_tokens, false);
      run(f32_small, n_tokens, false);
    }
  }
}

TEST_F(CudaMoeTest, OutOfRangeIdsAreUnusedSlots) {
  run({DType::Q4_K, DType::Q4_K, DType::Q4_K, false, 256, 256, 64, 8}, 3, true);
  run({DType::F32, DType::F32, DType::F32, true, 64, 32, 4, 2}, 5, true);
}

// Argument checks happen before any device work: runs without a device (the pointers are never used).
TEST(CudaMoeGathered, TooManySlotsAndBadShapesAreInvalidArgument) {
  const int64_t E = 64, F = 32, X = 16, k = 8, n_tokens = cuda::kMoeGatheredMaxSlots / k + 1;
  OpContext ctx;
  ctx.device = Device{DeviceKind::kCuda, 0};
  alignas(16) static uint8_t fake[16];
  const Device d = ctx.device;
  MoeExperts e;
  e.gate_up = TensorView::contiguous(fake, DType::F32, {E, 2 * F, X}, d);
  e.down = TensorView::contiguous(fake, DType::F32, {F, E, X}, d);
  const TensorView x = TensorView::contiguous(fake, DType::F32, {E, n_tokens}, d);
  const TensorView y = TensorView::contiguous(fake + 4, DType::F32, {E, n_tokens}, d);
  const TensorView ids = TensorView::contiguous(fake, DType::I32, {k, n_tokens}, d);
  const TensorView w = TensorView::contiguous(fake, DType::F32, {k, n_tokens}, d);
  Status s = cuda::moe_ffn_gathered(ctx, x, e, ids, w, y);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("slots"), std::string::npos) << s.message();

  const TensorView ids_bad = TensorView::contiguous(fake, DType::I32, {k + 1, n_tokens}, d);
  s = cuda::moe_ffn_gathered(ctx, x, e, ids_bad, w, y);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  MoeExperts e_bad = e;
  e_bad.down = TensorView::contiguous(fake, DType::F32, {F + 1, E, X}, d);
  const TensorView x1 = TensorView::contiguous(fake, DType::F32, {E, 1}, d);
  const TensorView y1 = TensorView::contiguous(fake + 4, DType::F32, {E, 1}, d);
  const TensorView ids1 = TensorView::contiguous(fake, DType::I32, {k, 1}, d);
  const TensorView w1 = TensorView::contiguous(fake, DType::F32, {k, 1}, d);
  s = cuda::moe_ffn_gathered(ctx, x1, e_bad, ids1, w1, y1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  MoeExperts e_q51 = e;
  e_q51.gate_up = TensorView::contiguous(fake, DType::Q5_1, {E, 2 * F, X}, d);
  s = cuda::moe_ffn_gathered(ctx, x1, e_q51, ids1, w1, y1);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  OpContext cpu;
  s = cuda::moe_ffn_gathered(cpu, x1, e, ids1, w1, y1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

#else  // !DS_HAVE_CUDA

TEST(CudaMoeTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
