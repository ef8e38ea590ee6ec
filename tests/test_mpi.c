/* tests/test_mpi.c - dl_comm over MPI, run by `make test-mpi` as
       mpirun --allow-run-as-root --oversubscribe -np 2 build/mpi/test_mpi
   (built with mpicc -DDL_MPI). Each process has 2 strict virtual CPU
   devices. Checks: rank and size; dl_comm_allreduce over 1 and 2 local
   replicas per process (sizes 1..10^6, sum and mean) against the sum of
   every replica of every process, the same bits on every replica of every
   process; broadcast from rank 1; barrier; dl_ddp over processes (1 and 2
   replicas each) trains an MLP and LeNet 20 steps to the parameters of one
   model on the full batch (rel. tol. 1e-5); dl_ddp_check finds a process
   that drifted (built with DL_DEBUG, every dl_ddp_step checks the replicas
   of all processes); processes with unlike models (another name, another
   shape, an extra layer on either side) fail dl_ddp_init on every rank
   with the first difference. Rank 0 prints the summed "N passed, M
   failed" line.

   `test_mpi --stop` / `--kill` (tests/test_mpi_kill.sh): rank 1 hangs (as
   a lost node: alive, silent) or is killed while both ranks run allreduces
   in a loop. A hang: rank 0 fails with the timeout message within
   DL_COMM_TIMEOUT, then ends the job (MPI_Abort: rank 1 cannot finish).
   A kill: Open MPI's mpirun notices and ends the job itself. */
#define _POSIX_C_SOURCE 200809L
#ifndef DL_MPI
#error "build with mpicc -DDL_MPI (make test-mpi)"
#endif
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include "dist_models.h"
#include <stdlib.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

static dl_ctx *C;
static dl_comm *W;
static int g_rank, g_size;

/* the value of element k of replica r of process p: every process can
   compute every other's data */
static float val(int p, int r, int64_t k)
{
    uint32_t h = (uint32_t)(k * 2654435761u) ^ (uint32_t)(p * 97 + r * 13 + 1) * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return (float)(h & 0xFFFF) / 32768.0f - 1.0f;
}

/* the same bits in every process: compare with rank 0's copy */
static int same_everywhere(const float *x, int64_t n)
{
    float *r0 = (float *)malloc(sizeof(float) * (size_t)n);
    int same, all = 0;
    memcpy(r0, x, sizeof(float) * (size_t)n);
    MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    same = memcmp(r0, x, sizeof(float) * (size_t)n) == 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    free(r0);
    return all;
}

static void test_allreduce(int64_t count, int nloc, int mean)
{
    dl_tensor *t[2];
    float *x = (float *)malloc(sizeof(float) * (size_t)count), *got = (float *)malloc(sizeof(float) * (size_t)count);
    int r, close = 1, same = 1;
    int64_t k;
    for (r = 0; r < nloc; r++) {
        for (k = 0; k < count; k++) x[k] = val(g_rank, r, k);
        dl_set_device(C, dl_cpu_device(r));
        t[r] = dl_from_array(C, DL_SHAPE(count), x);
    }
    dl_set_device(C, dl_cpu());
    CHECK(dl_comm_allreduce(W, t, nloc, mean ? DL_REDUCE_MEAN : DL_REDUCE_SUM) == DL_OK,
          "comm allreduce %lld x %d: %s", (long long)count, nloc, dl_error_message(C));
    dl_read(t[0], got, count);
    for (k = 0; k < count && close; k++) {
        double s = 0;
        int p;
        for (p = 0; p < g_size; p++)
            for (r = 0; r < nloc; r++) s += val(p, r, k);
        if (mean) s /= g_size * nloc;
        if (fabs(s - got[k]) > 1e-5 * (1 + fabs(s))) close = 0;
    }
    if (nloc == 2) {
        dl_read(t[1], x, count);
        same = memcmp(x, got, sizeof(float) * (size_t)count) == 0;
    }
    CHECK(close, "%s of %lld over %d processes x %d replicas = the sequential sum", mean ? "mean" : "sum",
          (long long)count, g_size, nloc);
    CHECK(same && same_everywhere(got, count), "%s of %lld: the same bits on every replica of every process",
          mean ? "mean" : "sum", (long long)count);
    free(x);
    free(got);
    dl_step_end(C);
}

