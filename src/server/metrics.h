// Server counters exported as Prometheus text on GET /metrics. Non-obvious choice: the endpoint label
// only takes the server's known routes ("other" for anything else), so a client probing random paths
// cannot grow the label set without bound.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/engine.h"
#include "server/generation.h"

namespace ds {

class ServerMetrics {
 public:
  void count_request(const std::string& path, int http_status);
  void count_generation(const GenerationOutcome& outcome);
  // `engine` adds the snapshot cache counters (hits per tier, misses, saves, bytes held).
  std::string render(int32_t queue_depth, int32_t in_flight, const EngineStats& engine) const;

 private:
  mutable std::mutex mu_;  // protects everything below
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t generations_ = 0;
  int64_t cancelled_ = 0;
  double prefill_seconds_ = 0;
  double decode_seconds_ = 0;
};

}  // namespace ds
