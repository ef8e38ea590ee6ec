/* tests/test_layers.c - the layer modules (Conv, ConvTranspose, pools,
   BatchNorm, LayerNorm, Dropout): PyTorch state_dict names and shapes,
   default initialization bounds, forward equal to the functional ops,
   batch norm train/eval and running buffers, a checkpoint round trip with
   every buffer, constructor errors, and Unflatten; RNN, LSTM and GRU
   against torch.nn's (tests/golden/rnn.bin, made by gen_rnn.py): outputs,
   final states and every gradient, their state_dict, init, dropout
   between layers, errors; F.scaled_dot_product_attention and
   nn.MultiheadAttention against torch's (tests/golden/attention.bin, made
   by gen_attention.py): output, attention weights, every gradient; the
   masks' forms, dropout, MultiheadAttention's state_dict, init and a
   checkpoint round trip. */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include "golden.h"

static dl_ctx *ctx;

static int same(dl_tensor *a, dl_tensor *b)
{
    return a && b && dl_same_shape(a, b) && th_same_bytes(a, b);
}

static void test_names(void)
{
    dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
    dl_module *m[] = {dl_nn_conv2d(ctx, 1, 6, 5, &pad2, true), dl_nn_batch_norm2d(ctx, 6), dl_nn_relu(ctx),
                      dl_nn_max_pool2d(ctx, &pool), dl_nn_flatten(ctx), dl_nn_linear(ctx, 6 * 14 * 14, 10, true)};
    dl_module *net = dl_nn_sequential(ctx, 6, m);
    /* what torch prints for the same nn.Sequential's state_dict */
    static const char *want[] = {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                 "1.num_batches_tracked", "5.weight", "5.bias"};
    static const int64_t numel[] = {150, 6, 6, 6, 6, 6, 1, 11760, 10};
    const dl_named_tensor *sd;
    dl_tensor *ts[16];
    int n = dl_module_state_dict(net, &sd), i, ok = n == 9;
    for (i = 0; i < n && i < 16; i++) ts[i] = sd[i].t;
    for (i = 0; i < n && i < 9; i++) if (strcmp(sd[i].name, want[i]) || ts[i]->numel != numel[i]) ok = 0;
    CHECK(ok, "state_dict names/sizes (%d tensors, first %s)", n, n > 0 ? sd[0].name : "");
    CHECK(ok && !sd[0].is_buffer && !sd[3].is_buffer && sd[4].is_buffer && sd[5].is_buffer && sd[6].is_buffer,
          "bn running stats flagged as buffers, weights as parameters");
    CHECK(ts[6]->dtype == DL_DTYPE_I64 && ts[6]->ndim == 0, "num_batches_tracked is an int64 scalar");
    CHECK(ts[0]->ndim == 4 && ts[0]->shape[0] == 6 && ts[0]->shape[1] == 1 && ts[0]->shape[3] == 5, "conv weight (6,1,5,5)");
    CHECK(dl_module_num_params(net) == 150 + 6 + 12 + 11760 + 10, "num_params %lld", (long long)dl_module_num_params(net));
    {   /* conv init: kaiming_uniform(a=sqrt5) = U(-1/sqrt(fan_in), +), bias the same bound */
        float *w = th_host(ts[0]), bound = 1.0f / sqrtf(25.0f), mx = 0;
        for (i = 0; i < 150; i++) if (fabsf(w[i]) > mx) mx = fabsf(w[i]);
        CHECK(mx <= bound && mx > 0.8f * bound, "conv weight bound %g vs %g", (double)mx, (double)bound);
        CHECK(th_f(ts[2], 0) == 1 && th_f(ts[3], 0) == 0 && th_f(ts[5], 0) == 1, "bn init");
    }
    {   /* transposed conv weight is (in, out/groups, k...) */
        dl_conv_desc g2 = dl_conv_desc_make(2, 1, 1, 2);
        dl_module *t = dl_nn_conv_transpose2d(ctx, 4, 6, 3, &g2, false);
        dl_tensor *w = dl_module_get(t, "weight");
        CHECK(w && w->shape[0] == 4 && w->shape[1] == 3 && !dl_module_get(t, "bias"), "ConvTranspose2d weight (4,3,3,3), no bias");
    }
}

static void test_forward(void)
{
    dl_conv_desc d = dl_conv_desc_make(2, 1, 1, 1);
    dl_module *c1 = dl_nn_conv1d(ctx, 3, 4, 3, &d, true), *c3 = dl_nn_conv3d(ctx, 2, 2, 2, NULL, false);
    dl_pool_desc p = dl_pool_desc_make(2, 0, 0, false, true);
    dl_tensor *x1 = dl_randn(ctx, DL_SHAPE(2, 3, 9)), *x3 = dl_randn(ctx, DL_SHAPE(1, 2, 4, 4, 4));
    dl_tensor *x2 = dl_randn(ctx, DL_SHAPE(2, 3, 8, 8));
    CHECK(same(dl_module_forward(c1, x1), dl_conv1d(x1, dl_module_get(c1, "weight"), dl_module_get(c1, "bias"), &d)), "Conv1d = dl_conv1d");
    CHECK(same(dl_module_forward(c3, x3), dl_conv3d(x3, dl_module_get(c3, "weight"), NULL, NULL)), "Conv3d = dl_conv3d");
    CHECK(same(dl_module_forward(dl_nn_max_pool2d(ctx, &p), x2), dl_max_pool2d(x2, &p)), "MaxPool2d");
    CHECK(same(dl_module_forward(dl_nn_avg_pool2d(ctx, &p), x2), dl_avg_pool2d(x2, &p)), "AvgPool2d");
    CHECK(same(dl_module_forward(dl_nn_adaptive_avg_pool2d(ctx, DL_SHAPE(1, 1)), x2), dl_adaptive_avg_pool2d(x2, DL_SHAPE(1, 1))), "AdaptiveAvgPool2d");
    CHECK(same(dl_module_forward(dl_nn_max_pool1d(ctx, &p), x1), dl_max_pool1d(x1, &p)), "MaxPool1d");
    CHECK(same(dl_module_forward(dl_nn_avg_pool3d(ctx, &p), x3), dl_avg_pool3d(x3, &p)), "AvgPool3d");
    {   /* Sequential(ReLU, MaxPool) runs as pool then ReLU on the CPU, except where a dilated
           window can lie in the padding alone (torch: max_pool(relu(x)) = -inf there) */
        dl_pool_desc pd = dl_pool_desc_make(2, 1, 1, false, true);
        dl_module *seq[2];
        float v[3];
        dl_tensor *xs = dl_from_array(ctx, DL_SHAPE(1, 1, 2), ((float[]){0.5f, -2.0f}));
        pd.dilation[0] = 3;
        seq[0] = dl_nn_relu(ctx);
        seq[1] = dl_nn_max_pool1d(ctx, &pd);
        CHECK(same(dl_module_forward(dl_nn_sequential(ctx, 2, seq), xs), dl_max_pool1d(dl_relu(xs), &pd)) &&
              dl_read(dl_max_pool1d(dl_relu(xs), &pd), v, 1) == DL_OK && v[0] == -INFINITY,
              "Sequential(ReLU, MaxPool1d(2, 1, 1, dilation=3)) = max_pool1d(relu(x)): -inf");
        pd = dl_pool_desc_make(3, 2, 1, true, true);   /* (dilation 1: pool first, the same values) */
        seq[0] = dl_nn_relu(ctx);
        seq[1] = dl_nn_max_pool2d(ctx, &pd);
        CHECK(same(dl_module_forward(dl_nn_sequential(ctx, 2, seq), x2), dl_max_pool2d(dl_relu(x2), &pd)),
              "Sequential(ReLU, MaxPool2d(3, 2, 1, ceil_mode))");
    }
    {
        dl_module *ln = dl_nn_layer_norm(ctx, DL_SHAPE(8, 8));
        CHECK(same(dl_module_forward(ln, x2), dl_layer_norm(x2, DL_SHAPE(8, 8), dl_module_get(ln, "weight"), dl_module_get(ln, "bias"), 1e-5f)), "LayerNorm");
    }
    {
        dl_module *dr = dl_nn_dropout(ctx, 0.5f);
        dl_tensor *y = dl_module_forward(dr, x2);
        int64_t i, zeros = 0;
        float *yh = th_host(y);
        for (i = 0; i < y->numel; i++) zeros += yh[i] == 0.0f;
        CHECK(zeros > y->numel / 4 && zeros < 3 * y->numel / 4, "Dropout train drops about half (%lld of %lld)", (long long)zeros, (long long)y->numel);
        dl_module_train(dr, false);
        CHECK(same(dl_module_forward(dr, x2), x2), "Dropout eval is the identity");
    }
}

