// Output parsing: UTF-8 assembly, stop strings and the reasoning / content / tool-call split (the text
// module's parser plus the server's schema typing and ids) must give the same result however the
// generated text is cut into pieces (every cut position is tried).
#include <gtest/gtest.h>

#include "server/output_parser.h"

namespace ds {
namespace {

struct Collected {
  std::string reasoning, content;
  std::vector<ChatToolCall> calls;
};

void collect(const std::vector<OutputEvent>& events, Collected* c) {
  for (const auto& e : events) {
    if (e.kind == OutputEvent::Kind::kReasoning) c->reasoning += e.text;
    if (e.kind == OutputEvent::Kind::kContent) c->content += e.text;
    if (e.kind == OutputEvent::Kind::kToolCall) c->calls.push_back(e.tool_call);
  }
}

Collected parse_in_two(const std::string& text, size_t cut, const OutputParserOptions& o) {
  OutputParser p(o);
  Collected c;
  collect(p.push(text.substr(0, cut)), &c);
  collect(p.push(text.substr(cut)), &c);
  collect(p.finish(), &c);
  return c;
}

Collected parse_bytewise(const std::string& text, const OutputParserOptions& o) {
  OutputParser p(o);
  Collected c;
  for (char ch : text) collect(p.push(std::string(1, ch)), &c);
  collect(p.finish(), &c);
  return c;
}

TEST(ServerParser, Utf8AssemblerHoldsPartialSequences) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";  // a é € 😀 z
  Utf8Assembler u;
  std::string out;
  for (char ch : text) {
    std::string piece = u.push(std::string(1, ch));
    // Every released piece ends on a character boundary: its last lead byte is complete.
    if (!piece.empty()) {
      unsigned char last = static_cast<unsigned char>(piece.back());
      EXPECT_TRUE(last < 0x80 || (last & 0xC0) == 0x80) << "released a dangling lead byte";
    }
    out += piece;
  }
  out += u.flush();
  EXPECT_EQ(out, text);
}

TEST(ServerParser, Utf8AssemblerFlushReplacesTruncatedSequence) {
  Utf8Assembler u;
  EXPECT_EQ(u.push("ok\xE2\x82"), "ok");
  EXPECT_EQ(u.flush(), "\xEF\xBF\xBD");
}

TEST(ServerParser, StopStringFoundAcrossEveryCut) {
  const std::string text = "The answer is 42.\nEND of story";
  for (size_t cut = 0; cut <= text.size(); cut++) {
    for (size_t cut2 = cut; cut2 <= text.size(); cut2++) {
      StopMatcher m({"\nEND", "zzz"});
      std::string out = m.push(text.substr(0, cut));
      out += m.push(text.substr(cut, cut2 - cut));
      out += m.push(text.substr(cut2));
      out += m.flush();
      ASSERT_EQ(out, "The answer is 42.") << "cuts " << cut << "," << cut2;
      ASSERT_TRUE(m.stopped());
      ASSERT_EQ(m.matched(), "\nEND");
    }
  }
}

TEST(ServerParser, StopStringEarliestMatchWinsAndPartialPrefixIsReleased) {
  StopMatcher m({"cd", "bcx"});
  std::string out = m.push("ab");  // "b" may start "bcx": held
  EXPECT_EQ(out, "a");
  out += m.push("cd");  // "cd" at 2 is found; "bcx" never completes
  EXPECT_EQ(out, "ab");
  EXPECT_EQ(m.matched(), "cd");
  StopMatcher none({"xyz"});
  std::string s = none.push("abcxy");
  EXPECT_EQ(s, "abc");
  EXPECT_EQ(s + none.flush(), "abcxy");
  EXPECT_FALSE(none.stopped());
}

TEST(ServerParser, ReasoningThenContent) {
  OutputParserOptions o;
  o.starts_in_reasoning = true;
  const std::string text = "\nLet me think.\nStill thinking.\n</think>\n\nThe result is 7.\n";
  for (size_t cut = 0; cut <= text.size(); cut++) {
    Collected c = parse_in_two(text, cut, o);
    ASSERT_EQ(c.reasoning, "Let me think.\nStill thinking.") << "cut " << cut;
    ASSERT_EQ(c.content, "The result is 7.") << "cut " << cut;
  }
}

TEST(ServerParser, OptionalThinkTagOpeningReasoningIsDropped) {
  OutputParserOptions o;
  o.starts_in_reasoning = true;
  Collected c = parse_bytewise("\n<think>hmm</think>done", o);
  EXPECT_EQ(c.reasoning, "hmm");
  EXPECT_EQ(c.content, "done");
}

TEST(ServerParser, XmlToolCallsTypedBySchema) {
  OutputParserOptions o;
  o.parse_tool_calls = true;
  o.tools = nlohmann::ordered_json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{
      "type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},
      "zip":{"type":"string"},"opts":{"type":"object"}}}}}])");
  const std::string text =
      "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n<parameter=opts>\n{\"u\": \"C\"}\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nline1\nline2\n"
      "</parameter>\n</function>\n</tool_call>";
  for (size_t cut = 0; cut <= text.size(); cut++) {
    Collected c = parse_in_two(text, cut, o);
    ASSERT_EQ(c.content, "I will check.") << "cut " << cut;
    ASSERT_EQ(c.calls.size(), 2u) << "cut " << cut;
    EXPECT_EQ(c.calls[0].name, "get_weather");
    EXPECT_EQ(c.calls[0].arguments["city"], "Paris");
    EXPECT_EQ(c.calls[0].arguments["days"], 3);
    EXPECT_EQ(c.calls[0].arguments["zip"], "75001");  // string by schema although it looks like a number
    EXPECT_EQ(c.calls[0].arguments["opts"]["u"], "C");
    EXPECT_EQ(c.calls[1].arguments["city"], "line1\nline2");
    EXPECT_NE(c.calls[0].id, c.calls[1].id);
    EXPECT_EQ(c.calls[0].id.rfind("call_", 0), 0u);
  }
}

