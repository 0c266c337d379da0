// Tests for the token radix tree (against a brute-force longest-prefix search) and the byte-budgeted
// prefix cache.
#include <gtest/gtest.h>

#include <random>

#include "state/prefix_cache.h"
#include "state/token_radix_tree.h"

namespace ds {
namespace {

size_t brute_longest(const std::vector<std::vector<int32_t>>& keys, const std::vector<bool>& live,
                     const std::vector<int32_t>& q, size_t max_len, int64_t* value) {
  size_t best = 0;
  bool found = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!live[i]) continue;
    const auto& k = keys[i];
    if (k.size() > q.size() || k.size() > max_len) continue;
    if (!std::equal(k.begin(), k.end(), q.begin())) continue;
    if (!found || k.size() >= best) {
      best = k.size();
      *value = static_cast<int64_t>(i);
      found = true;
    }
  }
  return found ? best : SIZE_MAX;
}

TEST(TokenRadixTree, MatchesBruteForceUnderRandomInsertsAndErases) {
  std::mt19937 rng(1);
  TokenRadixTree tree;
  std::vector<std::vector<int32_t>> keys;
  std::vector<bool> live;
  // Keys share prefixes heavily: small alphabet, extensions of earlier keys.
  for (int step = 0; step < 3000; ++step) {
    const int op = rng() % 10;
    if (op < 5 || keys.empty()) {
      std::vector<int32_t> k;
      if (!keys.empty() && rng() % 2) {
        k = keys[rng() % keys.size()];
        k.resize(rng() % (k.size() + 1));
      }
      const int extra = rng() % 6;
      for (int i = 0; i < extra; ++i) k.push_back(static_cast<int32_t>(rng() % 3));
      // Only one live key per distinct token sequence (the tree maps keys to one value).
      bool dup = false;
      for (size_t i = 0; i < keys.size(); ++i) dup |= live[i] && keys[i] == k;
      if (dup) continue;
      tree.insert(k, static_cast<int64_t>(keys.size()));
      keys.push_back(k);
      live.push_back(true);
    } else if (op < 7) {
      // Erasing a key removes whichever live entry has the same tokens.
      const std::vector<int32_t> k = keys[rng() % keys.size()];
      bool any_live = false;
      for (size_t j = 0; j < keys.size(); ++j) {
        if (keys[j] == k) {
          any_live |= live[j];
          live[j] = false;
        }
      }
      EXPECT_EQ(tree.erase(k), any_live);
    } else {
      std::vector<int32_t> q = keys[rng() % keys.size()];
      for (int i = rng() % 4; i > 0; --i) q.push_back(static_cast<int32_t>(rng() % 3));
      const size_t max_len = rng() % 2 ? SIZE_MAX : q.size() / 2;
      int64_t expect_value = -1;
      const size_t expect = brute_longest(keys, live, q, max_len, &expect_value);
      auto got = tree.longest_prefix(q, max_len);
      if (expect == SIZE_MAX) {
        EXPECT_FALSE(got.has_value()) << "step " << step;
      } else {
        ASSERT_TRUE(got.has_value()) << "step " << step;
        EXPECT_EQ(got->length, expect) << "step " << step;
        EXPECT_EQ(got->value, expect_value) << "step " << step;
      }
    }
  }
}

std::shared_ptr<Snapshot> make_snapshot(std::vector<int32_t> tokens, size_t state_bytes, double ms) {
  auto s = std::make_shared<Snapshot>();
  s->tokens = std::move(tokens);
  s->state.assign(state_bytes, 0xab);
  s->prefill_ms = ms;
  return s;
}

TEST(PrefixCache, FindsLongestPrefixAndRespectsMaxLength) {
  PrefixCache cache(1 << 20);
  cache.put(make_snapshot({1, 2, 3}, 100, 1));
  cache.put(make_snapshot({1, 2, 3, 4, 5}, 100, 1));
  cache.put(make_snapshot({1, 9}, 100, 1));
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  auto hit = cache.find(prompt);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->tokens.size(), 5u);
  hit = cache.find(prompt, 4);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->tokens.size(), 3u);
  std::vector<int32_t> other = {2, 2};
  EXPECT_EQ(cache.find(other), nullptr);
  // An edited earlier token must not match stale state.
  std::vector<int32_t> edited = {1, 2, 7, 4, 5, 6};
  EXPECT_EQ(cache.find(edited), nullptr);
  EXPECT_EQ(cache.stats().hits, 2u);
}

