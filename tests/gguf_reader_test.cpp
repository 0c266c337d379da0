// GGUF reader tests: one hand-built corrupt file per validation rule, typed getters, value rendering
// and a truncation sweep. Files are assembled byte by byte with GgufBytes so that each test states
// exactly which field is wrong and at which offset the reader must report it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace ds {
namespace {

// Little-endian byte builder for hand-made GGUF files.
class GgufBytes {
 public:
  template <typename T>
  GgufBytes& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  GgufBytes& u8(uint8_t v) { return put(v); }
  GgufBytes& u32(uint32_t v) { return put(v); }
  GgufBytes& u64(uint64_t v) { return put(v); }
  GgufBytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(kGgufMagic).u32(version).u64(n_tensors).u64(n_kv);
  }
  GgufBytes& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  GgufBytes& kv_str(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  GgufBytes& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) u64(n);
    return u32(type).u64(offset);
  }
  GgufBytes& pad_to(size_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
    return *this;
  }
  GgufBytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  size_t size() const { return b.size(); }

  std::vector<uint8_t> b;
};

Status parse(const GgufBytes& g) { return GgufFile::from_memory(g.b, "t.gguf").status(); }

#define EXPECT_STATUS(st, code_, ...)                                   \
  do {                                                                  \
    const Status s_ = (st);                                             \
    EXPECT_EQ(s_.code(), StatusCode::code_) << s_.to_string();          \
    for (const std::string& sub_ : std::vector<std::string>{__VA_ARGS__}) { \
      EXPECT_NE(s_.message().find(sub_), std::string::npos)             \
          << "missing '" << sub_ << "' in: " << s_.message();           \
    }                                                                   \
  } while (0)

// A valid file with one f32 tensor of 8 elements (32 bytes).
GgufBytes valid_file() {
  GgufBytes g;
  g.header(1, 1).kv_str("general.architecture", "qwen35").tensor("w", {8}, 0, 0).pad_to(32);
  for (int i = 0; i < 8; ++i) g.put<float>(static_cast<float>(i));
  return g;
}

TEST(GgufReader, ParsesHandBuiltFile) {
  GgufBytes g = valid_file();
  auto f = GgufFile::from_memory(g.b, "t.gguf");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->alignment(), 32u);
  ASSERT_EQ((*f)->tensors().size(), 1u);
  const GgufTensorInfo* t = (*f)->find_tensor("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_bytes, 32u);
  EXPECT_EQ(t->data, g.b.data() + (*f)->data_offset());
  float last = 0;
  std::memcpy(&last, t->data + 28, 4);
  EXPECT_EQ(last, 7.0f);
  EXPECT_EQ(t->shape_string(), "{8}");
  EXPECT_EQ(*(*f)->get_string("general.architecture"), "qwen35");
}

// The writer's bytes equal a file laid out by hand from the format description.
TEST(GgufReader, WriterMatchesHandLayout) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen35");
  w.set_u32("n", 7);
  w.set_array_string("toks", {"a", "bc"});
  w.add_tensor("x", DType::F32, {3}, [](uint8_t* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i + 1);
    return Status::ok();
  });
  w.add_tensor("y", DType::F16, {2, 2}, {});
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok());

  GgufBytes g;
  g.header(2, 3).kv_str("general.architecture", "qwen35").kv_u32("n", 7);
  g.str("toks").u32(9).u32(8).u64(2).str("a").str("bc");
  g.tensor("x", {3}, 0, 0).tensor("y", {2, 2}, 1, 32).pad_to(32);
  for (uint8_t i = 1; i <= 12; ++i) g.u8(i);
  g.pad_to(32).zeros(8).pad_to(32);
  EXPECT_EQ(*bytes, g.b);
}

TEST(GgufReader, AcceptsVersion2) {
  GgufBytes g;
  g.header(0, 1, 2).kv_u32("a", 1);
  auto f = GgufFile::from_memory(g.b);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->version(), 2u);
}

TEST(GgufReader, BadMagic) {
  GgufBytes g;
  g.u32(0x46554746).u32(3).u64(0).u64(0);
  EXPECT_STATUS(parse(g), kCorrupt, "t.gguf", "offset 0", "magic");
}

TEST(GgufReader, Version1IsUnsupported) {
  GgufBytes g;
  g.header(0, 0, 1);
  EXPECT_STATUS(parse(g), kUnsupported, "offset 4", "version 1");
}

TEST(GgufReader, FutureVersionIsUnsupported) {
  GgufBytes g;
  g.header(0, 0, 4);
  EXPECT_STATUS(parse(g), kUnsupported, "offset 4", "version 4");
}

