/* send_async's plain message in one C call: into its topic's sticky batch, with its future.
 *
 * A Python path per message (the accumulator's method, the encoder's, a future object) costs
 * ~1.5 us, three times what a producer may spend to keep up with the broker. A plain message (no
 * keys, properties, key, queue or schedule) whose topic has an open sticky batch with room in
 * the producer's buffer, of a shape the batch already holds (same topic, tag and body length),
 * is appended here under the accumulator's lock (a GilMutex); anything else, and every error, takes the
 * accumulator's Python path (_append_plain_slow), which raises the right error or waits.
 * append_open does the same for a message sent to a queue (queue=) without keys or properties,
 * into that queue's open batch; its Python path is the accumulator's append.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "batch_core.h"
#include "crc32.h"

static PyTypeObject *batch_core_type;  /* gms.record._recordcheck.BatchCore */
static PyObject *str_close, *str_filled, *str_slow, *str_append;
static PyObject *empty_tuple;  /* append's keys for a message without any */

/* --- SendFuture: one message's place in its batch's Future -------------------------------- */

/* Not an object of the cycle collector: a producer makes one per message, hundreds of thousands
 * a second, and every allocation of a collected object counts towards the next collection. A
 * collection that often promotes the producer's batches in flight, which then set off full
 * collections (all of a process's objects walked). A handle is in no lasting cycle: the only
 * reference back to one from its batch's Future is a callback's, and that is dropped when the
 * callback has run (OneShotCallback). */
typedef struct {
    PyObject_HEAD
    PyObject *batch;   /* the batch (a BatchCore with its outcome), or a Future-like outcome itself */
    Py_ssize_t index;  /* the message's place in the batch */
} SendFutureObject;

static PyTypeObject SendFuture_Type;
static PyTypeObject OneShotCallback_Type;
static PyObject *str_result, *str_exception, *str_done, *str_cancelled, *str_add_done_callback;

/* outcome.name(arg) (no argument if arg is NULL) of the handle's batch: a BatchCore's outcome, or
 * what the handle was made with. A plain append refers to the batch, not its outcome: the batch's
 * first line is in the cache then, its outcome's reference count is not (a miss a message, at a
 * thousand topics). */
static PyObject *call_outcome(SendFutureObject *self, PyObject *name, PyObject *arg) {
    PyObject *outcome = self->batch;
    if (PyObject_TypeCheck(outcome, batch_core_type)) {
        outcome = ((BatchCoreObject *)outcome)->outcome;
        if (outcome == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "the message's batch has no outcome");
            return NULL;
        }
    }
    Py_INCREF(outcome);
    PyObject *result = arg == NULL ? PyObject_CallMethodNoArgs(outcome, name)
                                   : PyObject_CallMethodOneArg(outcome, name, arg);
    Py_DECREF(outcome);
    return result;
}

static SendFutureObject *send_future_make(PyObject *batch, Py_ssize_t index) {
    SendFutureObject *self = PyObject_New(SendFutureObject, &SendFuture_Type);
    if (self == NULL) return NULL;
    self->batch = Py_NewRef(batch);
    self->index = index;
    return self;
}

static PyObject *send_future_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)type;
    PyObject *batch;
    Py_ssize_t index;
    static char *names[] = {"batch", "index", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On:SendFuture", names, &batch, &index)) return NULL;
    return (PyObject *)send_future_make(batch, index);
}

static void send_future_dealloc(SendFutureObject *self) {
    Py_XDECREF(self->batch);
    PyObject_Free(self);
}

/* timeout=None, the one optional argument of result() and exception(). */
static int parse_timeout(PyObject *args, PyObject *kwargs, const char *format, PyObject **timeout) {
    static char *names[] = {"timeout", NULL};
    *timeout = Py_None;
    return PyArg_ParseTupleAndKeywords(args, kwargs, format, names, timeout);
}

static PyObject *send_future_result(SendFutureObject *self, PyObject *args, PyObject *kwargs) {
    PyObject *timeout;
    if (!parse_timeout(args, kwargs, "|O:result", &timeout)) return NULL;
    PyObject *results = call_outcome(self, str_result, timeout);
    if (results == NULL) return NULL;
    int any = PyObject_IsTrue(results);  /* acks=0: no results, each message's is None */
    PyObject *mine = any > 0 ? PySequence_GetItem(results, self->index) : any == 0 ? Py_NewRef(Py_None) : NULL;
    Py_DECREF(results);
    return mine;
}

