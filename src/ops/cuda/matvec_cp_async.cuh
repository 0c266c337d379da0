// Asynchronous global-to-shared copies (cp.async, sm_80+) for the matrix-vector kernels.
// Non-obvious choice: the source size is a register operand, so the piece at the very end of a tensor
// copies only its valid bytes and zero-fills the rest instead of reading past the allocation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda::kern {

// 16 bytes to shared address `smem` (16-byte aligned, already converted by __cvta_generic_to_shared) from
// `gmem` (16-byte aligned global address): src_bytes (1..16) are read, the rest of the 16 are zeros.
__device__ __forceinline__ void cp_async16_s(uint32_t smem, uintptr_t gmem, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes) : "memory");
}
// The same for a whole 16-byte piece.
__device__ __forceinline__ void cp_async16_full(uint32_t smem, uintptr_t gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}
// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace ds::cuda::kern
