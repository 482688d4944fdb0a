/* Checks of many stored records in one call: the per-record loops of record.py in C.
 *
 * Python pays ~0.2-0.3 us to slice one record and call a CRC function on it, more than the CRC of
 * a 100-byte record costs. These loops walk, checksum and compare whole batches (a PULL answer,
 * an appended batch, a recovery chunk) with the GIL released. The record layout is record.py's;
 * LAYOUT below is compared with it at import. BatchCore is the producer's side: a batch's
 * records, appended one C call each (batch_core.h).
 *
 * CRC-32 is zlib's (crc32.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "batch_core.h"
#include "buffer_arena.h"
#include "crc32.h"
#include <structmember.h>

#define OFF_MAGIC 4
#define OFF_CRC 8
#define OFF_QUEUE_ID 12
#define OFF_QUEUE_OFFSET 16
#define OFF_PHYS_OFFSET 24
#define OFF_CRC_START 40
#define OFF_FLAGS 40
#define OFF_BODY_LEN 64
#define OFF_TOPIC_LEN 68 /* then tag_len, born_host_len, reserved (u8 each), keys_len, props_len (u16) */
#define OFF_KEYS_LEN 72
#define OFF_PROPS_LEN 74
#define FLAG_SEQUENCED 0x8
#define PROPS_BYTES_MAX 0xFFFF
#define HEADER_SIZE 76
#define MAGIC_V1 0x474D5301u
#define MIN_PREFIX 12 /* total_size, magic, crc: what the walk reads before trusting a length */

/* Batches smaller than this many bytes are checked without releasing the GIL (not worth it). */
#define RELEASE_GIL_BYTES 65536

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint32_t load_be16(const uint8_t *p) {
    return ((uint32_t)p[0] << 8) | p[1];
}

static inline uint64_t load_be64(const uint8_t *p) {
    return ((uint64_t)load_be32(p) << 32) | load_be32(p + 4);
}

/* The stored CRC of the record at p (size bytes, size >= OFF_CRC_START) holds. */
static inline int crc_holds(const uint8_t *p, int64_t size) {
    return crc32_of(p + OFF_CRC_START, (size_t)(size - OFF_CRC_START)) == load_be32(p + OFF_CRC);
}

/* A contiguous int64 buffer of n items (numpy int64 arrays), or -1 with an exception set. */
static Py_ssize_t get_int64s(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 8 || view->format == NULL || strchr("qlL", view->format[0]) == NULL
        || view->format[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int64 array", name);
        PyBuffer_Release(view);
        return -1;
    }
    return view->len / 8;
}

/* What check_stored finds in a record. */
enum { STORED_OK, STORED_DAMAGED, STORED_MISPLACED };

/* Records a tag filter picked lie apart: ask for the next ones' first bytes while checking one
 * (a cache miss per record otherwise, about what its CRC costs). */
#define PREFETCH_AHEAD 4

static void check_stored_records(const uint8_t *base, const int64_t *starts, const int64_t *sizes,
                                 const int64_t *offsets, Py_ssize_t n, int64_t base_offset, int32_t queue_id,
                                 const int64_t *queue_ids, uint8_t *found) {
    for (Py_ssize_t i = 0; i < n; i++) {
#if defined(__GNUC__)
        if (i + PREFETCH_AHEAD < n && sizes[i + PREFETCH_AHEAD] >= HEADER_SIZE) {
            const uint8_t *next = base + starts[i + PREFETCH_AHEAD];
            for (int64_t line = 0; line < sizes[i + PREFETCH_AHEAD] && line < 512; line += 64)
                __builtin_prefetch(next + line);
        }
#endif
        if (sizes[i] < HEADER_SIZE) {  /* an entry recovery found without its record */
            found[i] = STORED_DAMAGED;
            continue;
        }
        const uint8_t *p = base + starts[i];
        if (!crc_holds(p, sizes[i]))
            found[i] = STORED_DAMAGED;
        else if (offsets != NULL && ((int32_t)load_be32(p) != sizes[i] || load_be32(p + OFF_MAGIC) != MAGIC_V1
                 || (int32_t)load_be32(p + OFF_QUEUE_ID) != (queue_ids ? (int32_t)queue_ids[i] : queue_id)
                 || (int64_t)load_be64(p + OFF_QUEUE_OFFSET) != offsets[i]
                 || (int64_t)load_be64(p + OFF_PHYS_OFFSET) != base_offset + starts[i]))
            found[i] = STORED_MISPLACED;
        else
            found[i] = STORED_OK;
    }
}

/* The indexes i with found[i] == what, as a list. */
static PyObject *indexes_of(const uint8_t *found, Py_ssize_t n, uint8_t what) {
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        if (found[i] != what) continue;
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL || PyList_Append(out, index) < 0) Py_CLEAR(out);
        Py_XDECREF(index);
    }
    return out;
}

/* check_stored_records over Python buffers: starts and sizes, and queue_offsets unless it is
 * NULL (then only CRCs are checked); queue_ids_obj: NULL (every record's queue is queue_id) or
 * the queue id of each record. Returns the found flags (PyMem) and sets *n, or NULL. */
