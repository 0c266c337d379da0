// Batched copies between host memory and a CUDA device (cuda::copy_regions, behind the ops layer's
// device_copy_regions): what snapshots, restores and forks move, thousands of KV pieces at a time.
// Host regions pass through two page-locked staging buffers per device on a copy stream of its own:
// while the device fills (or drains) one buffer, the host copies the other out (or in). Pieces adjacent
// on the device and inside one allocation of the device's allocator join one transfer (a copy may not
// span two allocations, even adjacent ones); the host's copies run on several threads (host_parallel_for).
// Compiled by the C++ compiler; empty without DS_HAVE_CUDA.
// Non-obvious choices: the staging buffers are allocated at a device's first batch and kept for the
// process (page-locking is slow, and a batch is a state operation that recurs); a mutex per device
// serializes batches over them. device_copy is a batch of one region, so every byte move of the state
// and model code goes through here. When the system refuses page-locked memory, each region is one
// synchronous cudaMemcpy instead (correct, slower).
#if DS_HAVE_CUDA

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_device.h"

namespace ds::cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kStageBytes = int64_t{32} << 20;  // per staging buffer

struct Stager {
  std::mutex mu;  // one batch at a time over the buffers below
  bool initialized = false;
  bool staged = false;  // false: the page-locked buffers were refused
  Stream stream;        // the device's copy stream
  std::array<uint8_t*, 2> buf{};
  std::array<Event, 2> done;
};

// A device's stager lives as long as the process (never destroyed, as the page-locked blocks it holds
// are never unlocked), so nothing is torn down after the CUDA runtime at exit.
Stager& stager(int device) {
  static std::array<std::atomic<Stager*>, kMaxDevices> stagers{};
  static std::mutex create;
  DS_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {} out of range", device);
  std::atomic<Stager*>& slot = stagers[static_cast<size_t>(device)];
  if (Stager* s = slot.load()) return *s;
  std::lock_guard<std::mutex> lock(create);
  if (slot.load() == nullptr) slot.store(new Stager());
  return *slot.load();
}

// Creates the copy stream, events and staging buffers of `device` on first use.
Status init_locked(Stager& s, int device) {
  if (s.initialized) return Status::ok();
  DS_ASSIGN_OR_RETURN(s.stream, Stream::create(device));
  for (Event& e : s.done) {
    DS_ASSIGN_OR_RETURN(e, Event::create(device));
  }
  s.staged = true;
  for (uint8_t*& b : s.buf) {
    b = static_cast<uint8_t*>(host_pinned_alloc(kStageBytes));
    s.staged = s.staged && b != nullptr;
  }
  s.initialized = true;
  return Status::ok();
}

Status sync_device(int device) {
  DeviceGuard guard(device);
  DS_CUDA_TRY(cudaDeviceSynchronize(), "batched copy: waiting for cuda:{}", device);
  return Status::ok();
}

// One staged batch in one direction. Regions are cut into pieces at buffer boundaries; a piece's bytes
// sit at `off` in its buffer. When a buffer is full its transfers are enqueued, one per run of pieces
// that follow each other on the device inside one allocation; the host copies of a buffer's pieces
// (in before its transfers, out after them) run on several threads while the other buffer's transfers
// are in flight.
class Batch {
 public:
  Batch(Stager& s, bool to_host, int device) : s_(s), to_host_(to_host), device_(device) {}

  Status add(const CopyRegion& r) {
    auto* host = static_cast<uint8_t*>(to_host_ ? r.dst : const_cast<void*>(r.src));
    auto* dev = static_cast<uint8_t*>(to_host_ ? const_cast<void*>(r.src) : r.dst);
    for (int64_t done = 0; done < r.bytes;) {
      if (fill_[h_] == kStageBytes) DS_TRY(flush());
      const int64_t n = std::min(r.bytes - done, kStageBytes - fill_[h_]);
      pieces_[h_].push_back({host + done, dev + done, fill_[h_], n});
      fill_[h_] += n;
      done += n;
    }
    return Status::ok();
  }

  // Sends what is staged and waits for every transfer (and, to the host, every host copy).
  Status finish() {
    DS_TRY(flush());
    DS_TRY(drain(h_ ^ 1));
    DS_TRY(s_.stream.synchronize());
    return Status::ok();
  }

 private:
  struct Piece {
    uint8_t* host;
    uint8_t* dev;
    int64_t off;
    int64_t bytes;
  };

