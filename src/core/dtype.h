// Tensor element types. Numeric ids are ggml's (GGUF stores them on disk), so they never change.
#pragma once

#include <cstdint>
#include <string>

namespace ds {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  // Device layouts: made from a file's tensors at upload, never read from or written to a file
  // (dtype_info(uint32_t) does not know them).
  Q6_K_G4 = 270,  // four Q6_K blocks (1024 elements) with their parts gathered: quant/blocks.h GroupQ6_K4
};

struct DTypeInfo {
  const char* name;    // "q4_K" style, as ggml prints it
  int64_t block_size;  // elements per block (1 for plain types)
  int64_t block_bytes; // bytes per block
  bool quantized;
  bool supported;      // deltaserve can dequantize / compute with it
};

// Info for a raw on-disk id, or nullptr if the id is not a known ggml type (the device layouts' ids
// give nullptr too: no file may carry them).
const DTypeInfo* dtype_info(uint32_t id);
const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
inline int64_t dtype_block_size(DType t) { return dtype_info(t).block_size; }
inline int64_t dtype_block_bytes(DType t) { return dtype_info(t).block_bytes; }
// Bytes of a row of n elements; n must be a multiple of the block size (DS_CHECKed).
int64_t dtype_row_bytes(DType t, int64_t n);
// Parses "f32", "F16", "q4_k", "Q8_0", "bf16" ... (on-disk types only); returns false if unknown.
bool dtype_from_name(const std::string& name, DType* out);

}  // namespace ds
