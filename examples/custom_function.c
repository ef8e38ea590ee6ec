/* examples/custom_function.c - a Sigmoid written with the custom-function API
   (as torch.autograd.Function): forward computes and saves its output,
   backward returns g * y * (1 - y). Checked against the built-in dl_sigmoid
   and by finite differences with dl_gradcheck.
   Build: cc -std=c99 -O2 -I. examples/custom_function.c -o build/custom_function -lm -lpthread */
#define DL_IMPLEMENTATION
#include "dl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* y = 1 / (1 + exp(-x)); saved for backward */
static dl_tensor *sigmoid_forward(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    dl_tensor *y = dl_div(dl_ones_like(in[0]), dl_add_scalar(dl_exp(dl_neg(in[0])), 1.0f));
    (void)n; (void)user;
    dl_fn_save(fc, y);
    return y;
}

/* dx = g * y * (1 - y), written with dl ops so it can be differentiated again */
static dl_result sigmoid_backward(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    dl_tensor *y = dl_fn_saved(fc, 0);
    (void)user;
    if (dl_fn_needs_grad(fc, 0)) gin[0] = dl_mul(g, dl_mul(y, dl_rsub_scalar(y, 1.0f)));
    return DL_OK;
}

static const dl_function MySigmoid = {"MySigmoid", sigmoid_forward, sigmoid_backward};

static dl_tensor *apply(void *user, dl_tensor *const *in)
{
    (void)user;
    return dl_function_apply(&MySigmoid, 1, in, NULL);
}

/* --help, or nothing: this example has no settings */
static int args_ok(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: %s [--help]\n"
               "  checks a Sigmoid written with the custom-function API against dl_sigmoid\n"
               "  and by finite differences; writes no files\n", argv[0]);
        exit(0);
    }
    if (argc > 1) {
        fprintf(stderr, "%s: unknown argument %s: this example takes no flags\nusage: %s [--help]\n",
                argv[0], argv[1], argv[0]);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    dl_ctx *ctx;
    dl_tensor *x, *mine, *ref, *g1[1] = {NULL}, *g2[1] = {NULL};
    dl_gradcheck_result r;
    double dy = 0, dg = 0;
    int64_t i;
    if (!args_ok(argc, argv)) return 2;
    if (!(ctx = dl_ctx_init(NULL))) { fprintf(stderr, "%s: cannot create a context\n", argv[0]); return 1; }
    x = dl_requires_grad(dl_randn(ctx, DL_SHAPE(4, 5)), true);
    mine = dl_function_apply(&MySigmoid, 1, &x, NULL);
    ref = dl_sigmoid(x);
    if (dl_grad(dl_sum(mine, DL_ALL, false), 1, &x, g1, NULL) != DL_OK ||
        dl_grad(dl_sum(ref, DL_ALL, false), 1, &x, g2, NULL) != DL_OK || !g1[0] || !g2[0]) {
        fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(ctx));
        dl_ctx_free(ctx);
        return 1;
    }
    for (i = 0; i < x->numel; i++) {
        dy = fmax(dy, fabs(dl_data(mine)[i] - dl_data(ref)[i]));
        dg = fmax(dg, fabs(dl_data(g1[0])[i] - dl_data(g2[0])[i]));
    }
    printf("MySigmoid vs dl_sigmoid: max |dy| = %.3g, max |dgrad| = %.3g\n", dy, dg);
    if (dl_gradcheck(ctx, apply, NULL, 1, &x, NULL, &r) != DL_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(ctx));
        dl_ctx_free(ctx);
        return 1;
    }
    printf("gradcheck: worst relative error %.3g -> %s\n", r.max_rel_err[0], r.ok ? "ok" : "FAILED");
    dl_ctx_free(ctx);
    return (r.ok && dy < 1e-6 && dg < 1e-6) ? 0 : 1;
}
