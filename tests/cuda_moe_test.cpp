// moe_ffn_gathered (ops/cuda/cuda_ops.h) against the CPU reference moe_ffn and against the CUDA
// moe_ffn: split and fused gate/up stacks, q4_K, q8_0, q6_K and f32 experts, 1..8 tokens, k = 8 of 64
// experts and k = 2 of 4, unused slots (-1, and ids >= n_expert, which the CPU op refuses) whose
// weights are NaN, so reading one shows.
// moe_ffn_grouped (prefill batches) against a float64 reference on BF16 operands and the CPU op: every
// type it takes, runs of several tiles, k and row tails, the 35B-A3B's expert shape; the CUDA moe_ffn
// op gives its bits again.
// moe_block_decode (the whole MoE block of a decode step) against a float64 reference on the device's
// int8 activations and against the CPU op chain (router matmul, moe_route, moe_ffn, shared expert):
// k = 8 of 256 at the real 35B-A3B shape, k = 2 of 4 with 32 tokens (64 slots), shared-expert types
// that differ from the routed ones, exact ties in the router logits (identical router rows), and a
// replay as a CUDA graph; its routing kernel alone against quantize_q8 and the CUDA moe_route; its fused
// down + combine launch bit for bit against the gathered down launch and the combine; with its input
// norm (moe_block_decode_add_norm) bit for bit against add_rms_norm and moe_block_decode.
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
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "quant/quant.h"

#if DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/moe_launch.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"
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
//  - against the CUDA moe_ffn: with F32 experts both run F32 products: kTolQ8Reference; with quantized
//    experts the CUDA moe_ffn runs BF16 tensor-core products (moe_ffn_grouped): kTolExact;
//  - moe_ffn_grouped against a float64 reference that rounds x, h and the weights to BF16 as the device
//    does: kTolBf16Reference. What remains is F32 summation order, except that an h on the other side of a
//    BF16 rounding boundary (the device's h differs from the float64 one by ~1e-7 relative) moves one
//    term by 2^-8 of itself, ~1e-4 of the largest output per flip on these data.
constexpr double kTolQ8Reference = 5e-3;
constexpr double kTolBf16Reference = 2e-3;
constexpr double kTolExact = 6e-2;
constexpr double kTolF32Experts = 1e-4;

