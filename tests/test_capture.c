/* tests/test_capture.c - capture and replay (dl_capture_begin/end, dl_replay,
   dl_capture_free): a static graph of one training step.

   1. Equivalence: a loop that runs steps 1..c-1 eagerly, captures step c and
      replays the rest gives the bits of the all-eager loop, step by step
      (losses) and at the end (parameters, buffers, optimizer state): LeNet-BN
      with dropout, Adam, AdamW and SGD (momentum, nesterov), a cosine
      schedule, 24 steps, new data written into the static inputs between
      replays; also the bench's other models: an MLP with dropout, d2l's
      LeNet, a small ResNet (user modules, strided and 1x1 convolutions),
      captures right after one warm-up step included.
   2. Memory: a replay allocates nothing (the allocator counts of every
      device and of the host); the capture's tensors outlive dl_step_end and
      read as stale after dl_capture_free; nothing leaks (a counting
      allocator; make valgrind runs this program too, with --quick: the
      LeNet-BN runs left out).
   3. Refusals, each with its message: host reads and writes, a persistent
      allocation (no warm-up), a step tensor from before the capture or from
      another capture, a tensor from another context, a second optimizer
      step, dl_step_end inside, nesting, collectives, the loader.
   4. Lifetimes: capture after capture, captures side by side, freeing in
      every order (capture, tensors it uses, its optimizer, the context;
      during recording too); a replay after any of those is an error. A
      parameter that gets its first gradient after the capture: replays
      update what the capture did (on CUDA: its own multi-tensor list).
   Every tensor lives on the context's default device, so `make test` runs
   this on the strict cpu:1 too and `make test-cuda-emu` on emulated cuda:0.
   Build: gcc -std=c99 -Wall -Wextra -Werror -pedantic -O2 -I. tests/test_capture.c -lm -lpthread */
#include <stdlib.h>
#include <string.h>
#include "count_alloc.h"   /* cnt_live, cnt_calls */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include "examples/lenet_bn.h"
#include "examples/resnet_small.h"   /* ex_small_block: a user module */
#include <stdio.h>

#define B 8           /* batch */
#define STEPS 24

static float g_host_x[B * 784];
static const int64_t g_zeros[B] = {0};

/* two CPU devices at least (dl_module_to between them) */
static dl_ctx *new_ctx(uint64_t seed)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.seed = seed;
    d.cpu_devices = 2;
    return dl_ctx_init(&d);
}

enum { OPT_ADAM, OPT_ADAMW, OPT_SGD };
enum { NET_LENET, NET_MLP, NET_D2L, NET_RESNET };


/* LeNet-BN (examples/lenet_bn.h, the model of make run) with dropout after
   the hidden linear layers' ReLUs, or an MLP with dropout */
static dl_module *make_net(dl_ctx *ctx, int kind)
{
    dl_module *m[EX_LENET_BN_LAYERS + 2], *l[EX_LENET_BN_LAYERS];
    int k = 0, i;
    if (kind == NET_LENET) {
        ex_lenet_bn_layers(ctx, l);
        for (i = 0; i < EX_LENET_BN_LAYERS; i++) {
            m[k++] = l[i];
            if (i == 11) m[k++] = dl_nn_dropout(ctx, 0.25f);   /* after linear 400->120, BN, ReLU */
            if (i == 14) m[k++] = dl_nn_dropout(ctx, 0.5f);    /* after linear 120->84, BN, ReLU */
        }
    } else if (kind == NET_D2L) {   /* d2l's LeNet: sigmoid, average pooling */
        dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
        dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
        m[k++] = dl_nn_conv2d(ctx, 1, 6, 5, &pad2, true);
        m[k++] = dl_nn_sigmoid(ctx);
        m[k++] = dl_nn_avg_pool2d(ctx, &pool);
        m[k++] = dl_nn_conv2d(ctx, 6, 16, 5, NULL, true);
        m[k++] = dl_nn_sigmoid(ctx);
        m[k++] = dl_nn_avg_pool2d(ctx, &pool);
        m[k++] = dl_nn_flatten(ctx);
        m[k++] = dl_nn_linear(ctx, 400, 120, true);
        m[k++] = dl_nn_sigmoid(ctx);
        m[k++] = dl_nn_linear(ctx, 120, 84, true);
        m[k++] = dl_nn_sigmoid(ctx);
        m[k++] = dl_nn_linear(ctx, 84, 10, true);
    } else if (kind == NET_RESNET) {   /* stem, two stages of blocks (the second strided), pooling */
        dl_conv_desc stem = dl_conv_desc_make(1, 1, 1, 1);
        m[k++] = dl_nn_conv2d(ctx, 1, 4, 3, &stem, false);
        m[k++] = dl_nn_batch_norm2d(ctx, 4);
        m[k++] = dl_nn_relu(ctx);
        m[k++] = ex_small_block(ctx, 4, 4, 1);
        m[k++] = ex_small_block(ctx, 4, 8, 2);
        m[k++] = dl_nn_adaptive_avg_pool2d(ctx, DL_SHAPE(1, 1));
        m[k++] = dl_nn_flatten(ctx);
        m[k++] = dl_nn_linear(ctx, 8, 10, true);
    } else {
        m[k++] = dl_nn_flatten(ctx);
        m[k++] = dl_nn_linear(ctx, 784, 64, true);
        m[k++] = dl_nn_relu(ctx);
        m[k++] = dl_nn_dropout(ctx, 0.3f);
        m[k++] = dl_nn_linear(ctx, 64, 10, true);
    }
    return dl_nn_sequential(ctx, k, m);
}

/* one training run: its context, model, optimizer and static inputs */
typedef struct run {
    dl_ctx *ctx;
    dl_module *net;
    dl_optim *opt;
    dl_tensor *x, *y;       /* persistent: batches are written into them */
    float lr0;
} run;

static int run_init(run *r, int net, int opt, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->ctx = new_ctx(seed);
    if (!r->ctx) return 0;
    r->net = make_net(r->ctx, net);
    if (opt == OPT_SGD) {
        dl_sgd_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.lr = r->lr0 = 0.05f;
        sd.momentum = 0.9f;
        sd.nesterov = true;
        sd.weight_decay = 1e-4f;
        r->opt = dl_sgd(r->net, &sd);
    } else {
        dl_adam_desc ad;
        memset(&ad, 0, sizeof ad);
        ad.lr = r->lr0 = 2e-3f;
        r->opt = opt == OPT_ADAM ? dl_adam(r->net, &ad) : dl_adamw(r->net, &ad);
    }
    r->x = dl_keep(dl_zeros(r->ctx, DL_SHAPE(B, 1, 28, 28)));
    r->y = dl_keep(dl_from_int64(r->ctx, DL_SHAPE(B), g_zeros));
    dl_step_end(r->ctx);
    return r->net && r->opt && r->x && r->y;
}

