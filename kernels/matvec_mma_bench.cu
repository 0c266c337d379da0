// Workbench: the tensor-core Q4_K and Q6_K_G4 products (ops/cuda/matvec_mma.cuh) against the int8
// products the production pick runs otherwise (matvec_q8_pick_version: v4 / v5), at the 27B and 35B-A3B
// decode shapes and 1, 2, 4, 8 tokens. Each time is a graph of 8 products over rotating weight copies (more bytes than 4x the
// L2), with programmatic dependent launch as in the decode graph, divided by 8: the product alone
// (activations already quantized / packed); the quantize and pack launches are timed apart. The two
// kernels' outputs must agree to 1e-5 (relative L2 difference): the same codes and float arithmetic in
// another order of F32 sums (the unit tests check each against the exact product).
// Build (after the CMake build in build-gpu):
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Isrc -I.deps/include -DFMT_HEADER_ONLY=1 \
//     kernels/matvec_mma_bench.cu build-gpu/libdeltaserve_lib.a build-gpu/libdeltaserve_cuda.a -lcublas \
//     -o build-gpu/matvec_mma_bench
// Run: build-gpu/matvec_mma_bench   (MATVEC_MMA_TOKENS=1,2 restricts the token counts, MATVEC_MMA_SHAPES=0,2
// the Q4_K shapes and MATVEC_MMA_Q6_SHAPES the Q6_K_G4 ones, by index in their tables)
// Variants of the tensor-core kernel (matvec_mma_q4k<warps, stages, CTAs per SM>): production runs
// w8s2 below 8192 rows and w4s3 from there (matvec.cu); w4s4, w4s4c5, w4s3c5 and w8s2 trade the
// CTA's k split against ring depth, c5 caps the registers at 5 CTAs per SM (fewer CTA waves).
// i8w4s3 / i8w8s2: Q4_K on int8 tensor cores over quantize_q8's activations (namespace i8, this file
// only), checked against the int8 kernels' output.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/matvec_mma.cuh"
#include "workbench.cuh"

using namespace ds;

namespace {

struct Variant {
  const char* name;
  void (*kernel)(ds::cuda::kern::MatvecMmaArgs);
  int warps;
};
const Variant kVariants[] = {{"w4s4", ds::cuda::kern::matvec_mma_q4k<4, 4>, 4},
                             {"w4s4c5", ds::cuda::kern::matvec_mma_q4k<4, 4, 5>, 4},
                             {"w4s3c5", ds::cuda::kern::matvec_mma_q4k<4, 3, 5>, 4},
                             {"w8s2", ds::cuda::kern::matvec_mma_q4k<8, 2>, 8}};

// Random weight rows of `block_bytes` per `block_elems` elements: random bytes, then each block's fp16
// scales (at the given offsets) set in [0.002, 0.02).
std::vector<uint8_t> random_rows(int64_t n_rows, int64_t k, int64_t block_elems, int64_t block_bytes,
                                 std::initializer_list<int> scale_offsets, uint32_t seed) {
  const int64_t rb = k / block_elems * block_bytes;
  std::vector<uint8_t> w(static_cast<size_t>(rb * n_rows));
  std::mt19937 rng(seed);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> sc(0.002f, 0.02f);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t b = 0; b < k / block_elems; ++b) {
      uint8_t* p = w.data() + r * rb + b * block_bytes;
      for (int off : scale_offsets) {
        const uint16_t d = f32_to_fp16(sc(rng));
        std::memcpy(p + off, &d, 2);
      }
    }
  }
  return w;
}
// Q4_K: d and dmin; Q6_K_G4: the four blocks' d (its 8 bytes of padding stay random: no reader uses them).
std::vector<uint8_t> q4k_rows(int64_t n_rows, int64_t k, uint32_t seed) {
  return random_rows(n_rows, k, 256, 144, {0, 2}, seed);
}
std::vector<uint8_t> q6g4_rows(int64_t n_rows, int64_t k, uint32_t seed) {
  return random_rows(n_rows, k, 1024, 848, {832, 834, 836, 838}, seed);
}

// The relative L2 difference of b from a.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(b[i]) - a[i]) * (double(b[i]) - a[i]);
    den += double(a[i]) * a[i];
  }
  return std::sqrt(num / (den + 1e-30));
}

