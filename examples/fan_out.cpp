// fan_out.cpp: a request fanned out to several "backends" at once, each call a task whose
// result comes back through a Future; when_all waits for the lot, then the answers are
// combined. One backend fails, and its exception reaches the caller through get().
//
// The same shape as std::async + std::future, but each call is a fiber on the scheduler's
// workers, and a waiting caller parks instead of holding a thread.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

// A backend that takes a while to answer (it sleeps, parking its fiber, not a thread).
int query_backend(int shard, const std::string& key) {
    fsched::this_fiber::sleep_for(std::chrono::milliseconds(2 + shard % 3));
    if (shard == 5) throw std::runtime_error("shard 5 is down");
    return static_cast<int>(key.size()) * 100 + shard;
}

int main() {
    fsched::Scheduler scheduler(4, /*use_caller=*/false, "fan-out");
    scheduler.start();

    // The request itself is a task, so its waits park a fiber too.
    fsched::Future<std::string> answer = fsched::async(scheduler, [&scheduler] {
        std::vector<fsched::Future<int>> replies;
        for (int shard = 0; shard < 8; ++shard) {
            replies.push_back(fsched::async(scheduler, query_backend, shard, std::string("user:42")));
        }
        // Ready once every reply is in; its get() would rethrow the first failure. The
        // replies stay valid: take what each one says.
        fsched::when_all(replies.begin(), replies.end()).wait();
        int sum = 0, failed = 0;
        for (auto& reply : replies) {
            try {
                sum += reply.get();
            } catch (const std::exception& e) {
                std::printf("a backend failed: %s\n", e.what());
                ++failed;
            }
        }
        return std::to_string(sum) + " from " + std::to_string(8 - failed) + " shards";
    });

    const std::string result = answer.get();  // this plain thread blocks until it is ready
    std::printf("answer: %s\n", result.c_str());
    scheduler.stop();
    // 7 shards answered 700 + shard each: 4900 + (0+1+2+3+4+6+7).
    return result == "4923 from 7 shards" ? 0 : 1;
}
