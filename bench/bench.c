/* bench/bench.c - the dl.h side of `make bench` (bench/run.sh runs it next to
   bench/torch_bench.py, which does the same work in PyTorch).

   Usage: build/bench CASE THREADS [--warmup N] [--reps N] [--steps N]
          build/bench --list
   Prints one line, "CASE THREADS VALUE":
     time cases     VALUE = median milliseconds of --reps repetitions after
                    --warmup untimed ones (one repetition = one training
                    step, or one op forward + backward);
     mem_* cases    VALUE = peak resident set size in MiB (VmHWM) of this
                    process after --steps training steps;
     startup        VALUE = 0; the process builds LeNet-BN, runs one training
                    step and exits at once (run.sh times the whole process).
   Exit status 2: unknown case (run.sh prints n/a); 1: a dl.h error.

   Every model is the twin of the PyTorch one in torch_bench.py: same layers,
   PyTorch's default initialization (xavier_uniform for the d2l LeNet, as
   d2l), cross-entropy loss, plain SGD, batch 256 of random N(0,1) inputs and
   random labels in 0..9 (fixed seed). A step is zero_grad, forward, loss,
   backward, optimizer step (and dl_step_end).

   Capture and replay: a case NAME_graph (step_mlp_graph ...) is NAME's
   training step captured once (dl_capture_begin/end, after one eager
   warm-up step) and replayed (dl_replay) each repetition; run.sh prints
   it against NAME, dl.h's eager step, on the CPU (PyTorch has no CPU graph
   replay) and against PyTorch's torch.cuda.CUDAGraph replay on the GPU
   (NAME_graph_cuda). step_mlp16 is step_mlp at batch 16, where dispatch
   weighs most.

   CUDA: a case name with the suffix _cuda (step_lenet_bn_cuda, add_sync_cuda
   ...) runs the time case of that name with every tensor on cuda:0 and a
   dl_sync at the end of each repetition, so the time is the GPU's; it needs
   the DL_CUDA build of this file (build/cuda/bench: make bench-cuda). The
   plain build, or a machine without a GPU, fails such a case (run.sh: n/a).
   With PyTorch's defaults: convolutions in TF32, matrix products in exact
   fp32 (torch.backends.cudnn.allow_tf32 = True, cuda.matmul.allow_tf32 =
   False); NAME_cuda_fp32 runs the same case with both in exact fp32
   (torch_bench.py sets both flags False); run.sh prints both lines.

   To add a case: write a setup function (and a rep function for a new kind
   of work), add a row to g_cases, the same name to torch_bench.py's CASES
   and a line to bench/run.sh's case table.

   Data parallelism (no PyTorch side; run.sh passes their lines through):
     build/bench allreduce THREADS      dl_allreduce of 1/16/64 MB on 2 and 4
                                        CPU devices against the copy bound
     build/bench ddp_lenet_bn THREADS   a dl_ddp LeNet-BN step on 1 and 2 devices

   Build: cc -std=c99 -O3 -march=native -I. bench/bench.c -o build/bench -lm -lpthread */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/lenet_bn.h"   /* ex_lenet_bn: the model of make run */
#include "examples/resnet18.h"   /* ex_resnet18: d2l's ResNet-18 */
#include "examples/resnet_small.h"   /* ex_resnet_small: the net of examples/resnet.c */
#include "examples/cli.h"           /* stdout checked at exit */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#define BATCH 256

/* everything a case needs between repetitions; all tensors persistent */
typedef struct bench {
    dl_ctx *ctx;
    dl_module *net;          /* step cases, linear_fwdbwd */
    dl_optim *opt;
    dl_tensor *x, *y;        /* input batch, int64 labels */
    dl_tensor *w, *b;        /* micro cases: weight, bias */
    dl_tensor *rm, *rv;      /* bn2d: running statistics */
    dl_tensor *gout;         /* micro cases: the gradient fed to backward */
    dl_conv_desc conv;
    dl_pool_desc pool;
    int64_t batch;           /* step cases: 0 = BATCH */
    dl_capture *cap;         /* *_graph cases: the captured step */
} bench;

typedef int (*setup_fn)(bench *s);
typedef int (*rep_fn)(bench *s);

enum { KIND_TIME, KIND_MEM, KIND_STARTUP };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(bench *s, const char *what)
{
    fprintf(stderr, "bench: %s: %s\n", what, dl_error_message(s->ctx));
    return 0;
}

/* ---------------------------------------------------------------- data */

