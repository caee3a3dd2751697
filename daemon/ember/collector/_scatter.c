/* Sums scattered by index, in one pass, for the query engine (scatter.py).
 *
 * One host's hour is 1.25 million rows into 527,000 leaves of a tree of
 * 800,000 nodes. numpy sums rows per leaf with bincount (float64: exact
 * only below 2^53, so the store's sums went through it in 32-bit halves),
 * a leaf's value into its node with add.at, and each level into its
 * parents with add.at once per depth: together about half of the answer.
 * Here each is one loop over the rows or nodes, exact in int64, without
 * the GIL (other requests go on meanwhile).
 *
 *   add_at(out, index, values, seen=None): out[index[i]] += values[i] for
 *     every i, each sum saturating at INT64_MIN / INT64_MAX; with `seen`
 *     (bytes, as long as out) seen[index[i]] = 1 too. index is uint32,
 *     int32 or int64; values and out int64; an index outside out is an
 *     IndexError, raised before anything is written. Returns the sum of
 *     the values' magnitudes, as a double (whether a sum could saturate).
 *   roll_up(total, parent): total[parent[i]] += total[i] (saturating) for
 *     each node i from the last of total down to 1, where every node's
 *     parent is an earlier node (as the index numbers them): each total
 *     becomes its own value and its descendants'. parent is int32 or
 *     int64, at least as long as total (a longer one: the index grew
 *     after the tree); a parent that is not an earlier node is a
 *     ValueError, raised before anything is written.
 *   sum_narrow(sums, index, values, seen) -> rows summed: sums (uint32)
 *     [index[i]] += values[i] in 32 bits, up to the first row whose value
 *     is outside [0, 2^32) or whose sum would pass 2^32 - 1 (n if none);
 *     seen[index[i]] = 1 where values[i] is 0 (seen may be None).
 *   sum_rows(sums, index, values, seen): the same in int64, saturating,
 *     for every row; seen[index[i]] = 1 where values[i] <= 0. With sums
 *     and values None, seen[index[i]] = 1 for every row.
 *   present(first, seen, out=None) -> count: the indices where first (a
 *     column of sums, uint32 or int64, or None) is not 0 or seen is set,
 *     ascending, written into out (uint32, exactly as long) when given.
 *     (A sum of positive values is not 0: only other rows need a mark.)
 * Every buffer is C-contiguous, its format and length checked
 * (_buffers.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_buffers.h"

static inline int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* The first item of `a` outside [lo, hi) (counting from 0), or -1: checked
 * before any write, so a bad index leaves every output as it was. */
#define OUTSIDE(name, type)                                                      \
    static Py_ssize_t name(const type *a, Py_ssize_t n, int64_t lo, int64_t hi)  \
    {                                                                            \
        for (Py_ssize_t i = 0; i < n; i++)                                       \
            if ((int64_t)a[i] < lo || (int64_t)a[i] >= hi)                       \
                return i;                                                        \
        return -1;                                                               \
    }
OUTSIDE(outside_u32, uint32_t)
OUTSIDE(outside_i32, int32_t)
OUTSIDE(outside_i64, int64_t)

static Py_ssize_t outside(const Ints *a, int64_t lo, int64_t hi)
{
    switch (a->kind) {
    case 'I': return outside_u32(a->buf.buf, a->n, lo, hi);
    case 'i': return outside_i32(a->buf.buf, a->n, lo, hi);
    default: return outside_i64(a->buf.buf, a->n, lo, hi);
    }
}

/* The loop of add_at for one index type: out[index[i]] += values[i]
 * (saturating), seen[index[i]] = 1 where seen is given; returns the sum
 * of the values' magnitudes, saturating at UINT64_MAX. */
#define SCATTER(name, type)                                                         \
    static uint64_t name(int64_t *o, const type *idx, const int64_t *v, uint8_t *s,  \
                         Py_ssize_t n)                                               \
    {                                                                                \
        uint64_t size = 0;                                                           \
        for (Py_ssize_t i = 0; i < n; i++) {                                         \
            int64_t at = (int64_t)idx[i];                                            \
            o[at] = sat_add(o[at], v[i]);                                            \
            uint64_t mag = v[i] < 0 ? -(uint64_t)v[i] : (uint64_t)v[i];              \
            size = size + mag < size ? UINT64_MAX : size + mag;                      \
            if (s)                                                                   \
                s[at] = 1;                                                           \
        }                                                                            \
        return size;                                                                 \
    }
SCATTER(scatter_u32, uint32_t)
SCATTER(scatter_i32, int32_t)
SCATTER(scatter_i64, int64_t)

