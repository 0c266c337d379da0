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
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
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

// Shape `idx` of a table unless the environment variable `env` lists others (digits of their indices).
bool shape_wanted(const char* env, int idx) {
  const char* e = std::getenv(env);
  return e == nullptr || std::strchr(e, '0' + idx) != nullptr;
}
// Copies of a weight of `bytes` a timed chain rotates through: more bytes than 4x the L2, at least 2.
int copies_over_l2(int64_t bytes, int l2) { return static_cast<int>(std::max<int64_t>(2, (4LL * l2) / bytes + 1)); }

// `copies` device copies of the weight bytes hw, one after the other (each product of a timed chain
// reads the next: copies_over_l2), and 8 rows of k normal activations.
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


// One shape's device buffers: the weights' rotating copies (upload_copies), 8 rows of activations and
// the two compared products' outputs of up to 8 tokens; freed with it.
struct ShapeBufs {
  uint8_t* w;
  float* x;
  float *y_q8, *y_mma;
  ShapeBufs(const std::vector<uint8_t>& hw, int copies, int64_t k, int64_t rows, uint32_t x_seed)
      : w(upload_copies(hw, copies)), x(upload_x(k, x_seed)) {
    CK(cudaMalloc(&y_q8, 4 * 8 * rows));
    CK(cudaMalloc(&y_mma, 4 * 8 * rows));
  }
  ShapeBufs(const ShapeBufs&) = delete;
  ShapeBufs& operator=(const ShapeBufs&) = delete;
  ~ShapeBufs() {
    CK(cudaFree(w));
    CK(cudaFree(x));
    CK(cudaFree(y_q8));
    CK(cudaFree(y_mma));
  }
  // The first n floats of both outputs (the stream synchronized).
  std::pair<std::vector<float>, std::vector<float>> outputs(size_t n) const {
    std::vector<float> q(n), m(n);
    CK(cudaMemcpy(q.data(), y_q8, 4 * n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(m.data(), y_mma, 4 * n, cudaMemcpyDeviceToHost));
    return {q, m};
  }
};

// Q6_K_G4 (the Q4_K_M files' extra-bit tensors in the device layout): the int8 kernels Q6_K would run
// (matvec_q8_pick_version of Q6_K) against matvec_mma_q6k, both on quantize_q8's activations.
int q6_section(double read_gbs, int l2, const std::vector<int>& tokens, cudaStream_t s) {
  struct Shape { int64_t rows, k; const char* what; };
  const Shape shapes[] = {{5120, 17408, "27B ffn down"}, {10240, 5120, "27B deltanet qkv"}, {1024, 5120, "27B attn v"},
                          {248320, 5120, "27B output"}, {8192, 2048, "35B qkv-like"}, {1024, 2048, "35B attn v"}};
  int failures = 0;
  std::printf("\nQ6_K_G4\n%-18s %6s x %-6s t %8s %8s %7s %7s %9s\n", "shape", "rows", "k", "q8 us", "mma us", "q8 %",
              "mma %", "rel diff");
  for (const Shape& sh : shapes) {
    if (!shape_wanted("MATVEC_MMA_Q6_SHAPES", static_cast<int>(&sh - shapes))) continue;
    const int64_t rb = sh.k / 1024 * 848, bytes = rb * sh.rows;
    const int copies = copies_over_l2(bytes, l2);
    const ShapeBufs b(q6g4_rows(sh.rows, sh.k, static_cast<uint32_t>(sh.rows * 5 + sh.k)), copies, sh.k, sh.rows, 7);
    uint8_t* dw = b.w;
    float* dx = b.x;
    void* act;
    CK(cudaMalloc(&act, cuda::matvec_q8_act_bytes(sh.k, 8)));
    for (int nt : tokens) {
      cuda::MatvecLaunch l{dw, rb, dx, sh.k, nullptr, sh.rows, sh.rows, sh.k, nt};
      l.act = act;
      l.act_bytes = cuda::matvec_q8_act_bytes(sh.k, nt);
      const cuda::MatvecQ8Version v_q8 = cuda::matvec_q8_pick_version(DType::Q6_K, sh.rows, sh.k, nt);
      CK(cuda::quantize_q8_launch(dx, sh.k, nullptr, nt, sh.k, act, nullptr, 0, s));
      cuda::MatvecLaunch lq = l, lm = l;
      lq.y = b.y_q8;
      lm.y = b.y_mma;
      CK(cuda::matvec_q8_product_launch_version(DType::Q6_K_G4, lq, v_q8, s));
      CK(cuda::matvec_q8_product_launch_version(DType::Q6_K_G4, lm, cuda::MatvecQ8Version::kMma, s));
      CK(cudaStreamSynchronize(s));
      const auto [yq, ym] = b.outputs(static_cast<size_t>(nt * sh.rows));
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
  for (const Shape& sh : shapes) {
    if (!shape_wanted("MATVEC_MMA_SHAPES", static_cast<int>(&sh - shapes))) continue;
    const int64_t rb = sh.k / 256 * 144, bytes = rb * sh.rows;
    const int copies = copies_over_l2(bytes, l2);
    const ShapeBufs b(q4k_rows(sh.rows, sh.k, static_cast<uint32_t>(sh.rows * 7 + sh.k)), copies, sh.k, sh.rows, 5);
    uint8_t* dw = b.w;
    float* dx = b.x;
    float* dy_mma = b.y_mma;
    void *act_q8, *act_mma;
    CK(cudaMalloc(&act_q8, cuda::matvec_q8_act_bytes(sh.k, 8)));
    CK(cudaMalloc(&act_mma, cuda::matvec_mma_act_bytes(sh.k)));
    for (int nt : tokens) {
      cuda::MatvecLaunch l{dw, rb, dx, sh.k, nullptr, sh.rows, sh.rows, sh.k, nt};
      cuda::MatvecLaunch lq = l, lm = l;
      lq.y = b.y_q8;
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
      const auto [yq, ym] = b.outputs(static_cast<size_t>(nt * sh.rows));
      const double rel = rel_l2(yq, ym);
      const bool ok = rel < 1e-5 && std::isfinite(rel);  // the same arithmetic but the order of F32 sums
      failures += !ok;
      auto chain = [&](cuda::MatvecLaunch base, bool mma) {
        return [&, base, mma]() {
          for (int i = 0; i < 8; ++i) {
            cuda::MatvecLaunch x = base;
            x.w = dw + (i % copies) * bytes;
            CK(mma ? cuda::matvec_mma_product_launch(DType::Q4_K, x, s)
                   : cuda::matvec_q8_product_launch(DType::Q4_K, x, s));
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
      // A variant: once into dy_mma against `ref` (the same arithmetic, another order of F32 sums: relative
      // L2 difference under 1e-5), then timed as a chain of 8 over the rotating copies.
      auto variant = [&](const char* name, auto launch, const std::vector<float>& ref) {
        CK(cudaMemset(dy_mma, 0xFF, 4 * 8 * sh.rows));
        launch(dw);
        CK(cudaStreamSynchronize(s));
        std::vector<float> yv(ref.size());
        CK(cudaMemcpy(yv.data(), dy_mma, 4 * yv.size(), cudaMemcpyDeviceToHost));
        const bool same = rel_l2(ref, yv) < 1e-5;
        failures += !same;
        const float ms = graph_median_ms(s, [&] {
          for (int i = 0; i < 8; ++i) launch(dw + (i % copies) * bytes);
        }, 20) / 8;
        std::printf(" %s %.2f%s", name, ms * 1e3, same ? "" : "(DIFFERS)");
      };
      const unsigned grid = static_cast<unsigned>((sh.rows + 15) / 16);
      const ds::cuda::kern::MatvecMmaArgs ma{
          dw, rb, static_cast<const uint8_t*>(act_mma), dy_mma, sh.rows, sh.rows, sh.k, nt};
      for (const Variant& v : kVariants) {  // against the production tensor-core kernel
        variant(v.name, [&](const uint8_t* w) {
          ds::cuda::kern::MatvecMmaArgs x = ma;
          x.w = w;
          CK(ds::cuda::launch_kernel(v.kernel, grid, 32 * v.warps, 0, s, x));
        }, ym);
      }
      std::printf("\n");
    }
    CK(cudaFree(act_q8));
    CK(cudaFree(act_mma));
  }
  failures += q6_section(read_gbs, l2, tokens, s);
  std::printf("%s\n", failures == 0 ? "all outputs agree" : "SOME OUTPUTS DISAGREE");
  return failures == 0 ? 0 : 1;
}
