/* tests/test_conv.c - convolution, transposed convolution and pooling
   (parts/conv_decl.h, parts/conv_impl.h).

   1. dl_gradcheck of every layer over an options matrix (stride, padding,
      dilation, groups incl. depthwise, bias on/off, padding_same,
      output_padding, ceil_mode, count_include_pad; 1-D, 2-D and 3-D; x, w
      and b all checked), unbatched inputs, and second-order quantities (a
      gradient taken with create_graph inside the checked function).
   2. PyTorch golden values from tests/golden/conv.bin (regenerate with
      /usr/bin/python3 tests/golden/gen_conv.py): forward, gradients and
      Hessian-vector products, and a whole d2l LeNet forward + backward,
      |got - want| <= 1e-5 + 1e-4 |want|.
   3. Every error: code, message, and the context still works after it.
   4. Same bits with 1, 2 and 3 threads; flat memory across steps; timing of
      a LeNet-sized conv forward + backward (batch 256, 1x28x28 -> 6x5x5 pad 2).
   5. The ways to a convolution: every stride-1 conv here takes the
      padded-grid path (conv_s1; DL__S1_MAX_GROW and DL__S1_WASTE are lifted for this file, so
      sections 1-3 run it on every shape; the CPU takes its row variant for
      1-D and 2-D convs with few output channels), and s1_paths() compares
      it, and the grid variant alone, with im2col on a device whose backend
      lacks conv_s1: forward bit for bit, weight gradient, input gradient
      and conv_transpose within float rounding, over 1-D/2-D/3-D, kernels
      1-5, dilation, every padding, bias or not.
   6. im2col/col2im on small planes take a table of gather indices;
      i2c_paths() compares them with the row loops, bit for bit, over
      1-D/2-D/3-D, kernels 1-4, strides 1-3, dilation 1-2, every padding,
      groups 1-2, conv and conv_transpose.

   Build and run from the repository root:
       gcc -std=c99 -Wall -Wextra -Werror -pedantic -O2 -I. tests/test_conv.c \
           -o /tmp/test_conv -lm -lpthread && /tmp/test_conv [tests/golden/conv.bin] */
#define _POSIX_C_SOURCE 200809L
#define DL__S1_MAX_GROW 1e9   /* every stride-1 conv through conv_s1 (section 5) */
#define DL__S1_WASTE 1e12
#define DL__S1R_CHUNK 3000    /* the row variant's weight gradient in chunks of a few samples */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>
#include <time.h>

/* ================================================================ golden */
#define G_MAXIN 16

#include "golden.h"

/* y = x w^T + b */
/* whether m's cuda:0 is a real GPU that gives every convolution to cuDNN
   (DL_CUDNN=2, make test-cuda-all's cudnn pass), where the scratch that
   dl.h's own paths need is not allocated */
static bool conv_dnn_all(dl_ctx *m)
{
#if defined(DL_CUDA) && defined(DL_CUDNN) && !defined(DL_NO_IMPLEMENTATION)
    return m->cuda[0] && !DL__CUI(m->cuda[0])->emulate && DL__CUI(m->cuda[0])->dnn_mode == 2;
#else
    (void)m;
    return false;
#endif
}

static dl_tensor *linear(dl_tensor *x, dl_tensor *w, dl_tensor *b)
{
    return dl_add(dl_matmul(x, dl_transpose(w, 0, 1)), b);
}

/* d2l LeNet; loss = sum(out * R). in: X, W1, b1, ..., W5, b5, R */
static dl_tensor *lenet_loss(dl_tensor *const *in)
{
    dl_conv_desc c1 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc p = dl_pool_desc_make(2, 2, 0, false, true);
    dl_tensor *h;
    h = dl_sigmoid(dl_conv2d(in[0], in[1], in[2], &c1));
    h = dl_avg_pool2d(h, &p);
    h = dl_sigmoid(dl_conv2d(h, in[3], in[4], NULL));
    h = dl_avg_pool2d(h, &p);
    h = dl_flatten(h, 1, -1);
    h = dl_sigmoid(linear(h, in[5], in[6]));
    h = dl_sigmoid(linear(h, in[7], in[8]));
    h = linear(h, in[9], in[10]);
    return dl_sum(dl_mul(h, in[11]), DL_ALL, false);
}

static dl_tensor *g_run(const char *op, int n, const grec *const *rs, dl_tensor **in,
                        const grec *p, const char **bad)
{
    (void)rs;
    *bad = NULL;
    if (!strcmp(op, "lenet")) {
        if (n != 12) { *bad = "lenet needs 12 inputs"; return NULL; }
        return lenet_loss(in);
    } else if (!strcmp(op, "prog")) {   /* gen_fuzz.py's conv programs (fuzz_conv.bin) */
        return g_prog(n, in, p, bad);
    }
    return g_any(op, n, in, p, bad);   /* convolution and pooling (and a program's other ops) */
}

/* ------------------------------------------------------------------ one case */


/* ================================================================ gradcheck */

enum { L_CONV, L_CONVT, L_MAX, L_AVG, L_ADAPT };

typedef struct GC {
    int kind, nsp;
    dl_conv_desc cd;
    dl_pool_desc pd;
    dl_shape os;
    int nin;          /* 1: x; 2: x, w; 3: x, w, b */
    bool second;      /* check the gradient of 0.5*sum(layer^2), taken with create_graph */
} GC;

static dl_tensor *layer(const GC *c, dl_tensor *x, dl_tensor *w, dl_tensor *b)
{
    switch (c->kind) {
    case L_CONV:
        return c->nsp == 1 ? dl_conv1d(x, w, b, &c->cd) : c->nsp == 2 ? dl_conv2d(x, w, b, &c->cd)
                                                                        : dl_conv3d(x, w, b, &c->cd);
    case L_CONVT:
        return c->nsp == 1 ? dl_conv_transpose1d(x, w, b, &c->cd)
             : c->nsp == 2 ? dl_conv_transpose2d(x, w, b, &c->cd)
                           : dl_conv_transpose3d(x, w, b, &c->cd);
    case L_MAX:
        return c->nsp == 1 ? dl_max_pool1d(x, &c->pd) : c->nsp == 2 ? dl_max_pool2d(x, &c->pd)
                                                                    : dl_max_pool3d(x, &c->pd);
    case L_AVG:
        return c->nsp == 1 ? dl_avg_pool1d(x, &c->pd) : c->nsp == 2 ? dl_avg_pool2d(x, &c->pd)
                                                                    : dl_avg_pool3d(x, &c->pd);
    default:
        return c->nsp == 1 ? dl_adaptive_avg_pool1d(x, c->os)
             : c->nsp == 2 ? dl_adaptive_avg_pool2d(x, c->os) : dl_adaptive_avg_pool3d(x, c->os);
    }
}

static dl_tensor *f_layer(void *user, dl_tensor *const *in)
{
    const GC *c = (const GC *)user;
    dl_tensor *w = c->nin > 1 ? in[1] : NULL, *b = c->nin > 2 ? in[2] : NULL;
    if (c->second) {
        /* the gradients of 0.5*sum(y^2) w.r.t. every input, flattened and
           concatenated, with history. dl_gradcheck turns grad mode off for
           its finite differences: the inner dl_grad needs it on. */
        dl_ctx *ctx = dl_tensor_ctx(in[0]);
        bool off = !dl_is_grad_enabled(ctx);
        dl_tensor *y, *L, *g[3] = {NULL, NULL, NULL}, *flat[3], *r = NULL;
        dl_backward_desc bd;
        int k;
        memset(&bd, 0, sizeof bd);
        bd.create_graph = true;
        if (off) dl_no_grad_end(ctx);
        y = layer(c, in[0], w, b);
        L = dl_mul_scalar(dl_sum(dl_mul(y, y), DL_ALL, false), 0.5f);
        if (L && dl_grad(L, c->nin, in, g, &bd) == DL_OK) {
            for (k = 0; k < c->nin; k++) flat[k] = dl_flatten(g[k], 0, -1);
            r = dl_cat(c->nin, flat, 0);
        }
        if (off) dl_no_grad_begin(ctx);
        return r;
    }
    return layer(c, in[0], w, b);
}

static int n_gc;

/* distinct values on a 0.2 grid, shuffled (max pooling never meets a tie) */
static void fill_distinct(dl_tensor *t, uint64_t seed)
{
    int64_t i, n = t->numel;
    float *d = (float *)malloc(sizeof(float) * (size_t)(n ? n : 1));
    uint64_t s = seed * 2654435761u + 1;
    if (!d) { CHECK(0, "fill_distinct: out of host memory"); return; }
    for (i = 0; i < n; i++) d[i] = (float)(i - n / 2) * 0.2f + 0.06f;
    for (i = n - 1; i > 0; i--) {
        int64_t j;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        j = (int64_t)((s >> 33) % (uint64_t)(i + 1));
        { float tmp = d[i]; d[i] = d[j]; d[j] = tmp; }
    }
    if (dl_write(t, d, n) != DL_OK) CHECK(0, "fill_distinct: %s", dl_error_message(dl_tensor_ctx(t)));
    free(d);
}

/* The finite-difference step. A convolution is linear in each of x, w and
   b, so the central difference has no truncation error at any step: its
   whole error is the forward's rounding, about u |y| sqrt(K) per output (u
   = 2^-24, K products summed) times the outputs x_i reaches, over 2 eps.
   At dl_gradcheck's eps = 1e-3 that reaches its atol 1e-3 (the 3-d conv
   with padding 1: 54 products an output, 54 outputs an input; 2.1e-3 on
   the CPU, passing only through rtol, and 1.3e-3, failing, on an H100,
   whose cuBLAS rounds in another order than the CPU's GEMM), so the linear
   layers take eps = 1/16: 62x less rounding error (3.1e-5 for that case on
   the CPU), and a power of two, so x +- eps is exact in float. Pooling and
   the second-order checks are not linear (max pool's kinks lie 0.2
   apart): the default. */
static double gc_eps(const GC *c)
{
    return (c->kind == L_CONV || c->kind == L_CONVT) && !c->second ? 1.0 / 16.0 : 0.0;
}

static void gc(const char *label, GC c, dl_shape xs, dl_shape ws, int64_t nbias)
{
    dl_tensor *in[3];
    dl_gradcheck_result r;
    dl_gradcheck_desc gd;
    dl_result rc;
    int k;
    c.nin = c.kind == L_CONV || c.kind == L_CONVT ? (nbias ? 3 : 2) : 1;
    dl_manual_seed(g_ctx, 100 + (uint64_t)n_gc);
    in[0] = dl_randn(g_ctx, xs);
    if (in[0] && c.kind == L_MAX) fill_distinct(in[0], (uint64_t)n_gc + 1);
    if (c.nin > 1) in[1] = dl_mul_scalar(dl_randn(g_ctx, ws), 0.5f);
    if (c.nin > 2) in[2] = dl_randn(g_ctx, dl_shape_make(1, &nbias));
    for (k = 0; k < c.nin; k++) in[k] = dl_requires_grad(in[k], true);
    n_gc++;
    for (k = 0; k < c.nin; k++)
        if (!in[k]) { CHECK(0, "gradcheck %s: making inputs: %s", label, dl_error_message(g_ctx)); dl_clear_error(g_ctx); dl_step_end(g_ctx); return; }
    memset(&gd, 0, sizeof gd);
    gd.eps = gc_eps(&c);
    rc = dl_gradcheck(g_ctx, f_layer, &c, c.nin, in, &gd, &r);
    CHECK(rc == DL_OK && r.ok, "gradcheck %s: %s %s; max abs err x %.3g w %.3g b %.3g (worst x[%lld] w[%lld] b[%lld])",
          label, dl_result_string(rc), rc ? dl_error_message(g_ctx) : "", r.max_abs_err[0],
          r.max_abs_err[1], r.max_abs_err[2], (long long)r.worst_index[0],
          (long long)r.worst_index[1], (long long)r.worst_index[2]);
    dl_clear_error(g_ctx);
    dl_step_end(g_ctx);
}

