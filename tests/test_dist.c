/* tests/test_dist.c - data parallelism in one process, on strict virtual
   CPU devices (tagged pointers: host code that touches device data faults):
   dl_allreduce (sizes 1..10^6, including ones smaller than the device count
   and not divisible by it; 1..8 devices; sum and mean) against the ring's
   order computed on the host (the same bits), against a sequential double
   sum (tolerance), identical bits on every replica; dl_broadcast; every bad
   input is an error before any data moves; the local communicator; dl_ddp:
   20 steps of an MLP and of LeNet (no batch norm, and batch norm in eval
   mode) on 2 and 4 devices give the parameters of one model trained on the
   full batch (rel. tol. 1e-5), with uneven splits and small buckets too;
   no device allocation in a steady dl_ddp_step loop;
   dl_ddp_check finds a replica that drifted; the path of devices on
   another backend (no pool, syncs, host staging), with a second copy of
   the CPU backend. `test_dist --quick` skips the
   10^6 sizes. */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include "dist_models.h"
#include <stdlib.h>
#include <pthread.h>
#include <time.h>

#define NDEV 8
static dl_ctx *C;
static int g_quick;
static uint32_t g_rng = 12345;

static float urand(void)
{
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xFFFFFF) / 16777216.0f;
}

/* ------------------------------------------------------------------ allreduce */

/* the ring's order: segment s is x_s, then x_{s+1} + that, ... (see dl.h) */
static void ring_reference(float **x, int n, int64_t count, int mean, float *out)
{
    int s, j;
    int64_t q = count / n, rem = count % n, i;
    for (s = 0; s < n; s++) {
        int64_t off = s * q + (s < rem ? s : rem), len = q + (s < rem ? 1 : 0);
        for (i = off; i < off + len; i++) {
            float v = x[s][i];
            for (j = 1; j < n; j++) v = x[(s + j) % n][i] + v;
            if (mean && n > 1) v = v * (1.0f / (float)n);
            out[i] = v;
        }
    }
}

static void test_allreduce_one(int64_t count, int n, int mean)
{
    dl_tensor *t[NDEV];
    float *x[NDEV], *ref = (float *)malloc(sizeof(float) * (size_t)count);
    float *got = (float *)malloc(sizeof(float) * (size_t)count);
    int i, same = 1, exact = 1, close = 1;
    int64_t k;
    for (i = 0; i < n; i++) {
        x[i] = (float *)malloc(sizeof(float) * (size_t)count);
        for (k = 0; k < count; k++) x[i][k] = urand() * 2.0f - 1.0f;
        dl_set_device(C, dl_cpu_device(i));
        t[i] = dl_from_array(C, DL_SHAPE(count), x[i]);
    }
    dl_set_device(C, dl_cpu());
    ring_reference(x, n, count, mean, ref);
    CHECK(dl_allreduce(t, n, mean ? DL_REDUCE_MEAN : DL_REDUCE_SUM) == DL_OK, "allreduce %lld on %d: %s",
          (long long)count, n, dl_error_message(C));
    for (i = 0; i < n; i++) {
        dl_read(t[i], got, count);
        if (memcmp(got, ref, sizeof(float) * (size_t)count) != 0) {
            if (i == 0) exact = 0;
            else same = 0;
        }
        if (i == 0)
            for (k = 0; k < count && close; k++) {
                double s = 0;
                int j;
                for (j = 0; j < n; j++) s += x[j][k];
                if (mean) s /= n;
                if (fabs(s - got[k]) > 1e-6 * n + 1e-6 * fabs(s)) close = 0;
            }
    }
    CHECK(exact, "%s of %lld on %d devices: the ring's order computed on the host, bit for bit",
          mean ? "mean" : "sum", (long long)count, n);
    CHECK(same, "%s of %lld on %d devices: every replica has the same bits", mean ? "mean" : "sum",
          (long long)count, n);
    CHECK(close, "%s of %lld on %d devices: = the sequential sum (tolerance)", mean ? "mean" : "sum",
          (long long)count, n);
    for (i = 0; i < n; i++) free(x[i]);
    free(ref);
    free(got);
    dl_step_end(C);
}

static void test_allreduce(void)
{
    static const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 9, 13, 100, 1001, 65536 * 2 + 3, 1000000};
    int si, n, mean;
    for (si = 0; si < (int)(sizeof sizes / sizeof sizes[0]); si++)
        for (n = 1; n <= NDEV; n++)
            for (mean = 0; mean < 2; mean++) {
                if (g_quick && sizes[si] > 100000 && n != 3) continue;
                if (sizes[si] == 1000000 && n != 1 && n != 2 && n != 3 && n != 8) continue;
                test_allreduce_one(sizes[si], n, mean);
            }
}

static void test_broadcast(void)
{
    dl_tensor *t[4];
    int64_t v[6] = {1, -2, 3, 1LL << 40, 5, 6}, got[6];
    float f[5] = {1, 2, 3, 4, 5}, fg[5];
    int i, root, ok = 1;
    for (root = 0; root < 4; root++) {
        for (i = 0; i < 4; i++) {
            int64_t w[6] = {0, 0, 0, 0, 0, 0};
            dl_set_device(C, dl_cpu_device(i));
            t[i] = dl_from_int64(C, DL_SHAPE(2, 3), i == root ? v : w);
        }
        CHECK(dl_broadcast(t, 4, root) == DL_OK, "broadcast int64 from %d: %s", root, dl_error_message(C));
        for (i = 0; i < 4; i++) {
            dl_read_int64(t[i], got, 6);
            if (memcmp(got, v, sizeof got) != 0) ok = 0;
        }
        dl_step_end(C);
    }
    CHECK(ok, "broadcast of int64 from every root reaches every device");
    for (i = 0; i < 3; i++) {
        float z[5] = {0, 0, 0, 0, 0};
        dl_set_device(C, dl_cpu_device(i + 2));
        t[i] = dl_from_array(C, DL_SHAPE(5), i == 1 ? f : z);
    }
    CHECK(dl_broadcast(t, 3, 1) == DL_OK, "broadcast float: %s", dl_error_message(C));
    dl_read(t[2], fg, 5);
    CHECK(memcmp(fg, f, sizeof f) == 0, "broadcast float to cpu:4");
    dl_set_device(C, dl_cpu());
    dl_step_end(C);
}

/* every rule, and nothing moved */
static void test_errors(void)
{
    dl_tensor *t[4], *u[3];
    float a[6] = {1, 2, 3, 4, 5, 6}, got[6];
    int i;
    dl_ctx_desc d2;
    dl_ctx *other;
    for (i = 0; i < 3; i++) {
        dl_set_device(C, dl_cpu_device(i));
        t[i] = dl_from_array(C, DL_SHAPE(2, 3), a);
    }
    dl_set_device(C, dl_cpu_device(3));
    t[3] = dl_from_array(C, DL_SHAPE(3, 2), a);
    CHECK(dl_allreduce(NULL, 2, DL_REDUCE_SUM) == DL_ERR_ARG, "NULL list");
    CHECK(dl_allreduce(t, 0, DL_REDUCE_SUM) == DL_ERR_ARG &&
          strstr(dl_error_message(NULL), "dl_allreduce: n=0 tensors; it must be 1..80") != NULL,
          "n = 0 (no context to name: the message without one): %s", dl_error_message(NULL));
    CHECK(dl_allreduce(t, 4, DL_REDUCE_SUM) == DL_ERR_SHAPE, "shapes differ");
    EXPECT_ERR(C, DL_ERR_SHAPE, "dl_allreduce: t[0] (2,3) float32 on cpu:0 and t[3] (3,2) float32 on cpu:3 differ");
    u[0] = t[0]; u[1] = t[1]; u[2] = t[1];
    CHECK(dl_allreduce(u, 3, DL_REDUCE_MEAN) == DL_ERR_DEVICE, "duplicate device");
    EXPECT_ERR(C, DL_ERR_DEVICE, "t[1] and t[2] are both on cpu:1; one replica per device");
    u[2] = NULL;
    CHECK(dl_allreduce(u, 3, DL_REDUCE_SUM) == DL_ERR_ARG, "NULL element");
    EXPECT_ERR(C, DL_ERR_ARG, "t[2] is NULL");
    CHECK(dl_allreduce(t, 2, (dl_reduce_op)7) == DL_ERR_ARG, "bad op");
    EXPECT_ERR(C, DL_ERR_ARG, "op=7 is not DL_REDUCE_SUM (0) or DL_REDUCE_MEAN (1)");
    CHECK(dl_broadcast(t, 2, 2) == DL_ERR_ARG, "bad root");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_broadcast: root=2; it must index the list (0..1)");
    dl_set_device(C, dl_cpu_device(5));
    u[0] = t[0];
    {
        int64_t iv[6] = {0, 0, 0, 0, 0, 0};
        u[1] = dl_from_int64(C, DL_SHAPE(2, 3), iv);
    }
    CHECK(dl_allreduce(u, 2, DL_REDUCE_SUM) == DL_ERR_DTYPE, "int64 replica");
    EXPECT_ERR(C, DL_ERR_DTYPE, "needs float32");
    memset(&d2, 0, sizeof d2);
    d2.log = dl_log_silent;
    d2.cpu_devices = 2;
    other = dl_ctx_init(&d2);
    dl_set_device(other, dl_cpu_device(1));
    u[1] = dl_from_array(other, DL_SHAPE(2, 3), a);
    CHECK(dl_allreduce(u, 2, DL_REDUCE_SUM) == DL_ERR_ARG, "two contexts");
    EXPECT_ERR(C, DL_ERR_ARG, "t[1] belongs to another context");
    dl_ctx_free(other);
    for (i = 0; i < 4; i++) {
        dl_read(t[i], got, 6);
        CHECK(memcmp(got, a, sizeof a) == 0, "t[%d] unchanged after the errors", i);
    }
    dl_step_end(C);
    CHECK(dl_allreduce(t, 2, DL_REDUCE_SUM) == DL_ERR_STALE, "stale replicas");
    EXPECT_ERR(C, DL_ERR_STALE, "dl_allreduce");
    dl_set_device(C, dl_cpu());
}

