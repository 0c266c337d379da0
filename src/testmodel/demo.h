// The built-in demo model: the tiny preset in q8_0, generated on first use into a cache directory,
// so that `deltaserve serve` without a model works out of the box. The file name carries the
// generator version, so a changed generator never reuses a stale file.
#pragma once

#include <string>

#include "core/status.h"

namespace ds::testmodel {

// $XDG_CACHE_HOME/deltaserve, else $HOME/.cache/deltaserve (else /tmp/deltaserve-cache).
std::string default_cache_dir();

// cache_dir/deltaserve-demo-v<generator version>.gguf.
std::string demo_model_path(const std::string& cache_dir);

// Returns demo_model_path(cache_dir), writing it first if it is missing or unreadable. The file is
// written under a temporary name and renamed into place, so concurrent callers and interrupted runs
// never leave a partial file under the final name.
Result<std::string> ensure_demo_model(const std::string& cache_dir);

}  // namespace ds::testmodel
