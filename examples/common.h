/* examples/common.h - what the training examples share and dl.h does not
   provide: command-line flags (every value checked), output paths checked
   before training, Fashion-MNIST loading, the progress bar and the epoch
   line, a metrics writer (CSV + an SVG chart), TensorBoard logging
   (--logdir), checkpoints that remember the run's settings (--save /
   --resume), the device (--device, or --devices for model parallelism),
   the cosine schedule, and the LeNet-BN model that lenet.c and
   data_parallel.c train. The training loop itself is in each example.
   DL_PROFILE=1 in the environment makes any example print dl.h's per-op
   table when it ends (dl_ctx_free; docs/profiling.md).
   Include after dl.h, with _POSIX_C_SOURCE 200809L defined first. POSIX
   (open, fsync, rename). */
#ifndef DL_EXAMPLES_COMMON_H
#define DL_EXAMPLES_COMMON_H
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "cli.h"

#if defined(__GNUC__)
#define EX_UNUSED __attribute__((unused))
#else
#define EX_UNUSED
#endif

#define EX_MAX_EPOCHS 1000
#define EX_MAX_BATCH 65536
#define EX_MAX_THREADS 1024
#define EX_MAX_WORKERS 64
#define EX_MAX_CPU_DEVICES 64   /* dl.h's limit on cpu:0 .. cpu:63 */
#define EX_MAX_CUDA_DEVICES 16

/* ------------------------------------------------------------ flags */

typedef struct ex_args {
    const char *prog, *name;    /* argv[0]; the example's name (kept in checkpoints) */
    int epochs, threads, workers;
    int64_t batch;
    float lr;
    uint64_t seed;
    const char *save, *resume, *csv, *svg, *data;
    const char *logdir;         /* TensorBoard event files go here (NULL: none) */
    int64_t limit;              /* use only the first N training samples (0: all) */
    int ndev;                   /* devices the example takes: 1 (--device) or 2 (--devices A,B) */
    bool capture;               /* --capture (ex_parse_capture's examples) */
    dl_device dev[2];           /* --device / --devices (type DL_DEVICE_DEFAULT: not given, the
                                   context's default device: cpu:0, or DL_DEVICE=...) */
} ex_args;

/* the example takes --capture (it called ex_parse_capture) */
static bool ex_capture_flag;
/* the model has batch norm: a training batch of one sample is refused before
   training (batch norm needs 2 values per channel, as PyTorch's) */
static bool ex_batch_norm_model;

/* usage lines of an example's own flags (set before ex_parse; the
   example takes those flags out of argv itself) */
static const char *ex_own_usage = NULL;

/* the usage of an example whose flags are a few of the shared ones
   (transformer.c): ex_usage prints it in place of the whole list */
static void (*ex_own_usage_fn)(FILE *out, const ex_args *d) = NULL;

static EX_UNUSED void ex_usage(FILE *out, const ex_args *d)
{
    if (ex_own_usage_fn) { ex_own_usage_fn(out, d); return; }
    fprintf(out,
            "usage: %s [--epochs N (%d)] [--batch N (%lld)] [--lr F (%g)] [--threads N (0)]\n"
            "       [--workers N (%d)] [--seed N (%llu)] [--limit N (0)] [--data DIR (%s)]\n"
            "       [--save FILE] [--resume FILE] [--csv FILE] [--svg FILE] [--logdir DIR]\n"
            "       [%s (cpu%s)]%s\n"
            "  --epochs N    epochs in the whole run, 0..%d (a resumed run counts the checkpoint's)\n"
            "  --batch N     samples per step, 1..%d\n"
            "  --lr F        learning rate, a finite number > 0\n"
            "  --threads N   kernel threads, 0..%d: 0 = every core, more than the cores = the cores\n"
            "  --workers N   data loader threads, 0..%d (0: load in the training thread)\n"
            "  --seed N      seed of initialization, shuffling and augmentation, 0..2^64-1\n"
            "  --limit N     train on the first N training samples, N >= 0 (0: all)\n"
            "  --data DIR    the Fashion-MNIST IDX files (`make data` puts them in data/fashion-mnist)\n"
            "  --save FILE   write a checkpoint (weights, optimizer, run settings) after each epoch\n"
            "  --resume FILE continue a --save checkpoint of this example with the same settings\n"
            "                (--epochs may grow; --batch, --lr, --seed, --limit must match)\n"
            "  --csv FILE    per-epoch metrics as CSV; --svg FILE: the same as a chart\n"
            "  --logdir DIR  TensorBoard logs (created if missing): loss and learning rate per step,\n"
            "                accuracies and weight histograms per epoch, the graph; see them with\n"
            "                `tensorboard --logdir DIR`\n"
            "%s"
            "                cpu, cpu:N (a virtual CPU device with its own memory; cpu:N makes\n"
            "                the devices cpu:0 .. cpu:N), cuda:N (builds with -DDL_CUDA)\n"
            "%s%s"
            "  --help        this text\n",
            d->prog, d->epochs, (long long)d->batch, (double)d->lr, d->workers,
            (unsigned long long)d->seed, d->data, d->ndev == 2 ? "--devices A,B" : "--device NAME",
            d->ndev == 2 ? ",cpu:1" : "", ex_capture_flag ? " [--capture]" : "", EX_MAX_EPOCHS, EX_MAX_BATCH,
            EX_MAX_THREADS, EX_MAX_WORKERS,
            d->ndev == 2 ? "  --devices A,B the model's first half on A, its second half on B (the\n"
                           "                activations and their gradients cross with dl_to):\n"
                         : "  --device NAME where the model, the optimizer state and the batches live:\n",
            ex_own_usage ? ex_own_usage : "",
            ex_capture_flag ? "  --capture     a static graph (no value): the step of the second full batch is\n"
                              "                recorded (dl_capture_begin/end) and replayed (dl_replay) for the\n"
                              "                later full batches; the first one and a smaller last one run eagerly\n"
                            : "");
}

/* A bad command line: "prog: MESSAGE", the usage, exit status 2. */
static EX_UNUSED void ex_bad_args(const ex_args *d, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", d->prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    ex_usage(stderr, d);
    exit(2);
}

/* The whole of v as a decimal integer in lo..hi, else exit 2 naming the
   flag, the value and the rule. */
static EX_UNUSED int64_t ex_int_flag(const ex_args *d, const char *flag, const char *v, int64_t lo, int64_t hi)
{
    char *end;
    long long n;
    errno = 0;
    n = strtoll(v, &end, 10);
    if (!((v[0] >= '0' && v[0] <= '9') || v[0] == '-' || v[0] == '+') || end == v || *end ||
        errno == ERANGE || n < lo || n > hi) {
        if (hi == INT64_MAX) ex_bad_args(d, "%s %s: must be a whole number >= %lld", flag, v, (long long)lo);
        ex_bad_args(d, "%s %s: must be a whole number from %lld to %lld", flag, v, (long long)lo, (long long)hi);
    }
    return (int64_t)n;
}

static EX_UNUSED uint64_t ex_u64_flag(const ex_args *d, const char *flag, const char *v)
{
    char *end;
    unsigned long long n;
    errno = 0;
    n = strtoull(v, &end, 10);
    if (!(v[0] >= '0' && v[0] <= '9') || *end || errno == ERANGE)
        ex_bad_args(d, "%s %s: must be a whole number from 0 to 18446744073709551615", flag, v);
    return (uint64_t)n;
}

/* The whole of v as a finite number > 0 that float32 holds (not 0 once rounded). */
static EX_UNUSED float ex_lr_flag(const ex_args *d, const char *flag, const char *v)
{
    char *end;
    double x;
    x = strtod(v, &end);
    if (end == v || *end || isspace((unsigned char)v[0]) || !isfinite(x) || !(x > 0) || x > FLT_MAX ||
        !((float)x > 0))
        ex_bad_args(d, "%s %s: must be a finite number > 0 (and within float32's range)", flag, v);
    return (float)x;
}

/* v as a device name that dl_device_parse takes and the examples can make,
   else exit 2 naming the flag, the value and the rule. */
