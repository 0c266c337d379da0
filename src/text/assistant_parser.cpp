// The assistant output parser. One loop consumes the buffer in the current mode (reasoning, content,
// inside a tool call) and stops where a decision needs more text; trimming of reasoning and content
// is done across deltas by holding back trailing whitespace.
#include "text/assistant_parser.h"

#include <algorithm>

#include "text/chat_template.h"

namespace ds {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

nlohmann::ordered_json parse_value(std::string_view text) {
  // Deeply nested brackets would make the recursive JSON parser recurse as deep; keep those as text.
  size_t brackets = std::count(text.begin(), text.end(), '[') + std::count(text.begin(), text.end(), '{');
  if (brackets <= 512) {
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!v.is_discarded()) return v;
  }
  return nlohmann::ordered_json(std::string(text));
}

// Parses "<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>...</function>\n</tool_call>".
bool parse_tool_call(std::string_view block, ChatToolCall* call) {
  std::string_view s = trim(block.substr(kCallOpen.size(), block.size() - kCallOpen.size() - kCallClose.size()));
  constexpr std::string_view kFunction = "<function=";
  if (s.substr(0, kFunction.size()) != kFunction) return false;
  s.remove_prefix(kFunction.size());
  size_t gt = s.find('>');
  if (gt == 0 || gt == std::string_view::npos) return false;
  call->name = std::string(s.substr(0, gt));
  if (call->name.find('\n') != std::string::npos || call->name.find('<') != std::string::npos) return false;
  s.remove_prefix(gt + 1);
  call->arguments = nlohmann::ordered_json::object();
  while (true) {
    s = trim(s);
    if (s == "</function>") return true;
    constexpr std::string_view kParam = "<parameter=";
    constexpr std::string_view kParamClose = "</parameter>";
    if (s.substr(0, kParam.size()) != kParam) return false;
    s.remove_prefix(kParam.size());
    gt = s.find('>');
    if (gt == 0 || gt == std::string_view::npos) return false;
    std::string name(s.substr(0, gt));
    if (name.find('\n') != std::string::npos || name.find('<') != std::string::npos) return false;
    s.remove_prefix(gt + 1);
    size_t end = s.find(kParamClose);
    if (end == std::string_view::npos) return false;
    std::string_view value = s.substr(0, end);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    call->arguments[name] = parse_value(value);
    s.remove_prefix(end + kParamClose.size());
  }
}

}  // namespace

AssistantStreamParser::AssistantStreamParser(bool thinking_enabled)
    : mode_(thinking_enabled ? Mode::kReasoning : Mode::kContent) {}

void AssistantStreamParser::feed(std::string_view text, std::vector<AssistantEvent>* events) {
  buf_.append(text);
  process(false, events);
}

void AssistantStreamParser::finish(std::vector<AssistantEvent>* events) { process(true, events); }

void AssistantStreamParser::start_section() {
  pending_ws_.clear();
  section_started_ = false;
}

void AssistantStreamParser::emit_text(AssistantEvent::Kind kind, std::string_view text,
                                      std::vector<AssistantEvent>* events) {
  if (!section_started_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    section_started_ = true;
  }
  size_t body = text.size();
  while (body > 0 && is_space(text[body - 1])) --body;
  if (body == 0) {
    pending_ws_.append(text);
    return;
  }
  AssistantEvent e;
  e.kind = kind;
  e.text = std::move(pending_ws_);
  e.text.append(text.substr(0, body));
  pending_ws_.assign(text.substr(body));
  events->push_back(std::move(e));
}

void AssistantStreamParser::process(bool final, std::vector<AssistantEvent>* events) {
  using Kind = AssistantEvent::Kind;
  while (true) {
    std::string_view buf = buf_;
    if (mode_ == Mode::kReasoning) {
      if (!think_tag_checked_) {
        // An optional <think> opening the reasoning (after whitespace) is dropped.
        size_t ws = 0;
        while (ws < buf.size() && is_space(buf[ws])) ++ws;
        std::string_view rest = buf.substr(ws);
        if (rest.empty() && !final) return;
        if (!final && rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return;
        think_tag_checked_ = true;
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          buf_.erase(0, ws + kThinkOpen.size());
          continue;
        }
      }
      size_t close = buf.find(kThinkClose);
      if (close != std::string_view::npos) {
        emit_text(Kind::kReasoning, buf.substr(0, close), events);
        buf_.erase(0, close + kThinkClose.size());
        mode_ = Mode::kContent;
        start_section();
        continue;
      }
      size_t keep = final ? 0 : partial_tag_suffix(buf, kThinkClose);
      emit_text(Kind::kReasoning, buf.substr(0, buf.size() - keep), events);
      buf_.erase(0, buf.size() - keep);
      return;
    }
    if (mode_ == Mode::kContent) {
      size_t open = buf.find(kCallOpen);
      if (open != std::string_view::npos) {
        emit_text(Kind::kContent, buf.substr(0, open), events);
        buf_.erase(0, open);
        mode_ = Mode::kToolCall;
        call_scanned_ = 0;
        continue;
      }
      size_t keep = final ? 0 : partial_tag_suffix(buf, kCallOpen);
      emit_text(Kind::kContent, buf.substr(0, buf.size() - keep), events);
      buf_.erase(0, buf.size() - keep);
      return;
    }
    // Inside a tool call: wait for its end, then report it whole or give its text to content. The
    // search resumes where the previous one stopped, so a long call fed token by token stays linear.
    size_t close = buf.find(kCallClose, call_scanned_);
    if (close == std::string_view::npos) {
      call_scanned_ = buf.size() >= kCallClose.size() ? buf.size() - kCallClose.size() + 1 : 0;
      if (!final) return;
      emit_text(Kind::kContent, buf, events);
      buf_.clear();
      mode_ = Mode::kContent;
      return;
    }
    std::string_view block = buf.substr(0, close + kCallClose.size());
    ChatToolCall call;
    if (parse_tool_call(block, &call)) {
      int32_t index = n_tool_calls_++;
      events->push_back({Kind::kToolCallStarted, call.name, {}, index});
      for (auto& [name, value] : call.arguments.items()) {
        events->push_back({Kind::kToolCallArgument, name, value, index});
      }
      events->push_back({Kind::kToolCallFinished, call.name, {}, index});
    } else {
      emit_text(Kind::kContent, block, events);
    }
    buf_.erase(0, block.size());
    mode_ = Mode::kContent;
  }
}

ParsedAssistant parse_assistant(const std::string& generated, bool thinking_enabled) {
  AssistantStreamParser parser(thinking_enabled);
  std::vector<AssistantEvent> events;
  parser.feed(generated, &events);
  parser.finish(&events);
  ParsedAssistant out;
  for (AssistantEvent& e : events) {
    switch (e.kind) {
      case AssistantEvent::Kind::kReasoning: out.reasoning += e.text; break;
      case AssistantEvent::Kind::kContent: out.content += e.text; break;
      case AssistantEvent::Kind::kToolCallStarted: out.tool_calls.push_back({"", e.text, {}}); break;
      case AssistantEvent::Kind::kToolCallArgument: out.tool_calls.back().arguments[e.text] = std::move(e.value); break;
      case AssistantEvent::Kind::kToolCallFinished: break;
    }
  }
  for (ChatToolCall& c : out.tool_calls) {
    if (c.arguments.is_null()) c.arguments = nlohmann::ordered_json::object();
  }
  return out;
}

}  // namespace ds
