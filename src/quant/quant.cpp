// Dispatch of row conversion by dtype, the plain float types, and the multi-row helpers.
// Multi-row helpers use a private ThreadPool rather than the global one: the global pool is not
// reentrant, and a caller may already be inside one of its parallel_for bodies.
#include "quant/quant.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/check.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/quant_internal.h"

namespace ds::quant {

bool is_convertible(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K:
    case DType::Q6_K_G4:
      return true;
    default:
      return false;
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  DS_CHECK(is_convertible(t), "dequantize_row: unsupported type {}", dtype_name(t));
  const int64_t bs = dtype_block_size(t);
  DS_CHECK(n % bs == 0, "dequantize_row: {} elements not a multiple of {} block {}", n, dtype_name(t), bs);
  const int64_t nb = n / bs;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
    case DType::BF16: {
      // memcpy per element: rows need not be 2-byte aligned.
      const auto* b = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        dst[i] = t == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    }
    case DType::Q4_0: return dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::Q5_0: return dequantize_row_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case DType::Q5_1: return dequantize_row_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case DType::Q8_0: return dequantize_row_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::Q4_K: return dequantize_row_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::Q5_K: return dequantize_row_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case DType::Q6_K: return dequantize_row_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::Q8_K: return dequantize_row_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb);
    case DType::Q6_K_G4: {
      BlockQ6_K blocks[4];
      const auto* g = static_cast<const GroupQ6_K4*>(src);
      for (int64_t i = 0; i < nb; ++i) {
        g4_to_q6_k(g + i, blocks, 1024);
        dequantize_row_q6_k(blocks, dst + 1024 * i, 4);
      }
      return;
    }
    default: break;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  DS_CHECK(is_convertible(t), "quantize_row: unsupported type {}", dtype_name(t));
  const int64_t bs = dtype_block_size(t);
  DS_CHECK(n % bs == 0, "quantize_row: {} elements not a multiple of {} block {}", n, dtype_name(t), bs);
  const int64_t nb = n / bs;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16:
    case DType::BF16: {
      auto* b = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t == DType::F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
        std::memcpy(b + 2 * i, &h, 2);
      }
      return;
    }
    case DType::Q4_0: return quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::Q5_0: return quantize_row_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::Q5_1: return quantize_row_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case DType::Q8_0: return quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::Q4_K: return quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case DType::Q5_K: return quantize_row_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
    case DType::Q6_K: return quantize_row_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    case DType::Q8_K: return quantize_row_q8_k(src, static_cast<BlockQ8_K*>(dst), nb);
    case DType::Q6_K_G4: {
      BlockQ6_K blocks[4];
      auto* g = static_cast<GroupQ6_K4*>(dst);
      for (int64_t i = 0; i < nb; ++i) {
        quantize_row_q6_k(src + 1024 * i, blocks, 4);
        q6_k_to_g4(blocks, g + i, 1024);
      }
      return;
    }
    default: break;
  }
}

void q6_k_to_g4(const void* src, void* dst, int64_t n) {
  DS_CHECK(n % 1024 == 0, "q6_k_to_g4: {} elements not a multiple of 1024", n);
  const auto* x = static_cast<const BlockQ6_K*>(src);
  auto* g = static_cast<GroupQ6_K4*>(dst);
  for (int64_t i = 0; i < n / 1024; ++i, x += 4, ++g) {
    std::memset(g->pad, 0, sizeof(g->pad));
    for (int b = 0; b < 4; ++b) {
      std::memcpy(g->ql[b], x[b].ql, sizeof(x[b].ql));
      std::memcpy(g->qh[b], x[b].qh, sizeof(x[b].qh));
      std::memcpy(g->scales[b], x[b].scales, sizeof(x[b].scales));
      g->d[b] = x[b].d;
    }
  }
}

void g4_to_q6_k(const void* src, void* dst, int64_t n) {
  DS_CHECK(n % 1024 == 0, "g4_to_q6_k: {} elements not a multiple of 1024", n);
  const auto* g = static_cast<const GroupQ6_K4*>(src);
  auto* x = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < n / 1024; ++i, x += 4, ++g) {
    for (int b = 0; b < 4; ++b) {
      std::memcpy(x[b].ql, g->ql[b], sizeof(x[b].ql));
      std::memcpy(x[b].qh, g->qh[b], sizeof(x[b].qh));
      std::memcpy(x[b].scales, g->scales[b], sizeof(x[b].scales));
      x[b].d = g->d[b];
    }
  }
}

namespace {

// Runs fn(row_begin, row_end) over [0, n_rows), on n_threads threads when there is enough work.
template <typename Fn>
void for_rows(int64_t n_rows, int n_threads, Fn&& fn) {
  if (n_threads <= 1 || n_rows < 2) {
    fn(int64_t{0}, n_rows);
    return;
  }
  const int threads = static_cast<int>(std::min<int64_t>(n_threads, n_rows));
  ThreadPool pool(threads);
  pool.parallel_for(n_rows, [&](int64_t begin, int64_t end, int) { fn(begin, end); });
}

}  // namespace

void quantize_rows(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row, int n_threads) {
  const int64_t row_bytes = dtype_row_bytes(t, n_per_row);
  for_rows(n_rows, n_threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(t, src + r * n_per_row, static_cast<uint8_t*>(dst) + r * row_bytes, n_per_row);
    }
  });
}

void dequantize_rows(DType t, const void* src, float* dst, int64_t n_rows, int64_t n_per_row, int n_threads) {
  const int64_t row_bytes = dtype_row_bytes(t, n_per_row);
  for_rows(n_rows, n_threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      dequantize_row(t, static_cast<const uint8_t*>(src) + r * row_bytes, dst + r * n_per_row, n_per_row);
    }
  });
}

}  // namespace ds::quant
