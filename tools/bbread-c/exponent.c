/* Payload codec 3, "exponent" (SPEC.md 8.7, format 1.3).

   Written from SPEC.md 1.3 alone by an outside implementer, without reading the reference
   codec (bbformat/codec/exponent.py, rans.py), its tests, the vector generator's exp_*
   functions, or the decoder the author of 8.7 wrote into chunk.c at the time (since removed). The
   group and segment rules are those of 8.6, as the pre-1.3 reader implements them.

   Layout of the section (8.7 "Stored bytes"): t, segment records, lanes Q, class-map
   group, tables_length + tables group, stream_length + stream, rest. Every field is checked
   in reading order (8.7, last paragraph of "Rest"; one exception, which cannot change the
   code reported: the rest's length, below); every count or length read from the file is
   checked before it sizes an allocation or a loop, with overflow-free comparisons (1).

   Decoding speed: each table used by a segment gets a lookup of 2^14 slots (the code of
   each slot, 2 bytes) and, per code, its f, start and code << c in one 8-byte word; one
   rANS step is two loads, a multiply and an add, the renormalisation is branchless, and the
   word bound is checked once per block of symbols instead of per word. The lookups are
   built per segment (64 KiB each, at most 16 live at once), and only for the classes that a
   column of the segment uses (tables of unused classes are checked, never expanded).

   1.5 (codec 4, parts.c): the decoder writes into the caller's buffer when given one (a part
   of a codec-4 payload), and exponent_tables checks only the leading fields (t, the segment
   records) of a codec-3 part, which 8.9 reads for every such part before any part is decoded. */
#include <string.h>

#include "bbread.h"

#ifdef EX_TIMING /* phase times for a benchmark harness; not in the reader's builds */
#include <time.h>
double ex_t_setup, ex_t_rans, ex_t_rest;
static double ex_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define EX_TICK(v) double v = ex_now()
#define EX_ADD(acc, a, b) ((acc) += (b) - (a))
#else
#define EX_TICK(v) ((void)0)
#define EX_ADD(acc, a, b) ((void)0)
#endif

#define EX_MBITS 14
#define EX_M ((uint32_t)1 << EX_MBITS) /* frequencies sum to 2^14 */
#define EX_L ((uint32_t)1 << 16)       /* lower bound of a state; 16-bit words */

/* ------------------------------------------------------------ tables */

/* The decoding lookup of one table: the code of each of the 2^14 slots, and for each code
   of the table f | start << 16 | (code << c) << 32 (codes < 2^B <= 2^12). */
typedef struct {
    uint16_t code[EX_M];
    uint64_t fs[1 << 12];
} ex_lookup;

/* Checks the table starting at tb[*pos] (8.7 "Tables"): a varint m, 1 <= m <= 2^B, then m
   pairs (gap, f); symbols a_i = a_(i-1) + 1 + gap_i < 2^B; 1 <= f <= 2^14; sum = 2^14.
   Each value is checked as it is read (so nothing can overflow); every failure is
   E_SECTION_CONTENT, so the order within a table is not observable. */
static void ex_check_table(const uint8_t *tb, uint64_t T, uint64_t *pos, unsigned B, uint64_t id)
{
    pcur_t c = {tb, T, *pos, "exponent payload tables"};
    uint64_t m, i, a = 0, sum = 0, A = (uint64_t)1 << B;
    m = pc_varint(&c, "table entry count");
    if (m < 1 || m > A)
        fail("E_SECTION_CONTENT", "exponent payload: table %llu has %llu entries (1 .. %llu)", (unsigned long long)id,
             (unsigned long long)m, (unsigned long long)A);
    for (i = 0; i < m; i++) {
        uint64_t gap = pc_varint(&c, "table gap"), f = pc_varint(&c, "table frequency");
        if (gap >= A) fail("E_SECTION_CONTENT", "exponent payload: table %llu gap %llu >= 2^%u", (unsigned long long)id, (unsigned long long)gap, B);
        a = (i == 0 ? 0 : a + 1) + gap; /* a_(-1) = -1 */
        if (a >= A) fail("E_SECTION_CONTENT", "exponent payload: table %llu symbol %llu >= 2^%u", (unsigned long long)id, (unsigned long long)a, B);
        if (f < 1 || f > EX_M) fail("E_SECTION_CONTENT", "exponent payload: table %llu frequency %llu", (unsigned long long)id, (unsigned long long)f);
        sum += f; /* <= 2^12 * 2^14 */
    }
    if (sum != EX_M) fail("E_SECTION_CONTENT", "exponent payload: table %llu frequencies sum to %llu, not 2^14", (unsigned long long)id, (unsigned long long)sum);
    *pos = c.pos;
}

