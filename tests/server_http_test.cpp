// HTTP behaviour of the server against the scripted engine: chat and completions (streaming and not),
// stop strings, tools, errors in the OpenAI and Anthropic shapes, auth, body limit, the bounded queue,
// disconnect cancellation, keep-alive pings and metrics.
#include <gtest/gtest.h>

#include <thread>

#include <future>

#include <nlohmann/json.hpp>

#include "server_test_fakes.h"

namespace ds {
namespace {

using json = nlohmann::ordered_json;
using testing_fakes::sse_data;
using testing_fakes::TestServer;
using namespace std::chrono_literals;

json post_json(httplib::Client& c, const std::string& path, const json& body, int expect_status,
               const httplib::Headers& headers = {}) {
  auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response from " << path;
  if (!r) return json();
  EXPECT_EQ(r->status, expect_status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r->body;
  return j;
}

json chat_body(const std::string& user, json extra = json::object()) {
  json b{{"model", "test-model"}, {"messages", json::array({{{"role", "user"}, {"content", user}}})}, {"temperature", 0}};
  b.update(extra);
  return b;
}

void expect_openai_error(const json& j) {
  ASSERT_TRUE(j.contains("error")) << j.dump();
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
}

void expect_anthropic_error(const json& j, const char* type) {
  EXPECT_EQ(j.value("type", ""), "error") << j.dump();
  EXPECT_EQ(j["error"].value("type", ""), type) << j.dump();
  EXPECT_TRUE(j["error"]["message"].is_string());
}

TEST(ServerHttp, HealthAndModels) {
  TestServer s;
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(c.Get("/v1/models/test-model")->status, 200);
  auto missing = c.Get("/v1/models/gpt-99");
  EXPECT_EQ(missing->status, 404);
  expect_openai_error(json::parse(missing->body));
  auto none = c.Get("/nowhere");
  EXPECT_EQ(none->status, 404);
  expect_openai_error(json::parse(none->body));
}

TEST(ServerHttp, ChatReasoningContentAndUsage) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "\nThinking it over.\n</think>\n\nHello there!"; };
  auto c = s.client();
  json j = post_json(c, "/v1/chat/completions", chat_body("Hi"), 200);
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "Hello there!");
  EXPECT_EQ(msg["reasoning_content"], "Thinking it over.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["object"], "chat.completion");
  // The byte-level fake makes the prompt length the rendered prompt's byte count.
  int64_t prompt_len = static_cast<int64_t>(s.engine.last_request().prompt.size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_len);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_len / 2);
  // Reply bytes + <|im_end|>.
  int64_t reply_len = static_cast<int64_t>(std::string("\nThinking it over.\n</think>\n\nHello there!").size()) + 1;
  EXPECT_EQ(j["usage"]["completion_tokens"], reply_len);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_len + reply_len);
  EXPECT_NE(s.engine.last_prompt().find("<|im_start|>user\nHi<|im_end|>"), std::string::npos);
}

TEST(ServerHttp, ChatStreamMatchesNonStreaming) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "\nA \xC3\xA9t\xC3\xA9 thought.\n</think>\n\nCaf\xC3\xA9 ol\xC3\xA9!"; };
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions",
                  chat_body("Hi", {{"stream", true}, {"stream_options", {{"include_usage", true}}}}).dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto events = sse_data(r->body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content, reasoning, finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); i++) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e.contains("usage")) usage = e["usage"];
    if (e["choices"].empty()) continue;
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "A \xC3\xA9t\xC3\xA9 thought.");
  EXPECT_EQ(content, "Caf\xC3\xA9 ol\xC3\xA9!");
  EXPECT_EQ(finish, "stop");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["prompt_tokens"], static_cast<int64_t>(s.engine.last_request().prompt.size()));
  EXPECT_TRUE(usage["prompt_tokens_details"].contains("cached_tokens"));
}

