// State stream writer, verifying reader and joiner (format table in state_io.h). The reader bounds
// every length against the stream and the layout, and checks each checksum, before any byte reaches
// a state.
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
#include "core/host_memory.h"
#include "core/thread_pool.h"

namespace ds {
namespace {

constexpr size_t kHeaderBytes = 64;
constexpr uint32_t kFlagRecurrent = 1u << 0;
constexpr uint32_t kFlagLogits = 1u << 1;
constexpr uint32_t kMaxNameLen = 64;
constexpr uint16_t kWholeStreamVersion = 1;  // a stream of KV from token 0 is still version 1

enum class SectionKind : uint8_t { kLogits, kKey, kValue, kConv, kSsm };

struct SectionSpec {
  std::string name;
  int n_dims;
  int64_t ne[4];
  DType dtype = DType::F32;
  SectionKind kind = SectionKind::kLogits;
  int64_t layer = -1;       // the model layer (all but logits)
  int64_t attn_index = -1;  // K / V: the layer's index among attention layers
  // Rows of ne[0] elements (a K / V section's head rows: head_dim / 32 blocks each for Q8_0 / Q4_0).
  int64_t n_bytes() const { return dtype_row_bytes(dtype, ne[0]) * ne[1] * ne[2] * ne[3]; }
};

// What a stream's header says.
struct StreamHeader {
  int64_t n_tokens = 0;  // the boundary b
  int64_t kv_from = 0;   // the first KV row it carries
  uint32_t flags = 0;
  int64_t first = 0, last = 0;  // layer range
};

// The sections a stream carries, in order: KV rows [kv_from, n_tokens) of the attention layers of
// [first, last), and with the flags the logits and recurrent state.
std::vector<SectionSpec> expected_sections(const StateLayout& l, const StreamHeader& sh) {
  std::vector<SectionSpec> out;
  const int64_t rows = sh.n_tokens - sh.kv_from;
  if (sh.flags & kFlagLogits) out.push_back({"logits", 1, {l.n_vocab, 1, 1, 1}});
  int64_t ai = 0;
  for (int64_t il = 0; il < sh.last; ++il) {
    if (l.kinds[static_cast<size_t>(il)] != LayerStateKind::kAttention) continue;
    if (il >= sh.first) {
      const std::string blk = "blk." + std::to_string(il);
      out.push_back({blk + ".attn.k", 3, {l.head_dim, l.n_head_kv, rows, 1}, l.kv_dtype, SectionKind::kKey, il, ai});
      out.push_back({blk + ".attn.v", 3, {l.head_dim, l.n_head_kv, rows, 1}, l.kv_dtype, SectionKind::kValue, il, ai});
    }
    ++ai;
  }
  if (sh.flags & kFlagRecurrent) {
    for (int64_t il = sh.first; il < sh.last; ++il) {
      if (l.kinds[static_cast<size_t>(il)] == LayerStateKind::kRecurrent) {
        const std::string blk = "blk." + std::to_string(il);
        out.push_back({blk + ".deltanet.conv", 2, {l.conv_dim, l.conv_kernel - 1, 1, 1}, DType::F32, SectionKind::kConv, il});
        out.push_back({blk + ".deltanet.ssm", 3, {l.ssm_dv, l.ssm_dk, l.ssm_nv, 1}, DType::F32, SectionKind::kSsm, il});
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

// A stream being written: the header and every section header in place, each payload's bytes
// allocated (payload[i]) and its checksum written by finish().
struct StreamBuilder {
  std::vector<uint8_t> out;
  std::vector<uint8_t*> payload;
  std::vector<size_t> sum_at;

  StreamBuilder(const StateLayout& l, const StreamHeader& sh, const std::vector<SectionSpec>& sections) {
    const uint16_t version = sh.kv_from > 0 ? kStateVersion : kWholeStreamVersion;
    put<uint32_t>(out, kStateMagic);
    put<uint16_t>(out, version);
    put<uint16_t>(out, version);
    put<uint64_t>(out, l.fingerprint());
    put<int64_t>(out, sh.n_tokens);
    put<uint32_t>(out, sh.flags);
    put<uint32_t>(out, static_cast<uint32_t>(sections.size()));
    put<uint32_t>(out, static_cast<uint32_t>(sh.first));
    put<uint32_t>(out, static_cast<uint32_t>(sh.last));
    put<int64_t>(out, sh.kv_from);
    out.resize(56, 0);
    put<uint64_t>(out, XXH3_64bits(out.data(), 56));
    size_t total = out.size();
    for (const SectionSpec& s : sections) total += 4 + s.name.size() + 4 + 4 + 32 + 8 + 8 + 8 + s.n_bytes();
    out.reserve(total);  // one allocation: the stream is hundreds of MB for a long prompt
    advise_huge_pages(out.data(), out.capacity());
    std::vector<size_t> payload_at;
    for (const SectionSpec& s : sections) {
      const size_t start = out.size();
      put<uint32_t>(out, static_cast<uint32_t>(s.name.size()));
      out.insert(out.end(), s.name.begin(), s.name.end());
      put<uint32_t>(out, static_cast<uint32_t>(s.dtype));
      put<uint32_t>(out, static_cast<uint32_t>(s.n_dims));
      for (int64_t ne : s.ne) put<int64_t>(out, ne);
      put<uint64_t>(out, static_cast<uint64_t>(s.n_bytes()));
      put<uint64_t>(out, XXH3_64bits(out.data() + start, out.size() - start));
      sum_at.push_back(out.size());
      put<uint64_t>(out, 0);  // the payload's checksum, once it is written
      payload_at.push_back(out.size());
      out.resize(out.size() + static_cast<size_t>(s.n_bytes()));
    }
    DS_CHECK(out.size() == total, "state stream of {} bytes, {} computed", out.size(), total);
    for (size_t at : payload_at) payload.push_back(out.data() + at);
  }

  std::vector<uint8_t> finish(const std::vector<SectionSpec>& sections) {
    host_parallel_for(static_cast<int64_t>(sections.size()), [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t sum = XXH3_64bits(payload[i], static_cast<size_t>(sections[i].n_bytes()));
        std::memcpy(out.data() + sum_at[i], &sum, sizeof(sum));
      }
    });
    return std::move(out);
  }
};

// A verified stream: its header, its sections, and where each payload lies in it.
struct ParsedStream {
  StreamHeader header;
  std::vector<SectionSpec> sections;
  std::vector<const uint8_t*> payload;
};

// Verifies a whole stream against layout `l`: magic, versions, fingerprint, header fields, and every
// section's name, shape and checksums, with every length bounded by the stream.
Result<ParsedStream> parse_stream(std::span<const uint8_t> bytes, const StateLayout& l) {
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
  ParsedStream p;
  StreamHeader& sh = p.header;
  sh.n_tokens = get_at<int64_t>(h + 16);
  sh.flags = get_at<uint32_t>(h + 24);
  const uint32_t n_sections = get_at<uint32_t>(h + 28);
  if (sh.n_tokens < 0 || sh.n_tokens > l.n_ctx) {
    return corrupt("state stream: {} tokens outside the context [0, {}]", sh.n_tokens, l.n_ctx);
  }
  if ((sh.flags & ~(kFlagRecurrent | kFlagLogits)) != 0 || ((sh.flags & kFlagLogits) && !(sh.flags & kFlagRecurrent))) {
    return corrupt("state stream: unknown flags 0x{:x}", sh.flags);
  }
  sh.first = get_at<uint32_t>(h + 32);
  sh.last = get_at<uint32_t>(h + 36);
  if (sh.first >= sh.last || sh.last > l.n_layer()) {
    return corrupt("state stream: layer range [{}, {}) outside this model's [0, {})", sh.first, sh.last, l.n_layer());
  }
  sh.kv_from = get_at<int64_t>(h + 40);
  if (sh.kv_from < 0 || sh.kv_from > sh.n_tokens || (sh.kv_from > 0 && min_reader < 2)) {
    return corrupt("state stream: KV from token {} of a stream of {} tokens (reader version {})", sh.kv_from,
                   sh.n_tokens, min_reader);
  }
  for (size_t i = 48; i < 56; ++i) {
    if (h[i] != 0) return corrupt("state stream: reserved header byte {} is not zero", i);
  }
  p.sections = expected_sections(l, sh);
  if (n_sections != p.sections.size()) {
    return corrupt("state stream: {} sections, expected {}", n_sections, p.sections.size());
  }
  size_t off = kHeaderBytes;
  std::vector<uint64_t> sums;  // each payload's checksum as the stream states it
  for (const SectionSpec& s : p.sections) {
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
    p.payload.push_back(h + off);
    sums.push_back(payload_sum);
    off += payload;
  }
  if (off != bytes.size()) return corrupt("state stream: {} trailing bytes after the last section", bytes.size() - off);
  // Every payload's checksum, the sections on several threads.
  std::vector<uint8_t> ok(p.sections.size());
  host_parallel_for(static_cast<int64_t>(p.sections.size()), [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      ok[i] = XXH3_64bits(p.payload[i], static_cast<size_t>(p.sections[i].n_bytes())) == sums[i];
    }
  });
  for (size_t i = 0; i < p.sections.size(); ++i) {
    if (!ok[i]) {
      return corrupt("state stream: section '{}' payload checksum mismatch at offset {}", p.sections[i].name,
                     p.payload[i] - h);
    }
  }
  return p;
}

// The slots of the state's chunks that hold KV rows [kv_from, n_tokens), the first chunk's first.
std::vector<uint8_t*> chunk_slots(const SequenceState& st, int64_t kv_from, int64_t n_tokens) {
  const int64_t chunk = st.layout().kv_chunk_tokens;
  std::vector<uint8_t*> slots;
  for (int64_t c = kv_from / chunk; c * chunk < n_tokens; ++c) {
    slots.push_back(st.pool()->slot_data(st.block_table()[static_cast<size_t>(c)]));
  }
  return slots;
}

// The copies between KV chunks and the payloads of a stream's K / V sections (payload[i]: section
// i's bytes; slots: chunk_slots of the stream's rows): one region per piece, chunk by chunk and within
// a chunk in slot order, so the pieces of one slot are adjacent and move as one transfer.
void add_kv_regions(std::vector<CopyRegion>& regions, const KvPool& pool, const StreamHeader& sh,
                    const std::vector<SectionSpec>& sections, const std::vector<uint8_t*>& payload,
                    const std::vector<uint8_t*>& slots, bool to_state) {
  const StateLayout& l = pool.layout();
  const int64_t row = l.kv_row_bytes();  // bytes per token: whole rows, whatever the KV dtype
  const int64_t first_chunk = sh.kv_from / l.kv_chunk_tokens;
  for (int64_t t0 = sh.kv_from; t0 < sh.n_tokens;) {
    const int64_t c = t0 / l.kv_chunk_tokens, in_chunk = t0 % l.kv_chunk_tokens;
    const int64_t n = std::min(l.kv_chunk_tokens - in_chunk, sh.n_tokens - t0);
    uint8_t* base = slots[static_cast<size_t>(c - first_chunk)] + in_chunk * row;
    const int64_t at = (t0 - sh.kv_from) * row;
    for (size_t i = 0; i < sections.size(); ++i) {
      const SectionSpec& s = sections[i];
      if (s.kind != SectionKind::kKey && s.kind != SectionKind::kValue) continue;
      uint8_t* kv = base + (s.kind == SectionKind::kKey ? pool.k_offset(s.attn_index) : pool.v_offset(s.attn_index));
      regions.push_back(to_state ? CopyRegion{kv, payload[i] + at, n * row} : CopyRegion{payload[i] + at, kv, n * row});
    }
    t0 += n;
  }
}

// The same for the conv / SSM sections and the state's recurrent buffer.
void add_recurrent_regions(std::vector<CopyRegion>& regions, const SequenceState& st,
                           const std::vector<SectionSpec>& sections, const std::vector<uint8_t*>& payload,
                           bool to_state) {
  for (size_t i = 0; i < sections.size(); ++i) {
    const SectionSpec& s = sections[i];
    if (s.kind != SectionKind::kConv && s.kind != SectionKind::kSsm) continue;
    const TensorView t = s.kind == SectionKind::kConv ? st.conv_state(s.layer) : st.ssm_state(s.layer);
    DS_CHECK(t.n_bytes() == s.n_bytes(), "section '{}' of {} bytes, state tensor of {}", s.name, s.n_bytes(), t.n_bytes());
    regions.push_back(to_state ? CopyRegion{t.data, payload[i], s.n_bytes()} : CopyRegion{payload[i], t.data, s.n_bytes()});
  }
}

// Section `s` (index i) of the whole stream that a verified chain `parts` restores, written to dst:
// K / V rows appended link by link, the rest from the last link. False if a link lacks it.
bool join_section(const std::vector<ParsedStream>& parts, const SectionSpec& s, uint8_t* dst, size_t i) {
  if (s.kind == SectionKind::kKey || s.kind == SectionKind::kValue) {
    uint8_t* at = dst;
    for (const ParsedStream& p : parts) {
      auto it = std::find_if(p.sections.begin(), p.sections.end(), [&](const SectionSpec& q) { return q.name == s.name; });
      if (it == p.sections.end()) return false;
      const size_t n = static_cast<size_t>(it->n_bytes());
      std::memcpy(at, p.payload[static_cast<size_t>(it - p.sections.begin())], n);
      at += n;
    }
    return at == dst + s.n_bytes();
  }
  const ParsedStream& last = parts.back();
  if (i >= last.sections.size() || last.sections[i].name != s.name) return false;
  std::memcpy(dst, last.payload[i], static_cast<size_t>(s.n_bytes()));
  return true;
}

}  // namespace

struct StateCaptureData {
  std::shared_ptr<KvPool> pool;
  StreamHeader header;
  std::vector<SectionSpec> sections;
  std::vector<uint8_t*> slots;   // chunk_slots of rows [kv_from, n_tokens)
  // What the model's next step changes, copied at the capture: the logits, and the conv and SSM
  // payloads back to back in section order, on the state's device when it has room (a copy there is a
  // fraction of a millisecond; to the host it crosses the bus on the request's path), else on the host.
  std::vector<uint8_t> logits;
  DeviceBuffer recurrent;
  std::vector<uint8_t*> recurrent_at;  // per section: its payload in `recurrent` (null for the others)
};

StateCapture::StateCapture() = default;
StateCapture::~StateCapture() = default;
StateCapture::StateCapture(StateCapture&&) noexcept = default;
StateCapture& StateCapture::operator=(StateCapture&&) noexcept = default;
int64_t StateCapture::n_tokens() const { return d_ ? d_->header.n_tokens : 0; }

Result<StateCapture> state_capture(const SequenceState& st, int64_t n_tokens, int64_t layer_first, int64_t layer_last,
                                   int64_t kv_from) {
  const StateLayout& l = st.layout();
  if (n_tokens < 0 || n_tokens > st.pos()) {
    return invalid_argument("state_serialize: boundary {} outside [0, {}]", n_tokens, st.pos());
  }
  if (kv_from < 0 || kv_from > n_tokens) {
    return invalid_argument("state_serialize: KV from token {} outside [0, {}]", kv_from, n_tokens);
  }
  if (layer_last < 0) layer_last = l.n_layer();
  if (layer_first < 0 || layer_first >= layer_last || layer_last > l.n_layer()) {
    return invalid_argument("state_serialize: layer range [{}, {}) outside [0, {})", layer_first, layer_last, l.n_layer());
  }
  StateCapture cap;
  cap.d_ = std::make_unique<StateCaptureData>();
  StateCaptureData& d = *cap.d_;
  d.pool = st.pool();
  StreamHeader& sh = d.header;
  sh = StreamHeader{n_tokens, kv_from, 0, layer_first, layer_last};
  if (n_tokens == st.pos()) {
    if (!st.has_recurrent() && n_tokens > 0 && l.n_layer() != l.n_attention_layers()) {
      return invalid_argument("state_serialize: the state has no recurrent part at position {}", n_tokens);
    }
    sh.flags |= kFlagRecurrent;
    if (st.logits_valid()) sh.flags |= kFlagLogits;
  }
  d.sections = expected_sections(l, sh);
  // The parts the model's next step changes, copied now; the KV rows stay where they are.
  const Device dev = st.pool()->device();
  int64_t rec_bytes = 0;
  for (const SectionSpec& s : d.sections) {
    if (s.kind == SectionKind::kConv || s.kind == SectionKind::kSsm) rec_bytes += s.n_bytes();
    if (s.kind == SectionKind::kLogits) {
      const auto* logits = reinterpret_cast<const uint8_t*>(st.logits().data());
      d.logits.assign(logits, logits + s.n_bytes());
    }
  }
  auto on_device = DeviceBuffer::alloc(dev, rec_bytes);
  if (on_device.is_ok()) {
    d.recurrent = std::move(on_device).value();
  } else {
    DS_ASSIGN_OR_RETURN(d.recurrent, DeviceBuffer::alloc(Device{}, rec_bytes));
  }
  auto* at = static_cast<uint8_t*>(d.recurrent.data());
  for (const SectionSpec& s : d.sections) {
    const bool rec = s.kind == SectionKind::kConv || s.kind == SectionKind::kSsm;
    d.recurrent_at.push_back(rec ? at : nullptr);
    if (rec) at += s.n_bytes();
  }
  std::vector<CopyRegion> regions;
  add_recurrent_regions(regions, st, d.sections, d.recurrent_at, false);
  DS_TRY(device_copy_regions(d.recurrent.device(), dev, regions));
  if (n_tokens > kv_from) d.slots = chunk_slots(st, kv_from, n_tokens);
  return cap;
}

Result<std::vector<uint8_t>> state_capture_finish(StateCapture&& cap) {
  DS_CHECK(cap.d_ != nullptr, "state_capture_finish of an empty capture");
  const std::unique_ptr<StateCaptureData> taken = std::move(cap.d_);  // the capture is used up
  const StateCaptureData& d = *taken;
  const StateLayout& l = d.pool->layout();
  // The headers first, then the KV rows straight from their slots in one batch of copies, and the
  // captured parts.
  StreamBuilder b(l, d.header, d.sections);
  std::vector<CopyRegion> kv, recurrent;
  add_kv_regions(kv, *d.pool, d.header, d.sections, b.payload, d.slots, false);
  DS_TRY(device_copy_regions(Device{}, d.pool->device(), kv));
  for (size_t i = 0; i < d.sections.size(); ++i) {
    const SectionSpec& s = d.sections[i];
    if (s.kind == SectionKind::kLogits) std::memcpy(b.payload[i], d.logits.data(), d.logits.size());
    if (d.recurrent_at[i] != nullptr) recurrent.push_back({b.payload[i], d.recurrent_at[i], s.n_bytes()});
  }
  DS_TRY(device_copy_regions(Device{}, d.recurrent.device(), recurrent));
  return b.finish(d.sections);
}

Result<std::vector<uint8_t>> state_serialize(const SequenceState& st, int64_t n_tokens, int64_t layer_first,
                                             int64_t layer_last, int64_t kv_from) {
  DS_ASSIGN_OR_RETURN(StateCapture cap, state_capture(st, n_tokens, layer_first, layer_last, kv_from));
  return state_capture_finish(std::move(cap));
}

Status state_deserialize_into(std::span<const uint8_t> bytes, SequenceState& st, bool with_recurrent) {
  const StateLayout& l = st.layout();
  DS_ASSIGN_OR_RETURN(ParsedStream p, parse_stream(bytes, l));
  const StreamHeader& sh = p.header;
  // Into a fresh state (position 0, no KV), a state at the stream's position (the next layer range of
  // a split state), or for a stream of KV from token f > 0, a state at position f.
  const bool fresh = st.pos() == 0 && st.n_kv_chunks() == 0;
  if (sh.kv_from > 0 ? (st.pos() != sh.kv_from && st.pos() != sh.n_tokens)
                     : (!fresh && st.pos() != sh.n_tokens)) {
    return invalid_argument("state stream: a stream of tokens [{}, {}) cannot be merged into a state at position {}",
                            sh.kv_from, sh.n_tokens, st.pos());
  }
  DS_TRY(st.kv_reserve(sh.n_tokens));
  const bool recurrent = with_recurrent && (sh.flags & kFlagRecurrent) != 0;
  std::vector<uint8_t*> payload;
  for (const uint8_t* q : p.payload) payload.push_back(const_cast<uint8_t*>(q));
  std::vector<CopyRegion> regions;
  const KvPool& pool = *st.pool();
  add_kv_regions(regions, pool, sh, p.sections, payload, chunk_slots(st, sh.kv_from, sh.n_tokens), true);
  if (recurrent) add_recurrent_regions(regions, st, p.sections, payload, true);
  DS_TRY(device_copy_regions(pool.device(), Device{}, regions));
  const bool logits = recurrent && (sh.flags & kFlagLogits) != 0;
  for (size_t i = 0; i < p.sections.size() && logits; ++i) {
    if (p.sections[i].kind == SectionKind::kLogits) {
      std::memcpy(st.logits().data(), payload[i], static_cast<size_t>(p.sections[i].n_bytes()));
    }
  }
  st.set_pos(sh.n_tokens);
  const bool stateless = l.n_layer() == l.n_attention_layers();
  st.set_has_recurrent(recurrent || sh.n_tokens == 0 || stateless);
  if (logits) st.set_logits_valid(true);
  return Status::ok();
}

Result<std::unique_ptr<SequenceState>> state_deserialize(std::span<const uint8_t> bytes,
                                                         std::shared_ptr<KvPool> pool) {
  DS_ASSIGN_OR_RETURN(auto st, SequenceState::create(std::move(pool)));
  DS_TRY(state_deserialize_into(bytes, *st));
  return st;
}

Result<std::vector<uint8_t>> state_stream_join(std::span<const std::span<const uint8_t>> chain, const StateLayout& l) {
  if (chain.empty()) return invalid_argument("state_stream_join: no streams");
  std::vector<ParsedStream> parts;
  for (std::span<const uint8_t> bytes : chain) {
    DS_ASSIGN_OR_RETURN(ParsedStream p, parse_stream(bytes, l));
    const int64_t want_from = parts.empty() ? 0 : parts.back().header.n_tokens;
    if (p.header.kv_from != want_from || (!parts.empty() && (p.header.first != parts[0].header.first ||
                                                             p.header.last != parts[0].header.last))) {
      return invalid_argument("state_stream_join: a stream of tokens [{}, {}) layers [{}, {}) does not continue one "
                              "that ends at token {}", p.header.kv_from, p.header.n_tokens, p.header.first,
                              p.header.last, want_from);
    }
    parts.push_back(std::move(p));
  }
  StreamHeader sh = parts.back().header;
  sh.kv_from = 0;
  const auto sections = expected_sections(l, sh);
  StreamBuilder b(l, sh, sections);
  std::vector<uint8_t> joined(sections.size());
  host_parallel_for(static_cast<int64_t>(sections.size()), [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) joined[i] = join_section(parts, sections[i], b.payload[i], static_cast<size_t>(i));
  });
  for (size_t i = 0; i < sections.size(); ++i) {
    DS_CHECK(joined[i], "section '{}' missing or of the wrong size in a verified chain", sections[i].name);
  }
  return b.finish(sections);
}

}  // namespace ds