static PyObject *send_future_exception(SendFutureObject *self, PyObject *args, PyObject *kwargs) {
    PyObject *timeout;
    if (!parse_timeout(args, kwargs, "|O:exception", &timeout)) return NULL;
    return call_outcome(self, str_exception, timeout);
}

static PyObject *send_future_done(SendFutureObject *self, PyObject *unused) {
    (void)unused;
    return call_outcome(self, str_done, NULL);
}

static PyObject *send_future_cancelled(SendFutureObject *self, PyObject *unused) {
    (void)unused;
    return call_outcome(self, str_cancelled, NULL);
}

static PyObject *send_future_running(SendFutureObject *self, PyObject *unused) {
    (void)unused;
    PyObject *done = call_outcome(self, str_done, NULL);
    if (done == NULL) return NULL;
    int is_done = PyObject_IsTrue(done);
    Py_DECREF(done);
    if (is_done < 0) return NULL;
    return PyBool_FromLong(!is_done);
}

static PyObject *send_future_cancel(SendFutureObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    Py_RETURN_FALSE;
}

/* fn(handle) once, then neither is referred to any more (the Future keeps its callbacks). */
typedef struct {
    PyObject_HEAD
    PyObject *fn, *handle;
} OneShotCallbackObject;

static PyObject *send_future_add_done_callback(SendFutureObject *self, PyObject *fn) {
    OneShotCallbackObject *callback = PyObject_GC_New(OneShotCallbackObject, &OneShotCallback_Type);
    if (callback == NULL) return NULL;
    callback->fn = Py_NewRef(fn);
    callback->handle = Py_NewRef((PyObject *)self);
    PyObject_GC_Track(callback);
    PyObject *added = call_outcome(self, str_add_done_callback, (PyObject *)callback);
    Py_DECREF(callback);
    return added;
}

static PyObject *send_future_repr(SendFutureObject *self) {
    PyObject *done = call_outcome(self, str_done, NULL);
    if (done == NULL) return NULL;
    int is_done = PyObject_IsTrue(done);
    Py_DECREF(done);
    if (is_done < 0) return NULL;
    if (!is_done) return PyUnicode_FromString("<SendFuture pending>");
    PyObject *error = call_outcome(self, str_exception, NULL);
    if (error == NULL) return NULL;
    int failed = error != Py_None;
    Py_DECREF(error);
    return PyUnicode_FromString(failed ? "<SendFuture failed>" : "<SendFuture done>");
}

/* ``await future``: the iterator gms.client.send_results registered (set_await_hook) makes for it. */
static PyObject *await_hook;

static PyObject *send_future_await(PyObject *self) {
    if (await_hook == NULL) {
        PyErr_SetString(PyExc_TypeError, "import gms.client before awaiting a SendFuture");
        return NULL;
    }
    return PyObject_CallOneArg(await_hook, self);
}

static PyAsyncMethods send_future_async = {.am_await = (unaryfunc)send_future_await};

