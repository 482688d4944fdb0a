/* Kafka records <-> gms records without a Python step per message (gms.broker.kafka.convert's
 * mapping; docs/kafka-compat.md, "The mapping" and "Performance").
 *
 * to_gms: the records of one Kafka batch (decompressed, its header and CRC checked by records.py)
 * as gms records. A record whose key and headers are ASCII (header names text, not the mapping's
 * own names nor gms.tag, none repeated) is mapped here; any other is handed to a Python function
 * (convert.to_gms, the mapping), after the whole batch has been read. Anything the reference decoder (records.decode_batch) would refuse,
 * or that this reader does not take (a varint beyond 64 bits, a timestamp beyond int64, a header
 * key not UTF-8), answers False before anything is written: the caller decodes that batch with
 * the reference, which raises its error (so the errors are the reference's, word for word).
 *
 * to_kafka: stored gms records (whole records, CRCs checked by the store) as the records of one
 * Kafka batch, their properties and tag as headers, written in one pass into a buffer the size of
 * the stored records; a record whose properties the mapping decodes from base64 (or that are not
 * as the encoder writes them) is handed to a Python function.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "crc32.h"

#define GMS_HEADER_SIZE 76
#define GMS_MAGIC_V1 0x474D5301u
#define GMS_KEYS_BYTES_MAX 0xFFFF
#define KAFKA_BATCH_HEADER_SIZE 61 /* left free at the start of to_kafka's answer */
#define VARINT_BYTES_MAX 10

static inline uint32_t get_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t get_be64(const uint8_t *p) { return ((uint64_t)get_be32(p) << 32) | get_be32(p + 4); }

static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void put_be64(uint8_t *p, uint64_t v) {
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* The zig-zag varint at *pos (reading no further than end): 0, or -1 when cut short, longer than
 * 10 bytes or beyond 64 bits. */
static int read_varint(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *pos, int64_t *out) {
    uint64_t raw = 0;
    Py_ssize_t p = *pos;
    for (int i = 0; i < VARINT_BYTES_MAX; i++) {
        if (p >= end) return -1;
        uint8_t byte = buf[p++];
        if (i == VARINT_BYTES_MAX - 1 && byte > 1) return -1;
        raw |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            *pos = p;
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    return -1;
}

static inline int zigzag_size(int64_t v) {
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (u >= 0x80) {
        u >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_zigzag(uint8_t *o, int64_t v) {
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (u >= 0x80) {
        *o++ = (uint8_t)(u | 0x80);
        u >>= 7;
    }
    *o++ = (uint8_t)u;
    return o;
}

/* Well-formed UTF-8 (what Python's strict decoder takes: no overlong form, no surrogate, nothing
 * past U+10FFFF). */
static int valid_utf8(const uint8_t *p, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i < len;) {
        uint8_t c = p[i], low = 0x80, high = 0xBF;
        int more;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c >= 0xE0 && c <= 0xEF) more = 2;
        else if (c >= 0xF0 && c <= 0xF4) more = 3;
        else return 0;
        if (c == 0xE0) low = 0xA0;
        if (c == 0xED) high = 0x9F;
        if (c == 0xF0) low = 0x90;
        if (c == 0xF4) high = 0x8F;
        if (len - i <= more || p[i + 1] < low || p[i + 1] > high) return 0;
        for (int k = 2; k <= more; k++)
            if ((p[i + k] & 0xC0) != 0x80) return 0;
        i += more + 1;
    }
    return 1;
}

/* --- to_gms ------------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t key_at, value_at, headers_at;
    int64_t key_len, value_len; /* < 0: null */
    int64_t timestamp, delta, header_count;
    int key_kind;          /* KEY_* */
    Py_ssize_t props_len;  /* of its gms record */
    PyObject *converted;   /* a record converted in Python (owned), else NULL */
    Py_ssize_t size;       /* its gms record's size */
} Fields;

/* A varint-prefixed field inside a record ending at stop: 0, or -1 (it runs past the record). */
static int read_varbytes(const uint8_t *buf, Py_ssize_t end, Py_ssize_t stop, Py_ssize_t *pos, Py_ssize_t *at,
                         int64_t *len) {
    if (read_varint(buf, end, pos, len)) return -1;
    *at = *pos;
    if (*len < 0) return 0;
    if (*len > stop - *pos) return -1;
    *pos += (Py_ssize_t)*len;
    return 0;
}

/* Header keys must be UTF-8 (the reference decodes them); -1 if one is not, or a field is bad. */
static int read_headers(const uint8_t *buf, Py_ssize_t end, Py_ssize_t stop, Py_ssize_t *pos, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        Py_ssize_t at;
        int64_t len;
        if (read_varbytes(buf, end, stop, pos, &at, &len) || len < 0 || !valid_utf8(buf + at, (Py_ssize_t)len))
            return -1;
        if (read_varbytes(buf, end, stop, pos, &at, &len)) return -1;
    }
    return 0;
}

