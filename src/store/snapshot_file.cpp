// Snapshot file encoding, atomic commit and verified reading. Every read is bounded by the file size
// before any allocation; sizes come from an untrusted disk.
#include "store/snapshot_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/host_memory.h"
#include "core/thread_pool.h"

namespace ds {
namespace {

std::atomic<int64_t> g_fail_after{-1};
std::atomic<int> g_fail_errno{0};
std::atomic<int64_t> g_written{0};
std::atomic<uint64_t> g_tmp_counter{0};

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Header field offsets (docs/FORMATS.md).
enum : size_t {
  kOffMagic = 0, kOffVersion = 8, kOffReaderVersion = 12, kOffFingerprintHash = 16,
  kOffFingerprintBytes = 24, kOffTokensCount = 32, kOffTokensChecksum = 40, kOffPayloadBytes = 48,
  kOffPayloadChecksum = 56, kOffCreated = 64, kOffPrefillMs = 72, kOffParentTokens = 80, kOffHeaderChecksum = 120,
};

Status write_all(int fd, const void* data, size_t n, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    size_t chunk = std::min<size_t>(n, 1 << 24);
    const int64_t limit = g_fail_after.load();
    if (limit >= 0) {
      const int64_t room = limit - g_written.load();
      if (room <= 0) return io_error("{}: write failed: {}", path, std::strerror(g_fail_errno.load()));
      chunk = std::min<size_t>(chunk, static_cast<size_t>(room));
    }
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("{}: write failed: {}", path, std::strerror(errno));
    }
    g_written += w;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

}  // namespace

void snapshot_file_inject_write_failure(int64_t after_bytes, int err) {
  g_written = 0;
  g_fail_errno = err;
  g_fail_after = after_bytes;
}

std::string snapshot_file_name(std::span<const int32_t> tokens) {
  const uint64_t h = XXH3_64bits(tokens.data(), tokens.size_bytes());
  return fmt::format("{:016x}-{}{}", h, tokens.size(), kSnapshotExtension);
}

std::string snapshot_file_parent_name(const SnapshotFileInfo& info) {
  if (info.parent_tokens == 0) return "";
  return snapshot_file_name(std::span<const int32_t>(info.tokens).first(static_cast<size_t>(info.parent_tokens)));
}

Status snapshot_file_write(const std::string& path, const std::string& fingerprint,
                           std::span<const int32_t> tokens, std::span<const uint8_t> payload,
                           double prefill_ms, uint64_t parent_tokens) {
  if (parent_tokens >= tokens.size() && parent_tokens > 0) {
    return invalid_argument("{}: a delta on {} tokens of a snapshot of {}", path, parent_tokens, tokens.size());
  }
  uint8_t header[kSnapshotHeaderBytes] = {};
  std::memcpy(header + kOffMagic, kSnapshotMagic, 8);
  const uint32_t version = parent_tokens > 0 ? 2 : 1;  // a whole state stays readable by version 1 readers
  put_u32(header + kOffVersion, version);
  put_u32(header + kOffReaderVersion, version);
  put_u64(header + kOffParentTokens, parent_tokens);
  put_u64(header + kOffFingerprintHash, XXH3_64bits(fingerprint.data(), fingerprint.size()));
  put_u32(header + kOffFingerprintBytes, static_cast<uint32_t>(fingerprint.size()));
  put_u64(header + kOffTokensCount, tokens.size());
  put_u64(header + kOffTokensChecksum, XXH3_64bits(tokens.data(), tokens.size_bytes()));
  put_u64(header + kOffPayloadBytes, payload.size());
  put_u64(header + kOffPayloadChecksum, XXH3_64bits(payload.data(), payload.size()));
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  put_u64(header + kOffCreated, static_cast<uint64_t>(now_ms));
  uint64_t ms_bits;
  std::memcpy(&ms_bits, &prefill_ms, 8);
  put_u64(header + kOffPrefillMs, ms_bits);
  put_u64(header + kOffHeaderChecksum, XXH3_64bits(header, kOffHeaderChecksum));

  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string tmp = (target.parent_path() / fmt::format(".tmp-{}-{}-{}", target.filename().string(),
                                                              ::getpid(), g_tmp_counter++)).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("{}: cannot create: {}", tmp, std::strerror(errno));
  Status st = write_all(fd, header, sizeof(header), tmp);
  if (st.is_ok()) st = write_all(fd, fingerprint.data(), fingerprint.size(), tmp);
  if (st.is_ok()) st = write_all(fd, tokens.data(), tokens.size_bytes(), tmp);
  if (st.is_ok()) st = write_all(fd, payload.data(), payload.size(), tmp);
  if (st.is_ok() && ::fsync(fd) != 0) st = io_error("{}: fsync failed: {}", tmp, std::strerror(errno));
  if (::close(fd) != 0 && st.is_ok()) st = io_error("{}: close failed: {}", tmp, std::strerror(errno));
  if (st.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = io_error("{}: rename failed: {}", path, std::strerror(errno));
  }
  if (!st.is_ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  // Make the rename durable.
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok();
}

Result<SnapshotFileInfo> snapshot_file_read_info(const std::string& path,
                                                 const std::string& expected_fingerprint) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("{}: cannot open: {}", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error("{}: cannot stat: {}", path, std::strerror(errno));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  uint8_t header[kSnapshotHeaderBytes];
  if (file_bytes < kSnapshotHeaderBytes) {
    return corrupt("{}: truncated: {} bytes, the header alone is {}", path, file_bytes, kSnapshotHeaderBytes);
  }
  if (::pread(fd, header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    return io_error("{}: cannot read header", path);
  }
  if (std::memcmp(header, kSnapshotMagic, 8) != 0) return corrupt("{}: offset 0: bad magic, not a snapshot file", path);
  if (get_u64(header + kOffHeaderChecksum) != XXH3_64bits(header, kOffHeaderChecksum)) {
    return corrupt("{}: offset {}: header checksum mismatch", path, kOffHeaderChecksum);
  }
  SnapshotFileInfo info;
  info.path = path;
  info.file_bytes = file_bytes;
  info.format_version = get_u32(header + kOffVersion);
  const uint32_t reader_version = get_u32(header + kOffReaderVersion);
  if (reader_version > kSnapshotFormatVersion) {
    return unsupported("{}: written by a newer deltaserve (needs reader version {}, this build reads {}); "
                       "upgrade or prune the cache", path, reader_version, kSnapshotFormatVersion);
  }
  const uint64_t fp_bytes = get_u32(header + kOffFingerprintBytes);
  const uint64_t n_tokens = get_u64(header + kOffTokensCount);
  const uint64_t payload_bytes = get_u64(header + kOffPayloadBytes);
  uint64_t rest = file_bytes - kSnapshotHeaderBytes;
  if (fp_bytes > rest) return corrupt("{}: fingerprint of {} bytes runs past the end", path, fp_bytes);
  rest -= fp_bytes;
  if (n_tokens > rest / 4) return corrupt("{}: {} tokens run past the end of the file", path, n_tokens);
  rest -= n_tokens * 4;
  if (payload_bytes != rest) {
    return corrupt("{}: payload is {} bytes but {} remain (truncated or padded)", path, payload_bytes, rest);
  }
  info.fingerprint.resize(fp_bytes);
  if (fp_bytes && ::pread(fd, info.fingerprint.data(), fp_bytes, kSnapshotHeaderBytes) != static_cast<ssize_t>(fp_bytes)) {
    return io_error("{}: cannot read fingerprint", path);
  }
  if (XXH3_64bits(info.fingerprint.data(), fp_bytes) != get_u64(header + kOffFingerprintHash)) {
    return corrupt("{}: fingerprint checksum mismatch", path);
  }
  if (!expected_fingerprint.empty() && info.fingerprint != expected_fingerprint) {
    return invalid_argument("{}: snapshot of another model or layout ({}), expected ({})", path,
                            info.fingerprint, expected_fingerprint);
  }
  info.tokens.resize(n_tokens);
  const uint64_t tok_off = kSnapshotHeaderBytes + fp_bytes;
  if (n_tokens && ::pread(fd, info.tokens.data(), n_tokens * 4, static_cast<off_t>(tok_off)) != static_cast<ssize_t>(n_tokens * 4)) {
    return io_error("{}: cannot read tokens", path);
  }
  if (XXH3_64bits(info.tokens.data(), n_tokens * 4) != get_u64(header + kOffTokensChecksum)) {
    return corrupt("{}: offset {}: token checksum mismatch", path, tok_off);
  }
  info.payload_offset = tok_off + n_tokens * 4;
  info.payload_bytes = payload_bytes;
  info.payload_checksum = get_u64(header + kOffPayloadChecksum);
  info.parent_tokens = get_u64(header + kOffParentTokens);
  if (info.parent_tokens >= std::max<uint64_t>(n_tokens, 1) || (info.parent_tokens > 0 && reader_version < 2)) {
    return corrupt("{}: offset {}: a delta on {} tokens in a snapshot of {} (reader version {})", path,
                   static_cast<size_t>(kOffParentTokens), info.parent_tokens, n_tokens, reader_version);
  }
  info.created_unix_ms = static_cast<int64_t>(get_u64(header + kOffCreated));
  const uint64_t ms_bits = get_u64(header + kOffPrefillMs);
  std::memcpy(&info.prefill_ms, &ms_bits, 8);
  return info;
}

Result<std::vector<uint8_t>> snapshot_file_read_payload(const SnapshotFileInfo& info) {
  // Read into one buffer backed by huge pages where the system allows (no page fault per 4 KiB, of
  // the file's mapping or of the buffer), then verified there.
  const int fd = ::open(info.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("{}: cannot open: {}", info.path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error("{}: cannot stat: {}", info.path, std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) != info.file_bytes) {
    return corrupt("{}: file changed size since it was indexed ({} -> {} bytes)", info.path, info.file_bytes,
                   static_cast<uint64_t>(st.st_size));
  }
  std::vector<uint8_t> out;
  out.reserve(info.payload_bytes);
  advise_huge_pages(out.data(), out.capacity());
  out.resize(info.payload_bytes);
  // Pieces of 16 MiB read on several threads (one thread copies from the page cache at a fraction of
  // the memory bandwidth); the first failure is reported.
  constexpr uint64_t kPiece = uint64_t{16} << 20;
  const int64_t n_pieces = static_cast<int64_t>((info.payload_bytes + kPiece - 1) / kPiece);
  std::vector<Status> failed(static_cast<size_t>(n_pieces), Status::ok());
  host_parallel_for(n_pieces, [&](int64_t begin, int64_t end, int) {
    for (int64_t k = begin; k < end; ++k) {
      const uint64_t first = static_cast<uint64_t>(k) * kPiece;
      const uint64_t last = std::min(info.payload_bytes, first + kPiece);
      for (uint64_t done = first; done < last;) {
        const ssize_t got = ::pread(fd, out.data() + done, static_cast<size_t>(last - done),
                                    static_cast<off_t>(info.payload_offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          failed[static_cast<size_t>(k)] = io_error("{}: cannot read the payload at offset {}: {}", info.path,
                                                     info.payload_offset + done,
                                                     got < 0 ? std::strerror(errno) : "unexpected end of file");
          break;
        }
        done += static_cast<uint64_t>(got);
      }
    }
  });
  for (const Status& f : failed) DS_TRY(f);
  if (XXH3_64bits(out.data(), out.size()) != info.payload_checksum) {
    return corrupt("{}: offset {}: payload checksum mismatch", info.path, info.payload_offset);
  }
  return out;
}

}  // namespace ds
