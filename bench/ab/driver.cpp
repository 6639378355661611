// A/B of builds of fiber_sched in one process: each shared object given (create_lib.cpp
// compiled against one header) runs a batch in turn, so a slow spell of the machine slows
// them all alike; prints each build's min, p10 and median ns per fiber and its per-batch
// ratio to the first build's (p25, median, p75).
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
    constexpr int batches = 600, per_batch = 2000;
    std::vector<double (*)(int)> builds;
    for (int i = 1; i < argc; ++i) {
        void* lib = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            std::fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        builds.push_back(reinterpret_cast<double (*)(int)>(dlsym(lib, "fsched_ab_create_batch")));
    }
    if (builds.empty()) {
        std::fprintf(stderr, "usage: %s BUILD.so...\n", argv[0]);
        return 2;
    }
    std::vector<std::vector<double>> ns(builds.size());
    for (int b = 0; b < batches; ++b) {
        for (std::size_t k = 0; k < builds.size(); ++k) ns[k].push_back(builds[k](per_batch));
    }
    std::printf("create + run + destroy, 64 KiB stack: ns per fiber, %d batches of %d\n", batches, per_batch);
    for (std::size_t k = 0; k < builds.size(); ++k) {
        std::vector<double> ratio;
        for (int b = 0; b < batches; ++b) ratio.push_back(ns[k][b] / ns[0][b]);
        std::vector<double> sorted = ns[k];
        std::sort(sorted.begin(), sorted.end());
        std::sort(ratio.begin(), ratio.end());
        std::printf("  %-40s min %6.1f  p10 %6.1f  p50 %6.1f   over the first: %.3f / %.3f / %.3f\n", argv[k + 1],
                    sorted[0], sorted[batches / 10], sorted[batches / 2], ratio[batches / 4], ratio[batches / 2],
                    ratio[3 * batches / 4]);
    }
}
