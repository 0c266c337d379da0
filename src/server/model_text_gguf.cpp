// The product ModelText: the GGUF file's BPE tokenizer and the Qwen3.5 chat template. Non-obvious
// choice: the bytes of every token are decoded once at load into a table, so the per-token path in
// the generation loop is a lookup that needs no locking and allocates nothing new per call.
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "server/model_text.h"
#include "text/tokenizer.h"

namespace ds {
namespace {

// Control tokens such as <|im_start|> or <|vision_pad|> carry no text for the client.
bool is_control_marker(const Tokenizer& tok, int32_t id) {
  if (!tok.is_special(id)) return false;
  std::string t = tok.token_text(id);
  return t.size() >= 4 && t.rfind("<|", 0) == 0 && t.compare(t.size() - 2, 2, "|>") == 0;
}

class GgufModelText : public ModelText {
 public:
  explicit GgufModelText(std::unique_ptr<Tokenizer> tok) : tok_(std::move(tok)) {
    const int32_t n = tok_->n_vocab();
    bytes_.resize(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; id++) {
      if (!is_control_marker(*tok_, id)) bytes_[static_cast<size_t>(id)] = tok_->decode({id});
    }
    auto add_stop = [this](int32_t id) {
      if (id < 0) return;
      for (int32_t s : stops_) {
        if (s == id) return;
      }
      stops_.push_back(id);
    };
    add_stop(tok_->eos_id());
    add_stop(tok_->find_token("<|im_end|>"));
    add_stop(tok_->find_token("<|endoftext|>"));
  }

  Result<std::string> render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const override {
    return render_chat(messages, options);
  }
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const override {
    return tok_->encode(text, allow_special);
  }
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= bytes_.size()) return "";
    return bytes_[static_cast<size_t>(id)];
  }
  std::vector<int32_t> stop_tokens() const override { return stops_; }

 private:
  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::string> bytes_;  // [n_vocab] raw bytes per token; "" for control markers
  std::vector<int32_t> stops_;
};

}  // namespace

Result<std::unique_ptr<ModelText>> model_text_open(const std::string& gguf_path) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(gguf_path));
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_gguf(*file);
  if (!tok.is_ok()) return tok.status().with_context(gguf_path + ": tokenizer");
  return std::unique_ptr<ModelText>(new GgufModelText(std::move(tok).value()));
}

}  // namespace ds
