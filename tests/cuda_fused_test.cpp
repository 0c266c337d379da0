// The fused and strided CUDA ops of the decode step against the CPU reference of the unfused chain on
// the same inputs: matmul_many (also bit-exact against one CUDA matmul per weight: the same kernels on
// the same converted activations), matmul_swiglu, rms_norm / l2_norm on strided rows, mul_sigmoid
// with a strided gate, delta_net with a strided v (recurrent fast / generic and chunked kernels),
// conv1d_causal_silu, rms_norm_gated, delta_net_prep (the one-token kernel and the chain, every output
// and the conv state); real 27B shapes and odd ones; and the fused ops captured into a
// CUDA graph and replayed on new inputs. Outputs start as NaN, so an element a kernel never wrote
// fails; a failure prints the first bad index, both values and the worst error. Skipped without a
// CUDA build or device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "quant/quant.h"

#if DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/conv1d.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_matmul.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/delta_net.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

using test::Host;
using test::PrepCase;
using test::PrepIO;

// Tolerances, max |cuda - ref| / max(1, max |ref|), stated once:
constexpr double kTol = test::kTolF32;    // single-pass F32 ops against the double reference
constexpr double kTolLong = 1e-4;         // DeltaNet: F32 sums over tokens and dk
constexpr double kTolQ8 = test::kTolQuant;  // quantized weights (int8 activations or BF16 GEMM)
constexpr double kTolF32Weights = 1e-4;   // F32 weights: F32 kernels / F32 cuBLAS, sums of k products

// Compares got with want (row-major, rows of `row` elements): passes when max |got - want| <= tol *
// max(1, max |want|) and no NaN; otherwise names the first element past the bound.
::testing::AssertionResult matches(const std::vector<float>& got, const std::vector<float>& want, double tol,
                                 int64_t row) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  double worst = 0.0;
  int64_t first = -1, n_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const bool bad = !(err <= tol * scale);  // NaN is bad
    if (bad && first < 0) first = static_cast<int64_t>(i);
    n_bad += bad;
    if (std::isfinite(err)) worst = std::max(worst, err);
  }
  if (n_bad == 0) return ::testing::AssertionSuccess();
  const size_t f = static_cast<size_t>(first);
  return ::testing::AssertionFailure() << n_bad << " of " << got.size() << " elements past " << tol << " * " << scale
                                       << "; first at " << first << " (row " << first / row << ", column "
                                       << first % row << "): got " << got[f] << " want " << want[f]
                                       << "; worst |diff| " << worst << " (" << worst / scale << " relative)";
}

// Bit-exact comparison (same kernels on the same data), with the first differing element.
::testing::AssertionResult identical(const std::vector<float>& got, const std::vector<float>& want, int64_t row) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      return ::testing::AssertionFailure() << "first difference at " << i << " (row " << i / row << ", column "
                                           << i % row << "): " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Weight rows quantized from random floats: host bytes, their dequantized values and the device copy.
struct QWeight {
  DType type;
  int64_t k, rows;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [rows, k]
  TensorView host, dev;
};

// The reference product y[t, r] = sum_i deq[r, i] x[t, i] in double, as ops::ref::matmul computes it,
// parallel over rows (the real shapes have up to 89M weights).
std::vector<float> reference_product(const QWeight& w, const std::vector<float>& x, int64_t n_tokens) {
  std::vector<float> y(static_cast<size_t>(w.rows * n_tokens));
  ThreadPool::global().parallel_for(w.rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = w.deq.data() + r * w.k;
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x.data() + t * w.k;
        double acc = 0.0;
        for (int64_t i = 0; i < w.k; ++i) acc += static_cast<double>(wr[i]) * xt[i];
        y[static_cast<size_t>(t * w.rows + r)] = static_cast<float>(acc);
      }
    }
  });
  return y;
}


class CudaFusedTest : public test::CudaTest {
 protected:
  // The same host tensor's bytes again (new inputs for a captured graph).
  void reload(const TensorView& d, const Host& h) {
    ASSERT_TRUE(cuda::copy_to_device(d.data, h.v.data(), static_cast<int64_t>(4 * h.v.size()), stream_).is_ok());
  }

  QWeight weight(DType type, int64_t k, int64_t rows) {
    QWeight w{type, k, rows, {}, {}, {}, {}};
    std::vector<float> f(static_cast<size_t>(k * rows));
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (float& x : f) x = nd(rng_);
    const int n_threads = ThreadPool::global().n_threads();
    w.bytes.resize(static_cast<size_t>(dtype_row_bytes(type, k) * rows));
    quant::quantize_rows(type, f.data(), w.bytes.data(), rows, k, n_threads);
    w.deq.resize(f.size());
    quant::dequantize_rows(type, w.bytes.data(), w.deq.data(), rows, k, n_threads);
    w.host = TensorView::contiguous(w.bytes.data(), type, {k, rows});
    w.dev = up(w.host, static_cast<int64_t>(w.bytes.size()));
    return w;
  }

  std::mt19937 rng_{4321};
};

double weight_tol(DType t) { return t == DType::F32 ? kTolF32Weights : kTolQ8; }