static EX_UNUSED dl_device ex_device_flag(const ex_args *d, const char *flag, const char *v, const char *all)
{
    dl_device dev = dl_device_parse(v);
    if (dev.type < 0 || (dev.type == DL_DEVICE_CPU && dev.index >= EX_MAX_CPU_DEVICES) ||
        (dev.type == DL_DEVICE_CUDA && dev.index >= EX_MAX_CUDA_DEVICES))
        ex_bad_args(d, "%s %s: must be cpu, cpu:N (N from 0 to %d) or cuda:N (N from 0 to %d)", flag, all,
                    EX_MAX_CPU_DEVICES - 1, EX_MAX_CUDA_DEVICES - 1);
    return dev;
}

/* --devices A,B: two device names separated by one comma */
static EX_UNUSED void ex_devices_flag(const ex_args *d, const char *flag, const char *v, dl_device out[2])
{
    char buf[64];
    const char *comma = strchr(v, ',');
    size_t n = comma ? (size_t)(comma - v) : 0;
    if (!comma || !n || !comma[1] || strchr(comma + 1, ',') || n >= sizeof buf)
        ex_bad_args(d, "%s %s: must be two device names separated by a comma (cpu:0,cpu:1)", flag, v);
    memcpy(buf, v, n);
    buf[n] = 0;
    out[0] = ex_device_flag(d, flag, buf, v);
    out[1] = ex_device_flag(d, flag, comma + 1, v);
}

static EX_UNUSED long ex_cores(void)
{
#if defined(_SC_NPROCESSORS_ONLN)
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
#else
    return 1;
#endif
}

/* path with symbolic links followed (written files go to the link's
   target, as dl.h's do) into out; false when a link cannot be followed. */
static EX_UNUSED bool ex_resolve(const char *path, char *out, size_t cap)
{
    struct stat st;
    int hops = 0;
    if (strlen(path) >= cap) return false;
    strcpy(out, path);
    while (lstat(out, &st) == 0 && S_ISLNK(st.st_mode)) {
        char buf[4096];
        const char *slash = strrchr(out, '/');
        size_t dir = (slash ? (size_t)(slash - out) + 1 : 0);
        ssize_t k = readlink(out, buf, sizeof buf - 1);
        if (k <= 0 || ++hops > 40) return false;
        buf[k] = 0;
        if (buf[0] == '/') dir = 0;
        if (dir + (size_t)k >= cap) return false;
        memcpy(out + dir, buf, (size_t)k + 1);
    }
    return true;
}

/* Whether paths a and b name the same file: "./x" and "x", a symbolic
   link and its target, two hard links (the same inode where it exists,
   else the same name in the same directory, by its inode). */
/* path without trailing "/" and "/." ("x/", "x/." and "x/./" are "x"; "/" stays) */
static void ex_trim_path(char *p)
{
    size_t n = strlen(p);
    for (;;) {
        if (n > 1 && p[n - 1] == '/') p[--n] = 0;
        else if (n > 2 && p[n - 1] == '.' && p[n - 2] == '/') p[n -= 2] = 0;
        else break;
    }
}
static EX_UNUSED bool ex_same_path(const char *a0, const char *b0)
{
    char a[4096], b[4096], ra[4096], rb[4096];
    const char *sa, *sb;
    struct stat st1, st2;
    if (strlen(a0) >= sizeof a || strlen(b0) >= sizeof b) return !strcmp(a0, b0);
    strcpy(a, a0);
    strcpy(b, b0);
    ex_trim_path(a);
    ex_trim_path(b);
    if (!strcmp(a, b)) return true;
    if (stat(a, &st1) == 0 && stat(b, &st2) == 0) return st1.st_dev == st2.st_dev && st1.st_ino == st2.st_ino;
    if (!ex_resolve(a, ra, sizeof ra) || !ex_resolve(b, rb, sizeof rb)) return false;
    sa = strrchr(ra, '/');
    sb = strrchr(rb, '/');
    if (strcmp(sa ? sa + 1 : ra, sb ? sb + 1 : rb)) return false;   /* other names */
    if (sa) ra[sa - ra + (sa == ra)] = 0; else strcpy(ra, ".");
    if (sb) rb[sb - rb + (sb == rb)] = 0; else strcpy(rb, ".");
    return stat(ra, &st1) == 0 && stat(rb, &st2) == 0 && st1.st_dev == st2.st_dev && st1.st_ino == st2.st_ino;
}

/* Checks, before any training, that path can be written: it is not a
   directory, device or pipe, and a file can be created (and removed) in its
   directory, which is where the file's temporary goes. Prints
   "prog: FLAG PATH: reason" and returns false otherwise. */
static EX_UNUSED bool ex_output_ok(const char *prog, const char *flag, const char *path)
{
    struct stat st;
    char buf[4096], dir[4096], probe[4200];
    const char *p, *slash, *base;
    int fd;
    if (!path[0]) { fprintf(stderr, "%s: %s: the path is empty\n", prog, flag); return false; }
    if (!ex_resolve(path, buf, sizeof buf)) {
        fprintf(stderr, "%s: %s %s: a symbolic link that cannot be followed, or a path too long\n", prog, flag, path);
        return false;
    }
    p = buf;
    if (stat(p, &st) == 0 && !S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: %s %s: %s, not a regular file; give a file name\n", prog, flag, path,
                S_ISDIR(st.st_mode) ? "a directory" :
                S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a pipe or socket");
        return false;
    }
    slash = strrchr(p, '/');
    base = slash ? slash + 1 : p;
    if (!base[0]) {
        fprintf(stderr, "%s: %s %s: names a directory; give a file name\n", prog, flag, path);
        return false;
    }
    if (strlen(p) >= sizeof dir) { fprintf(stderr, "%s: %s %s: path too long\n", prog, flag, path); return false; }
    if (!slash) strcpy(dir, ".");
    else if (slash == p) strcpy(dir, "/");
    else { memcpy(dir, p, (size_t)(slash - p)); dir[slash - p] = 0; }
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "%s: %s %s: the directory %s %s\n", prog, flag, path, dir,
                errno == ENOENT ? "does not exist" : strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s %s: %s is not a directory\n", prog, flag, path, dir);
        return false;
    }
    if (snprintf(probe, sizeof probe, "%s/.%s.probe-%ld", dir, base, (long)getpid()) >= (int)sizeof probe) {
        fprintf(stderr, "%s: %s %s: path too long\n", prog, flag, path);
        return false;
    }
    fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        fprintf(stderr, "%s: %s %s: cannot create a file in %s: %s\n", prog, flag, path, dir, strerror(errno));
        return false;
    }
    close(fd);
    unlink(probe);
    return true;
}

/* Checks, before any training, that the directory path can hold TensorBoard
   files: when it exists, it is a directory in which a file can be created
   (and removed); when it does not, its nearest existing parent is a
   directory in which a directory can be created (and removed), as
   dl_summary_open will create the missing ones. Prints
   "prog: FLAG PATH: reason" and returns false otherwise. */
static EX_UNUSED bool ex_logdir_ok(const char *prog, const char *flag, const char *path)
{
    struct stat st;
    char buf[4096], dir[4096], probe[4200];
    char *slash;
    size_t n;
    int fd;
    if (!path[0]) { fprintf(stderr, "%s: %s: the path is empty\n", prog, flag); return false; }
    if (!ex_resolve(path, buf, sizeof buf)) {
        fprintf(stderr, "%s: %s %s: a symbolic link that cannot be followed, or a path too long\n", prog, flag, path);
        return false;
    }
    if (stat(buf, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            fprintf(stderr, "%s: %s %s: %s, not a directory; give a directory (it is created if missing)\n", prog,
                    flag, path, S_ISREG(st.st_mode) ? "a regular file" :
                    S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a pipe or socket");
            return false;
        }
        snprintf(probe, sizeof probe, "%s/.logdir.probe-%ld", buf, (long)getpid());
        fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            fprintf(stderr, "%s: %s %s: cannot create a file in it: %s\n", prog, flag, path, strerror(errno));
            return false;
        }
        close(fd);
        unlink(probe);
        return true;
    }
    if (errno != ENOENT && errno != ENOTDIR) {
        fprintf(stderr, "%s: %s %s: %s\n", prog, flag, path, strerror(errno));
        return false;
    }
    /* missing (or under a file): find the nearest parent that exists */
    strcpy(dir, buf);
    for (;;) {
        n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
        slash = strrchr(dir, '/');
        if (!slash) strcpy(dir, ".");
        else if (slash == dir) dir[1] = 0;
        else *slash = 0;
        if (stat(dir, &st) == 0) break;
        if ((errno != ENOENT && errno != ENOTDIR) || !strcmp(dir, ".") || !strcmp(dir, "/")) {
            fprintf(stderr, "%s: %s %s: %s: %s\n", prog, flag, path, dir, strerror(errno));
            return false;
        }
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s %s: %s is not a directory\n", prog, flag, path, dir);
        return false;
    }
    snprintf(probe, sizeof probe, "%s/.logdir.probe-%ld", dir, (long)getpid());
    if (mkdir(probe, 0700) != 0) {
        fprintf(stderr, "%s: %s %s: cannot create a directory in %s: %s\n", prog, flag, path, dir, strerror(errno));
        return false;
    }
    rmdir(probe);
    return true;
}

