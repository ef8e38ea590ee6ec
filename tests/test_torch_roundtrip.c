/* tests/test_torch_roundtrip.c - checkpoints both ways with PyTorch.

   (a) examples/lenet.c's LeNet-BN, trained a few steps on random data, saved
       with dl_save_module; tests/torch_roundtrip.py loads it into its PyTorch
       twin (nn.Sequential with the same indices) with
       safetensors.torch.load_file + load_state_dict(strict=True) and checks
       that its eval logits for a fixed batch equal dl.h's (rtol 1e-4).
   (b) the script saves a trained PyTorch twin with safetensors.torch.save_file
       and its logits; dl_load_module reads it and dl.h's logits must match.
   (c) files with a missing, an extra and a mis-shaped key: DL_ERR_FORMAT
       naming the key, and the module left as it was.
   Needs python3 with torch and safetensors (run via system(); files under
   build/); without them the test prints a SKIP line and
   "0 passed, 0 failed, 1 skipped". Run from the repository root;
   DL_RT_VERBOSE=1 prints the messages of (c). */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/lenet_bn.h"   /* ex_lenet_bn: examples/lenet.c's model */
#include "harness.h"
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define NB 4   /* the fixed batch */

static char g_dir[128];

static const char *path_in(const char *name)
{
    static char buf[4][256];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 256, "%s/%s", g_dir, name);
    return b;
}


static int write_f32(const char *path, const float *v, size_t n)
{
    FILE *f = fopen(path, "wb");
    size_t i, ok = 1;
    if (!f) return 0;
    for (i = 0; i < n && ok; i++) {   /* little-endian, whatever the host */
        uint32_t u;
        unsigned char b[4];
        memcpy(&u, &v[i], 4);
        b[0] = (unsigned char)u; b[1] = (unsigned char)(u >> 8); b[2] = (unsigned char)(u >> 16); b[3] = (unsigned char)(u >> 24);
        ok = fwrite(b, 1, 4, f) == 4;
    }
    return fclose(f) == 0 && ok;
}

static int read_f32(const char *path, float *v, size_t n)
{
    FILE *f = fopen(path, "rb");
    size_t i, ok = 1;
    if (!f) return 0;
    for (i = 0; i < n && ok; i++) {
        unsigned char b[4];
        uint32_t u;
        ok = fread(b, 1, 4, f) == 4;
        u = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        memcpy(&v[i], &u, 4);
    }
    ok = ok && fgetc(f) == EOF;   /* exactly n values */
    fclose(f);
    return (int)ok;
}

/* eval-mode logits (NB,10) of x */
static int logits(dl_module *net, dl_tensor *x, float *out)
{
    dl_ctx *ctx = dl_module_ctx(net);
    dl_tensor *y;
    int ok;
    dl_module_train(net, false);
    dl_no_grad_begin(ctx);
    y = dl_module_forward(net, x);
    dl_no_grad_end(ctx);
    ok = y && y->ndim == 2 && y->shape[0] == NB && y->shape[1] == 10 && dl_read(y, out, NB * 10) == DL_OK;
    dl_module_train(net, true);
    return ok;
}

static void cmp_logits(const char *what, const float *got, const float *want)
{
    long where = -1;
    int ok = th_close(got, want, NB * 10, 1e-4, 1e-5, &where);
    CHECK(ok, "%s: logit %ld: dl %.9g, torch %.9g", what, where, where >= 0 ? (double)got[where] : 0.0,
          where >= 0 ? (double)want[where] : 0.0);
}

