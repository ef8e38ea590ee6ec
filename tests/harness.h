/* tests/harness.h - the tiny test harness every test program uses.
   CHECK(cond, fmt, ...) counts a pass or prints the failure; SKIP(fmt, ...)
   counts a check that could not run and prints why; the program ends with
   TEST_END(), which prints "N passed, M failed" (", K skipped" when K > 0)
   and returns non-zero when anything failed. EXPECT_ERR checks that an op
   failed with a code and a message substring, then clears the error.
   Tensor values reach the host only through th_host/th_host_i64/th_bytes
   (copies), th_f/th_i64 (one element), th_put/th_set (writes) and
   th_same_bytes, never through t->data: `make test` runs every program
   again with its tensors on a strict device, where t->data faults. */
#ifndef DL_TEST_HARNESS_H
#define DL_TEST_HARNESS_H
#include <stdio.h>
#include <string.h>
#include <math.h>

static int th_pass, th_fail, th_skip;

#define CHECK(cond, ...) do { \
    if (cond) th_pass++; \
    else { th_fail++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

#define SKIP(...) do { \
    th_skip++; printf("SKIP %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); \
} while (0)

/* an op returned NULL/err with code and a message containing substr */
#define EXPECT_ERR(ctx, code, substr) do { \
    dl_result th_c = dl_last_error(ctx); const char *th_m = dl_error_message(ctx); \
    CHECK(th_c == (code) && strstr(th_m, (substr)) != NULL, \
          "expected %s with \"%s\", got %s: \"%s\"", dl_result_string(code), (substr), \
          dl_result_string(th_c), th_m); \
    dl_clear_error(ctx); \
} while (0)

#if defined(__GNUC__)
__attribute__((unused))
#endif
static int th_close(const float *a, const float *b, long n, double rtol, double atol, long *where)
{
    long i;
    if (!a || !b) return 0;
    for (i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isinf(b[i]) ? a[i] != b[i] : !(d <= atol + rtol * fabs((double)b[i]))) {   /* (an infinity: the same one) */
            if (where) *where = i;
            return 0;
        }
    }
    return 1;
}

/* th_close, except that where b is NaN, a must be NaN (and is then close) */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static int th_close_nan(const float *a, const float *b, long n, double rtol, double atol, long *where)
{
    long i;
    if (!a || !b) return 0;
    for (i = 0; i < n; i++) {
        if (b[i] != b[i] ? a[i] == a[i] : !th_close(a + i, b + i, 1, rtol, atol, NULL)) {
            if (where) *where = i;
            return 0;
        }
    }
    return 1;
}

/* ---- host access to tensor data. Tests never dereference t->data: on a
   strict device (DL_STRICT=1 with DL_DEVICE=cpu:1) that pointer is tagged and
   faults at once, as a GPU pointer would. These go through the transfer
   points (dl_read, dl_read_int64, dl_write) or the tensor's backend
   (download/upload of single elements, which skip dl_write's graph checks as
   the direct stores they replace did). Host copies come from a ring of
   TH_RING buffers: a pointer stays valid for the next TH_RING - 1 copies, and
   whatever the ring holds is freed at exit. */
#if defined(DL_H) && defined(DL_IMPLEMENTATION)
#include <stdlib.h>
#if defined(__GNUC__)
#define TH_UNUSED __attribute__((unused))
#else
#define TH_UNUSED
#endif

/* th__esize, th__down, th__up: here, or from tests/th_impl.c's object */
#ifdef DL__IMPLEMENTED
#define TH_PRIM TH_UNUSED static
#include "th_prims.h"
#else
#ifdef __cplusplus
extern "C" {
#endif
size_t th__esize(const dl_tensor *t);
void th__down(dl_tensor *t, void *dst, size_t off, size_t n);
void th__up(dl_tensor *t, size_t off, const void *src, size_t n);
#ifdef __cplusplus
}
#endif
#endif

#define TH_RING 64
static void *th_ring[TH_RING];
static int th_ring_pos, th_ring_armed;

TH_UNUSED static void th_ring_free(void)
{
    int i;
    for (i = 0; i < TH_RING; i++) { free(th_ring[i]); th_ring[i] = NULL; }
}

TH_UNUSED static void *th_ring_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { printf("harness: out of host memory for a %zu-byte copy\n", bytes); exit(2); }
    if (!th_ring_armed) { atexit(th_ring_free); th_ring_armed = 1; }
    free(th_ring[th_ring_pos]);
    th_ring[th_ring_pos] = p;
    th_ring_pos = (th_ring_pos + 1) % TH_RING;
    return p;
}

/* a copy that could not be made is a failed check; its buffer reads as NaN (-1) */
TH_UNUSED static void th_copy_failed(const char *fn, dl_tensor *t, void *h, size_t bytes)
{
    th_fail++;
    printf("FAIL %s: reading a tensor (%lld elements) back: %s\n", fn, (long long)t->numel,
           dl_error_message(dl_tensor_ctx(t)));
    memset(h, 0xff, bytes);
}

