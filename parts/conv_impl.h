/* parts/conv_impl.h - convolution, transposed convolution and pooling:
   implementation (appended to dl.h's implementation; needs parts/conv_decl.h).

   Everything here is N-d (1, 2 or 3 spatial dims, missing dims padded with
   size 1); the 1d/2d/3d functions are thin wrappers.

   Convolution is im2col + GEMM, group by group. Three internal ops cover
   every product, with "a" the conv input side (N,Ca,ia...), "b" the conv
   output side (N,Cb,ib...) and w (Cb, Ca/G, k...):
       conv      b = conv(a, w)            im2col(a), w_g (Cbg,CagK) @ col_g
       convT     a = conv_transpose(b, w)  col_g = w_g^T @ b_g, col2im -> a
       convW     w = weight_grad(a, b)     sum_n b_g[n] @ col_g[n]^T
   They are each other's adjoints, so each backward is written with the
   other two (and create_graph gives gradients of any order):
       conv:   da = convT(g, w), dw = convW(a, g), dbias = sum(g, N and space)
       convT:  db = conv(g, w),  dw = convW(g, b), dbias = sum(g)
       convW:  da = convT(b, g), db = conv(a, g)
   Max pooling saves the arg-max of each window (int64, within the plane) and
   scatters the gradient there ("unpool"), whose backward gathers. Average
   pooling (fixed or adaptive windows) is linear: its backward is its
   adjoint, an op whose backward is the pooling again.

   Kernels (im2col, col2im, bias, pools) live in dl__conv_cpu_kernels, a
   table of raw-pointer functions like dl__kernels; dl__KC() picks the table
   for a tensor's device. Scratch (the im2col matrix) is step memory given
   back before the op returns; big batches are processed in chunks so the
   scratch stays under 32 MiB. */
#if defined(DL_IMPLEMENTATION) && !defined(DL__CONV_IMPLEMENTED)
#define DL__CONV_IMPLEMENTED

// >>section ops: convolution and pooling

/* Geometry of one convolution, padded to 3 spatial dims (size 1, kernel 1,
   stride 1, no padding, dilation 1 in the dims a 1-d/2-d conv lacks). */
typedef struct dl__cgeom {
    int nsp;
    int64_t N, Ca, Cb, G;
    int64_t ia[3], ib[3], k[3], s[3], p[3], d[3];  /* p: left padding */
    int64_t La, Lb, K;                             /* products of ia, ib, k */
} dl__cgeom;

/* Geometry of one pooling: input ia, output ob, per-dim windows. */
typedef struct dl__pgeom {
    int64_t ia[3], ob[3], k[3], s[3], p[3], d[3];
    int64_t La, Lb;
    bool adaptive, count_include_pad;
} dl__pgeom;

typedef struct dl__conv_kernels {
    const char *name;
    /* col (Ca*K, n, Lb) <- patches of x (n, Ca, ia...): row (c,k) of sample j at
       col + ((c*K + k)*n + j)*Lb, so one GEMM covers the n samples */
    void (*im2col)(dl_ctx *c, float *col, const float *x, int64_t n, const dl__cgeom *g);
    /* x (n, Ca, ia...) = sum of col (Ca*K, n, Lb) over the patches (x overwritten) */
    void (*col2im)(dl_ctx *c, float *x, const float *col, int64_t n, const dl__cgeom *g);
    /* y (n, C, L) += b (C) */
    void (*bias_add)(dl_ctx *c, float *y, const float *b, int64_t n, int64_t C, int64_t L);
    /* y (planes, ob...) = window max of x (planes, ia...); idx (or NULL) = arg-max in plane */
    void (*max_pool)(dl_ctx *c, float *y, int64_t *idx, const float *x, int64_t planes,
                     const dl__pgeom *g);
    /* dx (planes, Lin) = 0, then dx[idx] += g (planes, Lout) */
    void (*unpool)(dl_ctx *c, float *dx, const float *g, const int64_t *idx, int64_t planes,
                   int64_t Lin, int64_t Lout);
    /* y (planes, Lout) = x (planes, Lin)[idx]  (0 where idx < 0) */
    void (*gather)(dl_ctx *c, float *y, const float *x, const int64_t *idx, int64_t planes,
                   int64_t Lin, int64_t Lout);
    /* y (planes, ob...) = window mean of x (planes, ia...) */
    void (*avg_pool)(dl_ctx *c, float *y, const float *x, int64_t planes, const dl__pgeom *g);
    /* dx (planes, ia...) = adjoint of avg_pool applied to g (planes, ob...) */
    void (*avg_pool_adj)(dl_ctx *c, float *dx, const float *gy, int64_t planes, const dl__pgeom *g);
} dl__conv_kernels;

/* ------------------------------------------------------------ CPU kernels */

/* Outputs o in [*lo, *hi) are those with 0 <= o*s + off < in (o < out). */
static void dl__crange(int64_t off, int64_t s, int64_t in, int64_t out, int64_t *lo, int64_t *hi)
{
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = in - off <= 0 ? 0 : (in - off - 1) / s + 1;
    if (b > out) b = out;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

typedef struct dl__i2c_args { float *col; const float *x; int64_t n; const dl__cgeom *g; } dl__i2c_args;

/* one task per row ((channel, kernel offset), sample) of col */
static void dl__im2col_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2c_args *u = (const dl__i2c_args *)arg;
    const dl__cgeom *g = u->g;
    int64_t r;
    for (r = lo; r < hi; r++) {
        int64_t n = r % u->n, q = r / u->n, c = q / g->K, kk = q % g->K;
        int64_t k2 = kk % g->k[2], k1 = (kk / g->k[2]) % g->k[1], k0 = kk / (g->k[2] * g->k[1]);
        int64_t off0 = k0 * g->d[0] - g->p[0], off1 = k1 * g->d[1] - g->p[1];
        int64_t off2 = k2 * g->d[2] - g->p[2];
        int64_t l0, h0, l1, h1, l2, h2, o0, o1, o2;
        const float *x = u->x + (n * g->Ca + c) * g->La;
        float *dst = u->col + r * g->Lb;
        dl__crange(off0, g->s[0], g->ia[0], g->ib[0], &l0, &h0);
        dl__crange(off1, g->s[1], g->ia[1], g->ib[1], &l1, &h1);
        dl__crange(off2, g->s[2], g->ia[2], g->ib[2], &l2, &h2);
        if (l0 > 0 || h0 < g->ib[0] || l1 > 0 || h1 < g->ib[1] || l2 > 0 || h2 < g->ib[2])
            memset(dst, 0, sizeof(float) * (size_t)g->Lb);
        if (l2 >= h2) continue;
        for (o0 = l0; o0 < h0; o0++)
            for (o1 = l1; o1 < h1; o1++) {
                int64_t base = ((o0 * g->s[0] + off0) * g->ia[1] + o1 * g->s[1] + off1) * g->ia[2] + off2;
                float *dr = dst + (o0 * g->ib[1] + o1) * g->ib[2];
                if (g->s[2] == 1) {
                    memcpy(dr + l2, x + base + l2, sizeof(float) * (size_t)(h2 - l2));
                } else {
                    int64_t s2 = g->s[2];
                    for (o2 = l2; o2 < h2; o2++) dr[o2] = x[base + o2 * s2];
                }
            }
    }
}

