/* parts/nn_impl.h - implementation of parts/nn_decl.h: modules, init,
   optimizers, schedules, clipping, safetensors checkpoints. Appended to dl.h's
   implementation (inside #ifdef DL_IMPLEMENTATION). */
#if defined(DL_IMPLEMENTATION) && !defined(DL__NN_IMPLEMENTED)
#define DL__NN_IMPLEMENTED
#include <limits.h>   /* LONG_MAX (dl_load) */

// >>section nn: modules
/* A module holds its own parameters and buffers (in registration order) and
   its children. state_dict order is: own parameters, own buffers, then each
   child's entries under "<child>.", as torch.nn.Module._save_to_state_dict. */

#define DL__MOD_MAGIC 0x444c4d44u
#define DL__NAME_MAX 64

typedef struct dl__mtensor { char name[DL__NAME_MAX]; dl_tensor *t; bool param; } dl__mtensor;
typedef struct dl__mchild { char name[DL__NAME_MAX]; dl_module *m; } dl__mchild;

struct dl_module {
    uint32_t magic;
    dl_ctx *ctx;
    char type[32];
    dl_module_fn forward;
    void *state;
    bool training;
    int nt, capt;
    dl__mtensor *ts;
    int nc, capc;
    dl__mchild *cs;
    dl_tensor **scratch;              /* de-duplicated parameter list (clip_grad_norm) */
    int nscratch;
};

static void dl__module_destroy(void *p)
{
    dl_module *m = (dl_module *)p;
    m->magic = 0;
    DL_FREE(m->ts);
    DL_FREE(m->cs);
    DL_FREE(m->scratch);
    DL_FREE(m->state);
    DL_FREE(m);
}

static bool dl__mod_ok(const dl_module *m) { return m && m->magic == DL__MOD_MAGIC; }

dl_module *dl_module_new(dl_ctx *ctx, const char *type, dl_module_fn forward, size_t state_bytes)
{
    dl_module *m;
    if (!ctx) return NULL;
    m = (dl_module *)dl__malloc(ctx, sizeof(dl_module));
    if (!m) { dl__err(ctx, DL_ERR_OOM, "dl_module_new: out of memory"); return NULL; }
    memset(m, 0, sizeof *m);
    if (state_bytes) {
        m->state = dl__malloc(ctx, state_bytes);
        if (!m->state) {
            DL_FREE(m);
            dl__err(ctx, DL_ERR_OOM, "dl_module_new: cannot allocate %zu bytes of state for %s",
                    state_bytes, type ? type : "a module");
            return NULL;
        }
        memset(m->state, 0, state_bytes);
    }
    m->magic = DL__MOD_MAGIC;
    m->ctx = ctx;
    snprintf(m->type, sizeof m->type, "%s", type ? type : "Module");
    m->forward = forward;
    m->training = true;
    if (!dl__own(ctx, dl__module_destroy, m)) { dl__module_destroy(m); return NULL; }
    return m;
}

void *dl_module_state(dl_module *m) { return dl__mod_ok(m) ? m->state : NULL; }
const char *dl_module_type(const dl_module *m) { return dl__mod_ok(m) ? m->type : ""; }
dl_ctx *dl_module_ctx(const dl_module *m) { return dl__mod_ok(m) ? m->ctx : NULL; }

/* A local name: 1..63 chars, no '.', not used in m yet. */
static bool dl__mod_name_ok(dl_module *m, const char *fn, const char *name)
{
    int i;
    if (!name || !name[0] || strlen(name) >= DL__NAME_MAX || strchr(name, '.')) {
        dl__err(m->ctx, DL_ERR_ARG, "%s: %s: name \"%s\" must be 1..%d characters without '.'",
                fn, m->type, name ? name : "(null)", DL__NAME_MAX - 1);
        return false;
    }
    for (i = 0; i < m->nt; i++)
        if (strcmp(m->ts[i].name, name) == 0) goto dup;
    for (i = 0; i < m->nc; i++)
        if (strcmp(m->cs[i].name, name) == 0) goto dup;
    return true;
dup:
    dl__err(m->ctx, DL_ERR_ARG, "%s: %s already has a parameter, buffer or child named \"%s\"",
            fn, m->type, name);
    return false;
}

static bool dl__grow(dl_ctx *ctx, void **arr, int *cap, int need, size_t esize)
{
    int nc;
    void *p;
    if (need <= *cap) return true;
    nc = *cap ? *cap * 2 : 4;
    while (nc < need) nc *= 2;
    p = DL_REALLOC(*arr, esize * (size_t)nc);
    ctx->alloc_calls++;
    if (!p) { dl__err(ctx, DL_ERR_OOM, "dl_module: out of memory"); return false; }
    *arr = p;
    *cap = nc;
    return true;
}

static dl_tensor *dl__mod_register(dl_module *m, const char *fn, const char *name, dl_tensor *init,
                                   bool param)
{
    dl_tensor *t;
    void *arr;
    if (!dl__mod_ok(m) || !init) return NULL;
    if (!dl__live(fn, "init", init)) return NULL;
    if (init->ctx_ != m->ctx) {
        dl__err(m->ctx, DL_ERR_ARG, "%s: init for \"%s\" belongs to another context", fn,
                name ? name : "");
        return NULL;
    }
    if (param && init->dtype != DL_DTYPE_F32) {
        dl__err(m->ctx, DL_ERR_DTYPE, "%s: %s.%s: init %s has dtype %s; parameters must be float32",
                fn, m->type, name ? name : "", dl__sh(init), dl__dtype_str(init->dtype));
        return NULL;
    }
    if (!dl__mod_name_ok(m, fn, name)) return NULL;
    arr = m->ts;
    if (!dl__grow(m->ctx, &arr, &m->capt, m->nt + 1, sizeof(dl__mtensor))) return NULL;
    m->ts = (dl__mtensor *)arr;
    t = dl_keep(init);
    if (!t) return NULL;
    dl_set_name(t, name);
    if (param) t->requires_grad = true;
    snprintf(m->ts[m->nt].name, DL__NAME_MAX, "%s", name);
    m->ts[m->nt].t = t;
    m->ts[m->nt].param = param;
    m->nt++;
    return t;
}

dl_tensor *dl_module_param(dl_module *m, const char *name, dl_tensor *init)
{
    return dl__mod_register(m, "dl_module_param", name, init, true);
}

dl_tensor *dl_module_buffer(dl_module *m, const char *name, dl_tensor *init)
{
    return dl__mod_register(m, "dl_module_buffer", name, init, false);
}

static bool dl__mod_contains(const dl_module *root, const dl_module *x, int depth)
{
    int i;
    if (root == x) return true;
    if (depth > 256) return true;     /* treat absurd depth as a cycle */
    for (i = 0; i < root->nc; i++)
        if (dl__mod_contains(root->cs[i].m, x, depth + 1)) return true;
    return false;
}

dl_module *dl_module_add(dl_module *parent, const char *name, dl_module *child)
{
    void *arr;
    if (!dl__mod_ok(parent) || !child) return NULL;
    if (!dl__mod_ok(child)) {
        dl__err(parent->ctx, DL_ERR_ARG, "dl_module_add: child \"%s\" is not a module", name ? name : "");
        return NULL;
    }
    if (child->ctx != parent->ctx) {
        dl__err(parent->ctx, DL_ERR_ARG, "dl_module_add: child \"%s\" belongs to another context",
                name ? name : "");
        return NULL;
    }
    if (dl__mod_contains(child, parent, 0)) {
        dl__err(parent->ctx, DL_ERR_ARG, "dl_module_add: adding %s as \"%s\" of %s would make a "
                "cycle (a module cannot contain itself)", child->type, name ? name : "", parent->type);
        return NULL;
    }
    if (!dl__mod_name_ok(parent, "dl_module_add", name)) return NULL;
    arr = parent->cs;
    if (!dl__grow(parent->ctx, &arr, &parent->capc, parent->nc + 1, sizeof(dl__mchild))) return NULL;
    parent->cs = (dl__mchild *)arr;
    snprintf(parent->cs[parent->nc].name, DL__NAME_MAX, "%s", name);
    parent->cs[parent->nc].m = child;
    parent->nc++;
    return child;
}

dl_tensor *dl_module_forward(dl_module *m, dl_tensor *x)
{
    if (!dl__mod_ok(m) || !x) return NULL;
    if (!m->forward) {
        dl__err(m->ctx, DL_ERR_ARG, "dl_module_forward: module %s has no forward function", m->type);
        return NULL;
    }
    if (!dl__live(m->type, "x", x)) return NULL;
    return m->forward(m, x);
}

static void dl__mod_train(dl_module *m, bool on, int depth)
{
    int i;
    if (depth > 256) return;
    m->training = on;
    for (i = 0; i < m->nc; i++) dl__mod_train(m->cs[i].m, on, depth + 1);
}

void dl_module_train(dl_module *m, bool on) { if (dl__mod_ok(m)) dl__mod_train(m, on, 0); }
bool dl_module_training(const dl_module *m) { return dl__mod_ok(m) && m->training; }

dl_module *dl_module_child(dl_module *m, const char *name)
{
    int i;
    if (!dl__mod_ok(m) || !name) return NULL;
    for (i = 0; i < m->nc; i++)
        if (strcmp(m->cs[i].name, name) == 0) return m->cs[i].m;
    return NULL;
}

