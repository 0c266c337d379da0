// Golden test through the converter: every Hugging Face fixture in tests/fixtures/golden (made by tools/golden with
// transformers) is converted with `deltaserve convert`, run on the CPU model, and its logits compared
// with transformers' float32 logits: prefill in one call, prefill in uneven segments, token by token
// (the recurrent DeltaNet form), and 8 greedy decode steps. Quantized conversions have looser, stated
// bounds; F32 must agree to max|diff| / max|logit| <= 1e-4 with identical greedy tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "golden_fixture.h"
#include "model/model.h"

namespace ds {
namespace {
namespace fs = std::filesystem;

using Fixture = test::GoldenFixture;
Fixture load_fixture(const fs::path& dir) { return test::load_golden_fixture(dir); }
std::vector<fs::path> fixture_dirs() { return test::golden_fixture_dirs(); }
std::string convert(const Fixture& f, const std::string& type) { return test::convert_golden_fixture(f, type, "ds-golden"); }

int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// max|a - b| / max|b| over one row.
double rel_err(std::span<const float> got, const float* ref, int64_t n) {
  double diff = 0, mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - ref[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(ref[i])));
  }
  return diff / std::max(mag, 1e-12);
}


struct Case {
  std::string type;
  double bound;          // on max|diff| / max|logit| over the rows checked (F32), else unused
  bool greedy_identical; // require the 8 greedy tokens to match
  double rms_bound = 0;  // quantized: RMS(diff) / RMS(logits) over all rows checked
  double top1_min = 0;   // quantized: fraction of rows whose argmax equals the reference argmax
};

struct Agreement {
  double sq_diff = 0, sq_ref = 0;
  int64_t rows = 0, top1 = 0;
  void add(std::span<const float> got, const float* ref, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      sq_diff += (got[i] - ref[i]) * static_cast<double>(got[i] - ref[i]);
      sq_ref += ref[i] * static_cast<double>(ref[i]);
    }
    ++rows;
    top1 += argmax(got) == static_cast<int32_t>(std::max_element(ref, ref + n) - ref);
  }
  double rms() const { return std::sqrt(sq_diff / std::max(sq_ref, 1e-30)); }
  double top1_rate() const { return rows ? static_cast<double>(top1) / rows : 0; }
};

