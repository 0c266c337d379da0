// The HTTP server: OpenAI (chat completions, completions, responses), Anthropic (messages), model
// listing, health and Prometheus metrics over one engine. Non-obvious choice: HTTP threads never call
// the engine; they queue a job (bounded, FIFO, 503 + Retry-After when full) and then only write bytes,
// sending keep-alives while they wait and cancelling the job when a write to their client fails.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "server/model_text.h"

namespace ds {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0 = any free port (see Server::port())
  std::string api_key;                  // "" = no authentication
  int32_t max_queue = 16;               // requests waiting for the engine before 503
  int64_t max_body_bytes = 16 << 20;    // request bodies above this get 413
  double sse_ping_seconds = 10;         // keep-alive comment interval while a stream is silent
  std::string model_id;                 // reported id; accepted in requests
  std::vector<std::string> model_aliases;  // further accepted model names
};

class Server {
 public:
  // `engine` and `text` must outlive the server.
  Server(ServerOptions options, Engine& engine, const ModelText& text);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port. Errors: address in use or not resolvable (kIoError).
  Status bind();
  int port() const;
  // Serves until stop(); returns when the listener has closed.
  Status run();
  // Thread-safe: stops accepting, cancels queued and running generations.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds
