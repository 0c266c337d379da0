// Seed corpus for the GGUF reader fuzzer (fuzz/corpus/gguf): checks that every committed seed is
// still refused or accepted as its name says, and regenerates the seeds when DS_WRITE_FUZZ_CORPUS=1.
// Non-obvious choice: the seeds are built here from the writer plus byte patches rather than kept as
// opaque blobs, so they follow format changes and each corrupt seed documents its one defect.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace ds {
namespace {

GgufWriter::FillFn fill_pattern(uint8_t seed) {
  return [seed](uint8_t* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(seed + i * 7);
    return Status::ok();
  };
}

GgufWriter small_model(uint32_t alignment) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen35");
  w.set_alignment(alignment);
  w.set_u32("qwen35.block_count", 2);
  w.set_u32("qwen35.embedding_length", 64);
  w.set_f32("qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_array_i32("qwen35.rope.dimension_sections", {11, 11, 10, 0});
  w.set_array_string("tokenizer.ggml.tokens", {"!", "\"", "a", "\xc4\xa0the", "<|im_end|>"});
  w.set_array_i32("tokenizer.ggml.token_type", {1, 1, 1, 1, 3});
  w.set_array_string("tokenizer.ggml.merges", {"\xc4\xa0 t", "h e"});
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
  w.add_tensor("token_embd.weight", DType::Q8_0, {64, 5}, fill_pattern(1));
  w.add_tensor("blk.0.attn_norm.weight", DType::F32, {64}, fill_pattern(2));
  w.add_tensor("blk.0.ffn_up.weight", DType::Q4_K, {256, 2}, fill_pattern(3));
  w.add_tensor("blk.1.ssm_a", DType::F16, {4}, fill_pattern(4));
  w.add_tensor("output_norm.weight", DType::BF16, {64}, fill_pattern(5));
  return w;
}

std::vector<uint8_t> must_write(const GgufWriter& w) {
  auto bytes = w.write_to_memory();
  DS_CHECK(bytes.is_ok(), "{}", bytes.status().to_string());
  return std::move(*bytes);
}

void patch_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }

// Offset of the first occurrence of `needle` in `b`.
size_t find_bytes(const std::vector<uint8_t>& b, std::string_view needle) {
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  DS_CHECK(it != b.end(), "'{}' not in the file", needle);
  return static_cast<size_t>(it - b.begin());
}

