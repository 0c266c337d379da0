// Byte-level BPE training and the test vocabulary layout. Training keeps pair counts incrementally
// (only the words that contain the merged pair are recounted), so a few thousand merges on the
// built-in corpus take milliseconds.
#include "testmodel/bpe_vocab.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"

namespace ds::testmodel {
namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

bool is_printable_byte(int b) { return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae); }

enum class CharClass { kLetter, kDigit, kSpace, kNewline, kPunct };

CharClass char_class(uint8_t c) {
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return CharClass::kLetter;
  if (c >= '0' && c <= '9') return CharClass::kDigit;
  if (c == '\n' || c == '\r') return CharClass::kNewline;
  if (c == ' ' || c == '\t' || c == '\v' || c == '\f') return CharClass::kSpace;
  return CharClass::kPunct;
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

}  // namespace

const std::vector<std::string>& gpt2_byte_alphabet() {
  static const std::vector<std::string> kAlphabet = [] {
    std::vector<std::string> a(256);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = is_printable_byte(b) ? static_cast<uint32_t>(b) : next++;
      append_utf8(a[b], cp);
    }
    return a;
  }();
  return kAlphabet;
}

const std::vector<uint8_t>& gpt2_byte_token_order() {
  static const std::vector<uint8_t> kOrder = [] {
    std::vector<uint8_t> order;
    for (int b = 0; b < 256; ++b)
      if (is_printable_byte(b)) order.push_back(static_cast<uint8_t>(b));
    for (int b = 0; b < 256; ++b)
      if (!is_printable_byte(b)) order.push_back(static_cast<uint8_t>(b));
    return order;
  }();
  return kOrder;
}

std::vector<std::string_view> bpe_pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  const size_t n = text.size();
  auto cls = [&](size_t k) { return char_class(static_cast<uint8_t>(text[k])); };
  while (i < n) {
    const size_t start = i;
    CharClass c = cls(i);
    if (c == CharClass::kSpace) {
      size_t j = i;
      while (j < n && cls(j) == CharClass::kSpace) ++j;
      // A single space before a word or punctuation joins that piece ("Ġword").
      const bool joins = j < n && text[j - 1] == ' ' && (cls(j) == CharClass::kLetter || cls(j) == CharClass::kPunct);
      if (!joins) {
        out.push_back(text.substr(start, j - start));
        i = j;
        continue;
      }
      if (j - 1 > start) out.push_back(text.substr(start, j - 1 - start));
      i = j;  // the piece below starts at the space
      c = cls(i);
      const size_t word_start = j - 1;
      while (i < n && cls(i) == c) ++i;
      out.push_back(text.substr(word_start, i - word_start));
      continue;
    }
    if (c == CharClass::kDigit) {
      out.push_back(text.substr(i, 1));
      ++i;
      continue;
    }
    while (i < n && cls(i) == c) ++i;
    out.push_back(text.substr(start, i - start));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> bpe_train(std::string_view corpus, int64_t max_merges) {
  const auto& alphabet = gpt2_byte_alphabet();
  const auto& order = gpt2_byte_token_order();
  std::vector<std::string> tok;  // token id -> string
  std::vector<int32_t> byte_id(256);
  for (int i = 0; i < 256; ++i) {
    byte_id[order[i]] = i;
    tok.push_back(alphabet[order[i]]);
  }
  std::unordered_set<std::string> known(tok.begin(), tok.end());
  for (const auto& s : test_vocab_special_tokens()) known.insert(s.text);

  // Unique pre-tokens with their counts, in first-seen order (deterministic).
  struct Word {
    std::vector<int32_t> syms;
    int64_t count = 0;
  };
  std::vector<Word> words;
  {
    std::unordered_map<std::string_view, size_t> index;
    for (std::string_view piece : bpe_pretokenize(corpus)) {
      auto [it, inserted] = index.emplace(piece, words.size());
      if (inserted) {
        Word w;
        for (unsigned char c : piece) w.syms.push_back(byte_id[c]);
        words.push_back(std::move(w));
      }
      words[it->second].count++;
    }
  }

  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;  // may hold stale or repeated ids
  auto add_pairs = [&](int32_t wi, int64_t sign) {
    const Word& w = words[wi];
    for (size_t k = 0; k + 1 < w.syms.size(); ++k) {
      const uint64_t key = pair_key(w.syms[k], w.syms[k + 1]);
      pair_counts[key] += sign * w.count;
      if (sign > 0) pair_words[key].push_back(wi);
    }
  };
  for (int32_t wi = 0; wi < static_cast<int32_t>(words.size()); ++wi) add_pairs(wi, +1);

  std::vector<std::pair<std::string, std::string>> merges;
  std::unordered_set<uint64_t> banned;  // pairs whose concatenation already is a token
  std::vector<int64_t> visited(words.size(), -1);
  while (static_cast<int64_t>(merges.size()) < max_merges) {
    uint64_t best = 0;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      if (count <= 0 || banned.count(key)) continue;
      if (count > best_count || (count == best_count && key < best)) {
        best = key;
        best_count = count;
      }
    }
    if (best_count == 0) break;
    const int32_t a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xffffffffu);
    std::string merged = tok[a] + tok[b];
    if (!known.insert(merged).second) {
      banned.insert(best);
      continue;
    }
    const int32_t new_id = static_cast<int32_t>(tok.size());
    tok.push_back(merged);
    merges.emplace_back(tok[a], tok[b]);
    const std::vector<int32_t> holders = std::move(pair_words[best]);
    pair_words.erase(best);
    for (int32_t wi : holders) {
      if (visited[wi] == new_id) continue;
      visited[wi] = new_id;
      Word& w = words[wi];
      add_pairs(wi, -1);
      std::vector<int32_t> out;
      out.reserve(w.syms.size());
      for (size_t k = 0; k < w.syms.size(); ++k) {
        if (k + 1 < w.syms.size() && w.syms[k] == a && w.syms[k + 1] == b) {
          out.push_back(new_id);
          ++k;
        } else {
          out.push_back(w.syms[k]);
        }
      }
      w.syms = std::move(out);
      add_pairs(wi, +1);
    }
    pair_counts.erase(best);
  }
  return merges;
}

