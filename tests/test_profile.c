/* tests/test_profile.c - the per-op profiler (dl_profile_*, DL_PROFILE=1):
   exact call counts and names for a known sequence of ops, backward nodes
   named "<op> backward", nesting (an op's total is its self time plus its
   children's totals: dl_linear over dl_matmul and dl_add, a backward node
   over the ops of its rule, a custom function over the ops it calls), every
   op of tests/optable.h forward and backward leaves no span open and none
   dropped, a failed op is not counted, the table's format, the desc field
   and the environment, and off means no effect (the same bits, nothing
   recorded). Runs on the context's default device: cpu:0, the strict cpu:1
   (make test) and the emulated cuda:0 (make test-cuda-emu). */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>

static dl_ctx *C;

#include "optable.h"

/* the row named name on the default device (NULL: none) */
static const dl_profile_row *row(const char *name)
{
    static dl_profile_row rows[256];
    dl_device dev = dl_ctx_device(C);
    int n = dl_profile_rows(C, rows, 256), i;
    for (i = 0; i < n && i < 256; i++)
        if (!strcmp(rows[i].name, name) && rows[i].device.type == dev.type && rows[i].device.index == dev.index)
            return &rows[i];
    return NULL;
}

static int64_t calls(const char *name)
{
    const dl_profile_row *r = row(name);
    return r ? r->calls : 0;
}

static double total(const char *name)
{
    const dl_profile_row *r = row(name);
    return r ? r->total_s : -1.0;
}

static double self(const char *name)
{
    const dl_profile_row *r = row(name);
    return r ? r->self_s : -1.0;
}

/* |a - b| within float rounding of sums of a few times */
static bool near(double a, double b) { return fabs(a - b) <= 1e-9 + 1e-9 * fabs(b); }

/* a leaf (N,...) of given values; requires grad when asked */
static dl_tensor *leaf(dl_shape s, float base, bool grad)
{
    int64_t n = 1, i;
    float *v;
    dl_tensor *t;
    int d;
    for (d = 0; d < s.ndim; d++) n *= s.d[d];
    v = (float *)malloc(sizeof(float) * (size_t)(n + 1));
    if (!v) return NULL;
    for (i = 0; i < n; i++) v[i] = base + 0.25f * (float)(i % 7) - 0.5f;
    t = dl_requires_grad(dl_from_array(C, s, v), grad);
    free(v);
    return t;
}

/* ------------------------------------------------------------------ counts and names */

static void test_counts(void)
{
    dl_tensor *x, *w, *b, *y, *loss;
    dl_profile_enable(C, true);
    dl_profile_reset(C);
    x = leaf(DL_SHAPE(4, 3), 0.1f, true);
    w = leaf(DL_SHAPE(2, 3), -0.2f, true);
    b = leaf(DL_SHAPE(2), 0.3f, true);
    y = dl_relu(dl_linear(x, w, b));
    loss = dl_sum(y, DL_ALL, false);
    CHECK(loss && dl_backward(loss) == DL_OK, "linear, relu, sum, backward: %s", dl_error_message(C));
    dl_step_end(C);
    /* creators (dl_from_array) and dl_requires_grad are not ops */
    CHECK(calls("dl_from_array") == 0, "creators are not counted");
    CHECK(calls("dl_linear") == 1, "dl_linear: %lld calls", (long long)calls("dl_linear"));
    /* dl_sum twice: the loss, and in dl_add's backward the bias's gradient (b (2) broadcast
       over (4,2): dl_sum_to sums dim 0) */
    CHECK(calls("dl_relu") == 1 && calls("dl_sum") == 2, "dl_relu once, dl_sum twice: %lld, %lld",
          (long long)calls("dl_relu"), (long long)calls("dl_sum"));
    CHECK(calls("dl_sum_to") == 4, "dl_sum_to 4 times: the backward rules of dl_add and dl_matmul, once per "
          "operand each (%lld)", (long long)calls("dl_sum_to"));
    CHECK(calls("dl_add") == 1, "dl_add once (the bias, inside dl_linear): %lld", (long long)calls("dl_add"));
    /* dl_matmul: x w^T forward, then dx = g w and dw = g^T x in its backward rule */
    CHECK(calls("dl_matmul") == 3, "dl_matmul 3 times: %lld", (long long)calls("dl_matmul"));
    CHECK(calls("dl_sum backward") == 1 && calls("dl_relu backward") == 1 && calls("dl_add backward") == 1 &&
          calls("dl_matmul backward") == 1, "one backward node each: sum %lld relu %lld add %lld matmul %lld",
          (long long)calls("dl_sum backward"), (long long)calls("dl_relu backward"),
          (long long)calls("dl_add backward"), (long long)calls("dl_matmul backward"));
    CHECK(calls("dl_linear backward") == 0, "dl_linear records no node of its own (its ops do)");
    CHECK(C->prof->depth == 0 && C->prof->dropped == 0 && C->prof->lost == 0, "no span open, none dropped");
    CHECK(C->prof->steps == 1, "one step: %lld", (long long)C->prof->steps);
    dl_profile_reset(C);
    CHECK(dl_profile_rows(C, NULL, 0) == 0, "reset forgets every row");
}

