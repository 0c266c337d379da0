// The conversion driver: config -> metadata, plan -> typed tensors streamed through the GGUF
// writer. The one non-obvious choice: a tensor is materialized in chunks of whole rows (about 16 MiB
// of floats) straight into the writer's output buffer, so even a 5 GB embedding never exists as
// floats in memory at once; the rows of a chunk are gathered, transformed and quantized in parallel.
#include "convert/convert.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "convert/hf_config.h"
#include "convert/hf_weights.h"
#include "convert/tensor_plan.h"
#include "convert/tokenizer_convert.h"
#include "core/check.h"
#include "core/half.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "gguf/gguf_writer.h"
#include "quant/quant.h"

namespace ds::convert {
namespace {

constexpr int64_t kChunkElements = int64_t{1} << 22;  // floats per conversion chunk (16 MiB)

void convert_rows(DType t, const float* src, uint8_t* dst, int64_t n_rows, int64_t n_per_row) {
  const int64_t n = n_rows * n_per_row;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    default:
      quant::quantize_rows(t, src, dst, n_rows, n_per_row, 1);
  }
}

void write_model_metadata(const HfConfig& c, const ConvertOptions& opts, GgufWriter& w) {
  const std::string a = c.gguf_architecture;
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  std::string name = std::filesystem::path(opts.hf_dir).lexically_normal().filename().string();
  if (name.empty() || name == ".") name = std::filesystem::path(opts.hf_dir).lexically_normal().parent_path().filename().string();
  w.set_string("general.architecture", a);
  if (!name.empty()) w.set_string("general.name", name);
  w.set_u32("general.file_type", out_type_file_type(opts.type));
  if (opts.type == OutType::kQ8_0 || opts.type == OutType::kQ4_0 || opts.type == OutType::kQ4_K_M) {
    w.set_u32("general.quantization_version", 2);
  }
  w.set_u32(a + ".block_count", u32(c.n_layer));
  w.set_u32(a + ".context_length", u32(c.n_ctx_train));
  w.set_u32(a + ".embedding_length", u32(c.n_embd));
  if (c.n_ff > 0) w.set_u32(a + ".feed_forward_length", u32(c.n_ff));
  w.set_u32(a + ".attention.head_count", u32(c.n_head));
  w.set_u32(a + ".attention.head_count_kv", u32(c.n_head_kv));
  w.set_u32(a + ".attention.key_length", u32(c.head_dim));
  w.set_u32(a + ".attention.value_length", u32(c.head_dim));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  w.set_f32(a + ".rope.freq_base", c.rope_theta);
  w.set_u32(a + ".rope.dimension_count", u32(c.n_rot()));
  w.set_array_i32(a + ".rope.dimension_sections", c.rope_sections);
  w.set_u32(a + ".ssm.conv_kernel", u32(c.ssm_conv_kernel));
  w.set_u32(a + ".ssm.state_size", u32(c.ssm_d_state));
  w.set_u32(a + ".ssm.group_count", u32(c.ssm_n_k_heads));
  w.set_u32(a + ".ssm.time_step_rank", u32(c.ssm_n_v_heads));
  w.set_u32(a + ".ssm.inner_size", u32(c.ssm_value_dim()));
  w.set_u32(a + ".full_attention_interval", u32(c.full_attention_interval));
  if (c.has_layer_types) w.set_array_bool(a + ".attention.recurrent_layers", c.recurrent_layers);
  if (c.is_moe) {
    w.set_u32(a + ".expert_count", u32(c.n_expert));
    w.set_u32(a + ".expert_used_count", u32(c.n_expert_used));
    w.set_u32(a + ".expert_feed_forward_length", u32(c.n_ff_exp));
    w.set_u32(a + ".expert_shared_feed_forward_length", u32(c.n_ff_shexp));
  }
}

std::string ne_string(const std::vector<int64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

}  // namespace

Result<ConvertStats> convert_hf_to_gguf(const ConvertOptions& opts) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  DS_ASSIGN_OR_RETURN(HfConfig cfg, hf_config_load((fs::path(opts.hf_dir) / "config.json").string()));
  DS_LOG_INFO("convert: {} ({}) -> {}: {} layers, n_embd {}, n_vocab {}{}", cfg.hf_architecture,
              cfg.gguf_architecture, opts.out_path, cfg.n_layer, cfg.n_embd, cfg.n_vocab,
              cfg.is_moe ? fmt::format(", {} experts", cfg.n_expert) : std::string());
  DS_ASSIGN_OR_RETURN(auto weights, HfWeights::open(opts.hf_dir));
  DS_ASSIGN_OR_RETURN(std::vector<PlannedTensor> plan, plan_tensors(cfg, *weights));
  DS_ASSIGN_OR_RETURN(TokenizerData tok, tokenizer_load(opts.hf_dir, cfg));