dl_tensor *dl_module_get(dl_module *m, const char *path)
{
    const char *p, *dot;
    dl_module *cur = m;
    char part[DL__NAME_MAX];
    int i;
    if (!dl__mod_ok(m)) return NULL;
    if (!path) { dl__err(m->ctx, DL_ERR_ARG, "dl_module_get: path is NULL"); return NULL; }
    p = path;
    for (;;) {
        size_t len;
        dot = strchr(p, '.');
        len = dot ? (size_t)(dot - p) : strlen(p);
        if (len == 0 || len >= DL__NAME_MAX) break;
        memcpy(part, p, len);
        part[len] = 0;
        if (!dot) {
            for (i = 0; i < cur->nt; i++)
                if (strcmp(cur->ts[i].name, part) == 0) return cur->ts[i].t;
            break;
        }
        for (i = 0; i < cur->nc; i++)
            if (strcmp(cur->cs[i].name, part) == 0) break;
        if (i == cur->nc) break;
        cur = cur->cs[i].m;
        p = dot + 1;
    }
    dl__err(m->ctx, DL_ERR_ARG, "dl_module_get: %s has no parameter or buffer \"%s\" (\"%.*s\" "
            "not found in %s; see dl_module_named_tensors for the names)", m->type, path,
            (int)(dot ? (size_t)(dot - p) : strlen(p)), p, cur->type);
    return NULL;
}

typedef struct dl__walk {
    bool params_only;
    int max, count;
    dl_tensor **out;
    char (*names)[128];
} dl__walk;

/* dst = a + b (+ "." when dot), truncated to 127 characters */
static void dl__join(char *dst, const char *a, const char *b, bool dot)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127) la = 127;
    memcpy(dst, a, la);
    if (lb > 127 - la) lb = 127 - la;
    memcpy(dst + la, b, lb);
    la += lb;
    if (dot && la < 127) dst[la++] = '.';
    dst[la] = 0;
}

static void dl__walk_mod(const dl_module *m, const char *prefix, dl__walk *w, int depth)
{
    int pass, i;
    char buf[128];
    if (depth > 256) return;
    for (pass = 0; pass < 2; pass++) {
        if (pass == 1 && w->params_only) break;
        for (i = 0; i < m->nt; i++) {
            if (m->ts[i].param != (pass == 0)) continue;
            if (w->count < w->max) {
                if (w->out) w->out[w->count] = m->ts[i].t;
                if (w->names) dl__join(w->names[w->count], prefix, m->ts[i].name, false);
            }
            w->count++;
        }
    }
    for (i = 0; i < m->nc; i++) {
        dl__join(buf, prefix, m->cs[i].name, true);
        dl__walk_mod(m->cs[i].m, buf, w, depth + 1);
    }
}

int dl_module_named_tensors(dl_module *m, bool params_only, int max, dl_tensor **out,
                            char (*names)[128])
{
    dl__walk w;
    if (!dl__mod_ok(m)) return 0;
    w.params_only = params_only;
    w.max = max < 0 ? 0 : max;
    w.count = 0;
    w.out = out;
    w.names = names;
    dl__walk_mod(m, "", &w, 0);
    return w.count;
}

/* The de-duplicated parameters in state_dict order, in m->scratch (grown
   only when the count grows, so a steady loop does not allocate). -1: OOM. */
static int dl__mod_params(dl_module *m)
{
    int n = dl_module_named_tensors(m, true, 0, NULL, NULL), i, j, k = 0;
    if (n > m->nscratch) {
        dl_tensor **s = (dl_tensor **)dl__malloc(m->ctx, sizeof(dl_tensor *) * (size_t)n);
        if (!s) { dl__err(m->ctx, DL_ERR_OOM, "%s: out of memory listing parameters", m->type); return -1; }
        DL_FREE(m->scratch);
        m->scratch = s;
        m->nscratch = n;
    }
    dl_module_named_tensors(m, true, n, m->scratch, NULL);
    for (i = 0; i < n; i++) {
        for (j = 0; j < k; j++) if (m->scratch[j] == m->scratch[i]) break;
        if (j == k) m->scratch[k++] = m->scratch[i];
    }
    return k;
}

int64_t dl_module_num_params(dl_module *m)
{
    int n, i;
    int64_t s = 0;
    if (!dl__mod_ok(m)) return 0;
    n = dl__mod_params(m);
    for (i = 0; i < n; i++) s += m->scratch[i]->numel;
    return s;
}

void dl_module_zero_grad(dl_module *m)
{
    int n, i;
    if (!dl__mod_ok(m)) return;
    n = dl__mod_params(m);
    for (i = 0; i < n; i++) dl_zero_grad(m->scratch[i]);
}

// >>section nn: init
static bool dl__init_ok(const char *fn, dl_tensor *t)
{
    char b[32];
    if (!t || !dl__live(fn, "t", t) || !dl__f32(fn, "t", t)) return false;
    if (t->device.type != DL_DEVICE_CPU) {
        dl__err(t->ctx_, DL_ERR_DEVICE, "%s: t %s is on %s; initialize on the CPU, then dl_to()",
                fn, dl__sh(t), dl__dev_str(t->device, b, sizeof b));
        return false;
    }
    return true;
}

static int64_t dl__receptive(const dl_tensor *w)
{
    int64_t r = 1;
    int i;
    for (i = 2; i < w->ndim; i++) r *= w->shape[i];
    return r;
}

int64_t dl_fan_in(const dl_tensor *w)
{
    if (!w || w->magic_ != DL__MAGIC || w->ndim < 2) return -1;
    return w->shape[1] * dl__receptive(w);
}

int64_t dl_fan_out(const dl_tensor *w)
{
    if (!w || w->magic_ != DL__MAGIC || w->ndim < 2) return -1;
    return w->shape[0] * dl__receptive(w);
}

static void dl__fill_uniform(dl_tensor *t, double lo, double hi)
{
    float *x = (float *)t->data;
    int64_t i;
    for (i = 0; i < t->numel; i++)
        x[i] = (float)(lo + (hi - lo) * (double)dl__rng_uniform(t->ctx_->rng));
}

static void dl__fill_normal(dl_tensor *t, double mean, double std)
{
    float *x = (float *)t->data;
    int64_t i;
    for (i = 0; i < t->numel; i++)
        x[i] = (float)(mean + std * (double)dl__rng_normal(t->ctx_->rng));
}

void dl_init_uniform(dl_tensor *t, float lo, float hi)
{
    if (dl__init_ok("dl_init_uniform", t)) dl__fill_uniform(t, lo, hi);
}

void dl_init_normal(dl_tensor *t, float mean, float std)
{
    if (dl__init_ok("dl_init_normal", t)) dl__fill_normal(t, mean, std);
}

void dl_init_constant(dl_tensor *t, float v)
{
    if (dl__init_ok("dl_init_constant", t)) dl__K(t)->fill(t->ctx_, (float *)t->data, t->numel, v);
}

/* fan_in and fan_out, or false with an error for tensors with < 2 dims */
static bool dl__fans(const char *fn, dl_tensor *t, double *fin, double *fout)
{
    if (!dl__init_ok(fn, t)) return false;
    if (t->ndim < 2) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "%s: t %s has fewer than 2 dims, so fan_in and fan_out "
                "are undefined (fan_in = shape[1]*prod(shape[2:]))", fn, dl__sh(t));
        return false;
    }
    *fin = (double)dl_fan_in(t);
    *fout = (double)dl_fan_out(t);
    return t->numel > 0;      /* zero-element tensors: nothing to do, as PyTorch */
}

void dl_init_kaiming_uniform(dl_tensor *t, float a)
{
    double fin, fout, gain, bound;
    if (!dl__fans("dl_init_kaiming_uniform", t, &fin, &fout)) return;
    gain = sqrt(2.0 / (1.0 + (double)a * (double)a));
    bound = sqrt(3.0) * gain / sqrt(fin);
    dl__fill_uniform(t, -bound, bound);
}

void dl_init_kaiming_normal(dl_tensor *t, float a)
{
    double fin, fout, gain;
    if (!dl__fans("dl_init_kaiming_normal", t, &fin, &fout)) return;
    gain = sqrt(2.0 / (1.0 + (double)a * (double)a));
    dl__fill_normal(t, 0.0, gain / sqrt(fin));
}

void dl_init_xavier_uniform(dl_tensor *t, float gain)
{
    double fin, fout, bound;
    if (!dl__fans("dl_init_xavier_uniform", t, &fin, &fout)) return;
    bound = (double)gain * sqrt(6.0 / (fin + fout));
    dl__fill_uniform(t, -bound, bound);
}

void dl_init_xavier_normal(dl_tensor *t, float gain)
{
    double fin, fout;
    if (!dl__fans("dl_init_xavier_normal", t, &fin, &fout)) return;
    dl__fill_normal(t, 0.0, (double)gain * sqrt(2.0 / (fin + fout)));
}

// >>section nn: built-in modules
typedef struct dl__linear { int64_t in, out; dl_tensor *w, *b; } dl__linear;

/* x (*,in)  w (out,in)  b (out)  ->  y (*,out) = x w^T + b */
static dl_tensor *dl__linear_fwd(dl_module *m, dl_tensor *x)
{
    dl__linear *s = (dl__linear *)m->state;
    dl_tensor *y;
    if (x->ndim < 1 || x->shape[x->ndim - 1] != s->in) {
        dl__err(m->ctx, DL_ERR_SHAPE, "Linear(%lld, %lld): x %s: the last dim must equal "
                "in_features=%lld (weight %s)", (long long)s->in, (long long)s->out, dl__sh(x),
                (long long)s->in, dl__sh(s->w));
        return NULL;
    }
    y = dl_matmul(x, dl_transpose(s->w, 0, 1));
    if (s->b) y = dl_add(y, s->b);
    return y;
}

