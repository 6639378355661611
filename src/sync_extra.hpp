// ---------------------------------------------------------------------------
// More synchronisation (the toolbox): Semaphore, Latch, Barrier, SharedMutex, Event,
// ConditionVariableAny, each on sync.hpp's wait machinery.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {
}  // namespace fsched
