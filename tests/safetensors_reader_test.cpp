// Tests for the safetensors reader and writer: a round trip through a file, and one hand-built file
// per validation rule. Broken files are assembled byte by byte so each breaks exactly one rule.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/half.h"
#include "safetensors/safetensors.h"

namespace ds {
namespace {

std::string temp_path(const std::string& leaf) {
  return std::string(DS_BINARY_DIR) + "/safetensors_test_" + leaf;
}

// 8-byte little-endian length + header text + data bytes.
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  const uint64_t n = header.size();
  std::vector<uint8_t> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = static_cast<uint8_t>(i);
  return out;
}

Status parse_status(const std::vector<uint8_t>& bytes) {
  auto r = SafetensorsFile::from_memory(bytes, "t.safetensors");
  return r.status();
}

void expect_error(const std::vector<uint8_t>& bytes, StatusCode code, const std::string& needle) {
  Status s = parse_status(bytes);
  ASSERT_FALSE(s.is_ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("t.safetensors"), std::string::npos) << s.to_string();
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(SafetensorsReader, RoundTripThroughFile) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.125f};
  std::vector<uint8_t> b16, h16;
  std::vector<float> b = {0.5f, -1.0f, 2.0f, 96.0f};
  for (float x : b) {
    uint16_t bf = f32_to_bf16(x), hf = f32_to_fp16(x);
    b16.push_back(bf & 0xff);
    b16.push_back(bf >> 8);
    h16.push_back(hf & 0xff);
    h16.push_back(hf >> 8);
  }
  std::vector<SafetensorsWriteTensor> ts = {
      {"z.first", DType::F32, {2, 3}, f32_bytes(a)},
      {"a.second", DType::BF16, {4}, b16},
      {"m.third", DType::F16, {2, 1, 2}, h16},
      {"empty", DType::F32, {0, 5}, {}},
  };
  const std::string path = temp_path("roundtrip.safetensors");
  ASSERT_TRUE(safetensors_write(path, ts, {{"format", "pt"}}).is_ok());
  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const SafetensorsFile& f = **r;
  ASSERT_EQ(f.tensors().size(), 4u);
  // File order is kept (not the alphabetical order of the JSON object).
  EXPECT_EQ(f.tensors()[0].name, "z.first");
  EXPECT_EQ(f.tensors()[1].name, "a.second");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const SafetensorsTensor* t = f.find("z.first");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> out(6);
  SafetensorsFile::to_f32(*t, out.data());
  EXPECT_EQ(out, a);
  for (const char* name : {"a.second", "m.third"}) {
    t = f.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->n_elements(), 4);
    std::vector<float> o(4);
    SafetensorsFile::to_f32(*t, o.data());
    EXPECT_EQ(o, b) << name;  // all values are exact in both 16-bit formats
  }
  EXPECT_EQ(f.find("empty")->n_elements(), 0);
  EXPECT_EQ(f.find("missing"), nullptr);
  std::remove(path.c_str());
}

TEST(SafetensorsReader, WriterRefusesWrongByteCount) {
  Status s = safetensors_write(temp_path("bad.safetensors"), {{"x", DType::F32, {3}, std::vector<uint8_t>(8)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(SafetensorsReader, TruncatedFile) {
  expect_error({1, 0, 0}, StatusCode::kCorrupt, "shorter than the 8-byte header length");
}

TEST(SafetensorsReader, HeaderLengthPastEnd) {
  auto bytes = make_file("{}", 0);
  bytes[0] = 200;
  expect_error(bytes, StatusCode::kCorrupt, "runs past the end of the file");
}

TEST(SafetensorsReader, TruncatedDataSection) {
  auto bytes = make_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16);
  bytes.resize(bytes.size() - 4);
  expect_error(bytes, StatusCode::kCorrupt, "outside the data section");
}

TEST(SafetensorsReader, BadJson) {
  expect_error(make_file(R"({"w": {"dtype": )", 0), StatusCode::kCorrupt, "not valid JSON");
  expect_error(make_file(R"([1, 2, 3])", 0), StatusCode::kCorrupt, "not an object");
}

TEST(SafetensorsReader, BadDtype) {
  expect_error(make_file(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16),
               StatusCode::kUnsupported, "tensor 'w': dtype I64");
  expect_error(make_file(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,16]}})", 16),
               StatusCode::kUnsupported, "dtype Q4");
}

TEST(SafetensorsReader, WrongByteSize) {
  expect_error(make_file(R"({"w":{"dtype":"F16","shape":[3,2],"data_offsets":[0,16]}})", 16),
               StatusCode::kCorrupt, "data is 16 bytes, expected 12");
}

TEST(SafetensorsReader, OffsetsOutside) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16),
               StatusCode::kCorrupt, "[8, 24) are outside the data section of 16 bytes");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[12,8]}})", 16),
               StatusCode::kCorrupt, "outside the data section");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 16),
               StatusCode::kCorrupt, "not a non-negative integer");
}

TEST(SafetensorsReader, Overlapping) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         16),
               StatusCode::kCorrupt, "tensors 'a' and 'b' overlap");
}

TEST(SafetensorsReader, NegativeDims) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})", 16),
               StatusCode::kCorrupt, "negative");
}

TEST(SafetensorsReader, ShapeOverflow) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16),
               StatusCode::kCorrupt, "overflows");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[3074457345618258603],"data_offsets":[0,16]}})", 16),
               StatusCode::kCorrupt, "overflows the byte count");
}

TEST(SafetensorsReader, DuplicateNames) {
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         8),
               StatusCode::kCorrupt, "'w' appears twice");
}

TEST(SafetensorsReader, MissingFields) {
  expect_error(make_file(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), StatusCode::kCorrupt, "'dtype'");
  expect_error(make_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), StatusCode::kCorrupt, "'shape'");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", 4), StatusCode::kCorrupt, "data_offsets");
  expect_error(make_file(R"({"__metadata__":{"k":1}})", 0), StatusCode::kCorrupt, "not a string");
}

// Every truncation and many random byte changes of a valid file: parse returns (ok or an error), and
// whatever it accepts stays inside the buffer.
TEST(SafetensorsReader, CorruptedFilesNeverCrash) {
  auto bytes = make_file(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                         R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}})",
                         24);
  ASSERT_TRUE(parse_status(bytes).is_ok());
  auto check_inside = [](const std::vector<uint8_t>& buf) {
    auto r = SafetensorsFile::from_memory(buf, "t.safetensors");
    if (!r.is_ok()) return;
    for (const auto& t : (*r)->tensors()) {
      EXPECT_GE(t.data, buf.data());
      EXPECT_LE(t.data + t.n_bytes, buf.data() + buf.size());
      std::vector<float> v(t.n_elements());
      SafetensorsFile::to_f32(t, v.data());
    }
  };
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    check_inside(cut);
  }
  uint32_t seed = 12345;
  auto next = [&seed] { return seed = seed * 1664525u + 1013904223u; };
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> m = bytes;
    const int n_changes = 1 + next() % 3;
    for (int c = 0; c < n_changes; ++c) m[next() % m.size()] = static_cast<uint8_t>(next() >> 24);
    check_inside(m);
  }
}

TEST(SafetensorsReader, MissingFileIsNotFound) {
  auto r = SafetensorsFile::open(temp_path("does_not_exist.safetensors"));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ds
