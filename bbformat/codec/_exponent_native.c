/* The compiled decoder of payload codec 3 (SPEC.md 8.7): the rANS stream and the rest fields
 * of one payload, straight to its symbols. bbformat/codec/exponent.py parses and checks
 * everything before the stream and calls decode() here; its numpy decoder is the reference,
 * and the two must agree on every input (tests/test_exponent_native.py). Also codec 3's
 * encoder helpers, and unpermute() for codec 2's top plane (SPEC.md 8.6, entropy.py).
 *
 * Integer arithmetic only: the output does not depend on the compiler or the CPU. Little-endian
 * hosts only (native.py does not load it elsewhere): tables and symbols are stored native.
 * The GIL is released while decoding, so chunks decode in parallel threads. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SLOT_BITS 14
#define SLOT_MASK ((1u << SLOT_BITS) - 1)
#define RANS_LOW (1u << 16)
#define MAX_CLASSES 16 /* SPEC.md 8.7: K <= 16 */
#define MAX_ENTRIES 4096 /* and m <= 2^B <= 2^12 */
/* A table built for decoding, one per class of the segment being decoded: per group of 2^q
 * slots, 8 bytes: a u32 (frequency - 1) | (group's first slot - start) << 16, then its code
 * << shift (u32). q, the segment's grain, is the largest (at most MAX_GRAIN) such that every
 * frequency of its tables is a multiple of 2^q: then an entry's slots are whole groups, and a
 * table takes 2^(14 - q) x 8 bytes. The reference writer's frequencies are multiples of 4:
 * 32 KiB a class instead of 128, so four classes take a quarter of a 512 KiB L2, not all of
 * it (about 15% faster on this project's AMD Zen 3 machine, BENCHMARKS.md 15). */
#define STRIDE_BITS (SLOT_BITS + 3)
#define TABLE_STRIDE (1u << STRIDE_BITS)
#define MAX_GRAIN 4

/* error codes returned to exponent.py, which names them */
#if defined(_MSC_VER)
#define ALWAYS_INLINE __forceinline
#define restrict __restrict
#elif defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* The functions and argument lists below; native.py loads this module only if it says the same (an
 * extension built from another version of this file falls back to numpy, never crashes). */
#define ABI 6

enum { OK = 0, ERR_STREAM_SHORT = 1, ERR_WORDS_LEFT = 2, ERR_LANE_END = 3 };

typedef struct {
    const int64_t *first;    /* table t's entries are first[t] .. first[t+1]-1 of freq[] and code[] */
    const uint32_t *freq, *code;
    uint8_t *built;          /* MAX_CLASSES tables as decoded (TABLE_STRIDE bytes each) */
    int simd;                /* use the AVX2 steps where the CPU has them */
    uint32_t *states;        /* Q lanes */
    uint32_t lanes;
    const uint8_t *words;    /* u16 LE words, read forward */
    size_t nwords, wpos;     /* words in the stream, the next to read */
    uint32_t lane;           /* the lane of the next symbol */
    unsigned grain;          /* q of the segment being decoded */
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

/* One symbol's step through lane state *XP with the table of class CLS; leaves code << shift
 * in CODE. CHECKED: a word is read only if one is left (else wp passes nwords, which the caller
 * reports). Otherwise the caller made sure enough words are left and the renormalisation is
 * branchless: the word is loaded whether or not it is used. */
#define STEP(XP, CLS, CHECKED, CODE)                                                 \
    do {                                                                            \
        const uint32_t x0_ = *(XP), slot_ = x0_ & SLOT_MASK, g_ = slot_ >> grain;   \
        const uint8_t *tb_ = built + ((size_t)(CLS) << (STRIDE_BITS - grain));      \
        const uint32_t fb_ = ((const uint32_t *)tb_)[2 * g_];                       \
        uint32_t y_ = ((fb_ & 0xFFFFu) + 1u) * (x0_ >> SLOT_BITS) + (fb_ >> 16) + (slot_ & fine); \
        const uint32_t need_ = y_ < RANS_LOW;                                       \
        uint32_t w_ = 0;                                                            \
        if (!(CHECKED) || wp < nwords)                                              \
            w_ = load16(words + 2 * wp);                                            \
        const uint32_t keep_ = need_ - 1u; /* all ones when no word is needed */    \
        y_ = (y_ & keep_) | (((y_ << 16) | w_) & ~keep_); /* no branch to mispredict */ \
        wp += need_;                                                                \
        *(XP) = y_;                                                                 \
        (CODE) = ((const uint32_t *)tb_)[2 * g_ + 1];                               \
    } while (0)


#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(BBFORMAT_NO_SIMD) /* the define: tests */
#include <immintrin.h>
#define HAVE_AVX2 1
/* vpshufb controls, one per renormalisation mask: dword lane i takes the popcount(mask below
 * i)-th of the next 8 words (in both 128-bit halves, which hold the same 8 words) if bit i of
 * the mask is set, else 0. */
static int8_t word_ctrl[256][32] __attribute__((aligned(32)));

static void init_word_ctrl(void)
{
    for (int m = 0; m < 256; ++m)
        for (int i = 0, k = 0; i < 8; ++i) {
            int8_t *d = &word_ctrl[m][4 * i];
            const int take = (m >> i) & 1;
            d[0] = take ? (int8_t)(2 * k) : (int8_t)0x80;
            d[1] = take ? (int8_t)(2 * k + 1) : (int8_t)0x80;
            d[2] = d[3] = (int8_t)0x80;
            k += take;
        }
}

/* The 8-byte slot entry at built + at, in every 64-bit lane (a load, no shuffle). */
__attribute__((target("avx2"))) static ALWAYS_INLINE __m256i slot_entry(const uint8_t *built, uint32_t at)
{
    uint64_t e;
    memcpy(&e, built + at, 8);
    return _mm256_set1_epi64x((long long)e);
}

/* Groups of 8 consecutive symbols (8 consecutive lanes, one step each, exactly as the scalar
 * STEP in that order): returns how many symbols it did (a multiple of 8, at most m). The
 * caller guarantees at least m words are left, so each group's 8-word load is in bounds.
 * cls: the symbols' column classes (NULL: class 0). Each lane's slot (8 bytes: frequency - 1
 * and offset, then code << shift) is one 64-bit broadcast load, blended into two vectors;
 * the slots' offsets pass through memory, and the words arrive by one in-lane shuffle. This
 * leaves the cross-lane shuffles (port 5 on Intel) to the output: 0-8% faster on this
 * project's Intel Ice Lake VM than inserting the loads and extracting the offsets in registers,
 * as before (within that VM's noise; BENCHMARKS.md 15); that was 17-20% faster than two AVX2
 * gathers on its AMD Zen 3 VM, and gathers lose on the Intel VM too. */
__attribute__((target("avx2"))) static ALWAYS_INLINE size_t steps_avx2(const uint8_t *built, uint32_t *xs, size_t m,
                                                                       const uint8_t *cls, const uint8_t *words, size_t *wpp,
                                                                       void *out, int wide, unsigned grain)
{
    const __m256i slot_mask = _mm256_set1_epi32((int)SLOT_MASK), low16 = _mm256_set1_epi32(0xFFFF);
    const __m256i one = _mm256_set1_epi32(1), fine = _mm256_set1_epi32((1 << grain) - 1);
    const __m128i gshift = _mm_cvtsi32_si128((int)grain);
    size_t wp = *wpp, j = 0;
    for (; j + 8 <= m; j += 8) {
        __m256i toff = _mm256_setzero_si256();
        if (cls)
            toff = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(cls + j))), STRIDE_BITS - grain);
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xs + j)), slot = _mm256_and_si256(x, slot_mask);
        const __m256i at = _mm256_add_epi32(toff, _mm256_slli_epi32(_mm256_srl_epi32(slot, gshift), 3));
        uint32_t at_[8] __attribute__((aligned(32)));
        _mm256_store_si256((__m256i *)at_, at);
        __asm__ volatile("" ::: "memory"); /* keep the offsets in memory: scalar loads, not extracts */
        __m256i a = slot_entry(built, at_[0]); /* lanes 0 1 4 5 */
        a = _mm256_blend_epi32(a, slot_entry(built, at_[1]), 0x0C);
        a = _mm256_blend_epi32(a, slot_entry(built, at_[4]), 0x30);
        a = _mm256_blend_epi32(a, slot_entry(built, at_[5]), 0xC0);
        __m256i b = slot_entry(built, at_[2]); /* lanes 2 3 6 7 */
        b = _mm256_blend_epi32(b, slot_entry(built, at_[3]), 0x0C);
        b = _mm256_blend_epi32(b, slot_entry(built, at_[6]), 0x30);
        b = _mm256_blend_epi32(b, slot_entry(built, at_[7]), 0xC0);
        const __m256i fb = _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), 0x88));
        const __m256i code = _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), 0xDD));
        const __m256i f = _mm256_add_epi32(_mm256_and_si256(fb, low16), one);
        __m256i y = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x, SLOT_BITS)),
                                     _mm256_add_epi32(_mm256_srli_epi32(fb, 16), _mm256_and_si256(slot, fine)));
        const __m256i need = _mm256_cmpeq_epi32(_mm256_min_epu32(y, low16), y);
        const unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
        const __m256i w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(words + 2 * wp))),
                                              _mm256_load_si256((const __m256i *)word_ctrl[mask]));
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

