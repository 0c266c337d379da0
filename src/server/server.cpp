// HTTP front end: routing, authentication, body limits, error bodies in each API's style, the
// generation queue and the streaming/non-streaming response writers. Non-obvious choice: non-streaming
// responses are sent chunked and, while the generation runs, a space is written every second (JSON
// allows leading whitespace), so a client that hung up is noticed by a failed write and its
// generation is cancelled, exactly as for streams. The status line (200) is committed then, so every
// request error that can be known up front is checked before the job is queued.
#include "server/server.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include <fmt/format.h>
#include <httplib.h>

#include "core/log.h"
#include "server/api_common.h"
#include "server/metrics.h"
#include "server/request_queue.h"

namespace ds {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollInterval{100};
constexpr std::chrono::milliseconds kProbeInterval{1000};

// State one request shares between its HTTP thread and the engine worker. The worker only appends
// stream bytes to `pending`; the HTTP thread does every socket write, so a slow or stuck client never
// blocks the engine.
struct Exchange {
  PreparedRequest prep;
  std::string request_id;
  std::string path;
  std::mutex mu;  // protects everything below, and all use of prep.formatter
  std::condition_variable cv;  // pending grew, or the generation finished
  std::string pending;  // stream bytes not yet written to the client
  bool failed = false;  // a write to the client failed: it is gone
  bool finished = false;  // the worker is done (outcome or status set)
  bool ran = false;     // the worker ran the job (a job cancelled while queued is skipped)
  Status status;
  GenerationOutcome outcome;
};

const char* finish_name(GenerationFinish f) {
  switch (f) {
    case GenerationFinish::kStop: return "stop";
    case GenerationFinish::kLength: return "length";
    case GenerationFinish::kToolCalls: return "tool_calls";
    case GenerationFinish::kCancelled: return "cancelled";
  }
  return "?";
}

ApiStyle style_for(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ApiStyle::kAnthropic : ApiStyle::kOpenAI;
}

}  // namespace

struct Server::Impl {
  using PrepareFn = Result<PreparedRequest> (*)(const ApiContext&, const json&);

  Impl(ServerOptions o, Engine& e, const ModelText& t)
      : options(std::move(o)), engine(e), text(t), queue(std::max<int32_t>(options.max_queue, 0)) {
    ctx.text = &text;
    ctx.info = engine.info();
    ctx.model_id = options.model_id.empty() ? ctx.info.model_name : options.model_id;
    ctx.model_names = {ctx.model_id, ctx.info.model_name, "default"};
    for (const auto& a : options.model_aliases) ctx.model_names.push_back(a);
  }

  void send_error(httplib::Response& res, ApiStyle style, int code, const std::string& message) {
    res.status = code;
    res.set_content(json_text(error_body(style, code, message)), "application/json");
    if (code == 503) res.set_header("Retry-After", "1");
  }

