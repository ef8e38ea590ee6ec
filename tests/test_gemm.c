/* tests/test_gemm.c - dl.h's own GEMM (dl__sgemm) against a double-precision
   reference: every transpose, odd and empty shapes, padded leading dims,
   alpha/beta; the thread pool; bit-identical results across thread counts.
   Args: quick (smaller sizes, for valgrind) | bench (adds a 512^3 timing). */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#define DL_IMPLEMENTATION
#include "dl.h"

static int g_fail = 0, g_checks = 0;
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd_u32(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

static float rnd_f(void)
{
    return (float)((double)(rnd_u32() & 0xFFFFFF) / 16777216.0 * 2.0 - 1.0);
}

static int64_t rnd_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rnd_u32() % (uint32_t)(hi - lo + 1));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------- thread pool tests ---------- */

typedef struct {
    int *hits;
    dl__pool *pool;
    int nested;
} pf_arg;

static void pf_inner(void *varg, int64_t b, int64_t e)
{
    int *hits = (int *)varg;
    int64_t i;
    for (i = b; i < e; i++) hits[i] += 100;
}

static void pf_fn(void *varg, int64_t b, int64_t e)
{
    pf_arg *a = (pf_arg *)varg;
    int64_t i;
    for (i = b; i < e; i++) a->hits[i] += 1;
    if (a->nested) dl__parallel_for(a->pool, e - b, 1, pf_inner, a->hits + b);
}

static void test_pool(int nthreads)
{
    g_checks++;
    dl__pool *p = dl__pool_create(nthreads);
    int n, rep, nested;
    int *hits = (int *)malloc(sizeof(int) * 5000);
    if (!p || !hits) {
        printf("FAIL: pool create\n");
        g_fail++;
        free(hits);
        dl__pool_destroy(p);
        return;
    }
    for (nested = 0; nested < 2; nested++) {
        for (rep = 0; rep < 200; rep++) {
            int i, ok = 1;
            pf_arg a;
            n = (int)rnd_range(0, 4999);
            memset(hits, 0, sizeof(int) * 5000);
            a.hits = hits;
            a.pool = p;
            a.nested = nested;
            dl__parallel_for(p, n, rnd_range(0, 50), pf_fn, &a);
            for (i = 0; i < 5000; i++) {
                int want = i < n ? (nested ? 101 : 1) : 0;
                if (hits[i] != want) ok = 0;
            }
            if (!ok) {
                printf("FAIL: parallel_for n=%d threads=%d nested=%d\n", n, nthreads, nested);
                g_fail++;
                break;
            }
        }
    }
    free(hits);
    dl__pool_destroy(p);
}

/* ---------- sgemm tests ---------- */

static void ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float beta, const float *C0, int64_t ldc, double *R, double *S)
{
    int64_t i, j, p;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double s = 0.0, sa = 0.0;
            for (p = 0; p < K; p++) {
                double a = ta ? A[p * lda + i] : A[i * lda + p];
                double b = tb ? B[j * ldb + p] : B[p * ldb + j];
                s += a * b;
                sa += fabs(a * b);
            }
            R[i * N + j] = (double)alpha * s + (beta == 0.0f ? 0.0 : (double)beta * C0[i * ldc + j]);
            S[i * N + j] = fabs((double)alpha) * sa + (beta == 0.0f ? 0.0 : fabs((double)beta * C0[i * ldc + j]));
        }
}

