/* tests/test_gradcheck.c - every differentiable op of dl.h against central
   differences (dl_gradcheck), in several shapes each: broadcasting, size-1
   dims, 0-d tensors, negative dims, keepdim both ways. Also a small MLP, a
   custom function (dl_function_apply) and a second-order quantity (a
   gradient computed with create_graph inside the checked function).

   Inputs that meet a kink (relu, abs, clamp, leaky_relu, maximum/minimum,
   max/min reductions) are filled with distinct values on a 0.2 grid offset by
   0.06 or 0.14: |x| >= 0.06, no ties within a tensor, and operands filled
   with the two offsets differ by >= 0.06 everywhere, so a step of eps = 1e-3
   never crosses a kink. log/sqrt/pow/div denominators get inputs in
   [0.5, 2) (or that with a random sign). Default tolerances everywhere
   (eps 1e-3, atol 1e-3, rtol 1e-2). */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>

enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAXIMUM, OP_MINIMUM,
    OP_ADDS, OP_SUBS, OP_MULS, OP_DIVS, OP_RSUBS, OP_POW,
    OP_NEG, OP_EXP, OP_LOG, OP_SQRT, OP_ABS, OP_ERF, OP_CLAMP, OP_RELU, OP_LEAKY,
    OP_SIGMOID, OP_TANH, OP_GELU, OP_GELU_TANH, OP_SILU, OP_SOFTPLUS, OP_LOGSIGMOID,
    OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_VAR, OP_STD,
    OP_MATMUL, OP_SOFTMAX, OP_LOGSOFTMAX,
    OP_RESHAPE, OP_FLATTEN, OP_UNFLATTEN, OP_SQUEEZE, OP_UNSQUEEZE, OP_PERMUTE, OP_TRANSPOSE,
    OP_NARROW, OP_CAT, OP_STACK, OP_EXPAND, OP_SUMTO, OP_COPY,
    OP_MLP, OP_CUSTOM, OP_SECOND, OP_MAXDIM, OP_MINDIM, OP_NORM, OP_SECOND_NORM,
    OP_EMBED, OP_SECOND_EMBED, OP_WHERE, OP_MFILL, OP_TRIL, OP_TRIU, OP_GATHER, OP_SECOND_GATHER, OP_GNORM, OP_UPSAMPLE,
    OP_SPLIT, OP_SECOND_SPLIT, OP_CAT_LOGP, OP_CAT_ENT, OP_SECOND_CAT, OP_LSE, OP_SECOND_LSE, OP_CUMSUM, OP_SECOND_CUMSUM,
    OP_SDPA, OP_SIN, OP_COS, OP_LOG1P, OP_EXPM1, OP_RSQRT, OP_SECOND_UN, OP_CAT_PLOGP, OP_CAT_PENT, OP_SECOND_PCAT,
    OP_CAT_BLOGP
};

/* fills */
enum { F_RANDN, F_POS, F_AWAY, F_DA, F_DB, F_ZROW };   /* F_ZROW: randn, row 1 of the last dim 0 */

typedef struct P {
    int op;
    float s0, s1;      /* scalar attributes */
    dl_shape sh;       /* dims / shape / perm */
    int d0, d1;        /* dims (var: correction) */
    int64_t i0, i1;    /* narrow start, length */
    bool keep;
    int n;             /* inputs (cat, stack) */
} P;

typedef struct In { dl_shape s; int fill; } In;

static dl_ctx *G;
static uint64_t g_seed = 1;

static P mk(int op) { P p; memset(&p, 0, sizeof p); p.op = op; return p; }
static P mkf(int op, float a, float b) { P p = mk(op); p.s0 = a; p.s1 = b; return p; }
static P mkd(int op, dl_shape dims, bool keep) { P p = mk(op); p.sh = dims; p.keep = keep; return p; }
static P mki(int op, int d0, int d1) { P p = mk(op); p.d0 = d0; p.d1 = d1; return p; }
static P mks(int op, dl_shape s) { P p = mk(op); p.sh = s; return p; }
static In I(dl_shape s, int fill) { In r; r.s = s; r.fill = fill; return r; }
static dl_shape S0(void) { return dl_shape_make(0, NULL); }

/* a fixed 0/1 mask of shape s (where's condition) */
static dl_tensor *pattern_mask(dl_ctx *c, dl_shape s)
{
    float v[64];
    int64_t i, n = 1;
    int d;
    for (d = 0; d < s.ndim; d++) n *= s.d[d];
    for (i = 0; i < n && i < 64; i++) v[i] = (i * 7) % 3 != 0 ? 1.0f : 0.0f;
    return dl_from_array(c, s, v);
}

/* dl_gather's index: shape (p->i1 dims of p->sh), values p->sh's after them */
static dl_tensor *gidx(dl_ctx *c, const P *p)
{
    int64_t v[DL_MAX_DIMS * 2], n = 1;
    int d, k = (int)p->i1;
    for (d = 0; d < k; d++) n *= p->sh.d[d];
    for (d = 0; d < n; d++) v[d] = p->sh.d[k + d];
    return dl_from_int64(c, dl_shape_make(k, p->sh.d), v);
}

/* Categorical's value for logits a: (i * 3 + 1) mod C at flat index i of the batch shape */
static dl_tensor *cat_value(dl_tensor *a)
{
    int64_t v[64], C = a->shape[a->ndim - 1], i;
    for (i = 0; i < a->numel / C && i < 64; i++) v[i] = (i * 3 + 1) % C;
    return dl_from_int64(dl_tensor_ctx(a), dl_shape_make(a->ndim - 1, a->shape), v);
}
/* a value (3,1) broadcast with the batch shape of a (N, C): log_prob (3,N) */
static dl_tensor *cat_bvalue(dl_tensor *a)
{
    int64_t v[3] = {0, 2, 1};
    return dl_from_int64(dl_tensor_ctx(a), DL_SHAPE(3, 1), v);
}

/* ---- the custom function: sigmoid written with dl ops */
static dl_tensor *sig_fwd(dl_fn_ctx *fc, int n, dl_tensor *const *in, void *user)
{
    dl_tensor *y;
    (void)n; (void)user;
    /* 1 / (1 + exp(-x)) */
    y = dl_pow(dl_add_scalar(dl_exp(dl_neg(in[0])), 1.0f), -1.0f);
    dl_fn_save(fc, y);
    return y;
}
static dl_result sig_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    dl_tensor *y = dl_fn_saved(fc, 0);
    (void)user;
    if (!dl_fn_needs_grad(fc, 0)) return DL_OK;
    gin[0] = dl_mul(g, dl_mul(y, dl_rsub_scalar(y, 1.0f)));   /* g y (1 - y) */
    return gin[0] ? DL_OK : DL_ERR_GRAPH;
}
static const dl_function MY_SIGMOID = {"my_sigmoid", sig_fwd, sig_bwd};
/* a deliberately wrong backward (g y, missing the 1 - y): gradcheck must fail it */
static dl_result sig_bad_bwd(dl_fn_ctx *fc, dl_tensor *g, dl_tensor **gin, void *user)
{
    (void)user;
    gin[0] = dl_mul(g, dl_fn_saved(fc, 0));
    return gin[0] ? DL_OK : DL_ERR_GRAPH;
}
static const dl_function BAD_SIGMOID = {"bad_sigmoid", sig_fwd, sig_bad_bwd};
static dl_tensor *f_bad(void *user, dl_tensor *const *in)
{
    (void)user;
    return dl_function_apply(&BAD_SIGMOID, 1, in, NULL);
}

/* ---- the function under check */
/* the pieces of a by form d1 (0: dl_split(i0), 1: dl_split_sizes(sh),
   2: dl_chunk(i0), 3: dl_unbind) along d0, joined: cat of (k + 1) p_k^pw
   flattened over the pieces in mask i1 (a piece left out: zeros in the
   gradient) */
static dl_tensor *split_join(dl_tensor *a, const P *p, float pw)
{
    dl_tensor *ps[16], *u[16];
    int k, m = 0, cnt = p->d1 == 0 ? dl_split(a, p->i0, p->d0, 16, ps)
                        : p->d1 == 1 ? dl_split_sizes(a, p->sh.ndim, p->sh.d, p->d0, ps)
                        : p->d1 == 2 ? dl_chunk(a, (int)p->i0, p->d0, ps) : dl_unbind(a, p->d0, 16, ps);
    for (k = 0; k < cnt; k++)
        if (p->i1 >> k & 1) u[m++] = dl_reshape(dl_mul_scalar(dl_pow(ps[k], pw), (float)(k + 1)), DL_SHAPE(-1));
    return cnt < 0 ? NULL : dl_cat(m, u, 0);
}

