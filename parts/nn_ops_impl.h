/* parts/nn_ops_impl.h - normalization, dropout and losses (implementation).
   Appended to dl.h's implementation section. */
#if defined(DL_IMPLEMENTATION) && !defined(DL__NN_OPS_IMPLEMENTED)
#define DL__NN_OPS_IMPLEMENTED

// >>section ops: normalization, dropout, losses
/* Everything here but binary_cross_entropy_with_logits is a composite of
   differentiable dl.h ops, so gradients (and gradients of gradients) come
   from their rules. The non-differentiable pieces (class one-hot masks from
   integer targets, dropout masks) come from a small kernel table of their
   own, dispatched per device like dl__K, so a GPU backend can supply them. */

typedef struct dl__nn_kernels {
    const char *name;
    /* Class-index targets (outer*inner of them, int64 if i64 else int32) ->
       onehot (outer, C, inner): 1 at [o, target, i], 0 elsewhere and for
       ignored targets; valid (outer*inner): 1, or 0 where ignored. Returns
       -1, or the first flat index of a target outside [0,C) that is not
       ignore_index (its value in *bad); then the masks are undefined. */
    int64_t (*class_mask)(dl_ctx *c, float *onehot, float *valid, const void *target, bool i64,
                          int64_t outer, int64_t C, int64_t inner, int64_t ignore_index,
                          int64_t *bad);
    /* mask[i] = scale, or 0 with probability p; a counter-based hash of
       (seed, i), so any split of the work gives the same mask */
    void (*dropout_mask)(dl_ctx *c, float *mask, int64_t n, float p, float scale, uint64_t seed);
    /* out[i] = max(x,0) - x*y + log1p(exp(-|x|)) */
    void (*bce_logits)(dl_ctx *c, float *out, const float *x, const float *y, int64_t n);
} dl__nn_kernels;

static int64_t dl__nn_cpu_class_mask(dl_ctx *c, float *onehot, float *valid, const void *target,
                                     bool i64, int64_t outer, int64_t C, int64_t inner,
                                     int64_t ignore_index, int64_t *bad)
{
    int64_t o, i;
    (void)c;
    if (outer * C * inner) memset(onehot, 0, sizeof(float) * (size_t)(outer * C * inner));
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            int64_t j = o * inner + i;
            int64_t t = i64 ? ((const int64_t *)target)[j] : (int64_t)((const int32_t *)target)[j];
            if (t == ignore_index) { valid[j] = 0.0f; continue; }
            if (t < 0 || t >= C) { *bad = t; return j; }
            valid[j] = 1.0f;
            onehot[(o * C + t) * inner + i] = 1.0f;
        }
    return -1;
}

static uint64_t dl__nn_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct dl__nn_drop_args { float *mask; float p, scale; uint64_t seed; } dl__nn_drop_args;

static void dl__nn_drop_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__nn_drop_args *u = (const dl__nn_drop_args *)arg;
    int64_t i;
    for (i = lo; i < hi; i++) {
        float r = (float)(dl__nn_mix(u->seed ^ dl__nn_mix((uint64_t)i)) >> 40) * (1.0f / 16777216.0f);
        u->mask[i] = r < u->p ? 0.0f : u->scale;
    }
}

static void dl__nn_cpu_dropout_mask(dl_ctx *c, float *mask, int64_t n, float p, float scale,
                                    uint64_t seed)
{
    dl__nn_drop_args u;
    u.mask = mask; u.p = p; u.scale = scale; u.seed = seed;
    dl__parallel_for(c->pool, n, 1 << 15, dl__nn_drop_task, &u);
}

typedef struct dl__nn_bce_args { float *out; const float *x, *y; } dl__nn_bce_args;

static void dl__nn_bce_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__nn_bce_args *u = (const dl__nn_bce_args *)arg;
    int64_t i;
    for (i = lo; i < hi; i++) {
        float x = u->x[i];
        u->out[i] = (x > 0 ? x : 0.0f) - x * u->y[i] + log1pf(expf(-fabsf(x)));
    }
}