TEST(ServerHttp, StopStringsAcrossTokensAreNotEmitted) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "one two ST" "OP three four five six seven"; };
  auto c = s.client();
  json body = chat_body("count", {{"stop", json::array({"STOP", "never"})}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  json j = post_json(c, "/v1/chat/completions", body, 200);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "one two");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // Generation ended at the stop string, not at the end of the script.
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 20);
  body["stream"] = true;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  std::string streamed;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") continue;
    json e = json::parse(d);
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content")) {
      streamed += e["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(streamed, "one two");
}

// Regression: when the generation finished between the stream writer taking the buffered bytes and
// checking whether the job was done, the taken bytes (the last deltas) were dropped.
TEST(ServerHttp, StreamKeepsLastChunkWhenGenerationEndsDuringPoll) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "</think>\n\nabcdefghijklmnopqrstuvwxyz"; };
  auto c = s.client();
  const std::string body = chat_body("x", {{"stream", true}}).dump();
  for (int i = 0; i < 300; i++) {
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    std::string content;
    for (const auto& d : sse_data(r->body)) {
      if (d == "[DONE]") continue;
      json e = json::parse(d);
      if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content")) {
        content += e["choices"][0]["delta"]["content"].get<std::string>();
      }
    }
    ASSERT_EQ(content, "abcdefghijklmnopqrstuvwxyz") << "request " << i;
  }
}

TEST(ServerHttp, MaxTokensGivesLength) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "abcdefghijklmnopqrstuvwxyz"; };
  auto c = s.client();
  json j = post_json(c, "/v1/chat/completions",
                     chat_body("x", {{"max_completion_tokens", 5}, {"chat_template_kwargs", {{"enable_thinking", false}}}}), 200);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "abcde");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
}

TEST(ServerHttp, SamplingParametersReachTheEngine) {
  TestServer s;
  auto c = s.client();
  post_json(c, "/v1/chat/completions",
            chat_body("x", {{"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 7}, {"min_p", 0.05}, {"seed", 1234},
                            {"presence_penalty", 0.25}, {"frequency_penalty", -0.5}, {"repetition_penalty", 1.1},
                            {"max_tokens", 9}}),
            200);
  GenerateRequest req = s.engine.last_request();
  EXPECT_FLOAT_EQ(req.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(req.sampling.top_p, 0.9f);
  EXPECT_EQ(req.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(req.sampling.min_p, 0.05f);
  EXPECT_EQ(req.sampling.seed, 1234u);
  EXPECT_FLOAT_EQ(req.sampling.presence_penalty, 0.25f);
  EXPECT_FLOAT_EQ(req.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(req.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(req.max_tokens, 9);
  // Without max_tokens the limit is the rest of the context.
  post_json(c, "/v1/chat/completions", chat_body("x"), 200);
  req = s.engine.last_request();
  EXPECT_EQ(req.max_tokens, s.engine.info_.n_ctx - static_cast<int64_t>(req.prompt.size()));
}

TEST(ServerHttp, ToolCallRoundTrip) {
  TestServer s;
  s.engine.reply_fn = [](const std::string& prompt) -> std::string {
    if (prompt.find("<tool_call>get_weather") != std::string::npos) return "</think>\n\nIt is sunny in Paris.";
    return "The user wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
           "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
  };
  json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}])");
  auto c = s.client();
  json j = post_json(c, "/v1/chat/completions", chat_body("Weather in Paris?", {{"tools", tools}}), 200);
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  const json& call = msg["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  json args = json::parse(call["function"]["arguments"].get<std::string>());
  EXPECT_EQ(args, json::parse(R"({"city":"Paris","days":2})"));
  EXPECT_NE(s.engine.last_prompt().find("TOOLS [{"), std::string::npos);

  json followup = chat_body("Weather in Paris?", {{"tools", tools}});
  followup["messages"].push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", msg["tool_calls"]}});
  followup["messages"].push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "sunny, 24C"}});
  json j2 = post_json(c, "/v1/chat/completions", followup, 200);
  EXPECT_EQ(j2["choices"][0]["message"]["content"], "It is sunny in Paris.");
  EXPECT_EQ(j2["choices"][0]["finish_reason"], "stop");
  std::string prompt = s.engine.last_prompt();
  EXPECT_NE(prompt.find("<tool_call>get_weather {\"city\":\"Paris\",\"days\":2}</tool_call>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|im_start|>tool\nsunny, 24C [id " + call["id"].get<std::string>() + "]"), std::string::npos) << prompt;
}

