/* examples/lenet_d2l.c - the classic LeNet as in the d2l book: sigmoid
   activations, average pooling, SGD with lr 0.9, batch 256, 10 epochs (d2l
   prints a test accuracy of about 0.78-0.8 for this setup).
   The training loop is PyTorch's (train_epoch, evaluate below); flags,
   data loading, printing and checkpoints are in examples/common.h.
   Build: cc -std=c99 -O2 -I. examples/lenet_d2l.c -o build/lenet_d2l -lm -lpthread
   Run:   build/lenet_d2l --epochs 10   (--help for the flags) */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"

/* d2l's LeNet, every conv/linear weight initialized with xavier_uniform as d2l does */
static dl_module *make_lenet_d2l(dl_ctx *ctx)
{
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
    const dl_named_tensor *p;
    int i, n = dl_module_named_parameters(net, &p);            /* model.named_parameters() */
    for (i = 0; i < n; i++) if (p[i].t->ndim >= 2) dl_init_xavier_uniform(p[i].t, 1.0f);
    return net;
}

/* One pass over the training set. Returns 0, or 1 after printing what failed. */
static int train_epoch(ex_setup *s, dl_module *net, dl_optim *opt, ex_meter *m)
{
    dl_tensor *x, *y, *logits, *loss;
    int rc;
    dl_module_train(net, true);                               /* model.train() */
    while ((rc = dl_loader_next(s->train, &x, &y)) > 0) {     /* for X, y in dataloader: */
        dl_optim_zero_grad(opt);                              /* optimizer.zero_grad() */
        logits = dl_module_forward(net, x);                   /* pred = model(X) */
        loss = dl_cross_entropy(logits, y, NULL);             /* loss = loss_fn(pred, y) */
        if (!ex_loss_ok(s, m, loss)) return 1;                /* an error, or NaN/Inf: stop */
        if (!ex_tb_step(s, m, opt, loss)) return 1;           /* writer.add_scalar("train/loss", loss, step) */
        if (dl_backward(loss) != DL_OK ||                     /* loss.backward() */
            dl_optim_step(opt) != DL_OK ||                    /* optimizer.step() */
            !ex_meter_add(m, loss, logits, y))                /* running loss/accuracy, progress bar */
            return ex_fail(s, m);
        dl_step_end(s->ctx);                                  /* free this step's tensors */
    }
    return rc < 0 ? ex_fail(s, m) : 0;
}

/* Test-set accuracy in eval mode (it matters for batch norm and dropout;
   this model has neither) without recording a tape. -1 after printing an error. */
static double evaluate(ex_setup *s, dl_module *net)
{
    dl_tensor *x, *y;
    ex_tally tally = {0, NULL};                               /* correct = 0 */
    int64_t correct, total = 0;
    int rc;
    dl_module_train(net, false);                              /* model.eval() */
    dl_no_grad_begin(s->ctx);                                 /* with torch.no_grad(): */
    while ((rc = dl_loader_next(s->test, &x, &y)) > 0) {
        dl_tensor *logits = dl_module_forward(net, x);        /* pred = model(X) */
        if (!ex_tally_add(&tally, logits, y)) break;          /* correct += (pred.argmax(1) == y).sum() */
        total += y->numel;
        dl_step_end(s->ctx);
    }
    correct = ex_tally_end(&tally, rc == 0);                  /* .item(): a GPU's one read */
    dl_no_grad_end(s->ctx);
    if (correct < 0) { ex_fail(s, NULL); return -1; }
    return total ? (double)correct / (double)total : 0.0;
}

int main(int argc, char **argv)
{
    ex_args a;
    ex_setup s;
    ex_meter m;
    dl_module *net;
    dl_optim *opt;
    dl_sgd_desc sd;
    double acc = 0;
    int epoch, start;
    ex_parse(argc, argv, &a, "lenet_d2l", 10, 256, 0.9f);    /* defaults: epochs, batch, lr */
    if (!ex_setup_fmnist(&a, "d2l LeNet (sigmoid, avg-pool) on Fashion-MNIST", false, 0, &s)) return ex_done(&s, 1);
    net = make_lenet_d2l(s.ctx);
    if (dl_module_to(net, a.dev[0]) != DL_OK) return ex_done(&s, ex_fail(&s, NULL));   /* model.to(device) */
    memset(&sd, 0, sizeof sd);                                /* zero: PyTorch's defaults */
    sd.lr = a.lr;
    opt = dl_sgd(net, &sd);                                   /* torch.optim.SGD(model.parameters(), lr); constant lr */
    if ((start = ex_start(&s, net, opt)) < 0) return ex_done(&s, 1);   /* --resume, --logdir; the header line */
    for (epoch = start; epoch < a.epochs; epoch++) {
        ex_meter_start(&m, &s, epoch);
        if (train_epoch(&s, net, opt, &m) != 0 || (acc = evaluate(&s, net)) < 0) return ex_done(&s, 1);
        ex_epoch_end(&s, &m, acc);                            /* the epoch line */
        if (!ex_tb_epoch(&s, &m, net, acc)) return ex_done(&s, 1);   /* --logdir: accuracies, histograms */
        if (!ex_save(&s, net, opt, epoch + 1)) return ex_done(&s, 1);   /* --save */
    }
    if (start == a.epochs && (acc = evaluate(&s, net)) < 0) return ex_done(&s, 1);   /* nothing left to train */
    return ex_done(&s, ex_finish(&s, acc));                   /* --csv, --svg, --logdir; "test accuracy: 0.xxxx" */
}
