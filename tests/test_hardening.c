/* tests/test_hardening.c - regression tests for what a hostile try of the
   library found (each case failed before its fix): stale step tensors of
   any age, custom functions returning an input, shared create_graph
   gradients, loader errors, checkpoint writes, optimizer values, messages of
   NULL returns, huge convolutions, the error message's lifetime, gzip bombs,
   use after dl_free, thread counts, names that would break a DOT file,
   custom functions' gradients of another dtype or device, checkpoints of
   deeply nested models; then what a second such review found (section 16)
   and the later ones (test_review3_*, test_review4_*, test_review5). */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <signal.h>
#include <pthread.h>
#include <sched.h>
#include <dirent.h>
#ifdef DL_ZLIB
#include <zlib.h>
#endif

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
#if defined(DL__HVM)
    int nages = 5;
#else   /* DL_NO_MMAP or no 64-bit POSIX: documented to catch the next step only */
    int nages = 1;
    SKIP("no never-reused header addresses here: stale tensors checked 1 step old only");
#endif
    for (i = 0; i < nages; i++) {
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
#if defined(DL__HVM)
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
#endif
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
    float *d = th_host(in[0]);
    int64_t i;
    (void)fc; (void)n; (void)user;
    for (i = 0; i < in[0]->numel; i++) d[i] *= 2.0f;   /* "in place", then returned */
    th_put(in[0], d);
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
        th_set(a->grad, 0, 42.0f);
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

/* 6. saving: unique temporaries, no collisions, non-regular files refused,
   symlinks written through, a full disk leaves the old file */
static dl_module *small_net(dl_ctx *ctx)
{
    return dl_nn_linear(ctx, 4, 3, true);
}

typedef struct saver { const char *path; int ok, n; } saver;
static void *save_loop(void *arg)
{
    saver *sv = (saver *)arg;
    dl_ctx *ctx = new_ctx();
    dl_module *m = small_net(ctx);
    int i;
    for (i = 0; i < sv->n; i++) sv->ok += dl_save(sv->path, m, NULL) == DL_OK;
    dl_ctx_free(ctx);
    return NULL;
}

static int count_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d))) if (strstr(e->d_name, ".tmp")) n++;
    closedir(d);
    return n;
}

static void test_save(void)
{
    dl_ctx *ctx = new_ctx();
    dl_module *m = small_net(ctx), *m2 = small_net(ctx);
    float w[12], w2[12];
    struct stat st;
    {   /* two savers, one path */
        pthread_t th[2];
        saver sv[2];
        int i;
        for (i = 0; i < 2; i++) { sv[i].path = tmp("shared.safetensors"); sv[i].ok = 0; sv[i].n = 50; }
        for (i = 0; i < 2; i++) pthread_create(&th[i], NULL, save_loop, &sv[i]);
        for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
        CHECK(sv[0].ok == 50 && sv[1].ok == 50, "concurrent saves failed: %d and %d of 50", sv[0].ok, sv[1].ok);
        CHECK(dl_load(tmp("shared.safetensors"), m2, NULL) == DL_OK, "the file two savers wrote loads: %s",
              dl_error_message(ctx));
        CHECK(count_tmp_files(g_dir) == 0, "temporary files left behind: %d", count_tmp_files(g_dir));
    }
    /* a device node, a directory: refused, never replaced */
    if (stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode)) {
        CHECK(dl_save("/dev/full", m, NULL) == DL_ERR_IO, "saving over /dev/full");
        EXPECT_ERR(ctx, DL_ERR_IO, "/dev/full exists and is not a regular file (a device)");
        CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode), "/dev/full was replaced");
    }
    mkdir(tmp("adir"), 0755);
    CHECK(dl_save(tmp("adir"), m, NULL) == DL_ERR_IO, "saving over a directory");
    EXPECT_ERR(ctx, DL_ERR_IO, "is not a regular file (a directory)");
    CHECK(stat(tmp("adir"), &st) == 0 && S_ISDIR(st.st_mode), "the directory was replaced");
    /* a symbolic link: written through to its target, the link stays */
    remove(tmp("target.safetensors"));
    remove(tmp("link.safetensors"));
    CHECK(dl_save(tmp("target.safetensors"), m2, NULL) == DL_OK, "save target");
    CHECK(symlink("target.safetensors", tmp("link.safetensors")) == 0, "symlink");
    CHECK(dl_save(tmp("link.safetensors"), m, NULL) == DL_OK, "save through a link: %s", dl_error_message(ctx));
    CHECK(lstat(tmp("link.safetensors"), &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced by a file");
    CHECK(dl_load(tmp("target.safetensors"), m2, NULL) == DL_OK, "load target");
    dl_read(dl_module_get(m, "weight"), w, 12);
    dl_read(dl_module_get(m2, "weight"), w2, 12);
    CHECK(memcmp(w, w2, sizeof w) == 0, "the link's target did not get the new contents");
    /* a full disk (a file size limit: writes fail like ENOSPC): the old file stays */
    {
        struct rlimit old, lim;
        dl_module *big = dl_nn_linear(ctx, 256, 256, true);
        FILE *f;
        long before;
        CHECK(dl_save(tmp("full.safetensors"), m, NULL) == DL_OK, "save small");
        f = fopen(tmp("full.safetensors"), "rb");
        fseek(f, 0, SEEK_END);
        before = ftell(f);
        fclose(f);
        signal(SIGXFSZ, SIG_IGN);
        getrlimit(RLIMIT_FSIZE, &old);
        lim = old;
        lim.rlim_cur = 4096;
        setrlimit(RLIMIT_FSIZE, &lim);
        CHECK(dl_save(tmp("full.safetensors"), big, NULL) == DL_ERR_IO, "a write past the limit succeeded");
        setrlimit(RLIMIT_FSIZE, &old);
        EXPECT_ERR(ctx, DL_ERR_IO, "is unchanged");
        f = fopen(tmp("full.safetensors"), "rb");
        fseek(f, 0, SEEK_END);
        CHECK(ftell(f) == before, "the old file changed");
        fclose(f);
        CHECK(count_tmp_files(g_dir) == 0, "a temporary file was left after a failed write");
        CHECK(dl_load(tmp("full.safetensors"), m2, NULL) == DL_OK, "the old file still loads");
    }
    /* reading a directory: a clear message, not a huge allocation */
    CHECK(dl_load(tmp("adir"), m2, NULL) == DL_ERR_IO, "loading a directory");
    EXPECT_ERR(ctx, DL_ERR_IO, "is a directory");
    {
        dl_tensor *t;
        CHECK(dl_idx_load(ctx, tmp("adir"), DL_DTYPE_F32, &t) == DL_ERR_IO, "idx from a directory");
        EXPECT_ERR(ctx, DL_ERR_IO, "is a directory, not a file");
    }
    dl_ctx_free(ctx);
}

/* 7. optimizer values: NaN, infinity, negatives are refused with the value */
static void test_optim_values(void)
{
    dl_ctx *ctx = new_ctx();
    dl_module *m = small_net(ctx);
    dl_sgd_desc sd;
    dl_adam_desc ad;
    dl_optim *o;
    memset(&sd, 0, sizeof sd);
    o = dl_sgd(m, &sd);
    CHECK(o && dl_optim_lr(o) == 1e-3f, "zeroed SGD desc: PyTorch's lr 1e-3");
    CHECK(dl_optim_set_lr(o, NAN) == DL_ERR_ARG, "set_lr nan");
    EXPECT_ERR(ctx, DL_ERR_ARG, "lr=nan");
    CHECK(dl_optim_set_lr(o, INFINITY) == DL_ERR_ARG, "set_lr inf");
    EXPECT_ERR(ctx, DL_ERR_ARG, "lr=inf");
    CHECK(dl_optim_set_lr(o, -0.5f) == DL_ERR_ARG && dl_optim_lr(o) == 1e-3f, "set_lr negative");
    EXPECT_ERR(ctx, DL_ERR_ARG, "lr=-0.5 must be a finite number >= 0");
    sd.weight_decay = -1.0f;
    CHECK(dl_sgd(m, &sd) == NULL, "negative weight decay");
    EXPECT_ERR(ctx, DL_ERR_ARG, "weight_decay=-1");
    sd.weight_decay = 0.0f;
    sd.momentum = INFINITY;
    CHECK(dl_sgd(m, &sd) == NULL, "inf momentum");
    EXPECT_ERR(ctx, DL_ERR_ARG, "momentum=inf");
    memset(&ad, 0, sizeof ad);
    ad.beta1 = 1.5f;
    CHECK(dl_adam(m, &ad) == NULL, "beta1 1.5");
    EXPECT_ERR(ctx, DL_ERR_ARG, "betas (1.5, 0.999) must each be in [0, 1)");
    ad.beta1 = 0.0f;
    ad.beta2 = NAN;
    CHECK(dl_adam(m, &ad) == NULL, "beta2 nan");
    EXPECT_ERR(ctx, DL_ERR_ARG, "betas (0.9, nan)");
    ad.beta2 = 0.0f;
    ad.eps = -1e-8f;
    CHECK(dl_adam(m, &ad) == NULL, "negative eps");
    EXPECT_ERR(ctx, DL_ERR_ARG, "eps=-1e-08");
    ad.eps = 0.0f;
    ad.lr = NAN;
    CHECK(dl_adamw(m, &ad) == NULL, "adamw lr nan");
    EXPECT_ERR(ctx, DL_ERR_ARG, "lr=nan");
    dl_ctx_free(ctx);
}

/* 8. every NULL return of a creator or constructor has a message */
#define NULL_WITH_MSG(c, call) do { \
    dl_clear_error(c); dl_clear_error(NULL); \
    CHECK((call) == NULL, "%s did not fail", #call); \
    CHECK(dl_error_message(c)[0] != 0 || dl_error_message(NULL)[0] != 0, "%s: NULL without a message", #call); \
} while (0)

static void test_null_returns_have_messages(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *a = dl_ones(ctx, DL_SHAPE(2, 3)), *ts[2];
    float v[2] = {1, 2};
    int64_t k[3] = {1, 1, 1};
    dl_conv_desc cd;
    dl_ctx_desc bad;
    memset(&cd, 0, sizeof cd);
    ts[0] = a;
    ts[1] = a;
    NULL_WITH_MSG(ctx, dl_cat(0, ts, 0));
    NULL_WITH_MSG(ctx, dl_cat(-1, ts, 0));
    NULL_WITH_MSG(ctx, dl_cat(2, NULL, 0));
    NULL_WITH_MSG(ctx, dl_stack(0, ts, 0));
    NULL_WITH_MSG(ctx, dl_stack(-3, NULL, 0));
    NULL_WITH_MSG(ctx, dl_cat(2, ts, 5));
    NULL_WITH_MSG(ctx, dl_empty(NULL, DL_SHAPE(2)));
    NULL_WITH_MSG(ctx, dl_zeros(NULL, DL_SHAPE(2)));
    NULL_WITH_MSG(ctx, dl_ones(ctx, DL_SHAPE(-1)));
    NULL_WITH_MSG(ctx, dl_full(ctx, dl_shape_make(DL_MAX_DIMS + 1, NULL), 1.0f));
    NULL_WITH_MSG(ctx, dl_zeros(ctx, DL_SHAPE((int64_t)1 << 40, (int64_t)1 << 40)));
    NULL_WITH_MSG(ctx, dl_arange(NULL, 0, 1, 1));
    NULL_WITH_MSG(ctx, dl_arange(ctx, 0, 1, 0));
    NULL_WITH_MSG(ctx, dl_arange(ctx, 0, NAN, 1));
    NULL_WITH_MSG(ctx, dl_rand(NULL, DL_SHAPE(2)));
    NULL_WITH_MSG(ctx, dl_randn(ctx, DL_SHAPE(-2)));
    NULL_WITH_MSG(ctx, dl_from_array(ctx, DL_SHAPE(2), NULL));
    NULL_WITH_MSG(ctx, dl_from_array(NULL, DL_SHAPE(2), v));
    NULL_WITH_MSG(ctx, dl_from_int64(ctx, DL_SHAPE(2), NULL));
    NULL_WITH_MSG(ctx, dl_from_int32(ctx, DL_SHAPE(-2), NULL));
    NULL_WITH_MSG(ctx, dl_module_new(NULL, "M", NULL, 0));
    NULL_WITH_MSG(ctx, dl_nn_linear(NULL, 2, 3, true));
    NULL_WITH_MSG(ctx, dl_nn_linear(ctx, 0, 3, true));
    NULL_WITH_MSG(ctx, dl_nn_conv(ctx, 4, 1, 1, k, &cd, true, false));
    NULL_WITH_MSG(ctx, dl_nn_conv(NULL, 2, 1, 1, k, &cd, true, false));
    NULL_WITH_MSG(ctx, dl_nn_conv2d(ctx, 3, 4, 0, NULL, true));
    NULL_WITH_MSG(ctx, dl_nn_max_pool2d(ctx, NULL));
    NULL_WITH_MSG(ctx, dl_nn_max_pool2d(NULL, NULL));
    NULL_WITH_MSG(ctx, dl_nn_batch_norm2d(ctx, 0));
    NULL_WITH_MSG(ctx, dl_nn_batch_norm1d(NULL, 3));
    NULL_WITH_MSG(ctx, dl_nn_layer_norm(ctx, DL_SHAPE(0)));
    NULL_WITH_MSG(ctx, dl_nn_dropout(ctx, 2.0f));
    NULL_WITH_MSG(ctx, dl_nn_sequential(ctx, -1, NULL));
    NULL_WITH_MSG(ctx, dl_sgd_params(NULL, 1, ts, NULL));
    NULL_WITH_MSG(ctx, dl_adam_params(ctx, 0, ts, NULL));
    NULL_WITH_MSG(ctx, dl_adam_groups(ctx, 0, NULL, NULL));
    NULL_WITH_MSG(ctx, dl_sgd_groups(NULL, 0, NULL, NULL));
    NULL_WITH_MSG(ctx, dl_adamw_groups(NULL, 0, NULL, NULL));
    NULL_WITH_MSG(ctx, dl_loader_new(NULL, NULL, NULL));
    NULL_WITH_MSG(ctx, dl_tensor_dataset(ctx, a, a, NULL, false));
    NULL_WITH_MSG(ctx, dl_function_apply(NULL, 1, ts, NULL));
    memset(&bad, 0, sizeof bad);
    bad.num_threads = -3;
    NULL_WITH_MSG(ctx, dl_ctx_init(&bad));
    CHECK(strstr(dl_error_message(NULL), "num_threads=-3 must be between 0"), "bad thread count: %s",
          dl_error_message(NULL));
    bad.num_threads = 100000;
    NULL_WITH_MSG(ctx, dl_ctx_init(&bad));
    dl_clear_error(NULL);
    dl_ctx_free(ctx);
}

/* 9. a huge convolution is an error, never a wrapped size */
static void test_huge_conv(void)
{
    dl_ctx *ctx = new_ctx();
    dl__cgeom g;
    int64_t nb, nfl;
    memset(&g, 0, sizeof g);
    g.N = 1; g.Ca = (int64_t)1 << 31; g.K = (int64_t)1 << 31; g.Cb = 1; g.Lb = (int64_t)1 << 10;
    CHECK(!dl__conv_plan("test", ctx, &g, &nb, &nfl), "a scratch of 2^72 floats was planned");
    EXPECT_ERR(ctx, DL_ERR_OOM, "size overflow");
    {
        dl_tensor *x = dl_ones(ctx, DL_SHAPE(1, 64, 1, 1)), *w = dl_ones(ctx, DL_SHAPE(1, 64, 64, 64));
        dl_conv_desc d = dl_conv_desc_make(1, 2000000, 1, 1);
        CHECK(dl_conv2d(x, w, NULL, &d) == NULL, "a conv with a 64 TB scratch succeeded");
        CHECK(dl_last_error(ctx) == DL_ERR_OOM, "huge conv: %s", dl_error_message(ctx));
        dl_clear_error(ctx);
    }
    {   /* module constructors with absurd sizes: the allocation's error, under the constructor's name */
        dl_conv_desc cd = dl_conv_desc_make(1, 0, 1, 1);
        int64_t huge = (int64_t)1 << 62;
        CHECK(dl_nn_linear(ctx, huge, 3, true) == NULL, "a Linear of 2^62 x 3 weights");
        EXPECT_ERR(ctx, DL_ERR_OOM, "dl_nn_linear: dl_empty: shape (3,4611686018427387904) has too many elements");
        CHECK(dl_nn_conv2d(ctx, 2, 3, huge, &cd, true) == NULL, "a conv2d of kernel 2^62");
        EXPECT_ERR(ctx, DL_ERR_OOM, "dl_nn_conv2d: dl_empty: shape (3,2,4611686018427387904,4611686018427387904)");
        CHECK(dl_nn_batch_norm2d(ctx, huge) == NULL, "a BatchNorm2d of 2^62 channels");
        EXPECT_ERR(ctx, DL_ERR_OOM, "dl_nn_batch_norm2d: dl_ones: shape (4611686018427387904)");
        CHECK(dl_nn_linear(ctx, 0, 3, true) == NULL &&   /* its own message: named once */
                  strncmp(dl_error_message(ctx), "dl_nn_linear: in_features=0", 27) == 0,
              "a Linear of 0 inputs: %s", dl_error_message(ctx));
        dl_clear_error(ctx);
    }
    {   /* empty operands whose broadcast sizes multiply past int64 (2^40 x 2^40): the result's error,
           no wrapped product on the way (UBSan: make sanitize) */
        int64_t big = (int64_t)1 << 40;
        dl_tensor *a = dl_zeros(ctx, DL_SHAPE(big, 1, 0)), *b = dl_zeros(ctx, DL_SHAPE(1, big, 0));
        CHECK(a && b && dl_add(a, b) == NULL && dl_maximum(a, b) == NULL, "a broadcast past int64 succeeded");
        EXPECT_ERR(ctx, DL_ERR_OOM, "size overflow");
    }
    dl_ctx_free(ctx);
}

/* 10. the error message's lifetime: kept through later successes, until cleared */
static void test_error_lifetime(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *a = dl_ones(ctx, DL_SHAPE(2)), *b = dl_ones(ctx, DL_SHAPE(3));
    CHECK(dl_add(a, b) == NULL && dl_last_error(ctx) == DL_ERR_SHAPE, "shape error");
    CHECK(dl_add(a, a) != NULL, "a later success");
    CHECK(dl_last_error(ctx) == DL_ERR_SHAPE && strstr(dl_error_message(ctx), "dl_add"),
          "the message survives a success (documented)");
    dl_clear_error(ctx);
    CHECK(dl_last_error(ctx) == DL_OK && dl_error_message(ctx)[0] == 0, "cleared");
    dl_ctx_free(ctx);
}

/* 12. gzip bomb: a small .gz that inflates to far more than its header says */
static void test_gzip_bomb(void)
{
#ifdef DL_ZLIB
    dl_ctx *ctx = new_ctx();
    dl_tensor *t;
    const char *path = tmp("bomb-idx1-ubyte.gz");
    gzFile gz = gzopen(path, "wb9");
    unsigned char hdr[8] = {0, 0, 0x08, 1, 0, 0, 0, 10}, *zero = (unsigned char *)calloc(1, 1 << 20);
    int i;
    gzwrite(gz, hdr, 8);
    gzwrite(gz, zero, 10);
    for (i = 0; i < 200; i++) gzwrite(gz, zero, 1 << 20);   /* 200 MiB of zeros after 10 declared bytes */
    gzclose(gz);
    free(zero);
    CHECK(dl_idx_load(ctx, path, DL_DTYPE_I64, &t) == DL_ERR_FORMAT, "a bomb loaded");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "declares 18 bytes but the decompressed file has more than 18");
    {   /* the good prefix alone loads */
        unsigned char data[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
        int64_t y[10];
        gz = gzopen(path, "wb");
        gzwrite(gz, hdr, 8);
        gzwrite(gz, data, 10);
        gzclose(gz);
        CHECK(dl_idx_load(ctx, path, DL_DTYPE_I64, &t) == DL_OK && dl_read_int64(t, y, 10) == DL_OK &&
              y[9] == 9, "a good .gz: %s", dl_error_message(ctx));
        gz = gzopen(path, "wb");    /* truncated: fewer bytes than declared */
        gzwrite(gz, hdr, 8);
        gzwrite(gz, data, 5);
        gzclose(gz);
        CHECK(dl_idx_load(ctx, path, DL_DTYPE_I64, &t) == DL_ERR_FORMAT, "short .gz");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "declares 18 bytes but the decompressed file has 13");
        gz = gzopen(path, "ab");    /* the rest as a second gzip member: one file, as gzip -d reads it */
        gzwrite(gz, data + 5, 5);
        gzclose(gz);
        CHECK(dl_idx_load(ctx, path, DL_DTYPE_I64, &t) == DL_OK && dl_read_int64(t, y, 10) == DL_OK &&
              y[9] == 9, "a .gz of two members: %s", dl_error_message(ctx));
        hdr[3] = 0;                 /* no dims: said so (it was "declares 5 bytes but has 4") */
        gz = gzopen(path, "wb");
        gzwrite(gz, hdr, 4);
        gzclose(gz);
        CHECK(dl_idx_load(ctx, path, DL_DTYPE_I64, &t) == DL_ERR_FORMAT, "0 dims");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "bomb-idx1-ubyte.gz' declares 0 dims (1..8 supported)");
    }
    dl_ctx_free(ctx);
#endif
}

