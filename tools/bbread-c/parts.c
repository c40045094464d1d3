/* Payload codec 4, "parts" (SPEC.md 8.9, format 1.5).

   Written from SPEC.md 1.5's text alone by an outside implementer, without reading the
   reference's implementation of codec 4 or its tests. The parts are decoded by this
   reader's own payload decoders (raw, zstd, decode_planes, exponent_decode), each writing
   into its place in the payload buffer.

   Check order (8.9 "Check order", 11.3): (1) the part records, each field as it is read,
   then the cover of P and the section's fill; (2) for each codec-3 part in order, its
   leading fields (joined t, the segment records) and the running count of tables; (3) only
   then the parts, in order, so the first failure met is that of the lowest-numbered part.
   The payload buffer (P * W/8 bytes, the size the section table declared) is allocated
   between (2) and (3). */
#include <stdio.h>
#include <string.h>

#include "bbread.h"

#define PT_MAX_PARTS 65536u  /* 11.1 */
#define PT_MAX_TABLES 1024u  /* 11.1: the codec-3 parts' tables together */

typedef struct {
    uint8_t codec;   /* c_k */
    uint64_t first;  /* its first symbol in the payload */
    uint64_t sym;    /* p_k */
    uint64_t off;    /* its bytes: section[off, off + len) */
    uint64_t len;    /* L_k */
} part_t;

typedef struct {
    const uint8_t *s;
    uint64_t len, pos;
    int sym_dtype; /* the chunk's: codec-3 parts need a float (8.7, 1.6) */
} pt_cur;

static uint64_t pt_varint(pt_cur *c, const char *field, uint64_t k)
{
    uint64_t v;
    size_t u = varint_read(c->s + c->pos, (size_t)(c->len - c->pos), &v);
    if (!u) fail("E_SECTION_CONTENT", "parts payload: part %llu %s is not a complete varint", (unsigned long long)k, field);
    c->pos += u;
    return v;
}

/* c_k: 0 raw, 1 zstd, 2 planes (with PLANES), 3 exponent (with EXPONENT, float symbols: 8.7); else E_CODEC */
static uint8_t pt_codec(pt_cur *c, uint64_t k)
{
    int exponent = (bb_required_flags & BB_FLAG_EXPONENT) && dtype_is_float(c->sym_dtype);
    uint8_t v;
    if (c->pos >= c->len) fail("E_SECTION_CONTENT", "parts payload: part %llu codec is missing", (unsigned long long)k);
    v = c->s[c->pos++];
    if (!(v <= 1 || (v == 2 && (bb_required_flags & BB_FLAG_PLANES)) || (v == 3 && exponent)))
        fail("E_CODEC", "parts payload: part %llu codec %u", (unsigned long long)k, v);
    return v;
}

/* part k's record: c_k, p_k (1 <= p_k <= the symbols not yet covered), L_k (<= the bytes
   after the record that parts 0..k-1 do not take, `taken`: see SPEC_NOTES.md, 1.5 item 1;
   raw: = p_k * W/8) */
static void pt_record(pt_cur *c, uint64_t k, uint64_t left, uint64_t taken, int W, part_t *p)
{
    p->codec = pt_codec(c, k);
    p->sym = pt_varint(c, "symbol count", k);
    if (p->sym < 1 || p->sym > left)
        fail("E_SECTION_CONTENT", "parts payload: part %llu of %llu symbols, %llu left", (unsigned long long)k, (unsigned long long)p->sym,
             (unsigned long long)left);
    p->len = pt_varint(c, "stored length", k);
    if (taken > c->len - c->pos || p->len > c->len - c->pos - taken)
        fail("E_SECTION_CONTENT", "parts payload: part %llu stored length %llu runs past the section (%llu bytes after its record, "
             "%llu of them taken by the parts before it)", (unsigned long long)k, (unsigned long long)p->len,
             (unsigned long long)(c->len - c->pos), (unsigned long long)taken);
    if (p->codec == 0 && p->len != p->sym * ((uint64_t)W / 8))
        fail("E_SECTION_SIZE", "parts payload: raw part %llu of %llu bytes holds %llu symbols", (unsigned long long)k,
             (unsigned long long)p->len, (unsigned long long)p->sym);
}

/* part_count S and the S records; then sum p_k = P and sum L_k = the bytes after the
   records. Returns S; *parts receives the records with their places. */
