// The implementation, built with the default configuration (tests/config_mismatch/run.cmake).
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"