static uint8_t *check_buffers(Py_buffer *buf, PyObject *starts_obj, PyObject *sizes_obj, PyObject *offsets_obj,
                              int64_t base_offset, int32_t queue_id, PyObject *queue_ids_obj, Py_ssize_t *n_out) {
    Py_buffer starts_view, sizes_view, offsets_view = {0}, queue_ids_view = {0};
    uint8_t *found = NULL;
    Py_ssize_t n = get_int64s(starts_obj, &starts_view, "starts");
    if (n < 0) return NULL;
    Py_ssize_t n_sizes = get_int64s(sizes_obj, &sizes_view, "sizes");
    if (n_sizes < 0) goto release_starts;
    Py_ssize_t n_offsets = offsets_obj ? get_int64s(offsets_obj, &offsets_view, "queue_offsets") : n;
    if (n_offsets < 0) goto release_sizes;
    Py_ssize_t n_queue_ids = queue_ids_obj ? get_int64s(queue_ids_obj, &queue_ids_view, "queue_id") : n;
    if (n_queue_ids < 0) goto release_offsets;
    if (n_sizes != n || n_offsets != n || n_queue_ids != n) {
        PyErr_SetString(PyExc_ValueError, "starts, sizes, queue_offsets and queue ids differ in length");
        goto release_queue_ids;
    }
    const int64_t *starts = starts_view.buf, *sizes = sizes_view.buf;
    const int64_t *offsets = offsets_obj ? offsets_view.buf : NULL;
    const int64_t *queue_ids = queue_ids_obj ? queue_ids_view.buf : NULL;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (sizes[i] < HEADER_SIZE) continue;
        if (starts[i] < 0 || sizes[i] > (int64_t)buf->len - starts[i]) {
            PyErr_Format(PyExc_ValueError, "record %zd ([%lld, +%lld)) is not inside the %zd-byte buffer", i,
                         (long long)starts[i], (long long)sizes[i], buf->len);
            goto release_queue_ids;
        }
        total += sizes[i];
    }
    found = PyMem_Malloc(n ? (size_t)n : 1);
    if (found == NULL) {
        PyErr_NoMemory();
        goto release_queue_ids;
    }
    if (total >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        check_stored_records(buf->buf, starts, sizes, offsets, n, base_offset, queue_id, queue_ids, found);
        Py_END_ALLOW_THREADS
    } else {
        check_stored_records(buf->buf, starts, sizes, offsets, n, base_offset, queue_id, queue_ids, found);
    }
    *n_out = n;
release_queue_ids:
    if (queue_ids_obj) PyBuffer_Release(&queue_ids_view);
release_offsets:
    if (offsets_obj) PyBuffer_Release(&offsets_view);
release_sizes:
    PyBuffer_Release(&sizes_view);
release_starts:
    PyBuffer_Release(&starts_view);
    return found;
}

PyDoc_STRVAR(check_stored_doc,
"check_stored(buf, starts, sizes, base_offset, queue_id, queue_offsets) -> (damaged, misplaced)\n\n"
"Check the records at starts[i] of buf (a commitlog file at base_offset) against their index\n"
"entries (sizes[i], queue_offsets[i]) of one queue, queue_id, or (queue_id an array) of queue_id[i].\n"
"damaged lists the indexes whose CRC fails or\n"
"whose entry is a lost one (size below a header; nothing is read), misplaced those whose CRC\n"
"holds but whose length, magic or envelope (queue id, queue offset, commitlog offset) differ.\n"
"All arrays contiguous int64 of one length.");

