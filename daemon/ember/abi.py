"""The Python view of bpf/ember.h: structs as ctypes, constants as ints.

tests/test_abi.py compiles bpf/ember.h with the system C compiler and checks
every size, offset and constant below against it, so the two cannot drift.
"""

from __future__ import annotations

import ctypes as ct
import enum

COMM_LEN = 16
MAX_STACK_DEPTH = 127

KIND_ONCPU = 0
KIND_BLOCKED = 1
KIND_RUNQ = 2
KIND_WAKEUP = 3
KIND_OFFWAKE = 4

MODE_BLOCKED = 0x1
MODE_RUNQ = 0x2
MODE_WAKEUP = 0x4
MODE_OFFWAKE = 0x8

RUNQ_HIST_SLOTS = 32
BOUNDS = 4  # drain boundaries kept by the exact off-CPU program, by epoch

FILTER_PIDS = 0x1
FILTER_CGROUPS = 0x2

STACK_USER = 0x1
STACK_KERNEL = 0x2
STACK_NONE = -1000
STACK_LATE = -1001
STACK_STALE = -1002
TASK_STACK_BIT = 0x40000000  # stack id of a kernel stack walked by bpf_get_task_stack
RAW_TASK_DEAD = 0x80
RAW_TASK_NOLOAD = 0x400
RAW_TASK_RTLOCK_WAIT = 0x1000
RAW_TASK_REPORT = 0x7F

# Thread states (sched_switch prev_state bits, runnable folded into its own bit).
STATE_INTERRUPTIBLE = 0x1
STATE_UNINTERRUPTIBLE = 0x2
STATE_STOPPED = 0x4
STATE_TRACED = 0x8
STATE_EXIT_DEAD = 0x10
STATE_EXIT_ZOMBIE = 0x20
STATE_PARKED = 0x40
STATE_IDLE = 0x80
STATE_RUNNABLE = 0x100
STATE_BEFORE_START = 0x200  # not a state: a block found in progress at the start

UNWINDER_FP = 0
UNWINDER_DWARF = 1
USTACK_BIT = 0x20000000  # stack id of a user stack walked from CFI tables
CENSUS_STACK_BIT = 0x10000000  # stack id of a stack the daemon took from a census

# The table unwinder (bpf/unwind_dwarf.h, daemon/ember/unwind/).
UNWIND_MAPPINGS = 128
UNWIND_MAPPING_STEPS = 8
UNWIND_ROW_STEPS = 22

# Python frames in table-walked stacks (bpf/unwind_python.h, daemon/ember/runtimes/).
PY_CODE = 0xC000000000000000    # a slot holding a code object's address
PY_INSTR = 0x8000000000000000   # the slot after it: co_firstlineno << 32 | instruction index
PY_TAG = 0xC000000000000000
PY_THREAD_STEPS = 32
PY_FRAME_BYTES = 128
PY_FRAMES_PER_PROG = 8
PY_ENTRY_ONE = 0
PY_ENTRY_IS_ENTRY = 1
PY_ENTRY_OWNER = 2
PY_MATCH_TID = 0
PY_MATCH_FSBASE = 1
PY_NO_CFRAME = 0xFFFF
CFA_UNSUPPORTED = 0
CFA_RSP = 1
CFA_RBP = 2
CFA_PLT = 3
CFA_END = 4
CFA_NONE = 5
RBP_SAME = 0
RBP_SAVED = 1
RBP_UNKNOWN = 2


class UnwindEnd(enum.IntEnum):
    """Why a table walk ended (ember_ustack.end, EMBER_UNWIND_END_*)."""

    ROOT = 0
    TRUNCATED = 1
    UNSUPPORTED = 2
    READ_FAILED = 3
    NO_MAPPING = 4
    BAD_FRAME = 5

