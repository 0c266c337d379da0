// One generation as every API sees it: a templated prompt in, assistant events out (streamed through
// a callback) and a summary with usage at the end. API adapters only translate. Non-obvious choice:
// stop strings are matched on the raw generated text (reasoning and tool-call markup included) before
// it is split, so a stop string ends generation wherever it appears, as llama.cpp and vLLM do.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "server/model_text.h"
#include "server/output_parser.h"

namespace ds {

struct GenerationSpec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 256;
  std::vector<std::string> stop;  // stop strings (not emitted)
  bool raw = false;               // /v1/completions: text as generated, no reasoning/tool split
  OutputParserOptions parser;
  // The end of the prompt that already belongs to the assistant turn (a forced "<tool_call>\n<function=");
  // the parser sees it before the generated text.
  std::string forced_prefix;
};

enum class GenerationFinish { kStop, kLength, kToolCalls, kCancelled };

struct GenerationOutcome {
  std::string reasoning;
  std::string content;
  std::vector<ChatToolCall> tool_calls;
  GenerationFinish finish = GenerationFinish::kStop;
  std::string stop_string;  // the stop string that ended generation, or ""
  bool stopped_by_string = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  double prefill_ms = 0;
  double decode_ms = 0;
};

// Receives events as they become certain; returns false when the client is gone (cancels).
using EventSink = std::function<bool(const std::vector<OutputEvent>&)>;

// Runs `spec` on `engine` (the caller serializes calls). `cancelled` is polled between tokens.
Result<GenerationOutcome> run_generation(Engine& engine, const ModelText& text, const GenerationSpec& spec,
                                         const EventSink& sink, const std::function<bool()>& cancelled);

}  // namespace ds
