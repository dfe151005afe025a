/* Batched separable resampling of raw uint8 HWC pixels, the CPU fast path of packer/rawcrop.py.
 *
 * crop_resize(src, out, boxes, flips, clip_to_box, n, h, w, c, out_h, out_w)
 *   src:    n*h*w*c uint8, C-contiguous (n, h, w, c)
 *   out:    n*out_h*out_w*c uint8, writable, C-contiguous (n, out_h, out_w, c)
 *   boxes:  n*4 float64 (left, top, right, bottom) in source pixels
 *   flips:  n uint8, non-zero: mirror that output horizontally
 *   clip_to_box: the filter reads only pixels inside each box (else the whole image)
 *
 * Each sample's taps and weights are computed here from its box with rawcrop.resample_taps's
 * formulas (Pillow's antialiased triangle filter), so a batch costs no numpy temporaries.
 *
 * For each sample: rows first (out_h rows of w*c floats, each a weighted sum of ky source rows:
 * a contiguous inner loop the compiler vectorises), then columns (kx taps per output pixel),
 * rounded half up and clamped to 0..255: the same float32 arithmetic as rawcrop's torch kernels,
 * in one pass over each sample instead of a dozen passes over the batch.
 *
 * Why C: the torch kernels spend most of their time in whole-batch temporaries (allocation, page
 * faults, memory passes) for what is ~20 thousand multiply-adds per 32x32 image. Here one
 * sample's intermediate (out_h * w * c floats) stays in L1, and the loop runs without the GIL.
 *
 * Every size is checked against the buffers and every box against the image (taps then stay
 * inside it by construction), so bad arguments raise ValueError, never read or write out of
 * bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Round half up (the 0.5 is already added) and clamp to 0..255. */
static inline uint8_t to_byte(float value) {
    return value <= 0.0f ? 0 : value >= 255.0f ? 255 : (uint8_t)value;
}

static void resample_sample(const uint8_t *src, uint8_t *out, const int32_t *yt, const float *yw,
                            const int32_t *yn, const int32_t *xt, const float *xw, const int32_t *xn,
                            long w, long c, long out_h, long out_w, long ky, long kx, long x_low,
                            long x_high, float *rows) {
    /* The row pass covers only columns [x_low, x_high): all the column pass reads. */
    const long row_len = w * c, j0 = x_low * c, j1 = x_high * c;
    for (long y = 0; y < out_h; y++) {
        float *acc = rows + y * row_len;
        for (long j = j0; j < j1; j++) acc[j] = 0.0f;
        for (long k = 0; k < yn[y]; k++) {  /* only the taps this output uses */
            const float weight = yw[y * ky + k];
            if (weight == 0.0f) continue;
            const uint8_t *line = src + (long)yt[y * ky + k] * row_len;
            for (long j = j0; j < j1; j++) acc[j] += weight * (float)line[j];
        }
    }
    for (long y = 0; y < out_h; y++) {
        const float *acc = rows + y * row_len;
        uint8_t *dst = out + y * out_w * c;
        if (c == 3) {  /* RGB, the only layout the raw codec stores: three accumulators in registers */
            for (long x = 0; x < out_w; x++) {
                float v0 = 0.5f, v1 = 0.5f, v2 = 0.5f;
                const int32_t *taps = xt + x * kx;
                const float *weights = xw + x * kx;
                for (long k = 0; k < xn[x]; k++) {
                    const float weight = weights[k];
                    const float *pixel = acc + (long)taps[k] * 3;
                    v0 += weight * pixel[0];
                    v1 += weight * pixel[1];
                    v2 += weight * pixel[2];
                }
                dst[3 * x] = to_byte(v0);
                dst[3 * x + 1] = to_byte(v1);
                dst[3 * x + 2] = to_byte(v2);
            }
            continue;
        }
        for (long x = 0; x < out_w; x++) {
            for (long ch = 0; ch < c; ch++) {
                float value = 0.5f;
                for (long k = 0; k < xn[x]; k++) {
                    value += xw[x * kx + k] * acc[(long)xt[x * kx + k] * c + ch];
                }
                dst[x * c + ch] = to_byte(value);
            }
        }
    }
}

/* Pillow's antialiased triangle filter for one axis of one sample: the taps and weights of each
 * of out_len outputs resampling [start, end), reading only source pixels [low, high). The same
 * formulas, in double precision, as packer/rawcrop.py's resample_taps. Unused taps get weight 0
 * and the last valid position. */
static void axis_taps(double start, double end, long low, long high, long out_len, long kmax,
                      int32_t *taps, float *weights, int32_t *counts, double *raw) {
    const double factor = (end - start) / (double)out_len;
    const double support = factor > 1.0 ? factor : 1.0;
    for (long i = 0; i < out_len; i++) {
        const double center = start + ((double)i + 0.5) * factor;
        long first = (long)floor(center - support + 0.5), last = (long)floor(center + support + 0.5);
        first = first < low ? low : first > high ? high : first;
        last = last < low ? low : last > high ? high : last;
        counts[i] = (int32_t)(last - first < kmax ? last - first : kmax);
        double total = 0.0;
        for (long k = 0; k < kmax; k++) {
            const long j = first + k;
            double weight = 0.0;
            if (j < last) {
                const double distance = fabs(((double)j + 0.5 - center) / support);
                weight = distance < 1.0 ? 1.0 - distance : 0.0;
            }
            raw[k] = weight;
            total += weight;
        }
        for (long k = 0; k < kmax; k++) {
            const long j = first + k < high ? first + k : high - 1;
            taps[i * kmax + k] = (int32_t)j;
            weights[i * kmax + k] = (float)(total > 0.0 ? raw[k] / total : raw[k]);
        }
    }
}

