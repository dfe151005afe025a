/* Lossless JPEG re-tiling for packer's "tiled" codec (formats/SPEC.md section 13).
 *
 * transcode(data, max_pixels, min_tile_width=16) -> bytes
 *   Rewrites a sequential Huffman JPEG (SOF0/SOF1, 8-bit, one scan holding every component) so
 *   that every tile (one MCU, or a few when the MCU is only 8 pixels wide) is its own restart
 *   interval, with Huffman tables re-optimised for the new symbol counts, and records the
 *   entropy-coded length of every tile in APP9 "PKTILES" segments right after SOI. The DCT
 *   coefficients do not change, so every decoder produces exactly the input's pixels; what
 *   changes is that a reader can cut out any rectangle of tiles and hand a decoder a small, valid
 *   JPEG of just that window, skipping the entropy decoding of everything outside it.
 *
 * window(data, left, top, right, bottom, margin) -> (jpeg, x, y, width, height) | None
 *   The compiled twin of packer/tiles.py's read_layout + window_jpeg (same checks T1-T3, same
 *   bytes; tests/test_tiles.py compares them on random windows and damaged files). The Python
 *   code is the reference; this one is ~10x faster on the training hot path.
 *
 * Why C: entropy decoding is a bit-serial loop over ~100,000 symbols per ImageNet-sized image;
 * Python (or numpy) cannot do it at build speed, and no maintained Python library exposes lossless
 * transcoding with restart markers (jpegtran's job).
 *
 * Where the time goes (~165,000 symbols in a 100 KB photo): the counting pass decodes each symbol
 * with one 9-bit table lookup that also gives its extra bits' count, mask and block step and its
 * record, so a code and its extra bits leave the bit buffer in one shift; the buffer is refilled
 * from one 8-byte load when those bytes hold no 0xFF (byte by byte otherwise), at exactly the
 * points a byte-at-a-time reader would refill, so that a damaged file stops at the same byte and is
 * refused or kept as before. The writing pass replays the records: one table lookup gives a
 * symbol's new code already shifted above its extra bits, and the whole bytes go out with one
 * 8-byte store when none is 0xFF. Decoding is ~70% of the time, bound by the serial chain
 * lookup -> shift -> lookup of a Huffman decoder; benchmarks/bench_transcode.py measures it.
 *
 * The input is untrusted: every length and table is checked, nothing is read out of bounds, and
 * any problem raises ValueError("unsupported: ...") or ValueError("corrupt: ...") (transcode) or
 * returns None (window). All work happens without the GIL and without Python objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMPONENTS 4
#define MAX_BLOCKS_IN_MCU 10
#define TILE_SIGNATURE "PKTILES"           /* 7 characters + NUL = 8 bytes */
#define TILE_VERSION 1
#define TILE_HEADER_BYTES 18               /* signature 8, version 1, reserved 1, cols 2, rows 2, first 4 */
#define TILE_MAX_PER_SEGMENT ((65535 - 2 - TILE_HEADER_BYTES) / 2)

/* ------------------------------------------------------------------------------------------ */
/* errors and buffers                                                                          */

typedef struct {
    jmp_buf jump;
    char message[200];
} Failure;

#if defined(__GNUC__) || defined(__clang__)
#define NORETURN __attribute__((noreturn))
#else
#define NORETURN
#endif

static NORETURN void fail(Failure *failure, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(failure->message, sizeof failure->message, format, args);
    va_end(args);
    longjmp(failure->jump, 1);
}

typedef struct {
    uint8_t *data;
    size_t size, capacity;
} Buffer;

static void buffer_reserve(Failure *failure, Buffer *buffer, size_t extra) {
    if (buffer->size + extra <= buffer->capacity) return;
    size_t capacity = buffer->capacity ? buffer->capacity : 4096;
    while (capacity < buffer->size + extra) capacity *= 2;
    uint8_t *data = realloc(buffer->data, capacity);
    if (!data) fail(failure, "memory: cannot allocate %zu bytes", capacity);
    buffer->data = data;
    buffer->capacity = capacity;
}

static void buffer_append(Failure *failure, Buffer *buffer, const uint8_t *bytes, size_t count) {
    buffer_reserve(failure, buffer, count);
    memcpy(buffer->data + buffer->size, bytes, count);
    buffer->size += count;
}

static void buffer_byte(Failure *failure, Buffer *buffer, uint8_t byte) {
    buffer_reserve(failure, buffer, 1);
    buffer->data[buffer->size++] = byte;
}

static void buffer_u16(Failure *failure, Buffer *buffer, unsigned value) {
    buffer_byte(failure, buffer, (uint8_t)(value >> 8));
    buffer_byte(failure, buffer, (uint8_t)value);
}

/* ------------------------------------------------------------------------------------------ */
/* Huffman tables                                                                              */

typedef struct {
    int defined;
    uint8_t counts[17];      /* counts[l]: number of codes of length l (1..16) */
    uint8_t values[256];
    int total;
    /* decoding */
    int32_t maxcode[18];     /* largest code of length l, -1 if none */
    int32_t valptr[17];      /* index into values of the first code of length l */
    int32_t mincode[17];
    int slot;                /* 0-3: DC table 0-3, 4-7: AC table 0-3 */
    uint64_t fast[1 << 9];   /* 9-bit lookahead: lookup_entry(), 0 = a longer code (decode_long) */
} DecodeTable;

typedef struct {
    uint32_t code[256];
    uint8_t size[256];       /* 0: symbol has no code */
} EncodeTable;

/* A recorded symbol: its table slot (0-3 DC, 4-7 AC), the symbol, its extra bits and their count
 * (at most 15 bits: 8-bit JPEGs need 11 for DC, 10 for AC; `bits` has nothing above them). The
 * top 12 bits, slot and symbol, index replay_pass's table of codes. */
static inline uint32_t pack_symbol(int slot, int symbol, uint32_t bits, int size) {
    return ((uint32_t)slot << 28) | ((uint32_t)symbol << 20) | ((uint32_t)size << 16) | bits;
}

/* A decoded symbol as the hot loop wants it, so that a code and its extra bits are taken in one
 * shift, the block position advances without decoding run and size, and the symbol is recorded
 * without re-packing it:
 *   bits 0-7    total: the code's length + the symbol's count of extra bits (DC: the symbol,
 *               a magnitude category; AC: its low 4 bits)
 *   bits 8-15   AC: the coefficients it covers, run + 1, for a symbol with extra bits; else
 *               NO_EXTRA_BITS (end of block, or a run of 16 zeros: the loop's rare branch)
 *   bits 16-31  the extra bits' mask, (1 << count) - 1
 *   bits 32-63  the record's top bits: pack_symbol(slot, symbol, 0, count); the top 12 bits,
 *               (slot << 8) | symbol, index the symbol's count in Transcoder.frequency
 * Never 0 (a code is at least 1 bit long). */
#define NO_EXTRA_BITS 0x80

static uint64_t lookup_entry(int slot, int length, int value) {
    int table_class = slot >> 2;
    int extra = table_class ? value & 15 : value;  /* DC symbols above 15 are refused before */
    int total = length + extra;
    uint64_t step = table_class ? (extra ? (uint64_t)(value >> 4) + 1 : NO_EXTRA_BITS) : 0;
    return ((uint64_t)pack_symbol(slot, value, 0, extra) << 32) | ((uint64_t)((1u << extra) - 1) << 16) |
           (step << 8) | (uint64_t)total;
}

static inline int entry_total(uint64_t entry) { return (int)(entry & 0xFF); }
static inline int entry_step(uint64_t entry) { return (int)((entry >> 8) & 0xFF); }
static inline int entry_symbol(uint64_t entry) { return (int)((entry >> 52) & 0xFF); }
static inline int entry_extra(uint64_t entry) { return (int)((entry >> 48) & 15); }
static inline uint32_t entry_high(uint64_t entry) { return (uint32_t)(entry >> 32); }

