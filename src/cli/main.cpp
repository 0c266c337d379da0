// deltaserve entry point: builds the subcommand tree from the registry and runs the chosen one.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/log.h"

namespace ds::cli {
namespace {

struct Entry {
  const char* name;
  const char* summary;
  SetupFn setup;
};

std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

}  // namespace

Registration::Registration(const char* name, const char* summary, SetupFn setup) {
  registry().push_back({name, summary, setup});
}

int report(const Status& status) {
  if (status.is_ok()) return 0;
  std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
  return 1;
}

void add_log_level_option(CLI::App& app) {
  app.add_option_function<std::string>(
         "--log-level",
         [](const std::string& name) {
           LogLevel level;
           if (!parse_log_level(name, &level)) throw CLI::ValidationError("--log-level", "unknown level " + name);
           set_log_level(level);
         },
         "Log verbosity: debug, info, warn, error, off (default info)")
      ->default_str("info");
}

void add_draft_options(CLI::App& app, EngineOptions& engine) {
  app.add_option("--draft", engine.draft,
                 "Speculative decoding: ngram (drafts from the request's own tokens, verified in one step; each "
                 "token sampled as without drafts) or none")
      ->default_str("none");
  app.add_option("--draft-max", engine.draft_max, "Draft tokens per verify step (1 to 7)")->capture_default_str();
}

}  // namespace ds::cli

int main(int argc, char** argv) {
  CLI::App app{"deltaserve: local inference server for Qwen3.5/3.6 hybrid models (qwen35, qwen35moe)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deltaserve 0.1.0");
  int exit_code = 0;
  auto& entries = ds::cli::registry();
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return std::string(a.name) < b.name; });
  for (const auto& e : entries) {
    CLI::App* sub = app.add_subcommand(e.name, e.summary);
    ds::cli::add_log_level_option(*sub);
    e.setup(*sub, exit_code);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