static void test_broadcast_barrier(void)
{
    dl_tensor *t[2];
    int64_t v[3], got[3];
    int r;
    for (r = 0; r < 2; r++) {
        v[0] = g_rank; v[1] = 100 + r; v[2] = 1LL << 40;
        dl_set_device(C, dl_cpu_device(r));
        t[r] = dl_from_int64(C, DL_SHAPE(3), v);
    }
    CHECK(dl_comm_broadcast(W, t, 2, 1) == DL_OK, "broadcast from rank 1: %s", dl_error_message(C));
    dl_read_int64(t[1], got, 3);
    CHECK(got[0] == 1 && got[1] == 100 && got[2] == 1LL << 40, "rank 1's replica 0 everywhere (%lld %lld)",
          (long long)got[0], (long long)got[1]);
    CHECK(dl_comm_barrier(W) == DL_OK, "barrier: %s", dl_error_message(C));
    dl_set_device(C, dl_cpu());
    dl_step_end(C);
}

/* ------------------------------------------------------------------ data parallel */

/* each is told a's values: are they the same bits in every process? */
static void check_everywhere(const float *x, int64_t n, void *u)
{
    if (!same_everywhere(x, n)) *(int *)u = 0;
}

/* each process gets its share of the global batch (B rows, B divisible by
   the processes) and splits it over nloc local replicas */
/* test_ddp's gradient buckets (0: the default size, else about this many)
   and path (1: summed after backward, without the ready hook); after it,
   the replica's parameters and the buckets posted during the last backward */
static int g_buckets, g_no_overlap, g_nb, g_early;
static float *g_params;
static int64_t g_nparams;

static void test_ddp(int kind, int nloc, int64_t B)
{
    dl_module *ref, *rep[2];
    dl_optim *oref, *op[2];
    dl_sgd_desc sd;
    dl_ddp_desc dd;
    dl_ddp *dp;
    int64_t Bl = B / g_size, k;
    float *xb = (float *)malloc(sizeof(float) * (size_t)B * 784);
    int64_t *yb = (int64_t *)malloc(sizeof(int64_t) * (size_t)B);
    int i, step, ok = 1, same = 1;
    double diff, lossdiff = 0;
    memset(&sd, 0, sizeof sd);
    sd.lr = 0.05f;
    sd.momentum = 0.9f;
    dl_manual_seed(C, 7);
    ref = make_model(C, kind);
    oref = dl_sgd(ref, &sd);
    for (i = 0; i < nloc; i++) {
        dl_manual_seed(C, 1000 + (uint64_t)(g_rank * 2 + i));   /* rank 0 replica 0 wins */
        if (g_rank == 0 && i == 0) dl_manual_seed(C, 7);
        rep[i] = make_model(C, kind);
        dl_module_to(rep[i], dl_cpu_device(i));
        op[i] = dl_sgd(rep[i], &sd);
    }
    memset(&dd, 0, sizeof dd);
    dd.comm = W;
    if (g_buckets) {
        const dl_named_tensor *pa;
        int np = dl_module_named_parameters(rep[0], &pa), q;
        int64_t total = 0;
        for (q = 0; q < np; q++) total += pa[q].t->numel;
        dd.bucket_bytes = (int64_t)sizeof(float) * (total / g_buckets + 1);
    }
    dp = dl_ddp_init(nloc, rep, op, &dd);
    CHECK(dp != NULL, "dl_ddp_init over MPI: %s", dl_error_message(C));
    if (!dp) { free(xb); free(yb); return; }
    if (g_no_overlap) dp->overlap = false;
    for (step = 0; step < 20 && ok; step++) {
        dl_tensor *x, *y;
        float l1, l2 = 0;
        for (k = 0; k < B * 784; k++) xb[k] = val(step, 0, k);
        for (k = 0; k < B; k++) yb[k] = (int64_t)((val(step, 1, k) + 1.0f) * 5.0f) % 10;
        l1 = ref_step(C, ref, oref, xb, yb, B);
        ok = l1 == l1;
        x = dl_from_array(C, DL_SHAPE(Bl, 1, 28, 28), xb + g_rank * Bl * 784);
        y = dl_from_int64(C, DL_SHAPE(Bl), yb + g_rank * Bl);
        ok = ok && dl_ddp_step(dp, x, y, ce_loss, NULL, &l2) == DL_OK;
        if (fabs(l1 - l2) > lossdiff) lossdiff = fabs(l1 - l2);
        dl_step_end(C);
    }
    CHECK(ok, "ddp %d over MPI x %d: %s", kind, nloc, dl_error_message(C));
    CHECK(lossdiff < 1e-5, "ddp %s over %d processes x %d: the loss of the full batch (diff %.3g)",
          kind ? "LeNet" : "MLP", g_size, nloc, lossdiff);
    diff = param_diff(ref, rep[0], check_everywhere, &same);
    CHECK(diff < 1e-5, "ddp %s over %d processes x %d replicas = one model on the full batch after 20 "
          "steps (worst relative diff %.3g)", kind ? "LeNet" : "MLP", g_size, nloc, diff);
    CHECK(same, "ddp: the same parameters, bit for bit, in every process");
    g_nb = dp->nb;
    g_early = dp->early;
    {
        const dl_named_tensor *pa;
        int np = dl_module_named_parameters(rep[0], &pa), q;
        for (q = 0, g_nparams = 0; q < np; q++) g_nparams += pa[q].t->numel;
        free(g_params);
        g_params = (float *)malloc(sizeof(float) * (size_t)g_nparams);
        for (q = 0, k = 0; q < np; q++) { dl_read(pa[q].t, g_params + k, pa[q].t->numel); k += pa[q].t->numel; }
    }
    if (kind == 0 && nloc == 1) {        /* process 1's replica drifts: dl_ddp_check sees it there */
        dl_tensor *w = dl_module_get(rep[0], "1.weight");
        float *buf = (float *)malloc(sizeof(float) * (size_t)w->numel);
        dl_result rc;
        dl_read(w, buf, w->numel);
        if (g_rank == 1) buf[3] += 1.0f;
        dl_no_grad_begin(C);
        dl_write(w, buf, w->numel);
        dl_no_grad_end(C);
        free(buf);
        rc = dl_ddp_check(dp);
        CHECK(g_rank == 0 ? rc == DL_OK : rc == DL_ERR_DEVICE && strstr(dl_error_message(C),
              "dl_ddp_check: process 1 has drifted from process 0: parameter 0") != NULL,
              "rank %d: dl_ddp_check across processes: %s", g_rank, dl_error_message(C));
        dl_clear_error(C);
        dl_step_end(C);
    }
    dl_ddp_free(dp);
    free(xb);
    free(yb);
}

