// Vocabulary of generated test models: a GPT-2 style byte-level BPE (the 256 byte tokens in the
// bytes_to_unicode alphabet, merges learned on a built-in corpus), then Qwen's special tokens, then
// [PAD{id}] fillers up to n_vocab. The non-obvious choice: a merge whose result string already is a
// token is skipped, so merge rank r always creates token 256 + r and the merge list and the token
// list stay in one-to-one rank order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds::testmodel {

// tokenizer.ggml.token_type values.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUserDefined = 4;
constexpr int32_t kTokenUnused = 5;

struct TestVocab {
  std::vector<std::string> tokens;   // [n_vocab] UTF-8 token strings (byte-level alphabet)
  std::vector<int32_t> token_types;  // [n_vocab]
  std::vector<std::string> merges;   // "left right", rank order
  uint32_t bos_id = 0;  // <|endoftext|>
  uint32_t eos_id = 0;  // <|im_end|>
  uint32_t pad_id = 0;  // <|endoftext|>
  int64_t n_merged = 0;  // tokens 256 .. 256 + n_merged - 1 come from merges
};

// GPT-2 bytes_to_unicode: byte b is shown as the UTF-8 string gpt2_byte_alphabet()[b].
const std::vector<std::string>& gpt2_byte_alphabet();
// The byte of each of the first 256 token ids (printable bytes first, as GPT-2's vocabulary).
const std::vector<uint8_t>& gpt2_byte_token_order();

// Splits text into pre-tokens: [space]letters (bytes >= 0x80 count as letters), single digits,
// [space]punctuation runs, newline runs, other whitespace runs. Concatenating the pieces gives text.
std::vector<std::string_view> bpe_pretokenize(std::string_view text);

// Learns up to max_merges merges on `corpus`; returns them as pairs of token strings in rank order.
// Deterministic: ties in pair frequency go to the smaller (left id, right id).
std::vector<std::pair<std::string, std::string>> bpe_train(std::string_view corpus, int64_t max_merges);

// The built-in training corpus (English prose, source code, CJK and emoji text).
std::string_view bpe_training_corpus();

// The full vocabulary for n_vocab >= 265 tokens (kInvalidArgument otherwise).
Result<TestVocab> test_vocab_build(int64_t n_vocab);

// The special tokens in id order, with their token types.
struct SpecialToken {
  const char* text;
  int32_t type;
};
const std::vector<SpecialToken>& test_vocab_special_tokens();

}  // namespace ds::testmodel
