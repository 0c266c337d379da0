// The server over the real stack: the built-in demo model (tiny qwen35, random weights) through
// engine_open, its GGUF tokenizer and the Qwen3.5 chat template. Outputs are gibberish, so the checks
// are consistency properties: greedy repeats, streaming equals non-streaming, a repeated prompt is
// reported as cached, stop strings cut real multi-byte tokens, and context overflow is a 400.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/model_text.h"
#include "server/server.h"
#include "testmodel/demo.h"

namespace ds {
namespace {

using json = nlohmann::ordered_json;

class RealModelServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<std::string> path = testmodel::ensure_demo_model(std::string(DS_BINARY_DIR) + "/test-cache");
    ASSERT_TRUE(path.is_ok()) << path.status().to_string();
    auto text = model_text_open(*path);
    ASSERT_TRUE(text.is_ok()) << text.status().to_string();
    text_ = std::move(text).value().release();
    EngineOptions eo;
    eo.n_ctx = 2048;
    eo.n_threads = 2;
    eo.cache_ram_bytes = 64 << 20;
    auto engine = engine_open(*path, eo);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    engine_ = std::move(engine).value().release();
    ServerOptions so;
    so.port = 0;
    so.model_id = "demo";
    server_ = new Server(so, *engine_, *text_);
    ASSERT_TRUE(server_->bind().is_ok());
    thread_ = new std::thread([] { (void)server_->run(); });
  }
  static void TearDownTestSuite() {
    if (server_) server_->stop();
    if (thread_) thread_->join();
    delete thread_;
    delete server_;
    delete engine_;
    delete text_;
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  static json post(const std::string& path, const json& body, int status = 200) {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, status) << r->body;
    return json::parse(r->body, nullptr, false);
  }

  static inline ModelText* text_ = nullptr;
  static inline Engine* engine_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
};

json chat(const std::string& user, json extra = json::object()) {
  json b{{"messages", json::array({{{"role", "user"}, {"content", user}}})}, {"temperature", 0}, {"max_tokens", 12}};
  b.update(extra);
  return b;
}

TEST_F(RealModelServer, GreedyRepeatIsIdenticalAndCached) {
  json a = post("/v1/chat/completions", chat("Repeat after me: tea."));
  json b = post("/v1/chat/completions", chat("Repeat after me: tea."));
  EXPECT_EQ(a["choices"][0]["message"], b["choices"][0]["message"]);
  EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
  EXPECT_EQ(a["usage"]["completion_tokens"], 12);
  EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
}

TEST_F(RealModelServer, StreamingEqualsNonStreaming) {
  json body = chat("Name three colors.", {{"max_tokens", 16}});
  json full = post("/v1/chat/completions", body);
  body["stream"] = true;
  auto c = client();
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string content, reasoning;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    size_t end = r->body.find("\n\n", pos);
    std::string data = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    json e = json::parse(data);
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
  }
  const json& m = full["choices"][0]["message"];
  EXPECT_EQ(content, m["content"].is_null() ? "" : m["content"].get<std::string>());
  EXPECT_EQ(reasoning, m.value("reasoning_content", std::string()));
}

