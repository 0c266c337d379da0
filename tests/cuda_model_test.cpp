// The whole model on CUDA against the CPU model on the same file: golden fixtures (F32 against the
// transformers logits, q4_k_m against the CPU), greedy decoding of the tiny / small test models,
// decode graphs on vs off (bitwise), prefill schedules, snapshots across devices (byte-identical
// streams), F16 and Q8_0 KV, device memory after load, the debug hook, and the engine with prefix snapshots.
// Skipped without a CUDA build or device (the setup-error test runs everywhere).
//
// Tolerances, stated once (max|cuda - cpu| / max|cpu| over a logit row unless named RMS):
//  - kTolF32 1e-3: F32 weights. The CPU golden test holds 1e-4 against transformers; the GPU sums in
//    a different order (cuBLAS tiles, warp reductions, the recurrent DeltaNet form in prefill), so
//    CUDA gets 1e-3.
//  - kTolQuantRms 0.156 (RMS(diff) / RMS(cpu) over a row): quantized weights. The CPU rounds
//    activations to 8 bits in its own block layout, CUDA rounds them to 8 bits in another (decode) or
//    to BF16 (prefill GEMM), so the two differ by activation rounding. The CPU golden test allows 0.11
//    between the CPU fast path and its float reference on the same q4_k_m files; CUDA may be as far
//    from that reference, and the two roundings are independent, so CPU vs CUDA gets sqrt(2) x 0.11.
//  - kFloatOrderMargin 1e-3: a greedy step where CPU and CUDA pick different tokens is explained by
//    float order when the CPU's margin between the two picks is below it. For quantized weights a
//    larger margin is reported (with the measured logit difference) but only the RMS bound fails.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/local_engine.h"
#include "golden_fixture.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "ops/device_buffer.h"
#include "testmodel/test_model_config.h"
#include "testmodel/test_model_writer.h"

#if DS_HAVE_CUDA
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/timeline.h"
#endif

