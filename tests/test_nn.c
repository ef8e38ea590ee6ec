/* tests/test_nn.c - modules, initializers, optimizers, LR schedules, gradient
   clipping and safetensors checkpoints.

   Optimizer trajectories, clipping and schedules are compared with PyTorch
   values from tests/golden/gen_optim.py (tests/golden/optim.bin, same format
   as core.bin) at |got - want| <= 1e-7 + 1e-5 |want|; a checkpoint written by
   torch (tests/golden/torch_written.safetensors) is loaded. A counting
   allocator checks that nothing leaks and that an optimizer step does not
   allocate.
   Run from the repository root:
       test_nn                  all tests
       test_nn --write FILE     also write the checkpoint that
                                `python3 tests/golden/gen_optim.py --verify FILE` reads
   Build: gcc -std=c99 -Wall -Wextra -Werror -pedantic -O2 -I. tests/test_nn.c -lm -lpthread */
#include <stdlib.h>
#include <string.h>
#include "count_alloc.h"   /* cnt_live, cnt_calls */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdio.h>

#define O_RTOL 1e-5
#define O_ATOL 1e-7

static char g_tmp[256];           /* a per-process prefix for files under /tmp */

static dl_ctx *new_ctx(uint64_t seed)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.seed = seed;
    return dl_ctx_init(&d);
}

static const char *tmp_path(const char *name)
{
    static char buf[8][320];
    static int k;
    char *b = buf[k++ & 7];
    snprintf(b, 320, "%s_%s", g_tmp, name);
    return b;
}

/* ------------------------------------------------------------------ golden file */

typedef struct grec { char *name; int ndim; int64_t shape[DL_MAX_DIMS]; int64_t numel; float *v; } grec;
static grec *g_recs;
static long g_nrec;

static uint32_t rd_u32(const unsigned char *b) { return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24); }

static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    long sz;
    unsigned char *buf;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    buf = (unsigned char *)malloc((size_t)sz + 1);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) { fclose(f); free(buf); return NULL; }
    fclose(f);
    *len = (size_t)sz;
    return buf;
}

/* a trusted file of our own, but still bounds-checked */
static int g_load(const char *path)
{
    size_t len = 0, pos = 16;
    unsigned char *b = read_file(path, &len);
    uint32_t count, i;
    if (!b || len < 16 || memcmp(b, "DLGOLD1\0", 8) != 0 || rd_u32(b + 8) != 1) {
        printf("ERROR: cannot read golden file %s (run from the repo root; regenerate with "
               "python3 tests/golden/gen_optim.py)\n", path);
        free(b);
        return 0;
    }
    count = rd_u32(b + 12);
    if (count > len / 8) { free(b); return 0; }
    g_recs = (grec *)calloc(count + 1, sizeof(grec));
    for (i = 0; i < count; i++) {
        grec *r = &g_recs[i];
        uint32_t nl, nd, k;
        int64_t numel = 1;
        if (len - pos < 4) goto bad;
        nl = rd_u32(b + pos); pos += 4;
        if (nl == 0 || nl > 256 || len - pos < nl) goto bad;
        r->name = (char *)malloc(nl + 1);
        memcpy(r->name, b + pos, nl); r->name[nl] = 0; pos += nl;
        g_nrec = (long)i + 1;
        if (len - pos < 4) goto bad;
        nd = rd_u32(b + pos); pos += 4;
        if (nd > DL_MAX_DIMS || len - pos < 8 * (size_t)nd) goto bad;
        r->ndim = (int)nd;
        for (k = 0; k < nd; k++) {
            uint64_t u = (uint64_t)rd_u32(b + pos) | ((uint64_t)rd_u32(b + pos + 4) << 32);
            pos += 8;
            if (u > 1u << 20) goto bad;
            r->shape[k] = (int64_t)u;
            numel *= r->shape[k];
        }
        if ((uint64_t)numel > (len - pos) / 4) goto bad;
        r->numel = numel;
        r->v = (float *)malloc(sizeof(float) * (size_t)(numel ? numel : 1));
        memcpy(r->v, b + pos, sizeof(float) * (size_t)numel);
        pos += 4 * (size_t)numel;
    }
    free(b);
    return 1;
bad:
    printf("ERROR: %s is malformed\n", path);
    free(b);
    return 0;
}

static void g_free(void)
{
    long i;
    for (i = 0; i < g_nrec; i++) { free(g_recs[i].name); free(g_recs[i].v); }
    free(g_recs);
    g_recs = NULL;
    g_nrec = 0;
}

static const grec *g_get(const char *name)
{
    long i;
    for (i = 0; i < g_nrec; i++) if (strcmp(g_recs[i].name, name) == 0) return &g_recs[i];
    printf("FAIL: golden record %s is missing\n", name);
    th_fail++;
    return NULL;
}

/* compare n floats with the tolerance; report the worst */
static void cmp(const char *what, const float *got, const float *want, long n)
{
    long i, worst = -1;
    double wr = 0;
    for (i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]), lim = O_ATOL + O_RTOL * fabs((double)want[i]);
        double r = d / lim;
        if (!(d <= lim) && (worst < 0 || r > wr || got[i] != got[i])) { worst = i; wr = r; }
    }
    CHECK(worst < 0, "%s: element %ld: dl %.9g, torch %.9g", what, worst,
          worst >= 0 ? (double)got[worst] : 0.0, worst >= 0 ? (double)want[worst] : 0.0);
}

/* ------------------------------------------------------------------ helpers */


static dl_tensor *mse(dl_module *m, dl_tensor *x, dl_tensor *y)
{
    dl_tensor *d = dl_sub(dl_module_forward(m, x), y);
    return dl_mean(dl_mul(d, d), DL_ALL, false);
}

/* ------------------------------------------------------------------ modules */

typedef struct block_state { dl_module *fc1, *fc2, *act; dl_tensor *scale, *running; } block_state;

/* y = x + scale * fc2(act(fc1(x))); running += mean(x) in training mode (like a BN buffer) */
static dl_tensor *block_forward(dl_module *m, dl_tensor *x)
{
    block_state *s = (block_state *)dl_module_state(m);
    dl_tensor *h = dl_module_forward(s->fc2, dl_module_forward(s->act, dl_module_forward(s->fc1, x)));
    if (dl_module_training(m) && x) th_set(s->running, 0, th_f(s->running, 0) + 1.0f);
    return dl_add(x, dl_mul(h, s->scale));
}

static dl_module *block_new(dl_ctx *ctx, int64_t dim)
{
    dl_module *m = dl_module_new(ctx, "Block", block_forward, sizeof(block_state));
    block_state *s;
    int64_t cnt = 0;
    if (!m) return NULL;
    s = (block_state *)dl_module_state(m);
    s->scale = dl_module_param(m, "scale", dl_full(ctx, DL_SHAPE(1), 0.5f));
    s->running = dl_module_buffer(m, "running", dl_zeros(ctx, DL_SHAPE(1)));
    dl_module_buffer(m, "count", dl_from_int64(ctx, DL_SHAPE(1), &cnt));
    s->fc1 = dl_module_add(m, "fc1", dl_nn_linear(ctx, dim, 2 * dim, true));
    s->act = dl_module_add(m, "act", dl_nn_relu(ctx));
    s->fc2 = dl_module_add(m, "fc2", dl_nn_linear(ctx, 2 * dim, dim, false));
    return s->scale && s->running && s->fc1 && s->act && s->fc2 ? m : NULL;
}

static void test_modules(void)
{
    dl_ctx *ctx = new_ctx(1);
    dl_module *mods[3], *seq, *net, *blk, *head;
    dl_tensor *ts[16] = {NULL}, *x, *y, *loss;   /* NULL: read below even if n < 4 */
    const dl_named_tensor *sd;
    char names[16][128];
    int n, i;
    static const char *seq_names[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    static const char *net_names[] = {"block.scale", "block.running", "block.count",
                                      "block.fc1.weight", "block.fc1.bias", "block.fc2.weight",
                                      "head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"};

    /* Sequential(Linear(4,3), ReLU, Linear(3,2)): PyTorch's state_dict names */
    mods[0] = dl_nn_linear(ctx, 4, 3, true);
    mods[1] = dl_nn_relu(ctx);
    mods[2] = dl_nn_linear(ctx, 3, 2, true);
    seq = dl_nn_sequential(ctx, 3, mods);
    n = dl_module_state_dict(seq, &sd);
    CHECK(n == 4, "sequential: %d tensors", n);
    for (i = 0; i < n && i < 4; i++) {
        ts[i] = sd[i].t;
        CHECK(strcmp(sd[i].name, seq_names[i]) == 0 && !sd[i].is_buffer, "name %d: %s", i, sd[i].name);
    }
    CHECK(dl_module_named_parameters(seq, &sd) == 4 && sd[3].t == ts[3], "named_parameters: the same 4");
    CHECK(dl_module_num_params(seq) == 4 * 3 + 3 + 3 * 2 + 2, "num_params %lld", (long long)dl_module_num_params(seq));
    CHECK(dl_module_get(seq, "2.bias") == ts[3] && ts[3]->ndim == 1 && ts[3]->shape[0] == 2, "get 2.bias");
    CHECK(ts[0]->requires_grad && ts[0]->step_ == 0 && ts[0]->shape[0] == 3 && ts[0]->shape[1] == 4,
          "weight (out,in), persistent, requires grad");
    CHECK(dl_module_child(seq, "1") == mods[1] && dl_module_child(seq, "3") == NULL, "child lookup");
    CHECK(strcmp(dl_module_type(mods[0]), "Linear") == 0, "type");
    CHECK(dl_module_get(seq, "1.weight") == NULL, "get missing");
    EXPECT_ERR(ctx, DL_ERR_ARG, "1.weight");
    CHECK(dl_module_get(seq, "0.nope") == NULL, "get missing 2");
    EXPECT_ERR(ctx, DL_ERR_ARG, "nope");

    /* forward: x (5,4) -> (5,2) equals the hand-written computation */
    x = dl_randn(ctx, DL_SHAPE(5, 4));
    y = dl_module_forward(seq, x);
    {
        dl_tensor *ref = dl_add(dl_matmul(dl_relu(dl_add(dl_matmul(x, dl_transpose(ts[0], 0, 1)), ts[1])),
                                          dl_transpose(ts[2], 0, 1)), ts[3]);
        CHECK(y && ref && y->ndim == 2 && y->shape[0] == 5 && y->shape[1] == 2 &&
              th_close(th_host(y), th_host(ref), 10, 1e-6, 1e-6, NULL), "sequential forward");
    }
    CHECK(dl_module_forward(seq, NULL) == NULL && dl_last_error(ctx) == DL_OK, "NULL x: NULL, silently");
    CHECK(dl_module_forward(seq, dl_randn(ctx, DL_SHAPE(5, 7))) == NULL, "bad in_features");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "in_features=4");
    /* 1-D input, as torch */
    y = dl_module_forward(mods[0], dl_randn(ctx, DL_SHAPE(4)));
    CHECK(y && y->ndim == 1 && y->shape[0] == 3, "Linear on a 1-D input");

    /* a nested user module with its own param, buffers (float, int64) and children */
    net = dl_module_new(ctx, "Net", NULL, 0);
    blk = dl_module_add(net, "block", block_new(ctx, 3));
    mods[0] = dl_nn_linear(ctx, 3, 4, true);
    mods[1] = dl_nn_tanh(ctx);
    mods[2] = dl_nn_linear(ctx, 4, 2, true);
    head = dl_module_add(net, "head", dl_nn_sequential(ctx, 3, mods));
    CHECK(blk && head, "build nested");
    n = dl_module_state_dict(net, &sd);
    CHECK(n == 10, "nested: %d tensors", n);
    for (i = 0; i < n && i < 10; i++)
        CHECK(strcmp(sd[i].name, net_names[i]) == 0 && sd[i].is_buffer == (i == 1 || i == 2),
              "nested name %d: %s want %s", i, sd[i].name, net_names[i]);
    n = dl_module_named_parameters(net, &sd);
    for (i = 0; i < n && i < 16; i++) { ts[i] = sd[i].t; snprintf(names[i], sizeof names[i], "%s", sd[i].name); }
    CHECK(n == 8 && strcmp(names[1], "block.fc1.weight") == 0, "params only: %d", n);
    CHECK(dl_module_num_params(net) == 1 + 3 * 6 + 6 + 6 * 3 + 3 * 4 + 4 + 4 * 2 + 2, "nested num_params %lld",
          (long long)dl_module_num_params(net));
    CHECK(dl_module_get(net, "block.count")->dtype == DL_DTYPE_I64, "int64 buffer");
    CHECK(!dl_module_get(net, "block.running")->requires_grad, "buffer has no grad");
    CHECK(dl_module_get(net, "head.2.weight") == ts[6], "get nested");

    /* forward through the user module (no forward on Net: call children), backward, grads */
    CHECK(dl_module_forward(net, x) == NULL, "container without forward");
    EXPECT_ERR(ctx, DL_ERR_ARG, "no forward");
    x = dl_randn(ctx, DL_SHAPE(6, 3));
    loss = dl_mean(dl_module_forward(head, dl_module_forward(blk, x)), DL_ALL, false);
    CHECK(loss && dl_backward(loss) == DL_OK, "backward through nested modules");
    for (i = 0; i < n; i++) CHECK(ts[i]->grad != NULL, "grad for %s", names[i]);
    CHECK(th_host(dl_module_get(net, "block.running"))[0] == 1.0f, "buffer updated in training");

    /* train / eval propagate */
    CHECK(dl_module_training(net) && dl_module_training(mods[1]), "training by default");
    dl_module_train(net, false);
    CHECK(!dl_module_training(net) && !dl_module_training(blk) && !dl_module_training(mods[2]) &&
          !dl_module_training(dl_module_child(blk, "fc1")), "eval propagates");
    dl_module_forward(blk, x);
    CHECK(th_host(dl_module_get(net, "block.running"))[0] == 1.0f, "buffer not updated in eval");
    dl_module_train(blk, true);
    CHECK(!dl_module_training(net) && dl_module_training(blk) && dl_module_training(dl_module_child(blk, "fc2")), "train subtree");

    /* zero_grad */
    dl_module_zero_grad(net);
    CHECK(th_host(ts[0]->grad)[0] == 0.0f && th_host(ts[7]->grad)[1] == 0.0f, "zero_grad");

    /* shared parameters are counted once */
    {
        dl_module *tw = dl_module_new(ctx, "Tied", NULL, 0);
        dl_module *l = dl_nn_linear(ctx, 2, 2, false);
        dl_module_add(tw, "a", l);
        dl_module_add(tw, "b", l);
        const dl_named_tensor *st;
        CHECK(dl_module_state_dict(tw, &st) == 2 && strcmp(st[1].name, "b.weight") == 0 && st[0].t == st[1].t &&
              dl_module_named_parameters(tw, &st) == 1 && strcmp(st[0].name, "a.weight") == 0 &&
              dl_module_num_params(tw) == 4, "shared: 2 state_dict names, 1 named parameter, 4 params");
    }

    /* errors */
    CHECK(dl_module_param(mods[1], "w.x", dl_zeros(ctx, DL_SHAPE(2))) == NULL, "dot in name");
    EXPECT_ERR(ctx, DL_ERR_ARG, "without '.'");
    CHECK(dl_module_param(blk, "scale", dl_zeros(ctx, DL_SHAPE(2))) == NULL, "duplicate");
    EXPECT_ERR(ctx, DL_ERR_ARG, "already has");
    CHECK(dl_module_add(blk, "fc1", dl_nn_relu(ctx)) == NULL, "duplicate child");
    EXPECT_ERR(ctx, DL_ERR_ARG, "already has");
    CHECK(dl_module_add(blk, "loop", net) == NULL, "cycle");
    EXPECT_ERR(ctx, DL_ERR_ARG, "cycle");
    {
        int64_t v[2] = {1, 2};
        CHECK(dl_module_param(blk, "ip", dl_from_int64(ctx, DL_SHAPE(2), v)) == NULL, "int param");
        EXPECT_ERR(ctx, DL_ERR_DTYPE, "float32");
    }
    CHECK(dl_module_param(blk, "nothing", NULL) == NULL && dl_last_error(ctx) == DL_OK, "NULL init silent");
    CHECK(dl_nn_linear(ctx, 0, 3, true) == NULL, "linear 0");
    EXPECT_ERR(ctx, DL_ERR_ARG, "in_features=0");
    CHECK(dl_nn_sequential(ctx, 2, mods) != NULL, "sequential reuse ok");
    {
        dl_module *bad[2];
        bad[0] = dl_nn_relu(ctx);
        bad[1] = NULL;
        CHECK(dl_nn_sequential(ctx, 2, bad) == NULL && dl_last_error(ctx) == DL_OK, "NULL child: silent");
    }
    /* activations, flatten */
    {
        dl_tensor *im = dl_randn(ctx, DL_SHAPE(2, 3, 4, 5));
        dl_tensor *f = dl_module_forward(dl_nn_flatten(ctx), im);
        dl_tensor *g = dl_module_forward(dl_nn_gelu(ctx), im), *s = dl_module_forward(dl_nn_sigmoid(ctx), im);
        CHECK(f && f->ndim == 2 && f->shape[0] == 2 && f->shape[1] == 60, "flatten(1,-1)");
        CHECK(g && s && th_close(th_host(g), th_host(dl_gelu(im)), 120, 0, 0, NULL) &&
              th_close(th_host(s), th_host(dl_sigmoid(im)), 120, 0, 0, NULL), "gelu, sigmoid modules");
    }
    dl_step_end(ctx);
    /* parameters work across steps (persistent) */
    x = dl_randn(ctx, DL_SHAPE(2, 4));
    CHECK(dl_module_forward(seq, x) != NULL, "forward in a later step");
    dl_ctx_free(ctx);
}

