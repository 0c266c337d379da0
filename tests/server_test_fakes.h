// Test doubles for the HTTP server tests: a byte-level ModelText (one token per byte, plus two
// control tokens) with a transparent chat rendering, and a scripted Engine whose reply is a function
// of the prompt text. Non-obvious choice: with one token per byte every token boundary occurs, so
// stop strings, markers and UTF-8 sequences get split at every possible place by construction.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>

#include "engine/engine.h"
#include "server/model_text.h"
#include "server/server.h"

namespace ds::testing_fakes {

constexpr int32_t kImEnd = 256;  // "<|im_end|>"
constexpr int32_t kEos = 257;    // "<|endoftext|>"

class ByteText : public ModelText {
 public:
  Result<std::string> render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& o) const override {
    std::string out;
    if (!o.tools.empty()) out += "<|im_start|>system\nTOOLS " + o.tools.dump() + "<|im_end|>\n";
    for (const auto& m : messages) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
        return invalid_argument("unknown role {}", m.role);
      }
      out += "<|im_start|>" + m.role + "\n";
      if (!m.reasoning.empty()) out += "<think>" + m.reasoning + "</think>";
      out += m.content;
      for (const auto& c : m.tool_calls) out += "<tool_call>" + c.name + " " + c.arguments.dump() + "</tool_call>";
      if (!m.tool_call_id.empty()) out += " [id " + m.tool_call_id + "]";
      out += "<|im_end|>\n";
    }
    if (o.add_generation_prompt) out += o.enable_thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    return out;
  }
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const override {
    std::vector<int32_t> ids;
    constexpr std::string_view kEnd = "<|im_end|>";
    for (size_t i = 0; i < text.size(); i++) {
      if (allow_special && text.substr(i, kEnd.size()) == kEnd) {
        ids.push_back(kImEnd);
        i += kEnd.size() - 1;
        continue;
      }
      ids.push_back(static_cast<unsigned char>(text[i]));
    }
    return ids;
  }
  std::string token_bytes(int32_t id) const override {
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    return "";
  }
  std::vector<int32_t> stop_tokens() const override { return {kImEnd, kEos}; }

  static std::string decode(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
      if (id < 256) s += static_cast<char>(id);
      else if (id == kImEnd) s += "<|im_end|>";
    }
    return s;
  }
};

// Replies with reply_fn(prompt text) as byte tokens followed by <|im_end|>.
class ScriptedEngine : public Engine {
 public:
  ScriptedEngine() {
    info_.model_name = "test-model";
    info_.architecture = "qwen35";
    info_.n_ctx = 4096;
    info_.n_vocab = 258;
    info_.eos_tokens = {kEos};
  }
  const EngineInfo& info() const override { return info_; }

  Result<GenerateResult> generate(const GenerateRequest& req) override {
    if (active_.fetch_add(1) != 0) overlap_ = true;
    struct Leave {
      std::atomic<int>& a;
      ~Leave() { a.fetch_sub(1); }
    } leave{active_};
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_prompt_ = ByteText::decode(req.prompt);
      last_request_ = req;
      calls_++;
    }
    if (static_cast<int64_t>(req.prompt.size()) >= info_.n_ctx) return invalid_argument("prompt too long");
    GenerateResult r;
    r.prompt_tokens = static_cast<int64_t>(req.prompt.size());
    r.cached_tokens = r.prompt_tokens / 2;
    r.prefill_ms = 1;
    std::string reply = reply_fn ? reply_fn(ByteText::decode(req.prompt)) : std::string("Hello!");
    std::vector<int32_t> script;
    for (unsigned char c : reply) script.push_back(c);
    script.push_back(kImEnd);
    if (prefill_delay.count() > 0) std::this_thread::sleep_for(prefill_delay);
    r.finish = FinishReason::kLength;
    for (int32_t t : script) {
      if (req.cancelled && req.cancelled()) {
        r.finish = FinishReason::kCancelled;
        cancelled_++;
        break;
      }
      if (static_cast<int32_t>(r.tokens.size()) >= req.max_tokens) break;
      if (token_delay.count() > 0) std::this_thread::sleep_for(token_delay);
      r.tokens.push_back(t);
      bool more = req.on_token(t);
      bool is_stop = false;
      for (int32_t s : req.stop_tokens) is_stop |= s == t;
      if (is_stop) {
        r.finish = FinishReason::kStop;
        break;
      }
      if (!more) {
        bool c = req.cancelled && req.cancelled();
        r.finish = c ? FinishReason::kCancelled : FinishReason::kStop;
        if (c) cancelled_++;
        break;
      }
    }
    r.decode_ms = static_cast<double>(r.tokens.size());
    return r;
  }

  EngineStats stats() const override {
    EngineStats s;
    s.cache_ram_hits = 3;  // fixed values the metrics test looks for
    s.cache_disk_bytes = 7;
    s.graph_captured_steps = 2;
    return s;
  }

  std::string last_prompt() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_prompt_;
  }
  GenerateRequest last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_request_;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

  std::function<std::string(const std::string& prompt)> reply_fn;
  std::chrono::milliseconds token_delay{0};
  std::chrono::milliseconds prefill_delay{0};
  std::atomic<int> cancelled_{0};
  std::atomic<bool> overlap_{false};  // two generations ran at once (must never happen)
  EngineInfo info_;

 private:
  std::atomic<int> active_{0};
  std::mutex mu_;
  std::string last_prompt_;
  GenerateRequest last_request_;
  int calls_ = 0;
};

// A Server on a free port, running on its own thread for the test's lifetime.
class TestServer {
 public:
  explicit TestServer(ServerOptions options = {}) {
    options.port = 0;
    if (options.model_id.empty()) options.model_id = "test-model";
    server_ = std::make_unique<Server>(options, engine, text);
    Status s = server_->bind();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    thread_ = std::thread([this] { (void)server_->run(); });
    for (int i = 0; i < 200; i++) {
      httplib::Client c("127.0.0.1", server_->port());
      if (auto r = c.Get("/health"); r && r->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~TestServer() {
    server_->stop();
    thread_.join();
  }
  int port() const { return server_->port(); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(20, 0);
    return c;
  }

  ScriptedEngine engine;
  ByteText text;

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

// "data:" payloads of an SSE body, in order (comments and event lines skipped).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    pos = end + 1;
  }
  return out;
}

}  // namespace ds::testing_fakes
