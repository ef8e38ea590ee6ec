/* tests/test_devices.c - devices: every op forward and backward on a strict
   virtual CPU device (cpu:1, tagged pointers: a host dereference faults)
   gives the same bits as on cpu:0; mixed devices are errors naming both;
   dl_to and its gradient; dl_module_to then training; save on one device,
   load on another; memory per device and no allocation in a steady loop;
   the same random numbers on every device; model parallelism (LeNet's
   convolutions on cpu:0, its classifier on cpu:1) trains to the same
   parameters as one device. `test_devices -v` prints the op x device x
   direction table. */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>
#include <unistd.h>

static dl_ctx *C;
static int g_verbose;

/* ------------------------------------------------------------------ the op matrix (optable.h) */

#include "optable.h"


static void test_op_matrix(void)
{
    size_t c;
    int nops = 0;
    if (g_verbose) printf("%-26s %-8s %-8s %s\n", "op", "device", "fwd", "bwd");
    for (c = 0; c < sizeof g_ops / sizeof g_ops[0]; c++) {
        const opcase *oc = &g_ops[c];
        float *host[3];
        result r0, r1;
        int j, k, fwd_ok, bwd_ok = 1;
        optable_inputs(oc, host);
        run_on(oc, dl_cpu(), host, &r0);
        run_on(oc, dl_cpu_device(1), host, &r1);
        fwd_ok = r0.ok && r1.ok && r0.n[0] == r1.n[0] && memcmp(r0.v[0], r1.v[0], sizeof(float) * (size_t)r0.n[0]) == 0;
        for (k = 1; k < r0.k; k++)
            bwd_ok &= r1.k == r0.k && r0.n[k] == r1.n[k] && memcmp(r0.v[k], r1.v[k], sizeof(float) * (size_t)r0.n[k]) == 0;
        CHECK(fwd_ok, "%s: forward on cpu:1 differs from cpu:0", oc->name);
        CHECK(bwd_ok, "%s: backward on cpu:1 differs from cpu:0", oc->name);
        if (g_verbose)
            printf("%-26s %-8s %-8s %s\n", oc->name, "cpu:1", fwd_ok ? "same" : "DIFFERS",
                   oc->nograd ? "-" : bwd_ok ? "same" : "DIFFERS");
        free_result(&r0);
        free_result(&r1);
        for (j = 0; j < oc->nin; j++) free(host[j]);
        nops++;
    }
    dl_set_device(C, dl_cpu());
    printf("op x device x direction: %d ops on cpu:0 and cpu:1 (strict)\n", nops);
}

/* ------------------------------------------------------------------ errors */

