/* tests/test_cuda.c - the CUDA backend (dl_cuda.cuh) against the CPU.

   1. The op matrix of test_devices.c (tests/optable.h: 87 ops) plus larger
      cases that take the GPU's other code paths (multi-pass and warp/block
      reductions, wide softmax and layer norm, overlapping max pooling whose
      backward collides, LeNet-sized conv and batch norm): every op forward
      and backward on cuda:0 against cpu:0, one line per op with its largest
      error, so a first run on a GPU finds every broken op at once. The
      tolerance is |got - want| <= 1e-4 |want| + 1e-5 max|want| (libm and
      cuBLAS differ from the CPU by a few ulp); dropout masks and random
      fills must be bit-identical, and on an emulated device (the host's
      libm) so must softmax's and log_softmax's forwards: the CPU's loop,
      a line of up to 16 read into registers first or read as it goes.
      Every context that compares with the CPU
      has TF32 off for convolutions too (dl_ctx_desc.allow_tf32_conv = -1;
      its default is on, as PyTorch's cudnn.allow_tf32). The batch-norm
      cases cover C = 1, C of 7 and 600 (one chunk per channel), a channel
      of 2 elements and LeNet-BN's and the ResNets' sizes; the convolution
      cases both weight-gradient paths (per-sample partials, reordered
      gradient), 1x1 convolutions (no im2col), chunks and one sample.
      The same cases run twice give the same bits (determinism); on an
      emulated device every case runs again with its threads and blocks
      last to first and shared memory starting as NaNs: the same bits.
   2. TF32, per call site: dl_set_allow_tf32 (matrix products) and
      dl_set_allow_tf32_conv (convolutions) each within 1e-2 of the CPU while
      the other stays exact (the emulated device rounds the operands of the
      calls in TF32 mode to 10 mantissa bits); the desc's fields and
      DL_ALLOW_TF32 / DL_ALLOW_TF32_CONV.
   3. Errors: mixed devices, a device that does not exist, out of memory
      (memory_limit, and a request larger than any card).
   4. dl_to round trips (cpu -> cuda:0 -> cpu, cuda:0 -> cuda:1, int64, the
      gradient through dl_to), dl_item, dl_sync.
   5. LeNet-BN: dl_module_to(cuda:0) and 20 Adam steps equal to the CPU
      within tolerance; saved from the GPU, loaded on the CPU; two runs give
      the same bits (determinism); DL_CUDA_SYNC=1 gives the same bits too.
   6. Multi-tensor updates: SGD (momentum, nesterov, dampening, maximize,
      weight decay), Adam (amsgrad, maximize) and AdamW over five
      parameters in one launch give the bits of the per-tensor kernels and
      of cpu:0; a module's zero_grad and an optimizer step are one launch
      each (counted in a capture's list on an emulated device).
   7. Memory: no dl.h allocation and no cudaMalloc after step 1 over 1000
      steps of a steady loop.
   8. TensorBoard's dl_summary_scalar_tensor: a GPU's values queued without
      a read of the device, then written in order by one.

   Build: compiled by nvcc as a whole (it defines DL_IMPLEMENTATION):
       make test-cuda        (runs on cuda:0 of a real GPU)
       make test-cuda-emu    (DL_CUDA_EMULATE=2: cuda:0 and cuda:1 are host
                              memory running the same kernels' functors)
   test_cuda --emulate does what DL_CUDA_EMULATE=2 does; -q drops the
   per-op lines; --only conv_tiles,colsum runs those groups of main's
   table and not the op matrix (bench/gpu_report.sh: compute-sanitizer). Without a CUDA device it says so and exits 0.

   On a real GPU each op case runs in a process of its own (fork) with
   DL_CUDA_SYNC=1: a kernel that faults poisons its CUDA context, which would
   fail every later case, so isolated, a first GPU run reports each broken op
   by name and still tests all the others (--no-isolate: one process;
   --isolate: isolated on emulated devices too). */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
/* the CUDA backend's conv_i2c in chunks of a few samples (64K floats of
   im2col matrix) even at these sizes: its chunk loop runs in every conv case */
#define DL__CU_I2C_FLOATS ((int64_t)1 << 16)
#include "dl.h"
#include "harness.h"
#include "tb_read.h"
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static dl_ctx *C;
static int g_quiet;

/* a context for comparing with the CPU: convolutions in exact fp32 too
   (TF32 is their default, as PyTorch's torch.backends.cudnn.allow_tf32) */
static dl_ctx *exact_ctx(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.allow_tf32 = -1;
    d.allow_tf32_conv = -1;
    return dl_ctx_init(&d);
}

#include "optable.h"

#ifndef DL_CUDA
int main(void)
{
    SKIP("test_cuda needs a DL_CUDA build (make test-cuda)");
    TEST_END();
}
#else

/* ------------------------------------------------------------------ larger cases: the GPU's other paths */

static dl_tensor *o_sum_long(dl_tensor **i) { return dl_sum(i[0], DL_DIMS(1), false); }
static dl_tensor *o_sum_cols(dl_tensor **i) { return dl_sum(i[0], DL_DIMS(0), false); }
static dl_tensor *o_max_rows(dl_tensor **i) { return dl_max(i[0], DL_DIMS(1), false); }
static dl_tensor *o_mean_all(dl_tensor **i) { return dl_mean(i[0], DL_ALL, false); }
static dl_tensor *o_ln_wide(dl_tensor **i) { return dl_layer_norm(i[0], DL_SHAPE(1500), i[1], i[2], 1e-5f); }
static dl_tensor *o_ln_plain(dl_tensor **i) { return dl_layer_norm(i[0], DL_SHAPE(40), NULL, NULL, 1e-5f); }
static dl_tensor *o_bn_eval(dl_tensor **i)
{
    dl_tensor *rm = dl_zeros(C, DL_SHAPE(6)), *rv = dl_ones(C, DL_SHAPE(6));
    return dl_batch_norm(i[0], rm, rv, i[1], i[2], false, 0.1f, 1e-5f);
}
static dl_tensor *o_bn_train_stats(dl_tensor **i)
{
    dl_tensor *rm = dl_zeros(C, DL_SHAPE(6)), *rv = dl_ones(C, DL_SHAPE(6));
    dl_tensor *y = dl_batch_norm(i[0], rm, rv, NULL, NULL, true, 0.1f, 1e-5f);
    dl_tensor *t[3];
    t[0] = dl_flatten(y, 0, -1); t[1] = rm; t[2] = rv;
    return dl_cat(3, t, 0);           /* the output and the updated running statistics */
}
static dl_tensor *o_pool_overlap(dl_tensor **i) { dl_pool_desc d = dl_pool_desc_make(3, 2, 1, false, false); return dl_max_pool2d(i[0], &d); }
static dl_tensor *o_conv_lenet(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(1, 2, 1, 1); return dl_conv2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_conv_groups(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 2); return dl_conv2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_conv_s2(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 1); return dl_conv2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_conv_dil(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(1, 2, 2, 1); return dl_conv2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_mm_tt(dl_tensor **i) { return dl_matmul(dl_transpose(i[0], 0, 1), dl_transpose(i[1], 0, 1)); }
static dl_tensor *o_relu_mlp(dl_tensor **i) { return dl_relu(dl_linear(i[0], i[1], i[2])); }
static dl_tensor *o_bcast3(dl_tensor **i) { return dl_mul(dl_add(i[0], i[1]), dl_sigmoid(i[2])); }
static dl_tensor *o_avg_pad(dl_tensor **i) { dl_pool_desc d = dl_pool_desc_make(3, 2, 1, false, true); return dl_avg_pool2d(i[0], &d); }
static dl_tensor *o_conv_p1(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(1, 1, 1, 1); return dl_conv2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_conv_1x1(dl_tensor **i) { return dl_conv2d(i[0], i[1], i[2], NULL); }
static dl_tensor *o_conv_1x1_s2(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(2, 0, 1, 1); return dl_conv2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_convT_1x1(dl_tensor **i) { return dl_conv_transpose2d(i[0], i[1], i[2], NULL); }
static dl_tensor *o_conv1d_1x1(dl_tensor **i) { return dl_conv1d(i[0], i[1], i[2], NULL); }
static dl_tensor *o_conv1d_p1(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(1, 1, 1, 1); return dl_conv1d(i[0], i[1], i[2], &d); }

/* class-index losses through CUDA's fused op (the weight detached: a weight
   with a gradient takes the composite), targets in [0, 5) */
/* a loss desc with weight |w| + 0.2 (w detached) or none */
static dl_loss_desc ce_desc(dl_tensor *w)
{
    dl_loss_desc d;
    memset(&d, 0, sizeof d);
    if (w) d.weight = dl_add_scalar(dl_abs(dl_detach(w)), 0.2f);
    return d;
}
static dl_tensor *o_ce_nd(dl_tensor **i)
{
    dl_loss_desc d = ce_desc(i[2]);
    d.label_smoothing = 0.2f;
    d.has_ignore_index = true;
    d.ignore_index = 3;
    d.reduction = DL_REDUCTION_NONE;
    return dl_cross_entropy(i[0], i[1], &d);
}
static dl_tensor *o_ce_w_mean(dl_tensor **i)
{
    dl_loss_desc d = ce_desc(i[2]);
    d.has_ignore_index = true;
    d.ignore_index = 1;
    return dl_cross_entropy(i[0], i[1], &d);
}
static dl_tensor *o_ce_sum_ls(dl_tensor **i)
{
    dl_loss_desc d = ce_desc(NULL);
    d.label_smoothing = 0.1f;
    d.reduction = DL_REDUCTION_SUM;
    return dl_cross_entropy(i[0], i[1], &d);
}
static dl_tensor *o_nll_nd_w(dl_tensor **i)
{
    dl_loss_desc d = ce_desc(i[2]);
    return dl_nll_loss(dl_log_softmax(i[0], 1), i[1], &d);
}

#define BIG(nm, fn, nin, kind, ...) {nm, fn, nin, {__VA_ARGS__}, kind, false}
static const opcase g_big[] = {
    BIG("sum rows, multi-pass", o_sum_long, 1, 0, S(3, 40000)),
    BIG("sum rows, block", o_sum_long, 1, 0, S(64, 300)),
    BIG("sum rows, warp", o_sum_long, 1, 0, S(64, 100)),
    BIG("sum columns, partials", o_sum_cols, 1, 0, S(3000, 8)),
    BIG("sum columns, one per thread", o_sum_cols, 1, 0, S(40, 9000)),
    BIG("max rows, block", o_max_rows, 1, 0, S(16, 500)),
    BIG("mean all, 100k", o_mean_all, 1, 0, S(100000)),
    BIG("softmax wide, block", o_softmax, 1, 0, S(8, 2000)),
    BIG("softmax rows, warp", o_softmax, 1, 0, S(32, 100)),
    BIG("log_softmax rows, warp", o_log_softmax, 1, 0, S(256, 10)),
    BIG("layer_norm wide, block", o_ln_wide, 3, 0, S(4, 1500), S(1500), S(1500)),
    BIG("layer_norm no affine", o_ln_plain, 1, 0, S(33, 40)),
    BIG("batch_norm LeNet size", o_bn, 3, 0, S(32, 3, 14, 14), S(3), S(3)),
    BIG("batch_norm C=1", o_bn, 3, 0, S(8, 1, 13, 11), S(1), S(1)),
    BIG("batch_norm C=7, L=45", o_bn, 3, 0, S(5, 7, 9, 5), S(7), S(7)),
    BIG("batch_norm 2 per channel", o_bn, 3, 0, S(2, 3), S(3), S(3)),
    BIG("batch_norm1d 256x120", o_bn, 3, 0, S(256, 120), S(120), S(120)),
    BIG("batch_norm C=600, one chunk", o_bn, 3, 0, S(3, 600, 2), S(600), S(600)),
    BIG("batch_norm ResNet 4x4", o_bn, 3, 0, S(16, 128, 4, 4), S(128), S(128)),
    BIG("batch_norm large", o_bn, 3, 0, S(32, 6, 40, 40), S(6), S(6)),
    BIG("batch_norm eval", o_bn_eval, 3, 0, S(8, 6, 5, 5), S(6), S(6)),
    BIG("batch_norm running stats", o_bn_train_stats, 1, 0, S(8, 6, 5, 5)),
    BIG("max_pool2d overlapping", o_pool_overlap, 1, 0, S(4, 6, 28, 28)),
    BIG("avg_pool2d padded", o_avg_pad, 1, 0, S(4, 6, 15, 15)),
    BIG("conv2d LeNet size", o_conv_lenet, 3, 0, S(8, 1, 28, 28), S(6, 1, 5, 5), S(6)),
    BIG("conv2d groups, stride 2", o_conv_groups, 3, 0, S(2, 4, 9, 9), S(6, 2, 3, 3), S(6)),
    BIG("conv2d dilation 2", o_conv_dil, 3, 0, S(2, 3, 11, 11), S(4, 3, 3, 3), S(4)),
    BIG("conv2d stride 2, 5 chunks", o_conv_s2, 3, 0, S(9, 16, 28, 28), S(32, 16, 3, 3), S(32)),
    BIG("conv2d reorder path, 4 chunks", o_conv_p1, 3, 0, S(20, 16, 8, 8), S(8, 16, 3, 3), S(8)),
    BIG("conv2d reorder path, 1 sample", o_conv_p1, 3, 0, S(1, 16, 6, 6), S(5, 16, 3, 3), S(5)),
    BIG("conv2d partials path, 1 sample", o_conv_p1, 3, 0, S(1, 2, 9, 9), S(3, 2, 3, 3), S(3)),
    BIG("conv2d 1x1, partials", o_conv_1x1, 3, 0, S(5, 7, 6, 6), S(4, 7, 1, 1), S(4)),
    BIG("conv2d 1x1, reorder", o_conv_1x1, 3, 0, S(6, 12, 2, 2), S(10, 12, 1, 1), S(10)),
    BIG("conv1d 1x1, C=1", o_conv1d_1x1, 3, 0, S(3, 1, 17), S(2, 1, 1), S(2)),
    /* the direct path's forward, its weight gradient declined (6 sums of 20,000) */
    BIG("conv1d long, 1 sample", o_conv1d_p1, 3, 0, S(1, 1, 20000), S(2, 1, 3), S(2)),
    BIG("conv2d 1x1 stride 2 (im2col)", o_conv_1x1_s2, 3, 0, S(4, 6, 7, 7), S(9, 6, 1, 1), S(9)),
    BIG("conv_transpose2d 1x1", o_convT_1x1, 3, 0, S(4, 5, 3, 4), S(5, 6, 1, 1), S(6)),
    BIG("matmul 64x300x70", o_matmul, 2, 0, S(64, 300), S(300, 70)),
    BIG("matmul transposed", o_mm_tt, 2, 0, S(30, 20), S(25, 30)),
    BIG("linear + relu MLP", o_relu_mlp, 3, 0, S(256, 784), S(256, 784), S(256)),
    BIG("broadcast 3 operands", o_bcast3, 3, 0, S(5, 1, 7, 3), S(4, 1, 3), S(7, 1)),
    BIG("cross_entropy batch 256", o_ce, 2, 2, S(256, 10), S(256)),
    BIG("cross_entropy N-d weight ls ignore", o_ce_nd, 3, 2, S(8, 5, 6, 7), S(8, 6, 7), S(5)),
    BIG("cross_entropy weight mean 300", o_ce_w_mean, 3, 2, S(300, 5), S(300), S(5)),
    BIG("cross_entropy sum ls 20000", o_ce_sum_ls, 2, 2, S(20000, 5), S(20000)),
    /* log_softmax in the loss's threads (one line of 100 a thread); the 20,000
       lines above (65 a thread): its own launch */
    BIG("cross_entropy 100 classes sum ls", o_ce_sum_ls, 2, 2, S(96, 100), S(96)),
    BIG("nll_loss N-d weight", o_nll_nd_w, 3, 2, S(4, 5, 3, 3), S(4, 3, 3), S(5)),
    BIG("dropout 256x1000", o_dropout, 1, 0, S(256, 1000)),
};

/* largest error of got against want, in units of the tolerance (<= 1 passes);
   *maxabs the largest absolute difference, *exact whether the bits agree */
static double cmp_err(const float *got, const float *want, int64_t n, double *maxabs, bool *exact)
{
    double scale = 0, worst = 0;
    int64_t i;
    *maxabs = 0;
    *exact = memcmp(got, want, sizeof(float) * (size_t)n) == 0;
    for (i = 0; i < n; i++) if (fabs((double)want[i]) > scale) scale = fabs((double)want[i]);
    for (i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]), t = 1e-4 * fabs((double)want[i]) + 1e-5 * scale + 1e-30;
        bool nan_same = got[i] != got[i] && want[i] != want[i];
        if (nan_same) continue;
        if (!(d <= d + 0)) d = INFINITY;      /* NaN on one side only */
        if (d > *maxabs) *maxabs = d;
        if (d / t > worst) worst = d / t;
    }
    return worst;
}

static const char *errstr(char *buf, double maxabs, bool exact)
{
    if (exact) snprintf(buf, 24, "exact");
    else snprintf(buf, 24, "%.2e", maxabs);
    return buf;
}

/* one case on cuda:0 against cpu:0: one line, one CHECK per direction */
static void run_case(const opcase *oc, int *nops, int *nexact)
{
    float *host[3];
    result r0, r1;
    int j, k;
    double fe = 0, be = 0, fa = 0, ba = 0, a;
    /* (dl_sin ... dl_rsqrt: dl.h's own functions on both, so the CPU's bits) */
    bool fx = false, bx = true, x, same_shape, must_exact = strstr(oc->name, "dropout") != NULL ||
        !strcmp(oc->name, "dl_sin") || !strcmp(oc->name, "dl_cos") || !strcmp(oc->name, "dl_log1p") ||
        !strcmp(oc->name, "dl_expm1") || !strcmp(oc->name, "dl_rsqrt");
    bool fwd_exact = must_exact || (dl__cu_emu_count() > 0 && strstr(oc->name, "softmax") != NULL);
    char b1[24], b2[24];
    optable_inputs(oc, host);
    run_on(oc, dl_cpu(), host, &r0);
    run_on(oc, dl_cuda(0), host, &r1);
    same_shape = r0.ok && r1.ok && r0.k == r1.k && r0.n[0] == r1.n[0];
    for (k = 1; same_shape && k < r0.k; k++) same_shape = r0.n[k] == r1.n[k];
    if (same_shape) {
        fe = cmp_err(r1.v[0], r0.v[0], r0.n[0], &fa, &fx);
        for (k = 1; k < r0.k; k++) {
            double e = cmp_err(r1.v[k], r0.v[k], r0.n[k], &a, &x);
            if (e > be) be = e;
            if (a > ba) ba = a;
            bx = bx && x;
        }
    }
    if (!g_quiet || !same_shape || fe > 1 || be > 1)
        printf("cuda:0 %-30s fwd %-9s bwd %-9s %s\n", oc->name, errstr(b1, fa, fx),
               oc->nograd ? "-" : errstr(b2, ba, bx),
               !same_shape ? "FAILED TO RUN"
               : (fe > 1 || be > 1 || (fwd_exact && !fx) || (must_exact && !bx)) ? "WRONG" : "ok");
    CHECK(same_shape, "%s: did not run on cuda:0 or gave other shapes", oc->name);
    CHECK(fe <= 1 && (!fwd_exact || fx), "%s: forward on cuda:0 differs from cpu:0 by %g (%.2f x tolerance%s)",
          oc->name, fa, fe, fwd_exact && !fx ? ", and must give its bits" : "");
    CHECK(be <= 1 && (!must_exact || bx), "%s: backward on cuda:0 differs from cpu:0 by %g (%.2f x tolerance)",
          oc->name, ba, be);
    *nexact += fx && (oc->nograd || bx);
    (*nops)++;
    free_result(&r0);
    free_result(&r1);
    for (j = 0; j < oc->nin; j++) free(host[j]);
}

#define NSMALL (sizeof g_ops / sizeof g_ops[0])
#define NCASES (NSMALL + sizeof g_big / sizeof g_big[0])

static const opcase *case_at(size_t i) { return i < NSMALL ? &g_ops[i] : &g_big[i - NSMALL]; }

/* The matrix's cases, then its convolutions again with DL_CONV_DIRECT=0:
   the im2col and cuBLAS path, which the direct sums replace where a conv
   has few channels (most cases here). Case i of NALL, *oc a copy renamed. */
static size_t g_conv[64], g_nconv;
#define NALL (NCASES + g_nconv)
static void conv_cases(void)
{
    size_t c;
    for (c = g_nconv = 0; c < NCASES; c++)
        if (strncmp(case_at(c)->name, "conv", 4) == 0 && g_nconv < sizeof g_conv / sizeof g_conv[0])
            g_conv[g_nconv++] = c;
}
static bool case_im2col(size_t i, opcase *oc, char *name, size_t cap)
{
    if (i < NCASES) { *oc = *case_at(i); return false; }
    *oc = *case_at(g_conv[i - NCASES]);
    snprintf(name, cap, "%s, im2col", oc->name);
    oc->name = name;
    return true;
}

static void test_op_matrix(void)
{
    size_t c;
    int nops = 0, nexact = 0;
    for (c = 0; c < NALL; c++) {
        opcase oc;
        char name[96];
        bool i2c = case_im2col(c, &oc, name, sizeof name);
        if (C->cuda[0]) DL__CUI(C->cuda[0])->direct = !i2c;
        run_case(&oc, &nops, &nexact);
    }
    if (C->cuda[0]) DL__CUI(C->cuda[0])->direct = true;
    dl_set_device(C, dl_cpu());
    printf("op x direction: %d ops on cuda:0 against cpu:0, %d bit-identical both ways\n", nops, nexact);
}

/* The matrix with each case in a child process that opens CUDA itself (the
   parent has not touched CUDA yet: a forked child could not use it). Exit
   status 0: the case passed; 1: it failed (its lines say how); 77: no CUDA
   device. Returns false when there is no device. */
static bool test_op_matrix_isolated(void)
{
    size_t c;
    int nops = 0, nexact = 0, passed = 0, exact = 0;
    for (c = 0; c < NALL; c++) {
        int st = 0;
        pid_t pid;
        opcase oc;
        char name[96];
        bool i2c = case_im2col(c, &oc, name, sizeof name);
        fflush(stdout);
        pid = fork();
        if (pid < 0) { CHECK(0, "fork: cannot isolate %s", oc.name); continue; }
        if (pid == 0) {
            setenv("DL_CUDA_SYNC", "1", 1);   /* the faulting launch names itself */
            if (i2c) setenv("DL_CONV_DIRECT", "0", 1);
            C = exact_ctx();
            if (!C || dl_device_count(C, DL_DEVICE_CUDA) == 0) _exit(77);
            th_pass = th_fail = 0;
            nops = nexact = 0;
            run_case(&oc, &nops, &nexact);
            fflush(stdout);
            _exit(th_fail ? 1 : nexact ? 3 : 0);   /* 3: passed, bit-identical */
        }
        if (waitpid(pid, &st, 0) != pid) st = -1;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77) return false;
        CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3),
              "%s: its process %s %d", oc.name, WIFSIGNALED(st) ? "died of signal" : "exited with status",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3)) passed++;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 3) exact++;
    }
    printf("op x direction: %d ops on cuda:0 against cpu:0, one process each: %d passed, %d bit-identical both ways\n",
           (int)NALL, passed, exact);
    return true;
}

