// DiskSnapshotStore: one writer thread drains a bounded queue; the index maps token prefixes to file
// entries. Loads happen on the caller's thread.
#include "store/disk_store.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/log.h"

namespace ds {
namespace fs = std::filesystem;

DiskSnapshotStore::DiskSnapshotStore(DiskStoreOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<DiskSnapshotStore>> DiskSnapshotStore::open(const DiskStoreOptions& options) {
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return io_error("{}: cannot create snapshot directory: {}", options.dir, ec.message());
  if (!fs::is_directory(options.dir, ec)) return invalid_argument("{}: not a directory", options.dir);
  // Probe writability once so a read-only directory is reported at startup, not per request.
  const fs::path probe = fs::path(options.dir) / ".write-probe";
  {
    FILE* f = std::fopen(probe.c_str(), "wb");
    if (!f) return io_error("{}: directory is not writable", options.dir);
    std::fclose(f);
    fs::remove(probe, ec);
  }
  std::unique_ptr<DiskSnapshotStore> store(new DiskSnapshotStore(options));
  store->index_directory();
  store->writer_ = std::thread([s = store.get()] { s->writer_loop(); });
  return store;
}

DiskSnapshotStore::~DiskSnapshotStore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void DiskSnapshotStore::index_directory() {
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = de.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0) {  // an interrupted write: never committed
      fs::remove(de.path(), ec);
      continue;
    }
    if (!de.is_regular_file() || de.path().extension() != kSnapshotExtension) continue;
    auto info = snapshot_file_read_info(de.path().string(), options_.fingerprint);
    if (!info.is_ok()) {
      quarantine(de.path().string(), info.status());
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    add_locked(std::move(info).value());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  evict_to_budget_locked();
  DS_LOG_INFO("snapshot store {}: {} files, {} MiB", options_.dir, stats_.files, stats_.bytes >> 20);
}

void DiskSnapshotStore::add_locked(SnapshotFileInfo info) {
  const std::string name = fs::path(info.path).filename().string();
  if (by_name_.count(name)) remove_locked(name);
  const int64_t id = next_id_++;
  index_.insert(info.tokens, id);
  stats_.files++;
  stats_.bytes += info.file_bytes;
  by_name_[name] = id;
  entries_.emplace(id, Entry{std::move(info), ++clock_});
}

void DiskSnapshotStore::remove_locked(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;
  auto e = entries_.find(it->second);
  index_.erase(e->second.info.tokens);
  stats_.files--;
  stats_.bytes -= e->second.info.file_bytes;
  entries_.erase(e);
  by_name_.erase(it);
}

void DiskSnapshotStore::quarantine(const std::string& path, const Status& why) {
  DS_LOG_WARN("snapshot store: skipping {}: {}", path, why.to_string());
  std::error_code ec;
  const fs::path qdir = fs::path(options_.dir) / "quarantine";
  fs::create_directories(qdir, ec);
  const fs::path moved = qdir / fs::path(path).filename();
  fs::rename(path, moved, ec);
  if (ec) {
    fs::remove(path, ec);
  } else {
    fs::last_write_time(moved, fs::file_time_type::clock::now(), ec);  // order by time of quarantine
    prune_quarantine(qdir.string());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.quarantined++;
  remove_locked(fs::path(path).filename().string());
}

// Keeps the newest kQuarantineKeepFiles files of the quarantine (at most budget / 4 bytes of them
// under a budget) and deletes the rest. Errors are ignored: the folder is only kept for inspection.
void DiskSnapshotStore::prune_quarantine(const std::string& qdir) {
  struct File {
    fs::path path;
    fs::file_time_type time;
    uintmax_t bytes;
  };
  std::vector<File> files;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(qdir, ec)) {
    std::error_code e1, e2;
    if (!de.is_regular_file(e1)) continue;
    files.push_back({de.path(), de.last_write_time(e1), de.file_size(e2)});
  }
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.time > b.time; });
  uint64_t kept_bytes = 0;
  int kept = 0;
  for (const File& f : files) {
    const bool fits = options_.budget_bytes == 0 || kept_bytes + f.bytes <= options_.budget_bytes / 4;
    if (kept < kQuarantineKeepFiles && fits) {
      ++kept;
      kept_bytes += f.bytes;
      continue;
    }
    fs::remove(f.path, ec);
    DS_LOG_INFO("snapshot store: deleted {} from the quarantine (it keeps {} files)", f.path.string(),
                kQuarantineKeepFiles);
  }
}