static PyObject *add_at(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *names[] = {"out", "index", "values", "seen", NULL};
    PyObject *out_o, *index_o, *values_o, *seen_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O:add_at", names, &out_o, &index_o,
                                     &values_o, &seen_o))
        return NULL;
    Py_buffer out, values, seen;
    Ints index;
    int has_seen = seen_o != Py_None;
    if (get_int64(out_o, &out, 1, "out"))
        return NULL;
    if (get_ints(index_o, &index, "index")) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (get_int64(values_o, &values, 0, "values")) {
        PyBuffer_Release(&index.buf);
        PyBuffer_Release(&out);
        return NULL;
    }
    if (has_seen && PyObject_GetBuffer(seen_o, &seen, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)) {
        PyBuffer_Release(&values);
        PyBuffer_Release(&index.buf);
        PyBuffer_Release(&out);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t m = out.len / 8, bad;
    if (values.len / 8 != index.n)
        PyErr_Format(PyExc_ValueError, "%zd values for %zd indices", values.len / 8, index.n);
    else if (has_seen && seen.len != m)
        PyErr_Format(PyExc_ValueError, "seen holds %zd bytes for %zd sums", seen.len, m);
    else if ((bad = outside(&index, 0, m)) >= 0)
        PyErr_Format(PyExc_IndexError, "index %lld (item %zd) is outside the %zd sums",
                     (long long)item(&index, bad), bad, m);
    else {
        int64_t *o = out.buf;
        const int64_t *v = values.buf;
        uint8_t *s = has_seen ? seen.buf : NULL;
        uint64_t size;
        Py_BEGIN_ALLOW_THREADS
        switch (index.kind) {
        case 'I': size = scatter_u32(o, index.buf.buf, v, s, index.n); break;
        case 'i': size = scatter_i32(o, index.buf.buf, v, s, index.n); break;
        default: size = scatter_i64(o, index.buf.buf, v, s, index.n); break;
        }
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble((double)size);
    }
    if (has_seen)
        PyBuffer_Release(&seen);
    PyBuffer_Release(&values);
    PyBuffer_Release(&index.buf);
    PyBuffer_Release(&out);
    return result;
}

/* The loops of sum_rows for one index type: o[idx[i]] += v[i]
 * (saturating), and s[idx[i]] = 1 where v[i] <= 0; with no sums,
 * s[idx[i]] = 1 for every row. */
#define SUM_ROWS(name, type)                                                        \
    static void name(int64_t *o, const type *idx, const int64_t *v, uint8_t *s,      \
                     Py_ssize_t n)                                                   \
    {                                                                                \
        if (!o) {                                                                    \
            for (Py_ssize_t i = 0; i < n; i++)                                       \
                s[idx[i]] = 1;                                                       \
            return;                                                                  \
        }                                                                            \
        for (Py_ssize_t i = 0; i < n; i++) {                                         \
            int64_t at = (int64_t)idx[i];                                            \
            o[at] = sat_add(o[at], v[i]);                                            \
            if (__builtin_expect(v[i] <= 0, 0))                                      \
                s[at] = 1;                                                           \
        }                                                                            \
    }
SUM_ROWS(sum_rows_u32, uint32_t)
SUM_ROWS(sum_rows_i32, int32_t)
SUM_ROWS(sum_rows_i64, int64_t)

static PyObject *sum_rows(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *acc_o, *index_o, *values_o, *seen_o;
    if (!PyArg_ParseTuple(args, "OOOO:sum_rows", &acc_o, &index_o, &values_o, &seen_o))
        return NULL;
    int has_sums = acc_o != Py_None;
    if (has_sums != (values_o != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "sums and values: both or neither");
        return NULL;
    }
    Ints index;
    Py_buffer seen, acc, values;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(seen_o, &seen, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE))
        return NULL;
    if (get_ints(index_o, &index, "index"))
        goto seen;
    if (has_sums && get_int64(acc_o, &acc, 1, "sums"))
        goto index;
    if (has_sums && get_int64(values_o, &values, 0, "values"))
        goto acc;
    Py_ssize_t m = seen.len, bad;
    if (has_sums && acc.len / 8 != m)
        PyErr_Format(PyExc_ValueError, "%zd sums for %zd marks", acc.len / 8, m);
    else if (has_sums && values.len / 8 != index.n)
        PyErr_Format(PyExc_ValueError, "%zd values for %zd indices", values.len / 8, index.n);
    else if ((bad = outside(&index, 0, m)) >= 0)
        PyErr_Format(PyExc_IndexError, "index %lld (item %zd) is outside the %zd sums",
                     (long long)item(&index, bad), bad, m);
    else {
        int64_t *o = has_sums ? acc.buf : NULL;
        const int64_t *v = has_sums ? values.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        switch (index.kind) {
        case 'I': sum_rows_u32(o, index.buf.buf, v, seen.buf, index.n); break;
        case 'i': sum_rows_i32(o, index.buf.buf, v, seen.buf, index.n); break;
        default: sum_rows_i64(o, index.buf.buf, v, seen.buf, index.n); break;
        }
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    if (has_sums)
        PyBuffer_Release(&values);
acc:
    if (has_sums)
        PyBuffer_Release(&acc);
index:
    PyBuffer_Release(&index.buf);
seen:
    PyBuffer_Release(&seen);
    return result;
}

