// GGUF metadata and streamed tensor generation for test models. Each tensor's fill callback splits
// its rows into batches of about 32 MB of output, fills a batch in parallel (every row seeded on its
// own, so the bytes do not depend on the thread count) and reports progress between batches. In
// block-pool mode a K-quant tensor first quantizes its pool, then rows copy blocks from it.
#include "testmodel/test_model_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/check.h"
#include "quant/quant.h"
#include "testmodel/bpe_vocab.h"
#include "testmodel/chat_template_data.h"
#include "testmodel/tensor_plan.h"

namespace ds::testmodel {
namespace {

constexpr uint64_t kBatchOutputBytes = uint64_t{32} << 20;
// Pooled blocks per tensor: 1024, or an eighth of the tensor's blocks when that is fewer (small
// tensors would otherwise spend more time on the pool than on themselves), but at least 16.
constexpr int64_t kPoolMaxBlocks = 1024;
constexpr int64_t kPoolMinBlocks = 16;
constexpr int64_t kPoolRowBase = int64_t{1} << 62;  // pool blocks use "rows" no tensor has
constexpr uint64_t kAutoPoolBytes = uint64_t{1} << 30;

// Percent, throughput and ETA on stderr: one updating line on a terminal (twice a second), plain
// lines every 5 seconds when stderr is a file or pipe; always a final line.
class ProgressMeter {
 public:
  ProgressMeter(uint64_t total_bytes, bool enabled)
      : total_(total_bytes), enabled_(enabled), tty_(::isatty(2) == 1), start_(std::chrono::steady_clock::now()) {}

  void add(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ += bytes;
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool last = done_ >= total_;
    if (!last && now - last_print_ < std::chrono::milliseconds(tty_ ? 500 : 5000)) return;
    last_print_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double mb = static_cast<double>(done_) / 1e6;
    const double mb_s = secs > 0 ? mb / secs : 0.0;
    const double eta = mb_s > 0 ? (static_cast<double>(total_ - std::min(done_, total_)) / 1e6) / mb_s : 0.0;
    const double pct = total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
    std::fprintf(stderr, "%sgenerating: %5.1f%%  %.0f / %.0f MB  %.1f MB/s  ETA %dm%02ds%s", tty_ ? "\r" : "", pct,
                 mb, static_cast<double>(total_) / 1e6, mb_s, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60,
                 tty_ && !last ? "   " : "\n");
    std::fflush(stderr);
  }