/* --threads over the cores: the cores, with a warning */
static EX_UNUSED void ex_threads_clamp(ex_args *a)
{
    long cores = ex_cores();
    if (a->threads > cores) {
        fprintf(stderr, "%s: warning: --threads %d is more than this machine's %ld cores; using %ld\n",
                a->prog, a->threads, cores, cores);
        a->threads = (int)cores;
    }
}

/* Fills *a with the example's defaults (seed 1, one loader worker,
   data/fashion-mnist; ndev 1: --device, the context's default device;
   ndev 2: --devices, cpu:0,cpu:1) and the flags over them, each value
   checked; checks the output paths. --help: usage, exit 0; anything wrong: the flag, the
   value and the rule, the usage, exit 2. */
static EX_UNUSED void ex_parse_devices(int argc, char **argv, ex_args *a, const char *name, int epochs,
                                       int64_t batch, float lr, int ndev)
{
    ex_args d;
    const char *out[4][2];
    int i, j;
    EX_CHECK_STDOUT(argv[0]);
    memset(&d, 0, sizeof d);
    d.prog = argv[0];
    d.name = name;
    d.epochs = epochs;
    d.batch = batch;
    d.lr = lr;
    d.seed = 1;
    d.workers = 1;
    d.data = "data/fashion-mnist";
    d.ndev = ndev;
    if (ndev == 2) { d.dev[0] = dl_cpu(); d.dev[1] = dl_cpu_device(1); }   /* --devices cpu:0,cpu:1 */
    *a = d;
    for (i = 1; i < argc; i += 2) {     /* every flag but --help takes a value */
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { ex_usage(stdout, &d); exit(0); }
        if (ex_capture_flag && !strcmp(f, "--capture")) { a->capture = true; i--; continue; }   /* no value */
        if (strcmp(f, "--epochs") && strcmp(f, "--batch") && strcmp(f, "--lr") && strcmp(f, "--threads") &&
            strcmp(f, "--workers") && strcmp(f, "--seed") && strcmp(f, "--limit") && strcmp(f, "--data") &&
            strcmp(f, "--save") && strcmp(f, "--resume") && strcmp(f, "--csv") && strcmp(f, "--svg") &&
            strcmp(f, "--logdir") && strcmp(f, ndev == 2 ? "--devices" : "--device"))
            ex_bad_args(&d, "unknown flag %s", f);
        if (!v) ex_bad_args(&d, "%s needs a value", f);
        if (!strcmp(f, "--epochs")) a->epochs = (int)ex_int_flag(&d, f, v, 0, EX_MAX_EPOCHS);
        else if (!strcmp(f, "--batch")) a->batch = ex_int_flag(&d, f, v, 1, EX_MAX_BATCH);
        else if (!strcmp(f, "--lr")) a->lr = ex_lr_flag(&d, f, v);
        else if (!strcmp(f, "--threads")) a->threads = (int)ex_int_flag(&d, f, v, 0, EX_MAX_THREADS);
        else if (!strcmp(f, "--workers")) a->workers = (int)ex_int_flag(&d, f, v, 0, EX_MAX_WORKERS);
        else if (!strcmp(f, "--seed")) a->seed = ex_u64_flag(&d, f, v);
        else if (!strcmp(f, "--limit")) a->limit = ex_int_flag(&d, f, v, 0, INT64_MAX);
        else if (!strcmp(f, "--device")) a->dev[0] = ex_device_flag(&d, f, v, v);
        else if (!strcmp(f, "--devices")) ex_devices_flag(&d, f, v, a->dev);
        else {
            if (!v[0] || !strncmp(v, "--", 2)) ex_bad_args(&d, "%s needs a path, got '%s'", f, v);
            if (!strcmp(f, "--data")) a->data = v;
            else if (!strcmp(f, "--save")) a->save = v;
            else if (!strcmp(f, "--resume")) a->resume = v;
            else if (!strcmp(f, "--csv")) a->csv = v;
            else if (!strcmp(f, "--svg")) a->svg = v;
            else a->logdir = v;
        }
    }
    ex_threads_clamp(a);
    if (a->epochs == 0 && a->save)   /* the checkpoint is written after each epoch */
        ex_bad_args(&d, "--save %s with --epochs 0: no epoch runs, so nothing would be saved", a->save);
    /* the outputs: distinct, and writable now rather than after hours of training */
    out[0][0] = "--save"; out[0][1] = a->save;
    out[1][0] = "--csv"; out[1][1] = a->csv;
    out[2][0] = "--svg"; out[2][1] = a->svg;
    out[3][0] = "--logdir"; out[3][1] = a->logdir;
    for (i = 0; i < 4; i++) {
        if (!out[i][1]) continue;
        for (j = i + 1; j < 4; j++)
            if (out[j][1] && ex_same_path(out[i][1], out[j][1]))
                ex_bad_args(&d, "%s %s and %s %s: two outputs in one %s", out[i][0], out[i][1], out[j][0], out[j][1],
                            j == 3 ? "path" : "file");
        if (i > 0 && a->resume && ex_same_path(out[i][1], a->resume))
            ex_bad_args(&d, "%s %s would overwrite the --resume checkpoint", out[i][0], out[i][1]);
        if (i < 3 ? !ex_output_ok(a->prog, out[i][0], out[i][1]) : !ex_logdir_ok(a->prog, out[i][0], out[i][1]))
            exit(2);
    }
}

/* The flags of a one-device example (--device NAME). */
static EX_UNUSED void ex_parse(int argc, char **argv, ex_args *a, const char *name, int epochs, int64_t batch,
                               float lr)
{
    ex_parse_devices(argc, argv, a, name, epochs, batch, lr, 1);
}

/* ex_parse plus --capture (lenet.c, resnet.c). */
static EX_UNUSED void ex_parse_capture(int argc, char **argv, ex_args *a, const char *name, int epochs,
                                       int64_t batch, float lr)
{
    ex_capture_flag = true;
    ex_parse_devices(argc, argv, a, name, epochs, batch, lr, 1);
}

/* ------------------------------------------------------------ models */

/* ex_lenet_bn: LeNet-BN, the model of lenet.c and data_parallel.c */
#include "lenet_bn.h"

/* ------------------------------------------------------------ data */

