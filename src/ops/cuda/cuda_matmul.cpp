// Host entry of the CUDA matrix product (cuda_matmul.h): shape and device checks, path and kernel
// choice, the q8 activation scratch, the prefill path (BF16 weight tiles + cuBLAS), and the fused forms
// (matmul_many: one activation conversion for several weights; matmul_swiglu: SwiGLU inside the
// quantizer). Compiled by the C++ compiler; empty without DS_HAVE_CUDA.
// Non-obvious choice: cuBLAS sees the row-major product as column-major Y^T = W^T X^T, i.e.
// op(A) = transpose of the [k, rows] BF16 tile (lda = k), B = activations (ldb = k), C = y (ldc = y's
// row stride): no transposes are materialized, and a tile writes a column block of y in place.
#if DS_HAVE_CUDA

#include "ops/cuda/cuda_matmul.h"

#include <array>
#include <mutex>
#include <optional>
#include <vector>

#include "core/check.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/ops_launch.h"

namespace ds::cuda {
namespace {

constexpr int64_t kTileBytes = int64_t{64} << 20;  // BF16 weight tile budget per GEMM call
constexpr int64_t kTileRowAlign = 256;              // tile row counts are multiples of this

struct BlasHandle {
  // Guards the handle's stream binding during a call. The handle's internal workspace is shared, so
  // GEMMs on two streams of one device that overlap on the GPU would need a workspace per stream
  // (cublasSetWorkspace); the model runs one stream per device.
  std::mutex mutex;
  cublasHandle_t handle = nullptr;
};

Result<BlasHandle*> blas_for_device(int device) {
  static std::mutex m;
  static std::array<BlasHandle*, 64> handles{};
  DS_CHECK(device >= 0 && device < 64, "device {}", device);
  std::lock_guard<std::mutex> lock(m);
  if (!handles[device]) {
    DeviceGuard guard(device);
    cublasHandle_t h = nullptr;
    DS_CUBLAS_TRY(cublasCreate(&h), "cublasCreate cuda:{}", device);
    auto* bh = new BlasHandle;  // lives for the process, like the allocator
    bh->handle = h;
    handles[device] = bh;
  }
  return handles[device];
}

std::string shapes(const TensorView& w, const TensorView& x, const TensorView& y) {
  return fmt::format("matmul w {} x {} y {}", w.shape_string(), x.shape_string(), y.shape_string());
}

Status check_args(const TensorView& w, const TensorView& x, const TensorView& y, int device) {
  const auto on_device = [&](const TensorView& t) {
    return t.device.kind == DeviceKind::kCuda && t.device.index == device;
  };
  if (!on_device(w) || !on_device(x) || !on_device(y)) {
    return invalid_argument("{}: tensors on {}, {}, {}; stream on cuda:{}", shapes(w, x, y),
                            w.device.to_string(), x.device.to_string(), y.device.to_string(), device);
  }
  if (!matmul_supported(w.dtype)) return unsupported("{}: weight type {}", shapes(w, x, y), dtype_name(w.dtype));
  if (x.dtype != DType::F32 || y.dtype != DType::F32) {
    return unsupported("{}: activations and outputs must be f32", shapes(w, x, y));
  }
  if (w.ne[2] * w.ne[3] != 1 || x.ne[2] * x.ne[3] != 1 || y.ne[2] * y.ne[3] != 1) {
    return invalid_argument("{}: 2-D tensors expected", shapes(w, x, y));
  }
  if (x.ne[0] != w.ne[0] || y.ne[0] != w.ne[1] || y.ne[1] != x.ne[1]) {
    return invalid_argument("{}: expected x [{}, n], y [{}, n]", shapes(w, x, y), w.ne[0], w.ne[1]);
  }
  if (w.ne[0] % dtype_block_size(w.dtype) != 0) {
    return invalid_argument("{}: k {} is not a multiple of the {} block size {}", shapes(w, x, y), w.ne[0],
                            dtype_name(w.dtype), dtype_block_size(w.dtype));
  }
  if (w.nb[0] != dtype_block_bytes(w.dtype) || x.nb[0] != 4 || y.nb[0] != 4 || x.nb[1] % 4 != 0 ||
      y.nb[1] % 4 != 0 || w.nb[1] < w.row_bytes() || x.nb[1] < 4 * x.ne[0] || y.nb[1] < 4 * y.ne[0]) {
    return invalid_argument("{}: rows must be contiguous (strides w {} x {} y {})", shapes(w, x, y), w.nb[1],
                            x.nb[1], y.nb[1]);
  }
  return device_status(device);
}

// x_bf16: x already converted to BF16 ([n_tokens, k] contiguous, f32_to_bf16_launch), or null to
// convert here. F32 weights read x itself.
Status matmul_gemm(const TensorView& w, const TensorView& x, const TensorView& y, int device, cudaStream_t cs,
                   const void* x_bf16 = nullptr) {
  const int64_t k = w.ne[0], n_rows = w.ne[1], n_tokens = x.ne[1];
  const int64_t ldy = y.nb[1] / 4;
  DS_ASSIGN_OR_RETURN(BlasHandle * blas, blas_for_device(device));
  const float alpha = 1.0f, beta = 0.0f;
  std::lock_guard<std::mutex> lock(blas->mutex);
  DS_CUBLAS_TRY(cublasSetStream(blas->handle, cs), "{}", shapes(w, x, y));
  if (w.dtype == DType::F32) {  // full F32 product: F32 weights are small and precision-sensitive
    DS_CUBLAS_TRY(cublasGemmEx(blas->handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_rows),
                               static_cast<int>(n_tokens), static_cast<int>(k), &alpha, w.data, CUDA_R_32F,
                               static_cast<int>(w.nb[1] / 4), x.data, CUDA_R_32F, static_cast<int>(x.nb[1] / 4),
                               &beta, y.data, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT),
                  "{}", shapes(w, x, y));
    return Status::ok();
  }
  CudaBuffer own_xb;  // back to the cache on return; later users are ordered after the GEMMs
  const void* xb = x_bf16;
  if (xb == nullptr) {
    DS_ASSIGN_OR_RETURN(own_xb, CudaBuffer::allocate(device, 2 * k * n_tokens));
    DS_CUDA_TRY(f32_to_bf16_launch(x.as<float>(), x.nb[1] / 4, n_tokens, k, own_xb.data(), cs), "{}: to bf16",
                shapes(w, x, y));
    xb = own_xb.data();
  }
  if (w.dtype == DType::BF16 && w.nb[1] % 2 == 0) {  // BF16 weights go to cuBLAS as they are
    DS_CUBLAS_TRY(cublasGemmEx(blas->handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_rows),
                               static_cast<int>(n_tokens), static_cast<int>(k), &alpha, w.data, CUDA_R_16BF,
                               static_cast<int>(w.nb[1] / 2), xb, CUDA_R_16BF, static_cast<int>(k), &beta,
                               y.data, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "{}", shapes(w, x, y));
    return Status::ok();
  }
  // Tiles start at multiples of kTileRowAlign rows, so every tile's column block of y keeps y's
  // alignment: cuBLAS falls back to its slow unaligned (align1) kernels for an output pointer that is
  // not 16-byte aligned.
  const int64_t tile_rows =
      std::min(n_rows, std::max(kTileRowAlign, kTileBytes / (2 * k) / kTileRowAlign * kTileRowAlign));
  DS_ASSIGN_OR_RETURN(CudaBuffer wb, CudaBuffer::allocate(device, 2 * k * tile_rows));
  for (int64_t r0 = 0; r0 < n_rows; r0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, n_rows - r0);
    DS_CUDA_TRY(dequant_bf16_launch(w.dtype, w.row(r0), w.nb[1], rows, k, wb.data(), cs), "{}: dequantize rows {}",
                shapes(w, x, y), r0);
    DS_CUBLAS_TRY(cublasGemmEx(blas->handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                               static_cast<int>(n_tokens), static_cast<int>(k), &alpha, wb.data(), CUDA_R_16BF,
                               static_cast<int>(k), xb, CUDA_R_16BF, static_cast<int>(k), &beta,
                               y.as<float>() + r0, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT),
                  "{}: rows {}", shapes(w, x, y), r0);
  }
  // The tiles go back to the cache now; later work on this stream is ordered after the GEMMs.
  return Status::ok();
}

