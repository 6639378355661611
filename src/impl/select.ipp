// ---------------------------------------------------------------------------
// Implementation: select()'s non-template part.
// ---------------------------------------------------------------------------

#pragma once

#include "select.hpp"
#include "impl/sched_core.ipp"

namespace fsched {
}  // namespace fsched
