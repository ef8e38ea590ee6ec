/* bench/gemm.c - dl.h's own SGEMM (dl__sgemm) against OpenBLAS (cblas_sgemm)
   on the shapes the models use, at 1 and 2 threads.

   Build:  cc -O3 -march=native -I. bench/gemm.c -o build/bench_gemm -lopenblas -lm -lpthread
   Run:    build/bench_gemm [--quick] [--threads 1|2] [--reps N] [case-or-group ...]

   Prints one line per case and thread count:
       gemm M N K threads dl_gflops openblas_gflops ratio  # case ta tb
   (median over >= 7 timed repetitions after a warm-up; dl and OpenBLAS runs
   interleaved, with a pause before dl's runs that follow OpenBLAS's at 2
   threads, see settle_after_openblas; ratio = dl / openblas), then
       fma_peak_gflops X
       gemm_peak_fraction n=1024 Y
   (one thread, register-only FMA loop timed in thread CPU time, best of 7;
   Y = dl's median GFLOP/s at 1024^3 on one thread / X).
   Groups: square lenet linear resnet mlp16 (a case name or group name selects). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <time.h>
#define DL_IMPLEMENTATION
#include "dl.h"
#include <cblas.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

typedef struct bcase {
    const char *name, *group;
    int ta, tb;
    int64_t M, N, K;
} bcase;

static const bcase g_cases[] = {
    {"sq64", "square", 0, 0, 64, 64, 64},
    {"sq128", "square", 0, 0, 128, 128, 128},
    {"sq256", "square", 0, 0, 256, 256, 256},
    {"sq512", "square", 0, 0, 512, 512, 512},
    {"sq1024", "square", 0, 0, 1024, 1024, 1024},
    {"sq2048", "square", 0, 0, 2048, 2048, 2048},
    /* LeNet (batch 256): conv as W (Cout, Cin*25) @ col (Cin*25, cnt*L) */
    {"conv1_fwd", "lenet", 0, 0, 6, 50176, 25},
    {"conv1_fwd_big", "lenet", 0, 0, 6, 67424, 25},
    {"conv2_fwd", "lenet", 0, 0, 16, 12600, 150},
    {"conv1_wgrad", "lenet", 0, 1, 6, 25, 50176},
    {"conv2_wgrad", "lenet", 0, 1, 16, 150, 12600},
    {"conv2_igrad", "lenet", 1, 0, 150, 12600, 16},
    /* Linear layers at batch 256: y = x W^T, dx = dy W, dW = dy^T x */
    {"fc784_fwd", "linear", 0, 1, 256, 256, 784},
    {"fc400_fwd", "linear", 0, 1, 256, 120, 400},
    {"fc120_fwd", "linear", 0, 1, 256, 84, 120},
    {"fc84_fwd", "linear", 0, 1, 256, 10, 84},
    {"fc784_dx", "linear", 0, 0, 256, 784, 256},
    {"fc400_dx", "linear", 0, 0, 256, 400, 120},
    {"fc120_dx", "linear", 0, 0, 256, 120, 84},
    {"fc84_dx", "linear", 0, 0, 256, 84, 10},
    {"fc784_dw", "linear", 1, 0, 256, 784, 256},
    {"fc400_dw", "linear", 1, 0, 120, 400, 256},
    {"fc120_dw", "linear", 1, 0, 84, 120, 256},
    {"fc84_dw", "linear", 1, 0, 10, 84, 256},
    /* small ResNet (28x28 input, widths 16-32-64-128, 3x3 convs) */
    {"rs_stem_fwd", "resnet", 0, 0, 16, 83888, 9},
    {"rs16_fwd", "resnet", 0, 0, 16, 12544, 144},
    {"rs32_fwd", "resnet", 0, 0, 32, 6272, 288},
    {"rs64_fwd", "resnet", 0, 0, 64, 3136, 576},
    {"rs128_fwd", "resnet", 0, 0, 128, 1568, 1152},
    {"rs16_wgrad", "resnet", 0, 1, 16, 144, 12544},
    {"rs64_wgrad", "resnet", 0, 1, 64, 576, 3136},
    {"rs128_wgrad", "resnet", 0, 1, 128, 1152, 1568},
    {"rs16_igrad", "resnet", 1, 0, 144, 12544, 16},
    {"rs64_igrad", "resnet", 1, 0, 576, 3136, 64},
    {"rs128_igrad", "resnet", 1, 0, 1152, 1568, 128},
    /* the MLP's Linear layers at batch 16 (step_mlp16) */
    {"fc784_fwd16", "mlp16", 0, 1, 16, 256, 784},
    {"fc256_fwd16", "mlp16", 0, 1, 16, 10, 256},
    {"fc256_dx16", "mlp16", 0, 0, 16, 256, 10},
    {"fc784_dw16", "mlp16", 1, 0, 256, 784, 16},
    {"fc256_dw16", "mlp16", 1, 0, 10, 256, 16},
};
#define NCASES ((int)(sizeof(g_cases) / sizeof(g_cases[0])))

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of this thread: the peak loop is not charged for time the
   (shared) machine gives to others */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct bctx {
    const bcase *c;
    const float *A, *B;
    float *C;
    int64_t lda, ldb, ldc;
    dl__pool *pool;
} bctx;