static void test_mixed_device_errors(void)
{
    dl_ctx *c = C;
    dl_tensor *a, *b, *w, *t;
    dl_tensor *ts[2];
    int64_t lab[4] = {0, 1, 2, 1};
    dl_set_device(c, dl_cpu());
    a = dl_randn(c, DL_SHAPE(4, 3));
    t = dl_from_int64(c, DL_SHAPE(4), lab);
    b = dl_to(dl_randn(c, DL_SHAPE(4, 3)), dl_cpu_device(1));
    w = dl_to(dl_randn(c, DL_SHAPE(2, 3, 3, 3)), dl_cpu_device(1));
    CHECK(dl_add(a, b) == NULL, "mixed add");
    EXPECT_ERR(c, DL_ERR_DEVICE, "dl_add: a is on cpu:0 and b is on cpu:1; move one with dl_to()");
    CHECK(dl_mul(b, a) == NULL, "mixed mul");
    EXPECT_ERR(c, DL_ERR_DEVICE, "dl_mul: a is on cpu:1 and b is on cpu:0");
    CHECK(dl_matmul(a, dl_transpose(b, 0, 1)) == NULL, "mixed matmul");
    EXPECT_ERR(c, DL_ERR_DEVICE, "dl_matmul: a is on cpu:0 and b is on cpu:1");
    CHECK(dl_conv2d(dl_randn(c, DL_SHAPE(1, 3, 5, 5)), w, NULL, NULL) == NULL, "mixed conv");
    EXPECT_ERR(c, DL_ERR_DEVICE, "dl_conv2d: x (1,3,5,5) is on cpu:0 but w (2,3,3,3) is on cpu:1");
    CHECK(dl_cross_entropy(b, t, NULL) == NULL, "mixed loss/target");
    EXPECT_ERR(c, DL_ERR_DEVICE, "is on cpu:1 and b is on cpu:0");
    CHECK(dl_mse_loss(a, b, NULL) == NULL, "mixed mse");
    EXPECT_ERR(c, DL_ERR_DEVICE, "dl_mse_loss: a is on cpu:0 and b is on cpu:1");
    ts[0] = a; ts[1] = b;
    CHECK(dl_cat(2, ts, 0) == NULL, "mixed cat");
    EXPECT_ERR(c, DL_ERR_DEVICE, "dl_cat: a is on cpu:0 and b is on cpu:1");
    {   /* relu(bn(x) + r), r on another device: not fused, dl_add says why */
        dl_module *bn = dl_nn_batch_norm1d(c, 3);
        CHECK(dl_module_forward_add_relu(bn, dl_randn(c, DL_SHAPE(4, 3)), b) == NULL, "mixed bn+add+relu");
        EXPECT_ERR(c, DL_ERR_DEVICE, "dl_add: a is on cpu:0 and b is on cpu:1");
    }
    /* optimizer/parameter: a gradient on another device than its parameter */
    {
        dl_tensor *p = dl_param(dl_randn(c, DL_SHAPE(3)));
        dl_optim *o = dl_sgd_params(c, 1, &p, NULL);
        dl_backward(dl_sum(dl_mul(p, p), DL_ALL, false));
        CHECK(p->grad && dl__move("dl_module_to", p->grad, c->cpu[1]), "grad moved");
        CHECK(dl_optim_step(o) == DL_ERR_DEVICE, "optimizer with a grad on another device");
        EXPECT_ERR(c, DL_ERR_DEVICE, "parameter 0 (3) is on cpu:0 but its gradient is on cpu:1");
        dl_optim_free(o);
        dl_free(p);
    }
    /* devices that do not exist */
    CHECK(dl_to(a, dl_cpu_device(7)) == NULL, "cpu:7");
    EXPECT_ERR(c, DL_ERR_DEVICE, "dl_to: cpu:7 does not exist: this context has 3 CPU devices");
#ifndef DL_CUDA
    CHECK(dl_to(a, dl_cuda(0)) == NULL, "cuda without DL_CUDA");
    EXPECT_ERR(c, DL_ERR_DEVICE, "cuda:0 requested but dl.h was built without DL_CUDA");
    CHECK(dl_set_device(c, dl_cuda(1)) == DL_ERR_DEVICE, "default device cuda:1");
    EXPECT_ERR(c, DL_ERR_DEVICE, "cuda:1 requested but dl.h was built without DL_CUDA");
#endif
    {
        dl_device bad;
        bad.type = 9; bad.index = 0;
        CHECK(dl_to(a, bad) == NULL, "device type 9");
        EXPECT_ERR(c, DL_ERR_DEVICE, "device type 9 is not");
    }
    dl_step_end(c);
}

/* the TF32 switches (CUDA devices read them; every build keeps them): the
   desc's fields (1 on, -1 off), else DL_ALLOW_TF32 / DL_ALLOW_TF32_CONV,
   else PyTorch's defaults (matrix products exact, convolutions TF32). The
   caller's own settings of the two variables are put back after. */
