// Sampler. Candidates are filtered in a fixed order: top-k, then softmax with temperature, then top-p
// (smallest set whose probability reaches p), then min-p (relative to the top probability).
//
// The logits are read in blocks of kBlock; a block's maximum bounds every logit in it, so a threshold
// taken from the block maxima (the k-th largest block maximum is at most the k-th largest logit) finds
// every candidate of a top-k while reading only the blocks that can hold one. The loops over a block
// run on eight-float vectors (the maxima, and the exponentials of the full-vocabulary sums).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "core/check.h"

// F8 values pass between inlined helpers only; the ABI note on 32-byte vectors does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ds {
namespace {

constexpr int64_t kBlock = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Eight floats as one value (GCC / Clang vector extension): one AVX register, or two SSE / NEON ones.
using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));
#define DS_INLINE __attribute__((always_inline)) inline
// The whole-vocabulary passes are compiled twice on x86-64, for AVX2 and for the baseline, and the
// loader picks one for the CPU (GCC function multiversioning). No FMA in either: same bits on both.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DS_VOCAB_PASS __attribute__((target_clones("avx2", "default")))
#else
#define DS_VOCAB_PASS
#endif

DS_INLINE F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
DS_INLINE F8 splat8(float x) { return F8{x, x, x, x, x, x, x, x}; }
DS_INLINE F8 max8(F8 a, F8 b) { return a > b ? a : b; }  // lanewise; a NaN lane of a gives b's

// e^x lanewise for x <= 0: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, the first exact in 9
// bits), e^r by Cephes' expf polynomial, 2^n by the exponent bits. Below -87 (and NaN) clamps to -87.
DS_INLINE F8 exp_neg8(F8 x) {
  x = x > splat8(-87.0f) ? x : splat8(-87.0f);
  const F8 big = splat8(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const F8 n = (x * 1.44269504088896341f + big) - big;
  const F8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  F8 p = splat8(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F8 e = (p * r * r + r) + 1.0f;
  const I8 bits = (__builtin_convertvector(n, I8) + 127) << 23;
  return e * __builtin_bit_cast(F8, bits);
}

// Largest of v[0, n), NaN ignored; -inf when there is none.
DS_INLINE float max_run(const float* v, int64_t n) {
  F8 a0 = splat8(kNegInf), a1 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = max8(load8(v + i), a0);
    a1 = max8(load8(v + i + 8), a1);
  }
  a0 = max8(a0, a1);
  float m = kNegInf;
  for (int j = 0; j < 8; ++j) m = a0[j] > m ? a0[j] : m;
  for (; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// Sum of e^((v[i] - m) / t) over v[0, n) with every v[i] <= m (NaN and -inf count as about 1e-38).
DS_INLINE float exp_sum_run(const float* v, int64_t n, float m, float t) {
  const F8 mm = splat8(m), tt = splat8(t);
  F8 a0 = splat8(0.0f), a1 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 += exp_neg8((load8(v + i) - mm) / tt);
    a1 += exp_neg8((load8(v + i + 8) - mm) / tt);
  }
  a0 += a1;
  float s = 0.0f;
  for (int j = 0; j < 8; ++j) s += a0[j];
  for (; i < n; ++i) s += exp_neg((v[i] - m) / t);
  return s;
}

int64_t n_blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
int64_t block_len(int64_t n, int64_t b) { return std::min(kBlock, n - b * kBlock); }

// out[b] = the largest of block b (never NaN).
DS_VOCAB_PASS void block_maxima(const float* v, int64_t n, float* out) {
  for (int64_t b = 0; b < n_blocks(n); ++b) out[b] = max_run(v + b * kBlock, block_len(n, b));
}

// The first block holding the largest value, and that value; -1 when every value is NaN or -inf.
DS_VOCAB_PASS int64_t best_block(const float* v, int64_t n, float* best) {
  float m = kNegInf;
  int64_t at = -1;
  for (int64_t b = 0; b < n_blocks(n); ++b) {
    const float bm = max_run(v + b * kBlock, block_len(n, b));
    if (bm > m) {
      m = bm;
      at = b;
    }
  }
  *best = m;
  return at;
}

// Sum over blocks [b0, b1) of e^((v - m) / t): float within a block, double across blocks.
DS_VOCAB_PASS double exp_sum(const float* v, int64_t n, int64_t b0, int64_t b1, float m, float t) {
  double z = 0.0;
  for (int64_t b = b0; b < b1; ++b) z += exp_sum_run(v + b * kBlock, block_len(n, b), m, t);
  return z;
}

// The nucleus histogram: buckets of 1 / kHistPerUnit in (max - logit) / t; the last holds the rest
// (and NaN).
constexpr int kHistBuckets = 4096;
constexpr float kHistPerUnit = 64.0f;
DS_INLINE int hist_bucket(float l, float m, float per) {
  const float b = (m - l) * per;
  return b < static_cast<float>(kHistBuckets - 1) ? static_cast<int>(b) : kHistBuckets - 1;
}

// hist[bucket] += e^((l - m) / t) over v[0, n), per = kHistPerUnit / t.
DS_VOCAB_PASS void histogram_pass(const float* v, int64_t n, float m, float t, float per, double* hist) {
  const F8 mm = splat8(m), tt = splat8(t), pp = splat8(per), top = splat8(static_cast<float>(kHistBuckets - 1));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const F8 l = load8(v + i);
    const F8 e = exp_neg8((l - mm) / tt);
    F8 bf = (mm - l) * pp;
    bf = bf < top ? bf : top;
    const I8 b = __builtin_convertvector(bf, I8);
    for (int j = 0; j < 8; ++j) hist[b[j]] += e[j];
  }
  for (; i < n; ++i) hist[hist_bucket(v[i], m, per)] += exp_neg((v[i] - m) / t);
}

bool by_logit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Every logit >= tau into cand (unsorted), reading only the blocks whose maximum reaches tau.
void collect_at_least(std::span<const float> v, const std::vector<float>& bmax, float tau,
                      std::vector<std::pair<float, int32_t>>& cand) {
  const int64_t n = static_cast<int64_t>(v.size());
  cand.clear();
  for (int64_t b = 0; b < n_blocks(n); ++b) {
    if (!(bmax[static_cast<size_t>(b)] >= tau)) continue;
    const int64_t i0 = b * kBlock, i1 = i0 + block_len(n, b);
    for (int64_t i = i0; i < i1; ++i) {
      if (v[static_cast<size_t>(i)] >= tau) cand.emplace_back(v[static_cast<size_t>(i)], static_cast<int32_t>(i));
    }
  }
}

// The k best logits (logit desc, id asc) into cand, sorted; fewer when fewer are not NaN.
void select_top(std::span<const float> v, const std::vector<float>& bmax, size_t k,
                std::vector<std::pair<float, int32_t>>& cand, std::vector<float>& scratch) {
  float tau = kNegInf;  // k > blocks: every logit but NaN
  if (k <= bmax.size()) {
    scratch.assign(bmax.begin(), bmax.end());  // block maxima are never NaN
    std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch.end(),
                     std::greater<float>());
    tau = scratch[k - 1];
  }
  collect_at_least(v, bmax, tau, cand);
  k = std::min(k, cand.size());
  const auto kth = cand.begin() + static_cast<std::ptrdiff_t>(k);
  if (kth != cand.end()) std::nth_element(cand.begin(), kth, cand.end(), by_logit);
  cand.resize(k);
  std::sort(cand.begin(), cand.end(), by_logit);
}

}  // namespace

