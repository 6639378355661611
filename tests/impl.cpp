// The one translation unit of the test program that holds the library's implementation;
// every test_*.cpp includes the header without it, so ODR mistakes show up at link time.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"
