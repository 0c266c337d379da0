// OpenAI Responses API (what Codex sends): input items -> chat turns, and the typed event stream
// (response.created, output_item.added, output_text.delta, function_call_arguments.delta/done,
// response.completed). Non-obvious choice: the server is stateless, so `previous_response_id` is a
// controlled 400 telling the client to resend the full input; non-function tools (web_search,
// namespace, image_generation, ...) are accepted and ignored because Codex always sends them.
#include <fmt/format.h>

#include "server/api_common.h"

namespace ds {
namespace {

Status item_text(const json& content, const std::string& where, std::string* out) {
  if (content.is_null()) return Status::ok();
  if (content.is_string()) {
    *out += content.get<std::string>();
    return Status::ok();
  }
  if (!content.is_array()) return invalid_argument("{}: 'content' must be a string or an array of parts", where);
  for (const auto& part : content) {
    if (!part.is_object()) return invalid_argument("{}: content parts must be objects", where);
    std::string type = part.value("type", std::string());
    if (type == "input_text" || type == "output_text" || type == "text" || type == "reasoning_text" ||
        type == "summary_text") {
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) return invalid_argument("{}: a text part needs a string 'text'", where);
      *out += t->get<std::string>();
    } else if (type == "refusal") {
      *out += part.value("refusal", std::string());
    } else {
      return invalid_argument("{}: content part type '{}' is not supported (text only)", where, type);
    }
  }
  return Status::ok();
}

Status parse_input(const json& body, std::vector<ChatMessage>* msgs) {
  std::optional<std::string> instructions;
  DS_TRY(field_string(body, "instructions", &instructions));
  std::string system = instructions.value_or("");
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) return invalid_argument("'input': required");
  std::vector<ChatMessage> turns;
  if (it->is_string()) {
    ChatMessage m;
    m.role = "user";
    m.content = it->get<std::string>();
    turns.push_back(std::move(m));
  } else if (it->is_array()) {
    std::string pending_reasoning;
    // Calls made in one assistant turn attach to that turn's message.
    auto attach_call = [&](ChatToolCall call) {
      if (turns.empty() || turns.back().role != "assistant") {
        ChatMessage m;
        m.role = "assistant";
        m.reasoning = std::exchange(pending_reasoning, std::string());
        turns.push_back(std::move(m));
      }
      turns.back().tool_calls.push_back(std::move(call));
    };
    for (size_t i = 0; i < it->size(); i++) {
      const json& item = (*it)[i];
      std::string where = fmt::format("input[{}]", i);
      if (!item.is_object()) return invalid_argument("{}: expected an object", where);
      std::string type = item.value("type", std::string("message"));
      if (type == "message") {
        std::optional<std::string> role;
        DS_TRY(field_string(item, "role", &role).with_context(where));
        if (!role) return invalid_argument("{}: 'role' is required", where);
        std::string text;
        if (item.contains("content")) DS_TRY(item_text(item["content"], where, &text));
        if (*role == "system" || *role == "developer") {
          system += (system.empty() ? "" : "\n\n") + text;
          continue;
        }
        if (*role != "user" && *role != "assistant") return invalid_argument("{}: unknown role '{}'", where, *role);
        ChatMessage m;
        m.role = *role;
        m.content = std::move(text);
        if (m.role == "assistant") m.reasoning = std::exchange(pending_reasoning, std::string());
        turns.push_back(std::move(m));
      } else if (type == "function_call") {
        std::optional<std::string> name, args, call_id;
        DS_TRY(field_string(item, "name", &name).with_context(where));
        DS_TRY(field_string(item, "arguments", &args).with_context(where));
        DS_TRY(field_string(item, "call_id", &call_id).with_context(where));
        if (!name) return invalid_argument("{}: function_call needs 'name'", where);
        ChatToolCall call;
        call.id = call_id.value_or("");
        call.name = *name;
        if (args && !args->empty()) {
          json parsed = json::parse(*args, nullptr, false);
          if (parsed.is_discarded() || !parsed.is_object()) {
            return invalid_argument("{}: 'arguments' is not a JSON object", where);
          }
          call.arguments = std::move(parsed);
        }
        attach_call(std::move(call));
      } else if (type == "custom_tool_call") {
        // A freeform tool call (Codex apply_patch): its text input becomes the one argument "input".
        std::optional<std::string> name, input, call_id;
        DS_TRY(field_string(item, "name", &name).with_context(where));
        DS_TRY(field_string(item, "input", &input).with_context(where));
        DS_TRY(field_string(item, "call_id", &call_id).with_context(where));
        if (!name) return invalid_argument("{}: custom_tool_call needs 'name'", where);
        ChatToolCall call;
        call.id = call_id.value_or("");
        call.name = *name;
        call.arguments = json{{"input", input.value_or("")}};
        attach_call(std::move(call));
      } else if (type == "function_call_output" || type == "custom_tool_call_output") {
        ChatMessage m;
        m.role = "tool";
        std::optional<std::string> call_id;
        DS_TRY(field_string(item, "call_id", &call_id).with_context(where));
        m.tool_call_id = call_id.value_or("");
        if (item.contains("output")) DS_TRY(item_text(item["output"], where, &m.content));
        turns.push_back(std::move(m));
      } else if (type == "reasoning") {
        std::string text;
        if (item.contains("content")) DS_TRY(item_text(item["content"], where, &text));
        if (text.empty() && item.contains("summary")) DS_TRY(item_text(item["summary"], where, &text));
        pending_reasoning += text;
      }
      // Other item types (web_search_call, local_shell_call, ...) carry nothing we can render.
    }
  } else {
    return invalid_argument("'input': expected a string or an array of items");
  }
  if (!system.empty()) {
    ChatMessage m;
    m.role = "system";
    m.content = std::move(system);
    msgs->push_back(std::move(m));
  }
  for (auto& t : turns) msgs->push_back(std::move(t));
  return Status::ok();
}

