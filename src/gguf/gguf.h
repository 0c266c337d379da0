// GGUF reader over a memory map (v2 and v3). Every length, count, offset and dimension is bounded
// against the file before use; a malformed file yields a kCorrupt/kUnsupported Status naming the file,
// the byte offset and what is wrong, never a crash or an out-of-bounds read.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace ds {

// On-disk GGUF metadata value types.
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);
// Bytes of a scalar type on disk (u8 1 ... f64 8), or 0 for STRING, ARRAY and invalid ids.
size_t gguf_scalar_size(GgufType t);

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kGgufDefaultAlignment = 32;
// The largest general.alignment the reader accepts (files use 32 to 4096). The writer pads a copy's data
// section to the file's alignment, so a larger one could make a copy of a small file gigabytes long.
constexpr uint32_t kGgufMaxAlignment = 1u << 20;

// A metadata value. Scalars are held decoded; strings and array payloads point into the mapping.
struct GgufValue {
  GgufType type = GgufType::U8;
  // scalar payload (valid for the numeric/bool types)
  union {
    uint64_t u64;
    int64_t i64;
    double f64;
  } num{};
  std::string_view str;            // type == STRING
  GgufType elem_type = GgufType::U8;  // type == ARRAY
  uint64_t n_elems = 0;              // type == ARRAY
  // ARRAY of scalars: raw little-endian payload (n_elems * size of elem_type) inside the mapping.
  const uint8_t* raw = nullptr;
  // ARRAY of strings or of arrays: decoded elements.
  std::vector<GgufValue> elems;
};

// Decodes one little-endian scalar of type `t` (gguf_scalar_size(t) > 0) into a GgufValue.
GgufValue gguf_decode_scalar(GgufType t, const uint8_t* p);

struct GgufKv {
  std::string key;
  GgufValue value;
  uint64_t file_offset = 0;  // where the key starts, for error messages
};

struct GgufTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "{4096, 1024}"
};

class GgufCursor;  // bounds-checked reader over the file bytes (gguf.cpp)

class GgufFile {
 public:
  // Maps and validates a file. `name` in errors is the path.
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parses bytes owned by the caller (must outlive the GgufFile); used by tests and the fuzzer.
  static Result<std::unique_ptr<GgufFile>> from_memory(std::span<const uint8_t> bytes,
                                                       const std::string& name = "<memory>");

  uint32_t version() const { return version_; }
  const std::string& name() const { return name_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }
  const MappedFile* mapping() const { return mapping_.get(); }  // null for from_memory

  // ---- metadata ----
  const std::vector<GgufKv>& kvs() const { return kvs_; }
  const GgufKv* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters: kNotFound if absent; kInvalidArgument naming the key, the expected and the actual
  // type if the stored type differs (exact match, as llama.cpp demands).
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int32_t> get_i32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  // Arrays: the element type must match exactly.
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;
  Result<std::vector<uint32_t>> get_u32_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  Result<std::vector<bool>> get_bool_array(std::string_view key) const;
  // Integer-like getter for keys that may be stored as any integer/bool scalar type
  // (e.g. token ids written by different tools). Rejects non-integer types by name.
  Result<int64_t> get_int(std::string_view key) const;
  // Integer array of any integer/bool element type, widened (for per-layer arrays).
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;

  // ---- tensors ----
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  Status parse();
  Status parse_tensor_info(GgufCursor& cur, GgufTensorInfo* info);
  Status place_tensor_data();

  std::string name_;
  std::unique_ptr<MappedFile> mapping_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  // Lookup by name; the views point into the file bytes, which outlive this object.
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

// Human-readable rendering of a value; arrays longer than `max_elems` are summarized.
std::string gguf_value_to_string(const GgufValue& v, size_t max_elems = 8);

}  // namespace ds
