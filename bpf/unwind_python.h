/* SPDX-License-Identifier: Apache-2.0
 *
 * Python frames inside table-walked stacks, for CPython 3.10 to 3.13.
 *
 * User space (daemon/ember/runtimes/) finds CPython processes and puts in
 * ember_py_procs where their thread states are, the address ranges of the
 * interpreter loop and the offsets of their version's frames and code
 * objects. When the table walk (unwind_dwarf.h) reaches a frame of the
 * interpreter loop, it stops walking native frames and emits, one per
 * iteration, the Python frames that call of the loop runs, from the thread's
 * current frame outwards, up to the frame that entered that call (3.10: each
 * call runs one frame; 3.11: the frame with is_entry; 3.12+: the shim frame
 * owned by the C stack). Then the
 * native walk goes on below the loop's frame. The loop's own frame stays in
 * the stack, just before its Python frames: user space puts them in its
 * place (pushing it unconditionally keeps the verifier's paths as few as
 * without Python). So a stack reads native -> Python -> native, as the
 * thread ran it.
 *
 * The current thread's state is looked up once per walk: cached per thread
 * in ember_py_threads, checked against its native_thread_id (3.10: its
 * thread_id, pthread_self(), against the task's fs base), else searched in
 * the interpreter's list of thread states.
 */
#ifndef EMBER_UNWIND_PYTHON_H
#define EMBER_UNWIND_PYTHON_H

/* ember_unwind_state.py_mode */
#define EMBER_PY_OFF 0       /* not a Python process (or its thread state not found) */
#define EMBER_PY_FIND 1      /* a Python process: find the thread's current frame first */
#define EMBER_PY_NATIVE 2    /* walking native frames, Python frames at hand */
#define EMBER_PY_EMIT 3      /* emitting the Python frames of one interpreter-loop call */

BPF_HASH(ember_py_procs, u32, struct ember_py_proc, EMBER_PY_PROCS);
BPF_TABLE("lru_hash", u32, u64, ember_py_threads, EMBER_PID_ENTRIES);

static __always_inline u64 ember_py_read_ptr(u64 addr)
{
    u64 v = 0;
    if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
        return 0;
    return v;
}

/* Whether thread state ts belongs to the thread whose id (3.11+: its TID;
 * 3.10: pthread_self()) is self. */
static __always_inline int ember_py_is_thread(struct ember_py_proc *py, u64 ts, u64 self)
{
    return ts && ember_py_read_ptr(ts + py->tstate_tid) == self;
}

/* The current thread's innermost Python frame: st->py_frame, and py_mode
 * NATIVE; or py_mode OFF when the thread has no thread state. */
static __always_inline void ember_py_find(struct ember_unwind_state *st,
                                          struct ember_py_proc *py)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 self = tid;
    if (py->thread_match == EMBER_PY_MATCH_FSBASE) {
        /* 3.10 names threads by pthread_self(): glibc's thread pointer,
         * the task's user fs base */
        self = 0;
        bpf_probe_read_kernel(&self, sizeof(self),
                              (void *)((u64)bpf_get_current_task() + py->task_fsbase));
    }
    u64 *cached = ember_py_threads.lookup(&tid);
    u64 ts = cached ? *cached : 0;
    if (!ember_py_is_thread(py, ts, self)) {
        u64 interp = ember_py_read_ptr(py->interp_head);
        ts = interp ? ember_py_read_ptr(interp + py->interp_threads) : 0;
        for (int i = 0; i < EMBER_PY_THREAD_STEPS; i++) {
            if (!ts || ember_py_is_thread(py, ts, self))
                break;
            ts = ember_py_read_ptr(ts + py->tstate_next);
        }
        if (!ember_py_is_thread(py, ts, self)) {
            ember_stat_add(EMBER_STAT_PY_NO_THREAD, 1);
            st->py_mode = EMBER_PY_OFF;
            return;
        }
        ember_py_threads.update(&tid, &ts);
    }
    u64 frame = ember_py_read_ptr(ts + py->tstate_frame);
    if (frame && py->cframe_frame != 0xffff)
        frame = ember_py_read_ptr(frame + py->cframe_frame);
    st->py_frame = frame;
    st->py_mode = EMBER_PY_NATIVE;
}

/* Whether ip lies in the interpreter loop. */
static __always_inline int ember_py_in_eval(struct ember_py_proc *py, u64 ip)
{
    return (ip >= py->eval_start[0] && ip < py->eval_end[0]) ||
           (ip >= py->eval_start[1] && ip < py->eval_end[1]);
}