dl_module *dl_nn_linear(dl_ctx *ctx, int64_t in, int64_t out, bool bias)
{
    dl_module *m;
    dl__linear *s;
    double bound;
    if (!ctx) return NULL;
    if (in <= 0 || out <= 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_linear: in_features=%lld and out_features=%lld must be "
                "positive", (long long)in, (long long)out);
        return NULL;
    }
    m = dl_module_new(ctx, "Linear", dl__linear_fwd, sizeof(dl__linear));
    if (!m) return NULL;
    s = (dl__linear *)m->state;
    s->in = in;
    s->out = out;
    s->w = dl_module_param(m, "weight", dl_empty(ctx, DL_SHAPE(out, in)));
    if (!s->w) return NULL;
    dl_init_kaiming_uniform(s->w, 2.2360679774997896f);   /* a = sqrt(5): U(+-1/sqrt(in)) */
    if (bias) {
        s->b = dl_module_param(m, "bias", dl_empty(ctx, DL_SHAPE(out)));
        if (!s->b) return NULL;
        bound = 1.0 / sqrt((double)in);
        dl__fill_uniform(s->b, -bound, bound);
    }
    return m;
}

static dl_tensor *dl__seq_fwd(dl_module *m, dl_tensor *x)
{
    int i;
    for (i = 0; i < m->nc && x; i++) x = dl_module_forward(m->cs[i].m, x);
    return x;
}

dl_module *dl_nn_sequential(dl_ctx *ctx, int n, dl_module *const *mods)
{
    dl_module *m;
    int i;
    char name[24];
    if (!ctx) return NULL;
    if (n < 0 || (n > 0 && !mods)) {
        dl__err(ctx, DL_ERR_ARG, "dl_nn_sequential: n=%d modules%s", n, mods ? "" : " but mods is NULL");
        return NULL;
    }
    for (i = 0; i < n; i++) if (!mods[i]) return NULL;   /* a constructor failed: reported */
    m = dl_module_new(ctx, "Sequential", dl__seq_fwd, 0);
    if (!m) return NULL;
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%d", i);
        if (!dl_module_add(m, name, mods[i])) return NULL;
    }
    return m;
}

static dl_tensor *dl__relu_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_relu(x); }
static dl_tensor *dl__sigmoid_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_sigmoid(x); }
static dl_tensor *dl__tanh_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_tanh(x); }
static dl_tensor *dl__gelu_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_gelu(x); }
static dl_tensor *dl__flatten_fwd(dl_module *m, dl_tensor *x) { (void)m; return dl_flatten(x, 1, -1); }
dl_module *dl_nn_relu(dl_ctx *ctx) { return dl_module_new(ctx, "ReLU", dl__relu_fwd, 0); }
dl_module *dl_nn_sigmoid(dl_ctx *ctx) { return dl_module_new(ctx, "Sigmoid", dl__sigmoid_fwd, 0); }
dl_module *dl_nn_tanh(dl_ctx *ctx) { return dl_module_new(ctx, "Tanh", dl__tanh_fwd, 0); }
dl_module *dl_nn_gelu(dl_ctx *ctx) { return dl_module_new(ctx, "GELU", dl__gelu_fwd, 0); }
dl_module *dl_nn_flatten(dl_ctx *ctx) { return dl_module_new(ctx, "Flatten", dl__flatten_fwd, 0); }

// >>section optim
/* Optimizer kernels work on raw float arrays, one element at a time, in the
   order of PyTorch's single-tensor code so that results match it to the last
   bit where the inputs do. A CUDA build supplies the same table. */

typedef struct dl__sgd_args {
    float lr, momentum, one_m_dampening, wd;
    bool nesterov, first;             /* first: no momentum buffer yet (buf = d_p) */
} dl__sgd_args;

typedef struct dl__adam_args {
    float wd;                         /* Adam: grad += wd * p */
    float decay;                      /* AdamW: p *= decay (1 - lr*wd); 1 for Adam */
    float beta1, one_m_beta1, beta2, one_m_beta2, bc2_sqrt, eps, neg_step_size;
    bool amsgrad;
} dl__adam_args;

typedef struct dl__optim_kernels {
    const char *name;
    void (*sgd)(dl_ctx *c, float *p, const float *g, float *buf, int64_t n, const dl__sgd_args *a);
    void (*adam)(dl_ctx *c, float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                 const dl__adam_args *a);
    double (*sumsq)(dl_ctx *c, const float *x, int64_t n);
    void (*scale)(dl_ctx *c, float *x, int64_t n, float s);
} dl__optim_kernels;

/* d_p = g (+ wd*p); buf = d_p (first) or momentum*buf + (1-dampening)*d_p;
   d_p = nesterov ? d_p + momentum*buf : buf;  p += -lr * d_p */
