/* tests/tb_read.h - a TFRecord and protobuf reader of the tests' own, for
   TensorBoard event files (tests/test_summary.c, tests/test_cuda.c): whole
   records with both CRCs checked (a bitwise CRC-32C, independent of dl.h's
   table version), then protobuf fields by number. Plain C, also C++. */
#ifndef TB_READ_H
#define TB_READ_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define TB_UNUSED __attribute__((unused))
#else
#define TB_UNUSED
#endif

/* the whole file (NULL when it cannot be read) */
TB_UNUSED static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b;
    long sz;
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = (unsigned char *)malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    if (b) *n = (size_t)sz;
    return b;
}

TB_UNUSED static uint32_t rd32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
TB_UNUSED static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* a bitwise reflected CRC-32 of polynomial poly, independent of dl.h's
   table versions: CRC-32C (TFRecord) and CRC-32 (PNG, tests/test_summary.c) */
TB_UNUSED static uint32_t ref_crc(const unsigned char *p, size_t n, uint32_t poly)
{
    uint32_t c = 0xffffffffu;
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        c ^= p[i];
        for (k = 0; k < 8; k++) c = (c >> 1) ^ (poly & (0u - (c & 1u)));
    }
    return ~c;
}
TB_UNUSED static uint32_t ref_crc32c(const unsigned char *p, size_t n) { return ref_crc(p, n, 0x82f63b78u); }
TB_UNUSED static uint32_t ref_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

typedef struct rec { const unsigned char *p; size_t len, off; } rec;
enum { REC_END = 0, REC_TRUNCATED = 1, REC_CORRUPT = 2 };

/* Reads whole records of buf[0..n): their count; *status says how it ended. */
TB_UNUSED static int read_records(const unsigned char *b, size_t n, rec *out, int max, int *status)
{
    size_t off = 0;
    int k = 0;
    *status = REC_END;
    while (off < n) {
        uint64_t len;
        if (n - off < 12) { *status = REC_TRUNCATED; break; }
        len = rd64(b + off);
        if (rd32(b + off + 8) != ref_mask(ref_crc32c(b + off, 8))) { *status = REC_CORRUPT; break; }
        if (n - off - 12 < len + 4) { *status = REC_TRUNCATED; break; }
        if (rd32(b + off + 12 + len) != ref_mask(ref_crc32c(b + off + 12, (size_t)len))) { *status = REC_CORRUPT; break; }
        if (k < max) { out[k].p = b + off + 12; out[k].len = (size_t)len; out[k].off = off; }
        k++;
        off += 12 + (size_t)len + 4;
    }
    return k;
}

/* ------------------------------------------- a protobuf reader of our own */
typedef struct pbf { int field, wire; uint64_t v; const unsigned char *p; size_t len; } pbf;

TB_UNUSED static int pb_varint(const unsigned char **p, const unsigned char *e, uint64_t *v)
{
    int s = 0;
    *v = 0;
    while (*p < e && s < 70) {
        unsigned char c = *(*p)++;
        *v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) return 1;
        s += 7;
    }
    return 0;
}

/* the next field of [*p, e): 1, 0 at the end, -1 malformed */
TB_UNUSED static int pb_next(const unsigned char **p, const unsigned char *e, pbf *f)
{
    uint64_t t;
    if (*p >= e) return 0;
    if (!pb_varint(p, e, &t)) return -1;
    f->field = (int)(t >> 3);
    f->wire = (int)(t & 7);
    f->p = NULL;
    f->len = 0;
    switch (f->wire) {
    case 0: return pb_varint(p, e, &f->v) ? 1 : -1;
    case 1: if (e - *p < 8) return -1; f->v = rd64(*p); *p += 8; return 1;
    case 5: if (e - *p < 4) return -1; f->v = rd32(*p); *p += 4; return 1;
    case 2:
        if (!pb_varint(p, e, &f->v) || (uint64_t)(e - *p) < f->v) return -1;
        f->p = *p; f->len = (size_t)f->v; *p += f->len;
        return 1;
    default: return -1;
    }
}

/* the k-th occurrence (0-based) of field in the message; 0 if none */
TB_UNUSED static int pb_get(const unsigned char *m, size_t n, int field, int k, pbf *out)
{
    const unsigned char *p = m, *e = m + n;
    pbf f;
    while (pb_next(&p, e, &f) == 1)
        if (f.field == field && k-- == 0) { *out = f; return 1; }
    return 0;
}

TB_UNUSED static int pb_count(const unsigned char *m, size_t n, int field)
{
    const unsigned char *p = m, *e = m + n;
    pbf f;
    int c = 0;
    while (pb_next(&p, e, &f) == 1) c += f.field == field;
    return c;
}

/* the whole message parses */
TB_UNUSED static int pb_valid(const unsigned char *m, size_t n)
{
    const unsigned char *p = m, *e = m + n;
    pbf f;
    int r;
    while ((r = pb_next(&p, e, &f)) == 1) {}
    return r == 0;
}

TB_UNUSED static double pb_double(const pbf *f) { double d; memcpy(&d, &f->v, 8); return d; }
TB_UNUSED static float pb_float(const pbf *f) { uint32_t u = (uint32_t)f->v; float x; memcpy(&x, &u, 4); return x; }
TB_UNUSED static int pb_streq(const pbf *f, const char *s) { return f->wire == 2 && f->len == strlen(s) && !memcmp(f->p, s, f->len); }


/* a scalar record's (step, tag, simple_value, wall_time); 0 when r is no scalar */
TB_UNUSED static int pb_scalar(const rec *r, int64_t *step, pbf *tag, float *v, double *wall)
{
    pbf f, g, h;
    *step = pb_get(r->p, r->len, 2, 0, &f) && f.wire == 0 ? (int64_t)f.v : 0;
    if (!pb_get(r->p, r->len, 1, 0, &f) || f.wire != 1) return 0;
    *wall = pb_double(&f);
    if (!pb_get(r->p, r->len, 5, 0, &f) || !pb_get(f.p, f.len, 1, 0, &g)) return 0;
    if (!pb_get(g.p, g.len, 1, 0, tag) || !pb_get(g.p, g.len, 2, 0, &h) || h.wire != 5) return 0;
    *v = pb_float(&h);
    return 1;
}
#endif