/* steps_avx2 with its grain a constant where it is 0 (every file of an earlier writer) or 2
 * (this writer's), so that neither pays for the other. */
#define STEPS_ARGS const uint8_t *built, uint32_t *xs, size_t m, const uint8_t *cls, const uint8_t *words, size_t *wpp, void *out, int wide
__attribute__((target("avx2"))) static size_t steps_avx2_g0(STEPS_ARGS) { return steps_avx2(built, xs, m, cls, words, wpp, out, wide, 0); }
__attribute__((target("avx2"))) static size_t steps_avx2_g2(STEPS_ARGS) { return steps_avx2(built, xs, m, cls, words, wpp, out, wide, 2); }
__attribute__((target("avx2"))) static size_t steps_avx2_gq(STEPS_ARGS, unsigned grain)
{
    return steps_avx2(built, xs, m, cls, words, wpp, out, wide, grain);
}

static size_t steps_any(STEPS_ARGS, unsigned grain)
{
    if (grain == 0)
        return steps_avx2_g0(built, xs, m, cls, words, wpp, out, wide);
    if (grain == 2)
        return steps_avx2_g2(built, xs, m, cls, words, wpp, out, wide);
    return steps_avx2_gq(built, xs, m, cls, words, wpp, out, wide, grain);
}

static int cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}
#else
#define HAVE_AVX2 0
static void init_word_ctrl(void) {}
static int cpu_has_avx2(void) { return 0; }
#endif

/* Symbols [0, n) of one segment, whose column classes are map (NULL: class 0), into out as
 * code << shift. `checked`: the careful step; the caller passes 0 only when at least n words
 * are left. Runs are cut where the lane or the column wraps, so the inner loops have neither
 * test. */