static void dl__nn_cpu_bce_logits(dl_ctx *c, float *out, const float *x, const float *y, int64_t n)
{
    dl__nn_bce_args u;
    u.out = out; u.x = x; u.y = y;
    dl__parallel_for(c->pool, n, 1 << 15, dl__nn_bce_task, &u);
}

static const dl__nn_kernels dl__nn_cpu_kernels = {
    "cpu", dl__nn_cpu_class_mask, dl__nn_cpu_dropout_mask, dl__nn_cpu_bce_logits
};

static const dl__nn_kernels *dl__nnK(const dl_tensor *t)
{
    (void)t;   /* a CUDA build routes device tensors to its own table here */
    return &dl__nn_cpu_kernels;
}

/* ---------------------------------------------------------------- helpers */

/* An optional per-channel / per-feature tensor: live, same context and
   device as x, float32, shape exactly `want`. */
static bool dl__nn_param(const char *op, const char *arg, const dl_tensor *t, const dl_tensor *x,
                         const dl_shape *want, const char *rule)
{
    dl_shape s;
    if (!dl__live(op, arg, t) || !dl__pair(op, x, t) || !dl__f32(op, arg, t)) return false;
    s = dl__shape_of(t);
    if (s.ndim != want->ndim ||
        (s.ndim && memcmp(s.d, want->d, sizeof(int64_t) * (size_t)s.ndim) != 0)) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: %s %s must have shape %s (%s of x %s)", op, arg,
                dl__sh(t), dl__shp(x->ctx_, want), rule, dl__sh(x));
        return false;
    }
    return true;
}

static bool dl__nn_reduction_ok(const char *op, dl_ctx *ctx, dl_reduction r)
{
    if ((int)r == DL_REDUCTION_MEAN || (int)r == DL_REDUCTION_SUM || (int)r == DL_REDUCTION_NONE)
        return true;
    dl__err(ctx, DL_ERR_ARG, "%s: reduction %d is not one of DL_REDUCTION_MEAN (0), "
            "DL_REDUCTION_SUM (1), DL_REDUCTION_NONE (2)", op, (int)r);
    return false;
}

static dl_tensor *dl__nn_reduce(dl_tensor *t, dl_reduction r)
{
    if (r == DL_REDUCTION_NONE) return t;
    if (r == DL_REDUCTION_SUM) return dl_sum(t, DL_ALL, false);
    return dl_mean(t, DL_ALL, false);
}

/* (x - mean) / sqrt(var + eps) over dims (biased variance); mean and var
   (keepdim) are returned through the pointers when asked. */
static dl_tensor *dl__nn_normalize(dl_tensor *x, dl_shape dims, float eps, dl_tensor **pmean,
                                   dl_tensor **pvar)
{
    dl_tensor *mean = dl_mean(x, dims, true);
    dl_tensor *d = dl_sub(x, mean);
    dl_tensor *var = dl_mean(dl_mul(d, d), dims, true);
    if (pmean) *pmean = mean;
    if (pvar) *pvar = var;
    return dl_div(d, dl_sqrt(dl_add_scalar(var, eps)));
}

/* t (C) viewed as (1,C,1,...) to broadcast against an nd-dim x */
static dl_tensor *dl__nn_chan(dl_tensor *t, int nd)
{
    int64_t s[DL_MAX_DIMS];
    int i;
    if (!t) return NULL;
    for (i = 0; i < nd; i++) s[i] = 1;
    s[1] = t->shape[0];
    return dl_reshape(t, dl_shape_make(nd, s));
}

/* ---------------------------------------------------------- normalization */

