/* tests/test_core.c - context and memory, autograd semantics, custom
   functions, graph output, anomaly mode. A counting allocator checks that
   nothing leaks and that a steady training loop stops allocating.
   Build: see Makefile (`make test`). Pass --quick for a shorter run (valgrind). */
#define _POSIX_C_SOURCE 200809L   /* dup, fileno: test_print captures stdout */
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include "count_alloc.h"   /* cnt_live, cnt_calls */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"

static dl_ctx *new_ctx(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.seed = 42;
    return dl_ctx_init(&d);
}

static float at(dl_tensor *t, long i) { return th_f(t, i); }

/* ---- memory: steady loop, no allocation after the first steps, no leaks */
static void test_memory(int steps)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *w = dl_keep(dl_randn(ctx, DL_SHAPE(8, 4)));
    dl_tensor *b = dl_keep(dl_zeros(ctx, DL_SHAPE(4)));
    /* [0]: the host, cpu:0 (headers, tape, the library's objects, and the
       data when it is the default device); [1]: the default device */
    dl_memory_stats s1[2], s2[2];
    dl_device devs[2];
    float first = 0, last = 0;
    int i, k;
    devs[0] = dl_cpu();
    devs[1] = dl_ctx_device(ctx);
    dl_requires_grad(w, true);
    dl_requires_grad(b, true);
    for (i = 0; i < steps; i++) {
        dl_tensor *x = dl_randn(ctx, DL_SHAPE(16, 8));
        dl_tensor *y = dl_sum(x, DL_DIMS(1), true);
        dl_tensor *h = dl_tanh(dl_add(dl_matmul(x, w), b));
        dl_tensor *d = dl_sub(dl_sum(h, DL_DIMS(1), true), y);
        dl_tensor *loss = dl_mean(dl_mul(d, d), DL_ALL, false);
        if (!loss || dl_backward(loss) != DL_OK) { CHECK(0, "loop failed: %s", dl_error_message(ctx)); break; }
        /* fresh random data every step: compare the mean of the first and last ten */
        if (i < 10) first += dl_item(loss) / 10;
        if (i >= steps - 10) last += dl_item(loss) / 10;
        dl_sgd_update(w, 0.01f);
        dl_sgd_update(b, 0.01f);
        dl_step_end(ctx);
        if (i == 1) for (k = 0; k < 2; k++) dl_memory_stats_get(ctx, devs[k], &s1[k]);
    }
    for (k = 0; k < 2; k++) {
        const char *dn = dl_device_name(devs[k]);
        dl_memory_stats_get(ctx, devs[k], &s2[k]);
        CHECK(s2[k].alloc_calls == s1[k].alloc_calls, "%s: allocator called %llu times after step 2", dn,
              (unsigned long long)(s2[k].alloc_calls - s1[k].alloc_calls));
        CHECK(s2[k].step_reserved == s1[k].step_reserved, "%s: step memory grew %zu -> %zu", dn,
              s1[k].step_reserved, s2[k].step_reserved);
        CHECK(s2[k].persistent_bytes == s1[k].persistent_bytes, "%s: persistent memory changed", dn);
        CHECK(s2[k].peak_bytes >= s2[k].persistent_bytes, "%s: peak below live", dn);
    }
    CHECK(s2[0].header_bytes <= ((size_t)8 << 20), "step headers not given back: %zu bytes held", s2[0].header_bytes);
    CHECK(s2[1].persistent_bytes >= sizeof(float) * (8 * 4 + 4), "parameters not on %s: %zu bytes",
          dl_device_name(devs[1]), s2[1].persistent_bytes);
    CHECK(last < first, "loss did not fall: %g -> %g", (double)first, (double)last);
    dl_ctx_free(ctx);
    CHECK(cnt_live == 0, "%ld blocks still live after dl_ctx_free", cnt_live);
}

/* ---- step memory and stale detection, dl_keep, dl_free */
static void test_steps(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *a = dl_ones(ctx, DL_SHAPE(3));
    dl_tensor *k = dl_keep(a), *r;
    uint64_t s = dl_step(ctx);
    dl_step_end(ctx);
    CHECK(dl_step(ctx) == s + 1, "step counter");
    r = dl_add(a, a);
    CHECK(r == NULL, "stale tensor accepted");
    EXPECT_ERR(ctx, DL_ERR_STALE, "dl_keep");
    r = dl_add(k, k);
    CHECK(r && at(r, 2) == 2.0f, "kept tensor unusable");
    dl_free(k);
    dl_free(NULL);
    dl_step_end(ctx);
    {   /* memory accounting */
        dl_memory_stats st;
        dl_tensor *p = dl_keep(dl_zeros(ctx, DL_SHAPE(1000)));
        dl_memory_stats_get(ctx, dl_ctx_device(ctx), &st);
        CHECK(st.persistent_bytes >= 4000, "persistent bytes %zu", st.persistent_bytes);
        dl_free(p);
        dl_memory_stats_get(ctx, dl_ctx_device(ctx), &st);
        CHECK(st.persistent_bytes < 4000, "dl_free did not release: %zu", st.persistent_bytes);
    }
    dl_ctx_free(ctx);
    CHECK(cnt_live == 0, "leak: %ld", cnt_live);
}

