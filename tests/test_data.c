/* tests/test_data.c - the IDX reader (parse, every malformed-file error),
   the tensor dataset and its transforms, and the loader: each sample once per
   epoch, seeded order, drop_last, and the same batches with 0, 1 or 2
   worker threads; with the dataset on the device (device_data) the same
   batches, bit for bit, as the host's, with normalization, flips and crops
   (on the context's default device: cpu:0, the strict cpu:1 of make test,
   the emulated cuda:0 of make test-cuda-emu). */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"

static dl_ctx *ctx;

static void put32(unsigned char *p, uint32_t v) { p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v; }

static void write_file(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(b, 1, n, f); fclose(f); }
}

static void test_idx(void)
{
    unsigned char b[4 + 12 + 24];
    dl_tensor *t = NULL;
    int i;
    b[0] = 0; b[1] = 0; b[2] = 0x08; b[3] = 3;
    put32(b + 4, 2); put32(b + 8, 3); put32(b + 12, 4);
    for (i = 0; i < 24; i++) b[16 + i] = (unsigned char)(i * 10);
    write_file("build/t_ok.idx", b, sizeof b);
    CHECK(dl_idx_load(ctx, "build/t_ok.idx", DL_DTYPE_F32, &t) == DL_OK && t, "idx load");
    CHECK(t && t->ndim == 3 && t->shape[2] == 4 && th_f(t, 23) == 230.0f && t->step_ == 0, "idx values");
    CHECK(dl_idx_load(ctx, "build/t_ok.idx", DL_DTYPE_I64, &t) == DL_OK && th_i64(t, 5) == 50, "idx as int64");
    /* labels file: 1-D */
    b[3] = 1; put32(b + 4, 5);
    write_file("build/t_lab.idx", b, 8 + 5);
    CHECK(dl_idx_load(ctx, "build/t_lab.idx", DL_DTYPE_I64, &t) == DL_OK && t->numel == 5, "1-D idx");
    /* errors */
    CHECK(dl_idx_load(ctx, "build/does-not-exist.idx", DL_DTYPE_F32, &t) == DL_ERR_IO && t == NULL, "missing file");
    EXPECT_ERR(ctx, DL_ERR_IO, "cannot open");
    b[0] = 7; write_file("build/t_bad.idx", b, 13);
    CHECK(dl_idx_load(ctx, "build/t_bad.idx", DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "bad magic");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "bad magic");
    b[0] = 0; b[2] = 0x07; write_file("build/t_bad.idx", b, 13);
    CHECK(dl_idx_load(ctx, "build/t_bad.idx", DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "bad type");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "type code");
    b[2] = 0x08; b[3] = 3; put32(b + 4, 2); put32(b + 8, 3); put32(b + 12, 4);
    write_file("build/t_bad.idx", b, sizeof b - 1);   /* truncated data */
    CHECK(dl_idx_load(ctx, "build/t_bad.idx", DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "truncated");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "truncated");
    put32(b + 4, 3); write_file("build/t_bad.idx", b, sizeof b);   /* count mismatch */
    CHECK(dl_idx_load(ctx, "build/t_bad.idx", DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "count mismatch");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "count mismatch");
    put32(b + 4, 60000); put32(b + 8, 60000); put32(b + 12, 60000);  /* absurd dims, 40-byte file */
    write_file("build/t_bad.idx", b, sizeof b);
    {
        /* neither on the host nor on the default device */
        dl_memory_stats s0[2], s1[2];
        dl_device dev[2];
        int k;
        dev[0] = dl_cpu();
        dev[1] = dl_ctx_device(ctx);
        for (k = 0; k < 2; k++) dl_memory_stats_get(ctx, dev[k], &s0[k]);
        CHECK(dl_idx_load(ctx, "build/t_bad.idx", DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "absurd dims");
        for (k = 0; k < 2; k++) {
            dl_memory_stats_get(ctx, dev[k], &s1[k]);
            CHECK(s1[k].peak_bytes < s0[k].peak_bytes + 4096, "absurd dims allocated %zu bytes on %s",
                  s1[k].peak_bytes - s0[k].peak_bytes, dl_device_name(dev[k]));
        }
        dl_clear_error(ctx);
    }
    b[3] = 0; write_file("build/t_bad.idx", b, 4);
    CHECK(dl_idx_load(ctx, "build/t_bad.idx", DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "zero dims");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "dims");
    b[3] = 3; write_file("build/t_bad.idx", b, 9);
    CHECK(dl_idx_load(ctx, "build/t_bad.idx", DL_DTYPE_F32, &t) == DL_ERR_FORMAT, "truncated header");
    EXPECT_ERR(ctx, DL_ERR_FORMAT, "header");
    {
        unsigned char gz[4] = {0x1f, 0x8b, 8, 0};
        write_file("build/t_gz.idx", gz, 4);
#ifndef DL_ZLIB
        CHECK(dl_idx_load(ctx, "build/t_gz.idx", DL_DTYPE_F32, &t) == DL_ERR_UNSUPPORTED, "gzip without zlib");
        EXPECT_ERR(ctx, DL_ERR_UNSUPPORTED, "gunzip");
#else
        /* the same IDX file gzip-compressed reads back equal; corrupt gzip is an error */
        unsigned char ok[4 + 12 + 24];
        gzFile zf = gzopen("build/t_ok.idx.gz", "wb");
        FILE *f = fopen("build/t_ok.idx", "rb");
        size_t n = f ? fread(ok, 1, sizeof ok, f) : 0;
        if (f) fclose(f);
        if (zf) { gzwrite(zf, ok, (unsigned)n); gzclose(zf); }
        CHECK(n == sizeof ok && dl_idx_load(ctx, "build/t_ok.idx.gz", DL_DTYPE_F32, &t) == DL_OK &&
              t->numel == 24 && th_f(t, 23) == 230.0f, "gzip IDX with zlib");
        CHECK(dl_idx_load(ctx, "build/t_gz.idx", DL_DTYPE_F32, &t) != DL_OK, "truncated gzip is an error");
        dl_clear_error(ctx);
#endif
    }
    {   /* a float64 IDX file: values beyond float saturate; as int64 a huge value is an error */
        unsigned char f[4 + 4 + 16];
        double big = 1e300, one = 3.0;
        uint64_t u;
        int k;
        f[0] = 0; f[1] = 0; f[2] = 0x0E; f[3] = 1; put32(f + 4, 2);
        memcpy(&u, &one, 8);
        for (k = 0; k < 8; k++) f[8 + k] = (unsigned char)(u >> (56 - 8 * k));
        memcpy(&u, &big, 8);
        for (k = 0; k < 8; k++) f[16 + k] = (unsigned char)(u >> (56 - 8 * k));
        write_file("build/t_f64.idx", f, sizeof f);
        CHECK(dl_idx_load(ctx, "build/t_f64.idx", DL_DTYPE_F32, &t) == DL_OK && th_f(t, 0) == 3.0f &&
              isinf(th_f(t, 1)), "float64 IDX saturates to float");
        CHECK(dl_idx_load(ctx, "build/t_f64.idx", DL_DTYPE_I64, &t) == DL_ERR_FORMAT, "huge value as int64");
        EXPECT_ERR(ctx, DL_ERR_FORMAT, "fits int64");
    }
    CHECK(dl_idx_load(ctx, NULL, DL_DTYPE_F32, &t) == DL_ERR_ARG, "NULL path");
    dl_clear_error(ctx);
}

/* a dataset of N samples (1,4,4) whose pixels all equal the index */
static dl_dataset *make_ds(int64_t n, const dl_transform_desc *tr, bool train)
{
    dl_tensor *x, *y;
    int64_t i, *yv = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
    float *xv = (float *)malloc(sizeof(float) * (size_t)n * 16);
    for (i = 0; i < n * 16; i++) xv[i] = (float)(i / 16);
    for (i = 0; i < n; i++) yv[i] = i;
    x = dl_from_array(ctx, DL_SHAPE(n, 1, 4, 4), xv);
    y = dl_from_int64(ctx, DL_SHAPE(n), yv);
    free(xv);
    free(yv);
    return dl_tensor_dataset(ctx, dl_keep(x), dl_keep(y), tr, train);
}

static void test_loader(void)
{
    dl_dataset *ds = make_ds(103, NULL, false);
    dl_loader_desc d;
    dl_loader *l;
    dl_tensor *x, *y;
    int64_t seen[103], order[3][103], k, nb, e;
    int w, ok;
    memset(&d, 0, sizeof d);
    d.batch_size = 10;
    d.shuffle = true;
    d.seed = 9;
    for (w = 0; w < 3; w++) {
        d.num_workers = w;
        l = dl_loader_new(ctx, ds, &d);
        CHECK(l && dl_loader_num_batches(l) == 11, "11 batches");
        for (e = 0; e < 2; e++) {
            memset(seen, 0, sizeof seen);
            nb = 0; k = 0; ok = 1;
            while (dl_loader_next(l, &x, &y) > 0) {
                int64_t i, *yh = th_host_i64(y);
                float *xh = th_host(x);
                if (!yh || !xh || x->numel != y->numel * 16) ok = 0;
                else for (i = 0; i < y->numel; i++) {
                    int64_t v = yh[i];
                    if (v < 0 || v >= 103) { ok = 0; continue; }
                    seen[v]++;
                    if (xh[i * 16 + 5] != (float)v) ok = 0;   /* x matches its label */
                    if (e == 0 && k < 103) order[w][k] = v;
                    k++;
                }
                nb++;
                dl_step_end(ctx);
            }
            CHECK(nb == 11 && k == 103, "epoch %lld with %d workers: %lld batches %lld samples", (long long)e, w, (long long)nb, (long long)k);
            for (k = 0; k < 103; k++) if (seen[k] != 1) ok = 0;
            CHECK(ok, "every sample exactly once, x matches y (workers %d)", w);
        }
        CHECK(dl_loader_epoch(l) == 2, "epoch count");
    }
    {   /* set_epoch(1): the next epoch is epoch 2 of a fresh loader */
        int64_t o2[103], o3[103], j = 0;
        d.num_workers = 1;
        l = dl_loader_new(ctx, ds, &d);
        while (dl_loader_next(l, &x, &y) > 0) dl_step_end(ctx);
        while (dl_loader_next(l, &x, &y) > 0) {
            if (j + y->numel <= 103) dl_read_int64(y, o2 + j, y->numel);
            j += y->numel;
            dl_step_end(ctx);
        }
        l = dl_loader_new(ctx, ds, &d);
        dl_loader_set_epoch(l, 1);
        j = 0;
        while (dl_loader_next(l, &x, &y) > 0) {
            if (j + y->numel <= 103) dl_read_int64(y, o3 + j, y->numel);
            j += y->numel;
            dl_step_end(ctx);
        }
        CHECK(j == 103 && memcmp(o2, o3, sizeof o2) == 0 && dl_loader_epoch(l) == 2, "set_epoch resumes the order");
    }
    CHECK(memcmp(order[0], order[1], sizeof order[0]) == 0 && memcmp(order[0], order[2], sizeof order[0]) == 0,
          "same order with 0, 1, 2 workers");
    for (k = 0, ok = 0; k < 103; k++) if (order[0][k] != k) ok = 1;
    CHECK(ok, "shuffle changed the order");
    /* drop_last, no shuffle */
    d.drop_last = true; d.shuffle = false; d.num_workers = 1;
    l = dl_loader_new(ctx, ds, &d);
    nb = 0;
    while (dl_loader_next(l, &x, &y) > 0) { CHECK(y->numel == 10 && th_i64(y, 0) == nb * 10, "drop_last batch in order"); nb++; dl_step_end(ctx); }
    CHECK(nb == 10, "drop_last gives 10 batches, got %lld", (long long)nb);
    /* augmentation is seeded per sample position: same for any worker count */
    {
        dl_transform_desc tr;
        float *first = NULL;
        memset(&tr, 0, sizeof tr);
        tr.hflip = true; tr.crop_padding = 1; tr.mean = 1.0f; tr.std = 2.0f;
        ds = make_ds(20, &tr, true);
        memset(&d, 0, sizeof d);
        d.batch_size = 20;
        first = (float *)malloc(sizeof(float) * 20 * 16);
        for (w = 0; w < 3; w++) {
            d.num_workers = w;
            l = dl_loader_new(ctx, ds, &d);
            CHECK(dl_loader_next(l, &x, &y) == 1, "aug batch");
            if (w == 0) { if (x->numel != 320 || dl_read(x, first, 320) != DL_OK) memset(first, 0, sizeof(float) * 320); }
            else CHECK(x->numel == 320 && memcmp(first, th_host(x), sizeof(float) * 320) == 0,
                       "augmented batch equal with %d workers", w);
            dl_step_end(ctx);
        }
        /* sample 3 (pixels 3): normalized (3-1)/2 = 1, padded zeros -> -0.5 */
        {
            int i, ok2 = 1, pads = 0;
            for (i = 0; i < 16; i++) { float v = first[3 * 16 + i]; if (v == -0.5f) pads++; else if (v != 1.0f) ok2 = 0; }
            CHECK(ok2 && pads <= 7, "crop+normalize values (pads %d)", pads);
        }
        free(first);
    }
    /* errors */
    d.batch_size = -1;
    CHECK(dl_loader_new(ctx, ds, &d) == NULL, "negative batch size");
    EXPECT_ERR(ctx, DL_ERR_ARG, "batch_size");
    /* a NULL dataset (its constructor failed) passes through silently: the
       message the user reads is the constructor's, the first cause */
    CHECK(dl_loader_new(ctx, NULL, NULL) == NULL && dl_last_error(ctx) == DL_OK, "NULL dataset");
    CHECK(dl_loader_new(ctx, dl_tensor_dataset(ctx, dl_keep(dl_zeros(ctx, DL_SHAPE(3, 2))),
                                               dl_keep(dl_zeros(ctx, DL_SHAPE(4))), NULL, false), &d) == NULL,
          "x/y length mismatch");
    EXPECT_ERR(ctx, DL_ERR_SHAPE, "x has 3 samples (3,2) but y has 4 labels (4)");
    CHECK(dl_tensor_dataset(ctx, dl_zeros(ctx, DL_SHAPE(3, 2)), dl_zeros(ctx, DL_SHAPE(3)), NULL, false) == NULL, "step tensors refused");
    EXPECT_ERR(ctx, DL_ERR_ARG, "persistent");
}

/* a dataset of n samples (C,H,W) of pseudo-random bytes 0..255, labels i % 10 */
static dl_dataset *byte_ds(int64_t n, int64_t C, int64_t H, int64_t W, const dl_transform_desc *tr, bool train)
{
    int64_t i, sn = C * H * W, *yv = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
    float *xv = (float *)malloc(sizeof(float) * (size_t)(n * sn));
    uint32_t r = 12345;
    dl_tensor *x, *y;
    for (i = 0; i < n * sn; i++) { r = r * 1664525u + 1013904223u; xv[i] = (float)(r >> 24); }
    for (i = 0; i < n; i++) yv[i] = i % 10;
    x = dl_keep(dl_from_array(ctx, DL_SHAPE(n, C, H, W), xv));
    y = dl_keep(dl_from_int64(ctx, DL_SHAPE(n), yv));
    dl_step_end(ctx);
    free(xv);
    free(yv);
    return dl_tensor_dataset(ctx, x, y, tr, train);
}

/* the loader with device_data against the host loader: every batch of 2
   epochs (the order, crops, flips, normalization) bit for bit */
static void device_loader_case(const char *what, dl_dataset *ds, const dl_loader_desc *base)
{
    dl_loader_desc dh = *base, dd = *base;
    dl_loader *lh, *ld;
    dl_tensor *xh, *yh, *xd, *yd;
    int e, nb = 0, same = 1;
    dd.device_data = true;
    dd.num_workers = 2;                  /* ignored: the device makes the batches */
    lh = dl_loader_new(ctx, ds, &dh);
    ld = dl_loader_new(ctx, ds, &dd);
    CHECK(lh && ld, "%s: two loaders: %s", what, dl_error_message(ctx));
    if (!lh || !ld) return;
    CHECK(dl_loader_num_batches(ld) == dl_loader_num_batches(lh), "%s: as many batches", what);
    for (e = 0; e < 2; e++) {
        int rh;
        while ((rh = dl_loader_next(lh, &xh, &yh)) > 0 && dl_loader_next(ld, &xd, &yd) > 0) {
            dl_device dev = dl_ctx_device(ctx);
            bool ok = xd->device.type == dev.type && xd->device.index == dev.index && dl_same_shape(xh, xd) &&
                      dl_same_shape(yh, yd) && th_same_bytes(xh, xd) && th_same_bytes(yh, yd);
            if (!ok && same) CHECK(0, "%s: epoch %d batch %d differs from the host loader's", what, e + 1, nb);
            same &= ok;
            nb++;
            dl_step_end(ctx);
        }
        CHECK(rh == 0 && dl_loader_next(ld, &xd, &yd) == 0, "%s: both epochs end together", what);
    }
    CHECK(same && nb > 0, "%s: %d batches of 2 epochs bit for bit as the host's", what, nb);
}

static void test_device_loader(void)
{
    dl_transform_desc tr;
    dl_loader_desc d;
    dl_dataset *ds;
    dl_memory_stats ms0, ms1;
    memset(&tr, 0, sizeof tr);
    tr.scale = 1.0f / 255.0f; tr.mean = 0.2860f; tr.std = 0.3530f;   /* Fashion-MNIST's */
    memset(&d, 0, sizeof d);
    d.batch_size = 8; d.shuffle = true; d.seed = 11;
    dl_memory_stats_get(ctx, dl_ctx_device(ctx), &ms0);
    device_loader_case("normalized, shuffled", byte_ds(37, 1, 6, 5, &tr, true), &d);
    dl_memory_stats_get(ctx, dl_ctx_device(ctx), &ms1);
    CHECK(ms1.persistent_bytes >= ms0.persistent_bytes + 37 * 30 + 37 * 8 * 3,
          "the bytes, labels and plan live on the device (%zu more bytes)", ms1.persistent_bytes - ms0.persistent_bytes);
    tr.hflip = true; tr.crop_padding = 2;                             /* examples/resnet.c's augmentation */
    device_loader_case("flips and crops, 2 channels", byte_ds(29, 2, 7, 6, &tr, true), &d);
    d.drop_last = true; d.batch_size = 5;
    device_loader_case("drop_last", byte_ds(29, 3, 4, 4, &tr, true), &d);
    d.shuffle = false; d.drop_last = false;
    device_loader_case("eval: no augmentation", byte_ds(13, 1, 5, 5, &tr, false), &d);
    device_loader_case("no transform, flat samples", byte_ds(13, 1, 1, 7, NULL, true), &d);
    /* empty samples: the labels still come (CUDA's kernel had a thread per
       pixel, none here, so its labels were never written) */
    device_loader_case("empty samples", byte_ds(9, 1, 0, 5, NULL, false), &d);
    {   /* resuming at an epoch: the plan of that epoch */
        dl_loader *a, *b;
        dl_tensor *xa, *ya, *xb, *yb;
        ds = byte_ds(20, 1, 4, 4, &tr, true);
        d.shuffle = true; d.batch_size = 20;
        a = dl_loader_new(ctx, ds, &d);
        d.device_data = true;
        b = dl_loader_new(ctx, ds, &d);
        dl_loader_set_epoch(a, 3);
        dl_loader_set_epoch(b, 3);
        CHECK(a && b && dl_loader_next(a, &xa, &ya) == 1 && dl_loader_next(b, &xb, &yb) == 1 &&
              th_same_bytes(xa, xb) && th_same_bytes(ya, yb), "set_epoch: epoch 4's batch, on the device too");
        dl_step_end(ctx);
        d.device_data = false;
    }
    /* errors: x that bytes cannot hold (a get function of its own: test_device_loader_custom) */
    {
        dl_tensor *x, *y;
        float xv[8] = {0, 1, 2, 255, 3, 4, 0.5f, 7};
        int64_t yv[2] = {0, 1};
        d.device_data = true;
        x = dl_keep(dl_from_array(ctx, DL_SHAPE(2, 4), xv));
        y = dl_keep(dl_from_int64(ctx, DL_SHAPE(2), yv));
        CHECK(dl_loader_new(ctx, dl_tensor_dataset(ctx, x, y, NULL, false), &d) == NULL, "x with 0.5 refused");
        EXPECT_ERR(ctx, DL_ERR_ARG, "x holds 0.5 at flat index 6 (sample 1): the values must be whole numbers from 0 to 255");
        xv[6] = 256.0f;
        dl_free(x);
        x = dl_keep(dl_from_array(ctx, DL_SHAPE(2, 4), xv));
        CHECK(dl_loader_new(ctx, dl_tensor_dataset(ctx, x, y, NULL, false), &d) == NULL, "x with 256 refused");
        EXPECT_ERR(ctx, DL_ERR_ARG, "holds 256");
        dl_step_end(ctx);
    }
    d.device_data = false;
}

static dl_result own_get(const dl_dataset *ds, int64_t i, float *x, int64_t *y, uint64_t rng[4])
{
    (void)ds; (void)rng;
    x[0] = (float)i;
    *y = i;
    return DL_OK;
}

static void test_device_loader_custom(void)
{
    dl_dataset ds;
    dl_loader_desc d;
    memset(&ds, 0, sizeof ds);
    ds.length = 3;
    ds.sample_shape = DL_SHAPE(1);
    ds.get = own_get;
    memset(&d, 0, sizeof d);
    d.device_data = true;
    CHECK(dl_loader_new(ctx, &ds, &d) == NULL, "device_data with a get function of its own");
    EXPECT_ERR(ctx, DL_ERR_ARG, "device_data needs a dataset made by dl_tensor_dataset");
}

/* a dataset of its own with float targets (2 a sample): sample i is (i),
   its target (i / 2, -i); sample 5 fails */
static dl_result own_get_t(const dl_dataset *ds, int64_t i, float *x, float *y, uint64_t rng[4])
{
    (void)ds; (void)rng;
    if (i == 5) return DL_ERR_IO;
    x[0] = (float)i;
    y[0] = (float)i * 0.5f;
    y[1] = -(float)i;
    return DL_OK;
}

/* Float targets (regression), as PyTorch's TensorDataset over a float y
   and a Dataset of one's own: y batches float32 (B, target...) holding
   the rows of the samples in the batch, in every order and with workers;
   then the refusals. */
static void test_float_targets(void)
{
    int w, k, tk;
    for (tk = 0; tk < 2; tk++)   /* y (10, 3), then y (10) */
        for (w = 0; w < 3; w += 2) {
            float xv[20], yv[30];
            int seen[10];
            int64_t i;
            dl_tensor *x, *y, *bx, *by;
            dl_dataset *ds;
            dl_loader_desc d;
            dl_loader *l;
            bool ok = true;
            int nb = 0, rc;
            for (i = 0; i < 10; i++) {
                xv[2 * i] = (float)i;
                xv[2 * i + 1] = -(float)i;
                for (k = 0; k < 3; k++) yv[3 * i + k] = 100.0f * (float)i + (float)k + 0.25f;
                seen[i] = 0;
            }
            if (tk == 1)
                for (i = 0; i < 10; i++) yv[i] = 100.0f * (float)i + 0.25f;
            x = dl_keep(dl_from_array(ctx, DL_SHAPE(10, 2), xv));
            y = dl_keep(tk == 0 ? dl_from_array(ctx, DL_SHAPE(10, 3), yv) : dl_from_array(ctx, DL_SHAPE(10), yv));
            ds = dl_tensor_dataset(ctx, x, y, NULL, true);
            CHECK(ds && !ds->get && ds->get_target && ds->target_shape.ndim == (tk == 0 ? 1 : 0),
                  "float y %s: a dataset of float targets: %s", tk ? "(10)" : "(10, 3)", dl_error_message(ctx));
            memset(&d, 0, sizeof d);
            d.batch_size = 4;
            d.shuffle = true;
            d.num_workers = w;
            l = ds ? dl_loader_new(ctx, ds, &d) : NULL;
            while (l && (rc = dl_loader_next(l, &bx, &by)) > 0) {
                float hx[8], hy[12];
                int64_t b = bx->shape[0], r;
                ok = ok && by->dtype == DL_DTYPE_F32 && by->shape[0] == b && by->ndim == (tk == 0 ? 2 : 1) &&
                     (tk == 1 || by->shape[1] == 3) && dl_read(bx, hx, b * 2) == DL_OK &&
                     dl_read(by, hy, b * (tk == 0 ? 3 : 1)) == DL_OK;
                for (r = 0; ok && r < b; r++) {
                    int s = (int)hx[2 * r];
                    seen[s]++;
                    for (k = 0; k < (tk == 0 ? 3 : 1); k++)
                        ok = ok && hy[r * (tk == 0 ? 3 : 1) + k] == 100.0f * (float)s + (float)k + 0.25f;
                }
                nb++;
                dl_step_end(ctx);
            }
            for (i = 0; i < 10; i++) ok = ok && seen[i] == 1;
            CHECK(l && ok && nb == 3, "float targets %s, %d workers: each batch's y rows are its samples' (%d "
                  "batches): %s", tk ? "(10)" : "(10, 3)", w, nb, dl_error_message(ctx));
        }
    {   /* a dataset of its own: get_target, target_shape (2) */
        dl_dataset ds;
        dl_loader_desc d;
        dl_loader *l;
        dl_tensor *bx, *by;
        float hy[6];
        memset(&ds, 0, sizeof ds);
        ds.length = 3;
        ds.sample_shape = DL_SHAPE(1);
        ds.target_shape = DL_SHAPE(2);
        ds.get_target = own_get_t;
        memset(&d, 0, sizeof d);
        d.batch_size = 3;
        l = dl_loader_new(ctx, &ds, &d);
        CHECK(l && dl_loader_next(l, &bx, &by) == 1 && by->ndim == 2 && by->shape[0] == 3 && by->shape[1] == 2 &&
              dl_read(by, hy, 6) == DL_OK && hy[0] == 0.0f && hy[1] == 0.0f && hy[2] == 0.5f && hy[3] == -1.0f &&
              hy[4] == 1.0f && hy[5] == -2.0f, "get_target: y (3, 2) in order: %s", dl_error_message(ctx));
        dl_step_end(ctx);
        ds.length = 6;   /* sample 5 fails */
        l = dl_loader_new(ctx, &ds, &d);
        CHECK(l && dl_loader_next(l, &bx, &by) == 1 && dl_loader_next(l, &bx, &by) == -1, "a failing get_target");
        EXPECT_ERR(ctx, DL_ERR_IO, "dl_loader_next: the dataset's get_target failed for sample 5");
        dl_step_end(ctx);
        ds.length = 3;
        ds.get = own_get;   /* both */
        CHECK(dl_loader_new(ctx, &ds, &d) == NULL, "get and get_target");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_loader_new: the dataset has both get and get_target");
        ds.get = NULL;
        ds.get_target = NULL;   /* neither */
        CHECK(dl_loader_new(ctx, &ds, &d) == NULL, "no get function");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_loader_new: the dataset has no get or get_target function (length 3)");
        ds.get_target = own_get_t;
        ds.target_shape.ndim = DL_MAX_DIMS;
        CHECK(dl_loader_new(ctx, &ds, &d) == NULL, "target_shape of DL_MAX_DIMS dims");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_loader_new: the dataset's target_shape has ndim");
        ds.target_shape = DL_SHAPE(-1);
        CHECK(dl_loader_new(ctx, &ds, &d) == NULL, "target_shape (-1)");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_loader_new: the dataset's target_shape dim 0 is -1; each dim must be >= 0 "
                   "and a target under 2^60 elements");
        ds.target_shape = DL_SHAPE(2);
        d.device_data = true;
        CHECK(dl_loader_new(ctx, &ds, &d) == NULL, "device_data with float targets");
        EXPECT_ERR(ctx, DL_ERR_ARG, "dl_loader_new: device_data takes class labels, and this dataset has float "
                   "targets (get_target): load it with device_data false");
    }
    {   /* shapes dl_tensor_dataset refuses */
        dl_tensor *x = dl_keep(dl_zeros(ctx, DL_SHAPE(4, 2))), *y9 = dl_keep(dl_zeros(ctx, DL_SHAPE(3, 2)));
        int64_t lv[8] = {0, 1, 2, 3, 0, 1, 2, 3};
        dl_tensor *l2 = dl_keep(dl_from_int64(ctx, DL_SHAPE(4, 2), lv));
        CHECK(dl_tensor_dataset(ctx, x, y9, NULL, false) == NULL, "float y of 3 rows for 4 samples");
        EXPECT_ERR(ctx, DL_ERR_SHAPE, "dl_tensor_dataset: x has 4 samples (4,2) but y has 3 labels (3,2)");
        CHECK(dl_tensor_dataset(ctx, x, l2, NULL, false) == NULL, "int labels (4, 2)");
        EXPECT_ERR(ctx, DL_ERR_SHAPE, "dl_tensor_dataset: x (4,2) and y (4,2): need x (N, ...) and y (N) class "
                   "labels or y (N, ...) float32 targets");
    }
}

int main(void)
{
    dl_ctx_desc d;
    memset(&d, 0, sizeof d);
    d.log = dl_log_silent;
    ctx = dl_ctx_init(&d);
    test_idx();
    test_loader();
    test_device_loader();
    test_device_loader_custom();
    test_float_targets();
    dl_ctx_free(ctx);
    TEST_END();
}
