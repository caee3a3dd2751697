/* SPDX-License-Identifier: Apache-2.0
 *
 * The table unwinder: user stacks walked from call-frame information
 * (.eh_frame, .debug_frame), for code built without frame pointers.
 *
 * User space (daemon/ember/unwind/) turns each object's CFI into sorted rows
 * in ember_unwind_rows (one array for every object, written through mmap) and
 * each process's executable mappings into ember_unwind_procs. Here, per
 * frame: find the mapping of the address (binary search), its row (binary
 * search), compute the CFA from rsp or rbp, read the return address at CFA-8
 * and rbp where the row says it was saved. Code without a table (JIT,
 * anonymous memory, vdso, gaps) is walked by frame pointers.
 *
 * The hook's program only starts the walk and tail-calls the step program of
 * its hook (verifying the walk once per hook, not twice); a step walks
 * EMBER_UNWIND_FRAMES_PER_PROG frames, then tail-calls itself to go on (a bounded loop per program keeps the
 * verifier well under its limits; bcc cannot relocate bpf_loop callbacks).
 * The state lives in a per-CPU array between tail calls; the caller puts what
 * to do with the finished stack there (its key, or its start or wake entry)
 * and each program file defines ember_unwind_finish() to do it. A tracing
 * program may only tail-call programs attached to the same hook, so each hook
 * that unwinds has its own step function and prog array.
 *
 * Finished stacks go to ember_ustacks_<generation>, keyed by a hash of the
 * addresses and the end reason, with EMBER_USTACK_BIT set in the id; how the
 * walk ended is stored with the stack and counted in ember_stats.
 */
#ifndef EMBER_UNWIND_DWARF_H
#define EMBER_UNWIND_DWARF_H

#if EMBER_UNWIND

/* Between the caller and the last tail call: registers of the next frame,
 * the stack so far, and the caller's pending record. */
struct ember_unwind_state {
    u64 ip;
    u64 sp;
    u64 bp;
    u32 pid;
    u32 stack_epoch;
    u32 action;          /* for files with several callers: which record */
    u32 tid;
    u64 n;               /* events and nanoseconds the record adds */
    u64 ns;
    struct ember_key key;
#ifdef EMBER_UNWIND_BLOCKS
    struct ember_start start;
    struct ember_wake wake;
#endif
    u32 py_mode;         /* EMBER_PY_* (unwind_python.h) */
    u32 py_reserved;
    u64 py_frame;        /* the next Python frame to emit */
    u8 py_buf[EMBER_PY_FRAME_BYTES];
    struct ember_ustack stack;
};

BPF_F_TABLE("array", u32, struct ember_unwind_row, ember_unwind_rows, EMBER_UNWIND_ROWS,
            BPF_F_MMAPABLE);
BPF_HASH(ember_unwind_procs, u32, struct ember_unwind_proc, EMBER_UNWIND_PROCS);
BPF_PERCPU_ARRAY(ember_unwind_state, struct ember_unwind_state, 1);
BPF_HASH(ember_ustacks_0, u32, struct ember_ustack, EMBER_STACK_ENTRIES);
BPF_HASH(ember_ustacks_1, u32, struct ember_ustack, EMBER_STACK_ENTRIES);
#if EMBER_STACK_GENERATIONS > 2
BPF_HASH(ember_ustacks_2, u32, struct ember_ustack, EMBER_STACK_ENTRIES);
#endif

#define EMBER_FNV_OFFSET 0xcbf29ce484222325ULL
#define EMBER_FNV_PRIME 0x100000001b3ULL

#include "unwind_python.h"

/* Begin a table walk of the current thread's user stack, for process tgid.
 * Returns the per-CPU state with the user registers in place, or 0 when the
 * process has no tables (the caller uses frame pointers). */