class CudaFusedMatmulTest : public CudaFusedTest {
 protected:
  void run_many(const std::vector<QWeight>& ws, int64_t n_tokens, const std::string& what) {
    const int64_t k = ws[0].k;
    SCOPED_TRACE(::testing::Message() << what << ", " << n_tokens << " tokens");
    Host x({k, n_tokens});
    x.random(rng_, -2, 2);
    const TensorView dx = up(x);
    std::vector<TensorView> dws, dys, dys_single;
    for (const QWeight& w : ws) {
      Host out({w.rows, n_tokens});
      dws.push_back(w.dev);
      dys.push_back(up(out));
      dys_single.push_back(up(out));
    }
    const Status s = matmul_many(ctx_, dws, dx, dys);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    for (size_t i = 0; i < ws.size(); ++i) {
      const QWeight& w = ws[i];
      ASSERT_TRUE(matmul(ctx_, w.dev, dx, dys_single[i]).is_ok());
      const std::vector<float> got = down(dys[i], w.rows * n_tokens), single = down(dys_single[i], w.rows * n_tokens);
      const cuda::MatmulKernel kern = cuda::matmul_kernel(w.dev, dx, dys[i]);
      // The same kernels on the same converted activations: bit-identical today; the bound only
      // allows for a matvec kernel that one day quantizes inside the product.
      EXPECT_TRUE(matches(got, single, 1e-5, w.rows))
          << "product " << i << " (" << dtype_name(w.type) << " " << w.k << "x" << w.rows << ", "
          << cuda::matmul_kernel_name(kern) << ") vs one matmul; bit-identical: "
          << (identical(got, single, w.rows) ? "yes" : "no");
      EXPECT_TRUE(matches(got, reference_product(w, x.v, n_tokens), weight_tol(w.type), w.rows))
          << "product " << i << " (" << dtype_name(w.type) << " " << w.k << "x" << w.rows << ", "
          << cuda::matmul_kernel_name(kern) << ") vs CPU reference";
    }
  }

  // y = w (silu(gate) * up) against the CPU chain (reference) and the CUDA chain (swiglu, matmul).
  void run_swiglu(const QWeight& w, int64_t n_tokens) {
    const int64_t k = w.k;
    SCOPED_TRACE(::testing::Message() << "matmul_swiglu " << dtype_name(w.type) << " " << k << "x" << w.rows << ", "
                                      << n_tokens << " tokens");
    Host gate({k, n_tokens}), upv({k, n_tokens}), y({w.rows, n_tokens});
    gate.random(rng_, -4, 4);
    upv.random(rng_, -2, 2);
    const TensorView dg = up(gate), du = up(upv), dy = up(y), dg2 = up(gate), dy2 = up(y);
    const Status s = matmul_swiglu(ctx_, w.dev, dg, du, dy);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_TRUE(swiglu(ctx_, dg2, du, dg2).is_ok());
    ASSERT_TRUE(matmul(ctx_, w.dev, dg2, dy2).is_ok());
    const std::vector<float> got = down(dy, w.rows * n_tokens);
    // The quantizer computes silu(gate) * up with the element-wise kernel's formula; a last-bit
    // difference may move one int8 code by one step, hence a small bound rather than bit equality.
    EXPECT_TRUE(matches(got, down(dy2, w.rows * n_tokens), 2e-3, w.rows)) << "vs CUDA swiglu + matmul";
    Host g_ref = gate;
    g_ref.t.data = g_ref.v.data();
    ASSERT_TRUE(swiglu(test::ref_ctx(), g_ref.t, upv.t, g_ref.t).is_ok());
    EXPECT_TRUE(matches(got, reference_product(w, g_ref.v, n_tokens), weight_tol(w.type), w.rows))
        << "vs CPU reference chain";
  }
};

TEST_F(CudaFusedMatmulTest, ManyMixedTypesSmall) {
  // q8-capable types share one quantized input; F32 / BF16 take matmul_on's float kernels.
  std::vector<QWeight> ws;
  ws.push_back(weight(DType::Q4_K, 512, 40));
  ws.push_back(weight(DType::Q8_0, 512, 17));
  ws.push_back(weight(DType::F32, 512, 3));
  ws.push_back(weight(DType::Q6_K, 512, 1));
  ws.push_back(weight(DType::BF16, 512, 9));
  ws.push_back(weight(DType::Q5_0, 512, 33));
  for (int64_t n : {1, 2, 8, 9, 16, 40}) run_many(ws, n, "mixed 512");
}

// Weights back to back in one device buffer (as the model uploads gate/up and z/beta/alpha) with
// one-token outputs back to back (ModelScratch::f32_outputs) run as one product over all their rows;
// each output must match the CPU reference of its own product.
TEST_F(CudaFusedMatmulTest, ManyAdjacentProductsRunAsOne) {
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
    const int64_t k = 512;
    std::vector<QWeight> ws;
    for (int64_t rows : {40, 17, 3}) ws.push_back(weight(t, k, rows));
    std::vector<uint8_t> blob;
    int64_t total = 0;
    for (const QWeight& w : ws) {
      blob.insert(blob.end(), w.bytes.begin(), w.bytes.end());
      total += w.rows;
    }
    const TensorView all = up(TensorView::contiguous(blob.data(), t, {k, total}), static_cast<int64_t>(blob.size()));
    for (int64_t n : {1}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << ", " << n << " tokens");
      Host x({k, n}), out({total, n});
      x.random(rng_, -2, 2);
      const TensorView dx = up(x), dout = up(out);
      std::vector<TensorView> dws, dys;
      int64_t r0 = 0;
      for (const QWeight& w : ws) {
        dws.push_back(TensorView::contiguous(all.as<uint8_t>() + r0 * dtype_row_bytes(t, k), t, {k, w.rows}, all.device));
        dys.push_back(TensorView::contiguous(dout.as<float>() + r0, DType::F32, {w.rows, n}, dout.device));
        r0 += w.rows;
      }
      const Status s = matmul_many(ctx_, dws, dx, dys);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      const std::vector<float> got = down(dout, total * n);
      r0 = 0;
      for (size_t i = 0; i < ws.size(); ++i) {
        const std::vector<float> want = reference_product(ws[i], x.v, n);
        std::vector<float> mine(static_cast<size_t>(ws[i].rows * n));
        for (int64_t tk = 0; tk < n; ++tk) {
          for (int64_t r = 0; r < ws[i].rows; ++r) mine[tk * ws[i].rows + r] = got[tk * total + r0 + r];
        }
        EXPECT_TRUE(matches(mine, want, kTolQ8, ws[i].rows)) << "product " << i << " vs CPU reference";
        r0 += ws[i].rows;
      }
    }
  }
}