static void test_comm_local(void)
{
    dl_comm *c = dl_comm_init(C, NULL);
    dl_comm_desc cd;
    dl_tensor *t[3];
    float a[3] = {1, 2, 4}, got[3];
    int i;
    CHECK(c && dl_comm_rank(c) == 0 && dl_comm_size(c) == 1, "local communicator: rank 0 of 1");
    for (i = 0; i < 3; i++) {
        dl_set_device(C, dl_cpu_device(i));
        t[i] = dl_from_array(C, DL_SHAPE(3), a);
    }
    CHECK(dl_comm_allreduce(c, t, 3, DL_REDUCE_SUM) == DL_OK, "comm allreduce: %s", dl_error_message(C));
    dl_read(t[2], got, 3);
    CHECK(got[0] == 3 && got[1] == 6 && got[2] == 12, "comm allreduce sums (%g %g %g)", got[0], got[1], got[2]);
    CHECK(dl_comm_allreduce(c, t, 3, DL_REDUCE_MEAN) == DL_OK, "comm mean");
    dl_read(t[1], got, 3);
    CHECK(got[0] == 3 && got[2] == 12, "comm mean of equal replicas");
    CHECK(dl_comm_broadcast(c, t, 3, 1) == DL_ERR_ARG, "comm broadcast root 1 of 1 process");
    EXPECT_ERR(C, DL_ERR_ARG, "root=1; it must be a process rank (0..0)");
    CHECK(dl_comm_barrier(c) == DL_OK, "barrier");
    dl_comm_free(c);
    memset(&cd, 0, sizeof cd);
    cd.backend = (dl_comm_backend)9;
    CHECK(dl_comm_init(C, &cd) == NULL, "bad backend");
    EXPECT_ERR(C, DL_ERR_ARG, "backend=9 is not DL_COMM_LOCAL (0), DL_COMM_MPI (1), DL_COMM_NCCL (2) or DL_COMM_THREADS (3)");
#ifndef DL_MPI
    cd.backend = DL_COMM_MPI;
    CHECK(dl_comm_init(C, &cd) == NULL, "MPI without DL_MPI");
    EXPECT_ERR(C, DL_ERR_UNSUPPORTED, "DL_COMM_MPI needs dl.h built with -DDL_MPI");
#endif
#ifndef DL_NCCL
    cd.backend = DL_COMM_NCCL;
    CHECK(dl_comm_init(C, &cd) == NULL, "NCCL without DL_NCCL");
    EXPECT_ERR(C, DL_ERR_UNSUPPORTED, "DL_COMM_NCCL needs dl.h built with -DDL_NCCL");
#endif
    cd.backend = DL_COMM_LOCAL;
    cd.timeout = -1;
    CHECK(dl_comm_init(C, &cd) == NULL, "negative timeout");
    EXPECT_ERR(C, DL_ERR_ARG, "timeout=-1; it must be a number of seconds");
    cd.timeout = 0;
    setenv("DL_COMM_TIMEOUT", "soon", 1);
    CHECK(dl_comm_init(C, &cd) == NULL, "bad DL_COMM_TIMEOUT");
    EXPECT_ERR(C, DL_ERR_ARG, "DL_COMM_TIMEOUT='soon'; it must be a number of seconds");
    unsetenv("DL_COMM_TIMEOUT");
    dl_set_device(C, dl_cpu());
    dl_step_end(C);
}

/* ------------------------------------------------------------------ data parallel */

/* 20 SGD steps (momentum) of one model on the full batch vs dl_ddp on n
   devices. The smooth nets (MLP, LeNet: sigmoid, average pooling) are
   compared after all 20 steps. LeNet-BN's ReLU and max pool are not: the
   two runs sum the gradients in other orders (halves, then the
   allreduce), and once a parameter differs by that rounding an activation
   at zero or a tie in a pool can fall the other way, and the runs part for
   good (seen: 2e-7 apart for 13 steps, then 5e-5). So each of its steps
   starts the full-batch model from replica 0's parameters and momentum (a
   checkpoint's round trip, exact), and each step is compared. */
static void test_ddp_equiv(int kind, int n, int64_t B, int64_t bucket_bytes)
{
    static const char *names[] = {"MLP", "LeNet", "LeNet-BN (eval)"};
    dl_module *ref, *rep[NDEV];
    dl_optim *oref, *op[NDEV];
    dl_sgd_desc sd;
    dl_ddp_desc dd;
    dl_ddp *dp;
    float *xb = (float *)malloc(sizeof(float) * (size_t)B * 784);
    int64_t *yb = (int64_t *)malloc(sizeof(int64_t) * (size_t)B);
    int i, step, ok = 1;
    double diff, lossdiff = 0, stepdiff = 0;
    char ckpt[64];
    snprintf(ckpt, sizeof ckpt, "/tmp/dl_test_dist_%ld.ckpt", (long)getpid());
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.05f;
    sd.momentum = 0.9f;
    dl_set_device(C, dl_cpu());
    dl_manual_seed(C, 7);
    ref = make_model(C, kind);
    oref = dl_sgd(ref, &sd);
    for (i = 0; i < n; i++) {
        dl_manual_seed(C, 100 + (uint64_t)i);   /* different inits: dl_ddp_init copies replica 0's */
        rep[i] = make_model(C, kind);
        if (i == 0) { dl_manual_seed(C, 7); rep[0] = make_model(C, kind); }
        dl_module_to(rep[i], dl_cpu_device(i));
        op[i] = dl_sgd(rep[i], &sd);
    }
    memset(&dd, 0, sizeof dd);
    dd.bucket_bytes = bucket_bytes;
    dp = dl_ddp_init(n, rep, op, &dd);
    CHECK(dp != NULL, "dl_ddp_init %s on %d: %s", names[kind], n, dl_error_message(C));
    if (!dp) { free(xb); free(yb); return; }
    CHECK(dl_ddp_check(dp) == DL_OK, "replicas identical after dl_ddp_init: %s", dl_error_message(C));
    for (step = 0; step < 20 && ok; step++) {
        float l1, l2 = 0;
        int64_t k;
        for (k = 0; k < B * 784; k++) xb[k] = urand() * 2.0f - 1.0f;
        for (k = 0; k < B; k++) yb[k] = (int64_t)(urand() * 10) % 10;
        if (kind == 2 && step > 0) {   /* from replica 0's state */
            ok = dl_save(ckpt, rep[0], op[0]) == DL_OK && dl_load(ckpt, ref, oref) == DL_OK;
            if (!ok) break;
        }
        l1 = ref_step(C, ref, oref, xb, yb, B);
        ok = l1 == l1 && dl_ddp_step(dp, dl_from_array(C, DL_SHAPE(B, 1, 28, 28), xb),
                                     dl_from_int64(C, DL_SHAPE(B), yb), ce_loss, NULL, &l2) == DL_OK;
        if (fabs(l1 - l2) > lossdiff) lossdiff = fabs(l1 - l2);
        if (ok && kind == 2 && (diff = param_diff(ref, rep[0], NULL, NULL)) > stepdiff) stepdiff = diff;
        dl_step_end(C);
    }
    remove(ckpt);
    CHECK(ok, "%s on %d devices: 20 steps: %s", names[kind], n, dl_error_message(C));
    CHECK(lossdiff < 1e-5, "%s on %d devices (batch %lld): the loss = the full batch's (worst diff %.3g)",
          names[kind], n, (long long)B, lossdiff);
    diff = kind == 2 ? stepdiff : param_diff(ref, rep[0], NULL, NULL);
    CHECK(diff < 1e-5, "%s on %d devices (batch %lld, buckets %lld B): parameters = one device on the full "
          "batch %s (worst relative diff %.3g)", names[kind], n, (long long)B, (long long)bucket_bytes,
          kind == 2 ? "after each of 20 steps from the same state" : "after 20 steps", diff);
    for (i = 1; i < n; i++)
        CHECK(param_diff(rep[0], rep[i], NULL, NULL) == 0, "%s: replica %d = replica 0, bit for bit", names[kind], i);
    CHECK(dl_ddp_check(dp) == DL_OK, "dl_ddp_check after training");
    if (kind == 0 && n == 4 && bucket_bytes == 0) {   /* a steady loop allocates nothing after step 1 */
        dl_memory_stats a[4], b[4];
        uint64_t grew = 0;
        dl_tensor *x = dl_keep(dl_from_array(C, DL_SHAPE(B, 1, 28, 28), xb));
        dl_tensor *y = dl_keep(dl_from_int64(C, DL_SHAPE(B), yb));
        dl_step_end(C);
        for (step = 0; step < 50 && ok; step++) {
            ok = dl_ddp_step(dp, x, y, ce_loss, NULL, NULL) == DL_OK;
            dl_step_end(C);
            if (step == 1)
                for (i = 0; i < n; i++) dl_memory_stats_get(C, dl_cpu_device(i), &a[i]);
        }
        for (i = 0; i < n; i++) {
            dl_memory_stats_get(C, dl_cpu_device(i), &b[i]);
            grew += b[i].alloc_calls - a[i].alloc_calls;
        }
        CHECK(ok && grew == 0, "dl_ddp_step: no device allocation after step 2 over 48 steps on 4 devices "
              "(%llu): %s", (unsigned long long)grew, dl_error_message(C));
        dl_free(x);
        dl_free(y);
    }
    dl_ddp_free(dp);
    free(xb);
    free(yb);
}

