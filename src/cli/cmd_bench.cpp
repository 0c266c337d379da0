// `deltaserve bench MODEL --pp 512 --tg 128 [--device cuda:0] [--json FILE]`: prompt and generation
// tokens/s, stated against the physical limits measured in the same run: decode against (weight bytes
// read per token / measured read bandwidth: the host's on the CPU, the device's on CUDA), prefill
// against the FLOPs of the weights (2 x params per token): as GFLOP/s on the CPU, as a fraction of the
// measured BF16 tensor-core peak on CUDA. On CUDA it also reports peak device memory: the caching
// allocator's high-water mark of reserved bytes and the largest cudaMemGetInfo "used" seen after a run.
// Non-obvious choices: the device limits are measured before the model is loaded, so their buffers
// never compete with the model for memory nor show in its peak; the --json file is rewritten after
// every test, so a run cut short by a timeout still leaves the figures measured so far.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "engine/local_engine.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "ops/cpu/membw.h"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_limits.h"
#include "ops/cuda/pdl.h"
#include "ops/cuda/timeline.h"
#include "ops/device_buffer.h"

namespace {

// Depth prefills (decode at context D) report progress every this many tokens (rounded up to chunks).
constexpr int64_t kDepthProgressTokens = 8192;

struct Options {
  std::string model;
  std::vector<int64_t> pp = {512};
  int64_t tg = 128;
  std::vector<int64_t> depth = {0};
  int reps = 2;
  int32_t threads = 0;
  int64_t ctx = 0;
  int64_t prefill_chunk = 0;   // 0 = auto, resolved by the model (ModelOptions::prefill_chunk)
  bool no_cuda_graph = false;  // CUDA: run every decode step as separate launches
  bool step_times = false;     // CUDA: time each replayed decode step on the device as well
  bool timeline = false;       // CUDA: the decode step's kernel timeline (ops/cuda/timeline.h)
  bool served = false;         // also decode through the engine (sampler included), as serve does
  std::string device = "cpu";  // "cpu" or "cuda:N"
  std::string kv_type;         // "f32" / "f16" / "q8_0" / "q4_0"; empty = f16 on CUDA, f32 on the CPU
  std::string json_path;       // --json: every figure, for scripts
  std::vector<int64_t> ttft;   // prompt lengths for the time-to-first-token benchmark
  std::string cache_dir;       // disk tier directory for --ttft (a temporary one if empty)
  int64_t tail = 100;          // new tokens after the cached prefix
  int64_t checkpoint_every = 0;  // --ttft: snapshots inside the prompt too, as serve takes them (0: only its end)
  std::string skip_kernels;    // diagnostic: CUDA kernels not launched (ops/cuda/pdl.h)
  std::string only_kernels;    // diagnostic: the only CUDA kernels launched
  std::vector<int64_t> verify;  // speculative verify steps of these many tokens (Model::verify)
  std::string draft;            // --served: decode greedily with these drafts (EngineOptions::draft)
};

// A CUDA device must exist on this machine before anything is loaded (engine_parse_device has already
// refused CUDA in builds without it).
ds::Status check_device(ds::Device device) {
#if DS_HAVE_CUDA
  if (device.kind == ds::DeviceKind::kCuda && device.index >= ds::cuda::device_count()) {
    return ds::invalid_argument("--device {}: {} CUDA device(s) visible", device.to_string(), ds::cuda::device_count());
  }
#endif
  (void)device;
  return ds::Status::ok();
}

// --skip-kernels / --only-kernels: the in-graph attribution diagnostic (ops/cuda/pdl.h), CUDA only.
ds::Status apply_kernel_filter(const Options& o, ds::Device device) {
  if (o.skip_kernels.empty() && o.only_kernels.empty()) return ds::Status::ok();
  if (device.kind != ds::DeviceKind::kCuda) {
    return ds::invalid_argument("--skip-kernels / --only-kernels: only with --device cuda:N");
  }
#if DS_HAVE_CUDA
  ds::cuda::set_kernel_filter(o.skip_kernels, o.only_kernels);
  std::printf("diagnostic: CUDA kernels%s%s%s%s are not launched; outputs are meaningless, only the timings mean "
              "something\n",
              o.skip_kernels.empty() ? "" : " matching ", o.skip_kernels.c_str(),
              o.only_kernels.empty() ? "" : " not matching ", o.only_kernels.c_str());
#endif
  return ds::Status::ok();
}

struct WeightBytes {
  double per_token = 0;  // bytes read per decoded token
  double params = 0;     // parameters touched per token (for FLOPs)
};

// Every weight is read once per token, except the embedding table (one row) and routed experts
// (n_used of n_expert).
WeightBytes weight_bytes(const ds::GgufFile& f, const ds::ModelConfig& c) {
  WeightBytes w;
  for (const auto& t : f.tensors()) {
    double bytes = static_cast<double>(t.n_bytes);
    double params = static_cast<double>(t.n_elements());
    if (t.name == "token_embd.weight") {
      const bool tied = f.find_tensor("output.weight") == nullptr;
      if (!tied) {
        bytes /= static_cast<double>(t.ne[1]);
        params = 0;
      }
    } else if (t.name.find("_exps.") != std::string::npos && c.n_expert > 0) {
      const double frac = static_cast<double>(c.n_expert_used) / static_cast<double>(c.n_expert);
      bytes *= frac;
      params *= frac;
    }
    w.per_token += bytes;
    w.params += params;
  }
  return w;
}

// --timeline: records the decode steps of one rep (ops/cuda/timeline.h), then prints where a step's
// time goes, per kernel and for the step's first launches.
constexpr int64_t kTimelineLaunchesPerStep = 4096;  // capacity; a 27B step launches about 700 kernels
ds::Status start_timeline(int64_t steps) {
#if DS_HAVE_CUDA
  return ds::cuda::timeline_start(std::max<int64_t>(1, steps) * kTimelineLaunchesPerStep);
#else
  (void)steps;
  return ds::unsupported("--timeline: this build has no CUDA");
#endif
}

ds::Status print_timeline(const std::string& label) {
#if DS_HAVE_CUDA
  DS_ASSIGN_OR_RETURN(const ds::cuda::TimelineResult res, ds::cuda::timeline_stop());
  if (res.dropped > 0) return ds::internal_error("--timeline: {} launches past the capacity", res.dropped);
  DS_ASSIGN_OR_RETURN(const ds::cuda::TimelineSummary sum, ds::cuda::timeline_summarize(res.timeline));
  const auto cut = [](const std::string& n) { return n.size() <= 56 ? n : n.substr(0, 53) + "..."; };
  std::printf("timeline %s: %lld steps of %zu launches, %.1f us a step (release to release); per kernel and step, "
              "largest first:\n",
              label.c_str(), static_cast<long long>(sum.steps), sum.positions.size(), sum.step_us);
  std::printf("  %-56s %8s %6s %9s %8s %8s %8s\n", "kernel", "launches", "CTAs", "span us", "each us", "wait us",
              "lag us");
  double total = 0;
  for (const auto& k : sum.by_kernel) {
    const double n = static_cast<double>(k.launches);
    std::printf("  %-56s %8lld %6lld %9.1f %8.2f %8.2f %8.2f\n", cut(k.name).c_str(), static_cast<long long>(k.launches),
                static_cast<long long>(k.ctas), k.span_us, k.span_us / n, k.wait_us / n, k.lag_us / n);
    total += k.span_us;
  }
  std::printf("  %-56s %8zu %6s %9.1f   (the spans' sum; the last launch's span runs to the next step)\n", "all",
              sum.positions.size(), "", total);
  const size_t first = std::min<size_t>(sum.positions.size(), 48);
  std::printf("timeline %s: the step's first %zu launches (span: release to the next release; wait: CTA 0 resident "
              "to released; lag: the previous release to CTA 0 resident; marks: the kernel's timeline_mark points "
              "in CTA 0, us after its release):\n",
              label.c_str(), first);
  std::printf("  %4s %-56s %6s %8s %8s %8s  %s\n", "#", "kernel", "CTAs", "span", "wait", "lag", "marks 0 1 2 3");
  for (size_t i = 0; i < first; ++i) {
    const auto& p = sum.positions[i];
    std::string marks;
    for (double m : p.mark_us) marks += m < 0 ? "     -" : fmt::format(" {:5.2f}", m);
    std::printf("  %4zu %-56s %6lld %8.2f %8.2f %8.2f %s\n", i, cut(p.name).c_str(), static_cast<long long>(p.ctas),
                p.span_us, p.wait_us, p.lag_us, marks.c_str());
  }
  return ds::Status::ok();
#else
  (void)label;
  return ds::unsupported("--timeline: this build has no CUDA");
#endif
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Time to first token with prefix snapshots: cold, memory hit with `tail` new tokens, and disk hit
// after a restart (a fresh engine on the same directory, RAM tier off). Also reports the snapshot size
// (the state the RAM hit restored, its chain included), the bytes of every snapshot file written,
// the rate at which a hit restores it, and the time snapshots take: on the request's path (what the
// next model step changes, copied at once) for the cold request and the hit, and after the cold
// request returned (its KV rows copied out in the background; waited for before the hit).
ds::Status run_ttft(const Options& o) {
  namespace fs = std::filesystem;
  const std::string dir = o.cache_dir.empty()
                              ? (fs::temp_directory_path() / fmt::format("deltaserve-bench-cache-{}", ::getpid())).string()
                              : o.cache_dir;
  const int64_t max_len = *std::max_element(o.ttft.begin(), o.ttft.end());
  ds::EngineOptions eo;
  eo.n_threads = o.threads;
  eo.n_ctx = max_len + o.tail + 16;
  eo.prefill_chunk = o.prefill_chunk;
  eo.device = o.device;
  eo.kv_type = o.kv_type;
  eo.kv_cache_dir = dir;
  eo.cache_ram_bytes = int64_t{16} << 30;
  eo.checkpoint_every = o.checkpoint_every;  // 0: only the end of the prompt is saved
  std::printf("%-8s %12s %12s %12s %14s %12s %22s %22s %10s\n", "prompt", "cold ms", "RAM hit ms", "disk hit ms",
              "snapshot MiB", "KiB/token", "restore GB/s RAM/disk", "saving ms cold/hit/after", "disk MiB");
  for (int64_t len : o.ttft) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    std::mt19937 rng(static_cast<uint32_t>(len));
    DS_ASSIGN_OR_RETURN(auto engine, ds::LocalEngine::open(o.model, eo));
    const int64_t n_vocab = engine->info().n_vocab;
    // The first request's prompt is snapshotted at its end; the second request resends it plus a
    // `tail`-token continuation, as an agent does with a growing conversation.
    std::vector<int32_t> prefix(len);
    for (auto& t : prefix) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(std::min<int64_t>(n_vocab, 200)) + 10);
    ds::GenerateRequest req;
    req.max_tokens = 1;
    req.ignore_eos = true;
    req.prompt = prefix;
    DS_ASSIGN_OR_RETURN(auto cold, engine->generate(req));
    // The rest of its snapshots' copies, off the request's path (the next request would wait for it).
    const double t_copy = now_s();
    engine->wait_snapshots();
    const double copy_out_ms = (now_s() - t_copy) * 1e3;
    auto second = prefix;
    for (int64_t i = 0; i < o.tail; ++i) second.push_back(static_cast<int32_t>(rng() % 200 + 10));
    req.prompt = second;
    DS_ASSIGN_OR_RETURN(auto hit, engine->generate(req));
    if (hit.cached_tokens != len) {
      return ds::internal_error("memory hit restored {} of {} tokens", hit.cached_tokens, len);
    }
    uint64_t disk_bytes = 0;  // every snapshot file the two requests left
    engine->flush_snapshots();
    for (const auto& de : fs::directory_iterator(dir)) {
      if (de.path().extension() == ".dsnap") disk_bytes += fs::file_size(de.path());
    }
    engine.reset();
    ds::EngineOptions disk_only = eo;
    disk_only.cache_ram_bytes = 0;
    DS_ASSIGN_OR_RETURN(auto restarted, ds::LocalEngine::open(o.model, disk_only));
    auto third = prefix;  // a different tail: only the prefix snapshot matches
    for (int64_t i = 0; i < o.tail; ++i) third.push_back(static_cast<int32_t>(rng() % 200 + 10));
    req.prompt = third;
    DS_ASSIGN_OR_RETURN(auto disk_hit, restarted->generate(req));
    if (disk_hit.cached_tokens != len) {
      return ds::internal_error("disk hit restored {} of {} tokens", disk_hit.cached_tokens, len);
    }
    // Time to first token = prefill + the first sampled token (restore included in prefill for hits).
    const double cold_ms = cold.prefill_ms, ram_ms = hit.prefill_ms, disk_ms = disk_hit.prefill_ms;
    const std::string restore = fmt::format("{:.2f}/{:.2f}", hit.restored_bytes / 1e6 / std::max(1e-3, hit.restore_ms),
                                            disk_hit.restored_bytes / 1e6 / std::max(1e-3, disk_hit.restore_ms));
    const std::string saving = fmt::format("{:.1f}/{:.1f}/{:.1f}", cold.snapshot_ms, hit.snapshot_ms, copy_out_ms);
    std::printf("%-8lld %12.1f %12.1f %12.1f %14.1f %12.1f %22s %22s %10.1f\n", static_cast<long long>(len), cold_ms, ram_ms,
                disk_ms, hit.restored_bytes / 1048576.0, hit.restored_bytes / 1024.0 / len, restore.c_str(), saving.c_str(),
                disk_bytes / 1048576.0);
  }
  std::error_code ec;
  if (o.cache_dir.empty()) fs::remove_all(dir, ec);
  return ds::Status::ok();
}

