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
 * in one pass over each sample instead of a dozen passes over the batch. RGB (what the raw codec
 * stores) widens each pixel to 4 float lanes first, so a column tap is one SSE2 multiply-add
 * (1.3-1.7x faster than three scalar ones); the sums are the same, term for term.
 *
 * crop_resize(..., offsets, rows): the same, each sample read in place at its int64 offset in src
 * (a mapped shard) and written to its row of out: the batched path's crop without a gathered copy
 * of the batch (rawcrop.crop_resize_raw).
 *
 * gather(src, out, positions, rows, sample): read_raw_batch's copy of a batch out of a mapped
 * shard, one memcpy per sample without the GIL.
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

/* SSE2 is part of every x86-64 CPU: the RGB column pass uses its 4-lane float operations (each
 * lane's arithmetic is the scalar IEEE float arithmetic, so the bytes do not depend on it). */
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define PACKER_SSE2 1
#else
#define PACKER_SSE2 0
#endif

/* floor() for the box coordinates (finite, far inside a long's range), without a libm call: SSE2
 * has no rounding instruction, and the tap loop calls it twice per output pixel. */
static inline long floor_long(double value) {
    const long truncated = (long)value;
    return truncated - (value < (double)truncated);
}

/* Round half up (the 0.5 is already added) and clamp to 0..255. */
static inline uint8_t to_byte(float value) {
    return value <= 0.0f ? 0 : value >= 255.0f ? 255 : (uint8_t)value;
}

/* RGB (c == 3, the only layout the raw codec stores): pixels widened to 4 floats (R, G, B, 0), so
 * that a tap of the column pass is one 4-wide multiply-add (the compiler turns the fixed 4-lane
 * loops into single SSE operations) and the row pass runs over contiguous floats.
 *   src4: the source rows [y_first, y_last) widened, columns [x_low, x_high) (h * w * 4 floats)
 *   rows: out_h rows of w * 4 floats
 * The sums are the generic path's, term for term in the same order (the zero lane and a zero
 * weight add exactly 0), so both paths give the same bytes. */
