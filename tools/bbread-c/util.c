/* Support code: tracked allocator, CRC32C, SHA-256, UTF-8 and JSON checks,
   varints, zstd frames, float rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "bbread.h"

/* ------------------------------------------------------------------ allocator */

typedef union hdr {
    struct {
        union hdr *prev, *next;
        uint64_t size;
    } h;
    long double align_ld;
    void *align_p;
    uint64_t align_u;
} hdr;

static hdr *live;        /* list of live blocks */
static uint64_t in_use;  /* bytes */

void *xalloc(uint64_t size, const char *limit_code)
{
    hdr *b;
    if (size > BB_MEM_BUDGET || in_use > BB_MEM_BUDGET - size)
        fail(limit_code, "needs %llu more bytes, over the reader's memory budget", (unsigned long long)size);
    b = malloc(sizeof(hdr) + (size_t)size);
    if (b == NULL) fail(limit_code, "out of memory allocating %llu bytes", (unsigned long long)size);
    b->h.size = size;
    b->h.prev = NULL;
    b->h.next = live;
    if (live) live->h.prev = b;
    live = b;
    in_use += size;
    return b + 1;
}

void xfree(void *p)
{
    hdr *b;
    if (p == NULL) return;
    b = (hdr *)p - 1;
    if (b->h.prev) b->h.prev->h.next = b->h.next;
    else live = b->h.next;
    if (b->h.next) b->h.next->h.prev = b->h.prev;
    in_use -= b->h.size;
    free(b);
}

void xfree_all(void)
{
    while (live) xfree(live + 1);
}

/* ------------------------------------------------------------------ CRC32C */

static uint32_t crc_table[256];
static int crc_ready;

uint32_t crc32c_update(uint32_t c, const uint8_t *p, size_t n)
{
    size_t i;
    if (!crc_ready) {
        uint32_t b, k;
        for (b = 0; b < 256; b++) {
            uint32_t v = b;
            for (k = 0; k < 8; k++) v = (v >> 1) ^ ((v & 1) ? 0x82F63B78u : 0);
            crc_table[b] = v;
        }
        crc_ready = 1;
    }
    for (i = 0; i < n; i++) c = (c >> 8) ^ crc_table[(c ^ p[i]) & 0xFF];
    return c;
}

uint32_t crc32c(const uint8_t *p, size_t n) { return crc32c_final(crc32c_update(CRC32C_INIT, p, n)); }

/* ------------------------------------------------------------------ SHA-256 */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8) | p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; k = h[7];
    for (i = 0; i < 64; i++) {
        t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void sha256_init(sha256_ctx *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->len = 0;
    c->nbuf = 0;
}

void sha256_update(sha256_ctx *c, const uint8_t *p, size_t n)
{
    c->len += n;
    if (c->nbuf) {
        size_t take = 64 - c->nbuf < n ? 64 - c->nbuf : n;
        memcpy(c->buf + c->nbuf, p, take);
        c->nbuf += take; p += take; n -= take;
        if (c->nbuf < 64) return;
        sha256_block(c->h, c->buf);
        c->nbuf = 0;
    }
    while (n >= 64) { sha256_block(c->h, p); p += 64; n -= 64; }
    if (n) { memcpy(c->buf, p, n); c->nbuf = n; }
}

void sha256_final(sha256_ctx *c, uint8_t out[32])
{
    uint64_t bits = c->len * 8;
    uint8_t pad[72];
    size_t padlen = (c->nbuf < 56) ? 56 - c->nbuf : 120 - c->nbuf;
    int i;
    memset(pad, 0, sizeof pad);
    pad[0] = 0x80;
    for (i = 0; i < 8; i++) pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, pad, padlen + 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24); out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8); out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

/* ------------------------------------------------------------------ UTF-8 */

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF), like Python's decoder. */
int utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        size_t k, len;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (n - i < len) return 0;
        for (k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return 0; /* overlong */
        if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
        if (cp > 0x10FFFF) return 0;
        i += len;
    }
    return 1;
}

/* ------------------------------------------------------------------ JSON */

/* RFC 8259 syntax check (plus NaN, Infinity, -Infinity, which Python's json module
   accepts and SPEC.md 11.4 lets a reader accept). Iterative; nesting deeper than
   512 is rejected (SPEC.md 4.1). */
