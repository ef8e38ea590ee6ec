/* tests/test_summary.c - TensorBoard event files (dl_summary_*): CRC-32C,
   CRC-32 and Adler-32 against published values, the protobuf encoder against
   hand-computed bytes, the PNG encoder (decoded here), a round trip (scalars,
   a histogram, images and a graph written, then read back with a TFRecord
   reader of this file's own: every record's CRCs and fields), files cut at
   every byte of their last record, and the errors: bad logdirs, a full disk
   (/dev/full), a write cut short (RLIMIT_FSIZE), bad tensors, tags that are
   not UTF-8 (refused; the file stays readable after them). When Python's
   tensorboard package is importable, tests/tb_check.py reads the file with
   TensorBoard's own loader (one check; else it is skipped with a message).
   Outputs go to build/tb_summary/. */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include "tb_read.h"
#include <stdlib.h>
#include <signal.h>
#include <sys/resource.h>

#define DIR_ "build/tb_summary"

static int th_skip;

/* ------------------------------------------------------------ file helpers */
static void spit(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) { if (n) fwrite(b, 1, n, f); fclose(f); }
}

static long file_size(const char *path)
{
    size_t n;
    unsigned char *b = slurp(path, &n);
    if (!b) return -1;
    free(b);
    return (long)n;
}

/* ---------------------------------------------------- a PNG reader (stored) */
typedef struct png { uint32_t w, h; int ctype; unsigned char *raw; size_t nraw; } png;

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static uint32_t ref_crc32(const unsigned char *p, size_t n) { return ref_crc(p, n, 0xedb88320u); }

/* Checks signature, chunk CRCs, the zlib header, the stored blocks and the
   Adler-32; fills the raw scanlines. 1 on success, else 0 with why. */
static int png_decode(const unsigned char *b, size_t n, png *out, const char **why)
{
    static const unsigned char sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
    size_t off = 8, zn = 0, i;
    unsigned char *z = (unsigned char *)malloc(n), *raw;
    int seen_end = 0;
    memset(out, 0, sizeof *out);
    *why = "ok";
    if (!z) { *why = "oom"; return 0; }
    if (n < 8 || memcmp(b, sig, 8)) { *why = "signature"; free(z); return 0; }
    while (off + 12 <= n && !seen_end) {
        uint32_t len = be32(b + off);
        const unsigned char *type = b + off + 4, *data = b + off + 8;
        if (off + 12 + len > n) { *why = "chunk past end"; free(z); return 0; }
        if (be32(data + len) != ref_crc32(type, len + 4)) { *why = "chunk crc"; free(z); return 0; }
        if (!memcmp(type, "IHDR", 4)) {
            if (len != 13 || data[8] != 8 || data[10] || data[11] || data[12]) { *why = "IHDR"; free(z); return 0; }
            out->w = be32(data); out->h = be32(data + 4); out->ctype = data[9];
        } else if (!memcmp(type, "IDAT", 4)) {
            memcpy(z + zn, data, len); zn += len;
        } else if (!memcmp(type, "IEND", 4)) {
            seen_end = 1;
        }
        off += 12 + len;
    }
    if (!seen_end || off != n) { *why = "no IEND at the end"; free(z); return 0; }
    if (zn < 6 || z[0] != 0x78 || ((z[0] << 8) | z[1]) % 31 != 0 || (z[1] & 0x20)) { *why = "zlib header"; free(z); return 0; }
    raw = (unsigned char *)malloc(zn);
    i = 2;
    for (;;) {
        unsigned len, nlen;
        int final;
        if (i + 5 > zn) { *why = "block header"; free(z); free(raw); return 0; }
        final = z[i] & 1;
        if ((z[i] >> 1) & 3) { *why = "not a stored block"; free(z); free(raw); return 0; }
        len = z[i + 1] | (unsigned)z[i + 2] << 8;
        nlen = z[i + 3] | (unsigned)z[i + 4] << 8;
        if ((len ^ 0xffffu) != nlen || i + 5 + len > zn) { *why = "LEN/NLEN"; free(z); free(raw); return 0; }
        memcpy(raw + out->nraw, z + i + 5, len);
        out->nraw += len;
        i += 5 + len;
        if (final) break;
    }
    {   /* Adler-32, bytewise */
        uint32_t s1 = 1, s2 = 0;
        size_t k;
        for (k = 0; k < out->nraw; k++) { s1 = (s1 + raw[k]) % 65521u; s2 = (s2 + s1) % 65521u; }
        if (i + 4 != zn || be32(z + i) != ((s2 << 16) | s1)) { *why = "adler32"; free(z); free(raw); return 0; }
    }
    free(z);
    out->raw = raw;
    return 1;
}

/* ----------------------------------------------------------- 1. checksums */
static void test_checksums(void)
{
    const char *s = "123456789";
    unsigned char zero8[8] = {0}, le25[8] = {25, 0, 0, 0, 0, 0, 0, 0};
    unsigned char big[1000];
    int i;
    CHECK(dl__tb_crc32c(0, s, 9) == 0xE3069283u, "crc32c check value: %08x", dl__tb_crc32c(0, s, 9));
    CHECK(dl__tb_crc32c(dl__tb_crc32c(0, s, 4), s + 4, 5) == 0xE3069283u, "crc32c continued");
    CHECK(dl__tb_crc32c(0, "", 0) == 0, "crc32c of nothing");
    CHECK(dl__tb_crc32(0, s, 9) == 0xCBF43926u, "crc32 check value: %08x", dl__tb_crc32(0, s, 9));
    CHECK(dl__tb_adler32(1, (const unsigned char *)"Wikipedia", 9) == 0x11E60398u, "adler32 of Wikipedia");
    CHECK(dl__tb_adler32(1, (const unsigned char *)"", 0) == 1u, "adler32 of nothing");
    /* masked values, as tensorboard's masked_crc32c computes them */
    CHECK(dl__tb_mask(dl__tb_crc32c(0, s, 9)) == 0xc78ab0e5u, "masked crc32c of 123456789");
    CHECK(dl__tb_mask(dl__tb_crc32c(0, "", 0)) == 0xa282ead8u, "masked crc32c of nothing");
    CHECK(dl__tb_mask(dl__tb_crc32c(0, zero8, 8)) == 0x07980329u, "masked crc32c of a zero length");
    CHECK(dl__tb_mask(dl__tb_crc32c(0, le25, 8)) == 0x2808f18bu, "masked crc32c of length 25");
    /* against the bitwise references, long input (adler's 5552 chunks) */
    for (i = 0; i < 1000; i++) big[i] = (unsigned char)(i * 7 + 3);
    CHECK(dl__tb_crc32c(0, big, 1000) == ref_crc32c(big, 1000), "crc32c vs bitwise");
    CHECK(dl__tb_crc32(0, big, 1000) == ref_crc32(big, 1000), "crc32 vs bitwise");
    {
        unsigned char *ff = (unsigned char *)malloc(100000);
        uint32_t s1 = 1, s2 = 0;
        size_t k;
        memset(ff, 0xff, 100000);
        for (k = 0; k < 100000; k++) { s1 = (s1 + 0xff) % 65521u; s2 = (s2 + s1) % 65521u; }
        CHECK(dl__tb_adler32(1, ff, 100000) == ((s2 << 16) | s1), "adler32 over many chunks of 0xff");
        free(ff);
    }
}

/* ------------------------------------------------------------ 2. protobuf */
static int bytes_are(const dl__pb *b, const char *hex)
{
    size_t n = strlen(hex) / 2, i;
    if (b->oom || b->n != n) return 0;
    for (i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        if (b->p[i] != v) return 0;
    }
    return 1;
}

