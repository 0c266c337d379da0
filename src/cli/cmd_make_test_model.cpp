// `deltaserve make-test-model OUT.gguf --preset NAME [overrides]`: writes a qwen35 / qwen35moe GGUF
// with deterministic random weights. Every dimension has its own flag; flags left out keep the
// preset's value, which is why overrides are read through CLI11's option counts, not defaults.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/thread_pool.h"
#include "testmodel/tensor_plan.h"
#include "testmodel/test_model_config.h"
#include "testmodel/test_model_writer.h"

namespace {

using ds::testmodel::OutType;
using ds::testmodel::TestArch;

struct Args {
  std::string out;
  std::string preset;
  std::string arch;
  std::string type;
  uint64_t seed = 0;
  int threads = 0;
  bool tied_output = false;
  bool quiet = false;
  std::string quant_mode = "auto";
  std::vector<std::pair<CLI::Option*, std::optional<int64_t>*>> dims;
  std::vector<std::unique_ptr<int64_t>> dim_values;
};

void add_dim(CLI::App& app, Args& a, const char* flag, std::optional<int64_t>* field, const char* help) {
  a.dim_values.push_back(std::make_unique<int64_t>(0));
  CLI::Option* opt = app.add_option(flag, *a.dim_values.back(), help);
  a.dims.emplace_back(opt, field);
}

// `o` is the object the dimension flags point into (see add_dim).
ds::Status run(Args& a, ds::testmodel::TestModelOverrides& o) {
  for (size_t i = 0; i < a.dims.size(); ++i) {
    if (a.dims[i].first->count() > 0) *a.dims[i].second = *a.dim_values[i];
  }
  if (!a.arch.empty()) {
    TestArch arch;
    if (!ds::testmodel::test_arch_from_name(a.arch, &arch)) {
      return ds::invalid_argument("--arch {}: expected qwen35 or qwen35moe", a.arch);
    }
    o.arch = arch;
  }
  if (!a.type.empty()) {
    OutType type;
    if (!ds::testmodel::out_type_from_name(a.type, &type)) {
      return ds::invalid_argument("--type {}: expected f32, f16, bf16, q8_0, q4_0 or q4_k_m", a.type);
    }
    o.type = type;
  }
  o.seed = a.seed;
  if (a.tied_output) o.tied_output = true;
  DS_ASSIGN_OR_RETURN(auto config, ds::testmodel::test_model_config_make(a.preset, o));
  DS_ASSIGN_OR_RETURN(auto tensors, ds::testmodel::test_model_tensors(config));

  ds::testmodel::QuantMode mode;
  if (a.quant_mode == "auto") mode = ds::testmodel::QuantMode::kAuto;
  else if (a.quant_mode == "exact") mode = ds::testmodel::QuantMode::kExact;
  else if (a.quant_mode == "pool") mode = ds::testmodel::QuantMode::kBlockPool;
  else return ds::invalid_argument("--quant-mode {}: expected auto, exact or pool", a.quant_mode);
  const uint64_t tensor_bytes = ds::testmodel::test_model_tensor_bytes(tensors);
  mode = ds::testmodel::test_model_resolve_quant_mode(mode, tensor_bytes);

  ds::ThreadPool pool(a.threads);
  std::fprintf(stderr, "make-test-model: %s %s, %s, %zu tensors, %.1f MB of tensor data, %d threads, %s K-quants\n",
               config.preset.c_str(), ds::testmodel::test_arch_name(config.arch),
               ds::testmodel::out_type_name(config.type), tensors.size(), static_cast<double>(tensor_bytes) / 1e6,
               pool.n_threads(), mode == ds::testmodel::QuantMode::kBlockPool ? "block-pool" : "exact");
  const auto start = std::chrono::steady_clock::now();
  ds::testmodel::TestModelWriteOptions options;
  options.pool = &pool;
  options.progress = !a.quiet;
  options.quant_mode = mode;
  DS_TRY(ds::testmodel::test_model_write(config, a.out, options));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;
  const auto size = std::filesystem::file_size(a.out, ec);
  std::fprintf(stderr, "wrote %s (%.1f MB) in %.1f s\n", a.out.c_str(), ec ? 0.0 : static_cast<double>(size) / 1e6,
               secs);
  return ds::Status::ok();
}

void setup(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<Args>();
  auto overrides = std::make_shared<ds::testmodel::TestModelOverrides>();
  Args& a = *args;
  ds::testmodel::TestModelOverrides& o = *overrides;
  app.add_option("OUT", a.out, "Output GGUF path")->required();
  app.add_option("--preset", a.preset,
                 "Shapes to start from: tiny (a few MB, tests), small (~200 MB in q8_0, CPU benchmarks), "
                 "qwen3.6-27b, qwen3.6-35b-a3b (the real shapes)")
      ->required();
  app.add_option("--arch", a.arch, "Architecture qwen35 (dense) or qwen35moe; only for tiny and small");
  app.add_option("--type", a.type,
                 "Weight type: f32, f16, bf16, q8_0, q4_0, q4_k_m (default f32 for tiny/small, q4_k_m for the "
                 "real shapes); norms, ssm_conv1d, ssm_a, ssm_dt.bias and routers stay f32");
  app.add_option("--seed", a.seed, "Random seed; the same seed gives a byte-identical file (default 0)");
  app.add_option("--threads", a.threads, "Generation threads (default 0: all cores); does not change the output");
  app.add_flag("--tied-output", a.tied_output, "Omit output.weight (the token embedding is reused as the output)");
  app.add_flag("--quiet", a.quiet, "No progress on stderr");
  app.add_option("--quant-mode", a.quant_mode,
                 "K-quant production: exact (quantize every row), pool (rows built from up to 1024 quantized "
                 "random blocks per tensor: same distribution, far faster), auto (pool above 1 GB; default)");
  add_dim(app, a, "--n-embd", &o.n_embd, "Hidden size (embedding_length)");
  add_dim(app, a, "--n-layer", &o.n_layer, "Number of layers (block_count)");
  add_dim(app, a, "--n-head", &o.n_head, "Query heads of the full-attention layers");
  add_dim(app, a, "--n-head-kv", &o.n_head_kv, "Key/value heads of the full-attention layers");
  add_dim(app, a, "--head-dim", &o.head_dim, "Attention head size (key_length = value_length)");
  add_dim(app, a, "--n-rot", &o.n_rot, "Rotated dims per head (rope.dimension_count), even, <= head dim");
  add_dim(app, a, "--n-ff", &o.n_ff, "Dense FFN width (qwen35)");
  add_dim(app, a, "--n-vocab", &o.n_vocab, "Vocabulary size (>= 265)");
  add_dim(app, a, "--ssm-n-k-heads", &o.ssm_n_k_heads, "Delta net key heads (ssm.group_count)");
  add_dim(app, a, "--ssm-n-v-heads", &o.ssm_n_v_heads, "Delta net value heads (ssm.time_step_rank), a multiple of the key heads");
  add_dim(app, a, "--ssm-head-dim", &o.ssm_head_dim, "Delta net head size (ssm.state_size)");
  add_dim(app, a, "--ssm-conv-kernel", &o.ssm_conv_kernel, "Delta net conv kernel size (ssm.conv_kernel)");
  add_dim(app, a, "--n-expert", &o.n_expert, "Experts per MoE layer (qwen35moe)");
  add_dim(app, a, "--n-expert-used", &o.n_expert_used, "Experts used per token (qwen35moe)");
  add_dim(app, a, "--n-ff-exp", &o.n_ff_exp, "Expert FFN width (qwen35moe)");
  add_dim(app, a, "--n-ff-shexp", &o.n_ff_shexp, "Shared expert FFN width (qwen35moe)");
  add_dim(app, a, "--full-attention-interval", &o.full_attention_interval,
          "Every N-th layer is full attention, the others are delta net layers");
  add_dim(app, a, "--ctx", &o.n_ctx, "Training context length written to the file (context_length)");
  app.callback([args, overrides, &exit_code] { exit_code = ds::cli::report(run(*args, *overrides)); });
}

ds::cli::Registration reg("make-test-model", "Write a qwen35/qwen35moe GGUF with deterministic random weights", setup);

}  // namespace
