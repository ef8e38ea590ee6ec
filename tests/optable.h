/* tests/optable.h - the op matrix shared by test_devices.c (cpu:1 strict
   against cpu:0, bit for bit) and test_cuda.c (cuda:0 against cpu:0, within
   a tolerance): every op as a small function of its inputs, its input shapes
   and kinds, and run_on(), which runs one case on one device (forward, then
   backward with a fixed upstream gradient) and brings every result back to
   the host. The includer defines `static dl_ctx *C;` and includes harness.h
   first. */
#ifndef DL_TEST_OPTABLE_H
#define DL_TEST_OPTABLE_H
#include <stdlib.h>

typedef dl_tensor *(*opfn)(dl_tensor **in);
typedef struct opcase {
    const char *name;
    opfn f;
    int nin;
    dl_shape shape[3];
    int kind;            /* input values: 0 randn, 1 positive, 2 class targets (int64 in [0, 5)), 3 in (0,1) */
    bool nograd;         /* forward only */
} opcase;

static dl_tensor *o_add(dl_tensor **i) { return dl_add(i[0], i[1]); }
static dl_tensor *o_sub(dl_tensor **i) { return dl_sub(i[0], i[1]); }
static dl_tensor *o_mul(dl_tensor **i) { return dl_mul(i[0], i[1]); }
static dl_tensor *o_div(dl_tensor **i) { return dl_div(i[0], dl_add_scalar(dl_abs(i[1]), 0.5f)); }
static dl_tensor *o_maximum(dl_tensor **i) { return dl_maximum(i[0], i[1]); }
static dl_tensor *o_minimum(dl_tensor **i) { return dl_minimum(i[0], i[1]); }
static dl_tensor *o_scalars(dl_tensor **i) { return dl_rsub_scalar(dl_div_scalar(dl_mul_scalar(dl_add_scalar(i[0], 1.0f), 2.0f), 3.0f), 0.5f); }
static dl_tensor *o_pow(dl_tensor **i) { return dl_pow(i[0], 2.5f); }
static dl_tensor *o_neg(dl_tensor **i) { return dl_neg(i[0]); }
static dl_tensor *o_exp(dl_tensor **i) { return dl_exp(i[0]); }
static dl_tensor *o_log(dl_tensor **i) { return dl_log(i[0]); }
static dl_tensor *o_sqrt(dl_tensor **i) { return dl_sqrt(i[0]); }
static dl_tensor *o_abs(dl_tensor **i) { return dl_abs(i[0]); }
static dl_tensor *o_erf(dl_tensor **i) { return dl_erf(i[0]); }
static dl_tensor *o_clamp(dl_tensor **i) { return dl_clamp(i[0], -0.5f, 0.7f); }
static dl_tensor *o_relu(dl_tensor **i) { return dl_relu(i[0]); }
static dl_tensor *o_leaky(dl_tensor **i) { return dl_leaky_relu(i[0], 0.1f); }
static dl_tensor *o_sigmoid(dl_tensor **i) { return dl_sigmoid(i[0]); }
static dl_tensor *o_silu(dl_tensor **i) { return dl_silu(i[0]); }
static dl_tensor *o_tanh(dl_tensor **i) { return dl_tanh(i[0]); }
static dl_tensor *o_gelu(dl_tensor **i) { return dl_gelu(i[0]); }
static dl_tensor *o_softplus(dl_tensor **i) { return dl_softplus(dl_mul_scalar(i[0], 8.0f), 1.0f, 10.0f); }
static dl_tensor *o_logsigmoid(dl_tensor **i) { return dl_logsigmoid(i[0]); }
static dl_tensor *o_sin(dl_tensor **i) { return dl_sin(dl_mul_scalar(i[0], 4.0f)); }
static dl_tensor *o_cos(dl_tensor **i) { return dl_cos(dl_mul_scalar(i[0], 4.0f)); }
static dl_tensor *o_log1p(dl_tensor **i) { return dl_log1p(i[0]); }
static dl_tensor *o_expm1(dl_tensor **i) { return dl_expm1(i[0]); }
static dl_tensor *o_rsqrt(dl_tensor **i) { return dl_rsqrt(i[0]); }
static dl_tensor *o_sum(dl_tensor **i) { return dl_sum(i[0], DL_DIMS(0, 2), true); }
static dl_tensor *o_mean(dl_tensor **i) { return dl_mean(i[0], DL_DIMS(1), false); }
static dl_tensor *o_max(dl_tensor **i) { return dl_max(i[0], DL_DIMS(1), false); }
static dl_tensor *o_maxall(dl_tensor **i) { return dl_max(i[0], DL_ALL, false); }
static dl_tensor *o_min(dl_tensor **i) { return dl_min(i[0], DL_DIMS(0), true); }
static dl_tensor *o_var(dl_tensor **i) { return dl_var(i[0], DL_DIMS(1), 1, false); }
static dl_tensor *o_std(dl_tensor **i) { return dl_std(i[0], DL_DIMS(0), 0, true); }
static dl_tensor *o_lse(dl_tensor **i) { return dl_logsumexp(dl_mul_scalar(i[0], 30.0f), DL_DIMS(0, 2), false); }
static dl_tensor *o_cumsum(dl_tensor **i) { return dl_mul(dl_cumsum(i[0], 1), dl_cumsum(i[0], -1)); }
static dl_tensor *o_argmax(dl_tensor **i) { return dl_argmax(i[0], 1, false); }
static dl_tensor *o_max_dim(dl_tensor **i) { return dl_add(dl_max_dim(i[0], 1, false, NULL), dl_min_dim(i[0], 0, false, NULL)); }
static dl_tensor *o_matmul(dl_tensor **i) { return dl_matmul(i[0], i[1]); }
static dl_tensor *o_linear(dl_tensor **i) { return dl_linear(i[0], i[1], i[2]); }
static dl_tensor *o_softmax(dl_tensor **i) { return dl_softmax(i[0], 1); }
static dl_tensor *o_log_softmax(dl_tensor **i) { return dl_log_softmax(i[0], -1); }
static dl_tensor *o_reshape(dl_tensor **i) { return dl_flatten(dl_squeeze(dl_unsqueeze(dl_reshape(i[0], DL_SHAPE(-1, 4)), 0), 0), 0, -1); }
static dl_tensor *o_permute(dl_tensor **i) { return dl_transpose(dl_permute(i[0], DL_SHAPE(2, 0, 1)), 0, 1); }
static dl_tensor *o_narrow(dl_tensor **i) { return dl_narrow(i[0], 1, 1, 2); }
static dl_tensor *o_cat(dl_tensor **i) { dl_tensor *t[2]; t[0] = i[0]; t[1] = i[1]; return dl_cat(2, t, 0); }
/* pieces (one left out: zeros in the gradient), joined again */
static dl_tensor *o_chunk(dl_tensor **i)
{
    dl_tensor *p[3], *u[2];
    if (dl_chunk(i[0], 3, 1, p) != 3) return NULL;
    u[0] = dl_mul(p[0], p[0]);
    u[1] = dl_mul_scalar(p[2], 3.0f);
    return dl_cat(2, u, 1);
}
static dl_tensor *o_unbind(dl_tensor **i)
{
    dl_tensor *p[3], *u[2];
    if (dl_unbind(i[0], 0, 3, p) != 3) return NULL;
    u[0] = p[2];
    u[1] = dl_mul(p[0], p[1]);
    return dl_stack(2, u, 0);
}
static dl_tensor *o_split_sizes(dl_tensor **i)
{
    static const int64_t sz[3] = {1, 2, 1};
    dl_tensor *p[3], *u[2];
    if (dl_split_sizes(i[0], 3, sz, 1, p) != 3) return NULL;
    u[0] = p[0];
    u[1] = dl_mul(p[2], p[2]);
    return dl_cat(2, u, 1);
}
static dl_tensor *o_stack(dl_tensor **i) { dl_tensor *t[2]; t[0] = i[0]; t[1] = i[1]; return dl_stack(2, t, 1); }
static dl_tensor *o_expand(dl_tensor **i) { return dl_expand(i[0], DL_SHAPE(2, 3, 4)); }
static dl_tensor *o_sum_to(dl_tensor **i) { return dl_sum_to(i[0], DL_SHAPE(3, 1)); }
static dl_tensor *o_copy(dl_tensor **i) { return dl_copy(i[0]); }
static dl_tensor *o_conv1d(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 1); return dl_conv1d(i[0], i[1], i[2], &d); }
static dl_tensor *o_conv2d(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(1, 1, 2, 1); return dl_conv2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_conv3d(dl_tensor **i) { return dl_conv3d(i[0], i[1], i[2], NULL); }
static dl_tensor *o_convT2d(dl_tensor **i) { dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 1); d.output_padding[0] = d.output_padding[1] = 1; return dl_conv_transpose2d(i[0], i[1], i[2], &d); }
static dl_tensor *o_maxpool(dl_tensor **i) { dl_pool_desc d = dl_pool_desc_make(3, 2, 1, true, true); return dl_max_pool2d(i[0], &d); }
static dl_tensor *o_avgpool(dl_tensor **i) { dl_pool_desc d = dl_pool_desc_make(3, 2, 1, false, false); return dl_avg_pool2d(i[0], &d); }
static dl_tensor *o_adaptive(dl_tensor **i) { return dl_adaptive_avg_pool2d(i[0], DL_SHAPE(2, 3)); }
static dl_tensor *o_bn(dl_tensor **i) { return dl_batch_norm(i[0], NULL, NULL, i[1], i[2], true, 0.1f, 1e-5f); }
static dl_tensor *o_ln(dl_tensor **i) { return dl_layer_norm(i[0], DL_SHAPE(5), i[1], i[2], 1e-5f); }
static dl_tensor *o_dropout(dl_tensor **i) { return dl_dropout(i[0], 0.3f, true); }
static dl_tensor *o_emb(dl_tensor **i) { return dl_embedding(i[1], i[0], DL_NO_PADDING); }
static dl_tensor *o_emb_pad(dl_tensor **i) { dl_tensor *y = dl_embedding(i[1], i[0], 2); return dl_mul(y, y); }
static dl_tensor *o_where(dl_tensor **i) { return dl_where(dl_gt(i[0], dl_sigmoid(i[1])), dl_mul(i[0], i[1]), i[1]); }
static dl_tensor *o_cmp(dl_tensor **i)
{
    dl_tensor *a = i[0], *b = i[1];
    return dl_add(dl_add(dl_lt(a, b), dl_mul_scalar(dl_le(a, b), 2.0f)),
                  dl_add(dl_mul_scalar(dl_ge(a, b), 4.0f), dl_mul_scalar(dl_ne(a, b), 8.0f)));
}
static dl_tensor *o_mfill(dl_tensor **i) { return dl_softmax(dl_masked_fill(i[0], dl_triu(dl_ones_like(i[1]), 1), -INFINITY), -1); }
static dl_tensor *o_tril(dl_tensor **i) { return dl_mul(dl_tril(i[0], -1), dl_triu(i[0], 1)); }
static dl_tensor *o_gather(dl_tensor **i) { dl_tensor *y = dl_gather(i[0], 1, dl_unsqueeze(i[1], 1)); return dl_mul(y, y); }
static dl_tensor *o_gather0(dl_tensor **i)
{
    dl_tensor *y = dl_gather(i[0], 0, dl_reshape(i[1], DL_SHAPE(2, 3)));
    return dl_mul(y, y);
}
static dl_tensor *o_gnorm(dl_tensor **i) { return dl_group_norm(i[0], 2, i[1], i[2], 1e-5f); }
static dl_tensor *o_upsample(dl_tensor **i) { dl_tensor *u = dl_upsample_nearest(i[0], 2); return dl_mul(u, u); }
static dl_tensor *o_todtype(dl_tensor **i)
{
    dl_tensor *x = dl_mul_scalar(i[0], 3.0f);
    return dl_add(dl_to_dtype(dl_to_dtype(x, DL_DTYPE_I32), DL_DTYPE_F32),
                  dl_to_dtype(dl_to_dtype(dl_to_dtype(x, DL_DTYPE_I64), DL_DTYPE_I32), DL_DTYPE_F32));
}
static dl_tensor *o_multinomial(dl_tensor **i) { return dl_multinomial(i[0], 6, true); }
static dl_tensor *o_ce(dl_tensor **i) { dl_loss_desc d; memset(&d, 0, sizeof d); d.label_smoothing = 0.1f; return dl_cross_entropy(i[0], i[1], &d); }
static dl_tensor *o_nll(dl_tensor **i) { return dl_nll_loss(dl_log_softmax(i[0], 1), i[1], NULL); }
static dl_tensor *o_mse(dl_tensor **i) { return dl_mse_loss(i[0], i[1], NULL); }
static dl_tensor *o_l1(dl_tensor **i) { return dl_l1_loss(i[0], i[1], NULL); }
static dl_tensor *o_smooth(dl_tensor **i) { return dl_smooth_l1_loss(i[0], i[1], NULL); }
static dl_tensor *o_huber(dl_tensor **i) { return dl_huber_loss(i[0], i[1], NULL); }
static dl_tensor *o_bce(dl_tensor **i) { return dl_binary_cross_entropy(dl_sigmoid(i[0]), dl_sigmoid(i[1]), NULL); }
static dl_tensor *o_bcel(dl_tensor **i) { dl_loss_desc d; memset(&d, 0, sizeof d); d.pos_weight = i[2]; return dl_binary_cross_entropy_with_logits(i[0], dl_sigmoid(i[1]), &d); }
static dl_tensor *o_kl(dl_tensor **i) { dl_loss_desc d; memset(&d, 0, sizeof d); d.reduction = DL_REDUCTION_BATCHMEAN; return dl_kl_div(dl_log_softmax(i[0], 1), dl_softmax(i[1], 1), &d); }
static dl_tensor *o_to(dl_tensor **i) { dl_tensor *y = dl_to(i[0], dl_cpu()); return dl_to(dl_mul(y, y), i[0]->device); }

