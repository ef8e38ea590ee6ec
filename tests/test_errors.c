/* tests/test_errors.c - every bad-input path of dl.h: the op returns NULL (or
   an error code), dl_last_error() has the right code, the message names the
   op and the rule, and the context keeps working afterwards. Also: NULL
   inputs fail silently (the first cause stays the reported one), stale step
   tensors, autograd misuse, huge sizes, memory limits and anomaly mode. */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>

#ifdef DL_ABORT_ON_ERROR
#error "test_errors.c checks error returns: build it without DL_ABORT_ON_ERROR"
#endif

static dl_ctx *C;

/* a small valid computation still succeeds and leaves no error */
static void works(int line)
{
    dl_tensor *a = dl_full(C, DL_SHAPE(2, 2), 1.5f);
    dl_tensor *s = dl_sum(dl_add(a, a), DL_ALL, false);
    float v = s ? dl_item(s) : -1.0f;
    CHECK(s != NULL && v == 12.0f && dl_last_error(C) == DL_OK,
          "line %d: the context does not work after the error: got %g, %s: %s", line, (double)v,
          dl_result_string(dl_last_error(C)), dl_error_message(C));
    dl_clear_error(C);
}
#define WORKS() works(__LINE__)

/* expr returns NULL with code and a message containing substr; then the
   context works */
#define BAD(expr, code, substr) do { \
    dl_clear_error(C); { \
    dl_tensor *bad_ = (expr); \
    CHECK(bad_ == NULL, "line %d: %s returned a tensor", __LINE__, #expr); } \
    EXPECT_ERR(C, code, substr); \
    WORKS(); \
} while (0)

/* BAD for the calls that return a count: -1 */
#define BADN(expr, code, substr) do { \
    dl_clear_error(C); { \
    int badn_ = (expr); \
    CHECK(badn_ == -1, "line %d: %s returned %d", __LINE__, #expr, badn_); } \
    EXPECT_ERR(C, code, substr); \
    WORKS(); \
} while (0)

/* like EXPECT_ERR with two substrings */
#define EXPECT_ERR2(ctx, code, s1, s2) do { \
    dl_result c2_ = dl_last_error(ctx); const char *m2_ = dl_error_message(ctx); \
    CHECK(c2_ == (code) && strstr(m2_, (s1)) && strstr(m2_, (s2)), \
          "line %d: expected %s with \"%s\" and \"%s\", got %s: \"%s\"", __LINE__, \
          dl_result_string(code), (s1), (s2), dl_result_string(c2_), m2_); \
    dl_clear_error(ctx); \
} while (0)

/* a NULL operand: NULL back, and no new error */
#define NULLOP(expr) do { \
    dl_tensor *r_; \
    dl_clear_error(C); \
    r_ = (expr); \
    CHECK(r_ == NULL && dl_last_error(C) == DL_OK, "%s: expected NULL and no error, got %s / %s: %s", \
          #expr, r_ ? "a tensor" : "NULL", dl_result_string(dl_last_error(C)), dl_error_message(C)); \
    dl_clear_error(C); \
} while (0)

static dl_tensor *T(int r, int c) { return dl_randn(C, DL_SHAPE(r, c)); }

static int nlog;
static void count_log(void *user, const char *m)
{
    (void)m;
    (*(int *)user)++;
}

static dl_tensor *id_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    (void)fc; (void)n; (void)user;
    return dl_copy(in[0]);
}

static dl_tensor *gc_id(void *user, dl_tensor *const *in) { (void)user; return in[0]; }

static void shape_errors(void)
{
    dl_tensor *a = T(2, 3), *b4 = dl_randn(C, DL_SHAPE(4)), *i64;
    int64_t iv[6] = {0, 1, 2, 3, 4, 5};
    dl_tensor *arr[3];

    /* binary broadcast mismatch */
    BAD(dl_add(a, b4), DL_ERR_SHAPE, "do not broadcast");
    a = T(2, 3); b4 = dl_randn(C, DL_SHAPE(4));
    dl_add(a, b4);
    EXPECT_ERR2(C, DL_ERR_SHAPE, "dl_add", "(2,3)");
    dl_mul(dl_randn(C, DL_SHAPE(2, 3, 4)), dl_randn(C, DL_SHAPE(3, 3)));
    EXPECT_ERR2(C, DL_ERR_SHAPE, "dl_mul", "size 4 with size 3");
    BAD(dl_maximum(T(3, 2), T(2, 3)), DL_ERR_SHAPE, "dl_maximum");
    BAD(dl_div(T(3, 1), dl_randn(C, DL_SHAPE(2, 2, 2))), DL_ERR_SHAPE, "do not broadcast");

    /* matmul */
    BAD(dl_matmul(T(2, 3), T(4, 5)), DL_ERR_SHAPE, "a.shape[1]=3 must equal b.shape[0]=4");
    BAD(dl_matmul(dl_randn(C, DL_SHAPE(2, 3, 4)), dl_randn(C, DL_SHAPE(2, 5, 6))), DL_ERR_SHAPE,
        "a.shape[2]=4 must equal b.shape[1]=5");
    BAD(dl_matmul(dl_randn(C, DL_SHAPE(3)), dl_randn(C, DL_SHAPE(4))), DL_ERR_SHAPE, "must equal");
    BAD(dl_matmul(T(2, 3), dl_randn(C, DL_SHAPE(4))), DL_ERR_SHAPE, "=3 must equal");
    BAD(dl_matmul(dl_randn(C, DL_SHAPE(2, 3, 4)), dl_randn(C, DL_SHAPE(3, 4, 5))), DL_ERR_SHAPE,
        "batch dims do not broadcast");
    BAD(dl_matmul(dl_randn(C, dl_shape_make(0, NULL)), T(2, 2)), DL_ERR_SHAPE, "at least 1 dim");
    BAD(dl_matmul(T(2, 2), dl_randn(C, dl_shape_make(0, NULL))), DL_ERR_SHAPE, "at least 1 dim");
    dl_matmul(T(2, 3), T(4, 5));
    EXPECT_ERR2(C, DL_ERR_SHAPE, "dl_matmul", "(4,5)");

    BAD(dl_unflatten(T(2, 12), 1, DL_SHAPE(5, -1)), DL_ERR_SHAPE, "dl_unflatten: sizes (5,-1) do not multiply to the size of dim 1 of (2,12) (12)");
    BAD(dl_unflatten(T(2, 12), 2, DL_SHAPE(3, 4)), DL_ERR_ARG, "dl_unflatten: dim 2 is out of range");
    BAD(dl_unflatten(T(2, 12), 1, DL_SHAPE(-1, -1)), DL_ERR_ARG, "one of them -1");
    BAD(dl_unflatten(T(2, 12), 1, DL_SHAPE(-2, 6)), DL_ERR_ARG, "each size must be >= 0");
    BAD(dl_unflatten(T(2, 12), 1, dl_shape_make(0, NULL)), DL_ERR_ARG, "sizes has 0 dims; it needs 1..8");
    BAD(dl_unflatten(dl_randn(C, DL_SHAPE(0, 4)), 0, DL_SHAPE(-1, 0)), DL_ERR_SHAPE, "the -1 is ambiguous");
    BAD(dl_unflatten(T(2, 12), 1, DL_SHAPE(1, 1, 1, 1, 1, 1, 1, 12)), DL_ERR_SHAPE, "would have 9 dims; at most 8");
    BAD(dl_unflatten(dl_zeros(C, DL_SHAPE(0)), 0, DL_SHAPE((int64_t)1 << 62, 4, 0)), DL_ERR_SHAPE,
        "dl_unflatten: sizes (4611686018427387904,4,0) multiply past int64");
    BAD(dl_unflatten(dl_zeros(C, DL_SHAPE(0)), 0, DL_SHAPE(-1, (int64_t)1 << 40, (int64_t)1 << 40)), DL_ERR_SHAPE,
        "multiply past int64");

    /* cat / stack */
    arr[0] = T(2, 3); arr[1] = dl_randn(C, dl_shape_make(0, NULL));
    BAD(dl_cat(2, arr, 0), DL_ERR_SHAPE, "input 1 () has 0 dims but input 0 (2,3) has 2");
    arr[0] = dl_randn(C, DL_SHAPE(0)); arr[1] = dl_randn(C, dl_shape_make(0, NULL));
    BAD(dl_cat(2, arr, 0), DL_ERR_SHAPE, "dl_cat: input 1 is 0-d (shape ()): only tensors with dims");
    arr[0] = T(2, 3); arr[1] = T(2, 4);
    BAD(dl_cat(2, arr, 0), DL_ERR_SHAPE, "dl_cat: input 1 (2,4) does not fit input 0 (2,3): all dims but dim 0 must match");
    arr[0] = T(2, 3); arr[1] = dl_randn(C, DL_SHAPE(3));
    BAD(dl_cat(2, arr, 0), DL_ERR_SHAPE, "input 1 (3) has 1 dims but input 0 (2,3) has 2");
    arr[0] = dl_randn(C, DL_SHAPE(0)); arr[1] = dl_randn(C, DL_SHAPE(3)); arr[2] = T(2, 3);   /* (0,) skipped */
    BAD(dl_cat(3, arr, 0), DL_ERR_SHAPE, "input 2 (2,3) has 2 dims but input 1 (3) has 1");
    i64 = dl_from_int64(C, DL_SHAPE(2, 3), iv);
    arr[0] = T(2, 3); arr[1] = i64;
    /* a dtype mismatch is a dtype error (DL_ERR_DTYPE: "wrong dtype for the op") */
    BAD(dl_cat(2, arr, 0), DL_ERR_DTYPE, "dtype");
    arr[0] = T(2, 3); arr[1] = T(2, 3); arr[2] = T(3, 2);
    BAD(dl_stack(3, arr, 0), DL_ERR_SHAPE, "same shape");
    arr[0] = T(2, 3); arr[1] = dl_randn(C, DL_SHAPE(6));
    BAD(dl_stack(2, arr, 1), DL_ERR_SHAPE, "dl_stack");

    /* expand / sum_to */
    BAD(dl_expand(T(2, 3), DL_SHAPE(4, 3)), DL_ERR_SHAPE, "cannot be broadcast");
    BAD(dl_expand(T(2, 3), DL_SHAPE(3)), DL_ERR_SHAPE, "dl_expand");
    BAD(dl_expand(T(2, 1), DL_SHAPE(2, -2)), DL_ERR_SHAPE, "dl_expand");
    BAD(dl_sum_to(T(2, 3), DL_SHAPE(4, 3)), DL_ERR_SHAPE, "cannot be summed");
    BAD(dl_sum_to(dl_randn(C, DL_SHAPE(3)), DL_SHAPE(2, 3)), DL_ERR_SHAPE, "dl_sum_to");
    BAD(dl_sum_to(T(2, 3), DL_SHAPE(2, 2)), DL_ERR_SHAPE, "dl_sum_to");

    /* permute */
    BAD(dl_permute(T(2, 3), DL_DIMS(0, 0)), DL_ERR_ARG, "not a permutation");
    BAD(dl_permute(T(2, 3), DL_DIMS(0, 2)), DL_ERR_ARG, "not a permutation");
    BAD(dl_permute(T(2, 3), DL_DIMS(1, -2, 0)), DL_ERR_ARG, "dl_permute");
    BAD(dl_permute(T(2, 3), DL_DIMS(-1, 1)), DL_ERR_ARG, "not a permutation");

    /* reshape */
    BAD(dl_reshape(T(2, 3), DL_SHAPE(4, 2)), DL_ERR_SHAPE, "element counts must be equal");
    BAD(dl_reshape(T(2, 3), DL_SHAPE(-1, -1)), DL_ERR_SHAPE, "more than one -1");
    BAD(dl_reshape(T(2, 3), DL_SHAPE(4, -1)), DL_ERR_SHAPE, "-1 has no whole-number size");
    BAD(dl_reshape(T(2, 3), DL_SHAPE(0, -1)), DL_ERR_SHAPE, "dl_reshape");
    BAD(dl_reshape(T(2, 3), DL_SHAPE(-2, -3)), DL_ERR_SHAPE, "negative size");
    BAD(dl_flatten(T(2, 3), 1, 0), DL_ERR_ARG, "comes after");
}