  // Copies buffer k's pieces between the host and the buffer, on several threads.
  void host_copies(int k) {
    const std::vector<Piece>& ps = pieces_[k];
    uint8_t* stage = s_.buf[k];
    const bool out = to_host_;
    host_parallel_for(static_cast<int64_t>(ps.size()), [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) {
        const Piece& p = ps[static_cast<size_t>(i)];
        if (out) {
          std::memcpy(p.host, stage + p.off, static_cast<size_t>(p.bytes));
        } else {
          std::memcpy(stage + p.off, p.host, static_cast<size_t>(p.bytes));
        }
      }
    });
  }

  // Enqueues the current buffer's transfers (to the device, after copying its pieces in) and an
  // event after them, then makes the other buffer current once its own transfers are done.
  Status flush() {
    const std::vector<Piece>& ps = pieces_[h_];
    if (ps.empty()) return Status::ok();
    if (!to_host_) host_copies(h_);
    DeviceAllocator& alloc = DeviceAllocator::for_device(device_);
    for (size_t i = 0; i < ps.size();) {
      uint8_t* dev = ps[i].dev;
      uint8_t* stage = s_.buf[h_] + ps[i].off;
      const auto* block_end = static_cast<const uint8_t*>(alloc.live_block_end(dev));
      int64_t n = ps[i].bytes;
      for (++i; i < ps.size() && block_end != nullptr && ps[i].dev == dev + n && ps[i].off == ps[i - 1].off + ps[i - 1].bytes &&
                dev + n + ps[i].bytes <= block_end;
           ++i) {
        n += ps[i].bytes;
      }
      DS_TRY(to_host_ ? copy_to_host(stage, dev, n, s_.stream) : copy_to_device(dev, stage, n, s_.stream));
    }
    DS_TRY(s_.done[h_].record(s_.stream));
    in_flight_[h_] = true;
    h_ ^= 1;
    return drain(h_);
  }

  // Waits for buffer k's transfers; to the host, copies its pieces out. The buffer is then free.
  Status drain(int k) {
    if (!in_flight_[k]) return Status::ok();
    DS_TRY(s_.done[k].synchronize());
    if (to_host_) host_copies(k);
    pieces_[k].clear();
    fill_[k] = 0;
    in_flight_[k] = false;
    return Status::ok();
  }

  Stager& s_;
  bool to_host_;
  int device_;
  int h_ = 0;  // the buffer being filled
  std::array<int64_t, 2> fill_{};
  std::array<bool, 2> in_flight_{};
  std::array<std::vector<Piece>, 2> pieces_;
};

Status staged_copy(Stager& s, int device, bool to_host, std::span<const CopyRegion> regions) {
  Batch batch(s, to_host, device);
  Status st = Status::ok();
  for (const CopyRegion& r : regions) {
    st = batch.add(r);
    if (!st.is_ok()) break;
  }
  if (st.is_ok()) st = batch.finish();
  // After a failure nothing may still write into (or read from) the buffers the next batch reuses.
  if (!st.is_ok()) (void)s.stream.synchronize();
  return st;
}

}  // namespace

Status copy_regions(Device dst_dev, Device src_dev, std::span<const CopyRegion> regions) {
  const bool dst_cuda = dst_dev.kind == DeviceKind::kCuda, src_cuda = src_dev.kind == DeviceKind::kCuda;
  DS_CHECK(dst_cuda || src_cuda, "copy_regions: neither {} nor {} is a CUDA device", dst_dev.to_string(),
           src_dev.to_string());
  if (src_cuda) DS_TRY(device_status(src_dev.index));
  if (dst_cuda) DS_TRY(device_status(dst_dev.index));
  // Ordered after all work on both devices, as device_copy is.
  if (src_cuda) DS_TRY(sync_device(src_dev.index));
  if (dst_cuda && !(src_cuda && src_dev == dst_dev)) DS_TRY(sync_device(dst_dev.index));
  const int device = src_cuda ? src_dev.index : dst_dev.index;
  DeviceGuard guard(device);
  Stager& s = stager(device);
  std::lock_guard<std::mutex> lock(s.mu);
  DS_TRY(init_locked(s, device));
  if (src_cuda && dst_cuda) {
    // Device to device: one asynchronous copy per run of pieces adjacent on both sides, each side
    // inside one allocation.
    DeviceAllocator& src_alloc = DeviceAllocator::for_device(src_dev.index);
    DeviceAllocator& dst_alloc = DeviceAllocator::for_device(dst_dev.index);
    for (size_t i = 0; i < regions.size();) {
      auto* dst = static_cast<uint8_t*>(regions[i].dst);
      const auto* src = static_cast<const uint8_t*>(regions[i].src);
      const auto* dst_end = static_cast<const uint8_t*>(dst_alloc.live_block_end(dst));
      const auto* src_end = static_cast<const uint8_t*>(src_alloc.live_block_end(src));
      int64_t n = regions[i].bytes;
      for (++i; i < regions.size() && dst_end != nullptr && src_end != nullptr && regions[i].dst == dst + n &&
                regions[i].src == src + n && dst + n + regions[i].bytes <= dst_end && src + n + regions[i].bytes <= src_end;
           ++i) {
        n += regions[i].bytes;
      }
      if (n == 0) continue;
      const cudaError_t e = cudaMemcpyAsync(dst, src, static_cast<size_t>(n), cudaMemcpyDefault,
                                            static_cast<cudaStream_t>(s.stream.handle()));
      if (e != cudaSuccess) {
        (void)s.stream.synchronize();
        return cuda_error(e, "cudaMemcpyAsync", fmt::format("batched copy of {} bytes {} -> {}", n, src_dev.to_string(),
                                                            dst_dev.to_string()));
      }
    }
    return s.stream.synchronize();
  }
  if (!s.staged) {
    for (const CopyRegion& r : regions) {
      if (r.bytes == 0) continue;
      DS_CUDA_TRY(cudaMemcpy(r.dst, r.src, static_cast<size_t>(r.bytes), cudaMemcpyDefault),
                  "copy of {} bytes {} -> {}", r.bytes, src_dev.to_string(), dst_dev.to_string());
    }
    // cudaMemcpy from pageable host memory may return before the DMA lands: wait for it.
    DS_CUDA_TRY(cudaDeviceSynchronize(), "copy to {}", dst_dev.to_string());
    return Status::ok();
  }
  return staged_copy(s, device, /*to_host=*/src_cuda, regions);
}

}  // namespace ds::cuda

#endif  // DS_HAVE_CUDA