/* ------------------------------------------------------------------ random numbers */

static void test_random(void)
{
    float a[3000], b[3000];
    int k;
    const char *what[3] = {"dl_rand", "dl_randn", "dl_dropout"};
    for (k = 0; k < 3; k++) {
        int d;
        for (d = 0; d < 2; d++) {
            dl_tensor *t;
            dl_set_device(C, d ? dl_cuda(0) : dl_cpu());
            dl_manual_seed(C, 2024);
            t = k == 0 ? dl_rand(C, DL_SHAPE(3000)) : k == 1 ? dl_randn(C, DL_SHAPE(3000))
                       : dl_dropout(dl_ones(C, DL_SHAPE(3000)), 0.25f, true);
            CHECK(t && dl_read(t, d ? b : a, 3000) == DL_OK, "%s on %s: %s", what[k], d ? "cuda:0" : "cpu:0",
                  dl_error_message(C));
        }
        CHECK(memcmp(a, b, sizeof a) == 0, "%s: cuda:0 draws other bits than cpu:0", what[k]);
        if (!g_quiet) printf("cuda:0 %-30s %s\n", what[k], memcmp(a, b, sizeof a) == 0 ? "bit-identical" : "DIFFERS");
    }
    dl_set_device(C, dl_cpu());
    dl_step_end(C);
}

/* ------------------------------------------------------------------ TF32 */

/* largest |got - want| and largest |want| */
static void diff_max(const float *got, const float *want, int n, double *mx, double *scale)
{
    int i;
    *mx = *scale = 0;
    for (i = 0; i < n; i++) {
        if (fabs((double)want[i]) > *scale) *scale = fabs((double)want[i]);
        if (fabs((double)got[i] - (double)want[i]) > *mx) *mx = fabs((double)got[i] - (double)want[i]);
    }
}

#define TF_X (4 * 8 * 12 * 12)
#define TF_Y (4 * 6 * 12 * 12)

/* a (64,96) x b (96,40) and conv2d(x (4,8,12,12), w (6,8,3,3), padding 1) on dev */
static void tf32_run(dl_device dev, const float *a, const float *b, const float *x, const float *w, float *mm,
                     float *cv)
{
    dl_conv_desc cd = dl_conv_desc_make(1, 1, 1, 1);
    dl_set_device(C, dev);
    CHECK(dl_read(dl_matmul(dl_from_array(C, DL_SHAPE(64, 96), a), dl_from_array(C, DL_SHAPE(96, 40), b)), mm,
                  64 * 40) == DL_OK, "matmul on %s: %s", dl_device_name(dev), dl_error_message(C));
    CHECK(dl_read(dl_conv2d(dl_from_array(C, DL_SHAPE(4, 8, 12, 12), x), dl_from_array(C, DL_SHAPE(6, 8, 3, 3), w),
                            NULL, &cd), cv, TF_Y) == DL_OK, "conv2d on %s: %s", dl_device_name(dev), dl_error_message(C));
    dl_set_device(C, dl_cpu());
    dl_step_end(C);
}

/* TF32 per call site: the matrix products' switch and the convolutions'
   on one cuBLAS handle. In TF32 mode a product's operands keep 10 of 23
   mantissa bits (each within 2^-11 relative), so a sum of K products is off
   by at most about 2^-10 sum|a b|: within 1e-2 of the scale here; in
   exact mode fp32's error (about 1e-7 sqrt(K) relative) is under 1e-5.
   The side whose switch is off must give the bits of a run with both off
   (the same cuBLAS call in the same mode), the other side other bits. */
static void test_tf32(void)
{
    static float a[64 * 96], b[96 * 40], x[TF_X], w[6 * 8 * 9];
    static float mm0[64 * 40], mm1[64 * 40], mmE[64 * 40], cv0[TF_Y], cv1[TF_Y], cvE[TF_Y];
    double mx, scale, cx, cscale;
    dl__cuimpl *m;
    int i, on;
    for (i = 0; i < 64 * 96; i++) a[i] = urand() - 0.5f;
    for (i = 0; i < 96 * 40; i++) b[i] = urand() - 0.5f;
    for (i = 0; i < TF_X; i++) x[i] = urand() - 0.5f;
    for (i = 0; i < 6 * 8 * 9; i++) w[i] = urand() - 0.5f;
    tf32_run(dl_cpu(), a, b, x, w, mm0, cv0);
    dl_set_device(C, dl_cuda(0));   /* opens cuda:0 */
    dl_set_device(C, dl_cpu());
    m = DL__CUI(C->cuda[0]);
    CHECK(!m->tf32 && !m->tf32_conv, "this test's context: TF32 off for both (desc -1)");
    m->direct = false;   /* this conv's 8 -> 6 channels through cuBLAS, which the switch steers */
    tf32_run(dl_cuda(0), a, b, x, w, mmE, cvE);
    diff_max(mmE, mm0, 64 * 40, &mx, &scale);
    diff_max(cvE, cv0, TF_Y, &cx, &cscale);
    CHECK(mx <= 1e-5 * scale && cx <= 1e-5 * cscale, "exact fp32 on cuda:0: matmul off by %g, conv2d by %g", mx, cx);
    for (on = 0; on < 2; on++) {   /* on 0: matrix products in TF32; 1: convolutions */
        const char *what = on ? "convolutions" : "matrix products";
        CHECK((on ? dl_set_allow_tf32_conv(C, true) : dl_set_allow_tf32(C, true)) == DL_OK &&
              m->tf32 == !on && m->tf32_conv == !!on, "TF32 on for the %s only: %s", what, dl_error_message(C));
        tf32_run(dl_cuda(0), a, b, x, w, mm1, cv1);
        diff_max(mm1, mm0, 64 * 40, &mx, &scale);
        diff_max(cv1, cv0, TF_Y, &cx, &cscale);
        if (on) {
            CHECK(cx <= 1e-2 * cscale, "conv2d with TF32 off by %g (scale %g)", cx, cscale);
            CHECK(mx <= 1e-5 * scale, "matmul stays exact fp32 while convolutions use TF32: off by %g", mx);
        } else {
            CHECK(mx <= 1e-2 * scale, "matmul with TF32 off by %g (scale %g)", mx, scale);
            CHECK(cx <= 1e-5 * cscale, "conv2d stays exact fp32 while matrix products use TF32: off by %g", cx);
        }
        CHECK(memcmp(on ? mm1 : cv1, on ? mmE : cvE, sizeof(float) * (size_t)(on ? 64 * 40 : TF_Y)) == 0,
              "TF32 for the %s only: the %s keep the exact run's bits", what, on ? "matrix products" : "convolutions");
        CHECK(memcmp(on ? cv1 : mm1, on ? cvE : mmE, sizeof(float) * (size_t)(on ? TF_Y : 64 * 40)) != 0,
              "TF32 for the %s: other bits than exact fp32", what);
        if (!g_quiet)
            printf("cuda:0 %-30s largest difference %.2e (scale %.2g); the other %.2e\n",
                   on ? "conv2d with TF32" : "matmul with TF32", on ? cx : mx, on ? cscale : scale, on ? mx : cx);
        CHECK((on ? dl_set_allow_tf32_conv(C, false) : dl_set_allow_tf32(C, false)) == DL_OK && !m->tf32 &&
              !m->tf32_conv, "TF32 off again");
    }
    /* the direct path (few channels) sums in exact fp32 whatever the
       switch: the same bits with TF32 on and off, within fp32 rounding of cpu:0 */
    m->direct = true;
    tf32_run(dl_cuda(0), a, b, x, w, mm1, cvE);
    dl_set_allow_tf32_conv(C, true);
    tf32_run(dl_cuda(0), a, b, x, w, mm1, cv1);
    dl_set_allow_tf32_conv(C, false);
    diff_max(cv1, cv0, TF_Y, &cx, &cscale);
    CHECK(memcmp(cv1, cvE, sizeof cv1) == 0 && cx <= 1e-5 * cscale,
          "conv2d by direct sums: TF32 on changes no bit (%s), off by %g from cpu:0",
          memcmp(cv1, cvE, sizeof cv1) == 0 ? "none" : "it did", cx);
    /* a context's desc fields and the environment reach a device opened later */
    {
        dl_ctx_desc d;
        dl_ctx *c2;
        memset(&d, 0, sizeof d);
        d.log = dl_log_silent;
        d.allow_tf32 = 1;
        setenv("DL_ALLOW_TF32_CONV", "0", 1);
        c2 = dl_ctx_init(&d);
        unsetenv("DL_ALLOW_TF32_CONV");
        CHECK(c2 && dl_set_device(c2, dl_cuda(0)) == DL_OK && DL__CUI(c2->cuda[0])->tf32 &&
              !DL__CUI(c2->cuda[0])->tf32_conv, "desc allow_tf32 = 1, DL_ALLOW_TF32_CONV=0: %s",
              dl_error_message(c2));
        dl_ctx_free(c2);
        memset(&d, 0, sizeof d);
        d.log = dl_log_silent;
        c2 = dl_ctx_init(&d);
        CHECK(c2 && dl_set_device(c2, dl_cuda(0)) == DL_OK && !DL__CUI(c2->cuda[0])->tf32 &&
              DL__CUI(c2->cuda[0])->tf32_conv, "PyTorch's defaults: matmul exact, conv TF32");
        dl_ctx_free(c2);
    }
}

/* dl__cu_div (the batch-norm kernels' channel of an element): n / d by a
   multiply-high and a shift, for every n < 2^30 they meet; the host's
   64-bit product is the device's __umulhi */
static void test_divider(void)
{
    static const uint32_t ds[] = {1, 2, 3, 6, 7, 16, 49, 100, 784, 1000, 65537, 200704, (1u << 29) + 3, 1u << 30};
    uint32_t bad = 0;
    size_t k;
    int i;
    for (k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        dl__cu_div v;
        uint32_t edge[4];
        edge[0] = 0; edge[1] = ds[k] - 1; edge[2] = ds[k]; edge[3] = (1u << 30) - 1;
        v.init(ds[k]);
        for (i = 0; i < 20000; i++) {
            uint32_t n = i < 4 ? edge[i] : i < 10000 ? (uint32_t)i : (uint32_t)(urand() * 1073741823.0f);
            if (v.div(n) != n / ds[k]) bad++;
        }
    }
    CHECK(bad == 0, "dl__cu_div: %u quotients wrong", bad);
}

/* two runs of a case gave the same bits (forward and every gradient) */
static bool same_bits(const result *r0, const result *r1)
{
    bool same = r0->ok && r1->ok && r0->k == r1->k;
    int j;
    for (j = 0; same && j < r0->k; j++)
        same = r0->n[j] == r1->n[j] && memcmp(r0->v[j], r1->v[j], sizeof(float) * (size_t)r0->n[j]) == 0;
    return same;
}

/* the kernels that split work over blocks sum in a fixed order: the same
   case twice on cuda:0, the same bits (forward and every gradient) */
static void test_determinism(void)
{
    static const char *names[] = {"batch_norm large", "batch_norm1d 256x120", "batch_norm ResNet 4x4",
                                  "conv2d reorder path, 4 chunks", "conv2d stride 2, 5 chunks", "conv2d 1x1, partials"};
    size_t k, c;
    dl_set_device(C, dl_cuda(0));   /* opens it */
    for (k = 0; k < 2 * sizeof names / sizeof names[0]; k++) {
        const opcase *oc = NULL;
        const char *nm = names[k % (sizeof names / sizeof names[0])];
        bool i2c = k >= sizeof names / sizeof names[0];   /* the second round: DL_CONV_DIRECT=0 */
        float *host[3];
        result r0, r1;
        bool same;
        int j;
        if (i2c && strncmp(nm, "conv", 4) != 0) continue;
        DL__CUI(C->cuda[0])->direct = !i2c;
        for (c = 0; c < sizeof g_big / sizeof g_big[0]; c++)
            if (!strcmp(g_big[c].name, nm)) oc = &g_big[c];
        if (!oc) { CHECK(0, "no case %s", nm); continue; }
        optable_inputs(oc, host);
        run_on(oc, dl_cuda(0), host, &r0);
        run_on(oc, dl_cuda(0), host, &r1);
        same = same_bits(&r0, &r1);
        CHECK(same, "%s%s: two runs on cuda:0 give other bits", oc->name, i2c ? ", im2col" : "");
        if (!g_quiet)
            printf("cuda:0 %-30s two runs%s: %s\n", oc->name, i2c ? " (im2col)" : "", same ? "same bits" : "DIFFER");
        free_result(&r0);
        free_result(&r1);
        for (j = 0; j < oc->nin; j++) free(host[j]);
    }
    DL__CUI(C->cuda[0])->direct = true;
    dl_set_device(C, dl_cpu());
}

/* On an emulated device: every case of the matrix (forward and every
   gradient) run again with the elements of each launch, the blocks of each
   block kernel and the threads of each of its phases last to first
   (dl__cu_emu_rev), the block kernels' shared memory starting as NaNs:
   the same bits. A GPU keeps no order among threads and blocks; work that
   leaned on the emulator's (a thread reading what another wrote since the
   last barrier, two threads writing one place, a read of shared memory
   that the block did not write) would differ here before it ever ran on
   one. */
static void test_emulated_order(void)
{
    size_t c;
    int n = 0;
    if (dl__cu_emu_count() <= 0) return;   /* (a GPU keeps an order of its own) */
    dl_set_device(C, dl_cuda(0));   /* opens it */
    for (c = 0; c < NALL; c++) {
        opcase oc;
        char name[96];
        float *host[3];
        result r0, r1;
        bool same, i2c = case_im2col(c, &oc, name, sizeof name);
        int j;
        DL__CUI(C->cuda[0])->direct = !i2c;
        optable_inputs(&oc, host);
        run_on(&oc, dl_cuda(0), host, &r0);
        dl__cu_emu_rev = true;
        run_on(&oc, dl_cuda(0), host, &r1);
        dl__cu_emu_rev = false;
        same = same_bits(&r0, &r1);
        CHECK(same, "%s: the emulated cuda:0 gives other bits with its threads and blocks last to first", oc.name);
        n++;
        free_result(&r0);
        free_result(&r1);
        for (j = 0; j < oc.nin; j++) free(host[j]);
    }
    DL__CUI(C->cuda[0])->direct = true;
    dl_set_device(C, dl_cpu());
    if (!g_quiet) printf("cuda:0 %d cases with threads and blocks last to first: compared\n", n);
}

/* ------------------------------------------------------------------ errors */