/* The path GPUs take, on CPU devices: cpu:2 and cpu:3 get a copy of the CPU
   backend under another address, so the ring sees a second backend: no
   thread pool, a sync after each transfer, and host staging between the two
   backends. The same bits as the ring's order, every replica identical; a
   data-parallel MLP on the mixed devices trains like one device. */
static dl__backend g_other;

static void test_other_backend(void)
{
    static const int64_t sizes[] = {1, 7, 1000, 65536 * 3 + 1};
    static const int order[4] = {0, 2, 1, 3};
    const dl__backend *saved[2];
    int si, k, mean;
    g_other = *dl__cpu_be();
    g_other.name = "cpu-as-another-backend";
    saved[0] = C->cpu[2]->be;
    saved[1] = C->cpu[3]->be;
    C->cpu[2]->be = &g_other;
    C->cpu[3]->be = &g_other;
    for (si = 0; si < 4; si++)
        for (mean = 0; mean < 2; mean++) {
            int64_t count = sizes[si], j;
            dl_tensor *t[4];
            float *x[4], *ref = (float *)malloc(sizeof(float) * (size_t)count);
            float *got = (float *)malloc(sizeof(float) * (size_t)count);
            int exact = 1;
            for (k = 0; k < 4; k++) {
                x[k] = (float *)malloc(sizeof(float) * (size_t)count);
                for (j = 0; j < count; j++) x[k][j] = urand() * 2.0f - 1.0f;
                dl_set_device(C, dl_cpu_device(order[k]));
                t[k] = dl_from_array(C, DL_SHAPE(count), x[k]);
            }
            ring_reference(x, 4, count, mean, ref);
            CHECK(dl_allreduce(t, 4, mean ? DL_REDUCE_MEAN : DL_REDUCE_SUM) == DL_OK, "mixed backends: %s",
                  dl_error_message(C));
            for (k = 0; k < 4; k++) {
                dl_read(t[k], got, count);
                if (memcmp(got, ref, sizeof(float) * (size_t)count) != 0) exact = 0;
            }
            CHECK(exact, "two backends (cpu:0, cpu:2*, cpu:1, cpu:3*), %s of %lld: the ring's bits on every replica",
                  mean ? "mean" : "sum", (long long)count);
            for (k = 0; k < 4; k++) free(x[k]);
            free(ref);
            free(got);
            dl_step_end(C);
        }
    dl_set_device(C, dl_cpu());
    test_ddp_equiv(0, 4, 32, 4096);          /* replicas on cpu:0..3, two of them "foreign" */
    C->cpu[2]->be = saved[0];
    C->cpu[3]->be = saved[1];
}

static void test_ddp_errors(void)
{
    dl_module *r[3];
    dl_ddp *dp;
    float big = 1.0f;
    dl_tensor *w;
    dl_set_device(C, dl_cpu());
    r[0] = make_mlp(C);
    r[1] = make_mlp(C);
    r[2] = make_lenet(C, false);
    CHECK(dl_ddp_init(2, r, NULL, NULL) == NULL, "two replicas on cpu:0");
    EXPECT_ERR(C, DL_ERR_DEVICE, "replicas[0] and replicas[1] are both on cpu:0; one replica per device");
    dl_module_to(r[1], dl_cpu_device(1));
    dl_module_to(r[2], dl_cpu_device(2));
    CHECK(dl_ddp_init(3, r, NULL, NULL) == NULL, "different models");
    EXPECT_ERR(C, DL_ERR_SHAPE, "replicas[2] has 10 parameters and replicas[0] 6");
    CHECK(dl_ddp_init(0, r, NULL, NULL) == NULL && strstr(dl_error_message(NULL), "n=0 replicas") != NULL,
          "n = 0: %s", dl_error_message(NULL));
    dl_module_to(dl_module_child(r[1], "1"), dl_cpu_device(3));
    CHECK(dl_ddp_init(2, r, NULL, NULL) == NULL, "a replica over two devices");
    EXPECT_ERR(C, DL_ERR_DEVICE, "replicas[1] has 1.weight on cpu:3 and 3.weight on cpu:1");
    dl_module_to(r[1], dl_cpu_device(1));
    dp = dl_ddp_init(2, r, NULL, NULL);
    CHECK(dp != NULL, "dl_ddp_init without optimizers: %s", dl_error_message(C));
    if (!dp) return;
    {
        dl_tensor *x = dl_zeros(C, DL_SHAPE(1, 784)), *y = dl_zeros(C, DL_SHAPE(1));
        CHECK(dl_ddp_step(dp, x, y, ce_loss, NULL, NULL) == DL_ERR_SHAPE, "batch of 1 over 2 replicas");
        EXPECT_ERR(C, DL_ERR_SHAPE, "at least one row per replica (2)");
        x = dl_zeros(C, DL_SHAPE(4, 784));
        y = dl_zeros(C, DL_SHAPE(4));
        CHECK(dl_ddp_step(dp, x, y, ce_loss, NULL, NULL) == DL_ERR_ARG, "no optimizers");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_ddp_init got no optimizers");
        CHECK(dl_ddp_step(dp, x, NULL, ce_loss, NULL, NULL) == DL_ERR_ARG, "NULL y");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_ddp_step: y is NULL");
        dl_step_end(C);
    }
    /* drift: replica 1's first weight changed behind dl_ddp's back */
    w = dl_module_get(r[1], "1.weight");
    CHECK(dl_ddp_check(dp) == DL_OK, "replicas identical");
    {
        float *buf = (float *)malloc(sizeof(float) * (size_t)w->numel);
        dl_read(w, buf, w->numel);
        buf[5] += big;
        dl_no_grad_begin(C);
        dl_write(w, buf, w->numel);
        dl_no_grad_end(C);
        free(buf);
    }
    CHECK(dl_ddp_check(dp) == DL_ERR_DEVICE, "dl_ddp_check finds the drift");
    EXPECT_ERR(C, DL_ERR_DEVICE, "dl_ddp_check: replica 1 on cpu:1 has drifted from replica 0: parameter 0");
    dl_ddp_free(dp);
    CHECK(dl_ddp_check(NULL) == DL_ERR_ARG, "dl_ddp_check(NULL) is refused");
    {   /* a communicator of another context is refused (dl_ddp_step then read it freed
           once that context went); dl_comm_free is refused while a dl_ddp uses it (the
           dl_ddp used it freed); a model whose parameters hold no elements is refused
           (a division by zero) */
        dl_ctx *c2 = dl_ctx_init(NULL);
        dl_comm *cm = dl_comm_init(c2, NULL), *cm1 = dl_comm_init(C, NULL);
        dl_ddp_desc dd;
        dl_tensor *t = dl_ones(C, DL_SHAPE(3));
        dl_module *e = dl_module_new(C, "Empty", NULL, 0);
        memset(&dd, 0, sizeof dd);
        dd.comm = cm;
        CHECK(cm && cm1 && dl_ddp_init(1, r, NULL, &dd) == NULL, "a communicator of another context");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_ddp_init: desc.comm belongs to another context than the replicas");
        CHECK(dl_comm_allreduce(cm, &t, 1, DL_REDUCE_SUM) == DL_ERR_ARG, "allreduce of another context's tensor");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_comm_allreduce: t[0] (3) belongs to another context than the communicator");
        dd.comm = cm1;
        dp = dl_ddp_init(1, r, NULL, &dd);
        CHECK(dp != NULL, "dl_ddp_init on this context's communicator: %s", dl_error_message(C));
        dl_comm_free(cm1);
        EXPECT_ERR(C, DL_ERR_ARG, "dl_comm_free: 1 dl_ddp still use this communicator; dl_ddp_free it first");
        CHECK(dp && dl_ddp_check(dp) == DL_OK, "the dl_ddp still works");
        dl_ddp_free(dp);
        dl_comm_free(cm1);   /* now it goes */
        CHECK(dl_last_error(C) == DL_OK, "dl_comm_free after dl_ddp_free: %s", dl_error_message(C));
        if (e) dl_module_param(e, "w", dl_zeros(C, DL_SHAPE(0)));
        CHECK(e && dl_ddp_init(1, &e, NULL, NULL) == NULL, "a model of 0 elements");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_ddp_init: the model's 1 parameter(s) hold no elements");
        dl_ctx_free(c2);
        dl_step_end(C);
    }
}

