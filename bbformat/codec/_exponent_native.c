/* The compiled decoder of payload codec 3 (SPEC.md 8.7): the rANS stream and the rest fields
 * of one payload, straight to its symbols. bbformat/codec/exponent.py parses and checks
 * everything before the stream and calls decode() here; its numpy decoder is the reference,
 * and the two must agree on every input (tests/test_exponent_native.py).
 *
 * Integer arithmetic only: the output does not depend on the compiler or the CPU. Little-endian
 * hosts only (exponent.py does not use it elsewhere): tables and symbols are stored native.
 * The GIL is released while decoding, so chunks decode in parallel threads. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SLOT_BITS 14
#define SLOT_MASK ((1u << SLOT_BITS) - 1)
#define RANS_LOW (1u << 16)
#define MAX_CLASSES 16 /* SPEC.md 8.7: K <= 16 */
#define LUT_BYTES ((1u << SLOT_BITS) * 2u) /* a table's slot -> entry index part */

/* error codes returned to exponent.py, which names them */
#if defined(_MSC_VER)
#define ALWAYS_INLINE __forceinline
#define restrict __restrict
#elif defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* The argument list of decode(); exponent.py uses this module only if it says the same (an
 * extension built from another version of this file falls back to numpy, never crashes). */
#define ABI 2

enum { OK = 0, ERR_STREAM_SHORT = 1, ERR_WORDS_LEFT = 2, ERR_LANE_END = 3 };

typedef struct {     /* one table entry: frequency, cumulative start and its code */
    uint16_t freq_lo; /* the frequency minus 1 (1..2^14 stored as 0..2^14-1) */
    uint16_t start;
    uint32_t code;    /* shifted into place: code << (mantissa bits not joined) */
} entry_t;

typedef struct {
    const uint8_t *const *tables; /* per table: its 2^14 slots' entry indexes (u16), then its entries */
    const uint8_t *tables_base;   /* the buffer all tables lie in (< 2^31 bytes: SIMD gathers use int32 offsets) */
    int simd;                     /* use the AVX2 steps where the CPU has them */
    uint32_t *states;        /* Q lanes */
    size_t ntables;
    uint32_t lanes;
    const uint8_t *words;    /* u16 LE words, read forward */
    size_t nwords, wpos;     /* words in the stream, the next to read */
    uint32_t lane;           /* the lane of the next symbol */
    const uint8_t *rest_low; /* P * b0 bytes */
    const uint8_t *rest_high;/* ceil(P/8) * b1 bytes */
    unsigned b0, b1, shift, width;
} ctx_t;

static ALWAYS_INLINE uint32_t load16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

static ALWAYS_INLINE uint64_t load_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned k = 0; k < n; ++k)
        v |= (uint64_t)p[k] << (8 * k);
    return v;
}

/* One symbol's step through lane state *XP with class CLS's table; leaves code << shift in
 * CODE. CHECKED: a word is read only if one is left (else wp passes nwords, which the caller
 * reports). Otherwise the caller made sure enough words are left and the renormalisation is
 * branchless: the word is loaded whether or not it is used. */
#define STEP(XP, CLS, CHECKED, CODE)                                                 \
    do {                                                                            \
        const uint32_t x0_ = *(XP), slot_ = x0_ & SLOT_MASK;                        \
        const uint8_t *tb_ = tab[CLS];                                              \
        const entry_t e_ = ((const entry_t *)(tb_ + LUT_BYTES))[((const uint16_t *)tb_)[slot_]]; \
        uint32_t y_ = ((uint32_t)e_.freq_lo + 1u) * (x0_ >> SLOT_BITS) + slot_ - e_.start; \
        const uint32_t need_ = y_ < RANS_LOW;                                       \
        uint32_t w_ = 0;                                                            \
        if (!(CHECKED) || wp < nwords)                                              \
            w_ = load16(words + 2 * wp);                                            \
        const uint32_t keep_ = need_ - 1u; /* all ones when no word is needed */    \
        y_ = (y_ & keep_) | (((y_ << 16) | w_) & ~keep_); /* no branch to mispredict */ \
        wp += need_;                                                                \
        *(XP) = y_;                                                                 \
        (CODE) = e_.code;                                                           \
    } while (0)


#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2 1
static int32_t perm_of_mask[256][8]; /* lane i <- the popcount(mask below i)-th next word */

static void init_perm(void)
{
    for (int m = 0; m < 256; ++m)
        for (int i = 0, k = 0; i < 8; ++i)
            perm_of_mask[m][i] = (m >> i) & 1 ? k++ : 0;
}