int main(void)
{
    dl_ctx *ctx;
    dl_module *net, *twin;
    dl_optim *o;
    dl_tensor *xin;
    float xv[NB * 28 * 28], c_logits[NB * 10], t_logits[NB * 10], got[NB * 10];
    char cmd[512];
    int i, py;

    if (system("python3 -c \"import torch, safetensors\" >/dev/null 2>&1") != 0) {
        printf("SKIP torch round trip: python3 with torch and safetensors not found "
               "(pip install torch safetensors)\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 0;
    }
    snprintf(g_dir, sizeof g_dir, "build/torch_rt_%ld", (long)getpid());
    if (mkdir(g_dir, 0700) != 0) {
        CHECK(0, "cannot make %s (run from the repository root after make)", g_dir);
        TEST_END();
    }
    ctx = dl_ctx_init(&(dl_ctx_desc){.log = dl_log_silent, .seed = 42});
    CHECK(ctx != NULL, "dl_ctx_init");
    if (!ctx) TEST_END();

    /* (a) train a few steps in C, save, write the fixed batch and its logits */
    net = ex_lenet_bn(ctx);
    o = net ? dl_adam(net, &(dl_adam_desc){.lr = 1e-2f}) : NULL;
    CHECK(net && o, "LeNet-BN: %s", dl_error_message(ctx));
    if (!net || !o) { dl_ctx_free(ctx); TEST_END(); }
    for (i = 0; i < 3; i++) {
        int64_t t[8], k;
        dl_tensor *x = dl_randn(ctx, DL_SHAPE(8, 1, 28, 28));
        for (k = 0; k < 8; k++) t[k] = (k * 7 + i) % 10;
        dl_optim_zero_grad(o);
        CHECK(dl_backward(dl_cross_entropy(dl_module_forward(net, x), dl_from_int64(ctx, DL_SHAPE(8), t), NULL)) == DL_OK &&
              dl_optim_step(o) == DL_OK, "training step %d: %s", i, dl_error_message(ctx));
        dl_step_end(ctx);
    }
    xin = dl_keep(dl_randn(ctx, DL_SHAPE(NB, 1, 28, 28)));
    CHECK(xin && dl_read(xin, xv, NB * 28 * 28) == DL_OK, "input: %s", dl_error_message(ctx));
    CHECK(logits(net, xin, c_logits), "dl.h logits: %s", dl_error_message(ctx));
    CHECK(dl_save_module(path_in("c_lenet.safetensors"), net) == DL_OK, "dl_save_module: %s", dl_error_message(ctx));
    CHECK(write_f32(path_in("input.f32"), xv, NB * 28 * 28) && write_f32(path_in("c_logits.f32"), c_logits, NB * 10),
          "writing the batch and the logits under %s", g_dir);
    dl_clear_error(ctx);
    dl_step_end(ctx);

    /* (a) checked by PyTorch; it writes (b) and (c) */
    snprintf(cmd, sizeof cmd, "python3 tests/torch_roundtrip.py %s", g_dir);
    fflush(stdout);
    py = system(cmd);
    CHECK(py == 0, "%s failed (status %d): PyTorch did not load the dl.h checkpoint with the same logits "
          "(its FAIL lines are above)", cmd, py);

    /* (b) the PyTorch-written state_dict, with dl_load_module */
    /* (b) and (c) run when the script got that far, even after an (a) failure */
    twin = ex_lenet_bn(ctx);
    {
        FILE *f = fopen(path_in("misshaped.safetensors"), "rb");
        CHECK(f != NULL, "the script wrote no files for (b) and (c)");
        if (f) fclose(f);
        else twin = NULL;
    }
    if (twin) {
        dl_result r = dl_load_module(path_in("torch_lenet.safetensors"), twin);
        dl_tensor *nbt = dl_module_get(twin, "1.num_batches_tracked");
        int64_t n = -1;
        CHECK(r == DL_OK, "dl_load_module of the torch file: %s", dl_error_message(ctx));
        CHECK(nbt && nbt->dtype == DL_DTYPE_I64 && dl_read_int64(nbt, &n, 1) == DL_OK && n == 2,
              "1.num_batches_tracked from torch: %lld, want 2", (long long)n);
        CHECK(read_f32(path_in("torch_logits.f32"), t_logits, NB * 10), "reading torch_logits.f32");
        CHECK(logits(twin, xin, got), "logits of the loaded module: %s", dl_error_message(ctx));
        cmp_logits("PyTorch state_dict loaded by dl_load_module", got, t_logits);
        dl_clear_error(ctx);
        dl_step_end(ctx);

        /* (c) a missing, an extra and a mis-shaped key */
        {
            static const char *const files[3] = {"missing.safetensors", "extra.safetensors", "misshaped.safetensors"};
            static const char *const keys[3] = {"12.bias", "16.weight", "9.weight"};
            static unsigned char before[300000], after[300000];
            size_t nb = th_module_bytes(twin, before, sizeof before);
            int k;
            CHECK(nb > 0, "snapshot");
            for (k = 0; k < 3; k++) {
                dl_result rc = dl_load_module(path_in(files[k]), twin);
                const char *msg = dl_error_message(ctx);
                if (getenv("DL_RT_VERBOSE")) printf("%s: %s\n", files[k], msg);
                CHECK(rc == DL_ERR_FORMAT && dl_last_error(ctx) == DL_ERR_FORMAT,
                      "%s: %s, want DL_ERR_FORMAT", files[k], dl_result_string(rc));
                CHECK(strstr(msg, keys[k]) != NULL, "%s: the message does not name '%s': \"%s\"", files[k], keys[k], msg);
                if (k == 2)
                    CHECK(strstr(msg, "120") && strstr(msg, "399"), "mis-shaped: both shapes named: \"%s\"", msg);
                dl_clear_error(ctx);
                CHECK(th_module_bytes(twin, after, sizeof after) == nb && memcmp(before, after, nb) == 0,
                      "%s: a refused load changed the module", files[k]);
            }
        }
    }
    dl_ctx_free(ctx);
    if (!th_fail) {
        static const char *const all[] = {"c_lenet.safetensors", "input.f32", "c_logits.f32", "torch_lenet.safetensors",
                                          "torch_logits.f32", "missing.safetensors", "extra.safetensors",
                                          "misshaped.safetensors"};
        for (i = 0; i < (int)(sizeof all / sizeof all[0]); i++) remove(path_in(all[i]));
        rmdir(g_dir);
    } else {
        printf("files kept in %s\n", g_dir);
    }
    TEST_END();
}
