// Instantiations and launchers of the CUDA matrix kernels (kernels in matvec_kernels.cuh,
// matvec_q8.cuh and matvec_q8v5.cuh): the int8-activation kernels (v4, v5) and the staged F32 kernel
// per (type, token bucket), the generic fallback, the activation quantizer and the BF16 conversions, and
// the table of which q8 version runs where (matvec_q8_pick_version).
// Non-obvious choice: n_tokens is bucketed to 1, 2, 4, 8 (q8) or 1, 2, 4, 8, 16 (staged) accumulator
// columns (predicated), which bounds the instantiations per type and keeps CI compile time small; v5
// is instantiated in one configuration per type (rows per warp, prefetch depth) and takes its split
// and grid at run time.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/matvec_mma.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/matvec_q8v5.cuh"

namespace ds::cuda {
namespace {

static_assert(kern::kQ8MaxTokens == kMatvecQ8MaxTokens, "q8 token limit");

// The production v5 configuration per type: rows per warp and prefetch depth (steps). Q6_K's load
// ring (19 registers per row and step: two realigned 16-byte spans, scales, d) takes 1 row per warp to
// stay near 80 registers; the others take 2 rows (activation loads shared by both).
template <DType T>
constexpr int q8v5_rows() { return T == DType::Q6_K ? 1 : 2; }
constexpr int kQ8v5Depth = 1;

// Warps per row group for split-K: as many as the row has 1024-element steps, up to 4.
int q8v5_split(int64_t k) {
  const int64_t steps = (k + 32 * kern::kQ8v5StepPieces - 1) / (32 * kern::kQ8v5StepPieces);
  return steps >= 4 ? 4 : steps >= 2 ? 2 : 1;
}

template <DType T, int kNT>
cudaError_t launch_v5(const kern::MatvecQ8Args& a, MatvecQ8Version v, cudaStream_t stream) {
  const int split = v == MatvecQ8Version::kV5SplitK ? q8v5_split(a.k) : 1;
  return kern::q8v5_launch<T, kNT, q8v5_rows<T>(), kQ8v5Depth>(a, 1, split,
                                                               v == MatvecQ8Version::kV5Persistent, stream);
}

// One-token v4 products (not the gathered MoE ones) run at most this many CTAs per SM.
// Non-obvious choice: fewer than fit. In the decode graph the product's resident CTAs compete with its
// neighbours under programmatic dependent launch, and the 27B decode measured 114 tok/s at 7 CTAs per
// SM, 121 at 5 (what the registers and rings allow for Q4_K / Q6_K) and 123 at 4 or 3; the 35B-A3B
// was unchanged (docs/perf-gpu.md). Unused dynamic shared memory sets the cap.
constexpr int kQ8v4OneTokenCtasPerSm = 4;

// The dynamic shared memory of a one-token v4 launch on the current device (occupancy_cap_pad over the
// kernel's static shared memory, its rings); 0 when the device is unknown.
size_t q8v4_one_token_pad(int64_t static_bytes) {
  const DeviceSmem smem = current_device_smem();  // queried once per device
  const int64_t pad = kern::occupancy_cap_pad(static_bytes, smem.per_sm, smem.reserved_per_cta, kQ8v4OneTokenCtasPerSm);
  // Past the static limit a kernel needs an opt-in attribute; no q8 ring is that large at 4 CTAs per SM.
  return static_bytes + pad <= kern::kQ8StaticSmem ? static_cast<size_t>(pad) : 0;
}
template <DType T>
size_t q8v4_one_token_pad() {
  return q8v4_one_token_pad(kern::q8_ring_bytes(T, kern::kQ8Rows, kern::Q8Smem<T, kern::kQ8Rows>::kStages));
}

// v4w (MatvecQ8Version::kV4Whole): one more stage than a kMatvecQ8WholeMaxK row has 1024-element
// chunks, so matvec_q8 issues all of them before its dependency wait; 2 warps per CTA keep the ring in
// 48 KB of static shared memory, 1 where even that does not fit.
constexpr int kQ8v4wStages = static_cast<int>(kMatvecQ8WholeMaxK / kern::kQ8ChunkElems) + 1;
constexpr int q8v4w_warps(DType t) {
  return 2 * kQ8v4wStages * kern::kQ8Rows * kern::q8_row_bytes(t) <= kern::kQ8StaticSmem ? 2 : 1;
}

// The register budget of multi-token v4 (__launch_bounds__' CTAs per SM): 1 (the compiler's choice)
// except Q6_K_G4 at 2 tokens, which the compiler otherwise gives 139 registers (3 CTAs per SM) where
// Q6_K takes 96; at 4 CTAs it fits 128 without spills (ptxas -v, sm_90).
template <DType T, int kNT>
constexpr int q8v4_min_ctas() { return T == DType::Q6_K_G4 && kNT == 2 ? 4 : 1; }

// matvec_mma_q6k over a's rows, in the CTA shape of matvec_mma_q4k's launches for the row count (the
// workbench kernels/matvec_mma_bench.cu times both); its ring is dynamic shared memory, over the 48 KB
// of static shared memory with 8 warps.
template <int kWarps, int kStages>
cudaError_t launch_mma_q6k_shape(const kern::MatvecQ8Args& a, cudaStream_t stream) {
  constexpr int kSmem = kern::mma_q6k_smem(kWarps, kStages);
  const cudaError_t e =
      cudaFuncSetAttribute(kern::matvec_mma_q6k<kWarps, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  const unsigned grid = static_cast<unsigned>((a.n_rows + kern::kMmaRows - 1) / kern::kMmaRows);
  launch_kernel(kern::matvec_mma_q6k<kWarps, kStages>, grid, 32 * kWarps, kSmem, stream, a);
  return cudaGetLastError();
}
cudaError_t launch_mma_q6k(const kern::MatvecQ8Args& a, cudaStream_t stream) {
  return a.n_rows < kMatvecMmaWideRows ? launch_mma_q6k_shape<8, 2>(a, stream) : launch_mma_q6k_shape<4, 3>(a, stream);
}

// Runs the q8 product (version v) on activations already quantized into l.act; matvec_q8_ok(T, l) holds.
template <DType T>
cudaError_t launch_q8_product(const MatvecLaunch& l, MatvecQ8Version v, cudaStream_t stream) {
  const kern::MatvecQ8Args a =
      kern::q8_args(l.w, l.w_stride, l.act, l.k, l.n_tokens, l.y, l.y_stride, l.n_rows, l.n_tokens);
  if (v == MatvecQ8Version::kMma) {
    if constexpr (T == DType::Q6_K_G4) {
      if (l.k % kern::kQ8ChunkElems == 0 && l.n_tokens <= kern::kMmaTokens && l.w_stride < (int64_t{1} << 28)) {
        return launch_mma_q6k(a, stream);
      }
    }
    v = MatvecQ8Version::kV4;
  }
  if (v == MatvecQ8Version::kV4Whole) {
    if (l.n_tokens == 1) {
      constexpr int kWarps = q8v4w_warps(T);
      constexpr int kRowsPerCta = kWarps * kern::kQ8Rows;
      const unsigned grid = static_cast<unsigned>((l.n_rows + kRowsPerCta - 1) / kRowsPerCta);
      launch_kernel(kern::matvec_q8<T, 1, kern::kQ8Rows, kQ8v4wStages, 1, kWarps>, grid, 32 * kWarps, 0, stream, a);
      return cudaGetLastError();
    }
    v = MatvecQ8Version::kV4;
  }
  if (v != MatvecQ8Version::kV4) {
    if (l.n_tokens <= 1) return launch_v5<T, 1>(a, v, stream);
    if (l.n_tokens <= 2) return launch_v5<T, 2>(a, v, stream);
    if (l.n_tokens <= 4) return launch_v5<T, 4>(a, v, stream);
    return launch_v5<T, 8>(a, v, stream);
  }
  constexpr int kRowsPerCta = kern::kQ8Warps * kern::kQ8Rows;
  const unsigned grid = static_cast<unsigned>((l.n_rows + kRowsPerCta - 1) / kRowsPerCta);
  if (l.n_tokens <= 1) {
    launch_kernel(kern::matvec_q8<T, 1>, grid, kern::kQ8Threads, q8v4_one_token_pad<T>(), stream, a);
  } else if (l.n_tokens <= 2) {
    launch_kernel(kern::matvec_q8<T, 2, kern::kQ8Rows, 0, q8v4_min_ctas<T, 2>()>, grid, kern::kQ8Threads, 0, stream, a);
  } else if (l.n_tokens <= 4) {
    launch_kernel(kern::matvec_q8<T, 4>, grid, kern::kQ8Threads, 0, stream, a);
  } else {
    launch_kernel(kern::matvec_q8<T, 8>, grid, kern::kQ8Threads, 0, stream, a);
  }
  return cudaGetLastError();
}

// Both products of matvec_q8_pair<T1, T2> (matvec_q8_pair_applies holds), with v4's one-token cap.
template <DType T1, DType T2>
cudaError_t launch_q8_pair(const MatvecLaunch& l1, const MatvecLaunch& l2, cudaStream_t stream) {
  auto args = [](const MatvecLaunch& l) {
    return kern::q8_args(l.w, l.w_stride, l.act, l.k, 1, l.y, l.y_stride, l.n_rows, 1);
  };
  constexpr int kRowsPerCta = kern::kQ8Warps * kern::kQ8Rows;
  const auto ctas = [](const MatvecLaunch& l) { return static_cast<unsigned>((l.n_rows + kRowsPerCta - 1) / kRowsPerCta); };
  const unsigned c1 = ctas(l1), c2 = ctas(l2);
  launch_kernel(kern::matvec_q8_pair<T1, T2>, c1 + c2, kern::kQ8Threads,
                q8v4_one_token_pad(kern::q8_pair_smem<T1, T2>()), stream, args(l1), args(l2), c1);
  return cudaGetLastError();
}

// The type pairs matvec_q8_pair is instantiated for: a product in the device layout Q6_K_G4 beside Q4_K
// ones (the Q4_K_M layers whose attn_qkv / attn_v are Q6_K), either first.
#define DS_Q8_PAIRS(X) X(Q6_K_G4, Q4_K) X(Q4_K, Q6_K_G4)

bool is_q8(MatvecKernel k) {
  return k == MatvecKernel::kQ8 || k == MatvecKernel::kQ8v4 || k == MatvecKernel::kQ8v5;
}

// The q8 version a q8 entry of MatvecKernel runs for l.
MatvecQ8Version q8_version(DType t, const MatvecLaunch& l, MatvecKernel which) {
  if (which == MatvecKernel::kQ8v4) return MatvecQ8Version::kV4;
  const MatvecQ8Version v = matvec_q8_pick_version(t, l.n_rows, l.k, l.n_tokens);
  if (which == MatvecKernel::kQ8v5 && v == MatvecQ8Version::kV4) return MatvecQ8Version::kV5;
  return v;
}

// Quantizes x, then runs the q8 product; matvec_q8_ok(T, l) holds.
template <DType T>
cudaError_t launch_q8(const MatvecLaunch& l, MatvecQ8Version v, cudaStream_t stream) {
  const cudaError_t e = quantize_q8_launch(l.x, l.x_stride, nullptr, l.n_tokens, l.k, l.act, nullptr, 0, stream);
  return e != cudaSuccess ? e : launch_q8_product<T>(l, v, stream);
}

template <DType T>
cudaError_t launch_typed(const MatvecLaunch& l, MatvecKernel fastest, cudaStream_t stream) {
  const MatvecKernel kernel = matvec_pick(T, l, fastest);
  if constexpr (qdec::q8_supported(T)) {
    if (is_q8(kernel)) return launch_q8<T>(l, q8_version(T, l, kernel), stream);
  }
  kern::MatvecArgs a{static_cast<const uint8_t*>(l.w), l.w_stride, l.x, l.x_stride, l.y, l.y_stride,
                     l.n_rows, l.k, l.n_tokens};
  if (kernel == MatvecKernel::kGeneric) {
    constexpr int kWarps = 4;
    const dim3 grid(static_cast<unsigned>((l.n_rows + kWarps - 1) / kWarps), static_cast<unsigned>(l.n_tokens));
    return launch_kernel(kern::matvec_generic<T>, grid, 32 * kWarps, 0, stream, a);
  }
  const unsigned grid = static_cast<unsigned>((l.n_rows + kern::kStagedRows - 1) / kern::kStagedRows);
  if (l.n_tokens <= 1) {
    launch_kernel(kern::matvec_staged<T, 1>, grid, kern::kStagedThreads, 0, stream, a);
  } else if (l.n_tokens <= 2) {
    launch_kernel(kern::matvec_staged<T, 2>, grid, kern::kStagedThreads, 0, stream, a);
  } else if (l.n_tokens <= 4) {
    launch_kernel(kern::matvec_staged<T, 4>, grid, kern::kStagedThreads, 0, stream, a);
  } else if (l.n_tokens <= 8) {
    launch_kernel(kern::matvec_staged<T, 8>, grid, kern::kStagedThreads, 0, stream, a);
  } else {
    launch_kernel(kern::matvec_staged<T, 16>, grid, kern::kStagedThreads, 0, stream, a);
  }
  return cudaGetLastError();
}

template <DType T>
cudaError_t dequant_typed(const void* w, int64_t w_stride, int64_t n_rows, int64_t k, void* out,
                          cudaStream_t stream) {
  constexpr qdec::TypeTraits tr = qdec::traits(T);
  const uintptr_t base = reinterpret_cast<uintptr_t>(w);
  const bool aligned = k % 8 == 0 && base % tr.row_align == 0 && w_stride % tr.row_align == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const auto* wb = static_cast<const uint8_t*>(w);
  auto* o = static_cast<__nv_bfloat16*>(out);
  constexpr int kThreads = 256;
  if (aligned) {
    const int64_t n = n_rows * (k / 8);
    launch_kernel(kern::dequant_bf16<T, true>, static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                  stream, wb, w_stride, n_rows, k, o);
  } else {
    const int64_t n = n_rows * k;
    launch_kernel(kern::dequant_bf16<T, false>, static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                  stream, wb, w_stride, n_rows, k, o);
  }
  return cudaGetLastError();
}

#define DS_MATVEC_TYPES(X) X(F32) X(F16) X(BF16) X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K) X(Q6_K_G4)

}  // namespace

bool matvec_supports(DType t) {
  switch (t) {
#define X(name) case DType::name:
    DS_MATVEC_TYPES(X)
#undef X
    return true;
    default:
      return false;
  }
}

bool matvec_q8_supports(DType t) { return qdec::q8_supported(t); }

bool matvec_q8_ok(DType t, const MatvecLaunch& a) {
  if (!qdec::q8_supported(t) || a.k <= 0 || a.k % qdec::traits(t).block_elems != 0) return false;
  const uintptr_t w = reinterpret_cast<uintptr_t>(a.w), act = reinterpret_cast<uintptr_t>(a.act);
  const int64_t row_align = qdec::q8_aligned16(t) ? 16 : 2;
  return w % 16 == 0 && a.w_stride % row_align == 0 && a.n_tokens >= 1 && a.n_tokens <= kMatvecQ8MaxTokens &&
         act != 0 && act % 16 == 0 && a.act_bytes >= matvec_q8_act_bytes(a.k, a.n_tokens);
}

MatvecKernel matvec_pick(DType t, const MatvecLaunch& a, MatvecKernel fastest) {
  if (is_q8(fastest) && matvec_q8_ok(t, a)) return fastest;
  if (fastest != MatvecKernel::kGeneric && matvec_fast_ok(t, a)) return MatvecKernel::kStaged;
  return MatvecKernel::kGeneric;
}

int64_t matvec_q8_act_bytes(int64_t k, int64_t n_rows) { return kern::q8_act_bytes(k, n_rows); }
int64_t matvec_q8_ds_offset(int64_t k, int64_t n_rows) { return kern::q8_ds_offset(k, n_rows); }

cudaError_t quantize_q8_launch(const float* x, int64_t x_stride, const float* up, int64_t n_rows, int64_t k,
                               void* act, const int32_t* ids, int n_expert, cudaStream_t stream) {
  if (n_rows <= 0 || k <= 0) return cudaSuccess;
  if (k % kern::kQ8Block != 0) return cudaErrorInvalidValue;
  auto* base = static_cast<uint8_t*>(act);
  kern::QuantizeQ8Args a{x, x_stride, up, n_rows, k, reinterpret_cast<int8_t*>(base),
                         reinterpret_cast<float2*>(base + kern::q8_ds_offset(k, n_rows)), ids, n_expert};
  const int64_t threads = n_rows * (k / kern::kQ8Block) * 8;
  const unsigned grid = static_cast<unsigned>((threads + kern::kQuantThreads - 1) / kern::kQuantThreads);
  if (up != nullptr) {
    launch_kernel(kern::quantize_q8<true>, grid, kern::kQuantThreads, 0, stream, a);
  } else {
    launch_kernel(kern::quantize_q8<false>, grid, kern::kQuantThreads, 0, stream, a);
  }
  return cudaGetLastError();
}

bool matvec_fast_ok(DType t, const MatvecLaunch& a) {
  const qdec::TypeTraits tr = qdec::traits(t);
  if (tr.block_elems == 0) return false;
  const uintptr_t w = reinterpret_cast<uintptr_t>(a.w), x = reinterpret_cast<uintptr_t>(a.x);
  return a.k % 8 == 0 && a.k % tr.block_elems == 0 && w % tr.row_align == 0 && a.w_stride % tr.row_align == 0 &&
         x % 16 == 0 && a.x_stride % 4 == 0 && a.n_tokens >= 1 && a.n_tokens <= kMatvecMaxTokens;
}

cudaError_t matvec_launch(DType t, const MatvecLaunch& a, MatvecKernel fastest, cudaStream_t stream) {
  if (a.n_rows <= 0 || a.n_tokens <= 0) return cudaSuccess;
  switch (t) {
#define X(name) \
  case DType::name: return launch_typed<DType::name>(a, fastest, stream);
    DS_MATVEC_TYPES(X)
#undef X
    default:
      return cudaErrorInvalidValue;
  }
}

int64_t matvec_mma_act_bytes(int64_t k) { return kern::mma_act_bytes(k); }

bool matvec_mma_ok(DType t, const MatvecLaunch& a) {
  const uintptr_t w = reinterpret_cast<uintptr_t>(a.w), act = reinterpret_cast<uintptr_t>(a.act);
  return t == DType::Q4_K && a.k > 0 && a.k % kern::kMmaBlock == 0 && w % 16 == 0 && a.w_stride % 16 == 0 &&
         a.n_tokens >= 1 && a.n_tokens <= kern::kMmaTokens && act != 0 && act % 16 == 0 &&
         a.act_bytes >= kern::mma_act_bytes(a.k);
}

int matvec_mma_min_tokens(DType t) {
  static const int from_env = [] {  // 0: not set
    const char* e = std::getenv("DELTASERVE_MATVEC_MMA");
    if (e == nullptr) return 0;
    const std::string v(e);
    if (v == "all") return 1;
    if (v.size() == 1 && v[0] >= '1' && v[0] <= '8') return v[0] - '0';
    return kern::kMmaTokens + 1;  // "0", "off" or anything else: never
  }();
  if (from_env != 0) return from_env;
  return t == DType::Q6_K_G4 ? kMatvecMmaQ6MinTokens : kMatvecMmaMinTokens;
}

bool matvec_mma_wanted(DType t, int64_t k, int n_tokens) {
  return t == DType::Q4_K && k % kern::kMmaBlock == 0 && n_tokens >= matvec_mma_min_tokens() &&
         n_tokens <= kern::kMmaTokens;
}

cudaError_t mma_pack_launch(const float* x, int64_t x_stride, const float* up, int n_tokens, int64_t k, void* act,
                            cudaStream_t stream) {
  if (n_tokens < 1 || n_tokens > kern::kMmaTokens || k <= 0 || k % kern::kMmaBlock != 0 ||
      reinterpret_cast<uintptr_t>(act) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  kern::MmaPackArgs a{x, x_stride, up, n_tokens, k, static_cast<uint8_t*>(act)};
  const unsigned grid = static_cast<unsigned>(k / kern::kMmaBlock);
  if (up != nullptr) {
    launch_kernel(kern::mma_pack<true>, grid, kern::kMmaPackThreads, 0, stream, a);
  } else {
    launch_kernel(kern::mma_pack<false>, grid, kern::kMmaPackThreads, 0, stream, a);
  }
  return cudaGetLastError();
}

cudaError_t matvec_mma_product_launch(DType t, const MatvecLaunch& a, cudaStream_t stream, const MatvecMmaPart* more,
                                      int n_more) {
  if (a.n_rows <= 0 || a.n_tokens <= 0) return cudaSuccess;
  if (!matvec_mma_ok(t, a) || n_more < 0 || n_more + 1 > kMatvecMmaMaxParts || (n_more > 0 && more == nullptr)) {
    return cudaErrorInvalidValue;
  }
  static_assert(kMatvecMmaMaxParts == kern::kMmaMaxParts && kMatvecMmaPartRows == kern::kMmaRows,
                "parts of one launch");
  kern::MatvecMmaArgs m{static_cast<const uint8_t*>(a.w), a.w_stride, static_cast<const uint8_t*>(a.act), a.y,
                        a.y_stride, a.n_rows, a.k, a.n_tokens};
  m.n_parts = 1 + n_more;
  int64_t prev = 0, shape_rows = 0;  // the widest part decides the CTA shape, as its own launch would
  bool wide = false, narrow = false;
  for (int p = 0; p < m.n_parts; ++p) {
    const int64_t first = p == 0 ? 0 : more[p - 1].first_row;
    const int64_t end = p + 1 < m.n_parts ? more[p].first_row : a.n_rows;
    if (p > 0) {
      if (first <= prev || first % kMatvecMmaPartRows != 0 || more[p - 1].y == nullptr) return cudaErrorInvalidValue;
      m.part_row[p] = first;
      m.part_y[p] = more[p - 1].y;
      m.part_y_stride[p] = more[p - 1].y_stride;
    }
    if (end <= first) return cudaErrorInvalidValue;
    (end - first >= kMatvecMmaWideRows ? wide : narrow) = true;
    shape_rows = std::max(shape_rows, end - first);
    prev = first;
  }
  if (wide && narrow) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>((a.n_rows + kern::kMmaRows - 1) / kern::kMmaRows);
  // Few rows: 8 warps split each CTA's k (more warps at work on fewer CTAs); the workbench at 5 and 8
  // tokens (H100, 2026-11-27): 5120 x 17408 32.3 us against 38.4 with 4 warps, 2048 x 4096 4.4 against
  // 5.5, 1024 x 5120 4.6 against 5.6; from 8192 rows 4 warps of 3 stages (34816 x 5120 47.1 against
  // 51.6, 17408 x 5120 27.6 against 29.1).
  if (shape_rows < kMatvecMmaWideRows) {
    launch_kernel(kern::matvec_mma_q4k<8, 2>, grid, 256, 0, stream, m);
  } else {
    launch_kernel(kern::matvec_mma_q4k<4, 3>, grid, 128, 0, stream, m);
  }
  return cudaGetLastError();
}

const char* matvec_q8_version_name(MatvecQ8Version v) {
  switch (v) {
    case MatvecQ8Version::kV4: return "v4";
    case MatvecQ8Version::kV5: return "v5";
    case MatvecQ8Version::kV5Persistent: return "v5p";
    case MatvecQ8Version::kV5SplitK: return "v5s";
    case MatvecQ8Version::kV4Whole: return "v4w";
    case MatvecQ8Version::kMma: return "mma";
  }
  return "?";
}

// Set from the workbench (kernels/matvec_q.cu, section v5: v4 and the v5 variants at the 27B / 35B-A3B
// decode shapes, product alone, H100, 2026-11-22; docs/perf-gpu.md). Most large products are as fast
// or faster on v4 (Q6_K and Q8_0 everywhere), so v5 runs only where it measured ahead:
//  - few rows (under 4096) over a long row (k >= 2048): split-K, for 1..8 tokens (48 x 5120: 8.7 us vs
//    11.4 on v4 at one token, 11.5 vs 27 at 8; 1024 x 5120: 9.9 vs 11.7); except at one token with rows
//    of at most kMatvecQ8WholeMaxK, where v4w holds every weight byte in flight before the dependency
//    wait, so the product loads while the kernel before it runs (set from the decode graph, 2026-11-23:
//    35B-A3B, whose 2048 x 4096 output products follow the DeltaNet step and attention, 429 / 431 ->
//    436 / 435 tok/s in one run and 430 / 435 -> 446 / 445 in another, against 434 on plain v4; 27B
//    unchanged; on the 27B's larger 5120 x 6144 output products it was 1% slower, so it stays here);
//  - a row much longer than the row count (k >= 3 rows, the 5120 x 17408 FFN down) at 2..8 tokens:
//    split-K (q4_K 36 / 47 / 76 us vs 40 / 60 / 139 at 2 / 4 / 8 tokens), but not Q6_K at 8 tokens;
//  - Q4_K / Q5_K with at least 16384 rows at one token: v5 on a persistent grid (17408 x 5120 q4_K
//    29.1 us vs 32.2), which has no partial last wave.
MatvecQ8Version matvec_q8_pick_version(DType t, int64_t n_rows, int64_t k, int n_tokens) {
  // Q6_K_G4 at one token: v4, which pairs with the Q4_K products beside it (matvec_q8_pair; measured in
  // the decode graph with the pairing, 2026-11-27); on tensor cores from kMatvecMmaQ6MinTokens
  // (matvec_mma_min_tokens); in between as Q6_K.
  if (t == DType::Q6_K_G4 && n_tokens == 1) return MatvecQ8Version::kV4;
  if (t == DType::Q6_K_G4 && n_tokens >= matvec_mma_min_tokens(t) && n_tokens <= kern::kMmaTokens &&
      k % kern::kQ8ChunkElems == 0) {
    return MatvecQ8Version::kMma;
  }
  if (n_rows < 4096 && k >= 2048) {
    // v4w only where its ring fits 2 warps per CTA (the form measured).
    const bool whole = n_tokens == 1 && k <= kMatvecQ8WholeMaxK && qdec::q8_supported(t) && q8v4w_warps(t) == 2;
    return whole ? MatvecQ8Version::kV4Whole : MatvecQ8Version::kV5SplitK;
  }
  if (k >= 3 * n_rows && n_tokens >= 2 && !(qdec::is_q6_k(t) && n_tokens > 4)) return MatvecQ8Version::kV5SplitK;
  if ((t == DType::Q4_K || t == DType::Q5_K) && n_rows >= 16384 && n_tokens == 1) {
    return MatvecQ8Version::kV5Persistent;
  }
  return MatvecQ8Version::kV4;
}

cudaError_t matvec_q8_product_launch_version(DType t, const MatvecLaunch& a, MatvecQ8Version v,
                                             cudaStream_t stream) {
  if (a.n_rows <= 0 || a.n_tokens <= 0) return cudaSuccess;
  if (!matvec_q8_ok(t, a)) return cudaErrorInvalidValue;
  switch (t) {
#define X(name) \
  case DType::name: return launch_q8_product<DType::name>(a, v, stream);
    X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K) X(Q6_K_G4)
#undef X
    default:
      return cudaErrorInvalidValue;
  }
}

bool matvec_q8_pair_applies(DType t1, const MatvecLaunch& a1, DType t2, const MatvecLaunch& a2) {
  bool instantiated = false;
#define X(A, B) instantiated = instantiated || (t1 == DType::A && t2 == DType::B);
  DS_Q8_PAIRS(X)
#undef X
  auto one_token_v4 = [](DType t, const MatvecLaunch& a) {
    return a.n_tokens == 1 && a.n_rows > 0 && matvec_q8_ok(t, a) &&
           matvec_q8_pick_version(t, a.n_rows, a.k, 1) == MatvecQ8Version::kV4;
  };
  return instantiated && a1.k == a2.k && a1.act == a2.act && one_token_v4(t1, a1) && one_token_v4(t2, a2);
}

cudaError_t matvec_q8_pair_launch(DType t1, const MatvecLaunch& a1, DType t2, const MatvecLaunch& a2,
                                  cudaStream_t stream) {
  if (!matvec_q8_pair_applies(t1, a1, t2, a2)) return cudaErrorInvalidValue;
#define X(A, B) \
  if (t1 == DType::A && t2 == DType::B) return launch_q8_pair<DType::A, DType::B>(a1, a2, stream);
  DS_Q8_PAIRS(X)
#undef X
  return cudaErrorInvalidValue;
}

cudaError_t matvec_q8_product_launch(DType t, const MatvecLaunch& a, MatvecKernel which, cudaStream_t stream) {
  if (!is_q8(which)) return cudaErrorInvalidValue;
  return matvec_q8_product_launch_version(t, a, q8_version(t, a, which), stream);
}

cudaError_t matvec_q8_product_launch(DType t, const MatvecLaunch& a, cudaStream_t stream) {
  return matvec_q8_product_launch(t, a, MatvecKernel::kQ8, stream);
}

cudaError_t dequant_bf16_launch(DType t, const void* w, int64_t w_stride, int64_t n_rows, int64_t k, void* out,
                                cudaStream_t stream) {
  if (n_rows <= 0 || k <= 0) return cudaSuccess;
  switch (t) {
#define X(name) \
  case DType::name: return dequant_typed<DType::name>(w, w_stride, n_rows, k, out, stream);
    DS_MATVEC_TYPES(X)
#undef X
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t f32_to_bf16_launch(const float* x, int64_t x_stride, int64_t n_rows, int64_t k, void* out,
                               cudaStream_t stream) {
  const int64_t n = n_rows * k;
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  return launch_kernel(kern::f32_to_bf16, static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream, x,
                       x_stride, n_rows, k, static_cast<__nv_bfloat16*>(out));
}

}  // namespace ds::cuda
