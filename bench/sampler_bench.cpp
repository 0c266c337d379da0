// Sampler cost per token at the Qwen3.5/3.6 vocabulary (248320 logits), one thread: greedy, the
// server's default (temperature with top-k 20 and top-p 0.95), top-p alone (top_k 0) on a peaked and
// a flat row, temperature alone, min-p alone, and with a repetition penalty over a 4096-token history.
// The logits are drawn once, with a few large values as a model's are; a decode step of the 35B-A3B
// on an H100 is about 2 ms.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

constexpr int32_t kVocab = 248320;

std::vector<float> make_logits(int head) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> out(kVocab);
  for (float& x : out) x = n(rng);
  for (int i = 0; i < head; ++i) out[(i * 7919) % kVocab] = 14.0f + 0.1f * static_cast<float>(i);
  return out;
}

const std::vector<float>& logits() {
  static const std::vector<float> v = make_logits(40);
  return v;
}

void run(benchmark::State& st, ds::SamplingParams p, int history, const std::vector<float>& l = logits()) {
  std::vector<int32_t> prompt(history);
  for (int i = 0; i < history; ++i) prompt[i] = (i * 104729) % kVocab;
  std::vector<int32_t> generated;
  ds::Sampler sampler(p);
  for (auto _ : st) benchmark::DoNotOptimize(sampler.sample(l, prompt, generated));
  st.SetItemsProcessed(st.iterations());
}

void BM_SampleGreedy(benchmark::State& st) { run(st, {}, 0); }
void BM_SampleTopK20TopP(benchmark::State& st) {
  run(st, {.temperature = 0.7f, .top_k = 20, .top_p = 0.95f}, 0);
}
void BM_SampleTopPOnly(benchmark::State& st) { run(st, {.temperature = 0.7f, .top_k = 0, .top_p = 0.95f}, 0); }
// No peaked head: the 0.95 nucleus holds tens of thousands of tokens (the worst case of top-p alone).
void BM_SampleTopPOnlyFlat(benchmark::State& st) {
  static const std::vector<float> flat = make_logits(0);
  run(st, {.temperature = 0.7f, .top_k = 0, .top_p = 0.95f}, 0, flat);
}
void BM_SampleTemperatureOnly(benchmark::State& st) { run(st, {.temperature = 1.0f, .top_k = 0}, 0); }
void BM_SampleMinPOnly(benchmark::State& st) { run(st, {.temperature = 1.0f, .top_k = 0, .min_p = 0.05f}, 0); }
void BM_SampleRepetitionPenalty(benchmark::State& st) {
  run(st, {.temperature = 0.7f, .top_k = 20, .top_p = 0.95f, .repetition_penalty = 1.1f}, 4096);
}

BENCHMARK(BM_SampleGreedy)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleTopK20TopP)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleTopPOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleTopPOnlyFlat)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleTemperatureOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleMinPOnly)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleRepetitionPenalty)->Unit(benchmark::kMicrosecond);

}  // namespace
