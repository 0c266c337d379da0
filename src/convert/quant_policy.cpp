// Type assignment per tensor. The one non-obvious choice: the shape fallback runs after the name
// rules (a K-quant picked for a row length that is not a multiple of 256 degrades to the matching
// 32-block type, and to F16 when even 32 does not divide it), exactly in llama-quantize's order.
#include "convert/quant_policy.h"

#include "quant/q4_k_m.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace ds::convert {
namespace {

DType shape_fallback(DType t, int64_t ne0) {
  if (t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K) {
    if (ne0 % 256 != 0) {
      t = t == DType::Q4_K ? DType::Q5_0 : t == DType::Q5_K ? DType::Q5_1 : DType::Q8_0;
    }
  }
  if (ne0 % dtype_block_size(t) != 0) t = DType::F16;
  return t;
}

}  // namespace

bool out_type_from_name(const std::string& name, OutType* out) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  for (OutType t : {OutType::kF32, OutType::kF16, OutType::kBF16, OutType::kQ8_0, OutType::kQ4_0, OutType::kQ4_K_M}) {
    if (s == out_type_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

const char* out_type_name(OutType t) {
  switch (t) {
    case OutType::kF32: return "f32";
    case OutType::kF16: return "f16";
    case OutType::kBF16: return "bf16";
    case OutType::kQ8_0: return "q8_0";
    case OutType::kQ4_0: return "q4_0";
    case OutType::kQ4_K_M: return "q4_k_m";
  }
  return "?";
}

uint32_t out_type_file_type(OutType t) {
  switch (t) {
    case OutType::kF32: return 0;
    case OutType::kF16: return 1;
    case OutType::kBF16: return 32;
    case OutType::kQ8_0: return 7;
    case OutType::kQ4_0: return 2;
    case OutType::kQ4_K_M: return 15;
  }
  return 0;
}

std::vector<DType> assign_types(const std::vector<TypeQuery>& tensors, OutType type, int64_t n_layer_all,
                                int64_t n_expert) {
  // Q4_K_M: the shared rules of quant/q4_k_m.h, fed every tensor name in file order.
  std::vector<std::string> names;
  for (const auto& q : tensors) names.push_back(q.name);
  Q4KMState q4km = q4_k_m_state_for(names, n_layer_all, n_expert);
  std::vector<DType> out;
  out.reserve(tensors.size());
  for (const auto& q : tensors) {
    const bool never_quantized = q.keep_f32 || !q4_k_m_quantizes(q.name, q.ne);
    if (never_quantized) {
      out.push_back(DType::F32);
      continue;
    }
    DType t = DType::F32;
    switch (type) {
      case OutType::kF32: t = DType::F32; break;
      case OutType::kF16: t = DType::F16; break;
      case OutType::kBF16: t = DType::BF16; break;
      case OutType::kQ8_0: t = DType::Q8_0; break;
      case OutType::kQ4_0: t = DType::Q4_0; break;
      case OutType::kQ4_K_M: t = q4_k_m_type_for(q.name, q.ne, DType::F32, q4km); break;
    }
    out.push_back(shape_fallback(t, q.ne[0]));
  }
  return out;
}

}  // namespace ds::convert
