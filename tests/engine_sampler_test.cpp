// Sampler tests: greedy, penalties, filters and determinism, checked against distributions computed
// independently in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

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

// ---- the vocabulary-sized paths against a plain reference ----

constexpr int32_t kVocab = 248320 + 77;  // Qwen3.5/3.6's vocabulary, and a partial last block

// A model-like row: a peaked head of `head` tokens, a normal body, reproducible.
std::vector<float> vocab_logits(uint32_t seed, int head) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> body(0.0f, 2.0f);
  std::vector<float> v(kVocab);
  for (float& x : v) x = body(rng);
  for (int i = 0; i < head; ++i) v[(static_cast<int64_t>(i) * 104729 + seed) % kVocab] = 16.0f - 0.25f * i;
  return v;
}

int32_t scan_argmax(const std::vector<float>& v) {
  int32_t best = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(v.size()); ++i) {
    if (!std::isnan(v[i]) && (best < 0 || v[i] > v[best])) best = i;
  }
  return best < 0 ? 0 : best;
}

TEST(Sampler, ArgmaxMatchesAScanOverTheVocabulary) {
  std::vector<float> v = vocab_logits(1, 0);
  EXPECT_EQ(argmax(v), scan_argmax(v));
  v[200001] = 30.0f;  // ties: the lowest id wins, wherever the blocks fall
  v[200000 + 128] = 30.0f;
  v[kVocab - 1] = 30.0f;
  EXPECT_EQ(argmax(v), 200001);
  v[5] = 30.0f;
  EXPECT_EQ(argmax(v), 5);
  v[0] = std::numeric_limits<float>::quiet_NaN();  // NaN never wins
  v[6] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(argmax(v), 5);
  v[kVocab - 1] = 31.0f;  // the partial last block
  EXPECT_EQ(argmax(v), kVocab - 1);
  v.assign(1000, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(argmax(v), 0);
  v.assign(1000, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(argmax(v), 0);
  v[999] = -1e30f;
  EXPECT_EQ(argmax(v), 999);
  EXPECT_EQ(argmax(std::vector<float>{}), 0);
}

TEST(Sampler, ExpNegIsCloseToExp) {
  double worst = 0;
  for (int i = 0; i <= 870000; ++i) {
    const float x = -static_cast<float>(i) * 1e-4f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(exp_neg(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // about 2 ulp
  EXPECT_LT(exp_neg(-std::numeric_limits<float>::infinity()), 2e-38f);
  EXPECT_LT(exp_neg(std::numeric_limits<float>::quiet_NaN()), 2e-38f);
  EXPECT_GE(exp_neg(-std::numeric_limits<float>::infinity()), 0.0f);
}

// The sampler as first written: penalties on a copy, every token sorted, softmax over the candidates,
// top-p, min-p, one uniform draw walked in sorted order. Returns the kept candidates (probability, id).
std::vector<std::pair<double, int32_t>> reference_candidates(const std::vector<float>& logits,
                                                             const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> cand(logits.size());
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) cand[i] = {logits[i], i};
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size()) cand.resize(p.top_k);
  std::vector<std::pair<double, int32_t>> out;
  double sum = 0;
  for (const auto& c : cand) {
    out.emplace_back(std::exp((c.first - cand[0].first) / p.temperature), c.second);
    sum += out.back().first;
  }
  for (auto& c : out) c.first /= sum;
  if (p.top_p < 1.0f) {
    double acc = 0;
    size_t keep = out.size();
    for (size_t i = 0; i < out.size(); ++i) {
      acc += out[i].first;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    out.resize(keep);
  }
  if (p.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < out.size() && out[keep].first >= p.min_p * out[0].first) ++keep;
    out.resize(keep);
  }
  return out;
}

// Draws n tokens and checks each against the reference candidates: every token is one of them, and
// each candidate's frequency is within `tol` of its share of their probability (the candidates past
// the first 12 counted as one bucket).
void expect_reference_distribution(const std::vector<float>& logits, SamplingParams p, int n, double tol) {
  const auto ref = reference_candidates(logits, p);
  ASSERT_FALSE(ref.empty());
  double total = 0;
  for (const auto& c : ref) total += c.first;
  std::map<int32_t, size_t> rank;
  for (size_t i = 0; i < ref.size(); ++i) rank[ref[i].second] = std::min<size_t>(i, 12);
  std::vector<double> want(13, 0.0), got(13, 0.0);
  for (const auto& c : ref) want[rank[c.second]] += c.first / total;
  Sampler s(p);
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits, {}, {});
    const auto it = rank.find(t);
    ASSERT_NE(it, rank.end()) << "token " << t << " is not a candidate (logit " << logits[t] << ")";
    got[it->second] += 1.0 / n;
  }
  for (int r = 0; r < 13; ++r) EXPECT_NEAR(got[r], want[r], tol) << "candidate rank " << r;
}

TEST(Sampler, TopKPathDrawsTheReferenceTokens) {
  // Top-k candidates carry the reference's arithmetic, so one seed gives the reference's tokens.
  const std::vector<float> logits = vocab_logits(2, 30);
  for (const SamplingParams& p : {SamplingParams{.temperature = 1.0f, .top_k = 20, .top_p = 0.95f, .seed = 3},
                                  SamplingParams{.temperature = 0.6f, .top_k = 40, .min_p = 0.01f, .seed = 4},
                                  SamplingParams{.temperature = 1.5f, .top_k = 5000, .seed = 5}}) {
    const auto ref = reference_candidates(logits, p);
    std::mt19937_64 rng(p.seed);
    Sampler s(p);
    for (int i = 0; i < 200; ++i) {
      double total = 0;
      for (const auto& c : ref) total += c.first;
      const double r = std::uniform_real_distribution<double>(0.0, total)(rng);
      double acc = 0;
      int32_t want = ref.back().second;
      for (const auto& c : ref) {
        acc += c.first;
        if (r < acc) {
          want = c.second;
          break;
        }
      }
      ASSERT_EQ(s.sample(logits, {}, {}), want) << "draw " << i << ", top_k " << p.top_k;
    }
  }
}

TEST(Sampler, TopPWithoutTopKMatchesTheReference) {
  expect_reference_distribution(vocab_logits(3, 30), {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .seed = 1},
                                5000, 0.025);
  // A flat row: the nucleus is thousands of tokens (the growing candidate sets).
  std::vector<float> flat = vocab_logits(4, 0);
  expect_reference_distribution(flat, {.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .seed = 2}, 300, 0.08);
}

TEST(Sampler, LargeNucleusEndsWithinTiesByIdAsTheReference) {
  // 3000 tokens tie at the top (ids spread over the vocabulary), the rest far below: top_p 0.5 keeps
  // the tied tokens of the 1500 lowest ids (the reference's order), found by the histogram path.
  std::vector<float> logits(kVocab, -60.0f);
  std::vector<int32_t> tied;
  for (int i = 0; i < 3000; ++i) tied.push_back(static_cast<int32_t>((static_cast<int64_t>(i) * 82613) % kVocab));
  for (int32_t id : tied) logits[id] = 1.0f;
  std::sort(tied.begin(), tied.end());
  const SamplingParams p{.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .seed = 5};
  const auto ref = reference_candidates(logits, p);
  ASSERT_GE(ref.size(), 1500u);
  ASSERT_LE(ref.size(), 1501u);
  const std::set<int32_t> members(tied.begin(), tied.begin() + static_cast<std::ptrdiff_t>(ref.size()));
  for (const auto& c : ref) ASSERT_TRUE(members.count(c.second)) << c.second;
  Sampler s(p);
  int32_t highest = -1;
  for (int i = 0; i < 1000; ++i) {
    const int32_t t = s.sample(logits, {}, {});
    ASSERT_TRUE(members.count(t)) << "token " << t << " is outside the nucleus";
    highest = std::max(highest, t);
  }
  EXPECT_GE(highest, tied[1400]);  // the nucleus is not cut short
}

TEST(Sampler, MinPWithoutTopKMatchesTheReference) {
  expect_reference_distribution(vocab_logits(5, 30), {.temperature = 1.0f, .top_k = 0, .min_p = 0.05f, .seed = 1},
                                5000, 0.025);
}

TEST(Sampler, PlainTemperatureMatchesTheReference) {
  expect_reference_distribution(vocab_logits(6, 12), {.temperature = 1.0f, .top_k = 0, .seed = 1}, 5000, 0.025);
  // Every token of a flat row is possible: the draws spread over the body.
  const std::vector<float> flat = vocab_logits(7, 0);
  Sampler s({.temperature = 1.0f, .top_k = 0, .seed = 9});
  std::set<int32_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const int32_t t = s.sample(flat, {}, {});
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kVocab);
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 500u);
}

