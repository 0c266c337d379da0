// State stream writer and verifying reader (format table in state_io.h). The reader bounds every
// length against the stream and the layout before copying, and checks each checksum.
// Non-obvious choice: a state on a device is read and written through a host image of its KV slots
// and recurrent buffer (one copy per slot, not per layer and chunk), and the stream is assembled from
// that image exactly as from CPU memory, so the bytes do not depend on the device the state lives on.
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

struct SectionSpec {
  std::string name;
  int n_dims;
  int64_t ne[4];
  DType dtype = DType::F32;
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_bytes() const { return n_elements() * dtype_block_bytes(dtype); }
};

// The sections a stream with these flags carries, in order.
std::vector<SectionSpec> expected_sections(const StateLayout& l, int64_t n_tokens, uint32_t flags, int64_t first,
                                           int64_t last) {
  std::vector<SectionSpec> out;
  if (flags & kFlagLogits) out.push_back({"logits", 1, {l.n_vocab, 1, 1, 1}});
  for (int64_t il = first; il < last; ++il) {
    if (l.kinds[static_cast<size_t>(il)] == LayerStateKind::kAttention) {
      out.push_back({"blk." + std::to_string(il) + ".attn.k", 3, {l.head_dim, l.n_head_kv, n_tokens, 1}, l.kv_dtype});
      out.push_back({"blk." + std::to_string(il) + ".attn.v", 3, {l.head_dim, l.n_head_kv, n_tokens, 1}, l.kv_dtype});
    }
  }
  if (flags & kFlagRecurrent) {
    for (int64_t il = first; il < last; ++il) {
      if (l.kinds[static_cast<size_t>(il)] == LayerStateKind::kRecurrent) {
        out.push_back({"blk." + std::to_string(il) + ".deltanet.conv", 2, {l.conv_dim, l.conv_kernel - 1, 1, 1}});
        out.push_back({"blk." + std::to_string(il) + ".deltanet.ssm", 3, {l.ssm_dv, l.ssm_dk, l.ssm_nv, 1}});
      }
    }
  }
  return out;
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

// Host-addressable image of a state's first n_chunks KV slots and of its recurrent buffer: the
// state's own memory on the CPU, a staging copy for a device state.
class HostImage {
 public:
  HostImage(const SequenceState& st, int64_t n_chunks)
      : st_(st), n_chunks_(n_chunks), staged_(st.pool()->device().kind != DeviceKind::kCpu),
        slot_bytes_(st.layout().kv_slot_bytes()) {
    if (staged_) kv_.resize(static_cast<size_t>(n_chunks * slot_bytes_));
  }

  // Device state: copies the slots (and the recurrent buffer) to the image.
  Status download(bool recurrent) {
    if (!staged_) return Status::ok();
    const Device dev = st_.pool()->device();
    for (int64_t c = 0; c < n_chunks_; ++c) {
      DS_TRY(device_copy(kv_.data() + c * slot_bytes_, Device{}, slot(c), dev, slot_bytes_));
    }
    if (recurrent) {
      rec_.resize(static_cast<size_t>(st_.recurrent_bytes()));
      DS_TRY(device_copy(rec_.data(), Device{}, st_.recurrent_data(), dev, st_.recurrent_bytes()));
    }
    return Status::ok();
  }
  // Device state: writes the image back (the recurrent buffer only if `recurrent`).
  Status upload(bool recurrent) {
    if (!staged_) return Status::ok();
    const Device dev = st_.pool()->device();
    for (int64_t c = 0; c < n_chunks_; ++c) {
      DS_TRY(device_copy(slot(c), dev, kv_.data() + c * slot_bytes_, Device{}, slot_bytes_));
    }
    if (recurrent) {
      DS_CHECK(static_cast<int64_t>(rec_.size()) == st_.recurrent_bytes(), "recurrent image of {} bytes",
               rec_.size());
      DS_TRY(device_copy(st_.recurrent_data(), dev, rec_.data(), Device{}, st_.recurrent_bytes()));
    }
    return Status::ok();
  }
  // Device state whose recurrent buffer the stream overwrites whole: an image without a download.
  void blank_recurrent() {
    if (staged_) rec_.assign(static_cast<size_t>(st_.recurrent_bytes()), 0);
  }

  // Start of K (or V) of attention layer `attn_index` in logical chunk `chunk`.
  uint8_t* kv(int64_t attn_index, bool is_v, int64_t chunk) {
    DS_CHECK(chunk >= 0 && chunk < n_chunks_, "KV chunk {} of an image of {}", chunk, n_chunks_);
    const KvPool& pool = *st_.pool();
    const int64_t off = is_v ? pool.v_offset(attn_index) : pool.k_offset(attn_index);
    return (staged_ ? kv_.data() + chunk * slot_bytes_ : slot(chunk)) + off;
  }
  // A tensor inside the recurrent buffer (conv_state / ssm_state view of the state).
  uint8_t* recurrent(const TensorView& t) {
    const int64_t off = static_cast<const uint8_t*>(t.data) - static_cast<const uint8_t*>(st_.recurrent_data());
    DS_CHECK(off >= 0 && off + t.n_bytes() <= st_.recurrent_bytes(), "recurrent view outside the buffer");
    if (!staged_) return static_cast<uint8_t*>(t.data);
    DS_CHECK(static_cast<int64_t>(rec_.size()) == st_.recurrent_bytes(), "recurrent image not loaded");
    return rec_.data() + off;
  }

 private:
  uint8_t* slot(int64_t c) const { return st_.pool()->slot_data(st_.block_table()[static_cast<size_t>(c)]); }

  const SequenceState& st_;
  int64_t n_chunks_;
  bool staged_;
  int64_t slot_bytes_;
  std::vector<uint8_t> kv_;   // staged: n_chunks slots back to back
  std::vector<uint8_t> rec_;  // staged: the recurrent buffer
};

// Copies tokens [0, n_tokens) of one attention layer's K or V out of (or into) the image.
void kv_rows(HostImage& img, const StateLayout& l, int64_t attn_index, bool is_v, int64_t n_tokens, uint8_t* buf,
             bool to_state) {
  const int64_t row = l.n_head_kv * l.head_dim * dtype_block_bytes(l.kv_dtype);  // bytes per token
  for (int64_t t0 = 0; t0 < n_tokens; t0 += l.kv_chunk_tokens) {
    const int64_t c = t0 / l.kv_chunk_tokens;
    const int64_t n = std::min(l.kv_chunk_tokens, n_tokens - t0);
    uint8_t* chunk = img.kv(attn_index, is_v, c);
    if (to_state) {
      std::memcpy(chunk, buf + t0 * row, static_cast<size_t>(n * row));
    } else {
      std::memcpy(buf + t0 * row, chunk, static_cast<size_t>(n * row));
    }
  }
}

int64_t chunks_for(const StateLayout& l, int64_t n_tokens) {
  return l.n_attention_layers() == 0 ? 0 : (n_tokens + l.kv_chunk_tokens - 1) / l.kv_chunk_tokens;
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

  HostImage img(st, chunks_for(l, n_tokens));
  DS_TRY(img.download((flags & kFlagRecurrent) != 0));
  size_t total = out.size();
  for (const SectionSpec& s : sections) total += 4 + s.name.size() + 4 + 4 + 32 + 8 + 8 + 8 + s.n_bytes();
  out.reserve(total);  // one allocation: the stream is hundreds of MB for a long prompt
  for (const SectionSpec& s : sections) {
    const size_t start = out.size();
    put<uint32_t>(out, static_cast<uint32_t>(s.name.size()));
    out.insert(out.end(), s.name.begin(), s.name.end());
    put<uint32_t>(out, static_cast<uint32_t>(s.dtype));
    put<uint32_t>(out, static_cast<uint32_t>(s.n_dims));
    for (int64_t ne : s.ne) put<int64_t>(out, ne);
    put<uint64_t>(out, static_cast<uint64_t>(s.n_bytes()));
    put<uint64_t>(out, XXH3_64bits(out.data() + start, out.size() - start));
    const size_t sum_at = out.size();
    put<uint64_t>(out, 0);  // the payload's checksum, once it is written
    // The payload, straight into the stream.
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(s.n_bytes()));
    uint8_t* buf = out.data() + at;
    const size_t n = static_cast<size_t>(s.n_bytes());
    if (s.name == "logits") {
      std::memcpy(buf, st.logits().data(), n);
    } else {
      const int64_t il = std::stoll(s.name.substr(4));
      const bool attn_v = s.name.ends_with(".attn.v");
      if (s.name.ends_with(".attn.k") || attn_v) {
        int64_t ai = 0;
        for (int64_t j = 0; j < il; ++j) ai += l.kinds[static_cast<size_t>(j)] == LayerStateKind::kAttention;
        kv_rows(img, l, ai, attn_v, n_tokens, buf, false);
      } else if (s.name.ends_with(".deltanet.conv")) {
        std::memcpy(buf, img.recurrent(st.conv_state(il)), n);
      } else {
        std::memcpy(buf, img.recurrent(st.ssm_state(il)), n);
      }
    }
    const uint64_t sum = XXH3_64bits(buf, n);
    std::memcpy(out.data() + sum_at, &sum, sizeof(sum));
  }
  DS_CHECK(out.size() == total, "state stream of {} bytes, {} computed", out.size(), total);
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
  const bool with_recurrent = (flags & kFlagRecurrent) != 0;
  DS_TRY(st->kv_reserve(n_tokens));
  // A stream of every layer overwrites everything the image holds; a layer-range stream keeps the
  // other layers, so its image starts from the state's current contents.
  HostImage img(*st, chunks_for(l, n_tokens));
  if (first == 0 && last == l.n_layer()) {
    if (with_recurrent) img.blank_recurrent();
  } else {
    DS_TRY(img.download(with_recurrent));
  }
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
    const uint8_t* data = h + off;
    off += payload;
    if (s.name == "logits") {
      std::memcpy(st->logits().data(), data, payload);
      continue;
    }
    const int64_t il = std::stoll(s.name.substr(4));
    if (s.name.ends_with(".attn.k") || s.name.ends_with(".attn.v")) {
      int64_t ai = 0;
      for (int64_t j = 0; j < il; ++j) ai += l.kinds[static_cast<size_t>(j)] == LayerStateKind::kAttention;
      kv_rows(img, l, ai, s.name.ends_with(".attn.v"), n_tokens, const_cast<uint8_t*>(data), true);
    } else if (s.name.ends_with(".deltanet.conv")) {
      std::memcpy(img.recurrent(st->conv_state(il)), data, payload);
    } else {
      std::memcpy(img.recurrent(st->ssm_state(il)), data, payload);
    }
  }
  if (off != bytes.size()) return corrupt("state stream: {} trailing bytes after the last section", bytes.size() - off);
  DS_TRY(img.upload(with_recurrent));
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