static PyObject *check_stored(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *starts_obj, *sizes_obj, *offsets_obj, *queue_id_obj;
    long long base_offset;
    int queue_id = 0;
    if (!PyArg_ParseTuple(args, "OOOLOO:check_stored", &buf_obj, &starts_obj, &sizes_obj, &base_offset,
                          &queue_id_obj, &offsets_obj))
        return NULL;
    PyObject *queue_ids_obj = NULL;  /* a queue id per record */
    if (PyLong_Check(queue_id_obj)) {
        long value = PyLong_AsLong(queue_id_obj);
        if (value == -1 && PyErr_Occurred()) return NULL;
        if (value < INT32_MIN || value > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "queue_id does not fit an int32");
            return NULL;
        }
        queue_id = (int)value;
    } else {
        queue_ids_obj = queue_id_obj;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = 0;
    PyObject *result = NULL;
    uint8_t *found = check_buffers(&buf, starts_obj, sizes_obj, offsets_obj, base_offset, queue_id, queue_ids_obj,
                                   &n);
    if (found != NULL) {
        PyObject *damaged = indexes_of(found, n, STORED_DAMAGED);
        PyObject *misplaced = damaged ? indexes_of(found, n, STORED_MISPLACED) : NULL;
        if (misplaced != NULL) result = PyTuple_Pack(2, damaged, misplaced);
        Py_XDECREF(damaged);
        Py_XDECREF(misplaced);
        PyMem_Free(found);
    }
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(crc_mismatches_doc,
"crc_mismatches(buf, starts, sizes) -> list[int]\n\n"
"Indexes i of the records at starts[i] (sizes[i] bytes) of buf whose stored CRC does not match\n"
"their bytes (a size below a header's counts as a mismatch; nothing is read for it). starts and\n"
"sizes: contiguous int64 arrays of one length.");

static PyObject *crc_mismatches(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *starts_obj, *sizes_obj;
    if (!PyArg_ParseTuple(args, "OOO:crc_mismatches", &buf_obj, &starts_obj, &sizes_obj)) return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = 0;
    PyObject *result = NULL;
    uint8_t *found = check_buffers(&buf, starts_obj, sizes_obj, NULL, 0, 0, NULL, &n);
    if (found != NULL) {
        result = indexes_of(found, n, STORED_DAMAGED);
        PyMem_Free(found);
    }
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(walk_doc,
"walk(buf, pos, end, max_records, verify_crc) -> (starts: bytes, stop_pos, crc_failed)\n\n"
"Walk consecutive records of buf from pos while their length and magic are plausible (at least\n"
"a header, inside [pos, end)) and, if verify_crc, their CRC holds; at most max_records.\n"
"starts holds the positions of the records passed (native int64s), stop_pos is where the walk\n"
"stopped and crc_failed whether it stopped at a record whose CRC fails (any other stop the\n"
"caller examines).");

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *buf_obj;
    Py_ssize_t pos, end, max_records;
    int verify_crc;
    if (!PyArg_ParseTuple(args, "Onnnp:walk", &buf_obj, &pos, &end, &max_records, &verify_crc)) return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL, *starts = NULL;
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_Format(PyExc_ValueError, "[%zd, %zd) is not a range of the %zd-byte buffer", pos, end, buf.len);
        goto done;
    }
    const uint8_t *base = buf.buf;
    /* The walk runs without the GIL and notes the starts in C; then they become a list. */
    Py_ssize_t stop = pos, count = 0, capacity = 1024;
    int64_t *found = PyMem_RawMalloc(capacity * sizeof(int64_t));
    int crc_failed = 0, out_of_memory = 0;
    if (found == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    while (count < max_records && end - stop >= MIN_PREFIX) {
        const uint8_t *p = base + stop;
        int64_t size = (int32_t)load_be32(p);
        if (load_be32(p + OFF_MAGIC) != MAGIC_V1 || size < HEADER_SIZE || size > end - stop) break;
        if (verify_crc && !crc_holds(p, size)) {
            crc_failed = 1;
            break;
        }
        if (count == capacity) {
            int64_t *grown = PyMem_RawRealloc(found, 2 * capacity * sizeof(int64_t));
            if (grown == NULL) {
                out_of_memory = 1;
                break;
            }
            found = grown;
            capacity *= 2;
        }
        found[count++] = stop;
        stop += size;
    }
    Py_END_ALLOW_THREADS
    if (out_of_memory) {
        PyMem_RawFree(found);
        PyErr_NoMemory();
        goto done;
    }
    starts = PyBytes_FromStringAndSize((const char *)found, count * (Py_ssize_t)sizeof(int64_t));
    PyMem_RawFree(found);
    if (starts == NULL) goto done;
    result = Py_BuildValue("(OnO)", starts, stop, crc_failed ? Py_True : Py_False);
done:
    Py_XDECREF(starts);
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(read_headers_doc,
"read_headers(buf, starts, topic_len_max) -> (headers, first_bad, same_topic, same_tag, body_max)\n\n"
"The fixed headers of the records at starts (native int64s) of buf, copied one after the other\n"
"(a bytearray of gms.record.HEADER_DTYPE rows), and what a batch check needs of them in the same pass:\n"
"the index of the first record whose header is inconsistent (-1 if none: the record lies inside\n"
"buf, magic, body_len >= 0, 1 <= topic_len <= topic_len_max, reserved 0, the field lengths add up\n"
"to total_size; the CRC is not checked), whether every record carries the first one's topic\n"
"and tag bytes, and the shortest and longest body (0, 0 for no record). The headers of records\n"
"from the first bad one on are zeros.");

static PyObject *read_headers(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *starts_obj;
    int topic_len_max;
    if (!PyArg_ParseTuple(args, "OOi:read_headers", &buf_obj, &starts_obj, &topic_len_max)) return NULL;
    Py_buffer buf, starts_view;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = get_int64s(starts_obj, &starts_view, "starts");
    if (n < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *headers = PyByteArray_FromStringAndSize(NULL, n * HEADER_SIZE);
    if (headers == NULL) goto done;
    uint8_t *out = (uint8_t *)PyByteArray_AS_STRING(headers);
    const uint8_t *base = buf.buf, *first = NULL;
    const int64_t *starts = starts_view.buf;
    const int64_t len = buf.len;
    Py_ssize_t bad = -1;
    int same_topic = 1, same_tag = 1;
    int64_t body_max = n ? INT64_MIN : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t start = starts[i];
        if (start < 0 || start > len - HEADER_SIZE) {
            bad = i;
            break;
        }
        const uint8_t *p = base + start;
        memcpy(out + i * HEADER_SIZE, p, HEADER_SIZE);
        int64_t total = (int32_t)load_be32(p);
        int64_t body_len = (int32_t)load_be32(p + OFF_BODY_LEN);
        uint32_t topic_len = p[OFF_TOPIC_LEN], tag_len = p[OFF_TOPIC_LEN + 1];
        int64_t expected = HEADER_SIZE + (int64_t)topic_len + tag_len + p[OFF_TOPIC_LEN + 2]
                           + load_be16(p + OFF_KEYS_LEN) + load_be16(p + OFF_KEYS_LEN + 2) + body_len;
        if (load_be32(p + OFF_MAGIC) != MAGIC_V1 || body_len < 0 || topic_len < 1
                || topic_len > (uint32_t)topic_len_max || p[OFF_TOPIC_LEN + 3] != 0 || expected != total
                || total > len - start) {
            bad = i;
            break;
        }
        if (body_len > body_max) body_max = body_len;
        if (first == NULL) {
            first = p;
            continue;
        }
        uint32_t first_topic_len = first[OFF_TOPIC_LEN];
        if (same_topic && (topic_len != first_topic_len || memcmp(p + HEADER_SIZE, first + HEADER_SIZE, topic_len)))
            same_topic = 0;
        if (same_tag && (tag_len != first[OFF_TOPIC_LEN + 1]
                         || memcmp(p + HEADER_SIZE + topic_len, first + HEADER_SIZE + first_topic_len, tag_len)))
            same_tag = 0;
    }
    if (bad >= 0)
        memset(out + bad * HEADER_SIZE, 0, (size_t)(n - bad) * HEADER_SIZE);
    result = Py_BuildValue("(OnNNL)", headers, bad, PyBool_FromLong(same_topic), PyBool_FromLong(same_tag),
                           (long long)body_max);
done:
    Py_XDECREF(headers);
    PyBuffer_Release(&starts_view);
    PyBuffer_Release(&buf);
    return result;
}

PyDoc_STRVAR(gather_doc,
"gather(src, starts, sizes, dst, at) -> None\n\n"
"Copy src[starts[i]:starts[i] + sizes[i]] to dst[at[i]:at[i] + sizes[i]] for every i (records\n"
"lying apart, copied back to back: cheaper than an object per record). dst: a writable buffer.");

static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *src_obj, *starts_obj, *sizes_obj, *dst_obj, *at_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:gather", &src_obj, &starts_obj, &sizes_obj, &dst_obj, &at_obj)) return NULL;
    Py_buffer src, dst, starts_view, sizes_view, at_view;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE) < 0) goto release_src;
    Py_ssize_t n = get_int64s(starts_obj, &starts_view, "starts");
    if (n < 0) goto release_dst;
    if (get_int64s(sizes_obj, &sizes_view, "sizes") != n) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "starts and sizes differ in length");
            PyBuffer_Release(&sizes_view);
        }
        goto release_starts;
    }
    if (get_int64s(at_obj, &at_view, "at") != n) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "starts and at differ in length");
            PyBuffer_Release(&at_view);
        }
        goto release_sizes;
    }
    const int64_t *starts = starts_view.buf, *sizes = sizes_view.buf, *at = at_view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (starts[i] < 0 || sizes[i] < 0 || sizes[i] > (int64_t)src.len - starts[i] || at[i] < 0
            || sizes[i] > (int64_t)dst.len - at[i]) {
            PyErr_Format(PyExc_ValueError, "piece %zd ([%lld, +%lld) to %lld) is outside its buffers", i,
                         (long long)starts[i], (long long)sizes[i], (long long)at[i]);
            goto release_at;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        memcpy((uint8_t *)dst.buf + at[i], (const uint8_t *)src.buf + starts[i], (size_t)sizes[i]);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
release_at:
    PyBuffer_Release(&at_view);
release_sizes:
    PyBuffer_Release(&sizes_view);
release_starts:
    PyBuffer_Release(&starts_view);
release_dst:
    PyBuffer_Release(&dst);
release_src:
    PyBuffer_Release(&src);
    return result;
}

