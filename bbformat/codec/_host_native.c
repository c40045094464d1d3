/* The host's per-value work between a block's linear algebra and its tensors, compiled, with
 * the GIL released: widening bit patterns to float64, rounding float64 to a dtype (SPEC.md 7.4),
 * the distance of a value to its dtype's nearest rounding boundary (SPEC.md 9 item 7, 12.6),
 * the x_residuals correction (SPEC.md 8.4) and the raw size of its groups, a regenerated
 * block's upper triangle, a popped block's symmetric matrix and a finiteness test of float64
 * matrices. Each function is the exact counterpart of a
 * numpy function that stays the reference (codec/dtypes.py, band.py, varint.py,
 * section_kinds.py, rotation.py); tests/test_host_native.py proves the two give the same bits.
 *
 * Dtype codes: 0 float16, 1 bfloat16, 2 float32. Arrays are C-contiguous, native byte order;
 * host_native.py checks shapes and types before calling, so a call here cannot read or write
 * outside its buffers whatever a file holds (lengths are rechecked here all the same).
 * Floating point: IEEE double with round-to-nearest; every product below is exact (halving),
 * so contracting into an FMA cannot change a result. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(BBFORMAT_NO_SIMD)
#include <immintrin.h>
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif

#define ABI 7

enum { F16 = 0, BF16 = 1, F32 = 2 };
enum { RES_OK = 0, RES_COUNT = 1, RES_LONG = 2, RES_BIG = 3, RES_RANGE = 4 };

static int bits_of(int code) { return code == F32 ? 32 : 16; }

/* floor(log2 m) for m > 0 */
static inline int top_bit(uint64_t m)
{
#if defined(__GNUC__) || defined(__clang__)
    return 63 - __builtin_clzll(m);
#else
    int k = 0;
    while (m >>= 1)
        ++k;
    return k;
#endif
}

static inline double f32_bits_to_f64(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return (double)f;
}

static inline uint64_t f64_bits(double x)
{
    uint64_t b;
    memcpy(&b, &x, 8);
    return b;
}

static inline double bits_f64(uint64_t b)
{
    double x;
    memcpy(&x, &b, 8);
    return x;
}

/* Element loads and stores through memcpy: a buffer may be a view into a file's bytes at any
 * offset, so no element is assumed aligned (the compiler makes each one plain move). */
static inline uint16_t ld16(const void *p, Py_ssize_t i) { uint16_t v; memcpy(&v, (const uint8_t *)p + 2 * i, 2); return v; }
static inline uint32_t ld32(const void *p, Py_ssize_t i) { uint32_t v; memcpy(&v, (const uint8_t *)p + 4 * i, 4); return v; }
static inline double ldf64(const void *p, Py_ssize_t i) { double v; memcpy(&v, (const uint8_t *)p + 8 * i, 8); return v; }
static inline void st16(void *p, Py_ssize_t i, uint16_t v) { memcpy((uint8_t *)p + 2 * i, &v, 2); }
static inline void st32(void *p, Py_ssize_t i, uint32_t v) { memcpy((uint8_t *)p + 4 * i, &v, 4); }
static inline void stf64(void *p, Py_ssize_t i, double v) { memcpy((uint8_t *)p + 8 * i, &v, 8); }

/* float16 -> float64, exactly; NaN keeps sign and payload (numpy's npy_halfbits_to_doublebits) */
static inline double f16_to_f64(uint16_t h)
{
    uint64_t s = (uint64_t)(h >> 15) << 63;
    uint32_t e = (h >> 10) & 0x1F, f = h & 0x3FF;
    if (e == 0x1F)
        return bits_f64(s | 0x7FF0000000000000ull | ((uint64_t)f << 42));
    if (e == 0) {
        if (f == 0)
            return bits_f64(s);
        double v = ldexp((double)f, -24); /* subnormal: f * 2^-24, exact */
        return (h >> 15) ? -v : v;
    }
    return bits_f64(s | ((uint64_t)(e - 15 + 1023) << 52) | ((uint64_t)f << 42));
}

static inline double widen_one(int code, const void *src, size_t i)
{
    if (code == F16)
        return f16_to_f64(ld16(src, (Py_ssize_t)i));
    if (code == BF16)
        return f32_bits_to_f64((uint32_t)ld16(src, (Py_ssize_t)i) << 16);
    return f32_bits_to_f64(ld32(src, (Py_ssize_t)i));
}

/* SPEC.md Appendix C: float64 bits -> the format with P fraction and EW exponent bits, for
 * values that are not NaN, directly and with ties to even */
static inline uint32_t round_int(uint64_t xb, int P, int EW)
{
    uint32_t s = (uint32_t)(xb >> 63) << (P + EW);
    int e = (int)((xb >> 52) & 0x7FF);
    uint64_t f = xb & ((1ull << 52) - 1);
    uint32_t inf = s | (((1u << EW) - 1) << P);
    if (e == 0x7FF)
        return inf;
    if (e == 0 && f == 0)
        return s;
    uint64_t m = e == 0 ? f : (f | (1ull << 52));
    int q = e == 0 ? -1074 : e - 1075;
    int bias = (1 << (EW - 1)) - 1;
    int E = q + top_bit(m);
    int Q = (E > 1 - bias ? E : 1 - bias) - P;
    int shift = Q - q;
    uint64_t r = shift < 64 ? m >> shift : 0;
    if (shift <= 64) {
        uint64_t rem = m - (shift < 64 ? r << shift : 0), half = 1ull << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r += 1;
    }
    if (r == (1ull << (P + 1))) {
        r >>= 1;
        Q += 1;
    }
    if (r < (1ull << P))
        return s | (uint32_t)r;
    int biased = Q + P + bias;
    if (biased >= (1 << EW) - 1)
        return inf;
    return s | ((uint32_t)biased << P) | (uint32_t)(r - (1ull << P));
}

/* x (not NaN) as float32 rounded to odd: toward zero, the last fraction bit set if inexact.
 * Rounding that to a format with at least 2 fewer fraction bits, to nearest even, is the
 * direct rounding of x (SPEC.md 7.4; the reference's bfloat16 path). */
