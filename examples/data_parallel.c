/* examples/data_parallel.c - data-parallel training (d2l's "multiple GPUs"
   chapter): LeNet-BN on Fashion-MNIST with each minibatch split over
   several devices. Every device holds a replica of the model and its Adam
   state; each computes gradients on its part of the batch, dl_ddp sums
   them (a ring allreduce) and every replica takes the same step, so the
   replicas stay identical. Batch-norm statistics are per replica (each sees
   its part of the batch), as with PyTorch's DataParallel.

   By default it trains on 1, 2 and 4 virtual CPU devices (cpu:0..3) and
   prints per-epoch test accuracy and time, then a table; `--devices
   cpu:0,cpu:1` (or cuda:0,cuda:1 in a CUDA build) picks one set, and the
   flag may be repeated. Built with -DDL_MPI and launched by mpirun, each
   process is one replica (or its --devices list): the same code, with a
   dl_comm across the processes. `--ranks N` does the same with N threads of
   this process instead of N processes (DL_COMM_THREADS): each thread has its
   own context and replica, so the replicas compute at the same time.
   `--model resnet18` trains d2l's ResNet-18 (examples/resnet18.h) with
   d2l's plain SGD at lr 0.1 instead: the chapter's two-GPU experiment is
   build/cuda/data_parallel --model resnet18 --devices cuda:0,cuda:1
   (on a device other than cpu:0 the data set lives there as bytes and
   each batch is made there: dl_loader_desc.device_data).

   Build: cc -std=c99 -O2 -I. examples/data_parallel.c -o build/data_parallel -lm -lpthread
   Run:   build/data_parallel --epochs 2 --threads 2
          build/data_parallel --devices cpu:0,cpu:1 --epochs 1
   MPI:   mpicc -std=c99 -O2 -DDL_MPI -I. examples/data_parallel.c -o build/mpi/data_parallel -lm -lpthread
          mpirun --allow-run-as-root --oversubscribe -np 2 build/mpi/data_parallel --epochs 1 --threads 1
   Threads: build/data_parallel --ranks 2 --threads 1 --epochs 1 */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"
#include "examples/resnet18.h"
#include <pthread.h>   /* --ranks: a thread a rank */

#define MAX_RUNS 8
#define MAX_DEV 16

static int g_rank;                          /* this process (MPI), 0 otherwise */

typedef struct run {
    const char *spec;           /* its --devices value (NULL: a default run) */
    int n;                      /* devices in this run */
    dl_device dev[MAX_DEV];
    double secs, acc;           /* mean epoch time (training only), last test accuracy */
} run;

typedef struct flags {
    const char *prog, *data;
    bool resnet18;              /* --model resnet18 (else LeNet-BN) */
    int epochs, threads, nruns, ranks;
    int64_t batch, limit, bucket_kb;
    float lr;
    run runs[MAX_RUNS];
} flags;

static void usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s [--devices LIST]... [--epochs N (2)] [--batch N (256)] [--lr F (0.002)]\n"
            "       [--threads N (0)] [--limit N (0)] [--data DIR (data/fashion-mnist)] [--ranks N (0)]\n"
            "       [--bucket-kb N (0)] [--model NAME (lenet_bn)]\n"
            "  --devices LIST  comma-separated devices, one replica each: cpu:0,cpu:1 or cuda:0,cuda:1\n"
            "                  (at most %d, no repeats); repeat the flag for several runs; default:\n"
            "                  three runs, on cpu:0 | cpu:0,cpu:1 | cpu:0,cpu:1,cpu:2,cpu:3\n"
            "  --epochs N      epochs per run, 1..%d\n"
            "  --batch N       samples per step over all devices, 1..%d (at least two per device:\n"
            "                  batch norm)\n"
            "  --lr F          the learning rate (Adam's; resnet18: SGD's, default 0.1), a finite number > 0\n"
            "  --threads N     kernel threads in all, 0..%d (0: every core)\n"
            "  --limit N       train on the first N samples, N >= 0 (0: all)\n"
            "  --data DIR      the Fashion-MNIST IDX files (`make data`)\n"
            "  --ranks N       1..16 thread ranks, each with its own context and its --devices list\n"
            "                  (DL_COMM_THREADS; --threads is then per rank); 0: one rank, this thread\n"
            "  --bucket-kb N   gradient buckets of N KiB, 0..1048576 (0: 25 MB, as PyTorch's DDP); with\n"
            "                  --ranks each bucket is summed as soon as backward has finished it\n"
            "  --model NAME    lenet_bn (LeNet-BN, Adam) or resnet18 (d2l's ResNet-18, SGD as d2l)\n",
            prog, MAX_DEV, EX_MAX_EPOCHS, EX_MAX_BATCH, EX_MAX_THREADS);
}