/* Fills the lookup of an already checked table at tb[pos] (its varints are complete and
   lie within the tables group, so varint_read stops before the end). Entry i covers the
   slots [start_i, start_i + f_i). */
static void ex_build_lookup(const uint8_t *tb, uint64_t pos, unsigned c, ex_lookup *lut)
{
    uint64_t m, i, a = 0, gap, f;
    uint32_t start = 0, s;
    pos += varint_read(tb + pos, 10, &m);
    for (i = 0; i < m; i++) {
        pos += varint_read(tb + pos, 10, &gap);
        pos += varint_read(tb + pos, 10, &f);
        a = (i == 0 ? 0 : a + 1) + gap;
        for (s = 0; s < (uint32_t)f; s++) lut->code[start + s] = (uint16_t)a;
        lut->fs[a] = (uint64_t)f | (uint64_t)start << 16 | (uint64_t)((uint32_t)a << c) << 32;
        start += (uint32_t)f;
    }
}

/* ------------------------------------------------------------ little-endian stores */

static void ex_st(uint8_t *p, uint32_t v, int W)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    if (W == 32) {
        p[2] = (uint8_t)(v >> 16);
        p[3] = (uint8_t)(v >> 24);
    }
}

/* ------------------------------------------------------------ the rANS loop */

typedef struct {
    uint32_t *x;          /* Q lane states */
    uint64_t Q, lane;     /* lane of the next symbol: i mod Q */
    const uint8_t *words; /* the stream's 16-bit words, LE */
    uint64_t nwords, wp;  /* words in the stream, next word to read */
} ex_lanes;

/* One step of 8.7's loop for the lane state at XP with lookup LUT; leaves the symbol's
   code << c in code_. CHECKED: the careful form, which fails when a word is needed and none is left.
   Otherwise the caller guarantees a word is left (wp < nwords), and the renormalisation is
   branchless: the word is loaded whether or not it is used (it is at most 2^16 - 1, and y_
   < 2^16 when it is used, so (y_ << 16) | w cannot overflow). */
#define EX_STEP(XP, LUT, CHECKED)                                        \
    do {                                                                 \
        uint32_t x0_ = *(XP);                                            \
        uint32_t sl_ = x0_ & (EX_M - 1);   /* slot = x mod 2^14 */       \
        uint64_t fs_ = (LUT)->fs[(LUT)->code[sl_]];                      \
        uint32_t f_ = (uint32_t)fs_ & 0xFFFF, st_ = (uint32_t)fs_ >> 16; \
        uint32_t y_ = f_ * (x0_ >> EX_MBITS) + sl_ - st_;                \
        if (CHECKED) {                                                   \
            if (y_ < EX_L) {                                             \
                if (wp >= nw) ex_words_out();                            \
                y_ = (y_ << 16) | ld16(wd + 2 * wp);                     \
                wp++;                                                    \
            }                                                            \
        } else {                                                         \
            uint32_t need_ = y_ < EX_L, w_ = ld16(wd + 2 * wp);          \
            uint32_t sh_ = need_ << 4;                                   \
            y_ = (y_ << sh_) | (w_ & (0u - need_));                      \
            wp += need_;                                                 \
        }                                                                \
        *(XP) = y_;                                                      \
        code_ = (uint32_t)(fs_ >> 32);                                   \
    } while (0)

