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
/* ember_bounds (off-CPU exact): drain boundaries kept, indexed by epoch. */
#define EMBER_BOUNDS 4

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
/* Not a state: a block that began before ember started (the daemon found the
 * thread blocked and put the block in; its stacks are the census's). */
#define EMBER_STATE_BEFORE_START 0x200

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
    /* table walks by how they ended: EMBER_STAT_UNWIND_ROOT + EMBER_UNWIND_END_* */
    EMBER_STAT_UNWIND_ROOT,           /* user stacks walked from tables to the root */
    EMBER_STAT_UNWIND_TRUNCATED,      /* table walks cut at the depth limit */
    EMBER_STAT_UNWIND_UNSUPPORTED,    /* ... at a rule the walker does not do */
    EMBER_STAT_UNWIND_READ_FAILED,    /* ... where user memory could not be read */
    EMBER_STAT_UNWIND_NO_MAPPING,     /* ... at an address in no executable mapping */
    EMBER_STAT_UNWIND_BAD_FRAME,      /* ... where the stack did not grow to the root */
    EMBER_STAT_UNWIND_NO_TABLE,       /* user stacks of processes without tables: frame
                                       * pointers (bpf_get_stackid) instead */
    EMBER_STAT_UNWIND_COLLISION,      /* table-walked stacks lost: ember_ustacks_* id taken */
    EMBER_STAT_UNWIND_FP_FRAMES,      /* frames inside table walks taken by frame pointers */
    EMBER_STAT_PY_FRAMES,             /* Python frames put into table-walked stacks */
    EMBER_STAT_PY_NO_THREAD,          /* ... walks of a Python process whose thread had no
                                       * thread state (not a Python thread, or > 32 threads
                                       * before it) */
    EMBER_STAT_PY_READ_FAILED,        /* ... interpreter frames that could not be read */
    EMBER_STAT_PY_NOT_CODE,           /* ... frames whose code is no code object: the
                                       * thread entering the loop (3.11, 3.12: its
                                       * current frame not yet set, stack garbage) */
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

/* Value of ember_crossed (off-CPU exact): a block that began before the
 * drain boundary in effect when it ended. The daemon charged, or charges now,
 * the part before that boundary; the program counted only the rest. */
struct ember_crossed {
    struct ember_start start;
    __u64 wake_ts;          /* when it was woken, if before it ended; 0: not */
    __u64 end_ts;           /* switch-in */
    __u32 epoch;            /* it crossed ember_bounds[epoch % EMBER_BOUNDS] */
    __u32 reserved;
};

/* One thread in a census (bpf/census.h): what it is doing now. */
struct ember_thread {
    __u32 pid;
    __u32 tid;
    __u32 state;            /* EMBER_STATE_*: RUNNABLE is running or waiting for a CPU */
    __u32 flags;            /* EMBER_THREAD_* */
    __u64 exec_start;       /* se.exec_start: when it last went on or off a CPU
                             * (the scheduler's clock, not bpf_ktime_get_ns) */
    __u64 now;              /* bpf_ktime_get_ns() when it was looked at */
    __u64 switched;         /* its last switch-out on the runqueue clock (sched_clock,
                             * which, unlike exec_start's, counts stolen and
                             * interrupt time); 0: unknown */
    __u64 rq_now;           /* the reader's runqueue clock at `now`; 0: unknown */
    __u64 ip;               /* the user registers it entered the kernel with */
    __u64 sp;
    __u64 bp;
    __s32 kernel_len;       /* bytes of addresses in kernel[], or -errno */
    __u32 cpu;              /* the CPU it runs or last ran on (exec_start's clock) */
    char comm[EMBER_COMM_LEN];
    __u64 kernel[EMBER_MAX_STACK_DEPTH];
};
#define EMBER_THREAD_ON_CPU 0x1     /* running on a CPU now */
#define EMBER_THREAD_KERNEL 0x2     /* a kernel thread: no user side */

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
    __u64 charged;          /* the block's time up to here is counted (a drain
                             * charged it in flight); EMBER_CHARGED_DONE once
                             * it ended. Swapped atomically: see census in
                             * offcpu_sampled.c */
};
#define EMBER_CHARGED_DONE 0xffffffffffffffffULL

/* A sampled block in flight, charged by a drain (offcpu_sampled.c's census):
 * from from_ns up to to_ns, the drain's boundary. */
