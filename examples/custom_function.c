/* examples/custom_function.c - a Sigmoid written with the custom-function API
   (as torch.autograd.Function): forward computes and saves its output,
   backward returns g * y * (1 - y). Checked against the built-in dl_sigmoid
   and by finite differences with dl_gradcheck.
   Build: cc -std=c99 -O2 -I. examples/custom_function.c -o build/custom_function -lm -lpthread */
#define DL_IMPLEMENTATION
#include "dl.h"
#include <stdio.h>
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

int main(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL);
    dl_tensor *x = dl_requires_grad(dl_randn(ctx, DL_SHAPE(4, 5)), true);
    dl_tensor *mine = dl_function_apply(&MySigmoid, 1, &x, NULL), *ref = dl_sigmoid(x);
    dl_tensor *g1[1], *g2[1];
    dl_gradcheck_result r;
    double dy = 0, dg = 0;
    int64_t i;
    dl_grad(dl_sum(mine, DL_ALL, false), 1, &x, g1, NULL);
    dl_grad(dl_sum(ref, DL_ALL, false), 1, &x, g2, NULL);
    if (!g1[0] || !g2[0]) { fprintf(stderr, "%s\n", dl_error_message(ctx)); return 1; }
    for (i = 0; i < x->numel; i++) {
        dy = fmax(dy, fabs(dl_data(mine)[i] - dl_data(ref)[i]));
        dg = fmax(dg, fabs(dl_data(g1[0])[i] - dl_data(g2[0])[i]));
    }
    printf("MySigmoid vs dl_sigmoid: max |dy| = %.3g, max |dgrad| = %.3g\n", dy, dg);
    if (dl_gradcheck(ctx, apply, NULL, 1, &x, NULL, &r) != DL_OK) { fprintf(stderr, "%s\n", dl_error_message(ctx)); return 1; }
    printf("gradcheck: worst relative error %.3g -> %s\n", r.max_rel_err[0], r.ok ? "ok" : "FAILED");
    dl_ctx_free(ctx);
    return (r.ok && dy < 1e-6 && dg < 1e-6) ? 0 : 1;
}
