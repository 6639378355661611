// pinned_workers.cpp: a scheduler whose constructing thread is worker 0 (use_caller), with
// tasks pinned to particular workers.
//
// Pinning is how you keep work that must stay on one thread there: a renderer's context,
// a thread-affine library, or the main thread itself. Unpinned tasks go to whichever
// worker is free, and may even move between workers each time they yield or sleep.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

int main() {
    // Three workers: this thread (index 0, because use_caller is true) plus two new threads.
    fsched::Scheduler scheduler(3, /*use_caller=*/true, "pinned");
    const std::thread::id main_thread = std::this_thread::get_id();
    scheduler.start();

    // Pinned to worker 0: runs on this very thread, but only once we are inside stop().
    scheduler.schedule([main_thread] {
        std::printf("main-thread task on worker %d (the main thread: %s)\n", fsched::Scheduler::worker_index(),
                    std::this_thread::get_id() == main_thread ? "yes" : "no");
    }, 0);

    // Pinned to worker 2: stays there across yields and sleeps.
    scheduler.schedule([] {
        for (int frame = 0; frame < 3; ++frame) {
            std::printf("worker-2 task, frame %d, on worker %d\n", frame, fsched::Scheduler::worker_index());
            fsched::this_fiber::sleep_for(std::chrono::milliseconds(1));
        }
    }, 2);

    // Unpinned: any worker.
    for (int i = 0; i < 3; ++i) {
        scheduler.schedule([i] { std::printf("free task %d on worker %d\n", i, fsched::Scheduler::worker_index()); });
    }

    // This thread joins in as worker 0 until every task above has finished.
    scheduler.stop();
    std::printf("all done\n");
}