struct ember_in_flight {
    __u32 pid;
    __u32 tid;
    __u32 state;            /* EMBER_STATE_* at switch-out (with BEFORE_START) */
    __s32 kernel_stack_id;  /* in ember_tstacks_*, generation stack_epoch */
    __u32 stack_epoch;
    __u32 reserved;
    __u64 from_ns;
    __u64 to_ns;
    __u64 since_ns;         /* when the block began */
    __u64 ip;               /* the user registers it entered the kernel with */
    __u64 sp;
    __u64 bp;
    char comm[EMBER_COMM_LEN];
};

/* Kernel stacks of sleeping threads (bpf_get_task_stack) live in a hash map
 * of their own; their ids carry this bit so the daemon knows where to look. */
#define EMBER_TASK_STACK_BIT 0x40000000

/* ember_key.unwinder (and ember_start.unwinder): which unwinder made the
 * user stack. */
#define EMBER_UNWINDER_FP 0     /* frame pointers: bpf_get_stackid, stack maps */
#define EMBER_UNWINDER_DWARF 1  /* CFI tables walked in BPF (unwind_dwarf.h) */
/* User stacks walked from CFI tables live in ember_ustacks_* maps; their ids
 * carry this bit. */
#define EMBER_USTACK_BIT 0x20000000
/* Stacks of threads found blocked at the start, walked by the daemon from a
 * census: their ids carry this bit (the daemon keeps them). */
#define EMBER_CENSUS_STACK_BIT 0x10000000

/* Unwinding from call-frame information (bpf/unwind_dwarf.h). Built in user
 * space (daemon/ember/unwind/) from .eh_frame / .debug_frame: one row per
 * address range of an object, sorted by pc, all objects in one array. */
#ifndef EMBER_UNWIND
#define EMBER_UNWIND 0          /* 1: compile the table walker in */
#endif
#ifndef EMBER_UNWIND_ROWS
#define EMBER_UNWIND_ROWS 262144
#endif
#ifndef EMBER_UNWIND_PROCS
#define EMBER_UNWIND_PROCS 1024
#endif
#define EMBER_UNWIND_MAPPINGS 128   /* executable mappings per process (a power of two) */
#define EMBER_UNWIND_MAPPING_STEPS 8 /* binary search steps over them: log2 + 1 */
#define EMBER_UNWIND_ROW_STEPS 22   /* ... over one object's rows: up to 4M rows */
#ifndef EMBER_UNWIND_FRAMES_PER_PROG
#define EMBER_UNWIND_FRAMES_PER_PROG 7
#endif

/* ember_unwind_row.cfa_type: how to find the canonical frame address. The
 * return address is always at CFA - 8. */
#define EMBER_CFA_UNSUPPORTED 0  /* a rule the walker does not do: stop, marked */
#define EMBER_CFA_RSP 1          /* CFA = rsp + cfa_offset */
#define EMBER_CFA_RBP 2          /* CFA = rbp + cfa_offset */
#define EMBER_CFA_PLT 3          /* CFA = rsp + 8 + ((rip & 15) >= cfa_offset ? 8 : 0) */
#define EMBER_CFA_END 4          /* return address undefined: the outermost frame */
#define EMBER_CFA_NONE 5         /* no FDE covers this pc: try frame pointers */
/* ember_unwind_row.rbp_type */
#define EMBER_RBP_SAME 0         /* rbp unchanged */
#define EMBER_RBP_SAVED 1        /* rbp saved at CFA + rbp_offset */
#define EMBER_RBP_UNKNOWN 2      /* another rule: rbp unknown from here on */

struct ember_unwind_row {
    __u32 pc;              /* start of the range, an ELF virtual address */
    __s32 cfa_offset;
    __s16 rbp_offset;
    __u8 cfa_type;         /* EMBER_CFA_* */
    __u8 rbp_type;         /* EMBER_RBP_* */
};

/* One executable mapping of a process. row_count 0: no table (JIT code,
 * anonymous memory, vdso): frames there are walked by frame pointers. */
struct ember_unwind_mapping {
    __u64 start;
    __u64 end;
    __u64 bias;            /* ip - bias = the pc of the object's rows */
    __u32 row_start;       /* index of its first row in ember_unwind_rows */
    __u32 row_count;
};

/* Value of ember_unwind_procs (key: tgid): mappings sorted by start. */
struct ember_unwind_proc {
    __u32 count;
    __u32 reserved;
    struct ember_unwind_mapping maps[EMBER_UNWIND_MAPPINGS];
};