/* Every record's fields, as the reference decoder reads them: 0, or -1 where it would refuse. */
static int read_records(const uint8_t *buf, Py_ssize_t n, Py_ssize_t count, int64_t base_ts, Fields *fields) {
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Fields *f = &fields[i];
        int64_t length, ts_delta;
        if (read_varint(buf, n, &pos, &length) || length < 0 || length > n - pos) return -1;
        Py_ssize_t stop = pos + (Py_ssize_t)length;
        pos += 1; /* the record's attributes, unused */
        if (read_varint(buf, n, &pos, &ts_delta) || read_varint(buf, n, &pos, &f->delta)) return -1;
        if (__builtin_add_overflow(base_ts, ts_delta, &f->timestamp)) return -1;
        if (read_varbytes(buf, n, stop, &pos, &f->key_at, &f->key_len)) return -1;
        if (read_varbytes(buf, n, stop, &pos, &f->value_at, &f->value_len)) return -1;
        if (read_varint(buf, n, &pos, &f->header_count)) return -1;
        f->headers_at = pos;
        if (read_headers(buf, n, stop, &pos, f->header_count) || pos != stop) return -1;
    }
    return pos == n ? 0 : -1;
}

/* convert.py's mapping of keys and headers, for the records it maps to ASCII text (any other
 * goes to Python): a key that is text without a space (or a property separator) is the gms key,
 * any other is kept in the property KEY_PROPERTY (base64); a header is the property of its name,
 * its value as text, or base64 under B64_PREFIX + name when it holds a property separator. */
#define HEADERS_IN_C_MAX 32
static const char KEY_PROPERTY[] = "__KAFKA_KEY";
static const char B64_PREFIX[] = "__KAFKA_B64.";
static const char TAG_HEADER[] = "gms.tag";
enum { KEY_NONE, KEY_GMS, KEY_BASE64 };

static int is_ascii(const uint8_t *p, int64_t len) {
    for (int64_t i = 0; i < len; i++)
        if (p[i] >= 0x80) return 0;
    return 1;
}

/* ASCII text without a property separator (\x01, \x02). */
static int is_text(const uint8_t *p, int64_t len) {
    for (int64_t i = 0; i < len; i++)
        if (p[i] >= 0x80 || p[i] == 0x01 || p[i] == 0x02) return 0;
    return 1;
}

static int starts_with(const uint8_t *p, int64_t len, const char *prefix) {
    size_t n = strlen(prefix);
    return (size_t)len >= n && memcmp(p, prefix, n) == 0;
}

static int is_name(const uint8_t *p, int64_t len, const char *name) {
    return (size_t)len == strlen(name) && memcmp(p, name, (size_t)len) == 0;
}

static inline Py_ssize_t base64_size(int64_t n) { return (Py_ssize_t)((n + 2) / 3 * 4); }

/* KEY_*, or -1 when Python maps the key (not ASCII, or a gms key past KEYS_BYTES_MAX). */
static int key_kind(const uint8_t *key, int64_t len) {
    if (len < 0) return KEY_NONE;
    if (!is_ascii(key, len)) return -1;
    if (len > 0 && is_text(key, len) && memchr(key, ' ', (size_t)len) == NULL)
        return len <= GMS_KEYS_BYTES_MAX ? KEY_GMS : -1;
    return KEY_BASE64;
}

