// OpenAI Chat Completions and (legacy) Completions: request parsing and response formatting.
// Non-obvious choice: a tool call is sent as one complete delta (id, name and all arguments) once its
// closing tag is generated, because the model's XML arguments only become JSON when the call is whole.
#include <fmt/format.h>

#include "server/api_common.h"

namespace ds {
namespace {

// Text of an OpenAI `content`: a string, null, or an array of {type:"text", text} parts.
Status content_text(const json& content, const char* where, std::string* out) {
  if (content.is_null()) return Status::ok();
  if (content.is_string()) {
    *out = content.get<std::string>();
    return Status::ok();
  }
  if (!content.is_array()) return invalid_argument("{}: 'content' must be a string or an array of parts", where);
  for (const auto& part : content) {
    if (!part.is_object()) return invalid_argument("{}: content parts must be objects", where);
    std::string type = part.value("type", std::string("text"));
    if (type == "text" || type == "input_text" || type == "output_text") {
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) return invalid_argument("{}: a text part needs a string 'text'", where);
      *out += t->get<std::string>();
    } else {
      return invalid_argument("{}: content part type '{}' is not supported (text only)", where, type);
    }
  }
  return Status::ok();
}

Status parse_messages(const json& body, std::vector<ChatMessage>* out) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array()) return invalid_argument("'messages': required, an array");
  if (it->empty()) return invalid_argument("'messages': at least one message is required");
  for (size_t i = 0; i < it->size(); i++) {
    const json& m = (*it)[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return invalid_argument("{}: expected an object", where);
    std::optional<std::string> role;
    DS_TRY(field_string(m, "role", &role).with_context(where));
    if (!role) return invalid_argument("{}: 'role' is required", where);
    ChatMessage msg;
    msg.role = *role == "developer" ? "system" : *role;
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool") {
      return invalid_argument("{}: unknown role '{}'", where, *role);
    }
    if (m.contains("content")) DS_TRY(content_text(m["content"], where.c_str(), &msg.content));
    std::optional<std::string> s;
    DS_TRY(field_string(m, "reasoning_content", &s).with_context(where));
    if (s) msg.reasoning = *s;
    s.reset();
    DS_TRY(field_string(m, "tool_call_id", &s).with_context(where));
    if (s) msg.tool_call_id = *s;
    s.reset();
    DS_TRY(field_string(m, "name", &s).with_context(where));
    if (s) msg.name = *s;
    auto tc = m.find("tool_calls");
    if (tc != m.end() && !tc->is_null()) {
      if (!tc->is_array()) return invalid_argument("{}: 'tool_calls' must be an array", where);
      for (const auto& call : *tc) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
          return invalid_argument("{}: each tool call needs a 'function' object", where);
        }
        const json& fn = call["function"];
        ChatToolCall c;
        c.id = call.value("id", std::string());
        if (!fn.contains("name") || !fn["name"].is_string()) return invalid_argument("{}: tool call without a name", where);
        c.name = fn["name"].get<std::string>();
        auto args = fn.find("arguments");
        if (args != fn.end() && args->is_string()) {
          json parsed = json::parse(args->get<std::string>(), nullptr, false);
          if (parsed.is_discarded() || !parsed.is_object()) {
            return invalid_argument("{}: tool call '{}': 'arguments' is not a JSON object", where, c.name);
          }
          c.arguments = std::move(parsed);
        } else if (args != fn.end() && args->is_object()) {
          c.arguments = *args;
        }
        msg.tool_calls.push_back(std::move(c));
      }
    }
    out->push_back(std::move(msg));
  }
  return Status::ok();
}

// tools: function tools kept in OpenAI form; other tool types are ignored.
Status parse_tools(const json& body, json* tools) {
  return parse_tools_with(body, tools, [](const json& t, json* out) -> Status {
    if (t.value("type", std::string("function")) != "function") return Status::ok();
    if (!t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string()) {
      return invalid_argument("'tools': a function tool needs 'function.name'");
    }
    out->push_back(t);
    return Status::ok();
  });
}

Status parse_tool_choice(const json& body, ChatPromptPlan* plan) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return Status::ok();
  if (it->is_string()) {
    std::string c = it->get<std::string>();
    if (c != "auto" && c != "none" && c != "required") {
      return invalid_argument("'tool_choice': expected auto, none, required or a function, got '{}'", c);
    }
    plan->tool_choice = c;
    return Status::ok();
  }
  if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
      (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
    plan->tool_choice = (*it)["function"]["name"].get<std::string>();
    plan->named_tool = true;
    return Status::ok();
  }
  return invalid_argument("'tool_choice': expected a string or {{\"type\":\"function\",\"function\":{{\"name\":...}}}}");
}

std::string json_instruction(const json& format) {
  if (!format.is_object()) return "";
  std::string type = format.value("type", std::string());
  if (type == "json_object") return "Respond with a single valid JSON object and nothing else.";
  if (type == "json_schema" && format.contains("json_schema") && format["json_schema"].is_object() &&
      format["json_schema"].contains("schema")) {
    return "Respond with a single valid JSON object that conforms to this JSON schema, and nothing else:\n" +
           json_text(format["json_schema"]["schema"]);
  }
  return "";
}