static void dl__cpu_sgd(dl_ctx *c, float *p, const float *g, float *buf, int64_t n,
                        const dl__sgd_args *a)
{
    int64_t i;
    float neg_lr = -a->lr;
    (void)c;
    for (i = 0; i < n; i++) {
        float d = g[i];
        if (a->wd != 0.0f) d = d + a->wd * p[i];
        if (a->momentum != 0.0f) {
            float b = a->first ? d : buf[i] * a->momentum + a->one_m_dampening * d;
            buf[i] = b;
            d = a->nesterov ? d + a->momentum * b : b;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

/* (AdamW: p *= 1-lr*wd)  g' = g (+ wd*p for Adam);  m = beta1*m + (1-beta1)*g';
   v = beta2*v + (1-beta2)*g'*g';  vmax = max(vmax, v) (amsgrad);
   p += -step_size * m / (sqrt(v or vmax)/sqrt(bc2) + eps),  step_size = lr/bc1 */
static void dl__cpu_adam(dl_ctx *c, float *p, const float *g, float *m, float *v, float *vmax,
                         int64_t n, const dl__adam_args *a)
{
    int64_t i;
    (void)c;
    for (i = 0; i < n; i++) {
        float gi = g[i], pi = p[i], denom, vv;
        if (a->decay != 1.0f) pi = pi * a->decay;
        if (a->wd != 0.0f) gi = gi + a->wd * pi;
        m[i] = m[i] * a->beta1 + a->one_m_beta1 * gi;
        v[i] = v[i] * a->beta2 + a->one_m_beta2 * gi * gi;
        vv = v[i];
        if (a->amsgrad) {
            if (!(vmax[i] >= vv)) vmax[i] = vv;     /* torch.maximum: NaN propagates */
            vv = vmax[i];
        }
        denom = sqrtf(vv) / a->bc2_sqrt + a->eps;
        p[i] = pi + a->neg_step_size * m[i] / denom;
    }
}

static double dl__cpu_sumsq(dl_ctx *c, const float *x, int64_t n)
{
    double s = 0;
    int64_t i;
    (void)c;
    for (i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static void dl__cpu_scale(dl_ctx *c, float *x, int64_t n, float s)
{
    int64_t i;
    (void)c;
    for (i = 0; i < n; i++) x[i] = x[i] * s;
}

static const dl__optim_kernels dl__cpu_optim_kernels = {
    "cpu", dl__cpu_sgd, dl__cpu_adam, dl__cpu_sumsq, dl__cpu_scale
};

static const dl__optim_kernels *dl__optim_K(const dl_tensor *t)
{
    (void)t;   /* the CUDA build routes device tensors to its own table here */
    return &dl__cpu_optim_kernels;
}

enum { DL__OPT_SGD = 0, DL__OPT_ADAM, DL__OPT_ADAMW };
static const char *const dl__opt_names[] = {"sgd", "adam", "adamw"};
#define DL__OPT_MAGIC 0x444c4f50u

struct dl_optim {
    uint32_t magic;
    dl_ctx *ctx;
    int kind;
    dl_sgd_desc sgd;
    dl_adam_desc adam;
    float lr;
    int64_t steps;
    int n;
    dl_tensor **p;                    /* parameters (de-duplicated) */
    dl_tensor **s[3];                 /* momentum_buffer | exp_avg, exp_avg_sq, max_exp_avg_sq */
    int64_t *pstep;                   /* per-parameter step count (PyTorch state['step']) */
};

static const char *const dl__sgd_state[] = {"momentum_buffer"};
static const char *const dl__adam_state[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

/* number of state tensors per parameter, and their names */
static int dl__opt_nstate(const dl_optim *o, const char *const **names)
{
    if (o->kind == DL__OPT_SGD) { *names = dl__sgd_state; return o->sgd.momentum != 0.0f ? 1 : 0; }
    *names = dl__adam_state;
    return o->adam.amsgrad ? 3 : 2;
}

static void dl__optim_destroy(void *p)
{
    dl_optim *o = (dl_optim *)p;
    int k, i;
    o->magic = 0;
    for (k = 0; k < 3; k++) {
        if (!o->s[k]) continue;
        for (i = 0; i < o->n; i++) dl_free(o->s[k][i]);
        DL_FREE(o->s[k]);
    }
    DL_FREE(o->p);
    DL_FREE(o->pstep);
    DL_FREE(o);
}

static bool dl__optim_ok(const dl_optim *o) { return o && o->magic == DL__OPT_MAGIC; }

static dl_optim *dl__optim_make(dl_ctx *ctx, const char *fn, int kind, int n,
                                dl_tensor *const *params, const dl_sgd_desc *sd,
                                const dl_adam_desc *ad)
{
    dl_optim *o;
    int i, j, k, ns;
    const char *const *snames;
    if (n <= 0 || !params) {
        dl__err(ctx, DL_ERR_ARG, "%s: got an empty parameter list", fn);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        dl_tensor *t = params[i];
        if (!t) { dl__err(ctx, DL_ERR_ARG, "%s: params[%d] is NULL", fn, i); return NULL; }
        if (!dl__live(fn, "a parameter", t)) return NULL;
        if (t->ctx_ != ctx) { dl__err(ctx, DL_ERR_ARG, "%s: params[%d] belongs to another context", fn, i); return NULL; }
        if (t->step_ != 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: params[%d] %s is a step tensor; optimizer parameters must "
                    "be persistent (dl_keep, dl_module_param)", fn, i, dl__sh(t));
            return NULL;
        }
        if (!dl__f32(fn, "a parameter", t)) return NULL;
        if (t->node_) {
            dl__err(ctx, DL_ERR_ARG, "%s: params[%d] %s is not a leaf", fn, i, dl__sh(t));
            return NULL;
        }
    }
    if (kind == DL__OPT_SGD) {
        if (!sd || !(sd->lr > 0.0f) || !(sd->momentum >= 0.0f) || !(sd->weight_decay >= 0.0f) ||
            (sd->nesterov && (sd->momentum <= 0.0f || sd->dampening != 0.0f))) {
            dl__err(ctx, DL_ERR_ARG, "%s: invalid dl_sgd_desc%s: lr must be > 0, momentum and "
                    "weight_decay >= 0, nesterov needs momentum > 0 and dampening 0", fn,
                    sd ? "" : " (NULL; lr is required)");
            return NULL;
        }
    } else {
        if (!(ad->lr >= 0.0f) || !(ad->eps >= 0.0f) || !(ad->beta1 >= 0.0f && ad->beta1 < 1.0f) ||
            !(ad->beta2 >= 0.0f && ad->beta2 < 1.0f) || !(ad->weight_decay >= 0.0f)) {
            dl__err(ctx, DL_ERR_ARG, "%s: invalid dl_adam_desc: lr %g, betas (%g, %g), eps %g, "
                    "weight_decay %g: need lr >= 0, 0 <= beta < 1, eps >= 0, weight_decay >= 0 "
                    "(start from dl_adam_desc_default())", fn, (double)ad->lr, (double)ad->beta1,
                    (double)ad->beta2, (double)ad->eps, (double)ad->weight_decay);
            return NULL;
        }
    }
    o = (dl_optim *)dl__malloc(ctx, sizeof(dl_optim));
    if (!o) goto oom;
    memset(o, 0, sizeof *o);
    o->ctx = ctx;
    o->kind = kind;
    if (sd) o->sgd = *sd;
    if (ad) o->adam = *ad;
    o->lr = kind == DL__OPT_SGD ? sd->lr : ad->lr;
    o->p = (dl_tensor **)dl__malloc(ctx, sizeof(dl_tensor *) * (size_t)n);
    o->pstep = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)n);
    if (!o->p || !o->pstep) goto oom_o;
    for (i = 0; i < n; i++) {           /* de-duplicate, keeping the first */
        for (j = 0; j < o->n; j++) if (o->p[j] == params[i]) break;
        if (j == o->n) { o->pstep[o->n] = 0; o->p[o->n++] = params[i]; }
    }
    ns = dl__opt_nstate(o, &snames);
    for (k = 0; k < ns; k++) {
        o->s[k] = (dl_tensor **)dl__malloc(ctx, sizeof(dl_tensor *) * (size_t)o->n);
        if (!o->s[k]) goto oom_o;
        memset(o->s[k], 0, sizeof(dl_tensor *) * (size_t)o->n);
        for (i = 0; i < o->n; i++) {
            dl_tensor *t = o->p[i];
            o->s[k][i] = dl__make(ctx, fn, DL_DTYPE_F32, t->ndim, t->shape, true, NULL);
            if (!o->s[k][i]) { dl__optim_destroy(o); return NULL; }
            dl_set_name(o->s[k][i], snames[k]);
            dl__K(t)->fill(ctx, (float *)o->s[k][i]->data, t->numel, 0.0f);
        }
    }
    o->magic = DL__OPT_MAGIC;
    if (!dl__own(ctx, dl__optim_destroy, o)) { dl__optim_destroy(o); return NULL; }
    return o;
oom_o:
    dl__optim_destroy(o);
oom:
    dl__err(ctx, DL_ERR_OOM, "%s: out of memory", fn);
    return NULL;
}

static dl_optim *dl__optim_mod(dl_module *m, const char *fn, int kind, const dl_sgd_desc *sd,
                               const dl_adam_desc *ad)
{
    int n;
    if (!dl__mod_ok(m)) return NULL;
    n = dl__mod_params(m);
    if (n < 0) return NULL;
    if (n == 0) {
        dl__err(m->ctx, DL_ERR_ARG, "%s: module %s has no parameters", fn, m->type);
        return NULL;
    }
    return dl__optim_make(m->ctx, fn, kind, n, m->scratch, sd, ad);
}

dl_adam_desc dl_adam_desc_default(void)
{
    dl_adam_desc d;
    memset(&d, 0, sizeof d);
    d.lr = 1e-3f;
    d.beta1 = 0.9f;
    d.beta2 = 0.999f;
    d.eps = 1e-8f;
    return d;
}

dl_optim *dl_sgd(dl_module *m, const dl_sgd_desc *d) { return dl__optim_mod(m, "dl_sgd", DL__OPT_SGD, d, NULL); }

dl_optim *dl_adam(dl_module *m, const dl_adam_desc *d)
{
    dl_adam_desc def = dl_adam_desc_default();
    return dl__optim_mod(m, "dl_adam", DL__OPT_ADAM, NULL, d ? d : &def);
}

dl_optim *dl_adamw(dl_module *m, const dl_adam_desc *d)
{
    dl_adam_desc def = dl_adam_desc_default();
    return dl__optim_mod(m, "dl_adamw", DL__OPT_ADAMW, NULL, d ? d : &def);
}

dl_optim *dl_sgd_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_sgd_desc *d)
{
    if (!ctx) return NULL;
    return dl__optim_make(ctx, "dl_sgd_params", DL__OPT_SGD, n, params, d, NULL);
}

dl_optim *dl_adam_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d)
{
    dl_adam_desc def = dl_adam_desc_default();
    if (!ctx) return NULL;
    return dl__optim_make(ctx, "dl_adam_params", DL__OPT_ADAM, n, params, NULL, d ? d : &def);
}

dl_optim *dl_adamw_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d)
{
    dl_adam_desc def = dl_adam_desc_default();
    if (!ctx) return NULL;
    return dl__optim_make(ctx, "dl_adamw_params", DL__OPT_ADAMW, n, params, NULL, d ? d : &def);
}

dl_result dl_optim_step(dl_optim *o)
{
    int i;
    dl_ctx *ctx;
    if (!dl__optim_ok(o)) return DL_ERR_ARG;
    ctx = o->ctx;
    /* check everything first: a step is all or nothing */
    for (i = 0; i < o->n; i++) {
        dl_tensor *p = o->p[i];
        if (!dl__live("dl_optim_step", "a parameter", p)) return DL_ERR_ARG;
        if (p->grad && (p->grad->magic_ != DL__MAGIC || !dl_same_shape(p->grad, p) ||
                        p->grad->dtype != DL_DTYPE_F32)) {
            dl__err(ctx, DL_ERR_SHAPE, "dl_optim_step: parameter %d %s has a gradient of another "
                    "shape or dtype", i, dl__sh(p));
            return DL_ERR_SHAPE;
        }
    }
    for (i = 0; i < o->n; i++) {
        dl_tensor *p = o->p[i];
        const float *g;
        if (!p->grad) continue;      /* no gradient: skipped, as PyTorch */
        g = (const float *)p->grad->data;
        if (o->kind == DL__OPT_SGD) {
            dl__sgd_args a;
            a.lr = o->lr;
            a.momentum = o->sgd.momentum;
            a.one_m_dampening = (float)(1.0 - (double)o->sgd.dampening);
            a.wd = o->sgd.weight_decay;
            a.nesterov = o->sgd.nesterov;
            a.first = o->pstep[i] == 0;
            dl__optim_K(p)->sgd(ctx, (float *)p->data, g, o->s[0] ? (float *)o->s[0][i]->data : NULL,
                                p->numel, &a);
        } else {
            dl__adam_args a;
            double step = (double)(o->pstep[i] + 1);
            double b1 = o->adam.beta1, b2 = o->adam.beta2;
            double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
            bool decoupled = o->kind == DL__OPT_ADAMW;
            a.wd = decoupled ? 0.0f : o->adam.weight_decay;
            a.decay = decoupled ? (float)(1.0 - (double)o->lr * (double)o->adam.weight_decay) : 1.0f;
            a.beta1 = o->adam.beta1;
            a.one_m_beta1 = (float)(1.0 - b1);
            a.beta2 = o->adam.beta2;
            a.one_m_beta2 = (float)(1.0 - b2);
            a.bc2_sqrt = (float)sqrt(bc2);
            a.eps = o->adam.eps;
            a.neg_step_size = (float)(-((double)o->lr / bc1));
            a.amsgrad = o->adam.amsgrad;
            dl__optim_K(p)->adam(ctx, (float *)p->data, g, (float *)o->s[0][i]->data,
                                 (float *)o->s[1][i]->data,
                                 o->adam.amsgrad ? (float *)o->s[2][i]->data : NULL, p->numel, &a);
        }
        o->pstep[i]++;
    }
    o->steps++;
    return DL_OK;
}

void dl_optim_zero_grad(dl_optim *o)
{
    int i;
    if (!dl__optim_ok(o)) return;
    for (i = 0; i < o->n; i++) dl_zero_grad(o->p[i]);
}

void dl_optim_set_lr(dl_optim *o, float lr) { if (dl__optim_ok(o)) o->lr = lr; }
float dl_optim_lr(const dl_optim *o) { return dl__optim_ok(o) ? o->lr : 0.0f; }
int64_t dl_optim_steps(const dl_optim *o) { return dl__optim_ok(o) ? o->steps : 0; }
void dl_optim_free(dl_optim *o) { if (dl__optim_ok(o)) dl__disown(o->ctx, o); }

// >>section optim: schedules and clipping
float dl_lr_step(float base, int64_t epoch, int64_t step_size, float gamma)
{
    if (step_size <= 0 || epoch < 0) return base;
    return (float)((double)base * pow((double)gamma, (double)(epoch / step_size)));
}

float dl_lr_cosine(float base, int64_t t, int64_t t_max, float eta_min)
{
    const double pi = 3.14159265358979323846;
    if (t_max <= 0) return base;
    return (float)((double)eta_min + ((double)base - (double)eta_min) *
                   (1.0 + cos(pi * (double)t / (double)t_max)) / 2.0);
}