static void test_errors(void)
{
    dl_tensor *a, *g;
    dl_ctx_desc cd;
    dl_ctx *c2;
    dl_set_device(C, dl_cpu());
    a = dl_randn(C, DL_SHAPE(4, 3));
    g = dl_to(dl_randn(C, DL_SHAPE(4, 3)), dl_cuda(0));
    CHECK(g && g->device.type == DL_DEVICE_CUDA, "dl_to cuda:0: %s", dl_error_message(C));
    CHECK(dl_add(g, a) == NULL, "mixed add");
    EXPECT_ERR(C, DL_ERR_DEVICE, "dl_add: a is on cuda:0 and b is on cpu:0; move one with dl_to()");
    CHECK(dl_matmul(a, dl_transpose(g, 0, 1)) == NULL, "mixed matmul");
    EXPECT_ERR(C, DL_ERR_DEVICE, "dl_matmul: a is on cpu:0 and b is on cuda:0");
    CHECK(dl_to(a, dl_cuda(15)) == NULL || dl_device_count(C, DL_DEVICE_CUDA) > 15, "cuda:15");
    EXPECT_ERR(C, DL_ERR_DEVICE, "dl_to: cuda:15 requested but this machine has");
    CHECK(dl_to(a, dl_cuda(16)) == NULL, "cuda:16");
    EXPECT_ERR(C, DL_ERR_DEVICE, "CUDA device indices go from 0 to 15");
    CHECK(dl_set_device(C, dl_cuda(15)) == DL_ERR_DEVICE || dl_device_count(C, DL_DEVICE_CUDA) > 15,
          "default device cuda:15");
    dl_clear_error(C);
    dl_set_device(C, dl_cuda(0));
    /* far more than any card holds (4 TiB) */
    CHECK(dl_empty(C, DL_SHAPE(1 << 20, 1 << 20)) == NULL, "4 TiB on cuda:0");
    EXPECT_ERR(C, DL_ERR_OOM, "on cuda:0");
    dl_set_device(C, dl_cpu());
    /* the context's memory_limit holds on each device */
    memset(&cd, 0, sizeof cd);
    cd.log = dl_log_silent;
    cd.memory_limit = (size_t)4 << 20;
    c2 = dl_ctx_init(&cd);
    CHECK(c2 != NULL, "context with a memory limit");
    if (c2) {
        CHECK(dl_set_device(c2, dl_cuda(0)) == DL_OK, "cuda:0 as default: %s", dl_error_message(c2));
        CHECK(dl_zeros(c2, DL_SHAPE(1024, 1024, 2)) == NULL, "8 MiB over a 4 MiB limit");
        EXPECT_ERR(c2, DL_ERR_OOM, "memory_limit");
        CHECK(dl_zeros(c2, DL_SHAPE(1024, 256)) != NULL, "1 MiB within the limit: %s", dl_error_message(c2));
        dl_ctx_free(c2);
    }
    /* DL_CUDNN (0, 1, 2) and DL_CONV_DIRECT (0, 1, 2), read when a context
       opens a GPU: another value is an error naming the variable. The
       contexts start on the CPU (DL_DEVICE unset here: with cuda:0 there a
       context opens the GPU, and fails, as it is made) */
    {
        static const char *const bad[3] = {"3", "yes", "-1"}, *const good[3] = {"0", "1", "2"};
        static const char *const var[2] = {"DL_CUDNN", "DL_CONV_DIRECT"};
        char devenv[64];
        int k, v;
        const char *de = getenv("DL_DEVICE");
        snprintf(devenv, sizeof devenv, "%s", de ? de : "");
        unsetenv("DL_DEVICE");
        for (v = 0; v < 2; v++)
            for (k = 0; k < 3; k++) {
                setenv(var[v], bad[k], 1);
                c2 = exact_ctx();
                CHECK(c2 && dl_to(dl_zeros(c2, DL_SHAPE(2)), dl_cuda(0)) == NULL, "%s=%s refused", var[v], bad[k]);
                if (c2) {
                    char want[64];
                    snprintf(want, sizeof want, "%s=%s must be 0", var[v], bad[k]);
                    EXPECT_ERR(c2, DL_ERR_ARG, want);
                    dl_ctx_free(c2);
                }
                setenv(var[v], good[k], 1);
                c2 = exact_ctx();
                CHECK(c2 && dl_to(dl_zeros(c2, DL_SHAPE(2)), dl_cuda(0)) != NULL, "%s=%s: %s", var[v], good[k],
                      c2 ? dl_error_message(c2) : "no context");
                if (v == 1)
                    CHECK(c2 && c2->cuda[0] && DL__CUI(c2->cuda[0])->direct == k, "DL_CONV_DIRECT=%s: mode %d",
                          good[k], k);
#ifdef DL_CUDNN
                if (v == 0)
                    CHECK(c2 && c2->cuda[0] && DL__CUI(c2->cuda[0])->dnn_mode == k, "DL_CUDNN=%s sets mode %d",
                          good[k], k);
#endif
                if (c2) dl_ctx_free(c2);
            }
        unsetenv(var[0]);
        unsetenv(var[1]);
        /* DL_CUDA_REPLAY_ARGS: 0 or 1 (a replay's values by copies or as a kernel node's parameters);
           DL_CUDA_PDL: 0 or 1 (programmatic dependent launches; emulated: the mode only) */
        for (v = 0; v < 2; v++) {
            static const char *const rbad[3] = {"2", "yes", "-1"}, *const bvar[2] = {"DL_CUDA_REPLAY_ARGS",
                                                                                     "DL_CUDA_PDL"};
            for (k = 0; k < 3; k++) {
                setenv(bvar[v], rbad[k], 1);
                c2 = exact_ctx();
                CHECK(c2 && dl_to(dl_zeros(c2, DL_SHAPE(2)), dl_cuda(0)) == NULL, "%s=%s refused", bvar[v], rbad[k]);
                if (c2) {
                    char want[64];
                    snprintf(want, sizeof want, "%s=%s must be %d", bvar[v], rbad[k], v ? 0 : 1);
                    EXPECT_ERR(c2, DL_ERR_ARG, want);
                    dl_ctx_free(c2);
                }
                if (k == 2) break;
                setenv(bvar[v], good[k], 1);
                c2 = exact_ctx();
                CHECK(c2 && dl_to(dl_zeros(c2, DL_SHAPE(2)), dl_cuda(0)) &&
                          (v ? DL__CUI(c2->cuda[0])->pdl == (k == 1 && dl__cu_emu_count() > 0)
                             : DL__CUI(c2->cuda[0])->replay_args == (k == 1)),
                      "%s=%s: %s", bvar[v], good[k], c2 ? dl_error_message(c2) : "no context");
                if (c2) dl_ctx_free(c2);
            }
            unsetenv(bvar[v]);
        }
        for (k = 0; k < 7; k++) {   /* DL_CUDA_BLAS_WS: cuBLAS's workspace in MiB, 0 to 4096 */
            static const char *const wv[7] = {"x", "-1", "4097", "1.5", " 8", "0", "64"};
            setenv("DL_CUDA_BLAS_WS", wv[k], 1);
            c2 = exact_ctx();
            CHECK(c2 && (dl_to(dl_zeros(c2, DL_SHAPE(2)), dl_cuda(0)) != NULL) == (k >= 5),
                  "DL_CUDA_BLAS_WS=%s %s", wv[k], k >= 5 ? "taken" : "refused");
            if (c2 && k < 5) {
                char want[64];
                snprintf(want, sizeof want, "DL_CUDA_BLAS_WS=%s must be a whole number of MiB", wv[k]);
                EXPECT_ERR(c2, DL_ERR_ARG, want);
            }
            if (c2) dl_ctx_free(c2);
        }
        unsetenv("DL_CUDA_BLAS_WS");
        c2 = exact_ctx();
        CHECK(c2 && dl_to(dl_zeros(c2, DL_SHAPE(2)), dl_cuda(0)) && DL__CUI(c2->cuda[0])->direct == 1 &&
                  DL__CUI(c2->cuda[0])->replay_args && !DL__CUI(c2->cuda[0])->pdl,
              "DL_CONV_DIRECT, DL_CUDA_REPLAY_ARGS unset: modes 1; DL_CUDA_PDL unset: 0");
        if (c2) dl_ctx_free(c2);
        if (de) setenv("DL_DEVICE", devenv, 1);
    }
    dl_step_end(C);
}

/* ------------------------------------------------------------------ transfers */

static void test_transfers(void)
{
    float v[1000], w[1000], gx[4];
    int64_t iv[7] = {3, -1, 0, 1ll << 40, 7, 8, 9}, iw[7];
    dl_tensor *x, *y, *z;
    int i;
    dl_set_device(C, dl_cpu());
    for (i = 0; i < 1000; i++) v[i] = urand() * 10.0f - 5.0f;
    x = dl_from_array(C, DL_SHAPE(10, 100), v);
    y = dl_to(x, dl_cuda(0));
    z = dl_to(y, dl_cpu());
    CHECK(y && y->device.type == DL_DEVICE_CUDA && z && z->device.type == DL_DEVICE_CPU, "cpu -> cuda:0 -> cpu");
    CHECK(z && dl_read(z, w, 1000) == DL_OK && memcmp(v, w, sizeof v) == 0, "round trip keeps the bits");
    if (dl_device_count(C, DL_DEVICE_CUDA) > 1) {
        dl_tensor *p = dl_to(y, dl_cuda(1));
        memset(w, 0, sizeof w);
        CHECK(p && p->device.index == 1 && dl_read(p, w, 1000) == DL_OK && memcmp(v, w, sizeof v) == 0,
              "cuda:0 -> cuda:1 keeps the bits: %s", dl_error_message(C));
        p = dl_to(dl_mul_scalar(p, 2.0f), dl_cuda(0));
        CHECK(p && dl_read(p, w, 1000) == DL_OK && w[17] == 2.0f * v[17], "cuda:1 -> cuda:0 after an op there");
    } else {
        SKIP("cuda:0 -> cuda:1: one CUDA device");
    }
    z = dl_to(dl_to(dl_from_int64(C, DL_SHAPE(7), iv), dl_cuda(0)), dl_cpu());
    CHECK(z && dl_read_int64(z, iw, 7) == DL_OK && memcmp(iv, iw, sizeof iv) == 0, "int64 round trip: %s",
          dl_error_message(C));
    {   /* the creators with a dtype, made on cuda:0 (fill, add_i64, convert, copy_nd, arange) */
        dl_tensor *a, *b, *zz;
        dl_set_device(C, dl_cuda(0));
        a = dl_full_dtype(C, DL_SHAPE(2, 3), (double)iv[3] + 3.0, DL_DTYPE_I64);
        b = dl_arange_dtype(C, -2.5, 2, 1, DL_DTYPE_I32);
        zz = dl_zeros_dtype(C, DL_SHAPE(5), DL_DTYPE_I64);
        dl_set_device(C, dl_cpu());
        CHECK(a && b && zz && a->device.type == DL_DEVICE_CUDA && dl_read_int64(a, iw, 6) == DL_OK &&
              iw[0] == iv[3] + 3 && iw[5] == iv[3] + 3 && dl_read_int64(b, iw, 5) == DL_OK && iw[0] == -2 &&
              iw[4] == 2 && dl_read_int64(zz, iw, 5) == DL_OK && iw[0] == 0 && iw[4] == 0,
              "dl_full_dtype, dl_arange_dtype, dl_zeros_dtype on cuda:0: %s", dl_error_message(C));
    }
    /* the gradient comes back through dl_to */
    {
        float xv[4] = {1, -2, 3, 0.5f};
        dl_tensor *xc = dl_requires_grad(dl_from_array(C, DL_SHAPE(4), xv), true);
        dl_tensor *xg = dl_to(xc, dl_cuda(0));
        CHECK(dl_backward(dl_sum(dl_mul(xg, xg), DL_ALL, false)) == DL_OK, "backward across cpu/cuda: %s",
              dl_error_message(C));
        CHECK(xc->grad && xc->grad->device.type == DL_DEVICE_CPU && dl_read(xc->grad, gx, 4) == DL_OK &&
              gx[0] == 2.0f && gx[1] == -4.0f && gx[2] == 6.0f && gx[3] == 1.0f, "dl_to's gradient on cpu:0");
    }
    /* dl_item waits for the device; dl_sync */
    y = dl_to(x, dl_cuda(0));
    CHECK(y && dl_item(dl_sum(y, DL_ALL, false)) == dl_item(dl_sum(x, DL_ALL, false)) &&
          dl_last_error(C) == DL_OK, "dl_item on cuda:0: %s", dl_error_message(C));
    CHECK(dl_sync(C) == DL_OK, "dl_sync: %s", dl_error_message(C));
    CHECK(dl_data(y) == NULL, "dl_data of a cuda tensor is an error");
    EXPECT_ERR(C, DL_ERR_DEVICE, "cuda:0");
    dl_step_end(C);
}

/* ------------------------------------------------------------------ LeNet-BN */

static dl_module *make_lenet_bn(dl_ctx *c)
{
    dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
    dl_module *f[14];
    f[0] = dl_nn_conv2d(c, 1, 6, 5, &pad2, true); f[1] = dl_nn_batch_norm2d(c, 6); f[2] = dl_nn_relu(c);
    f[3] = dl_nn_max_pool2d(c, &pool); f[4] = dl_nn_conv2d(c, 6, 16, 5, NULL, true);
    f[5] = dl_nn_batch_norm2d(c, 16); f[6] = dl_nn_relu(c); f[7] = dl_nn_max_pool2d(c, &pool);
    f[8] = dl_nn_flatten(c); f[9] = dl_nn_linear(c, 400, 120, true); f[10] = dl_nn_relu(c);
    f[11] = dl_nn_linear(c, 120, 84, true); f[12] = dl_nn_relu(c); f[13] = dl_nn_linear(c, 84, 10, true);
    return dl_nn_sequential(c, 14, f);
}

#define NB 16
#define LENET_LR 2e-3   /* Adam's lr */
static float g_xb[NB * 784];
static int64_t g_yb[NB];

/* LeNet-BN made on the CPU with seed 11, moved to dev, trained `steps` Adam
   steps on the fixed batch; the losses, then the parameters, as floats */
static int train_lenet(dl_ctx *c, dl_device dev, int steps, float *losses, float **params)
{
    dl_module *m;
    dl_optim *o;
    dl_adam_desc ad;
    const dl_named_tensor *p;
    int n, i, step, total = 0;
    dl_set_device(c, dl_cpu());
    dl_manual_seed(c, 11);
    m = make_lenet_bn(c);
    if (!m || dl_module_to(m, dev) != DL_OK) { CHECK(0, "LeNet-BN on %s: %s", dl_device_name(dev), dl_error_message(c)); return 0; }
    memset(&ad, 0, sizeof ad);
    ad.lr = (float)LENET_LR;
    o = dl_adam(m, &ad);
    dl_set_device(c, dev);
    for (step = 0; step < steps; step++) {
        dl_tensor *x = dl_from_array(c, DL_SHAPE(NB, 1, 28, 28), g_xb);
        dl_tensor *y = dl_from_int64(c, DL_SHAPE(NB), g_yb);
        dl_tensor *loss;
        dl_optim_zero_grad(o);
        loss = dl_cross_entropy(dl_module_forward(m, x), y, NULL);
        if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(o) != DL_OK) {
            CHECK(0, "LeNet-BN step %d on %s: %s", step, dl_device_name(dev), dl_error_message(c));
            break;
        }
        losses[step] = dl_item(loss);
        dl_step_end(c);
    }
    n = dl_module_state_dict(m, &p);
    for (i = 0; i < n; i++) if (p[i].t->dtype == DL_DTYPE_F32) total += (int)p[i].t->numel;
    *params = (float *)malloc(sizeof(float) * (size_t)(total + 1));
    total = 0;
    for (i = 0; i < n; i++)
        if (p[i].t->dtype == DL_DTYPE_F32) {
            dl_read(p[i].t, *params + total, p[i].t->numel);
            total += (int)p[i].t->numel;
        }
    if (dev.type == DL_DEVICE_CUDA) {   /* saved from the GPU, loaded on the CPU */
        dl_module *m2;
        const dl_named_tensor *p2;
        int n2, same = 1;
        CHECK(dl_save("build/test_cuda.safetensors", m, NULL) == DL_OK, "save from %s: %s", dl_device_name(dev),
              dl_error_message(c));
        dl_set_device(c, dl_cpu());
        m2 = make_lenet_bn(c);
        CHECK(m2 && dl_load("build/test_cuda.safetensors", m2, NULL) == DL_OK, "load on cpu:0: %s",
              dl_error_message(c));
        n2 = m2 ? dl_module_state_dict(m2, &p2) : 0;
        for (i = 0, total = 0; i < n && i < n2; i++)
            if (p2[i].t->dtype == DL_DTYPE_F32) {
                float *h = th_host(p2[i].t);
                same &= h && memcmp(h, *params + total, sizeof(float) * (size_t)p2[i].t->numel) == 0;
                total += (int)p2[i].t->numel;
            }
        CHECK(n2 == n && same, "LeNet-BN saved from %s and loaded on cpu:0 has the same parameters",
              dl_device_name(dev));
    }
    dl_optim_free(o);
    dl_set_device(c, dl_cpu());
    dl_step_end(c);
    return total;
}

static dl__backend g_cpu_im2col;