/* ------------------------------------------------------------ DL_COMM_THREADS */

/* one rank: its own context (and 2 strict local devices), its communicator */
typedef struct rank_job {
    dl_comm_group *g;
    int rank, kind;                 /* kind 0: allreduce sizes, 1: dl_ddp, 2: hang (rank 1 never calls), 4: two rounds,
                                       3: dl_ddp_init of mismatch_model(variant) */
    int variant;
    int64_t count;
    int mean;
    double timeout;
    int buckets;                    /* kind 1: about this many gradient buckets (0: the default size) */
    int no_overlap;                 /* kind 1: sum the buckets after backward (the path without the hook) */
    int quit;                       /* kind 1: leave right after dl_ddp_init (a rank that dies) */
    /* results, checked by the main thread */
    int ok;
    char err[800];
    float *got[2];                  /* kind 0: each local replica after the allreduce */
    float *params;                  /* kind 1: replica 0's parameters after 20 steps */
    int64_t nparams;
    double secs;                    /* kind 2: how long the failing call took */
    int nb, early;                  /* kind 1: buckets; of them posted during the last backward */
} rank_job;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the next 32-row batch of the thread-rank dl_ddp test, from *rng: every
   rank and the reference draw the same batches */
static void rank_batch(uint32_t *rng, float *xb, int64_t *yb)
{
    int64_t k;
    for (k = 0; k < 32 * 784; k++) {
        *rng = *rng * 1664525u + 1013904223u;
        xb[k] = (float)((*rng >> 8) & 0xFFFFFF) / 16777216.0f * 2 - 1;
    }
    for (k = 0; k < 32; k++) {
        *rng = *rng * 1664525u + 1013904223u;
        yb[k] = (int64_t)((*rng >> 8) % 10);
    }
}

static float rank_value(int rank, int rep, int64_t i) { return sinf(0.7f * (float)i + (float)(3 * rank + rep)) * 0.5f; }

/* a thread rank's context (one thread; with strict: and 2 strict local
   devices) and its communicator; NULL with err filled (nothing left) */
static dl_comm *rank_comm(dl_comm_group *g, int rank, double timeout, bool strict, dl_ctx **out, char *err,
                          size_t errn)
{
    dl_ctx_desc cd;
    dl_comm_desc md;
    dl_comm *comm;
    memset(&cd, 0, sizeof cd);
    cd.cpu_devices = strict ? 2 : 0;
    cd.strict_devices = strict;
    cd.num_threads = 1;
    cd.log = dl_log_silent;
    *out = dl_ctx_init(&cd);
    if (!*out) { snprintf(err, errn, "rank %d: no context", rank); return NULL; }
    memset(&md, 0, sizeof md);
    md.backend = DL_COMM_THREADS;
    md.group = g;
    md.rank = rank;
    md.timeout = timeout;
    comm = dl_comm_init(*out, &md);
    if (!comm) { snprintf(err, errn, "%s", dl_error_message(*out)); dl_ctx_free(*out); *out = NULL; }
    return comm;
}

/* kind 6: a custom identity whose backward fails on rank 0, between two Linear layers:
   rank 0's step fails after its hook posted the second layer's buckets */
static dl_tensor *wd_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)fc; (void)n; (void)user;
    return dl_mul_scalar(in[0], 1.0f);
}
static dl_result wd_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    if (*(const int *)user == 0) {
        dl__err(dl_tensor_ctx(g), DL_ERR_ARG, "wd_bwd: rank 0 fails here");
        return DL_ERR_ARG;
    }
    if (dl_fn_needs_grad(fc, 0)) gin[0] = g;
    return DL_OK;
}
static const dl_function WdId = {"WdId", wd_fwd, wd_bwd};
static dl_tensor *wd_loss(dl_module *m, dl_tensor *x, dl_tensor *y, void *user)
{
    dl_tensor *h = dl_module_forward(dl_module_child(m, "0"), x);
    h = dl_function_apply(&WdId, 1, &h, user);
    return dl_mse_loss(dl_module_forward(dl_module_child(m, "1"), h), y, NULL);
}
/* the same identity at the output: rank 0's backward fails before any bucket is posted */
static dl_tensor *wd_loss_top(dl_module *m, dl_tensor *x, dl_tensor *y, void *user)
{
    dl_tensor *h = dl_module_forward(dl_module_child(m, "1"), dl_module_forward(dl_module_child(m, "0"), x));
    return dl_mse_loss(dl_function_apply(&WdId, 1, &h, user), y, NULL);
}
static dl_tensor *mse_loss_fn(dl_module *m, dl_tensor *x, dl_tensor *y, void *user)
{
    (void)user;
    return dl_mse_loss(dl_module_forward(m, x), y, NULL);
}