static ALWAYS_INLINE void codes(ctx_t *c, const uint8_t *map, size_t r, size_t *colp, size_t n, void *outv,
                                const int checked, const int wide)
{
    uint32_t *restrict states = c->states;
    const uint8_t *restrict words = c->words;
    const uint8_t *restrict built = c->built;
    const size_t nwords = c->nwords;
    size_t wp = c->wpos, col = *colp, i = 0;
    uint32_t l = c->lane, code;
    const unsigned grain = c->grain;
    const uint32_t fine = (1u << grain) - 1;
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
            j0 = steps_any(built, xs, mm, map ? map + col : NULL, words, &wp, wide ? (void *)o32 : (void *)o16, wide,
                           grain);
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

/* ORs the rest fields of groups [g0, g1) into out, whose symbols hold code << shift: R = 1 +
 * shift bits each, b0 = R div 8 whole bytes, then b1 = R mod 8 bits, 8 symbols to a group of
 * b1 bytes (the last group has total mod 8 symbols, if not 0). R and wide are constants in
 * each caller below, so the compiler unrolls the group. */
static ALWAYS_INLINE void rests(const ctx_t *c, size_t g0, size_t g1, size_t total, void *outv, const unsigned R,
                                const int wide)
{
    const unsigned b0 = R / 8, b1 = R % 8, shift = R - 1, top = wide ? 31 : 15;
    const uint8_t *restrict low = c->rest_low, *restrict high = c->rest_high;
    uint16_t *restrict o16 = outv;
    uint32_t *restrict o32 = outv;
    const uint64_t hmask = (1ull << b1) - 1, smask = (1ull << shift) - 1;
    for (size_t g = g0; g < g1; ++g) {
        const size_t n = total - g * 8 < 8 ? total - g * 8 : 8;
        const uint64_t h = b1 ? load_le(high + g * b1, b1) : 0;
        for (size_t k = 0; k < n; ++k) {
            const size_t i = g * 8 + k;
            uint64_t rest = b0 ? load_le(low + i * b0, b0) : 0;
            rest |= ((h >> (b1 * k)) & hmask) << (8 * b0);
            const uint64_t v = ((rest >> shift) << top) | (rest & smask);
            if (wide) o32[i] |= (uint32_t)v; else o16[i] |= (uint16_t)v;
        }
    }
}

#if HAVE_AVX2
/* rests() for whole groups g0, g0+1, ... while their bytes can be loaded 8 (high) or 16 (low)
 * at a time within the rest fields; returns the first group not done. b0 <= 3 (b0 = 3: float32
 * with t = 0, R = 24, whose 3-byte fields are spread by one in-lane shuffle of two 12-byte
 * halves; on the scalar loop such a file decoded 54% slower than one with t = 2). */
__attribute__((target("avx2"))) static size_t rests_avx2(const ctx_t *c, size_t g0, size_t g1, size_t total, void *out)
{
    const unsigned b0 = c->b0, b1 = c->b1, shift = c->shift, wide = c->width == 32;
    const size_t high_len = (total + 7) / 8 * b1, full = total / 8;
    int8_t ctrl[32];
    int32_t at[8];
    for (unsigned k = 0; k < 8; ++k) { /* lane k: the 2 bytes holding bits b1*k ... b1*k+b1-1 of the group */
        const unsigned o = b1 * k, half = 16 * (k / 4), lane = 4 * (k % 4);
        ctrl[half + lane] = (int8_t)(o / 8);
        ctrl[half + lane + 1] = (int8_t)(o / 8 + 1);
        ctrl[half + lane + 2] = ctrl[half + lane + 3] = (int8_t)0x80;
        at[k] = (int32_t)(o % 8);
    }
    const __m256i sel = _mm256_loadu_si256((const __m256i *)ctrl), bit = _mm256_loadu_si256((const __m256i *)at);
    const __m256i hmask = _mm256_set1_epi32((1 << b1) - 1), smask = _mm256_set1_epi32((int)((1u << shift) - 1));
    const __m128i up = _mm_cvtsi32_si128((int)(8 * b0)), down = _mm_cvtsi32_si128((int)shift);
    const __m128i sign = _mm_cvtsi32_si128(wide ? 31 : 15);
    const __m256i three = _mm256_setr_epi8(0, 1, 2, -128, 3, 4, 5, -128, 6, 7, 8, -128, 9, 10, 11, -128,
                                           0, 1, 2, -128, 3, 4, 5, -128, 6, 7, 8, -128, 9, 10, 11, -128);
    size_t g = g0;
    if (b0 > 3 || (b0 == 3 && !wide))
        return g;
    for (; g < g1 && g < full && (b1 == 0 || g * b1 + 8 <= high_len); ++g) {
        if (b0 == 3 && 24 * g + 28 > 3 * total) /* the second 16-byte load would pass the low fields */
            break;
        __m256i rest = _mm256_setzero_si256();
        if (b1) {
            uint64_t h;
            memcpy(&h, c->rest_high + g * b1, 8);
            const __m256i hv = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)h), sel);
            rest = _mm256_sll_epi32(_mm256_and_si256(_mm256_srlv_epi32(hv, bit), hmask), up);
        }
        if (b0 == 1)
            rest = _mm256_or_si256(rest, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c->rest_low + 8 * g))));
        else if (b0 == 2)
            rest = _mm256_or_si256(rest, _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(c->rest_low + 16 * g))));
        else if (b0 == 3) {
            const uint8_t *lo = c->rest_low + 24 * g;
            const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                                         _mm_loadu_si128((const __m128i *)(lo + 12)), 1);
            rest = _mm256_or_si256(rest, _mm256_shuffle_epi8(both, three));
        }
        const __m256i v = _mm256_or_si256(_mm256_sll_epi32(_mm256_srl_epi32(rest, down), sign), _mm256_and_si256(rest, smask));
        if (wide) {
            __m256i *o = (__m256i *)((uint32_t *)out + 8 * g);
            _mm256_storeu_si256(o, _mm256_or_si256(_mm256_loadu_si256(o), v));
        } else {
            __m128i *o = (__m128i *)((uint16_t *)out + 8 * g);
            const __m128i p = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
            _mm_storeu_si128(o, _mm_or_si128(_mm_loadu_si128(o), p));
        }
    }
    return g;
}

/* rests() for 16-bit symbols (b0 <= 1, every R a float16 or bfloat16 file can have): two
 * groups (16 symbols) at a time in 16-bit lanes, while their bytes can be loaded 16 at a time
 * within the rest fields; returns the first group not done. Lane k's field is the 2 bytes that
 * hold its b1 bits, shifted by a multiply (AVX2 has no per-lane 16-bit shift). Twice the
 * groups of rests_avx2 per step, and no 32-to-16-bit packing: with the steps above, a whole
 * float16 or bfloat16 payload decodes 11-20% faster on this project's Intel VM than with
 * rests_avx2 (BENCHMARKS.md 15). */
