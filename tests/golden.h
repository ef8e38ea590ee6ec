/* tests/golden.h - reads the PyTorch golden files (tests/golden/NAME.bin, made
   by the gen*.py scripts) and compares dl.h tensors with their records.
   Format: magic "DLGOLD1\0", uint32 version 1, uint32 record count, then per
   record: uint32 name length, name, uint32 ndim, ndim x int64 shape, float32
   values (little-endian). Include after dl.h and harness.h. */
#ifndef DL_TEST_GOLDEN_H
#define DL_TEST_GOLDEN_H
#include <stdlib.h>
#if defined(__GNUC__)
#define G_UNUSED __attribute__((unused))
#else
#define G_UNUSED
#endif
#ifndef G_MAXIN
#define G_MAXIN 8
#endif
#define G_RTOL 1e-4
#define G_ATOL 1e-5
typedef struct grec {
    char *name;
    int ndim;
    int64_t shape[DL_MAX_DIMS];
    int64_t numel;
    float *v;
} grec;

static G_UNUSED grec *g_recs;
static G_UNUSED long g_nrec;
static G_UNUSED dl_ctx *g_ctx;

/* ------------------------------------------------------------------ loading */

static G_UNUSED int g_u32(const unsigned char *b, size_t len, size_t *pos, uint32_t *out)
{
    if (len - *pos < 4) return 0;
    *out = (uint32_t)b[*pos] | ((uint32_t)b[*pos + 1] << 8) | ((uint32_t)b[*pos + 2] << 16) |
           ((uint32_t)b[*pos + 3] << 24);
    *pos += 4;
    return 1;
}

static G_UNUSED int g_i64(const unsigned char *b, size_t len, size_t *pos, int64_t *out)
{
    uint32_t lo = 0, hi = 0;   /* set by g_u32: 8 bytes are there */
    uint64_t u;
    if (len - *pos < 8) return 0;
    g_u32(b, len, pos, &lo);
    g_u32(b, len, pos, &hi);
    u = (uint64_t)lo | ((uint64_t)hi << 32);
    memcpy(out, &u, sizeof u);
    return 1;
}

static G_UNUSED void g_free_recs(void)
{
    long i;
    for (i = 0; i < g_nrec; i++) { free(g_recs[i].name); free(g_recs[i].v); }
    free(g_recs);
    g_recs = NULL;
    g_nrec = 0;
}

/* returns 1 on success; on failure prints why and returns 0 */
static G_UNUSED int g_load(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t len = 0, pos = 0, got;
    long sz;
    uint32_t version, count, i;
    if (!f) { printf("ERROR: cannot open golden file %s (run from the repo root, or "
                     "regenerate it with python3 tests/golden/gen.py)\n", path); return 0; }
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        printf("ERROR: cannot determine the size of %s\n", path);
        fclose(f);
        return 0;
    }
    len = (size_t)sz;
    buf = (unsigned char *)malloc(len ? len : 1);
    if (!buf) { printf("ERROR: out of memory reading %s\n", path); fclose(f); return 0; }
    got = fread(buf, 1, len, f);
    fclose(f);
    if (got != len) { printf("ERROR: short read on %s\n", path); free(buf); return 0; }
    if (len < 16 || memcmp(buf, "DLGOLD1\0", 8) != 0) {
        printf("ERROR: %s is not a golden file (bad magic or shorter than its header)\n", path);
        free(buf);
        return 0;
    }
    pos = 8;
    g_u32(buf, len, &pos, &version);
    g_u32(buf, len, &pos, &count);
    if (version != 1) {
        printf("ERROR: %s has format version %u; this test reads version 1\n", path, (unsigned)version);
        free(buf);
        return 0;
    }
    /* every record needs at least 12 bytes: this bounds count before allocating */
    if (count > (len - pos) / 12 + 1) {
        printf("ERROR: %s claims %u records but has only %lu bytes (truncated?)\n", path,
               (unsigned)count, (unsigned long)len);
        free(buf);
        return 0;
    }
    g_recs = (grec *)calloc(count ? count : 1, sizeof(grec));
    if (!g_recs) { printf("ERROR: out of memory\n"); free(buf); return 0; }
    for (i = 0; i < count; i++) {
        grec *r = &g_recs[i];
        uint32_t nlen, nd, k;
        int64_t numel = 1;
        size_t j;
        if (!g_u32(buf, len, &pos, &nlen) || nlen == 0 || nlen > 512 || len - pos < nlen) {
            printf("ERROR: %s: record %u: bad or truncated name (offset %lu)\n", path,
                   (unsigned)i, (unsigned long)pos);
            goto fail;
        }
        r->name = (char *)malloc(nlen + 1);
        if (!r->name) goto oom;
        g_nrec = (long)i + 1;
        memcpy(r->name, buf + pos, nlen);
        r->name[nlen] = 0;
        pos += nlen;
        if (strlen(r->name) != nlen) {
            printf("ERROR: %s: record %u: name contains a NUL byte\n", path, (unsigned)i);
            goto fail;
        }
        if (!g_u32(buf, len, &pos, &nd) || nd > DL_MAX_DIMS) {
            printf("ERROR: %s: record %s: bad or truncated ndim\n", path, r->name);
            goto fail;
        }
        r->ndim = (int)nd;
        for (k = 0; k < nd; k++) {
            if (!g_i64(buf, len, &pos, &r->shape[k]) || r->shape[k] < 0) {
                printf("ERROR: %s: record %s: bad or truncated shape\n", path, r->name);
                goto fail;
            }
            if (r->shape[k] && numel > (int64_t)((len - pos) / 4) / r->shape[k] + 1) {
                printf("ERROR: %s: record %s: shape larger than the file (truncated?)\n", path, r->name);
                goto fail;
            }
            numel *= r->shape[k];
        }
        r->numel = numel;
        if ((uint64_t)numel > (uint64_t)((len - pos) / 4)) {
            printf("ERROR: %s: record %s: needs %lld values but only %lu bytes are left "
                   "(truncated?)\n", path, r->name, (long long)numel, (unsigned long)(len - pos));
            goto fail;
        }
        r->v = (float *)malloc((size_t)(numel ? numel : 1) * sizeof(float));
        if (!r->v) goto oom;
        for (j = 0; j < (size_t)numel; j++) {
            uint32_t u = 0;   /* (set by g_u32: the bytes are there) */
            g_u32(buf, len, &pos, &u);
            memcpy(&r->v[j], &u, sizeof u);
        }
    }
    if (pos != len) {
        printf("ERROR: %s: %lu trailing bytes after %u records\n", path,
               (unsigned long)(len - pos), (unsigned)count);
        goto fail;
    }
    free(buf);
    return 1;
