/* Numeric buffers checked as the query engine's C loops take them
 * (_scatter.c, _tree_json.c): C-contiguous, of the item type named, a
 * TypeError naming the argument otherwise. Static inline: each module
 * takes what it uses. */
#ifndef EMBER_BUFFERS_H
#define EMBER_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* An int64 array (writable if asked). */
static inline int get_int64(PyObject *obj, Py_buffer *b, int writable, const char *what)
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

/* An index array: its items as int64 whatever their width (4 signed or
 * unsigned, or 8 signed). */
typedef struct {
    Py_buffer buf;
    int kind;   /* 'I' uint32, 'i' int32, 'q' int64 */
    Py_ssize_t n;
} Ints;

static inline int get_ints(PyObject *obj, Ints *a, const char *what)
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

#endif
