/* A producer batch's records in C: the base of gms.record.builder.BatchBuilder.
 *
 * Both C parts of gms include this: gms.record._recordcheck defines the type (BatchCore), and the
 * producer's plain append (gms.client._append) writes records into it directly, with no attribute
 * lookups. A record is its first 12 bytes (total size, magic, CRC), its shape (envelope and
 * variable fields, shared by the batch's records of one topic, tag and body length) and its body,
 * copied back to back into one buffer of the batch: sealing it is one copy of contiguous memory.
 * (Kept as three objects per record and joined at the end, a batch's records lay scattered over
 * the heap when a producer filled a thousand topics' batches in turn: the join then missed the
 * cache at nearly every record.) A body of BATCH_CORE_LARGE_BODY bytes or more is not copied but
 * kept (`large`: where it goes in the buffer, and the body), and seal puts it in place: a copy of
 * a large body costs more than its cache misses save.
 */
#ifndef GMS_BATCH_CORE_H
#define GMS_BATCH_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "crc32.h"

#define BATCH_CORE_MAGIC_V1 0x474D5301u
#define BATCH_CORE_LARGE_BODY (64 * 1024)
#define BATCH_CORE_SHAPE_INLINE 128  /* a record header past its first 12 bytes (64), topic, tag and host */

typedef struct BatchCoreObject BatchCoreObject;
/* Gives batch's buffer room for need bytes: 0, or -1 with an exception set (gms.record._recordcheck
 * sets it, and keeps the buffers of batches that were freed for the next ones). */
typedef int (*batch_core_grow_fn)(BatchCoreObject *batch, Py_ssize_t need);

struct BatchCoreObject {
    PyObject_HEAD
    /* What a plain append reads and writes comes first, together: a producer spread over a
     * thousand topics visits each batch once a round, long after its lines left the cache, and
     * every further line an append touches is one more miss. */
    char closed;          /* set by the batch's owner: no record joins it any more */
    char *buf;            /* the records, back to back (PyMem), but for their large bodies */
    Py_ssize_t buf_len, buf_cap;
    Py_ssize_t sealed_len;  /* the records' bytes, large bodies included */
    Py_ssize_t count;     /* records */
    Py_ssize_t size_bytes;
    /* The shapes entry the last plain append used, and its key's topic and tag (compared by
     * identity: a producer mostly passes the same objects); strong references. Its record size,
     * shape CRC and shape are unpacked beside them (the shape copied in when it is short). */
    PyObject *last_topic, *last_tag, *last_entry;
    Py_ssize_t last_body_len, last_total, last_shape_len;
    uint32_t last_shape_crc;
    const char *last_shape;
    PyObject *outcome;    /* set by the batch's owner: what each appended record's future refers to */
    char last_shape_inline[BATCH_CORE_SHAPE_INLINE];
    PyObject *large;      /* list of (position in buf, body) of the large bodies, or NULL */
    PyObject *shapes;     /* dict: (topic, tag, body length) -> (shape, shape CRC, record size) */
    Py_ssize_t queue_id;
    long long born_ts_ms;
    batch_core_grow_fn grow;
};

static inline void batch_core_store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Appends one record of `total` bytes: its first 12 bytes (CRC = zlib.crc32(body, shape_crc)),
 * shape, body. 0, or -1 with an exception set (the batch then holds whole records only). */
static inline int batch_core_append(BatchCoreObject *batch, Py_ssize_t total, uint32_t shape_crc,
                                    const void *shape, Py_ssize_t shape_len, PyObject *body,
                                    const void *data, Py_ssize_t len) {
    int keep = len >= BATCH_CORE_LARGE_BODY;
    Py_ssize_t need = batch->buf_len + 12 + shape_len + (keep ? 0 : len);
    if (need > batch->buf_cap && batch->grow(batch, need) < 0) return -1;
    if (keep) {
        if (batch->large == NULL && (batch->large = PyList_New(0)) == NULL) return -1;
        PyObject *entry = Py_BuildValue("(nO)", need, body);
        int failed = entry == NULL || PyList_Append(batch->large, entry) < 0;
        Py_XDECREF(entry);
        if (failed) return -1;
    }
    uint8_t *p = (uint8_t *)batch->buf + batch->buf_len;
    batch_core_store_be32(p, (uint32_t)total);
    batch_core_store_be32(p + 4, BATCH_CORE_MAGIC_V1);
    batch_core_store_be32(p + 8, crc32_continue(shape_crc, data, (size_t)len));
    memcpy(p + 12, shape, (size_t)shape_len);
    if (!keep) memcpy(p + 12 + shape_len, data, (size_t)len);
    batch->buf_len = need;
    /* The next record's lines, now: its append comes a round of the producer's topics later,
     * when these lines can be in the cache instead of fetched on the write. */
    for (Py_ssize_t ahead = 0; ahead < 192 && need + ahead < batch->buf_cap; ahead += 64)
        __builtin_prefetch(batch->buf + need + ahead, 1, 2);
    batch->sealed_len += 12 + shape_len + len;
    batch->count += 1;
    batch->size_bytes += total;
    return 0;
}

#endif
