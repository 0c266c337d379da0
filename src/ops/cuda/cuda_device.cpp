// Host side of the CUDA device runtime (cuda_device.h): error conversion, unusable-device marks, the
// caching allocator and the RAII owners. Compiled by the C++ compiler; empty without DS_HAVE_CUDA.
// Non-obvious choice: cached blocks are matched by size class in a multimap (best fit, at most 2x the
// request), which keeps the few large weight-sized workspaces from fragmenting.
#if DS_HAVE_CUDA

#include "ops/cuda/cuda_device.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/pdl.h"

namespace ds::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kSmallLimit = int64_t{1} << 20;  // bytes; below it round to kSmallRound
constexpr int64_t kSmallRound = 512;
constexpr int64_t kLargeRound = int64_t{2} << 20;

std::array<std::atomic<bool>, kMaxDevices> g_unusable{};
std::mutex g_unusable_mutex;  // guards g_unusable_why
std::array<std::string, kMaxDevices> g_unusable_why;

cudaStream_t as_stream(void* h) { return static_cast<cudaStream_t>(h); }

}  // namespace

bool error_is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

Status cuda_error(cudaError_t e, const char* call, const std::string& context) {
  const std::string msg = fmt::format("cuda: {}: {}: {} ({})", context, call, cudaGetErrorName(e),
                                      cudaGetErrorString(e));
  if (error_is_sticky(e)) {
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) device_mark_unusable(dev, msg);
  } else {
    // Reported here, so the thread's last error must not surface again at the next launch check (a bad
    // device ordinal once failed an unrelated later kernel launch).
    (void)cudaGetLastError();
  }
  if (e == cudaErrorMemoryAllocation) return Status(StatusCode::kOutOfMemory, msg);
  return Status(StatusCode::kInternal, msg);
}

Status cublas_error(cublasStatus_t s, const char* call, const std::string& context) {
  const std::string msg = fmt::format("cublas: {}: {}: {}", context, call, cublasGetStatusName(s));
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return Status(StatusCode::kOutOfMemory, msg);
  return Status(StatusCode::kInternal, msg);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky "no device" error
    return 0;
  }
  return n;
}

Result<DeviceInfo> device_info(int device) {
  cudaDeviceProp p{};
  DS_CUDA_TRY(cudaGetDeviceProperties(&p, device), "device_info cuda:{}", device);
  DeviceInfo info;
  info.name = p.name;
  info.sm_count = p.multiProcessorCount;
  info.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
  info.l2_bytes = p.l2CacheSize;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  return info;
}

namespace {
std::atomic<long long> g_smem_optin_cap{0};
}  // namespace

DeviceSmem current_device_smem() {
  static std::array<DeviceSmem, kMaxDevices> known{};
  static std::array<std::once_flag, kMaxDevices> once;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return {};
  std::call_once(once[static_cast<size_t>(dev)], [dev] {
    int per_sm = 0, reserved = 0, optin = 0;
    if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess) {
      known[static_cast<size_t>(dev)] = DeviceSmem{per_sm, reserved, optin};
    }
  });
  return known[static_cast<size_t>(dev)];
}

long long smem_optin_limit() {
  const long long v = current_device_smem().optin_per_cta;
  const long long cap = g_smem_optin_cap.load(std::memory_order_relaxed);
  return v > 0 && cap > 0 && cap < v ? cap : v;
}

void set_smem_optin_cap(long long bytes) { g_smem_optin_cap.store(bytes > 0 ? bytes : 0, std::memory_order_relaxed); }