PyDoc_STRVAR(group_rows_doc,
"group_rows(buf, starts, lengths) -> (list[bytes], bytearray)\n\n"
"The distinct byte strings among the rows, in the order they first appear, and each row's index\n"
"among them (native int64s); row i is buf[starts[i]:starts[i] + lengths[i]]. A row is compared\n"
"with the one before it first: a send of a thousand topics holds each queue's batch in a run of\n"
"equal rows, and only the first row of a run is looked up. ValueError for a row outside buf.");

/* Appends the row at p (len bytes) to distinct unless seen holds it: its index, or -1 with an
 * exception set. */
static Py_ssize_t distinct_row(PyObject *distinct, PyObject *seen, const uint8_t *p, int64_t len) {
    PyObject *row = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)len);
    if (row == NULL) return -1;
    Py_ssize_t at = -1;
    PyObject *found = PyDict_GetItemWithError(seen, row);
    if (found != NULL) {
        at = PyLong_AsSsize_t(found);
    } else if (!PyErr_Occurred()) {
        PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(distinct));
        if (index != NULL && PyDict_SetItem(seen, row, index) == 0 && PyList_Append(distinct, row) == 0)
            at = PyList_GET_SIZE(distinct) - 1;
        Py_XDECREF(index);
    }
    Py_DECREF(row);
    return at;
}

static PyObject *group_rows(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *starts_obj, *lengths_obj;
    if (!PyArg_ParseTuple(args, "OOO:group_rows", &buf_obj, &starts_obj, &lengths_obj)) return NULL;
    Py_buffer buf, starts_view, lengths_view;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = get_int64s(starts_obj, &starts_view, "starts");
    if (n < 0) goto release_buf;
    if (get_int64s(lengths_obj, &lengths_view, "lengths") != n) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "starts and lengths differ in length");
            PyBuffer_Release(&lengths_view);
        }
        goto release_starts;
    }
    const int64_t *starts = starts_view.buf, *lengths = lengths_view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (starts[i] < 0 || lengths[i] < 0 || lengths[i] > (int64_t)buf.len - starts[i]) {
            PyErr_Format(PyExc_ValueError, "row %zd ([%lld, +%lld)) is outside the buffer", i,
                         (long long)starts[i], (long long)lengths[i]);
            goto release_lengths;
        }
    }
    PyObject *distinct = PyList_New(0), *seen = PyDict_New();
    PyObject *index_obj = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (distinct == NULL || seen == NULL || index_obj == NULL) goto release_groups;
    int64_t *index = (int64_t *)PyByteArray_AS_STRING(index_obj);
    const uint8_t *base = buf.buf;
    Py_ssize_t current = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == 0 || lengths[i] != lengths[i - 1]
            || memcmp(base + starts[i], base + starts[i - 1], (size_t)lengths[i]) != 0) {
            current = distinct_row(distinct, seen, base + starts[i], lengths[i]);
            if (current < 0) goto release_groups;
        }
        index[i] = current;
    }
    out = PyTuple_Pack(2, distinct, index_obj);
release_groups:
    Py_XDECREF(distinct);
    Py_XDECREF(seen);
    Py_XDECREF(index_obj);
release_lengths:
    PyBuffer_Release(&lengths_view);
release_starts:
    PyBuffer_Release(&starts_view);
release_buf:
    PyBuffer_Release(&buf);
    return out;
}

PyDoc_STRVAR(read_stamps_doc,
"read_stamps(buf, ends, name) -> list[tuple[int, int, int, int]] | None\n\n"
"The producer sequences (producer id, epoch, sequence, count) whose stamps end at ends (int64):\n"
"name, four lowercase fixed-width hex numbers of 16, 8, 16 and 8 digits joined by dots, then the\n"
"byte 2. None if any stamp is not exactly that, or out of range (a count below 1, a producer id\n"
"past 2**63 - 1, an epoch past 2**31 - 1).");

#define STAMP_VALUE_BYTES 51  /* 16 . 8 . 16 . 8 */

/* The fixed-width lowercase hex number at p (digits of them): 0 if one is not such a digit. */
static int parse_hex(const uint8_t *p, int digits, uint64_t *value) {
    uint64_t v = 0;
    for (int i = 0; i < digits; i++) {
        uint8_t c = p[i];
        if (c >= '0' && c <= '9') v = v << 4 | (uint64_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v = v << 4 | (uint64_t)(c - 'a' + 10);
        else return 0;
    }
    *value = v;
    return 1;
}

/* The stamp at p (STAMP_VALUE_BYTES of value, then 2) as a tuple; NULL without an exception if
 * it is malformed or out of range. */
static PyObject *stamp_at(const uint8_t *p) {
    static const int widths[4] = {16, 8, 16, 8};
    uint64_t fields[4];
    for (int f = 0, at = 0; f < 4; at += widths[f] + 1, f++) {
        if (!parse_hex(p + at, widths[f], &fields[f]) || (f < 3 && p[at + widths[f]] != '.')) return NULL;
    }
    if (p[STAMP_VALUE_BYTES] != 2 || fields[3] < 1 || fields[0] >> 63 || fields[1] >> 31) return NULL;
    return Py_BuildValue("(KKKK)", (unsigned long long)fields[0], (unsigned long long)fields[1],
                         (unsigned long long)fields[2], (unsigned long long)fields[3]);
}

static PyObject *read_stamps(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *ends_obj;
    const char *name;
    Py_ssize_t name_len;
    if (!PyArg_ParseTuple(args, "OOy#:read_stamps", &buf_obj, &ends_obj, &name, &name_len)) return NULL;
    Py_buffer buf, ends_view;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = get_int64s(ends_obj, &ends_view, "ends");
    PyObject *out = NULL;
    if (n < 0) goto release_buf;
    const int64_t *ends = ends_view.buf;
    const int64_t stamp_bytes = name_len + STAMP_VALUE_BYTES + 1;
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *stamp = NULL;
        if (ends[i] >= stamp_bytes && ends[i] <= (int64_t)buf.len) {
            const uint8_t *p = (const uint8_t *)buf.buf + ends[i] - stamp_bytes;
            if (memcmp(p, name, (size_t)name_len) == 0) stamp = stamp_at(p + name_len);
        }
        if (stamp == NULL) {
            Py_SETREF(out, PyErr_Occurred() ? NULL : Py_NewRef(Py_None));
            break;
        }
        PyList_SET_ITEM(out, i, stamp);
    }
    PyBuffer_Release(&ends_view);
release_buf:
    PyBuffer_Release(&buf);
    return out;
}