static void bad(const char *prog, const char *fmt, const char *flag, const char *v, const char *rule)
{
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, flag, v, rule);
    fprintf(stderr, "\n");
    usage(stderr, prog);
    exit(2);
}

static int64_t int_flag(const char *prog, const char *flag, const char *v, int64_t lo, int64_t hi, const char *rule)
{
    char *end;
    long long x;
    errno = 0;
    x = strtoll(v, &end, 10);
    if (!((v[0] >= '0' && v[0] <= '9') || v[0] == '-' || v[0] == '+') || *end || errno == ERANGE || x < lo || x > hi)
        bad(prog, "%s %s: must be %s", flag, v, rule);
    return (int64_t)x;
}

/* "cpu:0,cpu:1" -> a run; exit 2 naming the bad part */
static void devices_flag(const char *prog, const char *v, run *r)
{
    char buf[256], *tok, *end;
    int i;
    if (strlen(v) >= sizeof buf) bad(prog, "%s %.40s...: %s", "--devices", v, "too long");
    if (!v[0]) bad(prog, "%s '%s': %s", "--devices", v, "needs at least one device");
    strcpy(buf, v);
    r->spec = v;
    r->n = 0;
    for (tok = buf; tok; tok = end ? end + 1 : NULL) {   /* every item, empty ones too */
        dl_device d;
        if ((end = strchr(tok, ','))) *end = 0;
        if (!tok[0]) bad(prog, "%s %s: %s", "--devices", v, "an empty device name (two commas, or one at an end)");
        d = dl_device_parse(tok);
        if (d.type < 0) bad(prog, "%s %s: '%s' is not a device like cpu:1 or cuda:0", "--devices", v, tok);
        if (d.type == DL_DEVICE_CPU && d.index >= EX_MAX_CPU_DEVICES)
            bad(prog, "%s %s: '%s' does not exist: CPU devices go from cpu:0 to cpu:63", "--devices", v, tok);
        if (r->n == MAX_DEV) bad(prog, "%s %s: %s", "--devices", v, "more than 16 devices");
        for (i = 0; i < r->n; i++)
            if (r->dev[i].type == d.type && r->dev[i].index == d.index)
                bad(prog, "%s %s: '%s' appears twice (one replica per device)", "--devices", v, tok);
        r->dev[r->n++] = d;
    }
}

/* Every device of every run exists in this build and on this machine
   (cuda:0 in a build without DL_CUDA does not): else prog: --devices LIST:
   dl.h's reason, the usage, exit 2, before any work. */
static void devices_exist(const flags *f)
{
    dl_ctx_desc cd;
    dl_ctx *ctx;
    dl_memory_stats ms;
    int i, k, ncpu = 1;
    for (k = 0; k < f->nruns; k++)
        for (i = 0; i < f->runs[k].n; i++)
            if (f->runs[k].dev[i].type == DL_DEVICE_CPU && f->runs[k].dev[i].index + 1 > ncpu)
                ncpu = f->runs[k].dev[i].index + 1;
    memset(&cd, 0, sizeof cd);
    cd.cpu_devices = ncpu > 1 ? ncpu : 0;
    cd.device = dl_cpu();                     /* --devices name the replicas' devices: DL_DEVICE does not apply */
    cd.log = dl_log_silent;
    if (!(ctx = dl_ctx_init(&cd))) {
        fprintf(stderr, "%s: cannot create a context: %s\n", f->prog, dl_error_message(NULL));
        exit(1);
    }
    for (k = 0; k < f->nruns; k++)
        for (i = 0; i < f->runs[k].n; i++)
            if (dl_memory_stats_get(ctx, f->runs[k].dev[i], &ms) != DL_OK) {
                const char *msg = dl_error_message(ctx), *why = strstr(msg, ": ");
                char v[64], reason[800];
                snprintf(v, sizeof v, "%s", dl_device_name(f->runs[k].dev[i]));
                snprintf(reason, sizeof reason, "%s", why ? why + 2 : msg);   /* without "dl_memory_stats_get: " */
                dl_ctx_free(ctx);
                bad(f->prog, "%s %s: %s", "--devices", f->runs[k].spec ? f->runs[k].spec : v, reason);
            }
    dl_ctx_free(ctx);
}

