// Native rendering of the Qwen3.5 chat template. The code follows the template's statements in order
// (tools header and system prompt, last-query search, one branch per role, generation prompt), and
// prints values the way the template's Jinja filters do (jinja_values.h), so the two stay comparable
// line by line. Non-first system messages are folded into the first before rendering.
#include "text/chat_template.h"

#include "text/jinja_values.h"

namespace ds {
namespace {

using text::python_strip;

constexpr std::string_view kToolsHeader =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsFooter =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer "
    "the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

// One system message first (holding every system message's text), then the others in order.
std::vector<const ChatMessage*> fold_system_messages(const std::vector<ChatMessage>& messages, ChatMessage* system) {
  std::vector<const ChatMessage*> out;
  int n_system = 0;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") {
      out.push_back(&m);
      continue;
    }
    ++n_system;
    std::string_view text = python_strip(m.content);
    if (text.empty()) continue;
    if (!system->content.empty()) system->content += "\n\n";
    system->content += text;
  }
  if (n_system == 0) return out;
  system->role = "system";
  if (n_system == 1 && messages[0].role == "system") {
    system->content = messages[0].content;  // the common case: keep it byte for byte
  }
  out.insert(out.begin(), system);
  return out;
}

Status render_assistant(const ChatMessage& m, std::string_view content, bool after_last_query, std::string* out) {
  std::string_view reasoning;
  if (!m.reasoning.empty()) {
    reasoning = m.reasoning;
  } else if (content.find("</think>") != std::string_view::npos) {
    std::string_view before = content.substr(0, content.find("</think>"));
    before = rstrip_newlines(before);
    size_t open = before.rfind("<think>");
    if (open != std::string_view::npos) before = before.substr(open + 7);
    reasoning = lstrip_newlines(before);
    content = lstrip_newlines(content.substr(content.rfind("</think>") + 8));
  }
  reasoning = python_strip(reasoning);
  if (after_last_query && !reasoning.empty()) {
    *out += "<|im_start|>assistant\n<think>\n";
    *out += reasoning;
    *out += "\n</think>\n\n";
  } else {
    *out += "<|im_start|>assistant\n";
  }
  *out += content;
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ChatToolCall& call = m.tool_calls[i];
    if (i > 0) {
      *out += "\n<tool_call>\n<function=";
    } else if (!python_strip(content).empty()) {
      *out += "\n\n<tool_call>\n<function=";
    } else {
      *out += "<tool_call>\n<function=";
    }
    *out += call.name;
    *out += ">\n";
    if (!call.arguments.is_object()) {
      return invalid_argument("tool call '{}': arguments must be a JSON object, got {}", call.name,
                              call.arguments.type_name());
    }
    for (const auto& [key, value] : call.arguments.items()) {
      *out += "<parameter=";
      *out += key;
      *out += ">\n";
      *out += value.is_object() || value.is_array() ? text::jinja_tojson(value) : text::jinja_string(value);
      *out += "\n</parameter>\n";
    }
    *out += "</function>\n</tool_call>";
  }
  *out += "<|im_end|>\n";
  return Status::ok();
}

}  // namespace

Result<std::string> render_chat(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) {
  if (messages.empty()) return invalid_argument("chat: no messages provided");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return invalid_argument("chat: message {} has unknown role '{}' (expected system, user, assistant or tool)", i,
                              role);
    }
  }
  ChatMessage system;
  const std::vector<const ChatMessage*> msgs = fold_system_messages(messages, &system);
  const int64_t n = static_cast<int64_t>(msgs.size());

  std::string out;
  const bool has_system = msgs[0]->role == "system";
  if (options.tools.is_array() && !options.tools.empty()) {
    out += kToolsHeader;
    for (const auto& tool : options.tools) {
      out += "\n";
      out += text::jinja_tojson(tool);
    }
    out += kToolsFooter;
    if (has_system) {
      std::string_view content = python_strip(msgs[0]->content);
      if (!content.empty()) {
        out += "\n\n";
        out += content;
      }
    }
    out += "<|im_end|>\n";
  } else if (has_system) {
    out += "<|im_start|>system\n";
    out += python_strip(msgs[0]->content);
    out += "<|im_end|>\n";
  }

  // The last user message that is not just a wrapped tool response.
  int64_t last_query = -1;
  for (int64_t i = n - 1; i >= 0; --i) {
    if (msgs[i]->role != "user") continue;
    std::string_view content = python_strip(msgs[i]->content);
    if (!(starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  if (last_query < 0) return invalid_argument("chat: no user query found in messages");

  for (int64_t i = 0; i < n; ++i) {
    const ChatMessage& m = *msgs[i];
    std::string_view content = python_strip(m.content);
    if (m.role == "user") {
      out += "<|im_start|>user\n";
      out += content;
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      DS_TRY(render_assistant(m, content, i > last_query, &out).with_context(fmt::format("chat: message {}", i)));
    } else if (m.role == "tool") {
      int64_t j = i - 1;
      while (j >= 0 && msgs[j]->role == "tool") --j;
      if (j < 0 || msgs[j]->role != "assistant" || msgs[j]->tool_calls.empty()) {
        return invalid_argument("chat: tool message {} does not follow an assistant message with tool calls", i);
      }
      if (i > 0 && msgs[i - 1]->role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += content;
      out += "\n</tool_response>";
      if (i == n - 1 || msgs[i + 1]->role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    out += options.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace ds
