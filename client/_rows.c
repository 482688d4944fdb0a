/* The messages of a fetched batch made from its columns in one C loop (see gms.client.structs).
 *
 * Python makes a message as ``tuple.__new__(cls, row)`` over ``zip`` of the columns: ~0.1 us per
 * message in iterator steps, an intermediate row and a copy of it, as much as a consumer's own
 * work on the message. Here each message is allocated as its class and filled in place.
 *
 * The messages are untracked by the cycle collector: a message holds only its fields' values
 * (str, None, tuples of str, bytes, int) and its batch, none of which can refer back to it, so it
 * is never part of a cycle; tracked, a poll's thousand messages would each be walked by the
 * collections their allocation sets off.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A column: one value for every row, a list (item i for row i) or a range (computed). */
typedef struct {
    PyObject *same;  /* borrowed; NULL unless one value fills the column */
    PyObject *list;  /* borrowed; NULL unless a list */
    long long start, step;  /* of a range */
} Column;

static int column_of(PyObject *spec, Column *column, Py_ssize_t stop) {
    column->same = column->list = NULL;
    column->start = column->step = 0;
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
    PyErr_SetString(PyExc_TypeError, "a column is a list, a range or a 1-tuple of its one value");
    return -1;
}

/* The value of ``column`` at ``row`` (a new reference). */
static PyObject *value_at(const Column *column, Py_ssize_t row) {
    PyObject *value = column->same != NULL ? column->same
                      : column->list != NULL ? PyList_GET_ITEM(column->list, row) : NULL;
    if (value == NULL)
        return PyLong_FromLongLong(column->start + column->step * (long long)row);
    Py_INCREF(value);
    return value;
}

PyDoc_STRVAR(make_rows_doc,
"make_rows(classes, columns, start, stop) -> list\n\n"
"Rows ``start`` to ``stop`` of ``columns`` (a tuple of columns: each a list, a range or a 1-tuple\n"
"holding the value of every row) as tuples of the class of each row: ``classes`` is a 1-tuple of\n"
"the one class or a list of them, tuple subclasses whose instances hold just the row.");

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
    for (Py_ssize_t j = 0; j <= width; j++) {
        if (column_of(j < width ? PyTuple_GET_ITEM(specs, j) : classes, &columns[j], stop) < 0)
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
            PyObject *value = value_at(&columns[j], row);
            if (value == NULL) {
                Py_CLEAR(rows);
                goto done;
            }
            PyTuple_SET_ITEM(made, j, value);
        }
        if (PyObject_GC_IsTracked(made))
            PyObject_GC_UnTrack(made);
    }
done:
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