static void *rank_main(void *arg)
{
    rank_job *j = (rank_job *)arg;
    dl_ctx *c;
    dl_comm *comm = rank_comm(j->g, j->rank, j->timeout, true, &c, j->err, sizeof j->err);
    if (!comm) return NULL;
    if (j->kind == 0) {               /* 2 local replicas per rank, then across the ranks */
        dl_tensor *t[2];
        float *v = (float *)malloc(sizeof(float) * (size_t)j->count);
        int r;
        int64_t i;
        for (r = 0; r < 2; r++) {
            for (i = 0; i < j->count; i++) v[i] = rank_value(j->rank, r, i);
            dl_set_device(c, dl_cpu_device(r));
            t[r] = dl_from_array(c, DL_SHAPE(j->count), v);
        }
        free(v);
        j->ok = dl_comm_allreduce(comm, t, 2, j->mean ? DL_REDUCE_MEAN : DL_REDUCE_SUM) == DL_OK;
        for (r = 0; r < 2 && j->ok; r++) {
            j->got[r] = (float *)malloc(sizeof(float) * (size_t)j->count);
            dl_read(t[r], j->got[r], j->count);
        }
    } else if (j->kind == 1) {        /* dl_ddp over the ranks, one replica each, on its rows */
        dl_module *m;
        dl_optim *o;
        dl_ddp *dp;
        dl_ddp_desc dd;
        dl_sgd_desc sd;
        const dl_named_tensor *pa;
        float *xb = (float *)malloc(sizeof(float) * 32 * 784);
        int64_t yb[32], k;
        uint32_t rng = 4242;
        int step, np, q;
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.05f;
        sd.momentum = 0.9f;
        dl_manual_seed(c, 100 + (uint64_t)j->rank);   /* different inits: dl_ddp_init copies rank 0's */
        m = make_model(c, 0);
        o = dl_sgd(m, &sd);
        memset(&dd, 0, sizeof dd);
        dd.comm = comm;
        if (j->buckets) {
            int64_t total = 0;
            np = dl_module_named_parameters(m, &pa);
            for (q = 0; q < np; q++) total += pa[q].t->numel;
            dd.bucket_bytes = (int64_t)sizeof(float) * (total / j->buckets + 1);
        }
        dp = dl_ddp_init(1, &m, &o, &dd);
        j->ok = dp != NULL;
        if (dp && j->no_overlap) dp->overlap = false;
        j->secs = now_s();
        for (step = 0; step < (j->quit ? 0 : 20) && j->ok; step++) {
            rank_batch(&rng, xb, yb);
            j->ok = dl_ddp_step(dp, dl_from_array(c, DL_SHAPE(16, 1, 28, 28), xb + j->rank * 16 * 784),
                                dl_from_int64(c, DL_SHAPE(16), yb + j->rank * 16), ce_loss, NULL, NULL) == DL_OK;
            dl_step_end(c);
        }
        if (dp) { j->nb = dp->nb; j->early = dp->early; }
        j->secs = now_s() - j->secs;
        np = dl_module_named_parameters(m, &pa);
        for (q = 0, j->nparams = 0; q < np; q++) j->nparams += pa[q].t->numel;
        j->params = (float *)malloc(sizeof(float) * (size_t)j->nparams);
        for (q = 0, k = 0; q < np && j->ok; q++) { dl_read(pa[q].t, j->params + k, pa[q].t->numel); k += pa[q].t->numel; }
        free(xb);
    } else if (j->kind == 3) {        /* unlike models: refused on every rank; the communicator still works */
        dl_module *m = mismatch_model(c, j->variant);
        dl_ddp_desc dd;
        dl_tensor *t;
        memset(&dd, 0, sizeof dd);
        dd.comm = comm;
        j->ok = dl_ddp_init(1, &m, NULL, &dd) != NULL;
        snprintf(j->err, sizeof j->err, "%s", dl_error_message(c));
        t = dl_ones(c, DL_SHAPE(3));
        j->nb = dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) == DL_OK && th_f(t, 2) == (float)j->g->size;
        dl_ctx_free(c);
        return NULL;
    } else if (j->kind == 5) {        /* calls that differ between the ranks */
        dl_tensor *t = dl_full(c, DL_SHAPE(4), (float)(j->rank + 1));
        double t0 = now_s();
        if (j->variant == 0) {        /* two roots, then SUM against MEAN: refused on both; the comm goes on */
            j->ok = dl_comm_broadcast(comm, &t, 1, 1 - j->rank) == DL_ERR_ARG &&
                    strstr(dl_error_message(c), "every process must pass the same root") != NULL;
            j->nb = j->ok && dl_comm_allreduce(comm, &t, 1, j->rank ? DL_REDUCE_MEAN : DL_REDUCE_SUM) == DL_ERR_ARG &&
                    strstr(dl_error_message(c), "every process must pass the same reduce op") != NULL;
            dl_clear_error(c);
            j->early = j->nb && dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) == DL_OK && th_f(t, 0) == 3.0f;
        } else if (j->variant == 1) { /* a barrier against an allreduce: both fail at once (it hung) */
            j->ok = (j->rank ? dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) : dl_comm_barrier(comm)) == DL_ERR_ARG &&
                    strstr(dl_error_message(c), "every rank must make the same calls in the same order") != NULL;
        } else {                      /* dl_ddp_init's broadcast against an allreduce of as many floats as bytes
                                         (a heap-buffer-overflow: the units differed) */
            dl_module *m = dl_nn_linear(c, 1, 4, true);
            dl_tensor *u = dl_ones(c, DL_SHAPE(8));
            dl_ddp_desc dd;
            memset(&dd, 0, sizeof dd);
            dd.comm = comm;
            j->ok = (j->rank ? dl_comm_allreduce(comm, &u, 1, DL_REDUCE_SUM) == DL_ERR_ARG
                             : dl_ddp_init(1, &m, NULL, &dd) == NULL) &&
                    strstr(dl_error_message(c), "every rank must make the same calls in the same order") != NULL;
        }
        j->secs = now_s() - t0;
        snprintf(j->err, sizeof j->err, "%s", dl_error_message(c));
        dl_ctx_free(c);
        return NULL;
    } else if (j->kind == 6) {        /* rank 0's step fails after posting buckets: rank 1 fails, naming it */
        dl_module *ms[2], *m;
        dl_optim *o;
        dl_ddp *dp;
        dl_ddp_desc dd;
        dl_sgd_desc sd;
        struct timespec ts;
        ms[0] = dl_nn_linear(c, 64, 64, true);
        ms[1] = dl_nn_linear(c, 64, 32, true);
        m = dl_nn_sequential(c, 2, ms);
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.01f;
        o = dl_sgd(m, &sd);
        memset(&dd, 0, sizeof dd);
        dd.comm = comm;
        dd.bucket_bytes = 4 * 1024;
        dp = dl_ddp_init(1, &m, &o, &dd);
        if (dp && j->rank) {          /* rank 1 posts last */
            ts.tv_sec = 0;
            ts.tv_nsec = 100000000L;
            nanosleep(&ts, NULL);
        }
        j->secs = now_s();
        j->ok = dp && dl_ddp_step(dp, dl_randn(c, DL_SHAPE(4, 64)), dl_randn(c, DL_SHAPE(4, 32)),
                                  j->variant ? wd_loss_top : wd_loss, &j->rank, NULL) != DL_OK;
        j->secs = now_s() - j->secs;
        if (j->ok && j->rank == 1) j->ok = strstr(dl_error_message(c), "rank 0's dl_ddp_step failed at this step") != NULL;
        snprintf(j->err, sizeof j->err, "%s", dl_error_message(c));
        if (j->ok) {                  /* every rank failed that step: the communicator goes on */
            dl_tensor *t = dl_ones(c, DL_SHAPE(3));
            dl_clear_error(c);
            j->ok = dl_comm_barrier(comm) == DL_OK && dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) == DL_OK &&
                    th_f(t, 0) == 2.0f;
            if (!j->ok) snprintf(j->err, sizeof j->err, "after: %s", dl_error_message(c));
        }
        if (dp) dl_ddp_free(dp);      /* (its buffers: no sum may touch them after) */
        dl_ctx_free(c);
        return NULL;
    } else if (j->kind == 7) {        /* two dl_ddp on one communicator (a GAN's two nets) */
        dl_ddp *dd2[2];
        int q, st;
        static const int order[5] = {0, 1, 0, 0, 0};
        for (q = 0; q < 2; q++) {
            dl_module *m;
            dl_optim *o;
            dl_sgd_desc sd;
            dl_ddp_desc dd;
            dl_manual_seed(c, 7);
            m = dl_nn_linear(c, 8, 4, true);
            memset(&sd, 0, sizeof sd);
            sd.lr = 0.05f;
            o = dl_sgd(m, &sd);
            memset(&dd, 0, sizeof dd);
            dd.comm = comm;
            dd2[q] = dl_ddp_init(1, &m, &o, &dd);
        }
        j->ok = dd2[0] && dd2[1];
        for (st = 0; st < 5 && j->ok; st++) {
            if (st == 4 && j->rank == 0) dl_ddp_free(dd2[1]);   /* B, idle since step 1: freed (it broke the group) */
            j->ok = dl_ddp_step(dd2[order[st]], dl_randn(c, DL_SHAPE(2, 8)), dl_randn(c, DL_SHAPE(2, 4)), mse_loss_fn,
                                NULL, NULL) == DL_OK && dl_comm_barrier(comm) == DL_OK;
            dl_step_end(c);
        }
    } else if (j->kind == 4) {        /* two rounds: allreduce, leave, join again at once (rank 1 leaves late) */
        int round;
        for (round = 0; round < 2 && comm; round++) {
            dl_tensor *t = dl_ones(c, DL_SHAPE(4));
            j->ok = dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) == DL_OK && th_f(t, 3) == 2.0f;
            if (!j->ok) break;
            if (j->rank == 1) {
                struct timespec ts;
                ts.tv_sec = 0;
                ts.tv_nsec = 300000000L;
                nanosleep(&ts, NULL);
            }
            dl_ctx_free(c);
            c = NULL;
            if (round == 0 && !(comm = rank_comm(j->g, j->rank, j->timeout, true, &c, j->err, sizeof j->err)))
                return NULL;
        }
        if (!c) return NULL;
    } else if (j->rank == 0) {        /* kind 2: rank 1 never calls */
        dl_tensor *t = dl_ones(c, DL_SHAPE(10));
        double t0 = now_s();
        j->ok = dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) == DL_OK;
        j->secs = now_s() - t0;
    } else {                          /* (and stays joined, hanging, past rank 0's timeout) */
        struct timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = 800000000L;
        nanosleep(&ts, NULL);
        j->ok = 1;
        if (j->variant == 1) {        /* then calls, after rank 0 gave up */
            dl_tensor *t = dl_ones(c, DL_SHAPE(10));
            j->ok = dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) == DL_OK;
        }
    }
    if (!j->ok) snprintf(j->err, sizeof j->err, "%s", dl_error_message(c));
    dl_ctx_free(c);                   /* frees the communicator: the rank is given back */
    return NULL;
}

