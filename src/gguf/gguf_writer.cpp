// GGUF v3 writer: metadata encoded at set time, tensor data streamed one tensor at a time.
// Non-obvious choice: the file and the in-memory image go through one ByteSink path, so the bytes
// write_to_memory() returns in tests are exactly the bytes write() puts on disk.
#include "gguf/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "core/check.h"

namespace ds {

struct GgufWriter::Kv {
  std::string key;
  std::vector<uint8_t> encoded;  // u32 value type followed by the value
};

struct GgufWriter::Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> ne;
  uint64_t n_bytes = 0;
  FillFn fill;
};

namespace {

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  if (n > 0) std::memcpy(out.data() + at, p, n);
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

template <typename T>
std::vector<uint8_t> encode_scalar(GgufType type, T v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(type));
  put<T>(out, v);
  return out;
}

template <typename T>
std::vector<uint8_t> encode_array(GgufType elem, const std::vector<T>& v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(GgufType::ARRAY));
  put<uint32_t>(out, static_cast<uint32_t>(elem));
  put<uint64_t>(out, v.size());
  for (const T& x : v) put<T>(out, x);
  return out;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

// Destination of the serialized bytes: a file descriptor or a vector.
class GgufByteSink {
 public:
  virtual ~GgufByteSink() = default;
  virtual Status write(const uint8_t* p, uint64_t n) = 0;
  Status write(const std::vector<uint8_t>& v) { return write(v.data(), v.size()); }
  Status pad_to(uint64_t pos, uint64_t alignment, uint64_t* written) {
    static const uint8_t kZeros[256] = {};
    uint64_t pad = align_up(pos, alignment) - pos;
    *written = pad;
    while (pad > 0) {
      const uint64_t n = std::min<uint64_t>(pad, sizeof(kZeros));
      DS_TRY(write(kZeros, n));
      pad -= n;
    }
    return Status::ok();
  }
};

namespace {

class MemorySink : public GgufByteSink {
 public:
  Status write(const uint8_t* p, uint64_t n) override {
    put_bytes(out, p, n);
    return Status::ok();
  }
  std::vector<uint8_t> out;
};

class FileSink : public GgufByteSink {
 public:
  FileSink(int fd, const std::string& path) : fd_(fd), path_(path) {}
  Status write(const uint8_t* p, uint64_t n) override {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<uint64_t>(n, uint64_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        return io_error("{}: write of {} bytes at offset {} failed: {}", path_, n, pos_,
                        std::strerror(errno));
      }
      p += w;
      n -= static_cast<uint64_t>(w);
      pos_ += static_cast<uint64_t>(w);
    }
    return Status::ok();
  }

 private:
  int fd_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

// Removes the temporary file unless the write committed.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::string path) : path_(std::move(path)) {}
  ~TempFileGuard() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  int fd_ = -1;
  bool committed_ = false;

 private:
  std::string path_;
};

Status fsync_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error("{}: cannot open directory for fsync: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return io_error("{}: fsync of directory failed: {}", dir, std::strerror(err));
  return Status::ok();
}

}  // namespace

// ---- metadata ----

namespace {

void upsert(std::vector<std::shared_ptr<GgufWriter::Kv>>& kvs, const std::string& key,
            std::vector<uint8_t> encoded) {
  // A fresh entry rather than an edit in place: copies of a writer share their entries.
  auto fresh = std::make_shared<GgufWriter::Kv>();
  fresh->key = key;
  fresh->encoded = std::move(encoded);
  for (auto& kv : kvs) {
    if (kv->key == key) {
      kv = std::move(fresh);
      return;
    }
  }
  kvs.push_back(std::move(fresh));
}

}  // namespace

void GgufWriter::set_alignment(uint32_t alignment) {
  DS_CHECK(alignment != 0 && (alignment & (alignment - 1)) == 0, "alignment {} is not a power of two",
           alignment);
  alignment_ = alignment;
  bool present = false;
  for (const auto& kv : kvs_) present = present || kv->key == "general.alignment";
  if (alignment != kGgufDefaultAlignment || present) set_u32("general.alignment", alignment);
}