// At 4-8 tokens the tensor-core Q4_K products whose weights follow each other run as one launch with an
// output per product (matvec_mma_product_launch's parts): each output must be bit for bit what its own
// launch gives, and match the CPU reference. Part sizes off the 16-row tiles end a launch (the next
// product starts another), as do neighbours of the other CTA shape (under / from 8192 rows).
TEST_F(CudaFusedMatmulTest, ManyAdjacentProductsSeveralTokens) {
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> cases = {
      {512, {48, 32, 19}}, {512, {16, 40, 48, 64, 32}}, {512, {16, 32, 48, 64, 16}}, {256, {8192, 48}},
      {256, {8320, 8192}}};
  for (const auto& [k, rows] : cases) {
    std::vector<QWeight> ws;
    for (int64_t r : rows) ws.push_back(weight(DType::Q4_K, k, r));
    std::vector<uint8_t> blob;
    for (const QWeight& w : ws) blob.insert(blob.end(), w.bytes.begin(), w.bytes.end());
    const int64_t total = static_cast<int64_t>(blob.size()) / dtype_row_bytes(DType::Q4_K, k);
    const TensorView all =
        up(TensorView::contiguous(blob.data(), DType::Q4_K, {k, total}), static_cast<int64_t>(blob.size()));
    for (int64_t n : {4, 5, 8}) {
      SCOPED_TRACE(::testing::Message() << "k " << k << ", " << rows.size() << " products, " << n << " tokens");
      Host x({k, n});
      x.random(rng_, -2, 2);
      const TensorView dx = up(x);
      std::vector<TensorView> dws, dys, singles;
      int64_t r0 = 0;
      for (const QWeight& w : ws) {
        dws.push_back(TensorView::contiguous(all.as<uint8_t>() + r0 * dtype_row_bytes(DType::Q4_K, k), DType::Q4_K,
                                             {k, w.rows}, all.device));
        Host out({w.rows, n});
        dys.push_back(up(out));
        singles.push_back(up(out));
        r0 += w.rows;
      }
      const Status s = matmul_many(ctx_, dws, dx, dys);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      for (size_t i = 0; i < ws.size(); ++i) {
        if (cuda::matvec_mma_min_tokens() == cuda::kMatvecMmaMinTokens) {
          EXPECT_EQ(cuda::matmul_kernel(dws[i], dx, dys[i]), cuda::MatmulKernel::kMatvecMma) << "product " << i;
        }
        ASSERT_TRUE(matmul(ctx_, dws[i], dx, singles[i]).is_ok());
        const std::vector<float> got = down(dys[i], ws[i].rows * n), single = down(singles[i], ws[i].rows * n);
        EXPECT_TRUE(identical(got, single, ws[i].rows)) << "product " << i << " (" << ws[i].rows
                                                        << " rows) vs its own launch";
        EXPECT_TRUE(matches(got, reference_product(ws[i], x.v, n), kTolQ8, ws[i].rows))
            << "product " << i << " vs CPU reference";
      }
    }
  }
}

TEST_F(CudaFusedMatmulTest, ManyRealShapes) {
  // 27B DeltaNet: qkv [5120 -> 10240], z [5120 -> 6144], beta / alpha [5120 -> 48]; attention
  // q+gate [5120 -> 12288], k / v [5120 -> 1024].
  std::vector<QWeight> dn;
  dn.push_back(weight(DType::Q4_K, 5120, 10240));
  dn.push_back(weight(DType::Q4_K, 5120, 6144));
  dn.push_back(weight(DType::Q8_0, 5120, 48));
  dn.push_back(weight(DType::F32, 5120, 48));
  for (int64_t n : {1, 4, 12}) run_many(dn, n, "deltanet 5120");
  std::vector<QWeight> at;
  at.push_back(weight(DType::Q4_K, 5120, 12288));
  at.push_back(weight(DType::Q6_K, 5120, 1024));
  at.push_back(weight(DType::Q5_K, 5120, 1024));
  for (int64_t n : {1, 8}) run_many(at, n, "attention 5120");
}

TEST_F(CudaFusedMatmulTest, ManyRejectsMismatchedOutputs) {
  std::vector<QWeight> ws;
  ws.push_back(weight(DType::Q8_0, 64, 8));
  ws.push_back(weight(DType::Q8_0, 64, 4));
  Host x({64, 2}), y0({8, 2}), y1({5, 2});
  const TensorView dws[] = {ws[0].dev, ws[1].dev};
  const TensorView dys[] = {up(y0), up(y1)};
  const Status s = matmul_many(ctx_, dws, up(x), dys);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("product 1"), std::string::npos) << s.message();
}

