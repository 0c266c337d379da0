// Renders the golden conversations of the chat-template test with @huggingface/jinja and the official
// Qwen3.5 template (third_party/qwen35_template/chat_template.jinja), and writes them with their
// expected text to tests/text/chat_goldens.json. The native renderer (src/text/chat_template.cpp) must
// reproduce every "expected" byte for byte. Output: {template: the .jinja text, cases: [...]}.
// The conversations avoid the few inputs where this JavaScript renderer and Python's Jinja2 print
// differently (booleans and None as bare tool arguments, floats with no fraction, integer-like object
// keys, whitespace outside ASCII at the ends of messages); the C++ test covers those separately.
// Usage (from tests/clients): node text_template_goldens.mjs [OUT.json]
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { Template } from "@huggingface/jinja";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const source = readFileSync(path.join(root, "third_party/qwen35_template/chat_template.jinja"), "utf8");
const template = new Template(source);

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather for a city.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. \"Paris\"" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", minimum: 1, maximum: 7 },
      },
      required: ["city"],
    },
  },
};
const writeTool = {
  type: "function",
  function: {
    name: "write_file",
    description: "Write text to a file.\nOverwrites existing files; paths use '/' or '\\\\'.",
    parameters: {
      type: "object",
      properties: {
        path: { type: "string" },
        content: { type: "string" },
        options: {
          type: "object",
          properties: { mode: { type: "string" }, ratio: { type: "number", default: 0.5 } },
        },
      },
      required: ["path", "content"],
    },
  },
};
const unicodeTool = {
  type: "function",
  function: {
    name: "traduire",
    description: "Traduit un texte — 翻译文本 🌐 «quotes» \u0001 control",
    parameters: { type: "object", properties: { texte: { type: "string", description: "Le texte à traduire" } } },
  },
};
const call = (name, args, id = "call_" + name) => ({ id, type: "function", function: { name, arguments: args } });