/* the values of a float32 tensor on the host (ring buffer); NULL if t is NULL */
TH_UNUSED static float *th_host(dl_tensor *t)
{
    float *h;
    size_t bytes;
    if (!t) return NULL;
    bytes = sizeof(float) * (size_t)t->numel;
    h = (float *)th_ring_alloc(bytes);
    if (dl_read(t, h, t->numel) != DL_OK) th_copy_failed("th_host", t, h, bytes);
    return h;
}

/* the values of an integer (or float) tensor as int64 on the host (ring
   buffer); NULL if t is NULL */
TH_UNUSED static int64_t *th_host_i64(dl_tensor *t)
{
    int64_t *h;
    size_t bytes;
    if (!t) return NULL;
    bytes = sizeof(int64_t) * (size_t)t->numel;
    h = (int64_t *)th_ring_alloc(bytes);
    if (dl_read_int64(t, h, t->numel) != DL_OK) th_copy_failed("th_host_i64", t, h, bytes);
    return h;
}

/* t's raw bytes on the host (ring buffer): numel * element size */
TH_UNUSED static void *th_bytes(dl_tensor *t)
{
    size_t n;
    void *h;
    if (!t) return NULL;
    n = (size_t)t->numel * th__esize(t);
    h = th_ring_alloc(n);
    if (n) th__down(t, h, 0, n);
    return h;
}

/* element i of a float32 tensor (NaN when t is NULL, not float32 or i is out of range) */
TH_UNUSED static float th_f(dl_tensor *t, int64_t i)
{
    float v;
    if (!t || t->dtype != DL_DTYPE_F32 || i < 0 || i >= t->numel) return NAN;
    th__down(t, &v, (size_t)i * sizeof v, sizeof v);
    return v;
}

/* element i of an int64 or int32 tensor (INT64_MIN when t is NULL, float32 or i is out of range) */
TH_UNUSED static int64_t th_i64(dl_tensor *t, int64_t i)
{
    if (!t || i < 0 || i >= t->numel) return INT64_MIN;
    if (t->dtype == DL_DTYPE_I64) {
        int64_t v;
        th__down(t, &v, (size_t)i * sizeof v, sizeof v);
        return v;
    }
    if (t->dtype == DL_DTYPE_I32) {
        int32_t v;
        th__down(t, &v, (size_t)i * sizeof v, sizeof v);
        return v;
    }
    return INT64_MIN;
}

/* writes host's numel floats into t (float32), as a direct store would */
TH_UNUSED static void th_put(dl_tensor *t, const float *host)
{
    if (t && t->dtype == DL_DTYPE_F32 && t->numel)
        th__up(t, 0, host, sizeof(float) * (size_t)t->numel);
}

/* element i of a float32 tensor = v */
TH_UNUSED static void th_set(dl_tensor *t, int64_t i, float v)
{
    if (t && t->dtype == DL_DTYPE_F32 && i >= 0 && i < t->numel)
        th__up(t, (size_t)i * sizeof v, &v, sizeof v);
}

/* a and b hold the same bytes (same dtype and numel) */
TH_UNUSED static int th_same_bytes(dl_tensor *a, dl_tensor *b)
{
    size_t n;
    if (!a || !b || a->dtype != b->dtype || a->numel != b->numel) return 0;
    n = (size_t)a->numel * th__esize(a);
    return memcmp(th_bytes(a), th_bytes(b), n) == 0;
}

/* every tensor of m's state_dict, in order, as one byte blob in dst (cap
   bytes); the bytes written, 0 when they do not fit */
TH_UNUSED static size_t th_module_bytes(dl_module *m, unsigned char *dst, size_t cap)
{
    const dl_named_tensor *sd;
    int n = dl_module_state_dict(m, &sd), i;
    size_t pos = 0;
    for (i = 0; i < n; i++) {
        size_t b = (size_t)sd[i].t->numel * th__esize(sd[i].t);
        if (pos + b > cap) return 0;
        if (b) memcpy(dst + pos, th_bytes(sd[i].t), b);
        pos += b;
    }
    return pos;
}

#ifdef DL__IMPLEMENTED   /* (dl_optim's fields) */
/* th_module_bytes, then every state tensor of the optimizer o (momentum,
   Adam's moments) after it: a training run's whole state as bytes */
TH_UNUSED static size_t th_train_bytes(dl_module *m, dl_optim *o, unsigned char *dst, size_t cap)
{
    size_t n = th_module_bytes(m, dst, cap);
    int i, k;
    for (k = 0; k < 3 && n; k++) {
        if (!o->s[k]) continue;
        for (i = 0; i < o->n; i++) {
            dl_tensor *t = o->s[k][i];
            size_t b = sizeof(float) * (size_t)t->numel;
            if (n + b > cap) return 0;
            if (b) memcpy(dst + n, th_bytes(t), b);
            n += b;
        }
    }
    return n;
}
#endif
#endif

#define TEST_END() do { \
    if (th_skip) printf("%d passed, %d failed, %d skipped\n", th_pass, th_fail, th_skip); \
    else printf("%d passed, %d failed\n", th_pass, th_fail); \
    return th_fail ? 1 : 0; \
} while (0)

#endif
