// CUDA matrix product against the CPU reference (quant::dequantize_row + a float64 dot) for every weight
// type, on small, odd and real model shapes, through each path and kernel (q8 matvec, staged matvec,
// generic matvec, GEMM). Outputs are poisoned with NaN first, so an element the kernel never wrote
// fails. Skipped without a CUDA build or device. Weights are random bytes with sane fp16 scales: every
// code pattern occurs. The q8 kernel is checked in three steps (quantization, kernel on the quantized
// activations, end to end), so a failure says which part is wrong and prints the first bad element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/cuda/matvec_q8v5.cuh"
#include "quant/quant.h"

#if DS_HAVE_CUDA
#include "ops/cuda/cuda_matmul.h"
#include "ops/cuda/matvec_launch.h"
#endif

namespace ds {
namespace {

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q5_0,
                        DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q6_K_G4};

// Tolerances, stated once (|y - ref| per output, against a magnitude):
//  - F32-activation matvec kernels compute in F32 on exactly decoded weights; only the summation order
//    differs, and a thread sums at most k/128 + 7 products: (17408/128 + 7) * 2^-24 < 1e-5, so 2e-5 of
//    sum|w x| bounds it. F32 weights through the F32 GEMM: the same.
//  - The BF16 GEMM rounds both operands to BF16 (2^-9 relative each), a product at most 2^-8 off:
//    4e-3 plus F32 accumulation, so 5e-3 of sum|w x|.
//  - The q8 kernel (int8 activations in blocks of 32, d = amax / 127):
//    1. quantization: |x - q d| <= d/2 (+ 1e-4 d for the float rounding of d and 1/d);
//    2. the kernel against the float64 product with the quantized activations x' = q d: kTolKernel of
//       sum (|w| + 2|o|) |x'|, where o is the min / offset term the kernel applies per block from the
//       block sum (Q4_K, Q5_K: dmin * m; Q4_0: 8 d; Q5_0: 16 d), since those two sums may cancel;
//    3. end to end against the exact product: the quantization error, at most sum over blocks of
//       d/2 * sum |w| (times 1.001), plus the kernel bound of 2; and, for k >= 256 where a block's error
//       averages out, at most kTolQ8 of sum|w x| (about 1/256 per block, far less on sums of blocks).
constexpr double kTolF32 = 2e-5;
constexpr double kTolGemmBf16 = 5e-3;
constexpr double kTolKernel = 2e-5;
constexpr double kTolQ8 = 1e-2;
//  - The tensor-core kernel (MatmulKernel::kMatvecMma) takes the same activation codes and the same
//    float arithmetic per 32-element block, with exact integer dots: the q8 kernel's bounds hold.

// Random row bytes for type t: floats for plain types; random bytes with each block's fp16 scale fields
// overwritten by values in [0.002, 0.02) for quantized types; Q6_K_G4: such Q6_K rows regrouped
// (quant::q6_k_to_g4, as the model upload does).
std::vector<uint8_t> random_weights(DType t, int64_t n_rows, int64_t k, uint32_t seed) {
  if (t == DType::Q6_K_G4) {
    const std::vector<uint8_t> q6 = random_weights(DType::Q6_K, n_rows, k, seed);
    const int64_t src = dtype_row_bytes(DType::Q6_K, k), dst = dtype_row_bytes(t, k);
    std::vector<uint8_t> w(static_cast<size_t>(dst * n_rows));
    for (int64_t r = 0; r < n_rows; ++r) quant::q6_k_to_g4(q6.data() + r * src, w.data() + r * dst, k);
    return w;
  }
  const int64_t row_bytes = dtype_row_bytes(t, k);
  std::vector<uint8_t> w(static_cast<size_t>(row_bytes * n_rows));
  ThreadPool::global().parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    std::mt19937 rng(seed + static_cast<uint32_t>(r0) * 7919u);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> scale(0.002f, 0.02f);
    for (int64_t r = r0; r < r1; ++r) {
      uint8_t* row = w.data() + r * row_bytes;
      auto put16 = [&](int64_t off, uint16_t v) { std::memcpy(row + off, &v, 2); };
      if (t == DType::F32) {
        for (int64_t i = 0; i < k; ++i) { const float f = nd(rng); std::memcpy(row + 4 * i, &f, 4); }
        continue;
      }
      if (t == DType::F16 || t == DType::BF16) {
        for (int64_t i = 0; i < k; ++i) put16(2 * i, t == DType::F16 ? f32_to_fp16(nd(rng)) : f32_to_bf16(nd(rng)));
        continue;
      }
      for (int64_t i = 0; i < row_bytes; i += 4) {
        const uint32_t v = rng();
        std::memcpy(row + i, &v, static_cast<size_t>(std::min<int64_t>(4, row_bytes - i)));
      }
      const int64_t bb = dtype_block_bytes(t), nb = k / dtype_block_size(t);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t o = b * bb;
        switch (t) {
          case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: put16(o, f32_to_fp16(scale(rng))); break;
          case DType::Q4_K: case DType::Q5_K:
            put16(o, f32_to_fp16(scale(rng)));
            put16(o + 2, f32_to_fp16(scale(rng)));
            break;
          case DType::Q6_K: put16(o + 208, f32_to_fp16(scale(rng))); break;
          default: break;
        }
      }
    }
  });
  return w;
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

uint16_t get16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// |o| per element: the min / offset term the q8 kernel applies separately (see the tolerances); 0 for
// types without one.
std::vector<float> offset_terms(DType t, const std::vector<uint8_t>& w, int64_t n_rows, int64_t k) {
  std::vector<float> out(static_cast<size_t>(n_rows * k), 0.0f);
  if (t != DType::Q4_K && t != DType::Q5_K && t != DType::Q4_0 && t != DType::Q5_0) return out;
  const int64_t rb = dtype_row_bytes(t, k), bb = dtype_block_bytes(t);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const uint8_t* blk = w.data() + r * rb + (j / dtype_block_size(t)) * bb;
      float o;
      if (t == DType::Q4_0 || t == DType::Q5_0) {
        o = (t == DType::Q4_0 ? 8.0f : 16.0f) * fp16_to_f32(get16(blk));
      } else {
        const int sub = static_cast<int>((j % 256) / 32);
        const uint8_t* q = blk + 4;
        const int m = sub < 4 ? (q[sub + 4] & 63) : ((q[sub + 4] >> 4) | ((q[sub] >> 6) << 4));
        o = fp16_to_f32(get16(blk + 2)) * static_cast<float>(m);
      }
      out[static_cast<size_t>(r * k + j)] = std::fabs(o);
    }
  }
  return out;
}

struct Weights {
  DType type;
  int64_t k, n_rows;
  std::vector<uint8_t> bytes;
  std::vector<float> ref;  // dequantized, [n_rows, k]
  std::vector<float> off;  // |offset term| per element (q8 tolerance)
};

Weights make_weights(DType t, int64_t k, int64_t n_rows) {
  Weights w{t, k, n_rows, random_weights(t, n_rows, k, static_cast<uint32_t>(k * 131 + n_rows)), {}, {}};
  w.ref.resize(static_cast<size_t>(n_rows * k));
  quant::dequantize_rows(t, w.bytes.data(), w.ref.data(), n_rows, k, ThreadPool::global().n_threads());
  w.off = offset_terms(t, w.bytes, n_rows, k);
  return w;
}

// Per output: the value, the bound it must meet, and what it was compared with (for the message).
struct Check {
  const char* what;
  int64_t bad = 0;
  int64_t first_t = -1, first_r = -1;
  double first_got = 0, first_ref = 0, first_bound = 0;
  double worst_ratio = 0;  // max |got - ref| / bound over all outputs (finite ones)
  void add(int64_t t, int64_t r, double got, double ref, double bound) {
    const double ratio = std::fabs(got - ref) / (bound + 1e-30);
    if (!(ratio <= 1.0)) {  // NaN lands here too
      if (bad++ == 0) {
        first_t = t;
        first_r = r;
        first_got = got;
        first_ref = ref;
        first_bound = bound;
      }
    }
    if (std::isfinite(ratio)) worst_ratio = std::max(worst_ratio, ratio);
  }
  void merge(const Check& o) {
    if (o.bad > 0 && bad == 0) {
      first_t = o.first_t;
      first_r = o.first_r;
      first_got = o.first_got;
      first_ref = o.first_ref;
      first_bound = o.first_bound;
    }
    bad += o.bad;
    worst_ratio = std::max(worst_ratio, o.worst_ratio);
  }
  void expect(const std::string& where) const {
    EXPECT_EQ(bad, 0) << where << ": " << what << ": " << bad << " outputs out of bound; first at token " << first_t
                      << " row " << first_r << ": got " << first_got << " ref " << first_ref << " |diff| "
                      << std::fabs(first_got - first_ref) << " bound " << first_bound << "; worst diff/bound "
                      << worst_ratio;
  }
};

