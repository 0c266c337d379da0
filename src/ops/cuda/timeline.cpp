// The decode-step timeline (timeline.h): the host's launch log, the device buffer's life, and the summary.
// The summary and the name shortening are plain C++ (tested without a GPU); the rest needs DS_HAVE_CUDA.
#include "ops/cuda/timeline.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#if DS_HAVE_CUDA
#include <cuda_runtime.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/pdl.h"
#endif

#ifndef DS_TIMELINE
#define DS_TIMELINE 0  // a build whose kernels do not record (CMake's DELTASERVE_TIMELINE)
#endif

namespace ds::cuda {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

double us_between(uint64_t from_ns, uint64_t to_ns) {
  return (static_cast<double>(to_ns) - static_cast<double>(from_ns)) / 1e3;
}

void erase_all(std::string& s, const std::string& what) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at)) s.erase(at, what.size());
}

}  // namespace

std::string timeline_kernel_name(const char* mangled) {
  if (mangled == nullptr || *mangled == '\0') return "?";
  int rc = -1;
  char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &rc);
  std::string s = rc == 0 && plain != nullptr ? plain : mangled;
  std::free(plain);
  erase_all(s, "(anonymous namespace)::");
  erase_all(s, "ds::cuda::kern::");
  erase_all(s, "ds::cuda::");
  erase_all(s, "ds::DType::");
  erase_all(s, "RecForm::");
  // The parameter list: the last top-level parenthesis group.
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        s.erase(i);
        break;
      }
    }
  }
  return s;
}

Result<TimelineSummary> timeline_summarize(const Timeline& t) {
  const size_t n = t.step.size(), m = t.records.size();
  if (n == 0) return invalid_argument("timeline: no step graph was captured (its launches name the records)");
  if (m % n != 0) {
    return invalid_argument(
        "timeline: {} launches recorded, not a whole number of steps of {} (a kernel that records nothing, or "
        "steps of different kernels)",
        m, n);
  }
  const size_t steps = m / n;
  if (steps < 2) return invalid_argument("timeline: {} step recorded; a summary needs at least 2", steps);
  const auto rec = [&](size_t s, size_t i) -> const TimelineRecord& { return t.records[s * n + i]; };
  TimelineSummary out;
  out.steps = static_cast<int64_t>(steps);
  std::vector<double> step_us;
  for (size_t s = 0; s + 1 < steps; ++s) step_us.push_back(us_between(rec(s, 0).release_ns, rec(s + 1, 0).release_ns));
  out.step_us = median(step_us);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> span, wait, lag, marks[kTimelineMarks];
    for (size_t s = 0; s < steps; ++s) {
      const TimelineRecord& r = rec(s, i);
      wait.push_back(us_between(r.entry_ns, r.release_ns));
      if (i + 1 < n) {
        span.push_back(us_between(r.release_ns, rec(s, i + 1).release_ns));
      } else if (s + 1 < steps) {
        span.push_back(us_between(r.release_ns, rec(s + 1, 0).release_ns));
      }
      if (i > 0) lag.push_back(us_between(rec(s, i - 1).release_ns, r.entry_ns));
      for (int k = 0; k < kTimelineMarks; ++k) {
        if (r.mark_ns[k] != 0) marks[k].push_back(us_between(r.release_ns, r.mark_ns[k]));
      }
    }
    TimelineRow row;
    row.name = t.step[i].name;
    row.ctas = t.step[i].ctas;
    row.span_us = median(span);
    row.wait_us = median(wait);
    row.lag_us = median(lag);
    for (int k = 0; k < kTimelineMarks; ++k) row.mark_us[k] = marks[k].empty() ? -1.0 : median(marks[k]);
    out.positions.push_back(row);
  }
  std::map<std::string, TimelineRow> by;
  for (const TimelineRow& p : out.positions) {
    auto [it, fresh] = by.try_emplace(p.name, p);
    if (fresh) continue;
    TimelineRow& a = it->second;
    a.ctas = std::max(a.ctas, p.ctas);
    a.launches += 1;
    a.span_us += p.span_us;
    a.wait_us += p.wait_us;
    a.lag_us += p.lag_us;
  }
  for (auto& [name, row] : by) out.by_kernel.push_back(row);
  std::sort(out.by_kernel.begin(), out.by_kernel.end(),
            [](const TimelineRow& a, const TimelineRow& b) { return a.span_us > b.span_us; });
  return out;
}

#if DS_HAVE_CUDA

namespace {

struct TimelineHost {
  std::atomic<bool> logging{false};  // a step graph's capture is open
  std::mutex mu;                     // guards the rest
  std::vector<int (*)(void*)> binders;
  struct Launch {
    const void* kernel;
    int64_t ctas, threads;
  };
  std::vector<Launch> open_log;  // the open capture's launches
  std::vector<Launch> step;      // the last captured step graph's
  void* buffer = nullptr;        // device: [count, capacity, capacity records] as u64 (pdl.h)
  int64_t capacity = 0;
};

TimelineHost& host() {
  static auto* h = new TimelineHost();  // never freed: launches may run during static destruction
  return *h;
}

Status bind_all(void* buffer) {
  TimelineHost& h = host();
  for (auto* bind : h.binders) {
    if (const int e = bind(buffer); e != 0) {
      return internal_error("timeline: pointing a CUDA module at the buffer: {}",
                            cudaGetErrorString(static_cast<cudaError_t>(e)));
    }
  }
  return Status::ok();
}

}  // namespace