#: Build-time defaults (the loader passes its own values as -D flags).
DEFAULT_DEFINES = {
    "EMBER_STACK_ENTRIES": 16384,
    "EMBER_COUNT_ENTRIES": 16384,
    "EMBER_THREAD_ENTRIES": 32768,
    "EMBER_TARGET_ENTRIES": 4096,
    "EMBER_CGROUP_ENTRIES": 4096,
    "EMBER_PID_ENTRIES": 8192,
    "EMBER_RUNQ_HIST_ENTRIES": 16384,
    "EMBER_STACK_GENERATIONS": 2,
    "EMBER_NEW_PID_PAGES": 16,
    "EMBER_UNWIND": 0,
    "EMBER_UNWIND_ROWS": 262144,
    "EMBER_UNWIND_PROCS": 1024,
    "EMBER_UNWIND_FRAMES_PER_PROG": 7,
    "EMBER_PY_PROCS": 1024,
}


class Stat(enum.IntEnum):
    """Indexes of the per-CPU ember_stats array (enum ember_stat)."""

    EVENTS = 0
    IDLE = 1
    FILTERED = 2
    COUNTED = 3
    COUNTED_NS = 4
    COUNTS_FULL = 5
    COUNTS_FULL_NS = 6
    USER_STACK_COLLISION = 7
    KERNEL_STACK_COLLISION = 8
    USER_STACK_ERROR = 9
    KERNEL_STACK_ERROR = 10
    THREADS_FULL = 11
    BELOW_MIN = 12
    ABOVE_MAX = 13
    STATE_FILTERED = 14
    PIDS_FULL = 15
    SAMPLED = 16
    USER_STACK_LATE = 17
    KERNEL_STACK_STALE = 18
    NEW_PIDS_FULL = 19
    UNWIND_ROOT = 20
    UNWIND_TRUNCATED = 21
    UNWIND_UNSUPPORTED = 22
    UNWIND_READ_FAILED = 23
    UNWIND_NO_MAPPING = 24
    UNWIND_BAD_FRAME = 25
    UNWIND_NO_TABLE = 26
    UNWIND_COLLISION = 27
    UNWIND_FP_FRAMES = 28
    PY_FRAMES = 29
    PY_NO_THREAD = 30
    PY_READ_FAILED = 31
    PY_NOT_CODE = 32


STAT_MAX = len(Stat)


class Config(ct.Structure):
    _fields_ = [
        ("epoch", ct.c_uint32),
        ("filter", ct.c_uint32),
        ("self_tgid", ct.c_uint32),
        ("stack_flags", ct.c_uint32),
        ("state_mask", ct.c_uint32),
        ("modes", ct.c_uint32),
        ("min_block_ns", ct.c_uint64),
        ("max_block_ns", ct.c_uint64),
        ("sample_ns", ct.c_uint64),
    ]


class Key(ct.Structure):
    _fields_ = [
        ("pid", ct.c_uint32),
        ("tid", ct.c_uint32),
        ("user_stack_id", ct.c_int32),
        ("kernel_stack_id", ct.c_int32),
        ("epoch", ct.c_uint32),
        ("stack_epoch", ct.c_uint32),
        ("state", ct.c_uint32),
        ("unwinder", ct.c_uint32),
        ("kind", ct.c_uint32),
        ("peer_pid", ct.c_uint32),
        ("peer_tid", ct.c_uint32),
        ("peer_user_stack_id", ct.c_int32),
        ("peer_kernel_stack_id", ct.c_int32),
        ("peer_stack_epoch", ct.c_uint32),
        ("comm", ct.c_char * COMM_LEN),
        ("peer_comm", ct.c_char * COMM_LEN),
    ]


class Value(ct.Structure):
    _fields_ = [
        ("count", ct.c_uint64),
        ("total_ns", ct.c_uint64),
    ]


class Start(ct.Structure):
    _fields_ = [
        ("ts", ct.c_uint64),
        ("pid", ct.c_uint32),
        ("user_stack_id", ct.c_int32),
        ("kernel_stack_id", ct.c_int32),
        ("stack_epoch", ct.c_uint32),
        ("state", ct.c_uint32),
        ("unwinder", ct.c_uint32),
        ("comm", ct.c_char * COMM_LEN),
    ]


THREAD_ON_CPU = 0x1   # struct ember_thread.flags: running on a CPU now
THREAD_KERNEL = 0x2   # ... a kernel thread


