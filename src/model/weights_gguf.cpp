// Binds ModelWeights to the tensors of a GGUF file, in place (views into the mapping), checking
// every tensor's presence, shape and type against the config. Tensors the model does not use are
// reported (MTP blocks are expected and skipped quietly).
#include <set>

#include "core/log.h"
#include "gguf/gguf.h"
#include "model/weight_specs.h"

namespace ds {
namespace {

TensorView view_of(const GgufTensorInfo& info) {
  TensorView t;
  t.data = const_cast<uint8_t*>(info.data);
  t.dtype = info.dtype;
  t.n_dims = info.n_dims;
  for (int d = 0; d < 4; ++d) t.ne[d] = info.ne[d];
  t.nb[0] = dtype_block_bytes(info.dtype);
  t.nb[1] = dtype_row_bytes(info.dtype, info.ne[0]);
  for (int d = 2; d < 4; ++d) t.nb[d] = t.nb[d - 1] * t.ne[d - 1];
  return t;
}

}  // namespace

Result<ModelWeights> model_weights_from_gguf(const GgufFile& file, ModelConfig* config) {
  const GgufTensorInfo* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) return not_found("{}: tensor 'token_embd.weight' is missing", file.name());
  if (embd->ne[0] != config->n_embd) {
    return invalid_argument("{}: tensor 'token_embd.weight': ne0 {} != embedding_length {}", file.name(), embd->ne[0],
                            config->n_embd);
  }
  config->n_vocab = embd->ne[1];
  ModelWeights w;
  std::set<std::string> used;
  for (const WeightSpec& spec : weight_specs(*config, &w)) {
    const GgufTensorInfo* info = file.find_tensor(spec.name);
    if (info == nullptr) {
      if (spec.optional) continue;
      return not_found("{}: tensor '{}' is missing", file.name(), spec.name);
    }
    const DTypeInfo* dt = dtype_info(static_cast<uint32_t>(info->dtype));
    if (dt == nullptr || !dt->supported) {
      return unsupported("{}: tensor '{}' has unsupported type {}", file.name(), spec.name,
                         dt ? dt->name : "unknown");
    }
    *spec.slot = view_of(*info);
    Status s = weight_check(spec, *spec.slot);
    if (!s.is_ok()) return s.with_context(file.name());
    used.insert(spec.name);
  }
  Status s = weights_finish(*config, &w);
  if (!s.is_ok()) return s.with_context(file.name());
  int64_t unused = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (used.count(t.name)) continue;
    int64_t layer = -1;  // the N of "blk.N.", parsed without exceptions
    if (t.name.rfind("blk.", 0) == 0) {
      layer = 0;
      for (size_t i = 4; i < t.name.size() && t.name[i] != '.'; ++i) {
        if (t.name[i] < '0' || t.name[i] > '9' || layer > (int64_t{1} << 40)) {
          layer = -1;
          break;
        }
        layer = layer * 10 + (t.name[i] - '0');
      }
    }
    const bool mtp = layer >= config->n_layer;
    if (!mtp) {
      ++unused;
      DS_LOG_WARN("{}: tensor '{}' is not used by the {} model", file.name(), t.name, model_arch_name(config->arch));
    }
  }
  if (unused > 0) DS_LOG_WARN("{}: {} tensors ignored", file.name(), unused);
  return w;
}

}  // namespace ds