static void dl__cpu_im2col(dl_ctx *c, float *col, const float *x, int64_t n, const dl__cgeom *g)
{
    dl__i2c_args u;
    u.col = col; u.x = x; u.n = n; u.g = g;
    dl__parallel_for(c->pool, n * g->Ca * g->K, (1 << 14) / (g->Lb + 1) + 1, dl__im2col_task, &u);
}

/* one task per plane (sample, channel) of x: deterministic accumulation order */
static void dl__col2im_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2c_args *u = (const dl__i2c_args *)arg;
    const dl__cgeom *g = u->g;
    int64_t q, kk;
    for (q = lo; q < hi; q++) {
        float *x = u->col + q * g->La;          /* (the output here) */
        int64_t n = q / g->Ca, c = q % g->Ca;
        memset(x, 0, sizeof(float) * (size_t)g->La);
        for (kk = 0; kk < g->K; kk++) {
            int64_t k2 = kk % g->k[2], k1 = (kk / g->k[2]) % g->k[1], k0 = kk / (g->k[2] * g->k[1]);
            int64_t off0 = k0 * g->d[0] - g->p[0], off1 = k1 * g->d[1] - g->p[1];
            int64_t off2 = k2 * g->d[2] - g->p[2];
            int64_t l0, h0, l1, h1, l2, h2, o0, o1, o2;
            const float *src = u->x + ((c * g->K + kk) * u->n + n) * g->Lb;
            dl__crange(off0, g->s[0], g->ia[0], g->ib[0], &l0, &h0);
            dl__crange(off1, g->s[1], g->ia[1], g->ib[1], &l1, &h1);
            dl__crange(off2, g->s[2], g->ia[2], g->ib[2], &l2, &h2);
            for (o0 = l0; o0 < h0; o0++)
                for (o1 = l1; o1 < h1; o1++) {
                    int64_t base = ((o0 * g->s[0] + off0) * g->ia[1] + o1 * g->s[1] + off1) * g->ia[2] + off2;
                    const float *sr = src + (o0 * g->ib[1] + o1) * g->ib[2];
                    int64_t s2 = g->s[2];
                    for (o2 = l2; o2 < h2; o2++) x[base + o2 * s2] += sr[o2];
                }
        }
    }
}

static void dl__cpu_col2im(dl_ctx *c, float *x, const float *col, int64_t n, const dl__cgeom *g)
{
    dl__i2c_args u;
    u.col = x; u.x = col; u.n = n; u.g = g;
    dl__parallel_for(c->pool, n * g->Ca, (1 << 14) / (g->K * g->Lb + 1) + 1, dl__col2im_task, &u);
}

typedef struct dl__bias_args { float *y; const float *b; int64_t C, L; } dl__bias_args;

static void dl__bias_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__bias_args *u = (const dl__bias_args *)arg;
    int64_t r, i;
    for (r = lo; r < hi; r++) {
        float v = u->b[r % u->C], *y = u->y + r * u->L;
        for (i = 0; i < u->L; i++) y[i] += v;
    }
}

static void dl__cpu_bias_add(dl_ctx *c, float *y, const float *b, int64_t n, int64_t C, int64_t L)
{
    dl__bias_args u;
    u.y = y; u.b = b; u.C = C; u.L = L;
    dl__parallel_for(c->pool, n * C, (1 << 15) / (L + 1) + 1, dl__bias_task, &u);
}

/* Window of output o along dim i: [*lo, *hi) inside the input, and the count
   PyTorch divides by with count_include_pad (window clipped at in + pad). */
static void dl__pwin(const dl__pgeom *g, int i, int64_t o, int64_t *lo, int64_t *hi, int64_t *padded)
{
    if (g->adaptive) {
        *lo = o * g->ia[i] / g->ob[i];
        *hi = ((o + 1) * g->ia[i] + g->ob[i] - 1) / g->ob[i];
        *padded = *hi - *lo;
    } else {
        int64_t a = o * g->s[i] - g->p[i], b = a + g->k[i];
        if (b > g->ia[i] + g->p[i]) b = g->ia[i] + g->p[i];
        *padded = b - a;
        *lo = a < 0 ? 0 : a;
        *hi = b > g->ia[i] ? g->ia[i] : b;
    }
}

typedef struct dl__pool_args {
    float *y; int64_t *idx; const float *x; const dl__pgeom *g;
} dl__pool_args;

static void dl__maxpool_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__pool_args *u = (const dl__pool_args *)arg;
    const dl__pgeom *g = u->g;
    int64_t q, o0, o1, o2;
    for (q = lo; q < hi; q++) {
        const float *x = u->x + q * g->La;
        float *y = u->y + q * g->Lb;
        int64_t *idx = u->idx ? u->idx + q * g->Lb : NULL;
        for (o0 = 0; o0 < g->ob[0]; o0++)
            for (o1 = 0; o1 < g->ob[1]; o1++)
                for (o2 = 0; o2 < g->ob[2]; o2++) {
                    int64_t st[3], en[3], o[3], j0, j1, j2, best = -1;
                    float m = -INFINITY;
                    int i;
                    o[0] = o0; o[1] = o1; o[2] = o2;
                    for (i = 0; i < 3; i++) {
                        /* first in-range tap, and one past the last tap */
                        st[i] = o[i] * g->s[i] - g->p[i];
                        en[i] = st[i] + (g->k[i] - 1) * g->d[i] + 1;
                        if (en[i] > g->ia[i]) en[i] = g->ia[i];
                        while (st[i] < 0) st[i] += g->d[i];
                    }
                    for (j0 = st[0]; j0 < en[0]; j0 += g->d[0])
                        for (j1 = st[1]; j1 < en[1]; j1 += g->d[1])
                            for (j2 = st[2]; j2 < en[2]; j2 += g->d[2]) {
                                int64_t at = (j0 * g->ia[1] + j1) * g->ia[2] + j2;
                                float v = x[at];
                                if (best < 0 || v > m || v != v) { m = v; best = at; }
                            }
                    {
                        int64_t oi = (o0 * g->ob[1] + o1) * g->ob[2] + o2;
                        y[oi] = m;
                        if (idx) idx[oi] = best;
                    }
                }
    }
}

static void dl__cpu_max_pool(dl_ctx *c, float *y, int64_t *idx, const float *x, int64_t planes,
                             const dl__pgeom *g)
{
    dl__pool_args u;
    u.y = y; u.idx = idx; u.x = x; u.g = g;
    dl__parallel_for(c->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__maxpool_task, &u);
}

typedef struct dl__scat_args {
    float *dst; const float *src; const int64_t *idx; int64_t Lin, Lout; bool scatter;
} dl__scat_args;

static void dl__scat_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__scat_args *u = (const dl__scat_args *)arg;
    int64_t q, o;
    for (q = lo; q < hi; q++) {
        const int64_t *idx = u->idx + q * u->Lout;
        if (u->scatter) {
            float *dx = u->dst + q * u->Lin;
            const float *g = u->src + q * u->Lout;
            memset(dx, 0, sizeof(float) * (size_t)u->Lin);
            for (o = 0; o < u->Lout; o++)
                if (idx[o] >= 0 && idx[o] < u->Lin) dx[idx[o]] += g[o];
        } else {
            float *y = u->dst + q * u->Lout;
            const float *x = u->src + q * u->Lin;
            for (o = 0; o < u->Lout; o++)
                y[o] = (idx[o] >= 0 && idx[o] < u->Lin) ? x[idx[o]] : 0.0f;
        }
    }
}