const cases = [
  { name: "plain_user", messages: [{ role: "user", content: "Hello!" }] },
  {
    name: "system_and_user",
    messages: [
      { role: "system", content: "You are a helpful assistant." },
      { role: "user", content: "What is 2+2?" },
    ],
  },
  {
    name: "multi_turn",
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello! How can I help?" },
      { role: "user", content: "Tell me a joke." },
    ],
  },
  { name: "thinking_off", enable_thinking: false, messages: [{ role: "user", content: "Quick answer: capital of France?" }] },
  {
    name: "no_generation_prompt",
    add_generation_prompt: false,
    messages: [
      { role: "system", content: "sys" },
      { role: "user", content: "question" },
      { role: "assistant", content: "answer" },
    ],
  },
  {
    name: "tools_with_system",
    tools: [weatherTool, writeTool],
    messages: [
      { role: "system", content: "You are a coding agent." },
      { role: "user", content: "Weather in Paris?" },
    ],
  },
  { name: "tools_without_system", tools: [weatherTool], messages: [{ role: "user", content: "Weather in Oslo?" }] },
  {
    name: "tools_with_blank_system",
    tools: [weatherTool],
    messages: [
      { role: "system", content: "  \n " },
      { role: "user", content: "hi" },
    ],
  },
  {
    name: "tool_call_and_response",
    tools: [weatherTool],
    messages: [
      { role: "user", content: "Weather in Paris for 3 days?" },
      { role: "assistant", content: "Let me check.", tool_calls: [call("get_weather", { city: "Paris", days: 3 })] },
      { role: "tool", tool_call_id: "call_get_weather", content: '{"temp": 21, "sky": "clear"}' },
    ],
  },
  {
    name: "parallel_tool_calls",
    tools: [weatherTool],
    messages: [
      { role: "user", content: "Compare Paris and Rome." },
      {
        role: "assistant",
        content: "",
        tool_calls: [call("get_weather", { city: "Paris" }, "a"), call("get_weather", { city: "Rome", unit: "celsius" }, "b")],
      },
      { role: "tool", tool_call_id: "a", content: "18C" },
      { role: "tool", tool_call_id: "b", content: "24C" },
    ],
  },
  {
    name: "tool_results_then_answer_then_user",
    tools: [weatherTool],
    messages: [
      { role: "user", content: "Paris?" },
      { role: "assistant", content: "", tool_calls: [call("get_weather", { city: "Paris" })] },
      { role: "tool", content: "sunny" },
      { role: "assistant", content: "It is sunny in Paris." },
      { role: "user", content: "Thanks! And tomorrow?" },
    ],
  },
  {
    name: "reasoning_past_turns",
    messages: [
      { role: "user", content: "First question" },
      { role: "assistant", reasoning_content: "thinking about the first", content: "First answer" },
      { role: "user", content: "Second question" },
      { role: "assistant", reasoning_content: "\nthinking about the second\n", content: "Second answer" },
    ],
    add_generation_prompt: false,
  },
  {
    name: "reasoning_inside_content",
    messages: [
      { role: "user", content: "Solve it" },
      { role: "assistant", content: "<think>\nstep one\nstep two\n</think>\n\nThe result is 42." },
    ],
    add_generation_prompt: false,
  },
  {
    name: "reasoning_inside_content_before_last_query",
    messages: [
      { role: "user", content: "Solve it" },
      { role: "assistant", content: "<think>\nold plan\n</think>\n\nDone." },
      { role: "user", content: "Again" },
    ],
  },
  {
    name: "agent_loop_with_reasoning",
    tools: [writeTool],
    messages: [
      { role: "system", content: "You write files." },
      { role: "user", content: "Create hello.txt" },
      {
        role: "assistant",
        reasoning_content: "I should call write_file.",
        content: "",
        tool_calls: [call("write_file", { path: "hello.txt", content: "hello\nworld\n" })],
      },
      { role: "tool", content: "ok" },
      {
        role: "assistant",
        reasoning_content: "Verify with options.",
        content: "Writing again with options.",
        tool_calls: [call("write_file", { path: "b.txt", content: "x", options: { mode: "append", ratio: 0.25 } })],
      },
      { role: "tool", content: "ok again" },
    ],
  },
  {
    name: "unicode",
    tools: [unicodeTool],
    messages: [
      { role: "system", content: "Réponds en français. 你好 🙂" },
      { role: "user", content: "Traduis «bonjour» en 日本語 et en emoji 👋🏽" },
      { role: "assistant", content: "こんにちは 👋", tool_calls: [call("traduire", { texte: "bonjour — ça va?" })] },
      { role: "tool", content: "«こんにちは»" },
    ],
  },
  {
    name: "empty_content",
    tools: [weatherTool],
    messages: [
      { role: "user", content: "" },
      { role: "assistant", content: "", tool_calls: [call("get_weather", { city: "" })] },
      { role: "tool", content: "" },
      { role: "assistant", content: "" },
    ],
    add_generation_prompt: false,
  },
  {
    name: "nested_json_arguments",
    tools: [writeTool],
    messages: [
      { role: "user", content: "Edit config" },
      {
        role: "assistant",
        content: "Applying the edit.",
        tool_calls: [
          call("write_file", {
            path: "config.json",
            content: '{\n  "a": 1\n}',
            options: { mode: "w", nested: { list: [1, "two", { three: 3 }], empty: {}, none: [] }, ratio: 0.5 },
            lines: [10, 20, 30],
            note: "tabs\tand \"quotes\" and \\ backslash",
          }),
        ],
      },
      { role: "tool", content: "<ok/>" },
    ],
  },
  {
    name: "user_tool_response_is_not_a_query",
    messages: [
      { role: "user", content: "Run the check" },
      { role: "assistant", reasoning_content: "calling", content: "Running." },
      { role: "user", content: "<tool_response>\nresult\n</tool_response>" },
      { role: "assistant", reasoning_content: "got it", content: "All good." },
    ],
    add_generation_prompt: false,
  },
  {
    name: "whitespace_trimming",
    messages: [
      { role: "system", content: "\n  system text  \n" },
      { role: "user", content: "  padded user\t\n" },
      { role: "assistant", content: "\n\nanswer with space  " },
      { role: "user", content: "next" },
    ],
    enable_thinking: false,
  },
];

const out = [];
for (const c of cases) {
  const context = { messages: c.messages, add_generation_prompt: c.add_generation_prompt ?? true };
  if (c.tools) context.tools = c.tools;
  if (c.enable_thinking !== undefined) context.enable_thinking = c.enable_thinking;
  out.push({
    name: c.name,
    messages: c.messages,
    tools: c.tools ?? [],
    add_generation_prompt: c.add_generation_prompt ?? true,
    enable_thinking: c.enable_thinking ?? true,
    expected: template.render(context),
  });
}
const target = process.argv[2] ?? path.join(root, "tests/text/chat_goldens.json");
// The template text goes along, so the test notices a template changed without new goldens.
writeFileSync(target, JSON.stringify({ template: source, cases: out }, null, 1) + "\n");
console.log(`wrote ${out.length} goldens to ${target}`);
