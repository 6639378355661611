// The round trips of round_trip.sh in one process: each build registered (Boost first, then
// the headers in the order given) runs a batch in turn, so a slow spell of the machine slows
// them all alike; prints each one's min, p10 and median ns per round trip and its per-batch
// ratio to Boost's (p10, p25, median, p75).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {
struct Build {
    std::string name;
    double (*batch)(int);
};
std::vector<Build>& builds() {
    static std::vector<Build> list;
    return list;
}
}  // namespace

void ab_register(const char* name, double (*batch)(int)) {
    // Boost first: the ratios are to it.
    if (std::strncmp(name, "boost", 5) == 0) builds().insert(builds().begin(), Build{name, batch});
    else builds().push_back(Build{name, batch});
}

int main() {
    constexpr int batches = 1500, per_batch = 20000;
    auto& b = builds();
    std::vector<std::vector<double>> ns(b.size());
    for (auto& build : b) build.batch(1000);  // the fibers start
    for (int i = 0; i < batches; ++i)
        for (std::size_t k = 0; k < b.size(); ++k) ns[k].push_back(b[k].batch(per_batch));
    std::printf("resume + yield round trip: ns, %d batches of %d, each build in turn\n", batches, per_batch);
    for (std::size_t k = 0; k < b.size(); ++k) {
        std::vector<double> ratio;
        for (int i = 0; i < batches; ++i) ratio.push_back(ns[k][i] / ns[0][i]);
        std::vector<double> sorted = ns[k];
        std::sort(sorted.begin(), sorted.end());
        std::sort(ratio.begin(), ratio.end());
        std::printf("  %-40s min %6.2f  p10 %6.2f  p50 %6.2f   over %s: p10 %.3f  p25 %.3f  p50 %.3f  p75 %.3f\n",
                    b[k].name.c_str(), sorted[0], sorted[batches / 10], sorted[batches / 2], b[0].name.c_str(),
                    ratio[batches / 10], ratio[batches / 4], ratio[batches / 2], ratio[3 * batches / 4]);
    }
}
