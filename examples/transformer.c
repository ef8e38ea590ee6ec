/* examples/transformer.c - a tiny decoder-only transformer (GPT) that learns
   to sort: it reads 8 random digits and a separator and writes them sorted,
   "3 1 4 1 5 9 2 6 | 1 1 2 3 4 5 6 9". No data files: every training batch
   is new random sequences, and the test set is 1,000 others.

     token embedding + learned position embedding
     | 2 blocks: x + attn(ln1(x)), causal self-attention with 4 heads
     |           x + mlp(ln2(x)),  Linear 64->256, GELU, Linear 256->64
     | LayerNorm | Linear 64->11: the next token's logits at every position

   Trained as a language model (the next token at every position, nanoGPT's
   loop), with the loss only where the sorted digits are (the random digits
   before the separator cannot be predicted): cross entropy with
   ignore_index. AdamW, a cosine learning-rate schedule.
   The training loop is PyTorch's (train_epoch, evaluate below); the flags'
   checks and the epoch line are examples/common.h's.
   Per epoch (4,096 new sequences): train loss, train and test accuracy
   (the sequences sorted whole, every digit right), time, sequences/s; then
   a test sequence sorted token by token, and "test accuracy: 0.xxxx".
   Build: cc -std=c99 -O2 -I. examples/transformer.c -o build/transformer -lm -lpthread
   Run:   build/transformer   (--help for the flags) */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"

#define DIGITS 8                /* digits to sort */
#define SEP 10                  /* the separator token; 0..9 are the digits */
#define VOCAB 11
#define T (2 * DIGITS)          /* the model's input: the digits, SEP, all sorted digits but the last */
#define DIM 64                  /* embedding size (d_model) */
#define HEADS 4
#define LAYERS 2
#define IGNORE (-100)           /* PyTorch's ignore_index */
#define EPOCH_SEQS 4096
#define TEST_SEQS 1000

/* ------------------------------------------------------------ data */

static uint64_t rng_next(uint64_t *s)   /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n sequences "d1 .. d8 SEP s1 .. s8" (s: the digits sorted), as the
   model's input x (n, T), the sequence without its last token, and the
   targets y (n, T), the sequence shifted by one: the token after each
   position, IGNORE where that is not a sorted digit. */
static void make_seqs(uint64_t *rng, int64_t n, int64_t *x, int64_t *y)
{
    int64_t i, seq[2 * DIGITS + 1];
    int t, d, count[10];
    for (i = 0; i < n; i++) {
        memset(count, 0, sizeof count);
        for (t = 0; t < DIGITS; t++) count[seq[t] = (int64_t)(rng_next(rng) % 10)]++;
        seq[DIGITS] = SEP;
        for (d = 0, t = DIGITS + 1; d < 10; d++)   /* counting sort */
            while (count[d]--) seq[t++] = d;
        for (t = 0; t < T; t++) {
            x[i * T + t] = seq[t];
            y[i * T + t] = t >= DIGITS ? seq[t + 1] : IGNORE;
        }
    }
}

/* ------------------------------------------------------------ model */

/* class Block(nn.Module): pre-LayerNorm, causal self-attention, MLP */
typedef struct block { dl_module *ln1, *attn, *ln2, *mlp; } block;

static dl_tensor *block_forward(dl_module *m, dl_tensor *x)
{
    block *b = (block *)dl_module_state(m);
    dl_tensor *h = dl_module_forward(b->ln1, x);
    x = dl_add(x, dl_mha_forward(b->attn, h, h, h, NULL, NULL, true, NULL));   /* attn(h, h, h, is_causal=True) */
    return dl_add(x, dl_module_forward(b->mlp, dl_module_forward(b->ln2, x)));
}

static dl_module *make_block(dl_ctx *ctx)
{
    dl_module *m = dl_module_new(ctx, "Block", block_forward, sizeof(block)), *mlp[3];
    block *b;
    if (!m) return NULL;
    b = (block *)dl_module_state(m);
    b->ln1 = dl_module_add(m, "ln1", dl_nn_layer_norm(ctx, DL_SHAPE(DIM)));
    b->attn = dl_module_add(m, "attn", dl_nn_multihead_attention(ctx, DIM, HEADS, 0.0f, true));
    b->ln2 = dl_module_add(m, "ln2", dl_nn_layer_norm(ctx, DL_SHAPE(DIM)));
    mlp[0] = dl_nn_linear(ctx, DIM, 4 * DIM, true);
    mlp[1] = dl_nn_gelu(ctx);
    mlp[2] = dl_nn_linear(ctx, 4 * DIM, DIM, true);
    b->mlp = dl_module_add(m, "mlp", dl_nn_sequential(ctx, 3, mlp));
    return b->ln1 && b->attn && b->ln2 && b->mlp ? m : NULL;
}