/* Groups of 8 consecutive symbols (8 consecutive lanes, one step each, exactly as the scalar
 * STEP in that order): returns how many symbols it did (a multiple of 8, at most m). The
 * caller guarantees at least m words are left, so each group's 8-word load is in bounds.
 * cls: the symbols' column classes (NULL: class 0); off: each class's table offset from
 * tables_base. */
__attribute__((target("avx2"))) static size_t steps_avx2(const uint8_t *base, const int32_t *off, uint32_t *xs,
                                                         size_t m, const uint8_t *cls, const uint8_t *words,
                                                         size_t *wpp, void *out, int wide)
{
    const __m256i slot_mask = _mm256_set1_epi32((int)SLOT_MASK), low16 = _mm256_set1_epi32(0xFFFF);
    const __m256i one = _mm256_set1_epi32(1), lut_bytes = _mm256_set1_epi32((int)LUT_BYTES);
    const __m256i off_lo = _mm256_loadu_si256((const __m256i *)off), off_hi = _mm256_loadu_si256((const __m256i *)(off + 8));
    const __m256i seven = _mm256_set1_epi32(7);
    size_t wp = *wpp, j = 0;
    for (; j + 8 <= m; j += 8) {
        __m256i toff;
        if (cls) {
            const __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(cls + j)));
            const __m256i lo = _mm256_permutevar8x32_epi32(off_lo, k), hi = _mm256_permutevar8x32_epi32(off_hi, k);
            toff = _mm256_blendv_epi8(lo, hi, _mm256_cmpgt_epi32(k, seven));
        } else {
            toff = _mm256_set1_epi32(off[0]);
        }
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xs + j));
        const __m256i slot = _mm256_and_si256(x, slot_mask);
        const __m256i e = _mm256_and_si256(
            _mm256_i32gather_epi32((const int *)base, _mm256_add_epi32(toff, _mm256_add_epi32(slot, slot)), 1), low16);
        const __m256i eoff = _mm256_add_epi32(_mm256_add_epi32(toff, lut_bytes), _mm256_slli_epi32(e, 3));
        const __m256i fs = _mm256_i32gather_epi32((const int *)base, eoff, 1);          /* freq - 1 | start << 16 */
        const __m256i code = _mm256_i32gather_epi32((const int *)(base + 4), eoff, 1);  /* code << shift */
        const __m256i f = _mm256_add_epi32(_mm256_and_si256(fs, low16), one);
        __m256i y = _mm256_sub_epi32(_mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, SLOT_BITS)), slot),
                                     _mm256_srli_epi32(fs, 16));
        const __m256i need = _mm256_cmpeq_epi32(_mm256_min_epu32(y, low16), y); /* y < 2^16, unsigned */
        const unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
        const __m256i w = _mm256_permutevar8x32_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(words + 2 * wp))),
            _mm256_loadu_si256((const __m256i *)perm_of_mask[mask]));
        y = _mm256_blendv_epi8(y, _mm256_or_si256(_mm256_slli_epi32(y, 16), w), need);
        wp += (size_t)__builtin_popcount(mask);
        _mm256_storeu_si256((__m256i *)(xs + j), y);
        if (wide) {
            _mm256_storeu_si256((__m256i *)((uint32_t *)out + j), code);
        } else {
            const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(code, code), 0x08);
            _mm_storeu_si128((__m128i *)((uint16_t *)out + j), _mm256_castsi256_si128(p));
        }
    }
    *wpp = wp;
    return j;
}

static int cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}
#else
#define HAVE_AVX2 0
static void init_perm(void) {}
static int cpu_has_avx2(void) { return 0; }
#endif

/* Symbols [0, n) of one segment, whose table per class is tab[] (off[]: its offset from tables_base) and whose column
 * classes are map (NULL: one table), into out as code << shift. `checked`: the careful step;
 * the caller passes 0 only when at least n words are left. Runs are cut where the lane or
 * the column wraps, so the inner loops have neither test. */
