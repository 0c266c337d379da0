// The decode-step timeline (`deltaserve bench --timeline`, a diagnostic): where the time of a replayed
// decode graph goes along its chain of dependent kernels. Leaving a kernel out of the graph (the kernel
// filter of pdl.h) says what it costs together with its boundaries; the timeline says, per launch, when
// its first CTA became resident and when its dependency wait returned, so the span from one kernel's
// release to the next kernel's release is that kernel's share of the critical path, measured inside the
// graph with nothing left out.
// How: while a timeline runs, thread 0 of CTA 0 of every kernel launched through launch_kernel
// (launch.cuh) reads %globaltimer before and after its dependency wait and appends the pair to a device
// buffer (one atomic a launch). The kernels of a step graph are logged by the host as its capture issues
// them, so the n-th record of a replayed step belongs to the graph's n-th launch.
// Only a build configured with -DDELTASERVE_TIMELINE=ON records (the device side is compiled out of
// every other build): even a null pointer's load in one thread a launch, around the wait, slowed the
// 27B's decode by 10% (its products' code changed), and a timeline's own records lengthen a step
// (measured against the same build's step without them: docs/perf-gpu.md). Its figures are shares of a
// step of that build, not absolute times of the production kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/cuda/pdl.h"

namespace ds::cuda {

// One launch of a step, as the host issued it.
struct TimelineLaunch {
  std::string name;  // the kernel's name, shortened (timeline_kernel_name)
  int64_t ctas = 0;
  int64_t threads = 0;  // per CTA
};

// What CTA 0 of one launch recorded, %globaltimer in ns (the device record's layout: pdl.h).
struct TimelineRecord {
  uint64_t entry_ns = 0;    // reached its dependency wait (resident)
  uint64_t release_ns = 0;  // left it: every earlier kernel of the stream had completed
  uint64_t mark_ns[kTimelineMarks] = {};  // reached kern::timeline_mark(i); 0: not reached
};

struct Timeline {
  std::vector<TimelineLaunch> step;     // the launches of the last step graph captured, in order
  std::vector<TimelineRecord> records;  // every launch recorded since timeline_start, in order
};

// True in a build whose kernels record (DELTASERVE_TIMELINE=ON).
bool timeline_compiled();
// Starts recording on the calling thread's current device: up to `capacity` launches. Fails in a build
// that does not record, where a timeline already runs, or where a CUDA call fails.
Status timeline_start(int64_t capacity);
// The model brackets each step graph's capture with these (cheap with no timeline running): the
// launches in between, where the capture succeeded, become the step that timeline_stop returns.
void timeline_capture_begin();
void timeline_capture_end(bool captured);
// Stops recording and returns what was recorded (records past the capacity are dropped: `dropped`).
struct TimelineResult {
  Timeline timeline;
  int64_t dropped = 0;
};
Result<TimelineResult> timeline_stop();

// Per position of a step, and per kernel name over a step: medians over the recorded steps.
struct TimelineRow {
  std::string name;
  int64_t ctas = 0;
  int64_t launches = 1;    // per step (by-kernel rows)
  double span_us = 0;      // release to the next launch's release (the step's last: to the next step's first)
  double wait_us = 0;      // CTA 0 resident to released
  double lag_us = 0;       // previous launch's release to this one's CTA 0 resident
  double mark_us[kTimelineMarks] = {-1, -1, -1, -1};  // positions: release to mark i, -1 where never reached
};
struct TimelineSummary {
  int64_t steps = 0;       // complete steps recorded
  double step_us = 0;      // median release-to-release of a step's first launch
  std::vector<TimelineRow> positions;  // the step's launches in order
  std::vector<TimelineRow> by_kernel;  // summed per name, largest span first
};
// Splits the records into steps of timeline.step.size() launches. An error where they do not divide
// (a launch that recorded nothing, or steps of different kernels) or fewer than two steps were recorded.
Result<TimelineSummary> timeline_summarize(const Timeline& timeline);

// A mangled kernel name made readable: demangled, without the ds::cuda namespaces, anonymous
// namespaces and the parameter list.
std::string timeline_kernel_name(const char* mangled);

// launch.cuh's hooks (registration of each CUDA source, the launch log) and the record layout are in
// pdl.h.

}  // namespace ds::cuda
