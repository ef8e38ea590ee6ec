/* tests/test_golden.c - dl.h's core ops against PyTorch golden values.

   The values come from tests/golden/gen.py (torch; regenerate with
   `python3 tests/golden/gen.py`). Run from the repository root:
       test_golden [path/to/core.bin]     (default tests/golden/core.bin)
   For every case it recomputes the forward result, the gradients for a
   fixed upstream gradient (dl_grad with dl_backward_desc.grad = gout) and,
   where the file has them, Hessian-vector products (dl_grad with
   create_graph, then dl_grad of sum_i sum(grad_i * v_i)), and compares with
   |got - want| <= 1e-5 + 1e-4 * |want| (argmax: exactly). A failure prints
   the worst element.

   FILE FORMAT (all integers little-endian)
       8 bytes   magic "DLGOLD1\0"
       uint32    version = 1
       uint32    record count
       records, each:
           uint32  name length, then the name bytes (no NUL)
           uint32  ndim, then ndim x int64 shape
           numel x float32 values (numel = product of shape; 1 for ndim 0)
   Record names are "<op>/<case>/<field>"; a case's records are consecutive:
   inputs (any other field name, in argument order), params (op parameters
   as floats), gout, v_<input>, out, grad_<input> (an input without one does
   not require grad), hv_<input>. See gen.py. */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>

#define G_MAXIN 8

#include "golden.h"

/* params as integers; fails the case if fewer than need */
static int g_pi(const grec *params, int k) { return (int)params->v[k]; }

/* reduction params: [keepdim, correction, all_flag, dims...] */
static dl_shape g_red_dims(const grec *p)
{
    int64_t d[DL_MAX_DIMS];
    int i, n = (int)p->numel - 3;
    if (g_pi(p, 2)) return DL_ALL;
    if (n > DL_MAX_DIMS) n = DL_MAX_DIMS;
    for (i = 0; i < n; i++) d[i] = (int64_t)p->v[3 + i];
    return dl_shape_make(n, d);
}

static dl_shape g_param_shape(const grec *p, int from)
{
    int64_t d[DL_MAX_DIMS];
    int i, n = (int)p->numel - from;
    if (n > DL_MAX_DIMS) n = DL_MAX_DIMS;
    if (n < 0) n = 0;
    for (i = 0; i < n; i++) d[i] = (int64_t)p->v[from + i];
    return dl_shape_make(n, d);
}

/* ------------------------------------------------------------------ ops */

/* Runs op on the inputs. Sets *bad to a message when the case itself is
   malformed (unknown op, missing params). */
static dl_tensor *g_run(const char *op, int n, dl_tensor **in, const grec *p, const char **bad)
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
    if (!strcmp(op, "relu")) { G_NEED(1, 0); return dl_relu(x); }
    if (!strcmp(op, "sigmoid")) { G_NEED(1, 0); return dl_sigmoid(x); }
    if (!strcmp(op, "tanh")) { G_NEED(1, 0); return dl_tanh(x); }
    if (!strcmp(op, "gelu")) { G_NEED(1, 0); return dl_gelu(x); }
    if (!strcmp(op, "leaky_relu")) { G_NEED(1, 1); return dl_leaky_relu(x, p->v[0]); }
    if (!strcmp(op, "clamp")) { G_NEED(1, 2); return dl_clamp(x, p->v[0], p->v[1]); }
    if (!strcmp(op, "sum")) { G_NEED(1, 3); return dl_sum(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "mean")) { G_NEED(1, 3); return dl_mean(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "max")) { G_NEED(1, 3); return dl_max(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "min")) { G_NEED(1, 3); return dl_min(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "var")) { G_NEED(1, 3); return dl_var(x, g_red_dims(p), g_pi(p, 1), g_pi(p, 0) != 0); }
    if (!strcmp(op, "argmax")) { G_NEED(1, 2); return dl_argmax(x, g_pi(p, 0), g_pi(p, 1) != 0); }
    if (!strcmp(op, "softmax")) { G_NEED(1, 1); return dl_softmax(x, g_pi(p, 0)); }
    if (!strcmp(op, "log_softmax")) { G_NEED(1, 1); return dl_log_softmax(x, g_pi(p, 0)); }
    if (!strcmp(op, "reshape")) { G_NEED(1, 1); return dl_reshape(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "flatten")) { G_NEED(1, 2); return dl_flatten(x, g_pi(p, 0), g_pi(p, 1)); }
    if (!strcmp(op, "squeeze")) { G_NEED(1, 1); return dl_squeeze(x, g_pi(p, 0)); }
    if (!strcmp(op, "unsqueeze")) { G_NEED(1, 1); return dl_unsqueeze(x, g_pi(p, 0)); }
    if (!strcmp(op, "permute")) { G_NEED(1, 1); return dl_permute(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "transpose")) { G_NEED(1, 2); return dl_transpose(x, g_pi(p, 0), g_pi(p, 1)); }
    if (!strcmp(op, "narrow")) { G_NEED(1, 3); return dl_narrow(x, g_pi(p, 0), (int64_t)p->v[1], (int64_t)p->v[2]); }
    if (!strcmp(op, "cat")) { G_NEED(1, 1); return dl_cat(n, in, g_pi(p, 0)); }
    if (!strcmp(op, "stack")) { G_NEED(1, 1); return dl_stack(n, in, g_pi(p, 0)); }
    if (!strcmp(op, "expand")) { G_NEED(1, 1); return dl_expand(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "sum_to")) { G_NEED(1, 1); return dl_sum_to(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "mlp")) {
        /* mean((tanh(x W1^T + b1) W2^T + b2 - y)^2); inputs x, y, W1, b1, W2, b2 */
        dl_tensor *h, *d;
        G_NEED(6, 0);
        h = dl_tanh(dl_add(dl_matmul(in[0], dl_transpose(in[2], 0, 1)), in[3]));
        d = dl_sub(dl_add(dl_matmul(h, dl_transpose(in[4], 0, 1)), in[5]), in[1]);
        return dl_mean(dl_mul(d, d), DL_ALL, false);
    }
