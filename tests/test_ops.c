/* tests/test_ops.c - forward values checked by hand, views and copies,
   dtypes, and dl_matmul against a naive double-precision reference over the
   torch.matmul cases (run also as C++ and with -DDL_OPENBLAS). */
#define DL_IMPLEMENTATION
#include "dl.h"
#include <float.h>
#include "harness.h"
#include <stdlib.h>

static dl_ctx *ctx;
static float at(dl_tensor *t, long i) { return th_f(t, i); }
static int shape_is(dl_tensor *t, int nd, int64_t a, int64_t b, int64_t c)
{
    int64_t s[3];
    int i;
    s[0] = a; s[1] = b; s[2] = c;
    if (!t || t->ndim != nd) return 0;
    for (i = 0; i < nd && i < 3; i++) if (t->shape[i] != s[i]) return 0;
    return 1;
}

static void test_values(void)
{
    float av[6] = {1, -2, 3, -4, 5, -6}, bv[3] = {10, 20, 30};
    dl_tensor *a = dl_from_array(ctx, DL_SHAPE(2, 3), av), *b = dl_from_array(ctx, DL_SHAPE(3), bv), *y;
    y = dl_add(a, b);
    CHECK(shape_is(y, 2, 2, 3, 0) && at(y, 0) == 11 && at(y, 5) == 24, "add broadcast");
    y = dl_sub(b, a);
    CHECK(at(y, 1) == 22 && at(y, 3) == 14, "sub broadcast (left smaller)");
    y = dl_mul(a, dl_reshape(dl_from_array(ctx, DL_SHAPE(2), bv), DL_SHAPE(2, 1)));
    CHECK(at(y, 2) == 30 && at(y, 3) == -80, "mul column broadcast");
    y = dl_div(a, b);
    CHECK(fabsf(at(y, 1) + 0.1f) < 1e-7f, "div");
    y = dl_maximum(a, dl_full(ctx, DL_SHAPE(1), 0.0f));
    CHECK(at(y, 0) == 1 && at(y, 1) == 0, "maximum");
    y = dl_minimum(a, dl_full(ctx, DL_SHAPE(1), 0.0f));
    CHECK(at(y, 0) == 0 && at(y, 1) == -2, "minimum");
    CHECK(at(dl_relu(a), 1) == 0 && at(dl_relu(a), 2) == 3, "relu");
    CHECK(fabsf(at(dl_leaky_relu(a, 0.1f), 1) + 0.2f) < 1e-7f, "leaky_relu");
    CHECK(at(dl_abs(a), 5) == 6 && at(dl_neg(a), 0) == -1, "abs/neg");
    CHECK(at(dl_clamp(a, -1, 2), 2) == 2 && at(dl_clamp(a, -1, 2), 3) == -1, "clamp");
    CHECK(fabsf(at(dl_pow(b, 0.5f), 0) - sqrtf(10)) < 1e-6f && at(dl_pow(b, 2), 1) == 400, "pow");
    CHECK(fabsf(at(dl_sigmoid(a), 0) - 0.7310586f) < 1e-6f, "sigmoid");
    CHECK(fabsf(at(dl_gelu(a), 0) - 0.8413447f) < 1e-6f, "gelu (erf form)");
    CHECK(fabsf(at(dl_tanh(a), 0) - 0.7615942f) < 1e-6f && fabsf(at(dl_erf(a), 0) - 0.8427008f) < 1e-6f, "tanh/erf");
    CHECK(fabsf(at(dl_log(dl_exp(a)), 4) - 5) < 1e-5f && at(dl_sqrt(b), 0) == sqrtf(10), "exp/log/sqrt");
    CHECK(at(dl_add_scalar(a, 1), 0) == 2 && at(dl_sub_scalar(a, 1), 0) == 0 && at(dl_mul_scalar(a, 2), 1) == -4 &&
          at(dl_div_scalar(a, 2), 0) == 0.5f && at(dl_rsub_scalar(a, 1), 0) == 0, "scalar ops");
    {   /* sigmoid is stable for large magnitudes */
        float big[2] = {-1000, 1000};
        dl_tensor *s = dl_sigmoid(dl_from_array(ctx, DL_SHAPE(2), big));
        CHECK(at(s, 0) == 0 && at(s, 1) == 1, "sigmoid saturates without NaN");
    }
    {   /* multinomial: frequencies, no repeats without replacement, the seed repeats the draws */
        float pv[8] = {0.1f, 0.0f, 0.6f, 0.3f, 1, 1, 1, 1};
        static int64_t o[60000], o2[60000];
        int cnt[4] = {0, 0, 0, 0}, i;
        dl_tensor *p = dl_from_array(ctx, DL_SHAPE(2, 4), pv), *y;
        dl_manual_seed(ctx, 5);
        y = dl_multinomial(p, 30000, true);
        CHECK(y && y->dtype == DL_DTYPE_I64 && y->ndim == 2 && y->shape[1] == 30000 &&
              dl_read_int64(y, o, 60000) == DL_OK, "multinomial (2,4) x 30000: %s", dl_error_message(ctx));
        for (i = 0; i < 30000; i++) cnt[o[i] & 3]++;
        CHECK(cnt[1] == 0 && abs(cnt[0] - 3000) < 300 && abs(cnt[2] - 18000) < 450 && abs(cnt[3] - 9000) < 400,
              "frequencies 0.1 0 0.6 0.3: %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
        for (i = 0; i < 4; i++) cnt[i] = 0;
        for (i = 30000; i < 60000; i++) cnt[o[i] & 3]++;
        CHECK(abs(cnt[0] - 7500) < 350 && abs(cnt[3] - 7500) < 350, "uniform row: %d %d", cnt[0], cnt[3]);
        dl_manual_seed(ctx, 5);
        CHECK(dl_read_int64(dl_multinomial(p, 30000, true), o2, 60000) == DL_OK &&
              memcmp(o, o2, sizeof o) == 0, "the same seed, the same draws");
        y = dl_multinomial(dl_narrow(p, 0, 1, 1), 4, false);
        CHECK(y && dl_read_int64(y, o, 4) == DL_OK && o[0] + o[1] + o[2] + o[3] == 6 &&
              o[0] != o[1] && o[0] != o[2] && o[0] != o[3] && o[1] != o[2] && o[1] != o[3] && o[2] != o[3],
              "without replacement: a permutation of 0..3");
        y = dl_multinomial(dl_reshape(dl_narrow(p, 0, 0, 1), DL_SHAPE(4)), 3, false);
        CHECK(y && y->ndim == 1 && dl_read_int64(y, o, 3) == DL_OK && o[0] != 1 && o[1] != 1 && o[2] != 1,
              "(C) -> (3): never the zero weight");
    }
    {   /* Categorical(logits=).sample(): frequencies, shapes, a -inf logit never drawn, the seed repeats */
        static float lv[3 * 6000];
        static int64_t o[6000], o2[6000];
        int cnt[3] = {0, 0, 0}, i;
        dl_tensor *l, *y;
        for (i = 0; i < 6000; i++) {
            lv[3 * i] = logf(0.1f);
            lv[3 * i + 1] = -INFINITY;
            lv[3 * i + 2] = logf(0.9f);
        }
        l = dl_from_array(ctx, DL_SHAPE(2, 3000, 3), lv);
        dl_manual_seed(ctx, 9);
        y = dl_categorical_sample(l);
        CHECK(y && y->dtype == DL_DTYPE_I64 && y->ndim == 2 && y->shape[0] == 2 && y->shape[1] == 3000 &&
              dl_read_int64(y, o, 6000) == DL_OK, "sample of (2,3000,3): (2,3000) int64: %s", dl_error_message(ctx));
        for (i = 0; i < 6000; i++) cnt[o[i] < 0 || o[i] > 2 ? 1 : o[i]]++;
        CHECK(cnt[1] == 0 && abs(cnt[0] - 600) < 90 && abs(cnt[2] - 5400) < 90, "frequencies 0.1 0 0.9: %d %d %d",
              cnt[0], cnt[1], cnt[2]);
        dl_manual_seed(ctx, 9);
        CHECK(dl_read_int64(dl_categorical_sample(l), o2, 6000) == DL_OK && memcmp(o, o2, sizeof o) == 0,
              "sample: the same seed, the same draws");
        y = dl_categorical_sample(dl_from_array(ctx, DL_SHAPE(3), lv));
        CHECK(y && y->ndim == 0 && dl_read_int64(y, o, 1) == DL_OK && (o[0] == 0 || o[0] == 2), "(C) -> 0-d");
        y = dl_categorical_sample(dl_zeros(ctx, DL_SHAPE(0, 4)));
        CHECK(y && y->ndim == 1 && y->numel == 0 && y->dtype == DL_DTYPE_I64, "an empty batch: (0)");
        y = dl_categorical_log_prob(dl_from_array(ctx, DL_SHAPE(3), lv), dl_full_dtype(ctx, DL_SHAPE(), 2, DL_DTYPE_I32));
        CHECK(y && y->ndim == 0 && fabsf(dl_item(y) - logf(0.9f)) < 1e-6f, "log_prob, int32 0-d value: %g",
              y ? (double)dl_item(y) : -1.0);

        {   /* probs=: weights normalized, a zero weight never drawn; log_prob broadcast (3,1) x (2) -> (3,2) */
            static float pv[3 * 6000];
            float q[6] = {1.0f, 0.0f, 3.0f, 2.0f, 2.0f, 0.0f}, lp[6];
            int64_t v[3] = {0, 1, 2};
            cnt[0] = cnt[1] = cnt[2] = 0;
            for (i = 0; i < 6000; i++) {
                pv[3 * i] = 1.0f;
                pv[3 * i + 1] = 0.0f;
                pv[3 * i + 2] = 3.0f;
            }
            y = dl_categorical_probs_sample(dl_from_array(ctx, DL_SHAPE(6000, 3), pv));
            CHECK(y && y->ndim == 1 && y->shape[0] == 6000 && dl_read_int64(y, o, 6000) == DL_OK,
                  "probs sample (6000,3): %s", dl_error_message(ctx));
            for (i = 0; i < 6000; i++) cnt[o[i] < 0 || o[i] > 2 ? 1 : o[i]]++;
            CHECK(cnt[1] == 0 && abs(cnt[0] - 1500) < 150 && abs(cnt[2] - 4500) < 150,
                  "probs frequencies 1/4 0 3/4: %d %d %d", cnt[0], cnt[1], cnt[2]);
            y = dl_categorical_probs_log_prob(dl_from_array(ctx, DL_SHAPE(2, 3), q),
                                              dl_from_int64(ctx, DL_SHAPE(3, 1), v));
            CHECK(y && y->ndim == 2 && y->shape[0] == 3 && y->shape[1] == 2 && dl_read(y, lp, 6) == DL_OK &&
                  fabsf(lp[0] - logf(0.25f)) < 1e-6f && fabsf(lp[1] - logf(0.5f)) < 1e-6f &&
                  fabsf(lp[2] - logf(FLT_EPSILON)) < 1e-5f && fabsf(lp[3] - logf(0.5f)) < 1e-6f &&
                  fabsf(lp[4] - logf(0.75f)) < 1e-6f && fabsf(lp[5] - logf(FLT_EPSILON)) < 1e-5f,
                  "probs log_prob (3,1) x batch (2): log(clamp(q, eps, 1 - eps))");
            y = dl_categorical_log_prob(dl_log(dl_from_array(ctx, DL_SHAPE(2, 3), q)),
                                        dl_from_int64(ctx, DL_SHAPE(3, 1), v));
            CHECK(y && y->ndim == 2 && dl_read(y, lp, 6) == DL_OK && fabsf(lp[0] - logf(0.25f)) < 1e-6f &&
                  isinf(lp[2]) && lp[2] < 0 && fabsf(lp[4] - logf(0.75f)) < 1e-6f,
                  "logits log_prob (3,1) x batch (2)");
            y = dl_categorical_probs_entropy(dl_from_array(ctx, DL_SHAPE(2, 3), q));
            CHECK(y && dl_read(y, lp, 2) == DL_OK &&
                  fabsf(lp[0] - (-(0.25f * logf(0.25f) + 0.75f * logf(0.75f)))) < 1e-6f &&
                  fabsf(lp[1] - logf(2.0f)) < 1e-6f, "probs entropy: a zero weight adds 0");
        }
    }
    {   /* dtype conversions: torch's .long(), .int(), .float() (values from torch 2.15 on x86) */
        /* (16777216, not the literal 16777217.0f: nvcc's front end rounds that halfway literal up to
           16777218, gcc to even, 16777216) */
        float v[8] = {-2.7f, 2.7f, NAN, 1e20f, -1e20f, 3.0f, -0.5f, 16777216.0f}, f[3];
        int64_t o[8], big[3] = {((int64_t)1 << 40) | 5, -3, 16777217};
        int64_t want[8] = {-2, 2, INT64_MIN, INT64_MIN, INT64_MIN, 3, 0, 16777216};
        int64_t want32[8] = {-2, 2, INT32_MIN, INT32_MIN, INT32_MIN, 3, 0, 16777216};
        dl_tensor *x = dl_from_array(ctx, DL_SHAPE(8), v), *bi = dl_from_int64(ctx, DL_SHAPE(3), big);
        CHECK(dl_read_int64(dl_to_dtype(x, DL_DTYPE_I64), o, 8) == DL_OK && memcmp(o, want, sizeof o) == 0,
              ".long(): truncation, NaN and out of range INT64_MIN");
        CHECK(dl_read_int64(dl_to_dtype(dl_to_dtype(x, DL_DTYPE_I32), DL_DTYPE_I64), o, 8) == DL_OK &&
              memcmp(o, want32, sizeof o) == 0, ".int(): INT32_MIN out of range");
        CHECK(dl_read(dl_to_dtype(bi, DL_DTYPE_F32), f, 3) == DL_OK && f[0] == 1099511627776.0f && f[1] == -3.0f &&
              f[2] == 16777216.0f, ".float() of int64: to nearest");
        CHECK(dl_read_int64(dl_to_dtype(dl_to_dtype(bi, DL_DTYPE_I32), DL_DTYPE_I64), o, 3) == DL_OK && o[0] == 5 &&
              o[1] == -3 && o[2] == 16777217, "int64 -> int32 wraps");
        CHECK(dl_to_dtype(x, DL_DTYPE_F32) == x && !dl_to_dtype(bi, DL_DTYPE_F32)->requires_grad,
              "same dtype: the tensor itself; converted: no grad");
    }
    {   /* creators with a dtype: torch.zeros/ones/full/arange(..., dtype=) (torch 2.x's values) */
        int64_t o[6], big = ((int64_t)1 << 40) + 3;
        float f[4], g[4];
        dl_tensor *z64 = dl_zeros_dtype(ctx, DL_SHAPE(2, 3), DL_DTYPE_I64), *z32 = dl_zeros_dtype(ctx, DL_SHAPE(5),
                                                                                                  DL_DTYPE_I32);
        dl_tensor *o32 = dl_ones_dtype(ctx, DL_SHAPE(3), DL_DTYPE_I32), *zf = dl_zeros_dtype(ctx, DL_SHAPE(2), DL_DTYPE_F32);
        CHECK(z64 && z64->dtype == DL_DTYPE_I64 && z64->ndim == 2 && dl_read_int64(z64, o, 6) == DL_OK && o[0] == 0 &&
              o[5] == 0, "dl_zeros_dtype int64 (2,3)");
        CHECK(z32 && z32->dtype == DL_DTYPE_I32 && dl_read_int64(z32, o, 5) == DL_OK && o[0] == 0 && o[4] == 0,
              "dl_zeros_dtype int32");
        CHECK(o32 && o32->dtype == DL_DTYPE_I32 && dl_read_int64(o32, o, 3) == DL_OK && o[0] == 1 && o[2] == 1,
              "dl_ones_dtype int32");
        CHECK(zf && zf->dtype == DL_DTYPE_F32 && dl_read(zf, f, 2) == DL_OK && f[0] == 0.0f && !signbit(f[1]),
              "dl_zeros_dtype float32");
        CHECK(dl_read_int64(dl_full_dtype(ctx, DL_SHAPE(2, 2), (double)big, DL_DTYPE_I64), o, 4) == DL_OK &&
              o[0] == big && o[3] == big, "dl_full_dtype int64 2^40 + 3: exact");
        CHECK(dl_read_int64(dl_full_dtype(ctx, DL_SHAPE(3), 2.7, DL_DTYPE_I32), o, 3) == DL_OK && o[0] == 2 &&
              o[2] == 2 && dl_read_int64(dl_full_dtype(ctx, DL_SHAPE(2), -2.7, DL_DTYPE_I64), o, 2) == DL_OK &&
              o[1] == -2, "dl_full_dtype 2.7 -> 2, -2.7 -> -2 (toward zero, torch's)");
        CHECK(dl_read_int64(dl_full_dtype(ctx, DL_SHAPE(4), -2147483648.0, DL_DTYPE_I32), o, 4) == DL_OK &&
              o[3] == INT32_MIN && dl_read_int64(dl_full_dtype(ctx, DL_SHAPE(4), -100, DL_DTYPE_I64), o, 4) == DL_OK &&
              o[3] == -100, "dl_full_dtype INT32_MIN, -100");
        CHECK(dl_full_dtype(ctx, DL_SHAPE(), 7, DL_DTYPE_I64) && dl_full_dtype(ctx, DL_SHAPE(), 7, DL_DTYPE_I64)->ndim == 0 &&
              dl_read_int64(dl_full_dtype(ctx, DL_SHAPE(), 7, DL_DTYPE_I64), o, 1) == DL_OK && o[0] == 7 &&
              dl_full_dtype(ctx, DL_SHAPE(0, 3), 7, DL_DTYPE_I32) &&
              dl_full_dtype(ctx, DL_SHAPE(0, 3), 7, DL_DTYPE_I32)->numel == 0, "0-d and empty");
        CHECK(dl_read(dl_full_dtype(ctx, DL_SHAPE(1), 0.1, DL_DTYPE_F32), f, 1) == DL_OK && f[0] == 0.1f,
              "dl_full_dtype float32: the double rounded to nearest");
        CHECK(dl_read_int64(dl_arange_dtype(ctx, 0.5, 3, 1, DL_DTYPE_I64), o, 3) == DL_OK && o[0] == 0 && o[2] == 2 &&
              dl_arange_dtype(ctx, 0, 5, 1.5, DL_DTYPE_I64)->numel == 4 &&
              dl_read_int64(dl_arange_dtype(ctx, 0, 5, 1.5, DL_DTYPE_I64), o, 4) == DL_OK && o[1] == 1 && o[3] == 3 &&
              dl_read_int64(dl_arange_dtype(ctx, -2.5, 2, 1, DL_DTYPE_I32), o, 5) == DL_OK && o[0] == -2 && o[4] == 2 &&
              dl_arange_dtype(ctx, -2.5, 2, 1, DL_DTYPE_I32)->dtype == DL_DTYPE_I32,
              "dl_arange_dtype: torch's trunc(start) + i trunc(step), the count from the doubles");
        CHECK(dl_read_int64(dl_arange_dtype(ctx, 16777216, 16777210, -2, DL_DTYPE_I64), o, 3) == DL_OK &&
              o[0] == 16777216 && o[2] == 16777212, "dl_arange_dtype at 2^24");
        {   /* past 2^24: exact over int64's range (torch 2.15's values) */
            static int64_t big[10000];
            int64_t k;
            int ok = 1;
            CHECK(dl_read_int64(dl_arange_dtype(ctx, 0, 1073741824.0, 1048576.0, DL_DTYPE_I64), big, 1024) == DL_OK &&
                  big[1] == 1048576 && big[1023] == 1072693248, "arange(0, 2^30, 2^20, int64)");
            CHECK(dl_read_int64(dl_arange_dtype(ctx, 9007199254740992.0, 9007199254741002.0, 3, DL_DTYPE_I64), o, 4) ==
                  DL_OK && o[0] == 9007199254740992LL && o[1] == 9007199254740995LL && o[3] == 9007199254741001LL,
                  "arange(2^53, 2^53 + 10, 3): odd values past 2^53");
            CHECK(dl_read_int64(dl_arange_dtype(ctx, -9223372036854775808.0, 4611686018427387904.0,
                                                2305843009213693952.0, DL_DTYPE_I64), o, 6) == DL_OK &&
                  o[0] == INT64_MIN && o[1] == -6917529027641081856LL && o[5] == 2305843009213693952LL,
                  "arange(-2^63, 2^62, 2^61): from int64's least");
            CHECK(dl_read_int64(dl_arange_dtype(ctx, 9223372036854774784.0, 0, -2305843009213693952.0, DL_DTYPE_I64),
                                o, 4) == DL_OK && o[0] == 9223372036854774784LL && o[3] == 2305843009213692928LL,
                  "arange(2^63 - 1024, 0, -2^61): from the greatest double below 2^63, down");
            CHECK(dl_read_int64(dl_arange_dtype(ctx, 1e18, 1e18 + 100, 7, DL_DTYPE_I64), big, 19) == DL_OK &&
                  big[1] == 1000000000000000007LL && big[18] == 1000000000000000126LL, "arange(1e18, 1e18 + 100, 7): 19");
            CHECK(dl_read_int64(dl_arange_dtype(ctx, 5, 33554437.0, 1048576.0, DL_DTYPE_I32), big, 32) == DL_OK &&
                  big[1] == 1048581 && big[31] == 32505861 &&
                  dl_read_int64(dl_arange_dtype(ctx, -2147483648.0, 0, 1073741824.0, DL_DTYPE_I32), o, 2) == DL_OK &&
                  o[0] == INT32_MIN && o[1] == -1073741824, "int32 past 2^24, to int32's least");
            /* 10000 values: three rows of 4096 from their starts */
            CHECK(dl_read_int64(dl_arange_dtype(ctx, 1099511627776.0, 1099511657776.0, 3, DL_DTYPE_I64), big, 10000) ==
                  DL_OK, "arange(2^40, 2^40 + 30000, 3)");
            for (k = 0; k < 10000; k++) ok &= big[k] == 1099511627776LL + 3 * k;
            CHECK(ok, "arange(2^40, 2^40 + 30000, 3): every value");
            CHECK(dl_read_int64(dl_arange_dtype(ctx, -16777300.0, -16777000.5, 1.9, DL_DTYPE_I64), big, 158) ==
                  DL_OK && big[0] == -16777300 && big[157] == -16777143, "arange(-16777300, -16777000.5, 1.9): "
                  "158, step 1, into +-2^24");
        }
        CHECK(dl_read(dl_arange_dtype(ctx, 0, 0.3, 0.1, DL_DTYPE_F32), f, 3) == DL_OK &&
              dl_read(dl_arange(ctx, 0, 0.3, 0.1), g, 3) == DL_OK && memcmp(f, g, sizeof(float) * 3) == 0 &&
              dl_arange_dtype(ctx, 0, 0.3, 0.1, DL_DTYPE_F32)->numel == 3, "dl_arange_dtype float32 = dl_arange");
    }
    {   /* dl_from_doubles: torch.tensor(Python floats)'s float32 bits (torch 2.x on x86) */
        double dv[13] = {0.1, 1.0 / 3.0, 1e39, -1e39, 1e-46, 7e-46, NAN, -0.0, 16777217.0, 16777219.0,
                         3.4028235677973366e38, 3.4028235677973362e38, 2.1019476964872256e-45};
        uint32_t want[13] = {0x3dcccccd, 0x3eaaaaab, 0x7f800000, 0xff800000, 0, 0, 0x7fc00000, 0x80000000,
                             0x4b800000, 0x4b800002, 0x7f800000, 0x7f7fffff, 2}, got[13];
        float f[13];
        dl_tensor *t = dl_from_doubles(ctx, DL_SHAPE(13), dv), *e = dl_from_doubles(ctx, DL_SHAPE(0, 2), NULL);
        int i, ok;
        CHECK(t && t->dtype == DL_DTYPE_F32 && t->ndim == 1 && dl_read(t, f, 13) == DL_OK, "dl_from_doubles: %s",
              dl_error_message(ctx));
        memcpy(got, f, sizeof got);
        for (i = 0, ok = 1; i < 13; i++) ok &= i == 6 ? isnan(f[i]) : got[i] == want[i];
        CHECK(ok, "dl_from_doubles: each double to the nearest float32 (ties to even, inf past FLT_MAX, 0 below "
              "half the smallest subnormal), torch's bits");
        CHECK(e && e->numel == 0 && e->ndim == 2, "dl_from_doubles: no elements, NULL values");
        CHECK(dl_from_doubles(ctx, DL_SHAPE(), dv) && dl_item(dl_from_doubles(ctx, DL_SHAPE(), dv)) == 0.1f, "0-d");
    }
    {   /* below -88.72, torch's 1/(1 + exp(-x)): exactly 0 (SiLU -0), not a
           subnormal, so BCE of it clamps log 0 to -100 as torch's (40 here) */
        float deep[4] = {-88.8f, -90.0f, -100.0f, -103.0f}, y04 = 0.4f;
        dl_tensor *x = dl_from_array(ctx, DL_SHAPE(4), deep), *s = dl_sigmoid(x), *l = dl_silu(x), *bce;
        dl_loss_desc ld;
        int k, ok = 1;
        for (k = 0; k < 4; k++) ok &= at(s, k) == 0.0f && at(l, k) == 0.0f && signbit(at(l, k));
        CHECK(ok, "sigmoid 0 and silu -0 below -88.72 (torch's): %g %g", (double)at(s, 1), (double)at(l, 1));
        memset(&ld, 0, sizeof ld);
        ld.reduction = DL_REDUCTION_SUM;
        bce = dl_binary_cross_entropy(dl_sigmoid(dl_full(ctx, DL_SHAPE(1), -100.0f)),
                                      dl_full(ctx, DL_SHAPE(1), y04), &ld);
        CHECK(bce && dl_item(bce) == 40.0f, "BCE(sigmoid(-100), 0.4) = 40 as torch's: %.9g", bce ? (double)dl_item(bce) : -1.0);
        CHECK(fabsf(at(dl_sigmoid(dl_full(ctx, DL_SHAPE(1), -88.7f)), 0) - 3.00663579e-39f) <= 1e-44f,
              "sigmoid(-88.7) subnormal, torch's 3.00663579e-39");
    }
    /* reductions */
    y = dl_sum(a, DL_DIMS(0), false);
    CHECK(shape_is(y, 1, 3, 0, 0) && at(y, 0) == -3 && at(y, 2) == -3, "sum dim 0");
    y = dl_sum(a, DL_DIMS(-1), true);
    CHECK(shape_is(y, 2, 2, 1, 0) && at(y, 0) == 2 && at(y, 1) == -5, "sum dim -1 keepdim");
    y = dl_sum(a, DL_ALL, false);
    CHECK(y && y->ndim == 0 && at(y, 0) == -3, "sum all");
    CHECK(at(dl_mean(a, DL_ALL, false), 0) == -0.5f, "mean");
    y = dl_max(a, DL_DIMS(1), false);
    CHECK(at(y, 0) == 3 && at(y, 1) == 5, "max dim");
    CHECK(at(dl_max(a, DL_ALL, false), 0) == 5 && at(dl_min(a, DL_ALL, false), 0) == -6, "max/min all");
    CHECK(fabsf(at(dl_var(b, DL_ALL, 1, false), 0) - 100) < 1e-4f, "var unbiased");
    CHECK(fabsf(at(dl_var(b, DL_ALL, 0, false), 0) - 200.0f / 3) < 1e-4f, "var biased");
    {
        int64_t idx[2];
        y = dl_argmax(a, 1, false);
        CHECK(y && y->dtype == DL_DTYPE_I64 && dl_read_int64(y, idx, 2) == DL_OK && idx[0] == 2 && idx[1] == 1, "argmax");
    }
    /* softmax */
    y = dl_softmax(b, 0);
    CHECK(fabsf(at(y, 0) + at(y, 1) + at(y, 2) - 1) < 1e-6f && at(y, 2) > at(y, 1), "softmax sums to 1");
    {
        float big[3] = {1000, 1001, 1002};
        dl_tensor *l = dl_log_softmax(dl_from_array(ctx, DL_SHAPE(3), big), 0);
        CHECK(fabsf(at(l, 2) + 0.40760596f) < 1e-5f, "log_softmax stable at 1000: %g", (double)at(l, 2));
    }
    CHECK(fabsf(dl_item(dl_sum(dl_softmax(a, 0), DL_ALL, false)) - 3) < 1e-5f, "softmax dim 0");
}

static void test_shapes(void)
{
    dl_tensor *a = dl_arange(ctx, 0, 24, 1), *v, *p, *c, *parts[3];
    CHECK(a && a->numel == 24 && at(a, 23) == 23, "arange");
    v = dl_reshape(a, DL_SHAPE(2, -1, 4));
    CHECK(shape_is(v, 3, 2, 3, 4) && v->data == a->data, "reshape -1 is a view");
    CHECK(dl_flatten(v, 1, 2)->shape[1] == 12 && dl_flatten(v, 0, -1)->ndim == 1, "flatten");
    CHECK(dl_unsqueeze(v, -1)->ndim == 4 && dl_unsqueeze(v, 0)->shape[0] == 1, "unsqueeze");
    CHECK(dl_squeeze(dl_unsqueeze(v, 1), 1)->ndim == 3 && dl_squeeze(v, 0)->ndim == 3, "squeeze (no-op on size != 1)");
    p = dl_permute(v, DL_SHAPE(2, 0, 1));
    CHECK(shape_is(p, 3, 4, 2, 3) && at(p, 1) == 4 && at(p, 6) == 1, "permute values");
    p = dl_transpose(v, 0, 2);
    CHECK(shape_is(p, 3, 4, 3, 2) && at(p, 1) == 12, "transpose");
    c = dl_narrow(v, 1, 1, 2);
    CHECK(shape_is(c, 3, 2, 2, 4) && at(c, 0) == 4 && at(c, 8) == 16, "narrow");
    CHECK(at(dl_narrow(v, 2, -1, 1), 0) == 3, "narrow negative start");
    parts[0] = dl_narrow(v, 1, 0, 1); parts[1] = dl_narrow(v, 1, 1, 1); parts[2] = dl_narrow(v, 1, 2, 1);
    c = dl_cat(3, parts, 1);
    CHECK(c && th_same_bytes(c, a), "cat undoes narrow");
    c = dl_stack(3, parts, 0);
    CHECK(c && c->ndim == 4 && c->shape[0] == 3 && c->shape[1] == 2 && c->shape[3] == 4, "stack");
    c = dl_expand(dl_arange(ctx, 0, 3, 1), DL_SHAPE(2, 3));
    CHECK(shape_is(c, 2, 2, 3, 0) && at(c, 4) == 1, "expand");
    c = dl_sum_to(dl_ones(ctx, DL_SHAPE(4, 2, 3)), DL_SHAPE(2, 1));
    CHECK(shape_is(c, 2, 2, 1, 0) && at(c, 0) == 12, "sum_to");
    c = dl_copy(v);
    CHECK(c && c->data != v->data && at(c, 5) == 5, "copy has its own storage");
    CHECK(dl_size(v, -1) == 4 && dl_size(v, 3) == -1, "dl_size");
    {   /* int tensors: reshape and cat keep dtype */
        int64_t lv[4] = {3, 1, 4, 1}, out[4];
        int32_t iv[2] = {7, 8};
        dl_tensor *l = dl_from_int64(ctx, DL_SHAPE(4), lv), *i32 = dl_from_int32(ctx, DL_SHAPE(2), iv), *ls[2];
        ls[0] = l; ls[1] = l;
        CHECK(dl_reshape(l, DL_SHAPE(2, 2))->dtype == DL_DTYPE_I64, "int reshape");
        CHECK(dl_cat(2, ls, 0)->numel == 8 && dl_read_int64(dl_cat(2, ls, 0), out, 4) == DL_ERR_ARG, "int cat");
        dl_clear_error(ctx);
        /* torch's legacy rule: a (0,) input is skipped beside 2-D ones (an accumulator started empty) */
        ls[0] = dl_from_int64(ctx, DL_SHAPE(0), lv); ls[1] = dl_reshape(l, DL_SHAPE(2, 2));
        c = dl_cat(2, ls, -1);
        CHECK(shape_is(c, 2, 2, 2, 0) && dl_read_int64(c, out, 4) == DL_OK && out[2] == 4,
              "int cat after an empty accumulator: (2,2) %s", dl_error_message(ctx));
        ls[1] = dl_empty(ctx, DL_SHAPE(0));   /* all (0,): (0,) whatever the dim, as torch */
        ls[0] = ls[1];
        c = dl_cat(2, ls, 5);
        CHECK(c && c->ndim == 1 && c->numel == 0, "cat of (0,) (0,) along dim 5: (0,) %s", dl_error_message(ctx));
        ls[0] = dl_empty(ctx, DL_SHAPE(0)); ls[1] = dl_reshape(l, DL_SHAPE(2, 2));
        CHECK(dl_cat(2, ls, 0) == NULL && strstr(dl_error_message(ctx), "share a dtype"),
              "an empty f32 beside i64: refused, dtypes differ (%s)", dl_error_message(ctx));
        dl_clear_error(ctx);
        CHECK(dl_read_int64(i32, out, 2) == DL_OK && out[1] == 8, "int32 read");
    }
    {   /* 0-d and empty tensors */
        dl_tensor *s = dl_full(ctx, dl_shape_make(0, NULL), 2.5f), *e = dl_zeros(ctx, DL_SHAPE(0, 3));
        CHECK(s && s->numel == 1 && dl_item(s) == 2.5f, "0-d tensor");
        CHECK(e && e->numel == 0 && dl_sum(e, DL_ALL, false) && at(dl_sum(e, DL_ALL, false), 0) == 0, "sum of empty is 0");
        CHECK(dl_add(e, dl_ones(ctx, DL_SHAPE(3)))->numel == 0, "empty broadcast");
    }
}

/* matmul against a naive reference, over every torch.matmul form */
static void ref_matmul(const float *a, const int64_t *as, int an, const float *b, const int64_t *bs, int bn,
                       float *out, const int64_t *os, int on)
{
    int64_t M = an >= 2 ? as[an - 2] : 1, K = as[an - 1], N = bn >= 2 ? bs[bn - 1] : 1;
    int nbd = 0, d;
    int64_t batch = 1, bi;
    int64_t full[DL_MAX_DIMS];
    if (an >= 2 && bn >= 2) nbd = on - 2;
    else if (an >= 2) nbd = on - 1;
    else if (bn >= 2) nbd = on - 1;
    for (d = 0; d < nbd; d++) { full[d] = os[d]; batch *= os[d]; }
    for (bi = 0; bi < batch; bi++) {
        int64_t rem = bi, oa = 0, ob = 0, sa = M * K, sb = K * N;
        for (d = nbd - 1; d >= 0; d--) {
            int64_t k = rem % full[d];
            int ia = d - (nbd - (an - 2)), ib = d - (nbd - (bn - 2));
            rem /= full[d];
            if (an >= 2 && ia >= 0) { if (as[ia] != 1) oa += k * sa; sa *= as[ia]; }
            if (bn >= 2 && ib >= 0) { if (bs[ib] != 1) ob += k * sb; sb *= bs[ib]; }
        }
        {
            int64_t i, j, k;
            for (i = 0; i < M; i++)
                for (j = 0; j < N; j++) {
                    double s = 0;
                    for (k = 0; k < K; k++) s += (double)a[oa + i * K + k] * (double)b[ob + k * N + j];
                    out[bi * M * N + i * N + j] = (float)s;
                }
        }
    }
}

static void check_mm(int an, const int64_t *as, int bn, const int64_t *bs)
{
    dl_tensor *a = dl_randn(ctx, dl_shape_make(an, as)), *b = dl_randn(ctx, dl_shape_make(bn, bs));
    dl_tensor *y = dl_matmul(a, b);
    float *ref;
    long w = -1;
    if (!y) { CHECK(0, "matmul failed: %s", dl_error_message(ctx)); return; }
    ref = (float *)malloc(sizeof(float) * (size_t)(y->numel + 1));
    ref_matmul(th_host(a), as, an, th_host(b), bs, bn, ref, y->shape, y->ndim);
    CHECK(th_close(th_host(y), ref, (long)y->numel, 1e-4, 1e-4, &w), "matmul %dd x %dd: element %ld %g vs %g",
          an, bn, w, w >= 0 ? (double)at(y, w) : 0.0, w >= 0 ? (double)ref[w] : 0.0);
    free(ref);
    dl_step_end(ctx);
}

static void test_matmul(void)
{
    static const int64_t s1[] = {7}, s2[] = {7, 5}, s3[] = {4, 7}, s4[] = {3, 4, 7}, s5[] = {3, 7, 5};
    static const int64_t s6[] = {2, 1, 4, 7}, s7[] = {3, 7, 5}, s8[] = {1, 7, 5};
    static const int64_t big_a[] = {257, 300}, big_b[] = {300, 190}, big_c[] = {5, 64, 130}, big_d[] = {130, 70};
    check_mm(1, s1, 1, s1);
    check_mm(1, s1, 2, s2);
    check_mm(2, s3, 1, s1);
    check_mm(2, s3, 2, s2);
    check_mm(3, s4, 3, s5);
    check_mm(4, s6, 3, s7);
    check_mm(3, s4, 2, s2);
    check_mm(2, s3, 3, s5);
    check_mm(3, s4, 3, s8);
    check_mm(1, s1, 3, s5);
    check_mm(3, s4, 1, s1);
    check_mm(2, big_a, 2, big_b);     /* the blocked, threaded path */
    check_mm(3, big_c, 2, big_d);     /* batch folded into rows */
    {
        int64_t z1[] = {3, 0}, z2[] = {0, 4};
        dl_tensor *y = dl_matmul(dl_zeros(ctx, dl_shape_make(2, z1)), dl_zeros(ctx, dl_shape_make(2, z2)));
        CHECK(shape_is(y, 2, 3, 4, 0) && at(y, 11) == 0, "K = 0 gives zeros");
    }
}

/* dl__expf (the vectorizable exp behind dl_exp, sigmoid and SiLU) against
   exp in double: within 2 ulp everywhere, the limits and NaN as expf */
static void test_expf(void)
{
    double worst = 0, at = 0;
    float x;
    int i;
    for (x = -104.0f; x <= 89.0f; x = nextafterf(x, 100.0f) + (float)1e-4 * fabsf(x)) {
        float e = dl__expf(x);
        double ref = exp((double)x);
        double ulp = ref > 0 && ref < 3.4e38 ? ref * FLT_EPSILON : 0;
        if (ref < 1.17549435e-38) ulp = 1.40129846e-45;   /* subnormal: one step */
        if (ref < 3.4e38 && fabs(e - ref) / ulp > worst) { worst = fabs(e - ref) / ulp; at = x; }
    }
    CHECK(worst <= 2.0, "dl__expf: %.2f ulp from exp at x = %.9g", worst, at);
    CHECK(isinf(dl__expf(INFINITY)) && dl__expf(INFINITY) > 0, "dl__expf(inf)");
    CHECK(isinf(dl__expf(89.0f)), "dl__expf(89) overflows like expf");
    CHECK(dl__expf(88.7f) == dl__expf(88.7f) && !isinf(dl__expf(88.7f)), "dl__expf(88.7) is finite");
    CHECK(dl__expf(-INFINITY) == 0.0f && dl__expf(-200.0f) == 0.0f, "dl__expf(-inf) = 0");
    CHECK(isnan(dl__expf(NAN)), "dl__expf(NaN) is NaN");
    CHECK(dl__expf(0.0f) == 1.0f, "dl__expf(0) = %.9g", (double)dl__expf(0.0f));
    for (i = -20; i <= 20; i++) {
        float v = dl__expf((float)i);
        CHECK(fabs(v - exp((double)i)) <= 2 * FLT_EPSILON * exp((double)i), "dl__expf(%d) = %.9g", i, (double)v);
    }
}

/* dl__tanhf (behind dl_tanh and the tanh GELU, vectorizable) against tanh
   in double: within 2 ulp from 1e-30 to 20, odd, the limits and NaN */
static void test_tanhf(void)
{
    double worst = 0, at = 0;
    float x;
    for (x = 1e-30f; x <= 20.0f; x = nextafterf(x, 100.0f) + 1e-4f * x) {
        float t = dl__tanhf(x);
        double ref = tanh((double)x), ulp = ref * FLT_EPSILON;
        if (fabs(t - ref) / ulp > worst) { worst = fabs(t - ref) / ulp; at = x; }
        if (dl__tanhf(-x) != -t) { worst = 99; at = -x; }
    }
    CHECK(worst <= 2.0, "dl__tanhf: %.2f ulp from tanh at x = %.9g", worst, at);
    CHECK(dl__tanhf(INFINITY) == 1.0f && dl__tanhf(-INFINITY) == -1.0f && dl__tanhf(1e38f) == 1.0f &&
          isnan(dl__tanhf(NAN)), "dl__tanhf at +-inf, 1e38, NaN");
    CHECK(dl__tanhf(0.0f) == 0.0f && !signbit(dl__tanhf(0.0f)) && signbit(dl__tanhf(-0.0f)) &&
          dl__tanhf(1e-45f) == 1e-45f, "dl__tanhf at +-0 and the smallest subnormal");
}

/* sigmoid, tanh, silu, logsigmoid, softplus and their gradients at +NaN
   and -NaN: NaN, of either sign (a NaN's sign is not specified, as in
   torch, whose own differs between its paths) */
static void test_nan_sign(void)
{
    float v[2] = {NAN, -NAN}, y[2], g[2];
    int k;
    for (k = 0; k < 5; k++) {
        dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2), v), true), *o;
        o = k == 0 ? dl_sigmoid(x) : k == 1 ? dl_tanh(x) : k == 2 ? dl_silu(x) : k == 3 ? dl_logsigmoid(x)
            : dl_softplus(x, 1.0f, 20.0f);
        CHECK(o && dl_backward(dl_sum(o, DL_ALL, false)) == DL_OK && dl_read(o, y, 2) == DL_OK &&
              dl_read(x->grad, g, 2) == DL_OK && isnan(y[0]) && isnan(y[1]) && isnan(g[0]) && isnan(g[1]),
              "activation %d at +-NaN: NaN forward and backward, as torch's", k);
    }
    dl_step_end(ctx);
}

