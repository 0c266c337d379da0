// vec_dot.h entry points: activation quantization and run-time choice of the dot-product path.
// The choice is made once (first call) from __builtin_cpu_supports and kept in an atomic, so the
// hot calls pay one relaxed load; tests may override it to compare every path on this machine.
#include "ops/cpu/vec_dot.h"

#include <cpuid.h>

#include <atomic>
#include <cstring>
#include <string>

#include "core/check.h"
#include "ops/cpu/vec_dot_internal.h"
#include "quant/blocks.h"
#include "quant/quant_internal.h"

namespace ds::cpu {
namespace {

struct Isa {
  const char* name;
  VecDotFn dot;
  GemmTileFn tile;
};

constexpr Isa kScalar{"scalar", vec_dot_scalar, gemm_tile_scalar};
constexpr Isa kAvx2{"avx2", vec_dot_avx2, gemm_tile_avx2};
constexpr Isa kAvx512{"avx512vnni", vec_dot_avx512, gemm_tile_avx512};

const Isa* best_isa() {
  if (cpu_has_avx512vnni()) return &kAvx512;
  if (cpu_has_avx2()) return &kAvx2;
  return &kScalar;
}

std::atomic<const Isa*> g_isa{nullptr};

const Isa* current_isa() {
  const Isa* isa = g_isa.load(std::memory_order_relaxed);
  if (isa == nullptr) {
    isa = best_isa();
    g_isa.store(isa, std::memory_order_relaxed);
  }
  return isa;
}

// Block size of a supported weight type, 0 for unsupported ones (a switch: vec_dot is called per
// attention position with short rows, where a table lookup would show).
int64_t weight_block_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return 1;
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
      return 32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return 256;
    default:
      return 0;
  }
}

}  // namespace

bool cpu_has_avx2() {
  __builtin_cpu_init();
  // F16C from CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c").
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 29) & 1u);
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

bool cpu_has_avx512vnni() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}

void vec_dot_force_isa(const char* isa) {
  if (isa == nullptr) {
    g_isa.store(best_isa());
    return;
  }
  const std::string name = isa;
  if (name == "scalar") {
    g_isa.store(&kScalar);
  } else if (name == "avx2") {
    DS_CHECK(cpu_has_avx2(), "vec_dot_force_isa: this CPU lacks AVX2");
    g_isa.store(&kAvx2);
  } else if (name == "avx512vnni") {
    DS_CHECK(cpu_has_avx512vnni(), "vec_dot_force_isa: this CPU lacks AVX-512 VNNI");
    g_isa.store(&kAvx512);
  } else {
    DS_CHECK(false, "vec_dot_force_isa: unknown path {}", name);
  }
}

void vec_dot_force_scalar(bool on) { vec_dot_force_isa(on ? "scalar" : nullptr); }

const char* vec_dot_isa() { return current_isa()->name; }

DType vec_dot_act_type(DType weight_type) {
  switch (weight_type) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
      return DType::Q8_0;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return DType::Q8_K;
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return DType::F32;
    default:
      DS_CHECK(false, "vec_dot: unsupported weight type {}", dtype_name(weight_type));
  }
  return DType::F32;
}

int64_t vec_dot_act_row_bytes(DType weight_type, int64_t n) {
  return dtype_row_bytes(vec_dot_act_type(weight_type), n);
}

void vec_dot_quantize_act(DType weight_type, const float* x, void* dst, int64_t n) {
  const DType at = vec_dot_act_type(weight_type);
  const int64_t bs = dtype_block_size(at);
  DS_CHECK(n % bs == 0, "vec_dot_quantize_act: {} elements not a multiple of {}", n, bs);
  switch (at) {
    case DType::Q8_0:
      quant::quantize_row_q8_0(x, static_cast<quant::BlockQ8_0*>(dst), n / bs);
      return;
    case DType::Q8_K:
      quant::quantize_row_q8_k(x, static_cast<quant::BlockQ8_K*>(dst), n / bs);
      return;
    default:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
  }
}

float vec_dot(DType weight_type, int64_t n, const void* w_row, const void* act_row) {
  const int64_t bs = weight_block_size(weight_type);
  DS_CHECK(bs > 0, "vec_dot: unsupported weight type {}", dtype_name(weight_type));
  DS_CHECK(n % bs == 0, "vec_dot: {} elements not a multiple of {} block", n, dtype_name(weight_type));
  return current_isa()->dot(weight_type, n, w_row, act_row);
}

void gemm_tile(DType weight_type, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
               const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride) {
  const int64_t bs = weight_block_size(weight_type);
  DS_CHECK(bs > 0, "gemm_tile: unsupported weight type {}", dtype_name(weight_type));
  DS_CHECK(n % bs == 0, "gemm_tile: {} elements not a multiple of {} block", n, dtype_name(weight_type));
  DS_CHECK(r0 <= r1 && n_tokens >= 0, "gemm_tile: rows [{}, {}) tokens {}", r0, r1, n_tokens);
  if (r0 == r1 || n_tokens == 0) return;
  current_isa()->tile(weight_type, n, w, w_row_bytes, r0, r1, act, act_row_bytes, n_tokens, y, y_stride);
}

}  // namespace ds::cpu
