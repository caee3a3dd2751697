/* A numpy data allocator that keeps large freed arrays for the next
 * request (arena.py says why).
 *
 * Arrays below LARGE bytes come from malloc, as numpy's own allocator
 * gives them. From LARGE bytes an array is its own mapping, a multiple of
 * 64 KB; freed, it is kept (up to a limit of bytes in all, the oldest
 * unmapped to make room) for a later array that fits it, rather than
 * unmapped: a query's arrays of 4-16 MB were fresh mappings every time,
 * each page faulted in again.
 *
 *   install(): this allocator (as the "mem_handler" capsule numpy's
 *     PyDataMem_SetHandler takes) made the calling context's (numpy keeps the
 *     handler in a context variable: each thread sets its own), through
 *     numpy's C API table; True if it was not already.
 *   set_limit(bytes): the most freed bytes kept (0: none kept).
 *   stats(): (kept bytes, kept blocks, mapped bytes live or kept, reuses,
 *     mappings made).
 *
 * Every block starts with a header, 16 bytes before the data: the mapped
 * span (0 for a malloc block) and the size asked for, so realloc and free
 * need not be told the old size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define LARGE ((size_t)4 << 20)
#define GRAIN ((size_t)64 << 10)  /* blocks are multiples of 64 KB */
#define MAP_HEAD 64               /* the header's room before the data */
#define COLORS 16                 /* data offsets, 64 + 4160 * (n % COLORS) */
#define COLOR ((size_t)4096 + 64)
#define HEAD 16                   /* the header: {span, size} before data,
                                     and a block's offset before that */
#define SET_HANDLER_SLOT 304      /* PyDataMem_SetHandler in numpy's table */
#define GET_HANDLER_SLOT 305      /* PyDataMem_GetHandler */

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} Allocator;                      /* numpy's PyDataMemAllocator, version 1 */

typedef struct {
    char name[127];
    uint8_t version;
    Allocator allocator;
} Handler;                        /* numpy's PyDataMem_Handler */

typedef struct Kept {
    struct Kept *next;
    size_t span;
} Kept;                           /* a kept block: at its mapping's base */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Kept *kept;                /* freed blocks, newest first */
static size_t kept_bytes, kept_blocks, mapped_bytes;
static size_t limit;              /* none kept until set (arena.LIMIT, at import) */
static unsigned long long reuses, mappings;

static inline size_t *head(void *data) { return (size_t *)((char *)data - HEAD); }

static void *small(size_t size, int zero)
{
    if (size > SIZE_MAX - HEAD)
        return NULL;
    char *p = zero ? calloc(1, size + HEAD) : malloc(size + HEAD);
    if (p == NULL)
        return NULL;
    ((size_t *)p)[0] = 0;
    ((size_t *)p)[1] = size;
    return p + HEAD;
}

static void *large(size_t size, int zero)
{
    if (size > SIZE_MAX / 2)
        return NULL;
    /* (each block places its data at one of COLORS offsets, in turn: a
     * loop over several arrays at one page offset has its loads and
     * stores 4K-aliased) */
    static unsigned color;
    size_t off = MAP_HEAD + COLOR * (__atomic_fetch_add(&color, 1, __ATOMIC_RELAXED) % COLORS);
    size_t span = (size + MAP_HEAD + COLOR * COLORS + GRAIN - 1) / GRAIN * GRAIN;
    Kept *got = NULL;
    pthread_mutex_lock(&lock);
    /* the smallest kept block that fits, and wastes at most a quarter */
    Kept **best = NULL;
    for (Kept **k = &kept; *k != NULL; k = &(*k)->next)
        if ((*k)->span >= span && (*k)->span - span <= span / 4
                && (best == NULL || (*k)->span < (*best)->span))
            best = k;
    if (best != NULL) {
        got = *best;
        *best = got->next;
        kept_bytes -= got->span;
        kept_blocks--;
        reuses++;
    }
    pthread_mutex_unlock(&lock);
    char *base;
    if (got != NULL) {
        span = got->span;
        base = (char *)got;
        if (zero)
            memset(base + off, 0, size);
    } else {   /* a fresh mapping: zero already */
        base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED)
            return NULL;
        pthread_mutex_lock(&lock);
        mapped_bytes += span;
        mappings++;
        pthread_mutex_unlock(&lock);
    }
    char *data = base + off;
    head(data)[0] = span;
    head(data)[-1] = off;   /* (its block's base: data - off) */
    head(data)[1] = size;
    return data;
}

/* The oldest kept blocks past the limit, unlinked (under the lock), for
 * the caller to unmap after it. */
static Kept *over_limit(void)
{
    Kept *drop = NULL;
    while (kept != NULL && kept_bytes > limit) {
        Kept **k = &kept;
        while ((*k)->next != NULL)
            k = &(*k)->next;
        Kept *last = *k;
        *k = NULL;
        kept_bytes -= last->span;
        kept_blocks--;
        mapped_bytes -= last->span;
        last->next = drop;
        drop = last;
    }
    return drop;
}

