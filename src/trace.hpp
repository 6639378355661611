// ---------------------------------------------------------------------------
// The trace recorder and the flight recorder (fsched::trace): what each thread ran, as
// Chrome Trace Event JSON that Perfetto UI, chrome://tracing and speedscope open.
//
// Each thread records into a buffer of its own (impl/trace.ipp): one `tid` per worker or
// plain thread, a complete event ("ph":"X") for each slice a fiber ran there, with the
// fiber's id, its name and why the slice ended in `args`, and a flow ("ph":"s" / "ph":"f")
// from the slice that woke a fiber to the slice it next ran in. Memory is bounded per
// thread: start() keeps the first FIBER_SCHED_TRACE_MAX_EVENTS events of each thread (an
// environment variable read by start(); default 1,000,000, about 56 MB) and counts the
// rest; start_ring() keeps the newest n. The file says how many were dropped.
// ---------------------------------------------------------------------------

#pragma once

namespace fsched {
namespace trace {

// Begins recording every thread's fiber slices and wake-ups; stop() writes them to `path`
// as Chrome Trace Event JSON. Any thread, while schedulers run. False (and nothing
// recorded) when a recording or a ring is already on, or `path` cannot be opened for
// writing.
bool start(const std::string& path);
// Ends the recording start() began and writes its file; ends a ring too (writing nothing).
// Harmless when nothing is recording.
void stop();
// The flight recorder: keeps the newest `events_per_worker` events of each thread in memory
// and writes nothing until dump(), or until a hang report (FIBER_SCHED_HANG_REPORT_S,
// SchedulerOptions::hang_report_after), which writes them to fiber_sched-hang-<pid>-<n>.json
// in the current directory and names the file. False when `events_per_worker` is 0, is more
// than memory can hold once, or a recording or a ring is already on. stop() ends it. A
// thread that has exited keeps its ring for later dumps (the newest 64 exited threads).
bool start_ring(std::size_t events_per_worker);
// Writes what the ring holds now (and the slice each thread is running) to `path` as Chrome
// Trace Event JSON; the ring goes on recording, and a dump takes nothing from it. False when
// no ring is on or `path` cannot be opened (then nothing is read). Names that are not UTF-8
// are written with U+FFFD for each byte that is not, here and in start()'s file.
bool dump(const std::string& path);

}  // namespace trace

namespace detail {
// For tests: the cap start() gives each thread's buffer; 0 (the default) reads
// FIBER_SCHED_TRACE_MAX_EVENTS, else 1,000,000. Read by the next start().
void set_trace_max_events(std::size_t events);
// FIBER_SCHED_TRACE_MAX_EVENTS's reading of `text`: a count of decimal digits only, above 0;
// 0 for anything else (a sign, a suffix, nothing, garbage). For tests.
std::size_t parse_event_count(const char* text) noexcept;
}  // namespace detail
}  // namespace fsched
