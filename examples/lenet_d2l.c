/* examples/lenet_d2l.c - the classic LeNet as in the d2l book: sigmoid
   activations, average pooling, SGD with lr 0.9, batch 256, 10 epochs (d2l
   prints a test accuracy of about 0.78-0.8 for this setup).
   Build: cc -std=c99 -O2 -I. examples/lenet_d2l.c -o build/lenet_d2l -lm -lpthread */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"

int main(int argc, char **argv)
{
    ex_args a;
    ex_setup s;
    dl_sgd_desc sd;
    double acc = -1;
    ex_parse(argc, argv, &a, 10, 256, 0.9f);
    if (ex_setup_fmnist(&a, false, 0, &s)) {
        dl_ctx *ctx = s.ctx;
        dl_conv_desc pad2 = dl_conv_desc_make(1, 2, 1, 1);
        dl_pool_desc pool = dl_pool_desc_make(2, 2, 0, false, true);
        dl_module *m[] = {
            dl_nn_conv2d(ctx, 1, 6, 5, &pad2, true), dl_nn_sigmoid(ctx), dl_nn_avg_pool2d(ctx, &pool),
            dl_nn_conv2d(ctx, 6, 16, 5, NULL, true), dl_nn_sigmoid(ctx), dl_nn_avg_pool2d(ctx, &pool),
            dl_nn_flatten(ctx),
            dl_nn_linear(ctx, 400, 120, true), dl_nn_sigmoid(ctx),
            dl_nn_linear(ctx, 120, 84, true), dl_nn_sigmoid(ctx),
            dl_nn_linear(ctx, 84, 10, true)};
        dl_module *net = dl_nn_sequential(ctx, (int)(sizeof m / sizeof m[0]), m);
        /* d2l initializes every conv/linear weight with xavier_uniform */
        int i, n = dl_module_named_tensors(net, true, 0, NULL, NULL);
        dl_tensor **ts = (dl_tensor **)malloc(sizeof(dl_tensor *) * (size_t)(n + 1));
        n = dl_module_named_tensors(net, true, n, ts, NULL);
        for (i = 0; i < n; i++) if (ts[i]->ndim >= 2) dl_init_xavier_uniform(ts[i], 1.0f);
        free(ts);
        memset(&sd, 0, sizeof sd);
        sd.lr = a.lr;
        acc = ex_train(&a, &s, net, dl_sgd(net, &sd), NULL, "d2l LeNet (sigmoid, avg-pool) on Fashion-MNIST");
    }
    dl_ctx_free(s.ctx);
    return acc < 0;
}
