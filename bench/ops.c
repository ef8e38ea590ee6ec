/* bench/ops.c: per-op timing of dl.h (forward; forward + sum + backward), the
   twin of bench/ops_torch.py. usage: ops THREADS < bench/ops_cases.txt; a line
   per case (bench/README.md, Per-op timing) */
#define DL_IMPLEMENTATION
#include "dl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
static dl_ctx *C;

static dl_shape parse_shape(const char *s) {
    dl_shape sh; memset(&sh, 0, sizeof sh);
    char buf[128]; strncpy(buf, s, 127); buf[127] = 0;
    for (char *p = strtok(buf, "x"); p; p = strtok(NULL, "x")) sh.d[sh.ndim++] = atoll(p);
    return sh;
}
static dl_tensor *pers_randn(dl_shape s, int positive) {
    dl_tensor *t = dl_randn(C, s);
    if (positive) t = dl_add_scalar(dl_abs(t), 0.1f);
    return dl_keep(t);
}

#define MAXIN 8
typedef struct { char f[12][64]; int nf; dl_tensor *in[MAXIN]; int nin; bool grad[MAXIN]; dl_tensor *ex[4]; dl_optim *opt; } cs;
static cs K;

static dl_tensor *run_op(void) {
    cs *k = &K; const char *kind = k->f[0]; const char *op = k->f[1]; dl_tensor **x = k->in;
    if (!strcmp(kind, "u")) {
        dl_tensor *a = x[0];
        if (!strcmp(op, "exp")) return dl_exp(a);
        if (!strcmp(op, "log")) return dl_log(a);
        if (!strcmp(op, "sqrt")) return dl_sqrt(a);
        if (!strcmp(op, "abs")) return dl_abs(a);
        if (!strcmp(op, "erf")) return dl_erf(a);
        if (!strcmp(op, "sin")) return dl_sin(a);
        if (!strcmp(op, "cos")) return dl_cos(a);
        if (!strcmp(op, "log1p")) return dl_log1p(a);
        if (!strcmp(op, "expm1")) return dl_expm1(a);
        if (!strcmp(op, "rsqrt")) return dl_rsqrt(a);
        if (!strcmp(op, "relu")) return dl_relu(a);
        if (!strcmp(op, "leaky_relu")) return dl_leaky_relu(a, 0.01f);
        if (!strcmp(op, "sigmoid")) return dl_sigmoid(a);
        if (!strcmp(op, "tanh")) return dl_tanh(a);
        if (!strcmp(op, "gelu")) return dl_gelu(a);
        if (!strcmp(op, "gelu_tanh")) return dl_gelu_tanh(a);
        if (!strcmp(op, "silu")) return dl_silu(a);
        if (!strcmp(op, "softplus")) return dl_softplus(a, 1.0f, 20.0f);
        if (!strcmp(op, "logsigmoid")) return dl_logsigmoid(a);
        if (!strcmp(op, "pow2")) return dl_pow(a, 2.0f);
        if (!strcmp(op, "pow1.5")) return dl_pow(a, 1.5f);
        if (!strcmp(op, "clamp")) return dl_clamp(a, -0.5f, 0.5f);
    } else if (!strcmp(kind, "b")) {
        if (!strcmp(op, "add")) return dl_add(x[0], x[1]);
        if (!strcmp(op, "sub")) return dl_sub(x[0], x[1]);
        if (!strcmp(op, "mul")) return dl_mul(x[0], x[1]);
        if (!strcmp(op, "div")) return dl_div(x[0], x[1]);
        if (!strcmp(op, "maximum")) return dl_maximum(x[0], x[1]);
        if (!strcmp(op, "minimum")) return dl_minimum(x[0], x[1]);
    } else if (!strcmp(kind, "r")) {
        const char *d = k->f[2]; dl_shape dims = !strcmp(d, "all") ? DL_ALL : !strcmp(d, "first") ? DL_DIMS(0) : DL_DIMS(-1);
        if (!strcmp(op, "sum")) return dl_sum(x[0], dims, false);
        if (!strcmp(op, "mean")) return dl_mean(x[0], dims, false);
        if (!strcmp(op, "max")) return dl_max(x[0], dims, false);
        if (!strcmp(op, "min")) return dl_min(x[0], dims, false);
        if (!strcmp(op, "var")) return dl_var(x[0], dims, 1, false);
        if (!strcmp(op, "norm")) return dl_norm(x[0], dims, false);
        if (!strcmp(op, "logsumexp")) return dl_logsumexp(x[0], dims, false);
        if (!strcmp(op, "cumsum")) return dl_cumsum(x[0], (int)dims.d[0]);   /* (last or first) */
        if (!strcmp(op, "max_dim")) return dl_max_dim(x[0], (int)dims.d[0], false, NULL);
        if (!strcmp(op, "argmax")) return dl_argmax(x[0], (int)dims.d[0], false);   /* int64: fwd only */
    } else if (!strcmp(kind, "sm")) {
        int d = atoi(k->f[2]);
        return !strcmp(op, "softmax") ? dl_softmax(x[0], d) : dl_log_softmax(x[0], d);
    } else if (!strcmp(kind, "mm")) return dl_matmul(x[0], x[1]);
    else if (!strcmp(kind, "lin")) return dl_linear(x[0], x[1], x[2]);
    else if (!strcmp(kind, "ln")) return dl_layer_norm(x[0], DL_SHAPE(x[0]->shape[x[0]->ndim - 1]), x[1], x[2], 1e-5f);
    else if (!strcmp(kind, "bn")) return dl_batch_norm(x[0], k->ex[0], k->ex[1], x[1], x[2], !strcmp(op, "train"), 0.1f, 1e-5f);
    else if (!strcmp(kind, "do")) return dl_dropout(x[0], 0.5f, true);
    else if (!strcmp(kind, "cat")) return dl_cat(2, x, atoi(op));
    else if (!strcmp(kind, "stack")) return dl_stack(2, x, atoi(op));
    else if (!strcmp(kind, "narrow")) return dl_narrow(x[0], -1, 0, x[0]->shape[x[0]->ndim - 1] / 2);
    else if (!strcmp(kind, "permute")) return dl_permute(x[0], DL_SHAPE(0, 2, 3, 1));
    else if (!strcmp(kind, "transpose")) return dl_transpose(x[0], 0, 1);
    else if (!strcmp(kind, "expand")) return dl_expand(x[0], parse_shape(k->f[2]));
    else if (!strcmp(kind, "emb")) return dl_embedding(k->ex[0], x[0], DL_NO_PADDING);
    else if (!strcmp(kind, "conv")) {
        dl_conv_desc d = dl_conv_desc_make(atoi(k->f[4]), atoi(k->f[5]), 1, 1);
        return dl_conv2d(x[0], x[1], x[2], &d);
    } else if (!strcmp(kind, "maxpool") || !strcmp(kind, "avgpool")) {
        dl_pool_desc p = dl_pool_desc_make(atoi(k->f[2]), atoi(k->f[3]), atoi(k->f[4]), false, true);
        return kind[0] == 'm' ? dl_max_pool2d(x[0], &p) : dl_avg_pool2d(x[0], &p);
    } else if (!strcmp(kind, "gap")) return dl_adaptive_avg_pool2d(x[0], DL_SHAPE(1, 1));
    else if (!strcmp(kind, "ce")) return dl_cross_entropy(x[0], k->ex[0], NULL);
    else if (!strcmp(kind, "mse")) return dl_mse_loss(x[0], k->ex[0], NULL);
    else if (!strcmp(kind, "bce")) return dl_binary_cross_entropy_with_logits(x[0], k->ex[0], NULL);
    fprintf(stderr, "unknown case %s %s\n", kind, op); exit(1);
}

