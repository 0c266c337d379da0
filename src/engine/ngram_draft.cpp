// NgramDraft implementation: one hash index per n-gram length, updated per token.
#include "engine/ngram_draft.h"

#include <algorithm>

#include "core/check.h"

namespace ds {

NgramDraft::NgramDraft(const NgramDraftOptions& options) : options_(options) {
  DS_CHECK(options.min_ngram >= 1 && options.max_ngram >= options.min_ngram, "n-gram draft lengths {}..{}",
           options.min_ngram, options.max_ngram);
  latest_end_.resize(static_cast<size_t>(options.max_ngram - options.min_ngram + 1));
}

uint64_t NgramDraft::gram_hash(int64_t end, int32_t g) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(g);
  for (int64_t i = end - g; i < end; ++i) {
    h ^= static_cast<uint32_t>(tokens_[static_cast<size_t>(i)]);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
  }
  return h;
}

void NgramDraft::index_end(int64_t end) {
  for (int32_t g = options_.min_ngram; g <= options_.max_ngram && g <= end; ++g) {
    latest_end_[static_cast<size_t>(g - options_.min_ngram)][gram_hash(end, g)] = end;
  }
}

void NgramDraft::reset(std::span<const int32_t> context) {
  tokens_.assign(context.begin(), context.end());
  for (auto& m : latest_end_) m.clear();
  for (int64_t end = 1; end < static_cast<int64_t>(tokens_.size()); ++end) index_end(end);
}

void NgramDraft::append(int32_t token) {
  tokens_.push_back(token);
  // The gram ending before the new token is now an earlier occurrence the next proposal may find.
  index_end(static_cast<int64_t>(tokens_.size()) - 1);
}

std::vector<int32_t> NgramDraft::propose(int32_t max_tokens) const {
  const int64_t n = static_cast<int64_t>(tokens_.size());
  if (max_tokens <= 0) return {};
  for (int32_t g = options_.max_ngram; g >= options_.min_ngram; --g) {
    if (n <= g) continue;  // no room for an earlier occurrence
    const auto& index = latest_end_[static_cast<size_t>(g - options_.min_ngram)];
    const auto it = index.find(gram_hash(n, g));
    if (it == index.end()) continue;
    const int64_t e = it->second;  // e < n by construction
    if (!std::equal(tokens_.begin() + (e - g), tokens_.begin() + e, tokens_.begin() + (n - g))) continue;
    // What followed the occurrence; past the context's end the match repeats with period n - e.
    std::vector<int32_t> draft(static_cast<size_t>(max_tokens));
    for (int64_t j = 0; j < max_tokens; ++j) {
      const int64_t from = e + j;
      draft[static_cast<size_t>(j)] = from < n ? tokens_[static_cast<size_t>(from)] : draft[static_cast<size_t>(from - n)];
    }
    return draft;
  }
  return {};
}

}  // namespace ds