/* class GPT(nn.Module): tokens (B, L) int64, L <= T -> logits (B, L, VOCAB) */
typedef struct gpt { dl_module *tok, *blocks, *ln_f, *head; dl_tensor *pos; } gpt;

static dl_tensor *gpt_forward(dl_module *m, dl_tensor *idx)
{
    gpt *g = (gpt *)dl_module_state(m);
    dl_tensor *x;
    if (!idx) return NULL;
    x = dl_add(dl_module_forward(g->tok, idx), dl_narrow(g->pos, 0, 0, idx->shape[1]));   /* tok(idx) + pos[:L] */
    x = dl_module_forward(g->blocks, x);
    return dl_module_forward(g->head, dl_module_forward(g->ln_f, x));
}

static dl_module *make_gpt(dl_ctx *ctx)
{
    dl_module *m = dl_module_new(ctx, "GPT", gpt_forward, sizeof(gpt)), *blocks[LAYERS];
    gpt *g;
    int i;
    if (!m) return NULL;
    g = (gpt *)dl_module_state(m);
    g->tok = dl_module_add(m, "tok_emb", dl_nn_embedding(ctx, VOCAB, DIM));
    g->pos = dl_module_param(m, "pos_emb", dl_mul_scalar(dl_randn(ctx, DL_SHAPE(T, DIM)), 0.02f));   /* nn.Parameter */
    for (i = 0; i < LAYERS; i++) blocks[i] = make_block(ctx);
    g->blocks = dl_module_add(m, "blocks", dl_nn_sequential(ctx, LAYERS, blocks));
    g->ln_f = dl_module_add(m, "ln_f", dl_nn_layer_norm(ctx, DL_SHAPE(DIM)));
    g->head = dl_module_add(m, "head", dl_nn_linear(ctx, DIM, VOCAB, true));
    return g->tok && g->pos && g->blocks && g->ln_f && g->head ? m : NULL;
}

/* ------------------------------------------------------------ training */

typedef struct run {
    ex_args a;
    ex_setup s;                 /* examples/common.h's: the flags, the context s.ctx, the epochs' numbers */
    dl_device dev;              /* where the model and the batches live */
    uint64_t rng;               /* the training sequences' generator */
    int64_t *x, *y, *pred;      /* host buffers of one batch (n, T) */
    int64_t test_x[TEST_SEQS * T], test_y[TEST_SEQS * T];   /* the test set */
} run;

/* host tokens (n, T) -> a tensor on the run's device */
static dl_tensor *tokens(run *r, const int64_t *v, int64_t n)
{
    return dl_to(dl_from_int64(r->s.ctx, DL_SHAPE(n, T), v), r->dev);
}

/* How many of the n rows the logits (n, T, VOCAB) sort whole: argmax == y
   wherever y is not IGNORE. -1 on an error. */
static int64_t sorted_rows(run *r, dl_tensor *logits, const int64_t *y, int64_t n)
{
    int64_t i, t, rows = 0;
    if (dl_read_int64(dl_argmax(logits, 2, false), r->pred, n * T) != DL_OK) return -1;   /* .argmax(-1) */
    for (i = 0; i < n; i++) {
        for (t = DIGITS; t < T && r->pred[i * T + t] == y[i * T + t]; t++) {}
        rows += t == T;
    }
    return rows;
}

/* F.cross_entropy(logits.view(-1, VOCAB), y.view(-1), ignore_index=-100):
   the mean over the positions whose target is not IGNORE */
static dl_tensor *lm_loss(dl_tensor *logits, dl_tensor *y)
{
    dl_loss_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.has_ignore_index = true;
    ld.ignore_index = IGNORE;
    return dl_cross_entropy(dl_reshape(logits, DL_SHAPE(-1, VOCAB)), dl_reshape(y, DL_SHAPE(-1)), &ld);
}