static dl_tensor *f_op(void *user, dl_tensor *const *in)
{
    const P *p = (const P *)user;
    dl_tensor *a = in[0], *b = p->n > 1 ? in[1] : NULL;
    switch (p->op) {
    case OP_ADD: return dl_add(a, b);
    case OP_SUB: return dl_sub(a, b);
    case OP_MUL: return dl_mul(a, b);
    case OP_DIV: return dl_div(a, b);
    case OP_MAXIMUM: return dl_maximum(a, b);
    case OP_MINIMUM: return dl_minimum(a, b);
    case OP_ADDS: return dl_add_scalar(a, p->s0);
    case OP_SUBS: return dl_sub_scalar(a, p->s0);
    case OP_MULS: return dl_mul_scalar(a, p->s0);
    case OP_DIVS: return dl_div_scalar(a, p->s0);
    case OP_RSUBS: return dl_rsub_scalar(a, p->s0);
    case OP_POW: return dl_pow(a, p->s0);
    case OP_NEG: return dl_neg(a);
    case OP_EXP: return dl_exp(a);
    case OP_LOG: return dl_log(a);
    case OP_SQRT: return dl_sqrt(a);
    case OP_ABS: return dl_abs(a);
    case OP_ERF: return dl_erf(a);
    case OP_CLAMP: return dl_clamp(a, p->s0, p->s1);
    case OP_RELU: return dl_relu(a);
    case OP_LEAKY: return dl_leaky_relu(a, p->s0);
    case OP_SIGMOID: return dl_sigmoid(a);
    case OP_TANH: return dl_tanh(a);
    case OP_GELU: return dl_gelu(a);
    case OP_GELU_TANH: return dl_gelu_tanh(a);
    case OP_SILU: return dl_silu(a);
    case OP_SOFTPLUS: return dl_softplus(a, p->s0, p->s1);
    case OP_LOGSIGMOID: return dl_logsigmoid(a);
    case OP_SIN: return dl_sin(a);
    case OP_COS: return dl_cos(a);
    case OP_LOG1P: return dl_log1p(a);
    case OP_EXPM1: return dl_expm1(a);
    case OP_RSQRT: return dl_rsqrt(a);
    case OP_SUM: return dl_sum(a, p->sh, p->keep);
    case OP_MEAN: return dl_mean(a, p->sh, p->keep);
    case OP_MAX: return dl_max(a, p->sh, p->keep);
    case OP_MIN: return dl_min(a, p->sh, p->keep);
    case OP_MAXDIM: return dl_max_dim(a, p->d0, p->keep, NULL);
    case OP_MINDIM: return dl_min_dim(a, p->d0, p->keep, NULL);
    case OP_VAR: return dl_var(a, p->sh, p->d0, p->keep);
    case OP_STD: return dl_std(a, p->sh, p->d0, p->keep);
    case OP_NORM: return dl_norm(a, p->sh, p->keep);
    case OP_LSE: return dl_logsumexp(a, p->sh, p->keep);
    case OP_CUMSUM: return dl_cumsum(a, p->d0);
    case OP_MATMUL: return dl_matmul(a, b);
    case OP_SOFTMAX: return dl_softmax(a, p->d0);
    case OP_LOGSOFTMAX: return dl_log_softmax(a, p->d0);
    case OP_RESHAPE: return dl_reshape(a, p->sh);
    case OP_FLATTEN: return dl_flatten(a, p->d0, p->d1);
    case OP_UNFLATTEN: return dl_unflatten(a, p->d0, p->sh);
    case OP_SQUEEZE: return dl_squeeze(a, p->d0);
    case OP_UNSQUEEZE: return dl_unsqueeze(a, p->d0);
    case OP_PERMUTE: return dl_permute(a, p->sh);
    case OP_TRANSPOSE: return dl_transpose(a, p->d0, p->d1);
    case OP_NARROW: return dl_narrow(a, p->d0, p->i0, p->i1);
    case OP_CAT: return dl_cat(p->n, in, p->d0);
    case OP_STACK: return dl_stack(p->n, in, p->d0);
    case OP_EXPAND: return dl_expand(a, p->sh);
    case OP_SUMTO: return dl_sum_to(a, p->sh);
    case OP_COPY: return dl_copy(a);
    case OP_SPLIT: return split_join(a, p, 2.0f);
    case OP_MLP: {
        /* mean(log_softmax(tanh(x W1 + b1) W2 + b2, 1)) */
        dl_tensor *h = dl_tanh(dl_add(dl_matmul(in[0], in[1]), in[2]));
        dl_tensor *z = dl_add(dl_matmul(h, in[3]), in[4]);
        return dl_mean(dl_log_softmax(z, 1), DL_ALL, false);
    }
    case OP_CUSTOM: return dl_function_apply(&MY_SIGMOID, 1, in, NULL);
    case OP_EMBED: {
        /* the weight (V, D) read at the indices p->sh (as (2, n/2) when i0),
           padding_idx d0 when keep; d1: the result times itself */
        dl_tensor *idx = dl_from_int64(dl_tensor_ctx(a), p->i0 ? DL_SHAPE(2, p->sh.ndim / 2) : DL_SHAPE(p->sh.ndim),
                                       p->sh.d);
        dl_tensor *y = dl_embedding(idx, a, p->keep ? p->d0 : DL_NO_PADDING);
        return p->d1 ? dl_mul(y, y) : y;
    }
    case OP_WHERE: return dl_where(pattern_mask(dl_tensor_ctx(a), p->sh), dl_mul(a, b), dl_mul(b, b));
    case OP_MFILL:   /* softmax over rows with a causal mask: -inf above the diagonal */
        return dl_softmax(dl_masked_fill(a, dl_triu(dl_ones(dl_tensor_ctx(a), p->sh), 1), -INFINITY), -1);
    case OP_GNORM: return dl_mul(dl_group_norm(a, p->d0, b, p->n > 2 ? in[2] : NULL, 1e-5f), a);   /* times x */
    case OP_UPSAMPLE: { dl_tensor *u = dl_upsample_nearest(a, p->d0); return dl_mul(u, u); }
    case OP_SDPA:   /* d0: no mask, 1 a bool (int32) pattern mask p->sh, 2 in[3] a float mask, 3 causal */
        return dl_scaled_dot_product_attention(a, b, in[2], p->d0 == 1 ? dl_to_dtype(pattern_mask(dl_tensor_ctx(a), p->sh),
                                                                                   DL_DTYPE_I32)
                                                           : p->d0 == 2 ? in[3] : NULL, 0.0f, p->d0 == 3, p->s0);
    case OP_TRIL: return dl_mul(dl_tril(a, p->i0), a);
    case OP_TRIU: return dl_mul(dl_triu(a, p->i0), a);
    case OP_GATHER: {   /* gather(a, d0, index p->sh (the shape i-th of p->sh's values: see gidx)), squared */
        dl_tensor *y = dl_gather(a, p->d0, gidx(dl_tensor_ctx(a), p));
        return dl_mul(y, y);
    }
    case OP_CAT_LOGP: return dl_categorical_log_prob(a, cat_value(a));
    case OP_CAT_ENT: return dl_categorical_entropy(a);
    case OP_CAT_PLOGP: return dl_categorical_probs_log_prob(a, p->d0 ? cat_bvalue(a) : cat_value(a));
    case OP_CAT_PENT: return dl_categorical_probs_entropy(a);
    case OP_CAT_BLOGP: return dl_categorical_log_prob(a, cat_bvalue(a));
    case OP_SECOND:
    case OP_SECOND_CAT:
    case OP_SECOND_UN:
    case OP_SECOND_PCAT:
    case OP_SECOND_EMBED:
    case OP_SECOND_GATHER:
    case OP_SECOND_SPLIT:
    case OP_SECOND_LSE:
    case OP_SECOND_CUMSUM:
    case OP_SECOND_NORM: {
        /* g = d/dx sum(tanh(x)^3), or WGAN-GP's shape: d/dx sum((norm(x * x,
           dim 1) - 1)^2) through dl_norm's backward, with history
           (create_graph). During the finite-difference evaluations
           dl_gradcheck turns grad mode off; the inner dl_grad needs it on,
           so it is re-enabled around it. */
        dl_ctx *c = dl_tensor_ctx(a);
        bool off = !dl_is_grad_enabled(c);
        dl_tensor *y, *g = NULL;
        dl_backward_desc bd;
        memset(&bd, 0, sizeof bd);
        bd.create_graph = true;
        if (off) dl_no_grad_end(c);
        if (p->op == OP_SECOND) y = dl_sum(dl_pow(dl_tanh(a), 3.0f), DL_ALL, false);
        else if (p->op == OP_SECOND_EMBED) {   /* d/dw sum(embedding(idx, w)^3): through its backward's backward */
            int64_t iv[5] = {2, 0, 2, 3, 1};
            y = dl_sum(dl_pow(dl_embedding(dl_from_int64(c, DL_SHAPE(5), iv), a, 1), 3.0f), DL_ALL, false);
        }
        else if (p->op == OP_SECOND_CAT)   /* d/dx sum(entropy(x) + log_prob(x, value)^2) */
            y = dl_sum(dl_add(dl_categorical_entropy(a), dl_pow(dl_categorical_log_prob(a, cat_value(a)), 2.0f)),
                       DL_ALL, false);
        else if (p->op == OP_SECOND_PCAT)   /* the same with probs= */
            y = dl_sum(dl_add(dl_categorical_probs_entropy(a),
                              dl_pow(dl_categorical_probs_log_prob(a, cat_value(a)), 2.0f)), DL_ALL, false);
        else if (p->op == OP_SECOND_LSE)   /* d/dx sum(logsumexp(x, 1)^3): through exp(x - y) */
            y = dl_sum(dl_pow(dl_logsumexp(a, DL_DIMS(1), false), 3.0f), DL_ALL, false);
        else if (p->op == OP_SECOND_CUMSUM)   /* d/dx sum(cumsum(x, 1)^3): through the reversed cumsum */
            y = dl_sum(dl_pow(dl_cumsum(a, 1), 3.0f), DL_ALL, false);
        else if (p->op == OP_SECOND_UN) {   /* d/dx sum(f(x)^2), f the unary op d0: through f's backward's ops */
            P q = mk(p->d0);
            dl_tensor *f = f_op(&q, &a);
            y = dl_sum(dl_mul(f, f), DL_ALL, false);
        }
        else if (p->op == OP_SECOND_SPLIT)   /* d/dx sum(pieces^3): through the split's join and its backward */
            y = dl_sum(split_join(a, p, 3.0f), DL_ALL, false);
        else if (p->op == OP_SECOND_GATHER)   /* d/dx sum(gather(x)^3): through the scatter's backward */
            y = dl_sum(dl_pow(dl_gather(a, p->d0, gidx(c, p)), 3.0f), DL_ALL, false);
        else y = dl_sum(dl_pow(dl_sub_scalar(dl_norm(dl_mul(a, a), DL_DIMS(1), false), 1.0f), 2.0f), DL_ALL, false);
        if (y && dl_grad(y, 1, &a, &g, &bd) != DL_OK) g = NULL;
        if (off) dl_no_grad_begin(c);
        return g;
    }
    }
    return NULL;
}