// ---- q8 kernel v5: host emulation of its per-lane code (ops/cuda/matvec_q8v5.cuh) ----
// Runs without a device: the same loads, realignment, decode and dot products as the kernel, with every
// load checked against the bounds of the weight and activation arrays (the weight array ends exactly at
// the last row, so a read past the tensor aborts). Compared with the float64 product on the quantized
// activations (bound kTolKernel, as the device kernel on the device-quantized activations).

// Activations quantized as quantize_q8 does: per 32-element block d = amax / 127, q = round(x / d).
struct Q8Act {
  std::vector<int8_t> q;   // [n_tokens, k]
  std::vector<float> ds;   // [n_tokens, k / 32] pairs (d, d * sum q)
  std::vector<float> xq;   // [n_tokens, k]: q * d, what the kernel multiplies
};

Q8Act quantize_q8_host(const std::vector<float>& x, int64_t n_tokens, int64_t k) {
  Q8Act a{std::vector<int8_t>(static_cast<size_t>(n_tokens * k)), std::vector<float>(static_cast<size_t>(n_tokens * k / 16)),
          std::vector<float>(static_cast<size_t>(n_tokens * k))};
  for (int64_t b = 0; b < n_tokens * k / 32; ++b) {
    const float* xb = x.data() + 32 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = std::max(-127, std::min(127, static_cast<int>(std::nearbyint(xb[i] * id))));
      a.q[static_cast<size_t>(32 * b + i)] = static_cast<int8_t>(q);
      a.xq[static_cast<size_t>(32 * b + i)] = static_cast<float>(q) * d;
      sum += q;
    }
    a.ds[static_cast<size_t>(2 * b)] = d;
    a.ds[static_cast<size_t>(2 * b + 1)] = d * static_cast<float>(sum);
  }
  return a;
}

// Loads of the emulation must stay inside these arrays (cleared on destruction).
struct EmulationBounds {
  template <typename A, typename B, typename C>
  EmulationBounds(const A& w, const B& q, const C& ds) {
    auto& r = cuda::kern::q8v5_host_ranges();
    auto add = [&](const void* p, size_t bytes) {
      r.lo[r.n] = reinterpret_cast<uintptr_t>(p);
      r.hi[r.n] = r.lo[r.n] + bytes;
      ++r.n;
    };
    r.n = 0;
    add(w.data(), w.size() * sizeof(w[0]));
    add(q.data(), q.size() * sizeof(q[0]));
    add(ds.data(), ds.size() * sizeof(ds[0]));
  }
  ~EmulationBounds() { cuda::kern::q8v5_host_ranges().n = 0; }
};

// Compares y[t * y_stride + r] (t < n_tokens, r < n_rows) with weight rows `wref` times act rows `xq`:
// kernel bound kTolKernel * sum (|w| + 2|o|) |x'|. Row padding of y must still be NaN.
void expect_q8_product(const float* wref, const float* off, const float* xq, int64_t k, int64_t n_rows,
                       int64_t n_tokens, const std::vector<float>& y, int64_t y_stride, const std::string& where) {
  Check c{"kernel on the q8 activations"};
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < n_rows; ++r) {
      double ref = 0.0, mag = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double wv = wref[r * k + j], xv = xq[t * k + j];
        ref += wv * xv;
        mag += (std::fabs(wv) + 2.0 * off[r * k + j]) * std::fabs(xv);
      }
      c.add(t, r, y[static_cast<size_t>(t * y_stride + r)], ref, kTolKernel * mag);
    }
    for (int64_t r = n_rows; r < y_stride; ++r) {
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(t * y_stride + r)])) << where << ": wrote past the row end";
    }
  }
  c.expect(where);
}

template <DType T, int kNT, int kRows, int kDepth>
void emulate_case(const Weights& w, int64_t n_tokens, int split) {
  const int64_t k = w.k, n_rows = w.n_rows, y_stride = n_rows + 3;
  const Q8Act act = quantize_q8_host(random_floats(n_tokens * k, static_cast<uint32_t>(k + n_tokens)), n_tokens, k);
  std::vector<float> y(static_cast<size_t>(n_tokens * y_stride), NAN);
  cuda::kern::MatvecQ8Args a{w.bytes.data(), dtype_row_bytes(w.type, k), act.q.data(), act.ds.data(), y.data(), y_stride,
                         n_rows, k, static_cast<int>(n_tokens)};
  {
    const EmulationBounds bounds(w.bytes, act.q, act.ds);
    const int64_t groups = (n_rows + kRows - 1) / kRows;
    ThreadPool::global().parallel_for(groups, [&](int64_t g0, int64_t g1, int) {
      cuda::kern::q8v5_emulate<T, kNT, kRows, kDepth>(a, split, 1, g0, g1);
    }, 16);
  }
  const std::string where = fmt::format("v5 emulation {} k={} rows={} tokens={} (kNT {} kRows {} kDepth {} split {})",
                                        dtype_name(w.type), k, n_rows, n_tokens, kNT, kRows, kDepth, split);
  expect_q8_product(w.ref.data(), w.off.data(), act.xq.data(), k, n_rows, n_tokens, y, y_stride, where);
}

// Every configuration the workbench and production instantiate, on one weight matrix.
template <DType T>
void emulate_configs(int64_t k, int64_t n_rows) {
  const Weights w = make_weights(T, k, n_rows);
  for (int split : {1, 2, 4}) emulate_case<T, 1, 2, 1>(w, 1, split);
  emulate_case<T, 1, 1, 2>(w, 1, 1);
  emulate_case<T, 1, 4, 1>(w, 1, 1);
  emulate_case<T, 2, 2, 1>(w, 2, 1);
  emulate_case<T, 4, 2, 1>(w, 3, 4);
  emulate_case<T, 4, 2, 1>(w, 4, 1);
  emulate_case<T, 8, 2, 1>(w, 5, 2);
  emulate_case<T, 8, 2, 1>(w, 8, 1);
}

template <DType T>
void emulate_shapes() {
  constexpr int64_t bs = T == DType::Q6_K_G4                                             ? 1024
                         : T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K ? 256
                                                                                     : 32;
  emulate_configs<T>(bs, 1);                 // one block
  emulate_configs<T>(bs * 3, 7);             // rows not a multiple of the rows per warp
  if (bs <= 256) {                           // (a Q6_K_G4 row is whole 1024-element groups)
    emulate_configs<T>(1280, 33);            // a partial 1024-element step
    emulate_configs<T>(2048 + 512, 19);
  }
  emulate_configs<T>(5120, 5);               // 5 steps: uneven over 2 and 4 warps of a split
  if (bs == 32) {
    emulate_configs<T>(96, 5);
    emulate_configs<T>(1024 + 160, 21);
  }
}

TEST(MatvecQ8v5Emulation, Q4_0) { emulate_shapes<DType::Q4_0>(); }
TEST(MatvecQ8v5Emulation, Q5_0) { emulate_shapes<DType::Q5_0>(); }
TEST(MatvecQ8v5Emulation, Q8_0) { emulate_shapes<DType::Q8_0>(); }
TEST(MatvecQ8v5Emulation, Q4_K) { emulate_shapes<DType::Q4_K>(); }
TEST(MatvecQ8v5Emulation, Q5_K) { emulate_shapes<DType::Q5_K>(); }
TEST(MatvecQ8v5Emulation, Q6_K) { emulate_shapes<DType::Q6_K>(); }
TEST(MatvecQ8v5Emulation, Q6_K_G4) { emulate_shapes<DType::Q6_K_G4>(); }