static dl_tensor *keep_randn(bench *s, dl_shape shape, bool grad)
{
    dl_tensor *t = dl_keep(dl_randn(s->ctx, shape));
    if (t && grad) dl_requires_grad(t, true);
    return t;
}

/* x: random N(0,1) batch of the given shape; y: labels in 0..9 */
static int make_batch(bench *s, dl_shape xshape)
{
    int64_t lab[BATCH];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    int i;
    for (i = 0; i < BATCH; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        lab[i] = (int64_t)((r >> 33) % 10);
    }
    s->x = keep_randn(s, xshape, false);
    s->y = dl_keep(dl_from_int64(s->ctx, DL_SHAPE(xshape.d[0]), lab));
    dl_step_end(s->ctx);
    return s->x && s->y ? 1 : fail(s, "input batch");
}

/* ---------------------------------------------------------------- models */

static dl_module *make_mlp(dl_ctx *ctx)
{
    dl_module *m[] = {dl_nn_flatten(ctx), dl_nn_linear(ctx, 784, 256, true), dl_nn_relu(ctx),
                      dl_nn_linear(ctx, 256, 10, true)};
    return dl_nn_sequential(ctx, (int)(sizeof m / sizeof m[0]), m);
}

/* d2l's LeNet (examples/lenet_d2l.c), weights xavier_uniform as d2l does */
static dl_module *make_lenet_d2l(dl_ctx *ctx)
{
    dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
    dl_module *m[] = {
        dl_nn_conv2d(ctx, 1, 6, 5, &pad2, true), dl_nn_sigmoid(ctx), dl_nn_avg_pool2d(ctx, &pool),
        dl_nn_conv2d(ctx, 6, 16, 5, NULL, true), dl_nn_sigmoid(ctx), dl_nn_avg_pool2d(ctx, &pool),
        dl_nn_flatten(ctx),
        dl_nn_linear(ctx, 400, 120, true), dl_nn_sigmoid(ctx),
        dl_nn_linear(ctx, 120, 84, true), dl_nn_sigmoid(ctx),
        dl_nn_linear(ctx, 84, 10, true)};
    dl_module *net = dl_nn_sequential(ctx, (int)(sizeof m / sizeof m[0]), m);
    const dl_named_tensor *p;
    int i, n;
    if (!net) return NULL;
    n = dl_module_named_parameters(net, &p);
    for (i = 0; i < n; i++)
        if (p[i].t->ndim >= 2) dl_init_xavier_uniform(p[i].t, 1.0f);
    return net;
}



/* ---------------------------------------------------------------- training steps */

static int setup_model(bench *s, dl_module *net, float lr)
{
    dl_sgd_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.lr = lr;
    s->net = net;
    s->opt = net ? dl_sgd(net, &sd) : NULL;
    if (!s->opt) return fail(s, "model");
    return make_batch(s, DL_SHAPE(s->batch ? s->batch : BATCH, 1, 28, 28));
}

static int setup_mlp(bench *s) { return setup_model(s, make_mlp(s->ctx), 0.1f); }
static int setup_mlp16(bench *s) { s->batch = 16; return setup_mlp(s); }
static int setup_lenet(bench *s) { return setup_model(s, make_lenet_d2l(s->ctx), 0.9f); }
static int setup_lenet_bn(bench *s) { return setup_model(s, ex_lenet_bn(s->ctx), 0.1f); }
static int setup_resnet_small(bench *s) { return setup_model(s, ex_resnet_small(s->ctx), 0.1f); }
/* d2l's multi-GPU ResNet-18 (widths 64-512, 3x3 stem, no max pool); SGD lr 0.1 as d2l */
static int setup_resnet18(bench *s) { return setup_model(s, ex_resnet18(s->ctx, 1, 10), 0.1f); }

/* zero_grad, forward, cross-entropy, backward, SGD step */
static int step(bench *s)
{
    dl_tensor *loss;
    dl_optim_zero_grad(s->opt);
    loss = dl_cross_entropy(dl_module_forward(s->net, s->x), s->y, NULL);
    return loss && dl_backward(loss) == DL_OK && dl_optim_step(s->opt) == DL_OK ? 1 : fail(s, "step");
}

static int rep_step(bench *s)
{
    if (!step(s)) return 0;
    dl_step_end(s->ctx);
    return 1;
}

/* the *_graph cases: the eager case's set-up, one eager step (the warm-up:
   gradients and the optimizer's lists), then one step captured */