__attribute__((target("avx2"))) static size_t rests16_avx2(const ctx_t *c, size_t g0, size_t g1, size_t total, void *out)
{
    const unsigned b0 = c->b0, b1 = c->b1, shift = c->shift;
    const size_t high_len = (total + 7) / 8 * b1, full = total / 8;
    int8_t ctrl[32];
    int16_t up[16];
    for (unsigned k = 0; k < 16; ++k) { /* lane k: the 2 bytes holding bits b1*k ... b1*k+b1-1 of two groups */
        const unsigned o = b1 * k;
        ctrl[2 * k] = (int8_t)(o / 8);
        ctrl[2 * k + 1] = (int8_t)(o / 8 + 1 < 16 ? o / 8 + 1 : 0x80);
        up[k] = (int16_t)(1u << (16 - o % 8 - b1)); /* (pair << up) >> (16 - b1): the field */
    }
    const __m256i sel = _mm256_loadu_si256((const __m256i *)ctrl), mul = _mm256_loadu_si256((const __m256i *)up);
    const __m128i down = _mm_cvtsi32_si128((int)(16 - b1)), lowb = _mm_cvtsi32_si128((int)(8 * b0));
    const __m128i sh = _mm_cvtsi32_si128((int)shift);
    const __m256i smask = _mm256_set1_epi16((short)((1u << shift) - 1));
    size_t g = g0;
    if (b0 > 1)
        return g;
    for (; g + 2 <= g1 && g + 2 <= full && (b1 == 0 || g * b1 + 16 <= high_len); g += 2) {
        __m256i rest = _mm256_setzero_si256();
        if (b1) {
            const __m256i hv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(c->rest_high + g * b1)));
            rest = _mm256_sll_epi16(_mm256_srl_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(hv, sel), mul), down), lowb);
        }
        if (b0)
            rest = _mm256_or_si256(rest, _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(c->rest_low + 8 * g))));
        const __m256i v = _mm256_or_si256(_mm256_slli_epi16(_mm256_srl_epi16(rest, sh), 15), _mm256_and_si256(rest, smask));
        __m256i *o = (__m256i *)((uint16_t *)out + 8 * g);
        _mm256_storeu_si256(o, _mm256_or_si256(_mm256_loadu_si256(o), v));
    }
    return g;
}
#endif

/* rests() for each rest width R a conforming file can have (SPEC.md 8.7: float16 4..11,
 * bfloat16 4..8, float32 20..24 bits); any other goes through the generic loop. The AVX2
 * groups first where the CPU has them. */
static void rests_any(const ctx_t *c, size_t g0, size_t g1, size_t total, void *out)
{
    const unsigned R = 1 + c->shift;
#if HAVE_AVX2
    if (c->simd && c->width == 16)
        g0 = rests16_avx2(c, g0, g1, total, out);
    if (c->simd)
        g0 = rests_avx2(c, g0, g1, total, out);
#endif
    if (g0 >= g1)
        return;
#define CASE16(r) case r: rests(c, g0, g1, total, out, r, 0); return;
#define CASE32(r) case r: rests(c, g0, g1, total, out, r, 1); return;
    if (c->width == 16) {
        switch (R) { CASE16(4) CASE16(5) CASE16(6) CASE16(7) CASE16(8) CASE16(9) CASE16(10) CASE16(11) default: break; }
    } else {
        switch (R) { CASE32(20) CASE32(21) CASE32(22) CASE32(23) CASE32(24) default: break; }
    }
#undef CASE16
#undef CASE32
    rests(c, g0, g1, total, out, R, c->width == 32);
}

#define RUN_ARGS ctx_t *c, const uint8_t *map, size_t r, size_t *col, size_t n, void *out
static void codes16(RUN_ARGS) { codes(c, map, r, col, n, out, 0, 0); }
static void codes16_checked(RUN_ARGS) { codes(c, map, r, col, n, out, 1, 0); }
static void codes32(RUN_ARGS) { codes(c, map, r, col, n, out, 0, 1); }
static void codes32_checked(RUN_ARGS) { codes(c, map, r, col, n, out, 1, 1); }

#define BLOCK 1024 /* symbols per call of a codes loop; a block with this many words left skips the word check */

/* Table t as decoded with grain q, at dst: each entry's groups of 2^q slots get its
 * frequency - 1, the distance of their first slot from its start, and its code (check_args
 * made sure the frequencies tile the 2^14 slots; grain_of, that they are multiples of 2^q). */
static void build_table(const ctx_t *c, size_t t, uint8_t *dst, unsigned q)
{
    uint32_t *slots = (uint32_t *)dst;
    for (int64_t e = c->first[t]; e < c->first[t + 1]; ++e) {
        const uint32_t f = c->freq[e], cd = c->code[e] << c->shift;
        for (uint32_t k = 0; k < f; k += 1u << q, slots += 2) {
            slots[0] = (f - 1u) | (k << 16);
            slots[1] = cd;
        }
    }
}

/* The largest q <= MAX_GRAIN such that every frequency of tables t0 ... t0+n-1 is a multiple of 2^q. */
static unsigned grain_of(const ctx_t *c, size_t t0, size_t n)
{
    uint32_t any = 1u << MAX_GRAIN;
    unsigned q = 0;
    for (int64_t e = c->first[t0]; e < c->first[t0 + n]; ++e)
        any |= c->freq[e];
    while (!((any >> q) & 1u))
        ++q;
    return q;
}

/* Every symbol of the payload: the codes, segment by segment (its classes' tables built
 * first), a block at a time, each block's rest fields ORed in while its symbols are in the
 * cache. seg_tables[j]: how many classes segment j uses. */
static void run(ctx_t *c, void *out, size_t total, size_t nseg, const int64_t *seg_n, const int64_t *seg_r, const int64_t *seg_base,
                const uint8_t *const *seg_map, const uint8_t *seg_tables)
{
    const size_t wb = c->width / 8;
    size_t i = 0, groups = 0; /* the groups of 8 symbols whose rest fields are in */
    for (size_t j = 0; j < nseg; ++j) {
        const size_t n = (size_t)seg_n[j], r = (size_t)seg_r[j];
        const uint8_t *map = seg_map[j];
        c->grain = grain_of(c, (size_t)seg_base[j], seg_tables[j]);
        for (size_t k = 0; k < seg_tables[j]; ++k)
            build_table(c, (size_t)seg_base[j] + k, c->built + (k << (STRIDE_BITS - c->grain)), c->grain);
        size_t col = 0;
        for (size_t done = 0; done < n;) {
            const size_t k = n - done < BLOCK ? n - done : BLOCK;
            const int fast = c->wpos <= c->nwords && c->nwords - c->wpos >= k;
            uint8_t *o = (uint8_t *)out + (i + done) * wb;
            if (c->width == 16)
                (fast ? codes16 : codes16_checked)(c, map, r, &col, k, o);
            else
                (fast ? codes32 : codes32_checked)(c, map, r, &col, k, o);
            done += k;
            rests_any(c, groups, (i + done) / 8, total, out);
            groups = (i + done) / 8;
        }
        i += n;
    }
    rests_any(c, groups, (total + 7) / 8, total, out);
}

