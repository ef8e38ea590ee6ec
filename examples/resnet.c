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
   --capture trains through a static graph: one step recorded, then replayed
   (graph_step below; examples/static_graph.c says what that gives and costs).
   Build: cc -std=c99 -O2 -I. examples/resnet.c -o build/resnet -lm -lpthread
   Run:   build/resnet --epochs 3   (--help for the flags)
          build/resnet --arch d2l --device cuda --epochs 10 */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"
#include "examples/resnet18.h"
#include "examples/resnet_small.h"   /* the net and its block, a user module */

/* --capture: PyTorch's whole-network capture (torch.cuda.graph). The step
   is recorded once on static inputs, x and y kept from the first full batch
   (which ran eagerly: it made the gradients the capture updates); each later
   full batch is copied into them and the recorded work replayed. The loss
   and the logits are the capture's tensors, rewritten by each replay. */
typedef struct graph { dl_capture *cap; dl_tensor *x, *y, *logits, *loss; } graph;

static dl_tensor *graph_step(ex_setup *s, graph *g, dl_module *net, dl_optim *opt, dl_tensor *x, dl_tensor *y,
                             dl_tensor **logits)
{
    *logits = NULL;
    if (dl_copy_(g->x, x) != DL_OK || dl_copy_(g->y, y) != DL_OK) return NULL;   /* static_x.copy_(x) */
    if (g->cap) {
        if (dl_replay(g->cap) != DL_OK) return NULL;          /* g.replay() */
    } else {
        g->cap = dl_capture_begin(s->ctx);                    /* with torch.cuda.graph(g): */
        dl_optim_zero_grad(opt);
        g->logits = dl_module_forward(net, g->x);
        g->loss = dl_cross_entropy(g->logits, g->y, NULL);
        if (g->loss && dl_backward(g->loss) == DL_OK) dl_optim_step(opt);
        if (dl_capture_end(g->cap) != DL_OK) return NULL;     /* the first error inside, if any */
    }
    *logits = g->logits;
    return g->loss;
}

/* One pass over the training set. Returns 0, or 1 after printing what failed. */
static int train_epoch(ex_setup *s, dl_module *net, dl_optim *opt, ex_meter *m, graph *g)
{
    dl_tensor *x, *y, *logits, *loss;
    int rc;
    dl_module_train(net, true);                               /* model.train() */
    while ((rc = dl_loader_next(s->train, &x, &y)) > 0) {     /* for X, y in dataloader: */
        if (g && g->x && x->shape[0] == g->x->shape[0]) {     /* --capture: the static graph */
            if (!ex_loss_ok(s, m, loss = graph_step(s, g, net, opt, x, y, &logits))) return 1;
            if (!ex_tb_step(s, m, opt, loss) || !ex_meter_add(m, loss, logits, y)) return ex_fail(s, m);
            dl_step_end(s->ctx);
            continue;
        }
        dl_optim_zero_grad(opt);                              /* optimizer.zero_grad() */
        logits = dl_module_forward(net, x);                   /* pred = model(X) */
        loss = dl_cross_entropy(logits, y, NULL);             /* loss = loss_fn(pred, y) */
        if (!ex_loss_ok(s, m, loss)) return 1;                /* an error, or NaN/Inf: stop */
        if (!ex_tb_step(s, m, opt, loss)) return 1;           /* writer.add_scalar("train/loss", loss, step) */
        if (dl_backward(loss) != DL_OK ||                     /* loss.backward() */
            dl_optim_step(opt) != DL_OK ||                    /* optimizer.step() */
            !ex_meter_add(m, loss, logits, y))                /* running loss/accuracy, progress bar */
            return ex_fail(s, m);
        if (g && !g->x && x->shape[0] == s->a->batch && (!(g->x = dl_keep(x)) || !(g->y = dl_keep(y))))
            return ex_fail(s, m);                             /* --capture: the static inputs */
        dl_step_end(s->ctx);                                  /* free this step's tensors */
    }
    return rc < 0 ? ex_fail(s, m) : 0;
}