/* batch k of the static inputs: the same numbers in every run */
static int write_batch(run *r, int k)
{
    float xs[B * 784];
    int64_t ys[B];
    uint32_t s = 2654435761u * (uint32_t)(k + 1);
    int i;
    for (i = 0; i < B * 784; i++) {
        s = s * 1664525u + 1013904223u;
        xs[i] = (float)(s >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    for (i = 0; i < B; i++) ys[i] = (int64_t)((s >> (i + 3)) % 10);
    return dl_write(r->x, xs, B * 784) == DL_OK &&
           dl_copy_(r->y, dl_from_int64(r->ctx, DL_SHAPE(B), ys)) == DL_OK;
}

/* zero_grad, forward, loss, backward, optimizer step */
static dl_tensor *train_step(run *r)
{
    dl_tensor *loss;
    dl_optim_zero_grad(r->opt);
    loss = dl_cross_entropy(dl_module_forward(r->net, r->x), r->y, NULL);
    if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(r->opt) != DL_OK) return NULL;
    return loss;
}

static float cosine_lr(run *r, int k) { return dl_lr_cosine(r->lr0, k, STEPS, 0.0f); }

/* STEPS steps; capture at step cap_at (0: all eager); losses[k] */
static int run_steps(run *r, int cap_at, float *losses)
{
    dl_capture *cap = NULL;
    dl_tensor *loss = NULL;
    int k, ok = 1;
    for (k = 1; k <= STEPS && ok; k++) {
        ok = write_batch(r, k) && dl_optim_set_lr(r->opt, cosine_lr(r, k)) == DL_OK;
        if (!ok) break;
        if (cap_at && k == cap_at) {
            cap = dl_capture_begin(r->ctx);
            loss = train_step(r);
            ok = cap && loss && dl_capture_end(cap) == DL_OK;
        } else if (cap_at && k > cap_at) {
            ok = dl_replay(cap) == DL_OK;
        } else {
            loss = train_step(r);
            ok = loss != NULL;
        }
        losses[k - 1] = ok ? dl_item(loss) : NAN;
        dl_step_end(r->ctx);
    }
    if (!ok) printf("    step %d: %s\n", k, dl_error_message(r->ctx));
    dl_capture_free(cap);
    return ok;
}

/* every byte of the model's state and the optimizer's */
static size_t run_bytes(run *r, unsigned char *dst, size_t cap) { return th_train_bytes(r->net, r->opt, dst, cap); }

static unsigned char g_a[1 << 20], g_b[1 << 20];

static void test_equivalence(int net, int opt, int cap_at, const char *what)
{
    run e, c;
    float le[STEPS], lc[STEPS];
    size_t na, nb;
    int k, same = 1;
    CHECK(run_init(&e, net, opt, 7) && run_init(&c, net, opt, 7), "%s: set-up", what);
    CHECK(run_steps(&e, 0, le), "%s: the eager run", what);
    CHECK(run_steps(&c, cap_at, lc), "%s: the run that captures step %d", what, cap_at);
    for (k = 0; k < STEPS; k++)
        if (memcmp(&le[k], &lc[k], sizeof(float)) != 0) {
            if (same) printf("    %s: step %d loss %.9g (eager) vs %.9g\n", what, k + 1, (double)le[k], (double)lc[k]);
            same = 0;
        }
    CHECK(same, "%s: every step's loss, bit for bit", what);
    na = run_bytes(&e, g_a, sizeof g_a);
    nb = run_bytes(&c, g_b, sizeof g_b);
    CHECK(na > 0 && na == nb && memcmp(g_a, g_b, na) == 0, "%s: parameters, buffers and optimizer state "
          "after %d steps, bit for bit (%zu bytes)", what, STEPS, na);
    CHECK(dl_optim_steps(e.opt) == STEPS && dl_optim_steps(c.opt) == STEPS, "%s: optimizer steps %lld, %lld",
          what, (long long)dl_optim_steps(e.opt), (long long)dl_optim_steps(c.opt));
    dl_ctx_free(e.ctx);
    dl_ctx_free(c.ctx);
}

/* ------------------------------------------------------------ memory */

static uint64_t allocs(dl_ctx *ctx)
{
    dl_memory_stats st;
    uint64_t n = 0;
    int i, nd = dl_device_count(ctx, DL_DEVICE_CPU);
    for (i = 0; i < nd; i++)
        if (dl_memory_stats_get(ctx, dl_cpu_device(i), &st) == DL_OK) n += st.alloc_calls;
    if (dl_ctx_device(ctx).type == DL_DEVICE_CUDA && dl_memory_stats_get(ctx, dl_ctx_device(ctx), &st) == DL_OK)
        n += st.alloc_calls;
    return n;
}

static void test_memory(void)
{
    run r;
    dl_capture *cap;
    dl_tensor *loss;
    uint64_t a0;
    float l1, l2;
    int k, ok = 1;
    CHECK(run_init(&r, NET_LENET, OPT_ADAM, 3), "memory: set-up");
    for (k = 1; k <= 2; k++) { write_batch(&r, k); train_step(&r); dl_step_end(r.ctx); }   /* warm-up */
    write_batch(&r, 3);
    cap = dl_capture_begin(r.ctx);
    loss = train_step(&r);
    CHECK(cap && loss && dl_capture_end(cap) == DL_OK, "memory: capture: %s", dl_error_message(r.ctx));
    dl_step_end(r.ctx);
    l1 = dl_item(loss);
    CHECK(l1 == l1, "memory: the capture's loss outlives dl_step_end: %s", dl_error_message(r.ctx));
    a0 = allocs(r.ctx);
    for (k = 4; k < 12 && ok; k++) {
        write_batch(&r, k);
        ok = dl_replay(cap) == DL_OK && dl_item(loss) == dl_item(loss);
        dl_step_end(r.ctx);
    }
    CHECK(ok, "memory: 8 replays: %s", dl_error_message(r.ctx));
    write_batch(&r, 20);
    dl_step_end(r.ctx);
    a0 = allocs(r.ctx) - a0;
    /* write_batch's dl_from_int64 is eager step memory: its arena chunk was made in the warm-up */
    CHECK(a0 == 0, "memory: the replays (and the steps between) called the allocator %llu times",
          (unsigned long long)a0);
    a0 = allocs(r.ctx);
    {   /* a replay's in-place writes move versions as the eager step's do */
        const dl_named_tensor *p;
        uint32_t v0, g0;
        dl_module_named_parameters(r.net, &p);
        v0 = *dl__ver(p[0].t);
        g0 = *dl__ver(p[0].t->grad);
        dl_replay(cap);
        CHECK(*dl__ver(p[0].t) == v0 + 1, "memory: a replay bumps a parameter's version once (%u -> %u)",
              (unsigned)v0, (unsigned)*dl__ver(p[0].t));
        CHECK(*dl__ver(p[0].t->grad) - g0 == 2, "memory: and its gradient's twice (zero_grad, backward): %u",
              (unsigned)(*dl__ver(p[0].t->grad) - g0));
    }
    CHECK(allocs(r.ctx) == a0, "memory: one replay, no allocator call");
    l2 = dl_item(loss);
    CHECK(l2 == l2 && dl_last_error(r.ctx) == DL_OK, "memory: the loss after another replay");
    {   /* the capture's bytes are reported, and go back at dl_capture_free */
        dl_memory_stats st;
        dl_memory_stats_get(r.ctx, dl_ctx_device(r.ctx), &st);
        CHECK(st.capture_bytes > 0, "memory: capture_bytes %zu", st.capture_bytes);
        dl_capture_free(cap);
        dl_memory_stats_get(r.ctx, dl_ctx_device(r.ctx), &st);
        CHECK(st.capture_bytes > 0, "memory: held until the step ends (its tape may point there)");
        dl_step_end(r.ctx);
        dl_memory_stats_get(r.ctx, dl_ctx_device(r.ctx), &st);
        CHECK(st.capture_bytes == 0, "memory: capture_bytes %zu after dl_capture_free and dl_step_end",
              st.capture_bytes);
    }
    CHECK(dl_item(loss) != dl_item(loss), "memory: the capture's loss after dl_capture_free is NaN");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "capture that dl_capture_free() released");
    dl_ctx_free(r.ctx);
}

/* ------------------------------------------------------------ refusals */

/* the run's k-th parameter (state_dict order) */
static dl_tensor *net_param(run *r, int k)
{
    const dl_named_tensor *p;
    dl_module_named_parameters(r->net, &p);
    return p[k].t;
}

/* a run warmed up by two eager steps, then a capture begun */
static dl_capture *begin_warm(run *r)
{
    int k;
    if (!run_init(r, NET_MLP, OPT_ADAM, 5)) return NULL;
    for (k = 1; k <= 2; k++) { write_batch(r, k); train_step(r); dl_step_end(r->ctx); }
    return dl_capture_begin(r->ctx);
}

/* the op failed with code and msg; dl_capture_end fails the same way; replay refused */
static void expect_refused(run *r, dl_capture *cap, dl_result code, const char *msg, const char *what)
{
    const char *m;
    EXPECT_ERR(r->ctx, code, msg);
    CHECK(dl_capture_end(cap) == code, "%s: dl_capture_end returns %s", what, dl_result_string(code));
    m = dl_error_message(r->ctx);
    CHECK(strstr(m, msg) != NULL, "%s: dl_capture_end's message names it: %s", what, m);
    dl_clear_error(r->ctx);
    CHECK(dl_replay(cap) == code, "%s: a replay is refused", what);
    EXPECT_ERR(r->ctx, code, "the capture failed");
    dl_capture_free(cap);
    dl_ctx_free(r->ctx);
}

static dl_tensor *sq_sum(void *user, dl_tensor *const *in)
{
    (void)user;
    return dl_sum(dl_mul(in[0], in[0]), DL_ALL, false);
}