#define PB(stmt, hex, what) do { dl__pb b_; memset(&b_, 0, sizeof b_); stmt; \
    CHECK(bytes_are(&b_, hex), "%s: %zu bytes, want %s", what, b_.n, hex); DL_FREE(b_.p); } while (0)

static void test_protobuf(void)
{
    double d[2];
    PB(dl__pb_varint(&b_, 0), "00", "varint 0");
    PB(dl__pb_varint(&b_, 1), "01", "varint 1");
    PB(dl__pb_varint(&b_, 127), "7f", "varint 127");
    PB(dl__pb_varint(&b_, 128), "8001", "varint 128");
    PB(dl__pb_varint(&b_, 300), "ac02", "varint 300");
    PB(dl__pb_varint(&b_, 16384), "808001", "varint 2^14");
    PB(dl__pb_varint(&b_, (uint64_t)1 << 32), "8080808010", "varint 2^32");
    PB(dl__pb_varint(&b_, ~(uint64_t)0), "ffffffffffffffffff01", "varint 2^64-1");
    PB(dl__pb_int(&b_, 2, 150), "109601", "int field 2 = 150");
    PB(dl__pb_int(&b_, 2, -1), "10ffffffffffffffffff01", "int64 field 2 = -1 (ten bytes)");
    PB(dl__pb_int(&b_, 2, 0), "", "int 0 left out");
    PB(dl__pb_int(&b_, 16, 1), "800101", "field 16: two-byte tag");
    PB(dl__pb_double(&b_, 1, 1.0), "09000000000000f03f", "double field 1 = 1.0");
    PB(dl__pb_double(&b_, 1, -2.5), "0900000000000004c0", "double field 1 = -2.5");
    PB(dl__pb_double(&b_, 1, 0.0), "", "double 0 left out");
    PB(dl__pb_double(&b_, 1, -0.0), "090000000000000080", "double -0 kept");
    PB(dl__pb_float(&b_, 2, 1.0f), "150000803f", "float field 2 = 1.0");
    PB(dl__pb_float(&b_, 2, 0.5f), "150000003f", "float field 2 = 0.5");
    PB(dl__pb_float(&b_, 2, 0.0f), "1500000000", "float 0 kept (simple_value: a oneof member)");
    PB(dl__pb_str(&b_, 3, "brain.Event:2"), "1a0d627261696e2e4576656e743a32", "string field 3");
    PB(dl__pb_str(&b_, 3, ""), "", "empty string left out");
    d[0] = 1.0; d[1] = 2.0;
    PB(dl__pb_doubles(&b_, 6, d, 2), "3210000000000000f03f0000000000000040", "packed doubles field 6");
    PB({ size_t s = dl__pb_begin(&b_, 5); dl__pb_str(&b_, 1, "a"); dl__pb_end(&b_, s); }, "2a030a0161",
       "nested message field 5 { 1: \"a\" }");
    PB({ size_t s = dl__pb_begin(&b_, 5); dl__pb_end(&b_, s); }, "2a00", "empty nested message kept");
    PB({ size_t s = dl__pb_begin(&b_, 1); size_t t = dl__pb_begin(&b_, 2); dl__pb_int(&b_, 1, 3);
         dl__pb_end(&b_, t); dl__pb_end(&b_, s); }, "0a0412020803", "two levels of nesting");
    {   /* a nested message of 200 bytes: the length takes two bytes, content moves */
        dl__pb b;
        size_t s, i;
        int ok;
        char txt[199];
        memset(&b, 0, sizeof b);
        memset(txt, 'x', sizeof txt - 1);
        txt[sizeof txt - 1] = 0;
        dl__pb_int(&b, 1, 7);
        s = dl__pb_begin(&b, 4);
        dl__pb_str(&b, 1, txt);               /* 1 + 2 + 198 = 201 bytes */
        dl__pb_end(&b, s);
        ok = b.n == 2 + 1 + 2 + 201 && b.p[0] == 0x08 && b.p[1] == 7 && b.p[2] == 0x22 && b.p[3] == 0xc9 &&
             b.p[4] == 0x01 && b.p[5] == 0x0a && b.p[6] == 0xc6 && b.p[7] == 0x01;
        for (i = 8; ok && i < b.n; i++) ok = b.p[i] == 'x';
        CHECK(ok, "200-byte nested message: two-byte length, content intact (%zu bytes)", b.n);
        DL_FREE(b.p);
    }
}

/* -------------------------------------------------------------------- PNG */
static void test_png(void)
{
    /* 2x3 RGB, then a gray image of more than 65535 bytes (two stored blocks) */
    unsigned char raw[2 * (1 + 9)], *big;
    dl__pb b;
    png p;
    const char *why;
    int i, ok;
    size_t bn = 300 * (1 + 300);
    for (i = 0; i < (int)sizeof raw; i++) raw[i] = (unsigned char)(i % 10 ? i * 13 : 0);
    memset(&b, 0, sizeof b);
    dl__tb_png(&b, raw, sizeof raw, 3, 2, 2);
    ok = png_decode(b.p, b.n, &p, &why);
    CHECK(ok && p.w == 3 && p.h == 2 && p.ctype == 2 && p.nraw == sizeof raw && !memcmp(p.raw, raw, sizeof raw),
          "small RGB PNG decodes (%s)", why);
    CHECK(b.n == 8 + 25 + 12 + 2 + 5 + sizeof raw + 4 + 12, "small PNG size %zu", b.n);
    free(p.raw);
    DL_FREE(b.p);
    big = (unsigned char *)malloc(bn);
    for (i = 0; i < (int)bn; i++) big[i] = (unsigned char)(i % 301 ? i * 31 : 0);
    memset(&b, 0, sizeof b);
    dl__tb_png(&b, big, bn, 300, 300, 0);
    ok = png_decode(b.p, b.n, &p, &why);
    CHECK(ok && p.w == 300 && p.h == 300 && p.ctype == 0 && p.nraw == bn && !memcmp(p.raw, big, bn),
          "90300-byte gray PNG (two stored blocks) decodes (%s)", why);
    CHECK(b.n == 8 + 25 + 12 + 2 + 2 * 5 + bn + 4 + 12, "big PNG size %zu", b.n);
    free(p.raw);
    DL_FREE(b.p);
    free(big);
}

/* ------------------------------------------------ 3. round trip, truncation */
static dl_tensor *twice_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)fc; (void)n; (void)user;
    return dl_mul_scalar(in[0], 2.0f);
}
static dl_result twice_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)fc; (void)user;
    gin[0] = dl_mul_scalar(g, 2.0f);
    return gin[0] ? DL_OK : DL_ERR_OOM;
}

/* the histogram of TensorFlow's default buckets, counted by a linear scan */
static int ref_histogram(const double *v, int n, double *lim, double *cnt)
{
    double pos[800], x = 1e-12;
    int np = 0, nb = 0, i, j, ne = 0;
    double all_lim[1600], all_cnt[1600];
    while (x < 1e20) { pos[np++] = x; x *= 1.1; }
    all_lim[nb++] = -DBL_MAX;
    for (i = np - 1; i >= 0; i--) all_lim[nb++] = -pos[i];
    all_lim[nb++] = 0;
    for (i = 0; i < np; i++) all_lim[nb++] = pos[i];
    all_lim[nb++] = DBL_MAX;
    for (i = 0; i < nb; i++) all_cnt[i] = 0;
    for (j = 0; j < n; j++) {
        for (i = 0; i < nb - 1 && !(all_lim[i] > v[j]); i++) {}
        all_cnt[i] += 1;
    }
    for (j = nb - 1; all_cnt[j] == 0; j--) {}          /* the last non-empty */
    for (i = 0; all_cnt[i] == 0; i++) {}               /* from the first */
    while (i <= j) {
        double e = all_lim[i], c = all_cnt[i];
        i++;
        if (c == 0) while (i <= j && all_cnt[i] == 0) { e = all_lim[i]; i++; }
        lim[ne] = e; cnt[ne] = c; ne++;
    }
    return ne;
}