static void add_in(dl_tensor *t, bool g) { K.in[K.nin] = t; K.grad[K.nin++] = g; }

static void setup(void) {
    cs *k = &K; const char *kind = k->f[0];
    if (!strcmp(kind, "u")) {
        const char *op = k->f[1];
        add_in(pers_randn(parse_shape(k->f[2]), !strcmp(op, "log") || !strcmp(op, "sqrt") || !strcmp(op, "pow1.5") ||
                                                   !strcmp(op, "log1p") || !strcmp(op, "rsqrt")), true);
    } else if (!strcmp(kind, "b")) {
        add_in(pers_randn(parse_shape(k->f[2]), 0), true);
        add_in(pers_randn(parse_shape(k->f[3]), !strcmp(k->f[1], "div")), true);
    } else if (!strcmp(kind, "r")) add_in(pers_randn(parse_shape(k->f[3]), 0), true);
    else if (!strcmp(kind, "sm")) add_in(pers_randn(parse_shape(k->f[3]), 0), true);
    else if (!strcmp(kind, "mm")) { add_in(pers_randn(parse_shape(k->f[1]), 0), true); add_in(pers_randn(parse_shape(k->f[2]), 0), true); }
    else if (!strcmp(kind, "lin")) {
        int64_t n = atoll(k->f[1]), i = atoll(k->f[2]), o = atoll(k->f[3]);
        add_in(pers_randn(DL_SHAPE(n, i), 0), true); add_in(pers_randn(DL_SHAPE(o, i), 0), true); add_in(pers_randn(DL_SHAPE(o), 0), true);
    } else if (!strcmp(kind, "ln")) {
        dl_shape s = parse_shape(k->f[1]); int64_t d = s.d[s.ndim - 1];
        add_in(pers_randn(s, 0), true); add_in(pers_randn(DL_SHAPE(d), 0), true); add_in(pers_randn(DL_SHAPE(d), 0), true);
    } else if (!strcmp(kind, "bn")) {
        dl_shape s = parse_shape(k->f[2]); int64_t c = s.d[1];
        add_in(pers_randn(s, 0), true); add_in(pers_randn(DL_SHAPE(c), 0), true); add_in(pers_randn(DL_SHAPE(c), 0), true);
        k->ex[0] = dl_keep(dl_zeros(C, DL_SHAPE(c))); k->ex[1] = dl_keep(dl_ones(C, DL_SHAPE(c)));
    } else if (!strcmp(kind, "do") || !strcmp(kind, "narrow") || !strcmp(kind, "permute") || !strcmp(kind, "transpose") || !strcmp(kind, "gap"))
        add_in(pers_randn(parse_shape(k->f[1]), 0), true);
    else if (!strcmp(kind, "cat") || !strcmp(kind, "stack")) { add_in(pers_randn(parse_shape(k->f[2]), 0), true); add_in(pers_randn(parse_shape(k->f[2]), 0), true); }
    else if (!strcmp(kind, "expand")) add_in(pers_randn(parse_shape(k->f[1]), 0), true);
    else if (!strcmp(kind, "emb")) {
        int64_t v = atoll(k->f[1]), d = atoll(k->f[2]), n = atoll(k->f[3]);
        add_in(pers_randn(DL_SHAPE(v, d), 0), true);
        int64_t *idx = malloc(n * sizeof *idx); for (int64_t i = 0; i < n; i++) idx[i] = (i * 7919) % v;
        k->ex[0] = dl_keep(dl_from_int64(C, DL_SHAPE(n), idx)); free(idx);
    } else if (!strcmp(kind, "conv")) {
        dl_shape s = parse_shape(k->f[1]); int64_t oc = atoll(k->f[2]), kk = atoll(k->f[3]);
        add_in(pers_randn(s, 0), true); add_in(pers_randn(DL_SHAPE(oc, s.d[1], kk, kk), 0), true); add_in(pers_randn(DL_SHAPE(oc), 0), true);
    } else if (!strcmp(kind, "maxpool") || !strcmp(kind, "avgpool")) add_in(pers_randn(parse_shape(k->f[1]), 0), true);
    else if (!strcmp(kind, "ce")) {
        int64_t n = atoll(k->f[1]), c = atoll(k->f[2]);
        add_in(pers_randn(DL_SHAPE(n, c), 0), true);
        int64_t *y = malloc(n * sizeof *y); for (int64_t i = 0; i < n; i++) y[i] = (i * 31) % c;
        k->ex[0] = dl_keep(dl_from_int64(C, DL_SHAPE(n), y)); free(y);
    } else if (!strcmp(kind, "mse")) { add_in(pers_randn(parse_shape(k->f[1]), 0), true); k->ex[0] = pers_randn(parse_shape(k->f[1]), 0); }
    else if (!strcmp(kind, "bce")) { add_in(pers_randn(parse_shape(k->f[1]), 0), true); k->ex[0] = dl_keep(dl_rand(C, parse_shape(k->f[1]))); }
    else if (!strcmp(kind, "adam") || !strcmp(kind, "sgd")) {
        dl_shape sh[6] = {DL_SHAPE(1024, 784), DL_SHAPE(1024), DL_SHAPE(256, 1024), DL_SHAPE(256), DL_SHAPE(10, 256), DL_SHAPE(10)};
        for (int i = 0; i < 6; i++) add_in(dl_param(dl_randn(C, sh[i])), true);
        dl_tensor *loss = NULL;
        for (int i = 0; i < 6; i++) { dl_tensor *s = dl_sum(dl_mul(k->in[i], k->in[i]), DL_ALL, false); loss = loss ? dl_add(loss, s) : s; }
        dl_backward(loss);
        if (kind[0] == 'a') k->opt = dl_adam_params(C, 6, k->in, NULL);
        else { dl_sgd_desc d = {0}; d.lr = 0.01f; d.momentum = 0.9f; k->opt = dl_sgd_params(C, 6, k->in, &d); }
        dl_step_end(C);
        return;
    } else { fprintf(stderr, "unknown kind %s\n", kind); exit(1); }
    k->opt = dl_sgd_params(C, k->nin, k->in, NULL);   /* only for zero_grad (set to none) */
    dl_step_end(C);
}

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