static void dl__cpu_unpool(dl_ctx *c, float *dx, const float *g, const int64_t *idx, int64_t planes,
                           int64_t Lin, int64_t Lout)
{
    dl__scat_args u;
    u.dst = dx; u.src = g; u.idx = idx; u.Lin = Lin; u.Lout = Lout; u.scatter = true;
    dl__parallel_for(c->pool, planes, (1 << 14) / (Lin + Lout + 1) + 1, dl__scat_task, &u);
}

static void dl__cpu_gather(dl_ctx *c, float *y, const float *x, const int64_t *idx, int64_t planes,
                           int64_t Lin, int64_t Lout)
{
    dl__scat_args u;
    u.dst = y; u.src = x; u.idx = idx; u.Lin = Lin; u.Lout = Lout; u.scatter = false;
    dl__parallel_for(c->pool, planes, (1 << 14) / (Lout + 1) + 1, dl__scat_task, &u);
}

/* avg pooling, forward (adj = false: y = mean of window) or adjoint
   (adj = true: x[window] += y / divisor), one plane per task */
typedef struct dl__avg_args { float *x; float *y; const dl__pgeom *g; bool adj; } dl__avg_args;

static void dl__avgpool_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__avg_args *u = (const dl__avg_args *)arg;
    const dl__pgeom *g = u->g;
    int64_t q, o0, o1, o2;
    for (q = lo; q < hi; q++) {
        float *x = u->x + q * g->La, *y = u->y + q * g->Lb;
        if (u->adj) memset(x, 0, sizeof(float) * (size_t)g->La);
        for (o0 = 0; o0 < g->ob[0]; o0++)
            for (o1 = 0; o1 < g->ob[1]; o1++)
                for (o2 = 0; o2 < g->ob[2]; o2++) {
                    int64_t l[3], h[3], pc[3], j0, j1, j2, div;
                    int64_t oi = (o0 * g->ob[1] + o1) * g->ob[2] + o2;
                    dl__pwin(g, 0, o0, &l[0], &h[0], &pc[0]);
                    dl__pwin(g, 1, o1, &l[1], &h[1], &pc[1]);
                    dl__pwin(g, 2, o2, &l[2], &h[2], &pc[2]);
                    if (l[0] >= h[0] || l[1] >= h[1] || l[2] >= h[2]) {
                        if (!u->adj) y[oi] = 0.0f;
                        continue;
                    }
                    div = (g->count_include_pad || g->adaptive)
                        ? pc[0] * pc[1] * pc[2]
                        : (h[0] - l[0]) * (h[1] - l[1]) * (h[2] - l[2]);
                    if (u->adj) {
                        float v = y[oi] / (float)div;
                        for (j0 = l[0]; j0 < h[0]; j0++)
                            for (j1 = l[1]; j1 < h[1]; j1++)
                                for (j2 = l[2]; j2 < h[2]; j2++)
                                    x[(j0 * g->ia[1] + j1) * g->ia[2] + j2] += v;
                    } else {
                        float s = 0.0f;
                        for (j0 = l[0]; j0 < h[0]; j0++)
                            for (j1 = l[1]; j1 < h[1]; j1++)
                                for (j2 = l[2]; j2 < h[2]; j2++)
                                    s += x[(j0 * g->ia[1] + j1) * g->ia[2] + j2];
                        y[oi] = s / (float)div;
                    }
                }
    }
}

static void dl__cpu_avg_pool(dl_ctx *c, float *y, const float *x, int64_t planes, const dl__pgeom *g)
{
    dl__avg_args u;
    u.x = (float *)(uintptr_t)x; u.y = y; u.g = g; u.adj = false;   /* x only read */
    dl__parallel_for(c->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__avgpool_task, &u);
}

static void dl__cpu_avg_pool_adj(dl_ctx *c, float *dx, const float *gy, int64_t planes,
                                 const dl__pgeom *g)
{
    dl__avg_args u;
    u.x = dx; u.y = (float *)(uintptr_t)gy; u.g = g; u.adj = true;  /* gy only read */
    dl__parallel_for(c->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__avgpool_task, &u);
}

static const dl__conv_kernels dl__conv_cpu_kernels = {
    "cpu", dl__cpu_im2col, dl__cpu_col2im, dl__cpu_bias_add, dl__cpu_max_pool, dl__cpu_unpool,
    dl__cpu_gather, dl__cpu_avg_pool, dl__cpu_avg_pool_adj
};

static const dl__conv_kernels *dl__KC(const dl_tensor *t)
{
    (void)t;   /* the CUDA build routes device tensors to its own table here */
    return &dl__conv_cpu_kernels;
}

/* ------------------------------------------------------------ helpers */

/* Scratch of n floats in step memory on t's device, given back by
   dl__arena_rewind(&ctx->data, mark) before the op returns. */
static float *dl__conv_scratch(const char *op, dl_tensor *t, int64_t n)
{
    dl_ctx *ctx = t->ctx_;
    float *p;
    if (n < 0 || (uint64_t)n > (uint64_t)(((size_t)-1) / 16)) p = NULL;
    else p = (float *)dl__arena_alloc(ctx, &ctx->data, sizeof(float) * (size_t)(n ? n : 1), true);
    if (!p) {
        dl__err(ctx, DL_ERR_OOM, "%s: cannot allocate %lld floats of im2col scratch%s", op,
                (long long)n, ctx->memory_limit ? " (memory_limit reached?)" : "");
        return NULL;
    }
    dl__track_peak(ctx);
    return p;
}

/* samples per chunk so that the scratch stays under 32 MiB */
static int64_t dl__conv_chunk(int64_t N, int64_t per_sample)
{
    int64_t nb = per_sample > 0 ? ((int64_t)1 << 23) / per_sample : N;
    if (nb < 1) nb = 1;
    if (nb > N) nb = N;
    return nb;
}

/* Attributes packed into node->i[] (21 bits each, checked by the public
   functions): conv i[0] = groups, i[1+d] = stride | pad << 21 | dilation << 42;
   pooling i[0] = flags, i[1+d] = kernel | stride << 21 | pad << 42. */
#define DL__PACK_MAX (((int64_t)1 << 21) - 1)
static int64_t dl__pack3(int64_t a, int64_t b, int64_t c) { return a | (b << 21) | (c << 42); }
static int64_t dl__unpack(int64_t v, int k) { return (v >> (21 * k)) & DL__PACK_MAX; }

typedef struct dl__cparam { int nsp; int64_t G, s[3], p[3], d[3]; } dl__cparam;

static void dl__cparam_save(dl__node *n, const dl__cparam *cp)
{
    int i;
    n->i[0] = cp->G;
    for (i = 0; i < 3; i++) n->i[1 + i] = dl__pack3(cp->s[i], cp->p[i], cp->d[i]);
    n->ni = 4;
}

static void dl__cparam_load(const dl__node *n, int nsp, dl__cparam *cp)
{
    int i;
    cp->nsp = nsp;
    cp->G = n->i[0];
    for (i = 0; i < 3; i++) {
        cp->s[i] = dl__unpack(n->i[1 + i], 0);
        cp->p[i] = dl__unpack(n->i[1 + i], 1);
        cp->d[i] = dl__unpack(n->i[1 + i], 2);
    }
}

