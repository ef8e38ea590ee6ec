/* tests/fuzz_checkpoint.c - libFuzzer target for the safetensors checkpoint
   loader. Each input is loaded from memory (dl__load_buffer, the code behind
   dl_load) into a small fixed model, once without and once with an Adam
   (amsgrad) optimizer, then read by dl_load_tensor's reader (one tensor by
   name). It must never crash, leak or read out of bounds, and a
   failed load must leave the model and the optimizer unchanged (checked
   against a snapshot; a violation aborts).

   Build and run (from the repository root):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz_checkpoint.c \
             -o /tmp/fz_ckpt -lm -lpthread
       mkdir -p /tmp/fz_corpus && /tmp/fz_ckpt -max_total_time=600 /tmp/fz_corpus
   Seed corpus (valid checkpoints of this model, with and without optimizer state):
       cc -DFUZZ_SEED_MAIN -I. tests/fuzz_checkpoint.c -o /tmp/fz_seed -lm -lpthread
       /tmp/fz_seed /tmp/fz_corpus */
#define DL_IMPLEMENTATION
#include "dl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fz_state { dl_module *seq; } fz_state;

static dl_tensor *fz_forward(dl_module *m, dl_tensor *x)
{
    fz_state *s = (fz_state *)dl_module_state(m);
    return dl_module_forward(s->seq, x);
}

/* Net: seq (Linear(3,2), ReLU, Linear(2,1)) + buffers "count" (int64) and "scale" (float32) */
static dl_module *fz_model(dl_ctx *ctx)
{
    dl_module *mods[3], *m = dl_module_new(ctx, "Net", fz_forward, sizeof(fz_state));
    fz_state *s;
    int64_t cnt = 7;
    if (!m) return NULL;
    s = (fz_state *)dl_module_state(m);
    mods[0] = dl_nn_linear(ctx, 3, 2, true);
    mods[1] = dl_nn_relu(ctx);
    mods[2] = dl_nn_linear(ctx, 2, 1, true);
    s->seq = dl_module_add(m, "seq", dl_nn_sequential(ctx, 3, mods));
    dl_module_buffer(m, "count", dl_from_int64(ctx, DL_SHAPE(1), &cnt));
    dl_module_buffer(m, "scale", dl_full(ctx, DL_SHAPE(2, 2), 0.5f));
    return s->seq ? m : NULL;
}

static dl_ctx *g_ctx;
static dl_module *g_m;
static dl_optim *g_o;
static unsigned char g_snap[4096];
static size_t g_snap_n;

/* every module tensor and optimizer state tensor, steps and lr, as bytes */
static size_t fz_snapshot(unsigned char *dst)
{
    const dl_named_tensor *sd;
    int n = dl_module_state_dict(g_m, &sd), i, k;
    size_t pos = 0;
    int64_t steps = dl_optim_steps(g_o);
    float lr = dl_optim_lr(g_o);
    for (i = 0; i < n; i++) {
        size_t b = (size_t)sd[i].t->numel * (sd[i].t->dtype == DL_DTYPE_I64 ? 8 : 4);
        if (b) sd[i].t->dev_->be->download(sd[i].t->dev_, dst + pos, sd[i].t->data, b);
        pos += b;
    }
    for (k = 0; k < 3; k++)
        for (i = 0; i < g_o->n; i++) {
            dl_tensor *st = g_o->s[k][i];
            if (st->numel) st->dev_->be->download(st->dev_, dst + pos, st->data, (size_t)st->numel * 4);
            pos += (size_t)g_o->s[k][i]->numel * 4;
        }
    memcpy(dst + pos, g_o->pstep, sizeof(int64_t) * (size_t)g_o->n);
    pos += sizeof(int64_t) * (size_t)g_o->n;
    memcpy(dst + pos, &steps, 8);
    memcpy(dst + pos + 8, &lr, 4);
    return pos + 12;
}

static void fz_setup(void)
{
    dl_ctx_desc d;
    dl_adam_desc ad; memset(&ad, 0, sizeof ad);
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.num_threads = 1;
    d.seed = 3;
    g_ctx = dl_ctx_init(&d);
    g_m = fz_model(g_ctx);
    ad.amsgrad = true;
    g_o = dl_adam(g_m, &ad);
    if (!g_o) abort();
    g_snap_n = fz_snapshot(g_snap);
}

#ifndef FUZZ_SEED_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned char now[4096];
    dl_result r;
    int pass;
    if (!g_ctx) fz_setup();
    for (pass = 0; pass < 2; pass++) {
        r = dl__load_buffer("dl_load", data, size, "fuzz", g_m, pass ? g_o : NULL);
        if (r != DL_OK) {
            if (fz_snapshot(now) != g_snap_n || memcmp(now, g_snap, g_snap_n) != 0) {
                fprintf(stderr, "failed load (%s) changed the model\n", dl_error_message(g_ctx));
                abort();
            }
            if (dl_last_error(g_ctx) == DL_OK || dl_error_message(g_ctx)[0] == 0) abort();
        } else {
            g_snap_n = fz_snapshot(g_snap);    /* a valid file: the new state is the reference */
        }
        dl_clear_error(g_ctx);
    }
    {   /* dl_load_tensor's reader: a tensor, or NULL with a message */
        dl_tensor *t = dl__load_tensor_buffer(g_ctx, "dl_load_tensor", data, size, "fuzz", "seq.0.weight");
        if (!t && (dl_last_error(g_ctx) == DL_OK || dl_error_message(g_ctx)[0] == 0)) abort();
        dl_free(t);
        dl_clear_error(g_ctx);
        dl_step_end(g_ctx);
    }
    return 0;
}
#else
int main(int argc, char **argv)
{
    char p1[512], p2[512];
    dl_tensor *x, *loss;
    if (argc < 2) { fprintf(stderr, "usage: %s corpus_dir\n", argv[0]); return 2; }
    fz_setup();
    x = dl_randn(g_ctx, DL_SHAPE(4, 3));
    loss = dl_mean(dl_module_forward(g_m, x), DL_ALL, false);
    if (dl_backward(loss) != DL_OK || dl_optim_step(g_o) != DL_OK) return 1;
    snprintf(p1, sizeof p1, "%s/seed_model.safetensors", argv[1]);
    snprintf(p2, sizeof p2, "%s/seed_model_optim.safetensors", argv[1]);
    if (dl_save(p1, g_m, NULL) != DL_OK || dl_save(p2, g_m, g_o) != DL_OK) {
        fprintf(stderr, "%s\n", dl_error_message(g_ctx));
        return 1;
    }
    printf("wrote %s and %s\n", p1, p2);
    dl_ctx_free(g_ctx);
    return 0;
}
#endif