static int setup_graph(bench *s, setup_fn setup)
{
    if (!setup(s) || !rep_step(s)) return 0;
    s->cap = dl_capture_begin(s->ctx);
    if (!s->cap || !step(s) || dl_capture_end(s->cap) != DL_OK) return fail(s, "capture");
    dl_step_end(s->ctx);
    return 1;
}
static int setup_mlp_graph(bench *s) { return setup_graph(s, setup_mlp); }
static int setup_mlp16_graph(bench *s) { return setup_graph(s, setup_mlp16); }
static int setup_lenet_graph(bench *s) { return setup_graph(s, setup_lenet); }
static int setup_lenet_bn_graph(bench *s) { return setup_graph(s, setup_lenet_bn); }
static int setup_resnet_small_graph(bench *s) { return setup_graph(s, setup_resnet_small); }

static int rep_graph(bench *s)
{
    if (dl_replay(s->cap) != DL_OK) return fail(s, "replay");
    dl_step_end(s->ctx);
    return 1;
}

/* ---------------------------------------------------------------- single ops
   x, w, b are leaves with requires_grad; backward is seeded with a fixed
   random gradient of the output's shape (the same as backward of
   sum(y * gout)); the leaves' gradients are zeroed each repetition. */

static int micro_setup(bench *s, dl_shape xshape, dl_shape wshape, int64_t bias, dl_shape yshape)
{
    s->x = keep_randn(s, xshape, true);
    s->w = wshape.ndim ? keep_randn(s, wshape, true) : NULL;
    s->b = bias ? keep_randn(s, DL_SHAPE(bias), true) : NULL;
    s->gout = keep_randn(s, yshape, false);
    dl_step_end(s->ctx);
    if (!s->x || (wshape.ndim && !s->w) || (bias && !s->b) || !s->gout) return fail(s, "inputs");
    return 1;
}

static int micro_backward(bench *s, dl_tensor *y)
{
    dl_backward_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.grad = s->gout;
    if (!y || dl_backward_ex(y, &bd) != DL_OK) return fail(s, "op");
    dl_zero_grad(s->x);
    if (s->w) dl_zero_grad(s->w);
    if (s->b) dl_zero_grad(s->b);
    dl_step_end(s->ctx);
    return 1;
}

static int setup_conv1(bench *s)
{
    s->conv = dl_conv_desc_make(1, 2, 1, 1);
    return micro_setup(s, DL_SHAPE(BATCH, 1, 28, 28), DL_SHAPE(6, 1, 5, 5), 6, DL_SHAPE(BATCH, 6, 28, 28));
}
static int setup_conv2(bench *s)
{
    s->conv = dl_conv_desc_make(1, 0, 1, 1);
    return micro_setup(s, DL_SHAPE(BATCH, 6, 14, 14), DL_SHAPE(16, 6, 5, 5), 16, DL_SHAPE(BATCH, 16, 10, 10));
}
static int rep_conv(bench *s) { return micro_backward(s, dl_conv2d(s->x, s->w, s->b, &s->conv)); }

static int setup_bn2d(bench *s)
{
    s->rm = dl_keep(dl_zeros(s->ctx, DL_SHAPE(6)));
    s->rv = dl_keep(dl_ones(s->ctx, DL_SHAPE(6)));
    if (!micro_setup(s, DL_SHAPE(BATCH, 6, 28, 28), DL_SHAPE(6), 6, DL_SHAPE(BATCH, 6, 28, 28))) return 0;
    return s->rm && s->rv ? 1 : fail(s, "running stats");
}
static int rep_bn2d(bench *s)
{
    return micro_backward(s, dl_batch_norm(s->x, s->rm, s->rv, s->w, s->b, true, 0.1f, 1e-5f));
}

static int setup_maxpool(bench *s)
{
    dl_shape none;
    memset(&none, 0, sizeof none);
    s->pool = dl_pool_desc_make(2, 2, 0, false, true);
    return micro_setup(s, DL_SHAPE(BATCH, 6, 28, 28), none, 0, DL_SHAPE(BATCH, 6, 14, 14));
}
static int rep_maxpool(bench *s) { return micro_backward(s, dl_max_pool2d(s->x, &s->pool)); }

/* Linear(784, 256) as a module (dl.h has no functional linear): x W^T + b */
static int setup_linear(bench *s)
{
    dl_shape none;
    memset(&none, 0, sizeof none);
    s->net = dl_nn_linear(s->ctx, 784, 256, true);
    if (!s->net) return fail(s, "linear");
    return micro_setup(s, DL_SHAPE(BATCH, 784), none, 0, DL_SHAPE(BATCH, 256));
}
static int rep_linear(bench *s)
{
    dl_tensor *y = dl_module_forward(s->net, s->x);
    int ok = micro_backward(s, y);
    dl_module_zero_grad(s->net);
    return ok;
}