static void test_batch_norm(void)
{
    dl_module *bn = dl_nn_batch_norm2d(ctx, 3);
    dl_tensor *x = dl_add_scalar(dl_mul_scalar(dl_randn(ctx, DL_SHAPE(8, 3, 4, 4)), 2.0f), 1.0f), *y, *m;
    dl_tensor *rm = dl_module_get(bn, "running_mean"), *rv = dl_module_get(bn, "running_var");
    y = dl_module_forward(bn, x);
    m = dl_mean(y, DL_DIMS(0, 2, 3), false);
    CHECK(m && fabsf(th_f(m, 1)) < 1e-5f, "train mode normalizes with batch stats");
    {
        dl_tensor *bm = dl_mean(x, DL_DIMS(0, 2, 3), false), *bv = dl_var(x, DL_DIMS(0, 2, 3), 1, false);
        CHECK(fabsf(th_f(rm, 0) - 0.1f * th_f(bm, 0)) < 1e-5f, "running_mean = 0.1 * mean");
        CHECK(fabsf(th_f(rv, 0) - (0.9f + 0.1f * th_f(bv, 0))) < 1e-4f, "running_var uses unbiased var");
    }
    CHECK(th_i64(dl_module_get(bn, "num_batches_tracked"), 0) == 1, "num_batches_tracked counts");
    dl_module_train(bn, false);
    y = dl_module_forward(bn, x);
    CHECK(y && fabsf(th_f(y, 0) - (th_f(x, 0) - th_f(rm, 0)) / sqrtf(th_f(rv, 0) + 1e-5f)) < 1e-5f,
          "eval mode uses running stats");
    CHECK(th_i64(dl_module_get(bn, "num_batches_tracked"), 0) == 1, "eval does not count");
    CHECK(dl_module_forward(bn, dl_randn(ctx, DL_SHAPE(8, 3))) == NULL, "BatchNorm2d refuses 2-D input");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "BatchNorm2d");
    CHECK(dl_module_forward_relu(bn, dl_randn(ctx, DL_SHAPE(8, 3))) == NULL, "fused ReLU: 2-D input refused");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "BatchNorm2d: x (8,3) must be (N,C,H,W)");
    CHECK(dl_module_forward_relu(bn, NULL) == NULL && dl_last_error(ctx) == DL_OK, "fused ReLU: NULL x -> NULL");
    CHECK(dl_module_forward_relu(NULL, x) == NULL, "fused ReLU: NULL module -> NULL");
    dl_clear_error(ctx);
    {   /* relu(bn(x) + r): the fused op's refusals, and the three ops' where r is not x's twin */
        dl_tensor *x2 = dl_randn(ctx, DL_SHAPE(8, 3)), *xi;
        CHECK(dl_module_forward_add_relu(bn, x2, x2) == NULL, "fused add+ReLU: 2-D input refused");
        EXPECT_ERR(ctx, DL_ERR_SHAPE, "BatchNorm2d: x (8,3) must be (N,C,H,W)");
        CHECK(dl_module_forward_add_relu(bn, x, dl_randn(ctx, DL_SHAPE(8, 3, 5, 5))) == NULL,
              "fused add+ReLU: r of another shape refused");
        EXPECT_ERR(ctx, DL_ERR_SHAPE, "dl_add");
        xi = dl_argmax(x, 1, true);
        CHECK(xi && dl_module_forward_add_relu(bn, x, dl_expand(xi, DL_SHAPE(8, 3, 4, 4))) == NULL,
              "fused add+ReLU: int64 r refused");
        EXPECT_ERR(ctx, DL_ERR_DTYPE, "dl_add");
        CHECK(dl_module_forward_add_relu(bn, x, NULL) == NULL && dl_last_error(ctx) == DL_OK,
              "fused add+ReLU: NULL r -> NULL");
        CHECK(dl_module_forward_add_relu(bn, NULL, x) == NULL && dl_last_error(ctx) == DL_OK,
              "fused add+ReLU: NULL x -> NULL");
        CHECK(dl_module_forward_add_relu(NULL, x, x) == NULL, "fused add+ReLU: NULL module -> NULL");
        dl_clear_error(ctx);
        y = dl_module_forward_add_relu(bn, x, dl_ones(ctx, DL_SHAPE(1, 3, 1, 1)));
        CHECK(y && y->ndim == 4 && y->shape[0] == 8 && th_f(dl_min(y, DL_ALL, false), 0) >= 0.0f,
              "fused add+ReLU: a broadcast r through the three ops");
    }
    CHECK(dl_module_forward(dl_nn_batch_norm1d(ctx, 3), dl_randn(ctx, DL_SHAPE(8, 3))) != NULL, "BatchNorm1d (N,C)");
    CHECK(dl_module_forward(dl_nn_batch_norm1d(ctx, 3), dl_randn(ctx, DL_SHAPE(8, 3, 5))) != NULL, "BatchNorm1d (N,C,L)");
    CHECK(dl_module_forward(dl_nn_batch_norm3d(ctx, 3), dl_randn(ctx, DL_SHAPE(2, 3, 2, 2, 2))) != NULL, "BatchNorm3d");
}

/* PyTorch's keyword settings on made modules: BatchNorm*d's momentum and
   eps, LayerNorm's eps (each against the functional op, bit for bit), and
   LeakyReLU(negative_slope); every refusal leaves the module as it was */