// The device limits the speeds are stated against; NaN where the device has none.
struct Limits {
  double read_gbps = 0;                          // streaming read bandwidth, GB/s
  double bf16_tflops = std::nan("");             // BF16 tensor-core GEMM peak, TFLOP/s (CUDA)
  std::string device_name = "cpu";
  int sm_count = 0;
};

// Peak memory figures, sampled after every run while its state is alive.
struct MemoryFigures {
  int64_t allocator_peak_reserved = 0;  // CUDA caching allocator: high-water mark of cudaMalloc'd bytes
  int64_t allocator_peak_in_use = 0;    // ... and of bytes handed out
  int64_t device_used_max = 0;          // largest cudaMemGetInfo total - free seen
  int64_t device_total = 0;
  int64_t host_alloc_peak = 0;          // host tensor allocator high-water mark
};

void sample_memory(ds::Device device, MemoryFigures& m) {
  m.host_alloc_peak = ds::allocator_stats(ds::Device{}).peak_bytes;
#if DS_HAVE_CUDA
  if (device.kind == ds::DeviceKind::kCuda) {
    const auto s = ds::cuda::DeviceAllocator::for_device(device.index).stats();
    m.allocator_peak_reserved = s.peak_reserved_bytes;
    m.allocator_peak_in_use = s.peak_in_use_bytes;
    auto used = ds::cuda::device_memory_used(device.index);
    if (used.is_ok()) {
      m.device_used_max = std::max(m.device_used_max, used->first);
      m.device_total = used->second;
    }
  }
#endif
}