static void run_dl(const bctx *b)
{
    const bcase *c = b->c;
    dl__sgemm(b->pool, c->ta != 0, c->tb != 0, c->M, c->N, c->K, 1.0f, b->A, b->lda, b->B, b->ldb, 0.0f, b->C,
              b->ldc);
}

static void run_ob(const bctx *b)
{
    const bcase *c = b->c;
    cblas_sgemm(CblasRowMajor, c->ta ? CblasTrans : CblasNoTrans, c->tb ? CblasTrans : CblasNoTrans, (int)c->M,
                (int)c->N, (int)c->K, 1.0f, b->A, (int)b->lda, b->B, (int)b->ldb, 0.0f, b->C, (int)b->ldc);
}

/* seconds per call: inner loop long enough (>= ~4 ms) per repetition */
static double time_calls(void (*fn)(const bctx *), const bctx *b, int inner)
{
    double t0 = now_s();
    int i;
    for (i = 0; i < inner; i++) fn(b);
    return (now_s() - t0) / inner;
}

/* OpenBLAS's threads keep spinning for ~0.1 s after a call (its thread
   timeout) and take the second core from dl's next run. So, at 2 threads,
   dl's timed runs that follow OpenBLAS's come after 0.15 s of untimed dl
   calls (not a sleep: after one, Linux tends to wake dl's worker on the
   caller's core, where it stays for a while). dl's workers sleep as soon as
   they are done, so OpenBLAS needs no such wait. */
static void settle_after_openblas(int threads, const bctx *b)
{
    double t0 = now_s();
    if (threads <= 1) return;
    while (now_s() - t0 < 0.15) run_dl(b);
}

static double g_dl_1024_1t = 0.0;

