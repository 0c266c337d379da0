// PrefixCache implementation: a radix tree maps token prefixes to entry ids; entries own shared
// snapshots, so a snapshot being restored stays alive even if it is evicted meanwhile.
#include "state/prefix_cache.h"

#include <limits>

namespace ds {

PrefixCache::PrefixCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

bool PrefixCache::put(std::shared_ptr<const Snapshot> snapshot) {
  if (!snapshot || snapshot->bytes() > budget_bytes_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  ++clock_;
  auto existing = index_.longest_prefix(snapshot->tokens);
  if (existing && existing->length == snapshot->tokens.size()) {
    auto it = entries_.find(existing->value);
    if (it != entries_.end()) {
      stats_.bytes_used -= it->second.snapshot->bytes();
      it->second = Entry{std::move(snapshot), clock_};
      stats_.bytes_used += it->second.snapshot->bytes();
      ++stats_.inserts;
      evict_to_budget_locked();
      return true;
    }
  }
  const int64_t id = next_id_++;
  index_.insert(snapshot->tokens, id);
  stats_.bytes_used += snapshot->bytes();
  entries_.emplace(id, Entry{std::move(snapshot), clock_});
  ++stats_.inserts;
  evict_to_budget_locked();
  return true;
}

std::shared_ptr<const Snapshot> PrefixCache::find(std::span<const int32_t> prompt, size_t max_length) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++clock_;
  auto match = index_.longest_prefix(prompt, max_length);
  if (!match) {
    ++stats_.misses;
    return nullptr;
  }
  auto it = entries_.find(match->value);
  if (it == entries_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  it->second.last_used = clock_;
  ++stats_.hits;
  return it->second.snapshot;
}

void PrefixCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, e] : entries_) index_.erase(e.snapshot->tokens);
  entries_.clear();
  stats_.bytes_used = 0;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PrefixCacheStats s = stats_;
  s.entries = entries_.size();
  return s;
}

double PrefixCache::score_locked(const Entry& e) const {
  const double mib = std::max<double>(1.0, static_cast<double>(e.snapshot->bytes())) / (1 << 20);
  const double age = static_cast<double>(clock_ - e.last_used);
  return (e.snapshot->prefill_ms + 1e-3) / mib / (1.0 + age / kAgeScale);
}

void PrefixCache::evict_to_budget_locked() {
  while (stats_.bytes_used > budget_bytes_ && !entries_.empty()) {
    auto victim = entries_.end();
    double worst = std::numeric_limits<double>::infinity();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const double s = score_locked(it->second);
      if (s < worst) {
        worst = s;
        victim = it;
      }
    }
    index_.erase(victim->second.snapshot->tokens);
    stats_.bytes_used -= victim->second.snapshot->bytes();
    entries_.erase(victim);
    ++stats_.evictions;
  }
}

}  // namespace ds