// Reads a logit so that a backend that finishes lazily has finished before the clock stops.
float touch_logits(const ds::Model& model, const ds::SequenceState& state) {
  const auto logits = model.logits(state);
  return logits.empty() ? 0.0f : logits[0];
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30); }

nlohmann::json num_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// The --json document, rewritten (write to a temporary name, then rename) after every test.
class JsonReport {
 public:
  explicit JsonReport(std::string path) : path_(std::move(path)) { doc_["tests"] = nlohmann::json::array(); }
  nlohmann::json& doc() { return doc_; }
  void set_memory(const MemoryFigures& m) {
    doc_["memory"] = {{"allocator_peak_reserved_bytes", m.allocator_peak_reserved},
                      {"allocator_peak_in_use_bytes", m.allocator_peak_in_use},
                      {"device_used_bytes", m.device_used_max},
                      {"device_total_bytes", m.device_total},
                      {"host_alloc_peak_bytes", m.host_alloc_peak}};
  }
  ds::Status write() const {
    if (path_.empty()) return ds::Status::ok();
    const std::string tmp = path_ + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << doc_.dump(2) << "\n";
      f.flush();
      if (!f) return ds::io_error("--json {}: cannot write {}", path_, tmp);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path_, ec);
    if (ec) return ds::io_error("--json {}: rename from {}: {}", path_, tmp, ec.message());
    return ds::Status::ok();
  }

 private:
  std::string path_;
  nlohmann::json doc_;
};