bool cluster_launch_enabled() {
  static std::array<std::atomic<int>, kMaxDevices> known{};  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  int v = known[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0;
    v = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
                device_code_ptx_version() >= 90
            ? 2
            : 1;
    known[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

bool pdl_enabled() {
  static const bool env_off = [] {
    const char* e = std::getenv("DELTASERVE_PDL");
    return e != nullptr && std::string_view(e) == "0";
  }();
  // PDL needs what clusters need: an sm_90 device and device code that waits (launch.cuh).
  return !env_off && cluster_launch_enabled();
}

namespace {

struct KernelFilter {
  std::atomic<bool> active{false};
  std::mutex mu;  // guards the rest
  std::vector<std::string> skip, only;
  std::map<const void*, bool> decided;  // kernel -> filtered
};

KernelFilter& kernel_filter() {
  static auto* f = new KernelFilter();  // never freed: launches may run during static destruction
  return *f;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace

void set_kernel_filter(const std::string& skip, const std::string& only) {
  KernelFilter& f = kernel_filter();
  std::lock_guard<std::mutex> lock(f.mu);
  f.skip = split_commas(skip);
  f.only = split_commas(only);
  f.decided.clear();
  f.active.store(!f.skip.empty() || !f.only.empty(), std::memory_order_release);
}

bool kernel_filtered(const void* kernel) {
  KernelFilter& f = kernel_filter();
  if (!f.active.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(f.mu);
  if (const auto it = f.decided.find(kernel); it != f.decided.end()) return it->second;
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) != cudaSuccess || name == nullptr) {
    (void)cudaGetLastError();
    name = "";
  }
  const std::string_view n(name);
  const auto any = [&](const std::vector<std::string>& subs) {
    for (const std::string& sub : subs) {
      if (n.find(sub) != std::string_view::npos) return true;
    }
    return false;
  };
  const bool drop = any(f.skip) || (!f.only.empty() && !any(f.only));
  f.decided.emplace(kernel, drop);
  return drop;
}

bool device_usable(int device) {
  DS_CHECK(device >= 0 && device < kMaxDevices, "device index {}", device);
  return !g_unusable[device].load(std::memory_order_acquire);
}

Status device_status(int device) {
  if (device_usable(device)) return Status::ok();
  std::lock_guard<std::mutex> lock(g_unusable_mutex);
  return internal_error("cuda:{} is unusable after an earlier error: {}", device, g_unusable_why[device]);
}

void device_mark_unusable(int device, const std::string& why) {
  DS_CHECK(device >= 0 && device < kMaxDevices, "device index {}", device);
  {
    std::lock_guard<std::mutex> lock(g_unusable_mutex);
    if (g_unusable_why[device].empty()) g_unusable_why[device] = why;
  }
  if (!g_unusable[device].exchange(true)) DS_LOG_ERROR("cuda:{} marked unusable: {}", device, why);
}

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != device) (void)cudaSetDevice(device);
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

// ---- allocator ----

DeviceAllocator& DeviceAllocator::for_device(int device) {
  DS_CHECK(device >= 0 && device < kMaxDevices, "device index {}", device);
  static std::mutex m;
  static std::array<DeviceAllocator*, kMaxDevices> allocators{};
  std::lock_guard<std::mutex> lock(m);
  if (!allocators[device]) allocators[device] = new DeviceAllocator(device);  // lives for the process
  return *allocators[device];
}

int64_t DeviceAllocator::round_size(int64_t bytes) {
  if (bytes <= 0) return kSmallRound;
  const int64_t r = bytes < kSmallLimit ? kSmallRound : kLargeRound;
  return (bytes + r - 1) / r * r;
}

Result<void*> DeviceAllocator::allocate(int64_t bytes) {
  DS_TRY(device_status(device_));
  if (bytes < 0) return invalid_argument("cuda:{} allocate: negative size {}", device_, bytes);
  const int64_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cached_.lower_bound(size);
  void* ptr = nullptr;
  int64_t got = 0;
  if (it != cached_.end() && it->first <= 2 * size) {
    ptr = it->second;
    got = it->first;
    cached_.erase(it);
  } else {
    DeviceGuard guard(device_);
    cudaError_t e = cudaMalloc(&ptr, static_cast<size_t>(size));
    if (e == cudaErrorMemoryAllocation && !cached_.empty()) {
      (void)cudaGetLastError();
      DS_TRY(free_cached_locked());
      e = cudaMalloc(&ptr, static_cast<size_t>(size));
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      const Status s = cuda_error(e, "cudaMalloc",
                                  fmt::format("cuda:{} allocate {} bytes ({} in use, {} reserved)", device_,
                                              size, stats_.in_use_bytes, stats_.reserved_bytes));
      return s;
    }
    got = size;
    stats_.reserved_bytes += size;
    stats_.n_device_allocs++;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  }
  live_.emplace(ptr, got);
  stats_.in_use_bytes += got;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return ptr;
}

const void* DeviceAllocator::live_block_end(const void* p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(const_cast<void*>(p));
  if (it == live_.begin()) return nullptr;
  --it;
  const auto* end = static_cast<const uint8_t*>(it->first) + it->second;
  return p < end ? end : nullptr;
}

void DeviceAllocator::release(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  DS_CHECK(it != live_.end(), "cuda:{} release of a block this allocator does not own", device_);
  stats_.in_use_bytes -= it->second;
  cached_.emplace(it->second, ptr);
  live_.erase(it);
}

Status DeviceAllocator::free_cached_locked() {
  DeviceGuard guard(device_);
  for (auto& [size, ptr] : cached_) {
    const cudaError_t e = cudaFree(ptr);
    stats_.reserved_bytes -= size;
    if (e != cudaSuccess) {
      cached_.clear();
      return cuda_error(e, "cudaFree", fmt::format("cuda:{} trim", device_));
    }
  }
  cached_.clear();
  return Status::ok();
}

Status DeviceAllocator::trim() {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_cached_locked();
}

DeviceAllocator::Stats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void DeviceAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

// ---- owners ----

Result<CudaBuffer> CudaBuffer::allocate(int device, int64_t bytes) {
  DS_ASSIGN_OR_RETURN(void* p, DeviceAllocator::for_device(device).allocate(bytes));
  CudaBuffer b;
  b.data_ = p;
  b.bytes_ = bytes;
  b.device_ = device;
  return b;
}

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void CudaBuffer::reset() {
  if (data_) DeviceAllocator::for_device(device_).release(data_);
  data_ = nullptr;
  bytes_ = 0;
}

TensorView CudaBuffer::view(DType dtype, std::initializer_list<int64_t> ne) const {
  TensorView v = TensorView::contiguous(data_, dtype, ne, Device{DeviceKind::kCuda, device_});
  DS_CHECK(v.n_bytes() <= bytes_, "view {} exceeds buffer of {} bytes", v.shape_string(), bytes_);
  return v;
}

Result<void*> stream_resident_buffer(int device, void* stream, const char* key, int64_t bytes) {
  struct Entry {
    CudaBuffer buf;
    int64_t bytes;
  };
  static std::mutex mu;
  static auto* buffers = new std::map<std::tuple<int, void*, std::string>, Entry>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  const auto id = std::make_tuple(device, stream, std::string(key));
  if (const auto it = buffers->find(id); it != buffers->end()) {
    if (bytes > it->second.bytes) {
      return internal_error("stream buffer {} on cuda:{}: {} bytes asked, {} created", key, device, bytes,
                            it->second.bytes);
    }
    return it->second.buf.data();
  }
  const auto s = as_stream(stream);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DS_CUDA_TRY(cudaStreamIsCapturing(s, &capturing), "stream buffer {} on cuda:{}", key, device);
  if (capturing != cudaStreamCaptureStatusNone) {
    return internal_error("stream buffer {} on cuda:{}: the first use on a stream must not be captured", key,
                               device);
  }
  DS_ASSIGN_OR_RETURN(CudaBuffer b, CudaBuffer::allocate(device, bytes));
  DS_CUDA_TRY(cudaMemsetAsync(b.data(), 0, static_cast<size_t>(bytes), s), "stream buffer {} on cuda:{}: zero", key,
              device);
  void* p = b.data();
  buffers->emplace(id, Entry{std::move(b), bytes});
  return p;
}

Result<PinnedBuffer> PinnedBuffer::allocate(int64_t bytes) {
  void* p = nullptr;
  DS_CUDA_TRY(cudaHostAlloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault),
              "pinned allocate {} bytes", bytes);
  PinnedBuffer b;
  b.data_ = p;
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void PinnedBuffer::reset() {
  if (data_) (void)cudaFreeHost(data_);
  data_ = nullptr;
  bytes_ = 0;
}

Result<Stream> Stream::create(int device) {
  DS_TRY(device_status(device));
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  DS_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream create cuda:{}", device);
  Stream out;
  out.handle_ = s;
  out.device_ = device;
  return out;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    reset();
    handle_ = o.handle_;
    device_ = o.device_;
    o.handle_ = nullptr;
  }
  return *this;
}

Status Stream::synchronize() const {
  DS_CUDA_TRY(cudaStreamSynchronize(as_stream(handle_)), "stream synchronize cuda:{}", device_);
  return Status::ok();
}

void Stream::reset() {
  if (handle_) {
    DeviceGuard guard(device_);
    (void)cudaStreamDestroy(as_stream(handle_));
  }
  handle_ = nullptr;
}

Result<Event> Event::create(int device) {
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  DS_CUDA_TRY(cudaEventCreate(&e), "event create cuda:{}", device);
  Event out;
  out.handle_ = e;
  out.device_ = device;
  return out;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    reset();
    handle_ = o.handle_;
    device_ = o.device_;
    o.handle_ = nullptr;
  }
  return *this;
}

Status Event::record(const Stream& stream) {
  DS_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(handle_), as_stream(stream.handle())),
              "event record cuda:{}", device_);
  return Status::ok();
}

