/* Chunk verification and decoding: SPEC.md 5, 6, 7, 8 (check order of 11.3 item 2). */
#include <math.h>
#include <string.h>

#include <lapacke.h>

#include "bbread.h"

#define K_PAYLOAD 1
#define K_SIGNS 2
#define K_XRES 3
#define K_XPAT 4
#define K_APAT 5
#define K_BAND 6 /* 1.4, with BANDS (8.8) */

#define F_PLAIN 1
#define F_PAPER 2

typedef struct {
    uint32_t D, anchor;
    uint8_t axis, flags;
    int has[7];                /* section present, by kind */
    const uint8_t *sec[7];     /* decoded bytes, by kind */
    uint64_t seclen[7];
    int owned[7];              /* sec[kind] was allocated (zstd) */
    uint32_t op_pos;           /* position of its SITE op */
} site_t;

typedef struct {
    uint8_t kind;
    uint32_t index;
} op_t;

/* ------------------------------------------------------------ descriptor cursor */

typedef struct {
    const uint8_t *p, *end;
} cur_t;

static const uint8_t *take(cur_t *c, size_t n)
{
    const uint8_t *r = c->p;
    if ((size_t)(c->end - c->p) < n) fail("E_DESCRIPTOR", "descriptor record runs past descriptor_length");
    c->p += n;
    return r;
}
static uint8_t rd8(cur_t *c) { return *take(c, 1); }
static uint16_t rd16(cur_t *c) { return ld16(take(c, 2)); }
static uint32_t rd32(cur_t *c) { return ld32(take(c, 4)); }
static uint64_t rd64(cur_t *c) { return ld64(take(c, 8)); }

static const uint8_t *rdname(cur_t *c, uint16_t *len, const char *what)
{
    uint16_t l = rd16(c);
    const uint8_t *s = take(c, l);
    if (!utf8_valid(s, l)) fail("E_DESCRIPTOR", "%s name is not valid UTF-8", what);
    *len = l;
    return s;
}

/* ------------------------------------------------------------ name set */

typedef struct {
    const tensor_t **slot;
    uint64_t mask;
} nameset_t;

static uint64_t name_hash(const uint8_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ULL; }
    return h;
}

/* returns 1 if already present, else inserts */
static int nameset_add(nameset_t *ns, const tensor_t *t)
{
    uint64_t i = name_hash(t->name, t->nlen) & ns->mask;
    while (ns->slot[i]) {
        const tensor_t *o = ns->slot[i];
        if (o->nlen == t->nlen && memcmp(o->name, t->name, t->nlen) == 0) return 1;
        i = (i + 1) & ns->mask;
    }
    ns->slot[i] = t;
    return 0;
}

/* ------------------------------------------------------------ helpers */

static uint64_t n_of(uint64_t D) { return D * (D + 1) / 2; }

static uint32_t ldsym(const uint8_t *p, int W) { return W == 16 ? ld16(p) : ld32(p); }
static void stsym(uint8_t *p, uint32_t v, int W)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8);
    if (W == 32) { p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24); }
}

static int64_t ord_of(uint32_t b, int W)
{
    uint32_t sign = (uint32_t)1 << (W - 1);
    if (!(b & sign)) return (int64_t)b;
    return -(int64_t)(b & (sign - 1)) - 1;
}
static uint32_t unord(int64_t o, int W)
{
    if (o >= 0) return (uint32_t)o;
    return (uint32_t)(-o - 1) | ((uint32_t)1 << (W - 1));
}

/* Section 8.5: parse a patch section for N values of v bits; apply to dst
   (element j at dst + j*v/8, little-endian). If mask is not NULL (N bytes, zeroed by the
   caller), mask[p] is set to 1 for every patched position p. dst NULL: the positions are only
   marked (and the section checked). */
static void apply_patches(const uint8_t *s, uint64_t len, uint64_t N, int v, uint8_t *dst, uint8_t *mask, const char *what)
{
    uint64_t count, vb = (uint64_t)v / 8, rest, gaps_end, pos, p = 0, j;
    size_t used = varint_read(s, len, &count);
    if (!used) fail("E_SECTION_CONTENT", "%s: malformed count varint", what);
    rest = len - used;
    if (count > N) fail("E_SECTION_CONTENT", "%s: count %llu exceeds %llu values", what, (unsigned long long)count, (unsigned long long)N);
    if (count > rest / vb) fail("E_SECTION_CONTENT", "%s: patch values do not fit", what);
    gaps_end = len - count * vb;
    pos = used;
    for (j = 0; j < count; j++) {
        uint64_t gap;
        size_t u = varint_read(s + pos, (size_t)(gaps_end - pos), &gap);
        if (!u) fail("E_SECTION_CONTENT", "%s: malformed gap varint", what);
        pos += u;
        if (j == 0) {
            if (gap >= N) fail("E_SECTION_CONTENT", "%s: patch position out of range", what);
            p = gap;
        } else {
            /* p_j = p_(j-1) + gap + 1 < N */
            if (gap >= N - p - 1) fail("E_SECTION_CONTENT", "%s: patch position out of range", what);
            p = p + gap + 1;
        }
        if (dst) memcpy(dst + p * vb, s + gaps_end + j * vb, (size_t)vb);
        if (mask) mask[p] = 1;
    }
    if (pos != gaps_end) fail("E_SECTION_CONTENT", "%s: gap varints do not fill their bytes", what);
}

/* Section 8.4: residuals over the n block symbols approx[] (W-bit, in blk). The residual
   positions are those i with !patched[i] (patched = NULL: every position, as in 1.0/1.1);
   contexts, their counts and the groups are taken over residual positions only. */
