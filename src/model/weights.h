// Typed per-layer weights of a qwen35 / qwen35moe model (model spec section 3). Every TensorView
// points into the GGUF mapping (no copy on the CPU) or into buffers owned by the Model.
// Non-obvious choice: the forward reads these structs only; tensor names appear solely in the loader.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

namespace ds {

class GgufFile;

struct AttentionWeights {
  TensorView wq;       // {E, 2*H*D}: per head [q_h (D); gate_h (D)]
  TensorView wk;       // {E, Hkv*D}
  TensorView wv;       // {E, Hkv*D}
  TensorView wo;       // {H*D, E}
  TensorView q_norm;   // {D} F32
  TensorView k_norm;   // {D} F32
};

struct DeltaNetWeights {
  TensorView wqkv;     // {E, conv_dim}: rows [q (key_dim); k (key_dim); v (value_dim)]
  TensorView wgate;    // {E, value_dim}: z
  TensorView conv1d;   // {K, conv_dim} F32
  TensorView dt_bias;  // {nv} F32
  TensorView ssm_a;    // {nv} F32, = -exp(A_log)
  TensorView wbeta;    // {E, nv}
  TensorView walpha;   // {E, nv}
  TensorView norm;     // {dv} F32 (used as is, no +1)
  TensorView wout;     // {value_dim, E}
};

struct DenseFfnWeights {
  TensorView gate;     // {E, n_ff}
  TensorView up;       // {E, n_ff}
  TensorView down;     // {n_ff, E}
};

struct MoeFfnWeights {
  TensorView router;       // {E, n_expert} F32
  TensorView gate_exps;    // {E, n_ff_exp, n_expert} (empty data when gate_up_exps is used)
  TensorView up_exps;      // {E, n_ff_exp, n_expert}
  TensorView gate_up_exps; // {E, 2*n_ff_exp, n_expert}: fused alternative (first n_ff_exp rows gate)
  TensorView down_exps;    // {n_ff_exp, E, n_expert}
  TensorView shexp_gate;   // {E} (or {E, 1}) F32: one logit per token
  TensorView gate_shexp;   // {E, n_ff_shexp}
  TensorView up_shexp;     // {E, n_ff_shexp}
  TensorView down_shexp;   // {n_ff_shexp, E}
};

struct LayerWeights {
  LayerKind kind = LayerKind::kDeltaNet;
  TensorView attn_norm;            // {E} F32
  TensorView post_attention_norm;  // {E} F32
  AttentionWeights attn;           // kind == kAttention
  DeltaNetWeights deltanet;        // kind == kDeltaNet
  DenseFfnWeights ffn;             // qwen35
  MoeFfnWeights moe;               // qwen35moe
};

struct ModelWeights {
  TensorView token_embd;   // {E, V}
  TensorView output_norm;  // {E} F32
  TensorView output;       // {E, V}; the same view as token_embd when tied
  bool tied_output = false;
  std::vector<LayerWeights> layers;  // [n_layer]
};

// Looks up, shape-checks and type-checks every tensor of the config's layout in `file`.
// Sets config->n_vocab from token_embd. Errors name the tensor, the expected and actual shape/type.
Result<ModelWeights> model_weights_from_gguf(const GgufFile& file, ModelConfig* config);

// Validates shapes and dtypes of weights built in memory against a config (same rules as the loader).
Status model_weights_validate(const ModelWeights& weights, const ModelConfig& config);

}  // namespace ds
