/* SPDX-License-Identifier: Apache-2.0
 *
 * On-CPU sampling: attached to a cpu-clock perf event on every online CPU.
 * Each sample adds one to the counts of (process, thread, user stack,
 * kernel stack) in the current generation.
 */
#include <uapi/linux/bpf_perf_event.h>
#include "common.h"

#if EMBER_UNWIND
BPF_PROG_ARRAY(ember_unwind_progs_cpu, 1);

/* The table walk, EMBER_UNWIND_FRAMES_PER_PROG frames per tail call. */
int ember_unwind_step_cpu(struct bpf_perf_event_data *ctx)
{
    u32 zero = 0;
    struct ember_unwind_state *st = ember_unwind_state.lookup(&zero);
    if (!st)
        return 0;
    if (ember_unwind_walk(st)) {
        ember_unwind_progs_cpu.call(ctx, 0);
        st->stack.end = EMBER_UNWIND_END_TRUNCATED; /* out of tail calls */
    }
    ember_unwind_count(st);
    return 0;
}
#endif

int ember_on_cpu(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (tid == 0) {
        ember_stat_add(EMBER_STAT_IDLE, 1);
        return 0;
    }
    struct ember_config *cfg = ember_get_config();
    if (!cfg)
        return 0;
    if (!ember_wanted(cfg, tgid)) {
        ember_stat_add(EMBER_STAT_FILTERED, 1);
        return 0;
    }
    ember_stat_add(EMBER_STAT_EVENTS, 1);
    ember_note_pid(tgid);

    struct ember_key key = {};
    key.pid = tgid;
    key.tid = tid;
    key.epoch = cfg->epoch;
    key.stack_epoch = key.epoch;
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
#if EMBER_UNWIND
    if (cfg->stack_flags & EMBER_STACK_USER) {
        struct ember_unwind_state *st = ember_unwind_begin(tgid, key.stack_epoch);
        if (st) {
            ember_capture_stacks(ctx, key.stack_epoch, cfg->stack_flags & ~EMBER_STACK_USER,
                                 &key.user_stack_id, &key.kernel_stack_id, &key.unwinder);
            st->key = key;
            st->n = 1;
            st->ns = 0;
            ember_unwind_progs_cpu.call(ctx, 0);
            ember_unwind_count_with(st, ember_unwind_fp(ctx, st), EMBER_UNWINDER_FP);
            return 0;
        }
    }
#endif
    ember_capture_stacks(ctx, key.stack_epoch, cfg->stack_flags, &key.user_stack_id,
                         &key.kernel_stack_id, &key.unwinder);
    ember_count(&key, 0);
    return 0;
}
