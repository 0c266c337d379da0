// Byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.*): the qwen2 / qwen35
// pre-tokenizer regexes, merges by rank, special and control tokens matched before BPE.
// A Tokenizer is immutable once built; encode/decode may be called from many threads at once (the
// word cache is per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds {

class GgufFile;

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything a tokenizer is built from, whatever the file format.
struct TokenizerVocab {
  std::string source;                // file name for messages
  std::vector<std::string> tokens;   // BPE alphabet strings (GPT-2 bytes_to_unicode), index = id
  std::vector<int32_t> token_types;  // TokenType per token; empty = all normal
  std::vector<std::string> merges;   // "left right", rank = index
  int64_t bos_id = -1;               // out-of-range ids are disabled with a warning
  int64_t eos_id = -1;
  int64_t pad_id = -1;
  std::string pre;                   // "qwen2" or "qwen35"; empty = qwen35 with a warning
};

class Tokenizer {
 public:
  // tokenizer.ggml.model must be "gpt2"; tokens and merges must exist.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& file);
  // A Hugging Face tokenizer.json with a byte-level BPE model (vocab, merges, added_tokens) and the
  // Qwen2 split pattern. Added tokens marked special become control tokens, others user-defined.
  // The NFC normalizer such files declare is not applied (GGUF tokenizers do not apply it either).
  static Result<std::unique_ptr<Tokenizer>> from_hf_json(const std::string& path);
  static Result<TokenizerVocab> vocab_from_hf_json(const std::string& path);
  static Result<std::unique_ptr<Tokenizer>> from_vocab(TokenizerVocab vocab);
  ~Tokenizer();

  // allow_special: text like "<|im_start|>" becomes the special token (chat templates need this);
  // when false, such text is tokenized as ordinary characters (user content).
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const;
  // Raw bytes of the tokens concatenated (may end in a partial UTF-8 sequence). Control and
  // user-defined tokens contribute their literal text ("<|im_end|>"); callers drop end tokens.
  std::string decode(const std::vector<int32_t>& tokens) const;
  std::string token_text(int32_t id) const;  // the vocabulary string (BPE alphabet)
  int32_t n_vocab() const;
  int32_t bos_id() const;  // -1 if none
  int32_t eos_id() const;
  int32_t pad_id() const;
  // Id of an exact vocabulary entry ("<|im_end|>"), or -1.
  int32_t find_token(std::string_view text) const;
  bool is_special(int32_t id) const;  // control / user-defined tokens
  TokenType token_type(int32_t id) const;
  const char* pre_tokenizer_name() const;  // "qwen2" or "qwen35"

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming: emits only complete UTF-8 sequences.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // Returns the newly completed text after appending `token` (possibly empty).
  std::string push(int32_t token);
  // Returns whatever remains (invalid trailing bytes replaced by U+FFFD) at the end of a stream.
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

}  // namespace ds
