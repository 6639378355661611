// ---------------------------------------------------------------------------
// The OS layer, chosen once: its interface (os.ipp, which the parts that call it include)
// and its implementation for this system (os_posix.ipp or os_win32.ipp). Only
// fiber_sched.hpp includes this file, so the chosen implementation is emitted once. What
// both implementations include comes first, outside the branch (amalgamate.py insists).
// ---------------------------------------------------------------------------

#pragma once

#include "config.hpp"
#include "impl/os.ipp"
#include "impl/common.ipp"
#if defined(_WIN32)
#include "impl/os_win32.ipp"
#else
#include "impl/os_posix.ipp"
#endif