static EX_UNUSED double ex_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Loads one split of Fashion-MNIST as persistent x (N,1,28,28) raw 0..255 and y (N). */
static EX_UNUSED bool ex_load_split(const char *prog, dl_ctx *ctx, const char *dir, const char *split,
                                    int64_t limit, dl_tensor **x, dl_tensor **y)
{
    char pi[4200], pl[4200];
    dl_tensor *xi = NULL, *yl = NULL;
    *x = *y = NULL;
    snprintf(pi, sizeof pi, "%s/%s-images-idx3-ubyte", dir, split);
    snprintf(pl, sizeof pl, "%s/%s-labels-idx1-ubyte", dir, split);
    if (dl_idx_load(ctx, pi, DL_DTYPE_F32, &xi) != DL_OK || dl_idx_load(ctx, pl, DL_DTYPE_I64, &yl) != DL_OK) {
        dl_result r = dl_last_error(ctx);   /* the hint only where the files are missing or not IDX */
        fprintf(stderr, "%s: %s\n%s", prog, dl_error_message(ctx), r == DL_ERR_IO || r == DL_ERR_FORMAT ?
                "(run `make data` to fetch Fashion-MNIST, or give --data DIR)\n" : "");
        return false;
    }
    if (xi->ndim != 3 || xi->shape[1] != 28 || xi->shape[2] != 28 || yl->ndim != 1 || yl->numel != xi->shape[0]) {
        fprintf(stderr, "%s: %s, %s: need N 28x28 images and N labels\n", prog, pi, pl);
        return false;
    }
    if (xi->shape[0] == 0) {   /* nothing to train on or to score: not an accuracy of 0 */
        fprintf(stderr, "%s: %s holds no images\n", prog, pi);
        return false;
    }
    {   /* a class outside 0..9 is a corrupt file: the loss refuses it in training,
           but a test split would only score 0 */
        const int64_t *c = (const int64_t *)yl->data;
        int64_t i;
        for (i = 0; i < yl->numel; i++)
            if (c[i] < 0 || c[i] > 9) {
                fprintf(stderr, "%s: %s: label %lld is %lld: Fashion-MNIST's classes are 0..9\n", prog, pl,
                        (long long)i, (long long)c[i]);
                return false;
            }
    }
    {   /* NaN/Inf pixels (possible in float IDX files) would train on garbage: refuse them */
        const float *v = (const float *)xi->data;
        int64_t i;
        for (i = 0; i < xi->numel; i++)
            if (!isfinite(v[i])) {
                fprintf(stderr, "%s: %s: image %lld, pixel (%lld, %lld) is %g: the data must be finite\n", prog, pi,
                        (long long)(i / 784), (long long)(i % 784 / 28), (long long)(i % 28), (double)v[i]);
                return false;
            }
    }
    if (limit > 0 && limit < xi->shape[0]) {
        dl_tensor *a = dl_keep(dl_narrow(xi, 0, 0, limit)), *b = dl_keep(dl_narrow(yl, 0, 0, limit));
        dl_free(xi); dl_free(yl);
        xi = a; yl = b;
    }
    *x = dl_keep(dl_reshape(xi, DL_SHAPE(xi ? xi->shape[0] : 0, 1, 28, 28)));
    dl_free(xi);
    *y = yl;
    dl_step_end(ctx);
    if (!*x || !*y) { fprintf(stderr, "%s: %s\n", prog, dl_error_message(ctx)); return false; }
    return true;
}

/* Fashion-MNIST mean and std of the 0..1 pixels */
#define EX_FMNIST_MEAN 0.2860f
#define EX_FMNIST_STD 0.3530f

typedef struct ex_metrics {
    int n, epoch[EX_MAX_EPOCHS];
    double loss[EX_MAX_EPOCHS], train_acc[EX_MAX_EPOCHS], test_acc[EX_MAX_EPOCHS], secs[EX_MAX_EPOCHS];
} ex_metrics;

/* A run: the flags, the context, the two loaders, the epochs' metrics. */
typedef struct ex_setup {
    const ex_args *a;
    const char *title;
    dl_ctx *ctx;
    dl_loader *train, *test;
    int64_t ntrain, ntest;
    ex_metrics met;
    dl_summary_writer *tb;      /* --logdir: the TensorBoard writer (NULL: none) */
    bool tb_graph;              /* the graph is written (once, from the first step) */
} ex_setup;

/* cpu:0, where the data sets are loaded (any other device gets them as bytes) */
static EX_UNUSED bool ex_is_host(dl_device dev) { return dev.type == DL_DEVICE_CPU && dev.index == 0; }

/* The CPU devices a run needs: cpu:N asks for cpu:0 .. cpu:N, so the
   context gets N+1; 0 when only cpu:0 (or no CPU device) is named, so
   dl.h's default applies: DL_CPU_DEVICES=M, else 1. */
static EX_UNUSED int ex_cpu_devices(const ex_args *a)
{
    int i, n = 0;
    for (i = 0; i < a->ndev; i++)
        if (a->dev[i].type == DL_DEVICE_CPU && a->dev[i].index + 1 > n) n = a->dev[i].index + 1;
    return n > 1 ? n : 0;
}

/* Checks, before any work, that ctx can make each device the flags name
   (cuda:0 in a build without DL_CUDA cannot): otherwise prints
   "prog: --device cuda:0: dl.h's reason" and exits with status 2. */
static EX_UNUSED void ex_devices_ok(const ex_args *a, dl_ctx *ctx)
{
    dl_memory_stats ms;
    int i;
    for (i = 0; i < a->ndev; i++)
        if (dl_memory_stats_get(ctx, a->dev[i], &ms) != DL_OK) {
            const char *msg = dl_error_message(ctx), *why = strstr(msg, ": ");
            fprintf(stderr, "%s: %s %s: %s\n", a->prog, a->ndev == 2 ? "--devices" : "--device",
                    dl_device_name(a->dev[i]), why ? why + 2 : msg);   /* without "dl_memory_stats_get: " */
            dl_ctx_free(ctx);
            exit(2);
        }
}

/* The run's context: seed, threads, the CPU devices --device needs, the
   default device (cpu:N; a cuda:N is checked, and the model moved there);
   NULL after printing why not (a device it cannot make: exit 2). */
static EX_UNUSED dl_ctx *ex_ctx_new(const ex_args *a)
{
    dl_ctx_desc cd;
    dl_ctx *ctx;
    memset(&cd, 0, sizeof cd);
    cd.seed = a->seed;
    cd.num_threads = a->threads;
    cd.log = dl_log_silent;         /* every failure is reported by the example, with its context */
    cd.cpu_devices = ex_cpu_devices(a);
    if (a->dev[0].type != DL_DEVICE_DEFAULT)   /* --device/--devices given: DL_DEVICE does not apply (a */
        cd.device = a->dev[0].type == DL_DEVICE_CPU ? a->dev[0] : dl_cpu();   /* cuda:N is checked below) */
    ctx = dl_ctx_init(&cd);
    if (!ctx) { fprintf(stderr, "%s: cannot create a context: %s\n", a->prog, dl_error_message(NULL)); return NULL; }
    ex_devices_ok(a, ctx);
    return ctx;
}

/* Sets up ctx (seed, threads, the CPU devices --device needs) and the
   Fashion-MNIST loaders (normalized; augmentation when hflip/crop_padding),
   which hand their batches to the (first) device. On the host (cpu:0) the
   data sets stay there and worker threads make the batches; on any other
   device (cuda:N, cpu:N) they live on that device as bytes and the batches
   are made there (dl_loader_desc.device_data: the same batches, no copy a
   step). false on failure (message printed). */
static EX_UNUSED bool ex_setup_fmnist(const ex_args *a, const char *title, bool hflip, int64_t crop_padding,
                                      ex_setup *s)
{
    dl_tensor *xtr, *ytr, *xte, *yte;
    dl_transform_desc tr;
    dl_loader_desc ld;
    memset(s, 0, sizeof *s);
    s->a = a;
    s->title = title;
    if (!(s->ctx = ex_ctx_new(a))) return false;
    if (!ex_load_split(a->prog, s->ctx, a->data, "train", a->limit, &xtr, &ytr) ||
        !ex_load_split(a->prog, s->ctx, a->data, "t10k", 0, &xte, &yte)) return false;
    memset(&tr, 0, sizeof tr);
    tr.scale = 1.0f / 255.0f; tr.mean = EX_FMNIST_MEAN; tr.std = EX_FMNIST_STD;
    tr.hflip = hflip; tr.crop_padding = crop_padding;
    memset(&ld, 0, sizeof ld);
    ld.batch_size = a->batch; ld.shuffle = true; ld.num_workers = a->workers; ld.seed = a->seed;
    ld.device = a->dev[0];          /* DataLoader + .to(device): batches arrive on the device */
    ld.device_data = !ex_is_host(a->dev[0].type == DL_DEVICE_DEFAULT ? dl_ctx_device(s->ctx) : a->dev[0]);
    s->train = dl_loader_new(s->ctx, dl_tensor_dataset(s->ctx, xtr, ytr, &tr, true), &ld);
    ld.shuffle = false;
    s->test = dl_loader_new(s->ctx, dl_tensor_dataset(s->ctx, xte, yte, &tr, false), &ld);
    s->ntrain = xtr->shape[0];
    s->ntest = xte->shape[0];
    if (!s->train || !s->test) { fprintf(stderr, "%s: %s\n", a->prog, dl_error_message(s->ctx)); return false; }
    if (ex_batch_norm_model && (a->batch == 1 || s->ntrain % a->batch == 1 || s->ntrain == 1))
        ex_bad_args(a, "--batch %lld with %lld training samples (--limit) leaves a batch of one sample, which "
                    "batch norm cannot train on; change --batch or --limit", (long long)a->batch,
                    (long long)s->ntrain);
    return true;
}