static PyObject *set_await_hook(PyObject *module, PyObject *fn) {
    (void)module;
    Py_XSETREF(await_hook, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef send_future_methods[] = {
    {"result", (PyCFunction)(void (*)(void))send_future_result, METH_VARARGS | METH_KEYWORDS,
     "result(timeout=None): the message's SendResult (None with acks=0), waiting up to timeout\n"
     "seconds; raises what failed the send."},
    {"exception", (PyCFunction)(void (*)(void))send_future_exception, METH_VARARGS | METH_KEYWORDS,
     "exception(timeout=None): what failed the send, or None."},
    {"done", (PyCFunction)send_future_done, METH_NOARGS, "The batch is answered."},
    {"cancelled", (PyCFunction)send_future_cancelled, METH_NOARGS, "Always False: see cancel()."},
    {"running", (PyCFunction)send_future_running, METH_NOARGS, "The batch is not answered yet."},
    {"cancel", (PyCFunction)send_future_cancel, METH_NOARGS,
     "A queued message cannot be taken back: always False, as for a running Future."},
    {"add_done_callback", (PyCFunction)send_future_add_done_callback, METH_O,
     "add_done_callback(fn): fn(this future) once the batch is answered (at once if it already\n"
     "is), on the producer's I/O thread: keep it short."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef send_future_members[] = {
    {"_batch", T_OBJECT, offsetof(SendFutureObject, batch), READONLY, "The batch, or its outcome."},
    {"_index", T_PYSSIZET, offsetof(SendFutureObject, index), READONLY, "The message's place in it."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SendFuture_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gms.client.SendFuture",
    .tp_doc = PyDoc_STR(
        "SendFuture(batch, index): the outcome of one send_async, resolved when its batch is answered\n"
        "(Kafka's FutureRecordMetadata). A batch has one concurrent.futures.Future; each message a\n"
        "small handle on it with the Future methods callers use. concurrent.futures.wait needs real\n"
        "Futures: wait with Producer.flush() instead."),
    .tp_basicsize = sizeof(SendFutureObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = send_future_new,
    .tp_dealloc = (destructor)send_future_dealloc,
    .tp_repr = (reprfunc)send_future_repr,
    .tp_as_async = &send_future_async,
    .tp_methods = send_future_methods,
    .tp_members = send_future_members,
};

static PyObject *one_shot_call(OneShotCallbackObject *self, PyObject *args, PyObject *kwargs) {
    (void)args;
    (void)kwargs;
    PyObject *fn = self->fn, *handle = self->handle;
    if (fn == NULL) Py_RETURN_NONE;
    self->fn = self->handle = NULL;
    PyObject *result = PyObject_CallOneArg(fn, handle);
    Py_DECREF(fn);
    Py_DECREF(handle);
    return result;
}

static int one_shot_traverse(OneShotCallbackObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->fn);
    return 0;
}

static int one_shot_clear(OneShotCallbackObject *self) {
    Py_CLEAR(self->fn);
    Py_CLEAR(self->handle);
    return 0;
}

static void one_shot_dealloc(OneShotCallbackObject *self) {
    PyObject_GC_UnTrack(self);
    one_shot_clear(self);
    PyObject_GC_Del(self);
}

static PyTypeObject OneShotCallback_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gms.client._append.OneShotCallback",
    .tp_basicsize = sizeof(OneShotCallbackObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_call = (ternaryfunc)one_shot_call,
    .tp_dealloc = (destructor)one_shot_dealloc,
    .tp_traverse = (traverseproc)one_shot_traverse,
    .tp_clear = (inquiry)one_shot_clear,
};

/* --- GilMutex: the accumulator's lock ----------------------------------------------------- */

/* A mutex whose state is a flag only read and written with the GIL held: taking it when it is
 * free is a test and a store, no atomic operation, system call or method call. A threading.Lock
 * taken and released per message cost a producer ~0.1 us of its ~0.4 us a message (two method
 * calls, argument parsing, a semaphore whose cache line the loop's thread kept taking away at a
 * thousand topics). A thread that finds it held sleeps without the GIL on `wake`, which a release
 * that finds sleepers lets go once (`posted`); a woken thread looks again, so a release meant for
 * a thread that gave up, or a thread that took the mutex first, only costs a look. The interface
 * is threading.Lock's (acquire(blocking, timeout), release, locked, with), so a
 * threading.Condition takes it. Sound only while every caller holds the GIL, as with every
 * interpreter that loads this module (it does not declare itself free-threading safe). */
typedef struct {
    PyObject_HEAD
    char held;
    char posted;             /* wake is released: the next sleeper takes it at once */
    Py_ssize_t sleepers;     /* threads in gil_mutex_take waiting for a release */
    PyThread_type_lock wake;
} GilMutexObject;

static double monotonic_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* Takes the mutex (the GIL held), waiting up to timeout_s (< 0: for ever): 1 if taken, 0 if not. */
static int gil_mutex_take(GilMutexObject *self, double timeout_s) {
    if (!self->held) {
        self->held = 1;
        return 1;
    }
    if (timeout_s == 0) return 0;
    double deadline = timeout_s > 0 ? monotonic_s() + timeout_s : 0;
    self->sleepers++;
    while (self->held) {
        PY_TIMEOUT_T wait_us = -1;
        if (timeout_s > 0) {
            double left = deadline - monotonic_s();
            if (left <= 0) break;
            wait_us = (PY_TIMEOUT_T)(left * 1e6) + 1;
        }
        PyLockStatus woken;
        Py_BEGIN_ALLOW_THREADS
        woken = PyThread_acquire_lock_timed(self->wake, wait_us, 0);
        Py_END_ALLOW_THREADS
        if (woken == PY_LOCK_ACQUIRED) self->posted = 0;
    }
    self->sleepers--;
    if (self->held) return 0;
    self->held = 1;
    return 1;
}

static void gil_mutex_give(GilMutexObject *self) {
    self->held = 0;
    if (self->sleepers && !self->posted) {
        self->posted = 1;
        PyThread_release_lock(self->wake);
    }
}

static PyObject *gil_mutex_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "GilMutex() takes no arguments");
        return NULL;
    }
    GilMutexObject *self = (GilMutexObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->wake = PyThread_allocate_lock();
    if (self->wake == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    PyThread_acquire_lock(self->wake, NOWAIT_LOCK);  /* taken: released once per wake-up */
    return (PyObject *)self;
}

static void gil_mutex_dealloc(GilMutexObject *self) {
    if (self->wake != NULL) PyThread_free_lock(self->wake);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *gil_mutex_acquire(GilMutexObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pd:acquire", keywords, &blocking, &timeout)) return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (timeout > (double)PY_TIMEOUT_MAX / 1e6) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    return PyBool_FromLong(gil_mutex_take(self, blocking ? timeout : 0));
}

static PyObject *gil_mutex_enter(GilMutexObject *self, PyObject *Py_UNUSED(ignored)) {
    gil_mutex_take(self, -1);
    Py_RETURN_TRUE;
}

static PyObject *gil_mutex_release(GilMutexObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->held) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    gil_mutex_give(self);
    Py_RETURN_NONE;
}

static PyObject *gil_mutex_exit(GilMutexObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs)) {
    return gil_mutex_release(self, NULL);
}

static PyObject *gil_mutex_locked(GilMutexObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(self->held);
}

static PyMethodDef gil_mutex_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))gil_mutex_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool: as threading.Lock's."},
    {"release", (PyCFunction)gil_mutex_release, METH_NOARGS, "release(): as threading.Lock's."},
    {"locked", (PyCFunction)gil_mutex_locked, METH_NOARGS, "locked() -> bool: whether it is held."},
    {"__enter__", (PyCFunction)gil_mutex_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))gil_mutex_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GilMutex_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gms.client._append.GilMutex",
    .tp_basicsize = sizeof(GilMutexObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A non-reentrant lock whose state the GIL guards (see client/_append.c).",
    .tp_new = gil_mutex_new,
    .tp_dealloc = (destructor)gil_mutex_dealloc,
    .tp_methods = gil_mutex_methods,
};