/* two operands x, w of one shape (add_sync, matmul200) */
static int setup_pair(bench *s, dl_shape shape)
{
    s->x = keep_randn(s, shape, false);
    s->w = keep_randn(s, shape, false);
    dl_step_end(s->ctx);
    return s->x && s->w ? 1 : fail(s, "inputs");
}

/* per-op overhead: a + b of two 4-element tensors (then, for CUDA, the sync) */
static int setup_add(bench *s) { return setup_pair(s, DL_SHAPE(4)); }
static int rep_add(bench *s)
{
    if (!dl_add(s->x, s->w)) return fail(s, "dl_add");
    dl_step_end(s->ctx);
    return 1;
}

/* the classic transfer-cost product: (200,200) x (200,200) */
static int setup_matmul200(bench *s) { return setup_pair(s, DL_SHAPE(200, 200)); }
static int rep_matmul(bench *s)
{
    if (!dl_matmul(s->x, s->w)) return fail(s, "dl_matmul");
    dl_step_end(s->ctx);
    return 1;
}

/* ---------------------------------------------------------------- case table */

typedef struct bcase {
    const char *name;
    int kind;
    setup_fn setup;
    rep_fn rep;
} bcase;

static const bcase g_cases[] = {
    {"conv1_fwdbwd", KIND_TIME, setup_conv1, rep_conv},
    {"conv2_fwdbwd", KIND_TIME, setup_conv2, rep_conv},
    {"bn2d_fwdbwd", KIND_TIME, setup_bn2d, rep_bn2d},
    {"maxpool_fwdbwd", KIND_TIME, setup_maxpool, rep_maxpool},
    {"linear_fwdbwd", KIND_TIME, setup_linear, rep_linear},
    {"add_sync", KIND_TIME, setup_add, rep_add},
    {"matmul200", KIND_TIME, setup_matmul200, rep_matmul},
    {"step_mlp", KIND_TIME, setup_mlp, rep_step},
    {"step_lenet", KIND_TIME, setup_lenet, rep_step},
    {"step_lenet_bn", KIND_TIME, setup_lenet_bn, rep_step},
    {"step_resnet_small", KIND_TIME, setup_resnet_small, rep_step},
    {"step_resnet18", KIND_TIME, setup_resnet18, rep_step},
    {"step_mlp16", KIND_TIME, setup_mlp16, rep_step},
    {"step_mlp_graph", KIND_TIME, setup_mlp_graph, rep_graph},
    {"step_mlp16_graph", KIND_TIME, setup_mlp16_graph, rep_graph},
    {"step_lenet_graph", KIND_TIME, setup_lenet_graph, rep_graph},
    {"step_lenet_bn_graph", KIND_TIME, setup_lenet_bn_graph, rep_graph},
    {"step_resnet_small_graph", KIND_TIME, setup_resnet_small_graph, rep_graph},
    {"mem_lenet_bn", KIND_MEM, setup_lenet_bn, rep_step},
    {"mem_resnet_small", KIND_MEM, setup_resnet_small, rep_step},
    {"startup", KIND_STARTUP, setup_lenet_bn, rep_step},
};

/* ---------------------------------------------------------------- measurement */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* peak resident set size in MiB: VmHWM, else ru_maxrss (KiB on Linux) */
static double peak_rss_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    struct rusage ru;
    if (f) {
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "VmHWM:", 6)) {
                fclose(f);
                return atof(line + 6) / 1024.0;
            }
        fclose(f);
    }
    if (getrusage(RUSAGE_SELF, &ru) == 0) return (double)ru.ru_maxrss / 1024.0;
    return -1;
}

/* one repetition; on a GPU, waiting for its work to finish */
static int rep_synced(const bcase *c, bench *s, bool gpu)
{
    int ok = c->rep(s);
    if (ok && gpu && dl_sync(s->ctx) != DL_OK) return fail(s, "dl_sync");
    return ok;
}

