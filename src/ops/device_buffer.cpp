// DeviceBuffer and the CPU allocator: aligned allocation with live / peak byte counters; HostBuffer
// (page-locked where a CUDA device copies into it); the synchronous byte moves: copies as batches of
// regions (CPU memmoves, or cuda::copy_regions), the fill between two device synchronizations (so it
// is ordered with every stream).
#include "ops/device_buffer.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/check.h"
#include "core/host_memory.h"
#include "core/thread_pool.h"
#ifdef DS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"
#endif

namespace ds {
namespace {

constexpr size_t kCpuAlign = 64;

struct Counters {
  std::atomic<int64_t> live{0}, peak{0}, n{0};
};
Counters& cpu_counters() {
  static Counters c;
  return c;
}

void count_alloc(Counters& c, int64_t bytes) {
  const int64_t live = c.live.fetch_add(bytes) + bytes;
  int64_t peak = c.peak.load();
  while (live > peak && !c.peak.compare_exchange_weak(peak, live)) {
  }
  c.n.fetch_add(1);
}

#ifdef DS_HAVE_CUDA
// Waits for all work on a CUDA device (every stream), so a legacy-stream copy is ordered after it.
Status cuda_sync(Device d, const char* what, int64_t bytes) {
  cuda::DeviceGuard guard(d.index);
  DS_CUDA_TRY(cudaDeviceSynchronize(), "{} {} bytes on {}", what, bytes, d.to_string());
  return Status::ok();
}
#endif

}  // namespace

Status device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, int64_t bytes) {
  if (bytes < 0) return invalid_argument("device_copy: negative size {}", bytes);
  if (bytes == 0) return Status::ok();
  DS_CHECK(dst != nullptr && src != nullptr, "device_copy of {} bytes with a null pointer", bytes);
  const CopyRegion region{dst, src, bytes};
  return device_copy_regions(dst_dev, src_dev, std::span<const CopyRegion>(&region, 1));
}

Status device_copy_regions(Device dst_dev, Device src_dev, std::span<const CopyRegion> regions) {
  for (const CopyRegion& r : regions) {
    if (r.bytes < 0) return invalid_argument("device_copy_regions: negative size {}", r.bytes);
    DS_CHECK(r.bytes == 0 || (r.dst != nullptr && r.src != nullptr), "device_copy_regions: {} bytes with a null pointer",
             r.bytes);
  }
  if (regions.empty()) return Status::ok();
  if (dst_dev.kind == DeviceKind::kCpu && src_dev.kind == DeviceKind::kCpu) {
    host_parallel_for(static_cast<int64_t>(regions.size()), [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) {
        const CopyRegion& r = regions[static_cast<size_t>(i)];
        if (r.bytes > 0) std::memmove(r.dst, r.src, static_cast<size_t>(r.bytes));
      }
    });
    return Status::ok();
  }
#ifdef DS_HAVE_CUDA
  const bool dst_ok = dst_dev.kind == DeviceKind::kCuda || dst_dev.kind == DeviceKind::kCpu;
  const bool src_ok = src_dev.kind == DeviceKind::kCuda || src_dev.kind == DeviceKind::kCpu;
  if (dst_ok && src_ok) return cuda::copy_regions(dst_dev, src_dev, regions);
#endif
  return unsupported("device_copy_regions: {} -> {} has no backend in this build", src_dev.to_string(),
                     dst_dev.to_string());
}

Status device_zero(void* p, Device d, int64_t bytes) {
  if (bytes < 0) return invalid_argument("device_zero: negative size {}", bytes);
  if (bytes == 0) return Status::ok();
  DS_CHECK(p != nullptr, "device_zero of {} bytes at a null pointer", bytes);
  if (d.kind == DeviceKind::kCpu) {
    std::memset(p, 0, static_cast<size_t>(bytes));
    return Status::ok();
  }
#ifdef DS_HAVE_CUDA
  if (d.kind == DeviceKind::kCuda) {
    DS_TRY(cuda::device_status(d.index));
    DS_TRY(cuda_sync(d, "device_zero", bytes));
    cuda::DeviceGuard guard(d.index);
    DS_CUDA_TRY(cudaMemset(p, 0, static_cast<size_t>(bytes)), "device_zero {} bytes on {}", bytes, d.to_string());
    DS_TRY(cuda_sync(d, "device_zero", bytes));
    return Status::ok();
  }
#endif
  return unsupported("device_zero: {} has no backend in this build", d.to_string());
}

