// Prometheus text exposition of the server counters (format version 0.0.4).
#include "server/metrics.h"

#include <fmt/format.h>

#include <type_traits>

namespace ds {
namespace {

const char* endpoint_label(const std::string& path) {
  static const char* kKnown[] = {"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions",
                                 "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"};
  for (const char* k : kKnown) {
    if (path == k) return k;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models";
  return "other";
}

}  // namespace

void ServerMetrics::count_request(const std::string& path, int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  requests_[{endpoint_label(path), http_status}]++;
}

void ServerMetrics::count_generation(const GenerationOutcome& o) {
  std::lock_guard<std::mutex> lock(mu_);
  generations_++;
  if (o.finish == GenerationFinish::kCancelled) cancelled_++;
  prompt_tokens_ += o.prompt_tokens;
  completion_tokens_ += o.completion_tokens;
  cached_tokens_ += o.cached_tokens;
  prefill_seconds_ += o.prefill_ms / 1000.0;
  decode_seconds_ += o.decode_ms / 1000.0;
}

std::string ServerMetrics::render(int32_t queue_depth, int32_t in_flight, const EngineStats& engine) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto header = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // A metric of one unlabelled value: its header and its line (seconds with microsecond digits).
  auto scalar = [&](const char* name, const char* type, const char* help, auto value) {
    header(name, type, help);
    if constexpr (std::is_floating_point_v<decltype(value)>) {
      out += fmt::format("{} {:.6f}\n", name, value);
    } else {
      out += fmt::format("{} {}\n", name, value);
    }
  };
  header("deltaserve_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, n] : requests_) {
    out += fmt::format("deltaserve_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  }
  scalar("deltaserve_generations_total", "counter", "Generations run by the engine.", generations_);
  scalar("deltaserve_generations_cancelled_total", "counter", "Generations cancelled because the client left.", cancelled_);
  scalar("deltaserve_prompt_tokens_total", "counter", "Prompt tokens of finished generations.", prompt_tokens_);
  scalar("deltaserve_cached_prompt_tokens_total", "counter", "Prompt tokens restored from snapshots, not prefilled.", cached_tokens_);
  scalar("deltaserve_completion_tokens_total", "counter", "Generated tokens.", completion_tokens_);
  scalar("deltaserve_prefill_seconds_total", "counter", "Time spent in prefill.", prefill_seconds_);
  scalar("deltaserve_decode_seconds_total", "counter", "Time spent decoding.", decode_seconds_);
  scalar("deltaserve_queue_depth", "gauge", "Requests waiting for the engine.", queue_depth);
  scalar("deltaserve_requests_in_flight", "gauge", "Generations running now (0 or 1).", in_flight);
  header("deltaserve_cache_hits_total", "counter", "Prompts that restored a prefix snapshot, by tier.");
  out += fmt::format("deltaserve_cache_hits_total{{tier=\"ram\"}} {}\n", engine.cache_ram_hits);
  out += fmt::format("deltaserve_cache_hits_total{{tier=\"disk\"}} {}\n", engine.cache_disk_hits);
  scalar("deltaserve_cache_misses_total", "counter", "Prompts with no usable prefix snapshot.", engine.cache_misses);
  scalar("deltaserve_snapshots_saved_total", "counter", "Prefix snapshots saved.", engine.snapshots_saved);
  scalar("deltaserve_draft_tokens_total", "counter", "Speculative draft tokens verified.", engine.draft_tokens);
  scalar("deltaserve_draft_accepted_tokens_total", "counter", "Speculative draft tokens accepted (decode steps saved).", engine.accepted_tokens);
  header("deltaserve_graph_steps_total", "counter",
         "CUDA decode and verify steps: replayed from a captured graph, captured, or run op by op.");
  out += fmt::format("deltaserve_graph_steps_total{{run=\"replayed\"}} {}\n", engine.graph_replayed_steps);
  out += fmt::format("deltaserve_graph_steps_total{{run=\"captured\"}} {}\n", engine.graph_captured_steps);
  out += fmt::format("deltaserve_graph_steps_total{{run=\"op_by_op\"}} {}\n", engine.graph_op_by_op_steps);
  header("deltaserve_cache_bytes", "gauge", "Bytes held by prefix snapshots, by tier.");
  out += fmt::format("deltaserve_cache_bytes{{tier=\"ram\"}} {}\n", engine.cache_ram_bytes);
  out += fmt::format("deltaserve_cache_bytes{{tier=\"disk\"}} {}\n", engine.cache_disk_bytes);
  return out;
}

}  // namespace ds
