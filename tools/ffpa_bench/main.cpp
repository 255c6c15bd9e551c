// ffpa-bench: runs one attention forward (or a sweep over D) for the shape and
// options on the command line; see --help. Parsing lives in bench_args,
// running, timing and checking in bench_run.
#include <cstdio>

#include "bench_args.hpp"
#include "ffpa/ffpa.hpp"
#include "bench_run.hpp"

int main(int argc, char** argv) {
  const ffpa::bench::ParsedArgs parsed = ffpa::bench::parse_args(argc, argv);
  if (!parsed.error.empty()) {
    std::fprintf(stderr, "ffpa-bench: %s\n\n%s", parsed.error.c_str(), ffpa::bench::usage_text().c_str());
    return 2;
  }
  if (parsed.args.help) {
    std::fputs(ffpa::bench::usage_text().c_str(), stdout);
    return 0;
  }
  if (parsed.args.version) {
    std::printf("ffpa-bench %s\n", ffpa::version());
    return 0;
  }
  return ffpa::bench::run_benchmarks(parsed.args);
}
