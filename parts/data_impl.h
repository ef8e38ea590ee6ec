
// >>section data
/* IDX files are read whole, checked (magic, type, dims, exact size) and only
   then converted, so a 100-byte file can never make the reader allocate
   gigabytes. The loader prepares batch k+1 on worker threads while the
   caller trains on batch k: two host buffers alternate. Every sample's
   augmentation draws from a generator seeded by (seed, epoch, position), and
   each epoch's order from (seed, epoch), so the batches are the same with
   any number of workers. */

#ifdef DL_ZLIB
#include <zlib.h>
#endif

static uint32_t dl__be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Parse an IDX image of `size` bytes in memory into a persistent tensor. */
static dl_result dl__idx_parse(dl_ctx *ctx, const char *path, const unsigned char *buf, size_t size,
                               dl_dtype as, dl_tensor **out)
{
    int nd, i, esz;
    int type;
    int64_t dims[DL_MAX_DIMS], numel = 1;
    dl_tensor *t;
    const unsigned char *p;
    *out = NULL;
    if (size < 4 || buf[0] != 0 || buf[1] != 0) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' is not an IDX file (bad magic; %zu bytes)", path, size);
        return DL_ERR_FORMAT;
    }
    type = buf[2];
    nd = buf[3];
    switch (type) {
    case 0x08: case 0x09: esz = 1; break;
    case 0x0B: esz = 2; break;
    case 0x0C: case 0x0D: esz = 4; break;
    case 0x0E: esz = 8; break;
    default:
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' has unknown IDX type code 0x%02x", path, type);
        return DL_ERR_FORMAT;
    }
    if (nd < 1 || nd > DL_MAX_DIMS) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' declares %d dims (1..%d supported)", path, nd, DL_MAX_DIMS);
        return DL_ERR_FORMAT;
    }
    if (size < 4 + 4 * (size_t)nd) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s' is truncated inside its header (%zu bytes)", path, size);
        return DL_ERR_FORMAT;
    }
    for (i = 0; i < nd; i++) {
        dims[i] = (int64_t)dl__be32(buf + 4 + 4 * i);
        if (dims[i] && numel > (INT64_MAX / 16) / dims[i]) {
            dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': dims overflow", path);
            return DL_ERR_FORMAT;
        }
        numel *= dims[i];
    }
    if ((uint64_t)numel > (uint64_t)((size - 4 - 4 * (size_t)nd) / (size_t)esz) ||
        4 + 4 * (size_t)nd + (size_t)numel * (size_t)esz != size) {
        dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': its dims need %lld bytes of data but the file "
                "has %zu (truncated, or a count mismatch)", path, (long long)numel * esz,
                size - 4 - 4 * (size_t)nd);
        return DL_ERR_FORMAT;
    }
    if (as != DL_DTYPE_F32 && as != DL_DTYPE_I64) {
        dl__err(ctx, DL_ERR_DTYPE, "dl_idx_load: can load as float32 or int64, not %s", dl__dtype_str(as));
        return DL_ERR_DTYPE;
    }
    t = dl__make(ctx, "dl_idx_load", as, nd, dims, true, NULL);
    if (!t) return ctx->err;
    p = buf + 4 + 4 * nd;
    {
        int64_t k;
        for (k = 0; k < numel; k++) {
            double v;
            const unsigned char *q = p + k * esz;
            switch (type) {
            case 0x08: v = q[0]; break;
            case 0x09: v = (signed char)q[0]; break;
            case 0x0B: v = (int16_t)(((unsigned)q[0] << 8) | q[1]); break;
            case 0x0C: v = (int32_t)dl__be32(q); break;
            case 0x0D: { uint32_t u = dl__be32(q); float f; memcpy(&f, &u, 4); v = f; break; }
            default: {
                uint64_t u = ((uint64_t)dl__be32(q) << 32) | dl__be32(q + 4);
                double d;
                memcpy(&d, &u, 8);
                v = d;
            }
            }
            if (as == DL_DTYPE_F32) ((float *)t->data)[k] = (float)v;
            else ((int64_t *)t->data)[k] = (v != v) ? 0 : (int64_t)v;
        }
    }
    *out = t;
    return DL_OK;
}