/* an op's total = its self time + its children's totals */
static void test_nesting(void)
{
    dl_tensor *x, *w, *b, *y;
    dl_profile_enable(C, true);
    dl_profile_reset(C);
    x = leaf(DL_SHAPE(8, 5), 0.1f, false);
    w = leaf(DL_SHAPE(3, 5), 0.2f, false);
    b = leaf(DL_SHAPE(3), 0.0f, false);
    y = dl_linear(x, w, b);
    CHECK(y != NULL, "dl_linear");
    CHECK(calls("dl_linear") == 1 && calls("dl_matmul") == 1 && calls("dl_add") == 1, "one call each");
    CHECK(near(total("dl_linear"), self("dl_linear") + total("dl_matmul") + total("dl_add")),
          "dl_linear total %.9f = self %.9f + dl_matmul %.9f + dl_add %.9f", total("dl_linear"),
          self("dl_linear"), total("dl_matmul"), total("dl_add"));
    CHECK(near(self("dl_matmul"), total("dl_matmul")) && near(self("dl_add"), total("dl_add")),
          "leaves: self = total");
    CHECK(total("dl_linear") >= total("dl_matmul") && total("dl_matmul") > 0, "parent >= child > 0");
    dl_step_end(C);

    /* a backward node over the ops of its rule: relu's is one mask op (no create_graph) */
    dl_profile_reset(C);
    x = leaf(DL_SHAPE(4, 4), 0.0f, true);
    y = dl_sum(dl_relu(x), DL_ALL, false);
    CHECK(y && dl_backward(y) == DL_OK, "relu backward");
    CHECK(calls("mask") == 1, "relu's rule: one mask op (%lld)", (long long)calls("mask"));
    CHECK(near(total("dl_relu backward"), self("dl_relu backward") + total("mask")),
          "dl_relu backward total %.9f = self %.9f + mask %.9f", total("dl_relu backward"),
          self("dl_relu backward"), total("mask"));
    dl_step_end(C);
    dl_profile_reset(C);
}

/* a custom function: a span named as the function, over the ops it calls;
   its backward node "<name> backward" over its backward's ops */
static dl_tensor *sq_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)n; (void)user;
    dl_fn_save(fc, in[0]);
    return dl_mul(in[0], in[0]);
}
static dl_result sq_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)user;
    gin[0] = dl_mul_scalar(dl_mul(g, dl_fn_saved(fc, 0)), 2.0f);
    return gin[0] ? DL_OK : DL_ERR_ARG;
}