static __always_inline struct ember_unwind_state *ember_unwind_begin(u32 tgid, u32 stack_epoch)
{
    if (!ember_unwind_procs.lookup(&tgid)) {
        ember_stat_add(EMBER_STAT_UNWIND_NO_TABLE, 1);
        return 0;
    }
    u32 zero = 0;
    struct ember_unwind_state *st = ember_unwind_state.lookup(&zero);
    if (!st)
        return 0;
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    if (!regs)
        return 0;
    bpf_probe_read_kernel(&st->ip, sizeof(st->ip), &regs->ip);
    bpf_probe_read_kernel(&st->sp, sizeof(st->sp), &regs->sp);
    bpf_probe_read_kernel(&st->bp, sizeof(st->bp), &regs->bp);
    st->pid = tgid;
    st->stack_epoch = stack_epoch;
    st->stack.hash = EMBER_FNV_OFFSET;
    st->stack.len = 0;
    st->stack.end = EMBER_UNWIND_END_ROOT;
    st->py_mode = ember_py_procs.lookup(&tgid) ? EMBER_PY_FIND : EMBER_PY_OFF;
    st->py_frame = 0;
    return st;
}

/* The index of the mapping holding ip, or -1. */
static __always_inline int ember_unwind_mapping(struct ember_unwind_proc *proc, u64 ip)
{
    u32 lo = 0, hi = proc->count;
    if (hi > EMBER_UNWIND_MAPPINGS)
        hi = EMBER_UNWIND_MAPPINGS;
    for (int i = 0; i < EMBER_UNWIND_MAPPING_STEPS; i++) {
        if (lo >= hi)
            break;
        u32 mid = (lo + hi) >> 1;
        if (proc->maps[mid & (EMBER_UNWIND_MAPPINGS - 1)].start <= ip)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    u32 idx = (lo - 1) & (EMBER_UNWIND_MAPPINGS - 1);
    if (ip >= proc->maps[idx].end)
        return -1;
    return idx;
}

/* The last row of [first, first + count) whose pc is <= pc, or 0. */
static __always_inline struct ember_unwind_row *ember_unwind_row(u32 first, u32 count, u64 pc)
{
    u32 lo = first, hi = first + count;
    for (int i = 0; i < EMBER_UNWIND_ROW_STEPS; i++) {
        if (lo >= hi)
            break;
        u32 mid = lo + ((hi - lo) >> 1);
        struct ember_unwind_row *r = ember_unwind_rows.lookup(&mid);
        if (!r)
            return 0;
        if (r->pc <= pc)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == first)
        return 0;
    u32 idx = lo - 1;
    return ember_unwind_rows.lookup(&idx);
}

/* Walk up to EMBER_UNWIND_FRAMES_PER_PROG frames. 1: more to walk (tail-call
 * the step program); 0: finished, st->stack.end says how. */
static __always_inline int ember_unwind_walk(struct ember_unwind_state *st)
{
    struct ember_unwind_proc *proc = ember_unwind_procs.lookup(&st->pid);
    if (!proc) {
        /* its tables went away during the walk */
        st->stack.end = EMBER_UNWIND_END_NO_MAPPING;
        return 0;
    }
    struct ember_py_proc *py = 0;
    if (st->py_mode != EMBER_PY_OFF) {
        py = ember_py_procs.lookup(&st->pid);
        if (!py)
            st->py_mode = EMBER_PY_OFF;
        else if (st->py_mode == EMBER_PY_FIND)
            ember_py_find(st, py);
    }
    if (py && st->py_mode == EMBER_PY_EMIT) {
        /* the Python frames of an interpreter-loop call, before its caller;
         * a loop of their own, not interleaved with native frames, keeps
         * the verifier's paths few */
        for (int f = 0; f < EMBER_PY_FRAMES_PER_PROG; f++) {
            if (st->py_mode != EMBER_PY_EMIT)
                break;
            if (!ember_py_step(st, py)) {
                st->stack.end = EMBER_UNWIND_END_TRUNCATED;
                return 0;
            }
        }
        if (st->py_mode == EMBER_PY_EMIT)
            return 1;
    }
    for (int f = 0; f < EMBER_UNWIND_FRAMES_PER_PROG; f++) {
        u32 len = st->stack.len;
        if (len >= EMBER_MAX_STACK_DEPTH) {
            st->stack.end = EMBER_UNWIND_END_TRUNCATED;
            return 0;
        }
        u64 ip = st->ip, sp = st->sp, bp = st->bp;
        st->stack.ips[len] = ip;
        st->stack.len = len + 1;
        st->stack.hash = (st->stack.hash ^ ip) * EMBER_FNV_PRIME;

        int m = ember_unwind_mapping(proc, ip);
        if (m < 0) {
            st->stack.end = EMBER_UNWIND_END_NO_MAPPING;
            return 0;
        }
        struct ember_unwind_mapping *map = &proc->maps[m & (EMBER_UNWIND_MAPPINGS - 1)];
        u32 cfa_type = EMBER_CFA_NONE, rbp_type = EMBER_RBP_SAME;
        s64 cfa_offset = 0, rbp_offset = 0;
        if (map->row_count) {
            /* a return address may be just past the end of its call's
             * function: look up the call itself (the leaf's ip is exact) */
            u64 pc = ip - map->bias - (len ? 1 : 0);
            struct ember_unwind_row *row = ember_unwind_row(map->row_start, map->row_count, pc);
            if (row) {
                cfa_type = row->cfa_type;
                rbp_type = row->rbp_type;
                cfa_offset = row->cfa_offset;
                rbp_offset = row->rbp_offset;
            }
        }
        u64 cfa;
        if (cfa_type == EMBER_CFA_RSP) {
            cfa = sp + cfa_offset;
        } else if (cfa_type == EMBER_CFA_RBP) {
            if (!bp) {
                st->stack.end = EMBER_UNWIND_END_UNSUPPORTED;
                return 0;
            }
            cfa = bp + cfa_offset;
        } else if (cfa_type == EMBER_CFA_PLT) {
            cfa = sp + 8 + ((s64)(ip & 15) >= cfa_offset ? 8 : 0);
        } else if (cfa_type == EMBER_CFA_END) {
            st->stack.end = EMBER_UNWIND_END_ROOT;
            return 0;
        } else if (cfa_type == EMBER_CFA_NONE) {
            /* no table here: frame pointers (rbp 0 ends a frame-pointer chain) */
            if (!bp) {
                st->stack.end = EMBER_UNWIND_END_ROOT;
                return 0;
            }
            cfa = bp + 16;
            rbp_type = EMBER_RBP_SAVED;
            rbp_offset = -16;
            ember_stat_add(EMBER_STAT_UNWIND_FP_FRAMES, 1);
        } else {
            st->stack.end = EMBER_UNWIND_END_UNSUPPORTED;
            return 0;
        }
        if (cfa <= sp) {
            st->stack.end = EMBER_UNWIND_END_BAD_FRAME;
            return 0;
        }
        u64 ra = 0;
        if (rbp_type == EMBER_RBP_SAVED && rbp_offset == -16) {
            /* the usual prologue (push rbp first): rbp and the return
             * address side by side, one read */
            u64 pair[2];
            if (bpf_probe_read_user(pair, sizeof(pair), (void *)(cfa - 16))) {
                st->stack.end = EMBER_UNWIND_END_READ_FAILED;
                return 0;
            }
            bp = pair[0];
            ra = pair[1];
        } else {
            if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8))) {
                st->stack.end = EMBER_UNWIND_END_READ_FAILED;
                return 0;
            }
            if (rbp_type == EMBER_RBP_SAVED) {
                if (bpf_probe_read_user(&bp, sizeof(bp), (void *)(cfa + rbp_offset))) {
                    st->stack.end = EMBER_UNWIND_END_READ_FAILED;
                    return 0;
                }
            } else if (rbp_type != EMBER_RBP_SAME) {
                bp = 0;
            }
        }
        if (!ra) {
            st->stack.end = EMBER_UNWIND_END_ROOT;
            return 0;
        }
        st->ip = ra;
        st->sp = cfa;
        st->bp = bp;
        if (py && st->py_mode == EMBER_PY_NATIVE && ember_py_in_eval(py, ip)) {
            /* an interpreter-loop call: the next step emits its Python
             * frames after it (user space puts them in its place); checked
             * last, so the paths above stay as many as without Python */
            st->py_mode = EMBER_PY_EMIT;
            return 1;
        }
    }
    return 1;
}