static void run_ranks(rank_job *j, int n)
{
    pthread_t th[8];
    int i;
    for (i = 0; i < n; i++) pthread_create(&th[i], NULL, rank_main, &j[i]);
    for (i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void test_comm_threads(void)
{
    static const int64_t sizes[] = {1, 7, 1000, 65536 * 2 + 3};
    dl_comm_group *g;
    rank_job j[3];
    int n, si, mean, i, r, k;
    /* bad input */
    CHECK(dl_comm_group_new(0) == NULL, "a group of 0 ranks");
    EXPECT_ERR(NULL, DL_ERR_ARG, "dl_comm_group_new: size=0; it must be 1..64");
    CHECK(dl_comm_group_new(65) == NULL, "a group of 65 ranks");
    g = dl_comm_group_new(2);
    {
        dl_comm_desc md;
        dl_comm *a, *b;
        memset(&md, 0, sizeof md);
        md.backend = DL_COMM_THREADS;
        CHECK(dl_comm_init(C, &md) == NULL, "THREADS without a group");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_comm_init: DL_COMM_THREADS needs .group from dl_comm_group_new (got NULL)");
        md.group = g;
        md.rank = 2;
        CHECK(dl_comm_init(C, &md) == NULL, "rank 2 of 2");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_comm_init: rank=2; the group has ranks 0..1");
        md.rank = 1;
        a = dl_comm_init(C, &md);
        CHECK(a && dl_comm_rank(a) == 1 && dl_comm_size(a) == 2, "rank 1 of 2: %s", dl_error_message(C));
        b = dl_comm_init(C, &md);
        CHECK(b == NULL, "rank 1 twice");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_comm_init: rank 1 of the group is already taken");
        dl_comm_group_free(g);          /* refused: rank 1 has joined */
        EXPECT_ERR(NULL, DL_ERR_ARG, "dl_comm_group_free: 1 rank(s) still joined");
        dl_comm_free(a);
        dl_clear_error(C);
    }
    dl_comm_group_free(g);
    /* allreduce: 2 and 3 ranks x 2 local replicas, against the sequential sum; the same bits everywhere */
    for (n = 2; n <= 3; n++)
        for (si = 0; si < 4; si++)
            for (mean = 0; mean < 2; mean++) {
                int64_t count = sizes[si], k;
                int same = 1, close = 1, ok = 1;
                g = dl_comm_group_new(n);
                memset(j, 0, sizeof j);
                for (i = 0; i < n; i++) {
                    j[i].g = g; j[i].rank = i; j[i].kind = 0; j[i].count = count; j[i].mean = mean; j[i].timeout = 60;
                }
                run_ranks(j, n);
                for (i = 0; i < n; i++) {
                    ok &= j[i].ok;
                    CHECK(j[i].ok, "threads allreduce, rank %d of %d: %s", i, n, j[i].err);
                }
                for (i = 0; ok && i < n; i++)
                    for (r = 0; r < 2; r++)
                        if (memcmp(j[i].got[r], j[0].got[0], sizeof(float) * (size_t)count) != 0) same = 0;
                for (k = 0; ok && k < count; k++) {
                    double sum = 0;
                    for (i = 0; i < n; i++)
                        for (r = 0; r < 2; r++) sum += rank_value(i, r, k);
                    if (mean) sum /= 2 * n;
                    if (fabs(sum - j[0].got[0][k]) > 1e-5 * (1 + fabs(sum))) close = 0;
                }
                CHECK(ok && same, "threads: %s of %lld over %d ranks x 2 devices: every replica of every rank "
                      "has the same bits", mean ? "mean" : "sum", (long long)count, n);
                CHECK(ok && close, "threads: %s of %lld over %d ranks x 2 devices = the sequential sum",
                      mean ? "mean" : "sum", (long long)count, n);
                for (i = 0; i < n; i++) { free(j[i].got[0]); free(j[i].got[1]); }
                dl_comm_group_free(g);
            }
    /* dl_ddp over 2 thread ranks (16 rows each) = one model on the 32-row batch:
       one bucket; ~8 buckets, each summed as soon as backward has finished
       its gradients (the ready hook); the same ~8 buckets summed after
       backward, which must give the same bits */
    {
        dl_module *ref;
        dl_optim *oref;
        dl_sgd_desc sd;
        const dl_named_tensor *pa;
        float *xb = (float *)malloc(sizeof(float) * 32 * 784), *rp, *prev = NULL;
        int64_t yb[32], k, nref = 0;
        uint32_t rng = 4242;
        int step, np, q, cfg;
        double worst = 0, scale = 0;
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.05f;
        sd.momentum = 0.9f;
        dl_set_device(C, dl_cpu());
        dl_manual_seed(C, 100);             /* rank 0's init */
        ref = make_model(C, 0);
        oref = dl_sgd(ref, &sd);
        for (step = 0; step < 20; step++) {
            rank_batch(&rng, xb, yb);
            ref_step(C, ref, oref, xb, yb, 32);
            dl_step_end(C);
        }
        np = dl_module_named_parameters(ref, &pa);
        for (q = 0; q < np; q++) nref += pa[q].t->numel;
        rp = (float *)malloc(sizeof(float) * (size_t)nref);
        for (q = 0, k = 0; q < np; q++) { dl_read(pa[q].t, rp + k, pa[q].t->numel); k += pa[q].t->numel; }
        for (k = 0; k < nref; k++) if (fabs(rp[k]) > scale) scale = fabs(rp[k]);
        for (cfg = 0; cfg < 3; cfg++) {
            static const char *what[3] = {"one bucket", "8 buckets, overlapped", "8 buckets, after backward"};
            g = dl_comm_group_new(2);
            memset(j, 0, sizeof j);
            for (i = 0; i < 2; i++) {
                j[i].g = g; j[i].rank = i; j[i].kind = 1; j[i].timeout = 60;
                j[i].buckets = cfg ? 8 : 0;
                j[i].no_overlap = cfg == 2;
            }
            run_ranks(j, 2);
            CHECK(j[0].ok && j[1].ok, "dl_ddp over 2 thread ranks, %s: %s %s", what[cfg], j[0].err, j[1].err);
            if (j[0].ok && j[1].ok && j[0].nparams == nref) {
                worst = 0;
                for (k = 0; k < nref; k++) if (fabs(rp[k] - j[0].params[k]) > worst) worst = fabs(rp[k] - j[0].params[k]);
                CHECK(worst <= 1e-5 * scale, "dl_ddp over 2 thread ranks, %s = one model on the full batch after "
                      "20 steps (worst %.3g, scale %.3g)", what[cfg], worst, scale);
                CHECK(memcmp(j[0].params, j[1].params, sizeof(float) * (size_t)nref) == 0,
                      "dl_ddp over 2 thread ranks, %s: rank 1 = rank 0, bit for bit", what[cfg]);
                if (cfg == 1)
                    CHECK(j[0].nb >= 8 && j[0].early == j[0].nb && j[1].early == j[1].nb,
                          "%s: all %d buckets posted from backward's hook (rank 0: %d, rank 1: %d)", what[cfg],
                          j[0].nb, j[0].early, j[1].early);
                if (cfg == 2) {
                    CHECK(j[0].early == 0, "%s: no bucket posted during backward (%d)", what[cfg], j[0].early);
                    CHECK(prev && memcmp(j[0].params, prev, sizeof(float) * (size_t)nref) == 0,
                          "8 buckets: overlapped = summed after backward, bit for bit");
                }
            }
            free(prev);
            prev = j[0].params;
            free(j[1].params);
            dl_comm_group_free(g);
        }
        free(prev); free(rp); free(xb);
        dl_optim_free(oref);
    }
    /* a rank that leaves after dl_ddp_init (its dl_comm freed, as when it
       fails): the other's first step fails at once naming it, not after the
       timeout (it waited the whole 300 s before) */
    g = dl_comm_group_new(2);
    memset(j, 0, sizeof j);
    for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 1; j[i].timeout = 60; j[i].buckets = 8; }
    j[1].quit = 1;
    run_ranks(j, 2);
    CHECK(!j[0].ok && strstr(j[0].err, "dl_ddp_step: rank 0 of 2 (threads)") && strstr(j[0].err, "rank 1 left the "
          "group (its dl_comm was freed: it failed or stopped early") != NULL, "ddp, a rank that left: got '%s'",
          j[0].err);
    CHECK(j[0].secs < 10, "ddp, a rank that left: failed after %.2f s (timeout 60 s)", j[0].secs);
    free(j[0].params); free(j[1].params);
    /* every rank has left: the group is joined again, whole */
    memset(j, 0, sizeof j);
    for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 0; j[i].count = 5; j[i].timeout = 60; }
    run_ranks(j, 2);
    CHECK(j[0].ok && j[1].ok, "the group after a broken round: '%s' '%s'", j[0].err, j[1].err);
    for (i = 0; i < 2; i++) { free(j[i].got[0]); free(j[i].got[1]); }
    dl_comm_group_free(g);
    /* ranks that leave and join again at once, one of them leaving round 1 later: the
       early one waits for the round to end, then both rounds succeed (round 2 failed,
       and the other rank waited out its timeout) */
    g = dl_comm_group_new(2);
    memset(j, 0, sizeof j);
    for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 4; j[i].timeout = 20; }
    {
        double t0 = now_s();
        run_ranks(j, 2);
        CHECK(j[0].ok && j[1].ok && now_s() - t0 < 10, "two rounds on one group: '%s' '%s' (%.1f s)", j[0].err,
              j[1].err, now_s() - t0);
    }
    dl_comm_group_free(g);
    /* calls that differ: two broadcast roots, SUM against MEAN (DL_OK with neither
       answer before), a barrier against an allreduce (it hung, with no deadline) */
    for (k = 0; k < 3; k++) {
        g = dl_comm_group_new(2);
        memset(j, 0, sizeof j);
        for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 5; j[i].variant = k; j[i].timeout = 20; }
        run_ranks(j, 2);
        for (i = 0; i < 2; i++)
            CHECK(j[i].ok && (k || (j[i].nb && j[i].early)) && j[i].secs < 10, "unlike calls %d, rank %d: %s (%.1f s)",
                  k, i, j[i].err, j[i].secs);
        dl_comm_group_free(g);
    }
    /* a step that fails with buckets posted: they are withdrawn, the other rank's
       step fails at once naming it (and sums nothing into the freed buffers), and
       the communicator goes on */
    for (k = 0; k < 2; k++) {   /* (1: it fails before posting any: rank 1 waited out its timeout) */
        g = dl_comm_group_new(2);
        memset(j, 0, sizeof j);
        for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 6; j[i].variant = k; j[i].timeout = 20; }
        run_ranks(j, 2);
        CHECK(j[0].ok && j[1].ok && j[1].secs < 10, "a failed step (%s): rank 0 '%s', rank 1 '%s' after %.1f s",
              k ? "nothing posted" : "buckets posted", j[0].err, j[1].err, j[1].secs);
        dl_comm_group_free(g);
    }
    /* two dl_ddp on one communicator: freeing the idle one broke the group (its
       long-reused slots looked unsummed) */
    g = dl_comm_group_new(2);
    memset(j, 0, sizeof j);
    for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 7; j[i].timeout = 20; }
    run_ranks(j, 2);
    CHECK(j[0].ok && j[1].ok, "two dl_ddp, one freed: rank 0 '%s', rank 1 '%s'", j[0].err, j[1].err);
    dl_comm_group_free(g);
    /* a rank that never comes: the other fails after its timeout, with the message */
    g = dl_comm_group_new(2);
    memset(j, 0, sizeof j);
    for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 2; j[i].timeout = 0.3; }
    run_ranks(j, 2);
    CHECK(!j[0].ok && strstr(j[0].err, "dl_comm_allreduce: rank 0 of 2 (threads) waited up to 0.3 s for the other "
          "ranks: rank(s) 1 did not come in time (dead, hung, failed") != NULL, "a missing rank, named: got '%s'", j[0].err);
    CHECK(j[0].secs >= 0.25 && j[0].secs < 10, "a missing rank: failed after %.2f s (timeout 0.3 s)", j[0].secs);
    dl_comm_group_free(g);
    /* the late rank itself is told it came too late, not that it did not come */
    g = dl_comm_group_new(2);
    memset(j, 0, sizeof j);
    for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 2; j[i].variant = 1; j[i].timeout = 0.05; }
    run_ranks(j, 2);
    CHECK(!j[0].ok && strstr(j[0].err, "rank 0 of 2 (threads) waited up to 0.05 s for the other ranks: rank(s) 1 "
          "did not come in time") != NULL, "a late rank, named by the other: got '%s'", j[0].err);
    CHECK(!j[1].ok && strstr(j[1].err, "dl_comm_allreduce: rank 1 of 2 (threads) came too late: the other ranks "
          "had waited up to 0.05 s for it and given up (slower than the timeout") != NULL,
          "the late rank is told so: got '%s'", j[1].err);
    dl_comm_group_free(g);
}