/* geometry from a-side, b-side and kernel spatial sizes */
static void dl__cgeom_make(dl__cgeom *g, const dl__cparam *cp, int64_t N, int64_t Ca, int64_t Cb,
                           const int64_t *ia, const int64_t *ib, const int64_t *k)
{
    int i;
    g->nsp = cp->nsp;
    g->N = N; g->Ca = Ca; g->Cb = Cb; g->G = cp->G;
    g->La = g->Lb = g->K = 1;
    for (i = 0; i < 3; i++) {
        bool on = i < cp->nsp;
        g->ia[i] = on ? ia[i] : 1;
        g->ib[i] = on ? ib[i] : 1;
        g->k[i] = on ? k[i] : 1;
        g->s[i] = on ? cp->s[i] : 1;
        g->p[i] = on ? cp->p[i] : 0;
        g->d[i] = on ? cp->d[i] : 1;
        g->La *= g->ia[i];
        g->Lb *= g->ib[i];
        g->K *= g->k[i];
    }
}

/* (cnt, C, L) <-> (C, cnt, L): to_batch_major copies src (C, cnt, L) into
   dst (cnt, C, L); otherwise src (cnt, C, L) into dst (C, cnt, L) */
static void dl__conv_permute(const dl_tensor *t, float *dst, const float *src, int64_t cnt,
                             int64_t C, int64_t L, bool to_batch_major)
{
    int64_t shape[3], ds[3], ss[3];
    if (to_batch_major) {
        shape[0] = cnt; shape[1] = C; shape[2] = L;
        ds[0] = C * L; ds[1] = L; ds[2] = 1;
        ss[0] = L; ss[1] = cnt * L; ss[2] = 1;
    } else {
        shape[0] = C; shape[1] = cnt; shape[2] = L;
        ds[0] = cnt * L; ds[1] = L; ds[2] = 1;
        ss[0] = L; ss[1] = C * L; ss[2] = 1;
    }
    if (cnt > 0 && C > 0 && L > 0) dl__K(t)->copy_nd(t->ctx_, 4, 3, shape, dst, ds, src, ss);
}

static dl_tensor *dl__conv_run(dl_tensor *a, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                               const int64_t *ib);
static dl_tensor *dl__convT_run(dl_tensor *b, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                                const int64_t *ia);
static dl_tensor *dl__convW_run(dl_tensor *a, dl_tensor *b, const dl__cparam *cp, const int64_t *k);

/* dbias = sum of g over N and the spatial dims */
static dl_tensor *dl__bias_grad(dl_tensor *g)
{
    dl_shape dims;
    int i;
    if (!g) return NULL;
    dims.ndim = g->ndim - 1;
    dims.d[0] = 0;
    for (i = 2; i < g->ndim; i++) dims.d[i - 1] = i;
    return dl_sum(g, dims, false);
}

