// StateLayout helpers: attention layer count and the layout fingerprint (XXH3 over every field).
#include "state/state_layout.h"

#include <xxhash.h>

namespace ds {

int64_t StateLayout::n_attention_layers() const {
  int64_t n = 0;
  for (LayerStateKind k : kinds) n += k == LayerStateKind::kAttention ? 1 : 0;
  return n;
}

uint64_t StateLayout::fingerprint() const {
  std::vector<int64_t> words = {static_cast<int64_t>(kinds.size()), n_head_kv, head_dim, kv_chunk_tokens,
                                conv_kernel, conv_dim, ssm_dk, ssm_dv, ssm_nv, n_vocab,
                                static_cast<int64_t>(model_fingerprint), static_cast<int64_t>(kv_dtype)};
  for (LayerStateKind k : kinds) words.push_back(static_cast<int64_t>(k));
  // n_ctx is deliberately left out: a state fits any context at least as long as its position.
  return XXH3_64bits(words.data(), words.size() * sizeof(int64_t));
}

}  // namespace ds
