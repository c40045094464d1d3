/* bbread: an independent reader for the .bb container format (SPEC.md v1.5; payload codec 2
   added from SPEC.md 8.6; content digests 5.4 and mixed corrections 8.4 from the 1.2 text;
   payload codec 3 from the 8.7 text alone, exponent.c; payload codec 4 from the 8.9 text
   alone, parts.c). */
#ifndef BBREAD_H
#define BBREAD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- reader's own limits (SPEC.md 11.4), applied only when decoding ---- */
#define BB_MEM_BUDGET   ((uint64_t)1 << 33)  /* bytes tracked by xalloc at once */
#define BB_MAX_EIG_DIM  8192u                /* largest D handed to the eigensolver */

/* ---- errors: fail() reports a stable E_ code and unwinds to main ---- */
void fail(const char *code, const char *fmt, ...);
void fail_io(const char *fmt, ...); /* exit 2: not a container problem */
/* fail() messages start with "CTX: " while ctx is set (NULL or "" clears it) */
void fail_context(const char *ctx);
/* while on, fail() reports E_DIGEST naming the code it was given (SPEC.md 8.4: x_residuals
   read against this reader's own contexts in a file with DIGESTS); fail() clears it */
void fail_numerics_scope(int on);

/* ---- tracked allocator: everything is freed by xfree_all() ---- */
void *xalloc(uint64_t size, const char *limit_code);
void xfree(void *p);
void xfree_all(void);

/* ---- little-endian loads ---- */
static inline uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

/* ---- CRC32C, SHA-256 ---- */
uint32_t crc32c_update(uint32_t state, const uint8_t *p, size_t n); /* state starts at 0xFFFFFFFF */
#define CRC32C_INIT 0xFFFFFFFFu
static inline uint32_t crc32c_final(uint32_t state) { return state ^ 0xFFFFFFFFu; }
uint32_t crc32c(const uint8_t *p, size_t n);

typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t nbuf;
} sha256_ctx;
void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const uint8_t *p, size_t n);
void sha256_final(sha256_ctx *c, uint8_t out[32]);

/* ---- text ---- */
int utf8_valid(const uint8_t *p, size_t n);
int json_is_object(const uint8_t *p, size_t n); /* UTF-8 already checked */

/* ---- varint: returns bytes used, 0 if malformed (unterminated, > 10 bytes, >= 2^64) ---- */
size_t varint_read(const uint8_t *p, size_t n, uint64_t *out);

/* ---- zstd: one frame, exact; see SPEC.md 8.2 ---- */
/* Parses the frame header of src[0..n): returns 0 and the declared content size
   (UINT64_MAX if absent) or fails with E_ZSTD. */
uint64_t zstd_declared_size(const uint8_t *src, size_t n);
/* Checks src is exactly one frame (E_ZSTD), decompresses into a new buffer of
   capacity cap; *got receives the decompressed size. */
uint8_t *zstd_decode(const uint8_t *src, size_t n, uint64_t cap, uint64_t *got, const char *limit_code);
/* The same into the caller's dst[0..cap); returns the decompressed size. */
uint64_t zstd_decode_into(const uint8_t *src, size_t n, uint8_t *dst, uint64_t cap);

/* ---- a payload's bytes (codecs 2 and 3: SPEC.md 8.6, 8.7); failures name `name` ---- */
typedef struct {
    const uint8_t *s;
    uint64_t len, pos;
    const char *name; /* "planes payload", "exponent payload", ... */
} pcur_t;
uint64_t pc_varint(pcur_t *c, const char *what);
uint8_t pc_u8(pcur_t *c, const char *what);
/* One group (8.6) decoding to exactly G bytes; *owned = 1 when the result was allocated. */
const uint8_t *pc_group(pcur_t *c, uint64_t G, int *owned, const char *what);
/* The segment count and records (8.6, 8.7); returns S, with n, r, K allocated. */
uint64_t pc_segments(pcur_t *c, uint64_t P, uint64_t **n, uint64_t **r, uint8_t **K);