float exp_neg(float x) { return exp_neg8(splat8(x))[0]; }

int32_t argmax(std::span<const float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  float m = kNegInf;
  const int64_t b = best_block(values.data(), n, &m);
  if (b < 0) return 0;
  for (int64_t i = b * kBlock; i < b * kBlock + block_len(n, b); ++i) {
    if (values[static_cast<size_t>(i)] == m) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(b * kBlock);  // unreachable: m is one of the block's values
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

std::span<const float> Sampler::penalize(std::span<const float> logits, std::span<const int32_t> prompt,
                                         std::span<const int32_t> generated) {
  const bool repetition = params_.repetition_penalty != 1.0f;
  const bool presence = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (!repetition && !presence) return logits;
  const int32_t n_vocab = static_cast<int32_t>(logits.size());
  work_.assign(logits.begin(), logits.end());
  if (counts_.size() != logits.size()) counts_.assign(logits.size(), 0);  // zero between calls
  const auto valid = [&](int32_t id) { return id >= 0 && id < n_vocab; };

  if (repetition) {
    // Each distinct token of prompt and generation is penalized once.
    if (prompt_seen_.size() != prompt.size() || !std::equal(prompt.begin(), prompt.end(), prompt_seen_.begin())) {
      prompt_seen_.assign(prompt.begin(), prompt.end());
      prompt_distinct_.clear();
      for (int32_t id : prompt) {
        if (valid(id) && counts_[id] == 0) {
          counts_[id] = 1;
          prompt_distinct_.push_back(id);
        }
      }
      for (int32_t id : prompt_distinct_) counts_[id] = 0;
    }
    const float p = params_.repetition_penalty;
    const auto penalize_once = [&](int32_t id) {
      if (!valid(id) || counts_[id] != 0) return;
      counts_[id] = 1;
      touched_.push_back(id);
      work_[id] = work_[id] > 0 ? work_[id] / p : work_[id] * p;
    };
    for (int32_t id : prompt_distinct_) penalize_once(id);
    for (int32_t id : generated) penalize_once(id);
    for (int32_t id : touched_) counts_[id] = 0;
    touched_.clear();
  }
  if (presence) {
    for (int32_t id : generated) {
      if (!valid(id)) continue;
      if (counts_[id]++ == 0) touched_.push_back(id);
    }
    for (int32_t id : touched_) {
      work_[id] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(counts_[id]);
      counts_[id] = 0;
    }
    touched_.clear();
  }
  return work_;
}

int32_t Sampler::draw(double total) {
  std::uniform_real_distribution<double> uniform(0.0, total);
  const double r = uniform(rng_);
  double acc = 0;
  for (const auto& c : cand_) {
    acc += c.first;
    if (r < acc) return c.second;
  }
  return cand_.back().second;
}

// The top-p nucleus of a flat distribution: the smallest set of best logits (logit desc, id asc) whose
// probability e^((l - m) / t) / z reaches top_p, into cand_ as (probability, id) in id order. A
// histogram of the probabilities over buckets of 1/64 in (m - l) / t (the last bucket holds the rest)
// finds the bucket where the cumulative sum crosses top_p z; that bucket's logits are sorted to find
// the last member, and a pass collects every member.
void Sampler::nucleus_by_histogram(std::span<const float> v, float m, float t, double z) {
  const int64_t n = static_cast<int64_t>(v.size());
  const float per = kHistPerUnit / t;
  hist_.assign(kHistBuckets, 0.0);
  histogram_pass(v.data(), n, m, t, per, hist_.data());
  const double target = static_cast<double>(params_.top_p) * z;
  double acc = 0;
  int b = 0;
  while (b < kHistBuckets - 1 && acc + hist_[static_cast<size_t>(b)] < target) acc += hist_[static_cast<size_t>(b++)];
  // The crossing bucket's logits, sorted; the sum runs on from the buckets before it (and on into the
  // next buckets, should rounding leave it short).
  std::pair<float, int32_t> last{m, 0};
  for (bool found = false; !found && b < kHistBuckets; ++b) {
    cand_.clear();
    for (int64_t i = 0; i < n; ++i) {
      const float l = v[static_cast<size_t>(i)];
      if (l == l && hist_bucket(l, m, per) == b) cand_.emplace_back(l, static_cast<int32_t>(i));
    }
    std::sort(cand_.begin(), cand_.end(), by_logit);
    for (const auto& c : cand_) {
      last = c;
      acc += exp_neg((c.first - m) / t);
      if (acc >= target) {
        found = true;
        break;
      }
    }
  }
  // Members: every logit above the last one's, and its ties up to its id.
  cand_.clear();
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    float l[8], e[8];
    const int w = static_cast<int>(std::min<int64_t>(8, n - i0));
    for (int j = 0; j < 8; ++j) l[j] = j < w ? v[static_cast<size_t>(i0 + j)] : kNegInf;
    const F8 ev = exp_neg8((load8(l) - splat8(m)) / splat8(t));
    std::memcpy(e, &ev, sizeof(e));
    for (int j = 0; j < w; ++j) {
      const int32_t id = static_cast<int32_t>(i0 + j);
      if (l[j] > last.first || (l[j] == last.first && id <= last.second)) {
        cand_.emplace_back(static_cast<float>(e[j] / z), id);
      }
    }
  }
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated) {
  const std::span<const float> v = penalize(logits, prompt, generated);
  if (params_.temperature <= 0.0f) return argmax(v);
  const size_t n = v.size();
  const float t = params_.temperature;
  block_max_.resize(static_cast<size_t>(n_blocks(static_cast<int64_t>(n))));
  block_maxima(v.data(), static_cast<int64_t>(n), block_max_.data());
  float m = kNegInf;  // the largest logit
  for (float b : block_max_) m = b > m ? b : m;
  if (!(m > kNegInf)) return argmax(v);  // nothing to sample from

  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    // Candidates truncated to top-k, softmax with temperature over them (max-subtracted).
    select_top(v, block_max_, static_cast<size_t>(params_.top_k), cand_, scratch_);
    softmax_sorted();
  } else if (params_.top_p < 1.0f) {
    // Every token is a candidate: the normalizer over the whole vocabulary, then the nucleus. A peaked
    // distribution's nucleus is within the best 256 logits, found and sorted as top-k's; a flat one's
    // may be 10^5 tokens, found by a histogram of the probabilities (nucleus_by_histogram).
    const double z = exp_sum(v.data(), static_cast<int64_t>(n), 0, n_blocks(static_cast<int64_t>(n)), m, t);
    select_top(v, block_max_, std::min<size_t>(256, n), cand_, scratch_);
    double acc = 0;
    size_t keep = 0;
    for (size_t i = 0; i < cand_.size() && keep == 0; ++i) {
      cand_[i].first = static_cast<float>(std::exp((cand_[i].first - m) / t) / z);
      acc += cand_[i].first;
      if (acc >= params_.top_p) keep = i + 1;
    }
    if (keep > 0) {
      cand_.resize(keep);
    } else {
      nucleus_by_histogram(v, m, t, z);
      // min-p relative to the top probability, 1 / z: e >= min_p, in place (id order).
      double total = 0;
      size_t w = 0;
      for (const auto& c : cand_) {
        if (params_.min_p > 0.0f && !(c.first * z >= params_.min_p)) continue;
        cand_[w++] = c;
        total += c.first;
      }
      cand_.resize(w);
      return draw(total);
    }
  } else if (params_.min_p > 0.0f) {
    // p / p_max = e^((logit - max) / t) >= min_p: a threshold on the logits, below the exact one by
    // a margin, then the rule on each candidate. The draw walks them in id order: no sort.
    const float tau = m + t * std::log(params_.min_p);
    collect_at_least(v, block_max_, tau - 1e-3f * (1.0f + std::fabs(tau)), cand_);
    double total = 0;
    size_t w = 0;
    for (const auto& c : cand_) {
      const float e = std::exp((c.first - m) / t);  // p / p_max
      if (!(e >= params_.min_p)) continue;
      cand_[w++] = {e, c.second};
      total += e;
    }
    cand_.resize(w);
    return draw(total);
  } else {
    // Plain temperature: every token by its probability, walked in id order, block sums first.
    const double z = exp_sum(v.data(), static_cast<int64_t>(n), 0, n_blocks(static_cast<int64_t>(n)), m, t);
    std::uniform_real_distribution<double> uniform(0.0, z);
    const double r = uniform(rng_);
    const int64_t nn = static_cast<int64_t>(n);
    double acc = 0;
    int32_t last = 0;  // the last token of nonzero probability passed
    for (int64_t b = 0; b < n_blocks(nn); ++b) {
      const float* vb = v.data() + b * kBlock;
      const double s = exp_sum(v.data(), nn, b, b + 1, m, t);
      if (r >= acc + s) {
        acc += s;
        continue;
      }
      for (int64_t i = 0; i < block_len(nn, b); ++i) {
        const float e = exp_neg((vb[i] - m) / t);
        if (!(vb[i] >= m - 87.0f * t)) continue;  // NaN or far below: no probability
        last = static_cast<int32_t>(b * kBlock + i);
        acc += e;
        if (r < acc) return last;
      }
    }
    return last;  // rounding between the block sum and the walk
  }

  return finish_sorted();
}

