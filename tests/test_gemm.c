/* tests/test_gemm.c - dl.h's own GEMM (dl__sgemm) against a double-precision
   reference: every transpose, odd and empty shapes, padded leading dims,
   alpha/beta; the thread pool; bit-identical results across thread counts,
   to the scalar twin of each path, and when the buffers cannot be had.
   Args: quick (smaller sizes, for valgrind) | bench (adds a 512^3 timing).
   The kernel tested is the one the build selects: built as `make test` does
   (-O2) the portable one; the intrinsics paths need the same file built with
   -march=native (AVX-512) or -mavx2 -mfma (AVX2+FMA). */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <stdlib.h>
/* an allocator that can be told to fail */
static int g_alloc_fail = 0;
static void *test_malloc(size_t n)
{
    return g_alloc_fail ? NULL : malloc(n);
}
#define DL_MALLOC(sz) test_malloc(sz)
#define DL_REALLOC(p, sz) realloc(p, sz)
#define DL_FREE(p) free(p)
#define DL_IMPLEMENTATION
/* split every product that can be split, small ones included, into three
   chunks per thread claimed in whatever order the threads get to them: the
   results must not depend on it, and that is what the thread-count checks
   check */
#define DL__GEMM_PAR_MIN 0
#define DL__GEMM_DYN 3
#define DL__GEMM_CHUNK_SHARE 1e30
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