static size_t ws(const uint8_t *p, size_t n, size_t i)
{
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
    return i;
}

static int is_hex(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static int is_dig(uint8_t c) { return c >= '0' && c <= '9'; }

/* returns index after the string, or 0 on error; p[i] == '"' */
static size_t json_string(const uint8_t *p, size_t n, size_t i)
{
    i++;
    while (i < n) {
        uint8_t c = p[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (i + 1 >= n) return 0;
            c = p[i + 1];
            if (c == 'u') {
                int k;
                if (n - i < 6) return 0;
                for (k = 2; k < 6; k++)
                    if (!is_hex(p[i + k])) return 0;
                i += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
                i += 2;
            } else return 0;
        } else i++;
    }
    return 0;
}

static int lit(const uint8_t *p, size_t n, size_t i, const char *s)
{
    size_t l = strlen(s);
    return n - i >= l && memcmp(p + i, s, l) == 0;
}

#define JSON_MAX_INT_DIGITS 4300

/* scalar (non-container) value at p[i]; returns index after it or 0 */
static size_t json_scalar(const uint8_t *p, size_t n, size_t i)
{
    uint8_t c = p[i];
    if (c == '"') return json_string(p, n, i);
    if (lit(p, n, i, "true")) return i + 4;
    if (lit(p, n, i, "false")) return i + 5;
    if (lit(p, n, i, "null")) return i + 4;
    if (lit(p, n, i, "NaN")) return i + 3;
    if (lit(p, n, i, "Infinity")) return i + 8;
    if (lit(p, n, i, "-Infinity")) return i + 9;
    size_t start, intdigits;
    int integer = 1;
    if (c == '-') i++;
    if (i >= n || !is_dig(p[i])) return 0;
    start = i;
    if (p[i] == '0') i++;
    else while (i < n && is_dig(p[i])) i++;
    intdigits = i - start;
    if (i < n && (p[i] == '.' || p[i] == 'e' || p[i] == 'E')) integer = 0;
    /* SPEC.md 4.1: like the reference, reject integers of more than 4300 digits */
    if (integer && intdigits > JSON_MAX_INT_DIGITS) return 0;
    if (i < n && p[i] == '.') {
        i++;
        if (i >= n || !is_dig(p[i])) return 0;
        while (i < n && is_dig(p[i])) i++;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-')) i++;
        if (i >= n || !is_dig(p[i])) return 0;
        while (i < n && is_dig(p[i])) i++;
    }
    return i;
}

#define JSON_MAX_DEPTH 512

int json_is_object(const uint8_t *p, size_t n)
{
    /* stack of open containers: '{' or '[' ; size bounded by n */
    uint8_t *st;
    size_t depth = 0, i;
    int ok = 0;
    i = ws(p, n, 0);
    if (i >= n || p[i] != '{') return 0;
    st = xalloc(n, "E_LIMIT_METADATA");
    /* state machine */
    st[depth++] = '{';
    i++;
    for (;;) {
        /* just after an opening bracket: allow an immediate close */
        uint8_t top = st[depth - 1];
        i = ws(p, n, i);
        if (i >= n) goto out;
        if ((top == '{' && p[i] == '}') || (top == '[' && p[i] == ']')) {
            i++;
            depth--;
            goto after_value;
        }
        for (;;) {
            /* parse one member (object) or element (array) */
            top = st[depth - 1];
            if (top == '{') {
                if (i >= n || p[i] != '"') goto out;
                i = json_string(p, n, i);
                if (!i) goto out;
                i = ws(p, n, i);
                if (i >= n || p[i] != ':') goto out;
                i = ws(p, n, i + 1);
            }
            if (i >= n) goto out;
            if (p[i] == '{' || p[i] == '[') {
                if (depth >= JSON_MAX_DEPTH) goto out; /* SPEC.md 4.1 */
                st[depth++] = p[i];
                i++;
                break; /* to the outer loop: new container */
            }
            i = json_scalar(p, n, i);
            if (!i) goto out;
        after_value:
            if (depth == 0) {
                i = ws(p, n, i);
                ok = (i == n);
                goto out;
            }
            i = ws(p, n, i);
            if (i >= n) goto out;
            top = st[depth - 1];
            if (p[i] == ',') {
                i = ws(p, n, i + 1);
                continue;
            }
            if ((top == '{' && p[i] == '}') || (top == '[' && p[i] == ']')) {
                i++;
                depth--;
                goto after_value;
            }
            goto out;
        }
    }
out:
    xfree(st);
    return ok;
}

/* ------------------------------------------------------------------ varint */

size_t varint_read(const uint8_t *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    size_t i;
    for (i = 0; i < n && i < 10; i++) {
        uint8_t b = p[i];
        if (i == 9 && (b & 0x7F) > 1) return 0; /* value >= 2^64 */
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return i + 1;
        }
    }
    return 0; /* unterminated or longer than 10 bytes */
}