/* 13. use after dl_free (DL_DEBUG builds): an error naming the tensor */
static void test_use_after_free(void)
{
#ifdef DL_DEBUG
    dl_ctx *ctx = new_ctx();
    dl_tensor *p = dl_set_name(dl_keep(dl_ones(ctx, DL_SHAPE(3))), "weights");
    dl_free(p);
    CHECK(dl_add(p, p) == NULL, "use after free accepted");
    EXPECT_ERR(ctx, DL_ERR_ARG, "weights was freed by dl_free()");
    dl_free(p);
    EXPECT_ERR(ctx, DL_ERR_ARG, "use after free");
    dl_ctx_free(ctx);

    /* a module's parameter: dl_free refuses it (the module and its
       optimizer read it), everything goes on; a parameter of an optimizer
       alone (dl_param) freed under it: each later use is an error naming it */
    {
        const dl_named_tensor *np;
        dl_module *lin;
        dl_optim *o;
        dl_tensor *x, *loss;
        dl_ctx_desc d;
        memset(&d, 0, sizeof d);
        d.log = dl_log_silent;
        d.cpu_devices = 2;
        ctx = dl_ctx_init(&d);
        lin = dl_nn_linear(ctx, 3, 2, true);
        o = dl_sgd(lin, NULL);
        x = dl_ones(ctx, DL_SHAPE(4, 3));
        loss = dl_sum(dl_module_forward(lin, x), DL_ALL, false);
        CHECK(loss && dl_backward(loss) == DL_OK && dl_optim_step(o) == DL_OK, "set-up: %s", dl_error_message(ctx));
        dl_step_end(ctx);
        CHECK(dl_module_named_parameters(lin, &np) == 2, "two parameters");
        dl_free(np[0].t);   /* weight */
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_free: t (2,3) is weight of a Linear module");
        CHECK(dl_module_to(lin, dl_cpu_device(1)) == DL_OK && np[1].t->device.index == 1, "dl_module_to: %s",
              dl_error_message(ctx));
        x = dl_ones(ctx, DL_SHAPE(4, 3));
        loss = dl_sum(dl_module_forward(lin, dl_to(x, dl_cpu_device(1))), DL_ALL, false);
        dl_optim_zero_grad(o);
        CHECK(loss && dl_backward(loss) == DL_OK && dl_optim_step(o) == DL_OK, "a step after the refused free: %s",
              dl_error_message(ctx));
        dl_step_end(ctx);
        {
            dl_tensor *p = dl_param(dl_ones(ctx, DL_SHAPE(3)));
            dl_optim *o2 = dl_sgd_params(ctx, 1, &p, NULL);
            CHECK(p && o2, "a standalone parameter's optimizer: %s", dl_error_message(ctx));
            dl_free(p);
            dl_optim_zero_grad(o2);
            CHECK(dl_optim_step(o2) != DL_OK, "an optimizer step with a freed parameter");
            EXPECT_ERR(ctx, DL_ERR_ARG, "was freed by dl_free()");
        }
        dl_ctx_free(ctx);
    }
#endif
}

/* 15. thread counts: clamped to the cores, absurd values refused */
static void test_threads_clamped(void)
{
    dl_ctx *ctx = new_ctx();
#ifdef DL_NO_THREADS
    long cores = 1;   /* (a single-threaded build has one core to give) */
#else
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
#endif
    CHECK(dl_set_num_threads(ctx, 100000) == DL_ERR_ARG, "100000 threads accepted");
    EXPECT_ERR(ctx, DL_ERR_ARG, "num_threads=100000 must be between 0");
    CHECK(dl_set_num_threads(ctx, -3) == DL_ERR_ARG, "-3 threads accepted");
    dl_clear_error(ctx);
    CHECK(dl_set_num_threads(ctx, 1000) == DL_OK && dl_num_threads(ctx) == (cores > 1024 ? 1024 : cores),
          "1000 threads not clamped to %ld cores: %d", cores, dl_num_threads(ctx));
    CHECK(dl_set_num_threads(ctx, 0) == DL_OK && dl_num_threads(ctx) == cores, "0: all cores");
    dl_ctx_free(ctx);
}

/* 13. dl_graph_dot escapes names: a quote, a backslash or a line break in a
   tensor's or a custom function's name cannot end the label or add a
   statement (every label stays one DOT string; graphviz reads the file
   when it is installed) */
static dl_tensor *id_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)fc; (void)n; (void)user;
    return dl_mul_scalar(in[0], 1.0f);
}
static dl_result id_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)fc; (void)user;
    gin[0] = g;
    return DL_OK;
}

/* the DOT text outside its "..." strings (escapes honoured); NULL when a
   string is left open at the end of a line */
static char *dot_outside(const char *s)
{
    char *o = (char *)malloc(strlen(s) + 1), *p = o;
    int in = 0;
    for (; *s; s++) {
        if (in) {
            if (*s == '\\' && s[1] && s[1] != '\n') s++;
            else if (*s == '"') in = 0;
            else if (*s == '\n') { free(o); return NULL; }
        } else if (*s == '"') {
            in = 1;
        } else {
            *p++ = *s;
        }
    }
    *p = 0;
    if (in) { free(o); return NULL; }
    return o;
}

static void test_dot_names(void)
{
    dl_ctx *ctx = new_ctx();
    dl_function evil;
    const char *path = tmp("hostile.dot");
    dl_tensor *w, *x, *mm, *loss;
    char buf[8192], *out;
    size_t n;
    int semis = 0, nodes = 0;
    FILE *f;
    const char *c;
    memset(&evil, 0, sizeof evil);
    evil.name = "f\"]; injected_op -> n0; n1 [label=\"\\";
    evil.forward = id_fwd;
    evil.backward = id_bwd;
    w = dl_set_name(dl_requires_grad(dl_randn(ctx, DL_SHAPE(3, 2)), true), "w\"];injected_w->x;//");
    x = dl_set_name(dl_randn(ctx, DL_SHAPE(4, 3)), "x\n}\ndigraph injected_x {\\");
    mm = dl_matmul(x, w);
    loss = dl_sum(dl_function_apply(&evil, 1, &mm, NULL), DL_ALL, false);
    dl_set_name(loss, "bad\xff\xfe utf8 \xc3\xa9 \x01");
    CHECK(loss && dl_graph_dot(loss, path) == DL_OK, "dot written: %s", dl_error_message(ctx));
    f = fopen(path, "r");
    n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
    out = dot_outside(buf);
    CHECK(out != NULL, "every label is one closed string on its line:\n%s", buf);
    CHECK(out && !strstr(out, "injected"), "a name reached the DOT statements:\n%s", buf);
    for (c = out ? out : ""; *c; c++) semis += *c == ';';
    for (c = buf; (c = strstr(c, "[shape=")) != NULL; c++) nodes++;
    /* 3 ops (matmul, the function, sum) and 5 tensors (x, w, the two op
       outputs inside, loss): 8 nodes; 3 op -> output and 4 input -> op
       edges; 2 statements in the header */
    CHECK(nodes == 8 && semis == 2 + 8 + 7, "statements: %d nodes, %d ';'s:\n%s", nodes, semis, buf);
    CHECK(strstr(buf, "label=\"w\\\"];injected_w->x;//\\n(3,2)") != NULL, "w's name escaped:\n%s", buf);
    CHECK(strstr(buf, "label=\"x\\n}\\ndigraph injected_x {\\\\\\n(4,3)") != NULL, "x's name escaped");
    CHECK(strstr(buf, "label=\"f\\\"]; injected_op -> n0; n1 [label=\\\"\\\\\"") != NULL, "the function's name escaped");
    CHECK(strstr(buf, "label=\"bad?? utf8 \xc3\xa9 ?\\n()") != NULL, "bytes that are not UTF-8 and control bytes as '?'");
    free(out);
    if (system("command -v dot >/dev/null 2>&1") == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "dot -Tsvg '%s' -o '%s.svg' 2>&1", path, path);
        fflush(stdout);
        CHECK(system(cmd) == 0, "graphviz reads %s", path);
    } else {
        SKIP("graphviz's dot not installed: the DOT file was checked here only");
    }
    dl_ctx_free(ctx);
}

/* 14. a custom function's backward results are checked as PyTorch checks
   them: an int gradient is cast to float32 by value (it was read as float
   bits), a gradient on another device than its input is refused naming
   both (it crashed in the strict device's axpy), and a backward that fails
   says which function failed, also when it set no message or when an op in
   it failed and it returned DL_OK */
static int g_mode;
static dl_tensor *scale_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)fc; (void)n; (void)user;
    return dl_mul_scalar(in[0], 2.0f);
}
static dl_result mode_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    static const int64_t i64[3] = {1, 2, -3};
    static const int32_t i32[3] = {4, -5, 6};
    dl_ctx *ctx = dl_tensor_ctx(g);
    dl_device other = dl_ctx_device(ctx).index == 1 ? dl_cpu() : dl_cpu_device(1);
    (void)fc; (void)user;
    switch (g_mode) {
    case 0: gin[0] = dl_from_int64(ctx, DL_SHAPE(3), i64); break;
    case 1: gin[0] = dl_from_int32(ctx, DL_SHAPE(3), i32); break;
    case 2: gin[0] = dl_to(dl_mul_scalar(g, 2.0f), other); break;
    case 3: return DL_ERR_ARG;                                  /* no message */
    case 4: gin[0] = dl_add(g, dl_ones(ctx, DL_SHAPE(2))); break; /* fails, returns DL_OK */
    case 5: gin[0] = dl_expand(dl_mul_scalar(g, 2.0f), DL_SHAPE(2, 3)); break;   /* broadcast: summed */
    case 6: gin[0] = dl_ones(ctx, DL_SHAPE(4)); break;                          /* no broadcast */
    }
    return DL_OK;
}

static void test_custom_grad_checks(void)
{
    dl_ctx_desc d;
    dl_ctx *ctx;
    dl_function fn = {"my_fn", scale_fwd, mode_bwd};
    static const float xv[3] = {1, 2, 3};
    float gv[3];
    char want[160];
    dl_tensor *x, *h;
    dl_device here, other;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.cpu_devices = 2;
    d.strict_devices = true;
    ctx = dl_ctx_init(&d);
    here = dl_ctx_device(ctx);
    other = here.index == 1 ? dl_cpu() : dl_cpu_device(1);
    x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), xv), true);
    /* int64 and int32 gradients: cast to float32 by value */
    g_mode = 0;
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &x, NULL), DL_ALL, false)) == DL_OK,
          "int64 gradient: %s", dl_error_message(ctx));
    CHECK(x->grad && x->grad->dtype == DL_DTYPE_F32 && dl_read(x->grad, gv, 3) == DL_OK && gv[0] == 1.0f &&
          gv[1] == 2.0f && gv[2] == -3.0f, "int64 gradient cast by value: %g %g %g", (double)gv[0],
          (double)gv[1], (double)gv[2]);
    g_mode = 1;
    h = dl_mul_scalar(x, 1.0f);           /* through an op: the cast gradient flows on */
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &h, NULL), DL_ALL, false)) == DL_OK,
          "int32 gradient: %s", dl_error_message(ctx));
    CHECK(dl_read(x->grad, gv, 3) == DL_OK && gv[0] == 5.0f && gv[1] == -3.0f && gv[2] == 3.0f,
          "int32 gradient accumulated: %g %g %g", (double)gv[0], (double)gv[1], (double)gv[2]);
    /* a gradient on another device: refused, naming both (leaf and op input) */
    g_mode = 2;
    snprintf(want, sizeof want, "in the backward of my_fn: dl_backward: the gradient for input 0 (3) is on %s but "
             "the input is on %s", dl_device_name(other), dl_device_name(here));
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &x, NULL), DL_ALL, false)) == DL_ERR_DEVICE,
          "gradient on another device refused");
    EXPECT_ERR(ctx, DL_ERR_DEVICE, want);
    h = dl_mul_scalar(x, 1.0f);
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &h, NULL), DL_ALL, false)) == DL_ERR_DEVICE,
          "gradient on another device refused for an op's output");
    EXPECT_ERR(ctx, DL_ERR_DEVICE, want);
    CHECK(dl_read(x->grad, gv, 3) == DL_OK && gv[0] == 5.0f, "the leaf's gradient untouched");
    /* a backward that fails without a message, and one whose op failed */
    g_mode = 3;
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &x, NULL), DL_ALL, false)) == DL_ERR_ARG,
          "a failing backward fails dl_backward");
    EXPECT_ERR(ctx, DL_ERR_ARG, "in the backward of my_fn: dl_backward: the backward returned DL_ERR_ARG "
               "without setting an error message");
    g_mode = 4;
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &x, NULL), DL_ALL, false)) == DL_ERR_SHAPE,
          "an op failing inside the backward fails dl_backward");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "in the backward of my_fn: dl_add: a (3) and b (2) do not broadcast");
    CHECK(dl_read(x->grad, gv, 3) == DL_OK && gv[0] == 5.0f, "the leaf's gradient still untouched");
    /* a gradient of a shape the input broadcasts to is summed down, as PyTorch's autograd
       does ((g*2).expand(2, 3) for a (3) input: 4 each); another shape is refused */
    g_mode = 5;
    dl_zero_grad(x);
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &x, NULL), DL_ALL, false)) == DL_OK &&
          dl_read(x->grad, gv, 3) == DL_OK && gv[0] == 4.0f && gv[1] == 4.0f && gv[2] == 4.0f,
          "a broadcast gradient summed to the input's shape: %s", dl_error_message(ctx));
    g_mode = 6;
    CHECK(dl_backward(dl_sum(dl_function_apply(&fn, 1, &x, NULL), DL_ALL, false)) == DL_ERR_SHAPE,
          "a gradient of another shape refused");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "the gradient for input 0 has shape (4) but the input has shape (3) (nor "
               "does the input's broadcast to it)");
    dl_ctx_free(ctx);
}

/* 15. checkpoints of deeply nested models: names of any length save and
   load (model and optimizer state; they were cut at 191 bytes when written
   and read, so dl_load found keys twice and safetensors' loader refused the
   file); a tree deeper than the walks go is refused, not listed in part */
static const float WV8[8] = {1, -2, 3, .5f, -1, 2, .25f, 4};

