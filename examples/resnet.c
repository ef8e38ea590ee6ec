/* examples/resnet.c - a small ResNet-18-style network on Fashion-MNIST:
   a user-defined residual block module (two 3x3 conv + batch norm, with a
   1x1 conv projection shortcut when the shape changes), four stages of two
   blocks (widths 16-32-64-128), global average pooling, random horizontal
   flips and random crops (padding 2), SGD momentum with a cosine schedule.
   --arch d2l trains d2l's ResNet-18 instead (examples/resnet18.h: widths
   64-128-256-512, 3x3 stem, batch 256 by default), the model of d2l's
   multiple-GPUs chapter, with the same data, augmentation and optimizer.
   The training loop is PyTorch's (train_epoch, evaluate below); flags,
   data loading, printing and checkpoints are in examples/common.h.
   Build: cc -std=c99 -O2 -I. examples/resnet.c -o build/resnet -lm -lpthread
   Run:   build/resnet --epochs 3   (--help for the flags)
          build/resnet --arch d2l --device cuda --epochs 10 */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"
#include "examples/resnet18.h"

/* state of one residual block; its children are registered on the module
   so their parameters get PyTorch-style names (layer1.0.conv1.weight ...) */
typedef struct block { dl_module *conv1, *bn1, *conv2, *bn2, *proj, *proj_bn; } block;

/* y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)) */
static dl_tensor *block_forward(dl_module *m, dl_tensor *x)
{
    block *b = (block *)dl_module_state(m);
    dl_tensor *h = dl_relu(dl_module_forward(b->bn1, dl_module_forward(b->conv1, x)));
    dl_tensor *sc = b->proj ? dl_module_forward(b->proj_bn, dl_module_forward(b->proj, x)) : x;
    h = dl_module_forward(b->bn2, dl_module_forward(b->conv2, h));
    return dl_relu(dl_add(h, sc));
}

static dl_module *residual_block(dl_ctx *ctx, int64_t in, int64_t out, int64_t stride)
{
    dl_module *m = dl_module_new(ctx, "ResidualBlock", block_forward, sizeof(block));
    block *b;
    dl_conv_desc c1 = dl_conv_desc_make(stride, 1, 1, 1), c2 = dl_conv_desc_make(1, 1, 1, 1);
    dl_conv_desc p = dl_conv_desc_make(stride, 0, 1, 1);
    if (!m) return NULL;
    b = (block *)dl_module_state(m);
    b->conv1 = dl_module_add(m, "conv1", dl_nn_conv2d(ctx, in, out, 3, &c1, false));
    b->bn1 = dl_module_add(m, "bn1", dl_nn_batch_norm2d(ctx, out));
    b->conv2 = dl_module_add(m, "conv2", dl_nn_conv2d(ctx, out, out, 3, &c2, false));
    b->bn2 = dl_module_add(m, "bn2", dl_nn_batch_norm2d(ctx, out));
    if (stride != 1 || in != out) {
        b->proj = dl_module_add(m, "shortcut", dl_nn_conv2d(ctx, in, out, 1, &p, false));
        b->proj_bn = dl_module_add(m, "shortcut_bn", dl_nn_batch_norm2d(ctx, out));
    }
    return m;
}

