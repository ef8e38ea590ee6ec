/* tests/test_inplace.c - tensors changed in place between the forward and
   the backward that needs them. Every in-place write through the API
   (dl_write, dl_fill_, dl_copy_, an optimizer step, dl_load ...) bumps the
   version of the tensor's storage (views share it); a backward that reads a
   tensor whose version moved since its op was recorded fails with
   PyTorch's message instead of giving a gradient computed from the new
   values (before the fix: sum(w*x), dl_write(w), backward gave x.grad = the
   new w). Also checked: what a backward does not read may change (PyTorch
   agrees), and training loops, gradient accumulation, retain_graph and
   create_graph run as before. */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>
#include <unistd.h>

static dl_ctx *new_ctx(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.num_threads = 1;
    return dl_ctx_init(&d);
}

static const float XV[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static const float WV[12] = {.5f, -1, 2, .25f, 3, -2, 1, 1.5f, -.5f, 2, 0, 4};

/* PyTorch's message, with our tensor description: "[float32 (3,4), cpu:0]" */
static void expect_modified(dl_ctx *ctx, dl_tensor *t, const char *name, int now, int want, const char *op,
                            const char *what)
{
    char m[512];
    snprintf(m, sizeof m, "in the backward of %s: dl_backward: one of the variables needed for gradient "
             "computation has been modified by an inplace operation: [float32 %s%s%s%s, %s] is at version "
             "%d; expected version %d instead (%s of the op;", op, "(3,4)", name ? " '" : "",
             name ? name : "", name ? "'" : "", dl_device_name(t->device), now, want, what);
    EXPECT_ERR(ctx, DL_ERR_GRAPH, m);
}

/* sum(w * x) with both leaves requiring grad: dmul reads w for x's gradient
   and x for w's */
static dl_tensor *wx(dl_tensor *w, dl_tensor *x) { return dl_sum(dl_mul(w, x), DL_ALL, false); }

/* 1. the case and each public in-place write */
static void test_writes_refused(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *w = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), WV), true);
    dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), XV), true);
    dl_tensor *src = dl_full(ctx, DL_SHAPE(4), 7.0f), *loss;
    float nv[12];
    int k;
    for (k = 0; k < 12; k++) nv[k] = 100.0f + (float)k;
    /* dl_write under no_grad, then backward: refused, and no gradient lands */
    loss = wx(w, x);
    dl_no_grad_begin(ctx);
    CHECK(dl_write(w, nv, 12) == DL_OK, "dl_write under no_grad");
    dl_no_grad_end(ctx);
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after dl_write(w) refused");
    expect_modified(ctx, w, NULL, 1, 0, "dl_mul", "input 0");
    CHECK(x->grad == NULL && w->grad == NULL, "no gradient was accumulated");
    /* dl_fill_ and dl_copy_ (src broadcast), twice: the version counts both */
    loss = wx(w, x);
    dl_no_grad_begin(ctx);
    CHECK(dl_fill_(x, 2.0f) == DL_OK && dl_copy_(x, src) == DL_OK, "fill_ and copy_");
    dl_no_grad_end(ctx);
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after dl_fill_ + dl_copy_(x) refused");
    expect_modified(ctx, x, NULL, 2, 0, "dl_mul", "input 1");
    /* dl_copy_ into w, named */
    dl_set_name(w, "w");
    loss = wx(w, x);
    dl_no_grad_begin(ctx);
    CHECK(dl_copy_(w, src) == DL_OK, "copy_");
    dl_no_grad_end(ctx);
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after dl_copy_(w) refused");
    expect_modified(ctx, w, "w", 2, 1, "dl_mul", "input 0");
    /* a recorded graph whose inputs were not touched still runs */
    loss = wx(w, x);
    CHECK(dl_backward(loss) == DL_OK && x->grad && w->grad, "untouched graph: %s", dl_error_message(ctx));
    CHECK(th_f(x->grad, 0) == 7.0f && th_f(w->grad, 5) == 7.0f, "grads from the current values");
    dl_ctx_free(ctx);
}

/* 2. through views: a write into a view (dl_detach, dl_reshape share the
   storage) moves the base's version, and an op's output too */