/* --- AppenderBase: the base of gms.client.accumulator.Accumulator -------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *lock;         /* the accumulator's lock: a GilMutex for the C path to run */
    PyObject *sticky;       /* dict: topic -> the open batch its plain messages fill (a BatchCore) */
    PyObject *open;         /* dict: route -> its open batch (a BatchCore) */
    Py_ssize_t buffered_bytes, buffer_bytes_max, batch_bytes, body_size_max;
} AppenderObject;

static int appender_traverse(AppenderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->sticky);
    Py_VISIT(self->open);
    return 0;
}

static int appender_clear(AppenderObject *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->open);
    return 0;
}

static void appender_dealloc(AppenderObject *self) {
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether batch's last shapes entry (plain_shape) is that of a plain record of topic, tag and a body
 * of len bytes: the entry is then unpacked in batch's last_* fields. */
static inline int last_shape_fits(BatchCoreObject *batch, PyObject *topic, PyObject *tag, Py_ssize_t len) {
    return batch->last_entry != NULL && batch->last_topic == topic && batch->last_tag == tag
           && batch->last_body_len == len;
}

/* Looks up the shapes entry (shape, shape CRC, record size) of a plain record of topic, tag and
 * body length len in batch and unpacks it in batch's last_* fields: 1, 0 when the batch has none
 * yet, -1 with an exception set. */
static int plain_shape(BatchCoreObject *batch, PyObject *topic, PyObject *tag, Py_ssize_t len) {
    PyObject *key = Py_BuildValue("(OOn)", topic, tag, len);
    if (key == NULL) return -1;
    PyObject *entry = PyDict_GetItemWithError(batch->shapes, key);
    Py_DECREF(key);
    if (entry == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 0))) {
        PyErr_SetString(PyExc_TypeError, "a batch's shapes hold (shape, shape CRC, record size)");
        return -1;
    }
    Py_ssize_t total = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 2));
    unsigned long shape_crc = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(entry, 1));
    if (PyErr_Occurred()) return -1;
    PyObject *shape = PyTuple_GET_ITEM(entry, 0);
    Py_ssize_t shape_len = PyBytes_GET_SIZE(shape);
    Py_XSETREF(batch->last_topic, Py_NewRef(topic));
    Py_XSETREF(batch->last_tag, Py_NewRef(tag));
    Py_XSETREF(batch->last_entry, Py_NewRef(entry));  /* keeps the shape a long one points into */
    batch->last_body_len = len;
    batch->last_total = total;
    batch->last_shape_crc = (uint32_t)shape_crc;
    batch->last_shape_len = shape_len;
    if (shape_len <= BATCH_CORE_SHAPE_INLINE) {
        memcpy(batch->last_shape_inline, PyBytes_AS_STRING(shape), (size_t)shape_len);
        batch->last_shape = batch->last_shape_inline;
    } else {
        batch->last_shape = PyBytes_AS_STRING(shape);
    }
    return 1;
}