oom:
    printf("ERROR: out of memory\n");
fail:
    free(buf);
    g_free_recs();
    return 0;
}

/* ------------------------------------------------------------------ helpers */

static G_UNUSED const char *g_field(const grec *r) { const char *s = strrchr(r->name, '/'); return s ? s + 1 : r->name; }

static G_UNUSED size_t g_prefix_len(const grec *r)
{
    const char *s = strrchr(r->name, '/');
    return s ? (size_t)(s - r->name) : 0;
}

static G_UNUSED const char *g_shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    int i;
    size_t k;
    buf[0] = 0;
    snprintf(buf, n, "(");
    for (i = 0; i < ndim; i++) {
        k = strlen(buf);
        snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    }
    k = strlen(buf);
    snprintf(buf + k, n - k, ")");
    return buf;
}

static G_UNUSED int g_same_shape(const dl_tensor *t, const grec *r)
{
    int i;
    if (t->ndim != r->ndim) return 0;
    for (i = 0; i < r->ndim; i++) if (t->shape[i] != r->shape[i]) return 0;
    return 1;
}

/* compare t (NULL: zeros) with r; one CHECK for the shape, one for the values */
static G_UNUSED void g_compare(const char *cname, const char *what, dl_tensor *t, const grec *r)
{
    char s1[128], s2[128];
    float *got;
    int64_t i, worst = -1, nbad = 0;
    double wexcess = -1.0;
    if (t) {
        int ok = g_same_shape(t, r);
        CHECK(ok, "%s %s: shape %s, torch %s", cname, what, g_shape_str(t->ndim, t->shape, s1, sizeof s1),
              g_shape_str(r->ndim, r->shape, s2, sizeof s2));
        if (!ok) return;
        if (t->dtype != DL_DTYPE_F32) { CHECK(0, "%s %s: dtype %d, want float32", cname, what, (int)t->dtype); return; }
    }
    got = (float *)calloc((size_t)(r->numel ? r->numel : 1), sizeof(float));
    if (!got) { CHECK(0, "%s %s: out of memory", cname, what); return; }
    if (t && dl_read(t, got, r->numel) != DL_OK) {
        CHECK(0, "%s %s: dl_read failed: %s", cname, what, dl_error_message(g_ctx));
        dl_clear_error(g_ctx);
        free(got);
        return;
    }
    {   /* the harness's rule decides, where torch's value is not NaN (there dl's must be NaN);
           the loop below finds the worst element for the message */
        long where = -1;
        if (th_close_nan(got, r->v, (long)r->numel, G_RTOL, G_ATOL, &where)) {
            CHECK(1, "%s %s", cname, what);
            free(got);
            return;
        }
    }
    for (i = 0; i < r->numel; i++) {
        double a = got[i], b = r->v[i], d = fabs(a - b);
        double ex = d - (G_ATOL + G_RTOL * fabs(b));
        if (b != b) ex = a != a ? -1.0 : 1e300;
        else if (a != a) ex = 1e300;
        else if (isinf(a) || isinf(b)) ex = a == b ? -1.0 : 1e300;   /* (an infinity: the same one) */
        if (ex > 0) nbad++;
        if (ex > wexcess) { wexcess = ex; worst = i; }
    }
    CHECK(nbad == 0, "%s %s%s: %lld of %lld elements off; worst [%lld] (shape %s): dl %.9g, torch %.9g "
          "(abs err %.3g)", cname, what, t ? "" : " (dl_grad gave NULL: zeros)", (long long)nbad,
          (long long)r->numel, (long long)worst, g_shape_str(r->ndim, r->shape, s1, sizeof s1),
          (double)got[worst < 0 ? 0 : worst], (double)r->v[worst < 0 ? 0 : worst],
          worst < 0 ? 0.0 : fabs((double)got[worst] - (double)r->v[worst]));
    free(got);
}

static G_UNUSED void g_compare_i64(const char *cname, dl_tensor *t, const grec *r)
{
    char s1[128], s2[128];
    int64_t *got, i, bad = -1;
    int ok = g_same_shape(t, r);
    CHECK(ok, "%s out: shape %s, torch %s", cname, g_shape_str(t->ndim, t->shape, s1, sizeof s1),
          g_shape_str(r->ndim, r->shape, s2, sizeof s2));
    if (!ok) return;
    CHECK(t->dtype == DL_DTYPE_I64, "%s out: dtype %d, want int64", cname, (int)t->dtype);
    if (t->dtype != DL_DTYPE_I64) return;
    got = (int64_t *)calloc((size_t)(r->numel ? r->numel : 1), sizeof(int64_t));
    if (!got) { CHECK(0, "%s: out of memory", cname); return; }
    if (dl_read_int64(t, got, r->numel) != DL_OK) {
        CHECK(0, "%s out: dl_read_int64 failed: %s", cname, dl_error_message(g_ctx));
        dl_clear_error(g_ctx);
        free(got);
        return;
    }
    for (i = 0; i < r->numel && bad < 0; i++) if (got[i] != (int64_t)r->v[i]) bad = i;
    CHECK(bad < 0, "%s out: index [%lld]: dl %lld, torch %lld", cname, (long long)bad,
          (long long)(bad < 0 ? 0 : got[bad]), (long long)(bad < 0 ? 0 : (int64_t)r->v[bad]));
    free(got);
}
/* ------------------------------------------------------------ running cases */
/* Each test defines how to run an op from its records: the inputs as
   tensors (in) and records (rs), the "params" record p; *bad names a
   malformed case. */