namespace ds {
namespace {
namespace fs = std::filesystem;

// Without a usable device (or backend) a CUDA model must refuse clearly, not crash.
TEST(CudaModelSetup, MissingDeviceOrBackendIsAClearError) {
#if DS_HAVE_CUDA
  const int n = cuda::device_count();
#else
  const int n = 0;
#endif
  testmodel::TestModelOverrides ov;
  ov.type = testmodel::OutType::kF32;
  auto cfg = testmodel::test_model_config_make("tiny", ov);
  ASSERT_TRUE(cfg.is_ok());
  const fs::path path = fs::temp_directory_path() / fmt::format("ds-cuda-setup-{}.gguf", ::getpid());
  ASSERT_TRUE(testmodel::test_model_write(*cfg, path.string(), {}).is_ok());
  ModelOptions o;
  o.n_ctx = 256;
  o.device = Device{DeviceKind::kCuda, n};  // one past the last device (cuda:0 when there is none)
  auto m = Model::load(path.string(), o);
  fs::remove(path);
  ASSERT_FALSE(m.is_ok());
  const std::string msg = m.status().to_string();
  EXPECT_NE(msg.find(fmt::format("cuda:{}", n)), std::string::npos) << msg;
  if (n == 0) {
    EXPECT_EQ(m.status().code(), StatusCode::kUnsupported) << msg;
  } else {
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << msg;
  }
}

#if DS_HAVE_CUDA

constexpr double kTolF32 = 1e-3;
constexpr double kTolQuantRms = 0.156;  // sqrt(2) x 0.11, see the top
// MoE models: the router's top-k is discontinuous, so activation rounding next to a near-tie swaps an
// expert at some positions and moves those logits by far more than rounding alone (measured on the
// H100: dense worst 0.109, 0.110 with the v5 kernels; MoE single positions up to 0.56 on the one-layer moe_256 fixture, while the
// F32 MoE models agree to 1e-6 over every position). For MoE the dense bound must hold at most
// positions (kMoeSwapShare may exceed it) and every position stays under kTolQuantRmsMoe.
constexpr double kTolQuantRmsMoe = 1.0;
constexpr double kMoeSwapShare = 0.2;
double quant_rms_bound(const Model& m) { return m.config().is_moe() ? kTolQuantRmsMoe : kTolQuantRms; }
// Counts positions over the dense bound; for MoE models checks their share at the end.
struct QuantSteps {
  int n = 0, over = 0;
  void add(double rms) {
    ++n;
    over += rms > kTolQuantRms;
  }
  void check(const Model& m, const std::string& label) const {
    if (!m.config().is_moe()) return;  // dense: every position was checked against kTolQuantRms
    EXPECT_LE(over, std::max(2, static_cast<int>(kMoeSwapShare * n)))
        << label << ": " << over << " of " << n << " positions exceed rms " << kTolQuantRms;
    std::printf("[cuda-moe] %s: %d of %d positions over rms %.2g\n", label.c_str(), over, n, kTolQuantRms);
  }
};
constexpr double kFloatOrderMargin = 1e-3;
const Device kGpu{DeviceKind::kCuda, 0};

#define DS_REQUIRE_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

using testmodel::OutType;
using testmodel::TestArch;

// Test model files, written once per (preset, arch, type) for the whole binary, removed at exit.
struct ModelFiles {
  std::mutex mu;
  std::map<std::string, std::string> paths;
  ~ModelFiles() {
    for (auto& [k, p] : paths) fs::remove(p);
  }
};
ModelFiles& model_files() {
  static ModelFiles f;
  return f;
}

std::string test_model(const std::string& preset, TestArch arch, OutType type) {
  ModelFiles& files = model_files();
  std::lock_guard<std::mutex> lock(files.mu);
  const std::string key = fmt::format("{}-{}-{}", preset, testmodel::test_arch_name(arch), testmodel::out_type_name(type));
  auto it = files.paths.find(key);
  if (it != files.paths.end()) return it->second;
  testmodel::TestModelOverrides ov;
  ov.arch = arch;
  ov.type = type;
  ov.seed = 11;
  auto cfg = testmodel::test_model_config_make(preset, ov);
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  const fs::path path = fs::temp_directory_path() / fmt::format("ds-cuda-model-{}-{}.gguf", ::getpid(), key);
  const Status s = testmodel::test_model_write(*cfg, path.string(), {});
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  files.paths[key] = path.string();
  return path.string();
}

std::unique_ptr<Model> load(const std::string& path, Device device, ModelOptions o = {}) {
  o.device = device;
  if (o.n_ctx == 0) o.n_ctx = 2048;
  if (o.n_threads == 0) o.n_threads = 8;
  auto m = Model::load(path, o);
  EXPECT_TRUE(m.is_ok()) << path << " on " << device.to_string() << ": " << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// Engine options on cuda:0 with a context of n_ctx and no RAM snapshot tier.
EngineOptions cuda_engine_options(int64_t n_ctx) {
  EngineOptions o;
  o.device = "cuda:0";
  o.n_ctx = n_ctx;
  o.cache_ram_bytes = 0;
  return o;
}

// An engine on `path` (its opening checked); null when it does not open.
std::unique_ptr<LocalEngine> open_engine(const std::string& path, const EngineOptions& o) {
  auto e = LocalEngine::open(path, o);
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

std::vector<float> logits_of(const Model& m, const SequenceState& st) {
  auto l = m.logits(st);
  return {l.begin(), l.end()};
}

int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// How far `got` is from `ref`: max|diff| / max|ref| (with the index and values of the worst element,
// or of the first non-finite one) and RMS(diff) / RMS(ref).
struct Diff {
  double rel = 0, rms = 0, max_abs = 0;
  int64_t index = -1;
  float got = 0, ref = 0;
  bool finite = true;
  std::string str() const {
    return fmt::format("max|diff|/max|ref| {:.3g} (max |diff| {:.3g} at index {}: got {} ref {}), rms {:.3g}{}", rel,
                       max_abs, index, got, ref, rms, finite ? "" : ", NOT FINITE");
  }
};

Diff compare(std::span<const float> got, std::span<const float> ref) {
  Diff d;
  EXPECT_EQ(got.size(), ref.size());
  double mag = 0, sq_d = 0, sq_r = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      if (d.finite) {
        d.finite = false;
        d.index = static_cast<int64_t>(i);
        d.got = got[i];
        d.ref = ref[i];
      }
      continue;
    }
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (d.finite && diff > d.max_abs) {
      d.max_abs = diff;
      d.index = static_cast<int64_t>(i);
      d.got = got[i];
      d.ref = ref[i];
    }
    mag = std::max(mag, std::fabs(static_cast<double>(ref[i])));
    sq_d += diff * diff;
    sq_r += static_cast<double>(ref[i]) * ref[i];
  }
  d.rel = d.finite ? d.max_abs / std::max(mag, 1e-12) : INFINITY;
  d.rms = d.finite ? std::sqrt(sq_d / std::max(sq_r, 1e-30)) : INFINITY;
  return d;
}

// Bitwise equality of two float rows, naming the first differing element.
::testing::AssertionResult bitwise_equal(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      return ::testing::AssertionFailure() << "first difference at index " << i << ": " << a[i] << " vs " << b[i]
                                           << " (" << compare(a, b).str() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Greedy decoding on both models in lockstep from the same prompt: each step compares the logits,
// and both continue with the CPU's pick while the picks agree. At the first disagreement it reports
// the step, the CPU's top-2 margin and the CPU margin between the two picks, and stops.
void greedy_lockstep(Model& cpu, Model& gpu, const std::vector<int32_t>& prompt, int n_steps, bool f32_weights,
                     const std::string& label) {
  auto a = std::move(cpu.new_state()).value();
  auto b = std::move(gpu.new_state()).value();
  ASSERT_TRUE(cpu.prefill(*a, prompt).is_ok());
  const Status sp = gpu.prefill(*b, prompt);
  ASSERT_TRUE(sp.is_ok()) << label << ": " << sp.to_string();
  double worst_rel = 0, worst_rms = 0;
  QuantSteps qs;
  int step = 0;
  for (; step < n_steps; ++step) {
    const auto la = cpu.logits(*a), lb = gpu.logits(*b);
    const Diff d = compare(lb, la);
    worst_rel = std::max(worst_rel, d.rel);
    worst_rms = std::max(worst_rms, d.rms);
    if (f32_weights) {
      EXPECT_LE(d.rel, kTolF32) << label << " step " << step << ": " << d.str();
    } else {
      EXPECT_LE(d.rms, quant_rms_bound(gpu)) << label << " step " << step << ": " << d.str();
      qs.add(d.rms);
    }
    if (!d.finite || ::testing::Test::HasFailure()) break;
    const int32_t ta = argmax(la), tb = argmax(lb);
    if (ta != tb) {
      std::vector<float> sorted(la.begin(), la.end());
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const double top2 = sorted[0] - sorted[1];
      const double pick_margin = la[ta] - la[tb];
      const bool float_order = pick_margin < kFloatOrderMargin;
      std::printf("[cuda-greedy] %s: diverges at step %d: cpu %d, cuda %d; cpu top-2 margin %.3g, cpu margin "
                  "between the picks %.3g, step max|diff| %.3g: %s\n",
                  label.c_str(), step, ta, tb, top2, pick_margin, d.max_abs,
                  float_order ? "float order" : "activation rounding (quantized weights)");
      if (f32_weights) {
        EXPECT_TRUE(float_order) << label << " step " << step << ": cpu picks " << ta << ", cuda " << tb
                                 << " with a cpu margin of " << pick_margin << " >= " << kFloatOrderMargin;
      }
      break;
    }
    ASSERT_TRUE(cpu.decode(*a, ta).is_ok());
    const Status s = gpu.decode(*b, ta);
    ASSERT_TRUE(s.is_ok()) << label << " step " << step << ": " << s.to_string();
  }
  std::printf("[cuda-greedy] %s: %d / %d greedy steps identical; worst max|diff|/max|cpu| %.3g, worst rms %.3g\n",
              label.c_str(), step, n_steps, worst_rel, worst_rms);
  if (!f32_weights) qs.check(gpu, label);
}

// ---- golden fixtures (tests/fixtures/golden, see model_golden_test.cpp) ----

using Fixture = test::GoldenFixture;
Fixture load_fixture(const fs::path& dir) { return test::load_golden_fixture(dir); }
std::vector<fs::path> fixture_dirs() { return test::golden_fixture_dirs(); }
std::string convert(const Fixture& f, const std::string& type) {
  return test::convert_golden_fixture(f, type, "ds-cuda-golden");
}

ModelOptions golden_options() {
  ModelOptions o;
  o.n_ctx = 512;
  o.prefill_chunk = 64;
  return o;
}

TEST(CudaModelGolden, F32MatchesTransformers) {
  DS_REQUIRE_GPU();
  const auto dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 4u);
  for (const auto& dir : dirs) {
    const Fixture f = load_fixture(dir);
    SCOPED_TRACE(f.name);
    const std::string path = convert(f, "f32");
    auto m = load(path, kGpu, golden_options());
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(m->n_vocab(), f.vocab);
    const int64_t n = static_cast<int64_t>(f.prompt.size());
    const std::span<const int32_t> prompt(f.prompt);
    double worst = 0;
    auto check_row = [&](std::span<const float> got, int64_t row, const char* what) {
      const Diff d = compare(got, f.row_span(row));
      worst = std::max(worst, d.rel);
      EXPECT_LE(d.rel, kTolF32) << what << " row " << row << ": " << d.str();
    };
    {  // one call, then teacher-forced greedy decode
      auto st = std::move(m->new_state()).value();
      const Status ps = m->prefill(*st, prompt);
      ASSERT_TRUE(ps.is_ok()) << ps.to_string();
      for (size_t i = 0; i < f.greedy.size(); ++i) {
        check_row(m->logits(*st), n - 1 + static_cast<int64_t>(i), "prefill+decode");
        EXPECT_EQ(argmax(m->logits(*st)), f.greedy[i]) << "greedy step " << i;
        ASSERT_TRUE(m->decode(*st, f.greedy[i]).is_ok());
      }
    }
    {  // uneven segments across chunk boundaries
      auto st = std::move(m->new_state()).value();
      int64_t pos = 0;
      for (int64_t len : {37, 64, 100, 1, 98}) {
        len = std::min(len, n - pos);
        if (len <= 0) break;
        ASSERT_TRUE(m->prefill(*st, prompt.subspan(pos, len)).is_ok());
        pos += len;
        check_row(m->logits(*st), pos - 1, "segments");
      }
    }
    {  // token by token (decode steps, graph replays)
      auto st = std::move(m->new_state()).value();
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(m->decode(*st, f.prompt[i]).is_ok());
        check_row(m->logits(*st), i, "token by token");
        if (::testing::Test::HasFailure()) break;
      }
    }
    std::printf("[cuda-golden] %-10s f32 max|diff|/max|logit| = %.3g (bound %.0e)\n", f.name.c_str(), worst, kTolF32);
    fs::remove(path);
  }
}

TEST(CudaModelGolden, Q4KMMatchesCpu) {
  DS_REQUIRE_GPU();
  for (const auto& dir : fixture_dirs()) {
    const Fixture f = load_fixture(dir);
    if (f.name.find("256") == std::string::npos) continue;  // q4_k_m needs 256-wide rows
    SCOPED_TRACE(f.name);
    const std::string path = convert(f, "q4_k_m");
    auto gpu = load(path, kGpu, golden_options());
    auto cpu = load(path, Device{}, golden_options());
    ASSERT_TRUE(gpu && cpu);
    const std::span<const int32_t> prompt(f.prompt);
    double worst = 0;
    {
      auto a = std::move(cpu->new_state()).value();
      auto b = std::move(gpu->new_state()).value();
      ASSERT_TRUE(cpu->prefill(*a, prompt).is_ok());
      ASSERT_TRUE(gpu->prefill(*b, prompt).is_ok());
      const Diff d = compare(gpu->logits(*b), cpu->logits(*a));
      worst = std::max(worst, d.rms);
      EXPECT_LE(d.rms, quant_rms_bound(*gpu)) << "prefill: " << d.str();
    }
    {
      QuantSteps qs;
      auto a = std::move(cpu->new_state()).value();
      auto b = std::move(gpu->new_state()).value();
      for (size_t i = 0; i < f.prompt.size(); ++i) {
        ASSERT_TRUE(cpu->decode(*a, f.prompt[i]).is_ok());
        ASSERT_TRUE(gpu->decode(*b, f.prompt[i]).is_ok());
        const Diff d = compare(gpu->logits(*b), cpu->logits(*a));
        worst = std::max(worst, d.rms);
        EXPECT_LE(d.rms, quant_rms_bound(*gpu)) << "token by token, position " << i << ": " << d.str();
        qs.add(d.rms);
        if (::testing::Test::HasFailure()) break;
      }
      qs.check(*gpu, f.name + " token by token");
    }
    std::printf("[cuda-golden] %-10s q4_k_m cuda vs cpu: worst rms %.3g (bound %.2g)\n", f.name.c_str(), worst,
                quant_rms_bound(*gpu));
    fs::remove(path);
  }
}

// ---- greedy decoding on the generated test models ----

struct GreedyCase {
  std::string preset;
  TestArch arch;
  OutType type;
};

class CudaModelGreedy : public ::testing::TestWithParam<GreedyCase> {};

TEST_P(CudaModelGreedy, MatchesCpuFor256Tokens) {
  DS_REQUIRE_GPU();
  const GreedyCase& c = GetParam();
  const std::string path = test_model(c.preset, c.arch, c.type);
  ModelOptions o;
  o.n_ctx = 1024;
  auto cpu = load(path, Device{}, o);
  auto gpu = load(path, kGpu, o);
  ASSERT_TRUE(cpu && gpu);
  const auto prompt = random_tokens(40, cpu->n_vocab(), 5);
  greedy_lockstep(*cpu, *gpu, prompt, 256, c.type == OutType::kF32,
                  fmt::format("{} {} {}", c.preset, testmodel::test_arch_name(c.arch), testmodel::out_type_name(c.type)));
  const CudaGraphStats g = gpu->cuda_graph_stats();
  std::printf("[cuda-greedy] graphs: %lld captures, %lld replays, %lld uncaptured steps\n",
              static_cast<long long>(g.captures), static_cast<long long>(g.replays),
              static_cast<long long>(g.uncaptured));
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaModelGreedy,
    ::testing::Values(GreedyCase{"tiny", TestArch::kQwen35, OutType::kF32},
                      GreedyCase{"tiny", TestArch::kQwen35, OutType::kQ8_0},
                      GreedyCase{"tiny", TestArch::kQwen35, OutType::kQ4_K_M},
                      GreedyCase{"tiny", TestArch::kQwen35Moe, OutType::kQ8_0},
                      GreedyCase{"tiny", TestArch::kQwen35Moe, OutType::kQ4_K_M},
                      GreedyCase{"small", TestArch::kQwen35, OutType::kQ8_0},
                      GreedyCase{"small", TestArch::kQwen35, OutType::kQ4_K_M},
                      GreedyCase{"small", TestArch::kQwen35Moe, OutType::kQ4_K_M}),
    [](const ::testing::TestParamInfo<GreedyCase>& i) {
      return i.param.preset + "_" + testmodel::test_arch_name(i.param.arch) + "_" +
             testmodel::out_type_name(i.param.type);
    });

// ---- decode graphs ----

class CudaModelArch : public ::testing::TestWithParam<TestArch> {
 protected:
  std::string tiny(OutType t = OutType::kQ8_0) { return test_model("tiny", GetParam(), t); }
  struct OnOff {
    std::unique_ptr<Model> g, p;          // the tiny model with graphs on, off
    std::unique_ptr<SequenceState> a, b;  // a sequence of each, after the same prompt
  };
  // *m: both models, each sequence prefilled with the same n_prompt random tokens of `seed`.
  void on_off(int64_t n_prompt, uint32_t seed, OnOff* m) {
    ModelOptions on, off;
    off.cuda_graphs = false;
    m->g = load(tiny(), kGpu, on);
    m->p = load(tiny(), kGpu, off);
    ASSERT_TRUE(m->g && m->p);
    const auto prompt = random_tokens(n_prompt, m->g->n_vocab(), seed);
    m->a = std::move(m->g->new_state()).value();
    m->b = std::move(m->p->new_state()).value();
    ASSERT_TRUE(m->g->prefill(*m->a, prompt).is_ok());
    ASSERT_TRUE(m->p->prefill(*m->b, prompt).is_ok());
  }
  // `steps` greedy tokens decoded by g (graphs on) from a and by p (graphs off) from b, the logits
  // bitwise equal after every step.
  static void decode_both(Model& g, Model& p, SequenceState& a, SequenceState& b, int steps) {
    for (int step = 0; step < steps; ++step) {
      const int32_t t = argmax(g.logits(a));
      const Status sa = g.decode(a, t);
      ASSERT_TRUE(sa.is_ok()) << "step " << step << ": " << sa.to_string();
      ASSERT_TRUE(p.decode(b, t).is_ok());
      ASSERT_TRUE(bitwise_equal(g.logits(a), p.logits(b))) << "decode step " << step;
    }
  }
};

TEST_P(CudaModelArch, GraphsOnAndOffAreBitwiseIdentical) {
  DS_REQUIRE_GPU();
  OnOff m;
  ASSERT_NO_FATAL_FAILURE(on_off(30, 9, &m));
  auto &g = m.g, &p = m.p;
  auto &a = m.a, &b = m.b;
  ASSERT_TRUE(bitwise_equal(g->logits(*a), p->logits(*b))) << "after prefill";
  ASSERT_NO_FATAL_FAILURE(decode_both(*g, *p, *a, *b, 64));
  CudaGraphStats s = g->cuda_graph_stats();
  std::printf("[cuda-graph] 64 steps: %lld captures, %lld replays, %lld uncaptured\n",
              static_cast<long long>(s.captures), static_cast<long long>(s.replays),
              static_cast<long long>(s.uncaptured));
  EXPECT_EQ(s.captures, 1);
  EXPECT_GE(s.replays, 60);
  EXPECT_EQ(s.uncaptured + s.replays, 64);  // every step ran exactly once (a capture's run is a replay)
  EXPECT_EQ(p->cuda_graph_stats().captures, 0);
  EXPECT_EQ(p->cuda_graph_stats().replays, 0);

  // A second sequence decoding needs its own capture; then the first one recaptures on return.
  auto c = std::move(g->new_state()).value();
  ASSERT_TRUE(g->prefill(*c, random_tokens(5, g->n_vocab(), 10)).is_ok());
  for (int step = 0; step < 4; ++step) ASSERT_TRUE(g->decode(*c, argmax(g->logits(*c))).is_ok());
  EXPECT_EQ(g->cuda_graph_stats().captures, 2);
  auto d = std::move(p->new_state()).value();
  ASSERT_TRUE(p->prefill(*d, random_tokens(5, g->n_vocab(), 10)).is_ok());
  for (int step = 0; step < 4; ++step) ASSERT_TRUE(p->decode(*d, argmax(p->logits(*d))).is_ok());
  EXPECT_TRUE(bitwise_equal(g->logits(*c), p->logits(*d))) << "second sequence";
  ASSERT_NO_FATAL_FAILURE(decode_both(*g, *p, *a, *b, 4));  // the first sequence again
  EXPECT_EQ(g->cuda_graph_stats().captures, 3);
}

// A decode crossing the short launch bound (cuda::attention_launch_bound: 256 positions, where the
// attention decode takes one CTA per query row) is recaptured once, and stays bitwise the decode
// without graphs on both sides of it.
TEST_P(CudaModelArch, GraphsRecaptureAtTheShortBound) {
  DS_REQUIRE_GPU();
  OnOff m;
  ASSERT_NO_FATAL_FAILURE(on_off(240, 11, &m));
  ASSERT_NO_FATAL_FAILURE(decode_both(*m.g, *m.p, *m.a, *m.b, 32));  // positions 240 to 271
  EXPECT_EQ(m.g->cuda_graph_stats().captures, 2);
}

// Sequences created and destroyed one after another usually get the same addresses (state, recurrent
// state, logits), so the decode graph of one is replayed for the next: its copy of the logits goes to
// the next sequence's page-locked buffer at the same address. Each sequence must decode as a fresh
// model does (a graph whose copy targeted pages unlocked since faulted here).
TEST_P(CudaModelArch, GraphReplayedForTheNextSequenceAtTheSameAddresses) {
  DS_REQUIRE_GPU();
  ModelOptions on, off;
  on.cuda_time_steps = true;  // and the replays' device times
  off.cuda_graphs = false;
  auto g = load(tiny(), kGpu, on);
  auto p = load(tiny(), kGpu, off);
  ASSERT_TRUE(g && p);
  for (int rep = 0; rep < 4; ++rep) {
    auto a = std::move(g->new_state()).value();
    auto b = std::move(p->new_state()).value();
    EXPECT_TRUE(a->logits_pinned());
    const auto prompt = random_tokens(1 + rep % 2, g->n_vocab(), 20 + rep);  // one token: a decode step
    ASSERT_TRUE(g->prefill(*a, prompt).is_ok()) << "rep " << rep;
    ASSERT_TRUE(p->prefill(*b, prompt).is_ok());
    for (int step = 0; step < 3; ++step) {
      const int32_t t = argmax(p->logits(*b));
      const Status st = g->decode(*a, t);
      ASSERT_TRUE(st.is_ok()) << "rep " << rep << " step " << step << ": " << st.to_string();
      ASSERT_TRUE(p->decode(*b, t).is_ok());
      ASSERT_TRUE(bitwise_equal(g->logits(*a), p->logits(*b))) << "rep " << rep << " step " << step;
    }
  }
  const CudaGraphStats st = g->cuda_graph_stats();
  EXPECT_GE(st.replays, 4);
  EXPECT_EQ(st.timed_replays, st.replays - st.captures);  // a capture's own run is not timed
  EXPECT_GT(st.replay_device_ms, 0.0);
  EXPECT_EQ(p->cuda_graph_stats().timed_replays, 0);
}

// The decode timeline inside replayed graphs (`bench --timeline`): every launch of every step leaves one
// record in launch order, and the summary covers each step's launches with their kernels' names.
TEST_P(CudaModelArch, TimelineRecordsEveryLaunchOfReplayedSteps) {
  DS_REQUIRE_GPU();
  if (!cuda::timeline_compiled()) {
    EXPECT_FALSE(cuda::timeline_start(16).is_ok());  // a clear error, no buffer
    GTEST_SKIP() << "a build without DELTASERVE_TIMELINE records no timeline";
  }
  auto g = load(tiny(), kGpu, {});
  ASSERT_TRUE(g);
  auto a = std::move(g->new_state()).value();
  ASSERT_TRUE(g->prefill(*a, random_tokens(6, g->n_vocab(), 31)).is_ok());
  for (int step = 0; step < 2; ++step) ASSERT_TRUE(g->decode(*a, argmax(g->logits(*a))).is_ok());  // warm, captured
  const std::vector<float> before(g->logits(*a).begin(), g->logits(*a).end());
  ASSERT_TRUE(cuda::timeline_start(1 << 14).is_ok());
  EXPECT_FALSE(cuda::timeline_start(16).is_ok());  // one at a time
  constexpr int kSteps = 5;
  std::vector<int32_t> fed;
  for (int step = 0; step < kSteps; ++step) {
    fed.push_back(argmax(g->logits(*a)));
    ASSERT_TRUE(g->decode(*a, fed.back()).is_ok());
  }
  auto res = cuda::timeline_stop();
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  EXPECT_FALSE(cuda::timeline_stop().is_ok());  // none running
  EXPECT_EQ(res->dropped, 0);
  const auto& t = res->timeline;
  ASSERT_GT(t.step.size(), 10u);  // the step's kernels, logged when the graph was captured
  EXPECT_EQ(t.records.size(), kSteps * t.step.size());
  for (size_t i = 0; i < t.records.size(); ++i) {
    EXPECT_LE(t.records[i].entry_ns, t.records[i].release_ns) << i;
    if (i > 0) {
      EXPECT_LE(t.records[i - 1].release_ns, t.records[i].release_ns) << i;
    }
  }
  auto sum = cuda::timeline_summarize(t);
  ASSERT_TRUE(sum.is_ok()) << sum.status().to_string();
  EXPECT_EQ(sum->steps, kSteps);
  EXPECT_GT(sum->step_us, 0.0);
  bool marked = false;  // the norms and products mark points after their release
  for (const auto& p : sum->positions) {
    EXPECT_NE(p.name, "?");
    EXPECT_GE(p.span_us, 0.0) << p.name;
    for (double m : p.mark_us) marked = marked || m >= 0.0;
  }
  EXPECT_TRUE(marked);
  EXPECT_EQ(sum->by_kernel.front().span_us, std::max_element(sum->by_kernel.begin(), sum->by_kernel.end(),
                                                             [](const auto& x, const auto& y) { return x.span_us < y.span_us; })
                                                ->span_us);
  // Recording changed nothing: a model without graphs fed the same tokens gives the same logits.
  ModelOptions off;
  off.cuda_graphs = false;
  auto p = load(tiny(), kGpu, off);
  ASSERT_TRUE(p);
  auto b = std::move(p->new_state()).value();
  ASSERT_TRUE(p->prefill(*b, random_tokens(6, g->n_vocab(), 31)).is_ok());
  for (int step = 0; step < 2; ++step) ASSERT_TRUE(p->decode(*b, argmax(p->logits(*b))).is_ok());
  EXPECT_TRUE(bitwise_equal(p->logits(*b), before));
  for (int32_t tok : fed) ASSERT_TRUE(p->decode(*b, tok).is_ok());
  EXPECT_TRUE(bitwise_equal(g->logits(*a), p->logits(*b)));
}

TEST_P(CudaModelArch, AnotherSequenceIsCapturedAtItsFirstStep) {
  // Once the decode graph exists, a step of a sequence at other addresses is captured at once (the
  // warm-up op by op is for the step's first run only): two sequences decoding in turn change the key
  // every step, and every one of those steps is a capture with the bits of a model without graphs.
  DS_REQUIRE_GPU();
  ModelOptions off;
  off.cuda_graphs = false;
  auto g = load(tiny(), kGpu, {});
  auto p = load(tiny(), kGpu, off);
  ASSERT_TRUE(g && p);
  std::unique_ptr<SequenceState> a[2], b[2];  // on g, on p
  for (int s = 0; s < 2; ++s) {
    a[s] = std::move(g->new_state()).value();
    b[s] = std::move(p->new_state()).value();
    const auto prompt = random_tokens(3 + s, g->n_vocab(), 40 + s);
    ASSERT_TRUE(g->prefill(*a[s], prompt).is_ok());
    ASSERT_TRUE(p->prefill(*b[s], prompt).is_ok());
  }
  const auto step = [&](int s, const char* what) {
    const int32_t t = argmax(p->logits(*b[s]));
    const Status st = g->decode(*a[s], t);
    ASSERT_TRUE(st.is_ok()) << what << ": " << st.to_string();
    ASSERT_TRUE(p->decode(*b[s], t).is_ok());
    ASSERT_TRUE(bitwise_equal(g->logits(*a[s]), p->logits(*b[s]))) << what;
  };
  for (int i = 0; i < 3; ++i) step(0, "sequence 0 alone");  // warm-up, capture, replay
  const CudaGraphStats s0 = g->cuda_graph_stats();
  EXPECT_EQ(s0.uncaptured, 1);
  EXPECT_EQ(s0.captures, 1);
  for (int i = 0; i < 4; ++i) {
    step(1, "sequence 1 in turn");
    step(0, "sequence 0 in turn");
  }
  const CudaGraphStats s1 = g->cuda_graph_stats();
  EXPECT_EQ(s1.uncaptured, s0.uncaptured);     // no step ran op by op
  EXPECT_EQ(s1.captures - s0.captures, 8);     // each a capture into the one executable graph
  EXPECT_EQ(s1.replays - s0.replays, 8);       // (a capture's own run counts as a replay)
}

TEST_P(CudaModelArch, DecodeStepReturnsItsBestLogitsWhenAsked) {
  // A state that wants only its best logits gets the kTopKMax best of the row a plain state gets for
  // the same tokens (bit for bit: the same kernels), in graph steps; fetch_logits gives the whole row
  // while the device still holds it, and refuses once another state has run.
  DS_REQUIRE_GPU();
  auto g = load(tiny(), kGpu, {});
  ASSERT_TRUE(g);
  auto a = std::move(g->new_state()).value();
  auto b = std::move(g->new_state()).value();
  a->set_want_top_k(true);
  const auto prompt = random_tokens(5, g->n_vocab(), 31);
  ASSERT_TRUE(g->prefill(*a, prompt).is_ok());
  EXPECT_TRUE(a->logits_valid());  // a prefill returns the row
  std::vector<int32_t> tokens = {argmax(g->logits(*a))};
  std::vector<TopKResult> bests;
  std::vector<std::vector<float>> rows;
  for (int step = 0; step < 6; ++step) {
    ASSERT_TRUE(g->decode(*a, tokens.back()).is_ok()) << "step " << step;
    ASSERT_TRUE(a->top_k_valid()) << "step " << step;
    EXPECT_FALSE(a->logits_valid());
    EXPECT_TRUE(g->logits(*a).empty());
    bests.push_back(a->top_k());
    ASSERT_TRUE(g->fetch_logits(*a).is_ok());
    const auto row = g->logits(*a);
    rows.emplace_back(row.begin(), row.end());
    tokens.push_back(argmax(row));
  }
  EXPECT_GE(g->cuda_graph_stats().replays, 3);
  ASSERT_TRUE(g->decode(*a, tokens.back()).is_ok());  // best logits only, the row left on the device
  ASSERT_TRUE(g->prefill(*b, prompt).is_ok());        // the device's row is b's now
  EXPECT_FALSE(a->logits_valid());
  EXPECT_EQ(g->fetch_logits(*a).code(), StatusCode::kInvalidArgument);
  for (int step = 0; step < 6; ++step) {
    ASSERT_TRUE(g->decode(*b, tokens[static_cast<size_t>(step)]).is_ok());
    const auto row = g->logits(*b);
    ASSERT_TRUE(bitwise_equal(rows[static_cast<size_t>(step)], row)) << "step " << step;
    std::vector<int32_t> order(row.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return row[x] > row[y]; });
    const TopKResult& best = bests[static_cast<size_t>(step)];
    ASSERT_EQ(best.n, std::min<int32_t>(kTopKMax, static_cast<int32_t>(row.size())));
    for (int i = 0; i < best.n; ++i) {
      ASSERT_EQ(best.ids[i], order[static_cast<size_t>(i)]) << "step " << step << " entry " << i;
      ASSERT_EQ(best.values[i], row[static_cast<size_t>(order[static_cast<size_t>(i)])]);
    }
  }
}