// v5 on Q6_K_G4 decodes the codes and scales of the Q6_K blocks it regroups: the same outputs, bit for
// bit, at every configuration production runs (1 row per warp for Q6_K, 2 for Q6_K_G4).
TEST(MatvecQ8v5Emulation, Q6_KG4EqualsQ6_K) {
  const int64_t k = 5120, n_rows = 9;
  const Weights q6 = make_weights(DType::Q6_K, k, n_rows);
  std::vector<uint8_t> g4(static_cast<size_t>(dtype_row_bytes(DType::Q6_K_G4, k) * n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    quant::q6_k_to_g4(q6.bytes.data() + r * dtype_row_bytes(DType::Q6_K, k),
                      g4.data() + r * dtype_row_bytes(DType::Q6_K_G4, k), k);
  }
  for (int64_t nt : {1, 3, 8}) {
    const Q8Act act = quantize_q8_host(random_floats(nt * k, 91), nt, k);
    std::vector<float> y6(static_cast<size_t>(nt * n_rows), NAN), y4 = y6;
    for (int split : {1, 4}) {
      cuda::kern::MatvecQ8Args a6{q6.bytes.data(), dtype_row_bytes(DType::Q6_K, k), act.q.data(), act.ds.data(),
                                  y6.data(), n_rows, n_rows, k, static_cast<int>(nt)};
      cuda::kern::MatvecQ8Args a4 = a6;
      a4.w = g4.data();
      a4.w_stride = dtype_row_bytes(DType::Q6_K_G4, k);
      a4.y = y4.data();
      cuda::kern::q8v5_emulate<DType::Q6_K, 8, 1, 1>(a6, split, 1, 0, n_rows);
      cuda::kern::q8v5_emulate<DType::Q6_K_G4, 8, 2, 1>(a4, split, 1, 0, (n_rows + 1) / 2);
      int64_t nan = 0;
      for (float v : y4) nan += std::isnan(v);
      EXPECT_EQ(nan, 0) << "unwritten outputs";
      EXPECT_EQ(std::memcmp(y6.data(), y4.data(), 4 * y6.size()), 0) << "tokens " << nt << " split " << split;
    }
  }
}

// A real model shape at one token (the production configuration).
TEST(MatvecQ8v5Emulation, RealShapes) {
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
    const Weights w = make_weights(t, 5120, 1024);
    if (t == DType::Q4_K) emulate_case<DType::Q4_K, 1, 2, 1>(w, 1, 1);
    if (t == DType::Q6_K) emulate_case<DType::Q6_K, 1, 2, 1>(w, 1, 1);
    if (t == DType::Q8_0) emulate_case<DType::Q8_0, 1, 2, 1>(w, 1, 4);
  }
}

// Gathered (MoE) mode: slot s multiplies expert ids[s] with activation row s / x_div; slots with an
// invalid id are skipped (their outputs stay NaN).
template <DType T>
void emulate_gathered() {
  const int64_t k = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K ? 512 : 96, n_rows = 11;
  const int n_expert = 3, x_div = 2;
  const std::vector<int32_t> ids = {2, -1, 0, 3, 1, 2};
  const int n_slots = static_cast<int>(ids.size());
  const int64_t row_bytes = dtype_row_bytes(T, k), expert_stride = (n_rows * row_bytes + 15) / 16 * 16;
  std::vector<Weights> experts;
  std::vector<uint8_t> all(static_cast<size_t>(expert_stride * (n_expert - 1) + n_rows * row_bytes));
  for (int e = 0; e < n_expert; ++e) {
    experts.push_back(make_weights(T, k, n_rows + e));  // different seeds; the first n_rows rows are used
    std::memcpy(all.data() + e * expert_stride, experts.back().bytes.data(), static_cast<size_t>(n_rows * row_bytes));
  }
  const int64_t act_rows = (n_slots + x_div - 1) / x_div;
  const Q8Act act = quantize_q8_host(random_floats(act_rows * k, 99), act_rows, k);
  std::vector<float> y(static_cast<size_t>(n_slots * (n_rows + 1)), NAN);
  cuda::kern::MatvecQ8Args a{all.data(), row_bytes, act.q.data(), act.ds.data(), y.data(), n_rows + 1, n_rows, k, 1};
  a.ids = ids.data();
  a.w_expert_stride = expert_stride;
  a.n_expert = n_expert;
  a.x_div = x_div;
  {
    const EmulationBounds bounds(all, act.q, act.ds);
    cuda::kern::q8v5_emulate<T, 1, 2, 1>(a, 2, n_slots, 0, n_rows);
  }
  for (int s = 0; s < n_slots; ++s) {
    const std::string where = fmt::format("v5 gathered emulation {} slot {} expert {}", dtype_name(T), s, ids[s]);
    const std::vector<float> ys(y.begin() + s * (n_rows + 1), y.begin() + (s + 1) * (n_rows + 1));
    if (ids[s] < 0 || ids[s] >= n_expert) {
      EXPECT_TRUE(std::all_of(ys.begin(), ys.end(), [](float v) { return std::isnan(v); })) << where;
      continue;
    }
    const Weights& w = experts[static_cast<size_t>(ids[s])];
    expect_q8_product(w.ref.data(), w.off.data(), act.xq.data() + (s / x_div) * k, k, n_rows, 1, ys, n_rows + 1, where);
  }
}

TEST(MatvecQ8v5Emulation, Gathered) {
  emulate_gathered<DType::Q4_0>();
  emulate_gathered<DType::Q5_0>();
  emulate_gathered<DType::Q8_0>();
  emulate_gathered<DType::Q4_K>();
  emulate_gathered<DType::Q5_K>();
  emulate_gathered<DType::Q6_K>();
}

// The occupancy cap of the one-token v4 products: with the pad, exactly `ctas` CTAs fit on the SM, for
// the H100's 228 KB SMs (1 KB reserved per CTA) and the static ring sizes of the q8 types.
TEST(MatvecQ8Occupancy, PadLeavesRoomForExactlyTheCap) {
  constexpr int64_t kSm = 233472, kReserved = 1024;
  for (int64_t static_bytes : {0, 29184, 36352, 42240, 45000}) {
    for (int ctas : {2, 3, 4, 5}) {
      const int64_t pad = cuda::kern::occupancy_cap_pad(static_bytes, kSm, kReserved, ctas);
      const int64_t per_cta = static_bytes + pad + kReserved;
      const std::string where = fmt::format("static {} B, cap {}", static_bytes, ctas);
      if (pad > 0) {
        EXPECT_EQ(kSm / per_cta, ctas) << where;
      } else {
        EXPECT_LE(kSm / per_cta, ctas) << where;  // the kernel's own memory already caps it
      }
    }
  }
  EXPECT_EQ(cuda::kern::occupancy_cap_pad(60000, kSm, kReserved, 4), 0);  // 3 fit: nothing to add
}

#if DS_HAVE_CUDA

using cuda::MatmulKernel;
using cuda::MatmulPath;

bool have_gpu() { return cuda::device_count() > 0; }

struct Case {
  int64_t n_tokens;
  int64_t x_stride, y_stride;  // elements (>= k, >= n_rows)
  MatmulPath path;
  int64_t x_offset = 0;        // elements: shifts x off 16-byte alignment
  int64_t w_offset = 0;        // bytes: shifts the weights off 16-byte alignment
};

std::string describe(const Weights& w, const Case& c, MatmulKernel kernel) {
  return fmt::format("{} k={} rows={} tokens={} path={} kernel={} x_offset={} w_offset={}", dtype_name(w.type), w.k,
                     w.n_rows, c.n_tokens, static_cast<int>(c.path), cuda::matmul_kernel_name(kernel), c.x_offset,
                     c.w_offset);
}

// Checks the q8 scratch: per block d = amax / 127, |x - q d| <= d/2, s = d * sum q. Returns x' = q d.
std::vector<float> check_q8_scratch(const std::vector<uint8_t>& scratch, const std::vector<float>& x,
                                    int64_t x_offset, int64_t x_stride, int64_t n_tokens, int64_t k,
                                    const std::string& where) {
  const int64_t ds_off = cuda::matmul_scratch_ds_offset(k, n_tokens);
  std::vector<float> xq(static_cast<size_t>(n_tokens * k));
  int64_t bad = 0;
  std::string first;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t b = 0; b < k / 32; ++b) {
      float dsv[2];
      std::memcpy(dsv, scratch.data() + ds_off + 8 * (t * (k / 32) + b), 8);
      const float* xb = x.data() + x_offset + t * x_stride + 32 * b;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const double d = dsv[0];
      int sum = 0;
      bool ok = std::fabs(d - amax / 127.0) <= 1e-6 * amax / 127.0;
      for (int i = 0; i < 32; ++i) {
        const int q = static_cast<int8_t>(scratch[static_cast<size_t>(t * k + 32 * b + i)]);
        sum += q;
        ok = ok && q >= -127 && q <= 127 && std::fabs(xb[i] - q * d) <= (0.5 + 1e-4) * d;
        xq[static_cast<size_t>(t * k + 32 * b + i)] = static_cast<float>(q * d);
      }
      ok = ok && std::fabs(dsv[1] - d * sum) <= 1e-6 * std::fabs(d * sum) + 1e-30;
      if (!ok && bad++ == 0) {
        first = fmt::format("token {} block {}: amax {} d {} s {} (d*sum {})", t, b, amax, dsv[0], dsv[1], d * sum);
      }
    }
  }
  EXPECT_EQ(bad, 0) << where << ": q8 activation blocks wrong; first: " << first;
  return xq;
}

