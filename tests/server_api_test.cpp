// The Responses (Codex) and Messages (Claude Code) APIs against the scripted engine: input mapping
// into chat turns (checked in the transparent fake rendering), output items and content blocks, the
// streaming event sequences, and usage with cached tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server_test_fakes.h"

namespace ds {
namespace {

using json = nlohmann::ordered_json;
using testing_fakes::TestServer;

struct SseEvent {
  std::string name;
  json data;
};

std::vector<SseEvent> parse_sse(const std::string& body) {
  std::vector<SseEvent> out;
  std::string name;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) {
      out.push_back({name, json::parse(line.substr(6))});
      name.clear();
    }
    pos = end + 1;
  }
  return out;
}

json post(httplib::Client& c, const std::string& path, const json& body, int status) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, status) << r->body;
  return json::parse(r->body, nullptr, false);
}

const char* kToolReply =
    "Need the file.\n</think>\n\nLet me look.\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.cpp\n"
    "</parameter>\n</function>\n</tool_call>";

TEST(ServerApiResponses, StringInputAndInstructions) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "ok\n</think>\n\nDone."; };
  auto c = s.client();
  json r = post(c, "/v1/responses", {{"model", "test-model"}, {"input", "Hello"}, {"instructions", "Be brief."}}, 200);
  EXPECT_EQ(s.engine.last_prompt().rfind("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>", 0), 0u)
      << s.engine.last_prompt();
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "completed");
  ASSERT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][1]["type"], "message");
  EXPECT_EQ(r["output"][1]["content"][0]["type"], "output_text");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Done.");
  int64_t prompt = static_cast<int64_t>(s.engine.last_request().prompt.size());
  EXPECT_EQ(r["usage"]["input_tokens"], prompt);
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], prompt / 2);
  EXPECT_EQ(r["usage"]["total_tokens"], r["usage"]["input_tokens"].get<int64_t>() + r["usage"]["output_tokens"].get<int64_t>());
}

TEST(ServerApiResponses, CodexStyleItemsAndToolsRoundTrip) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return kToolReply; };
  json tools = json::parse(R"([
    {"type":"function","name":"read_file","description":"Read","parameters":{"type":"object","properties":{"path":{"type":"string"}}},"strict":false},
    {"type":"web_search"},
    {"type":"namespace","name":"mcp","tools":[]},
    {"type":"image_generation"}])");
  json input = json::parse(R"([
    {"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]},
    {"type":"message","role":"user","content":[{"type":"input_text","text":"Open main."}]}])");
  auto c = s.client();
  json r = post(c, "/v1/responses", {{"model", "test-model"}, {"input", input}, {"tools", tools}, {"store", false}}, 200);
  std::string prompt = s.engine.last_prompt();
  EXPECT_NE(prompt.find("<|im_start|>system\nYou are Codex.<|im_end|>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("\"read_file\""), std::string::npos);
  EXPECT_EQ(prompt.find("web_search"), std::string::npos);
  json fc;
  for (const auto& item : r["output"]) {
    if (item["type"] == "function_call") fc = item;
  }
  ASSERT_TRUE(fc.is_object()) << r.dump();
  EXPECT_EQ(fc["name"], "read_file");
  EXPECT_EQ(json::parse(fc["arguments"].get<std::string>())["path"], "src/main.cpp");
  EXPECT_EQ(fc["call_id"].get<std::string>().rfind("call_", 0), 0u);

  // Next turn: the function call and its output come back as items.
  s.engine.reply_fn = [](const std::string&) { return "</think>\n\nIt prints hello."; };
  input.push_back({{"type", "reasoning"}, {"summary", json::array()}, {"content", json::array({{{"type", "reasoning_text"}, {"text", "Need the file."}}})}});
  input.push_back(fc);
  input.push_back({{"type", "function_call_output"}, {"call_id", fc["call_id"]}, {"output", "int main() {}"}});
  json r2 = post(c, "/v1/responses", {{"model", "test-model"}, {"input", input}, {"tools", tools}}, 200);
  prompt = s.engine.last_prompt();
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<think>Need the file.</think><tool_call>read_file {\"path\":\"src/main.cpp\"}</tool_call>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>tool\nint main() {} [id " + fc["call_id"].get<std::string>() + "]"), std::string::npos) << prompt;
  EXPECT_EQ(r2["output"].back()["content"][0]["text"], "It prints hello.");
}