TEST_F(CudaFusedMatmulTest, SwigluDownProjection) {
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
    const QWeight w = weight(t, 1024, 96);
    for (int64_t n : {1, 3, 8, 9, 20}) run_swiglu(w, n);
  }
  for (DType t : {DType::F32, DType::BF16}) {  // no q8 kernel: swiglu into gate, then the float product
    const QWeight w = weight(t, 256, 33);
    for (int64_t n : {1, 12}) run_swiglu(w, n);
  }
  const QWeight real = weight(DType::Q6_K, 17408, 5120);  // 27B dense FFN down
  for (int64_t n : {1, 2}) run_swiglu(real, n);
}

TEST_F(CudaFusedTest, NormsReadStridedRows) {
  struct Case { int64_t head_dim, n_head, row, c0, head_stride, n; };
  // DeltaNet q and k out of the 27B conv row (10240 = 2 * 16 * 128 + 48 * 128); attention q halves of
  // QG (24 heads of 256, stride 512); odd sizes.
  for (Case c : {Case{128, 16, 10240, 0, 128, 1}, Case{128, 16, 10240, 2048, 128, 3},
                 Case{256, 24, 12288, 0, 512, 1}, Case{256, 24, 12288, 0, 512, 5}, Case{33, 3, 200, 7, 40, 2},
                 Case{1, 2, 9, 1, 3, 4}, Case{5000, 1, 10001, 3, 5000, 2}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << c.head_dim << " heads " << c.n_head << " stride "
                                      << c.head_stride << " tokens " << c.n);
    Host src({c.row, c.n}), w({c.head_dim});
    src.random(rng_, -3, 3);
    w.random(rng_, 0.5, 1.5);
    const TensorView view = row_heads(src.t, c.c0, c.head_dim, c.n_head, c.head_stride);
    const TensorView dview = row_heads(up(src), c.c0, c.head_dim, c.n_head, c.head_stride);
    const TensorView dw = up(w);
    const int64_t n_out = c.head_dim * c.n_head * c.n;
    Host ref({c.head_dim, c.n_head, c.n}), out({c.head_dim, c.n_head, c.n});
    ASSERT_TRUE(rms_norm(test::ref_ctx(), view, w.t, 1e-6f, ref.t).is_ok());
    TensorView dy = up(out);
    ASSERT_TRUE(rms_norm(ctx_, dview, dw, 1e-6f, dy).is_ok());
    EXPECT_TRUE(matches(down(dy, n_out), ref.v, kTol, c.head_dim)) << "rms_norm";
    ref.poison();
    dy = up(out);
    ASSERT_TRUE(l2_norm(test::ref_ctx(), view, 1e-6f, ref.t).is_ok());
    ASSERT_TRUE(l2_norm(ctx_, dview, 1e-6f, dy).is_ok());
    EXPECT_TRUE(matches(down(dy, n_out), ref.v, kTol, c.head_dim)) << "l2_norm";
  }
}

TEST_F(CudaFusedTest, MulSigmoidReadsStridedGate) {
  for (auto [D, H, n] : {std::tuple<int64_t, int64_t, int64_t>{256, 24, 1}, {256, 24, 7}, {3, 5, 2}, {1, 4, 3}}) {
    SCOPED_TRACE(::testing::Message() << "D " << D << " H " << H << " tokens " << n);
    Host qg({2 * H * D, n}), x({D, H, n}), ref({D, H, n});
    qg.random(rng_, -4, 4);
    x.random(rng_, -2, 2);
    const TensorView gate = row_heads(qg.t, D, D, H, 2 * D);
    const TensorView dgate = row_heads(up(qg), D, D, H, 2 * D);
    ASSERT_TRUE(mul_sigmoid(test::ref_ctx(), x.t, gate, ref.t).is_ok());
    const TensorView dx = up(x);
    ASSERT_TRUE(mul_sigmoid(ctx_, dx, dgate, dx).is_ok());  // in place on x, as the attention layer runs it
    EXPECT_TRUE(matches(down(dx, D * H * n), ref.v, kTol, D));
  }
}