static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ca = 0, cb = 0;
    bool same = fa && fb;
    while (same && (ca = fgetc(fa)) == (cb = fgetc(fb)) && ca != EOF) {}
    same = same && ca == cb;
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static dl_module *deep_model(dl_ctx *ctx, int depth, char *longest, size_t cap)
{
    dl_module *root = dl_nn_sequential(ctx, 0, NULL), *cur = root, *c;
    char name[80];
    size_t len = 0;
    int i;
    for (i = 0; i < depth && i < 1000; i++) {
        /* 63 characters, the longest a child name may be, unique per level */
        snprintf(name, sizeof name, "level_%03d_a_long_child_name_as_a_generated_model_might_have_xyz", i);
        c = dl_module_add(cur, name, dl_nn_sequential(ctx, 0, NULL));
        if (!c) return NULL;
        if (longest && len + 65 < cap) { memcpy(longest + len, name, 63); longest[len + 63] = '.'; len += 64; }
        cur = c;
    }
    if (!dl_module_add(cur, "fc", dl_nn_linear(ctx, 4, 3, true))) return NULL;
    if (longest) snprintf(longest + len, cap - len, "fc.weight");
    return root;
}

static void test_deep_checkpoint(void)
{
    dl_ctx *ctx = new_ctx();
    const char *p1 = tmp("deep1.safetensors"), *p2 = tmp("deep2.safetensors"), *pm = tmp("deep_m.safetensors");
    char longest[4096], cmd[8192];
    dl_module *m = deep_model(ctx, 40, longest, sizeof longest), *m2 = deep_model(ctx, 40, NULL, 0), *big;
    dl_adam_desc ad;
    dl_optim *o, *o2;
    dl_tensor *x = dl_from_array(ctx, DL_SHAPE(2, 4), WV8), *w, *w2;
    const dl_named_tensor *sd;
    int n;
    memset(&ad, 0, sizeof ad);
    CHECK(m && m2, "40-deep models built: %s", dl_error_message(ctx));
    if (!m || !m2) { dl_ctx_free(ctx); return; }
    o = dl_adam(m, &ad);
    o2 = dl_adam(m2, &ad);
    n = dl_module_state_dict(m, &sd);
    CHECK(n == 2 && strcmp(sd[0].name, longest) == 0 && strlen(longest) == 40 * 64 + 9,
          "state_dict names of %d bytes: %d entries", (int)strlen(longest), n);
    /* a step, so that Adam has state under the long names */
    CHECK(dl_backward(dl_sum(dl_module_forward(m, x), DL_ALL, false)) == DL_OK && dl_optim_step(o) == DL_OK,
          "a step: %s", dl_error_message(ctx));
    CHECK(dl_save(p1, m, o) == DL_OK, "save: %s", dl_error_message(ctx));
    CHECK(dl_save_module(pm, m) == DL_OK, "save_module: %s", dl_error_message(ctx));
    /* into a fresh model and optimizer: saved again, the same bytes */
    CHECK(dl_load(p1, m2, o2) == DL_OK, "load: %s", dl_error_message(ctx));
    CHECK(dl_save(p2, m2, o2) == DL_OK, "save again: %s", dl_error_message(ctx));
    CHECK(same_file(p1, p2), "the loaded model and optimizer save the same file");
    w = dl_module_get(m, longest);
    w2 = dl_module_get(m2, longest);
    dl_no_grad_begin(ctx);
    dl_fill_(w2, 0.0f);
    dl_no_grad_end(ctx);
    CHECK(dl_load_module(pm, m2) == DL_OK, "load_module: %s", dl_error_message(ctx));
    CHECK(w && w2 && th_same_bytes(w, w2), "the weight under the longest name loaded");
    /* safetensors' own reader, when Python has it: every key whole */
    if (system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0) {
        /* 9 keys: weight, bias, optim.step, and per parameter step, exp_avg,
           exp_avg_sq; the longest optim.<weight's name>.exp_avg_sq */
        snprintf(cmd, sizeof cmd, "python3 -c \"import sys; from safetensors.numpy import load_file; "
                 "d = load_file(sys.argv[1]); ks = list(d); "
                 "sys.exit(0 if len(ks) == 9 and max(map(len, ks)) == %d and d[sys.argv[2]].shape == (3, 4) else 1)\" "
                 "'%s' '%s'", (int)(strlen(longest) + strlen("optim..exp_avg_sq")), p1, longest);
        fflush(stdout);
        CHECK(system(cmd) == 0, "safetensors.numpy.load_file reads %s with its %d-byte names", p1, (int)strlen(longest));
    } else {
        SKIP("python3 with safetensors and numpy not available: the file was checked here only");
    }
    /* a tree deeper than 256 modules: refused with a message, no file written */
    big = deep_model(ctx, 300, NULL, 0);
    CHECK(big != NULL, "a 300-deep chain builds: %s", dl_error_message(ctx));
    CHECK(dl_module_state_dict(big, &sd) == -1, "its state_dict is refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "state_dict: Sequential: the module tree is more than 256 modules deep");
    remove(tmp("deep3.safetensors"));
    CHECK(dl_save_module(tmp("deep3.safetensors"), big) != DL_OK, "its save is refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_save_module: build/hardening_tmp/deep3.safetensors: state_dict: Sequential: "
               "the module tree is more than 256 modules deep");
    CHECK(access(tmp("deep3.safetensors"), F_OK) != 0, "and nothing written");
    dl_module_train(big, false);
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_module_train: Sequential: the module tree is more than 256 modules deep");
    /* a name that is not UTF-8: refused at save (safetensors' JSON header), nothing written */
    {
        dl_module *odd = dl_nn_sequential(ctx, 0, NULL);
        dl_module_add(odd, "caf\xe9", dl_nn_linear(ctx, 2, 2, true));
        CHECK(dl_save_module(tmp("deep3.safetensors"), odd) == DL_ERR_ARG, "a name that is not UTF-8 refused");
        EXPECT_ERR(ctx, DL_ERR_ARG, "the name 'caf\xe9.weight' is not valid UTF-8 (byte 0xe9 at offset 3); nothing was written");
        CHECK(access(tmp("deep3.safetensors"), F_OK) != 0, "and nothing written");
    }
    dl_ctx_free(ctx);
}

/* 16. what a second hostile review found (2026-11-28); each case failed
   before its fix */
static dl_tensor *save9_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    int i;
    (void)n; (void)user;
    for (i = 0; i < 9; i++) dl_fn_save(fc, in[0]);   /* at most 8 */
    return dl_mul(in[0], in[0]);
}
static dl_result save9_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)user;
    gin[0] = dl_mul_scalar(dl_mul(g, dl_fn_saved(fc, 0)), 2.0f);
    return DL_OK;
}

/* a dl_function of these parts */
static dl_function fn_of(const char *name, dl_tensor *(*fwd)(dl_fn_ctx *, int, dl_tensor *const *, void *),
                         dl_result (*bwd)(dl_fn_ctx *, dl_tensor *, dl_tensor **, void *))
{
    dl_function f;
    f.name = name;
    f.forward = fwd;
    f.backward = bwd;
    return f;
}

static bool read_is(dl_tensor *t, const float *want, int n)
{
    float got[64];
    int i;
    if (!t || n > 64 || t->numel != n || dl_read(t, got, n) != DL_OK) return false;
    for (i = 0; i < n; i++)
        if (want[i] != want[i] ? got[i] == got[i] : got[i] != want[i]) return false;
    return true;
}

/* a context with cpu:0 and cpu:1 (memory_limit 0: none) */
static dl_ctx *two_cpu_ctx(size_t memory_limit)
{
    dl_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.log = dl_log_silent;
    cd.cpu_devices = 2;
    cd.memory_limit = memory_limit;
    return dl_ctx_init(&cd);
}

static void test_review2_autograd(void)
{
    dl_ctx *ctx = two_cpu_ctx(0), *ctx2 = new_ctx();
    dl_backward_desc bd;
    {   /* dl_copy_ from a src that requires grad: refused in grad mode (the
           copy is not on the tape: the gradient through dst was lost) */
        dl_tensor *x = dl_param(dl_full(ctx, DL_SHAPE(3), 2.0f)), *d = dl_zeros(ctx, DL_SHAPE(3));
        CHECK(dl_copy_(d, x) == DL_ERR_GRAPH, "dl_copy_ of a src that requires grad, in grad mode");
        EXPECT_ERR(ctx, DL_ERR_GRAPH, "dl_copy_: src (3) requires grad");
        CHECK(dl_copy_(d, dl_detach(x)) == DL_OK, "a detached src: %s", dl_error_message(ctx));
        dl_no_grad_begin(ctx);
        CHECK(dl_copy_(d, x) == DL_OK, "under no_grad: %s", dl_error_message(ctx));
        dl_no_grad_end(ctx);
    }
    {   /* max_dim's indices are the caller's: writing them does not move the gradient */
        float xv[6] = {1, 5, 2, 7, 3, 4}, want[6] = {0, 1, 0, 1, 0, 0};
        int64_t zero[2] = {0, 0};
        dl_tensor *x = dl_param(dl_from_array(ctx, DL_SHAPE(2, 3), xv)), *idx = NULL;
        dl_tensor *m = dl_max_dim(x, 1, false, &idx);
        CHECK(m && idx && dl_copy_(idx, dl_from_int64(ctx, DL_SHAPE(2), zero)) == DL_OK, "write the indices: %s",
              dl_error_message(ctx));
        CHECK(dl_backward(dl_sum(m, DL_ALL, false)) == DL_OK && read_is(x->grad, want, 6),
              "max_dim's gradient after its indices were overwritten: %s", dl_error_message(ctx));
    }
    {   /* a view of a leaf that requires grad, made under no_grad: not
           writable in grad mode (torch refuses it too); a detached one is */
        dl_tensor *x = dl_param(dl_ones(ctx, DL_SHAPE(2, 3))), *v;
        dl_no_grad_begin(ctx);
        v = dl_reshape(x, DL_SHAPE(6));
        dl_no_grad_end(ctx);
        CHECK(dl_fill_(v, 0.0f) == DL_ERR_GRAPH, "a no_grad view of a parameter written in grad mode");
        EXPECT_ERR(ctx, DL_ERR_GRAPH, "made under no_grad, of a leaf (2,3) that requires grad");
        CHECK(dl_fill_(dl_reshape(dl_detach(x), DL_SHAPE(6)), 1.0f) == DL_OK, "a view of a detach: %s",
              dl_error_message(ctx));
        dl_no_grad_begin(ctx);
        CHECK(dl_fill_(v, 1.0f) == DL_OK, "the view under no_grad: %s", dl_error_message(ctx));
        dl_no_grad_end(ctx);
    }
    {   /* the seed of dl_backward_ex: dtype, context and device, for a leaf and an op's output */
        int64_t iv[3] = {5, 6, 7};
        dl_tensor *x = dl_param(dl_ones(ctx, DL_SHAPE(3))), *outs[2];
        int k;
        outs[0] = x;
        outs[1] = dl_mul(x, x);
        for (k = 0; k < 2; k++) {
            memset(&bd, 0, sizeof bd);
            bd.retain_graph = true;
            bd.grad = dl_from_int64(ctx, DL_SHAPE(3), iv);
            CHECK(dl_backward_ex(outs[k], &bd) == DL_ERR_DTYPE, "%d: an int64 seed", k);
            EXPECT_ERR(ctx, DL_ERR_DTYPE, "grad (3) is int64");
            bd.grad = dl_ones(ctx2, DL_SHAPE(3));
            CHECK(dl_backward_ex(outs[k], &bd) == DL_ERR_ARG, "%d: a seed of another context", k);
            EXPECT_ERR(ctx, DL_ERR_ARG, "belongs to another context");
            {   /* (make test runs it with cpu:1 the default device too, test-cuda-emu with cuda:0) */
                int other = x->device.type == DL_DEVICE_CPU && x->device.index == 1 ? 0 : 1;
                char want[64];
                snprintf(want, sizeof want, "is on cpu:%d but out (3) is on %s", other, dl_device_name(x->device));
                bd.grad = dl_to(dl_ones(ctx, DL_SHAPE(3)), dl_cpu_device(other));
                CHECK(bd.grad && dl_backward_ex(outs[k], &bd) == DL_ERR_DEVICE, "%d: a seed on cpu:%d", k, other);
                EXPECT_ERR(ctx, DL_ERR_DEVICE, want);
            }
            CHECK(x->grad == NULL, "%d: a refused seed left a gradient", k);
        }
    }
    {   /* a custom function's 9th dl_fn_save fails the apply, naming the function */
        dl_function f = fn_of("save9", save9_fwd, save9_bwd);
        dl_tensor *x = dl_param(dl_full(ctx, DL_SHAPE(3), 3.0f));
        CHECK(dl_function_apply(&f, 1, &x, NULL) == NULL, "9 saved tensors gave a result");
        EXPECT_ERR(ctx, DL_ERR_ARG, "save9: its forward returned a tensor after an error: dl_fn_save: at most 8");
    }
    dl_step_end(ctx);
    {   /* a graph through a capture's tensor in a later step: an error (its
           part of the tape is gone), not a gradient silently left out */
        dl_tensor *w = dl_param(dl_full(ctx, DL_SHAPE(3), 2.0f)), *x = dl_keep(dl_ones(ctx, DL_SHAPE(3))), *h;
        dl_capture *cap;
        CHECK(dl_backward(dl_sum(dl_mul(w, x), DL_ALL, false)) == DL_OK, "warm-up: %s", dl_error_message(ctx));
        dl_step_end(ctx);
        cap = dl_capture_begin(ctx);
        h = dl_mul(w, x);
        CHECK(cap && h && dl_capture_end(cap) == DL_OK, "capture: %s", dl_error_message(ctx));
        dl_step_end(ctx);
        CHECK(dl_backward(dl_sum(dl_mul(h, h), DL_ALL, false)) == DL_ERR_GRAPH, "a backward through a capture's "
              "tensor after dl_step_end");
        EXPECT_ERR(ctx, DL_ERR_GRAPH, "was made inside a capture");
        dl_step_end(ctx);
        dl_capture_free(cap);
        dl_free(x);
        dl_free(w);
    }
    dl_ctx_free(ctx2);
    dl_ctx_free(ctx);
}

