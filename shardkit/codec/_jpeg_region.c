/* Region-of-interest JPEG decoding with libjpeg(-turbo): decode only the rows and iMCU columns
 * a crop needs. Rows above the crop are skipped (entropy-decoded only: jpeg_skip_scanlines),
 * rows below it are never decoded (jpeg_abort_decompress), columns outside the iMCU-aligned
 * crop are not inverse-transformed or colour-converted (jpeg_crop_scanline). For a
 * RandomResizedCrop this makes decoding cost follow the crop, not the whole image.
 *
 * decode_crop(data, top, left, height, width) -> bytearray
 *   The box's pixels, equal to a full decode's: height rows of width RGB pixels (HWC). CMYK
 *   JPEGs come back as PIL converts them to RGB (see cmyk_to_rgb). Raises ValueError on any
 *   libjpeg error or warning (corrupt data, YCCK, ...); the caller falls back to a full decode,
 *   which decides whether the image is really bad.
 *
 * decode(data) -> (bytearray, height, width, warnings, first_warning) | None
 *   The whole image as RGB rows (HWC), with libjpeg's warnings about corrupt but decodable data
 *   counted and the first one's text (None when there was none) instead of printed. None for a
 *   colour space it leaves to other decoders (CMYK, YCCK); ValueError on a libjpeg error or a
 *   truncated file.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include "_jpeg_errors.h"

#define CONTEXT 2 /* pixels: one chroma sample of 2x-subsampled chroma */
#define CHUNK 16  /* rows per jpeg_read_scanlines call: one row per call costs ~10% more (measured) */

/* A CMYK JPEG as PIL reads it, so that region and full decodes give one image: PIL takes
 * libjpeg's CMYK samples as inverted (Adobe's convention, assumed for every CMYK JPEG) and its
 * convert("RGB") makes each channel k - c * k / 255, where k is the stored K sample and c is 255
 * minus the stored C (M, Y) sample, the division rounded as (t + (t >> 8)) >> 8 of t = c * k + 128.
 * Checked against PIL in tests/codec/test_jpeg_region.py. */
static void cmyk_to_rgb(unsigned char *rgb, const unsigned char *cmyk, size_t pixels) {
    for (size_t i = 0; i < pixels; i++, rgb += 3, cmyk += 4) {
        unsigned k = cmyk[3];
        for (int ch = 0; ch < 3; ch++) {
            unsigned t = (255u - cmyk[ch]) * k + 128u;
            rgb[ch] = (unsigned char)(k - ((t + (t >> 8)) >> 8));
        }
    }
}


