// End-to-end tests of `deltaserve make-test-model` (run as a process) and of the demo model cache.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gguf/gguf.h"
#include "cli_test_util.h"
#include "testmodel/demo.h"

namespace ds::testmodel {
namespace {

namespace fs = std::filesystem;

using test::RunResult;
using test::run_exe;
struct TempDir : test::CliTempDir {
  explicit TempDir(const std::string& tag) : test::CliTempDir("testmodel_" + tag) {}
};

TEST(TestModelCli, WritesALoadableFile) {
  TempDir dir("cli_ok");
  const std::string out = dir.path() + "/m.gguf";
  RunResult r = run_exe("make-test-model " + out + " --preset tiny --arch qwen35moe --type q8_0 --n-layer 4 --quiet",
                        dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto f = GgufFile::open(out);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(*(*f)->get_string("general.architecture"), "qwen35moe");
  EXPECT_EQ(*(*f)->get_u32("qwen35moe.block_count"), 4u);
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

TEST(TestModelCli, BadOverridesFailWithAClearMessage) {
  TempDir dir("cli_bad");
  const std::string out = dir.path() + "/m.gguf";
  RunResult r = run_exe("make-test-model " + out + " --preset tiny --ssm-n-k-heads 3 --quiet", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--ssm-n-v-heads 4 is not a multiple of --ssm-n-k-heads 3"), std::string::npos) << r.output;
  r = run_exe("make-test-model " + out + " --preset tiny --head-dim 8", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--head-dim 8"), std::string::npos) << r.output;
  r = run_exe("make-test-model " + out + " --preset tiny --type q3_k", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("q3_k"), std::string::npos) << r.output;
  r = run_exe("make-test-model " + out + " --preset nope", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown preset 'nope'"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
}

TEST(TestModelDemo, WritesOnceAndReuses) {
  TempDir dir("demo");
  const std::string cache = dir.path() + "/cache";
  auto p = ensure_demo_model(cache);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(*p, demo_model_path(cache));
  auto f = GgufFile::open(*p);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(*(*f)->get_u32("general.file_type"), 7u);  // q8_0
  const auto t1 = fs::last_write_time(*p);
  auto again = ensure_demo_model(cache);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(fs::last_write_time(*again), t1) << "an intact demo model must be reused";
  for (const auto& e : fs::directory_iterator(cache)) {
    EXPECT_EQ(e.path().string(), *p) << "stray file " << e.path();
  }
}

TEST(TestModelDemo, ReplacesACorruptFile) {
  TempDir dir("demo_bad");
  const std::string cache = dir.path();
  {
    std::ofstream bad(demo_model_path(cache), std::ios::binary);
    bad << "not a gguf file";
  }
  auto p = ensure_demo_model(cache);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_TRUE(GgufFile::open(*p).is_ok());
}

TEST(TestModelDemo, DefaultCacheDirFollowsXdg) {
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", "/some/cache", 1);
  EXPECT_EQ(default_cache_dir(), "/some/cache/deltaserve");
  ::unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (home && *home) {
    EXPECT_EQ(default_cache_dir(), std::string(home) + "/.cache/deltaserve");
  }
  if (old) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

}  // namespace
}  // namespace ds::testmodel