static int run_case(const bcase *c, const char *name, bool gpu, bool fp32, int threads, int warmup, int reps,
                    int steps)
{
    bench s;
    dl_ctx_desc cd;
    double *t, v = 0;
    int i, ok = 1;
    memset(&s, 0, sizeof s);
    memset(&cd, 0, sizeof cd);
    cd.seed = 1;
    cd.num_threads = threads;
    if (gpu) cd.device = dl_cuda(0);   /* every tensor, the model's too, on the GPU */
    cd.allow_tf32 = -1;                /* PyTorch's defaults, whatever the environment says, */
    cd.allow_tf32_conv = fp32 ? -1 : 1;   /* or (_fp32) exact fp32 everywhere */
    s.ctx = dl_ctx_init(&cd);
    if (!s.ctx) { fprintf(stderr, "bench: dl_ctx_init failed: %s\n", dl_error_message(NULL)); return 1; }
    if (!c->setup(&s)) { dl_ctx_free(s.ctx); return 1; }
    if (c->kind == KIND_STARTUP) {
        ok = c->rep(&s);
        printf("%s %d %d\n", c->name, threads, 0);
        fflush(stdout);
        return !ok;   /* end of the first step: leave without tearing down */
    }
    if (c->kind == KIND_MEM) {
        for (i = 0; i < steps && ok; i++) ok = c->rep(&s);
        if (ok) printf("%s %d %.1f\n", c->name, threads, peak_rss_mb());
        dl_ctx_free(s.ctx);
        return !ok;
    }
    t = (double *)malloc(sizeof(double) * (size_t)reps);
    if (!t) { dl_ctx_free(s.ctx); return 1; }
    for (i = 0; i < warmup && ok; i++) ok = rep_synced(c, &s, gpu);
    dl_profile_reset(s.ctx);   /* DL_PROFILE=1: the table (at dl_ctx_free) covers the timed reps */
    for (i = 0; i < reps && ok; i++) {
        double t0 = now_s();
        ok = rep_synced(c, &s, gpu);
        t[i] = now_s() - t0;
    }
    if (ok) {
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        v = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        printf("%s %d %.4f\n", name, threads, 1e3 * v);   /* 0.1 us: the per-op cases */
    }
    free(t);
    dl_ctx_free(s.ctx);
    return !ok;
}

/* ---------------------------------------------------------------- data parallelism
   (run.sh kind "dist": these print their own lines, there is no PyTorch side)

   allreduce THREADS: dl_allreduce (sum) of 1, 16 and 64 MB float buffers on 2
   and 4 virtual CPU devices. Each line: the median time, the bus bandwidth
   2(N-1)/N * bytes / t (nccl-tests' busbw), and the share of the bound
   t >= 2(N-1)/N * bytes / B, with B the bandwidth of one memcpy of the same
   size measured in the same run (the best of the reps).

   allreduce_ranks 1: dl_comm_allreduce (sum) of 1, 16 and 64 MB over 2
   ranks, one buffer each, against the same bound with N = 2: in this
   build 2 thread ranks (DL_COMM_THREADS, each its own context and kernel
   thread); in the -DDL_MPI build (build/mpi/bench) under mpirun -np 2, the
   2 MPI processes (rank 0 prints).

   ddp_lenet_bn THREADS: one data-parallel LeNet-BN training step (batch 256,
   SGD, dl_ddp_step) on 1 and on 2 devices with the same THREADS kernel
   threads in all, the scaling efficiency t1 / t2, and the ms per epoch
   of 60000 samples (235 steps). */

/* the bandwidth of one memcpy of `bytes`, the best of warmup + reps */
static double copy_bw(size_t bytes, int warmup, int reps)
{
    char *src = (char *)malloc(bytes), *dst = (char *)malloc(bytes);
    double cp = 1e30;
    int i;
    if (!src || !dst) { free(src); free(dst); return 0; }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    for (i = 0; i < warmup + reps; i++) {
        double t0 = now_s();
        memcpy(i % 2 ? src : dst, i % 2 ? dst : src, bytes);
        if (now_s() - t0 < cp) cp = now_s() - t0;
    }
    free(src);
    free(dst);
    return (double)bytes / cp;
}

/* one rank of allreduce_ranks: its own context (1 kernel thread) and
   communicator; rank 0 times the calls */
typedef struct bench_rank {
    dl_comm_group *g;                  /* THREADS; NULL: MPI */
    int rank, warmup, reps, ok;
    double med[3];                     /* rank 0: ms per size */
    double bw[3];                      /* rank 0: memcpy bandwidth per size, while rank 1 waits */
} bench_rank;

