// Op registry: which (device, dtype) each op supports, so the placement planner can place work or
// refuse clearly before running a graph. The dtype is the op's "main" operand: the weight for
// matmul / get_rows / moe_ffn, F32 for activation-only ops.
#pragma once

#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace ds {

struct OpSupport {
  const char* op;     // "matmul", "rms_norm", ...
  DeviceKind device;
  DType dtype;
};

// Every registered entry (the CPU table, plus backends that register themselves).
const std::vector<OpSupport>& op_support_table();
bool op_supported(std::string_view op, DeviceKind device, DType dtype);
// Adds an entry (a backend calls this at static-init time). Duplicates are ignored.
void op_register(const char* op, DeviceKind device, DType dtype);

// The weight dtypes matmul supports on the CPU.
const std::vector<DType>& matmul_weight_dtypes();

}  // namespace ds