static void test_tf32_switches(void)
{
    static const char *names[2] = {"DL_ALLOW_TF32", "DL_ALLOW_TF32_CONV"};
    char saved[2][64];
    bool had[2];
    dl_ctx_desc cd;
    dl_ctx *c2;
    int k;
    for (k = 0; k < 2; k++) {
        const char *v = getenv(names[k]);
        had[k] = v != NULL;
        snprintf(saved[k], sizeof saved[k], "%s", v ? v : "");
        unsetenv(names[k]);
    }
    c2 = dl_ctx_init(NULL);
    CHECK(c2 && !c2->allow_tf32 && c2->allow_tf32_conv, "TF32 defaults: matrix products off, convolutions on");
    CHECK(c2 && dl_set_allow_tf32(c2, true) == DL_OK && dl_set_allow_tf32_conv(c2, false) == DL_OK &&
          c2->allow_tf32 && !c2->allow_tf32_conv, "dl_set_allow_tf32 / dl_set_allow_tf32_conv");
    dl_ctx_free(c2);
    CHECK(dl_set_allow_tf32(NULL, true) == DL_ERR_ARG && dl_set_allow_tf32_conv(NULL, true) == DL_ERR_ARG,
          "TF32 switches of a NULL context");
    setenv("DL_ALLOW_TF32", "1", 1);
    setenv("DL_ALLOW_TF32_CONV", "0", 1);
    c2 = dl_ctx_init(NULL);
    CHECK(c2 && c2->allow_tf32 && !c2->allow_tf32_conv, "DL_ALLOW_TF32=1 DL_ALLOW_TF32_CONV=0");
    dl_ctx_free(c2);
    memset(&cd, 0, sizeof cd);
    cd.allow_tf32 = -1;
    cd.allow_tf32_conv = 1;
    c2 = dl_ctx_init(&cd);
    CHECK(c2 && !c2->allow_tf32 && c2->allow_tf32_conv, "the desc's fields win over the environment");
    dl_ctx_free(c2);
    setenv("DL_ALLOW_TF32_CONV", "yes", 1);
    CHECK(dl_ctx_init(NULL) == NULL && strstr(dl_error_message(NULL), "dl_ctx_init: DL_ALLOW_TF32_CONV=yes must be 0 (off) or 1 (on)"),
          "DL_ALLOW_TF32_CONV=yes: %s", dl_error_message(NULL));
    c2 = dl_ctx_init(&cd);   /* the desc sets it: the variable is not read */
    CHECK(c2 != NULL, "a bad DL_ALLOW_TF32_CONV is not read when the desc sets allow_tf32_conv");
    dl_ctx_free(c2);
    memset(&cd, 0, sizeof cd);
    cd.allow_tf32 = 2;
    CHECK(dl_ctx_init(&cd) == NULL && strstr(dl_error_message(NULL), "dl_ctx_init: allow_tf32=2 must be 1 (on), -1 (off) or 0"),
          "allow_tf32=2: %s", dl_error_message(NULL));
    for (k = 0; k < 2; k++) {
        if (had[k]) setenv(names[k], saved[k], 1);
        else unsetenv(names[k]);
    }
    {   /* DL_STRICT takes 0 or 1 as the other switches (2 was silently on) */
        const char *old = getenv("DL_STRICT");
        char sv[32] = "";
        int had_strict = old != NULL;
        if (had_strict) snprintf(sv, sizeof sv, "%s", old);
        setenv("DL_STRICT", "2", 1);
        CHECK(dl_ctx_init(NULL) == NULL && strstr(dl_error_message(NULL), "dl_ctx_init: DL_STRICT=2 must be 0 (off) "
              "or 1 (on)"), "DL_STRICT=2: %s", dl_error_message(NULL));
        if (had_strict) setenv("DL_STRICT", sv, 1);
        else unsetenv("DL_STRICT");
    }
    dl_clear_error(NULL);
}

static void test_device_api(void)
{
    dl_device d;
    dl_ctx_desc cd;
    dl_ctx *c2;
    d = dl_device_parse("cpu:2");
    CHECK(d.type == DL_DEVICE_CPU && d.index == 2, "parse cpu:2");
    d = dl_device_parse("cuda");
    CHECK(d.type == DL_DEVICE_CUDA && d.index == 0, "parse cuda");
    CHECK(dl_device_parse("cuda:x").type < 0 && dl_device_parse("gpu").type < 0 &&
          dl_device_parse("cpu:").type < 0 && dl_device_parse("cpu:-1").type < 0 &&
          dl_device_parse(NULL).type < 0, "bad device names");
    CHECK(strcmp(dl_device_name(dl_cuda(1)), "cuda:1") == 0 && strcmp(dl_device_name(dl_cpu()), "cpu:0") == 0,
          "device names");
    CHECK(dl_device_count(C, DL_DEVICE_CPU) == 3, "3 CPU devices");
#ifndef DL_CUDA
    CHECK(dl_device_count(C, DL_DEVICE_CUDA) == 0, "no CUDA devices without DL_CUDA");
#endif
    /* the environment: DL_CPU_DEVICES, DL_DEVICE, DL_STRICT */
    setenv("DL_CPU_DEVICES", "4", 1);
    setenv("DL_DEVICE", "cpu:3", 1);
    c2 = dl_ctx_init(NULL);
    CHECK(c2 && dl_device_count(c2, DL_DEVICE_CPU) == 4 && dl_ctx_device(c2).index == 3,
          "DL_CPU_DEVICES=4 DL_DEVICE=cpu:3");
    if (c2) {
        dl_tensor *z = dl_zeros(c2, DL_SHAPE(2));
        CHECK(z && z->device.index == 3, "creators use the default device");
    }
    dl_ctx_free(c2);
    setenv("DL_DEVICE", "tpu:0", 1);
    CHECK(dl_ctx_init(NULL) == NULL && strstr(dl_error_message(NULL), "DL_DEVICE=tpu:0 is not a device name"),
          "bad DL_DEVICE: %s", dl_error_message(NULL));
    setenv("DL_DEVICE", "cpu:9", 1);
    CHECK(dl_ctx_init(NULL) == NULL && strstr(dl_error_message(NULL), "cpu:9 does not exist"),
          "DL_DEVICE beyond DL_CPU_DEVICES: %s", dl_error_message(NULL));
    setenv("DL_CPU_DEVICES", "0", 1);
    CHECK(dl_ctx_init(NULL) == NULL && strstr(dl_error_message(NULL), "DL_CPU_DEVICES=0 must be a number from 1"),
          "DL_CPU_DEVICES=0: %s", dl_error_message(NULL));
    unsetenv("DL_DEVICE");
    unsetenv("DL_CPU_DEVICES");
    dl_clear_error(NULL);
    memset(&cd, 0, sizeof cd);
    cd.cpu_devices = 65;
    CHECK(dl_ctx_init(&cd) == NULL && strstr(dl_error_message(NULL), "cpu_devices=65"), "cpu_devices 65");
    dl_clear_error(NULL);
    test_tf32_switches();
}