// name -> bytes; names starting with "valid_" must parse, the others must be refused.
std::map<std::string, std::vector<uint8_t>> make_seeds() {
  std::map<std::string, std::vector<uint8_t>> seeds;
  const auto base = must_write(small_model(32));
  seeds["valid_small.gguf"] = base;
  seeds["valid_align64.gguf"] = must_write(small_model(64));
  auto v2 = base;
  patch_u32(v2, 4, 2);
  seeds["valid_v2.gguf"] = v2;
  {
    GgufWriter w;
    w.set_u8("u8", 1);
    w.set_i8("i8", -1);
    w.set_u16("u16", 2);
    w.set_i16("i16", -2);
    w.set_u64("u64", 3);
    w.set_i64("i64", -3);
    w.set_f64("f64", 0.5);
    w.set_array_u32("au32", {1, 2});
    w.set_array_f32("af32", {1.0f});
    w.set_array_bool("abool", {true, false});
    GgufValue inner;
    inner.type = GgufType::ARRAY;
    inner.elem_type = GgufType::STRING;
    inner.n_elems = 1;
    inner.elems.resize(1);
    inner.elems[0].type = GgufType::STRING;
    inner.elems[0].str = "s";
    GgufValue outer;
    outer.type = GgufType::ARRAY;
    outer.elem_type = GgufType::ARRAY;
    outer.n_elems = 2;
    outer.elems = {inner, inner};
    w.set_value("nested", outer);
    w.add_tensor("t", DType::Q6_K, {256}, fill_pattern(6));
    w.add_tensor("u", DType::Q5_0, {32, 2}, fill_pattern(7));
    seeds["valid_types.gguf"] = must_write(w);
  }
  auto bad = base;
  bad[0] = 'X';
  seeds["bad_magic.gguf"] = bad;
  bad = base;
  patch_u32(bad, 4, 1);
  seeds["version1.gguf"] = bad;
  seeds["truncated.gguf"] = std::vector<uint8_t>(base.begin(), base.begin() + base.size() / 2);
  {
    GgufWriter w;
    w.set_u32("x.key.one", 1);
    w.set_u32("x.key.two", 2);
    bad = must_write(w);  // the second key renamed to the first
    std::memcpy(bad.data() + find_bytes(bad, "x.key.two"), "x.key.one", 9);
    seeds["duplicate_key.gguf"] = bad;
  }
  {
    GgufWriter w = small_model(32);
    w.add_tensor("blk.1.ffn_up.weight", DType::Q4_K, {256, 2}, fill_pattern(8));
    bad = must_write(w);  // retype the last tensor as q4_1 (id 3), known but unsupported
    const size_t name_at = find_bytes(bad, "blk.1.ffn_up.weight");
    patch_u32(bad, name_at + 19 + 4 + 16, 3);
    seeds["unsupported_type.gguf"] = bad;
  }
  bad = base;  // the second tensor's offset pointed at the first tensor's data
  {
    const size_t name_at = find_bytes(bad, "blk.0.attn_norm.weight");
    const uint64_t zero = 0;
    std::memcpy(bad.data() + name_at + 22 + 4 + 8 + 4, &zero, 8);
  }
  seeds["overlap.gguf"] = bad;
  {
    GgufWriter w;  // metadata only, general.alignment then raised to 1 GiB (a copy would pad to it)
    w.set_alignment(64);
    w.set_u32("x.key", 1);
    bad = must_write(w);
    patch_u32(bad, find_bytes(bad, "general.alignment") + 17 + 4, 1u << 30);
    seeds["huge_alignment.gguf"] = bad;
  }
  return seeds;
}

std::filesystem::path corpus_dir() { return std::filesystem::path(DS_SOURCE_DIR) / "fuzz/corpus/gguf"; }

TEST(GgufCorpus, SeedsMatchTheirNames) {
  const auto seeds = make_seeds();
  if (const char* w = std::getenv("DS_WRITE_FUZZ_CORPUS"); w != nullptr && std::string(w) == "1") {
    std::filesystem::create_directories(corpus_dir());
    for (const auto& [name, bytes] : seeds) {
      std::ofstream out(corpus_dir() / name, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
  }
  uint64_t total = 0;
  for (const auto& [name, bytes] : seeds) {
    SCOPED_TRACE(name);
    const bool valid = name.rfind("valid_", 0) == 0;
    auto f = GgufFile::from_memory(bytes, name);
    EXPECT_EQ(f.is_ok(), valid) << f.status().to_string();
    // The committed file must be the one this test generates.
    const auto path = corpus_dir() / name;
    ASSERT_TRUE(std::filesystem::exists(path)) << "run with DS_WRITE_FUZZ_CORPUS=1 to create " << path;
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(on_disk, bytes);
    total += bytes.size();
  }
  EXPECT_LT(total, 100u * 1024);
  auto unsupported = GgufFile::from_memory(seeds.at("unsupported_type.gguf"));
  EXPECT_EQ(unsupported.status().code(), StatusCode::kUnsupported) << unsupported.status().to_string();
  auto overlap = GgufFile::from_memory(seeds.at("overlap.gguf"));
  EXPECT_NE(overlap.status().message().find("overlaps"), std::string::npos)
      << overlap.status().to_string();
  auto dup = GgufFile::from_memory(seeds.at("duplicate_key.gguf"));
  EXPECT_NE(dup.status().message().find("duplicate metadata key"), std::string::npos)
      << dup.status().to_string();
}

}  // namespace
}  // namespace ds