static void test_custom_function(void)
{
    dl_function fn;
    dl_tensor *x, *y, *in[1];
    memset(&fn, 0, sizeof fn);
    fn.name = "Square";
    fn.forward = sq_fwd;
    fn.backward = sq_bwd;
    dl_profile_reset(C);
    x = leaf(DL_SHAPE(5), 1.0f, true);
    in[0] = x;
    y = dl_sum(dl_function_apply(&fn, 1, in, NULL), DL_ALL, false);
    CHECK(y && dl_backward(y) == DL_OK, "custom function: %s", dl_error_message(C));
    CHECK(calls("Square") == 1 && calls("Square backward") == 1, "Square %lld, Square backward %lld",
          (long long)calls("Square"), (long long)calls("Square backward"));
    CHECK(calls("dl_mul") == 2 && calls("dl_mul_scalar") == 1, "forward's dl_mul, backward's dl_mul and dl_mul_scalar");
    CHECK(total("Square") >= total("dl_mul") - total("Square backward"), "Square holds its forward's dl_mul");
    dl_step_end(C);
    dl_profile_reset(C);
}

/* two functions whose names share their first 70 bytes are two rows (a
   name was cut to 63 bytes for the table's key: one row, calls summed);
   dl_profile_row.name holds the first 79 */
static void test_long_names(void)
{
    static const char *na = "model.encoder.layers.0.self_attention.scaled_dot_product_attention.q",
                      *nb = "model.encoder.layers.0.self_attention.scaled_dot_product_attention.k";
    dl_function fa, fb;
    dl_tensor *x, *in[1];
    memset(&fa, 0, sizeof fa);
    fa.name = na;
    fa.forward = sq_fwd;
    fa.backward = sq_bwd;
    fb = fa;
    fb.name = nb;
    dl_profile_reset(C);
    x = leaf(DL_SHAPE(5), 1.0f, false);
    in[0] = x;
    CHECK(dl_function_apply(&fa, 1, in, NULL) && dl_function_apply(&fa, 1, in, NULL) &&
          dl_function_apply(&fb, 1, in, NULL), "three calls: %s", dl_error_message(C));
    CHECK(calls(na) == 2 && calls(nb) == 1, "two rows: %lld and %lld calls", (long long)calls(na),
          (long long)calls(nb));
    dl_step_end(C);
    dl_profile_reset(C);
}

/* names of backward nodes: the op the user called, per dimension */
static void test_names(void)
{
    dl_tensor *x, *w, *y;
    dl_conv_desc cd = dl_conv_desc_make(1, 1, 1, 1);
    dl_profile_reset(C);
    x = leaf(DL_SHAPE(1, 2, 4, 4), 0.0f, true);
    w = leaf(DL_SHAPE(3, 2, 3, 3), 0.1f, true);
    y = dl_adaptive_avg_pool2d(dl_conv2d(x, w, NULL, &cd), DL_SHAPE(1, 1));
    y = dl_sum(y, DL_ALL, false);
    CHECK(y && dl_backward(y) == DL_OK, "conv2d, adaptive pool: %s", dl_error_message(C));
    CHECK(calls("dl_conv2d") == 1 && calls("dl_conv2d backward") == 1, "dl_conv2d and \"dl_conv2d backward\"");
    CHECK(calls("dl_adaptive_avg_pool2d") == 1 && calls("dl_adaptive_avg_pool2d backward") == 1,
          "dl_adaptive_avg_pool2d and its backward");
    CHECK(calls("dl_conv backward") == 0, "no generic \"dl_conv backward\" row");
    dl_step_end(C);
    dl_profile_reset(C);
}

/* every op of the op matrix, forward then backward: no span left open, none
   dropped, the op's row counted */
