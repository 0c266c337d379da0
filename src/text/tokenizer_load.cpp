// Building a Tokenizer from GGUF metadata, from a Hugging Face tokenizer.json, or from a plain
// TokenizerVocab. Recoverable oddities of real files (out-of-range special ids, merges naming unknown
// tokens, a missing pre-tokenizer name) warn and continue; wrong tokenizer kinds are rejected.
#include <atomic>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace ds {

// The split regex of Qwen2/Qwen3 tokenizer.json files, and its Qwen3.5 form with \p{M}.
constexpr std::string_view kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

uint32_t byte_to_codepoint(uint8_t b) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (int i = 0; i < 256; ++i) {
      bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      t[i] = printable ? i : next++;
    }
    return t;
  }();
  return table[b];
}

namespace {

// Inverse of byte_to_codepoint for the 324 code points it uses; -1 elsewhere.
int codepoint_to_byte(uint32_t cp) {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_codepoint(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

std::string bytes_of_token(const std::string& text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    uint32_t cp = text::utf8_decode(text, &pos);
    int b = cp == text::kInvalidCodePoint ? -1 : codepoint_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(text, start, pos - start);
    }
  }
  return out;
}

int32_t checked_special_id(int64_t id, size_t n_vocab, const char* what, const std::string& source) {
  if (id < 0) return -1;
  if (id >= static_cast<int64_t>(n_vocab)) {
    DS_LOG_WARN("{}: {} token id {} is outside the vocabulary of {}; disabled", source, what, id, n_vocab);
    return -1;
  }
  return static_cast<int32_t>(id);
}

std::atomic<uint64_t> g_tokenizer_serial{1};

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_vocab(TokenizerVocab vocab) {
  auto impl = std::make_unique<Impl>();
  impl->source = vocab.source.empty() ? "<vocab>" : vocab.source;
  const std::string& src = impl->source;
  const size_t n_vocab = vocab.tokens.size();
  if (n_vocab == 0) return invalid_argument("{}: tokenizer has no tokens", src);
  if (n_vocab > static_cast<size_t>(INT32_MAX)) return invalid_argument("{}: {} tokens is too many", src, n_vocab);
  if (!vocab.token_types.empty() && vocab.token_types.size() != n_vocab) {
    return corrupt("{}: {} token types for {} tokens", src, vocab.token_types.size(), n_vocab);
  }
  if (vocab.pre.empty()) {
    DS_LOG_WARN("{}: no pre-tokenizer name; using qwen35", src);
    impl->pre = text::PreTokenizer::kQwen35;
  } else if (vocab.pre == "qwen2") {
    impl->pre = text::PreTokenizer::kQwen2;
  } else if (vocab.pre == "qwen35") {
    impl->pre = text::PreTokenizer::kQwen35;
  } else {
    return unsupported("{}: unknown pre-tokenizer type '{}' (supported: qwen2, qwen35)", src, vocab.pre);
  }

  impl->types.resize(n_vocab, TokenType::kNormal);
  impl->token_bytes.resize(n_vocab);
  impl->token_ids.reserve(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) {
    if (!vocab.token_types.empty()) {
      int32_t t = vocab.token_types[i];
      if (t < 1 || t > 6) return corrupt("{}: token {} has type {}, expected 1..6", src, i, t);
      impl->types[i] = static_cast<TokenType>(t);
    }
    const std::string& text = vocab.tokens[i];
    impl->token_ids.emplace(text, static_cast<int32_t>(i));  // first id wins for duplicates
    bool literal = impl->types[i] == TokenType::kControl || impl->types[i] == TokenType::kUserDefined;
    impl->token_bytes[i] = literal ? text : bytes_of_token(text);
    if (literal && !text.empty()) {
      impl->specials[static_cast<unsigned char>(text[0])].push_back({text, static_cast<int32_t>(i)});
    }
  }
  for (auto& bucket : impl->specials) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const SpecialToken& a, const SpecialToken& b) { return a.text.size() > b.text.size(); });
  }
  int missing_bytes = 0;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    text::utf8_append(&s, byte_to_codepoint(static_cast<uint8_t>(b)));
    auto it = impl->token_ids.find(s);
    impl->byte_token[b] = it == impl->token_ids.end() ? -1 : it->second;
    missing_bytes += it == impl->token_ids.end();
  }
  if (missing_bytes > 0) {
    DS_LOG_WARN("{}: {} of 256 byte tokens missing from the vocabulary; those bytes are dropped", src,
                missing_bytes);
  }

  impl->merges.reserve(vocab.merges.size());
  size_t skipped = 0;
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& m = vocab.merges[rank];
    size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) return corrupt("{}: merge {} '{}' is not 'left right'", src, rank, m);
    std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    auto l = impl->token_ids.find(left), r = impl->token_ids.find(right), c = impl->token_ids.find(left + right);
    if (l == impl->token_ids.end() || r == impl->token_ids.end() || c == impl->token_ids.end()) {
      ++skipped;
      continue;
    }
    impl->merges.insert(l->second, r->second, static_cast<uint32_t>(rank), c->second);
  }
  if (skipped > 0) DS_LOG_WARN("{}: {} merges name tokens not in the vocabulary; ignored", src, skipped);

  impl->bos = checked_special_id(vocab.bos_id, n_vocab, "bos", src);
  impl->eos = checked_special_id(vocab.eos_id, n_vocab, "eos", src);
  impl->pad = checked_special_id(vocab.pad_id, n_vocab, "padding", src);
  impl->tokens = std::move(vocab.tokens);
  impl->serial = g_tokenizer_serial.fetch_add(1);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