TEST_P(CudaModelArch, GraphSurvivesKvChunkGrowthAndMaxKvBuckets) {
  DS_REQUIRE_GPU();
  ModelOptions on, off;
  on.n_ctx = off.n_ctx = 2048;
  on.prefill_chunk = off.prefill_chunk = 512;
  off.cuda_graphs = false;
  auto g = load(tiny(), kGpu, on);
  auto p = load(tiny(), kGpu, off);
  ASSERT_TRUE(g && p);
  // Start near a max_kv bucket edge (1024) and decode across it and across KV chunk edges (64).
  const auto prompt = random_tokens(1000, g->n_vocab(), 12);
  auto a = std::move(g->new_state()).value();
  auto b = std::move(p->new_state()).value();
  ASSERT_TRUE(g->prefill(*a, prompt).is_ok());
  ASSERT_TRUE(p->prefill(*b, prompt).is_ok());
  for (int step = 0; step < 100; ++step) {
    const int32_t t = argmax(g->logits(*a));
    ASSERT_TRUE(g->decode(*a, t).is_ok()) << "step " << step;
    ASSERT_TRUE(p->decode(*b, t).is_ok());
    ASSERT_TRUE(bitwise_equal(g->logits(*a), p->logits(*b))) << "decode step " << step << " at position " << a->pos();
  }
  EXPECT_EQ(g->cuda_graph_stats().captures, 2);  // max_kv 1024, then 2048
}

