/* examples/static_graph.c - a static graph beside the dynamic tape: the same
   training step run eagerly, then recorded once and replayed, timed on the
   chosen device. Both runs start from the same weights and see the same
   batches, and end with the same bits (checked), so the time is all they
   differ in.

   CS231n's autograd lecture contrasts the two kinds of graph:
     - dynamic (define-by-run: PyTorch eager, dl.h's tape): each step runs
       the user's code again. Every op checks its operands, makes its output's
       header, records a tape node; backward walks the tape; each kernel is a
       call (on a GPU, a launch). The code may decide anything per step.
     - static (define-then-run: TensorFlow 1's graphs, torch.cuda.graph,
       dl.h's dl_capture_begin/end + dl_replay): the step's work is recorded
       once and replayed, with none of that bookkeeping.

   What a static graph gains: the host's part of the step. On a GPU a small
   model's eager step is mostly launch overhead (the GPU waits for the host),
   and a replay is one cudaGraphLaunch; on the CPU a replay calls the
   recorded kernels one after the other, with no dispatch, no checks, no
   tape and no allocation, so it gains the host work between them (most for
   small batches, where the kernels are short).

   What it gives up (in exchange for that):
     - control flow per step: a replay repeats the recorded work whatever
       your code would have done now. An `if` on the loss, a shape that
       changes (a smaller last batch), model.train()/eval() switched inside:
       all decided once, at capture. Different shapes need another capture.
     - host reads inside the step: dl_item(loss) or printing a tensor would
       need the value in the middle of a replay; dl.h refuses them inside a
       capture (shown below) and you read the capture's tensors after each
       replay instead.
     - fresh data through the inputs: the recorded work reads fixed tensors,
       so each batch is copied into those static inputs first (dl_copy_).
   What changes from step to step still does: dl.h reads the RNG counter
   (dropout's masks), the optimizer's step counts and learning rate, and
   batch norm's counters at each replay.

   Build: cc -std=c99 -O2 -I. examples/static_graph.c -o build/static_graph -lm -lpthread
          (GPU: make cuda, then build/cuda/static_graph --device cuda)
   Run:   build/static_graph [--device NAME (cpu)] [--model mlp|lenet (mlp)] [--batch N (16)]
                             [--steps N (200)] [--threads N (0)] */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/lenet_bn.h"
#include "examples/cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* an MLP with dropout, or LeNet-BN (examples/lenet_bn.h) */
static dl_module *make_model(dl_ctx *ctx, bool lenet)
{
    dl_module *m[EX_LENET_BN_LAYERS];
    if (lenet) return ex_lenet_bn(ctx);
    m[0] = dl_nn_flatten(ctx);
    m[1] = dl_nn_linear(ctx, 784, 256, true);
    m[2] = dl_nn_relu(ctx);
    m[3] = dl_nn_dropout(ctx, 0.2f);
    m[4] = dl_nn_linear(ctx, 256, 10, true);
    return dl_nn_sequential(ctx, 5, m);
}

/* batch k: made-up images and labels, the same in both runs */
static void make_batch(int k, int64_t b, float *x, int64_t *y)
{
    uint32_t s = 2654435761u * (uint32_t)(k % 50 + 1);
    int64_t i;
    for (i = 0; i < b * 784; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    }
    for (i = 0; i < b; i++) y[i] = (int64_t)((s >> (i % 23)) % 10);
}

/* the training step, as in every training example: zero_grad, forward,
   loss, backward, optimizer step */
static dl_tensor *train_step(dl_module *net, dl_optim *opt, dl_tensor *x, dl_tensor *y)
{
    dl_tensor *loss;
    dl_optim_zero_grad(opt);
    loss = dl_cross_entropy(dl_module_forward(net, x), y, NULL);
    if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(opt) != DL_OK) return NULL;
    return loss;
}

typedef struct run {
    dl_ctx *ctx;
    dl_module *net;
    dl_optim *opt;
    dl_tensor *x, *y;        /* the static inputs: each batch is copied into them */
    float *hx;
    int64_t *hy, batch;
    double ms;               /* per step, the timed steps */
    float last;              /* the last step's loss */
} run;