/* Frees the run; returns status (for `return ex_done(&s, status);`). */
static EX_UNUSED int ex_done(ex_setup *s, int status)
{
    dl_ctx_free(s->ctx);
    s->ctx = NULL;
    return status;
}

/* ------------------------------------------------------------ printing */

/* Number of rows whose arg-max equals the label, on CPU devices (a GPU's
   count stays there: ex_correct_dev); -1 on an error (logits NULL). Read
   on the host (cpu:0): a device's memory is read only through dl_to /
   dl_read. */
static EX_UNUSED int64_t ex_correct(dl_tensor *logits, dl_tensor *y)
{
    dl_tensor *am = dl_argmax(logits, 1, false);
    const int64_t *p, *q;
    int64_t i, n = 0;
    if (!am || !y || !(am = dl_to(am, dl_cpu())) || !(y = dl_to(y, dl_cpu()))) return -1;
    p = (const int64_t *)am->data;
    q = (const int64_t *)y->data;
    for (i = 0; i < y->numel; i++) n += p[i] == q[i];
    return n;
}

/* One epoch's running numbers: steps, loss, accuracy, time. On a GPU the
   sums stay on the device (pend) and are read at the epoch's end or, on a
   terminal, for a progress bar four times a second: a read waits for the
   device, and with none the host queues the next steps while it works. */
typedef struct ex_meter {
    int epoch;                  /* 0-based */
    int64_t step, steps;        /* steps done, steps per epoch */
    int64_t seen, correct;
    double loss_sum, t0, secs, drawn;
    const ex_setup *s;
    dl_tensor *pend;            /* a GPU's (2): sum of loss * rows, correct rows; not read yet */
    bool diverged;              /* said so: ex_fail says nothing more */
} ex_meter;

static EX_UNUSED void ex_meter_start(ex_meter *m, const ex_setup *s, int epoch)
{
    memset(m, 0, sizeof *m);
    m->s = s;
    m->epoch = epoch;
    m->steps = dl_loader_num_batches(s->train);
    m->t0 = ex_now();
}

/* Ends a progress-bar line before an error message. */
static EX_UNUSED void ex_bar_break(void)
{
    if (isatty(STDOUT_FILENO)) { printf("\n"); fflush(stdout); }
}

/* Prints what failed: "prog: epoch E, step S of N: dl.h's message" (m NULL:
   outside training). Returns 1, the exit status. */
static EX_UNUSED int ex_fail(const ex_setup *s, const ex_meter *m)
{
    if (m && m->diverged) return 1;
    ex_bar_break();
    if (m) fprintf(stderr, "%s: epoch %d, step %lld of %lld: %s\n", s->a->prog, m->epoch + 1,
                   (long long)m->step + 1, (long long)m->steps, dl_error_message(s->ctx));
    else fprintf(stderr, "%s: %s\n", s->a->prog, dl_error_message(s->ctx));
    return 1;
}

/* false after saying that the loss v is not finite at the meter's step */
static EX_UNUSED bool ex_diverged(const ex_setup *s, ex_meter *m, float v, int64_t step)
{
    ex_bar_break();
    fprintf(stderr, "%s: the loss is %s at epoch %d, step %lld of %lld: training diverged (try a smaller "
            "--lr than %g) or the data holds NaN/Inf values; stopping\n", s->a->prog, isnan(v) ? "NaN" : "infinite",
            m->epoch + 1, (long long)step, (long long)m->steps, (double)s->a->lr);
    m->diverged = true;
    return false;
}

static EX_UNUSED bool ex_on_gpu(const dl_tensor *t) { return t && t->device.type != DL_DEVICE_CPU; }

/* true when the loss is there (no error so far) and finite; otherwise
   prints why training must stop, naming the epoch and the step. On a GPU
   the loss is not read here (a read waits for the device): ex_meter_add
   checks the sum of the losses where it reads it. */
static EX_UNUSED bool ex_loss_ok(const ex_setup *s, ex_meter *m, dl_tensor *loss)
{
    float v;
    if (!loss) { ex_fail(s, m); return false; }
    if (ex_on_gpu(loss)) return true;
    v = dl_item(loss);
    return isfinite(v) || ex_diverged(s, m, v, m->step + 1);
}

/* A GPU's pending sums onto the host (one read); false when that fails or
   the losses' sum is not finite (said so: training diverged by this step) */
static EX_UNUSED bool ex_meter_read(ex_meter *m)
{
    float v[2];
    if (!m->pend) return true;
    if (dl_read(m->pend, v, 2) != DL_OK) return false;
    dl_free(m->pend);
    m->pend = NULL;
    m->loss_sum += (double)v[0];
    m->correct += (int64_t)v[1];
    return isfinite(v[0]) || ex_diverged(m->s, m, v[0], m->step);
}

/* The rows whose arg-max equals the label, counted where the logits are,
   as PyTorch's tutorial's (pred.argmax(1) == y).float().sum(): a 0-d
   float32 tensor (exact up to 2^24 rows), off the tape; NULL on an error */
static EX_UNUSED dl_tensor *ex_correct_dev(dl_tensor *logits, dl_tensor *y)
{
    dl_tensor *c;
    if (!logits || !y) return NULL;
    dl_no_grad_begin(dl_tensor_ctx(logits));
    if (y->device.type != logits->device.type || y->device.index != logits->device.index)
        y = dl_to(y, logits->device);   /* (model parallel: the labels where the logits are) */
    c = dl_sum(dl_eq(dl_argmax(logits, 1, false), y), dl_shape_make(0, NULL), false);
    dl_no_grad_end(dl_tensor_ctx(logits));
    return c;
}

/* *pend += v on the device (made, kept past dl_step_end, at the first
   call); false on an error */
static EX_UNUSED bool ex_pend_add(dl_tensor **pend, dl_tensor *v)
{
    bool ok;
    if (!v) return false;
    if (!*pend) return (*pend = dl_keep(v)) != NULL;
    dl_no_grad_begin(dl_tensor_ctx(v));
    ok = dl_copy_(*pend, dl_add(*pend, v)) == DL_OK;
    dl_no_grad_end(dl_tensor_ctx(v));
    return ok;
}

/* On a GPU: pend += (loss * rows, correct rows), on the device, off the tape */
static EX_UNUSED bool ex_meter_queue(ex_meter *m, dl_tensor *loss, dl_tensor *logits, dl_tensor *y)
{
    dl_tensor *part[2], *v;
    dl_no_grad_begin(m->s->ctx);
    part[0] = dl_mul_scalar(dl_detach(loss), (float)y->numel);
    part[1] = ex_correct_dev(logits, y);
    v = part[0] && part[1] ? dl_stack(2, part, 0) : NULL;
    dl_no_grad_end(m->s->ctx);
    return ex_pend_add(&m->pend, v);
}

/* An evaluation's correct rows. On CPU devices counted on the host batch
   by batch (ex_correct); on a GPU summed on the device and read once, by
   ex_tally_end: a read waits for the device, and with none the host
   queues the next batches while it works (10,000 test images: 40 waits
   fewer a pass at batch 256). Start it with {0, NULL}. */
typedef struct ex_tally {
    int64_t n;         /* counted on the host */
    dl_tensor *pend;   /* a GPU's sum, not read yet */
} ex_tally;

/* t += the rows of logits whose arg-max equals the label y; false on an
   error (the logits NULL: the forward failed) */
