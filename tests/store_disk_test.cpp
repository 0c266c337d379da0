// Disk snapshot tier: round trip, restart indexing, and every way a file can be bad (flipped bytes,
// truncation, foreign model, future version, empty file, leftover temp files), plus write failures
// (disk full injected, unusable directory) and the byte budget.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include <xxhash.h>

#include "store/disk_store.h"
#include "store/snapshot_file.h"

namespace ds {
namespace {
namespace fs = std::filesystem;

class DiskStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("ds-store-{}-{}", ::getpid(),
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    snapshot_file_inject_write_failure(-1, 0);
  }
  void TearDown() override {
    snapshot_file_inject_write_failure(-1, 0);
    fs::remove_all(dir_);
  }
  std::unique_ptr<DiskSnapshotStore> open_store(const std::string& fp = "model-A", uint64_t budget = 0) {
    auto r = DiskSnapshotStore::open({dir_.string(), fp, budget, 8});
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : nullptr;
  }
  static std::shared_ptr<Snapshot> snap(std::vector<int32_t> tokens, size_t n) {
    auto s = std::make_shared<Snapshot>();
    s->tokens = std::move(tokens);
    s->state.resize(n);
    for (size_t i = 0; i < n; ++i) s->state[i] = static_cast<uint8_t>(i * 31 + 7);
    s->prefill_ms = 12.5;
    return s;
  }
  std::string only_file() {
    for (const auto& de : fs::directory_iterator(dir_)) {
      if (de.path().extension() == kSnapshotExtension) return de.path().string();
    }
    return "";
  }
  void flip_byte(const std::string& path, uint64_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x5a));
  }
  size_t quarantined_files() {
    size_t n = 0;
    if (fs::exists(dir_ / "quarantine")) {
      for ([[maybe_unused]] const auto& de : fs::directory_iterator(dir_ / "quarantine")) ++n;
    }
    return n;
  }
  fs::path dir_;
};

TEST_F(DiskStoreTest, WriteThenFindAndLoadAfterRestart) {
  {
    auto store = open_store();
    store->put_async(snap({1, 2, 3}, 1000));
    store->put_async(snap({1, 2, 3, 4, 5}, 2000));
    store->flush();
    EXPECT_EQ(store->stats().files, 2u);
  }
  auto store = open_store();  // a restart: indexed from headers
  EXPECT_EQ(store->stats().files, 2u);
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  auto info = store->find(prompt);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->tokens.size(), 5u);
  auto loaded = store->load(*info);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ((*loaded)->state, snap({}, 2000)->state);
  EXPECT_DOUBLE_EQ((*loaded)->prefill_ms, 12.5);
  EXPECT_FALSE(store->find(prompt, 4)->tokens.size() != 3u);
}

