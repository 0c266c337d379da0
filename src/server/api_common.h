// What the four generation APIs share: typed JSON field access that reports the field and the
// expected type, error bodies in each API's style, the prepared request an endpoint hands to the
// server core, and the formatter that turns generation events into that API's wire format.
// Non-obvious choice: every request is turned into (ChatMessage list, render options) and rendered by
// one chat template, so all APIs produce the same prompt prefix for the same conversation and share
// snapshot reuse.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/engine.h"
#include "server/generation.h"
#include "server/model_text.h"

namespace ds {

using json = nlohmann::ordered_json;

enum class ApiStyle { kOpenAI, kAnthropic };

// Parses a request body. Nesting deeper than kMaxJsonDepth is refused before parsing: copying and
// destroying JSON values recurse, so depth is what could exhaust the stack, not size.
constexpr int kMaxJsonDepth = 128;
Result<json> parse_body(const std::string& body);

// Serializes without throwing: invalid UTF-8 is replaced by U+FFFD.
std::string json_text(const json& j);
// One SSE message: optional `event:` line, then `data:`.
std::string sse_event(const json& data, const char* event = nullptr);

// HTTP status for a Status code: kInvalidArgument/kUnsupported 400, kNotFound 404, kResourceExhausted
// 503, kCancelled 499, others 500.
int http_status_for(const Status& status);
// {"error":{"message","type","param","code"}} or {"type":"error","error":{"type","message"}}.
json error_body(ApiStyle style, int http_status, const std::string& message);

// ---- typed field access: errors name the field and the expected type ----
Status field_string(const json& obj, const char* key, std::optional<std::string>* out);
Status field_number(const json& obj, const char* key, std::optional<double>* out);
Status field_int(const json& obj, const char* key, std::optional<int64_t>* out);
Status field_bool(const json& obj, const char* key, std::optional<bool>* out);
// `stop` as a string or an array of strings.
Status field_stop(const json& obj, const char* key, std::vector<std::string>* out);
// The body's `tools` array, each entry checked to be an object and handed to `each` (absent or null:
// none); the chat form `each` builds is appended to `tools`, which starts empty.
Status parse_tools_with(const json& body, json* tools,
                        const std::function<Status(const json& tool, json* tools)>& each);

// What every endpoint needs to know about the served model.
struct ApiContext {
  const ModelText* text = nullptr;
  EngineInfo info;
  std::string model_id;                // reported in responses and /v1/models
  std::vector<std::string> model_names;  // accepted in requests (id + aliases)
};

// kNotFound (404) unless `model` is empty or one of the accepted names.
Status check_model(const ApiContext& ctx, const std::optional<std::string>& model);

// Sampling fields common to the OpenAI-style APIs (temperature, top_p, top_k, min_p, penalties, seed).
Status parse_sampling(const json& body, SamplingParams* out);

// Turns generation events into the wire format of one API, for one request.
class ApiFormatter {
 public:
  virtual ~ApiFormatter() = default;
  virtual std::string stream_begin() = 0;
  virtual std::string stream_events(const std::vector<OutputEvent>& events) = 0;
  virtual std::string stream_end(const GenerationOutcome& outcome) = 0;
  virtual std::string stream_error(const Status& status) = 0;
  virtual json response(const GenerationOutcome& outcome) = 0;
};

struct PreparedRequest {
  GenerationSpec spec;
  bool stream = false;
  // max_tokens was given by the client (otherwise the rest of the context is the limit).
  bool max_tokens_given = false;
  std::unique_ptr<ApiFormatter> formatter;
};

// Chat turns and render options -> prompt tokens (+ forced assistant prefix for tool_choice).
struct ChatPromptPlan {
  std::vector<ChatMessage> messages;
  ChatRenderOptions render;
  std::string tool_choice = "auto";  // auto, none, required, or a function name (named)
  bool named_tool = false;
  std::string response_instruction;  // system-prompt text for JSON output, or ""
};
// Renders and tokenizes; fills spec.prompt and spec.parser. The forced prefix for "required" and named
// tool choices is appended to the prompt and fed to the parser, so it shows up as a tool call.
Status build_chat_prompt(const ApiContext& ctx, ChatPromptPlan plan, GenerationSpec* spec);

// Unique ids for responses ("chatcmpl-", "resp_", "msg_", ...).
std::string make_id(const char* prefix);
int64_t unix_time();

// Endpoint parsers: request JSON -> prepared request, or a Status (kInvalidArgument, kNotFound).
Result<PreparedRequest> prepare_chat_completions(const ApiContext& ctx, const json& body);
Result<PreparedRequest> prepare_completions(const ApiContext& ctx, const json& body);
Result<PreparedRequest> prepare_responses(const ApiContext& ctx, const json& body);
Result<PreparedRequest> prepare_messages(const ApiContext& ctx, const json& body);

}  // namespace ds