MatvecLaunch matvec_args(const TensorView& w, const TensorView& x, const TensorView& y, void* act,
                         int64_t act_bytes) {
  MatvecLaunch l{w.data, w.nb[1], x.as<float>(), x.nb[1] / 4, y.as<float>(), y.nb[1] / 4,
                 w.ne[1], w.ne[0], static_cast<int>(x.ne[1])};
  l.act = act;
  l.act_bytes = act_bytes;
  return l;
}

MatvecKernel fastest_matvec(MatmulPath path) {
  switch (path) {
    case MatmulPath::kMatvecF32: return MatvecKernel::kStaged;
    case MatmulPath::kGeneric: return MatvecKernel::kGeneric;
    default: return MatvecKernel::kQ8;
  }
}

// Would the q8 kernel apply to `l` once it has scratch? (Every matmul call provides it: the caller's or
// its own.) A static aligned address stands in for the scratch; it is never dereferenced.
bool q8_applies_with_scratch(DType t, MatvecLaunch l) {
  alignas(16) static uint8_t stand_in[16];
  l.act = stand_in;
  l.act_bytes = matvec_q8_act_bytes(l.k, l.n_tokens);
  return matvec_q8_ok(t, l);
}

// Would the tensor-core kernel run for `l` once it has packed activations? (As q8_applies_with_scratch.)
bool mma_applies_with_scratch(DType t, MatvecLaunch l) {
  if (!matvec_mma_wanted(t, l.k, l.n_tokens)) return false;
  alignas(16) static uint8_t stand_in[16];
  l.act = stand_in;
  l.act_bytes = matvec_mma_act_bytes(l.k);
  return matvec_mma_ok(t, l);
}