static void parse(int argc, char **argv, flags *f)
{
    int i, k;
    memset(f, 0, sizeof *f);
    f->prog = argv[0];
    f->data = "data/fashion-mnist";
    f->epochs = 2;
    f->batch = 256;
    f->lr = 0.0f;                             /* not given: 2e-3 (LeNet-BN, Adam), 0.1 (resnet18, SGD) */
    for (i = 1; i < argc; i += 2) {
        const char *fl = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(fl, "--help") || !strcmp(fl, "-h")) { usage(stdout, f->prog); exit(0); }
        if (strcmp(fl, "--devices") && strcmp(fl, "--epochs") && strcmp(fl, "--batch") && strcmp(fl, "--lr") &&
            strcmp(fl, "--threads") && strcmp(fl, "--limit") && strcmp(fl, "--data") && strcmp(fl, "--ranks") &&
            strcmp(fl, "--bucket-kb") && strcmp(fl, "--model"))
            bad(f->prog, "unknown flag %s%s%s", fl, "", "");
        if (!v) bad(f->prog, "%s needs a value%s%s", fl, "", "");
        if (!strcmp(fl, "--devices")) {
            if (f->nruns == MAX_RUNS) bad(f->prog, "%s %s: %s", fl, v, "at most 8 runs");
            devices_flag(f->prog, v, &f->runs[f->nruns++]);
        } else if (!strcmp(fl, "--epochs")) f->epochs = (int)int_flag(f->prog, fl, v, 1, EX_MAX_EPOCHS, "a whole number from 1 to 1000");
        else if (!strcmp(fl, "--batch")) f->batch = int_flag(f->prog, fl, v, 1, EX_MAX_BATCH, "a whole number from 1 to 65536");
        else if (!strcmp(fl, "--threads")) f->threads = (int)int_flag(f->prog, fl, v, 0, EX_MAX_THREADS, "a whole number from 0 to 1024");
        else if (!strcmp(fl, "--limit")) f->limit = int_flag(f->prog, fl, v, 0, INT64_MAX, "a whole number >= 0");
        else if (!strcmp(fl, "--data")) {
            if (!v[0] || !strncmp(v, "--", 2)) bad(f->prog, "%s '%s': %s", fl, v, "needs a directory");
            f->data = v;
        }
        else if (!strcmp(fl, "--model")) {
            if (strcmp(v, "lenet_bn") && strcmp(v, "resnet18")) bad(f->prog, "%s %s: %s", fl, v, "must be lenet_bn or resnet18");
            f->resnet18 = !strcmp(v, "resnet18");
        }
        else if (!strcmp(fl, "--ranks")) f->ranks = (int)int_flag(f->prog, fl, v, 0, 16, "a whole number from 0 to 16");
        else if (!strcmp(fl, "--bucket-kb"))
            f->bucket_kb = int_flag(f->prog, fl, v, 0, 1048576, "a whole number from 0 to 1048576");
        else {
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end || isspace((unsigned char)v[0]) || !isfinite(x) || !(x > 0) || x > FLT_MAX ||
                !((float)x > 0))
                bad(f->prog, "%s %s: %s", fl, v, "must be a finite number > 0 (and within float32's range)");
            f->lr = (float)x;
        }
    }
#ifdef DL_MPI
    if (f->ranks) bad(f->prog, "%s%s: %s", "--ranks", "", "is for one process; under MPI the processes are the ranks");
#endif
    if (f->lr == 0.0f) f->lr = f->resnet18 ? 0.1f : 2e-3f;
    if (f->nruns == 0 && f->ranks) {          /* one replica on cpu:0 in each rank */
        f->runs[0].n = 1;
        f->runs[0].dev[0] = dl_cpu_device(0);
        f->nruns = 1;
    }
    if (f->nruns == 0) {                      /* 1, 2 and 4 CPU devices */
        static const int ns[3] = {1, 2, 4};
        for (k = 0; k < 3; k++) {
            f->runs[k].n = ns[k];
            for (i = 0; i < ns[k]; i++) f->runs[k].dev[i] = dl_cpu_device(i);
        }
        f->nruns = 3;
    }
    for (k = 0; k < f->nruns; k++)
        if (f->batch < 2 * f->runs[k].n * (f->ranks ? f->ranks : 1)) {
            char v[32];
            snprintf(v, sizeof v, "%lld", (long long)f->batch);
            bad(f->prog, "%s %s: %s", "--batch", v, "must be at least twice the number of devices of every run "
                "(times --ranks): each replica's batch norm needs 2 rows");
        }
}