// ---- prefill schedules ----

TEST_P(CudaModelArch, PrefillOneCallTokenByTokenAndSegmentsAgree) {
  DS_REQUIRE_GPU();
  ModelOptions o;
  o.prefill_chunk = 64;
  auto m = load(tiny(), kGpu, o);
  ASSERT_NE(m, nullptr);
  const auto toks = random_tokens(150, m->n_vocab(), 13);
  auto run = [&](std::vector<int64_t> pieces) {
    auto st = std::move(m->new_state()).value();
    size_t i = 0;
    for (int64_t len : pieces) {
      const Status s = m->prefill(*st, std::span<const int32_t>(toks).subspan(i, static_cast<size_t>(len)));
      EXPECT_TRUE(s.is_ok()) << s.to_string();
      i += static_cast<size_t>(len);
    }
    EXPECT_EQ(i, toks.size());
    return logits_of(*m, *st);
  };
  const auto whole = run({150});
  // Pieces ending at multiples of prefill_chunk run the same segments: bit-identical.
  EXPECT_TRUE(bitwise_equal(run({64, 64, 22}), whole));
  EXPECT_TRUE(bitwise_equal(run({128, 22}), whole));
  // Other schedules differ by rounding only (BF16 GEMM vs float matvec, chunked vs recurrent).
  const Diff uneven = compare(run({37, 27, 50, 1, 35}), whole);
  EXPECT_LE(uneven.rms, kTolQuantRms) << "uneven segments: " << uneven.str();
  std::vector<int64_t> ones(150, 1);
  const Diff single = compare(run(ones), whole);
  EXPECT_LE(single.rms, kTolQuantRms) << "token by token: " << single.str();
  std::printf("[cuda-prefill] uneven vs one call: %s\n[cuda-prefill] token by token vs one call: %s\n",
              uneven.str().c_str(), single.str().c_str());
  // And the CPU agrees with the one-call CUDA prefill.
  auto cpu = load(tiny(), Device{}, o);
  auto st = std::move(cpu->new_state()).value();
  ASSERT_TRUE(cpu->prefill(*st, toks).is_ok());
  const Diff vs_cpu = compare(whole, logits_of(*cpu, *st));
  EXPECT_LE(vs_cpu.rms, kTolQuantRms) << "cuda vs cpu: " << vs_cpu.str();
}

