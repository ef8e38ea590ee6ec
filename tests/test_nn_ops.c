/* tests/test_nn_ops.c - normalization, dropout and losses (parts/nn_ops_*.h).

   1. PyTorch golden values (tests/golden/nn_ops.bin from
      tests/golden/gen_nn_ops.py): forward, input/weight/bias gradients for a
      fixed upstream gradient, Hessian-vector products where recorded, and the
      batch norm running statistics after the call; |got - want| <=
      1e-5 + 1e-4 |want|.
   2. dl_gradcheck of every op and option (central differences), including
      second derivatives (a gradient taken with create_graph, checked again).
   3. dropout statistics, scaling, seeding; large logits; int32 targets.
   4. errors: code and message, then the context still works; NULL inputs.
   5. infinities that a mask keeps out (masked logits, inf gradients).
      The newer losses (smooth_l1, huber, binary_cross_entropy, bce_logits
      with weight/pos_weight, kl_div) come from tests/golden/losses.bin
      (tests/golden/gen_losses.py), run the same way.
   6. gen_fuzz.py's random nets and losses (tests/golden/fuzz_nn.bin),
      random Sequentials of modules (fuzz_net.bin: the fused paths) and
      optimizer runs (fuzz_optim.bin).
   Run from the repository root:
       test_nn_ops [nn_ops.bin [losses.bin [fuzz_nn.bin [fuzz_net.bin [fuzz_optim.bin [dropout.bin]]]]]] */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>

#define G_MAXIN 8

#include "golden.h"

/* a loss desc with only the reduction set (reductions 0..3) */
static const dl_loss_desc *red(dl_reduction r)
{
    static dl_loss_desc d[8];
    int i = ((int)r & 3) + ((int)r < 0 || (int)r > 3 ? 4 : 0);
    memset(&d[i], 0, sizeof d[i]);
    d[i].reduction = r;
    return &d[i];
}


/* ------------------------------------------------------------------ golden: ops */

/* a program's instruction (gen_fuzz.py's nn programs) names no fields: its
   arguments are in this order (-1 in the program: one left out, NULL) */
static const char *g_cur_op;
static const struct { const char *op, *args; } g_pos_args[] = {
    {"batch_norm", "x rm rv w b"}, {"layer_norm", "x w b"}, {"cross_entropy", "x target weight"},
    {"nll_loss", "x target weight"}, {"mse_loss", "a b"}, {"l1_loss", "a b"}, {"smooth_l1_loss", "a b"},
    {"huber_loss", "a b"}, {"bce_logits", "x y w pw"}, {"binary_cross_entropy", "p y w"}, {"kl_div", "x y"}};

static dl_tensor *g_get(int n, const grec *const *rs, dl_tensor **in, const char *field)
{
    int k;
    if (!rs) {   /* by position */
        for (k = 0; k < (int)(sizeof g_pos_args / sizeof g_pos_args[0]); k++)
            if (!strcmp(g_pos_args[k].op, g_cur_op)) {
                const char *a = g_pos_args[k].args;
                size_t fl = strlen(field);
                int pos = 0;
                while (*a) {
                    if (!strncmp(a, field, fl) && (a[fl] == ' ' || a[fl] == 0)) return pos < n ? in[pos] : NULL;
                    while (*a && *a != ' ') a++;
                    while (*a == ' ') a++;
                    pos++;
                }
            }
        return NULL;
    }
    for (k = 0; k < n; k++) if (!strcmp(g_field(rs[k]), field)) return in[k];
    return NULL;
}

/* Runs op on the inputs, found by field name. *bad: the case is malformed. */
static dl_tensor *g_run(const char *op, int n, const grec *const *rs, dl_tensor **in,
                        const grec *p, const char **bad)
{
    dl_tensor *x;
    int np = p ? (int)p->numel : 0;
    *bad = NULL;
    g_cur_op = op;
    if (!strcmp(op, "prog")) return g_prog(n, in, p, bad);   /* gen_fuzz.py's nn programs (fuzz_nn.bin) */
    x = g_get(n, rs, in, "x");
#define G_NEED(npar) do { if (np < (npar)) { *bad = "too few params"; return NULL; } } while (0)
    if (!strcmp(op, "batch_norm")) {
        G_NEED(3);
        return dl_batch_norm(x, g_get(n, rs, in, "rm"), g_get(n, rs, in, "rv"), g_get(n, rs, in, "w"),
                             g_get(n, rs, in, "b"), p->v[0] != 0.0f, p->v[1], p->v[2]);
    }
    if (!strcmp(op, "dropout")) {   /* gen_dropout.py: the generator's state, then the mask it draws */
        uint64_t st[2];
        G_NEED(4);
        st[0] = (uint64_t)p->v[1];
        st[1] = (uint64_t)p->v[2] + ((uint64_t)p->v[3] << 24);
        if (dl_set_rng_state(g_ctx, st) != DL_OK) return NULL;
        return dl_dropout(x, p->v[0], true);
    }
    if (!strcmp(op, "layer_norm")) {
        G_NEED(2);
        return dl_layer_norm(x, g_param_shape(p, 1), g_get(n, rs, in, "w"), g_get(n, rs, in, "b"),
                             p->v[0]);
    }
    if (!strcmp(op, "cross_entropy") || !strcmp(op, "nll_loss")) {
        dl_loss_desc d; memset(&d, 0, sizeof d);
        G_NEED(3);
        d.reduction = (dl_reduction)(int)p->v[0];
        d.has_ignore_index = true;
        d.ignore_index = (int64_t)p->v[1];
        d.label_smoothing = p->v[2];
        d.weight = g_get(n, rs, in, "weight");
        if (!strcmp(op, "nll_loss")) return dl_nll_loss(x, g_get(n, rs, in, "target"), &d);
        return dl_cross_entropy(x, g_get(n, rs, in, "target"), &d);
    }
    if (!strcmp(op, "mse_loss")) { G_NEED(1); return dl_mse_loss(g_get(n, rs, in, "a"), g_get(n, rs, in, "b"), red((dl_reduction)(int)p->v[0])); }
    if (!strcmp(op, "l1_loss")) { G_NEED(1); return dl_l1_loss(g_get(n, rs, in, "a"), g_get(n, rs, in, "b"), red((dl_reduction)(int)p->v[0])); }
    if (!strcmp(op, "bce_logits")) {   /* optional weight w and pos_weight pw (losses.bin) */
        dl_loss_desc d; memset(&d, 0, sizeof d);
        G_NEED(1);
        d.reduction = (dl_reduction)(int)p->v[0];
        d.weight = g_get(n, rs, in, "w");
        d.pos_weight = g_get(n, rs, in, "pw");
        return dl_binary_cross_entropy_with_logits(x, g_get(n, rs, in, "y"), &d);
    }
    /* losses.bin (tests/golden/gen_losses.py) */
    if (!strcmp(op, "smooth_l1_loss") || !strcmp(op, "huber_loss")) {
        dl_loss_desc d; memset(&d, 0, sizeof d);
        G_NEED(2);
        d.reduction = (dl_reduction)(int)p->v[0];
        if (op[0] == 's') d.beta = p->v[1];   /* 0: default 1.0; -0.0f: beta 0 */
        else d.delta = p->v[1];               /* 0: default 1.0 */
        return (op[0] == 's' ? dl_smooth_l1_loss : dl_huber_loss)(g_get(n, rs, in, "a"), g_get(n, rs, in, "b"), &d);
    }
    if (!strcmp(op, "binary_cross_entropy")) {
        dl_loss_desc d; memset(&d, 0, sizeof d);
        G_NEED(1);
        d.reduction = (dl_reduction)(int)p->v[0];
        d.weight = g_get(n, rs, in, "w");
        return dl_binary_cross_entropy(g_get(n, rs, in, "p"), g_get(n, rs, in, "y"), &d);
    }
    if (!strcmp(op, "kl_div")) {
        dl_loss_desc d; memset(&d, 0, sizeof d);
        G_NEED(2);
        d.reduction = (dl_reduction)(int)p->v[0];
        d.log_target = p->v[1] != 0.0f;
        return dl_kl_div(x, g_get(n, rs, in, "y"), &d);
    }
#undef G_NEED
    return g_any(op, n, in, p, bad);   /* a program's other ops */
}

static void test_golden(const char *path)
{
    int ncases;
    if (!g_load(path)) { CHECK(0, "loading the golden file %s", path); return; }
    ncases = g_run_cases();
    printf("golden: %d cases (%d with double backward, %d running-stat updates) from %s\n", ncases,
           g_n_dd, g_n_after, path);
    CHECK(ncases > 80, "expected more than 80 cases in %s, found %d", path, ncases);
    CHECK(g_n_dd >= 8, "expected double-backward cases, found %d", g_n_dd);
    CHECK(g_n_after >= 10, "expected running-stat records, found %d", g_n_after);
    g_free_recs();
}

/* dropout (gen_dropout.py): dl.h's mask, recomputed from its documented
   generator (Philox4x32-10 of seed and counter), under PyTorch's
   arithmetic (x * mask * (1 / (1 - p)), the gradient likewise), each p in
   (0, 1), p 0 and 1, a zero seed, counters that cross 2^32, a double
   backward */
static void test_golden_dropout(const char *path)
{
    int ncases;
    uint64_t st[2];
    g_n_dd = g_n_after = 0;
    dl_get_rng_state(g_ctx, st);
    if (!g_load(path)) { CHECK(0, "loading the golden file %s", path); return; }
    ncases = g_run_cases();
    printf("golden: %d dropout cases (%d with double backward) from %s\n", ncases, g_n_dd, path);
    CHECK(ncases >= 9 && g_n_dd >= 1, "expected 9 dropout cases, one with double backward, in %s, found %d, %d", path,
          ncases, g_n_dd);
    g_free_recs();
    dl_set_rng_state(g_ctx, st);   /* (the tests after this one draw as before) */
}

/* the newer losses: smooth_l1 (beta default, 0.5, 2, -0.0f = 0), huber (delta
   default, 0.5, 3), binary_cross_entropy (weight broadcast), bce_logits with
   weight and pos_weight, kl_div (log_target, every reduction and batchmean) */
static void test_golden_losses(const char *path)
{
    int ncases;
    g_n_dd = g_n_after = 0;
    if (!g_load(path)) { CHECK(0, "loading the golden file %s", path); return; }
    ncases = g_run_cases();
    printf("golden: %d cases (%d with double backward) from %s\n", ncases, g_n_dd, path);
    CHECK(ncases >= 76, "expected at least 76 cases in %s, found %d", path, ncases);
    CHECK(g_n_dd >= 14, "expected at least 14 double-backward cases, found %d", g_n_dd);
    g_free_recs();
}

/* gen_fuzz.py's nn programs: small nets (Linear, batch norm in both modes,
   layer norm, convolution, pooling, activations) and a loss (cross entropy
   with class weights, label smoothing and ignore_index, nll, mse, l1,
   smooth_l1, huber, bce, bce_logits with weight and pos_weight, kl_div),
   the running statistics after */
static void test_golden_fuzz(const char *path)
{
    int ncases;
    g_n_dd = g_n_after = 0;
    if (!g_load(path)) { CHECK(0, "loading the golden file %s", path); return; }
    ncases = g_run_cases();
    printf("golden: %d programs (%d with double backward, %d running-stat updates) from %s\n", ncases, g_n_dd,
           g_n_after, path);
    CHECK(ncases >= 100, "expected at least 100 programs in %s, found %d", path, ncases);
    CHECK(g_n_dd >= 30 && g_n_after >= 20, "expected double-backward programs and running-stat records, found %d "
          "and %d", g_n_dd, g_n_after);
    g_free_recs();
}

/* gen_fuzz.py's nets of modules (fuzz_net.bin): a Sequential from its spec
   ([train, layer count, then per layer: code, param count, params]), the
   fused paths taken as they are met (convolution + activation [+ 2x2
   average pool], batch norm + ReLU [+ 2x2 max pool], Linear +
   activation), its state loaded from s_<name>, then out, the gradients of
   x and every parameter (dl_grad), the buffers after (after_<name>) and,
   where recorded, which first gradients carry history and the
   Hessian-vector products. */
static dl_module *g_net(dl_ctx *ctx, const grec *spec, const char **bad)
{
    const float *v = spec->v;
    long n = (long)spec->numel, pos = 2;
    dl_module *mods[64];
    int nl, i;
    if (n < 2 || (nl = (int)v[1]) < 1 || nl > 64) { *bad = "bad spec"; return NULL; }
    for (i = 0; i < nl; i++) {
        const float *q;
        int code, np;
        int64_t d[DL_MAX_DIMS], k;
        if (pos + 2 > n) { *bad = "spec cut short"; return NULL; }
        code = (int)v[pos];
        np = (int)v[pos + 1];
        pos += 2;
        if (np < 0 || pos + np > n) { *bad = "spec cut short"; return NULL; }
        q = v + pos;
        pos += np;
#define Q(j) ((int64_t)q[j])
        switch (code) {
        case 0: mods[i] = dl_nn_linear(ctx, Q(0), Q(1), q[2] != 0.0f); break;
        case 1: {
            dl_conv_desc c = dl_conv_desc_make(Q(3), Q(4), Q(5), Q(6));
            mods[i] = dl_nn_conv2d(ctx, Q(0), Q(1), Q(2), &c, q[7] != 0.0f);
            break;
        }
        case 2: mods[i] = dl_nn_batch_norm2d(ctx, Q(0)); break;
        case 3: mods[i] = dl_nn_batch_norm1d(ctx, Q(0)); break;
        case 4: mods[i] = dl_nn_relu(ctx); break;
        case 5: mods[i] = dl_nn_sigmoid(ctx); break;
        case 6: mods[i] = dl_nn_tanh(ctx); break;
        case 7: mods[i] = dl_nn_gelu(ctx); break;
        case 8: mods[i] = dl_nn_silu(ctx); break;
        case 9: mods[i] = dl_nn_leaky_relu(ctx, q[0]); break;
        case 10: mods[i] = dl_nn_flatten(ctx); break;
        case 11: {
            dl_pool_desc pd = dl_pool_desc_make(Q(0), Q(1), Q(2), false, true);
            mods[i] = dl_nn_max_pool2d(ctx, &pd);
            break;
        }
        case 12: {
            dl_pool_desc pd = dl_pool_desc_make(Q(0), Q(1), Q(2), q[3] != 0.0f, q[4] != 0.0f);
            mods[i] = dl_nn_avg_pool2d(ctx, &pd);
            break;
        }
        case 13: mods[i] = dl_nn_adaptive_avg_pool2d(ctx, DL_SHAPE(Q(0), Q(1))); break;
        case 14:
            for (k = 0; k < Q(0) && k < DL_MAX_DIMS && k + 1 < np; k++) d[k] = Q(1 + k);
            mods[i] = dl_nn_layer_norm(ctx, dl_shape_make((int)k, d));
            break;
        default: *bad = "unknown layer"; return NULL;
        }
#undef Q
        if (!mods[i]) return NULL;
    }
    return dl_nn_sequential(ctx, nl, mods);
}

