// The Q4_K_M type assignment (model spec section 6, after llama-quantize's rules): which dtype each
// tensor gets in a "Q4_K_M" file. The one copy of these rules: make-test-model and convert both use it.
// The non-obvious part is that two rules depend on position: attn_v-like tensors (attn_v, attn_qkv,
// attn_kv_b) use a running counter over the file, and ffn_down* use the layer index, both fed to
// use_more_bits. So callers first build a Q4KMState from the whole tensor list, then ask for each
// tensor in file order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace ds {

struct Q4KMState {
  int64_t n_layer_all = 0;  // block_count (trunk + MTP layers)
  int64_t n_expert = 0;     // 0 for dense models
  bool has_output = false;  // an output.weight exists (else token_embd is the output)
  int64_t n_attn_v = 0;     // number of attn_v-like tensors in the file
  int64_t i_attn_v = 0;     // attn_v-like tensors seen so far
  int64_t i_ffn_down = 0;   // ffn_down* tensors seen so far (the layer index of dense models)
};

// Counts attn_v-like tensors and detects output.weight over all tensor names of the file.
Q4KMState q4_k_m_state_for(const std::vector<std::string>& names, int64_t n_layer_all, int64_t n_expert);

// llama-quantize's use_more_bits(i, n): the first and last eighth, and every third in between.
bool q4_k_m_use_more_bits(int64_t i, int64_t n);

// True if Q4_K_M quantizes this tensor at all: name ends in "weight", at least 2 dims (trailing 1s
// of `ne` do not count), and it is not a norm, the router (ffn_gate_inp.weight) or ssm_conv1d.
bool q4_k_m_quantizes(std::string_view name, const std::vector<int64_t>& ne);

// The dtype of tensor `name` with ggml shape `ne`: `keep_type` when it is not quantized, otherwise
// Q4_K / Q6_K / Q8_0 / Q5_K per the rules, with the row-length fallbacks (Q4_K->Q5_0, Q5_K->Q5_1,
// Q6_K->Q8_0 when ne[0] % 256 != 0; F16 when ne[0] % 32 != 0 too). Call once per tensor, in file
// order: it advances the counters in `state`.
DType q4_k_m_type_for(std::string_view name, const std::vector<int64_t>& ne, DType keep_type, Q4KMState& state);

}  // namespace ds