static void test_op_matrix(void)
{
    size_t c;
    int nbad = 0;
    dl_profile_enable(C, true);
    for (c = 0; c < sizeof g_ops / sizeof g_ops[0]; c++) {
        const opcase *oc = &g_ops[c];
        float *host[3];
        dl_tensor *in[3], *y;
        int j;
        dl_profile_reset(C);
        optable_inputs(oc, host);
        for (j = 0; j < oc->nin; j++) {
            if (oc->kind == 2 && j == 1) {
                int64_t iv[64], k, n = 1;
                int d;
                for (d = 0; d < oc->shape[j].ndim; d++) n *= oc->shape[j].d[d];
                for (k = 0; k < n && k < 64; k++) iv[k] = (int64_t)(host[j][k] * 5.0f) % 5;
                in[j] = dl_from_int64(C, oc->shape[j], iv);
            } else in[j] = dl_requires_grad(dl_from_array(C, oc->shape[j], host[j]), !oc->nograd);
        }
        y = oc->f(in);
        CHECK(y != NULL, "%s: %s", oc->name, dl_error_message(C));
        if (!strncmp(oc->name, "dl_", 3) && !strchr(oc->name, ' ') && strcmp(oc->name, "dl_bce_with_logits"))
            CHECK(calls(oc->name) >= 1, "%s: no row of its own", oc->name);
        if (C->prof->depth != 0 || C->prof->dropped != 0) nbad++;
        CHECK(C->prof->depth == 0, "%s forward: %d spans left open (top: %s)", oc->name, C->prof->depth,
              dl__prof_top(C) ? dl__prof_top(C) : "-");
        CHECK(C->prof->dropped == 0, "%s forward: %lld spans dropped", oc->name, (long long)C->prof->dropped);
        if (y && !oc->nograd && y->dtype == DL_DTYPE_F32) {
            dl_backward_desc bd;
            memset(&bd, 0, sizeof bd);
            bd.grad = dl_ones_like(y);
            CHECK(dl_backward_ex(y, &bd) == DL_OK, "%s backward: %s", oc->name, dl_error_message(C));
            CHECK(C->prof->depth == 0 && C->prof->dropped == 0, "%s backward: %d open, %lld dropped",
                  oc->name, C->prof->depth, (long long)C->prof->dropped);
        }
        dl_clear_error(C);
        dl_step_end(C);
        for (j = 0; j < oc->nin; j++) free(host[j]);
    }
    printf("profiler: %d ops of the op matrix, forward and backward, %d with open or dropped spans\n",
           (int)(sizeof g_ops / sizeof g_ops[0]), nbad);
    dl_profile_reset(C);
}

/* the ops outside the op matrix, and the paths that return early (an
   input as it is, a composite form): each is counted once and closes */
