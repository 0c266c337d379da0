// `deltaserve inspect FILE.gguf [--json]`: header, every metadata key and the tensor table of a GGUF.
// Non-obvious choice: long strings (the chat template) are cut at a UTF-8 character boundary and long
// arrays summarized, in text and JSON alike, so the output of a 250k-token vocab stays a page long.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "gguf/gguf.h"

namespace {

constexpr size_t kMaxStringBytes = 160;  // longer strings are shown truncated
constexpr size_t kMaxArrayElems = 8;     // longer arrays are summarized

struct Options {
  std::string path;
  bool json = false;
};

// Cuts `s` to at most `max` bytes without splitting a UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

std::string render_value(const ds::GgufValue& v, bool* truncated) {
  *truncated = false;
  if (v.type == ds::GgufType::STRING && v.str.size() > kMaxStringBytes) {
    ds::GgufValue cut = v;
    cut.str = utf8_prefix(v.str, kMaxStringBytes);
    *truncated = true;
    return ds::gguf_value_to_string(cut, kMaxArrayElems) + fmt::format("... ({} bytes)", v.str.size());
  }
  return ds::gguf_value_to_string(v, kMaxArrayElems);
}

std::string type_string(const ds::GgufValue& v) {
  if (v.type != ds::GgufType::ARRAY) return ds::gguf_type_name(v.type);
  return fmt::format("array[{}]", ds::gguf_type_name(v.elem_type));
}

// "1.50 GiB" style, for the totals.
std::string human_bytes(uint64_t n) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", v, kUnits[u]);
}

struct Totals {
  int64_t n_tensors = 0;
  uint64_t n_bytes = 0;
};

std::map<std::string, Totals> totals_by_type(const ds::GgufFile& f, Totals* all) {
  std::map<std::string, Totals> by_type;
  for (const auto& t : f.tensors()) {
    Totals& tt = by_type[ds::dtype_name(t.dtype)];
    tt.n_tensors++;
    tt.n_bytes += t.n_bytes;
    all->n_tensors++;
    all->n_bytes += t.n_bytes;
  }
  return by_type;
}

void print_text(const ds::GgufFile& f) {
  std::printf("file: %s\n", f.name().c_str());
  std::printf("gguf version: %u\nalignment: %u\nfile size: %lu bytes\ndata offset: %lu\n", f.version(),
              f.alignment(), static_cast<unsigned long>(f.file_size()),
              static_cast<unsigned long>(f.data_offset()));
  std::printf("metadata: %zu keys\ntensors: %zu\n\n", f.kvs().size(), f.tensors().size());
  size_t key_width = 3;
  for (const auto& kv : f.kvs()) key_width = std::max(key_width, kv.key.size());
  std::printf("%-*s  %-14s  %s\n", static_cast<int>(key_width), "key", "type", "value");
  for (const auto& kv : f.kvs()) {
    bool truncated = false;
    std::printf("%-*s  %-14s  %s\n", static_cast<int>(key_width), kv.key.c_str(),
                type_string(kv.value).c_str(), render_value(kv.value, &truncated).c_str());
  }
  size_t name_width = 4;
  for (const auto& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  std::printf("\n%-*s  %-5s  %-28s  %14s  %14s\n", static_cast<int>(name_width), "name", "type", "shape",
              "bytes", "offset");
  for (const auto& t : f.tensors()) {
    std::printf("%-*s  %-5s  %-28s  %14lu  %14lu\n", static_cast<int>(name_width), t.name.c_str(),
                ds::dtype_name(t.dtype), t.shape_string().c_str(), static_cast<unsigned long>(t.n_bytes),
                static_cast<unsigned long>(f.data_offset() + t.offset));
  }
  Totals all;
  const auto by_type = totals_by_type(f, &all);
  std::printf("\ntotals:\n");
  for (const auto& [type, tt] : by_type) {
    std::printf("  %-5s  %6ld tensors  %14lu bytes  (%s)\n", type.c_str(),
                static_cast<long>(tt.n_tensors), static_cast<unsigned long>(tt.n_bytes),
                human_bytes(tt.n_bytes).c_str());
  }
  std::printf("  %-5s  %6ld tensors  %14lu bytes  (%s)\n", "all", static_cast<long>(all.n_tensors),
              static_cast<unsigned long>(all.n_bytes), human_bytes(all.n_bytes).c_str());
}

nlohmann::json scalar_json(const ds::GgufValue& v) {
  using ds::GgufType;
  switch (v.type) {
    case GgufType::U8: case GgufType::U16: case GgufType::U32: case GgufType::U64: return v.num.u64;
    case GgufType::I8: case GgufType::I16: case GgufType::I32: case GgufType::I64: return v.num.i64;
    case GgufType::F32: case GgufType::F64: return v.num.f64;
    case GgufType::BOOL: return v.num.u64 != 0;
    default: return nullptr;
  }
}

void print_json(const ds::GgufFile& f) {
  nlohmann::json j;
  j["file"] = f.name();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["file_size"] = f.file_size();
  j["data_offset"] = f.data_offset();
  j["n_kv"] = f.kvs().size();
  j["n_tensors"] = f.tensors().size();
  nlohmann::json md = nlohmann::json::array();
  for (const auto& kv : f.kvs()) {
    nlohmann::json e;
    e["key"] = kv.key;
    e["type"] = type_string(kv.value);
    if (kv.value.type == ds::GgufType::STRING) {
      const bool cut = kv.value.str.size() > kMaxStringBytes;
      e["value"] = std::string(utf8_prefix(kv.value.str, kMaxStringBytes));
      e["length"] = kv.value.str.size();
      e["truncated"] = cut;
    } else if (kv.value.type == ds::GgufType::ARRAY) {
      e["n_elems"] = kv.value.n_elems;
      e["value"] = ds::gguf_value_to_string(kv.value, kMaxArrayElems);
    } else {
      e["value"] = scalar_json(kv.value);
    }
    md.push_back(std::move(e));
  }
  j["metadata"] = std::move(md);
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : f.tensors()) {
    nlohmann::json shape = nlohmann::json::array();
    for (int d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
    tensors.push_back({{"name", t.name}, {"type", ds::dtype_name(t.dtype)}, {"shape", shape},
                       {"n_bytes", t.n_bytes}, {"offset", f.data_offset() + t.offset}});
  }
  j["tensors"] = std::move(tensors);
  Totals all;
  nlohmann::json totals = nlohmann::json::object();
  for (const auto& [type, tt] : totals_by_type(f, &all)) {
    totals[type] = {{"n_tensors", tt.n_tensors}, {"n_bytes", tt.n_bytes}};
  }
  j["totals"] = std::move(totals);
  j["total_bytes"] = all.n_bytes;
  // Strings come from the file and may be invalid UTF-8: replace rather than throw.
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

void setup(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<Options>();
  app.add_option("file", opts->path, "GGUF file to inspect")->required();
  app.add_flag("--json", opts->json, "Print the same information as JSON");
  app.callback([opts, &exit_code] {
    auto file = ds::GgufFile::open(opts->path);
    if (!file.is_ok()) {
      exit_code = ds::cli::report(file.status());
      return;
    }
    if (opts->json) {
      print_json(**file);
    } else {
      print_text(**file);
    }
    exit_code = 0;
  });
}

ds::cli::Registration reg("inspect", "Print the metadata and tensor table of a GGUF file", setup);

}  // namespace
