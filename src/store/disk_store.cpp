// DiskSnapshotStore: one writer (a SerialWorker) runs a bounded queue of writes; the index maps token
// prefixes to file entries. Loads happen on the caller's thread.
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
  return store;
}

DiskSnapshotStore::~DiskSnapshotStore() = default;  // the writer (last member) finishes first

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
    index_locked(std::move(info).value());  // chains are linked once every file is in
  }
  std::lock_guard<std::mutex> lock(mutex_);
  link_chains_locked();
  evict_to_budget_locked();
  DS_LOG_INFO("snapshot store {}: {} files, {} MiB", options_.dir, stats_.files, stats_.bytes >> 20);
}

bool DiskSnapshotStore::add_locked(SnapshotFileInfo info) {
  const std::string name = fs::path(info.path).filename().string();
  const std::string parent = snapshot_file_parent_name(info);
  if (!parent.empty() && !by_name_.count(parent)) return false;
  int children = 0;  // the same tokens again: the deltas on the old file stay valid on the new one
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    children = entries_.at(it->second).children;
    remove_locked(name);
  }
  Entry& e = index_locked(std::move(info));
  e.children = children;
  if (!parent.empty()) entries_.at(by_name_.at(parent)).children++;
  return true;
}

DiskSnapshotStore::Entry& DiskSnapshotStore::index_locked(SnapshotFileInfo info) {
  const int64_t id = next_id_++;
  index_.insert(info.tokens, id);
  stats_.files++;
  stats_.bytes += info.file_bytes;
  by_name_[fs::path(info.path).filename().string()] = id;
  const std::string parent = snapshot_file_parent_name(info);
  return entries_.emplace(id, Entry{std::move(info), ++clock_, parent, 0}).first->second;
}

void DiskSnapshotStore::remove_locked(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;
  auto e = entries_.find(it->second);
  if (!e->second.parent.empty()) {
    auto p = by_name_.find(e->second.parent);
    if (p != by_name_.end()) entries_.at(p->second).children--;
  }
  index_.erase(e->second.info.tokens);
  stats_.files--;
  stats_.bytes -= e->second.info.file_bytes;
  entries_.erase(e);
  by_name_.erase(it);
}

void DiskSnapshotStore::delete_descendants_locked(const std::string& name) {
  std::vector<std::string> children;
  for (const auto& [id, e] : entries_) {
    if (e.parent == name) children.push_back(fs::path(e.info.path).filename().string());
  }
  for (const std::string& child : children) delete_file_locked(child);
}

void DiskSnapshotStore::delete_file_locked(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;  // went with an earlier one
  const std::string path = entries_.at(it->second).info.path;
  delete_descendants_locked(name);
  remove_locked(name);
  std::error_code ec;
  fs::remove(path, ec);
  DS_LOG_INFO("snapshot store: deleted {}: the snapshot it continues is gone", path);
}

void DiskSnapshotStore::link_chains_locked() {
  for (auto& [id, e] : entries_) e.children = 0;
  std::vector<std::string> broken;
  for (const auto& [id, e] : entries_) {
    if (e.parent.empty()) continue;
    auto p = by_name_.find(e.parent);
    if (p == by_name_.end()) {
      broken.push_back(fs::path(e.info.path).filename().string());
    } else {
      entries_.at(p->second).children++;
    }
  }
  for (const std::string& name : broken) delete_file_locked(name);
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
  delete_descendants_locked(fs::path(path).filename().string());
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
    auto victim = entries_.end();  // the least recently used file no delta builds on
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.children == 0 && (victim == entries_.end() || it->second.last_used < victim->second.last_used)) {
        victim = it;
      }
    }
    if (victim == entries_.end()) break;  // unreachable: chains end in files nothing builds on
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
    if (writer_.queued() >= options_.max_pending_writes) {
      stats_.dropped_writes++;
      return;
    }
  }
  writer_.submit([this, snap = std::move(snapshot)] { write(snap); });
}

void DiskSnapshotStore::write(const std::shared_ptr<const Snapshot>& snap) {
  const std::string path = (fs::path(options_.dir) / snapshot_file_name(snap->tokens)).string();
  // A delta goes to disk as a delta when its parent's file is indexed, else joined into a whole stream.
  uint64_t parent_tokens = 0;
  if (snap->parent) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (by_name_.count(snapshot_file_name(snap->parent->tokens))) parent_tokens = snap->parent->tokens.size();
  }
  Status st = Status::ok();
  std::vector<uint8_t> joined;
  if (snap->parent && parent_tokens == 0) {
    auto whole = options_.whole_stream ? options_.whole_stream(*snap)
                                       : Result<std::vector<uint8_t>>(unsupported("a delta snapshot and no joiner"));
    if (whole.is_ok()) joined = std::move(whole).value();
    st = whole.status();
  }
  const std::span<const uint8_t> payload = joined.empty() ? std::span<const uint8_t>(snap->state) : joined;
  if (st.is_ok()) st = snapshot_file_write(path, options_.fingerprint, snap->tokens, payload, snap->prefill_ms, parent_tokens);
  joined = std::vector<uint8_t>{};  // a whole stream can be GBs: not kept while indexing
  Result<SnapshotFileInfo> info = st.is_ok() ? snapshot_file_read_info(path, options_.fingerprint)
                                             : Result<SnapshotFileInfo>(st);
  std::lock_guard<std::mutex> lock(mutex_);
  if (info.is_ok() && add_locked(*info)) {
    stats_.writes++;
    evict_to_budget_locked();
    return;
  }
  stats_.write_failures++;
  if (info.is_ok()) {  // its parent's file went meanwhile (quarantined): of no use alone
    std::error_code ec;
    fs::remove(path, ec);
  }
  DS_LOG_WARN("snapshot store: write of {} failed: {}", path,
              info.is_ok() ? "the snapshot it continues is gone" : info.status().to_string());
}

void DiskSnapshotStore::flush() { writer_.wait_idle(); }

std::optional<SnapshotFileInfo> DiskSnapshotStore::find(std::span<const int32_t> prompt, size_t max_length) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto match = index_.longest_prefix(prompt, max_length);
  if (!match) return std::nullopt;
  auto& e = entries_.at(match->value);
  e.last_used = ++clock_;
  return e.info;
}

Result<std::shared_ptr<Snapshot>> DiskSnapshotStore::load(const SnapshotFileInfo& info) {
  // The chain's files, the whole one first.
  std::vector<SnapshotFileInfo> chain = {info};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (chain.back().parent_tokens > 0) {
      auto it = by_name_.find(snapshot_file_parent_name(chain.back()));
      if (it == by_name_.end()) {
        stats_.load_failures++;
        return not_found("{}: the snapshot it continues is gone", chain.back().path);
      }
      chain.push_back(entries_.at(it->second).info);
    }
  }
  std::reverse(chain.begin(), chain.end());
  std::shared_ptr<Snapshot> snap;
  for (const SnapshotFileInfo& link : chain) {
    auto payload = snapshot_file_read_payload(link);
    if (!payload.is_ok()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.load_failures++;
      }
      quarantine(link.path, payload.status());
      return payload.status();
    }
    auto next = std::make_shared<Snapshot>();
    next->tokens = link.tokens;
    next->state = std::move(payload).value();
    next->prefill_ms = link.prefill_ms;
    next->parent = std::move(snap);
    snap = std::move(next);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.loads++;
  return snap;
}

DiskStoreStats DiskSnapshotStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace ds