/* Why a table walk ended (ember_ustack.end). */
#define EMBER_UNWIND_END_ROOT 0         /* the outermost frame: a whole stack */
#define EMBER_UNWIND_END_TRUNCATED 1    /* EMBER_MAX_STACK_DEPTH frames and more */
#define EMBER_UNWIND_END_UNSUPPORTED 2  /* a CFI rule the walker does not do */
#define EMBER_UNWIND_END_READ_FAILED 3  /* user memory could not be read */
#define EMBER_UNWIND_END_NO_MAPPING 4   /* an address in no executable mapping */
#define EMBER_UNWIND_END_BAD_FRAME 5    /* the stack did not grow towards the root */

/* Python frames (bpf/unwind_python.h). A frame of the interpreter loop
 * (_PyEval_EvalFrameDefault) in a table-walked stack is replaced by the
 * Python frames it was running, two slots each in ember_ustack.ips: the
 * code object's address with EMBER_PY_CODE, then EMBER_PY_INSTR with the
 * code's co_firstlineno (bits 32-61: tells a code object freed and reused
 * at the same address) and the instruction's index in code units. */
#define EMBER_PY_CODE 0xC000000000000000ULL
#define EMBER_PY_INSTR 0x8000000000000000ULL
#define EMBER_PY_TAG 0xC000000000000000ULL
#ifndef EMBER_PY_PROCS
#define EMBER_PY_PROCS 1024
#endif
#define EMBER_PY_THREAD_STEPS 32     /* thread states searched for the current thread */
#define EMBER_PY_FRAME_BYTES 128     /* bytes of a frame read at once */
#define EMBER_PY_FRAMES_PER_PROG 8   /* Python frames per step program */
/* ember_py_proc.entry: how the frames of one interpreter-loop call end */
#define EMBER_PY_ENTRY_ONE 0         /* 3.10: one frame per call */
#define EMBER_PY_ENTRY_IS_ENTRY 1    /* 3.11: the call's first frame has is_entry set */
#define EMBER_PY_ENTRY_OWNER 2       /* 3.12+: a shim frame owned by the C stack below it */
/* ember_py_proc.thread_match: which thread-state field names the thread */
#define EMBER_PY_MATCH_TID 0         /* native_thread_id == the thread's id (3.11+) */
#define EMBER_PY_MATCH_FSBASE 1      /* thread_id == pthread_self(), the task's user fs
                                      * base (3.10; task_fsbase from the kernel's BTF) */

/* Value of ember_py_procs (key: tgid): where a CPython process keeps its
 * threads and the layout of its frames and code objects (offsets in bytes,
 * from daemon/ember/runtimes/pylayouts.py for its version). */
struct ember_py_proc {
    __u64 interp_head;       /* address of _PyRuntime.interpreters.head */
    __u64 eval_start[2];     /* the interpreter loop, and its .cold part (0, 0: none) */
    __u64 eval_end[2];
    __u64 code_type;         /* address of PyCode_Type: each frame's code must be one */
    __u16 interp_threads;    /* PyInterpreterState: its first thread state */
    __u16 tstate_next;
    __u16 tstate_tid;
    __u16 tstate_frame;      /* the current frame, or (3.11, 3.12) the _PyCFrame */
    __u16 cframe_frame;      /* _PyCFrame.current_frame; 0xffff: no _PyCFrame */
    __u16 frame_previous;
    __u16 frame_code;
    __u16 frame_instr;       /* prev_instr, instr_ptr, or (3.10) f_lasti (an index) */
    __u16 frame_entry;       /* is_entry (3.11) or owner (3.12+) */
    __u16 code_adaptive;     /* co_code_adaptive: the first code unit */
    __u16 code_firstlineno;
    __u8 entry;              /* EMBER_PY_ENTRY_* */
    __u8 owned_by_cstack;    /* 3.12+: the owner value of a shim frame */
    __u8 thread_match;       /* EMBER_PY_MATCH_* */
    __u8 frame_bytes;        /* bytes of a frame to read: past the last field used
                              * (a frame at a page's end must not fail for more) */
    __u16 task_fsbase;       /* MATCH_FSBASE: offsetof(task_struct, thread.fsbase) */
    __u16 object_type;       /* PyObject: ob_type */
    __u8 pad[2];
};

/* Value of ember_ustacks_*: a user stack walked from tables, leaf first. */
struct ember_ustack {
    __u64 hash;
    __u32 len;
    __u32 end;             /* EMBER_UNWIND_END_* */
    __u64 ips[EMBER_MAX_STACK_DEPTH];
};

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
