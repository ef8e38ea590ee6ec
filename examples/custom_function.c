/* examples/custom_function.c - custom autograd functions, as
   torch.autograd.Function:
   1. MySigmoid, written with dl ops: forward computes and saves its output,
      backward returns g * y * (1 - y). Like a PyTorch Function written with
      torch ops it runs on every device (cpu:0, a virtual cpu:1, cuda:0) and
      its backward can be differentiated again. Checked against the built-in
      dl_sigmoid and by finite differences with dl_gradcheck.
   2. HostSquare (y = x^2), written with loops over dl_data: the way to wrap
      existing host C code, but only for tensors in host memory (cpu:0). On
      any other device dl_data returns NULL with a message, the forward
      returns NULL and the example says so instead of crashing.
   The device is the context's: cpu:0, or DL_DEVICE from the environment.
   Build: cc -std=c99 -O2 -I. examples/custom_function.c -o build/custom_function -lm -lpthread
   Run:   build/custom_function
          DL_CPU_DEVICES=2 DL_DEVICE=cpu:1 DL_STRICT=1 build/custom_function   (MySigmoid only) */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/cli.h"   /* stdout checked at exit */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- 1. MySigmoid: dl ops only, so any device */

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

/* ---- 2. HostSquare: loops over host memory, so cpu:0 only */

/* y = x^2, element by element on the host; x saved for backward. dl_data is
   NULL (with the reason in the context's message) when x is not in host
   memory: then the forward fails, and dl_function_apply returns NULL. */
static dl_tensor *square_forward(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    const float *x = dl_data(in[0]);
    dl_tensor *y;
    float *py;
    int64_t i;
    (void)n; (void)user;
    if (!x) return NULL;
    y = dl_zeros_like(in[0]);
    if (!(py = dl_data(y))) return NULL;
    for (i = 0; i < in[0]->numel; i++) py[i] = x[i] * x[i];
    dl_fn_save(fc, in[0]);
    return y;
}

/* dx = 2 x g on the host (not differentiable again: host loops record nothing) */
static dl_result square_backward(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    dl_tensor *xt = dl_fn_saved(fc, 0), *dx;
    const float *x = dl_data(xt), *pg = dl_data(g);
    float *pd;
    int64_t i;
    (void)user;
    if (!dl_fn_needs_grad(fc, 0)) return DL_OK;
    if (!x || !pg || !(dx = dl_zeros_like(xt)) || !(pd = dl_data(dx))) return DL_ERR_DEVICE;
    for (i = 0; i < xt->numel; i++) pd[i] = 2.0f * x[i] * pg[i];
    gin[0] = dx;
    return DL_OK;
}

static const dl_function HostSquare = {"HostSquare", square_forward, square_backward};

static dl_tensor *apply(void *user, dl_tensor *const *in)
{
    return dl_function_apply((const dl_function *)user, 1, in, NULL);
}

/* --help, or nothing: this example has no settings */
static int args_ok(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: %s [--help]\n"
               "  checks a Sigmoid written with the custom-function API against dl_sigmoid\n"
               "  and by finite differences, on the context's device (DL_DEVICE, default cpu:0);\n"
               "  on cpu:0 also a function written with host loops; writes no files\n", argv[0]);
        exit(0);
    }
    if (argc > 1) {   /* (the first that is not --help: "--help x" is about x) */
        int k = 1;
        while (k < argc - 1 && (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h"))) k++;
        fprintf(stderr, "%s: unknown argument %s: this example takes no flags\nusage: %s [--help]\n",
                argv[0], argv[k], argv[0]);
        return 0;
    }
    return 1;
}

/* max |a - b| over every element, computed on the tensors' device; -1 on an error */
static float max_abs_diff(dl_tensor *a, dl_tensor *b)
{
    dl_tensor *d = dl_max(dl_abs(dl_sub(a, b)), DL_ALL, false);
    return d ? dl_item(d) : -1.0f;
}

/* f against the built-in ref (forward and gradient) and by dl_gradcheck; 0 when
   every check passes, 1 otherwise (printed) */
static int check(dl_ctx *ctx, const char *prog, const dl_function *f, dl_tensor *x, dl_tensor *ref)
{
    dl_tensor *mine = dl_function_apply(f, 1, &x, NULL), *g1[1] = {NULL}, *g2[1] = {NULL};
    dl_gradcheck_result r;
    float dy, dg;
    if (!mine || dl_grad(dl_sum(mine, DL_ALL, false), 1, &x, g1, NULL) != DL_OK ||
        dl_grad(dl_sum(ref, DL_ALL, false), 1, &x, g2, NULL) != DL_OK || !g1[0] || !g2[0] ||
        (dy = max_abs_diff(mine, ref)) < 0 || (dg = max_abs_diff(g1[0], g2[0])) < 0 ||
        dl_gradcheck(ctx, apply, (void *)f, 1, &x, NULL, &r) != DL_OK) {
        fprintf(stderr, "%s: %s: %s\n", prog, f->name, dl_error_message(ctx));
        return 1;
    }
    printf("%s vs the built-in: max |dy| = %.3g, max |dgrad| = %.3g; gradcheck: worst relative error "
           "%.3g -> %s\n", f->name, (double)dy, (double)dg, r.max_rel_err[0], r.ok ? "ok" : "FAILED");
    return r.ok && dy < 1e-6f && dg < 1e-6f ? 0 : 1;
}

int main(int argc, char **argv)
{
    dl_ctx_desc cd;
    dl_ctx *ctx;
    dl_tensor *x;
    int rc;
    EX_CHECK_STDOUT(argv[0]);
    if (!args_ok(argc, argv)) return 2;
    memset(&cd, 0, sizeof cd);
    cd.log = dl_log_silent;   /* every failure is printed below, with its function's name */
    if (!(ctx = dl_ctx_init(&cd))) {
        fprintf(stderr, "%s: cannot create a context: %s\n", argv[0], dl_error_message(NULL));
        return 1;
    }
    x = dl_requires_grad(dl_randn(ctx, DL_SHAPE(4, 5)), true);   /* on the context's device */
    printf("device: %s\n", dl_device_name(dl_ctx_device(ctx)));
    rc = check(ctx, argv[0], &MySigmoid, x, dl_sigmoid(x));
    if (x && dl_data(x)) {   /* host memory (cpu:0, a non-strict cpu:N): the host variant runs */
        rc |= check(ctx, argv[0], &HostSquare, x, dl_mul(x, x));
    } else {   /* the host variant refuses: dl_data says why */
        dl_tensor *y = dl_function_apply(&HostSquare, 1, &x, NULL);
        printf("HostSquare on %s: %s\n", dl_device_name(x ? x->device : dl_ctx_device(ctx)),
               y ? "ran (unexpected)" : dl_error_message(ctx));
        dl_clear_error(ctx);
        rc |= y != NULL;
    }
    dl_ctx_free(ctx);
    return rc;
}
