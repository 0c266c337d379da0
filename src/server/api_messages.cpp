// Anthropic Messages API (what Claude Code sends): content blocks -> chat turns, and the event stream
// message_start / content_block_start / _delta / _stop / message_delta / message_stop. Non-obvious
// choice: `usage.input_tokens` counts only the prompt tokens that were prefilled; the tokens restored
// from a snapshot are reported as `cache_read_input_tokens`, as Anthropic counts cache reads.
#include <fmt/format.h>

#include "server/api_common.h"

namespace ds {
namespace {

Status blocks_text(const json& content, const std::string& where, std::string* out) {
  if (content.is_string()) {
    *out += content.get<std::string>();
    return Status::ok();
  }
  if (!content.is_array()) return invalid_argument("{}: 'content' must be a string or an array of blocks", where);
  for (const auto& b : content) {
    if (!b.is_object()) return invalid_argument("{}: content blocks must be objects", where);
    std::string type = b.value("type", std::string());
    if (type != "text") return invalid_argument("{}: block type '{}' is not supported here (text only)", where, type);
    if (!b.contains("text") || !b["text"].is_string()) return invalid_argument("{}: a text block needs 'text'", where);
    *out += b["text"].get<std::string>();
  }
  return Status::ok();
}

Status parse_system(const json& body, std::string* system) {
  auto it = body.find("system");
  if (it == body.end() || it->is_null()) return Status::ok();
  if (it->is_string()) {
    *system = it->get<std::string>();
    return Status::ok();
  }
  if (!it->is_array()) return invalid_argument("'system': expected a string or an array of text blocks");
  for (const auto& b : *it) {
    if (!b.is_object() || !b.contains("text") || !b["text"].is_string()) {
      return invalid_argument("'system': each block needs a string 'text'");
    }
    if (!system->empty()) *system += "\n";
    *system += b["text"].get<std::string>();
  }
  return Status::ok();
}

Status parse_message(const json& m, const std::string& where, std::vector<ChatMessage>* out) {
  if (!m.is_object()) return invalid_argument("{}: expected an object", where);
  std::optional<std::string> role;
  DS_TRY(field_string(m, "role", &role).with_context(where));
  if (!role || (*role != "user" && *role != "assistant")) return invalid_argument("{}: 'role' must be user or assistant", where);
  auto content = m.find("content");
  if (content == m.end()) return invalid_argument("{}: 'content' is required", where);
  ChatMessage msg;
  msg.role = *role;
  bool had_tool_result = false;
  if (content->is_string()) {
    msg.content = content->get<std::string>();
    out->push_back(std::move(msg));
    return Status::ok();
  }
  if (!content->is_array()) return invalid_argument("{}: 'content' must be a string or an array of blocks", where);
  for (size_t i = 0; i < content->size(); i++) {
    const json& b = (*content)[i];
    std::string bw = fmt::format("{}.content[{}]", where, i);
    if (!b.is_object()) return invalid_argument("{}: expected an object", bw);
    std::string type = b.value("type", std::string());
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) return invalid_argument("{}: a text block needs 'text'", bw);
      msg.content += b["text"].get<std::string>();
    } else if (type == "thinking" && *role == "assistant") {
      msg.reasoning += b.value("thinking", std::string());
    } else if (type == "redacted_thinking") {
      // Opaque to us; nothing to render.
    } else if (type == "tool_use" && *role == "assistant") {
      ChatToolCall call;
      call.id = b.value("id", std::string());
      if (!b.contains("name") || !b["name"].is_string()) return invalid_argument("{}: tool_use needs 'name'", bw);
      call.name = b["name"].get<std::string>();
      if (b.contains("input")) {
        if (!b["input"].is_object()) return invalid_argument("{}: tool_use 'input' must be an object", bw);
        call.arguments = b["input"];
      }
      msg.tool_calls.push_back(std::move(call));
    } else if (type == "tool_result" && *role == "user") {
      had_tool_result = true;
      ChatMessage tool;
      tool.role = "tool";
      tool.tool_call_id = b.value("tool_use_id", std::string());
      if (b.contains("content") && !b["content"].is_null()) DS_TRY(blocks_text(b["content"], bw, &tool.content));
      out->push_back(std::move(tool));
    } else {
      return invalid_argument("{}: block type '{}' is not supported in a {} message", bw, type, *role);
    }
  }
  // A user message of only tool results becomes tool messages alone; text after them is a user turn.
  if (!(msg.role == "user" && msg.content.empty() && had_tool_result)) out->push_back(std::move(msg));
  return Status::ok();
}