static void stats(const float *x, long n, double *mean, double *sd, double *amax)
{
    long i;
    double s = 0, s2 = 0, m = 0;
    for (i = 0; i < n; i++) { s += x[i]; if (fabs(x[i]) > m) m = fabs(x[i]); }
    s /= (double)n;
    for (i = 0; i < n; i++) s2 += (x[i] - s) * (x[i] - s);
    *mean = s;
    *sd = sqrt(s2 / (double)n);
    *amax = m;
}

static void test_init(void)
{
    dl_ctx *ctx = new_ctx(5);
    dl_module *lin = dl_nn_linear(ctx, 256, 512, true);
    dl_tensor *w = dl_module_get(lin, "weight"), *b = dl_module_get(lin, "bias"), *t;
    double mean, sd, amax, bound = 1.0 / 16.0;
    /* Linear: U(-1/sqrt(in), 1/sqrt(in)) for both */
    stats(th_host(w), (long)w->numel, &mean, &sd, &amax);
    CHECK(amax <= bound && amax > 0.99 * bound, "linear weight bound %g vs %g", amax, bound);
    CHECK(fabs(mean) < 0.002 && fabs(sd - bound / sqrt(3.0)) < 0.02 * bound / sqrt(3.0), "linear weight stats %g %g", mean, sd);
    stats(th_host(b), (long)b->numel, &mean, &sd, &amax);
    CHECK(amax <= bound && amax > 0.95 * bound, "linear bias bound %g", amax);

    t = dl_keep(dl_zeros(ctx, DL_SHAPE(128, 64, 3, 3)));
    CHECK(dl_fan_in(t) == 576 && dl_fan_out(t) == 1152, "fans %lld %lld", (long long)dl_fan_in(t), (long long)dl_fan_out(t));
    dl_init_kaiming_uniform(t, 0.0f);   /* bound sqrt(6/576) */
    stats(th_host(t), (long)t->numel, &mean, &sd, &amax);
    bound = sqrt(6.0 / 576.0);
    CHECK(amax <= bound * (1 + 1e-6) && amax > 0.999 * bound && fabs(sd - bound / sqrt(3.0)) < 0.01 * bound,
          "kaiming_uniform %g %g", amax, sd);
    dl_init_kaiming_normal(t, 0.1f);    /* std sqrt(2/1.01)/24 */
    stats(th_host(t), (long)t->numel, &mean, &sd, &amax);
    CHECK(fabs(sd - sqrt(2.0 / 1.01) / 24.0) < 0.01 * sd && fabs(mean) < 0.01 * sd, "kaiming_normal sd %g", sd);
    dl_init_xavier_uniform(t, 2.0f);    /* bound 2*sqrt(6/(576+1152)) */
    stats(th_host(t), (long)t->numel, &mean, &sd, &amax);
    bound = 2.0 * sqrt(6.0 / 1728.0);
    CHECK(amax <= bound * (1 + 1e-6) && amax > 0.999 * bound, "xavier_uniform %g vs %g", amax, bound);
    dl_init_xavier_normal(t, 1.0f);
    stats(th_host(t), (long)t->numel, &mean, &sd, &amax);
    CHECK(fabs(sd - sqrt(2.0 / 1728.0)) < 0.01 * sd, "xavier_normal sd %g", sd);
    dl_init_normal(t, 3.0f, 0.5f);
    stats(th_host(t), (long)t->numel, &mean, &sd, &amax);
    CHECK(fabs(mean - 3.0) < 0.01 && fabs(sd - 0.5) < 0.01, "normal %g %g", mean, sd);
    dl_init_uniform(t, -2.0f, 1.0f);
    stats(th_host(t), (long)t->numel, &mean, &sd, &amax);
    CHECK(fabs(mean + 0.5) < 0.01 && amax <= 2.0, "uniform %g", mean);
    dl_init_constant(t, 0.25f);
    stats(th_host(t), (long)t->numel, &mean, &sd, &amax);
    CHECK(mean == 0.25 && sd == 0.0, "constant");
    /* 1-D: no fan */
    dl_init_kaiming_uniform(b, 0.0f);
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "fewer than 2 dims");
    CHECK(dl_fan_in(b) == -1, "fan_in 1-D");
    /* same seed, same init */
    {
        dl_ctx *c2 = new_ctx(5);
        dl_module *l2 = dl_nn_linear(c2, 256, 512, true);
        CHECK(memcmp(th_host(dl_module_get(l2, "weight")), th_host(w), 4 * (size_t)w->numel) == 0, "seeded init is reproducible");
        dl_ctx_free(c2);
    }
    dl_ctx_free(ctx);
}

/* ------------------------------------------------------------------ optimizers vs torch */

static dl_optim *make_opt(const char *cfg, dl_module *m)
{
    const grec *h;
    char key[128];
    snprintf(key, sizeof key, "%s/hyper", cfg);
    h = g_get(key);
    if (!h) return NULL;
    if (strncmp(cfg, "sgd", 3) == 0) {
        dl_sgd_desc d;
        memset(&d, 0, sizeof d);
        d.lr = h->v[0]; d.momentum = h->v[1]; d.dampening = h->v[2]; d.weight_decay = h->v[3];
        d.nesterov = h->v[4] != 0.0f;
        return dl_sgd(m, &d);
    } else {
        dl_adam_desc d; memset(&d, 0, sizeof d);
        d.lr = h->v[0]; d.beta1 = h->v[1]; d.beta2 = h->v[2]; d.eps = h->v[3]; d.weight_decay = h->v[4];
        d.amsgrad = h->v[5] != 0.0f;
        return strncmp(cfg, "adamw", 5) == 0 ? dl_adamw(m, &d) : dl_adam(m, &d);
    }
}

static dl_module *golden_linear(dl_ctx *ctx, dl_tensor **x, dl_tensor **y)
{
    dl_module *lin = dl_nn_linear(ctx, 4, 3, true);
    const grec *w0 = g_get("init/weight"), *b0 = g_get("init/bias"), *gx = g_get("data/x"), *gy = g_get("data/y");
    if (!lin || !w0 || !b0 || !gx || !gy) return NULL;
    th_put(dl_module_get(lin, "weight"), w0->v);
    th_put(dl_module_get(lin, "bias"), b0->v);
    *x = dl_keep(dl_from_array(ctx, DL_SHAPE(8, 4), gx->v));
    *y = dl_keep(dl_from_array(ctx, DL_SHAPE(8, 3), gy->v));
    return lin;
}

/* gen_optim.py's skip_loss: step k's loss of a _skip run leaves the bias
   out (k % 3 == 1) or the weight (k == 5); zero_grad sets the left-out
   gradient to none and the optimizer skips that parameter, as PyTorch 2 */
static dl_tensor *skip_loss(dl_module *m, dl_tensor *x, dl_tensor *y, int k)
{
    dl_tensor *d;
    if (k % 3 == 1) d = dl_sub(dl_matmul(x, dl_transpose(dl_module_get(m, "weight"), 0, 1)), y);
    else if (k == 5) d = dl_sub(dl_module_get(m, "bias"), y);
    else return mse(m, x, y);
    return dl_mean(dl_mul(d, d), DL_ALL, false);
}

/* zero_grad sets gradients to "none" (PyTorch 2's set_to_none): a
   parameter that no backward (nor anything else) wrote since is skipped by
   the step, its weight decay and momentum too; a write into the kept
   buffer (dl_write, dl_zero_grad: x.grad.zero_()) makes it a gradient again;
   dl_clip_grad_norm leaves none out */
/* dl_module_load_state_dict: a DQN's target network takes the online
   one's values (parameters and buffers, another device too); a model of
   another shape or with other names is refused before anything is copied */
static dl_module *lsd_net(dl_ctx *c, int64_t hidden, bool bn)
{
    dl_module *mods[3];
    mods[0] = dl_nn_linear(c, 4, hidden, true);
    mods[1] = bn ? dl_nn_batch_norm1d(c, hidden) : dl_nn_relu(c);
    mods[2] = dl_nn_linear(c, hidden, 2, true);
    return dl_nn_sequential(c, 3, mods);
}
static bool lsd_equal(dl_module *a, dl_module *b)
{
    const dl_named_tensor *pa, *pb;
    int n = dl_module_state_dict(a, &pa), i;
    float va[64], vb[64];
    if (n != dl_module_state_dict(b, &pb)) return false;
    for (i = 0; i < n; i++) {
        dl_tensor *x = dl_to(pa[i].t, dl_cpu()), *y = dl_to(pb[i].t, dl_cpu());
        if (!x || !y || x->numel > 64 || x->dtype != DL_DTYPE_F32) continue;   /* (num_batches_tracked: int64) */
        if (dl_read(x, va, x->numel) != DL_OK || dl_read(y, vb, y->numel) != DL_OK ||
            memcmp(va, vb, sizeof(float) * (size_t)x->numel) != 0) return false;
    }
    return true;
}
static void test_load_state_dict(void)
{
    dl_ctx_desc d;
    dl_ctx *c;
    dl_module *q, *t, *other, *names;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.seed = 7;
    d.cpu_devices = 2;
    c = dl_ctx_init(&d);
    CHECK(c && dl_set_device(c, dl_cpu()) == DL_OK, "context: %s", dl_error_message(c));
    q = lsd_net(c, 8, true);
    t = lsd_net(c, 8, true);
    other = lsd_net(c, 6, true);
    names = lsd_net(c, 8, false);
    CHECK(q && t && other && names && !lsd_equal(q, t), "four nets, q and t initialized apart");
    {   /* q's running stats move: buffers are copied too */
        dl_tensor *x = dl_randn(c, DL_SHAPE(5, 4));
        CHECK(dl_module_forward(q, x) != NULL, "a training forward: %s", dl_error_message(c));
    }
    CHECK(dl_module_load_state_dict(t, q) == DL_OK && lsd_equal(q, t), "target = online: %s", dl_error_message(c));
    CHECK(!dl_has_grad(dl_module_get(t, "0.weight")), "no gradient made");
    CHECK(dl_module_to(t, dl_cpu_device(1)) == DL_OK && dl_module_load_state_dict(t, other) == DL_ERR_SHAPE,
          "another width refused");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_module_load_state_dict: '0.weight' is float32 (8,4) in dst but float32 (6,4) in src");
    CHECK(dl_module_load_state_dict(names, q) == DL_ERR_ARG, "other names refused");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_module_load_state_dict: src's '1.weight' (8) has no tensor of that name in dst "
               "(Sequential; state_dict names must match)");
    CHECK(dl_module_load_state_dict(q, names) == DL_ERR_ARG, "other names refused, dst's side");
    EXPECT_ERR(c, DL_ERR_ARG, "dst's '1.weight' (8) has no tensor of that name in src");
    CHECK(dl_module_load_state_dict(NULL, q) == DL_ERR_ARG, "NULL dst");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_module_load_state_dict: dst is not a module (NULL or freed)");
    CHECK(dl_module_load_state_dict(q, NULL) == DL_ERR_ARG, "NULL src");
    dl_clear_error(c);
    {   /* across devices: t on cpu:1 takes q's values (another step of q first) */
        dl_tensor *x = dl_randn(c, DL_SHAPE(5, 4));
        CHECK(dl_module_forward(q, x) != NULL && !lsd_equal(q, t), "q moved on");
        CHECK(dl_module_load_state_dict(t, q) == DL_OK && lsd_equal(q, t), "target on cpu:1 = online on cpu:0: %s",
              dl_error_message(c));
    }
    {   /* a checkpoint of other names: the first missing name (a 2-D weight: no hint of an optional
           tensor), and the file's names the model lacks */
        dl_module *m4[4];
        const char *path = tmp_path("lsd.safetensors");
        m4[0] = dl_nn_linear(c, 4, 8, true);
        m4[1] = dl_nn_relu(c);
        m4[2] = dl_nn_linear(c, 8, 2, true);
        m4[3] = dl_nn_linear(c, 2, 2, true);
        CHECK(dl_save(path, q, NULL) == DL_OK && dl_load(path, dl_nn_sequential(c, 4, m4), NULL) == DL_ERR_FORMAT,
              "a file of another model refused");
        CHECK(strstr(dl_error_message(c), "bias=False") == NULL && strstr(dl_error_message(c), ", ...") != NULL,
              "no bias hint for a Linear's weight; the names cut at 3: %s", dl_error_message(c));
        EXPECT_ERR(c, DL_ERR_FORMAT, "tensor '3.weight' is missing from the file (the model has (2,2)); the file "
                   "has names the model does not: '1.");
        remove(path);
    }
    {   /* another context */
        dl_ctx *c2 = new_ctx(3);
        dl_module *q2 = lsd_net(c2, 8, true);
        CHECK(dl_module_load_state_dict(q, q2) == DL_ERR_ARG, "another context refused");
        EXPECT_ERR(c, DL_ERR_ARG, "dl_module_load_state_dict: dst (Sequential) and src (Sequential) belong to "
                   "different contexts");
        {   /* dl_clip_grad_norm_params over a tensor of c2 */
            dl_tensor *w2 = dl_module_get(q2, "0.weight");
            CHECK(dl_clip_grad_norm_params(c, 1, &w2, 1.0f) == 0.0f, "clip: a tensor of another context");
            EXPECT_ERR(c, DL_ERR_ARG, "dl_clip_grad_norm_params: params[0] belongs to another context");
        }
        dl_ctx_free(c2);
    }
    dl_ctx_free(c);
}

