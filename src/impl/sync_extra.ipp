// ---------------------------------------------------------------------------
// Implementation: the slow paths of sync_extra.hpp's primitives.
// ---------------------------------------------------------------------------

#pragma once

#include "sync_extra.hpp"
#include "impl/sched_core.ipp"

namespace fsched {
}  // namespace fsched
