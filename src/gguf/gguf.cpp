// GGUF parser: header, metadata, tensor table and data placement, all validated against the file size.
// Non-obvious choice: no container is ever reserved from an on-disk count alone. Counts are first
// bounded by the bytes left (each element needs a known minimum size), and reservations are further
// capped, so a forged count in a multi-GB file cannot trigger a huge allocation before parsing fails.
#include "gguf/gguf.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace ds {

namespace {

constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, value type, smallest value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, ne[0], type, offset
constexpr uint64_t kMinArrayBytes = 4 + 8;              // element type, count
constexpr int kMaxArrayDepth = 8;                       // nested arrays deeper than this are refused
constexpr size_t kMaxReserve = size_t{1} << 16;         // elements reserved up front at most

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

std::string supported_type_names() {
  std::string out;
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = dtype_info(id);
    if (info != nullptr && info->supported) out += fmt::format("{}{}", out.empty() ? "" : ", ", info->name);
  }
  return out;
}

// ggml types that exist in the wild but are absent from deltaserve's dtype table, so that a file
// using them is reported as unsupported rather than corrupt.
const char* ggml_only_type_name(uint32_t id) {
  switch (id) {
    case 16: return "iq2_xxs";
    case 17: return "iq2_xs";
    case 18: return "iq3_xxs";
    case 19: return "iq1_s";
    case 20: return "iq4_nl";
    case 21: return "iq3_s";
    case 22: return "iq2_s";
    case 23: return "iq4_xs";
    case 29: return "iq1_m";
    case 34: return "tq1_0";
    case 35: return "tq2_0";
    case 39: return "mxfp4";
    default: return nullptr;
  }
}

}  // namespace