static void test_refusals(void)
{
    run r;
    dl_capture *cap;
    dl_tensor *loss, *t;
    float buf[4] = {1, 2, 3, 4};

    cap = begin_warm(&r);
    loss = train_step(&r);
    CHECK(dl_item(loss) != dl_item(loss), "dl_item inside a capture is NaN");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_item: a read to the host inside a capture", "dl_item");

    cap = begin_warm(&r);
    loss = train_step(&r);
    CHECK(dl_read(loss, buf, 1) == DL_ERR_UNSUPPORTED, "dl_read inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_read: a read to the host", "dl_read");

    cap = begin_warm(&r);
    loss = train_step(&r);
    CHECK(dl_data(loss) == NULL, "dl_data inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_data: host access", "dl_data");

    cap = begin_warm(&r);
    CHECK(dl_write(r.x, g_host_x, B * 784) == DL_ERR_UNSUPPORTED, "dl_write inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_write: a copy from the host", "dl_write");

    cap = begin_warm(&r);
    CHECK(dl_from_array(r.ctx, DL_SHAPE(4), buf) == NULL, "dl_from_array inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_from_array: a copy from the host", "dl_from_array");

    cap = begin_warm(&r);
    t = dl_to(r.x, dl_cpu_device(0));
    if (dl_ctx_device(r.ctx).type == DL_DEVICE_CUDA) {
        CHECK(t == NULL, "dl_to the host inside a capture");
        expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_to: a copy between the host and a GPU", "dl_to");
    } else {
        CHECK(t != NULL, "dl_to between CPU devices inside a capture: %s", dl_error_message(r.ctx));
        CHECK(dl_capture_end(cap) == DL_OK, "dl_to between CPU devices is recorded");
        dl_capture_free(cap);
        dl_ctx_free(r.ctx);
    }

    cap = begin_warm(&r);
    CHECK(dl_clip_grad_norm(r.net, 1.0f) == 0.0f, "dl_clip_grad_norm inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_clip_grad_norm: a read to the host", "dl_clip_grad_norm");

    cap = begin_warm(&r);
    dl_manual_seed(r.ctx, 3);
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_manual_seed: reseeding", "dl_manual_seed");

    /* a gradient check and a histogram: refused by their own names up front (they once failed inside
       under dl_mul's and dl_read's) */
    cap = begin_warm(&r);
    {
        dl_gradcheck_result gr;
        dl_tensor *in[1];
        in[0] = r.x;
        CHECK(dl_gradcheck(r.ctx, sq_sum, NULL, 1, in, NULL, &gr) == DL_ERR_UNSUPPORTED, "dl_gradcheck inside a capture");
    }
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_gradcheck: a gradient check", "dl_gradcheck");
    cap = begin_warm(&r);
    {
        dl_summary_writer *w = dl_summary_open(r.ctx, "build/test_capture_tb");
        CHECK(w && dl_summary_histogram(w, "h", 0, r.x) == DL_ERR_UNSUPPORTED, "dl_summary_histogram inside a capture");
        CHECK(w && dl_summary_close(w) == DL_OK, "dl_summary_close: %s", dl_error_message(r.ctx));
        expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_summary_histogram: a histogram of t", "dl_summary_histogram");
    }

    /* a schedule set inside the step: a replay reads the groups' lr, so it
       could not repeat the set (eager StepLR 1, 0.5, 0.25 .. against every
       replay at the captured 0.5 before this was refused) */
    cap = begin_warm(&r);
    CHECK(dl_optim_set_lr(r.opt, 0.5f * r.lr0) == DL_ERR_UNSUPPORTED, "dl_optim_set_lr inside a capture");
    CHECK(dl_optim_lr(r.opt) == r.lr0, "a refused dl_optim_set_lr leaves the lr");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_optim_set_lr: a learning-rate change inside a capture",
                   "dl_optim_set_lr");
    cap = begin_warm(&r);
    CHECK(dl_optim_set_group_lr(r.opt, 0, 0.5f * r.lr0) == DL_ERR_UNSUPPORTED, "dl_optim_set_group_lr inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_optim_set_group_lr: a learning-rate change", "dl_optim_set_group_lr");

    cap = begin_warm(&r);
    {
        dl_tensor *ts[1];
        ts[0] = r.x;
        CHECK(dl_allreduce(ts, 1, DL_REDUCE_SUM) == DL_ERR_UNSUPPORTED, "dl_allreduce inside a capture");
    }
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_allreduce: a collective", "dl_allreduce");

    /* anomaly mode: refused at begin; a device-level read (nonfinite) when turned on inside */
    CHECK(run_init(&r, NET_MLP, OPT_ADAM, 5), "anomaly: set-up");
    dl_set_anomaly(r.ctx, true);
    CHECK(dl_capture_begin(r.ctx) == NULL, "dl_capture_begin in anomaly mode");
    EXPECT_ERR(r.ctx, DL_ERR_UNSUPPORTED, "dl_capture_begin: anomaly mode");
    dl_set_anomaly(r.ctx, false);
    cap = dl_capture_begin(r.ctx);
    dl_set_anomaly(r.ctx, true);
    CHECK(dl_relu(r.x) == NULL, "an op in anomaly mode inside a capture");
    dl_set_anomaly(r.ctx, false);
    CHECK(dl_capture_end(cap) != DL_OK && strstr(dl_error_message(r.ctx), "dl_relu") != NULL &&
          strstr(dl_error_message(r.ctx), "inside a capture") != NULL,
          "a device read (anomaly) fails the capture naming the op: %s", dl_error_message(r.ctx));
    dl_clear_error(r.ctx);
    dl_capture_free(cap);
    dl_ctx_free(r.ctx);

    /* no warm-up: the gradients would be made inside */
    CHECK(run_init(&r, NET_MLP, OPT_ADAM, 5), "cold: set-up");
    write_batch(&r, 1);
    cap = dl_capture_begin(r.ctx);
    CHECK(train_step(&r) == NULL, "a step without warm-up inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_backward: a persistent allocation inside a capture", "cold");

    /* dl_keep inside */
    cap = begin_warm(&r);
    CHECK(dl_keep(r.x) == NULL, "dl_keep inside a capture");
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_keep: a persistent allocation", "dl_keep");

    /* a step tensor made before the capture */
    CHECK(run_init(&r, NET_MLP, OPT_ADAM, 5), "early: set-up");
    t = dl_ones(r.ctx, DL_SHAPE(3));
    cap = dl_capture_begin(r.ctx);
    CHECK(dl_relu(t) == NULL, "a step tensor from before the capture");
    expect_refused(&r, cap, DL_ERR_ARG, "(3) is a step tensor made before dl_capture_begin()", "early");

    /* a tensor made by another capture */
    CHECK(run_init(&r, NET_MLP, OPT_ADAM, 5), "other: set-up");
    cap = dl_capture_begin(r.ctx);
    t = dl_ones(r.ctx, DL_SHAPE(3));
    CHECK(dl_capture_end(cap) == DL_OK, "other: first capture");
    {
        dl_capture *c2 = dl_capture_begin(r.ctx);
        CHECK(dl_relu(t) == NULL, "another capture's tensor");
        dl_capture_free(cap);
        expect_refused(&r, c2, DL_ERR_ARG, "(3) was made by another capture", "other");
    }

    /* a tensor from another context */
    CHECK(run_init(&r, NET_MLP, OPT_ADAM, 5), "ctx2: set-up");
    {
        dl_ctx *c2 = new_ctx(1);
        dl_tensor *a = dl_keep(dl_ones(c2, DL_SHAPE(B, 1, 28, 28)));
        cap = dl_capture_begin(r.ctx);
        CHECK(dl_add(r.x, a) == NULL, "a tensor from another context inside a capture");
        expect_refused(&r, cap, DL_ERR_ARG, "dl_add: a and b belong to different contexts", "ctx2");
        dl_ctx_free(c2);
    }

    /* two optimizer steps in one capture */
    cap = begin_warm(&r);
    train_step(&r);
    dl_optim_step(r.opt);
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_optim_step: a second step inside one capture", "two steps");

    /* dl_step_end inside */
    cap = begin_warm(&r);
    dl_step_end(r.ctx);
    expect_refused(&r, cap, DL_ERR_ARG, "dl_step_end: inside a capture", "dl_step_end");

    /* nesting; replay inside a capture; the loader */
    cap = begin_warm(&r);
    CHECK(dl_capture_begin(r.ctx) == NULL, "nested dl_capture_begin");
    expect_refused(&r, cap, DL_ERR_ARG, "dl_capture_begin: a capture is already recording", "nested");
    cap = begin_warm(&r);
    {
        dl_capture *c0;
        dl_capture_end(cap);
        c0 = cap;
        cap = dl_capture_begin(r.ctx);
        CHECK(dl_replay(c0) == DL_ERR_UNSUPPORTED, "dl_replay inside a capture");
        dl_capture_free(c0);
        expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_replay: inside a capture", "replay inside");
    }
    CHECK(run_init(&r, NET_MLP, OPT_ADAM, 5), "loader: set-up");
    {
        static const int64_t labels[4] = {0, 1, 0, 1};
        dl_tensor *xs = dl_keep(dl_zeros(r.ctx, DL_SHAPE(4, 2))), *bx, *by;
        dl_tensor *ys = dl_keep(dl_from_int64(r.ctx, DL_SHAPE(4), labels));
        dl_loader_desc ld;
        dl_loader *l;
        memset(&ld, 0, sizeof ld);
        ld.batch_size = 2;
        l = dl_loader_new(r.ctx, dl_tensor_dataset(r.ctx, xs, ys, NULL, false), &ld);
        cap = dl_capture_begin(r.ctx);
        CHECK(l && dl_loader_next(l, &bx, &by) == -1, "dl_loader_next inside a capture");
        expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_loader_next: loading a batch", "loader");
    }
    /* a data-dependent shape needs its value on the host first: refused at that read */
    cap = begin_warm(&r);
    {
        dl_tensor *am = dl_argmax(dl_module_forward(r.net, r.x), 1, false);
        int64_t v[B];
        CHECK(am && dl_read_int64(am, v, B) == DL_ERR_UNSUPPORTED, "a shape from data (read first)");
    }
    expect_refused(&r, cap, DL_ERR_UNSUPPORTED, "dl_read_int64: a read to the host", "data shape");
}