/* one replica's loss on its part of the batch: pred = model(X); loss_fn(pred, y),
   times *user (see the training loop: a rank's share of the batch) */
static dl_tensor *loss_fn(dl_module *net, dl_tensor *x, dl_tensor *y, void *user)
{
    dl_tensor *l = dl_cross_entropy(dl_module_forward(net, x), y, NULL);
    return *(const float *)user == 1.0f ? l : dl_mul_scalar(l, *(const float *)user);
}

/* test accuracy of replica 0 in eval mode; -1 on an error (printed) */
static double evaluate(const char *prog, dl_ctx *ctx, dl_loader *test, dl_module *net)
{
    dl_tensor *x, *y;
    ex_tally tally = {0, NULL};
    int64_t correct, total = 0;
    int rc;
    dl_module_train(net, false);
    dl_no_grad_begin(ctx);
    while ((rc = dl_loader_next(test, &x, &y)) > 0) {
        if (!ex_tally_add(&tally, dl_module_forward(net, x), y)) break;
        total += y->numel;
        dl_step_end(ctx);
    }
    correct = ex_tally_end(&tally, rc == 0);   /* a GPU's one read */
    dl_no_grad_end(ctx);
    dl_module_train(net, true);
    if (correct < 0) { fprintf(stderr, "%s: %s\n", prog, dl_error_message(ctx)); return -1; }
    return total ? (double)correct / (double)total : 0.0;
}

/* One run: n replicas (and, with MPI or thread ranks, every rank's). grp:
   the group of --ranks (NULL: none), grank this thread's rank. 0, or 1
   after printing the error. */
