// game_frame.cpp: a game's frame loop on the main thread, which takes part in the work.
//
// A game engine's main thread owns the frame: each frame it fans out jobs, waits for them
// and presents. Here the main thread is the scheduler's use_caller thread (worker 0), so
// while it waits on a stage's WaitGroup it runs jobs itself instead of sleeping, and it is
// the only thread that runs jobs pinned to worker 0: the place for work that must happen on
// the main thread (window events, GPU uploads on APIs that want one thread). stop() is
// called once, at shutdown.
//
// Each of the 1,000 frames:
//   physics    256 jobs, one per chunk of bodies;
//   animation  128 jobs, each needs two physics chunks (so the stage starts after physics);
//   culling     64 jobs, each needs the animation of two pairs;
//   a "stream request" job at Priority::High, scheduled after all of physics: it must not
//   wait behind the frame's bulk work (think: an audio buffer or a texture the GPU waits for);
//   an "upload" job pinned to worker 0: it runs on the main thread, inside its waits.
// At the end it prints frame-time percentiles and how early the High job finished.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int frames = 1000;
constexpr int physics_jobs = 256, animation_jobs = 128, culling_jobs = 64;
constexpr int bodies_per_chunk = 64;

// A few microseconds of arithmetic standing in for a job's real work.
float simulate(float* values, int n, float dt) {
    float sum = 0;
    for (int i = 0; i < n; ++i) {
        values[i] = values[i] * 0.999f + std::sin(values[i] + dt);
        sum += values[i];
    }
    return sum;
}

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size())));
    return v[i];
}

}  // namespace

int main() {
    // The main thread plus one worker thread; more cores, more workers.
    const std::size_t workers = std::max(2u, std::thread::hardware_concurrency());
    fsched::Scheduler scheduler(workers, /*use_caller=*/true, "frame");
    scheduler.start();
    const std::thread::id main_thread = std::this_thread::get_id();

    std::vector<float> bodies(physics_jobs * bodies_per_chunk, 1.0f);
    std::vector<float> physics(physics_jobs), animation(animation_jobs), culling(culling_jobs);
    std::vector<double> frame_ms;
    frame_ms.reserve(frames);
    long uploads_off_main = 0;
    double high_rank_sum = 0;  // how many physics jobs overtook the High job
    int high_rank_max = 0;

    for (int frame = 0; frame < frames; ++frame) {
        const Clock::time_point start = Clock::now();
        const float dt = 1.0f / 60.0f;
        std::atomic<int> physics_done{0};

        // Stage 1: physics, one job per chunk. Jobs scheduled from the main thread are
        // spread over the workers; the main thread runs its share while it waits below.
        fsched::WaitGroup physics_wg(physics_jobs);
        for (int c = 0; c < physics_jobs; ++c) {
            scheduler.schedule([&, c] {
                physics[c] = simulate(&bodies[static_cast<std::size_t>(c) * bodies_per_chunk], bodies_per_chunk, dt);
                physics_done.fetch_add(1, std::memory_order_relaxed);
                physics_wg.done();
            });
        }
        // Scheduled last, runs first: each worker takes High jobs before Normal ones.
        // How many physics jobs overtake it: those finished when it runs, less those
        // already finished when it was scheduled (the workers start while we schedule).
        const int done_before = physics_done.load(std::memory_order_relaxed);
        int high_rank = 0;
        fsched::WaitGroup high_wg(1);
        scheduler.schedule([&] {
            high_rank = physics_done.load(std::memory_order_relaxed) - done_before;
            high_wg.done();
        }, -1, fsched::Priority::High);
        // Must run on the main thread: pinned to worker 0, which only the main thread is.
        bool upload_on_main = false;
        scheduler.schedule([&] { upload_on_main = std::this_thread::get_id() == main_thread; }, 0);

        physics_wg.wait();  // the main thread runs jobs (the upload first) until physics is done

        // Stage 2: animation reads two physics results each, so it starts after physics.
        fsched::WaitGroup animation_wg(animation_jobs);
        for (int a = 0; a < animation_jobs; ++a) {
            scheduler.schedule([&, a] {
                animation[a] = physics[2 * a] * 0.5f + physics[2 * a + 1] * 0.5f;
                animation_wg.done();
            });
        }
        animation_wg.wait();

        // Stage 3: culling reads two animation results each.
        fsched::WaitGroup culling_wg(culling_jobs);
        for (int k = 0; k < culling_jobs; ++k) {
            scheduler.schedule([&, k] {
                float v = animation[2 * k] + animation[2 * k + 1];
                culling[k] = simulate(&v, 1, dt);
                culling_wg.done();
            });
        }
        culling_wg.wait();
        high_wg.wait();  // long done: it went before the bulk of physics
        // Anything else pinned to the main thread (none here) would run now, within 1 ms.
        scheduler.run_pending(std::chrono::milliseconds(1));

        frame_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        if (!upload_on_main) ++uploads_off_main;
        high_rank_sum += high_rank;
        high_rank_max = std::max(high_rank_max, high_rank);
    }
    scheduler.stop();  // once, at shutdown

    std::printf("%d frames of %d jobs on %zu workers (the main thread one of them)\n", frames,
                physics_jobs + animation_jobs + culling_jobs + 2, workers);
    std::printf("frame time: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms\n", percentile(frame_ms, 50),
                percentile(frame_ms, 90), percentile(frame_ms, 99), percentile(frame_ms, 100));
    std::printf("physics jobs that finished between scheduling the High job and its run: %.1f on average "
                "(at most %d; the rest of %d queued before it)\n",
                high_rank_sum / frames, high_rank_max, physics_jobs);
    std::printf("uploads that ran off the main thread: %ld (must be 0)\n", uploads_off_main);
    return uploads_off_main == 0 ? 0 : 1;
}