// ---- snapshots across devices ----

TEST_P(CudaModelArch, SnapshotsMoveBetweenDevicesByteIdentical) {
  DS_REQUIRE_GPU();
  ModelOptions o;
  o.prefill_chunk = 64;
  o.kv_chunk_tokens = 16;
  auto cpu = load(tiny(), Device{}, o);
  auto gpu = load(tiny(), kGpu, o);
  ASSERT_TRUE(cpu && gpu);
  const auto prompt = random_tokens(77, cpu->n_vocab(), 14);

  // CUDA state -> stream -> CPU state -> stream: the same bytes.
  auto g = std::move(gpu->new_state()).value();
  ASSERT_TRUE(gpu->prefill(*g, prompt).is_ok());
  auto g_bytes = gpu->save_state(*g, g->pos());
  ASSERT_TRUE(g_bytes.is_ok()) << g_bytes.status().to_string();
  auto on_cpu = cpu->load_state(*g_bytes);
  ASSERT_TRUE(on_cpu.is_ok()) << on_cpu.status().to_string();
  EXPECT_EQ(*cpu->save_state(**on_cpu, 77), *g_bytes);
  // CPU state -> stream -> CUDA state -> stream: the same bytes.
  auto c = std::move(cpu->new_state()).value();
  ASSERT_TRUE(cpu->prefill(*c, prompt).is_ok());
  const auto c_bytes = std::move(cpu->save_state(*c, 77)).value();
  auto on_gpu = gpu->load_state(c_bytes);
  ASSERT_TRUE(on_gpu.is_ok()) << on_gpu.status().to_string();
  EXPECT_EQ(*gpu->save_state(**on_gpu, 77), c_bytes);
  // KV-only boundary streams too.
  EXPECT_EQ(*gpu->save_state(**on_gpu, 40), *cpu->save_state(*c, 40));

  // Round trip CUDA -> CPU -> CUDA continues bit-identically to the original CUDA state.
  auto back = gpu->load_state(*cpu->save_state(**on_cpu, 77));
  ASSERT_TRUE(back.is_ok());
  for (int step = 0; step < 16; ++step) {
    const int32_t t = argmax(gpu->logits(*g));
    ASSERT_TRUE(gpu->decode(*g, t).is_ok());
    ASSERT_TRUE(gpu->decode(**back, t).is_ok());
    ASSERT_TRUE(bitwise_equal(gpu->logits(*g), gpu->logits(**back))) << "step " << step;
  }
  // A CUDA state continued on the CPU, and a CPU state continued on CUDA, follow their source's
  // greedy tokens (up to an explained float-order tie).
  for (int dir = 0; dir < 2; ++dir) {
    Model& src = dir == 0 ? *gpu : *cpu;
    Model& dst = dir == 0 ? *cpu : *gpu;
    auto s = std::move(src.new_state()).value();
    ASSERT_TRUE(src.prefill(*s, prompt).is_ok());
    auto d = dst.load_state(*src.save_state(*s, s->pos()));
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_TRUE(bitwise_equal(dst.logits(**d), src.logits(*s))) << "restored logits";
    for (int step = 0; step < 32; ++step) {
      const int32_t ts = argmax(src.logits(*s)), td = argmax(dst.logits(**d));
      if (ts != td) {
        const auto ls = src.logits(*s);
        std::printf("[cuda-snapshot] %s -> %s diverges at step %d; source margin %.3g\n",
                    src.device().to_string().c_str(), dst.device().to_string().c_str(), step, ls[ts] - ls[td]);
        const Diff diff = compare(dst.logits(**d), ls);
        EXPECT_LE(diff.rms, kTolQuantRms) << diff.str();
        break;
      }
      ASSERT_TRUE(src.decode(*s, ts).is_ok());
      ASSERT_TRUE(dst.decode(**d, ts).is_ok());
    }
  }
}