static void test_lenet(void)
{
    float l0[20], l1[20], l2[20], l3[20], *p0 = NULL, *p1 = NULL, *p2 = NULL, *p3 = NULL;
    double a, worst = 0;
    bool x;
    int i, n0, n1, n2, n3;
    dl_ctx *cs;
    for (i = 0; i < NB * 784; i++) g_xb[i] = urand() * 2.0f - 1.0f;
    for (i = 0; i < NB; i++) g_yb[i] = i % 10;
    /* the reference: cpu:0 with the convolution algorithm the CUDA backend
       has (im2col + GEMM; the CPU's padded-grid path sums in another
       order, which 20 Adam steps amplify past any fixed tolerance) */
    g_cpu_im2col = *dl__cpu_be();
    g_cpu_im2col.conv_s1 = NULL;
    g_cpu_im2col.conv_s1_wgrad = NULL;
    g_cpu_im2col.conv_i2c = NULL;
    C->cpu[0]->be = &g_cpu_im2col;
    n0 = train_lenet(C, dl_cpu(), 20, l0, &p0);
    C->cpu[0]->be = dl__cpu_be();
    n1 = train_lenet(C, dl_cuda(0), 20, l1, &p1);
    CHECK(n0 == n1 && n0 > 60000, "LeNet-BN parameter counts %d %d", n0, n1);
    for (i = 0; i < 20; i++) {
        double d = fabs((double)l0[i] - (double)l1[i]) / (fabs((double)l0[i]) + 1e-6);
        if (d > worst) worst = d;
    }
    if (!g_quiet) printf("cuda:0 %-30s losses: largest relative difference %.2e over 20 steps\n", "LeNet-BN Adam", worst);
    CHECK(worst < 1e-3, "LeNet-BN losses on cuda:0 differ from cpu:0 by %g (relative)", worst);
    /* The parameters: Adam moves each by lr m^/(sqrt(v^) + eps) a step,
       whatever the gradient's size, so a gradient near zero whose last bits
       differ (cuBLAS and the batch-norm blocks sum in other orders than the
       CPU; the losses above agree to ~1e-7) can step the other way: the
       parameters may differ by up to what Adam can move them, not by a
       fraction of their scale (on an H100: 6.6e-3, scale 1.17, lr 2e-3).
       That bound, from m_t = (1-b1) sum b1^(t-i) g_i, v_t = (1-b2) sum
       b2^(t-i) g_i^2 and Cauchy-Schwarz: |m^_t| / sqrt(v^_t) <= B_t =
       (1-b1)/(1-b1^t) sqrt((1-b2^t)/(1-b2)) sqrt((1-r^t)/(1-r)), r =
       b1^2/b2 (about 1.0 to 1.16 for t <= 20 at PyTorch's betas), so each
       run moves a parameter by at most lr sum_t B_t, and the two differ by
       at most twice that (0.085 here; the 1e-3 margin is fp32's rounding
       of the update). Past it, the update itself is wrong (a NaN, a
       runaway); the losses are what show the same training. */
    if (n0 == n1) {
        const double lr = LENET_LR, b1 = 0.9, b2 = 0.999, r = b1 * b1 / b2;
        double scale = 0, maxabs = 0, move = 0;
        int t;
        for (t = 1; t <= 20; t++)
            move += lr * (1 - b1) / (1 - pow(b1, t)) * sqrt((1 - pow(b2, t)) / (1 - b2)) *
                    sqrt((1 - pow(r, t)) / (1 - r));
        for (i = 0; i < n0; i++) if (fabs((double)p0[i]) > scale) scale = fabs((double)p0[i]);
        for (i = 0; i < n0; i++) if (!(fabs((double)p0[i] - (double)p1[i]) <= maxabs)) maxabs = fabs((double)p0[i] - (double)p1[i]);
        cmp_err(p1, p0, n0, &a, &x);
        if (!g_quiet) printf("cuda:0 %-30s parameters after 20 steps: %s (largest difference %.2e = %.2f lr x steps, scale %.2g)\n",
                             "LeNet-BN Adam", x ? "bit-identical" : "close", maxabs, maxabs / (lr * 20), scale);
        CHECK(maxabs <= 2 * move * (1 + 1e-3), "LeNet-BN after 20 Adam steps: parameters differ by %g, more than Adam "
              "can move two runs apart (2 x %g)", maxabs, move);
    }
    /* the same run again: the same bits (no atomics whose order matters) */
    n2 = train_lenet(C, dl_cuda(0), 5, l2, &p2);
    free(p1);
    p1 = NULL;
    n1 = train_lenet(C, dl_cuda(0), 5, l1, &p1);
    CHECK(n1 == n2 && memcmp(p1, p2, sizeof(float) * (size_t)n1) == 0 && memcmp(l1, l2, sizeof(float) * 5) == 0,
          "two runs on cuda:0 give the same bits");
    if (!g_quiet) printf("cuda:0 %-30s %s\n", "determinism (2 runs)", n1 == n2 && memcmp(p1, p2, sizeof(float) * (size_t)n1) == 0 ? "same bits" : "DIFFER");
    /* DL_CUDA_SYNC=1: wait after every launch, same results */
    setenv("DL_CUDA_SYNC", "1", 1);
    cs = exact_ctx();                    /* devices open at their first use: read it then */
    CHECK(cs != NULL, "context for DL_CUDA_SYNC");
    if (cs) {
        n3 = train_lenet(cs, dl_cuda(0), 5, l3, &p3);
        CHECK(cs->cuda[0] && DL__CUI(cs->cuda[0])->sync_each, "DL_CUDA_SYNC=1 sets the device's sync_each");
        CHECK(n3 == n2 && memcmp(p3, p2, sizeof(float) * (size_t)n3) == 0, "DL_CUDA_SYNC=1 gives the same bits");
        dl_ctx_free(cs);
    }
    unsetenv("DL_CUDA_SYNC");
    free(p0); free(p1); free(p2); free(p3);
}

/* ------------------------------------------------------------------ multi-tensor updates */

/* nt parameters of sizes sz on dev (the same values on every device), each
   with the gradient r (from backward of sum(p * r)); an optimizer over them
   (kind 0 SGD, 1 Adam, 2 AdamW with the desc's options), three steps with
   the lr changed between them. params/state: their bytes after. */
#define MT_N 5
static const int64_t g_mt_sz[MT_N] = {1, 7, 1000, 33, 4097};

static dl_optim *mt_optim(dl_ctx *c, dl_tensor **p, int kind, const dl_sgd_desc *sd, const dl_adam_desc *ad)
{
    return kind == 0 ? dl_sgd_params(c, MT_N, p, sd) : kind == 1 ? dl_adam_params(c, MT_N, p, ad)
                                                                : dl_adamw_params(c, MT_N, p, ad);
}

/* a tensor of n values in [-1, 1) on the default device, the same for a seed */
static dl_tensor *mt_grad(int64_t n, int seed)
{
    float *v = (float *)malloc(sizeof(float) * (size_t)n);
    uint32_t x = 2654435761u * (uint32_t)(seed + 1);
    dl_tensor *t;
    int64_t j;
    for (j = 0; j < n; j++) {
        x = x * 1664525u + 1013904223u;
        v[j] = (float)(x >> 8) / 8388608.0f - 1.0f;
    }
    t = dl_from_array(C, DL_SHAPE(n), v);
    free(v);
    return t;
}

static bool mt_run(dl_device dev, int kind, const dl_sgd_desc *sd, const dl_adam_desc *ad, float *out, size_t cap,
                   size_t *len)
{
    dl_tensor *p[MT_N];
    dl_optim *o;
    size_t n = 0;
    int i, k, s;
    bool ok = true;
    dl_set_device(C, dev);
    for (i = 0; i < MT_N; i++) {
        float *v = (float *)malloc(sizeof(float) * (size_t)g_mt_sz[i]);
        int64_t j;
        for (j = 0; j < g_mt_sz[i]; j++) v[j] = (float)((j * 37 + i * 11) % 101) / 50.0f - 1.0f;
        p[i] = dl_param(dl_from_array(C, DL_SHAPE(g_mt_sz[i]), v));
        free(v);
    }
    o = mt_optim(C, p, kind, sd, ad);
    for (s = 0; s < 3 && o; s++) {
        dl_optim_zero_grad(o);
        for (i = 0; i < MT_N; i++) {
            dl_tensor *r = mt_grad(g_mt_sz[i], s * 10 + i);
            ok = ok && dl_backward(dl_sum(dl_mul(p[i], r), DL_ALL, false)) == DL_OK;
        }
        ok = ok && dl_optim_set_lr(o, 0.05f / (float)(s + 1)) == DL_OK && dl_optim_step(o) == DL_OK;
        dl_step_end(C);
    }
    ok = ok && o;
    for (i = 0; i < MT_N && ok; i++) {
        for (k = -1; k < 3; k++) {
            dl_tensor *t = k < 0 ? p[i] : o->s[k] ? o->s[k][i] : NULL;
            if (!t) continue;
            if (n + (size_t)t->numel > cap) { ok = false; break; }
            ok = ok && dl_read(t, out + n, t->numel) == DL_OK;
            n += (size_t)t->numel;
        }
    }
    *len = n;
    dl_optim_free(o);
    for (i = 0; i < MT_N; i++) dl_free(p[i]);
    dl_set_device(C, dl_cpu());
    return ok;
}

/* A backward's leaf gradients (dl__backend.axpy_multi): ACC_N leaves of
   sizes 1..9, every fifth on dev2, p[0] used twice in the loss and p[1]
   twice through a shared subexpression; three backwards without zero_grad,
   so the second and third add into existing gradients (the queued path).
   grads: their bytes after. n_acc (a capture's list on an emulated dev:
   its launches) counts the third backward's work when not NULL. */
#define ACC_N 60
static bool acc_run(dl_device dev, dl_device dev2, float *out, size_t cap, size_t *len, size_t *n_acc)
{
    dl_tensor *p[ACC_N];
    size_t n = 0;
    int i, r;
    bool ok = true;
    for (i = 0; i < ACC_N; i++) {
        dl_set_device(C, i % 5 == 4 ? dev2 : dev);
        p[i] = dl_param(mt_grad(i % 9 + 1, 100 + i));
    }
    for (r = 0; r < 3 && ok; r++) {
        dl_capture *cap = NULL;
        dl_tensor *l, *g[ACC_N];
        for (i = 1; i < ACC_N; i++) {   /* (uploads: before a capture) */
            dl_set_device(C, p[i]->device);
            g[i] = dl_keep(mt_grad(i % 9 + 1, 10 * r + i));
        }
        if (r == 2 && n_acc) cap = dl_capture_begin(C);
        dl_set_device(C, dev);
        l = dl_sum(dl_mul(p[0], p[0]), DL_ALL, false);
        for (i = 1; i < ACC_N; i++) {
            dl_tensor *t;
            dl_set_device(C, p[i]->device);
            t = dl_mul(p[i], g[i]);
            if (i == 1) t = dl_add(t, dl_mul_scalar(t, 0.5f));
            l = dl_add(l, dl_to(dl_sum(t, DL_ALL, false), dev));
        }
        if (cap) {
            dl__cucap *cc = DL__CUI(C->cuda[0])->cap;
            size_t n0 = cc ? cc->nops : 0;
            ok = dl_backward(l) == DL_OK;
            ok = dl_capture_end(cap) == DL_OK && ok;   /* (the backward's last sums wait for an
                                                          optimizer's launch; here, the end's) */
            *n_acc = cc ? cc->nops - n0 : 0;
            dl_capture_free(cap);
        } else {
            ok = dl_backward(l) == DL_OK;
        }
        dl_step_end(C);
        for (i = 1; i < ACC_N; i++) dl_free(g[i]);
    }
    for (i = 0; i < ACC_N && ok; i++) {
        if (!p[i]->grad || n + (size_t)p[i]->numel > cap) { ok = false; break; }
        ok = dl_read(p[i]->grad, out + n, p[i]->numel) == DL_OK;
        n += (size_t)p[i]->numel;
    }
    *len = n;
    for (i = 0; i < ACC_N; i++) dl_free(p[i]);
    dl_set_device(C, dl_cpu());
    return ok;
}

static void test_grad_accum(void)
{
    static float a[600], b[600], c[600], e[600];
    size_t na = 0, nb = 0, nc = 0, ne = 0, k1 = 0, k2 = 0;
    bool ok = acc_run(dl_cpu(), dl_cpu(), a, 600, &na, NULL);
    ok = acc_run(dl_cuda(0), dl_cuda(dl_device_count(C, DL_DEVICE_CUDA) > 1 ? 1 : 0), b, 600, &nb, NULL) && ok;
    dl__mt_off = true;   /* an axpy launch per gradient */
    ok = acc_run(dl_cuda(0), dl_cuda(dl_device_count(C, DL_DEVICE_CUDA) > 1 ? 1 : 0), c, 600, &nc, NULL) && ok;
    dl__mt_off = false;
    CHECK(ok && na == nb && na == nc && na > 0, "accumulated gradients: runs: %s", dl_error_message(C));
    CHECK(ok && memcmp(b, c, sizeof(float) * nb) == 0, "accumulated gradients: one launch = one per leaf, bit for bit");
    CHECK(ok && memcmp(a, b, sizeof(float) * na) == 0, "accumulated gradients: cuda = cpu:0, bit for bit");
    if (dl__cu_emu_count() > 0) {   /* launches counted in an emulated capture, all on cuda:0 */
        ok = acc_run(dl_cuda(0), dl_cuda(0), e, 600, &ne, &k1);
        dl__mt_off = true;
        ok = acc_run(dl_cuda(0), dl_cuda(0), e, 600, &ne, &k2) && ok;
        dl__mt_off = false;
        /* 60 leaves, p[0] met twice (a second launch at its second gradient,
           as the queue holds it), 48 a launch: 3 launches for 61 additions */
        CHECK(ok && k2 > k1 && k2 - k1 == 61 - 3, "accumulated gradients: %zu launches fewer (61 axpys -> 3)",
              k2 - k1);
    }
}

/* cross entropy on cuda:0 is one fused op (dl__backend.class_loss):
   launches of a forward and backward counted in an emulated capture, fused
   and as the composite (dl__cls_off), which must agree */
static void test_fused_ce(void)
{
    static float xv[2560], gf[2][2560];
    dl_tensor *x, *t, *l;
    float lf[2] = {0, 0};
    size_t n[2] = {0, 0};
    int k;
    bool ok = true;
    for (k = 0; k < 2560; k++) xv[k] = (float)((k * 37) % 101) / 17.0f - 3.0f;
    if (dl__cu_emu_count() <= 0) return;
    dl_set_device(C, dl_cuda(0));
    for (k = 0; k < 2; k++) {
        dl_capture *cap;
        dl__cucap *cc;
        int64_t tv[256];
        int i;
        for (i = 0; i < 256; i++) tv[i] = (i * 7) % 10;
        x = dl_param(dl_from_array(C, DL_SHAPE(256, 10), xv));
        t = dl_keep(dl_from_int64(C, DL_SHAPE(256), tv));
        dl__cls_off = k == 1;
        ok = dl_backward(dl_cross_entropy(x, t, NULL)) == DL_OK && ok;   /* warm-up: x->grad made */
        dl_zero_grad(x);
        dl_step_end(C);
        cap = dl_capture_begin(C);
        cc = DL__CUI(C->cuda[0])->cap;
        l = dl_cross_entropy(x, t, NULL);
        ok = l && dl_backward(l) == DL_OK && ok;
        n[k] = cc ? cc->nops : 0;
        ok = dl_capture_end(cap) == DL_OK && ok;   /* (runs the step once) */
        ok = ok && dl_read(l, &lf[k], 1) == DL_OK && x->grad && dl_read(x->grad, gf[k], 2560) == DL_OK;
        dl_capture_free(cap);
        dl__cls_off = false;
        dl_step_end(C);
        dl_free(x);
        dl_free(t);
    }
    CHECK(ok, "fused cross entropy: runs: %s", dl_error_message(C));
    /* fused: log_softmax with the loss's partials and their sum (the last block), the
       backward, x->grad += (the implied seed is read as 1, never filled) */
    CHECK(ok && n[0] <= 3 && n[1] > n[0], "cross entropy forward + backward: %zu launches fused, %zu composed",
          n[0], n[1]);
    {
        double a, e = ok ? cmp_err(gf[0], gf[1], 2560, &a, &ok) : 2;
        CHECK(ok || e <= 1, "fused cross entropy's gradient = the composite's (%.2f x tolerance)", e);
        CHECK(fabsf(lf[0] - lf[1]) <= 1e-6f * fabsf(lf[1]), "fused cross entropy's loss %.9g = the composite's %.9g",
              (double)lf[0], (double)lf[1]);
    }
    if (!g_quiet) printf("cuda:0 cross entropy fwd+bwd            %zu launches fused, %zu composed\n", n[0], n[1]);
    dl_set_device(C, dl_cpu());
}

/* A fused class loss's backward reads backward's implied seed as ones
   without a fill; every other way in (an explicit grad, create_graph,
   dl_grad, retain_graph twice) still gets filled ones. Each way, each
   reduction (NONE on one element), nll_loss and a weight with label
   smoothing: the gradient on cuda:0 = cpu:0's (composites), and a fill the
   seed needs after an unfilled one (dl_grad, then dl_backward of a sum). */
static void test_ce_seed(void)
{
    static const char *const way[] = {"dl_backward", "explicit ones", "create_graph", "dl_grad", "retain twice"};
    float xv[60], gv[2][120], wv[5] = {0.5f, 1, 2, 1.5f, 0.25f};
    int64_t tv[12];
    int k, w, r, dv;
    for (k = 0; k < 60; k++) xv[k] = (float)((k * 29) % 41) / 9.0f - 2.0f;
    for (k = 0; k < 12; k++) tv[k] = (k * 3) % 5;
    if (dl__cu_emu_count() <= 0) return;
    for (r = 0; r < 5; r++)       /* mean, sum, none (1 element), nll mean, mean weight + smoothing */
        for (w = 0; w < 5; w++) {
            bool ok = true;
            for (dv = 0; dv < 2; dv++) {
                dl_device dev = dv ? dl_cuda(0) : dl_cpu();
                int64_t N = r == 2 ? 1 : 12;
                dl_loss_desc ld;
                dl_tensor *x, *t, *l, *gx = NULL, *wt = NULL;
                /* the step memory that the seed will take holds 7s, not ones left by an earlier seed */
                dl_fill_(dl_to(dl_empty(C, DL_SHAPE(1 << 14)), dev), 7.0f);
                dl_step_end(C);
                memset(&ld, 0, sizeof ld);
                ld.reduction = r == 1 ? DL_REDUCTION_SUM : r == 2 ? DL_REDUCTION_NONE : DL_REDUCTION_MEAN;
                if (r == 4) {
                    wt = dl_to(dl_from_array(C, DL_SHAPE(5), wv), dev);
                    ld.weight = wt;
                    ld.label_smoothing = 0.1f;
                }
                x = dl_param(dl_to(dl_from_array(C, DL_SHAPE(N, 5), xv), dev));
                t = dl_to(dl_from_int64(C, DL_SHAPE(N), tv), dev);
                l = r == 3 ? dl_nll_loss(dl_log_softmax(x, 1), t, &ld) : dl_cross_entropy(x, t, &ld);
                if (w == 0) ok = dl_backward(l) == DL_OK && ok;
                else if (w == 1 || w == 2 || w == 4) {
                    dl_backward_desc bd;
                    memset(&bd, 0, sizeof bd);
                    bd.grad = w == 1 ? dl_ones_like(l) : NULL;
                    bd.create_graph = w == 2;
                    bd.retain_graph = w == 4;
                    ok = dl_backward_ex(l, &bd) == DL_OK && ok;
                    if (w == 4) ok = dl_backward(l) == DL_OK && ok;   /* x->grad twice the gradient */
                } else {
                    ok = dl_grad(l, 1, &x, &gx, NULL) == DL_OK && ok;
                    /* then a seed that must be ones after an unfilled one was in the arena */
                    ok = dl_backward(dl_sum(dl_mul(x, x), DL_ALL, false)) == DL_OK && ok;
                    ok = ok && gx && dl_read(gx, gv[dv] + 5 * N, 5 * N) == DL_OK;
                }
                ok = ok && x->grad && dl_read(x->grad, gv[dv], 5 * N) == DL_OK;
                dl_free(x);
                dl_step_end(C);
                if (!ok) break;
                if (dv == 1) {
                    double a;
                    bool ex;
                    double e = cmp_err(gv[1], gv[0], w == 3 ? 10 * N : 5 * N, &a, &ex);
                    CHECK(e <= 1, "cuda:0 class loss %d, %s: the gradient = cpu:0's (%.2f x tolerance)", r, way[w], e);
                }
            }
            CHECK(ok, "class loss %d, %s: runs: %s", r, way[w], dl_error_message(C));
        }
}

