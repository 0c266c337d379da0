// The tensor list of a generated test model: names, ggml shapes, dtypes and initialisations, in
// file order (token_embd, then each layer, then output_norm and output). The set is exactly the
// spec's section 3 for the configured architecture, so loaders that insist on consuming every
// tensor accept the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "testmodel/test_model_config.h"
#include "testmodel/weight_init.h"

namespace ds::testmodel {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the row length
  DType dtype = DType::F32;
  WeightInit init;
  int64_t n_rows() const;  // product of ne[1..]
};

// Tensors with their dtypes under config.type. Norms, 1-D tensors, ssm_conv1d, ffn_gate_inp and
// ffn_gate_inp_shexp stay F32. A row length that the chosen plain type cannot hold is refused
// naming the tensor (q4_k_m falls back per its rules instead).
Result<std::vector<TensorSpec>> test_model_tensors(const TestModelConfig& config);

// Sum of the tensors' sizes in bytes.
uint64_t test_model_tensor_bytes(const std::vector<TensorSpec>& tensors);

}  // namespace ds::testmodel