static dl_tensor *g_run(const char *op, int n, const grec *const *rs, dl_tensor **in,
                        const grec *p, const char **bad);

static G_UNUSED const grec *g_find(long lo, long hi, const char *prefix, const char *field)
{
    long i;
    for (i = lo; i < hi; i++) {
        const char *f = g_field(&g_recs[i]);
        if (!strncmp(f, prefix, strlen(prefix)) && !strcmp(f + strlen(prefix), field)) return &g_recs[i];
    }
    return NULL;
}

static G_UNUSED int g_is_input(const char *f)
{
    return strcmp(f, "params") && strcmp(f, "gout") && strcmp(f, "out") && strncmp(f, "grad_", 5) &&
           strncmp(f, "v_", 2) && strncmp(f, "hv_", 3) && strncmp(f, "after_", 6) && strcmp(f, "greq");
}

/* cases with double backward; records of in-place updates checked */
static G_UNUSED int g_n_dd, g_n_after;

/* The second order of a case whose first gradients grads[k] (of req[k],
   records named names[k]) were taken with create_graph: which of them
   carry history in PyTorch (its greq record, where the file has it:
   torch.autograd.grad(..., create_graph=True) .requires_grad, so which
   second derivatives exist there), then dl_grad of sum_k sum(grads[k] *
   v_<name>) against hv_<name>. */
#define G_MAXREQ 64
static G_UNUSED void g_second_order(const char *cname, long lo, long hi, int nreq, dl_tensor **req,
                                    dl_tensor **grads, const char *const *names)
{
    const grec *greq = g_find(lo, hi, "", "greq"), *v_r[G_MAXREQ], *hv_r[G_MAXREQ];
    dl_tensor *hv[G_MAXREQ], *s2 = NULL;
    char what[96];
    dl_result rc;
    int k;
    if (nreq > G_MAXREQ) { CHECK(0, "%s: over %d inputs for a second order", cname, G_MAXREQ); return; }
    for (k = 0; greq && k < nreq && k < greq->numel; k++) {
        bool want = greq->v[k] != 0.0f, got = grads[k] && grads[k]->requires_grad;
        CHECK(got == want, "%s: the first gradient of %s %s history, PyTorch's %s", cname, names[k],
              got ? "carries" : "carries no", want ? "does" : "does not");
    }
    for (k = 0; k < nreq; k++) {
        dl_tensor *vk, *term;
        v_r[k] = g_find(lo, hi, "v_", names[k]);
        hv_r[k] = g_find(lo, hi, "hv_", names[k]);
        if (!v_r[k] || !hv_r[k]) { CHECK(0, "%s: v_/hv_ record missing for %s", cname, names[k]); return; }
        if (!grads[k] || !grads[k]->requires_grad) continue;
        vk = dl_from_array(g_ctx, dl_shape_make(v_r[k]->ndim, v_r[k]->shape), v_r[k]->v);
        term = dl_sum(dl_mul(grads[k], vk), DL_ALL, false);
        s2 = s2 ? dl_add(s2, term) : term;
        if (!s2) break;
    }
    for (k = 0; k < nreq; k++) hv[k] = NULL;
    if (s2) {
        rc = dl_grad(s2, nreq, req, hv, NULL);
        CHECK(rc == DL_OK, "%s: second dl_grad failed: %s: %s", cname, dl_result_string(rc),
              dl_error_message(g_ctx));
        if (rc != DL_OK) { dl_clear_error(g_ctx); return; }
    } else if (dl_last_error(g_ctx) != DL_OK) {
        CHECK(0, "%s: building sum(grad * v) failed: %s", cname, dl_error_message(g_ctx));
        dl_clear_error(g_ctx);
        return;
    }
    for (k = 0; k < nreq; k++) {
        snprintf(what, sizeof what, "hv_%s", names[k]);
        g_compare(cname, what, hv[k], hv_r[k]);
    }
}

