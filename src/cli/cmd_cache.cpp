// `deltaserve cache ls|verify|prune DIR`: inspect and maintain a snapshot directory (--kv-cache-dir).
// verify reads every payload and checks every checksum; prune removes files down to a byte budget
// (oldest first), or all of them, and empties the quarantine folder.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli/command.h"
#include "store/snapshot_file.h"

namespace {
namespace fs = std::filesystem;

struct Options {
  std::string dir;
  bool quarantine = false;
  bool all = false;
  std::string budget;
};

std::vector<fs::path> snapshot_files(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    if (de.is_regular_file() && de.path().extension() == ds::kSnapshotExtension) files.push_back(de.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool parse_bytes(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  size_t pos = 0;
  double v;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return false;
  }
  std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") return false;
  if (v < 0) return false;
  *out = static_cast<uint64_t>(v * mult);
  return true;
}

int run_ls(const Options& o) {
  if (!fs::is_directory(o.dir)) return ds::cli::report(ds::not_found("{}: no such directory", o.dir));
  uint64_t total = 0;
  std::printf("%-40s %10s %12s  %s\n", "file", "tokens", "bytes", "fingerprint");
  for (const auto& p : snapshot_files(o.dir)) {
    auto info = ds::snapshot_file_read_info(p.string(), "");
    if (!info.is_ok()) {
      std::printf("%-40s %10s %12ju  BAD: %s\n", p.filename().c_str(), "-", static_cast<uintmax_t>(fs::file_size(p)),
                  info.status().message().c_str());
      continue;
    }
    total += info->file_bytes;
    const std::string delta = info->parent_tokens > 0 ? fmt::format("(delta on {} tokens) ", info->parent_tokens) : "";
    std::printf("%-40s %10zu %12ju  %s%s\n", p.filename().c_str(), info->tokens.size(),
                static_cast<uintmax_t>(info->file_bytes), delta.c_str(), info->fingerprint.substr(0, 80).c_str());
  }
  std::printf("total %.1f MiB\n", static_cast<double>(total) / (1 << 20));
  return 0;
}

int run_verify(const Options& o) {
  if (!fs::is_directory(o.dir)) return ds::cli::report(ds::not_found("{}: no such directory", o.dir));
  int good = 0, bad = 0;
  for (const auto& p : snapshot_files(o.dir)) {
    auto info = ds::snapshot_file_read_info(p.string(), "");
    ds::Status st = info.status();
    if (st.is_ok()) st = ds::snapshot_file_read_payload(*info).status();
    if (st.is_ok()) {
      ++good;
      continue;
    }
    ++bad;
    std::printf("BAD %s: %s\n", p.filename().c_str(), st.to_string().c_str());
    if (o.quarantine) {
      std::error_code ec;
      fs::create_directories(fs::path(o.dir) / "quarantine", ec);
      fs::rename(p, fs::path(o.dir) / "quarantine" / p.filename(), ec);
    }
  }
  std::printf("%d ok, %d bad\n", good, bad);
  return bad == 0 ? 0 : 1;
}

int run_prune(const Options& o) {
  if (!fs::is_directory(o.dir)) return ds::cli::report(ds::not_found("{}: no such directory", o.dir));
  uint64_t budget = 0;
  if (!o.all && !parse_bytes(o.budget, &budget)) {
    return ds::cli::report(ds::invalid_argument("prune needs --all or --budget SIZE (e.g. 20G), got '{}'", o.budget));
  }
  // Oldest first, but a file that another builds on (a delta's parent) only after that one.
  struct F {
    fs::path path;
    uint64_t bytes;
    fs::file_time_type mtime;
    std::string parent;  // a delta: its parent's file name
    int children = 0;
    bool gone = false;
  };
  std::vector<F> files;
  uint64_t total = 0;
  for (const auto& p : snapshot_files(o.dir)) {
    F f{p, fs::file_size(p), fs::last_write_time(p), "", 0, false};
    auto info = ds::snapshot_file_read_info(p.string(), "");
    if (info.is_ok()) f.parent = ds::snapshot_file_parent_name(*info);
    files.push_back(std::move(f));
    total += files.back().bytes;
  }
  std::sort(files.begin(), files.end(), [](const F& a, const F& b) { return a.mtime < b.mtime; });
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < files.size(); ++i) by_name[files[i].path.filename().string()] = i;
  for (const F& f : files) {
    if (!f.parent.empty() && by_name.count(f.parent)) files[by_name[f.parent]].children++;
  }
  int removed = 0;
  for (bool progress = true; progress && (o.all || total > budget);) {
    progress = false;
    for (F& f : files) {
      if (f.gone || f.children > 0 || (!o.all && total <= budget)) continue;
      std::error_code ec;
      if (!fs::remove(f.path, ec)) continue;
      f.gone = progress = true;
      total -= f.bytes;
      ++removed;
      if (!f.parent.empty() && by_name.count(f.parent)) files[by_name[f.parent]].children--;
      break;  // the oldest removable file may now be its parent
    }
  }
  std::error_code ec;
  const auto qremoved = fs::remove_all(fs::path(o.dir) / "quarantine", ec);
  std::printf("removed %d snapshot files, %ju quarantined entries; %.1f MiB remain\n", removed,
              static_cast<uintmax_t>(qremoved > 0 ? qremoved - 1 : 0), static_cast<double>(total) / (1 << 20));
  return 0;
}

void setup(CLI::App& app, int& exit_code) {
  app.require_subcommand(1);
  auto opts = std::make_shared<Options>();
  CLI::App* ls = app.add_subcommand("ls", "List snapshot files: tokens, bytes, whether a delta, model fingerprint");
  ls->add_option("dir", opts->dir, "Snapshot directory (--kv-cache-dir)")->required();
  ls->callback([opts, &exit_code] { exit_code = run_ls(*opts); });
  CLI::App* verify = app.add_subcommand("verify", "Read every snapshot and check every checksum; exit 1 if any is bad");
  verify->add_option("dir", opts->dir, "Snapshot directory")->required();
  verify->add_flag("--quarantine", opts->quarantine, "Move bad files into DIR/quarantine/");
  verify->callback([opts, &exit_code] { exit_code = run_verify(*opts); });
  CLI::App* prune = app.add_subcommand("prune", "Delete the oldest snapshots (a delta before the file it builds on) down to a budget, and the quarantine folder");
  prune->add_option("dir", opts->dir, "Snapshot directory")->required();
  prune->add_option("--budget", opts->budget, "Keep at most this many bytes (e.g. 500M, 20G)");
  prune->add_flag("--all", opts->all, "Delete every snapshot");
  prune->callback([opts, &exit_code] { exit_code = run_prune(*opts); });
}

ds::cli::Registration reg("cache", "List, verify or prune a snapshot directory (--kv-cache-dir)", setup);

}  // namespace
