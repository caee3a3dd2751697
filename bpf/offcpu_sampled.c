/* SPDX-License-Identifier: Apache-2.0
 *
 * Off-CPU time, duration-weighted sampling: the default off-CPU profile.
 *
 * Walking stacks at every context switch is what makes off-CPU profiling
 * expensive (offcpu.c: about 3 us per switch with kernel and user stacks). This
 * program walks them only for the blocks it chooses, and chooses by duration
 * once the duration is known:
 *
 *   switch-out (prev)    time and state into the thread's task storage: cheap
 *   wakeup               the wakeup time, into the wakee's task storage
 *   switch-in (next)     d = blocked time, switch-out to wakeup. Taken with probability
 *                        p = min(1, d / sample_ns); a taken block counts for
 *                        d / p nanoseconds and 1 / p blocks, so totals stay
 *                        unbiased while a block of 2 us costs 1/500 of a stack
 *                        walk at sample_ns = 1 ms and long blocks are always
 *                        taken. The kernel stack of next, still asleep in
 *                        schedule(), is walked here (bpf_get_task_stack).
 *   back to user space   the user stack (rseq_update, optionally sys_exit):
 *                        the thread is current again with the user registers
 *                        it blocked with, so its user stack is the one it
 *                        blocked in.
 *   its next switch-out  a chosen block not yet counted (a kernel thread, or
 *                        a thread those hooks missed) is counted there; its
 *                        user stack is taken only if the thread cannot have
 *                        been back in user space (a resume hook has seen it
 *                        and its user registers are still those of the
 *                        block), and is otherwise marked late, never guessed.
 *
 * Off-CPU time is blocked time: from switch-out to the wakeup (sched_waking
 * notes its time), as in offcpu.c. The wait for a CPU after the wakeup is
 * run-queue time, the runqlat profile's; a thread switched out runnable
 * (preempted) is only timed on request (--state 0), whole, as bcc's
 * offcputime does.
 *
 * Attached as BTF tracepoints (tp_btf), loaded by daemon/ember/kernel/tp_btf.py: they get
 * the task pointers, which task storage and bpf_get_task_stack need. Kernel
 * structs are never read through header offsets: only helpers, and struct
 * pt_regs, whose layout is the x86-64 entry ABI.
 */
#include "common.h"
#include "census.h"

struct ember_stack {
    u64 ips[EMBER_MAX_STACK_DEPTH];
};

BPF_TASK_STORAGE(ember_blocks, struct ember_block);
BPF_PERCPU_ARRAY(ember_scratch, struct ember_stack, 1);
/* Allocated on demand (only chosen blocks store a kernel stack here), so
 * their memory follows use, not EMBER_STACK_ENTRIES. */
BPF_F_TABLE("hash", u32, struct ember_stack, ember_tstacks_0, EMBER_STACK_ENTRIES,
            BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u32, struct ember_stack, ember_tstacks_1, EMBER_STACK_ENTRIES,
            BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u32, struct ember_stack, ember_tstacks_2, EMBER_STACK_ENTRIES,
            BPF_F_NO_PREALLOC);

static __always_inline u32 ember_raw_state(bool preempt, u32 raw)
{
    if (preempt || raw == 0)
        return EMBER_STATE_RUNNABLE;
    if (raw == (EMBER_RAW_TASK_NOLOAD | EMBER_STATE_UNINTERRUPTIBLE))
        return EMBER_STATE_IDLE;
    if (raw & EMBER_RAW_TASK_RTLOCK_WAIT)
        return EMBER_STATE_UNINTERRUPTIBLE;
    return raw & EMBER_RAW_TASK_REPORT;
}

/* The user registers the thread entered the kernel with. */
static __always_inline void ember_user_regs(struct task_struct *task, u64 *ip, u64 *sp)
{
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    *ip = 0;
    *sp = 0;
    if (!regs)
        return;
    bpf_probe_read_kernel(ip, sizeof(*ip), &regs->ip);
    bpf_probe_read_kernel(sp, sizeof(*sp), &regs->sp);
}

