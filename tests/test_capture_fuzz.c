/* tests/test_capture_fuzz.c - capture and replay under random use: a byte
   string drives a sequence of API calls on one context (A), and a second
   context (B) with the same seed, model and data runs every step eagerly.

   The calls: eager training steps and forward passes, dl_capture_begin /
   end / free and dl_replay on three capture slots, dl_step_end, batches
   written into the static inputs, learning rates, train/eval mode,
   zero_grad, reseeding, host reads inside and outside a capture, and a few
   that break the model on purpose (a parameter freed, the model moved to
   another device, the optimizer freed).

   What must hold, whatever the order:
   - nothing crashes, and the sanitizers, valgrind and a counting allocator
     find no invalid access and no leak (every context is freed at the end);
   - every call that fails says why, naming the call (the message starts
     with "dl_");
   - each call succeeds or fails as the rules say (docs/capture.md): a
     capture fails when anything inside it failed (a host read or write,
     dl_step_end, a nested dl_capture_begin or a dl_replay inside, a second
     optimizer step); a replay works exactly when its capture ended well
     and was not freed (DL_ERR_STALE after dl_capture_free);
   - while A has run only what B mirrored, A's parameters, buffers,
     optimizer state and every loss have B's bits: replay k is eager step k.
     A failed capture may have run part of its step (CPU devices run the
     ops as they record them), so A is then no longer compared.

   The same function is a libFuzzer target: `make fuzz` builds it with
   -DDL_LIBFUZZER, where a broken rule aborts. Without that, main() runs
   NSEQ pseudo-random sequences (fixed seeds) and counts the checks. Every
   tensor lives on the context's default device, so `make test` runs this on
   the strict cpu:1 too and `make test-cuda-emu` on emulated cuda:0.
   Build: gcc -std=c99 -Wall -Wextra -Werror -pedantic -O2 -I. tests/test_capture_fuzz.c -lm -lpthread */
#include <stdlib.h>
#include <string.h>
#include "count_alloc.h"   /* cnt_live, cnt_calls */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdio.h>

#ifdef DL_LIBFUZZER
#undef CHECK
#define CHECK(cond, ...) do { \
    if (!(cond)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); abort(); } \
} while (0)
#endif

#define B 4            /* batch */
#define HW 8           /* input 1 x 8 x 8 */
#define NCLS 5
#define NSLOT 3
#define MAXOPS 4       /* logical ops a capture's list keeps (more: A is no longer compared) */
#define MAXSEQ 48      /* calls per sequence */

/* one context: its model, optimizer and static inputs */
typedef struct side {
    dl_ctx *ctx;
    dl_module *net;
    dl_optim *opt;
    dl_tensor *x, *y;
} side;

/* what a capture recorded, for B to run eagerly: 'S' a training step,
   'F' a forward and loss, 'Z' zero_grad, each with the mode it ran in */
typedef struct op { char kind; bool train; } op;

enum { SLOT_NONE, SLOT_RECORDING, SLOT_READY, SLOT_FAILED, SLOT_FREED };
typedef struct slot {
    dl_capture *cap;
    int state;
    int nops;
    op ops[MAXOPS];
    bool overflow;             /* more ops than the list keeps */
    dl_tensor *loss;           /* the last op's loss (the capture's tensor), or NULL */
} slot;

typedef struct fuzz {
    side a, b;
    slot s[NSLOT];
    int rec;                   /* the slot recording, or -1 */
    bool rec_err;              /* something failed inside the recording capture */
    bool rec_ran;              /* the recording capture has ops (run on CPU devices as recorded) */
    bool compare;              /* A has run only what B mirrored */
    bool broken;               /* a call broke A's model on purpose: A's calls may fail */
    bool train;                /* the mode both models are in */
    int optk;
} fuzz;

static unsigned char g_a[1 << 16], g_b[1 << 16];
static long g_nreplay, g_nend, g_nstate;   /* replays, capture ends and states compared with B */

/* ---------------------------------------------------------------- set-up */

static dl_ctx *new_ctx(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.seed = 7;
    d.cpu_devices = 2;
    return dl_ctx_init(&d);
}