/* ranks that build unlike models: dl_ddp_init fails on every rank naming
   the first difference (a name, a shape, an extra layer on either side,
   two of three ranks), instead of summing unlike gradients or waiting out
   the timeout; the communicator goes on working */
static void test_threads_mismatch(void)
{
    static const struct { int n, v[3]; const char *what; } cases[] = {
        {2, {1, 2, 0}, "rank 1's state_dict entry 0 is 'other_name' float32 (4,3) parameter where rank 0's is "
                       "'w' float32 (3,4) parameter"},
        {2, {0, 3, 0}, "rank 1's state_dict entry 1 is '0.bias' float32 (5) parameter where rank 0's is "
                       "'0.bias' float32 (4) parameter"},
        {2, {0, 4, 0}, "rank 1's state_dict entry 2 is '1.weight' float32 (4,4) parameter where rank 0's has only "
                       "2 entries"},
        {2, {4, 0, 0}, "rank 1's state_dict has only 2 entries where rank 0's entry 2 is '1.weight' float32 (4,4) "
                       "parameter"},
        {3, {0, 3, 4}, "(2 of 3 differ from rank 0; this is rank %d): rank 1's state_dict entry 1 is '0.bias' "
                       "float32 (5) parameter where rank 0's is '0.bias' float32 (4) parameter; every rank must"}};
    rank_job j[3];
    dl_comm_group *g;
    int c, i;
    for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        g = dl_comm_group_new(cases[c].n);
        memset(j, 0, sizeof j);
        for (i = 0; i < cases[c].n; i++) {
            j[i].g = g; j[i].rank = i; j[i].kind = 3; j[i].variant = cases[c].v[i]; j[i].timeout = 60;
        }
        run_ranks(j, cases[c].n);
        for (i = 0; i < cases[c].n; i++) {
            char want[400], head[160];
            snprintf(want, sizeof want, cases[c].what, i);
            snprintf(head, sizeof head, "dl_ddp_init: the ranks hold different models (%d of %d differ from rank 0; "
                     "this is rank %d): ", c == 4 ? 2 : 1, cases[c].n, i);
            CHECK(!j[i].ok && strstr(j[i].err, want) && (c == 4 || strstr(j[i].err, head) == j[i].err),
                  "unlike models, case %d, rank %d: got '%s'", c, i, j[i].err);
            CHECK(j[i].nb, "unlike models, case %d, rank %d: the communicator still sums", c, i);
        }
        dl_comm_group_free(g);
    }
    /* alike models (variant 0 everywhere): accepted */
    g = dl_comm_group_new(2);
    memset(j, 0, sizeof j);
    for (i = 0; i < 2; i++) { j[i].g = g; j[i].rank = i; j[i].kind = 3; j[i].timeout = 60; }
    run_ranks(j, 2);
    CHECK(j[0].ok && j[1].ok, "alike models: dl_ddp_init: %s %s", j[0].err, j[1].err);
    dl_comm_group_free(g);
}

/* What a hostile review of the thread ranks found (2026-11-28); each case
   failed before its fix. A model of two linear layers "a" and "b"; the
   loss uses b only where user says so (a layer some ranks' losses skip). */
static dl_tensor *ab_loss(dl_module *m, dl_tensor *x, dl_tensor *y, void *user)
{
    dl_tensor *l = dl_sum(dl_module_forward(dl_module_child(m, "a"), x), DL_ALL, false);
    (void)y;
    return user ? dl_add(l, dl_sum(dl_module_forward(dl_module_child(m, "b"), x), DL_ALL, false)) : l;
}

static dl_module *ab_model(dl_ctx *c)
{
    dl_module *m = dl_module_new(c, "AB", NULL, 0);
    dl_module_add(m, "a", dl_nn_linear(c, 6, 3, true));
    dl_module_add(m, "b", dl_nn_linear(c, 6, 2, true));
    return m;
}

typedef struct review_job {
    dl_comm_group *g;
    int rank, kind;   /* 0: allreduce of 10 floats (rank 1: 11, or 0 with zero); 1: two dl_ddp on one
                         communicator; 2: layer b in rank 0's loss only; 3: in every rank's loss at
                         step 0, in none after (SGD with momentum and weight decay; params[1]:
                         the parameters after step 0) */
    int zero;
    dl_result rc;
    double secs;
    float params[2][64];   /* kinds 1, 2: each model's parameters after the steps */
    char err[800];
} review_job;

static void *review_rank(void *arg)
{
    review_job *j = (review_job *)arg;
    dl_ctx *c;
    dl_comm *comm = rank_comm(j->g, j->rank, 30, false, &c, j->err, sizeof j->err);
    if (!comm) { j->rc = DL_ERR_ARG; return NULL; }
    if (j->kind == 0) {
        dl_tensor *t = dl_ones(c, DL_SHAPE(j->rank == 1 ? (j->zero ? 0 : 11) : 10));
        double t0 = now_s();
        j->rc = dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM);
        j->secs = now_s() - t0;
    } else {
        dl_module *m[2];
        dl_optim *o[2];
        dl_ddp *dp[2];
        dl_ddp_desc dd;
        float xv[4 * 6];
        int k, step, nm = j->kind == 1 ? 2 : 1, i;
        for (i = 0; i < 4 * 6; i++) xv[i] = sinf((float)(i + 7 * j->rank));
        memset(&dd, 0, sizeof dd);
        dd.comm = comm;
        dd.bucket_bytes = 36;   /* several buckets: some summed during backward */
        for (k = 0; k < nm; k++) {
            dl_sgd_desc sd;
            memset(&sd, 0, sizeof sd);
            if (j->kind == 3) { sd.lr = 0.1f; sd.momentum = 0.9f; sd.weight_decay = 0.1f; }
            dl_manual_seed(c, 10 + (uint64_t)(j->rank + 3 * k));
            m[k] = ab_model(c);
            o[k] = dl_sgd(m[k], j->kind == 3 ? &sd : NULL);
            dp[k] = dl_ddp_init(1, &m[k], &o[k], &dd);
        }
        j->rc = dp[0] && (nm == 1 || dp[1]) ? DL_OK : dl_last_error(c);

        for (step = 0; step < 5 && j->rc == DL_OK; step++)
            for (k = 0; k < nm && j->rc == DL_OK; k++) {
                dl_tensor *x = dl_from_array(c, DL_SHAPE(4, 6), xv);
                j->rc = dl_ddp_step(dp[k], x, x, ab_loss, j->kind == 1 || (j->kind == 2 && j->rank == 0) ||
                                    (j->kind == 3 && step == 0) ? (void *)1 : NULL, NULL);
                if (j->kind == 3 && step == 0 && j->rc == DL_OK) {
                    const dl_named_tensor *pa;
                    int np = dl_module_named_parameters(m[0], &pa), q, off = 0;
                    for (q = 0; q < np; q++) {
                        dl_read(pa[q].t, j->params[1] + off, pa[q].t->numel);
                        off += (int)pa[q].t->numel;
                    }
                }
                dl_step_end(c);
            }
        for (k = 0; k < nm && j->rc == DL_OK; k++) {
            const dl_named_tensor *pa;
            int np = dl_module_named_parameters(m[k], &pa), q, off = 0;
            for (q = 0; q < np; q++) { dl_read(pa[q].t, j->params[k] + off, pa[q].t->numel); off += (int)pa[q].t->numel; }
        }
    }
    if (j->rc != DL_OK) snprintf(j->err, sizeof j->err, "%s", dl_error_message(c));
    dl_ctx_free(c);
    return NULL;
}

