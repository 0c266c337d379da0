// Output tensor types for `convert --type`: the plain types apply to every 2-D/3-D weight, and
// q4_k_m reproduces the Q4_K_M mix of llama-quantize (spec section 6), including its shape
// fallbacks, so files made here have the same layout as the ones users download.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ds::convert {

enum class OutType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_K_M };

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m" (case-insensitive); false if unknown.
bool out_type_from_name(const std::string& name, OutType* out);
const char* out_type_name(OutType t);
// general.file_type (llama_ftype) for the output type.
uint32_t out_type_file_type(OutType t);

struct TypeQuery {
  std::string name;          // GGUF tensor name
  std::vector<int64_t> ne;   // ggml shape
  bool keep_f32 = false;     // 1-D, norms, ssm_conv1d, routers
};


// Types for every tensor, in file order (the attn_v-like counter depends on the order).
// n_layer_all = block_count; n_expert = expert_count (0 for dense).
std::vector<DType> assign_types(const std::vector<TypeQuery>& tensors, OutType type, int64_t n_layer_all,
                                int64_t n_expert);

}  // namespace ds::convert
