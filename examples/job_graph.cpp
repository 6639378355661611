// job_graph.cpp: a game frame's jobs fanned out across workers and joined before the next
// frame starts.
//
// Each frame: physics for every chunk of bodies runs in parallel; then animation, which
// needs physics' results; then one job gathers the frame's statistics. A WaitGroup joins
// each stage. Jobs that wait park their fiber, so the worker threads stay busy.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

struct Body {
    float position = 0, velocity = 1, pose = 0;
};

constexpr int chunk_size = 1024;

// Runs job(i) for every i in [0, count) as separate tasks and waits for all of them.
template <class Job>
void parallel_for(int count, Job job) {
    fsched::WaitGroup wg;
    wg.add(count);
    for (int i = 0; i < count; ++i) {
        fsched::Scheduler::current()->schedule([&wg, &job, i] {
            job(i);
            wg.done();
        });
    }
    wg.wait();  // parks this fiber; the worker runs the jobs meanwhile
}

}  // namespace

int main() {
    std::vector<Body> bodies(16 * chunk_size);
    const int chunks = static_cast<int>(bodies.size()) / chunk_size;
    fsched::Scheduler scheduler(4, /*use_caller=*/false, "frames");
    scheduler.start();

    fsched::WaitGroup game_over;
    game_over.add(1);
    scheduler.schedule([&] {  // the game loop is itself a fiber
        for (int frame = 0; frame < 5; ++frame) {
            const float dt = 1.0f / 60.0f;
            parallel_for(chunks, [&](int c) {  // physics
                for (int i = c * chunk_size; i < (c + 1) * chunk_size; ++i) {
                    bodies[i].velocity -= 9.8f * dt;
                    bodies[i].position += bodies[i].velocity * dt;
                }
            });
            parallel_for(chunks, [&](int c) {  // animation, after every physics job
                for (int i = c * chunk_size; i < (c + 1) * chunk_size; ++i) {
                    bodies[i].pose = std::sin(bodies[i].position);
                }
            });
            double total = 0;  // the frame's statistics, after every animation job
            for (const Body& b : bodies) total += b.pose;
            std::printf("frame %d: mean pose %.6f\n", frame, total / static_cast<double>(bodies.size()));
        }
        game_over.done();
    });
    game_over.wait();  // a plain thread can wait on a WaitGroup too
    scheduler.stop();
}