TEST_F(DiskStoreTest, FlippedPayloadByteIsQuarantinedOnLoad) {
  auto store = open_store();
  store->put_async(snap({9, 9}, 4096));
  store->flush();
  const std::string path = only_file();
  flip_byte(path, fs::file_size(path) - 100);
  std::vector<int32_t> prompt = {9, 9, 1};
  auto info = store->find(prompt);
  ASSERT_TRUE(info.has_value());
  auto loaded = store->load(*info);
  EXPECT_EQ(loaded.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(loaded.status().message().find("payload checksum"), std::string::npos);
  EXPECT_FALSE(store->find(prompt).has_value());  // never offered again
  EXPECT_EQ(quarantined_files(), 1u);
}

TEST_F(DiskStoreTest, BadFilesAreSkippedAtStartup) {
  {
    auto store = open_store();
    for (int i = 0; i < 6; ++i) store->put_async(snap({i, i + 1, i + 2}, 500 + i));
    store->flush();
  }
  std::vector<std::string> files;
  for (const auto& de : fs::directory_iterator(dir_)) files.push_back(de.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 6u);
  flip_byte(files[0], 20);                                          // header byte
  fs::resize_file(files[1], fs::file_size(files[1]) - 10);          // truncated
  fs::resize_file(files[2], 0);                                     // empty
  flip_byte(files[3], 128 + 7 + 2);                                 // a token id (after "model-A")
  {
    // Future version: rewrite header fields and fix its checksum so only the version is wrong.
    std::vector<int32_t> t = {4, 5, 6};
    std::vector<uint8_t> payload(100, 1);
    ASSERT_TRUE(snapshot_file_write(files[4], "model-A", t, payload, 1).is_ok());
    std::fstream f(files[4], std::ios::in | std::ios::out | std::ios::binary);
    uint8_t header[128];
    f.read(reinterpret_cast<char*>(header), 128);
    const uint32_t v = 99;
    std::memcpy(header + 12, &v, 4);
    const uint64_t h = XXH3_64bits(header, 120);
    std::memcpy(header + 120, &h, 8);
    f.seekp(0);
    f.write(reinterpret_cast<char*>(header), 128);
  }
  std::ofstream(dir_ / ".tmp-interrupted-write") << "partial";
  auto store = open_store();
  EXPECT_EQ(store->stats().files, 1u);
  EXPECT_EQ(store->stats().quarantined, 5u);
  EXPECT_FALSE(fs::exists(dir_ / ".tmp-interrupted-write"));
}

// A run of bad files leaves only the most recently quarantined kQuarantineKeepFiles in the quarantine,
// and under a byte budget at most a quarter of the budget.
TEST_F(DiskStoreTest, QuarantineKeepsOnlyTheNewestFiles) {
  // Writes n snapshots, corrupts their headers, returns their file names.
  const auto write_bad = [&](int n, int first) {
    {
      auto store = open_store();
      for (int i = 0; i < n; ++i) store->put_async(snap({first + i, first + i + 1}, 1000));
      store->flush();
    }
    std::set<std::string> names;
    for (const auto& de : fs::directory_iterator(dir_)) {
      if (de.path().extension() != kSnapshotExtension) continue;
      flip_byte(de.path().string(), 20);  // header byte
      names.insert(de.path().filename().string());
    }
    return names;
  };
  write_bad(7, 0);
  uintmax_t file_bytes = 0;
  for (const auto& de : fs::directory_iterator(dir_)) {
    if (de.path().extension() == kSnapshotExtension) file_bytes = de.file_size();
  }
  ASSERT_GT(file_bytes, 1000u);
  {
    auto store = open_store();
    EXPECT_EQ(store->stats().quarantined, 7u);
    EXPECT_EQ(store->stats().files, 0u);
  }
  EXPECT_EQ(quarantined_files(), static_cast<size_t>(kQuarantineKeepFiles));
  // Under a budget whose quarter holds two and a half files: the two newest stay, and they are the
  // ones quarantined last (tokens 100.., not the earlier run's).
  const std::set<std::string> last = write_bad(3, 100);
  ASSERT_EQ(last.size(), 3u);
  {
    auto store = open_store("model-A", 4 * (2 * file_bytes + file_bytes / 2));
    EXPECT_EQ(store->stats().quarantined, 3u);
  }
  EXPECT_EQ(quarantined_files(), 2u);
  for (const auto& de : fs::directory_iterator(dir_ / "quarantine")) {
    EXPECT_EQ(last.count(de.path().filename().string()), 1u) << de.path();
  }
  auto store = open_store();  // nothing left to quarantine: the folder is as it was
  EXPECT_EQ(store->stats().quarantined, 0u);
  EXPECT_EQ(quarantined_files(), 2u);
}

TEST_F(DiskStoreTest, ForeignModelFilesAreNotUsed) {
  {
    auto store = open_store("model-A");
    store->put_async(snap({1, 2}, 100));
    store->flush();
  }
  auto store = open_store("model-B");
  std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_FALSE(store->find(prompt).has_value());
  EXPECT_EQ(store->stats().quarantined, 1u);
}

TEST_F(DiskStoreTest, DiskFullLeavesNoFileAndNoTemp) {
  auto store = open_store();
  snapshot_file_inject_write_failure(300, ENOSPC);
  store->put_async(snap({1, 2, 3}, 10000));
  store->flush();
  EXPECT_EQ(store->stats().write_failures, 1u);
  EXPECT_EQ(store->stats().files, 0u);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& de : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 0u);
  snapshot_file_inject_write_failure(-1, 0);
  store->put_async(snap({1, 2, 3}, 10000));
  store->flush();
  EXPECT_EQ(store->stats().files, 1u);
}

TEST_F(DiskStoreTest, UnusableDirectoryIsReportedAtOpen) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "a-file") << "x";
  auto r = DiskSnapshotStore::open({(dir_ / "a-file" / "cache").string(), "m", 0, 8});
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("a-file"), std::string::npos);
}