static void apply_residuals(const uint8_t *s, uint64_t len, uint8_t *blk, uint64_t n, const uint8_t *patched, int sym_dtype, int W)
{
    int shift, width;
    uint64_t counts[256], starts[256], i, pos = 0;
    uint32_t *order;
    uint8_t *ctx;
    unsigned c, nctx;
    dtype_exp_field(sym_dtype, &shift, &width);
    nctx = 1u << width;
    memset(counts, 0, sizeof counts);
    ctx = xalloc(n ? n : 1, "E_LIMIT_TENSOR");
    order = xalloc((n ? n : 1) * sizeof(uint32_t), "E_LIMIT_TENSOR");
    for (i = 0; i < n; i++) {
        uint32_t b = ldsym(blk + i * (W / 8), W);
        ctx[i] = (uint8_t)((b >> shift) & (nctx - 1));
        if (!patched || !patched[i]) counts[ctx[i]]++;
    }
    starts[0] = 0;
    for (c = 1; c < nctx; c++) starts[c] = starts[c - 1] + counts[c - 1];
    for (i = 0; i < n; i++)
        if (!patched || !patched[i]) order[starts[ctx[i]]++] = (uint32_t)i;
    for (c = 0; c < nctx; c++) starts[c] -= counts[c];
    /* 8.4: with DIGESTS, groups read against this reader's contexts (some residual position)
       that do not fit are E_DIGEST; with no residual position no value is involved */
    for (c = 0, i = 0; c < nctx; c++) i += counts[c];
    fail_numerics_scope((bb_required_flags & BB_FLAG_DIGESTS) && i > 0);

    for (c = 0; c < nctx; c++) {
        uint64_t L, G, maxG, k, gpos = 0, got;
        size_t u;
        uint8_t codec;
        const uint8_t *data, *g;
        uint8_t *gbuf = NULL;
        if (!counts[c]) continue;
        u = varint_read(s + pos, (size_t)(len - pos), &L);
        if (!u) fail("E_SECTION_CONTENT", "x_residuals: malformed group length");
        pos += u;
        if (pos >= len) fail("E_SECTION_CONTENT", "x_residuals: group header runs past the section");
        codec = s[pos++];
        if (L > len - pos) fail("E_SECTION_CONTENT", "x_residuals: group data runs past the section");
        if (codec > 1) fail("E_CODEC", "x_residuals: group codec %u", codec);
        data = s + pos;
        pos += L;
        maxG = counts[c] * (W == 16 ? 3 : 5);
        if (codec == 0) {
            G = L;
            if (G > maxG) fail("E_LIMIT_SECTION", "x_residuals: group of %llu bytes over its limit", (unsigned long long)G);
            g = data;
        } else {
            G = zstd_declared_size(data, (size_t)L);
            if (G > maxG) fail("E_LIMIT_SECTION", "x_residuals: group declares %llu bytes, over its limit", (unsigned long long)G);
            gbuf = zstd_decode(data, (size_t)L, G, &got, "E_LIMIT_SECTION");
            if (got != G) fail("E_ZSTD", "x_residuals: group decoded to %llu bytes, not %llu", (unsigned long long)got, (unsigned long long)G);
            g = gbuf;
        }
        for (k = 0; k < counts[c]; k++) {
            uint64_t uu, idx = order[starts[c] + k];
            int64_t r, o, lo, hi;
            size_t used = varint_read(g + gpos, (size_t)(G - gpos), &uu);
            if (!used) fail("E_SECTION_CONTENT", "x_residuals: malformed or missing residual varint");
            gpos += used;
            r = (int64_t)(uu >> 1) ^ -(int64_t)(uu & 1);
            o = ord_of(ldsym(blk + idx * (W / 8), W), W);
            lo = -((int64_t)1 << (W - 1)) - o;
            hi = (((int64_t)1 << (W - 1)) - 1) - o;
            if (r < lo || r > hi) fail("E_SECTION_CONTENT", "x_residuals: corrected ordinal out of range");
            stsym(blk + idx * (W / 8), unord(o + r, W), W);
        }
        if (gpos != G) fail("E_SECTION_CONTENT", "x_residuals: left-over bytes in a group");
        xfree(gbuf);
    }
    if (pos != len) fail("E_SECTION_CONTENT", "x_residuals: bytes after the last group");
    fail_numerics_scope(0);
    xfree(order);
    xfree(ctx);
}

/* ------------------------------------------------------------ planes (8.6) */

uint32_t bb_required_flags;
double bb_margin = INFINITY;
int bb_have_margin;

