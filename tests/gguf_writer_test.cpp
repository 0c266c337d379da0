// GGUF writer tests: writer -> reader round trips of every value type and every supported tensor
// type at alignments 32 and 64, byte-identical rewrites, the on-disk commit path and its failure
// cleanup. Tensor payloads are pseudo-random bytes so that any misplaced byte is caught.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace ds {
namespace {

std::vector<uint8_t> random_bytes(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

GgufWriter::FillFn fill_random(uint32_t seed) {
  return [seed](uint8_t* dst, uint64_t n) {
    auto v = random_bytes(n, seed);
    std::memcpy(dst, v.data(), n);
    return Status::ok();
  };
}

std::string temp_path(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return (std::filesystem::temp_directory_path() /
          fmt::format("ds_{}_{}_{}_{}", info->name(), ::getpid(), stem, ".gguf"))
      .string();
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every supported tensor type, with a shape whose ne[0] is one or two blocks.
struct TypeCase {
  DType dtype;
  std::vector<int64_t> ne;
};
std::vector<TypeCase> supported_types() {
  std::vector<TypeCase> out;
  for (uint32_t id = 0; id < 64; ++id) {
    const DTypeInfo* info = dtype_info(id);
    if (info == nullptr || !info->supported) continue;
    out.push_back({static_cast<DType>(id), {info->block_size * (id % 2 + 1), 3, 1 + id % 2}});
  }
  return out;
}

class GgufRoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufRoundTrip, EveryValueAndTensorType) {
  const uint32_t alignment = GetParam();
  GgufWriter w;
  w.set_string("general.architecture", "qwen35");
  w.set_alignment(alignment);
  w.set_u8("v.u8", 250);
  w.set_i8("v.i8", -120);
  w.set_u16("v.u16", 65000);
  w.set_i16("v.i16", -32000);
  w.set_u32("v.u32", 4000000000u);
  w.set_i32("v.i32", -2000000000);
  w.set_u64("v.u64", ~uint64_t{0});
  w.set_i64("v.i64", INT64_MIN);
  w.set_f32("v.f32", -0.1f);
  w.set_f64("v.f64", 1e300);
  w.set_bool("v.bool", false);
  w.set_string("v.string", std::string("utf-8 \xc4\xa0 and a NUL \0 inside", 27));
  w.set_string("v.empty", "");
  w.set_array_u32("a.u32", {1, 2, 0xffffffffu});
  w.set_array_i32("a.i32", {-1, 0, 1});
  w.set_array_f32("a.f32", {1.5f, -2.25f});
  w.set_array_bool("a.bool", {false, true});
  w.set_array_string("a.string", {"a", "", "\xc4\xa0the"});
  w.set_array_i32("a.empty", {});
  // Arrays of the remaining element types and nested arrays go through set_value.
  const uint8_t i64_payload[16] = {1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  GgufValue a_i64;
  a_i64.type = GgufType::ARRAY;
  a_i64.elem_type = GgufType::I64;
  a_i64.n_elems = 2;
  a_i64.raw = i64_payload;
  w.set_value("a.i64", a_i64);
  GgufValue inner_str;
  inner_str.type = GgufType::ARRAY;
  inner_str.elem_type = GgufType::STRING;
  inner_str.n_elems = 2;
  inner_str.elems.resize(2);
  inner_str.elems[0].type = inner_str.elems[1].type = GgufType::STRING;
  inner_str.elems[0].str = "x";
  inner_str.elems[1].str = "yz";
  GgufValue nested;
  nested.type = GgufType::ARRAY;
  nested.elem_type = GgufType::ARRAY;
  nested.n_elems = 3;
  nested.elems = {a_i64, inner_str, a_i64};
  w.set_value("a.nested", nested);

  const auto types = supported_types();
  ASSERT_GE(types.size(), 10u);
  for (size_t i = 0; i < types.size(); ++i) {
    w.add_tensor(fmt::format("t.{}", dtype_name(types[i].dtype)), types[i].dtype, types[i].ne,
                 fill_random(static_cast<uint32_t>(i)));
  }
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto rf = GgufFile::from_memory(*bytes, "rt.gguf");
  ASSERT_TRUE(rf.is_ok()) << rf.status().to_string();
  const GgufFile& f = **rf;

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_offset() % alignment, 0u);
  EXPECT_EQ(f.has("general.alignment"), alignment != 32);
  EXPECT_EQ(f.kvs()[0].key, "general.architecture");
  EXPECT_EQ(f.find("v.u8")->value.num.u64, 250u);
  EXPECT_EQ(f.find("v.i8")->value.num.i64, -120);
  EXPECT_EQ(f.find("v.u16")->value.num.u64, 65000u);
  EXPECT_EQ(f.find("v.i16")->value.num.i64, -32000);
  EXPECT_EQ(*f.get_u32("v.u32"), 4000000000u);
  EXPECT_EQ(*f.get_i32("v.i32"), -2000000000);
  EXPECT_EQ(*f.get_u64("v.u64"), ~uint64_t{0});
  EXPECT_EQ(f.find("v.i64")->value.num.i64, INT64_MIN);
  EXPECT_EQ(*f.get_f32("v.f32"), -0.1f);
  EXPECT_EQ(f.find("v.f64")->value.num.f64, 1e300);
  EXPECT_EQ(*f.get_bool("v.bool"), false);
  EXPECT_EQ(*f.get_string("v.string"), std::string("utf-8 \xc4\xa0 and a NUL \0 inside", 27));
  EXPECT_EQ(*f.get_string("v.empty"), "");
  EXPECT_EQ(*f.get_u32_array("a.u32"), (std::vector<uint32_t>{1, 2, 0xffffffffu}));
  EXPECT_EQ(*f.get_i32_array("a.i32"), (std::vector<int32_t>{-1, 0, 1}));
  EXPECT_EQ(*f.get_f32_array("a.f32"), (std::vector<float>{1.5f, -2.25f}));
  EXPECT_EQ(*f.get_bool_array("a.bool"), (std::vector<bool>{false, true}));
  EXPECT_EQ(*f.get_string_array("a.string"), (std::vector<std::string_view>{"a", "", "\xc4\xa0the"}));
  EXPECT_TRUE(f.get_i32_array("a.empty")->empty());
  EXPECT_EQ(*f.get_int_array("a.i64"), (std::vector<int64_t>{1, -1}));
  const GgufValue& n = f.find("a.nested")->value;
  ASSERT_EQ(n.elem_type, GgufType::ARRAY);
  ASSERT_EQ(n.elems.size(), 3u);
  EXPECT_EQ(n.elems[1].elem_type, GgufType::STRING);
  ASSERT_EQ(n.elems[1].elems.size(), 2u);
  EXPECT_EQ(n.elems[1].elems[1].str, "yz");
  EXPECT_EQ(gguf_value_to_string(n), "[[1, -1], [\"x\", \"yz\"], [1, -1]]");

  ASSERT_EQ(f.tensors().size(), types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, fmt::format("t.{}", dtype_name(types[i].dtype)));
    EXPECT_EQ(t.dtype, types[i].dtype);
    EXPECT_EQ(t.n_dims, 3);
    for (int d = 0; d < 3; ++d) EXPECT_EQ(t.ne[d], types[i].ne[d]);
    EXPECT_EQ(t.offset % alignment, 0u);
    const uint64_t expect_bytes =
        static_cast<uint64_t>(dtype_row_bytes(t.dtype, t.ne[0]) * t.ne[1] * t.ne[2]);
    ASSERT_EQ(t.n_bytes, expect_bytes);
    const auto want = random_bytes(t.n_bytes, static_cast<uint32_t>(i));
    EXPECT_EQ(std::memcmp(t.data, want.data(), t.n_bytes), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufRoundTrip, ::testing::Values(32u, 64u));

TEST(GgufWriter, ReplacingAKeyKeepsItsPlace) {
  GgufWriter w;
  w.set_u32("a", 1);
  w.set_u32("b", 2);
  w.set_string("a", "now a string");
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok());
  auto f = GgufFile::from_memory(*bytes);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ((*f)->kvs().size(), 2u);
  EXPECT_EQ((*f)->kvs()[0].key, "a");
  EXPECT_EQ(*(*f)->get_string("a"), "now a string");
  EXPECT_EQ((*f)->kvs()[1].key, "b");
}

TEST(GgufWriter, CopiesAreIndependent) {
  GgufWriter a;
  a.set_u32("n", 1);
  GgufWriter b = a;
  b.set_u32("n", 2);
  auto fa = a.write_to_memory();
  auto fb = b.write_to_memory();
  ASSERT_TRUE(fa.is_ok() && fb.is_ok());
  EXPECT_EQ(*GgufFile::from_memory(*fa).value()->get_u32("n"), 1u);
  EXPECT_EQ(*GgufFile::from_memory(*fb).value()->get_u32("n"), 2u);
}

TEST(GgufWriter, RewritesAreByteIdentical) {
  auto make = [] {
    GgufWriter w;
    w.set_string("general.architecture", "qwen35");
    w.set_array_f32("x", {1, 2, 3});
    w.add_tensor("a", DType::Q4_K, {256, 2}, fill_random(1));
    w.add_tensor("b", DType::F16, {7}, fill_random(2));
    return w;
  };
  const GgufWriter w1 = make();
  auto b1 = w1.write_to_memory();
  auto b2 = w1.write_to_memory();
  auto b3 = make().write_to_memory();
  ASSERT_TRUE(b1.is_ok() && b2.is_ok() && b3.is_ok());
  EXPECT_EQ(*b1, *b2);
  EXPECT_EQ(*b1, *b3);
  // Tensor 'b' (14 bytes) is padded to the alignment at the end of the file.
  EXPECT_EQ(b1->size() % 32, 0u);
}

TEST(GgufWriter, WritesFileAtomicallyWithProgress) {
  GgufWriter w;
  w.set_alignment(64);
  w.set_u32("n", 7);
  w.add_tensor("a", DType::Q8_0, {64, 3}, fill_random(3));
  w.add_tensor("b", DType::BF16, {5, 5}, fill_random(4));
  std::vector<std::array<uint64_t, 4>> calls;
  const std::string path = temp_path("out");
  Status st = w.write(path, [&](size_t done, size_t total, uint64_t bytes, uint64_t total_bytes) {
    calls.push_back({done, total, bytes, total_bytes});
  });
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const uint64_t a_bytes = 3 * 2 * 34, b_bytes = 25 * 2;
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], (std::array<uint64_t, 4>{1, 2, a_bytes, a_bytes + b_bytes}));
  EXPECT_EQ(calls[1], (std::array<uint64_t, 4>{2, 2, a_bytes + b_bytes, a_bytes + b_bytes}));
  EXPECT_EQ(w.total_tensor_bytes(), a_bytes + b_bytes);
  EXPECT_EQ(w.n_tensors(), 2u);