bool timeline_register_binder(int (*bind)(void* buffer)) {
  TimelineHost& h = host();
  std::lock_guard<std::mutex> lock(h.mu);
  h.binders.push_back(bind);
  return true;
}

bool timeline_logging() { return host().logging.load(std::memory_order_acquire); }

void timeline_log_launch(const void* kernel, long long ctas, long long threads) {
  TimelineHost& h = host();
  std::lock_guard<std::mutex> lock(h.mu);
  h.open_log.push_back({kernel, ctas, threads});
}

void timeline_capture_begin() {
  if (!DS_TIMELINE) return;  // launches are logged only where kernels record (launch.cuh)
  TimelineHost& h = host();
  std::lock_guard<std::mutex> lock(h.mu);
  h.open_log.clear();
  h.logging.store(true, std::memory_order_release);
}

void timeline_capture_end(bool captured) {
  if (!DS_TIMELINE) return;
  TimelineHost& h = host();
  std::lock_guard<std::mutex> lock(h.mu);
  h.logging.store(false, std::memory_order_release);
  if (captured) h.step = std::move(h.open_log);
  h.open_log.clear();
}

bool timeline_compiled() { return DS_TIMELINE != 0; }

Status timeline_start(int64_t capacity) {
  if (!timeline_compiled()) {
    return unsupported(
        "timeline: this build records none (its records change the kernels' code): configure with "
        "-DDELTASERVE_TIMELINE=ON");
  }
  TimelineHost& h = host();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.buffer != nullptr) return invalid_argument("timeline: one is already running");
  if (capacity < 1) return invalid_argument("timeline: capacity {} (at least 1 launch)", capacity);
  const size_t bytes = sizeof(uint64_t) * (2 + kTimelineRecordWords * static_cast<size_t>(capacity));
  void* buf = nullptr;
  if (const cudaError_t e = cudaMalloc(&buf, bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    return out_of_memory("timeline: {} bytes of device memory: {}", bytes, cudaGetErrorString(e));
  }
  const uint64_t head[2] = {0, static_cast<uint64_t>(capacity)};
  cudaError_t e = cudaMemset(buf, 0, bytes);  // marks never reached stay 0
  if (e == cudaSuccess) e = cudaMemcpy(buf, head, sizeof(head), cudaMemcpyHostToDevice);
  Status bound = e == cudaSuccess ? bind_all(buf) : internal_error("timeline: {}", cudaGetErrorString(e));
  if (!bound.is_ok()) {
    (void)bind_all(nullptr);
    (void)cudaFree(buf);
    return bound;
  }
  h.buffer = buf;
  h.capacity = capacity;
  return Status::ok();
}

Result<TimelineResult> timeline_stop() {
  TimelineHost& h = host();
  std::unique_lock<std::mutex> lock(h.mu);
  if (h.buffer == nullptr) return invalid_argument("timeline: none is running");
  void* buf = h.buffer;
  h.buffer = nullptr;
  const int64_t capacity = h.capacity;
  const auto log = h.step;
  lock.unlock();
  // Unbind first (later launches record nothing), then read what the device wrote.
  Status st = bind_all(nullptr);
  cudaError_t e = cudaDeviceSynchronize();
  uint64_t count = 0;
  std::vector<uint64_t> raw;
  if (e == cudaSuccess) e = cudaMemcpy(&count, buf, sizeof(count), cudaMemcpyDeviceToHost);
  const int64_t kept = std::min<int64_t>(static_cast<int64_t>(count), capacity);
  raw.resize(kTimelineRecordWords * static_cast<size_t>(kept));
  if (e == cudaSuccess && kept > 0) {
    e = cudaMemcpy(raw.data(), static_cast<uint64_t*>(buf) + 2, sizeof(uint64_t) * raw.size(), cudaMemcpyDeviceToHost);
  }
  (void)cudaFree(buf);
  if (e != cudaSuccess) return internal_error("timeline: reading the records: {}", cudaGetErrorString(e));
  DS_TRY(st);
  TimelineResult out;
  out.dropped = static_cast<int64_t>(count) - kept;
  for (int64_t i = 0; i < kept; ++i) {
    TimelineRecord r;
    const uint64_t* w = raw.data() + kTimelineRecordWords * i;
    r.entry_ns = w[0];
    r.release_ns = w[1];
    for (int k = 0; k < kTimelineMarks; ++k) r.mark_ns[k] = w[2 + k];
    out.timeline.records.push_back(r);
  }
  for (const auto& l : log) {
    const char* name = nullptr;
    if (cudaFuncGetName(&name, l.kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      name = nullptr;
    }
    out.timeline.step.push_back({timeline_kernel_name(name), l.ctas, l.threads});
  }
  return out;
}

#endif  // DS_HAVE_CUDA

}  // namespace ds::cuda
