/* tests/test_defaults.c - "a zeroed desc means PyTorch's defaults", for every
   desc, and optimizer parameter groups, against PyTorch
   (tests/golden/defaults.bin from tests/golden/gen_defaults.py).

   1. Every loss, avg/max pooling and conv2d with a desc zeroed three ways
      (memset, the compound literal (dl_xxx_desc){0}, NULL where allowed; for
      pooling the kernel is set and the rest left zero, and
      dl_pool_desc_make with PyTorch's keyword defaults) against PyTorch's
      call without keyword arguments: cross entropy and nll with -100
      targets (ignored by default), smooth L1's beta 1, Huber's delta 1,
      kl_div's mean, avg_pool's count_include_pad=True and stride = kernel.
      Then designated-initializer descs that set one or two fields
      ({.reduction = DL_REDUCTION_SUM}, {.beta = DL_ZERO}, {.padding = {1, 1}},
      ...). Forward and gradients, |got - want| <= 1e-5 + 1e-4 |want|.
   2. SGD, Adam and AdamW with zeroed descs (3 steps: SGD's lr 1e-3, AdamW's
      weight_decay 0.01) and partial ones ({.lr = 0.1f}, Adam {.beta1 = DL_ZERO}
      = betas (0, 0.999), AdamW {.weight_decay = DL_ZERO} = weight_decay 0,
      maximize), parameters after each step at 1e-7 + 1e-5 |want|.
   3. Parameter groups: SGD (momentum, nesterov), Adam, AdamW with two groups
      of different lr and weight decay (DL_ZERO: none), dl_module_decay_groups,
      5 steps with dl_optim_set_lr between steps against LambdaLR (and
      dl_optim_set_group_lr against setting a group's lr); the split of
      dl_module_decay_groups on a small module; a checkpoint after 2 steps
      loaded into a fresh optimizer gives the uninterrupted run bit for bit.
   Run from the repository root: test_defaults [path/to/defaults.bin] */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>
#include <unistd.h>
#include "golden.h"

#define O_RTOL 1e-5
#define O_ATOL 1e-7

static dl_ctx *G;

/* how a "default" case builds its desc */
enum { MODE_MEMSET, MODE_LITERAL, MODE_NULL, NMODES };
static int g_mode;
static const char *const mode_name[] = {"memset", "{0}", "NULL"};

static const grec *g_rec(const char *name)
{
    long i;
    for (i = 0; i < g_nrec; i++) if (!strcmp(g_recs[i].name, name)) return &g_recs[i];
    CHECK(0, "golden record %s is missing", name);
    return NULL;
}

/* the variant: the middle part of "op/variant/params" */
static const char *g_variant(const grec *p)
{
    static char v[64];
    const char *a = p ? strchr(p->name, '/') : NULL, *b = p ? strrchr(p->name, '/') : NULL;
    size_t n;
    v[0] = 0;
    if (!a || b <= a) return v;
    n = (size_t)(b - a - 1);
    if (n >= sizeof v) n = sizeof v - 1;
    memcpy(v, a + 1, n);
    v[n] = 0;
    return v;
}

static dl_tensor *g_get(int n, const grec *const *rs, dl_tensor **in, const char *field)
{
    int k;
    for (k = 0; k < n; k++) if (!strcmp(g_field(rs[k]), field)) return in[k];
    return NULL;
}

static dl_loss_desc g_zl;
static dl_pool_desc g_zp;
static dl_conv_desc g_zc;
static const dl_loss_desc *zeroed_loss(void) { memset(&g_zl, 0, sizeof g_zl); return &g_zl; }
static dl_conv_desc *zeroed_conv(void) { memset(&g_zc, 0, sizeof g_zc); return &g_zc; }

/* a zeroed loss desc, three ways */
#define LOSS_DEFAULT (g_mode == MODE_NULL ? NULL : g_mode == MODE_LITERAL ? &(dl_loss_desc){0} : zeroed_loss())

