/* SPDX-License-Identifier: Apache-2.0
 *
 * Maps and helpers every ember program uses: configuration, target filter,
 * statistics, the counts map and the rotating stack maps.
 */
#ifndef EMBER_COMMON_H
#define EMBER_COMMON_H

#include <uapi/linux/ptrace.h>
#include <uapi/asm-generic/errno-base.h>
#include "ember.h"

BPF_ARRAY(ember_config, struct ember_config, 1);
BPF_HASH(ember_targets, u32, u8, EMBER_TARGET_ENTRIES);
BPF_HASH(ember_cgroups, u64, u8, EMBER_CGROUP_ENTRIES);
BPF_PERCPU_ARRAY(ember_stats, u64, EMBER_STAT_MAX);
BPF_HASH(ember_counts, struct ember_key, struct ember_value, EMBER_COUNT_ENTRIES);
/* Processes active since the daemon last looked (tgid -> first event time):
 * the daemon reads their maps while they are alive, then deletes the entry. */
BPF_HASH(ember_pids, u32, u64, EMBER_PID_ENTRIES);
/* ... and each newly noted one, at once: the daemon blocks on this ring and
 * reads a new process's maps within a millisecond or so, so a process that
 * lives for 30 ms still gets its frames named. */
BPF_RINGBUF_OUTPUT(ember_new_pids, EMBER_NEW_PID_PAGES);
/* Drain boundaries (off-CPU): the daemon writes the time of each flip into
 * ember_bounds[epoch % EMBER_BOUNDS] before it; blocks are counted from the
 * boundary in effect on, what came before is charged by the drain. */
BPF_ARRAY(ember_bounds, u64, EMBER_BOUNDS);

static __always_inline void ember_stat_add(u32 idx, u64 n)
{
    u64 *v = ember_stats.lookup(&idx);
    if (v)
        *v += n;
}

/* The drain boundary in effect in this epoch (0: none yet). */
static __always_inline u64 ember_bound(u32 epoch)
{
    u32 slot = epoch % EMBER_BOUNDS;
    u64 *b = ember_bounds.lookup(&slot);
    return b ? *b : 0;
}

static __always_inline struct ember_config *ember_get_config(void)
{
    u32 zero = 0;
    return ember_config.lookup(&zero);
}

/* Should events of process tgid be recorded? */
static __always_inline bool ember_wanted(const struct ember_config *cfg, u32 tgid)
{
    if (cfg->self_tgid && tgid == cfg->self_tgid)
        return false;
    if (!cfg->filter)
        return true;
    if ((cfg->filter & EMBER_FILTER_PIDS) && ember_targets.lookup(&tgid))
        return true;
    if (cfg->filter & EMBER_FILTER_CGROUPS) {
        u64 cgroup = bpf_get_current_cgroup_id();
        if (ember_cgroups.lookup(&cgroup))
            return true;
    }
    return false;
}

static __always_inline void ember_note_pid(u32 tgid)
{
    if (ember_pids.lookup(&tgid))
        return;
    u64 now = bpf_ktime_get_ns();
    if (ember_pids.update(&tgid, &now))
        ember_stat_add(EMBER_STAT_PIDS_FULL, 1);
    if (ember_new_pids.ringbuf_output(&tgid, sizeof(tgid), 0))
        ember_stat_add(EMBER_STAT_NEW_PIDS_FULL, 1);
}

/* tp_btf/sched_process_exec: the process's maps were just replaced. Note it
 * again, so the daemon re-reads them (and once more a little later, when the
 * dynamic loader has mapped the libraries). */
int ember_on_exec(u64 *ctx)
{
    struct ember_config *cfg = ember_get_config();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!cfg || !ember_wanted(cfg, tgid))
        return 0;
    ember_pids.delete(&tgid);
    ember_note_pid(tgid);
    return 0;
}

/* Add n events (a sampled block stands for several) and ns to the counts of
 * key; a full map counts them as dropped instead. */
static __always_inline void ember_count_n(struct ember_key *key, u64 n, u64 ns)
{
    struct ember_value zero = {};
    struct ember_value *val = ember_counts.lookup_or_try_init(key, &zero);
    if (!val) {
        ember_stat_add(EMBER_STAT_COUNTS_FULL, n);
        ember_stat_add(EMBER_STAT_COUNTS_FULL_NS, ns);
        return;
    }
    __sync_fetch_and_add(&val->count, n);
    if (ns)
        __sync_fetch_and_add(&val->total_ns, ns);
    ember_stat_add(EMBER_STAT_COUNTED, n);
    ember_stat_add(EMBER_STAT_COUNTED_NS, ns);
}

/* Add one event to the counts of key. */
static __always_inline void ember_count(struct ember_key *key, u64 ns)
{
    ember_count_n(key, 1, ns);
}

#include "unwind_fp.h"
#include "unwind_dwarf.h"

#endif /* EMBER_COMMON_H */
