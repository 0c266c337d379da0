// State stream writer and verifying reader (format table in state_io.h). The reader bounds every
// length against the stream and the layout before copying, and checks each checksum.
// Non-obvious choice: the payloads move between the stream and the state's KV slots and recurrent
// buffer as one batch of copy regions (device_copy_regions) on any device, ordered so that a slot's
// pieces are adjacent: a device state costs one synchronization and about its bytes over the host
// link, and the bytes do not depend on the device the state lives on.
#include "state/state_io.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"

namespace ds {
namespace {

constexpr size_t kHeaderBytes = 64;
constexpr uint32_t kFlagRecurrent = 1u << 0;
constexpr uint32_t kFlagLogits = 1u << 1;
constexpr uint32_t kMaxNameLen = 64;

enum class SectionKind : uint8_t { kLogits, kKey, kValue, kConv, kSsm };

struct SectionSpec {
  std::string name;
  int n_dims;
  int64_t ne[4];
  DType dtype = DType::F32;
  SectionKind kind = SectionKind::kLogits;
  int64_t layer = -1;       // the model layer (all but logits)
  int64_t attn_index = -1;  // K / V: the layer's index among attention layers
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_bytes() const { return n_elements() * dtype_block_bytes(dtype); }
};

// The sections a stream with these flags carries, in order.
std::vector<SectionSpec> expected_sections(const StateLayout& l, int64_t n_tokens, uint32_t flags, int64_t first,
                                           int64_t last) {
  std::vector<SectionSpec> out;
  if (flags & kFlagLogits) out.push_back({"logits", 1, {l.n_vocab, 1, 1, 1}});
  int64_t ai = 0;
  for (int64_t il = 0; il < last; ++il) {
    if (l.kinds[static_cast<size_t>(il)] != LayerStateKind::kAttention) continue;
    if (il >= first) {
      const std::string blk = "blk." + std::to_string(il);
      out.push_back({blk + ".attn.k", 3, {l.head_dim, l.n_head_kv, n_tokens, 1}, l.kv_dtype, SectionKind::kKey, il, ai});
      out.push_back({blk + ".attn.v", 3, {l.head_dim, l.n_head_kv, n_tokens, 1}, l.kv_dtype, SectionKind::kValue, il, ai});
    }
    ++ai;
  }
  if (flags & kFlagRecurrent) {
    for (int64_t il = first; il < last; ++il) {
      if (l.kinds[static_cast<size_t>(il)] == LayerStateKind::kRecurrent) {
        const std::string blk = "blk." + std::to_string(il);
        out.push_back({blk + ".deltanet.conv", 2, {l.conv_dim, l.conv_kernel - 1, 1, 1}, DType::F32, SectionKind::kConv, il});
        out.push_back({blk + ".deltanet.ssm", 3, {l.ssm_dv, l.ssm_dk, l.ssm_nv, 1}, DType::F32, SectionKind::kSsm, il});
      }
    }
  }
  return out;
}

// The device copies between a state and the payloads of a stream's sections (payload[i] is section
// i's bytes in the stream): a host region and a state region per piece, KV chunk by chunk and within
// a chunk in slot order, so the pieces of one slot are adjacent in the state and move as one transfer.
// The logits (host memory on every device) are not among them.
std::vector<CopyRegion> state_regions(const SequenceState& st, const std::vector<SectionSpec>& sections,
                                      const std::vector<uint8_t*>& payload, int64_t n_tokens, bool to_state) {
  const StateLayout& l = st.layout();
  const KvPool& pool = *st.pool();
  const int64_t row = l.n_head_kv * l.head_dim * dtype_block_bytes(l.kv_dtype);  // bytes per token
  std::vector<CopyRegion> regions;
  auto add = [&](uint8_t* host, void* state, int64_t bytes) {
    regions.push_back(to_state ? CopyRegion{state, host, bytes} : CopyRegion{host, state, bytes});
  };
  for (int64_t t0 = 0; t0 < n_tokens; t0 += l.kv_chunk_tokens) {
    const int64_t c = t0 / l.kv_chunk_tokens;
    const int64_t n = std::min(l.kv_chunk_tokens, n_tokens - t0);
    uint8_t* slot = pool.slot_data(st.block_table()[static_cast<size_t>(c)]);
    for (size_t i = 0; i < sections.size(); ++i) {
      const SectionSpec& s = sections[i];
      if (s.kind == SectionKind::kKey) add(payload[i] + t0 * row, slot + pool.k_offset(s.attn_index), n * row);
      if (s.kind == SectionKind::kValue) add(payload[i] + t0 * row, slot + pool.v_offset(s.attn_index), n * row);
    }
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    const SectionSpec& s = sections[i];
    if (s.kind == SectionKind::kConv || s.kind == SectionKind::kSsm) {
      const TensorView t = s.kind == SectionKind::kConv ? st.conv_state(s.layer) : st.ssm_state(s.layer);
      DS_CHECK(t.n_bytes() == s.n_bytes(), "section '{}' of {} bytes, state tensor of {}", s.name, s.n_bytes(),
               t.n_bytes());
      add(payload[i], t.data, s.n_bytes());
    }
  }
  return regions;
}

template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  b.insert(b.end(), raw, raw + sizeof(T));
}

template <typename T>
T get_at(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}


}  // namespace

