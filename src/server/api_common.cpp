// Shared request/response plumbing for the generation APIs (see api_common.h).
#include "server/api_common.h"

#include <chrono>
#include <cmath>
#include <mutex>
#include <random>

#include <fmt/format.h>

namespace ds {

Result<json> parse_body(const std::string& body) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); i++) {
    char c = body[i];
    if (in_string) {
      if (c == '\\') i++;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return invalid_argument("request body nests deeper than {} levels", kMaxJsonDepth);
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("request body is not valid JSON");
  if (!j.is_object()) return invalid_argument("request body must be a JSON object");
  return j;
}

std::string json_text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& data, const char* event) {
  std::string out;
  if (event) out = fmt::format("event: {}\n", event);
  out += "data: ";
  out += json_text(data);
  out += "\n\n";
  return out;
}

int http_status_for(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnsupported: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kResourceExhausted: return 503;
    case StatusCode::kCancelled: return 499;
    default: return 500;
  }
}

json error_body(ApiStyle style, int http_status, const std::string& message) {
  if (style == ApiStyle::kAnthropic) {
    const char* type = "api_error";
    switch (http_status) {
      case 400: case 413: type = "invalid_request_error"; break;
      case 401: type = "authentication_error"; break;
      case 404: type = "not_found_error"; break;
      case 503: type = "overloaded_error"; break;
      default: break;
    }
    if (http_status == 413) type = "request_too_large";
    return json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
  }
  const char* type = "server_error";
  json code = nullptr;
  switch (http_status) {
    case 400: case 413: type = "invalid_request_error"; break;
    case 401: type = "invalid_request_error"; code = "invalid_api_key"; break;
    case 404: type = "invalid_request_error"; code = "model_not_found"; break;
    case 503: type = "server_error"; code = "server_overloaded"; break;
    default: break;
  }
  return json{{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}};
}

namespace {
const char* type_name(const json& v) { return v.type_name(); }
}  // namespace

Status field_string(const json& obj, const char* key, std::optional<std::string>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_string()) return invalid_argument("'{}': expected a string, got {}", key, type_name(*it));
  *out = it->get<std::string>();
  return Status::ok();
}

Status field_number(const json& obj, const char* key, std::optional<double>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return invalid_argument("'{}': expected a number, got {}", key, type_name(*it));
  double v = it->get<double>();
  if (!std::isfinite(v)) return invalid_argument("'{}': expected a finite number", key);
  *out = v;
  return Status::ok();
}

Status field_int(const json& obj, const char* key, std::optional<int64_t>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
    return Status::ok();
  }
  if (it->is_number_float()) {
    double v = it->get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) {
      *out = static_cast<int64_t>(v);
      return Status::ok();
    }
  }
  return invalid_argument("'{}': expected an integer, got {}", key, type_name(*it));
}

Status field_bool(const json& obj, const char* key, std::optional<bool>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) return invalid_argument("'{}': expected a boolean, got {}", key, type_name(*it));
  *out = it->get<bool>();
  return Status::ok();
}

Status field_stop(const json& obj, const char* key, std::vector<std::string>* out) {
  constexpr size_t kMaxStops = 16;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (it->is_string()) {
    out->push_back(it->get<std::string>());
    return Status::ok();
  }
  if (!it->is_array()) return invalid_argument("'{}': expected a string or an array of strings", key);
  if (it->size() > kMaxStops) return invalid_argument("'{}': at most {} stop strings, got {}", key, kMaxStops, it->size());
  for (const auto& s : *it) {
    if (!s.is_string()) return invalid_argument("'{}': expected an array of strings, found {}", key, type_name(s));
    out->push_back(s.get<std::string>());
  }
  return Status::ok();
}

Status parse_tools_with(const json& body, json* tools,
                        const std::function<Status(const json& tool, json* tools)>& each) {
  *tools = json::array();
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return Status::ok();
  if (!it->is_array()) return invalid_argument("'tools': expected an array");
  for (const auto& t : *it) {
    if (!t.is_object()) return invalid_argument("'tools': each tool must be an object");
    DS_TRY(each(t, tools));
  }
  return Status::ok();
}

Status check_model(const ApiContext& ctx, const std::optional<std::string>& model) {
  if (!model || model->empty()) return Status::ok();
  for (const auto& n : ctx.model_names) {
    if (n == *model) return Status::ok();
  }
  return not_found("The model '{}' does not exist; this server serves '{}' (add names with --model-alias)", *model,
                   ctx.model_id);
}