/* b = conv(a, w) + bias;  da = convT(g, w), dw = convW(a, g), dbias = sum(g) */
static dl_result dl__conv_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *a = n->in[0], *w = n->in[1];
    dl__cparam_load(n, w->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__convT_run(g, w, NULL, &cp, a->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__convW_run(a, g, &cp, w->shape + 2);
    if (dl__need(n, 2)) gin[2] = dl__bias_grad(g);
    return DL_OK;
}
/* a = convT(b, w) + bias;  db = conv(g, w), dw = convW(g, b), dbias = sum(g) */
static dl_result dl__convT_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *b = n->in[0], *w = n->in[1];
    dl__cparam_load(n, w->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__conv_run(g, w, NULL, &cp, b->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__convW_run(g, b, &cp, w->shape + 2);
    if (dl__need(n, 2)) gin[2] = dl__bias_grad(g);
    return DL_OK;
}
/* w = convW(a, b);  da = convT(b, g), db = conv(a, g) */
static dl_result dl__convW_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *a = n->in[0], *b = n->in[1];
    dl__cparam_load(n, n->out->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__convT_run(b, g, NULL, &cp, a->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__conv_run(a, g, NULL, &cp, b->shape + 2);
    return DL_OK;
}
static const dl__op dl__op_conv = {"dl_conv", dl__conv_bwd};
static const dl__op dl__op_convT = {"dl_conv_transpose", dl__convT_bwd};
static const dl__op dl__op_convW = {"dl_conv_weight_grad", dl__convW_bwd};

/* a (N,Ca,ia...), w (Cb, Ca/G, k...), bias (Cb) or NULL -> (N, Cb, ib...).
   Shapes were checked by the caller. */
static dl_tensor *dl__conv_run(dl_tensor *a, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                               const int64_t *ib)
{
    const char *name = "dl_conv";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[3];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp;
    if (!a || !w) return NULL;
    ctx = a->ctx_;
    dl__cgeom_make(&g, cp, a->shape[0], a->shape[1], w->shape[0], a->shape + 2, ib, w->shape + 2);
    shape[0] = g.N;
    shape[1] = g.Cb;
    for (i = 0; i < nsp; i++) shape[2 + i] = ib[i];
    y = dl__new(ctx, name, nsp + 2, shape);
    if (!y) return NULL;
    y->device = a->device;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    if (y->numel) {
        /* per chunk of cnt samples: col (CaK, cnt, Lb) = im2col(a);
           yt_g (Cbg, cnt*Lb) = w_g (Cbg, CagK) @ col_g; y = permute(yt) */
        const dl__kernels *k = dl__K(a);
        dl__mark m = dl__arena_mark(&ctx->data);
        float *col, *yt;
        nb = dl__conv_chunk(g.N, (g.Ca * g.K + g.Cb) * g.Lb);
        col = dl__conv_scratch(name, a, nb * (g.Ca * g.K + g.Cb) * g.Lb);
        if (!col) return NULL;
        yt = col + nb * g.Ca * g.K * g.Lb;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            dl__KC(a)->im2col(ctx, col, (const float *)a->data + n0 * g.Ca * g.La, cnt, &g);
            k->gemm(ctx, false, false, Cbg, L, CagK, 1.0f, (const float *)w->data, CagK, Cbg * CagK,
                    col, L, CagK * L, 0.0f, yt, L, Cbg * L, g.G);
            dl__conv_permute(a, (float *)y->data + n0 * g.Cb * g.Lb, yt, cnt, g.Cb, g.Lb, true);
        }
        dl__arena_rewind(&ctx->data, m);
        if (bias) dl__KC(a)->bias_add(ctx, (float *)y->data, (const float *)bias->data, g.N, g.Cb, g.Lb);
    }
    in[0] = a; in[1] = w; in[2] = bias;
    if (dl__record(y, &dl__op_conv, 3, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* b (N,Cb,ib...), w (Cb, Ca/G, k...), bias (Ca) or NULL -> (N, Ca, ia...) */
static dl_tensor *dl__convT_run(dl_tensor *b, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                                const int64_t *ia)
{
    const char *name = "dl_conv_transpose";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[3];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp;
    if (!b || !w) return NULL;
    ctx = b->ctx_;
    dl__cgeom_make(&g, cp, b->shape[0], w->shape[1] * cp->G, b->shape[1], ia, b->shape + 2,
                   w->shape + 2);
    shape[0] = g.N;
    shape[1] = g.Ca;
    for (i = 0; i < nsp; i++) shape[2 + i] = ia[i];
    y = dl__new(ctx, name, nsp + 2, shape);
    if (!y) return NULL;
    y->device = b->device;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    if (y->numel) {
        /* per chunk: bt (Cb, cnt, Lb) = permute(b); col_g (CagK, cnt*Lb) = w_g^T @ bt_g;
           y = col2im(col) */
        const dl__kernels *k = dl__K(b);
        dl__mark m = dl__arena_mark(&ctx->data);
        float *col, *bt;
        nb = dl__conv_chunk(g.N, (g.Ca * g.K + g.Cb) * g.Lb);
        col = dl__conv_scratch(name, b, nb * (g.Ca * g.K + g.Cb) * g.Lb);
        if (!col) return NULL;
        bt = col + nb * g.Ca * g.K * g.Lb;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            dl__conv_permute(b, bt, (const float *)b->data + n0 * g.Cb * g.Lb, cnt, g.Cb, g.Lb, false);
            k->gemm(ctx, true, false, CagK, L, Cbg, 1.0f, (const float *)w->data, CagK, Cbg * CagK,
                    bt, L, Cbg * L, 0.0f, col, L, CagK * L, g.G);
            dl__KC(b)->col2im(ctx, (float *)y->data + n0 * g.Ca * g.La, col, cnt, &g);
        }
        dl__arena_rewind(&ctx->data, m);
        if (bias) dl__KC(b)->bias_add(ctx, (float *)y->data, (const float *)bias->data, g.N, g.Ca, g.La);
    }
    in[0] = b; in[1] = w; in[2] = bias;
    if (dl__record(y, &dl__op_convT, 3, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* a (N,Ca,ia...), b (N,Cb,ib...) -> (Cb, Ca/G, k...) = sum_n b_g[n] col_g[n]^T */
static dl_tensor *dl__convW_run(dl_tensor *a, dl_tensor *b, const dl__cparam *cp, const int64_t *k)
{
    const char *name = "dl_conv_weight_grad";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[2];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp;
    if (!a || !b) return NULL;
    ctx = a->ctx_;
    dl__cgeom_make(&g, cp, a->shape[0], a->shape[1], b->shape[1], a->shape + 2, b->shape + 2, k);
    shape[0] = g.Cb;
    shape[1] = g.Ca / g.G;
    for (i = 0; i < nsp; i++) shape[2 + i] = k[i];
    y = dl__new(ctx, name, nsp + 2, shape);
    if (!y) return NULL;
    y->device = a->device;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    if (y->numel) {
        /* per chunk: col = im2col(a), bt = permute(b);
           w_g (Cbg, CagK) += bt_g (Cbg, cnt*Lb) @ col_g^T */
        const dl__kernels *kt = dl__K(a);
        dl__mark m = dl__arena_mark(&ctx->data);
        float *col, *bt;
        if (g.N == 0) kt->fill(ctx, (float *)y->data, y->numel, 0.0f);
        nb = dl__conv_chunk(g.N, (g.Ca * g.K + g.Cb) * g.Lb);
        col = g.N ? dl__conv_scratch(name, a, nb * (g.Ca * g.K + g.Cb) * g.Lb) : NULL;
        if (g.N && !col) return NULL;
        bt = col ? col + nb * g.Ca * g.K * g.Lb : NULL;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            dl__KC(a)->im2col(ctx, col, (const float *)a->data + n0 * g.Ca * g.La, cnt, &g);
            dl__conv_permute(b, bt, (const float *)b->data + n0 * g.Cb * g.Lb, cnt, g.Cb, g.Lb, false);
            kt->gemm(ctx, false, true, Cbg, CagK, L, 1.0f, bt, L, Cbg * L, col, L, CagK * L,
                     n0 == 0 ? 0.0f : 1.0f, (float *)y->data, CagK, Cbg * CagK, g.G);
        }
        dl__arena_rewind(&ctx->data, m);
    }
    in[0] = a; in[1] = b;
    if (dl__record(y, &dl__op_convW, 2, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* ------------------------------------------------------------ conv: public */

dl_conv_desc dl_conv_desc_make(int64_t stride, int64_t padding, int64_t dilation, int64_t groups)
{
    dl_conv_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < DL_MAX_SPATIAL; i++) {
        d.stride[i] = stride;
        d.padding[i] = padding;
        d.dilation[i] = dilation;
    }
    d.groups = groups;
    return d;
}

static bool dl__same_dev(const char *op, const char *an, const dl_tensor *a, const char *bn,
                         const dl_tensor *b)
{
    char da[32], db[32];
    if (a->ctx_ != b->ctx_) {
        dl__err(a->ctx_, DL_ERR_ARG, "%s: %s and %s belong to different contexts", op, an, bn);
        return false;
    }
    if (a->device.type != b->device.type || a->device.index != b->device.index) {
        dl__err(a->ctx_, DL_ERR_DEVICE, "%s: %s %s is on %s but %s %s is on %s; move one with dl_to()",
                op, an, dl__sh(a), dl__dev_str(a->device, da, sizeof da), bn, dl__sh(b),
                dl__dev_str(b->device, db, sizeof db));
        return false;
    }
    return true;
}

static const char *dl__sp_names(int nsp)
{
    return nsp == 1 ? "L" : nsp == 2 ? "H,W" : "D,H,W";
}

/* floor(a / b) for b > 0 */
static int64_t dl__floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static dl_tensor *dl__conv_api(const char *name, int nsp, bool transposed, dl_tensor *x,
                               dl_tensor *w, dl_tensor *b, const dl_conv_desc *d)
{
    dl_ctx *ctx;
    dl__cparam cp;
    int64_t out[3], C, OC, G;
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x || !w) return NULL;
    if (!dl__live(name, "x", x) || !dl__live(name, "w", w)) return NULL;
    if (b && !dl__live(name, "b", b)) return NULL;
    ctx = x->ctx_;
    if (!dl__same_dev(name, "x", x, "w", w) || (b && !dl__same_dev(name, "x", x, "b", b))) return NULL;
    if (!dl__f32(name, "x", x) || !dl__f32(name, "w", w) || (b && !dl__f32(name, "b", b))) return NULL;
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: x %s must have %d dims (N,C,%s) or %d unbatched (C,%s)",
                name, dl__sh(x), nsp + 2, dl__sp_names(nsp), nsp + 1, dl__sp_names(nsp));
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    if (w->ndim != nsp + 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: w %s must have %d dims (%s, %s)", name, dl__sh(w), nsp + 2,
                transposed ? "C_in, OC/groups" : "OC, C/groups", nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
        return NULL;
    }
    G = d && d->groups ? d->groups : 1;
    if (G < 1) {
        dl__err(ctx, DL_ERR_ARG, "%s: groups=%lld must be >= 1 (0 means 1)", name, (long long)G);
        return NULL;
    }
    memset(&cp, 0, sizeof cp);
    cp.nsp = nsp;
    cp.G = G;
    if (d && d->padding_same && transposed) {
        dl__err(ctx, DL_ERR_ARG, "%s: padding_same applies to dl_conv*d only (PyTorch has no "
                "padding='same' for transposed convolution)", name);
        return NULL;
    }
    for (i = 0; i < nsp; i++) {
        int64_t s = d ? d->stride[i] : 0, p = d ? d->padding[i] : 0, dl = d ? d->dilation[i] : 0;
        int64_t op = d ? d->output_padding[i] : 0;
        if (s < 0 || dl < 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 1 (0 means 1)", name,
                    s < 0 ? "stride" : "dilation", i, (long long)(s < 0 ? s : dl));
            return NULL;
        }
        if (s == 0) s = 1;
        if (dl == 0) dl = 1;
        if (p < 0 || op < 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 0", name,
                    p < 0 ? "padding" : "output_padding", i, (long long)(p < 0 ? p : op));
            return NULL;
        }
        if (s > DL__PACK_MAX || dl > DL__PACK_MAX || p > DL__PACK_MAX) {
            dl__err(ctx, DL_ERR_ARG, "%s: stride %lld, padding %lld, dilation %lld in dim %d: "
                    "each must be at most %lld", name, (long long)s, (long long)p, (long long)dl,
                    i, (long long)DL__PACK_MAX);
            return NULL;
        }
        if (!transposed && op != 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: output_padding[%d]=%lld applies to transposed "
                    "convolution only", name, i, (long long)op);
            return NULL;
        }
        if (transposed && op >= s && op >= dl) {
            dl__err(ctx, DL_ERR_ARG, "%s: output_padding[%d]=%lld must be smaller than either "
                    "stride (%lld) or dilation (%lld)", name, i, (long long)op, (long long)s,
                    (long long)dl);
            return NULL;
        }
        if (d && d->padding_same && s != 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: padding_same needs stride 1 in every dim (as PyTorch's "
                    "padding='same'), but stride[%d]=%lld", name, i, (long long)s);
            return NULL;
        }
        cp.s[i] = s;
        cp.p[i] = p;
        cp.d[i] = dl;
    }
    C = x->shape[unbatched ? 0 : 1];
    if (!transposed) {
        OC = w->shape[0];
        if (C % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels, not divisible by groups=%lld",
                    name, dl__sh(x), (long long)C, (long long)G);
            return NULL;
        }
        if (OC % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: w %s has %lld output channels (dim 0), not divisible by "
                    "groups=%lld", name, dl__sh(w), (long long)OC, (long long)G);
            return NULL;
        }
        if (w->shape[1] * G != C) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels but w %s expects "
                    "w.shape[1]*groups = %lld*%lld = %lld (w is (OC, C/groups, %s))", name,
                    dl__sh(x), (long long)C, dl__sh(w), (long long)w->shape[1], (long long)G,
                    (long long)(w->shape[1] * G), nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
            return NULL;
        }
    } else {
        OC = w->shape[1] * G;
        if (w->shape[0] != C) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels but w %s expects w.shape[0] = "
                    "%lld (w is (C_in, OC/groups, %s))", name, dl__sh(x), (long long)C, dl__sh(w),
                    (long long)w->shape[0], nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
            return NULL;
        }
        if (C % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels, not divisible by groups=%lld",
                    name, dl__sh(x), (long long)C, (long long)G);
            return NULL;
        }
    }
    if (b && (b->ndim != 1 || b->shape[0] != OC)) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: b %s must be (OC) = (%lld), one value per output channel",
                name, dl__sh(b), (long long)OC);
        return NULL;
    }
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i], k = w->shape[2 + i];
        int64_t ek = cp.d[i] * (k - 1) + 1;
        if (k < 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: w %s has kernel size 0 in spatial dim %d", name,
                    dl__sh(w), i);
            return NULL;
        }
        if (d && d->padding_same) {
            int64_t total = cp.d[i] * (k - 1);
            cp.p[i] = total / 2;     /* the odd extra unit goes on the right, as PyTorch */
            out[i] = in;
            if (cp.p[i] > DL__PACK_MAX) {
                dl__err(ctx, DL_ERR_ARG, "%s: padding %lld in dim %d is larger than %lld", name,
                        (long long)cp.p[i], i, (long long)DL__PACK_MAX);
                return NULL;
            }
        } else if (!transposed) {
            int64_t num = in + 2 * cp.p[i] - ek;
            out[i] = num < 0 ? 0 : num / cp.s[i] + 1;
            if (out[i] < 1) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: x %s, w %s: spatial dim %d: the input padded to "
                        "%lld (in %lld + 2*padding %lld) is smaller than the dilated kernel %lld "
                        "(dilation %lld*(k %lld-1)+1): output size would be < 1", name, dl__sh(x),
                        dl__sh(w), i, (long long)(in + 2 * cp.p[i]), (long long)in,
                        (long long)cp.p[i], (long long)ek, (long long)cp.d[i], (long long)k);
                return NULL;
            }
        } else {
            out[i] = (in - 1) * cp.s[i] - 2 * cp.p[i] + ek + (d ? d->output_padding[i] : 0);
            if (out[i] < 1) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: x %s, w %s: spatial dim %d: output size (in-1)*stride "
                        "- 2*padding + dilation*(k-1) + output_padding + 1 = %lld is < 1", name,
                        dl__sh(x), dl__sh(w), i, (long long)out[i]);
                return NULL;
            }
        }
    }
    if (unbatched) x = dl_unsqueeze(x, 0);
    if (!transposed) y = dl__conv_run(x, w, b, &cp, out);
    else y = dl__convT_run(x, w, b, &cp, out);
    return unbatched ? dl_squeeze(y, 0) : y;
}