/* Whether an index is present: its first sum is not 0 or it is marked. */
#define IS(f, s, i) (((f) && (f)[i] != 0) | ((s)[i] != 0))

static PyObject *present(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *first_o, *seen_o, *out_o = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O:present", &first_o, &seen_o, &out_o))
        return NULL;
    Py_buffer seen;
    Ints first, out;
    int has_first = first_o != Py_None, has_out = out_o != Py_None;
    if (PyObject_GetBuffer(seen_o, &seen, PyBUF_C_CONTIGUOUS))
        return NULL;
    if (has_first && get_ints(first_o, &first, "first")) {
        PyBuffer_Release(&seen);
        return NULL;
    }
    if (has_out && get_ints(out_o, &out, "out")) {
        if (has_first)
            PyBuffer_Release(&first.buf);
        PyBuffer_Release(&seen);
        return NULL;
    }
    Py_ssize_t m = seen.len, k = 0;
    PyObject *result = NULL;
    const uint8_t *s = seen.buf;
    const int64_t *f64 = has_first && first.kind == 'q' ? first.buf.buf : NULL;
    const uint32_t *f32 = has_first && first.kind != 'q' ? first.buf.buf : NULL;
    if (has_first && first.n != m)
        PyErr_Format(PyExc_ValueError, "first holds %zd sums for %zd marks", first.n, m);
    else if (has_out && (out.kind != 'I' || out.buf.readonly))
        PyErr_SetString(PyExc_TypeError, "out: writable uint32 items expected");
    else {
        if (f64)
            for (Py_ssize_t i = 0; i < m; i++)
                k += IS(f64, s, i);
        else
            for (Py_ssize_t i = 0; i < m; i++)
                k += IS(f32, s, i);
        if (has_out && out.n != k)
            PyErr_Format(PyExc_ValueError, "out holds %zd items for %zd present", out.n, k);
        else {
            if (has_out) {
                /* (no branch: a third to two thirds of one host's leaves are
                 * present, in no order a branch predictor could learn; the
                 * last write lands in the slot after the last present, so
                 * the loop stops short of it) */
                uint32_t *o = out.buf.buf;
                Py_ssize_t j = 0;
                for (Py_ssize_t i = 0; i < m && j < k; i++) {
                    o[j] = (uint32_t)i;
                    j += f64 ? IS(f64, s, i) : IS(f32, s, i);
                }
            }
            result = PyLong_FromSsize_t(k);
        }
    }
    if (has_out)
        PyBuffer_Release(&out.buf);
    if (has_first)
        PyBuffer_Release(&first.buf);
    PyBuffer_Release(&seen);
    return result;
}

/* The loop of sum_narrow for one index type: o[idx[i]] += v[i] in 32
 * bits, up to the first row whose value is outside [0, 2^32) or whose sum
 * would pass 2^32 - 1 (returned; n when there is none). */
#define NARROW(name, type)                                                          \
    static Py_ssize_t name(uint32_t *o, const type *idx, const int64_t *v, uint8_t *s, \
                           Py_ssize_t n)                                             \
    {                                                                                \
        for (Py_ssize_t i = 0; i < n; i++) {                                         \
            uint64_t x = (uint64_t)v[i];   /* (a negative value: past 2^32) */       \
            uint32_t r, *at = &o[idx[i]];                                            \
            if (x > UINT32_MAX || __builtin_add_overflow(*at, (uint32_t)x, &r))      \
                return i;                                                            \
            *at = r;                                                                 \
            if (s && __builtin_expect(x == 0, 0))                                    \
                s[idx[i]] = 1;                                                       \
        }                                                                            \
        return n;                                                                    \
    }
NARROW(narrow_u32, uint32_t)
NARROW(narrow_i32, int32_t)
NARROW(narrow_i64, int64_t)