static int run_init(run *r, dl_device dev, bool lenet, int64_t batch, int threads)
{
    dl_ctx_desc cd;
    memset(r, 0, sizeof *r);
    memset(&cd, 0, sizeof cd);
    cd.seed = 42;             /* both runs: the same weights and dropout masks */
    cd.log = dl_log_silent;   /* errors are printed below, once */
    cd.num_threads = threads;
    cd.device = dev;          /* every tensor there (parameters, inputs, the optimizer's state) */
    cd.cpu_devices = dev.type == DL_DEVICE_CPU ? dev.index + 1 : 0;
    r->ctx = dl_ctx_init(&cd);
    if (!r->ctx) return 0;
    r->batch = batch;
    r->net = make_model(r->ctx, lenet);
    r->opt = dl_adam(r->net, NULL);
    r->x = dl_keep(dl_zeros(r->ctx, DL_SHAPE(batch, 1, 28, 28)));
    r->hx = (float *)malloc(sizeof(float) * (size_t)(batch * 784));
    r->hy = (int64_t *)calloc((size_t)batch, sizeof(int64_t));
    r->y = r->hy ? dl_keep(dl_from_int64(r->ctx, DL_SHAPE(batch), r->hy)) : NULL;
    return r->opt && r->x && r->y && r->hx;
}

/* copies batch k into the static inputs (outside any capture) */
static int load_batch(run *r, int k)
{
    make_batch(k, r->batch, r->hx, r->hy);
    return dl_write(r->x, r->hx, r->batch * 784) == DL_OK &&
           dl_copy_(r->y, dl_from_int64(r->ctx, DL_SHAPE(r->batch), r->hy)) == DL_OK;
}

/* steps 1..n the dynamic way: the tape rebuilt each step. Steps 3..n timed. */
static int run_eager(run *r, int n)
{
    double t0 = 0;
    int k;
    for (k = 1; k <= n; k++) {
        dl_tensor *loss;
        if (k == 3 && dl_sync(r->ctx) == DL_OK) t0 = now_ms();
        if (!load_batch(r, k) || !(loss = train_step(r->net, r->opt, r->x, r->y))) return 0;
        if (k == n) r->last = dl_item(loss);   /* the GPU waits here: the timing ends after it */
        dl_step_end(r->ctx);
    }
    r->ms = (now_ms() - t0) / (n - 2);
    return 1;
}

/* steps 1..n the static way: step 1 eager (the warm-up: it makes the
   gradients and the optimizer's lists, which a capture may not allocate),
   step 2 captured (dl_capture_end has run it), steps 3..n replayed. */
static int run_static(run *r, int n)
{
    dl_capture *cap = NULL;
    dl_tensor *loss = NULL;
    double t0 = 0;
    int k, ok = 1;
    for (k = 1; k <= n && ok; k++) {
        if (k == 3 && dl_sync(r->ctx) == DL_OK) t0 = now_ms();
        ok = load_batch(r, k);
        if (ok && k == 1) ok = train_step(r->net, r->opt, r->x, r->y) != NULL;
        else if (ok && k == 2) {
            cap = dl_capture_begin(r->ctx);                     /* record what follows ... */
            loss = train_step(r->net, r->opt, r->x, r->y);
            ok = dl_capture_end(cap) == DL_OK;                  /* ... until here (the first error, if any) */
        } else if (ok) {
            ok = dl_replay(cap) == DL_OK;                       /* the same work on the new batch */
        }
        if (ok && k == n) r->last = dl_item(loss);             /* loss: the capture's, rewritten by each replay */
        dl_step_end(r->ctx);                                    /* (the capture's tensors stay) */
    }
    r->ms = (now_ms() - t0) / (n - 2);
    dl_capture_free(cap);
    return ok;
}

/* what a capture refuses: a host read in the middle of the recorded step */
static void show_refusal(run *r)
{
    dl_capture *cap = dl_capture_begin(r->ctx);
    dl_tensor *loss = train_step(r->net, r->opt, r->x, r->y);
    float v = dl_item(loss);
    printf("dl_item inside a capture: %s\n  (%s)\n", v != v ? "refused" : "allowed?", dl_error_message(r->ctx));
    dl_capture_free(cap);
    dl_clear_error(r->ctx);
}

static int usage(const char *prog, FILE *f, int status)
{
    fprintf(f, "usage: %s [--device NAME (cpu)] [--model mlp|lenet (mlp)] [--batch N (16)] [--steps N (200)]\n"
               "       [--threads N (0)]\n"
               "  --device NAME  cpu, cpu:N or cuda:N (a DL_CUDA build): where every tensor lives\n"
               "  --model M      mlp (784-256-10 with dropout) or lenet (LeNet-BN, make run's)\n"
               "  --batch N      samples per step, 1..4096: small batches show the host's share\n"
               "  --steps N      training steps per run, 3..100000 (the first two are not timed)\n"
               "  --threads N    kernel threads, 0..1024 (0: every core)\n", prog);
    return status;
}