/* The size of the gms properties of f's headers and key, or -1 when Python maps them (a header
 * name that is not ASCII text, empty, repeated or one of the mapping's own; a value not ASCII;
 * more than HEADERS_IN_C_MAX headers; properties past PROPS_BYTES_MAX). */
static Py_ssize_t props_size(const uint8_t *buf, Py_ssize_t n, const Fields *f) {
    Py_ssize_t size = 0, pos = f->headers_at, names_at[HEADERS_IN_C_MAX];
    int64_t names_len[HEADERS_IN_C_MAX];
    if (f->header_count > HEADERS_IN_C_MAX) return -1;
    for (int64_t i = 0; i < f->header_count; i++) {
        Py_ssize_t value_at;
        int64_t value_len;
        read_varbytes(buf, n, n, &pos, &names_at[i], &names_len[i]); /* read_records checked them */
        read_varbytes(buf, n, n, &pos, &value_at, &value_len);
        const uint8_t *name = buf + names_at[i], *value = buf + value_at;
        int64_t len = names_len[i];
        if (len == 0 || !is_text(name, len) || starts_with(name, len, B64_PREFIX) || is_name(name, len, KEY_PROPERTY) ||
            is_name(name, len, TAG_HEADER))
            return -1;
        for (int64_t j = 0; j < i; j++)
            if (names_len[j] == len && memcmp(buf + names_at[j], name, (size_t)len) == 0) return -1;
        value_len = value_len < 0 ? 0 : value_len;
        if (!is_ascii(value, value_len)) return -1;
        size += len + 2 + (is_text(value, value_len) ? value_len : (int64_t)strlen(B64_PREFIX) + base64_size(value_len));
    }
    if (f->key_kind == KEY_BASE64) size += (Py_ssize_t)strlen(KEY_PROPERTY) + 2 + base64_size(f->key_len);
    return size <= 0xFFFF ? size : -1;
}

static uint8_t *put_base64(uint8_t *o, const uint8_t *p, int64_t n) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (; n >= 3; n -= 3, p += 3) {
        uint32_t v = ((uint32_t)p[0] << 16) | ((uint32_t)p[1] << 8) | p[2];
        *o++ = (uint8_t)alphabet[v >> 18];
        *o++ = (uint8_t)alphabet[(v >> 12) & 63];
        *o++ = (uint8_t)alphabet[(v >> 6) & 63];
        *o++ = (uint8_t)alphabet[v & 63];
    }
    if (n > 0) {
        uint32_t v = ((uint32_t)p[0] << 16) | (n == 2 ? (uint32_t)p[1] << 8 : 0);
        *o++ = (uint8_t)alphabet[v >> 18];
        *o++ = (uint8_t)alphabet[(v >> 12) & 63];
        *o++ = n == 2 ? (uint8_t)alphabet[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    return o;
}

static uint8_t *put_raw(uint8_t *o, const void *p, size_t n) {
    memcpy(o, p, n);
    return o + n;
}

/* The properties props_size measured. */
static uint8_t *put_props(uint8_t *o, const uint8_t *buf, Py_ssize_t n, const Fields *f) {
    Py_ssize_t pos = f->headers_at;
    for (int64_t i = 0; i < f->header_count; i++) {
        Py_ssize_t name_at, value_at;
        int64_t name_len, value_len;
        read_varbytes(buf, n, n, &pos, &name_at, &name_len);
        read_varbytes(buf, n, n, &pos, &value_at, &value_len);
        value_len = value_len < 0 ? 0 : value_len;
        int text = is_text(buf + value_at, value_len);
        if (!text) o = put_raw(o, B64_PREFIX, strlen(B64_PREFIX));
        o = put_raw(o, buf + name_at, (size_t)name_len);
        *o++ = 0x01;
        o = text ? put_raw(o, buf + value_at, (size_t)value_len) : put_base64(o, buf + value_at, value_len);
        *o++ = 0x02;
    }
    if (f->key_kind == KEY_BASE64) {
        o = put_raw(o, KEY_PROPERTY, strlen(KEY_PROPERTY));
        *o++ = 0x01;
        o = put_base64(o, buf + f->key_at, f->key_len);
        *o++ = 0x02;
    }
    return o;
}

static PyObject *bytes_or_none(const uint8_t *buf, Py_ssize_t at, int64_t len) {
    if (len < 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)buf + at, (Py_ssize_t)len);
}

