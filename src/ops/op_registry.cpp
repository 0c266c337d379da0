// The op support table: the CPU entries are listed here; other backends add theirs via op_register.
#include "ops/op_registry.h"

#include <mutex>

namespace ds {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<OpSupport>& registry() {
  static std::vector<OpSupport> table = [] {
    std::vector<OpSupport> t;
    for (DType dt : matmul_weight_dtypes()) {
      t.push_back({"matmul", DeviceKind::kCpu, dt});
      t.push_back({"get_rows", DeviceKind::kCpu, dt});
      t.push_back({"moe_ffn", DeviceKind::kCpu, dt});
    }
    for (const char* op : {"rms_norm", "l2_norm", "rope_neox", "attention", "delta_net", "delta_net_gates",
                           "delta_net_prep", "conv1d_causal", "add", "mul", "silu", "sigmoid", "swiglu", "mul_sigmoid",
                           "copy",
                           "moe_route"}) {
      t.push_back({op, DeviceKind::kCpu, DType::F32});
    }
    // F16, Q8_0 and Q4_0 KV caches: attention reads their chunks, copy writes them.
    for (DType kv : {DType::F16, DType::Q8_0, DType::Q4_0}) {
      t.push_back({"attention", DeviceKind::kCpu, kv});
      t.push_back({"copy", DeviceKind::kCpu, kv});
    }
    return t;
  }();
  return table;
}

}  // namespace

const std::vector<DType>& matmul_weight_dtypes() {
  static const std::vector<DType> types = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                                           DType::Q5_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  return types;
}

const std::vector<OpSupport>& op_support_table() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry();
}

bool op_supported(std::string_view op, DeviceKind device, DType dtype) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const OpSupport& s : registry()) {
    if (s.device == device && s.dtype == dtype && op == s.op) return true;
  }
  return false;
}

void op_register(const char* op, DeviceKind device, DType dtype) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const OpSupport& s : registry()) {
    if (s.device == device && s.dtype == dtype && std::string_view(op) == s.op) return;
  }
  registry().push_back({op, device, dtype});
}

}  // namespace ds