static inline uint32_t f32_odd(double x)
{
    const float r = (float)x;
    const double back = (double)r;
    uint32_t b;
    memcpy(&b, &r, 4);
    /* without branches (a rounding away from zero is a coin toss on weights, and mispredicted
     * branches made this 9 ns a value): rounded away from zero (an infinity included), one
     * step back; then the last bit set if inexact, which a step back always is */
    b -= (uint32_t)(fabs(back) > fabs(x));
    return b | (uint32_t)(back != x);
}

/* float32 bits -> float16 bits, to nearest even (F. Giesen's float_to_half_fast3_rtne): an
 * infinity stays one, values of 2^16 and more overflow, the subnormal range is rounded by a
 * float32 addition (correctly rounded, the default rounding mode) */
static inline uint32_t f32_to_f16(uint32_t b)
{
    uint32_t sign = (b >> 16) & 0x8000u, a = b & 0x7FFFFFFFu;
    if (a >= (127u + 16) << 23)
        return sign | 0x7C00u;
    if (a < 113u << 23) { /* below 2^-14: a multiple of 2^-24, by adding 0.5 */
        float f, magic = 0.5f;
        uint32_t u;
        memcpy(&f, &a, 4);
        f += magic;
        memcpy(&u, &f, 4);
        return sign | (u - 0x3F000000u);
    }
    a += ((uint32_t)(15 - 127) << 23) + 0xFFFu + ((a >> 13) & 1u);
    return sign | (a >> 13);
}

/* round(x, dtype) of SPEC.md 7.4 for bfloat16, NaN as the reference (numpy) produces it: through
 * float32 rounded to odd, as the reference's bfloat16 path does; one expression, NaN tested by
 * comparison, so that a loop of it vectorises */
static inline uint16_t round_bf16(double x)
{
    const uint32_t b = f32_odd(x);
    const uint16_t r = (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
    return x != x ? (uint16_t)0x7FC0u : r;
}

/* the same for float16 (f32_to_f16 keeps its rare branches); NaN keeps sign and payload */
static inline uint16_t round_f16(double x)
{
    const uint64_t xb = f64_bits(x);
    const uint32_t frac = (uint32_t)((xb & ((1ull << 52) - 1)) >> 42);
    const uint16_t nan = (uint16_t)(((xb >> 63) << 15) | 0x7C00u | (frac ? frac : 1u));
    return x != x ? nan : (uint16_t)f32_to_f16(f32_odd(x));
}

/* round(x, dtype) of SPEC.md 7.4; round_int (Appendix C) is the integer statement of the same
 * rounding, kept for the tests. float32: the hardware conversion (nearest, ties to even; NaN
 * quieted). */
static inline uint32_t round_one(int code, double x)
{
    if (code == F32) {
        const float r = (float)x;
        uint32_t b;
        memcpy(&b, &r, 4);
        return b;
    }
    return code == BF16 ? round_bf16(x) : round_f16(x);
}

/* the neighbours of pattern b in value order (band.boundary_distance): up and down */
static inline void neighbours(uint32_t b, int w, uint32_t *up, uint32_t *down)
{
    uint32_t sign = 1u << (w - 1), mag = b & (sign - 1);
    int neg = b >= sign, edge = mag == sign - 1;
    *up = neg ? (mag == 0 ? 0 : b - 1) : (edge ? b : b + 1);
    *down = neg ? (edge ? b : b + 1) : (mag == 0 ? sign : b - 1);
}

static inline double widen_bits(int code, uint32_t b)
{
    if (code == F16)
        return f16_to_f64((uint16_t)b);
    if (code == BF16)
        return f32_bits_to_f64(b << 16);
    return f32_bits_to_f64(b);
}

/* band.boundary_distance of one value */
static inline double distance_one(int code, double x)
{
    int w = bits_of(code);
    uint32_t b = round_one(code, x), up, down;
    neighbours(b, w, &up, &down);
    double v = widen_bits(code, b), lo = widen_bits(code, down), hi = widen_bits(code, up);
    double mid_lo = isinf(lo) ? v - (hi - v) / 2 : (v + lo) / 2;
    double mid_hi = isinf(hi) ? v + (v - lo) / 2 : (v + hi) / 2;
    double a = x - mid_lo, c = mid_hi - x;
    /* a < c ? a : c without a branch (which way it goes is a coin toss): minsd is exactly that
     * expression; a NaN of a or c gives 0 below whatever d is */
#if defined(__SSE2__)
    double d = _mm_cvtsd_f64(_mm_min_sd(_mm_set_sd(a), _mm_set_sd(c)));
#else
    double d = a < c ? a : c;
#endif
    int ok = !isnan(a) & !isnan(c) & isfinite(x) & isfinite(v) & isfinite(d);
    return ok ? fabs(d) : 0.0;
}

static int check_code(int code)
{
    if (code < F16 || code > F32) {
        PyErr_SetString(PyExc_ValueError, "_host_native: dtype code not in 0..2");
        return -1;
    }
    return 0;
}

static int check_len(Py_buffer *b, Py_ssize_t n, Py_ssize_t itemsize, const char *what)
{
    if (b->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "_host_native: %s holds %zd bytes, not %zd", what, b->len, n * itemsize);
        return -1;
    }
    return 0;
}

enum { MAP_WIDEN = 0, MAP_ROUND = 1, MAP_DISTANCE = 2, MAP_IN_BAND = 3 };

#if HAVE_AVX2
/* The 32-bit lanes 0, 2, 4, 6 of a vector of four 64-bit masks (or values), as one 128-bit vector. */
__attribute__((target("avx2"))) static inline __m128i low32(__m256d m)
{
    return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(m), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)));
}

/* f32_odd of four values: the float32 patterns, in 32-bit lanes. cvtpd2ps rounds as (float)x
 * does (to nearest, ties to even: the default mode), and the comparisons are C's (> false on
 * NaN, != true). */
