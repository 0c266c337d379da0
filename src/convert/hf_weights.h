// The weights of a Hugging Face checkpoint directory: model.safetensors, or the shards listed in
// model.safetensors.index.json. Names are reduced to one canonical form ("layers.3.mlp.gate.weight",
// "embed_tokens.weight", "lm_head.weight") by stripping `model.language_model.` / `model.` prefixes;
// vision (`visual.*`) and multi-token-prediction (`mtp.*`) tensors are dropped and counted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "safetensors/safetensors.h"

namespace ds::convert {

class HfWeights {
 public:
  static Result<std::unique_ptr<HfWeights>> open(const std::string& dir);

  // nullptr when absent. Marks the tensor as used.
  const SafetensorsTensor* find(const std::string& canonical) const;
  bool has(const std::string& canonical) const { return by_name_.count(canonical) != 0; }
  // The tensor, or a kNotFound / kInvalidArgument Status naming it when it is missing or its
  // PyTorch shape differs from `shape`.
  Result<const SafetensorsTensor*> get(const std::string& canonical, const std::vector<int64_t>& shape) const;
  // Name as stored in the checkpoint, for messages.
  std::string original_name(const std::string& canonical) const;

  // Canonical names of tensors that were never looked up.
  std::vector<std::string> unused() const;
  int64_t n_dropped_visual() const { return n_dropped_visual_; }
  int64_t n_dropped_mtp() const { return n_dropped_mtp_; }
  const std::string& dir() const { return dir_; }

 private:
  HfWeights() = default;
  Status add_file(const std::string& path);

  std::string dir_;
  std::string prefix_ = "model.";  // prefix seen most recently, for naming absent tensors
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  struct Entry {
    const SafetensorsTensor* tensor;
    std::string original;
  };
  std::map<std::string, Entry> by_name_;
  mutable std::set<std::string> used_;
  int64_t n_dropped_visual_ = 0;
  int64_t n_dropped_mtp_ = 0;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace ds::convert
