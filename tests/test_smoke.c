/* tests/test_smoke.c - end to end on real data: trains the MLP example's
   network for 60 steps of Fashion-MNIST (a fraction of an epoch) and checks
   that the loss falls and the accuracy beats chance. Skips, saying why, when
   data/fashion-mnist is absent (run `make data`). */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <unistd.h>

int main(void)
{
    const char *dir = "data/fashion-mnist";
    dl_ctx_desc cd;
    dl_ctx *ctx;
    dl_tensor *xi, *yl, *x, *y;
    dl_transform_desc tr;
    dl_loader_desc ld;
    dl_loader *l;
    dl_module *m[4], *net;
    dl_optim *opt;
    dl_sgd_desc sd;
    double first = 0, last = 0;
    int64_t correct = 0, seen = 0;
    int step = 0;
    if (access("data/fashion-mnist/train-images-idx3-ubyte", R_OK) != 0) {   /* run from the repository root */
        SKIP("test_smoke: %s/train-images-idx3-ubyte not found, no training on real data (run `make data`)", dir);
        TEST_END();
    }
    memset(&cd, 0, sizeof cd);
    cd.seed = 1;
    ctx = dl_ctx_init(&cd);
    CHECK(dl_idx_load(ctx, "data/fashion-mnist/train-images-idx3-ubyte", DL_DTYPE_F32, &xi) == DL_OK, "images");
    CHECK(dl_idx_load(ctx, "data/fashion-mnist/train-labels-idx1-ubyte", DL_DTYPE_I64, &yl) == DL_OK, "labels");
    CHECK(xi && xi->ndim == 3 && xi->shape[0] == 60000 && xi->shape[1] == 28 && yl->numel == 60000, "60000 28x28 images");
    memset(&tr, 0, sizeof tr);
    tr.scale = 1.0f / 255.0f; tr.mean = 0.286f; tr.std = 0.353f;
    memset(&ld, 0, sizeof ld);
    ld.batch_size = 64; ld.shuffle = true; ld.num_workers = 1; ld.seed = 3;
    l = dl_loader_new(ctx, dl_tensor_dataset(ctx, xi, yl, &tr, true), &ld);
    m[0] = dl_nn_flatten(ctx);
    m[1] = dl_nn_linear(ctx, 784, 256, true);
    m[2] = dl_nn_relu(ctx);
    m[3] = dl_nn_linear(ctx, 256, 10, true);
    net = dl_nn_sequential(ctx, 4, m);
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.1f;
    sd.momentum = 0.9f;
    opt = dl_sgd(net, &sd);
    CHECK(l && net && opt, "setup: %s", dl_error_message(ctx));
    while (l && opt && step < 60 && dl_loader_next(l, &x, &y) > 0) {
        dl_tensor *logits = dl_module_forward(net, x);
        dl_tensor *loss = dl_cross_entropy(logits, y, NULL);
        dl_tensor *am;
        if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(opt) != DL_OK) { CHECK(0, "step: %s", dl_error_message(ctx)); break; }
        dl_optim_zero_grad(opt);
        if (step < 5) first += dl_item(loss) / 5;
        if (step >= 55) {
            int64_t i, *ah, *yh;
            last += dl_item(loss) / 5;
            am = dl_argmax(logits, 1, false);
            ah = th_host_i64(am);
            yh = th_host_i64(y);
            for (i = 0; ah && yh && am->numel == y->numel && i < y->numel; i++) correct += ah[i] == yh[i];
            seen += y->numel;
        }
        dl_step_end(ctx);
        step++;
    }
    printf("smoke: loss %.3f -> %.3f over %d steps, accuracy of the last 5 batches %.3f\n", first, last, step,
           seen ? (double)correct / (double)seen : 0.0);
    CHECK(step == 60 && last < first * 0.6, "loss fell: %.3f -> %.3f", first, last);
    CHECK(seen && (double)correct / (double)seen > 0.6, "accuracy above chance");
    dl_ctx_free(ctx);
    TEST_END();
}