/* conv 1->4 (3x3, pad 1), BatchNorm2d, ReLU, max pool 2, flatten, linear
   64->16, ReLU, dropout 0.3, linear 16->5: batch norm's buffers, the RNG
   and the optimizer's state all change every step */
static dl_module *make_net(dl_ctx *ctx)
{
    dl_conv_desc c = dl_conv_desc_make(1, 1, 1, 1);
    dl_pool_desc p = dl_pool_desc_make(2, 2, 0, false, true);
    dl_module *m[9];
    m[0] = dl_nn_conv2d(ctx, 1, 4, 3, &c, true);
    m[1] = dl_nn_batch_norm2d(ctx, 4);
    m[2] = dl_nn_relu(ctx);
    m[3] = dl_nn_max_pool2d(ctx, &p);
    m[4] = dl_nn_flatten(ctx);
    m[5] = dl_nn_linear(ctx, 4 * (HW / 2) * (HW / 2), 16, true);
    m[6] = dl_nn_relu(ctx);
    m[7] = dl_nn_dropout(ctx, 0.3f);
    m[8] = dl_nn_linear(ctx, 16, NCLS, true);
    return dl_nn_sequential(ctx, 9, m);
}

static dl_optim *make_opt(dl_module *net, int k)
{
    if (k == 0) {
        dl_sgd_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.05f;
        sd.momentum = 0.9f;
        sd.nesterov = true;
        sd.weight_decay = 1e-4f;
        return dl_sgd(net, &sd);
    } else {
        dl_adam_desc ad;
        memset(&ad, 0, sizeof ad);
        ad.lr = 2e-3f;
        return k == 1 ? dl_adam(net, &ad) : dl_adamw(net, &ad);
    }
}

static bool side_init(side *s, int optk)
{
    static const int64_t zeros[B] = {0};
    memset(s, 0, sizeof *s);
    s->ctx = new_ctx();
    if (!s->ctx) return false;
    s->net = make_net(s->ctx);
    s->opt = s->net ? make_opt(s->net, optk) : NULL;
    s->x = dl_keep(dl_zeros(s->ctx, DL_SHAPE(B, 1, HW, HW)));
    s->y = dl_keep(dl_from_int64(s->ctx, DL_SHAPE(B), zeros));
    dl_step_end(s->ctx);
    return s->net && s->opt && s->x && s->y;
}