/* ------------------------------------------------------------------ unlike models */

/* the processes build unlike models: dl_ddp_init fails on every rank with
   one message naming the first difference (before the fix: a name and a
   shape of the same size trained silently, a bias of 5 against 4 aborted
   the job with MPI_ERR_TRUNCATE, an extra layer waited out the timeout);
   W goes on working */
static void test_mismatch(void)
{
    static const struct { int v0, v1; const char *what; } cases[] = {
        {1, 2, "rank 1's state_dict entry 0 is 'other_name' float32 (4,3) parameter where rank 0's is "
               "'w' float32 (3,4) parameter"},
        {0, 3, "rank 1's state_dict entry 1 is '0.bias' float32 (5) parameter where rank 0's is "
               "'0.bias' float32 (4) parameter"},
        {3, 0, "rank 1's state_dict entry 1 is '0.bias' float32 (4) parameter where rank 0's is "
               "'0.bias' float32 (5) parameter"},
        {0, 4, "rank 1's state_dict entry 2 is '1.weight' float32 (4,4) parameter where rank 0's has only 2 entries"},
        {4, 0, "rank 1's state_dict has only 2 entries where rank 0's entry 2 is '1.weight' float32 (4,4) parameter"}};
    int c;
    for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        dl_module *m;
        dl_ddp_desc dd;
        dl_tensor *t;
        char want[512];
        memset(&dd, 0, sizeof dd);
        dd.comm = W;
        dl_set_device(C, dl_cpu_device(g_rank == 0 ? 0 : 1));
        m = mismatch_model(C, g_rank == 0 ? cases[c].v0 : cases[c].v1);
        snprintf(want, sizeof want, "dl_ddp_init: the ranks hold different models (1 of %d differ from rank 0; "
                 "this is rank %d): %s; every rank must build the same model", g_size, g_rank, cases[c].what);
        CHECK(dl_ddp_init(1, &m, NULL, &dd) == NULL && dl_last_error(C) == DL_ERR_SHAPE &&
              strstr(dl_error_message(C), want) != NULL, "unlike models, case %d, rank %d: got '%s'", c, g_rank,
              dl_error_message(C));
        dl_clear_error(C);
        t = dl_ones(C, DL_SHAPE(3));
        CHECK(dl_comm_allreduce(W, &t, 1, DL_REDUCE_SUM) == DL_OK && th_f(t, 1) == (float)g_size,
              "after unlike models, case %d: the communicator still sums (%s)", c, dl_error_message(C));
        dl_set_device(C, dl_cpu());
        dl_step_end(C);
    }
    /* unlike sizes, either way round (a shorter message had completed with
       the rest of the buffer stale, DL_OK), and unlike numbers of local
       tensors (a MEAN scaled wrongly): DL_ERR_SHAPE on every rank before
       any data moves, and the communicator still works */
    {
        int k;
        for (k = 0; k < 4; k++) {
            dl_tensor *t[2];
            dl_result rc;
            int nloc = k == 3 && g_rank == 1 ? 2 : 1;
            int64_t n = k == 0 ? (g_rank == 0 ? 5 : 4) : k == 1 ? (g_rank == 0 ? 4 : 5) : k == 2 ? (g_rank ? 0 : 3) : 3;
            t[0] = dl_ones(C, DL_SHAPE(n));
            dl_set_device(C, dl_cpu_device(1));
            t[1] = dl_ones(C, DL_SHAPE(n));
            dl_set_device(C, dl_cpu());
            rc = k < 2 ? dl_comm_broadcast(W, t, nloc, 0) : dl_comm_allreduce(W, t, nloc, DL_REDUCE_MEAN);
            CHECK(rc == DL_ERR_SHAPE && strstr(dl_error_message(C), "every process must pass the same shapes and "
                  "number of tensors"), "rank %d, case %d (unlike sizes or tensor counts): %s: %s", g_rank, k,
                  dl_result_string(rc), dl_error_message(C));
            dl_clear_error(C);
            t[0] = dl_ones(C, DL_SHAPE(3));
            CHECK(dl_comm_allreduce(W, t, 1, DL_REDUCE_SUM) == DL_OK && th_f(t[0], 1) == (float)g_size,
                  "after case %d: the communicator still sums (%s)", k, dl_error_message(C));
            dl_step_end(C);
        }
    }
}

