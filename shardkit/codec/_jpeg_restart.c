/* Restart-indexed JPEGs: lossless re-encoding with a restart marker every few MCUs, and cutting
 * a sub-image out of such a JPEG without decoding anything.
 *
 * A restart marker resets the entropy decoder (bit buffer and DC predictions), so the entropy-coded
 * data between two markers decodes on its own. When every MCU row holds a whole number of restart
 * intervals, the intervals covering a rectangle can be copied, renumbered, behind the original
 * headers with a smaller frame size: a valid JPEG of that rectangle, with exactly the DCT
 * coefficients of the original. A decoder then pays for the rectangle, not for the whole image
 * (libjpeg must entropy-decode every row above a region and every column left and right of it).
 *
 * transcode(data, max_interval) -> bytes | None
 *   Losslessly rewrite a YCbCr or grayscale JPEG (baseline or progressive) as a single-scan
 *   sequential JPEG with optimised Huffman tables and a restart interval of k MCUs, k the largest
 *   divisor of the MCUs per row that is <= max_interval. APPn and COM markers are kept.
 *   None for other colour spaces (CMYK, RGB, ...); ValueError (libjpeg's message) for data
 *   libjpeg cannot read or warns about (corrupt or truncated).
 *
 * cut(data, top, left, height, width, margin) -> (bytes, y0, x0, sub_height, sub_width) | None
 *   A JPEG of the restart intervals covering the box grown by `margin` pixels each side (clipped
 *   to the image), its top-left corner in the original and its size. None when `data` is not a
 *   restart-indexed sequential JPEG this can cut, or its scan does not have the expected markers
 *   (the caller decodes the original, which decides whether it is corrupt).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
#include "_jpeg_errors.h"


static int is_jfif(jpeg_saved_marker_ptr m) {
    return m->marker == JPEG_APP0 && m->data_length >= 5 && memcmp(m->data, "JFIF", 5) == 0;
}

static int is_adobe(jpeg_saved_marker_ptr m) {
    return m->marker == JPEG_APP0 + 14 && m->data_length >= 5 && memcmp(m->data, "Adobe", 5) == 0;
}

/* A destination that grows one malloc'd buffer this module owns (jpeg_mem_dest frees and replaces
 * its buffer behind the caller's back as it grows, which an error path cannot clean up safely). */
struct growing_dest {
    struct jpeg_destination_mgr pub;
    unsigned char *buffer;
    size_t size;
};

static void dest_init(j_compress_ptr cinfo) { (void)cinfo; }

static boolean dest_grow(j_compress_ptr cinfo) {
    struct growing_dest *d = (struct growing_dest *)cinfo->dest;
    unsigned char *grown = realloc(d->buffer, d->size * 2);
    if (grown == NULL) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 0);
    d->pub.next_output_byte = grown + d->size;
    d->pub.free_in_buffer = d->size;
    d->buffer = grown;
    d->size *= 2;
    return TRUE;
}

static void dest_term(j_compress_ptr cinfo) { (void)cinfo; }