/* the whole of v as an integer in lo..hi, else exit 2 naming the flag */
static long flag_int(const char *prog, const char *flag, const char *v, long lo, long hi)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (!((v[0] >= '0' && v[0] <= '9') || v[0] == '-') || *end || n < lo || n > hi) {   /* no " 5", "+5" */
        fprintf(stderr, "%s: %s %s: must be a whole number from %ld to %ld\n", prog, flag, v, lo, hi);
        exit(usage(prog, stderr, 2));
    }
    return n;
}

int main(int argc, char **argv)
{
    dl_device dev;            /* --device; not given: the context's default (cpu, or DL_DEVICE=...) */
    bool lenet = false;
    long batch = 16, steps = 200, threads = 0;
    run e, s;
    int i, ok;
    EX_CHECK_STDOUT(argv[0]);
    dev.type = DL_DEVICE_DEFAULT;
    dev.index = 0;
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return usage(argv[0], stdout, 0);
        if (strcmp(f, "--device") && strcmp(f, "--model") && strcmp(f, "--batch") && strcmp(f, "--steps") &&
            strcmp(f, "--threads")) {
            fprintf(stderr, "%s: unknown flag %s\n", argv[0], f);
            return usage(argv[0], stderr, 2);
        }
        if (!v) { fprintf(stderr, "%s: %s needs a value\n", argv[0], f); return usage(argv[0], stderr, 2); }
        i++;
        if (!strcmp(f, "--batch")) batch = flag_int(argv[0], f, v, 1, 4096);
        else if (!strcmp(f, "--steps")) steps = flag_int(argv[0], f, v, 3, 100000);
        else if (!strcmp(f, "--threads")) threads = flag_int(argv[0], f, v, 0, 1024);
        else if (!strcmp(f, "--model")) {
            if (strcmp(v, "mlp") && strcmp(v, "lenet")) {
                fprintf(stderr, "%s: --model %s: must be mlp or lenet\n", argv[0], v);
                return usage(argv[0], stderr, 2);
            }
            lenet = !strcmp(v, "lenet");
        } else {
            dev = dl_device_parse(v);
            if (dev.type < 0 || dev.index > (dev.type == DL_DEVICE_CUDA ? 15 : 63)) {
                fprintf(stderr, "%s: --device %s: must be cpu, cpu:N (N 0..63) or cuda:N (N 0..15)\n", argv[0], v);
                return usage(argv[0], stderr, 2);
            }
        }
    }
    if (lenet && batch < 2) {   /* (as the other examples, before any work) */
        fprintf(stderr, "%s: --batch %ld: the lenet model's batch norm needs at least 2 samples a step\n",
                argv[0], batch);
        return usage(argv[0], stderr, 2);
    }
    memset(&e, 0, sizeof e);
    memset(&s, 0, sizeof s);
    ok = run_init(&e, dev, lenet, batch, (int)threads) && run_init(&s, dev, lenet, batch, (int)threads);
    if (!ok) {
        fprintf(stderr, "%s: --device %s: %s\n", argv[0], dl_device_name(dev),
                dl_error_message(e.ctx ? (s.ctx ? s.ctx : e.ctx) : NULL));
        ok = 2;
    } else if (!run_eager(&e, (int)steps) || !run_static(&s, (int)steps)) {
        fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(e.ctx && dl_last_error(e.ctx) ? e.ctx : s.ctx));
        ok = 1;
    } else {
        printf("%s on %s, batch %ld, Adam, %ld steps (%d threads)\n", lenet ? "LeNet-BN" : "MLP with dropout",
               dl_device_name(dl_ctx_device(e.ctx)), batch, steps, dl_num_threads(e.ctx));
        printf("  eager (the tape rebuilt each step)   %8.3f ms a step\n", e.ms);
        printf("  static (recorded once, replayed)     %8.3f ms a step   (%.2fx the eager step)\n", s.ms,
               s.ms / e.ms);
        printf("the last loss: %.9g eager, %.9g replayed: %s\n", (double)e.last, (double)s.last,
               memcmp(&e.last, &s.last, sizeof(float)) == 0 ? "the same bits" : "DIFFERENT");
        show_refusal(&s);
        ok = memcmp(&e.last, &s.last, sizeof(float)) == 0 ? 0 : 1;
    }
    free(e.hx); free(e.hy); free(s.hx); free(s.hy);
    dl_ctx_free(e.ctx);
    dl_ctx_free(s.ctx);
    return ok;
}