static PyObject *headers_list(const uint8_t *buf, Py_ssize_t n, Fields *f) {
    PyObject *list = PyList_New(0);
    Py_ssize_t pos = f->headers_at;
    for (int64_t i = 0; list != NULL && i < f->header_count; i++) {
        Py_ssize_t name_at, value_at;
        int64_t name_len, value_len;
        read_varbytes(buf, n, n, &pos, &name_at, &name_len); /* read_records checked them */
        read_varbytes(buf, n, n, &pos, &value_at, &value_len);
        PyObject *name = PyUnicode_DecodeUTF8((const char *)buf + name_at, (Py_ssize_t)name_len, "strict");
        PyObject *value = name == NULL ? NULL : bytes_or_none(buf, value_at, value_len);
        PyObject *pair = value == NULL ? NULL : PyTuple_Pack(2, name, value);
        Py_XDECREF(name);
        Py_XDECREF(value);
        if (pair == NULL || PyList_Append(list, pair)) Py_CLEAR(list);
        Py_XDECREF(pair);
    }
    return list;
}

/* The record convert (a Python function) makes of f: 0, or -1 with its exception set. */
static int convert_one(const uint8_t *buf, Py_ssize_t n, Fields *f, PyObject *convert) {
    PyObject *headers = headers_list(buf, n, f);
    PyObject *key = headers == NULL ? NULL : bytes_or_none(buf, f->key_at, f->key_len);
    PyObject *value = key == NULL ? NULL : bytes_or_none(buf, f->value_at, f->value_len);
    if (value != NULL)
        f->converted = PyObject_CallFunction(convert, "LLOOO", (long long)f->delta, (long long)f->timestamp, key,
                                             value, headers);
    Py_XDECREF(headers);
    Py_XDECREF(key);
    Py_XDECREF(value);
    if (f->converted == NULL) return -1;
    if (!PyBytes_Check(f->converted)) {
        PyErr_SetString(PyExc_TypeError, "convert must answer bytes");
        return -1;
    }
    f->size = PyBytes_GET_SIZE(f->converted);
    return 0;
}

typedef struct {
    const uint8_t *topic, *host;
    Py_ssize_t topic_len, host_len;
    int32_t queue_id;
} Target;

static void write_gms(uint8_t *o, const uint8_t *buf, Py_ssize_t n, const Fields *f, const Target *t) {
    Py_ssize_t keys_len = f->key_kind == KEY_GMS ? (Py_ssize_t)f->key_len : 0;
    Py_ssize_t body_len = f->value_len < 0 ? 0 : (Py_ssize_t)f->value_len;
    memset(o, 0, GMS_HEADER_SIZE);
    put_be32(o, (uint32_t)f->size);
    put_be32(o + 4, GMS_MAGIC_V1);
    put_be32(o + 12, (uint32_t)t->queue_id);
    put_be64(o + 44, (uint64_t)(f->timestamp ? f->timestamp : 1)); /* 0 would mean "now" */
    put_be32(o + 64, (uint32_t)body_len);
    o[68] = (uint8_t)t->topic_len;
    o[70] = (uint8_t)t->host_len;
    o[72] = (uint8_t)(keys_len >> 8);
    o[73] = (uint8_t)keys_len;
    o[74] = (uint8_t)(f->props_len >> 8);
    o[75] = (uint8_t)f->props_len;
    uint8_t *p = put_raw(o + GMS_HEADER_SIZE, t->topic, (size_t)t->topic_len);
    p = put_raw(p, t->host, (size_t)t->host_len);
    p = put_props(put_raw(p, buf + f->key_at, (size_t)keys_len), buf, n, f);
    memcpy(p, buf + f->value_at, (size_t)body_len);
    put_be32(o + 8, crc32_of(o + 40, (size_t)f->size - 40));
}