static void unmap_all(Kept *drop)
{
    while (drop != NULL) {
        Kept *next = drop->next;
        munmap(drop, drop->span);
        drop = next;
    }
}

static void release(void *data)
{
    size_t span = head(data)[0];
    if (span == 0) {
        free((char *)data - HEAD);
        return;
    }
    /* kept newest first: the oldest go to make room (what a query frees
     * now fits the next query better than what an earlier kind left) */
    Kept *k = (Kept *)((char *)data - head(data)[-1]);
    k->span = span;
    pthread_mutex_lock(&lock);
    k->next = kept;
    kept = k;
    kept_bytes += span;
    kept_blocks++;
    Kept *drop = over_limit();
    pthread_mutex_unlock(&lock);
    unmap_all(drop);
}

static void *a_malloc(void *ctx, size_t size)
{
    (void)ctx;
    return size >= LARGE ? large(size, 0) : small(size, 0);
}

static void *a_calloc(void *ctx, size_t nelem, size_t elsize)
{
    (void)ctx;
    size_t size;
    if (__builtin_mul_overflow(nelem, elsize, &size))
        return NULL;
    return size >= LARGE ? large(size, 1) : small(size, 1);
}

static void *a_realloc(void *ctx, void *ptr, size_t new_size)
{
    if (ptr == NULL)
        return a_malloc(ctx, new_size);
    size_t span = head(ptr)[0], size = head(ptr)[1];
    if (span == 0 && new_size < LARGE) {   /* malloc's own, as it was */
        char *p = realloc((char *)ptr - HEAD, new_size + HEAD);
        if (p == NULL)
            return NULL;
        ((size_t *)p)[1] = new_size;
        return p + HEAD;
    }
    if (span != 0 && new_size >= LARGE && new_size + head(ptr)[-1] <= span) {
        head(ptr)[1] = new_size;           /* fits the block it has */
        return ptr;
    }
    void *out = a_malloc(ctx, new_size);
    if (out == NULL)
        return NULL;
    memcpy(out, ptr, size < new_size ? size : new_size);
    release(ptr);
    return out;
}

static void a_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    (void)size;
    if (ptr != NULL)
        release(ptr);
}

static Handler handler_struct = {
    "ember_arena", 1, {NULL, a_malloc, a_calloc, a_realloc, a_free}};


static void **numpy_api(void)
{
    static void **api;
    if (api != NULL)
        return api;
    PyObject *mod = PyImport_ImportModule("numpy._core._multiarray_umath");
    if (mod == NULL) {   /* numpy 1.x */
        PyErr_Clear();
        mod = PyImport_ImportModule("numpy.core._multiarray_umath");
        if (mod == NULL)
            return NULL;
    }
    PyObject *cap = PyObject_GetAttrString(mod, "_ARRAY_API");
    Py_DECREF(mod);
    if (cap == NULL)
        return NULL;
    api = PyCapsule_GetPointer(cap, NULL);
    Py_DECREF(cap);   /* (the table is numpy's, for the life of the process) */
    return api;
}

static PyObject *install(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    void **api = numpy_api();
    if (api == NULL)
        return NULL;
    PyObject *(*get)(void) = (PyObject * (*)(void)) api[GET_HANDLER_SLOT];
    PyObject *(*set)(PyObject *) = (PyObject * (*)(PyObject *)) api[SET_HANDLER_SLOT];
    PyObject *now = get();
    if (now == NULL)
        return NULL;
    void *was = PyCapsule_GetPointer(now, "mem_handler");
    Py_DECREF(now);
    if (was == NULL)
        PyErr_Clear();
    if (was == &handler_struct)
        Py_RETURN_FALSE;
    PyObject *cap = PyCapsule_New(&handler_struct, "mem_handler", NULL);
    if (cap == NULL)
        return NULL;
    PyObject *old = set(cap);
    Py_DECREF(cap);
    if (old == NULL)
        return NULL;
    Py_DECREF(old);
    Py_RETURN_TRUE;
}

static PyObject *set_limit(PyObject *self, PyObject *arg)
{
    (void)self;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "a limit of bytes is not negative");
        return NULL;
    }
    pthread_mutex_lock(&lock);
    limit = (size_t)n;
    Kept *drop = over_limit();
    pthread_mutex_unlock(&lock);
    unmap_all(drop);
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    pthread_mutex_lock(&lock);
    PyObject *out = Py_BuildValue("(nnnKK)", (Py_ssize_t)kept_bytes, (Py_ssize_t)kept_blocks,
                                  (Py_ssize_t)mapped_bytes, reuses, mappings);
    pthread_mutex_unlock(&lock);
    return out;
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS, "this allocator for the calling context's arrays"},
    {"set_limit", set_limit, METH_O, "the most freed bytes kept"},
    {"stats", stats, METH_NOARGS, "(kept bytes, kept blocks, mapped bytes, reuses, mappings)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_arena", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__arena(void) { return PyModule_Create(&module); }