// Random rows of type t (k elements each): floats for F32, F16 and BF16, random bytes with fp16 scales in
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
  if (t == DType::F16 || t == DType::BF16) {
    for (int64_t i = 0; i < n_rows * k; ++i) {
      const float f = uni(rng);
      const uint16_t h = t == DType::F16 ? f32_to_fp16(f) : f32_to_bf16(f);
      std::memcpy(w.data() + 2 * i, &h, 2);
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

// How a projection's activations reach the device's products: exact, int8 blocks (the q8 kernels) or
// BF16 (the grouped tensor-core products).
enum class Act { kExact, kQ8, kBf16 };

void bf16_round_trip(std::vector<double>& v) {
  for (double& e : v) e = bf16_to_f32(f32_to_bf16(static_cast<float>(e)));
}

void act_round_trip(Act a, std::vector<double>& v) {
  if (a == Act::kQ8) q8_round_trip(v);
  if (a == Act::kBf16) bf16_round_trip(v);
}

// y = sum over used slots of w * down(silu(gate x) * up x) in float64 on dequantized weights
// ([X][rows][cols]), each projection's activations rounded as `act_*` says.
std::vector<float> moe_reference(const std::vector<float>& gate, const std::vector<float>& up,
                                 const std::vector<float>& down, const std::vector<float>& x,
                                 const std::vector<int32_t>& ids, const std::vector<float>& wts, int64_t E, int64_t F,
                                 int64_t X, int64_t k, int64_t n_tokens, Act act_gate, Act act_up, Act act_down) {
  std::vector<float> y(static_cast<size_t>(E * n_tokens), 0.0f);
  std::vector<double> acc(static_cast<size_t>(E));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const std::vector<double> xe(x.begin() + t * E, x.begin() + (t + 1) * E);
    std::vector<double> xg = xe, xu = xe;
    act_round_trip(act_gate, xg);
    act_round_trip(act_up, xu);
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
      act_round_trip(act_down, h);
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

// Which slots a case leaves unused: slot s when s % unused_period == unused_phase (id -1), and
// out_of_range_slot (>= 0) with an id past the last expert; with hot, slot 0 of token t routes to expert
// t % 3, so those experts get runs of several tiles in the grouped path.
struct MoeRouting {
  int64_t unused_period = 5, unused_phase = 3;
  int64_t out_of_range_slot = -1;
  bool hot = false;
};

// A case's random data: the expert stacks (host bytes and views), x, and a routing of k distinct experts
// per token whose unused slots weigh NaN (so reading one shows); ids_ref / wts_ref are the same routing
// for the CPU op, which has no unused slots (expert 0 with weight 0).
struct MoeData {
  std::vector<uint8_t> gate_b, up_b, gu_b, down_b;
  MoeExperts host;
  test::Host x = test::Host({1});
  std::vector<int32_t> ids, ids_ref;
  std::vector<float> wts, wts_ref;
};

class CudaMoeCaseTest : public test::CudaTest {
 protected:
  explicit CudaMoeCaseTest(uint32_t seed) : rng_(seed) {}

  MoeData make_data(const MoeCase& c, int64_t n_tokens, const MoeRouting& r) {
    const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert, k = c.k;
    MoeData d;
    if (c.fused) {
      d.gu_b = random_rows(c.gate, 2 * F * X, E, rng_);
      d.host.gate_up = TensorView::contiguous(d.gu_b.data(), c.gate, {E, 2 * F, X});
    } else {
      d.gate_b = random_rows(c.gate, F * X, E, rng_);
      d.up_b = random_rows(c.up, F * X, E, rng_);
      d.host.gate = TensorView::contiguous(d.gate_b.data(), c.gate, {E, F, X});
      d.host.up = TensorView::contiguous(d.up_b.data(), c.up, {E, F, X});
    }
    d.down_b = random_rows(c.down, E * X, F, rng_);
    d.host.down = TensorView::contiguous(d.down_b.data(), c.down, {F, E, X});
    d.x = test::Host({E, n_tokens});
    d.x.random(rng_, -1.0f, 1.0f);
    d.ids.resize(static_cast<size_t>(n_tokens * k));
    d.ids_ref.resize(d.ids.size());
    d.wts.resize(d.ids.size());
    d.wts_ref.resize(d.ids.size());
    std::uniform_real_distribution<float> wd(0.1f, 1.0f);
    std::vector<int32_t> perm(static_cast<size_t>(X));
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng_);
      if (r.hot) std::swap(perm[0], *std::find(perm.begin(), perm.end(), static_cast<int32_t>(t % 3)));
      for (int64_t j = 0; j < k; ++j) {
        const size_t s = static_cast<size_t>(t * k + j);
        d.ids[s] = perm[static_cast<size_t>(j)];
        d.wts[s] = wd(rng_);
        if (static_cast<int64_t>(s) % r.unused_period == r.unused_phase) d.ids[s] = -1;
        if (static_cast<int64_t>(s) == r.out_of_range_slot) d.ids[s] = static_cast<int32_t>(X + 3);
        const bool used = d.ids[s] >= 0 && d.ids[s] < X;
        if (!used) d.wts[s] = std::numeric_limits<float>::quiet_NaN();
        d.ids_ref[s] = used ? d.ids[s] : 0;
        d.wts_ref[s] = used ? d.wts[s] : 0.0f;
      }
    }
    return d;
  }

  // The CPU reference op on the case (exact activations).
  std::vector<float> cpu_reference(const MoeCase& c, MoeData& d) {
    const int64_t k = c.k, n_tokens = d.x.t.ne[1];
    test::Host ref({c.n_embd, n_tokens});
    const TensorView ids_ref = TensorView::contiguous(d.ids_ref.data(), DType::I32, {k, n_tokens});
    const TensorView wts_ref = TensorView::contiguous(d.wts_ref.data(), DType::F32, {k, n_tokens});
    const Status s = moe_ffn(test::ref_ctx(), d.x.t, d.host, ids_ref, wts_ref, ref.t);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return ref.v;
  }

  // Dequantized gate and up rows [X][F][E] (split from a fused stack) and down rows [X][E][F], each
  // value rounded to BF16 with bf16.
  void expert_floats(const MoeCase& c, const MoeData& d, bool bf16, std::vector<float>* gate_f,
                     std::vector<float>* up_f, std::vector<float>* down_f) {
    const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert;
    auto floats = [bf16](DType t, const std::vector<uint8_t>& b, int64_t rows, int64_t cols) {
      std::vector<float> f = dequantized(t, b, rows, cols);
      if (bf16) {
        for (float& v : f) v = bf16_to_f32(f32_to_bf16(v));
      }
      return f;
    };
    if (c.fused) {
      const std::vector<float> all = floats(c.gate, d.gu_b, 2 * F * X, E);
      gate_f->resize(static_cast<size_t>(F * X * E));
      up_f->resize(gate_f->size());
      for (int64_t e = 0; e < X; ++e) {
        std::copy_n(all.begin() + (2 * e * F) * E, F * E, gate_f->begin() + e * F * E);
        std::copy_n(all.begin() + (2 * e * F + F) * E, F * E, up_f->begin() + e * F * E);
      }
    } else {
      *gate_f = floats(c.gate, d.gate_b, F * X, E);
      *up_f = floats(c.up, d.up_b, F * X, E);
    }
    *down_f = floats(c.down, d.down_b, E * X, F);
  }

  // The stacks, x, ids and weights on the device.
  struct DeviceCase {
    MoeExperts experts;
    TensorView x, ids, wts;
  };
  DeviceCase upload(const MoeCase& c, MoeData& d) {
    const int64_t k = c.k, n_tokens = d.x.t.ne[1];
    DeviceCase dc;
    if (c.fused) {
      dc.experts.gate_up = up(d.host.gate_up, d.gu_b.data(), static_cast<int64_t>(d.gu_b.size()));
    } else {
      dc.experts.gate = up(d.host.gate, d.gate_b.data(), static_cast<int64_t>(d.gate_b.size()));
      dc.experts.up = up(d.host.up, d.up_b.data(), static_cast<int64_t>(d.up_b.size()));
    }
    dc.experts.down = up(d.host.down, d.down_b.data(), static_cast<int64_t>(d.down_b.size()));
    dc.x = up(d.x);
    dc.ids = up(TensorView::contiguous(d.ids.data(), DType::I32, {k, n_tokens}), d.ids.data(), 4 * k * n_tokens);
    dc.wts = up(TensorView::contiguous(d.wts.data(), DType::F32, {k, n_tokens}), d.wts.data(), 4 * k * n_tokens);
    return dc;
  }

  static void expect_finite(const std::vector<float>& y, int64_t E, const std::string& where) {
    for (size_t i = 0; i < y.size(); ++i) {
      if (!std::isfinite(y[i])) {
        ADD_FAILURE() << where << ": y[token " << i / E << ", " << i % E << "] = " << y[i];
        return;
      }
    }
  }

  std::mt19937 rng_;
};

class CudaMoeTest : public CudaMoeCaseTest {
 protected:
  CudaMoeTest() : CudaMoeCaseTest(4321) {}

  // One case: gathered vs the CPU reference, and (unless ids hold values >= n_expert) vs the CUDA moe_ffn.
  void run(const MoeCase& c, int64_t n_tokens, bool out_of_range_ids) {
    const std::string where = describe(c, n_tokens);
    const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert, k = c.k;
    MoeData d = make_data(c, n_tokens, MoeRouting{5, 3, out_of_range_ids ? 1 : -1, false});
    const std::vector<float> ref = cpu_reference(c, d);
    const DeviceCase dc = upload(c, d);
    test::Host out({E, n_tokens});  // NaN
    const TensorView dy = up(out);
    const Status s = cuda::moe_ffn_gathered(ctx_, dc.x, dc.experts, dc.ids, dc.wts, dy);
    ASSERT_TRUE(s.is_ok()) << where << ": " << s.to_string();
    const std::vector<float> got = down(dy, E * n_tokens);
    const bool all_f32 = c.gate == DType::F32 && (c.fused || c.up == DType::F32) && c.down == DType::F32;
    EXPECT_LE(test::rel_err(got, ref), all_f32 ? kTolF32Experts : kTolExact) << where << " (vs CPU reference op)";
    // The float64 reference with the device's int8 activations (unused slots: weight NaN, skipped).
    std::vector<float> gate_f, up_f, down_f;
    expert_floats(c, d, false, &gate_f, &up_f, &down_f);
    const DType up_type = c.fused ? c.gate : c.up;
    const std::vector<float> ref_q8 =
        moe_reference(gate_f, up_f, down_f, d.x.v, d.ids, d.wts, E, F, X, k, n_tokens,
                      c.gate != DType::F32 ? Act::kQ8 : Act::kExact, up_type != DType::F32 ? Act::kQ8 : Act::kExact,
                      c.down != DType::F32 ? Act::kQ8 : Act::kExact);
    EXPECT_LE(test::rel_err(got, ref_q8), all_f32 ? kTolF32Experts : kTolQ8Reference)
        << where << " (vs float64 reference on int8 activations)";
    expect_finite(got, E, where);
    if (out_of_range_ids) return;
    test::Host out2({E, n_tokens});
    const TensorView dy2 = up(out2);
    const Status s2 = moe_ffn(ctx_, dc.x, dc.experts, dc.ids, dc.wts, dy2);
    ASSERT_TRUE(s2.is_ok()) << where << ": " << s2.to_string();
    // The CUDA moe_ffn runs quantized experts as grouped BF16 products (moe_ffn_grouped), F32 ones as F32.
    EXPECT_LE(test::rel_err(got, down(dy2, E * n_tokens)), all_f32 ? kTolQ8Reference : kTolExact)
        << where << " (vs CUDA moe_ffn)";
    bufs_.clear();
  }
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

// moe_ffn_grouped (prefill batches): against the float64 reference on BF16 operands, the CPU reference
// op, and the CUDA moe_ffn op (which must take the grouped path and give the same bits: the pairs'
// order inside an expert's run changes from run to run, no output bit may).
// moe_ffn_grouped (prefill batches): against the float64 reference on BF16 operands, the CPU reference
// op, and the CUDA moe_ffn op (which must take the grouped path and give the same bits: the pairs'
// order inside an expert's run changes from run to run, no output bit may).
class CudaMoeGroupedTest : public CudaMoeCaseTest {
 protected:
  CudaMoeGroupedTest() : CudaMoeCaseTest(987) {}

  // Every 7th slot (from the 6th) unused; with out_of_range_ids, slot 2 past the last expert.
  void run(const MoeCase& c, int64_t n_tokens, bool hot, bool out_of_range_ids) {
    const std::string where = describe(c, n_tokens) + (hot ? " hot" : "");
    const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert, k = c.k;
    MoeData d = make_data(c, n_tokens, MoeRouting{7, 5, out_of_range_ids ? 2 : -1, hot});
    const std::vector<float> ref = cpu_reference(c, d);
    std::vector<float> gate_f, up_f, down_f;
    expert_floats(c, d, true, &gate_f, &up_f, &down_f);  // the weights as the device sees them
    const std::vector<float> ref_bf16 = moe_reference(gate_f, up_f, down_f, d.x.v, d.ids, d.wts, E, F, X, k, n_tokens,
                                                      Act::kBf16, Act::kBf16, Act::kBf16);
    const DeviceCase dc = upload(c, d);
    ASSERT_TRUE(cuda::moe_ffn_grouped_takes(dc.x, dc.experts)) << where;
    test::Host out({E, n_tokens});  // NaN
    const TensorView dy = up(out);
    const Status s = cuda::moe_ffn_grouped(ctx_, dc.x, dc.experts, dc.ids, dc.wts, dy);
    ASSERT_TRUE(s.is_ok()) << where << ": " << s.to_string();
    const std::vector<float> got = down(dy, E * n_tokens);
    EXPECT_LE(test::rel_err(got, ref_bf16), kTolBf16Reference) << where << " (vs float64 reference on BF16)";
    EXPECT_LE(test::rel_err(got, ref), kTolExact) << where << " (vs CPU reference op)";
    expect_finite(got, E, where);
    test::Host out2({E, n_tokens});
    const TensorView dy2 = up(out2);
    const Status s2 = moe_ffn(ctx_, dc.x, dc.experts, dc.ids, dc.wts, dy2);
    ASSERT_TRUE(s2.is_ok()) << where << ": " << s2.to_string();
    const std::vector<float> got2 = down(dy2, E * n_tokens);
    EXPECT_EQ(std::memcmp(got.data(), got2.data(), 4 * got.size()), 0) << where << " (moe_ffn op, second run)";
    // Either tile size, whichever the automatic pick was: the same bits.
    for (int tile_m : {cuda::kMoeGroupM, cuda::kMoeGroupMLarge, cuda::kMoeGroupMMax}) {
      test::Host out3({E, n_tokens});
      const TensorView dy3 = up(out3);
      const Status s3 = cuda::moe_ffn_grouped(ctx_, dc.x, dc.experts, dc.ids, dc.wts, dy3, tile_m);
      ASSERT_TRUE(s3.is_ok()) << where << " tiles of " << tile_m << ": " << s3.to_string();
      EXPECT_EQ(std::memcmp(got.data(), down(dy3, E * n_tokens).data(), 4 * got.size()), 0)
          << where << " (tiles of " << tile_m << " pairs)";
    }
    bufs_.clear();
  }
};

TEST_F(CudaMoeGroupedTest, QuantizedExpertsManyTokens) {
  for (bool fused : {false, true}) {
    const MoeCase q4k{DType::Q4_K, DType::Q4_K, DType::Q6_K, fused, 512, 256, 16, 4};
    run(q4k, 9, false, false);
    run(q4k, 70, true, false);  // experts 0-2: runs of 2-3 tiles
    run(q4k, 150, true, false);  // 37.5 pairs an expert: tiles of 64 by default
  }
}

TEST_F(CudaMoeGroupedTest, EveryTypeAndTails) {
  // n_ff 96: the down product's k ends inside a 64-element step and the gate/up rows inside a CTA's 128.
  run({DType::Q8_0, DType::Q4_0, DType::Q5_0, false, 256, 96, 8, 2}, 45, true, false);
  run({DType::Q5_K, DType::Q5_K, DType::Q4_K, true, 256, 256, 8, 3}, 40, false, false);
  run({DType::F16, DType::BF16, DType::F16, false, 40, 24, 4, 2}, 50, true, false);
  run({DType::BF16, DType::BF16, DType::Q8_0, true, 64, 160, 4, 2}, 33, false, false);
}

TEST_F(CudaMoeGroupedTest, UnusedAndOutOfRangeSlots) {
  run({DType::Q4_K, DType::Q4_K, DType::Q4_K, true, 256, 256, 8, 4}, 20, true, true);
}

// The 35B-A3B's expert shapes (n_embd 2048, n_ff 512, fused gate/up Q4_K, down Q6_K), 16 of its 256
// experts so the float64 reference stays small.
TEST_F(CudaMoeGroupedTest, RealExpertShape) {
  run({DType::Q4_K, DType::Q4_K, DType::Q6_K, true, 2048, 512, 16, 8}, 33, true, false);
}

// moe_swiglu_bf16 (between the grouped gate/up and down products) writes h = silu(g) * u in BF16 for
// exactly the places of the plan's runs (slots with ids outside [0, n_expert) have none), within the
// BF16 rounding of the float result, and nothing past them.
TEST_F(CudaMoeGroupedTest, SwigluBf16ForThePlansPlaces) {
  const int n_slots = 40, n_expert = 6;
  const int64_t F = 96;
  std::vector<int32_t> ids(n_slots);
  int valid = 0;
  for (int i = 0; i < n_slots; ++i) {
    ids[static_cast<size_t>(i)] = i % 7 == 3 ? -1 : i % 11 == 5 ? n_expert : static_cast<int32_t>(rng_() % n_expert);
    valid += ids[static_cast<size_t>(i)] >= 0 && ids[static_cast<size_t>(i)] < n_expert;
  }
  const TensorView dids = up(TensorView::contiguous(nullptr, DType::I32, {n_slots}), ids.data(), 4 * n_slots);
  const int64_t max_tiles = cuda::moe_group_max_tiles(n_slots, n_expert, cuda::kMoeGroupM);
  auto* order = static_cast<int32_t*>(dev(4 * n_slots));
  auto* tiles = static_cast<int4*>(dev(16 * max_tiles));
  auto* n_tiles = static_cast<int*>(dev(16));
  test::Host gu({2 * F, n_slots});
  gu.random(rng_, -4.0f, 4.0f);
  const TensorView dgu = up(gu);
  const std::vector<uint16_t> poison(static_cast<size_t>(n_slots * F), 0xFFFF);
  auto* h = static_cast<uint16_t*>(dev(2 * n_slots * F));
  const auto s = static_cast<cudaStream_t>(stream_.handle());
  ASSERT_TRUE(cuda::copy_to_device(h, poison.data(), 2 * n_slots * F, stream_).is_ok());
  ASSERT_EQ(cuda::moe_group_plan_launch(dids.as<int32_t>(), n_slots, n_expert, cuda::kMoeGroupM, order, tiles, n_tiles, s),
            cudaSuccess);
  ASSERT_EQ(cuda::moe_swiglu_bf16_launch(dgu.as<float>(), F, n_slots, tiles, n_tiles, h, s), cudaSuccess);
  std::vector<uint16_t> got(poison.size());
  ASSERT_TRUE(cuda::copy_to_host(got.data(), h, 2 * n_slots * F, stream_).is_ok());
  ASSERT_TRUE(stream_.synchronize().is_ok());
  for (int r = 0; r < n_slots; ++r) {
    for (int64_t j = 0; j < F; ++j) {
      const uint16_t v = got[static_cast<size_t>(r * F + j)];
      if (r >= valid) {
        ASSERT_EQ(v, 0xFFFF) << "place " << r << " of " << valid << " written";
        continue;
      }
      const float g = gu.v[static_cast<size_t>(r * 2 * F + j)], u = gu.v[static_cast<size_t>(r * 2 * F + F + j)];
      const float want = g / (1.0f + std::exp(-g)) * u;
      ASSERT_NEAR(bf16_to_f32(v), want, 1e-6f + std::fabs(want) / 128) << "place " << r << " element " << j;
    }
  }
}

// Host arithmetic only (runs without a device): the tile size follows the pairs an expert averages, and
// the grid bound covers the tiles of any routing (each expert's run cut into tiles of tile_m).
TEST(CudaMoeGrouped, TileSizeAndTileBound) {
  EXPECT_EQ(cuda::moe_group_tile_m(512 * 8, 256), cuda::kMoeGroupM);        // 16 pairs an expert
  EXPECT_EQ(cuda::moe_group_tile_m(1024 * 8, 256), cuda::kMoeGroupMLarge);  // 32
  EXPECT_EQ(cuda::moe_group_tile_m(4096 * 8, 256), cuda::kMoeGroupMMax);    // 128
  EXPECT_EQ(cuda::moe_group_tile_m(27 * 16, 16), cuda::kMoeGroupM);
  EXPECT_EQ(cuda::moe_group_tile_m(28 * 16, 16), cuda::kMoeGroupMLarge);
  EXPECT_EQ(cuda::moe_group_tile_m(112 * 16, 16), cuda::kMoeGroupMMax);
  for (int m : {cuda::kMoeGroupM, cuda::kMoeGroupMLarge, cuda::kMoeGroupMMax}) {
    EXPECT_TRUE(cuda::moe_group_tile_m_valid(m));
    EXPECT_FALSE(cuda::moe_group_tile_m_valid(m + 1));
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n_expert = 1 + static_cast<int>(rng() % 300), n_slots = static_cast<int>(rng() % 5000);
    const int hot = 1 + static_cast<int>(rng() % n_expert);  // routings from spread to all on a few experts
    std::vector<int64_t> count(static_cast<size_t>(n_expert), 0);
    for (int s = 0; s < n_slots; ++s) ++count[rng() % hot];
    for (int m : {cuda::kMoeGroupM, cuda::kMoeGroupMLarge, cuda::kMoeGroupMMax}) {
      int64_t tiles = 0;
      for (const int64_t c : count) tiles += (c + m - 1) / m;
      EXPECT_LE(tiles, cuda::moe_group_max_tiles(n_slots, n_expert, m))
          << n_slots << " slots over " << hot << " of " << n_expert << " experts, tiles of " << m;
    }
  }
}

TEST(CudaMoeGrouped, FloatExpertsAndBadArgumentsAreRefused) {
  const int64_t E = 64, F = 32, X = 16, k = 2, n_tokens = 4;
  OpContext ctx;
  ctx.device = Device{DeviceKind::kCuda, 0};
  alignas(16) static uint8_t fake[16], fake_y[16];
  const Device d = ctx.device;
  MoeExperts e;
  e.gate_up = TensorView::contiguous(fake, DType::Q8_0, {E, 2 * F, X}, d);
  e.down = TensorView::contiguous(fake, DType::Q8_0, {F, E, X}, d);
  const TensorView x = TensorView::contiguous(fake, DType::F32, {E, n_tokens}, d);
  const TensorView y = TensorView::contiguous(fake_y, DType::F32, {E, n_tokens}, d);
  const TensorView ids = TensorView::contiguous(fake, DType::I32, {k, n_tokens}, d);
  const TensorView w = TensorView::contiguous(fake, DType::F32, {k, n_tokens}, d);
  EXPECT_TRUE(cuda::moe_ffn_grouped_takes(x, e));
  MoeExperts e_f32 = e;
  e_f32.down = TensorView::contiguous(fake, DType::F32, {F, E, X}, d);
  EXPECT_FALSE(cuda::moe_ffn_grouped_takes(x, e_f32));
  const TensorView x_odd = TensorView::contiguous(fake + 4, DType::F32, {E, n_tokens}, d);
  EXPECT_FALSE(cuda::moe_ffn_grouped_takes(x_odd, e));  // not 16-byte aligned
  Status s = cuda::moe_ffn_grouped(ctx, x, e_f32, ids, w, y);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  s = cuda::moe_ffn_grouped(ctx, x, e, ids, w, y, 48);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("tiles of 48"), std::string::npos) << s.message();
  const TensorView ids_bad = TensorView::contiguous(fake, DType::I32, {k + 1, n_tokens}, d);
  s = cuda::moe_ffn_grouped(ctx, x, e, ids_bad, w, y);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  OpContext cpu;
  s = cuda::moe_ffn_grouped(cpu, x, e, ids, w, y);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
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

  s = cuda::moe_ffn_grouped(ctx, x, e, ids, w, y, 48);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("tiles of 48"), std::string::npos) << s.message();
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

// ---- moe_block_decode ----

// A block: routed gate and up share a type (fused: one gate_up stack), the shared expert's gate and up
// share sh_gate_up; n_ff is the routed and shared width.
struct BlockCase {
  DType gate_up, down;
  bool fused;
  DType sh_gate_up, sh_down;
  int64_t n_embd, n_ff, n_expert, k;
};

std::string describe(const BlockCase& c, int64_t n_tokens, bool ties) {
  return fmt::format(
      "gate/up {} down {} fused {} shared gate/up {} down {} n_embd {} n_ff {} experts {} k {} "
      "tokens {} ties {}",
      dtype_name(c.gate_up), dtype_name(c.down), c.fused, dtype_name(c.sh_gate_up), dtype_name(c.sh_down), c.n_embd,
      c.n_ff, c.n_expert, c.k, n_tokens, ties);
}

// Rows [r0, r0 + n) of a row-major stack of rows of `cols` elements, dequantized.
std::vector<float> rows_of(DType t, const std::vector<uint8_t>& b, int64_t r0, int64_t n, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(n * cols));
  quant::dequantize_rows(t, b.data() + r0 * dtype_row_bytes(t, cols), out.data(), n, cols, 1);
  return out;
}

