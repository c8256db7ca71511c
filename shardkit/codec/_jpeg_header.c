/* A JPEG's frame header (SOF), read without decoding: jpeg_header.jpeg_frame's walk in C. Every
 * image a GPU-route worker ships goes through it, so it is kept out of Python; it needs no
 * libjpeg.
 *
 * frame(data) -> tuple[int, int, int, int, int] | None
 *   (marker, height, width, components, sampling) of the first frame header after the SOI (the
 *   caller has checked the SOI), exactly as jpeg_frame answers: None where the markers before it
 *   are malformed, an EOI or SOS comes first, or the data ends before it; sampling 0 where the
 *   data ends before the first component's sampling factors.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Start-of-frame markers: 0xC0-0xCF but DHT (0xC4), JPG (0xC8) and DAC (0xCC). */
static int sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

static PyObject *frame(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *b = view.buf;
    Py_ssize_t n = view.len, i = 2;
    PyObject *out = NULL;
    while (i + 3 < n) {
        if (b[i] != 0xFF)
            break;
        uint8_t m = b[i + 1];
        if (m == 0xFF) { /* fill byte */
            i += 1;
        } else if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { /* markers without a length */
            i += 2;
        } else if (m == 0xD9 || m == 0xDA) { /* EOI/SOS before any frame */
            break;
        } else if (sof(m)) {
            if (i + 9 >= n)
                break;
            int sampling = i + 11 < n ? b[i + 11] : 0;
            out = Py_BuildValue("(iiiii)", m, (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9],
                                sampling);
            break;
        } else {
            i += 2 + ((b[i + 2] << 8) | b[i + 3]);
        }
    }
    PyBuffer_Release(&view);
    if (out == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return out;
}

static PyMethodDef methods[] = {
    {"frame", frame, METH_O, "frame(data) -> (marker, height, width, components, sampling), or None (see module)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_header",
                                    "A JPEG's frame header, read without decoding (see jpeg_header.jpeg_frame).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__jpeg_header(void) { return PyModule_Create(&module); }