const std::vector<SpecialToken>& test_vocab_special_tokens() {
  static const std::vector<SpecialToken> kSpecials = {
      {"<|endoftext|>", kTokenControl},       {"<|im_start|>", kTokenControl},
      {"<|im_end|>", kTokenControl},          {"<think>", kTokenUserDefined},
      {"</think>", kTokenUserDefined},        {"<tool_call>", kTokenUserDefined},
      {"</tool_call>", kTokenUserDefined},    {"<tool_response>", kTokenUserDefined},
      {"</tool_response>", kTokenUserDefined},
  };
  return kSpecials;
}

Result<TestVocab> test_vocab_build(int64_t n_vocab) {
  const auto& specials = test_vocab_special_tokens();
  const int64_t n_fixed = 256 + static_cast<int64_t>(specials.size());
  if (n_vocab < n_fixed) {
    return invalid_argument("n_vocab {} is too small: the 256 byte tokens and {} special tokens need {}", n_vocab,
                            specials.size(), n_fixed);
  }
  TestVocab v;
  v.tokens.reserve(n_vocab);
  v.token_types.reserve(n_vocab);
  for (uint8_t b : gpt2_byte_token_order()) {
    v.tokens.push_back(gpt2_byte_alphabet()[b]);
    v.token_types.push_back(kTokenNormal);
  }
  for (auto& [left, right] : bpe_train(bpe_training_corpus(), n_vocab - n_fixed)) {
    v.tokens.push_back(left + right);
    v.token_types.push_back(kTokenNormal);
    v.merges.push_back(left + " " + right);
  }
  v.n_merged = static_cast<int64_t>(v.merges.size());
  const uint32_t first_special = static_cast<uint32_t>(v.tokens.size());
  for (const auto& s : specials) {
    v.tokens.push_back(s.text);
    v.token_types.push_back(s.type);
  }
  v.bos_id = first_special;      // <|endoftext|>
  v.pad_id = first_special;      // <|endoftext|>
  v.eos_id = first_special + 2;  // <|im_end|>
  while (static_cast<int64_t>(v.tokens.size()) < n_vocab) {
    v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
    v.token_types.push_back(kTokenUnused);
  }
  DS_CHECK(static_cast<int64_t>(v.tokens.size()) == n_vocab, "vocab size {} != {}", v.tokens.size(), n_vocab);
  return v;
}

}  // namespace ds::testmodel