/* nn.GroupNorm: its state_dict, eps and affine=False; the forward is
   dl_group_norm's (test_golden checks that against torch) */
static void test_group_norm_module(void)
{
    dl_ctx *c = new_ctx(5);
    dl_module *g = dl_nn_group_norm(c, 2, 4);
    const dl_named_tensor *p;
    dl_tensor *x = dl_randn(c, DL_SHAPE(3, 4, 5)), *a, *b;
    float va[60], vb[60];
    CHECK(g && dl_module_state_dict(g, &p) == 2 && !strcmp(p[0].name, "weight") && !strcmp(p[1].name, "bias") &&
          p[0].t->shape[0] == 4, "GroupNorm(2, 4): weight (4), bias (4)");
    CHECK(!strcmp(dl_module_type(g), "GroupNorm"), "type GroupNorm");
    a = dl_module_forward(g, x);
    b = dl_group_norm(x, 2, NULL, NULL, 1e-5f);
    CHECK(a && b && dl_read(a, va, 60) == DL_OK && dl_read(b, vb, 60) == DL_OK && memcmp(va, vb, sizeof va) == 0,
          "ones and zeros: the plain normalization's bits");
    CHECK(dl_nn_group_norm_eps(g, 0.5f) == DL_OK && (a = dl_module_forward(g, x)) && dl_read(a, va, 60) == DL_OK &&
          memcmp(va, vb, sizeof va) != 0, "eps 0.5 changes it");
    {   /* nn.Upsample(scale_factor=2): no parameters, dl_upsample_nearest's values */
        dl_module *u = dl_nn_upsample_nearest(c, 2);
        dl_tensor *z = u ? dl_module_forward(u, dl_reshape(x, DL_SHAPE(3, 4, 5, 1))) : NULL;
        float v[240];
        CHECK(u && !strcmp(dl_module_type(u), "Upsample") && dl_module_state_dict(u, &p) == 0 && z &&
              z->ndim == 4 && z->shape[2] == 10 && z->shape[3] == 2 && dl_read(z, v, 240) == DL_OK &&
              dl_read(x, va, 60) == DL_OK && v[0] == va[0] && v[3] == va[0] && v[4] == va[1],
              "Upsample(2): (3,4,5,1) -> (3,4,10,2), each value in a 2x2 block: %s", dl_error_message(c));
    }
    CHECK(dl_nn_norm_no_affine(g) == DL_OK && dl_module_state_dict(g, &p) == 0 &&
          (a = dl_module_forward(g, x)) != NULL, "affine=False: no parameters, still a forward");
    dl_ctx_free(c);
}

static void test_zero_grad_none(void)
{
    dl_ctx *ctx = new_ctx(3);
    dl_module *lin = dl_nn_linear(ctx, 2, 2, true);
    dl_tensor *w = dl_module_get(lin, "weight"), *b = dl_module_get(lin, "bias");
    dl_tensor *x = dl_keep(dl_ones(ctx, DL_SHAPE(1, 2)));
    dl_sgd_desc sd;
    dl_optim *o;
    float w0[4], w1[4], b0[2], b1[2], g[4] = {1, 2, 3, 4};
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.5f; sd.momentum = 0.9f; sd.weight_decay = 0.25f;
    o = dl_sgd(lin, &sd);
    CHECK(dl_backward(dl_sum(dl_module_forward(lin, x), DL_ALL, false)) == DL_OK && dl_optim_step(o) == DL_OK,
          "zero_grad none: first step: %s", dl_error_message(ctx));
    dl_read(w, w0, 4); dl_read(b, b0, 2);
    dl_optim_zero_grad(o);
    CHECK(w->grad && b->grad && th_host(w->grad)[0] == 0.0f, "zero_grad keeps the buffers, zeroed");
    CHECK(dl_optim_step(o) == DL_OK, "a step without a backward");
    dl_read(w, w1, 4); dl_read(b, b1, 2);
    CHECK(memcmp(w0, w1, sizeof w0) == 0 && memcmp(b0, b1, sizeof b0) == 0,
          "a step after zero_grad and no backward updates nothing (weight decay, momentum: skipped)");
    CHECK(dl_clip_grad_norm(lin, 1.0f) == 0.0f && dl_last_error(ctx) == DL_OK, "clip: no gradient, norm 0");
    dl_optim_zero_grad(o);
    dl_write(w->grad, g, 4);                         /* p.grad = g by hand */
    CHECK(dl_optim_step(o) == DL_OK, "a step with a written gradient");
    dl_read(w, w1, 4); dl_read(b, b1, 2);
    CHECK(memcmp(w0, w1, sizeof w0) != 0 && memcmp(b0, b1, sizeof b0) == 0,
          "a gradient written by hand counts; the bias (none) is skipped");
    dl_optim_zero_grad(o);
    dl_zero_grad(b);                                 /* b.grad = zeros: a gradient of 0 */
    CHECK(dl_optim_step(o) == DL_OK, "a step after dl_zero_grad");
    dl_read(w, w0, 4); dl_read(b, b0, 2);
    CHECK(memcmp(w0, w1, sizeof w0) == 0 && memcmp(b0, b1, sizeof b0) != 0,
          "dl_zero_grad's zeros are a gradient (momentum and weight decay move b), w's none is skipped");
    dl_module_zero_grad(lin);                        /* model.zero_grad(): none too */
    CHECK(dl_optim_step(o) == DL_OK, "a step after dl_module_zero_grad");
    dl_read(w, w1, 4); dl_read(b, b1, 2);
    CHECK(memcmp(w0, w1, sizeof w0) == 0 && memcmp(b0, b1, sizeof b0) == 0,
          "dl_module_zero_grad sets none as well");
    CHECK(!dl_has_grad(w) && !dl_has_grad(b) && !dl_has_grad(NULL), "dl_has_grad: none after zero_grad");
    dl_sgd_update(b, 0.5f);                          /* (no gradient: nothing, and still none) */
    dl_read(b, b1, 2);
    CHECK(memcmp(b0, b1, sizeof b0) == 0 && !dl_has_grad(b), "dl_sgd_update of a none gradient: nothing");
    {   /* what a review found: a move, a replay and a write through dl_data */
        dl_ctx_desc cd;
        dl_ctx *c2;
        dl_module *l2;
        dl_capture *cap;
        dl_tensor *a2, *b2, *x2;
        memset(&cd, 0, sizeof cd);
        cd.log = dl_log_silent;
        cd.cpu_devices = 2;
        c2 = dl_ctx_init(&cd);
        l2 = dl_nn_linear(c2, 2, 1, true);
        a2 = dl_module_get(l2, "weight");
        b2 = dl_module_get(l2, "bias");
        x2 = dl_keep(dl_ones(c2, DL_SHAPE(1, 2)));
        dl_backward(dl_sum(dl_module_forward(l2, x2), DL_ALL, false));
        dl_module_zero_grad(l2);
        CHECK(dl_module_to(l2, dl_cpu_device(1)) == DL_OK && !dl_has_grad(a2) && !dl_has_grad(b2),
              "dl_module_to keeps a none gradient none (model.to(): grad stays None)");
        dl_step_end(c2);
        x2 = dl_keep(dl_to(x2, dl_cpu_device(1)));
        cap = dl_capture_begin(c2);                  /* zero_grad, then a loss without the bias */
        dl_module_zero_grad(l2);
        dl_backward(dl_sum(dl_matmul(x2, dl_transpose(a2, 0, 1)), DL_ALL, false));
        CHECK(dl_capture_end(cap) == DL_OK && dl_has_grad(a2) && !dl_has_grad(b2), "capture: %s",
              dl_error_message(c2));
        CHECK(dl_replay(cap) == DL_OK && dl_has_grad(a2) && !dl_has_grad(b2),
              "a replay leaves the gradient its zero_grad set to none none (the bias)");
        dl_capture_free(cap);
        dl_step_end(c2);
        dl_module_zero_grad(l2);
        dl_module_to(l2, dl_cpu());
        CHECK(dl_data(b2->grad) && dl_has_grad(b2), "a ->grad's dl_data pointer: the gradient counts again");
        dl_ctx_free(c2);
    }
    dl_ctx_free(ctx);
}

static void test_optim_golden(void)
{
    static const char *cfgs[] = {"sgd_plain", "sgd_momentum", "sgd_dampening", "sgd_nesterov",
                                 "sgd_weight_decay", "sgd_all", "adam_default", "adam_lr",
                                 "adam_weight_decay", "adam_amsgrad", "adamw_wd", "adamw_amsgrad",
                                 "sgd_dampening_skip", "sgd_all_skip", "adam_weight_decay_skip",
                                 "adam_amsgrad_skip", "adamw_amsgrad_skip"};
    int c, s;
    for (c = 0; c < (int)(sizeof cfgs / sizeof cfgs[0]); c++) {
        dl_ctx *ctx = new_ctx(1);
        dl_tensor *x = NULL, *y = NULL;
        dl_module *lin = golden_linear(ctx, &x, &y);
        dl_optim *o = lin ? make_opt(cfgs[c], lin) : NULL;
        const grec *gw, *gb;
        char key[128];
        double worst = 0;
        snprintf(key, sizeof key, "%s/weight", cfgs[c]);
        gw = g_get(key);
        snprintf(key, sizeof key, "%s/bias", cfgs[c]);
        gb = g_get(key);
        CHECK(o && gw && gb, "%s: setup: %s", cfgs[c], dl_error_message(ctx));
        if (!o || !gw || !gb) { dl_ctx_free(ctx); continue; }
        for (s = 0; s < 10; s++) {
            char what[128];
            int64_t i;
            dl_tensor *w = dl_module_get(lin, "weight"), *b = dl_module_get(lin, "bias");
            dl_optim_zero_grad(o);
            if (dl_backward(strstr(cfgs[c], "_skip") ? skip_loss(lin, x, y, s) : mse(lin, x, y)) != DL_OK ||
                dl_optim_step(o) != DL_OK) {
                CHECK(0, "%s step %d: %s", cfgs[c], s, dl_error_message(ctx));
                break;
            }
            snprintf(what, sizeof what, "%s step %d weight", cfgs[c], s + 1);
            cmp(what, th_host(w), gw->v + 12 * s, 12);
            snprintf(what, sizeof what, "%s step %d bias", cfgs[c], s + 1);
            cmp(what, th_host(b), gb->v + 3 * s, 3);
            for (i = 0; i < 12; i++) {
                double r = fabs(th_host(w)[i] - gw->v[12 * s + i]) / fabs(gw->v[12 * s + i]);
                if (r > worst) worst = r;
            }
            dl_step_end(ctx);
        }
        CHECK(dl_optim_steps(o) == 10, "steps");
        if (getenv("DL_NN_VERBOSE")) printf("  %-18s worst relative error %.3g\n", cfgs[c], worst);
        dl_ctx_free(ctx);
    }
}

static void test_clip_sched(void)
{
    dl_ctx *ctx = new_ctx(1);
    const grec *mn = g_get("clip/max_norm"), *tn = g_get("clip/total_norm"), *gw = g_get("clip/grad_weight"),
               *gb = g_get("clip/grad_bias"), *r;
    int k;
    int64_t t;
    float vals[32];
    for (k = 0; k < 2 && mn && tn && gw && gb; k++) {
        dl_tensor *x = NULL, *y = NULL;
        dl_module *lin = golden_linear(ctx, &x, &y);
        float total;
        char what[64];
        dl_backward(mse(lin, x, y));
        total = dl_clip_grad_norm(lin, mn->v[k]);
        snprintf(what, sizeof what, "clip %g total norm", (double)mn->v[k]);
        cmp(what, &total, &tn->v[k], 1);
        snprintf(what, sizeof what, "clip %g grad weight", (double)mn->v[k]);
        cmp(what, th_host(dl_module_get(lin, "weight")->grad), gw->v + 12 * k, 12);
        snprintf(what, sizeof what, "clip %g grad bias", (double)mn->v[k]);
        cmp(what, th_host(dl_module_get(lin, "bias")->grad), gb->v + 3 * k, 3);
        {   /* clip_grad_norm_([bias, weight]): a list in another order, weight listed twice (counted once) */
            dl_module *l2 = golden_linear(ctx, &x, &y);
            dl_tensor *ps[3];
            ps[0] = dl_module_get(l2, "bias");
            ps[1] = ps[2] = dl_module_get(l2, "weight");
            dl_backward(mse(l2, x, y));
            total = dl_clip_grad_norm_params(ctx, 3, ps, mn->v[k]);
            snprintf(what, sizeof what, "clip list %g total norm", (double)mn->v[k]);
            cmp(what, &total, &tn->v[k], 1);
            snprintf(what, sizeof what, "clip list %g grad weight", (double)mn->v[k]);
            cmp(what, th_host(ps[1]->grad), gw->v + 12 * k, 12);
            snprintf(what, sizeof what, "clip list %g grad bias", (double)mn->v[k]);
            cmp(what, th_host(ps[0]->grad), gb->v + 3 * k, 3);
        }
        dl_step_end(ctx);
    }
    {   /* no grads: 0 */
        dl_module *l = dl_nn_linear(ctx, 2, 2, true);
        CHECK(dl_clip_grad_norm(l, 1.0f) == 0.0f, "no grads");
        CHECK(dl_clip_grad_norm_params(ctx, 0, NULL, 1.0f) == 0.0f && dl_last_error(ctx) == DL_OK, "empty list");
    }
    if ((r = g_get("sched/step")) != NULL) {
        for (t = 0; t < r->numel; t++) vals[t] = dl_lr_step(0.1f, t, 3, 0.5f);
        cmp("StepLR", vals, r->v, (long)r->numel);
    }
    if ((r = g_get("sched/cosine")) != NULL) {
        for (t = 0; t < r->numel; t++) vals[t] = dl_lr_cosine(0.1f, t, 10, 0.001f);
        cmp("CosineAnnealingLR", vals, r->v, (long)r->numel);
    }
    if ((r = g_get("sched/warmup")) != NULL) {
        for (t = 0; t < r->numel; t++) vals[t] = dl_lr_warmup(0.1f, t, 5);
        cmp("warmup (LinearLR)", vals, r->v, (long)r->numel);
    }
    dl_ctx_free(ctx);
}

/* ------------------------------------------------------------------ optimizer semantics */

