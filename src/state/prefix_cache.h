// In-memory prefix snapshots. A snapshot is the serialized state of a sequence at a token boundary b
// (attention KV for [0, b), DeltaNet conv/SSM state at b, logits at b) plus the tokens [0, b); or a
// delta on a parent snapshot of a shorter prefix, holding only the KV of [parent's b, b) and the
// state at b (state_io.h), so a prompt's checkpoints and a conversation's turns cost their own tokens.
// Capacity is a byte budget; eviction removes the entry with the lowest score among those that no
// other cached entry builds on (a parent stays while its children do), where
//   score = saved prefill milliseconds per MiB of its chain / (1 + age / kAgeScale)
// and age counts cache operations since the entry was last used: recent, expensive-to-recompute,
// small snapshots stay.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "state/token_radix_tree.h"

namespace ds {

struct Snapshot {
  std::vector<int32_t> tokens;   // the prefix [0, b)
  std::vector<uint8_t> state;    // serialized sequence state at b: whole, or with a parent its delta
  std::shared_ptr<const Snapshot> parent;  // the snapshot `state` continues (its tokens a prefix of these)
  double prefill_ms = 0;         // time it took to compute this prefix (what a hit saves)
  // Memory this snapshot holds itself, and with every ancestor (what a restore moves).
  uint64_t bytes() const { return state.size() + tokens.size() * sizeof(int32_t); }
  uint64_t chain_bytes() const { return bytes() + (parent ? parent->chain_bytes() : 0); }
  int depth() const { return parent ? 1 + parent->depth() : 0; }  // ancestors
  // The streams to restore in order: the root's whole stream, then each delta.
  std::vector<std::span<const uint8_t>> chain() const;
};

struct PrefixCacheStats {
  uint64_t hits = 0, misses = 0, inserts = 0, evictions = 0;
  uint64_t bytes_used = 0, entries = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(uint64_t budget_bytes);

  // Stores a snapshot (replacing one with identical tokens unless that one has children here), and
  // its ancestors that are no longer stored, then evicts down to the budget. Returns false if the
  // snapshot alone exceeds the budget (not stored).
  bool put(std::shared_ptr<const Snapshot> snapshot);
  // The longest stored snapshot whose tokens are a prefix of `prompt`, at most max_length tokens.
  std::shared_ptr<const Snapshot> find(std::span<const int32_t> prompt, size_t max_length = SIZE_MAX);
  // Drops every snapshot (e.g. the model changed).
  void clear();
  PrefixCacheStats stats() const;
  uint64_t budget_bytes() const { return budget_bytes_; }

 private:
  struct Entry {
    std::shared_ptr<const Snapshot> snapshot;
    uint64_t last_used = 0;
    int children = 0;  // stored entries whose parent this is
  };
  void insert_locked(std::shared_ptr<const Snapshot> snapshot);
  void remove_locked(std::unordered_map<int64_t, Entry>::iterator it);
  void evict_to_budget_locked();
  double score_locked(const Entry& e) const;

  static constexpr double kAgeScale = 16.0;
  const uint64_t budget_bytes_;
  mutable std::mutex mutex_;  // guards everything below
  TokenRadixTree index_;      // tokens -> entry id
  std::unordered_map<int64_t, Entry> entries_;
  std::unordered_map<const Snapshot*, int64_t> by_snapshot_;  // stored snapshot -> its entry id
  int64_t next_id_ = 0;
  uint64_t clock_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace ds
