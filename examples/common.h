/* examples/common.h - what the training examples share and dl.h does not
   provide: command-line flags, Fashion-MNIST loading, a progress bar,
   evaluation, and a per-epoch metrics writer (CSV + an SVG chart).
   Include after dl.h. POSIX (isatty, clock_gettime). */
#ifndef DL_EXAMPLES_COMMON_H
#define DL_EXAMPLES_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct ex_args {
    int epochs, threads, workers;
    int64_t batch;
    float lr;
    uint64_t seed;
    const char *save, *resume, *csv, *svg, *data;
    int64_t limit;      /* use only the first N training samples (0: all) */
} ex_args;

static void ex_usage(const char *prog, const ex_args *a)
{
    printf("usage: %s [--epochs N (%d)] [--batch N (%lld)] [--lr F (%g)] [--threads N (cores)]\n"
           "       [--workers N (%d)] [--seed N (%llu)] [--save FILE] [--resume FILE]\n"
           "       [--csv FILE] [--svg FILE] [--data DIR (%s)] [--limit N]\n",
           prog, a->epochs, (long long)a->batch, (double)a->lr, a->workers,
           (unsigned long long)a->seed, a->data);
}

/* Fills *a with the example's defaults (seed 1, one loader worker,
   data/fashion-mnist) and the flags over them; exits on --help or a bad flag. */
static void ex_parse(int argc, char **argv, ex_args *a, int epochs, int64_t batch, float lr)
{
    int i;
    memset(a, 0, sizeof *a);
    a->epochs = epochs;
    a->batch = batch;
    a->lr = lr;
    a->seed = 1;
    a->workers = 1;
    a->data = "data/fashion-mnist";
    for (i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { ex_usage(argv[0], a); exit(0); }
        if (!v) { fprintf(stderr, "%s: %s needs a value\n", argv[0], f); ex_usage(argv[0], a); exit(2); }
        if (!strcmp(f, "--epochs")) a->epochs = atoi(v);
        else if (!strcmp(f, "--batch")) a->batch = atoll(v);
        else if (!strcmp(f, "--lr")) a->lr = (float)atof(v);
        else if (!strcmp(f, "--threads")) a->threads = atoi(v);
        else if (!strcmp(f, "--workers")) a->workers = atoi(v);
        else if (!strcmp(f, "--seed")) a->seed = (uint64_t)atoll(v);
        else if (!strcmp(f, "--save")) a->save = v;
        else if (!strcmp(f, "--resume")) a->resume = v;
        else if (!strcmp(f, "--csv")) a->csv = v;
        else if (!strcmp(f, "--svg")) a->svg = v;
        else if (!strcmp(f, "--data")) a->data = v;
        else if (!strcmp(f, "--limit")) a->limit = atoll(v);
        else { fprintf(stderr, "%s: unknown flag %s\n", argv[0], f); ex_usage(argv[0], a); exit(2); }
        i++;
    }
    if (a->epochs < 0 || a->batch <= 0 || a->lr <= 0) { fprintf(stderr, "%s: bad --epochs/--batch/--lr\n", argv[0]); exit(2); }
}

static double ex_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Loads one split of Fashion-MNIST as persistent x (N,1,28,28) raw 0..255 and y (N). */
static int ex_load_split(dl_ctx *ctx, const char *dir, const char *split, int64_t limit,
                         dl_tensor **x, dl_tensor **y)
{
    char pi[512], pl[512];
    dl_tensor *xi, *yl;
    snprintf(pi, sizeof pi, "%s/%s-images-idx3-ubyte", dir, split);
    snprintf(pl, sizeof pl, "%s/%s-labels-idx1-ubyte", dir, split);
    if (dl_idx_load(ctx, pi, DL_DTYPE_F32, &xi) != DL_OK || dl_idx_load(ctx, pl, DL_DTYPE_I64, &yl) != DL_OK) {
        fprintf(stderr, "%s\n(run `make data` to fetch Fashion-MNIST)\n", dl_error_message(ctx));
        return 0;
    }
    if (limit > 0 && limit < xi->shape[0]) {
        dl_tensor *a = dl_keep(dl_narrow(xi, 0, 0, limit)), *b = dl_keep(dl_narrow(yl, 0, 0, limit));
        dl_free(xi); dl_free(yl);
        xi = a; yl = b;
    }
    *x = dl_keep(dl_reshape(xi, DL_SHAPE(xi->shape[0], 1, 28, 28)));
    dl_free(xi);
    *y = yl;
    dl_step_end(ctx);
    return *x && *y;
}

/* Fashion-MNIST mean and std of the 0..1 pixels */
#define EX_FMNIST_MEAN 0.2860f
#define EX_FMNIST_STD 0.3530f