TEST_F(CudaFusedTest, DeltaNetReadsStridedV) {
  struct Case { int64_t dk, nk, dv, nv, n, pad; DeltaNetMode mode; };
  // pad: extra floats at the start of the conv row buffer, moving v off 16-byte alignment (generic kernel).
  for (Case c : {Case{128, 16, 128, 48, 1, 0, DeltaNetMode::kRecurrent},   // 27B decode, fast kernel
                 Case{128, 16, 128, 48, 3, 0, DeltaNetMode::kRecurrent},
                 Case{128, 2, 128, 4, 130, 0, DeltaNetMode::kChunked},    // chunked scan, two chunks + tail
                 Case{128, 2, 128, 4, 5, 1, DeltaNetMode::kRecurrent},    // misaligned v: generic kernel
                 Case{64, 2, 40, 4, 6, 0, DeltaNetMode::kRecurrent}}) {   // dv % 32 != 0: generic kernel
    SCOPED_TRACE(::testing::Message() << "dk " << c.dk << " nk " << c.nk << " dv " << c.dv << " nv " << c.nv
                                      << " tokens " << c.n << " pad " << c.pad << " mode " << static_cast<int>(c.mode));
    const int64_t key_dim = c.dk * c.nk, row = 2 * key_dim + c.dv * c.nv;
    Host conv({row * c.n + c.pad}), g({c.nv, c.n}), beta({c.nv, c.n}), st({c.dv, c.dk, c.nv});
    conv.random(rng_);
    g.random(rng_, -1.0f, -0.05f);
    beta.random(rng_, 0.1f, 0.9f);
    st.random(rng_, -0.1f, 0.1f);
    TensorView rows_h = TensorView::contiguous(conv.v.data() + c.pad, DType::F32, {row, c.n});
    const TensorView dconv_all = up(conv);
    TensorView rows_d = rows_h;
    rows_d.data = static_cast<float*>(dconv_all.data) + c.pad;
    rows_d.device = ctx_.device;
    // q, k: L2-normalized from the strided views, as the layer does (checked by NormsReadStridedRows).
    Host q({c.dk, c.nk, c.n}), k({c.dk, c.nk, c.n});
    ASSERT_TRUE(l2_norm(test::ref_ctx(), row_heads(rows_h, 0, c.dk, c.nk, c.dk), 1e-6f, q.t).is_ok());
    ASSERT_TRUE(l2_norm(test::ref_ctx(), row_heads(rows_h, key_dim, c.dk, c.nk, c.dk), 1e-6f, k.t).is_ok());
    const TensorView v_h = row_heads(rows_h, 2 * key_dim, c.dv, c.nv, c.dv);
    const TensorView v_d = row_heads(rows_d, 2 * key_dim, c.dv, c.nv, c.dv);
    Host st_ref = st, ref({c.dv, c.nv, c.n}), out({c.dv, c.nv, c.n});
    st_ref.t.data = st_ref.v.data();
    const TensorView dst = up(st), dout = up(out);
    ASSERT_TRUE(delta_net(test::ref_ctx(), q.t, k.t, v_h, g.t, beta.t, st_ref.t, ref.t, DeltaNetMode::kRecurrent).is_ok());
    const Status s = delta_net(ctx_, up(q), up(k), v_d, up(g), up(beta), dst, dout, c.mode);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_TRUE(matches(down(dout, c.dv * c.nv * c.n), ref.v, kTolLong, c.dv)) << "out";
    EXPECT_TRUE(matches(down(dst, c.dv * c.dk * c.nv), st_ref.v, kTolLong, c.dv)) << "state";
  }
}

TEST_F(CudaFusedTest, Conv1dSiluCarriesState) {
  for (auto [n_ch, n_tokens] : {std::pair<int64_t, int64_t>{10240, 1}, {10240, 2}, {300, 33}, {300, 100}, {7, 5}}) {
    SCOPED_TRACE(::testing::Message() << n_ch << " channels, " << n_tokens << " tokens");
    Host x({n_ch, n_tokens}), w({4, n_ch}), st({n_ch, 3}), ref({n_ch, n_tokens}), out({n_ch, n_tokens});
    x.random(rng_, -3, 3);
    w.random(rng_);
    st.random(rng_);
    Host st_ref = st;
    st_ref.t.data = st_ref.v.data();
    const TensorView dst = up(st), dy = up(out);
    ASSERT_TRUE(conv1d_causal(test::ref_ctx(), x.t, w.t, st_ref.t, ref.t).is_ok());
    ASSERT_TRUE(silu(test::ref_ctx(), ref.t, ref.t).is_ok());
    ASSERT_TRUE(conv1d_causal_silu(ctx_, up(x), up(w), dst, dy).is_ok());
    EXPECT_TRUE(matches(down(dy, n_ch * n_tokens), ref.v, kTol, n_ch)) << "y";
    EXPECT_TRUE(matches(down(dst, n_ch * 3), st_ref.v, kTol, n_ch)) << "state";
  }
}

TEST_F(CudaFusedTest, RmsNormGatedMatchesChain) {
  for (auto [dv, nv, n] : {std::tuple<int64_t, int64_t, int64_t>{128, 48, 1}, {128, 48, 6}, {33, 3, 2}, {1, 1, 1},
                           {9000, 1, 2}}) {
    SCOPED_TRACE(::testing::Message() << dv << " x " << nv << " x " << n);
    Host o({dv, nv, n}), w({dv}), z({dv, nv, n}), ref({dv, nv, n}), out({dv, nv, n});
    o.random(rng_, -3, 3);
    w.random(rng_, 0.5, 1.5);
    z.random(rng_, -4, 4);
    ASSERT_TRUE(rms_norm(test::ref_ctx(), o.t, w.t, 1e-6f, ref.t).is_ok());
    ASSERT_TRUE(swiglu(test::ref_ctx(), z.t, ref.t, ref.t).is_ok());
    const TensorView dout = up(out), dz = up(z), dw = up(w);
    ASSERT_TRUE(rms_norm_gated(ctx_, up(o), dw, dz, 1e-6f, dout).is_ok());
    EXPECT_TRUE(matches(down(dout, dv * nv * n), ref.v, kTol, dv)) << "out of place";
    const TensorView dio = up(o);
    ASSERT_TRUE(rms_norm_gated(ctx_, dio, dw, dz, 1e-6f, dio).is_ok());
    EXPECT_TRUE(matches(down(dio, dv * nv * n), ref.v, kTol, dv)) << "in place";
  }
}