/* The P symbols (W-bit LE, P*W/8 bytes) of a codec-2 payload, into out (NULL: allocated). */
uint8_t *decode_planes(const uint8_t *s, uint64_t len, uint64_t P, int W, uint8_t *out)
{
    pcur_t c = {s, len, 0, "planes payload"};
    uint64_t S, j, i, mapsz = 0, pos = 0, mpos = 0, B = (uint64_t)W / 8;
    uint64_t *n, *r;
    uint8_t *K;
    const uint8_t *maps, *g;
    int mowned, owned, b;
    S = pc_segments(&c, P, &n, &r, &K);
    for (j = 0; j < S; j++)
        if (K[j] > 1) mapsz += (n[j] + r[j] - 1) / r[j] + r[j];
    maps = pc_group(&c, mapsz, &mowned, "class-map");
    if (!out) out = xalloc(P * B, "E_LIMIT_TENSOR");
    for (j = 0; j < S; j++) {
        uint8_t *top = out + pos * B + (B - 1);
        if (K[j] == 1) {
            g = pc_group(&c, n[j], &owned, "top-plane");
            for (i = 0; i < n[j]; i++) top[i * B] = g[i];
            if (owned) xfree((void *)g);
        } else {
            uint64_t rows = (n[j] + r[j] - 1) / r[j], counts[256], next[256];
            const uint8_t *rc = maps + mpos, *cc = maps + mpos + rows, *grp[256];
            int gown[256];
            unsigned k = K[j], ctx;
            mpos += rows + r[j];
            for (i = 0; i < rows; i++)
                if (rc[i] >= k) fail("E_SECTION_CONTENT", "planes payload: segment %llu row class >= %u", (unsigned long long)j, k);
            for (i = 0; i < r[j]; i++)
                if (cc[i] >= k) fail("E_SECTION_CONTENT", "planes payload: segment %llu column class >= %u", (unsigned long long)j, k);
            memset(counts, 0, sizeof counts);
            memset(next, 0, sizeof next);
            for (i = 0; i < n[j]; i++) counts[rc[i / r[j]] * k + cc[i % r[j]]]++;
            for (ctx = 0; ctx < k * k; ctx++) grp[ctx] = pc_group(&c, counts[ctx], &gown[ctx], "context");
            for (i = 0; i < n[j]; i++) {
                ctx = rc[i / r[j]] * k + cc[i % r[j]];
                top[i * B] = grp[ctx][next[ctx]++];
            }
            for (ctx = 0; ctx < k * k; ctx++)
                if (gown[ctx]) xfree((void *)grp[ctx]);
        }
        pos += n[j];
    }
    for (b = (int)B - 2; b >= 0; b--) {
        g = pc_group(&c, P, &owned, "plane");
        for (i = 0; i < P; i++) out[i * B + (uint64_t)b] = g[i];
        if (owned) xfree((void *)g);
    }
    if (c.pos != len) fail("E_SECTION_CONTENT", "planes payload: bytes after the last group");
    if (mowned) xfree((void *)maps);
    xfree(n);
    xfree(r);
    xfree(K);
    return out;
}

/* ------------------------------------------------------------ one site (7.1) */