static ALWAYS_INLINE void codes(ctx_t *c, const uint8_t *const *tab, const int32_t *off, const uint8_t *map,
                                size_t r, size_t *colp, size_t n, void *outv, const int checked, const int wide)
{
    uint32_t *restrict states = c->states;
    const uint8_t *restrict words = c->words;
    const size_t nwords = c->nwords;
    size_t wp = c->wpos, col = *colp, i = 0;
    uint32_t l = c->lane, code;
    while (i < n) {
        size_t m = n - i;
        if (c->lanes - l < m)
            m = c->lanes - l;
        uint32_t *restrict xs = states + l;
        uint16_t *restrict o16 = (uint16_t *)outv + i;
        uint32_t *restrict o32 = (uint32_t *)outv + i;
        size_t j0 = 0; /* symbols of this run done by the SIMD steps */
#if HAVE_AVX2
        if (!checked && c->simd) {
            size_t mm = m;
            if (map != NULL && r - col < mm)
                mm = r - col;
            j0 = steps_avx2(c->tables_base, off, xs, mm, map ? map + col : NULL, words, &wp,
                            wide ? (void *)o32 : (void *)o16, wide);
        }
#endif
        if (map == NULL) {
            for (size_t j = j0; j < m; ++j) {
                STEP(xs + j, 0, checked, code);
                if (wide) o32[j] = code; else o16[j] = (uint16_t)code;
            }
        } else {
            const uint8_t *restrict cs = map + col;
            if (r - col < m)
                m = r - col;
            for (size_t j = j0; j < m; ++j) {
                STEP(xs + j, cs[j], checked, code);
                if (wide) o32[j] = code; else o16[j] = (uint16_t)code;
            }
            col += m;
            if (col == r)
                col = 0;
        }
        i += m;
        l += (uint32_t)m;
        if (l == c->lanes)
            l = 0;
    }
    c->wpos = wp;
    c->lane = l;
    *colp = col;
}

/* ORs the rest fields into out, whose symbols hold code << shift: R = 1 + shift bits each,
 * b0 = R div 8 whole bytes, then b1 = R mod 8 bits, 8 symbols to a group of b1 bytes. R and
 * wide are constants in each caller below, so the compiler unrolls the group. */
static ALWAYS_INLINE void rests(const ctx_t *c, size_t total, void *outv, const unsigned R, const int wide)
{
    const unsigned b0 = R / 8, b1 = R % 8, shift = R - 1, top = wide ? 31 : 15;
    const uint8_t *restrict low = c->rest_low, *restrict high = c->rest_high;
    uint16_t *restrict o16 = outv;
    uint32_t *restrict o32 = outv;
    const uint64_t hmask = (1ull << b1) - 1, smask = (1ull << shift) - 1;
    const size_t full = total / 8;
    for (size_t g = 0; g <= full; ++g) {
        const size_t n = g < full ? 8 : total % 8;
        const uint64_t h = b1 && n ? load_le(high + g * b1, b1) : 0;
        for (size_t k = 0; k < n; ++k) {
            const size_t i = g * 8 + k;
            uint64_t rest = b0 ? load_le(low + i * b0, b0) : 0;
            rest |= ((h >> (b1 * k)) & hmask) << (8 * b0);
            const uint64_t v = ((rest >> shift) << top) | (rest & smask);
            if (wide) o32[i] |= (uint32_t)v; else o16[i] |= (uint16_t)v;
        }
    }
}

/* rests() for each rest width R a conforming file can have (SPEC.md 8.7: float16 4..11,
 * bfloat16 4..8, float32 20..24 bits); any other goes through the generic loop. */
static void rests_any(const ctx_t *c, size_t total, void *out)
{
    const unsigned R = 1 + c->shift;
#define CASE16(r) case r: rests(c, total, out, r, 0); return;
#define CASE32(r) case r: rests(c, total, out, r, 1); return;
    if (c->width == 16) {
        switch (R) { CASE16(4) CASE16(5) CASE16(6) CASE16(7) CASE16(8) CASE16(9) CASE16(10) CASE16(11) default: break; }
    } else {
        switch (R) { CASE32(20) CASE32(21) CASE32(22) CASE32(23) CASE32(24) default: break; }
    }
#undef CASE16
#undef CASE32
    rests(c, total, out, R, c->width == 32);
}

#define RUN_ARGS ctx_t *c, const uint8_t *const *tab, const int32_t *off, const uint8_t *map, size_t r, size_t *col, size_t n, void *out
static void codes16(RUN_ARGS) { codes(c, tab, off, map, r, col, n, out, 0, 0); }
static void codes16_checked(RUN_ARGS) { codes(c, tab, off, map, r, col, n, out, 1, 0); }
static void codes32(RUN_ARGS) { codes(c, tab, off, map, r, col, n, out, 0, 1); }
static void codes32_checked(RUN_ARGS) { codes(c, tab, off, map, r, col, n, out, 1, 1); }

#define BLOCK 1024 /* symbols per call of a codes loop; a block with this many words left skips the word check */

