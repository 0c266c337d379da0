// Token sampling from logits: penalties, then greedy (temperature 0) or temperature / top-k / top-p /
// min-p sampling with a seeded generator. Deterministic: same params, seed and logits -> same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace ds {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token. `prompt` and `generated` feed the penalties: the repetition penalty applies
  // to tokens of both; presence and frequency penalties to generated tokens only (as OpenAI-style
  // servers do). Greedy ties resolve to the lowest id.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> prompt,
                 std::span<const int32_t> generated);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;                       // penalized logits
  std::vector<std::pair<float, int32_t>> cand_;   // (logit or prob, id)
  std::vector<int32_t> counts_;                   // generated-token counts for penalties
};

// Index of the largest value (lowest index on ties).
int32_t argmax(std::span<const float> values);

}  // namespace ds