static void iter(int mode) {
    if (mode == 2) { dl_optim_step(K.opt); dl_step_end(C); return; }
    if (mode == 0) { dl_tensor *y = run_op(); if (!y) { fprintf(stderr, "%s\n", dl_error_message(C)); exit(1); } dl_step_end(C); return; }
    dl_optim_zero_grad(K.opt);
    dl_tensor *y = run_op();
    dl_tensor *l = dl_sum(y, DL_ALL, false);
    if (!l || dl_backward(l) != DL_OK) { fprintf(stderr, "%s\n", dl_error_message(C)); exit(1); }
    dl_step_end(C);
}

static double cpu_us(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec * 1e6 + t.tv_nsec * 1e-3; }
/* median wall us per call over 7 rounds; *cpu: median process CPU us per call */
static double timeit(int mode, double *cpu, double *mn) {
    for (int i = 0; i < 3; i++) iter(mode);
    double t0 = now_us(); int n = 0;
    while (now_us() - t0 < 3000 || n < 2) { iter(mode); n++; }
    double per = (now_us() - t0) / n;
    int reps = (int)(5000 / per); if (reps < 1) reps = 1;
    double r[5], c[5];
    for (int j = 0; j < 5; j++) { double c0 = cpu_us(); t0 = now_us(); for (int i = 0; i < reps; i++) iter(mode); r[j] = (now_us() - t0) / reps; c[j] = (cpu_us() - c0) / reps; }
    qsort(r, 5, sizeof r[0], cmpd); qsort(c, 5, sizeof c[0], cmpd);
    *cpu = c[2]; *mn = r[0];
    return r[2];
}