// ---- Workbench only: Q4_K on int8 tensor cores, on quantize_q8's activations ----
// matvec_mma_q6k's form for Q4_K: one mask (or a shift and a mask) makes 4 nibbles 4 int8 operands, two
// chained int8 m16n8k16 give a 32-element sub-block's exact dot, then q8_unit_dot's arithmetic:
// acc = fma(d * sc, d_x * isum, acc), acc = fma(-dmin * m, s_x, acc). Against matvec_mma_q4k (FP16
// operands from mma_pack): fewer instructions per weight and quantize_q8's activations, which the int8
// and Q6_K_G4 products share.
namespace i8 {
using namespace ds::cuda::kern;

__device__ __forceinline__ void mma_s8_acc(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
}

template <int kWarps, int kStages, int kMinCtas = 16 / kWarps>
__global__ void __launch_bounds__(32 * kWarps, kMinCtas) q4k(MatvecQ8Args a) {
  __shared__ __align__(16) uint8_t ring[kWarps][kStages][kMmaRows * kMmaBlockBytes];
  __shared__ float part[kWarps][32][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int64_t n_blocks = a.k / kMmaBlock;
  const int n_mine = static_cast<int>((n_blocks - warp + kWarps - 1) / kWarps);
  // Copies as matvec_mma_q4k's (9 pieces a row, lane l the pieces l + 32 i).
  int64_t src[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    const int p = lane + 32 * i, row = p / 9, seg = p % 9;
    src[i] = p < kMmaRows * 9 && r0 + row < a.n_rows ? (r0 + row) * a.w_stride + 16 * seg : -1;
  }
  auto issue = [&](uint8_t* stage, int64_t j) {
    const uint32_t s0 = smem_addr(stage);
    const uintptr_t wj = reinterpret_cast<uintptr_t>(a.w) + static_cast<uintptr_t>(j * kMmaBlockBytes);
#pragma unroll
    for (int i = 0; i < 5; ++i) {
      if (src[i] >= 0) cp_async16_full(s0 + static_cast<uint32_t>(16 * (lane + 32 * i)), wj + static_cast<uintptr_t>(src[i]));
    }
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_mine) issue(ring[warp][i], warp + static_cast<int64_t>(i) * kWarps);
    cp_async_commit();
  }
  dependency_wait();
  allow_dependents();
  const int g = lane / 4, t0 = 2 * (lane % 4);
  const bool codes_live = g < a.n_tokens;
  const uint32_t* xrow = reinterpret_cast<const uint32_t*>(a.xq + g * a.k) + (lane % 4);
  const int64_t units = a.k / kQ8Block;
  const float4* xd0 = reinterpret_cast<const float4*>(static_cast<const float2*>(a.xds) + t0 * units);
  const float4* xd1 = reinterpret_cast<const float4*>(static_cast<const float2*>(a.xds) + (t0 + 1) * units);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < n_mine; ++i) {
    const int next = i + kStages - 1;
    if (next < n_mine) issue(ring[warp][next % kStages], warp + static_cast<int64_t>(next) * kWarps);
    cp_async_commit();
    const int64_t j = warp + static_cast<int64_t>(i) * kWarps;
    uint32_t xb[16];
#pragma unroll
    for (int s = 0; s < 16; ++s) xb[s] = codes_live ? __ldg(xrow + j * 64 + 4 * s) : 0u;
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const uint8_t* stage = ring[warp][i % kStages];
    const uint4 ha = *reinterpret_cast<const uint4*>(stage + g * kMmaBlockBytes);
    const uint4 hb = *reinterpret_cast<const uint4*>(stage + (g + 8) * kMmaBlockBytes);
    auto dm = [](const uint4& h, int jj, float& dw, float& mw) {  // decode_unit_q8's d * sc and -dmin * m
      const uint32_t sel = 0x4440u | static_cast<uint32_t>(jj & 3);
      const uint32_t b1 = __byte_perm(h.y, 0u, sel), b2 = __byte_perm(h.z, 0u, sel), b3 = __byte_perm(h.w, 0u, sel);
      const uint32_t sc = jj < 4 ? (b1 & 63u) : ((b3 & 0xFu) | ((b1 >> 6) << 4));
      const uint32_t m = jj < 4 ? (b2 & 63u) : ((b3 >> 4) | ((b2 >> 6) << 4));
      dw = ds::cuda::qdec::h2f(static_cast<uint16_t>(h.x & 0xFFFFu)) * static_cast<float>(sc);
      mw = -ds::cuda::qdec::h2f(static_cast<uint16_t>(h.x >> 16)) * static_cast<float>(m);
    };
    const uint32_t base = smem_addr(stage) + static_cast<uint32_t>(((lane & 7) + 8 * ((lane >> 3) & 1)) * kMmaBlockBytes +
                                                                   16 + 16 * (lane >> 4));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t r[4];
      ldsm_x4(r, base + 32u * c);
      int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
      mma_s8_acc(lo, r[0] & 0x0F0F0F0Fu, r[1] & 0x0F0F0F0Fu, xb[4 * c]);
      mma_s8_acc(lo, r[2] & 0x0F0F0F0Fu, r[3] & 0x0F0F0F0Fu, xb[4 * c + 1]);
      mma_s8_acc(hi, (r[0] >> 4) & 0x0F0F0F0Fu, (r[1] >> 4) & 0x0F0F0F0Fu, xb[4 * c + 2]);
      mma_s8_acc(hi, (r[2] >> 4) & 0x0F0F0F0Fu, (r[3] >> 4) & 0x0F0F0F0Fu, xb[4 * c + 3]);
      const float4 v0 = t0 < a.n_tokens ? __ldg(xd0 + j * 4 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 v1 = t0 + 1 < a.n_tokens ? __ldg(xd1 + j * 4 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float dwl[2], mwl[2], dwh[2], mwh[2];
      dm(ha, 2 * c, dwl[0], mwl[0]);
      dm(hb, 2 * c, dwl[1], mwl[1]);
      dm(ha, 2 * c + 1, dwh[0], mwh[0]);
      dm(hb, 2 * c + 1, dwh[1], mwh[1]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = q >> 1;
        const float4 v = (q & 1) ? v1 : v0;  // (d, s) of sub-blocks 2c (.x, .y) and 2c + 1 (.z, .w)
        acc[q] = fmaf(mwl[row], v.y, fmaf(dwl[row], v.x * static_cast<float>(lo[q]), acc[q]));
        acc[q] = fmaf(mwh[row], v.w, fmaf(dwh[row], v.z * static_cast<float>(hi[q]), acc[q]));
      }
    }
    __syncwarp();
  }
  mma_store_rows<kWarps>(part, acc, warp, lane, r0, a.y, a.y_stride, a.n_rows, a.n_tokens);
}
}  // namespace i8