static void test_threads_review(void)
{
    review_job j[2];
    pthread_t th[2];
    int kind, zero, i;
    for (kind = 0; kind < 4; kind++)
        for (zero = 0; zero < (kind == 0 ? 2 : 1); zero++) {
            dl_comm_group *g = dl_comm_group_new(2);
            memset(j, 0, sizeof j);
            for (i = 0; i < 2; i++) {
                j[i].g = g; j[i].rank = i; j[i].kind = kind; j[i].zero = zero;
                pthread_create(&th[i], NULL, review_rank, &j[i]);
            }
            for (i = 0; i < 2; i++) pthread_join(th[i], NULL);
            if (kind == 0) {   /* unlike sizes (0 too): refused on both ranks at once, not after the timeout */
                for (i = 0; i < 2; i++)
                    CHECK(j[i].rc == DL_ERR_SHAPE && strstr(j[i].err, "every process must pass the same shapes") &&
                          j[i].secs < 10, "rank %d, %s floats against 10: %s after %.1f s: %s", i, zero ? "0" : "11",
                          dl_result_string(j[i].rc), j[i].secs, j[i].err);
            } else {           /* the ranks' models stay identical */
                CHECK(j[0].rc == DL_OK && j[1].rc == DL_OK, "kind %d: %s / %s", kind, j[0].err, j[1].err);
                CHECK(memcmp(j[0].params, j[1].params, sizeof j[0].params) == 0, "kind %d (%s): the ranks' "
                      "replicas drifted apart", kind, kind == 1 ? "two dl_ddp on one communicator"
                      : kind == 2 ? "a layer in rank 0's loss only" : "a layer in no rank's loss");
                if (kind == 3)   /* (its gradient none on every rank after step 0: skipped, its
                                    momentum and weight decay too) */
                    CHECK(memcmp(j[0].params[0] + 21, j[0].params[1] + 21, 14 * sizeof(float)) == 0 &&
                          memcmp(j[0].params[0], j[0].params[1], 21 * sizeof(float)) != 0,
                          "a layer in no rank's loss after step 0: not updated (as PyTorch's zero_grad, "
                          "set to None), the other one is");
            }
            dl_comm_group_free(g);
        }
}

#if defined(DL_NCCL) && defined(DL_CUDA)
/* NCCL with one rank on cuda:0 (make test-nccl, on a GPU machine): the
   communicator's allreduce, then dl_ddp with 8 buckets, each summed by NCCL
   on the communicator's stream as soon as backward has finished its
   gradients: 20 steps = one model on the full batch (rel. 1e-5; one rank's
   sum is its own gradient, so the bits should match too: printed) */
static void test_nccl(void)
{
    dl_ctx_desc d;
    dl_comm_desc md;
    dl_ctx *c;
    dl_comm *comm;
    dl_module *m, *ref;
    dl_optim *o, *oref;
    dl_sgd_desc sd;
    dl_ddp_desc dd;
    dl_ddp *dp;
    const dl_named_tensor *pa, *pb;
    float v[5] = {1, -2, 3.5f, 0.25f, 7}, got[5];
    float *xb = (float *)malloc(sizeof(float) * 32 * 784);
    int64_t yb[32];
    uint32_t rng = 99;
    int step, np, q, same = 1, ok = 1;
    double worst = 0, scale = 0;
    dl_tensor *t;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    c = dl_ctx_init(&d);
    if (!c || dl_device_count(c, DL_DEVICE_CUDA) < 1 || (getenv("DL_CUDA_EMULATE") && *getenv("DL_CUDA_EMULATE"))) {
        SKIP("NCCL: no CUDA device here (emulated devices have no NCCL)");
        dl_ctx_free(c);
        free(xb);
        return;
    }
    memset(&md, 0, sizeof md);
    md.backend = DL_COMM_NCCL;
    comm = dl_comm_init(c, &md);
    CHECK(comm && dl_comm_size(comm) == 1 && dl_comm_rank(comm) == 0, "NCCL communicator of one rank: %s",
          dl_error_message(c));
    if (!comm) { dl_ctx_free(c); free(xb); return; }
    dl_set_device(c, dl_cuda(0));
    t = dl_from_array(c, DL_SHAPE(5), v);
    CHECK(dl_comm_allreduce(comm, &t, 1, DL_REDUCE_SUM) == DL_OK && dl_read(t, got, 5) == DL_OK &&
          memcmp(got, v, sizeof v) == 0, "NCCL allreduce of one rank = its tensor: %s", dl_error_message(c));
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.05f;
    sd.momentum = 0.9f;
    dl_manual_seed(c, 5);
    ref = make_model(c, 0);
    dl_module_to(ref, dl_cuda(0));
    oref = dl_sgd(ref, &sd);
    dl_manual_seed(c, 5);
    m = make_model(c, 0);
    dl_module_to(m, dl_cuda(0));
    o = dl_sgd(m, &sd);
    memset(&dd, 0, sizeof dd);
    dd.comm = comm;
    dd.bucket_bytes = 4 * (dl_module_num_params(m) / 8 + 1);
    dp = dl_ddp_init(1, &m, &o, &dd);
    CHECK(dp && dp->overlap && dp->nb >= 8, "dl_ddp over NCCL: the overlapped path with 8 buckets: %s",
          dl_error_message(c));
    for (step = 0; step < 20 && dp && ok; step++) {
        rank_batch(&rng, xb, yb);
        float l = ref_step(c, ref, oref, xb, yb, 32);
        ok = l == l && dl_ddp_step(dp, dl_from_array(c, DL_SHAPE(32, 1, 28, 28), xb),
                                   dl_from_int64(c, DL_SHAPE(32), yb), ce_loss, NULL, NULL) == DL_OK;
        dl_step_end(c);
    }
    CHECK(ok, "dl_ddp over NCCL, 20 steps: %s", dl_error_message(c));
    CHECK(dp && dp->early == dp->nb, "dl_ddp over NCCL: every bucket started during backward (%d of %d)",
          dp ? dp->early : -1, dp ? dp->nb : -1);
    np = dl_module_named_parameters(m, &pa);
    dl_module_named_parameters(ref, &pb);
    for (q = 0; q < np && ok; q++) {
        float *a = (float *)malloc(sizeof(float) * (size_t)pa[q].t->numel);
        float *b = (float *)malloc(sizeof(float) * (size_t)pa[q].t->numel);
        dl_read(pa[q].t, a, pa[q].t->numel);
        dl_read(pb[q].t, b, pb[q].t->numel);
        int64_t k;
        if (memcmp(a, b, sizeof(float) * (size_t)pa[q].t->numel) != 0) same = 0;
        for (k = 0; k < pa[q].t->numel; k++) {
            if (fabs((double)b[k]) > scale) scale = fabs((double)b[k]);
            if (fabs((double)a[k] - (double)b[k]) > worst) worst = fabs((double)a[k] - (double)b[k]);
        }
        free(a);
        free(b);
    }
    CHECK(ok && worst <= 1e-5 * scale, "dl_ddp over one NCCL rank = one model on the full batch after 20 steps "
          "(worst %.3g, scale %.3g)", worst, scale);
    printf("NCCL: dl_ddp over one rank and the plain model %s bit for bit\n", same ? "agree" : "do not agree");
    dl_ctx_free(c);
    free(xb);
}
#endif

int main(int argc, char **argv)
{
    dl_ctx_desc d;
    g_quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    memset(&d, 0, sizeof d);
    d.cpu_devices = NDEV;
    d.strict_devices = true;
    d.log = dl_log_silent;
    C = dl_ctx_init(&d);
    CHECK(C != NULL, "context with %d strict CPU devices: %s", NDEV, dl_error_message(NULL));
    if (!C) TEST_END();
    test_allreduce();
    test_broadcast();
    test_errors();
    test_comm_local();
    test_ddp_equiv(0, 2, 32, 0);
    test_ddp_equiv(0, 4, 32, 0);
    test_ddp_equiv(0, 4, 30, 1000);      /* uneven parts; buckets of 250 floats */
    test_ddp_equiv(1, 2, 16, 0);
    test_ddp_equiv(1, 4, 16, 0);
    test_ddp_equiv(2, 2, 16, 4096);
    test_ddp_equiv(2, 4, 18, 0);
    test_ddp_errors();
    test_other_backend();
    test_comm_threads();
    test_threads_mismatch();
    test_threads_review();
#if defined(DL_NCCL) && defined(DL_CUDA)
    test_nccl();
#endif
    dl_ctx_free(C);
    TEST_END();
}