/* ---- autograd semantics */
static void test_autograd(void)
{
    dl_ctx *ctx = new_ctx();
    float xv[3] = {1, 2, 3};
    dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), xv), true);
    dl_tensor *y, *z, *g[1];
    dl_backward_desc bd;

    /* y = sum(x^2): grad 2x; two backwards accumulate */
    y = dl_sum(dl_mul(x, x), DL_ALL, false);
    memset(&bd, 0, sizeof bd);
    bd.retain_graph = true;
    CHECK(dl_backward_ex(y, &bd) == DL_OK, "backward");
    CHECK(x->grad && at(x->grad, 2) == 6.0f, "grad 2x");
    CHECK(dl_backward(y) == DL_OK, "second backward with retained graph");
    CHECK(at(x->grad, 2) == 12.0f, "accumulation: %g", (double)at(x->grad, 2));
    CHECK(dl_backward(y) == DL_ERR_GRAPH, "third backward must fail");
    EXPECT_ERR(ctx, DL_ERR_GRAPH, "retain_graph");
    dl_zero_grad(x);
    CHECK(at(x->grad, 0) == 0.0f, "zero_grad");

    /* no_grad: nothing recorded, nestable */
    dl_no_grad_begin(ctx);
    dl_no_grad_begin(ctx);
    y = dl_mul(x, x);
    dl_no_grad_end(ctx);
    z = dl_mul(x, x);
    dl_no_grad_end(ctx);
    CHECK(!y->requires_grad && !z->requires_grad, "no_grad recorded");
    CHECK(dl_is_grad_enabled(ctx), "grad mode back on");
    CHECK(dl_mul(x, x)->requires_grad, "recording resumes");

    /* detach: shares data, no history */
    y = dl_detach(dl_mul(x, x));
    CHECK(y && !y->requires_grad && at(y, 1) == 4.0f, "detach");
    z = dl_sum(dl_mul(y, x), DL_ALL, false);
    dl_zero_grad(x);
    dl_backward(z);
    CHECK(at(x->grad, 1) == 4.0f, "detached factor is a constant: %g", (double)at(x->grad, 1));

    /* a leaf used twice, and a diamond graph: y = x*x + exp(x) */
    {
        dl_tensor *e = dl_exp(x);
        y = dl_sum(dl_add(dl_mul(x, e), e), DL_ALL, false);   /* d/dx = e + x e + e */
        dl_zero_grad(x);
        dl_backward(y);
        CHECK(fabsf(at(x->grad, 0) - 3.0f * expf(1.0f)) < 1e-5f, "diamond grad %g", (double)at(x->grad, 0));
    }

    /* dl_grad does not touch ->grad; higher order: d2/dx2 tanh */
    dl_zero_grad(x);
    memset(&bd, 0, sizeof bd);
    bd.create_graph = true;
    y = dl_sum(dl_tanh(x), DL_ALL, false);
    CHECK(dl_grad(y, 1, &x, g, &bd) == DL_OK && g[0], "grad with create_graph");
    CHECK(g[0]->requires_grad, "first derivative carries history");
    CHECK(dl_grad(dl_sum(g[0], DL_ALL, false), 1, &x, g, NULL) == DL_OK, "second grad");
    {
        int i;
        for (i = 0; i < 3; i++) {
            double t = tanh(xv[i]), want = -2.0 * t * (1.0 - t * t);
            CHECK(fabs(at(g[0], i) - want) < 1e-5, "d2 tanh at %d: %g vs %g", i, (double)at(g[0], i), want);
        }
    }
    CHECK(at(x->grad, 0) == 0.0f, "dl_grad must not touch ->grad");

    /* second derivatives through masks, as PyTorch (tests/golden/gen_masks.py):
       relu's first gradient carries history (zero derivative), clamp's none */
    memset(&bd, 0, sizeof bd);
    bd.create_graph = true;
    y = dl_sum(dl_mul(dl_relu(x), dl_relu(x)), DL_ALL, false);   /* d2 = 2 where x > 0 */
    CHECK(dl_grad(y, 1, &x, g, &bd) == DL_OK && g[0] && g[0]->requires_grad, "relu^2: first gradient");
    CHECK(dl_grad(dl_sum(g[0], DL_ALL, false), 1, &x, g, NULL) == DL_OK && g[0] && at(g[0], 1) == 2.0f,
          "relu^2: second derivative 2: %s", dl_error_message(ctx));
    y = dl_sum(dl_relu(x), DL_ALL, false);
    CHECK(dl_grad(y, 1, &x, g, &bd) == DL_OK && g[0] && g[0]->requires_grad, "relu: first gradient has history");
    CHECK(dl_grad(dl_sum(g[0], DL_ALL, false), 1, &x, g, NULL) == DL_OK && g[0] && at(g[0], 0) == 0.0f &&
              at(g[0], 2) == 0.0f, "relu: second derivative zeros: %s", dl_error_message(ctx));
    y = dl_sum(dl_clamp(x, 0.0f, 2.5f), DL_ALL, false);
    CHECK(dl_grad(y, 1, &x, g, &bd) == DL_OK && g[0] && !g[0]->requires_grad, "clamp: first gradient, no history");
    CHECK(dl_grad(dl_sum(g[0], DL_ALL, false), 1, &x, g, NULL) == DL_ERR_GRAPH, "clamp: second derivative refused");
    EXPECT_ERR(ctx, DL_ERR_GRAPH, "only through comparisons (a first gradient of clamp, max or maximum");

    /* gradient of a non-leaf target */
    {
        dl_tensor *h = dl_mul_scalar(x, 3.0f);
        y = dl_sum(dl_mul(h, h), DL_ALL, false);
        CHECK(dl_grad(y, 1, &h, g, NULL) == DL_OK && g[0] && at(g[0], 1) == 12.0f, "grad wrt non-leaf");
    }
    /* a seed gradient for a non-scalar output */
    {
        float sv[3] = {1, 0, 2};
        memset(&bd, 0, sizeof bd);
        dl_zero_grad(x);
        bd.grad = dl_from_array(ctx, DL_SHAPE(3), sv);
        CHECK(dl_backward_ex(dl_mul_scalar(x, 5.0f), &bd) == DL_OK, "seeded backward");
        CHECK(at(x->grad, 2) == 10.0f && at(x->grad, 1) == 0.0f, "seeded values");
    }
    /* requires_grad on a non-leaf is refused */
    CHECK(dl_requires_grad(dl_mul(x, x), false) == NULL, "non-leaf requires_grad");
    EXPECT_ERR(ctx, DL_ERR_GRAPH, "not a leaf");
    dl_ctx_free(ctx);
}

