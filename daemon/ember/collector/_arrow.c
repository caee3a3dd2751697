/* A query's result read from DuckDB through the Arrow C stream interface
 * (collector/results.py): the batches as they come, each column a buffer
 * over the batch's own memory, with no copy and no conversion.
 *
 * DuckDB's fetchnumpy converts its vectors into numpy arrays one by one:
 * one host's hour (1.25 million rows of a leaf id and a value) took 12-15
 * ms to read that way, 7-8 as an Arrow stream. The stream is the one the
 * Arrow PyCapsule interface hands over (`__arrow_c_stream__`), whose C
 * structures are a stable ABI: they are declared here, as the interface
 * asks of a consumer that links no Arrow library. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* https://arrow.apache.org/docs/format/CDataInterface.html */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *out);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *out);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

/* Columns read here: fixed-width numbers, by their Arrow format. */
static int item_size(const char *format)
{
    if (!format || !format[0] || format[1])
        return 0;
    switch (format[0]) {
    case 'c': case 'C': return 1;
    case 's': case 'S': return 2;
    case 'i': case 'I': case 'f': return 4;
    case 'l': case 'L': case 'g': return 8;
    default: return 0;
    }
}

/* One batch, released when the last column over it goes. */
typedef struct {
    PyObject_HEAD
    struct ArrowArray array;
} Batch;

static void batch_dealloc(Batch *self)
{
    if (self->array.release)
        self->array.release(&self->array);
    PyObject_Free(self);
}

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ember.collector._arrow.Batch",
    .tp_basicsize = sizeof(Batch),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch of a stream, released with its last column.",
};

/* One column of a batch: a read-only buffer of its bytes. */
typedef struct {
    PyObject_HEAD
    Batch *batch;
    const char *data;
    Py_ssize_t bytes;
} Column;

static void column_dealloc(Column *self)
{
    Py_XDECREF(self->batch);
    PyObject_Free(self);
}

static int column_getbuffer(Column *self, Py_buffer *view, int flags)
{
    static const char empty[8];
    return PyBuffer_FillInfo(view, (PyObject *)self, (void *)(self->data ? self->data : empty),
                             self->bytes, 1, flags);
}

static PyBufferProcs column_as_buffer = {
    .bf_getbuffer = (getbufferproc)column_getbuffer,
};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ember.collector._arrow.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = (destructor)column_dealloc,
    .tp_as_buffer = &column_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One column of a batch, as a read-only buffer of its bytes.",
};

static PyObject *Unread;   /* a column this module does not read (NULLs, a format) */

static void stream_error(struct ArrowArrayStream *s, int code, const char *what)
{
    const char *msg = s->get_last_error ? s->get_last_error(s) : NULL;
    PyErr_Format(PyExc_RuntimeError, "%s: %s", what, msg ? msg : strerror(code));
}

/* The schema's names and formats (a struct of fixed-width columns). */
static int read_schema(struct ArrowArrayStream *s, PyObject **names, PyObject **formats)
{
    struct ArrowSchema schema;
    memset(&schema, 0, sizeof schema);
    int rc = s->get_schema(s, &schema);
    if (rc) {
        stream_error(s, rc, "the stream's schema");
        return -1;
    }
    int ok = 0;
    *names = *formats = NULL;
    if (!schema.format || strcmp(schema.format, "+s") != 0 || schema.n_children < 0) {
        PyErr_Format(Unread, "a result of format '%s', not a struct of columns",
                     schema.format ? schema.format : "");
        goto done;
    }
    *names = PyList_New(schema.n_children);
    *formats = PyList_New(schema.n_children);
    if (!*names || !*formats)
        goto done;
    for (int64_t i = 0; i < schema.n_children; i++) {
        const struct ArrowSchema *c = schema.children[i];
        if (!item_size(c->format)) {
            PyErr_Format(Unread, "column '%s': Arrow format '%s' is not read here",
                         c->name ? c->name : "", c->format ? c->format : "");
            goto done;
        }
        PyObject *name = PyUnicode_FromString(c->name ? c->name : "");
        PyObject *format = PyUnicode_FromString(c->format);
        if (!name || !format) {
            Py_XDECREF(name);
            Py_XDECREF(format);
            goto done;
        }
        PyList_SET_ITEM(*names, i, name);
        PyList_SET_ITEM(*formats, i, format);
    }
    ok = 1;
done:
    if (schema.release)
        schema.release(&schema);
    if (!ok) {
        Py_CLEAR(*names);
        Py_CLEAR(*formats);
    }
    return ok ? 0 : -1;
}

