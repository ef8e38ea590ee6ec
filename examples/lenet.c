/* examples/lenet.c - the main job of `make run`: a LeNet-style CNN with batch
   norm, ReLU and max-pooling trained on Fashion-MNIST with Adam and a cosine learning-rate schedule.

     conv 5x5 (1->6, pad 2) BN ReLU maxpool 2 | conv 5x5 (6->16) BN ReLU maxpool 2
     | flatten | linear 400->120 BN ReLU | linear 120->84 BN ReLU | linear 84->10

   Per epoch: train loss, train accuracy, test accuracy, time, samples/s; the
   last line is "test accuracy: 0.xxxx". A progress bar on a terminal.
   Build: cc -std=c99 -O2 -I. examples/lenet.c -o build/lenet -lm -lpthread
   Run:   build/lenet --epochs 10   (make run EPOCHS=10) */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"

static dl_module *make_lenet(dl_ctx *ctx)
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

int main(int argc, char **argv)
{
    ex_args a;
    ex_setup s;
    dl_adam_desc ad; memset(&ad, 0, sizeof ad);
    double acc = -1;
    ex_parse(argc, argv, &a, 10, 256, 2e-3f);
    if (ex_setup_fmnist(&a, false, 0, &s)) {
        dl_module *net = make_lenet(s.ctx);
        ad.lr = a.lr;
        acc = ex_train(&a, &s, net, dl_adam(net, &ad), ex_cosine, "LeNet-BN on Fashion-MNIST");
    }
    dl_ctx_free(s.ctx);
    return acc < 0;
}
