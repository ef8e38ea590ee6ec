/* examples/lenet_bn.h - LeNet-BN, the model of `make run` (examples/lenet.c),
   in one place for everything that builds it: the examples (through
   common.h; model_parallel.c splits the same layers in two), bench/bench.c
   and tests/test_torch_roundtrip.c (whose PyTorch twin must match it layer
   for layer). Include after dl.h.
     conv 5x5 (1->6, pad 2) BN ReLU maxpool 2 | conv 5x5 (6->16) BN ReLU maxpool 2
     | flatten | linear 400->120 BN ReLU | linear 120->84 BN ReLU | linear 84->10 */
#ifndef DL_EXAMPLES_LENET_BN_H
#define DL_EXAMPLES_LENET_BN_H

#define EX_LENET_BN_LAYERS 16
#define EX_LENET_BN_FEATURES 8     /* layers [0, 8): the convolutional half (model_parallel.c) */

/* the layers in order, into m[0..EX_LENET_BN_LAYERS) (NULL entries on failure) */
static inline void ex_lenet_bn_layers(dl_ctx *ctx, dl_module **m)
{
    dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
    int k = 0;
    m[k++] = dl_nn_conv2d(ctx, 1, 6, 5, &pad2, true);
    m[k++] = dl_nn_batch_norm2d(ctx, 6);
    m[k++] = dl_nn_relu(ctx);
    m[k++] = dl_nn_max_pool2d(ctx, &pool);
    m[k++] = dl_nn_conv2d(ctx, 6, 16, 5, NULL, true);
    m[k++] = dl_nn_batch_norm2d(ctx, 16);
    m[k++] = dl_nn_relu(ctx);
    m[k++] = dl_nn_max_pool2d(ctx, &pool);
    m[k++] = dl_nn_flatten(ctx);
    m[k++] = dl_nn_linear(ctx, 400, 120, true);
    m[k++] = dl_nn_batch_norm1d(ctx, 120);
    m[k++] = dl_nn_relu(ctx);
    m[k++] = dl_nn_linear(ctx, 120, 84, true);
    m[k++] = dl_nn_batch_norm1d(ctx, 84);
    m[k++] = dl_nn_relu(ctx);
    m[k++] = dl_nn_linear(ctx, 84, 10, true);
}

static inline dl_module *ex_lenet_bn(dl_ctx *ctx)
{
    dl_module *m[EX_LENET_BN_LAYERS];
    ex_lenet_bn_layers(ctx, m);
    return dl_nn_sequential(ctx, EX_LENET_BN_LAYERS, m);
}

#endif