// delta_net_prep against the CPU reference op on the same inputs: conv, q, k, g, beta and the updated conv
// state. One token runs the fused kernel (dk <= 1024, kernel <= 8), 3 tokens and dk 1100 the four ops'
// kernels. Bound kTol (2e-5 of max(1, max |ref|)): each value is a float conv of <= 8 fmas + SiLU, a
// gate, or a head scaled by 1 / sqrt(sum of dk squares) summed in float in another order than the
// reference's double sum: a few ulps; the state is copied, so it must match exactly.
TEST_F(CudaFusedTest, DeltaNetPrepMatchesCpu) {
  for (PrepCase c : {PrepCase{16, 48, 128, 4, 1},   // 27B decode: the fused kernel
                     PrepCase{16, 32, 128, 4, 1},   // 35B-A3B decode
                     PrepCase{16, 48, 128, 4, 3},   // the chain
                     PrepCase{2, 3, 5, 4, 1},       // dk below a warp, v channels not a block multiple
                     PrepCase{1, 1, 200, 8, 1},     // the largest kernel, dk not a warp multiple
                     PrepCase{3, 2, 64, 1, 1},      // kernel 1: no state
                     PrepCase{1, 2, 1024, 2, 1},    // dk at the kernel's limit
                     PrepCase{1, 2, 1100, 4, 1}}) { // dk past it: the chain
    SCOPED_TRACE(::testing::Message() << "nk " << c.nk << " nv " << c.nv << " dk " << c.dk << " kernel " << c.kernel
                                      << " tokens " << c.n);
    const int64_t n_ch = c.n_ch();
    PrepIO io(c);
    io.randomize(rng_, 25);
    // Device copies first (outputs still NaN, the state not yet updated by the reference).
    auto dev_of = [&](const Host& h) {
      if (!h.v.empty()) return up(h);
      TensorView t = h.t;
      t.data = dev(16);
      t.device = ctx_.device;
      return t;
    };
    const DeltaNetPrep d = io.args(1e-6f, dev_of);
    const DeltaNetPrep h = io.args(1e-6f);
    const Status sd = delta_net_prep(ctx_, d);
    ASSERT_TRUE(sd.is_ok()) << sd.to_string();
    const Status sh = delta_net_prep(test::ref_ctx(), h);
    ASSERT_TRUE(sh.is_ok()) << sh.to_string();
    EXPECT_TRUE(matches(down(d.conv), io.conv.v, kTol, n_ch)) << "conv";
    EXPECT_TRUE(matches(down(d.q), io.q.v, kTol, c.dk)) << "q";
    EXPECT_TRUE(matches(down(d.k), io.k.v, kTol, c.dk)) << "k";
    EXPECT_TRUE(matches(down(d.g), io.g.v, kTol, c.nv)) << "g";
    EXPECT_TRUE(matches(down(d.beta), io.beta.v, kTol, c.nv)) << "beta";
    if (!io.st.v.empty()) {
      EXPECT_TRUE(identical(down(d.conv_state), io.st.v, n_ch)) << "conv_state";
    }
  }
}

// One token through the fused ops, captured as a CUDA graph after a warm-up step (so every scratch
// block comes from the allocator's cache) and replayed on new inputs: the ops must neither
// synchronize nor allocate from the driver during capture, and the replay must see the new data.
TEST_F(CudaFusedTest, AddRmsNormMatchesChain) {
  // 9000 > 8 x 1024 elements: the kernel's tail loop (re-reads the written-back sum).
  for (auto [e, n] : {std::pair<int64_t, int64_t>{5120, 1}, {2048, 5}, {33, 3}, {1, 1}, {9000, 2}}) {
    SCOPED_TRACE(::testing::Message() << e << " x " << n);
    Host x({e, n}), r({e, n}), w({e}), sum({e, n}), ref({e, n}), out({e, n});
    x.random(rng_, -3, 3);
    r.random(rng_, -3, 3);
    w.random(rng_, 0.5, 1.5);
    sum.v = x.v;
    ASSERT_TRUE(add(test::ref_ctx(), sum.t, r.t, sum.t).is_ok());
    ASSERT_TRUE(rms_norm(test::ref_ctx(), sum.t, w.t, 1e-6f, ref.t).is_ok());
    const TensorView dx = up(x), dout = up(out);
    ASSERT_TRUE(add_rms_norm(ctx_, dx, up(r), up(w), 1e-6f, dout).is_ok());
    EXPECT_TRUE(matches(down(dx, e * n), sum.v, 1e-6, e)) << "x += r";
    EXPECT_TRUE(matches(down(dout, e * n), ref.v, kTol, e)) << "y";
    EXPECT_FALSE(add_rms_norm(ctx_, dx, up(r), up(w), 1e-6f, dx).is_ok()) << "y aliasing x is refused";
  }
}