__attribute__((target("avx2"))) static inline __m128i f32_odd4(__m256d v)
{
    const __m256d absm = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL));
    const __m128 r = _mm256_cvtpd_ps(v);
    const __m256d back = _mm256_cvtps_pd(r);
    const __m256d away = _mm256_cmp_pd(_mm256_and_pd(back, absm), _mm256_and_pd(v, absm), _CMP_GT_OQ);
    const __m256d inexact = _mm256_cmp_pd(back, v, _CMP_NEQ_UQ);
    const __m128i b = _mm_add_epi32(_mm_castps_si128(r), low32(away)); /* away: -1, one step back */
    return _mm_or_si128(b, _mm_srli_epi32(low32(inexact), 31));
}

/* round_bf16 of four values, in 32-bit lanes */
__attribute__((target("avx2"))) static inline __m128i round_bf16_4(__m256d v)
{
    const __m128i b = f32_odd4(v);
    const __m128i t = _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(b, _mm_set1_epi32(0x7FFF)),
                                                   _mm_and_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(1))), 16);
    return _mm_blendv_epi8(t, _mm_set1_epi32(0x7FC0), low32(_mm256_cmp_pd(v, v, _CMP_UNORD_Q)));
}

/* round_bf16 of x[0 .. n), four at a time: returns how many it did (a multiple of 4) */
__attribute__((target("avx2"))) static Py_ssize_t round_bf16_avx2(const uint8_t *x, uint8_t *out, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128i t = round_bf16_4(_mm256_loadu_pd((const double *)(x + 8 * i)));
        _mm_storel_epi64((__m128i *)(out + 2 * i), _mm_packus_epi32(t, t)); /* every lane < 2^16 */
    }
    return i;
}

/* round_f16 of four values, in 32-bit lanes (f32_to_f16's three cases in every lane, then the
 * one that applies) */
__attribute__((target("avx2"))) static inline __m128i round_f16_4(__m256d v)
{
    const __m128i abs32 = _mm_set1_epi32(0x7FFFFFFF), signbit = _mm_set1_epi32((int)0x80000000u);
    const __m128i big = _mm_set1_epi32((127 + 16) << 23), small = _mm_set1_epi32(113 << 23);
    const __m128i inf16 = _mm_set1_epi32(0x7C00), rebias = _mm_set1_epi32((int)(((uint32_t)(15 - 127) << 23) + 0xFFFu));
    const __m128i one = _mm_set1_epi32(1), half_bits = _mm_set1_epi32(0x3F000000);
    const __m256i frac_mask = _mm256_set1_epi64x((1ll << 52) - 1);
    const __m128i b = f32_odd4(v);
    const __m128i sign = _mm_srli_epi32(_mm_and_si128(b, signbit), 16), a = _mm_and_si128(b, abs32);
    const __m128i normal = _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(a, rebias), _mm_and_si128(_mm_srli_epi32(a, 13), one)), 13);
    const __m128i sub = _mm_sub_epi32(_mm_castps_si128(_mm_add_ps(_mm_castsi128_ps(a), _mm_set1_ps(0.5f))), half_bits);
    __m128i t = _mm_blendv_epi8(normal, sub, _mm_cmplt_epi32(a, small)); /* a < 2^31: signed compares */
    t = _mm_blendv_epi8(t, inf16, _mm_cmpgt_epi32(a, _mm_sub_epi32(big, one)));
    t = _mm_or_si128(t, sign);
    /* NaN: sign, 0x7C00 and the top 10 bits of the float64 fraction (1 if they are 0) */
    const __m256i xb = _mm256_castpd_si256(v);
    const __m128i frac = low32(_mm256_castsi256_pd(_mm256_srli_epi64(_mm256_and_si256(xb, frac_mask), 42)));
    const __m128i fr = _mm_blendv_epi8(frac, one, _mm_cmpeq_epi32(frac, _mm_setzero_si128()));
    const __m128i xsign = _mm_srli_epi32(low32(_mm256_castsi256_pd(_mm256_srli_epi64(xb, 32))), 31);
    const __m128i nan = _mm_or_si128(_mm_or_si128(_mm_slli_epi32(xsign, 15), inf16), fr);
    return _mm_blendv_epi8(t, nan, low32(_mm256_cmp_pd(v, v, _CMP_UNORD_Q)));
}

/* round_f16 of x[0 .. n), four at a time: returns how many it did */
__attribute__((target("avx2"))) static Py_ssize_t round_f16_avx2(const uint8_t *x, uint8_t *out, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128i t = round_f16_4(_mm256_loadu_pd((const double *)(x + 8 * i)));
        _mm_storel_epi64((__m128i *)(out + 2 * i), _mm_packus_epi32(t, t));
    }
    return i;
}

/* Lanes (64-bit) of a where the 32-bit mask is set, else b. */
__attribute__((target("avx2"))) static inline __m256d select4(__m128i mask, __m256d a, __m256d b)
{
    return _mm256_blendv_pd(b, a, _mm256_cvtepi32_pd(mask)); /* -1 -> -1.0: the sign bit blendv reads */
}

/* The band distance of x from the value it rounds to (m, the magnitude's pattern in 32-bit lanes)
 * and the midpoints toward and away from zero: min(|x| - toward, away - |x|), toward zero 0
 * where m is 0, and 0 where x is not finite or rounds to an infinity (m >= inf_pattern) */
__attribute__((target("avx2"))) static inline __m256d distance_from(__m256d v, __m128i m, int inf_pattern, __m256d toward,
                                                                    __m256d away)
{
    const __m256d ax = _mm256_and_pd(v, _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL)));
    toward = select4(_mm_cmpeq_epi32(m, _mm_setzero_si128()), _mm256_setzero_pd(), toward);
    const __m256d d = _mm256_min_pd(_mm256_sub_pd(ax, toward), _mm256_sub_pd(away, ax));
    const __m256d finite = _mm256_cmp_pd(ax, _mm256_set1_pd(INFINITY), _CMP_LT_OQ);
    const __m256d rounds_finite = _mm256_cvtepi32_pd(_mm_cmplt_epi32(m, _mm_set1_epi32(inf_pattern)));
    return _mm256_and_pd(d, _mm256_and_pd(finite, _mm256_cmp_pd(rounds_finite, _mm256_setzero_pd(), _CMP_NEQ_OQ)));
}