/* ------------------------------------------------------------ lifetimes */

static void test_lifetimes(void)
{
    run r;
    dl_capture *a, *b;
    dl_tensor *la, *lb;
    int k;
    float v1, v2;

    /* capture after capture: two captures of the same step, side by side */
    CHECK(run_init(&r, NET_MLP, OPT_ADAM, 9), "two: set-up");
    for (k = 1; k <= 2; k++) { write_batch(&r, k); train_step(&r); dl_step_end(r.ctx); }
    a = dl_capture_begin(r.ctx);
    la = train_step(&r);
    CHECK(dl_capture_end(a) == DL_OK, "two: capture a");
    dl_step_end(r.ctx);
    b = dl_capture_begin(r.ctx);
    lb = train_step(&r);
    CHECK(dl_capture_end(b) == DL_OK, "two: capture b (after a)");
    dl_step_end(r.ctx);
    CHECK(dl_replay(a) == DL_OK && dl_replay(b) == DL_OK && dl_replay(a) == DL_OK, "two: replays alternate");
    v1 = dl_item(la);
    v2 = dl_item(lb);
    CHECK(v1 == v1 && v2 == v2, "two: both losses read");
    dl_capture_free(a);                        /* a first: b still replays */
    CHECK(dl_replay(b) == DL_OK, "two: b after a is freed: %s", dl_error_message(r.ctx));
    CHECK(dl_replay(a) == DL_ERR_STALE, "two: a after dl_capture_free");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "dl_replay: the capture was freed by dl_capture_free()");
    dl_capture_free(a);                        /* twice: nothing */
    CHECK(dl_capture_end(a) == DL_ERR_STALE, "dl_capture_end of a freed capture: DL_ERR_STALE, as dl_replay");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "dl_capture_end: the capture was freed");
    CHECK(dl_item(la) != dl_item(la), "two: a's loss after a is freed");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "dl_capture_free() released");
    CHECK(dl_item(lb) == dl_item(lb), "two: b's loss is still there");
    dl_capture_end(b);
    EXPECT_ERR(r.ctx, DL_ERR_ARG, "dl_capture_end: the capture is not recording");

    /* a module's parameter cannot be freed (dl_free refuses: the module reads it); the replay goes on */
    dl_free(net_param(&r, 0));
    EXPECT_ERR(r.ctx, DL_ERR_ARG, "dl_free: t (64,784) is weight of a Linear module");
    CHECK(dl_replay(b) == DL_OK, "a replay after a refused dl_free of its parameter: %s", dl_error_message(r.ctx));
    /* a tensor it uses freed (the static input: dl_free) */
    dl_free(r.x);
    CHECK(dl_replay(b) == DL_ERR_STALE, "a replay after a tensor it uses was freed");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "which was freed (dl_free) after dl_capture_begin()");
    dl_capture_free(b);
    dl_ctx_free(r.ctx);

    /* a tensor it uses freed while the capture records: dl_capture_end names itself */
    a = begin_warm(&r);
    train_step(&r);
    dl_free(r.y);
    CHECK(dl_capture_end(a) == DL_ERR_STALE, "a tensor freed while recording: dl_capture_end fails");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "dl_capture_end: the capture uses");
    dl_capture_free(a);
    dl_ctx_free(r.ctx);

    /* a parameter frozen (or unfrozen) between replays: which gradients the
       step makes was baked in, so the replay refuses until it is set back
       (it went on training the frozen layer before) */
    a = begin_warm(&r);
    train_step(&r);
    CHECK(dl_capture_end(a) == DL_OK, "requires_grad: capture");
    {
        dl_tensor *w = net_param(&r, 0);
        CHECK(dl_requires_grad(w, false) == w, "requires_grad: freeze");
        CHECK(dl_replay(a) == DL_ERR_STALE, "a replay after a parameter it uses was frozen");
        EXPECT_ERR(r.ctx, DL_ERR_STALE, "whose requires_grad is now false (true at capture)");
        dl_requires_grad(w, true);
        CHECK(dl_replay(a) == DL_OK, "requires_grad set back: the replay runs: %s", dl_error_message(r.ctx));
        r.x->requires_grad = true;   /* the static input, through the field */
        CHECK(dl_replay(a) == DL_ERR_STALE, "a replay after the static input's requires_grad was set");
        EXPECT_ERR(r.ctx, DL_ERR_STALE, "whose requires_grad is now true (false at capture)");
        r.x->requires_grad = false;
        CHECK(dl_replay(a) == DL_OK, "the input's flag set back: the replay runs: %s", dl_error_message(r.ctx));
    }
    dl_capture_free(a);
    dl_ctx_free(r.ctx);

    /* its optimizer freed */
    a = begin_warm(&r);
    train_step(&r);
    CHECK(dl_capture_end(a) == DL_OK, "optimizer freed: capture");
    dl_optim_free(r.opt);
    CHECK(dl_replay(a) == DL_ERR_STALE, "a replay after its optimizer was freed");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "dl_optim_free");
    dl_capture_free(a);
    dl_ctx_free(r.ctx);

    /* a parameter moved by dl_module_to (to the other CPU device) */
    a = begin_warm(&r);
    train_step(&r);
    CHECK(dl_capture_end(a) == DL_OK, "moved: capture");
    CHECK(dl_module_to(r.net, dl_cpu_device(r.x->device.type == DL_DEVICE_CPU && r.x->device.index == 0)) == DL_OK,
          "moved: dl_module_to: %s", dl_error_message(r.ctx));
    CHECK(dl_replay(a) == DL_ERR_STALE, "a replay after dl_module_to moved a parameter");
    EXPECT_ERR(r.ctx, DL_ERR_STALE, "moved to another device by dl_module_to");
    dl_ctx_free(r.ctx);   /* with the capture alive */

    /* freed while recording; the context freed while recording */
    a = begin_warm(&r);
    train_step(&r);
    dl_capture_free(a);
    CHECK(dl_replay(a) == DL_ERR_STALE, "a replay of a capture freed while recording");
    dl_clear_error(r.ctx);
    la = train_step(&r);
    CHECK(la && dl_item(la) == dl_item(la), "eager steps go on after a capture freed while recording: %s",
          dl_error_message(r.ctx));
    dl_step_end(r.ctx);
    a = dl_capture_begin(r.ctx);
    train_step(&r);
    dl_ctx_free(r.ctx);   /* a is recording */

    /* a capture of a forward only: its output outlives dl_step_end, its tape does not */
    a = begin_warm(&r);
    la = dl_cross_entropy(dl_module_forward(r.net, r.x), r.y, NULL);
    CHECK(la && dl_capture_end(a) == DL_OK, "forward only: capture");
    dl_step_end(r.ctx);
    CHECK(dl_replay(a) == DL_OK && dl_item(la) == dl_item(la), "forward only: replay and read");
    CHECK(dl_backward(la) == DL_ERR_GRAPH, "a backward of a capture's output after dl_step_end");
    EXPECT_ERR(r.ctx, DL_ERR_GRAPH, "dl_backward: out () was made inside a capture, and its part of the tape went");
    dl_capture_free(a);
    dl_ctx_free(r.ctx);

    /* a replay whose static inputs were rewritten: the new batch's loss */
    CHECK(run_init(&r, NET_MLP, OPT_SGD, 5), "rewrite: set-up");
    for (k = 1; k <= 2; k++) { write_batch(&r, k); train_step(&r); dl_step_end(r.ctx); }
    write_batch(&r, 5);
    a = dl_capture_begin(r.ctx);
    la = train_step(&r);
    CHECK(dl_capture_end(a) == DL_OK, "rewrite: capture");
    dl_step_end(r.ctx);
    write_batch(&r, 6);
    dl_replay(a);
    v1 = dl_item(la);
    write_batch(&r, 7);
    dl_replay(a);
    v2 = dl_item(la);
    CHECK(v1 == v1 && v2 == v2 && v1 != v2, "rewrite: another batch, another loss (%g, %g)", (double)v1, (double)v2);
    dl_capture_free(a);
    dl_ctx_free(r.ctx);
}

/* A parameter without a gradient at capture gets one later (its optimizer's
   lists change: on CUDA a new multi-tensor list, the captured one kept).
   Replays go on updating what the capture updated, with this step's
   arguments; the new one is left to eager steps. */
