// select_pipeline.cpp: a stage that merges two inputs, stops when told to, and gives up when
// its inputs go quiet.
//
// Two producers feed a merger: `jobs` (numbers; closed when there are no more) and `notes`
// (text). The merger waits on both, on `quit` and on a timeout at once with fsched::select():
// whichever is ready first runs its case. Run 1: the main thread closes `quit` once the
// producers are done. Run 2: the notes producer stalls, and the merger gives up after 50 ms
// without input.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <chrono>
#include <cstdio>
#include <string>

using namespace std::chrono_literals;

enum class Ended { Quit, Idle };

struct Merged {
    long job_sum = 0;
    int notes = 0;
    Ended ended = Ended::Quit;
};

Merged merge(fsched::Channel<int>& jobs, fsched::Channel<std::string>& notes, fsched::Channel<int>& quit) {
    Merged m;
    bool jobs_open = true;
    for (bool running = true; running;) {
        auto on_job = [&](std::optional<int> job) {
            if (job) m.job_sum += *job;
            else jobs_open = false;  // closed and drained
        };
        auto on_note = [&](std::optional<std::string> note) { m.notes += note ? 1 : 0; };
        auto on_quit = [&](std::optional<int>) { running = false; };  // closed: stop
        auto on_idle = [&] {
            m.ended = Ended::Idle;
            running = false;
        };
        if (jobs_open) {
            fsched::select(jobs.on_receive(on_job), notes.on_receive(on_note), quit.on_receive(on_quit),
                           fsched::select_timeout(50ms, on_idle));
        } else {
            // A closed channel's case is always ready: leave it out (Go sets it to nil).
            fsched::select(notes.on_receive(on_note), quit.on_receive(on_quit), fsched::select_timeout(50ms, on_idle));
        }
    }
    return m;
}

int main() {
    fsched::Scheduler scheduler(2, /*use_caller=*/false, "select");
    scheduler.start();
    bool ok = true;

    {  // Run 1: told to quit.
        fsched::Channel<int> jobs;  // unbuffered: a send returns once the merger has the value
        fsched::Channel<std::string> notes;
        fsched::Channel<int> quit;
        fsched::WaitGroup producers(2), merged(1);
        Merged result;
        scheduler.schedule([&] {
            for (int i = 1; i <= 100; ++i) jobs.send(i);
            jobs.close();
            producers.done();
        });
        scheduler.schedule([&] {
            for (int i = 0; i < 10; ++i) notes.send("note " + std::to_string(i));
            producers.done();
        });
        scheduler.schedule([&] {
            result = merge(jobs, notes, quit);
            merged.done();
        });
        producers.wait();
        quit.close();  // every receiver of `quit` sees it at once
        merged.wait();
        std::printf("run 1: jobs %ld, notes %d, ended by %s\n", result.job_sum, result.notes,
                    result.ended == Ended::Quit ? "quit" : "timeout");
        ok = ok && result.job_sum == 5050 && result.notes == 10 && result.ended == Ended::Quit;
    }

    {  // Run 2: the notes producer stalls; nobody says quit.
        fsched::Channel<int> jobs;
        fsched::Channel<std::string> notes;
        fsched::Channel<int> quit;
        fsched::Channel<int> stalled;  // the notes producer hangs on it until the end
        fsched::WaitGroup merged(1);
        Merged result;
        scheduler.schedule([&] {
            for (int i = 1; i <= 10; ++i) jobs.send(i);
            jobs.close();
        });
        scheduler.schedule([&] {
            for (int i = 0; i < 3; ++i) notes.send("note " + std::to_string(i));
            stalled.receive();
        });
        const auto start = std::chrono::steady_clock::now();
        scheduler.schedule([&] {
            result = merge(jobs, notes, quit);
            merged.done();
        });
        merged.wait();
        const auto waited = std::chrono::steady_clock::now() - start;
        stalled.close();
        std::printf("run 2: jobs %ld, notes %d, ended by %s after %lld ms\n", result.job_sum, result.notes,
                    result.ended == Ended::Quit ? "quit" : "timeout",
                    static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()));
        ok = ok && result.job_sum == 55 && result.notes == 3 && result.ended == Ended::Idle && waited >= 50ms;
    }

    scheduler.stop();
    std::printf("%s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