static void test_optim_misc(void)
{
    dl_ctx *ctx = new_ctx(2);
    dl_tensor *a = dl_keep(dl_ones(ctx, DL_SHAPE(3))), *b = dl_keep(dl_ones(ctx, DL_SHAPE(2))), *ps[3];
    dl_adam_desc ad; memset(&ad, 0, sizeof ad);
    dl_sgd_desc sd;
    dl_optim *o, *o2;
    dl_memory_stats m1[2], m2[2];   /* on the host (cpu:0) and on the default device */
    dl_device dev[2];
    dl_module *lin;
    dl_tensor *x, *y;
    int i, k;
    dev[0] = dl_cpu();
    dev[1] = dl_ctx_device(ctx);
    dl_requires_grad(a, true);
    dl_requires_grad(b, true);
    ps[0] = a; ps[1] = b; ps[2] = a;     /* a duplicate is used once */
    o = dl_adam_params(ctx, 3, ps, &ad);
    CHECK(o && o->n == 2, "adam_params, de-duplicated");
    /* only a gets a gradient: b is skipped */
    dl_backward(dl_sum(dl_mul(a, a), DL_ALL, false));
    CHECK(dl_optim_step(o) == DL_OK, "step");
    CHECK(th_host(a)[0] < 1.0f && th_host(b)[0] == 1.0f && th_host(b)[1] == 1.0f, "param without grad skipped");
    CHECK(o->pstep[0] == 1 && o->pstep[1] == 0 && dl_optim_steps(o) == 1, "per-param step counts");
    /* lr get/set */
    dl_optim_set_lr(o, 0.5f);
    CHECK(dl_optim_lr(o) == 0.5f, "set_lr");
    dl_optim_zero_grad(o);
    CHECK(th_host(a->grad)[0] == 0.0f, "optim zero_grad");
    dl_optim_free(o);
    /* bad descriptors */
    memset(&sd, 0, sizeof sd);
    sd.lr = -1.0f;
    CHECK(dl_sgd_params(ctx, 1, ps, &sd) == NULL, "lr -1");
    EXPECT_ERR(ctx, DL_ERR_ARG, "lr=-1 must be a finite number >= 0");
    sd.lr = NAN;
    CHECK(dl_sgd_params(ctx, 1, ps, &sd) == NULL, "lr nan");
    EXPECT_ERR(ctx, DL_ERR_ARG, "lr=nan must be a finite number >= 0");
    sd.lr = 0.1f; sd.nesterov = true;
    CHECK(dl_sgd_params(ctx, 1, ps, &sd) == NULL, "nesterov without momentum");
    EXPECT_ERR(ctx, DL_ERR_ARG, "nesterov");
    ad.beta1 = 1.0f;
    CHECK(dl_adam_params(ctx, 1, ps, &ad) == NULL, "beta1 1");
    EXPECT_ERR(ctx, DL_ERR_ARG, "betas (1, 0.999) must each be in [0, 1)");
    sd.nesterov = false;
    ps[0] = dl_ones(ctx, DL_SHAPE(2));
    CHECK(dl_sgd_params(ctx, 1, ps, &sd) == NULL, "step tensor param");
    EXPECT_ERR(ctx, DL_ERR_ARG, "persistent");
    CHECK(dl_sgd_params(ctx, 0, ps, &sd) == NULL, "empty");
    EXPECT_ERR(ctx, DL_ERR_ARG, "empty parameter list");
    CHECK(dl_sgd_params(ctx, -1, ps, &sd) == NULL, "n -1");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_sgd_params: got an empty parameter list (n=-1; n must be >= 1");
    CHECK(dl_sgd(dl_nn_relu(ctx), &sd) == NULL, "module without params");
    EXPECT_ERR(ctx, DL_ERR_ARG, "no parameters");

    /* a training loop: an optimizer step never allocates; the loop is flat after step 1 */
    lin = dl_nn_linear(ctx, 16, 4, true);
    sd.momentum = 0.9f; sd.weight_decay = 1e-4f; sd.nesterov = true;
    o = dl_sgd(lin, &sd);
    memset(&ad, 0, sizeof ad);
    ad.amsgrad = true;
    o2 = dl_adamw(lin, &ad);
    x = dl_keep(dl_randn(ctx, DL_SHAPE(32, 16)));
    y = dl_keep(dl_randn(ctx, DL_SHAPE(32, 4)));
    for (i = 0; i < 6; i++) {
        uint64_t before;
        dl_optim_zero_grad(o);
        dl_backward(mse(lin, x, y));
        dl_clip_grad_norm(lin, 1.0f);
        for (k = 0; k < 2; k++) dl_memory_stats_get(ctx, dev[k], &m1[k]);
        before = (uint64_t)cnt_calls;
        dl_optim_step(i % 2 ? o : o2);
        for (k = 0; k < 2; k++) {
            dl_memory_stats_get(ctx, dev[k], &m2[k]);
            CHECK(m1[k].alloc_calls == m2[k].alloc_calls && before == (uint64_t)cnt_calls &&
                  m1[k].persistent_bytes == m2[k].persistent_bytes, "step %d allocated on %s", i,
                  dl_device_name(dev[k]));
        }
        if (i == 2) for (k = 0; k < 2; k++) dl_memory_stats_get(ctx, dev[k], &m1[k]);
        dl_step_end(ctx);
        if (i == 5) for (k = 0; k < 2; k++) {
            dl_memory_stats_get(ctx, dev[k], &m2[k]);
            CHECK(m2[k].alloc_calls == m1[k].alloc_calls, "loop allocated %llu times on %s after step 2",
                  (unsigned long long)(m2[k].alloc_calls - m1[k].alloc_calls), dl_device_name(dev[k]));
        }
    }
    {   /* batch norm's backward: more than 32 channels (its sums), and a fused ReLU
           on an input without gradient (the masked g), no host allocator call after
           step 1 (each called malloc every step) */
        dl_module *bn = dl_nn_batch_norm2d(ctx, 40), *bn2 = dl_nn_batch_norm2d(ctx, 8);
        long before = 0;
        for (i = 0; i < 5; i++) {
            dl_tensor *xb = dl_randn(ctx, DL_SHAPE(4, 40, 4, 4)), *xr = dl_randn(ctx, DL_SHAPE(4, 8, 4, 4));
            dl_tensor *l = dl_add(dl_sum(dl_module_forward(bn, xb), DL_ALL, false),
                                  dl_sum(dl_module_forward_relu(bn2, xr), DL_ALL, false));
            CHECK(l && dl_backward(l) == DL_OK, "bn step %d: %s", i, dl_error_message(ctx));
            dl_module_zero_grad(bn);
            dl_module_zero_grad(bn2);
            dl_step_end(ctx);
            if (i >= 2) CHECK(cnt_calls == before, "bn step %d: %ld allocator calls", i, cnt_calls - before);
            before = cnt_calls;
        }
    }
    dl_ctx_free(ctx);
}

/* ------------------------------------------------------------------ checkpoints */

static dl_module *ck_model(dl_ctx *ctx)
{
    dl_module *mods[3];
    mods[0] = dl_nn_linear(ctx, 4, 8, true);
    mods[1] = dl_nn_tanh(ctx);
    mods[2] = dl_nn_linear(ctx, 8, 3, true);
    return dl_nn_sequential(ctx, 3, mods);
}

static void ck_data(dl_ctx *ctx, dl_tensor **x, dl_tensor **y)
{
    float xv[40], yv[30];
    int i;
    for (i = 0; i < 40; i++) xv[i] = (float)sin(0.7 * i);
    for (i = 0; i < 30; i++) yv[i] = (float)cos(0.3 * i);
    *x = dl_from_array(ctx, DL_SHAPE(10, 4), xv);
    *y = dl_from_array(ctx, DL_SHAPE(10, 3), yv);
}

static dl_optim *ck_opt(dl_module *m, int kind)
{
    dl_sgd_desc sd;
    dl_adam_desc ad; memset(&ad, 0, sizeof ad);
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.05f; sd.momentum = 0.9f; sd.weight_decay = 0.01f;
    ad.lr = 0.01f; ad.amsgrad = kind == 2; ad.weight_decay = 0.01f;
    return kind == 0 ? dl_sgd(m, &sd) : kind == 1 ? dl_adam(m, &ad) : dl_adamw(m, &ad);
}

static void ck_train(dl_ctx *ctx, dl_module *m, dl_optim *o, int steps)
{
    int i;
    for (i = 0; i < steps; i++) {
        dl_tensor *x, *y;
        ck_data(ctx, &x, &y);
        dl_optim_zero_grad(o);
        dl_backward(mse(m, x, y));
        dl_optim_step(o);
        dl_optim_set_lr(o, dl_lr_cosine(0.05f, dl_optim_steps(o), 10, 0.0f));
        dl_step_end(ctx);
    }
}

static void test_resume(void)
{
    int kind;
    static const char *kn[] = {"sgd momentum", "adam", "adamw amsgrad"};
    for (kind = 0; kind < 3; kind++) {
        unsigned char ref[4096], got[4096];
        size_t nref, ngot;
        const char *path = tmp_path("resume.safetensors");
        dl_ctx *a = new_ctx(11), *b = new_ctx(11), *c = new_ctx(99);
        dl_module *ma = ck_model(a), *mb = ck_model(b), *mc = ck_model(c);
        dl_optim *oa = ck_opt(ma, kind), *ob = ck_opt(mb, kind), *oc = ck_opt(mc, kind);
        dl_result r;
        FILE *f;
        ck_train(a, ma, oa, 8);
        nref = th_module_bytes(ma, ref, sizeof ref);
        ck_train(b, mb, ob, 4);
        r = dl_save(path, mb, ob);
        CHECK(r == DL_OK, "%s: save: %s", kn[kind], dl_error_message(b));
        f = fopen(tmp_path("resume.safetensors.tmp"), "rb");
        CHECK(f == NULL, "no .tmp left behind");
        if (f) fclose(f);
        CHECK(th_module_bytes(mc, got, sizeof got) == nref && memcmp(got, ref, nref) != 0, "other init differs");
        r = dl_load(path, mc, oc);
        CHECK(r == DL_OK, "%s: load: %s", kn[kind], dl_error_message(c));
        CHECK(dl_optim_steps(oc) == 4 && dl_optim_lr(oc) == dl_optim_lr(ob), "%s: steps and lr restored", kn[kind]);
        ck_train(c, mc, oc, 4);
        ngot = th_module_bytes(mc, got, sizeof got);
        CHECK(ngot == nref && memcmp(got, ref, nref) == 0, "%s: resumed run is bit-identical", kn[kind]);
        /* model only, into a fresh module: optim.* tensors are ignored */
        {
            dl_module *md = ck_model(c);
            CHECK(dl_load(path, md, NULL) == DL_OK, "model-only load: %s", dl_error_message(c));
        }
        remove(path);
        dl_ctx_free(a);
        dl_ctx_free(b);
        dl_ctx_free(c);
    }
}

/* write [u64 hlen][header][data] (hlen_override when nonzero) */
static void write_st(const char *path, const char *header, const unsigned char *data, size_t dlen,
                     uint64_t hlen_override, size_t cut)
{
    FILE *f = fopen(path, "wb");
    unsigned char len8[8];
    uint64_t h = hlen_override ? hlen_override : (uint64_t)strlen(header);
    int i;
    unsigned char *all;
    size_t n = 8 + strlen(header) + dlen;
    all = (unsigned char *)malloc(n);
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)(h >> (8 * i));
    memcpy(all, len8, 8);
    memcpy(all + 8, header, strlen(header));
    if (dlen) memcpy(all + 8 + strlen(header), data, dlen);
    if (f) { fwrite(all, 1, n - cut, f); fclose(f); }
    free(all);
}

static void test_torch_written(void)
{
    dl_ctx *ctx = new_ctx(3);
    dl_module *lin = dl_nn_linear(ctx, 5, 3, true);
    const grec *w = g_get("torch_written/weight"), *b = g_get("torch_written/bias");
    dl_result r = dl_load("tests/golden/torch_written.safetensors", lin, NULL);
    CHECK(r == DL_OK, "load torch-written file: %s", dl_error_message(ctx));
    if (r == DL_OK && w && b) {
        CHECK(memcmp(th_host(dl_module_get(lin, "weight")), w->v, 60) == 0, "torch weight exact");
        CHECK(memcmp(th_host(dl_module_get(lin, "bias")), b->v, 12) == 0, "torch bias exact");
    }
    /* with an optimizer, the torch file has no optimizer state */
    {
        dl_sgd_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.1f;
        CHECK(dl_load("tests/golden/torch_written.safetensors", lin, dl_sgd(lin, &sd)) == DL_ERR_FORMAT, "no optim state");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "'optim.step' is missing");
    }
    {   /* one tensor of a file by name (safetensors.torch.load_file(p)[name]), on the context's device */
        const char *tw = "tests/golden/torch_written.safetensors", *na = "tests/golden/noaffine.safetensors";
        dl_tensor *t = dl_load_tensor(ctx, tw, "weight"), *n;
        int64_t v = -1;
        CHECK(t && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 5 && t->dtype == DL_DTYPE_F32 && w &&
              memcmp(th_host(t), w->v, 60) == 0 && !strcmp(t->name, "weight"), "dl_load_tensor weight (3,5): %s",
              dl_error_message(ctx));
        dl_step_end(ctx);   /* persistent: it outlives the step */
        n = dl_load_tensor(ctx, na, "1.num_batches_tracked");
        CHECK(t && dl_sum(t, DL_ALL, false) && n && n->dtype == DL_DTYPE_I64 && n->ndim == 0 &&
              dl_read_int64(n, &v, 1) == DL_OK && v == 3, "an I64 scalar: num_batches_tracked %lld", (long long)v);
        dl_free(t);
        dl_free(n);
        CHECK(dl_load_tensor(ctx, tw, "weights") == NULL, "no such name");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "torch_written.safetensors has no tensor 'weights' (it has 2: ");
        CHECK(dl_load_tensor(ctx, na, "x") == NULL && strstr(dl_error_message(ctx), "(it has 10: ") &&
              strstr(dl_error_message(ctx), ", ...)"), "ten names: the first 8 listed (%s)", dl_error_message(ctx));
        dl_clear_error(ctx);
        {   /* a 9-dim tensor beside: refused only where it is the one asked for; a __metadata__ key */
            static const unsigned char d[12] = {0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64};
            const char *p9 = tmp_path("d9.safetensors");
            dl_module *l1 = dl_nn_linear(ctx, 1, 1, false);
            write_st(p9, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"d9\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[4,12]},"
                     "\"__metadata__\":{\"k\":\"v\"}}", d, 12, 0, 0);
            n = dl_load_tensor(ctx, p9, "a");
            CHECK(n && n->numel == 1 && th_f(n, 0) == 1.0f, "'a' beside a 9-dim tensor: %s", dl_error_message(ctx));
            dl_free(n);
            CHECK(dl_load_tensor(ctx, p9, "d9") == NULL, "the 9-dim one");
            EXPECT_ERR(ctx, DL_ERR_FORMAT, "tensor 'd9' has 9 dims; dl.h's tensors have at most DL_MAX_DIMS=");
            CHECK(dl_load_tensor(ctx, p9, "k") == NULL, "a metadata key");
            EXPECT_ERR(ctx, DL_ERR_FORMAT, "has no tensor 'k' (it has 2: 'a', 'd9'); it is a __metadata__ key: "
                       "dl_checkpoint_meta reads it");
            write_st(p9, "{\"weight\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                     d, 4, 0, 0);
            CHECK(dl_load(p9, l1, NULL) == DL_ERR_FORMAT, "a 9-dim weight into Linear(1,1)");
            EXPECT_ERR(ctx, DL_ERR_FORMAT, "'weight' has shape (1,1,1,1,1,1,1,1,... 9 dims) in the file but (1,1)");
            remove(p9);
        }
        {   /* a key longer than a tensor's name: cut before a UTF-8 character, not inside it */
            char nm[40];
            memset(nm, 'a', 30);
            nm[30] = (char)0xC3; nm[31] = (char)0xA9; nm[32] = 'b'; nm[33] = 0;
            n = dl_set_name(dl_zeros(ctx, DL_SHAPE(1)), nm);
            CHECK(n && strlen(n->name) == 30 && n->name[29] == 'a', "a name cut at 30 bytes (%zu)",
                  n ? strlen(n->name) : (size_t)0);
        }
        CHECK(dl_load_tensor(ctx, tmp_path("does_not_exist.safetensors"), "w") == NULL, "missing file");
        EXPECT_ERR(ctx, DL_ERR_IO, "dl_load_tensor: cannot open");
        CHECK(dl_load_tensor(ctx, tw, NULL) == NULL, "NULL name");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_load_tensor: name is NULL");
        CHECK(dl_load_tensor(NULL, tw, "weight") == NULL, "NULL ctx");
        {
            dl_capture *cap = dl_capture_begin(ctx);
            CHECK(cap && dl_load_tensor(ctx, tw, "weight") == NULL, "refused in a capture");
            EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "dl_load_tensor");
            dl_capture_free(cap);
            dl_clear_error(ctx);
        }
    }
    dl_ctx_free(ctx);
}