TEST(ServerApiResponses, FreeformCustomToolCallsBecomeCalls) {
  TestServer s;
  auto c = s.client();
  json input = json::parse(R"([
    {"type":"message","role":"user","content":"patch it"},
    {"type":"custom_tool_call","call_id":"call_p","name":"apply_patch","input":"*** Begin Patch"},
    {"type":"custom_tool_call_output","call_id":"call_p","output":"Done!"}])");
  post(c, "/v1/responses", {{"input", input}, {"tools", json::array({{{"type", "custom"}, {"name", "apply_patch"}}})}}, 200);
  std::string prompt = s.engine.last_prompt();
  EXPECT_NE(prompt.find("<tool_call>apply_patch {\"input\":\"*** Begin Patch\"}</tool_call>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|im_start|>tool\nDone! [id call_p]"), std::string::npos) << prompt;
}

TEST(ServerApiResponses, StreamingEventSequence) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return kToolReply; };
  json tools = json::parse(R"([{"type":"function","name":"read_file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}])");
  auto c = s.client();
  auto r = c.Post("/v1/responses", json{{"model", "test-model"}, {"input", "x"}, {"tools", tools}, {"stream", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  auto events = parse_sse(r->body);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events.front().name, "response.created");
  EXPECT_EQ(events.back().name, "response.completed");
  std::string text, reasoning, args_delta, args_done;
  int64_t seq = -1;
  for (const auto& e : events) {
    EXPECT_EQ(e.data["type"], e.name);
    EXPECT_GT(e.data["sequence_number"].get<int64_t>(), seq);
    seq = e.data["sequence_number"].get<int64_t>();
    if (e.name == "response.output_text.delta") text += e.data["delta"].get<std::string>();
    if (e.name == "response.reasoning_text.delta") reasoning += e.data["delta"].get<std::string>();
    if (e.name == "response.function_call_arguments.delta") args_delta += e.data["delta"].get<std::string>();
    if (e.name == "response.function_call_arguments.done") args_done = e.data["arguments"];
  }
  EXPECT_EQ(text, "Let me look.");
  EXPECT_EQ(reasoning, "Need the file.");
  EXPECT_EQ(args_delta, args_done);
  EXPECT_EQ(json::parse(args_done)["path"], "src/main.cpp");
  const json& done = events.back().data["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][2]["type"], "function_call");
  EXPECT_TRUE(done["usage"]["input_tokens_details"].contains("cached_tokens"));
}

TEST(ServerApiResponses, PreviousResponseIdIsAControlled400) {
  TestServer s;
  auto c = s.client();
  json r = post(c, "/v1/responses", {{"input", "x"}, {"previous_response_id", "resp_123"}}, 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("previous_response_id"), std::string::npos);
  EXPECT_EQ(s.engine.calls(), 0);
  post(c, "/v1/responses", {{"input", 42}}, 400);
  post(c, "/v1/responses", {{"input", json::array({{{"type", "message"}, {"role", "user"}, {"content", json::array({{{"type", "input_image"}}})}}})}}, 400);
}

TEST(ServerApiResponses, MaxOutputTokensGivesIncomplete) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "long long reasoning that goes on"; };
  auto c = s.client();
  json r = post(c, "/v1/responses", {{"input", "x"}, {"max_output_tokens", 4}}, 200);
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
}

TEST(ServerApiMessages, SystemBlocksToolUseAndToolResult) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "</think>\n\nThe file is empty."; };
  json body = json::parse(R"J({
    "model": "test-model", "max_tokens": 100,
    "system": [{"type":"text","text":"You are Claude Code."},{"type":"text","text":"Be careful."}],
    "tools": [{"name":"Read","description":"Read a file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}},
              {"type":"web_search_20250305","name":"web_search"}],
    "messages": [
      {"role":"user","content":"Read a.txt"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"I should read it.","signature":""},
                                     {"type":"text","text":"Reading."},
                                     {"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"a.txt"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"(empty)"}]},
                                {"type":"text","text":"What is in it?"}]}]})J");
  auto c = s.client();
  json r = post(c, "/v1/messages", body, 200);
  std::string prompt = s.engine.last_prompt();
  EXPECT_NE(prompt.find("<|im_start|>system\nYou are Claude Code.\nBe careful.<|im_end|>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<think>I should read it.</think>Reading.<tool_call>Read {\"path\":\"a.txt\"}</tool_call>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>tool\n(empty) [id toolu_1]<|im_end|>\n<|im_start|>user\nWhat is in it?"), std::string::npos) << prompt;
  EXPECT_EQ(prompt.find("web_search"), std::string::npos);
  EXPECT_EQ(r["type"], "message");
  EXPECT_EQ(r["role"], "assistant");
  EXPECT_EQ(r["stop_reason"], "end_turn");
  ASSERT_EQ(r["content"].size(), 1u);
  EXPECT_EQ(r["content"][0]["text"], "The file is empty.");
  int64_t n_prompt = static_cast<int64_t>(s.engine.last_request().prompt.size());
  EXPECT_EQ(r["usage"]["cache_read_input_tokens"], n_prompt / 2);
  EXPECT_EQ(r["usage"]["input_tokens"], n_prompt - n_prompt / 2);
}

