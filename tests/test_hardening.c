/* tests/test_hardening.c - regression tests for what a hostile try of the
   library found (each case failed before its fix): stale step tensors of
   any age, custom functions returning an input, shared create_graph
   gradients, loader errors, checkpoint writes, optimizer values, messages of
   NULL returns, huge convolutions, the error message's lifetime, gzip bombs,
   use after dl_free, thread counts. */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>

static dl_ctx *new_ctx(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.num_threads = 2;
    return dl_ctx_init(&d);
}

static char g_dir[256];
static DL__UNUSED const char *tmp(const char *name)
{
    static char buf[4][512];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 512, "%s/%s", g_dir, name);
    return b;
}

/* 1. a step tensor used any number of steps later is an error */
static void test_stale_any_age(void)
{
    dl_ctx *ctx = new_ctx();
    int ages[] = {1, 2, 3, 10, 1000}, i, s;
    for (i = 0; i < 5; i++) {
        dl_tensor *old, *r;
        dl_step_end(ctx);
        old = dl_ones(ctx, DL_SHAPE(4, 4));   /* the step's first tensor */
        for (s = 0; s < ages[i]; s++) {
            /* the same allocations every step, as a training loop does */
            dl_tensor *x = dl_ones(ctx, DL_SHAPE(4, 4));
            (void)dl_add(dl_mul(x, x), x);
            dl_step_end(ctx);
        }
        {   /* this step makes its tensors first: they land where old ones were */
            dl_tensor *x = dl_ones(ctx, DL_SHAPE(4, 4));
            (void)dl_add(dl_mul(x, x), x);
        }
        r = dl_add(old, old);
        CHECK(r == NULL, "a tensor %d steps old was accepted", ages[i]);
        CHECK(dl_last_error(ctx) == DL_ERR_STALE && strstr(dl_error_message(ctx), "dl_keep"),
              "age %d: %s: %s", ages[i], dl_result_string(dl_last_error(ctx)), dl_error_message(ctx));
        dl_clear_error(ctx);
        CHECK(dl_sum(old, DL_ALL, false) == NULL && dl_last_error(ctx) == DL_ERR_STALE, "age %d: dl_sum", ages[i]);
        dl_clear_error(ctx);
    }
    {   /* far older than the header batches given back to the system */
        dl_tensor *old;
        dl_step_end(ctx);
        old = dl_ones(ctx, DL_SHAPE(2));
        for (s = 0; s < 200; s++) {
            int k;
            for (k = 0; k < 500; k++) (void)dl_zeros(ctx, DL_SHAPE(1));
            dl_step_end(ctx);
        }
        (void)dl_zeros(ctx, DL_SHAPE(2));
        CHECK(dl_neg(old) == NULL && dl_last_error(ctx) == DL_ERR_STALE, "a released header: %s",
              dl_error_message(ctx));
        dl_clear_error(ctx);
    }
    dl_ctx_free(ctx);
}

/* 2. a custom function whose forward returns one of its inputs */
static dl_tensor *pass_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)fc; (void)n; (void)user;
    return in[0];
}
static dl_tensor *inplace_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    float *d = dl_data(in[0]);
    int64_t i;
    (void)fc; (void)n; (void)user;
    for (i = 0; i < in[0]->numel; i++) d[i] *= 2.0f;   /* "in place", then returned */
    return in[0];
}
static dl_result pass_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)fc; (void)user;
    gin[0] = g;
    return DL_OK;
}
static dl_result double_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)fc; (void)user;
    gin[0] = dl_mul_scalar(g, 2.0f);
    return DL_OK;
}

static void test_custom_returns_input(void)
{
    dl_ctx *ctx = new_ctx();
    dl_function pass = {"pass_through", pass_fwd, pass_bwd};
    dl_function inpl = {"in_place_double", inplace_fwd, double_bwd};
    float av[3] = {1, 2, 3}, g[3];
    dl_tensor *a = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), av), true);
    dl_tensor *x, *y;
    /* a leaf input stays a leaf */
    y = dl_function_apply(&pass, 1, &a, NULL);
    CHECK(y && y != a && a->node_ == NULL && a->requires_grad, "pass-through on a leaf: the leaf changed");
    CHECK(dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && a->grad, "pass-through backward: %s", dl_error_message(ctx));
    CHECK(a->grad && dl_read(a->grad, g, 3) == DL_OK && g[0] == 1.0f && g[2] == 1.0f, "pass-through grad");
    dl_zero_grad(a);
    /* an op's output keeps its node: the gradient reaches a through it */
    x = dl_mul_scalar(a, 3.0f);
    y = dl_function_apply(&pass, 1, &x, NULL);
    CHECK(y && y != x && x->node_ && strcmp(x->node_->op->name, "dl_scalar_affine") == 0,
          "pass-through on an op output overwrote its node");
    CHECK(dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK, "backward through x: %s", dl_error_message(ctx));
    CHECK(dl_read(a->grad, g, 3) == DL_OK && g[0] == 3.0f && g[1] == 3.0f, "grad through the recorded op: %g", (double)g[0]);
    dl_zero_grad(a);
    /* an in-place-style forward */
    x = dl_mul_scalar(a, 1.0f);
    y = dl_function_apply(&inpl, 1, &x, NULL);
    CHECK(y && y != x && x->node_ != NULL, "in-place-style function overwrote its input's node");
    CHECK(y && dl_read(y, g, 3) == DL_OK && g[1] == 4.0f, "in-place value");
    CHECK(dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && dl_read(a->grad, g, 3) == DL_OK && g[2] == 2.0f,
          "in-place-style grad %g: %s", (double)g[2], dl_error_message(ctx));
    dl_ctx_free(ctx);
}

