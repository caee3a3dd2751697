/* SPDX-License-Identifier: Apache-2.0
 *
 * Off-CPU time from sched:sched_switch and sched:sched_waking.
 *
 * sched_switch runs in the context of the thread switching out (prev): its
 * stacks are the stacks it blocked in, so they are captured there and kept in
 * ember_starts with the time. sched_waking runs in the context of the waker:
 * the time, and (for the wakeup and off-wake profiles) the waker's stacks, go
 * into ember_wakes for the wakee. When the thread switches back in (it is
 * `next` of a later switch) its time off-CPU is split at the wakeup:
 *
 *   switch-out ........ wakeup ........ switch-in
 *   |<--- blocked ----->|<-- run queue ->|
 *
 * A preempted thread (still runnable) was waiting for a CPU all along.
 * Only tracepoint fields and helpers are read: no kernel struct offsets.
 *
 * Time is charged to the interval it passes in. Each drain writes its time
 * into ember_bounds[epoch % EMBER_BOUNDS] before flipping to that epoch, and
 * charges every block still in ember_starts up to it (a thread blocked for a
 * minute shows in each of the minute's intervals, not all at once when it
 * wakes). So blocked and run-queue time counted here starts at the boundary
 * in effect; a block that began before it goes into ember_crossed, for the
 * drain to charge what came before if it did not see the block in flight.
 * Wakeup and off-wake time is charged whole when the block ends: the waker
 * is not known before.
 */
/* the table unwinder's state carries a start or a wake (unwind_dwarf.h) */
#define EMBER_UNWIND_BLOCKS 1
#include "common.h"

BPF_HASH(ember_starts, u32, struct ember_start, EMBER_THREAD_ENTRIES);
BPF_HASH(ember_wakes, u32, struct ember_wake, EMBER_THREAD_ENTRIES);
BPF_HASH(ember_runq_hist, struct ember_hist_key, u64, EMBER_RUNQ_HIST_ENTRIES);
BPF_HASH(ember_crossed, u32, struct ember_crossed, EMBER_THREAD_ENTRIES);

#if EMBER_UNWIND
BPF_PROG_ARRAY(ember_unwind_progs_sched, 1);

#define EMBER_ACTION_START 0
#define EMBER_ACTION_WAKE 1

/* Keep the start (switch-out) or wake entry with its user stack. */
static __always_inline void ember_sched_finish_with(struct ember_unwind_state *st, s32 id,
                                                    u32 unwinder)
{
    u32 tid = st->tid;
    if (st->action == EMBER_ACTION_WAKE) {
        st->wake.user_stack_id = id;
        if (ember_wakes.update(&tid, &st->wake))
            ember_stat_add(EMBER_STAT_THREADS_FULL, 1);
    } else {
        st->start.user_stack_id = id;
        st->start.unwinder = unwinder;
        if (ember_starts.update(&tid, &st->start))
            ember_stat_add(EMBER_STAT_THREADS_FULL, 1);
    }
}

static __always_inline void ember_sched_finish(struct ember_unwind_state *st)
{
    ember_sched_finish_with(st, ember_unwind_store(st), EMBER_UNWINDER_DWARF);
}

/* Both hooks are classic tracepoints: one step program serves them. */
int ember_unwind_step_sched(void *ctx)
{
    u32 zero = 0;
    struct ember_unwind_state *st = ember_unwind_state.lookup(&zero);
    if (!st)
        return 0;
    if (ember_unwind_walk(st)) {
        ember_unwind_progs_sched.call(ctx, 0);
        st->stack.end = EMBER_UNWIND_END_TRUNCATED; /* out of tail calls */
    }
    ember_sched_finish(st);
    return 0;
}
#endif

static __always_inline u32 ember_state(long prev_state)
{
    /* TASK_RUNNING (0) and "preempted" (TASK_REPORT_MAX, printed R+) are
     * both runnable: the thread wanted the CPU and did not get it. */
    if (prev_state == 0 || (prev_state & EMBER_STATE_RUNNABLE))
        return EMBER_STATE_RUNNABLE;
    return (u32)prev_state & (EMBER_STATE_RUNNABLE - 1);
}

static __always_inline u32 ember_log2_us(u64 ns)
{
    u64 us = ns / 1000;
    u32 slot = 0;
    /* a bounded loop: the verifier accepts it (kernel >= 5.3) */
    for (int i = 0; i < EMBER_RUNQ_HIST_SLOTS - 1; i++) {
        if (us <= 1)
            break;
        us >>= 1;
        slot++;
    }
    return slot;
}

