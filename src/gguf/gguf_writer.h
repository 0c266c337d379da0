// GGUF v3 writer. Metadata is held in memory; tensor data is produced by a callback per tensor and
// streamed to disk one tensor at a time, so a multi-GB file is written with bounded memory.
// The file is written to PATH.tmp, fsynced and renamed into place.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "gguf/gguf.h"

namespace ds {

class GgufByteSink;  // destination of the serialized bytes (gguf_writer.cpp)

class GgufWriter {
 public:
  // Fills `dst` (exactly n_bytes, the tensor's size in its dtype) with the tensor's data.
  using FillFn = std::function<Status(uint8_t* dst, uint64_t n_bytes)>;
  // Called after each tensor: (tensors done, total tensors, bytes done, total bytes).
  using ProgressFn = std::function<void(size_t, size_t, uint64_t, uint64_t)>;

  GgufWriter() = default;

  void set_alignment(uint32_t alignment);  // also writes general.alignment when != 32

  // Metadata, in insertion order. Setting an existing key replaces its value in place.
  void set_u8(const std::string& key, uint8_t v);
  void set_i8(const std::string& key, int8_t v);
  void set_u16(const std::string& key, uint16_t v);
  void set_i16(const std::string& key, int16_t v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_i64(const std::string& key, int64_t v);
  void set_f32(const std::string& key, float v);
  void set_f64(const std::string& key, double v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_array_u32(const std::string& key, const std::vector<uint32_t>& v);
  void set_array_i32(const std::string& key, const std::vector<int32_t>& v);
  void set_array_f32(const std::string& key, const std::vector<float>& v);
  void set_array_bool(const std::string& key, const std::vector<bool>& v);
  void set_array_string(const std::string& key, const std::vector<std::string>& v);
  // Any value, including arrays of other element types and nested arrays (e.g. copied from a
  // GgufFile). Scalar arrays take their payload from `raw`, others from `elems`.
  void set_value(const std::string& key, const GgufValue& v);

  // Declares a tensor with ggml shape `ne` (ne[0] contiguous). ne[0] must be a multiple of the
  // dtype's block size (DS_CHECKed). Tensors are written in declaration order.
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& ne, FillFn fill);
  size_t n_tensors() const;
  uint64_t total_tensor_bytes() const;

  Status write(const std::string& path, const ProgressFn& progress = {}) const;
  // Whole file in memory (tests, small files).
  Result<std::vector<uint8_t>> write_to_memory() const;

  struct Kv;  // opaque encoded metadata entry
  struct Tensor;

 private:
  Status write_to(GgufByteSink& sink, const std::string& name, const ProgressFn& progress) const;

  std::vector<std::shared_ptr<Kv>> kvs_;
  std::vector<std::shared_ptr<Tensor>> tensors_;
  uint32_t alignment_ = kGgufDefaultAlignment;
};

}  // namespace ds
