// particles.cpp: one step of a particle simulation per frame, the update split over the
// workers with parallel_for; then a parallel_for_chunks reduction (one partial sum per
// chunk) checks that the energy comes out as the serial computation says.
#define FIBER_SCHED_IMPLEMENTATION
#include "fiber_sched.hpp"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <vector>

struct Particle {
    double x, y, vx, vy;
};

int main() {
    fsched::Scheduler scheduler(4, /*use_caller=*/true, "particles");  // this thread is worker 0
    scheduler.start();

    const std::size_t count = 100000;
    std::vector<Particle> particles(count), reference(count);
    for (std::size_t i = 0; i < count; ++i) {
        particles[i] = {static_cast<double>(i % 100), static_cast<double>(i / 100), 1.0 + (i % 7), -2.0 + (i % 5)};
    }
    reference = particles;

    const double dt = 0.01, gravity = -9.81;
    auto step = [&](Particle& p) {
        p.vy += gravity * dt;
        p.x += p.vx * dt;
        p.y += p.vy * dt;
        if (p.y < 0) {  // bounce off the floor
            p.y = -p.y;
            p.vy = -p.vy * 0.9;
        }
    };
    for (int frame = 0; frame < 60; ++frame) {
        // Chunks of at least 1024 particles; this (use_caller) thread runs chunks as it waits.
        fsched::parallel_for(scheduler, 0, count, 1024, [&](std::size_t i) { step(particles[i]); });
        for (Particle& p : reference) step(p);  // the serial answer, to compare with
    }

    // Kinetic energy: each chunk sums its own share, then adds it in once.
    std::mutex total_mutex;
    double energy = 0;
    fsched::parallel_for_chunks(scheduler, 0, count, 4096, [&](std::size_t begin, std::size_t end) {
        double part = 0;
        for (std::size_t i = begin; i < end; ++i) {
            part += 0.5 * (particles[i].vx * particles[i].vx + particles[i].vy * particles[i].vy);
        }
        std::lock_guard<std::mutex> lock(total_mutex);
        energy += part;
    });
    double expected = 0;
    for (const Particle& p : reference) expected += 0.5 * (p.vx * p.vx + p.vy * p.vy);
    scheduler.stop();

    bool same = true;  // each particle's update is the same arithmetic either way: exact
    for (std::size_t i = 0; i < count; ++i) {
        same = same && particles[i].x == reference[i].x && particles[i].y == reference[i].y;
    }
    std::printf("60 frames of %d particles; kinetic energy %.3f (serial %.3f)\n", static_cast<int>(count), energy,
                expected);
    return same && std::fabs(energy - expected) <= 1e-9 * expected ? 0 : 1;
}