// The norms that also write int8 activations (cuda::*_q8): y bit-equal to the plain norm, the
// activations byte-equal to quantize_q8 of that y, and products reading them bit-equal to products
// that quantize y themselves.
TEST_F(CudaFusedMatmulTest, NormsWriteTheProductsInt8Activations) {
  auto bytes_of = [&](const TensorView& d, int64_t n) {
    std::vector<uint8_t> out(static_cast<size_t>(n));
    EXPECT_TRUE(cuda::copy_to_host(out.data(), d.data, n, stream_).is_ok());
    EXPECT_TRUE(stream_.synchronize().is_ok());
    return out;
  };
  const auto cs = static_cast<cudaStream_t>(stream_.handle());
  // (row length, rows): a 27B hidden row, the DeltaNet output norm (48 heads of 128), the longest row
  // held in registers, a few rows.
  for (auto [e, rows] : {std::pair<int64_t, int64_t>{5120, 1}, {128, 48}, {8192, 1}, {256, 3}}) {
    for (int kind = 0; kind < 3; ++kind) {  // rms_norm, add_rms_norm, rms_norm_gated
      SCOPED_TRACE(::testing::Message() << e << " x " << rows << " kind " << kind);
      ASSERT_TRUE(cuda::norm_q8_applies(e));
      const int64_t act_bytes = cuda::norm_q8_act_bytes(e, rows);
      Host x({e, rows}), r({e, rows}), w({e}), z({e, rows}), y({e, rows});
      x.random(rng_, -3, 3);
      r.random(rng_, -3, 3);
      w.random(rng_, 0.5, 1.5);
      z.random(rng_, -2, 2);
      if (e == 256 && kind == 0) x.v[256 + 7] = NAN;  // row 1 all NaN: every block's d is NaN, as quantize_q8's
      const TensorView dx1 = up(x), dx2 = up(x), dr = up(r), dw = up(w), dz = up(z), dy1 = up(y), dy2 = up(y);
      const TensorView act = TensorView::contiguous(dev(act_bytes), DType::I8, {act_bytes}, ctx_.device);
      const TensorView act_ref = TensorView::contiguous(dev(act_bytes), DType::I8, {act_bytes}, ctx_.device);
      Status plain, fused;
      if (kind == 0) {
        plain = rms_norm(ctx_, dx1, dw, 1e-6f, dy1);
        fused = cuda::rms_norm_q8(ctx_, dx2, dw, 1e-6f, dy2, act);
      } else if (kind == 1) {
        plain = add_rms_norm(ctx_, dx1, dr, dw, 1e-6f, dy1);
        fused = cuda::add_rms_norm_q8(ctx_, dx2, dr, dw, 1e-6f, dy2, act);
      } else {
        plain = rms_norm_gated(ctx_, dx1, dw, dz, 1e-6f, dy1);
        fused = cuda::rms_norm_gated_q8(ctx_, dx2, dw, dz, 1e-6f, dy2, act);
      }
      ASSERT_TRUE(plain.is_ok()) << plain.to_string();
      ASSERT_TRUE(fused.is_ok()) << fused.to_string();
      ASSERT_EQ(cuda::quantize_q8_launch(static_cast<const float*>(dy1.data), e, nullptr, rows, e, act_ref.data,
                                         nullptr, 0, cs),
                cudaSuccess);
      EXPECT_TRUE(identical(down(dy2, e * rows), down(dy1, e * rows), e)) << "y";
      EXPECT_TRUE(identical(down(dx2, e * rows), down(dx1, e * rows), e)) << "x (written back by add_rms_norm)";
      EXPECT_TRUE(bytes_of(act, act_bytes) == bytes_of(act_ref, act_bytes)) << "activations vs quantize_q8";
    }
  }
  // Products on the norm's activations: bit-equal to products that quantize x themselves.
  std::vector<QWeight> ws;
  ws.push_back(weight(DType::Q4_K, 5120, 2048));
  ws.push_back(weight(DType::Q6_K, 5120, 512));
  ws.push_back(weight(DType::F32, 5120, 48));  // no int8 kernel: reads x
  Host x({5120, 1}), w({5120}), y({5120, 1});
  x.random(rng_, -3, 3);
  w.random(rng_, 0.5, 1.5);
  const int64_t act_bytes = cuda::norm_q8_act_bytes(5120, 1);
  const TensorView dx = up(x), dy = up(y);
  const TensorView act = TensorView::contiguous(dev(act_bytes), DType::I8, {act_bytes}, ctx_.device);
  ASSERT_TRUE(cuda::rms_norm_q8(ctx_, dx, up(w), 1e-6f, dy, act).is_ok());
  std::vector<TensorView> dws, fused, plain;
  for (const QWeight& q : ws) {
    Host out({q.rows, 1});
    dws.push_back(q.dev);
    fused.push_back(up(out));
    plain.push_back(up(out));
  }
  const Status s = cuda::matmul_many_q8(ctx_, dws, dy, act, fused);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_TRUE(matmul_many(ctx_, dws, dy, plain).is_ok());
  for (size_t i = 0; i < ws.size(); ++i) {
    EXPECT_TRUE(identical(down(fused[i], ws[i].rows), down(plain[i], ws[i].rows), ws[i].rows)) << "product " << i;
  }
  Host one({2048, 1});
  const TensorView done = up(one);
  ASSERT_TRUE(cuda::matmul_q8(ctx_, dws[0], dy, act, done).is_ok());
  EXPECT_TRUE(identical(down(done, 2048), down(plain[0], 2048), 2048)) << "matmul_q8";
  // Refusals: activations too small, a row length the kernel cannot quantize, a bad norm argument.
  const TensorView small = TensorView::contiguous(act.data, DType::I8, {act_bytes - 16}, ctx_.device);
  EXPECT_FALSE(cuda::rms_norm_q8(ctx_, dx, up(w), 1e-6f, dy, small).is_ok());
  EXPECT_FALSE(cuda::matmul_many_q8(ctx_, dws, dy, small, fused).is_ok());
  Host x33({33, 1}), w33({33}), y33({33, 1});
  EXPECT_FALSE(cuda::norm_q8_applies(33));
  EXPECT_FALSE(cuda::rms_norm_q8(ctx_, up(x33), up(w33), 1e-6f, up(y33), act).is_ok());
  EXPECT_FALSE(cuda::rms_norm_q8(ctx_, dx, up(w33), 1e-6f, dy, act).is_ok()) << "w of the wrong length";
}

