// Drives one engine generation: token bytes -> UTF-8 assembly -> stop strings -> assistant parser ->
// events, accumulating the outcome that non-streaming responses and usage reporting need.
#include "server/generation.h"

#include <algorithm>

namespace ds {

Result<GenerationOutcome> run_generation(Engine& engine, const ModelText& text, const GenerationSpec& spec,
                                         const EventSink& sink, const std::function<bool()>& cancelled) {
  GenerationOutcome out;
  Utf8Assembler utf8;
  StopMatcher stops(spec.stop);
  OutputParser parser(spec.parser);
  bool client_gone = false;
  const std::vector<int32_t> stop_tokens = text.stop_tokens();

  auto deliver = [&](const std::vector<OutputEvent>& events) {
    for (const auto& e : events) {
      switch (e.kind) {
        case OutputEvent::Kind::kReasoning: out.reasoning += e.text; break;
        case OutputEvent::Kind::kContent: out.content += e.text; break;
        case OutputEvent::Kind::kToolCall: out.tool_calls.push_back(e.tool_call); break;
      }
    }
    if (!events.empty() && sink && !client_gone && !sink(events)) client_gone = true;
  };
  auto feed = [&](const std::string& s) {
    if (s.empty()) return;
    if (spec.raw) {
      OutputEvent e;
      e.text = s;
      deliver({e});
    } else {
      deliver(parser.push(s));
    }
  };

  if (!spec.raw && !spec.forced_prefix.empty()) deliver(parser.push(spec.forced_prefix));

  GenerateRequest req;
  req.prompt = spec.prompt;
  req.sampling = spec.sampling;
  req.max_tokens = spec.max_tokens;
  req.stop_tokens = stop_tokens;
  req.cancelled = [&] { return client_gone || (cancelled && cancelled()); };
  req.on_token = [&](int32_t token) {
    if (std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end()) return true;
    feed(stops.push(utf8.push(text.token_bytes(token))));
    if (stops.stopped()) return false;
    return !req.cancelled();
  };

  Result<GenerateResult> result = engine.generate(req);
  if (!result.is_ok()) return result.status();

  if (!stops.stopped()) {
    feed(stops.push(utf8.flush()));
    feed(stops.flush());
  }
  if (!spec.raw) deliver(parser.finish());

  out.stopped_by_string = stops.stopped();
  out.stop_string = stops.matched();
  out.prompt_tokens = result->prompt_tokens;
  out.cached_tokens = result->cached_tokens;
  out.completion_tokens = static_cast<int64_t>(result->tokens.size());
  out.prefill_ms = result->prefill_ms;
  out.decode_ms = result->decode_ms;
  if (client_gone || result->finish == FinishReason::kCancelled) {
    out.finish = GenerationFinish::kCancelled;
  } else if (!out.tool_calls.empty()) {
    out.finish = GenerationFinish::kToolCalls;
  } else if (result->finish == FinishReason::kLength && !out.stopped_by_string) {
    out.finish = GenerationFinish::kLength;
  } else {
    out.finish = GenerationFinish::kStop;
  }
  return out;
}

}  // namespace ds
