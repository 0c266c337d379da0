// Workbench version v7 of the int8-activation matrix-vector product (bulk stream), included only by
// kernels/matvec_q.cu: measured slower than v4 at every decode shape (docs/perf-gpu.md), so it is not
// in production; kept as the starting point for a bulk-copy product.
// Same arithmetic as v4 (ops/cuda/matvec_q8.cuh: qdec::decode_unit_q8 + __dp4a per 32-element unit,
// float scales per unit), fed by the Hopper bulk-copy engine. The weight rows must be contiguous
// (w_stride == row bytes), so a run of rows is one run of blocks. The rows are cut into n_tasks tasks
// of balanced row counts (at most kQ8v7TaskRows each); CTA c takes tasks c, c + gridDim.x, ... (one
// CTA per SM). In each CTA one producer thread streams the CTA's blocks through a ring of kQ8v7Stages
// shared-memory stages of about 3 KB of whole blocks each with cp.async.bulk (one instruction per
// stage, completion counted in bytes on the stage's mbarrier); stage i is read by consumer warp
// i % kQ8v7ConsumerWarps alone, which adds each unit's dot product into the row's shared-memory
// accumulator.
// Measured (H100, 2026-11-22, product alone): q4_K 17408 x 5120 at one token 43.4 us against v4's
// 30.7; the first form (16 KB stages read by all 8 consumer warps together) took 68.8 us, 16 warps
// 50.6 us: a stage shared by every warp waits for the slowest, and per-unit activation loads with no
// reuse across rows leave the consumers latency-bound (time grows ~linearly with the token count).
// Non-obvious choices:
//  - The producer needs nothing from earlier kernels, so it fills the whole ring (about 100 KB per SM)
//    before the consumers' dependency_wait().
//  - A stage is copied from its first block's address rounded down to 16 bytes, so shared memory keeps
//    every byte's address mod 16 (decode_unit_q8's alignment, as v4); the last bytes of the weights
//    that a 16-byte multiple would overrun are copied by the producer thread itself.
//  - A lane adds a unit into a register while the row stays the same and flushes on a row change:
//    few shared-memory atomics per stage. Float atomics make the order of the additions vary from run
//    to run (rounding-level differences).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "ops/cuda/launch.cuh"
#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/matvec_q8_args.h"
#include "ops/cuda/quant_decode.cuh"