Status parse_thinking_flag(const json& body, bool* enable) {
  auto kw = body.find("chat_template_kwargs");
  if (kw != body.end() && kw->is_object()) {
    std::optional<bool> b;
    DS_TRY(field_bool(*kw, "enable_thinking", &b).with_context("chat_template_kwargs"));
    if (b) *enable = *b;
  }
  std::optional<std::string> effort;
  DS_TRY(field_string(body, "reasoning_effort", &effort));
  if (effort && (*effort == "none" || *effort == "minimal")) *enable = false;
  return Status::ok();
}

Status parse_common(const json& body, PreparedRequest* p) {
  DS_TRY(parse_sampling(body, &p->spec.sampling));
  std::optional<int64_t> max_tokens, max_completion, n;
  DS_TRY(field_int(body, "max_tokens", &max_tokens));
  DS_TRY(field_int(body, "max_completion_tokens", &max_completion));
  if (max_completion) max_tokens = max_completion;
  if (max_tokens) {
    if (*max_tokens < 1) return invalid_argument("'max_tokens': expected a positive integer, got {}", *max_tokens);
    p->spec.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
    p->max_tokens_given = true;
  }
  DS_TRY(field_int(body, "n", &n));
  if (n && *n != 1) return invalid_argument("'n': only 1 choice is supported, got {}", *n);
  DS_TRY(field_stop(body, "stop", &p->spec.stop));
  std::optional<bool> stream, logprobs;
  DS_TRY(field_bool(body, "stream", &stream));
  DS_TRY(field_bool(body, "logprobs", &logprobs));
  if (logprobs && *logprobs) return invalid_argument("'logprobs': not supported");
  p->stream = stream.value_or(false);
  return Status::ok();
}

bool include_usage(const json& body) {
  auto it = body.find("stream_options");
  return it != body.end() && it->is_object() && it->value("include_usage", false) == true;
}