/* Kept out of crop_resize: inlined there, GCC 12 -O3 made the whole batch ~15 % slower (measured). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((noinline))
#endif
static void resample_rgb(const uint8_t *src, uint8_t *out, const int32_t *yt, const float *yw,
                         const int32_t *yn, const int32_t *xt, const float *xw, const int32_t *xn,
                         long w, long out_h, long out_w, long ky, long kx, long x_low, long x_high,
                         long y_first, long y_last, float *src4, float *rows) {
    const long row4 = w * 4, j0 = x_low * 4, j1 = x_high * 4;
    for (long y = y_first; y < y_last; y++) {
        const uint8_t *line = src + y * w * 3;
        float *wide = src4 + y * row4;
        for (long x = x_low; x < x_high; x++) {
            wide[4 * x] = (float)line[3 * x];
            wide[4 * x + 1] = (float)line[3 * x + 1];
            wide[4 * x + 2] = (float)line[3 * x + 2];
            wide[4 * x + 3] = 0.0f;
        }
    }
    /* Rows: up to three taps (an upscale or a mild downscale) summed in registers, one store per
     * float; (0 + a) + b is a + b, so the sums are the generic pass's. */
    for (long y = 0; y < out_h; y++) {
        float *acc = rows + y * row4;
        const float *line[3] = {NULL, NULL, NULL};
        float weight[3] = {0.0f, 0.0f, 0.0f};
        long used = 0;
        for (long k = 0; k < yn[y] && used <= 3; k++) {
            const float wk = yw[y * ky + k];
            if (wk == 0.0f) continue;
            if (used < 3) {
                line[used] = src4 + (long)yt[y * ky + k] * row4;
                weight[used] = wk;
            }
            used++;
        }
        if (used == 1) {
            for (long j = j0; j < j1; j++) acc[j] = weight[0] * line[0][j];
        } else if (used == 2) {
            for (long j = j0; j < j1; j++) acc[j] = weight[0] * line[0][j] + weight[1] * line[1][j];
        } else if (used == 3) {
            for (long j = j0; j < j1; j++)
                acc[j] = weight[0] * line[0][j] + weight[1] * line[1][j] + weight[2] * line[2][j];
        } else {  /* no tap, or more than three (a strong downscale) */
            for (long j = j0; j < j1; j++) acc[j] = 0.0f;
            for (long k = 0; k < yn[y]; k++) {
                const float wk = yw[y * ky + k];
                if (wk == 0.0f) continue;
                const float *wide = src4 + (long)yt[y * ky + k] * row4;
                for (long j = j0; j < j1; j++) acc[j] += wk * wide[j];
            }
        }
    }
    /* Columns: every output pixel is a 4-lane weighted sum of kx widened pixels of its row. */
    for (long y = 0; y < out_h; y++) {
        const float *acc = rows + y * row4;
        uint8_t *dst = out + y * out_w * 3;
        for (long x = 0; x < out_w; x++) {
            const int32_t *taps = xt + x * kx;
            const float *weights = xw + x * kx;
            const long count = xn[x];
#if PACKER_SSE2
            __m128 v = _mm_set1_ps(0.5f);
            if (count == 2) {  /* an upscale's bilinear pair: the common case, unrolled */
                v = _mm_add_ps(v, _mm_mul_ps(_mm_set1_ps(weights[0]), _mm_loadu_ps(acc + (long)taps[0] * 4)));
                v = _mm_add_ps(v, _mm_mul_ps(_mm_set1_ps(weights[1]), _mm_loadu_ps(acc + (long)taps[1] * 4)));
            } else {
                for (long k = 0; k < count; k++) {
                    v = _mm_add_ps(v, _mm_mul_ps(_mm_set1_ps(weights[k]), _mm_loadu_ps(acc + (long)taps[k] * 4)));
                }
            }
            /* round half up (the 0.5 is in): clamp to 0..255, truncate, pack to bytes */
            v = _mm_min_ps(_mm_max_ps(v, _mm_setzero_ps()), _mm_set1_ps(255.0f));
            __m128i q = _mm_cvttps_epi32(v);
            q = _mm_packs_epi32(q, q);
            q = _mm_packus_epi16(q, q);
            const uint32_t bytes = (uint32_t)_mm_cvtsi128_si32(q);
            if (x + 1 < out_w) {
                memcpy(dst + 3 * x, &bytes, 4);  /* the 4th byte is the next pixel's, written next */
            } else {
                memcpy(dst + 3 * x, &bytes, 3);
            }
#else
            float v[4] = {0.5f, 0.5f, 0.5f, 0.5f};
            for (long k = 0; k < count; k++) {
                const float weight = weights[k];
                const float *pixel = acc + (long)taps[k] * 4;
                for (int ch = 0; ch < 4; ch++) v[ch] += weight * pixel[ch];
            }
            dst[3 * x] = to_byte(v[0]);
            dst[3 * x + 1] = to_byte(v[1]);
            dst[3 * x + 2] = to_byte(v[2]);
#endif
        }
    }
}