static dl_tensor *g_run(const char *op, int n, const grec *const *rs, dl_tensor **in,
                        const grec *p, const char **bad)
{
    const char *v = g_variant(p);
    int dflt = !strcmp(v, "default");
    dl_tensor *x = g_get(n, rs, in, "x"), *t = g_get(n, rs, in, "target");
    dl_tensor *a = g_get(n, rs, in, "a"), *b = g_get(n, rs, in, "b"), *y = g_get(n, rs, in, "y");
    *bad = NULL;
    if (!strcmp(op, "cross_entropy")) {
        if (dflt) return dl_cross_entropy(x, t, LOSS_DEFAULT);
        if (!strcmp(v, "sum")) return dl_cross_entropy(x, t, &(dl_loss_desc){.reduction = DL_REDUCTION_SUM});
        if (!strcmp(v, "none")) return dl_cross_entropy(x, t, &(dl_loss_desc){.reduction = DL_REDUCTION_NONE});
        if (!strcmp(v, "ls")) return dl_cross_entropy(x, t, &(dl_loss_desc){.label_smoothing = 0.1f});
        if (!strcmp(v, "ignore1"))
            return dl_cross_entropy(x, t, &(dl_loss_desc){.has_ignore_index = true, .ignore_index = 1});
    } else if (!strcmp(op, "nll_loss")) {
        if (dflt) return dl_nll_loss(x, t, LOSS_DEFAULT);
        if (!strcmp(v, "none")) return dl_nll_loss(x, t, &(dl_loss_desc){.reduction = DL_REDUCTION_NONE});
    } else if (!strcmp(op, "mse_loss") || !strcmp(op, "l1_loss")) {
        dl_tensor *(*f)(dl_tensor *, dl_tensor *, const dl_loss_desc *) = op[0] == 'm' ? dl_mse_loss : dl_l1_loss;
        if (dflt) return f(a, b, LOSS_DEFAULT);
        if (!strcmp(v, "sum")) return f(a, b, &(dl_loss_desc){.reduction = DL_REDUCTION_SUM});
    } else if (!strcmp(op, "smooth_l1_loss")) {
        if (dflt) return dl_smooth_l1_loss(a, b, LOSS_DEFAULT);
        if (!strcmp(v, "beta05")) return dl_smooth_l1_loss(a, b, &(dl_loss_desc){.beta = 0.5f});
        if (!strcmp(v, "beta0")) return dl_smooth_l1_loss(a, b, &(dl_loss_desc){.beta = DL_ZERO});
    } else if (!strcmp(op, "huber_loss")) {
        if (dflt) return dl_huber_loss(a, b, LOSS_DEFAULT);
        if (!strcmp(v, "delta2_sum"))
            return dl_huber_loss(a, b, &(dl_loss_desc){.delta = 2.0f, .reduction = DL_REDUCTION_SUM});
    } else if (!strcmp(op, "binary_cross_entropy")) {
        dl_tensor *pr = g_get(n, rs, in, "p");
        if (dflt) return dl_binary_cross_entropy(pr, y, LOSS_DEFAULT);
        if (!strcmp(v, "w")) return dl_binary_cross_entropy(pr, y, &(dl_loss_desc){.weight = g_get(n, rs, in, "w")});
    } else if (!strcmp(op, "bce_logits")) {
        if (dflt) return dl_binary_cross_entropy_with_logits(x, y, LOSS_DEFAULT);
        if (!strcmp(v, "pw"))
            return dl_binary_cross_entropy_with_logits(x, y, &(dl_loss_desc){.pos_weight = g_get(n, rs, in, "pw")});
    } else if (!strcmp(op, "kl_div")) {
        if (dflt) return dl_kl_div(x, y, LOSS_DEFAULT);
        if (!strcmp(v, "batchmean")) return dl_kl_div(x, y, &(dl_loss_desc){.reduction = DL_REDUCTION_BATCHMEAN});
        if (!strcmp(v, "logt")) return dl_kl_div(x, y, &(dl_loss_desc){.log_target = true});
    } else if (!strcmp(op, "avg_pool2d")) {
        if (dflt) {   /* kernel 3, padding 1, everything else PyTorch's default */
            if (g_mode == MODE_LITERAL) return dl_avg_pool2d(x, &(dl_pool_desc){.kernel = {3, 3}, .padding = {1, 1}});
            memset(&g_zp, 0, sizeof g_zp);
            g_zp.kernel[0] = g_zp.kernel[1] = 3;
            g_zp.padding[0] = g_zp.padding[1] = 1;
            return dl_avg_pool2d(x, &g_zp);
        }
        if (!strcmp(v, "k2")) return dl_avg_pool2d(x, &(dl_pool_desc){.kernel = {2, 2}});
        if (!strcmp(v, "ceil"))
            return dl_avg_pool2d(x, &(dl_pool_desc){.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true});
        if (!strcmp(v, "nocip"))
            return dl_avg_pool2d(x, &(dl_pool_desc){.kernel = {3, 3}, .padding = {1, 1}, .no_count_include_pad = true});
    } else if (!strcmp(op, "max_pool2d")) {
        if (dflt) {   /* kernel 2 */
            if (g_mode == MODE_LITERAL) return dl_max_pool2d(x, &(dl_pool_desc){.kernel = {2, 2}});
            memset(&g_zp, 0, sizeof g_zp);
            g_zp.kernel[0] = g_zp.kernel[1] = 2;
            return dl_max_pool2d(x, &g_zp);
        }
        if (!strcmp(v, "k3p1")) return dl_max_pool2d(x, &(dl_pool_desc){.kernel = {3, 3}, .padding = {1, 1}});
        if (!strcmp(v, "dil"))
            return dl_max_pool2d(x, &(dl_pool_desc){.kernel = {3, 3}, .stride = {1, 1}, .dilation = {2, 2}});
    } else if (!strcmp(op, "conv2d")) {
        dl_tensor *w = g_get(n, rs, in, "w");
        if (dflt)
            return dl_conv2d(x, w, b, g_mode == MODE_NULL ? NULL : g_mode == MODE_LITERAL ? &(dl_conv_desc){0} : zeroed_conv());
        if (!strcmp(v, "pad1")) return dl_conv2d(x, w, b, &(dl_conv_desc){.padding = {1, 1}});
        if (!strcmp(v, "stride2")) return dl_conv2d(x, w, b, &(dl_conv_desc){.stride = {2, 2}});
        if (!strcmp(v, "groups2")) return dl_conv2d(x, w, b, &(dl_conv_desc){.groups = 2});
        if (!strcmp(v, "same")) return dl_conv2d(x, w, b, &(dl_conv_desc){.padding_same = true});
        if (!strcmp(v, "dil2")) return dl_conv2d(x, w, b, &(dl_conv_desc){.dilation = {2, 2}, .padding = {2, 2}});
    } else {
        *bad = "unknown op";
        return NULL;
    }
    *bad = "unknown variant";
    return NULL;
}

/* the op cases of the file; in the literal and NULL modes only the
   "default" variants (pooling has no NULL desc) */
static int run_op_cases(int mode, int *nvar)
{
    long i, j;
    int n = 0;
    g_mode = mode;
    for (i = 0; i < g_nrec; i = j) {
        size_t pl = g_prefix_len(&g_recs[i]);
        const char *nm = g_recs[i].name;
        for (j = i + 1; j < g_nrec; j++)
            if (g_prefix_len(&g_recs[j]) != pl || strncmp(g_recs[j].name, nm, pl) != 0) break;
        if (!strncmp(nm, "optim/", 6) || !strncmp(nm, "groups/", 7)) continue;
        if (mode != MODE_MEMSET) {
            const char *v = strchr(nm, '/');
            if (!v || strncmp(v, "/default/", 9) != 0) continue;
            if (mode == MODE_NULL && strstr(nm, "pool")) continue;
        }
        if (mode == MODE_MEMSET && !strstr(nm, "/default/")) (*nvar)++;
        g_case(i, j, &n);
        dl_clear_error(G);
        dl_step_end(G);
    }
    return n;
}