static void ex_words_out(void)
{
    fail("E_SECTION_CONTENT", "exponent payload: the stream ends before the last symbol (no word left)");
}

/* stores a W-bit symbol little-endian (one store on a little-endian host) */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define EX_OUT(W, O, V)                    \
    do {                                   \
        if ((W) == 16) {                   \
            uint16_t v16_ = (uint16_t)(V); \
            memcpy((O), &v16_, 2);         \
        } else {                           \
            uint32_t v32_ = (V);           \
            memcpy((O), &v32_, 4);         \
        }                                  \
    } while (0)
#else
#define EX_OUT(W, O, V)                    \
    do {                                   \
        (O)[0] = (uint8_t)(V);             \
        (O)[1] = (uint8_t)((V) >> 8);      \
        if ((W) == 32) {                   \
            (O)[2] = (uint8_t)((V) >> 16); \
            (O)[3] = (uint8_t)((V) >> 24); \
        }                                  \
    } while (0)
#endif

/* Decodes symbols [0, n) of a run that uses one lookup (K = 1) or the column classes cls
   (col: the column of the first symbol, r the row length) into out; FAST: no word bound
   check inside (the caller made sure n words are left). Returns the next column. */
#define EX_RUN(NAME, W, FAST)                                                                        \
    static uint64_t NAME(ex_lanes *L, const ex_lookup *const *lut, const uint8_t *cls, uint64_t col, \
                         uint64_t r, uint64_t n, uint8_t *out)                                       \
    {                                                                                                \
        uint32_t *x_ = L->x, code_;                                                                  \
        const uint8_t *wd = L->words;                                                                \
        uint64_t ln = L->lane, Q = L->Q, wp = L->wp, nw = L->nwords, i = 0, j;                       \
        (void)nw;                                                                                    \
        while (i < n) {                                                                              \
            /* a run in which neither the lane nor the column wraps */                               \
            uint64_t m = n - i;                                                                      \
            uint32_t *xs = x_ + ln;                                                                  \
            uint8_t *o = out + (W) / 8 * i;                                                          \
            if (Q - ln < m) m = Q - ln;                                                              \
            if (!cls) {                                                                              \
                const ex_lookup *t0 = lut[0];                                                        \
                for (j = 0; j < m; j++) {                                                            \
                    EX_STEP(xs + j, t0, !(FAST));                                                    \
                    EX_OUT(W, o + (W) / 8 * j, code_);                                               \
                }                                                                                    \
            } else {                                                                                 \
                const uint8_t *cs = cls + col;                                                       \
                if (r - col < m) m = r - col;                                                        \
                for (j = 0; j < m; j++) {                                                            \
                    EX_STEP(xs + j, lut[cs[j]], !(FAST));                                            \
                    EX_OUT(W, o + (W) / 8 * j, code_);                                               \
                }                                                                                    \
                col += m;                                                                            \
                if (col == r) col = 0;                                                               \
            }                                                                                        \
            i += m;                                                                                  \
            ln += m;                                                                                 \
            if (ln == Q) ln = 0;                                                                     \
        }                                                                                            \
        L->lane = ln;                                                                                \
        L->wp = wp;                                                                                  \
        return col;                                                                                  \
    }

EX_RUN(ex_run16_fast, 16, 1)
EX_RUN(ex_run16_checked, 16, 0)
EX_RUN(ex_run32_fast, 32, 1)
EX_RUN(ex_run32_checked, 32, 0)

/* Decodes the n symbols of one segment into out (code << c in each W-bit LE symbol). Each
   symbol reads at most one word, so a block of k symbols with at least k words left runs
   without the word bound check. */