/* expected pixel of the test images: value -> byte as PyTorch does */
static unsigned char to_byte(float v)
{
    float f = v * 255.0f;
    return (unsigned char)(f >= 255.0f ? 255 : f > 0.0f ? (int)f : 0);
}

typedef struct gnode { char name[96], op[64], in[4][96]; int nin; int64_t dims[8]; int ndim; int has_shape; } gnode;

static int parse_graph(const unsigned char *g, size_t n, gnode *out, int max)
{
    int k = 0, i;
    pbf nd, f;
    while (k < max && pb_get(g, n, 1, k, &nd)) {
        gnode *o = &out[k];
        memset(o, 0, sizeof *o);
        if (pb_get(nd.p, nd.len, 1, 0, &f)) snprintf(o->name, sizeof o->name, "%.*s", (int)f.len, (const char *)f.p);
        if (pb_get(nd.p, nd.len, 2, 0, &f)) snprintf(o->op, sizeof o->op, "%.*s", (int)f.len, (const char *)f.p);
        for (i = 0; i < 4 && pb_get(nd.p, nd.len, 3, i, &f); i++)
            snprintf(o->in[i], sizeof o->in[i], "%.*s", (int)f.len, (const char *)f.p);
        o->nin = pb_count(nd.p, nd.len, 3);
        for (i = 0; pb_get(nd.p, nd.len, 5, i, &f); i++) {   /* attr entries */
            pbf key, val, list, shp, dim, sz;
            int d;
            if (!pb_get(f.p, f.len, 1, 0, &key) || !pb_streq(&key, "_output_shapes")) continue;
            if (!pb_get(f.p, f.len, 2, 0, &val) || !pb_get(val.p, val.len, 1, 0, &list) ||
                !pb_get(list.p, list.len, 7, 0, &shp)) continue;
            o->has_shape = 1;
            for (d = 0; d < 8 && pb_get(shp.p, shp.len, 2, d, &dim); d++)
                o->dims[d] = pb_get(dim.p, dim.len, 1, 0, &sz) ? (int64_t)sz.v : 0;
            o->ndim = d;
        }
        k++;
    }
    return k;
}

static const gnode *find_node(const gnode *g, int n, const char *name)
{
    int i;
    for (i = 0; i < n; i++) if (!strcmp(g[i].name, name)) return &g[i];
    return NULL;
}

