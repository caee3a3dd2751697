/* A pprof profile's samples, locations and functions read in one pass.
 *
 * ember.collector.decode reads these tables as arrays; this is the same
 * reading in C, over the bytes the protobuf runtime has already parsed
 * (so they are a valid Profile), with the GIL released. It takes the
 * layouts decode.py's numpy reader takes and refuses the same ones
 * (returning None: the caller then reads message by message):
 *
 *   - a Location is fields 1-5 only (id, mapping_id, address, line,
 *     is_folded), a Line fields 1-3, a Function fields 1-5, all varints
 *     but the Lines;
 *   - a Sample is its packed location ids, then its packed values (each
 *     optional, each at most once, in that order), then the rest, which
 *     decode.py checks is labels only.
 *
 * Every read is bounded by the bytes given, whatever they hold: a length
 * past its message, a varint past 10 bytes or past the end, or a field of
 * the Profile with a wire type that does not exist refuses the whole profile.
 *
 * tables(raw) -> None, or a tuple of 18 bytearrays of 8-byte words (native
 * order), in the order of FIELDS below: per location, per line, per
 * function and per sample, every sample's location ids and values one
 * after another, and per string of the string table the hash Python gives
 * its bytes (what intern.py keys a function's strings by).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum {
    L_ID, L_MAPPING, L_ADDRESS, L_LINES,        /* per location */
    LN_LOCATION, LN_FUNCTION, LN_LINE,          /* per line */
    F_ID, F_NAME, F_SYSTEM, F_FILE,             /* per function */
    S_LOCATIONS, S_DEPTH, S_VALUES, S_WIDTH,    /* every id and value; per sample */
    S_REST, S_END,                              /* per sample: where its labels are */
    STRING_HASH,                                /* per string: Python's hash of its bytes */
    FIELDS
};

typedef struct { uint64_t *v; Py_ssize_t n, cap; } Vec;
typedef struct { Vec v[FIELDS]; const uint8_t *base; } Out;

enum { OK = 0, REFUSED = 1, NO_MEMORY = -1 };

static int grow(Vec *a)
{
    Py_ssize_t cap = a->cap ? a->cap * 2 : 4096;
    uint64_t *v = PyMem_RawRealloc(a->v, (size_t)cap * sizeof *v);
    if (v == NULL)
        return NO_MEMORY;
    a->v = v;
    a->cap = cap;
    return OK;
}

static inline int put(Vec *a, uint64_t x)
{
    if (__builtin_expect(a->n == a->cap, 0) && grow(a))
        return NO_MEMORY;
    a->v[a->n++] = x;
    return OK;
}

#define PUT(vec, x) do { if (put((vec), (x))) return NO_MEMORY; } while (0)

/* The varint at *p (at most 10 bytes, all before end), *p moved past it. */
static inline int varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    if (__builtin_expect(*p < end && **p < 0x80, 1)) {   /* (most are one byte) */
        *out = *(*p)++;
        return OK;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (*p >= end)
            return REFUSED;
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = v;
            return OK;
        }
    }
    return REFUSED;
}

#define VARINT(p, end, out) do { if (varint(&(p), (end), (out))) return REFUSED; } while (0)

/* A length-delimited field's length, checked against what is left. */
static int length(const uint8_t **p, const uint8_t *end, const uint8_t **stop)
{
    uint64_t n;
    if (varint(p, end, &n) || n > (uint64_t)(end - *p))
        return REFUSED;
    *stop = *p + n;
    return OK;
}

#define LENGTH(p, end, stop) do { if (length(&(p), (end), &(stop))) return REFUSED; } while (0)

/* What hash(bytes) is: SipHash under this process's random key (so no
 * sender can choose strings whose hashes meet), without the GIL. */
static Py_hash_t hash_bytes(const uint8_t *p, Py_ssize_t n)
{
#if PY_VERSION_HEX >= 0x030E0000
    return Py_HashBuffer(p, n);
#else
    return _Py_HashBytes(p, n);
#endif
}

static int line(Out *o, const uint8_t *p, const uint8_t *end, uint64_t location)
{
    uint64_t tag, x, function = 0, number = 0;
    while (p < end) {
        VARINT(p, end, &tag);
        VARINT(p, end, &x);
        switch (tag) {
        case 0x08: function = x; break;
        case 0x10: number = x; break;
        case 0x18: break;                               /* column */
        default: return REFUSED;
        }
    }
    PUT(&o->v[LN_LOCATION], location);
    PUT(&o->v[LN_FUNCTION], function);
    PUT(&o->v[LN_LINE], number);
    return OK;
}

static int location(Out *o, const uint8_t *p, const uint8_t *end)
{
    uint64_t tag, x, id = 0, mapping = 0, address = 0, lines = 0;
    uint64_t index = (uint64_t)o->v[L_ID].n;
    const uint8_t *stop;
    int err;
    while (p < end) {
        VARINT(p, end, &tag);
        if (tag == 0x22) {
            LENGTH(p, end, stop);
            if ((err = line(o, p, stop, index)))
                return err;
            p = stop;
            lines++;
            continue;
        }
        VARINT(p, end, &x);
        switch (tag) {
        case 0x08: id = x; break;
        case 0x10: mapping = x; break;
        case 0x18: address = x; break;
        case 0x28: break;                               /* is_folded */
        default: return REFUSED;
        }
    }
    PUT(&o->v[L_ID], id);
    PUT(&o->v[L_MAPPING], mapping);
    PUT(&o->v[L_ADDRESS], address);
    PUT(&o->v[L_LINES], lines);
    return OK;
}