Limits measure_cpu_limits() {
  Limits l;
  const int threads = ds::ThreadPool::global().n_threads();
  std::fprintf(stderr, "measuring memory read bandwidth (%d threads)\n", threads);
  l.read_gbps = ds::cpu::measure_read_bandwidth_gbps(threads, int64_t{1} << 30);
  return l;
}

ds::Result<Limits> measure_cuda_limits(ds::Device device) {
#if DS_HAVE_CUDA
  Limits l;
  DS_ASSIGN_OR_RETURN(auto info, ds::cuda::device_info(device.index));
  l.device_name = info.name;
  l.sm_count = info.sm_count;
  std::fprintf(stderr, "measuring device read bandwidth on %s (%s)\n", device.to_string().c_str(), info.name.c_str());
  DS_ASSIGN_OR_RETURN(l.read_gbps, ds::cuda::measure_read_bandwidth_gbps(device.index));
  std::fprintf(stderr, "measuring BF16 tensor-core peak (cuBLAS 8192^3)\n");
  DS_ASSIGN_OR_RETURN(l.bf16_tflops, ds::cuda::measure_bf16_peak_tflops(device.index));
  return l;
#else
  return ds::unsupported("{}: this build has no CUDA backend", device.to_string());
#endif
}

// Prefills `tokens` from position 0 in pieces of whole prefill chunks (bit-identical to one call),
// with a progress line on stderr after each piece.
ds::Status prefill_with_progress(ds::Model& model, ds::SequenceState& state, std::span<const int32_t> tokens,
                                 const char* label) {
  const int64_t chunk = std::max<int64_t>(1, model.options().prefill_chunk);
  const int64_t step = (kDepthProgressTokens + chunk - 1) / chunk * chunk;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const double t0 = now_s();
  for (int64_t done = 0; done < n;) {
    const int64_t len = std::min(step, n - done);
    DS_TRY(model.prefill(state, tokens.subspan(static_cast<size_t>(done), static_cast<size_t>(len))));
    done += len;
    if (n > step || done == n) {
      (void)touch_logits(model, state);
      std::fprintf(stderr, "  %s: prefilled %lld/%lld tokens, %.1f tok/s\n", label, static_cast<long long>(done),
                   static_cast<long long>(n), done / std::max(1e-9, now_s() - t0));
    }
  }
  return ds::Status::ok();
}