dl_result dl_idx_load(dl_ctx *ctx, const char *path, dl_dtype as, dl_tensor **out)
{
    FILE *f;
    unsigned char magic[2] = {0, 0};
    unsigned char *buf = NULL;
    size_t size = 0, got;
    long end;
    dl_result rc;
    if (!ctx) return DL_ERR_ARG;
    if (!path || !out) { dl__err(ctx, DL_ERR_ARG, "dl_idx_load: path and out must not be NULL"); return DL_ERR_ARG; }
    *out = NULL;
    f = fopen(path, "rb");
    if (!f) { dl__err(ctx, DL_ERR_IO, "dl_idx_load: cannot open '%s'", path); return DL_ERR_IO; }
    got = fread(magic, 1, 2, f);
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
#ifdef DL_ZLIB
        gzFile gz;
        size_t cap = (size_t)1 << 20;
        fclose(f);
        gz = gzopen(path, "rb");
        if (!gz) { dl__err(ctx, DL_ERR_IO, "dl_idx_load: cannot open '%s'", path); return DL_ERR_IO; }
        buf = (unsigned char *)dl__malloc(ctx, cap);
        while (buf) {
            int n = gzread(gz, buf + size, (unsigned)(cap - size > (1u << 30) ? (1u << 30) : cap - size));
            if (n < 0) { DL_FREE(buf); buf = NULL; gzclose(gz); dl__err(ctx, DL_ERR_FORMAT, "dl_idx_load: '%s': corrupt gzip data", path); return DL_ERR_FORMAT; }
            if (n == 0) break;
            size += (size_t)n;
            if (size == cap) {
                unsigned char *nb;
                if (cap >= ((size_t)1 << 33)) { DL_FREE(buf); buf = NULL; break; }
                nb = (unsigned char *)DL_REALLOC(buf, cap * 2);
                if (!nb) { DL_FREE(buf); buf = NULL; break; }
                buf = nb;
                cap *= 2;
            }
        }
        gzclose(gz);
        if (!buf) { dl__err(ctx, DL_ERR_OOM, "dl_idx_load: '%s': out of memory while decompressing", path); return DL_ERR_OOM; }
        rc = dl__idx_parse(ctx, path, buf, size, as, out);
        DL_FREE(buf);
        return rc;
#else
        fclose(f);
        dl__err(ctx, DL_ERR_UNSUPPORTED, "dl_idx_load: '%s' is gzip-compressed: gunzip it, or build "
                "with -DDL_ZLIB and link -lz", path);
        return DL_ERR_UNSUPPORTED;
#endif
    }
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        dl__err(ctx, DL_ERR_IO, "dl_idx_load: cannot read '%s'", path);
        return DL_ERR_IO;
    }
    size = (size_t)end;
    buf = (unsigned char *)dl__malloc(ctx, size ? size : 1);
    if (!buf) { fclose(f); dl__err(ctx, DL_ERR_OOM, "dl_idx_load: '%s': cannot allocate %zu bytes", path, size); return DL_ERR_OOM; }
    got = size ? fread(buf, 1, size, f) : 0;
    fclose(f);
    if (got != size) {
        DL_FREE(buf);
        dl__err(ctx, DL_ERR_IO, "dl_idx_load: short read of '%s'", path);
        return DL_ERR_IO;
    }
    rc = dl__idx_parse(ctx, path, buf, size, as, out);
    DL_FREE(buf);
    return rc;
}

typedef struct dl__tds {
    dl_dataset ds;
    dl_tensor *x, *y;
    dl_transform_desc t;
    bool has_t, train;
    int64_t sn;          /* floats per sample */
} dl__tds;

