// The transformers golden fixtures (tests/fixtures/golden, made by tools/golden): loading one, listing
// them, and converting one with `deltaserve convert` (DS_EXE) into a temporary GGUF file.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace ds::test {

struct GoldenFixture {
  std::string name;
  std::filesystem::path dir;
  std::vector<int32_t> prompt, greedy;
  int64_t vocab = 0;
  std::vector<float> logits;  // [prompt + n_decode, vocab]
  const float* row(int64_t i) const { return logits.data() + i * vocab; }
  std::span<const float> row_span(int64_t i) const { return {row(i), static_cast<size_t>(vocab)}; }
};

inline GoldenFixture load_golden_fixture(const std::filesystem::path& dir) {
  GoldenFixture f;
  f.name = dir.filename().string();
  f.dir = dir;
  std::ifstream js(dir / "golden.json");
  const auto j = nlohmann::json::parse(js);
  f.prompt = j["prompt"].get<std::vector<int32_t>>();
  f.greedy = j["greedy"].get<std::vector<int32_t>>();
  f.vocab = j["vocab_size"].get<int64_t>();
  f.logits.resize(static_cast<size_t>((f.prompt.size() + f.greedy.size()) * f.vocab));
  std::ifstream lb(dir / "logits.bin", std::ios::binary);
  lb.read(reinterpret_cast<char*>(f.logits.data()), static_cast<std::streamsize>(f.logits.size() * 4));
  EXPECT_EQ(lb.gcount(), static_cast<std::streamsize>(f.logits.size() * 4)) << dir;
  return f;
}

// Every fixture directory (one with a golden.json), sorted by name.
inline std::vector<std::filesystem::path> golden_fixture_dirs() {
  std::vector<std::filesystem::path> dirs;
  for (const auto& de : std::filesystem::directory_iterator(std::filesystem::path(DS_SOURCE_DIR) / "tests/fixtures/golden")) {
    if (std::filesystem::exists(de.path() / "golden.json")) dirs.push_back(de.path());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// `deltaserve convert` of the fixture to `type`; the file is named after the process, `tag` and the
// fixture, so parallel test processes never share it.
inline std::string convert_golden_fixture(const GoldenFixture& f, const std::string& type, const std::string& tag) {
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / fmt::format("{}-{}-{}-{}.gguf", tag, ::getpid(), f.name, type);
  const std::string cmd =
      fmt::format("{} convert {} {} --type {} >/dev/null 2>&1", DS_EXE, f.dir.string(), out.string(), type);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out.string();
}

}  // namespace ds::test