MatmulPath resolve_path(MatmulPath path, int64_t n_tokens) {
  if (path != MatmulPath::kAuto) return path;
  return n_tokens < kMatmulGemmMinTokens ? MatmulPath::kMatvec : MatmulPath::kGemm;
}

}  // namespace

bool matmul_supported(DType t) { return matvec_supports(t); }

const char* matmul_kernel_name(MatmulKernel k) {
  switch (k) {
    case MatmulKernel::kMatvecQ8: return "matvec_q8";
    case MatmulKernel::kMatvecMma: return "matvec_mma";
    case MatmulKernel::kMatvecStaged: return "matvec_staged";
    case MatmulKernel::kMatvecGeneric: return "matvec_generic";
    case MatmulKernel::kGemm: return "gemm";
  }
  return "?";
}

int64_t matmul_scratch_bytes(DType t, int64_t k, int64_t n_tokens) {
  if (!matvec_q8_supports(t) || n_tokens < 1 || n_tokens > kMatvecQ8MaxTokens || k % 32 != 0) return 0;
  if (matvec_mma_wanted(t, k, static_cast<int>(n_tokens))) return matvec_mma_act_bytes(k);
  return matvec_q8_act_bytes(k, n_tokens);
}

int64_t matmul_scratch_ds_offset(int64_t k, int64_t n_tokens) { return matvec_q8_ds_offset(k, n_tokens); }

MatmulKernel matmul_kernel(const TensorView& w, const TensorView& x, const TensorView& y, MatmulPath path) {
  path = resolve_path(path, x.ne[1]);
  if (path == MatmulPath::kGemm) return MatmulKernel::kGemm;
  const MatvecLaunch l = matvec_args(w, x, y, nullptr, 0);
  const MatvecKernel fastest = fastest_matvec(path);
  if (fastest == MatvecKernel::kQ8 && mma_applies_with_scratch(w.dtype, l)) return MatmulKernel::kMatvecMma;
  if (fastest == MatvecKernel::kQ8 && q8_applies_with_scratch(w.dtype, l)) return MatmulKernel::kMatvecQ8;
  switch (matvec_pick(w.dtype, l, fastest == MatvecKernel::kQ8 ? MatvecKernel::kStaged : fastest)) {
    case MatvecKernel::kStaged: return MatmulKernel::kMatvecStaged;
    default: return MatmulKernel::kMatvecGeneric;
  }
}