static void test_review2_values(void)
{
    dl_ctx *ctx = new_ctx();
    {   /* smooth L1 and Huber where t*t overflows: PyTorch's finite or inf loss, not NaN */
        float av[3] = {3e19f, INFINITY, 1e5f}, zv[3] = {0, 0, 0}, want[3] = {3e19f - 0.5f, INFINITY, 1e5f - 0.5f};
        float g[3], wg[3] = {1.0f / 3, 1.0f / 3, 1.0f / 3};
        dl_loss_desc d;
        dl_tensor *a = dl_param(dl_from_array(ctx, DL_SHAPE(3), av)), *z = dl_from_array(ctx, DL_SHAPE(3), zv);
        memset(&d, 0, sizeof d);
        d.reduction = DL_REDUCTION_NONE;
        CHECK(read_is(dl_smooth_l1_loss(a, z, &d), want, 3), "smooth_l1 of 3e19, inf, 1e5");
        CHECK(read_is(dl_huber_loss(a, z, &d), want, 3), "huber of 3e19, inf, 1e5");
        d.beta = 1e-30f;
        want[2] = 1e5f;
        CHECK(read_is(dl_smooth_l1_loss(a, z, &d), want, 3), "smooth_l1 with beta 1e-30");
        d.reduction = DL_REDUCTION_MEAN;
        d.beta = 0.0f;
        CHECK(dl_backward(dl_smooth_l1_loss(a, z, &d)) == DL_OK && a->grad && dl_read(a->grad, g, 3) == DL_OK &&
              th_close(g, wg, 3, 1e-6, 0, NULL), "smooth_l1's gradient there: %g %g %g", (double)g[0],
              (double)g[1], (double)g[2]);
    }
    {   /* cross entropy with every target ignored: loss NaN (0/0) and gradient 0, as PyTorch's */
        float xv[6] = {0.5f, -1, 2, 0.1f, 3, 0.2f}, zeros[6] = {0, 0, 0, 0, 0, 0}, nan1[1] = {NAN};
        int64_t tv[2] = {-100, -100};
        dl_tensor *x = dl_param(dl_from_array(ctx, DL_SHAPE(2, 3), xv)), *l;
        l = dl_cross_entropy(x, dl_from_int64(ctx, DL_SHAPE(2), tv), NULL);
        CHECK(read_is(l, nan1, 1), "the loss of all-ignored targets is not NaN");
        CHECK(dl_backward(l) == DL_OK && read_is(x->grad, zeros, 6), "the gradient of all-ignored targets is not 0");
    }
    {   /* a NaN norm in dl_clip_grad_norm makes every gradient NaN (torch's clamp) */
        float nv[2] = {NAN, 300}, bv[2] = {400, 500}, nans[2] = {NAN, NAN};
        dl_module *m = dl_module_new(ctx, "M", NULL, 0);
        dl_tensor *a = dl_module_param(m, "a", dl_ones(ctx, DL_SHAPE(2)));
        dl_tensor *b = dl_module_param(m, "b", dl_ones(ctx, DL_SHAPE(2)));
        dl_tensor *l = dl_add(dl_sum(dl_mul(a, dl_from_array(ctx, DL_SHAPE(2), nv)), DL_ALL, false),
                              dl_sum(dl_mul(b, dl_from_array(ctx, DL_SHAPE(2), bv)), DL_ALL, false));
        float total;
        CHECK(dl_backward(l) == DL_OK, "backward: %s", dl_error_message(ctx));
        total = dl_clip_grad_norm(m, 1.0f);
        CHECK(total != total && read_is(a->grad, nans, 2) && read_is(b->grad, nans, 2),
              "clip with a NaN norm (%g) left finite gradients", (double)total);
    }
    {   /* dl_arange counts in double, as torch.arange */
        dl_tensor *r = dl_arange(ctx, 0, 0.3, 0.1);
        CHECK(r && r->numel == 3, "arange(0, 0.3, 0.1) has %lld elements", r ? (long long)r->numel : -1LL);
    }
    {   /* dl_stack's dim: the range of the result's dims, checked once under its name */
        dl_tensor *ab[2];
        ab[0] = dl_zeros(ctx, DL_SHAPE(2, 3));
        ab[1] = dl_ones(ctx, DL_SHAPE(2, 3));
        CHECK(dl_stack(2, ab, -4) == NULL, "stack at dim -4 of (2,3)");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_stack: dim -4 is out of range for inputs (2,3) (valid: -3..2");
        CHECK(dl_stack(2, ab, 3) == NULL, "stack at dim 3 of (2,3)");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_stack: dim 3");
        CHECK(dl_stack(2, ab, -3) && dl_stack(2, ab, -3)->shape[0] == 2 && dl_stack(2, ab, 2)->shape[2] == 2,
              "stack at dims -3 and 2: %s", dl_error_message(ctx));
    }
    {   /* a 0-d tensor: squeeze and transpose take dim 0 or -1 (torch); dl_size says why it is -1 */
        dl_tensor *s0 = dl_full(ctx, dl_shape_make(0, NULL), 3.0f), *r;
        r = dl_squeeze(s0, -1);
        CHECK(r && r->ndim == 0 && dl_item(r) == 3.0f, "squeeze of a 0-d tensor: %s", dl_error_message(ctx));
        r = dl_transpose(s0, 0, -1);
        CHECK(r && r->ndim == 0, "transpose of a 0-d tensor: %s", dl_error_message(ctx));
        CHECK(dl_narrow(s0, 0, 0, 1) == NULL, "narrow of a 0-d tensor");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_narrow: dim 0: the tensor of shape () has no dims");
        CHECK(dl_size(s0, 0) == -1, "dl_size of a 0-d tensor's dim 0");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_size: dim 0");
        CHECK(dl_narrow(dl_zeros(ctx, DL_SHAPE(3)), 0, -10, 1) == NULL, "narrow from -10 of 3");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_narrow: start -10, length 1 do not fit");
        CHECK(dl_size(dl_zeros(ctx, DL_SHAPE(2, 3)), 5) == -1, "dl_size(t, 5) of a (2,3)");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_size: dim 5 is out of range for a tensor of shape (2,3)");
    }
    {   /* binary cross entropy's gradient for the target at p = 0 and 1: -logit(p), +-inf (torch) */
        float pv[2] = {0, 1}, yv[2] = {0.5f, 0.5f}, g[2];
        dl_loss_desc d;
        dl_tensor *y = dl_param(dl_from_array(ctx, DL_SHAPE(2), yv));
        memset(&d, 0, sizeof d);
        d.reduction = DL_REDUCTION_SUM;
        CHECK(dl_backward(dl_binary_cross_entropy(dl_from_array(ctx, DL_SHAPE(2), pv), y, &d)) == DL_OK &&
              y->grad && dl_read(y->grad, g, 2) == DL_OK && g[0] == INFINITY && g[1] == -INFINITY,
              "bce's target gradient at p = 0, 1: %g %g", (double)g[0], (double)g[1]);
    }
    {   /* schedules over a period <= 0: NaN (torch divides by zero), which set_lr refuses */
        CHECK(dl_lr_step(0.1f, 3, 0, 0.5f) != dl_lr_step(0.1f, 3, 0, 0.5f), "StepLR with step_size 0");
        CHECK(dl_lr_cosine(0.1f, 3, -1, 0.0f) != dl_lr_cosine(0.1f, 3, -1, 0.0f), "cosine with t_max -1");
    }
    {   /* a parameter in two groups: refused (torch: a ValueError), naming both */
        dl_tensor *a = dl_param(dl_ones(ctx, DL_SHAPE(2))), *b = dl_param(dl_ones(ctx, DL_SHAPE(3)));
        dl_tensor *g0[2], *g1[1];
        dl_param_group pg[2];
        g0[0] = a; g0[1] = b; g1[0] = a;
        memset(pg, 0, sizeof pg);
        pg[0].params = g0; pg[0].n = 2;
        pg[1].params = g1; pg[1].n = 1; pg[1].lr = 0.5f;
        CHECK(dl_sgd_groups(ctx, 2, pg, NULL) == NULL, "a parameter in two groups");
        EXPECT_ERR(ctx, DL_ERR_ARG, "parameter 0 (2) of group 1 is also in group 0");
        g0[1] = a;   /* group 0 {a, a}: a twice within a group is kept once (torch warns) */
        g1[0] = b;   /* group 1 {b} */
        CHECK(dl_adam_groups(ctx, 2, pg, NULL) != NULL, "two distinct groups: %s", dl_error_message(ctx));
        dl_free(a);
        dl_free(b);
    }
    {   /* avg_pool3d of an input smaller than its kernel: refused, as PyTorch's (the depth
           padding had also been left out of the divisor of such a window on the CPU) */
        dl_pool_desc pd;
        memset(&pd, 0, sizeof pd);
        pd.kernel[0] = 3; pd.kernel[1] = pd.kernel[2] = 2;
        pd.stride[0] = pd.stride[1] = pd.stride[2] = 2;
        pd.padding[0] = 1;
        CHECK(dl_avg_pool3d(dl_ones(ctx, DL_SHAPE(1, 1, 1, 4, 4)), &pd) == NULL, "avg_pool3d, depth 1 < kernel 3");
        EXPECT_ERR(ctx, DL_ERR_SHAPE, "is smaller than the kernel in spatial dim 0 (1 < kernel[0]=3)");
        CHECK(dl_avg_pool3d(dl_ones(ctx, DL_SHAPE(1, 1, 3, 4, 4)), &pd) != NULL, "depth 3: %s", dl_error_message(ctx));
    }
    {   /* max_pool3d of depth 1 whose depth window's taps miss depth 0 (dilation 2, padding 1):
           every window is padding, -inf, and no gradient (the 2-d plane path took depth 0) */
        float xv[16], g[16], want[16], zero[16];
        dl_pool_desc pd;
        dl_backward_desc bd;
        dl_tensor *x, *y;
        int i;
        for (i = 0; i < 16; i++) { xv[i] = (float)i; want[i] = -INFINITY; zero[i] = 0.0f; }
        memset(&pd, 0, sizeof pd);
        pd.kernel[0] = 2; pd.kernel[1] = pd.kernel[2] = 1;
        pd.stride[0] = pd.stride[1] = pd.stride[2] = 1;
        pd.padding[0] = 1;
        pd.dilation[0] = 2;
        x = dl_param(dl_from_array(ctx, DL_SHAPE(1, 1, 1, 4, 4), xv));
        y = dl_max_pool3d(x, &pd);
        CHECK(read_is(y, want, 16), "max_pool3d over padding only: not -inf: %s", dl_error_message(ctx));
        memset(&bd, 0, sizeof bd);
        bd.grad = dl_ones(ctx, DL_SHAPE(1, 1, 1, 4, 4));
        CHECK(y && dl_backward_ex(y, &bd) == DL_OK &&
              x->grad && dl_read(x->grad, g, 16) == DL_OK && memcmp(g, zero, sizeof g) == 0,
              "max_pool3d over padding only: a gradient reached the input (%g)", (double)g[0]);
        dl_free(x);
    }
    {   /* an empty shape whose other sizes overflow: refused (strides would overflow) */
        CHECK(dl_zeros(ctx, DL_SHAPE(0, (int64_t)1 << 62, 4)) == NULL, "zeros (0, 2^62, 4)");
        EXPECT_ERR(ctx, DL_ERR_OOM, "size overflow in its nonzero sizes");
        CHECK(dl_zeros(ctx, DL_SHAPE(0, (int64_t)1 << 40, 4)) != NULL, "zeros (0, 2^40, 4): %s", dl_error_message(ctx));
    }
    dl_ctx_free(ctx);
}

/* a dataset of n samples of shape s whose get writes nothing */
static dl_result empty_get(const dl_dataset *ds, int64_t i, float *x, int64_t *y, uint64_t rng[4])
{
    (void)ds; (void)x; (void)rng;
    *y = i;
    return DL_OK;
}

/* the file's header with its first `from` replaced by `to` (the data unchanged) */
static bool patch_header(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL, len8[8];
    char *h = NULL, *at;
    long n;
    uint64_t hlen = 0, nl;
    int i;
    bool ok = false;
    if (!f) return false;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (unsigned char *)malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        for (i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
        h = (char *)calloc((size_t)hlen + strlen(to) + 1, 1);
        if (h) memcpy(h, buf + 8, (size_t)hlen);
        at = h ? strstr(h, from) : NULL;
        if (at) {
            memmove(at + strlen(to), at + strlen(from), strlen(at + strlen(from)) + 1);
            memcpy(at, to, strlen(to));
            ok = true;
        }
    }
    fclose(f);
    if (ok && (f = fopen(path, "wb"))) {
        nl = strlen(h);
        for (i = 0; i < 8; i++) len8[i] = (unsigned char)(nl >> (8 * i));
        ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h, 1, nl, f) == nl &&
             fwrite(buf + 8 + hlen, 1, (size_t)(n - 8 - (long)hlen), f) == (size_t)(n - 8 - (long)hlen);
        fclose(f);
    }
    free(h);
    free(buf);
    return ok;
}

/* the int64 scalar `name` of a checkpoint set to v in place */
static bool patch_scalar(const char *path, const char *name, int64_t v)
{
    FILE *f = fopen(path, "r+b");
    unsigned char head[8], le[8];
    char *h, key[128];
    const char *at;
    uint64_t hlen = 0, off;
    int i;
    bool ok = false;
    if (!f) return false;
    if (fread(head, 1, 8, f) == 8) {
        for (i = 7; i >= 0; i--) hlen = hlen << 8 | head[i];
        h = (char *)calloc((size_t)hlen + 1, 1);
        if (h && fread(h, 1, (size_t)hlen, f) == hlen) {
            snprintf(key, sizeof key, "\"%s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[", name);
            at = strstr(h, key);
            if (at && sscanf(at + strlen(key), "%llu", (unsigned long long *)&off) == 1) {
                for (i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)v >> (8 * i));
                ok = fseek(f, (long)(8 + hlen + off), SEEK_SET) == 0 && fwrite(le, 1, 8, f) == 8;
            }
        }
        free(h);
    }
    fclose(f);
    return ok;
}

static void test_review2_files(void)
{
    dl_ctx *ctx = new_ctx();
    struct stat st;
    {   /* a batch_size past the dataset: one batch of all of it (the buffers
           hold no more), also with 0-element samples */
        int64_t yv[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, bss[2] = {(int64_t)1 << 61, INT64_MAX};
        int k, s;
        for (s = 0; s < 2; s++)
            for (k = 0; k < 2; k++) {
                dl_tensor *x = dl_keep(dl_zeros(ctx, DL_SHAPE(10, s ? 2 : 0))), *y = dl_keep(dl_from_int64(ctx, DL_SHAPE(10), yv));
                dl_dataset *ds = dl_tensor_dataset(ctx, x, y, NULL, false);
                dl_loader_desc ld;
                dl_loader *l;
                dl_tensor *bx, *by;
                memset(&ld, 0, sizeof ld);
                ld.batch_size = bss[k];
                l = dl_loader_new(ctx, ds, &ld);
                CHECK(l && dl_loader_num_batches(l) == 1 && dl_loader_next(l, &bx, &by) == 1 && by->numel == 10 &&
                      dl_loader_next(l, &bx, &by) == 0, "batch_size %lld over 10 samples of %d: %s",
                      (long long)bss[k], s ? 2 : 0, dl_error_message(ctx));
                dl_step_end(ctx);
                dl_free(x);
                dl_free(y);
            }
    }
    {   /* a user's dataset with a bad sample_shape: refused, naming it */
        dl_dataset ds;
        memset(&ds, 0, sizeof ds);
        ds.length = 4;
        ds.get = empty_get;
        ds.sample_shape.ndim = 100;
        CHECK(dl_loader_new(ctx, &ds, NULL) == NULL, "sample_shape ndim 100");
        EXPECT_ERR(ctx, DL_ERR_ARG, "sample_shape has ndim 100");
        ds.sample_shape.ndim = -3;
        CHECK(dl_loader_new(ctx, &ds, NULL) == NULL, "sample_shape ndim -3");
        EXPECT_ERR(ctx, DL_ERR_ARG, "sample_shape has ndim -3");
        ds.sample_shape = DL_SHAPE(2, -5);
        CHECK(dl_loader_new(ctx, &ds, NULL) == NULL, "sample_shape (2,-5)");
        EXPECT_ERR(ctx, DL_ERR_ARG, "sample_shape dim 1 is -5");
        ds.sample_shape = DL_SHAPE(2);
        {
            dl_loader *l = dl_loader_new(ctx, &ds, NULL);
            CHECK(l != NULL, "a good dataset: %s", dl_error_message(ctx));
            dl_loader_set_epoch(l, INT64_MAX);
            EXPECT_ERR(ctx, DL_ERR_ARG, "dl_loader_set_epoch: epochs 9223372036854775807 must be in 0..2^63-2");
            dl_loader_set_epoch(l, -1);
            EXPECT_ERR(ctx, DL_ERR_ARG, "dl_loader_set_epoch: epochs -1");
            CHECK(dl_loader_epoch(l) == 0, "a refused set_epoch changed the epoch");
        }
    }
    {   /* labels of an IDX file that are not whole numbers: refused as int64, not truncated */
        static const unsigned char idx[16] = {0, 0, 0x0D, 1, 0, 0, 0, 2, 0x3F, 0xC0, 0, 0, 0x40, 0, 0, 0};
        FILE *f = fopen(tmp("frac.idx"), "wb");
        dl_tensor *t = NULL;
        CHECK(f && fwrite(idx, 1, sizeof idx, f) == sizeof idx, "write frac.idx");
        if (f) fclose(f);
        CHECK(dl_idx_load(ctx, tmp("frac.idx"), DL_DTYPE_I64, &t) == DL_ERR_FORMAT, "1.5 loaded as a label");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "element 0 (1.5) is not an integer");
        CHECK(dl_idx_load(ctx, tmp("frac.idx"), DL_DTYPE_F32, &t) == DL_OK, "as float32: %s", dl_error_message(ctx));
        dl_free(t);
    }
    {   /* checkpoints: names given twice are refused before anything is written */
        dl_module *m = dl_module_new(ctx, "Net", NULL, 0), *c;
        dl_optim *o;
        int64_t five = 5;
        dl_kv kv[2];
        dl_module_add(m, "fc", dl_nn_linear(ctx, 2, 2, true));
        c = dl_module_add(m, "optim", dl_module_new(ctx, "Holder", NULL, 0));
        dl_module_buffer(c, "step", dl_from_int64(ctx, dl_shape_make(0, NULL), &five));
        o = dl_adam(m, NULL);
        remove(tmp("dup.st"));
        CHECK(dl_save(tmp("dup.st"), m, o) == DL_ERR_ARG, "a module buffer 'optim.step' beside Adam's");
        EXPECT_ERR(ctx, DL_ERR_ARG, "the tensor name (module or optimizer state) 'optim.step' is given twice");
        CHECK(stat(tmp("dup.st"), &st) != 0, "a refused save wrote the file");
        kv[0].key = kv[1].key = "run";
        kv[0].value = "a";
        kv[1].value = "b";
        CHECK(dl_save_meta(tmp("dup.st"), m, NULL, 2, kv) == DL_ERR_ARG, "a metadata key twice");
        EXPECT_ERR(ctx, DL_ERR_ARG, "the metadata key 'run' is given twice");
        kv[0].value = "\xff";
        CHECK(dl_save_meta(tmp("dup.st"), m, NULL, 1, kv) == DL_ERR_ARG, "metadata that is not UTF-8");
        EXPECT_ERR(ctx, DL_ERR_ARG, "metadata entry 0: the value is not valid UTF-8");
        dl_optim_free(o);
    }
    {   /* read: a metadata key twice, dl.groups not a number, a step count past 2^53;
           saved again over a private file, the file stays private */
        dl_module *m = dl_nn_linear(ctx, 2, 2, true);
        dl_optim *o = dl_adam(m, NULL);
        dl_kv kv;
        char val[16];
        kv.key = "run";
        kv.value = "a";
        CHECK(dl_save_meta(tmp("meta.st"), m, o, 1, &kv) == DL_OK && patch_header(tmp("meta.st"),
              "\"run\":\"a\"", "\"run\":\"a\",\"run\":\"b\""), "write meta.st: %s", dl_error_message(ctx));
        CHECK(dl_checkpoint_meta(ctx, tmp("meta.st"), "run", val, sizeof val) == DL_ERR_FORMAT, "a key twice");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "__metadata__ key 'run' appears twice");
        {   /* dl_checkpoint_meta reads the header only: a 256 MiB file (sparse past the
               header) answers at once, and a file cut inside its header is still refused */
            FILE *f;
            CHECK(dl_save_meta(tmp("big.st"), m, o, 1, &kv) == DL_OK, "write big.st: %s", dl_error_message(ctx));
            f = fopen(tmp("big.st"), "r+b");
            CHECK(f && fseek(f, (1L << 28) - 1, SEEK_SET) == 0 && fputc(0, f) == 0, "big.st: 256 MiB");
            if (f) fclose(f);
            CHECK(dl_checkpoint_meta(ctx, tmp("big.st"), "run", val, sizeof val) == DL_OK && !strcmp(val, "a"),
                  "dl_checkpoint_meta of a 256 MiB checkpoint: \"%s\": %s", val, dl_error_message(ctx));
            f = fopen(tmp("big.st"), "wb");
            CHECK(f && fwrite("\x40\0\0\0\0\0\0\0{\"__meta", 1, 17, f) == 17, "big.st: cut inside its header");
            if (f) fclose(f);
            CHECK(dl_checkpoint_meta(ctx, tmp("big.st"), "run", val, sizeof val) == DL_ERR_FORMAT, "a cut header");
            EXPECT_ERR(ctx, DL_ERR_FORMAT, "the header length 64 is larger than the rest of the file (9 bytes)");
            remove(tmp("big.st"));
        }
        CHECK(dl_load(tmp("meta.st"), m, o) == DL_ERR_FORMAT, "load: a key twice");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "__metadata__ key 'run' appears twice");
        CHECK(dl_save(tmp("groups.st"), m, o) == DL_OK && patch_header(tmp("groups.st"), "\"__metadata__\":{",
              "\"__metadata__\":{\"dl.groups\":\"1abc\","), "write groups.st: %s", dl_error_message(ctx));
        CHECK(dl_load(tmp("groups.st"), m, o) == DL_ERR_FORMAT, "dl.groups \"1abc\"");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "dl.groups \"1abc\" is not a whole number");
        CHECK(dl_save(tmp("step.st"), m, o) == DL_OK && patch_scalar(tmp("step.st"), "optim.step", INT64_MAX),
              "write step.st: %s", dl_error_message(ctx));
        CHECK(dl_load(tmp("step.st"), m, o) == DL_ERR_FORMAT, "a step count of 2^63-1");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "'optim.step' is a count 9223372036854775807 outside 0..2^53");
        CHECK(chmod(tmp("step.st"), 0600) == 0 && dl_save(tmp("step.st"), m, o) == DL_OK &&
              stat(tmp("step.st"), &st) == 0 && (st.st_mode & 0777) == 0600,
              "saved over a 0600 file: mode %o", (unsigned)(st.st_mode & 0777));
        dl_optim_free(o);
    }
    {   /* a file name near the file system's limit: the temporary gets a short name */
        char name[251];
        dl_module *m = dl_nn_linear(ctx, 2, 2, true);
        memset(name, 'n', 250);
        name[250] = 0;
        CHECK(dl_save(tmp(name), m, NULL) == DL_OK && stat(tmp(name), &st) == 0, "a 250-character file name: %s",
              dl_error_message(ctx));
        CHECK(count_tmp_files(g_dir) == 0, "a temporary file was left");
        remove(tmp(name));
    }
    dl_ctx_free(ctx);
}