static __always_inline struct ember_ustack *ember_ustack_lookup(u32 slot, u32 *id)
{
#if EMBER_STACK_GENERATIONS > 2
    if (slot == 2)
        return ember_ustacks_2.lookup(id);
#endif
    if (slot == 1)
        return ember_ustacks_1.lookup(id);
    return ember_ustacks_0.lookup(id);
}

static __always_inline int ember_ustack_insert(u32 slot, u32 *id, struct ember_ustack *s)
{
#if EMBER_STACK_GENERATIONS > 2
    if (slot == 2)
        return ember_ustacks_2.insert(id, s);
#endif
    if (slot == 1)
        return ember_ustacks_1.insert(id, s);
    return ember_ustacks_0.insert(id, s);
}

/* Store the finished stack in generation st->stack_epoch and count how the
 * walk ended. Returns its id (EMBER_USTACK_BIT set) or a negative errno as
 * bpf_get_stackid would (-EEXIST: another stack holds the id). Most stacks
 * were stored before: look first, insert only a new one. */
static __always_inline s32 ember_unwind_store(struct ember_unwind_state *st)
{
    u32 end = st->stack.end;
    if (end <= EMBER_UNWIND_END_BAD_FRAME)
        ember_stat_add(EMBER_STAT_UNWIND_ROOT + end, 1);
    u64 h = (st->stack.hash ^ end) * EMBER_FNV_PRIME;
    st->stack.hash = h;
    u32 id = ((u32)(h ^ (h >> 32)) & (EMBER_USTACK_BIT - 1)) | EMBER_USTACK_BIT;
    u32 slot = st->stack_epoch % EMBER_STACK_GENERATIONS;
    struct ember_ustack *old = ember_ustack_lookup(slot, &id);
    if (!old) {
        int rc = ember_ustack_insert(slot, &id, &st->stack);
        if (rc == 0)
            return id;
        if (rc != -EEXIST) {
            ember_stat_add(EMBER_STAT_USER_STACK_ERROR, 1);
            return rc;
        }
        old = ember_ustack_lookup(slot, &id); /* another CPU stored it meanwhile */
    }
    if (old && old->hash == h && old->len == st->stack.len)
        return id;
    ember_stat_add(EMBER_STAT_UNWIND_COLLISION, 1);
    return -EEXIST;
}

/* The caller's first tail call failed (its prog array is empty: never
 * expected, the build fills every one before anything attaches): the user
 * stack by frame pointers, as without tables. */
static __always_inline s32 ember_unwind_fp(void *ctx, struct ember_unwind_state *st)
{
    s32 id = ember_stackid(ctx, st->stack_epoch, BPF_F_USER_STACK);
    ember_stack_error(id, EMBER_STAT_USER_STACK_COLLISION, EMBER_STAT_USER_STACK_ERROR);
    return id;
}

/* The usual finish: add the pending key's events with the user stack. */
static __always_inline void ember_unwind_count_with(struct ember_unwind_state *st, s32 id,
                                                    u32 unwinder)
{
    st->key.user_stack_id = id;
    st->key.unwinder = unwinder;
    ember_count_n(&st->key, st->n, st->ns);
}

static __always_inline void ember_unwind_count(struct ember_unwind_state *st)
{
    ember_unwind_count_with(st, ember_unwind_store(st), EMBER_UNWINDER_DWARF);
}

#endif /* EMBER_UNWIND */

#endif /* EMBER_UNWIND_DWARF_H */