static void build_decode_table(Failure *failure, DecodeTable *table, int table_class, int id) {
    table->slot = 4 * table_class + id;
    int code = 0, k = 0;
    for (int length = 1; length <= 16; length++) {
        table->valptr[length] = k;
        table->mincode[length] = code;
        code += table->counts[length];
        k += table->counts[length];
        table->maxcode[length] = table->counts[length] ? code - 1 : -1;
        /* As libjpeg (jpeg_make_d_derived_tbl): the next free code must still fit in `length`
         * bits, so no code is all ones (ITU T.81 Annex C reserves it); '>' would accept it. */
        if (code >= (1 << length)) fail(failure, "corrupt: Huffman table has too many codes");
        code <<= 1;
    }
    table->maxcode[17] = 0x7fffffff;
    for (int i = 0; i < table->total; i++) {
        /* DC symbols are magnitude categories; 15 is the most a 16-bit coefficient can need. */
        if (table_class == 0 && table->values[i] > 15)
            fail(failure, "corrupt: DC Huffman table has symbol %d", table->values[i]);
    }
    memset(table->fast, 0, sizeof table->fast);
    code = 0;
    k = 0;
    for (int length = 1; length <= 9; length++) {
        for (int i = 0; i < table->counts[length]; i++, k++, code++) {
            int shift = 9 - length;
            for (int fill = 0; fill < (1 << shift); fill++)
                table->fast[(code << shift) | fill] = lookup_entry(table->slot, length, table->values[k]);
        }
        code <<= 1;
    }
}

/* Annex K.2 (as in libjpeg's jpeg_gen_optimal_table): optimal code lengths, limited to 16. */
static void optimal_table(const long frequency_in[256], uint8_t counts[17], uint8_t values[256],
                          int *total) {
    long frequency[257];
    int codesize[257], others[257], bits[33];
    memcpy(frequency, frequency_in, 256 * sizeof(long));
    frequency[256] = 1; /* reserves one code point so no real code is all ones */
    for (int i = 0; i < 257; i++) { codesize[i] = 0; others[i] = -1; }
    /* The symbols still in play (nonzero frequency), ascending: the scans below visit them in the
     * order a scan of all 257 would, so they pick the same two (the last of equal frequencies). */
    int active[257], live = 0;
    for (int i = 0; i <= 256; i++)
        if (frequency[i]) active[live++] = i;
    for (;;) {
        int c1 = -1, c2 = -1, c2_at = -1;
        long v = 1000000000L;
        for (int j = 0; j < live; j++) {
            int i = active[j];
            if (frequency[i] <= v) { v = frequency[i]; c1 = i; }
        }
        v = 1000000000L;
        for (int j = 0; j < live; j++) {
            int i = active[j];
            if (frequency[i] <= v && i != c1) { v = frequency[i]; c2 = i; c2_at = j; }
        }
        if (c2 < 0) break;
        frequency[c1] += frequency[c2];
        frequency[c2] = 0;
        memmove(active + c2_at, active + c2_at + 1, (size_t)(live - c2_at - 1) * sizeof *active);
        live--;
        codesize[c1]++;
        while (others[c1] >= 0) { c1 = others[c1]; codesize[c1]++; }
        others[c1] = c2;
        codesize[c2]++;
        while (others[c2] >= 0) { c2 = others[c2]; codesize[c2]++; }
    }
    memset(bits, 0, sizeof bits);
    for (int i = 0; i <= 256; i++)
        if (codesize[i]) bits[codesize[i] < 32 ? codesize[i] : 32]++;
    for (int i = 32; i > 16; i--) {
        while (bits[i] > 0) {
            int j = i - 2;
            while (bits[j] == 0) j--;
            bits[i] -= 2;
            bits[i - 1]++;
            bits[j + 1] += 2;
            bits[j]--;
        }
    }
    int i = 16;
    while (bits[i] == 0) i--;
    bits[i]--; /* drop the reserved code point */
    memset(counts, 0, 17);
    for (int length = 1; length <= 16; length++) counts[length] = (uint8_t)bits[length];
    int k = 0;
    for (int length = 1; length <= 32; length++)
        for (int symbol = 0; symbol < 256; symbol++)
            if (codesize[symbol] == length) values[k++] = (uint8_t)symbol;
    *total = k;
}

static void build_encode_table(const uint8_t counts[17], const uint8_t values[256], int total,
                               EncodeTable *table) {
    memset(table, 0, sizeof *table);
    uint32_t code = 0;
    int k = 0;
    for (int length = 1; length <= 16; length++) {
        for (int i = 0; i < counts[length] && k < total; i++, k++, code++) {
            table->code[values[k]] = code;
            table->size[values[k]] = (uint8_t)length;
        }
        code <<= 1;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* entropy-coded data: reading                                                                 */

typedef struct {
    const uint8_t *data;
    size_t position, end;
    uint64_t bits;      /* left-aligned: the next bit is bit 63; the bits below `count` are zero */
    int count;          /* valid bits in `bits` */
    int padding;        /* how many of the lowest valid bits are zero padding past a marker */
    int at_marker;
} BitReader;

/* The two passes over the symbols are also compiled for CPUs with BMI2, picked at load time
 * (GCC's ifunc on glibc/x86-64): its shifts by a variable count (shlx, shrx) are single
 * instructions that leave the flags alone, ~5% of the transcode's time. Same C, same bytes. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define BMI2_CLONES __attribute__((target_clones("bmi2", "default")))
#else
#define BMI2_CLONES
#endif

/* The hot loop keeps a reader (and a writer) in a local copy that the compiler holds in
 * registers: the helpers below are forced inline and never take a reader's address out of line
 * (the rare paths take and return one by value). */
#if defined(__GNUC__) || defined(__clang__)
#define HOT static inline __attribute__((always_inline))
#define COLD static __attribute__((noinline))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define HOT static inline
#define COLD static
#define UNLIKELY(x) (x)
#endif

/* The byte-at-a-time refill, for the bytes at and after an 0xFF and the last 7 bytes of the
 * data: undo 0xFF 0x00 stuffing; at a marker (or the end of the data) stop and feed zero bytes,
 * counted in `padding` so that consuming them fails (reader_take). */
COLD BitReader reader_fill_bytes(BitReader reader, int limit) {
    while (reader.count <= limit) {
        uint8_t byte = 0;
        if (!reader.at_marker && reader.position < reader.end) {
            byte = reader.data[reader.position];
            if (byte == 0xFF) {
                uint8_t next = reader.position + 1 < reader.end ? reader.data[reader.position + 1] : 0xD9;
                if (next == 0x00) {
                    reader.position += 2;
                } else {
                    reader.at_marker = 1;
                    byte = 0;
                }
            } else {
                reader.position++;
            }
        } else {
            reader.at_marker = 1;
        }
        if (reader.at_marker) reader.padding += 8;
        reader.bits |= (uint64_t)byte << (56 - reader.count);
        reader.count += 8;
    }
    return reader;
}

/* Take whole bytes while `count` <= `limit` (<= 56), to more than `limit` valid bits. The common
 * case takes them from one bounds-checked 8-byte load when none of those 8 bytes is 0xFF (no
 * stuffing, no marker): exactly the bytes reader_fill_bytes would take, in one shift. */
HOT void reader_fill_to(BitReader *reader, int limit) {
    if (!reader->at_marker && reader->end - reader->position >= 8) {
        const uint8_t *p = reader->data + reader->position;
        uint64_t word = ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) |
                        ((uint64_t)p[3] << 32) | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) |
                        ((uint64_t)p[6] << 8) | (uint64_t)p[7];
        /* a byte of ~word is zero exactly where a byte of word is 0xFF */
        if (!((~word - 0x0101010101010101ULL) & word & 0x8080808080808080ULL)) {
            int take = (limit + 8 - reader->count) >> 3;  /* 1..8 whole bytes */
            reader->bits |= (word >> (64 - 8 * take)) << (64 - 8 * take - reader->count);
            reader->position += (size_t)take;
            reader->count += 8 * take;
            return;
        }
    }
    *reader = reader_fill_bytes(*reader, limit);
}

/* The refill before every read that finds fewer than 32 bits (a code, or extra bits), where a
 * byte-at-a-time reader refills: the reader stops at the same byte at the end of a restart
 * interval or of the scan, so a damaged file is accepted or refused exactly as before. */
HOT void reader_fill(BitReader *reader) { reader_fill_to(reader, 56); }

