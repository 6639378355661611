// ---------------------------------------------------------------------------
// select() over channel cases (Go's select): Channel<T>::on_receive / on_send,
// select_default, select_timeout.
// ---------------------------------------------------------------------------

#pragma once

#include "sync.hpp"

namespace fsched {
}  // namespace fsched
