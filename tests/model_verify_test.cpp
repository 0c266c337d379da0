// Speculative decoding: Model::verify / keep_verified against plain decode steps on the same device
// (every verify row is the logits a decode of that token gives; a state kept at any position decodes
// on as if the rejected tokens never ran), the n-gram drafter, and the engine's speculative greedy
// output against its plain output. The "Cuda" instantiations skip without a CUDA device.
//
// Tolerances (max|verify - decode| / max|decode| over a row): a verify runs its tokens as one segment,
// a decode one at a time; on the CPU both sum in the same order per row (kTolCpu); on CUDA one token
// takes the int8-activation products and fused step kernels, several tokens the plain ones (kTolCuda
// for F32 weights; quantized weights add activation rounding: kTolCudaQuant).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "engine/local_engine.h"
#include "engine/ngram_draft.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "testmodel/test_model_config.h"
#include "testmodel/test_model_writer.h"

#if DS_HAVE_CUDA
#include "ops/cuda/cuda_device.h"
#endif

namespace ds {
namespace {
namespace fs = std::filesystem;
using testmodel::OutType;
using testmodel::TestArch;

constexpr double kTolCpu = 1e-5;
constexpr double kTolCuda = 1e-3;
constexpr double kTolCudaQuant = 0.05;

struct VerifyCase {
  bool cuda;
  TestArch arch;
  OutType type;
};

void PrintTo(const VerifyCase& c, std::ostream* os) {
  *os << (c.cuda ? "cuda " : "cpu ") << testmodel::test_arch_name(c.arch) << " " << testmodel::out_type_name(c.type);
}

std::string case_name(const ::testing::TestParamInfo<VerifyCase>& i) {
  return std::string(testmodel::test_arch_name(i.param.arch)) + "_" + testmodel::out_type_name(i.param.type);
}

class ModelVerify : public ::testing::TestWithParam<VerifyCase> {
 protected:
  void SetUp() override {
    const VerifyCase& c = GetParam();
    if (c.cuda) {
#if DS_HAVE_CUDA
      if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
#else
      GTEST_SKIP() << "no CUDA backend";
#endif
    }
    testmodel::TestModelOverrides ov;
    ov.arch = c.arch;
    ov.type = c.type;
    ov.seed = 5;
    auto cfg = testmodel::test_model_config_make("tiny", ov);
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    path_ = (fs::temp_directory_path() / fmt::format("ds-verify-{}-{}-{}-{}.gguf", ::getpid(), c.cuda,
                                                     testmodel::test_arch_name(c.arch), testmodel::out_type_name(c.type)))
                .string();
    const Status s = testmodel::test_model_write(*cfg, path_, {});
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ModelOptions o;
    o.n_ctx = 512;
    o.prefill_chunk = 64;
    o.n_threads = 2;
    if (c.cuda) o.device = Device{DeviceKind::kCuda, 0};
    auto m = Model::load(path_, o);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    model_ = std::move(m).value();
    n_vocab_ = model_->n_vocab();
  }
  void TearDown() override {
    model_.reset();
    if (!path_.empty()) fs::remove(path_);
  }

  double tolerance() const {
    const VerifyCase& c = GetParam();
    if (!c.cuda) return kTolCpu;
    return c.type == OutType::kF32 ? kTolCuda : kTolCudaQuant;
  }
  std::vector<int32_t> prompt(int64_t n, uint32_t seed = 3) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab_));
    return t;
  }
  // The state's last logits as a vector (the whole row: the test states never ask for best logits).
  std::vector<float> logits(const SequenceState& st) const {
    auto l = model_->logits(st);
    return {l.begin(), l.end()};
  }
  // Row i of the last verify as a whole row where it came whole; else its best logits must agree
  // with `want` on the top entries' ids and values.
  void expect_row_matches(int64_t i, const std::vector<float>& want, const std::string& what) const {
    const Model::VerifyRow row = model_->verify_row(i);
    const float scale = *std::max_element(want.begin(), want.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    if (row.top_k != nullptr) {
      ASSERT_GE(row.top_k->n, 1) << what;
      EXPECT_EQ(row.top_k->ids[0], argmax(want)) << what;
      for (int j = 0; j < std::min(row.top_k->n, 8); ++j) {
        const int32_t id = row.top_k->ids[j];
        EXPECT_LE(std::fabs(row.top_k->values[j] - want[static_cast<size_t>(id)]), tolerance() * std::fabs(scale))
            << what << " best " << j << " (id " << id << ")";
      }
      return;
    }
    ASSERT_EQ(row.logits.size(), want.size()) << what;
    double worst = 0;
    for (size_t k = 0; k < want.size(); ++k) worst = std::max<double>(worst, std::fabs(row.logits[k] - want[k]));
    EXPECT_LE(worst / std::fabs(scale), tolerance()) << what;
    EXPECT_EQ(argmax(row.logits), argmax(want)) << what;
  }
  static double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0, scale = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      worst = std::max<double>(worst, std::fabs(a[k] - b[k]));
      scale = std::max<double>(scale, std::fabs(b[k]));
    }
    return worst / scale;
  }

  std::string path_;
  std::unique_ptr<Model> model_;
  int64_t n_vocab_ = 0;
};