/* Appends the batch's records to chunks (bytearrays of at most limit bytes, but for a larger
 * record alone), the last one continued. */
static int write_chunks(const uint8_t *buf, Py_ssize_t n, Fields *fields, Py_ssize_t count, const Target *t, Py_ssize_t limit,
                        PyObject *chunks) {
    for (Py_ssize_t i = 0; i < count;) {
        Py_ssize_t last = PyList_GET_SIZE(chunks) - 1;
        PyObject *chunk = last >= 0 ? PyList_GET_ITEM(chunks, last) : NULL;
        Py_ssize_t used = chunk == NULL ? 0 : PyByteArray_GET_SIZE(chunk), size = used, j = i;
        if (chunk == NULL || used + fields[i].size > limit) {
            chunk = NULL;
            used = 0;
            size = fields[i].size;
            j = i + 1;
        }
        for (; j < count && size + fields[j].size <= limit; j++) size += fields[j].size;
        if (chunk == NULL) {
            chunk = PyByteArray_FromStringAndSize(NULL, size);
            if (chunk == NULL || PyList_Append(chunks, chunk)) {
                Py_XDECREF(chunk);
                return -1;
            }
            Py_DECREF(chunk);
        } else if (PyByteArray_Resize(chunk, size)) {
            return -1;
        }
        uint8_t *o = (uint8_t *)PyByteArray_AS_STRING(chunk) + used;
        for (; i < j; o += fields[i].size, i++) {
            if (fields[i].converted != NULL)
                memcpy(o, PyBytes_AS_STRING(fields[i].converted), (size_t)fields[i].size);
            else
                write_gms(o, buf, n, &fields[i], t);
        }
    }
    return 0;
}

static PyObject *to_gms(PyObject *module, PyObject *args) {
    Py_buffer raw, topic, host;
    Py_ssize_t count, limit;
    long long base_ts;
    int queue_id;
    PyObject *convert, *chunks;
    if (!PyArg_ParseTuple(args, "y*nLy*iy*nOO!:to_gms", &raw, &count, &base_ts, &topic, &queue_id, &host, &limit,
                          &convert, &PyList_Type, &chunks))
        return NULL;
    PyObject *answer = NULL;
    Fields *fields = NULL;
    const uint8_t *buf = raw.buf;
    Target target = {topic.buf, host.buf, topic.len, host.len, queue_id};
    if (count < 0 || count > raw.len || topic.len > 255 || host.len > 255) {
        PyErr_SetString(PyExc_ValueError, "bad record count, topic or host");
        goto done;
    }
    fields = PyMem_Calloc((size_t)count + 1, sizeof(Fields));
    if (fields == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_records(buf, raw.len, count, base_ts, fields)) {
        answer = Py_NewRef(Py_False);
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Fields *f = &fields[i];
        f->key_kind = key_kind(buf + f->key_at, f->key_len);
        /* a null value (a tombstone) and keys C does not take are mapped in Python */
        f->props_len = f->key_kind < 0 || f->value_len < 0 ? -1 : props_size(buf, raw.len, f);
        if (f->props_len >= 0) {
            f->size = GMS_HEADER_SIZE + topic.len + host.len + (f->key_kind == KEY_GMS ? f->key_len : 0) +
                      f->props_len + (f->value_len < 0 ? 0 : f->value_len);
        } else if (convert_one(buf, raw.len, f, convert)) {
            goto done;
        }
    }
    if (write_chunks(buf, raw.len, fields, count, &target, limit, chunks) == 0) answer = Py_NewRef(Py_True);
done:
    if (fields != NULL) {
        for (Py_ssize_t i = 0; i < count; i++) Py_XDECREF(fields[i].converted);
        PyMem_Free(fields);
    }
    PyBuffer_Release(&raw);
    PyBuffer_Release(&topic);
    PyBuffer_Release(&host);
    return answer;
}

/* --- to_kafka ----------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t count; /* records */
    int64_t first_offset, last_offset, min_ts, max_ts;
} Stats;

