// Chat template tests: byte-for-byte agreement with the official Qwen3.5 template on the committed
// goldens (rendered by tests/clients/text_template_goldens.mjs with @huggingface/jinja), the growing-
// prefix property, the documented deviations (folded system messages, Python value printing) and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "text/chat_template.h"
#include "text/jinja_values.h"

namespace ds {
namespace {

using ojson = nlohmann::ordered_json;

ChatMessage message_from_json(const ojson& j) {
  ChatMessage m;
  m.role = j.at("role").get<std::string>();
  if (j.contains("content") && j["content"].is_string()) m.content = j["content"].get<std::string>();
  if (j.contains("reasoning_content")) m.reasoning = j["reasoning_content"].get<std::string>();
  if (j.contains("tool_call_id")) m.tool_call_id = j["tool_call_id"].get<std::string>();
  if (j.contains("tool_calls")) {
    for (const auto& c : j["tool_calls"]) {
      const ojson& f = c.contains("function") ? c["function"] : c;
      ChatToolCall call;
      call.id = c.value("id", "");
      call.name = f.at("name").get<std::string>();
      call.arguments = f.at("arguments");
      m.tool_calls.push_back(std::move(call));
    }
  }
  return m;
}

ojson load_goldens() {
  std::ifstream in(std::filesystem::path(DS_SOURCE_DIR) / "tests" / "text" / "chat_goldens.json");
  return ojson::parse(in, nullptr, false);
}

std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  got:  ..." + got.substr(from, 80) +
         "\n  want: ..." + want.substr(from, 80);
}

TEST(TextChatTemplate, MatchesOfficialTemplateGoldens) {
  ojson goldens = load_goldens();
  ASSERT_TRUE(goldens.is_object() && goldens.contains("cases")) << "cannot read tests/text/chat_goldens.json";
  std::ifstream jinja(std::filesystem::path(DS_SOURCE_DIR) / "third_party" / "qwen35_template" / "chat_template.jinja",
                      std::ios::binary);
  std::string source((std::istreambuf_iterator<char>(jinja)), std::istreambuf_iterator<char>());
  ASSERT_EQ(goldens.at("template").get<std::string>(), source)
      << "chat_template.jinja changed: regenerate the goldens with tests/clients/text_template_goldens.mjs";
  ASSERT_GE(goldens.at("cases").size(), 15u);
  for (const auto& g : goldens.at("cases")) {
    std::vector<ChatMessage> messages;
    for (const auto& m : g.at("messages")) messages.push_back(message_from_json(m));
    ChatRenderOptions opts;
    opts.add_generation_prompt = g.at("add_generation_prompt").get<bool>();
    opts.enable_thinking = g.at("enable_thinking").get<bool>();
    opts.tools = g.at("tools");
    auto got = render_chat(messages, opts);
    ASSERT_TRUE(got.is_ok()) << g.at("name") << ": " << got.status().to_string();
    const std::string want = g.at("expected").get<std::string>();
    EXPECT_EQ(*got, want) << g.at("name").get<std::string>() << ": " << first_difference(*got, want);
  }
}

std::vector<ChatMessage> agent_conversation() {
  std::vector<ChatMessage> m(6);
  m[0] = {"system", "You are an agent.", "", {}, "", ""};
  m[1] = {"user", "List files then read one.", "", {}, "", ""};
  m[2] = {"assistant", "", "I will list.", {{"c1", "ls", ojson{{"path", "."}}}}, "", ""};
  m[3] = {"tool", "a.txt\nb.txt", "", {}, "c1", "ls"};
  m[4] = {"assistant", "Reading a.txt.", "Pick a.", {{"c2", "cat", ojson{{"path", "a.txt"}, {"n", 10}}}}, "", ""};
  m[5] = {"tool", "hello", "", {}, "c2", "cat"};
  return m;
}

TEST(TextChatTemplate, AppendedTurnsRenderAsGrowingPrefix) {
  ChatRenderOptions with_prompt;
  ChatRenderOptions without_prompt;
  without_prompt.add_generation_prompt = false;
  std::vector<ChatMessage> all = agent_conversation();
  // Agent loop: tool results and assistant turns after the last user query keep their reasoning.
  for (size_t n = 2; n < all.size(); ++n) {
    std::vector<ChatMessage> prefix(all.begin(), all.begin() + n);
    std::vector<ChatMessage> longer(all.begin(), all.begin() + n + 1);
    auto a = render_chat(prefix, without_prompt);
    auto b = render_chat(longer, with_prompt);
    ASSERT_TRUE(a.is_ok() && b.is_ok()) << n;
    EXPECT_EQ(b->substr(0, a->size()), *a) << "prefix of " << n << " messages";
  }
  // Turns without reasoning stay a prefix when a new user query arrives.
  std::vector<ChatMessage> chat = {{"user", "hi", "", {}, "", ""}, {"assistant", "hello", "", {}, "", ""}};
  auto a = render_chat(chat, without_prompt);
  chat.push_back({"user", "more", "", {}, "", ""});
  auto b = render_chat(chat, with_prompt);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(b->substr(0, a->size()), *a);
  // The generation prompt itself is a prefix of the re-rendered assistant turn with reasoning.
  std::vector<ChatMessage> q = {{"user", "q", "", {}, "", ""}};
  auto prompt = render_chat(q, with_prompt);
  q.push_back({"assistant", "answer", "thoughts", {}, "", ""});
  auto full = render_chat(q, without_prompt);
  ASSERT_TRUE(prompt.is_ok() && full.is_ok());
  EXPECT_EQ(full->substr(0, prompt->size()), *prompt);
}

TEST(TextChatTemplate, LaterSystemMessagesFoldIntoTheFirst) {
  std::vector<ChatMessage> m = {{"system", "Rule one.", "", {}, "", ""},
                                {"user", "hi", "", {}, "", ""},
                                {"system", "  Rule two.\n", "", {}, "", ""}};
  ChatRenderOptions opts;
  opts.add_generation_prompt = false;
  auto got = render_chat(m, opts);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, "<|im_start|>system\nRule one.\n\nRule two.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
  // A system message that only comes later still becomes the leading system prompt.
  std::vector<ChatMessage> late = {{"user", "hi", "", {}, "", ""}, {"system", "Late rule.", "", {}, "", ""}};
  got = render_chat(late, opts);
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(*got, "<|im_start|>system\nLate rule.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
}

TEST(TextChatTemplate, ScalarArgumentsPrintAsPythonStr) {
  // The template prints non-container arguments with `| string`; under transformers (Python Jinja2)
  // that is str(): True, False, None, and repr for floats.
  std::vector<ChatMessage> m = {{"user", "go", "", {}, "", ""},
                                {"assistant", "", "", {{"", "f", ojson{{"a", true}, {"b", nullptr}, {"c", 2.0}, {"d", 1e-5}}}}, "", ""}};
  ChatRenderOptions opts;
  opts.add_generation_prompt = false;
  auto got = render_chat(m, opts);
  ASSERT_TRUE(got.is_ok());
  EXPECT_NE(got->find("<parameter=a>\nTrue\n</parameter>\n<parameter=b>\nNone\n</parameter>\n"
                      "<parameter=c>\n2.0\n</parameter>\n<parameter=d>\n1e-05\n</parameter>"),
            std::string::npos)
      << *got;
}

TEST(TextChatTemplate, TojsonMatchesPythonJsonDumps) {
  // Expected strings as Python's json.dumps(x, ensure_ascii=False) prints them.
  ojson v = ojson::parse(R"({"z": 1, "a": [true, null, 1.5, -0.25, 100000000000000000000.0], "s": "é\n\u0001\"\\", "e": {}})");
  EXPECT_EQ(text::jinja_tojson(v), "{\"z\": 1, \"a\": [true, null, 1.5, -0.25, 1e+20], \"s\": \"é\\n\\u0001\\\"\\\\\", \"e\": {}}");
  EXPECT_EQ(text::jinja_tojson(ojson(0.0001)), "0.0001");
  EXPECT_EQ(text::jinja_tojson(ojson(123456789.0)), "123456789.0");
  EXPECT_EQ(text::jinja_tojson(ojson(1e16)), "1e+16");
  EXPECT_EQ(text::jinja_tojson(ojson(0.1)), "0.1");
  EXPECT_EQ(text::python_strip("\u3000 \x1f a b \u2028\n"), "a b");
  EXPECT_EQ(text::python_strip("   "), "");
}

TEST(TextChatTemplate, Errors) {
  ChatRenderOptions opts;
  EXPECT_FALSE(render_chat({}, opts).is_ok());
  EXPECT_FALSE(render_chat({{"robot", "x", "", {}, "", ""}}, opts).is_ok());
  EXPECT_FALSE(render_chat({{"system", "only system", "", {}, "", ""}}, opts).is_ok());  // no user query
  auto orphan_tool = render_chat({{"user", "q", "", {}, "", ""}, {"tool", "result", "", {}, "", ""}}, opts);
  ASSERT_FALSE(orphan_tool.is_ok());
  EXPECT_NE(orphan_tool.status().message().find("tool message 1"), std::string::npos);
  ChatMessage bad_args{"assistant", "", "", {{"", "f", ojson::array({1, 2})}}, "", ""};
  EXPECT_FALSE(render_chat({{"user", "q", "", {}, "", ""}, bad_args}, opts).is_ok());
}

}  // namespace
}  // namespace ds