static void dim_errors(void)
{
    dl_tensor *arr[2];
    BAD(dl_sum(T(2, 3), DL_DIMS(2), false), DL_ERR_ARG, "out of range");
    BAD(dl_sum(T(2, 3), DL_DIMS(-3), true), DL_ERR_ARG, "out of range");
    BAD(dl_sum(T(2, 3), DL_DIMS(1, 1), false), DL_ERR_ARG, "twice");
    BAD(dl_sum(T(2, 3), DL_DIMS(1, -1), false), DL_ERR_ARG, "twice");
    BAD(dl_mean(T(2, 3), DL_DIMS(0, 5), false), DL_ERR_ARG, "dl_mean");
    BAD(dl_var(T(2, 3), DL_DIMS(2), 1, false), DL_ERR_ARG, "dl_var");
    BAD(dl_std(T(2, 3), DL_DIMS(2), 1, false), DL_ERR_ARG, "dl_std");
    BAD(dl_std(T(2, 3), DL_DIMS(0, -2), 1, false), DL_ERR_ARG, "dl_std");
    BAD(dl_norm(T(2, 3), DL_DIMS(2), false), DL_ERR_ARG, "dl_norm");
    BAD(dl_norm(T(2, 3), DL_DIMS(0, 0), false), DL_ERR_ARG, "twice");
    BAD(dl_logsumexp(T(2, 3), DL_DIMS(2), false), DL_ERR_ARG, "dl_logsumexp: dim 2 is out of range for a tensor of shape (2,3) (valid: -2..1)");
    BAD(dl_logsumexp(T(2, 3), DL_DIMS(1, -1), true), DL_ERR_ARG, "dl_logsumexp: dim 1 appears twice in dims");
    BAD(dl_cumsum(T(2, 3), 2), DL_ERR_ARG, "dl_cumsum: dim 2 is out of range for a tensor of shape (2,3) (valid: -2..1)");
    BAD(dl_cumsum(T(2, 3), -3), DL_ERR_ARG, "dl_cumsum: dim -3 is out of range");
    BAD(dl_cumsum(dl_full(C, DL_SHAPE(), 1.0f), 1), DL_ERR_ARG, "dl_cumsum: dim 1 is out of range for a tensor of shape ()");
    BAD(dl_max(T(2, 3), DL_DIMS(2), false), DL_ERR_ARG, "out of range");
    BAD(dl_min(T(2, 3), DL_DIMS(-4), false), DL_ERR_ARG, "out of range");
    BAD(dl_argmax(T(2, 3), 2, false), DL_ERR_ARG, "out of range");
    BAD(dl_argmax(T(2, 3), -3, true), DL_ERR_ARG, "dl_argmax");
    BAD(dl_max_dim(T(2, 3), 2, false, NULL), DL_ERR_ARG, "dl_max_dim: dim 2 is out of range");
    BAD(dl_min_dim(T(2, 3), -3, false, NULL), DL_ERR_ARG, "dl_min_dim: dim -3 is out of range");
    BAD(dl_min(T(2, 3), DL_DIMS(2), false), DL_ERR_ARG, "dl_min: dim 2 is out of range");
    BAD(dl_softmax(T(2, 3), 2), DL_ERR_ARG, "out of range");
    {   /* a 0-d tensor takes dim 0 and -1 (as PyTorch), nothing else */
        dl_tensor *s0 = dl_full(C, dl_shape_make(0, NULL), 1.0f);
        BAD(dl_sum(s0, DL_DIMS(1), false), DL_ERR_ARG, "dl_sum: dim 1 is out of range for a tensor of shape () (valid: -1..0)");
        BAD(dl_sum(s0, DL_DIMS(0, -1), false), DL_ERR_ARG, "dl_sum: dim 0 appears twice");
        BAD(dl_max(s0, DL_DIMS(-2), false), DL_ERR_ARG, "dl_max: dim -2 is out of range");
        BAD(dl_softmax(s0, 1), DL_ERR_ARG, "dl_softmax: dim 1 is out of range for a tensor of shape () (valid: -1..0)");
        BAD(dl_log_softmax(s0, -2), DL_ERR_ARG, "dl_log_softmax: dim -2 is out of range");
        BAD(dl_argmax(s0, 1, false), DL_ERR_ARG, "dl_argmax: dim 1 is out of range for a tensor of shape ()");
        BAD(dl_max_dim(s0, -2, false, NULL), DL_ERR_ARG, "dl_max_dim: dim -2 is out of range");
    }
    BAD(dl_log_softmax(T(2, 3), -3), DL_ERR_ARG, "dl_log_softmax");
    BAD(dl_narrow(T(2, 3), 2, 0, 1), DL_ERR_ARG, "out of range");
    BAD(dl_transpose(T(2, 3), 0, 2), DL_ERR_ARG, "out of range");
    BAD(dl_transpose(T(2, 3), -3, 1), DL_ERR_ARG, "dl_transpose");
    BAD(dl_squeeze(T(2, 3), 2), DL_ERR_ARG, "out of range");
    BAD(dl_unsqueeze(T(2, 3), 3), DL_ERR_ARG, "out of range");
    BAD(dl_unsqueeze(T(2, 3), -4), DL_ERR_ARG, "dl_unsqueeze");
    BAD(dl_flatten(T(2, 3), 0, 2), DL_ERR_ARG, "out of range");
    BAD(dl_flatten(T(2, 3), -3, 1), DL_ERR_ARG, "dl_flatten");
    arr[0] = T(2, 3); arr[1] = T(2, 3);
    BAD(dl_cat(2, arr, 2), DL_ERR_ARG, "out of range");
    BAD(dl_stack(2, arr, 3), DL_ERR_ARG, "out of range");
    dl_sum(T(2, 3), DL_DIMS(2), false);
    EXPECT_ERR2(C, DL_ERR_ARG, "dl_sum", "(2,3)");

    /* narrow out of range */
    BAD(dl_narrow(T(2, 3), 1, 2, 2), DL_ERR_ARG, "do not fit");
    BAD(dl_narrow(T(2, 3), 1, 4, 0), DL_ERR_ARG, "do not fit");
    BAD(dl_narrow(T(2, 3), 0, 0, -1), DL_ERR_ARG, "do not fit");
    BAD(dl_narrow(T(2, 3), 1, -4, 1), DL_ERR_ARG, "dl_narrow");

    /* split / chunk / unbind */
    {
        dl_tensor *ps[8];
        int64_t sz[3] = {1, 1, 2}, neg[2] = {4, -1};
        int r;
        BADN(dl_split(T(2, 3), 1, 2, 8, ps), DL_ERR_ARG, "dl_split: dim 2 is out of range");
        BADN(dl_split(T(2, 3), 0, 1, 8, ps), DL_ERR_ARG, "dl_split: size 0: pieces must have a size >= 1");
        BADN(dl_split(T(2, 3), -2, 1, 8, ps), DL_ERR_ARG, "size -2");
        BADN(dl_split(T(2, 3), 1, 1, 2, ps), DL_ERR_ARG, "splits into 3 pieces along dim 1, but out holds 2");
        BADN(dl_split(T(2, 3), 1, 1, 8, NULL), DL_ERR_ARG, "dl_split: out is NULL");
        BADN(dl_split(dl_full(C, dl_shape_make(0, NULL), 1.0f), 1, 0, 8, ps), DL_ERR_SHAPE, "dl_split: t is 0-d");
        BADN(dl_split_sizes(T(2, 3), 3, sz, 1, ps), DL_ERR_ARG,
             "dl_split_sizes: the 3 sizes sum to 4, but dim 1 of t (2,3) has size 3; they must sum to it");
        BADN(dl_split_sizes(T(2, 3), 2, neg, 1, ps), DL_ERR_ARG, "sizes[1] = -1 is negative");
        BADN(dl_split_sizes(T(2, 3), 2, NULL, 1, ps), DL_ERR_ARG, "sizes is NULL");
        BADN(dl_split_sizes(T(2, 3), -1, sz, 1, ps), DL_ERR_ARG, "n must be >= 0");
        BADN(dl_split_sizes(T(2, 3), 3, sz, -3, ps), DL_ERR_ARG, "dl_split_sizes: dim -3 is out of range");
        BADN(dl_chunk(T(2, 3), 0, 1, ps), DL_ERR_ARG, "dl_chunk: chunks = 0; it must be >= 1");
        BADN(dl_chunk(T(2, 3), -1, 1, ps), DL_ERR_ARG, "chunks = -1");
        BADN(dl_chunk(T(2, 3), 2, 2, ps), DL_ERR_ARG, "dl_chunk: dim 2 is out of range");
        BADN(dl_chunk(T(2, 3), 2, 0, NULL), DL_ERR_ARG, "dl_chunk: out is NULL");
        BADN(dl_unbind(T(2, 3), -3, 8, ps), DL_ERR_ARG, "dl_unbind: dim -3 is out of range");
        BADN(dl_unbind(T(2, 3), 1, 2, ps), DL_ERR_ARG, "has 3 slices along dim 1, but out holds 2");
        BADN(dl_unbind(dl_full(C, dl_shape_make(0, NULL), 1.0f), 0, 8, ps), DL_ERR_SHAPE, "dl_unbind: t is 0-d");
        dl_clear_error(C);
        r = dl_split(NULL, 1, 0, 8, ps) + dl_split_sizes(NULL, 3, sz, 0, ps) + dl_chunk(NULL, 2, 0, ps) +
            dl_unbind(NULL, 0, 8, ps);
        CHECK(r == -4 && dl_last_error(C) == DL_OK, "split of NULL: %d, %s", r, dl_error_message(C));
    }

    /* reductions over nothing */
    BAD(dl_max(dl_zeros(C, DL_SHAPE(2, 0)), DL_DIMS(1), false), DL_ERR_SHAPE, "size 0");
    BAD(dl_max_dim(dl_zeros(C, DL_SHAPE(2, 0)), 1, false, NULL), DL_ERR_SHAPE,
        "dl_max_dim: cannot reduce dim 1 of size 0 of t (2,0) (max of nothing)");
    BAD(dl_argmax(dl_zeros(C, DL_SHAPE(0, 3)), 0, false), DL_ERR_SHAPE, "size 0");

    /* clamp: lo > hi and NaN bounds are not errors (torch.clamp gives hi, NaN;
       the values are golden cases, clamp/crossed, clamp/nanlo in edges.bin) */
    {
        float v[6];
        dl_clear_error(C);
        CHECK(dl_read(dl_clamp(T(2, 3), 1.0f, -1.0f), v, 6) == DL_OK && v[0] == -1.0f && v[5] == -1.0f,
              "dl_clamp lo > hi: hi everywhere");
        CHECK(dl_read(dl_clamp(T(2, 3), NAN, 1.0f), v, 6) == DL_OK && v[0] != v[0] && v[5] != v[5],
              "dl_clamp NaN lo: NaN everywhere");
        WORKS();
    }
}

static void dtype_errors(void)
{
    int64_t iv[6] = {0, 1, 2, 3, 4, 5};
    int32_t jv[6] = {0, 1, 2, 3, 4, 5};
    dl_tensor *i64 = dl_from_int64(C, DL_SHAPE(2, 3), iv), *i32 = dl_from_int32(C, DL_SHAPE(2, 3), jv);
    BAD(dl_exp(i64), DL_ERR_DTYPE, "dtype int64; this op needs float32");
    BAD(dl_add(T(2, 3), i64), DL_ERR_DTYPE, "int64");
    BAD(dl_mul(i32, T(2, 3)), DL_ERR_DTYPE, "int32");
    BAD(dl_matmul(i64, T(3, 2)), DL_ERR_DTYPE, "dl_matmul");
    BAD(dl_sum(i64, DL_ALL, false), DL_ERR_DTYPE, "dl_sum");
    BAD(dl_norm(i64, DL_ALL, false), DL_ERR_DTYPE, "dl_norm");
    BAD(dl_logsumexp(i64, DL_DIMS(0), false), DL_ERR_DTYPE, "dl_logsumexp: t (2,3) has dtype int64; this op needs float32");
    BAD(dl_max(i64, DL_DIMS(0), false), DL_ERR_DTYPE, "dl_max");
    BAD(dl_max_dim(i64, 0, false, NULL), DL_ERR_DTYPE, "dl_max_dim");
    BAD(dl_softmax(i32, 1), DL_ERR_DTYPE, "dl_softmax");
    BAD(dl_argmax(i64, 1, false), DL_ERR_DTYPE, "dl_argmax");
    BAD(dl_relu(i64), DL_ERR_DTYPE, "dl_relu");
    CHECK(dl_data(i64) == NULL, "dl_data of int64 is NULL");
    EXPECT_ERR(C, DL_ERR_DTYPE, "dl_data");
    {
        float out[6];
        dl_clear_error(C);
        CHECK(dl_read(i64, out, 6) == DL_ERR_DTYPE, "dl_read of int64 gives DL_ERR_DTYPE");
        EXPECT_ERR(C, DL_ERR_DTYPE, "dl_read");
        CHECK(dl_item(dl_from_int64(C, DL_SHAPE(1), iv)) != dl_item(dl_from_int64(C, DL_SHAPE(1), iv)),
              "dl_item of int64 is NaN");
        EXPECT_ERR(C, DL_ERR_DTYPE, "dl_item");
    }
    /* requires_grad: only float leaves */
    BAD(dl_requires_grad(i64, true), DL_ERR_DTYPE, "only float32");
    BAD(dl_requires_grad(i32, true), DL_ERR_DTYPE, "dl_requires_grad");
    {
        dl_tensor *x = dl_requires_grad(T(2, 3), true);
        dl_tensor *y = dl_mul(x, x);
        /* torch: y.requires_grad_() on an output that requires grad does
           nothing (a port's WGAN-GP x_hat); requires_grad_(False) raises */
        CHECK(dl_requires_grad(y, true) == y && y->requires_grad && dl_last_error(C) == DL_OK,
              "dl_requires_grad(y, true) on an output that requires grad: y, as torch");
        BAD(dl_requires_grad(y, false), DL_ERR_GRAPH, "not a leaf");
        BAD(dl_requires_grad(y, false), DL_ERR_GRAPH, "dl_detach");
        CHECK(dl_requires_grad(dl_detach(y), true) != NULL, "a detached copy can require grad");
    }
    WORKS();
}