// Runs one case and compares every output with the reference; returns the worst error / bound ratio
// of the end-to-end check.
double run_case(const Weights& w, const cuda::CudaBuffer& wd, const Case& c) {
  const int dev = 0;
  const int64_t k = w.k, n_rows = w.n_rows;
  auto stream = cuda::Stream::create(dev);
  EXPECT_TRUE(stream.is_ok()) << stream.status().to_string();
  const int64_t x_elems = c.x_offset + c.x_stride * c.n_tokens, y_elems = c.y_stride * c.n_tokens;
  std::vector<float> x = random_floats(x_elems, static_cast<uint32_t>(k * 31 + c.n_tokens));
  auto xd = cuda::CudaBuffer::allocate(dev, 4 * x_elems);
  auto yd = cuda::CudaBuffer::allocate(dev, 4 * y_elems);
  EXPECT_TRUE(xd.is_ok() && yd.is_ok());
  EXPECT_TRUE(cuda::copy_to_device(xd->data(), x.data(), 4 * x_elems, *stream).is_ok());
  EXPECT_TRUE(cuda::fill_bytes(yd->data(), 0xFF, 4 * y_elems, *stream).is_ok());  // NaN everywhere

  const Device d{DeviceKind::kCuda, dev};
  TensorView wv = TensorView::contiguous(static_cast<uint8_t*>(wd.data()) + c.w_offset, w.type, {k, n_rows}, d);
  TensorView xv = TensorView::contiguous(static_cast<float*>(xd->data()) + c.x_offset, DType::F32, {k, c.n_tokens}, d);
  xv.nb[1] = 4 * c.x_stride;
  TensorView yv = TensorView::contiguous(yd->data(), DType::F32, {n_rows, c.n_tokens}, d);
  yv.nb[1] = 4 * c.y_stride;
  const MatmulKernel kernel = cuda::matmul_kernel(wv, xv, yv, c.path);
  const std::string where = describe(w, c, kernel);
  const bool q8 = kernel == MatmulKernel::kMatvecQ8;
  const bool mma = kernel == MatmulKernel::kMatvecMma;
  // Caller-owned scratch for the q8 kernel, read back below.
  const int64_t scratch_bytes = cuda::matmul_scratch_bytes(w.type, k, c.n_tokens);
  cuda::CudaBuffer scratch;
  if (q8) {
    auto sb = cuda::CudaBuffer::allocate(dev, scratch_bytes);
    EXPECT_TRUE(sb.is_ok());
    scratch = std::move(*sb);
  }
  const Status s = cuda::matmul_on(wv, xv, yv, dev, stream->handle(), c.path, scratch.data(), scratch.bytes());
  EXPECT_TRUE(s.is_ok()) << where << ": " << s.to_string();
  std::vector<float> y(static_cast<size_t>(y_elems));
  EXPECT_TRUE(cuda::copy_to_host(y.data(), yd->data(), 4 * y_elems, *stream).is_ok());
  std::vector<uint8_t> scratch_host(static_cast<size_t>(q8 ? scratch_bytes : 0));
  if (q8) {
    EXPECT_TRUE(cuda::copy_to_host(scratch_host.data(), scratch.data(), scratch_bytes, *stream).is_ok());
  }
  const Status sync = stream->synchronize();
  EXPECT_TRUE(sync.is_ok()) << where << ": " << sync.to_string();
  if (!s.is_ok() || !sync.is_ok()) return INFINITY;

  std::vector<float> xq;
  if (q8) xq = check_q8_scratch(scratch_host, x, c.x_offset, c.x_stride, c.n_tokens, k, where);
  if (mma) {  // the tensor-core kernel multiplies quantize_q8's codes too
    std::vector<float> xc(static_cast<size_t>(c.n_tokens * k));
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      std::copy_n(x.data() + c.x_offset + t * c.x_stride, k, xc.data() + t * k);
    }
    xq = quantize_q8_host(xc, c.n_tokens, k).xq;
  }
  const double tol = kernel == MatmulKernel::kGemm && w.type != DType::F32 ? kTolGemmBf16 : kTolF32;
  const int n_threads = ThreadPool::global().n_threads();
  std::vector<Check> e2e(static_cast<size_t>(n_threads), Check{"end to end"}),
      kern(static_cast<size_t>(n_threads), Check{"kernel on the q8 activations"}),
      rel(static_cast<size_t>(n_threads), Check{"q8 error relative to sum|w x|"});
  ThreadPool::global().parallel_for(c.n_tokens * n_rows, [&](int64_t i0, int64_t i1, int th) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_rows, r = i % n_rows;
      const float* xr = x.data() + c.x_offset + t * c.x_stride;
      const float* wr = w.ref.data() + r * k;
      double ref = 0.0, mag = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        ref += static_cast<double>(wr[j]) * xr[j];
        mag += std::fabs(static_cast<double>(wr[j]) * xr[j]);
      }
      const double got = y[static_cast<size_t>(t * c.y_stride + r)];
      if (!q8 && !mma) {
        e2e[th].add(t, r, got, ref, tol * mag);
        continue;
      }
      const float* xqr = xq.data() + t * k;
      const float* orow = w.off.data() + r * k;
      double ref_q = 0.0, mag_q = 0.0, quant_err = 0.0;
      for (int64_t b = 0; b < k / 32; ++b) {
        double amax = 0.0, wsum = 0.0;
        for (int64_t j = 32 * b; j < 32 * b + 32; ++j) {
          ref_q += static_cast<double>(wr[j]) * xqr[j];
          mag_q += (std::fabs(static_cast<double>(wr[j])) + 2.0 * orow[j]) * std::fabs(static_cast<double>(xqr[j]));
          amax = std::max(amax, std::fabs(static_cast<double>(xr[j])));
          wsum += std::fabs(static_cast<double>(wr[j]));
        }
        quant_err += amax / 127.0 * 0.5 * 1.001 * wsum;
      }
      kern[th].add(t, r, got, ref_q, kTolKernel * mag_q);
      e2e[th].add(t, r, got, ref, quant_err + kTolKernel * mag_q);
      if (k >= 256) rel[th].add(t, r, got, ref, kTolQ8 * mag);
    }
  }, 256);
  for (int th = 1; th < n_threads; ++th) {
    e2e[0].merge(e2e[static_cast<size_t>(th)]);
    kern[0].merge(kern[static_cast<size_t>(th)]);
    rel[0].merge(rel[static_cast<size_t>(th)]);
  }
  if (q8 || mma) kern[0].expect(where);
  e2e[0].expect(where);
  if (q8 || mma) rel[0].expect(where);
  // Padding between rows of y must stay untouched (still NaN).
  int64_t overwritten = 0;
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int64_t r = n_rows; r < c.y_stride; ++r) overwritten += !std::isnan(y[static_cast<size_t>(t * c.y_stride + r)]);
  }
  EXPECT_EQ(overwritten, 0) << where << ": wrote past the row end";
  ::testing::Test::RecordProperty(fmt::format("{}_{}x{}_t{}_{}", dtype_name(w.type), k, n_rows, c.n_tokens,
                                              cuda::matmul_kernel_name(kernel)),
                                  fmt::format("{:.3f}", e2e[0].worst_ratio));
  return e2e[0].worst_ratio;
}

cuda::CudaBuffer upload(const Weights& w, int64_t offset = 0) {
  auto b = cuda::CudaBuffer::allocate(0, static_cast<int64_t>(w.bytes.size()) + offset + 16);
  EXPECT_TRUE(b.is_ok());
  auto stream = cuda::Stream::create(0);
  EXPECT_TRUE(stream.is_ok());
  EXPECT_TRUE(cuda::copy_to_device(static_cast<uint8_t*>(b->data()) + offset, w.bytes.data(),
                                   static_cast<int64_t>(w.bytes.size()), *stream)
                  .is_ok());
  EXPECT_TRUE(stream->synchronize().is_ok());
  return std::move(*b);
}

// Rows of k elements exist in type t (Q6_K_G4 rows are whole 1024-element groups; the shapes of the
// other types that it cannot hold are skipped for it).
bool row_fits(DType t, int64_t k) { return k % dtype_block_size(t) == 0; }

