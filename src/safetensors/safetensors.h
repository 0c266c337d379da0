// Safetensors reader over a memory map: 8-byte little-endian header length, JSON header, data.
// Validates dtypes (F32/F16/BF16 accepted), shapes, offsets (inside the data section, sized exactly
// shape x dtype, non-overlapping) with errors naming the file and tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace ds {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;          // F32, F16 or BF16
  std::vector<int64_t> shape;        // PyTorch order (outermost first)
  const uint8_t* data = nullptr;     // inside the mapping
  uint64_t n_bytes = 0;
  int64_t n_elements() const;
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  static Result<std::unique_ptr<SafetensorsFile>> from_memory(std::span<const uint8_t> bytes,
                                                              const std::string& name = "<memory>");
  const std::string& name() const { return name_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"

  // All elements of a tensor converted to float (any accepted dtype).
  static void to_f32(const SafetensorsTensor& t, float* dst);
  // Elements [begin, begin + n) of a tensor converted to float; the range must lie inside it.
  static void to_f32(const SafetensorsTensor& t, int64_t begin, int64_t n, float* dst);

 private:
  SafetensorsFile() = default;
  Status parse();
  std::string name_;
  std::unique_ptr<MappedFile> mapping_;
  std::span<const uint8_t> bytes_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file (tests and fixtures). Tensors in the given order.
struct SafetensorsWriteTensor {
  std::string name;
  DType dtype;                  // F32, F16, BF16
  std::vector<int64_t> shape;   // PyTorch order
  std::vector<uint8_t> bytes;
};
Status safetensors_write(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace ds