static void test_views(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *w = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), WV), true);
    dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), XV), true);
    dl_tensor *loss, *y, *d;
    /* a write into a detached view of w (allowed with grad mode on: the
       view has no history) */
    loss = wx(w, x);
    d = dl_reshape(dl_detach(w), DL_SHAPE(12));
    CHECK(d && dl_fill_(d, 0.0f) == DL_OK, "write into a detached view: %s", dl_error_message(ctx));
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after a write through a view refused");
    expect_modified(ctx, w, NULL, 1, 0, "dl_mul", "input 0");
    /* the output of sigmoid (its backward reads y) changed through a detached view */
    y = dl_sigmoid(x);
    loss = dl_sum(y, DL_ALL, false);
    CHECK(dl_fill_(dl_detach(y), 0.5f) == DL_OK, "write into the detached output");
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after sigmoid's output changed refused");
    expect_modified(ctx, y, NULL, 1, 0, "dl_sigmoid", "the output");
    /* a view recorded in the graph reads its base's version */
    loss = dl_sum(dl_mul(dl_reshape(w, DL_SHAPE(12)), dl_reshape(x, DL_SHAPE(12))), DL_ALL, false);
    dl_no_grad_begin(ctx);
    dl_write(x, XV, 12);
    dl_no_grad_end(ctx);
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward through views after their base changed refused");
    EXPECT_ERR(ctx, DL_ERR_GRAPH, "[float32 (12), ");
    dl_ctx_free(ctx);
}

/* 3. what the backward does not read may change (PyTorch agrees): add
   reads neither input; w * x with only w needing a gradient reads x, not w */
static void test_unread_may_change(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *w = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), WV), true);
    dl_tensor *x = dl_from_array(ctx, DL_SHAPE(3, 4), XV);
    dl_tensor *b = dl_requires_grad(dl_zeros(ctx, DL_SHAPE(4)), true), *loss;
    loss = dl_sum(dl_add(dl_mul(w, x), b), DL_ALL, false);
    dl_no_grad_begin(ctx);
    dl_fill_(w, 9.0f);
    dl_fill_(b, 9.0f);
    dl_no_grad_end(ctx);
    CHECK(dl_backward(loss) == DL_OK, "unread inputs changed: backward runs: %s", dl_error_message(ctx));
    CHECK(w->grad && th_f(w->grad, 11) == 12.0f && b->grad && th_f(b->grad, 0) == 3.0f, "their gradients");
    /* x, which mul's backward reads for w's gradient, may not */
    loss = dl_sum(dl_mul(w, x), DL_ALL, false);
    dl_fill_(x, 1.0f);
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "x changed: refused");
    expect_modified(ctx, x, NULL, 1, 0, "dl_mul", "input 1");
    dl_ctx_free(ctx);
}

/* 4. an optimizer step, dl_load and dl_load_module between forward and backward */
static void test_optim_and_load(void)
{
    dl_ctx *ctx = new_ctx();
    dl_module *m = dl_nn_linear(ctx, 4, 3, true);
    dl_optim *o = dl_sgd(m, NULL);
    dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), XV), true), *loss, *wt;
    char path[256];
    snprintf(path, sizeof path, "build/test_inplace_%ld.safetensors", (long)getpid());
    wt = dl_module_get(m, "weight");
    /* forward, step (grads of an earlier backward), backward: refused */
    CHECK(dl_backward(dl_sum(dl_module_forward(m, x), DL_ALL, false)) == DL_OK, "first backward");
    loss = dl_sum(dl_module_forward(m, x), DL_ALL, false);
    CHECK(dl_optim_step(o) == DL_OK, "step");
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after an optimizer step refused");
    EXPECT_ERR(ctx, DL_ERR_GRAPH, "in the backward of dl_matmul: dl_backward: one of the variables needed");
    /* the ordinary order: step after backward */
    dl_optim_zero_grad(o);
    CHECK(dl_backward(dl_sum(dl_module_forward(m, x), DL_ALL, false)) == DL_OK && dl_optim_step(o) == DL_OK,
          "zero_grad, forward, backward, step: %s", dl_error_message(ctx));
    /* dl_load and dl_load_module */
    CHECK(dl_save(path, m, o) == DL_OK, "save: %s", dl_error_message(ctx));
    loss = dl_sum(dl_module_forward(m, x), DL_ALL, false);
    CHECK(dl_load(path, m, o) == DL_OK, "load: %s", dl_error_message(ctx));
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after dl_load refused");
    EXPECT_ERR(ctx, DL_ERR_GRAPH, "is at version");
    loss = dl_sum(dl_module_forward(m, x), DL_ALL, false);
    CHECK(dl_load_module(path, m) == DL_OK, "load_module: %s", dl_error_message(ctx));
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after dl_load_module refused");
    expect_modified(ctx, wt, "weight", 5, 4, "dl_matmul", "input 1");
    remove(path);
    dl_ctx_free(ctx);
}