/* The idempotent producer's stamp (gms.record.layout.SEQUENCE_PROPERTY): a property the decoder
 * drops. */
static const char SEQUENCE_PROPERTY[] = "__PRODUCER_SEQ";
/* A tombstone's mark (gms.record.layout.TOMBSTONE_PROPERTY): answered as a null value, in Python. */
static const char TOMBSTONE_PROPERTY[] = "__TOMBSTONE";
#define STORED_PROPS_IN_C_MAX 32

typedef struct {
    const uint8_t *key, *props, *tag, *body;
    Py_ssize_t keys_len, props_len, tag_len, body_len;
} Stored;

static Stored stored_fields(const uint8_t *r) {
    Stored f;
    f.tag_len = r[69];
    f.keys_len = ((Py_ssize_t)r[72] << 8) | r[73];
    f.props_len = ((Py_ssize_t)r[74] << 8) | r[75];
    f.body_len = (Py_ssize_t)get_be32(r + 64);
    f.tag = r + GMS_HEADER_SIZE + r[68];
    f.key = f.tag + f.tag_len + r[70];
    f.props = f.key + f.keys_len;
    f.body = f.props + f.props_len;
    return f;
}

/* A stored property: name [at, sep), value (sep, end); the next one starts after end. */
typedef struct {
    Py_ssize_t at, sep, end;
} Property;

/* Its properties as the decoder reads them (at most STORED_PROPS_IN_C_MAX): their count, or -1
 * when Python maps them (not as the encoder writes them, a repeated name, a name the mapping
 * decodes from base64, text that is not UTF-8). */
static int read_properties(const Stored *f, Property *props) {
    int n = 0;
    if (f->props_len == 0) return 0;
    if (f->props[f->props_len - 1] != 0x02 || !valid_utf8(f->props, f->props_len)) return -1;
    for (Py_ssize_t at = 0; at < f->props_len; n++) {
        const uint8_t *end = memchr(f->props + at, 0x02, (size_t)(f->props_len - at));
        const uint8_t *sep = memchr(f->props + at, 0x01, (size_t)(end - f->props - at));
        if (n == STORED_PROPS_IN_C_MAX || sep == NULL) return -1;
        Property p = {at, sep - f->props, end - f->props};
        const uint8_t *name = f->props + p.at;
        int64_t len = p.sep - p.at;
        if (is_name(name, len, KEY_PROPERTY) || starts_with(name, len, B64_PREFIX) || is_name(name, len, TOMBSTONE_PROPERTY))
            return -1;
        for (int i = 0; i < n; i++)
            if (props[i].sep - props[i].at == len && memcmp(f->props + props[i].at, name, (size_t)len) == 0) return -1;
        props[n] = p;
        at = p.end + 1;
    }
    return n;
}

static inline int is_stamp(const Stored *f, const Property *p) {
    return is_name(f->props + p->at, p->sep - p->at, SEQUENCE_PROPERTY);
}

/* The Kafka record of the gms record r at o (NULL: only its size); its size, or -1 when Python
 * maps it (read_properties; a tag or keys not UTF-8, which the decoder refuses). Its properties are its headers (but an
 * idempotent producer's stamp), then its tag as gms.tag. */