// down(silu(gate x) * up x) in float64 on int8-rounded x (xq) and h; gate / up [F][E], down [E][F].
std::vector<double> ffn_q8(const std::vector<float>& gate, const std::vector<float>& up, const std::vector<float>& down,
                           const std::vector<double>& xq, int64_t E, int64_t F) {
  std::vector<double> h(static_cast<size_t>(F)), o(static_cast<size_t>(E));
  for (int64_t r = 0; r < F; ++r) {
    double g = 0.0, u = 0.0;
    for (int64_t c = 0; c < E; ++c) {
      g += static_cast<double>(gate[static_cast<size_t>(r * E + c)]) * xq[static_cast<size_t>(c)];
      u += static_cast<double>(up[static_cast<size_t>(r * E + c)]) * xq[static_cast<size_t>(c)];
    }
    h[static_cast<size_t>(r)] = g / (1.0 + std::exp(-g)) * u;
  }
  q8_round_trip(h);
  for (int64_t c = 0; c < E; ++c) {
    double acc = 0.0;
    for (int64_t r = 0; r < F; ++r)
      acc += static_cast<double>(down[static_cast<size_t>(c * F + r)]) * h[static_cast<size_t>(r)];
    o[static_cast<size_t>(c)] = acc;
  }
  return o;
}