static void test_round_trip(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL);
    dl_summary_writer *w;
    const char *path;
    char epath[512];
    FILE *ex;
    unsigned char *buf;
    size_t n;
    rec r[64];
    int nr, st, i, k;
    pbf f, g, h;
    static const float hv[] = {-1.0f, 0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 1.0f, 3.0f, -1e-13f, 1e-13f, 2e15f, -7.25f};
    const int nh = (int)(sizeof hv / sizeof hv[0]);
    float img1[1 * 4 * 5], img3[3 * 3 * 2 * 4];
    int64_t imgi[3 * 2 * 2];
    dl_tensor *t_h, *t_i1, *t_i3, *t_ii, *loss;
    dl_function twice;
    memset(&twice, 0, sizeof twice);
    twice.name = "twice";
    twice.forward = twice_fwd;
    twice.backward = twice_bwd;
    w = dl_summary_open(ctx, DIR_ "/run1/");
    CHECK(w != NULL, "open: %s", dl_error_message(ctx));
    if (!w) { dl_ctx_free(ctx); return; }
    path = dl_summary_path(w);
    CHECK(path && strstr(path, DIR_ "/run1/events.out.tfevents.") == path && !strstr(path, "//"),
          "file name %s", path ? path : "(null)");
    snprintf(epath, sizeof epath, "%s", path);
    ex = fopen(DIR_ "/expect.txt", "w");
    fprintf(ex, "file %s\n", epath);
    /* scalars */
    for (i = 0; i < 5; i++) {
        double v = 1.0 / (i + 1);
        CHECK(dl_summary_scalar(w, "train/loss", i * 10, v) == DL_OK, "scalar %d", i);
        fprintf(ex, "scalar train/loss %d %.9g\n", i * 10, (double)(float)v);
    }
    CHECK(dl_summary_scalar(w, "lr", -3, 0.0) == DL_OK, "scalar at a negative step, value 0");
    fprintf(ex, "scalar lr -3 0\n");
    /* a histogram */
    t_h = dl_from_array(ctx, DL_SHAPE(3, 4), hv);
    CHECK(dl_summary_histogram(w, "weights", 7, t_h) == DL_OK, "histogram: %s", dl_error_message(ctx));
    fprintf(ex, "histo weights 7");
    for (i = 0; i < nh; i++) fprintf(ex, " %.9g", (double)hv[i]);
    fprintf(ex, "\n");
    /* images: (1,4,5) gray; (3,3,2,4) RGB tiled; int64 (3,2,2) with clipping */
    for (i = 0; i < 20; i++) img1[i] = (float)i / 19.0f;
    img1[3] = -0.5f; img1[4] = 1.7f; img1[5] = 0.5f;
    for (i = 0; i < 72; i++) img3[i] = (float)((i * 37) % 101) / 100.0f;
    for (i = 0; i < 12; i++) imgi[i] = i * 40 - 100;
    t_i1 = dl_from_array(ctx, DL_SHAPE(1, 4, 5), img1);
    t_i3 = dl_from_array(ctx, DL_SHAPE(3, 3, 2, 4), img3);
    t_ii = dl_from_int64(ctx, DL_SHAPE(3, 2, 2), imgi);
    CHECK(dl_summary_image(w, "img/gray", 1, t_i1) == DL_OK, "gray image: %s", dl_error_message(ctx));
    CHECK(dl_summary_image(w, "img/grid", 2, t_i3) == DL_OK, "grid image: %s", dl_error_message(ctx));
    CHECK(dl_summary_image(w, "img/int", 3, t_ii) == DL_OK, "int image: %s", dl_error_message(ctx));
    /* expected HWC bytes */
    fprintf(ex, "image img/gray 1 4 5 1 ");
    for (i = 0; i < 20; i++) fprintf(ex, "%02x", to_byte(img1[i]));
    fprintf(ex, "\nimage img/grid 2 2 12 3 ");
    {
        int y, x, c;
        for (y = 0; y < 2; y++)
            for (x = 0; x < 12; x++)
                for (c = 0; c < 3; c++) fprintf(ex, "%02x", to_byte(img3[(((x / 4) * 3 + c) * 2 + y) * 4 + x % 4]));
    }
    fprintf(ex, "\nimage img/int 3 2 2 3 ");
    for (i = 0; i < 4; i++) for (k = 0; k < 3; k++) {
        int64_t q = imgi[k * 4 + i];
        fprintf(ex, "%02x", (unsigned)(q < 0 ? 0 : q > 255 ? 255 : q));
    }
    fprintf(ex, "\n");
    /* a graph: named and unnamed parameters (one name twice), a buffer, an
       input, a tensor used twice, a custom function */
    {
        dl_tensor *wt = dl_set_name(dl_requires_grad(dl_randn(ctx, DL_SHAPE(3, 2)), true), "w");
        dl_tensor *b = dl_keep(dl_zeros(ctx, DL_SHAPE(2)));
        dl_tensor *b2 = dl_set_name(dl_keep(dl_ones(ctx, DL_SHAPE(2))), "w");
        dl_tensor *rm = dl_keep(dl_full(ctx, DL_SHAPE(2), 0.5f));
        dl_tensor *x = dl_set_name(dl_randn(ctx, DL_SHAPE(4, 3)), "x");
        dl_tensor *s, *in1;
        dl_requires_grad(b, true);
        dl_requires_grad(b2, true);
        s = dl_sigmoid(dl_mul(dl_add(dl_add(dl_matmul(x, wt), b), b2), rm));
        in1 = dl_mul(s, s);
        loss = dl_sum(dl_function_apply(&twice, 1, &in1, NULL), DL_ALL, false);
        CHECK(loss != NULL, "graph built: %s", dl_error_message(ctx));
        CHECK(dl_summary_graph(w, loss) == DL_OK, "graph written: %s", dl_error_message(ctx));
        CHECK(dl_summary_graph(w, x) == DL_OK, "graph of a leaf written");
    }
    fprintf(ex, "graph 13\ngraph 1\n");
    CHECK(dl_summary_flush(w) == DL_OK, "flush");
    /* the file as it is now, before close: every record whole */
    buf = slurp(epath, &n);
    nr = read_records(buf, n, r, 64, &st);
    CHECK(nr == 13 && st == REC_END, "before close: %d records, status %d", nr, st);
    free(buf);
    CHECK(dl_summary_close(w) == DL_OK, "close");
    fclose(ex);

    buf = slurp(epath, &n);
    nr = read_records(buf, n, r, 64, &st);
    CHECK(nr == 13 && st == REC_END, "13 records, every CRC right: %d, status %d", nr, st);
    for (i = 0; i < nr && i < 64; i++) CHECK(pb_valid(r[i].p, r[i].len), "record %d parses", i);
    /* 0: file_version, wall_time */
    CHECK(pb_get(r[0].p, r[0].len, 3, 0, &f) && pb_streq(&f, "brain.Event:2"), "file_version");
    CHECK(pb_get(r[0].p, r[0].len, 1, 0, &f) && f.wire == 1 && pb_double(&f) > 1.6e9, "wall_time");
    CHECK(!pb_get(r[0].p, r[0].len, 2, 0, &f), "step 0 left out");
    /* 1..5 scalars, 6 lr */
    for (i = 0; i < 5; i++) {
        const rec *q = &r[1 + i];
        int ok = pb_get(q->p, q->len, 2, 0, &f) && f.wire == 0 && f.v == (uint64_t)(i * 10);
        if (i == 0) ok = !pb_get(q->p, q->len, 2, 0, &f);
        ok = ok && pb_get(q->p, q->len, 1, 0, &f) && pb_double(&f) > 1.6e9;
        ok = ok && pb_get(q->p, q->len, 5, 0, &f) && pb_count(f.p, f.len, 1) == 1 && pb_get(f.p, f.len, 1, 0, &g);
        ok = ok && pb_get(g.p, g.len, 1, 0, &h) && pb_streq(&h, "train/loss");
        ok = ok && pb_get(g.p, g.len, 2, 0, &h) && h.wire == 5 && pb_float(&h) == (float)(1.0 / (i + 1));
        CHECK(ok, "scalar record %d", i);
    }
    CHECK(pb_get(r[6].p, r[6].len, 2, 0, &f) && f.v == (uint64_t)(int64_t)-3 && pb_get(r[6].p, r[6].len, 5, 0, &f) &&
          pb_get(f.p, f.len, 1, 0, &g) && pb_get(g.p, g.len, 2, 0, &h) && h.wire == 5 && h.v == 0,
          "negative step; value 0 written (simple_value is in a oneof)");
    /* 7: histogram */
    if (pb_get(r[7].p, r[7].len, 5, 0, &f) && pb_get(f.p, f.len, 1, 0, &g) && pb_get(g.p, g.len, 5, 0, &h)) {
        double v[32], lim[1600], cnt[1600], mn = 1e300, mx = -1e300, sum = 0, sq = 0, tot = 0;
        int ne, ok = 1;
        pbf q;
        for (i = 0; i < nh; i++) {
            v[i] = hv[i];
            if (v[i] < mn) mn = v[i];
            if (v[i] > mx) mx = v[i];
            sum += v[i]; sq += v[i] * v[i];
        }
        ne = ref_histogram(v, nh, lim, cnt);
        CHECK(pb_get(g.p, g.len, 1, 0, &q) && pb_streq(&q, "weights"), "histogram tag");
        CHECK(pb_get(h.p, h.len, 1, 0, &q) && pb_double(&q) == mn && pb_get(h.p, h.len, 2, 0, &q) && pb_double(&q) == mx,
              "histogram min/max");
        CHECK(pb_get(h.p, h.len, 3, 0, &q) && pb_double(&q) == nh && pb_get(h.p, h.len, 4, 0, &q) && pb_double(&q) == sum &&
              pb_get(h.p, h.len, 5, 0, &q) && pb_double(&q) == sq, "histogram num/sum/sum_squares");
        ok = pb_get(h.p, h.len, 6, 0, &q) && q.wire == 2 && q.len == 8 * (size_t)ne;
        for (i = 0; ok && i < ne; i++) { double x; memcpy(&x, q.p + 8 * i, 8); ok = x == lim[i]; }
        CHECK(ok, "histogram bucket_limit: packed, %d limits as TF's default buckets", ne);
        ok = pb_get(h.p, h.len, 7, 0, &q) && q.wire == 2 && q.len == 8 * (size_t)ne;
        for (i = 0; ok && i < ne; i++) {
            double x;
            memcpy(&x, q.p + 8 * i, 8);
            ok = x == cnt[i] && (x > 0 || i == 0 || cnt[i - 1] > 0);   /* no two empty in a row */
            tot += x;
        }
        CHECK(ok && tot == nh, "histogram bucket counts (total %g)", tot);
        {   /* by hand: 1.0 lies in the bucket ending at the first 1e-12*1.1^k above 1 */
            double e = 1e-12;
            int found = 0;
            while (e <= 1.0) e *= 1.1;
            for (i = 0; i < ne; i++) if (lim[i] == e) found = cnt[i] == 3;
            CHECK(found, "the three 1.0s share one bucket ending at %g", e);
            CHECK(ne > 10 && lim[0] > -7.25 && lim[0] < -6.5 && cnt[0] == 1 && lim[ne - 2] <= 2e15 &&
                  lim[ne - 1] > 2e15 && lim[ne - 1] < 2.2e15 && cnt[ne - 1] == 1,
                  "no empty buckets at the ends: first limit %g, last %g", lim[0], lim[ne - 1]);
        }
    } else CHECK(0, "histogram record structure");
    /* 8..10: images */
    {
        const char *tags[3] = {"img/gray", "img/grid", "img/int"};
        uint32_t hw[3][3] = {{4, 5, 1}, {2, 12, 3}, {2, 2, 3}};
        for (k = 0; k < 3; k++) {
            const rec *q = &r[8 + k];
            pbf im, fh, fw, fc, fe, tg;
            png p;
            const char *why = "no image";
            int ok = pb_get(q->p, q->len, 2, 0, &f) && f.v == (uint64_t)(k + 1) &&
                     pb_get(q->p, q->len, 5, 0, &f) && pb_get(f.p, f.len, 1, 0, &g) &&
                     pb_get(g.p, g.len, 1, 0, &tg) && pb_streq(&tg, tags[k]) && pb_get(g.p, g.len, 4, 0, &im) &&
                     pb_get(im.p, im.len, 1, 0, &fh) && pb_get(im.p, im.len, 2, 0, &fw) &&
                     pb_get(im.p, im.len, 3, 0, &fc) && pb_get(im.p, im.len, 4, 0, &fe);
            ok = ok && fh.v == hw[k][0] && fw.v == hw[k][1] && fc.v == hw[k][2];
            ok = ok && png_decode(fe.p, fe.len, &p, &why);
            if (ok) {
                ok = p.h == hw[k][0] && p.w == hw[k][1] && p.ctype == (hw[k][2] == 1 ? 0 : 2);
                if (ok && k == 0) {
                    for (i = 0; ok && i < 20; i++) ok = p.raw[(i / 5) * 6 + 1 + i % 5] == to_byte(img1[i]);
                    ok = ok && p.raw[1 + 3] == 0 && p.raw[1 + 4] == 255 && p.raw[6 + 1] == 127;  /* clip, truncate */
                }
                if (ok && k == 1) {       /* (3,3,2,4) tiled: 3 images side by side, 12 wide */
                    int y, x, c;
                    for (y = 0; y < 2; y++) for (x = 0; x < 12; x++) for (c = 0; c < 3; c++)
                        if (p.raw[y * 37 + 1 + x * 3 + c] != to_byte(img3[(((x / 4) * 3 + c) * 2 + y) * 4 + x % 4])) ok = 0;
                }
                if (ok && k == 2) {
                    static const unsigned char want[12] = {0, 60, 220, 0, 100, 255, 0, 140, 255, 20, 180, 255};
                    int y, x, c;
                    for (y = 0; y < 2; y++) for (x = 0; x < 2; x++) for (c = 0; c < 3; c++)
                        if (p.raw[y * 7 + 1 + x * 3 + c] != want[(y * 2 + x) * 3 + c]) ok = 0;
                }
                free(p.raw);
            }
            CHECK(ok, "image record %s (%s)", tags[k], why);
        }
    }
    /* 11: the graph */
    if (pb_get(r[11].p, r[11].len, 4, 0, &f)) {
        gnode gn[16];
        const gnode *q;
        int nn = parse_graph(f.p, f.len, gn, 16);
        pbf ver, pr;
        CHECK(nn == 13, "graph: 13 nodes, got %d", nn);
        q = find_node(gn, nn, "x");
        CHECK(q && !strcmp(q->op, "Input") && q->nin == 0 && q->ndim == 2 && q->dims[0] == 4 && q->dims[1] == 3,
              "x: Input (4,3)");
        q = find_node(gn, nn, "w");
        CHECK(q && !strcmp(q->op, "Parameter") && q->ndim == 2 && q->dims[0] == 3 && q->dims[1] == 2, "w: Parameter (3,2)");
        q = find_node(gn, nn, "w_1");
        CHECK(q && !strcmp(q->op, "Parameter") && q->ndim == 1 && q->dims[0] == 2, "second w: w_1");
        q = find_node(gn, nn, "Parameter_0");
        CHECK(q && !strcmp(q->op, "Parameter"), "unnamed parameter: Parameter_0");
        q = find_node(gn, nn, "Buffer_0");
        CHECK(q && !strcmp(q->op, "Buffer"), "persistent without grad: Buffer_0");
        q = find_node(gn, nn, "dl_matmul_0");
        CHECK(q && !strcmp(q->op, "dl_matmul") && q->nin == 2 && !strcmp(q->in[0], "x") && !strcmp(q->in[1], "w") &&
              q->ndim == 2 && q->dims[0] == 4 && q->dims[1] == 2, "dl_matmul_0(x, w) -> (4,2)");
        q = find_node(gn, nn, "dl_add_0");
        CHECK(q && q->nin == 2 && !strcmp(q->in[0], "dl_matmul_0") && !strcmp(q->in[1], "Parameter_0"), "dl_add_0");
        q = find_node(gn, nn, "dl_add_1");
        CHECK(q && q->nin == 2 && !strcmp(q->in[0], "dl_add_0") && !strcmp(q->in[1], "w_1"), "dl_add_1");
        q = find_node(gn, nn, "dl_mul_0");
        CHECK(q && q->nin == 2 && !strcmp(q->in[0], "dl_add_1") && !strcmp(q->in[1], "Buffer_0"), "dl_mul_0");
        q = find_node(gn, nn, "dl_mul_1");
        CHECK(q && q->nin == 2 && !strcmp(q->in[0], "dl_sigmoid_0") && !strcmp(q->in[1], "dl_sigmoid_0"),
              "dl_mul_1(s, s): one tensor twice");
        q = find_node(gn, nn, "twice_0");
        CHECK(q && !strcmp(q->op, "twice") && q->nin == 1 && !strcmp(q->in[0], "dl_mul_1"), "custom function twice_0");
        q = find_node(gn, nn, "dl_sum_0");
        CHECK(q && q->nin == 1 && !strcmp(q->in[0], "twice_0") && q->has_shape && q->ndim == 0, "dl_sum_0: 0-d");
        CHECK(pb_get(f.p, f.len, 4, 0, &ver) && pb_get(ver.p, ver.len, 1, 0, &pr) && pr.v == 22, "versions.producer 22");
        for (i = 0; i < nn; i++) if (!gn[i].has_shape) break;
        CHECK(i == nn, "every node has _output_shapes");
    } else CHECK(0, "graph record structure");
    if (pb_get(r[12].p, r[12].len, 4, 0, &f)) {
        gnode gn[2];
        CHECK(parse_graph(f.p, f.len, gn, 2) == 1 && !strcmp(gn[0].name, "x") && !strcmp(gn[0].op, "Input"),
              "graph of a leaf: one node");
    } else CHECK(0, "leaf graph record");

    /* truncated at every byte of the last record: every earlier record reads */
    {
        size_t last = r[nr - 1].off, cut;
        int bad = 0, m;
        for (cut = last; cut < n; cut++) {
            m = read_records(buf, cut, r, 64, &st);
            if (m != nr - 1 || st != (cut == last ? REC_END : REC_TRUNCATED)) bad++;
        }
        CHECK(bad == 0, "cut at each of %zu bytes of the last record: %d bad reads", n - last, bad);
        /* a flipped byte is corruption, not truncation */
        buf[r[3].off + 14] ^= 0x40;
        m = read_records(buf, n, r, 64, &st);
        CHECK(m == 3 && st == REC_CORRUPT, "a flipped byte stops the reader at record 3 (%d, %d)", m, st);
        buf[r[3].off + 14] ^= 0x40;
    }
    free(buf);
    dl_ctx_free(ctx);
}