static dl_module *make_resnet(dl_ctx *ctx)
{
    static const int64_t width[4] = {16, 32, 64, 128};
    dl_conv_desc stem = dl_conv_desc_make(1, 1, 1, 1);
    dl_module *stage[4], *blocks[2], *m[7];
    int64_t in = 16;
    int s;
    for (s = 0; s < 4; s++) {
        blocks[0] = residual_block(ctx, in, width[s], s == 0 ? 1 : 2);
        blocks[1] = residual_block(ctx, width[s], width[s], 1);
        stage[s] = dl_nn_sequential(ctx, 2, blocks);
        in = width[s];
    }
    m[0] = dl_nn_conv2d(ctx, 1, 16, 3, &stem, false);
    m[1] = dl_nn_batch_norm2d(ctx, 16);
    m[2] = dl_nn_relu(ctx);
    m[3] = dl_nn_sequential(ctx, 4, stage);
    m[4] = dl_nn_adaptive_avg_pool2d(ctx, DL_SHAPE(1, 1));
    m[5] = dl_nn_flatten(ctx);
    m[6] = dl_nn_linear(ctx, 128, 10, true);
    return dl_nn_sequential(ctx, 7, m);
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

/* Test-set accuracy in eval mode (batch norm uses its running statistics)
   without recording a tape. -1 after printing an error. */
static double evaluate(ex_setup *s, dl_module *net)
{
    dl_tensor *x, *y;
    int64_t correct = 0, total = 0, c;
    int rc;
    dl_module_train(net, false);                              /* model.eval() */
    dl_no_grad_begin(s->ctx);                                 /* with torch.no_grad(): */
    while ((rc = dl_loader_next(s->test, &x, &y)) > 0) {
        dl_tensor *logits = dl_module_forward(net, x);        /* pred = model(X) */
        if ((c = ex_correct(logits, y)) < 0) break;           /* an error: stop */
        correct += c;
        total += y->numel;
        dl_step_end(s->ctx);
    }
    dl_no_grad_end(s->ctx);
    if (rc != 0) { ex_fail(s, NULL); return -1; }
    return total ? (double)correct / (double)total : 0.0;
}

/* --arch NAME, this example's own flag, taken out of argv before the shared
   ones are parsed: "small" (the default), "d2l", or NULL when it has no value */
static const char *take_arch(int *argc, char **argv)
{
    const char *arch = "small";
    int i, k = 1;
    for (i = 1; i < *argc; i++) {
        if (!strcmp(argv[i], "--arch")) { arch = i + 1 < *argc ? argv[++i] : NULL; continue; }
        argv[k++] = argv[i];
    }
    *argc = k;
    return arch;
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
    const char *arch = take_arch(&argc, argv);
    bool d2l = arch && !strcmp(arch, "d2l");
    ex_own_usage = "  --arch NAME   small (widths 16-32-64-128, batch 128) or d2l (d2l's ResNet-18: widths\n"
                   "                64-128-256-512, batch 256; examples/resnet18.h)\n";
    ex_parse(argc, argv, &a, d2l ? "resnet-d2l" : "resnet", 3, d2l ? 256 : 128, 0.1f);   /* defaults: epochs, batch, lr */
    if (!arch) ex_bad_args(&a, "--arch needs a value");
    if (!d2l && strcmp(arch, "small")) ex_bad_args(&a, "--arch %s: must be small or d2l", arch);
    if (!ex_setup_fmnist(&a, d2l ? "d2l ResNet-18 on Fashion-MNIST" : "small ResNet-18-style on Fashion-MNIST",
                         true, 2, &s)) return ex_done(&s, 1);
    net = d2l ? ex_resnet18(s.ctx, 1, 10) : make_resnet(s.ctx);
    if (dl_module_to(net, a.dev[0]) != DL_OK) return ex_done(&s, ex_fail(&s, NULL));   /* model.to(device) */
    memset(&sd, 0, sizeof sd);                                /* zero: PyTorch's defaults */
    sd.lr = a.lr;
    sd.momentum = 0.9f;
    sd.weight_decay = 5e-4f;
    opt = dl_sgd(net, &sd);                                   /* SGD(params, lr, momentum=0.9, weight_decay=5e-4) */
    if ((start = ex_start(&s, net, opt)) < 0) return ex_done(&s, 1);   /* --resume, --logdir; the header line */
    for (epoch = start; epoch < a.epochs; epoch++) {
        float lr = ex_cosine(a.lr, epoch, a.epochs);          /* CosineAnnealingLR, once per epoch */
        if (dl_optim_set_lr(opt, lr) != DL_OK) return ex_done(&s, ex_fail(&s, NULL));
        ex_meter_start(&m, &s, epoch);
        if (train_epoch(&s, net, opt, &m) != 0 || (acc = evaluate(&s, net)) < 0) return ex_done(&s, 1);
        ex_epoch_end(&s, &m, acc);                            /* the epoch line */
        if (!ex_tb_epoch(&s, &m, net, acc)) return ex_done(&s, 1);   /* --logdir: accuracies, histograms */
        if (!ex_save(&s, net, opt, epoch + 1)) return ex_done(&s, 1);   /* --save */
    }
    if (start == a.epochs && (acc = evaluate(&s, net)) < 0) return ex_done(&s, 1);   /* nothing left to train */
    return ex_done(&s, ex_finish(&s, acc));                   /* --csv, --svg, --logdir; "test accuracy: 0.xxxx" */
}
