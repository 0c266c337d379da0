// Writes a test model (test_model_config.h) as a GGUF file: metadata keys of the spec's section 2
// with their exact value types, the byte-level BPE vocabulary, the chat template, and deterministic
// random tensors. Tensors are generated and quantized while the writer streams them, one tensor at a
// time and rows in parallel, so memory stays bounded by the largest tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gguf/gguf_writer.h"
#include "testmodel/test_model_config.h"

namespace ds::testmodel {

// How K-quant tensors (Q4_K, Q5_K, Q6_K) are produced. Exact quantizes every generated row with the
// reference quantizer (a few million elements per second and core). BlockPool quantizes a pool of
// up to 1024 random blocks per tensor and fills each row with blocks picked by the row's own generator:
// the same value distribution and the same determinism, at memory-copy speed, which is what makes
// the real shapes (tens of GB of K-quants) practical. Auto picks BlockPool above 1 GB of tensor data.
enum class QuantMode { kAuto, kExact, kBlockPool };

struct TestModelWriteOptions {
  ThreadPool* pool = nullptr;  // null: ThreadPool::global()
  bool progress = false;       // percent, MB/s and ETA on stderr
  QuantMode quant_mode = QuantMode::kAuto;
};

// The mode kAuto resolves to for a file with `tensor_bytes` of tensor data.
QuantMode test_model_resolve_quant_mode(QuantMode mode, uint64_t tensor_bytes);

// Declares the metadata and tensors of `config` on `writer` (which must be empty). The tensor fill
// callbacks keep what they need alive by themselves; the pool must outlive the write.
Status test_model_declare(const TestModelConfig& config, GgufWriter& writer, const TestModelWriteOptions& options);

// Generates the file at `path` (written to a temporary name and renamed into place).
Status test_model_write(const TestModelConfig& config, const std::string& path, const TestModelWriteOptions& options);

// The whole file in memory (tests and small models).
Result<std::vector<uint8_t>> test_model_write_to_memory(const TestModelConfig& config,
                                                        const TestModelWriteOptions& options);

// Bumped whenever the bytes written for a given config change (vocabulary, initialisation, layout).
constexpr int kTestModelGeneratorVersion = 1;

}  // namespace ds::testmodel
