// PrefixCache implementation: a radix tree maps token prefixes to entry ids; entries own shared
// snapshots, so a snapshot being restored stays alive even if it is evicted meanwhile. Entries form a
// forest through Snapshot::parent; only leaves are evicted.
#include "state/prefix_cache.h"

#include <algorithm>
#include <limits>

namespace ds {

std::vector<std::span<const uint8_t>> Snapshot::chain() const {
  std::vector<std::span<const uint8_t>> out;
  for (const Snapshot* s = this; s != nullptr; s = s->parent.get()) out.emplace_back(s->state);
  std::reverse(out.begin(), out.end());
  return out;
}

PrefixCache::PrefixCache(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

bool PrefixCache::put(std::shared_ptr<const Snapshot> snapshot) {
  if (!snapshot || snapshot->bytes() > budget_bytes_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  ++clock_;
  // Ancestors evicted since they were stored come back first, root first: a child is only as good as
  // its chain, and the budget counts every byte a stored entry keeps alive.
  std::vector<std::shared_ptr<const Snapshot>> missing;
  for (auto p = snapshot->parent; p && !by_snapshot_.count(p.get()); p = p->parent) missing.push_back(p);
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) insert_locked(*it);
  insert_locked(std::move(snapshot));
  evict_to_budget_locked();
  return true;
}

void PrefixCache::insert_locked(std::shared_ptr<const Snapshot> snapshot) {
  if (by_snapshot_.count(snapshot.get())) return;
  auto existing = index_.longest_prefix(snapshot->tokens);
  if (existing && existing->length == snapshot->tokens.size()) {
    auto it = entries_.find(existing->value);
    // A stored snapshot of the same tokens that others build on stays; this one is not stored (the
    // rare case of one prefix computed twice).
    if (it != entries_.end() && it->second.children > 0) return;
    if (it != entries_.end()) remove_locked(it);
  }
  const int64_t id = next_id_++;
  index_.insert(snapshot->tokens, id);
  stats_.bytes_used += snapshot->bytes();
  if (snapshot->parent) {
    auto p = by_snapshot_.find(snapshot->parent.get());
    if (p != by_snapshot_.end()) entries_.at(p->second).children++;
  }
  by_snapshot_.emplace(snapshot.get(), id);
  entries_.emplace(id, Entry{std::move(snapshot), clock_, 0});
  ++stats_.inserts;
}

void PrefixCache::remove_locked(std::unordered_map<int64_t, Entry>::iterator it) {
  const Snapshot& s = *it->second.snapshot;
  if (s.parent) {
    auto p = by_snapshot_.find(s.parent.get());
    if (p != by_snapshot_.end()) entries_.at(p->second).children--;
  }
  index_.erase(s.tokens);
  by_snapshot_.erase(&s);
  stats_.bytes_used -= s.bytes();
  entries_.erase(it);
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
  by_snapshot_.clear();
  stats_.bytes_used = 0;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PrefixCacheStats s = stats_;
  s.entries = entries_.size();
  return s;
}

double PrefixCache::score_locked(const Entry& e) const {
  const double mib = std::max<double>(1.0, static_cast<double>(e.snapshot->chain_bytes())) / (1 << 20);
  const double age = static_cast<double>(clock_ - e.last_used);
  return (e.snapshot->prefill_ms + 1e-3) / mib / (1.0 + age / kAgeScale);
}

void PrefixCache::evict_to_budget_locked() {
  while (stats_.bytes_used > budget_bytes_ && !entries_.empty()) {
    auto victim = entries_.end();
    double worst = std::numeric_limits<double>::infinity();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.children > 0) continue;
      const double s = score_locked(it->second);
      if (s < worst) {
        worst = s;
        victim = it;
      }
    }
    if (victim == entries_.end()) break;  // unreachable: a forest has leaves
    remove_locked(victim);
    ++stats_.evictions;
  }
}

}  // namespace ds