dl_tensor *dl_batch_norm(dl_tensor *x, dl_tensor *running_mean, dl_tensor *running_var,
                         dl_tensor *weight, dl_tensor *bias, bool training, float momentum,
                         float eps)
{
    static const char *op = "dl_batch_norm";
    dl_ctx *ctx;
    dl_shape cs, dims;
    dl_tensor *y, *mean = NULL, *var = NULL;
    int64_t C, cnt;
    int i;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    ctx = x->ctx_;
    if (x->ndim < 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: x %s needs at least 2 dims, (N,C) or (N,C,d1,...)", op,
                dl__sh(x));
        return NULL;
    }
    C = x->shape[1];
    cs = dl__dims1(C);
    if ((running_mean == NULL) != (running_var == NULL)) {
        dl__err(ctx, DL_ERR_ARG, "%s: give both running_mean and running_var, or neither "
                "(running_%s is NULL)", op, running_mean ? "var" : "mean");
        return NULL;
    }
    if (!training && !running_mean) {
        dl__err(ctx, DL_ERR_ARG, "%s: eval mode (training false) normalizes with running_mean and "
                "running_var, which are NULL", op);
        return NULL;
    }
    if (running_mean && (!dl__nn_param(op, "running_mean", running_mean, x, &cs, "one value per channel, dim 1") ||
                         !dl__nn_param(op, "running_var", running_var, x, &cs, "one value per channel, dim 1")))
        return NULL;
    if (weight && !dl__nn_param(op, "weight", weight, x, &cs, "one value per channel, dim 1")) return NULL;
    if (bias && !dl__nn_param(op, "bias", bias, x, &cs, "one value per channel, dim 1")) return NULL;
    if (!(eps >= 0.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: eps=%g must be >= 0", op, (double)eps);
        return NULL;
    }
    cnt = C ? x->numel / C : 0;
    if (training) {
        if (running_mean && (running_mean->requires_grad || running_var->requires_grad)) {
            dl__err(ctx, DL_ERR_ARG, "%s: running_mean/running_var are updated in place in "
                    "training mode and must not require grad", op);
            return NULL;
        }
        if (cnt <= 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: training needs more than 1 value per channel; x %s "
                    "has %lld (use eval mode, or a larger batch)", op, dl__sh(x), (long long)cnt);
            return NULL;
        }
        dims = dl_shape_make(x->ndim - 1, NULL);
        for (i = 2; i < x->ndim; i++) dims.d[i - 1] = i;
        y = dl__nn_normalize(x, dims, eps, &mean, &var);
    } else {
        y = dl_div(dl_sub(x, dl__nn_chan(running_mean, x->ndim)),
                   dl_sqrt(dl_add_scalar(dl__nn_chan(running_var, x->ndim), eps)));
    }
    if (weight) y = dl_mul(y, dl__nn_chan(weight, x->ndim));
    if (bias) y = dl_add(y, dl__nn_chan(bias, x->ndim));
    if (!y) return NULL;
    if (training && running_mean && C) {
        /* r = (1-m) r + m stat, in place, no history; var unbiased: * n/(n-1) */
        const dl__kernels *k = dl__K(x);
        float *rm = (float *)running_mean->data, *rv = (float *)running_var->data;
        k->unary(ctx, DL__U_AFFINE, rm, rm, C, 1.0f - momentum, 0.0f);
        k->axpy(ctx, rm, (const float *)mean->data, C, momentum);
        k->unary(ctx, DL__U_AFFINE, rv, rv, C, 1.0f - momentum, 0.0f);
        k->axpy(ctx, rv, (const float *)var->data, C,
                (float)((double)momentum * (double)cnt / (double)(cnt - 1)));
    }
    return y;
}

