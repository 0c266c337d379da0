// Subcommand registry for the one `deltaserve` binary. Each src/cli/cmd_*.cpp registers itself with a
// static Registration; main() builds the CLI11 app from the registry, so adding a command touches
// no other file.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "core/status.h"
#include "engine/engine.h"

namespace ds::cli {

// Adds the subcommand's options to `app` and sets its callback; the callback stores the process
// exit code in `exit_code`.
using SetupFn = void (*)(CLI::App& app, int& exit_code);

struct Registration {
  Registration(const char* name, const char* summary, SetupFn setup);
};

// Prints "error: <status>" to stderr and returns 1 (or 0 for an ok status).
int report(const Status& status);

// Adds the common --log-level flag.
void add_log_level_option(CLI::App& app);

// Adds --draft and --draft-max (speculative decoding) for the engine options `engine`.
void add_draft_options(CLI::App& app, EngineOptions& engine);

}  // namespace ds::cli