static EX_UNUSED bool ex_tally_add(ex_tally *t, dl_tensor *logits, dl_tensor *y)
{
    int64_t c;
    if (!logits || !y) return false;
    if (ex_on_gpu(logits)) return ex_pend_add(&t->pend, ex_correct_dev(logits, y));
    if ((c = ex_correct(logits, y)) < 0) return false;
    t->n += c;
    return true;
}

/* Ends the tally (its pending sum freed): the count, one read of a GPU's
   sum where read (the loop ended without an error), else -1 */
static EX_UNUSED int64_t ex_tally_end(ex_tally *t, bool read)
{
    float v = 0.0f;
    int64_t n = read ? t->n : -1;
    if (t->pend) {
        if (read && dl_read(t->pend, &v, 1) != DL_OK) n = -1;
        else if (read) n += (int64_t)v;
        dl_free(t->pend);
    }
    t->n = 0;
    t->pend = NULL;
    return n;
}

/* Adds a finished step to the meter and draws the progress bar (on a
   terminal): [=====>    ] 120/235 loss 0.4123 8123 samples/s ETA 12s.
   false on an error. */
static EX_UNUSED bool ex_meter_add(ex_meter *m, dl_tensor *loss, dl_tensor *logits, dl_tensor *y)
{
    double el, rate, eta;
    int i, w = 30, filled;
    bool tty = isatty(STDOUT_FILENO);
    if (!loss || !logits || !y) return false;
    if (ex_on_gpu(logits)) {
        if (!ex_meter_queue(m, loss, logits, y)) return false;
        m->seen += y->numel;
        m->step++;
        if (m->step < m->steps && !(tty && ex_now() - m->drawn >= 0.25)) {
            m->secs = ex_now() - m->t0;   /* the host's: the device may be behind */
            return true;
        }
        if (!ex_meter_read(m)) return false;
    } else {
        int64_t c = ex_correct(logits, y);
        if (c < 0) return false;
        m->loss_sum += (double)dl_item(loss) * (double)y->numel;
        m->correct += c;
        m->seen += y->numel;
        m->step++;
    }
    m->secs = ex_now() - m->t0;
    if (!tty) return true;
    m->drawn = ex_now();
    el = m->secs > 0 ? m->secs : 1e-9;
    rate = (double)m->seen / el;
    eta = el / (double)m->step * (double)(m->steps - m->step);
    filled = m->steps ? (int)(w * m->step / m->steps) : w;
    printf("\r  [");
    for (i = 0; i < w; i++) putchar(i < filled ? '=' : (i == filled ? '>' : ' '));
    printf("] %lld/%lld loss %.4f %.0f samples/s ETA %.0fs   ", (long long)m->step, (long long)m->steps,
           m->loss_sum / (double)m->seen, rate, eta);
    if (m->step == m->steps) printf("\r%*s\r", 90, "");
    fflush(stdout);
    return true;
}

/* The epoch line, also kept for --csv/--svg:
   epoch  1  train loss 0.4451  train acc 0.8499  test acc 0.8685  11.5s  5201 samples/s */
static EX_UNUSED void ex_epoch_end(ex_setup *s, ex_meter *m, double test_acc)
{
    ex_metrics *t = &s->met;
    double n, secs;
    if (m->pend) ex_meter_read(m);   /* an epoch cut short: its last sums */
    n = m->seen ? (double)m->seen : 1.0;
    secs = m->secs > 0 ? m->secs : 1e-9;
    printf("epoch %2d  train loss %.4f  train acc %.4f  test acc %.4f  %.1fs  %.0f samples/s\n", m->epoch + 1,
           m->loss_sum / n, (double)m->correct / n, test_acc, m->secs, (double)m->seen / secs);
    fflush(stdout);
    if (t->n < EX_MAX_EPOCHS) {
        t->epoch[t->n] = m->epoch + 1;
        t->loss[t->n] = m->loss_sum / n;
        t->train_acc[t->n] = (double)m->correct / n;
        t->test_acc[t->n] = test_acc;
        t->secs[t->n] = m->secs;
        t->n++;
    }
}

/* ------------------------------------------------------------ files */

/* A file written whole or not at all: the text goes to a new temporary
   file next to the destination; every write, the flush to disk and the
   close are checked; then it is renamed over the destination. On a failure
   the temporary is removed and the destination is left as it was. */
typedef struct ex_wfile {
    FILE *f;
    const char *prog, *flag, *path;
    char final[4096], tmp[4200];
} ex_wfile;

static EX_UNUSED bool ex_wopen(ex_wfile *w, const char *prog, const char *flag, const char *path)
{
    struct stat st;
    const char *slash;
    int attempt, fd = -1;
    memset(w, 0, sizeof *w);
    w->prog = prog; w->flag = flag; w->path = path;
    if (!ex_resolve(path, w->final, sizeof w->final)) {
        fprintf(stderr, "%s: %s %s: a symbolic link that cannot be followed, or a path too long\n", prog, flag, path);
        return false;
    }
    if (stat(w->final, &st) == 0 && !S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: %s %s: not a regular file; refusing to replace it\n", prog, flag, path);
        return false;
    }
    slash = strrchr(w->final, '/');
    for (attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(w->tmp, sizeof w->tmp, "%.*s.%s.tmp-%ld-%d", slash ? (int)(slash - w->final + 1) : 0, w->final,
                 slash ? slash + 1 : w->final, (long)getpid(), attempt);
        fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "w"))) {
        fprintf(stderr, "%s: %s %s: cannot create a file next to it: %s\n", prog, flag, path, strerror(errno));
        if (fd >= 0) { close(fd); unlink(w->tmp); }
        return false;
    }
    return true;
}

/* Finishes a file from ex_wopen (its FILE may already be closed: f NULL,
   when a library call wrote the temporary by name): prints "saved to PATH"
   or, on a failure, "prog: FLAG PATH: reason" and returns false. */
static EX_UNUSED bool ex_wclose(ex_wfile *w, bool ok)
{
    int err = ok ? 0 : EIO;
    if (w->f) {
        errno = 0;
        if (ok && (fflush(w->f) != 0 || ferror(w->f))) err = errno ? errno : EIO;
        if (!err && fsync(fileno(w->f)) != 0 && errno != EINVAL) err = errno;
        if (fclose(w->f) != 0 && !err) err = errno ? errno : EIO;
        w->f = NULL;
    }
    if (!err && rename(w->tmp, w->final) != 0) err = errno;
    if (err) {
        unlink(w->tmp);
        fprintf(stderr, "%s: %s %s: writing failed: %s; nothing written\n", w->prog, w->flag, w->path,
                ok ? strerror(err) : "see the message above");
        return false;
    }
    printf("saved to %s\n", w->path);
    return true;
}

static EX_UNUSED bool ex_metrics_csv(const ex_setup *s, const char *path)
{
    const ex_metrics *m = &s->met;
    ex_wfile w;
    int i;
    if (!ex_wopen(&w, s->a->prog, "--csv", path)) return false;
    fprintf(w.f, "epoch,train_loss,train_acc,test_acc,seconds\n");
    for (i = 0; i < m->n; i++)
        fprintf(w.f, "%d,%.6f,%.6f,%.6f,%.3f\n", m->epoch[i], m->loss[i], m->train_acc[i], m->test_acc[i], m->secs[i]);
    return ex_wclose(&w, true);
}