TEST(ServerHttp, ParallelToolCallsStreamed) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) {
    return "</think>\n\n<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n"
           "<tool_call>\n<function=b>\n</function>\n</tool_call>";
  };
  json tools = json::parse(R"([{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"x":{"type":"number"}}}}},
                              {"type":"function","function":{"name":"b","parameters":{"type":"object","properties":{}}}}])");
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", chat_body("go", {{"tools", tools}, {"stream", true}}).dump(), "application/json");
  ASSERT_TRUE(r);
  std::vector<json> calls;
  std::string finish;
  for (const auto& d : sse_data(r->body)) {
    if (d == "[DONE]") continue;
    json e = json::parse(d);
    const json& ch = e["choices"][0];
    if (ch["delta"].contains("tool_calls")) calls.push_back(ch["delta"]["tool_calls"][0]);
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[1]["index"], 1);
  EXPECT_EQ(calls[0]["function"]["name"], "a");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>())["x"], 1);
  EXPECT_EQ(calls[1]["function"]["name"], "b");
  EXPECT_EQ(finish, "tool_calls");
}

TEST(ServerHttp, ToolChoiceNamedForcesTheCall) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"; };
  json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  auto c = s.client();
  json j = post_json(c, "/v1/chat/completions",
                     chat_body("x", {{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}), 200);
  std::string prompt = s.engine.last_prompt();
  EXPECT_NE(prompt.find("</think>\n\n<tool_call>\n<function=get_weather>\n"), std::string::npos) << prompt;
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(json::parse(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "Rome");
  // A named tool that is not offered is a 400.
  json bad = post_json(c, "/v1/chat/completions",
                       chat_body("x", {{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}), 400);
  expect_openai_error(bad);
}

TEST(ServerHttp, ToolChoiceNoneHidesToolsAndParsesNothing) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "</think>\n\n<tool_call>x</tool_call>"; };
  json tools = json::parse(R"([{"type":"function","function":{"name":"f","parameters":{}}}])");
  auto c = s.client();
  json j = post_json(c, "/v1/chat/completions", chat_body("x", {{"tools", tools}, {"tool_choice", "none"}}), 200);
  EXPECT_EQ(s.engine.last_prompt().find("TOOLS"), std::string::npos);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "<tool_call>x</tool_call>");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
}

TEST(ServerHttp, JsonResponseFormatInstructsViaSystemPrompt) {
  TestServer s;
  auto c = s.client();
  json body = chat_body("x", {{"response_format", {{"type", "json_object"}}}});
  body["messages"].insert(body["messages"].begin(), json{{"role", "system"}, {"content", "Be terse."}});
  post_json(c, "/v1/chat/completions", body, 200);
  EXPECT_NE(s.engine.last_prompt().find("<|im_start|>system\nBe terse.\n\nRespond with a single valid JSON object"),
            std::string::npos)
      << s.engine.last_prompt();
}

TEST(ServerHttp, CompletionsRawText) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return " <think>raw</think> text\n\n"; };
  auto c = s.client();
  json j = post_json(c, "/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 100}, {"temperature", 0}}, 200);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], " <think>raw</think> text\n\n");
  EXPECT_EQ(s.engine.last_prompt(), "Once upon");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 9);
  auto r = c.Post("/v1/completions", json{{"prompt", "Once"}, {"stream", true}, {"max_tokens", 100}, {"stop", "text"}}.dump(),
                  "application/json");
  std::string text;
  for (const auto& d : sse_data(r->body)) {
    if (d != "[DONE]") text += json::parse(d)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, " <think>raw</think> ");
}

