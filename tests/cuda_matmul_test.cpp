// CUDA matrix product against the CPU reference (quant::dequantize_row + a float64 dot) for every weight
// type, on small, odd and real model shapes, through each path (staged matvec, generic matvec, GEMM).
// Outputs are poisoned with NaN first, so an element the kernel never wrote fails. Skipped without a
// CUDA build or device. Weights are random bytes with sane fp16 scales: every code pattern occurs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

#if DS_HAVE_CUDA
#include "ops/cuda/cuda_matmul.h"
#endif

namespace ds {
namespace {

#if DS_HAVE_CUDA

using cuda::MatmulPath;

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q5_0,
                        DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Tolerance on |y - ref| relative to sum_k |w_k x_k| (stated once, per path):
//  - matvec paths compute in F32 on exactly decoded weights; only the summation order differs, and a
//    thread sums at most k/128 + 7 products: (17408/128 + 7) * 2^-24 < 1e-5, so 2e-5 bounds it.
//  - the BF16 GEMM rounds both operands to BF16 (2^-9 relative each), a product at most 2^-8 off:
//    4e-3 plus F32 accumulation, so 5e-3.  F32 weights take the F32 GEMM: 2e-5 as above.
double tolerance(DType t, MatmulPath path) {
  if (path == MatmulPath::kGemm && t != DType::F32) return 5e-3;
  return 2e-5;
}

bool have_gpu() { return cuda::device_count() > 0; }

// Random row bytes for type t: floats for plain types; random bytes with each block's fp16 scale fields
// overwritten by values in [0.002, 0.02) for quantized types.
std::vector<uint8_t> random_weights(DType t, int64_t n_rows, int64_t k, uint32_t seed) {
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

struct Case {
  DType type;
  int64_t k, n_rows, n_tokens;
  int64_t x_stride, y_stride;  // elements (>= k, >= n_rows)
  MatmulPath path;
  int64_t x_offset = 0;        // elements: shifts x off 16-byte alignment
};

std::string describe(const Case& c) {
  return fmt::format("{} k={} rows={} tokens={} path={} x_offset={}", dtype_name(c.type), c.k, c.n_rows,
                     c.n_tokens, static_cast<int>(c.path), c.x_offset);
}

// Runs one case and compares every output with the reference; returns the worst error / bound ratio.
double run_case(const Case& c, const std::vector<uint8_t>& w_host, const std::vector<float>& w_ref) {
  const int dev = 0;
  auto stream = cuda::Stream::create(dev);
  EXPECT_TRUE(stream.is_ok()) << stream.status().to_string();
  const int64_t x_elems = c.x_offset + c.x_stride * c.n_tokens, y_elems = c.y_stride * c.n_tokens;
  std::vector<float> x = random_floats(x_elems, static_cast<uint32_t>(c.k * 31 + c.n_tokens));
  auto wd = cuda::CudaBuffer::allocate(dev, static_cast<int64_t>(w_host.size()));
  auto xd = cuda::CudaBuffer::allocate(dev, 4 * x_elems);
  auto yd = cuda::CudaBuffer::allocate(dev, 4 * y_elems);
  EXPECT_TRUE(wd.is_ok() && xd.is_ok() && yd.is_ok());
  EXPECT_TRUE(cuda::copy_to_device(wd->data(), w_host.data(), static_cast<int64_t>(w_host.size()), *stream).is_ok());
  EXPECT_TRUE(cuda::copy_to_device(xd->data(), x.data(), 4 * x_elems, *stream).is_ok());
  EXPECT_TRUE(cuda::fill_bytes(yd->data(), 0xFF, 4 * y_elems, *stream).is_ok());  // NaN everywhere

  const Device d{DeviceKind::kCuda, dev};
  TensorView wv = TensorView::contiguous(wd->data(), c.type, {c.k, c.n_rows}, d);
  TensorView xv = TensorView::contiguous(static_cast<float*>(xd->data()) + c.x_offset, DType::F32, {c.k, c.n_tokens}, d);
  xv.nb[1] = 4 * c.x_stride;
  TensorView yv = TensorView::contiguous(yd->data(), DType::F32, {c.n_rows, c.n_tokens}, d);
  yv.nb[1] = 4 * c.y_stride;
  const Status s = cuda::matmul(wv, xv, yv, *stream, c.path);
  EXPECT_TRUE(s.is_ok()) << describe(c) << ": " << s.to_string();
  std::vector<float> y(static_cast<size_t>(y_elems));
  EXPECT_TRUE(cuda::copy_to_host(y.data(), yd->data(), 4 * y_elems, *stream).is_ok());
  const Status sync = stream->synchronize();
  EXPECT_TRUE(sync.is_ok()) << describe(c) << ": " << sync.to_string();

  const double tol = tolerance(c.type, c.path);
  std::vector<double> worst(static_cast<size_t>(c.n_tokens), 0.0);
  std::vector<int64_t> bad(static_cast<size_t>(c.n_tokens), 0);
  ThreadPool::global().parallel_for(c.n_tokens * c.n_rows, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / c.n_rows, r = i % c.n_rows;
      const float* xr = x.data() + c.x_offset + t * c.x_stride;
      const float* wr = w_ref.data() + r * c.k;
      double ref = 0.0, mag = 0.0;
      for (int64_t j = 0; j < c.k; ++j) {
        ref += static_cast<double>(wr[j]) * xr[j];
        mag += std::fabs(static_cast<double>(wr[j]) * xr[j]);
      }
      const double got = y[static_cast<size_t>(t * c.y_stride + r)];
      const double ratio = std::fabs(got - ref) / (tol * mag + 1e-30);
      if (!(ratio <= 1.0)) bad[static_cast<size_t>(t)]++;  // NaN lands here too
      if (std::isfinite(ratio)) worst[static_cast<size_t>(t)] = std::max(worst[static_cast<size_t>(t)], ratio);
    }
  }, 256);
  double w_all = 0.0;
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    EXPECT_EQ(bad[static_cast<size_t>(t)], 0) << describe(c) << ": token " << t << " has outputs off by more than "
                                              << tol << " of sum|w x| (or NaN)";
    w_all = std::max(w_all, worst[static_cast<size_t>(t)]);
  }
  // Padding between rows of y must stay untouched (still NaN).
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int64_t r = c.n_rows; r < c.y_stride; ++r) {
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(t * c.y_stride + r)])) << describe(c) << ": wrote past row end";
    }
  }
  return w_all;
}