/* Every symbol of the payload: the codes, segment by segment, then the rest fields. */
static void run(ctx_t *c, void *out, size_t nseg, const int64_t *seg_n, const int64_t *seg_r, const int64_t *seg_base,
                const uint8_t *const *seg_map)
{
    const uint8_t *tab[MAX_CLASSES] = {0}; /* per class of the segment: its table */
    int32_t off[MAX_CLASSES] = {0};        /* and its offset from tables_base */
    const size_t wb = c->width / 8;
    size_t i = 0;
    for (size_t j = 0; j < nseg; ++j) {
        const size_t n = (size_t)seg_n[j], r = (size_t)seg_r[j];
        const uint8_t *map = seg_map[j];
        for (unsigned k = 0; k < MAX_CLASSES; ++k) {
            const size_t t = (size_t)seg_base[j] + (map ? k : 0);
            if (t < c->ntables) {
                tab[k] = c->tables[t];
                off[k] = (int32_t)(tab[k] - c->tables_base);
            }
        }
        size_t col = 0;
        for (size_t done = 0; done < n;) {
            const size_t k = n - done < BLOCK ? n - done : BLOCK;
            const int fast = c->wpos <= c->nwords && c->nwords - c->wpos >= k;
            uint8_t *o = (uint8_t *)out + (i + done) * wb;
            if (c->width == 16)
                (fast ? codes16 : codes16_checked)(c, tab, off, map, r, &col, k, o);
            else
                (fast ? codes32 : codes32_checked)(c, tab, off, map, r, &col, k, o);
            done += k;
        }
        i += n;
    }
    rests_any(c, i, out);
}

static int has_avx2; /* set once at import: the CPU runs the AVX2 steps */

/* Checks what exponent.py passes (it built all of it, so a failure is a bug there, not a
 * damaged file): ValueError. Fills seg_map and table pointers. */
static int check_args(Py_buffer *stream, unsigned lanes, Py_buffer *seg_n, Py_buffer *seg_r, Py_buffer *seg_base,
                      Py_buffer *has_map, Py_buffer *maps, Py_buffer *tables, Py_buffer *offsets, Py_buffer *sizes,
                      Py_buffer *rest, unsigned shift, unsigned width, Py_buffer *out, const uint8_t **seg_map,
                      const uint8_t **tab_ptr, size_t *total)
{
    const size_t nseg = (size_t)seg_n->len / sizeof(int64_t), ntab = (size_t)offsets->len / sizeof(uint64_t);
    const int64_t *sn = seg_n->buf, *sr = seg_r->buf, *sb = seg_base->buf;
    const uint8_t *hm = has_map->buf, *mp = maps->buf;
    const uint64_t *off = offsets->buf;
    const uint32_t *m = sizes->buf;
    const unsigned R = 1 + shift;
    size_t mpos = 0, n = 0;
    if (lanes == 0 || (width != 16 && width != 32) || R >= width || (size_t)stream->len < 4 * (size_t)lanes ||
        ((size_t)stream->len - 4 * (size_t)lanes) % 2 || (size_t)seg_r->len != nseg * 8 || (size_t)seg_base->len != nseg * 8 ||
        (size_t)has_map->len != nseg || (size_t)sizes->len != ntab * 4 || (uint64_t)tables->len >= (1ull << 31))
        return -1;
    for (size_t t = 0; t < ntab; ++t) {
        if (m[t] < 1 || m[t] > (1u << 12) || off[t] % 8 || off[t] > (uint64_t)tables->len ||
            (uint64_t)tables->len - off[t] < LUT_BYTES + 8ull * m[t] || ((uintptr_t)tables->buf + off[t]) % 8)
            return -1;
        tab_ptr[t] = (const uint8_t *)tables->buf + off[t];
        const uint16_t *lut = (const uint16_t *)tab_ptr[t];
        for (size_t k = 0; k <= SLOT_MASK; ++k)
            if (lut[k] >= m[t])
                return -1;
    }
    for (size_t j = 0; j < nseg; ++j) {
        size_t top = (size_t)sb[j] + 1;
        if (sn[j] < 1 || sr[j] < 1 || sb[j] < 0)
            return -1;
        seg_map[j] = NULL;
        if (hm[j]) {
            if (mpos + (size_t)sr[j] > (size_t)maps->len)
                return -1;
            seg_map[j] = mp + mpos;
            for (size_t k = 0; k < (size_t)sr[j]; ++k)
                if (mp[mpos + k] >= MAX_CLASSES)
                    return -1;
                else if ((size_t)sb[j] + mp[mpos + k] + 1 > top)
                    top = (size_t)sb[j] + mp[mpos + k] + 1;
            mpos += (size_t)sr[j];
        }
        if (top > ntab || (uint64_t)sn[j] > (uint64_t)out->len - n) /* Σ n_j cannot wrap: each n_j <= out's bytes */
            return -1;
        n += (size_t)sn[j];
    }
    if ((size_t)rest->len != n * (R / 8) + (n + 7) / 8 * (R % 8) || (size_t)out->len != n * (width / 8))
        return -1;
    *total = n;
    return 0;
}