dl_tensor *dl_layer_norm(dl_tensor *x, dl_shape normalized_shape, dl_tensor *weight,
                         dl_tensor *bias, float eps)
{
    static const char *op = "dl_layer_norm";
    dl_ctx *ctx;
    dl_shape dims;
    dl_tensor *y;
    int i, k = normalized_shape.ndim;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    ctx = x->ctx_;
    if (k < 1 || k > x->ndim) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: normalized_shape %s must have 1..%d dims (the last dims "
                "of x %s)", op, dl__shp(ctx, &normalized_shape), x->ndim, dl__sh(x));
        return NULL;
    }
    for (i = 0; i < k; i++)
        if (normalized_shape.d[i] != x->shape[x->ndim - k + i]) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: normalized_shape %s must equal the last %d dims of "
                    "x %s", op, dl__shp(ctx, &normalized_shape), k, dl__sh(x));
            return NULL;
        }
    if (weight && !dl__nn_param(op, "weight", weight, x, &normalized_shape, "normalized_shape, the last dims")) return NULL;
    if (bias && !dl__nn_param(op, "bias", bias, x, &normalized_shape, "normalized_shape, the last dims")) return NULL;
    if (!(eps >= 0.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: eps=%g must be >= 0", op, (double)eps);
        return NULL;
    }
    dims = dl_shape_make(k, NULL);
    for (i = 0; i < k; i++) dims.d[i] = x->ndim - k + i;
    y = dl__nn_normalize(x, dims, eps, NULL, NULL);
    if (weight) y = dl_mul(y, weight);
    if (bias) y = dl_add(y, bias);
    return y;
}

dl_tensor *dl_dropout(dl_tensor *x, float p, bool training)
{
    static const char *op = "dl_dropout";
    dl_tensor *mask;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    if (!(p >= 0.0f && p <= 1.0f)) {
        dl__err(x->ctx_, DL_ERR_ARG, "%s: p=%g must be in [0, 1] (the probability of zeroing)",
                op, (double)p);
        return NULL;
    }
    if (!training || p == 0.0f) return x;
    mask = dl__like(op, x);
    if (!mask) return NULL;
    if (p == 1.0f) dl__K(x)->fill(x->ctx_, (float *)mask->data, x->numel, 0.0f);
    else
        dl__nnK(x)->dropout_mask(x->ctx_, (float *)mask->data, x->numel, p,
                                 (float)(1.0 / (1.0 - (double)p)), dl__rng_next(x->ctx_->rng));
    return dl_mul(x, mask);
}

/* ----------------------------------------------------------------- losses */

dl_loss_desc dl_loss_desc_default(void)
{
    dl_loss_desc d;
    memset(&d, 0, sizeof d);
    d.reduction = DL_REDUCTION_MEAN;
    d.ignore_index = -100;
    d.label_smoothing = 0.0f;
    d.weight = NULL;
    return d;
}

/* nll of log-probabilities lp (N,C,*) (or (C)) with optional label smoothing:
   onehot/valid masks from the targets (no history), then
     nll_i    = -sum_c onehot w_c lp          (w_c = 1 without weights)
     smooth_i = -valid_i sum_c w_c lp
     mean: sum(.) / sum(onehot w)             sum: sum(.)    none: per sample
     loss = (1-e) nll + e/C smooth. */