/* ---- persistent leaves, step leaves and create_graph */
static void test_leaf_kinds(void)
{
    dl_ctx *ctx = new_ctx();
    float v[2] = {0.5f, -1.0f};
    dl_tensor *p = dl_requires_grad(dl_keep(dl_from_array(ctx, DL_SHAPE(2), v)), true);
    dl_tensor *y = dl_sum(dl_mul(p, p), DL_ALL, false);
    dl_backward(y);
    CHECK(p->grad && p->grad->step_ == 0, "persistent leaf has a persistent grad");
    dl_step_end(ctx);
    CHECK(at(p->grad, 1) == -2.0f, "grad survives the step: %g", (double)at(p->grad, 1));
    y = dl_sum(dl_mul(p, p), DL_ALL, false);
    dl_backward(y);
    CHECK(at(p->grad, 1) == -4.0f, "accumulates across steps");
    dl_ctx_free(ctx);
    CHECK(cnt_live == 0, "leak: %ld", cnt_live);
}

/* ---- custom function: Sigmoid with a saved output */
static dl_tensor *sig_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    dl_tensor *y;
    (void)n; (void)user;
    y = dl_div(dl_ones_like(in[0]), dl_add_scalar(dl_exp(dl_neg(in[0])), 1.0f));
    dl_fn_save(fc, y);
    return y;
}
static dl_result sig_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    dl_tensor *y = dl_fn_saved(fc, 0);
    (void)user;
    if (dl_fn_needs_grad(fc, 0)) gin[0] = dl_mul(g, dl_mul(y, dl_rsub_scalar(y, 1.0f)));
    return DL_OK;
}
static const dl_function my_sigmoid = {"MySigmoid", sig_fwd, sig_bwd};
static dl_tensor *gc_custom(void *u, dl_tensor *const *in) { (void)u; return dl_function_apply(&my_sigmoid, 1, in, NULL); }

static void test_custom(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *x = dl_requires_grad(dl_randn(ctx, DL_SHAPE(4, 5)), true);
    dl_tensor *a = dl_function_apply(&my_sigmoid, 1, &x, NULL), *b = dl_sigmoid(x), *ga[1], *gb[1];
    dl_gradcheck_result r;
    long w = 0;
    CHECK(a && th_close(th_host(a), th_host(b), 20, 1e-6, 1e-7, &w), "custom sigmoid forward");
    dl_grad(dl_sum(dl_mul(a, a), DL_ALL, false), 1, &x, ga, NULL);
    dl_grad(dl_sum(dl_mul(b, b), DL_ALL, false), 1, &x, gb, NULL);
    CHECK(ga[0] && gb[0] && th_close(th_host(ga[0]), th_host(gb[0]), 20, 1e-5, 1e-7, &w),
          "custom sigmoid backward");
    CHECK(dl_gradcheck(ctx, gc_custom, NULL, 1, &x, NULL, &r) == DL_OK && r.ok, "custom gradcheck rel %g", r.max_rel_err[0]);
    dl_ctx_free(ctx);
}

/* A custom backward that calls dl_grad on another graph (torch's reentrant
   backward): the outer backward's pending gradients survive it (they were
   dropped: W's gradient lost its h*h term); a create_graph dl_grad inside
   dl_no_grad_begin keeps its history (torch's engine: grad mode =
   create_graph); integer outputs of a custom function do not require grad;
   a failed dl_grad leaves no stale pointers; gradcheck of no input refuses */
static dl_tensor *g_S, *g_V, *g_GV;
static dl_tensor *re_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *u)
{
    (void)fc; (void)n; (void)u;
    return dl_mul_scalar(in[0], 2.0f);
}
static dl_result re_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *u)
{
    dl_backward_desc bd;
    dl_result rc;
    (void)fc; (void)u;
    memset(&bd, 0, sizeof bd);
    bd.retain_graph = true;
    if ((rc = dl_grad(g_S, 1, &g_V, &g_GV, &bd)) != DL_OK) return rc;
    gin[0] = dl_mul_scalar(g, 2.0f);
    return DL_OK;
}
static const dl_function reentrant = {"reentrant", re_fwd, re_bwd};
static dl_tensor *argmax_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *u)
{
    (void)fc; (void)n; (void)u;
    return dl_argmax(in[0], 0, false);
}
static dl_result argmax_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *u)
{
    (void)fc; (void)u;
    gin[0] = dl_zeros_like(g);
    return DL_OK;
}
static const dl_function int_out = {"int_out", argmax_fwd, argmax_bwd};
static dl_tensor *gc_none(void *user, dl_tensor *const *in) { (void)user; return dl_sum(in[0], DL_ALL, false); }

