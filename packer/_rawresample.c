/* Batched separable resampling of raw uint8 HWC pixels, the CPU fast path of packer/rawcrop.py.
 *
 * resample(src, out, y_taps, y_weights, x_taps, x_weights, n, h, w, c, out_h, out_w, ky, kx)
 *   src:       n*h*w*c uint8, C-contiguous (n, h, w, c)
 *   out:       n*out_h*out_w*c uint8, writable, C-contiguous (n, out_h, out_w, c)
 *   y_taps:    n*out_h*ky int32 source rows;    y_weights: n*out_h*ky float32
 *   x_taps:    n*out_w*kx int32 source columns; x_weights: n*out_w*kx float32
 *
 * For each sample: rows first (out_h rows of w*c floats, each a weighted sum of ky source rows:
 * a contiguous inner loop the compiler vectorises), then columns (kx taps per output pixel),
 * rounded half up and clamped to 0..255. The taps and weights are computed by rawcrop.resample_taps
 * (Pillow's antialiased triangle filter); this is the same float32 arithmetic as rawcrop's torch
 * kernels, in one pass over each sample instead of a dozen passes over the batch.
 *
 * Why C: the torch kernels spend most of their time in whole-batch temporaries (allocation, page
 * faults, memory passes) for what is ~20 thousand multiply-adds per 32x32 image. Here one
 * sample's intermediate (out_h * w * c floats) stays in L1, and the loop runs without the GIL.
 *
 * Every size is checked against the buffers and every tap against the image, so bad arguments
 * raise ValueError, never read or write out of bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int check_taps(const int32_t *taps, Py_ssize_t count, long limit) {
    for (Py_ssize_t i = 0; i < count; i++) {
        if (taps[i] < 0 || taps[i] >= limit) return 0;
    }
    return 1;
}

static void resample_sample(const uint8_t *src, uint8_t *out, const int32_t *yt, const float *yw,
                            const int32_t *xt, const float *xw, long w, long c, long out_h,
                            long out_w, long ky, long kx, float *rows) {
    const long row_len = w * c;
    for (long y = 0; y < out_h; y++) {
        float *acc = rows + y * row_len;
        for (long j = 0; j < row_len; j++) acc[j] = 0.0f;
        for (long k = 0; k < ky; k++) {
            const float weight = yw[y * ky + k];
            if (weight == 0.0f) continue;
            const uint8_t *line = src + (long)yt[y * ky + k] * row_len;
            for (long j = 0; j < row_len; j++) acc[j] += weight * (float)line[j];
        }
    }
    for (long y = 0; y < out_h; y++) {
        const float *acc = rows + y * row_len;
        uint8_t *dst = out + y * out_w * c;
        for (long x = 0; x < out_w; x++) {
            for (long ch = 0; ch < c; ch++) {
                float value = 0.0f;
                for (long k = 0; k < kx; k++) {
                    value += xw[x * kx + k] * acc[(long)xt[x * kx + k] * c + ch];
                }
                value += 0.5f;
                dst[x * c + ch] = value <= 0.0f ? 0 : value >= 255.0f ? 255 : (uint8_t)value;
            }
        }
    }
}

static PyObject *resample(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, out, yt, yw, xt, xw;
    long n, h, w, c, out_h, out_w, ky, kx;
    if (!PyArg_ParseTuple(args, "y*w*y*y*y*y*llllllll:resample", &src, &out, &yt, &yw, &xt, &xw, &n, &h,
                          &w, &c, &out_h, &out_w, &ky, &kx))
        return NULL;
    PyObject *result = NULL;
    float *rows = NULL;
    if (n < 0 || h < 1 || w < 1 || c < 1 || out_h < 1 || out_w < 1 || ky < 1 || kx < 1 ||
        h > 65536 || w > 65536 || c > 16 || out_h > 65536 || out_w > 65536 || ky > 65536 || kx > 65536) {
        PyErr_SetString(PyExc_ValueError, "resample: sizes out of range");
        goto done;
    }
    if (src.len != (Py_ssize_t)(n * h * w * c) || out.len != (Py_ssize_t)(n * out_h * out_w * c) ||
        yt.len != (Py_ssize_t)(n * out_h * ky * 4) || yw.len != yt.len ||
        xt.len != (Py_ssize_t)(n * out_w * kx * 4) || xw.len != xt.len) {
        PyErr_SetString(PyExc_ValueError, "resample: a buffer does not match the sizes");
        goto done;
    }
    if (!check_taps((const int32_t *)yt.buf, n * out_h * ky, h) ||
        !check_taps((const int32_t *)xt.buf, n * out_w * kx, w)) {
        PyErr_SetString(PyExc_ValueError, "resample: a tap lies outside the image");
        goto done;
    }
    rows = (float *)malloc(sizeof(float) * (size_t)(out_h * w * c));
    if (rows == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (long i = 0; i < n; i++) {
        resample_sample((const uint8_t *)src.buf + i * h * w * c, (uint8_t *)out.buf + i * out_h * out_w * c,
                        (const int32_t *)yt.buf + i * out_h * ky, (const float *)yw.buf + i * out_h * ky,
                        (const int32_t *)xt.buf + i * out_w * kx, (const float *)xw.buf + i * out_w * kx,
                        w, c, out_h, out_w, ky, kx, rows);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free(rows);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    PyBuffer_Release(&yt);
    PyBuffer_Release(&yw);
    PyBuffer_Release(&xt);
    PyBuffer_Release(&xw);
    return result;
}

static PyMethodDef methods[] = {
    {"resample", resample, METH_VARARGS,
     "resample(src, out, y_taps, y_weights, x_taps, x_weights, n, h, w, c, out_h, out_w, ky, kx): "
     "batched separable resampling of uint8 HWC pixels (see packer/rawcrop.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packer._rawresample",
    "Batched separable resampling of raw uint8 HWC pixels (packer.rawcrop's CPU fast path).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rawresample(void) { return PyModule_Create(&module_definition); }