/* ulps of got from ref (double): one step of a float at ref's binade, of
   the smallest normal's below it */
static double ulps_from(float got, double ref)
{
    int e;
    double a = fabs(ref) < FLT_MIN ? FLT_MIN : fabs(ref);
    frexp(a, &e);
    return fabs((double)got - ref) / ldexp(1.0, e - 24);
}

/* dl__logf, dl__log1pf and dl__erff (behind dl_log, softplus, logsigmoid,
   BCE with logits, dl_erf and dl_gelu; vectorizable) against libm in
   double over a sweep of floats, and their special values as libm's */
static void test_logf_erff(void)
{
    double wl = 0, wp = 0, we = 0, al = 0, ap = 0, ae = 0, e;
    uint32_t b;
    for (b = 0; b < 0xff800000u; b += 997) {   /* every binade, both signs */
        float x;
        memcpy(&x, &b, 4);
        if (x != x) continue;
        if (x > 0 && (e = ulps_from(dl__logf(x), log((double)x))) > wl) { wl = e; al = x; }
        if ((e = ulps_from(dl__erff(x), erf((double)x))) > we) { we = e; ae = x; }
        if (x > -1 && (e = ulps_from(dl__log1pf(x), log1p((double)x))) > wp) { wp = e; ap = x; }
    }
    CHECK(wl <= 1.0, "dl__logf: %.2f ulp from log at x = %.9g", wl, al);
    CHECK(we <= 2.0, "dl__erff: %.2f ulp from erf at x = %.9g", we, ae);
    CHECK(wp <= 2.0, "dl__log1pf: %.2f ulp from log1p at x = %.9g", wp, ap);
    CHECK(dl__logf(0.0f) == -INFINITY && dl__logf(-0.0f) == -INFINITY && isnan(dl__logf(-1.0f)) &&
          isnan(dl__logf(-INFINITY)) && dl__logf(INFINITY) == INFINITY && isnan(dl__logf(NAN)) &&
          dl__logf(1.0f) == 0.0f, "dl__logf at +-0, -1, +-inf, NaN, 1");
    CHECK(fabs(dl__logf(1.4e-45f) - log((double)1.4e-45f)) < 1e-5, "dl__logf of the smallest subnormal: %.9g",
          (double)dl__logf(1.4e-45f));
    CHECK(dl__erff(INFINITY) == 1.0f && dl__erff(-INFINITY) == -1.0f && isnan(dl__erff(NAN)) &&
          dl__erff(1e38f) == 1.0f && signbit(dl__erff(-0.0f)) && dl__erff(0.0f) == 0.0f &&
          dl__erff(-1e-45f) < 0, "dl__erff at +-inf, NaN, 1e38, +-0, a subnormal");
    CHECK(dl__log1pf(INFINITY) == INFINITY && dl__log1pf(0.0f) == 0.0f && dl__log1pf(1e-45f) == 1e-45f &&
          isnan(dl__log1pf(NAN)), "dl__log1pf at inf, 0, a subnormal, NaN");
}