static void test_list_change(void)
{
    dl_ctx *ctx = new_ctx(11);
    dl_tensor *w = dl_param(dl_randn(ctx, DL_SHAPE(4, 3))), *u = dl_param(dl_randn(ctx, DL_SHAPE(3)));
    dl_tensor *x = dl_keep(dl_randn(ctx, DL_SHAPE(2, 4))), *ps[2], *loss;
    dl_optim *o;
    dl_capture *cap = NULL;
    float w1[12], w2[12], u1[3], u2[3];
    int k;
    ps[0] = w;
    ps[1] = u;
    o = dl_adam_params(ctx, 2, ps, NULL);
    for (k = 0; k < 2; k++) {   /* the warm-up, then the captured step: w only */
        if (k == 1) cap = dl_capture_begin(ctx);
        dl_optim_zero_grad(o);
        loss = dl_sum(dl_matmul(x, w), DL_ALL, false);
        CHECK(loss && dl_backward(loss) == DL_OK && dl_optim_step(o) == DL_OK, "list change: step %d", k);
        if (k == 0) dl_step_end(ctx);
    }
    CHECK(dl_capture_end(cap) == DL_OK, "list change: the capture: %s", dl_error_message(ctx));
    dl_step_end(ctx);
    dl_optim_zero_grad(o);   /* an eager step that gives u a gradient */
    loss = dl_add(dl_sum(dl_matmul(x, w), DL_ALL, false), dl_sum(u, DL_ALL, false));
    CHECK(loss && dl_backward(loss) == DL_OK && dl_optim_step(o) == DL_OK, "list change: u's first gradient");
    dl_step_end(ctx);
    CHECK(dl_read(w, w1, 12) == DL_OK && dl_read(u, u1, 3) == DL_OK, "list change: read");
    CHECK(dl_replay(cap) == DL_OK && dl_replay(cap) == DL_OK, "list change: replays: %s", dl_error_message(ctx));
    CHECK(dl_read(w, w2, 12) == DL_OK && dl_read(u, u2, 3) == DL_OK, "list change: read again");
    CHECK(memcmp(u1, u2, sizeof u1) == 0, "list change: the replays leave u (not in the captured step)");
    CHECK(memcmp(w1, w2, sizeof w1) != 0, "list change: the replays update w");
    CHECK(dl_optim_steps(o) == 5, "list change: 5 optimizer steps counted (%lld)", (long long)dl_optim_steps(o));
    dl_capture_free(cap);
    dl_ctx_free(ctx);
}

/* A GAN's shape: two captured steps, each freezing the other network with
   dl_requires_grad at its start. Each replay sets those flags again, as the
   eager step does, so the replays alternate as the eager steps do and give
   their bits (the flag check refused the first replay before the captures
   recorded the calls). */
static dl_module *g_na, *g_nb;
static dl_optim *g_oa, *g_ob;
static dl_tensor *g_gx;

static void gan_flags(dl_module *m, bool on)
{
    const dl_named_tensor *p;
    int n = dl_module_named_parameters(m, &p), i;
    for (i = 0; i < n; i++) dl_requires_grad(p[i].t, on);
}

static int gan_step(int which)
{
    dl_optim *o = which == 0 ? g_oa : g_ob;
    dl_tensor *y, *loss;
    gan_flags(g_na, which == 0);
    gan_flags(g_nb, which == 1);
    dl_optim_zero_grad(o);
    y = dl_module_forward(g_nb, dl_tanh(dl_module_forward(g_na, g_gx)));
    loss = dl_sum(dl_mul(y, y), DL_ALL, false);
    return loss && dl_backward(loss) == DL_OK && dl_optim_step(o) == DL_OK;
}

static void gan_run(bool capture, float *out)
{
    dl_ctx *ctx = new_ctx(13);
    dl_sgd_desc sd;
    dl_capture *cap[2] = {NULL, NULL};
    const dl_named_tensor *p;
    int it, w, ok = 1;
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.05f;
    g_na = dl_nn_linear(ctx, 4, 4, true);
    g_nb = dl_nn_linear(ctx, 4, 1, true);
    g_oa = dl_sgd(g_na, &sd);
    g_ob = dl_sgd(g_nb, &sd);
    g_gx = dl_keep(dl_randn(ctx, DL_SHAPE(2, 4)));
    for (it = 0; it < 6 && ok; it++)
        for (w = 0; w < 2 && ok; w++) {
            if (!capture || it == 0) {
                ok = gan_step(w);
            } else if (it == 1) {
                cap[w] = dl_capture_begin(ctx);
                ok = gan_step(w) && dl_capture_end(cap[w]) == DL_OK;
            } else {
                ok = dl_replay(cap[w]) == DL_OK;
            }
            CHECK(ok, "GAN steps (%s): iteration %d, step %c: %s", capture ? "captured" : "eager", it, w ? 'B' : 'A',
                  dl_error_message(ctx));
            dl_step_end(ctx);
        }
    dl_module_named_parameters(g_na, &p);
    CHECK(dl_read(p[0].t, out, 16) == DL_OK, "GAN: read A's weight");
    CHECK(dl_module_named_parameters(g_nb, &p) == 2 && p[0].t->requires_grad, "GAN: the last step (B's) left B trainable");
    dl_capture_free(cap[0]);
    dl_capture_free(cap[1]);
    dl_ctx_free(ctx);
}

static void test_gan_flags(void)
{
    float e[16], c[16];
    memset(e, 0, sizeof e);
    memset(c, 0xff, sizeof c);
    gan_run(false, e);
    gan_run(true, c);
    CHECK(memcmp(e, c, sizeof e) == 0, "GAN: replays of two captured steps that freeze each other: the eager bits "
          "(%.9g, %.9g)", (double)e[0], (double)c[0]);
}

/* dl_eq of int64 tensors (the accuracy idiom) is recorded and replayed
   on the rewritten input: its own backend entry */
static void test_eq_replay(void)
{
    dl_ctx *ctx = new_ctx(12);
    float xv[8] = {0.1f, 0.9f, 0.5f, 0.2f, 0.3f, 0.1f, 0.0f, 0.7f}, xw[8] = {0, 1, 0, 1, 0, 1, 0, 1}, v[2] = {-1, -1};
    int64_t yv[4] = {1, 0, 0, 1};
    dl_tensor *x = dl_keep(dl_from_array(ctx, DL_SHAPE(4, 2), xv)), *y = dl_keep(dl_from_int64(ctx, DL_SHAPE(4), yv)), *c;
    dl_capture *cap = dl_capture_begin(ctx);
    c = dl_sum(dl_eq(dl_argmax(x, 1, false), y), DL_ALL, false);
    CHECK(c && dl_capture_end(cap) == DL_OK && dl_read(c, &v[0], 1) == DL_OK, "dl_eq captured: %s", dl_error_message(ctx));
    CHECK(dl_write(x, xw, 8) == DL_OK && dl_replay(cap) == DL_OK && dl_read(c, &v[1], 1) == DL_OK,
          "dl_eq replayed: %s", dl_error_message(ctx));
    CHECK(v[0] == 4.0f && v[1] == 2.0f, "dl_eq: 4 rows right at capture, 2 at the replay (%g, %g)", (double)v[0],
          (double)v[1]);
    dl_capture_free(cap);
    dl_ctx_free(ctx);
}

/* dl_gather, dl_where, dl_masked_fill and dl_tril captured: a DQN-style
   step (Q(s, a) by gather, a target of 0 where the episode is done)
   replays on a rewritten index with eager's bits; an index out of range is
   refused at a replay on a CPU device (a GPU's graph cannot stop) */
static dl_tensor *sel_step(dl_tensor *w, dl_tensor *s, dl_tensor *a, dl_tensor *done)
{
    dl_tensor *q = dl_matmul(s, w), *qa, *tq, *r;
    dl_zero_grad(w);
    qa = dl_squeeze(dl_gather(q, 1, dl_unsqueeze(a, 1)), 1);
    tq = dl_where(done, dl_zeros_like(qa), dl_detach(dl_max(q, DL_DIMS(1), false)));
    r = dl_sum(dl_masked_fill(dl_tril(q, 0), dl_reshape(done, DL_SHAPE(4, 1)), 0.5f), DL_ALL, false);
    r = dl_add(dl_sum(dl_pow(dl_sub(qa, tq), 2.0f), DL_ALL, false), r);
    if (r && dl_backward(r) != DL_OK) return NULL;
    return r;
}
static dl_result write_i64(dl_tensor *t, const int64_t *v)   /* (docs/capture.md: an int64 static input) */
{
    return dl_copy_(t, dl_from_int64(dl_tensor_ctx(t), DL_SHAPE(4), v));
}
static void test_select_replay(void)
{
    dl_ctx *ctx = new_ctx(13);
    float dv[4] = {0, 1, 0, 0}, e[2][10], c[2][10];
    int64_t a0[4] = {0, 2, 1, 1}, a1[4] = {2, 2, 0, 1}, bad[4] = {0, 3, 0, 0};
    dl_tensor *w = dl_keep(dl_requires_grad(dl_randn(ctx, DL_SHAPE(3, 3)), true));
    dl_tensor *s = dl_keep(dl_randn(ctx, DL_SHAPE(4, 3))), *a = dl_keep(dl_from_int64(ctx, DL_SHAPE(4), a0));
    dl_tensor *done = dl_keep(dl_from_array(ctx, DL_SHAPE(4), dv)), *r;
    dl_capture *cap;
    int k;
    for (k = 0; k < 2; k++) {   /* eager */
        CHECK(write_i64(a, k ? a1 : a0) == DL_OK, "index written: %s", dl_error_message(ctx));
        r = sel_step(w, s, a, done);
        CHECK(r && dl_read(r, e[k], 1) == DL_OK && dl_read(w->grad, e[k] + 1, 9) == DL_OK, "eager step %d: %s", k,
              dl_error_message(ctx));
        dl_step_end(ctx);
    }
    CHECK(write_i64(a, a0) == DL_OK, "index written back");
    cap = dl_capture_begin(ctx);
    r = sel_step(w, s, a, done);
    CHECK(r && dl_capture_end(cap) == DL_OK && dl_read(r, c[0], 1) == DL_OK && dl_read(w->grad, c[0] + 1, 9) == DL_OK,
          "gather/where captured: %s", dl_error_message(ctx));
    CHECK(write_i64(a, a1) == DL_OK && dl_replay(cap) == DL_OK && dl_read(r, c[1], 1) == DL_OK &&
          dl_read(w->grad, c[1] + 1, 9) == DL_OK, "gather/where replayed: %s", dl_error_message(ctx));
    CHECK(memcmp(e, c, sizeof e) == 0, "gather/where: the capture and its replay on a new index give eager's bits "
          "(%.9g %.9g, %.9g %.9g)", (double)e[0][0], (double)c[0][0], (double)e[1][0], (double)c[1][0]);
    if (w->device.type == DL_DEVICE_CPU) {
        CHECK(write_i64(a, bad) == DL_OK && dl_replay(cap) != DL_OK, "an index out of range refused at replay");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_replay: a dl_gather index holds 3 at flat index 1: indices must be in [0, 3)");
        dl_clear_error(ctx);
    }
    dl_capture_free(cap);
    dl_ctx_free(ctx);
}