static void *allreduce_rank(void *arg)
{
    bench_rank *r = (bench_rank *)arg;
    dl_ctx_desc cd;
    dl_comm_desc md;
    dl_ctx *ctx;
    dl_comm *comm;
    double *t = (double *)malloc(sizeof(double) * (size_t)r->reps);
    int a, i;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 1;
    ctx = dl_ctx_init(&cd);
    memset(&md, 0, sizeof md);
    md.backend = r->g ? DL_COMM_THREADS : DL_COMM_MPI;
    md.group = r->g;
    md.rank = r->rank;
    comm = ctx ? dl_comm_init(ctx, &md) : NULL;
    r->ok = comm && t;
    if (comm) r->rank = dl_comm_rank(comm);
    for (a = 0; a < 3 && r->ok; a++) {
        int64_t n = (int64_t)(a == 0 ? 1 : a == 1 ? 16 : 64) << 18;
        dl_tensor *x = dl_keep(dl_full(ctx, DL_SHAPE(n), 1e-3f * (float)(r->rank + 1)));
        for (i = 0; i < r->warmup + r->reps && r->ok; i++) {
            double t0 = now_s();
            r->ok = x && dl_comm_allreduce(comm, &x, 1, DL_REDUCE_SUM) == DL_OK;
            if (i >= r->warmup) t[i - r->warmup] = now_s() - t0;
        }
        if (r->ok) {
            qsort(t, (size_t)r->reps, sizeof *t, cmp_double);
            r->med[a] = r->reps % 2 ? t[r->reps / 2] : 0.5 * (t[r->reps / 2 - 1] + t[r->reps / 2]);
        }
        dl_free(x);
        dl_step_end(ctx);
    }
    if (r->ok && r->rank == 0)
        for (a = 0; a < 3; a++) r->bw[a] = copy_bw((size_t)(a == 0 ? 1 : a == 1 ? 16 : 64) << 20, r->warmup, r->reps);
    r->ok = r->ok && dl_comm_barrier(comm) == DL_OK;
    if (!r->ok) fprintf(stderr, "bench: allreduce_ranks, rank %d: %s\n", r->rank, ctx ? dl_error_message(ctx) : "no context");
    free(t);
    dl_ctx_free(ctx);   /* (MPI: dl_comm_free, through the context, finalizes) */
    return NULL;
}

static int run_allreduce_ranks(int warmup, int reps)
{
    bench_rank r[2];
    double *bw = r[0].bw;
    int a, i;
    const char *how;
    memset(r, 0, sizeof r);
#ifdef DL_MPI
    how = "2 MPI processes";
    r[0].warmup = warmup;
    r[0].reps = reps;
    allreduce_rank(&r[0]);
    if (!r[0].ok) return 1;
    if (r[0].rank != 0) return 0;
#else
    {
        pthread_t th[2];
        how = "2 thread ranks (DL_COMM_THREADS)";
        r[0].g = r[1].g = dl_comm_group_new(2);
        for (i = 0; i < 2; i++) {
            r[i].rank = i;
            r[i].warmup = warmup;
            r[i].reps = reps;
            pthread_create(&th[i], NULL, allreduce_rank, &r[i]);
        }
        for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
        dl_comm_group_free(r[0].g);
        if (!r[0].ok || !r[1].ok) return 1;
    }
#endif
    printf("# allreduce over %s, 1 thread each: size, median ms, bus GB/s, memcpy GB/s, bound ms = "
           "2(N-1)/N*bytes/memcpy, bound/time\n", how);
    for (a = 0; a < 3; a++) {
        double bytes = (double)((int64_t)(a == 0 ? 1 : a == 1 ? 16 : 64) << 20), med = r[0].med[a];
        double bound = bytes / bw[a];
        printf("allreduce_%dMB_2ranks%s 1 %.3f ms  busbw %.2f GB/s  memcpy %.2f GB/s  bound %.3f ms  %.0f%%\n",
               a == 0 ? 1 : a == 1 ? 16 : 64,
#ifdef DL_MPI
               "_mpi",
#else
               "_threads",
#endif
               1e3 * med, bytes / med / 1e9, bw[a] / 1e9, 1e3 * bound, 100 * bound / med);
    }
    (void)i;
    return 0;
}

