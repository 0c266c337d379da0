// Tests for parsing generated assistant text: reasoning / content / tool-call extraction, malformed
// calls kept as content, the inverse of rendering, and the streaming parser's equivalence with the
// whole-text parse for every split of the input (including one byte at a time).
#include <gtest/gtest.h>

#include "text/assistant_parser.h"
#include "text/chat_template.h"

namespace ds {
namespace {

using ojson = nlohmann::ordered_json;

const char* kTwoCalls =
    "Plan the calls.\n</think>\n\nI'll check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=store>\n"
    "<parameter=obj>\n{\"a\": [1, 2], \"b\": null}\n</parameter>\n<parameter=s>\nnot json {\nsecond line\n</parameter>\n"
    "</function>\n</tool_call>";

TEST(TextAssistantParser, ReasoningContentAndToolCalls) {
  ParsedAssistant p = parse_assistant(kTwoCalls, true);
  EXPECT_EQ(p.reasoning, "Plan the calls.");
  EXPECT_EQ(p.content, "I'll check both.");
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments, (ojson{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(p.tool_calls[1].name, "store");
  EXPECT_EQ(p.tool_calls[1].arguments["obj"], ojson::parse(R"({"a": [1, 2], "b": null})"));
  EXPECT_EQ(p.tool_calls[1].arguments["s"], "not json {\nsecond line");
}

TEST(TextAssistantParser, ThinkingModes) {
  EXPECT_EQ(parse_assistant("still thinking...", true).reasoning, "still thinking...");
  EXPECT_EQ(parse_assistant("still thinking...", true).content, "");
  ParsedAssistant opened = parse_assistant("\n<think>\nx\n</think>\n\ny", true);
  EXPECT_EQ(opened.reasoning, "x");
  EXPECT_EQ(opened.content, "y");
  ParsedAssistant off = parse_assistant("plain </think> text", false);
  EXPECT_EQ(off.reasoning, "");
  EXPECT_EQ(off.content, "plain </think> text");
  // <tool_call> inside reasoning is reasoning.
  ParsedAssistant in_reasoning = parse_assistant("maybe <tool_call> later</think>done", true);
  EXPECT_EQ(in_reasoning.reasoning, "maybe <tool_call> later");
  EXPECT_TRUE(in_reasoning.tool_calls.empty());
}

TEST(TextAssistantParser, MalformedCallsStayInContent) {
  const std::string missing_param_close =
      "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>";
  ParsedAssistant a = parse_assistant("Before " + missing_param_close + " after", false);
  EXPECT_TRUE(a.tool_calls.empty());
  EXPECT_EQ(a.content, "Before " + missing_param_close + " after");
  const std::string unterminated = "text <tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>";
  ParsedAssistant b = parse_assistant(unterminated, false);
  EXPECT_TRUE(b.tool_calls.empty());
  EXPECT_EQ(b.content, unterminated);
  ParsedAssistant c = parse_assistant("<tool_call>\n<function=>\n</function>\n</tool_call>", false);
  EXPECT_TRUE(c.tool_calls.empty());
  EXPECT_EQ(c.content, "<tool_call>\n<function=>\n</function>\n</tool_call>");
  // A good call after a bad one is still found.
  ParsedAssistant d = parse_assistant(
      "<tool_call>junk</tool_call><tool_call>\n<function=g>\n</function>\n</tool_call>", false);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "g");
  EXPECT_EQ(d.content, "<tool_call>junk</tool_call>");
}

TEST(TextAssistantParser, InvertsRendering) {
  ChatMessage assistant{"assistant", "Calling two tools.", "Reason about it.", {}, "", ""};
  assistant.tool_calls.push_back({"", "edit", ojson{{"path", "src/a.cpp"}, {"text", "int x;\nint y;"}, {"n", 2}}});
  assistant.tool_calls.push_back({"", "run", ojson{{"cmd", ojson::array({"make", "-j2"})}, {"env", ojson{{"A", "1"}}}}});
  ChatRenderOptions opts;
  opts.add_generation_prompt = false;
  auto rendered = render_chat({{"user", "go", "", {}, "", ""}, assistant}, opts);
  ASSERT_TRUE(rendered.is_ok());
  // What the model generated = the assistant turn after the generation prompt, before <|im_end|>.
  const std::string prompt = "<|im_start|>assistant\n<think>\n";
  size_t start = rendered->find(prompt);
  ASSERT_NE(start, std::string::npos);
  std::string generated = rendered->substr(start + prompt.size());
  generated = generated.substr(0, generated.rfind("<|im_end|>"));
  ParsedAssistant p = parse_assistant(generated, true);
  EXPECT_EQ(p.reasoning, assistant.reasoning);
  EXPECT_EQ(p.content, assistant.content);
  ASSERT_EQ(p.tool_calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(p.tool_calls[i].name, assistant.tool_calls[i].name);
    EXPECT_EQ(p.tool_calls[i].arguments, assistant.tool_calls[i].arguments);
  }
}

// Merged view of an event stream, for comparing splits.
struct Collected {
  std::string reasoning, content;
  std::vector<std::string> tool_events;  // "started 0 name", "arg 0 name=value", "finished 0"
  bool operator==(const Collected&) const = default;
};

void collect(const std::vector<AssistantEvent>& events, Collected* c) {
  for (const AssistantEvent& e : events) {
    switch (e.kind) {
      case AssistantEvent::Kind::kReasoning: c->reasoning += e.text; break;
      case AssistantEvent::Kind::kContent: c->content += e.text; break;
      case AssistantEvent::Kind::kToolCallStarted:
        c->tool_events.push_back("started " + std::to_string(e.tool_index) + " " + e.text);
        break;
      case AssistantEvent::Kind::kToolCallArgument:
        c->tool_events.push_back("arg " + std::to_string(e.tool_index) + " " + e.text + "=" + e.value.dump());
        break;
      case AssistantEvent::Kind::kToolCallFinished:
        c->tool_events.push_back("finished " + std::to_string(e.tool_index));
        break;
    }
  }
}

Collected run_split(const std::string& text, bool thinking, const std::vector<size_t>& cuts) {
  AssistantStreamParser parser(thinking);
  Collected c;
  size_t prev = 0;
  for (size_t cut : cuts) {
    std::vector<AssistantEvent> events;
    parser.feed(std::string_view(text).substr(prev, cut - prev), &events);
    collect(events, &c);
    prev = cut;
  }
  std::vector<AssistantEvent> events;
  parser.feed(std::string_view(text).substr(prev), &events);
  parser.finish(&events);
  collect(events, &c);
  return c;
}

TEST(TextAssistantParser, StreamingEqualsWholeParseForEverySplit) {
  const std::vector<std::pair<std::string, bool>> texts = {
      {kTwoCalls, true},
      {"  <think>\n r </think>  c1 <tool_call>bad</tool_call> c2 <tool_call>\n<function=f>\n</function>\n</tool_call>  ", true},
      {"no reasoning, <tool_ca and </thin partial tags <tool_call", false},
      {"</think>", true},
      {"<thin", true},
      {"x\n\n<tool_call>\n<function=f>\n<parameter=p>\n\"quoted\"\n</parameter>\n</function>\n</tool_call>\n\ny", false},
  };
  for (const auto& [text, thinking] : texts) {
    const Collected whole = run_split(text, thinking, {});
    ParsedAssistant p = parse_assistant(text, thinking);
    EXPECT_EQ(whole.reasoning, p.reasoning);
    EXPECT_EQ(whole.content, p.content);
    for (size_t k = 0; k <= text.size(); ++k) {
      ASSERT_EQ(run_split(text, thinking, {k}), whole) << "split at " << k << " of: " << text;
    }
    std::vector<size_t> every_byte;
    for (size_t k = 1; k < text.size(); ++k) every_byte.push_back(k);
    ASSERT_EQ(run_split(text, thinking, every_byte), whole) << "byte by byte: " << text;
  }
}

TEST(TextAssistantParser, RandomTagSoupStreamsLikeTheWholeParse) {
  // Strings built from tag fragments, fed in random pieces: the merged stream must equal the whole parse.
  const std::vector<std::string> alphabet = {"<tool_call>", "</tool_call>", "<function=f>", "<function=g>",
                                             "<parameter=p>", "<parameter=q>", "</parameter>", "</function>",
                                             "</think>", "<think>", "\n", " ", "x", "{\"a\": 1}", "7", "<", "</", "<tool"};
  uint64_t state = 12345;
  auto next = [&state](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    size_t n = 1 + next(30);
    for (size_t i = 0; i < n; ++i) text += alphabet[next(alphabet.size())];
    bool thinking = next(2) == 1;
    std::vector<size_t> cuts;
    for (size_t k = 1; k < text.size(); ++k) {
      if (next(4) == 0) cuts.push_back(k);
    }
    ASSERT_EQ(run_split(text, thinking, cuts), run_split(text, thinking, {})) << text;
  }
}

TEST(TextAssistantParser, LongToolCallFedInSmallPieces) {
  // 2 MB of argument text in 4-byte pieces: the parser must not rescan the call for every piece.
  std::string value(2 << 20, 'v');
  std::string text = "<tool_call>\n<function=write>\n<parameter=content>\n" + value + "\n</parameter>\n</function>\n</tool_call>";
  AssistantStreamParser parser(false);
  std::vector<AssistantEvent> events;
  for (size_t i = 0; i < text.size(); i += 4) parser.feed(std::string_view(text).substr(i, 4), &events);
  parser.finish(&events);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].value.get<std::string>().size(), value.size());
}

TEST(TextAssistantParser, HoldsBackPossibleTagStarts) {
  AssistantStreamParser parser(false);
  std::vector<AssistantEvent> events;
  parser.feed("Hello <tool", &events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "Hello");  // the space waits for non-space text
  events.clear();
  parser.feed("_call>\n<function=f>\n", &events);
  EXPECT_TRUE(events.empty());
  parser.feed("</function>\n</tool_call>", &events);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, AssistantEvent::Kind::kToolCallStarted);
  EXPECT_EQ(events[0].text, "f");
  EXPECT_EQ(events[1].kind, AssistantEvent::Kind::kToolCallFinished);
  events.clear();
  parser.feed(" <tooling", &events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "  <tooling");  // the held-back space before the call, then the new text
  // Reasoning holds back a possible </think>.
  AssistantStreamParser thinking(true);
  events.clear();
  thinking.feed("abc</thi", &events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].text, "abc");
  events.clear();
  thinking.feed("nk>def", &events);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, AssistantEvent::Kind::kContent);
  EXPECT_EQ(events[0].text, "def");
}

}  // namespace
}  // namespace ds