/* the graph after backward (released nodes keep their inputs), and a longer
   one: a chain of 300 ops, one dl_cat of 40 inputs */
static void test_graph_after_backward(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL);
    dl_summary_writer *w = dl_summary_open(ctx, DIR_ "/after");
    dl_tensor *p = dl_requires_grad(dl_randn(ctx, DL_SHAPE(2, 3)), true), *y = p, *parts[40], *loss;
    unsigned char *buf;
    size_t n;
    rec r[4];
    pbf f;
    gnode *gn = (gnode *)malloc(sizeof(gnode) * 400);
    int i, st, nr;
    for (i = 0; i < 300; i++) y = dl_tanh(y);
    for (i = 0; i < 40; i++) parts[i] = i % 2 ? y : p;
    loss = dl_sum(dl_cat(40, parts, 0), DL_ALL, false);
    CHECK(w && loss && dl_backward(loss) == DL_OK, "backward: %s", dl_error_message(ctx));
    CHECK(dl_summary_graph(w, loss) == DL_OK, "graph after backward: %s", dl_error_message(ctx));
    buf = w ? slurp(dl_summary_path(w), &n) : NULL;
    nr = buf ? read_records(buf, n, r, 4, &st) : 0;
    CHECK(nr == 2 && pb_get(r[1].p, r[1].len, 4, 0, &f), "graph record");
    if (nr == 2) {
        int nn = parse_graph(f.p, f.len, gn, 400);
        const gnode *c = find_node(gn, nn, "dl_cat_0");
        CHECK(nn == 1 + 300 + 2, "303 nodes: %d", nn);
        CHECK(c && c->nin == 40 && !strcmp(c->in[0], "Parameter_0") && !strcmp(c->in[1], "dl_tanh_299") &&
              c->ndim == 2 && c->dims[0] == 80, "dl_cat_0: 40 inputs, (80,3)");
        CHECK(find_node(gn, nn, "dl_tanh_0") && !strcmp(find_node(gn, nn, "dl_tanh_0")->in[0], "Parameter_0"),
              "dl_tanh_0(Parameter_0)");
    }
    free(buf);
    free(gn);
    dl_ctx_free(ctx);
}

