/* examples/model_parallel.c - model parallelism on one machine: LeNet-BN (as
   examples/lenet.c) with its convolutional half on one device and its
   classifier on another, trained on Fashion-MNIST with Adam and a cosine
   learning-rate schedule.

     device A: conv 5x5 (1->6, pad 2) BN ReLU maxpool 2 | conv 5x5 (6->16) BN ReLU maxpool 2
               --- dl_to: the activations go to B, their gradient comes back to A ---
     device B: flatten | linear 400->120 BN ReLU | linear 120->84 BN ReLU | linear 84->10

   --devices A,B picks the devices (default cpu:0,cpu:1: cpu:1 is a virtual
   CPU device with its own memory; cpu:N makes the devices cpu:0 .. cpu:N).
   Each half's parameters, gradients and Adam state live on its device; the
   batches arrive on A, the labels are moved to B for the loss. The numbers
   do not depend on the split: --devices cpu,cpu prints the same losses.
   Run it with DL_STRICT=1 and a host access to a virtual device's memory
   faults (as it would crash on a GPU). At the end, each device's memory
   (dl_memory_stats_get). Flags, data loading and printing are in
   examples/common.h.
   Build: cc -std=c99 -O2 -I. examples/model_parallel.c -o build/model_parallel -lm -lpthread
   Run:   DL_STRICT=1 build/model_parallel --epochs 2 --devices cpu:0,cpu:1   (--help for the flags) */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"

/* The model: two children on two devices, and the forward that crosses. */
typedef struct split_lenet {
    dl_module *features, *classifier;
    dl_device a, b;
} split_lenet;

static dl_tensor *split_lenet_forward(dl_module *m, dl_tensor *x)
{
    split_lenet *s = (split_lenet *)dl_module_state(m);
    dl_tensor *h = dl_module_forward(s->features, dl_to(x, s->a));   /* on A */
    return dl_module_forward(s->classifier, dl_to(h, s->b));          /* h.to(B): on B */
}

/* NULL on failure (the context's error says why). */
static dl_module *make_split_lenet(dl_ctx *ctx, dl_device a, dl_device b)
{
    dl_module *l[EX_LENET_BN_LAYERS], *m;
    split_lenet *s;
    ex_lenet_bn_layers(ctx, l);              /* examples/lenet_bn.h: the layers of lenet.c's model */
    m = dl_module_new(ctx, "SplitLeNet", split_lenet_forward, sizeof(split_lenet));
    s = (split_lenet *)dl_module_state(m);
    if (!s) return NULL;
    s->features = dl_module_add(m, "features", dl_nn_sequential(ctx, EX_LENET_BN_FEATURES, l));
    s->classifier = dl_module_add(m, "classifier", dl_nn_sequential(ctx, EX_LENET_BN_LAYERS - EX_LENET_BN_FEATURES,
                                                                     l + EX_LENET_BN_FEATURES));
    s->a = a;
    s->b = b;
    if (!s->features || !s->classifier || dl_module_to(s->features, a) != DL_OK ||   /* features.to(A) */
        dl_module_to(s->classifier, b) != DL_OK)                                     /* classifier.to(B) */
        return NULL;
    return m;
}

/* One pass over the training set. Returns 0, or 1 after printing what failed. */
static int train_epoch(ex_setup *s, dl_module *net, dl_optim *opt, ex_meter *m)
{
    dl_tensor *x, *y, *logits, *loss;
    int rc;
    dl_module_train(net, true);                               /* model.train() */
    while ((rc = dl_loader_next(s->train, &x, &y)) > 0) {     /* for X, y in dataloader: (on A) */
        dl_optim_zero_grad(opt);                              /* optimizer.zero_grad() */
        logits = dl_module_forward(net, x);                   /* pred = model(X) (on B) */
        loss = dl_cross_entropy(logits, logits ? dl_to(y, logits->device) : NULL, NULL);   /* loss_fn(pred, y.to(B)) */
        if (!ex_loss_ok(s, m, loss)) return 1;                /* an error, or NaN/Inf: stop */
        if (!ex_tb_step(s, m, opt, loss)) return 1;           /* writer.add_scalar("train/loss", loss, step) */
        if (dl_backward(loss) != DL_OK ||                     /* loss.backward(): B, then across to A */
            dl_optim_step(opt) != DL_OK ||                    /* optimizer.step(): each parameter on its device */
            !ex_meter_add(m, loss, logits, y))                /* running loss/accuracy, progress bar */
            return ex_fail(s, m);
        dl_step_end(s->ctx);                                  /* free this step's tensors, on every device */
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

/* Each device's memory: what lives there (the halves' parameters,
   gradients and Adam state; on cpu:0 also the data sets) and the peak. */
static void print_memory(ex_setup *s)
{
    dl_memory_stats ms;
    int i;
    for (i = 0; i < 2; i++) {
        if (i == 1 && !memcmp(&s->a->dev[0], &s->a->dev[1], sizeof(dl_device))) break;
        if (dl_memory_stats_get(s->ctx, s->a->dev[i], &ms) != DL_OK) continue;
        printf("memory on %s: %.1f KiB persistent, peak %.1f KiB\n", dl_device_name(s->a->dev[i]),
               (double)ms.persistent_bytes / 1024.0, (double)ms.peak_bytes / 1024.0);
    }
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
    char title[128];
    ex_parse_devices(argc, argv, &a, "model_parallel", 2, 256, 2e-3f, 2);   /* defaults: epochs, batch, lr; 2 devices */
    snprintf(title, sizeof title, "LeNet-BN split across %s and %s on Fashion-MNIST", dl_device_name(a.dev[0]),
             dl_device_name(a.dev[1]));
    ex_batch_norm_model = true;
    if (!ex_setup_fmnist(&a, title, false, 0, &s)) return ex_done(&s, 1);   /* batches arrive on A */
    net = make_split_lenet(s.ctx, a.dev[0], a.dev[1]);
    memset(&ad, 0, sizeof ad);                                /* zero: PyTorch's defaults */
    ad.lr = a.lr;
    opt = dl_adam(net, &ad);                                  /* Adam's state: on each parameter's device */
    if ((start = ex_start(&s, net, opt)) < 0) return ex_done(&s, 1);   /* --resume, --logdir; the header line */
    printf("features on %s, classifier on %s\n", dl_device_name(a.dev[0]), dl_device_name(a.dev[1]));
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
    print_memory(&s);
    return ex_done(&s, ex_finish(&s, acc));                   /* --csv, --svg, --logdir; "test accuracy: 0.xxxx" */
}
