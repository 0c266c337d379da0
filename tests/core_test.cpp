// Tests for core: Status/Result, dtype table, fp16/bf16 conversions, tensor views.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/half.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ds {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value {} is not positive", v);
  return v;
}

Status use_positive(int v, int* out) {
  DS_ASSIGN_OR_RETURN(int x, parse_positive(v));
  *out = x * 2;
  return Status::ok();
}

TEST(Status, ResultCarriesValueOrStatus) {
  int out = 0;
  EXPECT_TRUE(use_positive(4, &out).is_ok());
  EXPECT_EQ(out, 8);
  Status s = use_positive(-1, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "value -1 is not positive");
  EXPECT_EQ(s.with_context("flag --n").to_string(), "invalid argument: flag --n: value -1 is not positive");
}

TEST(DType, BlockSizesMatchGgml) {
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 512), 288);
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 64), 68);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 256), 210);
  EXPECT_EQ(dtype_row_bytes(DType::BF16, 3), 6);
  EXPECT_EQ(dtype_info(99u), nullptr);
  DType t;
  ASSERT_TRUE(dtype_from_name("Q4_K", &t));
  EXPECT_EQ(t, DType::Q4_K);
  EXPECT_FALSE(dtype_from_name("q9_z", &t));
}

TEST(Half, Fp16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_fp16(f), h) << "fp16 bits " << h;
  }
}

TEST(Half, Fp16RoundsToNearestEven) {
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(1.0f + 1.0f / 2048)), 1.0f);       // tie -> even
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_EQ(f32_to_fp16(1e6f), 0x7c00);  // overflow -> inf
  EXPECT_EQ(fp16_to_f32(f32_to_fp16(5.9604645e-8f)), 5.9604645e-8f);  // min subnormal
  EXPECT_EQ(f32_to_fp16(2.0e-8f), 0);
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(TensorView, ContiguousStrides) {
  TensorView t = TensorView::contiguous(nullptr, DType::Q8_0, {64, 3, 2});
  EXPECT_EQ(t.nb[1], 68);
  EXPECT_EQ(t.nb[2], 204);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.n_bytes(), 408);
  EXPECT_EQ(t.shape_string(), "[64, 3, 2] q8_0");
}

}  // namespace
}  // namespace ds

#include <atomic>
#include "core/thread_pool.h"

namespace ds {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 64, 1000}) {
      for (int64_t grain : {1, 4, 32}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
          for (int64_t i = b; i < e; ++i) hits[i]++;
        }, grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ds
