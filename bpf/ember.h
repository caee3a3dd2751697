/* SPDX-License-Identifier: Apache-2.0
 *
 * Structs and constants shared by ember's BPF programs and the Python daemon.
 * daemon/ember/abi.py mirrors every struct and constant here; the test
 * tests/test_abi.py compiles this header and checks that both sides agree on
 * every name, size, offset and value.
 *
 * Build-time parameters come in as -D flags (daemon/ember/kernel/programs.py
 * says which; the defaults below are the only ones); run-time parameters
 * live in the ember_config array map.
 */
#ifndef EMBER_H
#define EMBER_H

#define EMBER_COMM_LEN 16
/* Frames per stored stack: the stack map's value is EMBER_MAX_STACK_DEPTH ips. */
#define EMBER_MAX_STACK_DEPTH 127

#ifndef EMBER_STACK_ENTRIES
#define EMBER_STACK_ENTRIES 16384
#endif
#ifndef EMBER_COUNT_ENTRIES
#define EMBER_COUNT_ENTRIES 16384
#endif
#ifndef EMBER_THREAD_ENTRIES
#define EMBER_THREAD_ENTRIES 32768
#endif
#ifndef EMBER_TARGET_ENTRIES
#define EMBER_TARGET_ENTRIES 4096
#endif
#ifndef EMBER_CGROUP_ENTRIES
#define EMBER_CGROUP_ENTRIES 4096
#endif
#ifndef EMBER_PID_ENTRIES
#define EMBER_PID_ENTRIES 8192
#endif
#ifndef EMBER_NEW_PID_PAGES
#define EMBER_NEW_PID_PAGES 16
#endif
/* How many stack maps rotate with the epoch (see daemon/ember/kernel/drain.py). */
#ifndef EMBER_STACK_GENERATIONS
#define EMBER_STACK_GENERATIONS 2
#endif

/* ember_config.filter: which target rules apply (a process matching any
 * applied rule is profiled; no rule: every process). */
#define EMBER_FILTER_PIDS 0x1
#define EMBER_FILTER_CGROUPS 0x2

/* ember_key.kind: what a count measures. */
#define EMBER_KIND_ONCPU 0     /* on-CPU samples */
#define EMBER_KIND_BLOCKED 1   /* off-CPU: switch-out to wakeup, at the blocked stacks */
#define EMBER_KIND_RUNQ 2      /* wakeup (or preemption) to switch-in: waiting for a CPU */
#define EMBER_KIND_WAKEUP 3    /* the waker's stacks, weighted by the wakee's blocked time */
#define EMBER_KIND_OFFWAKE 4   /* the wakee's blocked stacks joined with its waker's */

/* ember_config.modes (off-CPU program): which kinds to count. */
#define EMBER_MODE_BLOCKED 0x1
#define EMBER_MODE_RUNQ 0x2
#define EMBER_MODE_WAKEUP 0x4
#define EMBER_MODE_OFFWAKE 0x8

#ifndef EMBER_RUNQ_HIST_ENTRIES
#define EMBER_RUNQ_HIST_ENTRIES 16384
#endif
#define EMBER_RUNQ_HIST_SLOTS 32  /* log2 buckets of microseconds */

/* ember_config.stack_flags */
#define EMBER_STACK_USER 0x1
#define EMBER_STACK_KERNEL 0x2

/* A stack id that was not requested (stack kind turned off). Real failures
 * are stored as the negative errno bpf_get_stackid returned. */
#define EMBER_STACK_NONE (-1000)
/* Sampled off-CPU: the user stack could not be taken where the block was
 * (the thread went back to user space first); the kernel stack's slot was
 * recycled before the block was counted. */
#define EMBER_STACK_LATE (-1001)
#define EMBER_STACK_STALE (-1002)

/* Thread states as sched:sched_switch reports prev_state (TASK_REPORT bits),
 * with "runnable" (TASK_RUNNING, whether preempted or yielding) folded into
 * one bit of its own so a state mask can select it. */
#define EMBER_STATE_INTERRUPTIBLE 0x1
#define EMBER_STATE_UNINTERRUPTIBLE 0x2
#define EMBER_STATE_STOPPED 0x4
#define EMBER_STATE_TRACED 0x8
#define EMBER_STATE_EXIT_DEAD 0x10
#define EMBER_STATE_EXIT_ZOMBIE 0x20
#define EMBER_STATE_PARKED 0x40
#define EMBER_STATE_IDLE 0x80
#define EMBER_STATE_RUNNABLE 0x100

/* Indexes into the per-CPU ember_stats array: counters never reset, so the
 * daemon can check that what it drained equals what the kernel counted. */
enum ember_stat {
    EMBER_STAT_EVENTS = 0,            /* events that passed the filters */
    EMBER_STAT_IDLE,                  /* on-CPU samples of the idle task */
    EMBER_STAT_FILTERED,              /* events of untargeted processes */
    EMBER_STAT_COUNTED,               /* events added to ember_counts */
    EMBER_STAT_COUNTED_NS,            /* off-CPU nanoseconds added */
    EMBER_STAT_COUNTS_FULL,           /* events dropped: ember_counts full */
    EMBER_STAT_COUNTS_FULL_NS,        /* off-CPU nanoseconds dropped likewise */
    EMBER_STAT_USER_STACK_COLLISION,  /* bpf_get_stackid: -EEXIST */
    EMBER_STAT_KERNEL_STACK_COLLISION,
    EMBER_STAT_USER_STACK_ERROR,      /* any other error but -EFAULT */
    EMBER_STAT_KERNEL_STACK_ERROR,
    EMBER_STAT_THREADS_FULL,          /* off-CPU: ember_starts full */
    EMBER_STAT_BELOW_MIN,             /* off-CPU blocks shorter than min */
    EMBER_STAT_ABOVE_MAX,             /* off-CPU blocks longer than max */
    EMBER_STAT_STATE_FILTERED,        /* off-CPU switch-outs of other states */
    EMBER_STAT_PIDS_FULL,             /* ember_pids full: maps read at drain only */
    EMBER_STAT_SAMPLED,               /* off-CPU sampled: blocks whose stacks were taken */
    EMBER_STAT_USER_STACK_LATE,       /* off-CPU sampled: resumed to user space unseen */
    EMBER_STAT_KERNEL_STACK_STALE,    /* off-CPU sampled: stack slot recycled meanwhile */
    EMBER_STAT_NEW_PIDS_FULL,         /* ember_new_pids ring full: maps read at the poll */
    EMBER_STAT_MAX,
};