/* A code longer than the 9-bit lookahead, as a lookahead entry, from the first 16 bits. */
COLD uint64_t decode_long(Failure *failure, uint64_t bits, const DecodeTable *table) {
    uint32_t peek = (uint32_t)(bits >> (64 - 16));
    for (int length = 10; length <= 16; length++) {
        int32_t code = (int32_t)(peek >> (16 - length));
        if (code <= table->maxcode[length]) {
            int32_t index = table->valptr[length] + code - table->mincode[length];
            if (index < 0 || index >= table->total) break;
            return lookup_entry(table->slot, length, table->values[index]);
        }
    }
    fail(failure, "corrupt: invalid Huffman code");
}

/* One Huffman symbol's lookup entry, with at least 32 bits in `bits` (enough for a code of up
 * to 16 bits and its up to 15 extra bits); nothing consumed yet. */
HOT uint64_t reader_peek_symbol(Failure *failure, BitReader *reader, const DecodeTable *table) {
    if (reader->count < 32) reader_fill(reader);
    uint64_t entry = table->fast[reader->bits >> (64 - 9)];
    if (UNLIKELY(!entry)) entry = decode_long(failure, reader->bits, table);
    return entry;
}

/* Consume a peeked symbol's code and its extra bits in one shift; returns the extra bits. The
 * same as a reader that consumes the code, refills if fewer than 32 bits are left (reader_fill),
 * then takes the extra bits: the refill takes the same bytes, after the shift; and either
 * running past the data's end is the same error. */
HOT uint32_t reader_take(Failure *failure, BitReader *reader, uint64_t entry, int has_extra) {
    int total = entry_total(entry), size = entry_extra(entry);
    uint32_t extra = (uint32_t)(reader->bits >> ((unsigned)-total & 63)) & (uint32_t)(entry >> 16);
    reader->bits <<= total;
    reader->count -= total;
    if ((has_extra || size) && reader->count + size < 32) reader_fill_to(reader, 56 - size);
    if (UNLIKELY(reader->count < reader->padding)) fail(failure, "corrupt: entropy-coded data ends early");
    return extra;
}

HOT uint32_t reader_take_symbol(Failure *failure, BitReader *reader, uint64_t entry) {
    return reader_take(failure, reader, entry, 0);
}

/* reader_take_symbol for a symbol known to have extra bits */
HOT uint32_t reader_take_extra(Failure *failure, BitReader *reader, uint64_t entry) {
    return reader_take(failure, reader, entry, 1);
}

/* A symbol that runs past the end of its block, before its code is consumed: a reader that
 * consumes the code first fails there if the code itself runs past the data's end. */
COLD NORETURN void block_overrun(Failure *failure, const BitReader *reader, uint64_t entry, const char *message) {
    if (reader->count - (entry_total(entry) - entry_extra(entry)) < reader->padding)
        fail(failure, "corrupt: entropy-coded data ends early");
    fail(failure, "%s", message);
}

static int extend(int value, int size) {
    int negative = -(value < ((1 << size) >> 1));
    return value + (negative & (1 - (1 << size)));
}

/* Restart marker in the input: drop the padding bits, expect RSTn, reset. */
static void reader_restart(Failure *failure, BitReader *reader, int expected) {
    reader->bits = 0;
    reader->count = 0;
    reader->padding = 0;
    reader->at_marker = 0;
    size_t p = reader->position;
    while (p < reader->end && reader->data[p] == 0xFF && p + 1 < reader->end && reader->data[p + 1] == 0xFF) p++;
    if (p + 1 >= reader->end || reader->data[p] != 0xFF || reader->data[p + 1] != 0xD0 + expected)
        fail(failure, "corrupt: expected restart marker %d", expected);
    reader->position = p + 2;
}

/* ------------------------------------------------------------------------------------------ */
/* entropy-coded data: writing                                                                 */

typedef struct {
    Buffer *out;
    uint64_t bits;   /* right-aligned pending bits */
    int count;
} BitWriter;

static void writer_flush_bytes(Failure *failure, BitWriter *writer) {
    /* At most 7 whole bytes are pending, each maybe stuffed with a 0x00: reserve once, then
     * write without a capacity check per byte. */
    Buffer *out = writer->out;
    buffer_reserve(failure, out, 16);
    uint8_t *data = out->data;
    size_t size = out->size;
    while (writer->count >= 8) {
        uint8_t byte = (uint8_t)(writer->bits >> (writer->count - 8));
        data[size++] = byte;
        if (byte == 0xFF) data[size++] = 0x00;
        writer->count -= 8;
    }
    out->size = size;
    writer->bits &= (writer->count ? ((uint64_t)1 << writer->count) - 1 : 0);
}

/* The 32 oldest of 32..63 pending bits as 4 bytes: one store when none of them is 0xFF, else
 * byte by byte with an 0x00 stuffed after each 0xFF. The same bytes writer_flush_bytes writes. */
HOT void writer_flush_word(Failure *failure, BitWriter *writer) {
    Buffer *out = writer->out;
    if (UNLIKELY(out->capacity - out->size < 8)) buffer_reserve(failure, out, 8);
    writer->count -= 32;
    uint32_t word = (uint32_t)(writer->bits >> writer->count);
    uint8_t *data = out->data + out->size;
    uint8_t bytes[4] = {(uint8_t)(word >> 24), (uint8_t)(word >> 16), (uint8_t)(word >> 8), (uint8_t)word};
    if (!((~word - 0x01010101u) & word & 0x80808080u)) {  /* no byte is 0xFF */
        memcpy(data, bytes, 4);
        out->size += 4;
    } else {
        size_t size = 0;
        for (int i = 0; i < 4; i++) {
            data[size++] = bytes[i];
            if (bytes[i] == 0xFF) data[size++] = 0x00;
        }
        out->size += size;
    }
}

/* Append `size` (0..31) bits; `value` must have no bits above them. The bits above the pending
 * `count` in `bits` are stale and never read. */
HOT void writer_put_clean(Failure *failure, BitWriter *writer, uint32_t value, int size) {
    writer->bits = (writer->bits << size) | value;
    writer->count += size;
    if (writer->count >= 32) writer_flush_word(failure, writer);
}

HOT void writer_put(Failure *failure, BitWriter *writer, uint32_t value, int size) {
    writer_put_clean(failure, writer, size ? value & (uint32_t)(((uint64_t)1 << size) - 1) : 0, size);
}

/* Pad to a byte boundary with one bits (T.81 F.1.2.3) and write everything out. */
static void writer_align(Failure *failure, BitWriter *writer) {
    int pad = (8 - writer->count % 8) % 8;
    writer_put(failure, writer, (1u << pad) - 1, pad);
    writer_flush_bytes(failure, writer);
}

/* ------------------------------------------------------------------------------------------ */
/* the image                                                                                   */

typedef struct {
    int id, h, v, quant;
    int dc_table, ac_table;      /* from SOS */
} Component;

typedef struct {
    Failure failure;
    const uint8_t *data;
    size_t size;
    long long max_pixels;
    int min_tile_width;
    /* header */
    int width, height, components, sof_found, restart_interval;
    Component component[MAX_COMPONENTS];
    DecodeTable dc[4], ac[4];
    Buffer kept;                 /* marker segments copied to the output, in order */
    size_t entropy_start;
    size_t scan_end;         /* where the entropy reader stopped after the last MCU */
    /* geometry */
    int mcu_columns, mcu_rows, blocks_in_mcu;
    int interval;                /* MCUs per restart interval (one tile) */
    int block_component[MAX_BLOCKS_IN_MCU];
    /* symbol counts and the optimised tables (slots 0-3 DC, 4-7 AC) */
    long frequency[8 * 256];     /* by (slot << 8) | symbol */
    EncodeTable dc_codes[4], ac_codes[4];
    uint8_t counts[8][17], values[8][256];
    int totals[8];
    /* the counting pass's symbols, replayed by the writing pass (no second entropy decode):
     * one uint32 each, packed by pack_symbol; tile_ends[i] = symbols before tile i ends */
    uint32_t *symbols;
    size_t symbol_count, symbol_capacity;
    size_t *tile_ends;
    int recording;
    uint64_t replay_codes[8 << 8];   /* replay_pass's codes by (slot << 8) | symbol */
    /* output */
    Buffer entropy;
    uint16_t *tile_lengths;
    Buffer result;
} Transcoder;