/* ------------------------------------------------------------------ a rank dies */

static void die(int sig) { (void)sig; kill(getpid(), SIGKILL); }
static void hang(int sig)
{
    (void)sig;
    for (;;) pause();            /* a hung rank: alive, but never answers again */
}

static int test_failure(bool stop, bool ddp)
{
    dl_tensor *t[1];
    int i;
    double t0;
    dl_result rc = DL_OK;
    dl_ddp *dp = NULL;
    dl_set_device(C, dl_cpu());
    t[0] = dl_keep(dl_zeros(C, DL_SHAPE(1 << 22)));
    if (ddp) {                  /* dl_ddp_step with 8 buckets summed during backward */
        dl_module *m = make_model(C, 0);
        dl_sgd_desc sd;
        dl_ddp_desc dd;
        dl_optim *o;
        memset(&sd, 0, sizeof sd);
        sd.lr = 0.01f;
        o = dl_sgd(m, &sd);
        memset(&dd, 0, sizeof dd);
        dd.comm = W;
        dd.bucket_bytes = 4 * (dl_module_num_params(m) / 8 + 1);
        dp = dl_ddp_init(1, &m, &o, &dd);
        CHECK(dp && dp->overlap && dp->nb >= 8, "the ddp of the failure test: %s", dl_error_message(C));
    }
    if (g_rank == 1) {          /* in 0.3 s, wherever it is: inside an allreduce, most likely */
        struct itimerval it;
        memset(&it, 0, sizeof it);
        it.it_value.tv_usec = 300000;
        signal(SIGALRM, stop ? hang : die);
        setitimer(ITIMER_REAL, &it, NULL);
    }
    t0 = MPI_Wtime();
    for (i = 0; i < 100000 && rc == DL_OK; i++) {
        if (dp) {
            float xb[16 * 784];
            int64_t yb[16], k;
            for (k = 0; k < 16 * 784; k++) xb[k] = val(i, 0, k);
            for (k = 0; k < 16; k++) yb[k] = k % 10;
            rc = dl_ddp_step(dp, dl_from_array(C, DL_SHAPE(16, 1, 28, 28), xb), dl_from_int64(C, DL_SHAPE(16), yb),
                             ce_loss, NULL, NULL);
            dl_step_end(C);
        } else {
            rc = dl_comm_allreduce(W, t, 1, DL_REDUCE_SUM);
        }
    }
    printf("rank %d: %s %d failed after %.2f s: %s\n", g_rank, dp ? "dl_ddp_step" : "allreduce", i,
           MPI_Wtime() - t0, dl_error_message(C));
    CHECK(rc == DL_ERR_DEVICE && strstr(dl_error_message(C), "a rank died or hangs") != NULL,
          "the survivor fails with the timeout message");
    CHECK(dl_comm_allreduce(W, t, 1, DL_REDUCE_SUM) == DL_ERR_DEVICE && dl_last_error(C) == DL_ERR_DEVICE &&
          strstr(dl_error_message(C), "failed earlier") != NULL, "the communicator refuses more work (the code "
          "returned is the one recorded)");
    printf("%d passed, %d failed\n", th_pass, th_fail);
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, th_fail ? 1 : 0);   /* rank 1 cannot finish: end the job */
    return 1;
}

