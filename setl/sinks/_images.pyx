# cython: language_level=3, boundscheck=True, wraparound=False
"""Compiled scans of a batch's row images (`setl.sinks.sql_rows`): asked of every batch a SQL target
prepares, they walk each image's dict in C where the Python forms pay a call per value.

Each function gives what its Python form in `setl.sinks.sql_rows` gives, for any input
(`tests/sinks/test_sql_rows.py` compares them): an image that is not a dict (or a subclass, as
`setl.model.PartialImage`) is read through its mapping methods, as there."""

from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from cpython.ref cimport Py_TYPE


cdef bint _dict_holds(dict image, type kind):
    cdef Py_ssize_t pos = 0
    cdef PyObject* key
    cdef PyObject* value
    while PyDict_Next(image, &pos, &key, &value):
        if <PyObject*>Py_TYPE(<object>value) == <PyObject*>kind:
            return True
    return False


cdef bint _image_holds(object image, type kind):
    if image is None:
        return False
    if isinstance(image, dict):
        return _dict_holds(<dict>image, kind)
    return kind in map(type, image.values())


def holds_type(object changes, type row_change, type kind):
    """Whether a value of exactly type `kind` is in the before or after image of one of `changes`
    whose type is exactly `row_change` (other changes have no images)."""
    for change in changes:
        if type(change) is not row_change:
            continue
        if _image_holds(change.before, kind) or _image_holds(change.after, kind):
            return True
    return False


cdef bint _same_order(dict image, tuple shape):
    """Whether `image`'s keys are `shape`, in that order."""
    cdef Py_ssize_t pos = 0, i = 0
    cdef PyObject* key
    cdef PyObject* value
    if len(image) != len(shape):
        return False
    while PyDict_Next(image, &pos, &key, &value):
        if key != <PyObject*>shape[i] and not (<object>key == shape[i]):
            return False
        i += 1
    return True


def one_shape(list images):
    """The column list (keys in order) every image of `images` shares; None when they do not all
    share one, or `images` is empty."""
    if not images:
        return None
    cdef tuple shape = tuple(images[0])
    for image in images:
        if isinstance(image, dict):
            if not _same_order(<dict>image, shape):
                return None
        elif tuple(image) != shape:
            return None
    return shape


def only_reads(object changes, type row_change, object read):
    """Whether every one of `changes` is of type exactly `row_change` with op `read`."""
    for change in changes:
        if type(change) is not row_change or change.op is not read:
            return False
    return True


def holds_one_of(list rows, frozenset kinds):
    """Whether a value of a type in `kinds` (exact types) is in one of `rows` (tuples or lists)."""
    cdef Py_ssize_t i, n
    cdef object row
    for row in rows:
        if type(row) is tuple:
            n = len(<tuple>row)
            for i in range(n):
                if type((<tuple>row)[i]) in kinds:
                    return True
        elif not kinds.isdisjoint(map(type, row)):
            return True
    return False
