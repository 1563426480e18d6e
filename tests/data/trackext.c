/* A minimal extension that reports memory to tracemalloc the way numpy does, built by
 * tests/test_tracked.py. Importable as an extension module (trackext, or any name given by
 * -DMODNAME) and loadable with ctypes (the at_* functions). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef MODNAME
#define MODNAME trackext
#endif
#define STR2(x) #x
#define STR(x) STR2(x)
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

int at_track(unsigned int domain, uintptr_t ptr, size_t size)
{
    return PyTraceMalloc_Track(domain, ptr, size);
}

int at_untrack(unsigned int domain, uintptr_t ptr)
{
    return PyTraceMalloc_Untrack(domain, ptr);
}

static PyObject *track(PyObject *self, PyObject *args)
{
    unsigned int domain;
    unsigned long long ptr, size;
    if (!PyArg_ParseTuple(args, "IKK", &domain, &ptr, &size))
        return NULL;
    return PyLong_FromLong(PyTraceMalloc_Track(domain, (uintptr_t)ptr, (size_t)size));
}

static PyObject *untrack(PyObject *self, PyObject *args)
{
    unsigned int domain;
    unsigned long long ptr;
    if (!PyArg_ParseTuple(args, "IK", &domain, &ptr))
        return NULL;
    return PyLong_FromLong(PyTraceMalloc_Untrack(domain, (uintptr_t)ptr));
}

/* malloc + Track, as numpy allocates array data; returns the address. */
static PyObject *alloc(PyObject *self, PyObject *args)
{
    unsigned int domain;
    unsigned long long size;
    if (!PyArg_ParseTuple(args, "IK", &domain, &size))
        return NULL;
    void *p = malloc(size ? size : 1);
    if (p == NULL)
        return PyErr_NoMemory();
    PyTraceMalloc_Track(domain, (uintptr_t)p, (size_t)size);
    return PyLong_FromUnsignedLongLong((uintptr_t)p);
}

/* Untrack + free. */
static PyObject *release(PyObject *self, PyObject *args)
{
    unsigned int domain;
    unsigned long long ptr;
    if (!PyArg_ParseTuple(args, "IK", &domain, &ptr))
        return NULL;
    PyTraceMalloc_Untrack(domain, (uintptr_t)ptr);
    free((void *)(uintptr_t)ptr);
    Py_RETURN_NONE;
}

/* Tracks (domain, ptr, size) from this thread with the GIL released, as an extension's
   allocator does in a section without the GIL. */
static PyObject *track_released(PyObject *self, PyObject *args)
{
    unsigned int domain;
    unsigned long long ptr;
    Py_ssize_t size;
    int result;
    if (!PyArg_ParseTuple(args, "IKn", &domain, &ptr, &size))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    result = PyTraceMalloc_Track(domain, (uintptr_t)ptr, (size_t)size);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(result);
}

/* Without the GIL: n rounds of malloc, Track, Untrack, free (Track takes the GIL itself). */
static PyObject *hammer(PyObject *self, PyObject *args)
{
    unsigned int domain;
    long n;
    if (!PyArg_ParseTuple(args, "Il", &domain, &n))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (long i = 0; i < n; i++) {
        void *p = malloc(64);
        PyTraceMalloc_Track(domain, (uintptr_t)p, 64);
        PyTraceMalloc_Untrack(domain, (uintptr_t)p);
        free(p);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"track", track, METH_VARARGS, NULL},
    {"untrack", untrack, METH_VARARGS, NULL},
    {"alloc", alloc, METH_VARARGS, NULL},
    {"release", release, METH_VARARGS, NULL},
    {"hammer", hammer, METH_VARARGS, NULL},
    {"track_released", track_released, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, STR(MODNAME), NULL, -1, methods};

PyMODINIT_FUNC CAT(PyInit_, MODNAME)(void)
{
    return PyModule_Create(&module);
}