static void test_ops(void)
{
    int m, n, nvar = 0, total = 0;
    for (m = 0; m < NMODES; m++) {
        n = run_op_cases(m, &nvar);
        printf("ops, default descs by %s: %d cases\n", mode_name[m], n);
        CHECK(n >= (m == MODE_NULL ? 10 : 12), "%s: only %d default cases", mode_name[m], n);
        total += n;
    }
    printf("ops: %d cases with designated-initializer descs; %d runs in all\n", nvar, total);
    CHECK(nvar >= 24, "only %d designated-initializer cases", nvar);
    {   /* the pool helper with PyTorch's keyword defaults = the zeroed desc */
        dl_pool_desc a = dl_pool_desc_make(3, 0, 1, false, true), z;
        memset(&z, 0, sizeof z);
        z.kernel[0] = z.kernel[1] = z.kernel[2] = 3;
        z.padding[0] = z.padding[1] = z.padding[2] = 1;
        CHECK(a.stride[0] == 0 || a.stride[0] == 3, "dl_pool_desc_make stride %lld", (long long)a.stride[0]);
        CHECK(a.no_count_include_pad == false && a.ceil_mode == false && a.kernel[1] == 3 && a.padding[1] == 1,
              "dl_pool_desc_make(3, 0, 1, false, true): no_count_include_pad %d ceil %d", (int)a.no_count_include_pad,
              (int)a.ceil_mode);
        CHECK(dl_pool_desc_make(2, 2, 0, true, false).no_count_include_pad == true &&
              dl_pool_desc_make(2, 2, 0, true, false).ceil_mode == true, "dl_pool_desc_make count_include_pad false");
        {
            dl_tensor *x = dl_randn(G, DL_SHAPE(1, 2, 6, 5));
            dl_tensor *y1 = dl_avg_pool2d(x, &a), *y2 = dl_avg_pool2d(x, &z);
            dl_tensor *m1 = dl_max_pool2d(x, &a), *m2 = dl_max_pool2d(x, &z);
            CHECK(y1 && y2 && dl_same_shape(y1, y2) && th_same_bytes(y1, y2),
                  "avg_pool2d: dl_pool_desc_make(3, 0, 1, false, true) differs from the zeroed desc: %s", dl_error_message(G));
            CHECK(m1 && m2 && dl_same_shape(m1, m2) && th_same_bytes(m1, m2),
                  "max_pool2d: dl_pool_desc_make differs from the zeroed desc: %s", dl_error_message(G));
            /* one option, two polarities: count_include_pad false = .no_count_include_pad true */
            a = dl_pool_desc_make(3, 0, 1, false, false);
            z.no_count_include_pad = true;
            y1 = dl_avg_pool2d(x, &a);
            y2 = dl_avg_pool2d(x, &z);
            m1 = dl_avg_pool2d(x, &(dl_pool_desc){.kernel = {3, 3}, .padding = {1, 1}});
            CHECK(y1 && y2 && m1 && th_same_bytes(y1, y2) && !th_same_bytes(y1, m1),
                  "avg_pool2d: dl_pool_desc_make(..., count_include_pad false) = .no_count_include_pad true, "
                  "and differs from the default");
            dl_clear_error(G);
            dl_step_end(G);
        }
    }
}

/* ------------------------------------------------------------------ optimizers */

static void cmp(const char *what, const float *got, const float *want, long n)
{
    long i, worst = -1;
    double wr = 0;
    for (i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]), lim = O_ATOL + O_RTOL * fabs((double)want[i]);
        if (!(d <= lim) && (worst < 0 || d / lim > wr || got[i] != got[i])) { worst = i; wr = d / lim; }
    }
    CHECK(worst < 0, "%s: element %ld: dl %.9g, torch %.9g", what, worst,
          worst >= 0 ? (double)got[worst] : 0.0, worst >= 0 ? (double)want[worst] : 0.0);
}

static dl_tensor *mse(dl_module *m, dl_tensor *x, dl_tensor *y)
{
    return dl_mse_loss(dl_module_forward(m, x), y, NULL);
}

static dl_sgd_desc g_zsgd;
static dl_adam_desc g_zadam;
static const dl_sgd_desc *zeroed_sgd(void) { memset(&g_zsgd, 0, sizeof g_zsgd); return &g_zsgd; }
static const dl_adam_desc *zeroed_adam(void) { memset(&g_zadam, 0, sizeof g_zadam); return &g_zadam; }

static dl_optim *opt_make(const char *cfg, dl_module *m, int mode)
{
    if (!strcmp(cfg, "sgd_default"))
        return dl_sgd(m, mode == MODE_NULL ? NULL : mode == MODE_LITERAL ? &(dl_sgd_desc){0} : zeroed_sgd());
    if (!strcmp(cfg, "adam_default"))
        return dl_adam(m, mode == MODE_NULL ? NULL : mode == MODE_LITERAL ? &(dl_adam_desc){0} : zeroed_adam());
    if (!strcmp(cfg, "adamw_default"))
        return dl_adamw(m, mode == MODE_NULL ? NULL : mode == MODE_LITERAL ? &(dl_adam_desc){0} : zeroed_adam());
    if (!strcmp(cfg, "sgd_lr01")) return dl_sgd(m, &(dl_sgd_desc){.lr = 0.1f});
    if (!strcmp(cfg, "sgd_momentum")) return dl_sgd(m, &(dl_sgd_desc){.lr = 0.1f, .momentum = 0.9f});
    if (!strcmp(cfg, "sgd_maximize")) return dl_sgd(m, &(dl_sgd_desc){.lr = 0.1f, .maximize = true});
    if (!strcmp(cfg, "adam_lr")) return dl_adam(m, &(dl_adam_desc){.lr = 0.01f});
    if (!strcmp(cfg, "adam_beta1_zero")) return dl_adam(m, &(dl_adam_desc){.beta1 = DL_ZERO});
    if (!strcmp(cfg, "adam_beta2_zero")) return dl_adam(m, &(dl_adam_desc){.lr = 0.01f, .beta2 = DL_ZERO});
    if (!strcmp(cfg, "adam_eps_zero")) return dl_adam(m, &(dl_adam_desc){.lr = 0.01f, .eps = DL_ZERO});
    if (!strcmp(cfg, "adam_maximize")) return dl_adam(m, &(dl_adam_desc){.maximize = true});
    if (!strcmp(cfg, "adamw_wd_zero")) return dl_adamw(m, &(dl_adam_desc){.weight_decay = DL_ZERO});
    return NULL;
}