float dl_lr_warmup(float base, int64_t t, int64_t warmup)
{
    if (warmup <= 1 || t + 1 >= warmup) return base;
    if (t < 0) t = 0;
    return (float)((double)base * (double)(t + 1) / (double)warmup);
}

float dl_clip_grad_norm(dl_module *m, float max_norm)
{
    int n, i;
    double total = 0;
    if (!dl__mod_ok(m)) return 0.0f;
    n = dl__mod_params(m);
    for (i = 0; i < n; i++) {
        dl_tensor *p = m->scratch[i];
        double norm;
        if (!p->grad) continue;
        norm = sqrt(dl__optim_K(p)->sumsq(m->ctx, (const float *)p->grad->data, p->numel));
        /* torch: norm of the per-tensor float32 norms */
        norm = (double)(float)norm;
        total += norm * norm;
    }
    {
        /* as torch (float32 tensors): coef = max_norm / (total + 1e-6), clamped to 1 */
        float tot = (float)sqrt(total), c = max_norm / (tot + 1e-6f);
        if (c < 1.0f)
            for (i = 0; i < n; i++) {
                dl_tensor *p = m->scratch[i];
                if (p->grad) dl__optim_K(p)->scale(m->ctx, (float *)p->grad->data, p->numel, c);
            }
        total = tot;
    }
    return (float)total;
}

// >>section io: safetensors
/* A checkpoint is a safetensors file (see nn_decl.h). The loader reads the
   whole file, parses the JSON header with the small strict parser below
   (depth-limited; every length and offset checked against the buffer), checks
   every tensor the module and optimizer expect, and only then copies data in:
   a failed load changes nothing. */

#define DL__ST_MAX_HEADER 100000000u   /* safetensors' own limit */
#define DL__JSON_DEPTH 32

enum { DL__J_NULL, DL__J_BOOL, DL__J_NUM, DL__J_STR, DL__J_ARR, DL__J_OBJ };

typedef struct dl__jv {
    int type;
    int first, next;                  /* children (arrays, objects); sibling; -1 none */
    const char *key;                  /* object members: decoded key */
    size_t klen;
    const char *s;                    /* strings: decoded, NUL-terminated */
    size_t slen;
    bool is_int;                      /* numbers: an integer that fits int64 */
    int64_t ival;
} dl__jv;

typedef struct dl__json {
    const unsigned char *p, *start, *end;
    char *sb;                         /* decoded strings */
    size_t sbn, sbcap;
    dl__jv *v;
    int nv, cap;
    const char *err;                  /* what went wrong */
    size_t errpos;
} dl__json;

static int dl__jfail(dl__json *j, const char *what)
{
    if (!j->err) { j->err = what; j->errpos = (size_t)(j->p - j->start); }
    return -1;
}

