/* examples/softmax_regression.c - softmax regression (one linear layer
   784 -> 10, cross-entropy) on Fashion-MNIST with plain SGD and a cosine learning-rate schedule.
   Build: cc -std=c99 -O2 -I. examples/softmax_regression.c -o build/softmax_regression -lm -lpthread */
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
    ex_parse(argc, argv, &a, 10, 256, 0.1f);
    if (ex_setup_fmnist(&a, false, 0, &s)) {
        dl_module *m[2], *net;
        m[0] = dl_nn_flatten(s.ctx);
        m[1] = dl_nn_linear(s.ctx, 784, 10, true);
        net = dl_nn_sequential(s.ctx, 2, m);
        memset(&sd, 0, sizeof sd);
        sd.lr = a.lr;
        acc = ex_train(&a, &s, net, dl_sgd(net, &sd), ex_cosine, "softmax regression on Fashion-MNIST");
    }
    dl_ctx_free(s.ctx);
    return acc < 0;
}