static void test_reentrant(void)
{
    dl_ctx *ctx = new_ctx();
    float wv[3] = {1, 2, 3}, xv[3] = {4, 5, 6}, got[3];
    dl_tensor *W = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), wv), true), *x = dl_from_array(ctx, DL_SHAPE(3), xv);
    dl_tensor *h = dl_mul(W, x), *c, *loss, *g = NULL, *grads[2] = {W, W}, *ins[2];
    dl_backward_desc bd;
    dl_gradcheck_result gr;
    g_V = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), wv), true);
    g_S = dl_sum(dl_mul(g_V, g_V), DL_ALL, false);
    c = dl_function_apply(&reentrant, 1, &h, NULL);
    loss = dl_add(dl_sum(c, DL_ALL, false), dl_sum(dl_mul(h, h), DL_ALL, false));
    CHECK(dl_backward(loss) == DL_OK && W->grad && dl_read(W->grad, got, 3) == DL_OK, "outer backward: %s",
          dl_error_message(ctx));
    CHECK(got[0] == 40 && got[1] == 110 && got[2] == 228, "W.grad = 2x + 2 (Wx) x = 40 110 228 (torch's): %g %g %g",
          (double)got[0], (double)got[1], (double)got[2]);
    CHECK(g_GV && dl_read(g_GV, got, 3) == DL_OK && got[0] == 2 && got[2] == 6, "the inner dl_grad: 2V");
    dl_step_end(ctx);

    /* create_graph inside no_grad: x.grad of sum(x^2) + sum(g^2), g = 3x^2 -> 2x + 36x^3 */
    x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), wv), true);
    memset(&bd, 0, sizeof bd);
    bd.create_graph = true;
    c = dl_sum(dl_mul(dl_mul(x, x), x), DL_ALL, false);
    dl_no_grad_begin(ctx);   /* (an evaluation block around the penalty's gradient) */
    CHECK(dl_grad(c, 1, &x, &g, &bd) == DL_OK && g &&
          g->requires_grad, "create_graph under no_grad: the gradient carries history");
    CHECK(!dl_is_grad_enabled(ctx), "no_grad again after it");
    dl_no_grad_end(ctx);
    loss = dl_add(dl_sum(dl_mul(x, x), DL_ALL, false), dl_sum(dl_mul(g, g), DL_ALL, false));
    CHECK(dl_backward(loss) == DL_OK && dl_read(x->grad, got, 3) == DL_OK && got[0] == 38 && got[1] == 292 &&
          got[2] == 978, "x.grad 38 292 978 (torch's): %g %g %g", (double)got[0], (double)got[1], (double)got[2]);
    dl_step_end(ctx);

    /* requires_grad decided at the forward, as torch: switched on after it, no
       gradient; switched off before the backward, none either */
    {
        dl_tensor *a = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), wv), true);
        dl_tensor *b = dl_from_array(ctx, DL_SHAPE(3), xv), *y = dl_sum(dl_mul(a, b), DL_ALL, false);
        dl_requires_grad(b, true);
        CHECK(dl_backward(y) == DL_OK && dl_has_grad(a) && !dl_has_grad(b), "b switched on after the forward: no grad");
        y = dl_sum(dl_mul(a, b), DL_ALL, false);
        dl_requires_grad(a, false);
        CHECK(dl_backward(y) == DL_OK && dl_has_grad(b) && dl_read(a->grad, got, 3) == DL_OK && got[0] == 4,
              "a switched off before the backward: its gradient unchanged (4 5 6), b's made");
    }
    /* a leaf's gradients are summed, then added into ->grad once the last has
       come (torch's AccumulateGrad): a seed that is that ->grad, an op that
       reads it, a backward that fails midway (torch's values) */
    {
        dl_tensor *a = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), wv), true), *G, *y;
        dl_backward_desc sd;
        CHECK(dl_backward(dl_sum(a, DL_ALL, false)) == DL_OK, "a.grad = 1");
        memset(&sd, 0, sizeof sd);
        sd.grad = a->grad;
        CHECK(dl_backward_ex(dl_add(a, dl_mul_scalar(a, 3.0f)), &sd) == DL_OK && dl_read(a->grad, got, 3) == DL_OK &&
              got[0] == 5 && got[2] == 5, "seed = a.grad (1): a.grad 1 + 1 + 3 = 5, torch's (%g)", (double)got[0]);
        G = a->grad;   /* 5 5 5, read by the graph: x*G + x*x*G */
        y = dl_add(dl_sum(dl_mul(a, G), DL_ALL, false), dl_sum(dl_mul(dl_mul(a, a), G), DL_ALL, false));
        CHECK(dl_backward(y) == DL_OK && dl_read(a->grad, got, 3) == DL_OK && got[0] == 5 + 5 + 2 * 1 * 5 &&
              got[2] == 5 + 5 + 2 * 3 * 5, "a graph reading a.grad: 20 .. 40 (%g %g)", (double)got[0], (double)got[2]);
        y = dl_mul(a, a);
        CHECK(dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && dl_read(a->grad, got, 3) == DL_OK, "y's graph freed");
        CHECK(dl_backward(dl_sum(dl_add(y, dl_mul_scalar(a, 10.0f)), DL_ALL, false)) == DL_ERR_GRAPH,
              "a backward through the freed graph fails");
        dl_clear_error(ctx);
        CHECK(dl_read(a->grad, wv, 3) == DL_OK && memcmp(got, wv, sizeof got) == 0,
              "and adds nothing: the other path's 10 is not left in a.grad (%g, was %g)", (double)wv[0], (double)got[0]);
        wv[0] = 1; wv[1] = 2; wv[2] = 3;
    }
    /* an int64 output of a custom function: not differentiable */
    x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), xv), true);
    c = dl_function_apply(&int_out, 1, &x, NULL);
    CHECK(c && c->dtype == DL_DTYPE_I64 && !c->requires_grad, "a custom function's int64 output needs no grad");
    CHECK(dl_backward(c) == DL_ERR_GRAPH, "and a backward from it is refused");
    dl_clear_error(ctx);

    /* dl_grad's errors leave every grads[i] NULL; another context is named */
    ins[0] = x;
    ins[1] = dl_from_array(ctx, DL_SHAPE(3), wv);   /* requires no grad */
    CHECK(dl_grad(dl_sum(x, DL_ALL, false), 2, ins, grads, NULL) == DL_ERR_GRAPH && !grads[0] && !grads[1],
          "a failed dl_grad: grads NULL");
    dl_clear_error(ctx);
    grads[0] = x;
    CHECK(dl_grad(NULL, 1, ins, grads, NULL) == DL_ERR_ARG && !grads[0], "dl_grad of a NULL out (an op failed): grads NULL");
    {
        dl_ctx *o = new_ctx();
        dl_tensor *xo = dl_requires_grad(dl_from_array(o, DL_SHAPE(3), wv), true);
        CHECK(dl_grad(dl_sum(x, DL_ALL, false), 1, &xo, grads, NULL) == DL_ERR_ARG && !grads[0],
              "dl_grad of an input from another context refused");
        CHECK(strstr(dl_error_message(ctx), "dl_grad: input 0 (3) belongs to another context than out ()") != NULL,
              "message: %s", dl_error_message(ctx));
        dl_clear_error(ctx);
        dl_ctx_free(o);
    }
    /* gradcheck with no input that requires grad would check nothing */
    ins[0] = dl_from_array(ctx, DL_SHAPE(3), wv);
    CHECK(dl_gradcheck(ctx, gc_none, NULL, 1, ins, NULL, &gr) == DL_ERR_ARG &&
          strstr(dl_error_message(ctx), "dl_gradcheck: none of the 1 inputs requires grad") != NULL,
          "gradcheck of nothing refused: %s", dl_error_message(ctx));
    dl_clear_error(ctx);
    dl_ctx_free(ctx);
}

