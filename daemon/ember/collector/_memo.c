/* Rows of 64-bit words mapped to values, in a hash table (see memo.py).
 *
 * memo.py's SortedMemo finds a batch of rows with one searchsorted of their
 * keys, then gathers the candidate rows to compare them: for a profile's
 * 5,000 locations in a table of a million, that gather and its temporaries
 * took most of a worker's lookup time. Here each row is found with one
 * probe of an open-addressing table of 8-byte slots (a 32-bit tag of the
 * row's hash and the row's number) and one compare against the row kept in
 * an array; a tag two rows share costs a compare, never a wrong value.
 *
 * The hash is a keyed mix of the row's words: the caller gives the keys
 * (drawn at random per process), so no sender can choose rows that meet.
 *
 * Table(cols, values, key) with key 16 bytes;
 *   find(rows, out, found) -> how many found: rows is n x cols words, out
 *     n x values words and found n bytes (written: 1 found, 0 not; out's
 *     row left as it was where not found);
 *   add(rows, values) -> how many were new (a row held keeps its values);
 *   clear(); len(); nbytes (what the table holds, in bytes).
 * Every buffer is C-contiguous native words, its length checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Rows ahead of its compare that find asks for a row's memory. */
#define AHEAD 8

typedef struct {
    PyObject_HEAD
    Py_ssize_t cols, width;   /* words per row, per value */
    uint64_t k0, k1;          /* the mix's keys (odd) */
    uint64_t *slots;          /* tag << 32 | row number + 1; 0: empty */
    size_t mask;              /* slots - 1 (slots a power of two) */
    uint64_t *rows, *values;  /* n rows, n values, room for `room` */
    size_t n, room;
} Table;

static inline uint64_t mix(const Table *t, const uint64_t *row)
{
    uint64_t h = 0;
    for (Py_ssize_t j = 0; j < t->cols; j++) {
        h ^= row[j];
        h *= t->k0;
        h ^= h >> 31;
    }
    h *= t->k1;
    h ^= h >> 29;
    return h;
}

/* The row a held slot names (slots hold its number + 1 below the tag). */
static inline size_t row_of(uint64_t slot)
{
    return (size_t)(slot & 0xFFFFFFFFu) - 1;
}

/* The slot of `row` (hash h): where it is, or the empty one it would take. */
static inline size_t probe(const Table *t, const uint64_t *row, uint64_t h, int *held)
{
    uint64_t tag = h >> 32;
    size_t i = (size_t)h & t->mask;
    size_t bytes = (size_t)t->cols * sizeof(uint64_t);
    for (;;) {
        uint64_t s = t->slots[i];
        if (s == 0) {
            *held = 0;
            return i;
        }
        if (s >> 32 == tag && memcmp(t->rows + row_of(s) * t->cols, row, bytes) == 0) {
            *held = 1;
            return i;
        }
        i = (i + 1) & t->mask;
    }
}

/* Room for `more` rows past n: the arrays grown, the slots kept at most half full. */
static int reserve(Table *t, size_t more)
{
    size_t need = t->n + more;
    if (need >= 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_OverflowError, "a memo holds fewer than 2**32 rows");
        return -1;
    }
    if (need > t->room) {
        size_t room = t->room ? t->room : 1024;
        while (room < need)
            room *= 2;
        uint64_t *r = PyMem_Realloc(t->rows, room * (size_t)t->cols * sizeof(uint64_t));
        if (r == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->rows = r;
        uint64_t *v = PyMem_Realloc(t->values, room * (size_t)t->width * sizeof(uint64_t));
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->values = v;
        t->room = room;
    }
    if (t->slots != NULL && need * 2 <= t->mask + 1)
        return 0;
    size_t n_slots = t->slots ? (t->mask + 1) : 2048;
    while (need * 2 > n_slots)
        n_slots *= 2;
    uint64_t *slots = PyMem_Calloc(n_slots, sizeof(uint64_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->mask = n_slots - 1;
    for (size_t r = 0; r < t->n; r++) {   /* (every row is distinct: no compare) */
        uint64_t h = mix(t, t->rows + r * t->cols);
        size_t i = (size_t)h & t->mask;
        while (slots[i])
            i = (i + 1) & t->mask;
        slots[i] = (h >> 32) << 32 | (r + 1);
    }
    return 0;
}

/* `buf` as words: C-contiguous, writable if asked, of exactly `words` words. */
static int words(PyObject *obj, Py_buffer *buf, int writable, size_t per, Py_ssize_t *n,
                 const char *what)
{
    if (PyObject_GetBuffer(obj, buf, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)))
        return -1;
    size_t size = (size_t)buf->len;
    size_t unit = per * sizeof(uint64_t);
    if (*n < 0 ? size % unit != 0 : size != (size_t)*n * unit) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, not %zd rows of %zu words",
                     what, buf->len, *n, per);
        PyBuffer_Release(buf);
        return -1;
    }
    if (*n < 0)
        *n = (Py_ssize_t)(size / unit);
    return 0;
}

