/* examples/lenet_bn.h - LeNet-BN, the model of `make run` (examples/lenet.c),
   in one place for everything that builds it: the examples (through
   common.h), bench/bench.c and tests/test_torch_roundtrip.c (whose PyTorch
   twin must match it layer for layer). Include after dl.h.
     conv 5x5 (1->6, pad 2) BN ReLU maxpool 2 | conv 5x5 (6->16) BN ReLU maxpool 2
     | flatten | linear 400->120 BN ReLU | linear 120->84 BN ReLU | linear 84->10 */
#ifndef DL_EXAMPLES_LENET_BN_H
#define DL_EXAMPLES_LENET_BN_H

static inline dl_module *ex_lenet_bn(dl_ctx *ctx)
{
    dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
    dl_module *m[] = {
        dl_nn_conv2d(ctx, 1, 6, 5, &pad2, true), dl_nn_batch_norm2d(ctx, 6), dl_nn_relu(ctx),
        dl_nn_max_pool2d(ctx, &pool),
        dl_nn_conv2d(ctx, 6, 16, 5, NULL, true), dl_nn_batch_norm2d(ctx, 16), dl_nn_relu(ctx),
        dl_nn_max_pool2d(ctx, &pool),
        dl_nn_flatten(ctx),
        dl_nn_linear(ctx, 400, 120, true), dl_nn_batch_norm1d(ctx, 120), dl_nn_relu(ctx),
        dl_nn_linear(ctx, 120, 84, true), dl_nn_batch_norm1d(ctx, 84), dl_nn_relu(ctx),
        dl_nn_linear(ctx, 84, 10, true)};
    return dl_nn_sequential(ctx, (int)(sizeof m / sizeof m[0]), m);
}

#endif
