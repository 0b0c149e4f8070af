# cython: language_level=3, boundscheck=False, wraparound=False
"""A chunk of snapshot rows as ``LOAD DATA`` input in C (`setl.sinks.mysql_sql.load_data_text`):
text and plain integers (nearly every value of a chunk) written straight into one buffer, escaped
byte by byte in their UTF-8 form; every other value formatted by the pure path's `other` (passed
in), so that both give the same bytes, or None, for the same rows."""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.unicode cimport PyUnicode_CheckExact
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memchr, memcpy

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL


cdef struct Buffer:
    char* data
    Py_ssize_t size
    Py_ssize_t capacity


cdef int _reserve(Buffer* buf, Py_ssize_t more) except -1:
    cdef Py_ssize_t wanted = buf.size + more
    cdef Py_ssize_t capacity = buf.capacity
    cdef char* grown
    if wanted <= capacity:
        return 0
    while capacity < wanted:
        capacity = capacity * 2 if capacity else 1 << 16
    grown = <char*>realloc(buf.data, capacity)
    if grown == NULL:
        raise MemoryError()
    buf.data, buf.capacity = grown, capacity
    return 0


cdef inline bint _plain(const char* p, Py_ssize_t n) nogil:
    """Whether none of the `n` bytes at `p` is one the format escapes (memchr: the C library's
    vectorised scan, as Python's own ``in`` does)."""
    return (memchr(p, 92, n) == NULL and memchr(p, 9, n) == NULL and memchr(p, 10, n) == NULL
            and memchr(p, 13, n) == NULL and memchr(p, 0, n) == NULL)


cdef int _text(Buffer* buf, const char* p, Py_ssize_t n) except -1:
    """`n` UTF-8 bytes at `p`, with backslash, tab, newline, carriage return and NUL escaped (no
    byte of a multi-byte UTF-8 sequence is below 0x80, so byte by byte is character by character)."""
    cdef Py_ssize_t i
    cdef char c
    if _plain(p, n):
        return _raw(buf, p, n)
    _reserve(buf, 2 * n)
    cdef char* out = buf.data + buf.size
    for i in range(n):
        c = p[i]
        if c == 92:  # backslash
            out[0] = 92; out[1] = 92; out += 2
        elif c == 9:
            out[0] = 92; out[1] = 116; out += 2  # \t
        elif c == 10:
            out[0] = 92; out[1] = 110; out += 2  # \n
        elif c == 13:
            out[0] = 92; out[1] = 114; out += 2  # \r
        elif c == 0:
            out[0] = 92; out[1] = 48; out += 2  # \0
        else:
            out[0] = c; out += 1
    buf.size = out - buf.data
    return 0


cdef int _raw(Buffer* buf, const char* p, Py_ssize_t n) except -1:
    _reserve(buf, n)
    memcpy(buf.data + buf.size, p, n)
    buf.size += n
    return 0


cdef int _integer(Buffer* buf, long long value) except -1:
    cdef char digits[24]
    cdef int i = 24
    cdef unsigned long long magnitude = <unsigned long long>(-(value + 1)) + 1 if value < 0 else <unsigned long long>value
    while True:
        i -= 1
        digits[i] = 48 + <char>(magnitude % 10)
        magnitude //= 10
        if magnitude == 0:
            break
    if value < 0:
        i -= 1
        digits[i] = 45  # '-'
    return _raw(buf, digits + i, 24 - i)


def load_data_text(images, other):
    """`images` as `setl.sinks.mysql_sql.load_data_text` writes them; `other(value)` is the text of
    a value that is neither text, a plain int nor None (None: the value goes by a statement)."""
    cdef Buffer buf
    cdef Py_ssize_t n, start
    cdef const char* p
    cdef int overflow
    cdef long long number
    cdef bint first
    buf.data, buf.size, buf.capacity = NULL, 0, 0
    try:
        for image in images:
            start = buf.size
            first = True
            values = (<dict>image).values() if type(image) is dict else image.values()
            for value in values:
                if not first:
                    _raw(&buf, b"\t", 1)
                first = False
                if PyUnicode_CheckExact(value):
                    try:
                        p = PyUnicode_AsUTF8AndSize(value, &n)
                    except UnicodeEncodeError:  # a lone surrogate: left to a statement
                        return None
                    _text(&buf, p, n)
                elif PyLong_CheckExact(value):
                    number = PyLong_AsLongLongAndOverflow(value, &overflow)
                    if overflow:
                        text = str(value).encode("ascii")
                        _raw(&buf, text, len(text))
                    else:
                        _integer(&buf, number)
                elif value is None:
                    _raw(&buf, b"\\N", 2)
                else:
                    found = other(value)
                    if found is None:
                        return None
                    p = PyUnicode_AsUTF8AndSize(found, &n)  # ASCII: dates, numbers
                    _raw(&buf, p, n)
            if buf.size == start:
                return None  # one column holding '' (or none): an empty line
            _raw(&buf, b"\n", 1)
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        free(buf.data)