/* max |got - want| / (1e-5 + 1e-4 |want|) over n: <= 1 passes (the
   chain of a conv, two batch norms and a layer norm on 4 samples) */
static double na_err(const float *got, const float *want, int64_t n)
{
    double worst = 0.0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double r = fabs((double)got[i] - want[i]) / (1e-5 + 1e-4 * fabs((double)want[i]));
        if (!(r <= worst)) worst = r;   /* (NaN counts) */
    }
    return worst;
}

/* BatchNorm*d(affine=False) and LayerNorm(elementwise_affine=False):
   dl_nn_norm_no_affine, against PyTorch's model of the same layers
   (tests/golden/gen_noaffine.py): its state_dict loads strictly, the
   outputs in eval and train mode, x's gradient and the running mean
   after a train step are PyTorch's; the norms have no parameters; a file
   saved here loads back; the refusals. */
static void test_no_affine(void)
{
    dl_ctx *ctx = new_ctx(5);
    const char *torch_file = "tests/golden/noaffine.safetensors";
    const grec *gx = g_get("x"), *ge = g_get("eval"), *gg = g_get("gout"), *gt = g_get("train");
    const grec *ggx = g_get("grad_x"), *grm = g_get("rm1");
    dl_conv_desc cd = dl_conv_desc_make(1, 0, 1, 1);
    const dl_named_tensor *ps;
    dl_module *mods[7], *seq, *bn;
    dl_tensor *x, *y, *gr = NULL;
    dl_capture *cap;
    int k;
    mods[0] = dl_nn_conv2d(ctx, 1, 3, 3, &cd, true);
    mods[1] = dl_nn_batch_norm2d(ctx, 3);
    mods[2] = dl_nn_relu(ctx);
    mods[3] = dl_nn_flatten(ctx);
    mods[4] = dl_nn_linear(ctx, 48, 8, true);
    mods[5] = dl_nn_layer_norm(ctx, DL_SHAPE(8));
    mods[6] = dl_nn_batch_norm1d(ctx, 8);
    CHECK(dl_nn_norm_no_affine(mods[1]) == DL_OK && dl_nn_norm_no_affine(mods[5]) == DL_OK &&
          dl_nn_norm_no_affine(mods[6]) == DL_OK && dl_nn_norm_no_affine(mods[6]) == DL_OK,
          "no_affine on BatchNorm2d, LayerNorm, BatchNorm1d (twice): %s", dl_error_message(ctx));
    CHECK(dl_module_named_parameters(mods[1], &ps) == 0 && dl_module_named_parameters(mods[5], &ps) == 0 &&
          dl_module_named_parameters(mods[6], &ps) == 0, "the norms have no parameters");
    CHECK(dl_module_get(mods[1], "weight") == NULL && dl_module_get(mods[1], "running_var") != NULL,
          "BatchNorm2d: no weight, its running_var");
    dl_clear_error(ctx);
    seq = dl_nn_sequential(ctx, 7, mods);
    CHECK(dl_module_named_parameters(seq, &ps) == 4, "the conv's and the linear's 4 parameters");
    CHECK(dl_load(torch_file, seq, NULL) == DL_OK, "load PyTorch's affine=False state_dict: %s",
          dl_error_message(ctx));
    if (gx && ge && gg && gt && ggx && grm) {
        x = dl_from_array(ctx, DL_SHAPE(4, 1, 6, 6), gx->v);
        dl_module_train(seq, false);
        y = dl_module_forward(seq, x);
        CHECK(y && na_err(th_host(y), ge->v, 32) <= 1.0, "eval output as PyTorch's (%g)",
              y ? na_err(th_host(y), ge->v, 32) : -1.0);
        dl_module_train(seq, true);
        x = dl_requires_grad(x, true);
        y = dl_module_forward(seq, x);
        CHECK(y && dl_grad(dl_sum(dl_mul(y, dl_from_array(ctx, DL_SHAPE(4, 8), gg->v)), DL_ALL, false), 1, &x, &gr,
                           NULL) == DL_OK, "train step: %s", dl_error_message(ctx));
        CHECK(y && na_err(th_host(y), gt->v, 32) <= 1.0, "train output as PyTorch's");
        CHECK(gr && na_err(th_host(gr), ggx->v, 144) <= 1.0, "x's gradient as PyTorch's (%g)",
              gr ? na_err(th_host(gr), ggx->v, 144) : -1.0);
        CHECK(na_err(th_host(dl_module_get(seq, "6.running_mean")), grm->v, 8) <= 1.0, "running_mean as PyTorch's");
        dl_step_end(ctx);
    }
    /* saved here, loaded into another such model; into a model with the
       weights, refused by name */
    CHECK(dl_save(tmp_path("noaffine.safetensors"), seq, NULL) == DL_OK, "save: %s", dl_error_message(ctx));
    bn = dl_nn_batch_norm2d(ctx, 3);
    {
        dl_module *m2[7];
        dl_module *seq2;
        m2[0] = dl_nn_conv2d(ctx, 1, 3, 3, &cd, true);
        m2[1] = bn;
        m2[2] = dl_nn_relu(ctx);
        m2[3] = dl_nn_flatten(ctx);
        m2[4] = dl_nn_linear(ctx, 48, 8, true);
        m2[5] = dl_nn_layer_norm(ctx, DL_SHAPE(8));
        m2[6] = dl_nn_batch_norm1d(ctx, 8);
        dl_nn_norm_no_affine(m2[5]);
        dl_nn_norm_no_affine(m2[6]);
        seq2 = dl_nn_sequential(ctx, 7, m2);
        CHECK(dl_load(torch_file, seq2, NULL) == DL_ERR_FORMAT, "an affine BatchNorm2d refuses the file");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "'1.weight' is missing from the file (the model has (3)); if the saved "
                   "layer has none (PyTorch's bias=False, affine=False, elementwise_affine=False), make this one "
                   "without it too (the bias argument, dl_nn_norm_no_affine)");
        CHECK(dl_nn_norm_no_affine(bn) == DL_OK && dl_load(tmp_path("noaffine.safetensors"), seq2, NULL) == DL_OK,
              "dl.h's file loads into the same layers: %s", dl_error_message(ctx));
        for (k = 0; k < 2; k++) {
            const char *nm = k ? "6.running_var" : "1.running_mean";
            dl_tensor *a = dl_module_get(seq, nm), *b = dl_module_get(seq2, nm);
            CHECK(a && b && memcmp(th_host(a), th_host(b), sizeof(float) * (size_t)a->numel) == 0, "%s round trip", nm);
        }
    }
    remove(tmp_path("noaffine.safetensors"));
    /* refusals: another kind of module, NULL, inside a capture */
    CHECK(dl_nn_norm_no_affine(mods[4]) == DL_ERR_ARG, "Linear refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_norm_no_affine: m (a \"Linear\" module) was not made by "
               "dl_nn_batch_norm1d/2d/3d, dl_nn_layer_norm or dl_nn_group_norm");
    CHECK(dl_nn_norm_no_affine(NULL) == DL_ERR_ARG, "NULL refused");
    bn = dl_nn_batch_norm1d(ctx, 4);
    cap = dl_capture_begin(ctx);
    CHECK(cap && dl_nn_norm_no_affine(bn) == DL_ERR_UNSUPPORTED, "refused in a capture");
    CHECK(dl_module_named_parameters(bn, &ps) == 2, "a refused call leaves the weight and bias");
    dl_capture_free(cap);
    dl_clear_error(ctx);
    dl_ctx_free(ctx);
}

typedef struct bad_case { const char *name, *header; size_t dlen; uint64_t hlen; size_t cut; const char *msg; } bad_case;

#define WB "\"weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}"
#define BB "\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}"

static void test_bad_files(void)
{
    dl_ctx *ctx = new_ctx(4);
    dl_module *lin = dl_nn_linear(ctx, 2, 2, true);
    unsigned char before[64], after[64], data[64];
    size_t nb;
    int i;
    const char *path = tmp_path("bad.safetensors");
    char deep[400];
    static const bad_case cases[] = {
        {"truncated data", "{" WB "," BB "}", 24, 0, 4, "'bias'"},
        {"file shorter than 8 bytes", "", 0, 0, 3, "8-byte header length"},
        {"header length past the end", "{" WB "," BB "}", 24, 5000, 0, "larger than the rest"},
        {"header length 2^63", "{" WB "," BB "}", 24, (uint64_t)1 << 63, 0, "larger than the rest"},
        {"malformed: unterminated", "{" WB "," BB, 24, 0, 0, "malformed JSON"},
        {"malformed: missing colon", "{\"weight\" {}}", 0, 0, 0, "expected ':'"},
        {"malformed: trailing comma", "{" WB "," BB ",}", 24, 0, 0, "expected a string key"},
        {"malformed: bad escape", "{\"we\\qight\":{}}", 0, 0, 0, "bad escape"},
        {"malformed: not an object", "[1,2]", 0, 0, 0, "not a JSON object"},
        {"malformed: bad number", "{" "\"weight\":{\"dtype\":\"F32\",\"shape\":[2,02],\"data_offsets\":[0,16]}," BB "}", 24, 0, 0, "malformed JSON"},
        {"trailing garbage", "{" WB "," BB "}x", 24, 0, 0, "trailing characters"},
        {"wrong dtype", "{\"weight\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}," BB "}", 24, 0, 0, "'weight' has dtype F16"},
        {"wrong shape", "{\"weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}," BB "}", 24, 0, 0, "'weight' has shape (4) in the file but (2,2)"},
        {"offsets out of range", "{" WB ",\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,32]}}", 24, 0, 0, "'bias': data_offsets [16, 32] are out of range"},
        {"offsets overlapping", "{" WB ",\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 24, 0, 0, "overlap"},
        {"offsets negative", "{" WB ",\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 24, 0, 0, "'bias': data_offsets [-8, 0] are negative"},
        {"offsets reversed", "{" WB ",\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,16]}}", 24, 0, 0, "'bias': data_offsets [24, 16] are out of range"},
        {"offsets wrong size", "{\"weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}," BB "}", 24, 0, 0, "'weight': data_offsets [0, 12] hold 12 bytes"},
        {"offsets huge", "{" WB ",\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,99999999999999999999]}}", 24, 0, 0, "'bias': data_offsets are not integers"},
        {"shape huge", "{" WB ",\"bias\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[16,24]}}", 24, 0, 0, "'bias': shape has too many elements"},
        {"numel * 8 wraps to 0", "{" WB "," BB ",\"x\":{\"dtype\":\"I64\",\"shape\":[4611686018427387904],\"data_offsets\":[24,24]}}", 24, 0, 0,
         "'x': I64 with 4611686018427387904 elements needs more bytes than the data section's 24"},
        {"gap", "{" WB ",\"bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[20,28]}}", 28, 0, 0, "gap"},
        {"missing tensor", "{" WB "}", 16, 0, 0, "tensor 'bias' is missing"},
        {"extra tensor", "{" WB "," BB ",\"extra\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[24,28]}}", 28, 0, 0, "extra tensor 'extra'"},
        {"duplicate", "{" WB "," BB "," BB "}", 24, 0, 0, "'bias' appears twice"},
        {"unknown field", "{\"weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16],\"x\":1}," BB "}", 24, 0, 0, "'weight': unknown field"},
        {"metadata not strings", "{" WB "," BB ",\"__metadata__\":{\"format\":1}}", 24, 0, 0, "not a string"},
    };
    for (i = 0; i < 64; i++) data[i] = (unsigned char)(i * 7 + 1);
    nb = th_module_bytes(lin, before, sizeof before);
    /* a good hand-made file loads */
    write_st(path, "{" WB "," BB ",\"__metadata__\":{\"format\":\"pt\",\"k\":\"a\\u00e9\\ud83d\\ude00\\n\"}}", data, 24, 0, 0);
    CHECK(dl_load(path, lin, NULL) == DL_OK, "hand-made file: %s", dl_error_message(ctx));
    CHECK(memcmp(th_host(dl_module_get(lin, "weight")), data, 16) == 0 && memcmp(th_host(dl_module_get(lin, "bias")), data + 16, 8) == 0, "values");
    nb = th_module_bytes(lin, before, sizeof before);
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        dl_result r;
        const char *m;
        write_st(path, cases[i].header, data, cases[i].dlen, cases[i].hlen, cases[i].cut);
        if (strcmp(cases[i].name, "file shorter than 8 bytes") == 0) {
            FILE *f = fopen(path, "wb");
            if (f) { fwrite("abcde", 1, 5, f); fclose(f); }
        }
        r = dl_load(path, lin, NULL);
        m = dl_error_message(ctx);
        CHECK(r == DL_ERR_FORMAT && strstr(m, cases[i].msg) && strstr(m, path), "%s: got %s \"%s\"",
              cases[i].name, dl_result_string(r), m);
        if (getenv("DL_NN_VERBOSE")) printf("  %-26s %s\n", cases[i].name, m);
        dl_clear_error(ctx);
        if (strcmp(cases[i].name, "wrong shape") && strcmp(cases[i].name, "missing tensor") &&
            strcmp(cases[i].name, "extra tensor")) {   /* the file itself is bad: dl_load_tensor says the same */
            dl_tensor *t = dl_load_tensor(ctx, path, "weight");
            m = dl_error_message(ctx);
            CHECK(!t && dl_last_error(ctx) == DL_ERR_FORMAT && strstr(m, cases[i].msg) && strstr(m, path) &&
                  !strncmp(m, "dl_load_tensor: ", 16), "dl_load_tensor, %s: \"%s\"", cases[i].name, m);
            dl_clear_error(ctx);
        }
        CHECK(th_module_bytes(lin, after, sizeof after) == nb && memcmp(before, after, nb) == 0, "%s: model changed", cases[i].name);
    }
    /* nesting deeper than the limit */
    strcpy(deep, "{\"__metadata__\":");
    for (i = 0; i < 100; i++) strcat(deep, "[");
    write_st(path, deep, data, 0, 0, 0);
    CHECK(dl_load(path, lin, NULL) == DL_ERR_FORMAT, "deep");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "nested too deeply");
    /* io */
    CHECK(dl_load(tmp_path("does_not_exist.safetensors"), lin, NULL) == DL_ERR_IO, "missing file");
    EXPECT_ERR(ctx, DL_ERR_IO, "cannot open");
    CHECK(dl_load("/tmp", lin, NULL) == DL_ERR_IO, "a directory");
    EXPECT_ERR(ctx, DL_ERR_IO, "/tmp");
    CHECK(dl_save("/nonexistent_dir_dl_nn/x.safetensors", lin, NULL) == DL_ERR_IO, "unwritable");
    EXPECT_ERR(ctx, DL_ERR_IO, "directory of /nonexistent_dir_dl_nn/x.safetensors (No such file or directory)");
    CHECK(th_module_bytes(lin, after, sizeof after) == nb && memcmp(before, after, nb) == 0, "model unchanged at the end");
    /* optimizer mismatch: SGD state into Adam */
    {
        dl_sgd_desc sd;
        dl_optim *so, *ao;
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.1f; sd.momentum = 0.5f;
        so = dl_sgd(lin, &sd);
        ao = dl_adam(lin, NULL);
        CHECK(dl_save(path, lin, so) == DL_OK, "save with sgd");
        CHECK(dl_load(path, lin, ao) == DL_ERR_FORMAT, "sgd into adam");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "optim.weight.exp_avg' is missing");
        sd.momentum = 0.0f;
        CHECK(dl_load(path, lin, dl_sgd(lin, &sd)) == DL_ERR_FORMAT, "momentum state into plain sgd");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "extra tensor 'optim.weight.momentum_buffer'");
        CHECK(dl_save(path, lin, NULL) == DL_OK && dl_load(path, lin, so) == DL_ERR_FORMAT, "model-only file into optim");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "'optim.step' is missing");
    }
    /* a child named "optim": dl_load_module skips only the optimizer state dl_save
       wrote, so an unexpected "optim.*" key is still an error (strict loading) */
    {
        dl_module *net[2];
        dl_optim *ao;
        for (i = 0; i < 2; i++) {
            dl_module *o = dl_module_new(ctx, "Opt", NULL, 0);
            net[i] = dl_module_new(ctx, "Net", NULL, 0);
            dl_module_add(net[i], "fc", dl_nn_linear(ctx, 3, 2, true));
            dl_module_add(net[i], "optim", o);
            dl_module_param(o, "weight", dl_randn(ctx, DL_SHAPE(2)));
            if (i == 1) dl_module_param(o, "extra", dl_randn(ctx, DL_SHAPE(3)));   /* net[1]: one more */
        }
        CHECK(dl_save_module(path, net[1]) == DL_OK, "save the model with optim.extra");
        CHECK(dl_load_module(path, net[0]) == DL_ERR_FORMAT, "optim.extra into a model without it: refused");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "the file has an extra tensor 'optim.extra' that the module does not have");
        ao = dl_adam(net[0], NULL);
        CHECK(ao && dl_save(path, net[0], ao) == DL_OK && dl_load_module(path, net[0]) == DL_OK,
              "dl_save with Adam state, dl_load_module of the same model: the state is skipped: %s",
              dl_error_message(ctx));
        CHECK(dl_save(path, net[1], NULL) == DL_OK && dl_load_module(path, net[0]) == DL_ERR_FORMAT,
              "a dl_save file without optimizer state: optim.extra refused too");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "extra tensor 'optim.extra'");
    }
    remove(path);
    dl_ctx_free(ctx);
}

