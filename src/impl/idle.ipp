// ---------------------------------------------------------------------------
// The idle wait, chosen once: the only place that names idle_epoll.ipp and idle_condvar.ipp
// (a part that uses SchedulerIdle or WorkerIdle includes this file).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"
#include "sync.hpp"
#include "impl/common.ipp"

// The idle wait, chosen next to the context backend: epoll on Linux, else (and with
// FIBER_SCHED_NO_EPOLL) a condition variable. Both files have the same interface.
#if defined(FIBER_SCHED_HAVE_EPOLL)
#include "impl/idle_epoll.ipp"
#else
#include "impl/idle_condvar.ipp"
#endif