/* dl__sinf, dl__cosf, dl__expm1f against libm in double over the same
   sweep, their special values; then dl_sin, dl_cos, dl_log1p, dl_expm1,
   dl_rsqrt over a long row (the CPU's vector rows, libm's lanes past 2^24
   among them) against those functions bit for bit, and the signs of zero */
static void test_sincos_expm1(void)
{
    double ws = 0, wc = 0, we = 0, as = 0, ac = 0, ae = 0, e;
    uint32_t b;
    enum { N = 3001 };
    float *x = (float *)malloc(N * sizeof(float)), *y = (float *)malloc(N * sizeof(float));
    dl_tensor *(*fn[5])(dl_tensor *) = {dl_sin, dl_cos, dl_log1p, dl_expm1, dl_rsqrt};
    int i, k, bad = -1;
    for (b = 0; b < 0xff800000u; b += 997) {
        float v;
        memcpy(&v, &b, 4);
        if (v != v) continue;
        if ((e = ulps_from(dl__sinf(v), sin((double)v))) > ws) { ws = e; as = v; }
        if ((e = ulps_from(dl__cosf(v), cos((double)v))) > wc) { wc = e; ac = v; }
        if (v < 88.7f && (e = ulps_from(dl__expm1f(v), expm1((double)v))) > we) { we = e; ae = v; }
    }
    CHECK(ws <= 1.0, "dl__sinf: %.2f ulp from sin at x = %.9g", ws, as);
    CHECK(wc <= 1.0, "dl__cosf: %.2f ulp from cos at x = %.9g", wc, ac);
    CHECK(we <= 2.0, "dl__expm1f: %.2f ulp from expm1 at x = %.9g", we, ae);
    CHECK(isnan(dl__sinf(INFINITY)) && isnan(dl__cosf(-INFINITY)) && isnan(dl__sinf(NAN)) && dl__cosf(-0.0f) == 1.0f &&
          dl__sinf(1e-45f) == 1e-45f && dl__sinf(1e30f) == (float)sin((double)1e30f),
          "dl__sinf, dl__cosf at +-inf, NaN, 0, 1e30");
    CHECK(dl__expm1f(INFINITY) == INFINITY && dl__expm1f(-INFINITY) == -1.0f && isnan(dl__expm1f(NAN)) &&
          dl__expm1f(88.8f) == INFINITY && dl__expm1f(-1e-45f) == -1e-45f && dl__expm1f(-20.0f) == -1.0f,
          "dl__expm1f at +-inf, NaN, overflow, a subnormal, -20");
    CHECK(dl__log1pf(-1.0f) == -INFINITY && isnan(dl__log1pf(-2.0f)) && isnan(dl__log1pf(-INFINITY)) &&
          isnan(dl__log1pf(-1.0000001f)), "dl__log1pf at -1 and below");
    for (i = 0; i < N; i++) x[i] = (float)((i * 7919) % N - N / 2) * (i % 5 == 0 ? 1e5f : i % 7 == 0 ? 1e-3f : 0.37f);
    x[5] = 3e7f; x[10] = -1e30f; x[17] = INFINITY; x[2999] = NAN; x[3000] = 16777216.0f;
    for (k = 0; k < 5 && bad < 0; k++) {
        if (dl_read(fn[k](dl_from_array(ctx, DL_SHAPE(N), x)), y, N) != DL_OK) { bad = k * N; break; }
        for (i = 0; i < N && bad < 0; i++) {
            float w = k == 0 ? dl__sinf(x[i]) : k == 1 ? dl__cosf(x[i]) : k == 2 ? dl__log1pf(x[i])
                      : k == 3 ? dl__expm1f(x[i]) : 1.0f / sqrtf(x[i]);
            if (memcmp(&w, &y[i], 4) && !(w != w && y[i] != y[i])) bad = k * N + i;
        }
    }
    CHECK(bad < 0, "dl_sin ... dl_rsqrt rows: op %d differs at x = %.9g", bad / N, (double)x[bad < 0 ? 0 : bad % N]);
    {
        float z[4] = {-0.0f, 0.0f, -1.0f, -4.0f}, o[4];
        dl_tensor *t = dl_from_array(ctx, DL_SHAPE(4), z);
        CHECK(dl_read(dl_sin(t), o, 4) == DL_OK && signbit(o[0]) && !signbit(o[1]), "sin(-0) = -0");
        CHECK(dl_read(dl_log1p(t), o, 4) == DL_OK && signbit(o[0]) && !signbit(o[1]) && o[2] == -INFINITY &&
              isnan(o[3]), "log1p(-0) = -0, log1p(-1) = -inf, log1p(-4) = NaN");
        CHECK(dl_read(dl_expm1(t), o, 4) == DL_OK && signbit(o[0]) && !signbit(o[1]), "expm1(-0) = -0");
        CHECK(dl_read(dl_rsqrt(t), o, 4) == DL_OK && o[0] == -INFINITY && o[1] == INFINITY && isnan(o[2]),
              "rsqrt(-0) = -inf, rsqrt(0) = inf, rsqrt(-1) = NaN");
    }
    free(x);
    free(y);
    dl_step_end(ctx);
}