/* ------------------------------------------------------------------ payload cursor */

uint64_t pc_varint(pcur_t *c, const char *what)
{
    uint64_t v;
    size_t u = varint_read(c->s + c->pos, (size_t)(c->len - c->pos), &v);
    if (!u) fail("E_SECTION_CONTENT", "%s: %s is not a complete varint", c->name, what);
    c->pos += u;
    return v;
}

uint8_t pc_u8(pcur_t *c, const char *what)
{
    if (c->pos >= c->len) fail("E_SECTION_CONTENT", "%s: %s is missing", c->name, what);
    return c->s[c->pos++];
}

/* Checked in 8.6's order: L complete -> codec byte present -> L <= bytes left -> codec value
   -> raw: L = G / zstd: header, content size = G, one frame, decompression. */
const uint8_t *pc_group(pcur_t *c, uint64_t G, int *owned, const char *what)
{
    uint64_t L = pc_varint(c, "group length"), fcs, got;
    uint8_t codec = pc_u8(c, "group codec");
    const uint8_t *data;
    uint8_t *out;
    if (L > c->len - c->pos) fail("E_SECTION_CONTENT", "%s: %s group runs past the section", c->name, what);
    data = c->s + c->pos;
    c->pos += L;
    *owned = 0;
    if (codec > 1) fail("E_CODEC", "%s: %s group codec %u", c->name, what, codec);
    if (codec == 0) {
        if (L != G) fail("E_SECTION_SIZE", "%s: raw %s group of %llu bytes, %llu expected", c->name, what,
                         (unsigned long long)L, (unsigned long long)G);
        return data;
    }
    fcs = zstd_declared_size(data, (size_t)L);
    if (fcs != G) fail("E_SECTION_SIZE", "%s: zstd %s group does not declare %llu bytes", c->name, what, (unsigned long long)G);
    out = zstd_decode(data, (size_t)L, G, &got, "E_LIMIT_SECTION");
    if (got != G) fail("E_ZSTD", "%s: zstd %s group decoded to another size", c->name, what);
    *owned = 1;
    return out;
}

uint64_t pc_segments(pcur_t *c, uint64_t P, uint64_t **n, uint64_t **r, uint8_t **K)
{
    uint64_t S, j, covered = 0;
    S = pc_varint(c, "segment count");
    if (S > 65536) fail("E_LIMIT_COUNT", "%s: %llu segments, at most 65536", c->name, (unsigned long long)S);
    if (S == 0 || S > P) fail("E_SECTION_CONTENT", "%s: %llu segments for %llu symbols", c->name, (unsigned long long)S, (unsigned long long)P);
    *n = xalloc(S * sizeof **n, "E_LIMIT_COUNT");
    *r = xalloc(S * sizeof **r, "E_LIMIT_COUNT");
    *K = xalloc(S, "E_LIMIT_COUNT");
    for (j = 0; j < S; j++) {
        uint64_t nj = pc_varint(c, "segment length"), rj = pc_varint(c, "row length");
        uint8_t kj = pc_u8(c, "class count");
        if (nj < 1 || nj > P - covered) fail("E_SECTION_CONTENT", "%s: segment %llu length out of range", c->name, (unsigned long long)j);
        if (rj < 1 || rj > nj) fail("E_SECTION_CONTENT", "%s: segment %llu row length out of range", c->name, (unsigned long long)j);
        if (kj < 1 || kj > 16) fail("E_SECTION_CONTENT", "%s: segment %llu has %u classes", c->name, (unsigned long long)j, kj);
        covered += nj;
        (*n)[j] = nj;
        (*r)[j] = rj;
        (*K)[j] = kj;
    }
    if (covered != P) fail("E_SECTION_CONTENT", "%s: segments cover %llu of %llu symbols", c->name, (unsigned long long)covered, (unsigned long long)P);
    return S;
}