/* a capture's loss after dl_step_end: its graph is no longer on the tape,
   and both writers still walk all of it (they used to size their walk by
   the tape, dropping nodes: one node of eleven, with DL_OK) */
static dl_tensor *two_branches(dl_tensor *x, dl_tensor *w1, dl_tensor *w2)
{
    dl_tensor *a = dl_relu(dl_matmul(x, w1)), *b = dl_tanh(dl_matmul(x, w2));
    return dl_sum(dl_add(dl_mul(a, b), dl_sigmoid(b)), DL_ALL, false);
}
static void test_graph_after_capture(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL);
    dl_summary_writer *w = dl_summary_open(ctx, DIR_ "/captured");
    dl_tensor *w1 = dl_param(dl_randn(ctx, DL_SHAPE(4, 4))), *w2 = dl_param(dl_randn(ctx, DL_SHAPE(4, 4)));
    dl_tensor *x = dl_keep(dl_randn(ctx, DL_SHAPE(2, 4))), *l;
    dl_capture *cap;
    unsigned char *buf, *d1, *d2;
    size_t n, n1, n2;
    rec r[4];
    pbf f1, f2;
    gnode *gn = (gnode *)malloc(sizeof(gnode) * 64);
    int st, nr, k1 = 0, k2 = 0;
    CHECK(dl_backward(two_branches(x, w1, w2)) == DL_OK, "warm-up step (makes the gradients)");
    dl_step_end(ctx);
    cap = dl_capture_begin(ctx);
    l = two_branches(x, w1, w2);
    CHECK(dl_graph_dot(l, DIR_ "/captured/in.dot") == DL_OK && dl_summary_graph(w, l) == DL_OK, "in the capture");
    CHECK(dl_backward(l) == DL_OK && dl_capture_end(cap) == DL_OK, "capture: %s", dl_error_message(ctx));
    dl_step_end(ctx);
    CHECK(dl_replay(cap) == DL_OK, "replay");
    CHECK(dl_graph_dot(l, DIR_ "/captured/after.dot") == DL_OK && dl_summary_graph(w, l) == DL_OK, "after");
    buf = w ? slurp(dl_summary_path(w), &n) : NULL;
    nr = buf ? read_records(buf, n, r, 4, &st) : 0;
    CHECK(nr == 3 && pb_get(r[1].p, r[1].len, 4, 0, &f1) && pb_get(r[2].p, r[2].len, 4, 0, &f2), "two graphs");
    if (nr == 3) {
        k1 = parse_graph(f1.p, f1.len, gn, 64);
        k2 = parse_graph(f2.p, f2.len, gn, 64);
    }
    CHECK(k1 == 11 && k2 == 11, "the whole graph both times: %d, %d nodes", k1, k2);
    d1 = slurp(DIR_ "/captured/in.dot", &n1);
    d2 = slurp(DIR_ "/captured/after.dot", &n2);
    CHECK(d1 && d2 && n1 == n2, "the same dot file both times (%zu, %zu bytes)", n1, n2);
    free(d1);
    free(d2);
    free(buf);
    free(gn);
    dl_capture_free(cap);
    dl_ctx_free(ctx);
}

