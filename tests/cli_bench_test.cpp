// `deltaserve bench` run as a process on the CPU: the --json document (every figure present and
// plausible, CPU defaults recorded) on a generated tiny model, and clear errors for bad --device,
// --kv-type and --prefill-chunk values. The CUDA run of the same command is in cuda_limits_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#if DS_HAVE_CUDA
#include "ops/cuda/cuda_device.h"
#endif

namespace ds {
namespace {

namespace fs = std::filesystem;

using test::RunResult;
using test::run_exe;
struct TempDir : test::CliTempDir {
  explicit TempDir(const std::string& tag) : test::CliTempDir("bench_" + tag) {}
};

std::string make_tiny_model(const TempDir& dir) {
  const std::string path = dir.path() + "/tiny.gguf";
  const RunResult r = run_exe("make-test-model " + path + " --preset tiny --quiet", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return path;
}

TEST(BenchCli, JsonHasEveryFigureOnTheCpu) {
  TempDir dir("json");
  const std::string model = make_tiny_model(dir);
  const std::string json_path = dir.path() + "/bench.json";
  const RunResult r =
      run_exe("bench " + model + " --pp 16,40 --tg 4 --depth 0,20 --reps 1 -t 2 --json " + json_path, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The CPU table keeps its form.
  EXPECT_NE(r.output.find("measured read bandwidth:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GFLOP/s"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("peak device memory"), std::string::npos) << r.output;

  std::ifstream in(json_path);
  ASSERT_TRUE(in.good()) << "no " << json_path << "\n" << r.output;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "bench.json does not parse";
  EXPECT_EQ(j.value("complete", false), true) << j.dump(2);
  EXPECT_EQ(j.value("device", ""), "cpu");
  EXPECT_EQ(j.value("kv_type", ""), "f32");      // the CPU default
  EXPECT_EQ(j.value("prefill_chunk", 0), 256);   // --prefill-chunk 0 (auto) on the CPU
  EXPECT_EQ(j.value("threads", 0), 2);
  EXPECT_EQ(j.value("model", ""), model);
  EXPECT_GE(j.value("n_ctx", 0), 40);
  EXPECT_GT(j.value("weight_bytes_per_token", 0.0), 0.0);
  EXPECT_GT(j.value("params_per_token", 0.0), 0.0);
  ASSERT_TRUE(j.contains("limits")) << j.dump(2);
  EXPECT_GT(j["limits"].value("read_bandwidth_gbps", 0.0), 0.0);
  EXPECT_GT(j["limits"].value("decode_bound_tok_s", 0.0), 0.0);
  EXPECT_TRUE(j["limits"]["bf16_peak_tflops"].is_null());
  ASSERT_TRUE(j.contains("memory"));
  EXPECT_GT(j["memory"].value("host_alloc_peak_bytes", int64_t{0}), 0);
  EXPECT_EQ(j["memory"].value("allocator_peak_reserved_bytes", int64_t{-1}), 0);

  ASSERT_TRUE(j["tests"].is_array());
  ASSERT_EQ(j["tests"].size(), 4u) << j["tests"].dump(2);
  const char* names[] = {"pp16", "pp40", "tg4", "tg4"};
  const char* kinds[] = {"prefill", "prefill", "decode", "decode"};
  const int64_t depths[] = {0, 0, 0, 20};
  for (size_t i = 0; i < 4; ++i) {
    const auto& t = j["tests"][i];
    SCOPED_TRACE(t.dump());
    EXPECT_EQ(t.value("test", ""), names[i]);
    EXPECT_EQ(t.value("kind", ""), kinds[i]);
    EXPECT_EQ(t.value("depth", int64_t{-1}), depths[i]);
    EXPECT_GT(t.value("tok_s", 0.0), 0.0);
    ASSERT_TRUE(t["rep_tok_s"].is_array());
    EXPECT_EQ(t["rep_tok_s"].size(), 1u);
    if (i < 2) {
      EXPECT_TRUE(t["fraction_of_limit"].is_null());  // no measured FLOP peak on the CPU
      EXPECT_GT(t.value("tflops", 0.0), 0.0);
    } else {
      EXPECT_EQ(t.value("limit", ""), "read_bandwidth");
      EXPECT_GT(t.value("fraction_of_limit", 0.0), 0.0);
    }
  }
  EXPECT_FALSE(fs::exists(json_path + ".tmp"));
}

TEST(BenchCli, ServedRowsDecodeThroughTheEngine) {
  // --served: one more row per depth, the decode through the engine with the server's default sampling
  // (here with a q8_0 and a q4_0 KV cache, which the report names).
  TempDir dir("served");
  const std::string model = make_tiny_model(dir);
  const std::string json_path = dir.path() + "/bench.json";
  for (const std::string kv : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(kv);
    const RunResult r = run_exe("bench " + model + " --pp 8 --tg 6 --depth 0,12 --reps 2 -t 2 --served --kv-type " +
                                    kv + " --json " + json_path,
                                dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("tg6-srv"), std::string::npos) << r.output;
    std::ifstream in(json_path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded());
    EXPECT_EQ(j.value("complete", false), true) << j.dump(2);
    EXPECT_EQ(j.value("kv_type", ""), kv);
    EXPECT_NE(r.output.find("threads, kv " + kv), std::string::npos) << r.output;  // the model line says it too
    ASSERT_EQ(j["tests"].size(), 5u) << j["tests"].dump(2);
    for (size_t i = 3; i < 5; ++i) {
      const auto& t = j["tests"][i];
      SCOPED_TRACE(t.dump());
      EXPECT_EQ(t.value("test", ""), "tg6-served");
      EXPECT_EQ(t.value("kind", ""), "decode_served");
      EXPECT_EQ(t.value("depth", int64_t{-1}), i == 3 ? 0 : 12);
      EXPECT_GT(t.value("tok_s", 0.0), 0.0);
      EXPECT_EQ(t["rep_tok_s"].size(), 2u);
      EXPECT_GT(t.value("fraction_of_limit", 0.0), 0.0);
    }
  }
}

TEST(BenchCli, RejectsBadArgumentsClearly) {
  TempDir dir("args");
  const std::string model = make_tiny_model(dir);
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"--device gpu0", "--device 'gpu0': expected cpu or cuda:N"},
      {"--device cuda:", "--device 'cuda:': expected cpu or cuda:N"},
      {"--device cuda:x1", "--device 'cuda:x1': expected cpu or cuda:N"},
      {"--device cuda:-1", "--device 'cuda:-1': expected cpu or cuda:N"},
      {"--kv-type q5_0", "--kv-type 'q5_0': expected f16, f32, q8_0 or q4_0"},
      {"--prefill-chunk -4", "--prefill-chunk -4: must be 0 (auto) or positive"},
      {"--reps 0", "--reps 0: must be at least 1"},
      {"--pp 0", "--pp 0: prompt lengths must be at least 1"},
      {"--ttft 16 --json x.json", "--json is not supported with --ttft"},
      {"--skip-kernels norm", "--skip-kernels / --only-kernels: only with --device cuda:N"},
      {"--step-times", "--step-times: only with --device cuda:N"},
  };
  for (const Case& c : cases) {
    const RunResult r = run_exe("bench " + model + " " + c.args, dir.path());
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(BenchCli, CudaDeviceWithoutOneIsAClearError) {
#if DS_HAVE_CUDA
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present (CudaLimits.BenchJsonOnTinyModel runs it)";
  const std::string expected = "--device cuda:0: 0 CUDA device(s) visible";
#else
  const std::string expected = "--device cuda:0: this build has no CUDA backend";
#endif
  TempDir dir("nocuda");
  const std::string model = make_tiny_model(dir);
  const RunResult r = run_exe("bench " + model + " --device cuda:0 --pp 8 --tg 2 --reps 1", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ds
