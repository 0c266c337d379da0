// Row generators for test weights: splitmix64 streams (one per row) turned into uniform and
// approximately normal floats.
#include "testmodel/weight_init.h"

#include <cmath>

#include <xxhash.h>

namespace ds::testmodel {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One splitmix64 step: advances the state and returns the next output.
inline uint64_t splitmix64_next(uint64_t& state) {
  state += kGolden;
  return splitmix64_mix(state);
}

// Sum of the four 16-bit lanes of x, each as a uniform in (0, 1), centred and scaled to variance 1.
inline float irwin_hall4(uint64_t x) {
  constexpr float kInv = 1.0f / 65536.0f;
  constexpr float kSqrt3 = 1.7320508075688772f;
  const float s = static_cast<float>(x & 0xffff) + static_cast<float>((x >> 16) & 0xffff) +
                  static_cast<float>((x >> 32) & 0xffff) + static_cast<float>(x >> 48) + 2.0f;  // +4 * 0.5
  return (s * kInv - 2.0f) * kSqrt3;
}

// Uniform in (-1, 1) from the top 24 bits.
inline float uniform_pm1(uint64_t x) {
  return (static_cast<float>(x >> 40) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
}

}  // namespace

uint64_t weight_init_name_hash(std::string_view name) { return XXH64(name.data(), name.size(), 0); }

namespace {
uint64_t row_state(uint64_t seed, uint64_t name_hash, int64_t row) {
  return splitmix64_mix(splitmix64_mix(seed * kGolden ^ name_hash) + static_cast<uint64_t>(row) * kGolden);
}
}  // namespace

RowRng::RowRng(uint64_t seed, uint64_t name_hash, int64_t row) : state_(row_state(seed, name_hash, row)) {}
uint64_t RowRng::next() { return splitmix64_next(state_); }

void weight_init_row(uint64_t seed, uint64_t name_hash, const WeightInit& init, int64_t row, float* dst, int64_t n) {
  uint64_t state = row_state(seed, name_hash, row);
  switch (init.kind) {
    case InitKind::kNormal:
      for (int64_t i = 0; i < n; ++i) dst[i] = init.scale * irwin_hall4(splitmix64_next(state));
      break;
    case InitKind::kUniform:
      for (int64_t i = 0; i < n; ++i) dst[i] = init.offset + init.scale * uniform_pm1(splitmix64_next(state));
      break;
    case InitKind::kSsmA: {
      const float log16 = std::log(16.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float u = 0.5f * (uniform_pm1(splitmix64_next(state)) + 1.0f);  // (0, 1)
        dst[i] = -std::exp(u * log16);
      }
      break;
    }
  }
}

}  // namespace ds::testmodel