void check_fixture(const Fixture& f, const Case& c) {
  SCOPED_TRACE(f.name + " " + c.type);
  const std::string path = convert(f, c.type);
  ModelOptions mo;
  mo.n_threads = 2;
  mo.n_ctx = 512;
  mo.prefill_chunk = 64;
  auto model = Model::load(path, mo);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  Model& m = **model;
  ASSERT_EQ(m.n_vocab(), f.vocab);
  const int64_t n = static_cast<int64_t>(f.prompt.size());
  std::span<const int32_t> prompt(f.prompt);

  // 1. Prefill in one call, then greedy decode, comparing rows n-1 .. n+7.
  double worst = 0;
  Agreement agree;
  {
    auto st = m.new_state();
    ASSERT_TRUE(st.is_ok());
    ASSERT_TRUE(m.prefill(**st, prompt).is_ok());
    worst = std::max(worst, rel_err(m.logits(**st), f.row(n - 1), f.vocab));
    agree.add(m.logits(**st), f.row(n - 1), f.vocab);
    for (size_t i = 0; i < f.greedy.size(); ++i) {
      auto lg = m.logits(**st);
      if (i > 0) worst = std::max(worst, rel_err(lg, f.row(n - 1 + static_cast<int64_t>(i)), f.vocab));
      if (c.greedy_identical) {
        EXPECT_EQ(argmax(lg), f.greedy[i]) << "greedy step " << i;
      }
      ASSERT_TRUE(m.decode(**st, f.greedy[i]).is_ok());  // teacher-forced on the reference tokens
    }
  }
  // 2. Uneven segments crossing chunk boundaries, comparing each segment's last row.
  {
    auto st = m.new_state();
    int64_t pos = 0;
    for (int64_t len : {37, 64, 100, 1, 98}) {
      len = std::min(len, n - pos);
      if (len <= 0) break;
      ASSERT_TRUE(m.prefill(**st, prompt.subspan(pos, len)).is_ok());
      pos += len;
      worst = std::max(worst, rel_err(m.logits(**st), f.row(pos - 1), f.vocab));
    }
  }
  // 3. Token by token (recurrent DeltaNet form), every row.
  {
    auto st = m.new_state();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(m.decode(**st, f.prompt[i]).is_ok());
      worst = std::max(worst, rel_err(m.logits(**st), f.row(i), f.vocab));
      agree.add(m.logits(**st), f.row(i), f.vocab);
    }
  }
  std::printf("[golden] %-10s %-7s max|diff|/max|logit| = %.3g, rms %.3g, top-1 %.3f\n", f.name.c_str(),
              c.type.c_str(), worst, agree.rms(), agree.top1_rate());
  if (c.rms_bound != 0 && f.name.find("256") != std::string::npos) {
    // (Only the 256-wide fixtures: the 64-wide ones amplify the int8 activation rounding of the fast
    // path as much as the weight rounding, so the comparison would not discriminate there.)
    // The same quantized file through the scalar reference ops (dequantize, float dot): the fast
    // path (integer dot products on quantized activations) must agree far more closely than the
    // quantized model agrees with the float reference.
    ModelOptions ro = mo;
    ro.reference_ops = true;
    auto ref_model = Model::load(path, ro);
    ASSERT_TRUE(ref_model.is_ok()) << ref_model.status().to_string();
    auto a = m.new_state();
    auto b = (*ref_model)->new_state();
    Agreement fast_vs_ref;
    const int64_t n_check = std::min<int64_t>(n, 96);
    ASSERT_TRUE(m.prefill(**a, prompt.subspan(0, n_check)).is_ok());
    ASSERT_TRUE((*ref_model)->prefill(**b, prompt.subspan(0, n_check)).is_ok());
    auto lb = (*ref_model)->logits(**b);
    fast_vs_ref.add(m.logits(**a), lb.data(), f.vocab);
    std::printf("[golden] %-10s %-7s fast vs reference ops: rms %.3g\n", f.name.c_str(), c.type.c_str(), fast_vs_ref.rms());
    EXPECT_LE(fast_vs_ref.rms(), c.rms_bound / 4);
  }
  if (c.rms_bound == 0) {
    EXPECT_LE(worst, c.bound);
  } else {
    EXPECT_LE(agree.rms(), c.rms_bound);
    EXPECT_GE(agree.top1_rate(), c.top1_min);
  }
  fs::remove(path);
}

TEST(ConvertedGolden, F32MatchesTransformers) {
  const auto dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 4u);
  for (const auto& d : dirs) check_fixture(load_fixture(d), {"f32", 1e-4, true});
}

TEST(ConvertedGolden, QuantizedConversionsStayWithinBounds) {
  for (const auto& d : fixture_dirs()) {
    const Fixture f = load_fixture(d);
    // Bounds measured on these fixtures (worst of the four): the random models amplify weight
    // rounding ~50x over 300 tokens of DeltaNet recurrence (transformers' own float32 is 2.7e-4 from
    // float64), so the bounds are loose; the fast-vs-reference check inside check_fixture is tight.
    //                 type      max   greedy  rms   top-1
    check_fixture(f, {"bf16", 0, false, 0.30, 0.70});   // measured rms <= 0.21, top-1 >= 0.79
    check_fixture(f, {"q8_0", 0, false, 0.60, 0.40});   // measured rms <= 0.43, top-1 >= 0.48
    if (f.name.find("256") != std::string::npos) {
      check_fixture(f, {"q4_k_m", 0, false, 0.45, 0.55});  // measured rms <= 0.32, top-1 >= 0.63
    }
  }
}

}  // namespace
}  // namespace ds