static int train(const flags *f, run *r, dl_comm_group *grp, int grank)
{
    dl_ctx_desc cd;
    dl_ctx *ctx;
    dl_comm *comm = NULL;
    dl_module *net[MAX_DEV];
    dl_optim *opt[MAX_DEV];
    dl_ddp *dp;
    dl_ddp_desc dd;
    dl_adam_desc ad;
    dl_sgd_desc sd;
    dl_tensor *xtr, *ytr, *xte, *yte;
    dl_transform_desc tr;
    dl_loader_desc ld;
    dl_loader *trainl, *testl;
    char names[128] = "";
    int i, epoch, rank = 0, size = 1, ncpu = 1;
    double total_secs = 0;
    for (i = 0; i < r->n; i++)
        if (r->dev[i].type == DL_DEVICE_CPU && r->dev[i].index + 1 > ncpu) ncpu = r->dev[i].index + 1;
    memset(&cd, 0, sizeof cd);
    cd.seed = 1;
    cd.num_threads = f->threads;
    cd.cpu_devices = ncpu > 1 ? ncpu : 0;     /* 0: dl.h's default (DL_CPU_DEVICES=N, else 1) */
    cd.device = dl_cpu();                     /* (as above: DL_DEVICE does not apply) */
    cd.log = dl_log_silent;                   /* every failure is printed below */
    ctx = dl_ctx_init(&cd);
    if (!ctx) { fprintf(stderr, "%s: cannot create a context\n", f->prog); return 1; }
    if (grp) {
        dl_comm_desc md;
        memset(&md, 0, sizeof md);
        md.backend = DL_COMM_THREADS;
        md.group = grp;
        md.rank = grank;
        if (!(comm = dl_comm_init(ctx, &md))) goto fail;
        rank = grank;
        size = dl_comm_size(comm);
    }
#ifdef DL_MPI
    {
        dl_comm_desc md;
        memset(&md, 0, sizeof md);
        md.backend = DL_COMM_MPI;
        if (!(comm = dl_comm_init(ctx, &md))) goto fail;
        rank = g_rank = dl_comm_rank(comm);
        size = dl_comm_size(comm);
    }
#endif
    if (!ex_load_split(f->prog, ctx, f->data, "train", f->limit, &xtr, &ytr) ||
        !ex_load_split(f->prog, ctx, f->data, "t10k", 0, &xte, &yte)) { dl_ctx_free(ctx); return 1; }
    memset(&tr, 0, sizeof tr);
    tr.scale = 1.0f / 255.0f; tr.mean = EX_FMNIST_MEAN; tr.std = EX_FMNIST_STD;
    memset(&ld, 0, sizeof ld);
    ld.batch_size = f->batch; ld.shuffle = true; ld.num_workers = 1; ld.seed = 1;
    ld.device = r->dev[0];                    /* batches land on replica 0's device */
    ld.device_data = !ex_is_host(r->dev[0]);  /* ... made there, from the data set kept there */
    trainl = dl_loader_new(ctx, dl_tensor_dataset(ctx, xtr, ytr, &tr, true), &ld);
    ld.shuffle = false;
    testl = dl_loader_new(ctx, dl_tensor_dataset(ctx, xte, yte, &tr, false), &ld);
    if (!trainl || !testl) goto fail;
    memset(&ad, 0, sizeof ad);
    ad.lr = f->lr;
    memset(&sd, 0, sizeof sd);
    sd.lr = f->lr;
    for (i = 0; i < r->n; i++) {              /* replica i: the model on device i, its optimizer */
        /* LeNet-BN (examples/common.h, as lenet.c) with Adam, or d2l's ResNet-18 with d2l's SGD */
        net[i] = f->resnet18 ? ex_resnet18(ctx, 1, 10) : ex_lenet_bn(ctx);
        if (!net[i] || dl_module_to(net[i], r->dev[i]) != DL_OK) goto fail;
        if (!(opt[i] = f->resnet18 ? dl_sgd(net[i], &sd) : dl_adam(net[i], &ad))) goto fail;
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? "," : "", dl_device_name(r->dev[i]));
    }
    memset(&dd, 0, sizeof dd);
    dd.comm = comm;
    dd.bucket_bytes = f->bucket_kb * 1024;
    dp = dl_ddp_init(r->n, net, opt, &dd);    /* replica 0's weights to every replica */
    if (!dp) goto fail;
    if (rank == 0) {
        int64_t per = f->batch / (r->n * size);   /* rows per replica: per, or per + 1 for the first ones */
        char parts[48];
        if (f->batch % (r->n * size)) snprintf(parts, sizeof parts, "%lld-%lld", (long long)per, (long long)per + 1);
        else snprintf(parts, sizeof parts, "%lld", (long long)per);
        printf("%s on %s%s%s: %d replica%s, batch %lld (%s per replica), %d threads\n",
               f->resnet18 ? "d2l ResNet-18" : "LeNet-BN", names,
               size > 1 ? " in each of " : "", size > 1 ? (grp ? "the thread ranks" : "the MPI processes") : "", r->n * size,
               r->n * size == 1 ? "" : "s", (long long)f->batch, parts, dl_num_threads(ctx));
    }
    for (epoch = 0; epoch < f->epochs; epoch++) {
        dl_tensor *x, *y;
        double t0 = ex_now(), loss_sum = 0, dt;
        int64_t steps = 0;
        float loss;
        int rc;
        while ((rc = dl_loader_next(trainl, &x, &y)) > 0) {
            /* this rank's rows of the batch: near-equal parts, the first ones one
               row larger (64 rows over 3 ranks: 22, 21, 21), none left out.
               dl_ddp averages the ranks with equal weights, so each rank's mean
               loss is scaled by its share, b * size / B: the average is then
               the mean over the whole batch. Every rank has the same batches,
               so every rank skips a last batch too small to split (batch
               norm needs 2 rows on every replica). */
            int64_t B = x->shape[0], b = B / size + (rank < B % size ? 1 : 0);
            int64_t off = rank * (B / size) + (rank < B % size ? rank : B % size);
            float share = (float)((double)b * size / (double)B);
            if (B / size < 2 * r->n) { dl_step_end(ctx); continue; }
            if (size > 1) {
                x = dl_narrow(x, 0, off, b);
                y = dl_narrow(y, 0, off, b);
            }
            /* zero_grad, forward and backward on every replica, allreduce, step */
            if (dl_ddp_step(dp, x, y, loss_fn, &share, &loss) != DL_OK) goto fail;
            loss_sum += loss;
            steps++;
            dl_step_end(ctx);
        }
        if (rc < 0) goto fail;
        if (steps == 0) {   /* every batch too small to split (--limit): nothing trained is no result */
            if (rank == 0)
                fprintf(stderr, "%s: --limit %lld, --batch %lld: no batch gives each of the %d replicas 2 rows "
                        "(batch norm); nothing was trained\n", f->prog, (long long)f->limit, (long long)f->batch,
                        r->n * size);
            dl_ctx_free(ctx);
            return 1;
        }
        dt = ex_now() - t0;                   /* training time: evaluation not included */
        total_secs += dt;
        r->secs = total_secs / (epoch + 1);
        if (rank == 0) {
            if ((r->acc = evaluate(f->prog, ctx, testl, net[0])) < 0) goto fail;
            printf("  epoch %d  loss %.4f  test acc %.4f  %.2f s  %.0f samples/s\n", epoch + 1,
                   steps ? loss_sum / (double)steps : 0.0, r->acc, dt, (double)(steps * f->batch) / dt);
            fflush(stdout);
        }
    }
    dl_ctx_free(ctx);                         /* with MPI: dl_comm_free (MPI_Finalize) too */
    return 0;