  bool authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    if (req.get_header_value("x-api-key") == options.api_key) return true;
    std::string auth = req.get_header_value("Authorization");
    return auth == "Bearer " + options.api_key;
  }

  void handle_generate(const httplib::Request& req, httplib::Response& res, PrepareFn prepare);
  void install_routes();

  ServerOptions options;
  Engine& engine;
  const ModelText& text;
  ApiContext ctx;
  ServerMetrics metrics;
  GenerationQueue queue;
  httplib::Server http;
  std::atomic<int64_t> next_id{1};
  int64_t started_at = unix_time();
  int bound_port = -1;
};

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, PrepareFn prepare) {
  ApiStyle style = style_for(req.path);
  auto ex = std::make_shared<Exchange>();
  ex->request_id = fmt::format("req-{}", next_id.fetch_add(1));
  ex->path = req.path;
  res.set_header("X-Request-Id", ex->request_id);

  Result<json> body = parse_body(req.body);
  if (!body.is_ok()) return send_error(res, style, 400, body.status().message());
  Status prepared;
  try {
    Result<PreparedRequest> p = prepare(ctx, *body);
    if (p.is_ok()) ex->prep = std::move(p).value();
    prepared = p.status();
  } catch (const json::exception& e) {
    prepared = invalid_argument("malformed request: {}", e.what());
  }
  if (!prepared.is_ok()) return send_error(res, style, http_status_for(prepared), prepared.message());

  GenerationSpec& spec = ex->prep.spec;
  const int64_t n_prompt = static_cast<int64_t>(spec.prompt.size());
  const int64_t n_ctx = ctx.info.n_ctx;
  if (n_prompt == 0) return send_error(res, style, 400, "the prompt is empty");
  if (n_ctx > 0 && n_prompt >= n_ctx) {
    return send_error(res, style, 400,
                      fmt::format("the prompt is {} tokens, the context holds {} tokens (--ctx-size)", n_prompt, n_ctx));
  }
  const int64_t room = n_ctx > 0 ? n_ctx - n_prompt : INT32_MAX;
  spec.max_tokens = static_cast<int32_t>(ex->prep.max_tokens_given ? std::min<int64_t>(spec.max_tokens, room) : room);
  if (ex->prep.stream) ex->pending = ex->prep.formatter->stream_begin();

  DS_LOG_DEBUG("{} {} queued: prompt {} tokens, max_tokens {}, stream {}", ex->request_id, req.path, n_prompt,
               spec.max_tokens, ex->prep.stream);
  auto submitted = queue.submit([this, ex](const GenerationJob& job) {
    EventSink sink;
    if (ex->prep.stream) {
      sink = [ex](const std::vector<OutputEvent>& events) {
        std::lock_guard<std::mutex> lock(ex->mu);
        if (ex->failed) return false;
        ex->pending += ex->prep.formatter->stream_events(events);
        ex->cv.notify_one();
        return true;
      };
    }
    Result<GenerationOutcome> r = run_generation(engine, text, ex->prep.spec, sink, [&job] { return job.cancelled(); });
    std::lock_guard<std::mutex> lock(ex->mu);
    ex->ran = true;
    ex->finished = true;
    ex->cv.notify_one();
    if (!r.is_ok()) {
      ex->status = r.status();
      DS_LOG_WARN("{} {} failed: {}", ex->request_id, ex->path, r.status().to_string());
      return;
    }
    ex->outcome = std::move(r).value();
    if (ex->failed) ex->outcome.finish = GenerationFinish::kCancelled;
    metrics.count_generation(ex->outcome);
    const GenerationOutcome& o = ex->outcome;
    DS_LOG_INFO("{} {} prompt {} (cached {}) completion {} tokens, prefill {:.1f} ms, decode {:.1f} ms, finish {}",
                ex->request_id, ex->path, o.prompt_tokens, o.cached_tokens, o.completion_tokens, o.prefill_ms,
                o.decode_ms, finish_name(o.finish));
  });
  if (!submitted.is_ok()) return send_error(res, style, 503, submitted.status().message());
  std::shared_ptr<GenerationJob> job = std::move(submitted).value();
  const auto ping = std::chrono::milliseconds(static_cast<int64_t>(std::max(0.05, options.sse_ping_seconds) * 1000));

  // If the response is dropped before the provider ran (client gone while headers were written),
  // the releaser still cancels the job.
  auto release = [job](bool success) {
    if (!success) job->cancel();
  };
  if (ex->prep.stream) {
    res.set_chunked_content_provider(
        "text/event-stream",
        [ex, job, ping](size_t, httplib::DataSink& sink) {
          auto last_write = Clock::now();
          bool gone = false;
          for (;;) {
            std::string chunk;
            bool finished = false;
            {
              std::unique_lock<std::mutex> lock(ex->mu);
              ex->cv.wait_for(lock, kPollInterval, [&] { return !ex->pending.empty() || ex->finished; });
              // A job cancelled while it waited is skipped: done without ever finishing. (The
              // worker sets `finished` before the job counts as done, so this cannot misfire.)
              if (!ex->finished && job->wait_done(std::chrono::milliseconds(0))) return false;
              chunk.swap(ex->pending);
              finished = ex->finished;  // the worker appends nothing after this
              if (finished) {
                chunk += ex->status.is_ok() ? ex->prep.formatter->stream_end(ex->outcome)
                                            : ex->prep.formatter->stream_error(ex->status);
              }
            }
            if (!gone && chunk.empty() && Clock::now() - last_write >= ping) chunk = ": ping\n\n";
            if (!gone && !chunk.empty()) {
              if (sink.write(chunk.data(), chunk.size())) {
                last_write = Clock::now();
              } else {
                gone = true;
                std::lock_guard<std::mutex> lock(ex->mu);
                ex->failed = true;
                job->cancel();
              }
            }
            if (finished) break;
          }
          if (gone) return false;
          sink.done();
          return true;
        },
        release);
    res.set_header("Cache-Control", "no-cache");
    return;
  }
  res.set_chunked_content_provider(
      "application/json",
      [ex, job, style](size_t, httplib::DataSink& sink) {
        auto last_probe = Clock::now();
        bool gone = false;
        while (!job->wait_done(kPollInterval)) {
          if (!gone && Clock::now() - last_probe >= kProbeInterval) {
            last_probe = Clock::now();
            if (!sink.write(" ", 1)) {
              gone = true;
              job->cancel();
            }
          }
        }
        std::lock_guard<std::mutex> lock(ex->mu);
        if (gone || !ex->ran) return false;
        json out = ex->status.is_ok() ? ex->prep.formatter->response(ex->outcome)
                                      : error_body(style, http_status_for(ex->status), ex->status.message());
        std::string s = json_text(out);
        if (!sink.write(s.data(), s.size())) return false;
        sink.done();
        return true;
      },
      release);
}

