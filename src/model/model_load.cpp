// Model::load: maps the GGUF, reads the config, binds the weights in place (or uploads them to the
// device) and sets up the model.
#include "core/log.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/weight_specs.h"

namespace ds {

Result<std::unique_ptr<Model>> Model::load(const std::string& gguf_path, const ModelOptions& options) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(gguf_path));
  DS_ASSIGN_OR_RETURN(ModelConfig config, model_config_from_gguf(*file));
  DS_ASSIGN_OR_RETURN(ModelWeights weights, model_weights_from_gguf(*file, &config));
  std::unique_ptr<Model> m(new Model());
  m->config_ = std::move(config);
  m->weights_ = std::move(weights);
  m->gguf_ = std::move(file);
  Status s = m->init(options);
  if (!s.is_ok()) return s.with_context(gguf_path);
  const std::string where =
      m->weight_device_bytes_ > 0
          ? fmt::format(", on {} ({:.1f} MiB of weights on the device)", m->options_.device.to_string(),
                        static_cast<double>(m->weight_device_bytes_) / (1 << 20))
          : std::string(", on cpu");
  DS_LOG_INFO("model: {} {} layers ({} attention), n_embd {}, n_vocab {}, n_ctx {}, prefill chunk {}{}{}",
              model_arch_name(m->config_.arch), m->config_.n_layer, m->config_.n_attention_layers(), m->config_.n_embd,
              m->config_.n_vocab, m->n_ctx_, m->options_.prefill_chunk, m->weights_.tied_output ? ", tied output" : "",
              where);
  return m;
}

}  // namespace ds
