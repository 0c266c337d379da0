// Qwen3.5/3.6 chat rendering. Produces text byte-identical to the official chat template
// (third_party/qwen35_template/chat_template.jinja, as rendered by transformers) for the same
// conversation. Rendering is deterministic: re-sending a conversation with turns appended renders the
// old text (without its generation prompt) as a prefix, so a growing conversation is a growing token
// prefix. One exception is the template's own: assistant reasoning is rendered only for turns after
// the last user query, so a new user query drops the <think> blocks of earlier turns.
//
// Differences from the official template, on inputs it rejects:
// - A system message that is not first does not fail: every system message's text (trimmed, empty
//   ones skipped) is joined with "\n\n" into one leading system prompt.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace ds {

// Key order matters for rendering (tool schemas and arguments print in insertion order), so JSON
// values here are ordered_json; parse request bodies with nlohmann::ordered_json to keep it.
struct ChatToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // an object
};

struct ChatMessage {
  std::string role;       // system, user, assistant, tool
  std::string content;    // text (multi-part content is joined by the API layer)
  std::string reasoning;  // assistant reasoning (rendered inside <think>...</think>); empty = none
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool
  std::string name;                      // tool: function name, if known
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI-style [{type:function, function:{...}}]
};

// Renders the conversation. Errors (kInvalidArgument): no messages, unknown role, no user query,
// a tool message without a preceding assistant tool call, tool-call arguments that are not an object.
Result<std::string> render_chat(const std::vector<ChatMessage>& messages, const ChatRenderOptions& options);

// The generated assistant text split into reasoning, content and tool calls (the inverse of
// rendering, used on model output). Tool calls whose body does not parse are left in content.
// `thinking_enabled`: the prompt ended inside <think> (generation prompt with thinking on), so the
// text up to </think> is reasoning; without a </think> all of it is. Reasoning and content are
// trimmed of surrounding whitespace. Tool-call ids are left empty (the API layer assigns them).
struct ParsedAssistant {
  std::string reasoning;
  std::string content;
  std::vector<ChatToolCall> tool_calls;
};
ParsedAssistant parse_assistant(const std::string& generated, bool thinking_enabled);

}  // namespace ds