/* marks each index with the start of the chunk that ran it, plus 1 */
static void pf_mark(void *varg, int64_t b, int64_t e)
{
    int *hits = (int *)varg;
    int64_t i;
    for (i = b; i < e; i++) hits[i] += (int)b + 1;
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
    /* the chunks are dl__split's for DL__POOL_SHARE per thread, each run
       once, whichever thread runs it (own share or taken from another's) */
    for (rep = 0; rep < 300; rep++) {
        int64_t grain = rnd_range(1, 64), chunk = 1, nch;
        int i, ok = 1;
        n = (int)rnd_range(0, 4999);
        nch = dl__split(n, grain, dl__pool_size(p) * DL__POOL_SHARE, &chunk);
        memset(hits, 0, sizeof(int) * 5000);
        dl__parallel_for(p, n, grain, pf_mark, hits);
        for (i = 0; i < 5000; i++) {
            int want = i >= n ? 0 : (dl__pool_size(p) == 1 || nch <= 1) ? 1 : (int)(i / chunk * chunk) + 1;
            if (hits[i] != want) ok = 0;
        }
        if (!ok) {
            printf("FAIL: parallel_for chunks n=%d grain=%lld threads=%d\n", n, (long long)grain, nthreads);
            g_fail++;
            break;
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

/* n floats at a 64-byte boundary, or (half the time) a random number of
   floats past it: both the aligned and the unaligned code paths run */
static float *alloc_floats(size_t n, void **base)
{
    size_t off = (rnd_u32() & 1) ? 0 : (size_t)rnd_range(1, 15);
    if (posix_memalign(base, 64, sizeof(float) * (n + 16)) != 0) {
        printf("test alloc failed\n");
        exit(2);
    }
    return (float *)*base + off;
}

static int check_one(dl__pool **pools, int npools, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                     int64_t pad, float alpha, float beta)
{
    g_checks++;
    int64_t lda, ldb, ldc, arows, brows, i, j;
    float *A, *B, *C0, *C, *Cfirst;
    void *Abase, *Bbase;
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
    /* row strides of whole vectors half the time (aligned rows) */
    if (pad > 0 && (rnd_u32() & 1)) {
        lda = (lda + 15) / 16 * 16;
        ldb = (ldb + 15) / 16 * 16;
    }
    A = alloc_floats((size_t)(arows * lda + 1), &Abase);
    B = alloc_floats((size_t)(brows * ldb + 1), &Bbase);
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
            for (j = ta ? M : K; j < lda; j++) A[i * lda + j] = NAN;
        for (i = 0; i < brows; i++)
            for (j = tb ? K : N; j < ldb; j++) B[i * ldb + j] = NAN;
    }
    ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, R, S);
    for (pi = 0; pi < npools && !bad; pi++) {
        memcpy(C, C0, sizeof(float) * (size_t)(M * ldc));
        dl__sgemm(pools[pi], ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        for (i = 0; i < M && !bad; i++) {
            for (j = 0; j < N; j++) {
                double got = C[i * ldc + j], want = R[i * N + j];
                /* the error bound of a K-term float sum (two roundings per
                   term without FMA), plus the alpha/beta update */
                double tol = 1.2e-7 * (double)(K + 8) * S[i * N + j] + 1e-30;
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
            /* bit for bit what the scalar twin of the path taken gives */
            if (!bad && K > 0 && alpha != 0.0f && M * N > 0) {
                float *X = (float *)malloc(sizeof(float) * (size_t)(M * ldc));
                if (!X) exit(2);
                memcpy(X, C0, sizeof(float) * (size_t)(M * ldc));
#ifdef DL__GEMM_DOT
                if ((double)M * (double)N * (double)K >= DL__GEMM_REF_MAX && dl__gemm_use_dot(ta, tb, M, N, K))
                    dl__gemm_dot_ref(M, N, K, alpha, A, lda, B, ldb, NULL, beta, X, ldc);
                else
#endif
                    dl__gemm_ref(ta, tb, M, N, K, dl__gemm_kc(K), alpha, A, lda, B, ldb, NULL, beta, X, ldc);
                if (memcmp(X, C, sizeof(float) * (size_t)(M * ldc)) != 0) {
                    printf("FAIL: not bit-identical to the scalar reference path: ta=%d tb=%d M=%ld N=%ld K=%ld "
                           "alpha=%g beta=%g\n",
                           (int)ta, (int)tb, (long)M, (long)N, (long)K, alpha, beta);
                    bad = 1;
                }
                free(X);
            }
        } else if (!bad && M * ldc > 0 && memcmp(Cfirst, C, sizeof(float) * (size_t)(M * ldc)) != 0) {
            printf("FAIL: not bit-identical across thread counts: ta=%d tb=%d M=%ld N=%ld K=%ld threads=%d\n",
                   (int)ta, (int)tb, (long)M, (long)N, (long)K, dl__pool_size(pools[pi]));
            bad = 1;
        }
    }
    free(Abase);
    free(Bbase);
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

/* the shapes that reach every edge of the kernels: row counts around the
   kernels' MR (4, 6, 8) and column counts around their vectors and NR (8,
   16, 24, 32), K around the blocks (8-wide packing, 256 per K block, 512 per
   chunk of the dot path), primes, 1 */
static const int64_t g_edge_mn[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15, 16, 17, 23, 24, 25, 31, 32, 33,
                                    37, 47, 48, 49, 53, 63, 64, 65, 97};
static const int64_t g_edge_k[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 61, 127, 255, 256, 257, 263, 511, 513, 521};
static const int64_t g_primes[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67,
                                   71, 73, 79, 83, 89, 97, 101, 127, 131, 191, 257, 509, 521};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int64_t pick(const int64_t *v, int n)
{
    return v[rnd_u32() % (uint32_t)n];
}

static void random_case(dl__pool **pools, int npools, int64_t M, int64_t N, int64_t K)
{
    static const float alphas[] = {1.0f, 0.5f, -2.0f, 1.0f, 0.0f};
    static const float betas[] = {0.0f, 1.0f, 0.25f, -1.0f, 0.0f};
    check_one(pools, npools, (rnd_u32() & 1) != 0, (rnd_u32() & 1) != 0, M, N, K,
              (rnd_u32() & 1) ? rnd_range(1, 17) : 0, alphas[rnd_u32() % 5], betas[rnd_u32() % 5]);
}

/* every edge: random combinations of the edge sizes and primes, all four
   transposes, alpha/beta variants, padded leading dimensions, NaN-filled C
   when beta == 0 */
static void test_edges(dl__pool **pools, int npools, int quick)
{
    int t, n = quick ? 60 : 600;
    for (t = 0; t < n; t++) {
        int64_t M, N, K;
        switch (t % 3) {
        case 0:
            M = pick(g_edge_mn, NELEM(g_edge_mn));
            N = pick(g_edge_mn, NELEM(g_edge_mn));
            K = pick(g_edge_k, NELEM(g_edge_k));
            break;
        case 1:
            M = pick(g_primes, NELEM(g_primes));
            N = pick(g_primes, NELEM(g_primes));
            K = pick(g_primes, NELEM(g_primes));
            break;
        default:
            M = pick(g_edge_mn, NELEM(g_edge_mn));
            N = pick(g_primes, NELEM(g_primes));
            K = pick(g_primes, NELEM(g_primes));
            if (rnd_u32() & 1) {
                int64_t x = M;
                M = N;
                N = x;
            }
            break;
        }
        if (quick && M * N * K > 200000) continue;
        random_case(pools, npools, M, N, K);
    }
}

/* the shapes of the models (scaled down where the reference would be slow)
   and the blocking boundaries: several row blocks (MC), column blocks (NC),
   K blocks, long K for the skinny paths, narrow C split by vectors */
static void test_model_shapes(dl__pool **pools, int npools, int quick)
{
    static const int64_t shapes[][5] = {
        /* ta tb M N K */
        {0, 0, 6, 3136, 25},   {0, 0, 6, 3137, 25},  {0, 0, 16, 1200, 150}, {1, 0, 150, 1200, 16},
        {0, 1, 6, 25, 5000},   {0, 1, 16, 150, 1300}, {0, 1, 16, 144, 1029}, {0, 1, 3, 250, 700},
        {0, 1, 64, 7, 2000},   {0, 1, 1, 1, 3000},   {0, 1, 5, 241, 513},   {0, 1, 33, 19, 1500},
        {0, 1, 256, 10, 84},   {0, 1, 256, 120, 400}, {0, 1, 256, 84, 120}, {0, 0, 256, 84, 10},
        {1, 0, 10, 84, 256},   {1, 0, 84, 120, 256}, {0, 0, 32, 630, 288},  {1, 0, 144, 700, 16},
        {0, 0, 1031, 37, 67},  {1, 1, 1031, 37, 67}, {0, 0, 37, 1031, 67},  {1, 1, 37, 1031, 67},
        {0, 1, 40, 1100, 30},  {1, 0, 40, 1100, 30}, {0, 0, 9, 2100, 300},  {1, 1, 70, 90, 700},
        {0, 0, 2, 20, 1100},   {1, 0, 3, 40, 1100},  {1, 1, 17, 33, 520},   {0, 0, 100, 1, 2000},
    };
    int k, v;
    for (k = 0; k < NELEM(shapes); k++) {
        int64_t M = shapes[k][2], N = shapes[k][3], K = shapes[k][4];
        if (quick && M * N * K > 300000) continue;
        for (v = 0; v < 3; v++) {
            float alpha = v == 0 ? 1.0f : (v == 1 ? -0.5f : 2.0f), beta = v == 0 ? 0.0f : (v == 1 ? 1.0f : 0.5f);
            check_one(pools, npools, shapes[k][0] != 0, shapes[k][1] != 0, M, N, K, v == 2 ? 5 : 0, alpha, beta);
        }
    }
}

/* The small path (op(A) and B read in place: at most 12 rows of op(A), or
   K N <= 4096 at any M; AVX-512 builds) and the 8-wide last vector (a
   sliver's last 1..8 columns past 16): tiles of every height, last slivers
   of 1..32 columns, every transpose, padded strides (NaN in the padding),
   alpha 1 with beta 0 (C = acc) and the other updates, against the scalar
   reference's bits on every pool. */
static void test_small_direct(dl__pool **pools, int npools, int quick)
{
    static const int64_t ms[] = {1, 2, 5, 8, 9, 10, 12, 13, 40, 256};
    static const int64_t ns[] = {1, 17, 20, 24, 25, 31, 32, 49, 56, 84, 120};
    static const int64_t ks[] = {1, 10, 34, 257};
    int a, b, c, t, n = 0;
    for (a = 0; a < NELEM(ms); a++)
        for (b = 0; b < NELEM(ns); b++)
            for (c = 0; c < NELEM(ks); c++) {
                int64_t M = ms[a], N = ns[b], K = ks[c];
                if (M * N * K > 300000 || (quick && n++ % 7)) continue;
                for (t = 0; t < 4; t++) {
                    int v = (int)(rnd_u32() % 3);
                    check_one(pools, npools, (t & 1) != 0, (t & 2) != 0, M, N, K, v ? rnd_range(1, 9) : 0,
                              v == 2 ? -0.5f : 1.0f, v == 0 ? 0.0f : (v == 1 ? 1.0f : 0.25f));
                }
            }
}

/* no memory for the pack buffers: the scalar twins give the same bits */
static void test_oom(dl__pool *pool)
{
    static const int64_t shapes[][5] = {
        {0, 0, 37, 70, 300}, {1, 1, 70, 37, 45}, {0, 1, 6, 25, 3000}, {0, 1, 16, 150, 700}, {1, 0, 150, 300, 16},
        {0, 0, 6, 3000, 25},
    };
    int k;
    for (k = 0; k < NELEM(shapes); k++) {
        bool ta = shapes[k][0] != 0, tb = shapes[k][1] != 0;
        int64_t M = shapes[k][2], N = shapes[k][3], K = shapes[k][4], i;
        int64_t lda = ta ? M : K, ldb = tb ? K : N;
        float *A = (float *)malloc(sizeof(float) * (size_t)(M * K)), *B = (float *)malloc(sizeof(float) * (size_t)(K * N));
        float *C1 = (float *)malloc(sizeof(float) * (size_t)(M * N)), *C2 = (float *)malloc(sizeof(float) * (size_t)(M * N));
        g_checks++;
        if (!A || !B || !C1 || !C2) exit(2);
        for (i = 0; i < M * K; i++) A[i] = rnd_f();
        for (i = 0; i < K * N; i++) B[i] = rnd_f();
        for (i = 0; i < M * N; i++) C1[i] = C2[i] = rnd_f();
        dl__sgemm(pool, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C1, N);
        g_alloc_fail = 1;
        dl__sgemm(NULL, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C2, N);
        g_alloc_fail = 0;
        if (memcmp(C1, C2, sizeof(float) * (size_t)(M * N)) != 0) {
            printf("FAIL: out-of-memory path differs: ta=%d tb=%d M=%ld N=%ld K=%ld\n", (int)ta, (int)tb, (long)M,
                   (long)N, (long)K);
            g_fail++;
        }
        free(A);
        free(B);
        free(C1);
        free(C2);
    }
}

/* dl__sgemm_rows: B given as a table of row starts (rows scattered in a
   larger buffer, some overlapping, as the shifted views of a padded image
   are) gives the bits of the same B stored plainly, B as (K, N) and as
   (N, K) used transposed (the dot path's skinny shapes too), on every pool,
   also tiny (the scalar path) and out of memory */
static void test_rows(dl__pool **pools, int npools, int quick)
{
    static const int64_t shapes[][4] = {   /* transb, M, N, K */
        {0, 1, 1, 1}, {0, 3, 5, 7}, {0, 16, 900, 144}, {0, 6, 1000, 25}, {0, 33, 70, 9}, {0, 128, 256, 1152},
        {0, 7, 3001, 50}, {1, 1, 1, 1}, {1, 3, 5, 7}, {1, 16, 144, 12544}, {1, 6, 25, 5000}, {1, 100, 50, 70},
        {1, 64, 576, 3136}, {1, 13, 37, 1001},
    };
    int k, pi, oom;
    for (k = 0; k < NELEM(shapes); k++) {
        bool tb = shapes[k][0] != 0;
        int64_t M = shapes[k][1], N = shapes[k][2], K = shapes[k][3], i, r, rows = tb ? N : K, len = tb ? K : N;
        int64_t span = len + 3 * rows + 40;
        float *A, *B, *S, *C0, *C1, *C2;
        int64_t *brow;
        if (quick && M * N * K > 2000000) continue;
        A = (float *)malloc(sizeof(float) * (size_t)(M * K));
        B = (float *)malloc(sizeof(float) * (size_t)(K * N));
        S = (float *)malloc(sizeof(float) * (size_t)span);
        C0 = (float *)malloc(sizeof(float) * (size_t)(M * N));
        C1 = (float *)malloc(sizeof(float) * (size_t)(M * N));
        C2 = (float *)malloc(sizeof(float) * (size_t)(M * N));
        brow = (int64_t *)malloc(sizeof(int64_t) * (size_t)rows);
        if (!A || !B || !S || !C0 || !C1 || !C2 || !brow) exit(2);
        for (i = 0; i < M * K; i++) A[i] = rnd_f();
        for (i = 0; i < span; i++) S[i] = rnd_f();
        for (r = 0; r < rows; r++) {
            brow[r] = rnd_range(0, span - len);             /* rows overlap one another */
            memcpy(B + r * len, S + brow[r], sizeof(float) * (size_t)len);
        }
        for (i = 0; i < M * N; i++) C0[i] = rnd_f();
        memcpy(C1, C0, sizeof(float) * (size_t)(M * N));
        dl__sgemm(pools[0], false, tb, M, N, K, 0.75f, A, K, B, len, 0.5f, C1, N);
        for (oom = 0; oom < 2; oom++)
            for (pi = 0; pi < npools; pi++) {
                memcpy(C2, C0, sizeof(float) * (size_t)(M * N));
                g_alloc_fail = oom;
                dl__sgemm_rows(pools[pi], false, tb, M, N, K, 0.75f, A, K, S, 12345, brow, 0.5f, C2, N);
                g_alloc_fail = 0;
                g_checks++;
                if (memcmp(C1, C2, sizeof(float) * (size_t)(M * N)) != 0) {
                    printf("FAIL: dl__sgemm_rows tb=%d M=%ld N=%ld K=%ld pool %d%s: not the bits of B stored "
                           "plainly\n", (int)tb, (long)M, (long)N, (long)K, pi, oom ? " (out of memory)" : "");
                    g_fail++;
                }
            }
        free(A);
        free(B);
        free(S);
        free(C0);
        free(C1);
        free(C2);
        free(brow);
    }
}

#ifndef DL_NO_THREADS
/* two threads of the caller using one pool at once: the pool's parallel_for
   and its cached pack buffers go to one of them, the other runs serially
   with its own buffers; both results are bit-identical to a lone call */
typedef struct {
    dl__pool *pool;
    const float *A, *B;
    float *C;
    int64_t M, N, K;
    int reps;
} conc_arg;

static void *conc_main(void *varg)
{
    conc_arg *a = (conc_arg *)varg;
    int r;
    for (r = 0; r < a->reps; r++)
        dl__sgemm(a->pool, r & 1, (r >> 1) & 1, a->M, a->N, a->K, 1.0f, a->A, (r & 1) ? a->M : a->K, a->B,
                  ((r >> 1) & 1) ? a->K : a->N, 0.0f, a->C, a->N);
    return NULL;
}

static void test_concurrent(dl__pool *pool, int quick)
{
    const int64_t M = 70, N = 150, K = 200;
    float *A = (float *)malloc(sizeof(float) * (size_t)(M * K)), *B = (float *)malloc(sizeof(float) * (size_t)(K * N));
    float *C[3];
    pthread_t th[2];
    conc_arg ca[2];
    int64_t i;
    int k, ok = 1;
    g_checks++;
    for (k = 0; k < 3; k++) C[k] = (float *)malloc(sizeof(float) * (size_t)(M * N));
    if (!A || !B || !C[0] || !C[1] || !C[2]) exit(2);
    for (i = 0; i < M * K; i++) A[i] = rnd_f();
    for (i = 0; i < K * N; i++) B[i] = rnd_f();
    /* reps = 3 (mod 4): the last call of both has ta = 0, tb = 1 */
    for (k = 0; k < 2; k++) {
        ca[k].pool = pool;
        ca[k].A = A;
        ca[k].B = B;
        ca[k].C = C[k];
        ca[k].M = M;
        ca[k].N = N;
        ca[k].K = K;
        ca[k].reps = quick ? 7 : 203;
        if (pthread_create(&th[k], NULL, conc_main, &ca[k]) != 0) ok = 0;
    }
    for (k = 0; k < 2; k++) pthread_join(th[k], NULL);
    dl__sgemm(NULL, false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C[2], N);
    if (!ok || memcmp(C[0], C[2], sizeof(float) * (size_t)(M * N)) != 0 ||
        memcmp(C[1], C[2], sizeof(float) * (size_t)(M * N)) != 0) {
        printf("FAIL: concurrent dl__sgemm on one pool\n");
        g_fail++;
    }
    free(A);
    free(B);
    for (k = 0; k < 3; k++) free(C[k]);
}
#endif

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
    printf("kernel %dx%d (%s)\n", DL__GEMM_MR, DL__GEMM_NR,
#if defined(DL__GEMM_AVX512)
           "AVX-512"
#elif defined(DL__GEMM_AVX2)
           "AVX2+FMA"
#else
           "portable C"
#endif
    );
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
    test_edges(pools, npools, quick);
    test_model_shapes(pools, npools, quick);
    test_small_direct(pools, npools, quick);
#ifndef DL_NO_THREADS
    test_concurrent(pools[1], quick);
#endif
    test_oom(pools[1]);
    test_rows(pools, npools, quick);
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