/* number of rows whose arg-max equals the label */
static int64_t ex_correct(dl_tensor *logits, dl_tensor *y)
{
    dl_tensor *am = dl_argmax(logits, 1, false);
    const int64_t *p, *q;
    int64_t i, n = 0;
    if (!am) return 0;
    p = (const int64_t *)am->data;
    q = (const int64_t *)y->data;
    for (i = 0; i < y->numel; i++) n += p[i] == q[i];
    return n;
}

/* Accuracy of a classifier module over a loader, in eval mode, no grad. */
static double ex_evaluate(dl_ctx *ctx, dl_module *net, dl_loader *ld)
{
    dl_tensor *x, *y;
    int64_t correct = 0, total = 0;
    bool was = dl_module_training(net);
    dl_module_train(net, false);
    dl_no_grad_begin(ctx);
    while (dl_loader_next(ld, &x, &y) > 0) {
        correct += ex_correct(dl_module_forward(net, x), y);
        total += y->numel;
        dl_step_end(ctx);
    }
    dl_no_grad_end(ctx);
    dl_module_train(net, was);
    return total ? (double)correct / (double)total : 0.0;
}

/* One line per batch on a terminal: [=====>    ] 120/235 loss 0.4123 8123/s ETA 12s */
static void ex_progress(int64_t done, int64_t total, double loss, double rate, double eta)
{
    int i, w = 30, filled;
    if (!isatty(STDOUT_FILENO)) return;
    filled = total ? (int)(w * done / total) : w;
    printf("\r  [");
    for (i = 0; i < w; i++) putchar(i < filled ? '=' : (i == filled ? '>' : ' '));
    printf("] %lld/%lld loss %.4f %.0f samples/s ETA %.0fs   ", (long long)done, (long long)total, loss, rate, eta);
    fflush(stdout);
    if (done == total) printf("\r%*s\r", 90, "");
}

typedef struct ex_metrics {
    int n;
    double loss[1000], train_acc[1000], test_acc[1000], secs[1000];
} ex_metrics;

static void ex_metrics_add(ex_metrics *m, double loss, double tr, double te, double secs)
{
    if (m->n >= 1000) return;
    m->loss[m->n] = loss; m->train_acc[m->n] = tr; m->test_acc[m->n] = te; m->secs[m->n] = secs;
    m->n++;
}

static void ex_metrics_csv(const ex_metrics *m, const char *path)
{
    FILE *f;
    int i;
    if (!path || !(f = fopen(path, "w"))) return;
    fprintf(f, "epoch,train_loss,train_acc,test_acc,seconds\n");
    for (i = 0; i < m->n; i++) fprintf(f, "%d,%.6f,%.6f,%.6f,%.3f\n", i + 1, m->loss[i], m->train_acc[i], m->test_acc[i], m->secs[i]);
    fclose(f);
}

/* An SVG line chart of loss (left axis) and accuracies (right axis, 0..1). */
static void ex_metrics_svg(const ex_metrics *m, const char *path, const char *title)
{
    FILE *f;
    int i, s;
    double W = 640, H = 360, L = 60, R = 60, T = 40, Bm = 40, maxl = 0;
    const char *col[3] = {"#d62728", "#1f77b4", "#2ca02c"}, *lab[3] = {"train loss", "train acc", "test acc"};
    if (!path || m->n == 0 || !(f = fopen(path, "w"))) return;
    for (i = 0; i < m->n; i++) if (m->loss[i] > maxl) maxl = m->loss[i];
    if (maxl <= 0) maxl = 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n", W / 2, title);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", L, T, W - L - R, H - T - Bm);
    for (i = 0; i <= 4; i++) {
        double y = T + (H - T - Bm) * i / 4;
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.2f</text><text x=\"%.0f\" y=\"%.0f\">%.2f</text>\n",
                L - 5, y + 4, maxl * (4 - i) / 4, W - R + 5, y + 4, (4 - i) / 4.0);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">epoch</text>\n", W / 2, H - 8);
    for (s = 0; s < 3; s++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col[s]);
        for (i = 0; i < m->n; i++) {
            double x = L + (W - L - R) * (m->n == 1 ? 0.5 : (double)i / (m->n - 1));
            double v = s == 0 ? m->loss[i] / maxl : s == 1 ? m->train_acc[i] : m->test_acc[i];
            fprintf(f, "%.1f,%.1f ", x, T + (H - T - Bm) * (1 - v));
        }
        fprintf(f, "\"/>\n<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s</text>\n", L + 10 + 110 * s, T + 16, col[s], lab[s]);
    }
    fprintf(f, "</svg>\n");
    fclose(f);
}

/* Sets up ctx, Fashion-MNIST loaders (normalized; augmentation when aug)
   from the flags. Returns 0 on failure (message printed). */