static int check_one(dl__pool **pools, int npools, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                     int64_t pad, float alpha, float beta)
{
    g_checks++;
    int64_t lda, ldb, ldc, arows, brows, i, j;
    float *A, *B, *C0, *C, *Cfirst;
    double *R, *S;
    int pi, bad = 0;
    lda = (ta ? M : K) + pad;
    ldb = (tb ? K : N) + pad;
    ldc = N + pad;
    arows = ta ? K : M;
    brows = tb ? N : K;
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    if (ldc < 1) ldc = 1;
    A = (float *)malloc(sizeof(float) * (size_t)(arows * lda + 1));
    B = (float *)malloc(sizeof(float) * (size_t)(brows * ldb + 1));
    C0 = (float *)malloc(sizeof(float) * (size_t)(M * ldc + 1));
    C = (float *)malloc(sizeof(float) * (size_t)(M * ldc + 1));
    Cfirst = (float *)malloc(sizeof(float) * (size_t)(M * ldc + 1));
    R = (double *)malloc(sizeof(double) * (size_t)(M * N + 1));
    S = (double *)malloc(sizeof(double) * (size_t)(M * N + 1));
    if (!A || !B || !C0 || !C || !Cfirst || !R || !S) {
        printf("test alloc failed\n");
        exit(2);
    }
    for (i = 0; i < arows * lda; i++) A[i] = rnd_f();
    for (i = 0; i < brows * ldb; i++) B[i] = rnd_f();
    for (i = 0; i < M * ldc; i++) C0[i] = beta == 0.0f ? NAN : rnd_f();
    /* padding of A/B: put garbage to detect reads outside the matrix */
    if (pad > 0) {
        for (i = 0; i < arows; i++)
            for (j = lda - pad; j < lda; j++) A[i * lda + j] = NAN;
        for (i = 0; i < brows; i++)
            for (j = ldb - pad; j < ldb; j++) B[i * ldb + j] = NAN;
    }
    ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, R, S);
    for (pi = 0; pi < npools && !bad; pi++) {
        memcpy(C, C0, sizeof(float) * (size_t)(M * ldc));
        dl__sgemm(pools[pi], ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        for (i = 0; i < M && !bad; i++) {
            for (j = 0; j < N; j++) {
                double got = C[i * ldc + j], want = R[i * N + j];
                double tol = 1e-4 * S[i * N + j] + 1e-30;
                if (!(fabs(got - want) <= tol)) {
                    printf("FAIL: ta=%d tb=%d M=%ld N=%ld K=%ld pad=%ld alpha=%g beta=%g threads=%d at (%ld,%ld): "
                           "got %.9g want %.9g tol %g\n",
                           (int)ta, (int)tb, (long)M, (long)N, (long)K, (long)pad, alpha, beta,
                           dl__pool_size(pools[pi]), (long)i, (long)j, got, want, tol);
                    bad = 1;
                    break;
                }
            }
            /* padding of C must be untouched */
            for (j = N; j < ldc && !bad; j++) {
                float a = C[i * ldc + j], b = C0[i * ldc + j];
                if (memcmp(&a, &b, sizeof(float)) != 0) {
                    printf("FAIL: C padding modified at (%ld,%ld)\n", (long)i, (long)j);
                    bad = 1;
                }
            }
        }
        if (pi == 0) {
            memcpy(Cfirst, C, sizeof(float) * (size_t)(M * ldc));
        } else if (!bad && M * ldc > 0 && memcmp(Cfirst, C, sizeof(float) * (size_t)(M * ldc)) != 0) {
            printf("FAIL: not bit-identical across thread counts: ta=%d tb=%d M=%ld N=%ld K=%ld threads=%d\n",
                   (int)ta, (int)tb, (long)M, (long)N, (long)K, dl__pool_size(pools[pi]));
            bad = 1;
        }
    }
    free(A);
    free(B);
    free(C0);
    free(C);
    free(Cfirst);
    free(R);
    free(S);
    if (bad) g_fail++;
    return bad;
}

static void naive_ijk(int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C)
{
    int64_t i, j, p;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            float s = 0.0f;
            for (p = 0; p < K; p++) s += A[i * K + p] * B[p * N + j];
            C[i * N + j] = s;
        }
}