/* dl_sin, dl_cos, dl_log1p, dl_expm1, dl_rsqrt captured (the CPU's rows
   past 256 elements and libm's lanes past 2^24 among them): forward and
   backward replay on rewritten values with eager's bits */
static dl_tensor *un_step(dl_tensor *w, dl_tensor *s)
{
    dl_tensor *x, *a, *r;
    dl_zero_grad(w);
    x = dl_mul(w, s);
    a = dl_abs(x);
    r = dl_add(dl_add(dl_sin(dl_mul_scalar(x, 1e7f)), dl_cos(x)), dl_log1p(a));
    r = dl_sum(dl_add(dl_add(r, dl_expm1(x)), dl_rsqrt(dl_add_scalar(a, 0.1f))), DL_ALL, false);
    if (r && dl_backward(r) != DL_OK) return NULL;
    return r;
}
static void test_unary_replay(void)
{
    enum { N = 300 };
    dl_ctx *ctx = new_ctx(14);
    float v[2][N], e[2][N + 1], c[2][N + 1];
    dl_tensor *w = dl_keep(dl_requires_grad(dl_ones(ctx, DL_SHAPE(N)), true)), *s = dl_keep(dl_zeros(ctx, DL_SHAPE(N)));
    dl_tensor *r;
    dl_capture *cap;
    int k, i;
    for (k = 0; k < 2; k++)
        for (i = 0; i < N; i++) v[k][i] = (float)((i * 37 + k * 11) % 101 - 50) * (k ? 0.31f : 0.07f);
    for (k = 0; k < 2; k++) {   /* eager */
        r = dl_write(s, v[k], N) == DL_OK ? un_step(w, s) : NULL;
        CHECK(r && dl_read(r, e[k], 1) == DL_OK && dl_read(w->grad, e[k] + 1, N) == DL_OK, "eager step %d: %s", k,
              dl_error_message(ctx));
        dl_step_end(ctx);
    }
    CHECK(dl_write(s, v[0], N) == DL_OK, "values written back");
    cap = dl_capture_begin(ctx);
    r = un_step(w, s);
    CHECK(r && dl_capture_end(cap) == DL_OK && dl_read(r, c[0], 1) == DL_OK && dl_read(w->grad, c[0] + 1, N) == DL_OK,
          "sin ... rsqrt captured: %s", dl_error_message(ctx));
    CHECK(dl_write(s, v[1], N) == DL_OK && dl_replay(cap) == DL_OK && dl_read(r, c[1], 1) == DL_OK &&
          dl_read(w->grad, c[1] + 1, N) == DL_OK, "sin ... rsqrt replayed: %s", dl_error_message(ctx));
    CHECK(memcmp(e, c, sizeof e) == 0, "sin ... rsqrt: the capture and its replay give eager's bits (%.9g %.9g, "
          "%.9g %.9g)", (double)e[0][0], (double)c[0][0], (double)e[1][0], (double)c[1][0]);
    dl_capture_free(cap);
    dl_ctx_free(ctx);
}

/* dl_chunk, dl_unbind and dl_split_sizes captured: a gated step (one piece
   unused: zeros in its gradient) replays on a rewritten input with eager's
   bits, the gradient joined by the pieces' one node */
static dl_tensor *split_step(dl_tensor *w, dl_tensor *s)
{
    dl_tensor *q = dl_matmul(s, w), *pc[4], *rows[4], *sp[2], *r;
    int64_t sz[2] = {1, 2};
    dl_zero_grad(w);
    if (dl_chunk(q, 4, 1, pc) != 4 || dl_unbind(pc[0], 0, 4, rows) != 4 || dl_split_sizes(s, 2, sz, 1, sp) != 2)
        return NULL;
    r = dl_sum(dl_mul(dl_sigmoid(pc[1]), dl_tanh(pc[2])), DL_ALL, false);
    r = dl_add(r, dl_sum(dl_mul(dl_mul(rows[0], rows[3]), dl_sum(sp[1], DL_ALL, false)), DL_ALL, false));
    if (r && dl_backward(r) != DL_OK) return NULL;
    return r;
}
/* step(w, s) eager on s and on a rewritten s, then captured on the first
   and replayed on the second: the eager bits (what: the ops, in messages) */
static void step_replay(dl_tensor *(*step)(dl_tensor *, dl_tensor *), uint64_t seed, const char *what)
{
    dl_ctx *ctx = new_ctx(seed);
    float e[2][25], c[2][25], s1[12];
    dl_tensor *w = dl_keep(dl_requires_grad(dl_randn(ctx, DL_SHAPE(3, 8)), true));
    dl_tensor *s = dl_keep(dl_randn(ctx, DL_SHAPE(4, 3))), *s0 = dl_keep(dl_copy(s)), *r;
    dl_capture *cap;
    int k, i;
    for (i = 0; i < 12; i++) s1[i] = 0.25f * (float)(i % 5) - 0.5f;
    for (k = 0; k < 2; k++) {   /* eager */
        CHECK(k ? dl_write(s, s1, 12) == DL_OK : dl_copy_(s, s0) == DL_OK, "input written");
        r = step(w, s);
        CHECK(r && dl_read(r, e[k], 1) == DL_OK && dl_read(w->grad, e[k] + 1, 24) == DL_OK, "eager %s step %d: %s",
              what, k, dl_error_message(ctx));
        dl_step_end(ctx);
    }
    CHECK(dl_copy_(s, s0) == DL_OK, "input written back");
    cap = dl_capture_begin(ctx);
    r = step(w, s);
    CHECK(r && dl_capture_end(cap) == DL_OK && dl_read(r, c[0], 1) == DL_OK && dl_read(w->grad, c[0] + 1, 24) == DL_OK,
          "%s captured: %s", what, dl_error_message(ctx));
    CHECK(dl_write(s, s1, 12) == DL_OK && dl_replay(cap) == DL_OK && dl_read(r, c[1], 1) == DL_OK &&
          dl_read(w->grad, c[1] + 1, 24) == DL_OK, "%s replayed: %s", what, dl_error_message(ctx));
    CHECK(memcmp(e, c, sizeof e) == 0 && e[0][0] != e[1][0], "%s: the capture and its replay on a new "
          "input give eager's bits (%.9g %.9g, %.9g %.9g)", what, (double)e[0][0], (double)c[0][0], (double)e[1][0],
          (double)c[1][0]);
    dl_capture_free(cap);
    dl_ctx_free(ctx);
}
static void test_split_replay(void) { step_replay(split_step, 14, "split/chunk/unbind"); }

/* dl_logsumexp and dl_cumsum captured: a step through them (logsumexp's
   max, shifted exps and sum, cumsum's entry, their backwards) replays on a
   rewritten input with eager's bits */
static dl_tensor *scan_step(dl_tensor *w, dl_tensor *s)
{
    dl_tensor *q = dl_matmul(s, w), *r;
    dl_zero_grad(w);
    r = dl_sum(dl_mul(dl_logsumexp(q, DL_DIMS(1), true), dl_logsumexp(q, DL_DIMS(0), true)), DL_ALL, false);
    r = dl_add(r, dl_sum(dl_mul(dl_cumsum(q, 1), dl_cumsum(q, 0)), DL_ALL, false));
    if (r && dl_backward(r) != DL_OK) return NULL;
    return r;
}
static void test_scan_replay(void) { step_replay(scan_step, 15, "logsumexp/cumsum"); }