/* One epoch of EPOCH_SEQS new sequences. Returns 0, or 1 after printing what failed. */
static int train_epoch(run *r, dl_module *net, dl_optim *opt, ex_meter *m)
{
    dl_module_train(net, true);                               /* model.train() */
    for (m->step = 0; m->step < m->steps; m->step++) {
        int64_t n = m->step < m->steps - 1 ? r->a.batch : EPOCH_SEQS - m->step * r->a.batch, rows;
        dl_tensor *x, *y, *logits, *loss;
        float v;
        make_seqs(&r->rng, n, r->x, r->y);                    /* x, y = get_batch() */
        x = tokens(r, r->x, n);
        y = tokens(r, r->y, n);
        dl_optim_zero_grad(opt);                              /* optimizer.zero_grad() */
        logits = dl_module_forward(net, x);                   /* logits = model(x) */
        loss = lm_loss(logits, y);                            /* loss = F.cross_entropy(...) */
        if (!loss) return ex_fail(&r->s, m);
        v = dl_item(loss);                                    /* loss.item() */
        if (!isfinite(v)) { ex_diverged(&r->s, m, v, m->step + 1); return 1; }
        if (dl_backward(loss) != DL_OK ||                     /* loss.backward() */
            dl_optim_step(opt) != DL_OK ||                    /* optimizer.step() */
            (rows = sorted_rows(r, logits, r->y, n)) < 0)
            return ex_fail(&r->s, m);
        m->loss_sum += (double)v * (double)n;
        m->correct += rows;
        m->seen += n;
        dl_step_end(r->s.ctx);                                /* free this step's tensors */
    }
    m->secs = ex_now() - m->t0;
    return 0;
}

/* The test sequences sorted whole, in eval mode without a tape. With the
   right digits before each one in the input (teacher forcing), every
   answer digit the argmax is what greedy decoding writes token by token
   (sample() below), so one forward pass a batch tells. -1 after an error. */
static double evaluate(run *r, dl_module *net)
{
    int64_t i, n, c, rows = 0;
    dl_module_train(net, false);                              /* model.eval() */
    dl_no_grad_begin(r->s.ctx);                               /* with torch.no_grad(): */
    for (i = 0; i < TEST_SEQS; i += n) {
        n = TEST_SEQS - i < r->a.batch ? TEST_SEQS - i : r->a.batch;
        c = sorted_rows(r, dl_module_forward(net, tokens(r, r->test_x + i * T, n)), r->test_y + i * T, n);
        if (c < 0) break;
        rows += c;
        dl_step_end(r->s.ctx);
    }
    dl_no_grad_end(r->s.ctx);
    if (i < TEST_SEQS) { ex_fail(&r->s, NULL); return -1; }
    return (double)rows / TEST_SEQS;
}

/* Greedy decoding (generate()): the first test sequence's digits and SEP,
   then DIGITS times the model's most likely next token appended. */
static bool sample(run *r, dl_module *net)
{
    int64_t seq[T + 1], n;
    dl_module_train(net, false);
    dl_no_grad_begin(r->s.ctx);
    memcpy(seq, r->test_x, (DIGITS + 1) * sizeof *seq);
    for (n = DIGITS + 1; n <= T; n++) {
        dl_tensor *logits = dl_module_forward(net, dl_to(dl_from_int64(r->s.ctx, DL_SHAPE(1, n), seq), r->dev));
        if (dl_read_int64(dl_argmax(dl_narrow(logits, 1, n - 1, 1), 2, false), &seq[n], 1) != DL_OK) break;
        dl_step_end(r->s.ctx);                                /* logits[:, -1].argmax(-1) */
    }
    dl_no_grad_end(r->s.ctx);
    if (n <= T) { ex_fail(&r->s, NULL); return false; }
    printf("sorted by the model:");
    for (n = 0; n <= T; n++) {
        if (seq[n] == SEP) printf(" |");
        else printf(" %lld", (long long)seq[n]);
    }
    printf("\n");
    return true;
}

/* ------------------------------------------------------------ flags */

static void usage(FILE *out, const ex_args *d)
{
    fprintf(out,
            "usage: %s [--epochs N (%d)] [--batch N (%lld)] [--lr F (%g)] [--threads N (0)]\n"
            "       [--seed N (%llu)] [--device NAME (cpu)]\n"
            "  --epochs N    epochs of %d new sequences, 0..%d; --batch N: sequences a step, 1..%d\n"
            "  --lr F        AdamW's learning rate, a finite number > 0\n"
            "  --threads N   kernel threads, 0..%d: 0 = every core, more than the cores = the cores\n"
            "  --seed N      seed of the initialization and the sequences, 0..2^64-1\n"
            "  --device NAME where the model, the optimizer state and the batches live: cpu,\n"
            "                cpu:N (a virtual CPU device), cuda:N (builds with -DDL_CUDA)\n"
            "  --help        this text\n",
            d->prog, d->epochs, (long long)d->batch, (double)d->lr, (unsigned long long)d->seed, EPOCH_SEQS,
            EX_MAX_EPOCHS, EX_MAX_BATCH, EX_MAX_THREADS);
}