TEST_P(CudaModelArch, LayerRangeStreamsForkAndResetOnDevice) {
  DS_REQUIRE_GPU();
  ModelOptions o;
  o.kv_chunk_tokens = 16;
  auto gpu = load(tiny(), kGpu, o);
  ASSERT_NE(gpu, nullptr);
  const int64_t L = gpu->config().n_layer;
  const auto prompt = random_tokens(41, gpu->n_vocab(), 15);
  auto st = std::move(gpu->new_state()).value();
  ASSERT_TRUE(gpu->prefill(*st, prompt).is_ok());
  const auto whole = std::move(gpu->save_state(*st, 41)).value();
  // Two layer-range streams imported one after the other rebuild the same state.
  auto merged = std::move(gpu->new_state()).value();
  ASSERT_TRUE(gpu->load_state_into(*gpu->save_state(*st, 41, LayerRange{0, L / 2}), *merged).is_ok());
  ASSERT_TRUE(gpu->load_state_into(*gpu->save_state(*st, 41, LayerRange{L / 2, L}), *merged).is_ok());
  std::copy(st->logits().begin(), st->logits().end(), merged->logits().begin());
  merged->set_logits_valid(true);
  EXPECT_EQ(*gpu->save_state(*merged, 41), whole);
  // A fork continues exactly like its parent. Both own page-locked logits, which each decode step's
  // copy fills directly (one graph, re-keyed to each sequence's buffer).
  auto fork = std::move(st->fork()).value();
  EXPECT_TRUE(st->logits_pinned() && fork->logits_pinned());
  EXPECT_NE(st->logits().data(), fork->logits().data());
  ASSERT_TRUE(gpu->decode(*st, 3).is_ok());
  ASSERT_TRUE(gpu->decode(*fork, 3).is_ok());
  EXPECT_TRUE(bitwise_equal(gpu->logits(*st), gpu->logits(*fork)));
  // Reset gives a state that runs like a fresh one.
  ASSERT_TRUE(st->reset().is_ok());
  auto fresh = std::move(gpu->new_state()).value();
  ASSERT_TRUE(gpu->prefill(*st, prompt).is_ok());
  ASSERT_TRUE(gpu->prefill(*fresh, prompt).is_ok());
  EXPECT_TRUE(bitwise_equal(gpu->logits(*st), gpu->logits(*fresh)));
  EXPECT_NE(st->device_slot_table(), nullptr);
}

TEST_P(CudaModelArch, DebugHookSeesHostCopies) {
  DS_REQUIRE_GPU();
  auto gpu = load(tiny(), kGpu);
  ASSERT_NE(gpu, nullptr);
  std::map<std::string, std::vector<float>> seen;
  gpu->set_debug_hook([&](std::string_view name, const TensorView& t) {
    EXPECT_EQ(t.device.kind, DeviceKind::kCpu) << name;
    if (t.dtype == DType::F32) {
      const float* p = t.as<float>();
      seen[std::string(name)].assign(p, p + t.n_elements());  // host memory: readable here
    }
  });
  auto st = std::move(gpu->new_state()).value();
  ASSERT_TRUE(gpu->prefill(*st, random_tokens(7, gpu->n_vocab(), 16)).is_ok());
  ASSERT_TRUE(gpu->decode(*st, 5).is_ok());
  EXPECT_EQ(gpu->cuda_graph_stats().captures, 0);  // no graphs while a hook is set
  ASSERT_TRUE(seen.count("token_embd") && seen.count("blk.0.out") && seen.count("result_output"));
  EXPECT_TRUE(bitwise_equal(seen["result_output"], gpu->logits(*st)));
}

// ---- F16, Q8_0 and Q4_0 KV ----