static G_UNUSED void g_case(long lo, long hi, int *ncases)
{
    char cname[256], op[64], what[96];
    const grec *in_r[G_MAXIN], *params, *gout_r, *out_r;
    const grec *grad_r[G_MAXIN];
    dl_tensor *in[G_MAXIN], *req[G_MAXIN], *grads[G_MAXIN], *out;
    const char *names[G_MAXIN];
    int nin = 0, nreq = 0, k, dd = 0;
    long i;
    size_t pl = g_prefix_len(&g_recs[lo]);
    const char *bad = NULL;
    if (pl >= sizeof cname) pl = sizeof cname - 1;
    memcpy(cname, g_recs[lo].name, pl);
    cname[pl] = 0;
    {
        const char *s = strchr(cname, '/');
        size_t ol = s ? (size_t)(s - cname) : strlen(cname);
        if (ol >= sizeof op) ol = sizeof op - 1;
        memcpy(op, cname, ol);
        op[ol] = 0;
    }
    (*ncases)++;
    for (i = lo; i < hi; i++) {
        if (!g_is_input(g_field(&g_recs[i]))) continue;
        if (nin == G_MAXIN) { CHECK(0, "%s: too many inputs", cname); return; }
        in_r[nin++] = &g_recs[i];
    }
    params = g_find(lo, hi, "", "params");
    gout_r = g_find(lo, hi, "", "gout");
    out_r = g_find(lo, hi, "", "out");
    if (!out_r) { CHECK(0, "%s: the golden file has no out record", cname); return; }
    for (k = 0; k < nin; k++) {
        const char *f = g_field(in_r[k]);
        dl_shape s = dl_shape_make(in_r[k]->ndim, in_r[k]->shape);
        grad_r[k] = g_find(lo, hi, "grad_", f);
        if (g_find(lo, hi, "v_", f)) dd = 1;
        if (!strcmp(f, "target")) {   /* class indices, stored as floats */
            int64_t *t = (int64_t *)malloc(sizeof(int64_t) * (size_t)(in_r[k]->numel + 1));
            int64_t j;
            if (!t) { CHECK(0, "%s: out of memory", cname); return; }
            for (j = 0; j < in_r[k]->numel; j++) t[j] = (int64_t)in_r[k]->v[j];
            in[k] = dl_from_int64(g_ctx, s, t);
            free(t);
        } else {
            in[k] = dl_from_array(g_ctx, s, in_r[k]->v);
        }
        if (in[k] && grad_r[k]) {
            in[k] = dl_requires_grad(in[k], true);
            req[nreq] = in[k];
            grad_r[nreq] = grad_r[k];
            nreq++;
        }
        if (!in[k]) {
            CHECK(0, "%s: creating input %s failed: %s", cname, f, dl_error_message(g_ctx));
            dl_clear_error(g_ctx);
            return;
        }
    }
    out = g_run(op, nin, in_r, in, params, &bad);
    if (bad) { CHECK(0, "%s: malformed case: %s", cname, bad); return; }
    if (!out) {
        CHECK(0, "%s: forward failed: %s", cname, dl_error_message(g_ctx));
        dl_clear_error(g_ctx);
        return;
    }
    if (out->dtype == DL_DTYPE_I64 || !strcmp(op, "argmax")) { g_compare_i64(cname, out, out_r); return; }
    g_compare(cname, "out", out, out_r);
    for (k = 0; k < nin; k++) {   /* in-place updates (running stats) */
        const grec *a = g_find(lo, hi, "after_", g_field(in_r[k]));
        if (!a) continue;
        snprintf(what, sizeof what, "after_%s", g_field(in_r[k]));
        g_compare(cname, what, in[k], a);
        g_n_after++;
    }
    if (!nreq) return;
    if (!gout_r) { CHECK(0, "%s: the golden file has no gout record", cname); return; }
    {
        dl_backward_desc desc;
        dl_result rc;
        dl_tensor *gout = dl_from_array(g_ctx, dl_shape_make(gout_r->ndim, gout_r->shape), gout_r->v);
        memset(&desc, 0, sizeof desc);
        desc.grad = gout;
        desc.create_graph = dd != 0;
        if (!gout) { CHECK(0, "%s: gout: %s", cname, dl_error_message(g_ctx)); dl_clear_error(g_ctx); return; }
        if (!g_same_shape(out, gout_r)) return;
        rc = dl_grad(out, nreq, req, grads, &desc);
        CHECK(rc == DL_OK, "%s: dl_grad%s failed: %s: %s", cname, dd ? " (create_graph)" : "",
              dl_result_string(rc), dl_error_message(g_ctx));
        if (rc != DL_OK) { dl_clear_error(g_ctx); return; }
        for (k = 0; k < nreq; k++) {
            snprintf(what, sizeof what, "grad_%s", g_field(grad_r[k]) + 5);
            g_compare(cname, what, grads[k], grad_r[k]);
        }
    }
    if (!dd) return;
    g_n_dd++;
    for (k = 0; k < nreq; k++) names[k] = g_field(grad_r[k]) + 5;
    g_second_order(cname, lo, hi, nreq, req, grads, names);
}

/* ------------------------------------------------------------ core ops, programs */
/* params as integers; fails the case if fewer than need */
static G_UNUSED int g_pi(const grec *params, int k) { return (int)params->v[k]; }

/* reduction params: [keepdim, correction, all_flag, dims...] */
static G_UNUSED dl_shape g_red_dims(const grec *p)
{
    int64_t d[DL_MAX_DIMS];
    int i, n = (int)p->numel - 3;
    if (g_pi(p, 2)) return DL_ALL;
    if (n > DL_MAX_DIMS) n = DL_MAX_DIMS;
    for (i = 0; i < n; i++) d[i] = (int64_t)p->v[3 + i];
    return dl_shape_make(n, d);
}

static G_UNUSED dl_shape g_param_shape(const grec *p, int from)
{
    int64_t d[DL_MAX_DIMS];
    int i, n = (int)p->numel - from;
    if (n > DL_MAX_DIMS) n = DL_MAX_DIMS;
    if (n < 0) n = 0;
    for (i = 0; i < n; i++) d[i] = (int64_t)p->v[from + i];
    return dl_shape_make(n, d);
}

/* The core ops (test_golden's cases, and the instructions of gen_fuzz.py's
   programs in every runner): op on in[0 .. n-1] with params p; a runner
   calls it after its own ops (*bad: "unknown op" for any other name). */