ds::Status run_speed(const Options& o, ds::Device device, ds::DType kv_dtype, JsonReport& report) {
  const bool cuda = device.kind == ds::DeviceKind::kCuda;
  ds::ModelOptions mo;
  mo.n_threads = o.threads;
  mo.n_ctx = o.ctx;
  mo.prefill_chunk = o.prefill_chunk;
  mo.kv_dtype = kv_dtype;
  mo.device = device;
  mo.cuda_graphs = !o.no_cuda_graph;
  mo.cuda_time_steps = o.step_times;
  const int64_t max_pp = *std::max_element(o.pp.begin(), o.pp.end());
  const int64_t max_depth = *std::max_element(o.depth.begin(), o.depth.end());
  if (mo.n_ctx == 0) mo.n_ctx = std::max<int64_t>(max_pp, max_depth + o.tg) + 16;
  if (!o.verify.empty() && o.ctx == 0) mo.n_ctx += 2 * o.tg + 16 * ds::kMaxVerifyTokens;  // the accepted rounds advance
  Limits lim;
  if (cuda) {
    // Before the load: the measurement buffers (4 GiB) must not compete with the model's memory.
    DS_ASSIGN_OR_RETURN(lim, measure_cuda_limits(device));
  }
  std::fprintf(stderr, "loading %s%s%s\n", o.model.c_str(), cuda ? " on " : "", cuda ? device.to_string().c_str() : "");
  const double t_load = now_s();
  DS_ASSIGN_OR_RETURN(auto model, ds::Model::load(o.model, mo));
  if (cuda) std::fprintf(stderr, "loaded in %.1f s\n", now_s() - t_load);
  const ds::ModelConfig cfg = model->config();  // a copy: --served releases the model first
  const WeightBytes wb = weight_bytes(*model->gguf(), cfg);
  const int threads = ds::ThreadPool::global().n_threads();
  if (!cuda) lim = measure_cpu_limits();
  const double bw = lim.read_gbps;
  const double peak_flops = lim.bf16_tflops * 1e12;  // NaN on the CPU
  MemoryFigures mem;
  sample_memory(device, mem);
  std::mt19937 rng(1234);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.n_vocab));
    return t;
  };

  auto& doc = report.doc();
  doc["model"] = o.model;
  doc["arch"] = ds::model_arch_name(cfg.arch);
  doc["device"] = device.to_string();
  doc["device_name"] = lim.device_name;
  doc["sm_count"] = lim.sm_count;
  doc["threads"] = threads;
  doc["n_ctx"] = model->n_ctx();
  doc["prefill_chunk"] = model->options().prefill_chunk;
  doc["kv_type"] = ds::dtype_name(kv_dtype);
  doc["reps"] = o.reps;
  doc["weight_bytes_per_token"] = wb.per_token;
  doc["params_per_token"] = wb.params;
  doc["limits"] = {{"read_bandwidth_gbps", bw},
                   {"decode_bound_tok_s", bw * 1e9 / wb.per_token},
                   {"bf16_peak_tflops", num_or_null(lim.bf16_tflops)},
                   {"prefill_bound_tok_s", num_or_null(peak_flops / (2 * wb.params))}};
  report.set_memory(mem);
  DS_TRY(report.write());

  if (cuda) {
    std::printf("model: %s (%s), %.2f GB weights read per token, %.2f B params per token, %s (%s, %d SMs), "
                "prefill chunk %lld, kv %s\n",
                o.model.c_str(), ds::model_arch_name(cfg.arch), wb.per_token / 1e9, wb.params / 1e9,
                device.to_string().c_str(), lim.device_name.c_str(), lim.sm_count,
                static_cast<long long>(model->options().prefill_chunk), ds::dtype_name(kv_dtype));
    std::printf("measured read bandwidth: %.1f GB/s -> decode bound %.2f tok/s\n", bw, bw * 1e9 / wb.per_token);
    std::printf("measured BF16 tensor-core peak: %.1f TFLOP/s -> prefill bound %.1f tok/s\n", lim.bf16_tflops,
                peak_flops / (2 * wb.params));
  } else {
    std::printf("model: %s (%s), %.2f GB weights read per token, %.2f B params per token, %d threads, kv %s\n",
                o.model.c_str(), ds::model_arch_name(cfg.arch), wb.per_token / 1e9, wb.params / 1e9, threads,
                ds::dtype_name(kv_dtype));
    std::printf("measured read bandwidth: %.1f GB/s -> decode bound %.2f tok/s\n", bw, bw * 1e9 / wb.per_token);
  }
  std::printf("%-10s %8s %12s %14s\n", "test", "depth", "tok/s", "of limit");
  std::fflush(stdout);
  // One decode row of the table and of the JSON: tok/s against the bandwidth bound; `sampling` names
  // the sampling of a row decoded through the engine.
  const auto decode_row = [&](const std::string& label, const std::string& test, const char* kind, int64_t depth,
                              double best, const std::vector<double>& reps, const char* sampling) {
    const double frac = best * wb.per_token / (bw * 1e9);
    std::printf("%-10s %8lld %12.2f %13.0f%%%s\n", label.c_str(), static_cast<long long>(depth), best, 100 * frac,
                sampling ? fmt::format("  (served: engine, {})", sampling).c_str() : "");
    std::fflush(stdout);
    nlohmann::json row = {{"test", test},           {"kind", kind},     {"n_tokens", o.tg},
                          {"depth", depth},         {"tok_s", best},    {"rep_tok_s", reps},
                          {"limit", "read_bandwidth"}, {"fraction_of_limit", num_or_null(frac)}};
    if (sampling) row["sampling"] = sampling;
    doc["tests"].push_back(std::move(row));
  };

  for (int64_t pp : o.pp) {
    double best = 0;
    std::vector<double> reps;
    for (int r = 0; r < o.reps; ++r) {
      DS_ASSIGN_OR_RETURN(auto state, model->new_state());
      auto toks = random_tokens(pp);
      const double t0 = now_s();
      DS_TRY(model->prefill(*state, toks));
      (void)touch_logits(*model, *state);
      const double tps = pp / (now_s() - t0);
      best = std::max(best, tps);
      reps.push_back(tps);
      sample_memory(device, mem);
      std::fprintf(stderr, "  pp%lld rep %d: %.1f tok/s\n", static_cast<long long>(pp), r, tps);
    }
    const double flops = best * 2 * wb.params;
    const double frac = flops / peak_flops;  // NaN on the CPU
    if (cuda) {
      std::printf("pp%-8lld %8d %12.2f %13.1f%%  (%.1f TFLOP/s of BF16 peak)\n", static_cast<long long>(pp), 0, best,
                  100 * frac, flops / 1e12);
    } else {
      std::printf("pp%-8lld %8d %12.2f %11.1f GFLOP/s\n", static_cast<long long>(pp), 0, best, flops / 1e9);
    }
    std::fflush(stdout);
    doc["tests"].push_back({{"test", fmt::format("pp{}", pp)},
                            {"kind", "prefill"},
                            {"n_tokens", pp},
                            {"depth", 0},
                            {"tok_s", best},
                            {"rep_tok_s", reps},
                            {"tflops", flops / 1e12},
                            {"limit", cuda ? "bf16_peak" : "none"},
                            {"fraction_of_limit", num_or_null(frac)}});
    report.set_memory(mem);
    DS_TRY(report.write());
  }
  std::vector<double> decode_best;  // per depth: the tg row's tok/s (the verify rows compare to it)
  for (int64_t depth : o.depth) {
    double best = 0;
    std::vector<double> reps;
    const std::string label = fmt::format("tg{}@{}", o.tg, depth);
    for (int r = 0; r < o.reps; ++r) {
      DS_ASSIGN_OR_RETURN(auto state, model->new_state());
      const auto ctx_toks = random_tokens(std::max<int64_t>(depth, 1));
      DS_TRY(prefill_with_progress(*model, *state, ctx_toks, fmt::format("{} rep {} context", label, r).c_str()));
      auto toks = random_tokens(o.tg);
      const ds::CudaGraphStats g0 = model->cuda_graph_stats();
      const bool timeline = o.timeline && r + 1 == o.reps;  // the last rep's steps
      if (timeline) DS_TRY(start_timeline(o.tg));
      const double t0 = now_s();
      for (int64_t i = 0; i < o.tg; ++i) {
        DS_TRY(model->decode(*state, toks[i]));
        (void)touch_logits(*model, *state);
      }
      const double tps = o.tg / (now_s() - t0);
      if (timeline) DS_TRY(print_timeline(label));
      best = std::max(best, tps);
      reps.push_back(tps);
      sample_memory(device, mem);
      std::fprintf(stderr, "  tg%lld@%lld rep %d: %.2f tok/s\n", static_cast<long long>(o.tg),
                   static_cast<long long>(depth), r, tps);
      const ds::CudaGraphStats g1 = model->cuda_graph_stats();
      if (const int64_t n = g1.timed_replays - g0.timed_replays; n > 0) {
        // Wall time a step against the device's time for a replayed step (graph launch to its last copy).
        const double dev_ms = (g1.replay_device_ms - g0.replay_device_ms) / static_cast<double>(n);
        std::fprintf(stderr, "    a step: %.3f ms wall, %.3f ms on the device (%lld timed replays): %.1f us on the host\n",
                     1e3 / tps, dev_ms, static_cast<long long>(n), 1e3 * (1e3 / tps - dev_ms));
      }
    }
    decode_row(fmt::format("tg{}", o.tg), fmt::format("tg{}", o.tg), "decode", depth, best, reps, nullptr);
    decode_best.push_back(best);
    report.set_memory(mem);
    DS_TRY(report.write());
  }
  // Speculative verify steps of k tokens (the last token and k - 1 draft tokens) at each depth: a
  // round whose draft is all rejected (the verify, then keeping 1 token: the recurrent state rebuilt)
  // and one whose draft is all accepted (keeping k). A round of a accepted tokens yields a + 1.
  for (size_t di = 0; di < o.depth.size() && !o.verify.empty(); ++di) {
    const int64_t depth = o.depth[di];
    const double t_decode = 1.0 / decode_best[di];
    for (int64_t k : o.verify) {
      const int64_t rounds = std::max<int64_t>(8, o.tg / k);
      double best_rej = 1e30, best_acc = 1e30;
      for (int r = 0; r < o.reps; ++r) {
        DS_ASSIGN_OR_RETURN(auto state, model->new_state());
        const auto ctx_toks = random_tokens(std::max<int64_t>(depth, 1));
        DS_TRY(prefill_with_progress(*model, *state, ctx_toks, fmt::format("vf{}@{} rep {} context", k, depth, r).c_str()));
        for (const bool accept : {false, true}) {
          for (int w = 0; w < 2; ++w) {  // warm-up: buffers, then the steps' graphs captured
            DS_TRY(model->verify(*state, random_tokens(k)));
            DS_TRY(model->keep_verified(*state, accept ? k : 1));
          }
          const double t0 = now_s();
          for (int64_t i = 0; i < rounds; ++i) {
            DS_TRY(model->verify(*state, random_tokens(k)));
            DS_TRY(model->keep_verified(*state, accept ? k : 1));
          }
          const double t = (now_s() - t0) / static_cast<double>(rounds);
          (accept ? best_acc : best_rej) = std::min(accept ? best_acc : best_rej, t);
        }
        std::fprintf(stderr, "  vf%lld@%lld rep %d: %.3f ms rejected, %.3f ms accepted a round\n",
                     static_cast<long long>(k), static_cast<long long>(depth), r, 1e3 * best_rej, 1e3 * best_acc);
      }
      const double all_tps = static_cast<double>(k) / best_acc;
      const double break_even = best_rej / t_decode - 1.0;
      std::printf("vf%-8lld %8lld %12.2f %13.0f%%  (all %lld accepted; %.2f ms a round, %.2f ms all rejected: "
                  "%.2fx a decode step, even at %.2f accepted)\n",
                  static_cast<long long>(k), static_cast<long long>(depth), all_tps,
                  100 * all_tps * wb.per_token / (bw * 1e9), static_cast<long long>(k - 1), 1e3 * best_acc,
                  1e3 * best_rej, best_rej / t_decode, break_even);
      std::fflush(stdout);
      doc["tests"].push_back({{"test", fmt::format("vf{}", k)},
                              {"kind", "verify"},
                              {"n_tokens", k},
                              {"depth", depth},
                              {"tok_s", all_tps},
                              {"ms_round_accepted", 1e3 * best_acc},
                              {"ms_round_rejected", 1e3 * best_rej},
                              {"rejected_over_decode", best_rej / t_decode},
                              {"break_even_accepted", break_even},
                              {"limit", "read_bandwidth"},
                              {"fraction_of_limit", num_or_null(all_tps * wb.per_token / (bw * 1e9))}});
      DS_TRY(report.write());
    }
  }
  if (cuda) {
    std::printf("peak device memory: allocator reserved %.2f GiB (in use %.2f GiB); device used %.2f GiB of %.2f GiB "
                "(cudaMemGetInfo, context included)\n",
                gib(mem.allocator_peak_reserved), gib(mem.allocator_peak_in_use), gib(mem.device_used_max),
                gib(mem.device_total));
  }
  if (!o.served) return ds::Status::ok();

  // What a server's user gets: the same decode through the engine (LocalEngine::generate: the sampler
  // on each step's logits, or the best logits on CUDA, then Model::decode) with the server's default
  // sampling. The engine loads its own copy of the model, so the bench's goes first.
  ds::EngineOptions eo;
  eo.n_threads = o.threads;
  eo.n_ctx = model->n_ctx();
  eo.prefill_chunk = o.prefill_chunk;
  eo.device = o.device;
  eo.kv_type = o.kv_type;
  eo.cuda_graphs = !o.no_cuda_graph;
  eo.cache_ram_bytes = 0;
  eo.checkpoint_every = 0;
  eo.draft = o.draft;
  const bool drafting = ds::engine_drafts(eo);
  model.reset();
  std::fprintf(stderr, "loading %s into the engine\n", o.model.c_str());
  DS_ASSIGN_OR_RETURN(auto engine, ds::LocalEngine::open(o.model, eo));
  for (int64_t depth : o.depth) {
    double best = 0;
    std::vector<double> reps;
    for (int r = 0; r < o.reps; ++r) {
      ds::GenerateRequest req;
      req.prompt = random_tokens(std::max<int64_t>(depth, 1));
      req.max_tokens = static_cast<int32_t>(o.tg + 1);  // tg decode steps after the prompt's token
      req.ignore_eos = true;
      req.sampling = ds::kRecommendedSampling;
      req.sampling.seed = static_cast<uint64_t>(r);
      const ds::EngineStats s0 = engine->stats();
      DS_ASSIGN_OR_RETURN(const auto res, engine->generate(req));
      const ds::EngineStats s1 = engine->stats();
      if (drafting) {
        std::fprintf(stderr, "    %lld of %lld draft tokens accepted in %lld verify steps\n",
                     static_cast<long long>(res.accepted_tokens), static_cast<long long>(res.draft_tokens),
                     static_cast<long long>(res.verify_steps));
      }
      const double tps = 1e3 * static_cast<double>(res.tokens.size() - 1) / std::max(1e-6, res.decode_ms);
      best = std::max(best, tps);
      reps.push_back(tps);
      std::fprintf(stderr, "  tg%lld-served@%lld rep %d: %.2f tok/s\n", static_cast<long long>(o.tg),
                   static_cast<long long>(depth), r, tps);
      if (s1.graph_captured_steps + s1.graph_replayed_steps + s1.graph_op_by_op_steps > 0) {
        std::fprintf(stderr, "    graph steps: %llu replayed, %llu captured, %llu op by op\n",
                     static_cast<unsigned long long>(s1.graph_replayed_steps - s0.graph_replayed_steps),
                     static_cast<unsigned long long>(s1.graph_captured_steps - s0.graph_captured_steps),
                     static_cast<unsigned long long>(s1.graph_op_by_op_steps - s0.graph_op_by_op_steps));
      }
    }
    decode_row(fmt::format("tg{}-srv", o.tg), fmt::format("tg{}-served", o.tg), "decode_served", depth, best, reps,
               drafting ? "temperature 1, top-k 20, top-p 0.95, drafts" : "temperature 1, top-k 20, top-p 0.95");
    DS_TRY(report.write());
  }
  return ds::Status::ok();
}

