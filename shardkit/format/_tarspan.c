/* One sample span (its bytes as read at a known offset) parsed for the common case: plain
 * ustar headers of regular files, no extension headers, member names "<key>.<ext>" of one key.
 * tarread.parse_span calls it first on every sample the loader reads and falls back to its
 * Python parser, which has the full rules and the error messages, whenever this returns None.
 *
 * sample(data) -> tuple[str, dict[str, bytes]] | None
 * members(data) -> tuple[str, dict[str, tuple[int, int]]] | None
 *   (key, {ext: member bytes}), or for members() (key, {ext: (start, size)}) where each member
 *   lies in data (nothing copied), by tarread._parse_span's rules on names and keys: the name with
 *   its ustar prefix joined ("p/n"), UTF-8; the key is the name up to the first dot of its last
 *   component. Stops at a zero block or at the end of the data, as the Python parser does.
 *   None for anything else: a header whose checksum does not match or whose numeric fields
 *   are not strict octal (or base-256), a type other than a regular file ('0', '\0', '7'), a
 *   member over the size limit, data or a header cut off by the end of the span, a name that is
 *   not UTF-8, absolute, with a ".." component or not "<key>.<ext>", members of two keys, a
 *   field twice, no member at all.
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

/* The member name of a header, its ustar prefix joined ("p/n"): written to out (at least
 * 256 bytes), its length returned. */
static Py_ssize_t header_name(const uint8_t *block, char *out) {
    Py_ssize_t name_len = text_length(block, 100), prefix_len = 0;
    if (memcmp(block + 257, "ustar", 5) == 0 && (prefix_len = text_length(block + 345, 155)) > 0) {
        memcpy(out, block + 345, (size_t)prefix_len);
        out[prefix_len++] = '/';
    }
    memcpy(out + prefix_len, block, (size_t)name_len);
    return prefix_len + name_len;
}

/* Where a member name's key ends (its extension follows the dot there), or -1 where
 * tarread refuses the name: absolute, a ".." component, or a last component that is not
 * "<key>.<ext>" with both parts non-empty. The bytes '/' and '.' never occur inside a UTF-8
 * sequence, so these byte positions are the decoded name's. */
static Py_ssize_t key_end(const char *name, Py_ssize_t n) {
    if (n > 0 && name[0] == '/')
        return -1;
    Py_ssize_t part = 0; /* start of the current component */
    for (Py_ssize_t i = 0; i <= n; i++)
        if (i == n || name[i] == '/') {
            if (i - part == 2 && name[part] == '.' && name[part + 1] == '.')
                return -1;
            part = i + 1;
        }
    Py_ssize_t last = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (name[i] == '/')
            last = i + 1;
    const char *dot = memchr(name + last, '.', (size_t)(n - last));
    if (dot == NULL || dot == name + last || dot == name + n - 1)
        return -1;
    return dot - name;
}

/* Both entry points: members as bytes (copied), or where they lie in the span (offsets). */
static PyObject *parse(PyObject *arg, int offsets) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *data = view.buf;
    Py_ssize_t length = view.len, pos = 0;
    char name[256], key[256];
    Py_ssize_t key_len = -1;
    PyObject *fields = PyDict_New(), *key_str = NULL;
    if (fields == NULL)
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
        Py_ssize_t n = header_name(block, name), end = key_end(name, n);
        if (end < 0)
            goto fallback;
        if (key_len < 0) {
            memcpy(key, name, (size_t)end);
            key_len = end;
        } else if (end != key_len || memcmp(key, name, (size_t)end) != 0) {
            goto fallback;
        }
        PyObject *ext = PyUnicode_DecodeUTF8(name + end + 1, n - end - 1, NULL);
        if (ext == NULL)
            goto fallback; /* not UTF-8 */
        int twice = PyDict_Contains(fields, ext);
        PyObject *member = twice ? NULL
                           : offsets ? Py_BuildValue("(nn)", start, (Py_ssize_t)size)
                                     : PyBytes_FromStringAndSize((const char *)data + start, (Py_ssize_t)size);
        int stored_ok = member != NULL && PyDict_SetItem(fields, ext, member) == 0;
        Py_DECREF(ext);
        Py_XDECREF(member);
        if (twice > 0)
            goto fallback;
        if (!stored_ok)
            goto fail;
        Py_ssize_t padded = start + (Py_ssize_t)size + (Py_ssize_t)((BLOCK - size % BLOCK) % BLOCK);
        pos = padded < length ? padded : length;
    }
    if (key_len < 0) /* no member: the Python parser names the empty span */
        goto fallback;
    key_str = PyUnicode_DecodeUTF8(key, key_len, NULL);
    if (key_str == NULL)
        goto fallback;
    PyBuffer_Release(&view);
    return Py_BuildValue("(NN)", key_str, fields);
fallback:
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        goto fail;
    PyErr_Clear();
    Py_DECREF(fields);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(fields);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *sample(PyObject *self, PyObject *arg) { return parse(arg, 0); }

static PyObject *members(PyObject *self, PyObject *arg) { return parse(arg, 1); }

static PyMethodDef methods[] = {
    {"sample", sample, METH_O, "sample(data) -> (key, {ext: bytes}), or None (see module)"},
    {"members", members, METH_O, "members(data) -> (key, {ext: (start, size)}), or None (see module)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tarspan",
                                    "One plain tar sample span parsed (see tarread.parse_span).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__tarspan(void) { return PyModule_Create(&module); }
