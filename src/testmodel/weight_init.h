// Deterministic random weights for test models. Every row of every tensor has its own counter-based
// generator, seeded from (seed, tensor name, row index), so the values do not depend on how rows are
// split across threads. Normal variates use the Irwin-Hall sum of four uniforms (mean 0, variance 1,
// bounded by +-2*sqrt(3)): no transcendental per element, which keeps multi-GB generation fast, and
// no outliers that would make quantized test weights unusually lossy.
#pragma once

#include <cstdint>
#include <string_view>

namespace ds::testmodel {

enum class InitKind {
  kNormal,   // scale * N(0, 1)
  kUniform,  // offset + scale * U(-1, 1)
  kSsmA,     // -exp(A_log), A_log ~ U(log 1, log 16): the stored ssm_a of a gated delta net
};

struct WeightInit {
  InitKind kind = InitKind::kNormal;
  float scale = 1.0f;
  float offset = 0.0f;
};

// 64-bit hash of a tensor name (part of every row's seed).
uint64_t weight_init_name_hash(std::string_view name);

// Writes the n values of row `row` of the tensor whose name hashes to name_hash.
void weight_init_row(uint64_t seed, uint64_t name_hash, const WeightInit& init, int64_t row, float* dst, int64_t n);

// The raw 64-bit stream of a row (seeded like weight_init_row), for choices other than values.
class RowRng {
 public:
  RowRng(uint64_t seed, uint64_t name_hash, int64_t row);
  uint64_t next();

 private:
  uint64_t state_;
};

}  // namespace ds::testmodel