void GgufWriter::set_u8(const std::string& k, uint8_t v) { upsert(kvs_, k, encode_scalar(GgufType::U8, v)); }
void GgufWriter::set_i8(const std::string& k, int8_t v) { upsert(kvs_, k, encode_scalar(GgufType::I8, v)); }
void GgufWriter::set_u16(const std::string& k, uint16_t v) { upsert(kvs_, k, encode_scalar(GgufType::U16, v)); }
void GgufWriter::set_i16(const std::string& k, int16_t v) { upsert(kvs_, k, encode_scalar(GgufType::I16, v)); }
void GgufWriter::set_u32(const std::string& k, uint32_t v) { upsert(kvs_, k, encode_scalar(GgufType::U32, v)); }
void GgufWriter::set_i32(const std::string& k, int32_t v) { upsert(kvs_, k, encode_scalar(GgufType::I32, v)); }
void GgufWriter::set_u64(const std::string& k, uint64_t v) { upsert(kvs_, k, encode_scalar(GgufType::U64, v)); }
void GgufWriter::set_i64(const std::string& k, int64_t v) { upsert(kvs_, k, encode_scalar(GgufType::I64, v)); }
void GgufWriter::set_f32(const std::string& k, float v) { upsert(kvs_, k, encode_scalar(GgufType::F32, v)); }
void GgufWriter::set_f64(const std::string& k, double v) { upsert(kvs_, k, encode_scalar(GgufType::F64, v)); }
void GgufWriter::set_bool(const std::string& k, bool v) {
  upsert(kvs_, k, encode_scalar(GgufType::BOOL, static_cast<uint8_t>(v ? 1 : 0)));
}

void GgufWriter::set_string(const std::string& k, const std::string& v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(GgufType::STRING));
  put_string(out, v);
  upsert(kvs_, k, std::move(out));
}

void GgufWriter::set_array_u32(const std::string& k, const std::vector<uint32_t>& v) {
  upsert(kvs_, k, encode_array(GgufType::U32, v));
}
void GgufWriter::set_array_i32(const std::string& k, const std::vector<int32_t>& v) {
  upsert(kvs_, k, encode_array(GgufType::I32, v));
}
void GgufWriter::set_array_f32(const std::string& k, const std::vector<float>& v) {
  upsert(kvs_, k, encode_array(GgufType::F32, v));
}

void GgufWriter::set_array_bool(const std::string& k, const std::vector<bool>& v) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  upsert(kvs_, k, encode_array(GgufType::BOOL, bytes));
}

void GgufWriter::set_array_string(const std::string& k, const std::vector<std::string>& v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(GgufType::ARRAY));
  put<uint32_t>(out, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(out, v.size());
  for (const std::string& s : v) put_string(out, s);
  upsert(kvs_, k, std::move(out));
}

namespace {

// Appends `v` without its type tag (array elements carry none).
void encode_payload(std::vector<uint8_t>& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::BOOL: put<uint8_t>(out, v.num.u64 != 0 ? 1 : 0); return;
    case GgufType::U8: case GgufType::I8: put<uint8_t>(out, static_cast<uint8_t>(v.num.u64)); return;
    case GgufType::U16: case GgufType::I16: put<uint16_t>(out, static_cast<uint16_t>(v.num.u64)); return;
    case GgufType::U32: case GgufType::I32: put<uint32_t>(out, static_cast<uint32_t>(v.num.u64)); return;
    case GgufType::U64: case GgufType::I64: put<uint64_t>(out, v.num.u64); return;
    case GgufType::F32: put<float>(out, static_cast<float>(v.num.f64)); return;
    case GgufType::F64: put<double>(out, v.num.f64); return;
    case GgufType::STRING: put_string(out, v.str); return;
    case GgufType::ARRAY: break;
  }
  put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
  put<uint64_t>(out, v.n_elems);
  const size_t size = gguf_scalar_size(v.elem_type);
  if (size > 0) {
    DS_CHECK(v.n_elems == 0 || v.raw != nullptr, "scalar array without a payload");
    put_bytes(out, v.raw, v.n_elems * size);
    return;
  }
  DS_CHECK(v.elems.size() == v.n_elems, "array declares {} elements, holds {}", v.n_elems,
           v.elems.size());
  for (const GgufValue& e : v.elems) {
    DS_CHECK(e.type == v.elem_type, "array element of type {} in an array of {}",
             gguf_type_name(e.type), gguf_type_name(v.elem_type));
    encode_payload(out, e);
  }
}

}  // namespace

void GgufWriter::set_value(const std::string& key, const GgufValue& v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(v.type));
  encode_payload(out, v);
  upsert(kvs_, key, std::move(out));
}

// ---- tensors ----