// Responses tools are flat ({type, name, description, parameters}); the template wants the chat form.
Status parse_tools(const json& body, json* tools) {
  return parse_tools_with(body, tools, [](const json& t, json* out) -> Status {
    if (t.value("type", std::string()) != "function") return Status::ok();
    if (!t.contains("name") || !t["name"].is_string()) return invalid_argument("'tools': a function tool needs 'name'");
    json fn{{"name", t["name"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    fn["parameters"] = t.contains("parameters") && t["parameters"].is_object() ? t["parameters"] : json::object();
    out->push_back(json{{"type", "function"}, {"function", fn}});
    return Status::ok();
  });
}

Status parse_tool_choice(const json& body, ChatPromptPlan* plan) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return Status::ok();
  if (it->is_string()) {
    std::string c = it->get<std::string>();
    if (c != "auto" && c != "none" && c != "required") return invalid_argument("'tool_choice': unknown value '{}'", c);
    plan->tool_choice = c;
    return Status::ok();
  }
  if (it->is_object() && it->value("type", std::string()) == "function" && it->contains("name") &&
      (*it)["name"].is_string()) {
    plan->tool_choice = (*it)["name"].get<std::string>();
    plan->named_tool = true;
    return Status::ok();
  }
  return Status::ok();  // hosted-tool choices ({type: "web_search"}) fall back to auto
}

class ResponsesFormatter : public ApiFormatter {
 public:
  explicit ResponsesFormatter(std::string model) : model_(std::move(model)) {}

  std::string stream_begin() override {
    json r = envelope("in_progress");
    std::string out = event("response.created", json{{"response", r}});
    return out + event("response.in_progress", json{{"response", r}});
  }

  std::string stream_events(const std::vector<OutputEvent>& events) override {
    std::string out;
    for (const auto& e : events) {
      if (e.kind == OutputEvent::Kind::kToolCall) {
        out += close_open_item();
        json item{{"type", "function_call"}, {"id", make_id("fc_")}, {"call_id", e.tool_call.id},
                  {"name", e.tool_call.name}, {"arguments", ""}, {"status", "in_progress"}};
        std::string args = json_text(e.tool_call.arguments);
        int idx = static_cast<int>(items_.size());
        out += event("response.output_item.added", json{{"output_index", idx}, {"item", item}});
        out += event("response.function_call_arguments.delta",
                     json{{"item_id", item["id"]}, {"output_index", idx}, {"delta", args}});
        out += event("response.function_call_arguments.done",
                     json{{"item_id", item["id"]}, {"output_index", idx}, {"name", e.tool_call.name}, {"arguments", args}});
        item["arguments"] = args;
        item["status"] = "completed";
        out += event("response.output_item.done", json{{"output_index", idx}, {"item", item}});
        items_.push_back(item);
        continue;
      }
      bool reasoning = e.kind == OutputEvent::Kind::kReasoning;
      if (open_ && open_reasoning_ != reasoning) out += close_open_item();
      if (!open_) out += open_item(reasoning);
      open_text_ += e.text;
      const char* type = reasoning ? "response.reasoning_text.delta" : "response.output_text.delta";
      out += event(type, json{{"item_id", open_id_}, {"output_index", items_.size()}, {"content_index", 0}, {"delta", e.text}});
    }
    return out;
  }

  std::string stream_end(const GenerationOutcome& o) override {
    std::string out = close_open_item();
    json r = final_response(o, items_);
    const char* type = o.finish == GenerationFinish::kLength ? "response.incomplete" : "response.completed";
    return out + event(type, json{{"response", r}});
  }

  std::string stream_error(const Status& s) override {
    json r = envelope("failed");
    r["error"] = json{{"code", "server_error"}, {"message", s.message()}};
    return event("response.failed", json{{"response", r}});
  }

  json response(const GenerationOutcome& o) override {
    json items = json::array();
    if (!o.reasoning.empty()) items.push_back(reasoning_item(make_id("rs_"), o.reasoning));
    if (!o.content.empty()) items.push_back(message_item(make_id("msg_"), o.content, "completed"));
    for (const auto& c : o.tool_calls) {
      items.push_back(json{{"type", "function_call"}, {"id", make_id("fc_")}, {"call_id", c.id}, {"name", c.name},
                           {"arguments", json_text(c.arguments)}, {"status", "completed"}});
    }
    return final_response(o, items);
  }

 private:
  std::string event(const char* type, json data) {
    data["type"] = type;
    data["sequence_number"] = seq_++;
    return sse_event(data, type);
  }
  json envelope(const char* status) const {
    return json{{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", status}, {"model", model_},
                {"output", json::array()}, {"error", nullptr}, {"incomplete_details", nullptr},
                {"parallel_tool_calls", true}, {"tool_choice", "auto"}, {"tools", json::array()}};
  }
  static json reasoning_item(const std::string& id, const std::string& text) {
    return json{{"type", "reasoning"}, {"id", id}, {"summary", json::array()},
                {"content", json::array({json{{"type", "reasoning_text"}, {"text", text}}})}};
  }
  static json message_item(const std::string& id, const std::string& text, const char* status) {
    json content = json::array();
    if (status == std::string("completed")) {
      content.push_back(json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}});
    }
    return json{{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"}, {"content", content}};
  }
  json final_response(const GenerationOutcome& o, const json& items) const {
    bool incomplete = o.finish == GenerationFinish::kLength;
    json r = envelope(incomplete ? "incomplete" : "completed");
    r["output"] = items;
    if (incomplete) r["incomplete_details"] = json{{"reason", "max_output_tokens"}};
    r["usage"] = json{{"input_tokens", o.prompt_tokens},
                      {"input_tokens_details", {{"cached_tokens", o.cached_tokens}}},
                      {"output_tokens", o.completion_tokens},
                      {"output_tokens_details", {{"reasoning_tokens", 0}}},
                      {"total_tokens", o.prompt_tokens + o.completion_tokens}};
    return r;
  }
  std::string open_item(bool reasoning) {
    open_ = true;
    open_reasoning_ = reasoning;
    open_text_.clear();
    open_id_ = make_id(reasoning ? "rs_" : "msg_");
    int idx = static_cast<int>(items_.size());
    if (reasoning) {
      json item{{"type", "reasoning"}, {"id", open_id_}, {"summary", json::array()}};
      std::string out = event("response.output_item.added", json{{"output_index", idx}, {"item", item}});
      out += event("response.content_part.added",
                   json{{"item_id", open_id_}, {"output_index", idx}, {"content_index", 0},
                        {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
      return out;
    }
    std::string out = event("response.output_item.added",
                            json{{"output_index", idx}, {"item", message_item(open_id_, "", "in_progress")}});
    out += event("response.content_part.added",
                 json{{"item_id", open_id_}, {"output_index", idx}, {"content_index", 0},
                      {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
    return out;
  }
  std::string close_open_item() {
    if (!open_) return "";
    open_ = false;
    int idx = static_cast<int>(items_.size());
    std::string out;
    json item;
    if (open_reasoning_) {
      out += event("response.reasoning_text.done",
                   json{{"item_id", open_id_}, {"output_index", idx}, {"content_index", 0}, {"text", open_text_}});
      out += event("response.content_part.done",
                   json{{"item_id", open_id_}, {"output_index", idx}, {"content_index", 0},
                        {"part", {{"type", "reasoning_text"}, {"text", open_text_}}}});
      item = reasoning_item(open_id_, open_text_);
    } else {
      out += event("response.output_text.done",
                   json{{"item_id", open_id_}, {"output_index", idx}, {"content_index", 0}, {"text", open_text_}});
      json part{{"type", "output_text"}, {"text", open_text_}, {"annotations", json::array()}};
      out += event("response.content_part.done",
                   json{{"item_id", open_id_}, {"output_index", idx}, {"content_index", 0}, {"part", part}});
      item = message_item(open_id_, open_text_, "completed");
    }
    out += event("response.output_item.done", json{{"output_index", idx}, {"item", item}});
    items_.push_back(item);
    return out;
  }

  std::string id_ = make_id("resp_");
  int64_t created_ = unix_time();
  std::string model_;
  int64_t seq_ = 0;
  json items_ = json::array();
  bool open_ = false;
  bool open_reasoning_ = false;
  std::string open_id_;
  std::string open_text_;
};

}  // namespace

Result<PreparedRequest> prepare_responses(const ApiContext& ctx, const json& body) {
  std::optional<std::string> model, previous;
  DS_TRY(field_string(body, "model", &model));
  DS_TRY(check_model(ctx, model));
  DS_TRY(field_string(body, "previous_response_id", &previous));
  if (previous) {
    return invalid_argument(
        "'previous_response_id' is not supported: this server stores no responses; send the whole conversation "
        "in 'input' (store: false)");
  }
  PreparedRequest p;
  DS_TRY(parse_sampling(body, &p.spec.sampling));
  std::optional<int64_t> max_tokens;
  DS_TRY(field_int(body, "max_output_tokens", &max_tokens));
  if (max_tokens) {
    if (*max_tokens < 1) return invalid_argument("'max_output_tokens': expected a positive integer, got {}", *max_tokens);
    p.spec.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
    p.max_tokens_given = true;
  }
  std::optional<bool> stream;
  DS_TRY(field_bool(body, "stream", &stream));
  p.stream = stream.value_or(false);
  ChatPromptPlan plan;
  DS_TRY(parse_input(body, &plan.messages));
  json tools;
  DS_TRY(parse_tools(body, &tools));
  plan.render.tools = tools;
  DS_TRY(parse_tool_choice(body, &plan));
  auto reasoning = body.find("reasoning");
  if (reasoning != body.end() && reasoning->is_object()) {
    std::string effort = reasoning->value("effort", std::string());
    if (effort == "none" || effort == "minimal") plan.render.enable_thinking = false;
  }
  auto text = body.find("text");
  if (text != body.end() && text->is_object() && text->contains("format") && (*text)["format"].is_object()) {
    const json& f = (*text)["format"];
    std::string type = f.value("type", std::string());
    if (type == "json_object") {
      plan.response_instruction = "Respond with a single valid JSON object and nothing else.";
    } else if (type == "json_schema" && f.contains("schema")) {
      plan.response_instruction =
          "Respond with a single valid JSON object that conforms to this JSON schema, and nothing else:\n" +
          json_text(f["schema"]);
    }
  }
  DS_TRY(build_chat_prompt(ctx, std::move(plan), &p.spec));
  p.formatter = std::make_unique<ResponsesFormatter>(ctx.model_id);
  return p;
}

}  // namespace ds