// Plain greedy decoding: tokens g[0..n) and the logits after each (logits[i]: after g[i]).
struct Plain {
  std::vector<int32_t> g;
  std::vector<std::vector<float>> logits;
};

TEST_P(ModelVerify, RowsAreDecodeStepsAndKeepingRewindsTheState) {
  const auto p = prompt(21);
  Plain plain;
  {
    auto a = std::move(model_->new_state()).value();
    ASSERT_TRUE(model_->prefill(*a, p).is_ok());
    plain.g.push_back(argmax(model_->logits(*a)));
    for (int i = 0; i < 12; ++i) {
      ASSERT_TRUE(model_->decode(*a, plain.g.back()).is_ok());
      plain.logits.push_back(logits(*a));
      plain.g.push_back(argmax(plain.logits.back()));
    }
  }
  const auto& g = plain.g;
  const int32_t V = static_cast<int32_t>(model_->n_vocab());
  auto b = std::move(model_->new_state()).value();
  ASSERT_TRUE(model_->prefill(*b, p).is_ok());
  const int64_t P = b->pos();

  // A draft right for 3 tokens, then wrong: rows 0..3 are the decode steps of g0..g3; keep 4.
  std::vector<int32_t> t = {g[0], g[1], g[2], g[3], (g[4] + 1) % V, (g[4] + 7) % V};
  ASSERT_TRUE(model_->verify(*b, t).is_ok());
  EXPECT_EQ(b->pos(), P + 6);
  for (int64_t i = 0; i < 4; ++i) expect_row_matches(i, plain.logits[static_cast<size_t>(i)], fmt::format("row {}", i));
  ASSERT_TRUE(model_->keep_verified(*b, 4).is_ok());
  EXPECT_EQ(b->pos(), P + 4);
  // Decoding on from the kept state gives the plain steps: the rejected tokens left no trace.
  ASSERT_TRUE(model_->decode(*b, g[4]).is_ok());
  EXPECT_LE(rel_diff(logits(*b), plain.logits[4]), tolerance()) << "decode after keeping 4";
  EXPECT_EQ(argmax(model_->logits(*b)), g[5]);

  // A draft wholly right, its rows asked for whole: keep all (nothing to rebuild), then decode on.
  t = {g[5], g[6], g[7]};
  ASSERT_TRUE(model_->verify(*b, t, /*whole_rows=*/true).is_ok());
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(model_->verify_row(i).top_k, nullptr) << "row " << i << " asked for whole";
    expect_row_matches(i, plain.logits[static_cast<size_t>(5 + i)], fmt::format("row {} of the second", i));
  }
  ASSERT_TRUE(model_->keep_verified(*b, 3).is_ok());
  ASSERT_TRUE(model_->decode(*b, g[8]).is_ok());
  EXPECT_LE(rel_diff(logits(*b), plain.logits[8]), tolerance()) << "decode after keeping all";

  // A draft wrong from its first token: keep only the token it followed.
  t = {g[9], (g[10] + 3) % V, (g[10] + 5) % V, (g[10] + 9) % V};
  ASSERT_TRUE(model_->verify(*b, t).is_ok());
  expect_row_matches(0, plain.logits[9], "row 0 of the third");
  ASSERT_TRUE(model_->keep_verified(*b, 1).is_ok());
  ASSERT_TRUE(model_->decode(*b, g[10]).is_ok());
  EXPECT_LE(rel_diff(logits(*b), plain.logits[10]), tolerance()) << "decode after keeping 1";
  EXPECT_EQ(b->pos(), P + 11);
}