int main(int argc, char **argv)
{
    dl_ctx_desc d;
    dl_comm_desc cd;
    int tot[2], mine[2];
    static const int64_t sizes[] = {1, 2, 3, 5, 1000, 65536 + 7, 1000000};
    int si, nloc, mean;
    memset(&d, 0, sizeof d);
    d.cpu_devices = 2;
    d.strict_devices = true;
    d.log = dl_log_silent;
    d.num_threads = 1;
    C = dl_ctx_init(&d);
    memset(&cd, 0, sizeof cd);
    cd.backend = DL_COMM_MPI;
    W = C ? dl_comm_init(C, &cd) : NULL;
    if (!W) {
        printf("FAIL: dl_comm_init(DL_COMM_MPI): %s\n0 passed, 1 failed\n", dl_error_message(C));
        return 1;
    }
    g_rank = dl_comm_rank(W);
    g_size = dl_comm_size(W);
    if (argc > 1 && (strcmp(argv[1], "--stop") == 0 || strcmp(argv[1], "--kill") == 0 ||
                     strcmp(argv[1], "--stop-ddp") == 0))
        return test_failure(strcmp(argv[1], "--kill") != 0, strcmp(argv[1], "--stop-ddp") == 0);
    CHECK(g_size >= 2 && g_rank >= 0 && g_rank < g_size, "rank %d of %d (run under mpirun -np 2)", g_rank, g_size);
    for (si = 0; si < (int)(sizeof sizes / sizeof sizes[0]); si++)
        for (nloc = 1; nloc <= 2; nloc++)
            for (mean = 0; mean < 2; mean++) test_allreduce(sizes[si], nloc, mean);
    test_broadcast_barrier();
    test_ddp(0, 1, 32);
    test_ddp(0, 2, 30);
    test_ddp(1, 1, 16);
    test_ddp(1, 2, 16);
    /* about 8 buckets, one replica per process: each bucket's ring starts
       from backward's ready hook; the same buckets summed after backward
       give the same bits */
    {
        float *first;
        int kind;
        for (kind = 0; kind < 2; kind++) {
            g_buckets = 8;
            g_no_overlap = 0;
            test_ddp(kind, 1, 32);
            CHECK(g_nb >= 8 && g_early == g_nb, "ddp %s, 8 buckets: every bucket's sum started during backward "
                  "(%d of %d)", kind ? "LeNet" : "MLP", g_early, g_nb);
            first = g_params;
            g_params = NULL;
            g_no_overlap = 1;
            test_ddp(kind, 1, 32);
            CHECK(g_early == 0, "ddp, 8 buckets after backward: none during backward (%d)", g_early);
            CHECK(first && g_params && memcmp(first, g_params, sizeof(float) * (size_t)g_nparams) == 0,
                  "ddp %s, 8 buckets: overlapped with backward = summed after it, bit for bit",
                  kind ? "LeNet" : "MLP");
            free(first);
        }
        g_buckets = g_no_overlap = 0;
        free(g_params);
        g_params = NULL;
    }
    test_mismatch();
    mine[0] = th_pass;
    mine[1] = th_fail;
    MPI_Reduce(mine, tot, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    dl_comm_free(W);             /* MPI_Finalize: dl_comm_init called MPI_Init */
    dl_ctx_free(C);
    if (g_rank != 0) return th_fail ? 1 : 0;
    th_pass = tot[0];
    th_fail = tot[1];
    TEST_END();
}