/* A sum over every dim but a middle run (a convolution's bias gradient:
   dl_sum(g, (0, 2, 3))) is one chan_sum call: batch norm's pass 1 and 2.
   Against cpu:0: bit for bit on quarter-integer data (every partial sum
   exact), within float rounding on other data; the same bits from the
   capture's run and from two replays (on a GPU: the last-block ticket
   back at zero after each launch); one launch (the partials, then each
   channel's sum in the last block; counted inside an emulated capture);
   and the shapes it does not take
   (N or L of 1, no dims before or after the kept run, nothing to sum, a
   reduced middle) take the reduce passes and give the CPU's result. */
static void test_chan_sum(void)
{
    static const struct { int nd; int64_t sh[4]; int nr; int64_t dims[3]; bool chan; } cs[] = {
        {4, {7, 5, 9, 11}, 3, {0, 2, 3}, true},   {4, {3, 4, 6, 1000}, 3, {0, 2, 3}, true},
        {4, {2, 3, 4, 5}, 3, {0, 1, 3}, true},    {3, {5, 6, 7}, 2, {0, 2}, true},
        {3, {256, 64, 784}, 2, {0, 2}, true},     {4, {1, 3, 4, 5}, 3, {0, 2, 3}, false},
        {4, {4, 3, 1, 1}, 3, {0, 2, 3}, false},   {2, {300, 17}, 1, {0}, false},
        {3, {4, 5, 6}, 1, {1}, false},            {3, {0, 3, 4}, 2, {0, 2}, false},
        {4, {2, 3, 4, 5}, 2, {0, 2}, false},
    };
    int c, q;
    for (c = 0; c < (int)(sizeof cs / sizeof cs[0]); c++)
        for (q = 0; q < 2; q++) {   /* q: quarter integers, then other values */
            dl_shape sh = dl_shape_make(cs[c].nd, cs[c].sh), dims = dl_shape_make(cs[c].nr, cs[c].dims);
            int64_t n = 1, i, ny;
            float *h, *yc, *yg, *yg2;
            dl_tensor *xc, *xg, *rc, *rg, *rg2;
            dl_capture *cap;
            dl__cucap *cc;
            size_t nops = 0;
            bool ok, exact = false;
            double a, e;
            for (i = 0; i < cs[c].nd; i++) n *= cs[c].sh[i];
            h = (float *)malloc(sizeof(float) * (size_t)(n ? n : 1));
            for (i = 0; i < n; i++)
                h[i] = q == 0 ? (float)((i * 7919) % 23 - 11) * 0.25f : sinf((float)i * 0.37f) * 3.0f + 0.001f * (float)(i % 13);
            dl_set_device(C, dl_cpu());
            xc = dl_from_array(C, sh, h);
            rc = dl_sum(xc, dims, c % 2 == 0);
            dl_set_device(C, dl_cuda(0));
            xg = dl_keep(dl_from_array(C, sh, h));
            rg = dl_sum(xg, dims, c % 2 == 0);
            cap = dl_capture_begin(C);
            cc = DL__CUI(C->cuda[0])->cap;
            rg2 = dl_sum(xg, dims, c % 2 == 0);
            nops = cc ? cc->nops : 0;
            ok = rc && rg && rg2 && dl_capture_end(cap) == DL_OK && rc->numel == rg->numel &&
                 rc->ndim == rg->ndim && rg2->numel == rg->numel;
            ny = ok ? rc->numel : 0;
            yc = (float *)calloc((size_t)ny + 1, sizeof(float));
            yg = (float *)calloc((size_t)ny + 1, sizeof(float));
            yg2 = (float *)calloc((size_t)ny + 1, sizeof(float));
            ok = ok && dl_read(rc, yc, ny) == DL_OK && dl_read(rg, yg, ny) == DL_OK && dl_read(rg2, yg2, ny) == DL_OK;
            e = ok ? cmp_err(yg, yc, ny, &a, &exact) : 2;
            CHECK(ok && (q == 0 ? exact : e <= 1), "chan_sum case %d%s: cuda:0 = cpu:0 (%s, %.2f x tolerance): %s", c,
                  q ? "" : " (exact data)", exact ? "bit for bit" : "not exact", e, dl_error_message(C));
            CHECK(ok && memcmp(yg, yg2, sizeof(float) * (size_t)ny) == 0, "chan_sum case %d: the same bits twice", c);
            for (i = 0; i < 2 && ok; i++) {
                memset(yg2, 0, sizeof(float) * (size_t)ny);
                ok = dl_replay(cap) == DL_OK && dl_read(rg2, yg2, ny) == DL_OK;
                CHECK(ok && memcmp(yg, yg2, sizeof(float) * (size_t)ny) == 0,
                      "chan_sum case %d: replay %d gives the same bits: %s", c, (int)i + 1, dl_error_message(C));
            }
            CHECK(!ok || !cs[c].chan || dl__cu_emu_count() <= 0 || nops == 1,   /* counted when emulated */
                  "chan_sum case %d: %zu launches (1: the partials, then each channel's in order)", c, nops);
            dl_capture_free(cap);
            dl_free(xg);
            free(h); free(yc); free(yg); free(yg2);
            dl_step_end(C);
        }
    dl_set_device(C, dl_cpu());
}

/* A fused op against the ops it replaces, on cuda:0: fwd(u, fused) (the
   output y) then dl_grad of sum(y) in in[0..n-1], inside a capture, whose
   launches are counted (when emulated) into *nops; y and the n gradients
   read into hv[0..n] (cnt: their sizes). false on an error. */
typedef dl_tensor *(*fused_fwd_fn)(void *u, bool fused);
static bool fused_run(fused_fwd_fn fwd, void *u, bool fused, int n, dl_tensor **in, float **hv, int64_t *cnt,
                      size_t *nops)
{
    dl_tensor *gr[4] = {NULL, NULL, NULL, NULL}, *y;
    dl_capture *cap = dl_capture_begin(C);
    dl__cucap *cc = DL__CUI(C->cuda[0])->cap;
    size_t n0 = cc ? cc->nops : 0;
    bool ok;
    int k;
    y = fwd(u, fused);
    ok = y && dl_grad(dl_sum(y, DL_ALL, false), n, in, gr, NULL) == DL_OK;
    *nops = cc ? cc->nops - n0 : 0;
    ok = ok && dl_capture_end(cap) == DL_OK;
    for (k = 0; k <= n; k++) {
        dl_tensor *t = k ? gr[k - 1] : y;
        cnt[k] = t ? t->numel : 0;
        hv[k] = (float *)calloc((size_t)cnt[k] + 1, sizeof(float));
        ok = ok && t && dl_read(t, hv[k], cnt[k]) == DL_OK;
    }
    dl_capture_free(cap);
    return ok;
}

/* both ways: the same bits of y and each gradient (names[k]), and `fewer`
   launches fused (counted when emulated) */
static void fused_check(const char *what, int c, fused_fwd_fn fwd, void *u, int n, dl_tensor **in,
                        const char *const *names, size_t fewer)
{
    float *hv[2][5];
    int64_t cnt[5];
    size_t nops[2] = {0, 0};
    bool ok = fused_run(fwd, u, false, n, in, hv[0], cnt, &nops[0]);
    int k;
    ok = fused_run(fwd, u, true, n, in, hv[1], cnt, &nops[1]) && ok;
    for (k = 0; k <= n; k++)
        CHECK(ok && memcmp(hv[0][k], hv[1][k], sizeof(float) * (size_t)cnt[k]) == 0,
              "%s case %d: %s the unfused ops' bits: %s", what, c, names[k], dl_error_message(C));
    CHECK(!ok || dl__cu_emu_count() <= 0 || nops[1] + fewer == nops[0],   /* counted when emulated */
          "%s case %d: %zu launches fused, %zu unfused (%zu fewer)", what, c, nops[1], nops[0], fewer);
    for (k = 0; k <= n; k++) { free(hv[0][k]); free(hv[1][k]); }
}

typedef struct { dl_module *bn; dl_tensor *x, *r; } bn_add_case;
static dl_tensor *bn_add_fwd(void *u, bool fused)
{
    bn_add_case *b = (bn_add_case *)u;
    return fused ? dl_module_forward_add_relu(b->bn, b->x, b->r) : dl_relu(dl_add(dl_module_forward(b->bn, b->x), b->r));
}

/* relu(bn(x) + r) through dl_module_forward_add_relu: forward and dl_grad of
   x, r, weight and bias take three launches fewer than the three ops (the
   add and the ReLU in the apply pass; the ReLU's mask, r's gradient,
   written by the backward's first pass), with the same bits */