/* ---- graph picture */
static void test_dot(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *w = dl_set_name(dl_requires_grad(dl_randn(ctx, DL_SHAPE(3, 2)), true), "w");
    dl_tensor *x = dl_set_name(dl_randn(ctx, DL_SHAPE(4, 3)), "x");
    dl_tensor *loss = dl_mean(dl_sigmoid(dl_matmul(x, w)), DL_ALL, false);
    char buf[4096];
    size_t n;
    FILE *f;
    CHECK(dl_graph_dot(loss, "build/test_graph.dot") == DL_OK, "dot written");
    f = fopen("build/test_graph.dot", "r");
    n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
    CHECK(strstr(buf, "digraph") && strstr(buf, "dl_matmul") && strstr(buf, "dl_sigmoid"), "dot has ops");
    CHECK(strstr(buf, "requires_grad") && strstr(buf, "(3,2)") && strstr(buf, "label=\"w"), "dot has leaves");
    CHECK(dl_graph_dot(loss, "/nonexistent/dir/x.dot") == DL_ERR_IO, "dot bad path");
    EXPECT_ERR(ctx, DL_ERR_IO, "directory of /nonexistent/dir/x.dot (No such file or directory)");
    dl_ctx_free(ctx);
}

/* ---- anomaly mode */
static void test_anomaly(void)
{
    dl_ctx *ctx = new_ctx();
    float v[2] = {1.0f, 0.0f};
    dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), v), true), *y;
    y = dl_log(x);
    CHECK(y != NULL, "without anomaly mode -inf passes");
    dl_set_anomaly(ctx, true);
    y = dl_log(x);
    CHECK(y == NULL, "anomaly mode catches log(0)");
    EXPECT_ERR(ctx, DL_ERR_NAN, "dl_log produced Inf at element 1");
    y = dl_sum(dl_sqrt(x), DL_ALL, false);
    CHECK(y != NULL, "sqrt(0) forward is fine");
    CHECK(dl_backward(y) == DL_ERR_NAN, "backward Inf caught");
    EXPECT_ERR(ctx, DL_ERR_NAN, "in the backward of dl_sqrt");
    dl_ctx_free(ctx);
}

/* ---- results do not depend on the thread count */
static void test_threads(void)
{
    dl_ctx *c1, *c2;
    dl_ctx_desc d;
    dl_tensor *r1, *r2;
    memset(&d, 0, sizeof d);
    d.seed = 7; d.num_threads = 1;
    c1 = dl_ctx_init(&d);
    d.num_threads = 0;
    c2 = dl_ctx_init(&d);
    /* three threads even on fewer cores (dl_ctx_init clamps to the cores):
       an odd split must give the same bits too */
    dl__pool_destroy(c2->pool);
    c2->pool = dl__pool_create(3);
#ifdef DL_NO_THREADS
    CHECK(dl_num_threads(c1) == 1 && dl_num_threads(c2) == 1, "DL_NO_THREADS: thread counts %d %d, want 1 1",
          dl_num_threads(c1), dl_num_threads(c2));
#else
    CHECK(dl_num_threads(c1) == 1 && dl_num_threads(c2) == 3, "thread counts %d %d", dl_num_threads(c1), dl_num_threads(c2));
#endif
    r1 = dl_softmax(dl_matmul(dl_randn(c1, DL_SHAPE(300, 200)), dl_randn(c1, DL_SHAPE(200, 150))), 1);
    r2 = dl_softmax(dl_matmul(dl_randn(c2, DL_SHAPE(300, 200)), dl_randn(c2, DL_SHAPE(200, 150))), 1);
    CHECK(r1 && r2 && r1->numel == 300 * 150 && th_same_bytes(r1, r2), "bitwise equal across thread counts");
    r1 = dl_sum(dl_randn(c1, DL_SHAPE(64, 1000)), DL_DIMS(0), false);
    r2 = dl_sum(dl_randn(c2, DL_SHAPE(64, 1000)), DL_DIMS(0), false);
    CHECK(r1 && r2 && r1->numel == 1000 && th_same_bytes(r1, r2), "sum equal across thread counts");
    dl_ctx_free(c1);
    dl_ctx_free(c2);
    CHECK(cnt_live == 0, "leak: %ld", cnt_live);
}