TEST(ServerParser, BrokenToolCallStaysVisibleAsContent) {
  OutputParserOptions o;
  o.parse_tool_calls = true;
  Collected c = parse_bytewise("<tool_call>garbage</tool_call>", o);
  EXPECT_TRUE(c.calls.empty());
  EXPECT_EQ(c.content, "<tool_call>garbage</tool_call>");
  // Unterminated at the end of generation: no call is made up, the text stays visible.
  const std::string cut = "<tool_call>\n<function=f>\n<parameter=a>\nb\n</parameter>\n</function>";
  Collected d = parse_bytewise(cut, o);
  EXPECT_TRUE(d.calls.empty());
  EXPECT_EQ(d.content, cut);
}

TEST(ServerParser, ToolMarkupIsPlainTextWhenToolsAreOff) {
  OutputParserOptions o;
  const std::string call = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
  Collected c = parse_bytewise("use " + call, o);
  EXPECT_TRUE(c.calls.empty());
  EXPECT_EQ(c.content, "use" + call);  // the call's canonical text; whitespace before it is trimmed
}

TEST(ServerParser, StreamingReleasesTextBeforeMarkersComplete) {
  OutputParserOptions o;
  o.parse_tool_calls = true;
  OutputParser p(o);
  Collected c;
  collect(p.push("Hello wor"), &c);
  EXPECT_EQ(c.content, "Hello wor");  // nothing here can start a marker
  collect(p.push("ld <tool"), &c);
  EXPECT_EQ(c.content, "Hello world");  // " <tool" may still become "<tool_call>"
  collect(p.push("box>"), &c);
  EXPECT_EQ(c.content, "Hello world <toolbox>");
}

}  // namespace
}  // namespace ds