/* Appends body to batch under the lock: the message's future, or NULL with no exception set when
 * the Python path must take the message (batch closed or without an outcome, buffer full unless
 * may_overfill, a shape not yet packed). */
static PyObject *append_locked(AppenderObject *self, BatchCoreObject *batch, PyObject *topic, PyObject *body,
                               PyObject *tag, int may_overfill, int *filled) {
    if (batch->closed || batch->outcome == NULL
        || (!may_overfill && self->buffered_bytes >= self->buffer_bytes_max)) return NULL;
    Py_ssize_t len = PyBytes_GET_SIZE(body);
    if (!last_shape_fits(batch, topic, tag, len) && plain_shape(batch, topic, tag, len) <= 0) return NULL;
    SendFutureObject *future = PyObject_New(SendFutureObject, &SendFuture_Type);
    if (future == NULL) return NULL;
    Py_ssize_t total = batch->last_total;
    if (batch_core_append(batch, total, batch->last_shape_crc, batch->last_shape, batch->last_shape_len, body,
                          PyBytes_AS_STRING(body), len) < 0) {
        future->batch = NULL;
        Py_DECREF(future);
        return NULL;
    }
    future->batch = Py_NewRef((PyObject *)batch);
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

/* Appends body to batch (a borrowed BatchCore, or not one) under the lock, and sends the batch if
 * that filled it: the message's future, or NULL, with no exception set when the caller's Python
 * path must take the message (not a batch of this kind, a body not bytes or too large, and what
 * append_locked leaves to it). */
static PyObject *append_to(AppenderObject *self, PyObject *batch, PyObject *topic, PyObject *body, PyObject *tag) {
    if (!PyObject_TypeCheck(batch, batch_core_type) || !PyBytes_CheckExact(body)
        || PyBytes_GET_SIZE(body) > self->body_size_max || !Py_IS_TYPE(self->lock, &GilMutex_Type))
        return NULL;
    Py_INCREF(batch);
    GilMutexObject *lock = (GilMutexObject *)self->lock;
    gil_mutex_take(lock, -1);
    int filled = 0;
    PyObject *future = append_locked(self, (BatchCoreObject *)batch, topic, body, tag, 0, &filled);
    gil_mutex_give(lock);
    if (future != NULL && filled) {
        PyObject *done = PyObject_CallMethodOneArg((PyObject *)self, str_filled, batch);
        if (done == NULL)
            Py_CLEAR(future);
        else
            Py_DECREF(done);
    }
    Py_DECREF(batch);
    return future;
}

/* The message appended to batches[key] (append_to), or NULL: with an exception set on an error,
 * without one when the caller's Python path must take it (no such batch, or what append_to
 * leaves to it). */
static PyObject *append_keyed(AppenderObject *self, PyObject *batches, PyObject *key, PyObject *topic,
                              PyObject *body, PyObject *tag) {
    if (self->lock == NULL || batches == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the accumulator is not initialised");
        return NULL;
    }
    PyObject *batch = PyDict_GetItemWithError(batches, key);
    return batch == NULL ? NULL : append_to(self, batch, topic, body, tag);
}

static PyObject *append_plain(AppenderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "append_plain takes exactly 3 arguments");
        return NULL;
    }
    PyObject *topic = args[0], *body = args[1], *tag = args[2];
    PyObject *future = append_keyed(self, self->sticky, topic, topic, body, tag);
    if (future != NULL || PyErr_Occurred()) return future;
    return PyObject_CallMethodObjArgs((PyObject *)self, str_slow, topic, body, tag, NULL);
}