/* the module tensor a record names (after its prefix), compared with it */
static void g_net_state(const char *cname, dl_module *net, const grec *r, const char *prefix)
{
    const char *f = g_field(r) + strlen(prefix);
    dl_tensor *t = dl_module_get(net, f);
    char what[96];
    snprintf(what, sizeof what, "%s%s", prefix, f);
    if (!t) { CHECK(0, "%s: %s: no such tensor in the net: %s", cname, what, dl_error_message(g_ctx)); return; }
    if (t->dtype == DL_DTYPE_I64) {   /* num_batches_tracked */
        int64_t c = -1;
        CHECK(t->numel == 1 && dl_read_int64(t, &c, 1) == DL_OK && (float)c == r->v[0], "%s: %s = %lld, PyTorch's %g",
              cname, what, (long long)c, (double)r->v[0]);
        return;
    }
    g_compare(cname, what, t, r);
}

static void g_net_case(long lo, long hi)
{
    char cname[64];
    const grec *spec = g_find(lo, hi, "", "spec"), *xr = g_find(lo, hi, "", "x"), *gr = g_find(lo, hi, "", "gout");
    const grec *outr = g_find(lo, hi, "", "out");
    const char *bad = NULL;
    const dl_named_tensor *np;
    dl_tensor *req[G_MAXREQ], *grads[G_MAXREQ], *x, *out;
    const char *names[G_MAXREQ];
    dl_module *net;
    dl_backward_desc desc;
    int nreq, k, dd;
    long i;
    size_t pl = g_prefix_len(&g_recs[lo]);
    snprintf(cname, sizeof cname, "%.*s", (int)(pl > 0 ? pl - 1 : 0), g_recs[lo].name);
    if (!spec || !xr || !gr || !outr) { CHECK(0, "%s: spec, x, gout or out missing", cname); return; }
    net = g_net(g_ctx, spec, &bad);
    if (!net) { CHECK(0, "%s: building the net: %s", cname, bad ? bad : dl_error_message(g_ctx)); return; }
    dl_no_grad_begin(g_ctx);
    for (i = lo; i < hi; i++) {   /* its state (num_batches_tracked: 0 on both sides) */
        const char *f = g_field(&g_recs[i]);
        dl_tensor *t;
        if (strncmp(f, "s_", 2) || strstr(f, "num_batches_tracked")) continue;
        t = dl_module_get(net, f + 2);
        CHECK(t && g_same_shape(t, &g_recs[i]) &&
              dl_copy_(t, dl_from_array(g_ctx, dl_shape_make(g_recs[i].ndim, g_recs[i].shape), g_recs[i].v)) == DL_OK,
              "%s: loading %s: %s", cname, f + 2, dl_error_message(g_ctx));
    }
    dl_no_grad_end(g_ctx);
    dl_module_train(net, spec->v[0] != 0.0f);
    x = dl_requires_grad(dl_from_array(g_ctx, dl_shape_make(xr->ndim, xr->shape), xr->v), true);
    out = dl_module_forward(net, x);
    if (!out) { CHECK(0, "%s: forward: %s", cname, dl_error_message(g_ctx)); return; }
    g_compare(cname, "out", out, outr);
    for (i = lo; i < hi; i++)
        if (!strncmp(g_field(&g_recs[i]), "after_", 6)) g_net_state(cname, net, &g_recs[i], "after_");
    req[0] = x;
    names[0] = "x";
    nreq = 1;
    k = dl_module_named_parameters(net, &np);
    for (i = 0; i < k && nreq < G_MAXREQ; i++) {
        names[nreq] = np[i].name;
        req[nreq++] = np[i].t;
    }
    dd = g_find(lo, hi, "", "v_x") != NULL;
    memset(&desc, 0, sizeof desc);
    desc.grad = dl_from_array(g_ctx, dl_shape_make(gr->ndim, gr->shape), gr->v);
    desc.create_graph = dd != 0;
    if (!g_same_shape(out, gr)) return;
    if (dl_grad(out, nreq, req, grads, &desc) != DL_OK) {
        CHECK(0, "%s: dl_grad: %s", cname, dl_error_message(g_ctx));
        return;
    }
    for (k = 0; k < nreq; k++) {
        const grec *g = g_find(lo, hi, "grad_", names[k]);
        char what[96];
        snprintf(what, sizeof what, "grad_%s", names[k]);
        if (!g) { CHECK(0, "%s: no %s record (the parameters' names or order differ)", cname, what); return; }
        g_compare(cname, what, grads[k], g);
    }
    if (!dd) return;
    g_n_dd++;
    g_second_order(cname, lo, hi, nreq, req, grads, names);
}

static void test_golden_nets(const char *path)
{
    int ncases;
    g_n_dd = 0;
    if (!g_load(path)) { CHECK(0, "loading the golden file %s", path); return; }
    ncases = g_each_case(g_net_case);
    printf("golden: %d nets of modules (%d with double backward) from %s\n", ncases, g_n_dd, path);
    CHECK(ncases >= 100 && g_n_dd >= 30, "expected at least 100 nets, 30 of them second order, in %s: %d, %d", path,
          ncases, g_n_dd);
    g_free_recs();
}

/* gen_fuzz.py's optimizer runs (fuzz_optim.bin): SGD (momentum,
   dampening, nesterov, weight decay, maximize), Adam and AdamW (betas,
   eps, weight decay, amsgrad, maximize) over 1-3 parameters, 2-8 steps of
   given gradients (each a backward of sum(p * g): exactly g) with the
   learning rate changed between steps (a schedule: dl_optim_set_lr, as
   torch's param_groups[0]["lr"]); the parameters after every step */
static void g_opt_case(long lo, long hi)
{
    char cname[64], f[32];
    const grec *hy = g_find(lo, hi, "", "hyper"), *lrs = g_find(lo, hi, "", "lrs"), *r;
    dl_tensor *ps[8];
    dl_optim *o = NULL;
    int np = 0, kind, steps, t, i;
    size_t pl = g_prefix_len(&g_recs[lo]);
    snprintf(cname, sizeof cname, "%.*s", (int)(pl > 0 ? pl - 1 : 0), g_recs[lo].name);
    if (!hy || hy->numel < 12 || !lrs) { CHECK(0, "%s: hyper or lrs missing", cname); return; }
    kind = (int)hy->v[0];
    steps = (int)hy->v[1];
    for (np = 0; np < 8; np++) {
        snprintf(f, sizeof f, "p%d", np);
        if (!(r = g_find(lo, hi, "", f))) break;
        ps[np] = dl_param(dl_from_array(g_ctx, dl_shape_make(r->ndim, r->shape), r->v));
    }
    if (kind == 0) {
        dl_sgd_desc d;
        memset(&d, 0, sizeof d);
        d.lr = hy->v[2]; d.momentum = hy->v[3]; d.dampening = hy->v[4]; d.weight_decay = hy->v[5];
        d.nesterov = hy->v[6] != 0.0f; d.maximize = hy->v[7] != 0.0f;
        o = dl_sgd_params(g_ctx, np, ps, &d);
    } else {
        dl_adam_desc d;
        memset(&d, 0, sizeof d);
        d.lr = hy->v[2]; d.beta1 = hy->v[8]; d.beta2 = hy->v[9]; d.eps = hy->v[10];
        d.weight_decay = hy->v[5] == 0.0f ? DL_ZERO : hy->v[5];   /* (AdamW's 0 means its default 0.01) */
        d.amsgrad = hy->v[11] != 0.0f; d.maximize = hy->v[7] != 0.0f;
        o = kind == 1 ? dl_adam_params(g_ctx, np, ps, &d) : dl_adamw_params(g_ctx, np, ps, &d);
    }
    if (!o || np == 0) { CHECK(0, "%s: the optimizer: %s", cname, dl_error_message(g_ctx)); return; }
    for (t = 0; t < steps && t < lrs->numel; t++) {
        dl_tensor *loss = NULL;
        dl_optim_zero_grad(o);
        for (i = 0; i < np; i++) {
            dl_tensor *term;
            snprintf(f, sizeof f, "g%d_%d", t, i);
            if (!(r = g_find(lo, hi, "", f))) { CHECK(0, "%s: no %s record", cname, f); goto done; }
            term = dl_sum(dl_mul(ps[i], dl_from_array(g_ctx, dl_shape_make(r->ndim, r->shape), r->v)), DL_ALL, false);
            loss = loss ? dl_add(loss, term) : term;
        }
        CHECK(dl_backward(loss) == DL_OK && dl_optim_set_lr(o, lrs->v[t]) == DL_OK && dl_optim_step(o) == DL_OK,
              "%s: step %d: %s", cname, t, dl_error_message(g_ctx));
        for (i = 0; i < np; i++) {
            snprintf(f, sizeof f, "after%d_%d", t, i);
            if (!(r = g_find(lo, hi, "", f))) { CHECK(0, "%s: no %s record", cname, f); goto done; }
            g_compare(cname, f, ps[i], r);
        }
        dl_step_end(g_ctx);
    }
done:
    dl_optim_free(o);
    for (i = 0; i < np; i++) dl_free(ps[i]);
}

static void test_golden_optims(const char *path)
{
    int ncases;
    if (!g_load(path)) { CHECK(0, "loading the golden file %s", path); return; }
    ncases = g_each_case(g_opt_case);
    printf("golden: %d optimizer runs from %s\n", ncases, path);
    CHECK(ncases >= 150, "expected at least 150 optimizer runs in %s, found %d", path, ncases);
    g_free_recs();
}

/* ------------------------------------------------------------------ gradcheck */

enum { GC_BN, GC_LN, GC_CE, GC_NLL, GC_MSE, GC_L1, GC_BCE, GC_DROP, GC_CE_HESS, GC_LN_HESS,
       GC_BN_HESS, GC_SL1, GC_HUBER, GC_BCEP, GC_BCEW, GC_KL, GC_LOSS_HESS, GC_BN_ADD_RELU,
       GC_CONV_ACT, GC_CONV_ACT_HESS };

/* inputs: in[0] = x (or a), then the fields flagged below, in this order */
typedef struct GC {
    int op;
    bool training;
    bool has_rs, has_w, has_b;    /* bn/ln: which of rm, rv, w, b are inputs */
    bool rs_grad;                 /* eval: rm/rv are inputs (grad) rather than fixed */
    dl_tensor *rm, *rv;           /* fixed running stats (training) */
    dl_shape ns;                  /* layer norm */
    dl_tensor *target;
    dl_loss_desc d;
    bool weight_in;               /* class weight is input in[1] */
    dl_reduction r;
    float p;                      /* dropout */
    uint64_t seed;
    double eps;                   /* dl_gradcheck's step (0: its default, 1e-3) */
    int sub;                      /* GC_LOSS_HESS: the loss (GC_SL1 .. GC_KL), desc d */
    dl_module *mod;               /* GC_BN_ADD_RELU: the BatchNorm; in = (x, r); GC_CONV_ACT(_HESS): a
                                     Sequential (conv, activation[, avg pool]) or (BatchNorm2d, ReLU,
                                     MaxPool2d); in = (x, its weight[, bias]) */
} GC;

static dl_ctx *G;

static dl_tensor *gc_loss(int op, dl_tensor *a, dl_tensor *b, const dl_loss_desc *d)
{
    switch (op) {
    case GC_SL1: return dl_smooth_l1_loss(a, b, d);
    case GC_HUBER: return dl_huber_loss(a, b, d);
    case GC_BCEP: return dl_binary_cross_entropy(a, b, d);
    case GC_BCEW: return dl_binary_cross_entropy_with_logits(a, b, d);
    case GC_KL: return dl_kl_div(a, b, d);
    }
    return NULL;
}

static dl_tensor *gc_fn(void *user, dl_tensor *const *in)
{
    GC *g = (GC *)user;
    int k = 1;
    switch (g->op) {
    case GC_BN: {
        dl_tensor *rm = g->rm, *rv = g->rv, *w = NULL, *b = NULL;
        if (g->rs_grad) { rm = in[k++]; rv = in[k++]; }
        if (g->has_w) w = in[k++];
        if (g->has_b) b = in[k++];
        return dl_batch_norm(in[0], rm, rv, w, b, g->training, 0.1f, 1e-5f);
    }
    case GC_LN: {
        dl_tensor *w = NULL, *b = NULL;
        if (g->has_w) w = in[k++];
        if (g->has_b) b = in[k++];
        return dl_layer_norm(in[0], g->ns, w, b, 1e-5f);
    }
    case GC_CE: case GC_NLL: {
        dl_loss_desc d = g->d;
        if (g->weight_in) d.weight = in[1];
        return g->op == GC_CE ? dl_cross_entropy(in[0], g->target, &d)
                              : dl_nll_loss(in[0], g->target, &d);
    }
    case GC_BN_ADD_RELU: return dl_module_forward_add_relu(g->mod, in[0], in[1]);
    case GC_CONV_ACT: return dl_module_forward(g->mod, in[0]);   /* in[1], in[2]: its parameters */
    case GC_MSE: return dl_mse_loss(in[0], in[1], red(g->r));
    case GC_L1: return dl_l1_loss(in[0], in[1], red(g->r));
    case GC_BCE: return dl_binary_cross_entropy_with_logits(in[0], in[1], red(g->r));
    case GC_DROP:
        dl_manual_seed(G, g->seed);   /* the same mask every call */
        return dl_dropout(in[0], g->p, true);
    case GC_SL1: case GC_HUBER: case GC_BCEP: case GC_BCEW: case GC_KL:
        return gc_loss(g->op, in[0], in[1], &g->d);   /* weights (fixed) in g->d */
    case GC_LOSS_HESS: {
        /* d sum(loss) / d in[0] with history; gradcheck checks its
           derivatives in both inputs (the Hessian and the mixed block) */
        dl_tensor *l, *gx = NULL, *x = in[0];
        bool off = !dl_is_grad_enabled(G);
        dl_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.create_graph = true;
        if (off) dl_no_grad_end(G);
        l = gc_loss(g->sub, in[0], in[1], &g->d);
        if (l && l->ndim) l = dl_sum(l, DL_ALL, false);
        if (l && dl_grad(l, 1, &x, &gx, &bd) != DL_OK) gx = NULL;
        if (off) dl_no_grad_begin(G);
        return gx;
    }
    case GC_CE_HESS: case GC_LN_HESS: case GC_BN_HESS: case GC_CONV_ACT_HESS: {
        /* a first gradient d l / d x with history (create_graph): gradcheck
           then checks its derivatives (the Hessian, and mixed ones in w, b).
           dl_gradcheck turns grad mode off for its finite differences; the
           inner dl_grad needs it on, so it is re-enabled around it. */
        dl_tensor *l, *gx = NULL, *x = in[0];
        bool off = !dl_is_grad_enabled(G);
        dl_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.create_graph = true;
        if (off) dl_no_grad_end(G);
        if (g->op == GC_CE_HESS) {
            dl_loss_desc d = g->d;
            if (g->weight_in) d.weight = in[1];
            l = dl_cross_entropy(x, g->target, &d);
            if (l && l->ndim) l = dl_sum(l, DL_ALL, false);
        } else if (g->op == GC_CONV_ACT_HESS) {
            l = dl_sum(dl_module_forward(g->mod, x), DL_ALL, false);   /* the activation: nonlinear */
        } else {
            dl_tensor *y = g->op == GC_LN_HESS ? dl_layer_norm(x, g->ns, in[1], in[2], 1e-5f)
                                              : dl_batch_norm(x, NULL, NULL, in[1], in[2], true, 0.1f, 1e-5f);
            l = dl_sum(dl_pow(y, 3.0f), DL_ALL, false);   /* nonlinear in y */
        }
        if (l && dl_grad(l, 1, &x, &gx, &bd) != DL_OK) gx = NULL;
        if (off) dl_no_grad_begin(G);
        return gx;
    }
    }
    return NULL;
}

