// Internal state of Tokenizer, shared by its construction (tokenizer_load.cpp) and encoding
// (tokenizer.cpp). Merges live in an open-addressing table keyed by the pair of token ids, because
// the BPE inner loop is one lookup per adjacent pair.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/pretokenize.h"
#include "text/tokenizer.h"

namespace ds {

// (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  void reserve(size_t n_merges);
  // Keeps the first (lowest-rank) entry for a pair.
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged);
  // Returns false when the pair does not merge.
  bool find(int32_t left, int32_t right, uint32_t* rank, int32_t* merged) const {
    if (slots_.empty()) return false;
    uint64_t key = pack(left, right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == kEmpty) return false;
      if (s.key == key) {
        *rank = s.rank;
        *merged = s.merged;
        return true;
      }
    }
  }
  size_t size() const { return count_; }

 private:
  struct Slot {
    uint64_t key;
    uint32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
};

struct SpecialToken {
  std::string text;
  int32_t id;
};

struct Tokenizer::Impl {
  std::string source;
  std::vector<std::string> tokens;
  std::vector<TokenType> types;
  std::vector<std::string> token_bytes;  // decoded bytes per id
  std::unordered_map<std::string, int32_t> token_ids;
  std::array<int32_t, 256> byte_token{};  // id of the single-byte token, -1 if absent
  MergeTable merges;
  // Control and user-defined tokens by first byte, longest first.
  std::array<std::vector<SpecialToken>, 256> specials;
  text::PreTokenizer pre = text::PreTokenizer::kQwen35;
  int32_t bos = -1, eos = -1, pad = -1;
  uint64_t serial = 0;  // distinguishes tokenizers in the per-thread word cache

  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>* out) const;
};

// GPT-2 bytes_to_unicode: the code point that stands for byte b in the BPE alphabet.
uint32_t byte_to_codepoint(uint8_t b);

}  // namespace ds