/* Test-set accuracy in eval mode (batch norm uses its running statistics)
   without recording a tape. -1 after printing an error. */
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

/* --arch NAME, this example's own flag, taken out of argv before the shared
   ones are parsed: "small" (the default), "d2l", or NULL when it has no value */
static const char *take_arch(int *argc, char **argv)
{
    const char *arch = "small";
    int i, k = 1;
    for (i = 1; i < *argc; i++) {
        if (!strcmp(argv[i], "--arch")) {   /* (a flag after it is no value: "--arch --epochs 1") */
            arch = i + 1 < *argc && strncmp(argv[i + 1], "--", 2) ? argv[++i] : NULL;
            continue;
        }
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
    graph g;
    const char *arch = take_arch(&argc, argv);
    bool d2l = arch && !strcmp(arch, "d2l");
    ex_own_usage = "  --arch NAME   small (widths 16-32-64-128, batch 128) or d2l (d2l's ResNet-18: widths\n"
                   "                64-128-256-512, batch 256; examples/resnet18.h)\n";
    ex_parse_capture(argc, argv, &a, d2l ? "resnet-d2l" : "resnet", 3, d2l ? 256 : 128, 0.1f);   /* defaults: epochs, batch, lr */
    if (!arch) ex_bad_args(&a, "--arch needs a value");
    if (!d2l && strcmp(arch, "small")) ex_bad_args(&a, "--arch %s: must be small or d2l", arch);
    ex_batch_norm_model = false;   /* (BatchNorm2d on >= 4x4 maps: a batch of one has 16+ values a channel, as PyTorch trains it) */
    if (!ex_setup_fmnist(&a, d2l ? "d2l ResNet-18 on Fashion-MNIST" : "small ResNet-18-style on Fashion-MNIST",
                         true, 2, &s)) return ex_done(&s, 1);
    net = d2l ? ex_resnet18(s.ctx, 1, 10) : ex_resnet_small(s.ctx);
    if (dl_module_to(net, a.dev[0]) != DL_OK) return ex_done(&s, ex_fail(&s, NULL));   /* model.to(device) */
    memset(&sd, 0, sizeof sd);                                /* zero: PyTorch's defaults */
    sd.lr = a.lr;
    sd.momentum = 0.9f;
    sd.weight_decay = 5e-4f;
    opt = dl_sgd(net, &sd);                                   /* SGD(params, lr, momentum=0.9, weight_decay=5e-4) */
    if ((start = ex_start(&s, net, opt)) < 0) return ex_done(&s, 1);   /* --resume, --logdir; the header line */
    memset(&g, 0, sizeof g);
    for (epoch = start; epoch < a.epochs; epoch++) {
        float lr = ex_cosine(a.lr, epoch, a.epochs);          /* CosineAnnealingLR, once per epoch */
        if (dl_optim_set_lr(opt, lr) != DL_OK) return ex_done(&s, ex_fail(&s, NULL));
        ex_meter_start(&m, &s, epoch);
        if (train_epoch(&s, net, opt, &m, a.capture ? &g : NULL) != 0 || (acc = evaluate(&s, net)) < 0)
            return ex_done(&s, 1);
        ex_epoch_end(&s, &m, acc);                            /* the epoch line */
        if (!ex_tb_epoch(&s, &m, net, acc)) return ex_done(&s, 1);   /* --logdir: accuracies, histograms */
        if (!ex_save(&s, net, opt, epoch + 1)) return ex_done(&s, 1);   /* --save */
    }
    if (start == a.epochs && (acc = evaluate(&s, net)) < 0) return ex_done(&s, 1);   /* nothing left to train */
    return ex_done(&s, ex_finish(&s, acc));                   /* --csv, --svg, --logdir; "test accuracy: 0.xxxx" */
}