static G_UNUSED dl_tensor *g_core(const char *op, int n, dl_tensor **in, const grec *p, const char **bad)
{
    dl_tensor *x = n > 0 ? in[0] : NULL, *y = n > 1 ? in[1] : NULL;
    int np = p ? (int)p->numel : 0;
#define G_NEED(ni, npar) do { if (n < (ni) || np < (npar)) { *bad = "wrong number of inputs or params"; return NULL; } } while (0)
    *bad = NULL;
    if (!strcmp(op, "add")) { G_NEED(2, 0); return dl_add(x, y); }
    if (!strcmp(op, "sub")) { G_NEED(2, 0); return dl_sub(x, y); }
    if (!strcmp(op, "mul")) { G_NEED(2, 0); return dl_mul(x, y); }
    if (!strcmp(op, "div")) { G_NEED(2, 0); return dl_div(x, y); }
    if (!strcmp(op, "maximum")) { G_NEED(2, 0); return dl_maximum(x, y); }
    if (!strcmp(op, "minimum")) { G_NEED(2, 0); return dl_minimum(x, y); }
    if (!strcmp(op, "matmul")) { G_NEED(2, 0); return dl_matmul(x, y); }
    if (!strcmp(op, "add_scalar")) { G_NEED(1, 1); return dl_add_scalar(x, p->v[0]); }
    if (!strcmp(op, "sub_scalar")) { G_NEED(1, 1); return dl_sub_scalar(x, p->v[0]); }
    if (!strcmp(op, "mul_scalar")) { G_NEED(1, 1); return dl_mul_scalar(x, p->v[0]); }
    if (!strcmp(op, "div_scalar")) { G_NEED(1, 1); return dl_div_scalar(x, p->v[0]); }
    if (!strcmp(op, "rsub_scalar")) { G_NEED(1, 1); return dl_rsub_scalar(x, p->v[0]); }
    if (!strcmp(op, "pow")) { G_NEED(1, 1); return dl_pow(x, p->v[0]); }
    if (!strcmp(op, "neg")) { G_NEED(1, 0); return dl_neg(x); }
    if (!strcmp(op, "exp")) { G_NEED(1, 0); return dl_exp(x); }
    if (!strcmp(op, "log")) { G_NEED(1, 0); return dl_log(x); }
    if (!strcmp(op, "sqrt")) { G_NEED(1, 0); return dl_sqrt(x); }
    if (!strcmp(op, "abs")) { G_NEED(1, 0); return dl_abs(x); }
    if (!strcmp(op, "erf")) { G_NEED(1, 0); return dl_erf(x); }
    if (!strcmp(op, "sin")) { G_NEED(1, 0); return dl_sin(x); }
    if (!strcmp(op, "cos")) { G_NEED(1, 0); return dl_cos(x); }
    if (!strcmp(op, "log1p")) { G_NEED(1, 0); return dl_log1p(x); }
    if (!strcmp(op, "expm1")) { G_NEED(1, 0); return dl_expm1(x); }
    if (!strcmp(op, "rsqrt")) { G_NEED(1, 0); return dl_rsqrt(x); }
    if (!strcmp(op, "relu")) { G_NEED(1, 0); return dl_relu(x); }
    if (!strcmp(op, "sigmoid")) { G_NEED(1, 0); return dl_sigmoid(x); }
    if (!strcmp(op, "tanh")) { G_NEED(1, 0); return dl_tanh(x); }
    if (!strcmp(op, "gelu")) { G_NEED(1, 0); return dl_gelu(x); }
    if (!strcmp(op, "gelu_tanh")) { G_NEED(1, 0); return dl_gelu_tanh(x); }
    if (!strcmp(op, "softplus")) { G_NEED(1, 2); return dl_softplus(x, p->v[0], p->v[1]); }
    if (!strcmp(op, "logsigmoid")) { G_NEED(1, 0); return dl_logsigmoid(x); }
    if (!strcmp(op, "silu")) { G_NEED(1, 0); return dl_silu(x); }
    if (!strcmp(op, "leaky_relu")) { G_NEED(1, 1); return dl_leaky_relu(x, p->v[0]); }
    if (!strcmp(op, "clamp")) { G_NEED(1, 2); return dl_clamp(x, p->v[0], p->v[1]); }
    if (!strcmp(op, "sum")) { G_NEED(1, 3); return dl_sum(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "mean")) { G_NEED(1, 3); return dl_mean(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "max")) { G_NEED(1, 3); return dl_max(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "min")) { G_NEED(1, 3); return dl_min(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "var")) { G_NEED(1, 3); return dl_var(x, g_red_dims(p), g_pi(p, 1), g_pi(p, 0) != 0); }
    if (!strcmp(op, "std")) { G_NEED(1, 3); return dl_std(x, g_red_dims(p), g_pi(p, 1), g_pi(p, 0) != 0); }
    if (!strcmp(op, "norm")) { G_NEED(1, 3); return dl_norm(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "cumsum")) { G_NEED(1, 1); return dl_cumsum(x, g_pi(p, 0)); }
    if (!strcmp(op, "logsumexp")) { G_NEED(1, 3); return dl_logsumexp(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "argmax")) { G_NEED(1, 2); return dl_argmax(x, g_pi(p, 0), g_pi(p, 1) != 0); }
    if (!strncmp(op, "max_dim", 7) || !strncmp(op, "min_dim", 7)) {   /* values, or "_idx": indices */
        dl_tensor *idx = NULL, *v;
        G_NEED(1, 2);
        v = op[1] == 'a' ? dl_max_dim(x, g_pi(p, 0), g_pi(p, 1) != 0, &idx)
                         : dl_min_dim(x, g_pi(p, 0), g_pi(p, 1) != 0, &idx);
        return op[7] ? idx : v;
    }
    if (!strcmp(op, "softmax")) { G_NEED(1, 1); return dl_softmax(x, g_pi(p, 0)); }
    if (!strcmp(op, "log_softmax")) { G_NEED(1, 1); return dl_log_softmax(x, g_pi(p, 0)); }
    if (!strcmp(op, "reshape")) { G_NEED(1, 1); return dl_reshape(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "flatten")) { G_NEED(1, 2); return dl_flatten(x, g_pi(p, 0), g_pi(p, 1)); }
    if (!strcmp(op, "unflatten")) { G_NEED(1, 2); return dl_unflatten(x, g_pi(p, 0), g_param_shape(p, 1)); }
    if (!strcmp(op, "squeeze")) { G_NEED(1, 1); return dl_squeeze(x, g_pi(p, 0)); }
    if (!strcmp(op, "unsqueeze")) { G_NEED(1, 1); return dl_unsqueeze(x, g_pi(p, 0)); }
    if (!strcmp(op, "permute")) { G_NEED(1, 1); return dl_permute(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "transpose")) { G_NEED(1, 2); return dl_transpose(x, g_pi(p, 0), g_pi(p, 1)); }
    if (!strcmp(op, "narrow")) { G_NEED(1, 3); return dl_narrow(x, g_pi(p, 0), (int64_t)p->v[1], (int64_t)p->v[2]); }
    if (!strcmp(op, "cat")) { G_NEED(1, 1); return dl_cat(n, in, g_pi(p, 0)); }
    if (!strcmp(op, "split") || !strcmp(op, "chunk") || !strcmp(op, "unbind")) {
        /* params [form (0: split(size), 1: split(sizes), 2: chunk, 3: unbind), dim, size or chunks,
           mask of the pieces used, sizes (form 1)]; out: cat of (k + 1) p_k^2 flattened, pieces used */
        dl_tensor *ps[16], *u[16];
        int64_t sz[16];
        int k, m = 0, cnt, form;
        G_NEED(1, 4);
        form = g_pi(p, 0);
        for (k = 4; k < np && k < 20; k++) sz[k - 4] = (int64_t)p->v[k];
        cnt = form == 0 ? dl_split(x, g_pi(p, 2), g_pi(p, 1), 16, ps)
              : form == 1 ? dl_split_sizes(x, np - 4, sz, g_pi(p, 1), ps)
              : form == 2 ? dl_chunk(x, g_pi(p, 2), g_pi(p, 1), ps) : dl_unbind(x, g_pi(p, 1), 16, ps);
        for (k = 0; k < cnt; k++)
            if (g_pi(p, 3) >> k & 1)
                u[m++] = dl_reshape(dl_mul_scalar(dl_mul(ps[k], ps[k]), (float)(k + 1)), DL_SHAPE(-1));
        return cnt < 0 ? NULL : dl_cat(m, u, 0);
    }
    if (!strcmp(op, "embedding")) {   /* inputs weight, target (indices)[, x]; params [has pad, pad, then
                                           1: squared, 2: times x] */
        dl_tensor *e;
        G_NEED(2, 3);
        e = dl_embedding(y, x, g_pi(p, 0) ? (int64_t)g_pi(p, 1) : DL_NO_PADDING);
        if (g_pi(p, 2) == 2) { G_NEED(3, 3); return dl_mul(e, in[2]); }
        return g_pi(p, 2) ? dl_mul(e, e) : e;
    }
    if (!strcmp(op, "ne")) { G_NEED(2, 0); return dl_ne(x, y); }
    if (!strcmp(op, "lt")) { G_NEED(2, 0); return dl_lt(x, y); }
    if (!strcmp(op, "le")) { G_NEED(2, 0); return dl_le(x, y); }
    if (!strcmp(op, "gt")) { G_NEED(2, 0); return dl_gt(x, y); }
    if (!strcmp(op, "ge")) { G_NEED(2, 0); return dl_ge(x, y); }
    if (!strcmp(op, "where")) {   /* inputs cond, a, b; params [0: where(c, a, b), 1: where(c, a b, b b)] */
        G_NEED(3, 1);
        if (g_pi(p, 0)) return dl_where(x, dl_mul(y, in[2]), dl_mul(in[2], in[2]));
        return dl_where(x, y, in[2]);
    }
    if (!strcmp(op, "masked_fill")) {   /* inputs x, mask; params [value, 1: softmax(-1) of it] */
        dl_tensor *f;
        G_NEED(2, 2);
        f = dl_masked_fill(x, y, p->v[0]);
        return g_pi(p, 1) ? dl_softmax(f, -1) : f;
    }
    if (!strcmp(op, "tril")) { G_NEED(1, 1); return dl_tril(x, (int64_t)p->v[0]); }
    if (!strcmp(op, "triu")) { G_NEED(1, 1); return dl_triu(x, (int64_t)p->v[0]); }
    if (!strcmp(op, "gather")) {   /* inputs x, target (the index); params [dim, 1: squared] */
        dl_tensor *e;
        G_NEED(2, 2);
        e = dl_gather(x, g_pi(p, 0), y);
        return g_pi(p, 1) ? dl_mul(e, e) : e;
    }
    if (!strcmp(op, "categorical_log_prob")) { G_NEED(2, 1); return dl_categorical_log_prob(x, y); }   /* logits, value */
    if (!strcmp(op, "categorical_entropy")) { G_NEED(1, 1); return dl_categorical_entropy(x); }
    if (!strcmp(op, "categorical_probs_log_prob")) { G_NEED(2, 1); return dl_categorical_probs_log_prob(x, y); }
    if (!strcmp(op, "categorical_probs_entropy")) { G_NEED(1, 1); return dl_categorical_probs_entropy(x); }
    if (!strcmp(op, "group_norm")) {   /* inputs x[, weight, bias]; params [num_groups, eps] */
        G_NEED(1, 2);
        return dl_group_norm(x, g_pi(p, 0), y, n > 2 ? in[2] : NULL, p->v[1]);
    }
    if (!strcmp(op, "upsample_nearest")) {   /* params [scale, 1: squared] */
        dl_tensor *u;
        G_NEED(1, 2);
        u = dl_upsample_nearest(x, (int64_t)p->v[0]);
        return g_pi(p, 1) ? dl_mul(u, u) : u;
    }
    if (!strcmp(op, "stack")) { G_NEED(1, 1); return dl_stack(n, in, g_pi(p, 0)); }
    if (!strcmp(op, "expand")) { G_NEED(1, 1); return dl_expand(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "sum_to")) { G_NEED(1, 1); return dl_sum_to(x, g_param_shape(p, 0)); }
#undef G_NEED
    *bad = "unknown op";
    return NULL;
}