static dl_result dl__tds_get(const dl_dataset *ds, int64_t i, float *x, int64_t *y, uint64_t rng[4])
{
    const dl__tds *d = (const dl__tds *)ds->user;
    const float *src = (const float *)d->x->data + i * d->sn;
    float scale = 1.0f, mean = 0.0f, inv_std = 1.0f;
    int64_t k;
    *y = d->y->dtype == DL_DTYPE_I64 ? ((const int64_t *)d->y->data)[i]
       : d->y->dtype == DL_DTYPE_I32 ? (int64_t)((const int32_t *)d->y->data)[i]
       : (int64_t)((const float *)d->y->data)[i];
    if (d->has_t) {
        if (d->t.scale != 0.0f) scale = d->t.scale;
        mean = d->t.mean;
        if (d->t.std != 0.0f) inv_std = 1.0f / d->t.std;
    }
    if (d->has_t && d->train && d->ds.sample_shape.ndim >= 2 && (d->t.hflip || d->t.crop_padding > 0)) {
        const dl_shape *s = &d->ds.sample_shape;
        int64_t H = s->d[s->ndim - 2], W = s->d[s->ndim - 1], C = (H > 0 && W > 0) ? d->sn / (H * W) : 0;
        int64_t p = d->t.crop_padding, dy = 0, dx = 0, c, r, q;
        bool flip = d->t.hflip && dl__rng_uniform(rng) < 0.5f;
        if (p > 0) {
            dy = (int64_t)(dl__rng_uniform(rng) * (float)(2 * p + 1));
            dx = (int64_t)(dl__rng_uniform(rng) * (float)(2 * p + 1));
            if (dy > 2 * p) dy = 2 * p;
            if (dx > 2 * p) dx = 2 * p;
        }
        for (c = 0; c < C; c++)
            for (r = 0; r < H; r++)
                for (q = 0; q < W; q++) {
                    int64_t sr = r + dy - p, sq = (flip ? W - 1 - q : q) + dx - p;
                    float v = (sr >= 0 && sr < H && sq >= 0 && sq < W) ? src[(c * H + sr) * W + sq] : 0.0f;
                    x[(c * H + r) * W + q] = (v * scale - mean) * inv_std;
                }
        return DL_OK;
    }
    for (k = 0; k < d->sn; k++) x[k] = (src[k] * scale - mean) * inv_std;
    return DL_OK;
}

static void dl__tds_free(void *p) { DL_FREE(p); }

dl_dataset *dl_tensor_dataset(dl_ctx *ctx, dl_tensor *x, dl_tensor *y, const dl_transform_desc *t, bool train)
{
    dl__tds *d;
    if (!ctx || !x || !y) return NULL;
    if (!dl__live("dl_tensor_dataset", "x", x) || !dl__live("dl_tensor_dataset", "y", y)) return NULL;
    if (!dl__f32("dl_tensor_dataset", "x", x)) return NULL;
    if (x->ndim < 1 || y->ndim != 1 || x->shape[0] != y->shape[0]) {
        dl__err(ctx, DL_ERR_SHAPE, "dl_tensor_dataset: x %s and y %s: need x (N, ...) and y (N)",
                dl__sh(x), dl__sh(y));
        return NULL;
    }
    if (x->step_ != 0 || y->step_ != 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_tensor_dataset: x and y must be persistent (dl_keep them)");
        return NULL;
    }
    if (t && (t->crop_padding < 0 || t->crop_padding > 1024)) {
        dl__err(ctx, DL_ERR_ARG, "dl_tensor_dataset: crop_padding %lld out of range 0..1024", (long long)t->crop_padding);
        return NULL;
    }
    d = (dl__tds *)dl__malloc(ctx, sizeof *d);
    if (!d) { dl__err(ctx, DL_ERR_OOM, "dl_tensor_dataset: out of memory"); return NULL; }
    memset(d, 0, sizeof *d);
    d->x = x;
    d->y = y;
    d->train = train;
    if (t) { d->t = *t; d->has_t = true; }
    d->sn = dl__prod(x->shape + 1, x->ndim - 1);
    d->ds.length = x->shape[0];
    d->ds.sample_shape = dl_shape_make(x->ndim - 1, x->shape + 1);
    d->ds.get = dl__tds_get;
    d->ds.user = d;
    if (!dl__own(ctx, dl__tds_free, d)) { DL_FREE(d); return NULL; }
    return &d->ds;
}

struct dl_loader {
    dl_ctx *ctx;
    const dl_dataset *ds;
    dl_loader_desc d;
    int64_t n, nb, sn, epoch, batch;
    int64_t *perm;
    float *xbuf[2];
    int64_t *ybuf[2];
    /* the job in flight: fill batch job_batch of epoch job_epoch into slot job_slot */
    int64_t job_batch, job_epoch;
    int job_slot;
    bool in_flight;
    dl_result job_rc;
    int64_t job_bad_index;
    int nw;
#ifndef DL_NO_THREADS
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t gen;
    int pending, started;
    bool stop;
#endif
};

static int64_t dl__batch_count(const dl_loader *l, int64_t b)
{
    int64_t lo = b * l->d.batch_size, hi = lo + l->d.batch_size;
    return (hi > l->n ? l->n : hi) - lo;
}