TEST_P(ModelVerify, VerifyAcrossAKvChunkBoundaryKeepsBeforeIt) {
  // 62 prompt tokens: the verify crosses into the second 64-token KV chunk, and keeping 1 token drops
  // that chunk again.
  const auto p = prompt(62, 9);
  auto a = std::move(model_->new_state()).value();
  auto b = std::move(model_->new_state()).value();
  ASSERT_TRUE(model_->prefill(*a, p).is_ok());
  ASSERT_TRUE(model_->prefill(*b, p).is_ok());
  const int32_t g0 = argmax(model_->logits(*a));
  ASSERT_TRUE(model_->decode(*a, g0).is_ok());
  const int32_t g1 = argmax(model_->logits(*a));
  ASSERT_TRUE(model_->decode(*a, g1).is_ok());
  const std::vector<int32_t> t = {g0, (g1 + 1) % static_cast<int32_t>(model_->n_vocab()), 3, 4, 5, 6};
  ASSERT_TRUE(model_->verify(*b, t).is_ok());
  EXPECT_EQ(b->n_kv_chunks(), 2);
  ASSERT_TRUE(model_->keep_verified(*b, 1).is_ok());
  EXPECT_EQ(b->n_kv_chunks(), 1);
  ASSERT_TRUE(model_->decode(*b, g1).is_ok());
  EXPECT_LE(rel_diff(logits(*b), logits(*a)), tolerance());
}