class Thread(ct.Structure):
    _fields_ = [
        ("pid", ct.c_uint32),
        ("tid", ct.c_uint32),
        ("state", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("exec_start", ct.c_uint64),
        ("now", ct.c_uint64),
        ("switched", ct.c_uint64),
        ("rq_now", ct.c_uint64),
        ("ip", ct.c_uint64),
        ("sp", ct.c_uint64),
        ("bp", ct.c_uint64),
        ("kernel_len", ct.c_int32),
        ("cpu", ct.c_uint32),
        ("comm", ct.c_char * COMM_LEN),
        ("kernel", ct.c_uint64 * MAX_STACK_DEPTH),
    ]


class Crossed(ct.Structure):
    _fields_ = [
        ("start", Start),
        ("wake_ts", ct.c_uint64),
        ("end_ts", ct.c_uint64),
        ("epoch", ct.c_uint32),
        ("reserved", ct.c_uint32),
    ]


class Wake(ct.Structure):
    _fields_ = [
        ("ts", ct.c_uint64),
        ("pid", ct.c_uint32),
        ("tid", ct.c_uint32),
        ("user_stack_id", ct.c_int32),
        ("kernel_stack_id", ct.c_int32),
        ("stack_epoch", ct.c_uint32),
        ("reserved", ct.c_uint32),
        ("comm", ct.c_char * COMM_LEN),
    ]


class Block(ct.Structure):
    """Task storage value of the sampled off-CPU program."""

    _fields_ = [
        ("ts", ct.c_uint64),
        ("wake_ts", ct.c_uint64),
        ("weight_ns", ct.c_uint64),
        ("weight_count", ct.c_uint64),
        ("user_ip", ct.c_uint64),
        ("user_sp", ct.c_uint64),
        ("kernel_stack_id", ct.c_int32),
        ("stack_epoch", ct.c_uint32),
        ("state", ct.c_uint32),
        ("pending_state", ct.c_uint32),
        ("resume_seen", ct.c_uint32),
        ("reserved", ct.c_uint32),
        ("charged", ct.c_uint64),
    ]


CHARGED_DONE = (1 << 64) - 1  # ember_block.charged once the block ended


class InFlight(ct.Structure):
    """A sampled block in flight, charged by a drain (struct ember_in_flight)."""

    _fields_ = [
        ("pid", ct.c_uint32),
        ("tid", ct.c_uint32),
        ("state", ct.c_uint32),
        ("kernel_stack_id", ct.c_int32),
        ("stack_epoch", ct.c_uint32),
        ("reserved", ct.c_uint32),
        ("from_ns", ct.c_uint64),
        ("to_ns", ct.c_uint64),
        ("since_ns", ct.c_uint64),
        ("ip", ct.c_uint64),
        ("sp", ct.c_uint64),
        ("bp", ct.c_uint64),
        ("comm", ct.c_char * COMM_LEN),
    ]


class UnwindRow(ct.Structure):
    _fields_ = [
        ("pc", ct.c_uint32),
        ("cfa_offset", ct.c_int32),
        ("rbp_offset", ct.c_int16),
        ("cfa_type", ct.c_uint8),
        ("rbp_type", ct.c_uint8),
    ]


class UnwindMapping(ct.Structure):
    _fields_ = [
        ("start", ct.c_uint64),
        ("end", ct.c_uint64),
        ("bias", ct.c_uint64),
        ("row_start", ct.c_uint32),
        ("row_count", ct.c_uint32),
    ]


class UnwindProc(ct.Structure):
    _fields_ = [
        ("count", ct.c_uint32),
        ("reserved", ct.c_uint32),
        ("maps", UnwindMapping * UNWIND_MAPPINGS),
    ]


class PyProc(ct.Structure):
    _fields_ = [
        ("interp_head", ct.c_uint64),
        ("eval_start", ct.c_uint64 * 2),
        ("eval_end", ct.c_uint64 * 2),
        ("code_type", ct.c_uint64),
        ("interp_threads", ct.c_uint16),
        ("tstate_next", ct.c_uint16),
        ("tstate_tid", ct.c_uint16),
        ("tstate_frame", ct.c_uint16),
        ("cframe_frame", ct.c_uint16),
        ("frame_previous", ct.c_uint16),
        ("frame_code", ct.c_uint16),
        ("frame_instr", ct.c_uint16),
        ("frame_entry", ct.c_uint16),
        ("code_adaptive", ct.c_uint16),
        ("code_firstlineno", ct.c_uint16),
        ("entry", ct.c_uint8),
        ("owned_by_cstack", ct.c_uint8),
        ("thread_match", ct.c_uint8),
        ("frame_bytes", ct.c_uint8),
        ("task_fsbase", ct.c_uint16),
        ("object_type", ct.c_uint16),
        ("pad", ct.c_uint8 * 2),
    ]


class UStack(ct.Structure):
    _fields_ = [
        ("hash", ct.c_uint64),
        ("len", ct.c_uint32),
        ("end", ct.c_uint32),
        ("ips", ct.c_uint64 * MAX_STACK_DEPTH),
    ]


class HistKey(ct.Structure):
    _fields_ = [("pid", ct.c_uint32), ("slot", ct.c_uint32)]


STRUCTS: dict[str, type[ct.Structure]] = {
    "ember_config": Config,
    "ember_key": Key,
    "ember_value": Value,
    "ember_start": Start,
    "ember_crossed": Crossed,
    "ember_thread": Thread,
    "ember_wake": Wake,
    "ember_hist_key": HistKey,
    "ember_block": Block,
    "ember_in_flight": InFlight,
    "ember_unwind_row": UnwindRow,
    "ember_unwind_mapping": UnwindMapping,
    "ember_unwind_proc": UnwindProc,
    "ember_py_proc": PyProc,
    "ember_ustack": UStack,
}

CONSTANTS: dict[str, int] = {
    "EMBER_COMM_LEN": COMM_LEN,
    "EMBER_MAX_STACK_DEPTH": MAX_STACK_DEPTH,
    "EMBER_KIND_ONCPU": KIND_ONCPU,
    "EMBER_KIND_BLOCKED": KIND_BLOCKED,
    "EMBER_KIND_RUNQ": KIND_RUNQ,
    "EMBER_KIND_WAKEUP": KIND_WAKEUP,
    "EMBER_KIND_OFFWAKE": KIND_OFFWAKE,
    "EMBER_MODE_BLOCKED": MODE_BLOCKED,
    "EMBER_MODE_RUNQ": MODE_RUNQ,
    "EMBER_MODE_WAKEUP": MODE_WAKEUP,
    "EMBER_MODE_OFFWAKE": MODE_OFFWAKE,
    "EMBER_RUNQ_HIST_SLOTS": RUNQ_HIST_SLOTS,
    "EMBER_BOUNDS": BOUNDS,
    "EMBER_CHARGED_DONE": CHARGED_DONE,
    "EMBER_THREAD_ON_CPU": THREAD_ON_CPU,
    "EMBER_THREAD_KERNEL": THREAD_KERNEL,
    "EMBER_FILTER_PIDS": FILTER_PIDS,
    "EMBER_FILTER_CGROUPS": FILTER_CGROUPS,
    "EMBER_STACK_USER": STACK_USER,
    "EMBER_STACK_KERNEL": STACK_KERNEL,
    "EMBER_STACK_NONE": STACK_NONE,
    "EMBER_STACK_LATE": STACK_LATE,
    "EMBER_STACK_STALE": STACK_STALE,
    "EMBER_TASK_STACK_BIT": TASK_STACK_BIT,
    "EMBER_RAW_TASK_DEAD": RAW_TASK_DEAD,
    "EMBER_RAW_TASK_NOLOAD": RAW_TASK_NOLOAD,
    "EMBER_RAW_TASK_RTLOCK_WAIT": RAW_TASK_RTLOCK_WAIT,
    "EMBER_RAW_TASK_REPORT": RAW_TASK_REPORT,
    "EMBER_STATE_INTERRUPTIBLE": STATE_INTERRUPTIBLE,
    "EMBER_STATE_UNINTERRUPTIBLE": STATE_UNINTERRUPTIBLE,
    "EMBER_STATE_STOPPED": STATE_STOPPED,
    "EMBER_STATE_TRACED": STATE_TRACED,
    "EMBER_STATE_EXIT_DEAD": STATE_EXIT_DEAD,
    "EMBER_STATE_EXIT_ZOMBIE": STATE_EXIT_ZOMBIE,
    "EMBER_STATE_PARKED": STATE_PARKED,
    "EMBER_STATE_IDLE": STATE_IDLE,
    "EMBER_STATE_RUNNABLE": STATE_RUNNABLE,
    "EMBER_STATE_BEFORE_START": STATE_BEFORE_START,
    "EMBER_UNWINDER_FP": UNWINDER_FP,
    "EMBER_UNWINDER_DWARF": UNWINDER_DWARF,
    "EMBER_USTACK_BIT": USTACK_BIT,
    "EMBER_CENSUS_STACK_BIT": CENSUS_STACK_BIT,
    "EMBER_UNWIND_MAPPINGS": UNWIND_MAPPINGS,
    "EMBER_UNWIND_MAPPING_STEPS": UNWIND_MAPPING_STEPS,
    "EMBER_UNWIND_ROW_STEPS": UNWIND_ROW_STEPS,
    "EMBER_CFA_UNSUPPORTED": CFA_UNSUPPORTED,
    "EMBER_CFA_RSP": CFA_RSP,
    "EMBER_CFA_RBP": CFA_RBP,
    "EMBER_CFA_PLT": CFA_PLT,
    "EMBER_CFA_END": CFA_END,
    "EMBER_CFA_NONE": CFA_NONE,
    "EMBER_RBP_SAME": RBP_SAME,
    "EMBER_RBP_SAVED": RBP_SAVED,
    "EMBER_RBP_UNKNOWN": RBP_UNKNOWN,
    "EMBER_PY_CODE": PY_CODE,
    "EMBER_PY_INSTR": PY_INSTR,
    "EMBER_PY_TAG": PY_TAG,
    "EMBER_PY_THREAD_STEPS": PY_THREAD_STEPS,
    "EMBER_PY_FRAME_BYTES": PY_FRAME_BYTES,
    "EMBER_PY_FRAMES_PER_PROG": PY_FRAMES_PER_PROG,
    "EMBER_PY_ENTRY_ONE": PY_ENTRY_ONE,
    "EMBER_PY_ENTRY_IS_ENTRY": PY_ENTRY_IS_ENTRY,
    "EMBER_PY_ENTRY_OWNER": PY_ENTRY_OWNER,
    "EMBER_PY_MATCH_TID": PY_MATCH_TID,
    "EMBER_PY_MATCH_FSBASE": PY_MATCH_FSBASE,
    **{f"EMBER_UNWIND_END_{e.name}": int(e) for e in UnwindEnd},
    "EMBER_STAT_MAX": STAT_MAX,
    **{f"EMBER_STAT_{s.name}": int(s) for s in Stat},
    **DEFAULT_DEFINES,
}

#: Names used in folded output and labels for each single state bit.
STATE_NAMES: dict[int, str] = {
    STATE_INTERRUPTIBLE: "sleeping",
    STATE_UNINTERRUPTIBLE: "disk-sleep",
    STATE_STOPPED: "stopped",
    STATE_TRACED: "traced",
    STATE_EXIT_DEAD: "dead",
    STATE_EXIT_ZOMBIE: "zombie",
    STATE_PARKED: "parked",
    STATE_IDLE: "idle",
    STATE_RUNNABLE: "runnable",
}


def state_name(state: int) -> str:
    """A name for a normalised thread state; unknown bits are shown in hex."""
    state &= ~STATE_BEFORE_START
    if state in STATE_NAMES:
        return STATE_NAMES[state]
    names = [n for bit, n in STATE_NAMES.items() if state & bit]
    return "+".join(names) if names else f"state-{state:#x}"