ds::Status check_lengths(const Options& o) {
  if (o.reps < 1) return ds::invalid_argument("--reps {}: must be at least 1", o.reps);
  if (o.tg < 1) return ds::invalid_argument("--tg {}: must be at least 1", o.tg);
  if (o.pp.empty()) return ds::invalid_argument("--pp: give at least one prompt length");
  for (int64_t pp : o.pp) {
    if (pp < 1) return ds::invalid_argument("--pp {}: prompt lengths must be at least 1", pp);
  }
  if (o.depth.empty()) return ds::invalid_argument("--depth: give at least one context depth");
  for (int64_t d : o.depth) {
    if (d < 0) return ds::invalid_argument("--depth {}: depths must be at least 0", d);
  }
  for (int64_t k : o.verify) {
    if (k < 1 || k > ds::kMaxVerifyTokens) {
      return ds::invalid_argument("--verify {}: a verify takes 1 to {} tokens", k, ds::kMaxVerifyTokens);
    }
  }
  return ds::Status::ok();
}

ds::Status run(Options o) {
  DS_ASSIGN_OR_RETURN(const ds::Device device, ds::engine_parse_device(o.device));
  DS_ASSIGN_OR_RETURN(const ds::DType kv_dtype, ds::engine_parse_kv_type(o.kv_type, device));
  if (o.prefill_chunk < 0) return ds::invalid_argument("--prefill-chunk {}: must be 0 (auto) or positive", o.prefill_chunk);
  DS_TRY(check_device(device));
  DS_TRY(apply_kernel_filter(o, device));
  if (o.step_times && device.kind != ds::DeviceKind::kCuda) {
    return ds::invalid_argument("--step-times: only with --device cuda:N");
  }
  if (o.timeline && device.kind != ds::DeviceKind::kCuda) {
    return ds::invalid_argument("--timeline: only with --device cuda:N");
  }
#if DS_HAVE_CUDA
  if (o.timeline && !ds::cuda::timeline_compiled()) {
    return ds::unsupported("--timeline: this build records none; configure it with -DDELTASERVE_TIMELINE=ON");
  }
#endif
  if (o.timeline && (o.no_cuda_graph || o.tg < 3)) {
    return ds::invalid_argument("--timeline: needs CUDA graphs and --tg of at least 3 (steps to compare)");
  }
  if (!o.ttft.empty()) {
    if (!o.json_path.empty()) return ds::invalid_argument("--json is not supported with --ttft");
    return run_ttft(o);
  }
  DS_TRY(check_lengths(o));
  if (!o.draft.empty()) {
    ds::EngineOptions eo;
    eo.draft = o.draft;
    DS_TRY(ds::engine_check_draft(eo));
    if (!o.served) return ds::invalid_argument("--draft: only with --served (the engine's decode)");
  }
  JsonReport report(o.json_path);
  const ds::Status status = run_speed(o, device, kv_dtype, report);
  // The report says whether every test ran; a failure keeps the figures measured before it.
  report.doc()["complete"] = status.is_ok();
  if (!status.is_ok()) report.doc()["error"] = status.to_string();
  const ds::Status written = report.write();
  return status.is_ok() ? written : status;
}