/* ---- seeded RNG */
static void test_rng(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *a, *b, *u;
    double m = 0, v = 0;
    long i;
    dl_manual_seed(ctx, 5);
    a = dl_randn(ctx, DL_SHAPE(10000));
    dl_manual_seed(ctx, 5);
    b = dl_randn(ctx, DL_SHAPE(10000));
    CHECK(th_same_bytes(a, b), "same seed, same numbers");
    for (i = 0; i < 10000; i++) m += at(a, i);
    m /= 10000;
    for (i = 0; i < 10000; i++) v += (at(a, i) - m) * (at(a, i) - m);
    v /= 10000;
    CHECK(fabs(m) < 0.05 && fabs(v - 1) < 0.05, "randn mean %g var %g", m, v);
    u = dl_rand(ctx, DL_SHAPE(10000));
    {
        int inside = 1;
        for (i = 0, m = 0; i < 10000; i++) { m += at(u, i); if (!(at(u, i) >= 0 && at(u, i) < 1)) inside = 0; }
        CHECK(inside, "rand outside [0,1)");
    }
    CHECK(fabs(m / 10000 - 0.5) < 0.02, "rand mean %g", m / 10000);
    /* the state (torch.get_rng_state / set_rng_state): the same draws again,
       a dropout mask too; refused inside a capture and with NULL */
    {
        uint64_t st[2] = {0, 0}, st2[2] = {0, 0};
        dl_tensor *x = dl_ones(ctx, DL_SHAPE(64)), *d1, *d2;
        dl_capture *cap;
        dl_get_rng_state(ctx, st);
        a = dl_rand(ctx, DL_SHAPE(7));
        d1 = dl_dropout(x, 0.5f, true);
        dl_manual_seed(ctx, 99);
        dl_rand(ctx, DL_SHAPE(3));
        CHECK(dl_set_rng_state(ctx, st) == DL_OK, "dl_set_rng_state");
        b = dl_rand(ctx, DL_SHAPE(7));
        d2 = dl_dropout(x, 0.5f, true);
        CHECK(th_same_bytes(a, b) && th_same_bytes(d1, d2), "the state set back: the same numbers, the same mask");
        dl_get_rng_state(ctx, st2);
        CHECK(st2[0] == st[0] && st2[1] == st[1] + 7 + 64, "the counter moved by the draws (%llu -> %llu)",
              (unsigned long long)st[1], (unsigned long long)st2[1]);
        CHECK(dl_set_rng_state(ctx, NULL) == DL_ERR_ARG, "dl_set_rng_state(NULL)");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_set_rng_state: state is NULL");
        cap = dl_capture_begin(ctx);
        CHECK(cap && dl_set_rng_state(ctx, st) == DL_ERR_UNSUPPORTED, "dl_set_rng_state inside a capture");
        EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "dl_set_rng_state: setting the generator inside a capture");
        CHECK(dl_capture_end(cap) == DL_ERR_UNSUPPORTED, "the capture fails");
        dl_capture_free(cap);
        dl_get_rng_state(ctx, st);
        CHECK(st[0] == st2[0] && st[1] == st2[1], "a refused set leaves the state");
        dl_clear_error(ctx);
    }
    dl_ctx_free(ctx);
}

/* ---- the ready hook (dl_ddp's overlap): backward calls it once per leaf,
   after the leaf's last gradient, even when the leaf is used several times
   at different depths; leaves outside the graph and failed hooks */
typedef struct hook_log { int n; dl_tensor *who[8]; float grad0[8]; int fail_at; } hook_log;

static dl_result record_ready(void *user, dl_tensor *leaf)
{
    hook_log *h = (hook_log *)user;
    if (h->n < 8) {
        h->who[h->n] = leaf;
        h->grad0[h->n] = th_f(leaf->grad, 0);
    }
    h->n++;
    return h->n == h->fail_at ? DL_ERR_ARG : DL_OK;
}

static void test_ready_hook(void)
{
    dl_ctx *ctx = new_ctx();
    float av[2] = {1, 2}, bv[2] = {3, 4};
    dl_tensor *a = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), av), true);
    dl_tensor *b = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), bv), true);
    dl_tensor *unused = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), bv), true);
    dl_tensor *h1, *y;
    hook_log log;
    int i, na = 0, nb = 0;
    memset(&log, 0, sizeof log);
    /* a is used at the top (a * h1) and deep inside h1 = (a*b + a) * b: three uses */
    h1 = dl_mul(dl_add(dl_mul(a, b), a), b);
    y = dl_sum(dl_mul(a, h1), DL_ALL, false);
    (void)unused;
    ctx->ready_fn = record_ready;
    ctx->ready_user = &log;
    CHECK(dl_backward(y) == DL_OK, "backward with a ready hook: %s", dl_error_message(ctx));
    ctx->ready_fn = NULL;
    for (i = 0; i < log.n && i < 8; i++) {
        if (log.who[i] == a) {
            na++;
            /* y = sum(a^2 b^2 + a^2 b): dy/da0 = 2 a0 b0^2 + 2 a0 b0 = 24, complete when the hook runs */
            CHECK(log.grad0[i] == 24.0f, "the hook saw a's gradient %g, want the complete 24", (double)log.grad0[i]);
        }
        if (log.who[i] == b) nb++;
        CHECK(log.who[i] != unused, "the hook fired for a leaf outside the graph");
    }
    CHECK(log.n == 2 && na == 1 && nb == 1, "the hook fired %d times (a %d, b %d), want once for each leaf", log.n,
          na, nb);
    CHECK(th_f(a->grad, 0) == 24.0f, "a's gradient after backward: %g", (double)th_f(a->grad, 0));
    /* a hook that fails stops backward with its result */
    dl_zero_grad(a);
    dl_zero_grad(b);
    memset(&log, 0, sizeof log);
    log.fail_at = 1;
    y = dl_sum(dl_mul(a, dl_mul(a, b)), DL_ALL, false);
    ctx->ready_fn = record_ready;
    ctx->ready_user = &log;
    CHECK(dl_backward(y) == DL_ERR_ARG, "a failing hook stops backward with its result");
    ctx->ready_fn = NULL;
    dl_clear_error(ctx);
    /* without a hook, a later backward is unaffected */
    dl_zero_grad(a);
    y = dl_sum(dl_mul(a, a), DL_ALL, false);
    CHECK(dl_backward(y) == DL_OK && th_f(a->grad, 1) == 4.0f, "backward after the hook is cleared");
    dl_ctx_free(ctx);
}

