// ---------------------------------------------------------------------------
// Future<T>, Promise<T>, async(), when_all(): Boost.Fiber's and std's shape, on fibers.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {
}  // namespace fsched
