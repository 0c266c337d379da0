// Pre-tokenizer and Unicode helper tests: the Qwen split rules on inputs whose expected pieces were
// worked out by hand from the regex, the qwen2/qwen35 difference on combining marks, and UTF-8 handling.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "text/pretokenize.h"
#include "text/unicode.h"

namespace ds {
namespace {

std::vector<std::string> split(text::PreTokenizer kind, std::string_view s) {
  std::vector<text::PieceSpan> spans;
  text::pretokenize(kind, s, &spans);
  std::vector<std::string> out;
  for (auto sp : spans) out.emplace_back(s.substr(sp.begin, sp.end - sp.begin));
  return out;
}

using Pieces = std::vector<std::string>;
constexpr auto kQwen2 = text::PreTokenizer::kQwen2;
constexpr auto kQwen35 = text::PreTokenizer::kQwen35;

// Expected splits worked out by hand from the regex alternatives, in order:
// contractions | optional non-letter + letters | one digit | optional space + punctuation + newlines |
// whitespace ending in a newline | whitespace not followed by a non-space | whitespace.
TEST(TextPretokenize, LettersDigitsPunctuation) {
  EXPECT_EQ(split(kQwen2, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split(kQwen2, "x=123;"), (Pieces{"x", "=", "1", "2", "3", ";"}));
  EXPECT_EQ(split(kQwen2, "(hello) ((x"), (Pieces{"(hello", ")", " ((", "x"}));
  EXPECT_EQ(split(kQwen2, "a !?\n\nb"), (Pieces{"a", " !?\n\n", "b"}));
  EXPECT_EQ(split(kQwen2, ""), Pieces{});
}

TEST(TextPretokenize, Contractions) {
  EXPECT_EQ(split(kQwen2, "I'm we'LL they'Ve it's"), (Pieces{"I", "'m", " we", "'LL", " they", "'Ve", " it", "'s"}));
  // Not a contraction: the apostrophe joins the following letters.
  EXPECT_EQ(split(kQwen2, "'xyz"), (Pieces{"'xyz"}));
  // ASCII only: U+017F (long s) is a letter, not an 's'.
  EXPECT_EQ(split(kQwen2, "a'\u017F"), (Pieces{"a", "'\u017F"}));
}

TEST(TextPretokenize, Whitespace) {
  EXPECT_EQ(split(kQwen2, "a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(split(kQwen2, "a \n  b"), (Pieces{"a", " \n", " ", " b"}));
  EXPECT_EQ(split(kQwen2, "x   "), (Pieces{"x", "   "}));
  EXPECT_EQ(split(kQwen2, "\t\tx"), (Pieces{"\t", "\tx"}));
  EXPECT_EQ(split(kQwen2, " 1"), (Pieces{" ", "1"}));
  EXPECT_EQ(split(kQwen2, "a\r\n\r\nb"), (Pieces{"a", "\r\n\r\n", "b"}));
  // U+0085 is White_Space (a letter prefix here); U+FEFF is not (it is punctuation-like "other").
  EXPECT_EQ(split(kQwen2, "a\u0085b"), (Pieces{"a", "\u0085b"}));
  EXPECT_EQ(split(kQwen2, "a \uFEFF"), (Pieces{"a", " \uFEFF"}));
}

TEST(TextPretokenize, MarksJoinLettersOnlyInQwen35) {
  const std::string s = "cafe\u0301 x\u0301\u0302";
  EXPECT_EQ(split(kQwen2, s), (Pieces{"cafe", "\u0301", " x", "\u0301\u0302"}));
  EXPECT_EQ(split(kQwen35, s), (Pieces{"cafe\u0301", " x\u0301\u0302"}));
}

TEST(TextPretokenize, InvalidUtf8IsCoveredExactly) {
  const std::string s = "ab\xff\xfe cd\xe2\x82";
  auto pieces = split(kQwen2, s);
  std::string joined;
  for (auto& p : pieces) joined += p;
  EXPECT_EQ(joined, s);
  EXPECT_EQ(pieces.front(), "ab");
}

TEST(TextUnicode, ClassesAndDecoding) {
  EXPECT_EQ(text::unicode_class('a'), text::kClassLetter);
  EXPECT_EQ(text::unicode_class(0x4E2D), text::kClassLetter);   // 中
  EXPECT_EQ(text::unicode_class(0x0301), text::kClassMark);
  EXPECT_EQ(text::unicode_class(0x0663), text::kClassNumber);   // Arabic-Indic three
  EXPECT_EQ(text::unicode_class(0x3000), text::kClassWhiteSpace);
  EXPECT_EQ(text::unicode_class(0x1D400), text::kClassLetter);  // mathematical bold A
  EXPECT_EQ(text::unicode_class('!'), 0);
  std::string s = "\xed\xa0\x80";  // a surrogate: invalid
  size_t pos = 0;
  EXPECT_EQ(text::utf8_decode(s, &pos), text::kInvalidCodePoint);
  EXPECT_EQ(pos, 1u);
  EXPECT_EQ(text::utf8_complete_prefix("ab\xe2\x82"), 2u);
  EXPECT_EQ(text::utf8_complete_prefix("ab\xe2\x82\xac"), 5u);
  EXPECT_EQ(text::utf8_complete_prefix("ab\xff"), 3u);
  EXPECT_EQ(text::utf8_sanitize("a\xffz"), "a\xEF\xBF\xBDz");
}

}  // namespace
}  // namespace ds
