// The text side of a served model as the HTTP layer sees it: chat rendering, tokenizing, and the
// raw bytes of each token for detokenizing. Non-obvious choice: the server detokenizes from per-token
// bytes (byte-level BPE concatenates exactly), so streaming, stop strings and UTF-8 boundaries are
// handled in one place (server/output_parser.h) for every backend of this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/chat_template.h"

namespace ds {

class ModelText {
 public:
  virtual ~ModelText() = default;
  // The conversation rendered with the model's chat template (generation prompt included).
  virtual Result<std::string> render(const std::vector<ChatMessage>& messages,
                                     const ChatRenderOptions& options) const = 0;
  // allow_special: control-token text becomes the control token (templated prompts need this).
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special) const = 0;
  // The raw bytes of one token ("" for control tokens that carry no text, e.g. <|im_end|>).
  virtual std::string token_bytes(int32_t id) const = 0;
  // Tokens that end an assistant turn (EOS, <|im_end|>): generation stops there.
  virtual std::vector<int32_t> stop_tokens() const = 0;
};

// The product implementation: the GGUF's tokenizer and the Qwen3.5 chat template.
Result<std::unique_ptr<ModelText>> model_text_open(const std::string& gguf_path);

}  // namespace ds