static __always_inline int ember_tstack_insert(u32 slot, u32 *id, struct ember_stack *buf,
                                               struct ember_stack **old)
{
    int rc;
    if (slot == 2) {
        rc = ember_tstacks_2.insert(id, buf);
        *old = rc == -EEXIST ? ember_tstacks_2.lookup(id) : 0;
    } else if (slot == 1) {
        rc = ember_tstacks_1.insert(id, buf);
        *old = rc == -EEXIST ? ember_tstacks_1.lookup(id) : 0;
    } else {
        rc = ember_tstacks_0.insert(id, buf);
        *old = rc == -EEXIST ? ember_tstacks_0.lookup(id) : 0;
    }
    return rc;
}

/* The kernel stack of a thread that is not running, stored by content hash
 * in the generation stack_epoch. Returns an id with EMBER_TASK_STACK_BIT, or
 * a negative errno as bpf_get_stackid would (-EEXIST: a different stack
 * holds the id). */
static __always_inline s32 ember_task_kstack(struct task_struct *task, u32 stack_epoch)
{
    u32 zero = 0;
    struct ember_stack *buf = ember_scratch.lookup(&zero);
    if (!buf)
        return -ENOMEM;
    long n = bpf_get_task_stack(task, buf->ips, sizeof(buf->ips), 0);
    if (n <= 0)
        return n < 0 ? (s32)n : -EFAULT;
    u64 h = 0xcbf29ce484222325ULL; /* FNV-1a over the addresses */
    for (int i = 0; i < EMBER_MAX_STACK_DEPTH; i++) {
        if (!buf->ips[i])
            break;
        h = (h ^ buf->ips[i]) * 0x100000001b3ULL;
    }
    u32 id = ((u32)(h ^ (h >> 32)) & (EMBER_TASK_STACK_BIT - 1)) | EMBER_TASK_STACK_BIT;
    struct ember_stack *old = 0;
    int rc = ember_tstack_insert(stack_epoch % EMBER_STACK_GENERATIONS, &id, buf, &old);
    if (rc == 0)
        return id;
    if (rc != -EEXIST || !old)
        return rc;
    for (int i = 0; i < EMBER_MAX_STACK_DEPTH; i++) {
        if (old->ips[i] != buf->ips[i])
            return -EEXIST;
        if (!buf->ips[i])
            break;
    }
    return id;
}

/* Count the chosen block of the current thread (b->weight_ns != 0); its user
 * stack is taken if exact_user (the thread is still in the kernel entry it
 * blocked in), else marked late. With tables (a resume hook that can
 * tail-call the walk), a process with unwind tables gets the state back
 * instead: the caller walks its user stack, then counts. */
static __always_inline void *ember_count_block(void *ctx, struct ember_config *cfg,
                                               struct ember_block *b, bool exact_user,
                                               bool tables)
{
    u64 id = bpf_get_current_pid_tgid();
    struct ember_key key = {};
    key.pid = id >> 32;
    key.tid = (u32)id;
    key.kind = EMBER_KIND_BLOCKED;
    key.epoch = cfg->epoch;
    key.state = b->pending_state;
    key.kernel_stack_id = b->kernel_stack_id;
    key.stack_epoch = b->stack_epoch;
    if (cfg->epoch > b->stack_epoch + 1) {
        /* a drain has recycled the slot holding the kernel stack */
        if (key.kernel_stack_id >= 0) {
            key.kernel_stack_id = EMBER_STACK_STALE;
            ember_stat_add(EMBER_STAT_KERNEL_STACK_STALE, 1);
        }
        key.stack_epoch = cfg->epoch;
    }
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    ember_note_pid(key.pid);
    u64 n = b->weight_count, ns = b->weight_ns;
    b->weight_ns = 0;
    key.user_stack_id = EMBER_STACK_NONE;
    if (cfg->stack_flags & EMBER_STACK_USER) {
        if (exact_user) {
#if EMBER_UNWIND
            if (tables) {
                struct ember_unwind_state *st = ember_unwind_begin(key.pid, key.stack_epoch);
                if (st) {
                    st->key = key;
                    st->n = n;
                    st->ns = ns;
                    return st;
                }
            }
#endif
            key.user_stack_id = ember_stackid(ctx, key.stack_epoch, BPF_F_USER_STACK);
            ember_stack_error(key.user_stack_id, EMBER_STAT_USER_STACK_COLLISION,
                              EMBER_STAT_USER_STACK_ERROR);
        } else {
            u64 probe;
            /* 0 frames: a kernel thread (get_perf_callchain skips PF_KTHREAD) */
            if (bpf_get_stack(ctx, &probe, sizeof(probe), BPF_F_USER_STACK) <= 0) {
                key.user_stack_id = -EFAULT; /* a kernel thread: no user stack */
            } else {
                key.user_stack_id = EMBER_STACK_LATE;
                ember_stat_add(EMBER_STAT_USER_STACK_LATE, 1);
            }
        }
    }
    ember_count_n(&key, n, ns);
    return 0;
}