TEST(ServerHttp, BadRequestsGetJsonErrors) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  auto c = s.client();
  auto raw = c.Post("/v1/chat/completions", "{not json", "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  expect_openai_error(json::parse(raw->body));
  expect_openai_error(post_json(c, "/v1/chat/completions", json::array({1, 2}), 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", chat_body("x", {{"temperature", "hot"}}), 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", chat_body("x", {{"max_tokens", -3}}), 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", chat_body("x", {{"n", 2}}), 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", {{"model", "test-model"}}, 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", {{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}, 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", {{"messages", "hello"}}, 400));
  expect_openai_error(post_json(c, "/v1/chat/completions", chat_body("x", {{"stop", json::array({1})}}), 400));
  expect_openai_error(post_json(c, "/v1/completions", {{"prompt", json::array({-1})}}, 400));
  json nf = post_json(c, "/v1/chat/completions", chat_body("x", {{"model", "gpt-4o"}}), 404);
  expect_openai_error(nf);
  EXPECT_EQ(nf["error"]["code"], "model_not_found");
  // Oversized body.
  auto big = c.Post("/v1/chat/completions", chat_body(std::string(8000, 'a')).dump(), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  expect_openai_error(json::parse(big->body));
  EXPECT_EQ(s.engine.overlap_.load(), false);
}

// Malformed tool lists are 400s whose message names 'tools', in each API's own tool form.
TEST(ServerHttp, MalformedToolsAre400) {
  TestServer s;
  auto c = s.client();
  const json not_array = "f";
  const json not_object = json::array({1});
  const json chat_nameless = json::array({{{"type", "function"}, {"function", {{"parameters", json::object()}}}}});
  const json flat_nameless = json::array({{{"type", "function"}, {"parameters", json::object()}}});
  const json anth_nameless = json::array({{{"input_schema", json::object()}}});
  auto expect_tools_400 = [&](const char* path, json body) {
    json j = post_json(c, path, body, 400);
    ASSERT_TRUE(j.contains("error")) << path << " " << j.dump();
    EXPECT_NE(j["error"].value("message", "").find("'tools'"), std::string::npos) << path << " " << j.dump();
  };
  for (const json& tools : {not_array, not_object, chat_nameless}) {
    expect_tools_400("/v1/chat/completions", chat_body("x", {{"tools", tools}}));
  }
  for (const json& tools : {not_array, not_object, flat_nameless}) {
    expect_tools_400("/v1/responses", {{"model", "test-model"}, {"input", "x"}, {"tools", tools}});
  }
  for (const json& tools : {not_array, not_object, anth_nameless}) {
    expect_tools_400("/v1/messages", {{"model", "test-model"},
                                      {"max_tokens", 4},
                                      {"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
                                      {"tools", tools}});
  }
  // Tools of other types are ignored, not refused.
  post_json(c, "/v1/responses", {{"model", "test-model"}, {"input", "x"}, {"max_output_tokens", 2},
                                  {"tools", json::array({{{"type", "web_search"}}})}}, 200);
}

TEST(ServerHttp, PromptLongerThanContextIs400) {
  TestServer s;
  auto c = s.client();
  json big_user = chat_body(std::string(5000, 'a'));
  expect_openai_error(post_json(c, "/v1/chat/completions", big_user, 400));
  json anth{{"model", "test-model"}, {"max_tokens", 10}, {"messages", json::array({{{"role", "user"}, {"content", std::string(5000, 'b')}}})}};
  expect_anthropic_error(post_json(c, "/v1/messages", anth, 400), "invalid_request_error");
  EXPECT_EQ(s.engine.calls(), 0);
}

TEST(ServerHttp, AnthropicErrorShapes) {
  TestServer s;
  auto c = s.client();
  auto raw = c.Post("/v1/messages", "[[[", "application/json");
  EXPECT_EQ(raw->status, 400);
  expect_anthropic_error(json::parse(raw->body), "invalid_request_error");
  expect_anthropic_error(post_json(c, "/v1/messages", {{"model", "test-model"}, {"max_tokens", "ten"}}, 400), "invalid_request_error");
  expect_anthropic_error(post_json(c, "/v1/messages",
                                   {{"model", "claude-opus"}, {"max_tokens", 10},
                                    {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}},
                                   404),
                         "not_found_error");
}

TEST(ServerHttp, ApiKeyRequiredExceptHealth) {
  ServerOptions o;
  o.api_key = "sekret";
  TestServer s(o);
  auto c = s.client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto m = c.Get("/v1/models");
  EXPECT_EQ(m->status, 401);
  expect_openai_error(json::parse(m->body));
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  expect_openai_error(post_json(c, "/v1/chat/completions", chat_body("x"), 401));
  expect_anthropic_error(post_json(c, "/v1/messages", json::object(), 401), "authentication_error");
  post_json(c, "/v1/chat/completions", chat_body("x"), 401, {{"Authorization", "Bearer wrong"}});
  post_json(c, "/v1/chat/completions", chat_body("x"), 200, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(c.Get("/v1/models", {{"x-api-key", "sekret"}})->status, 200);
}

TEST(ServerHttp, QueueFullGets503WithRetryAfter) {
  ServerOptions o;
  o.max_queue = 1;
  TestServer s(o);
  s.engine.token_delay = 10ms;
  s.engine.reply_fn = [](const std::string&) { return std::string(40, 'z'); };
  auto run = [&] {
    auto c = s.client();
    auto r = c.Post("/v1/chat/completions", chat_body("x").dump(), "application/json");
    return r ? r->status : -1;
  };
  auto first = std::async(std::launch::async, run);
  while (s.engine.calls() < 1) std::this_thread::sleep_for(2ms);
  auto second = std::async(std::launch::async, run);
  // Wait until the second request is waiting in the queue.
  auto c = s.client();
  for (int i = 0; i < 500; i++) {
    auto m = c.Get("/metrics");
    if (m && m->body.find("deltaserve_queue_depth 1") != std::string::npos) break;
    std::this_thread::sleep_for(2ms);
  }
  auto r = c.Post("/v1/chat/completions", chat_body("x").dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  expect_openai_error(json::parse(r->body));
  EXPECT_EQ(first.get(), 200);
  EXPECT_EQ(second.get(), 200);
  EXPECT_FALSE(s.engine.overlap_.load());
}

TEST(ServerHttp, StreamingClientDisconnectCancelsGeneration) {
  TestServer s;
  s.engine.token_delay = 5ms;
  s.engine.reply_fn = [](const std::string&) { return "</think>\n\n" + std::string(2000, 'y'); };
  int cancelled_before = s.engine.cancelled_.load();
  // Read a few chunks, then hang up.
  httplib::Client c("127.0.0.1", s.port());
  int seen = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = chat_body("x", {{"stream", true}}).dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++seen < 3; };
  auto res = c.send(req);
  EXPECT_GE(seen, 3);
  for (int i = 0; i < 300 && s.engine.cancelled_.load() == cancelled_before; i++) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.engine.cancelled_.load(), cancelled_before + 1);
  // The server is fine afterwards.
  s.engine.token_delay = 0ms;
  auto c2 = s.client();
  post_json(c2, "/v1/chat/completions", chat_body("x"), 200);
}

TEST(ServerHttp, NonStreamingClientDisconnectCancelsGeneration) {
  TestServer s;
  s.engine.token_delay = 5ms;
  s.engine.reply_fn = [](const std::string&) { return std::string(3000, 'y'); };  // ~15 s if not cancelled
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(0, 300000);  // give up after 0.3 s
  auto start = std::chrono::steady_clock::now();
  auto r = c.Post("/v1/chat/completions", chat_body("x").dump(), "application/json");
  EXPECT_FALSE(r && r->status == 200 && r->body.find("choices") != std::string::npos);
  for (int i = 0; i < 600 && s.engine.cancelled_.load() == 0; i++) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.engine.cancelled_.load(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s);
}

TEST(ServerHttp, KeepAlivePingsDuringLongPrefill) {
  ServerOptions o;
  o.sse_ping_seconds = 0.1;
  TestServer s(o);
  s.engine.prefill_delay = 600ms;
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", chat_body("x", {{"stream", true}}).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find(": ping\n\n"), std::string::npos);
  EXPECT_EQ(sse_data(r->body).back(), "[DONE]");
}

TEST(ServerHttp, MetricsCountRequestsAndTokens) {
  TestServer s;
  auto c = s.client();
  post_json(c, "/v1/chat/completions", chat_body("x"), 200);
  post_json(c, "/v1/chat/completions", chat_body("x", {{"model", "nope"}}), 404);
  // A response is counted when the server finishes sending it, and its generation leaves the queue's
  // running slot after the worker returns; both can be just after the client has read the response:
  // poll briefly.
  const std::string want = "deltaserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1";
  const std::string want_404 = "deltaserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"404\"} 1";
  const std::string idle = "deltaserve_requests_in_flight 0";
  std::string t;
  for (int i = 0; i < 100; ++i) {
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(m->status, 200);
    t = m->body;
    if (t.find(want) != std::string::npos && t.find(want_404) != std::string::npos && t.find(idle) != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(t.find("deltaserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1"), std::string::npos) << t;
  EXPECT_NE(t.find("deltaserve_requests_total{endpoint=\"/v1/chat/completions\",status=\"404\"} 1"), std::string::npos) << t;
  int64_t prompt = static_cast<int64_t>(s.engine.last_request().prompt.size());
  EXPECT_NE(t.find("deltaserve_prompt_tokens_total " + std::to_string(prompt) + "\n"), std::string::npos) << t;
  EXPECT_NE(t.find("deltaserve_cached_prompt_tokens_total " + std::to_string(prompt / 2) + "\n"), std::string::npos) << t;
  EXPECT_NE(t.find("deltaserve_queue_depth 0"), std::string::npos);
  EXPECT_NE(t.find("deltaserve_requests_in_flight 0"), std::string::npos);
  EXPECT_NE(t.find("# TYPE deltaserve_prefill_seconds_total counter"), std::string::npos);
  EXPECT_NE(t.find("# HELP deltaserve_generations_total Generations run by the engine.\n"
                   "# TYPE deltaserve_generations_total counter\ndeltaserve_generations_total "),
            std::string::npos)
      << t;
  // Seconds carry six decimals.
  const std::string dec_key = "\ndeltaserve_decode_seconds_total ";
  const size_t dec = t.find(dec_key);
  ASSERT_NE(dec, std::string::npos) << t;
  const size_t dec_begin = dec + dec_key.size();
  const std::string dec_value = t.substr(dec_begin, t.find('\n', dec_begin) - dec_begin);
  ASSERT_NE(dec_value.find('.'), std::string::npos) << dec_value;
  EXPECT_EQ(dec_value.size() - dec_value.find('.') - 1, 6u) << dec_value;
  EXPECT_NE(t.find("deltaserve_cache_hits_total{tier=\"ram\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("deltaserve_cache_bytes{tier=\"disk\"} 7\n"), std::string::npos) << t;
  EXPECT_NE(t.find("deltaserve_graph_steps_total{run=\"captured\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("deltaserve_graph_steps_total{run=\"op_by_op\"} 0\n"), std::string::npos) << t;
}

}  // namespace
}  // namespace ds
