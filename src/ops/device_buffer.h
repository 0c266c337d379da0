// DeviceBuffer: an owning allocation on one device, and the allocator behind it. This is the only
// place raw memory is allocated for tensors; it counts live bytes and the high-water mark per device.
// Non-obvious choice: CPU buffers are 64-byte aligned (one cache line, one AVX-512 vector) and are
// not zeroed unless asked, so large scratch buffers cost nothing until touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/status.h"
#include "core/tensor.h"

namespace ds {

struct AllocatorStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;   // high-water mark since start (or the last reset)
  int64_t n_allocs = 0;
};

// Stats of the allocator of `device`; reset_peak sets peak to the current live bytes.
AllocatorStats allocator_stats(Device device);
void allocator_reset_peak(Device device);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` on `device` (zeroed when `zero`). kOutOfMemory on failure, kUnsupported for
  // devices without a backend in this build.
  static Result<DeviceBuffer> alloc(Device device, int64_t bytes, bool zero = false);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool empty() const { return data_ == nullptr; }
  // A contiguous view of the start of the buffer; DS_CHECKs that it fits.
  TensorView view(DType dtype, std::initializer_list<int64_t> ne) const;

 private:
  void release();
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_{};
};

}  // namespace ds