static void test_optim_defaults(void)
{
    static const char *cfgs[] = {"sgd_default", "adam_default", "adamw_default", "sgd_lr01", "sgd_momentum",
                                 "sgd_maximize", "adam_lr", "adam_beta1_zero", "adam_beta2_zero",
                                 "adam_eps_zero", "adam_maximize", "adamw_wd_zero"};
    const grec *gx = g_rec("optim/data/x"), *gy = g_rec("optim/data/y");
    const grec *w0 = g_rec("optim/init/weight"), *b0 = g_rec("optim/init/bias");
    int c, mode, s, nrun = 0;
    if (!gx || !gy || !w0 || !b0) return;
    for (c = 0; c < (int)(sizeof cfgs / sizeof cfgs[0]); c++) {
        char key[128];
        const grec *gw, *gb;
        int nmodes = strstr(cfgs[c], "_default") ? NMODES : 1;
        snprintf(key, sizeof key, "optim/%s/weight", cfgs[c]);
        gw = g_rec(key);
        snprintf(key, sizeof key, "optim/%s/bias", cfgs[c]);
        gb = g_rec(key);
        if (!gw || !gb) continue;
        for (mode = 0; mode < nmodes; mode++) {
            dl_module *lin = dl_nn_linear(G, 4, 3, true);
            dl_tensor *x = dl_keep(dl_from_array(G, DL_SHAPE(8, 4), gx->v));
            dl_tensor *y = dl_keep(dl_from_array(G, DL_SHAPE(8, 3), gy->v));
            dl_tensor *w = dl_module_get(lin, "weight"), *b = dl_module_get(lin, "bias");
            dl_optim *o;
            th_put(w, w0->v);
            th_put(b, b0->v);
            o = opt_make(cfgs[c], lin, mode);
            CHECK(o != NULL, "%s (%s): %s", cfgs[c], mode_name[mode], dl_error_message(G));
            if (!o) { dl_clear_error(G); continue; }
            nrun++;
            for (s = 0; s < 3; s++) {
                char what[160];
                dl_optim_zero_grad(o);
                if (dl_backward(mse(lin, x, y)) != DL_OK || dl_optim_step(o) != DL_OK) {
                    CHECK(0, "%s step %d: %s", cfgs[c], s + 1, dl_error_message(G));
                    dl_clear_error(G);
                    break;
                }
                snprintf(what, sizeof what, "%s (%s desc) step %d weight", cfgs[c], mode_name[mode], s + 1);
                cmp(what, th_host(w), gw->v + 12 * s, 12);
                snprintf(what, sizeof what, "%s (%s desc) step %d bias", cfgs[c], mode_name[mode], s + 1);
                cmp(what, th_host(b), gb->v + 3 * s, 3);
                dl_step_end(G);
            }
            if (mode == 0 && !strcmp(cfgs[c], "sgd_default"))
                CHECK(dl_optim_lr(o) == 1e-3f, "zeroed SGD desc: lr %g, want 1e-3", (double)dl_optim_lr(o));
            if (mode == 0 && strstr(cfgs[c], "adam") && strstr(cfgs[c], "_default"))
                CHECK(dl_optim_lr(o) == 1e-3f, "zeroed Adam desc: lr %g, want 1e-3", (double)dl_optim_lr(o));
            dl_optim_free(o);
            dl_free(x);
            dl_free(y);
        }
    }
    printf("optimizers: %d runs of 3 steps\n", nrun);
    CHECK(nrun == 18, "expected 18 optimizer runs, got %d", nrun);
}

/* ------------------------------------------------------------------ parameter groups */

static const float FACTORS[6] = {1.0f, 0.5f, 0.75f, 0.25f, 0.125f, 0.0625f};
static const char *const PNAMES[4] = {"0.weight", "0.bias", "2.weight", "2.bias"};

static dl_module *mlp(dl_ctx *ctx, bool golden_init)
{
    dl_module *mods[3];
    dl_module *m;
    int i;
    mods[0] = dl_nn_linear(ctx, 4, 6, true);
    mods[1] = dl_nn_tanh(ctx);
    mods[2] = dl_nn_linear(ctx, 6, 3, true);
    m = dl_nn_sequential(ctx, 3, mods);
    if (!m || !golden_init) return m;
    for (i = 0; i < 4; i++) {
        char key[64];
        const grec *r;
        dl_tensor *t = dl_module_get(m, PNAMES[i]);
        snprintf(key, sizeof key, "groups/init/%s", PNAMES[i]);
        r = g_rec(key);
        if (!r || !t || r->numel != t->numel) return NULL;
        th_put(t, r->v);
    }
    return m;
}

/* the configurations of gen_defaults.py's groups(); W = the weights, B = the biases */
static dl_optim *group_opt(const char *cfg, dl_module *m, bool *sched)
{
    dl_ctx *ctx = dl_module_ctx(m);
    dl_tensor *W[2], *B[2];
    W[0] = dl_module_get(m, "0.weight");
    W[1] = dl_module_get(m, "2.weight");
    B[0] = dl_module_get(m, "0.bias");
    B[1] = dl_module_get(m, "2.bias");
    *sched = true;
    if (!strcmp(cfg, "sgd_momentum")) {
        dl_param_group g[2] = {{.params = W, .n = 2}, {.params = B, .n = 2, .lr = 0.2f, .weight_decay = DL_ZERO}};
        return dl_sgd_groups(ctx, 2, g, &(dl_sgd_desc){.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f});
    }
    if (!strcmp(cfg, "sgd_nesterov")) {
        dl_param_group g[2] = {{.params = W, .n = 2, .lr = 0.02f, .weight_decay = 0.05f}, {.params = B, .n = 2}};
        return dl_sgd_groups(ctx, 2, g, &(dl_sgd_desc){.lr = 0.1f, .momentum = 0.8f, .nesterov = true,
                                                       .weight_decay = 0.001f});
    }
    if (!strcmp(cfg, "adam")) {
        dl_param_group g[2] = {{.params = W, .n = 2}, {.params = B, .n = 2, .lr = 0.003f, .weight_decay = DL_ZERO}};
        return dl_adam_groups(ctx, 2, g, &(dl_adam_desc){.lr = 0.01f, .weight_decay = 0.02f});
    }
    if (!strcmp(cfg, "adamw_decay")) {   /* the split of dl_module_decay_groups, group 1's lr set */
        dl_param_group g[2];
        if (dl_module_decay_groups(m, g) != 2) return NULL;
        g[1].lr = 0.02f;
        return dl_adamw_groups(ctx, 2, g, &(dl_adam_desc){.lr = 0.01f});
    }
    if (!strcmp(cfg, "adamw_amsgrad")) {
        dl_param_group g[2] = {{.params = B, .n = 2, .lr = 0.005f}, {.params = W, .n = 2, .weight_decay = 0.1f}};
        return dl_adamw_groups(ctx, 2, g, &(dl_adam_desc){.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.99f, .amsgrad = true});
    }
    if (!strcmp(cfg, "sgd_group_lr")) {
        dl_param_group g[2] = {{.params = W, .n = 2}, {.params = B, .n = 2, .lr = 0.1f}};
        *sched = false;
        return dl_sgd_groups(ctx, 2, g, &(dl_sgd_desc){.lr = 0.05f, .momentum = 0.9f});
    }
    return NULL;
}