static int has_avx2; /* set once at import: the CPU runs the AVX2 steps */

/* Checks what exponent.py passes (it built all of it, so a failure is a bug there, not a
 * damaged file): ValueError. Fills seg_map and seg_tables. */
static int check_args(Py_buffer *stream, unsigned lanes, Py_buffer *seg_n, Py_buffer *seg_r, Py_buffer *seg_base,
                      Py_buffer *has_map, Py_buffer *maps, Py_buffer *first, Py_buffer *code, Py_buffer *freq,
                      Py_buffer *rest, unsigned shift, unsigned width, Py_buffer *out, const uint8_t **seg_map,
                      uint8_t *seg_tables, size_t *total)
{
    const size_t nseg = (size_t)seg_n->len / sizeof(int64_t), ntab = (size_t)first->len / sizeof(int64_t) - 1;
    const int64_t *sn = seg_n->buf, *sr = seg_r->buf, *sb = seg_base->buf, *fi = first->buf;
    const uint8_t *hm = has_map->buf, *mp = maps->buf;
    const uint32_t *cd = code->buf, *fr = freq->buf;
    const unsigned R = 1 + shift;
    size_t mpos = 0, n = 0;
    if (lanes == 0 || (width != 16 && width != 32) || R >= width || (size_t)stream->len < 4 * (size_t)lanes ||
        ((size_t)stream->len - 4 * (size_t)lanes) % 2 || (size_t)seg_r->len != nseg * 8 || (size_t)seg_base->len != nseg * 8 ||
        (size_t)has_map->len != nseg || (size_t)first->len < 16 || (size_t)first->len % 8 || fi[0] != 0 ||
        fi[ntab] < 0 || (uint64_t)code->len != (uint64_t)fi[ntab] * 4 || (uint64_t)freq->len != (uint64_t)fi[ntab] * 4)
        return -1;
    for (size_t t = 0; t < ntab; ++t) { /* entries that tile the 2^14 slots, codes that fit below the sign bit */
        if (fi[t + 1] - fi[t] < 1 || fi[t + 1] - fi[t] > MAX_ENTRIES)
            return -1;
        uint32_t sum = 0;
        for (int64_t e = fi[t]; e < fi[t + 1]; ++e) {
            if (fr[e] < 1 || fr[e] > (1u << SLOT_BITS) || cd[e] >= (1u << (width - 1 - shift)) || cd[e] > 0xFFFF)
                return -1;
            sum += fr[e];
        }
        if (sum != (1u << SLOT_BITS))
            return -1;
    }
    for (size_t j = 0; j < nseg; ++j) {
        size_t top = 1;
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
                else if ((size_t)mp[mpos + k] + 1 > top)
                    top = (size_t)mp[mpos + k] + 1;
            mpos += (size_t)sr[j];
        }
        if ((size_t)sb[j] + top > ntab || (uint64_t)sn[j] > (uint64_t)out->len - n) /* Σ n_j cannot wrap: each n_j <= out's bytes */
            return -1;
        seg_tables[j] = (uint8_t)top;
        n += (size_t)sn[j];
    }
    if ((size_t)rest->len != n * (R / 8) + (n + 7) / 8 * (R % 8) || (size_t)out->len != n * (width / 8))
        return -1;
    *total = n;
    return 0;
}

/* decode(stream, lanes, seg_n, seg_r, seg_base, has_map, maps, first, code, freq, rest, shift,
 *        width, out[, simd]) -> 0, or the damage found in the stream (1 ends early, 2 words
 * left over, 3 a lane not ending at 2^16). Per segment j (int64 arrays): its length, row
 * length, first table; has_map[j] (u8) says its column classes are the next seg_r[j] bytes
 * of maps. Table t's entries (in increasing code) are first[t] .. first[t+1]-1 (int64) of
 * code and freq (u32). rest: the rest fields as stored (SPEC.md 8.7); out: the W-bit
 * symbols, written. */
