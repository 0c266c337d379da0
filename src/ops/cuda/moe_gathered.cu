// Kernels and launchers of the gathered MoE path (moe_launch.h): the matrix-vector kernels of
// matvec_q8.cuh / matvec_kernels.cuh in gathered mode (grid.y = slot, expert id read on the device),
// and the weighted sum of the slots' down projections.
// Non-obvious choice: the gathered products reuse the decode kernels with one activation row per slot
// (kNT = 1) instead of grouping slots per expert: grouping needs the routing on the host or a device
// sort, while decode with <= 64 slots is bound by reading each selected expert once per slot, and the
// slots that share an expert mostly hit in L2.
#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/moe_launch.h"

namespace ds::cuda {
namespace {

template <DType T>
cudaError_t launch_gathered(const MoeMatvecLaunch& m, MatvecKernel kernel, cudaStream_t stream) {
  const dim3 q8_grid(static_cast<unsigned>((m.n_rows + kern::kQ8Warps * kern::kQ8Rows - 1) /
                                           (kern::kQ8Warps * kern::kQ8Rows)),
                     static_cast<unsigned>(m.n_slots));
  if constexpr (qdec::q8_supported(T)) {
    if (kernel == MatvecKernel::kQ8) {
      kern::MatvecQ8Args a = kern::q8_args(m.w, m.w_stride, m.act, m.k, m.act_rows, m.y, m.y_stride, m.n_rows, 1);
      a.ids = m.ids;
      a.w_expert_stride = m.w_expert_stride;
      a.n_expert = m.n_expert;
      a.x_div = m.x_div;
      return launch_kernel(kern::matvec_q8<T, 1>, q8_grid, kern::kQ8Threads, 0, stream, a);
    }
  }
  kern::MatvecArgs a{static_cast<const uint8_t*>(m.w), m.w_stride, m.x, m.x_stride, m.y, m.y_stride,
                     m.n_rows, m.k, 1};
  a.ids = m.ids;
  a.w_expert_stride = m.w_expert_stride;
  a.n_expert = m.n_expert;
  a.x_div = m.x_div;
  if (kernel == MatvecKernel::kStaged) {
    const dim3 grid(static_cast<unsigned>((m.n_rows + kern::kStagedRows - 1) / kern::kStagedRows),
                    static_cast<unsigned>(m.n_slots));
    launch_kernel(kern::matvec_staged<T, 1>, grid, kern::kStagedThreads, 0, stream, a);
  } else {
    constexpr int kWarps = 4;
    const dim3 grid(static_cast<unsigned>((m.n_rows + kWarps - 1) / kWarps), static_cast<unsigned>(m.n_slots));
    launch_kernel(kern::matvec_generic<T>, grid, 32 * kWarps, 0, stream, a);
  }
  return cudaGetLastError();
}

// One thread per output element; the k slots of its token are summed in slot order.
__global__ void moe_combine(const float* d, const int32_t* ids, const float* weights, int64_t n_tokens, int64_t k,
                            int64_t n_embd, int n_expert, float* y) {
  kern::dependency_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * n_embd) return;
  const int64_t t = i / n_embd, c = i % n_embd;
  float acc = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t s = t * k + j;
    const int32_t e = ids[s];
    if (e >= 0 && e < n_expert) acc += weights[s] * d[s * n_embd + c];
  }
  y[i] = acc;
}

#define DS_MOE_TYPES(X) X(F32) X(F16) X(BF16) X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)

}  // namespace

bool moe_matvec_q8_fits(DType t, const MoeMatvecLaunch& m) {
  if (!qdec::q8_supported(t) || m.k <= 0 || m.k % qdec::traits(t).block_elems != 0) return false;
  const int64_t row_align = qdec::q8_aligned16(t) ? 16 : 2;
  return reinterpret_cast<uintptr_t>(m.w) % 16 == 0 && m.w_stride % row_align == 0 && m.w_expert_stride % 16 == 0;
}

bool moe_matvec_staged_fits(DType t, const MoeMatvecLaunch& m) {
  if (m.x == nullptr) return false;
  MatvecLaunch l{m.w, m.w_stride, m.x, m.x_stride, m.y, m.y_stride, m.n_rows, m.k, 1};
  return matvec_fast_ok(t, l) && m.w_expert_stride % qdec::traits(t).row_align == 0;
}

cudaError_t moe_matvec_launch(DType t, const MoeMatvecLaunch& m, MatvecKernel kernel, cudaStream_t stream) {
  if (m.n_rows <= 0 || m.n_slots <= 0) return cudaSuccess;
  if (m.n_slots > 65535 || m.x_div < 1) return cudaErrorInvalidValue;
  if (kernel == MatvecKernel::kQ8 && (m.act == nullptr || reinterpret_cast<uintptr_t>(m.act) % 16 != 0 ||
                                      !moe_matvec_q8_fits(t, m))) {
    return cudaErrorInvalidValue;
  }
  if (kernel != MatvecKernel::kQ8 && m.x == nullptr) return cudaErrorInvalidValue;
  if (kernel == MatvecKernel::kStaged && !moe_matvec_staged_fits(t, m)) return cudaErrorInvalidValue;
  switch (t) {
#define X(name) \
  case DType::name: return launch_gathered<DType::name>(m, kernel, stream);
    DS_MOE_TYPES(X)
#undef X
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t moe_combine_launch(const float* d, const int32_t* ids, const float* weights, int64_t n_tokens,
                               int64_t k, int64_t n_embd, int n_expert, float* y, cudaStream_t stream) {
  const int64_t n = n_tokens * n_embd;
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  return launch_kernel(moe_combine, static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream, d, ids,
                       weights, n_tokens, k, n_embd, n_expert, y);
}

}  // namespace ds::cuda
