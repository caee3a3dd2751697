/* SPDX-License-Identifier: Apache-2.0
 *
 * The floors of off-CPU profiling cost, for bench/suite.py: a sched_switch
 * program that does nothing, and one that only does what any off-CPU
 * profiler must (store the switch-out time, read it back at switch-in).
 * Attached as BTF tracepoints, like ember's own sampled program.
 */
struct task_struct;

BPF_TASK_STORAGE(floor_ts, u64);
BPF_ARRAY(floor_sum, u64, 1);

int floor_empty(u64 *ctx)
{
    return 0;
}

int floor_timestamp(u64 *ctx)
{
    struct task_struct *prev = (struct task_struct *)ctx[1];
    struct task_struct *next = (struct task_struct *)ctx[2];
    u64 now = bpf_ktime_get_ns();
    u64 *ts = floor_ts.task_storage_get(prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (ts)
        *ts = now;
    ts = floor_ts.task_storage_get(next, 0, 0);
    if (ts && *ts) {
        u32 zero = 0;
        u64 *sum = floor_sum.lookup(&zero);
        if (sum)
            __sync_fetch_and_add(sum, now - *ts);
        *ts = 0;
    }
    return 0;
}