json usage_json(const GenerationOutcome& o) {
  return json{{"prompt_tokens", o.prompt_tokens},
              {"completion_tokens", o.completion_tokens},
              {"total_tokens", o.prompt_tokens + o.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
}

const char* finish_reason(const GenerationOutcome& o) {
  switch (o.finish) {
    case GenerationFinish::kLength: return "length";
    case GenerationFinish::kToolCalls: return "tool_calls";
    default: return "stop";
  }
}

// The end of an OpenAI stream (chat and completions alike): the final chunk, the usage chunk when the
// client asked for it (stream_options.include_usage: no choices, usage only), then [DONE].
std::string openai_stream_end(const json& final_chunk, json usage_base, bool include_usage, const GenerationOutcome& o) {
  std::string out = sse_event(final_chunk);
  if (include_usage) {
    usage_base["choices"] = json::array();
    usage_base["usage"] = usage_json(o);
    out += sse_event(usage_base);
  }
  return out + "data: [DONE]\n\n";
}

std::string openai_stream_error(const Status& s) {
  return sse_event(error_body(ApiStyle::kOpenAI, http_status_for(s), s.message())) + "data: [DONE]\n\n";
}

json tool_call_json(const ChatToolCall& c, int index, bool with_index) {
  json j{{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", json_text(c.arguments)}}}};
  if (with_index) j["index"] = index;
  return j;
}

class ChatFormatter : public ApiFormatter {
 public:
  ChatFormatter(std::string model, bool include_usage, bool parallel_tools)
      : model_(std::move(model)), include_usage_(include_usage), parallel_tools_(parallel_tools) {}

  std::string stream_begin() override { return sse_event(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr)); }

  std::string stream_events(const std::vector<OutputEvent>& events) override {
    std::string out;
    for (const auto& e : events) {
      if (e.kind == OutputEvent::Kind::kToolCall) {
        if (!parallel_tools_ && n_tools_ > 0) continue;
        out += sse_event(chunk(json{{"tool_calls", json::array({tool_call_json(e.tool_call, n_tools_, true)})}}, nullptr));
        n_tools_++;
      } else {
        const char* key = e.kind == OutputEvent::Kind::kReasoning ? "reasoning_content" : "content";
        out += sse_event(chunk(json{{key, e.text}}, nullptr));
      }
    }
    return out;
  }

  std::string stream_end(const GenerationOutcome& o) override {
    return openai_stream_end(chunk(json::object(), finish_reason(o)), base(), include_usage_, o);
  }

  std::string stream_error(const Status& s) override { return openai_stream_error(s); }

  json response(const GenerationOutcome& o) override {
    json msg{{"role", "assistant"}, {"content", o.content.empty() && !o.tool_calls.empty() ? json(nullptr) : json(o.content)}};
    if (!o.reasoning.empty()) msg["reasoning_content"] = o.reasoning;
    if (!o.tool_calls.empty()) {
      json calls = json::array();
      for (size_t i = 0; i < o.tool_calls.size() && (parallel_tools_ || i == 0); i++) {
        calls.push_back(tool_call_json(o.tool_calls[i], static_cast<int>(i), false));
      }
      msg["tool_calls"] = calls;
    }
    json r = base();
    r["object"] = "chat.completion";
    r["choices"] = json::array({json{{"index", 0}, {"message", msg}, {"finish_reason", finish_reason(o)}, {"logprobs", nullptr}}});
    r["usage"] = usage_json(o);
    return r;
  }

 private:
  json base() const {
    return json{{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_},
                {"system_fingerprint", "deltaserve"}};
  }
  json chunk(json delta, const char* finish) const {
    json c = base();
    c["choices"] = json::array({json{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                     {"finish_reason", finish ? json(finish) : json(nullptr)}}});
    return c;
  }

  std::string id_ = make_id("chatcmpl-");
  int64_t created_ = unix_time();
  std::string model_;
  bool include_usage_;
  bool parallel_tools_;
  int n_tools_ = 0;
};

class CompletionFormatter : public ApiFormatter {
 public:
  CompletionFormatter(std::string model, bool include_usage) : model_(std::move(model)), include_usage_(include_usage) {}
  std::string stream_begin() override { return ""; }
  std::string stream_events(const std::vector<OutputEvent>& events) override {
    std::string out;
    for (const auto& e : events) out += sse_event(choice(e.text, nullptr));
    return out;
  }
  std::string stream_end(const GenerationOutcome& o) override {
    return openai_stream_end(choice("", finish_reason(o)), base(), include_usage_, o);
  }
  std::string stream_error(const Status& s) override { return openai_stream_error(s); }
  json response(const GenerationOutcome& o) override {
    json r = choice(o.content, finish_reason(o));
    r["usage"] = usage_json(o);
    return r;
  }

 private:
  json base() const { return json{{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_}}; }
  json choice(const std::string& text, const char* finish) const {
    json c = base();
    c["choices"] = json::array({json{{"index", 0}, {"text", text}, {"logprobs", nullptr},
                                     {"finish_reason", finish ? json(finish) : json(nullptr)}}});
    return c;
  }
  std::string id_ = make_id("cmpl-");
  int64_t created_ = unix_time();
  std::string model_;
  bool include_usage_;
};

}  // namespace

Result<PreparedRequest> prepare_chat_completions(const ApiContext& ctx, const json& body) {
  std::optional<std::string> model;
  DS_TRY(field_string(body, "model", &model));
  DS_TRY(check_model(ctx, model));
  PreparedRequest p;
  DS_TRY(parse_common(body, &p));
  ChatPromptPlan plan;
  DS_TRY(parse_messages(body, &plan.messages));
  json tools;
  DS_TRY(parse_tools(body, &tools));
  plan.render.tools = tools;
  DS_TRY(parse_tool_choice(body, &plan));
  DS_TRY(parse_thinking_flag(body, &plan.render.enable_thinking));
  auto rf = body.find("response_format");
  if (rf != body.end()) plan.response_instruction = json_instruction(*rf);
  std::optional<bool> parallel;
  DS_TRY(field_bool(body, "parallel_tool_calls", &parallel));
  DS_TRY(build_chat_prompt(ctx, std::move(plan), &p.spec));
  p.formatter = std::make_unique<ChatFormatter>(ctx.model_id, include_usage(body), parallel.value_or(true));
  return p;
}

Result<PreparedRequest> prepare_completions(const ApiContext& ctx, const json& body) {
  std::optional<std::string> model;
  DS_TRY(field_string(body, "model", &model));
  DS_TRY(check_model(ctx, model));
  PreparedRequest p;
  DS_TRY(parse_common(body, &p));
  std::optional<bool> echo;
  DS_TRY(field_bool(body, "echo", &echo));
  if (echo && *echo) return invalid_argument("'echo': not supported");
  auto it = body.find("prompt");
  if (it == body.end()) return invalid_argument("'prompt': required");
  const json* prompt = &*it;
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  if (prompt->is_string()) {
    p.spec.prompt = ctx.text->encode(prompt->get<std::string>(), /*allow_special=*/true);
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
    for (const auto& t : *prompt) {
      if (!t.is_number_integer()) return invalid_argument("'prompt': a token array must hold only integers");
      int64_t id = t.get<int64_t>();
      if (id < 0 || id >= ctx.info.n_vocab) {
        return invalid_argument("'prompt': token id {} is outside the vocabulary (0..{})", id, ctx.info.n_vocab - 1);
      }
      p.spec.prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    return invalid_argument("'prompt': expected a string, one string in an array, or an array of token ids");
  }
  if (p.spec.prompt.empty()) return invalid_argument("'prompt': empty");
  p.spec.raw = true;
  if (!p.max_tokens_given) {
    p.spec.max_tokens = 16;  // the OpenAI default for completions
    p.max_tokens_given = true;
  }
  p.formatter = std::make_unique<CompletionFormatter>(ctx.model_id, include_usage(body));
  return p;
}

}  // namespace ds
