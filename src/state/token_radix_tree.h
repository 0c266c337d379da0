// Radix tree keyed by token-id sequences. Finds, for a new prompt, the longest stored key that is a
// prefix of it. Edges hold the actual token ids, so a match is verified token by token, never by hash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace ds {

class TokenRadixTree {
 public:
  TokenRadixTree();
  ~TokenRadixTree();

  // Associates `value` with `key` (replacing an existing value for the same key).
  void insert(std::span<const int32_t> key, int64_t value);
  // Removes the value stored for exactly `key`; returns false if there was none.
  bool erase(std::span<const int32_t> key);

  struct Match {
    int64_t value;
    size_t length;  // tokens of the query covered by the stored key
  };
  // The longest stored key that is a prefix of `query` (including query itself). max_length bounds the
  // key length considered (e.g. n - 1 when at least one token must remain to be processed).
  std::optional<Match> longest_prefix(std::span<const int32_t> query,
                                      size_t max_length = SIZE_MAX) const;
  size_t size() const { return n_values_; }

 private:
  struct Node {
    std::vector<int32_t> edge;  // tokens on the edge from the parent to this node
    std::map<int32_t, std::unique_ptr<Node>> children;  // keyed by the first token of the child's edge
    int64_t value = -1;          // -1: no key ends here
  };
  std::unique_ptr<Node> root_;
  size_t n_values_ = 0;
};

}  // namespace ds
