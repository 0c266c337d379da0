// Sequence state streams on the host (state_serialize / state_deserialize, one thread): a state of the
// Qwen3.6-35B-A3B shape (40 layers, 10 of them attention with F16 KV of 2 heads x 256, 30 DeltaNet
// layers of 32 x 128 x 128 SSM state) at 4096 and 16384 tokens, as the engine snapshots a prompt and
// restores it. The state lives in host memory here, so this times the stream's assembly, checksums
// and copies; a CUDA state adds its device copies (docs/perf-gpu.md, "Snapshots on CUDA are slow").
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>

#include "state/sequence_state.h"
#include "state/state_io.h"

namespace {

std::shared_ptr<ds::KvPool> pool_35b(int64_t n_ctx) {
  ds::StateLayout l;
  for (int i = 0; i < 40; ++i) {
    l.kinds.push_back(i % 4 == 3 ? ds::LayerStateKind::kAttention : ds::LayerStateKind::kRecurrent);
  }
  l.n_head_kv = 2;
  l.head_dim = 256;
  l.kv_dtype = ds::DType::F16;
  l.conv_kernel = 4;
  l.conv_dim = 2 * 16 * 128 + 32 * 128;
  l.ssm_dk = 128;
  l.ssm_dv = 128;
  l.ssm_nv = 32;
  l.n_vocab = 248320;
  l.n_ctx = n_ctx;
  return std::make_shared<ds::KvPool>(l, ds::Device{}, 2 * (n_ctx / 64 + 1));  // two states
}

std::unique_ptr<ds::SequenceState> state_at(const std::shared_ptr<ds::KvPool>& pool, int64_t n_tokens) {
  auto st = std::move(ds::SequenceState::create(pool)).value();
  const ds::Status reserved = st->kv_reserve(n_tokens);
  if (!reserved.is_ok()) std::abort();
  st->set_pos(n_tokens);
  return st;
}

void BM_StateSerialize(benchmark::State& s) {
  const int64_t n = s.range(0);
  auto pool = pool_35b(n);
  auto st = state_at(pool, n);
  size_t bytes = 0;
  for (auto _ : s) {
    auto out = ds::state_serialize(*st, n);
    bytes = out.value().size();
    benchmark::DoNotOptimize(out.value().data());
  }
  s.SetBytesProcessed(static_cast<int64_t>(bytes) * s.iterations());
}

void BM_StateDeserialize(benchmark::State& s) {
  const int64_t n = s.range(0);
  auto pool = pool_35b(n);
  auto st = state_at(pool, n);
  const std::vector<uint8_t> bytes = ds::state_serialize(*st, n).value();
  st.reset();
  for (auto _ : s) {
    auto back = ds::state_deserialize(bytes, pool);
    benchmark::DoNotOptimize(back.value().get());
  }
  s.SetBytesProcessed(static_cast<int64_t>(bytes.size()) * s.iterations());
}

BENCHMARK(BM_StateSerialize)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StateDeserialize)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond);

}  // namespace