/* ---- fills */
static uint64_t lcg(uint64_t *s) { *s = *s * 6364136223846793005ull + 1442695040888963407ull; return *s >> 33; }

static void fill(dl_tensor *t, int kind)
{
    int64_t i, n = t->numel;
    float *d = (float *)malloc(sizeof(float) * (size_t)(n ? n : 1));
    uint64_t s = g_seed * 7919u + 17u;
    if (!d) { CHECK(0, "fill: out of host memory"); return; }
    if (kind == F_DA || kind == F_DB) {
        float off = kind == F_DA ? 0.06f : 0.14f;
        for (i = 0; i < n; i++) d[i] = (float)(i - n / 2) * 0.2f + off;
        for (i = n - 1; i > 0; i--) {           /* Fisher-Yates */
            int64_t j = (int64_t)(lcg(&s) % (uint64_t)(i + 1));
            float tmp = d[i]; d[i] = d[j]; d[j] = tmp;
        }
    } else if (kind == F_POS || kind == F_AWAY) {
        for (i = 0; i < n; i++) {
            float u = (float)(lcg(&s) % 100000u) / 100000.0f;
            d[i] = 0.5f + 1.5f * u;
            if (kind == F_AWAY && (lcg(&s) & 1)) d[i] = -d[i];
        }
    } else {
        dl_tensor *r;
        dl_manual_seed(G, g_seed);
        r = dl_randn(G, dl_shape_make(t->ndim, t->shape));
        if (!r || dl_read(r, d, n) != DL_OK) CHECK(0, "fill: randn: %s", dl_error_message(G));
        if (kind == F_ZROW && t->ndim >= 1) {
            int64_t w = t->shape[t->ndim - 1];
            for (i = w; i < 2 * w && i < n; i++) d[i] = 0.0f;
        }
    }
    if (dl_write(t, d, n) != DL_OK) CHECK(0, "fill: dl_write: %s", dl_error_message(G));
    free(d);
}

static void shape_str(char *b, size_t cap, dl_shape s)
{
    int i;
    size_t k = strlen(b);
    k += (size_t)snprintf(b + k, cap - k, "(");
    for (i = 0; i < s.ndim && k < cap; i++)
        k += (size_t)snprintf(b + k, cap - k, i ? ",%lld" : "%lld", (long long)s.d[i]);
    if (k < cap) snprintf(b + k, cap - k, ") ");
}

static int ncases;

/* Check op p on inputs of the given shapes/fills; every input requires grad. */
static void gcn(const char *op, const char *label, P p, int n, const In *ins, const dl_gradcheck_desc *desc)
{
    dl_tensor *x[DL_GRADCHECK_MAX_INPUTS];
    dl_gradcheck_result res;
    dl_result rc;
    char cs[160];
    int k;
    cs[0] = 0;
    p.n = n;
    for (k = 0; k < n; k++) {
        shape_str(cs, sizeof cs, ins[k].s);
        g_seed++;
        x[k] = dl_zeros(G, ins[k].s);
        if (!x[k]) break;
        fill(x[k], ins[k].fill);
        dl_requires_grad(x[k], true);
    }
    if (label && strlen(cs) + strlen(label) < sizeof cs) strcat(cs, label);
    memset(&res, 0, sizeof res);
    rc = k == n ? dl_gradcheck(G, f_op, &p, n, x, desc, &res) : dl_last_error(G);
    printf("%-15s %-44s", op, cs);
    for (k = 0; k < res.n; k++) printf(" rel%d %.1e", k, res.max_rel_err[k]);
    printf("\n");
    CHECK(rc == DL_OK && res.ok, "gradcheck %s %s: rc %s (%s) ok %d, worst abs err in0 %g at %lld",
          op, cs, dl_result_string(rc), dl_error_message(G), (int)res.ok, res.max_abs_err[0],
          (long long)res.worst_index[0]);
    if (rc != DL_OK) dl_clear_error(G);
    dl_step_end(G);
    ncases++;
}
static void gc1(const char *op, const char *label, P p, In a) { gcn(op, label, p, 1, &a, NULL); }
static void gc2(const char *op, const char *label, P p, In a, In b)
{
    In v[2];
    v[0] = a; v[1] = b;
    gcn(op, label, p, 2, v, NULL);
}
static void gc3(const char *op, const char *label, P p, In a, In b, In c)
{
    In v[3];
    v[0] = a; v[1] = b; v[2] = c;
    gcn(op, label, p, 3, v, NULL);
}

static void binary_cases(const char *name, int op, int fa, int fb)
{
    P p = mk(op);
    gc2(name, "same", p, I(DL_SHAPE(3, 4), fa), I(DL_SHAPE(3, 4), fb));
    gc2(name, "row bcast", p, I(DL_SHAPE(3, 4), fa), I(DL_SHAPE(4), fb));
    gc2(name, "both bcast", p, I(DL_SHAPE(2, 1, 4), fa), I(DL_SHAPE(3, 1), fb));
    gc2(name, "0-d b", p, I(DL_SHAPE(2, 3), fa), I(S0(), fb));
    gc2(name, "size-1 a", p, I(DL_SHAPE(1), fa), I(DL_SHAPE(2, 3), fb));
    gc2(name, "col bcast", p, I(DL_SHAPE(3, 1), fa), I(DL_SHAPE(3, 5), fb));
}

static void unary_cases(const char *name, P p, int f)
{
    gc1(name, "", p, I(DL_SHAPE(3, 4), f));
    gc1(name, "size-1", p, I(DL_SHAPE(2, 1, 3), f));
    gc1(name, "0-d", p, I(S0(), f));
    gc1(name, "1-d", p, I(DL_SHAPE(7), f));
}

static void reduce_cases(const char *name, int op, int f)
{
    int keep;
    for (keep = 0; keep < 2; keep++) {
        const char *kl = keep ? "keepdim" : "";
        char l[64];
        snprintf(l, sizeof l, "dim 1 %s", kl);
        gc1(name, l, mkd(op, DL_DIMS(1), keep != 0), I(DL_SHAPE(3, 4), f));
        snprintf(l, sizeof l, "dim -1 %s", kl);
        gc1(name, l, mkd(op, DL_DIMS(-1), keep != 0), I(DL_SHAPE(2, 3, 4), f));
        snprintf(l, sizeof l, "dim 0 %s", kl);
        gc1(name, l, mkd(op, DL_DIMS(0), keep != 0), I(DL_SHAPE(3, 4), f));
        snprintf(l, sizeof l, "size-1 dim 1 %s", kl);
        gc1(name, l, mkd(op, DL_DIMS(1), keep != 0), I(DL_SHAPE(3, 1, 4), f));
        snprintf(l, sizeof l, "dims 0,2 %s", kl);
        gc1(name, l, mkd(op, DL_DIMS(0, 2), keep != 0), I(DL_SHAPE(2, 3, 4), f));
        snprintf(l, sizeof l, "dims -1,0 %s", kl);
        gc1(name, l, mkd(op, DL_DIMS(-1, 0), keep != 0), I(DL_SHAPE(3, 2, 4), f));
        snprintf(l, sizeof l, "dims 1,2 %s", kl);
        gc1(name, l, mkd(op, DL_DIMS(1, 2), keep != 0), I(DL_SHAPE(2, 3, 4), f));
        snprintf(l, sizeof l, "all %s", kl);
        gc1(name, l, mkd(op, DL_ALL, keep != 0), I(DL_SHAPE(2, 3, 4), f));
        snprintf(l, sizeof l, "all 1-d %s", kl);
        gc1(name, l, mkd(op, DL_ALL, keep != 0), I(DL_SHAPE(5), f));
    }
}