static void null_inputs(void)
{
    dl_tensor *x = T(2, 3), *arr[2];
    float buf[4];
    dl_function idf;
    idf.name = "id"; idf.forward = id_fwd; idf.backward = NULL;
    arr[0] = x; arr[1] = NULL;
    NULLOP(dl_add(NULL, x));
    NULLOP(dl_add(x, NULL));
    NULLOP(dl_sub(NULL, NULL));
    NULLOP(dl_mul(x, NULL));
    NULLOP(dl_div(NULL, x));
    NULLOP(dl_maximum(NULL, x));
    NULLOP(dl_minimum(x, NULL));
    NULLOP(dl_matmul(x, NULL));
    NULLOP(dl_matmul(NULL, x));
    NULLOP(dl_relu(NULL));
    NULLOP(dl_neg(NULL));
    NULLOP(dl_exp(NULL));
    NULLOP(dl_log(NULL));
    NULLOP(dl_sqrt(NULL));
    NULLOP(dl_abs(NULL));
    NULLOP(dl_erf(NULL));
    NULLOP(dl_sin(NULL));
    NULLOP(dl_cos(NULL));
    NULLOP(dl_log1p(NULL));
    NULLOP(dl_expm1(NULL));
    NULLOP(dl_rsqrt(NULL));
    NULLOP(dl_sigmoid(NULL));
    NULLOP(dl_tanh(NULL));
    NULLOP(dl_gelu(NULL));
    NULLOP(dl_leaky_relu(NULL, 0.1f));
    NULLOP(dl_pow(NULL, 2.0f));
    NULLOP(dl_clamp(NULL, 0.0f, 1.0f));
    NULLOP(dl_clamp(NULL, 1.0f, 0.0f));
    NULLOP(dl_add_scalar(NULL, 1.0f));
    NULLOP(dl_sub_scalar(NULL, 1.0f));
    NULLOP(dl_mul_scalar(NULL, 1.0f));
    NULLOP(dl_div_scalar(NULL, 1.0f));
    NULLOP(dl_rsub_scalar(NULL, 1.0f));
    NULLOP(dl_sum(NULL, DL_ALL, 0));
    NULLOP(dl_mean(NULL, DL_DIMS(0), 1));
    NULLOP(dl_max(NULL, DL_DIMS(0), 0));
    NULLOP(dl_max_dim(NULL, 0, 0, NULL));
    NULLOP(dl_min_dim(NULL, 0, 0, NULL));
    NULLOP(dl_min(NULL, DL_ALL, 0));
    NULLOP(dl_var(NULL, DL_ALL, 1, 0));
    NULLOP(dl_std(NULL, DL_ALL, 1, 0));
    NULLOP(dl_norm(NULL, DL_ALL, 0));
    NULLOP(dl_logsumexp(NULL, DL_ALL, 0));
    NULLOP(dl_cumsum(NULL, 0));
    NULLOP(dl_argmax(NULL, 0, 0));
    NULLOP(dl_softmax(NULL, 0));
    NULLOP(dl_log_softmax(NULL, 0));
    NULLOP(dl_reshape(NULL, DL_SHAPE(6)));
    NULLOP(dl_flatten(NULL, 0, -1));
    NULLOP(dl_unflatten(NULL, 0, DL_SHAPE(1)));
    NULLOP(dl_squeeze(NULL, 0));
    NULLOP(dl_unsqueeze(NULL, 0));
    NULLOP(dl_permute(NULL, DL_DIMS(1, 0)));
    NULLOP(dl_transpose(NULL, 0, 1));
    NULLOP(dl_narrow(NULL, 0, 0, 1));
    NULLOP(dl_cat(2, arr, 0));
    NULLOP(dl_cat(2, NULL, 0));
    NULLOP(dl_stack(2, arr, 0));
    NULLOP(dl_expand(NULL, DL_SHAPE(2, 3)));
    NULLOP(dl_sum_to(NULL, DL_SHAPE(3)));
    NULLOP(dl_copy(NULL));
    NULLOP(dl_keep(NULL));
    NULLOP(dl_detach(NULL));
    NULLOP(dl_to(NULL, dl_cpu()));
    NULLOP(dl_zeros_like(NULL));
    NULLOP(dl_ones_like(NULL));
    NULLOP(dl_requires_grad(NULL, true));
    NULLOP(dl_zeros(NULL, DL_SHAPE(2)));
    NULLOP(dl_randn(NULL, DL_SHAPE(2)));
    NULLOP(dl_function_apply(&idf, 2, arr, NULL));
    dl_clear_error(C);
    {
        float v = dl_item(NULL);
        CHECK(v != v && dl_last_error(C) == DL_OK, "dl_item(NULL): NaN and no error");
        CHECK(dl_data(NULL) == NULL && dl_last_error(C) == DL_OK, "dl_data(NULL): NULL and no error");
        CHECK(dl_read(NULL, buf, 4) != DL_OK && dl_last_error(C) == DL_OK, "dl_read(NULL) fails silently");
        CHECK(dl_backward(NULL) != DL_OK && dl_last_error(C) == DL_OK, "dl_backward(NULL) fails silently");
        dl_free(NULL);
        dl_zero_grad(NULL);
        dl_sgd_update(NULL, 0.1f);
        CHECK(dl_last_error(C) == DL_OK, "dl_free/zero_grad/sgd_update(NULL) set no error");
    }
    WORKS();

    /* a whole chain after one bad op: the first cause is what is reported */
    {
        dl_tensor *w = dl_requires_grad(T(4, 5), true);
        dl_tensor *h = dl_matmul(T(2, 3), w);
        dl_tensor *r = dl_relu(h);
        dl_tensor *s = dl_sum(dl_mul_scalar(dl_add(r, r), 2.0f), DL_ALL, false);
        dl_result rc = dl_backward(s);
        float v = dl_item(s);
        CHECK(h == NULL && r == NULL && s == NULL, "the chain is NULL all the way");
        CHECK(rc != DL_OK, "backward of NULL fails");
        CHECK(v != v, "dl_item of NULL is NaN");
        EXPECT_ERR2(C, DL_ERR_SHAPE, "dl_matmul", "a.shape[1]=3 must equal b.shape[0]=4");
        WORKS();
    }
}

static void step_errors(void)
{
    float vals[4] = {1, 2, 3, 4}, back[4];
    dl_tensor *t = dl_from_array(C, DL_SHAPE(4), vals);
    dl_tensor *k = dl_keep(t), *kg = dl_keep(t), *z;
    int i;
    CHECK(k && kg && !k->requires_grad, "dl_keep gives a persistent copy");
    dl_requires_grad(kg, true);
    dl_step_end(C);
    /* stale step tensor */
    BAD(dl_add(t, k), DL_ERR_STALE, "dl_keep");
    BAD(dl_relu(t), DL_ERR_STALE, "dl_step_end");
    BAD(dl_add(k, t), DL_ERR_STALE, "dl_add");
    BAD(dl_keep(t), DL_ERR_STALE, "dl_keep");
    BAD(dl_reshape(t, DL_SHAPE(2, 2)), DL_ERR_STALE, "dl_reshape");
    {
        float v;
        dl_clear_error(C);
        v = dl_item(t);
        CHECK(v != v, "dl_item of a stale tensor is NaN");
        EXPECT_ERR(C, DL_ERR_STALE, "dl_keep");
        CHECK(dl_read(t, back, 4) == DL_ERR_STALE, "dl_read of a stale tensor");
        EXPECT_ERR(C, DL_ERR_STALE, "dl_read");
        CHECK(dl_backward(t) == DL_ERR_STALE, "dl_backward of a stale tensor");
        EXPECT_ERR(C, DL_ERR_STALE, "dl_backward");
    }
    WORKS();
    /* kept tensors stay usable over many steps, gradients accumulate */
    for (i = 0; i < 3; i++) {
        dl_tensor *s = dl_sum(dl_mul(kg, k), DL_ALL, false);
        CHECK(s && dl_item(s) == 30.0f, "kept tensors usable in step %d: %s", i, dl_error_message(C));
        CHECK(dl_backward(s) == DL_OK, "backward on kept tensors in step %d: %s", i, dl_error_message(C));
        dl_step_end(C);
    }
    CHECK(kg->grad && dl_read(kg->grad, back, 4) == DL_OK && back[0] == 3.0f && back[3] == 12.0f,
          "kept grad accumulated over 3 steps: %g %g", (double)back[0], (double)back[3]);
    z = dl_add(k, k);
    {
        float want[4] = {2, 4, 6, 8};
        CHECK(z && dl_read(z, back, 4) == DL_OK && th_close(back, want, 4, 0, 0, NULL), "kept values intact");
    }
    /* dl_free on a step tensor */
    BAD((dl_free(z), (dl_tensor *)NULL), DL_ERR_ARG, "step tensor");
    CHECK(dl_read(z, back, 4) == DL_OK && back[2] == 6.0f, "the step tensor survived dl_free");
    dl_free(kg);
    dl_free(k);
    CHECK(dl_last_error(C) == DL_OK, "dl_free of persistent tensors");
    dl_step_end(C);
}