// Bounds-checked little-endian reader. Every read names what it was reading and where.
class GgufCursor {
 public:
  GgufCursor(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  const uint8_t* here() const { return bytes_.data() + pos_; }
  const std::string& name() const { return name_; }

  Status need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      return corrupt("{}: offset {}: truncated {}: need {} bytes, {} left (file size {})", name_, pos_,
                     what, n, remaining(), bytes_.size());
    }
    return Status::ok();
  }
  void skip(uint64_t n) {
    DS_CHECK(n <= remaining(), "skip {} past the end", n);
    pos_ += n;
  }
  template <typename T>
  Status read(T* out, std::string_view what) {
    DS_TRY(need(sizeof(T), what));
    std::memcpy(out, here(), sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }
  // u64 length + bytes (no NUL). The view points into the file.
  Status read_string(std::string_view* out, std::string_view what) {
    const uint64_t start = pos_;
    uint64_t len = 0;
    DS_TRY(read(&len, what));
    if (len > remaining()) {
      return corrupt("{}: offset {}: {} length {} runs past the end of the file ({} bytes left)", name_,
                     start, what, len, remaining());
    }
    *out = std::string_view(reinterpret_cast<const char*>(here()), len);
    pos_ += len;
    return Status::ok();
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  uint64_t pos_ = 0;
};

namespace {

Status parse_value(GgufCursor& cur, GgufType type, std::string_view key, int depth, GgufValue* v);

Status parse_array(GgufCursor& cur, std::string_view key, int depth, GgufValue* v) {
  const uint64_t at = cur.pos();
  if (depth >= kMaxArrayDepth) {
    return corrupt("{}: offset {}: key '{}': arrays nested deeper than {}", cur.name(), at, key,
                   kMaxArrayDepth);
  }
  uint32_t elem_type = 0;
  DS_TRY(cur.read(&elem_type, "array element type"));
  if (!valid_value_type(elem_type)) {
    return corrupt("{}: offset {}: key '{}': invalid array element type {}", cur.name(), at, key,
                   elem_type);
  }
  uint64_t n = 0;
  DS_TRY(cur.read(&n, "array length"));
  v->elem_type = static_cast<GgufType>(elem_type);
  v->n_elems = n;
  const size_t elem_size = gguf_scalar_size(v->elem_type);
  if (elem_size > 0) {
    if (n > cur.remaining() / elem_size) {
      return corrupt("{}: offset {}: key '{}': array of {} {} elements runs past the end of the file "
                     "({} bytes left)",
                     cur.name(), at, key, n, gguf_type_name(v->elem_type), cur.remaining());
    }
    v->raw = cur.here();
    if (v->elem_type == GgufType::BOOL) {
      for (uint64_t i = 0; i < n; ++i) {
        if (v->raw[i] > 1) {
          return corrupt("{}: offset {}: key '{}': bool array element {} is {} (must be 0 or 1)",
                         cur.name(), cur.pos() + i, key, i, v->raw[i]);
        }
      }
    }
    cur.skip(n * elem_size);
    return Status::ok();
  }
  // Strings need at least their 8-byte length, nested arrays their 12-byte header.
  const uint64_t min_elem = v->elem_type == GgufType::STRING ? 8 : kMinArrayBytes;
  if (n > cur.remaining() / min_elem) {
    return corrupt("{}: offset {}: key '{}': array count {} of {} elements cannot fit in the {} bytes "
                   "left",
                   cur.name(), at, key, n, gguf_type_name(v->elem_type), cur.remaining());
  }
  v->elems.reserve(std::min<uint64_t>(n, kMaxReserve));
  for (uint64_t i = 0; i < n; ++i) {
    GgufValue& e = v->elems.emplace_back();
    DS_TRY(parse_value(cur, v->elem_type, key, depth + 1, &e));
  }
  return Status::ok();
}

Status parse_value(GgufCursor& cur, GgufType type, std::string_view key, int depth, GgufValue* v) {
  v->type = type;
  if (type == GgufType::STRING) return cur.read_string(&v->str, "string value");
  if (type == GgufType::ARRAY) return parse_array(cur, key, depth, v);
  const size_t size = gguf_scalar_size(type);
  DS_CHECK(size > 0, "type {} validated before", static_cast<uint32_t>(type));
  const uint64_t at = cur.pos();
  DS_TRY(cur.need(size, "metadata value"));
  *v = gguf_decode_scalar(type, cur.here());
  if (type == GgufType::BOOL && cur.here()[0] > 1) {
    return corrupt("{}: offset {}: key '{}': bool value is {} (must be 0 or 1)", cur.name(), at, key,
                   cur.here()[0]);
  }
  cur.skip(size);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  DS_ASSIGN_OR_RETURN(auto mapping, MappedFile::open(path));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = path;
  f->bytes_ = mapping->bytes();
  f->mapping_ = std::move(mapping);
  DS_TRY(f->parse());
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::from_memory(std::span<const uint8_t> bytes,
                                                        const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = name;
  f->bytes_ = bytes;
  DS_TRY(f->parse());
  return f;
}

Status GgufFile::parse() {
  GgufCursor cur(bytes_, name_);
  uint32_t magic = 0;
  DS_TRY(cur.read(&magic, "header"));
  if (magic != kGgufMagic) {
    return corrupt("{}: offset 0: bad magic 0x{:08x} (expected 0x{:08x}, \"GGUF\"): not a GGUF file",
                   name_, magic, kGgufMagic);
  }
  DS_TRY(cur.read(&version_, "header"));
  if (version_ == 1) {
    return unsupported("{}: offset 4: GGUF version 1 is not supported (only v2 and v3); re-convert "
                       "the model with a current converter",
                       name_);
  }
  if (version_ != 2 && version_ != 3) {
    // A big-endian file shows its version byte-swapped.
    const bool swapped = version_ == 0x02000000u || version_ == 0x03000000u;
    return unsupported("{}: offset 4: GGUF version {} is not supported (only v2 and v3){}", name_,
                       version_, swapped ? "; the file looks big-endian" : "");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  DS_TRY(cur.read(&n_tensors, "header"));
  DS_TRY(cur.read(&n_kv, "header"));
  if (n_kv > cur.remaining() / kMinKvBytes) {
    return corrupt("{}: offset 16: metadata count {} cannot fit in the {} bytes left", name_, n_kv,
                   cur.remaining());
  }
  if (n_tensors > cur.remaining() / kMinTensorInfoBytes) {
    return corrupt("{}: offset 8: tensor count {} cannot fit in the {} bytes left", name_, n_tensors,
                   cur.remaining());
  }

  kvs_.reserve(std::min<uint64_t>(n_kv, kMaxReserve));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = cur.pos();
    std::string_view key;
    DS_TRY(cur.read_string(&key, "metadata key"));
    if (kv_index_.count(key) != 0) {
      return corrupt("{}: offset {}: duplicate metadata key '{}' (first at offset {})", name_, at, key,
                     kvs_[kv_index_.at(key)].file_offset);
    }
    uint32_t type = 0;
    const uint64_t type_at = cur.pos();
    DS_TRY(cur.read(&type, "metadata value type"));
    if (!valid_value_type(type)) {
      return corrupt("{}: offset {}: key '{}': invalid value type {}", name_, type_at, key, type);
    }
    GgufKv& kv = kvs_.emplace_back();
    kv.key = std::string(key);
    kv.file_offset = at;
    DS_TRY(parse_value(cur, static_cast<GgufType>(type), key, 0, &kv.value));
    kv_index_.emplace(key, kvs_.size() - 1);
  }

  if (const GgufKv* kv = find("general.alignment")) {
    if (kv->value.type != GgufType::U32) {
      return corrupt("{}: offset {}: general.alignment has type {} (expected u32)", name_,
                     kv->file_offset, gguf_type_name(kv->value.type));
    }
    const uint64_t a = kv->value.num.u64;
    if (a == 0 || (a & (a - 1)) != 0) {
      return corrupt("{}: offset {}: general.alignment {} is not a nonzero power of two", name_,
                     kv->file_offset, a);
    }
    if (a > kGgufMaxAlignment) {
      return corrupt("{}: offset {}: general.alignment {} is larger than the largest accepted, {}", name_,
                     kv->file_offset, a, kGgufMaxAlignment);
    }
    alignment_ = static_cast<uint32_t>(a);
  }

  tensors_.reserve(std::min<uint64_t>(n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo info;
    DS_TRY(parse_tensor_info(cur, &info));
    tensors_.push_back(std::move(info));
  }
  const uint64_t end_of_table = cur.pos();
  data_offset_ = (end_of_table + alignment_ - 1) / alignment_ * alignment_;  // no overflow: pos < 2^63
  return place_tensor_data();
}

Status GgufFile::parse_tensor_info(GgufCursor& cur, GgufTensorInfo* info) {
  const uint64_t at = cur.pos();
  std::string_view name;
  DS_TRY(cur.read_string(&name, "tensor name"));
  if (tensor_index_.count(name) != 0) {
    return corrupt("{}: offset {}: duplicate tensor name '{}'", name_, at, name);
  }
  info->name = std::string(name);
  uint32_t n_dims = 0;
  DS_TRY(cur.read(&n_dims, "tensor table"));
  if (n_dims < 1 || n_dims > 4) {
    return corrupt("{}: offset {}: tensor '{}': n_dims {} out of range 1..4", name_, at, name, n_dims);
  }
  info->n_dims = static_cast<int>(n_dims);
  int64_t n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t raw = 0;
    DS_TRY(cur.read(&raw, "tensor table"));
    const auto ne = static_cast<int64_t>(raw);
    if (ne <= 0) {
      return corrupt("{}: offset {}: tensor '{}': ne[{}] is {} (dimensions must be positive)", name_,
                     at, name, d, ne);
    }
    if (__builtin_mul_overflow(n_elements, ne, &n_elements)) {
      return corrupt("{}: offset {}: tensor '{}': element count overflows int64 at ne[{}] = {}", name_,
                     at, name, d, ne);
    }
    info->ne[d] = ne;
  }
  uint32_t type_id = 0;
  DS_TRY(cur.read(&type_id, "tensor table"));
  const DTypeInfo* dt = dtype_info(type_id);
  if (dt == nullptr) {
    if (const char* ggml_name = ggml_only_type_name(type_id)) {
      return unsupported("{}: offset {}: tensor '{}': type {} (ggml id {}) is not supported; "
                         "supported types: {}",
                         name_, at, name, ggml_name, type_id, supported_type_names());
    }
    return corrupt("{}: offset {}: tensor '{}': unknown ggml type {}", name_, at, name, type_id);
  }
  if (!dt->supported) {
    return unsupported("{}: offset {}: tensor '{}': type {} (ggml id {}) is not supported; "
                       "supported types: {}",
                       name_, at, name, dt->name, type_id, supported_type_names());
  }
  info->dtype = static_cast<DType>(type_id);
  if (info->ne[0] % dt->block_size != 0) {
    return corrupt("{}: offset {}: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}",
                   name_, at, name, info->ne[0], dt->name, dt->block_size);
  }
  uint64_t n_bytes = static_cast<uint64_t>(info->ne[0] / dt->block_size);
  bool overflow = __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(dt->block_bytes), &n_bytes);
  for (int d = 1; d < 4 && !overflow; ++d) {
    overflow = __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(info->ne[d]), &n_bytes);
  }
  if (overflow) {
    return corrupt("{}: offset {}: tensor '{}': byte size of {} {} overflows uint64", name_, at, name,
                   info->shape_string(), dt->name);
  }
  info->n_bytes = n_bytes;
  DS_TRY(cur.read(&info->offset, "tensor table"));
  if (info->offset % alignment_ != 0) {
    return corrupt("{}: offset {}: tensor '{}': data offset {} is not a multiple of the alignment {}",
                   name_, at, name, info->offset, alignment_);
  }
  tensor_index_.emplace(name, tensor_index_.size());
  return Status::ok();
}

Status GgufFile::place_tensor_data() {
  const uint64_t size = bytes_.size();
  if (tensors_.empty()) return Status::ok();
  if (data_offset_ > size) {
    return corrupt("{}: offset {}: truncated tensor data: the data section starts at {} but the file "
                   "has {} bytes",
                   name_, size, data_offset_, size);
  }
  for (GgufTensorInfo& t : tensors_) {
    uint64_t start = 0, end = 0;
    if (__builtin_add_overflow(data_offset_, t.offset, &start) ||
        __builtin_add_overflow(start, t.n_bytes, &end)) {
      return corrupt("{}: offset {}: tensor '{}': data offset {} + {} bytes lies outside the file "
                     "({} bytes)",
                     name_, data_offset_, t.name, t.offset, t.n_bytes, size);
    }
    if (end > size) {
      return corrupt("{}: offset {}: tensor '{}': truncated tensor data: {} bytes at [{}, {}) lie "
                     "outside the file ({} bytes)",
                     name_, start, t.name, t.n_bytes, start, end, size);
    }
    t.data = bytes_.data() + start;
  }
  std::vector<const GgufTensorInfo*> order;
  order.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensorInfo& a = *order[i - 1];
    const GgufTensorInfo& b = *order[i];
    if (a.offset + a.n_bytes > b.offset) {
      return corrupt("{}: offset {}: tensor '{}' data [{}, {}) overlaps tensor '{}' data [{}, {})",
                     name_, data_offset_ + b.offset, b.name, data_offset_ + b.offset,
                     data_offset_ + b.offset + b.n_bytes, a.name, data_offset_ + a.offset,
                     data_offset_ + a.offset + a.n_bytes);
    }
  }
  return Status::ok();
}

const GgufKv* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "{";
  for (int d = 0; d < n_dims; ++d) s += fmt::format("{}{}", d == 0 ? "" : ", ", ne[d]);
  return s + "}";
}

}  // namespace ds