static void dl__jws(dl__json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int dl__jnew(dl__json *j, int type)
{
    dl__jv *v;
    if (j->nv == j->cap) {
        int nc = j->cap ? j->cap * 2 : 64;
        dl__jv *nvp;
        if (nc > 1 << 26) return dl__jfail(j, "too many JSON values");
        nvp = (dl__jv *)DL_REALLOC(j->v, sizeof(dl__jv) * (size_t)nc);
        if (!nvp) return dl__jfail(j, "out of memory");
        j->v = nvp;
        j->cap = nc;
    }
    v = &j->v[j->nv];
    memset(v, 0, sizeof *v);
    v->type = type;
    v->first = v->next = -1;
    return j->nv++;
}

static int dl__jhex(const unsigned char *p)
{
    int i, r = 0;
    for (i = 0; i < 4; i++) {
        int c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        r = r * 16 + d;
    }
    return r;
}

/* A string at j->p (the opening quote); decoded into j->sb. */
static bool dl__jstr(dl__json *j, const char **out, size_t *len)
{
    char *d = j->sb + j->sbn, *d0 = d;
    j->p++;
    for (;;) {
        unsigned c;
        if (j->p >= j->end) { dl__jfail(j, "unterminated string"); return false; }
        c = *j->p;
        if (c == '"') { j->p++; break; }
        if (c < 0x20) { dl__jfail(j, "control character in a string"); return false; }
        if (c != '\\') { *d++ = (char)c; j->p++; continue; }
        if (j->end - j->p < 2) { dl__jfail(j, "unterminated escape"); return false; }
        c = j->p[1];
        j->p += 2;
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '/': *d++ = '/'; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'u': {
            long cp;
            int h;
            if (j->end - j->p < 4 || (h = dl__jhex(j->p)) < 0) { dl__jfail(j, "bad \\u escape"); return false; }
            j->p += 4;
            cp = h;
            if (cp >= 0xDC00 && cp <= 0xDFFF) { dl__jfail(j, "lone low surrogate in \\u escape"); return false; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo;
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' ||
                    (lo = dl__jhex(j->p + 2)) < 0xDC00 || lo > 0xDFFF) {
                    dl__jfail(j, "unpaired high surrogate in \\u escape");
                    return false;
                }
                j->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) { dl__jfail(j, "\\u0000 in a string"); return false; }
            if (cp < 0x80) *d++ = (char)cp;
            else if (cp < 0x800) { *d++ = (char)(0xC0 | (cp >> 6)); *d++ = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *d++ = (char)(0xE0 | (cp >> 12)); *d++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *d++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *d++ = (char)(0xF0 | (cp >> 18)); *d++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *d++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *d++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: dl__jfail(j, "bad escape in a string"); return false;
        }
    }
    /* decoded text is never longer than its encoding (quotes make room for the NUL) */
    *d++ = 0;
    *out = d0;
    *len = (size_t)(d - d0) - 1;
    j->sbn += (size_t)(d - d0);
    return true;
}

static int dl__jvalue(dl__json *j, int depth);

static int dl__jnumber(dl__json *j)
{
    const unsigned char *q = j->p;
    bool neg = false, isint = true, ovf = false;
    uint64_t u = 0;
    int k;
    if (q < j->end && *q == '-') { neg = true; q++; }
    if (q >= j->end || *q < '0' || *q > '9') return dl__jfail(j, "bad number");
    if (*q == '0') q++;
    else
        while (q < j->end && *q >= '0' && *q <= '9') {
            unsigned dgt = (unsigned)(*q - '0');
            if (u > (UINT64_MAX - dgt) / 10) ovf = true;
            else u = u * 10 + dgt;
            q++;
        }
    if (q < j->end && *q == '.') {
        isint = false;
        q++;
        if (q >= j->end || *q < '0' || *q > '9') return dl__jfail(j, "bad number (digits after '.')");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        isint = false;
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') return dl__jfail(j, "bad number (exponent)");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    k = dl__jnew(j, DL__J_NUM);
    if (k < 0) return -1;
    j->p = q;
    if (isint && !ovf && u <= (uint64_t)INT64_MAX) {
        j->v[k].is_int = true;
        j->v[k].ival = neg ? -(int64_t)u : (int64_t)u;
    }
    return k;
}

static int dl__jlit(dl__json *j, const char *lit, int type)
{
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) return dl__jfail(j, "unexpected character");
    j->p += n;
    return dl__jnew(j, type);
}

static int dl__jcontainer(dl__json *j, int depth, bool obj)
{
    int k = dl__jnew(j, obj ? DL__J_OBJ : DL__J_ARR), last = -1;
    if (k < 0) return -1;
    j->p++;
    dl__jws(j);
    if (j->p < j->end && *j->p == (obj ? '}' : ']')) { j->p++; return k; }
    for (;;) {
        const char *key = NULL;
        size_t klen = 0;
        int c;
        dl__jws(j);
        if (obj) {
            if (j->p >= j->end || *j->p != '"') return dl__jfail(j, "expected a string key");
            if (!dl__jstr(j, &key, &klen)) return -1;
            dl__jws(j);
            if (j->p >= j->end || *j->p != ':') return dl__jfail(j, "expected ':'");
            j->p++;
        }
        c = dl__jvalue(j, depth + 1);
        if (c < 0) return -1;
        j->v[c].key = key;
        j->v[c].klen = klen;
        if (last < 0) j->v[k].first = c;
        else j->v[last].next = c;
        last = c;
        dl__jws(j);
        if (j->p >= j->end) return dl__jfail(j, obj ? "unterminated object" : "unterminated array");
        if (*j->p == ',') { j->p++; continue; }
        if (*j->p == (obj ? '}' : ']')) { j->p++; return k; }
        return dl__jfail(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int dl__jvalue(dl__json *j, int depth)
{
    dl__jws(j);
    if (depth > DL__JSON_DEPTH) return dl__jfail(j, "JSON nested too deeply");
    if (j->p >= j->end) return dl__jfail(j, "unexpected end of header");
    switch (*j->p) {
    case '{': return dl__jcontainer(j, depth, true);
    case '[': return dl__jcontainer(j, depth, false);
    case '"': {
        const char *s;
        size_t n;
        int k;
        if (!dl__jstr(j, &s, &n)) return -1;
        k = dl__jnew(j, DL__J_STR);
        if (k < 0) return -1;
        j->v[k].s = s;
        j->v[k].slen = n;
        return k;
    }
    case 't': return dl__jlit(j, "true", DL__J_BOOL);
    case 'f': return dl__jlit(j, "false", DL__J_BOOL);
    case 'n': return dl__jlit(j, "null", DL__J_NULL);
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return dl__jnumber(j);
        return dl__jfail(j, "unexpected character (expected a value)");
    }
}

/* ---- checkpoint entries */

typedef struct dl__st_entry {
    const char *name;                 /* decoded (points into the parser's buffer) */
    dl_dtype dtype;
    bool dtype_known;
    const char *dtype_str;
    int ndim;
    int64_t shape[DL_MAX_DIMS];
    uint64_t begin, end;
    bool used;
} dl__st_entry;

static bool dl__st_dtype(const char *s, dl_dtype *dt)
{
    if (strcmp(s, "F32") == 0) { *dt = DL_DTYPE_F32; return true; }
    if (strcmp(s, "I64") == 0) { *dt = DL_DTYPE_I64; return true; }
    if (strcmp(s, "I32") == 0) { *dt = DL_DTYPE_I32; return true; }
    return false;
}

static const char *dl__st_dtype_name(dl_dtype dt)
{
    return dt == DL_DTYPE_F32 ? "F32" : dt == DL_DTYPE_I64 ? "I64" : "I32";
}

static bool dl__little_endian(void)
{
    uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* what the loader expects: a module tensor, or an optimizer int64 scalar / state tensor */
typedef struct dl__st_want {
    char name[192];
    dl_tensor *t;                     /* tensor to fill, or NULL for an int64 scalar */
    int64_t *scalar;                  /* where an I64 scalar goes */
    dl__st_entry *found;
} dl__st_want;

/* optimizer parameter i's name: its state_dict name in m, else "param<i>" */
static void dl__opt_pname(dl_optim *o, int i, int nmod, dl_tensor **mt, char (*mn)[128],
                          char *out, size_t n)
{
    int j;
    for (j = 0; j < nmod; j++)
        if (mt[j] == o->p[i]) { snprintf(out, n, "%s", mn[j]); return; }
    snprintf(out, n, "param%d", i);
}

/* The list of names (and targets) that a checkpoint of m (+o) holds. */
static dl__st_want *dl__st_wants(dl_module *m, dl_optim *o, int *count, int64_t *steps_slot)
{
    dl_ctx *ctx = m->ctx;
    int nmod = dl_module_named_tensors(m, false, 0, NULL, NULL), n, i, k, ns = 0, w = 0;
    const char *const *sn = NULL;
    dl_tensor **mt;
    char (*mn)[128];
    dl__st_want *ws;
    char pn[128];
    if (o) ns = dl__opt_nstate(o, &sn);
    n = nmod + (o ? 1 + o->n * (1 + ns) : 0);
    mt = (dl_tensor **)dl__malloc(ctx, sizeof(dl_tensor *) * (size_t)(nmod + 1));
    mn = (char (*)[128])dl__malloc(ctx, 128 * (size_t)(nmod + 1));
    ws = (dl__st_want *)dl__malloc(ctx, sizeof(dl__st_want) * (size_t)(n + 1));
    if (!mt || !mn || !ws) {
        DL_FREE(mt); DL_FREE(mn); DL_FREE(ws);
        return NULL;
    }
    memset(ws, 0, sizeof(dl__st_want) * (size_t)(n + 1));
    dl_module_named_tensors(m, false, nmod, mt, mn);
    for (i = 0; i < nmod; i++) {
        snprintf(ws[w].name, sizeof ws[w].name, "%s", mn[i]);
        ws[w++].t = mt[i];
    }
    if (o) {
        snprintf(ws[w].name, sizeof ws[w].name, "optim.step");
        ws[w++].scalar = steps_slot;
        for (i = 0; i < o->n; i++) {
            dl__opt_pname(o, i, nmod, mt, mn, pn, sizeof pn);
            snprintf(ws[w].name, sizeof ws[w].name, "optim.%s.step", pn);
            ws[w++].scalar = &o->pstep[i];
            for (k = 0; k < ns; k++) {
                snprintf(ws[w].name, sizeof ws[w].name, "optim.%s.%s", pn, sn[k]);
                ws[w++].t = o->s[k][i];
            }
        }
    }
    DL_FREE(mt);
    DL_FREE(mn);
    *count = w;
    return ws;
}

/* ---- writing */

typedef struct dl__sb { char *s; size_t n, cap; bool oom; } dl__sb;

static void dl__sb_put(dl__sb *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        char *p;
        while (nc < b->n + n + 1) nc *= 2;
        p = (char *)DL_REALLOC(b->s, nc);
        if (!p) { b->oom = true; return; }
        b->s = p;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void dl__sb_str(dl__sb *b, const char *s) { dl__sb_put(b, s, strlen(s)); }

static void dl__sb_json(dl__sb *b, const char *s)   /* a JSON string literal */
{
    char e[8];
    dl__sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; dl__sb_put(b, e, 2); }
        else if (c < 0x20) { snprintf(e, sizeof e, "\\u%04x", c); dl__sb_put(b, e, 6); }
        else dl__sb_put(b, s, 1);
    }
    dl__sb_put(b, "\"", 1);
}

static void dl__sb_meta(dl__sb *b, const char *key, const char *val)
{
    dl__sb_str(b, ",");
    dl__sb_json(b, key);
    dl__sb_str(b, ":");
    dl__sb_json(b, val);
}

static void dl__sb_metaf(dl__sb *b, const char *key, double v)
{
    char t[40];
    snprintf(t, sizeof t, "%.9g", v);
    dl__sb_meta(b, key, t);
}

static void dl__put_le64(unsigned char *d, uint64_t v)
{
    int i;
    for (i = 0; i < 8; i++) d[i] = (unsigned char)(v >> (8 * i));
}

static bool dl__write_le(FILE *f, const void *data, size_t esize, int64_t numel)
{
    if (numel == 0) return true;
    if (dl__little_endian()) return fwrite(data, esize, (size_t)numel, f) == (size_t)numel;
    {
        const unsigned char *s = (const unsigned char *)data;
        unsigned char tmp[8];
        int64_t i;
        size_t k;
        for (i = 0; i < numel; i++) {
            for (k = 0; k < esize; k++) tmp[k] = s[(size_t)i * esize + esize - 1 - k];
            if (fwrite(tmp, 1, esize, f) != esize) return false;
        }
    }
    return true;
}

dl_result dl_save(const char *path, dl_module *m, dl_optim *o)
{
    dl_ctx *ctx;
    dl__st_want *ws;
    int n, i, k;
    int64_t steps;
    uint64_t off = 0;
    dl__sb b;
    char *tmp = NULL;
    FILE *f = NULL;
    unsigned char len8[8];
    char num[64];
    bool ok;
    if (!dl__mod_ok(m)) return DL_ERR_ARG;
    ctx = m->ctx;
    if (!path) { dl__err(ctx, DL_ERR_ARG, "dl_save: path is NULL"); return DL_ERR_ARG; }
    if (o && !dl__optim_ok(o)) { dl__err(ctx, DL_ERR_ARG, "dl_save: %s: o is not an optimizer", path); return DL_ERR_ARG; }
    steps = o ? o->steps : 0;
    ws = dl__st_wants(m, o, &n, &steps);
    if (!ws) { dl__err(ctx, DL_ERR_OOM, "dl_save: %s: out of memory", path); return DL_ERR_OOM; }
    for (i = 0; i < n; i++) {
        char db[32];
        dl_tensor *t = ws[i].t;
        if (t && t->device.type != DL_DEVICE_CPU) {
            dl__err(ctx, DL_ERR_DEVICE, "dl_save: %s: tensor '%s' %s is on %s; copy it to the CPU",
                    path, ws[i].name, dl__sh(t), dl__dev_str(t->device, db, sizeof db));
            DL_FREE(ws);
            return DL_ERR_DEVICE;
        }
    }
    /* header */
    memset(&b, 0, sizeof b);
    dl__sb_str(&b, "{");
    for (i = 0; i < n; i++) {
        dl_tensor *t = ws[i].t;
        uint64_t bytes = t ? (uint64_t)t->numel * dl__esize(t->dtype) : 8;
        if (i) dl__sb_str(&b, ",");
        dl__sb_json(&b, ws[i].name);
        dl__sb_str(&b, ":{\"dtype\":\"");
        dl__sb_str(&b, t ? dl__st_dtype_name(t->dtype) : "I64");
        dl__sb_str(&b, "\",\"shape\":[");
        for (k = 0; t && k < t->ndim; k++) {
            snprintf(num, sizeof num, k ? ",%lld" : "%lld", (long long)t->shape[k]);
            dl__sb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + bytes));
        dl__sb_str(&b, num);
        off += bytes;
    }
    dl__sb_str(&b, n ? ",\"__metadata__\":{\"format\":\"pt\"" : "\"__metadata__\":{\"format\":\"pt\"");
    dl__sb_meta(&b, "dl.version", "0.1");
    if (o) {
        dl__sb_meta(&b, "dl.optim", dl__opt_names[o->kind]);
        dl__sb_metaf(&b, "dl.lr", o->lr);
        if (o->kind == DL__OPT_SGD) {
            dl__sb_metaf(&b, "dl.momentum", o->sgd.momentum);
            dl__sb_metaf(&b, "dl.dampening", o->sgd.dampening);
            dl__sb_metaf(&b, "dl.weight_decay", o->sgd.weight_decay);
            dl__sb_meta(&b, "dl.nesterov", o->sgd.nesterov ? "true" : "false");
        } else {
            dl__sb_metaf(&b, "dl.beta1", o->adam.beta1);
            dl__sb_metaf(&b, "dl.beta2", o->adam.beta2);
            dl__sb_metaf(&b, "dl.eps", o->adam.eps);
            dl__sb_metaf(&b, "dl.weight_decay", o->adam.weight_decay);
            dl__sb_meta(&b, "dl.amsgrad", o->adam.amsgrad ? "true" : "false");
        }
    }
    dl__sb_str(&b, "}}");
    while (!b.oom && b.n % 8) dl__sb_str(&b, " ");   /* pad: data starts 8-aligned */
    tmp = (char *)DL_MALLOC(strlen(path) + 5);
    if (b.oom || !tmp) {
        DL_FREE(b.s); DL_FREE(ws); DL_FREE(tmp);
        dl__err(ctx, DL_ERR_OOM, "dl_save: %s: out of memory", path);
        return DL_ERR_OOM;
    }
    memcpy(tmp, path, strlen(path));
    memcpy(tmp + strlen(path), ".tmp", 5);
    f = fopen(tmp, "wb");
    if (!f) {
        dl__err(ctx, DL_ERR_IO, "dl_save: cannot open %s for writing (does the directory exist? "
                "is it writable?)", tmp);
        DL_FREE(b.s); DL_FREE(ws); DL_FREE(tmp);
        return DL_ERR_IO;
    }
    dl__put_le64(len8, (uint64_t)b.n);
    ok = fwrite(len8, 1, 8, f) == 8 && fwrite(b.s, 1, b.n, f) == b.n;
    for (i = 0; i < n && ok; i++) {
        if (ws[i].t) ok = dl__write_le(f, ws[i].t->data, dl__esize(ws[i].t->dtype), ws[i].t->numel);
        else ok = dl__write_le(f, ws[i].scalar, 8, 1);
    }
    ok = ok && fflush(f) == 0 && !ferror(f);
    if (fclose(f) != 0) ok = false;
    DL_FREE(b.s);
    DL_FREE(ws);
    if (!ok) {
        remove(tmp);
        dl__err(ctx, DL_ERR_IO, "dl_save: writing %s failed (disk full?); %s is unchanged", tmp, path);
        DL_FREE(tmp);
        return DL_ERR_IO;
    }
#ifdef _WIN32
    remove(path);                       /* rename does not replace on Windows */
#endif
    if (rename(tmp, path) != 0) {
        remove(tmp);
        dl__err(ctx, DL_ERR_IO, "dl_save: cannot rename %s to %s", tmp, path);
        DL_FREE(tmp);
        return DL_ERR_IO;
    }
    DL_FREE(tmp);
    return DL_OK;
}

/* ---- reading */

static int dl__st_cmp(const void *a, const void *b)
{
    const dl__st_entry *x = *(const dl__st_entry *const *)a, *y = *(const dl__st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int dl__st_cmp_name(const void *a, const void *b)
{
    return strcmp((*(const dl__st_entry *const *)a)->name, (*(const dl__st_entry *const *)b)->name);
}

static const dl__jv *dl__jmember(const dl__json *j, const dl__jv *obj, const char *key)
{
    int c;
    for (c = obj->first; c >= 0; c = j->v[c].next)
        if (strcmp(j->v[c].key, key) == 0) return &j->v[c];
    return NULL;
}

/* Parses and checks one tensor description. false + message in msg. */
static bool dl__st_describe(const dl__json *j, const dl__jv *d, dl__st_entry *e, uint64_t datalen,
                            char *msg, size_t msgn)
{
    const dl__jv *dt, *sh, *of, *x;
    int c, nk = 0;
    uint64_t numel = 1, bytes;
    if (d->type != DL__J_OBJ) { snprintf(msg, msgn, "its description is not a JSON object"); return false; }
    for (c = d->first; c >= 0; c = j->v[c].next) {
        const char *k = j->v[c].key;
        int c2;
        nk++;
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets")) {
            snprintf(msg, msgn, "unknown field \"%.40s\" (allowed: dtype, shape, data_offsets)", k);
            return false;
        }
        for (c2 = j->v[c].next; c2 >= 0; c2 = j->v[c2].next)
            if (strcmp(j->v[c2].key, k) == 0) { snprintf(msg, msgn, "field \"%s\" appears twice", k); return false; }
    }
    dt = dl__jmember(j, d, "dtype");
    sh = dl__jmember(j, d, "shape");
    of = dl__jmember(j, d, "data_offsets");
    if (!dt || !sh || !of) {
        snprintf(msg, msgn, "missing field \"%s\"", !dt ? "dtype" : !sh ? "shape" : "data_offsets");
        return false;
    }
    if (dt->type != DL__J_STR) { snprintf(msg, msgn, "dtype is not a string"); return false; }
    e->dtype_str = dt->s;
    e->dtype_known = dl__st_dtype(dt->s, &e->dtype);
    if (sh->type != DL__J_ARR) { snprintf(msg, msgn, "shape is not an array"); return false; }
    e->ndim = 0;
    for (c = sh->first; c >= 0; c = j->v[c].next) {
        x = &j->v[c];
        if (x->type != DL__J_NUM || !x->is_int || x->ival < 0) {
            snprintf(msg, msgn, "shape[%d] is not a non-negative integer", e->ndim);
            return false;
        }
        if (e->ndim == DL_MAX_DIMS) { snprintf(msg, msgn, "shape has more than DL_MAX_DIMS=%d dims", DL_MAX_DIMS); return false; }
        if (x->ival && numel > ((uint64_t)1 << 62) / (uint64_t)x->ival) {
            snprintf(msg, msgn, "shape has too many elements (overflow)");
            return false;
        }
        numel *= (uint64_t)x->ival;
        e->shape[e->ndim++] = x->ival;
    }
    if (of->type != DL__J_ARR || of->first < 0 || j->v[of->first].next < 0 ||
        j->v[j->v[of->first].next].next >= 0) {
        snprintf(msg, msgn, "data_offsets is not an array of two integers");
        return false;
    }
    {
        const dl__jv *b0 = &j->v[of->first], *b1 = &j->v[b0->next];
        if (b0->type != DL__J_NUM || b1->type != DL__J_NUM || !b0->is_int || !b1->is_int) {
            snprintf(msg, msgn, "data_offsets are not integers (or are out of range)");
            return false;
        }
        if (b0->ival < 0 || b1->ival < 0) {
            snprintf(msg, msgn, "data_offsets [%lld, %lld] are negative", (long long)b0->ival,
                     (long long)b1->ival);
            return false;
        }
        e->begin = (uint64_t)b0->ival;
        e->end = (uint64_t)b1->ival;
    }
    if (e->begin > e->end || e->end > datalen) {
        snprintf(msg, msgn, "data_offsets [%llu, %llu] are out of range: the data section has "
                 "%llu bytes (truncated file?)", (unsigned long long)e->begin,
                 (unsigned long long)e->end, (unsigned long long)datalen);
        return false;
    }
    if (e->dtype_known) {
        bytes = numel * dl__esize(e->dtype);
        if (e->end - e->begin != bytes) {
            snprintf(msg, msgn, "data_offsets [%llu, %llu] hold %llu bytes but %s with %llu "
                     "elements needs %llu", (unsigned long long)e->begin, (unsigned long long)e->end,
                     (unsigned long long)(e->end - e->begin), e->dtype_str,
                     (unsigned long long)numel, (unsigned long long)bytes);
            return false;
        }
    }
    return true;
}

static void dl__st_shape_str(int ndim, const int64_t *s, char *b, size_t n)
{
    int i;
    size_t k = 0;
    k += (size_t)snprintf(b, n, "(");
    for (i = 0; i < ndim && k < n - 24; i++)
        k += (size_t)snprintf(b + k, n - k, i ? ",%lld" : "%lld", (long long)s[i]);
    snprintf(b + k, n - k, ")");
}

static void dl__read_le(void *dst, const unsigned char *src, size_t esize, int64_t numel)
{
    if (numel == 0) return;
    if (dl__little_endian()) memcpy(dst, src, esize * (size_t)numel);
    else {
        unsigned char *d = (unsigned char *)dst;
        int64_t i;
        size_t k;
        for (i = 0; i < numel; i++)
            for (k = 0; k < esize; k++) d[(size_t)i * esize + k] = src[(size_t)i * esize + esize - 1 - k];
    }
}

/* Load a safetensors image held in memory (label names it in messages). */
static dl_result dl__load_buffer(const unsigned char *buf, size_t len, const char *label,
                                 dl_module *m, dl_optim *o)
{
    dl_ctx *ctx;
    dl__json j;
    dl__st_entry *es = NULL, **sorted = NULL;
    dl__st_want *ws = NULL;
    int root, c, ne = 0, nw = 0, i, k;
    uint64_t hlen, datalen, pos;
    const unsigned char *data;
    const dl__jv *meta = NULL;
    int64_t steps = 0;
    float lr = 0;
    char msg[256], sa[160], sb2[160];
    dl_result rc = DL_ERR_FORMAT;
    if (!dl__mod_ok(m)) return DL_ERR_ARG;
    ctx = m->ctx;
    if (o && (!dl__optim_ok(o) || o->ctx != ctx)) {
        dl__err(ctx, DL_ERR_ARG, "dl_load: %s: o is not an optimizer of this context", label);
        return DL_ERR_ARG;
    }
    memset(&j, 0, sizeof j);
    if (len < 8) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: the file has %zu bytes; a safetensors file starts "
                "with an 8-byte header length (truncated or empty file)", label, len);
        return DL_ERR_FORMAT;
    }
    hlen = 0;
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > (uint64_t)(len - 8)) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: the header length %llu is larger than the rest "
                "of the file (%zu bytes): truncated or not a safetensors file", label,
                (unsigned long long)hlen, len - 8);
        return DL_ERR_FORMAT;
    }
    if (hlen > DL__ST_MAX_HEADER || hlen < 2) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: header length %llu is out of range (2..%u)", label,
                (unsigned long long)hlen, DL__ST_MAX_HEADER);
        return DL_ERR_FORMAT;
    }
    datalen = (uint64_t)(len - 8) - hlen;
    data = buf + 8 + hlen;
    /* parse */
    j.start = j.p = buf + 8;
    j.end = buf + 8 + hlen;
    j.sbcap = (size_t)hlen + 1;
    j.sb = (char *)DL_MALLOC(j.sbcap);
    if (!j.sb) { dl__err(ctx, DL_ERR_OOM, "dl_load: %s: out of memory", label); return DL_ERR_OOM; }
    dl__jws(&j);
    if (j.p >= j.end || *j.p != '{') root = dl__jfail(&j, "the header is not a JSON object");
    else root = dl__jvalue(&j, 0);
    if (root >= 0) {
        dl__jws(&j);
        if (j.p != j.end) root = dl__jfail(&j, "trailing characters after the JSON object");
    }
    if (root < 0) {
        if (j.err && strcmp(j.err, "out of memory") == 0) {
            rc = DL_ERR_OOM;
            dl__err(ctx, DL_ERR_OOM, "dl_load: %s: out of memory parsing the header", label);
        } else
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: malformed JSON header at byte %zu of %llu: %s",
                    label, j.errpos, (unsigned long long)hlen, j.err ? j.err : "?");
        goto done;
    }
    /* entries */
    for (c = j.v[root].first; c >= 0; c = j.v[c].next) ne++;
    es = (dl__st_entry *)DL_MALLOC(sizeof(dl__st_entry) * (size_t)(ne + 1));
    sorted = (dl__st_entry **)DL_MALLOC(sizeof(dl__st_entry *) * (size_t)(ne + 1));
    if (!es || !sorted) { rc = DL_ERR_OOM; dl__err(ctx, DL_ERR_OOM, "dl_load: %s: out of memory", label); goto done; }
    ne = 0;
    for (c = j.v[root].first; c >= 0; c = j.v[c].next) {
        const dl__jv *v = &j.v[c];
        if (strcmp(v->key, "__metadata__") == 0) {
            int c3;
            if (v->type != DL__J_OBJ) {
                dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: __metadata__ is not an object", label);
                goto done;
            }
            for (c3 = v->first; c3 >= 0; c3 = j.v[c3].next)
                if (j.v[c3].type != DL__J_STR) {
                    dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: __metadata__ value '%.100s' is not a "
                            "string (safetensors metadata maps strings to strings)", label, j.v[c3].key);
                    goto done;
                }
            if (meta) {
                dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: '__metadata__' appears twice in the header", label);
                goto done;
            }
            meta = v;
            continue;
        }
        memset(&es[ne], 0, sizeof es[ne]);
        es[ne].name = v->key;
        if (v->klen == 0 || strlen(v->key) != v->klen) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: a tensor has an empty name", label);
            goto done;
        }
        if (!dl__st_describe(&j, v, &es[ne], datalen, msg, sizeof msg)) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%.100s': %s", label, v->key, msg);
            goto done;
        }
        sorted[ne] = &es[ne];
        ne++;
    }
    /* names: unique (sorted, so that a huge header is not checked pair by pair) */
    if (ne) qsort(sorted, (size_t)ne, sizeof *sorted, dl__st_cmp_name);
    for (i = 1; i < ne; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: '%.100s' appears twice in the header", label,
                    sorted[i]->name);
            goto done;
        }
    /* offsets: sorted, they must tile the data section exactly (as safetensors requires) */
    if (ne) qsort(sorted, (size_t)ne, sizeof *sorted, dl__st_cmp);
    pos = 0;
    for (i = 0; i < ne; i++) {
        if (sorted[i]->begin < pos) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%.100s' data_offsets [%llu, %llu] "
                    "overlap tensor '%.100s' (ends at %llu)", label, sorted[i]->name,
                    (unsigned long long)sorted[i]->begin, (unsigned long long)sorted[i]->end,
                    sorted[i - 1]->name, (unsigned long long)pos);
            goto done;
        }
        if (sorted[i]->begin > pos) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%.100s' data_offsets [%llu, %llu] "
                    "leave a gap after byte %llu (offsets must be contiguous)", label,
                    sorted[i]->name, (unsigned long long)sorted[i]->begin,
                    (unsigned long long)sorted[i]->end, (unsigned long long)pos);
            goto done;
        }
        pos = sorted[i]->end;
    }
    if (pos != datalen) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: the tensors cover %llu bytes but the data section "
                "has %llu", label, (unsigned long long)pos, (unsigned long long)datalen);
        goto done;
    }
    /* what we expect */
    ws = dl__st_wants(m, o, &nw, &steps);
    if (!ws) { rc = DL_ERR_OOM; dl__err(ctx, DL_ERR_OOM, "dl_load: %s: out of memory", label); goto done; }
    for (i = 0; i < nw; i++) {
        dl__st_want *w = &ws[i];
        dl__st_entry *e = NULL;
        for (k = 0; k < ne; k++) if (strcmp(es[k].name, w->name) == 0) { e = &es[k]; break; }
        if (!e) {
            if (w->t) dl__st_shape_str(w->t->ndim, w->t->shape, sa, sizeof sa);
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%s' is missing from the file (%s %s)%s",
                    label, w->name, w->t ? "the model has" : "an int64 scalar", w->t ? sa : "",
                    strncmp(w->name, "optim.", 6) == 0 ? "; was it saved without this optimizer "
                    "(dl_save with o = NULL) or with other settings?" : "");
            goto done;
        }
        e->used = true;
        w->found = e;
        if (w->t) {
            if (!e->dtype_known || e->dtype != w->t->dtype) {
                dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%s' has dtype %.20s in the file "
                        "but %s in the model", label, w->name, e->dtype_str,
                        dl__st_dtype_name(w->t->dtype));
                goto done;
            }
            if (e->ndim != w->t->ndim ||
                (e->ndim && memcmp(e->shape, w->t->shape, sizeof(int64_t) * (size_t)e->ndim) != 0)) {
                dl__st_shape_str(e->ndim, e->shape, sa, sizeof sa);
                dl__st_shape_str(w->t->ndim, w->t->shape, sb2, sizeof sb2);
                dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%s' has shape %s in the file but "
                        "%s in the model", label, w->name, sa, sb2);
                goto done;
            }
        } else {
            int64_t v;
            if (!e->dtype_known || e->dtype != DL_DTYPE_I64 || e->ndim != 0) {
                dl__st_shape_str(e->ndim, e->shape, sa, sizeof sa);
                dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%s' must be an I64 scalar (shape "
                        "()), not %.20s %s", label, w->name, e->dtype_str, sa);
                goto done;
            }
            dl__read_le(&v, data + e->begin, 8, 1);
            if (v < 0) {
                dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: tensor '%s' is a negative step count %lld",
                        label, w->name, (long long)v);
                goto done;
            }
        }
    }
    for (k = 0; k < ne; k++) {
        if (es[k].used) continue;
        if (!o && strncmp(es[k].name, "optim.", 6) == 0) continue;   /* optimizer state not asked for */
        dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: the file has an extra tensor '%.100s' that the "
                "%s does not have", label, es[k].name,
                strncmp(es[k].name, "optim.", 6) == 0 ? "optimizer" : "module");
        goto done;
    }
    if (o) {
        const dl__jv *kind = meta ? dl__jmember(&j, meta, "dl.optim") : NULL;
        const dl__jv *lrv = meta ? dl__jmember(&j, meta, "dl.lr") : NULL;
        char *endp = NULL;
        double d;
        if (!kind || strcmp(kind->s, dl__opt_names[o->kind]) != 0) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: the optimizer state is for '%.20s' but o is %s",
                    label, kind ? kind->s : "(no dl.optim in __metadata__)", dl__opt_names[o->kind]);
            goto done;
        }
        d = lrv ? strtod(lrv->s, &endp) : -1.0;
        if (!lrv || endp == lrv->s || *endp || !(d >= 0.0) || d > 1e30) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_load: %s: __metadata__ dl.lr is missing or not a "
                    "non-negative number", label);
            goto done;
        }
        lr = (float)d;
    }
    /* everything checked: copy in */
    for (i = 0; i < nw; i++) {
        dl__st_want *w = &ws[i];
        if (w->t) dl__read_le(w->t->data, data + w->found->begin, dl__esize(w->t->dtype), w->t->numel);
        else dl__read_le(w->scalar, data + w->found->begin, 8, 1);
    }
    if (o) { o->steps = steps; o->lr = lr; }
    rc = DL_OK;
