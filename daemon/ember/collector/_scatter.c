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
 *   unit_totals(total, scratch, leaves, values, parent, unit) -> done: a
 *     tree's totals summed in 32 bits, in units (see totals_u32 below).
 *   slot_sums(sums, leaves, values, slots, unit=1) -> (done, size):
 *     sums[slots[leaves[i]]] += values[i] for a query's rows, straight into
 *     a tree's nodes (slots: the query index's node per leaf id, int32;
 *     leaves uint32): in 32 bits and units (sums uint32) or in int64,
 *     saturating (sums int64, unit 1), up to the first row whose leaf has no
 *     slot among the sums (beyond slots, or -1) or, in 32 bits, whose value
 *     or sum does not fit. done: the rows summed; size: the sum of their
 *     values' magnitudes (in units for uint32 sums), at most 2^64 - 1.
 *   unit_roll_up(total, own, scratch, parent, unit) -> done: a tree's
 *     totals from each node's own sum (uint32, in units), kept as it is:
 *     the children's sums are added up in scratch (uint32, as long). done
 *     is false where a sum passes 2^32 - 1 (total is then partly written).
 *   roll_up(total, parent): total[parent[i]] += total[i] (saturating) for
 *     each node i from the last of total down to 1, where every node's
 *     parent is an earlier node (as the index numbers them): each total
 *     becomes its own value and its descendants'. parent is int32 or
 *     int64, at least as long as total (a longer one: the index grew
 *     after the tree); a parent that is not an earlier node is a
 *     ValueError, raised before anything is written.
 *   sum_narrow(sums, index, values, seen, unit=1) -> rows summed: sums
 *     (uint32)[index[i]] += values[i] / unit in 32 bits, up to the first
 *     row whose value is not a multiple of unit in [0, unit * 2^32) or
 *     whose sum would pass 2^32 - 1 (n if none); seen[index[i]] = 1 where
 *     values[i] is 0 (seen may be None). unit is 1 to 2^31 - 1.
 *   sum_rows(sums, index, values, seen): the same in int64, saturating,
 *     for every row; seen[index[i]] = 1 where values[i] <= 0. With sums
 *     and values None, seen[index[i]] = 1 for every row.
 *   present(first, seen, out=None, sums=None, unit=1) -> count: the
 *     indices where first (a column of sums, uint32 or int64, or None) is
 *     not 0 or seen is set, ascending, written into out (uint32, exactly
 *     as long) when given, and first's sums there times unit into sums
 *     (int64, as long; unit 1 for int64 sums) when given.
 *     (A sum of positive values is not 0: only other rows need a mark.)
 * Every buffer is C-contiguous, its format and length checked
 * (_buffers.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_buffers.h"

/* The largest unit: 32-bit sums times it stay below 2^63 when widened. */
#define UNIT_MAX 0x7fffffffLL

/* How many rows ahead the scattered loops ask for the line they will add
 * into: their sums (3-6 MB) do not stay in a core's cache, and each row's
 * is a miss the processor cannot foresee. */
#define AHEAD 32
#define FETCH(o, idx, i, n)                                                  \
    do {                                                                     \
        if ((i) + AHEAD < (n))                                               \
            __builtin_prefetch(&(o)[(idx)[(i) + AHEAD]], 1, 3);              \
    } while (0)

/* Whether g is not a unit the 32-bit loops take (a ValueError set). */
static int bad_unit(long long g)
{
    if (g >= 1 && g <= UNIT_MAX)
        return 0;
    PyErr_Format(PyExc_ValueError, "unit %lld: from 1 to 2^31 - 1", g);
    return 1;
}

/* Whether a node of the first n is not after its parent, as the index
 * numbers them (a ValueError set naming the first): checked before a
 * roll-up writes anything. */
static int bad_parents(const Ints *parent, Py_ssize_t n)
{
    for (Py_ssize_t i = 1; i < n; i++) {
        int64_t up = item(parent, i);
        if (up < 0 || up >= i) {
            PyErr_Format(PyExc_ValueError, "node %zd's parent (%lld) is not an earlier node",
                         i, (long long)up);
            return 1;
        }
    }
    return 0;
}

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
            FETCH(o, idx, i, n);                                                     \
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
            FETCH(o, idx, i, n);                                                     \
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

/* The fill of present: the indices into o (k slots), and with w the first
 * sums times g into w; how many it wrote, and in *stop the index after the
 * last it read (it stops at the k-th present). No branch: a third to two
 * thirds of one host's leaves are present, in no order a branch predictor
 * could learn; the last write lands in the slot after the last present, so
 * the loop stops short of it. */
#define FILL(name, type)                                                            \
    static Py_ssize_t name(const type *f, const uint8_t *s, Py_ssize_t m, Py_ssize_t k, \
                           uint32_t *o, int64_t *w, int64_t g, Py_ssize_t *stop)     \
    {                                                                                \
        Py_ssize_t j = 0, i = 0;                                                     \
        if (w)                                                                       \
            for (; i < m && j < k; i++) {                                            \
                o[j] = (uint32_t)i;                                                  \
                w[j] = (int64_t)f[i] * g;                                            \
                j += IS(f, s, i);                                                    \
            }                                                                        \
        else                                                                         \
            for (; i < m && j < k; i++) {                                            \
                o[j] = (uint32_t)i;                                                  \
                j += IS(f, s, i);                                                    \
            }                                                                        \
        *stop = i;                                                                   \
        return j;                                                                    \
    }
FILL(fill_u32, uint32_t)
FILL(fill_i64, int64_t)

static PyObject *present(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *first_o, *seen_o, *out_o = Py_None, *sums_o = Py_None;
    long long g = 1;
    if (!PyArg_ParseTuple(args, "OO|OOL:present", &first_o, &seen_o, &out_o, &sums_o, &g))
        return NULL;
    Py_buffer seen, sums;
    Ints first, out;
    int has_first = first_o != Py_None, has_out = out_o != Py_None;
    int has_sums = sums_o != Py_None;
    if (has_sums && (!has_first || !has_out)) {
        PyErr_SetString(PyExc_ValueError, "sums: only with first and out");
        return NULL;
    }
    if (PyObject_GetBuffer(seen_o, &seen, PyBUF_C_CONTIGUOUS))
        return NULL;
    PyObject *result = NULL;
    if (has_first && get_ints(first_o, &first, "first"))
        goto seen;
    if (has_out && get_ints(out_o, &out, "out"))
        goto first;
    if (has_sums && get_int64(sums_o, &sums, 1, "sums"))
        goto out;
    Py_ssize_t m = seen.len, k = 0;
    const uint8_t *s = seen.buf;
    const int64_t *f64 = has_first && first.kind == 'q' ? first.buf.buf : NULL;
    const uint32_t *f32 = has_first && first.kind != 'q' ? first.buf.buf : NULL;
    if (has_first && first.n != m)
        PyErr_Format(PyExc_ValueError, "first holds %zd sums for %zd marks", first.n, m);
    else if (has_first && first.kind == 'i')
        PyErr_SetString(PyExc_TypeError, "first: uint32 or int64 items expected");
    else if (has_out && (out.kind != 'I' || out.buf.readonly))
        PyErr_SetString(PyExc_TypeError, "out: writable uint32 items expected");
    else if (g < 1 || g > (f64 ? 1 : UNIT_MAX))
        PyErr_Format(PyExc_ValueError, "unit %lld: from 1 to %s", g,
                     f64 ? "1 (int64 sums)" : "2^31 - 1");
    else if (has_sums && sums.len / 8 != out.n)
        PyErr_Format(PyExc_ValueError, "sums holds %zd items for %zd present",
                     sums.len / 8, out.n);
    else {
        /* with out: filled, then what is present after the last it took
         * counted (one pass, not a count first and the fill after) */
        Py_ssize_t from = 0;
        if (has_out) {
            int64_t *w = has_sums ? sums.buf : NULL;
            k = f64 ? fill_i64(f64, s, m, out.n, out.buf.buf, w, g, &from)
                    : fill_u32(f32, s, m, out.n, out.buf.buf, w, g, &from);
        }
        if (f64)
            for (Py_ssize_t i = from; i < m; i++)
                k += IS(f64, s, i);
        else
            for (Py_ssize_t i = from; i < m; i++)
                k += IS(f32, s, i);
        if (has_out && out.n != k)
            PyErr_Format(PyExc_ValueError, "out holds %zd items for %zd present", out.n, k);
        else
            result = PyLong_FromSsize_t(k);
    }
    if (has_sums)
        PyBuffer_Release(&sums);
out:
    if (has_out)
        PyBuffer_Release(&out.buf);
first:
    if (has_first)
        PyBuffer_Release(&first.buf);
seen:
    PyBuffer_Release(&seen);
    return result;
}

/* Exact division by a unit g = 2^k * d (d odd) without a divide: x is a
 * multiple of g when its low k bits are 0 and (x >> k) * inv, with inv
 * d's inverse mod 2^64, is at most lim = (2^64 - 1) / d; that product is
 * then x / g (Granlund and Montgomery, "Division by invariant integers
 * using multiplication", 1994, section 9). */
typedef struct {
    int k;
    uint64_t low, inv, lim;
} Unit;


static Unit unit_of(uint64_t g)
{
    Unit u;
    u.k = __builtin_ctzll(g);
    u.low = ((uint64_t)1 << u.k) - 1;
    uint64_t d = g >> u.k, inv = d;   /* (d * d = 1 mod 8: 3 good bits, doubled each step) */
    for (int i = 0; i < 5; i++)
        inv *= 2 - d * inv;
    u.inv = inv;
    u.lim = UINT64_MAX / d;
    return u;
}

/* The loop of sum_narrow for one index type: o[idx[i]] += v[i] / g in 32
 * bits, up to the first row whose value is not a multiple of g in
 * [0, g * 2^32) or whose sum would pass 2^32 - 1 (returned; n when there
 * is none). */
#define NARROW(name, type)                                                          \
    static Py_ssize_t name(uint32_t *o, const type *idx, const int64_t *v, uint8_t *s, \
                           Py_ssize_t n, Unit u)                                     \
    {                                                                                \
        for (Py_ssize_t i = 0; i < n; i++) {                                         \
            FETCH(o, idx, i, n);                                                     \
            uint64_t x = (uint64_t)v[i];   /* (a negative value: past the limit) */  \
            uint64_t q = (x >> u.k) * u.inv;                                         \
            uint32_t r, *at = &o[idx[i]];                                            \
            if (((x & u.low) != 0) | (q > u.lim) | (q > UINT32_MAX)                  \
                || __builtin_add_overflow(*at, (uint32_t)q, &r))                     \
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
    long long g = 1;
    if (!PyArg_ParseTuple(args, "OOOO|L:sum_narrow", &acc_o, &index_o, &values_o, &seen_o, &g))
        return NULL;
    if (bad_unit(g))
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
        Unit u = unit_of((uint64_t)g);
        Py_BEGIN_ALLOW_THREADS
        switch (index.kind) {
        case 'I': done = narrow_u32(acc.buf.buf, index.buf.buf, values.buf, s, index.n, u); break;
        case 'i': done = narrow_i32(acc.buf.buf, index.buf.buf, values.buf, s, index.n, u); break;
        default: done = narrow_i64(acc.buf.buf, index.buf.buf, values.buf, s, index.n, u); break;
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
    Py_ssize_t n = total.len / 8;
    if (parent.n < n)
        PyErr_Format(PyExc_ValueError, "%zd parents for %zd totals", parent.n, n);
    else if (!bad_parents(&parent, n)) {
        int64_t *t = total.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = n - 1; i > 0; i--) {
            if (i > AHEAD)
                __builtin_prefetch(&t[item(&parent, i - AHEAD)], 1, 3);
            int64_t up = item(&parent, i);
            t[up] = sat_add(t[up], t[i]);
        }
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&parent.buf);
    PyBuffer_Release(&total);
    return result;
}

/* A tree's totals in units, for engine.Tree.build: each leaf's value / g
 * into scratch (uint32, zeroed here) at its node, then each node's into its
 * parent's from the last node up, each total, once final, times g into
 * total (int64). 0 where a value is not a multiple of g in [0, g * 2^32)
 * or a sum passes 2^32 - 1 (total is then partly written: the caller sums
 * in int64 instead), 1 when done. Half the memory of int64 sums: a fleet
 * host's 527,000 leaves into 800,000 nodes, and their roll-up, are random
 * writes that do not stay in the cache. */
static int totals_u32(int64_t *t, uint32_t *s, const int32_t *leaf, const int64_t *v,
                      Py_ssize_t k, const int32_t *parent, Py_ssize_t n, Unit u, int64_t g)
{
    if (narrow_i32(s, leaf, v, NULL, k, u) < k)   /* (sum_narrow's loop, unmarked) */
        return 0;
    for (Py_ssize_t i = n - 1; i > 0; i--) {
        if (i > AHEAD)
            __builtin_prefetch(&s[parent[i - AHEAD]], 1, 3);
        if (__builtin_add_overflow(s[parent[i]], s[i], &s[parent[i]]))
            return 0;
        t[i] = (int64_t)s[i] * g;
    }
    if (n)
        t[0] = (int64_t)s[0] * g;
    return 1;
}

static PyObject *unit_totals(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *total_o, *scratch_o, *leaf_o, *values_o, *parent_o;
    long long g;
    if (!PyArg_ParseTuple(args, "OOOOOL:unit_totals", &total_o, &scratch_o, &leaf_o, &values_o,
                          &parent_o, &g))
        return NULL;
    if (bad_unit(g))
        return NULL;
    Py_buffer total, values;
    Ints scratch, leaf, parent;
    PyObject *result = NULL;
    if (get_int64(total_o, &total, 1, "total"))
        return NULL;
    if (get_ints(scratch_o, &scratch, "scratch"))
        goto total;
    if (get_ints(leaf_o, &leaf, "leaves"))
        goto scratch;
    if (get_int64(values_o, &values, 0, "values"))
        goto leaf;
    if (get_ints(parent_o, &parent, "parent"))
        goto values;
    Py_ssize_t n = total.len / 8, bad = -1;
    if (scratch.kind != 'I' || scratch.buf.readonly || scratch.n != n)
        PyErr_Format(PyExc_ValueError, "scratch: %zd writable uint32 items expected", n);
    else if (leaf.kind != 'i' || parent.kind != 'i')
        PyErr_SetString(PyExc_TypeError, "leaves and parent: int32 items expected");
    else if (values.len / 8 != leaf.n)
        PyErr_Format(PyExc_ValueError, "%zd values for %zd leaves", values.len / 8, leaf.n);
    else if (parent.n < n)
        PyErr_Format(PyExc_ValueError, "%zd parents for %zd totals", parent.n, n);
    else if ((bad = outside(&leaf, 0, n)) >= 0)
        PyErr_Format(PyExc_IndexError, "leaf %lld (item %zd) is outside the %zd nodes",
                     (long long)item(&leaf, bad), bad, n);
    else if (!bad_parents(&parent, n)) {
        int done;
        Unit u = unit_of((uint64_t)g);
        Py_BEGIN_ALLOW_THREADS
        memset(scratch.buf.buf, 0, n * sizeof(uint32_t));
        done = totals_u32(total.buf, scratch.buf.buf, leaf.buf.buf, values.buf, leaf.n,
                          parent.buf.buf, n, u, g);
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(done);
    }
    PyBuffer_Release(&parent.buf);
values:
    PyBuffer_Release(&values);
leaf:
    PyBuffer_Release(&leaf.buf);
scratch:
    PyBuffer_Release(&scratch.buf);
total:
    PyBuffer_Release(&total);
    return result;
}

/* The rows of slot_sums: o[slot[leaf[i]]] += v[i], in 32 bits and units of
 * u (narrow) or in int64, saturating (wide, o64), up to the first row whose
 * leaf has no slot below n (beyond the slots, or -1), or (narrow) whose
 * value or sum does not fit; returns the rows done, with the sum of their
 * values' magnitudes (narrow: in units; saturating) in *size. Two reads
 * ahead: a row's slot, then, once it has come, its sum. */
static Py_ssize_t slot_rows(uint32_t *o, int64_t *o64, Py_ssize_t n, const uint32_t *leaf,
                            const int64_t *v, Py_ssize_t rows, const int32_t *slot,
                            Py_ssize_t m, Unit u, uint64_t *size)
{
    uint64_t got = 0;
    Py_ssize_t i = 0;
    for (; i < rows; i++) {
        if (i + 2 * AHEAD < rows && leaf[i + 2 * AHEAD] < (uint64_t)m)
            __builtin_prefetch(&slot[leaf[i + 2 * AHEAD]], 0, 3);
        if (i + AHEAD < rows && leaf[i + AHEAD] < (uint64_t)m) {
            int32_t ahead = slot[leaf[i + AHEAD]];
            if (ahead >= 0 && ahead < n) {
                if (o)
                    __builtin_prefetch(&o[ahead], 1, 3);
                else
                    __builtin_prefetch(&o64[ahead], 1, 3);
            }
        }
        if (leaf[i] >= (uint64_t)m)
            break;
        int32_t at = slot[leaf[i]];
        if (at < 0 || at >= n)
            break;
        uint64_t x = (uint64_t)v[i];
        if (o) {   /* (a negative value: past the limit) */
            uint64_t q = (x >> u.k) * u.inv;
            uint32_t r;
            if (((x & u.low) != 0) | (q > u.lim) | (q > UINT32_MAX)
                || __builtin_add_overflow(o[at], (uint32_t)q, &r))
                break;
            o[at] = r;
            got += q;   /* (below 2^32 a row: no overflow in 2^31 rows) */
        } else {
            o64[at] = sat_add(o64[at], v[i]);
            uint64_t mag = v[i] < 0 ? -x : x;
            got = got + mag < got ? UINT64_MAX : got + mag;
        }
    }
    *size = got;
    return i;
}

static PyObject *slot_sums(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *acc_o, *leaf_o, *values_o, *slot_o;
    long long g = 1;
    if (!PyArg_ParseTuple(args, "OOOO|L:slot_sums", &acc_o, &leaf_o, &values_o, &slot_o, &g))
        return NULL;
    if (bad_unit(g))
        return NULL;
    Ints acc, leaf, slot;
    Py_buffer values;
    PyObject *result = NULL;
    if (get_ints(acc_o, &acc, "sums"))
        return NULL;
    if (get_ints(leaf_o, &leaf, "leaves"))
        goto acc;
    if (get_int64(values_o, &values, 0, "values"))
        goto leaf;
    if (get_ints(slot_o, &slot, "slots"))
        goto values;
    if (acc.kind == 'i' || acc.buf.readonly)
        PyErr_SetString(PyExc_TypeError, "sums: writable uint32 or int64 items expected");
    else if (acc.kind == 'q' && g != 1)
        PyErr_Format(PyExc_ValueError, "unit %lld: int64 sums are in units of 1", g);
    else if (leaf.kind != 'I' || slot.kind != 'i')
        PyErr_SetString(PyExc_TypeError, "leaves: uint32 and slots: int32 items expected");
    else if (values.len / 8 != leaf.n)
        PyErr_Format(PyExc_ValueError, "%zd values for %zd leaves", values.len / 8, leaf.n);
    else {
        Py_ssize_t done;
        uint64_t size;
        uint32_t *o = acc.kind == 'I' ? acc.buf.buf : NULL;
        int64_t *o64 = acc.kind == 'q' ? acc.buf.buf : NULL;
        Unit u = unit_of((uint64_t)g);
        Py_BEGIN_ALLOW_THREADS
        done = slot_rows(o, o64, acc.n, leaf.buf.buf, values.buf, leaf.n, slot.buf.buf, slot.n,
                         u, &size);
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("(nK)", done, (unsigned long long)size);
    }
    PyBuffer_Release(&slot.buf);
values:
    PyBuffer_Release(&values);
leaf:
    PyBuffer_Release(&leaf.buf);
acc:
    PyBuffer_Release(&acc.buf);
    return result;
}

/* The roll-up of unit_roll_up: each node's total, its own sum in s and
 * its children's in c (zeroed), times g into t; c[parent] gains it. Its
 * parent checked as it is read (no pass of its own over 800,000): returns
 * -1 when done, -2 where a sum passes 2^32 - 1, or the first node (> 0)
 * whose parent is not an earlier node; t and c are then partly written. */
static Py_ssize_t roll_own(int64_t *t, const uint32_t *s, uint32_t *c, const int32_t *parent,
                           Py_ssize_t n, int64_t g)
{
    for (Py_ssize_t i = n - 1; i > 0; i--) {
        int32_t up = parent[i];
        if ((uint64_t)(uint32_t)up >= (uint64_t)i)
            return i;
        if (i > AHEAD && (uint64_t)(uint32_t)parent[i - AHEAD] < (uint64_t)n)
            __builtin_prefetch(&c[parent[i - AHEAD]], 1, 3);
        uint32_t x;
        if (__builtin_add_overflow(s[i], c[i], &x) || __builtin_add_overflow(c[up], x, &c[up]))
            return -2;
        t[i] = (int64_t)x * g;
    }
    if (n) {
        uint32_t x;
        if (__builtin_add_overflow(s[0], c[0], &x))
            return -2;
        t[0] = (int64_t)x * g;
    }
    return -1;
}

static PyObject *unit_roll_up(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *total_o, *own_o, *scratch_o, *parent_o;
    long long g;
    if (!PyArg_ParseTuple(args, "OOOOL:unit_roll_up", &total_o, &own_o, &scratch_o, &parent_o,
                          &g))
        return NULL;
    if (bad_unit(g))
        return NULL;
    Py_buffer total;
    Ints own, scratch, parent;
    PyObject *result = NULL;
    if (get_int64(total_o, &total, 1, "total"))
        return NULL;
    if (get_ints(own_o, &own, "own"))
        goto total;
    if (get_ints(scratch_o, &scratch, "scratch"))
        goto own;
    if (get_ints(parent_o, &parent, "parent"))
        goto scratch;
    Py_ssize_t n = total.len / 8;
    if (own.kind != 'I' || own.n != n)
        PyErr_Format(PyExc_ValueError, "own: %zd uint32 items expected", n);
    else if (scratch.kind != 'I' || scratch.buf.readonly || scratch.n != n)
        PyErr_Format(PyExc_ValueError, "scratch: %zd writable uint32 items expected", n);
    else if (parent.kind != 'i')
        PyErr_SetString(PyExc_TypeError, "parent: int32 items expected");
    else if (parent.n < n)
        PyErr_Format(PyExc_ValueError, "%zd parents for %zd totals", parent.n, n);
    else {
        Py_ssize_t done;
        Py_BEGIN_ALLOW_THREADS
        memset(scratch.buf.buf, 0, n * sizeof(uint32_t));
        done = roll_own(total.buf, own.buf.buf, scratch.buf.buf, parent.buf.buf, n, g);
        Py_END_ALLOW_THREADS
        if (done >= 0)
            PyErr_Format(PyExc_ValueError, "node %zd's parent (%lld) is not an earlier node",
                         done, (long long)((const int32_t *)parent.buf.buf)[done]);
        else
            result = PyBool_FromLong(done == -1);
    }
    PyBuffer_Release(&parent.buf);
scratch:
    PyBuffer_Release(&scratch.buf);
own:
    PyBuffer_Release(&own.buf);
total:
    PyBuffer_Release(&total);
    return result;
}

static PyMethodDef methods[] = {
    {"add_at", (PyCFunction)(void (*)(void))add_at, METH_VARARGS | METH_KEYWORDS,
     "add_at(out, index, values, seen=None) -> sum of |values|: out[index[i]] += values[i]."},
    {"sum_rows", (PyCFunction)sum_rows, METH_VARARGS,
     "sum_rows(sums, index, values, seen): sums[index[i]] += values[i]; seen marked."},
    {"sum_narrow", (PyCFunction)sum_narrow, METH_VARARGS,
     "sum_narrow(sums, index, values, seen, unit=1) -> rows summed: in units, 32 bits, while "
     "they fit."},
    {"present", (PyCFunction)present, METH_VARARGS,
     "present(first, seen, out=None, sums=None, unit=1) -> count: where first != 0 or seen."},
    {"unit_totals", (PyCFunction)unit_totals, METH_VARARGS,
     "unit_totals(total, scratch, leaves, values, parent, unit) -> done: a tree's totals."},
    {"slot_sums", (PyCFunction)slot_sums, METH_VARARGS,
     "slot_sums(sums, leaves, values, slots, unit=1) -> (rows done, size): sums[slots[leaf]] "
     "+= value."},
    {"unit_roll_up", (PyCFunction)unit_roll_up, METH_VARARGS,
     "unit_roll_up(total, own, scratch, parent, unit) -> done: totals from own sums in "
     "units."},
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