static void var_cases(void)
{
    int keep, corr;
    for (corr = 0; corr < 2; corr++)
        for (keep = 0; keep < 2; keep++) {
            char l[64];
            P p;
            snprintf(l, sizeof l, "dim 1 corr %d keep %d", corr, keep);
            p = mkd(OP_VAR, DL_DIMS(1), keep != 0); p.d0 = corr;
            gc1("dl_var", l, p, I(DL_SHAPE(3, 4), F_RANDN));
            snprintf(l, sizeof l, "dims 0,2 corr %d keep %d", corr, keep);
            p = mkd(OP_VAR, DL_DIMS(0, 2), keep != 0); p.d0 = corr;
            gc1("dl_var", l, p, I(DL_SHAPE(2, 3, 4), F_RANDN));
            snprintf(l, sizeof l, "all corr %d keep %d", corr, keep);
            p = mkd(OP_VAR, DL_ALL, keep != 0); p.d0 = corr;
            gc1("dl_var", l, p, I(DL_SHAPE(2, 3, 4), F_RANDN));
            snprintf(l, sizeof l, "dim -1 size-1 corr %d keep %d", corr, keep);
            p = mkd(OP_VAR, DL_DIMS(-1), keep != 0); p.d0 = corr;
            gc1("dl_var", l, p, I(DL_SHAPE(3, 1, 5), F_RANDN));
            snprintf(l, sizeof l, "std dim 1 corr %d keep %d", corr, keep);
            p = mkd(OP_STD, DL_DIMS(1), keep != 0); p.d0 = corr;
            gc1("dl_std", l, p, I(DL_SHAPE(3, 4), F_RANDN));
            snprintf(l, sizeof l, "std all corr %d keep %d", corr, keep);
            p = mkd(OP_STD, DL_ALL, keep != 0); p.d0 = corr;
            gc1("dl_std", l, p, I(DL_SHAPE(2, 3, 4), F_RANDN));
        }
}

static void matmul_cases(void)
{
    P p = mk(OP_MATMUL);
    gc2("dl_matmul", "1-d x 1-d (dot)", p, I(DL_SHAPE(4), F_RANDN), I(DL_SHAPE(4), F_RANDN));
    gc2("dl_matmul", "2-d x 1-d (mv)", p, I(DL_SHAPE(3, 4), F_RANDN), I(DL_SHAPE(4), F_RANDN));
    gc2("dl_matmul", "1-d x 2-d (vm)", p, I(DL_SHAPE(3), F_RANDN), I(DL_SHAPE(3, 5), F_RANDN));
    gc2("dl_matmul", "2-d x 2-d", p, I(DL_SHAPE(3, 4), F_RANDN), I(DL_SHAPE(4, 5), F_RANDN));
    gc2("dl_matmul", "2-d x 2-d 1-sized", p, I(DL_SHAPE(1, 4), F_RANDN), I(DL_SHAPE(4, 1), F_RANDN));
    gc2("dl_matmul", "batched", p, I(DL_SHAPE(2, 3, 4), F_RANDN), I(DL_SHAPE(2, 4, 5), F_RANDN));
    gc2("dl_matmul", "3-d x 2-d", p, I(DL_SHAPE(2, 3, 4), F_RANDN), I(DL_SHAPE(4, 5), F_RANDN));
    gc2("dl_matmul", "2-d x 3-d", p, I(DL_SHAPE(3, 4), F_RANDN), I(DL_SHAPE(2, 4, 5), F_RANDN));
    gc2("dl_matmul", "3-d x 1-d", p, I(DL_SHAPE(2, 3, 4), F_RANDN), I(DL_SHAPE(4), F_RANDN));
    gc2("dl_matmul", "1-d x 3-d", p, I(DL_SHAPE(3), F_RANDN), I(DL_SHAPE(2, 3, 5), F_RANDN));
    gc2("dl_matmul", "batch bcast", p, I(DL_SHAPE(2, 1, 3, 4), F_RANDN), I(DL_SHAPE(3, 4, 2), F_RANDN));
    gc2("dl_matmul", "batch bcast 1s", p, I(DL_SHAPE(1, 3, 2, 4), F_RANDN), I(DL_SHAPE(2, 1, 4, 3), F_RANDN));
    gc2("dl_matmul", "4-d x 1-d", p, I(DL_SHAPE(2, 2, 3, 4), F_RANDN), I(DL_SHAPE(4), F_RANDN));
}