TEST(GgufReader, BigEndianFileIsNamed) {
  GgufBytes g;
  g.header(0, 0, 0x03000000);
  EXPECT_STATUS(parse(g), kUnsupported, "big-endian");
}

TEST(GgufReader, TruncatedHeader) {
  GgufBytes g;
  g.u32(kGgufMagic).u32(3).u32(0);
  EXPECT_STATUS(parse(g), kCorrupt, "offset 8", "truncated header");
}

TEST(GgufReader, TruncatedMetadata) {
  GgufBytes g;
  g.header(0, 1).str("general.alignment").u32(4);
  const size_t at = g.size();
  g.u8(32);  // a u32 needs 4 bytes
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "truncated metadata value");
}

TEST(GgufReader, TruncatedTensorTable) {
  GgufBytes g;
  g.header(1, 0).str("w").u32(4).u64(8).u64(1).u64(1);  // 37 bytes of table: passes the count bound
  const size_t at = g.size();
  g.u32(1);  // half of ne[3]
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "truncated tensor table");
}

TEST(GgufReader, TruncatedTensorData) {
  GgufBytes g = valid_file();
  g.b.resize(g.size() - 1);
  EXPECT_STATUS(parse(g), kCorrupt, "tensor 'w'", "truncated tensor data");
}

TEST(GgufReader, DataSectionPastEnd) {
  GgufBytes g;
  g.header(1, 0).tensor("w", {8}, 0, 0);  // no padding, no data
  EXPECT_STATUS(parse(g), kCorrupt, "truncated tensor data");
}

TEST(GgufReader, StringLengthPastEnd) {
  GgufBytes g;
  g.header(0, 1);
  const size_t at = g.size();
  g.u64(1000).zeros(20);
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "metadata key length 1000",
                "past the end");
}

TEST(GgufReader, StringValueLengthPastEnd) {
  GgufBytes g;
  g.header(0, 1).str("name").u32(8);
  const size_t at = g.size();
  g.u64(uint64_t{1} << 62).zeros(8);
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "string value length");
}

TEST(GgufReader, ScalarArrayPastEnd) {
  GgufBytes g;
  g.header(0, 1).str("arr").u32(9);
  const size_t at = g.size();
  g.u32(4).u64(uint64_t{1} << 61).u32(1).u32(2);  // 2^61 u32s: the byte count would overflow too
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "key 'arr'", "past the end");
}

TEST(GgufReader, AbsurdStringArrayCount) {
  GgufBytes g;
  g.header(0, 1).str("tokens").u32(9);
  const size_t at = g.size();
  g.u32(8).u64(uint64_t{1} << 40).str("a").str("b");
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "key 'tokens'",
                "cannot fit");
}

TEST(GgufReader, AbsurdNestedArrayCount) {
  GgufBytes g;
  g.header(0, 1).str("nest").u32(9).u32(9).u64(~uint64_t{0}).zeros(24);
  EXPECT_STATUS(parse(g), kCorrupt, "key 'nest'", "cannot fit");
}

TEST(GgufReader, AbsurdKvCount) {
  GgufBytes g;
  g.header(0, uint64_t{1} << 60).zeros(64);
  EXPECT_STATUS(parse(g), kCorrupt, "offset 16", "metadata count");
}

TEST(GgufReader, AbsurdTensorCount) {
  GgufBytes g;
  g.header(~uint64_t{0}, 0).zeros(64);
  EXPECT_STATUS(parse(g), kCorrupt, "offset 8", "tensor count");
}

TEST(GgufReader, DuplicateKey) {
  GgufBytes g;
  g.header(0, 2).kv_u32("a.b", 1);
  const size_t at = g.size();
  g.kv_u32("a.b", 2);
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "duplicate", "'a.b'",
                "offset 24");
}

TEST(GgufReader, DuplicateTensorName) {
  GgufBytes g;
  g.header(2, 0).tensor("w", {8}, 0, 0);
  const size_t at = g.size();
  g.tensor("w", {8}, 0, 32).pad_to(32).zeros(64);
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "duplicate tensor name 'w'");
}

TEST(GgufReader, InvalidValueType) {
  GgufBytes g;
  g.header(0, 1).str("k");
  const size_t at = g.size();
  g.u32(13).u32(0);
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "key 'k'",
                "invalid value type 13");
}