static void test_bn_add_relu(void)
{
    static const int64_t sh[2][4] = {{6, 5, 7, 9}, {4, 16, 3, 3}};
    static const char *const names[5] = {"output", "x's gradient", "r's gradient", "weight's gradient",
                                         "bias's gradient"};
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 2; c++) {
        dl_shape s = dl_shape_make(4, sh[c]);
        const dl_named_tensor *ps;
        dl_tensor *in[4];
        bn_add_case u;
        u.bn = dl_nn_batch_norm2d(C, sh[c][1]);
        u.x = dl_keep(dl_requires_grad(dl_randn(C, s), true));
        u.r = dl_keep(dl_requires_grad(dl_mul_scalar(dl_randn(C, s), 0.5f), true));
        dl_module_named_parameters(u.bn, &ps);
        in[0] = u.x; in[1] = u.r; in[2] = ps[0].t; in[3] = ps[1].t;
        fused_check("bn+add+relu", c, bn_add_fwd, &u, 4, in, names, 3);
        dl_free(u.x);
        dl_free(u.r);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

typedef struct { dl_module *bn, *seq; dl_tensor *x; } bn_pool_case;
static dl_tensor *bn_pool_fwd(void *u, bool fused)
{
    bn_pool_case *b = (bn_pool_case *)u;
    dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
    return fused ? dl_module_forward(b->seq, b->x) : dl_max_pool2d(dl_relu(dl_module_forward(b->bn, b->x)), &pd);
}

/* Sequential's BatchNorm2d, ReLU, MaxPool2d(2): forward and dl_grad of x,
   weight and bias take four launches fewer than the three ops (the ReLU
   and the pool in the apply's launch; the unpool and the ReLU's mask in the
   backward's two passes), with the same bits; an odd width keeps the pool
   as its own op (BatchNorm and ReLU still one: two fewer) */
static void test_bn_relu_pool(void)
{
    static const int64_t sh[3][5] = {{6, 5, 8, 10, 4}, {4, 16, 6, 6, 4}, {3, 4, 6, 7, 2}};   /* shape, fewer */
    static const char *const names[4] = {"output", "x's gradient", "weight's gradient", "bias's gradient"};
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 3; c++) {
        dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
        const dl_named_tensor *ps;
        dl_module *mods[3];
        dl_tensor *in[3];
        bn_pool_case u;
        mods[0] = u.bn = dl_nn_batch_norm2d(C, sh[c][1]);
        mods[1] = dl_nn_relu(C);
        mods[2] = dl_nn_max_pool2d(C, &pd);
        u.seq = dl_nn_sequential(C, 3, mods);
        u.x = dl_keep(dl_requires_grad(dl_randn(C, dl_shape_make(4, sh[c])), true));
        dl_module_named_parameters(u.bn, &ps);
        in[0] = u.x; in[1] = ps[0].t; in[2] = ps[1].t;
        fused_check("bn+relu+max_pool", c, bn_pool_fwd, &u, 3, in, names, (size_t)sh[c][4]);
        dl_free(u.x);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

/* Eval-mode batch norm on cuda:0: the mean and invstd of the running
   statistics in one launch (bn_eval), then the apply: two launches (four
   before), and the bits of the same arithmetic as ops: invstd =
   (rv + eps)^-0.5, sc = invstd w, sh = b - rm sc, y = x sc + sh */
static void test_bn_eval(void)
{
    static const int64_t sh[2][4] = {{4, 5, 3, 3}, {6, 7, 1, 1}};
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 2; c++) {
        int nd = c == 0 ? 4 : 2;
        dl_shape xs = dl_shape_make(nd, sh[c]), cs = dl_shape_make(nd, sh[c]);
        dl_module *bn = nd == 4 ? dl_nn_batch_norm2d(C, sh[c][1]) : dl_nn_batch_norm1d(C, sh[c][1]);
        const dl_named_tensor *ps;
        dl_tensor *x = dl_keep(dl_randn(C, xs)), *y, *ref, *sc, *shf;
        dl_capture *cap;
        dl__cucap *cc;
        size_t n0 = 0, nops = 0;
        int k;
        dl_module_named_parameters(bn, &ps);
        dl_no_grad_begin(C);
        dl_copy_(ps[0].t, dl_add_scalar(dl_rand(C, DL_SHAPE(sh[c][1])), 0.5f));
        dl_copy_(ps[1].t, dl_randn(C, DL_SHAPE(sh[c][1])));
        dl_module_forward(bn, dl_mul_scalar(dl_randn(C, xs), 1.5f));   /* running statistics */
        dl_no_grad_end(C);
        dl_module_train(bn, false);
        cap = dl_capture_begin(C);
        cc = DL__CUI(C->cuda[0])->cap;
        n0 = cc ? cc->nops : 0;
        y = dl_module_forward(bn, x);
        nops = cc ? cc->nops - n0 : 0;
        CHECK(dl_capture_end(cap) == DL_OK && y, "eval batch_norm case %d: captured", c);
        CHECK(dl__cu_emu_count() <= 0 || nops == 2, "eval batch_norm case %d: %zu launches (2: statistics, apply)", c, nops);
        for (k = 2; k < nd; k++) cs.d[k] = 1;
        cs.d[0] = 1;
        sc = dl_mul(dl_pow(dl_add_scalar(dl_module_get(bn, "running_var"), 1e-5f), -0.5f), ps[0].t);
        shf = dl_sub(ps[1].t, dl_mul(dl_module_get(bn, "running_mean"), sc));
        ref = dl_add(dl_mul(x, dl_reshape(sc, cs)), dl_reshape(shf, cs));
        CHECK(y && ref && th_same_bytes(y, ref), "eval batch_norm case %d: the ops' bits", c);
        dl_capture_free(cap);
        dl_free(x);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

typedef struct { dl_module *lin, *seq; dl_tensor *x; bool relu; } lin_act_case;
static dl_tensor *lin_act_fwd(void *u, bool fused)
{
    lin_act_case *l = (lin_act_case *)u;
    if (fused) return dl_module_forward(l->seq, l->x);
    return l->relu ? dl_relu(dl_module_forward(l->lin, l->x)) : dl_sigmoid(dl_module_forward(l->lin, l->x));
}

/* Sequential's Linear then Sigmoid (or ReLU): the bias and the activation
   one launch each way, two fewer than dl_linear then the activation
   (forward and dl_grad of x, weight and bias), the same bits; 1100 rows:
   one fewer (the bias's sum is not sequential there: the backward's two
   launches stay) */
static void test_linear_act(void)
{
    static const int64_t rows[3] = {256, 37, 1100};
    static const char *const names[4] = {"output", "x's gradient", "weight's gradient", "bias's gradient"};
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 3; c++) {
        dl_module *mods[2];
        const dl_named_tensor *ps;
        dl_tensor *in[3];
        lin_act_case u;
        u.x = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(rows[c], 40)), true));
        u.relu = c == 1;
        mods[0] = u.lin = dl_nn_linear(C, 40, 24, true);
        mods[1] = u.relu ? dl_nn_relu(C) : dl_nn_sigmoid(C);
        u.seq = dl_nn_sequential(C, 2, mods);
        dl_module_named_parameters(u.lin, &ps);
        in[0] = u.x; in[1] = ps[0].t; in[2] = ps[1].t;
        fused_check("linear+act", c, lin_act_fwd, &u, 3, in, names, c == 2 ? 1 : 2);
        dl_free(u.x);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

typedef struct { dl_tensor *x, *w, *b, *t; dl_loss_desc d; bool joined; } ce_bias_case;
static dl_tensor *ce_bias_fwd(void *u, bool fused)
{
    ce_bias_case *e = (ce_bias_case *)u;
    /* b + z's add has the bias first: the loss's backward leaves its sums to it */
    dl_tensor *z = e->w ? (fused ? dl_linear(e->x, e->w, e->b) : dl_add(e->b, dl_linear(e->x, e->w, NULL)))
                        : fused ? dl_add(e->x, e->b) : dl_add(e->b, e->x);
    dl_tensor *l = dl_cross_entropy(z, e->t, &e->d);
    return e->joined ? dl_add(dl_sum(l, DL_ALL, false), dl_mul_scalar(dl_sum(dl_mul(z, z), DL_ALL, false), 0.25f)) : l;
}

/* Cross entropy of a Linear's logits, x w^T + b, or of x + b: the loss's
   backward launch adds dx's columns into b's gradient too (dl__cls_bias),
   one launch fewer than the add's own sum, with the same bits (forward and
   dl_grad of x, (w,) b; then dl_backward's b->grad), for each reduction,
   label smoothing, a weight and ignore_index, under 32 rows; and none
   fewer where the sum is not the reduce's in-order one (1100 rows; one
   class), or where another gradient joins dx before the add (its sum then
   sums both) */
static void test_ce_bias(void)
{
    /* rows, classes, reduction, smoothing x 10, weight and ignore_index 1, joined, a Linear, fewer */
    static const int cs[8][8] = {{256, 10, 0, 0, 0, 0, 0, 1}, {5, 3, 2, 1, 1, 0, 0, 1},  {40, 7, 1, 0, 0, 0, 0, 1},
                                 {256, 10, 0, 0, 0, 0, 1, 1}, {1100, 4, 0, 0, 0, 0, 0, 0}, {64, 1, 0, 0, 0, 0, 0, 0},
                                 {256, 10, 0, 0, 0, 1, 0, 0}, {33, 6, 2, 2, 1, 1, 1, 0}};
    static const char *const names[5] = {"loss", "x's gradient", "b's gradient", "w's gradient", ""};
    static const char *const lnames[5] = {"loss", "x's gradient", "w's gradient", "b's gradient", ""};
    int c, k;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 8; c++) {
        int64_t N = cs[c][0], K = cs[c][1], *tv = (int64_t *)malloc(sizeof(int64_t) * (size_t)N), i;
        float *cw = (float *)malloc(sizeof(float) * (size_t)K), *gb[2];
        dl_tensor *in[3];
        ce_bias_case u;
        memset(&u, 0, sizeof u);
        for (i = 0; i < N; i++) tv[i] = (i * 7 + 3) % K;
        for (i = 0; i < K; i++) cw[i] = 0.5f + (float)i / (float)K;
        u.d.reduction = (dl_reduction)cs[c][2];
        u.d.label_smoothing = (float)cs[c][3] / 10.0f;
        if (cs[c][4]) {
            u.d.weight = dl_keep(dl_from_array(C, DL_SHAPE(K), cw));
            u.d.has_ignore_index = true;
            u.d.ignore_index = 1;
        }
        u.joined = cs[c][5] != 0;
        u.t = dl_keep(dl_from_int64(C, DL_SHAPE(N), tv));
        u.b = dl_keep(dl_param(dl_mul_scalar(dl_randn(C, DL_SHAPE(K)), 0.5f)));
        if (cs[c][6]) {
            u.x = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(N, 12)), true));
            u.w = dl_keep(dl_param(dl_mul_scalar(dl_randn(C, DL_SHAPE(K, 12)), 0.3f)));
            in[0] = u.x; in[1] = u.w; in[2] = u.b;
        } else {
            u.x = dl_keep(dl_requires_grad(dl_mul_scalar(dl_randn(C, DL_SHAPE(N, K)), 2.0f), true));
            in[0] = u.x; in[1] = u.b;
        }
        fused_check(cs[c][6] ? "linear+cross_entropy" : "bias+cross_entropy", c, ce_bias_fwd, &u, cs[c][6] ? 3 : 2, in,
                    cs[c][6] ? lnames : names, (size_t)cs[c][7]);
        for (k = 0; k < 2; k++) {   /* dl_backward: b->grad (the implied seed where the loss is one value) */
            dl_tensor *l = ce_bias_fwd(&u, k == 1);
            gb[k] = (float *)calloc((size_t)K, sizeof(float));
            CHECK(l && dl_backward(u.d.reduction == DL_REDUCTION_NONE || u.joined ? dl_sum(l, DL_ALL, false) : l) == DL_OK &&
                      u.b->grad && dl_read(u.b->grad, gb[k], K) == DL_OK,
                  "ce bias case %d: dl_backward: %s", c, dl_error_message(C));
            dl_zero_grad(u.b);
            dl_step_end(C);
        }
        CHECK(memcmp(gb[0], gb[1], sizeof(float) * (size_t)K) == 0, "ce bias case %d: dl_backward's b->grad: the "
              "unfused ops' bits", c);
        free(gb[0]); free(gb[1]);
        dl_free(u.x); dl_free(u.b); dl_free(u.t);
        if (u.w) dl_free(u.w);
        if (u.d.weight) dl_free(u.d.weight);
        free(tv); free(cw);
        dl_step_end(C);
    }
    {   /* dl_grad of the logits alone walks no node below them: the add's sums the loss's
           backward made are dropped there, and a dl_backward after it (the graph kept) makes
           its own: b->grad = the logits' gradient summed over dim 0 */
        static float gb[2][6];
        dl_backward_desc bd;
        dl_tensor *x = dl_param(dl_randn(C, DL_SHAPE(40, 6))), *b = dl_keep(dl_param(dl_randn(C, DL_SHAPE(6))));
        int64_t tv[40], i;
        dl_tensor *t, *z, *l, *gz = NULL;
        for (i = 0; i < 40; i++) tv[i] = i % 6;
        t = dl_from_int64(C, DL_SHAPE(40), tv);
        z = dl_add(x, b);
        l = dl_cross_entropy(z, t, NULL);
        memset(&bd, 0, sizeof bd);
        bd.retain_graph = true;
        CHECK(l && dl_grad(l, 1, &z, &gz, &bd) == DL_OK && gz && !b->grad && dl_backward(l) == DL_OK && b->grad &&
                  dl_read(b->grad, gb[0], 6) == DL_OK && dl_read(dl_sum(gz, DL_DIMS(0), false), gb[1], 6) == DL_OK &&
                  memcmp(gb[0], gb[1], sizeof gb[0]) == 0,
              "ce bias: dl_grad of the logits, then dl_backward: b->grad = their gradient's sum: %s",
              dl_error_message(C));
        dl_free(b);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

typedef struct { dl_module *conv; dl_tensor *x, *t; bool nll; } conv_ce_case;
static dl_tensor *conv_ce_fwd(void *u, bool fused)
{
    conv_ce_case *e = (conv_ce_case *)u;
    dl_tensor *z = dl_module_forward(e->conv, e->x);
    if (!fused) z = dl_mul_scalar(z, 1.0f);
    return e->nll ? dl_nll_loss(z, e->t, NULL) : dl_cross_entropy(z, e->t, NULL);
}

/* Cross entropy (and nll_loss) of a convolution's (N, C, d...) output, a
   bias on it: the loss's backward makes no bias sums there (dl__bias_of
   takes a Linear's (N, C) logits alone; batch norm's backward takes a
   convolution's bias): the bits of the ops with a * 1 between, the mul's
   launch the one fewer; 2-d and 1-d convolutions */
static void test_conv_ce(void)
{
    static const char *const names[5] = {"loss", "x's gradient", "weight's gradient", "bias's gradient", ""};
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 3; c++) {
        dl_conv_desc cd = dl_conv_desc_make(1, 1, 1, 1);
        int64_t tv[2 * 5 * 5], i, nt = c == 1 ? 2 * 7 : 2 * 5 * 5;
        const dl_named_tensor *ps;
        dl_tensor *in[3];
        conv_ce_case u;
        for (i = 0; i < nt; i++) tv[i] = (i * 3 + 1) % 4;
        u.nll = c == 2;
        u.conv = c == 1 ? dl_nn_conv1d(C, 2, 4, 3, &cd, true) : dl_nn_conv2d(C, 2, 4, 3, &cd, true);
        u.x = dl_keep(dl_requires_grad(dl_randn(C, c == 1 ? DL_SHAPE(2, 2, 7) : DL_SHAPE(2, 2, 5, 5)), true));
        u.t = dl_keep(dl_from_int64(C, c == 1 ? DL_SHAPE(2, 7) : DL_SHAPE(2, 5, 5), tv));
        dl_module_named_parameters(u.conv, &ps);
        in[0] = u.x; in[1] = ps[0].t; in[2] = ps[1].t;
        fused_check(u.nll ? "conv+nll_loss" : "conv+cross_entropy", c, conv_ce_fwd, &u, 3, in, names, 1);
        dl_free(u.x); dl_free(u.t);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

typedef struct { dl_module *lin, *seq, *tail; dl_tensor *x; } bn_bias_case;
static dl_tensor *bn_bias_fwd(void *u, bool fused)
{
    bn_bias_case *e = (bn_bias_case *)u;
    const dl_named_tensor *ps;
    dl_module_named_parameters(e->lin, &ps);
    /* b + x w^T has the bias first: batch norm's backward leaves its sums to it */
    return fused ? dl_module_forward(e->seq, e->x)
                 : dl_module_forward(e->tail, dl_add(ps[1].t, dl_linear(e->x, ps[0].t, NULL)));
}

/* Sequential's Linear, BatchNorm1d (and ReLU): batch norm's backward
   launch adds dx's columns into the Linear's bias gradient too
   (dl__bias_of), one launch fewer than the add's own sum, and in training
   its statistics' launch adds the bias (bn_stats_add), one fewer than the
   add's own, with the same bits (forward and dl_grad of x, weight, bias
   and batch norm's weight), in training and eval mode, under 32 rows; at
   1100 rows the backward's sum stays (not the reduce's in-order one) */
static void test_bn_bias(void)
{
    static const int cs[5][5] = {{256, 120, 1, 1, 2}, {37, 84, 1, 0, 2}, {256, 84, 0, 1, 1}, {1100, 16, 1, 1, 1},
                                 {9, 5, 1, 1, 2}};   /* rows, channels, training, ReLU, fewer */
    static const char *const names[5] = {"output", "x's gradient", "weight's gradient", "bias's gradient",
                                         "batch norm's weight's gradient"};
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 5; c++) {
        dl_module *mods[3], *tail[2];
        const dl_named_tensor *ps, *pb;
        dl_tensor *in[4];
        bn_bias_case u;
        int nm = cs[c][3] ? 3 : 2;
        mods[0] = u.lin = dl_nn_linear(C, 24, cs[c][1], true);
        mods[1] = tail[0] = dl_nn_batch_norm1d(C, cs[c][1]);
        mods[2] = tail[1] = dl_nn_relu(C);
        u.seq = dl_nn_sequential(C, nm, mods);
        u.tail = dl_nn_sequential(C, nm - 1, tail);
        dl_module_train(u.seq, cs[c][2] != 0);
        u.x = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(cs[c][0], 24)), true));
        dl_module_named_parameters(u.lin, &ps);
        dl_module_named_parameters(tail[0], &pb);
        in[0] = u.x; in[1] = ps[0].t; in[2] = ps[1].t; in[3] = pb[0].t;
        fused_check("linear+batch_norm1d", c, bn_bias_fwd, &u, 4, in, names, (size_t)cs[c][4]);
        dl_free(u.x);
        dl_step_end(C);
    }
    {   /* the running statistics and num_batches_tracked of two training steps: the unfused ops' bits */
        dl_module *lin[2], *bn[2], *mods[2];
        dl_tensor *x = dl_keep(dl_randn(C, DL_SHAPE(40, 24)));
        const dl_named_tensor *p0, *p1;
        int k, i, np;
        for (k = 0; k < 2; k++) {
            lin[k] = dl_nn_linear(C, 24, 16, true);
            bn[k] = dl_nn_batch_norm1d(C, 16);
        }
        np = dl_module_named_parameters(lin[0], &p0);
        dl_module_named_parameters(lin[1], &p1);
        dl_no_grad_begin(C);
        for (i = 0; i < np; i++) CHECK(dl_copy_(p1[i].t, p0[i].t) == DL_OK, "linear+batch_norm1d: the copy");
        dl_no_grad_end(C);
        mods[0] = lin[0]; mods[1] = bn[0];
        mods[0] = dl_nn_sequential(C, 2, mods);
        for (i = 0; i < 2; i++) {
            CHECK(dl_module_forward(mods[0], dl_mul_scalar(x, (float)(i + 1))) &&
                      dl_module_forward(bn[1], dl_add(dl_linear(dl_mul_scalar(x, (float)(i + 1)), p1[0].t, NULL),
                                                      p1[1].t)),
                  "linear+batch_norm1d: step %d: %s", i, dl_error_message(C));
            dl_step_end(C);
        }
        CHECK(th_same_bytes(dl_module_get(bn[0], "running_mean"), dl_module_get(bn[1], "running_mean")) &&
                  th_same_bytes(dl_module_get(bn[0], "running_var"), dl_module_get(bn[1], "running_var")) &&
                  th_same_bytes(dl_module_get(bn[0], "num_batches_tracked"),
                                dl_module_get(bn[1], "num_batches_tracked")),
              "linear+batch_norm1d: the running statistics: the unfused ops' bits");
        dl_free(x);
    }
    dl_set_device(C, dl_cpu());
}

typedef struct { dl_module *conv, *tail; dl_tensor *x, *r, *gw; bool joined; } conv_bn_case;
static dl_tensor *conv_bn_fwd(void *u, bool fused)
{
    conv_bn_case *e = (conv_bn_case *)u;
    dl_tensor *z = dl_module_forward(e->conv, e->x), *y;
    /* z * 1 between: batch norm's input is no convolution's, so the conv sums its own bias gradient */
    dl_tensor *b = fused ? z : dl_mul_scalar(z, 1.0f);
    y = dl_mul(e->r ? dl_module_forward_add_relu(e->tail, b, e->r) : dl_module_forward(e->tail, b), e->gw);
    return e->joined ? dl_add(dl_sum(y, DL_ALL, false), dl_mul_scalar(dl_sum(dl_mul(z, z), DL_ALL, false), 0.25f)) : y;
}

/* A convolution (with a bias), then BatchNorm2d (and ReLU, a max pool, a
   residual): batch norm's dx launch adds dx up per channel into the
   convolution's bias gradient too (dl__conv_bias_of), the launch of that
   sum fewer, with the same bits (forward and dl_grad of x, weight, bias and
   batch norm's weight; then dl_backward's bias->grad), in training and eval
   mode; none fewer with one sample, a 1x1 output, or another gradient
   joined at the convolution's output */
static void test_conv_bn_bias(void)
{
    /* N, in, out, H, kernel, variant (0 BN, 1 + ReLU, 2 + ReLU + max pool, 3 + r then ReLU), training,
       joined, fewer (the z * 1 of the unfused ops: one launch; the sum: one) */
    static const int cs[9][9] = {{8, 1, 6, 28, 5, 2, 1, 0, 2}, {5, 6, 16, 12, 5, 2, 1, 0, 2},
                                 {4, 3, 8, 9, 3, 0, 1, 0, 2},  {4, 3, 8, 9, 3, 1, 0, 0, 2},
                                 {3, 4, 5, 7, 3, 3, 1, 0, 2},  {3, 4, 5, 8, 3, 2, 0, 0, 2},
                                 {1, 3, 4, 6, 3, 0, 1, 0, 1},  {6, 2, 4, 1, 3, 1, 1, 0, 1},
                                 {4, 3, 8, 9, 3, 1, 1, 1, 1}};
    static const char *const names[5] = {"output", "x's gradient", "weight's gradient", "bias's gradient",
                                         "batch norm's weight's gradient"};
    int c, k;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 9; c++) {
        const int *q = cs[c];
        int64_t Ho = q[3] - (q[4] == 5 ? 4 : 0);
        dl_conv_desc cd = dl_conv_desc_make(1, q[4] == 5 ? 0 : 1, 1, 1);
        dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
        dl_module *tail[3];
        const dl_named_tensor *ps, *pb;
        dl_tensor *in[4];
        float *gb[2];
        conv_bn_case u;
        memset(&u, 0, sizeof u);
        u.conv = dl_nn_conv2d(C, q[1], q[2], q[4], &cd, true);
        tail[0] = dl_nn_batch_norm2d(C, q[2]);
        tail[1] = dl_nn_relu(C);
        tail[2] = dl_nn_max_pool2d(C, &pd);
        u.tail = q[5] == 3 ? tail[0] : dl_nn_sequential(C, q[5] + 1, tail);
        dl_module_train(u.conv, q[6] != 0);
        dl_module_train(u.tail, q[6] != 0);
        if (!q[6]) {   /* running statistics away from 0 and 1 */
            dl_no_grad_begin(C);
            dl_module_forward(tail[0], dl_mul_scalar(dl_randn(C, DL_SHAPE(4, q[2], 3, 3)), 1.5f));
            dl_no_grad_end(C);
        }
        u.x = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(q[0], q[1], q[3], q[3])), true));
        u.r = q[5] == 3 ? dl_keep(dl_randn(C, DL_SHAPE(q[0], q[2], Ho, Ho))) : NULL;
        u.gw = dl_keep(dl_randn(C, DL_SHAPE(q[0], q[2], q[5] == 2 ? Ho / 2 : Ho, q[5] == 2 ? Ho / 2 : Ho)));
        u.joined = q[7] != 0;
        dl_module_named_parameters(u.conv, &ps);
        dl_module_named_parameters(tail[0], &pb);
        in[0] = u.x; in[1] = ps[0].t; in[2] = ps[1].t; in[3] = pb[0].t;
        fused_check("conv+batch_norm2d", c, conv_bn_fwd, &u, 4, in, names, (size_t)q[8]);
        for (k = 0; k < 2; k++) {   /* dl_backward: the bias's ->grad */
            dl_tensor *y = conv_bn_fwd(&u, k == 1);
            gb[k] = (float *)calloc((size_t)q[2], sizeof(float));
            CHECK(y && dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && ps[1].t->grad &&
                      dl_read(ps[1].t->grad, gb[k], q[2]) == DL_OK,
                  "conv+batch_norm2d case %d: dl_backward: %s", c, dl_error_message(C));
            dl_module_zero_grad(u.conv);
            dl_module_zero_grad(u.tail);
            dl_step_end(C);
        }
        CHECK(memcmp(gb[0], gb[1], sizeof(float) * (size_t)q[2]) == 0, "conv+batch_norm2d case %d: dl_backward's "
              "bias->grad: the unfused ops' bits", c);
        free(gb[0]); free(gb[1]);
        dl_free(u.x); dl_free(u.gw);
        if (u.r) dl_free(u.r);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

/* The in-order column sums on a GPU (dl__cu_colsum: staged through shared
   memory where a column has 32+ rows, a thread per column below): dl_sum
   over dim 0 and a Linear's bias + activation backward (bias_act_bwd)
   against the definition, bit for bit: gx = the activation's gradient of
   (g, y), each column's sum in double in row order, then rounded. The
   data make the order show (rows of +-2^60 that cancel, around values an
   accumulator that large drops): the sum in reverse order fails it.
   Shapes below, at, and across the 32-column blocks and 256-row stages. */