static PyObject *decode_crop(PyObject *self, PyObject *args) {
    Py_buffer data;
    int top, left, height, width;
    if (!PyArg_ParseTuple(args, "y*iiii", &data, &top, &left, &height, &width)) return NULL;
    if (top < 0 || left < 0 || height <= 0 || width <= 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "crop box must have top, left >= 0 and a positive size");
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct error_manager err;
    PyObject *volatile out = NULL;
    unsigned char *volatile scratch = NULL;
    cinfo.err = errors_init(&err);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(scratch);
        Py_XDECREF(out);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK;
    if (!cmyk && cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_GRAYSCALE &&
        cinfo.jpeg_color_space != JCS_RGB) {
        strcpy(err.message, "colour space needs a full decode");
        longjmp(err.jump, 1);
    }
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if ((long long)top + height > (long long)cinfo.output_height || (long long)left + width > (long long)cinfo.output_width) {
        strcpy(err.message, "crop box outside the image");
        longjmp(err.jump, 1);
    }
    /* libjpeg decodes whole iMCU columns: [x_offset, x_offset + row_width) covers the box. The
     * region's edges are image edges to the chroma upsampler, so keep CONTEXT pixels beside the
     * box (where the image has them): then the box's pixels equal a full decode's. */
    JDIMENSION x_lo = left > CONTEXT ? (JDIMENSION)(left - CONTEXT) : 0;
    JDIMENSION x_hi = (JDIMENSION)(left + width + CONTEXT) < cinfo.output_width ? (JDIMENSION)(left + width + CONTEXT)
                                                                                 : cinfo.output_width;
    JDIMENSION x_offset = x_lo, row_width = x_hi - x_lo;
    if (x_lo > 0 || x_hi < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x_offset, &row_width);
    else x_offset = 0, row_width = cinfo.output_width;
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)width * 3 * height);
    if (out == NULL) { /* keep Python's MemoryError */
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        return NULL;
    }
    unsigned char *pixels = (unsigned char *)PyByteArray_AS_STRING(out);
    size_t channels = cmyk ? 4 : 3;
    size_t skip = (size_t)(left - (int)x_offset) * channels, box_row = (size_t)width * 3,
           row_bytes = (size_t)row_width * channels;
    if (cmyk || row_width != (JDIMENSION)width) {
        scratch = malloc(row_bytes * CHUNK);
        if (scratch == NULL) {
            strcpy(err.message, "out of memory");
            longjmp(err.jump, 1);
        }
    }
    if (top > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
    JSAMPROW rows[CHUNK];
    for (int done = 0; done < height;) {
        int want = height - done < CHUNK ? height - done : CHUNK;
        for (int i = 0; i < want; i++)
            rows[i] = scratch != NULL ? scratch + (size_t)i * row_bytes : pixels + (size_t)(done + i) * box_row;
        JDIMENSION got = jpeg_read_scanlines(&cinfo, rows, (JDIMENSION)want);
        if (got == 0) {
            strcpy(err.message, "no more scanlines");
            longjmp(err.jump, 1);
        }
        if (cmyk)
            for (JDIMENSION i = 0; i < got; i++)
                cmyk_to_rgb(pixels + (size_t)(done + (int)i) * box_row, scratch + (size_t)i * row_bytes + skip,
                            (size_t)width);
        else if (scratch != NULL)
            for (JDIMENSION i = 0; i < got; i++)
                memcpy(pixels + (size_t)(done + (int)i) * box_row, scratch + (size_t)i * row_bytes + skip, box_row);
        done += (int)got;
    }
    free(scratch);
    scratch = NULL;
    if (err.pub.num_warnings > 0) {
        snprintf(err.message, sizeof err.message, "corrupt JPEG data (%s)", err.warning);
        longjmp(err.jump, 1);
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return out;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    struct jpeg_decompress_struct cinfo;
    struct error_manager err;
    PyObject *volatile out = NULL;
    cinfo.err = errors_init(&err);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        Py_XDECREF(out);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_GRAYSCALE &&
        cinfo.jpeg_color_space != JCS_RGB) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    size_t row_bytes = (size_t)cinfo.output_width * 3;
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(row_bytes * cinfo.output_height));
    if (out == NULL) { /* keep Python's MemoryError */
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        return NULL;
    }
    unsigned char *pixels = (unsigned char *)PyByteArray_AS_STRING(out);
    JSAMPROW rows[CHUNK];
    while (cinfo.output_scanline < cinfo.output_height) {
        JDIMENSION want = cinfo.output_height - cinfo.output_scanline;
        if (want > CHUNK) want = CHUNK;
        for (JDIMENSION i = 0; i < want; i++) rows[i] = pixels + (size_t)(cinfo.output_scanline + i) * row_bytes;
        if (jpeg_read_scanlines(&cinfo, rows, want) == 0) {
            strcpy(err.message, "no more scanlines");
            longjmp(err.jump, 1);
        }
    }
    jpeg_finish_decompress(&cinfo);  /* reads up to EOI: warnings about what precedes it count too */
    int height = (int)cinfo.output_height, width = (int)cinfo.output_width, warnings = (int)err.pub.num_warnings;
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return Py_BuildValue("Niiiz", out, height, width, warnings, err.warning[0] ? err.warning : NULL);
}

static PyMethodDef methods[] = {
    {"decode_crop", decode_crop, METH_VARARGS, "Decode only a crop box of a JPEG to RGB rows."},
    {"decode", decode, METH_VARARGS, "Decode a whole JPEG to RGB rows, with libjpeg's warnings returned."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