/* An SVG line chart of loss (left axis) and accuracies (right axis, 0..1). */
static EX_UNUSED bool ex_metrics_svg(const ex_setup *s, const char *path)
{
    const ex_metrics *m = &s->met;
    ex_wfile w;
    FILE *f;
    int i, k;
    double W = 640, H = 360, L = 60, R = 60, T = 40, Bm = 40, maxl = 0;
    const char *col[3] = {"#d62728", "#1f77b4", "#2ca02c"}, *lab[3] = {"train loss", "train acc", "test acc"};
    if (!ex_wopen(&w, s->a->prog, "--svg", path)) return false;
    f = w.f;
    for (i = 0; i < m->n; i++) if (m->loss[i] > maxl) maxl = m->loss[i];
    if (maxl <= 0) maxl = 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n", W / 2, s->title);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", L, T, W - L - R, H - T - Bm);
    for (i = 0; i <= 4; i++) {
        double y = T + (H - T - Bm) * i / 4;
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.2f</text><text x=\"%.0f\" y=\"%.0f\">%.2f</text>\n",
                L - 5, y + 4, maxl * (4 - i) / 4, W - R + 5, y + 4, (4 - i) / 4.0);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">epoch</text>\n", W / 2, H - 8);
    for (k = 0; k < 3; k++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col[k]);
        for (i = 0; i < m->n; i++) {
            double x = L + (W - L - R) * (m->n == 1 ? 0.5 : (double)i / (m->n - 1));
            double v = k == 0 ? m->loss[i] / maxl : k == 1 ? m->train_acc[i] : m->test_acc[i];
            fprintf(f, "%.1f,%.1f ", x, T + (H - T - Bm) * (1 - v));
        }
        fprintf(f, "\"/>\n<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">%s</text>\n", L + 10 + 110 * k, T + 16, col[k], lab[k]);
    }
    fprintf(f, "</svg>\n");
    return ex_wclose(&w, true);
}

/* ------------------------------------------------------------ tensorboard */

/* What torch.utils.tensorboard.SummaryWriter does in PyTorch's tutorial,
   with dl.h's dl_summary_* writer: the examples call ex_tb_step in their
   training loop and ex_tb_epoch after each epoch; ex_start opens the writer
   and ex_finish closes it. Without --logdir these do nothing. A failed write
   (a full disk) stops the run: "prog: --logdir DIR: the file and the
   reason; stopping", exit status 1; the file keeps every whole record. */

/* Prints a failed write's message (dl.h's: the file and the reason). Returns false. */
static EX_UNUSED bool ex_tb_fail(const ex_setup *s)
{
    ex_bar_break();
    fprintf(stderr, "%s: --logdir %s: %s; stopping\n", s->a->prog, s->a->logdir, dl_error_message(s->ctx));
    return false;
}

/* s as one shell word: as it is when it is plain, else in single quotes. */
static EX_UNUSED void ex_print_shell_word(const char *s)
{
    const char *p;
    for (p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("_./-+:,@%=", *p)) break;
    if (!*p && s[0]) { fputs(s, stdout); return; }
    putchar('\'');
    for (p = s; *p; p++) {
        if (*p == '\'') fputs("'\\''", stdout);
        else putchar(*p);
    }
    putchar('\'');
}

/* --logdir: writer = SummaryWriter(DIR): a new events file in DIR (DIR and
   its parents created if missing). Names each of the model's tensors by its
   state_dict name ("0.weight", "layer1.0.bn1.running_mean"), which is what
   the graph shows for them, and prints "TensorBoard: tensorboard --logdir
   DIR", the command that shows the run. false (message printed) on failure. */
static EX_UNUSED bool ex_tb_open(ex_setup *s, dl_module *net)
{
    const dl_named_tensor *p;
    int i, n;
    if (!s->a->logdir) return true;
    if (!(s->tb = dl_summary_open(s->ctx, s->a->logdir))) return ex_tb_fail(s);
    if ((n = dl_module_state_dict(net, &p)) < 0) return ex_tb_fail(s);
    for (i = n - 1; i >= 0; i--) dl_set_name(p[i].t, p[i].name);   /* a shared tensor: its first name */
    printf("TensorBoard: tensorboard --logdir ");
    ex_print_shell_word(s->a->logdir);
    printf("\n");
    fflush(stdout);
    return true;
}

/* One training step, called with the step's loss before loss.backward()
   (which releases the graph): writer.add_scalar("train/loss", loss, step)
   and ("train/lr", lr, step), step = epoch * steps_per_epoch + batch
   (0-based, as PyTorch's tutorial counts; a resumed run goes on counting),
   and on the run's first step writer.add_graph: the graph that computed
   the loss. On a GPU the loss is not read here (PyTorch's loss.item()
   waits for the device): dl_summary_scalar_tensor queues it on the device,
   and ex_tb_epoch (at its histograms) writes the epoch's records. false
   (message printed) when a write failed. */
static EX_UNUSED bool ex_tb_step(ex_setup *s, const ex_meter *m, dl_optim *opt, dl_tensor *loss)
{
    int64_t step = (int64_t)m->epoch * m->steps + m->step;
    if (!s->tb) return true;
    if (dl_summary_scalar_tensor(s->tb, "train/loss", step, loss) != DL_OK ||   /* no wait for a GPU */
        dl_summary_scalar(s->tb, "train/lr", step, (double)dl_optim_lr(opt)) != DL_OK)
        return ex_tb_fail(s);
    if (!s->tb_graph) {
        if (dl_summary_graph(s->tb, loss) != DL_OK) return ex_tb_fail(s);
        s->tb_graph = true;
    }
    return true;
}

/* The end of an epoch, at the step count after it (the x axis of the
   per-step scalars): train/accuracy (of the epoch's batches, in training
   mode) and test/accuracy, a histogram of each parameter tagged by its
   state_dict name ("0.weight"), then writer.flush() (the file is synced to
   disk). false (message printed) when a write failed. */
static EX_UNUSED bool ex_tb_epoch(ex_setup *s, const ex_meter *m, dl_module *net, double test_acc)
{
    const dl_named_tensor *p;
    int64_t step = (int64_t)(m->epoch + 1) * m->steps;
    int i, n;
    if (!s->tb) return true;
    if (dl_summary_scalar(s->tb, "train/accuracy", step, m->seen ? (double)m->correct / (double)m->seen : 0.0) !=
        DL_OK || dl_summary_scalar(s->tb, "test/accuracy", step, test_acc) != DL_OK)
        return ex_tb_fail(s);
    if ((n = dl_module_named_parameters(net, &p)) < 0) return ex_tb_fail(s);
    for (i = 0; i < n; i++)
        if (dl_summary_histogram(s->tb, p[i].name, step, p[i].t) != DL_OK) return ex_tb_fail(s);
    if (dl_summary_flush(s->tb) != DL_OK) return ex_tb_fail(s);
    return true;
}

/* writer.close(): syncs and closes the events file, prints "saved to PATH"
   (false, message printed, when that failed). */
static EX_UNUSED bool ex_tb_close(ex_setup *s)
{
    char path[4200];
    if (!s->tb) return true;
    snprintf(path, sizeof path, "%s", dl_summary_path(s->tb));
    if (dl_summary_close(s->tb) != DL_OK) { s->tb = NULL; return ex_tb_fail(s); }
    s->tb = NULL;
    printf("saved to %s\n", path);
    return true;
}

/* The end of a run: --csv and --svg, then "test accuracy: 0.xxxx" (the
   last line). Returns the exit status. */
static EX_UNUSED int ex_finish(ex_setup *s, double test_acc)
{
    int status = 0;
    if (s->a->csv && !ex_metrics_csv(s, s->a->csv)) status = 1;
    if (s->a->svg && !ex_metrics_svg(s, s->a->svg)) status = 1;
    if (!ex_tb_close(s)) status = 1;
    printf("test accuracy: %.4f\n", test_acc);
    return status;
}

/* ------------------------------------------------------------ checkpoints */

/* --save: the weights, the optimizer state and the run's settings (the
   example, --batch, --epochs, --lr, --seed, --limit, the training-set size
   and the epochs done), written atomically by dl.h. Prints "saved to PATH";
   false (message printed) when the write failed: the run stops. */
static EX_UNUSED bool ex_save(const ex_setup *s, dl_module *net, dl_optim *opt, int epochs_done)
{
    const ex_args *a = s->a;
    char v[7][32];
    dl_kv kv[8];
    if (!a->save) return true;
    snprintf(v[0], sizeof v[0], "%lld", (long long)a->batch);
    snprintf(v[1], sizeof v[1], "%d", a->epochs);
    snprintf(v[2], sizeof v[2], "%.9g", (double)a->lr);
    snprintf(v[3], sizeof v[3], "%llu", (unsigned long long)a->seed);
    snprintf(v[4], sizeof v[4], "%lld", (long long)a->limit);
    snprintf(v[5], sizeof v[5], "%lld", (long long)s->ntrain);
    snprintf(v[6], sizeof v[6], "%d", epochs_done);
    kv[0].key = "example"; kv[0].value = a->name;
    kv[1].key = "batch"; kv[1].value = v[0];
    kv[2].key = "epochs"; kv[2].value = v[1];
    kv[3].key = "lr"; kv[3].value = v[2];
    kv[4].key = "seed"; kv[4].value = v[3];
    kv[5].key = "limit"; kv[5].value = v[4];
    kv[6].key = "train_samples"; kv[6].value = v[5];
    kv[7].key = "epochs_done"; kv[7].value = v[6];
    if (dl_save_meta(a->save, net, opt, 8, kv) != DL_OK) {
        ex_bar_break();
        fprintf(stderr, "%s: --save %s: %s; stopping\n", a->prog, a->save, dl_error_message(s->ctx));
        return false;
    }
    printf("saved to %s\n", a->save);
    return true;
}