void setup(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
  app.add_option("model", o->model, "GGUF model file")->required();
  app.add_option("--pp", o->pp, "Prompt lengths to prefill (tokens)")->capture_default_str()->delimiter(',');
  app.add_option("--tg", o->tg, "Tokens to decode")->capture_default_str();
  app.add_option("--depth", o->depth, "Context depths to decode at (tokens already in the KV)")->delimiter(',');
  app.add_option("--reps", o->reps, "Repetitions (best is reported)")->capture_default_str();
  app.add_option("-t,--threads", o->threads, "CPU threads (0 = all cores)");
  app.add_option("-c,--ctx-size", o->ctx, "Context size (0 = enough for the test)");
  app.add_flag("--no-cuda-graph", o->no_cuda_graph, "CUDA: launch every decode step op by op (no graph replay)");
  app.add_flag("--step-times", o->step_times,
               "CUDA: also time each replayed decode step on the device (two events a step) and report the host's share");
  app.add_flag("--timeline", o->timeline,
               "Diagnostic, CUDA: record the last rep's decode steps kernel by kernel inside the graph and print "
               "where a step's time goes (each kernel's release to the next one's); needs a build configured with "
               "-DDELTASERVE_TIMELINE=ON");
  app.add_option("--prefill-chunk", o->prefill_chunk,
                 "Prefill chunk in tokens (0 = auto: 256 on the CPU; on CUDA 4096 on devices of 28 GiB or more, "
                 "else 1024)")
      ->capture_default_str();
  app.add_option("--device", o->device, "cpu or cuda:N")->capture_default_str();
  app.add_flag("--served", o->served,
               "Also decode through the engine, sampler included (the server's default sampling), as a user of "
               "serve gets it: one more row per depth");
  app.add_option("--kv-type", o->kv_type,
                 "Attention KV cache type: f16, f32, q8_0 or q4_0 (q8_0 / q4_0: head_dim a multiple of 32) (default "
                 "f16 on CUDA, f32 on the CPU)");
  app.add_option("--verify", o->verify,
                 "Also time speculative verify steps of these many tokens (1 to 8) at each depth: all rejected "
                 "and all accepted")
      ->delimiter(',');
  app.add_option("--draft", o->draft, "With --served: decode with these speculative drafts (ngram)");
  app.add_option("--json", o->json_path, "Also write every figure (limits, tok/s, fractions, peak memory) to this file");
  app.add_option("--ttft", o->ttft, "Instead: time to first token for these prompt lengths, cold / RAM hit / disk hit")
      ->delimiter(',');
  app.add_option("--kv-cache-dir", o->cache_dir, "With --ttft: snapshot directory (default: a temporary one)");
  app.add_option("--tail", o->tail, "With --ttft: new tokens after the cached prefix")->capture_default_str();
  app.add_option("--checkpoint-every", o->checkpoint_every,
                 "With --ttft: also snapshot every N prompt tokens, as serve does (--cache-checkpoint-every, 4096 "
                 "there); 0: only the prompt's end")
      ->capture_default_str();
  app.add_option("--skip-kernels", o->skip_kernels,
                 "Diagnostic, CUDA: do not launch kernels whose name contains one of these comma-separated "
                 "substrings (what they cost inside the decode graph; outputs are meaningless)");
  app.add_option("--only-kernels", o->only_kernels,
                 "Diagnostic, CUDA: launch only kernels whose name contains one of these substrings");
  app.callback([o, &exit_code] { exit_code = ds::cli::report(run(*o)); });
}

ds::cli::Registration reg("bench", "Prompt and generation speed against the measured memory-bandwidth limit", setup);

}  // namespace