static dl_tensor *dl__nn_class_loss(const char *op, dl_tensor *lp, dl_tensor *target,
                                    const dl_loss_desc *d, bool smoothing_allowed)
{
    dl_ctx *ctx = lp->ctx_;
    dl_tensor *onehot, *valid, *w = NULL, *ow, *nll, *den = NULL, *loss;
    int64_t C, outer, inner, bad_i, bad_v = 0;
    float e = d->label_smoothing;
    int i;
    bool scalar = false;
    if (!dl__live(op, "target", target) || !dl__pair(op, lp, target)) return NULL;
    if (!dl__nn_reduction_ok(op, ctx, d->reduction)) return NULL;
    if (target->dtype != DL_DTYPE_I64 && target->dtype != DL_DTYPE_I32) {
        dl__err(ctx, DL_ERR_DTYPE, "%s: target %s has dtype %s; class-index targets must be int64 "
                "or int32 (probability targets are not supported)", op, dl__sh(target),
                dl__dtype_str(target->dtype));
        return NULL;
    }
    if (!smoothing_allowed && e != 0.0f) {
        dl__err(ctx, DL_ERR_ARG, "%s: label_smoothing=%g: only dl_cross_entropy_ex smooths labels; "
                "set it to 0", op, (double)e);
        return NULL;
    }
    if (!(e >= 0.0f && e <= 1.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: label_smoothing=%g must be in [0, 1]", op, (double)e);
        return NULL;
    }
    if (lp->ndim == 1 && target->ndim == 0) {   /* one sample: (C) and a 0-d target */
        scalar = true;
        lp = dl_unsqueeze(lp, 0);
        target = dl_unsqueeze(target, 0);
        if (!lp || !target) return NULL;
    }
    if (lp->ndim < 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: input %s must be (N,C) or (N,C,d1,...) (or (C) with a "
                "0-d target)", op, dl__sh(lp));
        return NULL;
    }
    {
        bool ok = target->ndim == lp->ndim - 1 && target->shape[0] == lp->shape[0];
        for (i = 1; ok && i < target->ndim; i++) ok = target->shape[i] == lp->shape[i + 1];
        if (!ok) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: target %s must be the input %s without its class dim 1 "
                    "((N,C,d1,...) -> (N,d1,...))", op, dl__sh(target), dl__sh(lp));
            return NULL;
        }
    }
    C = lp->shape[1];
    outer = lp->shape[0];
    inner = dl__prod(lp->shape + 2, lp->ndim - 2);
    if (d->weight) {
        dl_shape cs = dl__dims1(C);
        if (!dl__nn_param(op, "weight", d->weight, lp, &cs, "one weight per class, dim 1")) return NULL;
        w = dl__nn_chan(d->weight, lp->ndim);
        if (!w) return NULL;
    }
    onehot = dl__like(op, lp);
    valid = dl__make(ctx, op, DL_DTYPE_F32, target->ndim, target->shape, false, NULL);
    if (!onehot || !valid) return NULL;
    valid->device = lp->device;
    bad_i = dl__nnK(lp)->class_mask(ctx, (float *)onehot->data, (float *)valid->data, target->data,
                                    target->dtype == DL_DTYPE_I64, outer, C, inner,
                                    d->ignore_index, &bad_v);
    if (bad_i >= 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: target %s holds %lld at flat index %lld: class indices must "
                "be in [0, %lld) (C = %lld, dim 1 of the input %s) or equal ignore_index %lld", op,
                dl__sh(target), (long long)bad_v, (long long)bad_i, (long long)C, (long long)C,
                dl__sh(lp), (long long)d->ignore_index);
        return NULL;
    }
    ow = w ? dl_mul(onehot, w) : onehot;
    nll = dl_neg(dl_sum(dl_mul(ow, lp), dl__dims1(1), false));
    if (d->reduction == DL_REDUCTION_MEAN) den = dl_sum(ow, DL_ALL, false);
    if (d->reduction == DL_REDUCTION_MEAN) loss = dl_div(dl_sum(nll, DL_ALL, false), den);
    else loss = dl__nn_reduce(nll, d->reduction);
    if (e > 0.0f) {
        dl_tensor *sm = dl_mul(dl_neg(dl_sum(w ? dl_mul(lp, w) : lp, dl__dims1(1), false)), valid);
        if (d->reduction == DL_REDUCTION_MEAN) sm = dl_div(dl_sum(sm, DL_ALL, false), den);
        else sm = dl__nn_reduce(sm, d->reduction);
        loss = dl_add(dl_mul_scalar(loss, 1.0f - e), dl_mul_scalar(sm, e / (float)C));
    }
    if (scalar && loss && d->reduction == DL_REDUCTION_NONE) loss = dl_squeeze(loss, 0);
    return loss;
}

dl_tensor *dl_nll_loss(dl_tensor *log_probs, dl_tensor *target, const dl_loss_desc *d)
{
    dl_loss_desc def = dl_loss_desc_default();
    if (!log_probs || !target) return NULL;
    if (!dl__live("dl_nll_loss", "log_probs", log_probs) || !dl__f32("dl_nll_loss", "log_probs", log_probs))
        return NULL;
    return dl__nn_class_loss("dl_nll_loss", log_probs, target, d ? d : &def, false);
}

