/* The messages of a fetched batch made from its columns in one C loop (see gms.client.structs).
 *
 * Python makes a message as ``tuple.__new__(cls, row)`` over ``zip`` of the columns: ~0.1 us per
 * message in iterator steps, an intermediate row and a copy of it, as much as a consumer's own
 * work on the message. Here each message is allocated as its class and filled in place, its body
 * copied straight out of the fetched buffer (numpy would gather the bodies of records of unequal
 * size, e.g. a producer batch whose first record carries properties, into an array first).
 *
 * The messages are untracked by the cycle collector: a message holds only its fields' values
 * (str, None, tuples of str, bytes, int) and its batch, none of which can refer back to it, so it
 * is never part of a cycle; tracked, a poll's thousand messages would each be walked by the
 * collections their allocation sets off.
 *
 * The bodies are copied last, all at once, with the GIL released when they are many: the copy
 * reads the fetched buffer from memory (the kernel wrote it on another core), the slowest part
 * of making a message, and the consumer's fetching thread can run meanwhile.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* A column: one value for every row, a list (item i for row i), a range (computed) or slices of a
 * buffer (bytes copied out of it). */
typedef struct {
    PyObject *same;  /* borrowed; NULL unless one value fills the column */
    PyObject *list;  /* borrowed; NULL unless a list */
    long long start, step;  /* of a range */
    int slices;  /* whether the three views below are held */
    Py_buffer data, at, size;  /* row i: data[at[i]: at[i] + size[i]] */
} Column;

static int int64_view(PyObject *array, Py_buffer *view, Py_ssize_t stop) {
    if (PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || strchr("lq", view->format[0]) == NULL
            || view->format[1] != '\0' || view->len / 8 < stop) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "slice positions must be native int64 arrays as long as the rows");
        return -1;
    }
    return 0;
}

static int column_of(PyObject *spec, Column *column, Py_ssize_t stop) {
    column->same = column->list = NULL;
    column->start = column->step = 0;
    column->slices = 0;
    if (PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 3) {  /* structs._Slices(buf, at, size) */
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(spec, 0), &column->data, PyBUF_SIMPLE) < 0)
            return -1;
        if (int64_view(PyTuple_GET_ITEM(spec, 1), &column->at, stop) < 0) {
            PyBuffer_Release(&column->data);
            return -1;
        }
        if (int64_view(PyTuple_GET_ITEM(spec, 2), &column->size, stop) < 0) {
            PyBuffer_Release(&column->at);
            PyBuffer_Release(&column->data);
            return -1;
        }
        column->slices = 1;
        return 0;
    }
    if (PyList_Check(spec)) {
        if (PyList_GET_SIZE(spec) < stop) {
            PyErr_SetString(PyExc_IndexError, "a column is shorter than the rows asked for");
            return -1;
        }
        column->list = spec;
        return 0;
    }
    if (PyObject_TypeCheck(spec, &PyRange_Type)) {
        PyObject *start = PyObject_GetAttrString(spec, "start");
        PyObject *step = start == NULL ? NULL : PyObject_GetAttrString(spec, "step");
        PyObject *length = step == NULL ? NULL : PyLong_FromSsize_t(PyObject_Length(spec));
        if (length != NULL) {
            column->start = PyLong_AsLongLong(start);
            column->step = PyLong_AsLongLong(step);
            if (!PyErr_Occurred() && PyLong_AsSsize_t(length) < stop)
                PyErr_SetString(PyExc_IndexError, "a column is shorter than the rows asked for");
        }
        Py_XDECREF(start);
        Py_XDECREF(step);
        Py_XDECREF(length);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 1) {  /* structs._Same(value) */
        column->same = PyTuple_GET_ITEM(spec, 0);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "a column is a list, a range, a 1-tuple of its one value or a 3-tuple of slices");
    return -1;
}

static void release(Column *column) {
    if (column->slices) {
        PyBuffer_Release(&column->size);
        PyBuffer_Release(&column->at);
        PyBuffer_Release(&column->data);
        column->slices = 0;
    }
}

/* Bodies waiting to be copied into their (new, not yet shared) bytes objects. */
typedef struct {
    char *to;
    const char *from;
    size_t size;
} Copy;

typedef struct {
    Copy *items;  /* room for a copy per row of each slices column */
    Py_ssize_t count;
    size_t bytes;
} Copies;

/* Copies of more bytes than this are made with the GIL released: the fetching thread decodes the
 * next answer meanwhile. Below it, releasing and taking back the GIL costs more than it frees. */
#define COPY_WITHOUT_GIL_BYTES (64 * 1024)

static void copy_all(const Copies *copies) {
    if (copies->bytes >= COPY_WITHOUT_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < copies->count; i++)
            memcpy(copies->items[i].to, copies->items[i].from, copies->items[i].size);
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < copies->count; i++)
            memcpy(copies->items[i].to, copies->items[i].from, copies->items[i].size);
    }
}