/* ------------------------------------------------------------------ zstd */

static int zstd_magic_ok(const uint8_t *src, size_t n)
{
    return n >= 4 && ld32(src) == 0xFD2FB528u; /* RFC 8878 frame; skippable/legacy rejected */
}

uint64_t zstd_declared_size(const uint8_t *src, size_t n)
{
    unsigned long long fcs;
    if (!zstd_magic_ok(src, n)) fail("E_ZSTD", "not a zstd frame (bad or skippable magic)");
    fcs = ZSTD_getFrameContentSize(src, n);
    if (fcs == ZSTD_CONTENTSIZE_ERROR) fail("E_ZSTD", "zstd frame header cannot be parsed");
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN) return UINT64_MAX;
    return (uint64_t)fcs;
}

/* src[0..n) is exactly one frame (RFC 8878), no bytes after it; else E_ZSTD */
static void zstd_one_frame(const uint8_t *src, size_t n)
{
    size_t fsz;
    if (!zstd_magic_ok(src, n)) fail("E_ZSTD", "not a zstd frame");
    fsz = ZSTD_findFrameCompressedSize(src, n);
    if (ZSTD_isError(fsz)) fail("E_ZSTD", "damaged zstd frame (%s)", ZSTD_getErrorName(fsz));
    if (fsz != n) fail("E_ZSTD", "bytes after the zstd frame");
}

/* decompresses the frame into dst[0..cap), bounded by cap; returns the size */
static uint64_t zstd_into(const uint8_t *src, size_t n, uint8_t *dst, uint64_t cap)
{
    size_t r = ZSTD_decompress(dst, (size_t)cap, src, n);
    if (ZSTD_isError(r)) fail("E_ZSTD", "zstd decompression failed (%s)", ZSTD_getErrorName(r));
    return r;
}

uint8_t *zstd_decode(const uint8_t *src, size_t n, uint64_t cap, uint64_t *got, const char *limit_code)
{
    uint8_t *dst;
    zstd_one_frame(src, n);
    if (cap > (uint64_t)SIZE_MAX - 64) fail(limit_code, "decoded size too large");
    dst = xalloc(cap ? cap : 1, limit_code);
    *got = zstd_into(src, n, dst, cap);
    return dst;
}

uint64_t zstd_decode_into(const uint8_t *src, size_t n, uint8_t *dst, uint64_t cap)
{
    zstd_one_frame(src, n);
    return zstd_into(src, n, dst, cap);
}

/* ------------------------------------------------------------------ dtypes */

/* SPEC.md 6.1, codes 1-15: name and width */
static const struct { const char *name; int bits; } DTYPES[DT_LAST + 1] = {
    {"", 0}, {"float16", 16}, {"bfloat16", 16}, {"float32", 32}, {"float64", 64}, {"int8", 8}, {"uint8", 8},
    {"int16", 16}, {"uint16", 16}, {"int32", 32}, {"uint32", 32}, {"int64", 64}, {"uint64", 64}, {"bool", 8},
    {"float8_e4m3fn", 8}, {"float8_e5m2", 8},
};

int dtype_bits(int code)
{
    if (code < DT_F16 || code > DT_LAST) return 0;
    if (code > DT_F32 && !(bb_required_flags & BB_FLAG_DTYPES)) return 0;
    return DTYPES[code].bits;
}

int dtype_is_float(int code) { return code >= DT_F16 && code <= DT_F32; }

const char *dtype_name(int code)
{
    return dtype_bits(code) ? DTYPES[code].name : "";
}

void dtype_exp_field(int code, int *shift, int *width)
{
    if (code == DT_F16) { *shift = 10; *width = 5; }
    else if (code == DT_BF16) { *shift = 7; *width = 8; }
    else { *shift = 23; *width = 8; }
}

static double f32_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return (double)f;
}

