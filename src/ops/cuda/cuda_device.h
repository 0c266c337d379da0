// CUDA device runtime for the ops: device discovery, a per-device caching allocator, owning device and
// pinned buffers, streams and events. Compiles without CUDA (handles are opaque pointers); the
// definitions exist only in builds with DS_HAVE_CUDA.
// Non-obvious choice: freed device blocks go back to the cache at once, with no event; that is
// correct for work ordered on one stream per device (the model's), and cross-stream users synchronize.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <span>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/device_buffer.h"

namespace ds::cuda {

// Number of usable CUDA devices; 0 when the driver or the device is missing (never an error).
int device_count();

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int64_t total_bytes = 0;
  int64_t l2_bytes = 0;
  int cc_major = 0, cc_minor = 0;
};
Result<DeviceInfo> device_info(int device);

// A sticky CUDA error (illegal address, launch failure, ECC) leaves the context unusable: the device is
// marked and every later op on it fails fast with this status instead of computing on garbage.
bool device_usable(int device);
Status device_status(int device);
void device_mark_unusable(int device, const std::string& why);

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// One per device. Sizes under 1 MiB round up to 512 bytes, larger ones to 2 MiB; a cached block is
// reused for a request of at least half its size. Allocation failure frees the cache and retries once.
class DeviceAllocator {
 public:
  struct Stats {
    int64_t in_use_bytes = 0;         // handed out now (rounded sizes)
    int64_t reserved_bytes = 0;       // obtained from cudaMalloc and not yet returned
    int64_t peak_in_use_bytes = 0;    // high-water mark of in_use_bytes
    int64_t peak_reserved_bytes = 0;  // high-water mark of reserved_bytes
    int64_t n_device_allocs = 0;      // cudaMalloc calls made
  };

  static DeviceAllocator& for_device(int device);

  Result<void*> allocate(int64_t bytes);
  void release(void* ptr);  // ptr must come from allocate() of this allocator
  // The end of the live block (one cudaMalloc allocation) that holds p, or null when none does. One
  // device copy may span only one allocation.
  const void* live_block_end(const void* p) const;
  Status trim();            // returns every cached block to the driver
  Stats stats() const;
  void reset_peaks();
  int device() const { return device_; }

  static int64_t round_size(int64_t bytes);

 private:
  explicit DeviceAllocator(int device) : device_(device) {}
  Status free_cached_locked();

  int device_;
  mutable std::mutex mutex_;              // guards everything below
  std::map<void*, int64_t> live_;         // block -> rounded bytes
  std::multimap<int64_t, void*> cached_;  // rounded bytes -> free block
  Stats stats_;
};

// Owns device memory from the device's caching allocator.
class CudaBuffer {
 public:
  CudaBuffer() = default;
  static Result<CudaBuffer> allocate(int device, int64_t bytes);
  ~CudaBuffer() { reset(); }
  CudaBuffer(CudaBuffer&& o) noexcept { *this = std::move(o); }
  CudaBuffer& operator=(CudaBuffer&& o) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  int device() const { return device_; }
  void reset();
  // A contiguous view of the buffer's start; the caller keeps it within bytes().
  TensorView view(DType dtype, std::initializer_list<int64_t> ne) const;

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  int device_ = 0;
};

// A device buffer of `bytes` owned by (device, stream, key) for the life of the process, zeroed on the
// stream when created: state that every kernel on that stream leaves as it found it (the MoE routing
// kernel's last-CTA counter). Created at the first call for
// the triple, which must not be inside a stream capture (an error then); a later call asking for more
// bytes than the first is an error.
Result<void*> stream_resident_buffer(int device, void* stream, const char* key, int64_t bytes);

// Owns page-locked host memory (staging for asynchronous copies).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> allocate(int64_t bytes);
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  void reset();

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Owns a non-blocking CUDA stream on one device.
class Stream {
 public:
  Stream() = default;
  static Result<Stream> create(int device);
  ~Stream() { reset(); }
  Stream(Stream&& o) noexcept { *this = std::move(o); }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void* handle() const { return handle_; }  // a cudaStream_t
  int device() const { return device_; }
  Status synchronize() const;
  void reset();

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

// Owns a CUDA event (timing enabled).
class Event {
 public:
  Event() = default;
  static Result<Event> create(int device);
  ~Event() { reset(); }
  Event(Event&& o) noexcept { *this = std::move(o); }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Status record(const Stream& stream);
  Status synchronize() const;
  // Milliseconds between two recorded, completed events.
  static Result<float> elapsed_ms(const Event& start, const Event& end);
  void reset();

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

// For the ops layer's DeviceBuffer: memory from the device's caching allocator, zeroed when asked
// (with a device synchronization: allocation is set-up work, not a hot path).
Result<void*> buffer_alloc(int device, int64_t bytes, bool zero);
void buffer_free(int device, void* ptr);

// For the ops layer's HostBuffer: page-locked host memory, portable (locked for every device's
// context), or null when the system refuses to lock more. Freed blocks go back to a cache by size and
// are never unlocked, as device memory never goes back to the driver: a captured graph keyed on the
// address may still copy into one, and a copy into pages unlocked and locked again faults.
void* host_pinned_alloc(int64_t bytes);
void host_pinned_free(void* ptr, int64_t bytes);

// For the ops layer's device_copy_regions (cuda_transfer.cpp): host <-> device regions through the
// device's two page-locked staging buffers, device <-> device regions as merged asynchronous copies;
// returns when every region is in place.
Status copy_regions(Device dst_dev, Device src_dev, std::span<const CopyRegion> regions);

// Asynchronous copies and fills on `stream` (host memory should be pinned for overlap).
Status copy_to_device(void* dst, const void* src, int64_t bytes, const Stream& stream);
Status copy_to_host(void* dst, const void* src, int64_t bytes, const Stream& stream);
Status fill_bytes(void* dst, uint8_t value, int64_t bytes, const Stream& stream);

}  // namespace ds::cuda