#if EMBER_UNWIND
/* One step program and prog array per hook: a tracing program may only
 * tail-call programs attached where it is. */
BPF_PROG_ARRAY(ember_unwind_progs_switch, 1);
BPF_PROG_ARRAY(ember_unwind_progs_resume, 1);
BPF_PROG_ARRAY(ember_unwind_progs_resume_exit, 1);

int ember_unwind_step_switch(u64 *ctx)
{
    u32 zero = 0;
    struct ember_unwind_state *st = ember_unwind_state.lookup(&zero);
    if (!st)
        return 0;
    if (ember_unwind_walk(st)) {
        ember_unwind_progs_switch.call(ctx, 0);
        st->stack.end = EMBER_UNWIND_END_TRUNCATED; /* out of tail calls */
    }
    ember_unwind_count(st);
    return 0;
}
#endif

/* next switches in: its blocked time ends (at its wakeup, if seen); choose
 * whether its block is recorded, and note its kernel stack and registers for
 * the resume hook. */
static __always_inline void ember_switch_in(struct ember_config *cfg, struct task_struct *next,
                                            u64 now)
{
    struct ember_block *b = ember_blocks.task_storage_get(next, 0, 0);
    if (!b || !b->ts)
        return;
    /* what a drain charged of it in flight is not counted again: the swap
     * ends the census's claim on the block (ember_sampled_census) */
    u64 charged = __sync_lock_test_and_set(&b->charged, EMBER_CHARGED_DONE);
    /* blocked until the wakeup; a thread with no wakeup seen (preempted, or
     * woken before we knew of it) until now */
    u64 end = b->wake_ts >= b->ts && b->wake_ts <= now ? b->wake_ts : now;
    u64 d = end - b->ts;
    u64 from = charged > b->ts && charged != EMBER_CHARGED_DONE ? charged : b->ts;
    u64 part = end > from ? end - from : 0; /* the time not charged yet */
    b->ts = 0;
    if (d < cfg->min_block_ns) {
        ember_stat_add(EMBER_STAT_BELOW_MIN, 1);
        return;
    }
    if (cfg->max_block_ns && d > cfg->max_block_ns) {
        ember_stat_add(EMBER_STAT_ABOVE_MAX, 1);
        return;
    }
    ember_stat_add(EMBER_STAT_EVENTS, 1);
    u64 t = cfg->sample_ns;
    u64 weight_count = 1, weight_ns = part;
    if (t && d < t) {
        /* taken with probability d / t; then it stands for t / d blocks,
         * rounded at random so the count stays unbiased, and t ns (of which
         * the part not charged in flight: part * t / d) */
        if (((u64)bpf_get_prandom_u32() * t) >> 32 >= d)
            return;
        u64 whole = t / d, frac = ((t % d) << 32) / d;
        weight_count = whole + ((u64)bpf_get_prandom_u32() < frac ? 1 : 0);
        weight_ns = part == d ? t : part * t / d;
    }
    ember_stat_add(EMBER_STAT_SAMPLED, 1);
    u32 epoch = cfg->epoch;
    b->stack_epoch = epoch;
    b->pending_state = b->state;
    b->weight_count = weight_count;
    b->kernel_stack_id = EMBER_STACK_NONE;
    if (cfg->stack_flags & EMBER_STACK_KERNEL) {
        b->kernel_stack_id = ember_task_kstack(next, epoch);
        ember_stack_error(b->kernel_stack_id, EMBER_STAT_KERNEL_STACK_COLLISION,
                          EMBER_STAT_KERNEL_STACK_ERROR);
    }
    ember_user_regs(next, &b->user_ip, &b->user_sp);
    b->weight_ns = weight_ns; /* last: marks the block pending */
    if (!weight_ns)
        b->weight_ns = 1; /* all charged in flight: still one block to count */
}

