/* A test extension that calls the C allocator and mmap itself (tests/test_native.py).
 *
 * Every function takes and returns block addresses as integers, so the tests drive each
 * allocation function, with the GIL held or released, and from a thread with no Python state.
 * Built with -DMODNAME=<name> so several copies can be loaded side by side.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define STR2(x) #x
#define STR(x) STR2(x)
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

typedef unsigned long long addr_t;

static PyObject *ret(void *p) { return PyLong_FromUnsignedLongLong((addr_t)(uintptr_t)p); }

static PyObject *do_malloc(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    void *p = malloc((size_t)n);
    if (p) memset(p, 1, (size_t)n);
    return ret(p);
}

static PyObject *do_calloc(PyObject *self, PyObject *args) {
    Py_ssize_t n, m;
    if (!PyArg_ParseTuple(args, "nn", &n, &m)) return NULL;
    return ret(calloc((size_t)n, (size_t)m));
}

static PyObject *do_realloc(PyObject *self, PyObject *args) {
    addr_t p;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Kn", &p, &n)) return NULL;
    return ret(realloc((void *)(uintptr_t)p, (size_t)n));
}

static PyObject *do_free(PyObject *self, PyObject *args) {
    addr_t p;
    if (!PyArg_ParseTuple(args, "K", &p)) return NULL;
    free((void *)(uintptr_t)p);
    Py_RETURN_NONE;
}

static PyObject *do_posix_memalign(PyObject *self, PyObject *args) {
    Py_ssize_t align, n;
    if (!PyArg_ParseTuple(args, "nn", &align, &n)) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, (size_t)align, (size_t)n) != 0) p = NULL;
    return ret(p);
}

static PyObject *do_aligned_alloc(PyObject *self, PyObject *args) {
    Py_ssize_t align, n;
    if (!PyArg_ParseTuple(args, "nn", &align, &n)) return NULL;
    return ret(aligned_alloc((size_t)align, (size_t)n));
}

static PyObject *do_memalign(PyObject *self, PyObject *args) {
    Py_ssize_t align, n;
    if (!PyArg_ParseTuple(args, "nn", &align, &n)) return NULL;
    return ret(memalign((size_t)align, (size_t)n));
}

static PyObject *do_valloc(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    return ret(valloc((size_t)n));
}

static PyObject *do_mmap(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    void *p = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return ret(p == MAP_FAILED ? NULL : p);
}

static PyObject *do_mmap_file(PyObject *self, PyObject *args) {
    int fd;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "in", &fd, &n)) return NULL;
    void *p = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fd, 0);
    return ret(p == MAP_FAILED ? NULL : p);
}

static PyObject *do_munmap(PyObject *self, PyObject *args) {
    addr_t p;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Kn", &p, &n)) return NULL;
    return PyLong_FromLong(munmap((void *)(uintptr_t)p, (size_t)n));
}

static PyObject *do_mremap(PyObject *self, PyObject *args) {
    addr_t p;
    Py_ssize_t old, n;
    if (!PyArg_ParseTuple(args, "Knn", &p, &old, &n)) return NULL;
    void *q = mremap((void *)(uintptr_t)p, (size_t)old, (size_t)n, MREMAP_MAYMOVE);
    return ret(q == MAP_FAILED ? NULL : q);
}

/* malloc with the GIL released: the thread has a Python stack but does not hold the GIL. */
static PyObject *malloc_nogil(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    void *p;
    Py_BEGIN_ALLOW_THREADS
    p = malloc((size_t)n);
    Py_END_ALLOW_THREADS
    return ret(p);
}

static void *thread_body(void *arg) { return malloc((size_t)(uintptr_t)arg); }

/* malloc from a thread that never had a Python thread state. */
static PyObject *malloc_in_thread(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    pthread_t t;
    void *p = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pthread_create(&t, NULL, thread_body, (void *)(uintptr_t)n);
    if (rc == 0) pthread_join(t, &p);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_Format(PyExc_OSError, "pthread_create: %d", rc);
    return ret(p);
}

/* malloc/free pairs (and a realloc) for *seconds* with the GIL released: another thread's
 * stop() runs while this one is inside the hooks. Returns the number of rounds. */
static PyObject *churn(PyObject *self, PyObject *args) {
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds)) return NULL;
    long rounds = 0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (int i = 0; i < 1000; i++) {
            void *p = malloc(64 + (size_t)(i % 200));
            p = realloc(p, 300);
            free(p);
        }
        rounds++;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rounds);
}

/* The block's size as PyTraceMalloc_Track reports it (numpy's pattern on 3.9-3.11). */
static PyObject *track(PyObject *self, PyObject *args) {
    unsigned int domain;
    addr_t p;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "IKn", &domain, &p, &n)) return NULL;
    return PyLong_FromLong(PyTraceMalloc_Track(domain, (uintptr_t)p, (size_t)n));
}

static PyObject *untrack(PyObject *self, PyObject *args) {
    unsigned int domain;
    addr_t p;
    if (!PyArg_ParseTuple(args, "IK", &domain, &p)) return NULL;
    return PyLong_FromLong(PyTraceMalloc_Untrack(domain, (uintptr_t)p));
}

/* A Python object allocated the Python way, then given back: never in the native domain. */
static PyObject *pymem_roundtrip(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    void *p = PyMem_RawMalloc((size_t)n);
    return ret(p);
}