static void test_more_ops(void)
{
    dl_tensor *x, *v, *k;
    dl_tensor *rm = dl_keep(dl_zeros(C, DL_SHAPE(3))), *rv = dl_keep(dl_ones(C, DL_SHAPE(3)));
    dl_tensor *w, *ts[2];
    dl_tensor *p = dl_param(dl_ones(C, DL_SHAPE(3)));
    dl_pool_desc pd = dl_pool_desc_make(2, 2, 0, false, true);
    dl_loss_desc ld;
    float buf[96];
    int64_t ib[3];
    struct { const char *name; int kind; } cases[] = {
        {"dl_zeros_like", 0}, {"dl_ones_like", 1}, {"dl_keep", 2}, {"dl_write", 3}, {"dl_fill_", 4},
        {"dl_copy_", 5}, {"dl_item", 6}, {"dl_read", 7}, {"dl_read_int64", 8}, {"dl_detach", 9},
        {"dl_sgd_update", 10}, {"dl_to", 11}, {"dl_dropout", 12}, {"dl_batch_norm", 13},
        {"dl_batch_norm", 14}, {"dl_max_pool2d", 15}, {"dl_adaptive_avg_pool2d", 16}, {"dl_conv2d", 17},
        {"dl_flatten", 18}, {"dl_sum_to", 19}, {"dl_min", 20}, {"dl_stack", 21}, {"dl_matmul", 22},
        {"dl_binary_cross_entropy", 23}, {"dl_layer_norm", 24}, {"dl_conv_transpose1d", 25},
        {"dl_avg_pool1d", 26}, {"dl_argmax", 27}};
    size_t c;
    dl_profile_enable(C, true);
    dl_step_end(C);
    x = leaf(DL_SHAPE(2, 3, 4, 4), 0.1f, false);
    v = leaf(DL_SHAPE(3), 0.0f, false);
    w = leaf(DL_SHAPE(4, 3, 3, 3), 0.2f, false);
    memset(&ld, 0, sizeof ld);
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bool ok = true;
        dl_profile_reset(C);
        switch (cases[c].kind) {
        case 0: ok = dl_zeros_like(v) != NULL; break;
        case 1: ok = dl_ones_like(v) != NULL; break;
        case 2: k = dl_keep(v); ok = k != NULL; dl_free(k); break;
        case 3: memset(buf, 0, sizeof buf); ok = dl_write(rm, buf, 3) == DL_OK; break;
        case 4: ok = dl_fill_(rm, 0.0f) == DL_OK; break;
        case 5: ok = dl_copy_(rm, v) == DL_OK; break;
        case 6: ok = dl_item(dl_sum(v, DL_ALL, false)) == dl_item(dl_sum(v, DL_ALL, false)); break;
        case 7: ok = dl_read(v, buf, 3) == DL_OK; break;
        case 8: ok = dl_read_int64(dl_argmax(v, 0, false), ib, 1) == DL_OK; break;
        case 9: ok = dl_detach(v) != NULL; break;
        case 10: dl_backward(dl_sum(p, DL_ALL, false)); dl_profile_reset(C); dl_sgd_update(p, 0.1f); break;
        case 11: ok = dl_to(v, v->device) == v; break;
        case 12: ok = dl_dropout(x, 0.5f, false) == x; break;
        case 13: ok = dl_batch_norm(x, rm, rv, NULL, NULL, false, 0.1f, 1e-5f) != NULL; break;
        case 14: dl_requires_grad(rm, true);   /* eval with a differentiable running mean: the composite */
                 ok = dl_batch_norm(x, rm, rv, NULL, NULL, false, 0.1f, 1e-5f) != NULL;
                 dl_requires_grad(rm, false); break;
        case 15: ok = dl_max_pool2d(dl_reshape(x, DL_SHAPE(6, 4, 4)), &pd) != NULL; break;
        case 16: ok = dl_adaptive_avg_pool2d(dl_reshape(x, DL_SHAPE(6, 4, 4)), DL_SHAPE(2, 2)) != NULL; break;
        case 17: ok = dl_conv2d(dl_reshape(x, DL_SHAPE(3, 8, 4)), w, NULL, NULL) != NULL; break;
        case 18: ok = dl_flatten(dl_sum(v, DL_ALL, false), 0, -1) != NULL; break;
        case 19: ok = dl_sum_to(v, DL_SHAPE(3)) == v; break;
        case 20: ok = dl_min(x, DL_DIMS(1), false) != NULL; break;
        case 21: ts[0] = ts[1] = v; ok = dl_stack(2, ts, 0) != NULL; break;
        case 22: ok = dl_matmul(v, dl_reshape(w, DL_SHAPE(3, 36))) != NULL; break;
        case 23: ld.weight = v; ok = dl_binary_cross_entropy(dl_sigmoid(v), dl_sigmoid(v), &ld) != NULL; ld.weight = NULL; break;
        case 24: ok = dl_layer_norm(x, DL_SHAPE(4), NULL, NULL, 1e-5f) != NULL; break;
        case 25: ok = dl_conv_transpose1d(dl_reshape(x, DL_SHAPE(2, 3, 16)), dl_reshape(w, DL_SHAPE(3, 4, 9)), NULL, NULL) != NULL; break;
        case 26: ok = dl_avg_pool1d(dl_reshape(x, DL_SHAPE(6, 16)), &pd) != NULL; break;
        default: ok = dl_argmax(x, 1, true) != NULL; break;
        }
        CHECK(ok, "%s (case %d): %s", cases[c].name, cases[c].kind, dl_error_message(C));
        CHECK(C->prof->depth == 0 && C->prof->dropped == 0, "%s (case %d): %d spans open (top %s), %lld dropped",
              cases[c].name, cases[c].kind, C->prof->depth, dl__prof_top(C) ? dl__prof_top(C) : "-",
              (long long)C->prof->dropped);
        CHECK(calls(cases[c].name) == (cases[c].kind == 6 ? 2 : 1), "%s (case %d): %lld calls",
              cases[c].name, cases[c].kind, (long long)calls(cases[c].name));
    }
    dl_step_end(C);
    dl_free(rm);
    dl_free(rv);
    dl_free(p);
    dl_profile_reset(C);
}