static __always_inline void ember_runq_observe(u32 pid, u64 ns)
{
    struct ember_hist_key hk = {.pid = pid, .slot = ember_log2_us(ns)};
    u64 zero = 0;
    u64 *n = ember_runq_hist.lookup_or_try_init(&hk, &zero);
    if (n)
        __sync_fetch_and_add(n, 1);
}

/* sched_waking: the waker is current; args->pid is the wakee. */
int ember_sched_waking(struct tracepoint__sched__sched_waking *args)
{
    u32 wakee = args->pid;
    if (!ember_starts.lookup(&wakee))
        return 0; /* not a thread we are timing */
    struct ember_config *cfg = ember_get_config();
    if (!cfg)
        return 0;
    struct ember_wake wake = {};
    wake.ts = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    wake.pid = id >> 32;
    wake.tid = (u32)id;
    wake.stack_epoch = cfg->epoch;
    bpf_get_current_comm(&wake.comm, sizeof(wake.comm));
    if (cfg->modes & (EMBER_MODE_WAKEUP | EMBER_MODE_OFFWAKE)) {
        /* a wakeup from an interrupt on the idle task has no user side */
        u32 flags = wake.tid ? cfg->stack_flags : (cfg->stack_flags & ~EMBER_STACK_USER);
        u32 unwinder;
#if EMBER_UNWIND
        struct ember_unwind_state *st = 0;
        if (flags & EMBER_STACK_USER)
            st = ember_unwind_begin(wake.pid, wake.stack_epoch);
        if (st) {
            ember_capture_stacks(args, wake.stack_epoch, flags & ~EMBER_STACK_USER,
                                 &wake.user_stack_id, &wake.kernel_stack_id, &unwinder);
            st->wake = wake;
            st->tid = wakee;
            st->action = EMBER_ACTION_WAKE;
            ember_unwind_progs_sched.call(args, 0);
            ember_sched_finish_with(st, ember_unwind_fp(args, st), EMBER_UNWINDER_FP);
            return 0;
        }
#endif
        ember_capture_stacks(args, wake.stack_epoch, flags, &wake.user_stack_id,
                             &wake.kernel_stack_id, &unwinder);
    } else {
        wake.user_stack_id = EMBER_STACK_NONE;
        wake.kernel_stack_id = EMBER_STACK_NONE;
    }
    if (ember_wakes.update(&wakee, &wake))
        ember_stat_add(EMBER_STAT_THREADS_FULL, 1);
    return 0;
}


/* next switches in: its time off-CPU ends now. Blocked and run-queue time is
 * counted from `bound` on (see the top). */
static __always_inline void ember_switch_in(struct ember_config *cfg, u32 next, u64 now,
                                            u32 epoch, u64 bound)
{
    if (next == 0)
        return;
    struct ember_start *sp = ember_starts.lookup(&next);
    if (!sp)
        return;
    struct ember_start start = *sp;
    ember_starts.delete(&next);
    struct ember_wake wake = {};
    struct ember_wake *wp = ember_wakes.lookup(&next);
    bool woken = false;
    if (wp) {
        wake = *wp;
        ember_wakes.delete(&next);
        woken = wake.ts >= start.ts && wake.ts <= now;
    }
    u64 from = start.ts;
    if (start.ts < bound) {
        struct ember_crossed crossed = {};
        crossed.start = start;
        crossed.wake_ts = woken ? wake.ts : 0;
        crossed.end_ts = now;
        crossed.epoch = epoch;
        if (ember_crossed.update(&next, &crossed))
            ember_stat_add(EMBER_STAT_THREADS_FULL, 1);
        from = bound;
    }

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

    u64 queued_since = from;  /* a preempted thread queued from the start */
    if (start.state != EMBER_STATE_RUNNABLE) {
        u64 end = woken ? wake.ts : now;
        u64 blocked = end - start.ts;
        queued_since = end > from ? end : from;
        if (blocked < cfg->min_block_ns) {
            ember_stat_add(EMBER_STAT_BELOW_MIN, 1);
        } else if (cfg->max_block_ns && blocked > cfg->max_block_ns) {
            ember_stat_add(EMBER_STAT_ABOVE_MAX, 1);
        } else {
            ember_stat_add(EMBER_STAT_EVENTS, 1);
            if (cfg->modes & EMBER_MODE_BLOCKED) {
                key.kind = EMBER_KIND_BLOCKED;
                ember_count(&key, end > from ? end - from : 0);
            }
            if (woken && (cfg->modes & EMBER_MODE_OFFWAKE)) {
                struct ember_key ok = key;
                ok.kind = EMBER_KIND_OFFWAKE;
                ok.peer_pid = wake.pid;
                ok.peer_tid = wake.tid;
                ok.peer_user_stack_id = wake.user_stack_id;
                ok.peer_kernel_stack_id = wake.kernel_stack_id;
                ok.peer_stack_epoch = wake.stack_epoch;
                __builtin_memcpy(ok.peer_comm, wake.comm, sizeof(ok.peer_comm));
                ember_count(&ok, blocked);
            }
            if (woken && (cfg->modes & EMBER_MODE_WAKEUP)) {
                /* the waker's view: its stacks, the wakee as the peer */
                struct ember_key wk = {};
                wk.kind = EMBER_KIND_WAKEUP;
                wk.pid = wake.pid;
                wk.tid = wake.tid;
                wk.user_stack_id = wake.user_stack_id;
                wk.kernel_stack_id = wake.kernel_stack_id;
                wk.stack_epoch = wake.stack_epoch;
                wk.epoch = epoch;
                wk.state = start.state;
                __builtin_memcpy(wk.comm, wake.comm, sizeof(wk.comm));
                wk.peer_pid = start.pid;
                wk.peer_tid = next;
                wk.peer_user_stack_id = EMBER_STACK_NONE;
                wk.peer_kernel_stack_id = EMBER_STACK_NONE;
                __builtin_memcpy(wk.peer_comm, start.comm, sizeof(wk.peer_comm));
                ember_count(&wk, blocked);
            }
        }
    }
    if ((cfg->modes & EMBER_MODE_RUNQ) && now > queued_since) {
        key.kind = EMBER_KIND_RUNQ;  /* the same thread and stacks, another kind */
        key.state = EMBER_STATE_RUNNABLE;
        ember_count(&key, now - queued_since);
        /* the latency histogram takes the whole wait, boundaries aside */
        u64 queued = start.ts;
        if (start.state != EMBER_STATE_RUNNABLE)
            queued = woken ? wake.ts : now;
        ember_runq_observe(start.pid, now - queued);
    }
}

