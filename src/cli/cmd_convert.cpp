// `deltaserve convert HF_DIR OUT.gguf`: Hugging Face Qwen3.5 / Qwen3.6 safetensors checkpoint to GGUF.
// The one non-obvious choice: --type names a whole-file mix (q4_k_m picks per-tensor types the way
// llama-quantize does), not one type for every tensor; norms, 1-D tensors, convs and routers stay f32.
#include <string>

#include "cli/command.h"
#include "convert/convert.h"
#include "core/log.h"

namespace {

struct Args {
  std::string hf_dir;
  std::string out_path;
  std::string type = "f16";
  int threads = 0;
  bool quiet = false;
};

void setup(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<Args>();
  app.add_option("HF_DIR", args->hf_dir, "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)")
      ->required();
  app.add_option("OUT", args->out_path, "Output GGUF file")->required();
  app.add_option("--type", args->type, "Output type: f32, f16, bf16, q8_0, q4_0, q4_k_m")
      ->capture_default_str();
  app.add_option("--threads", args->threads, "Quantization threads (0 = all hardware threads)")
      ->capture_default_str();
  app.add_flag("--quiet", args->quiet, "No per-tensor progress lines");
  app.callback([args, &exit_code] {
    ds::convert::ConvertOptions opts;
    opts.hf_dir = args->hf_dir;
    opts.out_path = args->out_path;
    opts.n_threads = args->threads;
    opts.progress = !args->quiet;
    if (!ds::convert::out_type_from_name(args->type, &opts.type)) {
      exit_code = ds::cli::report(
          ds::invalid_argument("--type {}: unknown output type (f32, f16, bf16, q8_0, q4_0, q4_k_m)", args->type));
      return;
    }
    if (args->threads < 0) {
      exit_code = ds::cli::report(ds::invalid_argument("--threads {}: must be >= 0", args->threads));
      return;
    }
    auto r = ds::convert::convert_hf_to_gguf(opts);
    exit_code = ds::cli::report(r.status());
  });
}

ds::cli::Registration reg("convert", "Convert a Hugging Face Qwen3.5/3.6 safetensors checkpoint to GGUF", setup);

}  // namespace