// `copies` device copies of the weight bytes hw, one after the other (each product of a timed chain
// reads the next, so the chain reads more than 4x the L2), and 8 rows of k normal activations.
uint8_t* upload_copies(const std::vector<uint8_t>& hw, int copies) {
  uint8_t* dw;
  CK(cudaMalloc(&dw, hw.size() * copies));
  for (int c = 0; c < copies; ++c) CK(cudaMemcpy(dw + c * hw.size(), hw.data(), hw.size(), cudaMemcpyHostToDevice));
  return dw;
}
float* upload_x(int64_t k, uint32_t seed) {
  std::vector<float> hx(static_cast<size_t>(8 * k));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (auto& v : hx) v = nd(rng);
  float* dx;
  CK(cudaMalloc(&dx, 4 * hx.size()));
  CK(cudaMemcpy(dx, hx.data(), 4 * hx.size(), cudaMemcpyHostToDevice));
  return dx;
}


// Q6_K_G4 (the Q4_K_M files' extra-bit tensors in the device layout): the int8 kernels Q6_K would run
// (matvec_q8_pick_version of Q6_K) against matvec_mma_q6k, both on quantize_q8's activations.
int q6_section(double read_gbs, int l2, const std::vector<int>& tokens, cudaStream_t s) {
  struct Shape { int64_t rows, k; const char* what; };
  const Shape shapes[] = {{5120, 17408, "27B ffn down"}, {10240, 5120, "27B deltanet qkv"}, {1024, 5120, "27B attn v"},
                          {248320, 5120, "27B output"}, {8192, 2048, "35B qkv-like"}, {1024, 2048, "35B attn v"}};
  int failures = 0;
  std::printf("\nQ6_K_G4\n%-18s %6s x %-6s t %8s %8s %7s %7s %9s\n", "shape", "rows", "k", "q8 us", "mma us", "q8 %",
              "mma %", "rel diff");
  const char* shape_env = std::getenv("MATVEC_MMA_Q6_SHAPES");
  for (const Shape& sh : shapes) {
    const char idx = static_cast<char>('0' + (&sh - shapes));
    if (shape_env != nullptr && std::strchr(shape_env, idx) == nullptr) continue;
    const int64_t rb = sh.k / 1024 * 848, bytes = rb * sh.rows;
    const int copies = static_cast<int>(std::max<int64_t>(2, (4LL * l2) / bytes + 1));
    uint8_t* dw = upload_copies(q6g4_rows(sh.rows, sh.k, static_cast<uint32_t>(sh.rows * 5 + sh.k)), copies);
    float* dx = upload_x(sh.k, 7);
    float *dy_q8, *dy_mma;
    void* act;
    CK(cudaMalloc(&dy_q8, 4 * 8 * sh.rows));
    CK(cudaMalloc(&dy_mma, 4 * 8 * sh.rows));
    CK(cudaMalloc(&act, cuda::matvec_q8_act_bytes(sh.k, 8)));
    for (int nt : tokens) {
      cuda::MatvecLaunch l{dw, rb, dx, sh.k, nullptr, sh.rows, sh.rows, sh.k, nt};
      l.act = act;
      l.act_bytes = cuda::matvec_q8_act_bytes(sh.k, nt);
      const cuda::MatvecQ8Version v_q8 = cuda::matvec_q8_pick_version(DType::Q6_K, sh.rows, sh.k, nt);
      CK(cuda::quantize_q8_launch(dx, sh.k, nullptr, nt, sh.k, act, nullptr, 0, s));
      cuda::MatvecLaunch lq = l, lm = l;
      lq.y = dy_q8;
      lm.y = dy_mma;
      CK(cuda::matvec_q8_product_launch_version(DType::Q6_K_G4, lq, v_q8, s));
      CK(cuda::matvec_q8_product_launch_version(DType::Q6_K_G4, lm, cuda::MatvecQ8Version::kMma, s));
      CK(cudaStreamSynchronize(s));
      std::vector<float> yq(static_cast<size_t>(nt * sh.rows)), ym(yq.size());
      CK(cudaMemcpy(yq.data(), dy_q8, 4 * yq.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(ym.data(), dy_mma, 4 * ym.size(), cudaMemcpyDeviceToHost));
      const double rel = rel_l2(yq, ym);
      const bool ok = rel < 1e-5 && std::isfinite(rel);  // the same arithmetic but the order of F32 sums
      failures += !ok;
      auto chain = [&](cuda::MatvecLaunch base, cuda::MatvecQ8Version v) {
        return [&, base, v]() {
          for (int i = 0; i < 8; ++i) {
            cuda::MatvecLaunch x = base;
            x.w = dw + (i % copies) * bytes;
            CK(cuda::matvec_q8_product_launch_version(DType::Q6_K_G4, x, v, s));
          }
        };
      };
      const float q8_ms = graph_median_ms(s, chain(lq, v_q8), 20) / 8;
      const float mma_ms = graph_median_ms(s, chain(lm, cuda::MatvecQ8Version::kMma), 20) / 8;
      auto pct = [&](float ms) { return 100.0 * bytes / (ms * 1e-3) / 1e9 / read_gbs; };
      std::printf("%-18s %6lld x %-6lld %d %8.2f %8.2f %6.1f%% %6.1f%% %9.2e %s (q8 %s)\n", sh.what, (long long)sh.rows,
                  (long long)sh.k, nt, q8_ms * 1e3, mma_ms * 1e3, pct(q8_ms), pct(mma_ms), rel, ok ? "ok" : "FAIL",
                  cuda::matvec_q8_version_name(v_q8));
    }
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dy_q8));
    CK(cudaFree(dy_mma));
    CK(cudaFree(act));
  }
  return failures;
}

}  // namespace

