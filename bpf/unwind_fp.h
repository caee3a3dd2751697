/* SPDX-License-Identifier: Apache-2.0
 *
 * The frame-pointer unwinder: the kernel's own stack walker (bpf_get_stackid)
 * into stack maps that rotate with the epoch, so the daemon can read and clear
 * one generation while the programs write the next.
 *
 * The table unwinder (.eh_frame tables walked in BPF, unwind_dwarf.h) lives
 * beside this file, fills its own stack storage and marks keys with its own
 * `unwinder` id; callers only use ember_capture_stacks().
 */
#ifndef EMBER_UNWIND_FP_H
#define EMBER_UNWIND_FP_H



BPF_STACK_TRACE(ember_stacks_0, EMBER_STACK_ENTRIES);
BPF_STACK_TRACE(ember_stacks_1, EMBER_STACK_ENTRIES);
#if EMBER_STACK_GENERATIONS > 2
BPF_STACK_TRACE(ember_stacks_2, EMBER_STACK_ENTRIES);
#endif

static __always_inline s32 ember_stackid(void *ctx, u32 stack_epoch, u64 flags)
{
    u32 slot = stack_epoch % EMBER_STACK_GENERATIONS;
    /* if/else, not switch: clang may turn a switch into a jump table, which
     * the verifier rejects. */
#if EMBER_STACK_GENERATIONS > 2
    if (slot == 2)
        return ember_stacks_2.get_stackid(ctx, flags);
#endif
    if (slot == 1)
        return ember_stacks_1.get_stackid(ctx, flags);
    return ember_stacks_0.get_stackid(ctx, flags);
}

static __always_inline void ember_stack_error(s32 id, u32 collision_stat, u32 error_stat)
{
    if (id == -EEXIST)
        ember_stat_add(collision_stat, 1);
    else if (id < 0 && id != -EFAULT)
        /* -EFAULT: no stack of that kind (a kernel thread has no user
         * stack); the daemon tells that apart from a lost stack. */
        ember_stat_add(error_stat, 1);
}

/* Capture the current thread's stacks into the generation stack_epoch. */
static __always_inline void ember_capture_stacks(void *ctx, u32 stack_epoch, u32 stack_flags,
                                                 s32 *user_id, s32 *kernel_id, u32 *unwinder)
{
    *unwinder = EMBER_UNWINDER_FP;
    if (stack_flags & EMBER_STACK_USER) {
        *user_id = ember_stackid(ctx, stack_epoch, BPF_F_USER_STACK);
        ember_stack_error(*user_id, EMBER_STAT_USER_STACK_COLLISION, EMBER_STAT_USER_STACK_ERROR);
    } else {
        *user_id = EMBER_STACK_NONE;
    }
    if (stack_flags & EMBER_STACK_KERNEL) {
        *kernel_id = ember_stackid(ctx, stack_epoch, 0);
        ember_stack_error(*kernel_id, EMBER_STAT_KERNEL_STACK_COLLISION,
                          EMBER_STAT_KERNEL_STACK_ERROR);
    } else {
        *kernel_id = EMBER_STACK_NONE;
    }
}

#endif /* EMBER_UNWIND_FP_H */
