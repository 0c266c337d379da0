// The Qwen pre-tokenizer: splits text into the pieces BPE runs on, as the regex
//   qwen2:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen35: the same with \p{M} added wherever the letter class appears
//           ([^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+ and ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)
// would split it, implemented as a hand-written scanner over code points (no regex engine).
// Choices where regex dialects differ: \s is the Unicode White_Space property (as in the Rust/Oniguruma
// engines the tokenizer was trained with; JavaScript's \s adds U+FEFF and drops U+0085); the
// contractions match ASCII letters only (no U+017F for 's'); invalid UTF-8 bytes count as "other".
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ds::text {

enum class PreTokenizer { kQwen2, kQwen35 };

struct PieceSpan {
  uint32_t begin;  // byte offsets into the input
  uint32_t end;
};

// Appends the pieces of `text` (which must be shorter than 4 GiB) to `out`, covering it exactly.
void pretokenize(PreTokenizer kind, std::string_view text, std::vector<PieceSpan>* out);

}  // namespace ds::text