/* gen_fuzz.py's program (a "prog" case): p = [count, then per instruction:
   the op's name (its length, then its characters' codes), its input count,
   the input indexes (in[0 .. n-1] are 0 .. n-1, instruction k's result
   n + k, -1 an optional argument left out), its param count and params]; each instruction runs through the
   runner's g_run, so a runner's own ops (conv, pooling) can be used too.
   The program's result is the last instruction's. */
#define G_PROG_MAX 96
static G_UNUSED dl_tensor *g_prog(int n, dl_tensor **in, const grec *p, const char **bad)
{
    dl_tensor *vals[G_PROG_MAX], *args[G_MAXIN];
    int nv = n, k, j, ninstr, np = p ? (int)p->numel : 0;
    long pos = 1;
    *bad = NULL;
    if (np < 1 || n < 1 || n > G_PROG_MAX) { *bad = "a program needs inputs and its code"; return NULL; }
    for (k = 0; k < n; k++) vals[k] = in[k];
    ninstr = g_pi(p, 0);
    for (k = 0; k < ninstr; k++) {
        grec q;
        char name[32];
        int nl, ni, npp;
        if (pos >= np || (nl = g_pi(p, (int)pos++)) < 1 || nl >= (int)sizeof name || pos + nl + 1 > np) {
            *bad = "program cut short (an op's name)";
            return NULL;
        }
        for (j = 0; j < nl; j++) name[j] = (char)g_pi(p, (int)pos++);
        name[nl] = 0;
        ni = g_pi(p, (int)pos++);
        if (ni < 1 || ni > G_MAXIN || pos + ni + 1 > np || nv == G_PROG_MAX) {
            *bad = "bad instruction";
            return NULL;
        }
        for (j = 0; j < ni; j++) {   /* (-1: NULL, an optional argument left out) */
            int r = g_pi(p, (int)pos++);
            if (r < -1 || r >= nv) { *bad = "an input index out of range"; return NULL; }
            args[j] = r < 0 ? NULL : vals[r];
        }
        npp = g_pi(p, (int)pos++);
        if (npp < 0 || pos + npp > np) { *bad = "params cut short"; return NULL; }
        memset(&q, 0, sizeof q);
        q.name = name;
        q.ndim = 1;
        q.shape[0] = npp;
        q.numel = npp;
        q.v = p->v + pos;
        pos += npp;
        vals[nv] = g_run(name, ni, NULL, args, &q, bad);
        if (*bad || !vals[nv]) return NULL;
        nv++;
    }
    return nv > n ? vals[nv - 1] : NULL;
}