static void ex_decode_segment(ex_lanes *L, const ex_lookup *const *lut, const uint8_t *cls, uint64_t n, uint64_t r,
                              uint8_t *out, int W)
{
    const uint64_t BLK = 4096;
    uint64_t done = 0, col = 0, WB = (uint64_t)W / 8;
    while (done < n) {
        uint64_t k = n - done < BLK ? n - done : BLK;
        int fast = L->nwords - L->wp >= k;
        if (W == 16) col = (fast ? ex_run16_fast : ex_run16_checked)(L, lut, cls, col, r, k, out + done * WB);
        else col = (fast ? ex_run32_fast : ex_run32_checked)(L, lut, cls, col, r, k, out + done * WB);
        done += k;
    }
}

/* ------------------------------------------------------------ rest fields */

static uint32_t ex_ld(const uint8_t *p, unsigned nbytes)
{
    switch (nbytes) {
    case 0: return 0;
    case 1: return p[0];
    case 2: return ld16(p);
    default: return (uint32_t)ld16(p) | (uint32_t)p[2] << 16;
    }
}

/* ORs the rest fields into out, whose symbols hold code << c (8.7 "Rest"): lo holds
   P * RLO bytes (the low 8 * RLO bits of each field), hi ceil(P/8) * rhi bytes (the other
   rhi bits, 8 fields to rhi bytes). Returns the last group of hi as an integer, for the
   padding check. */
#define EX_LDSYM(W, P) ((W) == 16 ? (uint32_t)ld16(P) : ld32(P))
#define EX_REST(NAME, RLO, W)                                                                                          \
    static uint64_t NAME(uint8_t *out, const uint8_t *lo, const uint8_t *hi, uint64_t P, unsigned rhi, unsigned cbits) \
    {                                                                                                                  \
        const uint32_t cmask = ((uint32_t)1 << cbits) - 1, hmask = ((uint32_t)1 << rhi) - 1;                           \
        const unsigned sh = (W) - 1;                                                                                   \
        uint64_t i = 0, g, v = 0, hlen = (P / 8 + (P % 8 != 0)) * rhi;                                                 \
        if (!rhi) {                                                                                                    \
            for (i = 0; i < P; i++) {                                                                                  \
                uint32_t rest = ex_ld(lo + (RLO) * i, (RLO));                                                          \
                uint8_t *o = out + (W) / 8 * i;                                                                        \
                ex_st(o, EX_LDSYM(W, o) | ((rest >> cbits) << sh) | (rest & cmask), (W));                              \
            }                                                                                                          \
            return 0;                                                                                                  \
        }                                                                                                              \
        for (g = 0; i < P; g++) {                                                                                      \
            unsigned k, kn = P - i < 8 ? (unsigned)(P - i) : 8;                                                        \
            if (hlen - g * rhi >= 8) {                                                                                 \
                v = ld64(hi + g * rhi) & (((uint64_t)1 << (8 * rhi)) - 1);                                             \
            } else {                                                                                                   \
                unsigned b;                                                                                            \
                for (v = 0, b = 0; b < rhi; b++) v |= (uint64_t)hi[g * rhi + b] << (8 * b);                            \
            }                                                                                                          \
            for (k = 0; k < kn; k++, i++) {                                                                            \
                uint32_t rest = ex_ld(lo + (RLO) * i, (RLO)) | ((uint32_t)(v >> (rhi * k)) & hmask) << (8 * (RLO));    \
                uint8_t *o = out + (W) / 8 * i;                                                                        \
                ex_st(o, EX_LDSYM(W, o) | ((rest >> cbits) << sh) | (rest & cmask), (W));                              \
            }                                                                                                          \
        }                                                                                                              \
        return v;                                                                                                      \
    }

/* the (floor(R/8), W) that occur: float16 R 4..11, bfloat16 4..8, float32 20..24 */
EX_REST(ex_rest0_16, 0, 16)
EX_REST(ex_rest1_16, 1, 16)
EX_REST(ex_rest2_32, 2, 32)
EX_REST(ex_rest3_32, 3, 32)

