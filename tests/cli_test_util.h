// Helpers for tests that run the deltaserve binary (DS_EXE): a scratch directory under the build tree
// and a runner that captures the exit code and the combined output.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ds::test {

// DS_BINARY_DIR/<name>_<pid>, fresh at construction and removed at destruction.
class CliTempDir {
 public:
  explicit CliTempDir(const std::string& name)
      : path_(std::string(DS_BINARY_DIR) + "/" + name + "_" + std::to_string(::getpid())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~CliTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  CliTempDir(const CliTempDir&) = delete;
  CliTempDir& operator=(const CliTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `deltaserve ARGS`, with the output captured in dir/out.txt.
inline RunResult run_exe(const std::string& args, const std::string& dir) {
  const std::string log = dir + "/out.txt";
  const std::string cmd = std::string(DS_EXE) + " " + args + " > " + log + " 2>&1";
  RunResult r;
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

}  // namespace ds::test