static int function(Out *o, const uint8_t *p, const uint8_t *end)
{
    uint64_t tag, x, f[4] = {0, 0, 0, 0};
    while (p < end) {
        VARINT(p, end, &tag);
        VARINT(p, end, &x);
        if (tag == 0x08 || tag == 0x10 || tag == 0x18 || tag == 0x20)
            f[(tag >> 3) - 1] = x;
        else if (tag != 0x28)                           /* start_line */
            return REFUSED;
    }
    PUT(&o->v[F_ID], f[0]);
    PUT(&o->v[F_NAME], f[1]);
    PUT(&o->v[F_SYSTEM], f[2]);
    PUT(&o->v[F_FILE], f[3]);
    return OK;
}

/* The packed field ``tag`` if it is next in [*p, end): its varints onto
 * ``into``, how many in *count (0 if the field is not there). */
static int packed(Out *o, const uint8_t **p, const uint8_t *end, uint64_t tag, int into,
                  uint64_t *count)
{
    const uint8_t *q = *p, *stop;
    uint64_t t, x;
    *count = 0;
    if (q >= end || varint(&q, end, &t) || t != tag)
        return OK;                                      /* not this field: the rest says */
    LENGTH(q, end, stop);
    while (q < stop) {
        VARINT(q, stop, &x);
        PUT(&o->v[into], x);
        (*count)++;
    }
    *p = stop;
    return OK;
}

static int sample(Out *o, const uint8_t *p, const uint8_t *end)
{
    uint64_t depth, width;
    int err;
    if ((err = packed(o, &p, end, 0x0A, S_LOCATIONS, &depth)))
        return err;
    if ((err = packed(o, &p, end, 0x12, S_VALUES, &width)))
        return err;
    PUT(&o->v[S_DEPTH], depth);
    PUT(&o->v[S_WIDTH], width);
    PUT(&o->v[S_REST], (uint64_t)(p - o->base));
    PUT(&o->v[S_END], (uint64_t)(end - o->base));
    return OK;
}

static int profile(Out *o, const uint8_t *p, const uint8_t *end)
{
    uint64_t tag;
    const uint8_t *stop;
    int err;
    while (p < end) {
        VARINT(p, end, &tag);
        uint64_t field = tag >> 3, wire = tag & 7;
        if (field == 0)
            return REFUSED;
        if ((field == 2 || field == 4 || field == 5) && wire == 2) {
            /* a sample, location or function (with another wire type, the
             * runtime keeps the field as one it does not know: skipped) */
            LENGTH(p, end, stop);
            err = field == 2 ? sample(o, p, stop)
                : field == 4 ? location(o, p, stop) : function(o, p, stop);
            if (err)
                return err;
            p = stop;
            continue;
        }
        if (field == 6 && wire == 2) {                  /* a string */
            LENGTH(p, end, stop);
            PUT(&o->v[STRING_HASH], (uint64_t)hash_bytes(p, stop - p));
            p = stop;
            continue;
        }
        switch (wire) {                                 /* any other field: skipped */
        case 0: { uint64_t x; VARINT(p, end, &x); break; }
        case 1: if (end - p < 8) return REFUSED; p += 8; break;
        case 2: LENGTH(p, end, stop); p = stop; break;
        case 5: if (end - p < 4) return REFUSED; p += 4; break;
        default: return REFUSED;
        }
    }
    return OK;
}

static PyObject *tables(PyObject *self, PyObject *arg)
{
    Py_buffer raw;
    Out o;
    int err;
    PyObject *out = NULL;
    (void)self;
    if (PyObject_GetBuffer(arg, &raw, PyBUF_SIMPLE) < 0)
        return NULL;
    memset(&o, 0, sizeof o);
    o.base = raw.buf;
    Py_BEGIN_ALLOW_THREADS
    err = profile(&o, o.base, o.base + raw.len);
    Py_END_ALLOW_THREADS
    if (err == NO_MEMORY) {
        PyErr_NoMemory();
    } else if (err == REFUSED) {
        out = Py_NewRef(Py_None);
    } else if ((out = PyTuple_New(FIELDS)) != NULL) {
        for (int i = 0; i < FIELDS; i++) {
            PyObject *b = PyByteArray_FromStringAndSize(
                (const char *)o.v[i].v, o.v[i].n * (Py_ssize_t)sizeof(uint64_t));
            if (b == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyTuple_SET_ITEM(out, i, b);
        }
    }
    for (int i = 0; i < FIELDS; i++)
        PyMem_RawFree(o.v[i].v);
    PyBuffer_Release(&raw);
    return out;
}

static PyMethodDef methods[] = {
    {"tables", tables, METH_O,
     "A serialized Profile's tables as 18 bytearrays of 8-byte words, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pprof", "pprof tables read in C (see decode.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pprof(void)
{
    return PyModule_Create(&module);
}