/* ---- deterministic fills (an LCG, independent of the context's RNG) */
static uint64_t g_lcg = 12345;
static float urand(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_lcg >> 40) & 0xffffff) * (1.0f / 16777216.0f);
}

/* uniform in [lo, hi) */
static dl_tensor *U(dl_shape s, float lo, float hi, bool grad)
{
    dl_tensor *t = dl_empty(G, s);
    float *d;
    int64_t i;
    if (!t) return NULL;
    d = (float *)malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
    if (!d) return NULL;
    for (i = 0; i < t->numel; i++) d[i] = lo + (hi - lo) * urand();
    if (dl_write(t, d, t->numel) != DL_OK) t = NULL;
    free(d);
    return grad ? dl_requires_grad(t, true) : t;
}

/* class indices in [0, C), nign of them (spread out) set to ignore */
static dl_tensor *TG(dl_shape s, int C, int64_t ignore, int nign)
{
    int64_t v[256], n = 1, i;
    int k;
    for (k = 0; k < s.ndim; k++) n *= s.d[k];
    if (n > 256) return NULL;
    for (i = 0; i < n; i++) v[i] = (int64_t)(urand() * (float)C) % C;
    for (k = 0; k < nign && k < n; k++) v[(k * 7 + 1) % n] = ignore;
    return dl_from_int64(G, s, v);
}

static int g_ngc;

static void gc_run(const char *what, GC *g, int n, dl_tensor **in)
{
    dl_gradcheck_result res;
    dl_result rc;
    int k;
    for (k = 0; k < n; k++)
        if (!in[k]) { CHECK(0, "gradcheck %s: input %d not created: %s", what, k, dl_error_message(G)); dl_clear_error(G); dl_step_end(G); return; }
    {
        dl_gradcheck_desc d;
        memset(&d, 0, sizeof d);
        d.eps = g->eps;
        rc = dl_gradcheck(G, gc_fn, g, n, in, &d, &res);
    }
    g_ngc++;
    if (rc != DL_OK) {
        CHECK(0, "gradcheck %s: %s: %s", what, dl_result_string(rc), dl_error_message(G));
        dl_clear_error(G);
    } else {
        int worst = 0;
        for (k = 1; k < n; k++) if (res.max_abs_err[k] > res.max_abs_err[worst]) worst = k;
        CHECK(res.ok, "gradcheck %s: input %d max abs err %.3g (rel %.3g) at element %lld", what,
              worst, res.max_abs_err[worst], res.max_rel_err[worst], (long long)res.worst_index[worst]);
    }
    dl_step_end(G);
}

static GC gc_new(int op) { GC g; memset(&g, 0, sizeof g); g.op = op; memset(&g.d, 0, sizeof g.d); return g; }

static void gc_bn(const char *what, dl_shape xs, bool training, bool rs, bool w, bool b)
{
    GC g = gc_new(GC_BN);
    dl_tensor *in[5];
    dl_shape cs = DL_SHAPE(xs.d[1]);
    int n = 0;
    g.training = training;
    g.has_w = w;
    g.has_b = b;
    in[n++] = U(xs, -2.0f, 2.0f, true);
    if (rs && training) { g.rm = U(cs, -0.5f, 0.5f, false); g.rv = U(cs, 0.5f, 1.5f, false); }
    if (!training) {
        g.rs_grad = true;
        in[n++] = U(cs, -0.5f, 0.5f, true);
        in[n++] = U(cs, 0.5f, 1.5f, true);
    }
    if (w) in[n++] = U(cs, 0.5f, 1.5f, true);
    if (b) in[n++] = U(cs, -1.0f, 1.0f, true);
    gc_run(what, &g, n, in);
}

/* a BatchNorm for input xs (2d for 4 dims, else 1d), its weight and bias
   away from 1 and 0; eval (training false): running statistics of a batch
   first */
static dl_module *gc_bn_module(dl_shape xs, bool training)
{
    dl_module *bn = xs.ndim == 4 ? dl_nn_batch_norm2d(G, xs.d[1]) : dl_nn_batch_norm1d(G, xs.d[1]);
    const dl_named_tensor *ps;
    int np = dl_module_named_parameters(bn, &ps), k;
    dl_no_grad_begin(G);
    for (k = 0; k < np; k++) dl_copy_(ps[k].t, U(dl_shape_make(1, ps[k].t->shape), 0.5f, 1.5f, false));
    if (!training) dl_module_forward(bn, U(xs, -2.0f, 2.0f, false));   /* running statistics */
    dl_no_grad_end(G);
    dl_module_train(bn, training);
    return bn;
}

/* relu(bn(x) + r), the fused op of dl_module_forward_add_relu, in x and r
   (weight and bias: the module's, away from 1 and 0) */
static void gc_bn_add_relu(const char *what, dl_shape xs, bool training)
{
    GC g = gc_new(GC_BN_ADD_RELU);
    dl_tensor *in[2];
    g.mod = gc_bn_module(xs, training);
    in[0] = U(xs, -2.0f, 2.0f, true);
    in[1] = U(xs, -1.0f, 1.0f, true);
    gc_run(what, &g, 2, in);
}

/* a Sequential's convolution then activation (one op where the backend
   fuses them: a GPU's direct sums), and with pool a 2x2 average pool after
   (fused too for an even output), in x, the weight and the bias (the
   module's own tensors: gradcheck perturbs them in place); GCA_HESS: its
   second order, the derivatives of d sum(y) / dx (create_graph) */
enum { GCA_POOL = 1, GCA_HESS = 2, GCA_NOBIAS = 4 };
static void gc_conv_act(const char *what, dl_shape xs, int64_t out, int64_t k, int64_t stride, int64_t groups,
                        int act, int how)
{
    GC g = gc_new(how & GCA_HESS ? GC_CONV_ACT_HESS : GC_CONV_ACT);
    bool bias = !(how & GCA_NOBIAS);
    dl_conv_desc cd = dl_conv_desc_make(stride, 1, 1, groups);
    dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
    dl_tensor *in[3];
    dl_module *mods[3];
    const dl_named_tensor *ps;
    int np, j;
    mods[0] = xs.ndim == 3 ? dl_nn_conv1d(G, xs.d[1], out, k, &cd, bias) : dl_nn_conv2d(G, xs.d[1], out, k, &cd, bias);
    mods[1] = act == 0 ? dl_nn_relu(G) : act == 1 ? dl_nn_sigmoid(G) : dl_nn_tanh(G);
    mods[2] = dl_nn_avg_pool2d(G, &pd);
    g.mod = dl_nn_sequential(G, how & GCA_POOL ? 3 : 2, mods);
    np = dl_module_named_parameters(mods[0], &ps);
    in[0] = U(xs, -2.0f, 2.0f, true);
    for (j = 0; j < np && j < 2; j++) in[1 + j] = ps[j].t;
    gc_run(what, &g, 1 + np, in);
}

/* a Sequential's BatchNorm2d, ReLU and 2x2 max pool (one op where the
   backend fuses them: a GPU's bn_pool), in x, the weight and the bias
   (away from 1 and 0); eval: running statistics of a batch first; hess:
   the second order, as gc_conv_act's */
static void gc_bn_relu_pool(const char *what, dl_shape xs, bool training, bool hess)
{
    GC g = gc_new(hess ? GC_CONV_ACT_HESS : GC_CONV_ACT);
    dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
    dl_tensor *in[3];
    dl_module *mods[3];
    const dl_named_tensor *ps;
    int np, j;
    mods[0] = gc_bn_module(xs, training);
    mods[1] = dl_nn_relu(G);
    mods[2] = dl_nn_max_pool2d(G, &pd);
    g.mod = dl_nn_sequential(G, 3, mods);
    dl_module_train(g.mod, training);
    np = dl_module_named_parameters(mods[0], &ps);
    in[0] = U(xs, -2.0f, 2.0f, true);
    for (j = 0; j < np && j < 2; j++) in[1 + j] = ps[j].t;
    gc_run(what, &g, 1 + np, in);
}

static void gc_ln(const char *what, dl_shape xs, int k, bool affine)
{
    GC g = gc_new(GC_LN);
    dl_tensor *in[3];
    int n = 0;
    g.ns = dl_shape_make(k, xs.d + xs.ndim - k);
    g.has_w = g.has_b = affine;
    in[n++] = U(xs, -2.0f, 2.0f, true);
    if (affine) { in[n++] = U(g.ns, 0.5f, 1.5f, true); in[n++] = U(g.ns, -1.0f, 1.0f, true); }
    gc_run(what, &g, n, in);
}

static void gc_class(const char *what, int op, dl_shape xs, dl_reduction r, int64_t ignore, int nign,
                     float ls, bool weight)
{
    GC g = gc_new(op);
    dl_tensor *in[2];
    dl_shape ts;
    int i, n = 0;
    int64_t C = xs.ndim == 1 ? xs.d[0] : xs.d[1];   /* (C) with a 0-d target, or (N,C,...) */
    ts = dl_shape_make(xs.ndim - 1, NULL);
    if (xs.ndim > 1) ts.d[0] = xs.d[0];
    for (i = 2; i < xs.ndim; i++) ts.d[i - 1] = xs.d[i];
    g.d.reduction = r;
    g.d.has_ignore_index = true;
    g.d.ignore_index = ignore;
    g.d.label_smoothing = ls;
    g.target = TG(ts, (int)C, ignore, nign);
    in[n++] = U(xs, -2.0f, 2.0f, true);
    if (weight) { g.weight_in = true; in[n++] = U(DL_SHAPE(C), 0.3f, 1.5f, true); }
    if (!g.target) { CHECK(0, "gradcheck %s: targets", what); return; }
    gc_run(what, &g, n, in);
}

static void gc_pair(const char *what, int op, dl_shape s, dl_reduction r, float xlo, float xhi)
{
    GC g = gc_new(op);
    dl_tensor *in[2];
    g.r = r;
    in[0] = U(s, xlo, xhi, true);
    if (op == GC_BCE) in[1] = U(s, 0.0f, 1.0f, true);
    else if (op == GC_L1) {   /* b = a +- [0.1, 1): |a - b| far from the kink */
        float *a, *b;
        int64_t i;
        in[1] = U(s, 0.1f, 1.0f, true);
        a = th_host(in[0]);
        b = th_host(in[1]);
        if (a && b) {
            for (i = 0; i < in[0]->numel; i++) b[i] = a[i] + (urand() < 0.5f ? -b[i] : b[i]);
            th_put(in[1], b);
        }
    } else in[1] = U(s, -2.0f, 2.0f, true);
    gc_run(what, &g, 2, in);
}

/* smooth L1 / Huber: b = a +- offset with |a - b| at least 0.1 away from
   the kink (opt: beta or delta, 0 for smooth L1's beta 0) and from 0 */
static void gc_piecewise(const char *what, int op, dl_shape s, dl_reduction r, float opt, bool hess)
{
    GC g = gc_new(hess ? GC_LOSS_HESS : op);
    dl_tensor *in[2];
    float kink = opt == 0.0f ? (op == GC_SL1 && signbit(opt) ? 0.0f : 1.0f) : opt, *a, *b;
    int64_t i;
    g.sub = op;
    g.d.reduction = r;
    if (op == GC_SL1) g.d.beta = opt;
    else g.d.delta = opt;
    in[0] = U(s, -2.0f, 2.0f, true);
    in[1] = U(s, 0.0f, 1.0f, true);
    a = th_host(in[0]);
    b = th_host(in[1]);
    if (a && b) {
        for (i = 0; i < in[0]->numel; i++) {
            float off = kink > 0.3f && urand() < 0.5f ? 0.1f + (kink - 0.2f) * b[i] : kink + 0.1f + 1.5f * b[i];
            b[i] = a[i] + (urand() < 0.5f ? -off : off);
        }
        th_put(in[1], b);
    }
    gc_run(what, &g, 2, in);
}

/* in[0] (N,C) log-probabilities, in[1] probabilities (or their logs) */
static void gc_kl(const char *what, int64_t N, int64_t C, dl_reduction r, bool log_target, bool hess)
{
    GC g = gc_new(hess ? GC_LOSS_HESS : GC_KL);
    dl_tensor *in[2];
    int64_t i, j;
    g.sub = GC_KL;
    g.d.reduction = r;
    g.d.log_target = log_target;
    in[0] = U(DL_SHAPE(N, C), -1.0f, 1.0f, true);
    in[1] = U(DL_SHAPE(N, C), -1.0f, 1.0f, true);
    if (in[0] && in[1]) {
        float *hx = th_host(in[0]), *hy = th_host(in[1]);
        for (i = 0; i < N; i++) {
            float *x = hx + i * C, *y = hy + i * C;
            double sx = 0, sy = 0;
            for (j = 0; j < C; j++) { sx += exp(x[j]); sy += exp(y[j]); }
            for (j = 0; j < C; j++) {
                x[j] = (float)(x[j] - log(sx));
                y[j] = log_target ? (float)(y[j] - log(sy)) : (float)(exp(y[j]) / sy);
            }
        }
        th_put(in[0], hx);
        th_put(in[1], hy);
    }
    gc_run(what, &g, 2, in);
}

/* probabilities (GC_BCEP, p in [0.05, 0.95]) or logits (GC_BCEW); weight
   and pos_weight fixed (no grad), shapes broadcast to s */
static void gc_bce(const char *what, int op, dl_shape s, dl_reduction r, const dl_shape *ws,
                   const dl_shape *pws, bool hess)
{
    GC g = gc_new(hess ? GC_LOSS_HESS : op);
    dl_tensor *in[2];
    g.sub = op;
    g.d.reduction = r;
    if (ws) g.d.weight = U(*ws, 0.5f, 1.5f, false);
    if (pws) g.d.pos_weight = U(*pws, 0.2f, 3.0f, false);
    in[0] = op == GC_BCEP ? U(s, 0.05f, 0.95f, true) : U(s, -3.0f, 3.0f, true);
    in[1] = U(s, 0.0f, 1.0f, true);
    gc_run(what, &g, 2, in);
}