class CudaMoeBlockTest : public CudaMoeTest {
 protected:
  template <typename T>
  std::vector<T> fetch(const void* d, int64_t n) {
    std::vector<T> out(static_cast<size_t>(n));
    EXPECT_TRUE(cuda::copy_to_host(out.data(), d, static_cast<int64_t>(sizeof(T)) * n, stream_).is_ok());
    const Status s = stream_.synchronize();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
  }

  // A block's random weights on the host (hw: views of the vectors) and on the device (dw).
  struct Block {
    std::vector<float> router, sgate;
    std::vector<uint8_t> gu_b, gate_b, up_b, down_b, sg_b, su_b, sd_b;
    cuda::MoeBlockWeights hw, dw;
  };
  void make_block(const BlockCase& c, Block& b) {
    const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert;
    std::uniform_real_distribution<float> uni(-0.1f, 0.1f);
    b.router.resize(static_cast<size_t>(X * E));
    b.sgate.resize(static_cast<size_t>(E));
    for (float& v : b.router) v = uni(rng_);
    for (float& v : b.sgate) v = uni(rng_);
    if (c.fused) {
      b.gu_b = random_rows(c.gate_up, 2 * F * X, E, rng_);
    } else {
      b.gate_b = random_rows(c.gate_up, F * X, E, rng_);
      b.up_b = random_rows(c.gate_up, F * X, E, rng_);
    }
    b.down_b = random_rows(c.down, E * X, F, rng_);
    b.sg_b = random_rows(c.sh_gate_up, F, E, rng_);
    b.su_b = random_rows(c.sh_gate_up, F, E, rng_);
    b.sd_b = random_rows(c.sh_down, E, F, rng_);
    cuda::MoeBlockWeights& hw = b.hw;
    hw.router = TensorView::contiguous(b.router.data(), DType::F32, {E, X});
    hw.shexp_gate = TensorView::contiguous(b.sgate.data(), DType::F32, {E});
    if (c.fused) {
      hw.experts.gate_up = TensorView::contiguous(b.gu_b.data(), c.gate_up, {E, 2 * F, X});
    } else {
      hw.experts.gate = TensorView::contiguous(b.gate_b.data(), c.gate_up, {E, F, X});
      hw.experts.up = TensorView::contiguous(b.up_b.data(), c.gate_up, {E, F, X});
    }
    hw.experts.down = TensorView::contiguous(b.down_b.data(), c.down, {F, E, X});
    hw.gate_shexp = TensorView::contiguous(b.sg_b.data(), c.sh_gate_up, {E, F});
    hw.up_shexp = TensorView::contiguous(b.su_b.data(), c.sh_gate_up, {E, F});
    hw.down_shexp = TensorView::contiguous(b.sd_b.data(), c.sh_down, {F, E});
    const auto upv = [&](const TensorView& h) { return h.data == nullptr ? TensorView{} : up(h, h.data, h.n_bytes()); };
    b.dw = cuda::MoeBlockWeights{
        upv(hw.router),     {upv(hw.experts.gate), upv(hw.experts.up), upv(hw.experts.gate_up), upv(hw.experts.down)},
        upv(hw.shexp_gate), upv(hw.gate_shexp),
        upv(hw.up_shexp),   upv(hw.down_shexp)};
  }

