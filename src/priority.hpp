// ---------------------------------------------------------------------------
// Priority: the level a scheduled task waits at, kept by its fiber whenever it is woken or
// yields. Its own part because both the fiber's life cycle (fiber_state.hpp: a fiber
// remembers where it runs, ResumeTarget) and the scheduler's tasks (scheduler.hpp:
// ScheduleTask) hold one; what the levels mean is said at Scheduler::schedule.
// ---------------------------------------------------------------------------

#pragma once

namespace fsched {

enum class Priority : unsigned char { High, Normal, Low };

}  // namespace fsched
