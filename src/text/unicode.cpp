// UTF-8 helpers and Unicode class lookup. The BMP table is 64 KiB, built on first use from the
// generated ranges; code points above it (rare in text) binary-search the range arrays.
#include "text/unicode.h"

#include <array>
#include <memory>

namespace ds::text {
namespace {

bool in_ranges(const UnicodeRange* ranges, int64_t n, uint32_t cp) {
  int64_t lo = 0, hi = n - 1;
  while (lo <= hi) {
    int64_t mid = (lo + hi) / 2;
    if (cp < ranges[mid].first) {
      hi = mid - 1;
    } else if (cp > ranges[mid].last) {
      lo = mid + 1;
    } else {
      return true;
    }
  }
  return false;
}

uint8_t class_by_search(uint32_t cp) {
  uint8_t c = 0;
  if (in_ranges(kUnicodeLetterRanges, kUnicodeLetterRangeCount, cp)) c |= kClassLetter;
  if (in_ranges(kUnicodeMarkRanges, kUnicodeMarkRangeCount, cp)) c |= kClassMark;
  if (in_ranges(kUnicodeNumberRanges, kUnicodeNumberRangeCount, cp)) c |= kClassNumber;
  if (in_ranges(kUnicodeWhiteSpaceRanges, kUnicodeWhiteSpaceRangeCount, cp)) c |= kClassWhiteSpace;
  return c;
}

const uint8_t* bmp_table() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(0x10000);
    for (uint32_t cp = 0; cp < 0x10000; ++cp) t[cp] = class_by_search(cp);
    return t;
  }();
  return table.get();
}

}  // namespace

uint8_t unicode_class(uint32_t cp) {
  if (cp < 0x10000) return bmp_table()[cp];
  if (cp > 0x10FFFF) return 0;
  return class_by_search(cp);
}

uint32_t utf8_decode(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = *pos, n = s.size();
  uint8_t b0 = p[i];
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  int len;
  uint32_t cp, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    *pos = i + 1;
    return kInvalidCodePoint;
  }
  if (i + len > n) {
    *pos = i + 1;
    return kInvalidCodePoint;
  }
  for (int k = 1; k < len; ++k) {
    uint8_t b = p[i + k];
    if ((b & 0xC0) != 0x80) {
      *pos = i + 1;
      return kInvalidCodePoint;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    *pos = i + 1;
    return kInvalidCodePoint;
  }
  *pos = i + len;
  return cp;
}

void utf8_append(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// True if s[i..] (shorter than the sequence its lead byte announces) could still become valid.
bool utf8_valid_partial(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  uint8_t b0 = p[i];
  int len = b0 >= 0xC2 && b0 <= 0xDF ? 2 : b0 >= 0xE0 && b0 <= 0xEF ? 3 : b0 >= 0xF0 && b0 <= 0xF4 ? 4 : 0;
  if (len == 0 || i + len <= s.size()) return false;
  for (size_t k = i + 1; k < s.size(); ++k) {
    uint8_t b = p[k];
    if ((b & 0xC0) != 0x80) return false;
    if (k == i + 1) {  // second byte limits: no overlongs, surrogates or values above U+10FFFF
      if (b0 == 0xE0 && b < 0xA0) return false;
      if (b0 == 0xED && b >= 0xA0) return false;
      if (b0 == 0xF0 && b < 0x90) return false;
      if (b0 == 0xF4 && b >= 0x90) return false;
    }
  }
  return true;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last three bytes can start an incomplete sequence.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    if (utf8_valid_partial(s, i)) {
      // i must itself be a sequence boundary: check that decoding reaches it.
      size_t pos = 0;
      while (pos < i) utf8_decode(s, &pos);
      if (pos == i) return i;
    }
  }
  return s.size();
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp = utf8_decode(s, &pos);
    if (cp == kInvalidCodePoint) {
      utf8_append(&out, 0xFFFD);
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  return out;
}

}  // namespace ds::text