/* ------------------------------------------------------------- 4. errors */
static void test_errors(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL), *other = dl_ctx_init(NULL);
    dl_summary_writer *w;
    dl_tensor *t;
    long before;
    float nanv[3];
    int lost = 0;
    dl_set_log(ctx, dl_log_silent, NULL);
    CHECK(dl_summary_open(NULL, DIR_) == NULL, "NULL ctx");
    CHECK(dl_summary_open(ctx, NULL) == NULL, "NULL logdir");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_open: logdir is NULL");
    CHECK(dl_summary_open(ctx, "") == NULL, "empty logdir");
    EXPECT_ERR(ctx, DL_ERR_ARG, "logdir is empty");
    /* a logdir that is a file, or under a file */
    spit(DIR_ "/afile", (const unsigned char *)"x", 1);
    CHECK(dl_summary_open(ctx, DIR_ "/afile") == NULL, "logdir is a file");
    EXPECT_ERR(ctx, DL_ERR_IO, DIR_ "/afile exists and is not a directory");
    CHECK(dl_summary_open(ctx, DIR_ "/afile/sub") == NULL, "logdir under a file");
    EXPECT_ERR(ctx, DL_ERR_IO, "cannot create the log directory " DIR_ "/afile/sub: Not a directory");
    if (geteuid() != 0) {   /* root writes anywhere */
        mkdir(DIR_ "/ro", 0555);
        chmod(DIR_ "/ro", 0555);
        CHECK(dl_summary_open(ctx, DIR_ "/ro") == NULL, "read-only logdir");
        EXPECT_ERR(ctx, DL_ERR_IO, "cannot create " DIR_ "/ro/events.out.tfevents.");
        CHECK(dl_summary_open(ctx, DIR_ "/ro/deeper") == NULL, "under a read-only dir");
        EXPECT_ERR(ctx, DL_ERR_IO, "Permission denied");
    }

    w = dl_summary_open(ctx, DIR_ "/errors");
    CHECK(w != NULL, "open: %s", dl_error_message(ctx));
    if (!w) { dl_ctx_free(ctx); dl_ctx_free(other); return; }
    /* bad arguments */
    CHECK(dl_summary_scalar(NULL, "a", 0, 1) == DL_ERR_ARG, "NULL writer");
    CHECK(dl_summary_scalar(w, NULL, 0, 1) == DL_ERR_ARG, "NULL tag");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_scalar: tag is NULL");
    CHECK(dl_summary_histogram(w, "", 0, NULL) == DL_ERR_ARG, "empty tag");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_histogram: tag is empty");
    CHECK(dl_summary_histogram(w, "h", 0, NULL) == DL_ERR_ARG && dl_last_error(ctx) == DL_OK, "NULL tensor: silent");
    CHECK(dl_summary_histogram(w, "h", 0, dl_zeros(ctx, DL_SHAPE(0))) == DL_ERR_ARG, "empty tensor");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_histogram: t (0) has no elements");
    nanv[0] = 1; nanv[1] = NAN; nanv[2] = 2;
    CHECK(dl_summary_histogram(w, "h", 0, dl_from_array(ctx, DL_SHAPE(3), nanv)) == DL_ERR_NAN, "NaN");
    EXPECT_ERR(ctx, DL_ERR_NAN, "dl_summary_histogram: t (3) has NaN at index 1");
    nanv[1] = INFINITY;
    CHECK(dl_summary_histogram(w, "h", 0, dl_from_array(ctx, DL_SHAPE(3), nanv)) == DL_ERR_NAN, "Inf");
    EXPECT_ERR(ctx, DL_ERR_NAN, "has Inf at index 1");
    CHECK(dl_summary_histogram(w, "h", 0, dl_ones(other, DL_SHAPE(3))) == DL_ERR_ARG, "other context");
    EXPECT_ERR(ctx, DL_ERR_ARG, "belongs to another context");
    t = dl_ones(ctx, DL_SHAPE(2, 3));
    dl_step_end(ctx);
    CHECK(dl_summary_histogram(w, "h", 0, t) == DL_ERR_STALE, "stale tensor");
    EXPECT_ERR(ctx, DL_ERR_STALE, "dl_summary_histogram: t (2,3)");
    CHECK(dl_summary_image(w, "i", 0, dl_ones(ctx, DL_SHAPE(4, 4))) == DL_ERR_SHAPE, "2-d image");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "dl_summary_image: img (4,4) must be (C,H,W) or (N,C,H,W)");
    CHECK(dl_summary_image(w, "i", 0, dl_ones(ctx, DL_SHAPE(2, 4, 4))) == DL_ERR_SHAPE, "2 channels");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "has 2 channels");
    CHECK(dl_summary_image(w, "i", 0, dl_ones(ctx, DL_SHAPE(0, 3, 4, 4))) == DL_ERR_SHAPE, "no images");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "is empty");
    CHECK(dl_summary_graph(w, NULL) == DL_ERR_ARG, "graph of NULL");
    CHECK(dl_summary_flush(NULL) == DL_ERR_ARG && dl_summary_close(NULL) == DL_OK, "flush/close NULL");

    /* a full disk: the writer's descriptor pointed at /dev/full */
    before = file_size(dl_summary_path(w));
    {
        int full = open("/dev/full", O_WRONLY), saved = dup(w->fd);
        if (full >= 0 && saved >= 0) {
            dl_result rc;
            dup2(full, w->fd);
            rc = dl_summary_scalar(w, "s", 1, 1.0);
            CHECK(rc == DL_ERR_IO && strstr(dl_error_message(ctx), "No space left on device"),
                  "full disk: %s", dl_error_message(ctx));
            EXPECT_ERR(ctx, DL_ERR_IO, "dl_summary_scalar: writing " DIR_ "/errors/events.out.tfevents.");
            dup2(saved, w->fd);
            close(full);
            close(saved);
            CHECK(file_size(dl_summary_path(w)) == before, "nothing of it in the file");
            lost++;
            CHECK(dl_summary_scalar(w, "s", 2, 2.0) == DL_OK, "space again: writes go on");
        } else {
            th_skip++;
            printf("SKIP /dev/full: not available\n");
        }
    }
    /* a write cut short (file size limit): the partial record is cut off */
    {
        struct rlimit old, lim;
        long sz = file_size(dl_summary_path(w));
        unsigned char *buf;
        size_t n;
        rec r[16];
        int st, nr;
        signal(SIGXFSZ, SIG_IGN);
        if (getrlimit(RLIMIT_FSIZE, &old) == 0) {
            lim = old;
            lim.rlim_cur = (rlim_t)sz + 10;
            if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
                dl_result rc = dl_summary_scalar(w, "s", 3, 3.0);
                setrlimit(RLIMIT_FSIZE, &old);
                CHECK(rc == DL_ERR_IO, "write over the size limit fails");
                lost++;
                EXPECT_ERR(ctx, DL_ERR_IO, "the file keeps every record written before");
                CHECK(file_size(dl_summary_path(w)) == sz, "the 10 bytes written are cut off again");
                CHECK(dl_summary_scalar(w, "s", 4, 4.0) == DL_OK, "later writes go on");
                buf = slurp(dl_summary_path(w), &n);
                nr = read_records(buf, n, r, 16, &st);
                CHECK(nr == 3 && st == REC_END, "file reads whole: %d records, status %d", nr, st);
                free(buf);
            } else {
                th_skip++;
                printf("SKIP RLIMIT_FSIZE: cannot set\n");
            }
        }
        signal(SIGXFSZ, SIG_DFL);
    }
    /* records were lost above: flush (and close) say so every time, not
       only the call that lost them (a loop that checks only close) */
    if (lost > 0) {
        char want[128];
        snprintf(want, sizeof want, "dl_summary_flush: %d record%s could not be written to " DIR_ "/errors/", lost,
                 lost == 1 ? "" : "s");
        CHECK(dl_summary_flush(w) == DL_ERR_IO, "flush after lost records");
        EXPECT_ERR(ctx, DL_ERR_IO, want);
        CHECK(dl_summary_flush(w) == DL_ERR_IO, "and again");
        CHECK(dl_summary_scalar(w, "s", 5, 5.0) == DL_OK, "writes still go on");
    }
    /* a writer the context closes: its records are in the file */
    {
        dl_summary_writer *w2 = dl_summary_open(ctx, DIR_ "/errors");
        char p2[512];
        unsigned char *buf;
        size_t n;
        rec r[4];
        int st;
        CHECK(w2 && strcmp(dl_summary_path(w2), dl_summary_path(w)) != 0, "two writers, two files");
        snprintf(p2, sizeof p2, "%s", w2 ? dl_summary_path(w2) : "");
        dl_summary_scalar(w2, "s", 1, 5.0);
        dl_ctx_free(ctx);                     /* closes w and w2 */
        buf = slurp(p2, &n);
        CHECK(read_records(buf, n, r, 4, &st) == 2 && st == REC_END, "dl_ctx_free closed the writer");
        free(buf);
    }
    dl_ctx_free(other);
}

/* dl_summary_scalar_tensor where the value is in host memory (cpu:0, and
   cpu:1 in make test's strict pass): read and written at once, in order with
   dl_summary_scalar's; its refusals (tests/test_cuda.c: the GPU's queue) */
