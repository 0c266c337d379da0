// Malformed requests never crash the server and always get a JSON error in the endpoint's style:
// valid bodies of every endpoint are mutated (values replaced by other types, keys dropped, text
// truncated) with a fixed seed, and very deep nesting and odd encodings are sent as well.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "server_test_fakes.h"

namespace ds {
namespace {

using json = nlohmann::ordered_json;
using testing_fakes::TestServer;

const json kSamples[] = {
    json::parse(R"({"model":"test-model","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}],
      "tool_choice":"auto","stop":["x"],"max_tokens":5,"temperature":0.5,"stream":false,"response_format":{"type":"json_object"}})"),
    json::parse(R"({"model":"test-model","prompt":"abc","max_tokens":4,"stop":"q","stream":false})"),
    json::parse(R"({"model":"test-model","instructions":"i","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"}]},
      {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],
      "tools":[{"type":"function","name":"f","parameters":{}},{"type":"web_search"}],"max_output_tokens":4,"reasoning":{"effort":"low"}})"),
    json::parse(R"({"model":"test-model","max_tokens":4,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"x"},
      {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],
      "tool_choice":{"type":"auto"},"thinking":{"type":"enabled","budget_tokens":100},"stop_sequences":["z"]})"),
};
const char* kPaths[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"};

json random_value(std::mt19937& rng) {
  switch (rng() % 7) {
    case 0: return nullptr;
    case 1: return static_cast<int>(rng() % 2000) - 1000;
    case 2: return -1e300;
    case 3: return "str\xC3";
    case 4: return json::array({1, "a", nullptr});
    case 5: return json::object({{"type", "weird"}});
    default: return rng() % 2 == 0;
  }
}

// Replaces or removes one randomly chosen node of `j` (pre-order walk).
void mutate(json& j, std::mt19937& rng, int& countdown) {
  if (countdown-- == 0) {
    j = random_value(rng);
    return;
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (countdown == 0 && rng() % 3 == 0) {
        j.erase(it);
        countdown = -1;
        return;
      }
      mutate(it.value(), rng, countdown);
      if (countdown < 0) return;
    }
  } else if (j.is_array()) {
    for (auto& e : j) {
      mutate(e, rng, countdown);
      if (countdown < 0) return;
    }
  }
}

void expect_error_shape(const std::string& path, int status, const std::string& body) {
  if (status == 200) return;
  json j = json::parse(body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << path << " " << status << ": " << body;
  if (path == "/v1/messages") {
    EXPECT_EQ(j.value("type", ""), "error") << body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << body;
  } else {
    EXPECT_TRUE(j["error"]["message"].is_string()) << body;
  }
}

TEST(ServerRobust, MutatedBodiesGetCleanAnswers) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "</think>ok"; };
  auto c = s.client();
  std::mt19937 rng(12345);
  int n_ok = 0, n_err = 0;
  for (int round = 0; round < 60; round++) {
    for (int k = 0; k < 4; k++) {
      json body = kSamples[k];
      int countdown = static_cast<int>(rng() % 40);
      mutate(body, rng, countdown);
      std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
      if (round % 5 == 4) text = text.substr(0, rng() % (text.size() + 1));  // truncated
      auto r = c.Post(kPaths[k], text, "application/json");
      ASSERT_TRUE(r) << "no answer (crash?) for " << kPaths[k] << ": " << text;
      ASSERT_TRUE(r->status == 200 || r->status == 400 || r->status == 404) << r->status << " " << text << " -> " << r->body;
      expect_error_shape(kPaths[k], r->status, r->body);
      (r->status == 200 ? n_ok : n_err)++;
    }
  }
  EXPECT_GT(n_ok, 0);
  EXPECT_GT(n_err, 0);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(ServerRobust, DeepNestingAndOddBodies) {
  TestServer s;
  auto c = s.client();
  std::string deep = "{\"messages\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  auto r = c.Post("/v1/chat/completions", deep, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  expect_error_shape("/v1/chat/completions", r->status, r->body);
  // Brackets inside strings do not count as nesting.
  json ok{{"messages", json::array({{{"role", "user"}, {"content", std::string(500, '[')}}})}};
  EXPECT_EQ(c.Post("/v1/chat/completions", ok.dump(), "application/json")->status, 200);
  for (const char* body : {"", "null", "\"just a string\"", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}",
                           "{\"model\": \"test-model\", \"messages\": [], \"extra\": 1}"}) {
    for (const char* path : kPaths) {
      auto res = c.Post(path, body, "application/json");
      ASSERT_TRUE(res) << path << " " << body;
      EXPECT_TRUE(res->status == 200 || res->status == 400) << path << " " << body << " -> " << res->status;
      expect_error_shape(path, res->status, res->body);
    }
  }
  auto count = c.Post("/v1/messages/count_tokens", kSamples[3].dump(), "application/json");
  ASSERT_TRUE(count);
  EXPECT_EQ(count->status, 200);
  EXPECT_GT(json::parse(count->body)["input_tokens"].get<int>(), 0);
  EXPECT_EQ(s.engine.overlap_.load(), false);
}

}  // namespace
}  // namespace ds