/* dl_max / dl_min over a row (the vectorized scan of integer keys): rows
   of lengths around the vector width, the extreme anywhere, a NaN at any
   place gives NaN, +-inf, the zeros' order (-0 < +0), a subnormal */
static void test_maxmin_rows(void)
{
    float v[67], m[2];
    int n, p, k;
    bool ok = true;
    for (n = 1; n <= 67 && ok; n += 11)
        for (p = 0; p < n && ok; p += 5) {
            for (k = 0; k < n; k++) v[k] = (float)((k * 37) % 23) - 11.0f;
            v[p] = 100.0f;
            ok = dl_read(dl_max(dl_from_array(ctx, DL_SHAPE(n), v), DL_ALL, false), m, 1) == DL_OK && m[0] == 100.0f;
            v[p] = -1e-45f - 100.0f;
            ok = ok && dl_read(dl_min(dl_from_array(ctx, DL_SHAPE(n), v), DL_ALL, false), m, 1) == DL_OK &&
                 m[0] == -1e-45f - 100.0f;
            v[p] = NAN;
            ok = ok && dl_read(dl_max(dl_from_array(ctx, DL_SHAPE(n), v), DL_ALL, false), m, 1) == DL_OK && isnan(m[0]) &&
                 dl_read(dl_min(dl_from_array(ctx, DL_SHAPE(n), v), DL_ALL, false), m, 1) == DL_OK && isnan(m[0]);
        }
    CHECK(ok, "dl_max / dl_min rows: the extreme at each place (n %d, at %d)", n, p);
    {
        float z[5] = {-0.0f, 0.0f, -0.0f, -INFINITY, 1e-45f}, w[3] = {-INFINITY, -INFINITY, -INFINITY};
        dl_tensor *t = dl_from_array(ctx, DL_SHAPE(4), z);
        /* (the zeros' sign on the CPU, whose scan orders -0 below +0; a GPU's tree
           takes either, as torch's kernels do) */
        bool cpu = dl_ctx_device(ctx).type == DL_DEVICE_CPU;
        ok = dl_read(dl_max(t, DL_ALL, false), m, 1) == DL_OK && m[0] == 0.0f && (!cpu || !signbit(m[0])) &&
             dl_read(dl_min(dl_from_array(ctx, DL_SHAPE(3), z), DL_ALL, false), m, 1) == DL_OK && m[0] == 0.0f &&
             (!cpu || signbit(m[0])) && dl_read(dl_max(dl_from_array(ctx, DL_SHAPE(5), z), DL_ALL, false), m, 1) == DL_OK &&
             m[0] == 1e-45f && dl_read(dl_min(t, DL_ALL, false), m, 1) == DL_OK && m[0] == -INFINITY &&
             dl_read(dl_max(dl_from_array(ctx, DL_SHAPE(3), w), DL_ALL, false), m, 1) == DL_OK && m[0] == -INFINITY;
        CHECK(ok, "dl_max / dl_min: +0 over -0, a subnormal, -inf");
    }
    dl_step_end(ctx);
}