/* the file that gen_optim.py --verify checks: Linear(5,3) with known values,
   SGD(lr 0.1, momentum 0.5) after 2 steps with all-ones gradients */
static int write_for_torch(const char *path)
{
    dl_ctx *ctx = new_ctx(1);
    dl_module *lin = dl_nn_linear(ctx, 5, 3, true);
    dl_tensor *w = dl_module_get(lin, "weight"), *b = dl_module_get(lin, "bias");
    dl_sgd_desc sd;
    dl_optim *o;
    int i, s;
    dl_result r;
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.1f; sd.momentum = 0.5f;
    o = dl_sgd(lin, &sd);
    for (s = 0; s < 2; s++) {
        dl_backward(dl_sum(dl_add(dl_sum(w, DL_ALL, false), dl_sum(b, DL_ALL, false)), DL_ALL, false));
        dl_optim_step(o);
        dl_optim_zero_grad(o);
        dl_step_end(ctx);
    }
    for (i = 0; i < 15; i++) th_set(w, i, (float)i * 0.125f - 1.0f);
    th_set(b, 0, 0.5f); th_set(b, 1, -0.25f); th_set(b, 2, 2.0f);
    r = dl_save(path, lin, o);
    if (r != DL_OK) printf("ERROR: %s\n", dl_error_message(ctx));
    else printf("wrote %s\n", path);
    dl_ctx_free(ctx);
    return r == DL_OK;
}

/* Sequential runs ReLU then max pool as max pool then ReLU: the outputs and
   the input gradients must be the same bits as dl_max_pool*d(dl_relu(x)),
   with ties, zeros of both signs, infinities, NaN, windows with nothing
   positive, padding, ceil mode and dilation, in 1, 2 and 3 dimensions */
static void test_relu_pool_order(void)
{
    static const float vals[] = {-2.0f, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 3.0f};
    dl_ctx *ctx = new_ctx(3);
    int c;
    for (c = 0; c < 8; c++) {
        int sp = c < 2 ? 1 : c < 6 ? 2 : 3;
        int64_t n = 2 * 3 * 7 * (sp >= 2 ? 9 : 1) * (sp == 3 ? 5 : 1), i;
        dl_pool_desc pd = dl_pool_desc_make(c == 3 ? 3 : 2, c == 4 ? 1 : 0, c == 3 ? 1 : 0, c == 5, true);
        dl_module *mods[3], *seq;
        dl_tensor *x, *x2, *y, *ref, *gy;
        float *h = (float *)malloc(sizeof(float) * (size_t)n);
        uint64_t r = 12345u + (uint64_t)c;
        dl_backward_desc bd;
        if (c == 1 || c == 5) { int k; for (k = 0; k < sp; k++) pd.dilation[k] = 2; }
        for (i = 0; i < n; i++) {
            r = r * 6364136223846793005u + 1442695040888963407u;
            h[i] = vals[(r >> 33) % 8];
            if ((r >> 20) % 97 == 0) h[i] = NAN;
            else if ((r >> 20) % 97 == 1) h[i] = -INFINITY;
            else if ((r >> 20) % 97 == 2) h[i] = INFINITY;
        }
        x = dl_requires_grad(dl_from_array(ctx, sp == 1 ? DL_SHAPE(2, 3, 7) : sp == 2 ? DL_SHAPE(2, 3, 7, 9)
                                                : DL_SHAPE(2, 3, 7, 9, 5), h), true);
        x2 = dl_requires_grad(dl_from_array(ctx, dl_shape_make(x->ndim, x->shape), h), true);
        free(h);
        mods[0] = dl_nn_relu(ctx);
        mods[1] = sp == 1 ? dl_nn_max_pool1d(ctx, &pd) : sp == 2 ? dl_nn_max_pool2d(ctx, &pd)
                                                     : dl_nn_max_pool3d(ctx, &pd);
        mods[2] = dl_nn_sigmoid(ctx);
        seq = dl_nn_sequential(ctx, c == 7 ? 2 : 3, mods);
        y = dl_module_forward(seq, x);
        ref = sp == 1 ? dl_max_pool1d(dl_relu(x2), &pd) : sp == 2 ? dl_max_pool2d(dl_relu(x2), &pd)
                                                        : dl_max_pool3d(dl_relu(x2), &pd);
        if (c != 7) ref = dl_sigmoid(ref);
        CHECK(y && ref && th_same_bytes(y, ref), "relu+max_pool%dd case %d: the same output bits", sp, c);
        if (!y || !ref) { dl_clear_error(ctx); continue; }
        gy = dl_randn(ctx, dl_shape_make(y->ndim, y->shape));
        memset(&bd, 0, sizeof bd);
        bd.grad = gy;
        CHECK(dl_backward_ex(y, &bd) == DL_OK && dl_backward_ex(ref, &bd) == DL_OK && x->grad && x2->grad &&
              th_same_bytes(x->grad, x2->grad), "relu+max_pool%dd case %d: the same input gradient bits", sp, c);
        dl_step_end(ctx);
    }
    dl_ctx_free(ctx);
}

/* n values of quarters around vals (zeros of both signs, ties) into h, and
   into hr (or NULL) halves of vals, from an LCG seeded with s */
static void fill_quarters(float *h, float *hr, int64_t n, uint64_t s)
{
    static const float vals[] = {-2.0f, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 3.0f};
    int64_t i;
    for (i = 0; i < n; i++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        h[i] = vals[(s >> 33) % 8] + (float)((s >> 40) % 5) * 0.25f;
        if (hr) hr[i] = vals[(s >> 45) % 8] * 0.5f;
    }
}

/* a module's parameters away from 1 and 0 (the affine part counts) */
static void randomize_params(dl_ctx *ctx, int np, const dl_named_tensor *ps)
{
    int k;
    dl_no_grad_begin(ctx);
    for (k = 0; k < np; k++) dl_copy_(ps[k].t, dl_add_scalar(dl_rand(ctx, dl_shape_make(ps[k].t->ndim, ps[k].t->shape)), 0.5f * (float)k));
    dl_no_grad_end(ctx);
}

/* Sequential runs BatchNorm then ReLU as one op (the ReLU in the apply
   pass, its mask in the backward's): the output, the input gradient and the
   weight and bias gradients must be the same bits as the module then
   dl_relu, in training and eval, 1-d and 2-d, with a max pool after (the
   ReLU/pool order rule then meets the fused ReLU), first order and with
   create_graph, and with an input that needs no gradient (the mask then
   has no dx to live in). Values include zeros of both signs and ties.
   Cases 9-13 take dl_module_forward_relu instead of the Sequential (cases
   0-3 and 6 again), case 14 that on a Linear (no fusion: the same as
   dl_relu after it). Cases 15-19 take the 2x2 pool again, which a GPU runs
   in the same op (bn_pool): with create_graph, eval with an input that
   needs no gradient, odd height and width (the pool then stays its own
   op), NaN and infinities (eval: the running statistics stay finite), and
   an odd width in eval. */