TEST_F(DiskStoreTest, BudgetEvictsLeastRecentlyUsed) {
  auto store = open_store("m", 3 * 1200);
  store->put_async(snap({1}, 1000));
  store->flush();
  store->put_async(snap({2}, 1000));
  store->flush();
  std::vector<int32_t> q1 = {1};
  ASSERT_TRUE(store->find(q1).has_value());  // touch {1}: {2} becomes the oldest
  store->put_async(snap({3}, 1000));
  store->flush();
  store->put_async(snap({4}, 1000));
  store->flush();
  EXPECT_LE(store->stats().bytes, 3u * 1200);
  std::vector<int32_t> q2 = {2};
  EXPECT_FALSE(store->find(q2).has_value());
  EXPECT_TRUE(store->find(q1).has_value());
}

// A delta snapshot is written as a delta file on its parent's file and loads back as its chain; one
// whose parent has no file is joined into a whole file; a parent stays while a delta builds on it;
// a delta whose parent is gone or corrupt is deleted, never used.
TEST_F(DiskStoreTest, DeltasAreWrittenOnTheirParentsAndLoadAsChains) {
  auto root = snap({1, 2}, 300);
  auto child = snap({1, 2, 3, 4}, 200);
  child->parent = root;
  auto grandchild = snap({1, 2, 3, 4, 5}, 100);
  grandchild->parent = child;
  auto orphan = snap({7, 8, 9}, 150);
  orphan->parent = snap({7, 8}, 50);  // never written
  int joins = 0;
  {
    DiskStoreOptions o{dir_.string(), "model-A", 0, 8};
    o.whole_stream = [&](const Snapshot& s) -> Result<std::vector<uint8_t>> {
      ++joins;
      return std::vector<uint8_t>(s.state.size() + 50, 0xee);
    };
    auto store = std::move(DiskSnapshotStore::open(o)).value();
    store->put_async(root);
    store->put_async(child);
    store->put_async(grandchild);
    store->put_async(orphan);
    store->flush();
    EXPECT_EQ(store->stats().writes, 4u);
  }
  EXPECT_EQ(joins, 1);  // the orphan alone
  auto store = open_store();
  EXPECT_EQ(store->stats().files, 4u);
  std::vector<int32_t> q = {1, 2, 3, 4, 5, 6};
  auto info = store->find(q);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->parent_tokens, 4u);
  auto loaded = store->load(*info);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  ASSERT_EQ((*loaded)->depth(), 2);
  EXPECT_EQ((*loaded)->state, grandchild->state);
  EXPECT_EQ((*loaded)->parent->state, child->state);
  EXPECT_EQ((*loaded)->parent->parent->state, root->state);
  EXPECT_EQ((*loaded)->parent->parent->tokens, root->tokens);
  std::vector<int32_t> q7 = {7, 8, 9};
  auto whole = store->find(q7);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->parent_tokens, 0u);
  EXPECT_EQ(whole->payload_bytes, 200u);

  // Under a budget files go least recently used first, but never one that a remaining delta builds on.
  store.reset();
  {
    auto small = open_store("model-A", 1000);
    EXPECT_LE(small->stats().bytes, 1000u);
    EXPECT_GE(small->stats().evictions, 1u);
    auto exact = [&](const std::vector<int32_t>& t) {
      auto f = small->find(t);
      return f.has_value() && f->tokens.size() == t.size();
    };
    if (exact(grandchild->tokens)) {
      EXPECT_TRUE(exact(child->tokens));
    }
    if (exact(child->tokens)) {
      EXPECT_TRUE(exact(root->tokens));
    }
  }

  // The middle file gone: its delta is deleted at the next start; a corrupt root takes its deltas along.
  fs::remove_all(dir_);
  {
    auto w = open_store();
    w->put_async(root);
    w->put_async(child);
    w->put_async(grandchild);
    w->flush();
  }
  fs::remove(dir_ / snapshot_file_name(child->tokens));
  {
    auto s2 = open_store();
    EXPECT_EQ(s2->stats().files, 1u);
    EXPECT_FALSE(fs::exists(dir_ / snapshot_file_name(grandchild->tokens)));
    auto hit = s2->find(q);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->tokens, root->tokens);
    s2->put_async(child);
    s2->put_async(grandchild);
    s2->flush();
  }
  const auto root_path = dir_ / snapshot_file_name(root->tokens);
  flip_byte(root_path.string(), fs::file_size(root_path) - 5);  // a payload byte: found only on load
  auto s3 = open_store();
  EXPECT_EQ(s3->stats().files, 3u);
  auto hit = s3->find(q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tokens.size(), 5u);
  EXPECT_FALSE(s3->load(*hit).is_ok());
  EXPECT_EQ(s3->stats().files, 0u);
  EXPECT_EQ(quarantined_files(), 1u);
  EXPECT_FALSE(s3->find(q).has_value());
}

}  // namespace
}  // namespace ds