static dl_tensor *twice_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)fc; (void)n;
    return user ? dl_ones((dl_ctx *)user, DL_SHAPE(3)) : dl_mul_scalar(in[0], 2.0f);   /* user: a foreign context */
}
static dl_result twice_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)fc; (void)user;
    gin[0] = dl_mul_scalar(g, 2.0f);
    return DL_OK;
}

static int gc_calls, gc_mode;
static dl_tensor *gc_f(void *user, dl_tensor *const *in)
{
    (void)user;
    if (gc_calls++ < 2) return dl_mul(in[0], in[0]);
    return gc_mode == 0 ? NULL : gc_mode == 1 ? dl_zeros(dl_tensor_ctx(in[0]), DL_SHAPE(4)) : dl_mul(in[0], in[0]);
}

static void test_review2_modules(void)
{
    dl_ctx *ctx = two_cpu_ctx((size_t)16 << 20), *ctx2 = new_ctx();
    dl_gradcheck_result res;
    {   /* dl_module_to inside a step: the old storage lives to dl_step_end (a
           view reads the old values, as torch's), and a backward of a graph
           made before the move is refused, not run across devices */
        dl_module *lin = dl_nn_linear(ctx, 2, 3, true);
        dl_tensor *w = dl_module_get(lin, "weight"), *x = dl_ones(ctx, DL_SHAPE(4, 2)), *v, *y;
        int here = w->device.index, other = here == 1 ? 0 : 1;
        float before[6], after[6];
        dl_read(w, before, 6);
        v = dl_reshape(dl_detach(w), DL_SHAPE(6));
        y = dl_sum(dl_module_forward(lin, x), DL_ALL, false);
        CHECK(dl_module_to(lin, dl_cpu_device(other)) == DL_OK, "module_to: %s", dl_error_message(ctx));
        CHECK(dl_read(v, after, 6) == DL_OK && memcmp(before, after, sizeof before) == 0,
              "a view of the weight after dl_module_to: %s", dl_error_message(ctx));
        CHECK(dl_backward(y) != DL_OK, "a backward across the move succeeded");
        dl_clear_error(ctx);
        dl_step_end(ctx);
        CHECK(dl_module_to(lin, dl_cpu_device(here)) == DL_OK && w->device.index == here, "back: %s",
              dl_error_message(ctx));
    }
    {   /* out of memory halfway through dl_module_to: nothing moves (the
           weight had moved without its gradient) */
        dl_module *lin = dl_nn_linear(ctx, 1000, 1000, false);
        dl_tensor *w = dl_module_get(lin, "weight"), *hog[9];
        int here = w->device.index, other = here == 1 ? 0 : 1, i;
        dl_step_end(ctx);
        CHECK(dl_backward(dl_sum(dl_module_forward(lin, dl_ones(ctx, DL_SHAPE(2, 1000))), DL_ALL, false)) == DL_OK &&
              w->grad, "backward: %s", dl_error_message(ctx));
        dl_step_end(ctx);
        dl_set_device(ctx, dl_cpu_device(other));   /* 9 MiB there: the weight fits, not its grad too */
        for (i = 0; i < 9; i++) {
            hog[i] = dl_keep(dl_zeros(ctx, DL_SHAPE((int64_t)1 << 18)));
            dl_step_end(ctx);
        }
        dl_set_device(ctx, dl_cpu_device(here));
        CHECK(dl_module_to(lin, dl_cpu_device(other)) == DL_ERR_OOM, "a move past memory_limit");
        EXPECT_ERR(ctx, DL_ERR_OOM, "for a gradient (1000,1000)");
        CHECK(w->device.index == here && w->grad->device.index == here, "a failed move left the weight on cpu:%d "
              "and its gradient on cpu:%d", w->device.index, w->grad->device.index);
        dl_module_zero_grad(lin);
        CHECK(dl_last_error(ctx) == DL_OK, "zero_grad after a failed move: %s", dl_error_message(ctx));
        for (i = 0; i < 9; i++) dl_free(hog[i]);
        dl_step_end(ctx);
    }
    {   /* dl_gradcheck: a later call of f that fails or changes shape, an
           input of another context: an error and ok false, never a pass */
        dl_tensor *x = dl_param(dl_ones(ctx, DL_SHAPE(3)));
        dl_tensor *xo = dl_param(dl_ones(ctx2, DL_SHAPE(3)));
        for (gc_mode = 0; gc_mode < 2; gc_mode++) {
            gc_calls = 0;
            CHECK(dl_gradcheck(ctx, gc_f, NULL, 1, &x, NULL, &res) == DL_ERR_ARG && !res.ok, "mode %d: %s", gc_mode,
                  dl_error_message(ctx));
            EXPECT_ERR(ctx, DL_ERR_ARG, gc_mode ? "returned of another shape" : "returned NULL");
        }
        gc_calls = 0;
        CHECK(dl_gradcheck(ctx, gc_f, NULL, 1, &xo, NULL, &res) == DL_ERR_ARG && !res.ok, "an input of another context");
        EXPECT_ERR(ctx, DL_ERR_ARG, "input 0 (3) belongs to another context");
        gc_calls = 0;
        CHECK(dl_gradcheck(ctx, gc_f, NULL, 1, &x, NULL, &res) == DL_OK && res.ok, "a good f: %s", dl_error_message(ctx));
        dl_free(x);
        dl_free(xo);
    }
    {   /* a custom function whose forward returns another context's tensor: refused */
        dl_function f = fn_of("foreign", twice_fwd, twice_bwd);
        dl_tensor *x = dl_requires_grad(dl_ones(ctx, DL_SHAPE(3)), true);
        CHECK(dl_function_apply(&f, 1, &x, ctx2) == NULL, "a result of another context");
        EXPECT_ERR(ctx, DL_ERR_ARG, "foreign: its forward returned a tensor (3) of another context");
        dl_clear_error(ctx2);
    }
    {   /* the profiler: an unnamed custom function is counted under one name
           (its span opened and closed under two); a failed write is an error */
        dl_function f;
        dl_tensor *x = dl_requires_grad(dl_ones(ctx, DL_SHAPE(3)), true);
        dl_profile_row rows[16];
        int n, i, found = 0;
        FILE *full = fopen("/dev/full", "w");
        f = fn_of(NULL, twice_fwd, twice_bwd);
        dl_profile_reset(ctx);
        dl_profile_enable(ctx, true);
        for (i = 0; i < 3; i++) dl_function_apply(&f, 1, &x, NULL);
        n = dl_profile_rows(ctx, rows, 16);
        for (i = 0; i < n && i < 16; i++)
            if (strcmp(rows[i].name, "dl_function_apply") == 0) found = (int)rows[i].calls;
        CHECK(found == 3, "an unnamed custom function counted %d times of 3", found);
        if (full) {
            CHECK(dl_profile_print(ctx, full) == DL_ERR_IO, "printing the profile to /dev/full");
            EXPECT_ERR(ctx, DL_ERR_IO, "dl_profile_print: writing");
            fclose(full);
        }
        dl_profile_enable(ctx, false);
        dl_profile_reset(ctx);
        dl_step_end(ctx);
    }
    {   /* a child shared at every level of 40: dl_module_add walks each module once (2^40 before) */
        dl_module *m = dl_module_new(ctx, "Leaf", NULL, 0);
        int i;
        for (i = 0; i < 40 && m; i++) {
            dl_module *up = dl_module_new(ctx, "Level", NULL, 0);
            if (!dl_module_add(up, "a", m) || !dl_module_add(up, "b", m)) up = NULL;
            m = up;
        }
        CHECK(m != NULL, "40 levels of a shared child: %s", dl_error_message(ctx));
    }
    dl_ctx_free(ctx2);
    dl_ctx_free(ctx);
}

/* ---- 17. the third hostile review (capture lifetimes, data, values) ---- */

/* mappings of this process (Linux), -1 elsewhere */
static long map_count(void)
{
#ifdef __linux__
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0;
    int c;
    if (!f) return -1;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
#else
    return -1;
#endif
}

static void test_review3_capture(void)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *w = dl_param(dl_rand(ctx, DL_SHAPE(8, 8))), *x = dl_keep(dl_rand(ctx, DL_SHAPE(8, 8)));
    dl_tensor *h, *l, *v;
    dl_capture *c;
    float out[64];
    {   /* a capture freed in its own step, then a failing backward in that step: an
           error (the tape still lists the capture's nodes: they used to be unmapped, SEGV) */
        c = dl_capture_begin(ctx);
        l = dl_sum(dl_mul(w, x), DL_ALL, false);
        (void)dl_item(l);                               /* a host read: the capture fails */
        CHECK(dl_capture_end(c) == DL_ERR_UNSUPPORTED, "a failed capture");
        dl_capture_free(c);
        l = dl_sum(dl_mul(w, x), DL_ALL, false);       /* the step, eagerly */
        dl_no_grad_begin(ctx);
        dl_fill_(x, 1.0f);                              /* x changes under the graph */
        dl_no_grad_end(ctx);
        CHECK(dl_backward(l) == DL_ERR_GRAPH, "the backward's own error: %s", dl_error_message(ctx));
        dl_clear_error(ctx);
        dl_step_end(ctx);
    }
    {   /* eager ops and views on a capture's tensor, then dl_capture_free in that
           step: the view reads and the backward runs (the memory goes back at
           dl_step_end, a heap-use-after-free before); the tensor itself is stale */
        dl_backward(dl_sum(dl_mul(w, x), DL_ALL, false));   /* warm-up: w->grad */
        dl_step_end(ctx);
        dl_zero_grad(w);
        c = dl_capture_begin(ctx);
        h = dl_mul(w, x);
        CHECK(dl_capture_end(c) == DL_OK, "capture: %s", dl_error_message(ctx));
        v = dl_reshape(h, DL_SHAPE(64));
        l = dl_sum(v, DL_ALL, false);
        dl_capture_free(c);
        CHECK(dl_read(v, out, 64) == DL_OK && out[0] == out[0], "a view of it reads");
        CHECK(dl_backward(l) == DL_OK && w->grad && dl_read(w->grad, out, 64) == DL_OK && out[0] == 1.0f,
              "the backward reaches w: %s", dl_error_message(ctx));
        CHECK(dl_read(h, out, 64) == DL_ERR_STALE, "the capture's own tensor is stale at once");
        EXPECT_ERR(ctx, DL_ERR_STALE, "made inside a capture that dl_capture_free() released");
        dl_step_end(ctx);
        CHECK(dl_read(v, out, 64) == DL_ERR_STALE, "the view is stale after the step");
        dl_clear_error(ctx);
    }
    {   /* dl_free of a persistent tensor with a view and a graph in this step: the
           view reads (a heap-use-after-free before), a backward that needs it
           says it was freed; the tensor itself is gone at once */
        dl_tensor *k = dl_param(dl_full(ctx, DL_SHAPE(2, 3), 2.0f)), *kv = dl_reshape(dl_detach(k), DL_SHAPE(6));
        dl_tensor *y = dl_sum(dl_mul(k, k), DL_ALL, false);
        dl_free(k);
        CHECK(dl_read(kv, out, 6) == DL_OK && out[5] == 2.0f, "a view of a dl_free()d tensor reads");
        CHECK(dl_backward(y) == DL_ERR_ARG, "a backward that reads it");
        EXPECT_ERR(ctx, DL_ERR_ARG, "in the backward of dl_mul: dl_mul: b (unnamed) was freed by dl_free()");
        CHECK(dl_read(k, out, 6) == DL_ERR_ARG, "the tensor is freed");
        EXPECT_ERR(ctx, DL_ERR_ARG, "was freed by dl_free() (use after free)");
        dl_step_end(ctx);
    }
    {   /* a capture of an optimizer's zero_grad alone, then the optimizer freed: the
           replay is stale (on CUDA the graph launched the optimizer's freed list:
           a read of freed memory, found by the capture fuzz on emulated cuda:0) */
        dl_module *lin = dl_nn_linear(ctx, 2, 2, true);
        dl_optim *op = dl_sgd(lin, NULL);
        dl_capture *cz;
        dl_backward(dl_sum(dl_module_forward(lin, dl_ones(ctx, DL_SHAPE(1, 2))), DL_ALL, false));
        dl_step_end(ctx);
        cz = dl_capture_begin(ctx);
        dl_optim_zero_grad(op);
        CHECK(dl_capture_end(cz) == DL_OK && dl_replay(cz) == DL_OK, "a captured zero_grad replays");
        dl_optim_free(op);
        CHECK(dl_replay(cz) == DL_ERR_STALE, "after dl_optim_free: stale");
        EXPECT_ERR(ctx, DL_ERR_STALE, "the capture uses an optimizer (dl_optim_free), which was freed");
        dl_capture_free(cz);
        dl_step_end(ctx);
    }
    {   /* a capture's view of a tensor dl_free()d later: its data is gone after the step,
           so using the view is an error (it read freed memory) */
        dl_tensor *b = dl_keep(dl_ones(ctx, DL_SHAPE(4))), *bv;
        dl_capture *cv = dl_capture_begin(ctx);
        bv = dl_reshape(b, DL_SHAPE(2, 2));
        CHECK(dl_capture_end(cv) == DL_OK, "a capture with a view");
        dl_free(b);
        dl_step_end(ctx);
        CHECK(dl_mul(bv, bv) == NULL, "the view of a freed tensor is refused");
        EXPECT_ERR(ctx, DL_ERR_STALE, "dl_mul: a (2,2) is a view of a tensor, which dl_free() freed");
        dl_capture_free(cv);
        dl_step_end(ctx);
    }
    {   /* dl_free of a gradient: its tensor has none (p.grad = None), and freeing the
           tensor after does not free the gradient twice (a double free at dl_step_end) */
        dl_tensor *p = dl_param(dl_ones(ctx, DL_SHAPE(4)));
        dl_backward(dl_sum(dl_mul(p, p), DL_ALL, false));
        CHECK(p->grad != NULL, "a gradient");
        dl_free(p->grad);
        CHECK(p->grad == NULL, "dl_free(p->grad) leaves p without one");
        dl_zero_grad(p);
        CHECK(dl_backward(dl_sum(dl_mul(p, p), DL_ALL, false)) == DL_OK && p->grad &&
              dl_read(p->grad, out, 4) == DL_OK && out[0] == 2.0f, "a backward makes a new one");
        dl_free(p->grad);
        dl_free(p);
        dl_step_end(ctx);
    }
    {   /* memory_limit counts what dl_free keeps to the step's end (50 frees of 2 MiB
           under a 6 MiB limit all succeeded, 100 MiB held) */
        dl_ctx_desc d;
        dl_ctx *lc;
        dl_tensor *z;
        int k, ok = 0;
        memset(&d, 0, sizeof d);
        d.log = dl_log_silent;
        d.memory_limit = (size_t)6 << 20;
        lc = dl_ctx_init(&d);
        z = dl_zeros(lc, DL_SHAPE(512, 1024));   /* 2 MiB of step memory, then copies of it */
        for (k = 0; k < 10; k++) {
            dl_tensor *big = dl_keep(z);
            if (!big) break;
            ok++;
            dl_free(big);
        }
        CHECK(ok < 10 && dl_last_error(lc) == DL_ERR_OOM, "the limit holds within a step: %d of 10", ok);
        dl_step_end(lc);
        CHECK(dl_keep(dl_zeros(lc, DL_SHAPE(512, 1024))) != NULL, "and the memory is back after it");
        dl_ctx_free(lc);
    }
    {   /* checkpoints inside a capture are refused (a save wrote zeros on strict
           devices, a load wrote host memory a replay would not) */
        dl_module *m = dl_nn_linear(ctx, 2, 2, true);
        c = dl_capture_begin(ctx);
        CHECK(dl_save_module(tmp("cap.safetensors"), m) == DL_ERR_UNSUPPORTED, "dl_save_module refused");
        EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "dl_save_module: writing a checkpoint (a read of every tensor to the "
                   "host) inside a capture");
        CHECK(dl_load_module(tmp("cap.safetensors"), m) == DL_ERR_UNSUPPORTED, "dl_load_module refused");
        EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "dl_load_module: loading a checkpoint (host writes into the "
                   "tensors) inside a capture");
        dl_capture_free(c);
        dl_step_end(ctx);
    }
    {   /* a replay that fails (a bad class target) counts no optimizer step. On the
           CPU devices, where a replay keeps the loss's target check; a CUDA graph
           runs without it (docs/capture.md) */
        int64_t good[4] = {0, 1, 2, 1}, bad[4] = {0, 7, 2, 1};
        bool cpu = dl_ctx_device(ctx).type == DL_DEVICE_CPU;
        dl_module *net = dl_nn_linear(ctx, 3, 3, false);
        dl_optim *opt = dl_adam(net, NULL);
        dl_tensor *xs = dl_keep(dl_rand(ctx, DL_SHAPE(4, 3))), *ys = dl_keep(dl_from_int64(ctx, DL_SHAPE(4), good)), *ys2;
        int k;
        c = NULL;
        for (k = 0; k < 2; k++) {
            if (k == 1) c = dl_capture_begin(ctx);
            dl_optim_zero_grad(opt);
            dl_backward(dl_cross_entropy(dl_module_forward(net, xs), ys, NULL));
            dl_optim_step(opt);
            if (k == 1) CHECK(dl_capture_end(c) == DL_OK, "captured step: %s", dl_error_message(ctx));
            dl_step_end(ctx);
        }
        CHECK(dl_replay(c) == DL_OK && dl_optim_steps(opt) == 3, "a replay counts a step");
        if (cpu) {
            dl_copy_(ys, dl_from_int64(ctx, DL_SHAPE(4), bad));
            CHECK(dl_replay(c) == DL_ERR_ARG && dl_optim_steps(opt) == 3, "a failed one does not: %lld",
                  (long long)dl_optim_steps(opt));
            dl_copy_(ys, dl_from_int64(ctx, DL_SHAPE(4), good));
            CHECK(dl_replay(c) == DL_OK && dl_optim_steps(opt) == 4, "the next counts");
        }
        dl_capture_free(c);
        /* a record after the optimizer's that fails: the step ran, and counts */
        ys2 = dl_keep(dl_from_int64(ctx, DL_SHAPE(4), good));
        for (k = 0; k < 2; k++) {
            if (k == 1) c = dl_capture_begin(ctx);
            dl_optim_zero_grad(opt);
            dl_backward(dl_cross_entropy(dl_module_forward(net, xs), ys, NULL));
            dl_optim_step(opt);
            dl_cross_entropy(dl_module_forward(net, xs), ys2, NULL);   /* an evaluation after it */
            if (k == 1) CHECK(dl_capture_end(c) == DL_OK, "captured step: %s", dl_error_message(ctx));
            dl_step_end(ctx);
        }
        if (cpu) {
            dl_copy_(ys2, dl_from_int64(ctx, DL_SHAPE(4), bad));
            CHECK(dl_replay(c) == DL_ERR_ARG && dl_optim_steps(opt) == 7, "the step ran before the failure: %lld",
                  (long long)dl_optim_steps(opt));
        }
        {   /* a capture's graph after an input it used was freed, and the step ended */
            dl_tensor *xin = dl_keep(dl_rand(ctx, DL_SHAPE(4, 3))), *lo;
            dl_capture *c2;
            dl_step_end(ctx);
            c2 = dl_capture_begin(ctx);
            lo = dl_sum(dl_module_forward(net, xin), DL_ALL, false);
            CHECK(dl_capture_end(c2) == DL_OK, "capture");
            dl_free(xin);
            dl_step_end(ctx);
            CHECK(dl_graph_dot(lo, tmp("freed_input.dot")) == DL_OK, "dl_graph_dot: %s", dl_error_message(ctx));
            dl_capture_free(c2);
            dl_step_end(ctx);
            CHECK(dl_read(lo, out, 1) == DL_ERR_STALE, "a released capture's tensor: DL_ERR_STALE");
            dl_clear_error(ctx);
        }
        dl_capture_free(c);
        CHECK(dl_capture_end(c) == DL_ERR_STALE, "dl_capture_end of a freed capture: DL_ERR_STALE");
        dl_clear_error(ctx);
        dl_step_end(ctx);
    }
    {   /* captures made and freed many times use no more mappings (each took two,
           for good: the process's limit, about 65,000, ended it after 32,000) */
        long m0, m1;
        int k;
        m0 = map_count();
        for (k = 0; k < 2000; k++) {
            c = dl_capture_begin(ctx);
            dl_sum(dl_mul(w, x), DL_ALL, false);
            dl_capture_end(c);
            dl_capture_free(c);
            dl_step_end(ctx);
        }
        m1 = map_count();
        CHECK(m0 < 0 || m1 - m0 < 50, "2000 captures: mappings %ld -> %ld", m0, m1);
    }
    dl_ctx_free(ctx);
}