/* a failed op is not counted and leaves no span open; a NULL input is silent */
static void test_failures(void)
{
    dl_tensor *a, *b;
    dl_log_fn old = C->log;
    void *olduser = C->log_user;
    dl_profile_reset(C);
    dl_set_log(C, dl_log_silent, NULL);
    a = leaf(DL_SHAPE(2, 3), 0.0f, false);
    b = leaf(DL_SHAPE(4, 5), 0.0f, false);
    CHECK(dl_matmul(a, b) == NULL, "shape error");
    EXPECT_ERR(C, DL_ERR_SHAPE, "dl_matmul");
    CHECK(dl_linear(a, b, NULL) == NULL, "dl_linear shape error");
    dl_clear_error(C);
    CHECK(C->prof->depth == 0, "no span open after errors");
    CHECK(calls("dl_matmul") == 0 && calls("dl_linear") == 0, "failed calls are not counted");
    CHECK(dl_cross_entropy(a, NULL, NULL) == NULL, "NULL target");
    dl_step_end(C);               /* (a NULL argument names no context: the step's end drops the span) */
    CHECK(C->prof->depth == 0, "no span open after the step");
    CHECK(dl_add(a, a) == NULL, "a stale tensor");
    dl_clear_error(C);
    CHECK(C->prof->depth == 0 && calls("dl_add") == 0, "a stale input: not counted");
    dl_set_log(C, old, olduser);
    dl_step_end(C);
    dl_profile_reset(C);
}

/* ------------------------------------------------------------------ the table */

static void test_table(void)
{
    dl_tensor *x, *w, *y;
    FILE *f = tmpfile();
    char line[512], *all = NULL;
    size_t len = 0;
    int nl = 0;
    dl_profile_reset(C);
    x = leaf(DL_SHAPE(6, 4), 0.5f, true);
    w = leaf(DL_SHAPE(3, 4), 0.5f, true);
    y = dl_mean(dl_tanh(dl_matmul(x, dl_transpose(w, 0, 1))), DL_ALL, false);
    CHECK(y && dl_backward(y) == DL_OK, "a small graph");
    dl_step_end(C);
    if (!f) { SKIP("tmpfile() failed"); return; }
    CHECK(dl_profile_print(C, f) == DL_OK, "dl_profile_print");
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        size_t k = strlen(line);
        char *na = (char *)realloc(all, len + k + 1);
        if (!na) break;
        all = na;
        memcpy(all + len, line, k + 1);
        len += k;
        nl++;
    }
    fclose(f);
    CHECK(all != NULL, "the table has lines");
    if (!all) return;
    {
        bool gpu = dl_ctx_device(C).type == DL_DEVICE_CUDA;
        const char *u = gpu ? "CUDA" : "CPU";
        char want[256];
        char heads[6][32];
        const char *at = strstr(all, "Name  ");
        int h;
        snprintf(heads[0], sizeof heads[0], "Self %s %%", u);
        snprintf(heads[1], sizeof heads[1], "Self %s", u);
        snprintf(heads[2], sizeof heads[2], "%s total %%", u);
        snprintf(heads[3], sizeof heads[3], "%s total", u);
        snprintf(heads[4], sizeof heads[4], "%s time avg", u);
        snprintf(heads[5], sizeof heads[5], "# of Calls");
        CHECK(strstr(all, "dl.h profile of ") != NULL, "a title line per device");
        for (h = 0; h < 6 && at; h++) at = strstr(at, heads[h]);   /* PyTorch's heads, in its order */
        CHECK(at != NULL, "PyTorch's column heads (Name, %s, ..., # of Calls) in\n%s", heads[0], all);
        CHECK(strstr(all, "    Self CPU %      Self CPU   CPU total %     CPU total  CPU time avg    # of Calls") ||
              gpu, "PyTorch's spacing (12-wide columns, two spaces apart)");
        snprintf(want, sizeof want, "Self %s time total: ", u);
        CHECK(strstr(all, want) != NULL, "the footer: %s", want);
        CHECK(strstr(all, "  dl_tanh backward  ") != NULL || strstr(all, " dl_tanh backward  ") != NULL,
              "backward rows named \"dl_tanh backward\"");
        CHECK(strstr(all, "1 steps") != NULL, "the step count");
    }
    {   /* rows: sorted by total, right-aligned names, percentages, times with units */
        dl_profile_row r[64];
        int n = dl_profile_rows(C, r, 64), i, sorted = 1;
        for (i = 1; i < n && i < 64; i++) if (r[i].total_s > r[i - 1].total_s) sorted = 0;
        CHECK(n >= 8 && sorted, "%d rows sorted by total time", n);
        CHECK(strstr(all, "us ") != NULL || strstr(all, "ms ") != NULL, "times in us/ms as PyTorch's");
        CHECK(strstr(all, "%") != NULL, "percentages");
        CHECK(nl == n + 6, "%d lines for %d rows (title, 3 rules, head, footer)", nl, n);
    }
    free(all);
    dl_profile_reset(C);
}

