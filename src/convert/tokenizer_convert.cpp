// tokenizer.json -> tokenizer.ggml.* keys. The one non-obvious choice: the vocabulary is always
// config.json's vocab_size long (the embedding's row count), with ids the tokenizer does not use
// filled by `[PAD{i}]` entries of type UNUSED, because the loader requires one string per row.
#include "convert/tokenizer_convert.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "gguf/gguf_writer.h"

namespace ds::convert {
namespace {

using nlohmann::json;

// The pre-tokenizer split regex of Qwen2 / Qwen3 tokenizer.json files. Qwen3.5 adds \p{M} to the
// letter classes; GGUF names the two "qwen2" and "qwen35".
constexpr const char* kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// "qwen2" when the pre_tokenizer section splits with the Qwen2 regex, else "qwen35".
std::string detect_pre(const json& tj) {
  auto pre = tj.find("pre_tokenizer");
  if (pre == tj.end()) return "qwen35";
  std::vector<const json*> stack = {&*pre};
  while (!stack.empty()) {
    const json* node = stack.back();
    stack.pop_back();
    if (!node->is_object()) continue;
    auto pattern = node->find("pattern");
    if (node->value("type", "") == "Split" && pattern != node->end() && pattern->is_object() &&
        pattern->value("Regex", "") == kQwen2SplitRegex) {
      return "qwen2";
    }
    auto children = node->find("pretokenizers");
    if (children != node->end() && children->is_array()) {
      for (const auto& c : *children) stack.push_back(&c);
    }
  }
  return "qwen35";
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

void append_utf8(uint32_t cp, std::string* s) {
  if (cp < 0x80) {
    s->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// A special-token field of tokenizer_config.json: a string or {"content": "..."}; "" when absent.
std::string token_text(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

int64_t id_of(const TokenizerData& tok, const std::string& text) {
  if (text.empty()) return -1;
  for (size_t i = 0; i < tok.tokens.size(); ++i) {
    if (tok.tokens[i] == text && tok.token_types[i] != kTokenUnused) return static_cast<int64_t>(i);
  }
  return -1;
}

Status read_vocab(const json& tj, const std::string& path, int64_t n_vocab, TokenizerData* tok) {
  auto model = tj.find("model");
  if (model == tj.end() || !model->is_object()) return corrupt("{}: missing object 'model'", path);
  auto type = model->find("type");
  if (type != model->end() && type->is_string() && type->get<std::string>() != "BPE") {
    return unsupported("{}: tokenizer model type '{}' is not supported (byte-level BPE is)", path,
                       type->get<std::string>());
  }
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) return corrupt("{}: missing object 'model.vocab'", path);
  tok->tokens.assign(static_cast<size_t>(n_vocab), "");
  tok->token_types.assign(static_cast<size_t>(n_vocab), kTokenUnused);
  auto place = [&](const std::string& text, const json& id_json, int32_t type_id) -> Status {
    if (!id_json.is_number_integer()) return corrupt("{}: token '{}' has a non-integer id", path, text);
    const int64_t id = id_json.get<int64_t>();
    if (id < 0 || id >= n_vocab) {
      return corrupt("{}: token '{}' has id {}, outside vocab_size {} of config.json", path, text, id, n_vocab);
    }
    if (tok->token_types[id] != kTokenUnused && tok->tokens[id] != text) {
      return corrupt("{}: id {} is used by both '{}' and '{}'", path, id, tok->tokens[id], text);
    }
    tok->tokens[id] = text;
    tok->token_types[id] = type_id;
    return Status::ok();
  };
  for (auto it = vocab->begin(); it != vocab->end(); ++it) DS_TRY(place(it.key(), it.value(), kTokenNormal));
  auto added = tj.find("added_tokens");
  if (added != tj.end() && added->is_array()) {
    for (const auto& a : *added) {
      auto content = a.find("content");
      auto id = a.find("id");
      if (!a.is_object() || content == a.end() || !content->is_string() || id == a.end()) {
        return corrupt("{}: an added_tokens entry lacks 'content' or 'id'", path);
      }
      auto special = a.find("special");
      const bool is_special = special != a.end() && special->is_boolean() && special->get<bool>();
      DS_TRY(place(content->get<std::string>(), *id, is_special ? kTokenControl : kTokenUserDefined));
    }
  }
  for (int64_t i = 0; i < n_vocab; ++i) {
    if (tok->token_types[i] == kTokenUnused) tok->tokens[i] = "[PAD" + std::to_string(i) + "]";
  }
  auto merges = model->find("merges");
  if (merges != model->end() && merges->is_array()) {
    for (const auto& m : *merges) {
      if (m.is_string()) {
        tok->merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        tok->merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      } else {
        return corrupt("{}: merge {} is neither \"a b\" nor [a, b]", path, m.dump());
      }
    }
  }
  return Status::ok();
}

void read_tokenizer_config(const std::string& dir, const HfConfig& cfg, TokenizerData* tok) {
  namespace fs = std::filesystem;
  json tc = json::object();
  std::string text;
  const std::string path = (fs::path(dir) / "tokenizer_config.json").string();
  if (read_file(path, &text)) {
    try {
      tc = json::parse(text);
    } catch (const json::exception& e) {
      DS_LOG_WARN("convert: {}: not valid JSON ({}); special tokens taken from config.json", path, e.what());
    }
    if (!tc.is_object()) tc = json::object();
  }
  auto within = [&](int64_t id) { return id >= 0 && id < static_cast<int64_t>(tok->tokens.size()) ? id : -1; };
  tok->eos_id = id_of(*tok, token_text(tc, "eos_token"));
  if (tok->eos_id < 0) tok->eos_id = within(cfg.eos_token_id);
  tok->bos_id = id_of(*tok, token_text(tc, "bos_token"));
  if (tok->bos_id < 0) tok->bos_id = within(cfg.bos_token_id);
  if (tok->bos_id < 0) tok->bos_id = id_of(*tok, "<|endoftext|>");
  tok->pad_id = id_of(*tok, token_text(tc, "pad_token"));
  if (tok->pad_id < 0) tok->pad_id = id_of(*tok, "<|endoftext|>");
  auto add_bos = tc.find("add_bos_token");
  tok->add_bos = add_bos != tc.end() && add_bos->is_boolean() && add_bos->get<bool>();
  auto tmpl = tc.find("chat_template");
  if (tmpl != tc.end() && tmpl->is_string()) {
    tok->chat_template = tmpl->get<std::string>();
  } else if (tmpl != tc.end() && tmpl->is_array()) {
    for (const auto& t : *tmpl) {  // [{"name": "default", "template": "..."}, ...]
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
        tok->chat_template = t["template"].get<std::string>();
      }
    }
  }
  if (tok->chat_template.empty()) read_file((fs::path(dir) / "chat_template.jinja").string(), &tok->chat_template);
}

}  // namespace

std::string byte_to_unicode(uint8_t b) {
  // Printable bytes stand for themselves; the other 68 map, in byte order, to U+0100 onwards.
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  uint32_t cp = b;
  if (!printable(b)) {
    uint32_t n = 0;
    for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  append_utf8(cp, &s);
  return s;
}

TokenizerData tokenizer_fallback(const HfConfig& cfg) {
  TokenizerData tok;
  tok.is_fallback = true;
  for (int64_t i = 0; i < cfg.n_vocab; ++i) {
    if (i < 256) {
      tok.tokens.push_back(byte_to_unicode(static_cast<uint8_t>(i)));
      tok.token_types.push_back(kTokenNormal);
    } else {
      tok.tokens.push_back("[PAD" + std::to_string(i) + "]");
      tok.token_types.push_back(kTokenUnused);
    }
  }
  auto within = [&](int64_t id) { return id >= 0 && id < cfg.n_vocab ? id : -1; };
  tok.bos_id = within(cfg.bos_token_id);
  tok.eos_id = within(cfg.eos_token_id);
  return tok;
}

Result<TokenizerData> tokenizer_load(const std::string& dir, const HfConfig& cfg) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "tokenizer.json").string();
  std::string text;
  if (!read_file(path, &text)) {
    DS_LOG_WARN("convert: {} has no tokenizer.json; writing a byte-level fallback vocabulary of {} entries "
                "(256 byte tokens, no merges); text generated with it is not meaningful",
                dir, cfg.n_vocab);
    return tokenizer_fallback(cfg);
  }
  json tj;
  try {
    tj = json::parse(text);
  } catch (const json::exception& e) {
    return corrupt("{}: not valid JSON: {}", path, e.what());
  }
  if (!tj.is_object()) return corrupt("{}: top level is not a JSON object", path);
  TokenizerData tok;
  DS_TRY(read_vocab(tj, path, cfg.n_vocab, &tok));
  tok.pre = detect_pre(tj);
  read_tokenizer_config(dir, cfg, &tok);
  DS_LOG_INFO("convert: tokenizer: {} tokens, {} merges, pre {}, bos {}, eos {}, pad {}, chat template {} bytes",
              tok.tokens.size(), tok.merges.size(), tok.pre, tok.bos_id, tok.eos_id, tok.pad_id,
              tok.chat_template.size());
  return tok;
}

void tokenizer_write_metadata(const TokenizerData& tok, GgufWriter& w) {
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", tok.pre);
  w.set_array_string("tokenizer.ggml.tokens", tok.tokens);
  w.set_array_i32("tokenizer.ggml.token_type", tok.token_types);
  w.set_array_string("tokenizer.ggml.merges", tok.merges);
  if (tok.bos_id >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok.bos_id));
  if (tok.eos_id >= 0) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok.eos_id));
  if (tok.pad_id >= 0) w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(tok.pad_id));
  w.set_bool("tokenizer.ggml.add_bos_token", tok.add_bos);
  if (!tok.chat_template.empty()) w.set_string("tokenizer.chat_template", tok.chat_template);
}

}  // namespace ds::convert