  // With ties, the router rows of k + 1 experts spread over the ids are one row along a direction v that
  // every token's x leans on, so they win every token and the highest id among them is left out.
  void run_block(const BlockCase& c, int64_t n_tokens, bool ties, bool graph = false) {
    const std::string where = describe(c, n_tokens, ties);
    const int64_t E = c.n_embd, F = c.n_ff, X = c.n_expert, k = c.k, T = n_tokens;
    Block b;
    make_block(c, b);
    std::vector<float>& router = b.router;
    std::vector<float>& sgate = b.sgate;
    test::Host x({E, T});
    x.random(rng_, -1.0f, 1.0f);
    std::vector<int32_t> tied;
    if (ties) {
      std::vector<float> dir(static_cast<size_t>(E));
      for (float& v : dir) v = (rng_() & 1) ? 1.0f : -1.0f;
      for (int64_t i = 0; i <= k; ++i) tied.push_back(static_cast<int32_t>(i * X / (k + 1)));
      for (int32_t e : tied) {
        for (int64_t col = 0; col < E; ++col)
          router[static_cast<size_t>(e * E + col)] = 0.05f * dir[static_cast<size_t>(col)];
      }
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t col = 0; col < E; ++col)
          x.v[static_cast<size_t>(t * E + col)] += 0.5f * dir[static_cast<size_t>(col)];
      }
      ASSERT_TRUE(cuda::copy_to_device(b.dw.router.data, router.data(), 4 * X * E, stream_).is_ok());
    }
    const cuda::MoeBlockWeights& hw = b.hw;
    const cuda::MoeBlockWeights& dw = b.dw;
    const std::vector<uint8_t>&gu_b = b.gu_b, &gate_b = b.gate_b, &up_b = b.up_b, &down_b = b.down_b;
    const std::vector<uint8_t>&sg_b = b.sg_b, &su_b = b.su_b, &sd_b = b.sd_b;
    const Status ok = cuda::moe_block_decode_check(dw, T, k);
    ASSERT_TRUE(ok.is_ok()) << where << ": " << ok.to_string();
    const TensorView dx = up(x.t, x.v.data(), 4 * E * T);
    test::Host y({E, T});
    y.v.assign(y.v.size(), std::numeric_limits<float>::quiet_NaN());
    const TensorView dy = up(y.t, y.v.data(), 4 * E * T);
    std::vector<int32_t> poison_ids(static_cast<size_t>(k * T), -7);
    std::vector<float> poison_w(static_cast<size_t>(k * T), std::numeric_limits<float>::quiet_NaN());
    const TensorView dids = up(TensorView::contiguous(nullptr, DType::I32, {k, T}), poison_ids.data(), 4 * k * T);
    const TensorView dwts = up(TensorView::contiguous(nullptr, DType::F32, {k, T}), poison_w.data(), 4 * k * T);
    const Status s = cuda::moe_block_decode(ctx_, dx, dw, k, dids, dwts, dy);
    ASSERT_TRUE(s.is_ok()) << where << ": " << s.to_string();
    const std::vector<float> got = fetch<float>(dy.data, E * T);
    const std::vector<int32_t> ids = fetch<int32_t>(dids.data, k * T);
    const std::vector<float> wts = fetch<float>(dwts.data, k * T);

    // Routing against moe_route on float64 logits: equal ids, except where two logits differ by less
    // than the F32 rounding of the device's dot products (a near tie, which either side may win);
    // exactly equal logits (the tied rows) must go to the lower id.
    std::vector<double> ld(static_cast<size_t>(T * X)), sg_logit(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < X; ++e) {
        double a = 0.0;
        for (int64_t col = 0; col < E; ++col) {
          a += static_cast<double>(router[static_cast<size_t>(e * E + col)]) * x.v[static_cast<size_t>(t * E + col)];
        }
        ld[static_cast<size_t>(t * X + e)] = a;
      }
      double a = 0.0;
      for (int64_t col = 0; col < E; ++col)
        a += static_cast<double>(sgate[static_cast<size_t>(col)]) * x.v[static_cast<size_t>(t * E + col)];
      sg_logit[static_cast<size_t>(t)] = a;
    }
    std::vector<float> lf(ld.begin(), ld.end());
    std::vector<int32_t> ids_ref(static_cast<size_t>(k * T));
    std::vector<float> w_ref(ids_ref.size());
    ASSERT_TRUE(moe_route(test::ref_ctx(), TensorView::contiguous(lf.data(), DType::F32, {X, T}), k,
                          TensorView::contiguous(ids_ref.data(), DType::I32, {k, T}),
                          TensorView::contiguous(w_ref.data(), DType::F32, {k, T}))
                    .is_ok());
    int near_ties = 0;
    for (int64_t t = 0; t < T; ++t) {
      bool token_near = false;
      for (int64_t j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t * k + j);
        ASSERT_TRUE(ids[i] >= 0 && ids[i] < X) << where << ": token " << t << " slot " << j << " id " << ids[i];
        for (int64_t j2 = 0; j2 < j; ++j2) {
          ASSERT_NE(ids[i], ids[static_cast<size_t>(t * k + j2)]) << where << ": token " << t << " picks twice";
        }
        if (ids[i] == ids_ref[i]) continue;
        const double lg = ld[static_cast<size_t>(t * X + ids[i])], lr = ld[static_cast<size_t>(t * X + ids_ref[i])];
        ASSERT_NE(lg, lr) << where << ": token " << t << " slot " << j << ": tie between experts " << ids[i] << " and "
                          << ids_ref[i] << " went to the higher id";
        ASSERT_LE(std::fabs(lg - lr), 1e-4 * std::max(1.0, std::fabs(lr)))
            << where << ": token " << t << " slot " << j << ": expert " << ids[i] << " (logit " << lg << ") instead of "
            << ids_ref[i] << " (logit " << lr << ")";
        token_near = true;
      }
      near_ties += token_near;
      for (int64_t j = 0; j < k && !token_near; ++j) {
        const size_t i = static_cast<size_t>(t * k + j);
        EXPECT_NEAR(wts[i], w_ref[i], 1e-6 + 1e-4 * std::fabs(w_ref[i]))
            << where << ": weight of token " << t << " slot " << j << " (expert " << ids[i] << ")";
      }
    }
    if (near_ties > 0) std::printf("[moe-block] %s: %d tokens with a near tie\n", where.c_str(), near_ties);
    if (ties) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(ids[static_cast<size_t>(t * k + j)], tied[static_cast<size_t>(j)]) << where << ": token " << t;
        }
      }
    }

    // y against float64 on the device's routing and int8 activations.
    std::vector<float> ref(static_cast<size_t>(E * T));
    const std::vector<float> sgf = rows_of(c.sh_gate_up, sg_b, 0, F, E), suf = rows_of(c.sh_gate_up, su_b, 0, F, E);
    const std::vector<float> sdf = rows_of(c.sh_down, sd_b, 0, E, F);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> xq(x.v.begin() + t * E, x.v.begin() + (t + 1) * E);
      q8_round_trip(xq);
      std::vector<double> acc(static_cast<size_t>(E), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = ids[static_cast<size_t>(t * k + j)];
        const std::vector<float> g =
            c.fused ? rows_of(c.gate_up, gu_b, 2 * F * e, F, E) : rows_of(c.gate_up, gate_b, F * e, F, E);
        const std::vector<float> u =
            c.fused ? rows_of(c.gate_up, gu_b, 2 * F * e + F, F, E) : rows_of(c.gate_up, up_b, F * e, F, E);
        const std::vector<double> o = ffn_q8(g, u, rows_of(c.down, down_b, E * e, E, F), xq, E, F);
        for (int64_t col = 0; col < E; ++col)
          acc[static_cast<size_t>(col)] += wts[static_cast<size_t>(t * k + j)] * o[static_cast<size_t>(col)];
      }
      const std::vector<double> sh = ffn_q8(sgf, suf, sdf, xq, E, F);
      const double sig = 1.0 / (1.0 + std::exp(-sg_logit[static_cast<size_t>(t)]));
      for (int64_t col = 0; col < E; ++col) {
        ref[static_cast<size_t>(t * E + col)] =
            static_cast<float>(acc[static_cast<size_t>(col)] + sig * sh[static_cast<size_t>(col)]);
      }
    }
    EXPECT_LE(test::rel_err(got, ref), kTolQ8Reference) << where << " (vs float64 reference on int8 activations)";
    // Element by element (y starts as NaN, so an unwritten element shows), against the token's largest
    // output: one h code on the other side of a rounding boundary moves an element by up to ~2.5e-3 of it.
    std::vector<float> token_max(static_cast<size_t>(T), 1.0f);
    for (size_t i = 0; i < ref.size(); ++i) token_max[i / E] = std::max(token_max[i / E], std::fabs(ref[i]));
    for (size_t i = 0; i < got.size(); ++i) {
      if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > 0.05 * token_max[i / E]) {
        ADD_FAILURE() << where << ": first bad y[token " << i / E << ", " << i % E << "] = " << got[i] << ", ref "
                      << ref[i];
        break;
      }
    }

    // The CPU op chain, where its routing equals the device's.
    const OpContext cpu;
    test::Host logits({X, T}), routed({E, T}), g({F, T}), u({F, T}), sh({E, T}), sg({1, T}), y_cpu({E, T});
    std::vector<int32_t> cids(static_cast<size_t>(k * T));
    std::vector<float> cw(cids.size());
    const TensorView cids_t = TensorView::contiguous(cids.data(), DType::I32, {k, T});
    const TensorView cw_t = TensorView::contiguous(cw.data(), DType::F32, {k, T});
    ASSERT_TRUE(matmul(cpu, hw.router, x.t, logits.t).is_ok());
    ASSERT_TRUE(moe_route(cpu, logits.t, k, cids_t, cw_t).is_ok());
    ASSERT_TRUE(moe_ffn(cpu, x.t, hw.experts, cids_t, cw_t, routed.t).is_ok());
    ASSERT_TRUE(matmul(cpu, hw.gate_shexp, x.t, g.t).is_ok());
    ASSERT_TRUE(matmul(cpu, hw.up_shexp, x.t, u.t).is_ok());
    ASSERT_TRUE(swiglu(cpu, g.t, u.t, g.t).is_ok());
    ASSERT_TRUE(matmul(cpu, hw.down_shexp, g.t, sh.t).is_ok());
    ASSERT_TRUE(matmul(cpu, TensorView::contiguous(sgate.data(), DType::F32, {E, 1}), x.t, sg.t).is_ok());
    ASSERT_TRUE(mul_sigmoid(cpu, sh.t, sg.t, sh.t).is_ok());
    ASSERT_TRUE(add(cpu, routed.t, sh.t, y_cpu.t).is_ok());
    if (cids == ids) {
      EXPECT_LE(test::rel_err(got, y_cpu.v), kTolExact) << where << " (vs the CPU op chain)";
    } else {
      std::printf("[moe-block] %s: CPU chain routed differently (near tie), not compared\n", where.c_str());
    }

    if (graph) {  // capture, then replay twice on new x: each replay equals an ordinary call on that x
      const auto stream = static_cast<cudaStream_t>(stream_.handle());
      cudaGraphExec_t ge = nullptr;
      ASSERT_NO_FATAL_FAILURE(
          capture([&] { return cuda::moe_block_decode(ctx_, dx, dw, k, dids, dwts, dy); }, &ge,
                  cudaStreamCaptureModeRelaxed));
      test::Host y2({E, T});
      const TensorView dy2 = up(y2.t, y2.v.data(), 4 * E * T);
      for (int rep = 0; rep < 2; ++rep) {
        x.random(rng_, -1.0f, 1.0f);
        ASSERT_TRUE(cuda::copy_to_device(dx.data, x.v.data(), 4 * E * T, stream_).is_ok());
        ASSERT_EQ(cudaGraphLaunch(ge, stream), cudaSuccess);
        const std::vector<float> replayed = fetch<float>(dy.data, E * T);
        const std::vector<int32_t> replay_ids = fetch<int32_t>(dids.data, k * T);
        ASSERT_TRUE(cuda::moe_block_decode(ctx_, dx, dw, k, dids, dwts, dy2).is_ok());
        EXPECT_EQ(replayed, fetch<float>(dy2.data, E * T)) << where << ": graph replay " << rep;
        EXPECT_EQ(replay_ids, fetch<int32_t>(dids.data, k * T)) << where << ": graph replay " << rep;
      }
    }
    bufs_.clear();
  }
};