/* The environment fills only what a dl_ctx_desc leaves at zero: an explicit
   device, CPU device count or strict flag wins over DL_DEVICE,
   DL_CPU_DEVICES and DL_STRICT. And dl_ctx_init's own failures go to the
   desc's log: dl_log_silent prints nothing. */
static int g_logged;
static char g_logmsg[256];
static void count_log(void *user, const char *m)
{
    (void)user;
    g_logged++;
    snprintf(g_logmsg, sizeof g_logmsg, "%s", m);
}

static bool strict_ctx(dl_ctx *c)
{
    dl_tensor *t = dl_zeros(c, DL_SHAPE(1));
    bool strict;
    dl_set_log(c, dl_log_silent, NULL);
    strict = dl_data(dl_to(t, dl_cpu_device(1))) == NULL;   /* strict: the host cannot address cpu:1 */
    dl_clear_error(c);
    return strict;
}

static void test_desc_over_env(void)
{
    static const char *vars[3] = {"DL_CPU_DEVICES", "DL_DEVICE", "DL_STRICT"};
    char *saved[3];
    dl_ctx_desc cd;
    dl_ctx *c2;
    FILE *err;
    int i, fd, k;
    for (i = 0; i < 3; i++) saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
    setenv("DL_CPU_DEVICES", "4", 1);
    setenv("DL_DEVICE", "cpu:2", 1);
    setenv("DL_STRICT", "1", 1);
    memset(&cd, 0, sizeof cd);
    cd.log = dl_log_silent;
    c2 = dl_ctx_init(&cd);                       /* all zero: the environment's */
    CHECK(c2 && dl_device_count(c2, DL_DEVICE_CPU) == 4 && dl_ctx_device(c2).index == 2 && strict_ctx(c2),
          "a zeroed desc: DL_CPU_DEVICES=4, DL_DEVICE=cpu:2, DL_STRICT=1");
    dl_ctx_free(c2);
    setenv("DL_STRICT", "0", 1);
    cd.cpu_devices = 2;
    cd.device = dl_cpu_device(1);
    cd.strict_devices = true;
    c2 = dl_ctx_init(&cd);                       /* all set: the desc's */
    CHECK(c2 && dl_device_count(c2, DL_DEVICE_CPU) == 2 && dl_ctx_device(c2).type == DL_DEVICE_CPU &&
          dl_ctx_device(c2).index == 1 && strict_ctx(c2),
          "desc cpu_devices=2, device cpu:1, strict over DL_CPU_DEVICES=4 DL_DEVICE=cpu:2 DL_STRICT=0");
    dl_ctx_free(c2);
    setenv("DL_DEVICE", "cpu:0", 1);
    cd.device = dl_cuda(0);
    c2 = dl_ctx_init(&cd);
#ifndef DL_CUDA
    CHECK(c2 == NULL && strstr(dl_error_message(NULL), "cuda:0 requested but dl.h was built without DL_CUDA"),
          "desc device cuda:0 with DL_DEVICE=cpu:0: refused in a CPU build, not run on the CPU: %s",
          dl_error_message(NULL));
#else
    CHECK(!c2 || dl_ctx_device(c2).type == DL_DEVICE_CUDA, "desc device cuda:0 with DL_DEVICE=cpu:0: cuda:0");
#endif
    dl_ctx_free(c2);
    dl_clear_error(NULL);
    cd.device = dl_cpu_device(3);                /* desc's 2 devices, not the environment's 4 */
    CHECK(dl_ctx_init(&cd) == NULL && strstr(dl_error_message(NULL), "cpu:3 does not exist: this context has 2"),
          "desc cpu_devices=2 with DL_CPU_DEVICES=4: cpu:3 does not exist: %s", dl_error_message(NULL));
    dl_clear_error(NULL);
    /* dl_ctx_init's failures: once through the desc's log, none on stderr with dl_log_silent */
    fflush(stderr);
    err = tmpfile();
    fd = dup(2);
    CHECK(err && fd >= 0, "a file for stderr");
    if (err && fd >= 0) {
        char buf[512];
        size_t got;
        dup2(fileno(err), 2);
        memset(&cd, 0, sizeof cd);
        cd.log = count_log;
        cd.num_threads = -1;
        g_logged = 0;
        CHECK(dl_ctx_init(&cd) == NULL && g_logged == 1 && strstr(g_logmsg, "num_threads=-1") &&
              strstr(dl_error_message(NULL), "num_threads=-1"),
              "num_threads=-1: once to the desc's log (%d: %s)", g_logged, g_logmsg);
        cd.num_threads = 0;
        cd.device = dl_cpu_device(9);
        g_logged = 0;
        CHECK(dl_ctx_init(&cd) == NULL && g_logged == 1 && strstr(g_logmsg, "cpu:9 does not exist") &&
              strstr(dl_error_message(NULL), "cpu:9 does not exist"),
              "device cpu:9: once to the desc's log (%d: %s)", g_logged, g_logmsg);
        cd.log = dl_log_silent;
        for (k = 0; k < 3; k++) {
            cd.num_threads = k == 0 ? -1 : 0;
            cd.device = k == 1 ? dl_cuda(99) : k == 2 ? dl_cpu_device(9) : dl_cpu();
            CHECK(dl_ctx_init(&cd) == NULL && dl_last_error(NULL) != DL_OK, "failure %d with dl_log_silent", k);
        }
        fflush(stderr);
        dup2(fd, 2);
        fseek(err, 0, SEEK_SET);
        got = fread(buf, 1, sizeof buf - 1, err);
        buf[got] = 0;
        CHECK(got == 0, "dl_ctx_init's failures with dl_log_silent: nothing on stderr, got \"%s\"", buf);
    }
    if (fd >= 0) close(fd);
    if (err) fclose(err);
    dl_clear_error(NULL);
    for (i = 0; i < 3; i++) {
        if (saved[i]) setenv(vars[i], saved[i], 1);
        else unsetenv(vars[i]);
        free(saved[i]);
    }
}