/* an integer arange past 2^24 (int64 cumsums from a few constants) and
   within it (float32, converted), captured: a replay over zeroed outputs
   writes the values again */
static void test_arange_replay(void)
{
    static int64_t o[10000];
    dl_ctx *ctx = new_ctx(16);
    dl_tensor *a, *b, *c, *z;
    dl_capture *cap;
    int64_t k;
    int ok = 1, rep;
    z = dl_keep(dl_zeros_dtype(ctx, DL_SHAPE(10000), DL_DTYPE_I64));
    cap = dl_capture_begin(ctx);
    a = dl_arange_dtype(ctx, 1099511627776.0, 1099511657776.0, 3, DL_DTYPE_I64);
    b = dl_arange_dtype(ctx, -2147483648.0, 0, 1073741824.0, DL_DTYPE_I32);
    c = dl_arange_dtype(ctx, 0, 5, 1, DL_DTYPE_I64);
    CHECK(a && b && c && dl_capture_end(cap) == DL_OK, "integer aranges captured: %s", dl_error_message(ctx));
    for (rep = 0; rep < 2 && a && b && c; rep++) {
        CHECK(dl_copy_(a, z) == DL_OK && dl_copy_(c, dl_narrow(z, 0, 0, 5)) == DL_OK && dl_replay(cap) == DL_OK,
              "replay %d: %s", rep, dl_error_message(ctx));
        CHECK(dl_read_int64(a, o, 10000) == DL_OK, "read");
        for (k = 0; k < 10000; k++) ok &= o[k] == 1099511627776LL + 3 * k;
        CHECK(dl_read_int64(b, o, 2) == DL_OK && o[0] == INT32_MIN && o[1] == -1073741824 &&
              dl_read_int64(c, o, 5) == DL_OK && o[0] == 0 && o[4] == 4, "int32 and small replayed");
    }
    CHECK(ok, "arange(2^40, 2^40 + 30000, 3) replayed: every value");
    dl_capture_free(cap);
    dl_ctx_free(ctx);
}

#define RN 4
/* RN training steps: step's eagerly, or the first eager, the second
   captured and the last two replays; every parameter (p, np) after each
   run into out; returns the count */
typedef struct cap_model { dl_module *m; dl_optim *o; dl_tensor *x, *h0, *c0, *kpm; int kind; } cap_model;
static int cap_runs(dl_ctx *ctx, bool capture, const char *what, bool (*step)(cap_model *), cap_model *u,
                    float *out)
{
    const dl_named_tensor *p;
    dl_capture *cap = NULL;
    int run, i, k = 0, np = dl_module_named_parameters(u->m, &p);
    for (run = 0; run < RN; run++) {
        if (capture && run == 1) cap = dl_capture_begin(ctx);
        if (!capture || run <= 1) {
            dl_optim_zero_grad(u->o);
            CHECK(step(u) && dl_optim_step(u->o) == DL_OK, "%s step %d: %s", what, run, dl_error_message(ctx));
            if (cap) CHECK(dl_capture_end(cap) == DL_OK, "%s captured: %s", what, dl_error_message(ctx));
        } else {
            CHECK(dl_replay(cap) == DL_OK, "%s replayed: %s", what, dl_error_message(ctx));
        }
        for (i = 0; i < np; i++) {
            CHECK(dl_read(p[i].t, out + k, p[i].t->numel) == DL_OK, "read %s", p[i].name);
            k += (int)p[i].t->numel;
        }
        if (!capture || run == 0) dl_step_end(ctx);
    }
    if (cap) dl_capture_free(cap);
    return k;
}

/* an LSTM and a GRU training step (2 layers, bidirectional, dropout
   between layers, a learned initial state; SGD), 4 steps eager, then
   captured once and replayed three times: the same bits */
static bool rnn_step(cap_model *u)
{
    dl_tensor *hn, *cn = NULL, *y = dl_rnn_forward(u->m, u->x, u->h0, u->c0, &hn, u->kind ? NULL : &cn);
    dl_tensor *l = dl_add(dl_mean(dl_mul(y, y), DL_ALL, false), dl_sum(hn, DL_ALL, false));
    if (cn) l = dl_add(l, dl_mean(cn, DL_ALL, false));
    return l && dl_backward(l) == DL_OK;
}
static void rnn_run(int kind, bool capture, float *out, int *nout)
{
    dl_ctx *ctx = new_ctx(41);
    dl_rnn_desc d;
    dl_sgd_desc sd;
    cap_model u;
    const dl_named_tensor *p;
    memset(&d, 0, sizeof d);
    d.num_layers = 2;
    d.bidirectional = true;
    d.dropout = 0.25f;
    d.batch_first = kind == 1;
    memset(&u, 0, sizeof u);
    u.kind = kind;
    u.m = kind ? dl_nn_gru(ctx, 3, 5, &d) : dl_nn_lstm(ctx, 3, 5, &d);
    u.h0 = dl_module_param(u.m, "h0", dl_zeros(ctx, DL_SHAPE(4, 2, 5)));
    u.c0 = kind ? NULL : dl_keep(dl_zeros(ctx, DL_SHAPE(4, 2, 5)));   /* (an LSTM takes both or neither) */
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.05f;
    sd.momentum = 0.9f;
    u.o = dl_sgd(u.m, &sd);
    u.x = dl_keep(dl_randn(ctx, kind ? DL_SHAPE(2, 6, 3) : DL_SHAPE(6, 2, 3)));   /* (GRU: batch_first) */
    CHECK(u.o && u.x && u.h0 && dl_module_named_parameters(u.m, &p) == 17, "%s capture: made: %s",
          kind ? "GRU" : "LSTM", dl_error_message(ctx));
    *nout = cap_runs(ctx, capture, kind ? "GRU" : "LSTM", rnn_step, &u, out);
    dl_ctx_free(ctx);
}
static void test_rnn_replay(void)
{
    static float e[RN * 1200], c[RN * 1200];
    int kind, ne = 0, nc = 0;
    for (kind = 0; kind < 2; kind++) {
        memset(e, 0, sizeof e);
        memset(c, 0xff, sizeof c);
        rnn_run(kind, false, e, &ne);
        rnn_run(kind, true, c, &nc);
        CHECK(ne == nc && ne > 0 && ne <= RN * 1200 && memcmp(e, c, sizeof(float) * (size_t)ne) == 0,
              "%s training step: captured and replayed = eager, bit for bit (%d floats)", kind ? "GRU" : "LSTM", ne);
    }
}

/* a MultiheadAttention training step (self-attention, dropout 0.25, a key
   padding mask with the causal mask, the averaged weights in the loss;
   SGD), 4 steps eager, then captured once and replayed three times: the
   same bits */
static bool mha_step(cap_model *u)
{
    dl_tensor *w, *y = dl_mha_forward(u->m, u->x, u->x, u->x, u->kpm, NULL, true, &w);
    dl_tensor *l = dl_add(dl_mean(dl_mul(y, y), DL_ALL, false), dl_mean(dl_mul(w, w), DL_ALL, false));
    return l && dl_backward(l) == DL_OK;
}
static void mha_run(bool capture, float *out, int *nout)
{
    static const int64_t pad[10] = {0, 0, 0, 0, 1, 0, 0, 0, 1, 1};
    dl_ctx *ctx = new_ctx(43);
    dl_sgd_desc sd;
    cap_model u;
    memset(&u, 0, sizeof u);
    u.m = dl_nn_multihead_attention(ctx, 8, 2, 0.25f, true);
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.05f;
    sd.momentum = 0.9f;
    u.o = dl_sgd(u.m, &sd);
    u.x = dl_keep(dl_randn(ctx, DL_SHAPE(2, 5, 8)));
    u.kpm = dl_keep(dl_from_int64(ctx, DL_SHAPE(2, 5), pad));
    CHECK(u.o && u.x && u.kpm, "MHA capture: made: %s", dl_error_message(ctx));
    *nout = cap_runs(ctx, capture, "MHA", mha_step, &u, out);
    dl_ctx_free(ctx);
}
static void test_mha_replay(void)
{
    static float e[RN * 300], c[RN * 300];
    int ne = 0, nc = 0;
    memset(e, 0, sizeof e);
    memset(c, 0xff, sizeof c);
    mha_run(false, e, &ne);
    mha_run(true, c, &nc);
    CHECK(ne == nc && ne == RN * 288 && memcmp(e, c, sizeof(float) * (size_t)ne) == 0,
          "MultiheadAttention training step: captured and replayed = eager, bit for bit (%d floats)", ne);
}

