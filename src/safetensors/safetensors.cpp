// Safetensors reader and writer. The one non-obvious choice: the JSON header is parsed with a
// callback that sees every top-level key, because nlohmann::json silently keeps the last of two
// duplicate keys and a duplicated tensor name must be an error, not a silent overwrite.
#include "safetensors/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "quant/quant.h"

namespace ds {
namespace {

// The format's own bound on the header (the reference implementation refuses larger headers).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeName {
  const char* name;
  DType dtype;
  bool accepted;
};
constexpr DTypeName kDTypeNames[] = {
    {"F32", DType::F32, true},   {"F16", DType::F16, true},   {"BF16", DType::BF16, true},
    {"F64", DType::F64, false},  {"I64", DType::I64, false},  {"I32", DType::I32, false},
    {"I16", DType::I16, false},  {"I8", DType::I8, false},    {"U8", DType::I8, false},
    {"U16", DType::I16, false},  {"U32", DType::I32, false},  {"U64", DType::I64, false},
    {"BOOL", DType::I8, false},  {"F8_E4M3", DType::I8, false}, {"F8_E5M2", DType::I8, false},
};

int64_t element_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: return nullptr;
  }
}

// a * b into *out, false on overflow of int64_t (both operands non-negative).
bool mul_checked(int64_t a, int64_t b, int64_t* out) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  DS_ASSIGN_OR_RETURN(auto mapping, MappedFile::open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = path;
  f->bytes_ = mapping->bytes();
  f->mapping_ = std::move(mapping);
  DS_TRY(f->parse());
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_memory(std::span<const uint8_t> bytes,
                                                                      const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = name;
  f->bytes_ = bytes;
  DS_TRY(f->parse());
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status SafetensorsFile::parse() {
  const uint64_t file_size = bytes_.size();
  if (file_size < 8) {
    return corrupt("{}: file is {} bytes, shorter than the 8-byte header length", name_, file_size);
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes_[i];
  if (header_len > file_size - 8) {
    return corrupt("{}: header length {} runs past the end of the file ({} bytes)", name_, header_len,
                   file_size);
  }
  if (header_len > kMaxHeaderBytes || header_len < 2) {
    return corrupt("{}: header length {} is not in [2, {}]", name_, header_len, kMaxHeaderBytes);
  }
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = file_size - data_begin;
  const char* text = reinterpret_cast<const char*>(bytes_.data() + 8);

  std::set<std::string> seen_keys;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
      std::string key = parsed.get<std::string>();
      if (!seen_keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_len, on_event);
  } catch (const nlohmann::json::exception& e) {
    return corrupt("{}: header is not valid JSON: {}", name_, e.what());
  }
  if (!header.is_object()) return corrupt("{}: header JSON is not an object", name_);
  if (!duplicate.empty()) return corrupt("{}: tensor name '{}' appears twice in the header", name_, duplicate);

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) return corrupt("{}: __metadata__ is not an object", name_);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return corrupt("{}: __metadata__ value '{}' is not a string", name_, m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) return corrupt("{}: tensor '{}': entry is not an object", name_, key);
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return corrupt("{}: tensor '{}': missing string 'dtype'", name_, key);
    if (sh == v.end() || !sh->is_array()) return corrupt("{}: tensor '{}': missing array 'shape'", name_, key);
    if (off == v.end() || !off->is_array() || off->size() != 2) {
      return corrupt("{}: tensor '{}': 'data_offsets' is not a [begin, end] pair", name_, key);
    }
    SafetensorsTensor t;
    t.name = key;
    const std::string dtype_str = dt->get<std::string>();
    const DTypeName* found = nullptr;
    for (const auto& d : kDTypeNames) {
      if (dtype_str == d.name) found = &d;
    }
    if (found == nullptr || !found->accepted) {
      return unsupported("{}: tensor '{}': dtype {} is not supported (F32, F16, BF16 are)", name_, key,
                         dtype_str);
    }
    t.dtype = found->dtype;
    int64_t n_elements = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer()) return corrupt("{}: tensor '{}': shape entry {} is not an integer", name_, key, d.dump());
      if (d.is_number_unsigned() ? d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                                 : d.get<int64_t>() < 0) {
        return corrupt("{}: tensor '{}': shape dimension {} is negative or too large", name_, key, d.dump());
      }
      const int64_t dim = d.get<int64_t>();
      if (!mul_checked(n_elements, dim, &n_elements)) {
        return corrupt("{}: tensor '{}': shape {} overflows the element count", name_, key, sh->dump());
      }
      t.shape.push_back(dim);
    }
    int64_t expected_bytes = 0;
    if (!mul_checked(n_elements, element_bytes(t.dtype), &expected_bytes)) {
      return corrupt("{}: tensor '{}': shape {} overflows the byte count", name_, key, sh->dump());
    }
    for (const auto& o : *off) {
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0)) {
        return corrupt("{}: tensor '{}': data offset {} is not a non-negative integer", name_, key, o.dump());
      }
    }
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return corrupt("{}: tensor '{}': data offsets [{}, {}) are outside the data section of {} bytes", name_,
                     key, begin, end, data_size);
    }
    if (end - begin != static_cast<uint64_t>(expected_bytes)) {
      return corrupt("{}: tensor '{}': data is {} bytes, expected {} for shape {} of {}", name_, key,
                     end - begin, expected_bytes, sh->dump(), dtype_str);
    }
    t.data = bytes_.data() + data_begin + begin;
    t.n_bytes = end - begin;
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t prev_end = 0;
  size_t prev_index = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.begin == r.end) continue;  // empty tensors occupy no bytes
    if (i > 0 && r.begin < prev_end) {
      return corrupt("{}: tensors '{}' and '{}' overlap (bytes [{}, {}) of the data section)", name_,
                     tensors_[prev_index].name, tensors_[r.index].name, r.begin, std::min(prev_end, r.end));
    }
    if (r.end > prev_end) {
      prev_end = r.end;
      prev_index = r.index;
    }
  }
  // Keep file order (by data offset), which is the order the writer emitted them in.
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(tensors_.size());
  for (const Range& r : ranges) ordered.push_back(std::move(tensors_[r.index]));
  tensors_ = std::move(ordered);
  return Status::ok();
}