void run_shapes(DType t, int64_t k, int64_t n_rows, const std::vector<int64_t>& tokens,
                const std::vector<MatmulPath>& paths) {
  if (t == DType::Q6_K_G4 && !row_fits(t, k)) return;
  const Weights w = make_weights(t, k, n_rows);
  const cuda::CudaBuffer wd = upload(w);
  for (MatmulPath p : paths) {
    for (int64_t nt : tokens) {
      if (p != MatmulPath::kGemm && nt > cuda::kMatmulMaxMatvecTokens) continue;
      run_case(w, wd, {nt, k, n_rows, p});
    }
  }
}

bool is_quant(DType t) { return dtype_block_size(t) > 1; }

class CudaMatmulTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaMatmulTest, SmallAndOddShapes) {
  const DType t = GetParam();
  const int64_t bs = dtype_block_size(t) == 1 ? 32 : dtype_block_size(t);
  const std::vector<MatmulPath> all = {MatmulPath::kMatvec, MatmulPath::kMatvecF32, MatmulPath::kGeneric,
                                       MatmulPath::kGemm};
  run_shapes(t, bs, 1, {1, 2, 16, 17}, all);
  run_shapes(t, bs * 3, 7, {1, 3, 5, 9, 16, 40}, all);
  run_shapes(t, std::max<int64_t>(bs, 256) * 5, 33, {1, 4, 8, 13, 33}, all);
}

// The q8 kernel at every token count it takes, on shapes that exercise partial 1024-element steps,
// row counts that are not multiples of the 16 rows of a CTA, and (non-K types) k not a multiple of 256.
TEST_P(CudaMatmulTest, MatvecTokenCountsAndPartialSteps) {
  const DType t = GetParam();
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 8};
  run_shapes(t, 256, 32, tokens, {MatmulPath::kMatvec});
  run_shapes(t, 1280, 37, tokens, {MatmulPath::kMatvec});
  run_shapes(t, 2048 + 512, 19, {1, 8}, {MatmulPath::kMatvec});
  if (dtype_block_size(t) <= 32) {
    run_shapes(t, 96, 5, tokens, {MatmulPath::kMatvec});
    run_shapes(t, 1024 + 160, 21, {1, 3, 8}, {MatmulPath::kMatvec});
    run_shapes(t, 2080, 3, {2, 7}, {MatmulPath::kMatvec});
  }
}

TEST_P(CudaMatmulTest, StridedAndMisalignedActivations) {
  const DType t = GetParam();
  const int64_t k = std::max<int64_t>(512, dtype_block_size(t));
  const Weights w = make_weights(t, k, 19);
  const cuda::CudaBuffer wd = upload(w);
  for (MatmulPath p : {MatmulPath::kMatvec, MatmulPath::kMatvecF32, MatmulPath::kGemm}) {
    run_case(w, wd, {3, k + 12, 19 + 5, p});
    run_case(w, wd, {6, k + 4, 19 + 1, p, /*x_offset=*/1});  // the staged kernel falls back; q8 does not
  }
}

// Weights 2 bytes off 16-byte alignment: the q8 kernel must not run (it needs 16-byte aligned rows or
// bases); the staged kernel takes the 2-byte aligned types, the generic one the rest. Results exact.
TEST_P(CudaMatmulTest, MisalignedWeightsFallBack) {
  const DType t = GetParam();
  const int64_t k = is_quant(t) ? std::max<int64_t>(512, dtype_block_size(t)) : 64;
  const Weights w = make_weights(t, k, 23);
  const cuda::CudaBuffer wd = upload(w, 2);
  for (int64_t nt : {1, 4}) {
    const Case c{nt, k, 23, MatmulPath::kMatvec, 0, /*w_offset=*/2};
    const Device d{DeviceKind::kCuda, 0};
    const TensorView wv = TensorView::contiguous(static_cast<uint8_t*>(wd.data()) + 2, t, {k, 23}, d);
    const TensorView xv = TensorView::contiguous(wd.data(), DType::F32, {k, nt}, d);
    const TensorView yv = TensorView::contiguous(wd.data(), DType::F32, {23, nt}, d);
    EXPECT_NE(cuda::matmul_kernel(wv, xv, yv, MatmulPath::kMatvec), MatmulKernel::kMatvecQ8) << dtype_name(t);
    run_case(w, wd, c);
  }
}