static void autograd_errors(void)
{
    float v3[3] = {1, 2, 3}, back[3];
    dl_backward_desc bd;
    /* second backward without retain_graph */
    {
        dl_tensor *x = dl_requires_grad(dl_from_array(C, DL_SHAPE(3), v3), true);
        dl_tensor *L = dl_sum(dl_mul(x, x), DL_ALL, false);
        CHECK(dl_backward(L) == DL_OK, "first backward: %s", dl_error_message(C));
        CHECK(dl_backward(L) == DL_ERR_GRAPH, "second backward without retain_graph fails");
        EXPECT_ERR2(C, DL_ERR_GRAPH, "retain_graph", "already freed");
        WORKS();
        CHECK(x->grad && dl_read(x->grad, back, 3) == DL_OK && back[2] == 6.0f,
              "the failed backward left the gradient alone: %g", (double)back[2]);
    }
    /* with retain_graph: works, gradients accumulate */
    {
        dl_tensor *x = dl_requires_grad(dl_from_array(C, DL_SHAPE(3), v3), true);
        dl_tensor *L = dl_sum(dl_mul(x, x), DL_ALL, false);
        memset(&bd, 0, sizeof bd);
        bd.retain_graph = true;
        CHECK(dl_backward_ex(L, &bd) == DL_OK, "retained backward 1: %s", dl_error_message(C));
        CHECK(x->grad && dl_read(x->grad, back, 3) == DL_OK && back[0] == 2.0f && back[2] == 6.0f,
              "grad after one backward 2x: %g %g", (double)back[0], (double)back[2]);
        CHECK(dl_backward_ex(L, &bd) == DL_OK, "retained backward 2: %s", dl_error_message(C));
        CHECK(x->grad && dl_read(x->grad, back, 3) == DL_OK && back[0] == 4.0f && back[1] == 8.0f &&
              back[2] == 12.0f, "grad doubled after the second backward: %g %g %g",
              (double)back[0], (double)back[1], (double)back[2]);
        CHECK(dl_backward(L) == DL_OK, "third backward (releases): %s", dl_error_message(C));
        CHECK(x->grad && dl_read(x->grad, back, 3) == DL_OK && back[2] == 18.0f, "tripled: %g", (double)back[2]);
        CHECK(dl_backward(L) == DL_ERR_GRAPH, "fourth backward fails");
        EXPECT_ERR(C, DL_ERR_GRAPH, "retain_graph");
    }
    /* backward of something that does not require grad */
    {
        dl_tensor *s = dl_sum(T(2, 3), DL_ALL, false);
        CHECK(dl_backward(s) == DL_ERR_GRAPH, "backward without grad");
        EXPECT_ERR2(C, DL_ERR_GRAPH, "does not require grad", "dl_requires_grad");
        WORKS();
    }
    {   /* computed under no_grad */
        dl_tensor *x = dl_requires_grad(T(2, 3), true), *s;
        dl_no_grad_begin(C);
        s = dl_sum(x, DL_ALL, false);
        dl_no_grad_end(C);
        CHECK(dl_backward(s) == DL_ERR_GRAPH, "backward of a no_grad result");
        EXPECT_ERR(C, DL_ERR_GRAPH, "does not require grad");
    }
    /* non-scalar without a seed; seed of the wrong shape */
    {
        dl_tensor *x = dl_requires_grad(dl_from_array(C, DL_SHAPE(3), v3), true);
        dl_tensor *y = dl_mul(x, x);
        CHECK(dl_backward(y) == DL_ERR_SHAPE, "backward of a non-scalar without a seed");
        EXPECT_ERR2(C, DL_ERR_SHAPE, "3 elements", "dl_backward_desc.grad");
        memset(&bd, 0, sizeof bd);
        bd.grad = dl_ones(C, DL_SHAPE(2));
        CHECK(dl_backward_ex(y, &bd) == DL_ERR_SHAPE, "seed of the wrong shape");
        EXPECT_ERR2(C, DL_ERR_SHAPE, "must have the shape", "(2)");
        bd.grad = dl_ones(C, DL_SHAPE(3, 1));
        CHECK(dl_backward_ex(y, &bd) == DL_ERR_SHAPE, "seed (3,1) for out (3)");
        EXPECT_ERR(C, DL_ERR_SHAPE, "must have the shape");
        bd.grad = dl_ones(C, DL_SHAPE(3));
        CHECK(dl_backward_ex(y, &bd) == DL_OK, "right seed works: %s", dl_error_message(C));
        CHECK(x->grad && dl_read(x->grad, back, 3) == DL_OK && back[1] == 4.0f, "seeded grad %g", (double)back[1]);
    }
    /* dl_grad on an input that does not require grad */
    {
        dl_tensor *x = dl_requires_grad(T(2, 3), true), *z = T(2, 3), *g = NULL;
        dl_tensor *out = dl_sum(dl_mul(x, z), DL_ALL, false);
        CHECK(dl_grad(out, 1, &z, &g, NULL) == DL_ERR_GRAPH, "dl_grad wrt a non-grad input");
        EXPECT_ERR2(C, DL_ERR_GRAPH, "dl_grad", "does not require grad");
        CHECK(dl_grad(out, 0, &x, &g, NULL) == DL_ERR_ARG, "dl_grad with no inputs");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_grad");
        CHECK(dl_grad(out, 1, &x, &g, NULL) == DL_OK && g, "dl_grad still works: %s", dl_error_message(C));
    }
    /* custom function without a backward; gradcheck without inputs */
    {
        dl_function f;
        dl_tensor *x = T(2, 2);
        dl_gradcheck_result res;
        f.name = "nobwd"; f.forward = id_fwd; f.backward = NULL;
        BAD(dl_function_apply(&f, 1, &x, NULL), DL_ERR_ARG, "needs both forward and backward");
        CHECK(dl_gradcheck(C, gc_id, NULL, 0, &x, NULL, &res) == DL_ERR_ARG, "gradcheck of 0 inputs");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_gradcheck");
    }
    WORKS();
    dl_step_end(C);
}

static void size_errors(void)
{
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t big = (int64_t)1 << 20;
    float v2[2] = {1, 2};
    /* element count overflows int64 */
    BAD(dl_zeros(C, DL_SHAPE(big, big, big, big)), DL_ERR_OOM, "overflow");
    BAD(dl_ones(C, DL_SHAPE((int64_t)1 << 62, 4)), DL_ERR_OOM, "overflow");
    BAD(dl_randn(C, DL_SHAPE(big, big, big, big)), DL_ERR_OOM, "dl_randn");
    /* about 2^45 floats (128 TiB): the allocation fails, no crash */
    BAD(dl_zeros(C, DL_SHAPE((int64_t)1 << 15, (int64_t)1 << 15, (int64_t)1 << 15)), DL_ERR_OOM, "dl_zeros");
    BAD(dl_empty(C, DL_SHAPE((int64_t)1 << 45)), DL_ERR_OOM, "dl_empty");
    /* negative sizes, too many dims */
    BAD(dl_zeros(C, DL_SHAPE(2, -3)), DL_ERR_SHAPE, "negative size at dim 1");
    BAD(dl_randn(C, DL_SHAPE(-1)), DL_ERR_SHAPE, "negative");
    BAD(dl_from_array(C, DL_SHAPE(-2), v2), DL_ERR_SHAPE, "negative");
    BAD(dl_zeros(C, dl_shape_make(9, nine)), DL_ERR_SHAPE, "at most DL_MAX_DIMS=8");
    BAD(dl_from_array(C, dl_shape_make(9, nine), v2), DL_ERR_SHAPE, "dims requested");
    BAD(dl_reshape(T(1, 1), dl_shape_make(9, nine)), DL_ERR_SHAPE, "9 dims");
    BAD(dl_unsqueeze(dl_zeros(C, DL_SHAPE(1, 1, 1, 1, 1, 1, 1, 2)), 0), DL_ERR_SHAPE, "DL_MAX_DIMS");
    BAD(dl_from_array(C, DL_SHAPE(2), NULL), DL_ERR_ARG, "values is NULL");
    {   /* no values for no elements: torch.tensor([], dtype=torch.int64) */
        dl_tensor *e = dl_from_int64(C, DL_SHAPE(0), NULL), *f = dl_from_array(C, DL_SHAPE(3, 0), NULL);
        CHECK(e && e->numel == 0 && e->dtype == DL_DTYPE_I64 && f && f->numel == 0 && dl_last_error(C) == DL_OK,
              "empty tensors from NULL values: %s", dl_error_message(C));
    }
    BAD(dl_arange(C, 0.0f, 1.0f, 0.0f), DL_ERR_ARG, "step");
    BAD(dl_arange(C, 0.0f, 1e20f, 1.0f), DL_ERR_OOM, "too many");
    /* as PyTorch: a step against the direction from start to end is an error, not an empty tensor */
    BAD(dl_arange(C, 0.0f, 5.0f, -1.0f), DL_ERR_ARG,
        "dl_arange: upper bound and lower bound inconsistent with step sign (start 0, end 5, step -1)");
    BAD(dl_arange(C, 5.0f, 0.0f, 1.0f), DL_ERR_ARG, "inconsistent with step sign");
    BAD(dl_arange(C, 0.0f, INFINITY, 1.0f), DL_ERR_ARG, "dl_arange: step must be non-zero and the bounds and step finite");
    BAD(dl_arange(C, 0.0f, 1.0f, NAN), DL_ERR_ARG, "dl_arange: step must be non-zero");
    {
        dl_tensor *d = dl_arange(C, 5.0f, 0.0f, -2.0f), *e = dl_arange(C, 3.0f, 3.0f, -1.0f);
        CHECK(d && d->numel == 3 && th_f(d, 0) == 5.0f && th_f(d, 2) == 1.0f && e && e->numel == 0,
              "dl_arange(5, 0, -2) = 5 3 1; (3, 3, -1) is empty");
    }
    /* a context with a 1 MiB limit asked for 4 MB */
    {
        dl_ctx_desc d;
        dl_ctx *L;
        dl_tensor *s;
        memset(&d, 0, sizeof d);
        d.log = dl_log_silent;
        d.memory_limit = (size_t)1 << 20;
        L = dl_ctx_init(&d);
        CHECK(L != NULL, "limited context");
        if (L) {
            CHECK(dl_zeros(L, DL_SHAPE(1 << 20)) == NULL, "4 MB in a 1 MiB context");
            EXPECT_ERR2(L, DL_ERR_OOM, "dl_zeros", "memory_limit");
            s = dl_sum(dl_ones(L, DL_SHAPE(1000)), DL_ALL, false);
            CHECK(s && dl_item(s) == 1000.0f && dl_last_error(L) == DL_OK, "small tensors still fit: %s",
                  dl_error_message(L));
            s = dl_ones(L, DL_SHAPE(100000));   /* 400 KB of step memory: fits */
            CHECK(s != NULL, "400 KB step tensor: %s", dl_error_message(L));
            CHECK(dl_keep(s) == NULL, "a persistent copy passes the limit");
            EXPECT_ERR(L, DL_ERR_OOM, "memory_limit");
            /* operands from two contexts */
            CHECK(dl_add(T(2, 2), dl_ones(L, DL_SHAPE(2, 2))) == NULL, "cross-context add");
            EXPECT_ERR(C, DL_ERR_ARG, "different contexts");
            dl_ctx_free(L);
        }
    }
    WORKS();
    dl_step_end(C);
}

static void misc_errors(void)
{
    float buf[8];
    int64_t ibuf[8];
    dl_tensor *t = T(2, 3);
    /* dl_item on many elements */
    {
        float v;
        dl_clear_error(C);
        v = dl_item(t);
        CHECK(v != v, "dl_item of 6 elements is NaN");
        EXPECT_ERR2(C, DL_ERR_SHAPE, "6 elements", "exactly 1");
        CHECK(dl_item(dl_zeros(C, DL_SHAPE(0))) != dl_item(dl_zeros(C, DL_SHAPE(0))), "dl_item of 0 elements");
        EXPECT_ERR(C, DL_ERR_SHAPE, "dl_item");
        CHECK(dl_item(dl_full(C, DL_SHAPE(1, 1), 2.5f)) == 2.5f, "dl_item of (1,1) works");
    }
    /* dl_read with the wrong n */
    CHECK(dl_read(t, buf, 5) == DL_ERR_ARG, "dl_read n=5 for 6");
    EXPECT_ERR2(C, DL_ERR_ARG, "6 elements", "dst holds 5");
    CHECK(dl_read(t, buf, 8) == DL_ERR_ARG, "dl_read n=8 for 6");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_read");
    CHECK(dl_read(t, NULL, 6) == DL_ERR_ARG, "dl_read into NULL");
    EXPECT_ERR(C, DL_ERR_ARG, "NULL");
    CHECK(dl_read_int64(t, ibuf, 2) == DL_ERR_ARG, "dl_read_int64 wrong n");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_read_int64");
    CHECK(dl_read(t, buf, 6) == DL_OK, "dl_read right n");
    /* devices */
    if (dl_device_count(C, DL_DEVICE_CUDA) == 0) {   /* a CPU build, or no GPU */
        BAD(dl_to(t, dl_cuda(0)), DL_ERR_DEVICE, "CUDA");
        BAD(dl_to(t, dl_cuda(1)), DL_ERR_DEVICE, "cuda:1");
    }
    CHECK(dl_to(t, t->device) == t, "dl_to the same device returns t");
    {   /* on cpu:0 (the host) dl_data gives the values in place; on a strict
           device (DL_STRICT=1) and on a GPU it refuses: those tensors' memory
           is not the host's. (A real GPU's pointers carry no tag, an emulated
           one's do: the test asks where t is, not whether it is tagged.) */
        dl_tensor *h = dl_to(t, dl_cpu());
        float *p;
        CHECK(h && h->device.type == DL_DEVICE_CPU && h->device.index == 0 && dl_to(h, dl_cpu()) == h,
              "dl_to cpu:0, then again: the same tensor");
        p = dl_data(h);
        CHECK(p && dl_read(t, buf, 6) == DL_OK && memcmp(p, buf, sizeof(float) * 6) == 0,
              "dl_data of a cpu:0 tensor: %s", dl_error_message(C));
        if (t->dev_->tag || t->device.type != DL_DEVICE_CPU) {
            CHECK(dl_data(t) == NULL, "dl_data of a tensor on %s%s", t->dev_->tag ? "strict " : "",
                  dl_device_name(t->device));
            EXPECT_ERR(C, DL_ERR_DEVICE, "whose memory the host cannot address");
        } else {
            CHECK(dl_data(t) == (float *)t->data, "dl_data of a tensor on %s", dl_device_name(t->device));
        }
    }
    {
        dl_memory_stats ms;
        if (dl_device_count(C, DL_DEVICE_CUDA) == 0) {
            CHECK(dl_memory_stats_get(C, dl_cuda(0), &ms) == DL_ERR_DEVICE, "memory stats of cuda");
            EXPECT_ERR(C, DL_ERR_DEVICE, "CUDA");
        }
        CHECK(dl_memory_stats_get(C, dl_cpu(), &ms) == DL_OK, "memory stats of cpu");
    }
    /* graph dot to a bad path */
    CHECK(dl_graph_dot(t, "/nonexistent-dir-dl-test/g.dot") == DL_ERR_IO, "graph_dot to a bad path");
    EXPECT_ERR(C, DL_ERR_IO, "directory of /nonexistent-dir-dl-test/g.dot");
    CHECK(dl_graph_dot(t, NULL) == DL_ERR_ARG, "graph_dot with a NULL path");
    EXPECT_ERR(C, DL_ERR_ARG, "path");
    /* the log callback gets each message once */
    nlog = 0;
    dl_set_log(C, count_log, &nlog);
    dl_matmul(T(2, 3), T(2, 3));
    CHECK(nlog == 1, "one log call per error, got %d", nlog);
    EXPECT_ERR(C, DL_ERR_SHAPE, "dl_matmul");
    dl_relu(dl_matmul(T(2, 3), T(2, 3)));
    CHECK(nlog == 2, "NULL propagation logs nothing more, got %d", nlog);
    dl_clear_error(C);
    dl_set_log(C, dl_log_silent, NULL);
    WORKS();
    dl_step_end(C);
}