/* the first index of the max along dim d of x (rows, cols): torch's rule
   (x > m, a NaN is the max: the first NaN) */
static int64_t argmax_ref(const float *x, int rows, int cols, int d, int j)
{
    int n = d ? cols : rows, k;
    int64_t best = 0;
    const float *p = d ? x + j * cols : x + j;
    float m = p[0];
    for (k = 1; k < n && m == m; k++) {
        float v = p[k * (d ? 1 : cols)];
        if (v > m || v != v) { m = v; best = k; }
    }
    return best;
}

/* dl_argmax / dl_max_dim (rows: the max, then the first equal 64 at a time;
   columns: blocks of 64 followed at once) against the scalar rule: ties
   everywhere (values from a small set), -0 and +0, -inf, NaNs in some
   lines, lengths around 16 and 64, 70 columns (a block and a part) */
static void test_argmax_scan(void)
{
    static const int len[] = {1, 3, 16, 17, 63, 64, 65, 130, 200};
    static float v[200 * 70];
    int64_t got[70], gi[70];
    int li, d, j, k, bad = 0;
    unsigned s = 1;
    for (li = 0; li < (int)(sizeof len / sizeof len[0]); li++)
        for (d = 0; d < 2; d++) {
            int rows = d ? 70 : len[li], cols = d ? len[li] : 70, n = rows * cols, lines = 70;
            dl_tensor *x, *y, *idx = NULL;
            for (k = 0; k < n; k++) {
                s = s * 1103515245u + 12345u;
                v[k] = (float)((s >> 16) % 5) - 2.0f;
                if (v[k] == 0.0f && (s >> 12) & 1) v[k] = -0.0f;
                if (((s >> 20) & 63) == 0) v[k] = -INFINITY;
            }
            for (j = 0; j < lines; j += 7) {   /* NaNs in every 7th line, at two places */
                int at1 = (j * 13) % len[li], at2 = (j * 29 + 5) % len[li];
                v[d ? j * cols + at1 : at1 * cols + j] = NAN;
                v[d ? j * cols + at2 : at2 * cols + j] = NAN;
            }
            x = dl_from_array(ctx, DL_SHAPE(rows, cols), v);
            y = dl_argmax(x, d, false);
            if (!y || dl_read_int64(y, got, lines) != DL_OK || !dl_max_dim(x, d, false, &idx) || !idx ||
                dl_read_int64(idx, gi, lines) != DL_OK) { bad++; continue; }
            for (j = 0; j < lines; j++) {
                int64_t want = argmax_ref(v, rows, cols, d, j);
                if (got[j] != want || gi[j] != want) {
                    if (!bad) fprintf(stderr, "argmax: %dx%d dim %d line %d: %lld, max_dim %lld, want %lld\n", rows, cols,
                                      d, j, (long long)got[j], (long long)gi[j], (long long)want);
                    bad++;
                }
            }
            dl_step_end(ctx);
        }
    CHECK(bad == 0, "dl_argmax / dl_max_dim: the first max (NaN first) in every line (%d wrong)", bad);
}

