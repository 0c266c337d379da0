// DeviceBuffer: an owning allocation on one device, and the allocator behind it. This is the only
// place raw memory is allocated for tensors; it counts live bytes and the high-water mark per device.
// device_copy / device_copy_regions / device_zero are the synchronous byte moves that state and model
// code use wherever they touch memory that may live on a device (snapshots, fork, reset, weight upload
// checks); device_copy is a batch of one region.
// Non-obvious choices: CPU buffers are 64-byte aligned (one cache line, one AVX-512 vector), advised to
// huge pages when large, and not zeroed unless asked, so large scratch buffers cost nothing until
// touched. device_copy and
// device_zero synchronize every CUDA device they touch before and after the move, so they are
// ordered with work on any stream (the model's stream is non-blocking): correct anywhere, meant for
// set-up and state management, not for the per-token hot path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

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

// Copies `bytes` from src (on src_dev) to dst (on dst_dev); returns when the bytes are in place.
// CPU <-> CPU is a memcpy. kUnsupported for a device without a backend in this build.
Status device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, int64_t bytes);
// Sets `bytes` bytes at p (on device d) to zero; returns when done.
Status device_zero(void* p, Device d, int64_t bytes);

// One piece of a batched copy: `bytes` from src to dst.
struct CopyRegion {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t bytes = 0;
};
// Copies every region from src_dev to dst_dev (regions must not overlap one another); returns when
// all are in place. Ordered with every stream as device_copy is, at one synchronization per batch: on
// CUDA, host regions move through a pair of page-locked staging buffers (the transfer of one
// overlapping the host's copies of the other), and regions adjacent on the device move together in
// one transfer, so a snapshot of thousands of KV pieces costs about its bytes over the host link.
Status device_copy_regions(Device dst_dev, Device src_dev, std::span<const CopyRegion> regions);

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

// HostBuffer: host memory that a device's stream can copy into without staging: page-locked for a
// CUDA device (so a copy into it is asynchronous and can be captured in a graph), 64-byte aligned
// ordinary memory for the CPU, or when the system refuses to lock more pages (pinned() tells which).
// For small per-sequence buffers (a sequence's last logits), not tensors: not counted by allocator_stats.
// Non-obvious choice: page-locked blocks are recycled by size, never unlocked (cuda::host_pinned_free):
// a graph that copied into one stays valid for the next buffer at that address.
class HostBuffer {
 public:
  HostBuffer() = default;
  static Result<HostBuffer> alloc(Device for_device, int64_t bytes, bool zero = false);
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void release();
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  bool pinned_ = false;
};

}  // namespace ds
