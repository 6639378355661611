// ---------------------------------------------------------------------------
// Data parallelism: parallel_for and parallel_for_chunks over an index range.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {
}  // namespace fsched