int main() {
  const double read_gbs = measure_read_gbs();
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  std::printf("read bandwidth %.0f GB/s, L2 %d MB\n", read_gbs, l2 >> 20);
  struct Shape { int64_t rows, k; const char* what; };
  const Shape shapes[] = {{17408, 5120, "27B ffn gate/up"}, {34816, 5120, "27B gate+up"}, {5120, 17408, "27B ffn down"},
                          {10240, 5120, "27B deltanet qkv"}, {6144, 5120, "27B attn q"},  {5120, 6144, "27B out"},
                          {1024, 5120, "27B attn k/v"},      {8192, 2048, "35B qkv-like"}, {2048, 4096, "35B out"},
                          {512, 2048, "35B shared"}};
  std::vector<int> tokens = {1, 2, 4, 8};
  if (const char* e = std::getenv("MATVEC_MMA_TOKENS")) {
    tokens.clear();
    for (const char* p = e; *p; ++p) if (*p >= '1' && *p <= '8') tokens.push_back(*p - '0');
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int failures = 0;
  std::printf("%-18s %6s x %-6s t %8s %8s %8s %8s %7s %7s %9s  variants (us)\n", "shape", "rows", "k", "q8 us", "mma us",
              "quant", "pack", "q8 %", "mma %", "rel diff");
  const char* shape_env = std::getenv("MATVEC_MMA_SHAPES");
  for (const Shape& sh : shapes) {
    const char idx = static_cast<char>('0' + (&sh - shapes));
    if (shape_env != nullptr && std::strchr(shape_env, idx) == nullptr) continue;
    const int64_t rb = sh.k / 256 * 144, bytes = rb * sh.rows;
    const int copies = static_cast<int>(std::max<int64_t>(2, (4LL * l2) / bytes + 1));
    uint8_t* dw = upload_copies(q4k_rows(sh.rows, sh.k, static_cast<uint32_t>(sh.rows * 7 + sh.k)), copies);
    float* dx = upload_x(sh.k, 5);
    float *dy_q8, *dy_mma;
    void *act_q8, *act_mma;
    CK(cudaMalloc(&dy_q8, 4 * 8 * sh.rows));
    CK(cudaMalloc(&dy_mma, 4 * 8 * sh.rows));
    CK(cudaMalloc(&act_q8, cuda::matvec_q8_act_bytes(sh.k, 8)));
    CK(cudaMalloc(&act_mma, cuda::matvec_mma_act_bytes(sh.k)));
    for (int nt : tokens) {
      cuda::MatvecLaunch l{dw, rb, dx, sh.k, nullptr, sh.rows, sh.rows, sh.k, nt};
      cuda::MatvecLaunch lq = l, lm = l;
      lq.y = dy_q8;
      lq.act = act_q8;
      lq.act_bytes = cuda::matvec_q8_act_bytes(sh.k, nt);
      lm.y = dy_mma;
      lm.act = act_mma;
      lm.act_bytes = cuda::matvec_mma_act_bytes(sh.k);
      CK(cuda::quantize_q8_launch(dx, sh.k, nullptr, nt, sh.k, act_q8, nullptr, 0, s));
      CK(cuda::mma_pack_launch(dx, sh.k, nullptr, nt, sh.k, act_mma, s));
      CK(cuda::matvec_q8_product_launch(DType::Q4_K, lq, s));
      CK(cuda::matvec_mma_product_launch(DType::Q4_K, lm, s));
      CK(cudaStreamSynchronize(s));
      std::vector<float> yq(static_cast<size_t>(nt * sh.rows)), ym(yq.size());
      CK(cudaMemcpy(yq.data(), dy_q8, 4 * yq.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(ym.data(), dy_mma, 4 * ym.size(), cudaMemcpyDeviceToHost));
      const double rel = rel_l2(yq, ym);
      const bool ok = rel < 1e-5 && std::isfinite(rel);  // the same arithmetic but the order of F32 sums
      failures += !ok;
      auto chain = [&](cuda::MatvecLaunch base, bool mma) {
        return [&, base, mma]() {
          for (int i = 0; i < 8; ++i) {
            cuda::MatvecLaunch x = base;
            x.w = dw + (i % copies) * bytes;
            CK(mma ? cuda::matvec_mma_product_launch(DType::Q4_K, x, s) : cuda::matvec_q8_product_launch(DType::Q4_K, x, s));
          }
        };
      };
      const float q8_ms = graph_median_ms(s, chain(lq, false), 20) / 8;
      const float mma_ms = graph_median_ms(s, chain(lm, true), 20) / 8;
      const float quant_ms = graph_median_ms(s, [&] {
        for (int i = 0; i < 8; ++i) CK(cuda::quantize_q8_launch(dx, sh.k, nullptr, nt, sh.k, act_q8, nullptr, 0, s));
      }, 20) / 8;
      const float pack_ms = graph_median_ms(s, [&] {
        for (int i = 0; i < 8; ++i) CK(cuda::mma_pack_launch(dx, sh.k, nullptr, nt, sh.k, act_mma, s));
      }, 20) / 8;
      auto pct = [&](float ms) { return 100.0 * bytes / (ms * 1e-3) / 1e9 / read_gbs; };
      std::printf("%-18s %6lld x %-6lld %d %8.2f %8.2f %8.2f %8.2f %6.1f%% %6.1f%% %9.2e %s ", sh.what,
                  (long long)sh.rows, (long long)sh.k, nt, q8_ms * 1e3, mma_ms * 1e3, quant_ms * 1e3, pack_ms * 1e3,
                  pct(q8_ms), pct(mma_ms), rel, ok ? "ok" : "FAIL");
      const ds::cuda::kern::MatvecMmaArgs ma{dw, rb, static_cast<const uint8_t*>(act_mma), dy_mma, sh.rows, sh.rows, sh.k, nt};
      const unsigned grid = static_cast<unsigned>((sh.rows + 15) / 16);
      for (const Variant& v : kVariants) {
        CK(cudaMemset(dy_mma, 0xFF, 4 * 8 * sh.rows));
        CK(ds::cuda::launch_kernel(v.kernel, grid, 32 * v.warps, 0, s, ma));
        CK(cudaStreamSynchronize(s));
        std::vector<float> yv(ym.size());
        CK(cudaMemcpy(yv.data(), dy_mma, 4 * yv.size(), cudaMemcpyDeviceToHost));
        // Another k split sums in another order: the same up to F32 rounding (relative L2 difference).
        const bool same = rel_l2(ym, yv) < 1e-5;
        failures += !same;
        const float ms = graph_median_ms(s, [&] {
          for (int i = 0; i < 8; ++i) {
            ds::cuda::kern::MatvecMmaArgs x = ma;
            x.w = dw + (i % copies) * bytes;
            CK(ds::cuda::launch_kernel(v.kernel, grid, 32 * v.warps, 0, s, x));
          }
        }, 20) / 8;
        std::printf(" %s %.2f%s", v.name, ms * 1e3, same ? "" : "(DIFFERS)");
      }
      // The int8 tensor-core form on quantize_q8's activations (against the int8 kernels' output).
      const ds::cuda::kern::MatvecQ8Args qa = ds::cuda::kern::q8_args(dw, rb, act_q8, sh.k, nt, dy_mma, sh.rows, sh.rows, nt);
      struct I8 { const char* name; void (*kernel)(ds::cuda::kern::MatvecQ8Args); int warps; };
      for (const I8& v : {I8{"i8w4s3", i8::q4k<4, 3>, 4}, I8{"i8w8s2", i8::q4k<8, 2>, 8}}) {
        CK(cudaMemset(dy_mma, 0xFF, 4 * 8 * sh.rows));
        CK(ds::cuda::launch_kernel(v.kernel, grid, 32 * v.warps, 0, s, qa));
        CK(cudaStreamSynchronize(s));
        std::vector<float> yv(yq.size());
        CK(cudaMemcpy(yv.data(), dy_mma, 4 * yv.size(), cudaMemcpyDeviceToHost));
        const bool same = rel_l2(yq, yv) < 1e-5;
        failures += !same;
        const float ms = graph_median_ms(s, [&] {
          for (int i = 0; i < 8; ++i) {
            ds::cuda::kern::MatvecQ8Args x = qa;
            x.w = dw + (i % copies) * bytes;
            CK(ds::cuda::launch_kernel(v.kernel, grid, 32 * v.warps, 0, s, x));
          }
        }, 20) / 8;
        std::printf(" %s %.2f%s", v.name, ms * 1e3, same ? "" : "(DIFFERS)");
      }
      std::printf("\n");
    }
    CK(cudaFree(dw));
    CK(cudaFree(dx));
    CK(cudaFree(dy_q8));
    CK(cudaFree(dy_mma));
    CK(cudaFree(act_q8));
    CK(cudaFree(act_mma));
  }
  failures += q6_section(read_gbs, l2, tokens, s);
  std::printf("%s\n", failures == 0 ? "all outputs agree" : "SOME OUTPUTS DISAGREE");
  return failures == 0 ? 0 : 1;
}