static void test_bn_relu_fusion(void)
{
    dl_ctx *ctx = new_ctx(4);
    int c;
    for (c = 0; c < 20; c++) {
        static const int like[6] = {0, 1, 2, 3, 6, 0};
        bool fr = c >= 9 && c < 15, lin = c == 14;
        int b = fr ? like[c - 9] : c;
        bool two = b >= 2, train = b % 2 == 0, pool = (b >= 4 && b < 6) || b >= 15;
        bool second = b == 6 || b == 7 || b == 15, nox = b == 8 || b == 16;
        int64_t H = b == 17 ? 7 : 6, W = b == 17 || b == 19 ? 7 : 6, n = two ? 4 * 3 * H * W : 5 * 7, i;
        dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
        dl_module *mods[3], *seq;
        dl_tensor *x, *x2, *y, *ref, *gy, *g0[2] = {NULL, NULL}, *clean = NULL;
        const dl_named_tensor *ps;
        float *h = (float *)malloc(sizeof(float) * (size_t)n);
        dl_backward_desc bd;
        int np;
        if (b >= 15) train = b == 15 || b == 17;
        fill_quarters(h, NULL, n, 777u + (uint64_t)c);
        if (b == 18) clean = dl_from_array(ctx, DL_SHAPE(4, 3, H, W), h);   /* (eval: finite running statistics) */
        for (i = 0; b == 18 && i < n; i += 7) h[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
        x = dl_requires_grad(dl_from_array(ctx, two ? DL_SHAPE(4, 3, H, W) : DL_SHAPE(5, 7), h), !nox);
        x2 = dl_requires_grad(dl_from_array(ctx, dl_shape_make(x->ndim, x->shape), h), !nox);
        free(h);
        mods[0] = lin ? dl_nn_linear(ctx, 7, 7, true) : two ? dl_nn_batch_norm2d(ctx, 3) : dl_nn_batch_norm1d(ctx, 7);
        mods[1] = dl_nn_relu(ctx);
        mods[2] = dl_nn_max_pool2d(ctx, &pd);
        seq = dl_nn_sequential(ctx, pool ? 3 : 2, mods);
        np = dl_module_named_parameters(mods[0], &ps);
        randomize_params(ctx, np, ps);
        if (!train) {   /* running statistics of a batch first */
            dl_module_forward(mods[0], clean ? clean : x);
            dl_module_train(seq, false);
        }
        memset(&bd, 0, sizeof bd);
        bd.create_graph = second;
        y = fr ? dl_module_forward_relu(mods[0], x) : dl_module_forward(seq, x);
        ref = dl_relu(dl_module_forward(mods[0], x2));
        if (pool) ref = dl_max_pool2d(ref, &pd);
        CHECK(y && ref && th_same_bytes(y, ref), "batch_norm+relu case %d: the same output bits", c);
        if (!y || !ref) { dl_clear_error(ctx); continue; }
        gy = dl_randn(ctx, dl_shape_make(y->ndim, y->shape));
        bd.grad = gy;
        dl_module_zero_grad(mods[0]);   /* (the eval cases' first forward: no gradients) */
        CHECK(dl_backward_ex(y, &bd) == DL_OK && (nox || x->grad), "batch_norm+relu case %d: backward", c);
        g0[0] = np > 0 && ps[0].t->grad ? dl_copy(ps[0].t->grad) : NULL;
        g0[1] = np > 1 && ps[1].t->grad ? dl_copy(ps[1].t->grad) : NULL;
        dl_module_zero_grad(mods[0]);
        CHECK(dl_backward_ex(ref, &bd) == DL_OK && (nox ? !x->grad && !x2->grad : x->grad && x2->grad &&
                                                    th_same_bytes(x->grad, x2->grad)),
              "batch_norm+relu case %d: the same input gradient bits", c);
        CHECK(np == 2 && g0[0] && g0[1] && ps[0].t->grad && ps[1].t->grad && th_same_bytes(ps[0].t->grad, g0[0]) &&
              th_same_bytes(ps[1].t->grad, g0[1]), "batch_norm+relu case %d: the same weight and bias gradient bits", c);
        dl_step_end(ctx);
    }
    {   /* eval, an empty height or width: the pool's error on every device, not an empty output */
        dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
        dl_module *mods[3], *seq;
        int k;
        mods[0] = dl_nn_batch_norm2d(ctx, 3);
        mods[1] = dl_nn_relu(ctx);
        mods[2] = dl_nn_max_pool2d(ctx, &pd);
        seq = dl_nn_sequential(ctx, 3, mods);
        dl_module_train(seq, false);
        for (k = 0; k < 2; k++) {
            dl_tensor *y = dl_module_forward(seq, dl_zeros(ctx, k ? DL_SHAPE(2, 3, 4, 0) : DL_SHAPE(2, 3, 0, 4)));
            CHECK(!y && dl_last_error(ctx) == DL_ERR_SHAPE && strstr(dl_error_message(ctx), "dl_max_pool2d") &&
                  strstr(dl_error_message(ctx), "output size 0 < 1"),
                  "batch_norm+relu+max_pool, eval, empty %s: the pool's error (%s)", k ? "width" : "height",
                  dl_error_message(ctx));
            dl_clear_error(ctx);
        }
        dl_step_end(ctx);
    }
    {   /* eval, an empty batch (N 0; 2-d and 4-d): the backward's sums of nothing, weight and bias
           gradients 0 (as torch), an empty input gradient */
        int k;
        for (k = 0; k < 2; k++) {
            dl_module *bn = k ? dl_nn_batch_norm2d(ctx, 3) : dl_nn_batch_norm1d(ctx, 3);
            dl_tensor *x = dl_requires_grad(dl_zeros(ctx, k ? DL_SHAPE(0, 3, 4, 6) : DL_SHAPE(0, 3)), true), *y;
            const dl_named_tensor *ps;
            float gw[3] = {1, 1, 1}, gb[3] = {1, 1, 1};
            dl_module_named_parameters(bn, &ps);
            dl_module_train(bn, false);
            y = dl_module_forward(bn, x);
            CHECK(y && y->numel == 0 && dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && x->grad &&
                      x->grad->numel == 0 && ps[0].t->grad && ps[1].t->grad && dl_read(ps[0].t->grad, gw, 3) == DL_OK &&
                      dl_read(ps[1].t->grad, gb, 3) == DL_OK && gw[0] == 0 && gw[1] == 0 && gw[2] == 0 && gb[0] == 0 &&
                      gb[1] == 0 && gb[2] == 0,
                  "batch_norm, eval, an empty batch %s: zero weight and bias gradients: %s", k ? "(0,3,4,6)" : "(0,3)",
                  dl_error_message(ctx));
            dl_clear_error(ctx);
            dl_step_end(ctx);
        }
    }
    dl_ctx_free(ctx);
}

/* dl_module_forward_add_relu: relu(bn(x) + r) as one op where m is a
   BatchNorm and r has x's shape. The output and the gradients of x, r,
   weight and bias must be the same bits as the three ops:
     0 training 2-d     1 eval 2-d       2 training 1-d     3 eval 1-d
     4 create_graph     5 r needs no gradient
     6 only r needs one (eval; the mask alone)
     7 x needs none (the first pass writes r's gradient, no dx)
     8 eval, weight and bias need none (the dx pass writes it)
     9 r broadcast (1,3,1,1): not fused, the three ops
    10 r is x itself    11 a Linear (not fused)
   Values: quarters, so bn(x) + r hits zeros of both signs and ties. */
static void test_bn_add_relu_fusion(void)
{
    dl_ctx *ctx = new_ctx(4);
    int c;
    for (c = 0; c < 12; c++) {
        bool two = c != 2 && c != 3 && c != 11, train = c != 1 && c != 3 && c != 6 && c != 8;
        bool xg = c != 6 && c != 7, rg = c != 5, pg = c != 6 && c != 8, lin = c == 11, self = c == 10;
        int64_t n = two ? 4 * 3 * 6 * 6 : 5 * 7;
        dl_module *m;
        dl_tensor *x, *x2, *r, *r2, *y, *ref, *gy, *g0[2] = {NULL, NULL};
        const dl_named_tensor *ps;
        float *h = (float *)malloc(sizeof(float) * (size_t)n), *hr = (float *)malloc(sizeof(float) * (size_t)n);
        dl_backward_desc bd;
        int np, k;
        fill_quarters(h, hr, n, 991u + (uint64_t)c);
        x = dl_requires_grad(dl_from_array(ctx, two ? DL_SHAPE(4, 3, 6, 6) : DL_SHAPE(5, 7), h), xg);
        x2 = dl_requires_grad(dl_from_array(ctx, dl_shape_make(x->ndim, x->shape), h), xg);
        if (c == 9) {
            r = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(1, 3, 1, 1), hr), rg);
            r2 = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(1, 3, 1, 1), hr), rg);
        } else {
            r = self ? x : dl_requires_grad(dl_from_array(ctx, dl_shape_make(x->ndim, x->shape), hr), rg);
            r2 = self ? x2 : dl_requires_grad(dl_from_array(ctx, dl_shape_make(x->ndim, x->shape), hr), rg);
        }
        free(h);
        free(hr);
        m = lin ? dl_nn_linear(ctx, 7, 7, true) : two ? dl_nn_batch_norm2d(ctx, 3) : dl_nn_batch_norm1d(ctx, 7);
        np = dl_module_named_parameters(m, &ps);
        randomize_params(ctx, np, ps);
        for (k = 0; k < np; k++) dl_requires_grad(ps[k].t, pg);
        if (!train) {   /* running statistics of a batch first */
            dl_module_forward(m, x);
            dl_module_train(m, false);
        }
        memset(&bd, 0, sizeof bd);
        bd.create_graph = c == 4;
        y = dl_module_forward_add_relu(m, x, r);
        ref = dl_relu(dl_add(dl_module_forward(m, x2), r2));
        CHECK(y && ref && th_same_bytes(y, ref), "batch_norm+add+relu case %d: the same output bits", c);
        if (!y || !ref) { dl_clear_error(ctx); dl_step_end(ctx); continue; }
        gy = dl_randn(ctx, dl_shape_make(y->ndim, y->shape));
        bd.grad = gy;
        dl_module_zero_grad(m);
        CHECK(dl_backward_ex(y, &bd) == DL_OK, "batch_norm+add+relu case %d: backward", c);
        g0[0] = np > 0 && ps[0].t->grad ? dl_copy(ps[0].t->grad) : NULL;
        g0[1] = np > 1 && ps[1].t->grad ? dl_copy(ps[1].t->grad) : NULL;
        dl_module_zero_grad(m);
        CHECK(dl_backward_ex(ref, &bd) == DL_OK, "batch_norm+add+relu case %d: the reference's backward", c);
        CHECK(xg ? x->grad && x2->grad && th_same_bytes(x->grad, x2->grad) : !x->grad && !x2->grad,
              "batch_norm+add+relu case %d: the same input gradient bits", c);
        CHECK(self || (rg ? r->grad && r2->grad && th_same_bytes(r->grad, r2->grad) : !r->grad && !r2->grad),
              "batch_norm+add+relu case %d: the same residual gradient bits", c);
        CHECK(pg ? np == 2 && g0[0] && g0[1] && ps[0].t->grad && ps[1].t->grad &&
                   th_same_bytes(ps[0].t->grad, g0[0]) && th_same_bytes(ps[1].t->grad, g0[1])
                 : !g0[0] && !g0[1] && !ps[0].t->grad && !ps[1].t->grad,
              "batch_norm+add+relu case %d: the same weight and bias gradient bits", c);
        dl_step_end(ctx);
    }
    dl_ctx_free(ctx);
}

/* a fused op's output y against ref (the ops it replaces, on x2), then a
   backward of each with the same random gradient: the same bits of the
   output, of x's gradient (none for either where nox) and of module m's
   weight and bias gradients (no bias gradient where nob); dl_step_end */
static void fused_compare(dl_ctx *ctx, const char *what, int a, int c, dl_tensor *y, dl_tensor *ref,
                          dl_backward_desc *bd, dl_module *m, dl_tensor *x, dl_tensor *x2, bool nox, bool nob)
{
    const dl_named_tensor *ps;
    dl_tensor *g0[2] = {NULL, NULL};
    int np = dl_module_named_parameters(m, &ps), k;
    if (np > 2) np = 2;
    CHECK(y && ref && th_same_bytes(y, ref), "%s %d case %d: the same output bits", what, a, c);
    if (!y || !ref) { dl_clear_error(ctx); dl_step_end(ctx); return; }
    bd->grad = dl_randn(ctx, dl_shape_make(y->ndim, y->shape));
    dl_module_zero_grad(m);
    CHECK(dl_backward_ex(y, bd) == DL_OK, "%s %d case %d: backward", what, a, c);
    for (k = 0; k < np; k++) g0[k] = ps[k].t->grad ? dl_copy(ps[k].t->grad) : NULL;
    dl_module_zero_grad(m);
    CHECK(dl_backward_ex(ref, bd) == DL_OK, "%s %d case %d: the reference's backward", what, a, c);
    CHECK(nox ? !x->grad && !x2->grad : x->grad && x2->grad && th_same_bytes(x->grad, x2->grad),
          "%s %d case %d: the same input gradient bits", what, a, c);
    for (k = 0; k < np; k++)
        CHECK(k == 1 && nob ? !g0[k] && !ps[k].t->grad
                            : g0[k] && ps[k].t->grad && th_same_bytes(ps[k].t->grad, g0[k]),
              "%s %d case %d: the same %s gradient bits", what, a, c, ps[k].name);
    dl_step_end(ctx);
}

/* Sequential's Linear then ReLU, Sigmoid or Tanh (and dl_module_forward_relu
   on a Linear): on a GPU the bias and the activation are one op, one pass
   each way. Output and the gradients of x, weight and bias must be the same
   bits as dl_linear then the activation, for each activation:
     0 (6, 7) -> 5      1 3-d x (2, 3, 7)      2 create_graph
     3 bias needs no gradient (the mask alone)  4 x needs none
     5 1100 rows (the bias's sum is not sequential there: two ops)
     6 one output column (likewise)   7 no bias (never fused)
     8 dl_module_forward_relu (ReLU only) */
static void test_linear_act_fusion(void)
{
    dl_ctx *ctx = new_ctx(4);
    int c, a;
    for (a = 0; a < 3; a++)
        for (c = 0; c < 9; c++) {
            int64_t rows = c == 5 ? 1100 : 6, out = c == 6 ? 1 : 5, n = rows * 7;
            dl_module *mods[2], *seq;
            dl_tensor *x, *x2, *y, *ref;
            const dl_named_tensor *ps;
            float *h;
            dl_backward_desc bd;
            int np;
            if (c == 8 && a != 0) continue;
            h = (float *)malloc(sizeof(float) * (size_t)n);
            fill_quarters(h, NULL, n, 4242u + (uint64_t)(10 * a + c));
            x = dl_requires_grad(dl_from_array(ctx, c == 1 ? DL_SHAPE(2, 3, 7) : DL_SHAPE(rows, 7), h), c != 4);
            x2 = dl_requires_grad(dl_from_array(ctx, dl_shape_make(x->ndim, x->shape), h), c != 4);
            free(h);
            mods[0] = dl_nn_linear(ctx, 7, out, c != 7);
            mods[1] = a == 0 ? dl_nn_relu(ctx) : a == 1 ? dl_nn_sigmoid(ctx) : dl_nn_tanh(ctx);
            seq = dl_nn_sequential(ctx, 2, mods);
            np = dl_module_named_parameters(mods[0], &ps);
            randomize_params(ctx, np, ps);
            if (c == 3) dl_requires_grad(ps[1].t, false);
            memset(&bd, 0, sizeof bd);
            bd.create_graph = c == 2;
            y = c == 8 ? dl_module_forward_relu(mods[0], x) : dl_module_forward(seq, x);
            ref = dl_linear(x2, ps[0].t, c == 7 ? NULL : ps[1].t);
            ref = a == 0 ? dl_relu(ref) : a == 1 ? dl_sigmoid(ref) : dl_tanh(ref);
            fused_compare(ctx, "linear+act", a, c, y, ref, &bd, mods[0], x, x2, c == 4, c == 3);
        }
    dl_ctx_free(ctx);
}

/* two leaf inputs of shape (nd, xs) with the same quarter-step values
   (fill_quarters, seed), requiring grad where grad: *x for the fused op,
   *x2 for the ops it replaces */
static void twin_inputs(dl_ctx *ctx, int nd, const int64_t *xs, uint64_t seed, bool grad, dl_tensor **x,
                        dl_tensor **x2)
{
    int64_t n = 1;
    int k;
    float *h;
    for (k = 0; k < nd; k++) n *= xs[k];
    h = (float *)malloc(sizeof(float) * (size_t)n);
    fill_quarters(h, NULL, n, seed);
    *x = dl_requires_grad(dl_from_array(ctx, dl_shape_make(nd, xs), h), grad);
    *x2 = dl_requires_grad(dl_from_array(ctx, dl_shape_make(nd, xs), h), grad);
    free(h);
}

/* the activation module a (0 ReLU, 1 Sigmoid, 2 Tanh) */
static dl_module *act_module(dl_ctx *ctx, int a)
{
    return a == 0 ? dl_nn_relu(ctx) : a == 1 ? dl_nn_sigmoid(ctx) : dl_nn_tanh(ctx);
}

/* conv's weight (into *w) and bias randomized, the bias shifted to both
   signs and without gradient where nobg; its bias, or NULL */
static dl_tensor *conv_params(dl_ctx *ctx, dl_module *conv, bool nobg, dl_tensor **w)
{
    const dl_named_tensor *ps;
    int np = dl_module_named_parameters(conv, &ps);
    randomize_params(ctx, np, ps);
    *w = ps[0].t;
    if (np < 2) return NULL;
    dl_no_grad_begin(ctx);
    dl_copy_(ps[1].t, dl_add_scalar(ps[1].t, -1.0f));
    dl_no_grad_end(ctx);
    if (nobg) dl_requires_grad(ps[1].t, false);
    return ps[1].t;
}

/* Sequential runs a small convolution then ReLU, Sigmoid or Tanh as one op
   where the backend fuses them (a GPU's direct sums: the activation in the
   conv's launch, its backward in the bias sum's pass): the output and the
   gradients of the input, weight and bias must be the bits of dl_conv*d
   then the activation. Cases: 2-d (LeNet's first), 1-d, create_graph, a
   bias without gradient, an input without, no bias, stride 2 with groups,
   an unbatched input, dl_module_forward_relu (ReLU only), 16 -> 16
   channels (the direct path declines: the two ops), 3-d, a max pool after
   (ReLU only); elsewhere (the CPU) the two ops themselves. */
static void test_conv_act_fusion(void)
{
    dl_ctx *ctx = new_ctx(4);
    int c, a;
    for (a = 0; a < 3; a++)
        for (c = 0; c < 12; c++) {
            int sp = c == 1 ? 1 : c == 10 ? 3 : 2, k;
            int64_t ci = c == 9 ? 16 : c == 6 ? 4 : c == 1 ? 2 : 1, co = c == 9 ? 16 : c == 6 ? 4 : 6;
            int64_t ksz = c == 0 ? 5 : 3, hw = c == 10 ? 5 : 9, nb = c == 7 ? 1 : 3, xs[5];
            int nd = 0;
            dl_conv_desc cd = dl_conv_desc_make(c == 6 ? 2 : 1, c == 0 ? 2 : 1, 1, c == 6 ? 4 : 1);
            dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
            dl_module *mods[3], *seq;
            dl_tensor *x, *x2, *y, *ref, *b, *w;
            dl_backward_desc bd;
            if ((c == 8 || c == 11) && a != 0) continue;
            if (c != 7) xs[nd++] = nb;
            xs[nd++] = ci;
            for (k = 0; k < sp; k++) xs[nd++] = hw;
            twin_inputs(ctx, nd, xs, 5151u + (uint64_t)(20 * a + c), c != 4, &x, &x2);
            mods[0] = sp == 1 ? dl_nn_conv1d(ctx, ci, co, ksz, &cd, c != 5)
                      : sp == 2 ? dl_nn_conv2d(ctx, ci, co, ksz, &cd, c != 5) : dl_nn_conv3d(ctx, ci, co, ksz, &cd, c != 5);
            mods[1] = act_module(ctx, a);
            mods[2] = dl_nn_max_pool2d(ctx, &pd);
            seq = dl_nn_sequential(ctx, c == 11 ? 3 : 2, mods);
            b = conv_params(ctx, mods[0], c == 3, &w);
            memset(&bd, 0, sizeof bd);
            bd.create_graph = c == 2;
            y = c == 8 ? dl_module_forward_relu(mods[0], x) : dl_module_forward(seq, x);
            ref = sp == 1 ? dl_conv1d(x2, w, b, &cd) : sp == 2 ? dl_conv2d(x2, w, b, &cd) : dl_conv3d(x2, w, b, &cd);
            ref = a == 0 ? dl_relu(ref) : a == 1 ? dl_sigmoid(ref) : dl_tanh(ref);
            if (c == 11) ref = dl_max_pool2d(ref, &pd);
            fused_compare(ctx, "conv+act", a, c, y, ref, &bd, mods[0], x, x2, c == 4, c == 3);
        }
    dl_ctx_free(ctx);
}