/* Past this many symbols (1 GiB of records, far beyond any image a build accepts) the writing pass
 * decodes the scan again instead of replaying it. */
#define SYMBOLS_MAX ((size_t)1 << 28)

static unsigned read_u16(const uint8_t *p) { return ((unsigned)p[0] << 8) | p[1]; }

static void parse_sof(Transcoder *t, const uint8_t *p, unsigned length) {
    Failure *failure = &t->failure;
    if (t->sof_found) fail(failure, "corrupt: more than one SOF marker");
    if (length < 6) fail(failure, "corrupt: SOF segment too short");
    if (p[0] != 8) fail(failure, "unsupported: %d-bit samples", p[0]);
    t->height = (int)read_u16(p + 1);
    t->width = (int)read_u16(p + 3);
    t->components = p[5];
    if (t->height == 0) fail(failure, "unsupported: height defined by a DNL marker");
    if (t->width == 0) fail(failure, "corrupt: zero width");
    if (t->components < 1 || t->components > MAX_COMPONENTS)
        fail(failure, "unsupported: %d components", t->components);
    if (length != 6u + 3u * (unsigned)t->components) fail(failure, "corrupt: SOF length does not match its components");
    if ((long long)t->width * t->height > t->max_pixels)
        fail(failure, "unsupported: %dx%d is more than %lld pixels", t->width, t->height, t->max_pixels);
    for (int i = 0; i < t->components; i++) {
        Component *c = &t->component[i];
        c->id = p[6 + 3 * i];
        c->h = p[7 + 3 * i] >> 4;
        c->v = p[7 + 3 * i] & 15;
        c->quant = p[8 + 3 * i];
        if (c->h < 1 || c->h > 4 || c->v < 1 || c->v > 4) fail(failure, "corrupt: sampling factor out of range");
        for (int j = 0; j < i; j++)
            if (t->component[j].id == c->id) fail(failure, "corrupt: duplicate component id");
    }
    t->sof_found = 1;
}

static void parse_dht(Transcoder *t, const uint8_t *p, unsigned length) {
    Failure *failure = &t->failure;
    unsigned k = 0;
    while (k < length) {
        if (length - k < 17) fail(failure, "corrupt: DHT segment too short");
        int table_class = p[k] >> 4, id = p[k] & 15;
        if (table_class > 1 || id > 3) fail(failure, "corrupt: bad Huffman table id");
        DecodeTable *table = table_class ? &t->ac[id] : &t->dc[id];
        int total = 0;
        table->counts[0] = 0;
        for (int l = 1; l <= 16; l++) { table->counts[l] = p[k + l]; total += p[k + l]; }
        if (total > 256 || length - k - 17 < (unsigned)total) fail(failure, "corrupt: DHT segment too short");
        memcpy(table->values, p + k + 17, (size_t)total);
        table->total = total;
        build_decode_table(failure, table, table_class, id);
        table->defined = 1;
        k += 17 + (unsigned)total;
    }
}

static int is_tile_segment(const uint8_t *p, unsigned length) {
    return length >= 8 && memcmp(p, TILE_SIGNATURE, 8) == 0;
}

static void parse_sos(Transcoder *t, const uint8_t *p, unsigned length) {
    Failure *failure = &t->failure;
    if (!t->sof_found) fail(failure, "corrupt: SOS before SOF");
    if (length < 1) fail(failure, "corrupt: SOS segment too short");
    int count = p[0];
    if (length != 4u + 2u * (unsigned)count) fail(failure, "corrupt: SOS length does not match its components");
    if (count != t->components)
        fail(failure, "unsupported: a scan with %d of %d components (multi-scan file)", count, t->components);
    for (int i = 0; i < count; i++) {
        Component *c = &t->component[i];
        if (p[1 + 2 * i] != c->id) fail(failure, "unsupported: scan components in another order than the frame's");
        c->dc_table = p[2 + 2 * i] >> 4;
        c->ac_table = p[2 + 2 * i] & 15;
        if (c->dc_table > 3 || c->ac_table > 3) fail(failure, "corrupt: bad Huffman table selector");
        if (!t->dc[c->dc_table].defined || !t->ac[c->ac_table].defined)
            fail(failure, "corrupt: scan uses an undefined Huffman table");
    }
    const uint8_t *spectral = p + 1 + 2 * count;
    if (spectral[0] != 0 || spectral[1] != 63 || spectral[2] != 0)
        fail(failure, "corrupt: sequential scan with a partial spectral range");
}

static void parse_header(Transcoder *t) {
    Failure *failure = &t->failure;
    const uint8_t *d = t->data;
    size_t n = t->size, pos = 2;
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) fail(failure, "corrupt: no SOI marker");
    for (;;) {
        if (pos >= n || d[pos] != 0xFF) fail(failure, "corrupt: expected a marker at byte %zu", pos);
        while (pos < n && d[pos] == 0xFF) pos++; /* fill bytes */
        if (pos >= n) fail(failure, "corrupt: file ends in a marker");
        uint8_t marker = d[pos++];
        if (marker == 0xD8 || marker == 0xD9 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01 || marker == 0x00)
            fail(failure, "corrupt: unexpected marker 0x%02X before SOS", marker);
        if (pos + 2 > n) fail(failure, "corrupt: segment length past the end");
        unsigned length = read_u16(d + pos);
        if (length < 2 || pos + length > n) fail(failure, "corrupt: segment length past the end");
        const uint8_t *body = d + pos + 2;
        unsigned body_length = length - 2;
        size_t segment_start = pos - 2;
        pos += length;
        switch (marker) {
        case 0xC0: case 0xC1:
            parse_sof(t, body, body_length);
            buffer_append(failure, &t->kept, d + segment_start, length + 2);
            break;
        case 0xC4:
            parse_dht(t, body, body_length);
            break;
        case 0xDD:
            if (body_length != 2) fail(failure, "corrupt: DRI segment length");
            t->restart_interval = (int)read_u16(body);
            break;
        case 0xDA:
            parse_sos(t, body, body_length);
            t->entropy_start = pos;
            return;
        case 0xC2: case 0xC6: case 0xCA: case 0xCE:
            fail(failure, "unsupported: progressive JPEG");
        case 0xC3: case 0xC7: case 0xCB: case 0xCF:
            fail(failure, "unsupported: lossless JPEG");
        case 0xC5: case 0xC9: case 0xCD: case 0xCC:
            fail(failure, "unsupported: arithmetic or hierarchical coding");
        case 0xDC: case 0xDE: case 0xDF:
            fail(failure, "unsupported: marker 0x%02X", marker);
        case 0xE9:
            if (is_tile_segment(body, body_length)) break; /* re-tiling: drop the old tables */
            /* fall through */
        default:
            if (marker == 0xDB || (marker >= 0xE0 && marker <= 0xEF) || marker == 0xFE) {
                buffer_append(failure, &t->kept, d + segment_start, length + 2);
            } else {
                fail(failure, "unsupported: marker 0x%02X", marker);
            }
        }
    }
}

/* MCUs per tile: the smallest divisor of the MCU columns that makes a tile at least
 * `min_width` pixels wide, if that tile is at most 4x as wide; else 1 MCU. (A tile must be whole
 * MCUs, and a row whole tiles, so that restart intervals line up with rows.) */
static int choose_interval(int mcu_columns, int mcu_width, int min_width) {
    if (mcu_width >= min_width) return 1;
    for (int r = 2; r * mcu_width <= 4 * min_width && r <= mcu_columns; r++)
        if (mcu_columns % r == 0 && r * mcu_width >= min_width) return r;
    return 1;
}