#define S(...) {DL__NARG(__VA_ARGS__), {__VA_ARGS__}}
static const opcase g_ops[] = {
    {"dl_add", o_add, 2, {S(2, 3, 4), S(3, 1)}, 0, false},
    {"dl_sub", o_sub, 2, {S(3, 4), S(4)}, 0, false},
    {"dl_mul", o_mul, 2, {S(2, 1, 4), S(3, 1)}, 0, false},
    {"dl_div", o_div, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"dl_maximum", o_maximum, 2, {S(3, 4), S(4)}, 0, false},
    {"dl_minimum", o_minimum, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"scalar ops", o_scalars, 1, {S(3, 4)}, 0, false},
    {"dl_pow", o_pow, 1, {S(3, 4)}, 1, false},
    {"dl_neg", o_neg, 1, {S(3, 4)}, 0, false},
    {"dl_exp", o_exp, 1, {S(3, 4)}, 0, false},
    {"dl_log", o_log, 1, {S(3, 4)}, 1, false},
    {"dl_sqrt", o_sqrt, 1, {S(3, 4)}, 1, false},
    {"dl_abs", o_abs, 1, {S(3, 4)}, 0, false},
    {"dl_erf", o_erf, 1, {S(3, 4)}, 0, false},
    {"dl_clamp", o_clamp, 1, {S(3, 4)}, 0, false},
    {"dl_relu", o_relu, 1, {S(3, 4)}, 0, false},
    {"dl_leaky_relu", o_leaky, 1, {S(3, 4)}, 0, false},
    {"dl_sigmoid", o_sigmoid, 1, {S(3, 4)}, 0, false},
    {"dl_silu", o_silu, 1, {S(3, 4)}, 0, false},
    {"dl_tanh", o_tanh, 1, {S(3, 4)}, 0, false},
    {"dl_gelu", o_gelu, 1, {S(3, 4)}, 0, false},
    {"dl_softplus", o_softplus, 1, {S(3, 4)}, 0, false},
    {"dl_logsigmoid", o_logsigmoid, 1, {S(3, 4)}, 0, false},
    {"dl_sin", o_sin, 1, {S(3, 4)}, 0, false},
    {"dl_cos", o_cos, 1, {S(3, 4)}, 0, false},
    {"dl_log1p", o_log1p, 1, {S(3, 4)}, 3, false},
    {"dl_expm1", o_expm1, 1, {S(3, 4)}, 0, false},
    {"dl_rsqrt", o_rsqrt, 1, {S(3, 4)}, 1, false},
    {"dl_sum", o_sum, 1, {S(2, 3, 4)}, 0, false},
    {"dl_mean", o_mean, 1, {S(2, 3, 4)}, 0, false},
    {"dl_max dim", o_max, 1, {S(3, 5)}, 0, false},
    {"dl_max all", o_maxall, 1, {S(3, 5)}, 0, false},
    {"dl_min", o_min, 1, {S(3, 5)}, 0, false},
    {"dl_var", o_var, 1, {S(3, 5)}, 0, false},
    {"dl_std", o_std, 1, {S(3, 5)}, 0, false},
    {"dl_logsumexp", o_lse, 1, {S(3, 4, 5)}, 0, false},
    {"dl_cumsum", o_cumsum, 1, {S(3, 4, 70)}, 0, false},
    {"dl_argmax", o_argmax, 1, {S(3, 5)}, 0, true},
    {"dl_max_dim dl_min_dim", o_max_dim, 1, {S(3, 3)}, 0, false},
    {"dl_matmul 2d", o_matmul, 2, {S(3, 4), S(4, 5)}, 0, false},
    {"dl_matmul batched", o_matmul, 2, {S(2, 3, 4), S(4, 5)}, 0, false},
    {"dl_matmul bcast", o_matmul, 2, {S(2, 1, 3, 4), S(3, 4, 2)}, 0, false},
    {"dl_matmul vec", o_matmul, 2, {S(4), S(2, 4, 3)}, 0, false},
    {"dl_linear", o_linear, 3, {S(6, 4), S(3, 4), S(3)}, 0, false},
    {"dl_softmax", o_softmax, 1, {S(3, 5)}, 0, false},
    {"dl_log_softmax", o_log_softmax, 1, {S(3, 5)}, 0, false},
    {"views", o_reshape, 1, {S(2, 3, 4)}, 0, false},
    {"dl_permute", o_permute, 1, {S(2, 3, 4)}, 0, false},
    {"dl_narrow", o_narrow, 1, {S(3, 4)}, 0, false},
    {"dl_cat", o_cat, 2, {S(2, 3), S(2, 3)}, 0, false},
    {"dl_chunk", o_chunk, 1, {S(3, 7)}, 0, false},
    {"dl_unbind", o_unbind, 1, {S(3, 4)}, 0, false},
    {"dl_split_sizes", o_split_sizes, 1, {S(2, 4, 3)}, 0, false},
    {"dl_stack", o_stack, 2, {S(2, 3), S(2, 3)}, 0, false},
    {"dl_expand", o_expand, 1, {S(3, 1)}, 0, false},
    {"dl_sum_to", o_sum_to, 1, {S(2, 3, 4)}, 0, false},
    {"dl_copy", o_copy, 1, {S(3, 4)}, 0, false},
    {"dl_conv1d", o_conv1d, 3, {S(2, 3, 9), S(4, 3, 3), S(4)}, 0, false},
    {"dl_conv2d", o_conv2d, 3, {S(2, 2, 7, 6), S(3, 2, 3, 3), S(3)}, 0, false},
    {"dl_conv3d", o_conv3d, 3, {S(1, 2, 4, 4, 4), S(2, 2, 2, 2, 2), S(2)}, 0, false},
    {"dl_conv_transpose2d", o_convT2d, 3, {S(2, 3, 4, 4), S(3, 2, 3, 3), S(2)}, 0, false},
    {"dl_max_pool2d", o_maxpool, 1, {S(2, 3, 7, 7)}, 0, false},
    {"dl_avg_pool2d", o_avgpool, 1, {S(2, 3, 7, 7)}, 0, false},
    {"dl_adaptive_avg_pool2d", o_adaptive, 1, {S(2, 3, 7, 8)}, 0, false},
    {"dl_batch_norm", o_bn, 3, {S(4, 3, 5), S(3), S(3)}, 0, false},
    {"dl_layer_norm", o_ln, 3, {S(4, 5), S(5), S(5)}, 0, false},
    {"dl_dropout", o_dropout, 1, {S(4, 50)}, 0, false},
    {"dl_embedding", o_emb, 2, {S(5, 3), S(4, 3)}, 2, false},
    {"dl_embedding padding_idx", o_emb_pad, 2, {S(5, 4), S(2, 7)}, 2, false},
    {"dl_where", o_where, 2, {S(3, 4), S(4)}, 0, false},
    {"dl_lt dl_le dl_ge dl_ne", o_cmp, 2, {S(3, 4), S(3, 1)}, 0, true},
    {"dl_masked_fill", o_mfill, 2, {S(2, 4, 4), S(4, 4)}, 0, false},
    {"dl_tril dl_triu", o_tril, 1, {S(2, 3, 5)}, 0, false},
    {"dl_gather", o_gather, 2, {S(6, 5), S(6)}, 2, false},
    {"dl_gather dim 0", o_gather0, 2, {S(5, 3), S(6)}, 2, false},
    {"dl_group_norm", o_gnorm, 3, {S(3, 4, 5), S(4), S(4)}, 0, false},
    {"dl_upsample_nearest", o_upsample, 1, {S(2, 3, 4, 5)}, 0, false},
    {"dl_cross_entropy", o_ce, 2, {S(6, 5), S(6)}, 2, false},
    {"dl_nll_loss", o_nll, 2, {S(6, 5), S(6)}, 2, false},
    {"dl_mse_loss", o_mse, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"dl_l1_loss", o_l1, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"dl_smooth_l1_loss", o_smooth, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"dl_huber_loss", o_huber, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"dl_binary_cross_entropy", o_bce, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"dl_bce_with_logits", o_bcel, 3, {S(3, 4), S(3, 4), S(4)}, 0, false},
    {"dl_kl_div", o_kl, 2, {S(3, 4), S(3, 4)}, 0, false},
    {"dl_to", o_to, 1, {S(3, 4)}, 0, false},
    {"dl_to_dtype", o_todtype, 1, {S(3, 4)}, 0, true},
    {"dl_multinomial", o_multinomial, 1, {S(3, 5)}, 3, true},
};