/* ---- dtypes (SPEC.md 6.1) ---- */
enum { DT_F16 = 1, DT_BF16 = 2, DT_F32 = 3, DT_LAST = 15 }; /* 4-15 (1.6): opaque bit patterns */
int dtype_bits(int code); /* 0 if unknown: codes 4-15 are known only with BB_FLAG_DTYPES */
int dtype_is_float(int code); /* float16, bfloat16, float32: the dtypes with values */
const char *dtype_name(int code);
double dtype_to_f64(int code, uint32_t bits);
uint32_t round_to_dtype(double x, int code); /* SPEC.md 7.4 */
double boundary_distance(double x, int code); /* SPEC.md 9 item 7 */
void dtype_exp_field(int code, int *shift, int *width);

/* ---- tensor output ---- */
typedef struct {
    const uint8_t *name;
    uint16_t nlen;
    int dtype;
    int ndim;
    uint64_t dims[8];
    uint64_t numel;
    uint8_t *data; /* numel * bits/8 bytes, owned (xalloc) */
} tensor_t;

/* Called for every decoded tensor of a verified chunk, in tensor-record order. */
void emit_tensor(const tensor_t *t);

/* ---- chunk ---- */
/* Verifies and decodes the chunk buf[0..len) read through index entry i
   (entry_len, entry_crc); calls emit_tensor for each tensor. */
/* the header's required_flags (SPEC.md 4) */
#define BB_FLAG_PLANES  1u  /* 1.1: payload codec 2 (8.6) */
#define BB_FLAG_DIGESTS 2u  /* 1.2: chunk content_crc at offset 4 (5.4) */
#define BB_FLAG_MIXED   4u  /* 1.2: x_residuals and x_patches on one symmetric site (8.4) */
#define BB_FLAG_EXPONENT 8u /* 1.3: payload codec 3 (8.7) */
#define BB_FLAG_BANDS   16u /* 1.4: a band section per non-PLAIN site (8.8); needs DIGESTS */
#define BB_FLAG_PARTS   32u /* 1.5: payload codec 4 (8.9) */
#define BB_FLAG_DTYPES  64u /* 1.6: dtype codes 4-15 and W = 8 (6.1, 6.2) */
#define BB_KNOWN_FLAGS  (BB_FLAG_PLANES | BB_FLAG_DIGESTS | BB_FLAG_MIXED | BB_FLAG_EXPONENT | BB_FLAG_BANDS | BB_FLAG_PARTS \
                         | BB_FLAG_DTYPES)
extern uint32_t bb_required_flags;
extern double bb_margin; /* 1.4: the smallest site margin met so far (SPEC.md 9 item 7); INFINITY if none */
extern int bb_have_margin;
/* The payload decoders write the P symbols (W-bit LE, P*W/8 bytes) of a payload section
   sec[0..len) into out, or, with out = NULL, into a buffer they allocate; they return it and
   fail with the codes of 11.2. A codec-4 part is decoded by them with P = its p_k. */
/* chunk.c: codec 2, planes (SPEC.md 8.6) */
uint8_t *decode_planes(const uint8_t *sec, uint64_t len, uint64_t P, int W, uint8_t *out);
/* exponent.c: codec 3, exponent (SPEC.md 8.7) */
uint8_t *exponent_decode(const uint8_t *sec, uint64_t len, uint64_t P, int sym_dtype, int W, uint8_t *out);
/* exponent.c: checks only the leading fields of a codec-3 section (joined t, the segment
   records and their cover of P, 8.7's first rows) and returns its number of tables, sum K_j */
uint64_t exponent_tables(const uint8_t *sec, uint64_t len, uint64_t P, int sym_dtype);
/* parts.c: codec 4, parts (SPEC.md 8.9); always allocates */
uint8_t *parts_decode(const uint8_t *sec, uint64_t len, uint64_t P, int sym_dtype, int W);
void process_chunk(const uint8_t *buf, uint64_t len, uint32_t i, uint32_t entry_crc);

#endif
