/* tests/test_oom.c - every host allocation failing in turn: a training
   program (a small conv net with batch norm and dropout, Adam, a loader
   with worker threads, a checkpoint saved and loaded, a capture replayed,
   TensorBoard records, a graph, dl_free with a view, dl_ddp over cpu:0 and
   cpu:1) runs once per N with the N-th call of DL_MALLOC/DL_REALLOC
   failing. Each failure must come back as an error with a message (never a
   crash, and under make sanitize no leak or use after free), and the
   program carries on or stops cleanly. A hostile review found crashes this
   way: dl_ddp_init freeing uninitialized pointers, dl_free and
   dl_capture_free releasing memory at once when their bookkeeping could
   not be allocated, dl_graph_dot leaking its text. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <sys/stat.h>
#include <stddef.h>
static long fi_calls, fi_fail_at;   /* fail call number fi_fail_at (1-based; 0: none) */
static int fi_take(void)
{
    long k = __atomic_add_fetch(&fi_calls, 1, __ATOMIC_RELAXED);
    return fi_fail_at != 0 && k == fi_fail_at;
}
static void *fi_malloc(size_t n) { return fi_take() ? NULL : malloc(n); }
static void *fi_realloc(void *p, size_t n) { return fi_take() ? NULL : realloc(p, n); }
#define DL_MALLOC(n) fi_malloc(n)
#define DL_REALLOC(p, n) fi_realloc(p, n)
#define DL_FREE(p) free(p)
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdio.h>
#include <string.h>

static dl_ctx *ctx;
static int bad_msgs, reached_end;

/* a call failed: it said why (an error code and a message naming something) */
static void said(const char *where)
{
    if (dl_last_error(ctx) == DL_OK || !dl_error_message(ctx)[0]) {
        if (bad_msgs++ < 5) printf("FAIL fail_at %ld: %s failed without an error\n", fi_fail_at, where);
    } else if (fi_fail_at == 0) {
        printf("FAIL %s failed with no allocation failing: %s\n", where, dl_error_message(ctx));
    }
    dl_clear_error(ctx);
}

static dl_module *net(void)
{
    dl_module *m[6];
    dl_conv_desc cd = dl_conv_desc_make(1, 1, 1, 1);
    m[0] = dl_nn_conv2d(ctx, 1, 4, 3, &cd, true);
    m[1] = dl_nn_batch_norm2d(ctx, 4);
    m[2] = dl_nn_relu(ctx);
    m[3] = dl_nn_flatten(ctx);
    m[4] = dl_nn_dropout(ctx, 0.25f);
    m[5] = dl_nn_linear(ctx, 4 * 6 * 6, 3, true);
    return dl_nn_sequential(ctx, 6, m);
}

static dl_tensor *ce(dl_module *m, dl_tensor *x, dl_tensor *y, void *u)
{
    (void)u;
    return dl_cross_entropy(dl_module_forward(m, x), y, NULL);
}