dl_tensor *dl_conv1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv1d", 1, false, x, w, b, d); }
dl_tensor *dl_conv2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv2d", 2, false, x, w, b, d); }
dl_tensor *dl_conv3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv3d", 3, false, x, w, b, d); }
dl_tensor *dl_conv_transpose1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose1d", 1, true, x, w, b, d); }
dl_tensor *dl_conv_transpose2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose2d", 2, true, x, w, b, d); }
dl_tensor *dl_conv_transpose3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose3d", 3, true, x, w, b, d); }

/* ------------------------------------------------------------ pooling */

typedef struct dl__pparam { int nsp; int64_t k[3], s[3], p[3]; bool adaptive, cip; } dl__pparam;

static void dl__pparam_save(dl__node *n, const dl__pparam *pp)
{
    int i;
    n->i[0] = (pp->adaptive ? 1 : 0) | (pp->cip ? 2 : 0);
    for (i = 0; i < 3; i++) n->i[1 + i] = dl__pack3(pp->k[i], pp->s[i], pp->p[i]);
    n->ni = 4;
}

static void dl__pparam_load(const dl__node *n, int nsp, dl__pparam *pp)
{
    int i;
    pp->nsp = nsp;
    pp->adaptive = (n->i[0] & 1) != 0;
    pp->cip = (n->i[0] & 2) != 0;
    for (i = 0; i < 3; i++) {
        pp->k[i] = dl__unpack(n->i[1 + i], 0);
        pp->s[i] = dl__unpack(n->i[1 + i], 1);
        pp->p[i] = dl__unpack(n->i[1 + i], 2);
    }
}

static void dl__pgeom_make(dl__pgeom *g, int nsp, const int64_t *ia, const int64_t *ob,
                           const int64_t *k, const int64_t *s, const int64_t *p, const int64_t *d)
{
    int i;
    g->La = g->Lb = 1;
    for (i = 0; i < 3; i++) {
        bool on = i < nsp;
        g->ia[i] = on ? ia[i] : 1;
        g->ob[i] = on ? ob[i] : 1;
        g->k[i] = on && k ? k[i] : 1;
        g->s[i] = on && s ? s[i] : 1;
        g->p[i] = on && p ? p[i] : 0;
        g->d[i] = on && d ? d[i] : 1;
        g->La *= g->ia[i];
        g->Lb *= g->ob[i];
    }
    g->adaptive = false;
    g->count_include_pad = false;
}

