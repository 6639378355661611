// work_queue.cpp: a bounded work queue drained by a fixed number of worker fibers, with a
// WaitGroup telling the submitter when every item is processed.
//
// The queue is a buffered Channel: when it is full, the submitter blocks (back-pressure)
// instead of queueing without limit.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

int main() {
    fsched::Scheduler scheduler(4, /*use_caller=*/false, "queue");
    fsched::Channel<std::string> queue(16);  // at most 16 items wait at a time
    fsched::WaitGroup processed;
    std::atomic<int> letters{0};
    scheduler.start();

    for (int w = 0; w < 8; ++w) {  // 8 consumers on 4 threads
        scheduler.schedule([&] {
            while (auto item = queue.receive()) {
                fsched::this_fiber::sleep_for(std::chrono::microseconds(200));  // "work"
                letters += static_cast<int>(item->size());
                processed.done();
            }
        });
    }

    // The submitter is this plain thread: send() blocks it while the queue is full.
    for (int i = 0; i < 200; ++i) {
        processed.add(1);
        queue.send("item-" + std::to_string(i));
    }
    processed.wait();  // every item handled
    std::printf("processed 200 items, %d letters\n", letters.load());
    queue.close();  // lets the consumers' receive() return nullopt, so their tasks end
    scheduler.stop();
}
