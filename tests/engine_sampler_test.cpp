// Sampler tests: greedy, penalties, filters and determinism, checked against distributions computed
// independently in the test.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"

namespace ds {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits, {}, {}), 1);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  // Token 0 (logit 3) seen in the prompt -> 1.5 < token 1 (2.0).
  std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  std::vector<int32_t> prompt = {0, 0};
  EXPECT_EQ(s.sample(logits, prompt, {}), 1);
  // Negative logits get more negative: token 2 at -1 -> -2 stays below token 1.
  std::vector<float> l2 = {-3.0f, -1.5f, -1.0f};
  std::vector<int32_t> gen = {2};
  EXPECT_EQ(s.sample(l2, {}, gen), 1);
}

TEST(Sampler, FrequencyPenaltyScalesWithCount) {
  SamplingParams p;
  p.frequency_penalty = 0.6f;
  Sampler s(p);
  std::vector<float> logits = {2.0f, 1.0f};
  std::vector<int32_t> once = {0};
  EXPECT_EQ(s.sample(logits, {}, once), 0);  // 2.0 - 0.6 = 1.4 > 1.0
  std::vector<int32_t> twice = {0, 0};
  EXPECT_EQ(s.sample(logits, {}, twice), 1);  // 2.0 - 1.2 = 0.8 < 1.0
  // Prompt tokens do not count for frequency/presence.
  EXPECT_EQ(s.sample(logits, twice, {}), 0);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f) * 3;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, {}, {}), b.sample(logits, {}, {}));
}

TEST(Sampler, TemperatureSamplingMatchesSoftmax) {
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 7;
  Sampler s(p);
  std::vector<float> logits = {1.0f, 0.5f, 0.0f};
  std::vector<double> expect(3);
  double z = 0;
  for (int i = 0; i < 3; ++i) z += expect[i] = std::exp(logits[i] / 0.5);
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[s.sample(logits, {}, {})]++;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(counts[i] / double(n), expect[i] / z, 0.015) << i;
}

TEST(Sampler, TopKTopPMinPRestrictCandidates) {
  std::vector<float> logits = {3.0f, 2.9f, 1.0f, 0.0f, -5.0f};
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 2;
    Sampler s(p);
    for (int i = 0; i < 500; ++i) EXPECT_LT(s.sample(logits, {}, {}), 2);
  }
  {
    // probs ~ [0.47, 0.43, 0.06, 0.02, ...]: top_p 0.8 keeps the first two.
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_p = 0.8f;
    Sampler s(p);
    for (int i = 0; i < 500; ++i) EXPECT_LT(s.sample(logits, {}, {}), 2);
  }
  {
    SamplingParams p;
    p.temperature = 1.0f;
    p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: ids 0 and 1
    Sampler s(p);
    std::map<int, int> seen;
    for (int i = 0; i < 500; ++i) seen[s.sample(logits, {}, {})]++;
    EXPECT_EQ(seen.size(), 2u);
    EXPECT_GT(seen[0], 0);
    EXPECT_GT(seen[1], 0);
  }
}

}  // namespace
}  // namespace ds