Status Event::synchronize() const {
  DS_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), "event synchronize cuda:{}", device_);
  return Status::ok();
}

Result<float> Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  DS_CUDA_TRY(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_),
                                   static_cast<cudaEvent_t>(end.handle_)),
              "event elapsed cuda:{}", start.device_);
  return ms;
}

void Event::reset() {
  if (handle_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
  handle_ = nullptr;
}

Result<void*> buffer_alloc(int device, int64_t bytes, bool zero) {
  DS_ASSIGN_OR_RETURN(void* p, DeviceAllocator::for_device(device).allocate(bytes));
  if (zero && bytes > 0) {
    DeviceGuard guard(device);
    cudaError_t e = cudaMemset(p, 0, static_cast<size_t>(bytes));
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      DeviceAllocator::for_device(device).release(p);
      return cuda_error(e, "cudaMemset", fmt::format("cuda:{} zero {} bytes", device, bytes));
    }
  }
  return p;
}

void buffer_free(int device, void* ptr) { DeviceAllocator::for_device(device).release(ptr); }

namespace {
struct PinnedCache {
  std::mutex mu;
  std::unordered_map<int64_t, std::vector<void*>> free;  // by size
};
PinnedCache& pinned_cache() {
  static auto* c = new PinnedCache;  // never destroyed: buffers may be released during exit
  return *c;
}
}  // namespace

void* host_pinned_alloc(int64_t bytes) {
  PinnedCache& c = pinned_cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free.find(bytes);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
  }
  void* p = nullptr;
  if (cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // a refused lock is not sticky
    return nullptr;
  }
  return p;
}

void host_pinned_free(void* ptr, int64_t bytes) {
  PinnedCache& c = pinned_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.free[bytes].push_back(ptr);
}

Status copy_to_device(void* dst, const void* src, int64_t bytes, const Stream& stream) {
  DS_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                              as_stream(stream.handle())),
              "copy_to_device {} bytes", bytes);
  return Status::ok();
}

Status copy_to_host(void* dst, const void* src, int64_t bytes, const Stream& stream) {
  DS_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                              as_stream(stream.handle())),
              "copy_to_host {} bytes", bytes);
  return Status::ok();
}

Status fill_bytes(void* dst, uint8_t value, int64_t bytes, const Stream& stream) {
  DS_CUDA_TRY(cudaMemsetAsync(dst, value, static_cast<size_t>(bytes), as_stream(stream.handle())),
              "fill {} bytes", bytes);
  return Status::ok();
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