static __always_inline void ember_py_push(struct ember_unwind_state *st, u64 v)
{
    u32 len = st->stack.len;
    if (len >= EMBER_MAX_STACK_DEPTH)
        return;
    st->stack.ips[len] = v;
    st->stack.len = len + 1;
    st->stack.hash = (st->stack.hash ^ v) * EMBER_FNV_PRIME;
}

/* No more Python frames in this walk: the native walk goes on. */
static __always_inline int ember_py_stop(struct ember_unwind_state *st)
{
    st->py_frame = 0;
    st->py_mode = EMBER_PY_NATIVE;
    return 1;
}

/* One Python frame of the current interpreter-loop call: emitted (two
 * slots), or the call's end. 0: the stack is full. */
static __always_inline int ember_py_step(struct ember_unwind_state *st, struct ember_py_proc *py)
{
    u64 f = st->py_frame;
    if (!f) {
        st->py_mode = EMBER_PY_NATIVE;
        return 1;
    }
    u32 n = py->frame_bytes;
    if (n < 8 || n > EMBER_PY_FRAME_BYTES)
        n = EMBER_PY_FRAME_BYTES;
    if (bpf_probe_read_user(st->py_buf, n, (void *)f)) {
        ember_stat_add(EMBER_STAT_PY_READ_FAILED, 1);
        return ember_py_stop(st);
    }
    u32 o_prev = py->frame_previous, o_code = py->frame_code, o_instr = py->frame_instr;
    u32 o_entry = py->frame_entry;
    u32 o_type = py->object_type, o_first = py->code_firstlineno;  /* in the code object */
    if (o_prev > EMBER_PY_FRAME_BYTES - 8 || o_code > EMBER_PY_FRAME_BYTES - 8 ||
        o_instr > EMBER_PY_FRAME_BYTES - 8 || o_entry > EMBER_PY_FRAME_BYTES - 1 ||
        o_type > EMBER_PY_FRAME_BYTES - 8 || o_first > EMBER_PY_FRAME_BYTES - 4)
        return ember_py_stop(st);
    u64 previous = *(u64 *)(st->py_buf + o_prev);
    u64 code = *(u64 *)(st->py_buf + o_code);
    u64 instr = *(u64 *)(st->py_buf + o_instr);
    u8 entry = st->py_buf[o_entry];
    st->py_frame = previous;
    if (py->entry == EMBER_PY_ENTRY_OWNER && entry == py->owned_by_cstack) {
        /* the shim below the call's first frame: the call ends here */
        st->py_mode = EMBER_PY_NATIVE;
        return 1;
    }
    if (st->stack.len + 2 > EMBER_MAX_STACK_DEPTH)
        return 0;
    /* The code object's head, up to co_firstlineno: its type must be
     * PyCode_Type. A thread caught entering the loop (3.11, 3.12) has its new
     * _PyCFrame in place before the frame in it: the frame is stack garbage,
     * often a chain of it, and nothing of it is emitted. */
    u32 head = o_first + 4 > o_type + 8 ? o_first + 4 : o_type + 8;
    if (head < 8 || head > EMBER_PY_FRAME_BYTES)
        head = EMBER_PY_FRAME_BYTES;
    if (bpf_probe_read_user(st->py_buf, head, (void *)code) ||
        *(u64 *)(st->py_buf + o_type) != py->code_type) {
        ember_stat_add(EMBER_STAT_PY_NOT_CODE, 1);
        return ember_py_stop(st);
    }
    u32 first = *(u32 *)(st->py_buf + o_first);
    u64 index = 0;
    u64 base = code + py->code_adaptive;
    if (py->entry == EMBER_PY_ENTRY_ONE) {
        s32 lasti = (s32)instr;  /* 3.10: f_lasti, an index already (-1: not started) */
        index = lasti > 0 ? lasti : 0;
    } else if (instr >= base) {
        index = (instr - base) >> 1;
    }
    ember_py_push(st, EMBER_PY_CODE | (code & ~EMBER_PY_TAG));
    ember_py_push(st, EMBER_PY_INSTR | ((u64)(first & 0x3fffffff) << 32) | (index & 0xffffffff));
    ember_stat_add(EMBER_STAT_PY_FRAMES, 1);
    if (py->entry == EMBER_PY_ENTRY_ONE || (py->entry == EMBER_PY_ENTRY_IS_ENTRY && entry))
        st->py_mode = EMBER_PY_NATIVE; /* the call's first frame: it ends here */
    return 1;
}

#endif /* EMBER_UNWIND_PYTHON_H */
