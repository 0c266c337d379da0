// Incremental output parsing: UTF-8 assembly, stop strings, and the adapter from the text module's
// assistant parser to the server's output events (ids, schema-typed arguments, tools-off text).
#include "server/output_parser.h"

#include <algorithm>
#include <mutex>
#include <random>

#include <fmt/format.h>

namespace ds {
namespace {

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  size_t n = std::min(s.size(), marker.size() - 1);
  for (size_t k = n; k > 0; k--) {
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

int utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;  // continuation or invalid lead byte: pass through as is
}
// The JSON schema type of parameter `param` of function `name` in an OpenAI tool list, or "".
std::string param_type(const nlohmann::ordered_json& tools, const std::string& name, const std::string& param) {
  if (!tools.is_array()) return "";
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const nlohmann::ordered_json* fn = t.contains("function") ? &t["function"] : &t;
    if (!fn->is_object() || fn->value("name", std::string()) != name) continue;
    auto params = fn->find("parameters");
    if (params == fn->end() || !params->is_object()) return "";
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return "";
    auto p = props->find(param);
    if (p == props->end() || !p->is_object()) return "";
    auto ty = p->find("type");
    if (ty == p->end()) return "";
    if (ty->is_string()) return ty->get<std::string>();
    if (ty->is_array() && !ty->empty() && (*ty)[0].is_string()) return (*ty)[0].get<std::string>();
    return "";
  }
  return "";
}

// The parser types a value as JSON when it parses; the schema has the last word: a `string`
// parameter stays text even when it looks like a number.
nlohmann::ordered_json typed_value(nlohmann::ordered_json value, const std::string& type) {
  if (type == "string" && !value.is_string()) return value.dump();
  return value;
}

// The canonical Qwen3.5 text of a call, for tool markup generated while no tools were offered.
std::string call_text(const ChatToolCall& c) {
  std::string out = "<tool_call>\n<function=" + c.name + ">\n";
  for (const auto& [k, v] : c.arguments.items()) {
    out += "<parameter=" + k + ">\n" + (v.is_string() ? v.get<std::string>() : v.dump()) + "\n</parameter>\n";
  }
  return out + "</function>\n</tool_call>";
}

}  // namespace

// ---- Utf8Assembler ----

std::string Utf8Assembler::push(std::string_view bytes) {
  pending_.append(bytes);
  size_t n = pending_.size();
  size_t start = n;
  // Walk back over at most 3 continuation bytes to the lead byte of the last sequence.
  while (start > 0 && n - start < 4) {
    start--;
    if ((static_cast<unsigned char>(pending_[start]) & 0xC0) != 0x80) break;
  }
  size_t keep = 0;
  if (start < n && utf8_len(static_cast<unsigned char>(pending_[start])) > static_cast<int>(n - start)) {
    keep = n - start;
  }
  std::string out = pending_.substr(0, n - keep);
  pending_.erase(0, n - keep);
  return out;
}

std::string Utf8Assembler::flush() {
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  return out;
}

// ---- StopMatcher ----

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (s.empty()) continue;
    max_stop_ = std::max(max_stop_, s.size());
    stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, std::string());
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  size_t keep = 0;
  for (const auto& s : stops_) keep = std::max(keep, partial_suffix(held_, s));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return "";
  return std::exchange(held_, std::string());
}

// ---- OutputParser ----

OutputParser::OutputParser(OutputParserOptions options)
    : options_(std::move(options)), parser_(options_.starts_in_reasoning) {}

std::vector<OutputEvent> OutputParser::push(std::string_view text) {
  std::vector<AssistantEvent> events;
  parser_.feed(text, &events);
  std::vector<OutputEvent> out;
  convert(events, out);
  return out;
}

std::vector<OutputEvent> OutputParser::finish() {
  std::vector<AssistantEvent> events;
  parser_.finish(&events);
  std::vector<OutputEvent> out;
  convert(events, out);
  return out;
}

void OutputParser::convert(std::vector<AssistantEvent>& events, std::vector<OutputEvent>& out) {
  auto emit_text = [&out](OutputEvent::Kind kind, std::string text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == kind) {
      out.back().text += text;
      return;
    }
    OutputEvent e;
    e.kind = kind;
    e.text = std::move(text);
    out.push_back(std::move(e));
  };
  for (AssistantEvent& e : events) {
    switch (e.kind) {
      case AssistantEvent::Kind::kReasoning: emit_text(OutputEvent::Kind::kReasoning, std::move(e.text)); break;
      case AssistantEvent::Kind::kContent: emit_text(OutputEvent::Kind::kContent, std::move(e.text)); break;
      case AssistantEvent::Kind::kToolCallStarted:
        pending_ = ChatToolCall();
        pending_.name = e.text;
        break;
      case AssistantEvent::Kind::kToolCallArgument:
        pending_.arguments[e.text] = typed_value(std::move(e.value), param_type(options_.tools, pending_.name, e.text));
        break;
      case AssistantEvent::Kind::kToolCallFinished:
        if (!options_.parse_tool_calls) {
          emit_text(OutputEvent::Kind::kContent, call_text(pending_));
          break;
        }
        OutputEvent call;
        call.kind = OutputEvent::Kind::kToolCall;
        call.tool_call = std::move(pending_);
        call.tool_call.id = make_call_id();
        n_tool_calls_++;
        out.push_back(std::move(call));
        break;
    }
  }
}

std::string make_call_id() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

}  // namespace ds