Status parse_tools(const json& body, json* tools) {
  return parse_tools_with(body, tools, [](const json& t, json* out) -> Status {
    std::string type = t.value("type", std::string("custom"));
    if (type != "custom" || !t.contains("input_schema")) return Status::ok();  // server tools are ignored
    if (!t.contains("name") || !t["name"].is_string()) return invalid_argument("'tools': a tool needs 'name'");
    json fn{{"name", t["name"]}, {"parameters", t["input_schema"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    out->push_back(json{{"type", "function"}, {"function", fn}});
    return Status::ok();
  });
}

Status parse_tool_choice(const json& body, ChatPromptPlan* plan) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return Status::ok();
  if (!it->is_object()) return invalid_argument("'tool_choice': expected an object");
  std::string type = it->value("type", std::string());
  if (type == "auto") plan->tool_choice = "auto";
  else if (type == "none") plan->tool_choice = "none";
  else if (type == "any") plan->tool_choice = "required";
  else if (type == "tool" && it->contains("name") && (*it)["name"].is_string()) {
    plan->tool_choice = (*it)["name"].get<std::string>();
    plan->named_tool = true;
  } else {
    return invalid_argument("'tool_choice': unknown type '{}'", type);
  }
  return Status::ok();
}

const char* stop_reason(const GenerationOutcome& o) {
  if (o.finish == GenerationFinish::kToolCalls) return "tool_use";
  if (o.finish == GenerationFinish::kLength) return "max_tokens";
  if (o.stopped_by_string) return "stop_sequence";
  return "end_turn";
}

json usage_json(const GenerationOutcome& o) {
  return json{{"input_tokens", o.prompt_tokens - o.cached_tokens},
              {"output_tokens", o.completion_tokens},
              {"cache_read_input_tokens", o.cached_tokens},
              {"cache_creation_input_tokens", 0}};
}

class MessagesFormatter : public ApiFormatter {
 public:
  MessagesFormatter(std::string model, int64_t prompt_tokens) : model_(std::move(model)), prompt_tokens_(prompt_tokens) {}

  std::string stream_begin() override {
    json msg{{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"content", json::array()}, {"model", model_},
             {"stop_reason", nullptr}, {"stop_sequence", nullptr},
             {"usage", {{"input_tokens", prompt_tokens_}, {"output_tokens", 0}, {"cache_read_input_tokens", 0},
                        {"cache_creation_input_tokens", 0}}}};
    return event("message_start", json{{"message", msg}});
  }

  std::string stream_events(const std::vector<OutputEvent>& events) override {
    std::string out;
    for (const auto& e : events) {
      if (e.kind == OutputEvent::Kind::kToolCall) {
        out += close_block();
        json block{{"type", "tool_use"}, {"id", tool_id(e.tool_call.id)}, {"name", e.tool_call.name}, {"input", json::object()}};
        out += event("content_block_start", json{{"index", index_}, {"content_block", block}});
        out += event("content_block_delta",
                     json{{"index", index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", json_text(e.tool_call.arguments)}}}});
        out += event("content_block_stop", json{{"index", index_}});
        index_++;
        continue;
      }
      bool thinking = e.kind == OutputEvent::Kind::kReasoning;
      if (open_ && open_thinking_ != thinking) out += close_block();
      if (!open_) {
        open_ = true;
        open_thinking_ = thinking;
        json block = thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                              : json{{"type", "text"}, {"text", ""}};
        out += event("content_block_start", json{{"index", index_}, {"content_block", block}});
      }
      json delta = thinking ? json{{"type", "thinking_delta"}, {"thinking", e.text}} : json{{"type", "text_delta"}, {"text", e.text}};
      out += event("content_block_delta", json{{"index", index_}, {"delta", delta}});
    }
    return out;
  }

  std::string stream_end(const GenerationOutcome& o) override {
    std::string out = close_block();
    out += event("message_delta",
                 json{{"delta", {{"stop_reason", stop_reason(o)}, {"stop_sequence", o.stopped_by_string ? json(o.stop_string) : json(nullptr)}}},
                      {"usage", usage_json(o)}});
    return out + event("message_stop", json::object());
  }

  std::string stream_error(const Status& s) override {
    return event("error", error_body(ApiStyle::kAnthropic, http_status_for(s), s.message()));
  }

  json response(const GenerationOutcome& o) override {
    json content = json::array();
    if (!o.reasoning.empty()) content.push_back(json{{"type", "thinking"}, {"thinking", o.reasoning}, {"signature", ""}});
    if (!o.content.empty()) content.push_back(json{{"type", "text"}, {"text", o.content}});
    for (const auto& c : o.tool_calls) {
      content.push_back(json{{"type", "tool_use"}, {"id", tool_id(c.id)}, {"name", c.name}, {"input", c.arguments}});
    }
    return json{{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", content},
                {"stop_reason", stop_reason(o)},
                {"stop_sequence", o.stopped_by_string ? json(o.stop_string) : json(nullptr)},
                {"usage", usage_json(o)}};
  }

 private:
  static std::string tool_id(const std::string& call_id) {
    return call_id.rfind("call_", 0) == 0 ? "toolu_" + call_id.substr(5) : call_id;
  }
  std::string event(const char* type, json data) {
    if (!data.contains("type")) data["type"] = type;
    return sse_event(data, type);
  }
  std::string close_block() {
    if (!open_) return "";
    open_ = false;
    std::string out;
    if (open_thinking_) {
      out += event("content_block_delta", json{{"index", index_}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
    }
    out += event("content_block_stop", json{{"index", index_}});
    index_++;
    return out;
  }

  std::string id_ = make_id("msg_");
  std::string model_;
  int64_t prompt_tokens_;
  int index_ = 0;
  bool open_ = false;
  bool open_thinking_ = false;
};

}  // namespace

Result<PreparedRequest> prepare_messages(const ApiContext& ctx, const json& body) {
  std::optional<std::string> model;
  DS_TRY(field_string(body, "model", &model));
  DS_TRY(check_model(ctx, model));
  PreparedRequest p;
  DS_TRY(parse_sampling(body, &p.spec.sampling));
  std::optional<int64_t> max_tokens;
  DS_TRY(field_int(body, "max_tokens", &max_tokens));
  if (max_tokens) {
    if (*max_tokens < 1) return invalid_argument("'max_tokens': expected a positive integer, got {}", *max_tokens);
    p.spec.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
    p.max_tokens_given = true;
  }
  DS_TRY(field_stop(body, "stop_sequences", &p.spec.stop));
  std::optional<bool> stream;
  DS_TRY(field_bool(body, "stream", &stream));
  p.stream = stream.value_or(false);

  ChatPromptPlan plan;
  std::string system;
  DS_TRY(parse_system(body, &system));
  if (!system.empty()) {
    ChatMessage m;
    m.role = "system";
    m.content = system;
    plan.messages.push_back(std::move(m));
  }
  auto msgs = body.find("messages");
  if (msgs == body.end() || !msgs->is_array()) return invalid_argument("'messages': required, an array");
  if (msgs->empty()) return invalid_argument("'messages': at least one message is required");
  for (size_t i = 0; i < msgs->size(); i++) {
    DS_TRY(parse_message((*msgs)[i], fmt::format("messages[{}]", i), &plan.messages));
  }
  json tools;
  DS_TRY(parse_tools(body, &tools));
  plan.render.tools = tools;
  DS_TRY(parse_tool_choice(body, &plan));
  auto thinking = body.find("thinking");
  if (thinking != body.end() && thinking->is_object() && thinking->value("type", std::string()) == "disabled") {
    plan.render.enable_thinking = false;
  }
  DS_TRY(build_chat_prompt(ctx, std::move(plan), &p.spec));
  p.formatter = std::make_unique<MessagesFormatter>(ctx.model_id, static_cast<int64_t>(p.spec.prompt.size()));
  return p;
}

}  // namespace ds