/* ember_config[0]: written by the daemon, read by every program run. */
struct ember_config {
    __u32 epoch;        /* counts generation; the daemon increments it */
    __u32 filter;       /* EMBER_FILTER_*: ember_targets, ember_cgroups */
    __u32 self_tgid;    /* never profile this process (0: none) */
    __u32 stack_flags;  /* EMBER_STACK_USER | EMBER_STACK_KERNEL */
    __u32 state_mask;   /* off-CPU: record only these states (0: all) */
    __u32 modes;        /* off-CPU: EMBER_MODE_* */
    __u64 min_block_ns; /* off-CPU: blocks shorter than this are ignored */
    __u64 max_block_ns; /* off-CPU: blocks longer than this are ignored */
    __u64 sample_ns;    /* off-CPU sampled: blocks this long or longer are always
                         * taken, shorter ones with probability duration/sample_ns
                         * (0: every block) */
};

/* Key of ember_counts. One entry per (generation, thread, stacks, state). */
struct ember_key {
    __u32 pid;             /* thread group id */
    __u32 tid;
    __s32 user_stack_id;   /* >= 0: id in the stack map; < 0: see above */
    __s32 kernel_stack_id;
    __u32 epoch;           /* counts generation this entry belongs to */
    __u32 stack_epoch;     /* generation of the stack map holding the ids */
    __u32 state;           /* off-CPU: EMBER_STATE_* at switch-out; on-CPU: 0 */
    __u32 unwinder;        /* which unwinder produced the user stack: 0 = frame pointers */
    __u32 kind;            /* EMBER_KIND_* */
    /* The other thread of a wakeup: the waker (OFFWAKE) or the wakee (WAKEUP). */
    __u32 peer_pid;
    __u32 peer_tid;
    __s32 peer_user_stack_id;
    __s32 peer_kernel_stack_id;
    __u32 peer_stack_epoch;
    char comm[EMBER_COMM_LEN];
    char peer_comm[EMBER_COMM_LEN];
};

struct ember_value {
    __u64 count;     /* samples (on-CPU) or blocks (off-CPU) */
    __u64 total_ns;  /* off-CPU: summed blocked time; on-CPU: 0 */
};

/* Value of ember_starts (off-CPU): a thread that switched out, keyed by tid. */
struct ember_start {
    __u64 ts;
    __u32 pid;
    __s32 user_stack_id;
    __s32 kernel_stack_id;
    __u32 stack_epoch;
    __u32 state;
    __u32 unwinder;
    char comm[EMBER_COMM_LEN];
};

/* Value of ember_wakes (off-CPU): who woke a blocked thread, and when. */
struct ember_wake {
    __u64 ts;
    __u32 pid;               /* the waker */
    __u32 tid;
    __s32 user_stack_id;
    __s32 kernel_stack_id;
    __u32 stack_epoch;
    __u32 reserved;
    char comm[EMBER_COMM_LEN];
};

/* Task-local state of the sampled off-CPU program (offcpu_sampled.c). */
struct ember_block {
    __u64 ts;               /* switch-out time; 0 while on CPU */
    __u64 wake_ts;          /* when it was woken (sched_waking); 0: not yet */
    __u64 weight_ns;        /* a chosen block not yet counted: the off-CPU time it
                             * stands for (0: none pending) */
    __u64 weight_count;     /* ... and the number of blocks */
    __u64 user_ip;          /* user registers of the chosen block, to tell whether */
    __u64 user_sp;          /* the thread is still in the same kernel entry */
    __s32 kernel_stack_id;
    __u32 stack_epoch;
    __u32 state;            /* EMBER_STATE_* at switch-out */
    __u32 pending_state;    /* state of the pending block */
    __u32 resume_seen;      /* a resume hook counted a block of this thread: it
                             * fires on every return to user space, so equal
                             * user registers mean the same kernel entry */
    __u32 reserved;
};

/* Kernel stacks of sleeping threads (bpf_get_task_stack) live in a hash map
 * of their own; their ids carry this bit so the daemon knows where to look. */
#define EMBER_TASK_STACK_BIT 0x40000000

/* Raw task states (kernel ABI since 4.14; the verifier cannot check these:
 * tests/bpf/test_offcpu.py checks the states they come out as, sleeping and
 * runnable threads named so): see include/linux/sched.h. */
#define EMBER_RAW_TASK_DEAD 0x80
#define EMBER_RAW_TASK_NOLOAD 0x400
#define EMBER_RAW_TASK_RTLOCK_WAIT 0x1000
#define EMBER_RAW_TASK_REPORT 0x7f

/* Key of ember_runq_hist: run-queue latency histogram per process. */
struct ember_hist_key {
    __u32 pid;
    __u32 slot;              /* log2(latency in us) */
};

#endif /* EMBER_H */
