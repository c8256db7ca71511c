/* The members of one sample span (its bytes as read at a known offset), for the common case:
 * plain ustar headers of regular files, no extension headers. tarread.parse_span calls it
 * first on every sample the loader reads and falls back to its Python parser, which has the
 * full rules and the error messages, whenever this returns None.
 *
 * members(data) -> list[tuple[bytes, int, int]] | None
 *   One (name, data_offset, size) per member, the name with its ustar prefix joined ("p/n"),
 *   undecoded. Stops at a zero block or at the end of the data, as the Python parser does.
 *   None for anything else: a header whose checksum does not match or whose numeric fields
 *   are not strict octal (or base-256), a type other than a regular file ('0', '\0', '7'), a
 *   member over the size limit, data or a header cut off by the end of the span.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 512
#define MAX_MEMBER ((int64_t)1 << 30)

/* A numeric header field as tarread._number parses octal text: spaces before, spaces or NULs
 * after, nothing but octal digits between (none: 0). Returns -1 where that parser would
 * fail or where the field is base-256 (left to the Python parser). */
static int64_t octal(const uint8_t *field, Py_ssize_t n) {
    if (field[0] == 0x80 || field[0] == 0xff)
        return -1;
    Py_ssize_t end = n;
    while (end > 0 && (field[end - 1] == ' ' || field[end - 1] == '\0'))
        end--;
    Py_ssize_t start = 0;
    while (start < end && field[start] == ' ')
        start++;
    if (end - start > 21) /* more digits than an int64 holds: not a size of ours */
        return -1;
    int64_t value = 0;
    for (Py_ssize_t i = start; i < end; i++) {
        if (field[i] < '0' || field[i] > '7')
            return -1;
        value = value * 8 + (field[i] - '0');
    }
    return value;
}

static int zero_block(const uint8_t *block) {
    for (int i = 0; i < BLOCK; i++)
        if (block[i])
            return 0;
    return 1;
}

static Py_ssize_t text_length(const uint8_t *field, Py_ssize_t n) {
    const uint8_t *nul = memchr(field, 0, (size_t)n);
    return nul ? nul - field : n;
}

static PyObject *header_name(const uint8_t *block) {
    Py_ssize_t name_len = text_length(block, 100);
    if (memcmp(block + 257, "ustar", 5) == 0) {
        Py_ssize_t prefix_len = text_length(block + 345, 155);
        if (prefix_len > 0) {
            PyObject *name = PyBytes_FromStringAndSize(NULL, prefix_len + 1 + name_len);
            if (name == NULL)
                return NULL;
            char *out = PyBytes_AS_STRING(name);
            memcpy(out, block + 345, (size_t)prefix_len);
            out[prefix_len] = '/';
            memcpy(out + prefix_len + 1, block, (size_t)name_len);
            return name;
        }
    }
    return PyBytes_FromStringAndSize((const char *)block, name_len);
}

static PyObject *members(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *data = view.buf;
    Py_ssize_t length = view.len, pos = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto fail;
    while (pos < length) {
        if (length - pos < BLOCK)
            goto fallback;
        const uint8_t *block = data + pos;
        if (zero_block(block))
            break;
        int64_t stored = octal(block + 148, 8);
        if (stored < 0)
            goto fallback;
        int64_t computed = 8 * ' ';
        for (int i = 0; i < BLOCK; i++)
            if (i < 148 || i >= 156)
                computed += block[i];
        if (stored != computed)
            goto fallback;
        uint8_t kind = block[156];
        if (kind != '0' && kind != '\0' && kind != '7')
            goto fallback;
        int64_t size = octal(block + 124, 12);
        if (size < 0 || size > MAX_MEMBER)
            goto fallback;
        Py_ssize_t start = pos + BLOCK;
        if ((int64_t)(length - start) < size)
            goto fallback;
        PyObject *name = header_name(block);
        if (name == NULL)
            goto fail;
        PyObject *item = Py_BuildValue("(Nnn)", name, start, (Py_ssize_t)size);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        Py_ssize_t padded = start + (Py_ssize_t)size + (Py_ssize_t)((BLOCK - size % BLOCK) % BLOCK);
        pos = padded < length ? padded : length;
    }
    PyBuffer_Release(&view);
    return out;
fallback:
    Py_DECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"members", members, METH_O, "members(data) -> list of (name, data_offset, size), or None (see module)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tarspan",
                                    "The plain members of one tar sample span (see tarread.parse_span).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__tarspan(void) { return PyModule_Create(&module); }
