/* send_async's plain message in one C call: into its topic's sticky batch, with its future.
 *
 * A Python path per message (the accumulator's method, the encoder's, a future object) costs
 * ~1.5 us, three times what a producer may spend to keep up with the broker. A plain message (no
 * keys, properties, key, queue or schedule) whose topic has an open sticky batch with room in
 * the producer's buffer, of a shape the batch already holds (same topic, tag and body length),
 * is appended here under the accumulator's lock; anything else, and every error, takes the
 * accumulator's Python path (_append_plain_slow), which raises the right error or waits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "batch_core.h"
#include "crc32.h"

static PyTypeObject *batch_core_type;  /* gms.record._recordcheck.BatchCore */
static PyObject *str_acquire, *str_release, *str_future, *str_close, *str_filled, *str_slow;

/* --- FutureHandle: the base of gms.client.structs.SendFuture ------------------------------- */

/* A handle starts untracked by the garbage collector: a producer keeps hundreds of thousands,
 * each young collection would walk them, and they take part in no cycle until a callback on the
 * batch's Future refers back to one (SendFuture.add_done_callback calls _track first). */
typedef struct {
    PyObject_HEAD
    PyObject *batch;   /* the batch's concurrent.futures.Future */
    Py_ssize_t index;  /* the message's place in the batch */
} FutureHandleObject;

static PyObject *future_handle_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *batch;
    Py_ssize_t index;
    static char *names[] = {"batch", "index", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On", names, &batch, &index)) return NULL;
    FutureHandleObject *self = (FutureHandleObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    PyObject_GC_UnTrack(self);
    self->batch = Py_NewRef(batch);
    self->index = index;
    return (PyObject *)self;
}

static PyObject *future_handle_track(FutureHandleObject *self, PyObject *unused) {
    (void)unused;
    if (!PyObject_GC_IsTracked((PyObject *)self)) PyObject_GC_Track(self);
    Py_RETURN_NONE;
}

static PyMethodDef future_handle_methods[] = {
    {"_track", (PyCFunction)future_handle_track, METH_NOARGS,
     "Let the garbage collector see this handle (before anything it refers to refers back to it)."},
    {NULL, NULL, 0, NULL},
};

static int future_handle_traverse(FutureHandleObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->batch);
    return 0;
}

static int future_handle_clear(FutureHandleObject *self) {
    Py_CLEAR(self->batch);
    return 0;
}

static void future_handle_dealloc(FutureHandleObject *self) {
    PyObject_GC_UnTrack(self);
    future_handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef future_handle_members[] = {
    {"_batch", T_OBJECT, offsetof(FutureHandleObject, batch), READONLY, "The batch's Future."},
    {"_index", T_PYSSIZET, offsetof(FutureHandleObject, index), READONLY, "The message's place in it."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FutureHandle_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gms.client._append.FutureHandle",
    .tp_doc = PyDoc_STR("FutureHandle(batch, index): one message's place in its batch's Future."),
    .tp_basicsize = sizeof(FutureHandleObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = future_handle_new,
    .tp_dealloc = (destructor)future_handle_dealloc,
    .tp_traverse = (traverseproc)future_handle_traverse,
    .tp_clear = (inquiry)future_handle_clear,
    .tp_members = future_handle_members,
    .tp_methods = future_handle_methods,
};

/* --- AppenderBase: the base of gms.client.accumulator.Accumulator -------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *lock;         /* the accumulator's threading.Lock */
    PyObject *sticky;       /* dict: topic -> the open batch its plain messages fill (a BatchCore) */
    PyObject *future_type;  /* a subtype of FutureHandle: what a message's future is */
    Py_ssize_t buffered_bytes, buffer_bytes_max, batch_bytes, body_size_max;
} AppenderObject;

static int appender_traverse(AppenderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->sticky);
    Py_VISIT(self->future_type);
    return 0;
}

static int appender_clear(AppenderObject *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->future_type);
    return 0;
}

