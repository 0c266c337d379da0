// MappedFile: read-only mmap of a whole file (RAII). Used by the GGUF and safetensors readers so that
// weights are paged in on demand and never copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"

namespace ds {

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_)}; }
  const std::string& path() const { return path_; }
  // Identity of the file for fingerprints: device, inode, size, mtime.
  uint64_t dev() const { return dev_; }
  uint64_t inode() const { return inode_; }
  int64_t mtime_ns() const { return mtime_ns_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t dev_ = 0, inode_ = 0;
  int64_t mtime_ns_ = 0;
};

}  // namespace ds