/* params[0..11]: four arrays of 3 (gen_conv.py's three() each) */
static G_UNUSED void g_arrays4(const grec *p, int64_t *a, int64_t *b, int64_t *c, int64_t *d)
{
    int i;
    for (i = 0; i < 3; i++) {
        a[i] = g_pi(p, i);
        b[i] = g_pi(p, 3 + i);
        c[i] = g_pi(p, 6 + i);
        d[i] = g_pi(p, 9 + i);
    }
}

/* conv: stride, padding, dilation, output_padding, groups, padding_same */
static G_UNUSED dl_conv_desc g_conv_desc(const grec *p)
{
    dl_conv_desc d;
    memset(&d, 0, sizeof d);
    g_arrays4(p, d.stride, d.padding, d.dilation, d.output_padding);
    d.groups = g_pi(p, 12);
    d.padding_same = g_pi(p, 13) != 0;
    return d;
}

/* pooling: kernel, stride, padding, dilation, ceil_mode, count_include_pad */
static G_UNUSED dl_pool_desc g_pool_desc(const grec *p)
{
    dl_pool_desc d;
    memset(&d, 0, sizeof d);
    g_arrays4(p, d.kernel, d.stride, d.padding, d.dilation);
    d.ceil_mode = g_pi(p, 12) != 0;
    d.no_count_include_pad = g_pi(p, 13) == 0;
    return d;
}

/* Convolution and pooling (test_conv's cases, gen_fuzz.py's conv and nn
   programs), then the core ops: op on x, w, b (in[0..2]) with params p as
   gen_conv.py writes them; *bad: "unknown op" for any other name. */
static G_UNUSED dl_tensor *g_any(const char *op, int n, dl_tensor **in, const grec *p, const char **bad)
{
    int np = p ? (int)p->numel : 0;
    dl_tensor *x = n > 0 ? in[0] : NULL, *w = n > 1 ? in[1] : NULL, *b = n > 2 ? in[2] : NULL;
    *bad = NULL;
    if (!strncmp(op, "conv", 4)) {
        dl_conv_desc d;
        if (np < 14 || n < 2) { *bad = "conv needs x, w and 14 params"; return NULL; }
        d = g_conv_desc(p);
        if (!strcmp(op, "conv1d")) return dl_conv1d(x, w, b, &d);
        if (!strcmp(op, "conv2d")) return dl_conv2d(x, w, b, &d);
        if (!strcmp(op, "conv3d")) return dl_conv3d(x, w, b, &d);
        if (!strcmp(op, "conv_transpose1d")) return dl_conv_transpose1d(x, w, b, &d);
        if (!strcmp(op, "conv_transpose2d")) return dl_conv_transpose2d(x, w, b, &d);
        if (!strcmp(op, "conv_transpose3d")) return dl_conv_transpose3d(x, w, b, &d);
    } else if (!strncmp(op, "max_pool", 8) || !strncmp(op, "avg_pool", 8)) {
        dl_pool_desc d;
        if (np < 14 || n < 1) { *bad = "pooling needs x and 14 params"; return NULL; }
        d = g_pool_desc(p);
        if (!strcmp(op, "max_pool1d")) return dl_max_pool1d(x, &d);
        if (!strcmp(op, "max_pool2d")) return dl_max_pool2d(x, &d);
        if (!strcmp(op, "max_pool3d")) return dl_max_pool3d(x, &d);
        if (!strcmp(op, "avg_pool1d")) return dl_avg_pool1d(x, &d);
        if (!strcmp(op, "avg_pool2d")) return dl_avg_pool2d(x, &d);
        if (!strcmp(op, "avg_pool3d")) return dl_avg_pool3d(x, &d);
    } else if (!strncmp(op, "adaptive_avg_pool", 17)) {
        int64_t o[3];
        if (np < 3 || n < 1) { *bad = "adaptive pooling needs x and 3 params"; return NULL; }
        o[0] = g_pi(p, 0); o[1] = g_pi(p, 1); o[2] = g_pi(p, 2);
        if (!strcmp(op, "adaptive_avg_pool1d")) return dl_adaptive_avg_pool1d(x, dl_shape_make(1, o));
        if (!strcmp(op, "adaptive_avg_pool2d")) return dl_adaptive_avg_pool2d(x, dl_shape_make(2, o));
        if (!strcmp(op, "adaptive_avg_pool3d")) return dl_adaptive_avg_pool3d(x, dl_shape_make(3, o));
    }
    return g_core(op, n, in, p, bad);
}