static void appender_dealloc(AppenderObject *self) {
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The shapes entry (shape, shape CRC, record size) of a plain record of topic, tag and body length
 * len in batch: borrowed, or NULL when the batch has none yet (an exception set if lookup failed). */
static PyObject *plain_shape(BatchCoreObject *batch, PyObject *topic, PyObject *tag, Py_ssize_t len) {
    if (batch->last_entry != NULL && batch->last_topic == topic && batch->last_tag == tag
        && batch->last_body_len == len)
        return batch->last_entry;
    PyObject *key = Py_BuildValue("(OOn)", topic, tag, len);
    if (key == NULL) return NULL;
    PyObject *entry = PyDict_GetItemWithError(batch->shapes, key);
    Py_DECREF(key);
    if (entry == NULL) return NULL;
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 0))) {
        PyErr_SetString(PyExc_TypeError, "a batch's shapes hold (shape, shape CRC, record size)");
        return NULL;
    }
    Py_XSETREF(batch->last_topic, Py_NewRef(topic));
    Py_XSETREF(batch->last_tag, Py_NewRef(tag));
    Py_XSETREF(batch->last_entry, Py_NewRef(entry));
    batch->last_body_len = len;
    return entry;
}

/* Appends body to batch under the lock: the message's future, or NULL with no exception set when
 * the Python path must take the message (batch closed, buffer full, a shape not yet packed). */
static PyObject *append_locked(AppenderObject *self, BatchCoreObject *batch, PyObject *topic, PyObject *body,
                               PyObject *tag, int *filled) {
    if (batch->closed || self->buffered_bytes >= self->buffer_bytes_max) return NULL;
    Py_ssize_t len = PyBytes_GET_SIZE(body);
    PyObject *entry = plain_shape(batch, topic, tag, len);
    if (entry == NULL) return NULL;
    Py_ssize_t total = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 2));
    unsigned long shape_crc = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(entry, 1));
    if (PyErr_Occurred()) return NULL;
    PyObject *batch_future = PyObject_GetAttr((PyObject *)batch, str_future);
    if (batch_future == NULL) return NULL;
    PyTypeObject *future_type = (PyTypeObject *)self->future_type;
    FutureHandleObject *future = (FutureHandleObject *)future_type->tp_alloc(future_type, 0);
    if (future != NULL) PyObject_GC_UnTrack(future);
    if (future == NULL || batch_core_append(batch, total, (uint32_t)shape_crc, PyTuple_GET_ITEM(entry, 0), body,
                                            PyBytes_AS_STRING(body), len) < 0) {
        Py_DECREF(batch_future);
        Py_XDECREF(future);
        return NULL;
    }
    future->batch = batch_future;
    future->index = batch->count - 1;
    self->buffered_bytes += total;
    if (batch->size_bytes >= self->batch_bytes) {
        PyObject *done = PyObject_CallMethodOneArg((PyObject *)self, str_close, (PyObject *)batch);
        if (done == NULL) {
            Py_DECREF(future);
            return NULL;
        }
        Py_DECREF(done);
        *filled = 1;
    }
    return (PyObject *)future;
}

PyDoc_STRVAR(append_plain_doc,
"append_plain(topic, body, tag) -> SendFuture\n\n"
"Append a plain message to its topic's sticky batch; the Python path (_append_plain_slow) takes\n"
"the messages this cannot (no open batch, buffer full, a new shape, a body that is not bytes).");

static PyObject *append_plain(AppenderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "append_plain takes exactly 3 arguments");
        return NULL;
    }
    PyObject *topic = args[0], *body = args[1], *tag = args[2];
    if (self->lock == NULL || self->sticky == NULL || self->future_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the accumulator is not initialised");
        return NULL;
    }
    PyObject *batch = PyDict_GetItemWithError(self->sticky, topic);
    if (batch == NULL && PyErr_Occurred()) return NULL;
    if (batch == NULL || !PyObject_TypeCheck(batch, batch_core_type) || !PyBytes_CheckExact(body)
        || PyBytes_GET_SIZE(body) > self->body_size_max)
        return PyObject_CallMethodObjArgs((PyObject *)self, str_slow, topic, body, tag, NULL);
    Py_INCREF(batch);
    PyObject *acquired = PyObject_CallMethodNoArgs(self->lock, str_acquire);
    if (acquired == NULL) {
        Py_DECREF(batch);
        return NULL;
    }
    Py_DECREF(acquired);
    int filled = 0;
    PyObject *future = append_locked(self, (BatchCoreObject *)batch, topic, body, tag, &filled);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *released = PyObject_CallMethodNoArgs(self->lock, str_release);
    if (released == NULL) {  /* cannot happen: we hold it */
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        Py_XDECREF(future);
        Py_DECREF(batch);
        return NULL;
    }
    Py_DECREF(released);
    PyErr_Restore(type, value, traceback);
    if (future == NULL) {
        Py_DECREF(batch);
        if (PyErr_Occurred()) return NULL;
        return PyObject_CallMethodObjArgs((PyObject *)self, str_slow, topic, body, tag, NULL);
    }
    if (filled) {
        PyObject *done = PyObject_CallMethodOneArg((PyObject *)self, str_filled, batch);
        if (done == NULL) {
            Py_DECREF(future);
            Py_DECREF(batch);
            return NULL;
        }
        Py_DECREF(done);
    }
    Py_DECREF(batch);
    return future;
}