static PyObject *sum_narrow(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *acc_o, *index_o, *values_o, *seen_o;
    if (!PyArg_ParseTuple(args, "OOOO:sum_narrow", &acc_o, &index_o, &values_o, &seen_o))
        return NULL;
    Ints acc, index;
    Py_buffer values, seen;
    int has_seen = seen_o != Py_None;
    if (get_ints(acc_o, &acc, "sums"))
        return NULL;
    PyObject *result = NULL;
    if (acc.kind != 'I' || acc.buf.readonly) {
        PyErr_SetString(PyExc_TypeError, "sums: writable uint32 items expected");
        PyBuffer_Release(&acc.buf);
        return NULL;
    }
    if (get_ints(index_o, &index, "index")) {
        PyBuffer_Release(&acc.buf);
        return NULL;
    }
    if (get_int64(values_o, &values, 0, "values"))
        goto index;
    if (has_seen && PyObject_GetBuffer(seen_o, &seen, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE))
        goto values;
    Py_ssize_t bad;
    if (values.len / 8 != index.n)
        PyErr_Format(PyExc_ValueError, "%zd values for %zd indices", values.len / 8, index.n);
    else if (has_seen && seen.len != acc.n)
        PyErr_Format(PyExc_ValueError, "seen holds %zd bytes for %zd sums", seen.len, acc.n);
    else if ((bad = outside(&index, 0, acc.n)) >= 0)
        PyErr_Format(PyExc_IndexError, "index %lld (item %zd) is outside the %zd sums",
                     (long long)item(&index, bad), bad, acc.n);
    else {
        Py_ssize_t done;
        uint8_t *s = has_seen ? seen.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        switch (index.kind) {
        case 'I': done = narrow_u32(acc.buf.buf, index.buf.buf, values.buf, s, index.n); break;
        case 'i': done = narrow_i32(acc.buf.buf, index.buf.buf, values.buf, s, index.n); break;
        default: done = narrow_i64(acc.buf.buf, index.buf.buf, values.buf, s, index.n); break;
        }
        Py_END_ALLOW_THREADS
        result = PyLong_FromSsize_t(done);
    }
    if (has_seen)
        PyBuffer_Release(&seen);
values:
    PyBuffer_Release(&values);
index:
    PyBuffer_Release(&index.buf);
    PyBuffer_Release(&acc.buf);
    return result;
}

static PyObject *roll_up(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *total_o, *parent_o;
    if (!PyArg_ParseTuple(args, "OO:roll_up", &total_o, &parent_o))
        return NULL;
    Py_buffer total;
    Ints parent;
    if (get_int64(total_o, &total, 1, "total"))
        return NULL;
    if (get_ints(parent_o, &parent, "parent")) {
        PyBuffer_Release(&total);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = total.len / 8, bad = -1;
    if (parent.n < n)
        PyErr_Format(PyExc_ValueError, "%zd parents for %zd totals", parent.n, n);
    else {
        for (Py_ssize_t i = 1; i < n && bad < 0; i++) {
            int64_t up = item(&parent, i);
            if (up < 0 || up >= i)
                bad = i;
        }
        if (bad >= 0)
            PyErr_Format(PyExc_ValueError, "node %zd's parent (%lld) is not an earlier node",
                         bad, (long long)item(&parent, bad));
        else {
            int64_t *t = total.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = n - 1; i > 0; i--) {
                int64_t up = item(&parent, i);
                t[up] = sat_add(t[up], t[i]);
            }
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&parent.buf);
    PyBuffer_Release(&total);
    return result;
}

static PyMethodDef methods[] = {
    {"add_at", (PyCFunction)(void (*)(void))add_at, METH_VARARGS | METH_KEYWORDS,
     "add_at(out, index, values, seen=None) -> sum of |values|: out[index[i]] += values[i]."},
    {"sum_rows", (PyCFunction)sum_rows, METH_VARARGS,
     "sum_rows(sums, index, values, seen): sums[index[i]] += values[i]; seen marked."},
    {"sum_narrow", (PyCFunction)sum_narrow, METH_VARARGS,
     "sum_narrow(sums, index, values, seen) -> rows summed: in 32 bits, while they fit."},
    {"present", (PyCFunction)present, METH_VARARGS,
     "present(first, seen, out=None) -> count: the indices where first != 0 or seen."},
    {"roll_up", (PyCFunction)roll_up, METH_VARARGS,
     "roll_up(total, parent): total[parent[i]] += total[i], from the last node to node 1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scatter", "Sums scattered by index (see scatter.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scatter(void)
{
    return PyModule_Create(&module);
}