static uint64_t pt_records(pt_cur *c, uint64_t P, int W, part_t **parts)
{
    uint64_t S, k, covered = 0, bytes = 0, off;
    part_t *pt;
    c->pos = varint_read(c->s, (size_t)c->len, &S);
    if (!c->pos) fail("E_SECTION_CONTENT", "parts payload: the part count is not a complete varint");
    if (S > PT_MAX_PARTS) fail("E_LIMIT_COUNT", "parts payload: %llu parts, at most 65536", (unsigned long long)S);
    if (S < 2 || S > P) fail("E_SECTION_CONTENT", "parts payload: %llu parts for %llu symbols", (unsigned long long)S, (unsigned long long)P);
    pt = xalloc(S * sizeof *pt, "E_LIMIT_COUNT");
    for (k = 0; k < S; k++) {
        pt_record(c, k, P - covered, bytes, W, &pt[k]);
        pt[k].first = covered;
        covered += pt[k].sym;
        bytes += pt[k].len; /* <= the section's length */
    }
    if (covered != P)
        fail("E_SECTION_CONTENT", "parts payload: the parts hold %llu of %llu symbols", (unsigned long long)covered, (unsigned long long)P);
    if (bytes != c->len - c->pos)
        fail("E_SECTION_CONTENT", "parts payload: the parts' stored lengths do not fill the %llu bytes after the records",
             (unsigned long long)(c->len - c->pos));
    for (k = 0, off = c->pos; k < S; off += pt[k].len, k++) pt[k].off = off;
    *parts = pt;
    return S;
}

/* names the part in every message of the checks below it ("payload part k") */
static void pt_context(uint64_t k)
{
    char ctx[40];
    snprintf(ctx, sizeof ctx, "payload part %llu", (unsigned long long)k);
    fail_context(ctx);
}

/* the leading fields of every codec-3 part, in order, and their tables together */
static void pt_tables(const uint8_t *sec, const part_t *pt, uint64_t S, int sym_dtype)
{
    uint64_t k, tables = 0;
    for (k = 0; k < S; k++) {
        if (pt[k].codec != 3) continue;
        pt_context(k);
        tables += exponent_tables(sec + pt[k].off, pt[k].len, pt[k].sym, sym_dtype); /* <= 1024 each */
        if (tables > PT_MAX_TABLES)
            fail("E_LIMIT_COUNT", "the codec-3 parts up to this one hold %llu tables, at most 1024", (unsigned long long)tables);
    }
    fail_context(NULL);
}

/* a zstd part: 8.2's order, with decoded_length p_k * W/8 */
static void pt_zstd(const uint8_t *b, uint64_t len, uint64_t dl, uint8_t *out)
{
    uint64_t fcs = zstd_declared_size(b, (size_t)len);
    if (fcs != dl) fail("E_SECTION_SIZE", "zstd part does not declare its %llu bytes", (unsigned long long)dl);
    if (zstd_decode_into(b, (size_t)len, out, dl) != dl) fail("E_ZSTD", "zstd part decoded to another size");
}

/* part k, by its own codec, into out (its p_k * W/8 bytes of the payload) */
static void pt_decode(const uint8_t *sec, const part_t *p, int sym_dtype, int W, uint8_t *out)
{
    const uint8_t *b = sec + p->off;
    switch (p->codec) {
    case 0: memcpy(out, b, (size_t)p->len); break;
    case 1: pt_zstd(b, p->len, p->sym * ((uint64_t)W / 8), out); break;
    case 2: decode_planes(b, p->len, p->sym, W, out); break;
    default: exponent_decode(b, p->len, p->sym, sym_dtype, W, out); break;
    }
}

uint8_t *parts_decode(const uint8_t *sec, uint64_t len, uint64_t P, int sym_dtype, int W)
{
    pt_cur c = {sec, len, 0, sym_dtype};
    part_t *pt;
    uint64_t S, k, WB = (uint64_t)W / 8;
    uint8_t *out;
    S = pt_records(&c, P, W, &pt);
    pt_tables(sec, pt, S, sym_dtype);
    out = xalloc(P * WB, "E_LIMIT_TENSOR"); /* P >= S >= 2 */
    for (k = 0; k < S; k++) {
        pt_context(k);
        pt_decode(sec, &pt[k], sym_dtype, W, out + pt[k].first * WB);
    }
    fail_context(NULL);
    xfree(pt);
    return out;
}
