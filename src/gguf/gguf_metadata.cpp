// GGUF metadata access: value type names, scalar decoding, typed getters and value rendering.
// Non-obvious choice: scalar arrays stay as raw little-endian bytes in the mapping (a 248k-token
// type array costs nothing until asked for) and are decoded with memcpy, since the payload has no
// alignment guarantee.
#include <cinttypes>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"

namespace ds {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "invalid";
}

size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::STRING: case GgufType::ARRAY: return 0;
  }
  return 0;
}

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64:
    case GgufType::BOOL:
      return true;
    default:
      return false;
  }
}

std::string value_type_string(const GgufValue& v) {
  if (v.type != GgufType::ARRAY) return gguf_type_name(v.type);
  return fmt::format("array[{}]", gguf_type_name(v.elem_type));
}

}  // namespace

GgufValue gguf_decode_scalar(GgufType t, const uint8_t* p) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::U8: v.num.u64 = load<uint8_t>(p); break;
    case GgufType::BOOL: v.num.u64 = load<uint8_t>(p) != 0 ? 1 : 0; break;
    case GgufType::I8: v.num.i64 = load<int8_t>(p); break;
    case GgufType::U16: v.num.u64 = load<uint16_t>(p); break;
    case GgufType::I16: v.num.i64 = load<int16_t>(p); break;
    case GgufType::U32: v.num.u64 = load<uint32_t>(p); break;
    case GgufType::I32: v.num.i64 = load<int32_t>(p); break;
    case GgufType::U64: v.num.u64 = load<uint64_t>(p); break;
    case GgufType::I64: v.num.i64 = load<int64_t>(p); break;
    case GgufType::F32: v.num.f64 = load<float>(p); break;
    case GgufType::F64: v.num.f64 = load<double>(p); break;
    case GgufType::STRING: case GgufType::ARRAY: break;
  }
  return v;
}

// ---- typed getters ----

namespace {

Result<const GgufValue*> lookup(const GgufFile& f, std::string_view key, GgufType want) {
  const GgufKv* kv = f.find(key);
  if (kv == nullptr) return not_found("{}: metadata key '{}' not found", f.name(), key);
  if (kv->value.type != want) {
    return invalid_argument("{}: metadata key '{}': expected type {}, found {}", f.name(), key,
                            gguf_type_name(want), value_type_string(kv->value));
  }
  return &kv->value;
}

Result<const GgufValue*> lookup_array(const GgufFile& f, std::string_view key, GgufType elem) {
  const GgufKv* kv = f.find(key);
  if (kv == nullptr) return not_found("{}: metadata key '{}' not found", f.name(), key);
  if (kv->value.type != GgufType::ARRAY || kv->value.elem_type != elem) {
    return invalid_argument("{}: metadata key '{}': expected type array[{}], found {}", f.name(), key,
                            gguf_type_name(elem), value_type_string(kv->value));
  }
  return &kv->value;
}

template <typename T>
Result<std::vector<T>> scalar_array(const GgufFile& f, std::string_view key, GgufType elem) {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup_array(f, key, elem));
  std::vector<T> out(v->n_elems);
  if (v->n_elems > 0) std::memcpy(out.data(), v->raw, v->n_elems * sizeof(T));
  return out;
}

// Widens an integer/bool scalar; u64 values past int64 are refused.
Result<int64_t> widen(const GgufFile& f, std::string_view key, const GgufValue& v) {
  switch (v.type) {
    case GgufType::U8: case GgufType::U16: case GgufType::U32: case GgufType::U64: case GgufType::BOOL:
      if (v.num.u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return invalid_argument("{}: metadata key '{}': value {} does not fit in int64", f.name(), key,
                                v.num.u64);
      }
      return static_cast<int64_t>(v.num.u64);
    default:
      return v.num.i64;
  }
}

}  // namespace

Result<uint32_t> GgufFile::get_u32(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key, GgufType::U32));
  return static_cast<uint32_t>(v->num.u64);
}

Result<int32_t> GgufFile::get_i32(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key, GgufType::I32));
  return static_cast<int32_t>(v->num.i64);
}

Result<uint64_t> GgufFile::get_u64(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key, GgufType::U64));
  return v->num.u64;
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key, GgufType::F32));
  return static_cast<float>(v->num.f64);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key, GgufType::BOOL));
  return v->num.u64 != 0;
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key, GgufType::STRING));
  return std::string(v->str);
}

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup_array(*this, key, GgufType::STRING));
  std::vector<std::string_view> out;
  out.reserve(v->elems.size());
  for (const GgufValue& e : v->elems) out.push_back(e.str);
  return out;
}