namespace {

Status parse_hf_json(const nlohmann::json& j, const std::string& path, TokenizerVocab* vocab) {
  const auto& model = j.at("model");
  if (model.value("type", "") != "BPE") {
    return unsupported("{}: model.type is '{}', expected 'BPE'", path, model.value("type", ""));
  }
  int64_t max_id = -1;
  for (const auto& [text, id] : model.at("vocab").items()) max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
    max_id = std::max<int64_t>(max_id, t.at("id").get<int64_t>());
  }
  // Ids index a dense table: bound them by the number of entries (with room for padding gaps).
  const int64_t n_entries = static_cast<int64_t>(model.at("vocab").size() + j.value("added_tokens", nlohmann::json::array()).size());
  if (max_id < 0 || max_id > 2 * n_entries + 1024) {
    return corrupt("{}: vocabulary ids end at {}, expected below {} for {} entries", path, max_id, 2 * n_entries + 1024,
                   n_entries);
  }
  vocab->tokens.assign(max_id + 1, std::string());
  vocab->token_types.assign(max_id + 1, 0);
  for (const auto& [text, id] : model.at("vocab").items()) {
    int64_t i = id.get<int64_t>();
    if (i < 0) return corrupt("{}: token '{}' has negative id {}", path, text, i);
    vocab->tokens[i] = text;
    vocab->token_types[i] = static_cast<int32_t>(TokenType::kNormal);
  }
  for (const auto& t : j.value("added_tokens", nlohmann::json::array())) {
    int64_t i = t.at("id").get<int64_t>();
    if (i < 0) return corrupt("{}: added token has negative id {}", path, i);
    vocab->tokens[i] = t.at("content").get<std::string>();
    bool special = t.value("special", false);
    vocab->token_types[i] = static_cast<int32_t>(special ? TokenType::kControl : TokenType::kUserDefined);
  }
  for (size_t i = 0; i < vocab->tokens.size(); ++i) {
    if (vocab->token_types[i] == 0) {
      vocab->tokens[i] = "[PAD" + std::to_string(i) + "]";
      vocab->token_types[i] = static_cast<int32_t>(TokenType::kUnused);
    }
  }
  for (const auto& m : model.at("merges")) {
    if (m.is_array() && m.size() == 2) {
      vocab->merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      vocab->merges.push_back(m.get<std::string>());
    }
  }
  // The pre-tokenizer: find the Split pattern anywhere in the pre_tokenizer section.
  std::string pattern;
  const auto& pre = j.at("pre_tokenizer");
  std::vector<const nlohmann::json*> stack = {&pre};
  while (!stack.empty()) {
    const nlohmann::json* node = stack.back();
    stack.pop_back();
    if (node->is_object() && node->value("type", "") == "Split" && node->contains("pattern")) {
      pattern = node->at("pattern").value("Regex", "");
    }
    if (node->is_object() && node->contains("pretokenizers")) {
      for (const auto& child : node->at("pretokenizers")) stack.push_back(&child);
    }
  }
  if (pattern == kQwen2SplitPattern) {
    vocab->pre = "qwen2";
  } else if (pattern == kQwen35SplitPattern) {
    vocab->pre = "qwen35";
  } else {
    return unsupported("{}: unsupported pre-tokenizer split pattern '{}'", path, pattern);
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_json(const std::string& path) {
  DS_ASSIGN_OR_RETURN(TokenizerVocab vocab, vocab_from_hf_json(path));
  return from_vocab(std::move(vocab));
}

Result<TokenizerVocab> Tokenizer::vocab_from_hf_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("{}: cannot open tokenizer file", path);
  std::stringstream buf;
  buf << in.rdbuf();
  TokenizerVocab vocab;
  vocab.source = path;
  try {
    nlohmann::json j = nlohmann::json::parse(buf.str());
    DS_TRY(parse_hf_json(j, path, &vocab));
  } catch (const nlohmann::json::exception& e) {
    return corrupt("{}: not a usable tokenizer.json: {}", path, e.what());
  }
  // Qwen conventions when the file itself does not say: <|endoftext|> pads and ends.
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.tokens[i] == "<|endoftext|>") vocab.eos_id = vocab.pad_id = static_cast<int64_t>(i);
  }
  return vocab;
}

}  // namespace ds