/* The value of ``column`` at ``row`` (a new reference). A slice's bytes are allocated here and
 * filled later, by copy_all(``copies``). */
static PyObject *value_at(const Column *column, Py_ssize_t row, Copies *copies) {
    if (column->slices) {
        long long at = ((const long long *)column->at.buf)[row];
        long long size = ((const long long *)column->size.buf)[row];
        if (at < 0 || size < 0 || at > column->data.len || size > column->data.len - at) {
            PyErr_Format(PyExc_ValueError, "row %zd: slice [%lld: %lld + %lld] is not inside the buffer",
                         row, at, at, size);
            return NULL;
        }
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);  /* filled by copy_all */
        if (bytes != NULL && size > 0) {
            Copy *copy = &copies->items[copies->count++];
            copy->to = PyBytes_AS_STRING(bytes);
            copy->from = (const char *)column->data.buf + at;
            copy->size = (size_t)size;
            copies->bytes += (size_t)size;
        }
        return bytes;
    }
    PyObject *value = column->same != NULL ? column->same
                      : column->list != NULL ? PyList_GET_ITEM(column->list, row) : NULL;
    if (value == NULL)
        return PyLong_FromLongLong(column->start + column->step * (long long)row);
    Py_INCREF(value);
    return value;
}

PyDoc_STRVAR(make_rows_doc,
"make_rows(classes, columns, start, stop) -> list\n\n"
"Rows ``start`` to ``stop`` of ``columns`` (a tuple of columns: each a list, a range, a 1-tuple\n"
"holding the value of every row, or a 3-tuple (buffer, at, size) whose row i is the bytes\n"
"buffer[at[i]: at[i] + size[i]], at and size int64 arrays) as tuples of the class of each row:\n"
"``classes`` is a 1-tuple of the one class or a list of them, tuple subclasses whose instances\n"
"hold just the row.");

static PyObject *make_rows(PyObject *self, PyObject *args) {
    PyObject *classes, *specs;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "OO!nn:make_rows", &classes, &PyTuple_Type, &specs, &start, &stop))
        return NULL;
    if (start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "rows must be 0 <= start <= stop");
        return NULL;
    }
    Py_ssize_t width = PyTuple_GET_SIZE(specs);
    Column *columns = PyMem_New(Column, width + 1);
    if (columns == NULL)
        return PyErr_NoMemory();
    PyObject *rows = NULL;
    Copies copies = {NULL, 0, 0};
    Py_ssize_t ready = 0;  /* columns made (whose views are held) */
    for (; ready <= width; ready++) {
        if (column_of(ready < width ? PyTuple_GET_ITEM(specs, ready) : classes, &columns[ready], stop) < 0)
            goto done;
    }
    if (columns[width].slices) {
        PyErr_SetString(PyExc_TypeError, "the classes are a list or a 1-tuple of the one class");
        goto done;
    }
    Py_ssize_t sliced = 0;
    for (Py_ssize_t j = 0; j < width; j++)
        sliced += columns[j].slices;
    copies.items = PyMem_New(Copy, (size_t)(stop - start) * (size_t)sliced + 1);
    if (copies.items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    rows = PyList_New(stop - start);
    if (rows == NULL)
        goto done;
    PyObject *checked = NULL;  /* the last class found to be a tuple subclass */
    for (Py_ssize_t row = start; row < stop; row++) {
        PyObject *cls = columns[width].same != NULL ? columns[width].same
                        : columns[width].list != NULL ? PyList_GET_ITEM(columns[width].list, row) : NULL;
        if (cls != checked) {
            if (cls == NULL || !PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
                PyErr_SetString(PyExc_TypeError, "a row's class must be a tuple subclass");
                Py_CLEAR(rows);
                goto done;
            }
            checked = cls;
        }
        PyTypeObject *type = (PyTypeObject *)cls;
        PyObject *made = type->tp_alloc(type, width);
        if (made == NULL) {
            Py_CLEAR(rows);
            goto done;
        }
        PyList_SET_ITEM(rows, row - start, made);  /* the list owns it from here, even half filled */
        for (Py_ssize_t j = 0; j < width; j++) {
            PyObject *value = value_at(&columns[j], row, &copies);
            if (value == NULL) {
                Py_CLEAR(rows);
                goto done;
            }
            PyTuple_SET_ITEM(made, j, value);
        }
        if (PyObject_GC_IsTracked(made))
            PyObject_GC_UnTrack(made);
    }
    copy_all(&copies);  /* the views of the buffers are still held: released below */
done:
    PyMem_Free(copies.items);
    for (Py_ssize_t j = 0; j < ready; j++)
        release(&columns[j]);
    PyMem_Free(columns);
    return rows;
}

static PyMethodDef methods[] = {
    {"make_rows", make_rows, METH_VARARGS, make_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows", "Messages of a fetched batch made from its columns in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