/* one run; true when it got to the end without meeting the failure */
static bool run(const char *dir)
{
    dl_ctx_desc d;
    dl_module *m, *reps[2] = {NULL, NULL};
    dl_optim *o, *ops[2] = {NULL, NULL};
    dl_loader *l;
    dl_loader_desc ld;
    dl_tensor *x, *y, *bx, *by, *loss, *v;
    dl_capture *cap;
    dl_summary_writer *w;
    dl_ddp *dp;
    float xv[16 * 36];
    int64_t yv[16];
    char path[512];
    int i;
    memset(&d, 0, sizeof d);
    d.seed = 3;
    d.num_threads = 2;
    d.cpu_devices = 2;
    d.log = dl_log_silent;
    fi_calls = 0;
    ctx = dl_ctx_init(&d);
    if (!ctx) return false;   /* (its message went to the context-less slot) */
    for (i = 0; i < 16 * 36; i++) xv[i] = (float)((i * 7) % 256);
    for (i = 0; i < 16; i++) yv[i] = i % 3;
    if (!(m = net())) { said("the model"); goto done; }
    if (!(o = dl_adam(m, NULL))) { said("dl_adam"); goto done; }
    x = dl_keep(dl_from_array(ctx, DL_SHAPE(16, 1, 6, 6), xv));
    y = dl_keep(dl_from_int64(ctx, DL_SHAPE(16), yv));
    if (!x || !y) { said("the data"); goto done; }
    memset(&ld, 0, sizeof ld);
    ld.batch_size = 4;
    ld.shuffle = true;
    ld.num_workers = 2;
    if (!(l = dl_loader_new(ctx, dl_tensor_dataset(ctx, x, y, NULL, true), &ld))) { said("the loader"); goto done; }
    for (i = 0; i < 3; i++) {   /* training steps */
        int r = dl_loader_next(l, &bx, &by);
        if (r < 0) { said("dl_loader_next"); goto done; }
        if (r == 0) continue;
        dl_optim_zero_grad(o);
        loss = dl_cross_entropy(dl_module_forward(m, bx), by, NULL);
        if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(o) != DL_OK) { said("a step"); goto done; }
        dl_step_end(ctx);
    }
    snprintf(path, sizeof path, "%s/oom.safetensors", dir);
    if (dl_save(path, m, o) != DL_OK || dl_load(path, m, o) != DL_OK) { said("the checkpoint"); goto done; }
    if (!(cap = dl_capture_begin(ctx))) { said("dl_capture_begin"); goto done; }
    dl_optim_zero_grad(o);   /* (static inputs: the persistent x and y) */
    dl_backward(dl_cross_entropy(dl_module_forward(m, x), y, NULL));
    dl_optim_step(o);
    if (dl_capture_end(cap) != DL_OK) { said("the capture"); dl_capture_free(cap); goto done; }
    for (i = 0; i < 2; i++)
        if (dl_replay(cap) != DL_OK) { said("dl_replay"); break; }
    v = dl_reshape(dl_module_get(m, "0.weight"), DL_SHAPE(36));   /* a view, then the capture goes */
    dl_capture_free(cap);
    if (v && !dl_sum(v, DL_ALL, false)) said("a view after dl_capture_free");
    dl_step_end(ctx);
    {   /* dl_free with a view made in the step */
        dl_tensor *k = dl_keep(dl_ones(ctx, DL_SHAPE(8))), *kv;
        if (!k) { said("dl_keep"); goto done; }
        kv = dl_reshape(k, DL_SHAPE(2, 4));
        dl_free(k);
        if (kv && !dl_sum(kv, DL_ALL, false)) said("a view of a freed tensor");
        dl_step_end(ctx);
    }
    snprintf(path, sizeof path, "%s/tb", dir);
    if ((w = dl_summary_open(ctx, path)) != NULL) {
        loss = dl_cross_entropy(dl_module_forward(m, x), y, NULL);
        if (dl_summary_scalar(w, "loss", 1, 0.5) != DL_OK) said("dl_summary_scalar");
        if (dl_summary_histogram(w, "w", 1, dl_module_get(m, "5.weight")) != DL_OK) said("dl_summary_histogram");
        if (loss && dl_summary_graph(w, loss) != DL_OK) said("dl_summary_graph");
        if (dl_summary_close(w) != DL_OK) said("dl_summary_close");
        snprintf(path, sizeof path, "%s/graph.dot", dir);
        if (loss && dl_graph_dot(loss, path) != DL_OK) said("dl_graph_dot");
    } else {
        said("dl_summary_open");
    }
    dl_step_end(ctx);
    for (i = 0; i < 2; i++) {   /* two replicas, cpu:0 and cpu:1 */
        if (!(reps[i] = net()) || dl_module_to(reps[i], dl_cpu_device(i)) != DL_OK ||
            !(ops[i] = dl_sgd(reps[i], NULL))) { said("a replica"); goto done; }
    }
    if (!(dp = dl_ddp_init(2, reps, ops, NULL))) { said("dl_ddp_init"); goto done; }
    bx = dl_from_array(ctx, DL_SHAPE(4, 1, 6, 6), xv);
    by = dl_from_int64(ctx, DL_SHAPE(4), yv);
    if (!bx || !by || dl_ddp_step(dp, bx, by, ce, NULL, NULL) != DL_OK) { said("dl_ddp_step"); goto done; }
    dl_step_end(ctx);
    reached_end = 1;
done:
    dl_ctx_free(ctx);
    ctx = NULL;
    return fi_fail_at == 0 || fi_calls < fi_fail_at;
}

int main(void)
{
    const char *dir = "build/oom_tmp";
    long n, total;
    int failed_clean = 0;
    mkdir("build", 0755);
    mkdir(dir, 0755);
    fi_fail_at = 0;
    reached_end = 0;
    CHECK(run(dir) && reached_end && bad_msgs == 0, "the program runs to its end without a failure");
    total = fi_calls;
    CHECK(total > 100, "it allocates (%ld calls)", total);
    for (n = 1; n <= total + 50; n++) {
        fi_fail_at = n;
        if (run(dir)) break;   /* past the last allocation */
        failed_clean++;
    }
    CHECK(bad_msgs == 0, "%d failures said nothing", bad_msgs);
    CHECK(failed_clean > 100, "%d runs with a failing allocation, each an error, not a crash", failed_clean);
    printf("%ld allocations a run; each failed in turn\n", total);
    fi_fail_at = 0;
    TEST_END();
}