namespace ds::cuda::kern {

constexpr int kQ8v7ConsumerWarps = 16;
constexpr int kQ8v7Threads = 32 * (kQ8v7ConsumerWarps + 1);  // + the producer warp
constexpr int kQ8v7Stages = 32;                            // 2 per consumer warp
constexpr int kQ8v7ChunkBytes = 3072;                       // bulk copy per stage, at most
constexpr int kQ8v7StageBytes = kQ8v7ChunkBytes + 64;       // + start phase, end round-up, decode overrun
constexpr int kQ8v7TaskRows = 512;                          // rows of one task: the accumulators

// Whole blocks of type T per stage.
template <DType T>
__host__ __device__ constexpr int q8v7_stage_blocks() {
  return (kQ8v7ChunkBytes - 32) / qdec::traits(T).block_bytes;
}

// Dynamic shared memory of matvec_q8v7<*, kNT>: the stages, the task's accumulators, the mbarriers.
__host__ __device__ constexpr int q8v7_smem_bytes(int n_tokens_max) {
  return kQ8v7Stages * kQ8v7StageBytes + kQ8v7TaskRows * n_tokens_max * 4 + 2 * kQ8v7Stages * 8;
}

// Rows [lo, hi) of task `task` of n_tasks over n_rows rows.
__device__ __forceinline__ void q8v7_task_rows(int64_t task, int64_t n_tasks, int64_t n_rows, int64_t& lo,
                                               int64_t& hi) {
  lo = task * n_rows / n_tasks;
  hi = (task + 1) * n_rows / n_tasks;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
// Blocks until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
// bytes (a multiple of 16) from global `src` (16-byte aligned) to shared `dst` (16-byte aligned),
// counted on `bar` when they land.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, uintptr_t src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
#endif

// Needs (host-checked, matvec_q8v7_ok): sm_90, w 16-byte aligned, w_stride == the row's bytes, k a
// multiple of the block, n_rows * k / block < 2^31, not gathered; n_tasks a multiple of gridDim.x with
// at most kQ8v7TaskRows rows per task; xq / xds from quantize_q8. Launch: kQ8v7Threads threads,
// q8v7_smem_bytes(kNT) bytes of dynamic shared memory.
template <DType T, int kNT>
__global__ void __launch_bounds__(kQ8v7Threads, 1) matvec_q8v7(MatvecQ8Args a, int n_tasks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr qdec::TypeTraits tr = qdec::traits(T);
  constexpr int kUnits = tr.block_elems / kQ8Block;  // units per block
  constexpr int kBB = tr.block_bytes;
  constexpr int kSB = q8v7_stage_blocks<T>();
  extern __shared__ __align__(128) uint8_t smem[];
  float* acc_s = reinterpret_cast<float*>(smem + kQ8v7Stages * kQ8v7StageBytes);
  auto* full = reinterpret_cast<uint64_t*>(acc_s + kQ8v7TaskRows * kNT);
  uint64_t* empty = full + kQ8v7Stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bpr = a.k / tr.block_elems;  // blocks per row
  const uintptr_t base = reinterpret_cast<uintptr_t>(a.w);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kQ8v7Stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);  // the one warp that reads the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = threadIdx.x; i < kQ8v7TaskRows * kNT; i += blockDim.x) acc_s[i] = 0.0f;
  __syncthreads();

  if (warp == kQ8v7ConsumerWarps) {  // the producer: weights only, so no dependency_wait
    if (lane != 0) return;
    const uintptr_t w_end = base + static_cast<uintptr_t>(a.n_rows * a.w_stride);
    const uintptr_t w_end16 = w_end & ~uintptr_t{15};
    int it = 0;
    for (int64_t task = blockIdx.x; task < n_tasks; task += gridDim.x) {
      int64_t lo, hi;
      q8v7_task_rows(task, n_tasks, a.n_rows, lo, hi);
      for (int64_t b = lo * bpr; b < hi * bpr; b += kSB, ++it) {
        const int s = it % kQ8v7Stages;
        if (it >= kQ8v7Stages) mbar_wait(&empty[s], ((it / kQ8v7Stages) - 1) & 1);
        const int64_t nb = min(static_cast<int64_t>(kSB), hi * bpr - b);
        const uintptr_t src = base + static_cast<uintptr_t>(b * kBB), end = src + static_cast<uintptr_t>(nb * kBB);
        const uintptr_t from = src & ~uintptr_t{15};
        const uintptr_t to = min((end + 15) & ~uintptr_t{15}, w_end16);
        uint8_t* dst = smem + s * kQ8v7StageBytes;
        for (uintptr_t p = to; p < end; ++p) dst[p - from] = *reinterpret_cast<const uint8_t*>(p);  // the tail
        mbar_arrive_expect_tx(&full[s], static_cast<uint32_t>(to - from));
        bulk_copy_g2s(dst, from, static_cast<uint32_t>(to - from), &full[s]);
      }
    }
    return;
  }

  dependency_wait();  // the activations are the previous kernel's output
  allow_dependents();
  const int8_t* xq = a.xq;
  const auto* xds = static_cast<const float2*>(a.xds);
  const int64_t act_blocks = a.k / kQ8Block;
  constexpr int kStep = 32 / kUnits;  // blocks a lane moves on per step of 32 units
  constexpr int kQ8v7Ilp = kNT <= 2 ? 4 : 2;  // units per lane per iteration (registers: 96 a thread)
  int64_t it = 0;  // the CTA's chunks before this task
  for (int64_t task = blockIdx.x; task < n_tasks; task += gridDim.x) {
    int64_t lo, hi;
    q8v7_task_rows(task, n_tasks, a.n_rows, lo, hi);
    const int64_t n_blocks = (hi - lo) * bpr, n_chunks = (n_blocks + kSB - 1) / kSB;
    // Chunk c of the task is the CTA's chunk it + c, read by warp (it + c) % kQ8v7ConsumerWarps.
    for (int64_t c = ((warp - it) % kQ8v7ConsumerWarps + kQ8v7ConsumerWarps) % kQ8v7ConsumerWarps; c < n_chunks;
         c += kQ8v7ConsumerWarps) {
      const int64_t gi = it + c, b = lo * bpr + c * kSB;
      const int s = static_cast<int>(gi % kQ8v7Stages);
      const int nb = static_cast<int>(min(static_cast<int64_t>(kSB), n_blocks - c * kSB));
      const int u0 = 0, u1 = nb * kUnits;
      mbar_wait(&full[s], static_cast<uint32_t>(gi / kQ8v7Stages) & 1);
      const uint8_t* stage = smem + s * kQ8v7StageBytes + ((base + static_cast<uintptr_t>(b * kBB)) & 15);
      int64_t row = -1;
      float acc[kNT];
#pragma unroll
      for (int t = 0; t < kNT; ++t) acc[t] = 0.0f;
      if (u0 + lane < u1) {
        // This lane's first unit, then kStep blocks further on per step (the unit within the block stays).
        const int su = (u0 + lane) % kUnits;
        const int64_t g = b + (u0 + lane) / kUnits;  // block index from the weights' start
        int64_t r = g / bpr, j = g - r * bpr;
        row = r;
        // kQ8v7Ilp units per iteration: their decodes (shared-memory loads) and activation loads are
        // independent, so they are in flight together.
        for (int u = u0 + lane; u < u1; u += 32 * kQ8v7Ilp) {
          qdec::Q8Unit wu[kQ8v7Ilp];
          int64_t ur[kQ8v7Ilp], ab[kQ8v7Ilp];
#pragma unroll
          for (int i = 0; i < kQ8v7Ilp; ++i) {
            ur[i] = r;
            ab[i] = j * kUnits + su;  // activation block
            if (u + 32 * i < u1) qdec::decode_unit_q8<T>(stage, u + 32 * i, wu[i]);
            j += kStep;
            while (j >= bpr) {
              j -= bpr;
              ++r;
            }
          }
#pragma unroll
          for (int i = 0; i < kQ8v7Ilp; ++i) {
            if (u + 32 * i >= u1) break;
            if (ur[i] != row) {  // flush the finished row
#pragma unroll
              for (int t = 0; t < kNT; ++t) {
                if (t < a.n_tokens) atomicAdd(&acc_s[(row - lo) * kNT + t], acc[t]);
                acc[t] = 0.0f;
              }
              row = ur[i];
            }
#pragma unroll
            for (int t = 0; t < kNT; ++t) {
              if (t < a.n_tokens) {
                const int4* xp = reinterpret_cast<const int4*>(xq + t * a.k + kQ8Block * ab[i]);
                const int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                const float2 ds = __ldg(xds + t * act_blocks + ab[i]);
                const int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                acc[t] = q8_unit_dot<T>(wu[i], xv, q8_half_sums<T>(xv), ds, acc[t]);
              }
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);  // the warp is done reading the stage
      // Flush the last row: one atomic per warp when every active lane ends on lane 0's row.
      const int64_t row0 = __shfl_sync(0xFFFFFFFFu, row, 0);
      if (row0 >= 0) {
        if (__all_sync(0xFFFFFFFFu, row == row0 || row < 0)) {
#pragma unroll
          for (int t = 0; t < kNT; ++t) {
            const float v = warp_sum(acc[t]);
            if (lane == 0 && t < a.n_tokens) atomicAdd(&acc_s[(row0 - lo) * kNT + t], v);
          }
        } else if (row >= 0) {
#pragma unroll
          for (int t = 0; t < kNT; ++t) {
            if (t < a.n_tokens) atomicAdd(&acc_s[(row - lo) * kNT + t], acc[t]);
          }
        }
      }
    }
    it += n_chunks;
    // The task's rows are complete: write them, clear the accumulators for the next task.
    asm volatile("bar.sync 1, %0;" ::"n"(32 * kQ8v7ConsumerWarps) : "memory");
    for (int64_t i = threadIdx.x; i < (hi - lo) * kNT; i += 32 * kQ8v7ConsumerWarps) {
      const int64_t r = lo + i / kNT;
      const int t = static_cast<int>(i % kNT);
      if (t < a.n_tokens) a.y[t * a.y_stride + r] = acc_s[i];
      acc_s[i] = 0.0f;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(32 * kQ8v7ConsumerWarps) : "memory");
  }
#endif
}

#ifdef __CUDACC__
// Launches matvec_q8v7<T, kNT> on one CTA per SM (fewer for fewer rows); the caller has checked
// matvec_q8v7_ok. The shared-memory limit is raised once per device.
template <DType T, int kNT>
cudaError_t q8v7_launch(const MatvecQ8Args& a, cudaStream_t stream) {
  constexpr int smem = q8v7_smem_bytes(kNT);
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  static std::atomic<uint64_t> raised{0};  // bit d: the limit is raised on device d
  if (dev < 64 && (raised.load(std::memory_order_relaxed) >> dev & 1u) == 0) {
    e = cudaFuncSetAttribute(matvec_q8v7<T, kNT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    raised.fetch_or(uint64_t{1} << dev, std::memory_order_relaxed);
  }
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  const int64_t grid = std::min<int64_t>(sms, a.n_rows);
  const int64_t per_cta = (a.n_rows + grid * kQ8v7TaskRows - 1) / (grid * kQ8v7TaskRows);
  const int64_t n_tasks = grid * per_cta;
  if (n_tasks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  return launch_kernel(matvec_q8v7<T, kNT>, static_cast<unsigned>(grid), kQ8v7Threads, smem, stream, a,
                       static_cast<int>(n_tasks));
}
#endif  // __CUDACC__

}  // namespace ds::cuda::kern