/* `rows` (n x cols words) and `other` (n x per words, writable if asked),
 * n found from rows: 0, or -1 holding neither. */
static int rows_and(Table *t, PyObject *rows, Py_buffer *rb, PyObject *other, Py_buffer *ob,
                    int writable, size_t per, const char *what, Py_ssize_t *n)
{
    *n = -1;
    if (words(rows, rb, 0, (size_t)t->cols, n, "rows"))
        return -1;
    if (words(other, ob, writable, per, n, what)) {
        PyBuffer_Release(rb);
        return -1;
    }
    return 0;
}

/* Each of the n rows' values into out, and found[r] 1 where the row is held
 * (0 where not): how many were, or -1 (out of memory, raised). */
static Py_ssize_t lookup(const Table *t, const uint64_t *rows, Py_ssize_t n, uint64_t *out,
                         uint8_t *found)
{
    memset(found, 0, (size_t)n);
    if (!n || !t->slots)
        return 0;
    uint64_t *h = PyMem_Malloc((size_t)n * sizeof *h);
    if (h == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* A table past the caches waits on memory twice a row (its slot, then
     * the row): every slot is asked for ahead, then each row a few rows
     * ahead of its compare, so the waits overlap. */
    for (Py_ssize_t r = 0; r < n; r++) {
        h[r] = mix(t, rows + r * t->cols);
        __builtin_prefetch(t->slots + ((size_t)h[r] & t->mask));
    }
    Py_ssize_t hits = 0;
    size_t vbytes = (size_t)t->width * sizeof(uint64_t);
    for (Py_ssize_t r = 0; r < n; r++) {
        if (r + AHEAD < n) {
            uint64_t s = t->slots[(size_t)h[r + AHEAD] & t->mask];
            if (s)
                __builtin_prefetch(t->rows + row_of(s) * t->cols);
        }
        int held;
        size_t i = probe(t, rows + r * t->cols, h[r], &held);
        if (held) {
            found[r] = 1;
            memcpy(out + r * t->width, t->values + row_of(t->slots[i]) * t->width, vbytes);
            hits++;
        }
    }
    PyMem_Free(h);
    return hits;
}

static PyObject *find(Table *t, PyObject *args)
{
    PyObject *rows_o, *out_o, *found_o, *result = NULL;
    if (!PyArg_ParseTuple(args, "OOO:find", &rows_o, &out_o, &found_o))
        return NULL;
    Py_buffer rb, ob, fb;
    Py_ssize_t n;
    if (rows_and(t, rows_o, &rb, out_o, &ob, 1, (size_t)t->width, "out", &n))
        return NULL;
    if (PyObject_GetBuffer(found_o, &fb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) == 0) {
        if (fb.len != n) {
            PyErr_Format(PyExc_ValueError, "found: %zd bytes, not %zd", fb.len, n);
        } else {
            Py_ssize_t hits = lookup(t, rb.buf, n, ob.buf, fb.buf);
            result = hits < 0 ? NULL : PyLong_FromSsize_t(hits);
        }
        PyBuffer_Release(&fb);
    }
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ob);
    return result;
}