static void bench_case(const bcase *c, int threads, dl__pool *pool, int reps, double min_rep_s)
{
    bctx b;
    int64_t arows = c->ta ? c->K : c->M, acols = c->ta ? c->M : c->K;
    int64_t brows = c->tb ? c->N : c->K, bcols = c->tb ? c->K : c->N, i;
    float *A = (float *)malloc(sizeof(float) * (size_t)(arows * acols));
    float *B = (float *)malloc(sizeof(float) * (size_t)(brows * bcols));
    float *C = (float *)malloc(sizeof(float) * (size_t)(c->M * c->N));
    double flops = 2.0 * (double)c->M * (double)c->N * (double)c->K, t, tdl[64], tob[64], mdl, mob;
    int inner, r;
    if (!A || !B || !C) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (i = 0; i < arows * acols; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (i = 0; i < brows * bcols; i++) B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    for (i = 0; i < c->M * c->N; i++) C[i] = 0.0f;
    b.c = c;
    b.A = A;
    b.B = B;
    b.C = C;
    b.lda = acols;
    b.ldb = bcols;
    b.ldc = c->N;
    b.pool = pool;
    openblas_set_num_threads(threads);
    /* warm-up, and pick the inner count from the slower of the two */
    run_dl(&b);
    run_ob(&b);
    settle_after_openblas(threads, &b);
    t = time_calls(run_dl, &b, 1);
    {
        double t2 = time_calls(run_ob, &b, 1);
        if (t2 > t) t = t2;
    }
    inner = t >= min_rep_s ? 1 : (int)(min_rep_s / (t > 1e-7 ? t : 1e-7)) + 1;
    if (inner > 100000) inner = 100000;
    if (reps > 64) reps = 64;
    for (r = 0; r < reps; r++) {
        /* interleave, alternating which goes first */
        if (r & 1) {
            tob[r] = time_calls(run_ob, &b, inner);
            settle_after_openblas(threads, &b);
            tdl[r] = time_calls(run_dl, &b, inner);
        } else {
            tdl[r] = time_calls(run_dl, &b, inner);
            tob[r] = time_calls(run_ob, &b, inner);
        }
    }
    mdl = flops / median(tdl, reps) * 1e-9;
    mob = flops / median(tob, reps) * 1e-9;
    printf("gemm %lld %lld %lld %d %.2f %.2f %.3f  # %s ta=%d tb=%d\n", (long long)c->M, (long long)c->N,
           (long long)c->K, threads, mdl, mob, mdl / mob, c->name, c->ta, c->tb);
    fflush(stdout);
    if (threads == 1 && c->M == 1024 && c->N == 1024 && c->K == 1024 && !c->ta && !c->tb) g_dl_1024_1t = mdl;
    free(A);
    free(B);
    free(C);
}

/* register-only FMA loop: independent accumulators, no memory traffic */
static double fma_peak_once(void)
{
    const long iters = 20000000;
    double t0, t;
    long i;
    float sink;
#if defined(__AVX512F__)
    /* distinct values and an asm barrier on every accumulator, so that the
       compiler can neither merge identical chains nor drop any */
    __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f);
    __m512 a3 = _mm512_set1_ps(1.3f), a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f);
    __m512 a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f), a8 = _mm512_set1_ps(1.8f);
    __m512 a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f);
    __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    const double lanes = 16.0, nacc = 12.0;
    t0 = cpu_s();
    for (i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, x, y); a1 = _mm512_fmadd_ps(a1, x, y);
        a2 = _mm512_fmadd_ps(a2, x, y); a3 = _mm512_fmadd_ps(a3, x, y);
        a4 = _mm512_fmadd_ps(a4, x, y); a5 = _mm512_fmadd_ps(a5, x, y);
        a6 = _mm512_fmadd_ps(a6, x, y); a7 = _mm512_fmadd_ps(a7, x, y);
        a8 = _mm512_fmadd_ps(a8, x, y); a9 = _mm512_fmadd_ps(a9, x, y);
        a10 = _mm512_fmadd_ps(a10, x, y); a11 = _mm512_fmadd_ps(a11, x, y);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                         "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    t = cpu_s() - t0;
    a0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                       _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    a0 = _mm512_add_ps(a0, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    sink = _mm512_reduce_add_ps(a0);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.1f), a2 = _mm256_set1_ps(1.2f);
    __m256 a3 = _mm256_set1_ps(1.3f), a4 = _mm256_set1_ps(1.4f), a5 = _mm256_set1_ps(1.5f);
    __m256 a6 = _mm256_set1_ps(1.6f), a7 = _mm256_set1_ps(1.7f), a8 = _mm256_set1_ps(1.8f);
    __m256 a9 = _mm256_set1_ps(1.9f), a10 = _mm256_set1_ps(2.0f), a11 = _mm256_set1_ps(2.1f);
    __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    float tmp[8];
    const double lanes = 8.0, nacc = 12.0;
    t0 = cpu_s();
    for (i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, x, y); a1 = _mm256_fmadd_ps(a1, x, y);
        a2 = _mm256_fmadd_ps(a2, x, y); a3 = _mm256_fmadd_ps(a3, x, y);
        a4 = _mm256_fmadd_ps(a4, x, y); a5 = _mm256_fmadd_ps(a5, x, y);
        a6 = _mm256_fmadd_ps(a6, x, y); a7 = _mm256_fmadd_ps(a7, x, y);
        a8 = _mm256_fmadd_ps(a8, x, y); a9 = _mm256_fmadd_ps(a9, x, y);
        a10 = _mm256_fmadd_ps(a10, x, y); a11 = _mm256_fmadd_ps(a11, x, y);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                         "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
    }
    t = cpu_s() - t0;
    a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                       _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    _mm256_storeu_ps(tmp, a0);
    sink = tmp[0];
#else
    float a[12], x = 0.999999f, y = 1e-7f;
    int k;
    const double lanes = 1.0, nacc = 12.0;
    for (k = 0; k < 12; k++) a[k] = 1.0f;
    t0 = cpu_s();
    for (i = 0; i < iters / 8; i++)
        for (k = 0; k < 12; k++) a[k] = fmaf(a[k], x, y);
    t = (cpu_s() - t0) * 8.0;
    sink = a[0] + a[11];
#endif
    if (sink == 12345.0f) printf(" ");
    return 2.0 * lanes * nacc * (double)iters / t * 1e-9;
}

static double fma_peak(void)
{
    double v[7];
    int r;
    for (r = 0; r < 7; r++) v[r] = fma_peak_once();
    qsort(v, 7, sizeof(double), cmp_d);
    return v[6]; /* the best: the machine is shared, the peak is a ceiling */
}