TEST(GgufReader, InvalidArrayElementType) {
  GgufBytes g;
  g.header(0, 1).str("k").u32(9);
  const size_t at = g.size();
  g.u32(77).u64(0);
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "key 'k'",
                "invalid array element type 77");
}

TEST(GgufReader, BoolOutOfRange) {
  GgufBytes g;
  g.header(0, 1).str("flag").u32(7);
  const size_t at = g.size();
  g.u8(2);
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "key 'flag'", "bool");
}

TEST(GgufReader, ArraysNestedTooDeep) {
  GgufBytes g;
  g.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 20; ++i) g.u32(9).u64(1);
  g.u32(4).u64(0);
  EXPECT_STATUS(parse(g), kCorrupt, "key 'deep'", "nested deeper");
}

TEST(GgufReader, NDimsOutOfRange) {
  for (uint32_t n_dims : {0u, 5u}) {
    GgufBytes g;
    g.header(1, 0);
    const size_t at = g.size();
    g.str("w").u32(n_dims).zeros(64);
    EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "tensor 'w'",
                  fmt::format("n_dims {}", n_dims).c_str());
  }
}

TEST(GgufReader, ZeroOrNegativeDim) {
  for (uint64_t bad : {uint64_t{0}, static_cast<uint64_t>(-4)}) {
    GgufBytes g;
    g.header(1, 0);
    const size_t at = g.size();
    g.tensor("w", {8, bad}, 0, 0).pad_to(32).zeros(32);
    EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "tensor 'w'",
                  fmt::format("ne[1] is {}", static_cast<int64_t>(bad)).c_str());
  }
}

TEST(GgufReader, ElementCountOverflow) {
  GgufBytes g;
  g.header(1, 0).tensor("w", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).pad_to(32).zeros(32);
  EXPECT_STATUS(parse(g), kCorrupt, "tensor 'w'", "overflows int64");
}

TEST(GgufReader, ByteSizeOverflow) {
  // 2^62 f32 elements fit in int64, but 2^64 bytes do not fit in uint64.
  GgufBytes g;
  g.header(1, 0).tensor("w", {uint64_t{1} << 31, uint64_t{1} << 31}, 0, 0).pad_to(32).zeros(32);
  EXPECT_STATUS(parse(g), kCorrupt, "tensor 'w'", "overflows uint64");
}

TEST(GgufReader, RowNotMultipleOfBlock) {
  GgufBytes g;
  g.header(1, 0).tensor("w", {33, 2}, 8, 0).pad_to(32).zeros(128);  // q8_0 blocks hold 32
  EXPECT_STATUS(parse(g), kCorrupt, "tensor 'w'", "ne[0] = 33", "block size 32");
}

TEST(GgufReader, UnknownTensorType) {
  GgufBytes g;
  g.header(1, 0);
  const size_t at = g.size();
  g.tensor("w", {8}, 4, 0).pad_to(32).zeros(32);  // id 4 (old q4_2) is not a ggml type any more
  EXPECT_STATUS(parse(g), kCorrupt, fmt::format("offset {}", at).c_str(), "tensor 'w'",
                "unknown ggml type 4");
  GgufBytes h;
  h.header(1, 0).tensor("w", {8}, 1000, 0).pad_to(32).zeros(32);
  EXPECT_STATUS(parse(h), kCorrupt, "unknown ggml type 1000");
}

TEST(GgufReader, IQuantTensorTypeIsUnsupportedNotCorrupt) {
  GgufBytes g;
  g.header(1, 0).tensor("blk.3.ffn_down.weight", {256}, 23, 0).pad_to(32).zeros(160);  // iq4_xs
  EXPECT_STATUS(parse(g), kUnsupported, "tensor 'blk.3.ffn_down.weight'", "iq4_xs", "ggml id 23");
}

TEST(GgufReader, KnownButUnsupportedTensorType) {
  GgufBytes g;
  g.header(1, 0).tensor("blk.0.ffn_up.weight", {32}, 3, 0).pad_to(32).zeros(32);  // q4_1
  EXPECT_STATUS(parse(g), kUnsupported, "tensor 'blk.0.ffn_up.weight'", "q4_1");
}

TEST(GgufReader, OffsetNotAligned) {
  GgufBytes g;
  g.header(1, 0).tensor("w", {8}, 0, 4).pad_to(32).zeros(64);
  EXPECT_STATUS(parse(g), kCorrupt, "tensor 'w'", "offset 4 is not a multiple of the alignment 32");
}