/* Any channel count: rows first (out_h rows of w*c floats, each a weighted sum of ky source rows),
 * then columns (kx taps per output pixel). */
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
    /* An upscale's support is exactly 1: dividing by it changes nothing, so it is skipped; a
     * downscale multiplies by the reciprocal (a division costs more than the rest of a tap). */
    const double inverse = 1.0 / support;
    const int unit = support == 1.0;
    for (long i = 0; i < out_len; i++) {
        const double center = start + ((double)i + 0.5) * factor;
        long first = floor_long(center - support + 0.5), last = floor_long(center + support + 0.5);
        first = first < low ? low : first > high ? high : first;
        last = last < low ? low : last > high ? high : last;
        const long count = last - first < kmax ? last - first : kmax;
        counts[i] = (int32_t)count;
        double total = 0.0;
        /* Only the taps inside [first, last) can weigh anything: the loop stops there, and the
         * rest of the row is the zero-weight padding rawcrop.resample_taps gives. */
        for (long k = 0; k < count; k++) {
            const double offset = (double)(first + k) + 0.5 - center;
            const double distance = fabs(unit ? offset : offset * inverse);
            const double weight = distance < 1.0 ? 1.0 - distance : 0.0;
            raw[k] = weight;
            total += weight;
        }
        int32_t *tap = taps + i * kmax;
        float *out_weight = weights + i * kmax;
        for (long k = 0; k < count; k++) {
            tap[k] = (int32_t)(first + k);
            /* 0 / total is 0: only the taps with a weight pay the division */
            out_weight[k] = (float)(total > 0.0 && raw[k] != 0.0 ? raw[k] / total : raw[k]);
        }
        for (long k = count < 0 ? 0 : count; k < kmax; k++) {
            tap[k] = (int32_t)(first + k < high ? first + k : high - 1);
            out_weight[k] = 0.0f;
        }
    }
}

/* Samples of a random batch lie anywhere in a mapping of hundreds of MB: ask for the lines of the
 * sample GATHER_AHEAD places ahead while this one is copied, so its DRAM (and TLB) misses overlap
 * the copy instead of stalling it. At most the first PREFETCH_MAX bytes: larger samples stream. */
#define GATHER_AHEAD 12
#define RESAMPLE_AHEAD 2
#define PREFETCH_MAX 8192
static inline void prefetch_sample(const uint8_t *start, Py_ssize_t sample) {
#if defined(__GNUC__) || defined(__clang__)
    const Py_ssize_t span = sample < PREFETCH_MAX ? sample : PREFETCH_MAX;
    for (Py_ssize_t offset = 0; offset < span; offset += 64) __builtin_prefetch(start + offset, 0, 0);
#else
    (void)start;
    (void)sample;
#endif
}

/* The same into every cache level: the resample reads a sample a few microseconds after asking,
 * long enough for a non-temporal line to be evicted again by its own working buffers. */
static inline void prefetch_sample_kept(const uint8_t *start, Py_ssize_t sample) {
#if defined(__GNUC__) || defined(__clang__)
    const Py_ssize_t span = sample < PREFETCH_MAX ? sample : PREFETCH_MAX;
    for (Py_ssize_t offset = 0; offset < span; offset += 64) __builtin_prefetch(start + offset, 0, 3);
#else
    (void)start;
    (void)sample;
#endif
}