static void test_colsum(void)
{
    static const int64_t rc[][2] = {{31, 10}, {32, 10}, {37, 33}, {256, 10}, {256, 256}, {257, 64},
                                    {600, 40}, {1023, 5}, {512, 2}};
    static const int acts[3] = {DL__U_RELU, DL__U_SIGMOID, DL__U_TANH};
    int c, a;
    for (c = 0; c < (int)(sizeof rc / sizeof rc[0]); c++) {
        int64_t rows = rc[c][0], cols = rc[c][1], n = rows * cols, i, k, j, bad = -1;
        float *g = (float *)malloc(sizeof(float) * (size_t)n), *y = (float *)malloc(sizeof(float) * (size_t)n);
        float *gx = (float *)malloc(sizeof(float) * (size_t)n), *got = (float *)malloc(sizeof(float) * (size_t)n);
        float *db = (float *)malloc(sizeof(float) * (size_t)cols), *dg = (float *)malloc(sizeof(float) * (size_t)cols);
        dl_tensor *tg, *ty, *tgx, *tdb, *s;
        bool ok;
        for (i = 0; i < n; i++) {   /* row k, column j */
            int64_t k0 = i / cols, j0 = i % cols, m = (k0 - 3) % 14;
            bool big = k0 >= 3 && (m == 0 || m == 7) && (m == 7 || k0 + 7 < rows);
            /* pairs of rows +B, -B (B = 2^60 (1 + j/64)) that cancel, between
               them values of 2^-10 .. 2^10 that an accumulator near B loses:
               which ones it loses depends on the order */
            g[i] = big ? (m == 0 ? 1.0f : -1.0f) * ldexpf(1.0f + (float)(j0 % 64) / 64.0f, 60)
                       : sinf((float)i * 0.37f + 0.1f) * ldexpf(1.0f, (int)((i * 7) % 21) - 10);
            y[i] = big ? 0.75f : 0.5f + 0.45f * cosf((float)i * 0.23f) * (i % 5 == 0 ? -1.0f : 1.0f);   /* some below 0 for ReLU */
        }
        dl_set_device(C, dl_cuda(0));
        tg = dl_from_array(C, DL_SHAPE(rows, cols), g);
        ty = dl_from_array(C, DL_SHAPE(rows, cols), y);
        /* dl_sum over the rows: the plain column sum */
        s = dl_sum(tg, DL_SHAPE(0), false);
        for (j = 0; j < cols; j++) {
            double acc = 0.0;
            for (k = 0; k < rows; k++) acc += (double)g[k * cols + j];
            db[j] = (float)acc;
        }
        ok = s && s->numel == cols && dl_read(s, dg, cols) == DL_OK;
        for (j = 0; ok && j < cols && bad < 0; j++)
            if (memcmp(&db[j], &dg[j], sizeof(float)) != 0) bad = j;
        CHECK(ok && bad < 0, "column sum (%lld, %lld) on cuda:0: the in-order double sum's bits (column %lld: %.9g, want %.9g): %s",
              (long long)rows, (long long)cols, (long long)bad, bad >= 0 ? (double)dg[bad] : 0.0,
              bad >= 0 ? (double)db[bad] : 0.0, dl_error_message(C));
        dl_set_device(C, dl_cpu());   /* the CPU's reduce: the same definition */
        s = dl_sum(dl_from_array(C, DL_SHAPE(rows, cols), g), DL_SHAPE(0), false);
        ok = s && s->numel == cols && dl_read(s, dg, cols) == DL_OK && memcmp(dg, db, sizeof(float) * (size_t)cols) == 0;
        CHECK(ok, "column sum (%lld, %lld) on cpu:0: the same bits", (long long)rows, (long long)cols);
        dl_set_device(C, dl_cuda(0));
        for (a = 0; a < 3; a++) {
            bool took;
            tgx = dl_zeros(C, DL_SHAPE(rows, cols));
            tdb = dl_zeros(C, DL_SHAPE(cols));
            took = tgx && tdb && DL__BE(tg)->bias_act_bwd(tg->dev_, (float *)tgx->data, (float *)tdb->data,
                                                          (const float *)tg->data, (const float *)ty->data, rows,
                                                          cols, acts[a]);
            for (i = 0; i < n; i++)
                gx[i] = acts[a] == DL__U_RELU      ? dl__cu_bin<DL__B_RELU_GRAD>(g[i], y[i])
                        : acts[a] == DL__U_SIGMOID ? dl__cu_bin<DL__B_SIGMOID_GRAD>(g[i], y[i])
                                                   : dl__cu_bin<DL__B_TANH_GRAD>(g[i], y[i]);
            for (j = 0; j < cols; j++) {
                double acc = 0.0;
                for (k = 0; k < rows; k++) acc += (double)gx[k * cols + j];
                db[j] = (float)acc;
            }
            if (cols < 2) {   /* (the entry declines one column: the reduce takes it) */
                CHECK(!took, "bias_act_bwd declines one column");
                continue;
            }
            ok = took && dl_read(tgx, got, n) == DL_OK && dl_read(tdb, dg, cols) == DL_OK &&
                 memcmp(got, gx, sizeof(float) * (size_t)n) == 0 && memcmp(dg, db, sizeof(float) * (size_t)cols) == 0;
            CHECK(ok, "bias_act_bwd (%lld, %lld) act %d on cuda:0: gx and the bias's sum, the definition's bits: %s",
                  (long long)rows, (long long)cols, acts[a], dl_error_message(C));
        }
        dl_step_end(C);
        free(g); free(y); free(gx); free(got); free(db); free(dg);
    }
    dl_set_device(C, dl_cpu());
}

/* The direct sums' shared-memory tiles (DL_CONV_DIRECT=1) against their
   per-element kernels (2), on one module and input, inside a capture: the
   output and x's gradient with the same bits (the same adds in the same
   order; the padding's products are zeros), the bias's too (the same
   kernel), the weight's close (its own order: chunks of samples, parts of
   the rows) and the same bits twice; and the tiles taken where they fit
   (forward; input gradient at stride 1; weight gradient with kernels at
   most 8 wide; in bands of rows where a whole sample does not), not
   where they do not. */

/* fwd (y * r) and dl_grad of sum in in[0..n-1] (x, w[, b]) four times on
   cuda:0: per element, tiles, tiles again, and tiles with an emulated
   device's threads and blocks last to first (the same bits: no thread
   leans on another's writes between barriers); the checks above, case c
   of what, `want` tile launches. Returns the tiles' launches in all. */
static size_t tile_modes(const char *what, int c, fused_fwd_fn fwd, void *u, int n, dl_tensor **in, size_t want)
{
    static const char *const names[4] = {"output", "x's gradient", "weight's gradient", "bias's gradient"};
    float *hv[4][5];
    int64_t cnt[5];
    size_t nops[4], t0, tl[4];
    int m, j;
    bool ok = true;
    for (m = 0; m < 4; m++) {   /* per element, tiles, tiles again (captured), tiles last to first */
        DL__CUI(C->cuda[0])->direct = m ? 1 : 2;
        dl__cu_emu_rev = m == 3;   /* (an emulated device's order: test_emulated_order) */
        t0 = dl__cu_ntiles;
        ok = fused_run(fwd, u, true, n, in, hv[m], cnt, &nops[m]) && ok;
        tl[m] = dl__cu_ntiles - t0;
    }
    dl__cu_emu_rev = false;
    DL__CUI(C->cuda[0])->direct = 1;
    for (j = 0; j <= n; j++) {
        CHECK(ok && memcmp(hv[1][j], hv[2][j], sizeof(float) * (size_t)cnt[j]) == 0,
              "%s case %d: the %s twice, other bits", what, c, names[j]);
        CHECK(ok && memcmp(hv[1][j], hv[3][j], sizeof(float) * (size_t)cnt[j]) == 0,
              "%s case %d: the %s, threads and blocks last to first: other bits", what, c, names[j]);
        if (j == 2 && ok) {   /* the weight's gradient: its own order */
            double mx = 0.0, scale = 0.0;
            int64_t e;
            for (e = 0; e < cnt[j]; e++) {
                double dv = fabs((double)hv[0][j][e] - hv[1][j][e]);
                if (dv > mx) mx = dv;
                if (fabs(hv[0][j][e]) > scale) scale = fabs(hv[0][j][e]);
            }
            CHECK(mx <= 1e-5 * (scale + 1.0), "%s case %d: the weight's gradient off by %g (scale %g)", what, c, mx,
                  scale);
        } else {
            CHECK(ok && memcmp(hv[0][j], hv[1][j], sizeof(float) * (size_t)cnt[j]) == 0,
                  "%s case %d: the %s: other bits than the per-element kernels'", what, c, names[j]);
        }
    }
    CHECK(ok && tl[0] == 0 && tl[1] == want && tl[2] == want, "%s case %d: %zu, %zu tile launches (%zu wanted)", what,
          c, tl[1], tl[2], want);
    for (m = 0; m < 4; m++)
        for (j = 0; j <= n; j++) free(hv[m][j]);
    return tl[1];
}

typedef struct { dl_module *seq; dl_tensor *x, *r; } tile_case;
static dl_tensor *tile_fwd(void *u, bool fused)
{
    tile_case *k = (tile_case *)u;
    (void)fused;
    return dl_mul(dl_module_forward(k->seq, k->x), k->r);
}
static void test_conv_tiles(void)
{
    /* N, C_in, C_out, H, W (H 0: 1-d), kernel, stride, pad, dilation, groups, bias, act (-1 none, 0 relu,
       1 sigmoid, 2 tanh), 2x2 average pool, tiles taken (forward, x's gradient, w's gradient) */
    static const int cs[][16] = {
        {8, 1, 6, 28, 28, 5, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1},    /* d2l's LeNet */
        {8, 6, 16, 14, 14, 5, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1},
        {8, 1, 6, 28, 28, 5, 1, 0, 1, 1, 1, -1, 0, 1, 1, 1},  /* LeNet-BN's first */
        {3, 4, 6, 9, 9, 3, 2, 1, 1, 2, 1, 0, 0, 1, 0, 1},     /* stride 2, groups */
        {2, 3, 4, 12, 12, 3, 1, 2, 2, 1, 0, 2, 1, 1, 1, 1},   /* dilation, no bias, pooled */
        {4, 3, 8, 9, 9, 3, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1},     /* 9x9: the pool not fused */
        {2, 2, 5, 5, 7, 3, 1, 1, 1, 1, 1, 2, 0, 1, 1, 1},     /* 5 channels, 5x7 */
        {3, 2, 3, 0, 50, 5, 1, 2, 1, 1, 1, 0, 0, 1, 1, 1},    /* 1-d */
        {2, 1, 3, 20, 20, 9, 1, 4, 1, 1, 1, -1, 0, 1, 1, 0},  /* 9 wide: the weight's per element */
        {2, 1, 4, 120, 120, 3, 1, 1, 1, 1, 1, -1, 0, 1, 1, 1}, /* bands of rows */
        {300, 1, 2, 8, 8, 3, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1},   /* 300 samples: chunks of 2 */
        {2, 4, 4, 10, 10, 3, 1, 1, 1, 4, 1, 1, 0, 1, 1, 1},   /* depthwise */
        {4, 1, 16, 28, 28, 3, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1},  /* a grayscale stem: the weight's 2 x 8 channels */
        {2, 3, 16, 32, 32, 3, 1, 1, 1, 1, 1, -1, 0, 1, 1, 1}, /* a CIFAR stem: the weight's 6, 6 and 4 */
        {2, 3, 4, 64, 64, 5, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1},   /* bands, pooled */
        {2, 3, 6, 80, 80, 3, 2, 1, 1, 1, 1, 0, 0, 1, 0, 1},   /* bands, stride 2 */
        {2, 2, 5, 70, 90, 3, 1, 2, 2, 1, 0, 2, 0, 1, 1, 1},   /* bands, dilation 2, no bias */
        {2, 1, 2, 0, 20000, 3, 1, 1, 1, 1, 1, -1, 0, 0, 0, 0}, /* 1-d, 20,000 long: over the shared memory */
    };
    const int nc = (int)(sizeof cs / sizeof cs[0]);
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < nc; c++) {
        const int *k = cs[c];
        dl_conv_desc cd = dl_conv_desc_make(k[6], k[7], k[8], k[9]);
        dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
        dl_module *mods[3];
        const dl_named_tensor *ps;
        dl_tensor *in[3], *y;
        tile_case u;
        int np, nm = 0;
        bool oned = k[3] == 0;
        size_t n;
        mods[nm++] = oned ? dl_nn_conv1d(C, k[1], k[2], k[5], &cd, k[10] != 0)
                          : dl_nn_conv2d(C, k[1], k[2], k[5], &cd, k[10] != 0);
        if (k[11] >= 0) mods[nm++] = k[11] == 0 ? dl_nn_relu(C) : k[11] == 1 ? dl_nn_sigmoid(C) : dl_nn_tanh(C);
        if (k[12]) mods[nm++] = dl_nn_avg_pool2d(C, &pd);
        u.seq = dl_nn_sequential(C, nm, mods);
        u.x = dl_keep(dl_requires_grad(oned ? dl_randn(C, DL_SHAPE(k[0], k[1], k[4]))
                                            : dl_randn(C, DL_SHAPE(k[0], k[1], k[3], k[4])), true));
        y = dl_module_forward(u.seq, u.x);
        u.r = y ? dl_keep(dl_randn(C, dl_shape_make(y->ndim, y->shape))) : NULL;
        np = dl_module_named_parameters(mods[0], &ps);
        in[0] = u.x; in[1] = ps[0].t; in[2] = np > 1 ? ps[1].t : NULL;
        /* the tile launches: forward, x's gradient, w's gradient (+ its sum where there are chunks) */
        n = u.r ? tile_modes("conv tiles", c, tile_fwd, &u, np + 1, in,
                             (size_t)(k[13] + k[14]) + (k[15] ? (k[0] > 1 ? 2 : 1) : 0)) : 0;
        CHECK(u.r != NULL, "conv tiles case %d: %s", c, dl_error_message(C));
        if (!g_quiet) printf("cuda:0 conv tiles case %-2d          %zu tile launches: output, x's gradient same bits\n", c, n);
        dl_free(u.x);
        dl_free(u.r);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
}

/* The tiles through dl_conv2d and dl_conv_transpose2d with what a module
   does not set: per-dim strides, dilations and padding, padding='same'
   with an even kernel (the extra padding on the right), a 4x2 kernel,
   groups, conv_transpose's forward (the input gradient's kernel) and its
   output_padding: mode 1 against mode 2 as above, and the tile launches. */
typedef struct { dl_tensor *x, *w, *b, *r; dl_conv_desc cd; bool T; } tile_fn_case;
static dl_tensor *tile_fn_fwd(void *u, bool fused)
{
    tile_fn_case *k = (tile_fn_case *)u;
    (void)fused;
    return dl_mul(k->T ? dl_conv_transpose2d(k->x, k->w, k->b, &k->cd) : dl_conv2d(k->x, k->w, k->b, &k->cd), k->r);
}
static void test_conv_tiles_fn(void)
{
    /* x (N, C, H, W), w (4 sizes), transposed, stride (2), padding (2), dilation (2), groups, same,
       output_padding (2), tile launches */
    static const int cs[][20] = {
        {3, 2, 7, 9, 5, 2, 4, 2, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 4},
        {2, 3, 11, 10, 4, 3, 3, 3, 0, 2, 1, 1, 3, 1, 2, 1, 0, 0, 0, 3},
        {2, 4, 6, 5, 4, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 2, 0, 0, 0, 4},
        {2, 3, 5, 5, 3, 2, 3, 3, 1, 2, 2, 0, 0, 1, 1, 1, 0, 1, 1, 3},
    };
    const int nc = (int)(sizeof cs / sizeof cs[0]);
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < nc; c++) {
        const int *k = cs[c];
        tile_fn_case u;
        dl_tensor *in[3], *y;
        int d;
        memset(&u.cd, 0, sizeof u.cd);
        for (d = 0; d < 2; d++) {
            u.cd.stride[d] = k[9 + d];
            u.cd.padding[d] = k[11 + d];
            u.cd.dilation[d] = k[13 + d];
            u.cd.output_padding[d] = k[17 + d];
        }
        u.cd.groups = k[15];
        u.cd.padding_same = k[16] != 0;
        u.T = k[8] != 0;
        u.x = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(k[0], k[1], k[2], k[3])), true));
        u.w = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(k[4], k[5], k[6], k[7])), true));
        u.b = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(u.T ? k[5] * k[15] : k[4])), true));
        y = u.T ? dl_conv_transpose2d(u.x, u.w, u.b, &u.cd) : dl_conv2d(u.x, u.w, u.b, &u.cd);
        u.r = y ? dl_keep(dl_randn(C, dl_shape_make(y->ndim, y->shape))) : NULL;
        CHECK(u.r != NULL, "conv tiles fn case %d: %s", c, dl_error_message(C));
        in[0] = u.x; in[1] = u.w; in[2] = u.b;
        if (u.r) tile_modes("conv tiles fn", c, tile_fn_fwd, &u, 3, in, (size_t)k[19]);
        dl_free(u.x);
        dl_free(u.w);
        dl_free(u.b);
        dl_free(u.r);
        dl_step_end(C);
    }
    if (!g_quiet) printf("cuda:0 %-30s %d cases: per-dim, same, 4x2, transposed\n", "conv tiles (functional)", nc);
    dl_set_device(C, dl_cpu());
}

typedef struct { dl_module *conv, *seq, *pool; dl_tensor *x; int act; } conv_act_case;
static dl_tensor *conv_act_fwd(void *u, bool fused)
{
    conv_act_case *k = (conv_act_case *)u;
    dl_tensor *y;
    if (fused) return dl_module_forward(k->seq, k->x);
    y = dl_module_forward(k->conv, k->x);
    y = k->act == 0 ? dl_relu(y) : k->act == 1 ? dl_sigmoid(y) : dl_tanh(y);
    return k->pool ? dl_module_forward(k->pool, y) : y;
}

/* Sequential's small convolution then its activation (the direct sums):
   the activation in the conv's launch, its backward in the bias sum's
   first pass, so two launches fewer than the conv then the activation
   (forward and dl_grad of x, weight and bias), the same bits; one fewer
   without a bias (the backward's own pass stays); none where the direct
   path declines (16 -> 16 channels: the two ops). With a 2x2 average
   pool after (d2l's LeNet): the pool in the conv's launch too and its
   adjoint in the bias sum's pass, four fewer than the three ops; two
   without a bias (the adjoint and the activation's backward stay) or with
   an odd output (9x9: the pool is not fused, the conv and activation
   are); none for 16 -> 16 channels. */
static void test_conv_act(void)
{
    static const int64_t cs[9][7] = {   /* N, C_in, C_out, H (= W), bias, pool, launches fewer */
        {8, 1, 6, 28, 1, 0, 2}, {5, 6, 16, 14, 1, 0, 2}, {4, 3, 8, 9, 0, 0, 1}, {2, 16, 16, 6, 1, 0, 0},
        {8, 1, 6, 28, 1, 1, 4}, {5, 6, 16, 14, 1, 1, 4}, {4, 3, 8, 10, 0, 1, 2}, {2, 16, 16, 6, 1, 1, 0},
        {4, 3, 8, 9, 1, 1, 2}};
    static const char *const names[5] = {"output", "x's gradient", "weight's gradient", "bias's gradient", "-"};
    int c;
    dl_set_device(C, dl_cuda(0));
    for (c = 0; c < 9; c++) {
        dl_conv_desc cd = dl_conv_desc_make(1, c % 4 == 0 ? 2 : 1, 1, 1);
        dl_pool_desc pd = dl_pool_desc_make(2, 0, 0, false, true);
        dl_module *mods[3];
        const dl_named_tensor *ps;
        dl_tensor *in[3];
        conv_act_case u;
        int np;
        u.x = dl_keep(dl_requires_grad(dl_randn(C, DL_SHAPE(cs[c][0], cs[c][1], cs[c][3], cs[c][3])), true));
        u.act = c % 3;
        mods[0] = u.conv = dl_nn_conv2d(C, cs[c][1], cs[c][2], c % 4 == 0 ? 5 : 3, &cd, cs[c][4] != 0);
        mods[1] = u.act == 0 ? dl_nn_relu(C) : u.act == 1 ? dl_nn_sigmoid(C) : dl_nn_tanh(C);
        mods[2] = u.pool = cs[c][5] ? dl_nn_avg_pool2d(C, &pd) : NULL;
        u.seq = dl_nn_sequential(C, cs[c][5] ? 3 : 2, mods);
        np = dl_module_named_parameters(u.conv, &ps);
        in[0] = u.x; in[1] = ps[0].t; in[2] = np > 1 ? ps[1].t : NULL;
        fused_check(cs[c][5] ? "conv+act+avgpool" : "conv+act", c, conv_act_fwd, &u, np + 1, in, names,
                    (size_t)cs[c][6]);
        dl_free(u.x);
        dl_step_end(C);
    }
    dl_set_device(C, dl_cpu());
    {   /* the module on cpu:0, x on cuda:0: dl_conv2d's own refusal, no launch */
        dl_conv_desc cd = dl_conv_desc_make(1, 0, 1, 1);
        dl_module *mods[2];
        dl_tensor *y;
        mods[0] = dl_nn_conv2d(C, 1, 2, 3, &cd, true);
        mods[1] = dl_nn_sigmoid(C);
        y = dl_module_forward(dl_nn_sequential(C, 2, mods), dl_to(dl_randn(C, DL_SHAPE(2, 1, 5, 5)), dl_cuda(0)));
        CHECK(!y && dl_last_error(C) == DL_ERR_DEVICE &&
              strstr(dl_error_message(C), "dl_conv2d: x (2,1,5,5) is on cuda:0 but w (2,1,3,3) is on cpu:0"),
              "conv+act across devices: %s", dl_error_message(C));
        dl_clear_error(C);
        dl_step_end(C);
    }
}

