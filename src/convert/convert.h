// Hugging Face Qwen3.5 / Qwen3.6 checkpoint (config.json + safetensors) -> GGUF (`qwen35` /
// `qwen35moe`), with metadata, tensor names, transforms and types as the model spec prescribes.
// Tensors are produced, converted and written one at a time, so memory stays bounded by the
// largest tensor's output size plus a fixed row buffer.
#pragma once

#include <string>

#include "convert/quant_policy.h"
#include "core/status.h"

namespace ds::convert {

struct ConvertOptions {
  std::string hf_dir;    // directory with config.json and the safetensors files
  std::string out_path;  // GGUF file to write
  OutType type = OutType::kF16;
  int n_threads = 0;     // quantization threads; 0 = hardware threads
  bool progress = true;  // per-tensor progress lines on stderr
};

struct ConvertStats {
  int64_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  double seconds = 0;
};

Result<ConvertStats> convert_hf_to_gguf(const ConvertOptions& opts);

}  // namespace ds::convert