static PyObject *crop_resize(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, out, boxes, flips, offsets = {0}, rows_buffer = {0};
    PyObject *offsets_object = Py_None, *rows_object = Py_None;
    long n, h, w, c, out_h, out_w;
    int clip;
    if (!PyArg_ParseTuple(args, "y*w*y*y*pllllll|OO:crop_resize", &src, &out, &boxes, &flips, &clip, &n, &h,
                          &w, &c, &out_h, &out_w, &offsets_object, &rows_object))
        return NULL;
    PyObject *result = NULL;
    int have_offsets = 0, have_rows = 0;
    float *rows = NULL, *src4 = NULL, *yw = NULL, *xw = NULL;
    int32_t *yt = NULL, *xt = NULL, *yn = NULL, *xn = NULL;
    double *raw = NULL;
    if (n < 0 || h < 1 || w < 1 || c < 1 || out_h < 1 || out_w < 1 || h > 65536 || w > 65536 || c > 16 ||
        out_h > 65536 || out_w > 65536) {
        PyErr_SetString(PyExc_ValueError, "crop_resize: sizes out of range");
        goto done;
    }
    const Py_ssize_t in_sample = (Py_ssize_t)(h * w * c), out_sample = (Py_ssize_t)(out_h * out_w * c);
    if (offsets_object != Py_None) {  /* samples read in place, e.g. from a mapped shard */
        if (PyObject_GetBuffer(offsets_object, &offsets, PyBUF_SIMPLE) < 0) goto done;
        have_offsets = 1;
    }
    if (rows_object != Py_None) {
        if (PyObject_GetBuffer(rows_object, &rows_buffer, PyBUF_SIMPLE) < 0) goto done;
        have_rows = 1;
    }
    if ((have_offsets ? offsets.len != (Py_ssize_t)(n * sizeof(int64_t)) : src.len != n * in_sample) ||
        (have_rows ? rows_buffer.len != (Py_ssize_t)(n * sizeof(int64_t)) || out.len % out_sample != 0
                   : out.len != n * out_sample) ||
        boxes.len != (Py_ssize_t)(n * 4 * sizeof(double)) || flips.len != (Py_ssize_t)n) {
        PyErr_SetString(PyExc_ValueError, "crop_resize: a buffer does not match the sizes");
        goto done;
    }
    const int64_t *start = have_offsets ? (const int64_t *)offsets.buf : NULL;
    const int64_t *row_of = have_rows ? (const int64_t *)rows_buffer.buf : NULL;
    for (long i = 0; i < n; i++) {
        if ((start && (start[i] < 0 || start[i] > (int64_t)(src.len - in_sample))) ||
            (row_of && (row_of[i] < 0 || row_of[i] >= (int64_t)(out.len / out_sample)))) {
            PyErr_SetString(PyExc_ValueError, "crop_resize: an offset or row lies outside its buffer");
            goto done;
        }
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
    const int rgb = c == 3;
    rows = (float *)malloc(sizeof(float) * (size_t)(out_h * w * (rgb ? 4 : c)));
    src4 = rgb ? (float *)malloc(sizeof(float) * (size_t)(h * w * 4)) : NULL;
    yt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(out_h * kmax));
    xt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(out_w * kmax));
    yw = (float *)malloc(sizeof(float) * (size_t)(out_h * kmax));
    xw = (float *)malloc(sizeof(float) * (size_t)(out_w * kmax));
    raw = (double *)malloc(sizeof(double) * (size_t)kmax);
    yn = (int32_t *)malloc(sizeof(int32_t) * (size_t)out_h);
    xn = (int32_t *)malloc(sizeof(int32_t) * (size_t)out_w);
    if (!rows || !yt || !xt || !yw || !xw || !raw || !yn || !xn || (rgb && !src4)) {
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
        const uint8_t *image = (const uint8_t *)src.buf + (start ? start[i] : (int64_t)i * in_sample);
        uint8_t *target = (uint8_t *)out.buf + (row_of ? row_of[i] : (int64_t)i) * out_sample;
        if (start && i + RESAMPLE_AHEAD < n)
            prefetch_sample_kept((const uint8_t *)src.buf + start[i + RESAMPLE_AHEAD], in_sample);
        if (rgb) {
            long y_first = h, y_last = 0;  /* the source rows the row pass reads: only those are widened */
            for (long y = 0; y < out_h; y++) {
                for (long k = 0; k < yn[y]; k++) {
                    const long tap = yt[y * kmax + k];
                    if (tap < y_first) y_first = tap;
                    if (tap + 1 > y_last) y_last = tap + 1;
                }
            }
            resample_rgb(image, target, yt, yw, yn, xt, xw, xn, w, out_h, out_w, kmax, kmax, x_low, x_high,
                         y_first, y_last, src4, rows);
        } else {
            resample_sample(image, target, yt, yw, yn, xt, xw, xn, w, c, out_h, out_w, kmax, kmax, x_low,
                            x_high, rows);
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    free(rows);
    free(src4);
    free(yt);
    free(xt);
    free(yw);
    free(xw);
    free(raw);
    free(yn);
    free(xn);
    if (have_offsets) PyBuffer_Release(&offsets);
    if (have_rows) PyBuffer_Release(&rows_buffer);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&flips);
    return result;
}