static int run_allreduce(int threads, int warmup, int reps)
{
    static const int mb[3] = {1, 16, 64};
    static const int devs[2] = {2, 4};
    dl_ctx_desc cd;
    dl_ctx *ctx;
    int a, b, i, k;
    double *t = (double *)malloc(sizeof(double) * (size_t)reps);
    memset(&cd, 0, sizeof cd);
    cd.num_threads = threads;
    cd.cpu_devices = 4;
    ctx = dl_ctx_init(&cd);
    if (!ctx || !t) { fprintf(stderr, "bench: no context\n"); free(t); return 1; }
    printf("# allreduce (sum, float32), %d threads: size, devices, median ms, bus GB/s, memcpy GB/s, "
           "bound ms = 2(N-1)/N*bytes/memcpy, bound/time\n", threads);
    for (a = 0; a < 3; a++) {
        int64_t n = (int64_t)mb[a] << 18;          /* floats */
        size_t bytes = (size_t)n * sizeof(float);
        char *src = (char *)malloc(bytes), *dst = (char *)malloc(bytes);
        double cp = 1e30, bw;
        if (!src || !dst) { free(src); free(dst); free(t); dl_ctx_free(ctx); return 1; }
        memset(src, 1, bytes);
        memset(dst, 2, bytes);
        for (i = 0; i < warmup + reps; i++) {       /* copy bandwidth: one memcpy, best of the reps */
            double t0 = now_s();
            memcpy(i % 2 ? src : dst, i % 2 ? dst : src, bytes);
            if (now_s() - t0 < cp) cp = now_s() - t0;
        }
        bw = (double)bytes / cp;
        free(src);
        free(dst);
        for (b = 0; b < 2; b++) {
            int N = devs[b];
            dl_tensor *x[4];
            double med, bound, frac;
            for (k = 0; k < N; k++) {
                dl_set_device(ctx, dl_cpu_device(k));
                x[k] = dl_keep(dl_full(ctx, DL_SHAPE(n), 1e-3f * (float)(k + 1)));
                dl_step_end(ctx);
                if (!x[k]) { fprintf(stderr, "bench: %s\n", dl_error_message(ctx)); dl_ctx_free(ctx); free(t); return 1; }
            }
            for (i = 0; i < warmup + reps; i++) {
                double t0 = now_s();
                if (dl_allreduce(x, N, DL_REDUCE_SUM) != DL_OK) {
                    fprintf(stderr, "bench: %s\n", dl_error_message(ctx));
                    dl_ctx_free(ctx);
                    free(t);
                    return 1;
                }
                if (i >= warmup) t[i - warmup] = now_s() - t0;
                dl_step_end(ctx);
            }
            qsort(t, (size_t)reps, sizeof *t, cmp_double);
            med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
            bound = 2.0 * (N - 1) / N * (double)bytes / bw;
            frac = bound / med;
            printf("allreduce_%dMB_%ddev %d %.3f ms  busbw %.2f GB/s  memcpy %.2f GB/s  bound %.3f ms  %.0f%%\n",
                   mb[a], N, threads, 1e3 * med, 2.0 * (N - 1) / N * (double)bytes / med / 1e9, bw / 1e9,
                   1e3 * bound, 100 * frac);
            for (k = 0; k < N; k++) dl_free(x[k]);
        }
    }
    free(t);
    dl_ctx_free(ctx);
    return 0;
}

static dl_tensor *ddp_loss(dl_module *m, dl_tensor *x, dl_tensor *y, void *user)
{
    (void)user;
    return dl_cross_entropy(dl_module_forward(m, x), y, NULL);
}

static int run_ddp(int threads, int warmup, int reps)
{
    double ms[2];
    int nd, i;
    double *t = (double *)malloc(sizeof(double) * (size_t)reps);
    if (!t) return 1;
    for (nd = 1; nd <= 2; nd++) {
        bench s;
        dl_ctx_desc cd;
        dl_module *net[2];
        dl_optim *opt[2];
        dl_ddp *dp;
        dl_sgd_desc sd;
        memset(&s, 0, sizeof s);
        memset(&cd, 0, sizeof cd);
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.1f;
        cd.seed = 1;
        cd.num_threads = threads;
        cd.cpu_devices = 2;
        s.ctx = dl_ctx_init(&cd);
        if (!s.ctx) { free(t); return 1; }
        for (i = 0; i < nd; i++) {
            net[i] = ex_lenet_bn(s.ctx);
            if (!net[i] || dl_module_to(net[i], dl_cpu_device(i)) != DL_OK) {
                fail(&s, "ddp model");
                dl_ctx_free(s.ctx);
                free(t);
                return 1;
            }
            opt[i] = dl_sgd(net[i], &sd);
        }
        dp = dl_ddp_init(nd, net, opt, NULL);
        if (!dp || !make_batch(&s, DL_SHAPE(BATCH, 1, 28, 28))) { free(t); fail(&s, "ddp"); dl_ctx_free(s.ctx); return 1; }
        for (i = 0; i < warmup + reps; i++) {
            double t0 = now_s();
            if (dl_ddp_step(dp, s.x, s.y, ddp_loss, NULL, NULL) != DL_OK) { fail(&s, "ddp step"); free(t); dl_ctx_free(s.ctx); return 1; }
            dl_step_end(s.ctx);
            if (i >= warmup) t[i - warmup] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        ms[nd - 1] = 1e3 * (reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]));
        printf("ddp_lenet_bn_%ddev %d %.3f ms/step  %.2f s/epoch (235 steps)\n", nd, threads, ms[nd - 1],
               ms[nd - 1] * 235 / 1e3);
        dl_ctx_free(s.ctx);
    }
    printf("ddp_lenet_bn_efficiency %d %.2f (1 device / 2 devices, same %d threads)\n", threads, ms[0] / ms[1], threads);
    free(t);
    return 0;
}