Result<std::vector<uint8_t>> state_serialize(const SequenceState& st, int64_t n_tokens, int64_t layer_first,
                                             int64_t layer_last) {
  const StateLayout& l = st.layout();
  if (n_tokens < 0 || n_tokens > st.pos()) {
    return invalid_argument("state_serialize: boundary {} outside [0, {}]", n_tokens, st.pos());
  }
  if (layer_last < 0) layer_last = l.n_layer();
  if (layer_first < 0 || layer_first >= layer_last || layer_last > l.n_layer()) {
    return invalid_argument("state_serialize: layer range [{}, {}) outside [0, {})", layer_first, layer_last, l.n_layer());
  }
  uint32_t flags = 0;
  if (n_tokens == st.pos()) {
    if (!st.has_recurrent() && n_tokens > 0 && l.n_layer() != l.n_attention_layers()) {
      return invalid_argument("state_serialize: the state has no recurrent part at position {}", n_tokens);
    }
    flags |= kFlagRecurrent;
    if (st.logits_valid()) flags |= kFlagLogits;
  }
  const auto sections = expected_sections(l, n_tokens, flags, layer_first, layer_last);
  std::vector<uint8_t> out;
  put<uint32_t>(out, kStateMagic);
  put<uint16_t>(out, kStateVersion);
  put<uint16_t>(out, kStateVersion);
  put<uint64_t>(out, l.fingerprint());
  put<int64_t>(out, n_tokens);
  put<uint32_t>(out, flags);
  put<uint32_t>(out, static_cast<uint32_t>(sections.size()));
  put<uint32_t>(out, static_cast<uint32_t>(layer_first));
  put<uint32_t>(out, static_cast<uint32_t>(layer_last));
  out.resize(56, 0);
  put<uint64_t>(out, XXH3_64bits(out.data(), 56));

  size_t total = out.size();
  for (const SectionSpec& sec : sections) total += 4 + sec.name.size() + 4 + 4 + 32 + 8 + 8 + 8 + sec.n_bytes();
  out.reserve(total);  // one allocation: the stream is hundreds of MB for a long prompt
  // The section headers, each payload's place left for it ...
  std::vector<size_t> sum_at(sections.size());
  std::vector<size_t> payload_at(sections.size());
  for (size_t i = 0; i < sections.size(); ++i) {
    const SectionSpec& sec = sections[i];
    const size_t start = out.size();
    put<uint32_t>(out, static_cast<uint32_t>(sec.name.size()));
    out.insert(out.end(), sec.name.begin(), sec.name.end());
    put<uint32_t>(out, static_cast<uint32_t>(sec.dtype));
    put<uint32_t>(out, static_cast<uint32_t>(sec.n_dims));
    for (int64_t ne : sec.ne) put<int64_t>(out, ne);
    put<uint64_t>(out, static_cast<uint64_t>(sec.n_bytes()));
    put<uint64_t>(out, XXH3_64bits(out.data() + start, out.size() - start));
    sum_at[i] = out.size();
    put<uint64_t>(out, 0);  // the payload's checksum, once it is written
    payload_at[i] = out.size();
    out.resize(out.size() + static_cast<size_t>(sec.n_bytes()));
  }
  DS_CHECK(out.size() == total, "state stream of {} bytes, {} computed", out.size(), total);
  // ... then the payloads straight from the state, in one batch of copies.
  std::vector<uint8_t*> payload(sections.size());
  for (size_t i = 0; i < sections.size(); ++i) payload[i] = out.data() + payload_at[i];
  DS_TRY(device_copy_regions(Device{}, st.pool()->device(), state_regions(st, sections, payload, n_tokens, false)));
  for (size_t i = 0; i < sections.size(); ++i) {
    const size_t n = static_cast<size_t>(sections[i].n_bytes());
    if (sections[i].kind == SectionKind::kLogits) std::memcpy(payload[i], st.logits().data(), n);
    const uint64_t sum = XXH3_64bits(payload[i], n);
    std::memcpy(out.data() + sum_at[i], &sum, sizeof(sum));
  }
  return out;
}