TEST(GgufReader, TensorDataOutsideFile) {
  GgufBytes g;
  g.header(1, 0).tensor("w", {8}, 0, ~uint64_t{0} - 31).pad_to(32).zeros(32);
  EXPECT_STATUS(parse(g), kCorrupt, "tensor 'w'", "outside the file");
}

TEST(GgufReader, OverlappingTensorData) {
  GgufBytes g;
  g.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad_to(32).zeros(96);
  EXPECT_STATUS(parse(g), kCorrupt, "tensor 'b'", "overlaps tensor 'a'");
}

TEST(GgufReader, AlignmentMustBeABoundedPowerOfTwo) {
  for (uint32_t a : {0u, 24u}) {
    GgufBytes g;
    g.header(0, 1).kv_u32("general.alignment", a);
    EXPECT_STATUS(parse(g), kCorrupt, "offset 24", "general.alignment",
                  fmt::format("{} is not a nonzero power of two", a).c_str());
  }
  for (uint32_t a : {kGgufMaxAlignment * 2, 1u << 30}) {  // a copy would pad its data to a gigabyte
    GgufBytes g;
    g.header(0, 1).kv_u32("general.alignment", a);
    EXPECT_STATUS(parse(g), kCorrupt, "offset 24", "general.alignment",
                  fmt::format("{} is larger than the largest accepted, {}", a, kGgufMaxAlignment).c_str());
  }
  {
    GgufBytes g;
    g.header(0, 1).kv_u32("general.alignment", kGgufMaxAlignment);
    auto f = GgufFile::from_memory(g.b);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ((*f)->alignment(), kGgufMaxAlignment);
  }
  GgufBytes g;
  g.header(0, 1).kv_str("general.alignment", "64");
  EXPECT_STATUS(parse(g), kCorrupt, "general.alignment has type string");
}

TEST(GgufReader, HonoursAlignment) {
  GgufBytes g;
  g.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {8}, 0, 0).pad_to(64).zeros(32);
  auto f = GgufFile::from_memory(g.b);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  // The same table at alignment 32 has a different data offset.
  EXPECT_EQ((*f)->data_offset(), 128u);
}

// Every prefix of a valid file must be refused cleanly. The tensor's size is a multiple of the
// alignment, so no prefix can end inside trailing padding.
TEST(GgufReader, TruncationSweep) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen35");
  w.set_array_string("tokenizer.ggml.tokens", {"a", "b", "cd"});
  w.set_array_i32("ids", {1, 2, 3});
  w.set_f32("eps", 1e-6f);
  w.add_tensor("a", DType::Q8_0, {32, 2}, {});
  w.add_tensor("b", DType::F32, {8}, {});
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok());
  ASSERT_TRUE(GgufFile::from_memory(*bytes).is_ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    std::vector<uint8_t> cut(bytes->begin(), bytes->begin() + n);
    auto f = GgufFile::from_memory(cut);
    ASSERT_FALSE(f.is_ok()) << "prefix of " << n << " bytes was accepted";
    EXPECT_EQ(f.status().code(), StatusCode::kCorrupt) << n << ": " << f.status().to_string();
  }
}

// ---- typed getters ----