/* before step k (0-based): the LambdaLR factor, or sgd_group_lr's settings */
static void group_sched(const char *cfg, dl_optim *o, float lr0, bool sched, int k)
{
    if (sched) {
        if (k > 0) CHECK(dl_optim_set_lr(o, lr0 * FACTORS[k]) == DL_OK, "%s: set_lr before step %d", cfg, k + 1);
    } else if (!strcmp(cfg, "sgd_group_lr")) {
        if (k == 2) CHECK(dl_optim_set_group_lr(o, 1, 0.02f) == DL_OK, "set_group_lr 1");
        if (k == 3) CHECK(dl_optim_set_group_lr(o, 0, 0.01f) == DL_OK, "set_group_lr 0");
    }
}

static int group_train(const char *cfg, dl_ctx *ctx, dl_module *m, dl_optim *o, float lr0, bool sched,
                       int from, int to, dl_tensor *x, dl_tensor *y)
{
    int k;
    for (k = from; k < to; k++) {
        group_sched(cfg, o, lr0, sched, k);
        dl_optim_zero_grad(o);
        if (dl_backward(mse(m, x, y)) != DL_OK || dl_optim_step(o) != DL_OK) {
            CHECK(0, "%s step %d: %s", cfg, k + 1, dl_error_message(ctx));
            dl_clear_error(ctx);
            return 0;
        }
        dl_step_end(ctx);
    }
    return 1;
}

static const char *const GCFGS[] = {"sgd_momentum", "sgd_nesterov", "adam", "adamw_decay", "adamw_amsgrad",
                                    "sgd_group_lr"};

static void test_groups_golden(void)
{
    const grec *gx = g_rec("groups/data/x"), *gy = g_rec("groups/data/y");
    int c, k, i;
    if (!gx || !gy) return;
    for (c = 0; c < (int)(sizeof GCFGS / sizeof GCFGS[0]); c++) {
        const char *cfg = GCFGS[c];
        dl_ctx *ctx = dl_ctx_init(&(dl_ctx_desc){.log = dl_log_silent, .seed = 5});
        dl_module *m = ctx ? mlp(ctx, true) : NULL;
        dl_tensor *x, *y;
        dl_optim *o;
        const grec *lr, *want[4];
        bool sched;
        float lr0;
        char key[128];
        CHECK(m != NULL, "%s: model", cfg);
        if (!m) { dl_ctx_free(ctx); continue; }
        x = dl_keep(dl_from_array(ctx, DL_SHAPE(8, 4), gx->v));
        y = dl_keep(dl_from_array(ctx, DL_SHAPE(8, 3), gy->v));
        o = group_opt(cfg, m, &sched);
        CHECK(o && dl_optim_num_groups(o) == 2, "%s: optimizer: %s", cfg, dl_error_message(ctx));
        snprintf(key, sizeof key, "groups/%s/lr", cfg);
        lr = g_rec(key);
        for (i = 0; i < 4; i++) {
            snprintf(key, sizeof key, "groups/%s/%s", cfg, PNAMES[i]);
            want[i] = g_rec(key);
        }
        if (!o || !lr || !want[0] || !want[1] || !want[2] || !want[3]) { dl_ctx_free(ctx); continue; }
        lr0 = dl_optim_group_lr(o, 0);
        for (k = 0; k < 5; k++) {
            char what[160];
            float glr[2];
            group_sched(cfg, o, lr0, sched, k);
            glr[0] = dl_optim_group_lr(o, 0);
            glr[1] = dl_optim_group_lr(o, 1);
            snprintf(what, sizeof what, "%s step %d group lrs (%g, %g)", cfg, k + 1, (double)glr[0], (double)glr[1]);
            cmp(what, glr, lr->v + 2 * k, 2);
            CHECK(dl_optim_lr(o) == glr[0], "%s: dl_optim_lr is group 0's", cfg);
            dl_optim_zero_grad(o);
            if (dl_backward(mse(m, x, y)) != DL_OK || dl_optim_step(o) != DL_OK) {
                CHECK(0, "%s step %d: %s", cfg, k + 1, dl_error_message(ctx));
                break;
            }
            for (i = 0; i < 4; i++) {
                dl_tensor *t = dl_module_get(m, PNAMES[i]);
                snprintf(what, sizeof what, "%s step %d %s", cfg, k + 1, PNAMES[i]);
                cmp(what, th_host(t), want[i]->v + t->numel * k, (long)t->numel);
            }
            dl_step_end(ctx);
        }
        dl_ctx_free(ctx);
    }
}

/* dl_module_decay_groups: 2+-dim parameters in group 0 (the optimizer's decay),
   the rest in group 1 (DL_ZERO: no decay), each in state_dict order */