Status matmul(const TensorView& w, const TensorView& x, const TensorView& y, const Stream& stream,
              MatmulPath path) {
  return matmul_on(w, x, y, stream.device(), stream.handle(), path);
}

Status matmul_on(const TensorView& w, const TensorView& x, const TensorView& y, int device, void* stream,
                 MatmulPath path) {
  return matmul_on(w, x, y, device, stream, path, nullptr, 0);
}

Status matmul_on(const TensorView& w, const TensorView& x, const TensorView& y, int device, void* stream,
                 MatmulPath path, void* scratch, int64_t scratch_bytes) {
  DS_TRY(check_args(w, x, y, device));
  const int64_t n_tokens = x.ne[1];
  if (n_tokens == 0 || w.ne[1] == 0) return Status::ok();
  DeviceGuard guard(device);
  auto cs = static_cast<cudaStream_t>(stream);
  path = resolve_path(path, n_tokens);
  if (path == MatmulPath::kGemm) return matmul_gemm(w, x, y, device, cs);
  if (n_tokens > kMatmulMaxMatvecTokens) {
    return invalid_argument("{}: matrix-vector path takes at most {} tokens", shapes(w, x, y),
                            kMatmulMaxMatvecTokens);
  }
  MatvecLaunch l = matvec_args(w, x, y, scratch, scratch_bytes);
  const MatvecKernel fastest = fastest_matvec(path);
  CudaBuffer own;  // back to the cache on return; later users of the block are ordered after this call
  if (fastest == MatvecKernel::kQ8 && mma_applies_with_scratch(w.dtype, l)) {
    const int64_t need = matvec_mma_act_bytes(w.ne[0]);
    if (l.act == nullptr || l.act_bytes < need || reinterpret_cast<uintptr_t>(l.act) % 16 != 0) {
      DS_ASSIGN_OR_RETURN(own, CudaBuffer::allocate(device, need));
      l.act = own.data();
      l.act_bytes = need;
    }
    DS_CUDA_TRY(mma_pack_launch(l.x, l.x_stride, nullptr, l.n_tokens, l.k, l.act, cs), "{} (mma_pack)",
                shapes(w, x, y));
    DS_CUDA_TRY(matvec_mma_product_launch(w.dtype, l, cs), "{} (matvec_mma)", shapes(w, x, y));
    return Status::ok();
  }
  if (fastest == MatvecKernel::kQ8 && !matvec_q8_ok(w.dtype, l) && q8_applies_with_scratch(w.dtype, l)) {
    const int64_t need = matvec_q8_act_bytes(w.ne[0], n_tokens);
    DS_ASSIGN_OR_RETURN(own, CudaBuffer::allocate(device, need));
    l.act = own.data();
    l.act_bytes = need;
  }
  const MatvecKernel kernel = matvec_pick(w.dtype, l, fastest);
  DS_CUDA_TRY(matvec_launch(w.dtype, l, kernel, cs), "{} ({})", shapes(w, x, y),
              kernel == MatvecKernel::kQ8       ? "matvec_q8"
              : kernel == MatvecKernel::kStaged ? "matvec_staged"
                                                : "matvec_generic");
  return Status::ok();
}