/* zero_grad inside a capture. On a GPU (real or emulated) it launches
   nothing: the backward's first sum into each gradient writes it (0 + g),
   and whatever else touches a zeroed gradient first writes the zeros. Each
   mode runs a warm-up step (non-zero gradients), then its step eagerly
   three times, or captured (the capture's run) and replayed twice, and
   keeps what it read and every gradient and parameter after each run: the
   same bits both ways.
     0 zero_grad, backward, step
     1 a read of a zeroed gradient before the backward (0)
     2 the same through a view made before the zero_grad
     3 a layer without a gradient this step (its gradient stays zero)
     4 zero_grad, backward, zero_grad, backward, step
     5 zero_grad, two backwards summed, step
   and the backward's last sums, which inside a capture on a GPU wait for
   the optimizer's launch to make them (dl__mtacc):
     6 a read of a gradient between the backward and the step
     7 the same through a view made before the backward */
#define ZN 53   /* the floats one run keeps: 1 read, then L0 w (12), b (4), L1 w (8), b (2), their grads */
static void zero_run(int mode, bool capture, float *out)
{
    dl_ctx *ctx = new_ctx(31);
    dl_module *layers[2], *net;
    dl_optim *o;
    dl_sgd_desc sd;
    dl_capture *cap = NULL;
    dl_tensor *x, *r = NULL;
    const dl_named_tensor *p;
    int run, np, i;
    float xv[6] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f};
    layers[0] = dl_nn_linear(ctx, 3, 4, true);
    layers[1] = dl_nn_linear(ctx, 4, 2, true);
    net = dl_nn_sequential(ctx, 2, layers);
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.1f;
    o = dl_sgd(net, &sd);
    x = dl_keep(dl_from_array(ctx, DL_SHAPE(2, 3), xv));
    np = dl_module_named_parameters(net, &p);
    CHECK(np == 4 && o && x && dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false)) == DL_OK &&
          dl_optim_step(o) == DL_OK, "zero_grad in a capture, mode %d: warm-up: %s", mode, dl_error_message(ctx));
    dl_step_end(ctx);
    for (run = 0; run < 3; run++) {
        float *q = out + run * ZN;
        if (capture && run == 0) cap = dl_capture_begin(ctx);
        if (!capture || run == 0) {
            dl_tensor *v = mode == 2 || mode == 7 ? dl_reshape(p[0].t->grad, DL_SHAPE(12)) : NULL, *y;
            dl_optim_zero_grad(o);
            if (mode == 1) r = dl_sum(p[0].t->grad, DL_ALL, false);
            if (mode == 2) r = dl_sum(v, DL_ALL, false);
            y = dl_module_forward(mode == 3 ? layers[0] : net, x);
            dl_backward(dl_sum(dl_mul(y, y), DL_ALL, false));
            if (mode == 6) r = dl_sum(p[0].t->grad, DL_ALL, false);
            if (mode == 7) r = dl_sum(v, DL_ALL, false);
            if (mode == 4) dl_optim_zero_grad(o);
            if (mode == 4 || mode == 5) dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false));
            dl_optim_step(o);
            if (capture) CHECK(dl_capture_end(cap) == DL_OK, "zero_grad in a capture, mode %d: %s", mode,
                               dl_error_message(ctx));
        } else {
            CHECK(dl_replay(cap) == DL_OK, "zero_grad in a capture, mode %d: replay: %s", mode, dl_error_message(ctx));
        }
        q[0] = 0.0f;
        if (r) CHECK(dl_read(r, q, 1) == DL_OK, "zero_grad in a capture, mode %d: read", mode);
        for (i = 0, q++; i < np; i++) {
            CHECK(dl_read(p[i].t, q, p[i].t->numel) == DL_OK && dl_read(p[i].t->grad, q + 26, p[i].t->numel) == DL_OK,
                  "zero_grad in a capture, mode %d: %s", mode, p[i].name);
            q += p[i].t->numel;
        }
        if (!capture) dl_step_end(ctx);
    }
    if (cap) dl_capture_free(cap);
    dl_ctx_free(ctx);
}

static void test_zero_grad_inside(void)
{
    static const char *const what[8] = {"plain", "a read of a zeroed gradient", "a read through a view made before",
                                        "a layer without a gradient", "zero_grad twice", "two backwards summed",
                                        "a read of a gradient before the step", "the same through a view"};
    float e[3 * ZN], c[3 * ZN];
    int mode, k;
    for (mode = 0; mode < 8; mode++) {
        memset(e, 0, sizeof e);
        memset(c, 0xff, sizeof c);
        zero_run(mode, false, e);
        zero_run(mode, true, c);
        CHECK(memcmp(e, c, sizeof e) == 0, "zero_grad inside a capture, %s: the eager bits", what[mode]);
        if (mode >= 6)
            CHECK(e[0] != 0.0f && c[0] == e[0] && c[ZN] == e[ZN],
                  "zero_grad inside a capture, %s: the sum's value (%g, %g)", what[mode], (double)e[0], (double)c[0]);
        if (mode == 1 || mode == 2)
            CHECK(e[0] == 0.0f && c[0] == 0.0f && c[ZN] == 0.0f && c[2 * ZN] == 0.0f,
                  "zero_grad inside a capture, %s: 0 (%g, %g)", what[mode], (double)c[0], (double)c[ZN]);
        if (mode == 3)
            for (k = 0; k < 3; k++)
                CHECK(c[k * ZN + 27 + 16] == 0.0f && c[k * ZN + 26 + 26] == 0.0f,
                      "zero_grad inside a capture, a layer without a gradient: its gradient zero after run %d", k);
    }
}

/* a capture that fails after zero_grad leaves no mark: an eager backward
   afterwards adds to the gradients as they are (on a GPU nothing of the
   capture ran; on the CPU what ran before the refusal did) */
static void test_zero_grad_failed(void)
{
    dl_ctx *ctx = new_ctx(32);
    dl_module *net = dl_nn_linear(ctx, 3, 4, true);
    dl_optim *o;
    dl_sgd_desc sd;
    dl_capture *cap;
    dl_tensor *x, *w;
    const dl_named_tensor *p;
    float xv[6] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f}, g0[12], g[12], g1[12];
    int i, same = 1;
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.1f;
    o = dl_sgd(net, &sd);
    x = dl_keep(dl_from_array(ctx, DL_SHAPE(2, 3), xv));
    w = dl_module_named_parameters(net, &p) == 2 ? p[0].t : NULL;
    CHECK(o && x && w && dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false)) == DL_OK &&
          dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false)) == DL_OK,
          "zero_grad in a failed capture: warm-up: %s", dl_error_message(ctx));
    dl_step_end(ctx);
    cap = dl_capture_begin(ctx);
    dl_optim_zero_grad(o);
    (void)dl_item(dl_sum(dl_module_forward(net, x), DL_ALL, false));   /* refused: the capture fails */
    CHECK(dl_capture_end(cap) != DL_OK, "zero_grad in a failed capture: the capture fails");
    dl_capture_free(cap);
    CHECK(dl_read(w->grad, g0, 12) == DL_OK, "zero_grad in a failed capture: read");
    dl_step_end(ctx);
    CHECK(dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false)) == DL_OK && dl_read(w->grad, g1, 12) == DL_OK,
          "zero_grad in a failed capture: eager backward: %s", dl_error_message(ctx));
    dl_step_end(ctx);
    dl_optim_zero_grad(o);
    CHECK(dl_backward(dl_sum(dl_module_forward(net, x), DL_ALL, false)) == DL_OK && dl_read(w->grad, g, 12) == DL_OK,
          "zero_grad in a failed capture: the gradient alone");
    for (i = 0; i < 12; i++) same &= g1[i] == g0[i] + g[i];
    CHECK(same, "zero_grad in a failed capture: the eager backward after it adds (%g + %g = %g)", (double)g0[0],
          (double)g[0], (double)g1[0]);
    dl_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;   /* (make valgrind): the MLP only */
    if (!quick) {
        test_equivalence(NET_LENET, OPT_ADAM, 3, "LeNet-BN, dropout, Adam");
        test_equivalence(NET_LENET, OPT_ADAMW, 2, "LeNet-BN, dropout, AdamW");
        test_equivalence(NET_LENET, OPT_SGD, 5, "LeNet-BN, dropout, SGD nesterov");
        test_equivalence(NET_D2L, OPT_ADAM, 3, "d2l LeNet, Adam");
        test_equivalence(NET_RESNET, OPT_SGD, 2, "small ResNet (a user module), SGD nesterov");
    }
    test_equivalence(NET_MLP, OPT_ADAM, 2, "MLP, dropout, Adam");
    test_memory();
    test_refusals();
    test_lifetimes();
    test_list_change();
    test_eq_replay();
    test_select_replay();
    test_unary_replay();
    test_split_replay();
    test_scan_replay();
    test_arange_replay();
    test_rnn_replay();
    test_mha_replay();
    test_gan_flags();
    test_zero_grad_inside();
    test_zero_grad_failed();
    CHECK(cnt_live == 0, "every allocation freed (%ld live)", cnt_live);
    TEST_END();
}