int main(int argc, char **argv) {
    dl_ctx_desc desc = {0}; desc.num_threads = argc > 1 ? atoi(argv[1]) : 1;
    C = dl_ctx_init(&desc);
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        memset(&K, 0, sizeof K);
        char buf[512]; strcpy(buf, line);
        for (char *p = strtok(buf, ":"); p && K.nf < 12; p = strtok(NULL, ":")) strcpy(K.f[K.nf++], p);
        setup();
        double f, fb, fc, fbc, fm, fbm;
        if (!strcmp(K.f[0], "adam") || !strcmp(K.f[0], "sgd")) { f = timeit(2, &fc, &fm); fb = f; fbc = fc; fbm = fm; }
        else if (!strcmp(K.f[1], "argmax")) { f = timeit(0, &fc, &fm); fb = f; fbc = fc; fbm = fm; }   /* no gradient */
        else {
            for (int i = 0; i < K.nin; i++) dl_requires_grad(K.in[i], false);
            f = timeit(0, &fc, &fm);
            for (int i = 0; i < K.nin; i++) dl_requires_grad(K.in[i], K.grad[i]);
            fb = timeit(1, &fbc, &fbm);
        }
        printf("%s %.3f %.3f %.3f %.3f %.3f %.3f\n", line, f, fb, fc, fbc, fm, fbm); fflush(stdout);
        for (int i = 0; i < K.nin; i++) dl_free(K.in[i]);
        for (int i = 0; i < 4; i++) if (K.ex[i]) dl_free(K.ex[i]);
        dl_step_end(C);
    }
    dl_ctx_free(C);
    return 0;
}