namespace {

// x [k, n_tokens] (silu(x) * up with `up`) quantized for the q8 kernels into a scratch block from the
// caching allocator, which returns to the cache when the caller is done (later users of the block are
// ordered after the caller's products on the stream).
Result<CudaBuffer> quantized_input(const TensorView& x, const TensorView* up, int device, cudaStream_t cs) {
  const int64_t k = x.ne[0], n_tokens = x.ne[1];
  DS_ASSIGN_OR_RETURN(CudaBuffer act, CudaBuffer::allocate(device, matvec_q8_act_bytes(k, n_tokens)));
  DS_CUDA_TRY(quantize_q8_launch(x.as<float>(), x.nb[1] / 4, up ? up->as<float>() : nullptr, n_tokens, k, act.data(),
                                 nullptr, 0, cs),
              "quantize_q8 x {}{}", x.shape_string(), up ? " (swiglu)" : "");
  return act;
}

// x [k, n_tokens] (silu(x) * up with `up`) packed for the tensor-core kernel, as quantized_input.
Result<CudaBuffer> packed_input(const TensorView& x, const TensorView* up, int device, cudaStream_t cs) {
  const int64_t k = x.ne[0], n_tokens = x.ne[1];
  DS_ASSIGN_OR_RETURN(CudaBuffer act, CudaBuffer::allocate(device, matvec_mma_act_bytes(k)));
  DS_CUDA_TRY(mma_pack_launch(x.as<float>(), x.nb[1] / 4, up ? up->as<float>() : nullptr, static_cast<int>(n_tokens), k,
                              act.data(), cs),
              "mma_pack x {}{}", x.shape_string(), up ? " (swiglu)" : "");
  return act;
}

// True when weight b's rows start where weight a's end (same type and row bytes).
bool weights_follow(const TensorView& wa, const TensorView& wb) {
  return wb.ne[1] > 0 && wb.dtype == wa.dtype && wb.nb[1] == wa.nb[1] &&
         static_cast<const uint8_t*>(wb.data) == static_cast<const uint8_t*>(wa.data) + wa.ne[1] * wa.nb[1];
}

// True for one token when the weights follow each other and so does b's output vector: the two
// products are one over the rows of both. (Outputs are contiguous, so for more tokens they cannot
// follow each other row by row.)
bool rows_follow(const TensorView& wa, const TensorView& ya, const TensorView& wb, const TensorView& yb,
                 int64_t n_tokens) {
  return n_tokens == 1 && weights_follow(wa, wb) && yb.as<float>() == ya.as<float>() + ya.ne[0];
}

}  // namespace

Status check_q8_act(const char* op, const TensorView& act, int64_t k, int64_t n_rows) {
  const int64_t need = matvec_q8_act_bytes(k, n_rows);
  if (act.n_bytes() < need || reinterpret_cast<uintptr_t>(act.data) % 16 != 0) {
    return invalid_argument("{}: q8 activations {} ({} bytes) need {} bytes, 16-byte aligned", op, act.shape_string(),
                            act.n_bytes(), need);
  }
  return Status::ok();
}

