// Read-bandwidth probe. The read loop uses 256-bit loads when the CPU has AVX2 (chosen at run
// time, the file itself builds for the baseline), with four independent accumulators so the
// core keeps enough loads in flight; the sum is returned so the loads cannot be optimised away.
#include "ops/cpu/membw.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"

namespace ds::cpu {
namespace {

__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, int64_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t read_plain(const uint8_t* p, int64_t bytes) {
  const auto* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (int64_t i = 0; i + 4 <= bytes / 8; i += 4) {
    a0 += q[i];
    a1 += q[i + 1];
    a2 += q[i + 2];
    a3 += q[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

}  // namespace

double measure_read_bandwidth_gbps(int n_threads, int64_t bytes) {
  DS_CHECK(n_threads >= 1 && bytes >= 4096, "measure_read_bandwidth_gbps: threads {} bytes {}", n_threads, bytes);
  constexpr int64_t kChunk = 1 << 16;  // work unit: 64 KiB, a multiple of the 128-byte loop step
  bytes = (bytes + kChunk - 1) / kChunk * kChunk;
  std::unique_ptr<uint8_t, FreeDeleter> buf(static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
  DS_CHECK(buf != nullptr, "measure_read_bandwidth_gbps: cannot allocate {} bytes", bytes);
  ThreadPool pool(n_threads);
  const int64_t n_chunks = bytes / kChunk;
  // First touch from the threads that will read, so pages land near them.
  pool.parallel_for(n_chunks, [&](int64_t b, int64_t e, int) {
    std::memset(buf.get() + b * kChunk, 1, static_cast<size_t>((e - b) * kChunk));
  });
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2");
  std::vector<uint64_t> sink(static_cast<size_t>(n_threads), 0);
  double best = 0.0;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n_chunks, [&](int64_t b, int64_t e, int tid) {
      const uint8_t* p = buf.get() + b * kChunk;
      const int64_t len = (e - b) * kChunk;
      sink[static_cast<size_t>(tid)] += avx2 ? read_avx2(p, len) : read_plain(p, len);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep + v;
  (void)keep;
  return best;
}

}  // namespace ds::cpu
