/* examples/mlp.c - a multilayer perceptron 784-256-128-10 with ReLU on
   Fashion-MNIST, SGD with momentum 0.9 and a cosine learning-rate schedule.
   Build: cc -std=c99 -O2 -I. examples/mlp.c -o build/mlp -lm -lpthread */
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
    ex_parse(argc, argv, &a, 10, 128, 0.05f);
    if (ex_setup_fmnist(&a, false, 0, &s)) {
        dl_module *m[6], *net;
        m[0] = dl_nn_flatten(s.ctx);
        m[1] = dl_nn_linear(s.ctx, 784, 256, true);
        m[2] = dl_nn_relu(s.ctx);
        m[3] = dl_nn_linear(s.ctx, 256, 128, true);
        m[4] = dl_nn_relu(s.ctx);
        m[5] = dl_nn_linear(s.ctx, 128, 10, true);
        net = dl_nn_sequential(s.ctx, 6, m);
        memset(&sd, 0, sizeof sd);
        sd.lr = a.lr;
        sd.momentum = 0.9f;
        acc = ex_train(&a, &s, net, dl_sgd(net, &sd), ex_cosine, "MLP 784-256-128-10 on Fashion-MNIST");
    }
    dl_ctx_free(s.ctx);
    return acc < 0;
}