static void plan_geometry(Transcoder *t) {
    Failure *failure = &t->failure;
    int hmax = 1, vmax = 1;
    for (int i = 0; i < t->components; i++) {
        if (t->component[i].h > hmax) hmax = t->component[i].h;
        if (t->component[i].v > vmax) vmax = t->component[i].v;
    }
    if (t->components == 1) {
        /* A single-component scan is not interleaved: its MCU is one 8x8 block. */
        t->mcu_columns = (t->width + 7) / 8;
        t->mcu_rows = (t->height + 7) / 8;
        t->blocks_in_mcu = 1;
        t->block_component[0] = 0;
        t->interval = choose_interval(t->mcu_columns, 8, t->min_tile_width);
        return;
    }
    t->mcu_columns = (t->width + 8 * hmax - 1) / (8 * hmax);
    t->mcu_rows = (t->height + 8 * vmax - 1) / (8 * vmax);
    t->blocks_in_mcu = 0;
    for (int i = 0; i < t->components; i++) {
        int blocks = t->component[i].h * t->component[i].v;
        if (t->blocks_in_mcu + blocks > MAX_BLOCKS_IN_MCU) fail(failure, "corrupt: more than 10 blocks per MCU");
        for (int b = 0; b < blocks; b++) t->block_component[t->blocks_in_mcu++] = i;
    }
    t->interval = choose_interval(t->mcu_columns, 8 * hmax, t->min_tile_width);
}

static int magnitude_size(int value) {
    unsigned a = (unsigned)(value < 0 ? -value : value);
#if defined(__GNUC__) || defined(__clang__)
    return a ? 32 - __builtin_clz(a) : 0;
#else
    int size = 0;
    while (a) { size++; a >>= 1; }
    return size;
#endif
}

/* Room for `room` more symbols (64 per block at most) before an MCU is decoded, so that the loop
 * over a block records without a check per symbol; when there is none, recording stops. */
static void reserve_symbols(Transcoder *t, size_t room) {
    if (t->symbol_capacity - t->symbol_count >= room) return;
    /* the first guess: about one symbol per 4 bits of entropy-coded data (photos need 5-6) */
    size_t guess = 2 * (t->size - t->entropy_start) + 4096;
    size_t capacity = t->symbol_capacity ? 2 * t->symbol_capacity : guess;
    if (capacity < t->symbol_count + room) capacity = t->symbol_count + room;
    uint32_t *grown = capacity <= SYMBOLS_MAX ? realloc(t->symbols, capacity * sizeof *grown) : NULL;
    if (!grown) {  /* too many (or no memory): the writing pass decodes the scan again */
        t->recording = 0;
        return;
    }
    t->symbols = grown;
    t->symbol_capacity = capacity;
}

/* Emit one Huffman symbol and its extra bits (writer), or count it and record it for the replay
 * (`*record`, when recording). */
HOT void put_symbol(Transcoder *t, BitWriter *writer, const EncodeTable *codes, uint32_t **record,
                    int symbol, uint32_t bits, int size, uint32_t high) {
    if (writer) {
        if (!codes->size[symbol]) fail(&t->failure, "corrupt: symbol missing from the optimised table");
        writer_put(&t->failure, writer, codes->code[symbol], codes->size[symbol]);
        writer_put(&t->failure, writer, bits, size);
    } else {
        /* high: pack_symbol(slot, symbol, 0, size), from the lookup entry where there is one */
        t->frequency[high >> 20]++;
        if (record) *(*record)++ = high | bits;
    }
}

/* Copy one block: the DC coefficient is re-coded against `*previous` (the output's predictor),
 * every AC symbol is copied as decoded (same run/size, same extra bits) under the new tables.
 * The coefficients are never materialised: the block's AC coding stays exactly the input's. */
HOT void copy_block(Transcoder *t, BitReader *reader_state, BitWriter *writer, int recording,
                    const Component *c, int *predictor, int *previous) {
    Failure *failure = &t->failure;
    BitReader reader_copy = *reader_state, *reader = &reader_copy;  /* held in registers */
    /* recording (a constant where this is inlined): the caller made room for 64 symbols */
    uint32_t *cursor = recording ? t->symbols + t->symbol_count : NULL, *first = cursor;
    uint32_t **record = recording ? &cursor : NULL;
    uint64_t entry = reader_peek_symbol(failure, reader, &t->dc[c->dc_table]);
    int size = entry_extra(entry);
    int diff = extend((int)reader_take_symbol(failure, reader, entry), size);
    *predictor += diff;
    if (*predictor > 32767 || *predictor < -32767) fail(failure, "corrupt: DC coefficient out of range");
    int new_diff = *predictor - *previous;
    *previous = *predictor;
    size = magnitude_size(new_diff);
    if (size > 15) fail(failure, "corrupt: DC difference out of range");
    put_symbol(t, writer, &t->dc_codes[c->dc_table], record, size,
               (uint32_t)(new_diff < 0 ? new_diff - 1 : new_diff) & ((1u << size) - 1), size,
               pack_symbol(c->dc_table, size, 0, size));
    const DecodeTable *ac = &t->ac[c->ac_table];
    const EncodeTable *ac_codes = &t->ac_codes[c->ac_table];
    for (int k = 1; k < 64;) {
        entry = reader_peek_symbol(failure, reader, ac);
        int step = entry_step(entry);
        if (UNLIKELY(step == NO_EXTRA_BITS)) {  /* end of block, or 16 zeros */
            int rs = entry_symbol(entry);
            if (rs >> 4 != 15) {  /* end of block */
                reader_take_symbol(failure, reader, entry);
                put_symbol(t, writer, ac_codes, record, rs, 0, 0, entry_high(entry));
                break;
            }
            k += 16;
            if (k > 64) block_overrun(failure, reader, entry, "corrupt: zero run past the end of a block");
            reader_take_symbol(failure, reader, entry);
            put_symbol(t, writer, ac_codes, record, rs, 0, 0, entry_high(entry));
            continue;
        }
        k += step;
        if (k > 64) block_overrun(failure, reader, entry, "corrupt: coefficient past the end of a block");
        uint32_t bits = reader_take_extra(failure, reader, entry);
        put_symbol(t, writer, ac_codes, record, entry_symbol(entry), bits,
                   entry_extra(entry), entry_high(entry));
    }
    *reader_state = reader_copy;
    if (recording) t->symbol_count += (size_t)(cursor - first);
}

/* One pass over the scan: decode every MCU and either count symbols (writer == NULL) or write
 * the MCU as its own restart interval. */
BMI2_CLONES static void scan_pass(Transcoder *t, BitWriter *writer) {
    Failure *failure = &t->failure;
    BitReader reader = {t->data, t->entropy_start, t->size, 0, 0, 0, 0};
    int predictor[MAX_COMPONENTS] = {0};
    long total = (long)t->mcu_columns * t->mcu_rows;
    int next_restart = 0;
    int previous[MAX_COMPONENTS] = {0};
    size_t start = 0;
    /* mcu % restart_interval, mcu % interval and mcu / interval, counted instead of divided */
    long since_restart = 0, tile = 0;
    int in_tile = 0;
    for (long mcu = 0; mcu < total; mcu++) {
        if (t->restart_interval && mcu > 0 && since_restart == 0) {
            reader_restart(failure, &reader, next_restart);
            next_restart = (next_restart + 1) & 7;
            memset(predictor, 0, sizeof predictor);
        }
        if (in_tile == 0) {   /* the output restarts every tile */
            memset(previous, 0, sizeof previous);
            start = writer ? t->entropy.size : 0;
        }
        if (!writer && t->recording) reserve_symbols(t, 64 * (size_t)t->blocks_in_mcu);
        /* three copies of copy_block, each with its branches on writing and recording folded */
        if (writer) {
            for (int b = 0; b < t->blocks_in_mcu; b++) {
                int ci = t->block_component[b];
                copy_block(t, &reader, writer, 0, &t->component[ci], &predictor[ci], &previous[ci]);
            }
        } else if (t->recording) {
            for (int b = 0; b < t->blocks_in_mcu; b++) {
                int ci = t->block_component[b];
                copy_block(t, &reader, NULL, 1, &t->component[ci], &predictor[ci], &previous[ci]);
            }
        } else {
            for (int b = 0; b < t->blocks_in_mcu; b++) {
                int ci = t->block_component[b];
                copy_block(t, &reader, NULL, 0, &t->component[ci], &predictor[ci], &previous[ci]);
            }
        }
        int tile_ends = in_tile + 1 == t->interval;
        if (!writer && t->recording && tile_ends) t->tile_ends[tile] = t->symbol_count;
        if (writer && tile_ends) {
            writer_align(failure, writer);
            size_t length = t->entropy.size - start;
            if (length > 65535) fail(failure, "unsupported: a tile of %zu bytes", length);
            t->tile_lengths[tile] = (uint16_t)length;
            if (mcu + 1 < total) {
                buffer_byte(failure, &t->entropy, 0xFF);
                buffer_byte(failure, &t->entropy, (uint8_t)(0xD0 + (tile & 7)));
            }
        }
        if (tile_ends) {
            in_tile = 0;
            tile++;
        } else {
            in_tile++;
        }
        if (++since_restart == t->restart_interval) since_restart = 0;
    }
    t->scan_end = reader.position;
}