void Server::Impl::install_routes() {
  // Every waiting request holds an HTTP thread, plus room for keep-alive connections and quick
  // answers (health, metrics, 503s) while the queue is full.
  const int32_t n_threads = std::min<int32_t>(std::max<int32_t>(options.max_queue, 0) + 33, 1024);
  http.new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
  http.set_payload_max_length(static_cast<size_t>(std::max<int64_t>(options.max_body_bytes, 1)));
  http.set_read_timeout(30, 0);
  // A client that stops reading holds its HTTP thread (never the engine); give up on it after 10 s.
  http.set_write_timeout(10, 0);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health" || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, style_for(req.path), 401, "missing or invalid API key (Authorization: Bearer or x-api-key)");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return;
    std::string msg = res.status == 404   ? fmt::format("no route for {} {}", req.method, req.path)
                      : res.status == 413 ? fmt::format("request body exceeds {} bytes (--max-body-bytes)", options.max_body_bytes)
                                          : fmt::format("HTTP {}", res.status);
    send_error(res, style_for(req.path), res.status, msg);
  });
  http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    DS_LOG_ERROR("{} {}: unhandled exception: {}", req.method, req.path, what);
    send_error(res, style_for(req.path), 500, "internal error: " + what);
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.count_request(req.path, res.status);
    DS_LOG_DEBUG("{} {} -> {}", req.method, req.path, res.status);
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(queue.waiting(), queue.in_flight(), engine.stats()), "text/plain; version=0.0.4");
  });
  auto model_json = [this] {
    return json{{"id", ctx.model_id}, {"object", "model"}, {"created", started_at}, {"owned_by", "deltaserve"},
                {"context_length", ctx.info.n_ctx}};
  };
  http.Get("/v1/models", [model_json](const httplib::Request&, httplib::Response& res) {
    res.set_content(json_text(json{{"object", "list"}, {"data", json::array({model_json()})}}), "application/json");
  });
  http.Get(R"(/v1/models/(.+))", [this, model_json](const httplib::Request& req, httplib::Response& res) {
    Status s = check_model(ctx, std::optional<std::string>(req.matches[1].str()));
    if (!s.is_ok()) return send_error(res, ApiStyle::kOpenAI, 404, s.message());
    res.set_content(json_text(model_json()), "application/json");
  });
  auto route = [this](const char* path, PrepareFn fn) {
    http.Post(path, [this, fn](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, fn); });
  };
  route("/v1/chat/completions", prepare_chat_completions);
  route("/v1/completions", prepare_completions);
  route("/v1/responses", prepare_responses);
  route("/v1/messages", prepare_messages);
  // Anthropic token counting (Claude Code asks before long requests): the rendered prompt's length.
  http.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    Result<json> body = parse_body(req.body);
    if (!body.is_ok()) return send_error(res, ApiStyle::kAnthropic, 400, body.status().message());
    Status s;
    int64_t n = 0;
    try {
      Result<PreparedRequest> p = prepare_messages(ctx, *body);
      s = p.status();
      if (p.is_ok()) n = static_cast<int64_t>(p->spec.prompt.size());
    } catch (const json::exception& e) {
      s = invalid_argument("malformed request: {}", e.what());
    }
    if (!s.is_ok()) return send_error(res, ApiStyle::kAnthropic, http_status_for(s), s.message());
    res.set_content(json_text(json{{"input_tokens", n}}), "application/json");
  });
}

Server::Server(ServerOptions options, Engine& engine, const ModelText& text)
    : impl_(std::make_unique<Impl>(std::move(options), engine, text)) {
  impl_->install_routes();
}

Server::~Server() { stop(); }

Status Server::bind() {
  // A client that hangs up must surface as a failed write, not kill the process.
  ::signal(SIGPIPE, SIG_IGN);
  const ServerOptions& o = impl_->options;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    port = -1;
  }
  if (port < 0) return io_error("cannot listen on {}:{} (address in use or not available)", o.host, o.port);
  impl_->bound_port = port;
  return Status::ok();
}

int Server::port() const { return impl_->bound_port; }

Status Server::run() {
  if (impl_->bound_port < 0) DS_TRY(bind());
  DS_LOG_INFO("serving {} on http://{}:{} (queue {}, api key {})", impl_->ctx.model_id, impl_->options.host,
              impl_->bound_port, impl_->options.max_queue, impl_->options.api_key.empty() ? "off" : "on");
  if (!impl_->http.listen_after_bind()) return io_error("HTTP listener on port {} failed", impl_->bound_port);
  return Status::ok();
}

void Server::stop() {
  impl_->queue.cancel_all();
  impl_->http.stop();
}

}  // namespace ds
