// `deltaserve version`: build information (version, compiler, CUDA backend, CPU features).
#include <cstdio>

#include "cli/command.h"

namespace {

void setup(CLI::App& app, int& exit_code) {
  app.callback([&exit_code] {
    std::printf("deltaserve 0.1.0\n");
#if defined(__clang__)
    std::printf("compiler: clang %s\n", __clang_version__);
#elif defined(__GNUC__)
    std::printf("compiler: gcc %d.%d.%d\n", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#endif
#ifdef DS_HAVE_CUDA
    std::printf("cuda backend: built\n");
#else
    std::printf("cuda backend: not built\n");
#endif
    __builtin_cpu_init();
    std::printf("cpu: avx2=%d avx512f=%d avx512vnni=%d\n", __builtin_cpu_supports("avx2") ? 1 : 0,
                __builtin_cpu_supports("avx512f") ? 1 : 0, __builtin_cpu_supports("avx512vnni") ? 1 : 0);
    exit_code = 0;
  });
}

ds::cli::Registration reg("version", "Print build information", setup);

}  // namespace