static void test_gradcheck_losses(void)
{
    static const char *rn[] = {"mean", "sum", "none", "batchmean"};
    const dl_shape c4 = DL_SHAPE(4), col3 = DL_SHAPE(3, 1), full = DL_SHAPE(3, 4), c3 = DL_SHAPE(3);
    char nm[128];
    int r, n0 = g_ngc;
    for (r = 0; r < 3; r++) {
        dl_reduction red = (dl_reduction)r;
        snprintf(nm, sizeof nm, "smooth_l1 default %s", rn[r]); gc_piecewise(nm, GC_SL1, DL_SHAPE(3, 4), red, 0.0f, false);
        snprintf(nm, sizeof nm, "smooth_l1 beta 0.5 %s", rn[r]); gc_piecewise(nm, GC_SL1, DL_SHAPE(3, 4), red, 0.5f, false);
        snprintf(nm, sizeof nm, "smooth_l1 beta 2 %s", rn[r]); gc_piecewise(nm, GC_SL1, DL_SHAPE(2, 3, 2), red, 2.0f, false);
        snprintf(nm, sizeof nm, "smooth_l1 beta -0.0f (0) %s", rn[r]); gc_piecewise(nm, GC_SL1, DL_SHAPE(3, 4), red, -0.0f, false);
        snprintf(nm, sizeof nm, "huber default %s", rn[r]); gc_piecewise(nm, GC_HUBER, DL_SHAPE(3, 4), red, 0.0f, false);
        snprintf(nm, sizeof nm, "huber delta 0.5 %s", rn[r]); gc_piecewise(nm, GC_HUBER, DL_SHAPE(3, 4), red, 0.5f, false);
        snprintf(nm, sizeof nm, "huber delta 3 %s", rn[r]); gc_piecewise(nm, GC_HUBER, DL_SHAPE(2, 3, 2), red, 3.0f, false);
        snprintf(nm, sizeof nm, "bce %s", rn[r]); gc_bce(nm, GC_BCEP, DL_SHAPE(3, 4), red, NULL, NULL, false);
        snprintf(nm, sizeof nm, "bce weight (4) %s", rn[r]); gc_bce(nm, GC_BCEP, DL_SHAPE(3, 4), red, &c4, NULL, false);
        snprintf(nm, sizeof nm, "bce weight (3,1) %s", rn[r]); gc_bce(nm, GC_BCEP, DL_SHAPE(3, 4), red, &col3, NULL, false);
        snprintf(nm, sizeof nm, "bce_logits weight+pos_weight %s", rn[r]); gc_bce(nm, GC_BCEW, DL_SHAPE(3, 4), red, &c4, &c4, false);
        snprintf(nm, sizeof nm, "bce_logits pos_weight %s", rn[r]); gc_bce(nm, GC_BCEW, DL_SHAPE(5, 3), red, NULL, &c3, false);
        snprintf(nm, sizeof nm, "bce_logits full weight %s", rn[r]); gc_bce(nm, GC_BCEW, DL_SHAPE(3, 4), red, &full, &c4, false);
    }
    for (r = 0; r < 4; r++) {
        snprintf(nm, sizeof nm, "kl_div %s", rn[r]); gc_kl(nm, 3, 4, (dl_reduction)r, false, false);
        snprintf(nm, sizeof nm, "kl_div log_target %s", rn[r]); gc_kl(nm, 3, 4, (dl_reduction)r, true, false);
    }
    /* second derivatives */
    gc_piecewise("hessian smooth_l1 beta 0.5", GC_SL1, DL_SHAPE(3, 4), DL_REDUCTION_MEAN, 0.5f, true);
    gc_piecewise("hessian smooth_l1 default", GC_SL1, DL_SHAPE(3, 4), DL_REDUCTION_SUM, 0.0f, true);
    gc_piecewise("hessian huber delta 3", GC_HUBER, DL_SHAPE(3, 4), DL_REDUCTION_NONE, 3.0f, true);
    gc_bce("hessian bce weight", GC_BCEP, DL_SHAPE(3, 4), DL_REDUCTION_MEAN, &c4, NULL, true);
    gc_bce("hessian bce_logits weight+pos_weight", GC_BCEW, DL_SHAPE(3, 4), DL_REDUCTION_SUM, &col3, &c4, true);
    gc_kl("hessian kl_div batchmean", 3, 4, DL_REDUCTION_BATCHMEAN, false, true);
    gc_kl("hessian kl_div log_target none", 3, 4, DL_REDUCTION_NONE, true, true);
    printf("%d gradcheck cases of the newer losses\n", g_ngc - n0);
}

