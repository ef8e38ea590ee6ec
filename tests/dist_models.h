/* tests/dist_models.h - what test_dist.c and test_mpi.c share: the models
   they train (an MLP, LeNet with or without batch norm), the small unlike
   models of the mismatch tests, the loss, and the worst relative difference
   between two models' parameters. Include after dl.h (with
   DL_IMPLEMENTATION) and harness.h. */
#ifndef DL_TEST_DIST_MODELS_H
#define DL_TEST_DIST_MODELS_H
#include <stdlib.h>

static dl_module *make_mlp(dl_ctx *c)
{
    dl_module *m[5];
    m[0] = dl_nn_flatten(c);
    m[1] = dl_nn_linear(c, 784, 64, true);
    m[2] = dl_nn_relu(c);
    m[3] = dl_nn_linear(c, 64, 32, true);
    m[4] = dl_nn_linear(c, 32, 10, true);
    return dl_nn_sequential(c, 5, m);
}

/* LeNet (ReLU, max pooling), with batch norm after each convolution when bn */
static dl_module *make_lenet(dl_ctx *c, bool bn)
{
    dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
    dl_module *m[16];
    int k = 0;
    m[k++] = dl_nn_conv2d(c, 1, 6, 5, &pad2, true);
    if (bn) m[k++] = dl_nn_batch_norm2d(c, 6);
    m[k++] = dl_nn_relu(c);
    m[k++] = dl_nn_max_pool2d(c, &pool);
    m[k++] = dl_nn_conv2d(c, 6, 16, 5, NULL, true);
    if (bn) m[k++] = dl_nn_batch_norm2d(c, 16);
    m[k++] = dl_nn_relu(c);
    m[k++] = dl_nn_max_pool2d(c, &pool);
    m[k++] = dl_nn_flatten(c);
    m[k++] = dl_nn_linear(c, 400, 120, true);
    m[k++] = dl_nn_relu(c);
    m[k++] = dl_nn_linear(c, 120, 84, true);
    m[k++] = dl_nn_relu(c);
    m[k++] = dl_nn_linear(c, 84, 10, true);
    return dl_nn_sequential(c, k, m);
}

/* kind 0: the MLP, 1: LeNet, 2: LeNet-BN in eval mode */
static dl_module *make_model(dl_ctx *c, int kind)
{
    dl_module *m = kind == 0 ? make_mlp(c) : make_lenet(c, kind == 2);
    if (m && kind == 2) dl_module_train(m, false);
    return m;
}

/* the models of the mismatch tests (dl_ddp_init across ranks that build
   different models): 0: Sequential(Linear(4,4)), "0.weight" (4,4) and
   "0.bias" (4); 1: "w" (3,4) alone; 2: "other_name" (4,3) alone; 3: as 0
   with a bias of 5; 4: as 0 with an extra Linear(4,4) ("1.weight", "1.bias") */
static dl_module *mismatch_model(dl_ctx *c, int v)
{
    dl_module *m, *p;
    if (v == 1 || v == 2) {
        p = dl_module_new(c, "Odd", NULL, 0);
        dl_module_param(p, v == 1 ? "w" : "other_name", dl_zeros(c, v == 1 ? DL_SHAPE(3, 4) : DL_SHAPE(4, 3)));
        return p;
    }
    m = dl_nn_sequential(c, 0, NULL);
    p = dl_module_new(c, "Odd", NULL, 0);
    dl_module_param(p, "weight", dl_zeros(c, DL_SHAPE(4, 4)));
    dl_module_param(p, "bias", dl_zeros(c, v == 3 ? DL_SHAPE(5) : DL_SHAPE(4)));
    dl_module_add(m, "0", p);
    if (v == 4) dl_module_add(m, "1", dl_nn_linear(c, 4, 4, true));
    return m;
}

static dl_tensor *ce_loss(dl_module *m, dl_tensor *x, dl_tensor *y, void *user)
{
    (void)user;
    return dl_cross_entropy(dl_module_forward(m, x), y, NULL);
}

/* one step of the reference: the model on the whole batch x (B,1,28,28),
   y (B); the loss, NAN on an error */
static float ref_step(dl_ctx *c, dl_module *ref, dl_optim *o, const float *xb, const int64_t *yb, int64_t B)
{
    dl_tensor *loss;
    dl_optim_zero_grad(o);
    loss = ce_loss(ref, dl_from_array(c, DL_SHAPE(B, 1, 28, 28), xb), dl_from_int64(c, DL_SHAPE(B), yb), NULL);
    if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(o) != DL_OK) return NAN;
    return dl_item(loss);
}

/* the largest |a - b| / max |b| of a parameter, the worst over the
   parameters; each (may be NULL) sees a's values of every parameter */
static double param_diff(dl_module *a, dl_module *b, void (*each)(const float *x, int64_t n, void *u), void *u)
{
    const dl_named_tensor *pa, *pb;
    int n = dl_module_named_parameters(a, &pa), i;
    double worst = 0;
    if (n != dl_module_named_parameters(b, &pb)) return 1e30;
    dl_module_named_parameters(a, &pa);
    for (i = 0; i < n; i++) {
        int64_t k, ne = pa[i].t->numel;
        float *x = (float *)malloc(sizeof(float) * (size_t)ne), *y = (float *)malloc(sizeof(float) * (size_t)ne);
        double dmax = 0, ymax = 0;
        dl_read(pa[i].t, x, ne);
        dl_read(pb[i].t, y, ne);
        for (k = 0; k < ne; k++) {
            double d = fabs((double)x[k] - y[k]);
            if (d > dmax || d != d) dmax = d != d ? 1e30 : d;
            if (fabs(y[k]) > ymax) ymax = fabs(y[k]);
        }
        if (dmax / (ymax > 0 ? ymax : 1) > worst) worst = dmax / (ymax > 0 ? ymax : 1);
        if (each) each(x, ne, u);
        free(x);
        free(y);
    }
    return worst;
}
#endif