/* dl_norm and dl_var on the CPU sum the float squares without making t*t
   (the reduce's SUMSQ): the bits of sqrt(sum(t*t)) and of var's ops, over
   rows, columns, several dims (a later pass sums the first's sums), all;
   1e20s overflow to inf and 1e-23s underflow to 0 as torch's float
   squares do */
static void test_norm_bits(void)
{
    static const float big[4] = {1e20f, -1e20f, 1.0f, 2.0f}, tiny[3] = {1e-23f, -1e-23f, 0.0f};
    dl_tensor *xs[4];
    dl_shape dims[6];
    int i, k, kd, bad = 0, n = 0;
    float va[4096], vb[4096];
    xs[0] = dl_randn(ctx, DL_SHAPE(37, 129));
    xs[1] = dl_randn(ctx, DL_SHAPE(5, 64, 33));
    xs[2] = dl_from_array(ctx, DL_SHAPE(2, 2), big);
    xs[3] = dl_from_array(ctx, DL_SHAPE(3), tiny);
    dims[0] = DL_DIMS(0); dims[1] = DL_DIMS(-1); dims[2] = DL_DIMS(0, 1); dims[3] = DL_DIMS(1, 2);
    dims[4] = DL_DIMS(0, 2); dims[5] = DL_ALL;
    for (i = 0; i < 4; i++)
        for (k = 0; k < 6; k++)
            for (kd = 0; kd < 2; kd++) {
                dl_tensor *a, *b, *d;
                if ((k == 3 || k == 4) && xs[i]->ndim < 3) continue;
                if (k == 2 && xs[i]->ndim < 2) continue;
                a = dl_norm(xs[i], dims[k], kd != 0);
                b = dl_sqrt(dl_sum(dl_mul(xs[i], xs[i]), dims[k], kd != 0));
                n++;
                if (!a || !b || a->numel != b->numel || a->ndim != b->ndim || dl_read(a, va, a->numel) != DL_OK ||
                    dl_read(b, vb, b->numel) != DL_OK || memcmp(va, vb, sizeof(float) * (size_t)a->numel) != 0)
                    bad++;
                if (i > 1) continue;   /* dl_var: the same squares of t - mean */
                d = dl_sub(xs[i], dl_mean(xs[i], dims[k], true));
                a = dl_var(xs[i], dims[k], 1, kd != 0);
                b = dl_div_scalar(dl_sum(dl_mul(d, d), dims[k], kd != 0), (float)(xs[i]->numel / (a ? a->numel : 1) - 1));
                n++;
                if (!a || !b || a->numel != b->numel || dl_read(a, va, a->numel) != DL_OK ||
                    dl_read(b, vb, b->numel) != DL_OK || memcmp(va, vb, sizeof(float) * (size_t)a->numel) != 0)
                    bad++;
            }
    CHECK(bad == 0 && n == 54, "dl_norm, dl_var: the bits of sqrt(sum(t*t)), sum((t-m)^2)/(N-1) in %d cases (%d differ)",
          n, bad);
    CHECK(dl_read(dl_norm(xs[2], DL_DIMS(1), false), va, 2) == DL_OK && isinf(va[0]) && va[1] == sqrtf(5.0f) &&
          dl_read(dl_norm(xs[3], DL_ALL, false), va, 1) == DL_OK && va[0] == 0.0f,
          "dl_norm: 1e20 squared overflows to inf, 1e-23 squared underflows to 0 (torch's float squares)");
    dl_step_end(ctx);
}

/* dl_eq (torch.eq as float32 1/0): float32 with NaN, signed zeros and
   infinities; int64 (the accuracy idiom: dl_sum(dl_eq(dl_argmax(x, 1), y)))
   with broadcasting on either side; no gradient; the refusals. */
static void test_eq(void)
{
    float av[6] = {1.0f, NAN, -0.0f, INFINITY, 2.0f, -3.0f}, bv[6] = {1.0f, NAN, 0.0f, INFINITY, -2.0f, 3.0f};
    float xv[8] = {0.1f, 0.9f, 0.5f, 0.2f, 0.3f, 0.1f, 0.0f, 0.7f};
    int64_t iv[4] = {1, 0, 2, 1}, jv[3] = {7, -1, 7}, col[2] = {7, 8};
    int32_t i32[1] = {4};
    dl_tensor *a = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(6), av), true), *b = dl_from_array(ctx, DL_SHAPE(6), bv);
    dl_tensor *y, *x, *lab, *i3, *c2;
    static const float want[6] = {1, 0, 1, 1, 0, 0};
    int k;
    bool ok;
    y = dl_eq(a, b);
    ok = y && y->dtype == DL_DTYPE_F32 && y->ndim == 1 && y->numel == 6 && !y->requires_grad;
    for (k = 0; ok && k < 6; k++) ok = at(y, k) == want[k];
    CHECK(ok, "dl_eq float32: 1 0 1 1 0 0 (NaN != NaN, -0 == 0, inf == inf), no gradient");
    y = dl_eq(dl_reshape(dl_from_array(ctx, DL_SHAPE(2), bv), DL_SHAPE(2, 1)), dl_from_array(ctx, DL_SHAPE(3), av));
    CHECK(shape_is(y, 2, 2, 3, 0) && at(y, 0) == 1 && at(y, 1) == 0 && at(y, 3) == 0, "dl_eq float32 broadcast (2,1) x (3)");
    x = dl_from_array(ctx, DL_SHAPE(4, 2), xv);
    lab = dl_from_int64(ctx, DL_SHAPE(4), iv);
    y = dl_sum(dl_eq(dl_argmax(x, 1, false), lab), dl_shape_make(0, NULL), false);
    CHECK(y && y->ndim == 0 && at(y, 0) == 3.0f, "dl_eq int64: 3 of 4 arg-maxes are the labels (got %g)", y ? (double)at(y, 0) : -1.0);
    i3 = dl_from_int64(ctx, DL_SHAPE(3), jv);
    c2 = dl_reshape(dl_from_int64(ctx, DL_SHAPE(2), col), DL_SHAPE(2, 1));
    y = dl_eq(c2, i3);
    CHECK(shape_is(y, 2, 2, 3, 0) && at(y, 0) == 1 && at(y, 1) == 0 && at(y, 2) == 1 && at(y, 3) == 0 &&
          at(y, 5) == 0, "dl_eq int64 broadcast (2,1) x (3): [[1 0 1] [0 0 0]]");
    y = dl_eq(i3, c2);
    CHECK(shape_is(y, 2, 2, 3, 0) && at(y, 2) == 1 && at(y, 4) == 0, "dl_eq int64 broadcast (3) x (2,1)");
    y = dl_eq(dl_from_int64(ctx, DL_SHAPE(0), iv), dl_from_int64(ctx, DL_SHAPE(1), iv));
    CHECK(y && y->numel == 0 && y->ndim == 1, "dl_eq int64: nothing to compare");
    CHECK(dl_eq(a, lab) == NULL, "dl_eq float32 with int64 refused");
    EXPECT_ERR(ctx, DL_ERR_DTYPE, "dl_eq: a (6) is float32 and b (4) is int64 (both must be float32 or both int64)");
    CHECK(dl_eq(dl_from_int32(ctx, DL_SHAPE(1), i32), dl_from_int32(ctx, DL_SHAPE(1), i32)) == NULL,
          "dl_eq int32 refused");
    EXPECT_ERR(ctx, DL_ERR_DTYPE, "both must be float32 or both int64");
    CHECK(dl_eq(lab, i3) == NULL, "dl_eq (4) with (3) refused");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "dl_eq: a (4) and b (3) do not broadcast");
    CHECK(dl_eq(NULL, lab) == NULL && dl_eq(lab, NULL) == NULL && dl_last_error(ctx) == DL_OK, "dl_eq NULL -> NULL");
    y = dl_to(lab, dl_cpu_device(dl_ctx_device(ctx).type == DL_DEVICE_CPU && dl_ctx_device(ctx).index == 1 ? 0 : 1));
    if (y) {
        CHECK(dl_eq(lab, y) == NULL, "dl_eq across devices refused");
        EXPECT_ERR(ctx, DL_ERR_DEVICE, "dl_eq");
    } else {
        dl_clear_error(ctx);
    }
}