/* 5. a custom function's dl_fn_save tensors */
static dl_tensor *sq_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)n; (void)user;
    dl_fn_save(fc, in[0]);
    return dl_mul(in[0], in[0]);
}
static dl_result sq_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)user;
    gin[0] = dl_mul(g, dl_mul_scalar(dl_fn_saved(fc, 0), 2.0f));
    return DL_OK;
}

static void test_custom_saved(void)
{
    dl_ctx *ctx = new_ctx();
    dl_function sq = {"my_square", sq_fwd, sq_bwd};
    dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), XV), true), *loss;
    loss = dl_sum(dl_function_apply(&sq, 1, &x, NULL), DL_ALL, false);
    dl_no_grad_begin(ctx);
    dl_fill_(x, 0.0f);
    dl_no_grad_end(ctx);
    CHECK(dl_backward(loss) == DL_ERR_GRAPH, "backward after a saved tensor changed refused");
    expect_modified(ctx, x, NULL, 1, 0, "my_square", "saved tensor 0");
    loss = dl_sum(dl_function_apply(&sq, 1, &x, NULL), DL_ALL, false);
    CHECK(dl_backward(loss) == DL_OK && th_f(x->grad, 3) == 0.0f, "untouched: runs (%s)", dl_error_message(ctx));
    dl_ctx_free(ctx);
}

/* 6. what must run as before: a training loop with batch norm (its running
   statistics are written in each forward) and Adam, gradient accumulation,
   retain_graph, create_graph */
static void test_unaffected(void)
{
    dl_ctx *ctx = new_ctx();
    dl_module *mods[3];
    dl_module *net;
    dl_optim *o;
    dl_tensor *x = dl_from_array(ctx, DL_SHAPE(3, 4), XV), *y, *loss, *g, *gg;
    float first = 0, last = 0;
    int step;
    mods[0] = dl_nn_linear(ctx, 4, 5, true);
    mods[1] = dl_nn_batch_norm1d(ctx, 5);
    mods[2] = dl_nn_linear(ctx, 5, 1, true);
    net = dl_nn_sequential(ctx, 3, mods);
    o = dl_adam(net, NULL);
    for (step = 0; step < 20; step++) {
        dl_optim_zero_grad(o);
        loss = dl_mean(dl_mul(dl_module_forward(net, x), dl_module_forward(net, x)), DL_ALL, false);
        CHECK(dl_backward(loss) == DL_OK && dl_optim_step(o) == DL_OK, "step %d: %s", step, dl_error_message(ctx));
        if (step == 0) first = dl_item(loss);
        last = dl_item(loss);
        dl_step_end(ctx);
        x = dl_from_array(ctx, DL_SHAPE(3, 4), XV);
    }
    CHECK(last < first, "the loss went down: %g -> %g", (double)first, (double)last);
    /* gradient accumulation: two forward/backward pairs, then the step */
    dl_optim_zero_grad(o);
    CHECK(dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false)) == DL_OK &&
          dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false)) == DL_OK && dl_optim_step(o) == DL_OK,
          "accumulation: %s", dl_error_message(ctx));
    /* retain_graph: a second backward through the same graph */
    {
        dl_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.retain_graph = true;
        loss = dl_sum(dl_module_forward(net, x), DL_ALL, false);
        CHECK(dl_backward_ex(loss, &bd) == DL_OK && dl_backward(loss) == DL_OK, "retain_graph: %s",
              dl_error_message(ctx));
    }
    /* create_graph: the gradient of x^3 is 3x^2, its derivative 6x */
    x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3, 4), XV), true);
    y = dl_sum(dl_mul(dl_mul(x, x), x), DL_ALL, false);
    {
        dl_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.create_graph = true;
        CHECK(dl_grad(y, 1, &x, &g, &bd) == DL_OK, "dl_grad create_graph: %s", dl_error_message(ctx));
        CHECK(dl_grad(dl_sum(g, DL_ALL, false), 1, &x, &gg, NULL) == DL_OK && th_f(gg, 4) == 30.0f,
              "second order: %g (%s)", (double)(gg ? th_f(gg, 4) : 0), dl_error_message(ctx));
    }
    dl_ctx_free(ctx);
}

int main(void)
{
    test_writes_refused();
    test_views();
    test_unread_may_change();
    test_optim_and_load();
    test_custom_saved();
    test_unaffected();
    TEST_END();
}