Status parse_sampling(const json& body, SamplingParams* out) {
  // Defaults when a field is omitted: the Qwen3.5/3.6 recommended sampling for thinking mode.
  out->temperature = kRecommendedSampling.temperature;
  out->top_p = kRecommendedSampling.top_p;
  out->top_k = kRecommendedSampling.top_k;
  out->min_p = kRecommendedSampling.min_p;
  std::optional<double> temperature, top_p, min_p, presence, frequency, repetition;
  std::optional<int64_t> top_k, seed;
  DS_TRY(field_number(body, "temperature", &temperature));
  DS_TRY(field_number(body, "top_p", &top_p));
  DS_TRY(field_number(body, "min_p", &min_p));
  DS_TRY(field_number(body, "presence_penalty", &presence));
  DS_TRY(field_number(body, "frequency_penalty", &frequency));
  DS_TRY(field_number(body, "repetition_penalty", &repetition));
  DS_TRY(field_int(body, "top_k", &top_k));
  DS_TRY(field_int(body, "seed", &seed));
  if (temperature) {
    if (*temperature < 0 || *temperature > 2) return invalid_argument("'temperature': expected 0..2, got {}", *temperature);
    out->temperature = static_cast<float>(*temperature);
  }
  if (top_p) {
    if (*top_p <= 0 || *top_p > 1) return invalid_argument("'top_p': expected (0, 1], got {}", *top_p);
    out->top_p = static_cast<float>(*top_p);
  }
  if (min_p) {
    if (*min_p < 0 || *min_p > 1) return invalid_argument("'min_p': expected 0..1, got {}", *min_p);
    out->min_p = static_cast<float>(*min_p);
  }
  if (top_k) {
    if (*top_k < 0 || *top_k > (1 << 20)) return invalid_argument("'top_k': expected 0..1048576, got {}", *top_k);
    out->top_k = static_cast<int32_t>(*top_k);
  }
  if (presence) {
    if (*presence < -2 || *presence > 2) return invalid_argument("'presence_penalty': expected -2..2, got {}", *presence);
    out->presence_penalty = static_cast<float>(*presence);
  }
  if (frequency) {
    if (*frequency < -2 || *frequency > 2) return invalid_argument("'frequency_penalty': expected -2..2, got {}", *frequency);
    out->frequency_penalty = static_cast<float>(*frequency);
  }
  if (repetition) {
    if (*repetition <= 0 || *repetition > 10) return invalid_argument("'repetition_penalty': expected (0, 10], got {}", *repetition);
    out->repetition_penalty = static_cast<float>(*repetition);
  }
  if (seed) {
    out->seed = static_cast<uint64_t>(*seed);
  } else {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard<std::mutex> lock(mu);
    out->seed = rng();
  }
  return Status::ok();
}

Status build_chat_prompt(const ApiContext& ctx, ChatPromptPlan plan, GenerationSpec* spec) {
  if (plan.messages.empty()) return invalid_argument("'messages': at least one message is required");
  bool offer_tools = plan.tool_choice != "none" && plan.render.tools.is_array() && !plan.render.tools.empty();
  if (!offer_tools) plan.render.tools = json::array();
  if ((plan.tool_choice == "required" || plan.named_tool) && !offer_tools) {
    return invalid_argument("'tool_choice': '{}' needs at least one tool in 'tools'", plan.tool_choice);
  }
  if (plan.named_tool) {
    bool found = false;
    for (const auto& t : plan.render.tools) {
      if (t.contains("function") && t["function"].value("name", std::string()) == plan.tool_choice) found = true;
    }
    if (!found) return invalid_argument("'tool_choice': function '{}' is not in 'tools'", plan.tool_choice);
  }
  if (!plan.response_instruction.empty()) {
    if (plan.messages[0].role == "system") {
      plan.messages[0].content += "\n\n" + plan.response_instruction;
    } else {
      ChatMessage sys;
      sys.role = "system";
      sys.content = plan.response_instruction;
      plan.messages.insert(plan.messages.begin(), sys);
    }
  }
  // A forced tool call skips thinking: the template closes the think block and we open the call.
  std::string forced;
  if (offer_tools && (plan.tool_choice == "required" || plan.named_tool)) {
    plan.render.enable_thinking = false;
    forced = plan.named_tool ? fmt::format("<tool_call>\n<function={}>\n", plan.tool_choice) : "<tool_call>\n<function=";
  }
  Result<std::string> rendered = ctx.text->render(plan.messages, plan.render);
  if (!rendered.is_ok()) return invalid_argument("{}", rendered.status().message());
  spec->prompt = ctx.text->encode(*rendered + forced, /*allow_special=*/true);
  spec->parser.starts_in_reasoning = plan.render.enable_thinking && plan.render.add_generation_prompt;
  spec->parser.parse_tool_calls = offer_tools;
  spec->parser.tools = plan.render.tools;
  spec->forced_prefix = forced;
  return Status::ok();
}

std::string make_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ds