TEST_F(CudaMoeBlockTest, RealShapeEightOfTwoFiftySix) {
  // qwen3.6-35b-a3b: n_embd 2048, 256 experts, 8 used, n_ff 512; q4_K gate/up, q6_K down.
  const BlockCase real{DType::Q4_K, DType::Q6_K, false, DType::Q4_K, DType::Q6_K, 2048, 512, 256, 8};
  run_block(real, 1, false, true);
  run_block(real, 3, false);
  run_block(real, 8, true);
  const BlockCase real_fused{DType::Q4_K, DType::Q4_K, true, DType::Q4_K, DType::Q6_K, 2048, 512, 256, 8};
  run_block(real_fused, 1, true);
  run_block(real_fused, 2, false);
}

TEST_F(CudaMoeBlockTest, TwoOfFourUpToSixtyFourSlots) {
  const BlockCase q8{DType::Q8_0, DType::Q8_0, false, DType::Q8_0, DType::Q8_0, 256, 96, 4, 2};
  const BlockCase mixed{DType::Q4_K, DType::Q8_0, true, DType::Q8_0, DType::Q6_K, 512, 256, 4, 2};
  for (int64_t n_tokens : {1, 2, 5, 32}) {
    run_block(q8, n_tokens, false);
    run_block(q8, n_tokens, true);
    run_block(mixed, n_tokens, n_tokens % 2 == 1);
  }
  run_block(mixed, 4, false, true);
}

TEST_F(CudaMoeBlockTest, EightOfSixtyFourOtherTypes) {
  const BlockCase q5{DType::Q5_K, DType::Q4_0, false, DType::Q5_0, DType::Q8_0, 256, 256, 64, 8};
  const BlockCase q6{DType::Q6_K, DType::Q6_K, true, DType::Q6_K, DType::Q4_K, 512, 256, 64, 8};
  for (int64_t n_tokens : {1, 4, 8}) {
    run_block(q5, n_tokens, n_tokens == 4);
    run_block(q6, n_tokens, n_tokens == 1);
  }
}

// moe_block_decode_add_norm against add_rms_norm followed by moe_block_decode on the same inputs: res, ids,
// weights and y bit for bit, where the router kernel computes the norm (1 and 3 tokens of the real shape,
// 1 to 32 tokens of a small one, y over delta) and where it does not take the shape (6 tokens of 2048:
// the norm launch first).
TEST_F(CudaMoeBlockTest, AddNormMatchesTheChain) {
  struct Case {
    BlockCase c;
    int64_t T;
    bool fused_norm;  // expected moe_route_norm_fits
    bool y_over_delta;
  };
  const BlockCase real{DType::Q4_K, DType::Q6_K, false, DType::Q4_K, DType::Q6_K, 2048, 512, 256, 8};
  const BlockCase small{DType::Q8_0, DType::Q8_0, false, DType::Q8_0, DType::Q4_K, 256, 256, 4, 2};
  const BlockCase odd{DType::Q4_K, DType::Q6_K, true, DType::Q4_K, DType::Q6_K, 1280, 256, 64, 8};  // 160 norm threads
  for (const Case& cs : {Case{real, 1, true, true}, Case{real, 3, true, false}, Case{real, 6, false, true},
                         Case{small, 1, true, false}, Case{small, 5, true, true}, Case{small, 32, true, false},
                         Case{odd, 2, true, true}}) {
    const BlockCase& c = cs.c;
    const int64_t E = c.n_embd, X = c.n_expert, k = c.k, T = cs.T;
    const std::string where = describe(c, T, false) + (cs.y_over_delta ? " y over delta" : "");
    EXPECT_EQ(cuda::moe_route_norm_fits(E, static_cast<int>(T), static_cast<int>(X)), cs.fused_norm) << where;
    Block b;
    make_block(c, b);
    test::Host res({E, T}), delta({E, T}), norm_w({E}), poison({E, T});
    res.random(rng_, -2.0f, 2.0f);
    delta.random(rng_, -1.0f, 1.0f);
    norm_w.random(rng_, 0.5f, 1.5f);
    poison.v.assign(poison.v.size(), std::numeric_limits<float>::quiet_NaN());
    const TensorView dw_norm = up(norm_w);
    std::vector<int32_t> poison_ids(static_cast<size_t>(k * T), -7);
    const auto ids_t = TensorView::contiguous(nullptr, DType::I32, {k, T});
    const auto wts_t = TensorView::contiguous(nullptr, DType::F32, {k, T});
    constexpr float kEps = 1e-6f;

    // The chain.
    const TensorView res1 = up(res), delta1 = up(delta), xn = up(poison), y1 = up(poison);
    const TensorView ids1 = up(ids_t, poison_ids.data(), 4 * k * T), wts1 = up(wts_t, poison.v.data(), 4 * k * T);
    ASSERT_TRUE(add_rms_norm(ctx_, res1, delta1, dw_norm, kEps, xn).is_ok()) << where;
    Status st = cuda::moe_block_decode(ctx_, xn, b.dw, k, ids1, wts1, y1);
    ASSERT_TRUE(st.is_ok()) << where << ": " << st.to_string();

    // The block with its input norm.
    const TensorView res2 = up(res), delta2 = up(delta);
    const TensorView y2 = cs.y_over_delta ? delta2 : up(poison);
    const TensorView ids2 = up(ids_t, poison_ids.data(), 4 * k * T), wts2 = up(wts_t, poison.v.data(), 4 * k * T);
    st = cuda::moe_block_decode_add_norm(ctx_, cuda::MoeBlockAddNorm{res2, delta2, dw_norm, kEps}, b.dw, k, ids2, wts2,
                                         y2);
    ASSERT_TRUE(st.is_ok()) << where << ": " << st.to_string();

    const std::vector<float> r1 = down(res1), r2 = down(res2), o1 = down(y1), o2 = down(y2);
    EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), 4 * r1.size())) << where << ": res";
    EXPECT_NE(r1, res.v) << where << ": res not updated";
    EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), 4 * o1.size())) << where << ": y";
    EXPECT_TRUE(std::all_of(o1.begin(), o1.end(), [](float v) { return std::isfinite(v); })) << where;
    EXPECT_EQ(fetch<int32_t>(ids1.data, k * T), fetch<int32_t>(ids2.data, k * T)) << where << ": ids";
    const std::vector<float> w1 = fetch<float>(wts1.data, k * T), w2 = fetch<float>(wts2.data, k * T);
    EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), 4 * w1.size())) << where << ": weights";

    // The routing in the router kernel's last CTA instead of the gate/up products (where those took it):
    // the same bits of res, y, ids and weights.
    const TensorView res3 = up(res), delta3 = up(delta);
    const TensorView y3 = cs.y_over_delta ? delta3 : up(poison);
    const TensorView ids3 = up(ids_t, poison_ids.data(), 4 * k * T), wts3 = up(wts_t, poison.v.data(), 4 * k * T);
    cuda::set_moe_block_route_in_products(false);
    st = cuda::moe_block_decode_add_norm(ctx_, cuda::MoeBlockAddNorm{res3, delta3, dw_norm, kEps}, b.dw, k, ids3, wts3,
                                         y3);
    cuda::set_moe_block_route_in_products(true);
    ASSERT_TRUE(st.is_ok()) << where << " (routing in the router): " << st.to_string();
    const std::vector<float> r3 = down(res3), o3 = down(y3);
    EXPECT_EQ(0, std::memcmp(r2.data(), r3.data(), 4 * r2.size())) << where << ": res, routing in the router";
    EXPECT_EQ(0, std::memcmp(o2.data(), o3.data(), 4 * o2.size())) << where << ": y, routing in the router";
    EXPECT_EQ(fetch<int32_t>(ids2.data, k * T), fetch<int32_t>(ids3.data, k * T)) << where << ": ids, routing in the router";
    const std::vector<float> w3 = fetch<float>(wts3.data, k * T);
    EXPECT_EQ(0, std::memcmp(w2.data(), w3.data(), 4 * w2.size())) << where << ": weights, routing in the router";
    bufs_.clear();
  }
  // The 35B-A3B's block ("real": one gate/up group, down with its sum in one launch) routes in the products.
  EXPECT_TRUE(cuda::moe_gate_up_routed_fits(DType::Q4_K, 256, 8));
}

