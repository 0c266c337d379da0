// OpContext: where and how an op runs. Every op takes one: the device picks the backend, the thread
// pool parallelizes CPU work, and a CUDA build adds its stream here.
// Non-obvious choice: `reference` routes CPU ops to the scalar reference implementations, so tests
// and debugging compare fast and reference paths through the same public entry points.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace ds {

struct OpContext {
  Device device{};
  ThreadPool* pool = nullptr;   // CPU threads; null = ThreadPool::global()
  void* cuda_stream = nullptr;  // cudaStream_t of the CUDA backend (unused on the CPU)
  bool reference = false;       // CPU: run the scalar reference path

  ThreadPool& threads() const { return pool ? *pool : ThreadPool::global(); }
};

// Status for an op called on a device this build has no backend for.
Status op_no_backend(const char* op, Device device);

}  // namespace ds
