# cython: language_level=3, boundscheck=False, wraparound=False
"""A snapshot chunk's data rows parsed in C (`setl.snapshot.rows`): one text-protocol row packet
into a dict, each value exactly as the Python loop of `rows._DictResult` makes it (PyMySQL's
values: the column's bytes, decoded by its encoding, then its converter), without a bytes object
per value where a value is text or a plain integer."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_Decode, PyUnicode_DecodeUTF8

cdef enum:
    K_BYTES = 0  # the bytes, then the converter if any
    K_INT = 1    # int() of ASCII digits
    K_UTF8 = 2   # decoded as UTF-8, then the converter if any
    K_DECODE = 3  # decoded by the named codec, then the converter if any


cdef object _int(const char* p, Py_ssize_t n):
    """int() of the n bytes at p: in C for up to 18 digits with an optional minus, else by int()."""
    cdef Py_ssize_t i = 0
    cdef long long value = 0
    cdef bint negative = n > 0 and p[0] == 45  # '-'
    if negative:
        i = 1
    if n - i < 1 or n - i > 18:
        return int(PyBytes_FromStringAndSize(p, n))
    while i < n:
        if p[i] < 48 or p[i] > 57:  # not '0' to '9'
            return int(PyBytes_FromStringAndSize(p, n))
        value = value * 10 + (p[i] - 48)
        i += 1
    return -value if negative else value


cdef class RowParser:
    """Built once per result from its (name, encoding, converter) per column, as `rows` prepares
    them (encoding None: the bytes; converter None: no conversion; ``(name, None, int)``: an
    integer column's ASCII digits)."""

    cdef tuple names
    cdef tuple converters
    cdef tuple codecs
    cdef bytes kinds
    cdef Py_ssize_t count

    def __init__(self, fields):
        names, converters, codecs, kinds = [], [], [], []
        for name, encoding, converter in fields:
            names.append(name)
            if encoding is None and converter is int:
                kinds.append(K_INT)
                converter = None
            elif encoding is None:
                kinds.append(K_BYTES)
            elif encoding.replace("-", "").replace("_", "").lower() == "utf8":
                kinds.append(K_UTF8)
            else:
                kinds.append(K_DECODE)
            converters.append(converter)
            codecs.append(encoding.encode("ascii") if encoding is not None else None)
        self.names, self.converters, self.codecs = tuple(names), tuple(converters), tuple(codecs)
        self.kinds = bytes(kinds)
        self.count = len(names)

    def parse(self, bytes data):
        """The row of one data packet's payload."""
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef const char* c = PyBytes_AS_STRING(data)
        cdef const unsigned char* kinds = <const unsigned char*>PyBytes_AS_STRING(self.kinds)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t pos = 0, n = 0, i
        cdef unsigned char first, kind
        cdef dict row = {}
        cdef object value, converter
        for i in range(self.count):
            if pos >= size:
                raise ValueError(f"a row packet of {size} bytes ends before its column {i + 1}")
            first = p[pos]
            if first < 251:
                n = first
                pos += 1
            elif first == 251:  # NULL
                row[self.names[i]] = None
                pos += 1
                continue
            elif first == 252:
                if pos + 3 > size:
                    raise ValueError("a row packet ends inside a length")
                n = p[pos + 1] | (p[pos + 2] << 8)
                pos += 3
            elif first == 253:
                if pos + 4 > size:
                    raise ValueError("a row packet ends inside a length")
                n = p[pos + 1] | (p[pos + 2] << 8) | (p[pos + 3] << 16)
                pos += 4
            else:
                if pos + 9 > size:
                    raise ValueError("a row packet ends inside a length")
                n = <Py_ssize_t>int.from_bytes(data[pos + 1:pos + 9], "little")
                pos += 9
            if n < 0 or n > size - pos:  # an 8-byte length of 2**63 or more comes out negative
                raise ValueError(f"a value of {n} bytes runs past its row packet's {size} bytes")
            kind = kinds[i]
            if kind == K_INT:
                value = _int(c + pos, n)
            else:
                if kind == K_UTF8:
                    value = PyUnicode_DecodeUTF8(c + pos, n, NULL)
                elif kind == K_DECODE:
                    value = PyUnicode_Decode(c + pos, n, PyBytes_AS_STRING(self.codecs[i]), NULL)
                else:
                    value = PyBytes_FromStringAndSize(c + pos, n)
                converter = self.converters[i]
                if converter is not None:
                    value = converter(value)
            row[self.names[i]] = value
            pos += n
        return row