/* ------------------------------------------------------------------ off, the desc, the environment */

/* two SGD steps of a small MLP; the final weights to host */
static void train(dl_ctx *c, float *out, int64_t *nout)
{
    dl_module *m[3];
    dl_module *net;
    dl_optim *opt;
    dl_sgd_desc sd;
    int s;
    dl_tensor *x, *y;
    int64_t lab[8] = {0, 1, 2, 1, 0, 2, 1, 0};
    const dl_named_tensor *p;
    m[0] = dl_nn_linear(c, 6, 5, true);
    m[1] = dl_nn_relu(c);
    m[2] = dl_nn_linear(c, 5, 3, true);
    net = dl_nn_sequential(c, 3, m);
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.1f;
    sd.momentum = 0.9f;
    opt = dl_sgd(net, &sd);
    for (s = 0; s < 2; s++) {
        x = dl_randn(c, DL_SHAPE(8, 6));
        y = dl_from_int64(c, DL_SHAPE(8), lab);
        dl_optim_zero_grad(opt);
        CHECK(dl_backward(dl_cross_entropy(dl_module_forward(net, x), y, NULL)) == DL_OK, "a step");
        dl_optim_step(opt);
        dl_step_end(c);
    }
    *nout = 0;
    if (dl_module_named_parameters(net, &p) > 0 && p[0].t->numel <= 64) {
        dl_read(p[0].t, out, p[0].t->numel);
        *nout = p[0].t->numel;
    }
}

