/* bbread PATH [--out DIR]: read a .bb container (SPEC.md 1.5) from the end (SPEC.md 2, strategy 1),
   verify and decode every chunk, print one JSON object on stdout. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "bbread.h"

/* ------------------------------------------------------------ errors */

static jmp_buf unwind;
static const char *err_code;
static char err_msg[512];
static int err_is_io;
static char err_ctx[64];

static int err_numerics; /* set by fail_numerics_scope: a failure is this reader's numerics' (E_DIGEST) */

void fail_context(const char *ctx)
{
    snprintf(err_ctx, sizeof err_ctx, "%s", ctx ? ctx : "");
}

void fail_numerics_scope(int on)
{
    err_numerics = on;
}

void fail(const char *code, const char *fmt, ...)
{
    va_list ap;
    size_t n = 0;
    if (err_ctx[0]) n = (size_t)snprintf(err_msg, sizeof err_msg, "%s: ", err_ctx);
    if (err_numerics && n < sizeof err_msg) /* SPEC.md 8.4: with DIGESTS, x_residuals that do not fit are E_DIGEST */
        n += (size_t)snprintf(err_msg + n, sizeof err_msg - n, "x_residuals do not fit the contexts of this reader's "
                              "regenerated values (its numerics left the band, or the section does not match the writer's decoding): %s ", code);
    if (n > sizeof err_msg - 1) n = sizeof err_msg - 1;
    va_start(ap, fmt);
    vsnprintf(err_msg + n, sizeof err_msg - n, fmt, ap);
    va_end(ap);
    err_code = err_numerics ? "E_DIGEST" : code;
    err_numerics = 0;
    longjmp(unwind, 1);
}

void fail_io(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    err_is_io = 1;
    longjmp(unwind, 1);
}

/* ------------------------------------------------------------ JSON output */

typedef struct {
    char *data;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->cap - b->len < n + 1) {
        size_t nc = b->cap ? b->cap : 256;
        char *nd;
        while (nc - b->len < n + 1) nc *= 2;
        nd = realloc(b->data, nc);
        if (!nd) fail_io("out of memory");
        b->data = nd;
        b->cap = nc;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* JSON string literal of n bytes of (valid) UTF-8 */
static void sb_jstr(sbuf *b, const uint8_t *s, size_t n)
{
    size_t i;
    sb_put(b, "\"", 1);
    for (i = 0; i < n; i++) {
        uint8_t c = s[i];
        char esc[8];
        if (c == '"') sb_put(b, "\\\"", 2);
        else if (c == '\\') sb_put(b, "\\\\", 2);
        else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, "\"", 1);
}

/* ------------------------------------------------------------ decoded tensors */

typedef struct {
    uint8_t *name;
    uint16_t nlen;
    int dtype, ndim;
    uint64_t dims[8];
    char sha[65];
    uint64_t ordinal;
} entry_t;

static entry_t *entries;
static size_t n_entries, cap_entries;
static size_t *emap; /* open addressing: entry index + 1, 0 = empty */
static size_t emap_cap;
static uint64_t next_ordinal;
static const char *out_dir;

static uint64_t hash_bytes(const uint8_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ULL; }
    return h;
}

static size_t *emap_find(const uint8_t *name, size_t nlen)
{
    size_t i = (size_t)hash_bytes(name, nlen) & (emap_cap - 1);
    while (emap[i]) {
        entry_t *e = &entries[emap[i] - 1];
        if (e->nlen == nlen && memcmp(e->name, name, nlen) == 0) break;
        i = (i + 1) & (emap_cap - 1);
    }
    return &emap[i];
}

static void emap_grow(void)
{
    size_t nc = emap_cap ? emap_cap * 2 : 64, i;
    size_t *old = emap, oc = emap_cap;
    emap = calloc(nc, sizeof *emap);
    if (!emap) fail_io("out of memory");
    emap_cap = nc;
    for (i = 0; i < oc; i++)
        if (old[i]) {
            entry_t *e = &entries[old[i] - 1];
            *emap_find(e->name, e->nlen) = old[i];
        }
    free(old);
}

