// Disk tier of the prefix cache (--kv-cache-dir). Snapshots are written by a background thread (a
// request never waits on disk): a delta snapshot as a delta file on its parent's file when that file
// is indexed, else joined with its chain into a whole stream; a loaded delta brings its chain along.
// Files that others build on are evicted only after them; a delta whose chain is broken is deleted.
// Files are indexed at startup from file headers and token ids (payloads are not
// read), looked up by longest token prefix, and verified when loaded. A corrupt, truncated, foreign or
// unreadable file is moved into DIR/quarantine/ (or deleted if that fails) with one warning and is
// never used; the quarantine keeps the kQuarantineKeepFiles most recently quarantined files (and,
// under a byte budget, at most a quarter of it), so a run of bad files cannot fill the disk. The
// directory is kept under the byte budget by deleting the least recently used files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "core/serial_worker.h"
#include "core/status.h"
#include "state/prefix_cache.h"
#include "state/token_radix_tree.h"
#include "store/snapshot_file.h"

namespace ds {

constexpr int kQuarantineKeepFiles = 4;

struct DiskStoreOptions {
  std::string dir;
  std::string fingerprint;        // model/layout identity; files with another one are foreign
  uint64_t budget_bytes = 0;      // 0 = unlimited
  size_t max_pending_writes = 8;  // beyond this, new writes are dropped (the request never waits)
  // The whole state stream of a snapshot that is a delta on a parent (state_stream_join over its
  // chain), made by the writer thread: files always hold whole streams. Without it such snapshots
  // are not written.
  std::function<Result<std::vector<uint8_t>>(const Snapshot&)> whole_stream;
};

struct DiskStoreStats {
  uint64_t files = 0, bytes = 0;
  uint64_t writes = 0, write_failures = 0, dropped_writes = 0;
  uint64_t loads = 0, load_failures = 0, quarantined = 0, evictions = 0;
};

class DiskSnapshotStore {
 public:
  // Creates the directory if needed and indexes it. Fails only if the directory cannot be used.
  static Result<std::unique_ptr<DiskSnapshotStore>> open(const DiskStoreOptions& options);
  ~DiskSnapshotStore();  // finishes pending writes

  // Queues a snapshot for writing (skipped if a file for the same tokens exists).
  void put_async(std::shared_ptr<const Snapshot> snapshot);
  // Longest indexed snapshot whose tokens are a prefix of `prompt`, at most max_length tokens.
  std::optional<SnapshotFileInfo> find(std::span<const int32_t> prompt, size_t max_length = SIZE_MAX);
  // Reads and verifies a snapshot; a bad file is quarantined and an error returned.
  Result<std::shared_ptr<Snapshot>> load(const SnapshotFileInfo& info);
  // Blocks until queued writes are done (tests, shutdown).
  void flush();
  DiskStoreStats stats() const;
  const std::string& dir() const { return options_.dir; }

 private:
  explicit DiskSnapshotStore(DiskStoreOptions options);
  struct Entry;
  void index_directory();
  // Writes one snapshot (the writer's job) and indexes the file.
  void write(const std::shared_ptr<const Snapshot>& snap);
  // Indexes a written file; false (nothing indexed) for a delta whose parent file is not indexed.
  bool add_locked(SnapshotFileInfo info);
  // Enters a file in the index and the stats, its children not counted.
  Entry& index_locked(SnapshotFileInfo info);
  void remove_locked(const std::string& name);
  // Deletes the files of the deltas built on `name`, transitively, and their entries.
  void delete_descendants_locked(const std::string& name);
  // Deletes the file `name` (a delta whose chain is broken) and its descendants.
  void delete_file_locked(const std::string& name);
  // At startup: each entry's children counted, deltas whose chain is broken deleted.
  void link_chains_locked();
  void quarantine(const std::string& path, const Status& why);
  void prune_quarantine(const std::string& qdir);
  void evict_to_budget_locked();

  DiskStoreOptions options_;
  mutable std::mutex mutex_;  // guards the index and stats
  TokenRadixTree index_;
  int64_t next_id_ = 0;
  struct Entry {
    SnapshotFileInfo info;
    uint64_t last_used = 0;
    std::string parent;  // a delta: the file name of the snapshot it continues
    int children = 0;    // indexed deltas on this file (it is not evicted while there are any)
  };
  std::unordered_map<int64_t, Entry> entries_;
  std::unordered_map<std::string, int64_t> by_name_;
  uint64_t clock_ = 0;
  DiskStoreStats stats_;
  SerialWorker writer_;  // last: destroyed first, after the writes it still has queued
};

}  // namespace ds