// The fused down + combine launch against the gathered down launch followed by moe_block_combine on the
// same selectors, h codes and coefficients: y bit for bit (types of the int8 kernel, rows of 512 and
// 1024, k of 8, 2 and 12, 1 and 3 tokens, selectors that repeat an expert).
TEST_F(CudaMoeBlockTest, DownCombineMatchesTheChain) {
  struct Case {
    DType t;
    int64_t E, F, X;
    int k, T;
  };
  for (const Case& c : {Case{DType::Q6_K, 2048, 512, 16, 8, 1}, Case{DType::Q4_K, 2048, 512, 16, 8, 3},
                        Case{DType::Q8_0, 96, 1024, 5, 2, 2}, Case{DType::Q4_0, 64, 256, 6, 12, 1},
                        Case{DType::Q5_K, 130, 768, 4, 3, 2}}) {
    const int64_t E = c.E, F = c.F, X = c.X, P = c.k + 1, T = c.T;
    const std::string where = fmt::format("{} n_embd {} n_ff {} experts {} k {} tokens {}", dtype_name(c.t), E, F, X,
                                          c.k, T);
    ASSERT_TRUE(cuda::moe_down_combine_fits(c.t, F, c.k)) << where;
    const std::vector<uint8_t> wb = random_rows(c.t, E * X, F, rng_);
    const int64_t row_bytes = dtype_row_bytes(c.t, F), expert_units = E * row_bytes / cuda::kMoeSelUnit;
    ASSERT_EQ(E * row_bytes % cuda::kMoeSelUnit, 0) << where;
    std::vector<int32_t> sel(static_cast<size_t>(T * P));
    for (size_t i = 0; i < sel.size(); ++i) sel[i] = static_cast<int32_t>((rng_() % X) * expert_units);
    sel[0] = sel[sel.size() - 1];  // one expert twice
    test::Host h({F, T * P}), coef({P, T});
    h.random(rng_, -2.0f, 2.0f);
    coef.random(rng_, 0.0f, 1.0f);
    const TensorView dw = up(TensorView::contiguous(nullptr, c.t, {F, E * X}), wb.data(), static_cast<int64_t>(wb.size()));
    const TensorView dsel = up(TensorView::contiguous(nullptr, DType::I32, {P, T}), sel.data(), 4 * T * P);
    const TensorView dh = up(h), dcoef = up(coef);
    const int64_t act_bytes = cuda::matvec_q8_act_bytes(F, T * P);
    void* hq = dev(act_bytes);
    const auto s = static_cast<cudaStream_t>(stream_.handle());
    ASSERT_EQ(cuda::quantize_q8_launch(dh.as<float>(), F, nullptr, T * P, F, hq, nullptr, 0, s), cudaSuccess);

    test::Host y1({E, T}), y2({E, T}), d({E, T * P});
    y1.random(rng_);
    y2.v = y1.v;
    const TensorView dy1 = up(y1), dy2 = up(y2), dd = up(d);
    cuda::MoeMatvecLaunch m{dw.data, row_bytes, cuda::kMoeSelUnit};
    m.n_rows = E;
    m.k = F;
    m.ids = dsel.as<int32_t>();
    m.n_expert = INT32_MAX;
    m.n_slots = static_cast<int>(T * P);
    m.act = hq;
    m.act_rows = T * P;
    m.y = dd.as<float>();
    m.y_stride = E;
    ASSERT_EQ(cuda::moe_matvec_launch(c.t, m, cuda::MatvecKernel::kQ8, s), cudaSuccess) << where;
    ASSERT_EQ(cuda::moe_block_combine_launch(dd.as<float>(), dcoef.as<float>(), T, c.k, E, dy1.as<float>(), s),
              cudaSuccess);

    cuda::MoeDownCombineLaunch dc;
    dc.w = dw.data;
    dc.w_stride = row_bytes;
    dc.sel = dsel.as<int32_t>();
    dc.hq = hq;
    dc.coef = dcoef.as<float>();
    dc.y = dy2.as<float>();
    dc.n_embd = E;
    dc.n_ff = F;
    dc.n_tokens = static_cast<int>(T);
    dc.k = c.k;
    ASSERT_EQ(cuda::moe_down_combine_launch(c.t, dc, s), cudaSuccess) << where;
    const std::vector<float> chain = down(dy1), fused = down(dy2);
    EXPECT_EQ(0, std::memcmp(chain.data(), fused.data(), 4 * chain.size())) << where;
    EXPECT_NE(chain, y1.v) << where << ": nothing written";
    bufs_.clear();
  }
  EXPECT_FALSE(cuda::moe_down_combine_fits(DType::Q4_K, 2048, 8));  // two steps of the row
  EXPECT_FALSE(cuda::moe_down_combine_fits(DType::Q4_K, 512, 16));  // 17 pairs
  EXPECT_FALSE(cuda::moe_down_combine_fits(DType::F32, 512, 8));
}

// The routing kernel alone: x codes equal quantize_q8's byte for byte, ids and weights equal the CUDA
// moe_route's on the kernel's own logits, and selectors follow their MoeWeightSel (two gate/up groups,
// one down group); a second launch (the counter went back to 0) repeats the first.
TEST_F(CudaMoeBlockTest, RouteFusedKernel) {
  struct Shape {
    int64_t E, X, k, T, router_pad;  // router_pad: extra floats per router row (1: no float4 path)
  };
  for (const Shape& sh : {Shape{2048, 256, 8, 1, 0}, Shape{2048, 256, 8, 8, 0}, Shape{160, 4, 2, 32, 1},
                          Shape{64, 2048, 32, 2, 0}, Shape{96, 33, 1, 64, 3}}) {
    const int64_t E = sh.E, X = sh.X, k = sh.k, T = sh.T, P = k + 1, rs = E + sh.router_pad;
    const std::string where = fmt::format("n_embd {} experts {} k {} tokens {} router stride {}", E, X, k, T, rs);
    std::uniform_real_distribution<float> uni(-0.1f, 0.1f);
    std::vector<float> router(static_cast<size_t>(X * rs)), sgate(static_cast<size_t>(E));
    for (float& v : router) v = uni(rng_);
    for (float& v : sgate) v = uni(rng_);
    for (int64_t col = 0; col < rs; ++col)
      router[static_cast<size_t>(3 % X * rs + col)] = router[static_cast<size_t>(col)];
    test::Host x({E, T});
    x.random(rng_, -1.0f, 1.0f);
    x.v[0] = 0.0f;
    const auto put = [&](const void* h, int64_t bytes) {
      void* d = dev(bytes);
      EXPECT_TRUE(cuda::copy_to_device(d, h, bytes, stream_).is_ok());
      return d;
    };
    cuda::MoeRouteFusedLaunch a;
    a.x = static_cast<const float*>(put(x.v.data(), 4 * E * T));
    a.n_embd = E;
    a.n_tokens = static_cast<int>(T);
    a.router = static_cast<const float*>(put(router.data(), 4 * X * rs));
    a.router_stride = rs;
    a.shexp_gate = static_cast<const float*>(put(sgate.data(), 4 * E));
    a.n_expert = static_cast<int>(X);
    a.k = static_cast<int>(k);
    a.floor = kMoeWeightSumFloor;
    a.logits = static_cast<float*>(dev(4 * T * X));
    a.shexp_logit = static_cast<float*>(dev(4 * T));
    const int64_t act_bytes = cuda::matvec_q8_act_bytes(E, T);
    a.xq = dev(act_bytes);
    a.ids = static_cast<int32_t*>(dev(4 * T * k));
    a.weights = static_cast<float*>(dev(4 * T * k));
    a.coef = static_cast<float*>(dev(4 * T * P));
    a.sel_gu[0] = static_cast<int32_t*>(dev(4 * T * 2 * P));
    a.sel_gu[1] = static_cast<int32_t*>(dev(4 * T * 2 * P));
    a.sel_down[0] = static_cast<int32_t*>(dev(4 * T * P));
    a.gate = {0, 100, 3};
    a.up = {0, 7, 3};
    a.shexp_gate_w = {1, 0, 0};
    a.shexp_up_w = {1, 50, 0};
    a.down = {0, 1, 2};
    a.shexp_down_w = {0, 9999, 0};
    a.counter = static_cast<unsigned int*>(dev(4));
    ASSERT_TRUE(cuda::fill_bytes(a.counter, 0, 4, stream_).is_ok());
    const auto s = static_cast<cudaStream_t>(stream_.handle());
    ASSERT_EQ(cuda::moe_route_fused_launch(a, s), cudaSuccess) << where;
    const std::vector<float> logits = fetch<float>(a.logits, T * X);
    const std::vector<int32_t> ids = fetch<int32_t>(a.ids, T * k);
    const std::vector<float> wts = fetch<float>(a.weights, T * k), coef = fetch<float>(a.coef, T * P);
    const std::vector<float> shl = fetch<float>(a.shexp_logit, T);
    const std::vector<uint8_t> xq = fetch<uint8_t>(a.xq, act_bytes);
    const std::vector<int32_t> sg0 = fetch<int32_t>(a.sel_gu[0], T * 2 * P),
                               sg1 = fetch<int32_t>(a.sel_gu[1], T * 2 * P);
    const std::vector<int32_t> sd0 = fetch<int32_t>(a.sel_down[0], T * P);
    EXPECT_EQ(fetch<uint32_t>(a.counter, 1)[0], 0u) << where << ": counter not reset";

    void* act_ref = dev(act_bytes);
    ASSERT_EQ(cuda::quantize_q8_launch(a.x, E, nullptr, T, E, act_ref, nullptr, 0, s), cudaSuccess);
    const std::vector<uint8_t> xq_ref = fetch<uint8_t>(act_ref, act_bytes);
    for (int64_t i = 0; i < act_bytes; ++i) {
      if (xq[static_cast<size_t>(i)] != xq_ref[static_cast<size_t>(i)]) {
        ADD_FAILURE() << where << ": x codes differ from quantize_q8 at byte " << i << " of " << act_bytes;
        break;
      }
    }
    double worst = 0.0, scale = 1.0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e <= X; ++e) {
        double r = 0.0;
        for (int64_t col = 0; col < E; ++col) {
          const float w = e < X ? router[static_cast<size_t>(e * rs + col)] : sgate[static_cast<size_t>(col)];
          r += static_cast<double>(w) * x.v[static_cast<size_t>(t * E + col)];
        }
        const double got = e < X ? logits[static_cast<size_t>(t * X + e)] : shl[static_cast<size_t>(t)];
        worst = std::max(worst, std::fabs(got - r));
        scale = std::max(scale, std::fabs(r));
      }
    }
    EXPECT_LE(worst / scale, 1e-5) << where << ": logits";
    for (int64_t t = 0; t < T && X > 3; ++t) {
      EXPECT_EQ(logits[static_cast<size_t>(t * X)], logits[static_cast<size_t>(t * X + 3)]) << where << ": tied rows";
    }

    int32_t* ids_ref = static_cast<int32_t*>(dev(4 * T * k));
    float* w_ref = static_cast<float*>(dev(4 * T * k));
    const Status rs2 = cuda::moe_route(ctx_, TensorView::contiguous(a.logits, DType::F32, {X, T}, ctx_.device), k,
                                       TensorView::contiguous(ids_ref, DType::I32, {k, T}, ctx_.device),
                                       TensorView::contiguous(w_ref, DType::F32, {k, T}, ctx_.device));
    ASSERT_TRUE(rs2.is_ok()) << rs2.to_string();
    EXPECT_EQ(ids, fetch<int32_t>(ids_ref, T * k)) << where << ": ids vs moe_route";
    EXPECT_EQ(wts, fetch<float>(w_ref, T * k)) << where << ": weights vs moe_route";
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j <= k; ++j) {
        const size_t pair = static_cast<size_t>(t * P + j);
        if (j < k) {
          const int32_t e = ids[static_cast<size_t>(t * k + j)];
          EXPECT_EQ(coef[pair], wts[static_cast<size_t>(t * k + j)]) << where;
          EXPECT_EQ(sg0[2 * pair], 100 + 3 * e) << where << ": gate selector, token " << t << " slot " << j;
          EXPECT_EQ(sg0[2 * pair + 1], 7 + 3 * e) << where << ": up selector";
          EXPECT_EQ(sg1[2 * pair], -1) << where;
          EXPECT_EQ(sg1[2 * pair + 1], -1) << where;
          EXPECT_EQ(sd0[pair], 1 + 2 * e) << where << ": down selector";
        } else {
          EXPECT_NEAR(coef[pair], 1.0 / (1.0 + std::exp(-static_cast<double>(shl[static_cast<size_t>(t)]))), 1e-6)
              << where << ": shared coefficient, token " << t;
          EXPECT_EQ(sg0[2 * pair], -1) << where;
          EXPECT_EQ(sg0[2 * pair + 1], -1) << where;
          EXPECT_EQ(sg1[2 * pair], 0) << where;
          EXPECT_EQ(sg1[2 * pair + 1], 50) << where;
          EXPECT_EQ(sd0[pair], 9999) << where;
        }
      }
    }
    ASSERT_EQ(cuda::moe_route_fused_launch(a, s), cudaSuccess) << where;
    EXPECT_EQ(ids, fetch<int32_t>(a.ids, T * k)) << where << ": second launch";
    EXPECT_EQ(coef, fetch<float>(a.coef, T * P)) << where << ": second launch";
    bufs_.clear();
  }
}