/* ---- the DL_MAX_DIMS builds (test-all: 4 and 16): DL_SHAPE counts every
   argument (up to 8 it did: a 10-argument shape became ndim 2), and the
   layers past the limit refuse with it named */
static void test_max_dims(void)
{
    dl_ctx *ctx = new_ctx();
#if DL_MAX_DIMS >= 10
    dl_shape s = DL_SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 2, 3);
    dl_tensor *t = dl_zeros(ctx, DL_SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 2, 3));
    CHECK(s.ndim == 10 && s.d[9] == 3, "DL_SHAPE of 10: ndim %d", s.ndim);
    CHECK(t && t->ndim == 10 && t->numel == 6, "dl_zeros of 10 dims");
    CHECK(DL_DIMS(0, 1, 2, 3, 4, 5, 6, 7, 8).ndim == 9, "DL_DIMS of 9");
#endif
#if DL_MAX_DIMS < 5
    {
        dl_pool_desc pd = dl_pool_desc_make(2, 2, 0, false, true);
        dl_tensor *x = dl_zeros(ctx, DL_SHAPE(2, 3, 4, 4));
        CHECK(dl_max_pool3d(x, &pd) == NULL && dl_last_error(ctx) == DL_ERR_SHAPE &&
              strstr(dl_error_message(ctx), "dl_max_pool3d") && strstr(dl_error_message(ctx), "DL_MAX_DIMS=4"),
              "a 3-d pool in a DL_MAX_DIMS=4 build: %s", dl_error_message(ctx));
        dl_clear_error(ctx);
    }
#endif
    CHECK(dl_zeros(ctx, DL_SHAPE(2, 3, 4, 5)) != NULL, "4 dims in every build");
    dl_ctx_free(ctx);
}

/* DL_SHAPE() is torch.Size([]) and DL_DIMS() dim=(); DL_SHAPE(0) one dim
   of size 0 (the empty-argument test of the macros, in C and C++) */
#define SHAPE_N 5
#define SHAPE_F(x) (x)
static void test_shape_macros(void)
{
    dl_ctx *ctx = new_ctx();
    int64_t n = 7;
    float v[6] = {1, 2, 3, 4, 5, 6};
    dl_shape e = DL_SHAPE(), sp = DL_SHAPE( ), cm = DL_SHAPE(/* none */), z = DL_SHAPE(0), c = DL_SHAPE((int64_t)n),
             m = DL_SHAPE(SHAPE_N, SHAPE_F(2), 1 << 2, n > 3 ? 2 : 1), dd = DL_DIMS();
    dl_tensor *t = dl_zeros(ctx, DL_SHAPE()), *x = dl_from_array(ctx, DL_SHAPE(2, 3), v), *s, *p;
    CHECK(e.ndim == 0 && sp.ndim == 0 && cm.ndim == 0 && dd.ndim == 0, "DL_SHAPE(), DL_DIMS(): ndim %d %d %d %d",
          e.ndim, sp.ndim, cm.ndim, dd.ndim);
    CHECK(z.ndim == 1 && z.d[0] == 0 && c.ndim == 1 && c.d[0] == 7, "DL_SHAPE(0), DL_SHAPE((int64_t)n)");
    CHECK(m.ndim == 4 && m.d[0] == 5 && m.d[1] == 2 && m.d[2] == 4 && m.d[3] == 2, "DL_SHAPE of macros, <<, ?:");
    CHECK(t && t->ndim == 0 && t->numel == 1 && dl_item(t) == 0.0f, "dl_zeros(DL_SHAPE()): a 0-d tensor");
    p = dl_reshape(x, DL_SHAPE(6));
    p = p ? dl_reshape(dl_narrow(p, 0, 4, 1), DL_SHAPE()) : NULL;
    CHECK(p && p->ndim == 0 && dl_item(p) == 5.0f, "reshape to DL_SHAPE(): 0-d");
    s = dl_sum(x, DL_DIMS(), false);
    CHECK(s && s->ndim == 0 && dl_item(s) == 21.0f, "dl_sum(x, DL_DIMS()): every dim, as x.sum(dim=())");
    CHECK(dl_permute(t, DL_DIMS()) && dl_permute(t, DL_DIMS())->ndim == 0, "permute of a 0-d tensor by DL_DIMS()");
    dl_ctx_free(ctx);
}

/* dl_print: shape, dtype, values; a NaN of either sign as "nan" (torch's
   print), not libc's "-nan" */