/* ------------------------------------------------------------------ dl_to, modules, checkpoints */

static void test_to_and_modules(void)
{
    dl_ctx *c = C;
    float xv[4] = {1, -2, 3, 0.5f}, g[4], w0[12], w1[12];
    dl_tensor *x, *y;
    dl_set_device(c, dl_cpu());
    x = dl_requires_grad(dl_from_array(c, DL_SHAPE(4), xv), true);
    y = dl_to(x, dl_cpu_device(1));
    CHECK(y && y->device.index == 1 && y->requires_grad, "dl_to: on cpu:1, with history");
    CHECK(dl_to(x, dl_cpu()) == x, "dl_to the same device is the tensor itself");
    CHECK(dl_backward(dl_sum(dl_mul(y, y), DL_ALL, false)) == DL_OK, "backward across devices: %s",
          dl_error_message(c));
    CHECK(x->grad && x->grad->device.index == 0 && dl_read(x->grad, g, 4) == DL_OK && g[0] == 2.0f &&
          g[1] == -4.0f && g[3] == 1.0f, "dl_to's gradient flows back to cpu:0");
    dl_step_end(c);
    /* a module moved, then trained: the same as training where it was made */
    {
        dl_module *m0, *m1;
        dl_optim *o0, *o1;
        dl_sgd_desc sd;
        float xb[8 * 4], tb[8 * 3];
        int i, step;
        for (i = 0; i < 32; i++) xb[i] = urand() - 0.5f;
        for (i = 0; i < 24; i++) tb[i] = urand();
        dl_manual_seed(c, 5);
        m0 = dl_nn_linear(c, 4, 3, true);
        dl_manual_seed(c, 5);
        m1 = dl_nn_linear(c, 4, 3, true);
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.1f;
        sd.momentum = 0.9f;
        o0 = dl_sgd(m0, &sd);
        o1 = dl_sgd(m1, &sd);
        CHECK(dl_module_to(m1, dl_cpu_device(2)) == DL_OK, "dl_module_to cpu:2: %s", dl_error_message(c));
        CHECK(dl_module_get(m1, "weight")->device.index == 2, "weight moved");
        for (step = 0; step < 5; step++) {
            dl_tensor *l0, *l1;
            dl_set_device(c, dl_cpu());
            l0 = dl_mse_loss(dl_module_forward(m0, dl_from_array(c, DL_SHAPE(8, 4), xb)),
                             dl_from_array(c, DL_SHAPE(8, 3), tb), NULL);
            dl_set_device(c, dl_cpu_device(2));
            l1 = dl_mse_loss(dl_module_forward(m1, dl_from_array(c, DL_SHAPE(8, 4), xb)),
                             dl_from_array(c, DL_SHAPE(8, 3), tb), NULL);
            CHECK(l0 && l1 && dl_backward(l0) == DL_OK && dl_backward(l1) == DL_OK, "step %d: %s", step,
                  dl_error_message(c));
            CHECK(dl_optim_step(o0) == DL_OK && dl_optim_step(o1) == DL_OK, "optim step %d: %s", step,
                  dl_error_message(c));
            dl_optim_zero_grad(o0);
            dl_optim_zero_grad(o1);
            dl_step_end(c);
        }
        CHECK(o1->s[0][0]->device.index == 2, "the momentum buffer followed its parameter to cpu:2");
        dl_read(dl_module_get(m0, "weight"), w0, 12);
        dl_read(dl_module_get(m1, "weight"), w1, 12);
        CHECK(memcmp(w0, w1, sizeof w0) == 0, "trained on cpu:2 after dl_module_to = trained on cpu:0");
        /* save on cpu:2, load on cpu:0 (and the optimizer's state) */
        CHECK(dl_save("build/devices.safetensors", m1, o1) == DL_OK, "save from cpu:2: %s", dl_error_message(c));
        dl_set_device(c, dl_cpu());
        dl_manual_seed(c, 77);
        {
            dl_module *m2 = dl_nn_linear(c, 4, 3, true);
            dl_optim *o2 = dl_sgd(m2, &sd);
            float w2[12];
            CHECK(dl_load("build/devices.safetensors", m2, o2) == DL_OK, "load on cpu:0: %s", dl_error_message(c));
            dl_read(dl_module_get(m2, "weight"), w2, 12);
            CHECK(memcmp(w1, w2, sizeof w1) == 0 && dl_optim_steps(o2) == 5, "loaded on cpu:0 = saved from cpu:2");
            CHECK(dl_module_to(m2, dl_cpu_device(1)) == DL_OK &&
                  dl_load("build/devices.safetensors", m2, o2) == DL_OK, "load into a module on cpu:1");
            memset(w2, 0, sizeof w2);
            dl_read(dl_module_get(m2, "weight"), w2, 12);
            CHECK(memcmp(w1, w2, sizeof w1) == 0, "loaded on cpu:1");
        }
    }
    dl_set_device(c, dl_cpu());
    dl_step_end(c);
}

