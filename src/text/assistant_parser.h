// Incremental parser of generated assistant text for streaming (SSE): turns text pieces into
// reasoning deltas, content deltas and tool-call events. Text that may be the start of a tag
// (</think>, <tool_call>) is held back until it is decided. A tool call is reported only once its
// </tool_call> has arrived and its body parsed, so a malformed call never produces tool events: its
// text goes to content instead. Feeding the same text in any split yields the same events, merged,
// as parse_assistant() (which is this parser run over the whole text).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds {

struct AssistantEvent {
  enum class Kind {
    kReasoning,         // text: reasoning delta
    kContent,           // text: content delta
    kToolCallStarted,   // text: function name
    kToolCallArgument,  // text: parameter name; value: its value (JSON if it parses, else a string)
    kToolCallFinished,
  };
  Kind kind = Kind::kContent;
  std::string text;
  nlohmann::ordered_json value;
  int32_t tool_index = -1;  // tool-call events: 0-based index of the call in this message
};

class AssistantStreamParser {
 public:
  // thinking_enabled: the prompt ended inside <think>, so text starts as reasoning until </think>.
  explicit AssistantStreamParser(bool thinking_enabled);
  // Appends the events that `text` completes.
  void feed(std::string_view text, std::vector<AssistantEvent>* events);
  // End of generation: releases held-back text; an unterminated tool call becomes content.
  void finish(std::vector<AssistantEvent>* events);

 private:
  enum class Mode { kReasoning, kContent, kToolCall };
  void process(bool final, std::vector<AssistantEvent>* events);
  // Emits section text with surrounding whitespace trimmed across deltas.
  void emit_text(AssistantEvent::Kind kind, std::string_view text, std::vector<AssistantEvent>* events);
  void start_section();

  Mode mode_;
  bool think_tag_checked_ = false;
  std::string buf_;         // received, not yet consumed
  std::string pending_ws_;  // whitespace held back: emitted only if non-space text follows
  bool section_started_ = false;
  int32_t n_tool_calls_ = 0;
  size_t call_scanned_ = 0;  // kToolCall: bytes of buf_ already searched for </tool_call>
};

}  // namespace ds