PyDoc_STRVAR(append_open_doc,
"append_open(route, body, tag) -> SendFuture\n\n"
"Append a message without keys or properties to route's open batch (route: a QueueRoute, its\n"
"topic first); the Python path (append) takes the messages this cannot (no open batch, buffer\n"
"full, a new shape).");

static PyObject *append_open(AppenderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "append_open takes exactly 3 arguments");
        return NULL;
    }
    PyObject *route = args[0], *body = args[1], *tag = args[2];
    if (!PyTuple_Check(route) || PyTuple_GET_SIZE(route) == 0) {
        PyErr_SetString(PyExc_TypeError, "append_open's route is a QueueRoute");
        return NULL;
    }
    PyObject *future = append_keyed(self, self->open, route, PyTuple_GET_ITEM(route, 0), body, tag);
    if (future != NULL || PyErr_Occurred()) return future;
    return PyObject_CallMethodObjArgs((PyObject *)self, str_append, route, body, tag, empty_tuple, Py_None, NULL);
}

static PyMethodDef appender_methods[] = {
    {"append_plain", (PyCFunction)(void (*)(void))append_plain, METH_FASTCALL, append_plain_doc},
    {"append_open", (PyCFunction)(void (*)(void))append_open, METH_FASTCALL, append_open_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef appender_members[] = {
    {"_lock", T_OBJECT, offsetof(AppenderObject, lock), 0, "The lock over batches and the buffer."},
    {"_sticky", T_OBJECT, offsetof(AppenderObject, sticky), 0, "topic -> its open sticky batch."},
    {"_open", T_OBJECT, offsetof(AppenderObject, open), 0, "route -> its open batch."},
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
};

/* --- PlainFastPath: an asyncio producer's send_nowait ------------------------------------ */

/* send_nowait(topic, body[, tag]) of an asyncio producer: a plain message appended here as
 * append_plain would, without the accumulator's lock (the producer and everything that touches
 * its accumulator run on one loop's thread), also past a full buffer (on the loop nothing waits
 * for room but drain()), and without a Python frame for send_nowait itself;
 * anything else (keywords, a closed batch, a new shape, while disabled) is the fallback's, called
 * with the same arguments. Its Python callers (~100 ns) and the lock (~50 ns) were a third of
 * what a loop spent per queued message. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    AppenderObject *appender;
    PyObject *fallback;  /* send_nowait in Python */
    char enabled;        /* cleared while messages wait for their topic's routes, and once closed */
} FastPathObject;

static PyObject *fast_path_append(FastPathObject *self, PyObject *const *args, Py_ssize_t nargs) {
    AppenderObject *appender = self->appender;
    PyObject *topic = args[0], *body = args[1], *tag = nargs == 3 ? args[2] : Py_None;
    if (appender->sticky == NULL || !PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) > appender->body_size_max)
        return NULL;
    PyObject *batch = PyDict_GetItemWithError(appender->sticky, topic);
    if (batch == NULL || !PyObject_TypeCheck(batch, batch_core_type)) return NULL;
    Py_INCREF(batch);
    int filled = 0;
    /* A full buffer does not stop it: on the loop nothing waits (drain() does), as in the Python path. */
    PyObject *future = append_locked(appender, (BatchCoreObject *)batch, topic, body, tag, 1, &filled);
    if (future != NULL && filled) {
        PyObject *done = PyObject_CallMethodOneArg((PyObject *)appender, str_filled, batch);
        if (done == NULL) Py_CLEAR(future);
        Py_XDECREF(done);
    }
    Py_DECREF(batch);
    return future;
}