static void decode_site(site_t *s, tensor_t *anchor, const uint8_t *mu_bytes, uint8_t *blk, int sym_dtype, int W)
{
    uint64_t D = s->D, n = n_of(D), R, outer = 1, inner = 1, o, in, r, i, j, k;
    int paper = (s->flags & F_PAPER) != 0, ab = dtype_bits(anchor->dtype), finite = 1;
    double *mu, *M, *a, *Et, *B, *lam, *row;
    /* 1.4 (band section, 8.8): the site's margin (9 item 7) from the float64 values before rounding */
    const int banded = s->has[K_BAND];
    double width[3] = {0, 0, 0}, margin = INFINITY, *xf = NULL;
    for (k = 0; banded && k < s->seclen[K_BAND] / 8; k++) {
        uint64_t bits = ld64(s->sec[K_BAND] + 8 * k);
        memcpy(&width[k], &bits, 8);
    }
    if (D > BB_MAX_EIG_DIM) fail("E_LIMIT_DIM", "site dimension %llu over this reader's eigensolver limit", (unsigned long long)D);

    mu = xalloc(D * sizeof(double), "E_LIMIT_TENSOR");
    for (j = 0; j < D; j++) {
        if (W == 16) {
            float f;
            memcpy(&f, mu_bytes + 4 * j, 4); /* little-endian host */
            mu[j] = (double)f;
        } else {
            memcpy(&mu[j], mu_bytes + 8 * j, 8);
        }
    }
    /* M = moveaxis(A, axis, -1).reshape(R, D); with 0 elements there are no rows */
    for (k = 0; k < (uint64_t)anchor->ndim && anchor->numel; k++) {
        if (k < s->axis) outer *= anchor->dims[k];
        else if (k > s->axis) inner *= anchor->dims[k];
    }
    R = anchor->numel / D;
    if (R > BB_MEM_BUDGET / 8 / D) fail("E_LIMIT_TENSOR", "anchor too large");
    M = xalloc(R * D * sizeof(double), "E_LIMIT_TENSOR");
    for (o = 0; o < (anchor->numel ? outer : 0); o++)
        for (j = 0; j < D; j++)
            for (in = 0; in < inner; in++) {
                uint64_t e = (o * D + j) * inner + in;
                const uint8_t *p = anchor->data + e * (ab / 8);
                M[(o * inner + in) * D + j] = dtype_to_f64(anchor->dtype, ab == 16 ? ld16(p) : ld32(p));
            }
    /* G = M^T M, lower triangle, column-major a[i + j*D] */
    a = xalloc(D * D * sizeof(double), "E_LIMIT_TENSOR");
    memset(a, 0, D * D * sizeof(double));
    for (r = 0; r < R; r++) {
        const double *mr = M + r * D;
        for (j = 0; j < D; j++) {
            double mj = mr[j];
            double *col = a + j * D;
            for (i = j; i < D; i++) col[i] += mr[i] * mj;
        }
    }
    for (j = 0; j < D && finite; j++)
        for (i = j; i < D; i++)
            if (!isfinite(a[i + j * D])) { finite = 0; break; }
    lam = xalloc(D * sizeof(double), "E_LIMIT_TENSOR");
    if (finite) {
        lapack_int info = LAPACKE_dsyevd(LAPACK_COL_MAJOR, 'V', 'L', (lapack_int)D, a, (lapack_int)D, lam);
        if (info == LAPACK_WORK_MEMORY_ERROR || info == LAPACK_TRANSPOSE_MEMORY_ERROR)
            fail("E_LIMIT_DIM", "eigensolver out of memory");
        if (info != 0) finite = 0;
    }
    if (!finite) {
        /* non-finite Gram matrix or no convergence: regenerated values become NaN (9.4) */
        for (i = 0; i < D * D; i++) a[i] = NAN;
    }
    /* a: column j = eigenvector j (E[i][j] = a[i + j*D]) */
    if (paper) {
        const uint8_t *bits = s->sec[K_SIGNS];
        for (j = 0; j < D; j++) {
            double sum = 0.0;
            int neg, bit = (bits[j / 8] >> (j % 8)) & 1;
            for (i = 0; i < D; i++) sum += a[i + j * D];
            if (banded) margin = fmin(margin, (isfinite(sum) ? fabs(sum) : 0.0) / width[2]); /* 9 item 7: non-finite counts as 0 */
            neg = sum < 0.0;
            if (neg != bit)
                for (i = 0; i < D; i++) a[i + j * D] = -a[i + j * D];
        }
    }
    /* X~ = E diag(mu) E^T (symmetric) or E^T diag(mu) E (paper).
       Et[r*D + j] = the j-th term factor for output row/col r:
       symmetric: E[r][j]; paper: E[j][r]. */
    Et = xalloc(D * D * sizeof(double), "E_LIMIT_TENSOR");
    B = xalloc(D * D * sizeof(double), "E_LIMIT_TENSOR");
    for (r = 0; r < D; r++)
        for (j = 0; j < D; j++) {
            double e = paper ? a[j + r * D] : a[r + j * D];
            Et[r * D + j] = e;
            B[r * D + j] = e * mu[j];
        }
    if (banded) xf = xalloc(n * sizeof(double), "E_LIMIT_TENSOR");
    {
        uint64_t idx = 0, c;
        for (r = 0; r < D; r++) { /* diagonal */
            double sum = 0.0;
            for (j = 0; j < D; j++) sum += B[r * D + j] * Et[r * D + j];
            if (xf) xf[idx] = sum;
            stsym(blk + (idx++) * (W / 8), round_to_dtype(sum, sym_dtype), W);
        }
        for (r = 0; r < D; r++) /* strict upper triangle, row-major */
            for (c = r + 1; c < D; c++) {
                double sum = 0.0;
                for (j = 0; j < D; j++) sum += B[r * D + j] * Et[c * D + j];
                if (xf) xf[idx] = sum;
                stsym(blk + (idx++) * (W / 8), round_to_dtype(sum, sym_dtype), W);
            }
    }
    xfree(B);
    xfree(Et);
    /* 7. corrections of the block. With both sections (MIXED_CORRECTIONS, 1.2) x_patches
       is decoded first and its positions are not residual positions (8.4, 11.3). */
    {
        uint8_t *patched = NULL; /* all zero: every position is a residual position, as NULL */
        if ((s->has[K_XPAT] && s->has[K_XRES]) || banded) {
            patched = xalloc(n, "E_LIMIT_TENSOR");
            memset(patched, 0, (size_t)n);
        }
        if (s->has[K_XPAT]) apply_patches(s->sec[K_XPAT], s->seclen[K_XPAT], n, W, blk, patched, "x_patches");
        if (s->has[K_XRES]) apply_residuals(s->sec[K_XRES], s->seclen[K_XRES], blk, n, patched, sym_dtype, W);
        for (i = 0; xf && i < n; i++) /* the values x_patches does not store */
            if (!patched[i]) margin = fmin(margin, boundary_distance(xf[i], sym_dtype) / width[0]);
        xfree(patched);
        xfree(xf);
    }
    /* 9. paper: un-rotate the anchor, C = M E */
    if (paper) {
        uint8_t *patched = NULL; /* banded: the positions anchor_patches stores, marked before C (9 item 7) */
        row = xalloc(D * sizeof(double), "E_LIMIT_TENSOR");
        if (banded) {
            patched = xalloc(anchor->numel ? anchor->numel : 1, "E_LIMIT_TENSOR");
            memset(patched, 0, (size_t)anchor->numel);
            if (s->has[K_APAT])
                apply_patches(s->sec[K_APAT], s->seclen[K_APAT], anchor->numel, ab, NULL, patched, "anchor_patches");
        }
        for (r = 0; r < R; r++) {
            const double *mr = M + r * D;
            uint64_t oo = r / (inner ? inner : 1), ii = r % (inner ? inner : 1);
            for (j = 0; j < D; j++) {
                const double *col = a + j * D;
                double sum = 0.0;
                for (i = 0; i < D; i++) sum += mr[i] * col[i];
                row[j] = sum;
            }
            for (j = 0; j < D; j++) {
                uint64_t e = (oo * D + j) * inner + ii;
                uint32_t v = round_to_dtype(row[j], anchor->dtype);
                if (patched && !patched[e]) margin = fmin(margin, boundary_distance(row[j], anchor->dtype) / width[1]);
                uint8_t *p = anchor->data + e * (ab / 8);
                p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8);
                if (ab == 32) { p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24); }
            }
        }
        xfree(row);
        if (s->has[K_APAT])
            apply_patches(s->sec[K_APAT], s->seclen[K_APAT], anchor->numel, ab, anchor->data, NULL, "anchor_patches");
        xfree(patched);
    }
    if (banded) {
        bb_margin = fmin(bb_margin, margin);
        bb_have_margin = 1;
    }
    xfree(lam);
    xfree(a);
    xfree(M);
    xfree(mu);
}

/* ------------------------------------------------------------ the chunk */

