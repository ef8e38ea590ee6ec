/* examples/gradcheck.c - numerical vs analytic gradients of a small network
   (two tanh layers, log-softmax, a sum over the batch), printed as a table per parameter.
   Build: cc -std=c99 -O2 -I. examples/gradcheck.c -o build/gradcheck -lm -lpthread */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/cli.h"   /* stdout checked at exit */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* inputs: x (6,5), W1 (5,8), b1 (8), W2 (8,3), b2 (3) */
static dl_tensor *net(void *user, dl_tensor *const *in)
{
    dl_tensor *h = dl_tanh(dl_add(dl_matmul(in[0], in[1]), in[2]));
    dl_tensor *o = dl_log_softmax(dl_add(dl_matmul(h, in[3]), in[4]), 1);
    (void)user;
    return dl_sum(o, DL_DIMS(0), false);
}

/* --help, or nothing: this example has no settings */
static int args_ok(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: %s [--help]\n"
               "  prints analytic vs numerical gradients of a small network; writes no files\n", argv[0]);
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

int main(int argc, char **argv)
{
    static const char *names[5] = {"x", "W1", "b1", "W2", "b2"};
    dl_ctx *ctx;
    dl_tensor *in[5];
    dl_gradcheck_result r;
    dl_gradcheck_desc gd;
    int i;
    EX_CHECK_STDOUT(argv[0]);
    if (!args_ok(argc, argv)) return 2;
    if (!(ctx = dl_ctx_init(NULL))) { fprintf(stderr, "%s: cannot create a context\n", argv[0]); return 1; }
    in[0] = dl_randn(ctx, DL_SHAPE(6, 5));
    in[1] = dl_mul_scalar(dl_randn(ctx, DL_SHAPE(5, 8)), 0.5f);
    in[2] = dl_randn(ctx, DL_SHAPE(8));
    in[3] = dl_mul_scalar(dl_randn(ctx, DL_SHAPE(8, 3)), 0.5f);
    in[4] = dl_randn(ctx, DL_SHAPE(3));
    for (i = 0; i < 5; i++) dl_requires_grad(in[i], true);
    memset(&gd, 0, sizeof gd);
    /* float32: central differences are most accurate near eps = cbrt(2^-23) ~ 5e-3 */
    gd.eps = 5e-3;
    if (dl_gradcheck(ctx, net, NULL, 5, in, &gd, &r) != DL_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(ctx));
        dl_ctx_free(ctx);
        return 1;
    }
    printf("%-6s %-8s %10s %14s %14s\n", "input", "shape", "elements", "max |a - n|", "max rel err");
    for (i = 0; i < 5; i++) {
        char shape[32];
        if (in[i]->ndim == 2) snprintf(shape, sizeof shape, "(%lld,%lld)", (long long)in[i]->shape[0], (long long)in[i]->shape[1]);
        else snprintf(shape, sizeof shape, "(%lld)", (long long)in[i]->shape[0]);
        printf("%-6s %-8s %10lld %14.3e %14.3e\n", names[i], shape, (long long)in[i]->numel, r.max_abs_err[i], r.max_rel_err[i]);
    }
    printf("gradcheck %s (eps 5e-3, pass when |a - n| <= 1e-3 + 1e-2 |n|)\n", r.ok ? "passed" : "FAILED");
    dl_ctx_free(ctx);
    return r.ok ? 0 : 1;
}