static uint64_t g_lcg = 42;
static float urand(void)
{
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_lcg >> 40) & 0xffffff) / 16777216.0f;
}

/* one run of a case on dev: inputs from the same host values, forward
   (and backward with a fixed upstream gradient); results as host floats */
typedef struct result { float *v[8]; int64_t n[8]; int k; bool ok; } result;

static void run_on(const opcase *c, dl_device dev, float *const *host, result *r)
{
    dl_tensor *in[3], *y, *g, *grads[3];
    int j;
    memset(r, 0, sizeof *r);
    dl_manual_seed(C, 99);                       /* dropout draws the same mask */
    dl_set_device(C, dev);
    for (j = 0; j < c->nin; j++) {
        int64_t n = 1, *iv = NULL, k;
        int d;
        for (d = 0; d < c->shape[j].ndim; d++) n *= c->shape[j].d[d];
        if (c->kind == 2 && j == 1) {
            iv = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
            for (k = 0; k < n; k++) iv[k] = (int64_t)(host[j][k] * 5.0f) % 5;
            in[j] = dl_from_int64(C, c->shape[j], iv);
            free(iv);
        } else {
            in[j] = dl_from_array(C, c->shape[j], host[j]);
            if (!c->nograd) dl_requires_grad(in[j], true);
        }
        CHECK(in[j] && in[j]->device.type == dev.type && in[j]->device.index == dev.index,
              "%s: input %d not on %s", c->name, j, dl_device_name(dev));
    }
    y = c->f(in);
    if (!y) { CHECK(0, "%s on %s: %s", c->name, dl_device_name(dev), dl_error_message(C)); dl_clear_error(C); return; }
    CHECK(y->device.type == dev.type && y->device.index == dev.index, "%s: result on %s, not %s", c->name,
          dl_device_name(y->device), dl_device_name(dev));
    r->n[0] = y->numel;
    r->v[0] = (float *)malloc(sizeof(float) * (size_t)(y->numel + 1));
    if (y->dtype == DL_DTYPE_I64) {
        int64_t *tmp = (int64_t *)malloc(sizeof(int64_t) * (size_t)(y->numel + 1)), k;
        dl_read_int64(y, tmp, y->numel);
        for (k = 0; k < y->numel; k++) r->v[0][k] = (float)tmp[k];
        free(tmp);
    } else dl_read(y, r->v[0], y->numel);
    r->k = 1;
    if (!c->nograd) {
        dl_backward_desc bd;
        dl_tensor *req[3] = {NULL, NULL, NULL};
        int nr = 0;
        float *gh = (float *)malloc(sizeof(float) * (size_t)(y->numel + 1));
        int64_t k;
        for (k = 0; k < y->numel; k++) gh[k] = (float)k * 0.37f - 1.0f;
        g = dl_from_array(C, dl_shape_make(y->ndim, y->shape), gh);
        free(gh);
        for (j = 0; j < c->nin; j++) if (in[j]->requires_grad) req[nr++] = in[j];
        memset(&bd, 0, sizeof bd);
        bd.grad = g;
        if (dl_grad(y, nr, req, grads, &bd) != DL_OK) {
            CHECK(0, "%s backward on %s: %s", c->name, dl_device_name(dev), dl_error_message(C));
            dl_clear_error(C);
            return;
        }
        for (j = 0; j < nr; j++) {
            r->n[r->k] = req[j]->numel;
            r->v[r->k] = (float *)calloc((size_t)(req[j]->numel + 1), sizeof(float));
            if (grads[j]) {
                CHECK(grads[j]->device.type == dev.type && grads[j]->device.index == dev.index,
                      "%s: gradient %d on another device", c->name, j);
                dl_read(grads[j], r->v[r->k], req[j]->numel);
            }
            r->k++;
        }
    }
    r->ok = true;
    dl_step_end(C);
}

static void free_result(result *r) { int k; for (k = 0; k < r->k; k++) free(r->v[k]); }

/* host values for the inputs of case oc (kind 0: randn-like in [-2,2), 1:
   positive, 2: class targets, 3: in (0,1)); free each host[j] */
static void optable_inputs(const opcase *oc, float **host)
{
    int j;
    for (j = 0; j < oc->nin; j++) {
        int64_t n = 1, i;
        int d;
        for (d = 0; d < oc->shape[j].ndim; d++) n *= oc->shape[j].d[d];
        host[j] = (float *)malloc(sizeof(float) * (size_t)(n + 1));
        for (i = 0; i < n; i++) {
            float u = urand();
            host[j][i] = oc->kind == 1 ? 0.3f + 2.0f * u : oc->kind == 3 ? 0.05f + 0.9f * u
                       : (oc->kind == 2 && j == 1) ? u : 4.0f * u - 2.0f;
        }
    }
}

#endif