static void test_decay_groups(void)
{
    dl_ctx *ctx = dl_ctx_init(&(dl_ctx_desc){.log = dl_log_silent, .seed = 3});
    static const char *const w_names[] = {"0.weight", "3.weight"};
    static const char *const nd_names[] = {"0.bias", "1.weight", "1.bias", "3.bias", "4.weight", "4.bias"};
    dl_module *mods[5], *m;
    dl_param_group g[2];
    dl_optim *o;
    int i, ok;
    float before[64], bias_before[6][4];
    mods[0] = dl_nn_conv2d(ctx, 2, 3, 3, NULL, true);
    mods[1] = dl_nn_batch_norm2d(ctx, 3);
    mods[2] = dl_nn_flatten(ctx);
    mods[3] = dl_nn_linear(ctx, 12, 2, true);
    mods[4] = dl_nn_layer_norm(ctx, DL_SHAPE(2));
    m = dl_nn_sequential(ctx, 5, mods);
    CHECK(m != NULL, "decay groups: model: %s", dl_error_message(ctx));
    if (!m) { dl_ctx_free(ctx); return; }
    CHECK(dl_module_decay_groups(m, g) == 2, "dl_module_decay_groups returns 2");
    CHECK(g[0].n == 2 && g[1].n == 6, "decay groups: %d and %d parameters, want 2 and 6", g[0].n, g[1].n);
    for (i = 0, ok = 1; i < 2 && i < g[0].n; i++) ok &= g[0].params[i] == dl_module_get(m, w_names[i]);
    CHECK(ok, "group 0: the 2+-dim parameters (0.weight, 3.weight) in state_dict order");
    for (i = 0, ok = 1; i < 6 && i < g[1].n; i++) ok &= g[1].params[i] == dl_module_get(m, nd_names[i]);
    CHECK(ok, "group 1: 0.bias, 1.weight, 1.bias, 3.bias, 4.weight, 4.bias (no buffers)");
    CHECK(g[0].lr == 0.0f && g[0].weight_decay == 0.0f && !signbit(g[0].weight_decay),
          "group 0: lr 0 and weight_decay +0 (the optimizer's)");
    CHECK(g[1].lr == 0.0f && g[1].weight_decay == 0.0f && signbit(g[1].weight_decay),
          "group 1: weight_decay DL_ZERO (none)");
    /* AdamW (zeroed desc: lr 1e-3, weight decay 0.01) with zero gradients:
       the update is 0, so weights shrink by 1 - lr*wd and the rest stay */
    o = dl_adamw_groups(ctx, 2, g, &(dl_adam_desc){0});
    CHECK(o != NULL, "adamw over decay groups: %s", dl_error_message(ctx));
    if (o) {
        dl_tensor *x = dl_randn(ctx, DL_SHAPE(2, 2, 4, 4));
        dl_tensor *w0 = g[0].params[0];
        float decay = (float)(1.0 - (double)1e-3f * (double)0.01f);
        const float *after;
        dl_read(w0, before, w0->numel);
        for (i = 0; i < 6; i++) dl_read(g[1].params[i], bias_before[i], g[1].params[i]->numel);
        dl_optim_zero_grad(o);
        CHECK(dl_backward(dl_mul_scalar(dl_sum(dl_module_forward(m, x), DL_ALL, false), 0.0f)) == DL_OK,
              "backward: %s", dl_error_message(ctx));
        CHECK(dl_optim_step(o) == DL_OK, "step: %s", dl_error_message(ctx));
        after = th_host(w0);
        for (i = 0, ok = after != NULL; ok && i < w0->numel; i++)
            ok &= fabsf(after[i] - before[i] * decay) <= 1e-7f * fabsf(before[i]);
        CHECK(ok, "decay group 0: weights times (1 - lr*wd)");
        for (i = 0, ok = 1; i < 6; i++)
            ok &= !memcmp(bias_before[i], th_host(g[1].params[i]), sizeof(float) * (size_t)g[1].params[i]->numel);
        CHECK(ok, "decay group 1: no weight decay (unchanged with zero grads)");
        dl_step_end(ctx);
    }
    {   /* the same arrays again; a module without 1-dim params */
        dl_param_group h[2];
        dl_module *lin = dl_nn_linear(ctx, 3, 2, false);
        CHECK(dl_module_decay_groups(m, h) == 2 && h[0].n == 2 && h[1].n == 6, "decay groups again");
        CHECK(dl_module_decay_groups(lin, h) == 2 && h[0].n == 1 && h[1].n == 0,
              "linear without bias: %d and %d", h[0].n, h[1].n);
    }
    dl_ctx_free(ctx);
}

/* a checkpoint after 2 steps, loaded into a fresh optimizer (and a module
   with another init), then 3 more steps: the uninterrupted 5 steps exactly */