/* Long sums that a float chain gets wrong: 2^24 then ones (a float chain
   stays at 2^24: 2^24 + 1 rounds back to it). Column sums of a reduce (a
   dim other than the last, a broadcast operand's gradient, a Linear's bias
   gradient: the fused bias + ReLU on a GPU) and average pools over large
   windows add in double, so each is exact here; torch's cascade sums are
   too. Before: 16777216 for every one. */
static void test_long_sums(void)
{
    enum { R = 1001 };
    static float xv[R * 6], gv[R * 2], pv[R];
    const float big = 16777216.0f, want = 16778216.0f;   /* 2^24 + 1000: a float */
    dl_tensor *x, *y, *b, *w, *loss;
    int i, ok;
    for (i = 0; i < R * 6; i++) xv[i] = i < 6 ? big : 1.0f;
    x = dl_from_array(ctx, DL_SHAPE(R, 6), xv);     /* row 0: 2^24, then 1000 rows of ones */
    y = dl_sum(x, DL_SHAPE(0), false);
    for (i = 0, ok = y != NULL; ok && i < 6; i++) ok = at(y, i) == want;
    CHECK(ok, "column sums of (1001, 6): 2^24 + 1000 each (got %.9g)", y ? (double)at(y, 0) : -1.0);
    y = dl_sum(dl_reshape(x, DL_SHAPE(R, 2, 3)), DL_SHAPE(0, 2), false);   /* two passes: the last dim, then 0 */
    CHECK(y && at(y, 0) == 3 * want && at(y, 1) == 3 * want, "sum over dims (0, 2) of (1001, 2, 3): %.9g",
          y ? (double)at(y, 0) : -1.0);
    y = dl_mean(dl_reshape(x, DL_SHAPE(1, R, 6)), DL_SHAPE(1), false);     /* the middle dim */
    CHECK(y && at(y, 5) == (float)(16778216.0 / R), "mean over the middle dim of (1, 1001, 6): %.9g",
          y ? (double)at(y, 5) : -1.0);
    /* a broadcast operand's gradient, then a Linear's bias through ReLU */
    for (i = 0; i < R * 2; i++) gv[i] = i < 2 ? big : 1.0f;
    b = dl_requires_grad(dl_zeros(ctx, DL_SHAPE(2)), true);
    loss = dl_sum(dl_mul(dl_add(dl_ones(ctx, DL_SHAPE(R, 2)), b), dl_from_array(ctx, DL_SHAPE(R, 2), gv)), DL_ALL, false);
    CHECK(loss && dl_backward(loss) == DL_OK && b->grad && at(b->grad, 0) == want && at(b->grad, 1) == want,
          "the gradient of a broadcast bias: 2^24 + 1000 (got %.9g)", b->grad ? (double)at(b->grad, 0) : -1.0);
    w = dl_requires_grad(dl_ones(ctx, DL_SHAPE(2, 3)), true);
    b = dl_requires_grad(dl_zeros(ctx, DL_SHAPE(2)), true);
    loss = dl_sum(dl_mul(dl_relu(dl_linear(dl_ones(ctx, DL_SHAPE(R, 3)), w, b)), dl_from_array(ctx, DL_SHAPE(R, 2), gv)),
                  DL_ALL, false);
    CHECK(loss && dl_backward(loss) == DL_OK && b->grad && at(b->grad, 0) == want && at(b->grad, 1) == want,
          "a Linear's bias gradient through ReLU: 2^24 + 1000 (got %.9g)", b->grad ? (double)at(b->grad, 0) : -1.0);
    /* global average pooling of a 7 x 143 plane (1001 values), and one
       average-pool window as large */
    for (i = 0; i < R; i++) pv[i] = i ? 1.0f : big;
    x = dl_from_array(ctx, DL_SHAPE(1, 1, 7, 143), pv);
    y = dl_adaptive_avg_pool2d(x, DL_SHAPE(1, 1));
    CHECK(y && at(y, 0) == (float)(16778216.0 / R), "adaptive_avg_pool2d to 1x1 of 2^24 and 1000 ones: %.9g",
          y ? (double)at(y, 0) : -1.0);
    {
        dl_pool_desc pd = dl_pool_desc_make(7, 7, 0, false, true);
        pd.kernel[1] = pd.stride[1] = 143;
        y = dl_avg_pool2d(x, &pd);
        CHECK(y && y->numel == 1 && at(y, 0) == (float)(16778216.0 / R), "avg_pool2d with a 7x143 window: %.9g",
              y ? (double)at(y, 0) : -1.0);
    }
    y = dl_adaptive_avg_pool1d(dl_reshape(x, DL_SHAPE(1, 1, R)), DL_SHAPE(1));
    CHECK(y && at(y, 0) == (float)(16778216.0 / R), "adaptive_avg_pool1d to 1: %.9g", y ? (double)at(y, 0) : -1.0);
}

/* the one-pass backwards of the unary ops (the backend's unary_bwd) give
   the bits of their rules' dl.h ops, which create_graph runs; special
   values (+-0, +-inf, NaN, 1e38, denormals) and g = inf, 0 included */
static dl_tensor *ugrad_op(int k, dl_tensor *x)
{
    switch (k) {
    case 0: return dl_gelu(x);
    case 1: return dl_gelu_tanh(x);
    case 2: return dl_silu(x);
    case 3: return dl_abs(x);
    case 4: return dl_leaky_relu(x, 0.01f);
    case 5: return dl_leaky_relu(x, -2.0f);
    case 6: return dl_softplus(x, 1.0f, 20.0f);
    case 7: return dl_softplus(x, 2.5f, 3.0f);
    case 8: return dl_sqrt(x);
    case 9: return dl_pow(x, 1.5f);
    case 10: return dl_pow(x, 2.5f);
    case 11: return dl_pow(x, -0.7f);
    case 12: return dl_pow(x, 3.0f);
    case 13: return dl_erf(x);
    default: return dl_logsigmoid(x);
    }
}
static void test_unary_bwd(void)
{
    enum { N = 3000, NOPS = 15 };
    static const float sp[14] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e38f, -1e38f, 1e-40f, -1e-40f,
                                 1.0f, -1.0f, 20.0f, 8.0f, 0.5f};
    static float xv[N], gv[N], got[2][N];
    uint32_t s = 1;
    int i, k, m, bad;
    for (i = 0; i < N; i++) {
        s = s * 1103515245u + 12345u;
        xv[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 3 ? 8.0f : 60.0f);
        s = s * 1103515245u + 12345u;
        gv[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
    }
    for (i = 0; i < 14; i++) {
        xv[i] = xv[14 + i] = xv[28 + i] = sp[i];
        gv[14 + i] = INFINITY;
        gv[28 + i] = 0.0f;
    }
    for (k = 0; k < NOPS; k++) {
        for (m = 0; m < 2; m++) {   /* m = 1: create_graph, the rule's ops */
            dl_backward_desc bd;
            dl_tensor *x = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(N), xv), true), *gx = NULL;
            memset(&bd, 0, sizeof bd);
            bd.grad = dl_from_array(ctx, DL_SHAPE(N), gv);
            bd.create_graph = m == 1;
            if (dl_grad(ugrad_op(k, x), 1, &x, &gx, &bd) != DL_OK || dl_read(gx, got[m], N) != DL_OK)
                memset(got[m], 0xff, sizeof got[m]);
            dl_step_end(ctx);
        }
        for (i = 0, bad = -1; i < N && bad < 0; i++)
            if (memcmp(&got[0][i], &got[1][i], 4) && !(got[0][i] != got[0][i] && got[1][i] != got[1][i])) bad = i;
        CHECK(bad < 0, "unary op %d: its one-pass backward gives the bits of its rule's ops (at x = %g, g = %g: "
              "%a, not %a)", k, bad < 0 ? 0.0 : (double)xv[bad], bad < 0 ? 0.0 : (double)gv[bad],
              bad < 0 ? 0.0 : (double)got[0][bad], bad < 0 ? 0.0 : (double)got[1][bad]);
    }    /* sqrt and x^0.5, x^1.5 forward (sqrtps where the build has it): sqrtf's
       bits, x sqrtf(x) (+inf at -inf, as powf), within 2 ulp of pow */
    for (k = 0; k < 3; k++) {
        dl_tensor *x = dl_from_array(ctx, DL_SHAPE(N), xv);
        dl_tensor *y = k == 0 ? dl_sqrt(x) : dl_pow(x, k == 1 ? 0.5f : 1.5f);
        if (!y || dl_read(y, got[0], N) != DL_OK) memset(got[0], 0xff, sizeof got[0]);
        for (i = 0, bad = -1; i < N && bad < 0; i++) {
            float w = k < 2 ? sqrtf(xv[i]) : xv[i] == -INFINITY ? INFINITY : xv[i] * sqrtf(xv[i]);
            double p = pow((double)xv[i], k < 2 ? 0.5 : 1.5);
            if (memcmp(&got[0][i], &w, 4) && !(w != w && got[0][i] != got[0][i])) bad = i;
            if (fabs(p) < FLT_MAX && fabs(p) > 1e-30 && fabs((double)w - p) > 2.5e-7 * fabs(p)) bad = i;
        }
        CHECK(bad < 0, "%s forward at x = %a: %a", k == 0 ? "sqrt" : k == 1 ? "pow 0.5" : "pow 1.5",
              bad < 0 ? 0.0 : (double)xv[bad], bad < 0 ? 0.0 : (double)got[0][bad]);
        dl_step_end(ctx);
    }
}