static void test_scalar_tensor(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL), *other = dl_ctx_init(NULL);
    dl_summary_writer *w;
    static const float two[2] = {0.25f, 0.125f};
    static const int64_t iv[1] = {3};
    dl_tensor *loss;
    dl_capture *cap;
    unsigned char *buf;
    size_t n;
    rec r[8];
    int st, nr;
    int64_t step;
    pbf tag;
    float v;
    double wall;
    dl_set_log(ctx, dl_log_silent, NULL);
    w = dl_summary_open(ctx, DIR_ "/scalar_tensor");
    CHECK(w != NULL, "open: %s", dl_error_message(ctx));
    if (!w) { dl_ctx_free(ctx); dl_ctx_free(other); return; }
    loss = dl_sum(dl_from_array(ctx, DL_SHAPE(2), two), DL_ALL, false);   /* 0-d: 0.375 */
    CHECK(dl_summary_scalar_tensor(w, "train/loss", 3, loss) == DL_OK, "a 0-d tensor: %s", dl_error_message(ctx));
    CHECK(dl_summary_scalar(w, "train/lr", 3, 0.5) == DL_OK, "then a host scalar");
    CHECK(dl_summary_scalar_tensor(w, "one", 4, dl_from_array(ctx, DL_SHAPE(1, 1), two)) == DL_OK,
          "a (1,1) tensor");
    buf = slurp(dl_summary_path(w), &n);   /* before any flush or close */
    nr = read_records(buf, n, r, 8, &st);
    CHECK(nr == 4 && st == REC_END, "host memory: written at once, %d records", nr);
    CHECK(nr == 4 && pb_scalar(&r[1], &step, &tag, &v, &wall) && step == 3 && pb_streq(&tag, "train/loss") &&
          v == 0.375f && wall > 1.6e9, "the tensor's value, step and tag");
    CHECK(nr == 4 && pb_scalar(&r[2], &step, &tag, &v, &wall) && pb_streq(&tag, "train/lr") && v == 0.5f &&
          pb_scalar(&r[3], &step, &tag, &v, &wall) && step == 4 && v == 0.25f, "in call order");
    free(buf);
    /* refusals: nothing written */
    CHECK(dl_summary_scalar_tensor(w, "l", 0, dl_from_int64(ctx, DL_SHAPE(1), iv)) == DL_ERR_DTYPE, "int64");
    EXPECT_ERR(ctx, DL_ERR_DTYPE, "dl_summary_scalar_tensor: t int64 (1): the value must be a tensor of one "
               "float32 element (tag \"l\")");
    CHECK(dl_summary_scalar_tensor(w, "l", 0, dl_from_array(ctx, DL_SHAPE(2), two)) == DL_ERR_SHAPE, "2 elements");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "dl_summary_scalar_tensor: t float32 (2): the value must be a tensor of one");
    CHECK(dl_summary_scalar_tensor(w, "l", 0, NULL) == DL_ERR_ARG, "NULL tensor");
    CHECK(dl_summary_scalar_tensor(w, NULL, 0, loss) == DL_ERR_ARG, "NULL tag");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_scalar_tensor: tag is NULL");
    CHECK(dl_summary_scalar_tensor(NULL, "l", 0, loss) == DL_ERR_ARG, "NULL writer");
    CHECK(dl_summary_scalar_tensor(w, "l", 0, dl_ones(other, DL_SHAPE(1))) == DL_ERR_ARG, "another context");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_scalar_tensor: t (1) belongs to another context");
    dl_step_end(ctx);
    CHECK(dl_summary_scalar_tensor(w, "l", 0, loss) == DL_ERR_STALE, "a tensor of an ended step");
    EXPECT_ERR(ctx, DL_ERR_STALE, "dl_summary_scalar_tensor: t ()");
    loss = dl_keep(dl_full(ctx, DL_SHAPE(1), 2.0f));
    cap = dl_capture_begin(ctx);
    CHECK(dl_summary_scalar_tensor(w, "l", 0, loss) == DL_ERR_UNSUPPORTED, "inside a capture: refused");
    EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "dl_summary_scalar_tensor: a read to the host inside a capture");
    CHECK(dl_capture_end(cap) == DL_ERR_UNSUPPORTED, "the capture ends with the refusal");
    dl_capture_free(cap);
    CHECK(dl_summary_scalar_tensor(w, "l", 5, loss) == DL_OK, "after the capture: %s", dl_error_message(ctx));
    buf = slurp(dl_summary_path(w), &n);
    nr = read_records(buf, n, r, 8, &st);
    CHECK(nr == 5 && st == REC_END && pb_scalar(&r[4], &step, &tag, &v, &wall) && step == 5 && v == 2.0f,
          "the refused calls wrote nothing: %d records", nr);
    free(buf);
    CHECK(dl_summary_close(w) == DL_OK, "close");
    dl_ctx_free(ctx);
    dl_ctx_free(other);
}

/* tests/tb_check.py reads the file an expectations file names with
   TensorBoard's own loader (skipped without the tensorboard package) */
static void tb_check(const char *expect)
{
    char cmd[512];
    if (system("python3 -c 'import tensorboard' >/dev/null 2>&1") != 0) {
        printf("SKIP tensorboard reader: python package tensorboard not installed (pip install tensorboard)\n");
        th_skip++;
        return;
    }
    fflush(stdout);
    snprintf(cmd, sizeof cmd, "python3 tests/tb_check.py %s", expect);
    CHECK(system(cmd) == 0, "tests/tb_check.py (TensorBoard's loader) on %s", expect);
}

/* ------------------------------------------- tags that are not UTF-8 */
/* Summary.Value.tag is a protobuf string: a record whose tag is not UTF-8
   is refused (before the fix it was written, and TensorBoard's reader then
   showed nothing after it); UTF-8 tags, multi-byte too, are written */
static void test_utf8_tags(void)
{
    dl_ctx_desc d;
    dl_ctx *ctx;
    dl_summary_writer *w;
    FILE *ex;
    static const float hv[] = {1.0f, 2.0f, 3.0f};
    static const struct { const char *tag, *msg; } bad[] = {
        {"bad\xff", "(byte 0xff at offset 3)"},
        {"\xc0\xaf", "(byte 0xc0 at offset 0)"},          /* overlong '/' */
        {"s\xed\xa0\x80", "(byte 0xed at offset 1)"},     /* a surrogate, U+D800 */
        {"t\xe2\x82", "(byte 0xe2 at offset 1)"},         /* cut short */
        {"\xf4\x90\x80\x80", "(byte 0xf4 at offset 0)"},  /* above U+10FFFF */
        {"\x80x", "(byte 0x80 at offset 0)"}};            /* a lone continuation byte */
    size_t i;
    unsigned char *buf;
    size_t n;
    rec r[16];
    int st;
    dl_tensor *t;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    ctx = dl_ctx_init(&d);
    w = dl_summary_open(ctx, DIR_ "/utf8");
    CHECK(w != NULL, "open: %s", dl_error_message(ctx));
    if (!w) { dl_ctx_free(ctx); return; }
    t = dl_from_array(ctx, DL_SHAPE(3), hv);
    ex = fopen(DIR_ "/expect_utf8.txt", "w");
    fprintf(ex, "file %s\n", dl_summary_path(w));
    CHECK(dl_summary_scalar(w, "a", 1, 1.0) == DL_OK, "scalar a");
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(dl_summary_scalar(w, bad[i].tag, 2, 2.0) == DL_ERR_ARG, "tag %d refused", (int)i);
        EXPECT_ERR(ctx, DL_ERR_ARG, bad[i].msg);
    }
    CHECK(dl_summary_histogram(w, "h\xff", 2, t) == DL_ERR_ARG, "histogram tag refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_histogram: tag is not valid UTF-8 (byte 0xff at offset 1)");
    CHECK(dl_summary_image(w, "i\xfe", 2, t) == DL_ERR_ARG, "image tag refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_summary_image: tag is not valid UTF-8");
    CHECK(dl_summary_scalar(w, "loss/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 3, 3.0) == DL_OK,
          "a UTF-8 tag (2, 3 and 4 bytes): %s", dl_error_message(ctx));
    CHECK(dl_summary_scalar(w, "b", 4, 4.0) == DL_OK, "scalar b");
    CHECK(dl_summary_histogram(w, "h", 5, t) == DL_OK, "histogram h");
    fprintf(ex, "scalar a 1 1\nscalar loss/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 3 3\nscalar b 4 4\nhisto h 5 1 2 3\n");
    fclose(ex);
    buf = slurp(dl_summary_path(w), &n);
    CHECK(read_records(buf, n, r, 16, &st) == 5 && st == REC_END, "5 records: file_version, 3 scalars, 1 histogram");
    free(buf);
    dl_ctx_free(ctx);
    tb_check(DIR_ "/expect_utf8.txt");   /* every record after the refused tags */
}

/* ------------------------------------------------------- 5. TensorBoard */
static void test_tensorboard_reader(void) { tb_check(DIR_ "/expect.txt"); }

int main(void)
{
    if (system("rm -rf " DIR_ " && mkdir -p " DIR_) != 0) printf("cannot reset " DIR_ "\n");
    test_checksums();
    test_protobuf();
    test_png();
    test_round_trip();
    test_graph_after_backward();
    test_graph_after_capture();
    test_errors();
    test_scalar_tensor();
    test_tensorboard_reader();
    test_utf8_tags();
    if (th_skip) {
        printf("%d passed, %d failed, %d skipped\n", th_pass, th_fail, th_skip);
        return th_fail ? 1 : 0;
    }
    TEST_END();
}