/* Allocator pointers that the loader fills from data relocations (R_X86_64_64 against malloc,
 * free...), as libxml2 keeps xmlMalloc/xmlRealloc/xmlFree: a writable table (.data.rel), a
 * read-only one (.data.rel.ro, under RELRO after loading) and an address computed from
 * malloc's (a non-zero addend: never a pointer to rewrite). volatile: every call reads the
 * variable, as a call through a pointer another file may change does. */
typedef void *(*malloc_fn)(size_t);
static malloc_fn volatile data_malloc = malloc;
static void *(*volatile data_calloc)(size_t, size_t) = calloc;
static void *(*volatile data_realloc)(void *, size_t) = realloc;
static void (*volatile data_free)(void *) = free;
#define RELRO __attribute__((section(".data.rel.ro")))
static malloc_fn const volatile ro_malloc RELRO = malloc;
static void (*const volatile ro_free)(void *) RELRO = free;
static char *volatile offset_malloc = (char *)malloc + 16;

/* An allocator of the library's own, installed over data_malloc by set_data_malloc. */
static void *own_malloc(size_t n) { return malloc(n); }

static PyObject *do_data_malloc(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    int ro = 0;
    if (!PyArg_ParseTuple(args, "n|p", &n, &ro)) return NULL;
    return ret((ro ? ro_malloc : data_malloc)((size_t)n));
}

static PyObject *do_data_calloc(PyObject *self, PyObject *args) {
    Py_ssize_t n, m;
    if (!PyArg_ParseTuple(args, "nn", &n, &m)) return NULL;
    return ret(data_calloc((size_t)n, (size_t)m));
}

static PyObject *do_data_realloc(PyObject *self, PyObject *args) {
    addr_t p;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Kn", &p, &n)) return NULL;
    return ret(data_realloc((void *)(uintptr_t)p, (size_t)n));
}

static PyObject *do_data_free(PyObject *self, PyObject *args) {
    addr_t p;
    int ro = 0;
    if (!PyArg_ParseTuple(args, "K|p", &p, &ro)) return NULL;
    (ro ? ro_free : data_free)((void *)(uintptr_t)p);
    Py_RETURN_NONE;
}

/* The pointers' values, by name ("offset_malloc" is malloc's address + 16). */
static PyObject *data_pointers(PyObject *self, PyObject *args) {
    return Py_BuildValue("{sKsKsKsKsKsKsKsK}", "malloc", (addr_t)(uintptr_t)data_malloc,
                         "calloc", (addr_t)(uintptr_t)data_calloc, "realloc",
                         (addr_t)(uintptr_t)data_realloc, "free", (addr_t)(uintptr_t)data_free,
                         "ro_malloc", (addr_t)(uintptr_t)ro_malloc, "ro_free",
                         (addr_t)(uintptr_t)ro_free, "offset_malloc",
                         (addr_t)(uintptr_t)offset_malloc, "own_malloc",
                         (addr_t)(uintptr_t)own_malloc);
}

/* Installs an allocator over data_malloc (0: the library's own); returns the previous one. */
static PyObject *set_data_malloc(PyObject *self, PyObject *args) {
    addr_t p;
    if (!PyArg_ParseTuple(args, "K", &p)) return NULL;
    addr_t was = (addr_t)(uintptr_t)data_malloc;
    data_malloc = p ? (malloc_fn)(uintptr_t)p : own_malloc;
    return PyLong_FromUnsignedLongLong(was);
}

static PyMethodDef methods[] = {
    {"malloc", do_malloc, METH_VARARGS, NULL},
    {"calloc", do_calloc, METH_VARARGS, NULL},
    {"realloc", do_realloc, METH_VARARGS, NULL},
    {"free", do_free, METH_VARARGS, NULL},
    {"posix_memalign", do_posix_memalign, METH_VARARGS, NULL},
    {"aligned_alloc", do_aligned_alloc, METH_VARARGS, NULL},
    {"memalign", do_memalign, METH_VARARGS, NULL},
    {"valloc", do_valloc, METH_VARARGS, NULL},
    {"mmap", do_mmap, METH_VARARGS, NULL},
    {"mmap_file", do_mmap_file, METH_VARARGS, NULL},
    {"munmap", do_munmap, METH_VARARGS, NULL},
    {"mremap", do_mremap, METH_VARARGS, NULL},
    {"malloc_nogil", malloc_nogil, METH_VARARGS, NULL},
    {"malloc_in_thread", malloc_in_thread, METH_VARARGS, NULL},
    {"churn", churn, METH_VARARGS, NULL},
    {"track", track, METH_VARARGS, NULL},
    {"untrack", untrack, METH_VARARGS, NULL},
    {"pymem_raw_malloc", pymem_roundtrip, METH_VARARGS, NULL},
    {"data_malloc", do_data_malloc, METH_VARARGS, NULL},
    {"data_calloc", do_data_calloc, METH_VARARGS, NULL},
    {"data_realloc", do_data_realloc, METH_VARARGS, NULL},
    {"data_free", do_data_free, METH_VARARGS, NULL},
    {"data_pointers", data_pointers, METH_NOARGS, NULL},
    {"set_data_malloc", set_data_malloc, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, STR(MODNAME), NULL, -1, methods};

PyMODINIT_FUNC CAT(PyInit_, MODNAME)(void) { return PyModule_Create(&module); }