TEST_P(ModelVerify, BadCallsAreClearErrors) {
  auto st = std::move(model_->new_state()).value();
  ASSERT_TRUE(model_->prefill(*st, prompt(5)).is_ok());
  const std::vector<int32_t> too_many(static_cast<size_t>(model_->max_verify_tokens() + 1), 1);
  EXPECT_EQ(model_->verify(*st, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->verify(*st, too_many).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> out_of_vocab = {1, static_cast<int32_t>(model_->n_vocab())};
  EXPECT_EQ(model_->verify(*st, out_of_vocab).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->keep_verified(*st, 1).code(), StatusCode::kInvalidArgument);  // no verify
  const std::vector<int32_t> t = {1, 2, 3};
  ASSERT_TRUE(model_->verify(*st, t).is_ok());
  EXPECT_EQ(model_->keep_verified(*st, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->keep_verified(*st, 4).code(), StatusCode::kInvalidArgument);
  auto other = std::move(model_->new_state()).value();
  EXPECT_EQ(model_->keep_verified(*other, 1).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(model_->keep_verified(*st, 2).is_ok());
  EXPECT_EQ(model_->keep_verified(*st, 1).code(), StatusCode::kInvalidArgument);  // kept already
  ASSERT_TRUE(model_->verify(*st, t).is_ok());
  ASSERT_TRUE(model_->decode(*st, 4).is_ok());
  EXPECT_EQ(model_->keep_verified(*st, 1).code(), StatusCode::kInvalidArgument);  // stepped since
}

TEST_P(ModelVerify, EngineSpeculativeOutputIsThePlainOutput) {
  // Prompts that repeat what the model said: the n-gram drafts are partly right, partly wrong. Greedy
  // and sampled requests (same seed) give the same tokens with drafts as without (on CUDA up to float
  // order, below: greedy ones but at near-ties). The sampled ones run
  // at a low temperature, where the tiny models' flat logits still follow their loops (so drafts are
  // taken), through the sampler's draws all the same. A sampler with penalties takes whole rows.
  const VerifyCase& c = GetParam();
  auto open = [&](const std::string& draft) {
    EngineOptions o;
    o.n_ctx = 512;
    o.n_threads = 2;
    o.cache_ram_bytes = 0;
    o.device = c.cuda ? "cuda:0" : "cpu";
    o.draft = draft;
    o.draft_max = 5;
    auto e = LocalEngine::open(path_, o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e.is_ok() ? std::move(e).value() : nullptr;
  };
  model_.reset();  // the engines load their own
  auto plain = open("none"), spec = open("ngram");
  // (logit of the plain pick - logit of `other`) / largest |logit| at token p of the plain output
  // `out` of prompt q, decoded as the plain engine does (prefill, then one token a step).
  std::unique_ptr<Model> replay;
  auto plain_margin = [&](const std::vector<int32_t>& q, const std::vector<int32_t>& out, size_t p,
                          int32_t other) -> double {
    if (!replay) {
      ModelOptions o;
      o.n_ctx = 512;
      o.n_threads = 2;
      o.device = Device{DeviceKind::kCuda, 0};
      auto m = Model::load(path_, o);
      EXPECT_TRUE(m.is_ok()) << m.status().to_string();
      if (!m.is_ok()) return INFINITY;
      replay = std::move(m).value();
    }
    auto st = std::move(replay->new_state()).value();
    EXPECT_TRUE(replay->prefill(*st, q).is_ok());
    for (size_t i = 0; i < p; ++i) EXPECT_TRUE(replay->decode(*st, out[i]).is_ok());
    const auto l = replay->logits(*st);
    float scale = 0.0f;
    for (float v : l) scale = std::max(scale, std::fabs(v));
    return (l[static_cast<size_t>(out[p])] - l[static_cast<size_t>(other)]) / scale;
  };
  ASSERT_TRUE(plain && spec);
  GenerateRequest r;
  r.ignore_eos = true;
  r.max_tokens = 40;
  r.prompt = prompt(12, 21);
  auto first = plain->generate(r);
  ASSERT_TRUE(first.is_ok());
  const SamplingParams samplings[] = {
      SamplingParams{.temperature = 0.0f},
      SamplingParams{.temperature = 0.05f, .top_k = 20, .top_p = 0.95f, .seed = 7},
      SamplingParams{.temperature = 0.05f, .repetition_penalty = 1.01f, .seed = 3},
  };
  int64_t accepted_all = 0, drafted_all = 0;
  for (const SamplingParams& sp : samplings) {
    int64_t accepted = 0, drafted = 0, verifies = 0;
    for (int k = 0; k < 3; ++k) {
      // The prompt, what the model said, the prompt again (k = 1: twice over).
      std::vector<int32_t> q = r.prompt;
      for (int rep = 0; rep <= (k == 1); ++rep) {
        q.insert(q.end(), first->tokens.begin(), first->tokens.begin() + 20 + 5 * k);
        q.insert(q.end(), r.prompt.begin(), r.prompt.end());
      }
      GenerateRequest rq = r;
      rq.prompt = q;
      rq.max_tokens = 33 + k;
      rq.sampling = sp;
      auto x = plain->generate(rq);
      auto y = spec->generate(rq);
      ASSERT_TRUE(x.is_ok() && y.is_ok());
      if (!c.cuda) {
        EXPECT_EQ(y->tokens, x->tokens) << "prompt " << k << ", temperature " << sp.temperature;
      } else if (sp.temperature == 0.0f) {
        // Greedy on CUDA: the same tokens, or they part at a near-tie, which float order decides: a
        // verify row and the decode step take the same int8 activation codes and float arithmetic per
        // block, summed in another order (5-8 token products run on tensor cores), so the two picks
        // must be within twice kTolCuda (the F32 models' float-order bound) of the largest logit in
        // the plain decode's logits there (replayed by a model of its own, whose prefill may sum in
        // another order again: the plain pick may come out second by as little).
        ASSERT_EQ(y->tokens.size(), x->tokens.size());
        size_t p = 0;
        while (p < x->tokens.size() && x->tokens[p] == y->tokens[p]) ++p;
        if (p < x->tokens.size()) {
          const double margin = plain_margin(q, x->tokens, p, y->tokens[p]);
          std::printf("[verify] cuda greedy, prompt %d: parts from the plain output at token %zu of %zu, where the "
                      "plain decode's pick and the other are %.3g of the largest logit apart\n",
                      k, p, x->tokens.size(), margin);
          EXPECT_LE(std::fabs(margin), 2 * kTolCuda) << "prompt " << k << ": parts at token " << p << " with no near-tie";
        }
      } else {
        // On CUDA a verify row equals the decode step's logits up to float order (kTolCuda /
        // kTolCudaQuant, the tests above), which moves a sampled draw where it falls between two
        // tokens: the same distribution, not always the same tokens. The first token comes from
        // the same prefill in both.
        ASSERT_EQ(y->tokens.size(), x->tokens.size());
        EXPECT_EQ(y->tokens[0], x->tokens[0]);
        size_t same = 0;
        while (same < x->tokens.size() && x->tokens[same] == y->tokens[same]) ++same;
        std::printf("[verify] cuda, temperature %.2f, prompt %d: the first %zu of %zu tokens as without drafts\n",
                    sp.temperature, k, same, x->tokens.size());
      }
      EXPECT_EQ(x->verify_steps, 0);
      verifies += y->verify_steps;
      EXPECT_LE(y->accepted_tokens, y->draft_tokens);
      accepted += y->accepted_tokens;
      drafted += y->draft_tokens;
    }
    std::printf("[verify] engine, temperature %.2f: %lld of %lld draft tokens accepted in %lld verify steps\n",
                sp.temperature, static_cast<long long>(accepted), static_cast<long long>(drafted),
                static_cast<long long>(verifies));
    EXPECT_GT(verifies, 0) << "temperature " << sp.temperature;
    accepted_all += accepted;
    drafted_all += drafted;
  }
  // The CPU models repeat their prompts' loops (a fixed outcome of their fixed weights): drafts are
  // taken and refused there, so the test covers both. Other models may not repeat.
  if (!c.cuda) {
    EXPECT_GT(accepted_all, 0);
    EXPECT_LT(accepted_all, drafted_all);
  }
  EXPECT_EQ(spec->stats().draft_tokens > 0, true);
}

INSTANTIATE_TEST_SUITE_P(Cpu, ModelVerify,
                         ::testing::Values(VerifyCase{false, TestArch::kQwen35, OutType::kF32},
                                           VerifyCase{false, TestArch::kQwen35Moe, OutType::kF32},
                                           VerifyCase{false, TestArch::kQwen35, OutType::kQ8_0}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Cuda, ModelVerify,
                         ::testing::Values(VerifyCase{true, TestArch::kQwen35, OutType::kF32},
                                           VerifyCase{true, TestArch::kQwen35, OutType::kQ8_0},
                                           VerifyCase{true, TestArch::kQwen35, OutType::kQ4_K_M},
                                           VerifyCase{true, TestArch::kQwen35Moe, OutType::kQ4_K_M}),
                         case_name);

// ---- the n-gram drafter ----

TEST(NgramDraft, ProposesWhatFollowedTheLatestLongestMatch) {
  NgramDraft d(NgramDraftOptions{.min_ngram = 2, .max_ngram = 3});
  d.reset(std::vector<int32_t>{1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 1, 2});
  // Suffix [1, 2] (3-gram [6, 1, 2] occurs nowhere before): it occurred at 0, followed by 3 4 5 9.
  EXPECT_EQ(d.propose(4), (std::vector<int32_t>{3, 4, 5, 9}));
  d.append(3);
  // Suffix [1, 2, 3] occurred at 0 (the 3-gram wins over the later [2, 3] at 6).
  EXPECT_EQ(d.propose(2), (std::vector<int32_t>{4, 5}));
  d.append(7);
  // [2, 3, 7] occurred at 6, followed by 8 6 1 2 3 7.
  EXPECT_EQ(d.propose(6), (std::vector<int32_t>{8, 6, 1, 2, 3, 7}));
  EXPECT_TRUE(d.propose(0).empty());
}

TEST(NgramDraft, NothingWithoutAnEarlierOccurrence) {
  NgramDraft d(NgramDraftOptions{});
  d.reset(std::vector<int32_t>{1, 2, 3, 4, 5});
  EXPECT_TRUE(d.propose(5).empty());
  d.append(6);
  EXPECT_TRUE(d.propose(5).empty());
  NgramDraft e(NgramDraftOptions{});
  e.reset({});
  EXPECT_TRUE(e.propose(3).empty());
  e.append(4);
  EXPECT_TRUE(e.propose(3).empty());
}

TEST(NgramDraft, ALoopContinuesPastTheContextEnd) {
  // 5 6 7 5 6 7 5 6: the suffix [5, 6] last occurred 3 tokens back; the draft repeats the loop.
  NgramDraft d(NgramDraftOptions{.min_ngram = 2, .max_ngram = 2});
  d.reset(std::vector<int32_t>{5, 6, 7, 5, 6, 7, 5, 6});
  EXPECT_EQ(d.propose(7), (std::vector<int32_t>{7, 5, 6, 7, 5, 6, 7}));
  // A run of one token: the suffix [4, 4] occurred one back.
  d.reset(std::vector<int32_t>{1, 4, 4, 4});
  EXPECT_EQ(d.propose(3), (std::vector<int32_t>{4, 4, 4}));
}

TEST(EngineDraft, RejectsUnknownKindsAndLengths) {
  EngineOptions o;
  EXPECT_TRUE(engine_check_draft(o).is_ok());
  o.draft = "ngram";
  EXPECT_TRUE(engine_check_draft(o).is_ok());
  o.draft = "dflash";
  EXPECT_EQ(engine_check_draft(o).code(), StatusCode::kInvalidArgument);
  o.draft = "ngram";
  o.draft_max = 0;
  EXPECT_EQ(engine_check_draft(o).code(), StatusCode::kInvalidArgument);
  o.draft_max = static_cast<int32_t>(kMaxVerifyTokens);
  EXPECT_EQ(engine_check_draft(o).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ds