/* The writing pass from the counting pass's records: each tile's symbols under the optimised
 * tables, padded to a byte and followed by its restart marker, exactly what scan_pass writes. */
/* 8 bytes, most significant first. */
HOT void store_be64(uint8_t *p, uint64_t value) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    value = __builtin_bswap64(value);
    memcpy(p, &value, 8);
#else
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(value >> (56 - 8 * i));
#endif
}

COLD uint8_t *put_stuffed(uint8_t *w, uint64_t word, int bytes) {
    for (int i = 0; i < bytes; i++) {
        uint8_t byte = (uint8_t)(word >> (56 - 8 * i));
        *w++ = byte;
        if (byte == 0xFF) *w++ = 0x00;
    }
    return w;
}

BMI2_CLONES static void replay_pass(Transcoder *t, long tiles) {
    Failure *failure = &t->failure;
    /* Every (slot, symbol) as its code shifted above its extra bits, and the length of both, indexed
     * by a record's top 12 bits: (code << extra bits << 6) | (code length + extra bits); 0 for a
     * symbol without a code. */
    uint64_t *codes = t->replay_codes;
    for (int slot = 0; slot < 8; slot++) {
        const EncodeTable *table = slot < 4 ? &t->dc_codes[slot] : &t->ac_codes[slot - 4];
        for (int symbol = 0; symbol < 256; symbol++) {
            int extra = slot < 4 ? symbol : symbol & 15;  /* DC symbols with a code are <= 15 */
            codes[(slot << 8) | symbol] = table->size[symbol] && extra <= 15
                ? ((uint64_t)table->code[symbol] << (extra + 6)) | (uint64_t)(table->size[symbol] + extra) : 0;
        }
    }
    /* Every symbol recorded was counted, and every symbol counted has a code (optimal_table):
     * checked here once rather than per symbol. */
    for (int slot = 0; slot < 8; slot++) {
        const long *frequency = t->frequency + 256 * slot;
        for (int symbol = 0; symbol < 256; symbol++)
            if (frequency[symbol] && !codes[(slot << 8) | symbol])
                fail(failure, "corrupt: symbol missing from the optimised table");
    }
    /* The bit writer of writer_put, with its pending bits (`count`, at most 7 between symbols)
     * in `pending`, and the whole bytes written after every symbol with one 8-byte store of the
     * bits left-aligned (the bytes below them are zero, the partial byte is not 0xFF, so the
     * store holds 0xFF only where a whole byte is; then the byte-at-a-time stuffing). */
    Buffer *out = &t->entropy;
    const uint32_t *symbols = t->symbols;
    uint64_t pending = 0;
    int count = 0;
    size_t s = 0;
    for (long tile = 0; tile < tiles; tile++) {
        size_t end = t->tile_ends[tile];
        /* a symbol writes at most 8 bytes (4 of bits, each maybe stuffed), the store 8 more */
        buffer_reserve(failure, out, (end - s) * 8 + 32);
        uint8_t *start = out->data + out->size, *w = start;
        for (; s < end; s++) {
            uint32_t packed = symbols[s];
            uint64_t code = codes[packed >> 20];
            int length = (int)(code & 63);
            /* the code and its extra bits in one put: at most 16 + 15 bits, 38 with the pending */
            pending = (pending << length) | (code >> 6) | (packed & 0xFFFF);
            count += length;
            uint64_t word = pending << (64 - count);
            if (UNLIKELY((~word - 0x0101010101010101ULL) & word & 0x8080808080808080ULL)) {
                w = put_stuffed(w, word, count >> 3);
            } else {
                store_be64(w, word);
                w += count >> 3;
            }
            count &= 7;
        }
        if (count) {  /* pad to a byte boundary with one bits (T.81 F.1.2.3) */
            uint8_t byte = (uint8_t)((pending << (8 - count)) | ((1u << (8 - count)) - 1));
            *w++ = byte;
            if (byte == 0xFF) *w++ = 0x00;
            count = 0;
        }
        size_t length = (size_t)(w - start);
        out->size += length;
        if (length > 65535) fail(failure, "unsupported: a tile of %zu bytes", length);
        t->tile_lengths[tile] = (uint16_t)length;
        if (tile + 1 < tiles) {
            buffer_byte(failure, &t->entropy, 0xFF);
            buffer_byte(failure, &t->entropy, (uint8_t)(0xD0 + (tile & 7)));
        }
    }
}

/* After the scan: the image must end with EOI and nothing after it. Bytes after EOI (an MPO's
 * second image, a phone's appended video, padding) would be dropped by the rewrite while the
 * build said "tiled": such a file is kept as it is instead ("data after the image"). */
static void check_scan_end(Transcoder *t) {
    Failure *failure = &t->failure;
    size_t p = t->scan_end;
    while (p < t->size && t->data[p] == 0xFF && p + 1 < t->size && t->data[p + 1] == 0xFF) p++;
    if (p + 1 >= t->size || t->data[p] != 0xFF || t->data[p + 1] != 0xD9)
        fail(failure, "unsupported: data after the image (no EOI right after the scan)");
    if (p + 2 < t->size)
        fail(failure, "unsupported: data after the image (%zu bytes after EOI)", t->size - (p + 2));
}