static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer stream, seg_n, seg_r, seg_base, has_map, maps, first, code, freq, rest, out;
    unsigned int lanes, shift, width;
    int simd = 1;
    if (!PyArg_ParseTuple(args, "y*Iy*y*y*y*y*y*y*y*y*IIw*|p", &stream, &lanes, &seg_n, &seg_r, &seg_base, &has_map,
                          &maps, &first, &code, &freq, &rest, &shift, &width, &out, &simd))
        return NULL;
    PyObject *result = NULL;
    size_t nseg = (size_t)seg_n.len / sizeof(int64_t), total = 0;
    const uint8_t **seg_map = PyMem_Calloc(nseg + 1, sizeof(*seg_map));
    uint8_t *seg_tables = PyMem_Calloc(nseg + 1, 1);
    uint32_t *states = PyMem_Calloc((size_t)lanes + 1, sizeof(uint32_t));
    uint8_t *built = NULL;
    if (seg_map == NULL || seg_tables == NULL || states == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (check_args(&stream, lanes, &seg_n, &seg_r, &seg_base, &has_map, &maps, &first, &code, &freq, &rest, shift,
                   width, &out, seg_map, seg_tables, &total)) {
        PyErr_SetString(PyExc_ValueError, "_exponent_native.decode: inconsistent arguments");
        goto done;
    }
    size_t classes = 1;
    for (size_t j = 0; j < nseg; ++j)
        if (seg_tables[j] > classes)
            classes = seg_tables[j];
    if ((built = PyMem_Malloc(classes * TABLE_STRIDE)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int err = OK;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *s = stream.buf, *r = rest.buf;
    const unsigned R = 1 + shift;
    for (uint32_t k = 0; k < lanes; ++k)
        states[k] = (uint32_t)load_le(s + 4 * (size_t)k, 4);
    ctx_t c = {.first = first.buf, .freq = freq.buf, .code = code.buf, .built = built, .simd = simd && has_avx2,
               .states = states, .lanes = lanes, .words = s + 4 * (size_t)lanes,
               .nwords = ((size_t)stream.len - 4 * (size_t)lanes) / 2, .wpos = 0, .lane = 0, .rest_low = r,
               .rest_high = r + total * (R / 8), .b0 = R / 8, .b1 = R % 8, .shift = shift, .width = width};
    run(&c, out.buf, total, nseg, seg_n.buf, seg_r.buf, seg_base.buf, seg_map, seg_tables);
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
    PyMem_Free(seg_tables);
    PyMem_Free(states);
    PyMem_Free(built);
    PyBuffer_Release(&stream); PyBuffer_Release(&seg_n); PyBuffer_Release(&seg_r); PyBuffer_Release(&seg_base);
    PyBuffer_Release(&has_map); PyBuffer_Release(&maps); PyBuffer_Release(&first); PyBuffer_Release(&code);
    PyBuffer_Release(&freq); PyBuffer_Release(&rest); PyBuffer_Release(&out);
    return result;
}


/* One varint of at most 10 bytes and below 2^64 (SPEC.md 1) at b[*pos] (n bytes in all); 0 if
 * there is none. */
static int varint_at(const uint8_t *b, size_t n, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned k = 0; k < 10 && *pos < n; ++k) {
        const uint8_t byte = b[(*pos)++];
        if (k == 9 && byte > 1)
            return 0;
        x |= (uint64_t)(byte & 0x7F) << (7 * k);
        if (!(byte & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

/* The tables of a codec-3 payload from their stored varints (SPEC.md 8.7): `ntables` tables
 * into code/freq/start (room for `cap` entries) and first (ntables + 1 values). Returns the
 * entry count, or -1 if any rule fails: exponent.py's numpy reader then finds which, for its
 * message. */
static int64_t read_tables(const uint8_t *b, size_t n, size_t ntables, uint64_t alphabet, uint32_t *code, uint32_t *freq,
                           uint32_t *start, int64_t *first, size_t cap)
{
    size_t pos = 0, e = 0;
    for (size_t t = 0; t < ntables; ++t) {
        uint64_t m, gap, f, a = 0, total = 0;
        if (!varint_at(b, n, &pos, &m) || m < 1 || m > alphabet)
            return -1;
        first[t] = (int64_t)e;
        for (uint64_t i = 0; i < m; ++i, ++e) {
            if (!varint_at(b, n, &pos, &gap) || !varint_at(b, n, &pos, &f) || gap >= alphabet || f < 1 || f > (1u << SLOT_BITS))
                return -1;
            a = i ? a + 1 + gap : gap; /* a_i = a_(i-1) + 1 + gap_i, a_-1 = -1 */
            if (a >= alphabet || e >= cap)
                return -1;
            code[e] = (uint32_t)a;
            freq[e] = (uint32_t)f;
            start[e] = (uint32_t)total;
            total += f;
        }
        if (total != (1u << SLOT_BITS))
            return -1;
    }
    first[ntables] = (int64_t)e;
    return pos == n ? (int64_t)e : -1;
}

static PyObject *tables(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw, code, freq, start, first;
    Py_ssize_t ntables;
    unsigned long long alphabet;
    if (!PyArg_ParseTuple(args, "y*nKw*w*w*w*", &raw, &ntables, &alphabet, &code, &freq, &start, &first))
        return NULL;
    PyObject *result = NULL;
    const size_t cap = (size_t)code.len / 4;
    if (ntables < 0 || (size_t)freq.len / 4 < cap || (size_t)start.len / 4 < cap || (size_t)first.len / 8 < (size_t)ntables + 1) {
        PyErr_SetString(PyExc_ValueError, "_exponent_native.tables: inconsistent arguments");
    } else {
        int64_t got;
        Py_BEGIN_ALLOW_THREADS
        got = read_tables(raw.buf, (size_t)raw.len, (size_t)ntables, alphabet, code.buf, freq.buf, start.buf, first.buf, cap);
        Py_END_ALLOW_THREADS
        result = PyLong_FromLongLong(got);
    }
    PyBuffer_Release(&raw); PyBuffer_Release(&code); PyBuffer_Release(&freq); PyBuffer_Release(&start); PyBuffer_Release(&first);
    return result;
}


/* ----------------------------------------------------------------------------- encoder
 * The writer's side (exponent.encode_exponent, whose numpy code is the reference: the same
 * bytes on every input, tests/test_exponent_native.py). Integer arithmetic only. */

/* A u16 or u32 symbol, native (little-endian) order. */
static ALWAYS_INLINE uint32_t sym_at(const uint8_t *s, size_t i, unsigned width)
{
    if (width == 16)
        return ((const uint16_t *)s)[i];
    return ((const uint32_t *)s)[i];
}

static int symbols_arg(Py_buffer *sym, unsigned width, size_t *n)
{
    if ((width != 16 && width != 32) || (size_t)sym->len % (width / 8))
        return -1;
    *n = (size_t)sym->len / (width / 8);
    return 0;
}

/* histogram(sym, width, shift, bits, r, classes, counts): adds to counts (u64, K * 2^bits) the
 * codes (sym >> shift) mod 2^bits of the symbols, symbol p in class classes[p mod r] (bytes < K;
 * empty: every symbol in class 0). */
static PyObject *histogram(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer sym, cls, counts;
    unsigned width, shift, bits;
    Py_ssize_t r;
    if (!PyArg_ParseTuple(args, "y*IIIny*w*", &sym, &width, &shift, &bits, &r, &cls, &counts))
        return NULL;
    size_t n = 0, ncls = 1;
    const uint8_t *map = cls.len ? cls.buf : NULL;
    for (Py_ssize_t k = 0; k < cls.len; ++k)
        if ((size_t)((const uint8_t *)cls.buf)[k] + 1 > ncls)
            ncls = (size_t)((const uint8_t *)cls.buf)[k] + 1;
    int bad = symbols_arg(&sym, width, &n) || bits < 1 || bits > 16 || shift + bits > width || r < 1 ||
              (map != NULL && cls.len != r) || (size_t)counts.len < (ncls << bits) * sizeof(uint64_t);
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        uint64_t *c = counts.buf;
        const uint32_t mask = (1u << bits) - 1;
        size_t col = 0;
        for (size_t i = 0; i < n; ++i) {
            const size_t k = map ? map[col] : 0;
            ++c[(k << bits) + ((sym_at(sym.buf, i, width) >> shift) & mask)];
            if (++col == (size_t)r)
                col = 0;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sym); PyBuffer_Release(&cls); PyBuffer_Release(&counts);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "_exponent_native.histogram: inconsistent arguments");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* column_sums(sym, width, shift, bits, r, sums): sums (u64, r) of the codes of each column p mod r. */
static PyObject *column_sums(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer sym, sums;
    unsigned width, shift, bits;
    Py_ssize_t r;
    if (!PyArg_ParseTuple(args, "y*IIInw*", &sym, &width, &shift, &bits, &r, &sums))
        return NULL;
    size_t n = 0;
    int bad = symbols_arg(&sym, width, &n) || bits < 1 || bits > 16 || shift + bits > width || r < 1 ||
              (size_t)sums.len != (size_t)r * sizeof(uint64_t);
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        uint64_t *out = sums.buf;
        const uint32_t mask = (1u << bits) - 1;
        memset(out, 0, (size_t)sums.len);
        for (size_t i = 0, col = 0; i < n; ++i) {
            out[col] += (sym_at(sym.buf, i, width) >> shift) & mask;
            if (++col == (size_t)r)
                col = 0;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sym); PyBuffer_Release(&sums);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "_exponent_native.column_sums: inconsistent arguments");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* pack_rest(sym, width, shift, low, high): the rest fields (SPEC.md 8.7: the sign above the
 * shift low mantissa bits, R = 1 + shift bits) as stored: low gets R div 8 bytes a symbol,
 * high (zeroed by the caller) R mod 8 bits a symbol, 8 symbols to a group of R mod 8 bytes. */
static PyObject *pack_rest(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer sym, low, high;
    unsigned width, shift;
    if (!PyArg_ParseTuple(args, "y*IIw*w*", &sym, &width, &shift, &low, &high))
        return NULL;
    size_t n = 0;
    const unsigned R = 1 + shift, b0 = R / 8, b1 = R % 8;
    int bad = symbols_arg(&sym, width, &n) || R >= width || (size_t)low.len != n * b0 || (size_t)high.len != (n + 7) / 8 * b1;
    if (!bad) {
        Py_BEGIN_ALLOW_THREADS
        uint8_t *lo = low.buf, *hi = high.buf;
        const uint32_t smask = (1u << shift) - 1;
        uint64_t acc = 0;
        for (size_t i = 0; i < n; ++i) {
            const uint32_t s = sym_at(sym.buf, i, width);
            const uint32_t rest = ((s >> (width - 1)) << shift) | (s & smask);
            for (unsigned b = 0; b < b0; ++b)
                lo[i * b0 + b] = (uint8_t)(rest >> (8 * b));
            if (b1) {
                acc |= (uint64_t)(rest >> (8 * b0)) << (b1 * (i % 8));
                if (i % 8 == 7 || i + 1 == n) {
                    for (unsigned b = 0; b < b1; ++b)
                        hi[i / 8 * b1 + b] = (uint8_t)(acc >> (8 * b));
                    acc = 0;
                }
            }
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sym); PyBuffer_Release(&low); PyBuffer_Release(&high);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "_exponent_native.pack_rest: inconsistent arguments");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* encode(sym, width, shift, bits, lanes, seg_n, seg_r, seg_base, has_map, maps, entry_of, freq,
 *        start, out) -> the stream's length: the rANS stream (SPEC.md 8.7) of the codes
 * (sym >> shift) mod 2^bits, written to the front of out (4 * lanes + 2 * symbols bytes).
 * Segments as decode() takes them; entry_of (i32, tables * 2^bits): the entry of each table's
 * code (-1: none, a ValueError); freq and start (u32) per entry. Symbols are pushed last to
 * first, symbol i through lane i mod lanes, exactly as rans.encode. */
static PyObject *encode(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer sym, seg_n, seg_r, seg_base, has_map, maps, entry_of, freq, start, out;
    unsigned width, shift, bits, lanes;
    if (!PyArg_ParseTuple(args, "y*IIIIy*y*y*y*y*y*y*y*w*", &sym, &width, &shift, &bits, &lanes, &seg_n, &seg_r,
                          &seg_base, &has_map, &maps, &entry_of, &freq, &start, &out))
        return NULL;
    size_t n = 0, nseg = (size_t)seg_n.len / 8, total = 0, mtotal = 0, nent = (size_t)freq.len / 4, ntab = 0;
    const int64_t *sn = seg_n.buf, *sr = seg_r.buf, *sb = seg_base.buf;
    const uint8_t *hm = has_map.buf;
    int bad = symbols_arg(&sym, width, &n) || bits < 1 || bits > 16 || shift + bits > width || lanes < 1 ||
              (size_t)seg_r.len != nseg * 8 || (size_t)seg_base.len != nseg * 8 || (size_t)has_map.len != nseg ||
              (size_t)start.len != nent * 4 || (size_t)entry_of.len % ((size_t)4 << bits) ||
              (size_t)out.len != 4 * (size_t)lanes + 2 * n;
    if (!bad) {
        ntab = (size_t)entry_of.len / ((size_t)4 << bits);
        const int32_t *eo = entry_of.buf;
        const uint32_t *fr = freq.buf;
        for (size_t k = 0; k < ntab << bits && !bad; ++k)
            bad = eo[k] >= (int64_t)nent;
        for (size_t e = 0; e < nent && !bad; ++e)
            bad = fr[e] < 1 || fr[e] > (1u << SLOT_BITS);
        for (size_t j = 0; j < nseg && !bad; ++j) {
            bad = sn[j] < 1 || sr[j] < 1 || sb[j] < 0 || (size_t)sb[j] >= ntab; /* each class's table: checked per symbol */
            total += (size_t)sn[j];
            mtotal += hm[j] ? (size_t)sr[j] : 0;
        }
        bad = bad || total != n || mtotal != (size_t)maps.len;
        for (Py_ssize_t k = 0; k < maps.len && !bad; ++k)
            bad = ((const uint8_t *)maps.buf)[k] >= MAX_CLASSES;
    }
    PyObject *result = NULL;
    uint32_t *states = bad ? NULL : PyMem_Malloc((size_t)lanes * sizeof(uint32_t));
    if (bad)
        PyErr_SetString(PyExc_ValueError, "_exponent_native.encode: inconsistent arguments");
    else if (states == NULL)
        PyErr_NoMemory();
    else {
        int missing = 0;
        size_t words = 0;
        Py_BEGIN_ALLOW_THREADS
        const int32_t *eo = entry_of.buf;
        const uint32_t *fr = freq.buf, *st = start.buf, mask = (1u << bits) - 1;
        const uint8_t *mp = (const uint8_t *)maps.buf + maps.len;
        uint8_t *o = out.buf, *wp = o + out.len; /* words are written backwards from the end */
        for (uint32_t k = 0; k < lanes; ++k)
            states[k] = RANS_LOW;
        size_t i = n, lane = (n - 1) % lanes;
        for (size_t j = nseg; j-- > 0 && !missing;) {
            const size_t nj = (size_t)sn[j], r = (size_t)sr[j];
            const uint8_t *map = NULL;
            if (hm[j])
                map = (mp -= r);
            const size_t base = (size_t)sb[j];
            for (size_t p = nj, col = (nj - 1) % r; p-- > 0; col = col ? col - 1 : r - 1) {
                const size_t t = base + (map ? map[col] : 0);
                const int32_t e = t < ntab ? eo[(t << bits) + ((sym_at(sym.buf, --i, width) >> shift) & mask)] : -1;
                if (e < 0) {
                    missing = 1;
                    break;
                }
                uint64_t x = states[lane];
                const uint32_t f = fr[e];
                if (x >= (uint64_t)f << (32 - SLOT_BITS)) {
                    *--wp = (uint8_t)(x >> 8);
                    *--wp = (uint8_t)x;
                    x >>= 16;
                }
                states[lane] = (uint32_t)(((x / f) << SLOT_BITS) + x % f + st[e]);
                lane = lane ? lane - 1 : lanes - 1;
            }
        }
        if (!missing) {
            words = (size_t)(o + out.len - wp) / 2;
            memmove(o + 4 * (size_t)lanes, wp, 2 * words);
            for (uint32_t k = 0; k < lanes; ++k)
                for (unsigned b = 0; b < 4; ++b)
                    o[4 * (size_t)k + b] = (uint8_t)(states[k] >> (8 * b));
        }
        Py_END_ALLOW_THREADS
        if (missing)
            PyErr_SetString(PyExc_ValueError, "_exponent_native.encode: a code has no entry in its table");
        else
            result = PyLong_FromSize_t(4 * (size_t)lanes + 2 * words);
    }
    PyMem_Free(states);
    PyBuffer_Release(&sym); PyBuffer_Release(&seg_n); PyBuffer_Release(&seg_r); PyBuffer_Release(&seg_base);
    PyBuffer_Release(&has_map); PyBuffer_Release(&maps); PyBuffer_Release(&entry_of); PyBuffer_Release(&freq);
    PyBuffer_Release(&start); PyBuffer_Release(&out);
    return result;
}

/* unpermute(block, rows, cols, out, offset, stride): codec 2's top plane of one segment
 * (SPEC.md 8.6; entropy.py), from its context groups laid out as one grid whose rows and
 * columns are sorted by class, back to payload order: for i < len(rows) and c < r =
 * len(cols) (int64 arrays, rows a permutation of 0 .. len(rows)-1, cols of 0 .. r-1),
 * out[offset + (rows[i] * r + c) * stride] = block[i * r + cols[c]]. */
static PyObject *unpermute(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer block, rows, cols, out;
    Py_ssize_t offset, stride;
    if (!PyArg_ParseTuple(args, "y*y*y*w*nn", &block, &rows, &cols, &out, &offset, &stride))
        return NULL;
    const size_t full = (size_t)rows.len / 8, r = (size_t)cols.len / 8;
    const int64_t *ro = rows.buf, *co = cols.buf;
    int bad = rows.len % 8 || cols.len % 8 || offset < 0 || stride < 1 || (size_t)block.len != full * r;
    for (size_t i = 0; !bad && i < full; ++i)
        bad = ro[i] < 0 || (size_t)ro[i] >= full;
    for (size_t c = 0; !bad && c < r; ++c)
        bad = co[c] < 0 || (size_t)co[c] >= r;
    if (!bad && full * r > 0) /* the last byte written: (full * r - 1) * stride past offset */
        bad = (size_t)offset >= (size_t)out.len || (full * r - 1) > ((size_t)out.len - 1 - (size_t)offset) / (size_t)stride;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "_exponent_native.unpermute: inconsistent arguments");
    } else {
        Py_BEGIN_ALLOW_THREADS
        const uint8_t *src = block.buf;
        uint8_t *dst = (uint8_t *)out.buf + offset;
        for (size_t i = 0; i < full; ++i) {
            const uint8_t *row = src + i * r;
            uint8_t *to = dst + (size_t)ro[i] * r * (size_t)stride;
            for (size_t c = 0; c < r; ++c)
                to[c * (size_t)stride] = row[co[c]];
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&block); PyBuffer_Release(&rows); PyBuffer_Release(&cols); PyBuffer_Release(&out);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode a codec-3 rANS stream and rest fields into symbols (see exponent.py); simd=0 "
                                     "keeps to the scalar steps (the same symbols; for tests)."},
    {"tables", tables, METH_VARARGS, "A payload's tables from their varints, or -1 if they break SPEC.md 8.7 (see exponent.py)."},
    {"encode", encode, METH_VARARGS, "The rANS stream of a payload's codes (see exponent.py)."},
    {"histogram", histogram, METH_VARARGS, "Add the codes' counts per column class (see exponent.py)."},
    {"column_sums", column_sums, METH_VARARGS, "The codes' sums per column (see exponent.py)."},
    {"pack_rest", pack_rest, METH_VARARGS, "The rest fields as stored (see exponent.py)."},
    {"unpermute", unpermute, METH_VARARGS, "Codec 2's top plane of one segment back to payload order (see entropy.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_exponent_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__exponent_native(void)
{
    init_word_ctrl();
    has_avx2 = cpu_has_avx2() != 0;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "SIMD", has_avx2) < 0 || PyModule_AddIntConstant(m, "ABI", ABI) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
