// Token sampling from logits: penalties, then greedy (temperature 0) or temperature / top-k / top-p /
// min-p sampling with a seeded generator. Deterministic: same params, seed and logits -> same tokens.
//
// The vocabulary is large (248320 for Qwen3.5/3.6) and a decode step short (about 2 ms for the
// 35B-A3B on an H100), so no path copies, sorts or exponentiates the whole vocabulary when it need
// not: greedy is a blocked maximum over the logits in place; the candidates of a filter come from a
// threshold found on the maxima of 128-logit blocks, and only they are sorted. Only top-p without top-k
// and plain temperature sampling read every logit's probability (one pass, `exp_neg`). Penalties copy
// the logits once (they change some of them); the prompt's distinct ids are kept between calls while
// the prompt is unchanged. bench/sampler_bench.cpp times each path.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "ops/top_k.h"

namespace ds {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token. `prompt` and `generated` feed the penalties: the repetition penalty applies
  // to tokens of both; presence and frequency penalties to generated tokens only (as OpenAI-style
  // servers do). Greedy ties resolve to the lowest id; NaN logits are never picked unless all are.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> prompt,
                 std::span<const int32_t> generated);

  // How many of the best logits decide the next token, at most `limit`: 1 for greedy, top_k for top-k
  // sampling; 0 when the sampler needs every logit (penalties; top-k off or above the limit). A model
  // step can then return only those (SequenceState::set_want_top_k).
  int32_t top_k_needed(int32_t limit) const;
  // Picks the next token from a step's best logits (value desc, id asc; best.n >= 1 and at least
  // top_k_needed of them, or every logit that is not NaN): the same token sample() gives on the whole
  // row for the same seed.
  int32_t sample_top(const TopKResult& best);

  const SamplingParams& params() const { return params_; }

 private:
  using Cand = std::pair<float, int32_t>;  // (logit, then probability; id)
  std::span<const float> penalize(std::span<const float> logits, std::span<const int32_t> prompt,
                                  std::span<const int32_t> generated);
  int32_t draw(double total);
  void softmax_sorted();    // cand_'s logits (sorted) -> probabilities with temperature
  int32_t finish_sorted();  // top-p, min-p over cand_'s sorted probabilities, then the draw
  void nucleus_by_histogram(std::span<const float> logits, float max_logit, float t, double z);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;                 // penalized logits
  std::vector<float> block_max_;            // maxima of the logits' blocks
  std::vector<float> scratch_;              // block maxima, reordered to find a threshold
  std::vector<double> hist_;                // probability mass by bucket of (max - logit) / t
  std::vector<Cand> cand_;                  // sorted candidates (logit desc, id asc)
  std::vector<int32_t> counts_;             // per-id marks and counts for the penalties, zero between calls
  std::vector<int32_t> touched_;            // ids whose counts_ are set
  std::vector<int32_t> prompt_seen_;        // the prompt of the last call ...
  std::vector<int32_t> prompt_distinct_;    // ... and its distinct valid ids
};

// Index of the largest value (lowest index on ties; NaN ignored; 0 when every value is NaN).
int32_t argmax(std::span<const float> values);

// e^x for x <= 0 (x below -87 and NaN give about 1e-38), within about 2 ulp of std::exp, in a form the
// compiler vectorizes: the full-vocabulary sums of the top-p and temperature paths.
float exp_neg(float x);

}  // namespace ds