TEST(ServerApiMessages, NonStreamingThinkingAndToolUse) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return kToolReply; };
  json body{{"model", "test-model"}, {"max_tokens", 200},
            {"tools", json::parse(R"([{"name":"read_file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}}])")},
            {"messages", json::array({{{"role", "user"}, {"content", "open it"}}})}};
  auto c = s.client();
  json r = post(c, "/v1/messages", body, 200);
  ASSERT_EQ(r["content"].size(), 3u) << r.dump();
  EXPECT_EQ(r["content"][0]["type"], "thinking");
  EXPECT_EQ(r["content"][0]["thinking"], "Need the file.");
  EXPECT_EQ(r["content"][1]["text"], "Let me look.");
  EXPECT_EQ(r["content"][2]["type"], "tool_use");
  EXPECT_EQ(r["content"][2]["name"], "read_file");
  EXPECT_EQ(r["content"][2]["input"]["path"], "src/main.cpp");
  EXPECT_EQ(r["content"][2]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(r["stop_reason"], "tool_use");
}

TEST(ServerApiMessages, StreamingEventSequence) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return kToolReply; };
  json body{{"model", "test-model"}, {"max_tokens", 200}, {"stream", true},
            {"tools", json::parse(R"([{"name":"read_file","input_schema":{"type":"object","properties":{"path":{"type":"string"}}}}])")},
            {"messages", json::array({{{"role", "user"}, {"content", "open it"}}})}};
  auto c = s.client();
  auto res = c.Post("/v1/messages", body.dump(), "application/json");
  ASSERT_TRUE(res);
  auto events = parse_sse(res->body);
  ASSERT_GE(events.size(), 8u);
  EXPECT_EQ(events.front().name, "message_start");
  EXPECT_EQ(events.back().name, "message_stop");
  std::vector<std::string> block_types;
  std::string thinking, text, partial_json;
  json message_delta;
  int open_index = -1;
  for (const auto& e : events) {
    EXPECT_EQ(e.data["type"], e.name);
    if (e.name == "content_block_start") {
      EXPECT_EQ(open_index, -1) << "a block started before the previous one stopped";
      open_index = e.data["index"];
      EXPECT_EQ(open_index, static_cast<int>(block_types.size()));
      block_types.push_back(e.data["content_block"]["type"]);
    }
    if (e.name == "content_block_delta") {
      EXPECT_EQ(e.data["index"], open_index);
      const json& d = e.data["delta"];
      if (d["type"] == "thinking_delta") thinking += d["thinking"].get<std::string>();
      if (d["type"] == "text_delta") text += d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") partial_json += d["partial_json"].get<std::string>();
    }
    if (e.name == "content_block_stop") {
      EXPECT_EQ(e.data["index"], open_index);
      open_index = -1;
    }
    if (e.name == "message_delta") message_delta = e.data;
  }
  EXPECT_EQ(block_types, (std::vector<std::string>{"thinking", "text", "tool_use"}));
  EXPECT_EQ(thinking, "Need the file.");
  EXPECT_EQ(text, "Let me look.");
  EXPECT_EQ(json::parse(partial_json)["path"], "src/main.cpp");
  EXPECT_EQ(message_delta["delta"]["stop_reason"], "tool_use");
  EXPECT_TRUE(message_delta["usage"].contains("cache_read_input_tokens"));
  EXPECT_GT(message_delta["usage"]["output_tokens"].get<int>(), 0);
}

TEST(ServerApiMessages, ThinkingDisabledAndStopSequences) {
  TestServer s;
  s.engine.reply_fn = [](const std::string&) { return "alpha ## beta"; };
  json body{{"model", "test-model"}, {"max_tokens", 50}, {"thinking", {{"type", "disabled"}}},
            {"stop_sequences", json::array({"##"})}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}};
  auto c = s.client();
  json r = post(c, "/v1/messages", body, 200);
  std::string prompt = s.engine.last_prompt();
  EXPECT_EQ(prompt.substr(prompt.size() - 19), "<think>\n\n</think>\n\n");
  EXPECT_EQ(r["content"][0]["text"], "alpha");
  EXPECT_EQ(r["stop_reason"], "stop_sequence");
  EXPECT_EQ(r["stop_sequence"], "##");
}

}  // namespace
}  // namespace ds