/* --- max pooling: y = x[idx];  dx = unpool(g, idx);  unpool's backward: gather */
static dl_tensor *dl__unpool(dl_tensor *g, dl_tensor *idx, int ndim, const int64_t *xshape);
static dl_tensor *dl__pool_gather(dl_tensor *x, dl_tensor *idx);

static dl_result dl__maxpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unpool(g, n->saved[0], n->in[0]->ndim, n->in[0]->shape);
    return DL_OK;
}
static dl_result dl__unpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__pool_gather(g, n->saved[0]);
    return DL_OK;
}
static dl_result dl__gather_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unpool(g, n->saved[0], n->in[0]->ndim, n->in[0]->shape);
    return DL_OK;
}
static const dl__op dl__op_maxpool = {"dl_max_pool", dl__maxpool_bwd};
static const dl__op dl__op_unpool = {"dl_max_pool_backward", dl__unpool_bwd};
static const dl__op dl__op_pgather = {"dl_max_pool_gather", dl__gather_bwd};

/* g (N,C,ob...) scattered to (N,C,ia...) at idx (N,C,ob...) */
static dl_tensor *dl__unpool(dl_tensor *g, dl_tensor *idx, int ndim, const int64_t *xshape)
{
    dl_tensor *y;
    dl__node *n;
    int64_t planes;
    if (!g || !idx) return NULL;
    y = dl__new(g->ctx_, "dl_max_pool_backward", ndim, xshape);
    if (!y) return NULL;
    y->device = g->device;
    planes = xshape[0] * xshape[1];
    if (y->numel)
        dl__KC(g)->unpool(g->ctx_, (float *)y->data, (const float *)g->data,
                          (const int64_t *)idx->data, planes, y->numel / planes,
                          planes ? g->numel / planes : 0);
    if (dl__record(y, &dl__op_unpool, 1, &g, &n) < 0) return NULL;
    if (n) { n->saved[0] = idx; n->nsaved = 1; }
    return dl__done(y, "dl_max_pool_backward");
}

/* x (N,C,ia...) read at idx (N,C,ob...) */
static dl_tensor *dl__pool_gather(dl_tensor *x, dl_tensor *idx)
{
    dl_tensor *y;
    dl__node *n;
    int64_t planes;
    if (!x || !idx) return NULL;
    y = dl__new(x->ctx_, "dl_max_pool_gather", idx->ndim, idx->shape);
    if (!y) return NULL;
    y->device = x->device;
    planes = x->shape[0] * x->shape[1];
    if (y->numel)
        dl__KC(x)->gather(x->ctx_, (float *)y->data, (const float *)x->data,
                          (const int64_t *)idx->data, planes, x->numel / planes, y->numel / planes);
    if (dl__record(y, &dl__op_pgather, 1, &x, &n) < 0) return NULL;
    if (n) { n->saved[0] = idx; n->nsaved = 1; }
    return dl__done(y, "dl_max_pool_gather");
}

/* --- average pooling: y = A x (linear);  dx = A^T g;  A^T's backward is A */
static dl_tensor *dl__avgpool_run(dl_tensor *x, const dl__pparam *pp, const int64_t *ob);
static dl_tensor *dl__avgpool_adj(dl_tensor *g, const dl__pparam *pp, const int64_t *ia);

static dl_result dl__avgpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__pparam pp;
    dl__pparam_load(n, n->in[0]->ndim - 2, &pp);
    gin[0] = dl__avgpool_adj(g, &pp, n->in[0]->shape + 2);
    return DL_OK;
}
static dl_result dl__avgpool_adj_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__pparam pp;
    dl__pparam_load(n, n->in[0]->ndim - 2, &pp);
    gin[0] = dl__avgpool_run(g, &pp, n->in[0]->shape + 2);
    return DL_OK;
}
static const dl__op dl__op_avgpool = {"dl_avg_pool", dl__avgpool_bwd};
static const dl__op dl__op_avgpool_adj = {"dl_avg_pool_backward", dl__avgpool_adj_bwd};

static void dl__pgeom_from(dl__pgeom *g, const dl__pparam *pp, const int64_t *ia, const int64_t *ob)
{
    dl__pgeom_make(g, pp->nsp, ia, ob, pp->k, pp->s, pp->p, NULL);
    g->adaptive = pp->adaptive;
    g->count_include_pad = pp->cip;
}

static dl_tensor *dl__avgpool_run(dl_tensor *x, const dl__pparam *pp, const int64_t *ob)
{
    const char *name = pp->adaptive ? "dl_adaptive_avg_pool" : "dl_avg_pool";
    int64_t shape[DL_MAX_DIMS];
    dl__pgeom g;
    dl_tensor *y;
    dl__node *n;
    int i;
    if (!x) return NULL;
    shape[0] = x->shape[0];
    shape[1] = x->shape[1];
    for (i = 0; i < pp->nsp; i++) shape[2 + i] = ob[i];
    y = dl__new(x->ctx_, name, pp->nsp + 2, shape);
    if (!y) return NULL;
    y->device = x->device;
    dl__pgeom_from(&g, pp, x->shape + 2, ob);
    if (y->numel)
        dl__KC(x)->avg_pool(x->ctx_, (float *)y->data, (const float *)x->data,
                            shape[0] * shape[1], &g);
    if (dl__record(y, &dl__op_avgpool, 1, &x, &n) < 0) return NULL;
    if (n) dl__pparam_save(n, pp);
    return dl__done(y, name);
}

static dl_tensor *dl__avgpool_adj(dl_tensor *g, const dl__pparam *pp, const int64_t *ia)
{
    const char *name = "dl_avg_pool_backward";
    int64_t shape[DL_MAX_DIMS];
    dl__pgeom pg;
    dl_tensor *y;
    dl__node *n;
    int i;
    if (!g) return NULL;
    shape[0] = g->shape[0];
    shape[1] = g->shape[1];
    for (i = 0; i < pp->nsp; i++) shape[2 + i] = ia[i];
    y = dl__new(g->ctx_, name, pp->nsp + 2, shape);
    if (!y) return NULL;
    y->device = g->device;
    dl__pgeom_from(&pg, pp, ia, g->shape + 2);
    if (y->numel)
        dl__KC(g)->avg_pool_adj(g->ctx_, (float *)y->data, (const float *)g->data,
                                shape[0] * shape[1], &pg);
    if (dl__record(y, &dl__op_avgpool_adj, 1, &g, &n) < 0) return NULL;
    if (n) dl__pparam_save(n, pp);
    return dl__done(y, name);
}

dl_pool_desc dl_pool_desc_make(int64_t kernel, int64_t stride, int64_t padding)
{
    dl_pool_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < DL_MAX_SPATIAL; i++) {
        d.kernel[i] = kernel;
        d.stride[i] = stride;
        d.padding[i] = padding;
        d.dilation[i] = 1;
    }
    d.count_include_pad = true;
    return d;
}