static void test_print(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL);
    float v[4] = {1.5f, -NAN, NAN, -2.0f};
    char out[256] = {0};
    FILE *f = tmpfile();
    int fd, saved;
    size_t n;
    CHECK(ctx && f, "context and a temporary file");
    if (!ctx || !f) { dl_ctx_free(ctx); if (f) fclose(f); return; }
    fflush(stdout);
    saved = dup(1);
    fd = fileno(f);
    dup2(fd, 1);
    dl_print(dl_from_array(ctx, DL_SHAPE(2, 2), v));
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(f);
    n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    CHECK(strcmp(out, "tensor(2,2) float32 [1.5, nan, nan, -2]\n") == 0, "dl_print: %s", out);
    fclose(f);
    dl_ctx_free(ctx);
}

/* split's one node: two losses through two pieces, each backward once
   (the first retained), then the first again: torch's SplitBackward keeps
   nothing, so the shared node is not freed (x.grad 4 8 3 3, torch's); a
   huge split size is one piece */
static void test_split_node(void)
{
    dl_ctx *ctx = new_ctx();
    float xv[4] = {1, 2, 3, 4}, g[4];
    dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(4), xv), true), *p[2], *l1, *l2;
    dl_backward_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.retain_graph = true;
    CHECK(dl_chunk(x, 2, 0, p) == 2, "chunk: %s", dl_error_message(ctx));
    l1 = dl_sum(dl_mul(p[0], p[0]), DL_ALL, false);
    l2 = dl_sum(dl_mul_scalar(p[1], 3.0f), DL_ALL, false);
    CHECK(dl_backward_ex(l1, &bd) == DL_OK && dl_backward(l2) == DL_OK && dl_backward(l1) == DL_OK,
          "three backwards through one split: %s", dl_error_message(ctx));
    CHECK(dl_read(x->grad, g, 4) == DL_OK && g[0] == 4 && g[1] == 8 && g[2] == 3 && g[3] == 3,
          "x.grad %g %g %g %g, want 4 8 3 3", (double)g[0], (double)g[1], (double)g[2], (double)g[3]);
    CHECK(dl_backward(l1) == DL_ERR_GRAPH, "l1's own graph was freed by its last backward");
    dl_clear_error(ctx);
    CHECK(dl_split(x, INT64_MAX, 0, 1, p) == 1 && p[0]->numel == 4 && dl_last_error(ctx) == DL_OK,
          "a huge size: one piece: %s", dl_error_message(ctx));
    CHECK(dl_split(x, INT64_MAX - 2, 0, 1, p) == 1 && p[0]->numel == 4, "INT64_MAX - 2: one piece");
    dl_ctx_free(ctx);
}

/* a sum's backward gives the sum's gradient unexpanded (a broadcast
   gradient) to the ops that take one and to the leaves' sums: each leaf's
   gradient has the bits of dl_grad's (which expands it), made new, into a
   gradient zero_grad left none, and summed into one */
static dl_tensor *bg_loss(int k, dl_tensor *x, dl_tensor *w)
{
    switch (k) {
    case 0: return dl_sum(dl_mul(x, w), DL_ALL, false);
    case 1: return dl_sum(dl_add(dl_relu(x), w), DL_ALL, false);
    case 2: return dl_add(dl_sum(dl_sub(x, w), DL_ALL, false), dl_sum(dl_exp(x), DL_ALL, false));
    case 3: return dl_sum(dl_sum(dl_mul(dl_sigmoid(x), dl_tanh(w)), DL_DIMS(0), false), DL_ALL, false);
    case 4: return dl_mean(dl_mul(dl_clamp(dl_neg(x), -0.5f, 0.5f), dl_sum(w, DL_DIMS(1), true)), DL_ALL, false);
    default: return dl_sum(dl_div(dl_mul_scalar(x, 3.0f), w), DL_ALL, false);
    }
}
static void test_bcast_grad(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *x = dl_keep(dl_randn(ctx, DL_SHAPE(3, 4))), *w = dl_keep(dl_randn(ctx, DL_SHAPE(3, 4)));
    dl_tensor *in[2], *g[2];
    float want[2][12], got[12];
    int k, i, r;
    dl_optim *o;
    dl_requires_grad(x, true);
    dl_requires_grad(w, true);
    in[0] = x;
    in[1] = w;
    o = dl_sgd_params(ctx, 2, in, NULL);
    for (k = 0; k < 6; k++) {
        CHECK(dl_grad(bg_loss(k, x, w), 2, in, g, NULL) == DL_OK, "loss %d: dl_grad: %s", k, dl_error_message(ctx));
        for (i = 0; i < 2; i++) dl_read(g[i], want[i], 12);
        for (r = 0; r < 3; r++) {   /* new (or none), none, summed into */
            if (r == 1) dl_optim_zero_grad(o);
            CHECK(dl_backward(bg_loss(k, x, w)) == DL_OK, "loss %d: %s", k, dl_error_message(ctx));
            for (i = 0; i < 2; i++) {
                int j, same = 1;
                CHECK(in[i]->grad && dl_read(in[i]->grad, got, 12) == DL_OK, "loss %d: a grad", k);
                for (j = 0; j < 12; j++) {
                    float e = 0.0f + want[i][j];   /* (a leaf's sum: -0 comes out +0) */
                    if (r == 2) e += want[i][j];
                    if (memcmp(&e, &got[j], 4)) same = 0;
                }
                CHECK(same, "loss %d, input %d, backward %d: dl_grad's bits", k, i, r);
            }
        }
        dl_optim_zero_grad(o);
        dl_step_end(ctx);
    }
    dl_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    test_memory(quick ? 50 : 10000);
    test_steps();
    test_autograd();
    test_split_node();
    test_bcast_grad();
    test_leaf_kinds();
    test_custom();
    test_reentrant();
    test_dot();
    test_print();
    test_anomaly();
    test_threads();
    test_rng();
    test_ready_hook();
    test_max_dims();
    test_shape_macros();
    CHECK(cnt_live == 0, "%ld blocks live at exit", cnt_live);
    TEST_END();
}