static GC conv(int kind, int nsp, int64_t s, int64_t p, int64_t d, int64_t groups)
{
    GC c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.nsp = nsp;
    c.cd = dl_conv_desc_make(s, p, d, groups);
    return c;
}

static GC pool(int kind, int nsp, int64_t k, int64_t s, int64_t p)
{
    GC c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.nsp = nsp;
    c.pd = dl_pool_desc_make(k, s, p, false, true);
    return c;
}

/* x shape (N, C, sp...) for nsp spatial dims of sizes a, b, c */
static dl_shape SP(int nsp, int64_t N, int64_t C, int64_t a, int64_t b, int64_t c)
{
    int64_t d[5];
    d[0] = N; d[1] = C; d[2] = a; d[3] = b; d[4] = c;
    return dl_shape_make(2 + nsp, d);
}

static void gradchecks(void)
{
    int nsp;
    char lab[96];
    static const int64_t SZ[3][3] = {{7, 1, 1}, {5, 4, 1}, {4, 3, 3}};
    for (nsp = 1; nsp <= 3; nsp++) {
        const int64_t *z = SZ[nsp - 1];
        GC c;
#define LAB(s) (snprintf(lab, sizeof lab, "%dd %s", nsp, s), lab)
        /* convolution */
        gc(LAB("conv plain+bias"), conv(L_CONV, nsp, 1, 0, 1, 1), SP(nsp, 2, 2, z[0], z[1], z[2]), SP(nsp, 3, 2, 2, 2, 2), 3);
        gc(LAB("conv no bias"), conv(L_CONV, nsp, 1, 0, 1, 1), SP(nsp, 1, 2, z[0], z[1], z[2]), SP(nsp, 2, 2, 2, 2, 2), 0);
        gc(LAB("conv stride 2"), conv(L_CONV, nsp, 2, 0, 1, 1), SP(nsp, 1, 2, z[0], z[1], z[2]), SP(nsp, 2, 2, 2, 2, 2), 2);
        gc(LAB("conv padding 1"), conv(L_CONV, nsp, 1, 1, 1, 1), SP(nsp, 1, 2, z[0], z[1], z[2]), SP(nsp, 2, 2, 3, 3, 3), 2);
        gc(LAB("conv dilation 2"), conv(L_CONV, nsp, 1, 1, 2, 1), SP(nsp, 1, 1, z[0], z[1], z[2]), SP(nsp, 2, 1, 2, 2, 2), 2);
        gc(LAB("conv groups 2"), conv(L_CONV, nsp, 1, 0, 1, 2), SP(nsp, 1, 4, z[0], z[1], z[2]), SP(nsp, 4, 2, 2, 2, 2), 4);
        gc(LAB("conv depthwise"), conv(L_CONV, nsp, 2, 1, 1, 3), SP(nsp, 1, 3, z[0], z[1], z[2]), SP(nsp, 3, 1, 2, 2, 2), 3);
        c = conv(L_CONV, nsp, 1, 0, 1, 1);
        c.cd.padding_same = true;
        gc(LAB("conv padding_same k3"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(nsp, 2, 2, 3, 3, 3), 2);
        c.cd = dl_conv_desc_make(1, 0, 3, 1);
        c.cd.padding_same = true;
        gc(LAB("conv padding_same k2 dil 3"), c, SP(nsp, 1, 1, z[0], z[1], z[2]), SP(nsp, 2, 1, 2, 2, 2), 2);
        gc(LAB("conv k1 (no im2col)"), conv(L_CONV, nsp, 1, 0, 1, 1), SP(nsp, 2, 3, z[0], z[1], z[2]), SP(nsp, 2, 3, 1, 1, 1), 2);
        /* transposed convolution */
        gc(LAB("convT plain+bias"), conv(L_CONVT, nsp, 1, 0, 1, 1), SP(nsp, 1, 2, z[0] - 1, z[1], z[2]), SP(nsp, 2, 3, 2, 2, 2), 3);
        gc(LAB("convT no bias"), conv(L_CONVT, nsp, 1, 0, 1, 1), SP(nsp, 1, 2, 3, 2, 2), SP(nsp, 2, 2, 2, 2, 2), 0);
        c = conv(L_CONVT, nsp, 2, 1, 1, 1);
        c.cd.output_padding[0] = c.cd.output_padding[1] = c.cd.output_padding[2] = 1;
        gc(LAB("convT stride 2 pad 1 output_padding 1"), c, SP(nsp, 1, 2, 3, 2, 2), SP(nsp, 2, 2, 3, 3, 3), 2);
        c = conv(L_CONVT, nsp, 1, 0, 2, 1);
        c.cd.output_padding[0] = 1;
        gc(LAB("convT dilation 2 output_padding 1"), c, SP(nsp, 1, 2, 3, 2, 2), SP(nsp, 2, 1, 2, 2, 2), 1);
        /* kernel 1: the output is longer than the input by the padding (CUDA's
           pointwise path took it for a plain product, reading rows of the wrong length) */
        gc(LAB("convT k1 dilation 2 output_padding 1"), c, SP(nsp, 1, 2, 3, 2, 2), SP(nsp, 2, 2, 1, 1, 1), 2);
        gc(LAB("convT groups 2"), conv(L_CONVT, nsp, 2, 0, 1, 2), SP(nsp, 1, 4, 2, 2, 2), SP(nsp, 4, 1, 2, 2, 2), 2);
        gc(LAB("convT depthwise"), conv(L_CONVT, nsp, 1, 1, 1, 2), SP(nsp, 1, 2, 3, 2, 2), SP(nsp, 2, 1, 3, 3, 3), 2);
        /* pooling */
        gc(LAB("max k2"), pool(L_MAX, nsp, 2, 0, 0), SP(nsp, 2, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        gc(LAB("max k3 s2 p1"), pool(L_MAX, nsp, 3, 2, 1), SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        gc(LAB("max k3 s1 (overlap)"), pool(L_MAX, nsp, 3, 1, 0), SP(nsp, 1, 2, z[0], z[1], z[2] < 3 ? 3 : z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        c = pool(L_MAX, nsp, 2, 1, 1);
        c.pd.dilation[0] = c.pd.dilation[1] = c.pd.dilation[2] = 2;
        gc(LAB("max dilation 2"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        c = pool(L_MAX, nsp, 2, 2, 0);
        c.pd.ceil_mode = true;
        gc(LAB("max ceil_mode"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        gc(LAB("avg k2"), pool(L_AVG, nsp, 2, 0, 0), SP(nsp, 2, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        gc(LAB("avg k3 s2 p1 count_include_pad"), pool(L_AVG, nsp, 3, 2, 1), SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        c = pool(L_AVG, nsp, 3, 2, 1);
        c.pd.no_count_include_pad = true;
        gc(LAB("avg k3 s2 p1 exclude pad"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        c = pool(L_AVG, nsp, 2, 2, 1);
        c.pd.ceil_mode = true;
        gc(LAB("avg ceil_mode pad 1"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        c.pd.no_count_include_pad = true;
        gc(LAB("avg ceil_mode pad 1 exclude pad"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        c = pool(L_ADAPT, nsp, 1, 1, 0);
        c.os = dl_shape_make(nsp, NULL);
        c.os.d[0] = 3; if (nsp > 1) c.os.d[1] = 3; if (nsp > 2) c.os.d[2] = 2;
        gc(LAB("adaptive avg (overlapping windows)"), c, SP(nsp, 2, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        c.os.d[0] = c.os.d[1] = c.os.d[2] = 1;
        gc(LAB("adaptive avg global"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(0, 0, 0, 0, 0, 0), 0);
        /* second order */
        c = conv(L_CONV, nsp, 2, 1, 1, 2);
        c.second = true;
        gc(LAB("second order conv (stride 2, pad 1, groups 2)"), c, SP(nsp, 1, 2, z[0], z[1], z[2]), SP(nsp, 2, 1, 2, 2, 2), 2);
        c = conv(L_CONVT, nsp, 2, 0, 1, 1);
        c.cd.output_padding[0] = 1;
        c.second = true;
        gc(LAB("second order convT (stride 2, output_padding 1)"), c, SP(nsp, 1, 2, 2, 2, 2), SP(nsp, 2, 1, 2, 2, 2), 1);
#undef LAB
    }
    {   /* second order pooling, unbatched inputs, asymmetric options */
        GC c = pool(L_MAX, 2, 2, 1, 0);
        c.second = true;
        gc("2d second order max pool (overlap)", c, SP(2, 1, 2, 4, 3, 1), SP(0, 0, 0, 0, 0, 0), 0);
        c = pool(L_AVG, 1, 3, 2, 1);
        c.second = true;
        gc("1d second order avg pool", c, SP(1, 1, 2, 6, 1, 1), SP(0, 0, 0, 0, 0, 0), 0);
        c = pool(L_ADAPT, 2, 1, 1, 0);
        c.os = DL_SHAPE(2, 3);
        c.second = true;
        gc("2d second order adaptive avg pool", c, SP(2, 1, 1, 5, 4, 1), SP(0, 0, 0, 0, 0, 0), 0);
        c = conv(L_CONV, 2, 1, 1, 1, 1);
        gc("2d conv unbatched (C,H,W)", c, DL_SHAPE(2, 4, 3), SP(2, 3, 2, 3, 2, 1), 3);
        c = conv(L_CONVT, 1, 2, 0, 1, 1);
        gc("1d convT unbatched (C,L)", c, DL_SHAPE(2, 3), SP(1, 2, 2, 3, 1, 1), 2);
        c = pool(L_MAX, 2, 2, 1, 0);
        gc("2d max pool unbatched", c, DL_SHAPE(2, 3, 3), SP(0, 0, 0, 0, 0, 0), 0);
        c = conv(L_CONV, 2, 1, 0, 1, 1);
        c.cd.stride[1] = 2; c.cd.padding[0] = 1; c.cd.dilation[1] = 2;
        gc("2d conv asymmetric stride/padding/dilation", c, SP(2, 1, 2, 4, 6, 1), SP(2, 2, 2, 3, 2, 1), 2);
        c = conv(L_CONV, 2, 1, 0, 1, 1);
        c.cd.padding_same = true;
        gc("2d conv padding_same kernel (2,3)", c, SP(2, 1, 2, 4, 4, 1), SP(2, 2, 2, 2, 3, 1), 2);
    }
    printf("%d gradcheck cases\n", n_gc);
}

/* ================================================================ errors */

static void errors(void)
{
    dl_ctx *c = g_ctx;
    dl_conv_desc d;
    dl_pool_desc pd;
    dl_tensor *x = dl_randn(c, DL_SHAPE(2, 3, 8, 8)), *w = dl_randn(c, DL_SHAPE(4, 3, 3, 3));
    dl_tensor *b = dl_randn(c, DL_SHAPE(4)), *y;
    dl_log_fn quiet = dl_log_silent;
    dl_set_log(c, quiet, NULL);

    /* NULL inputs: NULL, silently */
    CHECK(dl_conv2d(NULL, w, b, NULL) == NULL && dl_conv2d(x, NULL, NULL, NULL) == NULL &&
          dl_conv_transpose2d(NULL, w, NULL, NULL) == NULL && dl_max_pool2d(NULL, NULL) == NULL &&
          dl_avg_pool1d(NULL, NULL) == NULL && dl_adaptive_avg_pool2d(NULL, DL_SHAPE(1, 1)) == NULL &&
          dl_last_error(c) == DL_OK, "NULL inputs give NULL without an error: %s", dl_error_message(c));
    /* x with the wrong ndim */
    CHECK(dl_conv2d(dl_randn(c, DL_SHAPE(8, 8)), w, NULL, NULL) == NULL, "conv2d 2-d x");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv2d: x (8,8) must have 4 dims (N,C,H,W)");
    CHECK(dl_conv1d(x, w, NULL, NULL) == NULL, "conv1d 4-d x");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv1d: x (2,3,8,8) must have 3 dims");
    CHECK(dl_conv2d(x, dl_randn(c, DL_SHAPE(4, 3, 3)), NULL, NULL) == NULL, "conv2d 3-d w");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv2d: w (4,3,3) must have 4 dims");
    CHECK(dl_max_pool3d(dl_randn(c, DL_SHAPE(3, 8, 8)), NULL) == NULL, "max_pool3d 3-d x");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_max_pool3d: x (3,8,8) must have 5 dims");
    CHECK(dl_adaptive_avg_pool1d(dl_randn(c, DL_SHAPE(5)), DL_SHAPE(2)) == NULL, "adaptive 1-d x");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_adaptive_avg_pool1d: x (5) must have 3 dims");
    /* channels do not match w */
    CHECK(dl_conv2d(x, dl_randn(c, DL_SHAPE(4, 2, 3, 3)), NULL, NULL) == NULL, "channels");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv2d: x (2,3,8,8) has 3 channels but w (4,2,3,3) expects w.shape[1]*groups = 2*1 = 2");
    CHECK(dl_conv_transpose2d(x, dl_randn(c, DL_SHAPE(4, 3, 3, 3)), NULL, NULL) == NULL, "convT channels");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv_transpose2d: x (2,3,8,8) has 3 channels but w (4,3,3,3) expects w.shape[0] = 4");
    /* OC not divisible by groups */
    d = dl_conv_desc_make(1, 0, 1, 2);
    CHECK(dl_conv1d(dl_randn(c, DL_SHAPE(1, 4, 8)), dl_randn(c, DL_SHAPE(3, 2, 3)), NULL, &d) == NULL, "OC %% groups");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv1d: w (3,2,3) has 3 output channels (dim 0), not divisible by groups=2");
    /* C not divisible by groups */
    CHECK(dl_conv1d(dl_randn(c, DL_SHAPE(1, 3, 8)), dl_randn(c, DL_SHAPE(4, 1, 3)), NULL, &d) == NULL, "C %% groups");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv1d: x (1,3,8) has 3 channels, not divisible by groups=2");
    CHECK(dl_conv_transpose1d(dl_randn(c, DL_SHAPE(1, 3, 8)), dl_randn(c, DL_SHAPE(3, 1, 3)), NULL, &d) == NULL, "convT C %% groups");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv_transpose1d: x (1,3,8) has 3 channels, not divisible by groups=2");
    d = dl_conv_desc_make(1, 0, 1, -1);
    CHECK(dl_conv2d(x, w, NULL, &d) == NULL, "groups -1");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv2d: groups=-1 must be >= 1");
    /* kernel larger than the padded input */
    CHECK(dl_conv2d(dl_randn(c, DL_SHAPE(1, 3, 2, 8)), w, NULL, NULL) == NULL, "kernel > input");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv2d: x (1,3,2,8), w (4,3,3,3): spatial dim 0: the input padded to 2");
    d = dl_conv_desc_make(1, 0, 4, 1);
    CHECK(dl_conv2d(x, w, NULL, &d) == NULL, "dilated kernel > input");
    EXPECT_ERR(c, DL_ERR_SHAPE, "smaller than the dilated kernel 9");
    d = dl_conv_desc_make(1, 1, 1, 1);
    CHECK(dl_conv2d(dl_randn(c, DL_SHAPE(1, 3, 1, 1)), w, NULL, &d) != NULL, "k3 on a 1x1 input padded by 1 is fine");
    /* negative stride / dilation / padding */
    d = dl_conv_desc_make(-1, 0, 1, 1);
    CHECK(dl_conv2d(x, w, NULL, &d) == NULL, "stride -1");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv2d: stride[0]=-1 must be >= 1");
    d = dl_conv_desc_make(1, 0, 1, 1);
    d.dilation[1] = -2;
    CHECK(dl_conv2d(x, w, NULL, &d) == NULL, "dilation -2");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv2d: dilation[1]=-2 must be >= 1");
    d = dl_conv_desc_make(1, -1, 1, 1);
    CHECK(dl_conv_transpose2d(x, dl_randn(c, DL_SHAPE(3, 2, 3, 3)), NULL, &d) == NULL, "padding -1");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv_transpose2d: padding[0]=-1 must be >= 0");
    /* padding_same */
    d = dl_conv_desc_make(2, 0, 1, 1);
    d.padding_same = true;
    CHECK(dl_conv2d(x, w, NULL, &d) == NULL, "same with stride 2");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv2d: padding_same needs stride 1");
    d = dl_conv_desc_make(1, 0, 1, 1);
    d.padding_same = true;
    CHECK(dl_conv_transpose2d(x, dl_randn(c, DL_SHAPE(3, 2, 3, 3)), NULL, &d) == NULL, "same on convT");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv_transpose2d: padding_same applies to dl_conv*d only");
    /* output_padding */
    d = dl_conv_desc_make(2, 0, 2, 1);
    d.output_padding[1] = 2;
    CHECK(dl_conv_transpose2d(x, dl_randn(c, DL_SHAPE(3, 2, 3, 3)), NULL, &d) == NULL, "output_padding 2, stride 2, dilation 2");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv_transpose2d: output_padding[1]=2 must be smaller than either stride (2) or dilation (2)");
    d.output_padding[1] = -1;
    CHECK(dl_conv_transpose2d(x, dl_randn(c, DL_SHAPE(3, 2, 3, 3)), NULL, &d) == NULL, "output_padding -1");
    EXPECT_ERR(c, DL_ERR_ARG, "output_padding[1]=-1 must be >= 0");
    d = dl_conv_desc_make(1, 0, 1, 1);
    d.output_padding[0] = 1;
    CHECK(dl_conv2d(x, w, NULL, &d) == NULL, "output_padding on conv");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_conv2d: output_padding[0]=1 applies to transposed convolution only");
    d = dl_conv_desc_make(1, 0, 3, 1);
    d.output_padding[0] = 2;   /* < dilation: allowed, as PyTorch */
    y = dl_conv_transpose1d(dl_randn(c, DL_SHAPE(1, 2, 4)), dl_randn(c, DL_SHAPE(2, 1, 2)), NULL, &d);
    CHECK(y && y->shape[2] == 4 - 1 + 3 + 2 + 1, "output_padding 2 with stride 1 dilation 3: size %lld", y ? (long long)y->shape[2] : -1LL);
    d = dl_conv_desc_make(1, 3, 1, 1);
    CHECK(dl_conv_transpose1d(dl_randn(c, DL_SHAPE(1, 2, 2)), dl_randn(c, DL_SHAPE(2, 1, 2)), NULL, &d) == NULL, "convT output < 1");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv_transpose1d: x (1,2,2), w (2,1,2): spatial dim 0: output size");
    d = dl_conv_desc_make(1, 1, 1, 1);   /* an output size of 0: batched, empty (as PyTorch); unbatched, refused */
    y = dl_conv_transpose2d(dl_randn(c, DL_SHAPE(2, 2, 1, 1)), dl_randn(c, DL_SHAPE(2, 3, 2, 2)), NULL, &d);
    CHECK(y && y->ndim == 4 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 0 && y->numel == 0,
          "convT batched, output size 0: an empty (2,3,0,0): %s", dl_error_message(c));
    CHECK(dl_conv_transpose2d(dl_randn(c, DL_SHAPE(2, 1, 1)), dl_randn(c, DL_SHAPE(2, 3, 2, 2)), NULL, &d) == NULL,
          "convT unbatched, output size 0");
    EXPECT_ERR(c, DL_ERR_SHAPE, "= 0 is < 1 (an unbatched x; a batched one gives an empty result at 0, as PyTorch)");
    /* b with the wrong size */
    CHECK(dl_conv2d(x, w, dl_randn(c, DL_SHAPE(3)), NULL) == NULL, "b (3)");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv2d: b (3) must be (OC) = (4)");
    CHECK(dl_conv_transpose2d(x, dl_randn(c, DL_SHAPE(3, 2, 3, 3)), dl_randn(c, DL_SHAPE(3)), NULL) == NULL, "convT b (3)");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_conv_transpose2d: b (3) must be (OC) = (2)");
    CHECK(dl_conv2d(x, w, dl_randn(c, DL_SHAPE(4, 1)), NULL) == NULL, "b (4,1)");
    EXPECT_ERR(c, DL_ERR_SHAPE, "b (4,1) must be (OC) = (4)");
    /* dtype */
    {
        int64_t iv[4] = {1, 2, 3, 4};
        CHECK(dl_conv1d(x, w, dl_from_int64(c, DL_SHAPE(4), iv), NULL) == NULL, "int64 b");
        EXPECT_ERR(c, DL_ERR_DTYPE, "dl_conv1d: b (4) has dtype int64");
    }
    /* pooling */
    CHECK(dl_max_pool2d(x, NULL) == NULL, "NULL pool desc");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_max_pool2d: desc is NULL; the kernel size is required "
               "(dl_pool_desc_make(kernel, stride, padding, ceil_mode, count_include_pad))");
    CHECK(dl_nn_avg_pool2d(c, NULL) == NULL, "NULL pool desc for a module");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_nn_avg_pool: a dl_pool_desc is required "
               "(dl_pool_desc_make(kernel, stride, padding, ceil_mode, count_include_pad))");
    pd = dl_pool_desc_make(2, 0, 0, false, true);
    pd.kernel[1] = 0;
    CHECK(dl_max_pool2d(x, &pd) == NULL, "kernel 0");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_max_pool2d: kernel[1]=0 must be >= 1");
    pd = dl_pool_desc_make(3, 1, 2, false, true);
    CHECK(dl_avg_pool2d(x, &pd) == NULL, "pad > kernel/2");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_avg_pool2d: padding[0]=2 must be between 0 and half the kernel size (kernel[0]=3)");
    pd = dl_pool_desc_make(2, 1, 1, false, true);
    CHECK(dl_max_pool1d(dl_randn(c, DL_SHAPE(1, 2, 5)), &pd) != NULL, "pad = kernel/2 is fine");
    pd = dl_pool_desc_make(2, -1, 0, false, true);
    CHECK(dl_max_pool2d(x, &pd) == NULL, "pool stride -1");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_max_pool2d: stride[0]=-1 must be >= 1");
    pd = dl_pool_desc_make(2, 0, 0, false, true);
    pd.dilation[0] = 2;
    CHECK(dl_avg_pool2d(x, &pd) == NULL, "avg dilation");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_avg_pool2d: dilation[0]=2: dilation applies to max pooling only");
    pd = dl_pool_desc_make(9, 1, 0, false, true);
    CHECK(dl_max_pool2d(x, &pd) == NULL, "pool kernel > input");
    EXPECT_ERR(c, DL_ERR_SHAPE, "dl_max_pool2d: x (2,3,8,8): spatial dim 0 of size 8 with padding 0 is smaller than the window 9");
    CHECK(dl_adaptive_avg_pool2d(x, DL_SHAPE(2)) == NULL, "adaptive output_size ndim");
    EXPECT_ERR(c, DL_ERR_ARG, "dl_adaptive_avg_pool2d: output_size (2) has 1 entries; it needs one per spatial dim (2)");
    CHECK(dl_adaptive_avg_pool2d(x, DL_SHAPE(2, -1)) == NULL, "adaptive negative");
    EXPECT_ERR(c, DL_ERR_ARG, "output_size (2,-1) has a negative entry");
    /* mixed devices (a tensor marked as on cuda:0; no data is touched before the check) */
    {
        dl_device home = w->device, other = dl_cuda(x->device.type == DL_DEVICE_CUDA && x->device.index == 0);
        char want[128];
        snprintf(want, sizeof want, "dl_conv2d: x (2,3,8,8) is on %s but w (4,3,3,3) is on %s",
                 dl_device_name(x->device), dl_device_name(other));
        w->device = other;
        CHECK(dl_conv2d(x, w, NULL, NULL) == NULL, "mixed devices");
        EXPECT_ERR(c, DL_ERR_DEVICE, want);
        w->device = home;
        home = b->device;
        b->device = dl_cuda(1);
        CHECK(dl_conv_transpose2d(x, dl_randn(c, DL_SHAPE(3, 4, 3, 3)), b, NULL) == NULL, "mixed devices b");
        EXPECT_ERR(c, DL_ERR_DEVICE, "b (4) is on cuda:1");
        b->device = home;
    }
    /* a stale tensor */
    {
        dl_tensor *old = dl_randn(c, DL_SHAPE(1, 3, 8, 8));
        dl_step_end(c);
        x = dl_randn(c, DL_SHAPE(2, 3, 8, 8));
        w = dl_randn(c, DL_SHAPE(4, 3, 3, 3));
        CHECK(dl_conv2d(old, w, NULL, NULL) == NULL, "stale x");
        EXPECT_ERR(c, DL_ERR_STALE, "dl_conv2d: x (1,3,8,8) was made in step");
    }
    /* out of memory in the convolution scratch (memory_limit), then the context still works */
    {
        dl_ctx_desc cdesc;
        dl_ctx *m;
        dl_conv_desc p2 = dl_conv_desc_make(1, 2, 1, 1);
        memset(&cdesc, 0, sizeof cdesc);
        cdesc.memory_limit = (size_t)3 << 20;
        cdesc.log = dl_log_silent;
        m = dl_ctx_init(&cdesc);
        dl_conv_desc s2 = dl_conv_desc_make(2, 2, 1, 1);
        /* a sample's im2col matrix of 2 * 81 x 62 * 62 floats: over conv_i2c's
           limit, so whole-batch im2col, whose scratch passes the limit (26
           outputs of 2 * 81 products: too many for CUDA's direct path, which
           needs no scratch) */
        y = dl_conv2d(dl_zeros(m, DL_SHAPE(2, 2, 128, 128)), dl_zeros(m, DL_SHAPE(26, 2, 9, 9)), NULL, &s2);
        if (conv_dnn_all(m)) {
            /* a real GPU with DL_CUDNN=2 gives this conv to cuDNN, whose
               implicit GEMM needs no im2col scratch: it fits */
            CHECK(y && y->shape[2] == 62 && dl_last_error(m) == DL_OK, "conv2d (stride 2) by cuDNN within memory_limit: %s",
                  dl_error_message(m));
        } else {
            CHECK(y == NULL, "conv2d (stride 2: im2col) past memory_limit");
            EXPECT_ERR(m, DL_ERR_OOM, "dl_conv: cannot allocate");
        }
        dl_step_end(m);
        /* with one channel conv_i2c takes it: the CPU's a sample at a time in
           thread buffers (no scratch in step memory), CUDA's in chunks of
           step memory halved until they fit */
        y = dl_conv2d(dl_zeros(m, DL_SHAPE(8, 1, 128, 128)), dl_zeros(m, DL_SHAPE(8, 1, 5, 5)), NULL, &s2);
        CHECK(y && y->shape[2] == 64 && dl_last_error(m) == DL_OK, "conv2d (stride 2: conv_i2c) within memory_limit: %s",
              dl_error_message(m));
        dl_step_end(m);
        /* stride 1: the padded grid's scratch */
        y = dl_conv2d(dl_zeros(m, DL_SHAPE(4, 16, 64, 64)), dl_zeros(m, DL_SHAPE(16, 16, 5, 5)), NULL, &p2);
        CHECK(y == NULL, "conv2d (stride 1: padded grid) past memory_limit");
        EXPECT_ERR(m, DL_ERR_OOM, "dl_conv: cannot allocate");
        dl_step_end(m);
        y = dl_conv2d(dl_ones(m, DL_SHAPE(1, 1, 8, 8)), dl_ones(m, DL_SHAPE(2, 1, 3, 3)), NULL, &p2);
        CHECK(y && y->shape[3] == 10 && th_f(y, 2 * 10 + 2) == 9.0f && th_f(y, 0) == 1.0f && dl_last_error(m) == DL_OK, "conv2d after OOM: %s", dl_error_message(m));
        dl_ctx_free(m);
    }
    /* an empty batch: empty output, zero weight gradient */
    {
        dl_tensor *x0 = dl_zeros(c, DL_SHAPE(0, 3, 8, 8)), *w0 = dl_requires_grad(dl_randn(c, DL_SHAPE(4, 3, 3, 3)), true);
        dl_tensor *g0 = NULL;
        dl_pool_desc p0 = dl_pool_desc_make(2, 0, 0, false, true);
        y = dl_sum(dl_max_pool2d(dl_conv2d(x0, w0, NULL, NULL), &p0), DL_ALL, false);
        CHECK(y && dl_item(y) == 0.0f && dl_grad(y, 1, &w0, &g0, NULL) == DL_OK && g0 &&
              th_f(g0, 0) == 0.0f && th_f(g0, g0->numel - 1) == 0.0f, "empty batch: %s", dl_error_message(c));
    }
    /* the context still works */
    y = dl_conv2d(x, w, NULL, NULL);
    CHECK(y && y->shape[2] == 6 && dl_last_error(c) == DL_OK, "conv2d after the errors: %s", dl_error_message(c));
    pd = dl_pool_desc_make(2, 0, 0, false, true);
    y = dl_max_pool2d(y, &pd);
    CHECK(y && y->shape[3] == 3 && dl_last_error(c) == DL_OK, "max_pool2d after the errors: %s", dl_error_message(c));
    dl_set_log(c, NULL, NULL);
    dl_step_end(c);
}

/* ================================================================ threads, memory, timing */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* conv2d + max pool + conv_transpose2d forward and backward; all results into buf */
static int det_run(dl_ctx *c, float *buf)
{
    dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 2);
    dl_pool_desc p = dl_pool_desc_make(3, 2, 1, false, true);
    dl_tensor *x, *w, *w2, *y, *in[3], *g[3];
    int64_t off = 0;
    int k;
    dl_manual_seed(c, 7);
    x = dl_requires_grad(dl_randn(c, DL_SHAPE(9, 4, 23, 21)), true);
    w = dl_requires_grad(dl_randn(c, DL_SHAPE(8, 2, 3, 3)), true);
    w2 = dl_requires_grad(dl_randn(c, DL_SHAPE(8, 3, 2, 2)), true);
    y = dl_max_pool2d(dl_relu(dl_conv2d(x, w, NULL, &d)), &p);
    d = dl_conv_desc_make(2, 0, 1, 1);
    y = dl_conv_transpose2d(y, w2, NULL, &d);
    y = dl_sum(dl_mul(y, y), DL_ALL, false);
    in[0] = x; in[1] = w; in[2] = w2;
    if (!y || dl_grad(y, 3, in, g, NULL) != DL_OK) return -1;
    buf[off++] = dl_item(y);
    for (k = 0; k < 3; k++) {
        if (dl_read(g[k], buf + off, g[k]->numel) != DL_OK) return -1;
        off += g[k]->numel;
    }
    dl_step_end(c);
    return (int)off;
}

static void threads_and_memory(void)
{
    dl_ctx *c = dl_ctx_init(NULL);
    float *ref = (float *)malloc(sizeof(float) * 200000), *got = (float *)malloc(sizeof(float) * 200000);
    int n1, n, t;
    dl_memory_stats m1, m2;
    if (!c || !ref || !got) { CHECK(0, "threads: setup"); free(ref); free(got); dl_ctx_free(c); return; }
    dl_set_num_threads(c, 1);
    n1 = det_run(c, ref);
    CHECK(n1 > 0, "deterministic run, 1 thread: %s", dl_error_message(c));
    for (t = 2; t <= 3 && n1 > 0; t++) {
        dl_set_num_threads(c, t);
        n = det_run(c, got);
        CHECK(n == n1 && memcmp(ref, got, sizeof(float) * (size_t)n1) == 0,
              "conv/pool results with %d threads differ from 1 thread", t);
    }
    /* flat memory: the same step again allocates nothing */
    /* on the host (headers, tape, the library's objects) and on the default device (data) */
    for (t = 0; t < 2; t++) {
        dl_device dev = t ? dl_ctx_device(c) : dl_cpu();
        det_run(c, got);
        dl_memory_stats_get(c, dev, &m1);
        det_run(c, got);
        dl_memory_stats_get(c, dev, &m2);
        CHECK(m1.alloc_calls == m2.alloc_calls, "a repeated conv training step called the allocator of %s %llu "
              "more times", dl_device_name(dev), (unsigned long long)(m2.alloc_calls - m1.alloc_calls));
    }
    free(ref);
    free(got);
    dl_ctx_free(c);
}

static void timing(void)
{
    dl_ctx *c = dl_ctx_init(NULL);
    dl_conv_desc d = dl_conv_desc_make(1, 2, 1, 1);
    double best[2] = {1e30, 1e30}, bestp = 1e30;
    int rep, xg;
    if (!c) return;
    for (xg = 0; xg < 2; xg++)
        for (rep = 0; rep < 5; rep++) {
            dl_tensor *x = dl_rand(c, DL_SHAPE(256, 1, 28, 28)), *w, *b, *y;
            dl_backward_desc bd;
            double t0, t1;
            w = dl_requires_grad(dl_mul_scalar(dl_randn(c, DL_SHAPE(6, 1, 5, 5)), 0.2f), true);
            b = dl_requires_grad(dl_zeros(c, DL_SHAPE(6)), true);
            if (xg) dl_requires_grad(x, true);
            memset(&bd, 0, sizeof bd);
            t0 = now_ms();
            y = dl_conv2d(x, w, b, &d);
            bd.grad = dl_ones_like(y);
            dl_backward_ex(y, &bd);
            t1 = now_ms();
            if (t1 - t0 < best[xg]) best[xg] = t1 - t0;
            CHECK(y && w->grad && (!xg || x->grad), "timing run: %s", dl_error_message(c));
            dl_step_end(c);
        }
    for (rep = 0; rep < 5; rep++) {
        dl_tensor *x = dl_requires_grad(dl_rand(c, DL_SHAPE(256, 6, 28, 28)), true), *y;
        dl_pool_desc p = dl_pool_desc_make(2, 2, 0, false, true);
        double t0 = now_ms(), t1;
        y = dl_sum(dl_avg_pool2d(x, &p), DL_ALL, false);
        dl_backward(y);
        y = dl_sum(dl_max_pool2d(x, &p), DL_ALL, false);
        dl_backward(y);
        t1 = now_ms();
        if (t1 - t0 < bestp) bestp = t1 - t0;
        dl_step_end(c);
    }
    printf("timing (best of 5, %d threads): conv2d 256x1x28x28 -> 6x5x5 pad 2, forward + backward: "
           "%.2f ms (dx not needed), %.2f ms (with dx); avg+max pool 2x2 on 256x6x28x28 fwd+bwd: %.2f ms\n",
           dl_num_threads(c), best[0], best[1], bestp);
    /* printed, not checked: sanitizer builds and loaded machines are far slower */
    dl_ctx_free(c);
}

/* ================================================================ main */

/* ================================================================ 5. the two paths */

/* the CPU backend without its Winograd entries (section 7 compares them), named */
static dl__backend cpu_direct(const char *name)
{
    dl__backend b = *dl__cpu_be();
    b.name = name;
    b.conv_wg = NULL;
    b.conv_wg_wgrad = NULL;
    b.conv_i2c = NULL;
    return b;
}

static dl__backend g_no_s1;   /* the CPU backend without conv_s1: im2col + gemm */
static dl__backend g_s1;      /* the CPU backend, counting its conv_s1 calls */
static dl__backend g_grid;    /* the CPU backend with the grid variant only (not the rows) */
static int64_t g_s1_calls, g_wg_calls;

static bool count_wg(dl__dev *d, float *dw, const float *x, const float *gy, float *scratch, int64_t n,
                     const dl__cgeom *g, float beta)
{
    g_wg_calls++;
    return dl__cpu_conv_s1_wgrad(d, dw, x, gy, scratch, n, g, beta);
}

static void count_s1(dl__dev *d, float *y, const float *x, const float *w, const float *bias, float *scratch,
                     int64_t n, const dl__cgeom *g, bool flip)
{
    g_s1_calls++;
    dl__cpu_conv_s1(d, y, x, w, bias, scratch, n, g, flip);
}

static int64_t g_grid_wg_calls, g_grid_wg_declined;

static bool grid_wg(dl__dev *d, float *dw, const float *x, const float *gy, float *scratch, int64_t n,
                    const dl__cgeom *g, float beta)
{
    bool done = dl__cpu_conv_s1_wgrad_grid(d, dw, x, gy, scratch, n, g, beta);
    g_grid_wg_calls++;
    g_grid_wg_declined += !done;
    return done;
}

static void grid_s1(dl__dev *d, float *y, const float *x, const float *w, const float *bias, float *scratch,
                    int64_t n, const dl__cgeom *g, bool flip)
{
    dl__cpu_conv_s1_grid(d, y, x, w, bias, scratch, n, g, flip);
}

static float max_rel(const float *a, const float *b, int64_t n)
{
    double m = 0, scale = 1e-3;
    int64_t i;
    for (i = 0; i < n; i++) if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
    for (i = 0; i < n; i++) if (fabs((double)a[i] - (double)b[i]) / scale > m) m = fabs((double)a[i] - (double)b[i]) / scale;
    return (float)m;
}

/* conv (or conv_transpose) forward + backward of x, w, b on device dev:
   out = y, dx, dw, db concatenated; returns the count, 0 on error */
static int64_t s1_run(dl_ctx *c, int dev, int nsp, bool transposed, const int64_t *xs, const int64_t *ws, bool bias,
                      const dl_conv_desc *d, const float *xv, const float *wv, float *out)
{
    dl_tensor *x, *w, *b = NULL, *y, *r;
    int64_t n = 0, bs[1];
    dl_shape xsh, wsh;
    int i;
    memset(&xsh, 0, sizeof xsh);
    memset(&wsh, 0, sizeof wsh);
    xsh.ndim = wsh.ndim = nsp + 2;
    for (i = 0; i < nsp + 2; i++) { xsh.d[i] = xs[i]; wsh.d[i] = ws[i]; }
    bs[0] = transposed ? ws[1] : ws[0];
    dl_set_device(c, dl_cpu_device(dev));
    x = dl_requires_grad(dl_from_array(c, xsh, xv), true);
    w = dl_requires_grad(dl_from_array(c, wsh, wv), true);
    if (bias) b = dl_requires_grad(dl_from_array(c, DL_SHAPE(bs[0]), wv), true);
    if (!transposed)
        y = nsp == 1 ? dl_conv1d(x, w, b, d) : nsp == 2 ? dl_conv2d(x, w, b, d) : dl_conv3d(x, w, b, d);
    else
        y = nsp == 1 ? dl_conv_transpose1d(x, w, b, d) : nsp == 2 ? dl_conv_transpose2d(x, w, b, d)
                     : dl_conv_transpose3d(x, w, b, d);
    if (!y) return 0;
    {
        dl_shape ysh;
        float *rv = (float *)malloc(sizeof(float) * (size_t)y->numel);
        int64_t j;
        if (!rv) return 0;
        ysh.ndim = y->ndim;
        for (i = 0; i < y->ndim; i++) ysh.d[i] = y->shape[i];
        for (j = 0; j < y->numel; j++) rv[j] = sinf(0.13f * (float)j);    /* a fixed, uneven upstream gradient */
        r = dl_from_array(c, ysh, rv);
        free(rv);
    }
    if (dl_backward(dl_sum(dl_mul(y, r), DL_ALL, false)) != DL_OK) return 0;
    dl_read(y, out, y->numel);
    n += y->numel;
    dl_read(x->grad, out + n, x->numel);
    n += x->numel;
    dl_read(w->grad, out + n, w->numel);
    n += w->numel;
    if (b) { dl_read(b->grad, out + n, b->numel); n += b->numel; }
    dl_set_device(c, dl_cpu_device(0));
    return n;
}

static void s1_paths(void)
{
    static const int64_t geo[][8] = {   /* nsp, size, kernel, dilation, C in, C out, batch, (3-D: depth) */
        {2, 8, 3, 1, 3, 4, 2, 0}, {2, 7, 5, 1, 1, 6, 3, 0}, {2, 9, 3, 2, 2, 3, 1, 0}, {2, 6, 1, 1, 5, 2, 2, 0},
        {2, 5, 2, 1, 2, 2, 4, 0}, {1, 13, 3, 1, 2, 3, 3, 0}, {1, 11, 4, 3, 3, 2, 2, 0}, {3, 5, 3, 1, 2, 2, 2, 4},
        {3, 6, 2, 2, 1, 3, 1, 6}, {2, 28, 3, 1, 16, 16, 2, 0}, {2, 12, 5, 1, 6, 16, 3, 0},
    };
    dl_ctx_desc cd;
    dl_ctx *c;
    int gi, pad, tr, bias, i;
    float *xv = (float *)malloc(sizeof(float) * 100000), *wv = (float *)malloc(sizeof(float) * 100000);
    float *o1 = (float *)malloc(sizeof(float) * 400000), *o2 = (float *)malloc(sizeof(float) * 400000);
    float *o3 = (float *)malloc(sizeof(float) * 400000);
    memset(&cd, 0, sizeof cd);
    cd.cpu_devices = 3;
    c = dl_ctx_init(&cd);
    if (!c || !xv || !wv || !o1 || !o2 || !o3) { CHECK(0, "s1_paths: setup"); goto out; }
    g_no_s1 = cpu_direct("cpu-without-conv_s1");
    g_no_s1.conv_s1 = NULL;
    g_no_s1.conv_s1_wgrad = NULL;
    c->cpu[1]->be = &g_no_s1;
    g_s1 = cpu_direct(dl__cpu_be()->name);
    g_s1.conv_s1 = count_s1;
    g_s1.conv_s1_wgrad = count_wg;
    c->cpu[0]->be = &g_s1;
    g_grid = cpu_direct("cpu-grid-only");
    g_grid.conv_s1 = grid_s1;
    g_grid.conv_s1_wgrad = grid_wg;
    c->cpu[2]->be = &g_grid;
    for (i = 0; i < 100000; i++) { xv[i] = sinf(0.37f * (float)i) + 0.25f; wv[i] = cosf(0.91f * (float)i) * 0.5f; }
    for (gi = 0; gi < (int)(sizeof geo / sizeof geo[0]); gi++) {
        int nsp = (int)geo[gi][0];
        int64_t L = geo[gi][1], k = geo[gi][2], dil = geo[gi][3], ca = geo[gi][4], cb = geo[gi][5], nb = geo[gi][6];
        for (pad = 0; pad <= dil * (k - 1) + 1; pad++)
            for (tr = 0; tr < 2; tr++)
                for (bias = 0; bias < 2; bias++) {
                    int64_t xs[5], ws[5], n1, n2, n3, ny = 1, span, calls, wcalls;
                    int v;
                    dl_conv_desc d = dl_conv_desc_make(1, pad, dil, 1);
                    xs[0] = nb;
                    xs[1] = tr ? cb : ca;          /* conv: w (cb, ca, k); transposed: x has cb channels */
                    ws[0] = cb;
                    ws[1] = ca;
                    for (i = 0; i < nsp; i++) {
                        xs[2 + i] = nsp == 3 && i == 0 ? geo[gi][7] : L + i;
                        ws[2 + i] = k;
                    }
                    span = dil * (k - 1) + 1;
                    for (i = 0; i < nsp; i++) ny *= tr ? xs[2 + i] - 2 * pad + span - 1 : xs[2 + i] + 2 * pad - span + 1;
                    if (ny <= 0) continue;
                    calls = g_s1_calls;
                    wcalls = g_wg_calls;
                    n1 = s1_run(c, 0, nsp, tr != 0, xs, ws, bias != 0, &d, xv, wv, o1);
                    CHECK(g_wg_calls - wcalls == 1, "s1 %s %dd k %lld dil %lld pad %d: %lld calls of "
                          "conv_s1_wgrad, want 1", tr ? "conv_transpose" : "conv", nsp, (long long)k,
                          (long long)dil, pad, (long long)(g_wg_calls - wcalls));
                    /* conv: forward; its input gradient when pad <= d(k-1). transposed: the reverse */
                    CHECK(g_s1_calls - calls == 1 + (pad <= span - 1), "s1 %s %dd k %lld dil %lld pad %d: "
                          "%lld calls of conv_s1, want %d", tr ? "conv_transpose" : "conv", nsp, (long long)k,
                          (long long)dil, pad, (long long)(g_s1_calls - calls), 1 + (pad <= span - 1));
                    n2 = s1_run(c, 1, nsp, tr != 0, xs, ws, bias != 0, &d, xv, wv, o2);
                    CHECK(n1 > 0 && n1 == n2, "s1 %s: %dd size %lld k %lld dil %lld pad %d: %s",
                          tr ? "conv_transpose" : "conv", nsp, (long long)L, (long long)k, (long long)dil, pad,
                          dl_error_message(c));
                    if (n1 <= 0 || n1 != n2) { dl_clear_error(c); dl_step_end(c); continue; }
                    n3 = s1_run(c, 2, nsp, tr != 0, xs, ws, bias != 0, &d, xv, wv, o3);
                    CHECK(n3 == n2, "s1 grid only %s: %dd size %lld k %lld dil %lld pad %d: %s",
                          tr ? "conv_transpose" : "conv", nsp, (long long)L, (long long)k, (long long)dil, pad,
                          dl_error_message(c));
                    for (v = 0; v < (n3 == n2 ? 2 : 1); v++) {   /* the CPU's choice (rows or grid), the grid */
                        int64_t nyv = 1, nx = 1;
                        float ey, ex, ew, *o = v ? o3 : o1;
                        const char *what = v ? "grid only" : "rows or grid";
                        for (i = 0; i < nsp + 2; i++) nx *= xs[i];
                        nyv = nb * (tr ? ca : cb) * ny;
                        ey = max_rel(o, o2, nyv);
                        ex = max_rel(o + nyv, o2 + nyv, nx);
                        ew = max_rel(o + nyv + nx, o2 + nyv + nx, n1 - nyv - nx);
                        if (!tr)
                            CHECK(ey == 0 && ew < 1e-5f && ex < 1e-5f, "s1 conv %dd size %lld k %lld dil %lld pad %d "
                                  "bias %d: %s vs im2col: y %g (want 0), dw/db %g, dx %g",
                                  nsp, (long long)L, (long long)k, (long long)dil, pad, bias, what, ey, ew, ex);
                        else
                            CHECK(ey < 1e-5f && ex == 0 && ew < 1e-5f, "s1 conv_transpose %dd size %lld k %lld "
                                  "dil %lld pad %d bias %d: %s vs col2im: y %g, dx %g (want 0), dw/db %g",
                                  nsp, (long long)L, (long long)k, (long long)dil, pad, bias, what, ey, ex, ew);
                    }
                    dl_step_end(c);
                }
    }
    /* inf in x: the grid declines the weight gradient (its margins' 0 * inf
       would make NaN where the true gradient is finite) and im2col does it,
       bit for bit; the CPU's choice (the row variant, which multiplies
       im2col's terms, where it applies) gives im2col's inf and NaN and
       its finite values within rounding */
    {
        int64_t xs[4] = {2, 3, 8, 8}, ws[4] = {4, 3, 3, 3}, n1, n2, n3, j, bad = 0;
        int64_t gcalls = g_grid_wg_calls, gdecl = g_grid_wg_declined;
        dl_conv_desc d = dl_conv_desc_make(1, 1, 1, 1);
        xv[7] = INFINITY;                          /* the last column of the first row */
        n1 = s1_run(c, 0, 2, false, xs, ws, false, &d, xv, wv, o1);
        n2 = s1_run(c, 1, 2, false, xs, ws, false, &d, xv, wv, o2);
        n3 = s1_run(c, 2, 2, false, xs, ws, false, &d, xv, wv, o3);
        CHECK(g_grid_wg_calls - gcalls == 1 && g_grid_wg_declined - gdecl == 1,
              "inf in x: the grid's weight gradient called %lld times, declined %lld, want 1 and 1",
              (long long)(g_grid_wg_calls - gcalls), (long long)(g_grid_wg_declined - gdecl));
        CHECK(n3 > 0 && n3 == n2 && memcmp(o3 + n3 - 108, o2 + n2 - 108, sizeof(float) * 108) == 0,
              "inf in x: the grid's weight gradient is im2col's, bit for bit");
        for (j = n2 - 108; n1 == n2 && j < n2; j++) {
            float a = o1[j], b = o2[j];
            if (isfinite(b) ? !(fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b))) : !(a == b || (a != a && b != b))) bad++;
        }
        CHECK(n1 > 0 && n1 == n2 && bad == 0, "inf in x: the CPU's weight gradient differs from im2col's at %lld "
              "of 108 (inf and NaN where im2col has them, the rest within 1e-5)", (long long)bad);
        xv[7] = sinf(0.37f * 7.0f) + 0.25f;
        dl_step_end(c);
    }
out:
    free(xv); free(wv); free(o1); free(o2); free(o3);
    if (c) c->cpu[0]->be = dl__cpu_be();
    dl_ctx_free(c);
}

/* The fixture of sections 7 and 8: a context with two CPU devices (the
   path under test and its reference) and cap floats each of input values,
   weight values and three outputs */
typedef struct path_fix { dl_ctx *c; float *xv, *wv, *o1, *o2, *o3; } path_fix;

static bool path_open(path_fix *f, size_t cap, const char *who)
{
    dl_ctx_desc cd;
    size_t i;
    memset(&cd, 0, sizeof cd);
    cd.cpu_devices = 2;
    f->c = dl_ctx_init(&cd);
    f->xv = (float *)malloc(sizeof(float) * cap);
    f->wv = (float *)malloc(sizeof(float) * cap);
    f->o1 = (float *)malloc(sizeof(float) * cap);
    f->o2 = (float *)malloc(sizeof(float) * cap);
    f->o3 = (float *)malloc(sizeof(float) * cap);
    if (!f->c || !f->xv || !f->wv || !f->o1 || !f->o2 || !f->o3) {
        CHECK(0, "%s: setup", who);
        return false;
    }
    for (i = 0; i < cap; i++) {
        f->xv[i] = sinf(0.37f * (float)i) + 0.25f;
        f->wv[i] = cosf(0.91f * (float)i) * 0.25f;
    }
    return true;
}

static void path_close(path_fix *f)
{
    free(f->xv); free(f->wv); free(f->o1); free(f->o2); free(f->o3);
    dl_ctx_free(f->c);
}

/* ================================================================ 7. Winograd */

/* 3x3 stride-1 convs with channels in multiples of 16 go through conv_wg
   (Winograd's F(2x2, 3x3)) where the backend has it: device 0 has the CPU
   backend (counting the calls), device 1 the same without conv_wg, so the
   direct paths. Forward, input gradient (conv_wg with flip), weight gradient
   and bias gradient within rounding of the direct sums; conv_transpose
   likewise; odd, even, 1-sized and non-square planes, padding 0 to 2, blocks
   of samples and chunks that do not divide the batch, channel counts that
   split the GEMMs' columns (16, 48, 80). Bits equal on 1 and 2 threads.
   An operand with inf or NaN: declined, and the direct path's bits. */
#ifdef DL__WG
static dl__backend g_wgc, g_nowg;
static int64_t g_wg_fwd, g_wg_flip, g_wg_w, g_wg_declined;
static int g_wg_tile;   /* 2 or 4: F(2x2, 3x3) or F(4x4, 3x3) */

static bool count_wgf(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                      const dl__cgeom *g, bool flip)
{
    bool ok = dl__wg_conv(d, y, x, w, bias, n, g, flip, g_wg_tile);
    if (flip) g_wg_flip += ok;
    else g_wg_fwd += ok;
    g_wg_declined += !ok;
    return ok;
}

static bool count_wgw(dl__dev *d, float *dw, const float *x, const float *gy, int64_t n, const dl__cgeom *g)
{
    bool ok = dl__wg_wgrad(d, dw, x, gy, n, g, g_wg_tile);
    g_wg_w += ok;
    g_wg_declined += !ok;
    return ok;
}

static void wg_paths(int tile)
{
    static const int64_t geo[][6] = {   /* batch, C in, C out, height, width, pad */
        {2, 16, 16, 8, 8, 1}, {3, 16, 32, 7, 7, 1}, {1, 32, 16, 4, 4, 1}, {5, 16, 48, 5, 6, 0},
        {2, 48, 16, 9, 5, 2}, {20, 16, 16, 4, 4, 1}, {11, 32, 80, 3, 3, 1}, {3, 16, 16, 1, 1, 1},
        {2, 16, 16, 2, 3, 0}, {2, 16, 32, 14, 14, 1}, {1, 16, 16, 28, 28, 1}, {17, 64, 16, 2, 2, 2},
        {4, 16, 16, 6, 3, 2}, {9, 16, 32, 3, 5, 0},
    };
    /* F(4x4, 3x3)'s transforms have larger constants (8 in A, 1/24 in G):
       its rounding is about 10 times F(2x2, 3x3)'s (measured here: up to
       4.7e-5 against 4.3e-6) */
    const float tol = tile == 4 ? 1e-4f : 1e-5f;
    path_fix F;
    dl_ctx *c;
    float *xv, *wv, *o1, *o2, *o3;
    int gi, tr, bias, i, th;
    if (!path_open(&F, 600000, "wg_paths")) goto out;
    c = F.c; xv = F.xv; wv = F.wv; o1 = F.o1; o2 = F.o2; o3 = F.o3;
    g_wg_tile = tile;
    /* the backend's pick (dl__wg_tile): F(4x4, 3x3) where its tiles take fewer multiply-adds (5x6: a tie, F(2x2, 3x3)) */
    CHECK(dl__wg_tile(28, 28) == 4 && dl__wg_tile(14, 14) == 4 && dl__wg_tile(7, 7) == 4 && dl__wg_tile(4, 4) == 4 &&
          dl__wg_tile(3, 3) == 4 && dl__wg_tile(2, 2) == 2 && dl__wg_tile(1, 1) == 2 && dl__wg_tile(1, 28) == 2 &&
          dl__wg_tile(5, 6) == 2, "dl__wg_tile: 28 %d, 14 %d, 7 %d, 4 %d, 3 %d, 2 %d, 1 %d, 1x28 %d, 5x6 %d",
          dl__wg_tile(28, 28), dl__wg_tile(14, 14), dl__wg_tile(7, 7), dl__wg_tile(4, 4), dl__wg_tile(3, 3),
          dl__wg_tile(2, 2), dl__wg_tile(1, 1), dl__wg_tile(1, 28), dl__wg_tile(5, 6));
    g_wgc = *dl__cpu_be();
    g_wgc.name = "cpu-counting-winograd";
    g_wgc.conv_wg = count_wgf;
    g_wgc.conv_wg_wgrad = count_wgw;
    c->cpu[0]->be = &g_wgc;
    g_nowg = cpu_direct("cpu-without-winograd");
    c->cpu[1]->be = &g_nowg;
    for (gi = 0; gi < (int)(sizeof geo / sizeof geo[0]); gi++)
        for (tr = 0; tr < 2; tr++)
            for (bias = 0; bias < 2; bias++) {
                int64_t nb = geo[gi][0], ca = geo[gi][1], cb = geo[gi][2], pad = geo[gi][5], xs[4], ws[4];
                int64_t n1, n2, ny, nx, f0 = g_wg_fwd, f1 = g_wg_flip, f2 = g_wg_w;
                dl_conv_desc d = dl_conv_desc_make(1, pad, 1, 1);
                float ey, ex, ew;
                xs[0] = nb; xs[1] = tr ? cb : ca; xs[2] = geo[gi][3]; xs[3] = geo[gi][4];
                ws[0] = cb; ws[1] = ca; ws[2] = ws[3] = 3;
                if (tr && (xs[2] - 2 * pad + 2 <= 0 || xs[3] - 2 * pad + 2 <= 0)) continue;
                if (!tr && (xs[2] + 2 * pad - 2 <= 0 || xs[3] + 2 * pad - 2 <= 0)) continue;
                n1 = s1_run(c, 0, 2, tr != 0, xs, ws, bias != 0, &d, xv, wv, o1);
                n2 = s1_run(c, 1, 2, tr != 0, xs, ws, bias != 0, &d, xv, wv, o2);
                CHECK(n1 > 0 && n1 == n2, "winograd %s %lldx%lld pad %lld: %s", tr ? "conv_transpose" : "conv",
                      (long long)xs[2], (long long)xs[3], (long long)pad, dl_error_message(c));
                if (n1 <= 0 || n1 != n2) { dl_clear_error(c); dl_step_end(c); continue; }
                nx = xs[0] * xs[1] * xs[2] * xs[3];
                ny = tr ? nb * ca * (xs[2] - 2 * pad + 2) * (xs[3] - 2 * pad + 2)
                        : nb * cb * (xs[2] + 2 * pad - 2) * (xs[3] + 2 * pad - 2);
                ey = max_rel(o1, o2, ny);
                ex = max_rel(o1 + ny, o2 + ny, nx);
                ew = max_rel(o1 + ny + nx, o2 + ny + nx, n1 - ny - nx);
                CHECK(ey < tol && ex < tol && ew < tol && g_wg_fwd - f0 == 1 && g_wg_flip - f1 == 1 &&
                      g_wg_w - f2 == 1,
                      "winograd F(%dx%d, 3x3) %s: batch %lld, %lld -> %lld channels, %lldx%lld, pad %lld, bias %d: "
                      "against the direct paths y %g, dx %g, dw/db %g (want < %g); Winograd calls: forward %lld, "
                      "flipped %lld, weight gradient %lld (want 1 each)", tile, tile, tr ? "conv_transpose" : "conv",
                      (long long)nb, (long long)ca, (long long)cb, (long long)xs[2], (long long)xs[3],
                      (long long)pad, bias, ey, ex, ew, tol, (long long)(g_wg_fwd - f0), (long long)(g_wg_flip - f1),
                      (long long)(g_wg_w - f2));
                /* the same bits on 1 and 2 threads */
                for (th = 1; th <= 2; th++) {
                    dl_set_num_threads(c, th);
                    n2 = s1_run(c, 0, 2, tr != 0, xs, ws, bias != 0, &d, xv, wv, th == 1 ? o2 : o3);
                    CHECK(n2 == n1 && memcmp(o1, th == 1 ? o2 : o3, sizeof(float) * (size_t)n1) == 0,
                          "winograd %s batch %lld %lldx%lld pad %lld: different bits on %d threads",
                          tr ? "conv_transpose" : "conv", (long long)nb, (long long)xs[2], (long long)xs[3],
                          (long long)pad, th);
                }
                dl_set_num_threads(c, 0);
                dl_step_end(c);
            }
    /* inf in x: forward and weight gradient declined (the direct path's
       bits); NaN in w: the forward declined; the input gradient (finite
       operands) within rounding */
    for (i = 0; i < 2; i++) {
        int64_t xs[4] = {3, 16, 6, 6}, ws[4] = {16, 16, 3, 3}, n1, n2, ny = 3 * 16 * 36, nx = 3 * 16 * 36, dec = g_wg_declined;
        dl_conv_desc d = dl_conv_desc_make(1, 1, 1, 1);
        float save = i ? wv[40] : xv[100], ex;
        if (i) wv[40] = NAN;
        else xv[100] = INFINITY;
        n1 = s1_run(c, 0, 2, false, xs, ws, true, &d, xv, wv, o1);
        n2 = s1_run(c, 1, 2, false, xs, ws, true, &d, xv, wv, o2);
        CHECK(n1 > 0 && n1 == n2 && g_wg_declined - dec == 2,
              "winograd with %s: %lld declines, want 2", i ? "NaN in w" : "inf in x",
              (long long)(g_wg_declined - dec));
        if (n1 > 0 && n1 == n2) {
            CHECK(memcmp(o1, o2, sizeof(float) * (size_t)ny) == 0, "winograd with %s: y is the direct path's, bit for bit",
                  i ? "NaN in w" : "inf in x");
            if (!i) {
                ex = max_rel(o1 + ny, o2 + ny, nx);
                CHECK(ex < tol && memcmp(o1 + ny + nx, o2 + ny + nx, sizeof(float) * (size_t)(n1 - ny - nx)) == 0,
                      "winograd with inf in x: dx within rounding (%g), dw and db the direct path's bits", ex);
            }
        }
        if (i) wv[40] = save;
        else xv[100] = save;
        dl_clear_error(c);
        dl_step_end(c);
    }
out:
    path_close(&F);
}
#else
static void wg_paths(int tile)
{
    printf("wg_paths(%d): this build has no Winograd entries (AVX-512 only): skipped\n", tile);
}
#endif

/* ================================================================ 8. im2col a sample at a time */

/* the 2x2, stride-2 max pool's vector loops (16 or 8 outputs at a time, the
   tail masked) against the sequential rule, widths 2..41 and odd heights:
   values and the gradient's scatter (which records the index), with ties
   (the first tap wins) and NaNs (the last NaN wins) */
static void pool2x2_paths(void)
{
    dl_pool_desc pd = dl_pool_desc_make(2, 2, 0, false, false);
    int W, H, bad = 0, checked = 0;
    uint32_t rng = 7;
    for (W = 2; W <= 41; W++)
        for (H = 2; H <= 5; H += 3) {
            int64_t n = 3 * H * W, OH = H / 2, OW = W / 2, q, i, j;
            float *xv = (float *)malloc(sizeof(float) * (size_t)n), *yv, *gv, *dx;
            dl_tensor *x, *y, *g;
            for (i = 0; i < n; i++) {
                rng = rng * 1664525u + 1013904223u;
                xv[i] = (float)(rng >> 29);           /* 0..7: many ties */
                if ((rng >> 8) % 23 == 0) xv[i] = NAN;
            }
            x = dl_requires_grad(dl_from_array(g_ctx, DL_SHAPE(3, H, W), xv), true);
            yv = (float *)malloc(sizeof(float) * (size_t)(3 * OH * OW));
            gv = (float *)malloc(sizeof(float) * (size_t)(3 * OH * OW));
            dx = (float *)malloc(sizeof(float) * (size_t)n);
            for (i = 0; i < 3 * OH * OW; i++) gv[i] = (float)(i + 1);
            y = dl_max_pool2d(x, &pd);
            g = dl_from_array(g_ctx, DL_SHAPE(3, OH, OW), gv);
            if (!y || dl_backward(dl_sum(dl_mul(y, g), DL_ALL, false)) != DL_OK) { bad++; goto next; }
            dl_read(y, yv, 3 * OH * OW);
            dl_read(x->grad, dx, n);
            for (q = 0; q < 3; q++)
                for (i = 0; i < OH; i++)
                    for (j = 0; j < OW; j++) {
                        const float *p = xv + q * H * W;
                        int64_t at = 2 * i * W + 2 * j, best = at, taps[3], t;
                        float m = p[at], got = yv[(q * OH + i) * OW + j];
                        taps[0] = at + 1; taps[1] = at + W; taps[2] = at + W + 1;
                        for (t = 0; t < 3; t++)
                            if (p[taps[t]] > m || p[taps[t]] != p[taps[t]]) { m = p[taps[t]]; best = taps[t]; }
                        checked++;
                        if (!(got == m || (got != got && m != m)) ||
                            dx[q * H * W + best] != gv[(q * OH + i) * OW + j]) bad++;
                    }
        next:
            free(xv); free(yv); free(gv); free(dx);
            dl_step_end(g_ctx);
        }
    CHECK(bad == 0 && checked > 2000, "max pool 2x2 stride 2, widths 2..41: %d of %d windows differ from the "
          "sequential rule (value or index)", bad, checked);
}

/* The CPU's conv_i2c (strided convs: im2col one sample at a time into a
   thread's buffer, the GEMM straight into y) against whole-batch im2col
   (device 1: the same backend without conv_i2c): the same bits for y, dx,
   dw and db, conv and conv_transpose (whose input gradient is a conv),
   strides 2 and 3, 1x1, padding, dilation, non-square planes, a 1-d conv,
   batches of 1 and odd sizes; groups and planes of fewer than 128 output
   positions decline; the same bits on 1 and 2 threads. */
static dl__backend g_i2cc, g_noi2c;
static int64_t g_i2c_done, g_i2c_declined;

static bool count_i2c_conv(dl__dev *d, float *y, const float *x, const float *w, const float *bias, int64_t n,
                           const dl__cgeom *g)
{
    bool ok = dl__cpu_be()->conv_i2c(d, y, x, w, bias, n, g);
    g_i2c_done += ok;
    g_i2c_declined += !ok;
    return ok;
}

static void i2c_sample_paths(void)
{
    static const int64_t geo[][10] = {   /* nsp, batch, C in, C out, H, W, k, stride, pad, dilation; groups 1 */
        {2, 3, 16, 32, 28, 28, 3, 2, 1, 1}, {2, 2, 16, 32, 28, 28, 1, 2, 0, 1}, {2, 1, 3, 5, 31, 29, 3, 2, 2, 1},
        {2, 5, 4, 7, 40, 33, 5, 3, 1, 1},   {2, 2, 2, 3, 30, 36, 3, 2, 2, 2}, {2, 3, 5, 4, 25, 27, 2, 2, 0, 1},
        {1, 3, 4, 6, 600, 1, 5, 2, 2, 1},   {2, 4, 8, 8, 14, 14, 3, 2, 1, 1}, /* 7x7: declines */
    };
    path_fix F;
    dl_ctx *c;
    float *xv, *wv, *o1, *o2;
    int gi, tr, bias, i, th;
    if (!path_open(&F, 400000, "i2c_sample_paths")) goto out;
    c = F.c; xv = F.xv; wv = F.wv; o1 = F.o1; o2 = F.o2;
    g_i2cc = *dl__cpu_be();
    g_i2cc.name = "cpu-counting-conv_i2c";
    g_i2cc.conv_i2c = count_i2c_conv;
    c->cpu[0]->be = &g_i2cc;
    g_noi2c = *dl__cpu_be();
    g_noi2c.name = "cpu-without-conv_i2c";
    g_noi2c.conv_i2c = NULL;
    c->cpu[1]->be = &g_noi2c;
    for (gi = 0; gi < (int)(sizeof geo / sizeof geo[0]); gi++)
        for (tr = 0; tr < 2; tr++)
            for (bias = 0; bias < 2; bias++) {
                int nsp = (int)geo[gi][0];
                int64_t xs[4], ws[4], n1, n2, done0 = g_i2c_done, dec0 = g_i2c_declined;
                dl_conv_desc d = dl_conv_desc_make(geo[gi][7], geo[gi][8], geo[gi][9], 1);
                int64_t k = geo[gi][6], e = geo[gi][9] * (k - 1) + 1, ib[2], p = geo[gi][8], s = geo[gi][7];
                bool declines = gi == 7;
                xs[0] = geo[gi][1];
                xs[1] = tr ? geo[gi][3] : geo[gi][2];
                ws[0] = geo[gi][3];   /* conv: (C out, C in); conv_transpose: (its C in, its C out) */
                ws[1] = geo[gi][2];
                /* conv_transpose: x has the conv's output shape (its backward runs the conv) */
                for (i = 0; i < nsp; i++) {
                    int64_t h = geo[gi][4 + i];
                    ib[i] = (h + 2 * p - e) / s + 1;
                    xs[2 + i] = tr ? ib[i] : h;
                    ws[2 + i] = k;
                }
                n1 = s1_run(c, 0, nsp, tr != 0, xs, ws, bias != 0, &d, xv, wv, o1);
                n2 = s1_run(c, 1, nsp, tr != 0, xs, ws, bias != 0, &d, xv, wv, o2);
                CHECK(n1 > 0 && n1 == n2 && memcmp(o1, o2, sizeof(float) * (size_t)n1) == 0,
                      "conv_i2c: %s %dd geometry %d, bias %d: y, dx, dw, db differ from whole-batch im2col (%s)",
                      tr ? "conv_transpose" : "conv", nsp, gi, bias, dl_error_message(c));
                CHECK(declines ? g_i2c_done == done0 && g_i2c_declined > dec0 : g_i2c_done - done0 == 1,
                      "conv_i2c: %s %dd geometry %d: %lld calls taken, %lld declined (want %s)",
                      tr ? "conv_transpose" : "conv", nsp, gi, (long long)(g_i2c_done - done0),
                      (long long)(g_i2c_declined - dec0), declines ? "declines only" : "1 taken");
                for (th = 1; th <= 2 && n1 > 0; th++) {
                    dl_set_num_threads(c, th);
                    n2 = s1_run(c, 0, nsp, tr != 0, xs, ws, bias != 0, &d, xv, wv, o2);
                    CHECK(n2 == n1 && memcmp(o1, o2, sizeof(float) * (size_t)n1) == 0,
                          "conv_i2c: %s geometry %d: different bits on %d threads", tr ? "conv_transpose" : "conv", gi, th);
                }
                dl_set_num_threads(c, 0);
                dl_clear_error(c);
                dl_step_end(c);
            }
    /* groups: declined */
    {
        int64_t xs[4] = {2, 4, 28, 28}, ws[4] = {4, 2, 3, 3}, n1, n2, dec0 = g_i2c_declined;
        dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 2);
        n1 = s1_run(c, 0, 2, false, xs, ws, true, &d, xv, wv, o1);
        n2 = s1_run(c, 1, 2, false, xs, ws, true, &d, xv, wv, o2);
        CHECK(n1 > 0 && n1 == n2 && memcmp(o1, o2, sizeof(float) * (size_t)n1) == 0 && g_i2c_declined > dec0,
              "conv_i2c with groups: declined (%lld) and whole-batch im2col's bits", (long long)(g_i2c_declined - dec0));
        dl_step_end(c);
    }
out:
    path_close(&F);
}

/* ================================================================ 6. im2col's two loops */

/* Small planes take a table (dl__cpu_im2col / dl__cpu_col2im: gathered
   rows, col2im scattered or gathered); the row loops are the reference.
   Device 0 has the table entries, device 1 the row loops, neither conv_s1,
   so every conv and conv_transpose goes through im2col or col2im; all
   results must be the same bits. */
static dl__backend g_tab, g_rows;
static int64_t g_tab_i2c, g_tab_c2i_gather, g_tab_c2i_scatter;

static void count_i2c(dl__dev *d, float *col, const float *x, int64_t n, const dl__cgeom *g)
{
    if (dl__i2c_tab_ok(g)) g_tab_i2c++;
    dl__cpu_im2col(d, col, x, n, g);
}

static void count_c2i(dl__dev *d, float *x, const float *col, int64_t n, const dl__cgeom *g)
{
    if (dl__i2c_tab_ok(g)) {
        if (g->La <= 2 * g->Lb) g_tab_c2i_gather++;
        else g_tab_c2i_scatter++;
    }
    dl__cpu_col2im(d, x, col, n, g);
}

static void i2c_paths(void)
{
    dl_ctx_desc cd;
    dl_ctx *c;
    int nsp, k, st, dil, pad, tr, grp, i, cases = 0, bad = 0;
    float *xv = (float *)malloc(sizeof(float) * 100000), *wv = (float *)malloc(sizeof(float) * 100000);
    float *o1 = (float *)malloc(sizeof(float) * 400000), *o2 = (float *)malloc(sizeof(float) * 400000);
    memset(&cd, 0, sizeof cd);
    cd.cpu_devices = 2;
    c = dl_ctx_init(&cd);
    if (!c || !xv || !wv || !o1 || !o2) { CHECK(0, "i2c_paths: setup"); goto out; }
    g_tab = cpu_direct("cpu-im2col-table");
    g_tab.conv_s1 = NULL;
    g_tab.conv_s1_wgrad = NULL;
    g_tab.im2col = count_i2c;
    g_tab.col2im = count_c2i;
    g_rows = g_tab;
    g_rows.name = "cpu-im2col-rows";
    g_rows.im2col = dl__cpu_im2col_rows;
    g_rows.col2im = dl__cpu_col2im_rows;
    c->cpu[0]->be = &g_tab;
    c->cpu[1]->be = &g_rows;
    for (i = 0; i < 100000; i++) { xv[i] = sinf(0.29f * (float)i) - 0.125f; wv[i] = cosf(0.73f * (float)i) * 0.5f; }
    xv[3] = -0.0f;
    for (nsp = 1; nsp <= 3; nsp++)
        for (k = 1; k <= (nsp == 3 ? 3 : 4); k++)
            for (st = 1; st <= 3; st++)
                for (dil = 1; dil <= 2; dil++)
                    for (pad = 0; pad <= dil * (k - 1); pad++)
                        for (tr = 0; tr < 2; tr++)
                            for (grp = 1; grp <= 2; grp++) {
                                int64_t xs[5], ws[5], n1, n2, span = dil * (k - 1) + 1, size, ca = 2 * grp, cb = 3 * grp;
                                dl_conv_desc d = dl_conv_desc_make(st, pad, dil, grp);
                                bool bias = !tr || grp == 1;
                                size = nsp == 1 ? 13 : nsp == 2 ? 7 : 5;
                                if (size + 2 * pad < span) continue;
                                xs[0] = 3;
                                xs[1] = tr ? cb : ca;
                                ws[0] = cb;
                                ws[1] = ca / grp;
                                for (i = 0; i < nsp; i++) { xs[2 + i] = size + (i == nsp - 1); ws[2 + i] = k; }
                                n1 = s1_run(c, 0, nsp, tr != 0, xs, ws, bias, &d, xv, wv, o1);
                                n2 = s1_run(c, 1, nsp, tr != 0, xs, ws, bias, &d, xv, wv, o2);
                                cases++;
                                if (n1 <= 0 || n1 != n2 || memcmp(o1, o2, sizeof(float) * (size_t)n1) != 0) {
                                    bad++;
                                    CHECK(0, "im2col table vs row loops: %s %dd k %d stride %d dil %d pad %d groups "
                                          "%d: %s", tr ? "conv_transpose" : "conv", nsp, k, st, dil, pad, grp,
                                          n1 <= 0 || n1 != n2 ? dl_error_message(c) : "different bits");
                                    dl_clear_error(c);
                                }
                                dl_step_end(c);
                            }
    CHECK(bad == 0 && cases > 500, "im2col table vs row loops: %d cases, %d differ (y, dx, dw, db bit for bit)",
          cases, bad);
    CHECK(g_tab_i2c > 500 && g_tab_c2i_gather > 100 && g_tab_c2i_scatter > 100,
          "the table path ran: %lld im2col, %lld col2im gathered, %lld scattered", (long long)g_tab_i2c,
          (long long)g_tab_c2i_gather, (long long)g_tab_c2i_scatter);
    /* a plane past the table's limit: the row loops on both devices */
    {
        int64_t xs[4] = {1, 1, 80, 80}, ws[4] = {2, 1, 3, 3}, n1, n2, before = g_tab_i2c;
        dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 1);
        n1 = s1_run(c, 0, 2, false, xs, ws, true, &d, xv, wv, o1);
        n2 = s1_run(c, 1, 2, false, xs, ws, true, &d, xv, wv, o2);
        CHECK(n1 > 0 && n1 == n2 && memcmp(o1, o2, sizeof(float) * (size_t)n1) == 0 && g_tab_i2c == before,
              "80x80 plane: the row loops (table calls %lld, want 0)", (long long)(g_tab_i2c - before));
        dl_step_end(c);
    }
out:
    free(xv); free(wv); free(o1); free(o2);
    if (c) c->cpu[0]->be = c->cpu[1]->be = dl__cpu_be();
    dl_ctx_free(c);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "tests/golden/conv.bin";
    int ncases = 0;
    if (argc > 2 && !strcmp(argv[1], "--capture")) {   /* gen_fuzz.py's conv programs, captured */
        g_capture_file(argv[2]);
        TEST_END();
    }
    g_ctx = dl_ctx_init(NULL);
    CHECK(g_ctx != NULL, "dl_ctx_init");
    if (!g_ctx) TEST_END();
    gradchecks();
    CHECK(dl_last_error(g_ctx) == DL_OK, "stray error after the gradchecks: %s", dl_error_message(g_ctx));
    errors();
    threads_and_memory();
    if (!g_load(path)) {
        CHECK(0, "loading the golden file %s", path);
    } else {
        ncases = g_run_cases();
        printf("golden: %d cases from %s (%ld records)\n", ncases, path, g_nrec);
        CHECK(argc > 1 ? ncases > 0 : ncases > 120, "expected %s cases in %s, found %d",
              argc > 1 ? "some" : "more than 120", path, ncases);
        g_free_recs();
    }
    if (argc <= 1) {
        /* gen_conv_edges.py: max pooling's second derivative, empty convT, special
           values; gen_fuzz.py: random convolution nets' programs */
        static const struct { const char *path; int n; } more[] = {
            {"tests/golden/conv_edges.bin", 19}, {"tests/golden/fuzz_conv.bin", 100}};
        int f;
        for (f = 0; f < 2; f++) {
            if (!g_load(more[f].path)) {
                CHECK(0, "loading the golden file %s", more[f].path);
                continue;
            }
            ncases = g_run_cases();
            CHECK(f == 0 ? ncases == more[f].n : ncases >= more[f].n, "expected %s%d cases in %s, found %d",
                  f == 0 ? "" : "at least ", more[f].n, more[f].path, ncases);
            g_free_recs();
        }
        g_capture_file("tests/golden/fuzz_conv.bin");   /* the same programs, captured and replayed */
    }
    s1_paths();
    i2c_paths();
    wg_paths(2);
    wg_paths(4);
    i2c_sample_paths();
    pool2x2_paths();
    timing();
    CHECK(dl_last_error(g_ctx) == DL_OK, "stray error at the end: %s", dl_error_message(g_ctx));
    dl_ctx_free(g_ctx);
    TEST_END();
}