/* x must be (N,C,spatial...) or (C,spatial...); false + error otherwise */
static bool dl__pool_input(const char *name, int nsp, dl_tensor *x)
{
    if (!dl__live(name, "x", x) || !dl__f32(name, "x", x)) return false;
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: x %s must have %d dims (N,C,%s) or %d unbatched (C,%s)",
                name, dl__sh(x), nsp + 2, dl__sp_names(nsp), nsp + 1, dl__sp_names(nsp));
        return false;
    }
    return true;
}

static dl_tensor *dl__pool_api(const char *name, int nsp, bool is_max, dl_tensor *x,
                               const dl_pool_desc *d)
{
    dl_ctx *ctx;
    int64_t k[3], s[3], p[3], dil[3], ob[3];
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x) return NULL;
    if (!dl__pool_input(name, nsp, x)) return NULL;
    ctx = x->ctx_;
    if (!d) {
        dl__err(ctx, DL_ERR_ARG, "%s: desc is NULL; the kernel size is required "
                "(dl_pool_desc_make(kernel, stride, padding))", name);
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i], num;
        k[i] = d->kernel[i];
        s[i] = d->stride[i] ? d->stride[i] : k[i];
        p[i] = d->padding[i];
        dil[i] = d->dilation[i] ? d->dilation[i] : 1;
        if (k[i] < 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: kernel[%d]=%lld must be >= 1", name, i, (long long)k[i]);
            return NULL;
        }
        if (s[i] < 1 || dil[i] < 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 1 (0 means %s)", name,
                    s[i] < 1 ? "stride" : "dilation", i, (long long)(s[i] < 1 ? s[i] : dil[i]),
                    s[i] < 1 ? "the kernel size" : "1");
            return NULL;
        }
        if (p[i] < 0 || p[i] > k[i] / 2) {
            dl__err(ctx, DL_ERR_ARG, "%s: padding[%d]=%lld must be between 0 and half the "
                    "kernel size (kernel[%d]=%lld)", name, i, (long long)p[i], i, (long long)k[i]);
            return NULL;
        }
        if (!is_max && dil[i] != 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: dilation[%d]=%lld: dilation applies to max pooling only",
                    name, i, (long long)dil[i]);
            return NULL;
        }
        if (k[i] > DL__PACK_MAX || s[i] > DL__PACK_MAX || dil[i] > DL__PACK_MAX) {
            dl__err(ctx, DL_ERR_ARG, "%s: kernel %lld, stride %lld, dilation %lld in dim %d: each "
                    "must be at most %lld", name, (long long)k[i], (long long)s[i],
                    (long long)dil[i], i, (long long)DL__PACK_MAX);
            return NULL;
        }
        /* PyTorch's pooling_output_shape */
        num = in + 2 * p[i] - dil[i] * (k[i] - 1) - 1 + (d->ceil_mode ? s[i] - 1 : 0);
        ob[i] = dl__floordiv(num, s[i]) + 1;
        if (d->ceil_mode && (ob[i] - 1) * s[i] >= in + p[i]) ob[i]--;
        if (ob[i] < 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s: spatial dim %d of size %lld with padding %lld is "
                    "smaller than the %swindow %lld: output size %lld < 1", name, dl__sh(x), i,
                    (long long)in, (long long)p[i], is_max && dil[i] > 1 ? "dilated " : "",
                    (long long)(dil[i] * (k[i] - 1) + 1), (long long)ob[i]);
            return NULL;
        }
    }
    if (unbatched) x = dl_unsqueeze(x, 0);
    if (!x) return NULL;
    if (is_max) {
        dl__pgeom g;
        dl_tensor *idx = NULL, *in1 = x;
        dl__node *n;
        int64_t shape[DL_MAX_DIMS];
        bool rec = dl__grad_on(ctx) && x->requires_grad;
        shape[0] = x->shape[0];
        shape[1] = x->shape[1];
        for (i = 0; i < nsp; i++) shape[2 + i] = ob[i];
        y = dl__new(ctx, name, nsp + 2, shape);
        if (!y) return NULL;
        y->device = x->device;
        if (rec) {
            idx = dl__make(ctx, name, DL_DTYPE_I64, nsp + 2, shape, false, NULL);
            if (!idx) return NULL;
            idx->device = x->device;
        }
        dl__pgeom_make(&g, nsp, x->shape + 2, ob, k, s, p, dil);
        if (y->numel)
            dl__KC(x)->max_pool(ctx, (float *)y->data, idx ? (int64_t *)idx->data : NULL,
                                (const float *)x->data, shape[0] * shape[1], &g);
        if (dl__record(y, &dl__op_maxpool, 1, &in1, &n) < 0) return NULL;
        if (n) { n->saved[0] = idx; n->nsaved = 1; }
        y = dl__done(y, name);
    } else {
        dl__pparam pp;
        memset(&pp, 0, sizeof pp);
        pp.nsp = nsp;
        pp.cip = d->count_include_pad;
        for (i = 0; i < nsp; i++) { pp.k[i] = k[i]; pp.s[i] = s[i]; pp.p[i] = p[i]; }
        y = dl__avgpool_run(x, &pp, ob);
    }
    return unbatched ? dl_squeeze(y, 0) : y;
}

dl_tensor *dl_max_pool1d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool1d", 1, true, x, d); }
dl_tensor *dl_max_pool2d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool2d", 2, true, x, d); }
dl_tensor *dl_max_pool3d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool3d", 3, true, x, d); }
dl_tensor *dl_avg_pool1d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool1d", 1, false, x, d); }
dl_tensor *dl_avg_pool2d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool2d", 2, false, x, d); }
dl_tensor *dl_avg_pool3d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool3d", 3, false, x, d); }

static dl_tensor *dl__adaptive_api(const char *name, int nsp, dl_tensor *x, dl_shape os)
{
    dl__pparam pp;
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x) return NULL;
    if (!dl__pool_input(name, nsp, x)) return NULL;
    if (os.ndim != nsp) {
        dl__err(x->ctx_, DL_ERR_ARG, "%s: output_size %s has %d entries; it needs one per spatial "
                "dim (%d)", name, dl__shp(x->ctx_, &os), os.ndim, nsp);
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i];
        if (os.d[i] < 0) {
            dl__err(x->ctx_, DL_ERR_ARG, "%s: output_size %s has a negative entry", name,
                    dl__shp(x->ctx_, &os));
            return NULL;
        }
        if (in < 1 && os.d[i] > 0) {
            dl__err(x->ctx_, DL_ERR_SHAPE, "%s: x %s has size 0 in spatial dim %d: nothing to "
                    "average", name, dl__sh(x), i);
            return NULL;
        }
    }
    memset(&pp, 0, sizeof pp);
    pp.nsp = nsp;
    pp.adaptive = true;
    for (i = 0; i < 3; i++) { pp.k[i] = 1; pp.s[i] = 1; }
    if (unbatched) x = dl_unsqueeze(x, 0);
    y = dl__avgpool_run(x, &pp, os.d);
    return unbatched ? dl_squeeze(y, 0) : y;
}

dl_tensor *dl_adaptive_avg_pool1d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool1d", 1, x, s); }
dl_tensor *dl_adaptive_avg_pool2d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool2d", 2, x, s); }
dl_tensor *dl_adaptive_avg_pool3d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool3d", 3, x, s); }

#endif /* DL_IMPLEMENTATION && !DL__CONV_IMPLEMENTED */
