/* SPDX-License-Identifier: Apache-2.0
 *
 * A census of threads: what each is doing now (state, since when it last
 * ran, its kernel stack, the user registers it entered the kernel with), from
 * a BPF task iterator. Reading the iterator's file runs the program once per
 * task of the system, in the reader's context; it writes a struct
 * ember_thread per thread it keeps.
 *
 * Task fields are read at offsets taken from the running kernel's BTF
 * (EMBER_TASK_* -D flags, daemon/ember/kernel/btf.py), never from headers.
 * The user stack is not walked here (the task's memory is not current's):
 * the daemon walks it from the registers (daemon/ember/unwind/remote.py).
 */
#ifndef EMBER_CENSUS_H
#define EMBER_CENSUS_H

struct seq_file;
struct task_struct;
/* The context of an iter/task program (the kernel's struct bpf_iter__task). */
struct ember_iter_meta {
    struct seq_file *seq;
    u64 session_id;
    u64 seq_num;
};
struct ember_iter_task {
    struct ember_iter_meta *meta;
    struct task_struct *task;
};

#define EMBER_PF_KTHREAD 0x00200000
/* scheduling policies of the fair class (include/uapi/linux/sched.h) */
#define EMBER_SCHED_NORMAL 0
#define EMBER_SCHED_BATCH 3
#define EMBER_SCHED_IDLE 5

BPF_PERCPU_ARRAY(ember_census_buf, struct ember_thread, 1);

static __always_inline u32 ember_census_state(u32 raw)
{
    if (raw == 0)
        return EMBER_STATE_RUNNABLE;
    if (raw & EMBER_RAW_TASK_DEAD)
        return EMBER_STATE_EXIT_DEAD; /* exiting: never blocked again */
    if (raw == (EMBER_RAW_TASK_NOLOAD | EMBER_STATE_UNINTERRUPTIBLE))
        return EMBER_STATE_IDLE;
    if (raw & EMBER_RAW_TASK_RTLOCK_WAIT)
        return EMBER_STATE_UNINTERRUPTIBLE;
    return raw & EMBER_RAW_TASK_REPORT;
}

/* The census entry of task, in a per-CPU buffer; 0 for the idle tasks. */
static __always_inline struct ember_thread *ember_census_read(struct task_struct *task)
{
    u32 zero = 0;
    struct ember_thread *t = ember_census_buf.lookup(&zero);
    if (!t || !task)
        return 0;
    char *base = (char *)task;
    u32 raw = 0, pflags = 0;
    int on_cpu = 0;
    t->tid = 0;
    bpf_probe_read_kernel(&t->tid, sizeof(t->tid), base + EMBER_TASK_PID);
    if (!t->tid)
        return 0;
    bpf_probe_read_kernel(&t->pid, sizeof(t->pid), base + EMBER_TASK_TGID);
    bpf_probe_read_kernel(&raw, sizeof(raw), base + EMBER_TASK_STATE);
    bpf_probe_read_kernel(&on_cpu, sizeof(on_cpu), base + EMBER_TASK_ON_CPU);
    bpf_probe_read_kernel(&pflags, sizeof(pflags), base + EMBER_TASK_FLAGS);
    bpf_probe_read_kernel(&t->exec_start, sizeof(t->exec_start), base + EMBER_TASK_EXEC_START);
    bpf_probe_read_kernel(&t->cpu, sizeof(t->cpu), base + EMBER_TASK_CPU);
    bpf_probe_read_kernel_str(t->comm, sizeof(t->comm), base + EMBER_TASK_COMM);
    t->state = ember_census_state(raw);
    t->flags = (on_cpu ? EMBER_THREAD_ON_CPU : 0) | (pflags & EMBER_PF_KTHREAD
                                                     ? EMBER_THREAD_KERNEL : 0);
    t->switched = t->rq_now = 0;
#ifdef EMBER_RQ_CLOCK
    /* The switch-out on the runqueue clock: the last switch-in (sched_info)
     * plus the run that followed it (exec_start's clock, so short by the
     * stolen and interrupt time of that one run, not of the whole block).
     * Only the fair class marks a switch-in in prev_sum_exec_runtime: a
     * real-time, deadline or sched_ext thread keeps exec_start's timing. */
    u64 arrival = 0, sum = 0, prev = 0;
    u32 policy = ~0u;
    bpf_probe_read_kernel(&policy, sizeof(policy), base + EMBER_TASK_POLICY);
    bpf_probe_read_kernel(&arrival, sizeof(arrival), base + EMBER_TASK_LAST_ARRIVAL);
    bpf_probe_read_kernel(&sum, sizeof(sum), base + EMBER_TASK_SUM_EXEC);
    bpf_probe_read_kernel(&prev, sizeof(prev), base + EMBER_TASK_PREV_SUM_EXEC);
    int fair = policy == EMBER_SCHED_NORMAL || policy == EMBER_SCHED_BATCH
               || policy == EMBER_SCHED_IDLE;
    if (fair && arrival && sum >= prev)
        t->switched = arrival + (sum - prev);
    /* The reader runs, so its runqueue's clock was updated when it was last
     * switched in or ticked: "now" on the same clock, read with now. */
    char *cur = (char *)bpf_get_current_task(), *cfs = 0, *rq = 0;
    bpf_probe_read_kernel(&cfs, sizeof(cfs), cur + EMBER_TASK_CFS_RQ);
    if (cfs)
        bpf_probe_read_kernel(&rq, sizeof(rq), cfs + EMBER_CFS_RQ_RQ);
    if (rq)
        bpf_probe_read_kernel(&t->rq_now, sizeof(t->rq_now), rq + EMBER_RQ_CLOCK);
#endif
    t->now = bpf_ktime_get_ns();
    t->ip = t->sp = t->bp = 0;
    if (!(pflags & EMBER_PF_KTHREAD)) {
        struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
        if (regs) {
            bpf_probe_read_kernel(&t->ip, sizeof(t->ip), &regs->ip);
            bpf_probe_read_kernel(&t->sp, sizeof(t->sp), &regs->sp);
            bpf_probe_read_kernel(&t->bp, sizeof(t->bp), &regs->bp);
        }
    }
    t->kernel_len = bpf_get_task_stack(task, t->kernel, sizeof(t->kernel), 0);
    return t;
}

static __always_inline void ember_census_write(struct ember_iter_task *ctx,
                                               struct ember_thread *t)
{
    bpf_seq_write(ctx->meta->seq, t, sizeof(*t));
}

#endif /* EMBER_CENSUS_H */