// The CUDA model against the CPU model, both with a `kv` cache, over a 100-token prompt and `steps`
// steps decoding the CPU's greedy tokens: every step's logits within `bound` (max|diff| / max|cpu|), the
// worst printed under `tag`, and the state streams equal after a round trip through the CPU. Returns the
// worst; with `other` (a CUDA model with another cache, fed the same tokens) *from_other gets the worst
// distance of the CUDA logits from its logits.
double kv_close_to_cpu(const std::string& path, DType kv, int steps, double bound, const char* tag,
                       Model* other = nullptr, double* from_other = nullptr) {
  ModelOptions o;
  o.kv_dtype = kv;
  auto cpu = load(path, Device{}, o);
  auto gpu = load(path, kGpu, o);
  EXPECT_TRUE(cpu && gpu);
  if (!cpu || !gpu) return INFINITY;
  const auto prompt = random_tokens(100, cpu->n_vocab(), 17);
  auto a = std::move(cpu->new_state()).value();
  auto b = std::move(gpu->new_state()).value();
  std::unique_ptr<SequenceState> c = other ? std::move(other->new_state()).value() : nullptr;
  EXPECT_TRUE(cpu->prefill(*a, prompt).is_ok());
  EXPECT_TRUE(gpu->prefill(*b, prompt).is_ok());
  if (other) {
    EXPECT_TRUE(other->prefill(*c, prompt).is_ok());
  }
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    const Diff d = compare(gpu->logits(*b), cpu->logits(*a));
    worst = std::max(worst, d.rel);
    if (other) *from_other = std::max(*from_other, compare(gpu->logits(*b), other->logits(*c)).rel);
    EXPECT_LE(d.rel, bound) << "step " << step << ": " << d.str();
    const int32_t t = argmax(cpu->logits(*a));
    if (!cpu->decode(*a, t).is_ok() || !gpu->decode(*b, t).is_ok() || (other && !other->decode(*c, t).is_ok())) {
      ADD_FAILURE() << "decode failed at step " << step;
      return INFINITY;
    }
  }
  std::printf("[%s] worst max|diff|/max|cpu| %.3g\n", tag, worst);
  EXPECT_EQ(*cpu->save_state(**cpu->load_state(*gpu->save_state(*b, b->pos())), b->pos()),
            *gpu->save_state(*b, b->pos()));
  return worst;
}

// F16 rounding of K/V may round a value differently when the F32 inputs differ in the last bit.
TEST_P(CudaModelArch, HalfKvCloseToCpuHalfKv) {
  DS_REQUIRE_GPU();
  kv_close_to_cpu(tiny(OutType::kF32), DType::F16, 16, 2 * kTolF32, "cuda-f16kv");
}

// A block-quantized KV cache (`kv`): kv_close_to_cpu within `bound`, and the CUDA logits further from
// the CUDA F32-KV model's than from the CPU's (the KV is quantized on both).
void quant_kv_close_to_cpu(const std::string& path, DType kv, double bound, const char* tag) {
  auto gpu_f32 = load(path, kGpu, ModelOptions{});
  ASSERT_TRUE(gpu_f32);
  double from_f32 = 0;
  const double worst = kv_close_to_cpu(path, kv, 32, bound, tag, gpu_f32.get(), &from_f32);
  std::printf("[%s] from the F32 KV %.3g\n", tag, from_f32);
  EXPECT_GT(from_f32, worst) << "the " << dtype_name(kv) << " cache reads like the F32 one";
}

// Q8_0 KV: the same codes but where an F32 input differs in its last bit across a rounding boundary
// (one code step, 1/127 of its block's largest magnitude), so a looser bound than F16 KV.
TEST_P(CudaModelArch, Q8KvCloseToCpuQ8Kv) {
  DS_REQUIRE_GPU();
  quant_kv_close_to_cpu(tiny(OutType::kF32), DType::Q8_0, 2e-2, "cuda-q8kv");
}

// Q4_0 KV: the same with a code step of 1/8 of its block's largest magnitude, so a looser bound again.
TEST_P(CudaModelArch, Q4KvCloseToCpuQ4Kv) {
  DS_REQUIRE_GPU();
  quant_kv_close_to_cpu(tiny(OutType::kF32), DType::Q4_0, 1e-1, "cuda-q4kv");
}

INSTANTIATE_TEST_SUITE_P(Arch, CudaModelArch, ::testing::Values(TestArch::kQwen35, TestArch::kQwen35Moe),
                         [](const ::testing::TestParamInfo<TestArch>& i) {
                           return std::string(testmodel::test_arch_name(i.param));
                         });

// ---- memory ----

TEST(CudaModelMemory, LiveBytesAfterLoadAreTheWeights) {
  DS_REQUIRE_GPU();
  const std::string path = test_model("small", TestArch::kQwen35, OutType::kQ4_K_M);
  int64_t tensor_bytes = 0, n_tensors = 0;
  {
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.is_ok());
    for (const GgufTensorInfo& t : (*f)->tensors()) {
      tensor_bytes += dtype_row_bytes(t.dtype, t.ne[0]) * (t.n_elements() / t.ne[0]);
      ++n_tensors;
    }
  }
  const int64_t before = allocator_stats(kGpu).live_bytes;
  ModelOptions o;
  o.n_ctx = 4096;
  o.prefill_chunk = kPrefillChunkCuda;  // the step buffers' size below (they grow with the chunk)
  auto m = load(path, kGpu, o);
  ASSERT_NE(m, nullptr);
  const int64_t after = allocator_stats(kGpu).live_bytes;
  // Weights: every tensor once, each padded to 256 bytes; the Q6_K product weights regrouped to Q6_K_G4
  // (848 bytes per 1024 elements instead of 840): the output and the larger attn_qkv / attn_v here.
  EXPECT_GE(m->weight_device_bytes(), tensor_bytes);
  EXPECT_LE(m->weight_device_bytes(), tensor_bytes * 848 / 840 + 256 * n_tensors);
  EXPECT_EQ(m->weights().output.dtype, DType::Q6_K_G4);
  int64_t g4_layers = 0;
  for (const LayerWeights& L : m->weights().layers) {
    g4_layers += L.kind == LayerKind::kAttention ? L.attn.wv.dtype == DType::Q6_K_G4
                                                 : L.deltanet.wqkv.dtype == DType::Q6_K_G4;
  }
  EXPECT_GT(g4_layers, 0);
  EXPECT_EQ(m->weights().token_embd.dtype, DType::Q4_K);  // read by get_rows: stays as in the file
  // Besides the weights only small per-model buffers (hidden rows of one prefill chunk, logits,
  // step parameters) and the allocator's 2 MiB rounding.
  const int64_t extra = after - before - m->weight_device_bytes();
  std::printf("[cuda-memory] weights %.1f MiB, other live %.1f MiB\n", m->weight_device_bytes() / 1048576.0,
              extra / 1048576.0);
  EXPECT_GE(extra, 0);
  EXPECT_LE(extra, int64_t{16} << 20);
  m.reset();
  EXPECT_EQ(allocator_stats(kGpu).live_bytes, before);  // everything comes back
}

// A tied output (the token embedding, which get_rows reads too) keeps the file's Q6_K layout where the
// untied output is regrouped (LiveBytesAfterLoadAreTheWeights); greedy decoding still follows the CPU.
TEST(CudaModelMemory, TiedOutputKeepsTheFileLayout) {
  DS_REQUIRE_GPU();
  testmodel::TestModelOverrides ov;
  ov.arch = TestArch::kQwen35;
  ov.type = OutType::kQ4_K_M;
  ov.seed = 11;
  ov.tied_output = true;
  auto cfg = testmodel::test_model_config_make("small", ov);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  const fs::path path = fs::temp_directory_path() / fmt::format("ds-cuda-tied-{}.gguf", ::getpid());
  ASSERT_TRUE(testmodel::test_model_write(*cfg, path.string(), {}).is_ok());
  ModelOptions o;
  o.n_ctx = 512;
  auto cpu = load(path.string(), Device{}, o);
  auto gpu = load(path.string(), kGpu, o);
  ASSERT_TRUE(cpu && gpu);
  EXPECT_EQ(gpu->weights().token_embd.dtype, DType::Q6_K);
  EXPECT_EQ(gpu->weights().output.dtype, DType::Q6_K);
  EXPECT_EQ(gpu->weights().output.data, gpu->weights().token_embd.data);
  greedy_lockstep(*cpu, *gpu, random_tokens(20, cpu->n_vocab(), 3), 32, false, "small qwen35 q4_k_m tied");
  cpu.reset();
  gpu.reset();
  fs::remove(path);
}

// ---- engine ----