/* gather(src, out, positions, rows, sample): out row rows[j] (j when rows is None) = the sample
 * bytes of src at positions[j]; rows and positions int64. One memcpy per sample without the GIL:
 * read_raw_batch's gather from a mapped shard straight into the batch (no temporary, no per-sample
 * Python). Every position and row is checked against its buffer first. */
static PyObject *gather(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, out, positions;
    PyObject *rows_object;
    Py_ssize_t sample;
    if (!PyArg_ParseTuple(args, "y*w*y*On:gather", &src, &out, &positions, &rows_object, &sample)) return NULL;
    PyObject *result = NULL;
    Py_buffer rows = {0};
    int have_rows = 0;
    const Py_ssize_t count = positions.len / (Py_ssize_t)sizeof(int64_t);
    if (sample < 1 || positions.len % (Py_ssize_t)sizeof(int64_t) != 0 || out.len % sample != 0) {
        PyErr_SetString(PyExc_ValueError, "gather: a buffer does not match the sample size");
        goto done;
    }
    const Py_ssize_t out_rows = out.len / sample;
    if (rows_object != Py_None) {
        if (PyObject_GetBuffer(rows_object, &rows, PyBUF_SIMPLE) < 0) goto done;
        have_rows = 1;
        if (rows.len != positions.len) {
            PyErr_SetString(PyExc_ValueError, "gather: rows and positions differ in length");
            goto done;
        }
    } else if (count != out_rows) {
        PyErr_SetString(PyExc_ValueError, "gather: without rows, out must hold exactly one row per position");
        goto done;
    }
    const int64_t *where = (const int64_t *)positions.buf;
    const int64_t *row = have_rows ? (const int64_t *)rows.buf : NULL;
    for (Py_ssize_t j = 0; j < count; j++) {
        if (where[j] < 0 || where[j] > (int64_t)(src.len - sample) || (row && (row[j] < 0 || row[j] >= out_rows))) {
            PyErr_SetString(PyExc_ValueError, "gather: a position or row lies outside its buffer");
            goto done;
        }
    }
    {
        const uint8_t *from = (const uint8_t *)src.buf;
        uint8_t *to = (uint8_t *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = 0; j < count; j++) {
            if (j + GATHER_AHEAD < count) prefetch_sample(from + where[j + GATHER_AHEAD], sample);
            memcpy(to + (row ? row[j] : (int64_t)j) * sample, from + where[j], (size_t)sample);
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_None;
    Py_INCREF(result);
done:
    if (have_rows) PyBuffer_Release(&rows);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    PyBuffer_Release(&positions);
    return result;
}

static PyMethodDef methods[] = {
    {"crop_resize", crop_resize, METH_VARARGS,
     "crop_resize(src, out, boxes, flips, clip_to_box, n, h, w, c, out_h, out_w[, offsets, rows]): resample "
     "every sample's float64 (left, top, right, bottom) box to out_h x out_w, mirrored where flips[i]; the "
     "taps of rawcrop.resample_taps computed per sample (see packer/rawcrop.py). With int64 offsets, sample "
     "i is read in place at src[offsets[i]:] (a mapped shard: no gathered copy); with int64 rows, it is "
     "written to row rows[i] of out."},
    {"gather", gather, METH_VARARGS,
     "gather(src, out, positions, rows, sample): copy sample bytes at each int64 position of src to row "
     "rows[j] (or j) of out, without the GIL (packer.rawcrop.read_raw_batch)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packer._rawresample",
    "Batched separable resampling of raw uint8 HWC pixels (packer.rawcrop's CPU fast path).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rawresample(void) { return PyModule_Create(&module_definition); }