/* a stale tensor used on one thread while another thread's contexts make
   and free captures: the stale check walked the other contexts' header
   regions while they were freed (heap-use-after-free under make sanitize) */
static int race_stop, race_ready;
static void *race_user(void *arg)
{
    dl_ctx *ctx = new_ctx();
    dl_tensor *old = dl_ones(ctx, DL_SHAPE(3));
    long *stale = (long *)arg;
    int s, i;
    dl_step_end(ctx);
    for (s = 0; s < 6; s++) {   /* enough later headers that step 1's pages go back (zeros) */
        for (i = 0; i < 20000; i++) dl_zeros(ctx, DL_SHAPE(1));
        dl_step_end(ctx);
    }
    __atomic_store_n(&race_ready, 1, __ATOMIC_RELEASE);
    do {   /* (at least once, however fast the other thread was) */
        if (!dl_relu(old) && dl_last_error(ctx) == DL_ERR_STALE) (*stale)++;
        dl_clear_error(ctx);
    } while (!__atomic_load_n(&race_stop, __ATOMIC_ACQUIRE));
    dl_ctx_free(ctx);
    return NULL;
}
static void test_header_owner_race(void)
{
    pthread_t t;
    long stale = 0;
    int i;
    race_stop = race_ready = 0;
    pthread_create(&t, NULL, race_user, &stale);
    while (!__atomic_load_n(&race_ready, __ATOMIC_ACQUIRE)) sched_yield();   /* its stale tensor is ready */
    for (i = 0; i < 300; i++) {
        dl_ctx *ctx = new_ctx();
        dl_tensor *w = dl_param(dl_randn(ctx, DL_SHAPE(4, 4)));
        dl_capture *c = dl_capture_begin(ctx);
        dl_sum(dl_mul(w, w), DL_ALL, false);
        dl_capture_end(c);
        dl_capture_free(c);
        dl_ctx_free(ctx);
    }
    __atomic_store_n(&race_stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    CHECK(stale > 0, "the stale tensor was reported (%ld times) while captures came and went", stale);
}

static void test_review3_values(void)
{
    dl_ctx *ctx = new_ctx();
    {   /* maximum/minimum at a NaN: the gradient reaches both inputs, as PyTorch's
           where(a == b, g/2, g).masked_fill_(a < b, 0) (it vanished) */
        float av[3] = {NAN, 1, 2}, bv[3] = {1, NAN, 2}, want[3] = {1, 1, 0.5f};
        int k;
        for (k = 0; k < 2; k++) {
            dl_tensor *a = dl_param(dl_from_array(ctx, DL_SHAPE(3), av)), *b = dl_param(dl_from_array(ctx, DL_SHAPE(3), bv));
            dl_tensor *y = k ? dl_minimum(a, b) : dl_maximum(a, b);
            CHECK(dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && read_is(a->grad, want, 3) &&
                  read_is(b->grad, want, 3), "%s: gradients 1 1 0.5 at a NaN", k ? "minimum" : "maximum");
            dl_free(a);
            dl_free(b);
        }
    }
    {   /* mul_scalar keeps the sign of zero (x * s + 0 made -0 +0), so sqrt's gradient at -0 is -inf */
        float zv[2] = {-0.0f, 0.0f}, g[2];
        dl_tensor *z = dl_param(dl_from_array(ctx, DL_SHAPE(2), zv)), *y = dl_mul_scalar(z, 2.0f);
        float got[2];
        CHECK(y && dl_read(y, got, 2) == DL_OK && signbit(got[0]) && !signbit(got[1]), "mul_scalar(-0, 2) = -0");
        CHECK(dl_backward(dl_sum(dl_sqrt(z), DL_ALL, false)) == DL_OK && dl_read(z->grad, g, 2) == DL_OK &&
              g[0] == -INFINITY && g[1] == INFINITY, "d sqrt at -0 and 0: %g %g", (double)g[0], (double)g[1]);
        dl_free(z);
    }
    {   /* eval-mode batch norm is affine in x: an inf or NaN x still gets w invstd g (it got NaN) */
        float xv[4] = {1, INFINITY, NAN, -INFINITY}, g[4];
        dl_tensor *x = dl_param(dl_from_array(ctx, DL_SHAPE(4, 1), xv));
        dl_tensor *rm = dl_keep(dl_zeros(ctx, DL_SHAPE(1))), *rv = dl_keep(dl_ones(ctx, DL_SHAPE(1)));
        dl_tensor *y = dl_batch_norm(x, rm, rv, NULL, NULL, false, 0.1f, 1e-5f);
        float k = 1.0f / sqrtf(1.0f + 1e-5f);
        CHECK(dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && dl_read(x->grad, g, 4) == DL_OK &&
              fabsf(g[0] - k) < 1e-6f && g[1] == g[0] && g[2] == g[0] && g[3] == g[0],
              "eval batch norm's dx at inf/NaN: %g %g %g %g", (double)g[0], (double)g[1], (double)g[2], (double)g[3]);
    }
    {   /* a checkpoint's num_batches_tracked past 2^53 is refused (the next forward overflowed) */
        dl_module *bn = dl_nn_batch_norm1d(ctx, 2), *bn2 = dl_nn_batch_norm1d(ctx, 2);
        int64_t big[1] = {INT64_MAX};
        dl_copy_(dl_module_get(bn, "num_batches_tracked"), dl_from_int64(ctx, dl_shape_make(0, NULL), big));
        CHECK(dl_save_module(tmp("nbt.safetensors"), bn) == DL_OK, "save");
        CHECK(dl_load_module(tmp("nbt.safetensors"), bn2) == DL_ERR_FORMAT, "load refused");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "tensor 'num_batches_tracked' is a count 9223372036854775807 outside 0..2^53");
    }
    {   /* create_graph into a parameter: its persistent ->grad is summed in place
           without the history, so a penalty on it (loss + sum(w.grad^2)) was
           silently dropped; an op that would differentiate through it is refused
           until it is zeroed, and dl_grad gives the penalty's gradient (8 w x^4) */
        float wv[2] = {1.0f, -1.5f}, xv[2] = {1.0f, 2.0f}, g[2];
        dl_tensor *w = dl_param(dl_from_array(ctx, DL_SHAPE(2), wv)), *x = dl_from_array(ctx, DL_SHAPE(2), xv);
        dl_tensor *loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false), *gw;   /* sum (w x)^2 */
        dl_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.create_graph = true;
        CHECK(dl_backward_ex(loss, &bd) == DL_OK && w->grad, "create_graph backward into a parameter");
        loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
        CHECK(dl_backward(dl_add(loss, dl_sum(dl_mul(w->grad, w->grad), DL_ALL, false))) == DL_ERR_GRAPH,
              "a backward of loss + a penalty on w->grad is refused");
        EXPECT_ERR(ctx, DL_ERR_GRAPH, "dl_backward: the graph goes through input 1 () of dl_add, computed from a "
                   "parameter's ->grad");
        CHECK(dl_copy(w->grad) != NULL, "reading it (a copy) is fine");
        dl_zero_grad(w);
        loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
        CHECK(dl_backward(dl_add(loss, dl_sum(dl_mul(w->grad, w->grad), DL_ALL, false))) == DL_OK,
              "zeroed: usable again");
        {   /* the mark follows the values: dl_copy_ carries it, dl_fill_ clears it */
            dl_tensor *buf = dl_keep(dl_zeros(ctx, DL_SHAPE(2)));
            dl_zero_grad(w);
            loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
            CHECK(dl_backward_ex(loss, &bd) == DL_OK && dl_copy_(buf, w->grad) == DL_OK, "a copy of w->grad");
            loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
            CHECK(dl_backward(dl_add(loss, dl_sum(dl_mul(buf, buf), DL_ALL, false))) == DL_ERR_GRAPH,
                  "a penalty on the copy is refused too (it was dropped)");
            dl_clear_error(ctx);
            CHECK(dl_fill_(w->grad, 0.0f) == DL_OK && dl_fill_(buf, 1.0f) == DL_OK, "overwritten");
            loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
            CHECK(dl_backward(dl_add(loss, dl_sum(dl_mul(w->grad, buf), DL_ALL, false))) == DL_OK,
                  "overwritten values carry no mark: %s", dl_error_message(ctx));
            dl_free(buf);
        }
        {   /* views: a copy into a view marks its base, and a view of a marked gradient
               (made before the create_graph backward) is refused too */
            dl_tensor *buf = dl_keep(dl_zeros(ctx, DL_SHAPE(2))), *v;
            dl_zero_grad(w);
            v = dl_reshape(w->grad, DL_SHAPE(1, 2));
            loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
            CHECK(dl_backward_ex(loss, &bd) == DL_OK && dl_copy_(dl_reshape(buf, DL_SHAPE(1, 2)), w->grad) == DL_OK,
                  "a copy into a view of buf");
            loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
            CHECK(dl_backward(dl_add(loss, dl_sum(dl_mul(buf, buf), DL_ALL, false))) == DL_ERR_GRAPH,
                  "a penalty on buf (its view was the copy's dst) is refused");
            dl_clear_error(ctx);
            loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
            CHECK(dl_backward(dl_add(loss, dl_sum(dl_mul(v, v), DL_ALL, false))) == DL_ERR_GRAPH,
                  "a penalty on a view made before the create_graph backward is refused");
            dl_clear_error(ctx);
            dl_free(buf);
        }
        {   /* captures: a create_graph backward into a parameter is refused inside one (a
               replay, no host code, could not follow the mark), and a replay refuses to read
               a marked gradient */
            dl_capture *cg;
            dl_zero_grad(w);
            dl_step_end(ctx);
            x = dl_keep(dl_from_array(ctx, DL_SHAPE(2), xv));
            cg = dl_capture_begin(ctx);
            dl_zero_grad(w);
            CHECK(dl_backward_ex(dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false), &bd) ==
                  DL_ERR_UNSUPPORTED, "a captured create_graph backward into w");
            EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "create_graph into parameter (2), a persistent leaf, inside a capture");
            dl_capture_free(cg);
            dl_step_end(ctx);
            cg = dl_capture_begin(ctx);
            dl_zero_grad(w);
            dl_backward(dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false));
            CHECK(dl_capture_end(cg) == DL_OK, "a captured plain step");
            dl_step_end(ctx);
            CHECK(dl_backward_ex(dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false), &bd) == DL_OK &&
                  w->grad->nohist_, "marked by an eager create_graph backward");
            dl_step_end(ctx);
            CHECK(dl_replay(cg) == DL_ERR_GRAPH, "a replay that reads it is refused");
            EXPECT_ERR(ctx, DL_ERR_GRAPH, "dl_replay: the capture reads a tensor (2), a parameter's ->grad");
            dl_zero_grad(w);
            CHECK(dl_replay(cg) == DL_OK && !w->grad->nohist_, "zeroed: it replays");
            {   /* with a capture alive, dl_free'd tensors it never used go back at dl_step_end */
                int k, kept = 0;
                dl_tensor *t;
                for (k = 0; k < 20; k++) {
                    dl_free(dl_keep(dl_ones(ctx, DL_SHAPE(4))));
                    dl_step_end(ctx);
                }
                for (t = ctx->freed_kept; t; t = t->pnext_) kept++;
#ifdef DL_DEBUG
                kept = 0;                 /* (a debug build keeps every freed header, on purpose) */
#endif
                CHECK(kept == 0, "freed headers kept while an unrelated capture lives: %d", kept);
            }
            dl_capture_free(cg);
        }
        dl_zero_grad(w);
        loss = dl_sum(dl_mul(dl_mul(w, x), dl_mul(w, x)), DL_ALL, false);
        CHECK(dl_grad(loss, 1, &w, &gw, &bd) == DL_OK && gw &&
              dl_backward(dl_sum(dl_mul(gw, gw), DL_ALL, false)) == DL_OK && dl_read(w->grad, g, 2) == DL_OK &&
              g[0] == 8.0f && g[1] == -192.0f, "dl_grad's penalty reaches w: %g %g", (double)g[0], (double)g[1]);
        dl_step_end(ctx);
    }
    {   /* optimizers: the groups of a model without biases (one empty) are
           accepted; a warmup at t = INT64_MAX is base (t + 1 overflowed) */
        dl_module *lin = dl_nn_linear(ctx, 4, 3, false);
        dl_param_group pg[2];
        int ng = dl_module_decay_groups(lin, pg);
        dl_optim *o = dl_adamw_groups(ctx, ng, pg, NULL);
        CHECK(ng == 2 && pg[1].n == 0 && o != NULL, "decay groups with an empty one: %s", dl_error_message(ctx));
        dl_backward(dl_sum(dl_module_forward(lin, dl_ones(ctx, DL_SHAPE(2, 4))), DL_ALL, false));
        CHECK(dl_optim_step(o) == DL_OK, "and it steps");
        CHECK(dl_lr_warmup(0.5f, INT64_MAX, 10) == 0.5f && dl_lr_warmup(0.5f, 8, 10) == 0.45f, "warmup");
    }
    dl_ctx_free(ctx);
}