TEST_P(CudaMatmulTest, RealModelShapes) {
  const DType t = GetParam();
  run_shapes(t, 2048, 512, {1, 2, 5, 8, 16, 64}, {MatmulPath::kMatvec, MatmulPath::kGemm});
  run_shapes(t, 512, 2048, {1, 8}, {MatmulPath::kMatvec});
  run_shapes(t, 5120, 17408, {1, 2, 3, 4, 5, 8}, {MatmulPath::kMatvec});
  run_shapes(t, 5120, 17408, {1, 16}, {MatmulPath::kMatvecF32});
  run_shapes(t, 5120, 17408, {5, 64}, {MatmulPath::kGemm});
  run_shapes(t, 17408, 5120, {1, 8}, {MatmulPath::kMatvec});
  run_shapes(t, 17408, 5120, {1, 16}, {MatmulPath::kMatvecF32});
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatmulTest, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// ---- q8 versions v4 / v5 / mma on the device ----
// Every version of the q8 product (kMma: Q6_K_G4 on tensor cores at any token count when forced, v4 for
// the other types) on the same device-quantized activations: each against the float64
// product on those activations (kernel bound) and on the original ones (end to end), and against v4
// (twice the kernel bound), through matvec_q8_product_launch_version, the forced kernels of
// matvec_q8_product_launch / matvec_launch and the default pick. Outputs start as NaN; row padding must
// stay NaN.
const std::vector<cuda::MatvecQ8Version> kQ8Versions = {cuda::MatvecQ8Version::kV4, cuda::MatvecQ8Version::kV5,
                                         cuda::MatvecQ8Version::kV5Persistent, cuda::MatvecQ8Version::kV5SplitK,
                                         cuda::MatvecQ8Version::kV4Whole, cuda::MatvecQ8Version::kMma};

void run_q8_versions(const Weights& w, const cuda::CudaBuffer& wd, int64_t n_tokens) {
  const int dev = 0;
  const int64_t k = w.k, n_rows = w.n_rows, y_stride = n_rows + 3, y_elems = y_stride * n_tokens;
  auto stream = cuda::Stream::create(dev);
  ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
  auto cs = static_cast<cudaStream_t>(stream->handle());
  const std::vector<float> x = random_floats(n_tokens * k, static_cast<uint32_t>(k * 7 + n_tokens));
  const int64_t act_bytes = cuda::matvec_q8_act_bytes(k, n_tokens);
  auto xd = cuda::CudaBuffer::allocate(dev, 4 * n_tokens * k);
  auto act = cuda::CudaBuffer::allocate(dev, act_bytes);
  ASSERT_TRUE(xd.is_ok() && act.is_ok());
  ASSERT_TRUE(cuda::copy_to_device(xd->data(), x.data(), 4 * n_tokens * k, *stream).is_ok());
  // Outputs: one per version, then forced v5 / default through the product launch, then matvec_launch
  // with kQ8v5 (which quantizes itself into its own scratch).
  const int n_out = static_cast<int>(kQ8Versions.size()) + 3;
  std::vector<cuda::CudaBuffer> yd;
  for (int i = 0; i < n_out; ++i) {
    auto b = cuda::CudaBuffer::allocate(dev, 4 * y_elems);
    ASSERT_TRUE(b.is_ok());
    ASSERT_TRUE(cuda::fill_bytes(b->data(), 0xFF, 4 * y_elems, *stream).is_ok());
    yd.push_back(std::move(*b));
  }
  auto own_act = cuda::CudaBuffer::allocate(dev, act_bytes);
  ASSERT_TRUE(own_act.is_ok());
  ASSERT_EQ(cuda::quantize_q8_launch(static_cast<const float*>(xd->data()), k, nullptr, n_tokens, k, act->data(),
                                     nullptr, 0, cs),
            cudaSuccess);
  cuda::MatvecLaunch l{wd.data(), dtype_row_bytes(w.type, k), static_cast<const float*>(xd->data()), k, nullptr,
                       y_stride, n_rows, k, static_cast<int>(n_tokens)};
  l.act = act->data();
  l.act_bytes = act_bytes;
  std::vector<std::string> names;
  for (size_t i = 0; i < kQ8Versions.size(); ++i) {
    l.y = static_cast<float*>(yd[i].data());
    EXPECT_EQ(cuda::matvec_q8_product_launch_version(w.type, l, kQ8Versions[i], cs), cudaSuccess);
    names.push_back(cuda::matvec_q8_version_name(kQ8Versions[i]));
  }
  l.y = static_cast<float*>(yd[kQ8Versions.size()].data());
  EXPECT_EQ(cuda::matvec_q8_product_launch(w.type, l, cuda::MatvecKernel::kQ8v5, cs), cudaSuccess);
  names.push_back("product kQ8v5");
  l.y = static_cast<float*>(yd[kQ8Versions.size() + 1].data());
  EXPECT_EQ(cuda::matvec_q8_product_launch(w.type, l, cs), cudaSuccess);
  names.push_back(std::string("product default (") +
                  cuda::matvec_q8_version_name(cuda::matvec_q8_pick_version(w.type, n_rows, k, static_cast<int>(n_tokens))) +
                  ")");
  l.y = static_cast<float*>(yd[kQ8Versions.size() + 2].data());
  l.act = own_act->data();
  EXPECT_EQ(cuda::matvec_pick(w.type, l, cuda::MatvecKernel::kQ8v5), cuda::MatvecKernel::kQ8v5);
  EXPECT_EQ(cuda::matvec_launch(w.type, l, cuda::MatvecKernel::kQ8v5, cs), cudaSuccess);
  names.push_back("matvec_launch kQ8v5");

  std::vector<std::vector<float>> y(static_cast<size_t>(n_out), std::vector<float>(static_cast<size_t>(y_elems)));
  for (int i = 0; i < n_out; ++i) {
    EXPECT_TRUE(cuda::copy_to_host(y[static_cast<size_t>(i)].data(), yd[static_cast<size_t>(i)].data(), 4 * y_elems,
                                   *stream)
                    .is_ok());
  }
  std::vector<uint8_t> act_host(static_cast<size_t>(act_bytes));
  EXPECT_TRUE(cuda::copy_to_host(act_host.data(), act->data(), act_bytes, *stream).is_ok());
  const Status sync = stream->synchronize();
  ASSERT_TRUE(sync.is_ok()) << sync.to_string();
  const std::string base = fmt::format("{} rows={} k={} tokens={}", dtype_name(w.type), n_rows, k, n_tokens);
  const std::vector<float> xq = check_q8_scratch(act_host, x, 0, k, n_tokens, k, base);

  // References once: exact, on the quantized activations, and the bounds.
  const size_t n_outputs = static_cast<size_t>(n_tokens * n_rows);
  std::vector<double> ref(n_outputs), ref_q(n_outputs), bound_q(n_outputs), bound_e2e(n_outputs);
  ThreadPool::global().parallel_for(n_tokens * n_rows, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / n_rows, r = i % n_rows;
      const float* wr = w.ref.data() + r * k;
      const float* orow = w.off.data() + r * k;
      double a = 0, aq = 0, mq = 0, qerr = 0;
      for (int64_t b = 0; b < k / 32; ++b) {
        double amax = 0, wsum = 0;
        for (int64_t j = 32 * b; j < 32 * b + 32; ++j) {
          const double xv = x[static_cast<size_t>(t * k + j)], xqv = xq[static_cast<size_t>(t * k + j)];
          a += wr[j] * xv;
          aq += wr[j] * xqv;
          mq += (std::fabs(static_cast<double>(wr[j])) + 2.0 * orow[j]) * std::fabs(xqv);
          amax = std::max(amax, std::fabs(xv));
          wsum += std::fabs(static_cast<double>(wr[j]));
        }
        qerr += amax / 127.0 * 0.5 * 1.001 * wsum;
      }
      ref[static_cast<size_t>(i)] = a;
      ref_q[static_cast<size_t>(i)] = aq;
      bound_q[static_cast<size_t>(i)] = kTolKernel * mq;
      bound_e2e[static_cast<size_t>(i)] = qerr + kTolKernel * mq;
    }
  }, 256);
  for (int v = 0; v < n_out; ++v) {
    const std::vector<float>& yv = y[static_cast<size_t>(v)];
    const std::string where = base + " " + names[static_cast<size_t>(v)];
    Check kern{"kernel on the q8 activations"}, e2e{"end to end"}, v4{"agreement with v4"};
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < n_rows; ++r) {
        const size_t i = static_cast<size_t>(t * n_rows + r);
        const double got = yv[static_cast<size_t>(t * y_stride + r)];
        kern.add(t, r, got, ref_q[i], bound_q[i]);
        e2e.add(t, r, got, ref[i], bound_e2e[i]);
        v4.add(t, r, got, y[0][static_cast<size_t>(t * y_stride + r)], 2.0 * bound_q[i]);
      }
      for (int64_t r = n_rows; r < y_stride; ++r) {
        EXPECT_TRUE(std::isnan(yv[static_cast<size_t>(t * y_stride + r)])) << where << ": wrote past the row end";
      }
    }
    kern.expect(where);
    e2e.expect(where);
    v4.expect(where);
  }
  // v4w runs v4's warp code with a deeper ring: the same sums in the same order.
  const size_t v4w = static_cast<size_t>(std::find(kQ8Versions.begin(), kQ8Versions.end(),
                                                   cuda::MatvecQ8Version::kV4Whole) - kQ8Versions.begin());
  int64_t differ = 0;
  for (int64_t i = 0; i < y_elems; ++i) {
    const float a = y[v4w][static_cast<size_t>(i)], b = y[0][static_cast<size_t>(i)];
    if (std::memcmp(&a, &b, sizeof a) != 0) ++differ;
  }
  EXPECT_EQ(differ, 0) << base << ": v4w differs from v4 in " << differ << " outputs";
}

void q8_versions_shapes(DType t, int64_t k, int64_t n_rows, const std::vector<int64_t>& tokens) {
  if (t == DType::Q6_K_G4 && !row_fits(t, k)) return;
  const Weights w = make_weights(t, k, n_rows);
  const cuda::CudaBuffer wd = upload(w);
  for (int64_t nt : tokens) run_q8_versions(w, wd, nt);
}

const DType kQ8Types[] = {DType::Q4_0, DType::Q5_0, DType::Q8_0,
                          DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q6_K_G4};

class CudaMatvecQ8VersionsTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

// Edge shapes: one block, rows not a multiple of the 2 rows per warp or the 8 rows of a CTA, partial
// 1024-element steps, steps not a multiple of the split.
TEST_P(CudaMatvecQ8VersionsTest, TokenCountsAndEdgeShapes) {
  const DType t = GetParam();
  const int64_t bs = dtype_block_size(t);
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5, 8};
  q8_versions_shapes(t, bs, 1, tokens);
  q8_versions_shapes(t, bs * 3, 7, tokens);
  q8_versions_shapes(t, 1280, 33, tokens);
  q8_versions_shapes(t, 2048 + 512, 19, {1, 8});
  q8_versions_shapes(t, 5120, 37, {1, 3});
  if (bs == 32) {
    q8_versions_shapes(t, 96, 5, tokens);
    q8_versions_shapes(t, 1024 + 160, 21, {1, 3, 8});
    q8_versions_shapes(t, 2080, 3, {2, 7});
  }
}