TEST(Sampler, NaNLogitsAreNeverSampled) {
  std::vector<float> logits = vocab_logits(8, 4);
  for (int i = 0; i < kVocab; i += 3) logits[i] = std::numeric_limits<float>::quiet_NaN();
  for (const SamplingParams& p : {SamplingParams{.temperature = 1.0f, .top_k = 20, .seed = 1},
                                  SamplingParams{.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .seed = 1},
                                  SamplingParams{.temperature = 1.0f, .top_k = 0, .min_p = 0.1f, .seed = 1},
                                  SamplingParams{.temperature = 1.0f, .top_k = 0, .seed = 1}}) {
    Sampler s(p);
    for (int i = 0; i < 300; ++i) {
      const int32_t t = s.sample(logits, {}, {});
      ASSERT_FALSE(std::isnan(logits[t])) << "token " << t << ", top_k " << p.top_k;
    }
  }
}

TEST(Sampler, BestLogitsGiveTheTokensOfTheWholeRow) {
  // What a CUDA decode step returns instead of the row: its kTopKMax best logits.
  std::vector<float> logits = vocab_logits(12, 30);
  for (int i = 0; i < 10; ++i) logits[(i * 7717) % kVocab] = 15.0f;  // ties at the head, by id
  std::vector<std::pair<float, int32_t>> all;
  for (int32_t i = 0; i < kVocab; ++i) all.emplace_back(logits[i], i);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  TopKResult best;
  best.n = kTopKMax;
  for (int i = 0; i < kTopKMax; ++i) {
    best.values[i] = all[i].first;
    best.ids[i] = all[i].second;
  }
  for (const SamplingParams& p : {SamplingParams{.temperature = 0.0f, .seed = 1},
                                  SamplingParams{.temperature = 1.0f, .top_k = 20, .top_p = 0.95f, .seed = 2},
                                  SamplingParams{.temperature = 0.7f, .top_k = 64, .min_p = 0.02f, .seed = 3},
                                  SamplingParams{.temperature = 1.2f, .top_k = 5, .seed = 4}}) {
    Sampler whole(p), top(p);
    ASSERT_GT(top.top_k_needed(kTopKMax), 0);
    for (int i = 0; i < 300; ++i) {
      ASSERT_EQ(top.sample_top(best), whole.sample(logits, {}, {})) << "draw " << i << ", top_k " << p.top_k;
    }
  }
  // Fewer best logits than top-k (the rest NaN): the same as the row.
  std::vector<float> few(kVocab, std::numeric_limits<float>::quiet_NaN());
  few[3] = 1.0f;
  few[70000] = 2.0f;
  TopKResult two;
  two.n = 2;
  two.values[0] = 2.0f;
  two.ids[0] = 70000;
  two.values[1] = 1.0f;
  two.ids[1] = 3;
  Sampler a({.temperature = 1.0f, .top_k = 20, .seed = 5}), b({.temperature = 1.0f, .top_k = 20, .seed = 5});
  for (int i = 0; i < 50; ++i) ASSERT_EQ(a.sample_top(two), b.sample(few, {}, {}));
}