TEST_F(CudaFusedMatmulTest, FusedOpsReplayInACudaGraph) {
  const int64_t k = 1024, n_ff = 512;
  std::vector<QWeight> ws;
  ws.push_back(weight(DType::Q4_K, k, n_ff));
  ws.push_back(weight(DType::Q4_K, k, n_ff));
  ws.push_back(weight(DType::F32, k, 16));
  const QWeight wd = weight(DType::Q6_K, n_ff, k);  // q8 path: matmul_swiglu leaves gate as it was
  const int64_t D = 64, H = 4;
  Host x({k, 1}), qg({2 * H * D, 1}), onorm({D, H, 1}), z({D, H, 1}), wn({D}), o({D, H, 1});
  Host gate_out({n_ff, 1}), up_out({n_ff, 1}), small_out({16, 1}), down_out({k, 1}), qn({D, H, 1}), y({D, H, 1});
  wn.random(rng_, 0.5, 1.5);
  const TensorView dx = up(x), dqg = up(qg), dz = up(z), dwn = up(wn), dox = up(o);
  const TensorView dgate = up(gate_out), dup = up(up_out), dsmall = up(small_out), ddown = up(down_out);
  const TensorView dqn = up(qn), dy = up(y);
  const TensorView dq_heads = row_heads(dqg, 0, D, H, 2 * D), dg_heads = row_heads(dqg, D, D, H, 2 * D);
  auto step = [&]() -> Status {
    const TensorView dws[] = {ws[0].dev, ws[1].dev, ws[2].dev};
    const TensorView dys[] = {dgate, dup, dsmall};
    DS_TRY(matmul_many(ctx_, dws, dx, dys));
    DS_TRY(matmul_swiglu(ctx_, wd.dev, dgate, dup, ddown));
    DS_TRY(rms_norm(ctx_, dq_heads, dwn, 1e-6f, dqn));
    DS_TRY(mul_sigmoid(ctx_, dqn, dg_heads, dqn));
    return rms_norm_gated(ctx_, dox, dwn, dz, 1e-6f, dy);
  };
  auto load = [&]() {
    for (Host* h : {&x, &qg, &z, &o}) h->random(rng_, -2, 2);
    reload(dx, x);
    reload(dqg, qg);
    reload(dz, z);
    reload(dox, o);
  };
  auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    Host g_ref({n_ff, 1}), u_ref({n_ff, 1}), s_ref({16, 1}), d_ref({k, 1}), q_ref({D, H, 1}), y_ref({D, H, 1});
    ASSERT_TRUE(matmul(test::ref_ctx(), ws[0].host, x.t, g_ref.t).is_ok());
    ASSERT_TRUE(matmul(test::ref_ctx(), ws[1].host, x.t, u_ref.t).is_ok());
    ASSERT_TRUE(matmul(test::ref_ctx(), ws[2].host, x.t, s_ref.t).is_ok());
    EXPECT_TRUE(matches(down(dgate, n_ff), g_ref.v, kTolQ8, n_ff)) << "gate";
    EXPECT_TRUE(matches(down(dup, n_ff), u_ref.v, kTolQ8, n_ff)) << "up";
    EXPECT_TRUE(matches(down(dsmall, 16), s_ref.v, kTolF32Weights, 16)) << "f32 weight";
    // The down projection from the CUDA gate / up (the product's own error is checked above).
    Host g_dev({n_ff, 1}), u_dev({n_ff, 1});
    g_dev.v = down(dgate, n_ff);
    u_dev.v = down(dup, n_ff);
    g_dev.t.data = g_dev.v.data();
    u_dev.t.data = u_dev.v.data();
    ASSERT_TRUE(swiglu(test::ref_ctx(), g_dev.t, u_dev.t, g_dev.t).is_ok());
    ASSERT_TRUE(matmul(test::ref_ctx(), wd.host, g_dev.t, d_ref.t).is_ok());
    EXPECT_TRUE(matches(down(ddown, k), d_ref.v, kTolQ8, k)) << "down";
    ASSERT_TRUE(rms_norm(test::ref_ctx(), row_heads(qg.t, 0, D, H, 2 * D), wn.t, 1e-6f, q_ref.t).is_ok());
    ASSERT_TRUE(mul_sigmoid(test::ref_ctx(), q_ref.t, row_heads(qg.t, D, D, H, 2 * D), q_ref.t).is_ok());
    EXPECT_TRUE(matches(down(dqn, D * H), q_ref.v, kTol, D)) << "q norm + gate";
    ASSERT_TRUE(rms_norm(test::ref_ctx(), o.t, wn.t, 1e-6f, y_ref.t).is_ok());
    ASSERT_TRUE(swiglu(test::ref_ctx(), z.t, y_ref.t, y_ref.t).is_ok());
    EXPECT_TRUE(matches(down(dy, D * H), y_ref.v, kTol, D)) << "rms_norm_gated";
  };
  load();
  Status s = step();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  check("warm-up");

  const cudaStream_t cs = static_cast<cudaStream_t>(stream_.handle());
  const int64_t allocs_before = cuda::DeviceAllocator::for_device(0).stats().n_device_allocs;
  cudaGraphExec_t exec = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture(step, &exec));
  EXPECT_EQ(cuda::DeviceAllocator::for_device(0).stats().n_device_allocs, allocs_before)
      << "the captured step allocated device memory";
  for (int rep = 0; rep < 3; ++rep) {
    load();
    ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
    check("graph replay");
  }
}

#else  // !DS_HAVE_CUDA

TEST(CudaFusedTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