/* ------------------------------------------------------------ the leading fields */

/* What 8.7's first rows give: joined t (as the code's bits B, its shift c and the rest's
   bits R) and the segment records, with sum K_j (the tables) and the class-map size. */
typedef struct {
    unsigned B, cbits, R;
    uint64_t N, ksum, mapsz;
    uint64_t *n, *r;
    uint8_t *K;
} ex_head;

static void ex_head_free(ex_head *h)
{
    xfree(h->n);
    xfree(h->r);
    xfree(h->K);
}

/* joined t: t <= min(s, 12 - e), with (s, e) = (mantissa bits, exponent bits) of the
   symbol dtype */
static void ex_joined(pcur_t *c, int sym_dtype, ex_head *h)
{
    unsigned s, e, t;
    switch (sym_dtype) {
    case DT_F16: s = 10; e = 5; break;
    case DT_BF16: s = 7; e = 8; break;
    default: s = 23; e = 8; break;
    }
    t = pc_u8(c, "joined bit count t");
    if (t > s || e + t > 12) fail("E_SECTION_CONTENT", "%s: t = %u joined bits, at most %u", c->name, t, (s < 12 - e ? s : 12 - e));
    h->B = e + t;       /* code bits */
    h->cbits = s - t;   /* shift of the code */
    h->R = 1 + h->cbits; /* rest bits = W - B */
}

/* The leading fields: joined t, the segment count and records with their cover of P (read
   and checked as 8.6's, pc_segments), then sum K_j <= 1,024. */
static void ex_leading(pcur_t *c, uint64_t P, int sym_dtype, ex_head *h)
{
    uint64_t j;
    ex_joined(c, sym_dtype, h);
    h->N = pc_segments(c, P, &h->n, &h->r, &h->K);
    h->ksum = h->mapsz = 0;
    for (j = 0; j < h->N; j++) {
        h->ksum += h->K[j];
        if (h->K[j] > 1) h->mapsz += h->r[j]; /* <= P */
    }
    if (h->ksum > 1024) fail("E_LIMIT_COUNT", "%s: %llu tables, at most 1024", c->name, (unsigned long long)h->ksum);
}

uint64_t exponent_tables(const uint8_t *sec, uint64_t len, uint64_t P, int sym_dtype)
{
    pcur_t c = {sec, len, 0, "exponent payload"};
    ex_head h;
    uint64_t ksum;
    ex_leading(&c, P, sym_dtype, &h);
    ksum = h.ksum;
    ex_head_free(&h);
    return ksum;
}

/* ------------------------------------------------------------ the fields after them */

/* class maps: r_j column-class bytes per segment with K_j > 1, each < K_j */
static const uint8_t *ex_class_maps(pcur_t *c, const ex_head *h, int *owned)
{
    const uint8_t *maps = pc_group(c, h->mapsz, owned, "class-map");
    uint64_t j, i, mpos = 0;
    for (j = 0; j < h->N; j++) {
        if (h->K[j] == 1) continue;
        for (i = 0; i < h->r[j]; i++)
            if (maps[mpos + i] >= h->K[j])
                fail("E_SECTION_CONTENT", "%s: segment %llu column %llu class %u >= K = %u", c->name, (unsigned long long)j,
                     (unsigned long long)i, maps[mpos + i], h->K[j]);
        mpos += h->r[j];
    }
    return maps;
}

/* tables_length, the tables group and every table in it (segment-major); *at receives the
   offset of each table in the group */
