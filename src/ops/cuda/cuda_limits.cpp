// Host side of the device-limit measurements (ops/cuda/cuda_limits.h): buffers, stream, events,
// cuBLAS, and the Status for every failure; the kernels are in membw.cu. Empty without DS_HAVE_CUDA.
// Non-obvious choices: the buffers are plain cudaMalloc allocations owned here (not the caching
// allocator) so a measurement leaves the model's memory statistics untouched; each figure is the best
// of several event-timed runs after warm-up, because interference only ever makes a run slower.
#if DS_HAVE_CUDA

#include "ops/cuda/cuda_limits.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"

namespace ds::cuda {
namespace limits_detail {
// Defined in membw.cu.
cudaError_t read_stream_launch(const void* p, int64_t n_vec16, unsigned long long* sink, int sm_count,
                               cudaStream_t s);
cudaError_t fill_bf16_random_launch(void* p, int64_t n, uint32_t seed, cudaStream_t s);
}  // namespace limits_detail

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int kWarmup = 2;
constexpr int kReadReps = 8;
constexpr int kGemmReps = 6;
constexpr int kGemmN = 8192;

// Owns one cudaMalloc allocation for the duration of a measurement.
class ScratchMemory {
 public:
  ScratchMemory() = default;
  ~ScratchMemory() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  ScratchMemory(const ScratchMemory&) = delete;
  ScratchMemory& operator=(const ScratchMemory&) = delete;
  Status allocate(int64_t bytes, const char* what) {
    DS_CUDA_TRY(cudaMalloc(&ptr_, static_cast<size_t>(bytes)), "device limits: {} ({} bytes)", what, bytes);
    return Status::ok();
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// Owns a cuBLAS handle (its workspace is released with it).
class BlasHandle {
 public:
  BlasHandle() = default;
  ~BlasHandle() {
    if (handle_) (void)cublasDestroy(handle_);
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  Status create(int device) {
    DS_CUBLAS_TRY(cublasCreate(&handle_), "measure_bf16_peak_tflops cuda:{}", device);
    return Status::ok();
  }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

Status check_device(int device, const char* what) {
  const int n = device_count();
  if (device < 0 || device >= n) {
    return invalid_argument("{}: cuda:{} does not exist ({} CUDA device(s) visible)", what, device, n);
  }
  return device_status(device);
}

// Best (smallest) milliseconds of `reps` event-timed runs of `launch` on `stream`, after warm-up.
template <typename Launch>
Result<float> best_ms(int device, const Stream& stream, int reps, Launch&& launch) {
  for (int i = 0; i < kWarmup; ++i) DS_TRY(launch());
  DS_ASSIGN_OR_RETURN(Event start, Event::create(device));
  DS_ASSIGN_OR_RETURN(Event end, Event::create(device));
  float best = 0;
  for (int i = 0; i < reps; ++i) {
    DS_TRY(start.record(stream));
    DS_TRY(launch());
    DS_TRY(end.record(stream));
    DS_TRY(end.synchronize());
    DS_ASSIGN_OR_RETURN(float ms, Event::elapsed_ms(start, end));
    if (i == 0 || ms < best) best = ms;
  }
  if (!(best > 0)) return internal_error("device limits cuda:{}: timed run took {} ms", device, best);
  return best;
}

}  // namespace

Result<double> measure_read_bandwidth_gbps(int device) {
  DS_TRY(check_device(device, "measure_read_bandwidth_gbps"));
  DeviceGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  DS_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes), "measure_read_bandwidth_gbps cuda:{}", device);
  const int64_t free_now = static_cast<int64_t>(free_bytes);
  // 2 GiB is > 40x the largest L2 (50 MB on H100); 4 GiB when there is room, as the workbench uses.
  const int64_t slack = kGiB / 4;
  if (free_now < 2 * kGiB + slack) {
    return out_of_memory("measure_read_bandwidth_gbps cuda:{}: needs {} MiB free, {} MiB are", device,
                         (2 * kGiB + slack) >> 20, free_now >> 20);
  }
  const int64_t bytes = free_now >= 8 * kGiB ? 4 * kGiB : 2 * kGiB;
  int sm_count = 0;
  DS_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device),
              "measure_read_bandwidth_gbps cuda:{}", device);
  DS_ASSIGN_OR_RETURN(Stream stream, Stream::create(device));
  const auto s = static_cast<cudaStream_t>(stream.handle());
  ScratchMemory buf, sink;
  DS_TRY(buf.allocate(bytes, "read buffer"));
  DS_TRY(sink.allocate(sizeof(unsigned long long), "sink"));
  DS_CUDA_TRY(cudaMemsetAsync(buf.get(), 0x5A, static_cast<size_t>(bytes), s), "read buffer fill ({} bytes)", bytes);
  DS_CUDA_TRY(cudaMemsetAsync(sink.get(), 0, sizeof(unsigned long long), s), "sink fill");
  auto launch = [&]() -> Status {
    DS_CUDA_TRY(limits_detail::read_stream_launch(buf.get(), bytes / 16, static_cast<unsigned long long*>(sink.get()),
                                                  sm_count, s),
                "read_stream cuda:{} ({} bytes, {} SMs)", device, bytes, sm_count);
    return Status::ok();
  };
  DS_ASSIGN_OR_RETURN(float ms, best_ms(device, stream, kReadReps, launch));
  return static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

Result<double> measure_bf16_peak_tflops(int device) {
  DS_TRY(check_device(device, "measure_bf16_peak_tflops"));
  DeviceGuard guard(device);
  const int n = kGemmN;
  const int64_t nn = int64_t{n} * n;
  DS_ASSIGN_OR_RETURN(Stream stream, Stream::create(device));
  const auto s = static_cast<cudaStream_t>(stream.handle());
  ScratchMemory a, b, c;
  DS_TRY(a.allocate(nn * 2, "gemm A (bf16 8192x8192)"));
  DS_TRY(b.allocate(nn * 2, "gemm B (bf16 8192x8192)"));
  DS_TRY(c.allocate(nn * 4, "gemm C (f32 8192x8192)"));
  DS_CUDA_TRY(limits_detail::fill_bf16_random_launch(a.get(), nn, 1u, s), "fill gemm A cuda:{}", device);
  DS_CUDA_TRY(limits_detail::fill_bf16_random_launch(b.get(), nn, 2u, s), "fill gemm B cuda:{}", device);
  BlasHandle blas;
  DS_TRY(blas.create(device));
  DS_CUBLAS_TRY(cublasSetStream(blas.get(), s), "measure_bf16_peak_tflops cuda:{}", device);
  const float alpha = 1.0f, beta = 0.0f;
  auto launch = [&]() -> Status {
    DS_CUBLAS_TRY(cublasGemmEx(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n, b.get(),
                               CUDA_R_16BF, n, &beta, c.get(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "measure_bf16_peak_tflops cuda:{}: gemm {}x{}x{} bf16 -> f32", device, n, n, n);
    return Status::ok();
  };
  DS_ASSIGN_OR_RETURN(float ms, best_ms(device, stream, kGemmReps, launch));
  return 2.0 * n * static_cast<double>(n) * n / (ms * 1e-3) / 1e12;
}

Result<std::pair<int64_t, int64_t>> device_memory_used(int device) {
  DS_TRY(check_device(device, "device_memory_used"));
  DeviceGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  DS_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes), "device_memory_used cuda:{}", device);
  return std::pair<int64_t, int64_t>{static_cast<int64_t>(total_bytes - free_bytes), static_cast<int64_t>(total_bytes)};
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