/* distance_from for a dtype with subnormals: up to the smallest normal pattern (`normal`) the
 * steps are `step` on both sides, so the midpoints are m * step -+ step / 2, exactly; above
 * it, those of the normal patterns given */
__attribute__((target("avx2"))) static inline __m256d distance_stepped(__m256d v, __m128i m, int inf_pattern, int normal,
                                                                       double step, __m256d toward, __m256d away)
{
    const __m256d vs = _mm256_mul_pd(_mm256_cvtepi32_pd(m), _mm256_set1_pd(step)), hs = _mm256_set1_pd(step / 2);
    const __m128i small = _mm_cmplt_epi32(m, _mm_set1_epi32(normal + 1));
    toward = select4(small, _mm256_sub_pd(vs, hs), toward);
    away = select4(small, _mm256_add_pd(vs, hs), away);
    return distance_from(v, m, inf_pattern, toward, away);
}

/* distance_one(F16, .) of four values. A normal m (above 0x0400) as a float32 pattern is
 * (m << 13) + (112 << 23), and its midpoints are that -+ 0x1000 (half a float16 step; a borrow
 * into the exponent gives the half step below a power of two), as for bfloat16 below. Up to
 * 0x0400 the steps are 2^-24. */
__attribute__((target("avx2"))) static inline __m256d distance_f16_4(__m256d v)
{
    const __m128i m = _mm_and_si128(round_f16_4(v), _mm_set1_epi32(0x7FFF));
    const __m128i p = _mm_add_epi32(_mm_slli_epi32(m, 13), _mm_set1_epi32(112 << 23)), half = _mm_set1_epi32(0x1000);
    const __m256d toward = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_sub_epi32(p, half)));
    const __m256d away = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_add_epi32(p, half)));
    return distance_stepped(v, m, 0x7C00, 0x0400, 0x1p-24, toward, away);
}

/* distance_one(F32, .) of four values: the same in float64 patterns. A normal m (above
 * 0x00800000) widened is (m << 29) + (896 << 52), its midpoints that -+ 2^28; up to 0x00800000
 * the steps are 2^-149. */
__attribute__((target("avx2"))) static inline __m256d distance_f32_4(__m256d v)
{
    const __m128i m = _mm_and_si128(_mm_castps_si128(_mm256_cvtpd_ps(v)), _mm_set1_epi32(0x7FFFFFFF)); /* round_one(F32, .) */
    const __m256i p = _mm256_add_epi64(_mm256_slli_epi64(_mm256_cvtepu32_epi64(m), 29), _mm256_set1_epi64x(896ll << 52));
    const __m256i half = _mm256_set1_epi64x(1ll << 28);
    return distance_stepped(v, m, 0x7F800000, 0x00800000, 0x1p-149, _mm256_castsi256_pd(_mm256_sub_epi64(p, half)),
                            _mm256_castsi256_pd(_mm256_add_epi64(p, half)));
}

/* distance_one(BF16, .) of four values. In magnitudes: with m the pattern |x| rounds to, the
 * midpoints toward and away from zero are the float32 patterns (m << 16) - 0x8000 and
 * (m << 16) + 0x8000 (toward zero: 0 where m is 0), exactly the (v + neighbour) / 2 of
 * distance_one; the two differences are its a and c (x - (-u) and u - |x| are one IEEE
 * operation), so d is its d. 0 where x is not finite or rounds to an infinity. */
__attribute__((target("avx2"))) static inline __m256d distance_bf16_4(__m256d v)
{
    const __m128i m = _mm_and_si128(round_bf16_4(v), _mm_set1_epi32(0x7FFF));
    const __m128i top = _mm_slli_epi32(m, 16), half = _mm_set1_epi32(0x8000);
    return distance_from(v, m, 0x7F80, _mm256_cvtps_pd(_mm_castsi128_ps(_mm_sub_epi32(top, half))),
                         _mm256_cvtps_pd(_mm_castsi128_ps(_mm_add_epi32(top, half))));
}

/* distance_one(code, .) of four values */
__attribute__((target("avx2"))) static inline __m256d distance4(int code, __m256d v)
{
    return code == BF16 ? distance_bf16_4(v) : code == F16 ? distance_f16_4(v) : distance_f32_4(v);
}

/* distance_one(code, x[i]) into out[i] (kind MAP_DISTANCE) or its test against delta into
 * flags[i] (MAP_IN_BAND), four at a time: returns how many it did */
__attribute__((target("avx2"))) static Py_ssize_t distance_avx2(const int code, const uint8_t *x, uint8_t *out, uint8_t *flags, double delta, Py_ssize_t n)
{
    const __m256d dl = _mm256_set1_pd(delta);
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d d = distance4(code, _mm256_loadu_pd((const double *)(x + 8 * i)));
        if (out != NULL)
            _mm256_storeu_pd((double *)(out + 8 * i), d);
        else {
            const int in = _mm256_movemask_pd(_mm256_cmp_pd(d, dl, _CMP_LE_OQ));
            for (int k = 0; k < 4; ++k)
                flags[i + k] = (uint8_t)((in >> k) & 1);
        }
    }
    return i;
}

/* the smallest distance_one(code, x[i]) where skip[i] is 0 (skip NULL: none skipped), four at
 * a time, into *best: returns how many values it went through */