static void anomaly_errors(void)
{
    float z[3] = {0.0f, 1.0f, 4.0f}, back[3];
    dl_tensor *x, *y, *s;
    dl_set_anomaly(C, true);
    /* forward: log(0) = -Inf */
    x = dl_from_array(C, DL_SHAPE(3), z);
    CHECK(dl_log(x) == NULL, "anomaly: dl_log(0) fails");
    EXPECT_ERR2(C, DL_ERR_NAN, "dl_log", "forward");
    x = dl_from_array(C, DL_SHAPE(3), z);
    dl_log(x);
    EXPECT_ERR(C, DL_ERR_NAN, "Inf");
    CHECK(dl_div(dl_ones(C, DL_SHAPE(3)), dl_from_array(C, DL_SHAPE(3), z)) == NULL, "anomaly: 1/0");
    EXPECT_ERR2(C, DL_ERR_NAN, "dl_div", "forward");
    CHECK(dl_sqrt(dl_full(C, DL_SHAPE(2), -1.0f)) == NULL, "anomaly: sqrt(-1)");
    EXPECT_ERR2(C, DL_ERR_NAN, "dl_sqrt", "NaN");
    WORKS();
    /* backward: sqrt at 0 is fine forward, its gradient 1/(2 sqrt(0)) is Inf */
    x = dl_requires_grad(dl_from_array(C, DL_SHAPE(3), z), true);
    y = dl_sqrt(x);
    CHECK(y != NULL, "anomaly: sqrt(0) forward is fine: %s", dl_error_message(C));
    s = dl_sum(y, DL_ALL, false);
    CHECK(s != NULL && dl_item(s) == 3.0f, "sum of sqrt");
    CHECK(dl_backward(s) == DL_ERR_NAN, "anomaly: the backward of sqrt at 0 fails");
    CHECK(strstr(dl_error_message(C), "(forward)") == NULL, "a backward anomaly is not called forward: %s",
          dl_error_message(C));
    EXPECT_ERR2(C, DL_ERR_NAN, "in the backward of dl_sqrt", "Inf");
    WORKS();
    /* anomaly off: the same computations go through */
    dl_set_anomaly(C, false);
    x = dl_from_array(C, DL_SHAPE(3), z);
    y = dl_log(x);
    CHECK(y && dl_read(y, back, 3) == DL_OK && back[0] < -1e30f && dl_last_error(C) == DL_OK,
          "without anomaly mode log(0) = -inf, no error");
    x = dl_requires_grad(dl_from_array(C, DL_SHAPE(3), z), true);
    CHECK(dl_backward(dl_sum(dl_sqrt(x), DL_ALL, false)) == DL_OK && x->grad &&
          dl_read(x->grad, back, 3) == DL_OK && back[0] > 1e30f && back[2] == 0.25f,
          "without anomaly mode sqrt'(0) = inf, no error: %s", dl_error_message(C));
    dl_clear_error(C);
    dl_step_end(C);
}

static void result_strings(void)
{
    static const char *names[] = {
        "DL_OK", "DL_ERR_ARG", "DL_ERR_SHAPE", "DL_ERR_DTYPE", "DL_ERR_DEVICE", "DL_ERR_STALE",
        "DL_ERR_GRAPH", "DL_ERR_OOM", "DL_ERR_IO", "DL_ERR_FORMAT", "DL_ERR_NAN", "DL_ERR_UNSUPPORTED"};
    int i;
    for (i = 0; i <= (int)DL_ERR_UNSUPPORTED; i++)
        CHECK(strcmp(dl_result_string((dl_result)i), names[i]) == 0, "dl_result_string(%d) = %s, want %s", i,
              dl_result_string((dl_result)i), names[i]);
    CHECK(dl_result_string((dl_result)99) != NULL && strcmp(dl_result_string((dl_result)99), "DL_OK") != 0,
          "dl_result_string of an unknown code");
    /* failures with no context go to a per-thread slot read with a NULL ctx */
    dl_clear_error(NULL);
    CHECK(dl_last_error(NULL) == DL_OK && strcmp(dl_error_message(NULL), "") == 0, "NULL context: cleared");
    CHECK(dl_zeros(NULL, DL_SHAPE(2)) == NULL && dl_last_error(NULL) == DL_ERR_ARG &&
          strstr(dl_error_message(NULL), "dl_zeros: ctx is NULL"), "NULL context queries: %s", dl_error_message(NULL));
    dl_clear_error(NULL);
    dl_clear_error(C);
    CHECK(dl_last_error(C) == DL_OK && strcmp(dl_error_message(C), "") == 0, "cleared: DL_OK and \"\"");
}

/* another context with two CPU devices, on cpu:0 (make test also runs with DL_DEVICE=cpu:1) */
static dl_ctx *second_ctx(void)
{
    dl_ctx_desc d;
    dl_ctx *L;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.cpu_devices = 2;
    L = dl_ctx_init(&d);
    CHECK(L != NULL, "second context");
    if (L) CHECK(dl_set_device(L, dl_cpu()) == DL_OK, "cpu:0");
    return L;
}

/* where, masked_fill, tril/triu, gather and the comparisons: every refusal
   names the op, the value and the rule */
static void selection_errors(void)
{
    int64_t iv[4] = {0, 2, 1, 2}, big[2] = {1, 3}, neg[2] = {0, -1};
    int32_t i32[2] = {0, 1};
    dl_tensor *x = T(2, 3), *m = T(2, 3), *idx = dl_from_int64(C, DL_SHAPE(2, 2), iv);
    dl_ctx *L;
    BAD(dl_where(m, x, dl_randn(C, DL_SHAPE(4))), DL_ERR_SHAPE,
        "dl_where: cond (2,3), a (2,3) and b (4) do not broadcast: b's size 4 at dim 1 of the result meets 3 "
        "(sizes must match or one be 1)");
    BAD(dl_where(idx, x, x), DL_ERR_DTYPE, "dl_where: cond (2,2) has dtype int64; this op needs float32");
    BAD(dl_where(m, x, idx), DL_ERR_DTYPE, "dl_where: b (2,2) has dtype int64");
    NULLOP(dl_where(NULL, x, x));
    NULLOP(dl_where(m, NULL, x));
    NULLOP(dl_where(m, x, NULL));
    BAD(dl_masked_fill(x, dl_randn(C, DL_SHAPE(2, 1, 3)), 0.0f), DL_ERR_SHAPE,
        "dl_masked_fill: mask (2,1,3) does not broadcast to x (2,3) (the result keeps x's shape: the mask's "
        "trailing sizes must match x's or be 1)");
    BAD(dl_masked_fill(x, T(3, 1), 0.0f), DL_ERR_SHAPE, "mask (3,1) does not broadcast to x (2,3)");
    BAD(dl_masked_fill(idx, T(2, 2), 0.0f), DL_ERR_DTYPE, "dl_masked_fill: x (2,2) has dtype int64");
    NULLOP(dl_masked_fill(NULL, m, 0.0f));
    NULLOP(dl_masked_fill(x, NULL, 0.0f));
    BAD(dl_tril(dl_randn(C, DL_SHAPE(5)), 0), DL_ERR_SHAPE, "dl_tril: x (5) must have 2 dims at least (a matrix, or a batch of them)");
    BAD(dl_triu(idx, 0), DL_ERR_DTYPE, "dl_triu: x (2,2) has dtype int64; this op needs float32");
    NULLOP(dl_tril(NULL, 0));
    BAD(dl_lt(x, idx), DL_ERR_DTYPE,
        "dl_lt: a (2,3) is float32 and b (2,2) is int64 (both must be float32; dl_to_dtype converts)");
    BAD(dl_gt(idx, idx), DL_ERR_DTYPE, "dl_gt: a (2,2) is int64 and b (2,2) is int64 (both must be float32;");
    BAD(dl_ne(x, dl_randn(C, DL_SHAPE(4))), DL_ERR_SHAPE, "dl_ne: a (2,3) and b (4) do not broadcast");
    NULLOP(dl_ge(NULL, x));
    {   /* int64 pairs: ne (as eq) works */
        float v[4];
        dl_tensor *ne = dl_ne(idx, dl_from_int64(C, DL_SHAPE(2), iv + 2));
        CHECK(ne && dl_read(ne, v, 4) == DL_OK && v[0] == 1 && v[1] == 0 && v[2] == 0 && v[3] == 0,
              "dl_ne of int64 pairs: %s", dl_error_message(C));
    }
    {   /* dl_copy_ converts another dtype, as torch's copy_: int64 into float32, float32 (truncated) into int64 */
        float f[4], src[4] = {1.7f, -2.5f, 3.0f, 0.0f};
        int64_t back[4];
        dl_tensor *fi = dl_zeros(C, DL_SHAPE(2, 2)), *ii = dl_to_dtype(dl_zeros(C, DL_SHAPE(4)), DL_DTYPE_I64);
        CHECK(dl_copy_(fi, idx) == DL_OK && dl_read(fi, f, 4) == DL_OK && f[0] == 0 && f[1] == 2 && f[2] == 1 &&
              f[3] == 2, "dl_copy_ int64 -> float32: %s", dl_error_message(C));
        CHECK(dl_copy_(ii, dl_from_array(C, DL_SHAPE(4), src)) == DL_OK && dl_read_int64(ii, back, 4) == DL_OK &&
              back[0] == 1 && back[1] == -2 && back[2] == 3 && back[3] == 0, "dl_copy_ float32 -> int64: %s",
              dl_error_message(C));
    }
    BAD(dl_gather(x, 1, dl_from_int64(C, DL_SHAPE(2, 1), big)), DL_ERR_ARG,
        "dl_gather: index (2,1) holds 3 at flat index 1: indices must be in [0, 3) (the size of dim 1 of x (2,3))");
    BAD(dl_gather(x, 1, dl_from_int64(C, DL_SHAPE(1, 2), neg)), DL_ERR_ARG, "index (1,2) holds -1 at flat index 1");
    BAD(dl_gather(x, 0, dl_from_int32(C, DL_SHAPE(1, 2), i32)), DL_ERR_DTYPE,
        "dl_gather: index (1,2) has dtype int32; it must be int64 (dl_to_dtype converts)");
    BAD(dl_gather(x, 0, dl_from_int64(C, DL_SHAPE(4), iv)), DL_ERR_SHAPE,
        "dl_gather: index (4) has 1 dims and x (2,3) 2; they must have the same number");
    BAD(dl_gather(x, 0, dl_from_int64(C, DL_SHAPE(1, 4), iv)), DL_ERR_SHAPE,
        "dl_gather: index (1,4) is larger than x (2,3) at dim 1 (4 > 3): off dim 0 its sizes must be at most x's");
    BAD(dl_gather(x, 2, idx), DL_ERR_ARG, "dl_gather: dim 2 is out of range for a tensor of shape (2,3)");
    BAD(dl_gather(dl_sum(x, DL_ALL, false), 1, dl_reshape(dl_from_int64(C, DL_SHAPE(1), iv), dl_shape_make(0, NULL))),
        DL_ERR_ARG, "dl_gather: dim 1 is out of range for a 0-d x (valid: -1, 0)");
    BAD(dl_gather(idx, 0, idx), DL_ERR_DTYPE, "dl_gather: x (2,2) has dtype int64; this op needs float32");
    NULLOP(dl_gather(NULL, 0, idx));
    NULLOP(dl_gather(x, 0, NULL));
    L = second_ctx();
    if (L) {
        dl_tensor *xl = dl_randn(L, DL_SHAPE(2, 3)), *i1;
        BAD(dl_where(m, xl, x), DL_ERR_ARG, "dl_where: cond and a belong to different contexts");
        BAD(dl_gather(x, 0, dl_from_int64(L, DL_SHAPE(2, 2), iv)), DL_ERR_ARG,
            "dl_gather: x and index belong to different contexts");
        CHECK(dl_set_device(L, dl_cpu_device(1)) == DL_OK, "cpu:1: %s", dl_error_message(L));
        i1 = dl_from_int64(L, DL_SHAPE(2, 2), iv);
        CHECK(dl_gather(xl, 1, i1) == NULL, "index on cpu:1, x on cpu:0");
        EXPECT_ERR(L, DL_ERR_DEVICE, "dl_gather: x (2,3) is on cpu:0 but index (2,2) is on cpu:1; move one with dl_to()");
        CHECK(dl_masked_fill(xl, dl_ones(L, DL_SHAPE(3)), 1.0f) == NULL, "mask on cpu:1, x on cpu:0");
        EXPECT_ERR(L, DL_ERR_DEVICE, "dl_masked_fill: x (2,3) is on cpu:0 but mask (3) is on cpu:1");
        dl_ctx_free(L);
    }
}

