// Hand-written scanner for the Qwen pre-tokenizer regexes. Each position tries the alternatives in
// regex order; backtracking in the two whitespace alternatives is resolved by looking at the whole
// whitespace run once (the last newline in the run, or whether a non-space follows it).
#include "text/pretokenize.h"

#include "core/check.h"
#include "text/unicode.h"

namespace ds::text {
namespace {

struct CodePoint {
  uint32_t cp;
  uint32_t offset;  // byte offset of its first byte
  uint8_t cls;      // UnicodeClass bits; letter_class has been folded into kClassLetter
};

constexpr uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

class Scanner {
 public:
  Scanner(const std::vector<CodePoint>& cps, uint32_t text_size) : cps_(cps), n_(cps.size()), size_(text_size) {}

  bool letter(size_t i) const { return i < n_ && (cps_[i].cls & kClassLetter); }
  bool number(size_t i) const { return i < n_ && (cps_[i].cls & kClassNumber); }
  bool space(size_t i) const { return i < n_ && (cps_[i].cls & kClassWhiteSpace); }
  bool newline(size_t i) const { return i < n_ && (cps_[i].cp == '\r' || cps_[i].cp == '\n'); }
  bool other(size_t i) const { return i < n_ && !(cps_[i].cls & (kClassLetter | kClassNumber | kClassWhiteSpace)); }
  uint32_t offset(size_t i) const { return i < n_ ? cps_[i].offset : size_; }

  // Length in code points of the piece starting at i (always >= 1).
  size_t match(size_t i) const {
    uint32_t c = cps_[i].cp;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c == '\'' && i + 1 < n_) {
      uint32_t c1 = lower_ascii(cps_[i + 1].cp);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
      if (i + 2 < n_) {
        uint32_t c2 = lower_ascii(cps_[i + 2].cp);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    size_t j = i;
    if (!letter(j) && !number(j) && !newline(j) && letter(j + 1)) ++j;
    if (letter(j)) {
      while (letter(j)) ++j;
      return j - i;
    }
    // \p{N}
    if (number(i)) return 1;
    // ' '?[^\s\p{L}\p{N}]+[\r\n]*
    j = (c == ' ' && other(i + 1)) ? i + 1 : i;
    if (other(j)) {
      while (other(j)) ++j;
      while (newline(j)) ++j;
      return j - i;
    }
    // \s*[\r\n]+ | \s+(?!\S) | \s+
    DS_CHECK(space(i), "code point U+{:04X} fits no pre-tokenizer class", c);
    size_t last_newline = SIZE_MAX;
    j = i;
    while (space(j)) {
      if (newline(j)) last_newline = j;
      ++j;
    }
    if (last_newline != SIZE_MAX) return last_newline + 1 - i;
    if (j == n_ || j - i == 1) return j - i;
    return j - 1 - i;
  }

 private:
  const std::vector<CodePoint>& cps_;
  size_t n_;
  uint32_t size_;
};

}  // namespace

void pretokenize(PreTokenizer kind, std::string_view text, std::vector<PieceSpan>* out) {
  DS_CHECK(text.size() < (1ull << 32), "pretokenize input of {} bytes", text.size());
  thread_local std::vector<CodePoint> cps;
  cps.clear();
  const bool marks_are_letters = kind == PreTokenizer::kQwen35;
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t offset = static_cast<uint32_t>(pos);
    uint32_t cp = utf8_decode(text, &pos);
    uint8_t cls = cp == kInvalidCodePoint ? 0 : unicode_class(cp);
    if (marks_are_letters && (cls & kClassMark)) cls |= kClassLetter;
    cps.push_back({cp, offset, cls});
  }
  Scanner scanner(cps, static_cast<uint32_t>(text.size()));
  size_t i = 0;
  while (i < cps.size()) {
    size_t len = scanner.match(i);
    out->push_back({scanner.offset(i), scanner.offset(i + len)});
    i += len;
  }
}

}  // namespace ds::text