static void test_groups_checkpoint(void)
{
    const grec *gx = g_rec("groups/data/x"), *gy = g_rec("groups/data/y");
    char path[128];
    int c;
    snprintf(path, sizeof path, "build/test_defaults_%ld.safetensors", (long)getpid());
    if (!gx || !gy) return;
    for (c = 0; c < (int)(sizeof GCFGS / sizeof GCFGS[0]); c++) {
        const char *cfg = GCFGS[c];
        unsigned char ref[2048], got[2048];
        size_t nref, ngot;
        dl_ctx *ctx[3];
        dl_module *m[3];
        dl_optim *o[3];
        dl_tensor *x[3], *y[3];
        float lr0[3];
        bool sched = false;
        int k, ok = 1;
        dl_result r;
        for (k = 0; k < 3; k++) {
            ctx[k] = dl_ctx_init(&(dl_ctx_desc){.log = dl_log_silent, .seed = (uint64_t)(7 + k)});
            m[k] = ctx[k] ? mlp(ctx[k], k < 2) : NULL;   /* the third: another (random) init */
            o[k] = m[k] ? group_opt(cfg, m[k], &sched) : NULL;
            x[k] = ctx[k] ? dl_keep(dl_from_array(ctx[k], DL_SHAPE(8, 4), gx->v)) : NULL;
            y[k] = ctx[k] ? dl_keep(dl_from_array(ctx[k], DL_SHAPE(8, 3), gy->v)) : NULL;
            lr0[k] = dl_optim_group_lr(o[k], 0);
            ok &= o[k] && x[k] && y[k];
        }
        CHECK(ok, "%s: setup", cfg);
        if (ok) {
            ok = group_train(cfg, ctx[0], m[0], o[0], lr0[0], sched, 0, 5, x[0], y[0]);
            nref = th_module_bytes(m[0], ref, sizeof ref);
            ok &= group_train(cfg, ctx[1], m[1], o[1], lr0[1], sched, 0, 2, x[1], y[1]);
            r = dl_save(path, m[1], o[1]);
            CHECK(r == DL_OK, "%s: save: %s", cfg, dl_error_message(ctx[1]));
            ngot = th_module_bytes(m[2], got, sizeof got);
            CHECK(ngot == nref && memcmp(got, ref, nref) != 0, "%s: the fresh module differs before the load", cfg);
            r = dl_load(path, m[2], o[2]);
            CHECK(r == DL_OK, "%s: load: %s", cfg, dl_error_message(ctx[2]));
            CHECK(dl_optim_steps(o[2]) == 2, "%s: steps restored: %lld", cfg, (long long)dl_optim_steps(o[2]));
            CHECK(dl_optim_group_lr(o[2], 0) == dl_optim_group_lr(o[1], 0) &&
                  dl_optim_group_lr(o[2], 1) == dl_optim_group_lr(o[1], 1),
                  "%s: group lrs restored: (%g, %g), saved (%g, %g)", cfg, (double)dl_optim_group_lr(o[2], 0),
                  (double)dl_optim_group_lr(o[2], 1), (double)dl_optim_group_lr(o[1], 0), (double)dl_optim_group_lr(o[1], 1));
            ok &= group_train(cfg, ctx[2], m[2], o[2], lr0[2], sched, 2, 5, x[2], y[2]);
            ngot = th_module_bytes(m[2], got, sizeof got);
            CHECK(ok && ngot == nref && memcmp(got, ref, nref) == 0, "%s: saved after 2 steps, loaded, 3 more steps: "
                  "not bit-identical to 5 uninterrupted steps", cfg);
            CHECK(dl_optim_group_lr(o[2], 0) == dl_optim_group_lr(o[0], 0) &&
                  dl_optim_group_lr(o[2], 1) == dl_optim_group_lr(o[0], 1), "%s: final group lrs", cfg);
            if (c == 0) {   /* the 2-group state into a 1-group optimizer */
                dl_optim *one = dl_sgd(m[2], &(dl_sgd_desc){.lr = 0.05f, .momentum = 0.9f});
                dl_module *fresh = mlp(ctx[2], false);
                unsigned char a[2048], b[2048];
                CHECK(one && dl_load(path, m[2], one) == DL_ERR_FORMAT, "2 groups into 1: refused");
                EXPECT_ERR(ctx[2], DL_ERR_FORMAT, "group");
                /* dl_load_module reads the module part of a dl_save file */
                CHECK(fresh && dl_load_module(path, fresh) == DL_OK, "dl_load_module of a dl_save file: %s",
                      dl_error_message(ctx[2]));
                CHECK(fresh && th_module_bytes(fresh, a, sizeof a) == th_module_bytes(m[1], b, sizeof b) && !memcmp(a, b, th_module_bytes(m[1], b, sizeof b)),
                      "dl_load_module of a dl_save file: the saved module");
                dl_clear_error(ctx[2]);
            }
        }
        for (k = 0; k < 3; k++) dl_ctx_free(ctx[k]);
    }
    remove(path);
}

static void test_group_errors(void)
{
    dl_ctx *ctx = dl_ctx_init(&(dl_ctx_desc){.log = dl_log_silent});
    dl_module *m = mlp(ctx, false);
    dl_tensor *W[2], *B[2];
    dl_optim *o;
    W[0] = dl_module_get(m, "0.weight");
    W[1] = dl_module_get(m, "2.weight");
    B[0] = dl_module_get(m, "0.bias");
    B[1] = dl_module_get(m, "2.bias");
    {
        dl_param_group g[2] = {{.params = W, .n = 2}, {.params = B, .n = 0}};
        /* an empty group is accepted, as PyTorch's (dl_module_decay_groups of a
           model without biases gives one); no parameter at all is not */
        o = dl_sgd_groups(ctx, 2, g, NULL);
        CHECK(o && dl_optim_num_groups(o) == 2, "an empty group: %s", dl_error_message(ctx));
        dl_optim_free(o);
        g[1].n = -1;
        CHECK(dl_sgd_groups(ctx, 2, g, NULL) == NULL, "a negative count");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_sgd_groups: group 1: n=-1 with params given");
        g[0].n = g[1].n = 0;
        CHECK(dl_sgd_groups(ctx, 2, g, NULL) == NULL, "every group empty");
        EXPECT_ERR(ctx, DL_ERR_ARG, "got an empty parameter list (2 groups, none with a parameter)");
        g[0].n = 2;
        CHECK(dl_adam_groups(ctx, 0, g, NULL) == NULL, "no groups");
        EXPECT_ERR(ctx, DL_ERR_ARG, "got no parameter groups");
        g[1].n = 2;
        g[0].weight_decay = -1.0f;
        CHECK(dl_adamw_groups(ctx, 2, g, NULL) == NULL, "negative group weight decay");
        EXPECT_ERR(ctx, DL_ERR_ARG, "group 0: weight_decay=-1 must be a finite number >= 0");
        g[0].weight_decay = 0.0f;
        g[1].lr = -0.5f;
        CHECK(dl_sgd_groups(ctx, 2, g, NULL) == NULL, "negative group lr");
        EXPECT_ERR(ctx, DL_ERR_ARG, "lr=-0.5");
        g[1].lr = 0.5f;
        o = dl_sgd_groups(ctx, 2, g, &(dl_sgd_desc){.lr = 0.1f});
        CHECK(o && dl_optim_num_groups(o) == 2 && dl_optim_group_lr(o, 0) == 0.1f && dl_optim_group_lr(o, 1) == 0.5f,
              "group lrs 0.1 (the optimizer's) and 0.5");
        CHECK(dl_optim_set_group_lr(o, 2, 0.1f) == DL_ERR_ARG, "group 2");
        EXPECT_ERR(ctx, DL_ERR_ARG, "group 2 does not exist (0..1)");
        CHECK(dl_optim_set_group_lr(o, -1, 0.1f) == DL_ERR_ARG, "group -1");
        EXPECT_ERR(ctx, DL_ERR_ARG, "group -1 does not exist");
        CHECK(dl_optim_set_group_lr(o, 1, -1.0f) == DL_ERR_ARG, "negative lr");
        EXPECT_ERR(ctx, DL_ERR_ARG, "lr=-1 must be a finite number >= 0");
        CHECK(dl_optim_set_lr(o, NAN) == DL_ERR_ARG, "nan lr");
        EXPECT_ERR(ctx, DL_ERR_ARG, "lr=nan");
        CHECK(dl_optim_group_lr(o, 0) == 0.1f && dl_optim_group_lr(o, 1) == 0.5f, "failed sets change nothing");
        CHECK(dl_optim_set_lr(o, 0.05f) == DL_OK && dl_optim_group_lr(o, 1) == 0.25f, "set_lr scales group 1: %g",
              (double)dl_optim_group_lr(o, 1));
        CHECK(dl_optim_set_group_lr(o, 1, 0.3f) == DL_OK && dl_optim_group_lr(o, 0) == 0.05f &&
              dl_optim_group_lr(o, 1) == 0.3f, "set_group_lr sets one group");
        dl_optim_free(o);
        /* a frozen group (initial lr 0) stays frozen; a frozen group 0 gives no
           factor for the others (it used to set them all to lr) */
        g[0].lr = 0.2f;
        g[1].lr = DL_ZERO;
        o = dl_sgd_groups(ctx, 2, g, NULL);
        CHECK(o && dl_optim_set_lr(o, 0.1f) == DL_OK && dl_optim_group_lr(o, 0) == 0.1f &&
              dl_optim_group_lr(o, 1) == 0.0f, "a frozen group 1 stays at 0");
        dl_optim_free(o);
        g[0].lr = DL_ZERO;
        g[1].lr = 0.1f;
        o = dl_sgd_groups(ctx, 2, g, NULL);
        CHECK(o && dl_optim_set_lr(o, 0.05f) == DL_ERR_ARG && dl_optim_group_lr(o, 0) == 0.0f &&
              dl_optim_group_lr(o, 1) == 0.1f, "a frozen group 0: refused, nothing changed");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_optim_set_lr: group 0's initial lr is 0 (frozen), so lr=0.05 gives no "
                   "factor for the other 1 group");
        CHECK(dl_last_error(ctx) == DL_OK, "stray error: %s", dl_error_message(ctx));
        /* a group that does not exist: 0 and an error (PyTorch: IndexError) */
        CHECK(dl_optim_group_lr(o, 7) == 0.0f, "lr of a group that does not exist: 0");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_optim_group_lr: group 7 does not exist (0..1)");
        CHECK(dl_optim_group_lr(NULL, 0) == 0.0f && dl_optim_num_groups(NULL) == 0, "of NULL: 0");
        CHECK(strstr(dl_error_message(NULL), "dl_optim_num_groups: o is NULL") != NULL, "NULL o named: %s",
              dl_error_message(NULL));
        CHECK(dl_last_error(ctx) == DL_OK, "stray error: %s", dl_error_message(ctx));
    }
    dl_ctx_free(ctx);
}