fail:
    fprintf(stderr, "%s: %s\n", f->prog, dl_error_message(ctx));
    dl_ctx_free(ctx);
    return 1;
}

/* --ranks N: N threads, each training its replica(s) in its own context;
   rank 0's times and accuracy are the run's */
typedef struct rank_arg { const flags *f; run r; dl_comm_group *g; int rank, rc; } rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = (rank_arg *)p;
    a->rc = train(a->f, &a->r, a->g, a->rank);
    return NULL;
}

static int train_ranks(const flags *f, run *r)
{
    pthread_t th[16];
    rank_arg a[16];
    dl_comm_group *g = dl_comm_group_new(f->ranks);
    int i, started, rc = 0;
    if (!g) { fprintf(stderr, "%s: cannot make a group of %d ranks\n", f->prog, f->ranks); return 1; }
    {   /* the data checked once here: a missing file is one message, not one per rank */
        dl_ctx_desc cd;
        dl_ctx *ctx;
        dl_tensor *x, *y;
        bool ok;
        memset(&cd, 0, sizeof cd);
        cd.log = dl_log_silent;
        if (!(ctx = dl_ctx_init(&cd))) { fprintf(stderr, "%s: cannot create a context\n", f->prog); rc = 1; }
        ok = ctx && ex_load_split(f->prog, ctx, f->data, "train", f->limit, &x, &y) &&
             ex_load_split(f->prog, ctx, f->data, "t10k", 0, &x, &y);
        dl_ctx_free(ctx);
        if (!ok) { dl_comm_group_free(g); return 1; }
    }
    for (started = 0; started < f->ranks; started++) {
        a[started].f = f; a[started].r = *r; a[started].g = g; a[started].rank = started; a[started].rc = 1;
        if (pthread_create(&th[started], NULL, rank_main, &a[started]) != 0) {
            /* the ranks started fail when the missing one never meets them (DL_COMM_TIMEOUT) */
            fprintf(stderr, "%s: cannot start thread rank %d\n", f->prog, started);
            rc = 1;
            break;
        }
    }
    for (i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        rc |= a[i].rc;
    }
    dl_comm_group_free(g);
    r->secs = a[0].r.secs;
    r->acc = a[0].r.acc;
    return rc;
}

int main(int argc, char **argv)
{
    flags f;
    int k;
    EX_CHECK_STDOUT(argv[0]);
    parse(argc, argv, &f);
    devices_exist(&f);
#ifdef DL_MPI
    if (f.nruns > 1) f.nruns = 1;             /* one run per mpirun: MPI starts once */
#endif
    for (k = 0; k < f.nruns; k++)
        if ((f.ranks ? train_ranks(&f, &f.runs[k]) : train(&f, &f.runs[k], NULL, 0)) != 0) return 1;
    if (g_rank != 0) return 0;
    printf("\n%-36s %12s %10s %8s\n", "devices", "s/epoch", "test acc", "speedup");
    for (k = 0; k < f.nruns; k++) {
        char names[128] = "";
        int i;
        for (i = 0; i < f.runs[k].n; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? "," : "",
                     dl_device_name(f.runs[k].dev[i]));
        printf("%-36s %12.2f %10.4f %7.2fx\n", names, f.runs[k].secs, f.runs[k].acc,
               f.runs[0].secs / f.runs[k].secs);
    }
    return 0;
}
