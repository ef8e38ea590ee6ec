/* examples/softmax_regression.c - softmax regression (one linear layer
   784 -> 10, cross-entropy) on Fashion-MNIST with plain SGD and a cosine learning-rate schedule.
   Build: cc -std=c99 -O2 -I. examples/softmax_regression.c -o build/softmax_regression -lm -lpthread */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"

static float cosine(float base, int epoch, int epochs) { return dl_lr_cosine(base, epoch, epochs, 0.0f); }

int main(int argc, char **argv)
{
    ex_args a;
    ex_setup s;
    dl_sgd_desc sd;
    double acc = -1;
    memset(&a, 0, sizeof a);
    a.epochs = 10; a.batch = 256; a.lr = 0.1f; a.seed = 1; a.workers = 1; a.data = "data/fashion-mnist";
    ex_parse(argc, argv, &a);
    if (ex_setup_fmnist(&a, false, 0, &s)) {
        dl_module *m[2], *net;
        m[0] = dl_nn_flatten(s.ctx);
        m[1] = dl_nn_linear(s.ctx, 784, 10, true);
        net = dl_nn_sequential(s.ctx, 2, m);
        memset(&sd, 0, sizeof sd);
        sd.lr = a.lr;
        acc = ex_train(&a, &s, net, dl_sgd(net, &sd), cosine, "softmax regression on Fashion-MNIST");
    }
    dl_ctx_free(s.ctx);
    return acc < 0;
}
