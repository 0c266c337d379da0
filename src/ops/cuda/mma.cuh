// Tensor-core building blocks shared by the kernels that use mma.sync (sm_80+): shared-memory
// addresses, ldmatrix fragment loads, the m16n8k16 products (F16 or BF16 in, F32 accumulate; int8 in,
// exact int32 sums) and the F32 -> BF16 packing of operands. Fragment layouts are the PTX ISA's:
// lane = 4 * gid + tig.
// Non-obvious choice: ldmatrix takes a shared-window address (smem_addr), so callers convert a tile's
// base once and step it by byte offsets.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda::kern {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 16-bit matrices: lanes 8 j .. 8 j + 7 give the (16-byte aligned) row addresses of matrix j;
// r[j] is this lane's pair of matrix j (row gid, elements 2 tig, 2 tig + 1), or of its transpose.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16x8] += a[16x16] (row-major) * b[16x8] (column-major), F32 accumulate: c0,c1 = (row gid, cols
// 2 tig, 2 tig + 1), c2,c3 = (row gid + 8, same cols).
__device__ __forceinline__ void mma_16816_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// mma_16816_f16 without volatile: it reads registers only, so the compiler may interleave independent
// products with the work that makes the next operands instead of issuing each in program order
// (matvec_mma.cuh, whose products measured faster so).
__device__ __forceinline__ void mma_16816_f16_pure(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c[16x8] = a[16x16] * b[16x8] in int8 with exact int32 sums (a fresh accumulator): a0 = row gid, a1 =
// row gid + 8, each 4 int8 of columns 4 tig .. 4 tig + 3; b = 4 int8 of rows 4 tig .. 4 tig + 3 of
// column gid; c as mma_16816_f16's. Not volatile, as mma_16816_f16_pure.
__device__ __forceinline__ void mma_16816_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0));
}
__device__ __forceinline__ void mma_16816_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// v[0..8) rounded to BF16 (nearest even) as 16 bytes at dst (16-byte aligned, shared or global).
__device__ __forceinline__ void store_bf16x8(void* dst, const float v[8]) {
  __nv_bfloat162 p[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) p[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(p);
}

}  // namespace ds::cuda::kern
