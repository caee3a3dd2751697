/* pylayouts.c: print, as one JSON object, the CPython struct offsets and
 * sizes ember's BPF frame walker needs, for the headers this is compiled
 * against.  Every number comes from the compiler (offsetof/sizeof on the
 * real structs); nothing here is written down by hand.
 *
 * Build (pylayouts.generate() does exactly this):
 *   gcc -DPy_BUILD_CORE -I<include> -I<include>/internal pylayouts.c -o pylayouts
 * where <include> is e.g. /usr/include/python3.11 or
 * $(pyenv root)/versions/3.12.1/include/python3.12.
 *
 * Fields a version does not have print -1.  The key order matches the
 * dataclass ember.runtimes.pylayouts.Layout.
 */
#define PY_SSIZE_T_CLEAN
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030A0000 || PY_VERSION_HEX >= 0x030E0000
#error "pylayouts.c knows CPython 3.10 to 3.13 only"
#endif

#if PY_VERSION_HEX < 0x030C0000
/* up to 3.11 the full PyMemberDef is in structmember.h (3.12+: descrobject.h) */
#include <structmember.h>
#endif
#if PY_VERSION_HEX < 0x030B0000
/* 3.10: frames are PyFrameObjects (public cpython/frameobject.h) */
#include <frameobject.h>
#endif
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_code.h"
#if PY_VERSION_HEX >= 0x030B0000
/* 3.11+: frames are _PyInterpreterFrames */
#include "internal/pycore_frame.h"
#endif

#define NONE (-1L)

static int first = 1;

static void field(const char *name, long value)
{
    printf("%s\n  \"%s\": %ld", first ? "{" : ",", name, value);
    first = 0;
}

/* Index of the lowest set bit of the 32-bit `state` word of a PyASCIIObject
 * whose bitfields are all zero but the one the caller set; -1 if none is. */
static long lowest_bit(const PyASCIIObject *obj)
{
    uint32_t word;
    memcpy(&word, (const char *)obj + offsetof(PyASCIIObject, state), sizeof word);
    for (long i = 0; i < 32; i++) {
        if (word & ((uint32_t)1 << i)) {
            return i;
        }
    }
    return NONE;
}

int main(void)
{
    PyASCIIObject probe;
    long kind_shift, compact_bit, ascii_bit;

    memset(&probe, 0, sizeof probe);
    probe.state.kind = 1;
    kind_shift = lowest_bit(&probe);
    memset(&probe, 0, sizeof probe);
    probe.state.compact = 1;
    compact_bit = lowest_bit(&probe);
    memset(&probe, 0, sizeof probe);
    probe.state.ascii = 1;
    ascii_bit = lowest_bit(&probe);

    field("runtime_interpreters_head", (long)offsetof(_PyRuntimeState, interpreters.head));
    field("runtime_interpreters_main", (long)offsetof(_PyRuntimeState, interpreters.main));
#if PY_VERSION_HEX < 0x030B0000
    field("interp_threads_head", (long)offsetof(PyInterpreterState, tstate_head));
#else
    field("interp_threads_head", (long)offsetof(PyInterpreterState, threads.head));
#endif
    field("tstate_next", (long)offsetof(PyThreadState, next));
    field("tstate_thread_id", (long)offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX < 0x030B0000
    field("tstate_native_thread_id", NONE);
#else
    field("tstate_native_thread_id", (long)offsetof(PyThreadState, native_thread_id));
#endif

#if PY_VERSION_HEX < 0x030B0000
    field("tstate_frame", (long)offsetof(PyThreadState, frame));
    field("cframe_current_frame", NONE);
    field("frame_previous", (long)offsetof(PyFrameObject, f_back));
    field("frame_code", (long)offsetof(PyFrameObject, f_code));
    field("frame_instr", (long)offsetof(PyFrameObject, f_lasti));
    field("frame_is_entry", NONE);
    field("frame_owner", NONE);
    field("owned_by_cstack", NONE);
#elif PY_VERSION_HEX < 0x030D0000
    /* 3.11, 3.12: tstate->cframe->current_frame */
    field("tstate_frame", (long)offsetof(PyThreadState, cframe));
    field("cframe_current_frame", (long)offsetof(_PyCFrame, current_frame));
    field("frame_previous", (long)offsetof(_PyInterpreterFrame, previous));
    field("frame_code", (long)offsetof(_PyInterpreterFrame, f_code));
    field("frame_instr", (long)offsetof(_PyInterpreterFrame, prev_instr));
#if PY_VERSION_HEX < 0x030C0000
    field("frame_is_entry", (long)offsetof(_PyInterpreterFrame, is_entry));
#else
    field("frame_is_entry", NONE);
#endif
    field("frame_owner", (long)offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030C0000
    field("owned_by_cstack", NONE);
#else
    field("owned_by_cstack", (long)FRAME_OWNED_BY_CSTACK);
#endif
#else
    /* 3.13: tstate->current_frame, f_executable, instr_ptr */
    field("tstate_frame", (long)offsetof(PyThreadState, current_frame));
    field("cframe_current_frame", NONE);
    field("frame_previous", (long)offsetof(_PyInterpreterFrame, previous));
    field("frame_code", (long)offsetof(_PyInterpreterFrame, f_executable));
    field("frame_instr", (long)offsetof(_PyInterpreterFrame, instr_ptr));
    field("frame_is_entry", NONE);
    field("frame_owner", (long)offsetof(_PyInterpreterFrame, owner));
    field("owned_by_cstack", (long)FRAME_OWNED_BY_CSTACK);
#endif

    field("code_filename", (long)offsetof(PyCodeObject, co_filename));
    field("code_name", (long)offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX < 0x030B0000
    field("code_qualname", NONE);
#else
    field("code_qualname", (long)offsetof(PyCodeObject, co_qualname));
#endif
    field("code_firstlineno", (long)offsetof(PyCodeObject, co_firstlineno));
    field("code_linetable", (long)offsetof(PyCodeObject, co_linetable));
#if PY_VERSION_HEX < 0x030B0000
    field("code_adaptive", NONE);
    field("code_code", (long)offsetof(PyCodeObject, co_code));
#else
    field("code_adaptive", (long)offsetof(PyCodeObject, co_code_adaptive));
    field("code_code", NONE);
#endif

    field("object_type", (long)offsetof(PyObject, ob_type));
    field("var_size", (long)offsetof(PyVarObject, ob_size));
    field("type_members", (long)offsetof(PyTypeObject, tp_members));
    field("type_name", (long)offsetof(PyTypeObject, tp_name));
    field("member_size", (long)sizeof(PyMemberDef));
    field("member_name", (long)offsetof(PyMemberDef, name));
    field("member_offset", (long)offsetof(PyMemberDef, offset));
    field("bytes_data", (long)offsetof(PyBytesObject, ob_sval));
    field("unicode_length", (long)offsetof(PyASCIIObject, length));
    field("unicode_state", (long)offsetof(PyASCIIObject, state));
    field("ascii_data", (long)sizeof(PyASCIIObject));
    field("compact_data", (long)sizeof(PyCompactUnicodeObject));
    field("unicode_kind_shift", kind_shift);
    field("unicode_compact_bit", compact_bit);
    field("unicode_ascii_bit", ascii_bit);
    field("code_unit", (long)sizeof(_Py_CODEUNIT));
    printf("\n}\n");
    return 0;
}