/* tp_btf/sched_switch(bool preempt, prev, next, unsigned int prev_state) */
int ember_sampled_switch(u64 *ctx)
{
    struct ember_config *cfg = ember_get_config();
    if (!cfg)
        return 0;
    struct task_struct *prev = (struct task_struct *)ctx[1];
    struct task_struct *next = (struct task_struct *)ctx[2];
    u64 now = bpf_ktime_get_ns();

    u64 id = bpf_get_current_pid_tgid();
    struct ember_block *pending = 0;
    bool exact_user = false;
    if ((u32)id != 0) {
        struct ember_block *b = ember_blocks.task_storage_get(prev, 0, 0);
        if (b && b->weight_ns) {
            /* chosen earlier and not counted at a system call exit: counted
             * last, below (its user stack walk may tail-call) */
            u64 ip, sp;
            ember_user_regs(prev, &ip, &sp);
            pending = b;
            exact_user = b->resume_seen && ip == b->user_ip && sp == b->user_sp;
        }
        bool preempt = (bool)ctx[0];
        u32 raw = (u32)ctx[3];
        u32 state = ember_raw_state(preempt, raw);
        if (!preempt && (raw & EMBER_RAW_TASK_DEAD)) {
            /* the thread's last switch */
        } else if (state == EMBER_STATE_RUNNABLE ? !(cfg->state_mask & EMBER_STATE_RUNNABLE)
                                                 : cfg->state_mask && !(state & cfg->state_mask)) {
            /* preempted threads only on request (--state 0): runqlat times them */
            ember_stat_add(EMBER_STAT_STATE_FILTERED, 1);
        } else if (!ember_wanted(cfg, id >> 32)) {
            ember_stat_add(EMBER_STAT_FILTERED, 1);
        } else {
            if (!b)
                b = ember_blocks.task_storage_get(prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
            if (b) {
                b->ts = now;
                b->charged = now;
                b->wake_ts = 0;
                b->state = state;
            } else {
                ember_stat_add(EMBER_STAT_THREADS_FULL, 1);
            }
        }
    }

    ember_switch_in(cfg, next, now);
    if (!pending)
        return 0;
    void *walk = ember_count_block(ctx, cfg, pending, exact_user, true);
#if EMBER_UNWIND
    struct ember_unwind_state *st = walk;
    if (st) {
        ember_unwind_progs_switch.call(ctx, 0);
        ember_unwind_count_with(st, ember_unwind_fp(ctx, st), EMBER_UNWINDER_FP);
    }
#endif
    (void)walk;
    return 0;
}

/* tp_btf/sched_waking(struct task_struct *p): the waker is current. Note
 * when a thread we are timing is woken: its blocked time ends here. A few
 * tens of nanoseconds per wakeup (one task storage lookup). */
int ember_sampled_waking(u64 *ctx)
{
    struct task_struct *p = (struct task_struct *)ctx[0];
    struct ember_block *b = ember_blocks.task_storage_get(p, 0, 0);
    if (b && b->ts && !b->wake_ts)
        b->wake_ts = bpf_ktime_get_ns();
    return 0;
}

/* Back to user space: the thread is current, with the user registers it
 * entered the kernel with.
 *
 * tp_btf/rseq_update fires once on the way back to user space after every
 * switch-out (prepare_task_switch() sets TIF_NOTIFY_RESUME for rseq), for
 * threads that registered rseq: every thread of glibc >= 2.35. It costs one
 * program run per switch. tp_btf/sys_exit (optional) also covers threads
 * without rseq (Go, musl, older glibc), but enabling it puts every system
 * call of the host on the slow path. */
static __always_inline void *ember_resume(u64 *ctx)
{
    struct ember_block *b = ember_blocks.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!b || !b->weight_ns)
        return 0;
    b->resume_seen = 1;
    struct ember_config *cfg = ember_get_config();
    if (!cfg)
        return 0;
    return ember_count_block(ctx, cfg, b, true, true);
}

#if EMBER_UNWIND
int ember_unwind_step_resume(u64 *ctx)
{
    u32 zero = 0;
    struct ember_unwind_state *st = ember_unwind_state.lookup(&zero);
    if (!st)
        return 0;
    if (ember_unwind_walk(st)) {
        ember_unwind_progs_resume.call(ctx, 0);
        st->stack.end = EMBER_UNWIND_END_TRUNCATED; /* out of tail calls */
    }
    ember_unwind_count(st);
    return 0;
}