static PyObject *add(Table *t, PyObject *args)
{
    PyObject *rows_o, *values_o;
    if (!PyArg_ParseTuple(args, "OO:add", &rows_o, &values_o))
        return NULL;
    Py_buffer rb, vb;
    Py_ssize_t n;
    if (rows_and(t, rows_o, &rb, values_o, &vb, 0, (size_t)t->width, "values", &n))
        return NULL;
    Py_ssize_t added = 0;
    if (reserve(t, (size_t)n) == 0) {
        const uint64_t *rows = rb.buf, *values = vb.buf;
        for (Py_ssize_t r = 0; r < n; r++) {
            const uint64_t *row = rows + r * t->cols;
            uint64_t h = mix(t, row);
            int held;
            size_t i = probe(t, row, h, &held);
            if (held)
                continue;
            memcpy(t->rows + t->n * t->cols, row, (size_t)t->cols * sizeof(uint64_t));
            memcpy(t->values + t->n * t->width, values + r * t->width,
                   (size_t)t->width * sizeof(uint64_t));
            t->slots[i] = (h >> 32) << 32 | ++t->n;
            added++;
        }
    } else {
        added = -1;
    }
    PyBuffer_Release(&rb);
    PyBuffer_Release(&vb);
    return added < 0 ? NULL : PyLong_FromSsize_t(added);
}

static void drop(Table *t)
{
    PyMem_Free(t->slots);
    PyMem_Free(t->rows);
    PyMem_Free(t->values);
    t->slots = t->rows = t->values = NULL;
    t->mask = t->n = t->room = 0;
}

static PyObject *clear(Table *t, PyObject *Py_UNUSED(ignored))
{
    drop(t);
    Py_RETURN_NONE;
}

static Py_ssize_t length(Table *t)
{
    return (Py_ssize_t)t->n;
}

static PyObject *nbytes(Table *t, void *Py_UNUSED(closure))
{
    size_t slots = t->slots ? t->mask + 1 : 0;
    return PyLong_FromSize_t(slots * sizeof(uint64_t)
                             + t->room * (size_t)(t->cols + t->width) * sizeof(uint64_t));
}

static int init(Table *t, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"cols", "values", "key", NULL};
    Py_ssize_t cols, width;
    Py_buffer key;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nny*:Table", names, &cols, &width, &key))
        return -1;
    int bad = key.len != 16;
    uint64_t k[2] = {0, 0};
    if (!bad)
        memcpy(k, key.buf, sizeof k);
    PyBuffer_Release(&key);
    if (bad || cols < 1 || width < 1 || cols > 4096 || width > 4096) {
        PyErr_SetString(PyExc_ValueError,
                        "Table(cols, values, key): 1-4096 words each, a 16-byte key");
        return -1;
    }
    drop(t);
    t->cols = cols;
    t->width = width;
    t->k0 = k[0] | 1;
    t->k1 = k[1] | 1;
    return 0;
}

static void dealloc(Table *t)
{
    drop(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMethodDef table_methods[] = {
    {"find", (PyCFunction)find, METH_VARARGS,
     "find(rows, out, found) -> how many rows were found (their values into out)."},
    {"add", (PyCFunction)add, METH_VARARGS,
     "add(rows, values) -> how many rows were new (a row held keeps its values)."},
    {"clear", (PyCFunction)clear, METH_NOARGS, "Forget every row."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef table_getset[] = {
    {"nbytes", (getter)nbytes, NULL, "Bytes the table holds.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods table_sequence = {.sq_length = (lenfunc)length};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ember.collector._memo.Table",
    .tp_doc = "Rows of cols words -> values words, in a keyed hash table (see _memo.c).",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)init,
    .tp_dealloc = (destructor)dealloc,
    .tp_methods = table_methods,
    .tp_getset = table_getset,
    .tp_as_sequence = &table_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_memo", "A hash table of rows of words (see memo.py).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__memo(void)
{
    if (PyType_Ready(&TableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Table", (PyObject *)&TableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