static PyObject *crop_resize(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, out, boxes, flips;
    long n, h, w, c, out_h, out_w;
    int clip;
    if (!PyArg_ParseTuple(args, "y*w*y*y*pllllll:crop_resize", &src, &out, &boxes, &flips, &clip, &n, &h,
                          &w, &c, &out_h, &out_w))
        return NULL;
    PyObject *result = NULL;
    float *rows = NULL, *yw = NULL, *xw = NULL;
    int32_t *yt = NULL, *xt = NULL, *yn = NULL, *xn = NULL;
    double *raw = NULL;
    if (n < 0 || h < 1 || w < 1 || c < 1 || out_h < 1 || out_w < 1 || h > 65536 || w > 65536 || c > 16 ||
        out_h > 65536 || out_w > 65536) {
        PyErr_SetString(PyExc_ValueError, "crop_resize: sizes out of range");
        goto done;
    }
    if (src.len != (Py_ssize_t)(n * h * w * c) || out.len != (Py_ssize_t)(n * out_h * out_w * c) ||
        boxes.len != (Py_ssize_t)(n * 4 * sizeof(double)) || flips.len != (Py_ssize_t)n) {
        PyErr_SetString(PyExc_ValueError, "crop_resize: a buffer does not match the sizes");
        goto done;
    }
    const double *box = (const double *)boxes.buf;
    double widest = 1.0;  /* the largest downscale factor sizes the tap arrays */
    for (long i = 0; i < n; i++) {
        const double left = box[4 * i], top = box[4 * i + 1], right = box[4 * i + 2], bottom = box[4 * i + 3];
        if (!(left >= 0.0 && top >= 0.0 && right <= (double)w && bottom <= (double)h && right > left &&
              bottom > top)) {
            PyErr_SetString(PyExc_ValueError, "crop_resize: every box must be a non-empty part of the image");
            goto done;
        }
        const double fx = (right - left) / (double)out_w, fy = (bottom - top) / (double)out_h;
        if (fx > widest) widest = fx;
        if (fy > widest) widest = fy;
    }
    const long kmax = (long)ceil(2.0 * widest) + 2;
    rows = (float *)malloc(sizeof(float) * (size_t)(out_h * w * c));
    yt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(out_h * kmax));
    xt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(out_w * kmax));
    yw = (float *)malloc(sizeof(float) * (size_t)(out_h * kmax));
    xw = (float *)malloc(sizeof(float) * (size_t)(out_w * kmax));
    raw = (double *)malloc(sizeof(double) * (size_t)kmax);
    yn = (int32_t *)malloc(sizeof(int32_t) * (size_t)out_h);
    xn = (int32_t *)malloc(sizeof(int32_t) * (size_t)out_w);
    if (!rows || !yt || !xt || !yw || !xw || !raw || !yn || !xn) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *flip = (const uint8_t *)flips.buf;
    Py_BEGIN_ALLOW_THREADS
    for (long i = 0; i < n; i++) {
        const double left = box[4 * i], top = box[4 * i + 1], right = box[4 * i + 2], bottom = box[4 * i + 3];
        const long x_low = clip ? (long)floor(left) : 0, x_high = clip ? (long)ceil(right) : w;
        const long y_low = clip ? (long)floor(top) : 0, y_high = clip ? (long)ceil(bottom) : h;
        axis_taps(top, bottom, y_low, y_high, out_h, kmax, yt, yw, yn, raw);
        axis_taps(left, right, x_low, x_high, out_w, kmax, xt, xw, xn, raw);
        if (flip[i]) {  /* mirror: the output columns in reverse order */
            for (long a = 0, b = out_w - 1; a < b; a++, b--) {
                const int32_t count = xn[a];
                xn[a] = xn[b];
                xn[b] = count;
                for (long k = 0; k < kmax; k++) {
                    const int32_t tap = xt[a * kmax + k];
                    const float weight = xw[a * kmax + k];
                    xt[a * kmax + k] = xt[b * kmax + k];
                    xw[a * kmax + k] = xw[b * kmax + k];
                    xt[b * kmax + k] = tap;
                    xw[b * kmax + k] = weight;
                }
            }
        }
        resample_sample((const uint8_t *)src.buf + i * h * w * c, (uint8_t *)out.buf + i * out_h * out_w * c,
                        yt, yw, yn, xt, xw, xn, w, c, out_h, out_w, kmax, kmax, x_low, x_high, rows);
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free(rows);
    free(yt);
    free(xt);
    free(yw);
    free(xw);
    free(raw);
    free(yn);
    free(xn);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&flips);
    return result;
}

static PyMethodDef methods[] = {
    {"crop_resize", crop_resize, METH_VARARGS,
     "crop_resize(src, out, boxes, flips, clip_to_box, n, h, w, c, out_h, out_w): resample every "
     "sample's float64 (left, top, right, bottom) box to out_h x out_w, mirrored where flips[i]; the "
     "taps of rawcrop.resample_taps computed per sample (see packer/rawcrop.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packer._rawresample",
    "Batched separable resampling of raw uint8 HWC pixels (packer.rawcrop's CPU fast path).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rawresample(void) { return PyModule_Create(&module_definition); }