/* One setting of the --resume checkpoint as a number (false: printed why). */
static EX_UNUSED bool ex_meta_num(const ex_setup *s, const char *key, double *out)
{
    char buf[128], *end;
    if (dl_checkpoint_meta(s->ctx, s->a->resume, key, buf, sizeof buf) != DL_OK) {
        fprintf(stderr, "%s: --resume %s: %s%s\n", s->a->prog, s->a->resume, dl_error_message(s->ctx),
                dl_last_error(s->ctx) == DL_ERR_FORMAT ? " (not a checkpoint from an example's --save?)" : "");
        return false;
    }
    *out = strtod(buf, &end);
    if (end == buf || *end || !isfinite(*out)) {
        fprintf(stderr, "%s: --resume %s: the setting %s is '%s', not a number\n", s->a->prog, s->a->resume, key, buf);
        return false;
    }
    return true;
}

/* --resume: checks that the checkpoint was written by this example with
   the settings that shape this run (--batch, --lr, --seed, the training
   set of --limit; --epochs may grow), loads it, and puts the loader where
   an uninterrupted run would be. Returns the epochs done (0 without
   --resume), or -1 after printing why not, e.g.
   "--resume run.st: the checkpoint was trained with --batch 256, this run has --batch 128". */
static EX_UNUSED int ex_resume(ex_setup *s, dl_module *net, dl_optim *opt)
{
    const ex_args *a = s->a;
    const char *p = a->prog, *r = a->resume;
    char name[128], seed[32];
    double batch, epochs, lr, limit, nsamp, done;
    int64_t steps;
    if (!r) return 0;
    if (dl_checkpoint_meta(s->ctx, r, "example", name, sizeof name) != DL_OK) {
        fprintf(stderr, "%s: --resume %s: %s%s\n", p, r, dl_error_message(s->ctx),
                dl_last_error(s->ctx) == DL_ERR_FORMAT ? " (not a checkpoint from an example's --save?)" : "");
        return -1;
    }
    if (strcmp(name, a->name)) {
        fprintf(stderr, "%s: --resume %s: the checkpoint was written by the example %s, this is %s\n", p, r, name,
                a->name);
        return -1;
    }
    if (dl_checkpoint_meta(s->ctx, r, "seed", seed, sizeof seed) != DL_OK) {
        fprintf(stderr, "%s: --resume %s: %s\n", p, r, dl_error_message(s->ctx));
        return -1;
    }
    if (!ex_meta_num(s, "batch", &batch) || !ex_meta_num(s, "epochs", &epochs) || !ex_meta_num(s, "lr", &lr) ||
        !ex_meta_num(s, "limit", &limit) ||
        !ex_meta_num(s, "train_samples", &nsamp) || !ex_meta_num(s, "epochs_done", &done)) return -1;
    if (batch != (double)a->batch) {
        fprintf(stderr, "%s: --resume %s: the checkpoint was trained with --batch %.0f, this run has --batch %lld\n",
                p, r, batch, (long long)a->batch);
        return -1;
    }
    if ((float)lr != a->lr) {
        char x[32], y[32];
        snprintf(x, sizeof x, "%g", lr);
        snprintf(y, sizeof y, "%g", (double)a->lr);
        if (!strcmp(x, y)) { snprintf(x, sizeof x, "%.9g", lr); snprintf(y, sizeof y, "%.9g", (double)a->lr); }
        fprintf(stderr, "%s: --resume %s: the checkpoint was trained with --lr %s, this run has --lr %s\n", p, r, x, y);
        return -1;
    }
    {   /* the whole of the value, digits only (a hand-edited "abc" is no seed 0) */
        const char *c = seed;
        while (*c >= '0' && *c <= '9') c++;
        if (*c || c == seed || c - seed > 20) {
            fprintf(stderr, "%s: --resume %s: the checkpoint's seed \"%s\" is not a whole number\n", p, r, seed);
            return -1;
        }
    }
    if (strtoull(seed, NULL, 10) != a->seed) {
        fprintf(stderr, "%s: --resume %s: the checkpoint was trained with --seed %s, this run has --seed %llu\n",
                p, r, seed, (unsigned long long)a->seed);
        return -1;
    }
    if (nsamp != (double)s->ntrain) {
        fprintf(stderr, "%s: --resume %s: the checkpoint was trained with --limit %.0f (%.0f training samples), "
                "this run has --limit %lld (%lld training samples)\n", p, r, limit, nsamp, (long long)a->limit,
                (long long)s->ntrain);
        return -1;
    }
    if (epochs > (double)a->epochs) {
        fprintf(stderr, "%s: --resume %s: the checkpoint was trained with --epochs %.0f, this run has --epochs %d "
                "(a resumed run may keep or raise --epochs, not lower it)\n", p, r, epochs, a->epochs);
        return -1;
    }
    if (dl_load(r, net, opt) != DL_OK) {
        fprintf(stderr, "%s: --resume %s: %s\n", p, r, dl_error_message(s->ctx));
        return -1;
    }
    steps = dl_optim_steps(opt);
    if (done < 0 || done > epochs) {
        fprintf(stderr, "%s: --resume %s: the checkpoint says %.0f epochs done of its --epochs %.0f (epochs_done "
                "must be 0..epochs)\n", p, r, done, epochs);
        return -1;
    }
    if ((double)steps != done * (double)dl_loader_num_batches(s->train)) {
        fprintf(stderr, "%s: --resume %s: the checkpoint says %.0f epochs done but holds %lld optimizer steps "
                "(%lld per epoch)\n", p, r, done, (long long)steps, (long long)dl_loader_num_batches(s->train));
        return -1;
    }
    if (a->save && done >= (double)a->epochs) {   /* (--save is written after each epoch) */
        fprintf(stderr, "%s: --resume %s --save %s: the checkpoint has all %d epochs done, so no epoch runs and "
                "nothing would be saved; raise --epochs\n", p, r, a->save, a->epochs);
        return -1;
    }
    dl_loader_set_epoch(s->train, (int64_t)done);
    printf("resumed from %s at epoch %.0f\n", r, done);
    return (int)done;
}

/* The start of a run: checks that the model and the optimizer were made,
   resumes (--resume), opens the --logdir writer, prints the header line
   (and the TensorBoard line). Returns the first epoch (0-based), or -1
   after printing why not. */
static EX_UNUSED int ex_start(ex_setup *s, dl_module *net, dl_optim *opt)
{
    int start;
    if (!net || !opt) { ex_fail(s, NULL); return -1; }
    if ((start = ex_resume(s, net, opt)) < 0) return -1;
    printf("%s: %lld parameters, %lld train / %lld test samples, batch %lld, %d threads\n", s->title,
           (long long)dl_module_num_params(net), (long long)s->ntrain, (long long)s->ntest,
           (long long)s->a->batch, dl_num_threads(s->ctx));
    if (s->a->ndev == 1 && s->a->dev[0].type != DL_DEVICE_DEFAULT)   /* --device given */
        printf("device: %s\n", dl_device_name(s->a->dev[0]));
    fflush(stdout);
    if (!ex_tb_open(s, net)) return -1;
    return start;
}

/* Cosine annealing from the base rate to 0 over the run
   (torch.optim.lr_scheduler.CosineAnnealingLR, stepped once per epoch). */
static EX_UNUSED float ex_cosine(float base, int epoch, int epochs)
{
    return dl_lr_cosine(base, epoch, epochs, 0.0f);
}

#endif