/* the shared flags that fit, with examples/common.h's checks and messages */
static void parse(int argc, char **argv, ex_args *a)
{
    int i;
    EX_CHECK_STDOUT(argv[0]);
    ex_own_usage_fn = usage;
    memset(a, 0, sizeof *a);
    a->prog = argv[0];
    a->name = "transformer";
    a->epochs = 6;
    a->batch = 64;
    a->lr = 6e-3f;
    a->seed = 1;
    a->ndev = 1;
    for (i = 1; i < argc; i += 2) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout, a); exit(0); }
        if (strcmp(f, "--epochs") && strcmp(f, "--batch") && strcmp(f, "--lr") && strcmp(f, "--threads") &&
            strcmp(f, "--seed") && strcmp(f, "--device"))
            ex_bad_args(a, "unknown flag %s", f);
        if (!v) ex_bad_args(a, "%s needs a value", f);
        if (!strcmp(f, "--epochs")) a->epochs = (int)ex_int_flag(a, f, v, 0, EX_MAX_EPOCHS);
        else if (!strcmp(f, "--batch")) a->batch = ex_int_flag(a, f, v, 1, EX_MAX_BATCH);
        else if (!strcmp(f, "--lr")) a->lr = ex_lr_flag(a, f, v);
        else if (!strcmp(f, "--threads")) a->threads = (int)ex_int_flag(a, f, v, 0, EX_MAX_THREADS);
        else if (!strcmp(f, "--seed")) a->seed = ex_u64_flag(a, f, v);
        else a->dev[0] = ex_device_flag(a, f, v, v);
    }
    ex_threads_clamp(a);
}

int main(int argc, char **argv)
{
    static run r;
    ex_meter m;
    dl_module *net;
    dl_optim *opt;
    dl_adam_desc ad;
    double acc = 0;
    int epoch;
    uint64_t test_rng;
    parse(argc, argv, &r.a);
    r.s.a = &r.a;
    if (!(r.s.ctx = ex_ctx_new(&r.a))) return 1;              /* seed, threads, devices */
    r.dev = r.a.dev[0].type == DL_DEVICE_DEFAULT ? dl_ctx_device(r.s.ctx) : r.a.dev[0];
    r.rng = r.a.seed;
    test_rng = ~r.a.seed;                                     /* the test set: another stream */
    if (!(r.x = (int64_t *)malloc((size_t)(3 * r.a.batch * T) * sizeof(int64_t)))) {
        fprintf(stderr, "%s: out of memory\n", r.a.prog);
        return ex_done(&r.s, 1);
    }
    r.y = r.x + r.a.batch * T;
    r.pred = r.y + r.a.batch * T;
    make_seqs(&test_rng, TEST_SEQS, r.test_x, r.test_y);
    net = make_gpt(r.s.ctx);
    if (!net || dl_module_to(net, r.dev) != DL_OK) { ex_fail(&r.s, NULL); goto fail; }   /* GPT().to(device) */
    memset(&ad, 0, sizeof ad);                                /* zero: PyTorch's defaults (weight_decay 0.01) */
    ad.lr = r.a.lr;
    if (!(opt = dl_adamw(net, &ad))) { ex_fail(&r.s, NULL); goto fail; }   /* torch.optim.AdamW(params, lr) */
    printf("GPT sorting %d digits: %lld parameters, %d blocks, %d heads, dim %d, batch %lld, %d threads\n",
           DIGITS, (long long)dl_module_num_params(net), LAYERS, HEADS, DIM, (long long)r.a.batch,
           dl_num_threads(r.s.ctx));
    for (epoch = 0; epoch < r.a.epochs; epoch++) {
        if (dl_optim_set_lr(opt, ex_cosine(r.a.lr, epoch, r.a.epochs)) != DL_OK) {   /* CosineAnnealingLR */
            ex_fail(&r.s, NULL);
            goto fail;
        }
        ex_meter_start(&m, &r.s, epoch);
        m.steps = (EPOCH_SEQS + r.a.batch - 1) / r.a.batch;
        if (train_epoch(&r, net, opt, &m) != 0 || (acc = evaluate(&r, net)) < 0) goto fail;
        ex_epoch_end(&r.s, &m, acc);                          /* the epoch line */
    }
    if ((r.a.epochs == 0 && (acc = evaluate(&r, net)) < 0) || !sample(&r, net)) goto fail;
    printf("test accuracy: %.4f\n", acc);
    free(r.x);
    return ex_done(&r.s, 0);
fail:
    free(r.x);
    return ex_done(&r.s, 1);
}