void GgufWriter::add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& ne,
                            FillFn fill) {
  DS_CHECK(!ne.empty() && ne.size() <= 4, "tensor '{}': {} dims (expected 1..4)", name, ne.size());
  auto t = std::make_shared<Tensor>();
  t->name = name;
  t->dtype = dtype;
  t->ne = ne;
  t->fill = std::move(fill);
  uint64_t n_bytes = static_cast<uint64_t>(dtype_row_bytes(dtype, ne[0]));  // checks the block size
  for (size_t d = 0; d < ne.size(); ++d) {
    DS_CHECK(ne[d] > 0, "tensor '{}': ne[{}] = {} must be positive", name, d, ne[d]);
    if (d > 0) {
      DS_CHECK(!__builtin_mul_overflow(n_bytes, static_cast<uint64_t>(ne[d]), &n_bytes),
               "tensor '{}': byte size overflows", name);
    }
  }
  t->n_bytes = n_bytes;
  tensors_.push_back(std::move(t));
}

size_t GgufWriter::n_tensors() const { return tensors_.size(); }

uint64_t GgufWriter::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t->n_bytes;
  return total;
}

// ---- serialization ----

Status GgufWriter::write_to(GgufByteSink& sink, const std::string& name,
                            const ProgressFn& progress) const {
  // Header, metadata and tensor table: small next to the data, built in memory.
  std::vector<uint8_t> head;
  put<uint32_t>(head, kGgufMagic);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kvs_.size());
  for (const auto& kv : kvs_) {
    if (kv->key == "general.alignment") {
      uint32_t stored = 0;
      if (kv->encoded.size() == 8) std::memcpy(&stored, kv->encoded.data() + 4, 4);
      if (kv->encoded.size() != 8 || kv->encoded[0] != static_cast<uint8_t>(GgufType::U32) ||
          stored != alignment_) {
        return invalid_argument("{}: general.alignment disagrees with the writer alignment {} (use "
                                "set_alignment)",
                                name, alignment_);
      }
    }
    put_string(head, kv->key);
    put_bytes(head, kv->encoded.data(), kv->encoded.size());
  }
  std::unordered_set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    if (!names.insert(t->name).second) {
      return invalid_argument("{}: duplicate tensor name '{}'", name, t->name);
    }
    put_string(head, t->name);
    put<uint32_t>(head, static_cast<uint32_t>(t->ne.size()));
    for (int64_t n : t->ne) put<uint64_t>(head, static_cast<uint64_t>(n));
    put<uint32_t>(head, static_cast<uint32_t>(t->dtype));
    put<uint64_t>(head, offset);
    offset = align_up(offset + t->n_bytes, alignment_);
  }
  DS_TRY(sink.write(head));
  uint64_t pos = head.size(), pad = 0;
  DS_TRY(sink.pad_to(pos, alignment_, &pad));
  pos += pad;

  // Data: one reusable buffer, grown to the largest tensor, never the whole file.
  const uint64_t total_bytes = total_tensor_bytes();
  uint64_t bytes_done = 0;
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = *tensors_[i];
    // Growing: drop the old block first, so the peak is the largest tensor, not two of them.
    if (t.n_bytes > buf.capacity()) std::vector<uint8_t>().swap(buf);
    buf.resize(t.n_bytes);
    std::memset(buf.data(), 0, buf.size());
    if (t.fill) {
      Status st = t.fill(buf.data(), t.n_bytes);
      if (!st.is_ok()) return st.with_context(fmt::format("{}: tensor '{}'", name, t.name));
    }
    DS_TRY(sink.write(buf.data(), t.n_bytes));
    DS_TRY(sink.pad_to(pos + t.n_bytes, alignment_, &pad));
    pos += t.n_bytes + pad;
    bytes_done += t.n_bytes;
    if (progress) progress(i + 1, tensors_.size(), bytes_done, total_bytes);
  }
  return Status::ok();
}

Result<std::vector<uint8_t>> GgufWriter::write_to_memory() const {
  MemorySink sink;
  DS_TRY(write_to(sink, "<memory>", {}));
  return std::move(sink.out);
}

Status GgufWriter::write(const std::string& path, const ProgressFn& progress) const {
  const std::string tmp = path + ".tmp";
  TempFileGuard guard(tmp);
  guard.fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (guard.fd_ < 0) return io_error("{}: cannot create: {}", tmp, std::strerror(errno));
  FileSink sink(guard.fd_, tmp);
  DS_TRY(write_to(sink, tmp, progress));
  if (::fsync(guard.fd_) != 0) return io_error("{}: fsync failed: {}", tmp, std::strerror(errno));
  const int fd = guard.fd_;
  guard.fd_ = -1;
  if (::close(fd) != 0) return io_error("{}: close failed: {}", tmp, std::strerror(errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return io_error("{}: rename to {} failed: {}", tmp, path, std::strerror(errno));
  }
  guard.committed_ = true;
  return fsync_dir(path);
}

}  // namespace ds
