module fiber_sched/bench/go

go 1.19