static void test_gradcheck(void)
{
    static const char *rn[] = {"mean", "sum", "none"};
    char nm[128];
    int r;
    /* batch norm */
    gc_bn("bn train 2d affine", DL_SHAPE(6, 3), true, false, true, true);
    gc_bn("bn train 2d plain", DL_SHAPE(5, 4), true, false, false, false);
    gc_bn("bn train 2d running stats", DL_SHAPE(4, 3), true, true, true, true);
    gc_bn("bn train 3d affine+rs", DL_SHAPE(4, 3, 5), true, true, true, true);
    gc_bn("bn train 3d plain", DL_SHAPE(2, 3, 4), true, false, false, false);
    gc_bn("bn train 4d", DL_SHAPE(3, 2, 3, 4), true, false, true, true);
    gc_bn("bn train 4d plain", DL_SHAPE(2, 2, 2, 3), true, true, false, false);
    gc_bn("bn train 5d", DL_SHAPE(2, 3, 2, 2, 3), true, false, true, true);
    gc_bn("bn train 5d plain", DL_SHAPE(2, 2, 2, 3, 2), true, false, false, false);
    gc_bn("bn train weight only", DL_SHAPE(5, 2, 3), true, false, true, false);
    gc_bn("bn eval 2d affine", DL_SHAPE(4, 3), false, true, true, true);
    gc_bn("bn eval 2d plain", DL_SHAPE(3, 5), false, true, false, false);
    gc_bn("bn eval 3d", DL_SHAPE(2, 3, 4), false, true, true, true);
    gc_bn("bn eval 4d", DL_SHAPE(2, 3, 2, 2), false, true, true, false);
    gc_bn("bn eval 5d", DL_SHAPE(2, 2, 2, 2, 3), false, true, false, true);
    gc_bn_add_relu("bn+add+relu train 4d", DL_SHAPE(3, 2, 3, 4), true);
    gc_bn_add_relu("bn+add+relu train 2d", DL_SHAPE(6, 3), true);
    gc_bn_add_relu("bn+add+relu eval 4d", DL_SHAPE(2, 3, 2, 2), false);
    /* layer norm */
    gc_ln("ln 1 dim affine", DL_SHAPE(4, 6), 1, true);
    gc_ln("ln 1 dim plain", DL_SHAPE(2, 3, 5), 1, false);
    gc_ln("ln 2 dims affine", DL_SHAPE(2, 3, 4), 2, true);
    gc_ln("ln 2 dims plain", DL_SHAPE(3, 2, 5), 2, false);
    gc_ln("ln all dims", DL_SHAPE(3, 4), 2, true);
    /* class losses, every reduction and option */
    for (r = 0; r < 3; r++) {
        dl_reduction red = (dl_reduction)r;
        snprintf(nm, sizeof nm, "ce %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(5, 4), red, -100, 0, 0.0f, false);
        snprintf(nm, sizeof nm, "ce ignore %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(6, 4), red, -100, 2, 0.0f, false);
        snprintf(nm, sizeof nm, "ce ignore=1 %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(6, 3), red, 1, 2, 0.0f, false);
        snprintf(nm, sizeof nm, "ce smoothing %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(5, 4), red, -100, 0, 0.2f, false);
        snprintf(nm, sizeof nm, "ce weight %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(5, 4), red, -100, 0, 0.0f, true);
        snprintf(nm, sizeof nm, "ce weight+ignore+smoothing %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(6, 4), red, -100, 2, 0.1f, true);
        snprintf(nm, sizeof nm, "ce (N,C,d) %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(2, 3, 4), red, -100, 1, 0.0f, false);
        snprintf(nm, sizeof nm, "ce (N,C,d1,d2) all options %s", rn[r]); gc_class(nm, GC_CE, DL_SHAPE(2, 3, 2, 2), red, -100, 2, 0.3f, true);
        snprintf(nm, sizeof nm, "nll %s", rn[r]); gc_class(nm, GC_NLL, DL_SHAPE(5, 4), red, -100, 0, 0.0f, false);
        snprintf(nm, sizeof nm, "nll weight+ignore %s", rn[r]); gc_class(nm, GC_NLL, DL_SHAPE(6, 3), red, -100, 2, 0.0f, true);
        snprintf(nm, sizeof nm, "nll (N,C,d) %s", rn[r]); gc_class(nm, GC_NLL, DL_SHAPE(2, 4, 3), red, 0, 1, 0.0f, true);
        snprintf(nm, sizeof nm, "mse %s", rn[r]); gc_pair(nm, GC_MSE, DL_SHAPE(3, 4), red, -2.0f, 2.0f);
        snprintf(nm, sizeof nm, "l1 %s", rn[r]); gc_pair(nm, GC_L1, DL_SHAPE(2, 3, 2), red, -2.0f, 2.0f);
        snprintf(nm, sizeof nm, "bce %s", rn[r]); gc_pair(nm, GC_BCE, DL_SHAPE(3, 4), red, -3.0f, 3.0f);
        snprintf(nm, sizeof nm, "bce large logits %s", rn[r]); gc_pair(nm, GC_BCE, DL_SHAPE(2, 5), red, -40.0f, 40.0f);
    }
    gc_class("ce one sample (C)", GC_CE, DL_SHAPE(5), DL_REDUCTION_NONE, -100, 0, 0.0f, false);
    /* dropout: the mask is fixed by reseeding in the function */
    {
        GC g = gc_new(GC_DROP);
        dl_tensor *in[1];
        g.p = 0.3f;
        g.seed = 99;
        in[0] = U(DL_SHAPE(4, 5), -2.0f, 2.0f, true);
        gc_run("dropout p=0.3", &g, 1, in);
        g.p = 0.8f;
        in[0] = U(DL_SHAPE(50), -2.0f, 2.0f, true);
        gc_run("dropout p=0.8", &g, 1, in);
    }
    /* second derivatives: a first gradient (create_graph), checked again */
    {
        GC g = gc_new(GC_CE_HESS);
        dl_tensor *in[3];
        g.target = TG(DL_SHAPE(4), 3, -100, 0);
        in[0] = U(DL_SHAPE(4, 3), -2.0f, 2.0f, true);
        gc_run("hessian ce", &g, 1, in);
        g.d.label_smoothing = 0.2f;
        g.d.has_ignore_index = true;
        g.d.ignore_index = -100;
        g.weight_in = true;
        g.target = TG(DL_SHAPE(5), 3, -100, 1);
        in[0] = U(DL_SHAPE(5, 3), -2.0f, 2.0f, true);
        in[1] = U(DL_SHAPE(3), 0.5f, 1.5f, true);
        gc_run("hessian ce weight+smoothing+ignore", &g, 2, in);
        g = gc_new(GC_LN_HESS);
        g.ns = DL_SHAPE(4);
        in[0] = U(DL_SHAPE(3, 4), -2.0f, 2.0f, true);
        in[1] = U(DL_SHAPE(4), 0.5f, 1.5f, true);
        in[2] = U(DL_SHAPE(4), -1.0f, 1.0f, true);
        gc_run("hessian layer_norm", &g, 3, in);
        /* batch norm's first gradient is a difference of terms up to ~10
           (the mean of g and of g xhat taken from it): float rounding of
           about 5e-7 each, over 24 projected outputs, is some 2.4e-6 in the
           projection, 1.2e-3 in a central difference of step 1e-3: the
           default tolerance (1e-3 + 1e-2 |num|) itself, so a small entry
           (the bias's 6.5e-4) passed or failed on the last bits of the
           sums. A step of 1e-2 takes the noise to 1.2e-4; the truncation
           error it adds (eps^2 f''' / 6) stays under 1e-4 here. */
        g = gc_new(GC_BN_HESS);
        g.eps = 1e-2;
        in[0] = U(DL_SHAPE(4, 2, 3), -2.0f, 2.0f, true);
        in[1] = U(DL_SHAPE(2), 0.5f, 1.5f, true);
        in[2] = U(DL_SHAPE(2), -1.0f, 1.0f, true);
        gc_run("hessian batch_norm", &g, 3, in);
    }
    /* last: the cases above keep their random inputs. Sigmoid and tanh:
       smooth (ReLU's kinks defeat finite differences; its fused path is
       checked bit for bit against dl_relu's in test_nn) */
    gc_conv_act("conv2d+sigmoid", DL_SHAPE(2, 1, 6, 6), 3, 3, 1, 1, 1, 0);
    gc_conv_act("conv1d+tanh", DL_SHAPE(2, 2, 7), 3, 3, 1, 1, 2, 0);
    gc_conv_act("conv2d+tanh stride 2 groups 2", DL_SHAPE(2, 2, 5, 5), 4, 3, 2, 2, 2, 0);
    gc_conv_act("conv2d+sigmoid+avgpool", DL_SHAPE(2, 1, 6, 6), 3, 3, 1, 1, 1, GCA_POOL);
    gc_conv_act("conv2d+relu+avgpool stride 2 groups 2", DL_SHAPE(2, 2, 8, 8), 4, 3, 2, 2, 0, GCA_POOL);
    gc_conv_act("conv2d+sigmoid+avgpool, no bias", DL_SHAPE(2, 1, 6, 6), 3, 3, 1, 1, 1, GCA_POOL | GCA_NOBIAS);
    gc_conv_act("conv2d+sigmoid second order", DL_SHAPE(2, 1, 6, 6), 3, 3, 1, 1, 1, GCA_HESS);
    gc_conv_act("conv2d+tanh+avgpool second order", DL_SHAPE(2, 1, 6, 6), 3, 3, 1, 1, 2, GCA_POOL | GCA_HESS);
    gc_bn_relu_pool("bn2d+relu+maxpool train", DL_SHAPE(3, 2, 4, 6), true, false);
    gc_bn_relu_pool("bn2d+relu+maxpool eval", DL_SHAPE(2, 3, 4, 4), false, false);
    gc_bn_relu_pool("bn2d+relu+maxpool odd (unfused)", DL_SHAPE(2, 2, 5, 5), true, false);
    gc_bn_relu_pool("bn2d+relu+maxpool second order", DL_SHAPE(3, 2, 4, 4), true, true);
    gc_conv_act("conv2d+sigmoid+avgpool second order, no bias", DL_SHAPE(2, 1, 6, 6), 3, 3, 1, 1, 1,
                GCA_POOL | GCA_HESS | GCA_NOBIAS);
    printf("%d gradcheck cases\n", g_ngc);
}

/* ------------------------------------------------------------------ dropout */

static int64_t count_zeros(dl_tensor *t)
{
    const float *d = th_host(t);
    int64_t i, z = 0;
    if (!d) return -1;
    for (i = 0; i < t->numel; i++) z += d[i] == 0.0f;
    return z;
}

static void test_dropout(void)
{
    static const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
    const int64_t N = 100000;
    int k;
    for (k = 0; k < 4; k++) {
        float p = ps[k], scale = 1.0f / (1.0f - p);
        dl_tensor *x = dl_ones(G, DL_SHAPE(N)), *y = dl_dropout(x, p, true);
        const float *d = th_host(y);
        int64_t i, z = 0, wrong = 0;
        double frac;
        CHECK(d != NULL, "dropout p=%g: %s", (double)p, dl_error_message(G));
        if (!d) { dl_clear_error(G); continue; }
        for (i = 0; i < N; i++) {
            if (d[i] == 0.0f) z++;
            else if (d[i] != scale) wrong++;
        }
        frac = (double)z / (double)N;
        /* std of the fraction <= 0.0016; 0.01 is over 6 sigma */
        CHECK(fabs(frac - p) < 0.01, "dropout p=%g: zeroed fraction %.4f", (double)p, frac);
        CHECK(wrong == 0, "dropout p=%g: %lld kept values are not 1/(1-p) = %g", (double)p,
              (long long)wrong, (double)scale);
        {   /* mean preserved (inverted dropout) */
            double s = 0;
            for (i = 0; i < N; i++) s += d[i];
            CHECK(fabs(s / (double)N - 1.0) < 0.05, "dropout p=%g: mean %.4f, want ~1", (double)p, s / (double)N);
        }
        dl_step_end(G);
    }
    {   /* eval / p == 0: identity (x itself); p == 1: zeros with zero grad */
        dl_tensor *x = U(DL_SHAPE(3, 4), -1.0f, 1.0f, true), *y, *gx = NULL;
        CHECK(dl_dropout(x, 0.5f, false) == x, "dropout eval returns x");
        CHECK(dl_dropout(x, 0.0f, true) == x, "dropout p=0 returns x");
        CHECK(dl_dropout(x, 1.0f, false) == x, "dropout p=1 eval returns x");
        y = dl_dropout(x, 1.0f, true);
        CHECK(y && count_zeros(y) == 12, "dropout p=1: all zeros");
        CHECK(y && dl_grad(dl_sum(y, DL_ALL, false), 1, &x, &gx, NULL) == DL_OK && gx &&
              count_zeros(gx) == 12, "dropout p=1: zero gradient");
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* the same seed gives the same mask; grads equal mask/(1-p) */
        const float p = 0.4f, scale = 1.0f / (1.0f - p);
        dl_tensor *x = U(DL_SHAPE(64, 33), 0.5f, 1.5f, true), *y1, *y2, *y3, *gx = NULL;
        const float *a, *b, *c, *xd, *g;
        int64_t i, same12 = 0, same13 = 0, bad = 0, n = 64 * 33;
        dl_manual_seed(G, 2024);
        y1 = dl_dropout(x, p, true);
        y3 = dl_dropout(x, p, true);   /* the next mask: different */
        dl_manual_seed(G, 2024);
        y2 = dl_dropout(x, p, true);
        CHECK(y1 && y2 && y3, "dropout: %s", dl_error_message(G));
        if (y1 && y2 && y3 && dl_grad(dl_sum(y2, DL_ALL, false), 1, &x, &gx, NULL) == DL_OK && gx) {
            a = th_host(y1); b = th_host(y2); c = th_host(y3); xd = th_host(x); g = th_host(gx);
            for (i = 0; i < n; i++) {
                float mask = a[i] == 0.0f ? 0.0f : 1.0f;
                same12 += a[i] == b[i];
                same13 += (a[i] == 0.0f) == (c[i] == 0.0f);
                if (g[i] != mask * scale) bad++;
                if (a[i] != 0.0f && a[i] != xd[i] * scale) bad++;
            }
            CHECK(same12 == n, "dropout: same seed, %lld of %lld equal", (long long)same12, (long long)n);
            CHECK(same13 < n - n / 4, "dropout: consecutive masks too similar (%lld of %lld)", (long long)same13, (long long)n);
            CHECK(bad == 0, "dropout: %lld grads/values differ from mask/(1-p)", (long long)bad);
        } else {
            CHECK(0, "dropout grad: %s", dl_error_message(G));
            dl_clear_error(G);
        }
        dl_step_end(G);
    }
    {   /* the mask does not depend on the number of threads */
        int64_t n = 300000, i, diff = 0;
        dl_tensor *x, *y1, *y2;
        float *h = (float *)malloc(sizeof(float) * (size_t)n);
        int nt = dl_num_threads(G);
        dl_manual_seed(G, 5);
        x = dl_ones(G, DL_SHAPE(n));
        y1 = dl_dropout(x, 0.5f, true);
        if (h && y1 && dl_read(y1, h, n) != DL_OK) CHECK(0, "dropout: dl_read: %s", dl_error_message(G));
        dl_set_num_threads(G, nt == 1 ? 3 : 1);
        dl_manual_seed(G, 5);
        y2 = dl_dropout(x, 0.5f, true);
        dl_set_num_threads(G, 0);
        if (h && y2) {
            const float *d2 = th_host(y2);
            for (i = 0; i < n; i++) diff += h[i] != d2[i];
        }
        CHECK(h && y1 && y2 && diff == 0, "dropout: mask differs with the thread count (%lld)", (long long)diff);
        free(h);
        dl_step_end(G);
    }
}

/* ------------------------------------------------------------------ specific values */

static float item(dl_tensor *t) { float v = t ? dl_item(t) : NAN; dl_clear_error(G); return v; }

static void test_values(void)
{
    {   /* logits of +-1e4: finite, exact */
        float xv[6] = {1e4f, 0.0f, -1e4f, -1e4f, 1e4f, 0.0f};
        int64_t tv[2] = {0, 0};
        dl_tensor *x = dl_requires_grad(dl_from_array(G, DL_SHAPE(2, 3), xv), true);
        dl_tensor *t = dl_from_int64(G, DL_SHAPE(2), tv), *l, *gx = NULL;
        float g[6];
        l = dl_cross_entropy(x, t, NULL);
        CHECK(fabs(item(l) - 1e4) < 1e-1, "ce large logits: %g, want 1e4 (mean of 0 and 2e4)", (double)item(l));
        CHECK(l && dl_grad(l, 1, &x, &gx, NULL) == DL_OK && gx && dl_read(gx, g, 6) == DL_OK,
              "ce large logits grad: %s", dl_error_message(G));
        if (gx) {
            /* softmax - onehot, / N: row 0: (0,0,0); row 1: (-0.5, 0.5, 0) */
            float want[6] = {0, 0, 0, -0.5f, 0.5f, 0};
            CHECK(th_close(g, want, 6, 1e-6, 1e-6, NULL), "ce large logits grad: %g %g %g %g %g %g",
                  (double)g[0], (double)g[1], (double)g[2], (double)g[3], (double)g[4], (double)g[5]);
        }
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* bce with huge logits: finite loss and grad */
        float xv[4] = {1e4f, -1e4f, 1e30f, -1e30f}, yv[4] = {0.0f, 1.0f, 1.0f, 0.0f}, l[4] = {0}, g[4] = {0};
        dl_tensor *x = dl_requires_grad(dl_from_array(G, DL_SHAPE(4), xv), true);
        dl_tensor *y = dl_from_array(G, DL_SHAPE(4), yv), *o, *gx = NULL;
        float want_l[4] = {1e4f, 1e4f, 0.0f, 0.0f}, want_g[4] = {1.0f, -1.0f, 0.0f, 0.0f};
        o = dl_binary_cross_entropy_with_logits(x, y, red(DL_REDUCTION_NONE));
        CHECK(o && dl_read(o, l, 4) == DL_OK && th_close(l, want_l, 4, 1e-6, 0, NULL),
              "bce huge logits: %g %g %g %g", (double)l[0], (double)l[1], (double)l[2], (double)l[3]);
        CHECK(o && dl_grad(dl_sum(o, DL_ALL, false), 1, &x, &gx, NULL) == DL_OK && gx &&
              dl_read(gx, g, 4) == DL_OK && th_close(g, want_g, 4, 1e-6, 0, NULL),
              "bce huge logits grad: %g %g %g %g", (double)g[0], (double)g[1], (double)g[2], (double)g[3]);
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* binary_cross_entropy at p exactly 0 or 1 (a saturated sigmoid: sigmoid(20) is
           1.0f, sigmoid(-120) 0.0f). PyTorch: finite loss (logs clamped to -100) and
           finite gradient (p - y) / max(p (1 - p), 1e-12): 0 where p == y, -+1e12
           otherwise; through the sigmoid 0.
           Regression: the composite clamp(log(p)) backward gave NaN (0 * (1/p = inf));
           the loss now has PyTorch's backward rule of its own. */
        float pv[4] = {0.0f, 1.0f, 0.0f, 1.0f}, yv[4] = {0.0f, 1.0f, 1.0f, 0.0f}, g[4] = {9, 9, 9, 9};
        float xv[2] = {20.0f, -120.0f}, sy[2] = {1.0f, 0.0f}, gs[2] = {9, 9};
        dl_tensor *p = dl_requires_grad(dl_from_array(G, DL_SHAPE(4), pv), true), *gp = NULL, *gx = NULL;
        dl_tensor *x = dl_requires_grad(dl_from_array(G, DL_SHAPE(2), xv), true);
        dl_tensor *o = dl_binary_cross_entropy(p, dl_from_array(G, DL_SHAPE(4), yv), red(DL_REDUCTION_SUM));
        dl_tensor *os = dl_binary_cross_entropy(dl_sigmoid(x), dl_from_array(G, DL_SHAPE(2), sy), red(DL_REDUCTION_SUM));
        CHECK(item(o) == 200.0f, "bce at p in {0, 1}: loss %g, want 200 (two logs clamped to -100)", (double)item(o));
        CHECK(item(os) == 0.0f, "bce of sigmoid(+-large): loss %g, want 0", (double)item(os));
        CHECK(o && dl_grad(o, 1, &p, &gp, NULL) == DL_OK && gp && dl_read(gp, g, 4) == DL_OK, "bce edge grad: %s",
              dl_error_message(G));
        CHECK(g[0] == 0.0f && g[1] == 0.0f, "dl.h BUG: bce grad at p == y in {0, 1}: %g %g, PyTorch 0 0",
              (double)g[0], (double)g[1]);
        CHECK(fabs(g[2] + 1e12) <= 1e6 && fabs(g[3] - 1e12) <= 1e6,
              "dl.h BUG: bce grad at p = 0, y = 1 and p = 1, y = 0: %g %g, PyTorch -1e+12 1e+12", (double)g[2], (double)g[3]);
        CHECK(os && dl_grad(os, 1, &x, &gx, NULL) == DL_OK && gx && dl_read(gx, gs, 2) == DL_OK &&
              gs[0] == 0.0f && gs[1] == 0.0f,
              "dl.h BUG: bce(sigmoid(x), y) grad at x = 20, y = 1 and x = -120, y = 0: %g %g, PyTorch 0 0",
              (double)gs[0], (double)gs[1]);
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* bce at x == 0 (zero-initialized logits): grad sigmoid(0) - y = 0.5 - y */
        float xv[2] = {0.0f, 0.0f}, yv[2] = {0.0f, 1.0f}, g[2] = {9, 9};
        dl_tensor *x = dl_requires_grad(dl_from_array(G, DL_SHAPE(2), xv), true), *gx = NULL;
        dl_tensor *o = dl_binary_cross_entropy_with_logits(x, dl_from_array(G, DL_SHAPE(2), yv), red(DL_REDUCTION_SUM));
        CHECK(fabs(item(o) - 2.0 * log(2.0)) < 1e-6, "bce at 0: %g, want 2 log 2", (double)item(o));
        CHECK(o && dl_grad(o, 1, &x, &gx, NULL) == DL_OK && gx && dl_read(gx, g, 2) == DL_OK &&
              g[0] == 0.5f && g[1] == -0.5f, "bce grad at 0: %g %g, want 0.5 -0.5", (double)g[0], (double)g[1]);
        dl_step_end(G);
    }
    {   /* int32 targets give the int64 result; all ignored: mean NaN, sum 0, none zeros */
        int64_t t64[4] = {2, 0, 1, 2}, ign[4] = {-100, -100, -100, -100};
        int32_t t32[4] = {2, 0, 1, 2};
        dl_tensor *x = U(DL_SHAPE(4, 3), -1.0f, 1.0f, false);
        dl_loss_desc d; memset(&d, 0, sizeof d);
        float a = item(dl_cross_entropy(x, dl_from_int64(G, DL_SHAPE(4), t64), NULL));
        float b = item(dl_cross_entropy(x, dl_from_int32(G, DL_SHAPE(4), t32), NULL));
        float m, s, nz[4] = {1, 1, 1, 1};
        CHECK(a == a && a == b, "ce int32 target: %g vs int64 %g", (double)b, (double)a);
        m = item(dl_cross_entropy(x, dl_from_int64(G, DL_SHAPE(4), ign), NULL));
        CHECK(m != m, "ce all ignored, mean: %g, want NaN", (double)m);
        d.reduction = DL_REDUCTION_SUM;
        s = item(dl_cross_entropy(x, dl_from_int64(G, DL_SHAPE(4), ign), &d));
        CHECK(s == 0.0f, "ce all ignored, sum: %g, want 0", (double)s);
        d.reduction = DL_REDUCTION_NONE;
        CHECK(dl_read(dl_cross_entropy(x, dl_from_int64(G, DL_SHAPE(4), ign), &d), nz, 4) == DL_OK &&
              nz[0] == 0 && nz[1] == 0 && nz[2] == 0 && nz[3] == 0, "ce all ignored, none: zeros");
        memset(&d, 0, sizeof d);
        CHECK(dl_last_error(G) == DL_OK, "ce: stray error %s", dl_error_message(G));
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* batch norm running stats: by hand, (N,C,L) = (2,2,2), momentum 0.25 */
        float xv[8] = {1, 2, 10, 20, 3, 6, 30, 40};   /* ch0: 1,2,3,6  ch1: 10,20,30,40 */
        float rm0[2] = {1, -1}, rv0[2] = {2, 3}, rm[2], rv[2], rm2[2], rv2[2];
        dl_tensor *x = dl_from_array(G, DL_SHAPE(2, 2, 2), xv);
        dl_tensor *trm = dl_keep(dl_from_array(G, DL_SHAPE(2), rm0));
        dl_tensor *trv = dl_keep(dl_from_array(G, DL_SHAPE(2), rv0));
        dl_tensor *y = dl_batch_norm(dl_requires_grad(x, true), trm, trv, NULL, NULL, true, 0.25f, 1e-5f);
        /* ch0: mean 3, unbiased var (4+1+0+9)/3 = 14/3; ch1: mean 25, var (225+25+25+225)/3 = 500/3 */
        float wrm[2] = {0.75f * 1 + 0.25f * 3, 0.75f * -1 + 0.25f * 25};
        float wrv[2] = {0.75f * 2 + 0.25f * 14.0f / 3.0f, 0.75f * 3 + 0.25f * 500.0f / 3.0f};
        CHECK(y != NULL, "bn running stats: %s", dl_error_message(G));
        dl_read(trm, rm, 2);
        dl_read(trv, rv, 2);
        CHECK(th_close(rm, wrm, 2, 1e-6, 1e-6, NULL), "bn running_mean %g %g, want %g %g", (double)rm[0],
              (double)rm[1], (double)wrm[0], (double)wrm[1]);
        CHECK(th_close(rv, wrv, 2, 1e-6, 1e-6, NULL), "bn running_var %g %g, want %g %g", (double)rv[0],
              (double)rv[1], (double)wrv[0], (double)wrv[1]);
        CHECK(!trm->requires_grad && !trv->requires_grad && trm->grad == NULL, "bn running stats stay history-free");
        /* eval: uses (and does not change) them */
        y = dl_batch_norm(x, trm, trv, NULL, NULL, false, 0.25f, 0.0f);
        dl_read(trm, rm2, 2);
        dl_read(trv, rv2, 2);
        CHECK(!memcmp(rm, rm2, sizeof rm) && !memcmp(rv, rv2, sizeof rv), "bn eval leaves running stats");
        CHECK(y && fabs(th_f(y, 0) - (1.0f - wrm[0]) / sqrtf(wrv[0])) < 1e-5, "bn eval value %g",
              y ? (double)th_f(y, 0) : 0.0);
        /* training without running stats, in no-grad mode too */
        dl_no_grad_begin(G);
        y = dl_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1f, 0.0f);
        dl_no_grad_end(G);
        CHECK(y && fabs(th_f(y, 0) - (1.0f - 3.0f) / sqrtf(3.5f)) < 1e-5 && !y->requires_grad,
              "bn no-grad training value %g", y ? (double)th_f(y, 0) : 0.0);
        dl_free(trm);
        dl_free(trv);
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* batch norm statistics in one pass: data far from zero compared with
           their spread (1e4 + 1e-2 noise: sums of x and x^2 would cancel
           6 digits), and a channel whose first value is an outlier; the
           variance against a two-pass sum in double */
        enum { BN_N = 64, BN_L = 50 };
        float xv[BN_N * 2 * BN_L], rv[2];
        double mean[2] = {0, 0}, var[2] = {0, 0};
        uint64_t r = 12345;
        int i, c;
        dl_tensor *x, *trm, *trv, *y;
        for (i = 0; i < BN_N * 2 * BN_L; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            c = (i / BN_L) % 2;
            xv[i] = c == 0 ? 1e4f + 1e-2f * ((float)(r >> 40) / 16777216.0f - 0.5f)
                           : (float)(r >> 40) / 16777216.0f;
        }
        xv[BN_L] = 1e5f;   /* channel 1's first value */
        for (i = 0; i < BN_N * 2 * BN_L; i++) mean[(i / BN_L) % 2] += xv[i];
        for (c = 0; c < 2; c++) mean[c] /= BN_N * BN_L;
        for (i = 0; i < BN_N * 2 * BN_L; i++) {
            double dd = xv[i] - mean[(i / BN_L) % 2];
            var[(i / BN_L) % 2] += dd * dd;
        }
        x = dl_from_array(G, DL_SHAPE(BN_N, 2, BN_L), xv);
        trm = dl_zeros(G, DL_SHAPE(2));
        trv = dl_zeros(G, DL_SHAPE(2));
        y = dl_batch_norm(x, trm, trv, NULL, NULL, true, 1.0f, 1e-5f);   /* momentum 1: the batch's */
        dl_read(trv, rv, 2);
        for (c = 0; c < 2; c++) {
            double want = var[c] / (BN_N * BN_L - 1);   /* running_var is unbiased */
            CHECK(y && fabs(rv[c] - want) <= 1e-4 * want, "bn one-pass variance, channel %d: %.9g, want %.9g", c,
                  (double)rv[c], want);
        }
        {   /* the backward's channel sums on the same data: dweight =
               sum(g xhat) to 1e-5 of the sum of the terms' magnitudes,
               dbias = sum(g) and dx against double sums, to 1e-4 of the
               largest, given the saved float32 mean and 1/std (as
               PyTorch's: with a spread of 3e-3 around 1e4, the float mean's
               rounding alone moves dweight by a fifth, in PyTorch too) */
            float gv[BN_N * 2 * BN_L], wv[2] = {1.5f, -0.5f}, dwv[2], dbv[2];
            static double xh[BN_N * 2 * BN_L];
            double sg[2] = {0, 0}, sgx[2] = {0, 0}, is[2], dxmax = 0, dxerr = 0;
            dl_tensor *xg = dl_requires_grad(dl_from_array(G, DL_SHAPE(BN_N, 2, BN_L), xv), true);
            dl_tensor *wt = dl_requires_grad(dl_from_array(G, DL_SHAPE(2), wv), true);
            dl_tensor *bt = dl_requires_grad(dl_zeros(G, DL_SHAPE(2)), true), *yb, *gt;
            dl_backward_desc bd;
            const float *dxv;
            for (i = 0; i < BN_N * 2 * BN_L; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                gv[i] = (float)(r >> 40) / 16777216.0f - 0.3f;
            }
            for (c = 0; c < 2; c++) is[c] = (float)(1.0 / sqrt(var[c] / (BN_N * BN_L) + 1e-5));
            for (i = 0; i < BN_N * 2 * BN_L; i++) {
                c = (i / BN_L) % 2;
                xh[i] = (xv[i] - (double)(float)mean[c]) * is[c];
                sg[c] += gv[i];
                sgx[c] += gv[i] * xh[i];
            }
            gt = dl_from_array(G, DL_SHAPE(BN_N, 2, BN_L), gv);
            yb = dl_batch_norm(xg, NULL, NULL, wt, bt, true, 0.1f, 1e-5f);
            memset(&bd, 0, sizeof bd);
            bd.grad = gt;
            CHECK(yb && dl_backward_ex(yb, &bd) == DL_OK && xg->grad && wt->grad && bt->grad, "bn backward runs");
            if (xg->grad && wt->grad && bt->grad) {
                dl_read(wt->grad, dwv, 2);
                dl_read(bt->grad, dbv, 2);
                dxv = th_host(xg->grad);
                for (c = 0; c < 2; c++) {
                    double amax = 0;
                    for (i = 0; i < BN_N * 2 * BN_L; i++)
                        if ((i / BN_L) % 2 == c) amax += fabs(gv[i] * xh[i]);
                    CHECK(fabs(dwv[c] - sgx[c]) <= 1e-5 * amax && fabs(dbv[c] - sg[c]) <= 1e-4 * fabs(sg[c]),
                          "bn backward sums, channel %d: dweight %.9g want %.9g, dbias %.9g want %.9g", c,
                          (double)dwv[c], sgx[c], (double)dbv[c], sg[c]);
                }
                for (i = 0; i < BN_N * 2 * BN_L; i++) {
                    int64_t M = BN_N * BN_L;
                    double want;
                    c = (i / BN_L) % 2;
                    want = wv[c] * is[c] * (gv[i] - sg[c] / M - xh[i] * sgx[c] / M);
                    if (fabs(want) > dxmax) dxmax = fabs(want);
                    if (fabs(dxv[i] - want) > dxerr) dxerr = fabs(dxv[i] - want);
                }
                CHECK(dxerr <= 1e-4 * dxmax, "bn backward dx: largest error %.3g of %.3g", dxerr, dxmax);
            }
        }
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* layer norm: rows normalized to mean 0, var 1 */
        dl_tensor *x = U(DL_SHAPE(3, 16), -5.0f, 5.0f, false);
        dl_tensor *y = dl_layer_norm(x, DL_SHAPE(16), NULL, NULL, 0.0f);
        const float *yh = th_host(y);
        int i, j, ok = y != NULL;
        for (i = 0; ok && i < 3; i++) {
            double m = 0, v = 0;
            for (j = 0; j < 16; j++) m += yh[i * 16 + j];
            m /= 16;
            for (j = 0; j < 16; j++) v += (yh[i * 16 + j] - m) * (yh[i * 16 + j] - m);
            v /= 16;
            ok = fabs(m) < 1e-5 && fabs(v - 1) < 1e-4;
        }
        CHECK(ok, "layer_norm: rows not standardized");
        dl_step_end(G);
    }
}

/* Batch norm's statistics and backward sums take rows in blocks of channels
   (and, for rows shorter than 32, all of a block's elements of one sample
   at once): shapes that cross the blocks (C past 8, L below, at and above
   32, blocks of 512 / L channels), against plain double sums, with the
   saved float32 mean and 1/std for the backward as in the test above;
   the same on 1 and 2 threads to the bit. */
static void test_bn_blocks(void)
{
    static const int64_t shapes[][3] = {{5, 1, 1},   {37, 120, 1}, {300, 3, 1}, {9, 70, 3},  {4, 20, 31},
                                        {3, 17, 32}, {2, 9, 33},   {3, 11, 100}, {2, 600, 1}, {1, 5, 2}};
    int s;
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int64_t N = shapes[s][0], C = shapes[s][1], L = shapes[s][2], M = N * L, n = N * C * L, i, c;
        float *xv = (float *)malloc(sizeof(float) * (size_t)n), *gv = (float *)malloc(sizeof(float) * (size_t)n);
        float *first = (float *)malloc(sizeof(float) * (size_t)(3 * n + 4 * C));
        double *mean = (double *)calloc((size_t)(5 * C), sizeof(double)), *var = mean + C, *sg = var + C, *sgx = sg + C,
               *mag = sgx + C;
        uint64_t r = 99 + (uint64_t)s;
        int th, ok = xv && gv && first && mean;
        for (i = 0; ok && i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            xv[i] = 3.0f + (float)((r >> 40) % 1000) / 250.0f + (float)((i / L) % C);
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            gv[i] = (float)(r >> 40) / 16777216.0f - 0.4f;
        }
        for (i = 0; ok && i < n; i++) mean[(i / L) % C] += xv[i];
        for (c = 0; ok && c < C; c++) mean[c] /= (double)M;
        for (i = 0; ok && i < n; i++) {
            double d = xv[i] - mean[(i / L) % C];
            var[(i / L) % C] += d * d / (double)M;
        }
        for (th = 1; ok && th <= 2; th++) {
            dl_tensor *x, *w, *b, *g, *rm, *rv, *y;
            dl_backward_desc bd;
            dl_set_num_threads(G, th);
            x = dl_requires_grad(dl_from_array(G, DL_SHAPE(N, C, L), xv), true);
            w = dl_requires_grad(dl_full(G, DL_SHAPE(C), 0.75f), true);
            b = dl_requires_grad(dl_zeros(G, DL_SHAPE(C)), true);
            g = dl_from_array(G, DL_SHAPE(N, C, L), gv);
            rm = dl_zeros(G, DL_SHAPE(C));
            rv = dl_zeros(G, DL_SHAPE(C));
            y = dl_batch_norm(x, rm, rv, w, b, true, 1.0f, 1e-5f);
            memset(&bd, 0, sizeof bd);
            bd.grad = g;
            if (!y || dl_backward_ex(y, &bd) != DL_OK || !x->grad || !w->grad || !b->grad) {
                CHECK(0, "bn blocks (%lld,%lld,%lld): %s", (long long)N, (long long)C, (long long)L, dl_error_message(G));
                ok = 0;
                break;
            }
            if (th == 1) {   /* values against double sums */
                float *rmv = first, *rvv = rmv + C, *dw = rvv + C, *db = dw + C;
                const float *dx = th_host(x->grad);
                double dxerr = 0, dxmax = 0, merr = 0, verr = 0, swerr = 0, sberr = 0;
                dl_read(rm, rmv, C);
                dl_read(rv, rvv, C);
                dl_read(w->grad, dw, C);
                dl_read(b->grad, db, C);
                for (c = 0; c < C; c++) sg[c] = sgx[c] = mag[c] = 0;
                for (i = 0; i < n; i++) {
                    double is, xh;
                    c = (i / L) % C;
                    is = (float)(1.0 / sqrt(var[c] + 1e-5));
                    xh = (xv[i] - (double)(float)mean[c]) * is;
                    sg[c] += gv[i];
                    sgx[c] += gv[i] * xh;
                    mag[c] += fabs(gv[i]) * (1.0 + fabs(xh));
                }
                for (c = 0; c < C; c++) {
                    double wantv = M > 1 ? var[c] * (double)M / (double)(M - 1) : var[c], amax = mag[c];
                    if (fabs(rmv[c] - mean[c]) > merr * fabs(mean[c])) merr = fabs(rmv[c] - mean[c]) / fabs(mean[c]);
                    if (fabs(rvv[c] - wantv) > verr * (wantv + 1e-30)) verr = fabs(rvv[c] - wantv) / (wantv + 1e-30);
                    if (fabs(dw[c] - sgx[c]) > swerr * amax) swerr = fabs(dw[c] - sgx[c]) / amax;
                    if (fabs(db[c] - sg[c]) > sberr * amax) sberr = fabs(db[c] - sg[c]) / amax;
                }
                for (i = 0; i < n; i++) {
                    double is, xh, want, want2;
                    c = (i / L) % C;
                    is = (float)(1.0 / sqrt(var[c] + 1e-5));
                    xh = (xv[i] - (double)(float)mean[c]) * is;
                    want = 0.75 * is * (gv[i] - sg[c] / (double)M - xh * sgx[c] / (double)M);
                    /* the size of the terms, which cancel when M is small */
                    want2 = 0.75 * is * (fabs(gv[i]) + fabs(sg[c] / (double)M) + fabs(xh * sgx[c] / (double)M));
                    if (want2 > dxmax) dxmax = want2;
                    if (fabs(dx[i] - want) > dxerr) dxerr = fabs(dx[i] - want);
                }
                CHECK(merr <= 1e-6 && verr <= 1e-4 && swerr <= 1e-6 && sberr <= 1e-6 && dxerr <= 1e-5 * dxmax,
                      "bn blocks (%lld,%lld,%lld): mean %.3g var %.3g dweight %.3g dbias %.3g dx %.3g of %.3g",
                      (long long)N, (long long)C, (long long)L, merr, verr, swerr, sberr, dxerr, dxmax);
                memcpy(first + 4 * C, th_host(y), sizeof(float) * (size_t)n);
                memcpy(first + 4 * C + n, dx, sizeof(float) * (size_t)n);
            } else {   /* 2 threads: the same bits */
                float *t = first + 4 * C + 2 * n;
                int same = 1;
                dl_read(rm, t, C);
                same &= !memcmp(t, first, sizeof(float) * (size_t)C);
                dl_read(rv, t, C);
                same &= !memcmp(t, first + C, sizeof(float) * (size_t)C);
                dl_read(w->grad, t, C);
                same &= !memcmp(t, first + 2 * C, sizeof(float) * (size_t)C);
                dl_read(b->grad, t, C);
                same &= !memcmp(t, first + 3 * C, sizeof(float) * (size_t)C);
                same &= !memcmp(th_host(y), first + 4 * C, sizeof(float) * (size_t)n);
                same &= !memcmp(th_host(x->grad), first + 4 * C + n, sizeof(float) * (size_t)n);
                CHECK(same, "bn blocks (%lld,%lld,%lld): 2 threads give other bits than 1", (long long)N,
                      (long long)C, (long long)L);
            }
            dl_free(rm);
            dl_free(rv);
            dl_clear_error(G);
            dl_step_end(G);
        }
        CHECK(ok, "bn blocks (%lld,%lld,%lld): host memory", (long long)N, (long long)C, (long long)L);
        dl_set_num_threads(G, 0);
        free(xv);
        free(gv);
        free(first);
        free(mean);
    }
}

/* ------------------------------------------------------------------ errors */

/* after an error the context must still work */
static void still_works(const char *after)
{
    dl_tensor *a = dl_ones(G, DL_SHAPE(2, 3));
    dl_tensor *t = dl_sum(dl_mul_scalar(a, 2.0f), DL_ALL, false);
    CHECK(t && dl_item(t) == 12.0f && dl_last_error(G) == DL_OK, "context unusable after %s: %s",
          after, dl_error_message(G));
    dl_clear_error(G);
}

#define ERR(call, code, substr) do { \
    dl_tensor *e_r = (call); \
    CHECK(e_r == NULL, "%s: expected NULL", #call); \
    EXPECT_ERR(G, code, substr); \
    still_works(#call); \
} while (0)

#define SILENT(call) do { \
    dl_clear_error(G); \
    CHECK((call) == NULL && dl_last_error(G) == DL_OK, "%s: expected a silent NULL, got \"%s\"", #call, \
          dl_error_message(G)); \
} while (0)

static void test_errors(void)
{
    dl_tensor *x = U(DL_SHAPE(4, 3, 2), -1.0f, 1.0f, false);
    dl_tensor *c3 = dl_ones(G, DL_SHAPE(3)), *c4 = dl_ones(G, DL_SHAPE(4)), *c33 = dl_ones(G, DL_SHAPE(3, 1));
    dl_tensor *logits = U(DL_SHAPE(5, 10), -1.0f, 1.0f, false), *lp3 = U(DL_SHAPE(2, 10, 3), -1.0f, 1.0f, false);
    int64_t tv[20] = {1, 2, 3, 4, 5}, tbad[5] = {1, 2, 10, 4, 5}, tneg[5] = {0, -1, 2, 3, 4}, tign[5] = {0, -100, 2, 3, 4};
    float tf[5] = {1, 2, 3, 4, 5};
    dl_tensor *t = dl_from_int64(G, DL_SHAPE(5), tv);
    dl_loss_desc d; memset(&d, 0, sizeof d);
    dl_tensor *rgc = dl_requires_grad(dl_ones(G, DL_SHAPE(3)), true);

    /* batch norm */
    ERR(dl_batch_norm(x, c4, c3, NULL, NULL, true, 0.1f, 1e-5f), DL_ERR_SHAPE, "running_mean (4) must have shape (3)");
    ERR(dl_batch_norm(x, c3, c4, NULL, NULL, false, 0.1f, 1e-5f), DL_ERR_SHAPE, "running_var (4)");
    ERR(dl_batch_norm(x, c3, c33, NULL, NULL, false, 0.1f, 1e-5f), DL_ERR_SHAPE, "running_var (3,1)");
    ERR(dl_batch_norm(x, NULL, NULL, c4, NULL, true, 0.1f, 1e-5f), DL_ERR_SHAPE, "weight (4) must have shape (3)");
    ERR(dl_batch_norm(x, NULL, NULL, c3, c4, true, 0.1f, 1e-5f), DL_ERR_SHAPE, "bias (4)");
    ERR(dl_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1f, 1e-5f), DL_ERR_ARG, "eval mode");
    ERR(dl_batch_norm(x, c3, NULL, NULL, NULL, true, 0.1f, 1e-5f), DL_ERR_ARG, "both running_mean and running_var");
    ERR(dl_batch_norm(c3, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f), DL_ERR_SHAPE, "at least 2 dims");
    ERR(dl_batch_norm(dl_ones(G, DL_SHAPE(1, 3)), NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f), DL_ERR_SHAPE,
        "more than 1 value per channel");
    ERR(dl_batch_norm(x, rgc, c3, NULL, NULL, true, 0.1f, 1e-5f), DL_ERR_ARG, "must not require grad");
    ERR(dl_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1f, -1.0f), DL_ERR_ARG, "eps");
    ERR(dl_batch_norm(x, dl_from_int64(G, DL_SHAPE(3), tv), c3, NULL, NULL, false, 0.1f, 1e-5f), DL_ERR_DTYPE, "running_mean");
    /* layer norm */
    ERR(dl_layer_norm(x, DL_SHAPE(3), NULL, NULL, 1e-5f), DL_ERR_SHAPE, "must equal the last 1 dims");
    ERR(dl_layer_norm(x, DL_SHAPE(4, 2), NULL, NULL, 1e-5f), DL_ERR_SHAPE, "normalized_shape (4,2)");
    ERR(dl_layer_norm(x, dl_shape_make(0, NULL), NULL, NULL, 1e-5f), DL_ERR_SHAPE, "1..3 dims");
    ERR(dl_layer_norm(x, DL_SHAPE(1, 4, 3, 2), NULL, NULL, 1e-5f), DL_ERR_SHAPE, "1..3 dims");
    ERR(dl_layer_norm(x, DL_SHAPE(3, 2), c3, NULL, 1e-5f), DL_ERR_SHAPE, "weight (3) must have shape (3,2)");
    ERR(dl_layer_norm(x, DL_SHAPE(2), NULL, c3, 1e-5f), DL_ERR_SHAPE, "bias (3)");
    /* class losses */
    ERR(dl_cross_entropy(logits, dl_from_int64(G, DL_SHAPE(4), tv), NULL), DL_ERR_SHAPE, "target (4)");
    ERR(dl_cross_entropy(logits, dl_from_int64(G, DL_SHAPE(5, 1), tv), NULL), DL_ERR_SHAPE, "without its class dim");
    ERR(dl_cross_entropy(lp3, dl_from_int64(G, DL_SHAPE(2, 10), tv), NULL), DL_ERR_SHAPE, "target (2,10)");
    ERR(dl_cross_entropy(logits, dl_from_array(G, DL_SHAPE(5), tf), NULL), DL_ERR_DTYPE, "must be int64 or int32");
    ERR(dl_cross_entropy(logits, dl_from_int64(G, DL_SHAPE(5), tbad), NULL), DL_ERR_ARG, "holds 10 at flat index 2");
    ERR(dl_cross_entropy(logits, dl_from_int64(G, DL_SHAPE(5), tneg), NULL), DL_ERR_ARG, "holds -1 at flat index 1");
    ERR(dl_nll_loss(logits, dl_from_int64(G, DL_SHAPE(5), tbad), NULL), DL_ERR_ARG, "[0, 10)");
    {
        int32_t t32[5] = {0, 1, 2, 3, 11};
        ERR(dl_cross_entropy(logits, dl_from_int32(G, DL_SHAPE(5), t32), NULL), DL_ERR_ARG, "holds 11");
    }
    d.ignore_index = 3;   /* without has_ignore_index: an error, never silently -100 */
    ERR(dl_cross_entropy(logits, dl_from_int64(G, DL_SHAPE(5), tign), &d), DL_ERR_ARG, "has_ignore_index is false");
    d.has_ignore_index = true;   /* -100 is no longer ignored */
    ERR(dl_cross_entropy(logits, dl_from_int64(G, DL_SHAPE(5), tign), &d), DL_ERR_ARG, "holds -100");
    memset(&d, 0, sizeof d);
    CHECK(dl_cross_entropy(logits, dl_from_int64(G, DL_SHAPE(5), tign), &d) != NULL, "ce: -100 ignored by default");
    d.label_smoothing = 1.5f;
    ERR(dl_cross_entropy(logits, t, &d), DL_ERR_ARG, "label_smoothing=1.5 must be in [0, 1]");
    d.label_smoothing = -0.1f;
    ERR(dl_cross_entropy(logits, t, &d), DL_ERR_ARG, "label_smoothing");
    d.label_smoothing = NAN;
    ERR(dl_cross_entropy(logits, t, &d), DL_ERR_ARG, "label_smoothing");
    d.label_smoothing = 0.1f;
    ERR(dl_nll_loss(logits, t, &d), DL_ERR_ARG, "dl_loss_desc.label_smoothing is set but this loss does not use it");
    memset(&d, 0, sizeof d);
    d.weight = c4;
    ERR(dl_cross_entropy(logits, t, &d), DL_ERR_SHAPE, "weight (4) must have shape (10)");
    d.weight = dl_ones(G, DL_SHAPE(10, 1));
    ERR(dl_nll_loss(logits, t, &d), DL_ERR_SHAPE, "weight (10,1)");
    memset(&d, 0, sizeof d);
    d.reduction = (dl_reduction)7;
    ERR(dl_cross_entropy(logits, t, &d), DL_ERR_ARG, "reduction 7");
    memset(&d, 0, sizeof d);
    ERR(dl_cross_entropy(dl_ones(G, dl_shape_make(0, NULL)), t, NULL), DL_ERR_SHAPE, "logits ()");
    ERR(dl_nll_loss(dl_from_int64(G, DL_SHAPE(5), tv), t, NULL), DL_ERR_DTYPE, "log_probs");
    /* elementwise losses */
    ERR(dl_mse_loss(c3, c4, red(DL_REDUCTION_MEAN)), DL_ERR_SHAPE, "input (3) and target (4) must have the same shape");
    ERR(dl_mse_loss(c3, c33, red(DL_REDUCTION_MEAN)), DL_ERR_SHAPE, "same shape");
    ERR(dl_l1_loss(c3, c4, red(DL_REDUCTION_SUM)), DL_ERR_SHAPE, "dl_l1_loss");
    ERR(dl_binary_cross_entropy_with_logits(c3, c4, red(DL_REDUCTION_NONE)), DL_ERR_SHAPE, "dl_binary_cross_entropy_with_logits");
    ERR(dl_mse_loss(c3, c3, red((dl_reduction)-1)), DL_ERR_ARG, "reduction -1");
    ERR(dl_l1_loss(c3, dl_from_int64(G, DL_SHAPE(3), tv), red(DL_REDUCTION_SUM)), DL_ERR_DTYPE, "float32");
    /* the newer losses: a desc field the loss does not use is an error naming it */
    {
        dl_tensor *a = U(DL_SHAPE(3, 4), -1.0f, 1.0f, false), *b = U(DL_SHAPE(3, 4), -1.0f, 1.0f, false);
        dl_tensor *pr = U(DL_SHAPE(3, 4), 0.1f, 0.9f, false), *w4 = dl_ones(G, DL_SHAPE(4));
        float pv[4] = {0.5f, 1.5f, 0.25f, 0.0f}, nv[4] = {0.5f, -0.1f, 0.25f, 1.0f}, qv[4] = {0.5f, NAN, 0.2f, 1.0f};
        float yv4[4] = {0.0f, 1.0f, 0.25f, 1.0f};
        dl_tensor *y4 = dl_full(G, DL_SHAPE(4), 0.5f);
        memset(&d, 0, sizeof d); d.label_smoothing = 0.1f;
        ERR(dl_mse_loss(a, b, &d), DL_ERR_ARG, "dl_mse_loss: dl_loss_desc.label_smoothing is set but this loss does not use it");
        ERR(dl_smooth_l1_loss(a, b, &d), DL_ERR_ARG, "dl_smooth_l1_loss: dl_loss_desc.label_smoothing");
        ERR(dl_kl_div(a, b, &d), DL_ERR_ARG, "dl_kl_div: dl_loss_desc.label_smoothing");
        memset(&d, 0, sizeof d); d.beta = 0.5f;
        ERR(dl_huber_loss(a, b, &d), DL_ERR_ARG, "dl_huber_loss: dl_loss_desc.beta is set but this loss does not use it");
        ERR(dl_l1_loss(a, b, &d), DL_ERR_ARG, "dl_loss_desc.beta");
        d.beta = -0.0f;   /* an explicit zero is still "set" */
        ERR(dl_mse_loss(a, b, &d), DL_ERR_ARG, "dl_loss_desc.beta");
        memset(&d, 0, sizeof d); d.delta = 2.0f;
        ERR(dl_smooth_l1_loss(a, b, &d), DL_ERR_ARG, "dl_smooth_l1_loss: dl_loss_desc.delta is set");
        ERR(dl_binary_cross_entropy(pr, b, &d), DL_ERR_ARG, "dl_loss_desc.delta");
        memset(&d, 0, sizeof d); d.pos_weight = w4;
        ERR(dl_binary_cross_entropy(pr, pr, &d), DL_ERR_ARG, "dl_binary_cross_entropy: dl_loss_desc.pos_weight is set");
        ERR(dl_mse_loss(a, b, &d), DL_ERR_ARG, "dl_loss_desc.pos_weight");
        memset(&d, 0, sizeof d); d.weight = w4;
        ERR(dl_kl_div(a, b, &d), DL_ERR_ARG, "dl_kl_div: dl_loss_desc.weight is set");
        ERR(dl_huber_loss(a, b, &d), DL_ERR_ARG, "dl_loss_desc.weight");
        memset(&d, 0, sizeof d); d.log_target = true;
        ERR(dl_mse_loss(a, b, &d), DL_ERR_ARG, "dl_mse_loss: dl_loss_desc.log_target is set");
        ERR(dl_binary_cross_entropy_with_logits(a, pr, &d), DL_ERR_ARG, "dl_loss_desc.log_target");
        memset(&d, 0, sizeof d); d.has_ignore_index = true; d.ignore_index = 1;
        ERR(dl_l1_loss(a, b, &d), DL_ERR_ARG, "dl_l1_loss: dl_loss_desc.ignore_index is set");
        ERR(dl_binary_cross_entropy(pr, pr, &d), DL_ERR_ARG, "dl_loss_desc.ignore_index");
        memset(&d, 0, sizeof d); d.reduction = DL_REDUCTION_BATCHMEAN;   /* kl_div only */
        ERR(dl_mse_loss(a, b, &d), DL_ERR_ARG, "reduction 3");
        ERR(dl_huber_loss(a, b, &d), DL_ERR_ARG, "reduction 3");
        CHECK(dl_kl_div(a, b, &d) != NULL, "kl_div batchmean: %s", dl_error_message(G));
        d.reduction = (dl_reduction)4;
        ERR(dl_kl_div(a, b, &d), DL_ERR_ARG, "reduction 4");
        /* BCE: probabilities outside [0, 1] (NaN too) */
        ERR(dl_binary_cross_entropy(dl_from_array(G, DL_SHAPE(4), pv), y4, NULL), DL_ERR_ARG, "outside [0, 1]");
        ERR(dl_binary_cross_entropy(dl_from_array(G, DL_SHAPE(4), nv), y4, NULL), DL_ERR_ARG, "dl_binary_cross_entropy: input (4) has values outside [0, 1]");
        ERR(dl_binary_cross_entropy(dl_from_array(G, DL_SHAPE(4), qv), y4, NULL), DL_ERR_ARG, "outside [0, 1]");
        /* ... and targets outside [0, 1] (NaN too), as PyTorch: "all elements of target should be between 0 and 1" */
        ERR(dl_binary_cross_entropy(y4, dl_from_array(G, DL_SHAPE(4), pv), NULL), DL_ERR_ARG,
            "dl_binary_cross_entropy: target (4) has values outside [0, 1]");
        ERR(dl_binary_cross_entropy(y4, dl_from_array(G, DL_SHAPE(4), nv), NULL), DL_ERR_ARG, "target (4) has values outside");
        ERR(dl_binary_cross_entropy(y4, dl_from_array(G, DL_SHAPE(4), qv), NULL), DL_ERR_ARG, "target (4) has values outside");
        ERR(dl_binary_cross_entropy(dl_from_array(G, DL_SHAPE(4), pv), dl_from_array(G, DL_SHAPE(4), nv), NULL),
            DL_ERR_ARG, "input (4) has values outside");
        CHECK(dl_binary_cross_entropy(y4, dl_from_array(G, DL_SHAPE(4), yv4), NULL) != NULL,
              "targets 0, 1, 0.25 and 1 (in range, both ends): %s", dl_error_message(G));
        /* huber: delta <= 0 (and not finite); smooth L1: beta < 0 */
        memset(&d, 0, sizeof d); d.delta = -1.0f;
        ERR(dl_huber_loss(a, b, &d), DL_ERR_ARG, "dl_huber_loss: delta=-1 must be a finite number > 0");
        d.delta = -0.5f;
        ERR(dl_huber_loss(a, b, &d), DL_ERR_ARG, "delta=-0.5");
        d.delta = INFINITY;
        ERR(dl_huber_loss(a, b, &d), DL_ERR_ARG, "delta=inf");
        d.delta = NAN;
        ERR(dl_huber_loss(a, b, &d), DL_ERR_ARG, "must be a finite number > 0");
        memset(&d, 0, sizeof d); d.beta = -1.0f;
        ERR(dl_smooth_l1_loss(a, b, &d), DL_ERR_ARG, "dl_smooth_l1_loss: beta=-1 must be a finite number >= 0");
        d.beta = NAN;
        ERR(dl_smooth_l1_loss(a, b, &d), DL_ERR_ARG, "beta=nan");
        /* weights that do not broadcast to the input */
        memset(&d, 0, sizeof d); d.weight = dl_ones(G, DL_SHAPE(3));
        ERR(dl_binary_cross_entropy(pr, pr, &d), DL_ERR_SHAPE, "dl_binary_cross_entropy");
        d.weight = dl_ones(G, DL_SHAPE(2, 3, 4));
        ERR(dl_binary_cross_entropy(pr, pr, &d), DL_ERR_SHAPE, "weight (2,3,4) has more dims than the input (3,4)");
        memset(&d, 0, sizeof d); d.pos_weight = dl_ones(G, DL_SHAPE(5));
        ERR(dl_binary_cross_entropy_with_logits(a, pr, &d), DL_ERR_SHAPE, "dl_binary_cross_entropy_with_logits");
        d.pos_weight = dl_ones(G, DL_SHAPE(1, 3, 4));
        ERR(dl_binary_cross_entropy_with_logits(a, pr, &d), DL_ERR_SHAPE, "pos_weight (1,3,4) has more dims");
        memset(&d, 0, sizeof d);
        ERR(dl_kl_div(a, dl_ones(G, DL_SHAPE(4, 3)), NULL), DL_ERR_SHAPE, "dl_kl_div: input (3,4) and target (4,3) must have the same shape");
        ERR(dl_smooth_l1_loss(a, y4, NULL), DL_ERR_SHAPE, "same shape");
        ERR(dl_huber_loss(a, dl_from_int64(G, DL_SHAPE(3, 4), tv), NULL), DL_ERR_DTYPE, "float32");
        SILENT(dl_smooth_l1_loss(NULL, b, NULL));
        SILENT(dl_huber_loss(a, NULL, NULL));
        SILENT(dl_binary_cross_entropy(NULL, NULL, NULL));
        SILENT(dl_kl_div(NULL, b, NULL));
    }
    /* dropout */
    ERR(dl_dropout(x, 1.5f, true), DL_ERR_ARG, "p=1.5 must be in [0, 1]");
    ERR(dl_dropout(x, -0.1f, false), DL_ERR_ARG, "p=-0.1");
    ERR(dl_dropout(x, NAN, true), DL_ERR_ARG, "must be in [0, 1]");
    /* NULL inputs: silent */
    SILENT(dl_batch_norm(NULL, c3, c3, NULL, NULL, true, 0.1f, 1e-5f));
    SILENT(dl_layer_norm(NULL, DL_SHAPE(3), NULL, NULL, 1e-5f));
    SILENT(dl_dropout(NULL, 0.5f, true));
    SILENT(dl_cross_entropy(NULL, t, NULL));
    SILENT(dl_cross_entropy(logits, NULL, NULL));
    SILENT(dl_cross_entropy(NULL, NULL, NULL));
    SILENT(dl_nll_loss(NULL, t, NULL));
    SILENT(dl_nll_loss(logits, NULL, &d));
    SILENT(dl_mse_loss(NULL, c3, red(DL_REDUCTION_MEAN)));
    SILENT(dl_l1_loss(c3, NULL, red(DL_REDUCTION_MEAN)));
    SILENT(dl_binary_cross_entropy_with_logits(NULL, NULL, red(DL_REDUCTION_MEAN)));
    /* a failed op upstream propagates silently through a whole loss */
    dl_clear_error(G);
    CHECK(dl_cross_entropy(dl_matmul(c3, c4), t, NULL) == NULL && dl_last_error(G) == DL_ERR_SHAPE &&
          strstr(dl_error_message(G), "dl_matmul") != NULL, "first cause kept: %s", dl_error_message(G));
    dl_clear_error(G);
    /* a stale tensor is reported, not read */
    {
        dl_tensor *old = dl_ones(G, DL_SHAPE(2, 3));
        int64_t tt[2] = {0, 1};
        dl_step_end(G);
        ERR(dl_cross_entropy(old, dl_from_int64(G, DL_SHAPE(2), tt), NULL), DL_ERR_STALE, "dl_cross_entropy");
        ERR(dl_layer_norm(old, DL_SHAPE(3), NULL, NULL, 1e-5f), DL_ERR_STALE, "dl_layer_norm");
    }
    dl_step_end(G);
}

/* ------------------------------------------------------------------ main */

static void quiet_log(void *u, const char *m) { (void)u; (void)m; }

/* 5. infinities a mask should keep out (values from torch 2.15): a -inf
   (masked) logit or an ignored row of NaN in the class losses, Huber and
   smooth L1 with a delta/beta whose square overflows, and an inf upstream
   gradient through clamp, maximum, max_dim and relu (PyTorch's where: 0 where
   the mask is 0, not 0 * inf = NaN) */
static float nn_item(dl_tensor *t) { return t ? dl_item(t) : NAN; }
static void test_masked_inf(void)
{
    float x[] = {-INFINITY, 0.0f, 1.0f, 2.0f, 1.0f, 0.0f}, g[8];
    float x2[] = {0.0f, 1.0f, 2.0f, -INFINITY, 1.0f, 0.0f}, x3[] = {NAN, NAN, NAN, 1.0f, 2.0f, 3.0f};
    float x4[] = {3e38f, -3e38f, 1.0f};
    int64_t t[] = {1, 0}, t2[] = {1, -100}, t3[] = {-100, 2}, t4[] = {2};
    dl_loss_desc ls, none, w;
    dl_tensor *X = dl_requires_grad(dl_from_array(G, DL_SHAPE(2, 3), x), true), *T = dl_from_int64(G, DL_SHAPE(2), t);
    dl_tensor *ce = dl_cross_entropy(X, T, NULL), *y;
    float wv[] = {0.5f, 2.0f, 1.0f};
    memset(&ls, 0, sizeof ls);
    none = w = ls;
    ls.label_smoothing = 0.1f;
    none.reduction = DL_REDUCTION_NONE;
    w.weight = dl_from_array(G, DL_SHAPE(3), wv);
    CHECK(fabsf(nn_item(ce) - 0.860434f) < 1e-5f, "cross_entropy, a -inf logit not the target: %g (torch 0.860434)",
          (double)nn_item(ce));
    CHECK(fabsf(nn_item(dl_nll_loss(dl_log_softmax(X, 1), T, NULL)) - 0.860434f) < 1e-5f, "nll_loss of it");
    CHECK(fabsf(nn_item(dl_cross_entropy(X, T, &w)) - 1.1321305f) < 1e-5f, "with weights: %g (torch 1.1321305)",
          (double)nn_item(dl_cross_entropy(X, T, &w)));
    y = dl_cross_entropy(X, T, &none);
    CHECK(y && th_host(y)[0] == th_host(y)[0] && fabsf(th_host(y)[0] - 1.3132616f) < 1e-5f, "reduction none");
    CHECK(isinf(nn_item(dl_cross_entropy(X, T, &ls))) && nn_item(dl_cross_entropy(X, T, &ls)) > 0,
          "label smoothing over a -inf logit: +inf as torch");
    CHECK(dl_backward(ce) == DL_OK && X->grad && dl_read(X->grad, g, 6) == DL_OK, "backward");
    CHECK(g[0] == 0.0f && fabsf(g[1] + 0.365529f) < 1e-5f && fabsf(g[2] - 0.365529f) < 1e-5f, "gradient %g %g %g",
          (double)g[0], (double)g[1], (double)g[2]);
    CHECK(fabsf(nn_item(dl_cross_entropy(dl_from_array(G, DL_SHAPE(2, 3), x2), dl_from_int64(G, DL_SHAPE(2), t2),
                                         NULL)) - 1.407606f) < 1e-5f, "an ignored row holding -inf");
    CHECK(fabsf(nn_item(dl_cross_entropy(dl_from_array(G, DL_SHAPE(2, 3), x3), dl_from_int64(G, DL_SHAPE(2), t3),
                                         &ls)) - 0.5076059f) < 1e-5f, "an ignored row of NaN, label smoothing");
    CHECK(fabsf(nn_item(dl_cross_entropy(dl_from_array(G, DL_SHAPE(1, 3), x4), dl_from_int64(G, DL_SHAPE(1), t4),
                                         NULL)) - 3e38f) < 1e32f, "logits +-3e38: 3e38 as torch");
    {   /* Huber delta 1e20 (delta^2 = inf), smooth L1 beta 1e20 at an inf difference */
        float a[] = {0.0f, 1.0f, 2.0f}, b[] = {0.5f, 1.0f, -1.0f}, inf1 = INFINITY, z = 0.0f;
        dl_loss_desc h;
        dl_tensor *A = dl_requires_grad(dl_from_array(G, DL_SHAPE(3), a), true);
        memset(&h, 0, sizeof h);
        h.delta = 1e20f;
        y = dl_huber_loss(A, dl_from_array(G, DL_SHAPE(3), b), &h);
        CHECK(fabsf(nn_item(y) - 1.5416667f) < 1e-5f, "huber delta=1e20: %g (torch 1.541667)", (double)nn_item(y));
        CHECK(y && dl_backward(y) == DL_OK && dl_read(A->grad, g, 3) == DL_OK && fabsf(g[0] + 1.0f / 6) < 1e-6f &&
              g[1] == 0.0f && fabsf(g[2] - 1.0f) < 1e-6f, "its gradient %g %g %g", (double)g[0], (double)g[1],
              (double)g[2]);
        memset(&h, 0, sizeof h);
        h.beta = 1e20f;
        y = dl_smooth_l1_loss(dl_from_array(G, DL_SHAPE(1), &inf1), dl_from_array(G, DL_SHAPE(1), &z), &h);
        CHECK(isinf(nn_item(y)) && nn_item(y) > 0, "smooth_l1 beta=1e20 of inf: %g (torch inf)", (double)nn_item(y));
    }
    {   /* label smoothing with a weight that requires grad, an ignored row holding -inf:
           the weight's gradient was NaN (0 * -inf); torch, the loss over the rows that
           count: 0.064997 0.144997 -0.709983 */
        float xv[6] = {0.2f, -1.0f, 0.5f, -INFINITY, 0.0f, 1.0f}, wv3[3] = {1.0f, 2.0f, 0.5f}, gw[3];
        int64_t tv[2] = {2, -1};
        dl_loss_desc d;
        dl_tensor *W = dl_requires_grad(dl_from_array(G, DL_SHAPE(3), wv3), true), *l;
        memset(&d, 0, sizeof d);
        d.has_ignore_index = true;
        d.ignore_index = -1;
        d.label_smoothing = 0.1f;
        d.weight = W;
        l = dl_cross_entropy(dl_from_array(G, DL_SHAPE(2, 3), xv), dl_from_int64(G, DL_SHAPE(2), tv), &d);
        CHECK(l && fabsf(dl_item(l) - 0.984951f) < 1e-5f && dl_backward(l) == DL_OK && dl_read(W->grad, gw, 3) == DL_OK &&
              fabsf(gw[0] - 0.064997f) < 1e-5f && fabsf(gw[1] - 0.144997f) < 1e-5f && fabsf(gw[2] + 0.709983f) < 1e-5f,
              "weight gradient with an ignored -inf row: %g %g %g", (double)gw[0], (double)gw[1], (double)gw[2]);
    }
    {   /* an inf upstream gradient, where the mask is 0 */
        float v[] = {-2.0f, -0.5f, 0.0f, 0.5f, 2.0f, 3.0f, -3.0f, 1.0f}, gi[8];
        const char *nm[] = {"clamp", "maximum", "max_dim", "relu (create_graph)"};
        int k, i;
        for (i = 0; i < 8; i++) gi[i] = INFINITY;
        for (k = 0; k < 4; k++) {
            dl_tensor *xv = dl_requires_grad(dl_from_array(G, DL_SHAPE(8), v), true);
            dl_tensor *out = k == 0 ? dl_clamp(xv, -1.0f, 1.0f) : k == 1 ? dl_maximum(xv, dl_zeros(G, DL_SHAPE(8)))
                           : k == 2 ? dl_max_dim(xv, 0, true, NULL) : dl_relu(xv);
            dl_backward_desc bd;
            int ok;
            memset(&bd, 0, sizeof bd);
            bd.grad = out ? dl_from_array(G, dl_shape_make(out->ndim, out->shape), gi) : NULL;
            bd.create_graph = k == 3;
            ok = out && dl_backward_ex(out, &bd) == DL_OK && dl_read(xv->grad, g, 8) == DL_OK;
            for (i = 0; ok && i < 8; i++) {
                float want = k == 0 ? (v[i] > -1 && v[i] < 1 ? INFINITY : 0) : k == 1 ? (v[i] > 0 ? INFINITY : v[i] == 0 ? INFINITY : 0)
                           : k == 2 ? (i == 5 ? INFINITY : 0) : (v[i] > 0 ? INFINITY : 0);
                ok = g[i] == want;
            }
            CHECK(ok, "%s: an inf gradient is 0 where masked (got %g %g %g %g %g %g)", nm[k], (double)g[0],
                  (double)g[1], (double)g[2], (double)g[3], (double)g[4], (double)g[5]);
            dl_clear_error(G);
        }
    }
    dl_step_end(G);
}

int main(int argc, char **argv)
{
    dl_ctx_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.log = quiet_log;
    G = dl_ctx_init(&desc);
    g_ctx = G;
    CHECK(G != NULL, "dl_ctx_init");
    if (!G) TEST_END();
    test_golden(argc > 1 ? argv[1] : "tests/golden/nn_ops.bin");
    test_golden_losses(argc > 2 ? argv[2] : "tests/golden/losses.bin");
    test_golden_fuzz(argc > 3 ? argv[3] : "tests/golden/fuzz_nn.bin");
    test_golden_nets(argc > 4 ? argv[4] : "tests/golden/fuzz_net.bin");
    test_golden_optims(argc > 5 ? argv[5] : "tests/golden/fuzz_optim.bin");
    test_golden_dropout(argc > 6 ? argv[6] : "tests/golden/dropout.bin");
    test_gradcheck();
    test_gradcheck_losses();
    test_dropout();
    test_values();
    test_bn_blocks();
    test_errors();
    test_masked_inf();
    CHECK(dl_last_error(G) == DL_OK, "stray error at the end: %s", dl_error_message(G));
    dl_ctx_free(G);
    TEST_END();
}