static void test_options(void)
{
    dl_module *bn = dl_nn_batch_norm1d(ctx, 3), *ln = dl_nn_layer_norm(ctx, DL_SHAPE(5)), *lr, *lin;
    dl_tensor *x = dl_add_scalar(dl_randn(ctx, DL_SHAPE(6, 3)), 2.0f), *x5 = dl_randn(ctx, DL_SHAPE(4, 5));
    dl_tensor *rm = dl_keep(dl_zeros(ctx, DL_SHAPE(3))), *rv = dl_keep(dl_ones(ctx, DL_SHAPE(3))), *y, *want;
    CHECK(dl_nn_batch_norm_options(bn, 0.3f, 1e-3f) == DL_OK, "BatchNorm1d(3, momentum=0.3, eps=1e-3)");
    y = dl_module_forward(bn, x);
    want = dl_batch_norm(x, rm, rv, dl_module_get(bn, "weight"), dl_module_get(bn, "bias"), true, 0.3f, 1e-3f);
    CHECK(same(y, want) && same(dl_module_get(bn, "running_mean"), rm) && same(dl_module_get(bn, "running_var"), rv),
          "BatchNorm1d with momentum 0.3, eps 1e-3: the functional op's output and running statistics");
    CHECK(dl_nn_batch_norm_options(bn, 0.0f, 1e-5f) == DL_OK, "momentum 0 (running statistics kept)");
    CHECK(dl_nn_batch_norm_options(bn, 1.5f, 1e-5f) == DL_ERR_ARG, "momentum 1.5 refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_batch_norm_options: momentum=1.5 must be in [0, 1]");
    CHECK(dl_nn_batch_norm_options(bn, NAN, 1e-5f) == DL_ERR_ARG, "momentum NaN refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "momentum=nan");
    CHECK(dl_nn_batch_norm_options(bn, 0.1f, 0.0f) == DL_ERR_ARG, "eps 0 refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_batch_norm_options: eps=0 must be finite and > 0 (PyTorch's default: 1e-5)");
    CHECK(dl_nn_batch_norm_options(ln, 0.1f, 1e-5f) == DL_ERR_ARG, "batch-norm options on a LayerNorm refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_batch_norm_options: m (a \"LayerNorm\" module) was not made by "
               "dl_nn_batch_norm1d/2d/3d");
    CHECK(dl_nn_batch_norm_options(NULL, 0.1f, 1e-5f) == DL_ERR_ARG, "NULL module");
    dl_clear_error(ctx);
    CHECK(dl_nn_layer_norm_eps(ln, 1e-2f) == DL_OK, "LayerNorm(5, eps=1e-2)");
    CHECK(same(dl_module_forward(ln, x5), dl_layer_norm(x5, DL_SHAPE(5), dl_module_get(ln, "weight"),
                                                         dl_module_get(ln, "bias"), 1e-2f)),
          "LayerNorm with eps 1e-2: the functional op's bits");
    CHECK(dl_nn_layer_norm_eps(ln, INFINITY) == DL_ERR_ARG, "LayerNorm eps inf refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_layer_norm_eps: eps=inf must be finite and > 0");
    CHECK(same(dl_module_forward(ln, x5), dl_layer_norm(x5, DL_SHAPE(5), dl_module_get(ln, "weight"),
                                                         dl_module_get(ln, "bias"), 1e-2f)),
          "a refused eps leaves the module");
    CHECK(dl_nn_layer_norm_eps(bn, 1e-2f) == DL_ERR_ARG, "LayerNorm eps on a BatchNorm refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "m (a \"BatchNorm1d\" module) was not made by dl_nn_layer_norm");
    lr = dl_nn_leaky_relu(ctx, 0.2f);
    CHECK(lr && !strcmp(dl_module_type(lr), "LeakyReLU") && dl_module_num_params(lr) == 0 &&
          same(dl_module_forward(lr, x5), dl_leaky_relu(x5, 0.2f)), "LeakyReLU(0.2): the functional op, no parameters");
    CHECK(dl_nn_leaky_relu(ctx, NAN) == NULL, "LeakyReLU(NaN) refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_leaky_relu: negative_slope=nan must be finite");
    lin = dl_nn_linear(ctx, 2, 2, true);
    CHECK(dl_nn_layer_norm_eps(lin, 1e-3f) == DL_ERR_ARG, "LayerNorm eps on a Linear refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "m (a \"Linear\" module)");
    {   /* a user's module named as dl.h's: told apart by its forward, its state left alone */
        dl_module *u = dl_module_new(ctx, "BatchNorm2d", NULL, 4);
        CHECK(u && dl_nn_batch_norm_options(u, 0.5f, 1e-3f) == DL_ERR_ARG, "a user's \"BatchNorm2d\" refused");
        EXPECT_ERR(ctx, DL_ERR_ARG, "m (a \"BatchNorm2d\" module) was not made by dl_nn_batch_norm1d/2d/3d");
    }
    {   /* inside a capture: refused (a replay runs with the captured settings) */
        dl_capture *cap = dl_capture_begin(ctx);
        CHECK(cap && dl_nn_batch_norm_options(bn, 0.2f, 1e-3f) == DL_ERR_UNSUPPORTED,
              "batch-norm options inside a capture refused");
        EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "dl_nn_batch_norm_options: a module setting's change inside a capture");
        CHECK(dl_nn_layer_norm_eps(ln, 1e-3f) == DL_ERR_UNSUPPORTED, "layer-norm eps inside a capture refused");
        CHECK(dl_capture_end(cap) == DL_ERR_UNSUPPORTED, "the capture fails");
        dl_capture_free(cap);
        dl_clear_error(ctx);
    }
}

static void test_checkpoint(void)
{
    dl_module *m[3], *a, *b;
    dl_tensor *x = dl_randn(ctx, DL_SHAPE(4, 2, 6, 6));
    const dl_named_tensor *sa, *sb;
    int n, i, ok = 1;
    m[0] = dl_nn_conv2d(ctx, 2, 3, 3, NULL, true); m[1] = dl_nn_batch_norm2d(ctx, 3); m[2] = dl_nn_relu(ctx);
    a = dl_nn_sequential(ctx, 3, m);
    m[0] = dl_nn_conv2d(ctx, 2, 3, 3, NULL, true); m[1] = dl_nn_batch_norm2d(ctx, 3); m[2] = dl_nn_relu(ctx);
    b = dl_nn_sequential(ctx, 3, m);
    dl_module_forward(a, x);   /* moves a's running stats */
    CHECK(dl_save("build/test_layers.safetensors", a, NULL) == DL_OK, "save: %s", dl_error_message(ctx));
    CHECK(dl_load("build/test_layers.safetensors", b, NULL) == DL_OK, "load: %s", dl_error_message(ctx));
    n = dl_module_state_dict(a, &sa);
    CHECK(dl_module_state_dict(b, &sb) == n, "same state_dict length");
    for (i = 0; i < n; i++) if (strcmp(sa[i].name, sb[i].name) || !th_same_bytes(sa[i].t, sb[i].t)) ok = 0;
    CHECK(ok && n == 7, "every parameter and buffer restored (%d)", n);
    dl_module_train(a, false);
    dl_module_train(b, false);
    CHECK(same(dl_module_forward(a, x), dl_module_forward(b, x)), "restored model computes the same");
}

static void test_errors(void)
{
    dl_conv_desc g = dl_conv_desc_make(1, 0, 1, 2);
    CHECK(dl_nn_conv2d(ctx, 3, 4, 3, &g, true) == NULL, "in not divisible by groups");
    EXPECT_ERR(ctx, DL_ERR_ARG, "divisible by groups=2");
    CHECK(dl_nn_conv2d(ctx, 0, 4, 3, NULL, true) == NULL, "zero channels");
    EXPECT_ERR(ctx, DL_ERR_ARG, "must be positive");
    CHECK(dl_nn_conv1d(ctx, 2, 4, 0, NULL, true) == NULL, "kernel 0");
    EXPECT_ERR(ctx, DL_ERR_ARG, "kernel size");
    CHECK(dl_nn_max_pool2d(ctx, NULL) == NULL, "pool without desc");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_pool_desc");
    CHECK(dl_nn_batch_norm2d(ctx, 0) == NULL, "bn 0 features");
    EXPECT_ERR(ctx, DL_ERR_ARG, "num_features");
    CHECK(dl_nn_layer_norm(ctx, DL_SHAPE(0)) == NULL, "layer norm bad shape");
    EXPECT_ERR(ctx, DL_ERR_ARG, "normalized_shape");
    CHECK(dl_nn_dropout(ctx, 1.5f) == NULL, "dropout p");
    EXPECT_ERR(ctx, DL_ERR_ARG, "p=1.5");
    {   /* a conv module given the wrong channel count fails with the op's message */
        dl_module *c = dl_nn_conv2d(ctx, 3, 4, 3, NULL, true);
        CHECK(dl_module_forward(c, dl_randn(ctx, DL_SHAPE(1, 2, 8, 8))) == NULL, "channel mismatch");
        CHECK(dl_last_error(ctx) == DL_ERR_SHAPE && strstr(dl_error_message(ctx), "dl_conv2d"), "message: %s", dl_error_message(ctx));
        dl_clear_error(ctx);
    }
    CHECK(dl_nn_unflatten(ctx, 1, DL_SHAPE(-1, 4, -1)) == NULL, "unflatten with two -1");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_unflatten: sizes (-1,4,-1): each size must be >= 0, or one of them -1");
    {   /* an Unflatten whose sizes do not fit the input: the op's message */
        dl_module *u = dl_nn_unflatten(ctx, 1, DL_SHAPE(16, 7, 7));
        CHECK(dl_module_forward(u, dl_randn(ctx, DL_SHAPE(2, 780))) == NULL, "unflatten 780 as (16,7,7)");
        EXPECT_ERR(ctx, DL_ERR_SHAPE, "sizes (16,7,7) do not multiply to the size of dim 1 of (2,780) (780)");
    }
    CHECK(dl_add(dl_ones(ctx, DL_SHAPE(2)), dl_ones(ctx, DL_SHAPE(2))) != NULL, "context still works");
}

/* nn.Unflatten in a decoder: torch's state_dict indexes (the module holds
   a place, no tensors), the forward a view of its input (16*7*7 -> 16,7,7) */
static void test_unflatten(void)
{
    dl_conv_desc up = dl_conv_desc_make(2, 1, 1, 1);
    dl_module *m[3], *net;
    const dl_named_tensor *sd;
    dl_tensor *z = dl_randn(ctx, DL_SHAPE(2, 32)), *h, *y;
    int n;
    up.output_padding[0] = up.output_padding[1] = 1;
    m[0] = dl_nn_linear(ctx, 32, 16 * 7 * 7, true);
    m[1] = dl_nn_unflatten(ctx, 1, DL_SHAPE(16, 7, 7));
    m[2] = dl_nn_conv_transpose2d(ctx, 16, 8, 3, &up, true);
    net = dl_nn_sequential(ctx, 3, m);
    n = dl_module_state_dict(net, &sd);
    CHECK(n == 4 && !strcmp(sd[0].name, "0.weight") && !strcmp(sd[2].name, "2.weight") &&
          !strcmp(dl_module_type(m[1]), "Unflatten"), "Linear, Unflatten, ConvTranspose2d: 0.*, 2.* (%d tensors)", n);
    y = dl_module_forward(net, z);
    CHECK(y && y->ndim == 4 && y->shape[0] == 2 && y->shape[1] == 8 && y->shape[2] == 14 && y->shape[3] == 14,
          "decoder (2,32) -> (2,8,14,14): %s", dl_error_message(ctx));
    h = dl_module_forward(m[1], dl_module_forward(m[0], z));
    CHECK(h && h->ndim == 4 && h->shape[1] == 16 && h->shape[3] == 7 &&
          same(h, dl_reshape(dl_module_forward(m[0], z), DL_SHAPE(2, 16, 7, 7))), "Unflatten = reshape (2,16,7,7)");
    CHECK(same(dl_module_forward(dl_nn_gelu_tanh(ctx), z), dl_gelu_tanh(z)) &&
          !strcmp(dl_module_type(dl_nn_gelu_tanh(ctx)), "GELU"), "GELU(approximate='tanh') = dl_gelu_tanh");
    CHECK(same(dl_module_forward(dl_nn_softplus(ctx, 2.0f, 3.0f), z), dl_softplus(z, 2.0f, 3.0f)) &&
          !strcmp(dl_module_type(dl_nn_softplus(ctx, 1.0f, 20.0f)), "Softplus"), "Softplus(2, 3) = dl_softplus");
    CHECK(same(dl_module_forward(dl_nn_logsigmoid(ctx), z), dl_logsigmoid(z)) &&
          !strcmp(dl_module_type(dl_nn_logsigmoid(ctx)), "LogSigmoid"), "LogSigmoid = dl_logsigmoid");
    h = dl_module_forward(dl_nn_unflatten(ctx, -1, DL_SHAPE(-1, 8)), dl_randn(ctx, DL_SHAPE(3, 2, 32)));
    CHECK(h && h->ndim == 4 && h->shape[2] == 4 && h->shape[3] == 8, "Unflatten(-1, (-1, 8)) of (3,2,32): (3,2,4,8)");
}

/* The 2-d pooling fast paths (plane at a time, 2x2 unrolled, AVX-512) equal
   the general loop, which 3-d pooling with a (1, kh, kw) window runs: values
   and gradients bit for bit, with ties, NaN and -inf in the input and widths
   that leave a vector tail. */
static void test_pool_paths(void)
{
    static const int64_t Ws[] = {37, 32, 5, 64};
    static const int64_t ks[][3] = {{2, 2, 0}, {3, 2, 1}, {2, 1, 0}, {3, 3, 1}};   /* kernel, stride, pad */
    int wi, ki, mx, ceil;
    for (wi = 0; wi < 4; wi++)
        for (ki = 0; ki < 4; ki++)
            for (mx = 0; mx < 2; mx++)
                for (ceil = 0; ceil < 2; ceil++) {
                    int64_t N = 2, C = 3, H = 9, W = Ws[wi], n = N * C * H * W, i;
                    float *v = (float *)malloc(sizeof(float) * (size_t)n);
                    dl_pool_desc p2, p3;
                    dl_tensor *x2, *x3, *y2, *y3, *r;
                    bool ok;
                    for (i = 0; i < n; i++) v[i] = (float)((i * 7919) % 13) * 0.5f - 3.0f;   /* many ties */
                    v[5] = NAN;
                    v[n / 2] = -INFINITY;
                    v[n - 3] = NAN;
                    memset(&p2, 0, sizeof p2);
                    p2.kernel[0] = p2.kernel[1] = ks[ki][0];
                    p2.stride[0] = p2.stride[1] = ks[ki][1];
                    p2.padding[0] = p2.padding[1] = ks[ki][2];
                    p2.ceil_mode = ceil != 0;
                    p2.no_count_include_pad = ceil != 0;
                    memset(&p3, 0, sizeof p3);
                    p3.kernel[0] = 1; p3.stride[0] = 1;
                    p3.kernel[1] = p3.kernel[2] = ks[ki][0];
                    p3.stride[1] = p3.stride[2] = ks[ki][1];
                    p3.padding[1] = p3.padding[2] = ks[ki][2];
                    p3.ceil_mode = p2.ceil_mode;
                    p3.no_count_include_pad = p2.no_count_include_pad;
                    x2 = dl_from_array(ctx, DL_SHAPE(N, C, H, W), v);
                    x3 = dl_from_array(ctx, DL_SHAPE(N, C, 1, H, W), v);
                    dl_requires_grad(x2, true);
                    dl_requires_grad(x3, true);
                    y2 = mx ? dl_max_pool2d(x2, &p2) : dl_avg_pool2d(x2, &p2);
                    y3 = mx ? dl_max_pool3d(x3, &p3) : dl_avg_pool3d(x3, &p3);
                    r = y2 ? dl_rand(ctx, DL_SHAPE(y2->shape[0], y2->shape[1], y2->shape[2], y2->shape[3])) : NULL;
                    ok = y2 && y3 && r && th_same_bytes(y2, y3);
                    CHECK(ok, "%s pool W=%lld k=%lld s=%lld p=%lld ceil=%d: 2-d path != general loop (%s)",
                          mx ? "max" : "avg", (long long)W, (long long)ks[ki][0], (long long)ks[ki][1],
                          (long long)ks[ki][2], ceil, dl_error_message(ctx));
                    if (ok) {
                        dl_tensor *r3 = dl_reshape(r, DL_SHAPE(y3->shape[0], y3->shape[1], 1, y3->shape[3], y3->shape[4]));
                        ok = dl_backward(dl_sum(dl_mul(y2, r), DL_ALL, false)) == DL_OK &&
                             dl_backward(dl_sum(dl_mul(y3, r3), DL_ALL, false)) == DL_OK &&
                             x2->grad && x3->grad && th_same_bytes(x2->grad, x3->grad);
                        CHECK(ok, "%s pool W=%lld k=%lld: gradients of the 2-d path != general loop",
                              mx ? "max" : "avg", (long long)W, (long long)ks[ki][0]);
                    }
                    free(v);
                    dl_step_end(ctx);
                }
}

/* ------------------------------------------------ RNN, LSTM, GRU */
static dl_tensor *g_run(const char *op, int n, const grec *const *rs, dl_tensor **in, const grec *p,
                        const char **bad)
{
    (void)op; (void)n; (void)rs; (void)in; (void)p;
    *bad = "test_layers runs no op cases";
    return NULL;
}

static dl_tensor *rec_t(long lo, long hi, const char *f, bool grad)
{
    const grec *r = g_find(lo, hi, "", f);
    dl_tensor *t = r ? dl_from_array(ctx, dl_shape_make(r->ndim, r->shape), r->v) : NULL;
    return t && grad ? dl_requires_grad(t, true) : t;
}

static dl_tensor *wsum(dl_tensor *a, long lo, long hi, const char *f)
{
    return dl_sum(dl_mul(a, rec_t(lo, hi, f, false)), DL_ALL, false);
}

/* torch's state_dict ("p.<name>" records, in torch's order) written into
   m's, whose names and order must be the same (!write: m's values
   compared with them instead) */
static void load_sd(long lo, long hi, const char *cname, dl_module *m, bool write)
{
    const dl_named_tensor *sd;
    int nsd = dl_module_state_dict(m, &sd), k = 0;
    long i;
    dl_no_grad_begin(ctx);
    for (i = lo; i < hi; i++) {
        const char *f = g_field(&g_recs[i]);
        if (strncmp(f, "p.", 2)) continue;
        CHECK(k < nsd && !strcmp(sd[k].name, f + 2) && g_same_shape(sd[k].t, &g_recs[i]),
              "%s: state_dict entry %d is %s, torch's %s", cname, k, k < nsd ? sd[k].name : "(none)", f + 2);
        if (k < nsd && !write) g_compare(cname, f, sd[k].t, &g_recs[i]);
        else
            CHECK(k >= nsd || dl_write(sd[k].t, g_recs[i].v, g_recs[i].numel) == DL_OK, "%s: %s written: %s", cname,
                  f, dl_error_message(ctx));
        k++;
    }
    dl_no_grad_end(ctx);
    CHECK(k == nsd, "%s: %d state_dict entries, torch %d", cname, nsd, k);
}

/* every parameter's gradient against its "grad_p.<name>" record */
static void compare_sd_grads(long lo, long hi, const char *cname, dl_module *m)
{
    const dl_named_tensor *sd;
    int nsd = dl_module_state_dict(m, &sd), k;
    for (k = 0; k < nsd; k++) {
        char f[64];
        const grec *r;
        snprintf(f, sizeof f, "grad_p.%s", sd[k].name);
        r = g_find(lo, hi, "", f);
        CHECK(r != NULL, "%s: no record %s", cname, f);
        if (r) g_compare(cname, f, sd[k].t->grad, r);
    }
}

/* one case of rnn.bin: the module made from its config, torch's state_dict
   written in (the names in torch's order), then everything compared */
static int nrnn;
static void rnn_case(long lo, long hi)
{
    const grec *cfg = g_find(lo, hi, "", "config");
    char cname[96];
    dl_rnn_desc d;
    dl_module *m;
    dl_tensor *x, *h0, *c0, *y, *hn = NULL, *cn = NULL, *loss;
    int kind;
    snprintf(cname, sizeof cname, "%.*s", (int)g_prefix_len(&g_recs[lo]), g_recs[lo].name);
    if (!cfg || cfg->numel != 8) { CHECK(0, "%s: no config record", cname); return; }
    kind = g_pi(cfg, 0);
    memset(&d, 0, sizeof d);
    d.num_layers = g_pi(cfg, 3);
    d.no_bias = !g_pi(cfg, 4);
    d.batch_first = g_pi(cfg, 5) != 0;
    d.bidirectional = g_pi(cfg, 6) != 0;
    d.relu = kind == 1;
    m = kind == 2 ? dl_nn_lstm(ctx, g_pi(cfg, 1), g_pi(cfg, 2), &d)
        : kind == 3 ? dl_nn_gru(ctx, g_pi(cfg, 1), g_pi(cfg, 2), &d) : dl_nn_rnn(ctx, g_pi(cfg, 1), g_pi(cfg, 2), &d);
    CHECK(m != NULL, "%s: module: %s", cname, dl_error_message(ctx));
    if (!m) return;
    load_sd(lo, hi, cname, m, true);
    x = rec_t(lo, hi, "x", true);
    h0 = g_pi(cfg, 7) ? rec_t(lo, hi, "h0", true) : NULL;
    c0 = g_pi(cfg, 7) && kind == 2 ? rec_t(lo, hi, "c0", true) : NULL;
    y = dl_rnn_forward(m, x, h0, c0, &hn, kind == 2 ? &cn : NULL);
    CHECK(y != NULL, "%s: forward: %s", cname, dl_error_message(ctx));
    if (!y) { dl_clear_error(ctx); return; }
    loss = dl_add(wsum(y, lo, hi, "gout"), wsum(hn, lo, hi, "gh"));
    if (cn) loss = dl_add(loss, wsum(cn, lo, hi, "gc"));
    CHECK(loss && dl_backward(loss) == DL_OK, "%s: backward: %s", cname, dl_error_message(ctx));
    g_compare(cname, "out", y, g_find(lo, hi, "", "out"));
    g_compare(cname, "h_n", hn, g_find(lo, hi, "", "h_n"));
    if (cn) g_compare(cname, "c_n", cn, g_find(lo, hi, "", "c_n"));
    g_compare(cname, "grad_x", x->grad, g_find(lo, hi, "", "grad_x"));
    if (h0) g_compare(cname, "grad_h0", h0->grad, g_find(lo, hi, "", "grad_h0"));
    if (c0) g_compare(cname, "grad_c0", c0->grad, g_find(lo, hi, "", "grad_c0"));
    compare_sd_grads(lo, hi, cname, m);
    nrnn++;
}

static void test_rnn_golden(void)
{
    g_ctx = ctx;
    if (!g_load("tests/golden/rnn.bin")) { CHECK(0, "tests/golden/rnn.bin (python3 tests/golden/gen_rnn.py)"); return; }
    g_each_case(rnn_case);
    CHECK(nrnn == 12, "rnn.bin: %d cases run, 12 expected", nrnn);
    g_free_recs();
}

/* attention.bin (gen_attention.py): F.scaled_dot_product_attention, out and
   every gradient; a bool mask's 1/0 given as int32 */
static int nsdpa, nmha;
static void sdpa_case(long lo, long hi, const char *cname)
{
    const grec *cfg = g_find(lo, hi, "", "config");
    int mk = g_pi(cfg, 0);
    dl_tensor *q = rec_t(lo, hi, "q", true), *k = rec_t(lo, hi, "k", true), *v = rec_t(lo, hi, "v", true);
    dl_tensor *mask = mk ? rec_t(lo, hi, "mask", mk == 2) : NULL, *y;
    if (mk == 1) mask = dl_to_dtype(mask, DL_DTYPE_I32);
    y = dl_scaled_dot_product_attention(q, k, v, mask, 0.0f, g_pi(cfg, 1) != 0, cfg->v[2]);
    CHECK(y && dl_backward(wsum(y, lo, hi, "gout")) == DL_OK, "%s: %s", cname, dl_error_message(ctx));
    if (!y) return;
    g_compare(cname, "out", y, g_find(lo, hi, "", "out"));
    g_compare(cname, "grad_q", q->grad, g_find(lo, hi, "", "grad_q"));
    g_compare(cname, "grad_k", k->grad, g_find(lo, hi, "", "grad_k"));
    g_compare(cname, "grad_v", v->grad, g_find(lo, hi, "", "grad_v"));
    if (mk == 2) g_compare(cname, "grad_mask", mask->grad, g_find(lo, hi, "", "grad_mask"));
    nsdpa++;
}

/* nn.MultiheadAttention with torch's state_dict written in (one case's
   loaded from torch's safetensors file): out, the averaged weights, the
   inputs' and every parameter's gradient */
static void mha_case(long lo, long hi, const char *cname)
{
    const grec *cfg = g_find(lo, hi, "", "config");
    dl_module *m;
    dl_tensor *query, *key, *value, *kpm = NULL, *am = NULL, *y, *w = NULL;
    int inputs;
    if (!cfg || cfg->numel != 9) { CHECK(0, "%s: no config record", cname); return; }
    m = dl_nn_multihead_attention(ctx, g_pi(cfg, 0), g_pi(cfg, 1), 0.0f, g_pi(cfg, 2) != 0);
    CHECK(m != NULL, "%s: module: %s", cname, dl_error_message(ctx));
    if (!m) return;
    if (strcmp(cname, "mha/three_inputs_masks") == 0) {   /* this one from torch's safetensors file */
        CHECK(dl_load_module("tests/golden/mha_torch.safetensors", m) == DL_OK, "%s: load: %s", cname,
              dl_error_message(ctx));
        load_sd(lo, hi, cname, m, false);
    } else
        load_sd(lo, hi, cname, m, true);
    inputs = g_pi(cfg, 3);
    query = rec_t(lo, hi, "query", true);
    key = inputs ? rec_t(lo, hi, "key", true) : query;
    value = inputs == 2 ? rec_t(lo, hi, "value", true) : key;
    if (g_pi(cfg, 4)) kpm = rec_t(lo, hi, "kpm", false);
    if (g_pi(cfg, 4) == 1) kpm = dl_to_dtype(kpm, DL_DTYPE_I64);
    if (g_pi(cfg, 5)) am = rec_t(lo, hi, "am", false);
    if (g_pi(cfg, 5) == 1) am = dl_to_dtype(am, DL_DTYPE_I32);
    y = dl_mha_forward(m, query, key, value, kpm, am, g_pi(cfg, 7) != 0, &w);
    CHECK(y && w && dl_backward(wsum(y, lo, hi, "gout")) == DL_OK, "%s: %s", cname, dl_error_message(ctx));
    if (!y || !w) return;
    g_compare(cname, "out", y, g_find(lo, hi, "", "out"));
    g_compare(cname, "weights", w, g_find(lo, hi, "", "weights"));
    g_compare(cname, "grad_query", query->grad, g_find(lo, hi, "", "grad_query"));
    if (inputs) g_compare(cname, "grad_key", key->grad, g_find(lo, hi, "", "grad_key"));
    if (inputs == 2) g_compare(cname, "grad_value", value->grad, g_find(lo, hi, "", "grad_value"));
    compare_sd_grads(lo, hi, cname, m);
    nmha++;
}

static void attention_case(long lo, long hi)
{
    char cname[96];
    snprintf(cname, sizeof cname, "%.*s", (int)g_prefix_len(&g_recs[lo]), g_recs[lo].name);
    if (!strncmp(cname, "sdpa/", 5)) sdpa_case(lo, hi, cname);
    else mha_case(lo, hi, cname);
}

static void test_attention_golden(void)
{
    g_ctx = ctx;
    if (!g_load("tests/golden/attention.bin")) {
        CHECK(0, "tests/golden/attention.bin (python3 tests/golden/gen_attention.py)");
        return;
    }
    g_each_case(attention_case);
    CHECK(nsdpa == 8 && nmha == 8, "attention.bin: %d SDPA and %d MHA cases run, 8 and 8 expected", nsdpa, nmha);
    g_free_recs();
}

/* SDPA: dropout_p from the context's RNG (seeded: repeats), a bool mask
   as int32 or int64 = the float mask of 0 and -inf, is_causal = tril's mask */
static void test_sdpa_masks(void)
{
    dl_tensor *ya, *yb, *yc, *bm, *fm, *q, *k, *v;
    q = dl_randn(ctx, DL_SHAPE(2, 4, 8));
    k = dl_randn(ctx, DL_SHAPE(2, 6, 8));
    v = dl_randn(ctx, DL_SHAPE(2, 6, 3));
    dl_manual_seed(ctx, 5);
    ya = dl_scaled_dot_product_attention(q, k, v, NULL, 0.3f, false, 0.0f);
    dl_manual_seed(ctx, 5);
    yb = dl_scaled_dot_product_attention(q, k, v, NULL, 0.3f, false, 0.0f);
    yc = dl_scaled_dot_product_attention(q, k, v, NULL, 0.0f, false, 0.0f);
    CHECK(ya && yb && yc && same(ya, yb) && !same(ya, yc), "SDPA dropout 0.3: seeded repeats, differs from p=0");
    bm = dl_gt(dl_randn(ctx, DL_SHAPE(4, 6)), dl_full(ctx, DL_SHAPE(1), -0.5f));
    fm = dl_masked_fill(dl_zeros(ctx, DL_SHAPE(4, 6)), dl_eq(bm, dl_zeros(ctx, DL_SHAPE(1))), -INFINITY);
    ya = dl_scaled_dot_product_attention(q, k, v, dl_to_dtype(bm, DL_DTYPE_I32), 0.0f, false, 0.0f);
    yb = dl_scaled_dot_product_attention(q, k, v, dl_to_dtype(bm, DL_DTYPE_I64), 0.0f, false, 0.0f);
    yc = dl_scaled_dot_product_attention(q, k, v, fm, 0.0f, false, 0.0f);
    CHECK(ya && yb && yc && same(ya, yb) && same(ya, yc), "SDPA: int32 mask = int64 mask = float 0/-inf mask");
    /* is_causal = the causal bool mask */
    bm = dl_tril(dl_ones(ctx, DL_SHAPE(4, 6)), 0);
    ya = dl_scaled_dot_product_attention(q, k, v, NULL, 0.0f, true, 0.0f);
    yb = dl_scaled_dot_product_attention(q, k, v, dl_to_dtype(bm, DL_DTYPE_I32), 0.0f, false, 0.0f);
    CHECK(ya && yb && same(ya, yb), "SDPA: is_causal = tril's mask");
    {   /* scores all -inf with no mask (finite q, k that overflow): 0 and gradient 0, as torch's */
        static const float qv[4] = {-1e20f, 0, 1, 0}, kv[4] = {1e20f, 0, 2e20f, 0}, vv[4] = {1, 2, 3, 4};
        static const float want[4] = {0, 0, 3, 4};
        int causal;
        for (causal = 0; causal < 2; causal++) {
            float o[4], g[4];
            dl_tensor *qq = dl_requires_grad(dl_from_array(ctx, DL_SHAPE(2, 2), qv), true);
            dl_tensor *y = dl_scaled_dot_product_attention(qq, dl_from_array(ctx, DL_SHAPE(2, 2), kv),
                                                           dl_from_array(ctx, DL_SHAPE(2, 2), vv), NULL, 0.0f,
                                                           causal != 0, 0.0f);
            CHECK(y && dl_backward(dl_sum(y, DL_ALL, false)) == DL_OK && dl_read(y, o, 4) == DL_OK &&
                  dl_read(qq->grad, g, 4) == DL_OK && !memcmp(o, want, sizeof o) && g[0] == 0 && g[1] == 0 &&
                  g[2] == 0 && g[3] == 0, "SDPA is_causal=%d, a row of -inf scores: 0, gradient 0", causal);
        }
    }
}

/* MultiheadAttention: state_dict names and shapes as torch's, init
   (xavier_uniform in_proj_weight, a Linear's out_proj.weight, zero
   biases), dl_module_forward = self-attention, dropout in training mode
   only, a checkpoint round trip */
static void range(dl_tensor *t, float *lo, float *hi)
{
    float v[4096];
    int64_t j;
    *lo = *hi = 0.0f;
    CHECK(t && t->numel <= 4096 && dl_read(t, v, t->numel) == DL_OK, "read");
    for (j = 0; t && j < t->numel && j < 4096; j++) {
        *lo = v[j] < *lo ? v[j] : *lo;
        *hi = v[j] > *hi ? v[j] : *hi;
    }
}
static void test_mha_module(void)
{
    static const char *want[] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    static const int64_t numel[] = {3 * 32 * 32, 3 * 32, 32 * 32, 32};
    const dl_named_tensor *sd;
    dl_module *m, *m2;
    dl_tensor *x, *ya, *yb, *yc, *w, *q;
    float lo, hi, b = (float)sqrt(6.0 / (32 + 96));
    int n, i;
    m = dl_nn_multihead_attention(ctx, 32, 4, 0.5f, true);
    n = dl_module_state_dict(m, &sd);
    CHECK(m && n == 4 && !strcmp(dl_module_type(m), "MultiheadAttention"), "MHA: %d state_dict entries", n);
    for (i = 0; i < n && i < 4; i++)
        CHECK(!strcmp(sd[i].name, want[i]) && sd[i].t->numel == numel[i] && sd[i].t->ndim == (i % 2 ? 1 : 2),
              "MHA state_dict %d: %s, want %s", i, sd[i].name, want[i]);
    if (n != 4) return;
    range(sd[0].t, &lo, &hi);
    CHECK(lo >= -b && hi <= b && hi > 0.95f * b && lo < -0.95f * b, "in_proj_weight in [%g, %g]: xavier_uniform "
          "bound %g", (double)lo, (double)hi, (double)b);
    range(sd[2].t, &lo, &hi);
    CHECK(lo >= -0.1768f && hi <= 0.1768f && hi > 0.16f, "out_proj.weight in [%g, %g]: U(+-1/sqrt(32))", (double)lo,
          (double)hi);
    range(sd[1].t, &lo, &hi);
    CHECK(lo == 0.0f && hi == 0.0f, "in_proj_bias zeros");
    range(sd[3].t, &lo, &hi);
    CHECK(lo == 0.0f && hi == 0.0f, "out_proj.bias zeros");
    m2 = dl_nn_multihead_attention(ctx, 32, 4, 0.0f, false);
    n = dl_module_state_dict(m2, &sd);
    CHECK(n == 2 && !strcmp(sd[0].name, "in_proj_weight") && !strcmp(sd[1].name, "out_proj.weight"),
          "bias=False: in_proj_weight and out_proj.weight only (%d entries)", n);
    /* dl_module_forward: self-attention; dropout in training mode only */
    x = dl_randn(ctx, DL_SHAPE(2, 5, 32));
    dl_module_train(m, false);
    ya = dl_module_forward(m, x);
    yb = dl_mha_forward(m, x, x, x, NULL, NULL, false, &w);
    CHECK(ya && yb && w && same(ya, yb) && w->ndim == 3 && w->shape[1] == 5 && w->shape[2] == 5,
          "eval: dl_module_forward = dl_mha_forward(x, x, x), weights (2,5,5): %s", dl_error_message(ctx));
    dl_module_train(m, true);
    yc = dl_module_forward(m, x);
    CHECK(yc && !same(ya, yc), "training: dropout 0.5 changes the output");
    /* unbatched = a batch of one */
    q = dl_narrow(x, 0, 0, 1);
    ya = dl_mha_forward(m2, q, q, q, NULL, NULL, true, NULL);
    q = dl_reshape(q, DL_SHAPE(5, 32));
    yb = dl_mha_forward(m2, q, q, q, NULL, NULL, true, &w);
    CHECK(ya && yb && w && yb->ndim == 2 && w->ndim == 2 &&
          dl_item(dl_max(dl_abs(dl_sub(dl_reshape(ya, DL_SHAPE(5, 32)), yb)), DL_ALL, false)) < 1e-6f,
          "unbatched (5,32) = a batch of one: %s", dl_error_message(ctx));
    /* a checkpoint round trip */
    CHECK(dl_save_module("build/test_layers_mha.safetensors", m) == DL_OK, "save: %s", dl_error_message(ctx));
    m2 = dl_nn_multihead_attention(ctx, 32, 4, 0.5f, true);
    CHECK(dl_load_module("build/test_layers_mha.safetensors", m2) == DL_OK, "load: %s", dl_error_message(ctx));
    dl_module_train(m, false);
    dl_module_train(m2, false);
    ya = dl_module_forward(m, x);
    yb = dl_module_forward(m2, x);
    CHECK(ya && yb && same(ya, yb), "the loaded module gives the saved one's bits");
    remove("build/test_layers_mha.safetensors");
}

/* state_dict names and shapes as torch's, init U(-1/sqrt(H), 1/sqrt(H)),
   dropout between layers only in training mode, errors */
static void test_rnn_module(void)
{
    static const char *want[] = {"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_ih_l0_reverse",
                                 "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse", "weight_ih_l1",
                                 "weight_hh_l1", "bias_ih_l1", "bias_hh_l1", "weight_ih_l1_reverse",
                                 "weight_hh_l1_reverse", "bias_ih_l1_reverse", "bias_hh_l1_reverse"};
    static const int64_t r0[] = {64, 64, 64, 64}, c0[] = {10, 16, 0, 0}, c1[] = {32, 16, 0, 0};
    dl_rnn_desc d;
    const dl_named_tensor *sd;
    dl_module *m, *g, *r, *lin;
    dl_tensor *x, *ya, *yb, *yc, *h;
    float mx = 0.0f;
    int n, i;
    memset(&d, 0, sizeof d);
    d.num_layers = 2;
    d.bidirectional = true;
    m = dl_nn_lstm(ctx, 10, 16, &d);
    n = dl_module_state_dict(m, &sd);
    CHECK(n == 16 && !strcmp(dl_module_type(m), "LSTM"), "LSTM: %d state_dict entries", n);
    for (i = 0; i < n && i < 16; i++) {
        int k = i % 4, l = i / 8;
        float v[64 * 32], lo, hi;
        int64_t j;
        CHECK(!strcmp(sd[i].name, want[i]) && sd[i].t->shape[0] == r0[k] &&
              (k < 2 ? sd[i].t->ndim == 2 && sd[i].t->shape[1] == (l ? c1 : c0)[k] : sd[i].t->ndim == 1),
              "LSTM state_dict %d: %s, want %s", i, sd[i].name, want[i]);
        CHECK(dl_read(sd[i].t, v, sd[i].t->numel) == DL_OK, "read %s", sd[i].name);
        for (j = 0, lo = hi = 0.0f; j < sd[i].t->numel; j++) {
            lo = v[j] < lo ? v[j] : lo;
            hi = v[j] > hi ? v[j] : hi;
        }
        CHECK(lo >= -0.25f && hi <= 0.25f, "%s in [%g, %g]: outside U(-1/sqrt(16), 1/sqrt(16))", sd[i].name,
              (double)lo, (double)hi);
        if (-lo > mx) mx = -lo;
        if (hi > mx) mx = hi;
    }
    CHECK(mx > 0.24f, "LSTM init spans the bound (max |w| %g)", (double)mx);
    memset(&d, 0, sizeof d);
    d.no_bias = true;
    g = dl_nn_gru(ctx, 3, 4, &d);
    n = dl_module_state_dict(g, &sd);
    CHECK(n == 2 && !strcmp(sd[0].name, "weight_ih_l0") && sd[0].t->shape[0] == 12 && !strcmp(sd[1].name, "weight_hh_l0"),
          "GRU bias=False: weight_ih_l0 (12,3), weight_hh_l0 only (%d entries)", n);
    /* dropout: between layers in training mode only; one layer: none */
    memset(&d, 0, sizeof d);
    d.num_layers = 2;
    d.dropout = 0.5f;
    r = dl_nn_gru(ctx, 3, 8, &d);
    x = dl_randn(ctx, DL_SHAPE(6, 4, 3));
    dl_module_train(r, false);
    ya = dl_module_forward(r, x);
    yb = dl_module_forward(r, x);
    dl_module_train(r, true);
    yc = dl_module_forward(r, x);
    CHECK(ya && yb && yc && same(ya, yb) && !same(ya, yc), "GRU dropout 0.5: eval twice the same, training differs");
    d.num_layers = 1;
    r = dl_nn_rnn(ctx, 3, 8, &d);
    ya = dl_module_forward(r, x);
    dl_module_train(r, false);
    yb = dl_module_forward(r, x);
    CHECK(ya && yb && same(ya, yb), "one layer: dropout has no place (torch's)");
    /* errors */
    m = dl_nn_lstm(ctx, 3, 4, NULL);
    g = dl_nn_gru(ctx, 3, 4, NULL);
    CHECK(dl_module_forward(m, dl_randn(ctx, DL_SHAPE(2, 3, 4, 3))) == NULL, "4-D x");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "LSTM: x (2,3,4,3): input must be 2-D (L, H_in) unbatched or 3-D (L, N, H_in)");
    CHECK(dl_module_forward(m, dl_randn(ctx, DL_SHAPE(5, 2, 4))) == NULL, "wrong H_in");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "LSTM: x (5,2,4): the last dim must equal input_size=3");
    x = dl_randn(ctx, DL_SHAPE(5, 2, 3));
    CHECK(dl_rnn_forward(m, x, dl_randn(ctx, DL_SHAPE(1, 3, 4)), dl_zeros(ctx, DL_SHAPE(1, 2, 4)), NULL, NULL) == NULL,
          "h0 batch");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "LSTM: h0 (1,3,4) must have shape (1, 2, 4) for x (5,2,3) (num_layers * num_directions, batch, hidden_size)");
    CHECK(dl_rnn_forward(m, x, dl_zeros(ctx, DL_SHAPE(1, 2, 4)), dl_randn(ctx, DL_SHAPE(2, 2, 4)), NULL, NULL) == NULL,
          "c0 layers");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "LSTM: c0 (2,2,4) must have shape (1, 2, 4)");
    CHECK(dl_rnn_forward(m, dl_randn(ctx, DL_SHAPE(5, 3)), dl_randn(ctx, DL_SHAPE(1, 2, 4)),
                         dl_zeros(ctx, DL_SHAPE(1, 4)), NULL, NULL) == NULL, "unbatched x, batched h0");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "LSTM: h0 (1,2,4) must have shape (1, 4) for x (5,3)");
    CHECK(dl_rnn_forward(m, x, dl_zeros(ctx, DL_SHAPE(1, 2, 4)), NULL, NULL, NULL) == NULL, "LSTM: h0 alone");
    EXPECT_ERR(ctx, DL_ERR_ARG, "LSTM: h0 given without c0: an LSTM's initial state is both h0 and c0 or neither");
    CHECK(dl_rnn_forward(m, x, NULL, dl_zeros(ctx, DL_SHAPE(1, 2, 4)), NULL, NULL) == NULL, "LSTM: c0 alone");
    EXPECT_ERR(ctx, DL_ERR_ARG, "LSTM: c0 given without h0");
    CHECK(dl_rnn_forward(g, x, NULL, dl_zeros(ctx, DL_SHAPE(1, 2, 4)), NULL, NULL) == NULL, "c0 to a GRU");
    EXPECT_ERR(ctx, DL_ERR_ARG, "GRU: c0 or c_n given: only an LSTM has a cell state");
    CHECK(dl_rnn_forward(g, x, NULL, NULL, &h, &h) == NULL && h == NULL, "c_n from a GRU");
    EXPECT_ERR(ctx, DL_ERR_ARG, "only an LSTM has a cell state");
    lin = dl_nn_linear(ctx, 3, 4, true);
    CHECK(dl_rnn_forward(lin, x, NULL, NULL, NULL, NULL) == NULL, "a Linear");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_rnn_forward: m is a Linear; it takes an RNN, LSTM or GRU");
    CHECK(dl_module_forward(m, dl_randn(ctx, DL_SHAPE(0, 2, 3))) == NULL, "sequence length 0");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "LSTM: x (0,2,3) has sequence length 0; it must be >= 1");
    d.num_layers = 1;
    d.batch_first = true;
    d.dropout = 0;
    CHECK(dl_module_forward(dl_nn_gru(ctx, 3, 4, &d), dl_randn(ctx, DL_SHAPE(2, 0, 3))) == NULL,
          "batch_first, sequence length 0");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "GRU: x (2,0,3) has sequence length 0");
    d.batch_first = false;
    if (dl_device_count(ctx, DL_DEVICE_CPU) > 1) {   /* h0 on another device than x */
        dl_tensor *h1 = dl_to(dl_zeros(ctx, DL_SHAPE(1, 2, 4)), dl_cpu_device(1));
        dl_tensor *x0 = dl_to(x, dl_cpu_device(0));
        CHECK(dl_rnn_forward(m, x0, h1, dl_zeros(ctx, DL_SHAPE(1, 2, 4)), NULL, NULL) == NULL, "h0 on another device");
        EXPECT_ERR(ctx, DL_ERR_DEVICE, "LSTM: x (5,2,3) is on cpu:0 but h0 (1,2,4) is on cpu:1");
    }
    dl_clear_error(ctx);
    CHECK(dl_rnn_forward(m, NULL, NULL, NULL, NULL, NULL) == NULL && dl_last_error(ctx) == DL_OK, "NULL x: no message");
    CHECK(dl_nn_lstm(ctx, 3, 0, NULL) == NULL, "hidden 0");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_lstm: input_size=3 and hidden_size=0 must be positive");
    memset(&d, 0, sizeof d);
    d.num_layers = -1;
    CHECK(dl_nn_gru(ctx, 3, 4, &d) == NULL, "num_layers -1");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_gru: num_layers=-1 must be in 1..1024");
    d.num_layers = 0;
    d.dropout = 1.5f;
    CHECK(dl_nn_rnn(ctx, 3, 4, &d) == NULL, "dropout 1.5");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_rnn: dropout=1.5 must be in [0, 1]");
    d.dropout = 0.0f;
    d.relu = true;
    CHECK(dl_nn_lstm(ctx, 3, 4, &d) == NULL, "relu LSTM");
    EXPECT_ERR(ctx, DL_ERR_ARG, "dl_nn_lstm: relu (nonlinearity='relu') is an RNN's option, not an LSTM's");
    CHECK(dl_add(dl_ones(ctx, DL_SHAPE(2)), dl_ones(ctx, DL_SHAPE(2))) != NULL, "context still works");
}

int main(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    d.seed = 11;
    ctx = dl_ctx_init(&d);
    test_names();
    dl_step_end(ctx);
    test_forward();
    dl_step_end(ctx);
    test_batch_norm();
    dl_step_end(ctx);
    test_options();
    dl_step_end(ctx);
    test_checkpoint();
    dl_step_end(ctx);
    test_errors();
    dl_step_end(ctx);
    test_unflatten();
    dl_step_end(ctx);
    test_pool_paths();
    dl_step_end(ctx);
    test_rnn_golden();
    dl_step_end(ctx);
    test_rnn_module();
    dl_step_end(ctx);
    test_attention_golden();
    dl_step_end(ctx);
    test_sdpa_masks();
    dl_step_end(ctx);
    test_mha_module();
    dl_ctx_free(ctx);
    TEST_END();
}