  std::vector<TypeQuery> queries;
  for (const auto& p : plan) queries.push_back({p.name, p.ne, p.keep_f32});
  const std::vector<DType> types = assign_types(queries, opts.type, cfg.n_layer, cfg.is_moe ? cfg.n_expert : 0);

  GgufWriter writer;
  write_model_metadata(cfg, opts, writer);
  tokenizer_write_metadata(tok, writer);

  ThreadPool pool(opts.n_threads);  // 0: one thread per hardware thread
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor* p = &plan[i];
    const DType t = types[i];
    const bool quantized_out =
        opts.type == OutType::kQ8_0 || opts.type == OutType::kQ4_0 || opts.type == OutType::kQ4_K_M;
    if (quantized_out && t == DType::F16) {
      DS_LOG_INFO("convert: {} has row length {}, not a multiple of the block size; stored as f16", p->name,
                  p->row_len());
    }
    writer.add_tensor(p->name, t, p->ne, [p, t, &pool](uint8_t* dst, uint64_t n_bytes) -> Status {
      const int64_t row_len = p->row_len(), n_rows = p->n_rows();
      const int64_t row_bytes = dtype_row_bytes(t, row_len);
      DS_CHECK(static_cast<uint64_t>(row_bytes * n_rows) == n_bytes, "{}: writer asks {} bytes, plan has {}",
               p->name, n_bytes, row_bytes * n_rows);
      const int64_t chunk_rows = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(1, row_len));
      std::vector<float> buf(static_cast<size_t>(std::min(chunk_rows, n_rows) * row_len));
      for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
        const int64_t r1 = std::min(n_rows, r0 + chunk_rows);
        // Each thread gathers, transforms and converts its own rows of the chunk.
        pool.parallel_for(r1 - r0, [&](int64_t b, int64_t e, int) {
          float* rows = buf.data() + b * row_len;
          p->read_rows(r0 + b, r0 + e, rows);
          convert_rows(t, rows, dst + (r0 + b) * row_bytes, e - b, row_len);
        });
      }
      return Status::ok();
    });
  }

  GgufWriter::ProgressFn progress;
  if (opts.progress) {
    progress = [&plan, &types](size_t done, size_t total, uint64_t bytes_done, uint64_t bytes_total) {
      const PlannedTensor& p = plan[done - 1];
      std::fprintf(stderr, "convert: [%zu/%zu] %-32s %-5s %-22s %8.1f / %.1f MiB\n", done, total, p.name.c_str(),
                   dtype_name(types[done - 1]), ne_string(p.ne).c_str(), bytes_done / 1048576.0,
                   bytes_total / 1048576.0);
    };
  }
  DS_TRY(writer.write(opts.out_path, progress).with_context("writing " + opts.out_path));

  ConvertStats stats;
  stats.n_tensors = static_cast<int64_t>(plan.size());
  stats.tensor_bytes = writer.total_tensor_bytes();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  DS_LOG_INFO("convert: wrote {} ({} tensors, {:.1f} MiB, type {}) in {:.2f} s", opts.out_path, stats.n_tensors,
              stats.tensor_bytes / 1048576.0, out_type_name(opts.type), stats.seconds);
  return stats;
}

}  // namespace ds::convert