/* dl_group_norm, dl_nn_group_norm: every refusal names the op, the value and the rule */
static void group_norm_errors(void)
{
    dl_tensor *x = dl_randn(C, DL_SHAPE(2, 6, 3)), *w = dl_ones(C, DL_SHAPE(6));
    dl_module *g = dl_nn_group_norm(C, 2, 6);
    BAD(dl_group_norm(x, 4, w, NULL, 1e-5f), DL_ERR_ARG,
        "dl_group_norm: num_groups=4 must be positive and divide the 6 channels of x (2,6,3)");
    BAD(dl_group_norm(x, 0, NULL, NULL, 1e-5f), DL_ERR_ARG, "num_groups=0 must be positive");
    BAD(dl_group_norm(dl_randn(C, DL_SHAPE(6)), 2, NULL, NULL, 1e-5f), DL_ERR_SHAPE,
        "dl_group_norm: x (6) must be (N, C, *): 2 dims at least");
    BAD(dl_group_norm(x, 2, dl_ones(C, DL_SHAPE(3)), NULL, 1e-5f), DL_ERR_SHAPE,
        "dl_group_norm: weight (3) must be (C) = (6), x (2,6,3)'s channels");
    BAD(dl_group_norm(x, 2, NULL, T(6, 1), 1e-5f), DL_ERR_SHAPE, "dl_group_norm: bias (6,1) must be (C) = (6)");
    BAD(dl_group_norm(x, 2, NULL, NULL, -1.0f), DL_ERR_ARG, "eps=-1 must be >= 0");
    NULLOP(dl_group_norm(NULL, 2, NULL, NULL, 1e-5f));
    CHECK(dl_nn_group_norm(C, 4, 6) == NULL, "GroupNorm(4, 6) refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_group_norm: num_groups=4 and num_channels=6 must be positive, the groups "
               "dividing the channels");
    CHECK(g && dl_nn_group_norm_eps(g, 0.0f) == DL_ERR_ARG, "eps 0 refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_group_norm_eps: eps=0 must be finite and > 0");
    CHECK(dl_nn_group_norm_eps(dl_nn_relu(C), 1e-3f) == DL_ERR_ARG, "eps of a ReLU refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_group_norm_eps: m (a \"ReLU\" module) was not made by dl_nn_group_norm");
}

/* dl_upsample_nearest, dl_nn_upsample_nearest */
static void upsample_errors(void)
{
    BAD(dl_upsample_nearest(T(2, 3), 2), DL_ERR_SHAPE,
        "dl_upsample_nearest: x (2,3) must be (N, C, L), (N, C, H, W) or (N, C, D, H, W)");
    BAD(dl_upsample_nearest(dl_randn(C, DL_SHAPE(1, 2, 3)), 0), DL_ERR_ARG,
        "dl_upsample_nearest: scale=0 must be an integer in [1, 2^20]");
    BAD(dl_upsample_nearest(dl_to_dtype(dl_randn(C, DL_SHAPE(1, 2, 3)), DL_DTYPE_I64), 2), DL_ERR_DTYPE,
        "dl_upsample_nearest: x (1,2,3) has dtype int64; this op needs float32");
    NULLOP(dl_upsample_nearest(NULL, 2));
    CHECK(dl_nn_upsample_nearest(C, -1) == NULL, "Upsample(scale_factor=-1) refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_upsample_nearest: scale=-1 must be an integer in [1, 2^20]");
}

/* dl_embedding: every refusal names the op, the value and the rule */
static void embedding_errors(void)
{
    int64_t iv[4] = {0, 3, 1, 2}, big[3] = {1, 4, 0}, neg[2] = {2, -1};
    int32_t i32[3] = {0, 7, 1};
    dl_tensor *w = T(4, 3), *idx = dl_from_int64(C, DL_SHAPE(4), iv);
    dl_ctx *L;
    BAD(dl_embedding(dl_from_int64(C, DL_SHAPE(3), big), w, DL_NO_PADDING), DL_ERR_ARG,
        "dl_embedding: idx (3) holds 4 at flat index 1: indices must be in [0, 4) (num_embeddings, dim 0 of "
        "weight (4,3))");
    BAD(dl_embedding(dl_from_int64(C, DL_SHAPE(2), neg), w, DL_NO_PADDING), DL_ERR_ARG,
        "idx (2) holds -1 at flat index 1");
    BAD(dl_embedding(dl_from_int32(C, DL_SHAPE(3), i32), w, DL_NO_PADDING), DL_ERR_ARG,
        "idx (3) holds 7 at flat index 1");
    BAD(dl_embedding(T(2, 2), w, DL_NO_PADDING), DL_ERR_DTYPE,
        "dl_embedding: idx (2,2) has dtype float32; indices must be int64 or int32");
    BAD(dl_embedding(idx, dl_randn(C, DL_SHAPE(12)), DL_NO_PADDING), DL_ERR_SHAPE,
        "dl_embedding: weight (12) must be 2-D (num_embeddings, embedding_dim)");
    BAD(dl_embedding(idx, dl_from_int64(C, DL_SHAPE(2, 2), iv), DL_NO_PADDING), DL_ERR_DTYPE,
        "dl_embedding: weight (2,2) has dtype int64; this op needs float32");
    BAD(dl_embedding(dl_reshape(idx, DL_SHAPE(1, 1, 1, 1, 1, 1, 1, 4)), w, DL_NO_PADDING), DL_ERR_SHAPE,
        "dl_embedding: idx (1,1,1,1,1,1,1,4) has 8 dims; the result adds one and tensors have at most 8");
    BAD(dl_embedding(idx, w, 4), DL_ERR_ARG,
        "dl_embedding: padding_idx=4 must be in [-4, 4) (num_embeddings, dim 0 of weight (4,3)), or DL_NO_PADDING");
    BAD(dl_embedding(idx, w, -5), DL_ERR_ARG, "padding_idx=-5 must be in [-4, 4)");
    BAD(dl_softplus(w, 0.0f, 20.0f), DL_ERR_ARG, "dl_softplus: beta=0 must be finite and nonzero, threshold=20 not NaN");
    BAD(dl_softplus(w, 1.0f, NAN), DL_ERR_ARG, "threshold=nan not NaN (PyTorch's defaults: 1, 20)");
    NULLOP(dl_softplus(NULL, 1.0f, 20.0f));
    NULLOP(dl_logsigmoid(NULL));
    NULLOP(dl_to_dtype(NULL, DL_DTYPE_I64));
    NULLOP(dl_multinomial(NULL, 1, true));
    {
        float bad[4] = {0.5f, -0.1f, 0.2f, 0.2f}, zero[4] = {0, 0, 0, 0}, nan4[4] = {0.5f, NAN, 0, 0};
        BAD(dl_multinomial(dl_from_array(C, DL_SHAPE(4), bad), 1, true), DL_ERR_ARG,
            "dl_multinomial: probs (4) holds -0.1 at row 0, category 1: weights must be finite and >= 0");
        BAD(dl_multinomial(dl_from_array(C, DL_SHAPE(4), nan4), 1, true), DL_ERR_ARG, "holds nan at row 0, category 1");
        BAD(dl_multinomial(dl_from_array(C, DL_SHAPE(1, 4), zero), 1, true), DL_ERR_ARG,
            "dl_multinomial: row 0 of probs (1,4) has 0 nonzero weights (sum 0): it needs a positive sum");
        BAD(dl_multinomial(dl_from_array(C, DL_SHAPE(4), nan4 + 0), 5, false), DL_ERR_ARG,
            "num_samples=5 must be >= 1 and, without replacement, at most the 4 categories of probs (4)");
        bad[1] = 0.0f;
        BAD(dl_multinomial(dl_from_array(C, DL_SHAPE(4), bad), 4, false), DL_ERR_ARG,
            "row 0 of probs (4) has 3 nonzero weights (sum 0.9): it needs at least num_samples of them without replacement");
        BAD(dl_multinomial(w, 0, true), DL_ERR_ARG, "num_samples=0 must be >= 1");
        BAD(dl_multinomial(dl_randn(C, DL_SHAPE(2, 2, 2)), 1, true), DL_ERR_SHAPE, "probs (2,2,2) must be (C) or (N, C)");
        BAD(dl_multinomial(idx, 1, true), DL_ERR_DTYPE, "dl_multinomial: probs (4) has dtype int64");
        {   /* a draw on the host: refused inside a capture */
            dl_tensor *pk = dl_keep(dl_from_array(C, DL_SHAPE(4), zero + 0));
            dl_capture *cap = dl_capture_begin(C);
            CHECK(cap && dl_multinomial(pk, 1, true) == NULL, "multinomial in a capture refused");
            EXPECT_ERR(C, DL_ERR_UNSUPPORTED, "dl_multinomial: a draw made on the host (probs read back) inside a capture");
            dl_capture_free(cap);
            dl_free(pk);
            dl_clear_error(C);
        }
    }
    BAD(dl_to_dtype(w, (dl_dtype)7), DL_ERR_ARG, "dl_to_dtype: dtype 7 is none of DL_DTYPE_F32, DL_DTYPE_I32, DL_DTYPE_I64");
    CHECK(dl_nn_softplus(C, INFINITY, 20.0f) == NULL, "Softplus(beta=inf) refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_softplus: beta=inf must be finite and nonzero");
    NULLOP(dl_embedding(NULL, w, DL_NO_PADDING));
    NULLOP(dl_embedding(idx, NULL, DL_NO_PADDING));
    /* another context; another CPU device */
    L = second_ctx();
    if (L) {
        dl_tensor *wl = dl_randn(L, DL_SHAPE(4, 3)), *i1;
        BAD(dl_embedding(idx, wl, DL_NO_PADDING), DL_ERR_ARG,
            "dl_embedding: idx and weight belong to different contexts");
        CHECK(dl_set_device(L, dl_cpu_device(1)) == DL_OK, "cpu:1: %s", dl_error_message(L));
        i1 = dl_from_int64(L, DL_SHAPE(4), iv);
        CHECK(dl_embedding(i1, wl, DL_NO_PADDING) == NULL, "idx on cpu:1, weight on cpu:0");
        EXPECT_ERR(L, DL_ERR_DEVICE, "dl_embedding: idx (4) is on cpu:1 but weight (4,3) is on cpu:0; move one "
                   "with dl_to()");
        dl_ctx_free(L);
    }
    /* the modules */
    CHECK(dl_nn_embedding(C, 0, 3) == NULL, "Embedding(0, 3) refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_embedding: num_embeddings=0 and embedding_dim=3 must be positive");
    CHECK(dl_nn_embedding(C, 5, -1) == NULL, "Embedding(5, -1) refused");
    EXPECT_ERR(C, DL_ERR_ARG, "embedding_dim=-1 must be positive");
    CHECK(dl_nn_embedding(NULL, 5, 3) == NULL, "Embedding(NULL ctx) refused");
    {
        dl_module *e = dl_nn_embedding(C, 5, 3), *lin = dl_nn_linear(C, 2, 2, true);
        CHECK(e && lin, "modules: %s", dl_error_message(C));
        CHECK(dl_nn_embedding_padding(e, 5) == DL_ERR_ARG, "padding_idx 5 of 5 refused");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_embedding_padding: padding_idx=5 must be in [-5, 5) (num_embeddings), "
                   "or DL_NO_PADDING");
        CHECK(dl_nn_embedding_padding(lin, 0) == DL_ERR_ARG, "padding on a Linear refused");
        EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_embedding_padding: m (a \"Linear\" module) was not made by dl_nn_embedding");
        CHECK(dl_nn_embedding_padding(NULL, 0) == DL_ERR_ARG, "padding on NULL refused");
        BAD(dl_module_forward(e, T(2, 2)), DL_ERR_DTYPE, "dl_embedding: idx (2,2) has dtype float32");
    }
    WORKS();
    dl_step_end(C);
}