void emit_tensor(const tensor_t *t)
{
    uint64_t nbytes = t->numel * (uint64_t)(dtype_bits(t->dtype) / 8);
    uint64_t ord = next_ordinal++;
    sha256_ctx sc;
    uint8_t dg[32];
    entry_t *e;
    size_t *slot;
    int i;

    if (2 * (n_entries + 1) > emap_cap) emap_grow();
    slot = emap_find(t->name, t->nlen);
    if (*slot) {
        e = &entries[*slot - 1]; /* a later chunk wins */
    } else {
        if (n_entries == cap_entries) {
            size_t nc = cap_entries ? cap_entries * 2 : 64;
            entry_t *ne = realloc(entries, nc * sizeof *ne);
            if (!ne) fail_io("out of memory");
            entries = ne;
            cap_entries = nc;
        }
        {
            uint8_t *nm = malloc(t->nlen ? t->nlen : 1);
            if (!nm) fail_io("out of memory");
            memcpy(nm, t->name, t->nlen);
            e = &entries[n_entries++];
            e->name = nm;
        }
        e->nlen = t->nlen;
        *slot = n_entries;
    }
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    memcpy(e->dims, t->dims, sizeof e->dims);
    e->ordinal = ord;
    sha256_init(&sc);
    sha256_update(&sc, t->data, (size_t)nbytes);
    sha256_final(&sc, dg);
    for (i = 0; i < 32; i++) snprintf(e->sha + 2 * i, 3, "%02x", dg[i]);
    if (out_dir) {
        char path[4096];
        FILE *f;
        snprintf(path, sizeof path, "%s/t%llu.bin", out_dir, (unsigned long long)ord);
        f = fopen(path, "wb");
        if (!f) fail_io("cannot write %s: %s", path, strerror(errno));
        if (nbytes && fwrite(t->data, 1, (size_t)nbytes, f) != nbytes) {
            fclose(f);
            fail_io("cannot write %s", path);
        }
        if (fclose(f) != 0) fail_io("cannot write %s", path);
    }
}

