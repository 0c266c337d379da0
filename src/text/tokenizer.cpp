// Byte-level BPE encoding and decoding. A piece is merged with a min-heap of adjacent pairs keyed by
// (merge rank, position), so equal ranks merge leftmost first as in the reference implementations,
// and results are memoized per thread (pieces repeat heavily in real text).
#include "text/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/check.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace ds {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

void MergeTable::reserve(size_t n_merges) {
  size_t cap = 16;
  while (cap < n_merges * 2) cap <<= 1;
  slots_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  count_ = 0;
}

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  DS_CHECK(count_ * 2 < slots_.size(), "merge table full ({} of {})", count_, slots_.size());
  uint64_t key = pack(left, right);
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) return;
    if (s.key == kEmpty) {
      s = Slot{key, rank, merged};
      ++count_;
      return;
    }
  }
}

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
};

struct Candidate {
  uint32_t rank;
  int32_t left;  // symbol index
  int32_t left_id;
  int32_t right_id;
  int32_t merged;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

// Transparent hashing lets the cache be probed with a string_view (no allocation on a hit).
struct PieceHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>> words;
};

constexpr size_t kCacheMaxEntries = 1 << 16;
constexpr size_t kCacheMaxPieceBytes = 64;

}  // namespace

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  for (unsigned char b : piece) {
    int32_t id = byte_token[b];
    if (id < 0) continue;  // vocabulary without this byte (checked and warned at load)
    int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({id, idx - 1, idx + 1});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  heap.clear();
  const auto cmp = std::greater<Candidate>();
  auto push_pair = [&](int32_t left) {
    int32_t right = syms[left].next;
    if (right < 0) return;
    uint32_t rank;
    int32_t merged;
    if (merges.find(syms[left].id, syms[right].id, &rank, &merged)) {
      heap.push_back({rank, left, syms[left].id, syms[right].id, merged});
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = syms[c.left];
    if (left.id != c.left_id || left.next < 0) continue;  // stale: left symbol changed or removed
    Symbol& right = syms[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.merged;
    right.id = -1;  // removed
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.left;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(c.left);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>* out) const {
  thread_local std::vector<text::PieceSpan> pieces;
  thread_local WordCache cache;
  if (cache.owner != serial) {
    cache.words.clear();
    cache.owner = serial;
  }
  pieces.clear();
  text::pretokenize(pre, text, &pieces);
  for (const text::PieceSpan& p : pieces) {
    std::string_view piece = text.substr(p.begin, p.end - p.begin);
    if (piece.size() > kCacheMaxPieceBytes) {
      bpe(piece, out);
      continue;
    }
    auto it = cache.words.find(piece);
    if (it != cache.words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      continue;
    }
    size_t start = out->size();
    bpe(piece, out);
    if (cache.words.size() >= kCacheMaxEntries) cache.words.clear();
    cache.words.emplace(std::string(piece), std::vector<int32_t>(out->begin() + start, out->end()));
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (!allow_special) {
    impl_->encode_plain(text, &out);
    return out;
  }
  size_t seg_start = 0, i = 0;
  while (i < text.size()) {
    const auto& bucket = impl_->specials[static_cast<unsigned char>(text[i])];
    const SpecialToken* hit = nullptr;
    for (const SpecialToken& s : bucket) {
      if (s.text.size() <= text.size() - i && std::memcmp(text.data() + i, s.text.data(), s.text.size()) == 0) {
        hit = &s;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > seg_start) impl_->encode_plain(text.substr(seg_start, i - seg_start), &out);
    out.push_back(hit->id);
    i += hit->text.size();
    seg_start = i;
  }
  if (seg_start < text.size()) impl_->encode_plain(text.substr(seg_start), &out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  for (int32_t id : tokens) {
    if (id >= 0 && id < n_vocab()) out += impl_->token_bytes[id];
  }
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  return id >= 0 && id < n_vocab() ? impl_->tokens[id] : std::string();
}
int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }

int32_t Tokenizer::find_token(std::string_view text) const {
  auto it = impl_->token_ids.find(std::string(text));
  return it == impl_->token_ids.end() ? -1 : it->second;
}

TokenType Tokenizer::token_type(int32_t id) const {
  return id >= 0 && id < n_vocab() ? impl_->types[id] : TokenType::kUnused;
}

bool Tokenizer::is_special(int32_t id) const {
  TokenType t = token_type(id);
  return t == TokenType::kControl || t == TokenType::kUserDefined;
}

const char* Tokenizer::pre_tokenizer_name() const {
  return impl_->pre == text::PreTokenizer::kQwen2 ? "qwen2" : "qwen35";
}

std::string StreamDecoder::push(int32_t token) {
  pending_ += tok_.decode({token});
  size_t n = text::utf8_complete_prefix(pending_);
  std::string out = text::utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = text::utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace ds