static void test_review3_data(void)
{
    dl_ctx *ctx = new_ctx();
    {   /* a dataset's host x read in place: dl_free of it is refused (use after free in the loader) */
        int64_t yv[4] = {1, 2, 3, 4};
        dl_tensor *x = dl_keep(dl_ones(ctx, DL_SHAPE(4, 2))), *y = dl_keep(dl_from_int64(ctx, DL_SHAPE(4), yv));
        dl_dataset *ds = dl_tensor_dataset(ctx, x, y, NULL, false);
        CHECK(ds != NULL, "dataset: %s", dl_error_message(ctx));
        if (ds && dl__host_ok(x)) {
            dl_free(x);
            EXPECT_ERR(ctx, DL_ERR_ARG, "dl_free: t (4,2) holds the samples of a dl_tensor_dataset");
            CHECK(dl_sum(x, DL_ALL, false) != NULL, "x is still there");
        }
    }
    {   /* a module's parameter or buffer: dl_free refused (the module, its optimizer, clip_grad_norm
           and dl_save read it; they once read it after the free), the module still works */
        dl_module *lin = dl_nn_linear(ctx, 3, 2, true), *bn = dl_nn_batch_norm1d(ctx, 2);
        dl_free(dl_module_get(lin, "bias"));
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_free: t (2) is bias of a Linear module, which (with its optimizers and "
                   "checkpoints) reads it until dl_ctx_free");
        dl_free(dl_module_get(bn, "running_mean"));
        EXPECT_ERR(ctx, DL_ERR_ARG, "is running_mean of a BatchNorm1d module");
        CHECK(dl_module_forward(lin, dl_ones(ctx, DL_SHAPE(4, 3))) != NULL && dl_clip_grad_norm(lin, 1.0f) >= 0.0f,
              "the Linear after the refused free: %s", dl_error_message(ctx));
        dl_step_end(ctx);
    }
    {   /* a float y: targets, as PyTorch's TensorDataset, never labels truncated toward zero (as they
           once were, 1e30 undefined): the batches hold its bits, and cross entropy refuses them */
        float yf[3] = {0.5f, 2.9f, 1e30f}, v[3] = {0, 0, 0};
        int64_t got[3];
        dl_tensor *x = dl_keep(dl_ones(ctx, DL_SHAPE(3, 2))), *y = dl_keep(dl_from_array(ctx, DL_SHAPE(3), yf));
        dl_tensor *bx = NULL, *by = NULL;
        dl_dataset *ds = dl_tensor_dataset(ctx, x, y, NULL, false);
        dl_loader_desc ld;
        dl_loader *l;
        memset(&ld, 0, sizeof ld);
        ld.batch_size = 3;
        l = ds ? dl_loader_new(ctx, ds, &ld) : NULL;
        CHECK(ds && !ds->get && ds->get_target && ds->target_shape.ndim == 0, "float y: float targets");
        CHECK(l && dl_loader_next(l, &bx, &by) == 1 && by->dtype == DL_DTYPE_F32 && by->ndim == 1 &&
              by->shape[0] == 3 && dl_read(by, v, 3) == DL_OK && memcmp(v, yf, sizeof v) == 0,
              "float targets' batch holds their bits: %s", dl_error_message(ctx));
        CHECK(by && dl_cross_entropy(dl_zeros(ctx, DL_SHAPE(3, 4)), by, NULL) == NULL, "cross entropy of float targets");
        EXPECT_ERR(ctx, DL_ERR_DTYPE, "dl_cross_entropy: target (3) has dtype float32; class-index targets must be int64");
        CHECK(dl_read_int64(y, got, 3) == DL_ERR_ARG, "dl_read_int64 of 1e30");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_read_int64: t (3) holds 1e+30 at index 2, which is not in int64's range");
    }
    {   /* device_data refuses -0 (a byte has no sign: its batches would differ from the host's in a bit) */
        float xv[4] = {1, -0.0f, 3, 4};
        int64_t yv[2] = {0, 1};
        dl_loader_desc ld;
        dl_tensor *x = dl_keep(dl_from_array(ctx, DL_SHAPE(2, 1, 1, 2), xv)), *y = dl_keep(dl_from_int64(ctx, DL_SHAPE(2), yv));
        memset(&ld, 0, sizeof ld);
        ld.batch_size = 2;
        ld.device_data = true;
        CHECK(dl_loader_new(ctx, dl_tensor_dataset(ctx, x, y, NULL, false), &ld) == NULL, "-0 refused");
        EXPECT_ERR(ctx, DL_ERR_ARG, "x holds -0 at flat index 1 (sample 0)");
    }
    dl_ctx_free(ctx);
}

/* 18. what a fourth hostile review found (2026-11-28, create_graph and
   dl_grad against torch 2.15); each case failed on the previous code */
static void test_review4_autograd(void)
{
    dl_ctx *ctx = new_ctx();
    float a[3] = {0.5f, -1.0f, 2.0f}, g3[3];
    dl_backward_desc cg;
    memset(&cg, 0, sizeof cg);
    cg.create_graph = true;
    {   /* the mark is the one an op was recorded with: z = sum(w + w.grad) made
           while w.grad is marked, then zeroed, gave 1 1 1 (torch 7 13 19, the
           Hessian's terms dropped); now refused */
        dl_tensor *w = dl_param(dl_from_array(ctx, DL_SHAPE(3), a)), *z;
        CHECK(dl_backward_ex(dl_sum(dl_pow(w, 3.0f), DL_ALL, false), &cg) == DL_OK, "marks w.grad");
        z = dl_sum(dl_add(w, w->grad), DL_ALL, false);
        dl_zero_grad(w);
        CHECK(dl_backward(z) == DL_ERR_GRAPH, "zeroed after the op was recorded: still refused");
        EXPECT_ERR(ctx, DL_ERR_GRAPH, "the graph goes through input 1 (3) of dl_add, computed from a parameter's ->grad");
        dl_free(w);
    }
    {   /* and the other way: recorded while the gradient was clean, a create_graph
           backward marking it later does not refuse (torch: v.grad = 1 1 1) */
        dl_tensor *w = dl_param(dl_from_array(ctx, DL_SHAPE(3), a)), *v, *z;
        CHECK(dl_backward(dl_sum(dl_mul(w, w), DL_ALL, false)) == DL_OK, "w.grad = 2 w");
        v = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), a), true);
        z = dl_sum(dl_add(v, w->grad), DL_ALL, false);
        CHECK(dl_backward_ex(dl_sum(dl_pow(w, 3.0f), DL_ALL, false), &cg) == DL_OK, "marked after");
        CHECK(dl_backward(z) == DL_OK && dl_read(v->grad, g3, 3) == DL_OK && g3[0] == 1 && g3[1] == 1 &&
              g3[2] == 1, "v.grad = 1 1 1: %s", dl_error_message(ctx));
        dl_free(w);
    }
    {   /* a seed computed from a marked gradient marks the leaf it reaches: p.grad =
           c w.grad had lost w's history, and a penalty on it went through silently
           (w.grad 0.75 3 12, torch 6.75 21 36) */
        dl_tensor *w = dl_param(dl_from_array(ctx, DL_SHAPE(3), a)), *p = dl_param(dl_from_array(ctx, DL_SHAPE(3), a));
        dl_tensor *c = dl_from_array(ctx, DL_SHAPE(3), a), *v = dl_ones(ctx, DL_SHAPE(3));
        dl_backward_desc sd = cg;
        CHECK(dl_backward_ex(dl_sum(dl_pow(w, 3.0f), DL_ALL, false), &cg) == DL_OK, "w.grad marked");
        sd.grad = w->grad;
        CHECK(dl_backward_ex(dl_mul(p, c), &sd) == DL_OK && p->grad && p->grad->nohist_, "p.grad marked too");
        CHECK(dl_backward(dl_sum(dl_mul(dl_add(p, p->grad), v), DL_ALL, false)) == DL_ERR_GRAPH,
              "a penalty on p.grad is refused");
        dl_clear_error(ctx);
        dl_free(w);
        dl_free(p);
    }
    dl_step_end(ctx);
    {   /* dl_grad with respect to a non-leaf walks (and frees) only the graph above it:
           a backward after it through what lies below worked in torch and was refused */
        dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), a), true), *h = dl_tanh(x), *gh = NULL;
        int i, ok;
        CHECK(dl_grad(dl_sum(dl_mul(h, h), DL_ALL, false), 1, &h, &gh, NULL) == DL_OK && gh, "dl_grad(sum h^2, h)");
        CHECK(dl_backward(dl_sum(h, DL_ALL, false)) == DL_OK && x->grad && dl_read(x->grad, g3, 3) == DL_OK,
              "then a backward through tanh: %s", dl_error_message(ctx));
        for (i = 0, ok = 1; i < 3; i++) ok &= fabsf(g3[i] - (1.0f - tanhf(a[i]) * tanhf(a[i]))) < 1e-6f;
        CHECK(ok, "x.grad = 1 - tanh^2: %g %g %g", (double)g3[0], (double)g3[1], (double)g3[2]);
        /* after a backward freed what is below h, dl_grad(., h) still works (torch: 2 tanh x) */
        gh = NULL;
        CHECK(dl_grad(dl_sum(dl_mul(h, h), DL_ALL, false), 1, &h, &gh, NULL) == DL_OK && gh &&
              dl_read(gh, g3, 3) == DL_OK && fabsf(g3[2] - 2.0f * tanhf(2.0f)) < 1e-6f,
              "dl_grad above a freed graph: %s", dl_error_message(ctx));
        {   /* below h2 = w + w.grad (marked) is not walked: dl_grad(sum h2^2, h2) = 2 h2 */
            dl_tensor *w = dl_param(dl_from_array(ctx, DL_SHAPE(3), a)), *h2, *x2 = h;
            CHECK(dl_backward_ex(dl_sum(dl_pow(w, 3.0f), DL_ALL, false), &cg) == DL_OK, "w.grad marked");
            h2 = dl_add(w, w->grad);
            gh = NULL;
            CHECK(dl_grad(dl_sum(dl_mul(h2, h2), DL_ALL, false), 1, &h2, &gh, NULL) == DL_OK && gh &&
                  dl_read(gh, g3, 3) == DL_OK && g3[0] == 2.5f && g3[1] == 4.0f && g3[2] == 28.0f,
                  "dl_grad(., h2) above a marked gradient: %g %g %g", (double)g3[0], (double)g3[1], (double)g3[2]);
            /* on an error no result is left half-made */
            gh = x2;
            CHECK(dl_grad(dl_sum(dl_mul(w, h2), DL_ALL, false), 1, &w, &gh, NULL) == DL_ERR_GRAPH && gh == NULL,
                  "a refused dl_grad leaves its results NULL");
            dl_clear_error(ctx);
            dl_free(w);
        }
    }
    {   /* x^-0.5 at -0 and -inf as torch's rsqrt (-inf, NaN: powf gave +inf, 0), and so
           x^0.5's gradient at -0 (-inf) */
        float v[2] = {-0.0f, -INFINITY}, y[2];
        dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), v), true);
        CHECK(dl_read(dl_pow(x, -0.5f), y, 2) == DL_OK && isinf(y[0]) && y[0] < 0 && isnan(y[1]),
              "pow(-0, -0.5) = %g, pow(-inf, -0.5) = %g (torch -inf, nan)", (double)y[0], (double)y[1]);
        CHECK(dl_backward(dl_sum(dl_pow(x, 0.5f), DL_ALL, false)) == DL_OK && dl_read(x->grad, y, 2) == DL_OK &&
              isinf(y[0]) && y[0] < 0, "d sqrt(x) at -0: %g (torch -inf)", (double)y[0]);
    }
    {   /* batch norm's running mean of a channel whose first value is inf: inf, as
           torch's (the shifted sums made it NaN); a NaN channel stays NaN */
        float v[8] = {INFINITY, 1, 1, 2, 3, 4, 5, 6}, rmv[2], rvv[2];
        int k;
        for (k = 0; k < 2; k++) {
            dl_tensor *rm = dl_keep(dl_zeros(ctx, DL_SHAPE(2))), *rv = dl_keep(dl_ones(ctx, DL_SHAPE(2)));
            v[0] = k ? NAN : INFINITY;
            CHECK(dl_batch_norm(dl_from_array(ctx, DL_SHAPE(2, 2, 2), v), rm, rv, NULL, NULL, true, 0.1f, 1e-5f) &&
                  dl_read(rm, rmv, 2) == DL_OK && dl_read(rv, rvv, 2) == DL_OK, "bn with %s", k ? "NaN" : "inf");
            CHECK((k ? isnan(rmv[0]) : isinf(rmv[0]) && rmv[0] > 0) && isnan(rvv[0]) && fabsf(rmv[1] - 0.35f) < 1e-6f &&
                  fabsf(rvv[1] - 1.4666667f) < 1e-5f, "running stats %g %g %g %g (torch %s nan 0.35 1.4667)",
                  (double)rmv[0], (double)rvv[0], (double)rmv[1], (double)rvv[1], k ? "nan" : "inf");
            dl_free(rm);
            dl_free(rv);
        }
    }
    dl_step_end(ctx);
    {   /* dl_zero_grad of a step leaf's gradient with history (create_graph): an op
           recorded after it reads zeros, so no gradient goes through the old history
           (it gave the old 6x; torch: 0), one recorded before keeps it (torch: 6x) */
        float xv[2] = {0.5f, -1.0f};
        dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), xv), true), *g, *h0, *h, *gx = NULL;
        CHECK(dl_backward_ex(dl_sum(dl_pow(x, 3.0f), DL_ALL, false), &cg) == DL_OK && x->grad, "x.grad = 3x^2");
        g = x->grad;
        h0 = dl_sum(g, DL_ALL, false);
        dl_zero_grad(x);
        h = dl_sum(g, DL_ALL, false);
        CHECK(dl_grad(h, 1, &x, &gx, NULL) == DL_OK && (gx == NULL || (dl_read(gx, g3, 2) == DL_OK && g3[0] == 0 &&
              g3[1] == 0)), "after dl_zero_grad: no gradient through the old history");
        gx = NULL;
        CHECK(dl_grad(h0, 1, &x, &gx, NULL) == DL_OK && gx && dl_read(gx, g3, 2) == DL_OK && g3[0] == 3.0f &&
              g3[1] == -6.0f, "recorded before dl_zero_grad: 6x as torch (%g %g)", (double)g3[0], (double)g3[1]);
    }
    {   /* the cut is decided when an op is recorded, for every input: a custom
           function's (its node's versions are its saved tensors'), an op's 8th
           input and later (versions kept for 7), an op recorded between two
           zero_grads (the second moved the cut past it): torch 0, 7 7 and 1 1;
           these took the old history's 6x */
        float xv[2] = {0.5f, -1.0f};
        dl_function idf = {"identity", id_fwd, id_bwd};
        dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), xv), true), *g, *h, *gx = NULL, *cat[8];
        int k;
        CHECK(dl_backward_ex(dl_sum(dl_pow(x, 3.0f), DL_ALL, false), &cg) == DL_OK && x->grad, "x.grad = 3x^2");
        g = x->grad;
        dl_zero_grad(x);
        h = dl_sum(dl_function_apply(&idf, 1, &g, NULL), DL_ALL, false);
        CHECK(h && dl_grad(h, 1, &x, &gx, NULL) == DL_OK && (gx == NULL || (dl_read(gx, g3, 2) == DL_OK &&
              g3[0] == 0 && g3[1] == 0)), "a custom function after dl_zero_grad: no gradient through the history");
        for (k = 0; k < 7; k++) cat[k] = x;
        cat[7] = g;
        h = dl_sum(dl_cat(8, cat, 0), DL_ALL, false);
        gx = NULL;
        CHECK(h && dl_grad(h, 1, &x, &gx, NULL) == DL_OK && gx && dl_read(gx, g3, 2) == DL_OK && g3[0] == 7 &&
              g3[1] == 7, "dl_cat's 8th input zeroed: 7 7 as torch (%g %g)", (double)g3[0], (double)g3[1]);
        h = dl_sum(dl_add(dl_mul_scalar(x, 1.0f), g), DL_ALL, false);
        dl_zero_grad(x);
        gx = NULL;
        CHECK(h && dl_grad(h, 1, &x, &gx, NULL) == DL_OK && gx && dl_read(gx, g3, 2) == DL_OK && g3[0] == 1 &&
              g3[1] == 1, "recorded between two dl_zero_grads: 1 1 as torch (%g %g)", (double)g3[0], (double)g3[1]);
    }
    {   /* dl_grad of an out whose graph a backward freed, when no freed node is needed:
           grad(y, [y]) is the seed (torch), not "already freed" */
        float xv[2] = {1.0f, 1.5f}, sv[2] = {2.0f, 3.0f};
        dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), xv), true), *y = dl_mul(x, x), *gy = NULL;
        dl_backward_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.grad = dl_from_array(ctx, DL_SHAPE(2), sv);
        CHECK(dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK, "a backward frees y's graph");
        CHECK(dl_grad(y, 1, &y, &gy, &sd) == DL_OK && gy && dl_read(gy, g3, 2) == DL_OK && g3[0] == 2 && g3[1] == 3,
              "dl_grad(y, [y]) after: the seed: %s", dl_error_message(ctx));
        gy = NULL;
        CHECK(dl_grad(y, 1, &x, &gy, &sd) == DL_ERR_GRAPH, "dl_grad(y, [x]) needs the freed node");
        EXPECT_ERR(ctx, DL_ERR_GRAPH, "already freed");
    }
    {   /* a backward of an out computed only from a marked gradient names the mark, not
           "does not require grad" */
        dl_tensor *w = dl_param(dl_from_array(ctx, DL_SHAPE(3), a));
        CHECK(dl_backward_ex(dl_sum(dl_pow(w, 3.0f), DL_ALL, false), &cg) == DL_OK, "w.grad marked");
        CHECK(dl_backward(dl_sum(dl_mul(w->grad, w->grad), DL_ALL, false)) == DL_ERR_GRAPH, "refused");
        EXPECT_ERR(ctx, DL_ERR_GRAPH, "was computed from a parameter's ->grad that a create_graph backward summed "
                   "into without its history");
        dl_free(w);
    }
    dl_ctx_free(ctx);
}

/* 19. a fifth review (2026-11-29): objects freed early leave husks (a later
   use is an error, a second free nothing, under ASan and valgrind clean);
   tensors of another context; values that poisoned state silently */
static dl_tensor *r5_fwd_null(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *u)
{
    (void)fc; (void)n; (void)in; (void)u;
    return NULL;
}
static dl_tensor *r5_fwd_id(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *u)
{
    (void)fc; (void)n; (void)u;
    return dl_mul_scalar(in[0], 1.0f);
}
static dl_result r5_bwd_other(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gi, void *u)
{
    (void)fc; (void)g;
    gi[0] = dl_ones((dl_ctx *)u, DL_SHAPE(2));   /* another context's tensor */
    return DL_OK;
}
static dl_tensor *r5_sq(void *u, dl_tensor *const *in)
{
    (void)u;
    return dl_sum(dl_mul(in[0], in[0]), DL_ALL, false);
}