static void print_accept(void)
{
    sbuf b = {NULL, 0, 0};
    size_t i;
    sb_str(&b, "{\"result\":\"accept\",\"digests\":\"");
    sb_str(&b, (bb_required_flags & BB_FLAG_DIGESTS) ? "verified" : "absent");
    sb_str(&b, "\",");
    if (bb_have_margin) { /* 1.4: the smallest site margin (SPEC.md 9 item 7); null if no value counted (+inf) */
        char tmp[64];
        if (isinf(bb_margin)) snprintf(tmp, sizeof tmp, "\"band_margin\":null,");
        else snprintf(tmp, sizeof tmp, "\"band_margin\":%.17g,", bb_margin);
        sb_str(&b, tmp);
    }
    sb_str(&b, "\"tensors\":{");
    for (i = 0; i < n_entries; i++) {
        entry_t *e = &entries[i];
        char tmp[64];
        int d;
        if (i) sb_str(&b, ",");
        sb_jstr(&b, e->name, e->nlen);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, dtype_name(e->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (d = 0; d < e->ndim; d++) {
            snprintf(tmp, sizeof tmp, "%s%llu", d ? "," : "", (unsigned long long)e->dims[d]);
            sb_str(&b, tmp);
        }
        sb_str(&b, "],\"sha256\":\"");
        sb_str(&b, e->sha);
        sb_str(&b, "\"");
        if (out_dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/t%llu.bin", out_dir, (unsigned long long)e->ordinal);
            sb_str(&b, ",\"file\":");
            sb_jstr(&b, (const uint8_t *)path, strlen(path));
        }
        sb_str(&b, "}");
    }
    sb_str(&b, "}}\n");
    fwrite(b.data, 1, b.len, stdout);
    free(b.data);
}

static void print_reject(void)
{
    sbuf b = {NULL, 0, 0};
    sb_str(&b, "{\"result\":\"reject\",\"code\":\"");
    sb_str(&b, err_code);
    sb_str(&b, "\",\"message\":");
    sb_jstr(&b, (const uint8_t *)err_msg, strlen(err_msg));
    sb_str(&b, "}\n");
    fwrite(b.data, 1, b.len, stdout);
    free(b.data);
}

/* ------------------------------------------------------------ file access */

static FILE *fp;
static uint64_t fsize;

static void read_at(uint64_t off, void *dst, uint64_t n)
{
    if (off > fsize || n > fsize - off) fail("E_TRUNCATED", "read past the end of the file");
    if (n == 0) return;
    if (fseeko(fp, (off_t)off, SEEK_SET) != 0) fail("E_TRUNCATED", "cannot seek to %llu", (unsigned long long)off);
    if (fread(dst, 1, (size_t)n, fp) != n) fail("E_TRUNCATED", "short read at %llu", (unsigned long long)off);
}

static uint32_t crc_of_range(uint64_t off, uint64_t n)
{
    uint8_t tmp[65536];
    uint32_t c = CRC32C_INIT;
    while (n) {
        uint64_t k = n < sizeof tmp ? n : sizeof tmp;
        read_at(off, tmp, k);
        c = crc32c_update(c, tmp, (size_t)k);
        off += k;
        n -= k;
    }
    return crc32c_final(c);
}

static void check_metadata(const uint8_t *meta, uint32_t M, int codec)
{
    const uint8_t *text = meta;
    uint64_t tlen = M;
    uint8_t *dec = NULL;
    if (codec == 1) {
        uint64_t declared = zstd_declared_size(meta, M), got;
        if (declared > ((uint64_t)1 << 26)) fail("E_LIMIT_METADATA", "metadata declares %llu decoded bytes", (unsigned long long)declared);
        dec = zstd_decode(meta, M, declared, &got, "E_LIMIT_METADATA");
        if (got != declared) fail("E_ZSTD", "metadata decompressed to %llu bytes, not %llu", (unsigned long long)got, (unsigned long long)declared);
        text = dec;
        tlen = got;
    }
    if (!utf8_valid(text, (size_t)tlen)) fail("E_METADATA", "metadata is not UTF-8");
    if (!json_is_object(text, (size_t)tlen)) fail("E_METADATA", "metadata is not a JSON object");
    xfree(dec);
}

static void read_container(void)
{
    static const uint8_t MAGIC[8] = {0x89, 'B', 'B', 'F', '\r', '\n', 0x1A, '\n'};
    uint8_t hdr[32], foot[40], ih[8];
    uint8_t *hbuf, *index;
    uint32_t N, M, i;
    uint16_t major, minor;
    uint64_t H, index_offset, index_length, expect;

    /* 11.3 item 1 */
    if (fsize < 8) fail("E_MAGIC", "file shorter than 8 bytes");
    read_at(0, hdr, 8);
    if (memcmp(hdr, MAGIC, 8) != 0) fail("E_MAGIC", "bad file magic");
    if (fsize < 84) fail("E_TRUNCATED", "file shorter than 84 bytes");
    read_at(fsize - 40, foot, 40);
    if (memcmp(foot + 32, "BBFEND\r\n", 8) != 0) fail("E_TRUNCATED", "no footer magic at the end of the file");
    read_at(0, hdr, 32);
    major = ld16(hdr + 8);
    minor = ld16(hdr + 10);
    if (major != 1) fail("E_VERSION", "major version %u", major);
    if (ld32(hdr + 12) & ~BB_KNOWN_FLAGS) fail("E_REQUIRED_FLAG", "required_flags 0x%x", ld32(hdr + 12));
    if ((ld32(hdr + 12) & BB_FLAG_BANDS) && !(ld32(hdr + 12) & BB_FLAG_DIGESTS))
        fail("E_REQUIRED_FLAG", "required flag BANDS without DIGESTS");
    bb_required_flags = ld32(hdr + 12);
    if (hdr[21] > 1) fail("E_CODEC", "metadata_codec %u", hdr[21]);
    if (ld16(hdr + 22) != 0) fail("E_RESERVED", "header reserved field not 0");
    /* 1 paper, 2 symmetric, 3 none (1.2: no sites); informative only, decoding uses each site's flags */
    if (hdr[20] < 1 || hdr[20] > 3) fail("E_SCHEME", "scheme %u", hdr[20]);
    if (hdr[20] == 3 && !(bb_required_flags & BB_FLAG_DIGESTS)) fail("E_SCHEME", "scheme 3 (none) without required flag DIGESTS");
    N = ld32(hdr + 24);
    M = ld32(hdr + 28);
    if (N > 65536) fail("E_LIMIT_COUNT", "chunk_count %u over 65536", N);
    if (M > (1u << 26)) fail("E_LIMIT_METADATA", "metadata_length %u over 64 MiB", M);
    H = 36 + (uint64_t)M;
    if (H > fsize - 48) fail("E_BOUNDS", "header runs past the index and footer");
    hbuf = xalloc(H, "E_LIMIT_METADATA");
    read_at(0, hbuf, H);
    if (crc32c(hbuf, 32 + (size_t)M) != ld32(hbuf + 32 + M)) fail("E_CRC_HEADER", "header_crc mismatch");
    check_metadata(hbuf + 32, M, hdr[21]);
    xfree(hbuf);

    /* footer (10.2) */
    if (crc32c(foot, 28) != ld32(foot + 28)) fail("E_CRC_FOOTER", "footer_crc mismatch");
    if (ld16(foot + 20) != 1) fail("E_VERSION", "footer major version %u", ld16(foot + 20));
    if (ld32(foot + 24) != 0) fail("E_RESERVED", "footer reserved field not 0");
    if (ld16(foot + 20) != major || ld16(foot + 22) != minor) fail("E_VERSION", "header and footer versions differ");
    index_offset = ld64(foot);
    index_length = ld64(foot + 8);
    if (index_offset < H) fail("E_BOUNDS", "index_offset before the end of the header");
    if (index_offset > fsize - 40 || index_length != fsize - 40 - index_offset)
        fail("E_BOUNDS", "index does not end at the footer");
    if (crc_of_range(index_offset, index_length) != ld32(foot + 16)) fail("E_CRC_INDEX", "index_crc mismatch");

    /* index (10.1) */
    if (index_length < 8) fail("E_MAGIC", "index shorter than 8 bytes");
    read_at(index_offset, ih, 8);
    if (memcmp(ih, "BBIX", 4) != 0) fail("E_MAGIC", "bad index magic");
    if (ld32(ih + 4) != N) fail("E_INDEX", "index chunk_count %u, header says %u", ld32(ih + 4), N);
    if (index_length != 8 + 24 * (uint64_t)N) fail("E_INDEX", "index_length is not 8 + 24*N");
    index = xalloc(24 * (uint64_t)N + 1, "E_LIMIT_COUNT");
    read_at(index_offset + 8, index, 24 * (uint64_t)N);
    expect = H;
    for (i = 0; i < N; i++) {
        const uint8_t *e = index + 24 * (uint64_t)i;
        uint64_t off = ld64(e), len = ld64(e + 8);
        if (ld32(e + 20) != 0) fail("E_RESERVED", "index entry %u reserved field not 0", i);
        if (off != expect) fail("E_BOUNDS", "index entry %u: chunks not contiguous", i);
        if (len < 36) fail("E_BOUNDS", "index entry %u: length under 36", i);
        if (len > index_offset - off) fail("E_BOUNDS", "index entry %u runs past the index", i);
        expect = off + len;
    }
    if (expect != index_offset) fail("E_BOUNDS", "chunks do not end at the index");

    /* chunks, one at a time */
    for (i = 0; i < N; i++) {
        const uint8_t *e = index + 24 * (uint64_t)i;
        uint64_t off = ld64(e), len = ld64(e + 8);
        uint8_t *buf = xalloc(len, "E_LIMIT_TENSOR");
        read_at(off, buf, len);
        process_chunk(buf, len, i, ld32(e + 16));
        xfree(buf);
    }
    xfree(index);
}

/* ------------------------------------------------------------ main */

/* mkdir -p; returns 0 if the directory exists afterwards */
static int mkdir_p(const char *dir)
{
    char tmp[4096];
    size_t i, n = strlen(dir);
    struct stat st;
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    }
    return (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) ? 0 : -1;
}