  auto mem = w.write_to_memory();
  ASSERT_TRUE(mem.is_ok());
  EXPECT_EQ(read_all(path), *mem);
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_NE((*f)->mapping(), nullptr);
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->find_tensor("b")->offset % 64, 0u);
  std::filesystem::remove(path);
}

TEST(GgufWriter, FillFailureRemovesTempFile) {
  GgufWriter w;
  w.add_tensor("ok", DType::F32, {4}, fill_random(5));
  w.add_tensor("bad", DType::F32, {4}, [](uint8_t*, uint64_t) { return io_error("source gone"); });
  const std::string path = temp_path("fail");
  Status st = w.write(path);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("tensor 'bad'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("source gone"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// A short disk: RLIMIT_FSIZE makes write() fail with EFBIG part way through the data section.
TEST(GgufWriter, FailedWriteRemovesTempFile) {
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  GgufWriter w;
  w.add_tensor("big", DType::F32, {4096}, fill_random(6));
  const std::string path = temp_path("short");
  Status st = w.write(path);
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.to_string();
  EXPECT_NE(st.message().find(path + ".tmp"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(GgufWriter, UnwritableDirectory) {
  GgufWriter w;
  w.set_u32("n", 1);
  Status st = w.write("/nonexistent-dir/x.gguf");
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("/nonexistent-dir/x.gguf.tmp"), std::string::npos) << st.message();
}

TEST(GgufWriter, DuplicateTensorNamesAreRefused) {
  GgufWriter w;
  w.add_tensor("w", DType::F32, {4}, {});
  w.add_tensor("w", DType::F32, {4}, {});
  auto bytes = w.write_to_memory();
  EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bytes.status().message().find("'w'"), std::string::npos);
}

TEST(GgufWriter, AlignmentKeyMustAgree) {
  GgufWriter w;
  w.set_u32("general.alignment", 128);
  EXPECT_EQ(w.write_to_memory().status().code(), StatusCode::kInvalidArgument);
  w.set_alignment(128);
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto f = GgufFile::from_memory(*bytes);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ((*f)->alignment(), 128u);
  EXPECT_EQ((*f)->kvs().size(), 1u);
}

TEST(GgufWriter, EmptyFileRoundTrips) {
  GgufWriter w;
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok());
  EXPECT_EQ(bytes->size(), 32u);  // 24-byte header padded to the alignment
  auto f = GgufFile::from_memory(*bytes);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_TRUE((*f)->kvs().empty());
  EXPECT_TRUE((*f)->tensors().empty());
}

}  // namespace
}  // namespace ds