// The 27B and 35B-A3B decode shapes (rows x k).
TEST_P(CudaMatvecQ8VersionsTest, RealModelShapes) {
  const DType t = GetParam();
  const int64_t shapes[][2] = {{17408, 5120}, {5120, 17408}, {10240, 5120}, {6144, 5120}, {5120, 6144},
                               {48, 5120},    {1024, 5120},  {2048, 512},   {512, 2048},  {8192, 2048},
                               {2048, 4096}};
  for (const auto& s : shapes) q8_versions_shapes(t, s[1], s[0], s[0] * s[1] > 20'000'000 ? std::vector<int64_t>{1, 8}
                                                                                         : std::vector<int64_t>{1, 2, 5});
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatvecQ8VersionsTest, ::testing::ValuesIn(kQ8Types),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// Host logic only (runs without a device): the forced q8 kernels apply where kQ8 does and fall back
// like it; the pick table gives a q8 version for every shape.
TEST(CudaMatvecQ8Versions, ForcedKernelsAndPick) {
  alignas(16) static uint8_t fake[16];
  for (DType t : kTypes) {
    cuda::MatvecLaunch l{fake, dtype_row_bytes(t, 1024), reinterpret_cast<const float*>(fake), 1024,
                         reinterpret_cast<float*>(fake), 64, 64, 1024, 4};
    l.act = fake;
    l.act_bytes = cuda::matvec_q8_act_bytes(1024, 4);
    for (cuda::MatvecKernel q : {cuda::MatvecKernel::kQ8, cuda::MatvecKernel::kQ8v4, cuda::MatvecKernel::kQ8v5}) {
      EXPECT_EQ(cuda::matvec_pick(t, l, q), is_quant(t) ? q : cuda::MatvecKernel::kStaged) << dtype_name(t);
    }
    cuda::MatvecLaunch off = l;
    off.w = fake + 2;  // not 16-byte aligned: no q8 version
    EXPECT_NE(cuda::matvec_pick(t, off, cuda::MatvecKernel::kQ8v5), cuda::MatvecKernel::kQ8v5) << dtype_name(t);
  }
  for (int nt = 1; nt <= 8; ++nt) {
    for (int64_t rows : {48, 1024, 5120, 17408}) {
      const cuda::MatvecQ8Version v = cuda::matvec_q8_pick_version(DType::Q4_K, rows, 5120, nt);
      EXPECT_STRNE(cuda::matvec_q8_version_name(v), "?");
    }
  }
  // The measured table (matvec_q8_pick_version): split-K for few rows or long rows (v4w at one token
  // for rows of at most 6144 where its ring fits 2 warps), persistent v5 for the largest Q4_K/Q5_K
  // products at one token, v4 elsewhere.
  using V = cuda::MatvecQ8Version;
  struct Case {
    DType t;
    int64_t rows, k;
    int nt;
    V want;
  };
  for (const Case& c : {Case{DType::Q4_K, 48, 5120, 1, V::kV4Whole}, Case{DType::Q4_K, 2048, 4096, 1, V::kV4Whole},
                        Case{DType::Q4_K, 2048, 4096, 2, V::kV5SplitK}, Case{DType::Q4_K, 2048, 8192, 1, V::kV5SplitK},
                        Case{DType::Q6_K, 2048, 4096, 1, V::kV5SplitK}, Case{DType::Q6_K, 1024, 5120, 8, V::kV5SplitK},
                        Case{DType::Q4_K, 17408, 5120, 1, V::kV5Persistent}, Case{DType::Q4_K, 17408, 5120, 2, V::kV4},
                        Case{DType::Q6_K, 17408, 5120, 1, V::kV4}, Case{DType::Q4_K, 5120, 17408, 1, V::kV4},
                        Case{DType::Q4_K, 5120, 17408, 4, V::kV5SplitK}, Case{DType::Q6_K, 5120, 17408, 8, V::kV4},
                        Case{DType::Q8_0, 10240, 5120, 1, V::kV4}, Case{DType::Q4_K, 2048, 512, 1, V::kV4},
                        Case{DType::Q6_K_G4, 2048, 4096, 1, V::kV4}, Case{DType::Q6_K_G4, 5120, 17408, 3, V::kV5SplitK},
                        Case{DType::Q6_K_G4, 5120, 17408, 4, V::kV5SplitK},
                        Case{DType::Q6_K_G4, 5120, 17408, 5, V::kMma},
                        Case{DType::Q6_K_G4, 1024, 5120, 8, V::kMma},
                        Case{DType::Q6_K_G4, 248320, 5120, 8, V::kMma}, Case{DType::Q6_K_G4, 10240, 5120, 2, V::kV4}}) {
    // DELTASERVE_MATVEC_MMA (a measurement override) moves where Q6_K_G4 takes the tensor cores.
    if (c.t == DType::Q6_K_G4 && c.nt > 1 && cuda::matvec_mma_min_tokens(c.t) != cuda::kMatvecMmaQ6MinTokens) continue;
    EXPECT_EQ(cuda::matvec_q8_pick_version(c.t, c.rows, c.k, c.nt), c.want)
        << dtype_name(c.t) << " " << c.rows << " x " << c.k << " tokens " << c.nt << ": got "
        << cuda::matvec_q8_version_name(cuda::matvec_q8_pick_version(c.t, c.rows, c.k, c.nt));
  }
}

// Host logic only (runs without a device): the parts of one tensor-core launch must start at
// multiples of 16 rows, in order, inside the rows, at most 4 in all, with outputs, and be all under or
// all at least kMatvecMmaWideRows rows; anything else is refused before a launch.
TEST(CudaMatvecMma, PartsAreChecked) {
  alignas(16) static uint8_t fake[16];
  const int64_t k = 256, rows = 96;
  cuda::MatvecLaunch l{fake, dtype_row_bytes(DType::Q4_K, k), reinterpret_cast<const float*>(fake), k,
                       reinterpret_cast<float*>(fake), rows, rows, k, 4};
  l.act = fake;
  l.act_bytes = cuda::matvec_mma_act_bytes(k);
  float* y = reinterpret_cast<float*>(fake);
  using P = cuda::MatvecMmaPart;
  const std::vector<std::vector<P>> bad = {
      {P{8, y, 8}},                              // not a multiple of 16
      {P{32, y, 8}, P{16, y, 8}},                // out of order
      {P{32, y, 8}, P{32, y, 8}},                // an empty part
      {P{96, y, 8}},                             // past the rows
      {P{0, y, 8}},                              // an empty first part
      {P{16, nullptr, 8}},                       // no output
      {P{16, y, 8}, P{32, y, 8}, P{48, y, 8}, P{64, y, 8}},  // 5 parts
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(cuda::matvec_mma_product_launch(DType::Q4_K, l, nullptr, bad[i].data(), static_cast<int>(bad[i].size())),
              cudaErrorInvalidValue)
        << "case " << i;
  }
  cuda::MatvecLaunch wide = l;
  wide.n_rows = cuda::kMatvecMmaWideRows + 64;
  const P mixed[] = {P{cuda::kMatvecMmaWideRows, y, 8}};  // 8192 rows, then 64
  EXPECT_EQ(cuda::matvec_mma_product_launch(DType::Q4_K, wide, nullptr, mixed, 1), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::matvec_mma_product_launch(DType::Q6_K, l, nullptr, nullptr, 0), cudaErrorInvalidValue);
}

// Which kernel runs where: the q8 kernel for quantized weights at 1..8 tokens on aligned rows; the
// F32-activation kernels for float weights, 9..16 tokens, and the F32 path. Host logic only: runs
// without a device.
TEST(CudaMatmulKernelChoice, ByTypeTokensAndPath) {
  const Device d{DeviceKind::kCuda, 0};
  alignas(16) static uint8_t fake[16];  // never dereferenced: matmul_kernel only looks at addresses
  const int64_t k = 1024;
  for (DType t : kTypes) {
    const TensorView wv = TensorView::contiguous(fake, t, {k, 64}, d);
    for (int64_t nt : {1, 8, 9, 16}) {
      const TensorView xv = TensorView::contiguous(fake, DType::F32, {k, nt}, d);
      const TensorView yv = TensorView::contiguous(fake, DType::F32, {64, nt}, d);
      const MatmulKernel q8 = cuda::matvec_mma_wanted(t, k, static_cast<int>(nt)) ? MatmulKernel::kMatvecMma
                                                                                   : MatmulKernel::kMatvecQ8;
      const MatmulKernel want = is_quant(t) && nt <= 8 ? q8 : MatmulKernel::kMatvecStaged;
      const std::string what = fmt::format("{} tokens {}", dtype_name(t), nt);
      EXPECT_EQ(cuda::matmul_kernel(wv, xv, yv, MatmulPath::kMatvec), want) << what;
      EXPECT_EQ(cuda::matmul_kernel(wv, xv, yv, MatmulPath::kMatvecF32), MatmulKernel::kMatvecStaged) << what;
      EXPECT_EQ(cuda::matmul_kernel(wv, xv, yv, MatmulPath::kGeneric), MatmulKernel::kMatvecGeneric) << what;
      EXPECT_EQ(cuda::matmul_kernel(wv, xv, yv, MatmulPath::kAuto),
                nt < cuda::kMatmulGemmMinTokens ? want : MatmulKernel::kGemm)
          << what;
    }
    EXPECT_EQ(cuda::matmul_scratch_bytes(t, k, 4) > 0, is_quant(t)) << dtype_name(t);
    EXPECT_EQ(cuda::matmul_scratch_bytes(t, k, 9), 0) << dtype_name(t);
    if (cuda::matvec_mma_min_tokens() == cuda::kMatvecMmaMinTokens && cuda::kMatvecMmaMinTokens > 1) {  // the default
      EXPECT_EQ(cuda::matvec_mma_wanted(t, k, 8), t == DType::Q4_K) << dtype_name(t);
      EXPECT_FALSE(cuda::matvec_mma_wanted(t, k, 1)) << dtype_name(t);
    }
    // 2 bytes off alignment: never q8.
    const TensorView w_off = TensorView::contiguous(fake + 2, t, {k, 64}, d);
    const TensorView x1 = TensorView::contiguous(fake, DType::F32, {k, 1}, d);
    const TensorView y1 = TensorView::contiguous(fake, DType::F32, {64, 1}, d);
    EXPECT_NE(cuda::matmul_kernel(w_off, x1, y1, MatmulPath::kMatvec), MatmulKernel::kMatvecQ8) << dtype_name(t);
    EXPECT_NE(cuda::matmul_kernel(w_off, x1, y1, MatmulPath::kMatvec), MatmulKernel::kMatvecMma) << dtype_name(t);
    // Activations off alignment: the q8 kernel still applies (it reads x one float at a time).
    const TensorView x_off = TensorView::contiguous(reinterpret_cast<float*>(fake) + 1, DType::F32, {k, 1}, d);
    const MatmulKernel one = cuda::matvec_mma_wanted(t, k, 1) ? MatmulKernel::kMatvecMma : MatmulKernel::kMatvecQ8;
    EXPECT_EQ(cuda::matmul_kernel(wv, x_off, y1, MatmulPath::kMatvec), is_quant(t) ? one : MatmulKernel::kMatvecGeneric)
        << dtype_name(t);
  }
}

TEST(CudaMatmulErrors, ShapesTypesAndDevicesAreChecked) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto stream = cuda::Stream::create(0);
  ASSERT_TRUE(stream.is_ok());
  auto buf = cuda::CudaBuffer::allocate(0, 1 << 20);
  ASSERT_TRUE(buf.is_ok());
  const Device d{DeviceKind::kCuda, 0};
  TensorView w = TensorView::contiguous(buf->data(), DType::Q4_K, {256, 8}, d);
  TensorView x = TensorView::contiguous(buf->data(), DType::F32, {256, 2}, d);
  TensorView y_bad = TensorView::contiguous(buf->data(), DType::F32, {9, 2}, d);
  Status s = cuda::matmul(w, x, y_bad, *stream);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[9, 2] f32"), std::string::npos) << s.message();

  TensorView w_q5 = TensorView::contiguous(buf->data(), DType::Q5_1, {256, 8}, d);
  TensorView y = TensorView::contiguous(buf->data(), DType::F32, {8, 2}, d);
  s = cuda::matmul(w_q5, x, y, *stream);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("q5_1"), std::string::npos) << s.message();

  TensorView x_cpu = x;
  x_cpu.device = Device{};
  s = cuda::matmul(w, x_cpu, y, *stream);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cpu"), std::string::npos) << s.message();

  TensorView w_odd = TensorView::contiguous(buf->data(), DType::F32, {7, 8}, d);
  TensorView x_odd = TensorView::contiguous(buf->data(), DType::F32, {7, 2}, d);
  EXPECT_TRUE(cuda::matmul(w_odd, x_odd, y, *stream, MatmulPath::kMatvec).is_ok());  // generic path
  TensorView x_many = TensorView::contiguous(buf->data(), DType::F32, {256, 17}, d);
  TensorView y_many = TensorView::contiguous(buf->data(), DType::F32, {8, 17}, d);
  s = cuda::matmul(w, x_many, y_many, *stream, MatmulPath::kMatvec);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(stream->synchronize().is_ok());
}

