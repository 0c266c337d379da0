// Demo model cache. An existing file is reused only if it parses as GGUF; otherwise it is rebuilt.
// The temporary name includes the process id, so two servers starting at once write separate files
// and the last rename wins with identical contents.
#include "testmodel/demo.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/log.h"
#include "gguf/gguf.h"
#include "testmodel/test_model_writer.h"

namespace ds::testmodel {

std::string default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/deltaserve";
  const char* home = std::getenv("HOME");
  if (home && home[0] != '\0') return std::string(home) + "/.cache/deltaserve";
  return "/tmp/deltaserve-cache";
}

std::string demo_model_path(const std::string& cache_dir) {
  return cache_dir + "/deltaserve-demo-v" + std::to_string(kTestModelGeneratorVersion) + ".gguf";
}

Result<std::string> ensure_demo_model(const std::string& cache_dir) {
  namespace fs = std::filesystem;
  const std::string path = demo_model_path(cache_dir);
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    auto existing = GgufFile::open(path);
    if (existing.is_ok()) return path;
    DS_LOG_WARN("demo model {} is unreadable ({}); writing it again", path, existing.status().to_string());
  }
  fs::create_directories(cache_dir, ec);
  if (ec) return io_error("{}: cannot create the cache directory: {}", cache_dir, ec.message());

  TestModelOverrides overrides;
  overrides.type = OutType::kQ8_0;
  DS_ASSIGN_OR_RETURN(TestModelConfig config, test_model_config_make("tiny", overrides));
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  DS_LOG_INFO("writing the demo model to {}", path);
  Status st = test_model_write(config, tmp, TestModelWriteOptions{});
  if (st.is_ok()) {
    fs::rename(tmp, path, ec);
    if (ec) st = io_error("{}: cannot rename {} into place: {}", path, tmp, ec.message());
  }
  if (!st.is_ok()) {
    fs::remove(tmp, ec);
    return st.with_context("demo model");
  }
  return path;
}

}  // namespace ds::testmodel