static void transcode(Transcoder *t) {
    Failure *failure = &t->failure;
    parse_header(t);
    plan_geometry(t);
    long total = (long)t->mcu_columns * t->mcu_rows;
    const long *dc_frequency = t->frequency, *ac_frequency = t->frequency + 4 * 256;
    EncodeTable *dc_codes = t->dc_codes, *ac_codes = t->ac_codes;
    uint8_t (*counts)[17] = t->counts, (*values)[256] = t->values;
    int *totals = t->totals;

    long tiles = total / t->interval;
    t->tile_ends = malloc((size_t)tiles * sizeof *t->tile_ends);
    t->recording = t->tile_ends != NULL;
    scan_pass(t, NULL);
    check_scan_end(t);
    int used_dc[4] = {0}, used_ac[4] = {0};
    for (int i = 0; i < t->components; i++) {
        used_dc[t->component[i].dc_table] = 1;
        used_ac[t->component[i].ac_table] = 1;
    }
    for (int id = 0; id < 4; id++) {
        if (used_dc[id]) {
            optimal_table(dc_frequency + 256 * id, counts[id], values[id], &totals[id]);
            build_encode_table(counts[id], values[id], totals[id], &dc_codes[id]);
        }
        if (used_ac[id]) {
            optimal_table(ac_frequency + 256 * id, counts[4 + id], values[4 + id], &totals[4 + id]);
            build_encode_table(counts[4 + id], values[4 + id], totals[4 + id], &ac_codes[id]);
        }
    }

    t->tile_lengths = malloc((size_t)tiles * sizeof(uint16_t));
    if (!t->tile_lengths) fail(failure, "memory: cannot allocate the tile table");
    buffer_reserve(failure, &t->entropy, t->size + (size_t)total * 3);
    BitWriter writer = {&t->entropy, 0, 0};
    if (t->recording) {
        replay_pass(t, tiles);  /* one entropy decode in all */
    } else {
        scan_pass(t, &writer);
    }

    /* assemble: SOI, tile tables (first, so readers spot a tiled JPEG at a glance), kept
     * segments, DHT, DRI, SOS, entropy data, EOI */
    Buffer *r = &t->result;
    buffer_reserve(failure, r, t->kept.size + t->entropy.size + (size_t)tiles * 2 + 4096);
    buffer_u16(failure, r, 0xFFD8);
    for (long first = 0; first < tiles; first += TILE_MAX_PER_SEGMENT) {
        long count = tiles - first < TILE_MAX_PER_SEGMENT ? tiles - first : TILE_MAX_PER_SEGMENT;
        buffer_u16(failure, r, 0xFFE9);
        buffer_u16(failure, r, (unsigned)(2 + TILE_HEADER_BYTES + 2 * count));
        buffer_append(failure, r, (const uint8_t *)TILE_SIGNATURE, 8);
        buffer_byte(failure, r, TILE_VERSION);
        buffer_byte(failure, r, 0);
        buffer_u16(failure, r, (unsigned)(t->mcu_columns / t->interval));
        buffer_u16(failure, r, (unsigned)t->mcu_rows);
        buffer_u16(failure, r, (unsigned)(first >> 16));
        buffer_u16(failure, r, (unsigned)(first & 0xFFFF));
        for (long i = first; i < first + count; i++) buffer_u16(failure, r, t->tile_lengths[i]);
    }
    buffer_append(failure, r, t->kept.data, t->kept.size);
    for (int slot = 0; slot < 8; slot++) {
        int id = slot & 3, ac = slot >> 2;
        if (!(ac ? used_ac[id] : used_dc[id])) continue;
        buffer_u16(failure, r, 0xFFC4);
        buffer_u16(failure, r, 2 + 17 + (unsigned)totals[slot]);
        buffer_byte(failure, r, (uint8_t)((ac << 4) | id));
        buffer_append(failure, r, counts[slot] + 1, 16);
        buffer_append(failure, r, values[slot], (size_t)totals[slot]);
    }
    buffer_u16(failure, r, 0xFFDD);
    buffer_u16(failure, r, 4);
    buffer_u16(failure, r, (unsigned)t->interval);
    buffer_u16(failure, r, 0xFFDA);
    buffer_u16(failure, r, 6 + 2 * (unsigned)t->components);
    buffer_byte(failure, r, (uint8_t)t->components);
    for (int i = 0; i < t->components; i++) {
        buffer_byte(failure, r, (uint8_t)t->component[i].id);
        buffer_byte(failure, r, (uint8_t)((t->component[i].dc_table << 4) | t->component[i].ac_table));
    }
    buffer_byte(failure, r, 0);
    buffer_byte(failure, r, 63);
    buffer_byte(failure, r, 0);
    buffer_append(failure, r, t->entropy.data, t->entropy.size);
    buffer_u16(failure, r, 0xFFD9);

}

/* ------------------------------------------------------------------------------------------ */
/* Python binding                                                                              */

static PyObject *py_transcode(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    long long max_pixels;
    int min_tile_width = 16;
    if (!PyArg_ParseTuple(args, "y*L|i:transcode", &view, &max_pixels, &min_tile_width)) return NULL;
    if (min_tile_width < 8 || min_tile_width > 1024) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "min_tile_width must be in 8..1024");
        return NULL;
    }
    Transcoder *t = calloc(1, sizeof *t);
    if (!t) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    /* The data is parsed, validated and read twice with the GIL released: a writable buffer
     * (bytearray, numpy) could change meanwhile, so work on one private copy of it. */
    uint8_t *copy = NULL;
    if (!view.readonly) {
        copy = malloc(view.len ? (size_t)view.len : 1);
        if (!copy) {
            free(t);
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        memcpy(copy, view.buf, (size_t)view.len);
    }
    t->data = copy ? copy : view.buf;
    t->size = (size_t)view.len;
    t->max_pixels = max_pixels;
    t->min_tile_width = min_tile_width;
    volatile int failed = 0;  /* set after a longjmp: volatile, as C11 7.13.2.1 asks */
    Py_BEGIN_ALLOW_THREADS
    /* setjmp only as a whole controlling expression (C11 7.13.1.1): `x = setjmp() != 0` is not
     * one of the contexts the standard allows. */
    if (setjmp(t->failure.jump) == 0) {
        transcode(t);
    } else {
        failed = 1;
    }
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (failed) {
        PyErr_SetString(PyExc_ValueError, t->failure.message);
    } else {
        result = PyBytes_FromStringAndSize((const char *)t->result.data, (Py_ssize_t)t->result.size);
    }
    free(t->kept.data);
    free(t->entropy.data);
    free(t->result.data);
    free(t->tile_lengths);
    free(t->symbols);
    free(t->tile_ends);
    free(t);
    free(copy);
    PyBuffer_Release(&view);
    return result;
}


/* ------------------------------------------------------------------------------------------ */
/* reading: cut a window of tiles (the compiled twin of packer/tiles.py's read_layout +        */
/* window_jpeg; the same checks, T1-T3 of formats/SPEC.md section 13, the same bytes)         */