void DiskSnapshotStore::evict_to_budget_locked() {
  if (options_.budget_bytes == 0) return;
  while (stats_.bytes > options_.budget_bytes && !entries_.empty()) {
    auto victim = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.last_used < victim->second.last_used) victim = it;
    }
    const std::string path = victim->second.info.path;
    remove_locked(fs::path(path).filename().string());
    std::error_code ec;
    fs::remove(path, ec);
    stats_.evictions++;
  }
}

void DiskSnapshotStore::put_async(std::shared_ptr<const Snapshot> snapshot) {
  if (!snapshot) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (by_name_.count(snapshot_file_name(snapshot->tokens))) return;
    if (queue_.size() >= options_.max_pending_writes) {
      stats_.dropped_writes++;
      return;
    }
    queue_.push_back(std::move(snapshot));
  }
  cv_.notify_all();
}

void DiskSnapshotStore::writer_loop() {
  for (;;) {
    std::shared_ptr<const Snapshot> snap;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      snap = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const std::string path = (fs::path(options_.dir) / snapshot_file_name(snap->tokens)).string();
    Result<std::vector<uint8_t>> joined = std::vector<uint8_t>{};
    if (snap->parent) {
      joined = options_.whole_stream ? options_.whole_stream(*snap)
                                     : Result<std::vector<uint8_t>>(unsupported("a delta snapshot and no joiner"));
    }
    Status st = !joined.is_ok() ? joined.status()
                                : snapshot_file_write(path, options_.fingerprint, snap->tokens,
                                                      snap->parent ? std::span<const uint8_t>(*joined)
                                                                   : std::span<const uint8_t>(snap->state),
                                                      snap->prefill_ms);
    joined = std::vector<uint8_t>{};  // a whole stream can be GBs: not kept while indexing
    Result<SnapshotFileInfo> info = st.is_ok() ? snapshot_file_read_info(path, options_.fingerprint)
                                               : Result<SnapshotFileInfo>(st);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (info.is_ok()) {
        stats_.writes++;
        add_locked(std::move(info).value());
        evict_to_budget_locked();
      } else {
        stats_.write_failures++;
        DS_LOG_WARN("snapshot store: write of {} failed: {}", path, info.status().to_string());
      }
      writing_ = false;
    }
    cv_idle_.notify_all();
  }
}

void DiskSnapshotStore::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_idle_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

std::optional<SnapshotFileInfo> DiskSnapshotStore::find(std::span<const int32_t> prompt, size_t max_length) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto match = index_.longest_prefix(prompt, max_length);
  if (!match) return std::nullopt;
  auto& e = entries_.at(match->value);
  e.last_used = ++clock_;
  return e.info;
}

Result<std::shared_ptr<Snapshot>> DiskSnapshotStore::load(const SnapshotFileInfo& info) {
  auto payload = snapshot_file_read_payload(info);
  if (!payload.is_ok()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.load_failures++;
    }
    quarantine(info.path, payload.status());
    return payload.status();
  }
  auto snap = std::make_shared<Snapshot>();
  snap->tokens = info.tokens;
  snap->state = std::move(payload).value();
  snap->prefill_ms = info.prefill_ms;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.loads++;
  return snap;
}

DiskStoreStats DiskSnapshotStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace ds