/* *out = the whole of v as a whole number in [lo, hi]; else the flag, the
   value and the rule on stderr and false */
static bool int_arg(const char *flag, const char *v, long lo, long hi, int *out)
{
    char *end;
    long x;
    errno = 0;
    x = strtol(v, &end, 10);
    if (!((v[0] >= '0' && v[0] <= '9') || v[0] == '-') || *end || errno == ERANGE || x < lo || x > hi) {
        fprintf(stderr, "bench: %s %s: must be a whole number from %ld to %ld\n", flag, v, lo, hi);
        return false;
    }
    *out = (int)x;
    return true;
}

static void usage(FILE *to)
{
    fprintf(to, "usage: build/bench CASE THREADS [--warmup N] [--reps N] [--steps N]\n"
                "       build/bench --list    (the cases)\n");
}

int main(int argc, char **argv)
{
    const bcase *c = NULL;
    int i, threads, warmup = 3, reps = 11, steps = 10;
    size_t k, len;
    bool gpu = false, fp32 = false, coll;
    EX_CHECK_STDOUT("bench");
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { usage(stdout); return 0; }
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        for (k = 0; k < sizeof g_cases / sizeof g_cases[0]; k++) printf("%s\n", g_cases[k].name);
        printf("allreduce\nddp_lenet_bn\nallreduce_ranks\n");   /* (the collectives: not in g_cases) */
        return 0;
    }
    if (argc < 3) { usage(stderr); return 2; }
    len = strlen(argv[1]);
    fp32 = len > 10 && !strcmp(argv[1] + len - 10, "_cuda_fp32");   /* NAME_cuda_fp32: ... without TF32 */
    if (fp32) len -= 5;
    gpu = len > 5 && !strncmp(argv[1] + len - 5, "_cuda", 5);   /* NAME_cuda: NAME on cuda:0 */
    for (k = 0; k < sizeof g_cases / sizeof g_cases[0]; k++)
        if (!strncmp(g_cases[k].name, argv[1], gpu ? len - 5 : len) && strlen(g_cases[k].name) == (gpu ? len - 5 : len))
            c = &g_cases[k];
    coll = !gpu && (!strcmp(argv[1], "allreduce") || !strcmp(argv[1], "ddp_lenet_bn") ||
                    !strcmp(argv[1], "allreduce_ranks"));   /* not in g_cases */
    if (!coll && (!c || (gpu && c->kind != KIND_TIME))) { fprintf(stderr, "bench: no case %s in dl.h's bench\n", argv[1]); return 2; }
    if (!int_arg("THREADS", argv[2], 1, 1024, &threads)) return 2;
    for (i = 3; i + 1 < argc; i += 2) {
        int *v = !strcmp(argv[i], "--warmup") ? &warmup : !strcmp(argv[i], "--reps") ? &reps :
                 !strcmp(argv[i], "--steps") ? &steps : NULL;
        if (!v) { fprintf(stderr, "bench: unknown flag %s\n", argv[i]); usage(stderr); return 2; }
        if (!int_arg(argv[i], argv[i + 1], v == &warmup ? 0 : 1, 1000000000, v)) return 2;
    }
    if (i != argc) {
        bool flag = !strcmp(argv[i], "--warmup") || !strcmp(argv[i], "--reps") || !strcmp(argv[i], "--steps");
        fprintf(stderr, "bench: %s %s\n", argv[i], flag ? "needs a value" : "is no flag (unknown argument)");
        usage(stderr);
        return 2;
    }
    if (coll && !strcmp(argv[1], "allreduce_ranks")) return run_allreduce_ranks(warmup, reps);
    if (coll) return !strcmp(argv[1], "allreduce") ? run_allreduce(threads, warmup, reps) : run_ddp(threads, warmup, reps);
    return run_case(c, argv[1], gpu, fp32, threads, warmup, reps, steps);
}