__attribute__((target("avx2"))) static Py_ssize_t min_distance_avx2(const int code, const uint8_t *x, const uint8_t *skip,
                                                                    Py_ssize_t n, double *best)
{
    __m256d lo = _mm256_set1_pd(INFINITY);
    const __m256d inf = lo;
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d d = distance4(code, _mm256_loadu_pd((const double *)(x + 8 * i)));
        if (skip != NULL) {
            uint32_t s4;
            memcpy(&s4, skip + i, 4);
            const __m256d skipped = _mm256_cvtepi32_pd(_mm_cmpgt_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)s4)), _mm_setzero_si128()));
            d = _mm256_blendv_pd(d, inf, _mm256_cmp_pd(skipped, _mm256_setzero_pd(), _CMP_NEQ_OQ));
        }
        lo = _mm256_min_pd(lo, d);
    }
    double l[4];
    _mm256_storeu_pd(l, lo);
    for (int k = 0; k < 4; ++k)
        if (l[k] < *best)
            *best = l[k];
    return i;
}

static int cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}
#else
static int cpu_has_avx2(void) { return 0; }
#endif

static int has_avx2; /* set once at import: the CPU runs the AVX2 loops */

/* the element loop of map() for one dtype, a constant in each caller below, so that the compiler
 * drops the other dtypes' branches and vectorises what it can */
static inline __attribute__((always_inline)) void map_as(int kind, const int code, const void *src, void *out, Py_ssize_t n,
                                                       double delta, int simd)
{
    const uint8_t *x = src;
    Py_ssize_t i = 0; /* values done by an AVX2 loop */
    (void)x, (void)simd; /* unused where there are no AVX2 loops */
    switch (kind) {
    case MAP_WIDEN:
        for (; i < n; ++i)
            stf64(out, i, widen_one(code, src, (size_t)i));
        return;
    case MAP_ROUND:
        if (code == F32) {
            for (; i < n; ++i)
                st32(out, i, round_one(F32, ldf64(src, i)));
            return;
        }
#if HAVE_AVX2
        if (simd)
            i = code == BF16 ? round_bf16_avx2(x, out, n) : round_f16_avx2(x, out, n);
#endif
        for (; i < n; ++i)
            st16(out, i, (uint16_t)round_one(code, ldf64(src, i)));
        return;
    case MAP_DISTANCE:
#if HAVE_AVX2
        if (simd)
            i = distance_avx2(code, x, out, NULL, delta, n);
#endif
        for (; i < n; ++i)
            stf64(out, i, distance_one(code, ldf64(src, i)));
        return;
    default:
#if HAVE_AVX2
        if (simd)
            i = distance_avx2(code, x, NULL, out, delta, n);
#endif
        for (; i < n; ++i)
            ((uint8_t *)out)[i] = distance_one(code, ldf64(src, i)) <= delta;
    }
}

/* the element loop of map(), without the GIL */
static void map_values(int kind, int code, const void *src, void *out, Py_ssize_t n, double delta, int simd)
{
    if (code == F16)
        map_as(kind, F16, src, out, n, delta, simd);
    else if (code == BF16)
        map_as(kind, BF16, src, out, n, delta, simd);
    else
        map_as(kind, F32, src, out, n, delta, simd);
}

/* map(kind, src, code, out, delta=0): one value of `out` per value of `src`. MAP_WIDEN: bit
 * patterns -> float64 (dtypes.bits_to_f64); MAP_ROUND: float64 -> bit patterns, SPEC.md 7.4
 * (dtypes.f64_to_bits); MAP_DISTANCE: float64 -> band.boundary_distance; MAP_IN_BAND: float64
 * -> one byte, distance <= delta (band.in_band) */
