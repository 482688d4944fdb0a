/* A producer batch's records in C: the base of gms.record.builder.BatchBuilder.
 *
 * Both C parts of gms include this: gms.record._recordcheck defines the type (BatchCore), and the
 * producer's plain append (gms.client._append) writes records into it directly, with no attribute
 * lookups. A record is three buffers in `parts`: its first 12 bytes (total size, magic, CRC), its
 * shape (envelope and variable fields, shared by the batch's records of one topic, tag and body
 * length) and its body (not copied).
 */
#ifndef GMS_BATCH_CORE_H
#define GMS_BATCH_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "crc32.h"

#define BATCH_CORE_MAGIC_V1 0x474D5301u

typedef struct {
    PyObject_HEAD
    PyObject *parts;      /* list: 3 buffers per record */
    PyObject *shapes;     /* dict: (topic, tag, body length) -> (shape, shape CRC, record size) */
    Py_ssize_t count;     /* records */
    Py_ssize_t size_bytes;
    Py_ssize_t queue_id;
    long long born_ts_ms;
    char closed;          /* set by the batch's owner: no record joins it any more */
    /* The shapes entry the last plain append used, and its key's topic and tag (compared by
     * identity: a producer mostly passes the same objects). Strong references. */
    PyObject *last_topic, *last_tag, *last_entry;
    Py_ssize_t last_body_len;
} BatchCoreObject;

static inline void batch_core_store_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Appends one record of `total` bytes: its first 12 bytes (CRC = zlib.crc32(body, shape_crc)),
 * shape, body. 0, or -1 with an exception set (the batch then holds whole records only). */
static inline int batch_core_append(BatchCoreObject *batch, Py_ssize_t total, uint32_t shape_crc,
                                    PyObject *shape, PyObject *body, const void *data, Py_ssize_t len) {
    uint8_t head[12];
    batch_core_store_be32(head, (uint32_t)total);
    batch_core_store_be32(head + 4, BATCH_CORE_MAGIC_V1);
    batch_core_store_be32(head + 8, crc32_continue(shape_crc, data, (size_t)len));
    PyObject *first = PyBytes_FromStringAndSize((const char *)head, sizeof head);
    if (first == NULL) return -1;
    PyObject *parts = batch->parts;
    Py_ssize_t before = PyList_GET_SIZE(parts);
    int failed = PyList_Append(parts, first) < 0 || PyList_Append(parts, shape) < 0
                 || PyList_Append(parts, body) < 0;
    Py_DECREF(first);
    if (failed) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyList_SetSlice(parts, before, PyList_GET_SIZE(parts), NULL);
        PyErr_Restore(type, value, traceback);
        return -1;
    }
    batch->count += 1;
    batch->size_bytes += total;
    return 0;
}

#endif
