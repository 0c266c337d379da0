// TokenRadixTree: edges are split on insert where a new key diverges; erase clears the value and
// prunes childless nodes, merging a single remaining child into its parent so depth stays bounded.
#include "state/token_radix_tree.h"

#include <algorithm>

namespace ds {

TokenRadixTree::TokenRadixTree() : root_(std::make_unique<Node>()) {}
TokenRadixTree::~TokenRadixTree() = default;

void TokenRadixTree::insert(std::span<const int32_t> key, int64_t value) {
  Node* node = root_.get();
  size_t pos = 0;
  while (pos < key.size()) {
    auto it = node->children.find(key[pos]);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->edge.assign(key.begin() + pos, key.end());
      child->value = value;
      node->children.emplace(key[pos], std::move(child));
      ++n_values_;
      return;
    }
    Node* child = it->second.get();
    const size_t n = std::min(child->edge.size(), key.size() - pos);
    size_t common = 0;
    while (common < n && child->edge[common] == key[pos + common]) ++common;
    if (common < child->edge.size()) {
      // Split the edge at `common`: a new middle node takes the first part.
      auto middle = std::make_unique<Node>();
      middle->edge.assign(child->edge.begin(), child->edge.begin() + common);
      std::unique_ptr<Node> old = std::move(it->second);
      old->edge.erase(old->edge.begin(), old->edge.begin() + common);
      const int32_t old_first = old->edge[0];
      middle->children.emplace(old_first, std::move(old));
      it->second = std::move(middle);
      child = it->second.get();
    }
    node = child;
    pos += common;
  }
  if (node->value < 0) ++n_values_;
  node->value = value;
}

bool TokenRadixTree::erase(std::span<const int32_t> key) {
  // Walk down, remembering the path for pruning.
  std::vector<std::pair<Node*, int32_t>> path;  // (parent, first token of child edge)
  Node* node = root_.get();
  size_t pos = 0;
  while (pos < key.size()) {
    auto it = node->children.find(key[pos]);
    if (it == node->children.end()) return false;
    Node* child = it->second.get();
    if (child->edge.size() > key.size() - pos ||
        !std::equal(child->edge.begin(), child->edge.end(), key.begin() + pos)) {
      return false;
    }
    path.emplace_back(node, key[pos]);
    pos += child->edge.size();
    node = child;
  }
  if (node->value < 0) return false;
  node->value = -1;
  --n_values_;
  // Prune: remove valueless leaves; merge a valueless node with one child into that child.
  while (!path.empty()) {
    auto [parent, first] = path.back();
    path.pop_back();
    Node* child = parent->children[first].get();
    if (child->value >= 0) break;
    if (child->children.empty()) {
      parent->children.erase(first);
      continue;
    }
    if (child->children.size() == 1) {
      std::unique_ptr<Node> only = std::move(child->children.begin()->second);
      only->edge.insert(only->edge.begin(), child->edge.begin(), child->edge.end());
      parent->children[first] = std::move(only);
    }
    break;
  }
  return true;
}

std::optional<TokenRadixTree::Match> TokenRadixTree::longest_prefix(std::span<const int32_t> query,
                                                                    size_t max_length) const {
  std::optional<Match> best;
  const Node* node = root_.get();
  size_t pos = 0;
  if (node->value >= 0) best = Match{node->value, 0};
  while (pos < query.size()) {
    auto it = node->children.find(query[pos]);
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    if (child->edge.size() > query.size() - pos ||
        !std::equal(child->edge.begin(), child->edge.end(), query.begin() + pos)) {
      break;
    }
    pos += child->edge.size();
    if (pos > max_length) break;
    node = child;
    if (node->value >= 0) best = Match{node->value, pos};
  }
  return best;
}

}  // namespace ds