/* decode(stream, lanes, seg_n, seg_r, seg_base, has_map, maps, tables, offsets, sizes, rest,
 *        shift, width, out[, simd]) -> 0, or the damage found in the stream (1 ends early, 2 words
 * left over, 3 a lane not ending at 2^16). Per segment j (int64 arrays): its length, row
 * length, first table; has_map[j] (u8) says its column classes are the next seg_r[j] bytes
 * of maps. Table t (of sizes[t] entries) lies at tables + offsets[t]: 2^14 u16 slot -> entry
 * index, then its entries (entry_t). rest: the rest fields as stored (SPEC.md 8.7); out: the
 * W-bit symbols, written. */
static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer stream, seg_n, seg_r, seg_base, has_map, maps, tables, offsets, sizes, rest, out;
    unsigned int lanes, shift, width;
    int simd = 1;
    if (!PyArg_ParseTuple(args, "y*Iy*y*y*y*y*y*y*y*y*IIw*|p", &stream, &lanes, &seg_n, &seg_r, &seg_base, &has_map,
                          &maps, &tables, &offsets, &sizes, &rest, &shift, &width, &out, &simd))
        return NULL;
    PyObject *result = NULL;
    size_t nseg = (size_t)seg_n.len / sizeof(int64_t), ntab = (size_t)offsets.len / sizeof(uint64_t), total = 0;
    const uint8_t **seg_map = PyMem_Calloc(nseg + 1, sizeof(*seg_map));
    const uint8_t **tab_ptr = PyMem_Calloc(ntab + 1, sizeof(*tab_ptr));
    uint32_t *states = PyMem_Calloc((size_t)lanes + 1, sizeof(uint32_t));
    if (seg_map == NULL || tab_ptr == NULL || states == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (check_args(&stream, lanes, &seg_n, &seg_r, &seg_base, &has_map, &maps, &tables, &offsets, &sizes, &rest, shift,
                   width, &out, seg_map, tab_ptr, &total)) {
        PyErr_SetString(PyExc_ValueError, "_exponent_native.decode: inconsistent arguments");
        goto done;
    }
    int err = OK;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *s = stream.buf, *r = rest.buf;
    const unsigned R = 1 + shift;
    for (uint32_t k = 0; k < lanes; ++k)
        states[k] = (uint32_t)load_le(s + 4 * (size_t)k, 4);
    ctx_t c = {.tables = tab_ptr, .tables_base = tables.buf, .simd = simd && has_avx2, .states = states, .ntables = ntab,
               .lanes = lanes, .words = s + 4 * (size_t)lanes, .nwords = ((size_t)stream.len - 4 * (size_t)lanes) / 2,
               .wpos = 0, .lane = 0, .rest_low = r, .rest_high = r + total * (R / 8), .b0 = R / 8, .b1 = R % 8,
               .shift = shift, .width = width};
    run(&c, out.buf, nseg, seg_n.buf, seg_r.buf, seg_base.buf, seg_map);
    if (c.wpos > c.nwords)
        err = ERR_STREAM_SHORT;
    else if (c.wpos != c.nwords)
        err = ERR_WORDS_LEFT;
    else
        for (uint32_t k = 0; k < lanes; ++k)
            if (states[k] != RANS_LOW)
                err = ERR_LANE_END;
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(err);
done:
    PyMem_Free(seg_map);
    PyMem_Free(tab_ptr);
    PyMem_Free(states);
    PyBuffer_Release(&stream); PyBuffer_Release(&seg_n); PyBuffer_Release(&seg_r); PyBuffer_Release(&seg_base);
    PyBuffer_Release(&has_map); PyBuffer_Release(&maps); PyBuffer_Release(&tables); PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes); PyBuffer_Release(&rest); PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode a codec-3 rANS stream and rest fields into symbols (see exponent.py); simd=0 "
                                     "keeps to the scalar steps (the same symbols; for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_exponent_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__exponent_native(void)
{
    init_perm();
    has_avx2 = cpu_has_avx2() != 0;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "SIMD", has_avx2) < 0 || PyModule_AddIntConstant(m, "ABI", ABI) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