/* ------------------------------------------------------------------ memory and random numbers */

static void test_memory_per_device(void)
{
    dl_ctx *c = C;
    dl_memory_stats s0, s1, a, b;
    dl_tensor *w;
    int i;
    dl_set_device(c, dl_cpu_device(1));
    dl_memory_stats_get(c, dl_cpu(), &s0);
    dl_memory_stats_get(c, dl_cpu_device(1), &s1);
    w = dl_param(dl_randn(c, DL_SHAPE(64, 32)));
    dl_memory_stats_get(c, dl_cpu_device(1), &a);
    CHECK(a.persistent_bytes >= s1.persistent_bytes + 64 * 32 * 4, "cpu:1 persistent bytes grew");
    dl_memory_stats_get(c, dl_cpu(), &b);
    CHECK(b.persistent_bytes == s0.persistent_bytes, "cpu:0 persistent bytes unchanged by a cpu:1 tensor");
    for (i = 0; i < 1000; i++) {
        dl_tensor *x = dl_randn(c, DL_SHAPE(16, 64));
        dl_tensor *l = dl_mean(dl_tanh(dl_matmul(x, w)), DL_ALL, false);
        if (!l || dl_backward(l) != DL_OK) { CHECK(0, "loop: %s", dl_error_message(c)); break; }
        dl_sgd_update(w, 0.01f);
        dl_step_end(c);
        if (i == 0) dl_memory_stats_get(c, dl_cpu_device(1), &a);
    }
    dl_memory_stats_get(c, dl_cpu_device(1), &b);
    CHECK(b.alloc_calls == a.alloc_calls, "cpu:1 allocator called %llu times after step 1 over 1000 steps",
          (unsigned long long)(b.alloc_calls - a.alloc_calls));
    CHECK(b.step_reserved == a.step_reserved && b.step_reserved > 0, "cpu:1 step memory flat");
    CHECK(dl_memory_stats_get(c, dl_cpu_device(9), &b) == DL_ERR_DEVICE, "stats of a device that does not exist");
    dl_clear_error(c);
    dl_free(w);
    dl_set_device(c, dl_cpu());
}