/* A batch's columns, each a Column over its values; NULL with an error set. */
static PyObject *columns_of(Batch *b, PyObject *formats)
{
    const struct ArrowArray *a = &b->array;
    Py_ssize_t n = PyList_GET_SIZE(formats);
    if (a->n_children != n || a->length < 0 || a->offset < 0 || a->null_count > 0) {
        PyErr_Format(PyExc_ValueError, "a batch of %lld columns and %lld rows, %lld null, "
                     "in a result of %zd columns", (long long)a->n_children,
                     (long long)a->length, (long long)a->null_count, n);
        return NULL;
    }
    PyObject *out = PyTuple_New(n);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        const struct ArrowArray *c = a->children[i];
        int size = item_size(PyUnicode_AsUTF8(PyList_GET_ITEM(formats, i)));
        if (c->null_count != 0 && c->n_buffers > 0 && c->buffers[0]) {
            /* (-1, not counted, with a validity buffer: may hold NULLs too) */
            PyErr_Format(Unread, "column %zd holds NULL", i);
            Py_DECREF(out);
            return NULL;
        }
        if (c->n_buffers != 2 || c->offset < 0 || c->length < a->offset + a->length
            || (a->length && !c->buffers[1])) {
            PyErr_Format(PyExc_ValueError, "column %zd: %lld buffers, %lld rows from %lld, "
                         "not fixed-width values for %lld rows", i, (long long)c->n_buffers,
                         (long long)c->length, (long long)c->offset, (long long)a->length);
            Py_DECREF(out);
            return NULL;
        }
        Column *col = PyObject_New(Column, &ColumnType);
        if (!col) {
            Py_DECREF(out);
            return NULL;
        }
        Py_INCREF(b);
        col->batch = b;
        col->data = a->length ? (const char *)c->buffers[1] + (c->offset + a->offset) * size
                              : NULL;
        col->bytes = (Py_ssize_t)a->length * size;
        PyTuple_SET_ITEM(out, i, (PyObject *)col);
    }
    return out;
}

PyDoc_STRVAR(read_doc,
"read(stream, most, /) -> (names, formats, batches) | None\n\n"
"An Arrow stream capsule (`__arrow_c_stream__`) read to its end and released:\n"
"its columns' names and Arrow formats, and each batch as a tuple of its\n"
"columns (read-only buffers over the batch's memory, which they keep).\n"
"None, the stream released unread, once it holds more than ``most`` rows\n"
"(``most`` < 0: no limit). Unread: a column this module does not read (a\n"
"NULL in it, a format other than fixed-width numbers); RuntimeError: the\n"
"stream's own error (a failed or interrupted query), with its message.");

static PyObject *read_stream(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *capsule;
    Py_ssize_t most;
    if (!PyArg_ParseTuple(args, "On:read", &capsule, &most))
        return NULL;
    struct ArrowArrayStream *s = PyCapsule_GetPointer(capsule, "arrow_array_stream");
    if (!s)
        return NULL;
    if (!s->release) {
        PyErr_SetString(PyExc_ValueError, "the stream was already read");
        return NULL;
    }
    PyObject *names = NULL, *formats = NULL, *batches = NULL, *result = NULL;
    if (read_schema(s, &names, &formats))
        goto done;
    batches = PyList_New(0);
    if (!batches)
        goto done;
    long long rows = 0;
    for (;;) {
        Batch *b = PyObject_New(Batch, &BatchType);
        if (!b)
            goto done;
        memset(&b->array, 0, sizeof b->array);
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = s->get_next(s, &b->array);
        Py_END_ALLOW_THREADS
        if (rc) {
            Py_DECREF(b);
            stream_error(s, rc, "the stream's next batch");
            goto done;
        }
        if (!b->array.release) {   /* the end */
            Py_DECREF(b);
            break;
        }
        rows += b->array.length;
        if (most >= 0 && rows > most) {
            Py_DECREF(b);
            result = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *cols = columns_of(b, formats);
        Py_DECREF(b);   /* (its columns keep it) */
        if (!cols)
            goto done;
        int failed = PyList_Append(batches, cols);
        Py_DECREF(cols);
        if (failed)
            goto done;
    }
    result = PyTuple_Pack(3, names, formats, batches);
done:
    if (s->release)   /* the stream moved out of the capsule: released here */
        s->release(s);
    Py_XDECREF(names);
    Py_XDECREF(formats);
    Py_XDECREF(batches);
    return result;
}

static PyMethodDef methods[] = {
    {"read", read_stream, METH_VARARGS, read_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_arrow",
    "A query's result read through the Arrow C stream interface (collector/results.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__arrow(void)
{
    if (PyType_Ready(&BatchType) < 0 || PyType_Ready(&ColumnType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    Unread = PyErr_NewExceptionWithDoc(
        "ember.collector._arrow.Unread",
        "A column this module does not read: a NULL in it, or not fixed-width numbers.",
        PyExc_ValueError, NULL);
    if (!Unread || PyModule_AddObjectRef(m, "Unread", Unread) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