/* the creators with a dtype */
static void dtype_creator_errors(void)
{
    BAD(dl_zeros_dtype(C, DL_SHAPE(2), (dl_dtype)5), DL_ERR_ARG,
        "dl_zeros_dtype: dtype 5 is none of DL_DTYPE_F32, DL_DTYPE_I32, DL_DTYPE_I64");
    BAD(dl_full_dtype(C, DL_SHAPE(2), 2147483648.0, DL_DTYPE_I32), DL_ERR_ARG,
        "dl_full_dtype: value 2147483648 cannot be converted to int32 without overflow (finite, within the dtype's "
        "range)");
    BAD(dl_full_dtype(C, DL_SHAPE(2), NAN, DL_DTYPE_I64), DL_ERR_ARG, "value nan cannot be converted to int64");
    BAD(dl_full_dtype(C, DL_SHAPE(2), 1e19, DL_DTYPE_I64), DL_ERR_ARG, "value 1e+19 cannot be converted to int64");
    BAD(dl_full_dtype(C, DL_SHAPE(2), (double)INT64_MAX, DL_DTYPE_I64), DL_ERR_ARG,
        "(double)INT64_MAX rounds up to 2^63, past int64: the largest a double holds is 2^63 - 1024");
    /* float32: a finite value past FLT_MAX is torch's overflow error; +-inf is kept */
    BAD(dl_full_dtype(C, DL_SHAPE(2), 1e300, DL_DTYPE_F32), DL_ERR_ARG,
        "dl_full_dtype: value 1.0000000000000001e+300 cannot be converted to float32 without overflow");
    BAD(dl_full_dtype(C, DL_SHAPE(2), -3.4028235e38, DL_DTYPE_F32), DL_ERR_ARG, "to float32 without overflow");
    CHECK(dl_full_dtype(C, DL_SHAPE(2), -INFINITY, DL_DTYPE_F32) != NULL, "-inf kept: %s", dl_error_message(C));
    CHECK(dl_full_dtype(C, DL_SHAPE(2), FLT_MAX, DL_DTYPE_F32) != NULL, "FLT_MAX kept: %s", dl_error_message(C));
    {   /* an empty integer range is empty wherever it lies, as torch's */
        dl_tensor *e = dl_arange_dtype(C, 1e8, 1e8, 1, DL_DTYPE_I64);
        CHECK(e && e->numel == 0 && e->dtype == DL_DTYPE_I64, "arange(1e8, 1e8) empty: %s", dl_error_message(C));
    }
    BAD(dl_ones_dtype(C, DL_SHAPE(-1), DL_DTYPE_I64), DL_ERR_SHAPE, "dl_ones_dtype");
    /* past the dtype's range (exact to it): torch's int32 wraps, int64's conversions overflow */
    BAD(dl_arange_dtype(C, 0, 2147483649.0, 1073741824.0, DL_DTYPE_I32), DL_ERR_ARG,
        "dl_arange_dtype: values up to 2147483648 for int32: an integer arange's values must be within the dtype's "
        "range [-2147483648, 2147483647]");
    BAD(dl_arange_dtype(C, -10, -2147483660.0, -1, DL_DTYPE_I32), DL_ERR_ARG,
        "dl_arange_dtype: values up to -2147483659 for int32");
    BAD(dl_arange_dtype(C, 4611686018427387904.0, 1e19, 4611686018427387904.0, DL_DTYPE_I64), DL_ERR_ARG,
        "dl_arange_dtype: values up to 9.2233720368547758e+18 for int64: an integer arange's values must be within "
        "the dtype's range [-9.2233720368547758e+18, 9.2233720368547758e+18]");
    BAD(dl_arange_dtype(C, 1e19, 2e19, 1e18, DL_DTYPE_I64), DL_ERR_ARG,
        "dl_arange_dtype: start 1e+19, step 1e+18 for int64: an integer arange's start must be within the dtype's "
        "range and its step within int64's");
    BAD(dl_arange_dtype(C, 0, 2e19, 1e19, DL_DTYPE_I64), DL_ERR_ARG, "its step within int64's");
    BAD(dl_arange_dtype(C, 2147483648.0, 2147483650.0, 1, DL_DTYPE_I32), DL_ERR_ARG,
        "dl_arange_dtype: start 2147483648, step 1 for int32");
    {   /* at the range's ends */
        int64_t o[2];
        CHECK(dl_read_int64(dl_arange_dtype(C, 9223372036854774784.0, 9223372036854772736.0, -1024, DL_DTYPE_I64), o, 2) == DL_OK &&
              o[0] == 9223372036854774784LL && o[1] == 9223372036854773760LL, "down from 2^63 - 1024: %s",
              dl_error_message(C));
        CHECK(dl_read_int64(dl_arange_dtype(C, 2147483646.0, 2147483648.0, 1, DL_DTYPE_I32), o, 2) == DL_OK &&
              o[0] == 2147483646 && o[1] == INT32_MAX, "int32 up to INT32_MAX: %s", dl_error_message(C));
    }
    BAD(dl_arange_dtype(C, 7, 8, 1e30, DL_DTYPE_I64), DL_ERR_ARG, "dl_arange_dtype: start 7, step 1e+30 for int64");
    BAD(dl_arange_dtype(C, 0, 3, 0, DL_DTYPE_I32), DL_ERR_ARG, "dl_arange_dtype: step must be non-zero");
    BAD(dl_arange_dtype(C, 0, 3, 1, (dl_dtype)-1), DL_ERR_ARG, "dl_arange_dtype: dtype -1 is none of");
    CHECK(dl_full_dtype(NULL, DL_SHAPE(2), 1, DL_DTYPE_I64) == NULL, "NULL ctx");
    {
        double dv[2] = {0.5, 1.5};
        dl_capture *cap;
        BAD(dl_from_doubles(C, DL_SHAPE(2), NULL), DL_ERR_ARG, "dl_from_doubles: values is NULL");
        BAD(dl_from_doubles(C, DL_SHAPE(2, -3), dv), DL_ERR_SHAPE, "dl_from_doubles: shape (2,-3) has a negative size");
        BAD(dl_from_doubles(C, DL_SHAPE(1 << 30, 1 << 30, 1 << 30), dv), DL_ERR_OOM, "dl_from_doubles");
        CHECK(dl_from_doubles(NULL, DL_SHAPE(2), dv) == NULL, "dl_from_doubles: NULL ctx");
        cap = dl_capture_begin(C);
        CHECK(cap && dl_from_doubles(C, DL_SHAPE(2), dv) == NULL, "dl_from_doubles in a capture refused");
        EXPECT_ERR(C, DL_ERR_UNSUPPORTED, "dl_from_doubles: a copy from the host");
        dl_capture_free(cap);
        dl_clear_error(C);
    }
    WORKS();
    dl_step_end(C);
}

/* Categorical(logits=) and (probs=): their checks, and an inner op's error named under it */
static void categorical_errors(void)
{
    int64_t iv[4] = {0, 7, 1, 2};
    dl_tensor *l = T(2, 4), *v = dl_from_int64(C, DL_SHAPE(2), iv);
    BAD(dl_categorical_entropy(dl_from_int64(C, DL_SHAPE(2), iv)), DL_ERR_DTYPE,
        "dl_categorical_entropy: logits (2) has dtype int64; this op needs float32");
    BAD(dl_categorical_sample(dl_full(C, DL_SHAPE(), 1.0f)), DL_ERR_SHAPE,
        "dl_categorical_sample: logits () must have at least one dim, its last (the categories) of size >= 1");
    BAD(dl_categorical_entropy(T(3, 0)), DL_ERR_SHAPE, "dl_categorical_entropy: logits (3,0) must have");
    BAD(dl_categorical_log_prob(l, T(2, 1)), DL_ERR_DTYPE,
        "dl_categorical_log_prob: value (2,1) has dtype float32; it must be int64 or int32 (category indices)");
    BAD(dl_categorical_log_prob(l, dl_full_dtype(C, DL_SHAPE(3), 1, DL_DTYPE_I64)), DL_ERR_SHAPE,
        "dl_categorical_log_prob: value (3) does not broadcast with the batch shape of logits (2,4) (its dims "
        "but the last): dim 0 of the result pairs size 3 with size 2 (sizes must match or one be 1)");
    BAD(dl_categorical_probs_log_prob(dl_randn(C, DL_SHAPE(2, 3, 4)), dl_full_dtype(C, DL_SHAPE(2, 2), 1, DL_DTYPE_I32)), DL_ERR_SHAPE,
        "dl_categorical_probs_log_prob: value (2,2) does not broadcast with the batch shape of probs (2,3,4)");
    BAD(dl_categorical_probs_log_prob(l, dl_from_int64(C, DL_SHAPE(3, 1), iv + 1)), DL_ERR_ARG,
        "dl_categorical_probs_log_prob: dl_gather: index (3,2,1) holds 7 at flat index 0: indices must be in [0, 4)");
    BAD(dl_categorical_probs_log_prob(l, T(1, 2)), DL_ERR_DTYPE,
        "dl_categorical_probs_log_prob: value (1,2) has dtype float32; it must be int64 or int32");
    BAD(dl_categorical_probs_entropy(dl_from_int64(C, DL_SHAPE(2), iv)), DL_ERR_DTYPE,
        "dl_categorical_probs_entropy: probs (2) has dtype int64; this op needs float32");
    BAD(dl_categorical_probs_sample(dl_zeros(C, DL_SHAPE(0))), DL_ERR_SHAPE,
        "dl_categorical_probs_sample: probs (0) must have at least one dim, its last (the categories) of size >= 1");
    {   /* a negative weight: dl_multinomial's check, of the normalized row */
        float pw[3] = {-1.0f, 2.0f, 1.0f};
        BAD(dl_categorical_probs_sample(dl_from_array(C, DL_SHAPE(3), pw)), DL_ERR_ARG,
            "dl_categorical_probs_sample: dl_multinomial: probs (1,3) holds -0.5 at row 0, category 0");
    }
    BAD(dl_categorical_log_prob(l, v), DL_ERR_ARG,
        "dl_categorical_log_prob: dl_gather: index (2,1) holds 7 at flat index 1: indices must be in [0, 4)");
    NULLOP(dl_categorical_log_prob(NULL, v));
    NULLOP(dl_categorical_log_prob(l, NULL));
    NULLOP(dl_categorical_entropy(NULL));
    NULLOP(dl_categorical_sample(NULL));
    NULLOP(dl_categorical_probs_log_prob(NULL, v));
    NULLOP(dl_categorical_probs_log_prob(l, NULL));
    NULLOP(dl_categorical_probs_entropy(NULL));
    NULLOP(dl_categorical_probs_sample(NULL));
    {   /* a draw on the host: refused inside a capture, under the function's name */
        dl_tensor *k = dl_keep(l);
        dl_capture *cap = dl_capture_begin(C);
        CHECK(cap && dl_categorical_sample(k) == NULL, "sample in a capture refused");
        EXPECT_ERR(C, DL_ERR_UNSUPPORTED, "dl_categorical_sample: dl_multinomial: a draw made on the host");
        dl_capture_free(cap);
        dl_free(k);
        dl_clear_error(C);
    }
    WORKS();
    dl_step_end(C);
}