// Argument checks happen before any device work: runs without a device (the pointers are never used).
TEST(CudaMoeBlock, UnsupportedBlocksAndBadArguments) {
  const int64_t E = 256, F = 64, X = 8, k = 2;
  alignas(16) static uint8_t fake[64];
  const Device d{DeviceKind::kCuda, 0};
  cuda::MoeBlockWeights w;
  w.router = TensorView::contiguous(fake, DType::F32, {E, X}, d);
  w.shexp_gate = TensorView::contiguous(fake, DType::F32, {E}, d);
  w.experts.gate = TensorView::contiguous(fake, DType::Q8_0, {E, F, X}, d);
  w.experts.up = TensorView::contiguous(fake + 16, DType::Q8_0, {E, F, X}, d);
  w.experts.down = TensorView::contiguous(fake + 32, DType::Q8_0, {F, E, X}, d);
  w.gate_shexp = TensorView::contiguous(fake, DType::Q8_0, {E, F}, d);
  w.up_shexp = TensorView::contiguous(fake, DType::Q8_0, {E, F}, d);
  w.down_shexp = TensorView::contiguous(fake, DType::F32, {F, E}, d);
  EXPECT_EQ(cuda::moe_block_decode_check(w, 1, k).code(), StatusCode::kUnsupported);  // no int8 kernel
  w.down_shexp = TensorView::contiguous(fake, DType::Q4_0, {F, E}, d);
  Status s = cuda::moe_block_decode_check(w, 1, k);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(cuda::moe_block_decode_check(w, cuda::kMoeGatheredMaxSlots / k + 1, k).code(), StatusCode::kUnsupported);
  EXPECT_EQ(cuda::moe_block_decode_check(w, 1, X + 1).code(), StatusCode::kUnsupported);
  const auto unsupported_with = [&](auto edit) {
    cuda::MoeBlockWeights b = w;
    edit(b);
    return cuda::moe_block_decode_check(b, 1, k).code() != StatusCode::kOk;
  };
  EXPECT_TRUE(unsupported_with([&](auto& b) { b.experts.gate.dtype = DType::F32; }));
  EXPECT_TRUE(unsupported_with([&](auto& b) {
    b.experts.up = TensorView::contiguous(fake, DType::Q4_0, {E, F, X}, d);
  }));
  EXPECT_TRUE(unsupported_with([&](auto& b) { b.router = TensorView::contiguous(fake, DType::Q8_0, {E, X}, d); }));
  EXPECT_TRUE(unsupported_with([&](auto& b) { b.shexp_gate = TensorView{}; }));
  EXPECT_TRUE(unsupported_with([&](auto& b) {
    b.up_shexp = TensorView::contiguous(fake, DType::Q8_0, {E, 2 * F}, d);
  }));
  EXPECT_TRUE(unsupported_with([&](auto& b) {
    b.gate_shexp.data = fake + 2;
    b.up_shexp.data = fake + 2;
  }));

  const TensorView x = TensorView::contiguous(fake, DType::F32, {E, 1}, d);
  const TensorView y = TensorView::contiguous(fake + 16, DType::F32, {E, 1}, d);
  const TensorView ids = TensorView::contiguous(fake, DType::I32, {k, 1}, d);
  const TensorView wts = TensorView::contiguous(fake, DType::F32, {k, 1}, d);
  OpContext cpu;
  EXPECT_EQ(cuda::moe_block_decode(cpu, x, w, k, ids, wts, y).code(), StatusCode::kInvalidArgument);
  OpContext ctx;
  ctx.device = d;
  EXPECT_EQ(cuda::moe_block_decode(ctx, x, w, k, ids, wts, x).code(), StatusCode::kInvalidArgument);  // alias
  const TensorView ids_bad = TensorView::contiguous(fake, DType::I32, {k + 1, 1}, d);
  EXPECT_EQ(cuda::moe_block_decode(ctx, x, w, k, ids_bad, wts, y).code(), StatusCode::kInvalidArgument);
  const TensorView x_bad = TensorView::contiguous(fake, DType::F32, {E + 32, 1}, d);
  const TensorView y_bad = TensorView::contiguous(fake + 16, DType::F32, {E + 32, 1}, d);
  EXPECT_EQ(cuda::moe_block_decode(ctx, x_bad, w, k, ids, wts, y_bad).code(), StatusCode::kInvalidArgument);

  // The input norm: y may alias delta, not res; delta as res; the norm weight as a row.
  const TensorView delta = TensorView::contiguous(fake + 32, DType::F32, {E, 1}, d);
  const TensorView nw = TensorView::contiguous(fake + 48, DType::F32, {E}, d);
  const auto add_norm = [&](const TensorView& r, const TensorView& dl, const TensorView& n, const TensorView& out) {
    return cuda::moe_block_decode_add_norm(ctx, cuda::MoeBlockAddNorm{r, dl, n, 1e-6f}, w, k, ids, wts, out).code();
  };
  EXPECT_EQ(cuda::moe_block_decode_add_norm(cpu, cuda::MoeBlockAddNorm{x, delta, nw, 1e-6f}, w, k, ids, wts, y).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(add_norm(x, delta, nw, x), StatusCode::kInvalidArgument);      // y over res
  EXPECT_EQ(add_norm(x, x, nw, y), StatusCode::kInvalidArgument);          // delta over res
  EXPECT_EQ(add_norm(x, x_bad, nw, y), StatusCode::kInvalidArgument);      // delta's shape
  EXPECT_EQ(add_norm(x_bad, TensorView::contiguous(fake + 32, DType::F32, {E + 32, 1}, d), nw, y_bad),
            StatusCode::kInvalidArgument);  // against the experts
  EXPECT_EQ(add_norm(x, delta, TensorView::contiguous(fake + 48, DType::F32, {E + 32}, d), y),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(add_norm(x, delta, TensorView::contiguous(fake + 48, DType::F16, {E}, d), y),
            StatusCode::kInvalidArgument);
}

#else  // !DS_HAVE_CUDA

TEST(CudaMoeTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