/* DL_ZERO is a real zero where zero means a non-zero default: a group's lr
   (0: the optimizer's; DL_ZERO: a frozen group, as {"lr": 0} in PyTorch),
   the optimizer's lr, AdamW's weight decay */
static void test_dl_zero(void)
{
    dl_ctx *ctx = dl_ctx_init(&(dl_ctx_desc){.log = dl_log_silent});
    dl_module *m = mlp(ctx, false);
    dl_tensor *W[2], *B[2], *x = dl_randn(ctx, DL_SHAPE(3, 4)), *all[4];
    unsigned char w0[4096], b0[4096], w1[4096], b1[4096];
    size_t nw, nb;
    dl_optim *o;
    int k;
    CHECK(DL_ZERO == 0.0f && signbit(DL_ZERO), "DL_ZERO is -0.0f");
    W[0] = dl_module_get(m, "0.weight");
    W[1] = dl_module_get(m, "2.weight");
    B[0] = dl_module_get(m, "0.bias");
    B[1] = dl_module_get(m, "2.bias");
    all[0] = W[0]; all[1] = B[0]; all[2] = W[1]; all[3] = B[1];
    for (k = 0; k < 3; k++) {
        dl_param_group g[2] = {{.params = W, .n = 2}, {.params = B, .n = 2, .lr = DL_ZERO}};
        const char *what = k == 0 ? "SGD, group 1 lr DL_ZERO" : k == 1 ? "Adam, group 1 lr DL_ZERO" :
                           "AdamW lr DL_ZERO, weight decay 0.01";
        o = k == 0 ? dl_sgd_groups(ctx, 2, g, &(dl_sgd_desc){.lr = 0.1f})
          : k == 1 ? dl_adam_groups(ctx, 2, g, &(dl_adam_desc){.lr = 0.1f})
                   : dl_adamw_params(ctx, 4, all, &(dl_adam_desc){.lr = DL_ZERO});
        nw = sizeof(float) * (size_t)W[0]->numel;
        nb = sizeof(float) * (size_t)B[0]->numel;
        memcpy(w0, th_host(W[0]), nw);
        memcpy(b0, th_host(B[0]), nb);
        CHECK(o && (k == 2 ? dl_optim_lr(o) == 0.0f : dl_optim_group_lr(o, 1) == 0.0f && dl_optim_group_lr(o, 0) == 0.1f),
              "%s: the lrs", what);
        dl_optim_zero_grad(o);
        CHECK(dl_backward(dl_sum(dl_module_forward(m, x), DL_ALL, false)) == DL_OK && dl_optim_step(o) == DL_OK,
              "%s: a step: %s", what, dl_error_message(ctx));
        memcpy(w1, th_host(W[0]), nw);
        memcpy(b1, th_host(B[0]), nb);
        CHECK(!memcmp(b0, b1, nb) && (k == 2) == !memcmp(w0, w1, nw), "%s: %s", what,
              k == 2 ? "nothing moves" : "the weights move, the biases do not");
        dl_optim_free(o);
    }
    dl_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/golden/defaults.bin";
    G = dl_ctx_init(&(dl_ctx_desc){.log = dl_log_silent, .seed = 1});
    g_ctx = G;
    CHECK(G != NULL, "dl_ctx_init");
    if (!G) TEST_END();
    if (!g_load(path)) {
        CHECK(0, "loading the golden file %s", path);
        dl_ctx_free(G);
        TEST_END();
    }
    test_ops();
    test_optim_defaults();
    test_groups_golden();
    test_decay_groups();
    test_groups_checkpoint();
    test_group_errors();
    test_dl_zero();
    CHECK(dl_last_error(G) == DL_OK, "stray error at the end: %s", dl_error_message(G));
    g_free_recs();
    dl_ctx_free(G);
    TEST_END();
}
