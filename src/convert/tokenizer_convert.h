// The tokenizer.ggml.* metadata of a converted model, read from the checkpoint's tokenizer.json and
// tokenizer_config.json (byte-level BPE). Without tokenizer.json a byte-level fallback vocabulary
// (256 byte tokens, then unused padding entries, no merges) keeps the file loadable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "convert/hf_config.h"
#include "core/status.h"

namespace ds {
class GgufWriter;
}

namespace ds::convert {

// GGUF token types (tokenizer.ggml.token_type).
enum TokenType : int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

struct TokenizerData {
  std::vector<std::string> tokens;  // [n_vocab], BPE alphabet strings
  std::vector<int32_t> token_types; // [n_vocab]
  std::vector<std::string> merges;  // "left right"
  int64_t bos_id = -1, eos_id = -1, pad_id = -1;  // -1: not written
  bool add_bos = false;
  std::string pre = "qwen35";  // tokenizer.ggml.pre: "qwen2" when the file splits with the older regex
  std::string chat_template;   // empty: not written
  bool is_fallback = false;
};

// The GPT-2 bytes_to_unicode alphabet: byte b is written as this UTF-8 string.
std::string byte_to_unicode(uint8_t b);

// Reads DIR/tokenizer.json (+ tokenizer_config.json, chat_template.jinja); falls back, with a
// warning, to the byte-level vocabulary of cfg.n_vocab entries when tokenizer.json is absent.
Result<TokenizerData> tokenizer_load(const std::string& dir, const HfConfig& cfg);
TokenizerData tokenizer_fallback(const HfConfig& cfg);
void tokenizer_write_metadata(const TokenizerData& tok, GgufWriter& writer);

}  // namespace ds::convert