/* Attached by the loader (not auto-attached as TRACEPOINT_PROBE would be), so
 * the configuration is in place before the first event. The thread switching
 * in is handled first: the one switching out may tail-call the table walk,
 * which does not come back. */
int ember_sched_switch(struct tracepoint__sched__sched_switch *args)
{
    struct ember_config *cfg = ember_get_config();
    if (!cfg)
        return 0;
    u32 epoch = cfg->epoch;
    u64 bound = ember_bound(epoch);
    u64 now = bpf_ktime_get_ns();  /* after the bound: never before it */
    ember_switch_in(cfg, args->next_pid, now, epoch, bound);

    /* prev switches out: remember when, and where it was. */
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (tid == 0)
        return 0;
    u32 state = ember_state(args->prev_state);
    bool runnable = state == EMBER_STATE_RUNNABLE;
    if (!ember_wanted(cfg, tgid)) {
        ember_stat_add(EMBER_STAT_FILTERED, 1);
        return 0;
    }
    if (state & (EMBER_STATE_EXIT_DEAD | EMBER_STATE_EXIT_ZOMBIE))
        return 0; /* the thread's last switch: it never comes back. */
    if (runnable ? !(cfg->modes & EMBER_MODE_RUNQ)
                 : (cfg->state_mask && !(state & cfg->state_mask))) {
        ember_stat_add(EMBER_STAT_STATE_FILTERED, 1);
        return 0;
    }
    struct ember_start start = {};
    start.ts = now;
    start.pid = tgid;
    start.state = state;
    start.stack_epoch = epoch;
    bpf_get_current_comm(&start.comm, sizeof(start.comm));
    ember_wakes.delete(&tid); /* a stale wakeup must not split this block */
    ember_note_pid(tgid);
#if EMBER_UNWIND
    if (cfg->stack_flags & EMBER_STACK_USER) {
        struct ember_unwind_state *st = ember_unwind_begin(tgid, epoch);
        if (st) {
            ember_capture_stacks(args, epoch, cfg->stack_flags & ~EMBER_STACK_USER,
                                 &start.user_stack_id, &start.kernel_stack_id,
                                 &start.unwinder);
            st->start = start;
            st->tid = tid;
            st->action = EMBER_ACTION_START;
            ember_unwind_progs_sched.call(args, 0);
            ember_sched_finish_with(st, ember_unwind_fp(args, st), EMBER_UNWINDER_FP);
            return 0;
        }
    }
#endif
    ember_capture_stacks(args, epoch, cfg->stack_flags, &start.user_stack_id,
                         &start.kernel_stack_id, &start.unwinder);
    if (ember_starts.update(&tid, &start))
        ember_stat_add(EMBER_STAT_THREADS_FULL, 1);
    return 0;
}
