// The HF -> GGUF tensor mapping for qwen35 / qwen35moe: which GGUF tensors are written, their ggml
// shapes, and for every output row which source row it comes from and how values are transformed.
// A plan holds no tensor data, only pointers into the mapped safetensors files, so a tensor is
// materialized one chunk of rows at a time while it is written (bounded memory).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "convert/hf_config.h"
#include "convert/hf_weights.h"
#include "core/status.h"
#include "safetensors/safetensors.h"

namespace ds::convert {

enum class ValueOp {
  kCopy,
  kAddOne,  // zero-centred HF RMSNorm weight -> effective multiplier (1 + w)
  kNegExp,  // A_log -> ssm_a = -exp(A_log)
};

// One source row: `row` of `tensor` viewed as [rows, row_len] with row_len = the output's ne[0].
struct RowRef {
  const SafetensorsTensor* tensor = nullptr;
  int64_t row = 0;
};

struct PlannedTensor {
  std::string name;          // GGUF name, e.g. "blk.3.ssm_a"
  std::vector<int64_t> ne;   // ggml order, ne[0] contiguous
  bool keep_f32 = false;     // 1-D tensors, norms, ssm_conv1d, routers: never converted to --type
  std::function<RowRef(int64_t)> source_row;  // output row -> source row
  std::vector<int64_t> col_perm;  // output column c takes source column col_perm[c]; empty = identity
  ValueOp op = ValueOp::kCopy;

  int64_t row_len() const { return ne[0]; }
  int64_t n_rows() const;
  int64_t n_elements() const { return row_len() * n_rows(); }
  // dst[(r - r0) * row_len + c] = transformed value of output element (c, r), for r in [r0, r1).
  void read_rows(int64_t r0, int64_t r1, float* dst) const;
};

// The V-head permutation from HF's grouped order to ggml's tiled order: output head j takes
// source head v_head_source(j). Identity when nv == nk.
int64_t v_head_source(int64_t j, int64_t n_k_heads, int64_t n_v_heads);

// Builds the full plan, checking every source tensor's presence and PyTorch shape. Tensors of the
// checkpoint that the plan does not use are an error (they would silently change the model).
Result<std::vector<PlannedTensor>> plan_tensors(const HfConfig& cfg, const HfWeights& weights);

}  // namespace ds::convert
