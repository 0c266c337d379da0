// Tests for the test-model vocabulary: the GPT-2 byte alphabet, pre-tokenization, BPE training
// (merge consistency, determinism, speed) and the token layout (specials, padding, ids).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "testmodel/bpe_vocab.h"

namespace ds::testmodel {
namespace {

TEST(TestModelVocab, ByteAlphabetIsGpt2) {
  const auto& a = gpt2_byte_alphabet();
  ASSERT_EQ(a.size(), 256u);
  EXPECT_EQ(a['!'], "!");
  EXPECT_EQ(a['A'], "A");
  EXPECT_EQ(a[' '], "\xc4\xa0");    // U+0120 'Ġ'
  EXPECT_EQ(a['\n'], "\xc4\x8a");   // U+010A 'Ċ'
  EXPECT_EQ(a[0], "\xc4\x80");      // U+0100
  EXPECT_EQ(a[0xad], "\xc5\x83");   // soft hyphen is not printable: U+0143
  EXPECT_EQ(a[0xff], "\xc3\xbf");   // U+00FF kept as itself
  std::set<std::string> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), 256u);
  const auto& order = gpt2_byte_token_order();
  ASSERT_EQ(order.size(), 256u);
  EXPECT_EQ(order[0], '!');   // GPT-2 / Qwen token 0 is "!"
  EXPECT_EQ(order[93], '~');  // 94 printable ASCII bytes first
  EXPECT_EQ(order[94], 0xa1);
  EXPECT_EQ(order[188], 0);   // then the non-printable bytes in byte order
}

TEST(TestModelVocab, PretokenizeSplitsAndCoversText) {
  const std::string text = "Hello world  foo(42);\n\n  x";
  std::vector<std::string> pieces;
  std::string joined;
  for (auto p : bpe_pretokenize(text)) {
    pieces.emplace_back(p);
    joined += p;
  }
  EXPECT_EQ(joined, text);
  const std::vector<std::string> expected = {"Hello", " world", " ", " foo", "(", "4", "2", ");", "\n\n", " ", " x"};
  EXPECT_EQ(pieces, expected);
}

// Encodes one pre-token with the merges by rank, the way a byte-level BPE tokenizer does.
std::vector<std::string> bpe_encode(const std::string& word, const std::vector<std::string>& merges) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) {
    const size_t sp = merges[r].find(' ');
    rank[{merges[r].substr(0, sp), merges[r].substr(sp + 1)}] = r;
  }
  std::vector<std::string> syms;
  for (unsigned char c : word) syms.push_back(gpt2_byte_alphabet()[c]);
  for (;;) {
    size_t best = merges.size(), at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = rank.find({syms[i], syms[i + 1]});
      if (it != rank.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == merges.size()) return syms;
    syms[at] += syms[at + 1];
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

TEST(TestModelVocab, MergesAreConsistentWithTokens) {
  auto v = test_vocab_build(1024);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->tokens.size(), 1024u);
  ASSERT_EQ(v->token_types.size(), 1024u);
  ASSERT_GT(v->merges.size(), 500u) << "the corpus should support the tiny preset's merges";
  std::map<std::string, size_t> id;
  for (size_t i = 0; i < v->tokens.size(); ++i) {
    EXPECT_TRUE(id.emplace(v->tokens[i], i).second) << "duplicate token " << v->tokens[i];
  }
  for (size_t r = 0; r < v->merges.size(); ++r) {
    const std::string& m = v->merges[r];
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    ASSERT_EQ(m.find(' ', sp + 1), std::string::npos) << "merge has more than one space: " << m;
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    ASSERT_TRUE(id.count(left) && id.count(right)) << m;
    // Rank order: merge r creates token 256 + r, from tokens that exist before it.
    EXPECT_EQ(v->tokens[256 + r], left + right) << "merge " << r;
    EXPECT_LT(id[left], 256 + r);
    EXPECT_LT(id[right], 256 + r);
  }
  // A frequent corpus word encodes to a single token.
  EXPECT_EQ(bpe_encode(" the", v->merges).size(), 1u);
}

TEST(TestModelVocab, SpecialTokensAndPadding) {
  auto v = test_vocab_build(1024);
  ASSERT_TRUE(v.is_ok());
  const size_t first = 256 + v->merges.size();
  const std::vector<std::pair<std::string, int32_t>> expected = {
      {"<|endoftext|>", 3}, {"<|im_start|>", 3}, {"<|im_end|>", 3},          {"<think>", 4},          {"</think>", 4},
      {"<tool_call>", 4},   {"</tool_call>", 4}, {"<tool_response>", 4}, {"</tool_response>", 4},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(v->tokens[first + i], expected[i].first);
    EXPECT_EQ(v->token_types[first + i], expected[i].second) << expected[i].first;
  }
  EXPECT_EQ(v->tokens[v->bos_id], "<|endoftext|>");
  EXPECT_EQ(v->tokens[v->pad_id], "<|endoftext|>");
  EXPECT_EQ(v->tokens[v->eos_id], "<|im_end|>");
  for (size_t i = 0; i < first; ++i) EXPECT_EQ(v->token_types[i], 1) << i;
  for (size_t i = first + expected.size(); i < v->tokens.size(); ++i) {
    EXPECT_EQ(v->tokens[i], "[PAD" + std::to_string(i) + "]");
    EXPECT_EQ(v->token_types[i], 5);
  }
}

TEST(TestModelVocab, SmallestAndTooSmall) {
  auto v = test_vocab_build(265);
  ASSERT_TRUE(v.is_ok());
  EXPECT_TRUE(v->merges.empty());
  EXPECT_EQ(v->tokens[256], "<|endoftext|>");
  EXPECT_EQ(v->eos_id, 258u);
  auto bad = test_vocab_build(264);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("264"), std::string::npos) << bad.status().message();
}

TEST(TestModelVocab, DeterministicAndFastAtRealVocabSize) {
  const auto start = std::chrono::steady_clock::now();
  auto a = test_vocab_build(248320);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(a.is_ok());
  EXPECT_LT(secs, 1.0) << "BPE training took " << secs << " s";
  auto b = test_vocab_build(248320);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->merges, b->merges);
  // The corpus runs out of pairs long before 248k tokens: the rest is padding.
  EXPECT_EQ(a->tokens.back(), "[PAD248319]");
  // A smaller vocab is a prefix of the same merge sequence.
  auto c = test_vocab_build(1024);
  ASSERT_TRUE(c.is_ok());
  ASSERT_LE(c->merges.size(), a->merges.size());
  EXPECT_TRUE(std::equal(c->merges.begin(), c->merges.end(), a->merges.begin()));
}

}  // namespace
}  // namespace ds::testmodel
