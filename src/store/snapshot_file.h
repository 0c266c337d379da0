// On-disk snapshot file: one prefix snapshot per file. Layout (little-endian), see docs/FORMATS.md:
//   [0,128) header with its own checksum; fingerprint text; token ids; payload (serialized state).
// Written to a temporary file in the same directory, fsynced, renamed into place, directory fsynced:
// a file either exists complete or not at all. Readers verify the header checksum, bound every size
// against the file size, check the fingerprint, and verify token and payload checksums before use.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds {

constexpr char kSnapshotMagic[8] = {'D', 'S', 'N', 'A', 'P', 'S', 'H', 'T'};
// Version 1: a whole state. Version 2 (also the oldest reader of such a file): a delta on the file of
// the first parent_tokens tokens, which must be present to use it.
constexpr uint32_t kSnapshotFormatVersion = 2;   // the newest this build reads and writes
constexpr uint64_t kSnapshotHeaderBytes = 128;
constexpr const char* kSnapshotExtension = ".dsnap";

struct SnapshotFileInfo {
  std::string path;
  uint64_t file_bytes = 0;
  uint32_t format_version = 0;
  std::string fingerprint;       // model/layout description the payload belongs to
  std::vector<int32_t> tokens;   // the prefix
  uint64_t payload_offset = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  int64_t created_unix_ms = 0;
  double prefill_ms = 0;         // work the snapshot saves
  uint64_t parent_tokens = 0;    // > 0: the payload is a delta on the snapshot of tokens [0, parent_tokens)
};

// The file name of the snapshot a delta file continues (its first parent_tokens tokens); "" for a
// whole one.
std::string snapshot_file_parent_name(const SnapshotFileInfo& info);

// Writes atomically. `dir` must exist. parent_tokens > 0: the payload is a delta on the snapshot of
// the first parent_tokens tokens (a version 2 file).
Status snapshot_file_write(const std::string& path, const std::string& fingerprint,
                           std::span<const int32_t> tokens, std::span<const uint8_t> payload,
                           double prefill_ms, uint64_t parent_tokens = 0);

// Reads and verifies the header, fingerprint and tokens (not the payload). If expected_fingerprint
// is non-empty, a different fingerprint is a kInvalidArgument "foreign" error.
Result<SnapshotFileInfo> snapshot_file_read_info(const std::string& path,
                                                 const std::string& expected_fingerprint);

// Reads the payload and verifies its checksum.
Result<std::vector<uint8_t>> snapshot_file_read_payload(const SnapshotFileInfo& info);

// File name for a prefix: hash of the token ids and their count.
std::string snapshot_file_name(std::span<const int32_t> tokens);

// Test hook: make the next writes fail with `err` (e.g. ENOSPC) after `after_bytes` bytes have been
// written in total; a negative value disables it.
void snapshot_file_inject_write_failure(int64_t after_bytes, int err);

}  // namespace ds