TEST_F(RealModelServer, StopStringCutsAcrossRealTokens) {
  json body{{"prompt", "The capital of France"}, {"temperature", 0}, {"max_tokens", 16}};
  json full = post("/v1/completions", body);
  std::string text = full["choices"][0]["text"];
  // The first run of 3 printable ASCII characters after the first character: tokens of a random
  // model rarely line up with it, so the stop string straddles token boundaries.
  size_t at = std::string::npos;
  for (size_t i = 1; i + 3 <= text.size() && at == std::string::npos; i++) {
    bool ascii = true;
    for (size_t k = 0; k < 3; k++) ascii &= text[i + k] > 32 && text[i + k] < 127;
    if (ascii) at = i;
  }
  ASSERT_NE(at, std::string::npos) << "no ASCII run in " << text;
  std::string stop = text.substr(at, 3);
  body["stop"] = stop;
  json cut = post("/v1/completions", body);
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST_F(RealModelServer, ToolHistoryRendersWithTheRealTemplate) {
  json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  json first = post("/v1/chat/completions", chat("Weather in Paris?", {{"tools", tools}}));
  json follow = chat("Weather in Paris?", {{"tools", tools}});
  follow["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                                {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                                             {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}})}});
  follow["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}});
  json second = post("/v1/chat/completions", follow);
  EXPECT_GT(second["usage"]["prompt_tokens"].get<int64_t>(), first["usage"]["prompt_tokens"].get<int64_t>());
  // A tool message with no preceding call is rejected by the template: a 400, not a crash.
  json orphan{{"messages", json::array({{{"role", "user"}, {"content", "x"}}, {{"role", "tool"}, {"tool_call_id", "c"}, {"content", "r"}}})}};
  post("/v1/chat/completions", orphan, 400);
}

TEST_F(RealModelServer, PromptBeyondContextIs400) {
  std::string longtext;
  for (int i = 0; i < 1500; i++) longtext += "word" + std::to_string(i) + " ";
  json r = post("/v1/chat/completions", chat(longtext), 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("context"), std::string::npos);
  json a = post("/v1/messages", {{"max_tokens", 5}, {"messages", json::array({{{"role", "user"}, {"content", longtext}}})}}, 400);
  EXPECT_EQ(a["type"], "error");
}

}  // namespace
}  // namespace ds

namespace ds {
namespace {

// A 4-turn conversation through the HTTP API, as an agent sends it: each request resends the whole
// history with the previous answer. Each turn must restore the previous turn's prefix (usage reports it,
// /metrics counts it), and a request that edits an earlier user message must fall back to the longest
// prefix before the edit instead of reusing stale state.
TEST_F(RealModelServer, MultiTurnConversationReusesPrefixAndEditsFallBack) {
  json messages = json::array({{{"role", "system"}, {"content", "You are terse."}}});
  const char* users[] = {"First question about tea?", "And about coffee?", "What of water?", "Finally, milk?"};
  std::vector<int64_t> prompt_tokens, cached;
  for (const char* u : users) {
    messages.push_back({{"role", "user"}, {"content", u}});
    json body{{"messages", messages}, {"temperature", 0}, {"max_tokens", 8}};
    json r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r.contains("usage")) << r.dump();
    prompt_tokens.push_back(r["usage"]["prompt_tokens"].get<int64_t>());
    cached.push_back(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>());
    messages.push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});
  }
  for (size_t t = 1; t < prompt_tokens.size(); ++t) {
    // Everything up to the previous turn's assistant header (a few tokens: "<|im_start|>assistant\n
    // <think>\n" in the demo vocabulary) is restored, and nothing beyond this prompt; each turn restores
    // more than the one before.
    EXPECT_GE(cached[t], prompt_tokens[t - 1] - 16) << "turn " << t;
    EXPECT_LT(cached[t], prompt_tokens[t]) << "turn " << t;
    EXPECT_GT(cached[t], cached[t - 1]) << "turn " << t;
  }
  // Edit the second user message and resend the 4-turn history.
  json edited = messages;
  edited.erase(edited.size() - 1);  // the last answer
  edited[3]["content"] = "And about cocoa?";
  json r = post("/v1/chat/completions", json{{"messages", edited}, {"temperature", 0}, {"max_tokens", 8}});
  const int64_t edited_cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  EXPECT_EQ(edited_cached, cached[1]);  // the prefix before the edited message, from turn 1
  EXPECT_LT(edited_cached, cached[3]);

  auto c = client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  const std::string key = "\ndeltaserve_cached_prompt_tokens_total ";
  const size_t at = m->body.find(key);
  ASSERT_NE(at, std::string::npos) << m->body;
  const int64_t total_cached = std::stoll(m->body.substr(at + key.size()));
  EXPECT_GE(total_cached, cached[1] + cached[2] + cached[3] + edited_cached);
}

}  // namespace
}  // namespace ds