TEST(Sampler, TopKNeededSaysWhenTheBestLogitsSuffice) {
  EXPECT_EQ(Sampler({}).top_k_needed(64), 1);                                       // greedy
  EXPECT_EQ(Sampler({.temperature = 1.0f, .top_k = 20}).top_k_needed(64), 20);
  EXPECT_EQ(Sampler({.temperature = 1.0f, .top_k = 64}).top_k_needed(64), 64);
  EXPECT_EQ(Sampler({.temperature = 1.0f, .top_k = 65}).top_k_needed(64), 0);        // above the limit
  EXPECT_EQ(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 0.9f}).top_k_needed(64), 0);
  EXPECT_EQ(Sampler({.temperature = 0.0f, .repetition_penalty = 1.1f}).top_k_needed(64), 0);  // penalties
  EXPECT_EQ(Sampler({.temperature = 1.0f, .top_k = 20, .presence_penalty = 0.5f}).top_k_needed(64), 0);
}

TEST(Sampler, RepetitionPenaltyFollowsAChangedPrompt) {
  // The prompt's distinct ids are kept between calls; another prompt of the same size replaces them.
  SamplingParams p;
  p.repetition_penalty = 4.0f;
  Sampler s(p);
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0}, {}), 1);  // 0.75, 2, 1
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0}, {}), 1);
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{1}, {}), 0);  // 3, 0.5, 1
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 1}, {}), 2);
  EXPECT_EQ(s.sample(logits, {}, {}), 0);
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{7, -1}, {}), 0);  // ids outside the vocabulary: ignored
}

}  // namespace
}  // namespace ds