 private:
  std::mutex mutex_;  // guards done_ and last_print_
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_print_{};
};

struct FillContext {
  uint64_t seed = 0;
  ThreadPool* pool = nullptr;
  bool block_pool = false;
  std::unique_ptr<ProgressMeter> progress;
};

bool is_k_quant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }

int64_t block_pool_size(const TensorSpec& t) {
  const int64_t n_blocks = t.n_rows() * (t.ne[0] / dtype_block_size(t.dtype));
  return std::clamp(n_blocks / 8, kPoolMinBlocks, kPoolMaxBlocks);
}

// n_pool quantized blocks of the tensor's distribution, generated like rows of their own.
std::vector<uint8_t> make_block_pool(const FillContext& ctx, const TensorSpec& t, uint64_t name_hash, int64_t n_pool) {
  const int64_t block = dtype_block_size(t.dtype), block_bytes = dtype_block_bytes(t.dtype);
  std::vector<uint8_t> pool(static_cast<size_t>(n_pool * block_bytes));
  std::vector<std::vector<float>> scratch(ctx.pool->n_threads(), std::vector<float>(block));
  ctx.pool->parallel_for(n_pool, [&](int64_t begin, int64_t end, int tid) {
    for (int64_t i = begin; i < end; ++i) {
      weight_init_row(ctx.seed, name_hash, t.init, kPoolRowBase + i, scratch[tid].data(), block);
      quant::quantize_row(t.dtype, scratch[tid].data(), pool.data() + i * block_bytes, block);
    }
  });
  return pool;
}

Status fill_tensor(const FillContext& ctx, const TensorSpec& t, uint8_t* dst, uint64_t n_bytes) {
  const int64_t n_per_row = t.ne[0];
  const int64_t n_rows = t.n_rows();
  const int64_t row_bytes = dtype_row_bytes(t.dtype, n_per_row);
  if (n_bytes != static_cast<uint64_t>(row_bytes * n_rows)) {
    return internal_error("tensor {}: writer asked for {} bytes, expected {}", t.name, n_bytes, row_bytes * n_rows);
  }
  const uint64_t name_hash = weight_init_name_hash(t.name);
  const int n_threads = ctx.pool->n_threads();
  const bool pooled = ctx.block_pool && is_k_quant(t.dtype);
  const int64_t n_pool = pooled ? block_pool_size(t) : 0;
  const std::vector<uint8_t> block_pool = pooled ? make_block_pool(ctx, t, name_hash, n_pool) : std::vector<uint8_t>();
  const int64_t block_bytes = dtype_block_bytes(t.dtype);
  const int64_t blocks_per_row = n_per_row / dtype_block_size(t.dtype);
  std::vector<std::vector<float>> scratch(pooled ? 0 : n_threads, std::vector<float>(n_per_row));
  const int64_t batch_rows =
      std::max<int64_t>(4 * n_threads, static_cast<int64_t>(kBatchOutputBytes / static_cast<uint64_t>(row_bytes)));
  for (int64_t r0 = 0; r0 < n_rows; r0 += batch_rows) {
    const int64_t r1 = std::min(n_rows, r0 + batch_rows);
    ctx.pool->parallel_for(r1 - r0, [&](int64_t begin, int64_t end, int tid) {
      for (int64_t r = r0 + begin; r < r0 + end; ++r) {
        uint8_t* out = dst + r * row_bytes;
        if (pooled) {
          RowRng rng(ctx.seed, name_hash, r);
          for (int64_t b = 0; b < blocks_per_row; ++b) {
            const uint64_t pick = ((rng.next() >> 32) * static_cast<uint64_t>(n_pool)) >> 32;  // in [0, n_pool)
            std::memcpy(out + b * block_bytes, block_pool.data() + pick * block_bytes, static_cast<size_t>(block_bytes));
          }
          continue;
        }
        float* row = scratch[tid].data();
        weight_init_row(ctx.seed, name_hash, t.init, r, row, n_per_row);
        if (t.dtype == DType::F32) std::memcpy(out, row, static_cast<size_t>(row_bytes));
        else quant::quantize_row(t.dtype, row, out, n_per_row);
      }
    });
    ctx.progress->add(static_cast<uint64_t>((r1 - r0) * row_bytes));
  }
  return Status::ok();
}

void declare_metadata(const TestModelConfig& c, const TestVocab& vocab, GgufWriter& w) {
  const std::string a = test_arch_name(c.arch);
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w.set_string("general.architecture", a);
  w.set_string("general.name", "deltaserve test model " + c.preset);
  w.set_u32("general.file_type", out_type_file_type(c.type));
  w.set_u32("general.quantization_version", 2);
  w.set_u32(a + ".block_count", u32(c.n_layer));
  w.set_u32(a + ".context_length", u32(c.n_ctx));
  w.set_u32(a + ".embedding_length", u32(c.n_embd));
  if (!c.is_moe()) w.set_u32(a + ".feed_forward_length", u32(c.n_ff));
  w.set_u32(a + ".attention.head_count", u32(c.n_head));
  w.set_u32(a + ".attention.head_count_kv", u32(c.n_head_kv));
  w.set_u32(a + ".attention.key_length", u32(c.head_dim));
  w.set_u32(a + ".attention.value_length", u32(c.head_dim));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  w.set_f32(a + ".rope.freq_base", c.rope_freq_base);
  w.set_u32(a + ".rope.dimension_count", u32(c.n_rot));
  w.set_array_i32(a + ".rope.dimension_sections", c.rope_sections());
  w.set_u32(a + ".ssm.conv_kernel", u32(c.ssm_conv_kernel));
  w.set_u32(a + ".ssm.state_size", u32(c.ssm_head_dim));
  w.set_u32(a + ".ssm.group_count", u32(c.ssm_n_k_heads));
  w.set_u32(a + ".ssm.time_step_rank", u32(c.ssm_n_v_heads));
  w.set_u32(a + ".ssm.inner_size", u32(c.ssm_value_dim()));
  w.set_u32(a + ".full_attention_interval", u32(c.full_attention_interval));
  if (c.is_moe()) {
    w.set_u32(a + ".expert_count", u32(c.n_expert));
    w.set_u32(a + ".expert_used_count", u32(c.n_expert_used));
    w.set_u32(a + ".expert_feed_forward_length", u32(c.n_ff_exp));
    w.set_u32(a + ".expert_shared_feed_forward_length", u32(c.n_ff_shexp));
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen35");
  w.set_array_string("tokenizer.ggml.tokens", vocab.tokens);
  w.set_array_i32("tokenizer.ggml.token_type", vocab.token_types);
  w.set_array_string("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", vocab.bos_id);
  w.set_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  w.set_u32("tokenizer.ggml.padding_token_id", vocab.pad_id);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template", qwen35_chat_template());
}

}  // namespace

QuantMode test_model_resolve_quant_mode(QuantMode mode, uint64_t tensor_bytes) {
  if (mode != QuantMode::kAuto) return mode;
  return tensor_bytes > kAutoPoolBytes ? QuantMode::kBlockPool : QuantMode::kExact;
}

Status test_model_declare(const TestModelConfig& config, GgufWriter& writer, const TestModelWriteOptions& options) {
  DS_CHECK(writer.n_tensors() == 0, "test_model_declare needs an empty writer");
  DS_ASSIGN_OR_RETURN(std::vector<TensorSpec> tensors, test_model_tensors(config));
  DS_ASSIGN_OR_RETURN(TestVocab vocab, test_vocab_build(config.n_vocab));
  declare_metadata(config, vocab, writer);
  auto ctx = std::make_shared<FillContext>();
  ctx->seed = config.seed;
  ctx->pool = options.pool ? options.pool : &ThreadPool::global();
  const uint64_t total = test_model_tensor_bytes(tensors);
  ctx->block_pool = test_model_resolve_quant_mode(options.quant_mode, total) == QuantMode::kBlockPool;
  ctx->progress = std::make_unique<ProgressMeter>(total, options.progress);
  for (auto& t : tensors) {
    auto spec = std::make_shared<TensorSpec>(std::move(t));
    writer.add_tensor(spec->name, spec->dtype, spec->ne,
                      [ctx, spec](uint8_t* dst, uint64_t n_bytes) { return fill_tensor(*ctx, *spec, dst, n_bytes); });
  }
  return Status::ok();
}

Status test_model_write(const TestModelConfig& config, const std::string& path, const TestModelWriteOptions& options) {
  GgufWriter writer;
  DS_TRY(test_model_declare(config, writer, options));
  DS_TRY(writer.write(path).with_context("writing test model"));
  return Status::ok();
}

Result<std::vector<uint8_t>> test_model_write_to_memory(const TestModelConfig& config,
                                                        const TestModelWriteOptions& options) {
  GgufWriter writer;
  DS_TRY(test_model_declare(config, writer, options));
  return writer.write_to_memory();
}

}  // namespace ds::testmodel