void Sampler::softmax_sorted() {
  const float max_logit = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) {
    c.first = std::exp((c.first - max_logit) / params_.temperature);
    sum += c.first;
  }
  for (auto& c : cand_) c.first = static_cast<float>(c.first / sum);
}

int32_t Sampler::finish_sorted() {
  if (params_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      acc += cand_[i].first;
      if (acc >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
  }
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * cand_[0].first;
    size_t keep = 1;
    while (keep < cand_.size() && cand_[keep].first >= threshold) ++keep;
    cand_.resize(keep);
  }
  double total = 0;
  for (const auto& c : cand_) total += c.first;
  return draw(total);
}

int32_t Sampler::top_k_needed(int32_t limit) const {
  if (params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    return 0;
  }
  if (params_.temperature <= 0.0f) return 1;
  return params_.top_k > 0 && params_.top_k <= limit ? params_.top_k : 0;
}

int32_t Sampler::sample_top(const TopKResult& best) {
  const int32_t n = std::min(best.n, kTopKMax);
  DS_CHECK(n >= 1 && top_k_needed(kTopKMax) > 0, "sample_top: {} best logits for a sampler that needs {}", best.n,
           top_k_needed(kTopKMax));
  if (params_.temperature <= 0.0f) return best.ids[0];
  const int32_t k = std::min(n, params_.top_k);
  cand_.resize(static_cast<size_t>(k));
  for (int32_t i = 0; i < k; ++i) cand_[static_cast<size_t>(i)] = {best.values[i], best.ids[i]};
  softmax_sorted();
  return finish_sorted();
}

}  // namespace ds
