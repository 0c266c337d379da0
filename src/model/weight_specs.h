// Internal: the list of tensors a config expects (name, expected ggml shape, dtype rule), each bound
// to its TensorView slot in ModelWeights. Both the GGUF loader and the in-memory validator walk it,
// so the two can never disagree about a tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/weights.h"

namespace ds {

struct WeightSpec {
  std::string name;       // GGUF tensor name, e.g. "blk.3.ssm_a"
  TensorView* slot;       // where the view goes
  int64_t ne[4];          // expected shape (trailing 1s)
  bool f32_only;          // norms, conv, gates kept in F32
  bool optional;          // output.weight (tied), the fused / split expert alternatives
};

// n_vocab must already be set in the config.
std::vector<WeightSpec> weight_specs(const ModelConfig& config, ModelWeights* weights);
// Shape and dtype of one tensor against its spec; messages name the tensor, expected and actual.
Status weight_check(const WeightSpec& spec, const TensorView& t);
// Cross-tensor rules after all slots are filled (expert layout alternatives, tied output).
Status weights_finish(const ModelConfig& config, ModelWeights* weights);

}  // namespace ds