dl_tensor *dl_cross_entropy_ex(dl_tensor *logits, dl_tensor *target, const dl_loss_desc *d)
{
    static const char *op = "dl_cross_entropy";
    dl_loss_desc def = dl_loss_desc_default();
    dl_tensor *lp;
    if (!logits || !target) return NULL;
    if (!dl__live(op, "logits", logits) || !dl__f32(op, "logits", logits)) return NULL;
    if (!dl__live(op, "target", target)) return NULL;
    if (logits->ndim == 0) {
        dl__err(logits->ctx_, DL_ERR_SHAPE, "%s: logits %s must be (N,C) or (N,C,d1,...)", op,
                dl__sh(logits));
        return NULL;
    }
    lp = dl_log_softmax(logits, logits->ndim == 1 ? 0 : 1);
    if (!lp) return NULL;
    return dl__nn_class_loss(op, lp, target, d ? d : &def, true);
}

dl_tensor *dl_cross_entropy(dl_tensor *logits, dl_tensor *target)
{
    return dl_cross_entropy_ex(logits, target, NULL);
}

/* a and b: same shape, float32, same context and device */
static bool dl__nn_same(const char *op, dl_tensor *a, dl_tensor *b, dl_reduction r)
{
    if (!dl__live(op, "a", a) || !dl__live(op, "b", b)) return false;
    if (!dl__pair(op, a, b) || !dl__f32(op, "a", a) || !dl__f32(op, "b", b)) return false;
    if (!dl__nn_reduction_ok(op, a->ctx_, r)) return false;
    if (!dl_same_shape(a, b)) {
        dl__err(a->ctx_, DL_ERR_SHAPE, "%s: a %s and b %s must have the same shape (dl.h does not "
                "broadcast loss operands)", op, dl__sh(a), dl__sh(b));
        return false;
    }
    return true;
}

dl_tensor *dl_mse_loss(dl_tensor *a, dl_tensor *b, dl_reduction r)
{
    dl_tensor *d;
    if (!a || !b || !dl__nn_same("dl_mse_loss", a, b, r)) return NULL;
    d = dl_sub(a, b);
    return dl__nn_reduce(dl_mul(d, d), r);
}

dl_tensor *dl_l1_loss(dl_tensor *a, dl_tensor *b, dl_reduction r)
{
    if (!a || !b || !dl__nn_same("dl_l1_loss", a, b, r)) return NULL;
    return dl__nn_reduce(dl_abs(dl_sub(a, b)), r);
}

/* l = max(x,0) - x y + log(1 + exp(-|x|));  dx = g (sigmoid(x) - y), dy = -g x */
static dl_result dl__nn_bce_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl_mul(g, dl_sub(dl_sigmoid(n->in[0]), n->in[1]));
    if (dl__need(n, 1)) gin[1] = dl_neg(dl_mul(g, n->in[0]));
    return DL_OK;
}
static const dl__op dl__op_nn_bce = {"dl_binary_cross_entropy_with_logits", dl__nn_bce_bwd};

dl_tensor *dl_binary_cross_entropy_with_logits(dl_tensor *x, dl_tensor *y, dl_reduction r)
{
    static const char *op = "dl_binary_cross_entropy_with_logits";
    dl_tensor *l, *in[2];
    dl__node *n;
    if (!x || !y || !dl__nn_same(op, x, y, r)) return NULL;
    l = dl__like(op, x);
    if (!l) return NULL;
    dl__nnK(x)->bce_logits(x->ctx_, (float *)l->data, (const float *)x->data,
                           (const float *)y->data, x->numel);
    in[0] = x;
    in[1] = y;
    if (dl__record(l, &dl__op_nn_bce, 2, in, &n) < 0) return NULL;
    l = dl__done(l, op);
    return l ? dl__nn_reduce(l, r) : NULL;
}

#endif /* DL_IMPLEMENTATION && !DL__NN_OPS_IMPLEMENTED */