TEST(CudaModelEngine, PrefixSnapshotsWorkOnCudaAndAcrossDevices) {
  DS_REQUIRE_GPU();
  const std::string path = test_model("tiny", TestArch::kQwen35Moe, OutType::kQ8_0);
  const fs::path dir = fs::temp_directory_path() / fmt::format("ds-cuda-engine-{}", ::getpid());
  fs::remove_all(dir);
  // One KV type on both devices: snapshots cross devices only within a state layout (the CUDA default
  // is f16, the CPU's f32).
  auto open = [&](const std::string& device, int64_t ram, bool disk) {
    EngineOptions o;
    o.device = device;
    o.kv_type = "f32";
    o.n_ctx = 1024;
    o.n_threads = 8;
    o.checkpoint_every = 128;
    o.cache_ram_bytes = ram;
    if (disk) o.kv_cache_dir = dir.string();
    return open_engine(path, o);
  };
  auto gen = [](LocalEngine& e, const std::vector<int32_t>& prompt) {
    GenerateRequest r;
    r.prompt = prompt;
    r.max_tokens = 16;
    r.ignore_eos = true;
    auto res = e.generate(r);
    EXPECT_TRUE(res.is_ok()) << res.status().to_string();
    return res.is_ok() ? std::move(res).value() : GenerateResult{};
  };
  // Conversation-shaped prompts (<|im_start|> at turn starts): the next request re-sends turn 1 up to
  // its last <|im_start|>, so the restored prefix ends at a split point of both runs.
  int32_t im_start = -1;
  {
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.is_ok());
    auto vocab = (*f)->get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(vocab.is_ok());
    for (size_t i = 0; i < vocab->size(); ++i) {
      if ((*vocab)[i] == "<|im_start|>") im_start = static_cast<int32_t>(i);
    }
  }
  ASSERT_GE(im_start, 0);
  auto conversation = [&](int turns, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int t = 0; t < turns; ++t) {
      p.push_back(im_start);
      for (int i = 0; i < 60; ++i) p.push_back(static_cast<int32_t>(rng() % 200 + 10));
    }
    p.push_back(im_start);
    p.push_back(11);
    return p;
  };
  const auto p1 = conversation(4, 18);
  auto p2 = p1;
  p2.pop_back();
  const auto more = conversation(2, 19);
  p2.insert(p2.end(), more.begin(), more.end());

  // RAM tier on CUDA: a hit is token-identical to the uncached run.
  auto plain = open("cuda:0", 0, false);
  auto cached = open("cuda:0", 256 << 20, false);
  ASSERT_TRUE(plain && cached);
  EXPECT_EQ(cached->model().device(), kGpu);
  const auto ref2 = gen(*plain, p2);
  gen(*cached, p1);
  const auto got2 = gen(*cached, p2);
  EXPECT_EQ(got2.cached_tokens, static_cast<int64_t>(p1.size()) - 2);
  EXPECT_EQ(got2.tokens, ref2.tokens);

  // Disk tier written by a CPU engine, read by a CUDA engine: the restored logits are the CPU's.
  GenerateResult cpu_run;
  {
    auto cpu = open("cpu", 0, true);
    ASSERT_NE(cpu, nullptr);
    cpu_run = gen(*cpu, p1);
    cpu->flush_snapshots();
  }
  auto from_disk = open("cuda:0", 0, true);
  ASSERT_NE(from_disk, nullptr);
  const auto hit = gen(*from_disk, p1);
  EXPECT_EQ(hit.cached_tokens, static_cast<int64_t>(p1.size()));
  EXPECT_EQ(from_disk->stats().cache_disk_hits, 1u);
  ASSERT_FALSE(hit.tokens.empty());
  EXPECT_EQ(hit.tokens[0], cpu_run.tokens[0]);
  fs::remove_all(dir);
}

TEST(CudaModelEngine, RequestsAfterTheFirstRunNoStepOpByOp) {
  // Each request decodes in a new sequence state, so its steps have new graph keys: after the first
  // request warmed the graphs up, a request's steps are captures and replays (EngineStats), none op by
  // op, and its tokens are those of an engine without graphs. A one-token prompt runs as a step of the
  // graph that copies the whole row back, which no later step of the request uses.
  DS_REQUIRE_GPU();
  const std::string path = test_model("tiny", TestArch::kQwen35Moe, OutType::kQ8_0);
  auto open = [&](bool graphs) {
    EngineOptions o = cuda_engine_options(512);
    o.cuda_graphs = graphs;
    return open_engine(path, o);
  };
  auto with = open(true), without = open(false);
  ASSERT_TRUE(with && without);
  auto gen = [](LocalEngine& e, uint32_t seed) {
    GenerateRequest r;
    r.prompt = random_tokens(seed % 2 == 1 ? 1 : 6, e.info().n_vocab, seed);
    r.max_tokens = 12;
    r.ignore_eos = true;
    auto res = e.generate(r);
    EXPECT_TRUE(res.is_ok()) << res.status().to_string();
    return res.is_ok() ? std::move(res).value().tokens : std::vector<int32_t>{};
  };
  gen(*with, 1);
  const EngineStats first = with->stats();
  EXPECT_EQ(first.graph_op_by_op_steps, 2u);  // the warm-ups of the row and the best-logits graphs
  for (uint32_t seed = 2; seed < 6; ++seed) {
    const EngineStats s0 = with->stats();
    EXPECT_EQ(gen(*with, seed), gen(*without, seed)) << "request " << seed;
    const EngineStats s1 = with->stats();
    EXPECT_EQ(s1.graph_op_by_op_steps, s0.graph_op_by_op_steps) << "request " << seed;
    EXPECT_GE(s1.graph_captured_steps, s0.graph_captured_steps + 1) << "request " << seed;
    EXPECT_GE(s1.graph_replayed_steps, s0.graph_replayed_steps + 8) << "request " << seed;
  }
  const EngineStats none = without->stats();
  EXPECT_EQ(none.graph_captured_steps + none.graph_replayed_steps, 0u);
}

TEST(CudaModelEngine, BestLogitsStepsGiveTheTokensOfWholeRows) {
  // The engine samples greedy and top-k requests from the steps' best logits: the same tokens as
  // from whole rows (step_top_k off), for the same seed.
  DS_REQUIRE_GPU();
  const std::string path = test_model("tiny", TestArch::kQwen35Moe, OutType::kQ8_0);
  auto open = [&](bool top_k) {
    EngineOptions o = cuda_engine_options(512);
    o.step_top_k = top_k;
    return open_engine(path, o);
  };
  auto best = open(true), whole = open(false);
  ASSERT_TRUE(best && whole);
  for (const SamplingParams& p : {SamplingParams{.temperature = 0.0f},
                                  SamplingParams{.temperature = 1.0f, .top_k = 20, .top_p = 0.95f, .seed = 7},
                                  SamplingParams{.temperature = 0.8f, .top_k = 64, .min_p = 0.01f, .seed = 8}}) {
    GenerateRequest r;
    r.prompt = {1, 2, 3, 4, 5, 6};
    r.max_tokens = 48;
    r.ignore_eos = true;
    r.sampling = p;
    auto x = best->generate(r);
    auto y = whole->generate(r);
    ASSERT_TRUE(x.is_ok() && y.is_ok());
    EXPECT_EQ(x->tokens, y->tokens) << "top_k " << p.top_k;
    EXPECT_EQ(x->tokens.size(), 48u);
  }
}

TEST(CudaModelEngine, DefaultKvCacheIsF16OnCuda) {
  // The engine (serve, run) takes the F16 KV cache on CUDA by default, as the benchmarks do: the
  // tensor-core attention kernels read F16 KV, and it is half the memory.
  DS_REQUIRE_GPU();
  auto e = LocalEngine::open(test_model("tiny", TestArch::kQwen35, OutType::kQ8_0), cuda_engine_options(256));
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ((*e)->model().options().kv_dtype, DType::F16);
  GenerateRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  r.max_tokens = 8;
  r.ignore_eos = true;
  auto res = (*e)->generate(r);
  ASSERT_TRUE(res.is_ok()) << res.status().to_string();
  EXPECT_EQ(res->tokens.size(), 8u);
}

#endif  // DS_HAVE_CUDA

}  // namespace
}  // namespace ds