static void usage(void)
{
    fprintf(stderr, "usage: bbread PATH [--out DIR]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    struct stat st;
    int a, rc;
    size_t k;

    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--out") == 0) {
            if (a + 1 >= argc || out_dir) usage();
            out_dir = argv[++a];
        } else if (argv[a][0] == '-' && argv[a][1] == '-') {
            usage();
        } else {
            if (path) usage();
            path = argv[a];
        }
    }
    if (!path) usage();
    fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "bbread: cannot open %s: %s\n", path, strerror(errno));
        return 2;
    }
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "bbread: %s is not a regular file\n", path);
        fclose(fp);
        return 2;
    }
    fsize = (uint64_t)st.st_size;
    if (out_dir && mkdir_p(out_dir) != 0) {
        fprintf(stderr, "bbread: cannot create %s: %s\n", out_dir, strerror(errno));
        fclose(fp);
        return 2;
    }

    if (setjmp(unwind) == 0) {
        read_container();
        print_accept();
        rc = 0;
    } else if (err_is_io) {
        fprintf(stderr, "bbread: %s\n", err_msg);
        rc = 2;
    } else {
        print_reject();
        rc = 1;
    }
    xfree_all();
    for (k = 0; k < n_entries; k++) free(entries[k].name);
    free(entries);
    free(emap);
    fclose(fp);
    return rc;
}