static void test_random_same_everywhere(void)
{
    dl_ctx *c = C;
    float u0[1000], u1[1000], n0[1000], n1[1000], k0[400], k1[400];
    dl_module *l0, *l1;
    dl_tensor *d0, *d1;
    double mean = 0, var = 0;
    int i;
    dl_set_device(c, dl_cpu());
    dl_manual_seed(c, 123);
    dl_read(dl_rand(c, DL_SHAPE(1000)), u0, 1000);
    dl_read(dl_randn(c, DL_SHAPE(1000)), n0, 1000);
    l0 = dl_nn_linear(c, 20, 20, false);
    d0 = dl_dropout(dl_ones(c, DL_SHAPE(1000)), 0.4f, true);
    dl_set_device(c, dl_cpu_device(1));
    dl_manual_seed(c, 123);
    dl_read(dl_rand(c, DL_SHAPE(1000)), u1, 1000);
    dl_read(dl_randn(c, DL_SHAPE(1000)), n1, 1000);
    l1 = dl_nn_linear(c, 20, 20, false);
    d1 = dl_dropout(dl_ones(c, DL_SHAPE(1000)), 0.4f, true);
    CHECK(memcmp(u0, u1, sizeof u0) == 0, "dl_rand: the same bits on cpu:0 and cpu:1");
    CHECK(memcmp(n0, n1, sizeof n0) == 0, "dl_randn: the same bits on cpu:0 and cpu:1");
    dl_read(dl_module_get(l0, "weight"), k0, 400);
    dl_read(dl_module_get(l1, "weight"), k1, 400);
    CHECK(memcmp(k0, k1, sizeof k0) == 0, "init: the same weights on cpu:0 and cpu:1");
    dl_read(d0, u0, 1000);
    dl_read(d1, u1, 1000);
    CHECK(memcmp(u0, u1, sizeof u0) == 0, "dropout: the same mask on cpu:0 and cpu:1");
    for (i = 0; i < 1000; i++) mean += n0[i];
    mean /= 1000;
    for (i = 0; i < 1000; i++) var += (n0[i] - mean) * (n0[i] - mean);
    var /= 999;
    CHECK(fabs(mean) < 0.1 && fabs(var - 1.0) < 0.12, "randn mean %g var %g", mean, var);
    for (i = 0; i < 1000; i++) if (!(u0[i] == 0.0f || fabsf(u0[i] - 1.0f / 0.6f) < 1e-6f)) break;
    CHECK(i == 1000, "dropout values are 0 or 1/(1-p)");
    dl_set_device(c, dl_cpu());
    dl_step_end(c);
}

/* ------------------------------------------------------------------ model parallelism */

/* LeNet with its convolutional half on one device and its classifier on
   another; dl_to carries the activations (and gradients) across */
typedef struct lenet2 { dl_module *features, *classifier; dl_device d0, d1; } lenet2;

static dl_tensor *lenet2_fwd(dl_module *m, dl_tensor *x)
{
    lenet2 *s = (lenet2 *)dl_module_state(m);
    dl_tensor *h = dl_module_forward(s->features, dl_to(x, s->d0));
    return dl_module_forward(s->classifier, dl_to(h, s->d1));
}

static dl_module *make_lenet2(dl_ctx *c, dl_device d0, dl_device d1)
{
    dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
    dl_module *m = dl_module_new(c, "LeNet2", lenet2_fwd, sizeof(lenet2)), *f[8], *k[7];
    lenet2 *s = (lenet2 *)dl_module_state(m);
    f[0] = dl_nn_conv2d(c, 1, 6, 5, &pad2, true); f[1] = dl_nn_batch_norm2d(c, 6); f[2] = dl_nn_relu(c);
    f[3] = dl_nn_max_pool2d(c, &pool); f[4] = dl_nn_conv2d(c, 6, 16, 5, NULL, true);
    f[5] = dl_nn_batch_norm2d(c, 16); f[6] = dl_nn_relu(c); f[7] = dl_nn_max_pool2d(c, &pool);
    k[0] = dl_nn_flatten(c); k[1] = dl_nn_linear(c, 400, 120, true); k[2] = dl_nn_relu(c);
    k[3] = dl_nn_linear(c, 120, 84, true); k[4] = dl_nn_relu(c); k[5] = dl_nn_linear(c, 84, 10, true);
    k[6] = dl_nn_flatten(c);
    s->features = dl_module_add(m, "features", dl_nn_sequential(c, 8, f));
    s->classifier = dl_module_add(m, "classifier", dl_nn_sequential(c, 6, k));
    s->d0 = d0;
    s->d1 = d1;
    if (!s->features || !s->classifier) return NULL;
    dl_module_to(s->features, d0);
    dl_module_to(s->classifier, d1);
    return m;
}

