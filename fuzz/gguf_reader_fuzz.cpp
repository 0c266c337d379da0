// libFuzzer target for the GGUF reader: parse arbitrary bytes, then exercise every getter on every
// key, render every value, touch the first and last byte of each tensor, check that tensor data is
// aligned and disjoint, and re-encode accepted files with the writer, requiring the reader to accept
// the copy unchanged.
// Non-obvious choice: the rewrite step turns "reader and writer disagree" into a crash the fuzzer
// can find, not only memory errors.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace {

volatile uint64_t g_sink = 0;
// Folds a value into g_sink so the reads it came from are not optimized away.
void keep(uint64_t v) { g_sink = g_sink ^ v; }

void require(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "gguf_reader_fuzz: invariant failed: %s\n", what);
    std::abort();
  }
}

void exercise_getters(const ds::GgufFile& f, std::string_view key) {
  keep(f.get_u32(key).is_ok());
  keep(f.get_i32(key).is_ok());
  keep(f.get_u64(key).is_ok());
  keep(f.get_f32(key).is_ok());
  keep(f.get_bool(key).is_ok());
  auto s = f.get_string(key);
  if (s.is_ok()) keep(s->size());
  auto sa = f.get_string_array(key);
  if (sa.is_ok()) {
    for (auto v : *sa) keep(v.empty() ? 0 : static_cast<uint8_t>(v.back()));
  }
  keep(f.get_i32_array(key).is_ok());
  keep(f.get_u32_array(key).is_ok());
  keep(f.get_f32_array(key).is_ok());
  keep(f.get_bool_array(key).is_ok());
  auto i = f.get_int(key);
  if (i.is_ok()) keep(static_cast<uint64_t>(*i));
  auto ia = f.get_int_array(key);
  if (ia.is_ok()) keep(ia->size());
}

// Re-encodes an accepted file; the reader must accept the copy with the same content.
void check_rewrite(const ds::GgufFile& f) {
  ds::GgufWriter w;
  for (const auto& kv : f.kvs()) w.set_value(kv.key, kv.value);
  w.set_alignment(f.alignment());
  for (const auto& t : f.tensors()) {
    const uint8_t* src = t.data;
    w.add_tensor(t.name, t.dtype, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                 [src](uint8_t* dst, uint64_t n) {
                   std::memcpy(dst, src, n);
                   return ds::Status::ok();
                 });
  }
  auto bytes = w.write_to_memory();
  require(bytes.is_ok(), "writer refused an accepted file");
  auto g = ds::GgufFile::from_memory(*bytes, "rewrite");
  if (!g.is_ok()) std::fprintf(stderr, "%s\n", g.status().to_string().c_str());
  require(g.is_ok(), "reader refused the writer's copy");
  const ds::GgufFile& c = **g;
  require(c.kvs().size() == f.kvs().size(), "kv count changed");
  require(c.tensors().size() == f.tensors().size(), "tensor count changed");
  for (size_t i = 0; i < f.kvs().size(); ++i) {
    require(c.kvs()[i].key == f.kvs()[i].key, "kv order changed");
    require(ds::gguf_value_to_string(c.kvs()[i].value, 1 << 20) ==
                ds::gguf_value_to_string(f.kvs()[i].value, 1 << 20),
            "kv value changed");
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& a = f.tensors()[i];
    const auto& b = c.tensors()[i];
    require(a.name == b.name && a.dtype == b.dtype && a.n_bytes == b.n_bytes, "tensor changed");
    require(std::memcmp(a.data, b.data, a.n_bytes) == 0, "tensor data changed");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = ds::GgufFile::from_memory({data, size}, "fuzz.gguf");
  if (!r.is_ok()) {
    require(!r.status().message().empty(), "error without a message");
    return 0;
  }
  const ds::GgufFile& f = **r;
  for (const auto& kv : f.kvs()) {
    require(f.find(kv.key) == &kv, "find() misses a key");
    exercise_getters(f, kv.key);
    keep(ds::gguf_value_to_string(kv.value).size());
    keep(ds::gguf_value_to_string(kv.value, 0).size());
  }
  exercise_getters(f, "absent.key");
  for (const auto& t : f.tensors()) {
    require(f.find_tensor(t.name) == &t, "find_tensor() misses a tensor");
    require(t.n_bytes > 0 && t.data != nullptr, "empty tensor accepted");
    require(t.data >= data && t.data + t.n_bytes <= data + size, "tensor data outside the input");
    keep(t.data[0] + t.data[t.n_bytes - 1]);
    keep(t.shape_string().size());
  }
  // The reader's placement guarantees, checked independently: aligned and pairwise disjoint.
  std::vector<const ds::GgufTensorInfo*> order;
  for (const auto& t : f.tensors()) {
    require(static_cast<uint64_t>(t.data - data) == f.data_offset() + t.offset, "data pointer");
    require(t.offset % f.alignment() == 0 && f.data_offset() % f.alignment() == 0, "alignment");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < order.size(); ++i) {
    require(order[i - 1]->data + order[i - 1]->n_bytes <= order[i]->data, "tensors overlap");
  }
  check_rewrite(f);
  return 0;
}