PyDoc_STRVAR(slices_doc,
"slices(view, starts, sizes) -> list[memoryview]\n\n"
"view[starts[i]:starts[i] + sizes[i]] for every i (zero-copy records of a mapped file).");

static PyObject *slices(PyObject *self, PyObject *args) {
    PyObject *view, *starts_obj, *sizes_obj;
    if (!PyArg_ParseTuple(args, "O!OO:slices", &PyMemoryView_Type, &view, &starts_obj, &sizes_obj)) return NULL;
    Py_buffer starts_view, sizes_view;
    Py_ssize_t n = get_int64s(starts_obj, &starts_view, "starts");
    if (n < 0) return NULL;
    PyObject *out = NULL;
    if (get_int64s(sizes_obj, &sizes_view, "sizes") != n) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "starts and sizes differ in length");
            PyBuffer_Release(&sizes_view);
        }
        PyBuffer_Release(&starts_view);
        return NULL;
    }
    const int64_t *starts = starts_view.buf, *sizes = sizes_view.buf;
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *lo = PyLong_FromLongLong(starts[i]), *hi = PyLong_FromLongLong(starts[i] + sizes[i]);
        PyObject *range = (lo && hi) ? PySlice_New(lo, hi, NULL) : NULL;
        PyObject *item = range ? PyObject_GetItem(view, range) : NULL;
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        Py_XDECREF(range);
        if (item == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, item);
    }
    PyBuffer_Release(&sizes_view);
    PyBuffer_Release(&starts_view);
    return out;
}

PyDoc_STRVAR(pick_tags_doc,
"pick_tags(entries, itemsize, hash_at, wanted, max_picks) -> (picked: bytes, scanned)\n\n"
"The indexes (native int64s) of the index entries (itemsize bytes each, one after the other in\n"
"entries) whose big-endian int64 tag hash at byte hash_at is one of wanted (contiguous int64s),\n"
"in order, at most max_picks; scanned is how many entries were looked at (all of them unless\n"
"max_picks were found first: then one past the last picked).");

static int compare_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Up to this many wanted hashes are compared one by one; more are searched in a sorted copy. */
#define PICK_LINEAR_MAX 8