static void test_review5(void)
{
    dl_ctx *A = new_ctx(), *B = new_ctx();
    {   /* a dataset of another context's tensors: accepted, then read freed memory */
        static const int64_t lab[8] = {0, 1, 0, 1, 0, 1, 0, 1};
        dl_tensor *x = dl_keep(dl_rand(B, DL_SHAPE(8, 3))), *y = dl_keep(dl_from_int64(B, DL_SHAPE(8), lab));
        dl_dataset *ds;
        CHECK(dl_tensor_dataset(A, x, y, NULL, true) == NULL, "dataset of B's tensors in A refused");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_tensor_dataset: x (8,3) belongs to another context than ctx");
        CHECK(dl_tensor_dataset(A, NULL, y, NULL, true) == NULL, "NULL x");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_tensor_dataset: x is NULL");
        ds = dl_tensor_dataset(B, x, y, NULL, true);
        CHECK(ds && dl_loader_new(A, ds, NULL) == NULL, "B's dataset in A's loader refused");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_loader_new: the dataset (dl_tensor_dataset) belongs to another context");
    }
    {   /* an optimizer freed early */
        dl_tensor *p = dl_param(dl_ones(A, DL_SHAPE(2)));
        dl_module *m = dl_nn_linear(A, 2, 2, true);
        dl_optim *o = dl_sgd_params(A, 1, &p, NULL);
        CHECK(dl_optim_group_lr(o, 5) == 0.0f, "group 5 of 1");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_optim_group_lr: group 5 does not exist (0..0)");
        dl_optim_free(o);
        CHECK(dl_optim_steps(o) == 0, "steps of a freed optimizer");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_optim_steps: this optimizer was freed (dl_optim_free)");
        CHECK(dl_optim_step(o) == DL_ERR_ARG, "step of a freed optimizer");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_optim_step: this optimizer was freed");
        dl_optim_zero_grad(o);
        EXPECT_ERR(A, DL_ERR_ARG, "dl_optim_zero_grad: this optimizer was freed");
        CHECK(dl_save(tmp("r5.safetensors"), m, o) == DL_ERR_ARG, "dl_save with a freed optimizer");
        EXPECT_ERR(A, DL_ERR_ARG, "o is not an optimizer of this context (it was freed: dl_optim_free)");
        dl_optim_free(o);   /* a second free: nothing */
        CHECK(dl_last_error(A) == DL_OK, "a second dl_optim_free is a no-op");
        o = dl_sgd_params(B, 1, &p, NULL);   /* p of A: refused */
        CHECK(o == NULL, "B's optimizer over A's parameter refused");
        dl_clear_error(B);
        {
            dl_tensor *q = dl_param(dl_ones(B, DL_SHAPE(2)));
            dl_optim *ob = dl_sgd_params(B, 1, &q, NULL);
            CHECK(dl_save(tmp("r5.safetensors"), m, ob) == DL_ERR_ARG, "dl_save(module of A, optimizer of B)");
            EXPECT_ERR(A, DL_ERR_ARG, "o is not an optimizer of this context");
        }
        CHECK(dl_module_forward(m, dl_ones(B, DL_SHAPE(1, 2))) == NULL, "module of A, x of B");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_module_forward: x (1,2) belongs to another context than module");
    }
    {   /* a summary writer closed twice (PyTorch's close() is idempotent), then used */
        dl_summary_writer *w = dl_summary_open(A, tmp("r5_tb"));
        CHECK(w && dl_summary_scalar(w, "loss", 0, 1.0) == DL_OK, "writer: %s", dl_error_message(A));
        CHECK(dl_summary_close(w) == DL_OK && dl_summary_close(w) == DL_OK, "closed twice");
        CHECK(dl_summary_scalar(w, "loss", 1, 1.0) == DL_ERR_ARG, "a scalar after close");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_summary_scalar: this summary writer was closed (dl_summary_close)");
        CHECK(dl_summary_flush(w) == DL_ERR_ARG, "flush after close");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_summary_flush: this summary writer was closed");
    }
    {   /* a communicator freed twice, then used */
        dl_comm *c = dl_comm_init(A, NULL);
        dl_tensor *t = dl_ones(A, DL_SHAPE(2));
        CHECK(c != NULL, "local communicator");
        dl_comm_free(c);
        dl_comm_free(c);
        CHECK(dl_comm_allreduce(c, &t, 1, DL_REDUCE_SUM) == DL_ERR_ARG, "allreduce on a freed communicator");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_comm_allreduce: this communicator was freed (dl_comm_free)");
    }
    {   /* a dl_ddp freed twice, then used */
        dl_ctx_desc cd;
        dl_ctx *D;
        dl_module *r[2];
        dl_optim *op[2];
        dl_ddp *dp;
        dl_sgd_desc sd;
        int i;
        memset(&cd, 0, sizeof cd);
        cd.log = dl_log_silent;
        cd.cpu_devices = 2;
        D = dl_ctx_init(&cd);
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.1f;
        for (i = 0; i < 2; i++) {
            r[i] = dl_nn_linear(D, 3, 2, true);
            CHECK(dl_module_to(r[i], dl_cpu_device(i)) == DL_OK, "to cpu:%d: %s", i, dl_error_message(D));
            op[i] = dl_sgd(r[i], &sd);
        }
        dp = dl_ddp_init(2, r, op, NULL);
        CHECK(dp != NULL, "dl_ddp_init: %s", dl_error_message(D));
        dl_ddp_free(dp);
        dl_ddp_free(dp);
        CHECK(dl_ddp_check(dp) != DL_OK, "dl_ddp_check on a freed dl_ddp");
        EXPECT_ERR(D, DL_ERR_ARG, "dl_ddp_check: this dl_ddp was freed (dl_ddp_free)");
        dl_ctx_free(D);
    }
    {   /* the functional batch norm's momentum, checked as the module's */
        dl_tensor *x = dl_rand(A, DL_SHAPE(4, 3)), *rm = dl_zeros(A, DL_SHAPE(3)), *rv = dl_ones(A, DL_SHAPE(3));
        float bad[] = {NAN, INFINITY, 2.0f, -1.0f}, got[3];
        int i;
        for (i = 0; i < 4; i++) {
            CHECK(dl_batch_norm(x, rm, rv, NULL, NULL, true, bad[i], 1e-5f) == NULL, "momentum %g", (double)bad[i]);
            EXPECT_ERR(A, DL_ERR_ARG, "dl_batch_norm: momentum=");
        }
        CHECK(dl_read(rm, got, 3) == DL_OK && got[0] == 0 && got[2] == 0, "running_mean untouched");
        CHECK(dl_batch_norm(x, rm, rv, NULL, NULL, false, NAN, 1e-5f) != NULL, "eval ignores momentum");
    }
    {   /* custom functions: a NULL forward result, a gradient of another context */
        dl_tensor *p = dl_param(dl_ones(A, DL_SHAPE(2))), *y;
        dl_function f = {"r5fn", r5_fwd_null, r5_bwd_other};
        CHECK(dl_function_apply(&f, 1, &p, B) == NULL, "forward returned NULL");
        EXPECT_ERR(A, DL_ERR_ARG, "r5fn: its forward returned NULL without an error");
        f.forward = r5_fwd_id;
        y = dl_function_apply(&f, 1, &p, B);
        CHECK(y && dl_backward(dl_sum(y, DL_ALL, false)) == DL_ERR_ARG, "a gradient of B for A's input");
        EXPECT_ERR(A, DL_ERR_ARG, "the gradient for input 0 (2) belongs to another context than the input");
    }
    {   /* values that poisoned state without a word */
        static const int64_t lab4[4] = {0, 1, 0, 1};
        dl_tensor *p = dl_param(dl_ones(A, DL_SHAPE(2))), *w = dl_param(dl_zeros(A, DL_SHAPE(2, 2)));
        dl_module *m = dl_nn_linear(A, 3, 2, true);
        dl_tensor *x = dl_keep(dl_rand(A, DL_SHAPE(4, 3))), *x3 = dl_keep(dl_rand(A, DL_SHAPE(4, 2, 2)));
        dl_tensor *y = dl_keep(dl_from_int64(A, DL_SHAPE(4), lab4));
        dl_transform_desc tr;
        dl_gradcheck_desc gd;
        dl_gradcheck_result res;
        dl_memory_stats ms;
        float v[4], g0[2];
        CHECK(dl_backward(dl_sum(dl_mul(p, p), DL_ALL, false)) == DL_OK, "p.grad");
        dl_sgd_update(p, NAN);
        EXPECT_ERR(A, DL_ERR_ARG, "dl_sgd_update: lr=nan must be finite");
        CHECK(dl_read(p, v, 2) == DL_OK && v[0] == 1 && v[1] == 1, "p unchanged");
        CHECK(dl_backward(dl_sum(dl_module_forward(m, x), DL_ALL, false)) == DL_OK, "grads");
        dl_read(dl_module_get(m, "bias")->grad, g0, 2);
        CHECK(dl_clip_grad_norm(m, NAN) == 0.0f, "max_norm NaN");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_clip_grad_norm: max_norm=nan must be >= 0");
        CHECK(dl_clip_grad_norm(m, -1.0f) == 0.0f, "max_norm -1");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_clip_grad_norm: max_norm=-1 must be >= 0");
        {
            dl_tensor *ps[2];
            ps[0] = dl_module_get(m, "bias");
            ps[1] = NULL;
            CHECK(dl_clip_grad_norm_params(A, 1, ps, -1.0f) == 0.0f, "list, max_norm -1");
            EXPECT_ERR(A, DL_ERR_ARG, "dl_clip_grad_norm_params: max_norm=-1 must be >= 0");
            CHECK(dl_clip_grad_norm_params(A, 2, ps, 1.0f) == 0.0f, "list with a NULL");
            EXPECT_ERR(A, DL_ERR_ARG, "dl_clip_grad_norm_params: params[1] is NULL");
            CHECK(dl_clip_grad_norm_params(A, -1, ps, 1.0f) == 0.0f, "n -1");
            EXPECT_ERR(A, DL_ERR_ARG, "dl_clip_grad_norm_params: n=-1 with params given");
            CHECK(dl_clip_grad_norm_params(A, 2, NULL, 1.0f) == 0.0f, "params NULL");
            EXPECT_ERR(A, DL_ERR_ARG, "dl_clip_grad_norm_params: n=2 with params NULL");
            CHECK(dl_clip_grad_norm_params(NULL, 1, ps, 1.0f) == 0.0f, "ctx NULL");
            CHECK(dl_last_error(NULL) == DL_ERR_ARG && strstr(dl_error_message(NULL), "dl_clip_grad_norm_params: ctx is NULL"),
                  "ctx NULL: %s", dl_error_message(NULL));
        }
        CHECK(dl_read(dl_module_get(m, "bias")->grad, v, 2) == DL_OK && v[0] == g0[0] && v[1] == g0[1],
              "gradients unchanged");
        dl_init_uniform(w, 1.0f, -1.0f);
        EXPECT_ERR(A, DL_ERR_ARG, "dl_init_uniform: lo=1, hi=-1: need finite bounds with lo <= hi");
        dl_init_uniform(w, NAN, 1.0f);
        EXPECT_ERR(A, DL_ERR_ARG, "dl_init_uniform: lo=nan");
        dl_init_normal(w, 0.0f, -1.0f);
        EXPECT_ERR(A, DL_ERR_ARG, "dl_init_normal: mean=0, std=-1");
        CHECK(dl_read(w, v, 4) == DL_OK && v[0] == 0 && v[3] == 0, "w unchanged");
        memset(&tr, 0, sizeof tr);
        tr.std = NAN;
        CHECK(dl_tensor_dataset(A, x, y, &tr, true) == NULL, "transform std NaN");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_tensor_dataset: transform scale=0, mean=0, std=nan");
        tr.std = 1e-45f;   /* 1/std is inf */
        CHECK(dl_tensor_dataset(A, x, y, &tr, true) == NULL, "transform std 1e-45");
        EXPECT_ERR(A, DL_ERR_ARG, "and 1/std too");
        tr.std = 0.0f;
        tr.scale = INFINITY;
        CHECK(dl_tensor_dataset(A, x, y, &tr, true) == NULL, "transform scale inf");
        EXPECT_ERR(A, DL_ERR_ARG, "scale=inf");
        tr.scale = 0.0f;
        tr.hflip = true;
        CHECK(dl_tensor_dataset(A, x, y, &tr, true) == NULL, "hflip of (N, 3) samples");
        EXPECT_ERR(A, DL_ERR_ARG, "the transform's hflip needs image samples, x (N, H, W) or (N, C, H, W), and x is (4,3)");
        CHECK(dl_tensor_dataset(A, x3, y, &tr, true) != NULL, "hflip of (N, 2, 2) samples: %s", dl_error_message(A));
        memset(&gd, 0, sizeof gd);
        gd.eps = INFINITY;
        CHECK(dl_gradcheck(A, r5_sq, NULL, 1, &p, &gd, &res) == DL_ERR_ARG, "gradcheck eps inf");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_gradcheck: eps=inf");
        gd.eps = -1.0;
        CHECK(dl_gradcheck(A, r5_sq, NULL, 1, &p, &gd, &res) == DL_ERR_ARG, "gradcheck eps -1");
        EXPECT_ERR(A, DL_ERR_ARG, "need 0 <= eps < 1");
        gd.eps = 0.0;
        gd.atol = -1.0;
        CHECK(dl_gradcheck(A, r5_sq, NULL, 1, &p, &gd, &res) == DL_ERR_ARG, "gradcheck atol -1");
        EXPECT_ERR(A, DL_ERR_ARG, "atol=-1");
        CHECK(dl_gradcheck(A, NULL, NULL, 1, &p, NULL, &res) == DL_ERR_ARG, "gradcheck f NULL");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_gradcheck: f is NULL");
        gd.atol = 0.0;
        CHECK(dl_gradcheck(A, r5_sq, NULL, 1, &p, &gd, &res) == DL_OK && res.ok, "the defaults still pass");
        CHECK(dl_memory_stats_get(A, dl_cpu(), NULL) == DL_ERR_ARG, "memory stats into NULL");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_memory_stats_get: out is NULL");
        CHECK(dl_memory_stats_get(A, dl_cpu(), &ms) == DL_OK, "memory stats");
        CHECK(dl_write(dl_zeros(A, DL_SHAPE(2, 2)), NULL, 4) == DL_ERR_ARG, "write from NULL");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_write: src is NULL (t (2,2), n 4)");
        CHECK(dl_write(x, v, 4) == DL_ERR_ARG, "write of 4 into 12");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_write: t (4,3) has 12 elements but src holds 4");
        CHECK(dl_read(p, NULL, 2) == DL_ERR_ARG, "read into NULL");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_read: dst is NULL (t (2), n 2)");
    }
    {   /* pooling modules check their settings when made (were accepted, refused at the first forward) */
        dl_pool_desc d = dl_pool_desc_make(0, 0, 0, false, true);
        CHECK(dl_nn_max_pool2d(A, &d) == NULL, "max pool of kernel 0");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_nn_max_pool2d: kernel[0]=0 must be >= 1");
        CHECK(dl_nn_adaptive_avg_pool2d(A, DL_SHAPE(-1, 1)) == NULL, "adaptive pool to (-1, 1)");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_nn_adaptive_avg_pool2d: output_size (-1,1) has a negative entry");
        CHECK(dl_nn_adaptive_avg_pool3d(A, DL_SHAPE(2, 2)) == NULL, "adaptive 3-d pool to (2, 2)");
        EXPECT_ERR(A, DL_ERR_ARG, "output_size (2,2) has 2 entries; it needs one per spatial dim (3)");
        d = dl_pool_desc_make(2, 2, 0, false, true);
        d.dilation[1] = 2;
        CHECK(dl_nn_avg_pool2d(A, &d) == NULL, "avg pool with a dilation");
        EXPECT_ERR(A, DL_ERR_ARG, "dl_nn_avg_pool2d: dilation[1]=2: dilation applies to max pooling only");
        CHECK(dl_nn_max_pool2d(A, &d) != NULL && dl_last_error(A) == DL_OK, "max pool with that dilation: fine");
    }
    {   /* an IDX file longer than its dims: said so, not "truncated" */
        static const unsigned char idx[] = {0, 0, 8, 1, 0, 0, 0, 2, 7, 8, 9};   /* u8, 1 dim of 2: one byte too many */
        FILE *f = fopen(tmp("r5_long.idx"), "wb");
        dl_tensor *t = NULL;
        CHECK(f && fwrite(idx, 1, sizeof idx, f) == sizeof idx && fclose(f) == 0, "wrote the IDX file");
        CHECK(dl_idx_load(A, tmp("r5_long.idx"), DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "a file too long refused");
        EXPECT_ERR(A, DL_ERR_FORMAT, "its dims need 2 bytes of data but the file has 3 (bytes after the data");
    }
    {   /* DL_CPU_DEVICES takes digits only, as DL_STRICT ("+2", " 2" were 2) */
        const char *old = getenv("DL_CPU_DEVICES"), *bad[2] = {" 2", "+2"};
        char keep[64];
        int i;
        snprintf(keep, sizeof keep, "%s", old ? old : "");
        for (i = 0; i < 2; i++) {
            setenv("DL_CPU_DEVICES", bad[i], 1);
            CHECK(dl_ctx_init(NULL) == NULL && strstr(dl_error_message(NULL), "DL_CPU_DEVICES=") != NULL,
                  "DL_CPU_DEVICES='%s' refused: %s", bad[i], dl_error_message(NULL));
        }
        if (old) setenv("DL_CPU_DEVICES", keep, 1);
        else unsetenv("DL_CPU_DEVICES");
    }
    dl_ctx_free(B);
    dl_ctx_free(A);
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
    test_save();
    test_optim_values();
    test_null_returns_have_messages();
    test_huge_conv();
    test_error_lifetime();
    test_gzip_bomb();
    test_use_after_free();
    test_threads_clamped();
    test_dot_names();
    test_custom_grad_checks();
    test_deep_checkpoint();
    test_review2_autograd();
    test_review2_values();
    test_review2_files();
    test_review2_modules();
    test_review3_capture();
    test_header_owner_race();
    test_review3_values();
    test_review3_data();
    test_review4_autograd();
    test_review5();
    TEST_END();
}