static void test_multi_tensor(void)
{
    static float a[40000], b[40000], c[40000];
    static const char *names[] = {"SGD", "SGD momentum nesterov wd", "SGD maximize dampening", "Adam",
                                  "Adam amsgrad wd", "AdamW", "Adam maximize"};
    int cfg;
    for (cfg = 0; cfg < 7; cfg++) {
        dl_sgd_desc sd;
        dl_adam_desc ad;
        int kind = cfg < 3 ? 0 : cfg == 5 ? 2 : 1;
        size_t na = 0, nb = 0, nc = 0;
        bool ok;
        memset(&sd, 0, sizeof sd);
        memset(&ad, 0, sizeof ad);
        sd.lr = 0.05f;
        if (cfg == 1) { sd.momentum = 0.9f; sd.nesterov = true; sd.weight_decay = 1e-2f; }
        if (cfg == 2) { sd.momentum = 0.5f; sd.dampening = 0.25f; sd.maximize = true; }
        if (cfg == 4) { ad.amsgrad = true; ad.weight_decay = 0.1f; }
        if (cfg == 6) ad.maximize = true;
        ok = mt_run(dl_cpu(), kind, &sd, &ad, a, 40000, &na);
        ok = mt_run(dl_cuda(0), kind, &sd, &ad, b, 40000, &nb) && ok;
        dl__mt_off = true;   /* cuda:0's per-tensor kernels */
        ok = mt_run(dl_cuda(0), kind, &sd, &ad, c, 40000, &nc) && ok;
        dl__mt_off = false;
        CHECK(ok && na == nb && na == nc && na > 0, "%s: multi-tensor runs: %s", names[cfg], dl_error_message(C));
        CHECK(ok && memcmp(b, c, sizeof(float) * nb) == 0, "%s: cuda:0 multi-tensor = per-tensor, bit for bit", names[cfg]);
        CHECK(ok && memcmp(a, b, sizeof(float) * na) == 0, "%s: cuda:0 multi-tensor = cpu:0, bit for bit", names[cfg]);
        if (!g_quiet)
            printf("cuda:0 %-30s multi-tensor: %s per-tensor, %s cpu:0\n", names[cfg],
                   ok && memcmp(b, c, sizeof(float) * nb) == 0 ? "=" : "!=",
                   ok && memcmp(a, b, sizeof(float) * na) == 0 ? "=" : "!=");
    }
    /* an optimizer step in one launch, a zero_grad in none inside a capture (counted in a
       capture's list on an emulated device, where each launch is one entry) */
    if (dl__cu_emu_count() > 0) {
        dl_module *m;
        dl_optim *o;
        dl_capture *cap;
        dl__cucap *cc;
        size_t n0, n1, n2;
        dl_tensor *x, *l;
        dl_set_device(C, dl_cuda(0));
        dl_module *layers[3];
        layers[0] = dl_nn_linear(C, 8, 16, true);
        layers[1] = dl_nn_relu(C);
        layers[2] = dl_nn_linear(C, 16, 4, true);
        m = dl_nn_sequential(C, 3, layers);
        o = dl_adam(m, NULL);
        x = dl_keep(dl_ones(C, DL_SHAPE(2, 8)));
        l = dl_sum(dl_module_forward(m, x), DL_ALL, false);
        CHECK(l && dl_backward(l) == DL_OK && dl_optim_step(o) == DL_OK, "one launch: warm-up");
        dl_module_zero_grad(m);
        dl_step_end(C);
        cap = dl_capture_begin(C);
        cc = DL__CUI(C->cuda[0])->cap;
        n0 = cc ? cc->nops : 0;
        dl_module_zero_grad(m);
        n1 = cc ? cc->nops : 0;
        l = dl_sum(dl_module_forward(m, x), DL_ALL, false);
        dl_backward(l);
        n2 = cc ? cc->nops : 0;
        dl_optim_step(o);
        CHECK(cc && n1 == n0, "dl_module_zero_grad of 4 gradients inside a capture: %zu launches (none: the "
              "backward's sums write them)", n1 - n0);
        CHECK(cc && cc->nops - n2 == 1, "dl_optim_step of 4 parameters: %zu launches", cc ? cc->nops - n2 : 0);
        CHECK(dl_capture_end(cap) == DL_OK, "one launch: capture: %s", dl_error_message(C));
        dl_capture_free(cap);
        dl_step_end(C);
        dl_set_device(C, dl_cpu());
    }
}

/* ------------------------------------------------------------------ memory */

static void test_memory(void)
{
    dl_memory_stats a, b;
    dl_tensor *w1, *w2;
    uint64_t raw0 = 0, raw1 = 0;
    int i;
    dl_set_device(C, dl_cuda(0));
    w1 = dl_param(dl_mul_scalar(dl_randn(C, DL_SHAPE(784, 64)), 0.05f));
    w2 = dl_param(dl_mul_scalar(dl_randn(C, DL_SHAPE(64, 10)), 0.1f));
    for (i = 0; i < 1000; i++) {
        dl_tensor *x = dl_rand(C, DL_SHAPE(32, 784));
        dl_tensor *l = dl_mean(dl_softmax(dl_matmul(dl_relu(dl_matmul(x, w1)), w2), 1), DL_ALL, false);
        if (!l || dl_backward(l) != DL_OK) { CHECK(0, "loop: %s", dl_error_message(C)); break; }
        dl_sgd_update(w1, 0.01f);
        dl_sgd_update(w2, 0.01f);
        dl_step_end(C);
        if (i == 0) {
            dl_memory_stats_get(C, dl_cuda(0), &a);
            raw0 = DL__CUI(C->cuda[0])->raw_allocs;
        }
    }
    dl_memory_stats_get(C, dl_cuda(0), &b);
    raw1 = DL__CUI(C->cuda[0])->raw_allocs;
    CHECK(b.alloc_calls == a.alloc_calls, "cuda:0: dl.h's allocator called %llu times after step 1 over 1000 steps",
          (unsigned long long)(b.alloc_calls - a.alloc_calls));
    CHECK(raw1 == raw0, "cuda:0: cudaMalloc called %llu times after step 1 over 1000 steps",
          (unsigned long long)(raw1 - raw0));
    CHECK(b.step_reserved == a.step_reserved && b.step_reserved > 0, "cuda:0 step memory flat");
    if (!g_quiet) printf("cuda:0 %-30s %llu dl.h allocations, %llu cudaMalloc after step 1 (1000 steps)\n",
                         "steady loop", (unsigned long long)(b.alloc_calls - a.alloc_calls),
                         (unsigned long long)(raw1 - raw0));
    dl_free(w1);
    dl_free(w2);
    dl_set_device(C, dl_cpu());
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the records of an events file: count (status REC_END checked) */
static int events(const char *path, unsigned char **buf, rec *r, int max)
{
    size_t n;
    int st, nr;
    *buf = slurp(path, &n);
    nr = *buf ? read_records(*buf, n, r, max, &st) : -1;
    return nr >= 0 && st == REC_END ? nr : -1;
}

/* 8. dl_summary_scalar_tensor on a GPU: the losses of 300 steps are copied
   on the device and queued, no read of the device until 512 scalars are
   queued (the host ones after them queue too), then one read writes them
   all in call order with their calls' wall times; a value is the one at
   the call (the tensor overwritten later, its step memory reused); a
   histogram, a flush, close, dl_ctx_free and another GPU's value write the
   queue first; inside a capture the queue is kept and the write refused. */
static void test_summary_queue(void)
{
    dl_ctx *ctx = exact_ctx(), *c2;
    dl_summary_writer *w, *w2;
    dl_tensor *x, *h;
    dl_capture *cap;
    char path[512];
    unsigned char *buf = NULL;
    static rec r[700];
    size_t r0, r1;
    int nr, i, ok;
    int64_t step;
    pbf tag;
    float v;
    double wall, t0, t1, last;
    dl_set_device(ctx, dl_cuda(0));
    w = dl_summary_open(ctx, "build/test_cuda_tb");
    CHECK(w != NULL, "summary queue: open: %s", dl_error_message(ctx));
    if (!w) { dl_ctx_free(ctx); return; }
    snprintf(path, sizeof path, "%s", dl_summary_path(w));
    t0 = wall_now();
    r0 = dl__cu_nreads;
    for (i = 0; i < 300; i++) {
        dl_tensor *loss = dl_mean(dl_full(ctx, DL_SHAPE(4), 0.5f * (float)i + 0.25f), DL_ALL, false);
        if (dl_summary_scalar_tensor(w, "train/loss", i, loss) != DL_OK ||
            dl_summary_scalar(w, "train/lr", i, 1.0 / (i + 1)) != DL_OK) break;
        dl_step_end(ctx);
    }
    r1 = dl__cu_nreads;
    CHECK(i == 300 && r1 - r0 == 1, "summary queue: 300 steps' losses and lrs, %zu reads of the device (1: at 512 queued)",
          r1 - r0);
    nr = events(path, &buf, r, 700);
    CHECK(nr == 513, "summary queue: 512 records written by that read (%d in the file)", nr);
    free(buf);
    x = dl_keep(dl_full(ctx, DL_SHAPE(1), 7.0f));
    CHECK(dl_summary_scalar_tensor(w, "kept", 300, x) == DL_OK && dl_fill_(x, 9.0f) == DL_OK, "summary queue: kept");
    cap = dl_capture_begin(ctx);
    h = dl_full(ctx, DL_SHAPE(3), 1.0f);
    CHECK(dl_summary_histogram(w, "h", 301, h) == DL_ERR_UNSUPPORTED, "summary queue: a histogram inside a capture");
    EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "dl_summary_histogram: a histogram of t (a read to the host) inside a "
               "capture");
    dl_capture_end(cap);
    dl_capture_free(cap);
    h = dl_keep(dl_full(ctx, DL_SHAPE(3), 1.0f));
    r0 = dl__cu_nreads;
    CHECK(dl_summary_histogram(w, "h", 301, h) == DL_OK, "summary queue: histogram: %s", dl_error_message(ctx));
    CHECK(dl_summary_close(w) == DL_OK, "summary queue: close");
    t1 = wall_now();
    CHECK(dl__cu_nreads - r0 == 2, "summary queue: the histogram wrote the queue first (%zu reads: the queue's, "
          "the histogram's)", dl__cu_nreads - r0);
    nr = events(path, &buf, r, 700);
    ok = nr == 1 + 600 + 1 + 1;
    last = t0;
    for (i = 0; ok && i < 600; i++) {
        ok = pb_scalar(&r[1 + i], &step, &tag, &v, &wall) && step == i / 2 && wall >= last && wall <= t1;
        last = wall;
        if (ok && i % 2 == 0) ok = pb_streq(&tag, "train/loss") && v == 0.5f * (float)(i / 2) + 0.25f;
        if (ok && i % 2 == 1) ok = pb_streq(&tag, "train/lr") && v == (float)(1.0 / (i / 2 + 1));
    }
    CHECK(ok, "summary queue: 600 scalars in call order, values, steps, wall times (record %d of %d)", i, nr);
    CHECK(nr == 603 && pb_scalar(&r[601], &step, &tag, &v, &wall) && pb_streq(&tag, "kept") && v == 7.0f,
          "summary queue: the value at the call (7; the tensor is 9 now)");
    CHECK(nr == 603 && !pb_scalar(&r[602], &step, &tag, &v, &wall), "summary queue: the histogram last");
    free(buf);
    dl_free(x);
    dl_free(h);
    /* another GPU's value, then dl_ctx_free */
    if (dl_device_count(ctx, DL_DEVICE_CUDA) >= 2) {
        w2 = dl_summary_open(ctx, "build/test_cuda_tb");
        snprintf(path, sizeof path, "%s", w2 ? dl_summary_path(w2) : "");
        r0 = dl__cu_nreads;
        dl_summary_scalar_tensor(w2, "a", 1, dl_to(dl_full(ctx, DL_SHAPE(1), 1.5f), dl_cuda(0)));
        dl_summary_scalar_tensor(w2, "a", 2, dl_to(dl_full(ctx, DL_SHAPE(1), 2.5f), dl_cuda(1)));
        CHECK(dl__cu_nreads - r0 == 1, "summary queue: a value on cuda:1 writes cuda:0's queue (%zu reads)",
              dl__cu_nreads - r0);
        dl_summary_close(w2);
        nr = events(path, &buf, r, 8);
        CHECK(nr == 3 && pb_scalar(&r[1], &step, &tag, &v, &wall) && v == 1.5f && pb_scalar(&r[2], &step, &tag, &v, &wall) &&
              v == 2.5f, "summary queue: cuda:0's then cuda:1's value");
        free(buf);
    }
    dl_ctx_free(ctx);
    c2 = exact_ctx();
    dl_set_device(c2, dl_cuda(0));
    w2 = dl_summary_open(c2, "build/test_cuda_tb");
    snprintf(path, sizeof path, "%s", w2 ? dl_summary_path(w2) : "");
    for (i = 0; i < 3; i++) dl_summary_scalar_tensor(w2, "b", i, dl_full(c2, DL_SHAPE(1), (float)i));
    dl_ctx_free(c2);
    nr = events(path, &buf, r, 8);
    CHECK(nr == 4 && pb_scalar(&r[3], &step, &tag, &v, &wall) && step == 2 && v == 2.0f,
          "summary queue: dl_ctx_free wrote the queue (%d records)", nr);
    free(buf);
}

/* the groups after the op matrix, in the order they run (--only picks some) */
static const struct { const char *name; void (*fn)(void); } g_groups[] = {
    {"random", test_random}, {"divider", test_divider}, {"determinism", test_determinism},
    {"emulated_order", test_emulated_order}, {"tf32", test_tf32}, {"errors", test_errors},
    {"transfers", test_transfers}, {"lenet", test_lenet}, {"multi_tensor", test_multi_tensor},
    {"grad_accum", test_grad_accum}, {"fused_ce", test_fused_ce}, {"ce_seed", test_ce_seed},
    {"chan_sum", test_chan_sum}, {"bn_add_relu", test_bn_add_relu}, {"bn_relu_pool", test_bn_relu_pool},
    {"bn_eval", test_bn_eval}, {"linear_act", test_linear_act}, {"ce_bias", test_ce_bias}, {"conv_ce", test_conv_ce},
    {"bn_bias", test_bn_bias}, {"conv_bn_bias", test_conv_bn_bias},
    {"colsum", test_colsum},
    {"conv_act", test_conv_act}, {"conv_tiles", test_conv_tiles}, {"conv_tiles_fn", test_conv_tiles_fn},
    {"memory", test_memory}, {"summary_queue", test_summary_queue}};

/* name is one of the comma-separated list (NULL: every group) */
static bool picked(const char *list, const char *name)
{
    size_t n = strlen(name);
    const char *p = list;
    if (!list) return true;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == n && strncmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static int usage(void)
{
    int i;
    printf("usage: test_cuda [--emulate] [-q] [--isolate | --no-isolate] [--only GROUP[,GROUP...]]\n"
           "  --only: these groups and not the op matrix (for compute-sanitizer); groups:");
    for (i = 0; i < (int)(sizeof g_groups / sizeof g_groups[0]); i++) printf(" %s", g_groups[i].name);
    printf("\n");
    return 2;
}

int main(int argc, char **argv)
{
    int i, n, isolate = -1;
    bool isolated = false;
    const char *emu, *only = NULL;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--emulate") == 0) setenv("DL_CUDA_EMULATE", "2", 1);
        else if (strcmp(argv[i], "-q") == 0) g_quiet = 1;
        else if (strcmp(argv[i], "--isolate") == 0) isolate = 1;
        else if (strcmp(argv[i], "--no-isolate") == 0) isolate = 0;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
        else return usage();
    }
    if (only) {   /* every name a group's: a misspelt one would test nothing and pass */
        const char *p = only;
        while (*p) {
            const char *e = strchr(p, ',');
            size_t k = e ? (size_t)(e - p) : strlen(p);
            bool known = false;
            for (i = 0; i < (int)(sizeof g_groups / sizeof g_groups[0]); i++)
                if (strlen(g_groups[i].name) == k && strncmp(p, g_groups[i].name, k) == 0) known = true;
            if (!known) {
                printf("test_cuda: --only '%.*s': no such group\n", (int)k, p);
                return usage();
            }
            if (!e) break;
            p = e + 1;
        }
        if (isolate < 0) isolate = 0;   /* (isolation is the op matrix's) */
    }
    conv_cases();
    emu = getenv("DL_CUDA_EMULATE");
    if (isolate < 0) isolate = !(emu && *emu && strcmp(emu, "0") != 0);   /* a real GPU: isolate */
    if (isolate) {
        if (!test_op_matrix_isolated()) {
            printf("test_cuda: no CUDA device; nothing to test here (try --emulate)\n");
            SKIP("no CUDA device");
            TEST_END();
        }
        isolated = true;
    }
    C = exact_ctx();
    CHECK(C != NULL, "context: %s", dl_error_message(NULL));
    if (!C) TEST_END();
    n = dl_device_count(C, DL_DEVICE_CUDA);
    if (n == 0) {
        dl_tensor *t = dl_to(dl_zeros(C, DL_SHAPE(1)), dl_cuda(0));
        CHECK(t == NULL && dl_last_error(C) == DL_ERR_DEVICE, "dl_cuda(0) without a GPU is an error");
        printf("test_cuda: no CUDA device (%s); nothing else to test here (try --emulate)\n", dl_error_message(C));
        SKIP("no CUDA device");
        dl_ctx_free(C);
        TEST_END();
    }
    printf("test_cuda: %d CUDA device%s%s\n", n, n == 1 ? "" : "s",
           dl__cu_emu_count() > 0 ? " (emulated: DL_CUDA_EMULATE, host memory and host loops)" : "");
    if (dl__cu_emu_count() == 0) {   /* for the log of a first GPU run */
        struct cudaDeviceProp pr;
        int drv = 0, rt = 0;
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        if (cudaGetDeviceProperties(&pr, 0) == cudaSuccess)
            printf("test_cuda: cuda:0 is %s, sm_%d%d, %d SMs, %.1f GiB; driver %d, runtime %d\n", pr.name,
                   pr.major, pr.minor, pr.multiProcessorCount, (double)pr.totalGlobalMem / 1073741824.0, drv, rt);
    }
    if (!isolated && !only) test_op_matrix();
    for (i = 0; i < (int)(sizeof g_groups / sizeof g_groups[0]); i++)
        if (picked(only, g_groups[i].name)) g_groups[i].fn();
    dl_ctx_free(C);
    TEST_END();
}
#endif