static PyObject *pick_tags(PyObject *self, PyObject *args) {
    PyObject *entries_obj, *wanted_obj;
    Py_ssize_t itemsize, hash_at, max_picks;
    if (!PyArg_ParseTuple(args, "OnnOn:pick_tags", &entries_obj, &itemsize, &hash_at, &wanted_obj, &max_picks))
        return NULL;
    if (itemsize <= 0 || hash_at < 0 || hash_at > itemsize - 8 || max_picks < 0) {
        PyErr_SetString(PyExc_ValueError, "bad itemsize, hash_at or max_picks");
        return NULL;
    }
    Py_buffer entries, wanted_view;
    if (PyObject_GetBuffer(entries_obj, &entries, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_wanted = get_int64s(wanted_obj, &wanted_view, "wanted");
    if (n_wanted < 0) goto release_entries;
    if (entries.len % itemsize) {
        PyErr_SetString(PyExc_ValueError, "entries is not a whole number of items");
        goto release_wanted;
    }
    Py_ssize_t n = entries.len / itemsize;
    int64_t *wanted = PyMem_Malloc((size_t)(n_wanted ? n_wanted : 1) * sizeof(int64_t));
    int64_t *picked = PyMem_Malloc((size_t)(max_picks < n ? max_picks : n ? n : 1) * sizeof(int64_t));
    if (wanted == NULL || picked == NULL) {
        PyErr_NoMemory();
        goto free_arrays;
    }
    memcpy(wanted, wanted_view.buf, (size_t)n_wanted * sizeof(int64_t));
    qsort(wanted, (size_t)n_wanted, sizeof(int64_t), compare_int64);
    const uint8_t *at = (const uint8_t *)entries.buf + hash_at;
    Py_ssize_t count = 0, scanned = 0;
    for (; scanned < n && count < max_picks; scanned++, at += itemsize) {
        int64_t hash = (int64_t)load_be64(at);
        int found = 0;
        if (n_wanted <= PICK_LINEAR_MAX) {
            for (Py_ssize_t k = 0; k < n_wanted && !found; k++) found = wanted[k] == hash;
        } else {
            found = bsearch(&hash, wanted, (size_t)n_wanted, sizeof(int64_t), compare_int64) != NULL;
        }
        if (found) picked[count++] = scanned;
    }
    PyObject *indexes = PyBytes_FromStringAndSize((const char *)picked, count * (Py_ssize_t)sizeof(int64_t));
    if (indexes != NULL) {
        result = Py_BuildValue("(On)", indexes, scanned);
        Py_DECREF(indexes);
    }
free_arrays:
    PyMem_Free(wanted);
    PyMem_Free(picked);
release_wanted:
    PyBuffer_Release(&wanted_view);
release_entries:
    PyBuffer_Release(&entries);
    return result;
}

PyDoc_STRVAR(property_values_doc,
"property_values(buf, at, lengths, names) -> list[list[str | None]]\n\n"
"For each name of names (bytes), the value of that property in the properties field of every\n"
"record (lengths[i] bytes at at[i] of buf, the encoding of record.py: name \\x01 value \\x02 ...),\n"
"decoded as utf-8 with errors replaced; None where a record lacks it. A value runs to its\n"
"property's \\x02 (an unterminated last property is no property); of a name given twice the\n"
"last value counts. at and lengths: contiguous int64 arrays of one length, inside buf.");

#define PROP_NAME_VALUE_SEPARATOR 0x01
#define PROP_SEPARATOR 0x02

static PyObject *property_values(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *at_obj, *lengths_obj, *names_obj;
    if (!PyArg_ParseTuple(args, "OOOO!:property_values", &buf_obj, &at_obj, &lengths_obj, &PyTuple_Type, &names_obj))
        return NULL;
    Py_ssize_t n_names = PyTuple_GET_SIZE(names_obj);
    for (Py_ssize_t k = 0; k < n_names; k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(names_obj, k))) {
            PyErr_SetString(PyExc_TypeError, "names must be a tuple of bytes");
            return NULL;
        }
    }
    Py_buffer buf, at_view, lengths_view;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = get_int64s(at_obj, &at_view, "at");
    if (n < 0) goto release_buf;
    Py_ssize_t n_lengths = get_int64s(lengths_obj, &lengths_view, "lengths");
    if (n_lengths < 0) goto release_at;
    const int64_t *at = at_view.buf, *lengths = lengths_view.buf;
    if (n_lengths != n) {
        PyErr_SetString(PyExc_ValueError, "at and lengths differ in length");
        goto release_lengths;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (at[i] < 0 || lengths[i] < 0 || lengths[i] > (int64_t)buf.len - at[i]) {
            PyErr_Format(PyExc_ValueError, "properties %zd ([%lld, +%lld)) are not inside the %zd-byte buffer", i,
                         (long long)at[i], (long long)lengths[i], buf.len);
            goto release_lengths;
        }
    }
    out = PyList_New(n_names);
    for (Py_ssize_t k = 0; out != NULL && k < n_names; k++) {
        PyObject *column = PyList_New(n);
        if (column == NULL) {
            Py_CLEAR(out);
            break;
        }
        for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(column, i, Py_NewRef(Py_None));
        PyList_SET_ITEM(out, k, column);
    }
    const uint8_t *base = buf.buf;
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        const uint8_t *p = base + at[i], *end = p + lengths[i];
        while (p < end) {
            const uint8_t *stop = memchr(p, PROP_SEPARATOR, (size_t)(end - p));
            if (stop == NULL) break;  /* unterminated: no property */
            const uint8_t *sep = memchr(p, PROP_NAME_VALUE_SEPARATOR, (size_t)(stop - p));
            if (sep != NULL) {
                size_t name_len = (size_t)(sep - p);
                for (Py_ssize_t k = 0; k < n_names; k++) {
                    PyObject *name = PyTuple_GET_ITEM(names_obj, k);
                    if ((size_t)PyBytes_GET_SIZE(name) != name_len || memcmp(PyBytes_AS_STRING(name), p, name_len))
                        continue;
                    PyObject *value = PyUnicode_DecodeUTF8((const char *)sep + 1, stop - sep - 1, "replace");
                    if (value == NULL) {
                        Py_CLEAR(out);
                        break;
                    }
                    PyList_SetItem(PyList_GET_ITEM(out, k), i, value);  /* drops the None or earlier value */
                }
                if (out == NULL) break;
            }
            p = stop + 1;
        }
    }
release_lengths:
    PyBuffer_Release(&lengths_view);
release_at:
    PyBuffer_Release(&at_view);
release_buf:
    PyBuffer_Release(&buf);
    return out;
}

PyDoc_STRVAR(crc32_doc, "crc32(data) -> int\n\nzlib's CRC-32 of data (the kernel the batch checks use).");