/* batch k: the same numbers on both sides */
static dl_result write_batch(side *s, int k)
{
    float xs[B * HW * HW];
    int64_t ys[B];
    uint32_t v = 2654435761u * (uint32_t)(k + 1);
    dl_result rc;
    int i;
    for (i = 0; i < B * HW * HW; i++) {
        v = v * 1664525u + 1013904223u;
        xs[i] = (float)(v >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    for (i = 0; i < B; i++) ys[i] = (int64_t)((v >> (i + 3)) % NCLS);
    rc = dl_write(s->x, xs, B * HW * HW);
    if (rc != DL_OK) return rc;
    return dl_copy_(s->y, dl_from_int64(s->ctx, DL_SHAPE(B), ys));
}

/* one logical op; its loss (NULL for 'Z' or on an error) */
static dl_tensor *run_op(side *s, char kind)
{
    dl_tensor *loss;
    if (kind == 'Z') { dl_optim_zero_grad(s->opt); return NULL; }
    if (kind == 'S') dl_optim_zero_grad(s->opt);
    loss = dl_cross_entropy(dl_module_forward(s->net, s->x), s->y, NULL);
    if (kind == 'S' && (!loss || dl_backward(loss) != DL_OK || dl_optim_step(s->opt) != DL_OK)) return NULL;
    return loss;
}

/* ---------------------------------------------------------------- checks */

/* A's call failed: it must say so, naming the call (or the op whose
   backward failed); the error is cleared */
static void failed_says_why(fuzz *f, const char *what)
{
    const char *m = dl_error_message(f->a.ctx);
    CHECK(dl_last_error(f->a.ctx) != DL_OK && (strncmp(m, "dl_", 3) == 0 || strncmp(m, "in the backward of dl_", 22) == 0),
          "%s failed with a message naming the call: %s: \"%s\"", what, dl_result_string(dl_last_error(f->a.ctx)), m);
    dl_clear_error(f->a.ctx);
}

/* something A ran inside the recording capture failed */
static void rec_failed(fuzz *f, const char *what)
{
    failed_says_why(f, what);
    f->rec_err = true;
}

/* the bits of A's loss la (read on the host) against B's lb */
static void same_loss(fuzz *f, dl_tensor *la, dl_tensor *lb, const char *what)
{
    float va, vb;
    if (!f->compare || !la || !lb) return;
    va = dl_item(la);
    vb = dl_item(lb);
    CHECK(memcmp(&va, &vb, sizeof va) == 0, "%s: A's loss %.9g, eager B's %.9g", what, (double)va, (double)vb);
    if (dl_last_error(f->a.ctx) != DL_OK) failed_says_why(f, "dl_item");
}

static void same_state(fuzz *f, const char *what)
{
    size_t na, nb;
    if (!f->compare || f->rec >= 0) return;
    na = th_train_bytes(f->a.net, f->a.opt, g_a, sizeof g_a);   /* parameters, buffers, optimizer state */
    nb = th_train_bytes(f->b.net, f->b.opt, g_b, sizeof g_b);
    CHECK(na && na == nb && memcmp(g_a, g_b, na) == 0, "%s: A's state (%zu bytes) has eager B's bits (%zu)", what,
          na, nb);
    g_nstate++;
}

/* B runs a capture's ops (its end, or a replay) eagerly; the last op's
   loss against the capture's */
static void mirror(fuzz *f, const slot *s, const char *what, long *count)
{
    dl_tensor *loss = NULL;
    int i;
    for (i = 0; i < s->nops; i++) {
        dl_module_train(f->b.net, s->ops[i].train);
        if (s->ops[i].kind != 'Z') loss = run_op(&f->b, s->ops[i].kind);
        else run_op(&f->b, 'Z');
    }
    dl_module_train(f->b.net, f->train);
    same_loss(f, s->loss, loss, what);
    (*count)++;
    dl_step_end(f->b.ctx);
}

/* ---------------------------------------------------------------- the calls */

/* the training steps among a capture's ops */
static int slot_steps(const slot *s)
{
    int i, n = 0;
    for (i = 0; i < s->nops; i++) n += s->ops[i].kind == 'S';
    return n;
}

/* an op in A ('S', 'F', 'Z'): eager (B the same) or recorded */
static void do_op(fuzz *f, char kind)
{
    dl_tensor *la, *lb;
    bool bad;
    if (!f->a.x) return;   /* freed (do_rare) */
    la = run_op(&f->a, kind);
    bad = kind != 'Z' && !la;
    if (f->rec >= 0) {
        slot *s = &f->s[f->rec];
        int steps = slot_steps(s);
        if (s->nops < MAXOPS) {
            s->ops[s->nops].kind = kind;
            s->ops[s->nops].train = f->train;
            s->nops++;
        } else {
            s->overflow = true;
        }
        f->rec_ran = true;
        if (kind != 'Z') s->loss = la;
        if (bad) rec_failed(f, "an op inside a capture");
        else CHECK(f->broken || f->rec_err || !(kind == 'S' && steps), "a second optimizer step in one capture is refused");
        return;
    }
    if (bad) {
        CHECK(f->broken, "an eager %c op fails only on a broken model: %s", kind, dl_error_message(f->a.ctx));
        failed_says_why(f, "an eager op");
        f->compare = false;
        return;
    }
    if (!f->compare) return;
    lb = run_op(&f->b, kind);
    same_loss(f, la, lb, kind == 'S' ? "an eager step" : "an eager forward");
    dl_step_end(f->b.ctx);
}

static void do_begin(fuzz *f, int k)
{
    slot *s = &f->s[k];
    dl_capture *c;
    if (f->rec >= 0) {
        c = dl_capture_begin(f->a.ctx);
        CHECK(c == NULL, "a nested dl_capture_begin is refused");
        rec_failed(f, "a nested dl_capture_begin");
        return;
    }
    if (s->state != SLOT_NONE && s->state != SLOT_FREED) dl_capture_free(s->cap);
    memset(s, 0, sizeof *s);
    c = dl_capture_begin(f->a.ctx);
    CHECK(c != NULL, "dl_capture_begin outside a capture: %s", dl_error_message(f->a.ctx));
    if (!c) { failed_says_why(f, "dl_capture_begin"); return; }
    s->cap = c;
    s->state = SLOT_RECORDING;
    f->rec = k;
    f->rec_err = f->rec_ran = false;
}

static void do_end(fuzz *f, int k)
{
    slot *s;
    dl_result rc;
    if (f->rec < 0) {   /* nothing recording: an error, nothing else */
        s = &f->s[k];
        if (s->state == SLOT_NONE) return;
        rc = dl_capture_end(s->cap);
        CHECK(rc != DL_OK, "dl_capture_end with nothing recording fails");
        if (s->state == SLOT_FREED) CHECK(rc == DL_ERR_STALE && dl_last_error(f->a.ctx) == DL_ERR_STALE,
                                          "dl_capture_end of a freed capture: stale");
        failed_says_why(f, "dl_capture_end");
        return;
    }
    s = &f->s[f->rec];
    f->rec = -1;
    rc = dl_capture_end(s->cap);
    if (rc != DL_OK) {
        CHECK(f->rec_err || f->broken, "dl_capture_end fails only after a failure inside: %s",
              dl_error_message(f->a.ctx));
        failed_says_why(f, "dl_capture_end");
        s->state = SLOT_FAILED;
        if (f->rec_ran) f->compare = false;
        return;
    }
    CHECK(!f->rec_err, "dl_capture_end reports the failure inside the capture");
    s->state = SLOT_READY;
    if (s->overflow) f->compare = false;
    if (f->compare) mirror(f, s, "dl_capture_end's run", &g_nend);   /* the capture's step ran once */
}

static void do_replay(fuzz *f, int k)
{
    slot *s = &f->s[k];
    dl_result rc;
    if (s->state == SLOT_NONE) return;
    rc = dl_replay(s->cap);
    if (f->rec >= 0) {
        CHECK(rc != DL_OK, "dl_replay inside a capture is refused");
        rec_failed(f, "dl_replay inside a capture");
        return;
    }
    if (s->state == SLOT_READY && !f->broken) CHECK(rc == DL_OK, "dl_replay: %s", dl_error_message(f->a.ctx));
    if (s->state == SLOT_FREED) CHECK(rc == DL_ERR_STALE, "dl_replay after dl_capture_free: stale");
    if (s->state == SLOT_FAILED || s->state == SLOT_RECORDING) CHECK(rc != DL_OK, "dl_replay of a failed capture");
    if (rc != DL_OK) {
        failed_says_why(f, "dl_replay");
        if (s->state == SLOT_READY) f->compare = false;
        return;
    }
    if (f->compare) mirror(f, s, "a replay", &g_nreplay);
}

static void do_free(fuzz *f, int k)
{
    slot *s = &f->s[k];
    if (s->state == SLOT_NONE) return;
    dl_capture_free(s->cap);   /* twice is nothing */
    if (s->state == SLOT_RECORDING) {
        f->rec = -1;
        if (f->rec_ran) f->compare = false;
    }
    s->state = SLOT_FREED;
    if (s->loss) {   /* its tensors read as stale */
        float v = dl_item(s->loss);
        CHECK(v != v && dl_last_error(f->a.ctx) == DL_ERR_STALE, "a freed capture's loss reads as stale");
        failed_says_why(f, "dl_item of a freed capture's loss");
        if (f->rec >= 0) f->rec_err = true;   /* an error inside another capture fails it */
        s->loss = NULL;
    }
}

static void do_step_end(fuzz *f)
{
    dl_step_end(f->a.ctx);
    if (f->rec >= 0) rec_failed(f, "dl_step_end inside a capture");
}

static void do_batch(fuzz *f, int k)
{
    dl_result rc;
    if (!f->a.x) return;   /* freed (do_rare) */
    rc = write_batch(&f->a, k);
    if (f->rec >= 0) {
        CHECK(rc != DL_OK, "dl_write inside a capture is refused");
        rec_failed(f, "dl_write inside a capture");
        return;
    }
    if (rc != DL_OK) {
        CHECK(f->broken, "a batch written outside a capture: %s", dl_error_message(f->a.ctx));
        failed_says_why(f, "write_batch");
        f->compare = false;
        return;
    }
    if (write_batch(&f->b, k) != DL_OK) f->compare = false;
    dl_step_end(f->b.ctx);
}

/* learning rate, mode or a host read: not inside a capture, where the
   first two would be baked (host state) and the read is refused */
static void do_host(fuzz *f, int k)
{
    if (f->rec >= 0) {
        float v;
        if (!f->s[f->rec].loss) return;
        v = dl_item(f->s[f->rec].loss);
        CHECK(v != v, "dl_item inside a capture reads NaN");
        rec_failed(f, "dl_item inside a capture");
        return;
    }
    if (k < 8) {
        float lr = (f->optk ? 1e-3f : 0.02f) * (float)(k + 1);
        CHECK(dl_optim_set_lr(f->a.opt, lr) == DL_OK || f->broken, "dl_optim_set_lr");
        dl_optim_set_lr(f->b.opt, lr);
        dl_clear_error(f->a.ctx);
    } else if (k < 12) {
        f->train = k & 1;
        dl_module_train(f->a.net, f->train);
        dl_module_train(f->b.net, f->train);
    } else {
        same_state(f, "a read between calls");
    }
}

/* rare: calls that break A on purpose, and a reseed */
static void do_rare(fuzz *f, int k)
{
    if (k == 0 && f->rec < 0) {
        /* the static input freed: the captures that read it are stale (a
           module's parameter cannot be: dl_free refuses it) */
        dl_free(f->a.x);
        f->a.x = NULL;
        f->broken = true;
        f->compare = false;
    } else if (k == 1 && f->rec < 0) {   /* the model moved: replays are stale, eager steps mix devices */
        dl_device d = dl_cpu_device(f->a.y->device.type == DL_DEVICE_CPU && f->a.y->device.index == 0);
        if (dl_module_to(f->a.net, d) != DL_OK) failed_says_why(f, "dl_module_to");
        f->broken = true;
        f->compare = false;
    } else if (k == 2 && f->rec < 0) {   /* the optimizer freed and made again */
        int i;
        dl_optim_free(f->a.opt);
        for (i = 0; i < NSLOT; i++) {   /* a capture of its step is stale now; of forwards, not */
            slot *s = &f->s[i];
            if (s->state != SLOT_READY || !(s->overflow || slot_steps(s))) continue;
            CHECK(dl_replay(s->cap) == DL_ERR_STALE, "a replay after its optimizer was freed: stale (%d ops)",
                  s->nops);
            failed_says_why(f, "dl_replay after dl_optim_free");
            s->state = SLOT_FAILED;
        }
        f->a.opt = make_opt(f->a.net, f->optk);
        f->broken = true;
        f->compare = false;
    } else if (k == 3) {   /* reseed: both sides; refused inside a capture */
        dl_manual_seed(f->a.ctx, 11);
        if (f->rec >= 0) rec_failed(f, "dl_manual_seed inside a capture");
        else dl_manual_seed(f->b.ctx, 11);
    }
}

/* ---------------------------------------------------------------- a sequence */

static void run_sequence(const uint8_t *data, size_t size)
{
    fuzz f;
    size_t i;
    memset(&f, 0, sizeof f);
    f.rec = -1;
    f.compare = true;
    f.train = true;
    f.optk = size ? data[0] % 3 : 0;
    if (!side_init(&f.a, f.optk) || !side_init(&f.b, f.optk)) {
        CHECK(0, "set-up: %s", f.a.ctx ? dl_error_message(f.a.ctx) : "no context");
        goto done;
    }
    /* an eager warm-up step on both (the gradients and the optimizer's state exist) */
    write_batch(&f.a, 0);
    write_batch(&f.b, 0);
    do_op(&f, 'S');
    for (i = 1; i < size && i <= MAXSEQ; i++) {
        int c = data[i] % 32, k = data[i] / 32;   /* k: 0..7 */
        if (c < 5) do_op(&f, 'S');
        else if (c < 7) do_op(&f, 'F');
        else if (c < 8) do_op(&f, 'Z');
        else if (c < 12) do_begin(&f, k % NSLOT);
        else if (c < 16) do_end(&f, k % NSLOT);
        else if (c < 21) do_replay(&f, k % NSLOT);
        else if (c < 23) do_free(&f, k % NSLOT);
        else if (c < 25) do_step_end(&f);
        else if (c < 27) do_batch(&f, k);
        else if (c < 31) do_host(&f, (c - 27) * 8 + k < 16 ? (c - 27) * 8 + k : 16);
        else do_rare(&f, k);
    }
    if (f.rec >= 0) do_end(&f, f.rec);
    same_state(&f, "the end");
done:
    dl_ctx_free(f.a.ctx);   /* with its captures alive */
    dl_ctx_free(f.b.ctx);
}

#ifdef DL_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run_sequence(data, size);
    return 0;
}
#else
#define NSEQ 300

/* the byte of one call: its class drawn with these weights (percent), the
   argument uniform. While a capture records (as far as the draws tell:
   after a begin, until an end), calls that fail it are rarer, so that most
   captures end well and get replayed. */
static uint8_t draw_call(uint32_t r, bool *recording)
{
    typedef struct cls { int weight, lo, n; } cls;
    static const cls out[] = {
        {22, 0, 5},  /* step */       {5, 5, 2},   /* forward */  {2, 7, 1},   /* zero_grad */
        {10, 8, 4},  /* begin */      {12, 12, 4}, /* end */      {27, 16, 5}, /* replay */
        {4, 21, 2},  /* free */       {4, 23, 2},  /* step_end */ {7, 25, 2},  /* batch */
        {6, 27, 4},  /* host */       {1, 31, 1},  /* rare */
    };
    static const cls in[] = {
        {36, 0, 5},  /* step */       {8, 5, 2},   /* forward */  {4, 7, 1},   /* zero_grad */
        {1, 8, 4},   /* begin */      {40, 12, 4}, /* end */      {3, 16, 5},  /* replay */
        {2, 21, 2},  /* free */       {1, 23, 2},  /* step_end */ {2, 25, 2},  /* batch */
        {2, 27, 4},  /* host */       {1, 31, 1},  /* rare */
    };
    const cls *w = *recording ? in : out;
    int pick = (int)(r % 100), i = 0, c;
    while (pick >= w[i].weight) pick -= w[i++].weight;
    c = w[i].lo + (int)((r >> 8) % (uint32_t)w[i].n);
    if (c >= 8 && c < 12) *recording = true;
    if (c >= 12 && c < 16) *recording = false;
    return (uint8_t)(c + 32 * (int)((r >> 16) % 8));
}

/* sequences `make fuzz` found, run first: 29 f1 0a 27 2f 71 replayed a
   record whose host struct was empty from a capture without any (NULL +
   0: UBSan's "applying zero offset to null pointer", 2026-11-29) */
static const struct { const char *b; size_t n; } g_found[] = {{"\x29\xf1\x0a\x27\x2f\x71", 6}};

int main(int argc, char **argv)
{
    uint8_t seq[MAXSEQ + 1];
    uint32_t r = 12345u;
    int n = NSEQ, i, j;
    for (i = 0; i < (int)(sizeof g_found / sizeof g_found[0]); i++)
        run_sequence((const uint8_t *)g_found[i].b, g_found[i].n);
    if (argc > 1) {   /* the count of sequences: 1 .. 10^7 */
        char *end;
        long v = strtol(argv[1], &end, 10);
        if (argc > 2 || *end || end == argv[1] || v < 1 || v > 10000000) {
            fprintf(stderr, "usage: %s [SEQUENCES]: SEQUENCES must be an integer in [1, 10000000], got \"%s\"\n",
                    argv[0], argv[argc > 2 ? 2 : 1]);
            return 2;
        }
        n = (int)v;
    }
    for (i = 0; i < n; i++) {
        bool recording = false;
        for (j = 0; j <= MAXSEQ; j++) {
            r = r * 1664525u + 1013904223u;
            seq[j] = j == 0 ? (uint8_t)(r >> 24) : draw_call(r >> 4, &recording);
        }
        run_sequence(seq, sizeof seq);
    }
    CHECK(cnt_live == 0, "every allocation freed (%ld live)", cnt_live);
    printf("%d sequences: %ld replays, %ld capture ends and %ld whole states compared with eager steps\n", n,
           g_nreplay, g_nend, g_nstate);
    TEST_END();
}
#endif