done:
    DL_FREE(j.sb);
    DL_FREE(j.v);
    DL_FREE(es);
    DL_FREE(sorted);
    DL_FREE(ws);
    return rc;
}

dl_result dl_load(const char *path, dl_module *m, dl_optim *o)
{
    dl_ctx *ctx;
    FILE *f;
    long sz;
    unsigned char *buf;
    size_t got;
    dl_result rc;
    if (!dl__mod_ok(m)) return DL_ERR_ARG;
    ctx = m->ctx;
    if (!path) { dl__err(ctx, DL_ERR_ARG, "dl_load: path is NULL"); return DL_ERR_ARG; }
    f = fopen(path, "rb");
    if (!f) {
        dl__err(ctx, DL_ERR_IO, "dl_load: cannot open %s for reading (does it exist?)", path);
        return DL_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (sz = ftell(f)) < 0 || sz == LONG_MAX ||
        (unsigned long)sz > (unsigned long)(((size_t)-1) / 2) || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        dl__err(ctx, DL_ERR_IO, "dl_load: cannot determine the size of %s (not a regular file?)", path);
        return DL_ERR_IO;
    }
    buf = (unsigned char *)dl__malloc(ctx, (size_t)sz);
    if (!buf) {
        fclose(f);
        dl__err(ctx, DL_ERR_OOM, "dl_load: %s: cannot allocate %ld bytes to read it", path, sz);
        return DL_ERR_OOM;
    }
    got = fread(buf, 1, (size_t)sz, f);
    if (got != (size_t)sz || ferror(f)) {
        fclose(f);
        DL_FREE(buf);
        dl__err(ctx, DL_ERR_IO, "dl_load: reading %s failed after %zu of %ld bytes", path, got, sz);
        return DL_ERR_IO;
    }
    fclose(f);
    rc = dl__load_buffer(buf, (size_t)sz, path, m, o);
    DL_FREE(buf);
    return rc;
}

#endif /* DL__NN_IMPLEMENTED */
