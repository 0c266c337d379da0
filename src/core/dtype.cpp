// Table of ggml type ids, block sizes and names.
#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cstddef>

#include "core/check.h"

namespace ds {
namespace {

struct Entry {
  uint32_t id;
  DTypeInfo info;
};

// Block byte sizes follow ggml-common.h; supported marks what deltaserve reads and computes.
constexpr Entry kTypes[] = {
    {0, {"f32", 1, 4, false, true}},
    {1, {"f16", 1, 2, false, true}},
    {2, {"q4_0", 32, 18, true, true}},
    {3, {"q4_1", 32, 20, true, false}},
    {6, {"q5_0", 32, 22, true, true}},
    {7, {"q5_1", 32, 24, true, true}},
    {8, {"q8_0", 32, 34, true, true}},
    {9, {"q8_1", 32, 36, true, false}},
    {10, {"q2_K", 256, 84, true, false}},
    {11, {"q3_K", 256, 110, true, false}},
    {12, {"q4_K", 256, 144, true, true}},
    {13, {"q5_K", 256, 176, true, true}},
    {14, {"q6_K", 256, 210, true, true}},
    {15, {"q8_K", 256, 292, true, true}},
    {24, {"i8", 1, 1, false, false}},
    {25, {"i16", 1, 2, false, false}},
    {26, {"i32", 1, 4, false, false}},
    {27, {"i64", 1, 8, false, false}},
    {28, {"f64", 1, 8, false, false}},
    {30, {"bf16", 1, 2, false, true}},
};

// Device layouts (DType comments); their ids are not ggml's and no file may use them.
constexpr Entry kDeviceTypes[] = {
    {270, {"q6_K_g4", 1024, 848, true, true}},
};

template <size_t N>
const DTypeInfo* find_info(const Entry (&table)[N], uint32_t id) {
  for (const auto& e : table) {
    if (e.id == id) return &e.info;
  }
  return nullptr;
}

}  // namespace

const DTypeInfo* dtype_info(uint32_t id) { return find_info(kTypes, id); }

const DTypeInfo& dtype_info(DType t) {
  const uint32_t id = static_cast<uint32_t>(t);
  const DTypeInfo* info = dtype_info(id);
  if (info == nullptr) info = find_info(kDeviceTypes, id);
  DS_CHECK(info != nullptr, "unknown dtype id {}", id);
  return *info;
}

int64_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  DS_CHECK(n % info.block_size == 0, "row of {} elements is not a multiple of {} block size {}", n,
           info.name, info.block_size);
  return n / info.block_size * info.block_bytes;
}

bool dtype_from_name(const std::string& name, DType* out) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& e : kTypes) {
    std::string n = e.info.name;
    std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
    if (n == lower) {
      *out = static_cast<DType>(e.id);
      return true;
    }
  }
  return false;
}

}  // namespace ds
