// `deltaserve bench MODEL --pp 512 --tg 128`: prompt and generation tokens/s, stated against the
// physical limits measured in the same run: decode against (weight bytes read per token / measured
// read bandwidth), prefill against the FLOPs of the weights (2 x params per token).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <filesystem>

#include "cli/command.h"
#include "engine/local_engine.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "ops/cpu/membw.h"

namespace {

struct Options {
  std::string model;
  std::vector<int64_t> pp = {512};
  int64_t tg = 128;
  std::vector<int64_t> depth = {0};
  int reps = 2;
  int32_t threads = 0;
  int64_t ctx = 0;
  int64_t prefill_chunk = 256;
  std::vector<int64_t> ttft;   // prompt lengths for the time-to-first-token benchmark
  std::string cache_dir;       // disk tier directory for --ttft (a temporary one if empty)
  int64_t tail = 100;          // new tokens after the cached prefix
};

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

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Time to first token with prefix snapshots: cold, memory hit with `tail` new tokens, and disk hit
// after a restart (a fresh engine on the same directory, RAM tier off). Also reports the snapshot size
// and the rate at which a hit restores it.
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
  eo.kv_cache_dir = dir;
  eo.cache_ram_bytes = int64_t{16} << 30;
  eo.checkpoint_every = 0;  // only the turn boundary below is saved
  std::printf("%-8s %12s %12s %12s %14s %12s %12s\n", "prompt", "cold ms", "RAM hit ms", "disk hit ms",
              "snapshot MiB", "KiB/token", "restore GB/s RAM/disk");
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
    auto second = prefix;
    for (int64_t i = 0; i < o.tail; ++i) second.push_back(static_cast<int32_t>(rng() % 200 + 10));
    req.prompt = second;
    DS_ASSIGN_OR_RETURN(auto hit, engine->generate(req));
    if (hit.cached_tokens != len) {
      return ds::internal_error("memory hit restored {} of {} tokens", hit.cached_tokens, len);
    }
    uint64_t snap_bytes = 0;
    engine->disk_store()->flush();
    for (const auto& de : fs::directory_iterator(dir)) {
      if (de.path().extension() == ".dsnap") snap_bytes = std::max<uint64_t>(snap_bytes, fs::file_size(de.path()));
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
    std::printf("%-8lld %12.1f %12.1f %12.1f %14.1f %12.1f %10.2f/%.2f\n", static_cast<long long>(len), cold_ms, ram_ms,
                disk_ms, snap_bytes / 1048576.0, snap_bytes / 1024.0 / len,
                hit.restored_bytes / 1e6 / std::max(1e-3, hit.restore_ms),
                disk_hit.restored_bytes / 1e6 / std::max(1e-3, disk_hit.restore_ms));
  }
  std::error_code ec;
  if (o.cache_dir.empty()) fs::remove_all(dir, ec);
  return ds::Status::ok();
}

ds::Status run(const Options& o) {
  if (!o.ttft.empty()) return run_ttft(o);
  ds::ModelOptions mo;
  mo.n_threads = o.threads;
  mo.n_ctx = o.ctx;
  mo.prefill_chunk = o.prefill_chunk;
  const int64_t max_pp = *std::max_element(o.pp.begin(), o.pp.end());
  const int64_t max_depth = *std::max_element(o.depth.begin(), o.depth.end());
  if (mo.n_ctx == 0) mo.n_ctx = std::max<int64_t>(max_pp, max_depth + o.tg) + 16;
  std::fprintf(stderr, "loading %s\n", o.model.c_str());
  DS_ASSIGN_OR_RETURN(auto model, ds::Model::load(o.model, mo));
  const auto& cfg = model->config();
  const WeightBytes wb = weight_bytes(*model->gguf(), cfg);
  const int threads = ds::ThreadPool::global().n_threads();
  std::fprintf(stderr, "measuring memory read bandwidth (%d threads)\n", threads);
  const double bw = ds::cpu::measure_read_bandwidth_gbps(threads, int64_t{1} << 30);
  std::mt19937 rng(1234);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.n_vocab));
    return t;
  };

  std::printf("model: %s (%s), %.2f GB weights read per token, %.2f B params per token, %d threads\n",
              o.model.c_str(), ds::model_arch_name(cfg.arch), wb.per_token / 1e9, wb.params / 1e9, threads);
  std::printf("measured read bandwidth: %.1f GB/s -> decode bound %.2f tok/s\n", bw, bw * 1e9 / wb.per_token);
  std::printf("%-10s %8s %12s %14s\n", "test", "depth", "tok/s", "of limit");
  for (int64_t pp : o.pp) {
    double best = 0;
    for (int r = 0; r < o.reps; ++r) {
      DS_ASSIGN_OR_RETURN(auto state, model->new_state());
      auto toks = random_tokens(pp);
      const double t0 = now_s();
      DS_TRY(model->prefill(*state, toks));
      best = std::max(best, pp / (now_s() - t0));
      std::fprintf(stderr, "  pp%lld rep %d: %.1f tok/s\n", static_cast<long long>(pp), r, pp / (now_s() - t0));
    }
    const double gflops = best * 2 * wb.params / 1e9;
    std::printf("pp%-8lld %8d %12.2f %11.1f GFLOP/s\n", static_cast<long long>(pp), 0, best, gflops);
  }
  for (int64_t depth : o.depth) {
    double best = 0;
    for (int r = 0; r < o.reps; ++r) {
      DS_ASSIGN_OR_RETURN(auto state, model->new_state());
      DS_TRY(model->prefill(*state, random_tokens(std::max<int64_t>(depth, 1))));
      auto toks = random_tokens(o.tg);
      const double t0 = now_s();
      for (int64_t i = 0; i < o.tg; ++i) DS_TRY(model->decode(*state, toks[i]));
      best = std::max(best, o.tg / (now_s() - t0));
      std::fprintf(stderr, "  tg%lld@%lld rep %d: %.2f tok/s\n", static_cast<long long>(o.tg),
                   static_cast<long long>(depth), r, o.tg / (now_s() - t0));
    }
    const double frac = best * wb.per_token / (bw * 1e9);
    std::printf("tg%-8lld %8lld %12.2f %13.0f%%\n", static_cast<long long>(o.tg), static_cast<long long>(depth), best,
                100 * frac);
  }
  return ds::Status::ok();
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
  app.add_option("--prefill-chunk", o->prefill_chunk, "Prefill chunk in tokens")->capture_default_str();
  app.add_option("--ttft", o->ttft, "Instead: time to first token for these prompt lengths, cold / RAM hit / disk hit")
      ->delimiter(',');
  app.add_option("--kv-cache-dir", o->cache_dir, "With --ttft: snapshot directory (default: a temporary one)");
  app.add_option("--tail", o->tail, "With --ttft: new tokens after the cached prefix")->capture_default_str();
  app.callback([o, &exit_code] { exit_code = ds::cli::report(run(*o)); });
}

ds::cli::Registration reg("bench", "Prompt and generation speed against the measured memory-bandwidth limit", setup);

}  // namespace