static PyObject *transcode(PyObject *self, PyObject *args) {
    Py_buffer data;
    int max_interval;
    if (!PyArg_ParseTuple(args, "y*i", &data, &max_interval)) return NULL;
    if (max_interval < 1) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "max_interval must be >= 1");
        return NULL;
    }
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    struct error_manager err;
    struct growing_dest out = {{0}, NULL, 0};
    volatile int dst_created = 0;
    src.err = errors_init(&err);
    dst.err = &err.pub;
    if (setjmp(err.jump)) {
        if (dst_created) jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        free(out.buffer);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, err.message);
        return NULL;
    }
    jpeg_create_decompress(&src);
    jpeg_mem_src(&src, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (int i = 0; i < 16; i++) jpeg_save_markers(&src, JPEG_APP0 + i, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    int gray = src.jpeg_color_space == JCS_GRAYSCALE && src.num_components == 1;
    int ycc = src.jpeg_color_space == JCS_YCbCr && src.num_components == 3;
    if (!gray && !ycc) {  /* CMYK, YCCK, RGB...: left as they are */
        jpeg_destroy_decompress(&src);
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&src);
    if (err.pub.num_warnings > 0) {
        snprintf(err.message, sizeof err.message, "corrupt JPEG data (%s)", err.warning);
        longjmp(err.jump, 1);
    }
    jpeg_create_compress(&dst);
    dst_created = 1;
    out.size = (size_t)data.len + 65536;
    out.buffer = malloc(out.size);
    if (out.buffer == NULL) ERREXIT1(&dst, JERR_OUT_OF_MEMORY, 0);
    out.pub.init_destination = dest_init;
    out.pub.empty_output_buffer = dest_grow;
    out.pub.term_destination = dest_term;
    out.pub.next_output_byte = out.buffer;
    out.pub.free_in_buffer = out.size;
    dst.dest = &out.pub;
    jpeg_copy_critical_parameters(&src, &dst);
    dst.write_JFIF_header = src.saw_JFIF_marker;  /* add no JFIF segment (EXIF must stay first) */
    dst.optimize_coding = TRUE;
    unsigned int mcu_width = gray ? 8 : 8 * (unsigned int)src.max_h_samp_factor;
    unsigned int mcus_per_row = (src.image_width + mcu_width - 1) / mcu_width;
    unsigned int interval = 1;
    unsigned int largest = (unsigned int)max_interval < mcus_per_row ? (unsigned int)max_interval : mcus_per_row;
    for (unsigned int k = largest; k >= 1; k--) {
        if (mcus_per_row % k == 0) {
            interval = k;
            break;
        }
    }
    dst.restart_interval = interval;
    jpeg_write_coefficients(&dst, coefficients);
    for (jpeg_saved_marker_ptr m = src.marker_list; m != NULL; m = m->next) {
        if ((dst.write_JFIF_header && is_jfif(m)) || (dst.write_Adobe_marker && is_adobe(m))) continue;
        jpeg_write_marker(&dst, m->marker, m->data, m->data_length);
    }
    jpeg_finish_compress(&dst);
    jpeg_finish_decompress(&src);
    PyObject *result = PyBytes_FromStringAndSize((const char *)out.buffer, (Py_ssize_t)(out.size - out.pub.free_in_buffer));
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    free(out.buffer);
    PyBuffer_Release(&data);
    return result;
}

/* What cut() needs to know about a JPEG, from its markers. */
struct layout {
    size_t sof_at;          /* offset of the SOF segment's length field */
    size_t scan_at;         /* first byte of entropy-coded data */
    unsigned int height, width, mcu_w, mcu_h, interval;
};

static unsigned int be16(const unsigned char *p) { return ((unsigned int)p[0] << 8) | p[1]; }

/* 1 when `d` is a single-scan, sequential, restart-indexed JPEG whose MCU rows hold whole intervals. */
static int parse_layout(const unsigned char *d, size_t n, struct layout *out) {
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    size_t p = 2;
    int have_sof = 0, frame_components = 0;
    unsigned int max_h = 1, max_v = 1;
    out->interval = 0;
    while (p + 4 <= n) {
        if (d[p] != 0xFF) return 0;
        unsigned char marker = d[p + 1];
        if (marker == 0xFF) { p++; continue; }  /* fill byte */
        size_t length = be16(d + p + 2);
        if (length < 2 || p + 2 + length > n) return 0;
        const unsigned char *seg = d + p + 4;
        if (marker == 0xC0 || marker == 0xC1) {  /* baseline / extended sequential, Huffman */
            if (length < 8) return 0;
            frame_components = seg[5];
            if (frame_components != 1 && frame_components != 3) return 0;
            if (length < 8 + 3 * (size_t)frame_components) return 0;
            out->sof_at = p + 2;
            out->height = be16(seg + 1);
            out->width = be16(seg + 3);
            for (int c = 0; c < frame_components; c++) {
                unsigned int h = seg[6 + 3 * c + 1] >> 4, v = seg[6 + 3 * c + 1] & 15;
                if (h > max_h) max_h = h;
                if (v > max_v) max_v = v;
            }
            have_sof = 1;
        } else if ((marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC)) {
            return 0;  /* progressive, lossless or arithmetic coded */
        } else if (marker == 0xDD) {
            if (length != 4) return 0;
            out->interval = be16(seg);
        } else if (marker == 0xDA) {
            if (length < 3 || !have_sof || seg[0] != frame_components) return 0;  /* not one interleaved scan */
            out->scan_at = p + 2 + length;
            break;
        }
        p += 2 + length;
    }
    if (!have_sof || out->interval == 0 || out->height == 0 || out->width == 0 || out->scan_at == 0) return 0;
    out->mcu_w = frame_components == 1 ? 8 : 8 * max_h;
    out->mcu_h = frame_components == 1 ? 8 : 8 * max_v;
    unsigned int mcus_per_row = (out->width + out->mcu_w - 1) / out->mcu_w;
    return mcus_per_row % out->interval == 0;
}

static PyObject *cut(PyObject *self, PyObject *args) {
    Py_buffer data;
    int top, left, height, width, margin;
    if (!PyArg_ParseTuple(args, "y*iiiii", &data, &top, &left, &height, &width, &margin)) return NULL;
    const unsigned char *d = (const unsigned char *)data.buf;
    size_t n = (size_t)data.len;
    struct layout L;
    memset(&L, 0, sizeof L);
    if (top < 0 || left < 0 || height <= 0 || width <= 0 || margin < 0 || margin > 65535 || !parse_layout(d, n, &L) ||
        (long long)top + height > (long long)L.height || (long long)left + width > (long long)L.width) {
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    unsigned int seg_w = L.mcu_w * L.interval;
    unsigned int segs_per_row = (L.width + seg_w - 1) / seg_w;
    unsigned int rows = (L.height + L.mcu_h - 1) / L.mcu_h;
    unsigned int y_lo = top > margin ? (unsigned int)(top - margin) : 0;
    unsigned int x_lo = left > margin ? (unsigned int)(left - margin) : 0;
    unsigned int y_hi = (unsigned int)(top + height + margin), x_hi = (unsigned int)(left + width + margin);
    unsigned int r0 = y_lo / L.mcu_h, r1 = (y_hi + L.mcu_h - 1) / L.mcu_h;
    unsigned int s0 = x_lo / seg_w, s1 = (x_hi + seg_w - 1) / seg_w;
    if (r1 > rows) r1 = rows;
    if (s1 > segs_per_row) s1 = segs_per_row;
    /* libjpeg upsamples chroma 2 samples wide or less by replication, not its smoothing filter:
     * a piece that narrow (a last, partial interval) takes the interval before it too */
    if (s0 > 0 && (s1 * seg_w < L.width ? s1 * seg_w : L.width) - s0 * seg_w <= L.mcu_w / 4) s0--;
    unsigned int last = r1 * segs_per_row; /* intervals [0, last) must be located */
    if ((size_t)last > (n - L.scan_at) / 2 + 1) {  /* each needs its 2-byte marker: headers lie */
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }

    /* Start of every interval up to `last`: after the scan start, then after each RSTn marker. */
    size_t *starts = PyMem_Malloc(sizeof(size_t) * (last + 1));
    if (starts == NULL) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    unsigned int found = 1;
    starts[0] = L.scan_at;
    size_t p = L.scan_at;
    while (found <= last) {
        const unsigned char *ff = memchr(d + p, 0xFF, n - p);
        if (ff == NULL || (size_t)(ff - d) + 1 >= n) break;
        size_t at = (size_t)(ff - d);
        unsigned char b = d[at + 1];
        if (b == 0x00 || b == 0xFF) { p = at + 1 + (b == 0x00); continue; }
        if (b >= 0xD0 && b <= 0xD7) {
            if ((unsigned int)(b - 0xD0) != (found - 1) % 8) break;  /* out of sequence: corrupt */
            if (found == last) { starts[found++] = at; break; }  /* end of the last interval we need */
            starts[found++] = at + 2;
            p = at + 2;
            continue;
        }
        if (found == last) starts[found++] = at;  /* EOI (or another marker) ends the scan */
        break;
    }
    if (found <= last) {  /* fewer markers than the frame says: let a full decode judge */
        PyMem_Free(starts);
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    /* ends: interval j ends where j+1 starts minus its 2-byte marker, except the last one found */
    size_t header = L.scan_at, size = header;  /* + each interval and the marker after it (RSTn, EOI) */
    for (unsigned int r = r0; r < r1; r++)
        for (unsigned int s = s0; s < s1; s++) {
            unsigned int j = r * segs_per_row + s;
            size_t end = j + 1 == last ? starts[j + 1] : starts[j + 1] - 2;
            size += end - starts[j] + 2;
        }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (out == NULL) {
        PyMem_Free(starts);
        PyBuffer_Release(&data);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(o, d, header);
    unsigned int sub_h = (r1 * L.mcu_h < L.height ? r1 * L.mcu_h : L.height) - r0 * L.mcu_h;
    unsigned int sub_w = (s1 * seg_w < L.width ? s1 * seg_w : L.width) - s0 * seg_w;
    o[L.sof_at + 3] = (unsigned char)(sub_h >> 8);
    o[L.sof_at + 4] = (unsigned char)(sub_h & 255);
    o[L.sof_at + 5] = (unsigned char)(sub_w >> 8);
    o[L.sof_at + 6] = (unsigned char)(sub_w & 255);
    size_t q = header;
    unsigned int count = 0;
    for (unsigned int r = r0; r < r1; r++)
        for (unsigned int s = s0; s < s1; s++) {
            unsigned int j = r * segs_per_row + s;
            size_t end = j + 1 == last ? starts[j + 1] : starts[j + 1] - 2;
            if (count > 0) {
                o[q++] = 0xFF;
                o[q++] = (unsigned char)(0xD0 + (count - 1) % 8);
            }
            memcpy(o + q, d + starts[j], end - starts[j]);
            q += end - starts[j];
            count++;
        }
    o[q++] = 0xFF;
    o[q++] = 0xD9;
    PyMem_Free(starts);
    PyBuffer_Release(&data);
    if (q != size) {  /* cannot happen: the two passes walk the same intervals */
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "restart cut size mismatch");
        return NULL;
    }
    return Py_BuildValue("Niiii", out, (int)(r0 * L.mcu_h), (int)(s0 * seg_w), (int)sub_h, (int)sub_w);
}

static PyMethodDef methods[] = {
    {"transcode", transcode, METH_VARARGS, "Losslessly re-encode a JPEG with restart markers."},
    {"cut", cut, METH_VARARGS, "Cut the restart intervals covering a box out of a restart-indexed JPEG."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_restart", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg_restart(void) { return PyModule_Create(&module); }