void SafetensorsFile::to_f32(const SafetensorsTensor& t, float* dst) { to_f32(t, 0, t.n_elements(), dst); }

void SafetensorsFile::to_f32(const SafetensorsTensor& t, int64_t begin, int64_t n, float* dst) {
  DS_CHECK(begin >= 0 && n >= 0 && begin + n <= t.n_elements(), "range [{}, {}) outside tensor {} of {} elements",
           begin, begin + n, t.name, t.n_elements());
  DS_CHECK(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16,
           "safetensors tensor {} has dtype {} that parse() should have refused", t.name, dtype_name(t.dtype));
  quant::dequantize_row(t.dtype, t.data + dtype_block_bytes(t.dtype) * begin, dst, n);
}

Status safetensors_write(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the tensors in the caller's order, matching their data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const char* dtype_str = safetensors_dtype_name(t.dtype);
    if (dtype_str == nullptr) {
      return invalid_argument("{}: tensor '{}': dtype {} cannot be written (F32, F16, BF16 can)", path, t.name,
                              dtype_name(t.dtype));
    }
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return invalid_argument("{}: tensor '{}': negative dimension {}", path, t.name, d);
      n *= d;
    }
    if (static_cast<uint64_t>(n * element_bytes(t.dtype)) != t.bytes.size()) {
      return invalid_argument("{}: tensor '{}': {} bytes given, shape needs {}", path, t.name, t.bytes.size(),
                              n * element_bytes(t.dtype));
    }
    if (header.contains(t.name)) return invalid_argument("{}: tensor '{}' given twice", path, t.name);
    header[t.name] = {{"dtype", dtype_str}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // data section 8-byte aligned, as the format suggests

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return io_error("{}: cannot open for writing: {}", path, std::strerror(errno));
  uint8_t len_bytes[8];
  const uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(len >> (8 * i));
  bool ok = std::fwrite(len_bytes, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& t : tensors) {
    if (!ok) break;
    ok = t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return io_error("{}: write failed: {}", path, std::strerror(errno));
  return Status::ok();
}

}  // namespace ds