static void shape_cases(void)
{
    int d;
    /* reshape */
    gc1("dl_reshape", "-> (6,4)", mks(OP_RESHAPE, DL_SHAPE(6, 4)), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_reshape", "-> (-1)", mks(OP_RESHAPE, DL_SHAPE(-1)), I(DL_SHAPE(2, 3), F_RANDN));
    gc1("dl_reshape", "-> (2,-1,3)", mks(OP_RESHAPE, DL_SHAPE(2, -1, 3)), I(DL_SHAPE(12), F_RANDN));
    gc1("dl_reshape", "-> ()", mks(OP_RESHAPE, S0()), I(DL_SHAPE(1, 1), F_RANDN));
    gc1("dl_reshape", "() -> (1,1,1)", mks(OP_RESHAPE, DL_SHAPE(1, 1, 1)), I(S0(), F_RANDN));
    /* flatten */
    gc1("dl_flatten", "0..-1", mki(OP_FLATTEN, 0, -1), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_flatten", "1..2", mki(OP_FLATTEN, 1, 2), I(DL_SHAPE(2, 3, 4, 2), F_RANDN));
    gc1("dl_flatten", "1..1", mki(OP_FLATTEN, 1, 1), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_flatten", "0-d", mki(OP_FLATTEN, 0, -1), I(S0(), F_RANDN));
    {
        P p = mks(OP_UNFLATTEN, DL_SHAPE(3, -1));
        p.d0 = 1;
        gc1("dl_unflatten", "dim 1 -> (3,-1)", p, I(DL_SHAPE(2, 12, 3), F_RANDN));
        p = mks(OP_UNFLATTEN, DL_SHAPE(2, 1, 2));
        p.d0 = -1;
        gc1("dl_unflatten", "dim -1 -> (2,1,2)", p, I(DL_SHAPE(3, 4), F_RANDN));
    }
    /* embedding: repeated indices, a 2-d index, squared */
    {
        P p = mks(OP_EMBED, DL_SHAPE(1, 3, 1, 0, 3, 3));
        gc1("dl_embedding", "idx (6)", p, I(DL_SHAPE(4, 3), F_RANDN));
        p.d1 = 1;
        gc1("dl_embedding", "squared", p, I(DL_SHAPE(4, 2), F_RANDN));
        /* (padding_idx: no gradient for that row by design, not its derivative;
           test_golden checks it against torch's) */
        p = mks(OP_EMBED, DL_SHAPE(0, 4, 4, 2, 0, 0));
        p.i0 = 1;
        p.d1 = 1;
        gc1("dl_embedding", "idx (2,3), squared", p, I(DL_SHAPE(5, 1), F_RANDN));
    }
    /* where (a broadcast condition and b; a second derivative through the
       products), masked_fill before a softmax, tril/triu, gather */
    {
        P p = mks(OP_WHERE, DL_SHAPE(3, 4));
        p.n = 2;
        gc2("dl_where", "products", p, I(DL_SHAPE(3, 4), F_RANDN), I(DL_SHAPE(4), F_RANDN));
        p.sh = DL_SHAPE(3, 1);
        gc2("dl_where", "cond (3,1)", p, I(DL_SHAPE(2, 3, 2), F_RANDN), I(DL_SHAPE(1, 2), F_RANDN));
        gc1("dl_masked_fill", "causal softmax", mks(OP_MFILL, DL_SHAPE(4, 4)), I(DL_SHAPE(2, 4, 4), F_RANDN));
        {   /* attention: q, k, v (and a float mask) */
            In at[4];
            at[0] = I(DL_SHAPE(2, 3, 4), F_RANDN);
            at[1] = I(DL_SHAPE(2, 5, 4), F_RANDN);
            at[2] = I(DL_SHAPE(2, 5, 3), F_RANDN);
            at[3] = I(DL_SHAPE(3, 5), F_RANDN);
            gcn("dl_scaled_dot_product_attention", "no mask", mki(OP_SDPA, 0, 0), 3, at, NULL);
            p = mki(OP_SDPA, 3, 0);
            p.s0 = 0.7f;
            gcn("dl_scaled_dot_product_attention", "causal, scale 0.7", p, 3, at, NULL);
            p = mki(OP_SDPA, 1, 0);
            p.sh = DL_SHAPE(3, 5);
            gcn("dl_scaled_dot_product_attention", "bool mask (3,5)", p, 3, at, NULL);
            gcn("dl_scaled_dot_product_attention", "float mask (3,5)", mki(OP_SDPA, 2, 0), 4, at, NULL);
            at[0] = I(DL_SHAPE(2, 1, 2, 3), F_RANDN);
            at[1] = I(DL_SHAPE(2, 3, 3), F_RANDN);
            at[2] = I(DL_SHAPE(3, 2), F_RANDN);
            gcn("dl_scaled_dot_product_attention", "batch dims broadcast", mki(OP_SDPA, 0, 0), 3, at, NULL);
        }
        p = mki(OP_GNORM, 2, 0);
        p.n = 3;
        gc3("dl_group_norm", "x (2,4,3), weight, bias", p, I(DL_SHAPE(2, 4, 3), F_RANDN), I(DL_SHAPE(4), F_RANDN),
            I(DL_SHAPE(4), F_RANDN));
        gc1("dl_upsample_nearest", "2-d, scale 2, squared", mki(OP_UPSAMPLE, 2, 0), I(DL_SHAPE(1, 2, 3, 2), F_RANDN));
        gc1("dl_upsample_nearest", "1-d, scale 3, squared", mki(OP_UPSAMPLE, 3, 0), I(DL_SHAPE(2, 1, 3), F_RANDN));
        p = mk(OP_TRIL);
        p.i0 = -1;
        gc1("dl_tril", "k -1", p, I(DL_SHAPE(2, 3, 4), F_RANDN));
        p = mk(OP_TRIU);
        p.i0 = 1;
        gc1("dl_triu", "k 1", p, I(DL_SHAPE(4, 3), F_RANDN));
        /* the index's dims (i1), then its values */
        p = mks(OP_GATHER, DL_SHAPE(4, 1, 2, 0, 2, 2));
        p.d0 = 1;
        p.i1 = 2;
        gc1("dl_gather", "dim 1, (4,1) repeats", p, I(DL_SHAPE(4, 3), F_RANDN));
        p = mks(OP_GATHER, DL_SHAPE(2, 3, 1, 0, 1, 2, 2, 1));
        p.d0 = 0;
        p.i1 = 2;
        gc1("dl_gather", "dim 0, smaller", p, I(DL_SHAPE(3, 4), F_RANDN));
        p.op = OP_SECOND_GATHER;
        gc1("grad of gather^3", "dim 0", p, I(DL_SHAPE(3, 4), F_RANDN));
    }
    /* torch.distributions.Categorical(logits=): log_prob, entropy, their second derivatives */
    gc1("dl_categorical_log_prob", "(5,4)", mk(OP_CAT_LOGP), I(DL_SHAPE(5, 4), F_RANDN));
    gc1("dl_categorical_log_prob", "(6) 0-d value", mk(OP_CAT_LOGP), I(DL_SHAPE(6), F_RANDN));
    gc1("dl_categorical_log_prob", "(2,3,5)", mk(OP_CAT_LOGP), I(DL_SHAPE(2, 3, 5), F_RANDN));
    gc1("dl_categorical_entropy", "(5,4)", mk(OP_CAT_ENT), I(DL_SHAPE(5, 4), F_RANDN));
    gc1("dl_categorical_entropy", "(6)", mk(OP_CAT_ENT), I(DL_SHAPE(6), F_RANDN));
    gc1("dl_categorical_entropy", "(2,3,5)", mk(OP_CAT_ENT), I(DL_SHAPE(2, 3, 5), F_RANDN));
    gc1("grad of entropy + log_prob^2", "(3,4)", mk(OP_SECOND_CAT), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("dl_categorical_log_prob", "(4,3) value (3,1) broadcast", mk(OP_CAT_BLOGP), I(DL_SHAPE(4, 3), F_RANDN));
    gc1("dl_categorical_probs_log_prob", "(5,4)", mk(OP_CAT_PLOGP), I(DL_SHAPE(5, 4), F_POS));
    gc1("dl_categorical_probs_log_prob", "(6) 0-d value", mk(OP_CAT_PLOGP), I(DL_SHAPE(6), F_POS));
    gc1("dl_categorical_probs_log_prob", "(4,3) value (3,1) broadcast", mki(OP_CAT_PLOGP, 1, 0),
        I(DL_SHAPE(4, 3), F_POS));
    gc1("dl_categorical_probs_entropy", "(5,4)", mk(OP_CAT_PENT), I(DL_SHAPE(5, 4), F_POS));
    gc1("dl_categorical_probs_entropy", "(2,3,5)", mk(OP_CAT_PENT), I(DL_SHAPE(2, 3, 5), F_POS));
    gc1("grad of probs entropy + log_prob^2", "(3,4)", mk(OP_SECOND_PCAT), I(DL_SHAPE(3, 4), F_POS));
    /* squeeze / unsqueeze */
    gc1("dl_squeeze", "dim 1", mki(OP_SQUEEZE, 1, 0), I(DL_SHAPE(2, 1, 3), F_RANDN));
    gc1("dl_squeeze", "dim 0", mki(OP_SQUEEZE, 0, 0), I(DL_SHAPE(1, 4), F_RANDN));
    gc1("dl_squeeze", "dim -1", mki(OP_SQUEEZE, -1, 0), I(DL_SHAPE(3, 1), F_RANDN));
    gc1("dl_squeeze", "not size 1 (no-op)", mki(OP_SQUEEZE, 0, 0), I(DL_SHAPE(2, 3), F_RANDN));
    gc1("dl_unsqueeze", "dim 0", mki(OP_UNSQUEEZE, 0, 0), I(DL_SHAPE(2, 3), F_RANDN));
    gc1("dl_unsqueeze", "dim 2", mki(OP_UNSQUEEZE, 2, 0), I(DL_SHAPE(2, 3), F_RANDN));
    gc1("dl_unsqueeze", "dim -1", mki(OP_UNSQUEEZE, -1, 0), I(DL_SHAPE(2, 3), F_RANDN));
    gc1("dl_unsqueeze", "0-d", mki(OP_UNSQUEEZE, 0, 0), I(S0(), F_RANDN));
    /* permute / transpose */
    gc1("dl_permute", "(2,0,1)", mks(OP_PERMUTE, DL_DIMS(2, 0, 1)), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_permute", "(1,0)", mks(OP_PERMUTE, DL_DIMS(1, 0)), I(DL_SHAPE(3, 5), F_RANDN));
    gc1("dl_permute", "(-1,0,-2)", mks(OP_PERMUTE, DL_DIMS(-1, 0, -2)), I(DL_SHAPE(2, 1, 4), F_RANDN));
    gc1("dl_permute", "(3,1,0,2)", mks(OP_PERMUTE, DL_DIMS(3, 1, 0, 2)), I(DL_SHAPE(2, 3, 1, 2), F_RANDN));
    gc1("dl_transpose", "0,1", mki(OP_TRANSPOSE, 0, 1), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("dl_transpose", "0,2", mki(OP_TRANSPOSE, 0, 2), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_transpose", "-1,-2", mki(OP_TRANSPOSE, -1, -2), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_transpose", "1,1 (identity)", mki(OP_TRANSPOSE, 1, 1), I(DL_SHAPE(2, 3), F_RANDN));
    /* narrow */
    {
        P p = mk(OP_NARROW);
        p.d0 = 0; p.i0 = 1; p.i1 = 2;
        gc1("dl_narrow", "dim 0 [1,3)", p, I(DL_SHAPE(4, 3), F_RANDN));
        p.d0 = -1; p.i0 = 0; p.i1 = 1;
        gc1("dl_narrow", "dim -1 [0,1)", p, I(DL_SHAPE(2, 3, 4), F_RANDN));
        p.d0 = 1; p.i0 = -2; p.i1 = 2;
        gc1("dl_narrow", "dim 1 start -2", p, I(DL_SHAPE(2, 5, 2), F_RANDN));
        p.d0 = 1; p.i0 = 0; p.i1 = 3;
        gc1("dl_narrow", "dim 1 whole", p, I(DL_SHAPE(2, 3), F_RANDN));
    }
    /* cat */
    gc3("dl_cat", "dim 0", mki(OP_CAT, 0, 0), I(DL_SHAPE(2, 3), F_RANDN), I(DL_SHAPE(4, 3), F_RANDN),
        I(DL_SHAPE(1, 3), F_RANDN));
    gc2("dl_cat", "dim 1", mki(OP_CAT, 1, 0), I(DL_SHAPE(2, 1), F_RANDN), I(DL_SHAPE(2, 3), F_RANDN));
    gc3("dl_cat", "dim -1 3-d", mki(OP_CAT, -1, 0), I(DL_SHAPE(2, 3, 2), F_RANDN),
        I(DL_SHAPE(2, 3, 1), F_RANDN), I(DL_SHAPE(2, 3, 3), F_RANDN));
    gc2("dl_cat", "dim 1 3-d", mki(OP_CAT, 1, 0), I(DL_SHAPE(2, 2, 3), F_RANDN), I(DL_SHAPE(2, 1, 3), F_RANDN));
    gc1("dl_cat", "one input", mki(OP_CAT, 0, 0), I(DL_SHAPE(3, 2), F_RANDN));
    gc3("dl_cat", "a (0,) input skipped", mki(OP_CAT, 1, 0), I(DL_SHAPE(2, 2), F_RANDN), I(DL_SHAPE(0), F_RANDN),
        I(DL_SHAPE(2, 3), F_RANDN));
    /* split / chunk / unbind: every form, pieces left out (zeros), second order */
    {
        static const struct { int form, dim; int64_t arg; int mask; } sc[] = {
            {0, 1, 2, 0x7}, {0, 0, 3, 0x5}, {1, -1, 0, 0xb}, {2, 1, 4, 0xd}, {2, 0, 4, 0x7}, {3, 0, 0, 0xb},
            {3, 1, 0, 0x7}};
        static const char *const lab[] = {"split size 2 dim 1", "split size 3 dim 0, piece 1 unused",
            "split_sizes (1,0,3,2) dim -1", "chunk 4 dim 1", "chunk 4 of 6: 3", "unbind dim 0", "unbind dim 1"};
        static const int64_t shp[][3] = {{3, 5, 2}, {7, 3, 0}, {2, 3, 6}, {4, 8, 0}, {6, 2, 0}, {4, 3, 0}, {2, 3, 4}};
        size_t k;
        for (k = 0; k < sizeof sc / sizeof sc[0]; k++) {
            P p = mki(OP_SPLIT, sc[k].dim, sc[k].form);
            dl_shape s = shp[k][2] ? DL_SHAPE(shp[k][0], shp[k][1], shp[k][2]) : DL_SHAPE(shp[k][0], shp[k][1]);
            p.i0 = sc[k].arg;
            p.i1 = sc[k].mask;
            if (sc[k].form == 1) p.sh = DL_DIMS(1, 0, 3, 2);
            gc1(sc[k].form == 3 ? "dl_unbind" : sc[k].form == 2 ? "dl_chunk" : sc[k].form == 1 ? "dl_split_sizes"
                : "dl_split", lab[k], p, I(s, F_RANDN));
            p.op = OP_SECOND_SPLIT;
            gc1(sc[k].form == 3 ? "dl_unbind" : sc[k].form == 2 ? "dl_chunk" : sc[k].form == 1 ? "dl_split_sizes"
                : "dl_split", "second order", p, I(s, F_RANDN));
        }
    }
    /* stack */
    for (d = -1; d <= 2; d++) {
        char l[32];
        snprintf(l, sizeof l, "dim %d", d);
        gc3("dl_stack", l, mki(OP_STACK, d, 0), I(DL_SHAPE(2, 3), F_RANDN), I(DL_SHAPE(2, 3), F_RANDN),
            I(DL_SHAPE(2, 3), F_RANDN));
    }
    gc2("dl_stack", "1-d dim 1", mki(OP_STACK, 1, 0), I(DL_SHAPE(4), F_RANDN), I(DL_SHAPE(4), F_RANDN));
    gc2("dl_stack", "0-d", mki(OP_STACK, 0, 0), I(S0(), F_RANDN), I(S0(), F_RANDN));
    /* expand */
    gc1("dl_expand", "-> (2,3,4)", mks(OP_EXPAND, DL_SHAPE(2, 3, 4)), I(DL_SHAPE(3, 1), F_RANDN));
    gc1("dl_expand", "-> (5)", mks(OP_EXPAND, DL_SHAPE(5)), I(DL_SHAPE(1), F_RANDN));
    gc1("dl_expand", "-> (-1,4,-1)", mks(OP_EXPAND, DL_SHAPE(-1, 4, -1)), I(DL_SHAPE(2, 1, 3), F_RANDN));
    gc1("dl_expand", "0-d -> (2,3)", mks(OP_EXPAND, DL_SHAPE(2, 3)), I(S0(), F_RANDN));
    gc1("dl_expand", "same shape", mks(OP_EXPAND, DL_SHAPE(2, 3)), I(DL_SHAPE(2, 3), F_RANDN));
    /* sum_to */
    gc1("dl_sum_to", "-> (3,1)", mks(OP_SUMTO, DL_SHAPE(3, 1)), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_sum_to", "-> (1,3)", mks(OP_SUMTO, DL_SHAPE(1, 3)), I(DL_SHAPE(2, 3), F_RANDN));
    gc1("dl_sum_to", "-> ()", mks(OP_SUMTO, S0()), I(DL_SHAPE(4, 5), F_RANDN));
    gc1("dl_sum_to", "-> (4)", mks(OP_SUMTO, DL_SHAPE(4)), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_sum_to", "same shape", mks(OP_SUMTO, DL_SHAPE(2, 3)), I(DL_SHAPE(2, 3), F_RANDN));
    /* copy */
    gc1("dl_copy", "", mk(OP_COPY), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("dl_copy", "0-d", mk(OP_COPY), I(S0(), F_RANDN));
    gc1("dl_copy", "size-1", mk(OP_COPY), I(DL_SHAPE(1, 3, 1), F_RANDN));
}

/* The custom sigmoid against dl_sigmoid: values, gradients, and second
   derivatives (its backward is written with dl ops, so create_graph works). */
static void custom_vs_builtin(void)
{
    dl_tensor *x, *w, *y1, *y2, *g1 = NULL, *g2 = NULL, *h1 = NULL, *h2 = NULL;
    dl_backward_desc bd;
    long where = -1;
    memset(&bd, 0, sizeof bd);
    bd.create_graph = true;
    dl_manual_seed(G, 77);
    x = dl_requires_grad(dl_mul_scalar(dl_randn(G, DL_SHAPE(3, 5)), 2.0f), true);
    w = dl_randn(G, DL_SHAPE(3, 5));
    y1 = dl_function_apply(&MY_SIGMOID, 1, &x, NULL);
    y2 = dl_sigmoid(x);
    CHECK(y1 && y2 && y1->requires_grad && dl_same_shape(y1, x), "custom sigmoid output: %s", dl_error_message(G));
    if (!y1 || !y2) return;
    CHECK(th_close(th_host(y1), th_host(y2), (long)x->numel, 1e-5, 1e-6, &where),
          "custom sigmoid value differs from dl_sigmoid at %ld", where);
    CHECK(dl_grad(dl_sum(dl_mul(y1, w), DL_ALL, false), 1, &x, &g1, &bd) == DL_OK && g1,
          "dl_grad through custom: %s", dl_error_message(G));
    CHECK(dl_grad(dl_sum(dl_mul(y2, w), DL_ALL, false), 1, &x, &g2, &bd) == DL_OK && g2,
          "dl_grad through dl_sigmoid: %s", dl_error_message(G));
    if (g1 && g2) {
        CHECK(th_close(th_host(g1), th_host(g2), (long)x->numel, 1e-5, 1e-6, &where),
              "custom sigmoid gradient differs from dl_sigmoid's at %ld", where);
        CHECK(g1->requires_grad && g2->requires_grad, "create_graph gradients carry history");
        CHECK(dl_grad(dl_sum(g1, DL_ALL, false), 1, &x, &h1, NULL) == DL_OK && h1,
              "second derivative through custom: %s", dl_error_message(G));
        CHECK(dl_grad(dl_sum(g2, DL_ALL, false), 1, &x, &h2, NULL) == DL_OK && h2,
              "second derivative through dl_sigmoid: %s", dl_error_message(G));
        if (h1 && h2)
            CHECK(th_close(th_host(h1), th_host(h2), (long)x->numel, 1e-4, 1e-6, &where),
                  "custom sigmoid second derivative differs from dl_sigmoid's at %ld", where);
    }
    /* ->grad through dl_backward too */
    {
        dl_tensor *xa = dl_requires_grad(dl_detach(x), true), *xb = dl_requires_grad(dl_copy(dl_detach(x)), true);
        dl_tensor *xs[1];
        xs[0] = xa;
        CHECK(dl_backward(dl_sum(dl_mul(dl_function_apply(&MY_SIGMOID, 1, xs, NULL), w), DL_ALL, false)) == DL_OK,
              "backward through custom: %s", dl_error_message(G));
        CHECK(dl_backward(dl_sum(dl_mul(dl_sigmoid(xb), w), DL_ALL, false)) == DL_OK,
              "backward through dl_sigmoid: %s", dl_error_message(G));
        CHECK(xa && xb && xa->grad && xb->grad &&
              th_close(th_host(xa->grad), th_host(xb->grad), (long)x->numel, 1e-5, 1e-6, &where),
              "custom vs dl_sigmoid ->grad differ at %ld", where);
    }
    dl_clear_error(G);
    dl_step_end(G);
}

/* g(x) = d/dx sum(tanh(x)^3) = 3 t^2 (1 - t^2); its derivative (Hessian
   diagonal) is (6 t - 12 t^3)(1 - t^2). Both against closed forms. */
static void second_order_closed_form(void)
{
    float xv[6] = {-1.3f, -0.7f, -0.2f, 0.3f, 0.9f, 1.6f}, vv[6] = {0.5f, -1.0f, 2.0f, 1.5f, -0.3f, 0.8f};
    float want_g[6], want_h[6];
    dl_tensor *x = dl_requires_grad(dl_from_array(G, DL_SHAPE(6), xv), true);
    dl_tensor *v = dl_from_array(G, DL_SHAPE(6), vv), *g = NULL, *h = NULL;
    dl_backward_desc bd;
    long where = -1;
    int i;
    memset(&bd, 0, sizeof bd);
    bd.create_graph = true;
    for (i = 0; i < 6; i++) {
        double t = tanh((double)xv[i]);
        want_g[i] = (float)(3 * t * t * (1 - t * t));
        want_h[i] = (float)((6 * t - 12 * t * t * t) * (1 - t * t) * vv[i]);
    }
    CHECK(dl_grad(dl_sum(dl_pow(dl_tanh(x), 3.0f), DL_ALL, false), 1, &x, &g, &bd) == DL_OK && g,
          "first-order grad: %s", dl_error_message(G));
    if (g) {
        CHECK(th_close(th_host(g), want_g, 6, 1e-4, 1e-5, &where), "d/dx sum(tanh^3) wrong at %ld", where);
        CHECK(dl_grad(dl_sum(dl_mul(g, v), DL_ALL, false), 1, &x, &h, NULL) == DL_OK && h,
              "second-order grad: %s", dl_error_message(G));
        if (h) CHECK(th_close(th_host(h), want_h, 6, 1e-3, 1e-5, &where), "Hessian-vector wrong at %ld", where);
    }
    dl_clear_error(G);
    dl_step_end(G);
}

int main(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    G = dl_ctx_init(&d);
    if (!G) { printf("no context\n0 passed, 1 failed\n"); return 1; }

    /* binary, broadcasting */
    binary_cases("dl_add", OP_ADD, F_RANDN, F_RANDN);
    binary_cases("dl_sub", OP_SUB, F_RANDN, F_RANDN);
    binary_cases("dl_mul", OP_MUL, F_RANDN, F_RANDN);
    binary_cases("dl_div", OP_DIV, F_RANDN, F_AWAY);
    binary_cases("dl_maximum", OP_MAXIMUM, F_DA, F_DB);
    binary_cases("dl_minimum", OP_MINIMUM, F_DA, F_DB);
    gc2("dl_maximum", "b first", mk(OP_MAXIMUM), I(DL_SHAPE(3, 1), F_DB), I(DL_SHAPE(2, 1, 4), F_DA));

    /* scalar ops */
    unary_cases("dl_add_scalar", mkf(OP_ADDS, 1.5f, 0), F_RANDN);
    unary_cases("dl_sub_scalar", mkf(OP_SUBS, -0.75f, 0), F_RANDN);
    unary_cases("dl_mul_scalar", mkf(OP_MULS, -2.5f, 0), F_RANDN);
    gc1("dl_mul_scalar", "s=1", mkf(OP_MULS, 1.0f, 0), I(DL_SHAPE(3), F_RANDN));
    unary_cases("dl_div_scalar", mkf(OP_DIVS, 0.4f, 0), F_RANDN);
    unary_cases("dl_rsub_scalar", mkf(OP_RSUBS, 3.0f, 0), F_RANDN);
    /* pow, positive bases */
    {
        static const float ex[] = {2.0f, 3.0f, 0.5f, -1.0f, 1.5f, -2.5f, 1.0f, 0.0f};
        size_t i;
        for (i = 0; i < sizeof ex / sizeof ex[0]; i++) {
            char l[32];
            snprintf(l, sizeof l, "p=%g", (double)ex[i]);
            gc1("dl_pow", l, mkf(OP_POW, ex[i], 0), I(DL_SHAPE(3, 4), F_POS));
        }
        gc1("dl_pow", "p=2 size-1", mkf(OP_POW, 2.0f, 0), I(DL_SHAPE(2, 1, 3), F_POS));
        gc1("dl_pow", "p=3 0-d", mkf(OP_POW, 3.0f, 0), I(S0(), F_POS));
        gc1("dl_pow", "p=2 signed", mkf(OP_POW, 2.0f, 0), I(DL_SHAPE(5), F_AWAY));
    }

    /* unary */
    unary_cases("dl_neg", mk(OP_NEG), F_RANDN);
    unary_cases("dl_exp", mk(OP_EXP), F_RANDN);
    unary_cases("dl_log", mk(OP_LOG), F_POS);
    unary_cases("dl_sqrt", mk(OP_SQRT), F_POS);
    unary_cases("dl_abs", mk(OP_ABS), F_DA);
    unary_cases("dl_erf", mk(OP_ERF), F_RANDN);
    unary_cases("dl_clamp", mkf(OP_CLAMP, -0.5f, 0.5f), F_DA);
    gc1("dl_clamp", "[-1,2]", mkf(OP_CLAMP, -1.0f, 2.0f), I(DL_SHAPE(4, 5), F_DB));
    gc1("dl_clamp", "lo=hi=0.3", mkf(OP_CLAMP, 0.3f, 0.3f), I(DL_SHAPE(2, 3), F_DA));
    unary_cases("dl_relu", mk(OP_RELU), F_DA);
    unary_cases("dl_leaky_relu", mkf(OP_LEAKY, 0.1f, 0), F_DA);
    gc1("dl_leaky_relu", "slope 0.3", mkf(OP_LEAKY, 0.3f, 0), I(DL_SHAPE(4, 3), F_DB));
    unary_cases("dl_sigmoid", mk(OP_SIGMOID), F_RANDN);
    unary_cases("dl_tanh", mk(OP_TANH), F_RANDN);
    unary_cases("dl_gelu", mk(OP_GELU), F_RANDN);
    unary_cases("dl_gelu_tanh", mk(OP_GELU_TANH), F_RANDN);
    unary_cases("dl_silu", mk(OP_SILU), F_RANDN);
    unary_cases("dl_softplus", mkf(OP_SOFTPLUS, 1.0f, 20.0f), F_RANDN);
    unary_cases("dl_softplus", mkf(OP_SOFTPLUS, 0.5f, 20.0f), F_RANDN);
    unary_cases("dl_logsigmoid", mk(OP_LOGSIGMOID), F_RANDN);
    unary_cases("dl_sin", mk(OP_SIN), F_RANDN);
    unary_cases("dl_cos", mk(OP_COS), F_RANDN);
    unary_cases("dl_log1p", mk(OP_LOG1P), F_POS);
    unary_cases("dl_expm1", mk(OP_EXPM1), F_RANDN);
    unary_cases("dl_rsqrt", mk(OP_RSQRT), F_POS);
    gc1("dl_log1p", "[-0.54, 0.66]", mk(OP_LOG1P), I(DL_SHAPE(7), F_DA));
    {   /* second order (create_graph through each rule's dl.h ops) */
        static const int un[5] = {OP_SIN, OP_COS, OP_LOG1P, OP_EXPM1, OP_RSQRT};
        static const char *unn[5] = {"grad of sin^2", "grad of cos^2", "grad of log1p^2", "grad of expm1^2",
                                     "grad of rsqrt^2"};
        int k;
        for (k = 0; k < 5; k++)
            gc1(unn[k], "", mki(OP_SECOND_UN, un[k], 0),
                I(DL_SHAPE(2, 3), un[k] == OP_LOG1P || un[k] == OP_RSQRT ? F_POS : F_RANDN));
    }

    /* reductions */
    reduce_cases("dl_sum", OP_SUM, F_RANDN);
    reduce_cases("dl_mean", OP_MEAN, F_RANDN);
    reduce_cases("dl_max", OP_MAX, F_DA);
    reduce_cases("dl_min", OP_MIN, F_DA);
    var_cases();
    reduce_cases("dl_logsumexp", OP_LSE, F_RANDN);
    gc1("dl_logsumexp", "0-d", mkd(OP_LSE, DL_ALL, false), I(S0(), F_RANDN));
    gc1("grad of a logsumexp", "dim 1", mk(OP_SECOND_LSE), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("dl_cumsum", "dim 1", mki(OP_CUMSUM, 1, 0), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("dl_cumsum", "dim 0", mki(OP_CUMSUM, 0, 0), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("dl_cumsum", "dim -2 of 3", mki(OP_CUMSUM, -2, 0), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_cumsum", "dim -1 of 3", mki(OP_CUMSUM, -1, 0), I(DL_SHAPE(2, 3, 4), F_RANDN));
    gc1("dl_cumsum", "size-1 dim", mki(OP_CUMSUM, 1, 0), I(DL_SHAPE(3, 1, 4), F_RANDN));
    gc1("dl_cumsum", "0-d", mki(OP_CUMSUM, 0, 0), I(S0(), F_RANDN));
    gc1("grad of a cumsum", "dim 1", mk(OP_SECOND_CUMSUM), I(DL_SHAPE(3, 4), F_RANDN));
    {   /* the 2-norm: its gradient at a zero row is 0 (a central difference
           there is 0 too: |eps| - |-eps|) */
        int keep;
        for (keep = 0; keep < 2; keep++) {
            const char *kl = keep ? "keep" : "";
            char l[64];
            snprintf(l, sizeof l, "dim 1 %s", kl);
            gc1("dl_norm", l, mkd(OP_NORM, DL_DIMS(1), keep != 0), I(DL_SHAPE(3, 4), F_RANDN));
            snprintf(l, sizeof l, "dim 1, a zero row %s", kl);
            gc1("dl_norm", l, mkd(OP_NORM, DL_DIMS(1), keep != 0), I(DL_SHAPE(3, 4), F_ZROW));
            snprintf(l, sizeof l, "dims 0,2 %s", kl);
            gc1("dl_norm", l, mkd(OP_NORM, DL_DIMS(0, 2), keep != 0), I(DL_SHAPE(2, 3, 4), F_RANDN));
            snprintf(l, sizeof l, "all %s", kl);
            gc1("dl_norm", l, mkd(OP_NORM, DL_ALL, keep != 0), I(DL_SHAPE(2, 3, 4), F_RANDN));
            snprintf(l, sizeof l, "dim -1 size-1 %s", kl);
            gc1("dl_norm", l, mkd(OP_NORM, DL_DIMS(-1), keep != 0), I(DL_SHAPE(3, 1, 5), F_RANDN));
        }
        gc1("dl_norm", "0-d", mkd(OP_NORM, DL_ALL, false), I(S0(), F_RANDN));
    }
    {   /* torch.max(x, dim) / torch.min(x, dim); 0-d tensors take dim 0 and -1, as PyTorch */
        P p = mki(OP_MAXDIM, 1, 0);
        gc1("dl_max_dim", "dim 1", p, I(DL_SHAPE(3, 4), F_DA));
        p = mki(OP_MINDIM, -1, 0);
        p.keep = true;
        gc1("dl_min_dim", "dim -1 keepdim", p, I(DL_SHAPE(2, 3, 4), F_DA));
        gc1("dl_max_dim", "0-d dim 0", mki(OP_MAXDIM, 0, 0), I(S0(), F_DA));
        gc1("dl_max", "0-d dim -1", mkd(OP_MAX, DL_DIMS(-1), false), I(S0(), F_DA));
        gc1("dl_sum", "0-d dim 0 keepdim", mkd(OP_SUM, DL_DIMS(0), true), I(S0(), F_RANDN));
        gc1("dl_softmax", "0-d", mki(OP_SOFTMAX, 0, 0), I(S0(), F_RANDN));
        gc1("dl_log_softmax", "0-d dim -1", mki(OP_LOGSOFTMAX, -1, 0), I(S0(), F_RANDN));
    }

    /* matmul */
    matmul_cases();

    /* softmax / log_softmax, each dim */
    {
        int dd;
        for (dd = -1; dd < 3; dd++) {
            char l[32];
            snprintf(l, sizeof l, "dim %d", dd);
            gc1("dl_softmax", l, mki(OP_SOFTMAX, dd, 0), I(DL_SHAPE(2, 3, 4), F_RANDN));
            gc1("dl_log_softmax", l, mki(OP_LOGSOFTMAX, dd, 0), I(DL_SHAPE(2, 3, 4), F_RANDN));
        }
        gc1("dl_softmax", "1-d", mki(OP_SOFTMAX, 0, 0), I(DL_SHAPE(6), F_RANDN));
        gc1("dl_log_softmax", "1-d", mki(OP_LOGSOFTMAX, 0, 0), I(DL_SHAPE(6), F_RANDN));
        gc1("dl_softmax", "size-1 dim", mki(OP_SOFTMAX, 1, 0), I(DL_SHAPE(3, 1), F_RANDN));
        gc1("dl_log_softmax", "size-1 dim", mki(OP_LOGSOFTMAX, 0, 0), I(DL_SHAPE(1, 4), F_RANDN));
    }

    /* shape ops */
    shape_cases();

    /* composite: a small MLP, every parameter checked */
    {
        In v[5];
        v[0] = I(DL_SHAPE(4, 3), F_RANDN);
        v[1] = I(DL_SHAPE(3, 5), F_RANDN);
        v[2] = I(DL_SHAPE(5), F_RANDN);
        v[3] = I(DL_SHAPE(5, 3), F_RANDN);
        v[4] = I(DL_SHAPE(3), F_RANDN);
        gcn("mlp", "x W1 b1 W2 b2", mk(OP_MLP), 5, v, NULL);
        v[0] = I(DL_SHAPE(1, 3), F_RANDN);
        gcn("mlp", "batch 1", mk(OP_MLP), 5, v, NULL);
    }

    /* custom function */
    gc1("custom sigmoid", "", mk(OP_CUSTOM), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("custom sigmoid", "0-d", mk(OP_CUSTOM), I(S0(), F_RANDN));
    gc1("custom sigmoid", "size-1", mk(OP_CUSTOM), I(DL_SHAPE(2, 1, 3), F_RANDN));
    custom_vs_builtin();
    {   /* the checker itself: a wrong gradient is caught */
        dl_gradcheck_result res;
        dl_tensor *x;
        dl_result rc;
        dl_manual_seed(G, 5);
        x = dl_requires_grad(dl_randn(G, DL_SHAPE(3, 4)), true);
        memset(&res, 0, sizeof res);
        rc = dl_gradcheck(G, f_bad, NULL, 1, &x, NULL, &res);
        printf("%-15s %-44s rel0 %.1e (must fail)\n", "bad sigmoid", "(3,4)", res.max_rel_err[0]);
        CHECK(rc == DL_OK && !res.ok && res.max_rel_err[0] > 0.1,
              "gradcheck did not catch a wrong backward: rc %s ok %d rel %g", dl_result_string(rc),
              (int)res.ok, res.max_rel_err[0]);
        dl_clear_error(G);
        dl_step_end(G);
    }
    {   /* tolerances: DL_ZERO is a real zero (central differences of a cube in float
           are off by ~1e-4 here, so zero tolerances fail what the defaults pass) */
        dl_gradcheck_desc gd;
        dl_gradcheck_result res;
        P p = mkf(OP_POW, 3.0f, 0);
        dl_tensor *x;
        dl_manual_seed(G, 6);
        x = dl_requires_grad(dl_randn(G, DL_SHAPE(3, 4)), true);
        memset(&gd, 0, sizeof gd);
        CHECK(dl_gradcheck(G, f_op, &p, 1, &x, &gd, &res) == DL_OK && res.ok, "x^3, default tolerances");
        gd.atol = DL_ZERO;
        gd.rtol = DL_ZERO;
        CHECK(dl_gradcheck(G, f_op, &p, 1, &x, &gd, &res) == DL_OK && !res.ok && res.max_abs_err[0] > 0,
              "x^3, atol = rtol = DL_ZERO: must fail (abs err %g)", res.max_abs_err[0]);
        gd.atol = 1.0;
        CHECK(dl_gradcheck(G, f_op, &p, 1, &x, &gd, &res) == DL_OK && res.ok, "x^3, atol 1, rtol DL_ZERO");
        dl_step_end(G);
    }

    /* second order: the checked function returns a gradient (create_graph) */
    gc1("grad tanh^3", "", mk(OP_SECOND), I(DL_SHAPE(5), F_RANDN));
    gc1("grad tanh^3", "2-d", mk(OP_SECOND), I(DL_SHAPE(2, 3), F_RANDN));
    gc1("grad tanh^3", "0-d", mk(OP_SECOND), I(S0(), F_RANDN));
    gc1("grad of a norm penalty", "", mk(OP_SECOND_NORM), I(DL_SHAPE(3, 4), F_RANDN));
    gc1("grad of embedding^3", "padding_idx 1", mk(OP_SECOND_EMBED), I(DL_SHAPE(4, 3), F_RANDN));
    /* (at a zero row the norm's first gradient is 0 by convention but not
       differentiable: test_golden checks it against torch's, NaN-free) */
    second_order_closed_form();

    printf("%d gradcheck cases\n", ncases);
    CHECK(dl_last_error(G) == DL_OK, "stray error at the end: %s", dl_error_message(G));
    dl_ctx_free(G);
    TEST_END();
}
