// `deltaserve serve [MODEL.gguf]`: loads the model (or the built-in demo model) and serves the
// OpenAI and Anthropic HTTP APIs until SIGINT/SIGTERM. Non-obvious choice: signals are waited for on
// a dedicated thread with sigwait (blocked in every other thread), so shutdown runs ordinary code
// (stop the listener, cancel generations) instead of async-signal-unsafe code in a handler.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "core/log.h"
#include "engine/engine.h"
#include "server/model_text.h"
#include "server/server.h"
#include "testmodel/demo.h"

namespace {

struct ServeArgs {
  std::string model;
  ds::ServerOptions server;
  ds::EngineOptions engine;
  std::string cache_dir;
};

// What the signal thread and serve() share.
struct Shutdown {
  std::mutex mu;  // protects everything below
  ds::Server* server = nullptr;  // set while serving
  bool finishing = false;        // serve() is returning: a wake-up, not a request to stop
};

ds::Status serve(const ServeArgs& args) {
  // Block SIGINT/SIGTERM before any thread exists (model loading starts worker pools), so every
  // thread inherits the mask and only the waiter below receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  Shutdown shutdown;
  std::thread waiter([&shutdown, set] {
    int sig = 0;
    sigwait(&set, &sig);
    std::lock_guard<std::mutex> lock(shutdown.mu);
    if (shutdown.finishing) return;
    if (!shutdown.server) std::_Exit(128 + sig);  // still loading: nothing to clean up
    DS_LOG_INFO("signal {}: shutting down", sig);
    shutdown.server->stop();
  });
  auto finish = [&](ds::Status status) {
    {
      std::lock_guard<std::mutex> lock(shutdown.mu);
      shutdown.server = nullptr;
      shutdown.finishing = true;
    }
    // Wakes the waiter if it is still waiting; otherwise the signal stays blocked and pending.
    kill(getpid(), SIGTERM);
    waiter.join();
    return status;
  };

  std::string model = args.model;
  if (model.empty()) {
    std::string dir = args.cache_dir.empty() ? ds::testmodel::default_cache_dir() : args.cache_dir;
    DS_LOG_INFO("no model given: using the built-in demo model (cached in {})", dir);
    auto demo = ds::testmodel::ensure_demo_model(dir);
    if (!demo.is_ok()) return finish(demo.status());
    model = *demo;
  }
  auto text = ds::model_text_open(model);
  if (!text.is_ok()) return finish(text.status());
  auto engine = ds::engine_open(model, args.engine);
  if (!engine.is_ok()) return finish(engine.status());

  ds::ServerOptions options = args.server;
  if (options.model_id.empty()) options.model_id = std::filesystem::path(model).stem().string();
  ds::Server server(options, **engine, **text);
  ds::Status bound = server.bind();
  if (!bound.is_ok()) return finish(bound);
  {
    std::lock_guard<std::mutex> lock(shutdown.mu);
    shutdown.server = &server;
  }
  std::printf("deltaserve: listening on http://%s:%d (model %s)\n", options.host.c_str(), server.port(),
              options.model_id.c_str());
  std::fflush(stdout);
  return finish(server.run());
}

void setup(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ServeArgs>();
  app.add_option("model", args->model, "GGUF model file (default: the built-in demo model)");
  app.add_option("--host", args->server.host, "Address to bind")->capture_default_str();
  app.add_option("--port", args->server.port, "TCP port (0 = any free port)")->capture_default_str();
  app.add_option("--api-key", args->server.api_key,
                 "Require this key on every endpoint but /health (Authorization: Bearer KEY or x-api-key: KEY)");
  app.add_option("--ctx-size,-c", args->engine.n_ctx,
                 "Context per request in tokens (0 = the model's training context, capped at 32768)")
      ->capture_default_str();
  app.add_option("--threads,-t", args->engine.n_threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_option("--device", args->engine.device, "Compute device: cpu or cuda:N")->capture_default_str();
  app.add_flag_function(
      "--no-cuda-graph", [args](int64_t) { args->engine.cuda_graphs = false; },
      "CUDA: run every decode step op by op instead of replaying a captured graph");
  app.add_option("--kv-type", args->engine.kv_type,
                 "Attention KV cache type: f16, f32, q8_0 or q4_0 (q8_0 / q4_0: head_dim a multiple of 32) "
                 "(default f16 on CUDA, f32 on the CPU)");
  app.add_option("--kv-cache-dir", args->engine.kv_cache_dir,
                 "Directory for prefix snapshots on disk; they survive restarts (default: off)");
  app.add_option_function<int64_t>(
         "--cache-ram,--cache-ram-mib", [args](int64_t mib) { args->engine.cache_ram_bytes = mib < 0 ? -1 : mib << 20; },
         "In-memory prefix snapshot budget in MiB (-1 = 25% of available RAM, 0 = off)")
      ->default_str("-1");
  app.add_option_function<int64_t>(
         "--kv-cache-disk-budget,--kv-cache-disk-mib", [args](int64_t mib) { args->engine.kv_cache_disk_budget = mib <= 0 ? 0 : uint64_t(mib) << 20; },
         "Disk snapshot budget in MiB (0 = unlimited)")
      ->default_str("0");
  app.add_option("--cache-checkpoint-every,--checkpoint-every", args->engine.checkpoint_every,
                 "Snapshot interval inside long prompts in tokens (0 = only at turn boundaries)")
      ->capture_default_str();
  app.add_option("--prefill-chunk", args->engine.prefill_chunk,
                 "Tokens per prefill chunk (0 = auto: 256 on the CPU; on CUDA 4096 on devices of 28 GiB or "
                 "more, else 1024)")
      ->capture_default_str();
  ds::cli::add_draft_options(app, args->engine);
  app.add_option("--max-queue", args->server.max_queue,
                 "Requests that may wait for the engine; more get 503 with Retry-After")
      ->capture_default_str();
  app.add_option("--max-body-bytes", args->server.max_body_bytes, "Largest accepted request body; larger gets 413")
      ->capture_default_str();
  app.add_option("--sse-ping-seconds", args->server.sse_ping_seconds,
                 "Keep-alive comment interval on silent streams (long prefills, queue waits)")
      ->capture_default_str();
  app.add_option("--model-id", args->server.model_id, "Model id reported by /v1/models (default: the file stem)");
  app.add_option("--model-alias", args->server.model_aliases,
                 "Further model names accepted in requests, e.g. the name your agent sends (repeatable)");
  app.add_option("--cache-dir", args->cache_dir, "Where the demo model is generated (default: the user cache)");
  app.callback([args, &exit_code] { exit_code = ds::cli::report(serve(*args)); });
}

ds::cli::Registration reg("serve", "Serve the OpenAI and Anthropic HTTP APIs for a model", setup);

}  // namespace