static void bench(dl__pool *p1, dl__pool *p2)
{
    const int64_t n = 512;
    float *A = (float *)malloc(sizeof(float) * (size_t)(n * n));
    float *B = (float *)malloc(sizeof(float) * (size_t)(n * n));
    float *C = (float *)malloc(sizeof(float) * (size_t)(n * n));
    double t0, tn, t1, t2, flops = 2.0 * (double)n * (double)n * (double)n;
    int64_t i;
    int r, reps = 50;
    if (!A || !B || !C) exit(2);
    for (i = 0; i < n * n; i++) {
        A[i] = rnd_f();
        B[i] = rnd_f();
    }
    t0 = now_s();
    naive_ijk(n, n, n, A, B, C);
    tn = now_s() - t0;
    dl__sgemm(p1, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n); /* warm-up */
    t0 = now_s();
    for (r = 0; r < reps; r++) dl__sgemm(p1, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    t1 = (now_s() - t0) / reps;
    dl__sgemm(p2, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    t0 = now_s();
    for (r = 0; r < reps; r++) dl__sgemm(p2, false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    t2 = (now_s() - t0) / reps;
    printf("512^3: naive ijk %.1f ms (%.2f GFLOP/s) | sgemm 1 thread %.2f ms (%.1f GFLOP/s, %.1fx) | "
           "%d threads %.2f ms (%.1f GFLOP/s, %.1fx)\n",
           tn * 1e3, flops / tn * 1e-9, t1 * 1e3, flops / t1 * 1e-9, tn / t1, dl__pool_size(p2), t2 * 1e3,
           flops / t2 * 1e-9, tn / t2);
    free(A);
    free(B);
    free(C);
}

int main(int argc, char **argv)
{
    dl__pool *pools[3];
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    int bench_on = argc > 1 && strcmp(argv[1], "bench") == 0;
    int t, ta, tb, k, npools = 3;
    static const int64_t fixed[][3] = {
        {0, 0, 0}, {0, 5, 3}, {5, 0, 3}, {5, 3, 0}, {1, 1, 1}, {1, 1, 7}, {1, 7, 1}, {7, 1, 1},
        {1, 100, 100}, {100, 1, 100}, {100, 100, 1}, {4, 24, 256}, {5, 25, 257}, {3, 23, 255},
        {33, 33, 33}, {64, 64, 64}, {145, 3073, 3}, {1000, 37, 513}, {37, 1000, 513}, {300, 300, 600},
        {13, 2000, 40}, {2000, 13, 40}, {150, 3100, 20}
    };
    static const float alphas[] = {1.0f, 0.5f, -2.0f, 0.0f};
    static const float betas[] = {0.0f, 1.0f, 0.25f, -1.0f};

    (void)argv;
    test_pool(1);
    test_pool(2);
    test_pool(4);
    test_pool(0);

    pools[0] = dl__pool_create(1);
    pools[1] = dl__pool_create(2);
    pools[2] = dl__pool_create(4);
    if (!pools[0] || !pools[1] || !pools[2]) {
        printf("FAIL: pool create\n");
        return 1;
    }
    printf("pool sizes: %d %d %d (auto: ", dl__pool_size(pools[0]), dl__pool_size(pools[1]),
           dl__pool_size(pools[2]));
    {
        dl__pool *pa = dl__pool_create(0);
        printf("%d)\n", dl__pool_size(pa));
        dl__pool_destroy(pa);
    }
    dl__pool_destroy(NULL);

    /* fixed shapes x all transposes x alpha/beta variants */
    for (k = 0; k < (int)(sizeof(fixed) / sizeof(fixed[0])); k++) {
        int64_t M = fixed[k][0], N = fixed[k][1], K = fixed[k][2];
        if (quick && M * N * K > 300000) continue;
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int ab = (int)(rnd_u32() % 4), bb = (int)(rnd_u32() % 4);
                check_one(pools, npools, ta != 0, tb != 0, M, N, K, 0, 1.0f, 0.0f);
                check_one(pools, npools, ta != 0, tb != 0, M, N, K, rnd_range(1, 9), alphas[ab], betas[bb]);
            }
    }
    /* random shapes */
    for (t = 0; t < (quick ? 40 : 400); t++) {
        int64_t M, N, K;
        int mode = (int)(rnd_u32() % 4);
        if (mode == 0) {
            M = rnd_range(0, 20);
            N = rnd_range(0, 20);
            K = rnd_range(0, 20);
        } else if (mode == 1 || quick) {
            M = rnd_range(1, 80);
            N = rnd_range(1, 80);
            K = rnd_range(1, 80);
        } else {
            M = rnd_range(1, 300);
            N = rnd_range(1, 300);
            K = rnd_range(1, 600);
        }
        check_one(pools, npools, (rnd_u32() & 1) != 0, (rnd_u32() & 1) != 0, M, N, K,
                  (rnd_u32() & 1) ? rnd_range(1, 20) : 0, alphas[rnd_u32() % 4], betas[rnd_u32() % 4]);
    }
    /* NULL pool */
    {
        dl__pool *np[1];
        np[0] = NULL;
        check_one(np, 1, false, true, 70, 90, 110, 3, 1.5f, 0.5f);
    }

    if (bench_on) bench(pools[0], pools[1]);

    dl__pool_destroy(pools[0]);
    dl__pool_destroy(pools[1]);
    dl__pool_destroy(pools[2]);
    printf("%d passed, %d failed\n", g_checks - g_fail, g_fail);
    return g_fail ? 1 : 0;
}