static Py_ssize_t kafka_record(const uint8_t *r, int64_t base_offset, int64_t base_ts, uint8_t *o) {
    Stored f = stored_fields(r);
    Property props[STORED_PROPS_IN_C_MAX];
    int n = read_properties(&f, props);
    if (n < 0 || !valid_utf8(f.tag, f.tag_len) || !valid_utf8(f.key, f.keys_len)) return -1;
    int64_t headers = f.tag_len > 0, headers_size = 0;
    for (int i = 0; i < n; i++) {
        if (is_stamp(&f, &props[i])) continue;
        int64_t name_len = props[i].sep - props[i].at, value_len = props[i].end - props[i].sep - 1;
        headers++;
        headers_size += zigzag_size(name_len) + name_len + zigzag_size(value_len) + value_len;
    }
    if (f.tag_len > 0)
        headers_size += zigzag_size((int64_t)strlen(TAG_HEADER)) + (int64_t)strlen(TAG_HEADER) +
                        zigzag_size(f.tag_len) + f.tag_len;
    int64_t offset_delta = (int64_t)get_be64(r + 16) - base_offset, ts_delta = (int64_t)get_be64(r + 44) - base_ts;
    int64_t key_field = f.keys_len > 0 ? f.keys_len : -1;
    int64_t size = 1 + zigzag_size(ts_delta) + zigzag_size(offset_delta) + zigzag_size(key_field) + f.keys_len +
                   zigzag_size(f.body_len) + f.body_len + zigzag_size(headers) + headers_size;
    if (o == NULL) return zigzag_size(size) + (Py_ssize_t)size;
    uint8_t *start = o;
    o = put_zigzag(o, size);
    *o++ = 0; /* attributes */
    o = put_zigzag(put_zigzag(o, ts_delta), offset_delta);
    o = put_raw(put_zigzag(o, key_field), f.key, (size_t)f.keys_len);
    o = put_raw(put_zigzag(o, f.body_len), f.body, (size_t)f.body_len);
    o = put_zigzag(o, headers);
    for (int i = 0; i < n; i++) {
        if (is_stamp(&f, &props[i])) continue;
        int64_t name_len = props[i].sep - props[i].at, value_len = props[i].end - props[i].sep - 1;
        o = put_raw(put_zigzag(o, name_len), f.props + props[i].at, (size_t)name_len);
        o = put_raw(put_zigzag(o, value_len), f.props + props[i].sep + 1, (size_t)value_len);
    }
    if (f.tag_len > 0) {
        o = put_raw(put_zigzag(o, (int64_t)strlen(TAG_HEADER)), TAG_HEADER, strlen(TAG_HEADER));
        o = put_raw(put_zigzag(o, f.tag_len), f.tag, (size_t)f.tag_len);
    }
    return o - start;
}

/* Walks the records of views (checking each fits its view), adding them up. */
static int scan(Py_buffer *views, Py_ssize_t n, Stats *s) {
    for (Py_ssize_t v = 0; v < n; v++) {
        const uint8_t *buf = views[v].buf;
        for (Py_ssize_t pos = 0; pos < views[v].len;) {
            const uint8_t *r = buf + pos;
            Py_ssize_t left = views[v].len - pos;
            int64_t total = left >= GMS_HEADER_SIZE ? get_be32(r) : 0;
            if (total < GMS_HEADER_SIZE || total > left || get_be32(r + 4) != GMS_MAGIC_V1 ||
                GMS_HEADER_SIZE + r[68] + r[69] + r[70] + (int64_t)get_be32(r + 64) +
                        (((int64_t)r[72] << 8) | r[73]) + (((int64_t)r[74] << 8) | r[75]) != total) {
                PyErr_SetString(PyExc_ValueError, "a view does not hold whole gms records");
                return -1;
            }
            int64_t offset = (int64_t)get_be64(r + 16), ts = (int64_t)get_be64(r + 44);
            if (s->count++ == 0) {
                s->first_offset = offset;
                s->min_ts = s->max_ts = ts;
            }
            s->last_offset = offset;
            s->min_ts = ts < s->min_ts ? ts : s->min_ts;
            s->max_ts = ts > s->max_ts ? ts : s->max_ts;
            pos += (Py_ssize_t)total;
        }
    }
    return 0;
}

/* The most a plain record's Kafka record exceeds its gms record by: its varints (at most 36 bytes)
 * and up to 4 per property (a length varint of up to 3 bytes for each separator) and the gms.tag
 * header's 10, less the gms header's 76. */
#define KAFKA_RECORD_GROWTH_MAX (36 + 4 * STORED_PROPS_IN_C_MAX + 10 - GMS_HEADER_SIZE)

/* Room for need more bytes after used in out (grown to twice as much, at least). */
static uint8_t *reserve(PyObject *out, Py_ssize_t used, Py_ssize_t need) {
    Py_ssize_t size = PyByteArray_GET_SIZE(out);
    if (used + need > size && PyByteArray_Resize(out, used + need > 2 * size ? used + need : 2 * size)) return NULL;
    return (uint8_t *)PyByteArray_AS_STRING(out) + used;
}

