// Uses fiber_sched without defining FIBER_SCHED_IMPLEMENTATION anywhere in the program.
// This must compile, and must then fail to link with an undefined symbol whose name says
// define_FIBER_SCHED_IMPLEMENTATION_in_one_cpp_file.
#include "fiber_sched.hpp"

#include <memory>

int main() {
    auto fiber = std::make_shared<fsched::Fiber>([] { fsched::Fiber::yield(); });
    fiber->resume();
    fiber->resume();
    return fiber->state() == fsched::Fiber::State::Term ? 0 : 1;
}
