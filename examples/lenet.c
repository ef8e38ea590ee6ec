/* examples/lenet.c - the main job of `make run`: a LeNet-style CNN with batch
   norm, ReLU and max-pooling trained on Fashion-MNIST with Adam.

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
    dl_pool_desc pool = dl_pool_desc_make(2, 2, 0);
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
    dl_ctx_desc cd;
    dl_ctx *ctx;
    dl_tensor *xtr, *ytr, *xte, *yte, *x, *y;
    dl_transform_desc tr;
    dl_loader_desc ld;
    dl_loader *train, *test;
    dl_module *net;
    dl_optim *opt;
    dl_adam_desc ad;
    ex_metrics met;
    double acc = 0;
    int epoch, start = 0;

    memset(&a, 0, sizeof a);
    a.epochs = 10; a.batch = 256; a.lr = 2e-3f; a.seed = 1; a.workers = 1; a.data = "data/fashion-mnist";
    ex_parse(argc, argv, &a);
    memset(&cd, 0, sizeof cd);
    cd.seed = a.seed;
    cd.num_threads = a.threads;
    ctx = dl_ctx_init(&cd);
    if (!ctx) return 1;
    if (!ex_load_split(ctx, a.data, "train", a.limit, &xtr, &ytr) || !ex_load_split(ctx, a.data, "t10k", 0, &xte, &yte)) {
        dl_ctx_free(ctx);
        return 1;
    }
    memset(&tr, 0, sizeof tr);
    tr.scale = 1.0f / 255.0f; tr.mean = EX_FMNIST_MEAN; tr.std = EX_FMNIST_STD;
    memset(&ld, 0, sizeof ld);
    ld.batch_size = a.batch; ld.shuffle = true; ld.num_workers = a.workers; ld.seed = a.seed;
    train = dl_loader_new(ctx, dl_tensor_dataset(ctx, xtr, ytr, &tr, true), &ld);
    ld.shuffle = false;
    test = dl_loader_new(ctx, dl_tensor_dataset(ctx, xte, yte, &tr, false), &ld);
    net = make_lenet(ctx);
    ad = dl_adam_desc_default();
    ad.lr = a.lr;
    opt = dl_adam(net, &ad);
    if (!train || !test || !net || !opt) { fprintf(stderr, "%s\n", dl_error_message(ctx)); dl_ctx_free(ctx); return 1; }
    if (a.resume) {
        if (dl_load(a.resume, net, opt) != DL_OK) { fprintf(stderr, "%s\n", dl_error_message(ctx)); dl_ctx_free(ctx); return 1; }
        start = (int)(dl_optim_steps(opt) / dl_loader_num_batches(train));
        printf("resumed from %s at epoch %d\n", a.resume, start);
    }
    printf("LeNet-BN on Fashion-MNIST: %lld parameters, %lld train / %lld test samples, batch %lld, %d threads\n",
           (long long)dl_module_num_params(net), (long long)xtr->shape[0], (long long)xte->shape[0],
           (long long)a.batch, dl_num_threads(ctx));
    memset(&met, 0, sizeof met);
    for (epoch = start; epoch < a.epochs; epoch++) {
        double t0 = ex_now(), loss_sum = 0, secs;
        int64_t correct = 0, seen = 0, b = 0, nb = dl_loader_num_batches(train);
        dl_module_train(net, true);
        while (dl_loader_next(train, &x, &y)) {
            dl_tensor *logits = dl_module_forward(net, x);
            dl_tensor *loss = dl_cross_entropy(logits, y);
            double el;
            if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(opt) != DL_OK) {
                fprintf(stderr, "step failed: %s\n", dl_error_message(ctx));
                dl_ctx_free(ctx);
                return 1;
            }
            dl_optim_zero_grad(opt);
            loss_sum += dl_item(loss) * (double)y->numel;
            correct += ex_correct(logits, y);
            seen += y->numel;
            dl_step_end(ctx);
            el = ex_now() - t0;
            b++;
            ex_progress(b, nb, loss_sum / (double)seen, (double)seen / el, el / (double)b * (double)(nb - b));
        }
        secs = ex_now() - t0;
        acc = ex_evaluate(ctx, net, test);
        printf("epoch %2d  train loss %.4f  train acc %.4f  test acc %.4f  %.1fs  %.0f samples/s\n", epoch + 1,
               loss_sum / (double)seen, (double)correct / (double)seen, acc, secs, (double)seen / secs);
        fflush(stdout);
        ex_metrics_add(&met, loss_sum / (double)seen, (double)correct / (double)seen, acc, secs);
        if (a.save && dl_save(a.save, net, opt) != DL_OK) fprintf(stderr, "%s\n", dl_error_message(ctx));
    }
    if (epoch == start) acc = ex_evaluate(ctx, net, test);
    ex_metrics_csv(&met, a.csv);
    ex_metrics_svg(&met, a.svg, "LeNet-BN on Fashion-MNIST");
    printf("test accuracy: %.4f\n", acc);
    dl_ctx_free(ctx);
    return 0;
}