// matmul_many of one token over two runs of different types (a Q6_K_G4 weight beside a Q4_K one, as a
// Q4_K_M layer's attn_qkv and attn_gate + ssm_beta + ssm_alpha): one matvec_q8_pair launch, whose
// outputs equal the two products run apart bit for bit; the pair applies only where both run v4.
TEST(CudaMatmulPair, TwoTypesInOneLaunchEqualTwoLaunches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Device d{DeviceKind::kCuda, 0};
  auto stream = cuda::Stream::create(0);
  ASSERT_TRUE(stream.is_ok());
  for (const bool g4_first : {true, false}) {
    const int64_t k = 2048;
    const Weights wa = make_weights(DType::Q6_K_G4, k, 1000), wb = make_weights(DType::Q4_K, k, 4160);
    const Weights& w1 = g4_first ? wa : wb;
    const Weights& w2 = g4_first ? wb : wa;
    const cuda::CudaBuffer d1 = upload(w1), d2 = upload(w2);
    const std::vector<float> x = random_floats(k, 77);
    auto xd = cuda::CudaBuffer::allocate(0, 4 * k);
    auto yd = cuda::CudaBuffer::allocate(0, 4 * 2 * (w1.n_rows + w2.n_rows));
    ASSERT_TRUE(xd.is_ok() && yd.is_ok());
    ASSERT_TRUE(cuda::copy_to_device(xd->data(), x.data(), 4 * k, *stream).is_ok());
    ASSERT_TRUE(cuda::fill_bytes(yd->data(), 0xFF, yd->bytes(), *stream).is_ok());
    float* y = static_cast<float*>(yd->data());
    const TensorView xv = TensorView::contiguous(xd->data(), DType::F32, {k, 1}, d);
    const TensorView ws[] = {TensorView::contiguous(d1.data(), w1.type, {k, w1.n_rows}, d),
                             TensorView::contiguous(d2.data(), w2.type, {k, w2.n_rows}, d)};
    // The pair: outputs at y[0..), apart: at y[n1 + n2 ..).
    const TensorView pair_ys[] = {TensorView::contiguous(y, DType::F32, {w1.n_rows, 1}, d),
                                  TensorView::contiguous(y + w1.n_rows, DType::F32, {w2.n_rows, 1}, d)};
    float* y_apart = y + w1.n_rows + w2.n_rows;
    const TensorView apart_ys[] = {TensorView::contiguous(y_apart, DType::F32, {w1.n_rows, 1}, d),
                                   TensorView::contiguous(y_apart + w1.n_rows, DType::F32, {w2.n_rows, 1}, d)};
    ASSERT_TRUE(cuda::matmul_many_on(ws, xv, pair_ys, 0, stream->handle()).is_ok());
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(cuda::matmul_on(ws[i], xv, apart_ys[i], 0, stream->handle()).is_ok());
    std::vector<float> got(static_cast<size_t>(2 * (w1.n_rows + w2.n_rows)));
    ASSERT_TRUE(cuda::copy_to_host(got.data(), yd->data(), 4 * static_cast<int64_t>(got.size()), *stream).is_ok());
    ASSERT_TRUE(stream->synchronize().is_ok());
    const size_t n = static_cast<size_t>(w1.n_rows + w2.n_rows);
    int64_t nan = 0;
    for (size_t i = 0; i < n; ++i) nan += std::isnan(got[i]);
    EXPECT_EQ(nan, 0) << "unwritten outputs";
    EXPECT_EQ(std::memcmp(got.data(), got.data() + n, 4 * n), 0) << (g4_first ? "g4 first" : "q4_K first");

    // Where it applies: one token, both on v4, one k and one activation scratch, an instantiated pair.
    alignas(16) static uint8_t fake[16];
    auto launch = [&](const Weights& w, int64_t rows, int nt) {
      cuda::MatvecLaunch l{fake, dtype_row_bytes(w.type, k), reinterpret_cast<const float*>(fake), k,
                           reinterpret_cast<float*>(fake), rows, rows, k, nt};
      l.act = fake;
      l.act_bytes = cuda::matvec_q8_act_bytes(k, nt);
      return l;
    };
    EXPECT_TRUE(cuda::matvec_q8_pair_applies(w1.type, launch(w1, w1.n_rows, 1), w2.type, launch(w2, w2.n_rows, 1)));
    EXPECT_FALSE(cuda::matvec_q8_pair_applies(w1.type, launch(w1, w1.n_rows, 2), w2.type, launch(w2, w2.n_rows, 2)));
    EXPECT_FALSE(cuda::matvec_q8_pair_applies(w1.type, launch(w1, w1.n_rows, 1), w1.type, launch(w1, w1.n_rows, 1)));
    // A Q4_K product of few rows runs v4w, not v4: apart.
    EXPECT_FALSE(cuda::matvec_q8_pair_applies(DType::Q6_K_G4, launch(wa, 1000, 1), DType::Q4_K, launch(wb, 2048, 1)));
  }
}

#else  // !DS_HAVE_CUDA

TEST(CudaMatmulTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