/* 3. with create_graph every leaf owns its gradient */
static void test_create_graph_own_grads(void)
{
    dl_ctx *ctx = new_ctx();
    float av[2] = {1, 2}, bv[2] = {3, 4}, g[2];
    dl_tensor *a = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), av), true);
    dl_tensor *b = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), bv), true);
    dl_backward_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.create_graph = true;
    CHECK(dl_backward_ex(dl_sum(dl_add(a, b), DL_ALL, false), &bd) == DL_OK, "backward: %s", dl_error_message(ctx));
    CHECK(a->grad && b->grad && a->grad != b->grad && a->grad->data != b->grad->data, "two leaves share one grad tensor");
    if (a->grad && b->grad) {
        dl_data(a->grad)[0] = 42.0f;
        CHECK(dl_read(b->grad, g, 2) == DL_OK && g[0] == 1.0f, "writing a's grad changed b's: %g", (double)g[0]);
    }
    dl_ctx_free(ctx);
}

/* 4, 5. loader workers report a failing sample without a race; the end of an
   epoch (0) and an error (-1) are told apart */
static dl_result bad_get(const dl_dataset *ds, int64_t i, float *x, int64_t *y, uint64_t rng[4])
{
    (void)ds; (void)rng;
    x[0] = (float)i;
    *y = i;
    return i >= 5 ? DL_ERR_FORMAT : DL_OK;
}

static void test_loader_errors(void)
{
    int w;
    for (w = 0; w <= 2; w++) {
        dl_ctx *ctx = new_ctx();
        dl_dataset ds;
        dl_loader_desc ld;
        dl_loader *l;
        dl_tensor *x, *y;
        int rc, k;
        memset(&ds, 0, sizeof ds);
        ds.length = 16;
        ds.sample_shape = DL_SHAPE(1);
        ds.get = bad_get;
        memset(&ld, 0, sizeof ld);
        ld.batch_size = 4;
        ld.num_workers = w;
        l = dl_loader_new(ctx, &ds, &ld);
        CHECK(l != NULL, "loader: %s", dl_error_message(ctx));
        if (!l) { dl_ctx_free(ctx); continue; }
        rc = dl_loader_next(l, &x, &y);
        CHECK(rc == 1 && x && y, "%d workers: first batch %d", w, rc);
        rc = dl_loader_next(l, &x, &y);   /* samples 4..7: 5, 6, 7 fail */
        CHECK(rc == -1 && x == NULL && y == NULL, "%d workers: a failing batch gave %d", w, rc);
        CHECK(dl_last_error(ctx) == DL_ERR_FORMAT && strstr(dl_error_message(ctx), "sample 5 "),
              "%d workers: %s", w, dl_error_message(ctx));
        dl_clear_error(ctx);
        k = (int)dl_loader_epoch(l);
        rc = dl_loader_next(l, &x, &y);   /* the failed epoch was dropped: a new one starts */
        CHECK(rc == 1 && dl_loader_epoch(l) == k + 1, "%d workers: after an error, a new epoch: %d", w, rc);
        dl_step_end(ctx);
        ds.length = 4;   /* a dataset that works: 1 batch, then 0 at the end */
        l = dl_loader_new(ctx, &ds, &ld);
        rc = l ? dl_loader_next(l, &x, &y) : -2;
        k = l ? dl_loader_next(l, &x, &y) : -2;
        CHECK(rc == 1 && k == 0 && dl_last_error(ctx) == DL_OK, "%d workers: end of epoch is 0, not an "
              "error: %d %d %s", w, rc, k, dl_error_message(ctx));
        CHECK(dl_loader_next(l, NULL, &y) == -1 && dl_last_error(ctx) == DL_ERR_ARG, "NULL x is an error");
        dl_clear_error(ctx);
        dl_ctx_free(ctx);
    }
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "build/hardening_tmp");
    mkdir("build", 0755);
    mkdir(g_dir, 0755);
    test_stale_any_age();
    test_custom_returns_input();
    test_create_graph_own_grads();
    test_loader_errors();
    TEST_END();
}
