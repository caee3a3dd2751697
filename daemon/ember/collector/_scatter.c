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
 * Every buffer is C-contiguous, its format and length checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* An index array: its items as int64 whatever their width (4 signed or
 * unsigned, or 8 signed). */
typedef struct {
    Py_buffer buf;
    int kind;   /* 'I' uint32, 'i' int32, 'q' int64 */
    Py_ssize_t n;
} Ints;

static int get_ints(PyObject *obj, Ints *a, const char *what)
{
    if (PyObject_GetBuffer(obj, &a->buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT))
        return -1;
    const char *f = a->buf.format ? a->buf.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    char c = f[0];
    if (f[1] == '\0' && a->buf.itemsize == 4 && (c == 'I' || c == 'i'))
        a->kind = c;
    else if (f[1] == '\0' && a->buf.itemsize == 8 && (c == 'q' || c == 'l'))
        a->kind = 'q';
    else {
        PyErr_Format(PyExc_TypeError, "%s: int32, uint32 or int64 items expected, not '%s'",
                     what, a->buf.format ? a->buf.format : "B");
        PyBuffer_Release(&a->buf);
        return -1;
    }
    a->n = a->buf.len / a->buf.itemsize;
    return 0;
}

static inline int64_t item(const Ints *a, Py_ssize_t i)
{
    switch (a->kind) {
    case 'I': return ((const uint32_t *)a->buf.buf)[i];
    case 'i': return ((const int32_t *)a->buf.buf)[i];
    default: return ((const int64_t *)a->buf.buf)[i];
    }
}

/* An int64 array (writable if asked). */
static int get_int64(PyObject *obj, Py_buffer *b, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT
                                       | (writable ? PyBUF_WRITABLE : 0)))
        return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (b->itemsize != 8 || !(f[0] == 'q' || f[0] == 'l') || f[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s: int64 items expected, not '%s'", what,
                     b->format ? b->format : "B");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* The first item of `a` outside [lo, hi) (counting from 0), or -1: checked
 * before any write, so a bad index leaves every output as it was. */
static Py_ssize_t outside(const Ints *a, int64_t lo, int64_t hi)
{
    for (Py_ssize_t i = 0; i < a->n; i++) {
        int64_t v = item(a, i);
        if (v < lo || v >= hi)
            return i;
    }
    return -1;
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