#undef G_NEED
    *bad = "unknown op";
    return NULL;
}

/* ------------------------------------------------------------------ one case */

static const grec *g_find(long lo, long hi, const char *prefix, const char *field)
{
    long i;
    for (i = lo; i < hi; i++) {
        const char *f = g_field(&g_recs[i]);
        if (!strncmp(f, prefix, strlen(prefix)) && !strcmp(f + strlen(prefix), field)) return &g_recs[i];
    }
    return NULL;
}

static int g_is_input(const char *f)
{
    return strcmp(f, "params") && strcmp(f, "gout") && strcmp(f, "out") && strncmp(f, "grad_", 5) &&
           strncmp(f, "v_", 2) && strncmp(f, "hv_", 3);
}

static void g_case(long lo, long hi, int *ncases)
{
    char cname[256], op[64], what[96];
    const grec *in_r[G_MAXIN], *params, *gout_r, *out_r;
    const grec *grad_r[G_MAXIN], *v_r[G_MAXIN], *hv_r[G_MAXIN];
    dl_tensor *in[G_MAXIN], *req[G_MAXIN], *grads[G_MAXIN], *hv[G_MAXIN], *out;
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
        grad_r[k] = g_find(lo, hi, "grad_", f);
        v_r[k] = g_find(lo, hi, "v_", f);
        hv_r[k] = g_find(lo, hi, "hv_", f);
        if (v_r[k]) dd = 1;
        in[k] = dl_from_array(g_ctx, dl_shape_make(in_r[k]->ndim, in_r[k]->shape), in_r[k]->v);
        if (in[k] && grad_r[k]) {
            in[k] = dl_requires_grad(in[k], true);
            req[nreq] = in[k];
            grad_r[nreq] = grad_r[k];   /* compacted: grad_r/v_r/hv_r follow req */
            v_r[nreq] = v_r[k];
            hv_r[nreq] = hv_r[k];
            nreq++;
        }
        if (!in[k]) {
            CHECK(0, "%s: creating input %s failed: %s", cname, g_field(in_r[k]), dl_error_message(g_ctx));
            dl_clear_error(g_ctx);
            return;
        }
    }
    out = g_run(op, nin, in, params, &bad);
    if (bad) { CHECK(0, "%s: malformed case: %s", cname, bad); return; }
    if (!out) {
        CHECK(0, "%s: forward failed: %s", cname, dl_error_message(g_ctx));
        dl_clear_error(g_ctx);
        return;
    }
    if (out->dtype == DL_DTYPE_I64 || !strcmp(op, "argmax")) { g_compare_i64(cname, out, out_r); return; }
    g_compare(cname, "out", out, out_r);
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
        if (!g_same_shape(out, gout_r)) return;   /* already reported as a shape failure */
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
    {
        dl_tensor *s2 = NULL;
        dl_result rc;
        for (k = 0; k < nreq; k++) {
            dl_tensor *vk, *term;
            if (!v_r[k] || !hv_r[k]) { CHECK(0, "%s: v_/hv_ record missing for input %d", cname, k); return; }
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
            snprintf(what, sizeof what, "hv_%s", g_field(hv_r[k]) + 3);
            g_compare(cname, what, hv[k], hv_r[k]);
        }
    }
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/golden/core.bin";
    long i, j;
    int ncases = 0;
    if (!g_load(path)) {
        CHECK(0, "loading the golden file %s", path);
        TEST_END();
    }
    g_ctx = dl_ctx_init(NULL);
    CHECK(g_ctx != NULL, "dl_ctx_init");
    if (!g_ctx) { g_free_recs(); TEST_END(); }
    for (i = 0; i < g_nrec; i = j) {
        size_t pl = g_prefix_len(&g_recs[i]);
        for (j = i + 1; j < g_nrec; j++)
            if (g_prefix_len(&g_recs[j]) != pl || strncmp(g_recs[j].name, g_recs[i].name, pl) != 0) break;
        g_case(i, j, &ncases);
        dl_clear_error(g_ctx);
        dl_step_end(g_ctx);
    }
    printf("golden: %d cases from %s (%ld records)\n", ncases, path, g_nrec);
    CHECK(ncases > 100, "expected more than 100 cases in %s, found %d", path, ncases);
    dl_ctx_free(g_ctx);
    g_free_recs();
    TEST_END();
}
