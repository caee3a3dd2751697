/* SPDX-License-Identifier: Apache-2.0
 *
 * On-CPU sampling: attached to a cpu-clock perf event on every online CPU.
 * Each sample adds one to the counts of (process, thread, user stack,
 * kernel stack) in the current generation.
 */
#include <uapi/linux/bpf_perf_event.h>
#include "common.h"

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
    ember_capture_stacks(ctx, key.stack_epoch, cfg->stack_flags, &key.user_stack_id,
                         &key.kernel_stack_id, &key.unwinder);
    ember_count(&key, 0);
    return 0;
}