double dtype_to_f64(int code, uint32_t b)
{
    if (code == DT_F32) return f32_bits(b);
    if (code == DT_BF16) return f32_bits(b << 16);
    {
        /* float16 -> float64, exact */
        uint32_t s = (b >> 15) & 1, e = (b >> 10) & 0x1F, f = b & 0x3FF;
        uint64_t o;
        double d;
        if (e == 0x1F) {
            o = ((uint64_t)s << 63) | ((uint64_t)0x7FF << 52) | ((uint64_t)f << 42);
        } else if (e == 0) {
            if (f == 0) o = (uint64_t)s << 63;
            else {
                /* subnormal: value f * 2^-24; normalise */
                int sh = 0;
                while (!(f & 0x400)) { f <<= 1; sh++; }
                f &= 0x3FF;
                o = ((uint64_t)s << 63) | ((uint64_t)(1023 - 15 + 1 - sh) << 52) | ((uint64_t)f << 42);
            }
        } else {
            o = ((uint64_t)s << 63) | ((uint64_t)(e - 15 + 1023) << 52) | ((uint64_t)f << 42);
        }
        memcpy(&d, &o, 8);
        return d;
    }
}

/* SPEC.md 9 item 7: the distance of x from the nearest rounding boundary of dtype `code` (a
   midpoint between neighbouring values, 0 between -0 and +0, the overflow threshold); 0 when x
   is not finite or rounds to an infinity. Neighbours step through the values' order: ordinal
   o = magnitude for a positive pattern, -magnitude - 1 for a negative one. */
double boundary_distance(double x, int code)
{
    const int w = dtype_bits(code);
    const int64_t sign = (int64_t)1 << (w - 1);
    const uint32_t b = round_to_dtype(x, code);
    const int64_t mag = (int64_t)(b & (uint32_t)(sign - 1)), o = (b & (uint32_t)sign) ? -mag - 1 : mag;
    const int64_t od = o - 1 < -sign ? -sign : o - 1, ou = o + 1 > sign - 1 ? sign - 1 : o + 1;
    const uint32_t bd = (uint32_t)(od < 0 ? ((-od - 1) | sign) : od), bu = (uint32_t)(ou < 0 ? ((-ou - 1) | sign) : ou);
    const double v = dtype_to_f64(code, b), down = dtype_to_f64(code, bd), up = dtype_to_f64(code, bu);
    const double lo = isinf(down) ? v - (up - v) / 2 : (v + down) / 2, hi = isinf(up) ? v + (v - down) / 2 : (v + up) / 2;
    const double d = fmin(x - lo, hi - x);
    return (isfinite(x) && isfinite(v) && isfinite(d)) ? fabs(d) : 0.0;
}

/* SPEC.md 7.4 / Appendix C: round float64 directly to the dtype, ties to even. */
uint32_t round_to_dtype(double x, int code)
{
    int P = code == DT_F16 ? 10 : code == DT_BF16 ? 7 : 23;
    int EW = code == DT_F16 ? 5 : 8;
    uint64_t xb, f, m, r;
    uint32_t s, inf;
    int e, q, bias, E, Q, shift, bl, biased;
    memcpy(&xb, &x, 8);
    s = (uint32_t)(xb >> 63) << (P + EW);
    e = (int)((xb >> 52) & 0x7FF);
    f = xb & (((uint64_t)1 << 52) - 1);
    inf = s | ((((uint32_t)1 << EW) - 1) << P);
    if (e == 0x7FF) {
        if (f == 0) return inf;
        if (code == DT_BF16) return 0x7FC0;
        if (code == DT_F16) {
            uint32_t fr = (uint32_t)(f >> 42);
            return s | 0x7C00 | (fr ? fr : 1);
        }
        return s | 0x7FC00000u | (uint32_t)(f >> 29);
    }
    if (e == 0 && f == 0) return s;
    if (e == 0) { m = f; q = -1074; }
    else { m = f | ((uint64_t)1 << 52); q = e - 1075; }
    bias = (1 << (EW - 1)) - 1;
    bl = 0;
    while (bl < 64 && (m >> bl)) bl++;
    E = q + bl - 1;
    Q = (E > 1 - bias ? E : 1 - bias) - P;
    shift = Q - q; /* >= 29 */
    if (shift >= 64) {
        r = 0; /* m < 2^53 < half: rounds to zero */
    } else {
        uint64_t rem, half;
        r = m >> shift;
        rem = m - (r << shift);
        half = (uint64_t)1 << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
    }
    if (r == (uint64_t)1 << (P + 1)) { r >>= 1; Q++; }
    if (r < ((uint64_t)1 << P)) return s | (uint32_t)r;
    biased = Q + P + bias;
    if (biased >= (1 << EW) - 1) return inf;
    return s | ((uint32_t)biased << P) | (uint32_t)(r - ((uint64_t)1 << P));
}