static void test_off_and_desc(void)
{
    dl_ctx_desc d;
    dl_ctx *a, *b;
    float wa[64], wb[64];
    int64_t na, nb;
    memset(&d, 0, sizeof d);
    d.seed = 7;
    d.device = dl_ctx_device(C);
    d.cpu_devices = C->ncpu;
    d.strict_devices = C->strict;
    d.profile = -1;
    a = dl_ctx_init(&d);
    d.profile = 1;
    b = dl_ctx_init(&d);
    CHECK(a && b, "two contexts");
    if (!a || !b) { dl_ctx_free(a); dl_ctx_free(b); return; }
    CHECK(a->prof == NULL && a->prof_data == NULL, "profile -1: off, no tables");
    CHECK(b->prof != NULL, "profile 1: on from dl_ctx_init");
    train(a, wa, &na);
    train(b, wb, &nb);
    CHECK(na > 0 && na == nb && memcmp(wa, wb, sizeof(float) * (size_t)na) == 0,
          "profiling changes no bit of training");
    CHECK(dl_profile_rows(a, NULL, 0) == 0, "off: nothing recorded");
    CHECK(dl_profile_rows(b, NULL, 0) > 0, "on: rows");
    {
        dl_profile_row r[64];
        int n = dl_profile_rows(b, r, 64), i;
        int64_t step = 0, zg = 0;
        for (i = 0; i < n && i < 64; i++) {
            if (!strcmp(r[i].name, "dl_optim_step")) step = r[i].calls;
            if (!strcmp(r[i].name, "dl_optim_zero_grad")) zg = r[i].calls;
        }
        CHECK(step == 2 && zg == 2, "optimizer spans: step %lld, zero_grad %lld", (long long)step, (long long)zg);
    }
    dl_profile_enable(b, false);
    CHECK(b->prof == NULL && dl_profile_rows(b, NULL, 0) > 0, "stopped: the rows stay for printing");
    dl_profile_reset(b);               /* nothing to print at dl_ctx_free */
    dl_ctx_free(a);
    dl_ctx_free(b);

    /* the environment fills what the desc leaves at zero */
    setenv("DL_PROFILE", "1", 1);
    d.profile = 0;
    a = dl_ctx_init(&d);
    d.profile = -1;
    b = dl_ctx_init(&d);
    CHECK(a && a->prof != NULL, "DL_PROFILE=1 with profile 0: on");
    CHECK(b && b->prof == NULL, "DL_PROFILE=1 with profile -1: off");
    setenv("DL_PROFILE", "0", 1);
    dl_ctx_free(b);
    d.profile = 0;
    b = dl_ctx_init(&d);
    CHECK(b && b->prof == NULL, "DL_PROFILE=0: off");
    /* anything else is refused, as the TF32 switches: "off" used to turn it on */
    d.log = dl_log_silent;
    setenv("DL_PROFILE", "off", 1);
    CHECK(dl_ctx_init(&d) == NULL && strstr(dl_error_message(NULL), "dl_ctx_init: DL_PROFILE=off must be 0 (off) or 1 (on)"),
          "DL_PROFILE=off: %s", dl_error_message(NULL));
    unsetenv("DL_PROFILE");
    d.profile = 2;
    CHECK(dl_ctx_init(&d) == NULL && strstr(dl_error_message(NULL), "dl_ctx_init: profile=2 must be 1 (on), -1 (off) or 0"),
          "profile=2: %s", dl_error_message(NULL));
    dl_clear_error(NULL);
    d.log = NULL;
    dl_ctx_free(a);                    /* (nothing recorded: no table) */
    dl_ctx_free(b);
}

/* dl_ctx_free prints the table to stderr when something was recorded */
static void test_print_at_free(void)
{
    dl_ctx_desc d;
    dl_ctx *a;
    memset(&d, 0, sizeof d);
    d.device = dl_ctx_device(C);
    d.cpu_devices = C->ncpu;
    d.strict_devices = C->strict;
    d.profile = 1;
    a = dl_ctx_init(&d);
    CHECK(a != NULL, "a profiled context");
    if (!a) return;
    CHECK(dl_add(dl_ones(a, DL_SHAPE(3)), dl_ones(a, DL_SHAPE(3))) != NULL, "an op");
    CHECK(a->prof_data->dirty, "recorded, not printed yet");
    {
        FILE *f = tmpfile();
        CHECK(f && dl_profile_print(a, f) == DL_OK, "printed to a FILE *");
        if (f) fclose(f);
    }
    CHECK(!a->prof_data->dirty, "printed: dl_ctx_free will not print it again");
    dl_ctx_free(a);
    CHECK(dl_profile_print(NULL, NULL) == DL_ERR_ARG, "NULL ctx");
    dl_profile_enable(NULL, true);
    dl_profile_reset(NULL);
    CHECK(dl_profile_rows(NULL, NULL, 0) == 0, "NULL ctx: no rows");
}

int main(void)
{
    (void)run_on;                    /* (optable.h's runner: this test drives the cases itself) */
    (void)free_result;
    C = dl_ctx_init(NULL);
    if (!C) { printf("no context: %s\n", dl_error_message(NULL)); return 1; }
    test_counts();
    test_nesting();
    test_custom_function();
    test_names();
    test_long_names();
    test_op_matrix();
    test_more_ops();
    test_failures();
    test_table();
    dl_profile_enable(C, false);
    dl_profile_reset(C);
    test_off_and_desc();
    test_print_at_free();
    dl_ctx_free(C);
    TEST_END();
}
