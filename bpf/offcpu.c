/* SPDX-License-Identifier: Apache-2.0
 *
 * Off-CPU time from sched:sched_switch. The tracepoint runs in the context of
 * the thread switching out (prev): its stacks are the stacks it blocked in, so
 * they are captured there and kept in ember_starts with the time. When the
 * thread switches back in (it is `next` of a later switch), the elapsed time
 * is added to the counts of those stacks. Only tracepoint fields and helpers
 * are read: no kernel struct offsets.
 */
#include "common.h"

BPF_HASH(ember_starts, u32, struct ember_start, EMBER_THREAD_ENTRIES);

static __always_inline u32 ember_state(long prev_state)
{
    /* TASK_RUNNING (0) and "preempted" (TASK_REPORT_MAX, printed R+) are
     * both runnable: the thread wanted the CPU and did not get it. */
    if (prev_state == 0 || (prev_state & EMBER_STATE_RUNNABLE))
        return EMBER_STATE_RUNNABLE;
    return (u32)prev_state & (EMBER_STATE_RUNNABLE - 1);
}

/* Attached by the loader (not auto-attached as TRACEPOINT_PROBE would be), so
 * the configuration is in place before the first event. */
int ember_sched_switch(struct tracepoint__sched__sched_switch *args)
{
    struct ember_config *cfg = ember_get_config();
    if (!cfg)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 epoch = cfg->epoch;

    /* prev switches out: remember when, and where it was. */
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (tid != 0) {
        u32 state = ember_state(args->prev_state);
        if (!ember_wanted(cfg, tgid)) {
            ember_stat_add(EMBER_STAT_FILTERED, 1);
        } else if (state & (EMBER_STATE_EXIT_DEAD | EMBER_STATE_EXIT_ZOMBIE)) {
            /* the thread's last switch: it never comes back. */
        } else if (cfg->state_mask && !(state & cfg->state_mask)) {
            ember_stat_add(EMBER_STAT_STATE_FILTERED, 1);
        } else {
            struct ember_start start = {};
            start.ts = now;
            start.pid = tgid;
            start.state = state;
            start.stack_epoch = epoch;
            bpf_get_current_comm(&start.comm, sizeof(start.comm));
            ember_capture_stacks(args, epoch, cfg->stack_flags, &start.user_stack_id,
                                 &start.kernel_stack_id, &start.unwinder);
            if (ember_starts.update(&tid, &start))
                ember_stat_add(EMBER_STAT_THREADS_FULL, 1);
            ember_note_pid(tgid);
        }
    }

    /* next switches in: its time off-CPU ends now. */
    u32 next = args->next_pid;
    if (next == 0)
        return 0;
    struct ember_start *sp = ember_starts.lookup(&next);
    if (!sp)
        return 0;
    struct ember_start start = *sp;
    ember_starts.delete(&next);

    u64 delta = now - start.ts;
    if (delta < cfg->min_block_ns) {
        ember_stat_add(EMBER_STAT_BELOW_MIN, 1);
        return 0;
    }
    if (cfg->max_block_ns && delta > cfg->max_block_ns) {
        ember_stat_add(EMBER_STAT_ABOVE_MAX, 1);
        return 0;
    }
    ember_stat_add(EMBER_STAT_EVENTS, 1);

    struct ember_key key = {};
    key.pid = start.pid;
    key.tid = next;
    key.user_stack_id = start.user_stack_id;
    key.kernel_stack_id = start.kernel_stack_id;
    key.epoch = epoch;
    key.stack_epoch = start.stack_epoch;
    key.state = start.state;
    key.unwinder = start.unwinder;
    __builtin_memcpy(key.comm, start.comm, sizeof(key.comm));
    ember_count(&key, delta);
    return 0;
}
