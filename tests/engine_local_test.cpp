// Local engine with prefix snapshots: greedy output after a RAM hit, a disk hit, a restart and with
// corrupted snapshot files must equal the uncached output, for dense and MoE models; an edited
// earlier turn must fall back to the longest valid prefix.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/local_engine.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace ds {
namespace {
namespace fs = std::filesystem;

// Writes a tiny F32 test model once per architecture (through the CLI, as a user would).
std::string tiny_model(const std::string& arch) {
  static std::map<std::string, std::string> paths;
  auto it = paths.find(arch);
  if (it != paths.end()) return it->second;
  const fs::path path = fs::temp_directory_path() / fmt::format("ds-engine-test-{}-{}.gguf", ::getpid(), arch);
  const std::string cmd = fmt::format("{} make-test-model {} --preset tiny --arch {} --type f32 --seed 7 >/dev/null 2>&1",
                                      DS_EXE, path.string(), arch);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  paths[arch] = path.string();
  return path.string();
}

int32_t vocab_id(const std::string& model, const char* text) {
  auto f = GgufFile::open(model);
  if (!f.is_ok()) return -1;
  auto toks = (*f)->get_string_array("tokenizer.ggml.tokens");
  for (size_t i = 0; i < toks->size(); ++i) {
    if ((*toks)[i] == text) return static_cast<int32_t>(i);
  }
  return -1;
}

class EngineSnapshotTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = tiny_model(GetParam());
    im_start_ = vocab_id(model_, "<|im_start|>");
    ASSERT_GE(im_start_, 0);
    dir_ = fs::temp_directory_path() / fmt::format("ds-engine-cache-{}-{}-{}", ::getpid(), GetParam(),
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<LocalEngine> open(int64_t ram_bytes, bool disk, const std::string& kv_type = "") {
    EngineOptions o;
    o.kv_type = kv_type;
    o.n_threads = 2;
    o.n_ctx = 1024;
    o.prefill_chunk = 64;
    o.checkpoint_every = 128;
    o.cache_ram_bytes = ram_bytes;
    if (disk) o.kv_cache_dir = dir_.string();
    auto e = LocalEngine::open(model_, o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    return e.is_ok() ? std::move(e).value() : nullptr;
  }
  // A conversation-shaped prompt: random tokens with <|im_start|> at turn starts.
  std::vector<int32_t> conversation(int turns, uint32_t seed, int turn_len = 45) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p;
    for (int t = 0; t < turns; ++t) {
      p.push_back(im_start_);
      for (int i = 0; i < turn_len; ++i) p.push_back(static_cast<int32_t>(rng() % 200 + 10));
    }
    p.push_back(im_start_);
    p.push_back(11);
    return p;
  }
  static GenerateResult gen(LocalEngine& e, const std::vector<int32_t>& prompt, int n = 12) {
    GenerateRequest r;
    r.prompt = prompt;
    r.max_tokens = n;
    r.ignore_eos = true;
    auto res = e.generate(r);
    EXPECT_TRUE(res.is_ok()) << res.status().to_string();
    return res.is_ok() ? std::move(res).value() : GenerateResult{};
  }

  std::string model_;
  int32_t im_start_ = -1;
  fs::path dir_;
};

TEST_P(EngineSnapshotTest, RamHitIsTokenIdenticalToUncached) {
  auto plain = open(0, false);
  const auto turn1 = conversation(2, 1);
  auto turn2 = turn1;
  turn2.pop_back();  // the next request re-sends turn 1 up to its last <|im_start|>, then more turns
  const auto extra = conversation(2, 2);
  turn2.insert(turn2.end(), extra.begin(), extra.end());
  const auto ref1 = gen(*plain, turn1);
  const auto ref2 = gen(*plain, turn2);
  EXPECT_EQ(ref2.cached_tokens, 0);

  auto cached = open(256 << 20, false);
  const auto got1 = gen(*cached, turn1);
  EXPECT_EQ(got1.tokens, ref1.tokens);
  const auto got2 = gen(*cached, turn2);
  EXPECT_EQ(got2.tokens, ref2.tokens);
  // Turn 2 shares turn 1 up to (not including) turn 1's last <|im_start|>.
  EXPECT_EQ(got2.cached_tokens, static_cast<int64_t>(turn1.size()) - 2);
  EXPECT_EQ(cached->stats().cache_ram_hits, 1u);
}

TEST_P(EngineSnapshotTest, IdenticalPromptRestoresLogitsWithoutPrefill) {
  auto e = open(256 << 20, false);
  const auto p = conversation(3, 5);
  const auto a = gen(*e, p);
  const auto b = gen(*e, p);
  EXPECT_EQ(b.cached_tokens, static_cast<int64_t>(p.size()));
  EXPECT_EQ(a.tokens, b.tokens);
}

TEST_P(EngineSnapshotTest, DiskHitAfterRestartIsTokenIdentical) {
  const auto p1 = conversation(3, 9);
  auto p2 = p1;
  p2.pop_back();
  const auto more = conversation(1, 10);
  p2.insert(p2.end(), more.begin(), more.end());
  GenerateResult ref2;
  {
    auto plain = open(0, false);
    ref2 = gen(*plain, p2);
  }
  {
    auto e = open(0, true);
    gen(*e, p1);
    e->flush_snapshots();
    EXPECT_GT(e->disk_store()->stats().files, 0u);
  }
  auto restarted = open(0, true);  // no RAM tier: the hit must come from disk
  const auto got = gen(*restarted, p2);
  EXPECT_EQ(got.tokens, ref2.tokens);
  EXPECT_EQ(got.cached_tokens, static_cast<int64_t>(p1.size()) - 2);
  EXPECT_EQ(restarted->stats().cache_disk_hits, 1u);
}

// A long prompt's checkpoints and turn boundaries are saved as deltas, each on the one before: the
// cache holds each token's KV once. A later request restores the whole chain (RAM), and after a restart
// the disk files (whole streams, joined by the writer) do the same; both answer as an uncached run.
TEST_P(EngineSnapshotTest, CheckpointsAreDeltasThatRestoreTokenIdentically) {
  const auto p1 = conversation(8, 31);  // 370 tokens: checkpoints at 128 and 256, a boundary, the end
  auto p2 = p1;
  p2.pop_back();
  const auto more = conversation(2, 32);
  p2.insert(p2.end(), more.begin(), more.end());
  GenerateResult ref2;
  {
    auto plain = open(0, false);
    ref2 = gen(*plain, p2);
  }
  {
    auto e = open(256 << 20, true);
    gen(*e, p1);
    e->flush_snapshots();
    auto end = e->ram_cache()->find(p1);
    ASSERT_NE(end, nullptr);
    EXPECT_EQ(end->tokens.size(), p1.size());
    ASSERT_GE(end->depth(), 3);  // 128 <- 256 <- the last boundary <- the end
    for (const Snapshot* s = end.get(); s->parent; s = s->parent.get()) {
      int64_t kv_from = 0;
      std::memcpy(&kv_from, s->state.data() + 40, sizeof(kv_from));
      EXPECT_EQ(kv_from, static_cast<int64_t>(s->parent->tokens.size()));
    }
    EXPECT_EQ(e->ram_cache()->stats().bytes_used, end->chain_bytes());
    const auto got = gen(*e, p2);
    EXPECT_EQ(got.tokens, ref2.tokens);
    EXPECT_EQ(got.cached_tokens, static_cast<int64_t>(p1.size()) - 2);
    EXPECT_EQ(got.restored_bytes, e->ram_cache()->find(std::vector<int32_t>(p1.begin(), p1.end() - 2))->chain_bytes());
    e->flush_snapshots();
    EXPECT_EQ(e->disk_store()->stats().write_failures, 0u);
  }
  auto restarted = open(0, true);
  const auto got = gen(*restarted, p2);
  EXPECT_EQ(got.tokens, ref2.tokens);
  EXPECT_EQ(got.cached_tokens, static_cast<int64_t>(p2.size()));  // the previous request's own end
  EXPECT_EQ(restarted->stats().cache_disk_hits, 1u);
}

TEST_P(EngineSnapshotTest, CorruptDiskSnapshotsNeverChangeTheAnswer) {
  const auto p = conversation(3, 21);
  GenerateResult ref;
  {
    auto plain = open(0, false);
    ref = gen(*plain, p);
  }
  {
    auto e = open(0, true);
    gen(*e, p);
    e->flush_snapshots();
  }
  int corrupted = 0;
  for (const auto& de : fs::directory_iterator(dir_)) {
    if (de.path().extension() != ".dsnap") continue;
    std::fstream f(de.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-64, std::ios::end);  // inside the serialized state
    f.put('\x55');
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  auto e = open(0, true);
  const auto got = gen(*e, p);
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_EQ(got.cached_tokens, 0);
  EXPECT_GE(e->disk_store()->stats().quarantined, 1u);
}

TEST_P(EngineSnapshotTest, EditedEarlierTurnFallsBackToLongestValidPrefix) {
  auto e = open(256 << 20, false);
  auto plain = open(0, false);
  gen(*e, conversation(2, 33));       // saves a snapshot at its last turn start (position 92)
  const auto p = conversation(4, 33);  // same first two turns, then two more
  gen(*e, p);
  auto edited = p;
  const size_t edit_at = 2 * 46 + 10;  // inside turn 3
  edited[edit_at] = edited[edit_at] == 12 ? 13 : 12;
  const auto got = gen(*e, edited);
  const auto ref = gen(*plain, edited);
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_EQ(got.cached_tokens, 92);  // the snapshots at 128 and later cover the edit: not used
}

TEST_P(EngineSnapshotTest, RejectsBadPrompts) {
  auto e = open(0, false);
  GenerateRequest r;
  EXPECT_EQ(e->generate(r).status().code(), StatusCode::kInvalidArgument);  // empty
  r.prompt = {1, 2, static_cast<int32_t>(e->info().n_vocab)};
  EXPECT_EQ(e->generate(r).status().code(), StatusCode::kInvalidArgument);  // out of vocabulary
  r.prompt.assign(static_cast<size_t>(e->info().n_ctx), 5);
  EXPECT_EQ(e->generate(r).status().code(), StatusCode::kInvalidArgument);  // too long
}

TEST_P(EngineSnapshotTest, CancelStopsGeneration) {
  auto e = open(0, false);
  GenerateRequest r;
  r.prompt = conversation(1, 3);
  r.max_tokens = 50;
  r.ignore_eos = true;
  int seen = 0;
  r.on_token = [&](int32_t) { return ++seen < 3; };
  r.cancelled = [&] { return seen >= 3; };
  auto res = e->generate(r);
  ASSERT_TRUE(res.is_ok());
  EXPECT_EQ(res->finish, FinishReason::kCancelled);
  EXPECT_EQ(res->tokens.size(), 3u);
}

TEST_P(EngineSnapshotTest, SnapshotsAreKeptApartByKvType) {
  // An F16 KV cache is a different state layout: an F32 engine's disk snapshots are a miss for an F16
  // engine on the same directory (no error, no foreign state), and an F16 engine hits its own.
  const auto p1 = conversation(3, 11);
  GenerateResult ref16;
  {
    auto plain = open(0, false, "f16");
    ASSERT_NE(plain, nullptr);
    EXPECT_EQ(plain->model().options().kv_dtype, DType::F16);
    ref16 = gen(*plain, p1);
  }
  {
    auto e32 = open(0, true, "f32");
    ASSERT_NE(e32, nullptr);
    gen(*e32, p1);
    e32->flush_snapshots();
  }
  {
    auto e16 = open(0, true, "f16");
    ASSERT_NE(e16, nullptr);
    const auto miss = gen(*e16, p1);
    EXPECT_EQ(miss.cached_tokens, 0);
    EXPECT_EQ(e16->stats().cache_disk_hits, 0u);
    EXPECT_EQ(miss.tokens, ref16.tokens);
    e16->flush_snapshots();
  }
  auto again = open(0, true, "f16");
  const auto hit = gen(*again, p1);
  EXPECT_EQ(hit.cached_tokens, static_cast<int64_t>(p1.size()));
  EXPECT_EQ(again->stats().cache_disk_hits, 1u);
  EXPECT_EQ(hit.tokens, ref16.tokens);
}

TEST_P(EngineSnapshotTest, QuantKvCacheHitsOnlyItsOwnSnapshots) {
  // A q8_0 or q4_0 engine (the tiny preset's head_dim is 64) misses the disk snapshots of every other KV
  // type (f16's; q4_0 also q8_0's), and after a restart restores its own and generates the same tokens as
  // without them.
  const auto p1 = conversation(3, 12);
  {
    auto e16 = open(0, true, "f16");
    ASSERT_NE(e16, nullptr);
    gen(*e16, p1);
    e16->flush_snapshots();
  }
  std::vector<std::string> fingerprints;  // snapshot identities of the KV types opened so far
  for (const char* kv : {"f16", "f32"}) {
    auto e = open(0, false, kv);
    ASSERT_NE(e, nullptr);
    fingerprints.push_back(e->fingerprint_text());
  }
  for (const auto& [kv, dt] : {std::pair<std::string, DType>{"q8_0", DType::Q8_0}, {"q4_0", DType::Q4_0}}) {
    GenerateResult miss;
    {
      auto e = open(0, true, kv);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->model().options().kv_dtype, dt);
      for (const std::string& f : fingerprints) EXPECT_NE(e->fingerprint_text(), f) << kv;
      fingerprints.push_back(e->fingerprint_text());
      miss = gen(*e, p1);
      EXPECT_EQ(miss.cached_tokens, 0) << kv;
      EXPECT_EQ(e->stats().cache_disk_hits, 0u) << kv;
      e->flush_snapshots();
    }
    auto again = open(0, true, kv);
    ASSERT_NE(again, nullptr);
    const auto hit = gen(*again, p1);
    EXPECT_EQ(hit.cached_tokens, static_cast<int64_t>(p1.size())) << kv;
    EXPECT_EQ(again->stats().cache_disk_hits, 1u) << kv;
    EXPECT_EQ(hit.tokens, miss.tokens) << kv;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, EngineSnapshotTest, ::testing::Values("qwen35", "qwen35moe"));

TEST(EngineDevice, ParsesCpuAndCudaAndRejectsTheRest) {
  auto cpu = engine_parse_device("cpu");
  ASSERT_TRUE(cpu.is_ok());
  EXPECT_EQ(*cpu, Device{});
  for (const char* bad : {"gpu", "cuda:x", "cuda:", "cuda:-1", "cuda:0x", "CPU", "", "cuda:123456"}) {
    EXPECT_EQ(engine_parse_device(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
#if DS_HAVE_CUDA
  auto c1 = engine_parse_device("cuda:1");
  ASSERT_TRUE(c1.is_ok());
  EXPECT_EQ(*c1, (Device{DeviceKind::kCuda, 1}));
  EXPECT_EQ(*engine_parse_device("cuda"), (Device{DeviceKind::kCuda, 0}));
#else
  EXPECT_EQ(engine_parse_device("cuda:0").status().code(), StatusCode::kUnsupported);
#endif
  // A bad device string fails before the model file is even opened.
  EngineOptions o;
  o.device = "gpu";
  auto e = LocalEngine::open(tiny_model("qwen35"), o);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().to_string().find("cpu or cuda:N"), std::string::npos) << e.status().to_string();
}

TEST(EngineKvType, DefaultsByDeviceAndRejectsTheRest) {
  const Device cpu{}, gpu{DeviceKind::kCuda, 0};
  EXPECT_EQ(*engine_parse_kv_type("", cpu), DType::F32);
  EXPECT_EQ(*engine_parse_kv_type("", gpu), DType::F16);  // what the CUDA attention kernels read
  EXPECT_EQ(*engine_parse_kv_type("f16", cpu), DType::F16);
  EXPECT_EQ(*engine_parse_kv_type("f32", gpu), DType::F32);
  EXPECT_EQ(*engine_parse_kv_type("q8_0", cpu), DType::Q8_0);
  EXPECT_EQ(*engine_parse_kv_type("q8_0", gpu), DType::Q8_0);
  EXPECT_EQ(*engine_parse_kv_type("q4_0", cpu), DType::Q4_0);
  EXPECT_EQ(*engine_parse_kv_type("q4_0", gpu), DType::Q4_0);
  for (const char* bad : {"q5_0", "q4_1", "Q4_0", "Q8_0", "q8", "q4", "F16", "fp16", "bf16", " f16", "q8_0 "}) {
    EXPECT_EQ(engine_parse_kv_type(bad, cpu).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EngineOptions o;
  o.kv_type = "q5_0";
  auto e = LocalEngine::open(tiny_model("qwen35"), o);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().to_string().find("expected f16, f32, q8_0 or q4_0"), std::string::npos)
      << e.status().to_string();
}

}  // namespace
}  // namespace ds