/* Writes the Kafka record of every record of views after the batch header left in out, in one
 * pass: a plain one here, any other as convert(view, position, base offset, base timestamp)
 * answers it; the bytes written, or -1. */
static Py_ssize_t write_kafka(PyObject *seq, Py_buffer *views, const Stats *s, PyObject *convert, PyObject *out) {
    Py_ssize_t used = KAFKA_BATCH_HEADER_SIZE;
    for (Py_ssize_t v = 0; v < PySequence_Fast_GET_SIZE(seq); v++) {
        for (Py_ssize_t pos = 0; pos < views[v].len; pos += get_be32((const uint8_t *)views[v].buf + pos)) {
            const uint8_t *r = (const uint8_t *)views[v].buf + pos;
            uint8_t *o = reserve(out, used, (Py_ssize_t)get_be32(r) + KAFKA_RECORD_GROWTH_MAX);
            if (o == NULL) return -1;
            Py_ssize_t size = kafka_record(r, s->first_offset, s->min_ts, o);
            if (size >= 0) {
                used += size;
                continue;
            }
            PyObject *one = PyObject_CallFunction(convert, "OnLL", PySequence_Fast_GET_ITEM(seq, v), pos,
                                                  (long long)s->first_offset, (long long)s->min_ts);
            if (one == NULL) return -1;
            if (!PyBytes_Check(one)) {
                PyErr_SetString(PyExc_TypeError, "convert must answer bytes");
                Py_DECREF(one);
                return -1;
            }
            o = reserve(out, used, PyBytes_GET_SIZE(one));
            if (o != NULL) memcpy(o, PyBytes_AS_STRING(one), (size_t)PyBytes_GET_SIZE(one));
            used += PyBytes_GET_SIZE(one);
            Py_DECREF(one);
            if (o == NULL) return -1;
        }
    }
    return used;
}

static PyObject *to_kafka(PyObject *module, PyObject *args) {
    PyObject *views_arg, *convert;
    if (!PyArg_ParseTuple(args, "OO:to_kafka", &views_arg, &convert)) return NULL;
    PyObject *seq = PySequence_Fast(views_arg, "views must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), held = 0, stored = 0, used;
    PyObject *answer = NULL, *out = NULL;
    Py_buffer *views = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    Stats s = {0};
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held], PyBUF_SIMPLE)) goto done;
        stored += views[held].len;
    }
    if (scan(views, n, &s)) goto done;
    if (s.count == 0) {
        PyErr_SetString(PyExc_ValueError, "no records");
        goto done;
    }
    /* As many bytes as the stored records (and one record's growth): a Kafka record is smaller than
     * its gms record but in contrived cases, so write_kafka grows it hardly ever. */
    out = PyByteArray_FromStringAndSize(NULL, KAFKA_BATCH_HEADER_SIZE + stored + KAFKA_RECORD_GROWTH_MAX);
    if (out == NULL) goto done;
    memset(PyByteArray_AS_STRING(out), 0, KAFKA_BATCH_HEADER_SIZE);
    used = write_kafka(seq, views, &s, convert, out);
    if (used < 0 || PyByteArray_Resize(out, used)) goto done;
    answer = Py_BuildValue("OnLLLL", out, s.count, (long long)s.first_offset, (long long)s.last_offset,
                           (long long)s.min_ts, (long long)s.max_ts);
done:
    for (Py_ssize_t v = 0; v < held; v++) PyBuffer_Release(&views[v]);
    PyMem_Free(views);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return answer;
}

static PyMethodDef methods[] = {
    {"to_gms", to_gms, METH_VARARGS,
     "to_gms(raw, count, base_ts, topic, queue_id, host, limit, convert, chunks) -> bool"},
    {"to_kafka", to_kafka, METH_VARARGS,
     "to_kafka(views, convert) -> (records, count, first_offset, last_offset, min_ts, max_ts)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_convert", NULL, -1, methods};

PyMODINIT_FUNC PyInit__convert(void) {
    crc32_init();
    return PyModule_Create(&module_def);
}