Status matmul_many_on(std::span<const TensorView> ws, const TensorView& x, std::span<const TensorView> ys,
                      int device, void* stream, MatmulPath path, const TensorView* act_in) {
  if (ws.size() != ys.size()) {
    return invalid_argument("matmul_many x {}: {} weights but {} outputs", x.shape_string(), ws.size(), ys.size());
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    DS_TRY(check_args(ws[i], x, ys[i], device).with_context(fmt::format("matmul_many product {}", i)));
  }
  const int64_t k = x.ne[0], n_tokens = x.ne[1];
  if (n_tokens == 0 || ws.empty()) return Status::ok();
  DeviceGuard guard(device);
  auto cs = static_cast<cudaStream_t>(stream);
  path = resolve_path(path, n_tokens);
  if (path == MatmulPath::kGemm) {
    bool want_bf16 = false;
    for (const TensorView& w : ws) want_bf16 = want_bf16 || (w.dtype != DType::F32 && w.ne[1] > 0);
    CudaBuffer xb;  // back to the cache on return; later users are ordered after the GEMMs
    if (want_bf16) {
      DS_ASSIGN_OR_RETURN(xb, CudaBuffer::allocate(device, 2 * k * n_tokens));
      DS_CUDA_TRY(f32_to_bf16_launch(x.as<float>(), x.nb[1] / 4, n_tokens, k, xb.data(), cs),
                  "matmul_many x {}: to bf16", x.shape_string());
    }
    for (size_t i = 0; i < ws.size(); ++i) {
      if (ws[i].ne[1] == 0) continue;
      DS_TRY(matmul_gemm(ws[i], x, ys[i], device, cs, xb.data()).with_context(fmt::format("matmul_many product {}", i)));
    }
    return Status::ok();
  }
  if (path != MatmulPath::kMatvec || n_tokens > kMatvecQ8MaxTokens) {  // no shared q8 activations
    for (size_t i = 0; i < ws.size(); ++i) {
      DS_TRY(matmul_on(ws[i], x, ys[i], device, stream, path).with_context(fmt::format("matmul_many product {}", i)));
    }
    return Status::ok();
  }
  // The weights the q8 kernel takes share one quantized copy of x, those the tensor-core kernel takes
  // one packed copy; the rest (F32 / F16 / BF16, misaligned rows) run matmul_on with F32 activations.
  // Each product's kind, decided once.
  enum class Kind : uint8_t { kEmpty, kMma, kQ8, kOther };
  std::vector<Kind> kinds(ws.size());
  bool any_q8 = false;
  for (size_t i = 0; i < ws.size(); ++i) {
    const MatvecLaunch li = matvec_args(ws[i], x, ys[i], nullptr, 0);
    kinds[i] = ws[i].ne[1] == 0                             ? Kind::kEmpty
               : mma_applies_with_scratch(ws[i].dtype, li) ? Kind::kMma
               : q8_applies_with_scratch(ws[i].dtype, li)  ? Kind::kQ8
                                                           : Kind::kOther;
    any_q8 = any_q8 || kinds[i] == Kind::kQ8;
  }
  auto mma = [&](size_t i) { return kinds[i] == Kind::kMma; };
  auto q8 = [&](size_t i) { return kinds[i] == Kind::kQ8; };
  CudaBuffer packed;  // the tensor-core products' activations, packed at the first of them
  CudaBuffer act;  // back to the cache on return; later users of the block are ordered after this call
  const int64_t act_bytes = any_q8 ? matvec_q8_act_bytes(k, n_tokens) : 0;
  void* act_data = nullptr;
  if (any_q8 && act_in != nullptr) {
    DS_TRY(check_q8_act("matmul_many", *act_in, k, n_tokens).with_context(fmt::format("x {}", x.shape_string())));
    act_data = act_in->data;
  } else if (any_q8) {
    DS_ASSIGN_OR_RETURN(act, quantized_input(x, nullptr, device, cs));
    act_data = act.data();
  }
  // Products whose weights and outputs both follow each other in memory run as one; two such runs of
  // different types next to each other run in one launch where matvec_q8_pair_applies.
  struct Run {
    size_t first, last;
    TensorView w, y;
    MatvecLaunch l;
  };
  std::optional<Run> held;  // a q8 run waiting for the next one, to be launched with it or alone
  auto launch_held = [&]() -> Status {
    if (held) {
      DS_CUDA_TRY(matvec_q8_product_launch(held->w.dtype, held->l, cs), "matmul_many products {}..{}: {} (matvec_q8)",
                  held->first, held->last, shapes(held->w, x, held->y));
      held.reset();
    }
    return Status::ok();
  };
  for (size_t i = 0; i < ws.size();) {
    if (kinds[i] == Kind::kEmpty) {
      ++i;
      continue;
    }
    if (mma(i)) {
      DS_TRY(launch_held());
      if (packed.data() == nullptr) {
        DS_ASSIGN_OR_RETURN(packed, packed_input(x, nullptr, device, cs));
      }
      // The tensor-core products whose weights follow in memory run as one launch with an output per
      // product (each as its own launch gives it: matvec_mma_product_launch's conditions).
      MatvecLaunch l = matvec_args(ws[i], x, ys[i], packed.data(), packed.bytes());
      MatvecMmaPart more[kMatvecMmaMaxParts - 1];
      int n_more = 0;
      const bool wide = ws[i].ne[1] >= kMatvecMmaWideRows;
      size_t j = i + 1;
      for (; j < ws.size() && n_more + 1 < kMatvecMmaMaxParts && l.n_rows % kMatvecMmaPartRows == 0 && mma(j) &&
             weights_follow(ws[j - 1], ws[j]) && (ws[j].ne[1] >= kMatvecMmaWideRows) == wide;
           ++j) {
        more[n_more++] = MatvecMmaPart{l.n_rows, ys[j].as<float>(), ys[j].nb[1] / 4};
        l.n_rows += ws[j].ne[1];
      }
      DS_CUDA_TRY(matvec_mma_product_launch(ws[i].dtype, l, cs, more, n_more),
                  "matmul_many products {}..{}: {} (matvec_mma)", i, j - 1, shapes(ws[i], x, ys[i]));
      i = j;
      continue;
    }
    if (!q8(i)) {
      DS_TRY(launch_held());
      DS_TRY(matmul_on(ws[i], x, ys[i], device, stream, path).with_context(fmt::format("matmul_many product {}", i)));
      ++i;
      continue;
    }
    Run r{i, i, ws[i], ys[i], {}};
    size_t j = i + 1;
    for (; j < ws.size() && q8(j) && rows_follow(ws[j - 1], ys[j - 1], ws[j], ys[j], n_tokens); ++j) {
      r.w.ne[1] += ws[j].ne[1];
      r.y.ne[0] += ys[j].ne[0];
    }
    r.last = j - 1;
    r.l = matvec_args(r.w, x, r.y, act_data, act_bytes);
    i = j;
    if (held && matvec_q8_pair_applies(held->w.dtype, held->l, r.w.dtype, r.l)) {
      DS_CUDA_TRY(matvec_q8_pair_launch(held->w.dtype, held->l, r.w.dtype, r.l, cs),
                  "matmul_many products {}..{} and {}..{}: {} and {} (matvec_q8_pair)", held->first, held->last, r.first,
                  r.last, shapes(held->w, x, held->y), shapes(r.w, x, r.y));
      held.reset();
      continue;
    }
    DS_TRY(launch_held());
    held = r;
  }
  return launch_held();
}