/* dl's one-thread GFLOP/s at 1024^3, median of 7 in thread CPU time */
static double dl_1024_cpu(dl__pool *pool)
{
    const int64_t n = 1024;
    float *A = (float *)malloc(sizeof(float) * (size_t)(n * n)), *B = (float *)malloc(sizeof(float) * (size_t)(n * n));
    float *C = (float *)malloc(sizeof(float) * (size_t)(n * n));
    double v[7], t0;
    int64_t i;
    int r;
    if (!A || !B || !C) exit(2);
    for (i = 0; i < n * n; i++) {
        A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    }
    dl__sgemm(pool, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    for (r = 0; r < 7; r++) {
        t0 = cpu_s();
        dl__sgemm(pool, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        v[r] = 2.0 * (double)n * (double)n * (double)n / (cpu_s() - t0) * 1e-9;
    }
    free(A);
    free(B);
    free(C);
    return median(v, 7);
}

static int selected(const bcase *c, int nsel, char **sel)
{
    int i;
    if (nsel == 0) return 1;
    for (i = 0; i < nsel; i++)
        if (!strcmp(sel[i], c->name) || !strcmp(sel[i], c->group)) return 1;
    return 0;
}

int main(int argc, char **argv)
{
    char *sel[256];
    int nsel = 0, quick = 0, reps = 9, tlist[2] = {1, 2}, nt = 2, i, ti;
    double min_rep_s = 0.02;
    dl__pool *pools[2];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--threads") || !strcmp(argv[i], "--reps")) {
            const char *f = argv[i], *v = i + 1 < argc ? argv[++i] : "";
            char *end;
            long x;
            errno = 0;
            x = strtol(v, &end, 10);
            if (!(v[0] >= '0' && v[0] <= '9') || *end || errno == ERANGE || x < 1 || x > (f[2] == 't' ? 1024 : 100000)) {
                fprintf(stderr, "%s: %s %s: must be a whole number from 1 to %d\n", argv[0], f, v,
                        f[2] == 't' ? 1024 : 100000);
                return 2;
            }
            if (f[2] == 't') { tlist[0] = (int)x; nt = 1; }
            else reps = (int)x;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--quick] [--threads N] [--reps N] [case|group ...]\ncases:", argv[0]);
            for (i = 0; i < NCASES; i++) printf(" %s", g_cases[i].name);
            printf("\ngroups: square lenet linear resnet mlp16\n");
            return 0;
        } else if (nsel < 256) sel[nsel++] = argv[i];
    }
    for (i = 0; i < nsel; i++) {   /* every name a case or a group */
        int k, found = 0;
        for (k = 0; k < NCASES; k++) found |= !strcmp(sel[i], g_cases[k].name) || !strcmp(sel[i], g_cases[k].group);
        if (!found) { fprintf(stderr, "%s: no case or group %s (--help lists them)\n", argv[0], sel[i]); return 2; }
    }
    if (quick) {
        if (reps > 7) reps = 7;
        min_rep_s = 0.005;
    }
    if (reps < 7) reps = 7;
    pools[0] = dl__pool_create(tlist[0]);
    pools[1] = nt > 1 ? dl__pool_create(tlist[1]) : NULL;
    if (!pools[0] || (nt > 1 && !pools[1])) {
        fprintf(stderr, "pool create failed\n");
        return 2;
    }
    printf("# openblas core %s; columns: gemm M N K threads dl_gflops openblas_gflops ratio\n",
           openblas_get_corename());
    for (i = 0; i < NCASES; i++) {
        if (!selected(&g_cases[i], nsel, sel)) continue;
        if (quick && (g_cases[i].M * g_cases[i].N * g_cases[i].K > (int64_t)1100000000)) continue;
        for (ti = 0; ti < nt; ti++) bench_case(&g_cases[i], tlist[ti], pools[ti], reps, min_rep_s);
    }
    if (nsel == 0 || selected(&g_cases[4], nsel, sel)) {
        double peak = fma_peak(), cpu = dl_1024_cpu(tlist[0] == 1 ? pools[0] : NULL);
        printf("fma_peak_gflops %.1f\n", peak);
        /* the GEMM in thread CPU time too, as the peak: on a shared machine
           the wall-clock median above also counts time given to others */
        printf("gemm_peak_fraction n=1024 %.3f  # dl %.1f GFLOP/s, median of 7 in thread CPU time", cpu / peak,
               cpu);
        if (g_dl_1024_1t > 0.0) printf("; wall-clock median %.3f", g_dl_1024_1t / peak);
        printf("\n");
    }
    dl__pool_destroy(pools[0]);
    if (pools[1]) dl__pool_destroy(pools[1]);
    return 0;
}