static PyObject *map(PyObject *self, PyObject *args)
{
    Py_buffer src, out;
    int kind, code;
    double delta = 0.0;
    int simd = 1;
    if (!PyArg_ParseTuple(args, "iy*iw*|di", &kind, &src, &code, &out, &delta, &simd))
        return NULL;
    PyObject *result = NULL;
    if (check_code(code) == 0 && kind >= MAP_WIDEN && kind <= MAP_IN_BAND) {
        Py_ssize_t bits = bits_of(code) / 8;
        Py_ssize_t in_size = kind == MAP_WIDEN ? bits : 8;
        Py_ssize_t out_size = kind == MAP_ROUND ? bits : kind == MAP_IN_BAND ? 1 : 8;
        Py_ssize_t n = src.len / in_size;
        if (check_len(&src, n, in_size, "source") == 0 && check_len(&out, n, out_size, "out") == 0) {
            Py_BEGIN_ALLOW_THREADS
            map_values(kind, code, src.buf, out.buf, n, delta, simd && has_avx2);
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    } else if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_host_native.map: kind not in 0..3");
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

/* min_distance(x, code, skip) -> float: the smallest distance at positions whose skip byte is 0
 * (skip empty: none skipped); inf when none is left */
static PyObject *min_distance(PyObject *self, PyObject *args)
{
    Py_buffer src, skip;
    int code, simd = 1;
    if (!PyArg_ParseTuple(args, "y*iy*|i", &src, &code, &skip, &simd))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = src.len / 8;
    if (check_code(code) == 0 && check_len(&src, n, 8, "source") == 0 && (skip.len == 0 || check_len(&skip, n, 1, "skip") == 0)) {
        const uint8_t *x = src.buf;
        const uint8_t *sk = skip.len ? skip.buf : NULL;
        double best = INFINITY;
        Py_ssize_t i = 0;
        Py_BEGIN_ALLOW_THREADS
#if HAVE_AVX2
        if (simd && has_avx2)
            i = min_distance_avx2(code, x, sk, n, &best);
#endif
        for (; i < n; ++i) {
            if (sk != NULL && sk[i])
                continue;
            double d = distance_one(code, ldf64(x, i));
            if (d < best)
                best = d;
        }
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble(best);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&skip);
    return result;
}

static inline uint32_t load_sym(const void *p, int w, Py_ssize_t i)
{
    return w == 16 ? ld16(p, i) : ld32(p, i);
}

/* context_counts(approx, w, shift, nbits, keep, counts): counts[c] += residual positions of
 * context c (SPEC.md 8.4); keep empty: every position */
static PyObject *context_counts(PyObject *self, PyObject *args)
{
    Py_buffer approx, keep, counts;
    int w, shift, nbits;
    if (!PyArg_ParseTuple(args, "y*iiiy*w*", &approx, &w, &shift, &nbits, &keep, &counts))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = 0;
    if ((w != 16 && w != 32) || nbits < 1 || nbits > 8 || shift < 0 || shift + nbits > w)
        PyErr_SetString(PyExc_ValueError, "_host_native.context_counts: bad field");
    else if ((n = approx.len / (w / 8)), check_len(&approx, n, w / 8, "approx") == 0 && (keep.len == 0 || check_len(&keep, n, 1, "keep") == 0) &&
             check_len(&counts, (Py_ssize_t)1 << nbits, 8, "counts") == 0) {
        int64_t *c = counts.buf;
        const uint8_t *k = keep.len ? keep.buf : NULL;
        uint32_t mask = (1u << nbits) - 1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; ++i)
            if (k == NULL || k[i])
                c[(load_sym(approx.buf, w, i) >> shift) & mask] += 1;
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&approx);
    PyBuffer_Release(&keep);
    PyBuffer_Release(&counts);
    return result;
}

/* ordinal_deltas(true, approx, mask, w, out): out[i] = ordinal(true[i]) - ordinal(approx[i])
 * where mask[i], else 0 (the ordinals of dtypes.bits_to_ordinal: ~magnitude where the sign
 * bit is set): the x_residuals values of section_kinds' residual choice. out: int64. */
static inline int64_t ordinal_of(uint32_t b, int w)
{
    const int64_t mag = (int64_t)(b & ((1u << (w - 1)) - 1));
    return (b >> (w - 1)) ? ~mag : mag;
}

static PyObject *ordinal_deltas(PyObject *self, PyObject *args)
{
    Py_buffer t, a, mask, out;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*y*iw*", &t, &a, &mask, &w, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = 0;
    if (w != 16 && w != 32)
        PyErr_SetString(PyExc_ValueError, "_host_native.ordinal_deltas: width must be 16 or 32");
    else if ((n = a.len / (w / 8)), check_len(&a, n, w / 8, "approx") == 0 && check_len(&t, n, w / 8, "true") == 0 &&
             check_len(&mask, n, 1, "mask") == 0 && check_len(&out, n, 8, "out") == 0) {
        const uint8_t *m = mask.buf;
        uint8_t *o = out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; ++i) {
            const int64_t d = m[i] ? ordinal_of(load_sym(t.buf, w, i), w) - ordinal_of(load_sym(a.buf, w, i), w) : 0;
            memcpy(o + 8 * i, &d, 8);
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&t);
    PyBuffer_Release(&a);
    PyBuffer_Release(&mask);
    PyBuffer_Release(&out);
    return result;
}

/* residual_sizes(approx, value, keep, w, shift, nbits, counts, sizes): for every residual
 * position (keep empty: all), counts[c] += 1 and sizes[c] += the length of zigzag(value)'s
 * varint, c its context (SPEC.md 8.4): ResidualsSection.raw_size's sums. value: int64. */
static PyObject *residual_sizes(PyObject *self, PyObject *args)
{
    Py_buffer approx, value, keep, counts, sizes;
    int w, shift, nbits;
    if (!PyArg_ParseTuple(args, "y*y*y*iiiw*w*", &approx, &value, &keep, &w, &shift, &nbits, &counts, &sizes))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = 0;
    if ((w != 16 && w != 32) || nbits < 1 || nbits > 8 || shift < 0 || shift + nbits > w)
        PyErr_SetString(PyExc_ValueError, "_host_native.residual_sizes: bad field");
    else if ((n = approx.len / (w / 8)), check_len(&approx, n, w / 8, "approx") == 0 && check_len(&value, n, 8, "value") == 0 &&
             (keep.len == 0 || check_len(&keep, n, 1, "keep") == 0) && check_len(&counts, (Py_ssize_t)1 << nbits, 8, "counts") == 0 &&
             check_len(&sizes, (Py_ssize_t)1 << nbits, 8, "sizes") == 0) {
        int64_t *c = counts.buf, *z = sizes.buf;
        const uint8_t *k = keep.len ? keep.buf : NULL;
        const uint8_t *v = value.buf;
        uint32_t mask = (1u << nbits) - 1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; ++i) {
            if (k != NULL && !k[i])
                continue;
            int64_t x;
            memcpy(&x, v + 8 * i, 8);
            const uint64_t u = ((uint64_t)x << 1) ^ (uint64_t)(x >> 63); /* zigzag */
            const uint32_t ctx = (load_sym(approx.buf, w, i) >> shift) & mask;
            c[ctx] += 1;
            z[ctx] += 1 + top_bit(u | 1) / 7;
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&approx);
    PyBuffer_Release(&value);
    PyBuffer_Release(&keep);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&sizes);
    return result;
}

/* the checks of varint.decode_varints: exactly `count` varints filling the bytes, none longer
 * than 10 bytes, none 2^64 or more */
static int varints_ok(const uint8_t *b, size_t len, uint64_t count)
{
    uint64_t seen = 0;
    size_t run = 0;
    for (size_t i = 0; i < len; ++i) {
        run += 1;
        if (b[i] & 0x80)
            continue;
        if (run > 10)
            return RES_LONG;
        if (run == 10 && b[i] > 1)
            return RES_BIG;
        seen += 1;
        run = 0;
    }
    if (run != 0 || seen != count)
        return RES_COUNT;
    return RES_OK;
}

static PyObject *check_varints(PyObject *self, PyObject *args)
{
    Py_buffer raw;
    unsigned long long count;
    if (!PyArg_ParseTuple(args, "y*K", &raw, &count))
        return NULL;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = varints_ok(raw.buf, (size_t)raw.len, count);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&raw);
    return PyLong_FromLong(err);
}

/* the next varint before `end` (check_varints has checked that it ends there and has at
 * most 10 bytes; a stream that was not checked stops at `end`) */