std::vector<float> dequantized(DType t, const std::vector<uint8_t>& w, int64_t n_rows, int64_t k) {
  std::vector<float> out(static_cast<size_t>(n_rows * k));
  quant::dequantize_rows(t, w.data(), out.data(), n_rows, k, ThreadPool::global().n_threads());
  return out;
}

void run_shapes(DType t, int64_t k, int64_t n_rows, const std::vector<int64_t>& tokens,
                const std::vector<MatmulPath>& paths) {
  const auto w = random_weights(t, n_rows, k, static_cast<uint32_t>(k * 131 + n_rows));
  const auto ref = dequantized(t, w, n_rows, k);
  for (MatmulPath p : paths) {
    for (int64_t nt : tokens) {
      if (p != MatmulPath::kGemm && nt > cuda::kMatmulMaxMatvecTokens) continue;
      const double worst = run_case({t, k, n_rows, nt, k, n_rows, p}, w, ref);
      ::testing::Test::RecordProperty(fmt::format("{}_{}x{}_t{}_p{}", dtype_name(t), k, n_rows, nt,
                                                  static_cast<int>(p)),
                                      fmt::format("{:.3f}", worst));
    }
  }
}

class CudaMatmulTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaMatmulTest, SmallAndOddShapes) {
  const DType t = GetParam();
  const int64_t bs = dtype_block_size(t) == 1 ? 32 : dtype_block_size(t);
  const std::vector<MatmulPath> all = {MatmulPath::kMatvec, MatmulPath::kGeneric, MatmulPath::kGemm};
  run_shapes(t, bs, 1, {1, 2, 16, 17}, all);
  run_shapes(t, bs * 3, 7, {1, 3, 5, 9, 16, 40}, all);
  run_shapes(t, std::max<int64_t>(bs, 256) * 5, 33, {1, 4, 8, 13, 33}, all);
}

TEST_P(CudaMatmulTest, StridedAndMisalignedActivations) {
  const DType t = GetParam();
  const int64_t k = 512, n_rows = 19;
  const auto w = random_weights(t, n_rows, k, 5);
  const auto ref = dequantized(t, w, n_rows, k);
  for (MatmulPath p : {MatmulPath::kMatvec, MatmulPath::kGemm}) {
    run_case({t, k, n_rows, 3, k + 12, n_rows + 5, p}, w, ref);
    run_case({t, k, n_rows, 6, k + 4, n_rows + 1, p, /*x_offset=*/1}, w, ref);  // matvec falls back
  }
}

TEST_P(CudaMatmulTest, RealModelShapes) {
  const DType t = GetParam();
  const std::vector<MatmulPath> all = {MatmulPath::kMatvec, MatmulPath::kGemm};
  run_shapes(t, 2048, 512, {1, 16, 64}, all);
  run_shapes(t, 5120, 17408, {1, 5, 64}, all);
  run_shapes(t, 17408, 5120, {1, 16}, {MatmulPath::kMatvec});
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatmulTest, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

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

#else  // !DS_HAVE_CUDA

TEST(CudaMatmulTest, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace ds