static void test_model_parallel(void)
{
    dl_ctx *c = C;
    dl_module *one, *two;
    dl_optim *o1, *o2;
    dl_adam_desc ad;
    const dl_named_tensor *p1, *p2;
    float *xb = (float *)malloc(sizeof(float) * 16 * 784);
    int64_t yb[16];
    int i, n1, n2, step, same = 1;
    for (i = 0; i < 16 * 784; i++) xb[i] = urand() * 2.0f - 1.0f;
    for (i = 0; i < 16; i++) yb[i] = i % 10;
    dl_set_device(c, dl_cpu());
    dl_manual_seed(c, 11);
    one = make_lenet2(c, dl_cpu(), dl_cpu());
    dl_manual_seed(c, 11);
    two = make_lenet2(c, dl_cpu(), dl_cpu_device(1));
    CHECK(one && two, "lenet2: %s", dl_error_message(c));
    if (!one || !two) { free(xb); return; }
    CHECK(dl_module_get(two, "features.0.weight")->device.index == 0 &&
          dl_module_get(two, "classifier.1.weight")->device.index == 1, "the halves are on cpu:0 and cpu:1");
    memset(&ad, 0, sizeof ad);
    o1 = dl_adam(one, &ad);
    o2 = dl_adam(two, &ad);
    for (step = 0; step < 5; step++) {
        dl_module *ms[2];
        dl_optim *os[2];
        int k;
        ms[0] = one; ms[1] = two; os[0] = o1; os[1] = o2;
        for (k = 0; k < 2; k++) {
            dl_tensor *x = dl_from_array(c, DL_SHAPE(16, 1, 28, 28), xb);
            dl_tensor *y = dl_from_int64(c, DL_SHAPE(16), yb);
            dl_tensor *logits = dl_module_forward(ms[k], x);
            dl_tensor *loss = dl_cross_entropy(logits, logits ? dl_to(y, logits->device) : NULL, NULL);
            dl_optim_zero_grad(os[k]);
            CHECK(loss && dl_backward(loss) == DL_OK && dl_optim_step(os[k]) == DL_OK, "model %d step %d: %s",
                  k, step, dl_error_message(c));
        }
        dl_step_end(c);
    }
    n1 = dl_module_state_dict(one, &p1);
    n2 = dl_module_state_dict(two, &p2);
    CHECK(n1 == n2 && n1 > 10, "state dicts %d %d", n1, n2);
    for (i = 0; i < n1 && i < n2; i++) {
        int64_t n = p1[i].t->numel;
        if (p1[i].t->dtype == DL_DTYPE_F32) {
            float *a = (float *)malloc(sizeof(float) * (size_t)n), *b = (float *)malloc(sizeof(float) * (size_t)n);
            dl_read(p1[i].t, a, n);
            dl_read(p2[i].t, b, n);
            if (memcmp(a, b, sizeof(float) * (size_t)n) != 0) { same = 0; printf("differs: %s\n", p1[i].name); }
            free(a);
            free(b);
        }
    }
    CHECK(same, "model parallel on cpu:0 + cpu:1 trains to the same parameters as one device");
    free(xb);
}

int main(int argc, char **argv)
{
    dl_ctx_desc d;
    g_verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    memset(&d, 0, sizeof d);
    d.cpu_devices = 3;
    d.strict_devices = true;
    d.log = dl_log_silent;
    C = dl_ctx_init(&d);
    CHECK(C != NULL, "context with 3 strict CPU devices: %s", dl_error_message(NULL));
    if (!C) TEST_END();
    test_op_matrix();
    test_mixed_device_errors();
    test_desc_over_env();
    test_device_api();
    test_to_and_modules();
    test_memory_per_device();
    test_random_same_everywhere();
    test_model_parallel();
    dl_ctx_free(C);
    TEST_END();
}