static long floor_div(long a, long b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* Returns 1 and fills *out (malloc'd), or 0: not a tiled JPEG, the tables disagree with the
 * data, or the window would cover every tile. Never reads outside data[0, size). */
static int cut_window(const uint8_t *d, size_t size, double left, double top, double right,
                      double bottom, long margin, uint8_t **out, size_t *out_size, long *origin) {
    /* T1: SOI, then an APP9 PKTILES segment */
    if (size < 14 || d[0] != 0xFF || d[1] != 0xD8 || d[2] != 0xFF || d[3] != 0xE9 ||
        memcmp(d + 6, TILE_SIGNATURE, 8) != 0)
        return 0;
    size_t position = 2, sof = 0, tables_end = 2, entropy = 0;
    int have_sof = 0, tables_open = 1, tables = 0;
    unsigned restart_interval = 0, sos_components = 0;
    for (;;) {  /* T2 */
        if (position + 4 > size || d[position] != 0xFF) return 0;
        unsigned marker = d[position + 1], length = read_u16(d + position + 2);
        size_t end = position + 2 + length;
        if (length < 2 || end > size) return 0;
        int is_table = marker == 0xE9 && length >= 10 && memcmp(d + position + 4, TILE_SIGNATURE, 8) == 0;
        if (is_table) {
            if (!tables_open) return 0;  /* tables must be contiguous from offset 2 */
            tables++;
            tables_end = end;
        } else {
            tables_open = 0;
        }
        if (marker == 0xC0 || marker == 0xC1) {
            if (have_sof || length < 8) return 0;
            have_sof = 1;
            sof = position;
        } else if (marker == 0xC2 || marker == 0xC3 || (marker >= 0xC5 && marker <= 0xC7) ||
                   (marker >= 0xC9 && marker <= 0xCB) || (marker >= 0xCD && marker <= 0xCF)) {
            return 0;
        } else if (marker == 0xDD && length == 4) {
            restart_interval = read_u16(d + position + 4);
        } else if (marker == 0xDA) {
            if (length < 3) return 0;
            sos_components = d[position + 4];
            entropy = end;
            break;
        }
        position = end;
    }
    if (!tables || !have_sof || sof < tables_end || restart_interval < 1) return 0;
    unsigned components = d[sof + 9];
    if (read_u16(d + sof + 2) != 8 + 3 * components) return 0;
    long height = (long)read_u16(d + sof + 5), width = (long)read_u16(d + sof + 7);
    if (d[sof + 4] != 8 || width < 1 || height < 1 || components < 1 || components > 4) return 0;
    if (sos_components != components) return 0;
    long hmax = 0, vmax = 0;
    for (unsigned i = 0; i < components; i++) {
        long h = d[sof + 11 + 3 * i] >> 4, v = d[sof + 11 + 3 * i] & 15;
        if (h > hmax) hmax = h;
        if (v > vmax) vmax = v;
    }
    if (components == 1 || hmax < 1 || vmax < 1) hmax = vmax = 1;
    long mcu_columns = (width + 8 * hmax - 1) / (8 * hmax), rows = (height + 8 * vmax - 1) / (8 * vmax);
    if (mcu_columns % (long)restart_interval) return 0;
    long columns = mcu_columns / (long)restart_interval, tiles = columns * rows;
    long tile_width = 8 * hmax * (long)restart_interval, tile_height = 8 * vmax;
    /* the tables: versions, shape, contiguous numbering, and the lengths' sum */
    size_t total = 0;
    long listed = 0;
    for (size_t at = 2; at < tables_end;) {
        unsigned length = read_u16(d + at + 2);
        if (length < 2 + TILE_HEADER_BYTES || (length - 2 - TILE_HEADER_BYTES) % 2) return 0;
        const uint8_t *h = d + at + 4;
        unsigned long first = ((unsigned long)read_u16(h + 14) << 16) | read_u16(h + 16);
        if (h[8] != TILE_VERSION || (long)read_u16(h + 10) != columns || (long)read_u16(h + 12) != rows ||
            (long)first != listed)
            return 0;
        long count = (long)(length - 2 - TILE_HEADER_BYTES) / 2;
        for (long k = 0; k < count; k++) total += read_u16(h + TILE_HEADER_BYTES + 2 * k) + 2;
        listed += count;
        at += 2 + length;
    }
    if (listed != tiles || entropy + total != size || d[size - 2] != 0xFF || d[size - 1] != 0xD9) return 0;

    /* the window, exactly as TileLayout.window computes it */
    long c0 = floor_div((long)floor(left - (double)margin), tile_width);
    long r0 = floor_div((long)floor(top - (double)margin), tile_height);
    long c1 = -floor_div(-(long)ceil(right + (double)margin), tile_width);
    long r1 = -floor_div(-(long)ceil(bottom + (double)margin), tile_height);
    if (c0 < 0) c0 = 0;
    if (r0 < 0) r0 = 0;
    if (c1 > columns) c1 = columns;
    if (r1 > rows) r1 = rows;
    if (c1 < c0 + 1) c1 = c0 + 1;
    if (r1 < r0 + 1) r1 = r0 + 1;
    if (c1 > columns || r1 > rows) return 0;
    if (c1 - c0 == columns && r1 - r0 == rows) return 0;

    /* tile offsets: walk the lengths once (they are in the tables, 2 bytes each) */
    long *starts = malloc((size_t)tiles * sizeof(long));
    uint16_t *lengths = malloc((size_t)tiles * sizeof(uint16_t));
    uint8_t *jpeg = NULL;
    if (!starts || !lengths) goto refuse;
    {
        long k = 0;
        size_t offset = entropy;
        for (size_t at = 2; at < tables_end;) {
            unsigned length = read_u16(d + at + 2);
            long count = (long)(length - 2 - TILE_HEADER_BYTES) / 2;
            for (long j = 0; j < count; j++, k++) {
                lengths[k] = (uint16_t)read_u16(d + at + 4 + TILE_HEADER_BYTES + 2 * j);
                starts[k] = (long)offset;
                offset += lengths[k] + 2u;
            }
            at += 2 + length;
        }
    }
    long x = c0 * tile_width, y = r0 * tile_height;
    long out_width = (c1 * tile_width < width ? c1 * tile_width : width) - x;
    long out_height = (r1 * tile_height < height ? r1 * tile_height : height) - y;
    size_t prefix = 2 + (sof + 5 - tables_end), suffix = entropy - (sof + 9), body = 0;
    for (long r = r0; r < r1; r++)
        body += (size_t)(starts[r * columns + c1 - 1] + lengths[r * columns + c1 - 1] + 2 - starts[r * columns + c0]);
    size_t length = prefix + 4 + suffix + body;
    jpeg = malloc(length);
    if (!jpeg) goto refuse;
    uint8_t *w = jpeg;
    *w++ = 0xFF;
    *w++ = 0xD8;
    memcpy(w, d + tables_end, sof + 5 - tables_end);
    w += sof + 5 - tables_end;
    *w++ = (uint8_t)(out_height >> 8);
    *w++ = (uint8_t)out_height;
    *w++ = (uint8_t)(out_width >> 8);
    *w++ = (uint8_t)out_width;
    memcpy(w, d + sof + 9, suffix);
    w += suffix;
    long j = 0, used = (c1 - c0) * (r1 - r0);
    for (long r = r0; r < r1; r++) {
        long first = r * columns + c0;
        /* T3: a row's first tile starts right after a restart marker (or is tile 0) */
        if (first > 0) {
            long s = starts[first];
            if (d[s - 2] != 0xFF || (d[s - 1] & 0xF8) != 0xD0) goto refuse;
        }
        for (long c = c0; c < c1; c++, j++) {
            long k = r * columns + c;
            memcpy(w, d + starts[k], lengths[k]);
            w += lengths[k];
            const uint8_t *marker = d + starts[k] + lengths[k];
            int last_of_image = k == tiles - 1;
            /* T3: every tile is followed by a restart marker, or EOI after the last one */
            if (marker[0] != 0xFF || (last_of_image ? marker[1] != 0xD9 : (marker[1] & 0xF8) != 0xD0))
                goto refuse;
            *w++ = 0xFF;
            *w++ = j + 1 < used ? (uint8_t)(0xD0 + (j & 7)) : 0xD9;
        }
    }
    free(starts);
    free(lengths);
    *out = jpeg;
    *out_size = (size_t)(w - jpeg);
    origin[0] = x;
    origin[1] = y;
    origin[2] = out_width;
    origin[3] = out_height;
    return 1;
refuse:
    free(starts);
    free(lengths);
    free(jpeg);
    return 0;
}

static PyObject *py_window(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    double left, top, right, bottom;
    long margin;
    if (!PyArg_ParseTuple(args, "y*ddddl:window", &view, &left, &top, &right, &bottom, &margin))
        return NULL;
    /* (long)floor(x) is undefined for NaN, infinities and values out of long's range: refuse
     * them as the Python twin does (TileLayout.window raises ValueError), before any cast. */
    const double limit = 1e15;
    if (!isfinite(left) || !isfinite(top) || !isfinite(right) || !isfinite(bottom) ||
        fabs(left) > limit || fabs(top) > limit || fabs(right) > limit || fabs(bottom) > limit ||
        margin < 0 || margin > (1L << 30)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "window box must be finite numbers within +-1e15 and the margin "
                                          "in 0..2^30");
        return NULL;
    }
    /* The tile tables are validated, then used, with the GIL released: a writable buffer is
     * copied first so the bytes checked are the bytes used. */
    uint8_t *copy = NULL;
    if (!view.readonly) {
        copy = malloc(view.len ? (size_t)view.len : 1);
        if (!copy) {
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
        memcpy(copy, view.buf, (size_t)view.len);
    }
    const uint8_t *input = copy ? copy : view.buf;
    uint8_t *jpeg = NULL;
    size_t size = 0;
    long origin[4];
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = cut_window(input, (size_t)view.len, left, top, right, bottom, margin, &jpeg, &size, origin);
    Py_END_ALLOW_THREADS
    free(copy);
    PyBuffer_Release(&view);
    if (!ok) Py_RETURN_NONE;
    PyObject *data = PyByteArray_FromStringAndSize((const char *)jpeg, (Py_ssize_t)size);
    free(jpeg);
    if (!data) return NULL;
    return Py_BuildValue("(Nllll)", data, origin[0], origin[1], origin[2], origin[3]);
}

static PyMethodDef methods[] = {
    {"transcode", py_transcode, METH_VARARGS,
     "transcode(data, max_pixels, min_tile_width=16) -> bytes\n\n"
     "Losslessly rewrite a sequential Huffman JPEG with one restart interval per tile, optimised\n"
     "Huffman tables and APP9 PKTILES tables of tile lengths. Raises ValueError starting with\n"
     "'unsupported:', 'corrupt:' or 'memory:'."},
    {"window", py_window, METH_VARARGS,
     "window(data, left, top, right, bottom, margin) -> (jpeg, x, y, width, height) | None\n\n"
     "The tiles of a tiled JPEG under the box widened by margin, as a JPEG (a bytearray), with\n"
     "the window's origin and size; None when data is not a tiled JPEG, its tables disagree\n"
     "with it (formats/SPEC.md T1-T3), or the window would be the whole image."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packer.codecs._jpegtiles",
    "Lossless JPEG re-tiling for packer's tiled codec (see packer/tiles.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegtiles(void) { return PyModule_Create(&module_definition); }