int ember_unwind_step_resume_exit(u64 *ctx)
{
    u32 zero = 0;
    struct ember_unwind_state *st = ember_unwind_state.lookup(&zero);
    if (!st)
        return 0;
    if (ember_unwind_walk(st)) {
        ember_unwind_progs_resume_exit.call(ctx, 0);
        st->stack.end = EMBER_UNWIND_END_TRUNCATED;
    }
    ember_unwind_count(st);
    return 0;
}
#endif

int ember_sampled_resume(u64 *ctx)
{
    void *pending = ember_resume(ctx);
#if EMBER_UNWIND
    struct ember_unwind_state *st = pending;
    if (st) {
        ember_unwind_progs_resume.call(ctx, 0);
        ember_unwind_count_with(st, ember_unwind_fp(ctx, st), EMBER_UNWINDER_FP);
    }
#endif
    (void)pending;
    return 0;
}

/* The same at tp_btf/sys_exit (optional): a function of its own, for its own
 * prog array. */
int ember_sampled_resume_exit(u64 *ctx)
{
    void *pending = ember_resume(ctx);
#if EMBER_UNWIND
    struct ember_unwind_state *st = pending;
    if (st) {
        ember_unwind_progs_resume_exit.call(ctx, 0);
        ember_unwind_count_with(st, ember_unwind_fp(ctx, st), EMBER_UNWINDER_FP);
    }
#endif
    (void)pending;
    return 0;
}

/* iter/task, run by each drain after its flip: charge the blocks in flight.
 * For each thread blocked since before the boundary in effect, claim the
 * block's time up to the boundary by swapping `charged` from what it was to
 * the boundary, and hand the daemon the claimed span with the thread's
 * kernel stack (stored as a switch-in would) and user registers. A thread
 * switching in at the same time swaps `charged` to EMBER_CHARGED_DONE
 * first or after: the compare-and-swap fails, or it counts from the
 * boundary. Either way no nanosecond is counted twice or lost. */
int ember_sampled_census(struct ember_iter_task *ctx)
{
    struct task_struct *task = ctx->task;
    struct ember_config *cfg = ember_get_config();
    if (!task || !cfg)
        return 0;
    struct ember_block *b = ember_blocks.task_storage_get(task, 0, 0);
    if (!b || !b->ts)
        return 0;
    u32 epoch = cfg->epoch;
    u64 bound = ember_bound(epoch);
    u64 was = b->charged;
    if (!bound || was >= bound || was < b->ts)
        return 0; /* began after the boundary, charged already, or ended */
    /* the block limits as its switch-in applies them: a block shorter than
     * the minimum so far is left whole to its switch-in (which may take it
     * once it is long enough); one longer than the maximum is never taken */
    if (bound - b->ts < cfg->min_block_ns ||
        (cfg->max_block_ns && bound - b->ts > cfg->max_block_ns))
        return 0;
    if (__sync_val_compare_and_swap(&b->charged, was, bound) != was)
        return 0; /* it ended meanwhile: counted at its switch-in */
    struct ember_in_flight f = {};
    char *base = (char *)task;
    bpf_probe_read_kernel(&f.tid, sizeof(f.tid), base + EMBER_TASK_PID);
    bpf_probe_read_kernel(&f.pid, sizeof(f.pid), base + EMBER_TASK_TGID);
    bpf_probe_read_kernel_str(f.comm, sizeof(f.comm), base + EMBER_TASK_COMM);
    f.state = b->state;
    f.from_ns = was;
    f.since_ns = b->ts;
    /* blocked time ends at the wakeup: a woken thread waits for a CPU */
    f.to_ns = b->wake_ts >= b->ts && b->wake_ts < bound ? b->wake_ts : bound;
    f.stack_epoch = epoch;
    f.kernel_stack_id = EMBER_STACK_NONE;
    if (cfg->stack_flags & EMBER_STACK_KERNEL)
        f.kernel_stack_id = ember_task_kstack(task, epoch);
    if (cfg->stack_flags & EMBER_STACK_USER) {
        u64 ip, sp;
        ember_user_regs(task, &ip, &sp);
        f.ip = ip;
        f.sp = sp;
        struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
        if (regs)
            bpf_probe_read_kernel(&f.bp, sizeof(f.bp), &regs->bp);
    }
    bpf_seq_write(ctx->meta->seq, &f, sizeof(f));
    return 0;
}
