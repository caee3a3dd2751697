/* SPDX-License-Identifier: Apache-2.0
 *
 * The census of threads (census.h) on its own: for `ember dump` and for the
 * threads already blocked when recording starts. Keeps the threads of the
 * processes in ember_targets (with EMBER_FILTER_PIDS), else every thread
 * but ember's own.
 */
#include "common.h"
#include "census.h"

int ember_census(struct ember_iter_task *ctx)
{
    struct ember_config *cfg = ember_get_config();
    struct ember_thread *t = ember_census_read(ctx->task);
    if (!cfg || !t)
        return 0;
    if (cfg->self_tgid && t->pid == cfg->self_tgid)
        return 0;
    if ((cfg->filter & EMBER_FILTER_PIDS) && !ember_targets.lookup(&t->pid))
        return 0;
    ember_census_write(ctx, t);
    return 0;
}
