// UTF-8 decoding and the Unicode character classes the pre-tokenizer needs (L, M, N, White_Space).
// Classes are looked up in a flat per-code-point table for the Basic Multilingual Plane (built once
// from the generated range arrays) and by binary search above it, so the hot path is one load.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ds::text {

struct UnicodeRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

// Generated tables (unicode_tables.cpp).
extern const char* const kUnicodeVersion;
extern const UnicodeRange kUnicodeLetterRanges[];
extern const int64_t kUnicodeLetterRangeCount;
extern const UnicodeRange kUnicodeMarkRanges[];
extern const int64_t kUnicodeMarkRangeCount;
extern const UnicodeRange kUnicodeNumberRanges[];
extern const int64_t kUnicodeNumberRangeCount;
extern const UnicodeRange kUnicodeWhiteSpaceRanges[];
extern const int64_t kUnicodeWhiteSpaceRangeCount;

enum UnicodeClass : uint8_t {
  kClassLetter = 1,
  kClassMark = 2,
  kClassNumber = 4,
  kClassWhiteSpace = 8,
};

// Bit set of UnicodeClass values for a code point (0 for "other", invalid and unassigned).
uint8_t unicode_class(uint32_t cp);

// Decodes one code point at `pos`, advancing it. Invalid or truncated sequences (including overlong
// forms and surrogates) consume exactly one byte and return kInvalidCodePoint.
constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;
uint32_t utf8_decode(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `cp` (which must be a valid scalar value).
void utf8_append(std::string* out, uint32_t cp);

// Length of the longest prefix of `s` that is complete, valid UTF-8 when more bytes may still follow:
// a trailing sequence that is a valid beginning of a code point is excluded. Invalid bytes before the
// end count as complete (the caller replaces them).
size_t utf8_complete_prefix(std::string_view s);

// `s` with every invalid byte replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

}  // namespace ds::text
