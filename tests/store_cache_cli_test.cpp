// `deltaserve cache` end to end: ls, verify (detects a corrupted payload, exit 1), prune to a budget.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "store/snapshot_file.h"

namespace ds {
namespace {
namespace fs = std::filesystem;

int run(const std::string& args, std::string* out) {
  const std::string cmd = std::string(DS_EXE) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  out->clear();
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CacheCli, LsVerifyPrune) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("ds-cache-cli-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<uint8_t> payload(10000, 3);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> tokens = {i, i, i, i};
    ASSERT_TRUE(snapshot_file_write((dir / snapshot_file_name(tokens)).string(), "fp", tokens, payload, 1).is_ok());
  }
  std::string out;
  EXPECT_EQ(run("cache ls " + dir.string(), &out), 0);
  EXPECT_NE(out.find("fp"), std::string::npos);
  EXPECT_EQ(run("cache verify " + dir.string(), &out), 0);
  EXPECT_NE(out.find("3 ok, 0 bad"), std::string::npos) << out;

  // Corrupt one payload byte.
  const fs::path victim = dir / snapshot_file_name(std::vector<int32_t>{1, 1, 1, 1});
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_EQ(run("cache verify --quarantine " + dir.string(), &out), 1);
  EXPECT_NE(out.find("2 ok, 1 bad"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(victim));
  EXPECT_TRUE(fs::exists(dir / "quarantine" / victim.filename()));

  EXPECT_EQ(run("cache prune --budget 15000 " + dir.string(), &out), 0);
  size_t left = 0;
  for (const auto& de : fs::directory_iterator(dir)) left += de.path().extension() == kSnapshotExtension;
  EXPECT_EQ(left, 1u);
  EXPECT_FALSE(fs::exists(dir / "quarantine"));
  EXPECT_EQ(run("cache prune " + dir.string(), &out), 1);  // needs --all or --budget
  fs::remove_all(dir);
}

// Prune never leaves a delta without the file it builds on: the oldest file here is a delta's parent,
// so the delta goes first.
TEST(CacheCli, PruneTakesDeltasBeforeTheirParents) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("ds-cache-cli-delta-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<uint8_t> payload(10000, 3);
  const std::vector<int32_t> root = {5, 5}, delta = {5, 5, 6}, other = {8, 8};
  const auto now = fs::file_time_type::clock::now();
  ASSERT_TRUE(snapshot_file_write((dir / snapshot_file_name(root)).string(), "fp", root, payload, 1).is_ok());
  ASSERT_TRUE(snapshot_file_write((dir / snapshot_file_name(delta)).string(), "fp", delta, payload, 1, 2).is_ok());
  ASSERT_TRUE(snapshot_file_write((dir / snapshot_file_name(other)).string(), "fp", other, payload, 1).is_ok());
  fs::last_write_time(dir / snapshot_file_name(root), now - std::chrono::hours(3));
  fs::last_write_time(dir / snapshot_file_name(delta), now - std::chrono::hours(1));
  fs::last_write_time(dir / snapshot_file_name(other), now - std::chrono::hours(2));
  std::string out;
  EXPECT_EQ(run("cache ls " + dir.string(), &out), 0);
  EXPECT_NE(out.find("delta on 2 tokens"), std::string::npos) << out;
  EXPECT_EQ(run("cache prune --budget 25000 " + dir.string(), &out), 0);  // one of three must go
  EXPECT_TRUE(fs::exists(dir / snapshot_file_name(root)));
  EXPECT_TRUE(fs::exists(dir / snapshot_file_name(delta)));
  EXPECT_FALSE(fs::exists(dir / snapshot_file_name(other)));  // the oldest file nothing builds on
  EXPECT_EQ(run("cache prune --budget 15000 " + dir.string(), &out), 0);
  EXPECT_TRUE(fs::exists(dir / snapshot_file_name(root)));
  EXPECT_FALSE(fs::exists(dir / snapshot_file_name(delta)));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ds