Result<std::vector<int32_t>> GgufFile::get_i32_array(std::string_view key) const {
  return scalar_array<int32_t>(*this, key, GgufType::I32);
}

Result<std::vector<uint32_t>> GgufFile::get_u32_array(std::string_view key) const {
  return scalar_array<uint32_t>(*this, key, GgufType::U32);
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  return scalar_array<float>(*this, key, GgufType::F32);
}

Result<std::vector<bool>> GgufFile::get_bool_array(std::string_view key) const {
  DS_ASSIGN_OR_RETURN(const GgufValue* v, lookup_array(*this, key, GgufType::BOOL));
  std::vector<bool> out(v->n_elems);
  for (uint64_t i = 0; i < v->n_elems; ++i) out[i] = v->raw[i] != 0;
  return out;
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (kv == nullptr) return not_found("{}: metadata key '{}' not found", name_, key);
  if (!is_integer(kv->value.type)) {
    return invalid_argument("{}: metadata key '{}': expected an integer type, found {}", name_, key,
                            value_type_string(kv->value));
  }
  return widen(*this, key, kv->value);
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (kv == nullptr) return not_found("{}: metadata key '{}' not found", name_, key);
  const GgufValue& v = kv->value;
  if (v.type != GgufType::ARRAY || !is_integer(v.elem_type)) {
    return invalid_argument("{}: metadata key '{}': expected an array of an integer type, found {}",
                            name_, key, value_type_string(v));
  }
  const size_t size = gguf_scalar_size(v.elem_type);
  std::vector<int64_t> out;
  out.reserve(v.n_elems);
  for (uint64_t i = 0; i < v.n_elems; ++i) {
    DS_ASSIGN_OR_RETURN(int64_t x, widen(*this, key, gguf_decode_scalar(v.elem_type, v.raw + i * size)));
    out.push_back(x);
  }
  return out;
}

// ---- rendering ----

namespace {

void append_quoted(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void append_value(std::string& out, const GgufValue& v, size_t max_elems);

void append_element(std::string& out, const GgufValue& array, uint64_t i, size_t max_elems) {
  const size_t size = gguf_scalar_size(array.elem_type);
  if (size > 0) {
    append_value(out, gguf_decode_scalar(array.elem_type, array.raw + i * size), max_elems);
  } else {
    append_value(out, array.elems[i], max_elems);
  }
}

void append_value(std::string& out, const GgufValue& v, size_t max_elems) {
  switch (v.type) {
    case GgufType::U8: case GgufType::U16: case GgufType::U32: case GgufType::U64:
      out += fmt::format("{}", v.num.u64);
      return;
    case GgufType::I8: case GgufType::I16: case GgufType::I32: case GgufType::I64:
      out += fmt::format("{}", v.num.i64);
      return;
    case GgufType::F32:
      out += fmt::format("{}", static_cast<float>(v.num.f64));
      return;
    case GgufType::F64:
      out += fmt::format("{}", v.num.f64);
      return;
    case GgufType::BOOL:
      out += v.num.u64 != 0 ? "true" : "false";
      return;
    case GgufType::STRING:
      append_quoted(out, v.str);
      return;
    case GgufType::ARRAY:
      break;
  }
  if (v.n_elems <= max_elems) {
    out += '[';
    for (uint64_t i = 0; i < v.n_elems; ++i) {
      if (i > 0) out += ", ";
      append_element(out, v, i, max_elems);
    }
    out += ']';
    return;
  }
  // Long arrays: count, element type and the first few elements.
  const char* noun = v.elem_type == GgufType::STRING  ? "strings"
                     : v.elem_type == GgufType::ARRAY ? "arrays"
                                                      : gguf_type_name(v.elem_type);
  out += fmt::format("[{} {}: ", v.n_elems, noun);
  const uint64_t shown = std::max<size_t>(1, max_elems / 4);
  for (uint64_t i = 0; i < shown; ++i) {
    append_element(out, v, i, max_elems);
    out += ", ";
  }
  out += "... ]";
}

}  // namespace

std::string gguf_value_to_string(const GgufValue& v, size_t max_elems) {
  std::string out;
  append_value(out, v, max_elems);
  return out;
}

}  // namespace ds
