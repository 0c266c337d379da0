// TEMPORARY (branch h/model-cuda only; delete at merge): placeholder definitions of the CUDA model-path
// entries declared in ops/cuda/cuda_ops.h, so that this branch links before the helpers that
// implement them are merged. Each returns kUnsupported naming the entry.
#if DS_HAVE_CUDA

#include "ops/cuda/cuda_ops.h"

namespace ds::cuda {

Status kv_append(const OpContext&, const TensorView&, const TensorView&, const KvTable&, const int32_t*) {
  return unsupported("cuda kv_append: not implemented yet");
}

Status attention_paged(const OpContext&, const TensorView&, const KvTable&, const int32_t*, int64_t, float,
                       const TensorView&) {
  return unsupported("cuda attention_paged: not implemented yet");
}

Status rope_neox_at(const OpContext&, const TensorView&, int64_t, float, const int32_t*) {
  return unsupported("cuda rope_neox_at: not implemented yet");
}

Status get_rows_trusted(const OpContext&, const TensorView&, const TensorView&, const TensorView&) {
  return unsupported("cuda get_rows_trusted: not implemented yet");
}

Status moe_ffn_gathered(const OpContext&, const TensorView&, const MoeExperts&, const TensorView&, const TensorView&,
                        const TensorView&) {
  return unsupported("cuda moe_ffn_gathered: not implemented yet");
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