class GgufGetters : public ::testing::Test {
 protected:
  void SetUp() override {
    GgufWriter w;
    w.set_u32("n_layer", 4);
    w.set_i32("neg", -3);
    w.set_u64("big", uint64_t{1} << 63);
    w.set_u8("small", 200);
    w.set_i16("short", -7);
    w.set_bool("flag", true);
    w.set_f32("eps", 1e-6f);
    w.set_f64("eps64", 0.25);
    w.set_string("name", "qwen35");
    w.set_array_string("tokens", {"!", "\"", "hello"});
    w.set_array_i32("sections", {11, 11, 10, 0});
    w.set_array_u32("heads", {2, 2, 4});
    w.set_array_f32("scales", {0.5f, -1.5f});
    w.set_array_bool("recurrent", {true, false, true});
    auto bytes = w.write_to_memory();
    ASSERT_TRUE(bytes.is_ok());
    bytes_ = std::move(*bytes);
    auto f = GgufFile::from_memory(bytes_, "m.gguf");
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    file_ = std::move(*f);
  }
  std::vector<uint8_t> bytes_;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(GgufGetters, ExactTypes) {
  EXPECT_EQ(*file_->get_u32("n_layer"), 4u);
  EXPECT_EQ(*file_->get_i32("neg"), -3);
  EXPECT_EQ(*file_->get_u64("big"), uint64_t{1} << 63);
  EXPECT_EQ(*file_->get_bool("flag"), true);
  EXPECT_EQ(*file_->get_f32("eps"), 1e-6f);
  EXPECT_EQ(*file_->get_string("name"), "qwen35");
  EXPECT_EQ(*file_->get_string_array("tokens"), (std::vector<std::string_view>{"!", "\"", "hello"}));
  EXPECT_EQ(*file_->get_i32_array("sections"), (std::vector<int32_t>{11, 11, 10, 0}));
  EXPECT_EQ(*file_->get_u32_array("heads"), (std::vector<uint32_t>{2, 2, 4}));
  EXPECT_EQ(*file_->get_f32_array("scales"), (std::vector<float>{0.5f, -1.5f}));
  EXPECT_EQ(*file_->get_bool_array("recurrent"), (std::vector<bool>{true, false, true}));
}

TEST_F(GgufGetters, WrongTypeNamesKeyExpectedAndActual) {
  EXPECT_STATUS(file_->get_i32("n_layer").status(), kInvalidArgument, "m.gguf", "'n_layer'",
                "expected type i32", "found u32");
  EXPECT_STATUS(file_->get_f32("eps64").status(), kInvalidArgument, "'eps64'", "expected type f32",
                "found f64");
  EXPECT_STATUS(file_->get_string("n_layer").status(), kInvalidArgument, "expected type string");
  EXPECT_STATUS(file_->get_u32_array("sections").status(), kInvalidArgument, "'sections'",
                "expected type array[u32]", "found array[i32]");
  EXPECT_STATUS(file_->get_string_array("name").status(), kInvalidArgument, "array[string]",
                "found string");
}

TEST_F(GgufGetters, MissingKey) {
  EXPECT_STATUS(file_->get_u32("nope").status(), kNotFound, "'nope'");
  EXPECT_STATUS(file_->get_int_array("nope").status(), kNotFound, "'nope'");
  EXPECT_FALSE(file_->has("nope"));
  EXPECT_TRUE(file_->has("name"));
}

TEST_F(GgufGetters, IntAcceptsAnyIntegerType) {
  EXPECT_EQ(*file_->get_int("n_layer"), 4);
  EXPECT_EQ(*file_->get_int("neg"), -3);
  EXPECT_EQ(*file_->get_int("small"), 200);
  EXPECT_EQ(*file_->get_int("short"), -7);
  EXPECT_EQ(*file_->get_int("flag"), 1);
  EXPECT_STATUS(file_->get_int("big").status(), kInvalidArgument, "'big'", "does not fit");
  EXPECT_STATUS(file_->get_int("eps").status(), kInvalidArgument, "'eps'", "integer", "f32");
  EXPECT_EQ(*file_->get_int_array("sections"), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(*file_->get_int_array("heads"), (std::vector<int64_t>{2, 2, 4}));
  EXPECT_EQ(*file_->get_int_array("recurrent"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_STATUS(file_->get_int_array("scales").status(), kInvalidArgument, "'scales'", "array[f32]");
  EXPECT_STATUS(file_->get_int_array("n_layer").status(), kInvalidArgument, "found u32");
}

TEST_F(GgufGetters, ValueToString) {
  EXPECT_EQ(gguf_value_to_string(file_->find("n_layer")->value), "4");
  EXPECT_EQ(gguf_value_to_string(file_->find("neg")->value), "-3");
  EXPECT_EQ(gguf_value_to_string(file_->find("flag")->value), "true");
  EXPECT_EQ(gguf_value_to_string(file_->find("name")->value), "\"qwen35\"");
  EXPECT_EQ(gguf_value_to_string(file_->find("sections")->value), "[11, 11, 10, 0]");
  EXPECT_EQ(gguf_value_to_string(file_->find("tokens")->value), "[\"!\", \"\\\"\", \"hello\"]");
  // Long arrays are summarized with their count and the first elements.
  EXPECT_EQ(gguf_value_to_string(file_->find("tokens")->value, 2), "[3 strings: \"!\", ... ]");
}

TEST(GgufValueString, SummarizesLongStringArray) {
  std::vector<std::string> tokens(248320, "x");
  tokens[0] = "!";
  tokens[1] = "\"";
  GgufWriter w;
  w.set_array_string("tokenizer.ggml.tokens", tokens);
  auto bytes = w.write_to_memory();
  ASSERT_TRUE(bytes.is_ok());
  auto f = GgufFile::from_memory(*bytes);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(gguf_value_to_string((*f)->find("tokenizer.ggml.tokens")->value),
            "[248320 strings: \"!\", \"\\\"\", ... ]");
}

}  // namespace
}  // namespace ds