/* Runs fn(lo, hi) on every case of the loaded file (records [lo, hi)
   grouped by their "op/case/" prefix), one step each; returns the number
   of cases. */
static G_UNUSED int g_each_case(void (*fn)(long, long))
{
    long i, j;
    int ncases = 0;
    for (i = 0; i < g_nrec; i = j) {
        size_t pl = g_prefix_len(&g_recs[i]);
        for (j = i + 1; j < g_nrec; j++)
            if (g_prefix_len(&g_recs[j]) != pl || strncmp(g_recs[j].name, g_recs[i].name, pl) != 0) break;
        fn(i, j);
        ncases++;
        dl_clear_error(g_ctx);
        dl_step_end(g_ctx);
    }
    return ncases;
}

static G_UNUSED void g_case1(long lo, long hi)
{
    int n = 0;
    g_case(lo, hi, &n);
}

/* every case of the loaded file, each an op's (g_case) */
static G_UNUSED int g_run_cases(void) { return g_each_case(g_case1); }

/* A program (gen_fuzz.py) captured and replayed: its inputs persistent
   (dl_keep), the forward and dl_grad recorded by dl_capture_begin/end, then
   the capture's run and two replays must give the eager run's bits: the
   output and every input's gradient. */
#define G_CAPN 4
static G_UNUSED float *g_cap_read(dl_tensor *t)
{
    float *v = t ? (float *)calloc((size_t)t->numel + 1, sizeof(float)) : NULL;
    if (v && dl_read(t, v, t->numel) != DL_OK) { free(v); v = NULL; }
    return v;
}

static G_UNUSED void g_prog_capture(long lo, long hi)
{
    char cname[64];
    const grec *in_r[G_MAXIN], *p = g_find(lo, hi, "", "params"), *gr = g_find(lo, hi, "", "gout");
    dl_tensor *in[G_MAXIN], *req[G_MAXIN], *grads[G_MAXIN], *gout, *out = NULL;
    float *want[G_MAXIN + 1], *got;
    dl_backward_desc desc;
    dl_capture *cap = NULL;
    const char *bad = NULL;
    int n = 0, nreq = 0, k, run;
    long i;
    size_t pl = g_prefix_len(&g_recs[lo]);
    snprintf(cname, sizeof cname, "%.*s captured", (int)(pl > 0 ? pl - 1 : 0), g_recs[lo].name);
    if (!p || !gr) return;
    for (i = lo; i < hi && n < G_MAXIN; i++) {
        const grec *r = &g_recs[i];
        if (!g_is_input(g_field(r))) continue;
        in_r[n] = r;
        in[n] = dl_keep(dl_from_array(g_ctx, dl_shape_make(r->ndim, r->shape), r->v));
        if (in[n] && g_find(lo, hi, "grad_", g_field(r))) req[nreq++] = dl_requires_grad(in[n], true);
        n++;
    }
    gout = dl_keep(dl_from_array(g_ctx, dl_shape_make(gr->ndim, gr->shape), gr->v));
    memset(&desc, 0, sizeof desc);
    desc.grad = gout;
    memset(want, 0, sizeof want);
    memset(grads, 0, sizeof grads);
    for (run = 0; run < G_CAPN; run++) {   /* eager, the capture's run, two replays */
        if (run == 1) cap = dl_capture_begin(g_ctx);
        if (run <= 1) {
            out = g_run("prog", n, in_r, in, p, &bad);
            if (!out || dl_grad(out, nreq, req, grads, &desc) != DL_OK) {
                CHECK(0, "%s: %s: %s", cname, run ? "inside the capture" : "eager", bad ? bad : dl_error_message(g_ctx));
                break;
            }
            if (run == 1 && dl_capture_end(cap) != DL_OK) {
                CHECK(0, "%s: dl_capture_end: %s", cname, dl_error_message(g_ctx));
                break;
            }
        } else if (dl_replay(cap) != DL_OK) {
            CHECK(0, "%s: replay %d: %s", cname, run - 1, dl_error_message(g_ctx));
            break;
        }
        for (k = 0; k <= nreq; k++) {
            dl_tensor *t = k ? grads[k - 1] : out;
            if (!t) continue;   /* (no gradient: none in every run) */
            got = g_cap_read(t);
            if (run == 0) want[k] = got;
            else {
                CHECK(got && want[k] && memcmp(got, want[k], sizeof(float) * (size_t)t->numel) == 0,
                      "%s: %s of the %s: the eager run's bits", cname, k ? "a gradient" : "the output",
                      run == 1 ? "capture's run" : "replay");
                free(got);
            }
        }
        dl_step_end(g_ctx);
    }
    for (k = 0; k <= nreq; k++) free(want[k]);
    dl_capture_free(cap);
    for (k = 0; k < n; k++) dl_free(in[k]);
    dl_free(gout);
}

/* every program of a gen_fuzz.py file captured and replayed, in a context
   of its own */
static G_UNUSED void g_capture_file(const char *path)
{
    int ncases;
    dl_ctx *outer = g_ctx;   /* (a runner's own, back after) */
    if (!g_load(path)) { CHECK(0, "loading the golden file %s", path); return; }
    g_ctx = dl_ctx_init(NULL);
    CHECK(g_ctx != NULL, "dl_ctx_init");
    if (g_ctx) {
        ncases = g_each_case(g_prog_capture);
        printf("golden: %d programs captured and replayed from %s\n", ncases, path);
        CHECK(ncases > 0, "no programs in %s", path);
        dl_ctx_free(g_ctx);
    }
    g_ctx = outer;
    g_free_recs();
}

#endif
