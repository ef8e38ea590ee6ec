/* examples/lenet.c - the main job of `make run`: a LeNet-style CNN with batch
   norm, ReLU and max-pooling trained on Fashion-MNIST with Adam and a cosine learning-rate schedule.

     conv 5x5 (1->6, pad 2) BN ReLU maxpool 2 | conv 5x5 (6->16) BN ReLU maxpool 2
     | flatten | linear 400->120 BN ReLU | linear 120->84 BN ReLU | linear 84->10

   The training loop is PyTorch's (train_epoch, evaluate below); flags,
   data loading, printing, checkpoints and the model (ex_lenet_bn) are in
   examples/common.h.
   Per epoch: train loss, train accuracy, test accuracy, time, samples/s; the
   last line is "test accuracy: 0.xxxx". A progress bar on a terminal.
   --capture trains through a static graph: one step recorded, then replayed
   (graph_step below; examples/static_graph.c says what that gives and costs).
   Build: cc -std=c99 -O2 -I. examples/lenet.c -o build/lenet -lm -lpthread
   Run:   build/lenet --epochs 10 --logdir runs/lenet   (make run EPOCHS=10; --help for the flags)
   TensorBoard: tensorboard --logdir runs/lenet */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"

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

int main(int argc, char **argv)
{
    ex_args a;
    ex_setup s;
    ex_meter m;
    dl_module *net;
    dl_optim *opt;
    dl_adam_desc ad;
    double acc = 0;
    int epoch, start;
    graph g;
    ex_parse_capture(argc, argv, &a, "lenet", 10, 256, 2e-3f);   /* defaults: epochs, batch, lr */
    ex_batch_norm_model = true;
    if (!ex_setup_fmnist(&a, "LeNet-BN on Fashion-MNIST", false, 0, &s)) return ex_done(&s, 1);
    net = ex_lenet_bn(s.ctx);                                 /* examples/common.h */
    if (dl_module_to(net, a.dev[0]) != DL_OK) return ex_done(&s, ex_fail(&s, NULL));   /* model.to(device) */
    memset(&ad, 0, sizeof ad);                                /* zero: PyTorch's defaults */
    ad.lr = a.lr;
    opt = dl_adam(net, &ad);                                  /* torch.optim.Adam(model.parameters(), lr) */
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