void process_chunk(const uint8_t *buf, uint64_t len, uint32_t ci, uint32_t entry_crc)
{
    uint32_t crc, Ld, S, T, NS, op_count, k;
    uint64_t table_end, P_W8 = 0, off;
    int64_t P;
    int sym_dtype, W, have_payload = 0;
    tensor_t *ts;
    site_t *ss;
    op_t *ops;
    uint32_t *push_pos, *push_cnt, *site_cnt;
    const uint8_t *payload = NULL;
    uint64_t payload_len = 0;
    int payload_owned = 0;
    cur_t c;
    nameset_t ns;
    uint8_t *stack;
    uint64_t h, maxh, i;

    /* ---- chunk fixed header (11.3 item 2) ---- */
    if (len < 36) fail("E_TRUNCATED", "chunk %u shorter than 36 bytes", ci);
    if (memcmp(buf, "BBCK", 4) != 0) fail("E_MAGIC", "chunk %u: bad chunk magic", ci);
    /* offset 4 is content_crc with DIGESTS (5.4), else reserved; offset 28 always reserved */
    if ((!(bb_required_flags & BB_FLAG_DIGESTS) && ld32(buf + 4) != 0) || ld32(buf + 28) != 0)
        fail("E_RESERVED", "chunk %u: reserved header field not 0", ci);
    if (ld64(buf + 8) != len) fail("E_BOUNDS", "chunk %u: chunk_length differs from its index entry", ci);
    crc = ld32(buf + len - 4);
    if (crc32c(buf, (size_t)(len - 4)) != crc) fail("E_CRC_CHUNK", "chunk %u: chunk_crc mismatch", ci);
    if (crc != entry_crc) fail("E_CRC_INDEX_ENTRY", "chunk %u: index entry crc differs from chunk_crc", ci);
    if (ld32(buf + 16) != ci) fail("E_CHUNK_ORDER", "chunk %u: chunk_index is %u", ci, ld32(buf + 16));
    Ld = ld32(buf + 20);
    S = ld32(buf + 24);
    if (Ld > (1u << 24)) fail("E_LIMIT_COUNT", "chunk %u: descriptor_length %u over 16 MiB", ci, Ld);
    if (S > (1u << 14)) fail("E_LIMIT_COUNT", "chunk %u: section_count %u over 16384", ci, S);
    table_end = 32 + (uint64_t)Ld + 32 * (uint64_t)S;
    if (table_end > len - 4) fail("E_BOUNDS", "chunk %u: descriptor and section table run past the chunk", ci);

    /* ---- descriptor (5.1) ----
       Pass 1 parses the whole structure (records within Ld, UTF-8 names, no
       left-over bytes: E_DESCRIPTOR); pass 2 checks the fields in the order of
       11.3 item 2 and fills the tables. */
    {
        uint32_t t, f, fc;
        uint16_t nl;
        c.p = buf + 32;
        c.end = buf + 32 + Ld;
        rdname(&c, &nl, "chunk");
        take(&c, 4);
        T = rd32(&c);
        for (t = 0; t < T; t++) {
            uint8_t nd;
            rdname(&c, &nl, "tensor");
            take(&c, 1);
            nd = rd8(&c);
            take(&c, 2);
            take(&c, 8 * (size_t)nd);
        }
        NS = rd32(&c);
        for (t = 0; t < NS; t++) {
            rdname(&c, &nl, "site");
            take(&c, 12);
            fc = rd32(&c);
            for (f = 0; f < fc; f++) {
                rdname(&c, &nl, "follower");
                take(&c, 2);
            }
        }
        op_count = rd32(&c);
        if ((uint64_t)(c.end - c.p) / 8 < op_count) fail("E_DESCRIPTOR", "chunk %u: descriptor record runs past descriptor_length", ci);
        take(&c, 8 * (size_t)op_count);
        if (c.p != c.end) fail("E_DESCRIPTOR", "chunk %u: %u left-over descriptor bytes", ci, (unsigned)(c.end - c.p));
    }
    c.p = buf + 32;
    c.end = buf + 32 + Ld;
    {
        uint16_t nl;
        uint8_t r1;
        uint16_t r2;
        rdname(&c, &nl, "chunk");
        sym_dtype = rd8(&c);
        r1 = rd8(&c);
        r2 = rd16(&c);
        (void)rd32(&c);
        if (r1 || r2) fail("E_RESERVED", "chunk %u: descriptor reserved field not 0", ci);
        W = dtype_bits(sym_dtype);
        if (!W) fail("E_DTYPE", "chunk %u: unknown symbol_dtype %d", ci, sym_dtype);
        if (T > 65536) fail("E_LIMIT_COUNT", "chunk %u: %u tensors", ci, T);
        if (NS > 4096) fail("E_LIMIT_COUNT", "chunk %u: %u sites", ci, NS);
    }
    ts = xalloc((uint64_t)(T ? T : 1) * sizeof(tensor_t), "E_LIMIT_COUNT");
    memset(ts, 0, (size_t)(T ? T : 1) * sizeof(tensor_t));
    for (k = 0; k < T; k++) {
        tensor_t *t = &ts[k];
        uint16_t res;
        int d;
        t->name = rdname(&c, &t->nlen, "tensor");
        t->dtype = rd8(&c);
        t->ndim = rd8(&c);
        res = rd16(&c);
        if (res) fail("E_RESERVED", "chunk %u: tensor reserved field not 0", ci);
        if (!dtype_bits(t->dtype)) fail("E_DTYPE", "chunk %u: unknown tensor dtype %d", ci, t->dtype);
        if (t->ndim > 8) fail("E_LIMIT_NDIM", "chunk %u: tensor rank %d over 8", ci, t->ndim);
        for (d = 0; d < t->ndim; d++) t->dims[d] = rd64(&c);
        {
            /* Element count <= 2^40 (5.1). Own limit (11.4), as the reference: the
               product with every 0 dim counted as 1 must also be <= 2^40. */
            uint64_t nel = 1;
            int zero = 0;
            for (d = 0; d < t->ndim; d++) {
                uint64_t v = t->dims[d] ? t->dims[d] : 1;
                if (!t->dims[d]) zero = 1;
                if (v > ((uint64_t)1 << 40) / nel) fail("E_LIMIT_TENSOR", "chunk %u: tensor over 2^40 elements", ci);
                nel *= v;
            }
            t->numel = zero ? 0 : nel;
        }
    }
    (void)rd32(&c);
    ss = xalloc((uint64_t)(NS ? NS : 1) * sizeof(site_t), "E_LIMIT_COUNT");
    memset(ss, 0, (size_t)(NS ? NS : 1) * sizeof(site_t));
    for (k = 0; k < NS; k++) {
        site_t *s = &ss[k];
        uint16_t nl, res;
        uint32_t fc, f;
        rdname(&c, &nl, "site");
        s->D = rd32(&c);
        s->anchor = rd32(&c);
        s->axis = rd8(&c);
        s->flags = rd8(&c);
        res = rd16(&c);
        fc = rd32(&c);
        if (res) fail("E_RESERVED", "chunk %u: site reserved field not 0", ci);
        for (f = 0; f < fc; f++) {
            rdname(&c, &nl, "follower");
            (void)rd8(&c);
            if (rd8(&c)) fail("E_RESERVED", "chunk %u: follower reserved field not 0", ci);
        }
        if (s->D > 32768) fail("E_LIMIT_DIM", "chunk %u: site dimension %u over 32768", ci, s->D);
    }
    (void)rd32(&c);
    ops = xalloc((uint64_t)(op_count ? op_count : 1) * sizeof(op_t), "E_LIMIT_COUNT");
    for (k = 0; k < op_count; k++) {
        const uint8_t *o = take(&c, 8);
        if (o[1] || ld16(o + 2)) fail("E_RESERVED", "chunk %u: op reserved field not 0", ci);
        ops[k].kind = o[0];
        ops[k].index = ld32(o + 4);
    }

    /* ---- program rules (5.2) ---- */
    {
        uint64_t cap = 2;
        while (cap < 2 * (uint64_t)T) cap <<= 1;
        ns.slot = xalloc(cap * sizeof(*ns.slot), "E_LIMIT_COUNT");
        memset(ns.slot, 0, (size_t)cap * sizeof(*ns.slot));
        ns.mask = cap - 1;
    }
    if (W != 8 && W != 16 && W != 32) fail("E_DTYPE", "chunk %u: symbol_dtype %d is %d bits wide", ci, sym_dtype, W);
    for (k = 0; k < T; k++) {
        if (nameset_add(&ns, &ts[k])) fail("E_DESCRIPTOR", "chunk %u: duplicate tensor name", ci);
        if (dtype_bits(ts[k].dtype) % W) fail("E_DTYPE", "chunk %u: tensor narrower than the symbols", ci);
    }
    xfree(ns.slot);
    for (k = 0; k < op_count; k++) {
        if (ops[k].kind != 1 && ops[k].kind != 2) fail("E_DESCRIPTOR", "chunk %u: op %u has unknown kind %u", ci, k, ops[k].kind);
        if (ops[k].index >= (ops[k].kind == 1 ? T : NS)) fail("E_DESCRIPTOR", "chunk %u: op %u index out of range", ci, k);
    }
    push_pos = xalloc((uint64_t)(T ? T : 1) * 4, "E_LIMIT_COUNT");
    push_cnt = xalloc((uint64_t)(T ? T : 1) * 4, "E_LIMIT_COUNT");
    site_cnt = xalloc((uint64_t)(NS ? NS : 1) * 4, "E_LIMIT_COUNT");
    memset(push_cnt, 0, (size_t)(T ? T : 1) * 4);
    memset(site_cnt, 0, (size_t)(NS ? NS : 1) * 4);
    for (k = 0; k < op_count; k++) {
        if (ops[k].kind == 1) {
            push_cnt[ops[k].index]++;
            push_pos[ops[k].index] = k;
        } else {
            site_cnt[ops[k].index]++;
            ss[ops[k].index].op_pos = k;
        }
    }
    for (k = 0; k < T; k++)
        if (push_cnt[k] != 1) fail("E_DESCRIPTOR", "chunk %u: tensor %u pushed %u times", ci, k, push_cnt[k]);
    for (k = 0; k < NS; k++)
        if (site_cnt[k] != 1) fail("E_DESCRIPTOR", "chunk %u: site %u appears %u times", ci, k, site_cnt[k]);
    for (k = 0; k < NS; k++) {
        site_t *s = &ss[k];
        tensor_t *a;
        if (s->flags & 0xFC) fail("E_RESERVED", "chunk %u: site %u has reserved flag bits", ci, k);
        if (s->anchor >= T) fail("E_SITE", "chunk %u: site %u anchor out of range", ci, k);
        a = &ts[s->anchor];
        if (!dtype_is_float(sym_dtype) || !dtype_is_float(a->dtype))
            fail("E_SITE", "chunk %u: site %u needs float symbols and a float anchor", ci, k);
        if (s->axis >= a->ndim || a->dims[s->axis] != s->D || s->D < 2)
            fail("E_SITE", "chunk %u: site %u does not fit its anchor", ci, k);
        if (push_pos[s->anchor] < s->op_pos) fail("E_SITE", "chunk %u: site %u anchor pushed before the site", ci, k);
    }
    xfree(push_cnt);
    xfree(site_cnt);

    /* P (6.3): signed, may be negative for a broken descriptor */
    P = 0;
    for (k = 0; k < T; k++) P += (int64_t)(ts[k].numel * (uint64_t)(dtype_bits(ts[k].dtype) / W));
    for (k = 0; k < NS; k++)
        if (!(ss[k].flags & F_PLAIN)) P += 2 * (int64_t)ss[k].D - (int64_t)n_of(ss[k].D);
    if (P >= 0) P_W8 = (uint64_t)P * (uint64_t)(W / 8);

    /* ---- section table (5.3, 8) ---- */
    off = table_end;
    for (k = 0; k < S; k++) {
        const uint8_t *e = buf + 32 + Ld + 32 * (uint64_t)k;
        uint8_t kind = e[0], codec = e[1];
        uint32_t site = ld32(e + 4);
        uint64_t so = ld64(e + 8), sl = ld64(e + 16), dl = ld64(e + 24), lim = 0;
        site_t *s = NULL;
        const uint8_t *dec;
        int owned = 0;
        if (ld16(e + 2)) fail("E_RESERVED", "chunk %u: section %u reserved field not 0", ci, k);
        if (kind < 1 || kind > 6 || (kind == K_BAND && !(bb_required_flags & BB_FLAG_BANDS)))
            fail("E_SECTION_KIND", "chunk %u: section %u unknown kind %u", ci, k, kind);
        if (codec > 1 && !(codec == 2 && kind == K_PAYLOAD && (bb_required_flags & BB_FLAG_PLANES))
                      && !(codec == 3 && kind == K_PAYLOAD && (bb_required_flags & BB_FLAG_EXPONENT) && dtype_is_float(sym_dtype))
                      && !(codec == 4 && kind == K_PAYLOAD && (bb_required_flags & BB_FLAG_PARTS)))
            fail("E_CODEC", "chunk %u: section %u unknown codec %u", ci, k, codec);
        if (kind == K_BAND && codec != 0) fail("E_CODEC", "chunk %u: band section %u not raw", ci, k);
        if (so != off) fail("E_BOUNDS", "chunk %u: section %u not contiguous", ci, k);
        if (sl > len - 4 - so) fail("E_BOUNDS", "chunk %u: section %u runs past the chunk", ci, k);
        off = so + sl;
        if (kind == K_PAYLOAD) {
            if (site != 0xFFFFFFFFu) fail("E_SECTION_KIND", "chunk %u: payload section names a site", ci);
        } else {
            if (site >= NS) fail("E_SECTION_KIND", "chunk %u: section %u names a non-existent site", ci, k);
            s = &ss[site];
            if (s->flags & F_PLAIN) fail("E_SECTION_KIND", "chunk %u: section %u on a PLAIN site", ci, k);
            if ((kind == K_SIGNS || kind == K_APAT) && !(s->flags & F_PAPER))
                fail("E_SECTION_KIND", "chunk %u: section kind %u on a symmetric-mode site", ci, kind);
            if (kind == K_XRES && (s->flags & F_PAPER)) fail("E_SECTION_KIND", "chunk %u: x_residuals on a PAPER site", ci);
        }
        if (kind == K_PAYLOAD) {
            if (have_payload) fail("E_SECTION_DUPLICATE", "chunk %u: two payload sections", ci);
        } else {
            if (s->has[kind]) fail("E_SECTION_DUPLICATE", "chunk %u: two sections of kind %u for site %u", ci, kind, site);
            /* both on one site only with MIXED_CORRECTIONS (1.2); kind 3 cannot reach here on
               a PAPER site (E_SECTION_KIND above), so "symmetric-mode site" holds */
            if (((kind == K_XRES && s->has[K_XPAT]) || (kind == K_XPAT && s->has[K_XRES])) &&
                !(bb_required_flags & BB_FLAG_MIXED))
                fail("E_SECTION_DUPLICATE", "chunk %u: x_residuals and x_patches on site %u", ci, site);
        }
        /* size / limit before decoding */
        if (kind == K_PAYLOAD) {
            if (P < 0 || dl != P_W8) fail("E_SYMBOL_COUNT", "chunk %u: payload decoded_length does not match the program", ci);
        } else if (kind == K_BAND) {
            if (dl != ((s->flags & F_PAPER) ? 24u : 8u)) fail("E_SECTION_SIZE", "chunk %u: band section %u is not 8 or 24 bytes", ci, k);
        } else {
            uint64_t D = s->D, n = n_of(D);
            int shift, width;
            switch (kind) {
            case K_SIGNS: lim = (D + 7) / 8; break;
            case K_XRES:
                dtype_exp_field(sym_dtype, &shift, &width);
                lim = 11 * ((uint64_t)1 << width) + n * (W == 16 ? 3 : 5);
                break;
            case K_XPAT: lim = 10 + n * (10 + (uint64_t)W / 8); break;
            default: {
                tensor_t *a = &ts[s->anchor];
                lim = 10 + a->numel * (10 + (uint64_t)dtype_bits(a->dtype) / 8);
            }
            }
            if (dl > lim) fail("E_LIMIT_SECTION", "chunk %u: section %u decoded_length over its limit", ci, k);
        }
        /* decode */
        if (codec == 2) {
            dec = decode_planes(buf + so, sl, (uint64_t)P, W, NULL);
            owned = 1;
        } else if (codec == 3) {
            dec = exponent_decode(buf + so, sl, (uint64_t)P, sym_dtype, W, NULL); /* exponent.c */
            owned = 1;
        } else if (codec == 4) {
            dec = parts_decode(buf + so, sl, (uint64_t)P, sym_dtype, W); /* parts.c */
            owned = 1;
        } else if (codec == 0) {
            if (sl != dl) fail("E_SECTION_SIZE", "chunk %u: raw section %u stored_length != decoded_length", ci, k);
            dec = buf + so;
        } else {
            uint64_t fcs = zstd_declared_size(buf + so, (size_t)sl), got;
            if (fcs == UINT64_MAX || fcs != dl) fail("E_SECTION_SIZE", "chunk %u: section %u zstd content size differs from decoded_length", ci, k);
            dec = zstd_decode(buf + so, (size_t)sl, dl, &got, "E_LIMIT_SECTION");
            owned = 1;
            if (got != dl) fail("E_ZSTD", "chunk %u: section %u decompressed to another size than its frame declares", ci, k);
        }
        if (kind == K_SIGNS && dl != (s->D + 7) / 8) fail("E_SECTION_SIZE", "chunk %u: signs section is not ceil(D/8) bytes", ci);
        if (kind == K_BAND)
            for (uint64_t b = 0; b < dl; b += 8) { /* 8.8: widths finite and > 0 */
                double w;
                uint64_t bits = ld64(dec + b);
                memcpy(&w, &bits, 8);
                if (!(isfinite(w) && w > 0)) fail("E_SECTION_CONTENT", "chunk %u: band width %g not finite and > 0", ci, w);
            }
        if (kind == K_PAYLOAD) {
            have_payload = 1;
            payload = dec;
            payload_len = dl;
            payload_owned = owned;
        } else {
            s->has[kind] = 1;
            s->sec[kind] = dec;
            s->seclen[kind] = dl;
            s->owned[kind] = owned;
        }
    }
    if (off != len - 4) fail("E_BOUNDS", "chunk %u: bytes between the last section and the chunk CRC", ci);
    if (!have_payload) fail("E_SECTION_MISSING", "chunk %u: no payload section", ci);
    if (bb_required_flags & BB_FLAG_BANDS)
        for (k = 0; k < NS; k++)
            if (!(ss[k].flags & F_PLAIN) && !ss[k].has[K_BAND]) fail("E_SECTION_MISSING", "chunk %u: site %u has no band section", ci, k);

    /* ---- decode (7.1) ---- */
    /* stack capacity: simulate heights (symbols) */
    h = maxh = (uint64_t)P;
    for (k = op_count; k-- > 0;) {
        if (ops[k].kind == 1) {
            tensor_t *t = &ts[ops[k].index];
            uint64_t sy = t->numel * (uint64_t)(dtype_bits(t->dtype) / W);
            if (sy > h) break;
            h -= sy;
        } else {
            site_t *s = &ss[ops[k].index];
            if (s->flags & F_PLAIN) continue;
            if (2 * (uint64_t)s->D > h) break;
            h = h - 2 * (uint64_t)s->D + n_of(s->D);
            if (h > maxh) maxh = h;
        }
    }
    if (maxh > BB_MEM_BUDGET / (uint64_t)(W / 8)) fail("E_LIMIT_TENSOR", "chunk %u: decoded chunk over this reader's memory budget", ci);
    stack = xalloc(maxh * (uint64_t)(W / 8), "E_LIMIT_TENSOR");
    memcpy(stack, payload, (size_t)payload_len);
    h = (uint64_t)P; /* in symbols */
    for (k = op_count; k-- > 0;) {
        if (ops[k].kind == 1) {
            tensor_t *t = &ts[ops[k].index];
            uint64_t sy = t->numel * (uint64_t)(dtype_bits(t->dtype) / W);
            uint64_t nb = t->numel * (uint64_t)(dtype_bits(t->dtype) / 8);
            if (sy > h) fail("E_SYMBOL_COUNT", "chunk %u: pop underflows the stack (tensor %u)", ci, ops[k].index);
            h -= sy;
            t->data = xalloc(nb ? nb : 1, "E_LIMIT_TENSOR");
            memcpy(t->data, stack + h * (uint64_t)(W / 8), (size_t)nb);
        } else {
            site_t *s = &ss[ops[k].index];
            uint64_t D = s->D, n = n_of(D);
            if (s->flags & F_PLAIN) continue;
            if (s->flags & F_PAPER) {
                const uint8_t *bits;
                if (!s->has[K_SIGNS]) fail("E_SECTION_MISSING", "chunk %u: PAPER site %u without signs", ci, ops[k].index);
                bits = s->sec[K_SIGNS];
                if (D % 8 && (bits[D / 8] >> (D % 8)) != 0) fail("E_RESERVED", "chunk %u: sign bitmap padding bits set", ci);
            }
            if (2 * D > h) fail("E_SYMBOL_COUNT", "chunk %u: pop underflows the stack (site %u)", ci, ops[k].index);
            h -= 2 * D;
            {
                /* mu occupies stack[h .. h+2D); the block is written at the same place:
                   copy mu out first */
                uint64_t mub = 2 * D * (uint64_t)(W / 8);
                uint8_t *mu = xalloc(mub, "E_LIMIT_TENSOR");
                memcpy(mu, stack + h * (uint64_t)(W / 8), (size_t)mub);
                decode_site(s, &ts[s->anchor], mu, stack + h * (uint64_t)(W / 8), sym_dtype, W);
                xfree(mu);
            }
            h += n;
        }
    }
    if (h != 0) fail("E_SYMBOL_COUNT", "chunk %u: %llu symbols left on the stack", ci, (unsigned long long)h);
    xfree(stack);

    /* content digest (5.4): the last check of a chunk, before any tensor is delivered */
    if (bb_required_flags & BB_FLAG_DIGESTS) {
        uint32_t st = CRC32C_INIT, want = ld32(buf + 4), got;
        for (i = 0; i < T; i++)
            st = crc32c_update(st, ts[i].data, (size_t)(ts[i].numel * (uint64_t)(dtype_bits(ts[i].dtype) / 8)));
        got = crc32c_final(st);
        if (got != want) {
            if (bb_have_margin) /* 1.4: how far this reader's arithmetic strayed (9 item 7) */
                fail("E_DIGEST", "chunk %u: content_crc 0x%08X, decoded tensors give 0x%08X; this reader's smallest band margin "
                     "so far %.6g (below 1: its float64 results moved further from the writer's than the band allows)", ci, want,
                     got, bb_margin);
            fail("E_DIGEST", "chunk %u: content_crc 0x%08X, decoded tensors give 0x%08X", ci, want, got);
        }
    }

    for (i = 0; i < T; i++) emit_tensor(&ts[i]);
    for (i = 0; i < T; i++) xfree(ts[i].data);
    /* free what this chunk allocated (sections decoded with zstd) */
    for (k = 0; k < NS; k++) {
        int kk;
        for (kk = 2; kk <= 6; kk++)
            if (ss[k].owned[kk]) xfree((void *)ss[k].sec[kk]);
    }
    if (payload_owned) xfree((void *)payload);
    xfree(push_pos);
    xfree(ops);
    xfree(ss);
    xfree(ts);
}
