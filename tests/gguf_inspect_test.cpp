// `deltaserve inspect` tests: run the real binary on a written file (text and --json) and on corrupt
// and missing files, checking output and exit codes. Expected values come from what the test wrote.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "gguf/gguf_writer.h"

namespace ds {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class GgufInspect : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("ds_inspect_{}_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                       ::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  RunResult run(const std::string& args) {
    const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    const std::string cmd = fmt::format("'{}' inspect {} >'{}' 2>'{}'", DS_EXE, args, out, err);
    const int rc = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  std::string write_model() {
    GgufWriter w;
    w.set_string("general.architecture", "qwen35");
    w.set_u32("qwen35.block_count", 2);
    w.set_f32("qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    w.set_array_i32("qwen35.rope.dimension_sections", {11, 11, 10, 0});
    std::vector<std::string> tokens;
    for (int i = 0; i < 1000; ++i) tokens.push_back(fmt::format("tok{}", i));
    w.set_array_string("tokenizer.ggml.tokens", tokens);
    w.set_string("tokenizer.chat_template", std::string(5000, 'x') + "END_OF_TEMPLATE");
    w.add_tensor("token_embd.weight", DType::Q8_0, {64, 10}, {});
    w.add_tensor("blk.0.attn_norm.weight", DType::F32, {64}, {});
    w.add_tensor("blk.1.attn_norm.weight", DType::F32, {64}, {});
    const std::string path = (dir_ / "model.gguf").string();
    EXPECT_TRUE(w.write(path).is_ok());
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(GgufInspect, Json) {
  const std::string path = write_model();
  RunResult r = run(fmt::format("'{}' --json", path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["n_kv"], 6);
  EXPECT_EQ(j["n_tensors"], 3);
  ASSERT_EQ(j["metadata"].size(), 6u);
  EXPECT_EQ(j["metadata"][0]["key"], "general.architecture");
  EXPECT_EQ(j["metadata"][0]["type"], "string");
  EXPECT_EQ(j["metadata"][0]["value"], "qwen35");
  EXPECT_EQ(j["metadata"][1]["value"], 2);
  EXPECT_EQ(j["metadata"][3]["type"], "array[i32]");
  EXPECT_EQ(j["metadata"][3]["value"], "[11, 11, 10, 0]");
  EXPECT_EQ(j["metadata"][4]["n_elems"], 1000);
  EXPECT_NE(j["metadata"][4]["value"].get<std::string>().find("1000 strings"), std::string::npos);
  const auto& tmpl = j["metadata"][5];
  EXPECT_EQ(tmpl["length"], 5015);
  EXPECT_EQ(tmpl["truncated"], true);
  EXPECT_LT(tmpl["value"].get<std::string>().size(), 1000u);
  ASSERT_EQ(j["tensors"].size(), 3u);
  EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(j["tensors"][0]["type"], "q8_0");
  EXPECT_EQ(j["tensors"][0]["shape"], nlohmann::json::array({64, 10}));
  EXPECT_EQ(j["tensors"][0]["n_bytes"], 2 * 34 * 10);
  EXPECT_EQ(j["tensors"][0]["offset"].get<uint64_t>() % 32, 0u);
  // 680 bytes padded to 704: the second tensor follows the first's padding.
  EXPECT_EQ(j["tensors"][1]["offset"].get<uint64_t>(), j["tensors"][0]["offset"].get<uint64_t>() + 704);
  EXPECT_EQ(j["totals"]["f32"]["n_tensors"], 2);
  EXPECT_EQ(j["totals"]["f32"]["n_bytes"], 2 * 64 * 4);
  EXPECT_EQ(j["totals"]["q8_0"]["n_bytes"], 680);
  EXPECT_EQ(j["total_bytes"], 680 + 512);
}

TEST_F(GgufInspect, Text) {
  const std::string path = write_model();
  RunResult r = run(fmt::format("'{}'", path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* want : {"gguf version: 3", "alignment: 32", "qwen35.block_count", "u32",
                           "[1000 strings: \"tok0\", \"tok1\", ... ]", "blk.1.attn_norm.weight",
                           "{64, 10}", "q8_0", "(5015 bytes)",
                           "3 tensors            1192 bytes  (1.16 KiB)"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << r.out;
  }
  EXPECT_EQ(r.out.find("END_OF_TEMPLATE"), std::string::npos) << "chat template not truncated";
}

TEST_F(GgufInspect, CorruptFileFails) {
  const std::string path = write_model();
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("GGUX", 4);
  }
  RunResult r = run(fmt::format("'{}'", path));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("error: corrupt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bad magic"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
}

TEST_F(GgufInspect, TruncatedFileFails) {
  const std::string path = write_model();
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  RunResult r = run(fmt::format("'{}' --json", path));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("truncated tensor data"), std::string::npos) << r.err;
}

TEST_F(GgufInspect, MissingFileFails) {
  RunResult r = run(fmt::format("'{}'", (dir_ / "absent.gguf").string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not found"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ds