static PyObject *get_future_type(AppenderObject *self, void *closure) {
    (void)closure;
    if (self->future_type == NULL) Py_RETURN_NONE;
    return Py_NewRef(self->future_type);
}

static int set_future_type(AppenderObject *self, PyObject *value, void *closure) {
    (void)closure;
    if (value == NULL || !PyType_Check(value) || !PyType_IsSubtype((PyTypeObject *)value, &FutureHandle_Type)) {
        PyErr_SetString(PyExc_TypeError, "_future_type must be a subclass of FutureHandle");
        return -1;
    }
    Py_XSETREF(self->future_type, Py_NewRef(value));
    return 0;
}

static PyMethodDef appender_methods[] = {
    {"append_plain", (PyCFunction)(void (*)(void))append_plain, METH_FASTCALL, append_plain_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef appender_getset[] = {
    {"_future_type", (getter)get_future_type, (setter)set_future_type, "What a message's future is.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef appender_members[] = {
    {"_lock", T_OBJECT, offsetof(AppenderObject, lock), 0, "The lock over batches and the buffer."},
    {"_sticky", T_OBJECT, offsetof(AppenderObject, sticky), 0, "topic -> its open sticky batch."},
    {"_buffered_bytes", T_PYSSIZET, offsetof(AppenderObject, buffered_bytes), 0, "Bytes not yet answered."},
    {"_buffer_bytes_max", T_PYSSIZET, offsetof(AppenderObject, buffer_bytes_max), 0, "Their limit."},
    {"_batch_bytes", T_PYSSIZET, offsetof(AppenderObject, batch_bytes), 0, "A batch this big is sent."},
    {"_body_size_max", T_PYSSIZET, offsetof(AppenderObject, body_size_max), 0, "The largest body."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject Appender_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gms.client._append.AppenderBase",
    .tp_doc = PyDoc_STR("The accumulator's state that append_plain reads, and append_plain itself."),
    .tp_basicsize = sizeof(AppenderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)appender_dealloc,
    .tp_traverse = (traverseproc)appender_traverse,
    .tp_clear = (inquiry)appender_clear,
    .tp_methods = appender_methods,
    .tp_members = appender_members,
    .tp_getset = appender_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gms.client._append",
    "send_async's plain message in one C call (see client/_append.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__append(void) {
    crc32_init();
    PyObject *records = PyImport_ImportModule("gms.record._recordcheck");
    if (records == NULL) return NULL;
    batch_core_type = (PyTypeObject *)PyObject_GetAttrString(records, "BatchCore");
    Py_DECREF(records);
    if (batch_core_type == NULL) return NULL;
    if (!PyType_Check(batch_core_type) || batch_core_type->tp_basicsize != sizeof(BatchCoreObject)) {
        PyErr_SetString(PyExc_ImportError, "gms.record._recordcheck.BatchCore has another layout: rebuild gms");
        return NULL;
    }
    if ((str_acquire = PyUnicode_InternFromString("acquire")) == NULL
        || (str_release = PyUnicode_InternFromString("release")) == NULL
        || (str_future = PyUnicode_InternFromString("future")) == NULL
        || (str_close = PyUnicode_InternFromString("_close")) == NULL
        || (str_filled = PyUnicode_InternFromString("_filled")) == NULL
        || (str_slow = PyUnicode_InternFromString("_append_plain_slow")) == NULL)
        return NULL;
    if (PyType_Ready(&FutureHandle_Type) < 0 || PyType_Ready(&Appender_Type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "FutureHandle", (PyObject *)&FutureHandle_Type) < 0
        || PyModule_AddObjectRef(m, "AppenderBase", (PyObject *)&Appender_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