Status matmul_swiglu_on(const TensorView& w, const TensorView& gate, const TensorView& up, const TensorView& y,
                        int device, void* stream, MatmulPath path) {
  DS_TRY(check_args(w, gate, y, device).with_context("matmul_swiglu"));
  if (up.device != gate.device || up.dtype != DType::F32 || up.ne != gate.ne || !up.is_contiguous() ||
      !gate.is_contiguous()) {
    return invalid_argument("matmul_swiglu: up {} on {} and gate {} on {} must be contiguous F32 of one shape",
                            up.shape_string(), up.device.to_string(), gate.shape_string(), gate.device.to_string());
  }
  const int64_t k = gate.ne[0], n_tokens = gate.ne[1];
  if (n_tokens == 0 || w.ne[1] == 0) return Status::ok();
  DeviceGuard guard(device);
  auto cs = static_cast<cudaStream_t>(stream);
  path = resolve_path(path, n_tokens);
  if (path == MatmulPath::kMatvec && n_tokens <= kMatvecQ8MaxTokens) {
    MatvecLaunch l = matvec_args(w, gate, y, nullptr, 0);
    if (mma_applies_with_scratch(w.dtype, l)) {
      DS_ASSIGN_OR_RETURN(CudaBuffer act, packed_input(gate, &up, device, cs));
      l.act = act.data();
      l.act_bytes = act.bytes();
      DS_CUDA_TRY(matvec_mma_product_launch(w.dtype, l, cs), "matmul_swiglu {} (matvec_mma)", shapes(w, gate, y));
      return Status::ok();
    }
    if (q8_applies_with_scratch(w.dtype, l)) {
      DS_ASSIGN_OR_RETURN(CudaBuffer act, quantized_input(gate, &up, device, cs));
      l.act = act.data();
      l.act_bytes = act.bytes();
      DS_CUDA_TRY(matvec_q8_product_launch(w.dtype, l, cs), "matmul_swiglu {} (matvec_q8)", shapes(w, gate, y));
      return Status::ok();  // act returns to the cache; later users are ordered after the product
    }
  }
  // gate = silu(gate) * up, then the plain product.
  DS_CUDA_TRY(eltwise_launch(EltKind::kSwiglu, gate.as<float>(), up.as<float>(), gate.as<float>(), k * n_tokens, k,
                             false, cs),
              "matmul_swiglu {}: swiglu", shapes(w, gate, y));
  return matmul_on(w, gate, y, device, stream, path).with_context("matmul_swiglu");
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