static PyObject *crc32(PyObject *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t crc = crc32_of(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* --- BatchCore: the C base of gms.record.builder.BatchBuilder ------------------------------- */

static PyObject *time_ns;  /* time.time_ns: a batch's born timestamp, as Python's clock reads it */

/* batch_core_grow_fn: the buffer's size doubled until need fits (buffer_arena.h). */
static int batch_core_grow(BatchCoreObject *batch, Py_ssize_t need) {
    Py_ssize_t cap = batch->buf_cap ? batch->buf_cap : 256;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    if (buffer_grow(&batch->buf, batch->buf_len, &batch->buf_cap, cap) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *batch_core_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Py_ssize_t queue_id;
    static char *names[] = {"queue_id", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", names, &queue_id)) return NULL;
    PyObject *now = PyObject_CallNoArgs(time_ns);
    if (now == NULL) return NULL;
    long long born_ts_ms = PyLong_AsLongLong(now);
    Py_DECREF(now);
    if (born_ts_ms == -1 && PyErr_Occurred()) return NULL;
    BatchCoreObject *self = (BatchCoreObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->shapes = PyDict_New();
    if (self->shapes == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->queue_id = queue_id;
    self->born_ts_ms = born_ts_ms / 1000000;
    self->grow = batch_core_grow;
    return (PyObject *)self;
}

static int batch_core_traverse(BatchCoreObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->shapes);
    Py_VISIT(self->large);
    Py_VISIT(self->last_topic);
    Py_VISIT(self->last_tag);
    Py_VISIT(self->last_entry);
    Py_VISIT(self->outcome);
    return 0;
}

static int batch_core_clear(BatchCoreObject *self) {
    Py_CLEAR(self->shapes);
    Py_CLEAR(self->large);
    Py_CLEAR(self->last_topic);
    Py_CLEAR(self->last_tag);
    Py_CLEAR(self->last_entry);
    Py_CLEAR(self->outcome);
    return 0;
}

static void batch_core_dealloc(BatchCoreObject *self) {
    PyObject_GC_UnTrack(self);
    batch_core_clear(self);
    if (self->buf != NULL) buffer_free(self->buf, self->buf_cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(batch_core_add_doc,
"add(total_size, shape_crc, shape, body) -> None\n\n"
"Append one record: its first 12 bytes (total size, magic, CRC = zlib.crc32(body, shape_crc)),\n"
"then shape and body (copied, but for a large one, kept); count and size_bytes grow with it.");

static PyObject *batch_core_add(BatchCoreObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "add takes exactly 4 arguments");
        return NULL;
    }
    Py_ssize_t total = PyLong_AsSsize_t(args[0]);
    if (total == -1 && PyErr_Occurred()) return NULL;
    unsigned long shape_crc = PyLong_AsUnsignedLong(args[1]);
    if (shape_crc == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (total < 0 || total > INT32_MAX || shape_crc > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "total_size or shape_crc out of range");
        return NULL;
    }
    Py_buffer shape, data;
    if (PyObject_GetBuffer(args[2], &shape, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&shape);
        return NULL;
    }
    int failed = batch_core_append(self, total, (uint32_t)shape_crc, shape.buf, shape.len, args[3], data.buf,
                                   data.len);
    PyBuffer_Release(&data);
    PyBuffer_Release(&shape);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(batch_core_seal_doc,
"seal(start=0, stop=None, stamp=None) -> bytearray\n\n"
"The request body: the records back to back, each with its CRC; bytes [start, stop) of it (a\n"
"copy: the batch is unchanged). stamp: a producer sequence's property (name, value and\n"
"separator) put last in the first record's properties, as gms.record.sequence.stamp_sequence\n"
"would, in the same copy.");

/* Copies bytes [start, stop) of the sealed records (the buffer with the large bodies in place) to dst. */
static int batch_core_copy(BatchCoreObject *self, char *dst, Py_ssize_t start, Py_ssize_t stop) {
    Py_ssize_t buf_pos = 0, sealed_pos = 0, n = self->large == NULL ? 0 : PyList_GET_SIZE(self->large);
    for (Py_ssize_t i = 0; i <= n && sealed_pos < stop; i++) {
        /* a stretch of the buffer up to the next large body (or its end), then that body */
        Py_ssize_t at = i < n ? PyLong_AsSsize_t(PyTuple_GET_ITEM(PyList_GET_ITEM(self->large, i), 0)) : self->buf_len;
        Py_ssize_t lo = start > sealed_pos ? start - sealed_pos : 0, hi = at - buf_pos;
        if (sealed_pos + hi > stop) hi = stop - sealed_pos;
        if (hi > lo) {
            memcpy(dst, self->buf + buf_pos + lo, (size_t)(hi - lo));
            dst += hi - lo;
        }
        sealed_pos += at - buf_pos;
        buf_pos = at;
        if (i == n) break;
        Py_buffer body;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(PyList_GET_ITEM(self->large, i), 1), &body, PyBUF_SIMPLE) < 0)
            return -1;
        lo = start > sealed_pos ? start - sealed_pos : 0;
        hi = sealed_pos + body.len > stop ? stop - sealed_pos : body.len;
        if (hi > lo) {
            memcpy(dst, (char *)body.buf + lo, (size_t)(hi - lo));
            dst += hi - lo;
        }
        sealed_pos += body.len;
        PyBuffer_Release(&body);
    }
    return 0;
}

/* The sealed records [start, stop) with stamp inserted at the end of the first one's properties,
 * as its last property: its size, flags (FLAG_SEQUENCED), properties' length and CRC follow. One
 * copy of the records: inserting into a sealed body moves all of it. */
static PyObject *seal_stamped(BatchCoreObject *self, Py_ssize_t start, Py_ssize_t stop, const Py_buffer *stamp) {
    uint8_t head[HEADER_SIZE];
    if (stop - start < HEADER_SIZE || batch_core_copy(self, (char *)head, start, start + HEADER_SIZE) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "seal: no record to stamp");
        return NULL;
    }
    Py_ssize_t total = (int32_t)load_be32(head), props_len = load_be16(head + OFF_PROPS_LEN);
    uint32_t flags = load_be32(head + OFF_FLAGS);
    Py_ssize_t props_end = HEADER_SIZE + head[OFF_TOPIC_LEN] + head[OFF_TOPIC_LEN + 1] + head[OFF_TOPIC_LEN + 2]
                           + load_be16(head + OFF_KEYS_LEN) + props_len;
    if (flags & FLAG_SEQUENCED || props_end > total || total > stop - start) {
        PyErr_SetString(PyExc_ValueError, "seal: the first record is stamped already, or not whole");
        return NULL;
    }
    if (props_len + stamp->len > PROPS_BYTES_MAX) {
        PyErr_SetString(PyExc_ValueError, "the first record's properties leave no room for the producer sequence");
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, stop - start + stamp->len);
    if (out == NULL) return NULL;
    uint8_t *dst = (uint8_t *)PyByteArray_AS_STRING(out);
    if (batch_core_copy(self, (char *)dst, start, start + props_end) < 0
        || batch_core_copy(self, (char *)dst + props_end + stamp->len, start + props_end, stop) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    memcpy(dst + props_end, stamp->buf, (size_t)stamp->len);
    total += stamp->len;
    batch_core_store_be32(dst, (uint32_t)total);
    batch_core_store_be32(dst + OFF_FLAGS, flags | FLAG_SEQUENCED);
    dst[OFF_PROPS_LEN] = (uint8_t)((props_len + stamp->len) >> 8);
    dst[OFF_PROPS_LEN + 1] = (uint8_t)(props_len + stamp->len);
    batch_core_store_be32(dst + OFF_CRC, crc32_of(dst + OFF_CRC_START, (size_t)(total - OFF_CRC_START)));
    return out;
}

static PyObject *batch_core_seal(BatchCoreObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"start", "stop", "stamp", NULL};
    Py_ssize_t start = 0, stop = self->sealed_len;
    PyObject *stamp_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|nnO:seal", names, &start, &stop, &stamp_obj)) return NULL;
    if (start < 0 || stop > self->sealed_len || start > stop) {
        PyErr_SetString(PyExc_ValueError, "seal: 0 <= start <= stop <= the records' bytes");
        return NULL;
    }
    if (stamp_obj != Py_None) {
        Py_buffer stamp;
        if (PyObject_GetBuffer(stamp_obj, &stamp, PyBUF_SIMPLE) < 0) return NULL;
        PyObject *out = seal_stamped(self, start, stop, &stamp);
        PyBuffer_Release(&stamp);
        return out;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, stop - start);
    if (out == NULL) return NULL;
    if (batch_core_copy(self, PyByteArray_AS_STRING(out), start, stop) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

PyDoc_STRVAR(batch_core_record_ends_doc,
"record_ends() -> bytes\n\n"
"Where each record ends in the sealed body (native int64s), by the sizes their heads give.");

static PyObject *batch_core_record_ends(BatchCoreObject *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, self->count * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL) return NULL;
    int64_t *ends = (int64_t *)PyBytes_AS_STRING(out);
    Py_ssize_t pos = 0, sealed = 0, li = 0, n = self->large == NULL ? 0 : PyList_GET_SIZE(self->large);
    for (Py_ssize_t k = 0; k < self->count; k++) {
        const uint8_t *p = (const uint8_t *)self->buf + pos;
        Py_ssize_t total = (Py_ssize_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
        Py_ssize_t at = li < n ? PyLong_AsSsize_t(PyTuple_GET_ITEM(PyList_GET_ITEM(self->large, li), 0)) : -1;
        if (at >= 0 && at < pos + total) {  /* this record's body is a large one, kept: not in the buffer */
            pos = at;
            li++;
        } else {
            pos += total;
        }
        sealed += total;
        ends[k] = sealed;
    }
    return out;
}

PyDoc_STRVAR(batch_core_release_doc,
"release() -> None\n\n"
"Let the records go (the batch was answered): its buffer goes back to be reused by the next\n"
"batches; the batch takes no more records and seals to nothing. Its count, size and outcome stay:\n"
"the handles of its messages (which refer to the batch) read the outcome.");

static PyObject *batch_core_release(BatchCoreObject *self, PyObject *Py_UNUSED(ignored)) {
    self->closed = 1;
    if (self->buf != NULL) buffer_free(self->buf, self->buf_cap);
    self->buf = NULL;
    self->buf_len = self->buf_cap = self->sealed_len = 0;
    Py_CLEAR(self->large);
    Py_CLEAR(self->last_topic);
    Py_CLEAR(self->last_tag);
    Py_CLEAR(self->last_entry);
    self->last_shape = NULL;
    self->last_shape_len = 0;
    if (self->shapes != NULL) PyDict_Clear(self->shapes);
    Py_RETURN_NONE;
}

static PyMethodDef batch_core_methods[] = {
    {"release", (PyCFunction)batch_core_release, METH_NOARGS, batch_core_release_doc},
    {"add", (PyCFunction)(void (*)(void))batch_core_add, METH_FASTCALL, batch_core_add_doc},
    {"seal", (PyCFunction)(void (*)(void))batch_core_seal, METH_VARARGS | METH_KEYWORDS, batch_core_seal_doc},
    {"record_ends", (PyCFunction)batch_core_record_ends, METH_NOARGS, batch_core_record_ends_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef batch_core_members[] = {
    {"shapes", T_OBJECT, offsetof(BatchCoreObject, shapes), READONLY,
     "(topic, tag, body length) -> (shape, shape CRC, record size) of the batch's plain records."},
    {"count", T_PYSSIZET, offsetof(BatchCoreObject, count), READONLY, "Records in the batch."},
    {"size_bytes", T_PYSSIZET, offsetof(BatchCoreObject, size_bytes), READONLY, "Their bytes."},
    {"queue_id", T_PYSSIZET, offsetof(BatchCoreObject, queue_id), READONLY, "The queue they go to."},
    {"born_ts_ms", T_LONGLONG, offsetof(BatchCoreObject, born_ts_ms), READONLY,
     "When the batch was created (ms since the epoch): its records' born timestamp."},
    {"closed", T_BOOL, offsetof(BatchCoreObject, closed), 0,
     "Set by the batch's owner: no record joins it any more."},
    {"outcome", T_OBJECT, offsetof(BatchCoreObject, outcome), 0,
     "Set by the batch's owner: what the futures of the records appended in C refer to (None)."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BatchCore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gms.record._recordcheck.BatchCore",
    .tp_doc = PyDoc_STR("BatchCore(queue_id): a producer batch's records (see batch_core.h)."),
    .tp_basicsize = sizeof(BatchCoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = batch_core_new,
    .tp_dealloc = (destructor)batch_core_dealloc,
    .tp_traverse = (traverseproc)batch_core_traverse,
    .tp_clear = (inquiry)batch_core_clear,
    .tp_methods = batch_core_methods,
    .tp_members = batch_core_members,
};

static PyMethodDef methods[] = {
    {"check_stored", check_stored, METH_VARARGS, check_stored_doc},
    {"crc_mismatches", crc_mismatches, METH_VARARGS, crc_mismatches_doc},
    {"walk", walk, METH_VARARGS, walk_doc},
    {"read_headers", read_headers, METH_VARARGS, read_headers_doc},
    {"slices", slices, METH_VARARGS, slices_doc},
    {"group_rows", group_rows, METH_VARARGS, group_rows_doc},
    {"read_stamps", read_stamps, METH_VARARGS, read_stamps_doc},
    {"gather", gather, METH_VARARGS, gather_doc},
    {"pick_tags", pick_tags, METH_VARARGS, pick_tags_doc},
    {"property_values", property_values, METH_VARARGS, property_values_doc},
    {"crc32", crc32, METH_O, crc32_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gms.record._recordcheck",
    "Checks of many stored records in one call (record walk, CRC and envelope, views), and the\n"
    "producer's batch of records (BatchCore), in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__recordcheck(void) {
    crc32_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *layout = Py_BuildValue("(iiiiiiiiiiiikii)", OFF_MAGIC, OFF_CRC, OFF_QUEUE_ID, OFF_QUEUE_OFFSET,
                                     OFF_PHYS_OFFSET, OFF_CRC_START, OFF_BODY_LEN, OFF_TOPIC_LEN, OFF_KEYS_LEN,
                                     OFF_FLAGS, OFF_PROPS_LEN, HEADER_SIZE, (unsigned long)MAGIC_V1, FLAG_SEQUENCED,
                                     PROPS_BYTES_MAX);
    if (layout == NULL || PyModule_AddObject(m, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "KERNEL", crc32_kernel()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    time_ns = PyObject_GetAttrString(time, "time_ns");
    Py_DECREF(time);
    if (time_ns == NULL || PyType_Ready(&BatchCore_Type) < 0
        || PyModule_AddObjectRef(m, "BatchCore", (PyObject *)&BatchCore_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