static const uint8_t *ex_tables(pcur_t *c, const ex_head *h, int *owned, uint64_t **at)
{
    uint64_t T = pc_varint(c, "tables length"), Tmax, j, pos = 0, tid = 0;
    const uint8_t *tb;
    Tmax = h->ksum * 10 * (1 + 2 * ((uint64_t)1 << h->B)); /* <= 1024 * 10 * 8193 */
    if (T > Tmax) fail("E_SECTION_CONTENT", "%s: tables length %llu over %llu", c->name, (unsigned long long)T, (unsigned long long)Tmax);
    tb = pc_group(c, T, owned, "tables");
    *at = xalloc(h->ksum * sizeof **at, "E_LIMIT_COUNT");
    for (j = 0; j < h->N; j++) {
        unsigned k;
        for (k = 0; k < h->K[j]; k++, tid++) {
            (*at)[tid] = pos;
            ex_check_table(tb, T, &pos, h->B, tid);
        }
    }
    if (pos != T) fail("E_SECTION_CONTENT", "%s: %llu bytes after the last table", c->name, (unsigned long long)(T - pos));
    return tb;
}

/* stream_length, then the stream's Q lane states into L (its words are read later) */
static void ex_stream(pcur_t *c, uint64_t P, uint64_t Q, ex_lanes *L)
{
    uint64_t S = pc_varint(c, "stream length"), i;
    const uint8_t *stream;
    if (S > 4 * Q + 2 * P) fail("E_SECTION_CONTENT", "%s: stream length %llu over 4Q + 2P", c->name, (unsigned long long)S);
    if (S > c->len - c->pos) fail("E_SECTION_CONTENT", "%s: the stream runs past the section", c->name);
    stream = c->s + c->pos;
    c->pos += S;
    if (S < 4 * Q || (S - 4 * Q) % 2)
        fail("E_SECTION_CONTENT", "%s: stream length %llu does not fit %llu lanes and 16-bit words", c->name, (unsigned long long)S,
             (unsigned long long)Q);
    L->Q = Q;
    L->lane = 0;
    L->words = stream + 4 * Q;
    L->nwords = (S - 4 * Q) / 2;
    L->wp = 0;
    L->x = xalloc(Q * sizeof *L->x, "E_LIMIT_COUNT");
    for (i = 0; i < Q; i++) {
        L->x[i] = ld32(stream + 4 * i);
        if (L->x[i] < EX_L) fail("E_SECTION_CONTENT", "%s: lane %llu starts at %u, below 2^16", c->name, (unsigned long long)i, L->x[i]);
    }
}

/* The rest: P * floor(R/8) bytes, then ceil(P/8) * (R mod 8) bytes, then the end. 8.7 checks
   its length after the stream is decoded; it is checked before, before the output is
   allocated, so that the output (P * W/8 bytes) is bounded by the section's own size (every
   rest field has R >= 4 bits); 8.7 allows this (the code is the same, E_SECTION_CONTENT). */
static void ex_rest_length(const pcur_t *c, const ex_head *h, uint64_t P)
{
    uint64_t need = P * (h->R / 8) + (P / 8 + (P % 8 != 0)) * (h->R % 8);
    if (c->len - c->pos != need)
        fail("E_SECTION_CONTENT", "%s: %llu bytes after the stream, the rest fields need %llu", c->name,
             (unsigned long long)(c->len - c->pos), (unsigned long long)need);
}

/* ------------------------------------------------------------ decoding */

/* The codes of every segment into out (code << c in every symbol), then the stream's end:
   every word read, every lane back at 2^16. */