typedef struct ex_setup { dl_ctx *ctx; dl_loader *train, *test; int64_t ntrain, ntest; } ex_setup;
static int ex_setup_fmnist(const ex_args *a, bool hflip, int64_t crop_padding, ex_setup *s)
{
    dl_ctx_desc cd;
    dl_tensor *xtr, *ytr, *xte, *yte;
    dl_transform_desc tr;
    dl_loader_desc ld;
    memset(s, 0, sizeof *s);
    memset(&cd, 0, sizeof cd);
    cd.seed = a->seed;
    cd.num_threads = a->threads;
    s->ctx = dl_ctx_init(&cd);
    if (!s->ctx) return 0;
    if (!ex_load_split(s->ctx, a->data, "train", a->limit, &xtr, &ytr) ||
        !ex_load_split(s->ctx, a->data, "t10k", 0, &xte, &yte)) return 0;
    memset(&tr, 0, sizeof tr);
    tr.scale = 1.0f / 255.0f; tr.mean = EX_FMNIST_MEAN; tr.std = EX_FMNIST_STD;
    tr.hflip = hflip; tr.crop_padding = crop_padding;
    memset(&ld, 0, sizeof ld);
    ld.batch_size = a->batch; ld.shuffle = true; ld.num_workers = a->workers; ld.seed = a->seed;
    s->train = dl_loader_new(s->ctx, dl_tensor_dataset(s->ctx, xtr, ytr, &tr, true), &ld);
    ld.shuffle = false;
    s->test = dl_loader_new(s->ctx, dl_tensor_dataset(s->ctx, xte, yte, &tr, false), &ld);
    s->ntrain = xtr->shape[0];
    s->ntest = xte->shape[0];
    if (!s->train || !s->test) { fprintf(stderr, "%s\n", dl_error_message(s->ctx)); return 0; }
    return 1;
}

/* The training loop every example shares: per epoch a progress bar, then
   train loss/accuracy, test accuracy, time and samples/s; --save after each
   epoch, --resume before the first, --csv/--svg at the end. Optional lr
   schedule (NULL: constant). Returns the final test accuracy (-1 on error). */
typedef float (*ex_lr_fn)(float base, int epoch, int epochs);
/* cosine annealing from the base rate to 0 over the run */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static float ex_cosine(float base, int epoch, int epochs) { return dl_lr_cosine(base, epoch, epochs, 0.0f); }
static double ex_train(const ex_args *a, ex_setup *s, dl_module *net, dl_optim *opt, ex_lr_fn sched,
                       const char *title)
{
    dl_ctx *ctx = s->ctx;
    dl_tensor *x, *y;
    ex_metrics met;
    double acc = 0;
    int epoch, start = 0;
    if (!net || !opt) { fprintf(stderr, "%s\n", dl_error_message(ctx)); return -1; }
    if (a->resume) {
        if (dl_load(a->resume, net, opt) != DL_OK) { fprintf(stderr, "%s\n", dl_error_message(ctx)); return -1; }
        start = (int)(dl_optim_steps(opt) / dl_loader_num_batches(s->train));
        dl_loader_set_epoch(s->train, start);
        printf("resumed from %s at epoch %d\n", a->resume, start);
    }
    printf("%s: %lld parameters, %lld train / %lld test samples, batch %lld, %d threads\n", title,
           (long long)dl_module_num_params(net), (long long)s->ntrain, (long long)s->ntest,
           (long long)a->batch, dl_num_threads(ctx));
    memset(&met, 0, sizeof met);
    for (epoch = start; epoch < a->epochs; epoch++) {
        double t0 = ex_now(), loss_sum = 0, secs;
        int64_t correct = 0, seen = 0, b = 0, nb = dl_loader_num_batches(s->train);
        if (sched) dl_optim_set_lr(opt, sched(a->lr, epoch, a->epochs));
        dl_module_train(net, true);
        while (dl_loader_next(s->train, &x, &y) > 0) {
            dl_tensor *logits = dl_module_forward(net, x);
            dl_tensor *loss = dl_cross_entropy(logits, y, NULL);
            double el;
            if (!loss || dl_backward(loss) != DL_OK || dl_optim_step(opt) != DL_OK) {
                fprintf(stderr, "step failed: %s\n", dl_error_message(ctx));
                return -1;
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
        acc = ex_evaluate(ctx, net, s->test);
        printf("epoch %2d  train loss %.4f  train acc %.4f  test acc %.4f  %.1fs  %.0f samples/s\n", epoch + 1,
               loss_sum / (double)seen, (double)correct / (double)seen, acc, secs, (double)seen / secs);
        fflush(stdout);
        ex_metrics_add(&met, loss_sum / (double)seen, (double)correct / (double)seen, acc, secs);
        if (a->save && dl_save(a->save, net, opt) != DL_OK) fprintf(stderr, "%s\n", dl_error_message(ctx));
    }
    if (epoch == start) acc = ex_evaluate(ctx, net, s->test);
    ex_metrics_csv(&met, a->csv);
    ex_metrics_svg(&met, a->svg, title);
    printf("test accuracy: %.4f\n", acc);
    return acc;
}
#endif