static inline uint64_t next_varint(const uint8_t **p, const uint8_t *end)
{
    uint64_t v = 0;
    unsigned k = 0;
    const uint8_t *q = *p;
    while (q < end && k < 10) {
        uint8_t byte = *q++;
        v |= (uint64_t)(byte & 0x7F) << (7 * k);
        if (!(byte & 0x80))
            break;
        ++k;
    }
    *p = q;
    return v;
}

/* apply_residuals(approx, base, keep, w, shift, nbits, groups, out) -> code: out[i] =
 * unord(ord(approx[i]) + r_i) at residual positions (keep[i], or all when keep is empty), the
 * r_i read in position order from the group of approx[i]'s context; base[i] elsewhere. groups:
 * a tuple of 2^nbits bytes-like objects, each already checked by check_varints against its
 * context's count (an empty one where the context does not occur). RES_RANGE: a corrected
 * ordinal out of range (nothing of `out` is then to be used). */
static PyObject *apply_residuals(PyObject *self, PyObject *args)
{
    Py_buffer approx, base, keep, out;
    int w, shift, nbits;
    PyObject *groups;
    if (!PyArg_ParseTuple(args, "y*y*y*iiiO!w*", &approx, &base, &keep, &w, &shift, &nbits, &PyTuple_Type, &groups, &out))
        return NULL;
    PyObject *result = NULL;
    Py_buffer g[256];
    Py_ssize_t ng = 0, n = 0;
    if ((w != 16 && w != 32) || nbits < 1 || nbits > 8 || shift < 0 || shift + nbits > w ||
        PyTuple_GET_SIZE(groups) != ((Py_ssize_t)1 << nbits)) {
        PyErr_SetString(PyExc_ValueError, "_host_native.apply_residuals: bad field or group count");
        goto done;
    }
    n = approx.len / (w / 8);
    if (check_len(&approx, n, w / 8, "approx") || check_len(&base, n, w / 8, "base") || check_len(&out, n, w / 8, "out") ||
        (keep.len != 0 && check_len(&keep, n, 1, "keep")))
        goto done;
    for (; ng < PyTuple_GET_SIZE(groups); ++ng)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(groups, ng), &g[ng], PyBUF_SIMPLE) < 0)
            goto done;
    const uint8_t *cur[256], *end[256];
    for (Py_ssize_t c = 0; c < ng; ++c) {
        cur[c] = g[c].buf;
        end[c] = (const uint8_t *)g[c].buf + g[c].len;
    }
    int err = RES_OK;
    const uint8_t *k = keep.len ? keep.buf : NULL;
    const uint32_t mask = (1u << nbits) - 1, sign = 1u << (w - 1);
    const int64_t lim = (int64_t)1 << (w - 1);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && err == RES_OK; ++i) {
        uint32_t a = load_sym(approx.buf, w, i), res = load_sym(base.buf, w, i);
        if (k == NULL || k[i]) {
            uint32_t c = (a >> shift) & mask;
            if (cur[c] >= end[c]) { /* fewer varints than positions: check_varints was not run */
                err = RES_COUNT;
                break;
            }
            uint64_t u = next_varint(&cur[c], end[c]);
            int64_t r = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
            int64_t o = (a & sign) ? -(int64_t)(a & (sign - 1)) - 1 : (int64_t)a;
            if (r < -(lim << 2) || r > (lim << 2)) {
                err = RES_RANGE;
                break;
            }
            int64_t t = o + r;
            if (t < -lim || t >= lim) {
                err = RES_RANGE;
                break;
            }
            res = t >= 0 ? (uint32_t)t : ((uint32_t)(-t - 1) | sign);
        }
        if (w == 16)
            st16(out.buf, i, (uint16_t)res);
        else
            st32(out.buf, i, res);
    }
    for (Py_ssize_t c = 0; c < ng && err == RES_OK; ++c)
        if (cur[c] != end[c])
            err = RES_COUNT;
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(err);
done:
    for (Py_ssize_t c = 0; c < ng; ++c)
        PyBuffer_Release(&g[c]);
    PyBuffer_Release(&approx);
    PyBuffer_Release(&base);
    PyBuffer_Release(&keep);
    PyBuffer_Release(&out);
    return result;
}