static void ex_codes(const ex_head *h, const uint8_t *maps, const uint8_t *tb, const uint64_t *tab_at, ex_lanes *L,
                     uint8_t *out, int W)
{
    uint64_t j, i, mpos = 0, tid = 0, pos = 0, WB = (uint64_t)W / 8;
    const ex_lookup *luts[16];
    ex_lookup *slots;
    unsigned maxk = 1;
    for (j = 0; j < h->N; j++)
        if (h->K[j] > maxk) maxk = h->K[j];
    slots = xalloc((uint64_t)maxk * sizeof(ex_lookup), "E_LIMIT_TENSOR");
    for (j = 0; j < h->N; j++) {
        const uint8_t *cls = NULL;
        if (h->K[j] == 1) {
            ex_build_lookup(tb, tab_at[tid], h->cbits, slots);
            luts[0] = slots;
        } else {
            uint8_t used[16];
            unsigned k;
            cls = maps + mpos;
            memset(used, 0, sizeof used);
            for (i = 0; i < h->r[j]; i++) used[cls[i]] = 1;
            for (k = 0; k < h->K[j]; k++) {
                luts[k] = slots + (uint64_t)k;
                if (used[k]) ex_build_lookup(tb, tab_at[tid + k], h->cbits, slots + (uint64_t)k);
            }
            mpos += h->r[j];
        }
        ex_decode_segment(L, luts, cls, h->n[j], h->r[j], out + pos * WB, W);
        tid += h->K[j];
        pos += h->n[j];
    }
    xfree(slots);
    if (L->wp != L->nwords)
        fail("E_SECTION_CONTENT", "exponent payload: %llu words left in the stream", (unsigned long long)(L->nwords - L->wp));
    for (i = 0; i < L->Q; i++)
        if (L->x[i] != EX_L) fail("E_SECTION_CONTENT", "exponent payload: lane %llu ends at %u, not 2^16", (unsigned long long)i, L->x[i]);
}

/* ORs the rest fields (at c->pos, their length checked) into out, then checks the padding:
   fields of positions past P - 1 in the last group are zero */
static void ex_apply_rest(const pcur_t *c, const ex_head *h, uint64_t P, uint8_t *out)
{
    const uint8_t *lo = c->s + c->pos, *hi = lo + P * (h->R / 8);
    unsigned rhi = h->R % 8;
    uint64_t v;
    switch (h->R / 8) {
    case 0: v = ex_rest0_16(out, lo, hi, P, rhi, h->cbits); break;
    case 1: v = ex_rest1_16(out, lo, hi, P, rhi, h->cbits); break;
    case 2: v = ex_rest2_32(out, lo, hi, P, rhi, h->cbits); break;
    default: v = ex_rest3_32(out, lo, hi, P, rhi, h->cbits); break;
    }
    if (rhi && P % 8 && (v >> (rhi * (P % 8))) != 0)
        fail("E_SECTION_CONTENT", "%s: padding bits after the last rest field are not zero", c->name);
}

/* ------------------------------------------------------------ the payload */

uint8_t *exponent_decode(const uint8_t *sec, uint64_t len, uint64_t P, int sym_dtype, int W, uint8_t *out)
{
    pcur_t c = {sec, len, 0, "exponent payload"};
    ex_head h;
    ex_lanes L;
    uint64_t Q, *tab_at;
    const uint8_t *maps, *tb;
    int mowned, towned;

    EX_TICK(t0);
    ex_leading(&c, P, sym_dtype, &h);
    Q = pc_varint(&c, "lane count");
    if (Q < 1 || Q > P || Q > 65536) fail("E_SECTION_CONTENT", "exponent payload: %llu lanes for %llu symbols", (unsigned long long)Q, (unsigned long long)P);
    maps = ex_class_maps(&c, &h, &mowned);
    tb = ex_tables(&c, &h, &towned, &tab_at);
    ex_stream(&c, P, Q, &L);
    ex_rest_length(&c, &h, P);
    if (!out) out = xalloc(P * ((uint64_t)W / 8), "E_LIMIT_TENSOR");
    EX_TICK(t1);
    ex_codes(&h, maps, tb, tab_at, &L, out, W);
    EX_TICK(t2);
    ex_apply_rest(&c, &h, P, out);
    {
        EX_TICK(t3);
        EX_ADD(ex_t_setup, t0, t1);
        EX_ADD(ex_t_rans, t1, t2);
        EX_ADD(ex_t_rest, t2, t3);
    }
    xfree(L.x);
    xfree(tab_at);
    if (towned) xfree((void *)tb);
    if (mowned) xfree((void *)maps);
    ex_head_free(&h);
    return out;
}
