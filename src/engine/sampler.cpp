// Sampler. Candidates are filtered in a fixed order: top-k, then softmax with temperature, then top-p
// (smallest set whose probability reaches p), then min-p (relative to the top probability).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace ds {

int32_t argmax(std::span<const float> values) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(values.size()); ++i) {
    if (values[i] > values[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated) {
  const int32_t n_vocab = static_cast<int32_t>(logits.size());
  work_.assign(logits.begin(), logits.end());

  // Penalties.
  if (params_.repetition_penalty != 1.0f) {
    const float p = params_.repetition_penalty;
    auto penalize = [&](int32_t id) {
      if (id < 0 || id >= n_vocab) return;
      // Each distinct token is penalized once: mark it by NaN-free sentinel via counts_.
      if (counts_[id] & 1) return;
      counts_[id] |= 1;
      work_[id] = work_[id] > 0 ? work_[id] / p : work_[id] * p;
    };
    counts_.assign(n_vocab, 0);
    for (int32_t id : prompt) penalize(id);
    for (int32_t id : generated) penalize(id);
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    counts_.assign(n_vocab, 0);
    for (int32_t id : generated) {
      if (id >= 0 && id < n_vocab) counts_[id]++;
    }
    for (int32_t id = 0; id < n_vocab; ++id) {
      if (counts_[id] > 0) {
        work_[id] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(counts_[id]);
      }
    }
  }

  if (params_.temperature <= 0.0f) return argmax(work_);

  // Candidates sorted by logit (descending, ties by id), truncated to top-k.
  cand_.resize(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) cand_[i] = {work_[i], i};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = static_cast<size_t>(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(n);

  // Softmax with temperature (max-subtracted).
  const float max_logit = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) {
    c.first = std::exp((c.first - max_logit) / params_.temperature);
    sum += c.first;
  }
  for (auto& c : cand_) c.first = static_cast<float>(c.first / sum);

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
  std::uniform_real_distribution<double> uniform(0.0, total);
  const double r = uniform(rng_);
  double acc = 0;
  for (const auto& c : cand_) {
    acc += c.first;
    if (r < acc) return c.second;
  }
  return cand_.back().second;
}

}  // namespace ds