/* dl_cumsum: float32 bit for bit against a loop adding each line in order
   in double (torch's CPU arithmetic), along every dim of a shape whose
   columns split into 64-wide blocks and a remainder, forward and backward
   (g's running sums from the end), the same bits on 1 and 2 threads;
   int64 and int32 input give int64 (wrapping); 0-d and empty tensors */
static void test_cumsum(void)
{
    static const int64_t sh[3] = {5, 70, 67};
    int64_t iv[4] = {1, -2, INT64_MAX, 4}, io[4];
    int32_t jv[3] = {2147483647, 1, -5};
    float *x = (float *)malloc(sizeof(float) * 5 * 70 * 67), *want = (float *)malloc(sizeof(float) * 5 * 70 * 67);
    float *got = (float *)malloc(sizeof(float) * 5 * 70 * 67), v, gv[3], g0[3] = {1, 2, 4};
    dl_tensor *t = dl_randn(ctx, dl_shape_make(3, sh)), *y, *l;
    int d, th, bad = 0, n = 0;
    CHECK(x && want && got && t && dl_read(t, x, t->numel) == DL_OK, "cumsum input");
    if (!x || !want || !got || !t) { free(x); free(want); free(got); return; }
    for (d = 0; d < 3; d++) {
        int64_t outer = d == 0 ? 1 : d == 1 ? 5 : 5 * 70, len = sh[d], inner = d == 0 ? 70 * 67 : d == 1 ? 67 : 1;
        int64_t o, i, k;
        for (o = 0; o < outer; o++)
            for (i = 0; i < inner; i++) {
                double s = 0.0;
                for (k = 0; k < len; k++) {
                    int64_t at = (o * len + k) * inner + i;
                    s += (double)x[at];
                    want[at] = (float)s;
                }
            }
        for (th = 1; th <= 2; th++) {
            dl_set_num_threads(ctx, th);
            y = dl_cumsum(t, d - 3);
            n++;
            if (!y || dl_read(y, got, y->numel) != DL_OK || memcmp(got, want, sizeof(float) * (size_t)y->numel) != 0)
                bad++;
        }
    }
    dl_set_num_threads(ctx, 2);
    CHECK(bad == 0 && n == 6, "dl_cumsum: each dim of (5,70,67), 1 and 2 threads, the bits of an ordered double sum "
          "(%d of %d differ)", bad, n);
    /* backward: x (3) requires grad, l = sum(cumsum(x) * g0): dx[i] = sum_{k >= i} g0[k] = 7, 6, 4 */
    t = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(3), x), true);
    l = dl_sum(dl_mul(dl_cumsum(t, 0), dl_from_array(ctx, DL_SHAPE(3), g0)), DL_ALL, false);
    CHECK(l && dl_backward(l) == DL_OK && dl_read(t->grad, gv, 3) == DL_OK && gv[0] == 7 && gv[1] == 6 && gv[2] == 4,
          "dl_cumsum's gradient: g's running sums from the end (7 6 4: %g %g %g)", (double)gv[0], (double)gv[1],
          (double)gv[2]);
    y = dl_cumsum(dl_from_int64(ctx, DL_SHAPE(4), iv), 0);
    CHECK(y && y->dtype == DL_DTYPE_I64 && dl_read_int64(y, io, 4) == DL_OK && io[0] == 1 && io[1] == -1 &&
          io[2] == INT64_MAX - 1 && io[3] == INT64_MIN + 2, "dl_cumsum of int64: int64, wrapping as torch's");
    y = dl_cumsum(dl_from_int32(ctx, DL_SHAPE(3), jv), -1);
    CHECK(y && y->dtype == DL_DTYPE_I64 && dl_read_int64(y, io, 3) == DL_OK && io[0] == 2147483647 &&
          io[1] == 2147483648LL && io[2] == 2147483643LL, "dl_cumsum of int32: int64 (torch's), no int32 overflow");
    y = dl_cumsum(dl_full(ctx, DL_SHAPE(), 2.5f), -1);
    CHECK(y && y->ndim == 0 && dl_read(y, &v, 1) == DL_OK && v == 2.5f, "dl_cumsum of a 0-d tensor: itself, 0-d");
    y = dl_cumsum(dl_zeros(ctx, DL_SHAPE(0, 3)), 0);
    CHECK(y && y->numel == 0 && y->ndim == 2 && y->shape[1] == 3, "dl_cumsum of an empty tensor: its shape");
    free(x); free(want); free(got);
    dl_step_end(ctx);
}

/* dl__sum16_row (AVX: four partials a register) = DL__SUM16's loop, bit
   for bit, over lengths 0-70 and two long rows, with large, tiny, inf and
   NaN values */
static void test_sum16_row(void)
{
    static float x[1100];
    uint32_t s = 5;
    int i, n, bad = -1;
    for (i = 0; i < 1100; i++) {
        s = s * 1103515245u + 12345u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 7 ? 3.0f : 3e30f);
    }
    x[3] = 1e-40f;
    for (n = 0; n <= 72 && bad < 0; n++) {
        int len = n == 71 ? 1029 : n == 72 ? 1100 : n;
        double a, b;
        if (n == 72) x[1090] = INFINITY;
        a = dl__sum16_row(x, len);
        DL__SUM16(b, len, (double)x[j]);
        if (memcmp(&a, &b, sizeof a)) bad = len;
    }
    x[1050] = NAN;
    {
        double a = dl__sum16_row(x, 1100), b;
        DL__SUM16(b, 1100, (double)x[j]);
        if (!(a != a && b != b)) bad = 1100;
    }
    CHECK(bad < 0, "dl__sum16_row gives DL__SUM16's bits (length %d)", bad);
}

/* a gradient written straight into a persistent leaf's none ->grad (the
   unary backwards, x * y's: dl__gdst_of) has the bits of the separate sum
   0 + g (+0 for -0), also where g is a sum's broadcast one; the first
   backward (->grad made) and the next, after a zero_grad, alike */
static void test_grad_into_leaf(void)
{
    enum { N = 3000, NOPS = 15 };
    static const float sp[14] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e38f, -1e38f, 1e-40f, -1e-40f,
                                 1.0f, -1.0f, 20.0f, 8.0f, 0.5f};
    static float xv[N], bv[N], gv[N], want[2][N], got[2][N];
    uint32_t s = 7;
    int i, k, m, r, bad;
    for (i = 0; i < N; i++) {
        s = s * 1103515245u + 12345u;
        xv[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 3 ? 8.0f : 60.0f);
        s = s * 1103515245u + 12345u;
        bv[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
        gv[i] = i % 5 ? -bv[i] : -0.0f;
    }
    for (i = 0; i < 14; i++) xv[i] = bv[14 + i] = xv[28 + i] = sp[i];
    for (k = 0; k < NOPS + 3; k++) {   /* k >= NOPS: x * b, seeded with g, by a sum, b of shape (1) */
        dl_tensor *x = dl_keep(dl_requires_grad(dl_from_array(ctx, DL_SHAPE(N), xv), true));
        dl_tensor *b = dl_keep(dl_requires_grad(dl_from_array(ctx, k == NOPS + 2 ? DL_SHAPE(1) : DL_SHAPE(N),
                                                              bv), true));
        dl_tensor *ps[2] = {x, b}, *gr[2] = {NULL, NULL};
        dl_optim *o = dl_sgd_params(ctx, 2, ps, NULL);
        for (r = 0; r < 2; r++) {   /* the reference: dl_grad's, then + 0 */
            dl_tensor *y = k < NOPS ? ugrad_op(k, x) : dl_mul(x, b);
            dl_backward_desc bd;
            memset(&bd, 0, sizeof bd);
            bd.grad = dl_from_array(ctx, DL_SHAPE(N), gv);
            if (k == NOPS + 1) { y = dl_sum(y, DL_ALL, false); bd.grad = NULL; }
            if (dl_grad(y, k < NOPS ? 1 : 2, ps, gr, &bd) != DL_OK || dl_read(gr[0], want[0], N) != DL_OK ||
                (k >= NOPS && dl_read(gr[1], want[1], gr[1]->numel) != DL_OK))
                memset(want, 0xff, sizeof want);
            dl_step_end(ctx);
        }
        for (i = 0; i < N; i++) { want[0][i] += 0.0f; want[1][i] += 0.0f; }
        for (m = 0; m < 3; m++) {   /* m = 0: ->grad made; 1, 2: after zero_grad (none) */
            dl_tensor *y = k < NOPS ? ugrad_op(k, x) : dl_mul(x, b);
            dl_backward_desc bd;
            memset(&bd, 0, sizeof bd);
            bd.grad = dl_from_array(ctx, DL_SHAPE(N), gv);
            if (k == NOPS + 1) { y = dl_sum(y, DL_ALL, false); bd.grad = NULL; }
            if (m) dl_optim_zero_grad(o);
            memset(got, 0xff, sizeof got);
            if (dl_backward_ex(y, &bd) != DL_OK || dl_read(x->grad, got[0], N) != DL_OK ||
                (k >= NOPS && dl_read(b->grad, got[1], b->numel) != DL_OK))
                memset(got, 0xee, sizeof got);
            dl_step_end(ctx);
            for (i = 0, bad = -1; i < (k >= NOPS ? 2 * N : N) && bad < 0; i++) {
                float w = want[i / N][i % N], v = got[i / N][i % N];
                if (i >= N && i - N >= b->numel) continue;
                if (memcmp(&w, &v, 4) && !(w != w && v != v)) bad = i;
            }
            CHECK(bad < 0 && dl_has_grad(x), "op %d, backward %d into ->grad: 0 + g's bits (element %d: %a, not %a)",
                  k, m, bad, bad < 0 ? 0.0 : (double)got[bad / N][bad % N],
                  bad < 0 ? 0.0 : (double)want[bad / N][bad % N]);
        }
        dl_optim_free(o);
        dl_free(x);
        dl_free(b);
    }
}

int main(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.seed = 3;
    ctx = dl_ctx_init(&d);
    test_values();
    dl_step_end(ctx);
    test_shapes();
    dl_step_end(ctx);
    test_matmul();
    test_expf();
    test_tanhf();
    test_nan_sign();
    test_logf_erff();
    test_sincos_expm1();
    test_maxmin_rows();
    test_argmax_scan();
    test_norm_bits();
    test_eq();
    dl_step_end(ctx);
    test_long_sums();
    dl_step_end(ctx);
    test_unary_bwd();
    test_cumsum();
    test_grad_into_leaf();
    test_sum16_row();
    dl_ctx_free(ctx);
    TEST_END();
}