TEST(PrefixCache, EvictsLowScoreEntriesToStayWithinBudget) {
  PrefixCache cache(3000);
  cache.put(make_snapshot({1}, 1000, 1.0));     // cheap to recompute
  cache.put(make_snapshot({2}, 1000, 500.0));   // expensive
  cache.put(make_snapshot({3}, 900, 400.0));
  EXPECT_LE(cache.stats().bytes_used, 3000u);
  cache.put(make_snapshot({4}, 900, 300.0));    // over budget: the cheap one goes
  EXPECT_LE(cache.stats().bytes_used, 3000u);
  std::vector<int32_t> q1 = {1}, q2 = {2};
  EXPECT_EQ(cache.find(q1), nullptr);
  EXPECT_NE(cache.find(q2), nullptr);
  EXPECT_GE(cache.stats().evictions, 1u);
  // Larger than the whole budget: refused.
  EXPECT_FALSE(cache.put(make_snapshot({5}, 5000, 1e6)));
}

TEST(PrefixCache, ReplacingSameTokensKeepsOneEntry) {
  PrefixCache cache(1 << 20);
  cache.put(make_snapshot({1, 2}, 100, 1));
  cache.put(make_snapshot({1, 2}, 200, 1));
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(cache.stats().bytes_used, 208u);
}

// Deltas on parents: a parent stays while a child builds on it, even when its own score is the lowest;
// once its children are gone it is an ordinary leaf; an ancestor evicted before its child was stored
// comes back with the child, so the budget counts every byte the cache keeps alive.
TEST(PrefixCache, ParentsStayWhileChildrenBuildOnThem) {
  PrefixCache cache(4000);
  auto root = make_snapshot({1}, 1000, 1.0);  // cheapest: first to go were it a leaf
  cache.put(root);
  auto child = make_snapshot({1, 2}, 1000, 900.0);
  child->parent = root;
  cache.put(child);
  EXPECT_EQ(child->chain_bytes(), 2012u);
  EXPECT_EQ(child->depth(), 1);
  ASSERT_EQ(child->chain().size(), 2u);
  EXPECT_EQ(child->chain()[0].data(), root->state.data());
  cache.put(make_snapshot({5}, 1000, 50.0));
  cache.put(make_snapshot({6}, 1000, 60.0));  // over budget: a leaf goes, not the root
  EXPECT_LE(cache.stats().bytes_used, 4000u);
  std::vector<int32_t> q1 = {1}, q5 = {5}, q12 = {1, 2};
  EXPECT_NE(cache.find(q1), nullptr);
  EXPECT_NE(cache.find(q12), nullptr);
  EXPECT_EQ(cache.find(q5), nullptr);
  // A stored parent is not replaced by another snapshot of its tokens.
  cache.put(make_snapshot({1}, 10, 1.0));
  EXPECT_EQ(cache.find(q1), root);

  // Without its child (a bigger newcomer pushes leaves out), the root goes too when it scores lowest.
  PrefixCache small(2100);
  small.put(root);
  small.put(child);
  small.put(make_snapshot({7}, 1500, 1e6));
  EXPECT_LE(small.stats().bytes_used, 2100u);
  EXPECT_EQ(small.find(q12), nullptr);
  EXPECT_EQ(small.find(q1), nullptr);

  // Re-storing a child whose parent was evicted brings the parent back, counted.
  PrefixCache again(1 << 20);
  auto grandchild = make_snapshot({1, 2, 3}, 500, 1000.0);
  grandchild->parent = child;
  again.put(grandchild);
  EXPECT_EQ(again.stats().entries, 3u);
  EXPECT_EQ(again.stats().bytes_used, grandchild->chain_bytes());
  std::vector<int32_t> q123 = {1, 2, 3, 4};
  EXPECT_EQ(again.find(q123), grandchild);
}

}  // namespace
}  // namespace ds