/* dl_rnn_forward: an LSTM's initial state is h0 and c0 or neither */
static void rnn_errors(void)
{
    dl_module *m = dl_nn_lstm(C, 3, 4, NULL);
    dl_tensor *x = dl_randn(C, DL_SHAPE(5, 2, 3)), *hn = x, *cn = x;
    CHECK(m != NULL, "LSTM: %s", dl_error_message(C));
    BAD(dl_rnn_forward(m, x, dl_zeros(C, DL_SHAPE(1, 2, 4)), NULL, NULL, NULL), DL_ERR_ARG,
        "LSTM: h0 given without c0: an LSTM's initial state is both h0 and c0 or neither (torch's hx = (h0, c0); "
        "pass zeros for the other)");
    BAD(dl_rnn_forward(m, x, NULL, dl_zeros(C, DL_SHAPE(1, 2, 4)), &hn, &cn), DL_ERR_ARG,
        "LSTM: c0 given without h0: an LSTM's initial state is both h0 and c0 or neither");
    CHECK(hn == NULL && cn == NULL, "h_n, c_n NULL after the refusal");
    {   /* a state NULL from an earlier failure: that error is named too */
        dl_tensor *h0 = dl_reshape(dl_zeros(C, DL_SHAPE(1, 2, 4)), DL_SHAPE(3, 3));
        CHECK(h0 == NULL, "bad reshape");
        CHECK(dl_rnn_forward(m, x, h0, dl_zeros(C, DL_SHAPE(1, 2, 4)), NULL, NULL) == NULL, "LSTM after a failure");
        EXPECT_ERR2(C, DL_ERR_ARG, "LSTM: c0 given without h0",
                    "(an earlier error is pending, maybe why h0 is NULL: dl_reshape");
        WORKS();
    }
    CHECK(dl_rnn_forward(m, x, dl_zeros(C, DL_SHAPE(1, 2, 4)), dl_zeros(C, DL_SHAPE(1, 2, 4)), NULL, NULL) != NULL,
          "both: %s", dl_error_message(C));
    WORKS();
    {   /* a GRU's (or an LSTM's) NULL states while an earlier error is pending: that failure, not zeros */
        dl_module *g = dl_nn_gru(C, 3, 4, NULL);
        dl_tensor *h0 = dl_reshape(dl_zeros(C, DL_SHAPE(1, 2, 4)), DL_SHAPE(3, 3));
        CHECK(g != NULL && h0 == NULL, "GRU, bad reshape");
        hn = x;
        CHECK(dl_rnn_forward(g, x, h0, NULL, &hn, NULL) == NULL && hn == NULL, "GRU after a failure: NULL");
        CHECK(dl_last_error(C) == DL_ERR_SHAPE && strstr(dl_error_message(C), "dl_reshape"), "the first cause: %s",
              dl_error_message(C));
        CHECK(dl_rnn_forward(m, x, NULL, NULL, NULL, NULL) == NULL, "LSTM after a failure: NULL");
        EXPECT_ERR(C, DL_ERR_SHAPE, "dl_reshape");
        dl_clear_error(C);
        CHECK(dl_rnn_forward(g, x, NULL, NULL, &hn, NULL) != NULL && hn != NULL, "GRU, NULL h0 as zeros: %s",
              dl_error_message(C));
        WORKS();
    }
    dl_step_end(C);
}

/* attention: shapes, masks, dropout_p, scale; MultiheadAttention's
   constructor and forward */
static void attention_errors(void)
{
    dl_tensor *q = dl_randn(C, DL_SHAPE(2, 3, 4)), *k = dl_randn(C, DL_SHAPE(2, 5, 4));
    dl_tensor *v = dl_randn(C, DL_SHAPE(2, 5, 6)), *w = q;
    dl_module *m, *lin = dl_nn_linear(C, 2, 2, true);
    BAD(dl_scaled_dot_product_attention(q, dl_randn(C, DL_SHAPE(2, 5, 3)), v, NULL, 0.0f, false, 0.0f),
        DL_ERR_SHAPE, "dl_scaled_dot_product_attention: q (2,3,4), k (2,5,3), v (2,5,6): q and k must end in the "
        "same size E, k and v have the same second-last size S");
    BAD(dl_scaled_dot_product_attention(q, k, dl_randn(C, DL_SHAPE(2, 4, 6)), NULL, 0.0f, false, 0.0f),
        DL_ERR_SHAPE, "k and v have the same second-last size S");
    BAD(dl_scaled_dot_product_attention(dl_randn(C, DL_SHAPE(4)), k, v, NULL, 0.0f, false, 0.0f), DL_ERR_SHAPE,
        "q (4), k (2,5,4) and v (2,5,6) must have 2 dims at least");
    BAD(dl_scaled_dot_product_attention(q, dl_randn(C, DL_SHAPE(3, 5, 4)), v, NULL, 0.0f, false, 0.0f),
        DL_ERR_SHAPE, "the batch dims of q (2,3,4), k (3,5,4) and v (2,5,6) (all but the last two) do not broadcast");
    BAD(dl_scaled_dot_product_attention(q, k, v, dl_zeros(C, DL_SHAPE(3, 4)), 0.0f, false, 0.0f), DL_ERR_SHAPE,
        "attn_mask (3,4) does not broadcast to the scores (2,3,5) (the batch dims, L, S)");
    BAD(dl_scaled_dot_product_attention(q, k, v, dl_zeros(C, DL_SHAPE(3, 2, 3, 5)), 0.0f, false, 0.0f),
        DL_ERR_SHAPE, "attn_mask (3,2,3,5) does not broadcast to the scores (2,3,5)");
    BAD(dl_scaled_dot_product_attention(q, k, v, dl_zeros(C, DL_SHAPE(3, 5)), 0.0f, true, 0.0f), DL_ERR_ARG,
        "dl_scaled_dot_product_attention: attn_mask and is_causal are both set (torch's rule: one or the other)");
    BAD(dl_scaled_dot_product_attention(q, k, v, NULL, 1.0f, false, 0.0f), DL_ERR_ARG,
        "dl_scaled_dot_product_attention: dropout_p=1 must be in [0, 1)");
    BAD(dl_scaled_dot_product_attention(q, k, v, NULL, -0.1f, false, 0.0f), DL_ERR_ARG, "dropout_p=-0.1 must be");
    BAD(dl_scaled_dot_product_attention(q, k, v, NULL, NAN, false, 0.0f), DL_ERR_ARG, "dropout_p=nan must be");
    BAD(dl_scaled_dot_product_attention(q, k, v, NULL, 0.0f, false, INFINITY), DL_ERR_ARG,
        "dl_scaled_dot_product_attention: scale=inf must be finite (0: torch's default 1/sqrt(E))");
    BAD(dl_scaled_dot_product_attention(q, k, dl_zeros_dtype(C, DL_SHAPE(2, 5, 6), DL_DTYPE_I64), NULL, 0.0f, false,
                                        0.0f), DL_ERR_DTYPE, "dl_scaled_dot_product_attention: v (2,5,6) has dtype int64");
    NULLOP(dl_scaled_dot_product_attention(NULL, k, v, NULL, 0.0f, false, 0.0f));
    /* the constructor */
    CHECK(dl_nn_multihead_attention(C, 6, 4, 0.0f, true) == NULL, "embed_dim 6, 4 heads refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_multihead_attention: embed_dim=6 and num_heads=4 must be positive, embed_dim "
               "divisible by num_heads");
    WORKS();
    CHECK(dl_nn_multihead_attention(C, 8, 0, 0.0f, true) == NULL, "0 heads refused");
    EXPECT_ERR(C, DL_ERR_ARG, "num_heads=0 must be positive");
    CHECK(dl_nn_multihead_attention(C, 8, 2, 1.0f, true) == NULL, "dropout 1 refused");
    EXPECT_ERR(C, DL_ERR_ARG, "dl_nn_multihead_attention: dropout=1 must be in [0, 1)");
    CHECK(dl_nn_multihead_attention(NULL, 8, 2, 0.0f, true) == NULL, "NULL ctx");
    WORKS();
    /* the forward */
    m = dl_nn_multihead_attention(C, 4, 2, 0.0f, true);
    CHECK(m != NULL, "MHA: %s", dl_error_message(C));
    BAD(dl_mha_forward(m, q, dl_randn(C, DL_SHAPE(2, 5, 3)), v, NULL, NULL, false, NULL), DL_ERR_SHAPE,
        "dl_mha_forward: query (2,3,4), key (2,5,3), value (2,5,6) must be (N, L, E), (N, S, E), (N, S, E) "
        "(batch_first; unbatched: (L, E), (S, E), (S, E)) with E = embed_dim = 4");
    BAD(dl_mha_forward(m, q, k, dl_randn(C, DL_SHAPE(3, 5, 4)), NULL, NULL, false, NULL), DL_ERR_SHAPE,
        "value (3,5,4) must be (N, L, E)");
    BAD(dl_mha_forward(m, dl_randn(C, DL_SHAPE(3, 4)), k, k, NULL, NULL, false, NULL), DL_ERR_SHAPE,
        "query (3,4), key (2,5,4)");
    BAD(dl_mha_forward(m, q, k, k, dl_zeros(C, DL_SHAPE(2, 4)), NULL, false, &w), DL_ERR_SHAPE,
        "dl_mha_forward: key_padding_mask (2,4) must be (N, S) = (2, 5) (unbatched: (S))");
    CHECK(w == NULL, "attn_weights NULL after a refusal");
    BAD(dl_mha_forward(m, q, k, k, NULL, dl_zeros(C, DL_SHAPE(5, 3)), false, NULL), DL_ERR_SHAPE,
        "dl_mha_forward: attn_mask (5,3) must be (L, S) = (3, 5) or (N*num_heads, L, S) = (4, 3, 5)");
    BAD(dl_mha_forward(m, q, k, k, NULL, dl_zeros(C, DL_SHAPE(2, 3, 5)), false, NULL), DL_ERR_SHAPE,
        "attn_mask (2,3,5) must be (L, S)");
    BAD(dl_mha_forward(lin, q, k, k, NULL, NULL, false, NULL), DL_ERR_ARG,
        "dl_mha_forward: m is a Linear; it takes a MultiheadAttention (dl_nn_multihead_attention)");
    BAD(dl_mha_forward(NULL, q, k, k, NULL, NULL, false, NULL), DL_ERR_ARG, "dl_mha_forward: m is NULL");
    NULLOP(dl_mha_forward(m, q, NULL, k, NULL, NULL, false, NULL));
    CHECK(dl_mha_forward(m, q, k, k, dl_zeros_dtype(C, DL_SHAPE(2, 5), DL_DTYPE_I32), NULL, true, &w) != NULL &&
          w != NULL, "MHA works after the refusals: %s", dl_error_message(C));
    WORKS();
    {   /* a NULL mask while an earlier error is pending: that failure, not "no mask" */
        dl_tensor *bad = dl_reshape(q, DL_SHAPE(5, 5));
        CHECK(bad == NULL, "bad reshape");
        CHECK(dl_scaled_dot_product_attention(q, k, v, bad, 0.0f, false, 0.0f) == NULL, "SDPA: NULL");
        CHECK(dl_mha_forward(m, q, k, k, NULL, bad, false, &w) == NULL && w == NULL, "MHA: NULL");
        EXPECT_ERR(C, DL_ERR_SHAPE, "dl_reshape");
        CHECK(dl_scaled_dot_product_attention(q, k, v, NULL, 0.0f, false, 0.0f) != NULL, "SDPA, no mask: %s",
              dl_error_message(C));
        WORKS();
        /* an error of an earlier step, left pending (handled): NULL masks mean none, as a NULL h0 zeros */
        CHECK(dl_reshape(q, DL_SHAPE(5, 5)) == NULL, "bad reshape");
        dl_step_end(C);
        q = dl_randn(C, DL_SHAPE(2, 3, 4));
        k = dl_randn(C, DL_SHAPE(2, 5, 4));
        v = dl_randn(C, DL_SHAPE(2, 5, 6));
        CHECK(dl_scaled_dot_product_attention(q, k, v, NULL, 0.0f, false, 0.0f) != NULL &&
              dl_mha_forward(m, q, k, k, NULL, NULL, false, NULL) != NULL, "an older error does not count");
        EXPECT_ERR(C, DL_ERR_SHAPE, "dl_reshape");
    }
    {   /* a stale q with no mask: named, not read (a capture's tensor after dl_capture_free) */
        dl_tensor *a = dl_keep(dl_randn(C, DL_SHAPE(2, 3))), *kk = dl_keep(dl_randn(C, DL_SHAPE(4, 3))), *sq;
        dl_capture *cap = dl_capture_begin(C);
        sq = dl_mul_scalar(a, 2.0f);
        CHECK(cap && sq && dl_capture_end(cap) == DL_OK, "capture: %s", dl_error_message(C));
        dl_capture_free(cap);
        dl_step_end(C);
        BAD(dl_scaled_dot_product_attention(sq, kk, kk, NULL, 0.0f, false, 0.0f), DL_ERR_STALE,
            "dl_scaled_dot_product_attention: q ");
        dl_free(a);
        dl_free(kk);
    }
    dl_step_end(C);
}

int main(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    C = dl_ctx_init(&d);
    if (!C) { printf("no context\n0 passed, 1 failed\n"); return 1; }
    dl_manual_seed(C, 42);
    result_strings();
    shape_errors();
    dl_step_end(C);
    dim_errors();
    dl_step_end(C);
    dtype_errors();
    dl_step_end(C);
    null_inputs();
    dl_step_end(C);
    step_errors();
    autograd_errors();
    size_errors();
    misc_errors();
    anomaly_errors();
    embedding_errors();
    selection_errors();
    group_norm_errors();
    upsample_errors();
    rnn_errors();
    attention_errors();
    dtype_creator_errors();
    categorical_errors();
    CHECK(dl_last_error(C) == DL_OK, "stray error at the end: %s", dl_error_message(C));
    dl_ctx_free(C);
    TEST_END();
}