/* round_int_to(x, code, out): Appendix C's integer rounding (no NaN), for tests */
static PyObject *round_int_to(PyObject *self, PyObject *args)
{
    Py_buffer src, out;
    int code;
    if (!PyArg_ParseTuple(args, "y*iw*", &src, &code, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = src.len / 8;
    if (check_code(code) == 0 && code != F32 && check_len(&src, n, 8, "source") == 0 && check_len(&out, n, 2, "out") == 0) {
        int P = code == F16 ? 10 : 7, EW = code == F16 ? 5 : 8;
        for (Py_ssize_t i = 0; i < n; ++i)
            st16(out.buf, i, (uint16_t)round_int(f64_bits(ldf64(src.buf, i)), P, EW));
        result = Py_None;
        Py_INCREF(result);
    } else if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_host_native.round_int_to: float16 or bfloat16 only");
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

/* nonfinite(bits, code) -> (NaN count, infinity count) of bit patterns */
static PyObject *nonfinite(PyObject *self, PyObject *args)
{
    Py_buffer src;
    int code;
    if (!PyArg_ParseTuple(args, "y*i", &src, &code))
        return NULL;
    PyObject *result = NULL;
    int w = bits_of(code);
    Py_ssize_t n = src.len / (w / 8);
    if (check_code(code) == 0 && check_len(&src, n, w / 8, "source") == 0) {
        int fb = code == F16 ? 10 : code == BF16 ? 7 : 23; /* fraction bits */
        uint32_t expo = ((1u << (w - 1 - fb)) - 1) << fb, frac = (1u << fb) - 1;
        unsigned long long nan = 0, inf = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; ++i) {
            uint32_t b = load_sym(src.buf, w, i);
            if ((b & expo) == expo) {
                nan += (b & frac) != 0;
                inf += (b & frac) == 0;
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("(KK)", nan, inf);
    }
    PyBuffer_Release(&src);
    return result;
}

/* upper(x, d, out): rotation.matrix_to_block of a C-contiguous d x d float64 matrix: its
 * diagonal, then its strict upper triangle row by row. Copies only: the same bits. */
static PyObject *upper(PyObject *self, PyObject *args)
{
    Py_buffer x, out;
    Py_ssize_t d;
    if (!PyArg_ParseTuple(args, "y*nw*", &x, &d, &out))
        return NULL;
    const int ok = d >= 0 && d <= (1 << 24) && x.len == d * d * 8 && out.len == d * (d + 1) / 2 * 8;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        const double *a = x.buf;
        double *o = out.buf;
        for (Py_ssize_t i = 0; i < d; ++i)
            o[i] = a[i * d + i];
        o += d;
        for (Py_ssize_t i = 0; i + 1 < d; ++i) {
            memcpy(o, a + i * d + i + 1, (size_t)(d - 1 - i) * 8);
            o += d - 1 - i;
        }
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "_host_native.upper: inconsistent arguments");
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return ok ? Py_NewRef(Py_None) : NULL;
}

/* symmetric(values, d, out): rotation.block_to_matrix, into a C-contiguous d x d float64
 * matrix: the diagonal from values[:d], the strict upper triangle row by row from the rest,
 * and the lower triangle its mirror (in 64 x 64 tiles). Copies only: the same bits. */
static PyObject *symmetric(PyObject *self, PyObject *args)
{
    Py_buffer vals, out;
    Py_ssize_t d;
    if (!PyArg_ParseTuple(args, "y*nw*", &vals, &d, &out))
        return NULL;
    const int ok = d >= 0 && d <= (1 << 24) && vals.len == d * (d + 1) / 2 * 8 && out.len == d * d * 8;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        const uint8_t *v = vals.buf; /* bytes: either buffer may start at any byte */
        uint8_t *x = out.buf;
        const uint8_t *row = v + 8 * d;
        for (Py_ssize_t i = 0; i < d; ++i) {
            memcpy(x + 8 * (i * d + i), v + 8 * i, 8);
            memcpy(x + 8 * (i * d + i + 1), row, (size_t)(d - 1 - i) * 8);
            row += 8 * (d - 1 - i);
        }
        enum { T = 64 };
        for (Py_ssize_t bi = 0; bi < d; bi += T)
            for (Py_ssize_t bj = bi; bj < d; bj += T)
                for (Py_ssize_t i = bi; i < bi + T && i < d; ++i)
                    for (Py_ssize_t j = (bj > i + 1 ? bj : i + 1); j < bj + T && j < d; ++j)
                        memcpy(x + 8 * (j * d + i), x + 8 * (i * d + j), 8);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "_host_native.symmetric: inconsistent arguments");
    }
    PyBuffer_Release(&vals);
    PyBuffer_Release(&out);
    return ok ? Py_NewRef(Py_None) : NULL;
}

/* all_finite(x) -> whether every float64 of x is finite (its exponent field not all ones). */
static PyObject *all_finite(PyObject *self, PyObject *args)
{
    Py_buffer x;
    if (!PyArg_ParseTuple(args, "y*", &x))
        return NULL;
    const Py_ssize_t n = x.len / 8;
    uint64_t any = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint64_t expo = 0x7FF0000000000000ull;
    const unsigned char *p = x.buf;
    for (Py_ssize_t i = 0; i < n && !any; i += 4096) { /* in runs, so the inner loop vectorises */
        const Py_ssize_t end = n - i < 4096 ? n : i + 4096;
        for (Py_ssize_t k = i; k < end; ++k) {
            uint64_t b;
            memcpy(&b, p + 8 * k, 8);
            any |= (uint64_t)((b & expo) == expo);
        }
    }
    Py_END_ALLOW_THREADS
    const int bad = x.len % 8 != 0;
    PyBuffer_Release(&x);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "_host_native.all_finite: not float64");
        return NULL;
    }
    return PyBool_FromLong(!any);
}

static PyMethodDef methods[] = {
    {"upper", upper, METH_VARARGS, "upper(x, d, out): the diagonal, then the strict upper triangle row by row."},
    {"symmetric", symmetric, METH_VARARGS, "symmetric(values, d, out): upper's inverse, the symmetric d x d matrix."},
    {"ordinal_deltas", ordinal_deltas, METH_VARARGS, "ordinal_deltas(true, approx, mask, w, out): ordinal differences where mask, else 0."},
    {"residual_sizes", residual_sizes, METH_VARARGS, "residual_sizes(approx, value, keep, w, shift, nbits, counts, sizes): per-context positions and varint bytes."},
    {"all_finite", all_finite, METH_VARARGS, "all_finite(x) -> whether every float64 of x is finite."},
    {"nonfinite", nonfinite, METH_VARARGS, "nonfinite(bits, code) -> (NaN count, infinity count)."},
    {"map", map, METH_VARARGS, "map(kind, src, code, out, delta=0, simd=1): widen (0), round (1), distance (2) or in_band (3), per value; "
                                     "simd=0: no AVX2 loops (tests)."},
    {"round_int_to", round_int_to, METH_VARARGS, "round_int_to(x, code, out): SPEC.md Appendix C's integer rounding (tests)."},
    {"min_distance", min_distance, METH_VARARGS, "min_distance(x, code, skip, simd=1): band.min_distance."},
    {"context_counts", context_counts, METH_VARARGS, "context_counts(approx, w, shift, nbits, keep, counts): SPEC.md 8.4 counts."},
    {"check_varints", check_varints, METH_VARARGS, "check_varints(raw, count) -> 0, or why varint.decode_varints refuses raw."},
    {"apply_residuals", apply_residuals, METH_VARARGS, "apply_residuals(approx, base, keep, w, shift, nbits, groups, out) -> 0 or an error."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_host_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__host_native(void)
{
    has_avx2 = cpu_has_avx2() != 0;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "SIMD", has_avx2) < 0 || PyModule_AddIntConstant(m, "ABI", ABI) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