AllocatorStats allocator_stats(Device device) {
#ifdef DS_HAVE_CUDA
  if (device.kind == DeviceKind::kCuda) {
    const auto s = cuda::DeviceAllocator::for_device(device.index).stats();
    return {s.in_use_bytes, s.peak_in_use_bytes, s.n_device_allocs};
  }
#endif
  if (device.kind != DeviceKind::kCpu) return {};
  Counters& c = cpu_counters();
  return {c.live.load(), c.peak.load(), c.n.load()};
}

void allocator_reset_peak(Device device) {
#ifdef DS_HAVE_CUDA
  if (device.kind == DeviceKind::kCuda) {
    cuda::DeviceAllocator::for_device(device.index).reset_peaks();
    return;
  }
#endif
  if (device.kind != DeviceKind::kCpu) return;
  cpu_counters().peak.store(cpu_counters().live.load());
}

Result<DeviceBuffer> DeviceBuffer::alloc(Device device, int64_t bytes, bool zero) {
  if (bytes < 0) return invalid_argument("alloc: negative size {}", bytes);
#ifdef DS_HAVE_CUDA
  if (device.kind == DeviceKind::kCuda) {
    DeviceBuffer b;
    b.device_ = device;
    if (bytes == 0) return b;
    DS_ASSIGN_OR_RETURN(b.data_, cuda::buffer_alloc(device.index, bytes, zero));
    b.bytes_ = bytes;
    return b;
  }
#endif
  if (device.kind != DeviceKind::kCpu) return unsupported("alloc: no allocator for {} in this build", device.to_string());
  DeviceBuffer b;
  b.device_ = device;
  if (bytes == 0) return b;
  const size_t rounded = (static_cast<size_t>(bytes) + kCpuAlign - 1) / kCpuAlign * kCpuAlign;
  void* p = std::aligned_alloc(kCpuAlign, rounded);
  if (!p) return out_of_memory("alloc: {} bytes on {} failed", bytes, device.to_string());
  advise_huge_pages(p, rounded);  // before the first touch: no page fault per 4 KiB of a large buffer
  if (zero) std::memset(p, 0, rounded);
  b.data_ = p;
  b.bytes_ = bytes;
  count_alloc(cpu_counters(), bytes);
  return b;
}

DeviceBuffer::~DeviceBuffer() { release(); }

void DeviceBuffer::release() {
  if (data_ && device_.kind == DeviceKind::kCuda) {
#ifdef DS_HAVE_CUDA
    cuda::buffer_free(device_.index, data_);
#endif
  } else if (data_) {
    std::free(data_);
    cpu_counters().live.fetch_sub(bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_), device_(o.device_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Result<HostBuffer> HostBuffer::alloc(Device for_device, int64_t bytes, bool zero) {
  if (bytes < 0) return invalid_argument("host alloc: negative size {}", bytes);
  HostBuffer b;
  if (bytes == 0) return b;
  b.bytes_ = bytes;
#ifdef DS_HAVE_CUDA
  if (for_device.kind == DeviceKind::kCuda) {
    b.data_ = cuda::host_pinned_alloc(bytes);  // null: fall back to ordinary memory
    b.pinned_ = b.data_ != nullptr;
  }
#else
  (void)for_device;
#endif
  if (b.data_ == nullptr) {
    b.data_ = std::aligned_alloc(kCpuAlign, (static_cast<size_t>(bytes) + kCpuAlign - 1) / kCpuAlign * kCpuAlign);
    if (b.data_ == nullptr) return out_of_memory("host alloc: {} bytes failed", bytes);
  }
  if (zero) std::memset(b.data_, 0, static_cast<size_t>(bytes));
  return b;
}

HostBuffer::~HostBuffer() { release(); }

void HostBuffer::release() {
#ifdef DS_HAVE_CUDA
  if (data_ && pinned_) cuda::host_pinned_free(data_, bytes_);
#endif
  if (data_ && !pinned_) std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_ = std::exchange(o.pinned_, false);
  }
  return *this;
}

TensorView DeviceBuffer::view(DType dtype, std::initializer_list<int64_t> ne) const {
  TensorView t = TensorView::contiguous(data_, dtype, ne, device_);
  DS_CHECK(t.n_bytes() <= bytes_, "view {} does not fit a buffer of {} bytes", t.shape_string(), bytes_);
  return t;
}

}  // namespace ds
