/* --- data */
/* Read an IDX file ((Fashion-)MNIST format) into a persistent tensor with
   the file's dims, converted to float32 (images: raw 0..255 values) or int64
   (labels). Checks magic, type code, dims and the file size before reading;
   gzip files need -DDL_ZLIB (link -lz); otherwise the error says to gunzip. */
DL_API dl_result dl_idx_load(dl_ctx *ctx, const char *path, dl_dtype as, dl_tensor **out);

/* Per-sample transform of an image dataset: x = (raw * scale - mean) / std,
   then (training only) a random horizontal flip and a random crop after zero
   padding by crop_padding. scale 0 means 1; std 0 means 1. */
typedef struct dl_transform_desc {
    float scale, mean, std;
    bool hflip;
    int64_t crop_padding;
} dl_transform_desc;

/* A dataset: length, the shape of one sample, and a get function that fills
   one sample's floats and its label. get may be called from worker threads
   at once for different indices; rng is a per-sample seeded generator for
   augmentation (the same sample position gets the same numbers whatever the
   worker count). */
typedef struct dl_dataset dl_dataset;
struct dl_dataset {
    int64_t length;
    dl_shape sample_shape;
    dl_result (*get)(const dl_dataset *ds, int64_t index, float *x, int64_t *y, uint64_t rng[4]);
    void *user;
};
/* A dataset over x (N, ...) float32 and y (N) int64 persistent tensors,
   with an optional transform (NULL: none); augmentation only when train. */
DL_API dl_dataset *dl_tensor_dataset(dl_ctx *ctx, dl_tensor *x, dl_tensor *y,
                                     const dl_transform_desc *t, bool train);

typedef struct dl_loader_desc {
    int64_t batch_size;     /* 0: 1 */
    bool shuffle;
    bool drop_last;
    int num_workers;        /* threads preparing the next batch (0: in the caller) */
    uint64_t seed;          /* shuffling and augmentation (0: 1) */
} dl_loader_desc;
typedef struct dl_loader dl_loader;
DL_API dl_loader *dl_loader_new(dl_ctx *ctx, const dl_dataset *ds, const dl_loader_desc *d);
/* The next minibatch as step tensors x (B, sample...) and y (B) int64;
   false at the end of an epoch (the next call starts the next epoch, with a
   new order) or on error (dl_last_error tells). */
DL_API bool dl_loader_next(dl_loader *l, dl_tensor **x, dl_tensor **y);
DL_API int64_t dl_loader_num_batches(const dl_loader *l);
DL_API int64_t dl_loader_epoch(const dl_loader *l);   /* epochs started so far */