namespace {

// Verifies a stream and writes it into `st` (fresh at position 0, or at the stream's position).
Status load_into(std::span<const uint8_t> bytes, SequenceState& state) {
  SequenceState* st = &state;
  const StateLayout& l = st->layout();
  if (bytes.size() < kHeaderBytes) {
    return corrupt("state stream: {} bytes is shorter than the {}-byte header", bytes.size(), kHeaderBytes);
  }
  const uint8_t* h = bytes.data();
  if (get_at<uint32_t>(h) != kStateMagic) {
    return corrupt("state stream: bad magic 0x{:08x} (expected 0x{:08x})", get_at<uint32_t>(h), kStateMagic);
  }
  if (get_at<uint64_t>(h + 56) != XXH3_64bits(h, 56)) return corrupt("state stream: header checksum mismatch");
  const uint16_t min_reader = get_at<uint16_t>(h + 6);
  if (min_reader > kStateVersion) {
    return unsupported("state stream: needs reader version {}, this build reads version {}; upgrade deltaserve",
                       min_reader, kStateVersion);
  }
  if (get_at<uint64_t>(h + 8) != l.fingerprint()) {
    return invalid_argument("state stream: fingerprint {:016x} is from another model or state layout (this model: {:016x})",
                            get_at<uint64_t>(h + 8), l.fingerprint());
  }
  const int64_t n_tokens = get_at<int64_t>(h + 16);
  const uint32_t flags = get_at<uint32_t>(h + 24);
  const uint32_t n_sections = get_at<uint32_t>(h + 28);
  if (n_tokens < 0 || n_tokens > l.n_ctx) {
    return corrupt("state stream: {} tokens outside the context [0, {}]", n_tokens, l.n_ctx);
  }
  if ((flags & ~(kFlagRecurrent | kFlagLogits)) != 0 || ((flags & kFlagLogits) && !(flags & kFlagRecurrent))) {
    return corrupt("state stream: unknown flags 0x{:x}", flags);
  }
  const int64_t first = get_at<uint32_t>(h + 32), last = get_at<uint32_t>(h + 36);
  if (first >= last || last > l.n_layer()) {
    return corrupt("state stream: layer range [{}, {}) outside this model's [0, {})", first, last, l.n_layer());
  }
  for (size_t i = 40; i < 56; ++i) {
    if (h[i] != 0) return corrupt("state stream: reserved header byte {} is not zero", i);
  }
  const auto specs = expected_sections(l, n_tokens, flags, first, last);
  if (n_sections != specs.size()) {
    return corrupt("state stream: {} sections, expected {}", n_sections, specs.size());
  }
  if (!(st->pos() == 0 && st->n_kv_chunks() == 0) && st->pos() != n_tokens) {
    return invalid_argument("state stream: a stream at position {} cannot be merged into a state at position {}",
                            n_tokens, st->pos());
  }
  DS_TRY(st->kv_reserve(n_tokens));
  // Every section is verified before any byte reaches the state; a layer-range stream writes only its
  // layers' pieces, so the state's other layers keep their contents.
  std::vector<uint8_t*> payloads(specs.size());
  size_t off = kHeaderBytes;
  for (const SectionSpec& s : specs) {
    const size_t start = off;
    auto need = [&](size_t n) -> Status {
      if (bytes.size() - off < n) return corrupt("state stream: section '{}' truncated at offset {}", s.name, off);
      return Status::ok();
    };
    DS_TRY(need(4));
    const uint32_t name_len = get_at<uint32_t>(h + off);
    off += 4;
    if (name_len > kMaxNameLen) return corrupt("state stream: section name of {} bytes at offset {}", name_len, start);
    DS_TRY(need(name_len + 4 + 4 + 32 + 8 + 8 + 8));
    const std::string name(reinterpret_cast<const char*>(h + off), name_len);
    off += name_len;
    if (name != s.name) return corrupt("state stream: section '{}' at offset {}, expected '{}'", name, start, s.name);
    const uint32_t dtype = get_at<uint32_t>(h + off);
    const uint32_t n_dims = get_at<uint32_t>(h + off + 4);
    int64_t ne[4];
    for (int d = 0; d < 4; ++d) ne[d] = get_at<int64_t>(h + off + 8 + 8 * d);
    const uint64_t payload = get_at<uint64_t>(h + off + 40);
    off += 48;
    const uint64_t header_sum = get_at<uint64_t>(h + off);
    const uint64_t payload_sum = get_at<uint64_t>(h + off + 8);
    if (header_sum != XXH3_64bits(h + start, off - start)) {
      return corrupt("state stream: section '{}' header checksum mismatch at offset {}", s.name, start);
    }
    off += 16;
    if (dtype != static_cast<uint32_t>(s.dtype) || n_dims != static_cast<uint32_t>(s.n_dims) ||
        ne[0] != s.ne[0] || ne[1] != s.ne[1] || ne[2] != s.ne[2] || ne[3] != s.ne[3] ||
        payload != static_cast<uint64_t>(s.n_bytes())) {
      return invalid_argument("state stream: section '{}' has shape [{}, {}, {}, {}] dtype {}, this model expects [{}, {}, {}, {}] {}",
                              s.name, ne[0], ne[1], ne[2], ne[3], dtype, s.ne[0], s.ne[1], s.ne[2], s.ne[3],
                              dtype_name(s.dtype));
    }
    DS_TRY(need(payload));
    if (payload_sum != XXH3_64bits(h + off, payload)) {
      return corrupt("state stream: section '{}' payload checksum mismatch at offset {}", s.name, off);
    }
    payloads[static_cast<size_t>(&s - specs.data())] = const_cast<uint8_t*>(h + off);
    off += payload;
  }
  if (off != bytes.size()) return corrupt("state stream: {} trailing bytes after the last section", bytes.size() - off);
  DS_TRY(device_copy_regions(st->pool()->device(), Device{}, state_regions(*st, specs, payloads, n_tokens, true)));
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == SectionKind::kLogits) {
      std::memcpy(st->logits().data(), payloads[i], static_cast<size_t>(specs[i].n_bytes()));
    }
  }
  st->set_pos(n_tokens);
  const bool stateless = l.n_layer() == l.n_attention_layers();
  st->set_has_recurrent((flags & kFlagRecurrent) != 0 || n_tokens == 0 || stateless);
  if (flags & kFlagLogits) st->set_logits_valid(true);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<SequenceState>> state_deserialize(std::span<const uint8_t> bytes,
                                                         std::shared_ptr<KvPool> pool) {
  DS_ASSIGN_OR_RETURN(auto st, SequenceState::create(std::move(pool)));
  DS_TRY(load_into(bytes, *st));
  return st;
}

Status state_deserialize_into(std::span<const uint8_t> bytes, SequenceState& state) {
  return load_into(bytes, state);
}

}  // namespace ds