/* Fill the share of worker w (of nw) of the current job. */
static void dl__loader_fill(dl_loader *l, int w, int nw)
{
    int64_t lo = l->job_batch * l->d.batch_size, cnt = dl__batch_count(l, l->job_batch), j;
    for (j = w; j < cnt; j += nw) {
        int64_t pos = lo + j, idx = l->perm[pos];
        uint64_t rng[4];
        dl_result rc;
        dl__seed_state(l->d.seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)l->job_epoch << 40) ^ (uint64_t)pos, rng);
        rc = l->ds->get(l->ds, idx, l->xbuf[l->job_slot] + j * l->sn, l->ybuf[l->job_slot] + j, rng);
        if (rc != DL_OK && l->job_rc == DL_OK) { l->job_rc = rc; l->job_bad_index = idx; }
    }
}

#ifndef DL_NO_THREADS
typedef struct dl__lw { dl_loader *l; int w; } dl__lw;
static void *dl__loader_worker(void *arg)
{
    dl_loader *l = ((dl__lw *)arg)->l;
    int w = ((dl__lw *)arg)->w;
    uint64_t seen = 0;
    DL_FREE(arg);
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && l->gen == seen) pthread_cond_wait(&l->cv_work, &l->mu);
        if (l->stop) break;
        seen = l->gen;
        pthread_mutex_unlock(&l->mu);
        dl__loader_fill(l, w, l->nw);
        pthread_mutex_lock(&l->mu);
        if (--l->pending == 0) pthread_cond_signal(&l->cv_done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}
#endif

static void dl__loader_launch(dl_loader *l, int64_t batch, int slot)
{
    l->job_batch = batch;
    l->job_epoch = l->epoch;
    l->job_slot = slot;
    l->job_rc = DL_OK;
    l->in_flight = true;
#ifndef DL_NO_THREADS
    if (l->nw > 0) {
        pthread_mutex_lock(&l->mu);
        l->pending = l->nw;
        l->gen++;
        pthread_cond_broadcast(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
    }
#endif
}

static void dl__loader_wait(dl_loader *l)
{
    if (!l->in_flight) return;
#ifndef DL_NO_THREADS
    if (l->nw > 0) {
        pthread_mutex_lock(&l->mu);
        while (l->pending > 0) pthread_cond_wait(&l->cv_done, &l->mu);
        pthread_mutex_unlock(&l->mu);
        l->in_flight = false;
        return;
    }
#endif
    dl__loader_fill(l, 0, 1);
    l->in_flight = false;
}

static void dl__loader_free(void *p)
{
    dl_loader *l = (dl_loader *)p;
#ifndef DL_NO_THREADS
    int i;
    if (l->started) {
        dl__loader_wait(l);
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
        for (i = 0; i < l->started; i++) pthread_join(l->th[i], NULL);
    }
    if (l->nw > 0 || l->th) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv_work);
        pthread_cond_destroy(&l->cv_done);
    }
    DL_FREE(l->th);
#endif
    DL_FREE(l->perm);
    DL_FREE(l->xbuf[0]);
    DL_FREE(l->xbuf[1]);
    DL_FREE(l->ybuf[0]);
    DL_FREE(l->ybuf[1]);
    DL_FREE(l);
}

dl_loader *dl_loader_new(dl_ctx *ctx, const dl_dataset *ds, const dl_loader_desc *desc)
{
    dl_loader *l;
    int64_t bs;
    if (!ctx) return NULL;
    if (!ds || !ds->get || ds->length < 0) {
        dl__err(ctx, DL_ERR_ARG, "dl_loader_new: dataset is NULL or has no get function");
        return NULL;
    }
    bs = desc && desc->batch_size > 0 ? desc->batch_size : 1;
    if (desc && (desc->batch_size < 0 || desc->num_workers < 0 || desc->num_workers > 64)) {
        dl__err(ctx, DL_ERR_ARG, "dl_loader_new: batch_size %lld must be >= 0 and num_workers %d in 0..64",
                (long long)desc->batch_size, desc->num_workers);
        return NULL;
    }
    l = (dl_loader *)dl__malloc(ctx, sizeof *l);
    if (!l) { dl__err(ctx, DL_ERR_OOM, "dl_loader_new: out of memory"); return NULL; }
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->ds = ds;
    if (desc) l->d = *desc;
    l->d.batch_size = bs;
    if (!l->d.seed) l->d.seed = 1;
    l->n = ds->length;
    l->nb = l->d.drop_last ? l->n / bs : (l->n + bs - 1) / bs;
    l->sn = dl__prod(ds->sample_shape.d, ds->sample_shape.ndim);
    l->batch = -1;
    if (l->sn > 0 && (uint64_t)bs > (uint64_t)(INT64_MAX / 8) / (uint64_t)l->sn) goto oom;
    l->perm = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)(l->n + 1));
    l->xbuf[0] = (float *)dl__malloc(ctx, sizeof(float) * (size_t)(bs * l->sn + 1));
    l->xbuf[1] = (float *)dl__malloc(ctx, sizeof(float) * (size_t)(bs * l->sn + 1));
    l->ybuf[0] = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)bs);
    l->ybuf[1] = (int64_t *)dl__malloc(ctx, sizeof(int64_t) * (size_t)bs);
    if (!l->perm || !l->xbuf[0] || !l->xbuf[1] || !l->ybuf[0] || !l->ybuf[1]) goto oom;