static PyObject *fast_path_call(FastPathObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->enabled && kwnames == NULL && (nargs == 2 || nargs == 3)) {
        PyObject *future = fast_path_append(self, args, nargs);
        if (future != NULL || PyErr_Occurred()) return future;
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *fast_path_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"appender", "fallback", NULL};
    PyObject *appender, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O:PlainFastPath", names, &Appender_Type, &appender, &fallback))
        return NULL;
    FastPathObject *self = (FastPathObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = (vectorcallfunc)fast_path_call;
    self->appender = (AppenderObject *)Py_NewRef(appender);
    self->fallback = Py_NewRef(fallback);
    self->enabled = 1;
    return (PyObject *)self;
}

static int fast_path_traverse(FastPathObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->appender);
    Py_VISIT(self->fallback);
    return 0;
}

static int fast_path_clear(FastPathObject *self) {
    Py_CLEAR(self->appender);
    Py_CLEAR(self->fallback);
    return 0;
}

static void fast_path_dealloc(FastPathObject *self) {
    PyObject_GC_UnTrack(self);
    fast_path_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef fast_path_members[] = {
    {"enabled", T_BOOL, offsetof(FastPathObject, enabled), 0, "Whether plain messages may be appended here."},
    {"fallback", T_OBJECT, offsetof(FastPathObject, fallback), READONLY, "What takes every other call."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FastPath_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gms.client._append.PlainFastPath",
    .tp_doc = PyDoc_STR("PlainFastPath(appender, fallback): an asyncio producer's send_nowait (see _append.c)."),
    .tp_basicsize = sizeof(FastPathObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(FastPathObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = fast_path_new,
    .tp_dealloc = (destructor)fast_path_dealloc,
    .tp_traverse = (traverseproc)fast_path_traverse,
    .tp_clear = (inquiry)fast_path_clear,
    .tp_members = fast_path_members,
};

static PyMethodDef module_methods[] = {
    {"set_await_hook", set_await_hook, METH_O,
     "set_await_hook(fn): ``await future`` iterates fn(future) (gms.client.send_results sets it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gms.client._append",
    "send_async's plain message in one C call (see client/_append.c).", -1, module_methods,
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
    if ((str_close = PyUnicode_InternFromString("_close")) == NULL
        || (str_filled = PyUnicode_InternFromString("_filled")) == NULL
        || (str_slow = PyUnicode_InternFromString("_append_plain_slow")) == NULL
        || (str_append = PyUnicode_InternFromString("append")) == NULL
        || (empty_tuple = PyTuple_New(0)) == NULL
        || (str_result = PyUnicode_InternFromString("result")) == NULL
        || (str_exception = PyUnicode_InternFromString("exception")) == NULL
        || (str_done = PyUnicode_InternFromString("done")) == NULL
        || (str_cancelled = PyUnicode_InternFromString("cancelled")) == NULL
        || (str_add_done_callback = PyUnicode_InternFromString("add_done_callback")) == NULL)
        return NULL;
    if (PyType_Ready(&SendFuture_Type) < 0 || PyType_Ready(&OneShotCallback_Type) < 0
        || PyType_Ready(&Appender_Type) < 0 || PyType_Ready(&FastPath_Type) < 0 || PyType_Ready(&GilMutex_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "SendFuture", (PyObject *)&SendFuture_Type) < 0
        || PyModule_AddObjectRef(m, "AppenderBase", (PyObject *)&Appender_Type) < 0
        || PyModule_AddObjectRef(m, "PlainFastPath", (PyObject *)&FastPath_Type) < 0
        || PyModule_AddObjectRef(m, "GilMutex", (PyObject *)&GilMutex_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
