// NgramDraft: speculative drafts without a draft model ("prompt lookup"). The context (prompt and
// generated tokens so far) is searched for the latest earlier occurrence of its own last g tokens,
// g from max_ngram down to min_ngram; the tokens that followed that occurrence are the draft. Coding
// agents re-emit much of what their prompt holds (file contents, edits, tool arguments), where such
// drafts run long; elsewhere no match is found and no draft is proposed.
//
//   NgramDraft d(NgramDraftOptions{});
//   d.reset(prompt);
//   d.append(token);                       // each token the sequence takes, in order
//   std::vector<int32_t> draft = d.propose(7);
//
// Non-obvious choice: an index per n-gram length maps the hash of every g-gram to the latest position it
// ended at, updated as tokens arrive, so a proposal costs max_ngram - min_ngram + 1 lookups whatever the
// context length (32K-token prompts are common); a hash hit is confirmed token by token.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace ds {

struct NgramDraftOptions {
  int32_t min_ngram = 2;  // shortest suffix that may match
  int32_t max_ngram = 4;  // longest suffix tried (first)
};

class NgramDraft {
 public:
  explicit NgramDraft(const NgramDraftOptions& options);

  // Starts over on `context` (a request's prompt).
  void reset(std::span<const int32_t> context);
  void append(int32_t token);
  // max_tokens tokens that followed the latest earlier occurrence of the context's longest matching
  // suffix (where they run past the context's end, the match repeats: a loop of period n - end);
  // empty when no suffix of min_ngram..max_ngram tokens occurs before.
  std::vector<int32_t> propose(int32_t max_tokens) const;

  const std::vector<int32_t>& context() const { return tokens_; }

 private:
  // Hash of tokens_[end - g, end).
  uint64_t gram_hash(int64_t end, int32_t g) const;
  void index_end(int64_t end);  // indexes every g-gram ending at `end` (exclusive)

  NgramDraftOptions options_;
  std::vector<int32_t> tokens_;
  // Per g (index g - min_ngram): gram hash -> the latest end (exclusive) of that gram, excluding the
  // context's own end (that entry goes in when the next token arrives).
  std::vector<std::unordered_map<uint64_t, int64_t>> latest_end_;
};

}  // namespace ds
