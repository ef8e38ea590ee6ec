/* examples/transfer_cost.c - what moving data costs: the same N x N matrix
   product (200 by default) on the CPU, on the GPU with its operands already
   there, and on the GPU with both operands copied in and the result copied
   back each time. Prints the three median times and the share of the last
   one spent on the copies: a small product is not worth a trip to the GPU,
   keep data where it is used.

   Build: cc -std=c99 -O2 -I. examples/transfer_cost.c -o build/transfer_cost -lm -lpthread
          (CPU only: the GPU lines say why they are missing)
   GPU:   make cuda, then build/cuda/transfer_cost [--n 200] [--reps 101] */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/cli.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { ON_CPU, ON_GPU, WITH_COPIES };

/* median microseconds of reps products (after 5 untimed ones); -1 on an error */
static double time_it(dl_ctx *ctx, int how, dl_tensor *a, dl_tensor *b, int reps)
{
    double *t = (double *)malloc(sizeof(double) * (size_t)reps), med;
    int i;
    if (!t) return -1;
    for (i = -5; i < reps; i++) {
        double t0 = now_us();
        dl_tensor *c;
        if (how == WITH_COPIES) {     /* host -> GPU, product, GPU -> host (waits) */
            c = dl_to(dl_matmul(dl_to(a, dl_cuda(0)), dl_to(b, dl_cuda(0))), dl_cpu());
        } else {
            c = dl_matmul(a, b);
            if (how == ON_GPU && dl_sync(ctx) != DL_OK) c = NULL;   /* the GPU runs asynchronously */
        }
        if (!c) { free(t); return -1; }
        if (i >= 0) t[i] = now_us() - t0;
        dl_step_end(ctx);
    }
    qsort(t, (size_t)reps, sizeof *t, cmp);
    med = t[reps / 2];
    free(t);
    return med;
}

int main(int argc, char **argv)
{
    int n = 200, reps = 101, i;
    dl_ctx *ctx;
    dl_tensor *a, *b, *ga, *gb;
    double cpu, gpu, copies;
    EX_CHECK_STDOUT(argv[0]);
    for (i = 1; i < argc; i++) {
        const char *f = argv[i];
        char *end;
        long v;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: %s [--n N (200)] [--reps N (101)]\n", argv[0]);
            return 0;
        }
        if (strcmp(f, "--n") && strcmp(f, "--reps")) {
            fprintf(stderr, "%s: unknown argument %s (--help)\n", argv[0], f);
            return 2;
        }
        if (i + 1 == argc) { fprintf(stderr, "%s: %s needs a value\n", argv[0], f); return 2; }
        errno = 0;
        v = strtol(argv[++i], &end, 10);   /* the whole value, a whole number in range */
        if (!(argv[i][0] >= '0' && argv[i][0] <= '9') || *end || errno == ERANGE || v < 1 ||
            v > (!strcmp(f, "--n") ? 8192 : 100000)) {
            fprintf(stderr, "%s: %s %s: must be a whole number from 1 to %d\n", argv[0], f, argv[i],
                    !strcmp(f, "--n") ? 8192 : 100000);
            return 2;
        }
        if (!strcmp(f, "--n")) n = (int)v;
        else reps = (int)v;
    }
    ctx = dl_ctx_init(NULL);
    if (!ctx) { fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(NULL)); return 1; }
    dl_set_log(ctx, dl_log_silent, NULL);
    a = dl_keep(dl_randn(ctx, DL_SHAPE(n, n)));
    b = dl_keep(dl_randn(ctx, DL_SHAPE(n, n)));
    cpu = time_it(ctx, ON_CPU, a, b, reps);
    if (cpu < 0) { fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(ctx)); dl_ctx_free(ctx); return 1; }
    printf("%dx%d matrix product, median of %d:\n", n, n, reps);
    printf("  %-28s %10.1f us\n", "cpu:0", cpu);
    ga = dl_keep(dl_to(a, dl_cuda(0)));
    gb = dl_keep(dl_to(b, dl_cuda(0)));
    if (!ga || !gb) {
        printf("  %-28s %10s    (%s)\n", "cuda:0", "n/a", dl_error_message(ctx));
        dl_ctx_free(ctx);
        return 0;
    }
    gpu = time_it(ctx, ON_GPU, ga, gb, reps);
    copies = time_it(ctx, WITH_COPIES, a, b, reps);
    if (gpu < 0 || copies < 0) { fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(ctx)); dl_ctx_free(ctx); return 1; }
    printf("  %-28s %10.1f us\n", "cuda:0", gpu);
    printf("  %-28s %10.1f us    (copies: %.0f%% of it)\n", "cuda:0, copies in and out", copies,
           copies > gpu ? 100.0 * (copies - gpu) / copies : 0.0);
    dl_ctx_free(ctx);
    return 0;
}