#ifndef DL_NO_THREADS
    l->nw = l->d.num_workers;
    if (l->nw > 0) {
        int i;
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv_work, NULL);
        pthread_cond_init(&l->cv_done, NULL);
        l->th = (pthread_t *)dl__malloc(ctx, sizeof(pthread_t) * (size_t)l->nw);
        if (!l->th) goto oom;
        for (i = 0; i < l->nw; i++) {
            dl__lw *a = (dl__lw *)dl__malloc(ctx, sizeof *a);
            if (!a) goto oom;
            a->l = l;
            a->w = i;
            if (pthread_create(&l->th[i], NULL, dl__loader_worker, a) != 0) { DL_FREE(a); break; }
            l->started++;
        }
        l->nw = l->started;   /* fewer threads if the system refused some */
    }
#endif
    if (!dl__own(ctx, dl__loader_free, l)) { dl__loader_free(l); return NULL; }
    return l;
oom:
    dl__loader_free(l);
    dl__err(ctx, DL_ERR_OOM, "dl_loader_new: out of memory for batches of %lld samples", (long long)bs);
    return NULL;
}

static void dl__loader_order(dl_loader *l)
{
    int64_t i;
    for (i = 0; i < l->n; i++) l->perm[i] = i;
    if (l->d.shuffle) {
        uint64_t s[4];
        dl__seed_state(l->d.seed * 0x2545f4914f6cdd1dull + (uint64_t)l->epoch, s);
        for (i = l->n - 1; i > 0; i--) {
            int64_t j = (int64_t)(dl__rng_next(s) % (uint64_t)(i + 1)), t = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = t;
        }
    }
}

bool dl_loader_next(dl_loader *l, dl_tensor **x, dl_tensor **y)
{
    int64_t shape[DL_MAX_DIMS + 1], cnt;
    int slot;
    if (x) *x = NULL;
    if (y) *y = NULL;
    if (!l || !x || !y) return false;
    if (l->batch < 0) {   /* a new epoch */
        l->epoch++;
        dl__loader_order(l);
        l->batch = 0;
        if (l->nb > 0) dl__loader_launch(l, 0, 0);
    }
    if (l->batch >= l->nb) { l->batch = -1; return false; }
    dl__loader_wait(l);
    slot = (int)(l->batch & 1);
    if (l->job_rc != DL_OK) {
        dl__err(l->ctx, l->job_rc, "dl_loader_next: the dataset's get failed for sample %lld (%s)",
                    (long long)l->job_bad_index, dl_result_string(l->job_rc));
        l->batch = -1;
        return false;
    }
    cnt = dl__batch_count(l, l->batch);
    if (l->batch + 1 < l->nb) dl__loader_launch(l, l->batch + 1, 1 - slot);
    shape[0] = cnt;
    memcpy(shape + 1, l->ds->sample_shape.d, sizeof(int64_t) * (size_t)l->ds->sample_shape.ndim);
    *x = dl__make(l->ctx, "dl_loader_next", DL_DTYPE_F32, l->ds->sample_shape.ndim + 1, shape, false, NULL);
    *y = dl__make(l->ctx, "dl_loader_next", DL_DTYPE_I64, 1, &cnt, false, NULL);
    if (!*x || !*y) { *x = *y = NULL; return false; }
    if (cnt > 0 && l->sn > 0) memcpy((*x)->data, l->xbuf[slot], sizeof(float) * (size_t)(cnt * l->sn));
    if (cnt) memcpy((*y)->data, l->ybuf[slot], sizeof(int64_t) * (size_t)cnt);
    l->batch++;
    return true;
}

int64_t dl_loader_num_batches(const dl_loader *l) { return l ? l->nb : 0; }
int64_t dl_loader_epoch(const dl_loader *l) { return l ? l->epoch : 0; }