/* Sequential runs a small 2-d convolution, ReLU/Sigmoid/Tanh and a 2x2,
   stride-2 average pool (d2l's LeNet) as one op where the backend fuses
   them (a GPU's direct sums: the activation and the pool in the conv's
   launch, the pool's adjoint and the activation's backward in the bias
   sum's pass): the output and the gradients of the input, weight and bias
   must be the bits of dl_conv2d, the activation and dl_avg_pool2d. Cases:
   LeNet's first (1 -> 6, 5x5, padding 2) and second (6 -> 16, 5x5)
   convolutions, create_graph, a bias without gradient, an input without,
   no bias (the adjoint and the activation's backward as ops), an odd
   output (9x9: the pool is not fused), an unbatched input, stride 2 with
   groups, the pool's stride given as 2, 16 -> 16 channels (the direct path
   declines: three ops), a pool of stride 1 (not this pool: never fused);
   elsewhere (the CPU) the three ops themselves. */
static void test_conv_act_pool_fusion(void)
{
    dl_ctx *ctx = new_ctx(4);
    int c, a;
    for (a = 0; a < 3; a++)
        for (c = 0; c < 12; c++) {
            int64_t ci = c == 10 ? 16 : c == 8 ? 4 : c == 1 ? 6 : 1, co = c == 10 ? 16 : c == 8 ? 4 : c == 1 ? 16 : 6;
            int64_t ksz = c <= 1 ? 5 : 3, hw = c == 1 ? 14 : c == 6 ? 9 : 8, xs[4];
            int nd = 0;
            dl_conv_desc cd = dl_conv_desc_make(c == 8 ? 2 : 1, c == 0 ? 2 : c == 1 ? 0 : 1, 1, c == 8 ? 4 : 1);
            dl_pool_desc pd = dl_pool_desc_make(2, c == 9 ? 2 : c == 11 ? 1 : 0, 0, false, true);
            dl_module *mods[3], *seq;
            dl_tensor *x, *x2, *y, *ref, *b, *w;
            dl_backward_desc bd;
            if (c != 7) xs[nd++] = 3;
            xs[nd++] = ci;
            xs[nd++] = hw;
            xs[nd++] = hw;
            twin_inputs(ctx, nd, xs, 6161u + (uint64_t)(20 * a + c), c != 4, &x, &x2);
            mods[0] = dl_nn_conv2d(ctx, ci, co, ksz, &cd, c != 5);
            mods[1] = act_module(ctx, a);
            mods[2] = dl_nn_avg_pool2d(ctx, &pd);
            seq = dl_nn_sequential(ctx, 3, mods);
            b = conv_params(ctx, mods[0], c == 3, &w);
            memset(&bd, 0, sizeof bd);
            bd.create_graph = c == 2;
            y = dl_module_forward(seq, x);
            ref = dl_conv2d(x2, w, b, &cd);
            ref = dl_avg_pool2d(a == 0 ? dl_relu(ref) : a == 1 ? dl_sigmoid(ref) : dl_tanh(ref), &pd);
            fused_compare(ctx, "conv+act+avgpool", a, c, y, ref, &bd, mods[0], x, x2, c == 4, c == 3);
        }
    dl_ctx_free(ctx);
}

/* nn.Embedding in a character-level MLP language model against PyTorch
   (gen_embedding.py): torch's initial state_dict loads (padding row 0 of
   zeros), six SGD steps (momentum, weight decay) give torch's losses and
   parameters, the padding row stays 0, eval logits match, int32 contexts
   give the int64 ones' bits, and a captured step replays eager's bits */
static dl_module *emb_mlp(dl_ctx *ctx)
{
    dl_module *m[5];
    m[0] = dl_nn_embedding(ctx, 27, 10);
    CHECK(m[0] && dl_nn_embedding_padding(m[0], 0) == DL_OK, "Embedding(27, 10, padding_idx=0): %s",
          dl_error_message(ctx));
    m[1] = dl_nn_flatten(ctx);
    m[2] = dl_nn_linear(ctx, 30, 64, true);
    m[3] = dl_nn_tanh(ctx);
    m[4] = dl_nn_linear(ctx, 64, 27, true);
    return dl_nn_sequential(ctx, 5, m);
}

static void emb_cmp(dl_ctx *ctx, const char *what, dl_tensor *got, const char *key)
{
    const char *data = "tests/golden/embedding_data.safetensors";
    dl_tensor *want = dl_load_tensor(ctx, data, key);
    float *a, *b;
    CHECK(got && want && got->numel == want->numel, "%s: %s", what, dl_error_message(ctx));
    if (!got || !want || got->numel != want->numel) { dl_clear_error(ctx); return; }
    a = (float *)malloc(sizeof(float) * (size_t)got->numel + 1);
    b = (float *)malloc(sizeof(float) * (size_t)got->numel + 1);
    if (a && b && dl_read(got, a, got->numel) == DL_OK && dl_read(want, b, want->numel) == DL_OK)
        cmp(what, a, b, (long)got->numel);
    else CHECK(0, "%s: read", what);
    free(a);
    free(b);
    dl_free(want);
}

static void test_embedding_mlp(void)
{
    const char *init = "tests/golden/embedding_init.safetensors", *data = "tests/golden/embedding_data.safetensors";
    dl_ctx *ctx = new_ctx(3);
    dl_module *net = emb_mlp(ctx);
    dl_sgd_desc sd;
    dl_optim *opt;
    dl_tensor *X, *Y, *losses, *row0, *logits64;
    const dl_named_tensor *ps;
    float lw[6], r0[10], l64[4 * 27], l32[4 * 27];
    int64_t xv[32 * 3];
    int32_t x32[4 * 3];
    int k, np;
    CHECK(dl_load_module(init, net) == DL_OK, "torch's state_dict loads: %s", dl_error_message(ctx));
    X = dl_load_tensor(ctx, data, "X");
    Y = dl_load_tensor(ctx, data, "Y");
    losses = dl_load_tensor(ctx, data, "losses");
    CHECK(X && Y && losses && X->dtype == DL_DTYPE_I64 && dl_read(losses, lw, 6) == DL_OK, "data: %s",
          dl_error_message(ctx));
    if (!X || !Y || !losses) { dl_clear_error(ctx); dl_ctx_free(ctx); return; }
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.1f;
    sd.momentum = 0.9f;
    sd.weight_decay = 1e-4f;
    opt = dl_sgd(net, &sd);
    for (k = 0; k < 6; k++) {
        dl_tensor *loss;
        float l;
        dl_optim_zero_grad(opt);
        loss = dl_cross_entropy(dl_module_forward(net, X), Y, NULL);
        l = loss ? dl_item(loss) : -1.0f;
        CHECK(fabsf(l - lw[k]) <= 1e-5f * fabsf(lw[k]), "step %d: loss %.8g, torch %.8g", k, (double)l, (double)lw[k]);
        CHECK(dl_backward(loss) == DL_OK && dl_optim_step(opt) == DL_OK, "step %d: %s", k, dl_error_message(ctx));
        dl_step_end(ctx);
    }
    np = dl_module_named_parameters(net, &ps);
    CHECK(np == 5, "5 parameters (%d)", np);
    for (k = 0; k < np; k++) {
        char key[64];
        snprintf(key, sizeof key, "final.%s", ps[k].name);
        emb_cmp(ctx, key, ps[k].t, key);
    }
    row0 = dl_narrow(dl_module_get(net, "0.weight"), 0, 0, 1);
    CHECK(row0 && dl_read(row0, r0, 10) == DL_OK && r0[0] == 0.0f && r0[9] == 0.0f,
          "the padding row stays 0 (%g)", (double)r0[0]);
    dl_module_train(net, false);
    logits64 = dl_module_forward(net, dl_narrow(X, 0, 0, 4));
    emb_cmp(ctx, "eval logits", logits64, "eval");
    CHECK(dl_read_int64(X, xv, 32 * 3) == DL_OK, "contexts");
    for (k = 0; k < 12; k++) x32[k] = (int32_t)xv[k];
    CHECK(logits64 && dl_read(logits64, l64, 4 * 27) == DL_OK &&
          dl_read(dl_module_forward(net, dl_from_int32(ctx, DL_SHAPE(4, 3), x32)), l32, 4 * 27) == DL_OK &&
          memcmp(l64, l32, sizeof l64) == 0, "int32 contexts: the int64 bits");
    dl_step_end(ctx);
    dl_ctx_free(ctx);

    /* weight tying: one Embedding under two names; a file holding it once
       (safetensors' save_model) loads both, a file holding neither is refused */
    {
        dl_ctx *ct = new_ctx(4);
        dl_module *wte = dl_nn_embedding(ct, 5, 3), *root = dl_module_new(ct, "GPT", NULL, 0);
        dl_module *only = dl_module_new(ct, "Only", NULL, 0), *other = dl_nn_embedding(ct, 5, 3);
        const dl_named_tensor *sdt;
        char path[300];
        float a[15], b[15];
        snprintf(path, sizeof path, "%s_tied.safetensors", g_tmp);
        dl_module_add(root, "wte", wte);
        dl_module_add(root, "lm_head", wte);
        dl_module_add(only, "wte", other);
        CHECK(dl_module_state_dict(root, &sdt) == 2 && sdt[0].t == sdt[1].t, "tied: two names, one tensor");
        CHECK(dl_save_module(path, only) == DL_OK && dl_load_module(path, root) == DL_OK,
              "a file with wte.weight only loads the tied model: %s", dl_error_message(ct));
        CHECK(dl_read(dl_module_get(root, "lm_head.weight"), a, 15) == DL_OK &&
              dl_read(dl_module_get(only, "wte.weight"), b, 15) == DL_OK && memcmp(a, b, sizeof a) == 0,
              "lm_head.weight = the file's wte.weight");
        remove(path);
        dl_ctx_free(ct);
    }
    /* a captured training step replays eager's bits (two contexts from one start) */
    {
        dl_ctx *ce = new_ctx(3), *cc = new_ctx(3);
        dl_module *ne = emb_mlp(ce), *nc = emb_mlp(cc);
        dl_optim *oe, *oc;
        dl_tensor *xe, *ye, *xc, *yc, *lc = NULL;
        dl_capture *cap = NULL;
        float le, lr;
        CHECK(dl_load_module(init, ne) == DL_OK && dl_load_module(init, nc) == DL_OK, "loads");
        oe = dl_sgd(ne, &sd);
        oc = dl_sgd(nc, &sd);
        xe = dl_load_tensor(ce, data, "X");
        ye = dl_load_tensor(ce, data, "Y");
        xc = dl_load_tensor(cc, data, "X");
        yc = dl_load_tensor(cc, data, "Y");
        for (k = 0; k < 5; k++) {   /* step 0 eager (the warm-up), 1 captured, then replays */
            dl_tensor *l;
            dl_optim_zero_grad(oe);
            l = dl_cross_entropy(dl_module_forward(ne, xe), ye, NULL);
            dl_backward(l);
            dl_optim_step(oe);
            le = l ? dl_item(l) : -1.0f;
            dl_step_end(ce);
            if (k < 2) {
                if (k == 1) cap = dl_capture_begin(cc);
                dl_optim_zero_grad(oc);
                lc = dl_cross_entropy(dl_module_forward(nc, xc), yc, NULL);
                dl_backward(lc);
                dl_optim_step(oc);
                if (k == 1) CHECK(cap && dl_capture_end(cap) == DL_OK, "capture: %s", dl_error_message(cc));
            } else {
                CHECK(dl_replay(cap) == DL_OK, "replay %d: %s", k, dl_error_message(cc));
            }
            lr = lc ? dl_item(lc) : -2.0f;
            CHECK(memcmp(&le, &lr, sizeof le) == 0, "step %d: replay %.9g, eager %.9g", k, (double)lr, (double)le);
            dl_step_end(cc);
        }
        {
            float a[270], b[270];
            CHECK(dl_read(dl_module_get(ne, "0.weight"), a, 270) == DL_OK &&
                  dl_read(dl_module_get(nc, "0.weight"), b, 270) == DL_OK && memcmp(a, b, sizeof a) == 0,
                  "embedding weight after 5 steps: replay = eager");
        }
        /* an index out of range written into the static input: the replay refuses it */
        {
            int64_t bad[96];
            CHECK(dl_read_int64(xc, bad, 96) == DL_OK, "read X");
            bad[7] = 27;
            dl_no_grad_begin(cc);
            CHECK(dl_copy_(xc, dl_from_int64(cc, DL_SHAPE(32, 3), bad)) == DL_OK, "rewrite X: %s", dl_error_message(cc));
            dl_no_grad_end(cc);
            if (xc->device.type == DL_DEVICE_CPU) {
                CHECK(dl_replay(cap) != DL_OK, "a replay with index 27 of 27 fails");
                EXPECT_ERR(cc, DL_ERR_ARG, "dl_replay: an embedding index holds 27 at flat index 7: indices must be "
                           "in [0, 27)");
            } else {   /* (a GPU's graph cannot stop: the row reads zeros, dl_embedding's doc) */
                CHECK(dl_replay(cap) == DL_OK, "a replay with index 27 of 27 on a GPU: %s", dl_error_message(cc));
            }
        }
        dl_capture_free(cap);
        dl_ctx_free(ce);
        dl_ctx_free(cc);
    }
}

int main(int argc, char **argv)
{
    snprintf(g_tmp, sizeof g_tmp, "/tmp/dl_test_nn_%ld", (long)getpid());
    if (!g_load("tests/golden/optim.bin")) { th_fail++; }
    test_modules();
    test_relu_pool_order();
    test_bn_relu_fusion();
    test_bn_add_relu_fusion();
    test_linear_act_fusion();
    test_conv_act_fusion();
    test_conv_act_pool_fusion();
    CHECK(cnt_live == 0, "leak after modules: %ld", cnt_live);
    test_init();
    if (g_nrec) {
        test_optim_golden();
        test_clip_sched();
        test_torch_written();
    }
    g_free();
    if (g_load("tests/golden/noaffine.bin")) test_no_affine();   /* (gen_noaffine.py) */
    else th_fail++;
    test_optim_misc();
    test_embedding_mlp();
    test_zero_grad_none();
    test_load_state_dict();
    test_group_norm_module();
    test_resume();
    test_bad_files();
    if (argc > 2 && strcmp(argv[1], "--write") == 0) CHECK(write_for_torch(argv[2]), "write for torch");
    g_free();
    CHECK(cnt_live == 0, "%ld blocks live at exit", cnt_live);
    TEST_END();
}
