/* The text of a pruned flame graph, for the query engine (engine.py's
 * Tree.nested_json).
 *
 * engine.py orders the kept nodes (preorder, children widest first) and
 * says after each how many subtrees close there; what was left, a format
 * of each node's name, value and self and a join of 5,000 pieces, took
 * about a third of the JSON's time for one host's hour. Here it is one
 * pass into one buffer.
 *
 *   text(pre, closes, nids, names, value, own, first) -> str: for each k,
 *     node i = pre[k] written as
 *       {"name": N, "value": value[i], "self": own[i], "children": [
 *     then closes[k] times "]}", then ", " where closes[k] > 0 and k is
 *     not the last; N is names[nids[i]] (a str, already JSON), or `first`
 *     (a str, or None) for k = 0. pre, closes, nids, value and own are
 *     int64; pre's items index the others (as long as each other);
 *     closes is as long as pre; names is a list.
 * An index outside its array, a name that is not a str and a count of
 * closes below 0 are errors (ValueError, TypeError), with nothing made.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_buffers.h"

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int reserve(Buf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = PyMem_Realloc(b->p, cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static void put(Buf *b, const char *s, Py_ssize_t n)
{
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* An int64 in decimal (at most 20 characters). */
static void put_int(Buf *b, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? -(uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        tmp[n++] = '-';
    while (n)
        b->p[b->len++] = tmp[--n];
}

#define HEAD "{\"name\": "
#define VALUE ", \"value\": "
#define SELF ", \"self\": "
#define KIDS ", \"children\": ["

static PyObject *text(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *objs[6], *names, *first;
    if (!PyArg_ParseTuple(args, "OOOO!OOO:text", &objs[0], &objs[1], &objs[2], &PyList_Type,
                          &names, &objs[4], &objs[5], &first))
        return NULL;
    static const char *what[6] = {"pre", "closes", "nids", NULL, "value", "own"};
    Py_buffer bufs[6];
    int got = 0;
    for (; got < 6; got++) {
        if (got == 3)
            continue;
        if (get_int64(objs[got], &bufs[got], 0, what[got]))
            break;
    }
    PyObject *result = NULL;
    Buf b = {NULL, 0, 0};
    if (got < 6)
        goto done;
    if (first != Py_None && !PyUnicode_Check(first)) {
        PyErr_SetString(PyExc_TypeError, "first: a str or None expected");
        goto done;
    }
    Py_ssize_t n = bufs[0].len / 8, m = bufs[2].len / 8, nn = PyList_GET_SIZE(names);
    if (bufs[1].len / 8 != n || bufs[4].len / 8 != m || bufs[5].len / 8 != m) {
        PyErr_Format(PyExc_ValueError, "%zd closes for %zd nodes; %zd values and %zd selfs "
                     "for %zd names", bufs[1].len / 8, n, bufs[4].len / 8, bufs[5].len / 8, m);
        goto done;
    }
    const int64_t *pre = bufs[0].buf, *closes = bufs[1].buf, *nids = bufs[2].buf,
                  *value = bufs[4].buf, *own = bufs[5].buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t i = pre[k];
        if (i < 0 || i >= m) {
            PyErr_Format(PyExc_ValueError, "pre[%zd] = %lld is not one of the %zd nodes", k,
                         (long long)i, m);
            goto done;
        }
        if (closes[k] < 0 || closes[k] > n + 1) {
            PyErr_Format(PyExc_ValueError, "closes[%zd] = %lld", k, (long long)closes[k]);
            goto done;
        }
        PyObject *name = first;
        if (k > 0 || first == Py_None) {
            int64_t nid = nids[i];
            if (nid < 0 || nid >= nn) {
                PyErr_Format(PyExc_ValueError, "name %lld is not one of the %zd names",
                             (long long)nid, nn);
                goto done;
            }
            name = PyList_GET_ITEM(names, nid);
            if (!PyUnicode_Check(name)) {
                PyErr_Format(PyExc_TypeError, "name %lld is not a str", (long long)nid);
                goto done;
            }
        }
        Py_ssize_t size;
        const char *s = PyUnicode_AsUTF8AndSize(name, &size);
        if (!s)
            goto done;
        Py_ssize_t c = (Py_ssize_t)closes[k];
        if (reserve(&b, size + (Py_ssize_t)(sizeof HEAD + sizeof VALUE + sizeof SELF
                                            + sizeof KIDS) + 48 + 2 * c + 2))
            goto done;
        put(&b, HEAD, sizeof HEAD - 1);
        put(&b, s, size);
        put(&b, VALUE, sizeof VALUE - 1);
        put_int(&b, value[i]);
        put(&b, SELF, sizeof SELF - 1);
        put_int(&b, own[i]);
        put(&b, KIDS, sizeof KIDS - 1);
        for (Py_ssize_t j = 0; j < c; j++)
            put(&b, "]}", 2);
        if (c && k + 1 < n)
            put(&b, ", ", 2);
    }
    result = PyUnicode_DecodeUTF8(b.p ? b.p : "", b.len, "strict");
done:
    PyMem_Free(b.p);
    for (int j = 0; j < got; j++)
        if (j != 3)
            PyBuffer_Release(&bufs[j]);
    return result;
}

static PyMethodDef methods[] = {
    {"text", (PyCFunction)text, METH_VARARGS,
     "text(pre, closes, nids, names, value, own, first) -> str: a pruned tree's JSON."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tree_json", "A pruned flame graph's text (see engine.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tree_json(void)
{
    return PyModule_Create(&module);
}
