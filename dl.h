/* dl.h - v0.1 - a deep-learning library in one C header: tensors, dynamic-tape
   autograd, layers, optimizers.                         public domain / MIT-0

   Do this:
       #define DL_IMPLEMENTATION
   before you include this file in *one* C (or C++) file to create the
   implementation. Every other file includes it without the define.

   QUICK START (compiled and run by tests/test_quickstart.c)

       #define DL_IMPLEMENTATION
       #include "dl.h"
       #include <stdio.h>
       int main(void) {
           dl_ctx *ctx = dl_ctx_init(NULL);              // NULL: defaults
           dl_tensor *w = dl_keep(dl_randn(ctx, DL_SHAPE(3, 1)));  // persistent
           dl_requires_grad(w, true);
           for (int step = 0; step < 100; step++) {
               dl_tensor *x = dl_randn(ctx, DL_SHAPE(16, 3));   // step memory
               dl_tensor *y = dl_sum(x, DL_DIMS(1), true);      // target: row sums
               dl_tensor *d = dl_sub(dl_matmul(x, w), y);
               dl_tensor *loss = dl_mean(dl_mul(d, d), DL_ALL, false);
               if (!loss) { fprintf(stderr, "%s\n", dl_error_message(ctx)); break; }
               dl_backward(loss);                             // grads land in w->grad
               dl_sgd_update(w, 0.1f);                        // w -= 0.1 * grad; grad = 0
               if (step % 20 == 0) printf("step %d loss %.5f\n", step, dl_item(loss));
               dl_step_end(ctx);                              // frees all step memory: O(1)
           }
           dl_ctx_free(ctx);                                  // frees everything
           return 0;
       }

   BUILD FLAGS (define before including, in every file that includes dl.h)
       DL_IMPLEMENTATION   emit the implementation (one translation unit)
       DL_OPENBLAS         matrix products through cblas_sgemm (link -lopenblas)
       DL_NO_THREADS       single-threaded build (no pthreads)
       DL_ABORT_ON_ERROR   trap at the first error (for a debugger)
       DL_MALLOC/DL_REALLOC/DL_FREE   host allocator (define all three or none)
       DL_ASSERT(x)        internal invariants (default: assert)
       DL_MAX_DIMS         most dimensions a tensor may have (default 8)
       DL_API              storage class of the public functions (default extern)

   CONCEPTS
     Tensors. float32 values (int32/int64 for labels and indices), contiguous
       row-major. Shapes are passed as a dl_shape value: DL_SHAPE(2, 3, 4).
       reshape/flatten/squeeze/unsqueeze are views sharing storage;
       permute/transpose/narrow/cat copy. Elementwise binary ops broadcast as
       NumPy/PyTorch do.
     Context and memory. A dl_ctx owns everything. Tensors made by ops and
       creators live in *step memory*, released all at once (O(1)) by
       dl_step_end(); the blocks are kept, so a steady loop stops calling
       malloc after its first step. dl_keep() copies a tensor into *persistent*
       memory (parameters, optimizer state, datasets), freed by dl_free() or
       dl_ctx_free(). Using a step tensor after its step ended is an error,
       detected (it is never a read of recycled memory) at least through the
       next step; see "DOES NOT" for older ones.
     Tape and backward. An op records a tape node when an input requires grad
       and grad mode is on. dl_backward(loss) walks the tape in reverse
       creation order and accumulates gradients into leaves' ->grad, then
       releases the graph (retain_graph keeps it). Backward rules are written
       with dl.h's own ops, so create_graph gives gradients of gradients.
     Devices. A tensor lives on one device; ops never move data implicitly.
     Errors. An op given bad input returns NULL and records one message that
       names the op, the operands and the rule; an op given NULL returns NULL
       silently, so a whole forward pass needs one check. Calls that return
       no tensor return a dl_result. Messages also go to a log callback
       (default: stderr).

   DOES NOT
     - do in-place ops on tensors in a graph (except the documented updates
       of persistent tensors: gradients, optimizer steps);
     - detect use of a step tensor held for two or more dl_step_end() calls
       (its header memory is reused by then; the first later step is checked);
     - support float64 or float16 (yet).
*/
#ifndef DL_H
#define DL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifndef DL_MAX_DIMS
#define DL_MAX_DIMS 8
#endif
#ifndef DL_API
#define DL_API extern
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ types */

typedef enum dl_result {
    DL_OK = 0,
    DL_ERR_ARG,          /* bad argument: NULL where not allowed, out-of-range dim */
    DL_ERR_SHAPE,        /* shapes do not fit the op's rule */
    DL_ERR_DTYPE,        /* wrong dtype for the op */
    DL_ERR_DEVICE,       /* operands on different devices, or device missing */
    DL_ERR_STALE,        /* tensor used after the step that made it ended */
    DL_ERR_GRAPH,        /* autograd misuse: freed graph, no grad, ... */
    DL_ERR_OOM,          /* allocation failed, or size overflow, or memory limit */
    DL_ERR_IO,           /* file could not be opened, read or written */
    DL_ERR_FORMAT,       /* file contents are malformed */
    DL_ERR_NAN,          /* anomaly mode found NaN/Inf */
    DL_ERR_UNSUPPORTED   /* valid request this build cannot do */
} dl_result;

typedef enum dl_dtype { DL_DTYPE_F32 = 0, DL_DTYPE_I32, DL_DTYPE_I64 } dl_dtype;
typedef enum dl_device_type { DL_DEVICE_CPU = 0, DL_DEVICE_CUDA } dl_device_type;
typedef struct dl_device { int type; int index; } dl_device;

/* A shape (or a list of dims) by value: DL_SHAPE(2, 3), DL_DIMS(0, -1). */
typedef struct dl_shape { int ndim; int64_t d[DL_MAX_DIMS]; } dl_shape;

#define DL__NARG(...) DL__NARG_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define DL__NARG_(a1, a2, a3, a4, a5, a6, a7, a8, n, ...) n
#ifdef __cplusplus
#define DL_SHAPE(...) (dl_shape{DL__NARG(__VA_ARGS__), {__VA_ARGS__}})
#else
#define DL_SHAPE(...) ((dl_shape){DL__NARG(__VA_ARGS__), {__VA_ARGS__}})
#endif
#define DL_DIMS(...) DL_SHAPE(__VA_ARGS__)
#define DL_ALL dl_dims_all()      /* reduce over every dim */

typedef struct dl_ctx dl_ctx;
typedef struct dl_tensor dl_tensor;
typedef struct dl__node dl__node;

/* A tensor. Fields above the line are public and read-only; use the
   functions to change anything. */
struct dl_tensor {
    int ndim;
    int64_t shape[DL_MAX_DIMS];
    int64_t numel;
    dl_dtype dtype;
    dl_device device;
    void *data;               /* host pointer on the CPU, device pointer on a GPU */
    bool requires_grad;
    dl_tensor *grad;          /* leaves: accumulated gradient (NULL until first) */
    char name[32];            /* optional label, shown by dl_graph_dot */
    /* ---- private bookkeeping ---- */
    uint32_t magic_;
    bool owns_;               /* persistent and owns its data */
    dl_ctx *ctx_;
    dl__node *node_;          /* the tape node that made it; NULL for leaves */
    uint64_t step_;           /* step it was made in; 0 = persistent */
    dl_tensor *pnext_, *pprev_; /* list of persistent tensors */
};

typedef void (*dl_log_fn)(void *user, const char *message);

/* Context settings; zero means default for every field. */
typedef struct dl_ctx_desc {
    uint64_t seed;            /* RNG seed (0: 0x5eed) */
    int num_threads;          /* kernel threads (0: number of cores) */
    size_t memory_limit;      /* bytes per device (0: no limit) */
    dl_log_fn log;            /* error log (NULL: stderr; dl_log_silent: none) */
    void *log_user;
} dl_ctx_desc;

typedef struct dl_memory_stats {
    size_t persistent_bytes;  /* live persistent tensor data + headers */
    size_t step_bytes;        /* step memory handed out in the current step */
    size_t step_reserved;     /* step memory blocks held for reuse */
    size_t peak_bytes;        /* peak of persistent_bytes + step_bytes */
    uint64_t alloc_calls;     /* calls to the device allocator so far */
} dl_memory_stats;

/* --- context */
DL_API dl_ctx *dl_ctx_init(const dl_ctx_desc *desc);  /* NULL on OOM */
DL_API void dl_ctx_free(dl_ctx *ctx);                  /* frees every tensor; NULL ok */
DL_API void dl_step_end(dl_ctx *ctx);       /* release all step memory and the tape: O(1) */
DL_API uint64_t dl_step(const dl_ctx *ctx); /* current step number (starts at 1) */
DL_API void dl_manual_seed(dl_ctx *ctx, uint64_t seed);
DL_API dl_result dl_set_num_threads(dl_ctx *ctx, int n);  /* 0: cores */
DL_API int dl_num_threads(const dl_ctx *ctx);
DL_API dl_result dl_memory_stats_get(dl_ctx *ctx, dl_device dev, dl_memory_stats *out);
DL_API dl_device dl_cpu(void);
DL_API dl_device dl_cuda(int index);
DL_API dl_ctx *dl_tensor_ctx(const dl_tensor *t);

/* --- errors */
DL_API dl_result dl_last_error(const dl_ctx *ctx);     /* DL_OK when none */
DL_API const char *dl_error_message(const dl_ctx *ctx); /* "" when none */
DL_API void dl_clear_error(dl_ctx *ctx);
DL_API const char *dl_result_string(dl_result r);       /* "DL_ERR_SHAPE" ... */
DL_API void dl_set_log(dl_ctx *ctx, dl_log_fn fn, void *user);
DL_API void dl_log_silent(void *user, const char *message);  /* a log that drops */

/* --- tensors: creation (step memory, on the CPU) */
DL_API dl_shape dl_shape_make(int ndim, const int64_t *dims);
DL_API dl_shape dl_dims_all(void);
DL_API dl_tensor *dl_empty(dl_ctx *ctx, dl_shape shape);           /* uninitialized */
DL_API dl_tensor *dl_zeros(dl_ctx *ctx, dl_shape shape);
DL_API dl_tensor *dl_ones(dl_ctx *ctx, dl_shape shape);
DL_API dl_tensor *dl_full(dl_ctx *ctx, dl_shape shape, float value);
DL_API dl_tensor *dl_arange(dl_ctx *ctx, float start, float end, float step); /* [start,end) */
DL_API dl_tensor *dl_rand(dl_ctx *ctx, dl_shape shape);            /* U[0,1) */
DL_API dl_tensor *dl_randn(dl_ctx *ctx, dl_shape shape);           /* N(0,1) */
DL_API dl_tensor *dl_from_array(dl_ctx *ctx, dl_shape shape, const float *values);  /* copies */
DL_API dl_tensor *dl_from_int64(dl_ctx *ctx, dl_shape shape, const int64_t *values);
DL_API dl_tensor *dl_from_int32(dl_ctx *ctx, dl_shape shape, const int32_t *values);
DL_API dl_tensor *dl_zeros_like(dl_tensor *t);
DL_API dl_tensor *dl_ones_like(dl_tensor *t);
DL_API dl_tensor *dl_copy(dl_tensor *t);      /* new storage; differentiable (clone) */
DL_API dl_tensor *dl_keep(dl_tensor *t);      /* persistent copy, no history, requires_grad off */
DL_API void dl_free(dl_tensor *t);            /* persistent tensors only; NULL ok */
DL_API dl_tensor *dl_to(dl_tensor *t, dl_device dev);   /* copy to a device; differentiable */
DL_API dl_tensor *dl_set_name(dl_tensor *t, const char *name); /* returns t */

/* --- tensors: reading back */
DL_API float dl_item(dl_tensor *t);           /* the one element; NaN + error otherwise */
DL_API dl_result dl_read(dl_tensor *t, float *dst, int64_t n);   /* n must equal numel */
DL_API dl_result dl_read_int64(dl_tensor *t, int64_t *dst, int64_t n);
DL_API float *dl_data(dl_tensor *t);          /* CPU float32 data, else NULL + error */
DL_API int64_t dl_size(const dl_tensor *t, int dim);  /* negative dims count from the end */
DL_API bool dl_same_shape(const dl_tensor *a, const dl_tensor *b);
DL_API void dl_print(dl_tensor *t);           /* shape and (up to 64) values to stdout */

/* --- ops: shape (views share storage; the rest copy). Dims may be negative. */
DL_API dl_tensor *dl_reshape(dl_tensor *t, dl_shape shape);   /* one dim may be -1 */
DL_API dl_tensor *dl_flatten(dl_tensor *t, int start_dim, int end_dim);
DL_API dl_tensor *dl_squeeze(dl_tensor *t, int dim);          /* drop a size-1 dim */
DL_API dl_tensor *dl_unsqueeze(dl_tensor *t, int dim);        /* insert a size-1 dim */
DL_API dl_tensor *dl_permute(dl_tensor *t, dl_shape perm);
DL_API dl_tensor *dl_transpose(dl_tensor *t, int dim0, int dim1);
DL_API dl_tensor *dl_narrow(dl_tensor *t, int dim, int64_t start, int64_t length);
DL_API dl_tensor *dl_cat(int n, dl_tensor *const *ts, int dim);
DL_API dl_tensor *dl_stack(int n, dl_tensor *const *ts, int dim);
DL_API dl_tensor *dl_expand(dl_tensor *t, dl_shape shape);    /* broadcast to shape (copies) */
DL_API dl_tensor *dl_sum_to(dl_tensor *t, dl_shape shape);    /* sum broadcast dims away */

/* --- ops: elementwise, NumPy broadcasting */
DL_API dl_tensor *dl_add(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_sub(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_mul(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_div(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_maximum(dl_tensor *a, dl_tensor *b);   /* ties split the grad */
DL_API dl_tensor *dl_minimum(dl_tensor *a, dl_tensor *b);
DL_API dl_tensor *dl_add_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_sub_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_mul_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_div_scalar(dl_tensor *a, float s);
DL_API dl_tensor *dl_rsub_scalar(dl_tensor *a, float s);     /* s - a */
DL_API dl_tensor *dl_pow(dl_tensor *a, float exponent);
DL_API dl_tensor *dl_neg(dl_tensor *a);
DL_API dl_tensor *dl_exp(dl_tensor *a);
DL_API dl_tensor *dl_log(dl_tensor *a);
DL_API dl_tensor *dl_sqrt(dl_tensor *a);
DL_API dl_tensor *dl_abs(dl_tensor *a);
DL_API dl_tensor *dl_erf(dl_tensor *a);
DL_API dl_tensor *dl_clamp(dl_tensor *a, float lo, float hi);  /* grad 1 on [lo,hi] */
DL_API dl_tensor *dl_relu(dl_tensor *a);
DL_API dl_tensor *dl_leaky_relu(dl_tensor *a, float negative_slope);
DL_API dl_tensor *dl_sigmoid(dl_tensor *a);
DL_API dl_tensor *dl_tanh(dl_tensor *a);
DL_API dl_tensor *dl_gelu(dl_tensor *a);      /* x * Phi(x), erf form (PyTorch default) */

/* --- ops: reductions. dims: DL_DIMS(...) or DL_ALL; keepdim keeps size-1 dims */
DL_API dl_tensor *dl_sum(dl_tensor *t, dl_shape dims, bool keepdim);
DL_API dl_tensor *dl_mean(dl_tensor *t, dl_shape dims, bool keepdim);
DL_API dl_tensor *dl_max(dl_tensor *t, dl_shape dims, bool keepdim); /* one dim: grad to
                                            the arg-max; several: split among ties */
DL_API dl_tensor *dl_min(dl_tensor *t, dl_shape dims, bool keepdim);
DL_API dl_tensor *dl_var(dl_tensor *t, dl_shape dims, int correction, bool keepdim);
                                            /* correction 1: unbiased (PyTorch default) */
DL_API dl_tensor *dl_argmax(dl_tensor *t, int dim, bool keepdim);  /* int64, first max */

/* --- ops: linear algebra and softmax */
DL_API dl_tensor *dl_matmul(dl_tensor *a, dl_tensor *b);  /* torch.matmul rules */
DL_API dl_tensor *dl_softmax(dl_tensor *t, int dim);
DL_API dl_tensor *dl_log_softmax(dl_tensor *t, int dim);

/* --- autograd */
typedef struct dl_backward_desc {
    dl_tensor *grad;        /* seed gradient (NULL: ones; output must be one element) */
    bool retain_graph;      /* keep the graph for another backward */
    bool create_graph;      /* record the backward itself (higher-order grads);
                               implies retain_graph */
} dl_backward_desc;

DL_API dl_tensor *dl_requires_grad(dl_tensor *t, bool on);  /* leaves only; returns t */
DL_API dl_result dl_backward(dl_tensor *loss);
DL_API dl_result dl_backward_ex(dl_tensor *out, const dl_backward_desc *desc);
/* torch.autograd.grad: d out / d inputs[i] into grads[i] (NULL where out does not
   depend on it); leaves' ->grad untouched. With create_graph the results carry
   history (differentiate them again). */
DL_API dl_result dl_grad(dl_tensor *out, int n, dl_tensor *const *inputs,
                         dl_tensor **grads, const dl_backward_desc *desc);
DL_API void dl_zero_grad(dl_tensor *t);          /* grad = 0 (kept allocated) */
DL_API dl_tensor *dl_detach(dl_tensor *t);       /* shares data, no history */
DL_API void dl_no_grad_begin(dl_ctx *ctx);       /* nestable, as torch.no_grad() */
DL_API void dl_no_grad_end(dl_ctx *ctx);
DL_API bool dl_is_grad_enabled(const dl_ctx *ctx);
DL_API void dl_sgd_update(dl_tensor *param, float lr);  /* p -= lr*grad; grad = 0 */

/* Custom differentiable functions, as torch.autograd.Function.
   forward runs with grad mode off and may save tensors with dl_fn_save;
   backward gets the output gradient and fills grad_inputs[i] (leave NULL for
   inputs without a gradient). It runs with grad mode on only under
   create_graph, so writing it with dl.h ops gives higher-order grads. */
typedef struct dl_fn_ctx dl_fn_ctx;
typedef struct dl_function {
    const char *name;
    dl_tensor *(*forward)(dl_fn_ctx *fc, int n, dl_tensor *const *inputs, void *user);
    dl_result (*backward)(dl_fn_ctx *fc, dl_tensor *grad_out, dl_tensor **grad_inputs,
                          void *user);
} dl_function;
DL_API dl_tensor *dl_function_apply(const dl_function *fn, int n, dl_tensor *const *inputs,
                                    void *user);
DL_API void dl_fn_save(dl_fn_ctx *fc, dl_tensor *t);         /* up to 8 tensors */
DL_API dl_tensor *dl_fn_saved(dl_fn_ctx *fc, int i);
DL_API bool dl_fn_needs_grad(dl_fn_ctx *fc, int i);          /* input i wants a grad */

/* --- debug */
#define DL_GRADCHECK_MAX_INPUTS 8
typedef dl_tensor *(*dl_gradcheck_fn)(void *user, dl_tensor *const *inputs);
typedef struct dl_gradcheck_desc {
    double eps;             /* finite-difference step (0: 1e-3) */
    double atol, rtol;      /* pass when |analytic-numeric| <= atol + rtol*|numeric|
                               (0: 1e-3, 1e-2) */
    uint64_t seed;          /* projection vector seed (0: 1) */
} dl_gradcheck_desc;
typedef struct dl_gradcheck_result {
    int n;                                      /* inputs */
    double max_abs_err[DL_GRADCHECK_MAX_INPUTS];
    double max_rel_err[DL_GRADCHECK_MAX_INPUTS]; /* |a-n|/max(|a|,|n|) where either > atol */
    int64_t worst_index[DL_GRADCHECK_MAX_INPUTS];
    bool ok;
} dl_gradcheck_result;
/* Compares d(sum(f(inputs) * r))/d inputs (r: fixed random) with central
   differences for every element of every input that requires grad. */
DL_API dl_result dl_gradcheck(dl_ctx *ctx, dl_gradcheck_fn f, void *user, int n,
                              dl_tensor *const *inputs, const dl_gradcheck_desc *desc,
                              dl_gradcheck_result *result);
DL_API dl_result dl_graph_dot(dl_tensor *root, const char *path);  /* Graphviz DOT */
DL_API void dl_set_anomaly(dl_ctx *ctx, bool on);  /* NaN/Inf check on every op output */

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

/* parts/nn_ops_decl.h - normalization, dropout and losses (declarations).
   Goes into dl.h's declaration section. Semantics follow torch.nn.functional;
   where they differ it says so below. */
#ifndef DL_NN_OPS_DECL_H
#define DL_NN_OPS_DECL_H
#ifdef __cplusplus
extern "C" {
#endif

/* --- ops: normalization and dropout */

/* Batch normalization of x (N,C) or (N,C,d1,...) per channel C.
   training: normalizes with the batch statistics (mean, biased variance over
     every dim but 1; needs more than one value per channel). If running_mean
     and running_var (C) are given (both or neither) they are updated in place,
     without history: r = (1 - momentum) r + momentum * stat, with the
     UNBIASED batch variance for running_var (as PyTorch). They must not
     require grad.
   eval (training false): normalizes with running_mean/running_var, which
     must be given.
   weight and bias (C) may each be NULL (no scale / no shift).
   y = (x - mean) / sqrt(var + eps) * weight + bias. Differentiable in x,
   weight and bias (and twice: written with dl.h ops). */
DL_API dl_tensor *dl_batch_norm(dl_tensor *x, dl_tensor *running_mean, dl_tensor *running_var,
                                dl_tensor *weight, dl_tensor *bias, bool training,
                                float momentum, float eps);
/* Layer normalization over the last normalized_shape.ndim dims of x, which
   must equal normalized_shape (mean and biased variance over those dims).
   weight and bias have shape normalized_shape, or are NULL. */
DL_API dl_tensor *dl_layer_norm(dl_tensor *x, dl_shape normalized_shape, dl_tensor *weight,
                                dl_tensor *bias, float eps);
/* Inverted dropout: each element is zeroed with probability p and the kept
   ones are scaled by 1/(1-p). The mask comes from the context's RNG
   (dl_manual_seed makes it repeat). Returns x itself when !training or
   p == 0; p == 1 gives zeros (gradient zero); p outside [0,1] is an error. */
DL_API dl_tensor *dl_dropout(dl_tensor *x, float p, bool training);

/* --- ops: losses */

typedef enum dl_reduction {
    DL_REDUCTION_MEAN = 0,    /* mean over elements (weighted mean for class losses) */
    DL_REDUCTION_SUM,
    DL_REDUCTION_NONE         /* per-element (per-sample) losses */
} dl_reduction;

typedef struct dl_loss_desc {
    dl_reduction reduction;
    int64_t ignore_index;     /* targets equal to it add nothing (PyTorch default -100) */
    float label_smoothing;    /* cross entropy only, in [0,1] */
    dl_tensor *weight;        /* optional per-class weights (C), float32 */
} dl_loss_desc;
/* mean reduction, ignore_index -100, no smoothing, no weight */
DL_API dl_loss_desc dl_loss_desc_default(void);

/* Cross entropy = nll_loss(log_softmax(logits, 1), target), as
   F.cross_entropy with class-index targets. logits (N,C) or (N,C,d1,...)
   (also (C) with a 0-d target); target int64 or int32, (N) or (N,d1,...),
   values in [0,C) or ignore_index (anything else is an error).
   Mean reduction divides by the sum of weight[target] over non-ignored
   targets (their count without weights); if every target is ignored the
   mean is NaN, as PyTorch. label_smoothing e gives
   (1-e) * nll + e/C * sum_c(-weight[c] log p_c) (reduced the same way).
   Stable for large logits. Probability (float) targets are not supported.
   The weight tensor gets a gradient if it requires one (PyTorch refuses). */
DL_API dl_tensor *dl_cross_entropy(dl_tensor *logits, dl_tensor *target);   /* defaults */
DL_API dl_tensor *dl_cross_entropy_ex(dl_tensor *logits, dl_tensor *target, const dl_loss_desc *d);
/* Negative log likelihood of log-probabilities (N,C) or (N,C,d1,...);
   targets and options as dl_cross_entropy (label_smoothing must be 0).
   d NULL: defaults. */
DL_API dl_tensor *dl_nll_loss(dl_tensor *log_probs, dl_tensor *target, const dl_loss_desc *d);
/* Elementwise losses. a and b must have the SAME shape (PyTorch broadcasts
   with a warning; dl.h reports DL_ERR_SHAPE). Both are differentiable. */
DL_API dl_tensor *dl_mse_loss(dl_tensor *a, dl_tensor *b, dl_reduction r);   /* (a-b)^2 */
DL_API dl_tensor *dl_l1_loss(dl_tensor *a, dl_tensor *b, dl_reduction r);    /* |a-b| */
/* -(y log sigmoid(x) + (1-y) log(1 - sigmoid(x))), computed stably as
   max(x,0) - x y + log(1 + exp(-|x|)): finite for any |x|. */
DL_API dl_tensor *dl_binary_cross_entropy_with_logits(dl_tensor *x, dl_tensor *y, dl_reduction r);

#ifdef __cplusplus
}
#endif
#endif /* DL_NN_OPS_DECL_H */

/* parts/conv_decl.h - convolution, transposed convolution and pooling:
   public declarations (goes into dl.h's declaration section, after
   "--- ops: linear algebra and softmax").

   Layouts are PyTorch's: channels first, row-major. Every function takes a
   batched input (N,C,spatial...) or an unbatched one (C,spatial...), which
   gives an unbatched result. Output sizes follow torch.nn.functional
   exactly (floor division; ceil_mode as PyTorch: the last window must start
   inside the input or the left padding). All of them are differentiable to
   any order (their backward rules are written with these same ops). */
#ifndef DL_CONV_DECL_H
#define DL_CONV_DECL_H

#ifdef __cplusplus
extern "C" {
#endif

#define DL_MAX_SPATIAL 3

/* --- ops: convolution. Zero means default for every field. */
typedef struct dl_conv_desc {
    int64_t stride[DL_MAX_SPATIAL];          /* 0: 1 */
    int64_t padding[DL_MAX_SPATIAL];         /* zero padding on each side */
    int64_t dilation[DL_MAX_SPATIAL];        /* 0: 1 */
    int64_t output_padding[DL_MAX_SPATIAL];  /* transposed conv only: extra size on the
                                                right; must be < stride or < dilation */
    int64_t groups;                          /* 0: 1 */
    bool padding_same;                       /* PyTorch padding='same': output size = input
                                                size (stride 1 only; padding[] ignored; odd
                                                total padding puts the extra on the right) */
} dl_conv_desc;

/* The same stride, padding and dilation in every spatial dim (0: default). */
DL_API dl_conv_desc dl_conv_desc_make(int64_t stride, int64_t padding, int64_t dilation,
                                      int64_t groups);

/* y = cross-correlation of x with w, plus b, as torch.nn.functional.conv*d.
   x (N,C,L) / (N,C,H,W) / (N,C,D,H,W); w (OC, C/groups, k...); b (OC) or NULL;
   d NULL: stride 1, no padding. y (N, OC, out...) with
   out = (in + 2*padding - dilation*(k-1) - 1) / stride + 1. */
DL_API dl_tensor *dl_conv1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);

/* Transposed convolution (the input gradient of conv*d), as
   torch.nn.functional.conv_transpose*d. x (N, C_in, in...);
   w (C_in, OC/groups, k...); b (OC) or NULL; y (N, OC, out...) with
   out = (in-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1. */
DL_API dl_tensor *dl_conv_transpose1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv_transpose2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);
DL_API dl_tensor *dl_conv_transpose3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d);

/* --- ops: pooling */
typedef struct dl_pool_desc {
    int64_t kernel[DL_MAX_SPATIAL];   /* required, >= 1 */
    int64_t stride[DL_MAX_SPATIAL];   /* 0: = kernel */
    int64_t padding[DL_MAX_SPATIAL];  /* each side, at most kernel/2 (max: -inf, avg: zeros) */
    int64_t dilation[DL_MAX_SPATIAL]; /* 0: 1 (max pooling only) */
    bool ceil_mode;                   /* ceil instead of floor in the output size */
    bool count_include_pad;           /* avg: divide by the window including padding.
                                         A zeroed desc has it false: dl_pool_desc_make
                                         sets it true, PyTorch's default */
} dl_pool_desc;

/* kernel, stride (0: = kernel) and padding in every spatial dim; dilation 1,
   ceil_mode false, count_include_pad true. */
DL_API dl_pool_desc dl_pool_desc_make(int64_t kernel, int64_t stride, int64_t padding);

/* y = max over each (dilated) window, as torch.nn.functional.max_pool*d.
   x (N,C,spatial...) -> y (N,C,out...), out = (in + 2*padding -
   dilation*(kernel-1) - 1) / stride + 1 (ceil with ceil_mode). The gradient
   goes to the first maximum of each window (NaN wins). */
DL_API dl_tensor *dl_max_pool1d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_max_pool2d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_max_pool3d(dl_tensor *x, const dl_pool_desc *d);

/* y = mean over each window, as torch.nn.functional.avg_pool*d: divisor
   = window size including padding (count_include_pad) or only the elements
   inside x; a ceil_mode window that passes the right padding is clipped. */
DL_API dl_tensor *dl_avg_pool1d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_avg_pool2d(dl_tensor *x, const dl_pool_desc *d);
DL_API dl_tensor *dl_avg_pool3d(dl_tensor *x, const dl_pool_desc *d);

/* Adaptive average pooling to output_size (one entry per spatial dim, >= 0):
   window i of a dim of size L covers [floor(i*L/out), ceil((i+1)*L/out)).
   dl_adaptive_avg_pool2d(x, DL_SHAPE(1, 1)) is global average pooling. */
DL_API dl_tensor *dl_adaptive_avg_pool1d(dl_tensor *x, dl_shape output_size);
DL_API dl_tensor *dl_adaptive_avg_pool2d(dl_tensor *x, dl_shape output_size);
DL_API dl_tensor *dl_adaptive_avg_pool3d(dl_tensor *x, dl_shape output_size);

#ifdef __cplusplus
}
#endif
#endif /* DL_CONV_DECL_H */

#ifdef __cplusplus
}
#endif
#endif /* DL_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#ifdef DL_IMPLEMENTATION
#ifndef DL__IMPLEMENTED
#define DL__IMPLEMENTED

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdarg.h>
#include <float.h>
#include <assert.h>
#ifndef DL_NO_THREADS
#include <pthread.h>
#include <unistd.h>
#endif
#ifdef DL_OPENBLAS
#include <cblas.h>
#endif

#if defined(DL_MALLOC) && defined(DL_REALLOC) && defined(DL_FREE)
#elif !defined(DL_MALLOC) && !defined(DL_REALLOC) && !defined(DL_FREE)
#define DL_MALLOC(sz) malloc(sz)
#define DL_REALLOC(p, sz) realloc(p, sz)
#define DL_FREE(p) free(p)
#else
#error "dl.h: define all of DL_MALLOC, DL_REALLOC and DL_FREE, or none of them"
#endif
#ifndef DL_ASSERT
#define DL_ASSERT(x) assert(x)
#endif
#if DL_MAX_DIMS < 4 || DL_MAX_DIMS > 16
#error "dl.h: DL_MAX_DIMS must be between 4 and 16"
#endif
#if defined(__GNUC__)
#define DL__UNUSED __attribute__((unused))
#else
#define DL__UNUSED
#endif

#define DL__MAGIC 0x444c5431u
#define DL__NSAVED 8

// >>section threads and gemm
/* A small persistent thread pool splits kernels into contiguous chunks;
   each output element is computed by one thread in a fixed order, so results
   do not depend on the thread count. The matrix product packs panels of A and
   B into contiguous buffers (BLIS-style blocking) and runs a register-tiled
   micro-kernel over them. */
/* ---------------------------------------------------------------------------
 * dl.h fragment: thread pool + packed, cache-blocked SGEMM (row-major).
 *
 * Requires (included by dl.h before this point):
 *   <stdint.h> <stddef.h> <stdbool.h> <string.h> <stdlib.h> <math.h>
 *   and unless DL_NO_THREADS: <pthread.h> <unistd.h>
 *   DL_MALLOC(sz) / DL_FREE(p)
 * ------------------------------------------------------------------------- */

#ifndef DL__UNUSED
#if defined(__GNUC__)
#define DL__UNUSED __attribute__((unused))
#else
#define DL__UNUSED
#endif
#endif

#ifndef DL__RESTRICT
#if defined(__GNUC__) || defined(_MSC_VER)
#define DL__RESTRICT __restrict
#else
#define DL__RESTRICT
#endif
#endif

/* ===========================================================================
 * Thread pool
 * ========================================================================= */

typedef void (*dl__task_fn)(void *arg, int64_t begin, int64_t end); /* [begin,end) */
typedef struct dl__pool dl__pool;

#ifndef DL_NO_THREADS
typedef struct dl__pool_worker {
    dl__pool *pool;
    int index;                 /* 1..nthreads-1 (0 is the caller) */
} dl__pool_worker;
#endif

struct dl__pool {
    int nthreads;              /* threads including the caller */
#ifndef DL_NO_THREADS
    pthread_t *threads;        /* nthreads-1 workers */
    dl__pool_worker *workers;
    int nstarted;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;
    uint64_t generation;       /* bumped for every job */
    int pending;               /* worker chunks not yet finished */
    int stop;
    int busy;                  /* a parallel_for is in flight */
    /* current job */
    dl__task_fn fn;
    void *arg;
    int64_t n;
    int64_t chunk;
    int64_t nchunks;
#endif
};

/* Deterministic split of [0,n) into contiguous chunks of size *chunk.
   Returns the number of chunks (>= 1 when n > 0, 0 when n <= 0).
   Depends only on n, grain and nthreads. */
static DL__UNUSED int64_t dl__split(int64_t n, int64_t grain, int nthreads, int64_t *chunk)
{
    int64_t nch, ch;
    if (n <= 0) {
        *chunk = 1;
        return 0;
    }
    if (grain < 1) grain = 1;
    if (nthreads < 1) nthreads = 1;
    nch = n / grain;
    if (nch > (int64_t)nthreads) nch = (int64_t)nthreads;
    if (nch < 1) nch = 1;
    ch = (n + nch - 1) / nch;
    nch = (n + ch - 1) / ch;
    *chunk = ch;
    return nch;
}

static DL__UNUSED int dl__pool_size(const dl__pool *p)
{
    return p ? p->nthreads : 1;
}

#ifndef DL_NO_THREADS

static void *dl__pool_worker_main(void *varg)
{
    dl__pool_worker *w = (dl__pool_worker *)varg;
    dl__pool *p = w->pool;
    uint64_t seen = 0; /* generation starts at 0 in dl__pool_create, so a
                          late-starting worker still sees the first job */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        dl__task_fn fn;
        void *arg;
        int64_t b, e;
        while (p->generation == seen && !p->stop)
            pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        if ((int64_t)w->index >= p->nchunks) continue;
        fn = p->fn;
        arg = p->arg;
        b = (int64_t)w->index * p->chunk;
        e = b + p->chunk;
        if (e > p->n) e = p->n;
        pthread_mutex_unlock(&p->mu);
        fn(arg, b, e);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static DL__UNUSED void dl__pool_destroy(dl__pool *p)
{
    int i;
    if (!p) return;
    if (p->nstarted > 0 || p->threads) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (i = 0; i < p->nstarted; i++) pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    DL_FREE(p->workers);
    DL_FREE(p->threads);
    DL_FREE(p);
}

static DL__UNUSED dl__pool *dl__pool_create(int nthreads)
{
    dl__pool *p;
    int i;
    if (nthreads <= 0) {
#if defined(_SC_NPROCESSORS_ONLN)
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = nc > 0 ? (nc > 1024 ? 1024 : (int)nc) : 1;
#else
        nthreads = 1;
#endif
    }
    p = (dl__pool *)DL_MALLOC(sizeof(dl__pool));
    if (!p) return NULL;
    memset(p, 0, sizeof(*p));
    p->nthreads = nthreads;
    p->threads = NULL;
    p->workers = NULL;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        DL_FREE(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv_work, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        DL_FREE(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv_done, NULL) != 0) {
        pthread_cond_destroy(&p->cv_work);
        pthread_mutex_destroy(&p->mu);
        DL_FREE(p);
        return NULL;
    }
    if (nthreads > 1) {
        p->threads = (pthread_t *)DL_MALLOC(sizeof(pthread_t) * (size_t)(nthreads - 1));
        p->workers = (dl__pool_worker *)DL_MALLOC(sizeof(dl__pool_worker) * (size_t)(nthreads - 1));
        if (!p->threads || !p->workers) {
            dl__pool_destroy(p);
            return NULL;
        }
        for (i = 0; i < nthreads - 1; i++) {
            p->workers[i].pool = p;
            p->workers[i].index = i + 1;
            if (pthread_create(&p->threads[i], NULL, dl__pool_worker_main, &p->workers[i]) != 0)
                break;
            p->nstarted++;
        }
        /* if some threads failed to start, shrink the pool */
        p->nthreads = p->nstarted + 1;
    }
    return p;
}

static DL__UNUSED void dl__parallel_for(dl__pool *p, int64_t n, int64_t grain, dl__task_fn fn, void *arg)
{
    int64_t chunk, nch, e0;
    if (n <= 0) return;
    if (!p || p->nthreads <= 1) {
        fn(arg, 0, n);
        return;
    }
    nch = dl__split(n, grain, p->nthreads, &chunk);
    if (nch <= 1) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (p->busy) {
        /* nested call (from inside a task) or concurrent caller: serial */
        pthread_mutex_unlock(&p->mu);
        fn(arg, 0, n);
        return;
    }
    p->busy = 1;
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    p->nchunks = nch;
    p->pending = (int)(nch - 1);
    p->generation++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    e0 = chunk < n ? chunk : n;
    fn(arg, 0, e0);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    p->busy = 0;
    pthread_mutex_unlock(&p->mu);
}

#else /* DL_NO_THREADS */

static DL__UNUSED dl__pool *dl__pool_create(int nthreads)
{
    dl__pool *p = (dl__pool *)DL_MALLOC(sizeof(dl__pool));
    (void)nthreads;
    if (!p) return NULL;
    p->nthreads = 1;
    return p;
}

static DL__UNUSED void dl__pool_destroy(dl__pool *p)
{
    if (p) DL_FREE(p);
}

static DL__UNUSED void dl__parallel_for(dl__pool *p, int64_t n, int64_t grain, dl__task_fn fn, void *arg)
{
    (void)p;
    (void)grain;
    if (n <= 0) return;
    fn(arg, 0, n);
}

#endif /* DL_NO_THREADS */

/* ===========================================================================
 * SGEMM
 * ========================================================================= */

#define DL__GEMM_MR 4
#define DL__GEMM_NR 24
#define DL__GEMM_KC 256
#define DL__GEMM_MC 128   /* multiple of MR */
#define DL__GEMM_NC 3072  /* multiple of NR */
#define DL__GEMM_SMALL 32768.0

/* Fused multiply-add in the micro-kernel when the target has it in hardware
   (strict -std=c99 disables automatic contraction in gcc, halving speed). */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__aarch64__)
#define DL__GEMM_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define DL__GEMM_FMA(a, b, c) ((c) + (a) * (b))
#endif

/* element (i,p) of op(A), element (p,j) of op(B) */
#define DL__OPA(A, lda, ta, i, p) ((ta) ? (A)[(int64_t)(p) * (lda) + (i)] : (A)[(int64_t)(i) * (lda) + (p)])
#define DL__OPB(B, ldb, tb, p, j) ((tb) ? (B)[(int64_t)(j) * (ldb) + (p)] : (B)[(int64_t)(p) * (ldb) + (j)])

/* C := beta*C on an (M,N) block; beta == 0 writes zeros without reading C. */
static void dl__gemm_scale(int64_t M, int64_t N, float beta, float *C, int64_t ldc)
{
    int64_t i, j;
    if (beta == 1.0f) return;
    for (i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f) {
            for (j = 0; j < N; j++) c[j] = 0.0f;
        } else {
            for (j = 0; j < N; j++) c[j] *= beta;
        }
    }
}

/* Simple reference-quality path: small problems and allocation failure. */
static void dl__sgemm_naive(bool transa, bool transb, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                            float beta, float *C, int64_t ldc)
{
    int64_t i, j, p;
    for (i = 0; i < M; i++) {
        float *c = C + i * ldc;
        for (j = 0; j < N; j++) {
            float s = 0.0f;
            for (p = 0; p < K; p++) s += DL__OPA(A, lda, transa, i, p) * DL__OPB(B, ldb, transb, p, j);
            if (beta == 0.0f) c[j] = alpha * s;
            else c[j] = alpha * s + beta * c[j];
        }
    }
}

/* Pack rows [i0, i0+mc) x cols [p0, p0+kc) of op(A) into MR-row slivers:
   sliver s holds dst[s*kc*MR + p*MR + r]; rows beyond mc are zero. */
static void dl__gemm_pack_a(bool transa, const float *A, int64_t lda, int64_t i0, int64_t mc,
                            int64_t p0, int64_t kc, float *DL__RESTRICT dst)
{
    int64_t s, p, r;
    for (s = 0; s < mc; s += DL__GEMM_MR) {
        int64_t mr = mc - s < DL__GEMM_MR ? mc - s : DL__GEMM_MR;
        if (!transa) {
            for (r = 0; r < mr; r++) {
                const float *src = A + (i0 + s + r) * lda + p0;
                for (p = 0; p < kc; p++) dst[p * DL__GEMM_MR + r] = src[p];
            }
            for (r = mr; r < DL__GEMM_MR; r++)
                for (p = 0; p < kc; p++) dst[p * DL__GEMM_MR + r] = 0.0f;
        } else {
            for (p = 0; p < kc; p++) {
                const float *src = A + (p0 + p) * lda + i0 + s;
                float *d = dst + p * DL__GEMM_MR;
                for (r = 0; r < mr; r++) d[r] = src[r];
                for (r = mr; r < DL__GEMM_MR; r++) d[r] = 0.0f;
            }
        }
        dst += kc * DL__GEMM_MR;
    }
}

/* Pack rows [p0, p0+kc) x cols [j0, j0+nc) of op(B) into NR-column slivers:
   sliver s holds dst[s*kc*NR + p*NR + c]; columns beyond nc are zero. */
static void dl__gemm_pack_b(bool transb, const float *B, int64_t ldb, int64_t p0, int64_t kc,
                            int64_t j0, int64_t nc, float *DL__RESTRICT dst)
{
    int64_t s, p, c;
    for (s = 0; s < nc; s += DL__GEMM_NR) {
        int64_t nr = nc - s < DL__GEMM_NR ? nc - s : DL__GEMM_NR;
        if (!transb) {
            for (p = 0; p < kc; p++) {
                const float *src = B + (p0 + p) * ldb + j0 + s;
                float *d = dst + p * DL__GEMM_NR;
                if (nr == DL__GEMM_NR) {
                    for (c = 0; c < DL__GEMM_NR; c++) d[c] = src[c];
                } else {
                    for (c = 0; c < nr; c++) d[c] = src[c];
                    for (c = nr; c < DL__GEMM_NR; c++) d[c] = 0.0f;
                }
            }
        } else {
            for (c = 0; c < nr; c++) {
                const float *src = B + (j0 + s + c) * ldb + p0;
                for (p = 0; p < kc; p++) dst[p * DL__GEMM_NR + c] = src[p];
            }
            for (c = nr; c < DL__GEMM_NR; c++)
                for (p = 0; p < kc; p++) dst[p * DL__GEMM_NR + c] = 0.0f;
        }
        dst += kc * DL__GEMM_NR;
    }
}

/* Micro-kernel: acc(MR,NR) = sum_p a[p*MR+i] * b[p*NR+j], then
   C(mr,nr) = alpha*acc + beta*C (beta == 0: C not read). */
static void dl__gemm_micro(int64_t kc, const float *DL__RESTRICT a, const float *DL__RESTRICT b,
                           float *C, int64_t ldc, int mr, int nr, float alpha, float beta)
{
    float acc[DL__GEMM_MR][DL__GEMM_NR];
    int64_t p;
    int i, j;
    for (i = 0; i < DL__GEMM_MR; i++)
        for (j = 0; j < DL__GEMM_NR; j++) acc[i][j] = 0.0f;
    for (p = 0; p < kc; p++) {
        for (i = 0; i < DL__GEMM_MR; i++) {
            const float ai = a[i];
            for (j = 0; j < DL__GEMM_NR; j++) acc[i][j] = DL__GEMM_FMA(ai, b[j], acc[i][j]);
        }
        a += DL__GEMM_MR;
        b += DL__GEMM_NR;
    }
    if (mr == DL__GEMM_MR && nr == DL__GEMM_NR) {
        if (beta == 0.0f) {
            for (i = 0; i < DL__GEMM_MR; i++)
                for (j = 0; j < DL__GEMM_NR; j++) C[i * ldc + j] = alpha * acc[i][j];
        } else if (beta == 1.0f) {
            for (i = 0; i < DL__GEMM_MR; i++)
                for (j = 0; j < DL__GEMM_NR; j++) C[i * ldc + j] += alpha * acc[i][j];
        } else {
            for (i = 0; i < DL__GEMM_MR; i++)
                for (j = 0; j < DL__GEMM_NR; j++) C[i * ldc + j] = alpha * acc[i][j] + beta * C[i * ldc + j];
        }
    } else {
        if (beta == 0.0f) {
            for (i = 0; i < mr; i++)
                for (j = 0; j < nr; j++) C[i * ldc + j] = alpha * acc[i][j];
        } else if (beta == 1.0f) {
            for (i = 0; i < mr; i++)
                for (j = 0; j < nr; j++) C[i * ldc + j] += alpha * acc[i][j];
        } else {
            for (i = 0; i < mr; i++)
                for (j = 0; j < nr; j++) C[i * ldc + j] = alpha * acc[i][j] + beta * C[i * ldc + j];
        }
    }
}

typedef struct dl__sgemm_job {
    bool transa, transb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A;
    int64_t lda;
    const float *B;
    int64_t ldb;
    float *C;
    int64_t ldc;
    int split_n;        /* 1: tasks index NR column slivers; 0: MR row slivers */
    int64_t chunk;      /* chunk size used by dl__parallel_for (to find the buffer) */
    float *bufs;        /* per-chunk buffers, each buf_stride floats */
    int64_t a_size;     /* floats for packed A in each buffer */
    int64_t buf_stride;
} dl__sgemm_job;

/* Full GotoBLAS loop nest on C[m0:m1, n0:n1] with private pack buffers. */
static void dl__sgemm_block(const dl__sgemm_job *J, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                            float *abuf, float *bbuf)
{
    int64_t jc, pc, ic, jr, ir;
    for (jc = n0; jc < n1; jc += DL__GEMM_NC) {
        int64_t nc = n1 - jc < DL__GEMM_NC ? n1 - jc : DL__GEMM_NC;
        for (pc = 0; pc < J->K; pc += DL__GEMM_KC) {
            int64_t kc = J->K - pc < DL__GEMM_KC ? J->K - pc : DL__GEMM_KC;
            float beta = pc == 0 ? J->beta : 1.0f;
            dl__gemm_pack_b(J->transb, J->B, J->ldb, pc, kc, jc, nc, bbuf);
            for (ic = m0; ic < m1; ic += DL__GEMM_MC) {
                int64_t mc = m1 - ic < DL__GEMM_MC ? m1 - ic : DL__GEMM_MC;
                dl__gemm_pack_a(J->transa, J->A, J->lda, ic, mc, pc, kc, abuf);
                for (jr = 0; jr < nc; jr += DL__GEMM_NR) {
                    int nr = (int)(nc - jr < DL__GEMM_NR ? nc - jr : DL__GEMM_NR);
                    const float *bp = bbuf + (jr / DL__GEMM_NR) * kc * DL__GEMM_NR;
                    for (ir = 0; ir < mc; ir += DL__GEMM_MR) {
                        int mr = (int)(mc - ir < DL__GEMM_MR ? mc - ir : DL__GEMM_MR);
                        const float *ap = abuf + (ir / DL__GEMM_MR) * kc * DL__GEMM_MR;
                        float *c = J->C + (ic + ir) * J->ldc + jc + jr;
                        dl__gemm_micro(kc, ap, bp, c, J->ldc, mr, nr, J->alpha, beta);
                    }
                }
            }
        }
    }
}

static void dl__sgemm_task(void *varg, int64_t begin, int64_t end)
{
    const dl__sgemm_job *J = (const dl__sgemm_job *)varg;
    int64_t idx = begin / J->chunk;
    float *abuf = J->bufs + idx * J->buf_stride;
    float *bbuf = abuf + J->a_size;
    if (J->split_n) {
        int64_t n0 = begin * DL__GEMM_NR, n1 = end * DL__GEMM_NR;
        if (n1 > J->N) n1 = J->N;
        dl__sgemm_block(J, 0, J->M, n0, n1, abuf, bbuf);
    } else {
        int64_t m0 = begin * DL__GEMM_MR, m1 = end * DL__GEMM_MR;
        if (m1 > J->M) m1 = J->M;
        dl__sgemm_block(J, m0, m1, 0, J->N, abuf, bbuf);
    }
}

static int64_t dl__round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C.   Row-major.
   op(A) = A (M,K) with row stride lda if !transa, else A is stored (K,M)
   with row stride lda and op(A)=A^T.  Same for B: (K,N) with ldb, or
   stored (N,K) when transb.  C has row stride ldc.
   beta == 0 means C is write-only (never read). */
static DL__UNUSED void dl__sgemm(dl__pool *pool, bool transa, bool transb, int64_t M, int64_t N, int64_t K,
                                 float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                                 float beta, float *C, int64_t ldc)
{
    dl__sgemm_job J;
    int64_t units_m, units_n, units, grain, nch, chunk, m_per, n_per, kc_max;
    int nthreads;
    void *raw;
    size_t bytes;

    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        dl__gemm_scale(M, N, beta, C, ldc);
        return;
    }
    if ((double)M * (double)N * (double)K < DL__GEMM_SMALL) {
        dl__sgemm_naive(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }

    nthreads = dl__pool_size(pool);
    units_m = (M + DL__GEMM_MR - 1) / DL__GEMM_MR;
    units_n = (N + DL__GEMM_NR - 1) / DL__GEMM_NR;
    /* Split along N duplicates the packing of A in each thread, along M the
       packing of B: prefer duplicating the smaller operand, but make sure
       there are enough units to keep the threads busy. */
    if (N >= M) J.split_n = units_n >= nthreads || units_n >= units_m;
    else J.split_n = !(units_m >= nthreads || units_m >= units_n);
    units = J.split_n ? units_n : units_m;
    /* each chunk should carry at least ~256k multiply-adds */
    {
        double per_unit = (double)K * (J.split_n ? (double)M * DL__GEMM_NR : (double)N * DL__GEMM_MR);
        double g = 262144.0 / per_unit;
        grain = g < 1.0 ? 1 : (g > (double)units ? units : (int64_t)g + 1);
    }
    nch = dl__split(units, grain, nthreads, &chunk);

    /* buffers sized for the whole problem (capped by MC/NC), so that a
       task may safely run any range (e.g. serial fallback of a nested call) */
    m_per = M;
    n_per = N;
    kc_max = K < DL__GEMM_KC ? K : DL__GEMM_KC;
    J.a_size = dl__round_up(m_per < DL__GEMM_MC ? m_per : DL__GEMM_MC, DL__GEMM_MR) * kc_max;
    J.a_size = dl__round_up(J.a_size, 16);
    J.buf_stride = J.a_size + dl__round_up(dl__round_up(n_per < DL__GEMM_NC ? n_per : DL__GEMM_NC, DL__GEMM_NR) * kc_max, 16);

    bytes = (size_t)(nch * J.buf_stride) * sizeof(float) + 64;
    raw = DL_MALLOC(bytes);
    if (!raw) {
        dl__sgemm_naive(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    J.bufs = (float *)(void *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    J.transa = transa;
    J.transb = transb;
    J.M = M;
    J.N = N;
    J.K = K;
    J.alpha = alpha;
    J.beta = beta;
    J.A = A;
    J.lda = lda;
    J.B = B;
    J.ldb = ldb;
    J.C = C;
    J.ldc = ldc;
    J.chunk = chunk;

    if (nch <= 1) dl__sgemm_task(&J, 0, units);
    else dl__parallel_for(pool, units, grain, dl__sgemm_task, &J);
    DL_FREE(raw);
}

// >>section memory
/* Memory has two lifetimes. Persistent tensors (parameters, optimizer state)
   are allocated one by one and linked into a list the context frees. Step
   tensors come from arenas: a list of large chunks handed out by bumping an
   offset. dl_step_end() sets every offset back to zero and keeps the chunks,
   so a training loop that makes the same tensors each step stops calling the
   allocator after its first step. Tensor headers and tape nodes live in a
   second pair of arenas used on alternate steps: the headers of the step
   just ended stay intact during the next one, which is how a stale tensor is
   recognized instead of being read from recycled memory. */

typedef struct dl__chunk {
    struct dl__chunk *next;
    size_t size, used;
    unsigned char *mem;       /* 64-byte aligned start inside this allocation */
} dl__chunk;

typedef struct dl__arena {
    dl__chunk *head, *cur;
    size_t used, reserved;    /* bytes handed out this step; bytes held */
    size_t min_chunk;
} dl__arena;

typedef struct dl__mark { dl__chunk *cur; size_t cur_used, used; } dl__mark;

typedef dl_result (*dl__bwd_fn)(dl__node *n, dl_tensor *g, dl_tensor **gin);
typedef struct dl__op { const char *name; dl__bwd_fn backward; } dl__op;

struct dl__node {
    const dl__op *op;
    dl_tensor *out;
    int nin;
    dl_tensor **in;
    int nsaved;
    dl_tensor *saved[DL__NSAVED];
    float f[4];                       /* attributes: scalars */
    int64_t i[DL_MAX_DIMS + 2];       /* attributes: dims, sizes */
    int ni;
    dl_tensor *gacc;                  /* gradient of out, during backward */
    int64_t id;                       /* position on the tape */
    uint64_t visit;
    bool released;
    const dl_function *fn;            /* custom functions */
    void *user;
};

struct dl_fn_ctx { dl__node node; };

/* Objects the context owns besides tensors (modules, optimizers, loaders):
   each registers a destructor that dl_ctx_free runs, newest first. */
typedef struct dl__owned { struct dl__owned *next; void (*destroy)(void *p); void *p; } dl__owned;

struct dl_ctx {
    uint64_t step;
    dl__arena data;                   /* step tensor data (CPU) */
    dl__arena hdr[2];                 /* headers and nodes, by step parity */
    dl_tensor *persist;               /* persistent tensors */
    size_t persistent_bytes, peak_bytes, memory_limit;
    uint64_t alloc_calls;
    dl__node **tape;
    int64_t ntape, captape;
    int no_grad;                      /* no_grad nesting depth */
    bool backward_nograd;             /* inside a backward without create_graph */
    bool anomaly;
    const char *in_backward_of;       /* op whose backward is running */
    dl_result err;
    char msg[768];
    dl_log_fn log;
    void *log_user;
    uint64_t rng[4];
    dl__pool *pool;
    int nthreads;
    char shbuf[8][128];
    int shi;
    uint64_t visit;
    dl__owned *owned;
};

static void dl__err(dl_ctx *ctx, dl_result code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void *dl__malloc(dl_ctx *ctx, size_t bytes)
{
    void *p;
    if (ctx) ctx->alloc_calls++;
    p = DL_MALLOC(bytes ? bytes : 1);
    return p;
}

static bool dl__limit_ok(dl_ctx *ctx, size_t extra)
{
    size_t total = ctx->persistent_bytes + ctx->data.reserved + extra;
    return ctx->memory_limit == 0 || total <= ctx->memory_limit;
}

static void *dl__arena_alloc(dl_ctx *ctx, dl__arena *a, size_t bytes, bool count_limit)
{
    size_t need;
    dl__chunk *ch;
    size_t size;
    if (bytes > ((size_t)-1) / 2) return NULL;
    need = (bytes + 63) & ~(size_t)63;
    while (a->cur) {
        if (a->cur->size - a->cur->used >= need) {
            void *p = a->cur->mem + a->cur->used;
            a->cur->used += need;
            a->used += need;
            return p;
        }
        if (!a->cur->next) break;
        a->cur = a->cur->next;   /* the rest of this chunk waits for the next step */
    }
    size = a->reserved > a->min_chunk ? a->reserved : a->min_chunk;
    if (size < need) size = need;
    if (count_limit && !dl__limit_ok(ctx, size)) {
        size = need;                        /* try the exact size before failing */
        if (!dl__limit_ok(ctx, size)) return NULL;
    }
    if (size > ((size_t)-1) - sizeof(dl__chunk) - 64) return NULL;
    ch = (dl__chunk *)dl__malloc(ctx, sizeof(dl__chunk) + 64 + size);
    if (!ch) return NULL;
    ch->size = size;
    ch->used = need;
    ch->mem = (unsigned char *)(((uintptr_t)(ch + 1) + 63) & ~(uintptr_t)63);
    if (a->cur) { ch->next = a->cur->next; a->cur->next = ch; }
    else { ch->next = a->head; a->head = ch; }
    a->cur = ch;
    a->reserved += size;
    a->used += need;
    return ch->mem;
}

static void dl__arena_reset(dl__arena *a)
{
    dl__chunk *c;
    for (c = a->head; c; c = c->next) c->used = 0;
    a->cur = a->head;
    a->used = 0;
}

static void dl__arena_free(dl__arena *a)
{
    dl__chunk *c = a->head;
    while (c) { dl__chunk *n = c->next; DL_FREE(c); c = n; }
    a->head = a->cur = NULL;
    a->used = a->reserved = 0;
}

static dl__mark dl__arena_mark(const dl__arena *a)
{
    dl__mark m;
    m.cur = a->cur;
    m.cur_used = a->cur ? a->cur->used : 0;
    m.used = a->used;
    return m;
}

/* Give back everything allocated since m (chunks after m.cur were empty then). */
static void dl__arena_rewind(dl__arena *a, dl__mark m)
{
    dl__chunk *c;
    if (!m.cur) { dl__arena_reset(a); return; }
    for (c = m.cur->next; c; c = c->next) c->used = 0;
    m.cur->used = m.cur_used;
    a->cur = m.cur;
    a->used = m.used;
}

static void dl__track_peak(dl_ctx *ctx)
{
    size_t now = ctx->persistent_bytes + ctx->data.used;
    if (now > ctx->peak_bytes) ctx->peak_bytes = now;
}

// >>section errors
/* One message per failure: the op that failed, its operands (shape, device)
   and the rule. Ops given NULL return NULL without a new message, so the
   message a user reads after a whole forward pass is the first cause. */

static const char *dl__dev_str(dl_device d, char *buf, size_t n)
{
    if (d.type == DL_DEVICE_CPU) snprintf(buf, n, "cpu");
    else snprintf(buf, n, "cuda:%d", d.index);
    return buf;
}

/* "(2,3)" for a tensor, in one of eight rotating buffers of the context. */
static const char *dl__sh(const dl_tensor *t)
{
    dl_ctx *ctx = t->ctx_;
    char *b = ctx->shbuf[ctx->shi++ & 7];
    int i, k = 0;
    k += snprintf(b + k, 128 - (size_t)k, "(");
    for (i = 0; i < t->ndim && k < 100; i++)
        k += snprintf(b + k, 128 - (size_t)k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    snprintf(b + k, 128 - (size_t)k, ")");
    return b;
}

static const char *dl__shp(dl_ctx *ctx, const dl_shape *s)
{
    char *b = ctx->shbuf[ctx->shi++ & 7];
    int i, k = 0;
    k += snprintf(b + k, 128 - (size_t)k, "(");
    for (i = 0; i < s->ndim && i < DL_MAX_DIMS && k < 100; i++)
        k += snprintf(b + k, 128 - (size_t)k, i ? ",%lld" : "%lld", (long long)s->d[i]);
    snprintf(b + k, 128 - (size_t)k, ")");
    return b;
}

static const char *dl__dtype_str(dl_dtype t)
{
    return t == DL_DTYPE_F32 ? "float32" : t == DL_DTYPE_I32 ? "int32" : "int64";
}

static void dl__err(dl_ctx *ctx, dl_result code, const char *fmt, ...)
{
    va_list ap;
    int k = 0;
    if (!ctx) return;
    if (ctx->in_backward_of)
        k = snprintf(ctx->msg, sizeof ctx->msg, "in the backward of %s: ", ctx->in_backward_of);
    if (k < 0 || (size_t)k >= sizeof ctx->msg) k = 0;
    va_start(ap, fmt);
    vsnprintf(ctx->msg + k, sizeof ctx->msg - (size_t)k, fmt, ap);
    va_end(ap);
    ctx->err = code;
    if (ctx->log) ctx->log(ctx->log_user, ctx->msg);
#ifdef DL_ABORT_ON_ERROR
    abort();
#endif
}

static void dl__log_stderr(void *user, const char *m)
{
    (void)user;
    fprintf(stderr, "dl.h: %s\n", m);
}

void dl_log_silent(void *user, const char *message) { (void)user; (void)message; }

const char *dl_result_string(dl_result r)
{
    static const char *names[] = {
        "DL_OK", "DL_ERR_ARG", "DL_ERR_SHAPE", "DL_ERR_DTYPE", "DL_ERR_DEVICE",
        "DL_ERR_STALE", "DL_ERR_GRAPH", "DL_ERR_OOM", "DL_ERR_IO", "DL_ERR_FORMAT",
        "DL_ERR_NAN", "DL_ERR_UNSUPPORTED"};
    if ((int)r < 0 || (int)r >= (int)(sizeof names / sizeof names[0])) return "DL_ERR_?";
    return names[r];
}

dl_result dl_last_error(const dl_ctx *ctx) { return ctx ? ctx->err : DL_ERR_ARG; }
const char *dl_error_message(const dl_ctx *ctx) { return ctx ? ctx->msg : "dl.h: NULL context"; }
void dl_clear_error(dl_ctx *ctx) { if (ctx) { ctx->err = DL_OK; ctx->msg[0] = 0; } }
void dl_set_log(dl_ctx *ctx, dl_log_fn fn, void *user)
{
    if (!ctx) return;
    ctx->log = fn ? fn : dl__log_stderr;
    ctx->log_user = user;
}

/* Every tensor argument passes here: it must be a live tensor of this step
   (or persistent). A header whose magic is wrong cannot name its context, so
   nothing can be reported: the op returns NULL. */
static bool dl__live(const char *op, const char *arg, const dl_tensor *t)
{
    dl_ctx *ctx;
    if (!t || t->magic_ != DL__MAGIC) return false;
    ctx = t->ctx_;
    if (t->step_ != 0 && t->step_ != ctx->step) {
        dl__err(ctx, DL_ERR_STALE,
                "%s: %s %s was made in step %llu, which dl_step_end() released (now step "
                "%llu); copy it with dl_keep() to use it in later steps",
                op, arg, dl__sh(t), (unsigned long long)t->step_, (unsigned long long)ctx->step);
        return false;
    }
    return true;
}

static bool dl__f32(const char *op, const char *arg, const dl_tensor *t)
{
    if (t->dtype == DL_DTYPE_F32) return true;
    dl__err(t->ctx_, DL_ERR_DTYPE, "%s: %s %s has dtype %s; this op needs float32", op, arg,
            dl__sh(t), dl__dtype_str(t->dtype));
    return false;
}

/* Two operands must share a context and a device. */
static bool dl__pair(const char *op, const dl_tensor *a, const dl_tensor *b)
{
    char da[32], db[32];
    if (a->ctx_ != b->ctx_) {
        dl__err(a->ctx_, DL_ERR_ARG, "%s: a and b belong to different contexts", op);
        return false;
    }
    if (a->device.type != b->device.type || a->device.index != b->device.index) {
        dl__err(a->ctx_, DL_ERR_DEVICE, "%s: a is on %s and b is on %s; move one with dl_to()",
                op, dl__dev_str(a->device, da, sizeof da), dl__dev_str(b->device, db, sizeof db));
        return false;
    }
    return true;
}

/* Normalize a possibly negative dim against ndim (insert: ndim+1 positions). */
static bool dl__dim(const char *op, const dl_tensor *t, int *dim, int ndim)
{
    int d = *dim;
    if (d < -ndim || d >= ndim || ndim == 0) {
        dl__err(t->ctx_, DL_ERR_ARG, "%s: dim %d is out of range for a tensor of shape %s "
                "(valid: %d..%d)", op, d, dl__sh(t), -ndim, ndim - 1);
        return false;
    }
    *dim = d < 0 ? d + ndim : d;
    return true;
}

// >>section context
/* splitmix64 fills a xoshiro256** state from one seed */
static void dl__seed_state(uint64_t seed, uint64_t *s)
{
    int i;
    uint64_t z = seed ? seed : 0x5eed;
    for (i = 0; i < 4; i++) {
        uint64_t x;
        z += 0x9e3779b97f4a7c15ull;
        x = z;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        s[i] = x ^ (x >> 31);
    }
}

void dl_manual_seed(dl_ctx *ctx, uint64_t seed)
{
    if (ctx) dl__seed_state(seed, ctx->rng);
}

static uint64_t dl__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t dl__rng_next(uint64_t *s)
{
    uint64_t r = dl__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = dl__rotl(s[3], 45);
    return r;
}

static float dl__rng_uniform(uint64_t *s) { return (float)(dl__rng_next(s) >> 40) * (1.0f / 16777216.0f); }

static float dl__rng_normal(uint64_t *s)
{
    double u1 = ((double)(dl__rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(dl__rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

dl_ctx *dl_ctx_init(const dl_ctx_desc *desc)
{
    dl_ctx *ctx = (dl_ctx *)DL_MALLOC(sizeof(dl_ctx));
    if (!ctx) return NULL;
    memset(ctx, 0, sizeof *ctx);
    ctx->step = 1;
    ctx->data.min_chunk = (size_t)1 << 20;
    ctx->hdr[0].min_chunk = ctx->hdr[1].min_chunk = (size_t)64 << 10;
    ctx->log = dl__log_stderr;
    if (desc) {
        ctx->memory_limit = desc->memory_limit;
        if (desc->log) ctx->log = desc->log;
        ctx->log_user = desc->log_user;
    }
    dl_manual_seed(ctx, desc ? desc->seed : 0);
    ctx->nthreads = desc ? desc->num_threads : 0;
    ctx->pool = dl__pool_create(ctx->nthreads);
    ctx->alloc_calls++;
    return ctx;
}

static void dl__persist_unlink(dl_tensor *t)
{
    dl_ctx *ctx = t->ctx_;
    if (t->pprev_) t->pprev_->pnext_ = t->pnext_;
    else ctx->persist = t->pnext_;
    if (t->pnext_) t->pnext_->pprev_ = t->pprev_;
}

static size_t dl__esize(dl_dtype t) { return t == DL_DTYPE_I64 ? 8 : 4; }

static void dl__persist_release(dl_tensor *t)
{
    dl_ctx *ctx = t->ctx_;
    size_t bytes = (size_t)t->numel * dl__esize(t->dtype) + sizeof(dl_tensor);
    dl__persist_unlink(t);
    ctx->persistent_bytes -= bytes < ctx->persistent_bytes ? bytes : ctx->persistent_bytes;
    t->magic_ = 0;
    if (t->owns_) DL_FREE(t->data);
    DL_FREE(t);
}

/* Register p to be destroyed by dl_ctx_free (false, with an error, on OOM). */
static DL__UNUSED bool dl__own(dl_ctx *ctx, void (*destroy)(void *p), void *p)
{
    dl__owned *o = (dl__owned *)dl__malloc(ctx, sizeof(dl__owned));
    if (!o) { dl__err(ctx, DL_ERR_OOM, "out of memory"); return false; }
    o->destroy = destroy;
    o->p = p;
    o->next = ctx->owned;
    ctx->owned = o;
    return true;
}

/* Destroy p now (and forget it) if the context owns it. */
static DL__UNUSED void dl__disown(dl_ctx *ctx, void *p)
{
    dl__owned **pp = &ctx->owned;
    while (*pp) {
        if ((*pp)->p == p) {
            dl__owned *o = *pp;
            *pp = o->next;
            o->destroy(o->p);
            DL_FREE(o);
            return;
        }
        pp = &(*pp)->next;
    }
}

void dl_ctx_free(dl_ctx *ctx)
{
    if (!ctx) return;
    while (ctx->owned) {
        dl__owned *o = ctx->owned;
        ctx->owned = o->next;
        o->destroy(o->p);
        DL_FREE(o);
    }
    while (ctx->persist) dl__persist_release(ctx->persist);
    dl__arena_free(&ctx->data);
    dl__arena_free(&ctx->hdr[0]);
    dl__arena_free(&ctx->hdr[1]);
    DL_FREE(ctx->tape);
    dl__pool_destroy(ctx->pool);
    DL_FREE(ctx);
}

void dl_step_end(dl_ctx *ctx)
{
    if (!ctx) return;
    ctx->step++;
    dl__arena_reset(&ctx->data);
    dl__arena_reset(&ctx->hdr[ctx->step & 1]);   /* headers of step-2: now free */
    ctx->ntape = 0;
}

uint64_t dl_step(const dl_ctx *ctx) { return ctx ? ctx->step : 0; }

dl_result dl_set_num_threads(dl_ctx *ctx, int n)
{
    dl__pool *p;
    if (!ctx) return DL_ERR_ARG;
    p = dl__pool_create(n);
    if (!p) { dl__err(ctx, DL_ERR_OOM, "dl_set_num_threads: cannot start %d threads", n); return DL_ERR_OOM; }
    dl__pool_destroy(ctx->pool);
    ctx->pool = p;
    ctx->nthreads = n;
    return DL_OK;
}

int dl_num_threads(const dl_ctx *ctx) { return ctx ? dl__pool_size(ctx->pool) : 0; }

dl_device dl_cpu(void) { dl_device d; d.type = DL_DEVICE_CPU; d.index = 0; return d; }
dl_device dl_cuda(int index) { dl_device d; d.type = DL_DEVICE_CUDA; d.index = index; return d; }
dl_ctx *dl_tensor_ctx(const dl_tensor *t) { return t && t->magic_ == DL__MAGIC ? t->ctx_ : NULL; }

dl_result dl_memory_stats_get(dl_ctx *ctx, dl_device dev, dl_memory_stats *out)
{
    if (!ctx || !out) return DL_ERR_ARG;
    memset(out, 0, sizeof *out);
    if (dev.type != DL_DEVICE_CPU) {
        dl__err(ctx, DL_ERR_DEVICE, "dl_memory_stats_get: this build has no CUDA device");
        return DL_ERR_DEVICE;
    }
    out->persistent_bytes = ctx->persistent_bytes;
    out->step_bytes = ctx->data.used;
    out->step_reserved = ctx->data.reserved + ctx->hdr[0].reserved + ctx->hdr[1].reserved;
    out->peak_bytes = ctx->peak_bytes;
    out->alloc_calls = ctx->alloc_calls;
    return DL_OK;
}

// >>section tensors
dl_shape dl_shape_make(int ndim, const int64_t *dims)
{
    dl_shape s;
    int i;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (i = 0; i < ndim && i < DL_MAX_DIMS; i++) s.d[i] = dims ? dims[i] : 0;
    return s;
}

dl_shape dl_dims_all(void) { dl_shape s; memset(&s, 0, sizeof s); return s; }

static bool dl__numel(dl_ctx *ctx, const char *op, int ndim, const int64_t *shape, int64_t *numel)
{
    int i;
    int64_t n = 1;
    if (ndim < 0 || ndim > DL_MAX_DIMS) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: %d dims requested; at most DL_MAX_DIMS=%d", op, ndim,
                DL_MAX_DIMS);
        return false;
    }
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            dl_shape s = dl_shape_make(ndim, shape);
            dl__err(ctx, DL_ERR_SHAPE, "%s: shape %s has a negative size at dim %d", op,
                    dl__shp(ctx, &s), i);
            return false;
        }
        if (shape[i] && n > (INT64_MAX / 8) / shape[i]) {
            dl_shape s = dl_shape_make(ndim, shape);
            dl__err(ctx, DL_ERR_OOM, "%s: shape %s has too many elements (size overflow)", op,
                    dl__shp(ctx, &s));
            return false;
        }
        n *= shape[i];
    }
    *numel = n;
    return true;
}

/* Make a tensor header + storage. data == NULL: allocate; else share it. */
static dl_tensor *dl__make(dl_ctx *ctx, const char *op, dl_dtype dtype, int ndim,
                           const int64_t *shape, bool persistent, void *share)
{
    int64_t numel;
    size_t bytes;
    dl_tensor *t;
    if (!dl__numel(ctx, op, ndim, shape, &numel)) return NULL;
    if ((uint64_t)numel > (uint64_t)(((size_t)-1) / 16)) {
        dl__err(ctx, DL_ERR_OOM, "%s: %lld elements do not fit in memory", op, (long long)numel);
        return NULL;
    }
    bytes = (size_t)numel * dl__esize(dtype);
    if (persistent) {
        if (!dl__limit_ok(ctx, bytes + sizeof(dl_tensor))) {
            dl__err(ctx, DL_ERR_OOM, "%s: %zu bytes would pass the context's memory_limit of %zu",
                    op, bytes, ctx->memory_limit);
            return NULL;
        }
        t = (dl_tensor *)dl__malloc(ctx, sizeof(dl_tensor));
        if (!t) goto oom;
        memset(t, 0, sizeof *t);
        if (!share) {
            t->data = dl__malloc(ctx, bytes);
            if (!t->data) { DL_FREE(t); goto oom; }
            t->owns_ = true;
        }
        t->ctx_ = ctx;
        t->pnext_ = ctx->persist;
        if (ctx->persist) ctx->persist->pprev_ = t;
        ctx->persist = t;
        ctx->persistent_bytes += bytes + sizeof(dl_tensor);
    } else {
        t = (dl_tensor *)dl__arena_alloc(ctx, &ctx->hdr[ctx->step & 1], sizeof(dl_tensor), false);
        if (!t) goto oom;
        memset(t, 0, sizeof *t);
        if (!share) {
            t->data = dl__arena_alloc(ctx, &ctx->data, bytes, true);
            if (!t->data) goto oom;
        }
        t->step_ = ctx->step;
        t->ctx_ = ctx;
    }
    if (share) t->data = share;
    t->magic_ = DL__MAGIC;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->numel = numel;
    t->dtype = dtype;
    t->device = dl_cpu();
    dl__track_peak(ctx);
    return t;
oom:
    {
        dl_shape s = dl_shape_make(ndim, shape);
        dl__err(ctx, DL_ERR_OOM, "%s: cannot allocate %zu bytes for a %s %s tensor%s", op, bytes,
                dl__dtype_str(dtype), dl__shp(ctx, &s),
                ctx->memory_limit ? " (memory_limit reached?)" : "");
    }
    return NULL;
}

/* A new float32 step tensor shaped like t (same device). */
static dl_tensor *dl__like(const char *op, const dl_tensor *t)
{
    dl_tensor *o = dl__make(t->ctx_, op, DL_DTYPE_F32, t->ndim, t->shape, false, NULL);
    if (o) o->device = t->device;
    return o;
}

static dl_tensor *dl__new(dl_ctx *ctx, const char *op, int ndim, const int64_t *shape)
{
    return dl__make(ctx, op, DL_DTYPE_F32, ndim, shape, false, NULL);
}

// >>section kernels (CPU)
/* Ops never loop over data themselves: they call a kernel table, one per
   device. This is the CPU table; dl_cuda.cuh provides the same entries for
   NVIDIA GPUs. Kernels know nothing about autograd or tensors: they get raw
   pointers, sizes and strides (in elements). */

enum {
    DL__U_NEG, DL__U_EXP, DL__U_LOG, DL__U_SQRT, DL__U_ABS, DL__U_SIGN, DL__U_ERF,
    DL__U_RELU, DL__U_LEAKY, DL__U_SIGMOID, DL__U_TANH, DL__U_GELU, DL__U_POW,
    DL__U_CLAMP, DL__U_AFFINE, DL__U_DIVS, DL__U_GT, DL__U_LEAKY_MASK, DL__U_INRANGE
};
enum {
    DL__B_ADD, DL__B_SUB, DL__B_MUL, DL__B_DIV, DL__B_MAX, DL__B_MIN,
    DL__B_GT_HALF, DL__B_LT_HALF, DL__B_EQ
};
enum { DL__R_SUM, DL__R_MAX, DL__R_MIN };

/* Broadcast plan of a binary op: output shape, and per-operand strides with
   0 on broadcast dims. */
typedef struct dl__bcast {
    int ndim;
    int64_t shape[DL_MAX_DIMS], sa[DL_MAX_DIMS], sb[DL_MAX_DIMS];
    int64_t n;
} dl__bcast;

typedef struct dl__kernels {
    const char *name;
    void (*unary)(dl_ctx *c, int op, float *y, const float *x, int64_t n, float a, float b);
    void (*binary)(dl_ctx *c, int op, float *y, const float *a, const float *b,
                   const dl__bcast *bc);
    void (*reduce)(dl_ctx *c, int op, float *y, const float *x, int64_t outer, int64_t r,
                   int64_t inner);
    void (*argmax)(dl_ctx *c, int64_t *idx, const float *x, int64_t outer, int64_t r,
                   int64_t inner);
    void (*onehot)(dl_ctx *c, float *y, const int64_t *idx, int64_t outer, int64_t r,
                   int64_t inner);
    void (*copy_nd)(dl_ctx *c, size_t esize, int ndim, const int64_t *shape, void *dst,
                    const int64_t *dst_strides, const void *src, const int64_t *src_strides);
    void (*fill)(dl_ctx *c, float *y, int64_t n, float v);
    void (*axpy)(dl_ctx *c, float *y, const float *x, int64_t n, float alpha);
    void (*gemm)(dl_ctx *c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb,
                 int64_t sB, float beta, float *C, int64_t ldc, int64_t sC, int64_t batch);
    void (*softmax)(dl_ctx *c, bool log, float *y, const float *x, int64_t outer, int64_t n,
                    int64_t inner);
    int64_t (*nonfinite)(dl_ctx *c, const float *x, int64_t n);   /* first index or -1 */
} dl__kernels;

typedef struct dl__un_args { int op; float *y; const float *x; float a, b; } dl__un_args;

static void dl__un_task(void *p, int64_t lo, int64_t hi)
{
    const dl__un_args *u = (const dl__un_args *)p;
    float *y = u->y;
    const float *x = u->x;
    float a = u->a, b = u->b;
    int64_t i;
    switch (u->op) {
    case DL__U_NEG: for (i = lo; i < hi; i++) y[i] = -x[i]; break;
    case DL__U_EXP: for (i = lo; i < hi; i++) y[i] = expf(x[i]); break;
    case DL__U_LOG: for (i = lo; i < hi; i++) y[i] = logf(x[i]); break;
    case DL__U_SQRT: for (i = lo; i < hi; i++) y[i] = sqrtf(x[i]); break;
    case DL__U_ABS: for (i = lo; i < hi; i++) y[i] = fabsf(x[i]); break;
    case DL__U_SIGN: for (i = lo; i < hi; i++) y[i] = (float)((x[i] > 0) - (x[i] < 0)); break;
    case DL__U_ERF: for (i = lo; i < hi; i++) y[i] = erff(x[i]); break;
    case DL__U_RELU: for (i = lo; i < hi; i++) y[i] = x[i] > 0 ? x[i] : 0.0f; break;
    case DL__U_LEAKY: for (i = lo; i < hi; i++) y[i] = x[i] > 0 ? x[i] : x[i] * a; break;
    case DL__U_SIGMOID:
        for (i = lo; i < hi; i++) {
            float v = x[i];
            if (v >= 0) y[i] = 1.0f / (1.0f + expf(-v));
            else { float e = expf(v); y[i] = e / (1.0f + e); }
        }
        break;
    case DL__U_TANH: for (i = lo; i < hi; i++) y[i] = tanhf(x[i]); break;
    case DL__U_GELU:
        for (i = lo; i < hi; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
        break;
    case DL__U_POW:
        if (a == 2.0f) for (i = lo; i < hi; i++) y[i] = x[i] * x[i];
        else if (a == 1.0f) for (i = lo; i < hi; i++) y[i] = x[i];
        else if (a == 0.5f) for (i = lo; i < hi; i++) y[i] = sqrtf(x[i]);
        else for (i = lo; i < hi; i++) y[i] = powf(x[i], a);
        break;
    case DL__U_CLAMP:
        for (i = lo; i < hi; i++) y[i] = x[i] < a ? a : (x[i] > b ? b : x[i]);
        break;
    case DL__U_AFFINE: for (i = lo; i < hi; i++) y[i] = a * x[i] + b; break;
    case DL__U_DIVS: for (i = lo; i < hi; i++) y[i] = x[i] / a; break;
    case DL__U_GT: for (i = lo; i < hi; i++) y[i] = x[i] > a ? 1.0f : 0.0f; break;
    case DL__U_LEAKY_MASK: for (i = lo; i < hi; i++) y[i] = x[i] > 0 ? 1.0f : a; break;
    case DL__U_INRANGE:
        for (i = lo; i < hi; i++) y[i] = (x[i] >= a && x[i] <= b) ? 1.0f : 0.0f;
        break;
    default: DL_ASSERT(0);
    }
}

static void dl__cpu_unary(dl_ctx *c, int op, float *y, const float *x, int64_t n, float a, float b)
{
    dl__un_args u;
    u.op = op; u.y = y; u.x = x; u.a = a; u.b = b;
    dl__parallel_for(c->pool, n, 1 << 15, dl__un_task, &u);
}

/* One row of a binary op: y[i] = a[i*sa] op b[i*sb]. */
static void dl__bin_row(int op, float *y, const float *a, int64_t sa, const float *b, int64_t sb,
                        int64_t n)
{
    int64_t i;
    switch (op) {
    case DL__B_ADD: for (i = 0; i < n; i++) y[i] = a[i * sa] + b[i * sb]; break;
    case DL__B_SUB: for (i = 0; i < n; i++) y[i] = a[i * sa] - b[i * sb]; break;
    case DL__B_MUL: for (i = 0; i < n; i++) y[i] = a[i * sa] * b[i * sb]; break;
    case DL__B_DIV: for (i = 0; i < n; i++) y[i] = a[i * sa] / b[i * sb]; break;
    case DL__B_MAX:
        for (i = 0; i < n; i++) { float p = a[i * sa], q = b[i * sb]; y[i] = (p > q || p != p) ? p : q; }
        break;
    case DL__B_MIN:
        for (i = 0; i < n; i++) { float p = a[i * sa], q = b[i * sb]; y[i] = (p < q || p != p) ? p : q; }
        break;
    case DL__B_GT_HALF:
        for (i = 0; i < n; i++) { float p = a[i * sa], q = b[i * sb]; y[i] = p > q ? 1.0f : (p == q ? 0.5f : 0.0f); }
        break;
    case DL__B_LT_HALF:
        for (i = 0; i < n; i++) { float p = a[i * sa], q = b[i * sb]; y[i] = p < q ? 1.0f : (p == q ? 0.5f : 0.0f); }
        break;
    case DL__B_EQ: for (i = 0; i < n; i++) y[i] = a[i * sa] == b[i * sb] ? 1.0f : 0.0f; break;
    default: DL_ASSERT(0);
    }
}

typedef struct dl__bin_args {
    int op; float *y; const float *a, *b; const dl__bcast *bc; int64_t row;
} dl__bin_args;

static void dl__bin_flat_task(void *p, int64_t lo, int64_t hi)
{
    const dl__bin_args *u = (const dl__bin_args *)p;
    int64_t sb = u->bc->sb[u->bc->ndim - 1] ? 1 : 0, sa = u->bc->sa[u->bc->ndim - 1] ? 1 : 0;
    dl__bin_row(u->op, u->y + lo, u->a + lo * sa, sa, u->b + lo * sb, sb, hi - lo);
}

static void dl__bin_rows_task(void *p, int64_t lo, int64_t hi)
{
    const dl__bin_args *u = (const dl__bin_args *)p;
    const dl__bcast *bc = u->bc;
    int last = bc->ndim - 1;
    int64_t r;
    for (r = lo; r < hi; r++) {
        int64_t oa = 0, ob = 0, rem = r;
        int d;
        for (d = last - 1; d >= 0; d--) {
            int64_t k = rem % bc->shape[d];
            rem /= bc->shape[d];
            oa += k * bc->sa[d];
            ob += k * bc->sb[d];
        }
        dl__bin_row(u->op, u->y + r * u->row, u->a + oa, bc->sa[last], u->b + ob, bc->sb[last],
                    u->row);
    }
}

static void dl__cpu_binary(dl_ctx *c, int op, float *y, const float *a, const float *b,
                           const dl__bcast *bc)
{
    dl__bin_args u;
    int d;
    bool a_full = true, b_full = true, b_zero = true, a_zero = true;
    int64_t st = 1;
    u.op = op; u.y = y; u.a = a; u.b = b; u.bc = bc;
    if (bc->n == 0) return;
    if (bc->ndim == 0) { dl__bin_row(op, y, a, 0, b, 0, 1); return; }
    for (d = bc->ndim - 1; d >= 0; d--) {
        if (bc->shape[d] == 1) continue;
        if (bc->sa[d] != st) a_full = false;
        if (bc->sb[d] != st) b_full = false;
        if (bc->sa[d] != 0) a_zero = false;
        if (bc->sb[d] != 0) b_zero = false;
        st *= bc->shape[d];
    }
    if ((a_full || a_zero) && (b_full || b_zero)) {
        /* contiguous or scalar operands: one flat row, split across threads */
        dl__bcast flat = *bc;
        flat.ndim = 1;
        flat.sa[0] = a_zero ? 0 : 1;
        flat.sb[0] = b_zero ? 0 : 1;
        u.bc = &flat;
        dl__parallel_for(c->pool, bc->n, 1 << 15, dl__bin_flat_task, &u);
        return;
    }
    u.row = bc->shape[bc->ndim - 1];
    if (u.row == 0) return;
    dl__parallel_for(c->pool, bc->n / u.row, (1 << 15) / u.row + 1, dl__bin_rows_task, &u);
}

typedef struct dl__red_args {
    int op; float *y; const float *x; int64_t r, inner;
} dl__red_args;

static void dl__red_task(void *p, int64_t lo, int64_t hi)
{
    const dl__red_args *u = (const dl__red_args *)p;
    int64_t o, k, i, r = u->r, inner = u->inner;
    for (o = lo; o < hi; o++) {
        const float *x = u->x + o * r * inner;
        float *y = u->y + o * inner;
        if (inner == 1) {
            if (u->op == DL__R_SUM) {
                double s = 0;
                for (k = 0; k < r; k++) s += x[k];
                y[0] = (float)s;
            } else {
                float m = r ? x[0] : (u->op == DL__R_MAX ? -INFINITY : INFINITY);
                for (k = 1; k < r; k++) {
                    float v = x[k];
                    if (v != v) { m = v; break; }
                    if (u->op == DL__R_MAX ? v > m : v < m) m = v;
                }
                y[0] = m;
            }
            continue;
        }
        if (u->op == DL__R_SUM) {
            for (i = 0; i < inner; i++) y[i] = 0.0f;
            for (k = 0; k < r; k++)
                for (i = 0; i < inner; i++) y[i] += x[k * inner + i];
        } else {
            if (r == 0) { for (i = 0; i < inner; i++) y[i] = u->op == DL__R_MAX ? -INFINITY : INFINITY; continue; }
            for (i = 0; i < inner; i++) y[i] = x[i];
            for (k = 1; k < r; k++)
                for (i = 0; i < inner; i++) {
                    float v = x[k * inner + i];
                    if (u->op == DL__R_MAX ? (v > y[i] || v != v) : (v < y[i] || v != v)) y[i] = v;
                }
        }
    }
}

static void dl__cpu_reduce(dl_ctx *c, int op, float *y, const float *x, int64_t outer, int64_t r,
                           int64_t inner)
{
    dl__red_args u;
    u.op = op; u.y = y; u.x = x; u.r = r; u.inner = inner;
    dl__parallel_for(c->pool, outer, (1 << 15) / (r * inner + 1) + 1, dl__red_task, &u);
}

static void dl__cpu_argmax(dl_ctx *c, int64_t *idx, const float *x, int64_t outer, int64_t r,
                           int64_t inner)
{
    int64_t o, i, k;
    (void)c;
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            const float *p = x + o * r * inner + i;
            int64_t best = 0;
            float m = r ? p[0] : 0.0f;
            for (k = 1; k < r; k++) {
                float v = p[k * inner];
                if (m != m) break;
                if (v > m || v != v) { m = v; best = k; }
            }
            idx[o * inner + i] = best;
        }
}

static void dl__cpu_onehot(dl_ctx *c, float *y, const int64_t *idx, int64_t outer, int64_t r,
                           int64_t inner)
{
    int64_t o, i;
    (void)c;
    memset(y, 0, sizeof(float) * (size_t)(outer * r * inner));
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            int64_t k = idx[o * inner + i];
            if (k >= 0 && k < r) y[(o * r + k) * inner + i] = 1.0f;
        }
}

typedef struct dl__copy_args {
    size_t esize; int ndim; const int64_t *shape; char *dst; const int64_t *ds;
    const char *src; const int64_t *ss;
} dl__copy_args;

static void dl__copy_task(void *p, int64_t lo, int64_t hi)
{
    const dl__copy_args *u = (const dl__copy_args *)p;
    int last = u->ndim - 1;
    int64_t row = u->shape[last], r, i, sd = u->ds[last], ss = u->ss[last];
    for (r = lo; r < hi; r++) {
        int64_t od = 0, os = 0, rem = r;
        int d;
        for (d = last - 1; d >= 0; d--) {
            int64_t k = rem % u->shape[d];
            rem /= u->shape[d];
            od += k * u->ds[d];
            os += k * u->ss[d];
        }
        if (u->esize == 4) {
            float *dp = (float *)u->dst + od;
            const float *sp = (const float *)u->src + os;
            if (sd == 1 && ss == 1) memcpy(dp, sp, 4 * (size_t)row);
            else for (i = 0; i < row; i++) dp[i * sd] = sp[i * ss];
        } else {
            int64_t *dp = (int64_t *)u->dst + od;
            const int64_t *sp = (const int64_t *)u->src + os;
            for (i = 0; i < row; i++) dp[i * sd] = sp[i * ss];
        }
    }
}

static void dl__cpu_copy_nd(dl_ctx *c, size_t esize, int ndim, const int64_t *shape, void *dst,
                            const int64_t *ds, const void *src, const int64_t *ss)
{
    dl__copy_args u;
    int64_t rows = 1, one = 1, zero = 0;
    int d;
    if (ndim == 0) { ndim = 1; shape = &one; ds = &zero; ss = &zero; }
    for (d = 0; d < ndim - 1; d++) rows *= shape[d];
    if (shape[ndim - 1] == 0 || rows == 0) return;
    u.esize = esize; u.ndim = ndim; u.shape = shape; u.dst = (char *)dst; u.ds = ds;
    u.src = (const char *)src; u.ss = ss;
    dl__parallel_for(c->pool, rows, (1 << 14) / shape[ndim - 1] + 1, dl__copy_task, &u);
}

static void dl__cpu_fill(dl_ctx *c, float *y, int64_t n, float v)
{
    int64_t i;
    (void)c;
    for (i = 0; i < n; i++) y[i] = v;
}

static void dl__cpu_axpy(dl_ctx *c, float *y, const float *x, int64_t n, float alpha)
{
    int64_t i;
    (void)c;
    if (alpha == 1.0f) for (i = 0; i < n; i++) y[i] += x[i];
    else for (i = 0; i < n; i++) y[i] += alpha * x[i];
}

static void dl__cpu_gemm(dl_ctx *c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb,
                         int64_t sB, float beta, float *C, int64_t ldc, int64_t sC, int64_t batch)
{
    int64_t i;
    for (i = 0; i < batch; i++) {
#ifdef DL_OPENBLAS
        if (M > 0 && N > 0 && K > 0 && M < INT32_MAX && N < INT32_MAX && K < INT32_MAX) {
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                        (int)M, (int)N, (int)K, alpha, A + i * sA, (int)lda, B + i * sB, (int)ldb,
                        beta, C + i * sC, (int)ldc);
            continue;
        }
#endif
        dl__sgemm(c->pool, ta, tb, M, N, K, alpha, A + i * sA, lda, B + i * sB, ldb, beta,
                  C + i * sC, ldc);
    }
}

typedef struct dl__sm_args { bool log; float *y; const float *x; int64_t n, inner; } dl__sm_args;

static void dl__sm_task(void *p, int64_t lo, int64_t hi)
{
    const dl__sm_args *u = (const dl__sm_args *)p;
    int64_t j, k, n = u->n, in = u->inner;
    for (j = lo; j < hi; j++) {
        int64_t o = j / in, i = j % in;
        const float *x = u->x + o * n * in + i;
        float *y = u->y + o * n * in + i;
        float m = -INFINITY;
        double s = 0;
        for (k = 0; k < n; k++) if (x[k * in] > m) m = x[k * in];
        if (m == -INFINITY) m = 0;   /* all -inf: exp gives zeros, log gives -inf */
        for (k = 0; k < n; k++) s += exp((double)(x[k * in] - m));
        if (u->log) {
            float ls = (float)log(s);
            for (k = 0; k < n; k++) y[k * in] = x[k * in] - m - ls;
        } else {
            float inv = (float)(1.0 / s);
            for (k = 0; k < n; k++) y[k * in] = expf(x[k * in] - m) * inv;
        }
    }
}

static void dl__cpu_softmax(dl_ctx *c, bool log, float *y, const float *x, int64_t outer,
                            int64_t n, int64_t inner)
{
    dl__sm_args u;
    u.log = log; u.y = y; u.x = x; u.n = n; u.inner = inner;
    dl__parallel_for(c->pool, outer * inner, (1 << 14) / (n + 1) + 1, dl__sm_task, &u);
}

static int64_t dl__cpu_nonfinite(dl_ctx *c, const float *x, int64_t n)
{
    int64_t i;
    (void)c;
    for (i = 0; i < n; i++) if (!(x[i] - x[i] == 0.0f)) return i;
    return -1;
}

static const dl__kernels dl__cpu_kernels = {
    "cpu", dl__cpu_unary, dl__cpu_binary, dl__cpu_reduce, dl__cpu_argmax, dl__cpu_onehot,
    dl__cpu_copy_nd, dl__cpu_fill, dl__cpu_axpy, dl__cpu_gemm, dl__cpu_softmax, dl__cpu_nonfinite
};

static const dl__kernels *dl__K(const dl_tensor *t)
{
    (void)t;   /* the CUDA build routes device tensors to its own table here */
    return &dl__cpu_kernels;
}

// >>section autograd: recording
/* When grad mode is on and an input requires grad, an op appends a node to
   the context's tape: the op (name + backward rule), its inputs, attributes
   and output. Nodes are numbered in creation order, which is a topological
   order, so backward is a single walk down the tape. */

static bool dl__grad_on(const dl_ctx *ctx) { return ctx->no_grad == 0 && !ctx->backward_nograd; }

/* 1: recorded (*pn set), 0: not needed, -1: out of memory (error recorded). */
static int dl__record(dl_tensor *out, const dl__op *op, int n, dl_tensor *const *in, dl__node **pn)
{
    dl_ctx *ctx = out->ctx_;
    dl__node *node;
    int i;
    bool need = false;
    *pn = NULL;
    if (!dl__grad_on(ctx)) return 0;
    for (i = 0; i < n; i++) if (in[i] && in[i]->requires_grad) need = true;
    if (!need) return 0;
    node = (dl__node *)dl__arena_alloc(ctx, &ctx->hdr[ctx->step & 1],
                                       sizeof(dl__node) + sizeof(dl_tensor *) * (size_t)n, false);
    if (!node) goto oom;
    memset(node, 0, sizeof *node);
    node->op = op;
    node->out = out;
    node->nin = n;
    node->in = (dl_tensor **)(node + 1);
    for (i = 0; i < n; i++) node->in[i] = in[i];
    if (ctx->ntape == ctx->captape) {
        int64_t cap = ctx->captape ? ctx->captape * 2 : 256;
        dl__node **t = (dl__node **)DL_REALLOC(ctx->tape, sizeof(dl__node *) * (size_t)cap);
        ctx->alloc_calls++;
        if (!t) goto oom;
        ctx->tape = t;
        ctx->captape = cap;
    }
    node->id = ctx->ntape;
    ctx->tape[ctx->ntape++] = node;
    out->node_ = node;
    out->requires_grad = true;
    *pn = node;
    return 1;
oom:
    dl__err(ctx, DL_ERR_OOM, "%s: out of memory while recording the tape", op->name);
    return -1;
}

/* Last step of every op: the anomaly check. */
static dl_tensor *dl__done(dl_tensor *out, const char *op)
{
    dl_ctx *ctx;
    int64_t i;
    if (!out) return NULL;
    ctx = out->ctx_;
    if (ctx->anomaly && out->dtype == DL_DTYPE_F32) {
        i = dl__K(out)->nonfinite(ctx, (const float *)out->data, out->numel);
        if (i >= 0) {
            float v = ((const float *)out->data)[i];
            dl__err(ctx, DL_ERR_NAN, "anomaly: %s produced %s at element %lld of its output %s%s",
                    op, v != v ? "NaN" : "Inf", (long long)i, dl__sh(out),
                    ctx->in_backward_of ? "" : " (forward)");
            return NULL;
        }
    }
    return out;
}

static bool dl__need(const dl__node *n, int i) { return n->in[i] && n->in[i]->requires_grad; }
static int64_t dl__prod(const int64_t *s, int n) { int64_t p = 1; int i; for (i = 0; i < n; i++) p *= s[i]; return p; }
static void dl__strides(const int64_t *shape, int n, int64_t *st)
{
    int64_t s = 1;
    int i;
    for (i = n - 1; i >= 0; i--) { st[i] = s; s *= shape[i]; }
}
static dl_shape dl__shape_of(const dl_tensor *t) { return dl_shape_make(t->ndim, t->shape); }
static dl_shape dl__dims1(int64_t d) { return dl_shape_make(1, &d); }
static dl_tensor *dl__sum_like(dl_tensor *g, const dl_tensor *x)
{
    return dl_sum_to(g, dl__shape_of(x));
}

// >>section ops: elementwise
/* Each op: checks, output, kernel call, tape node. The backward rule below it
   is written with dl.h ops (math in the comment), so under create_graph the
   backward is itself recorded and can be differentiated again. */

static dl_tensor *dl__unary(const char *name, const dl__op *op, int kop, dl_tensor *a, float fa,
                            float fb)
{
    dl_tensor *y;
    dl__node *n;
    if (!a) return NULL;
    if (!dl__live(name, "a", a) || !dl__f32(name, "a", a)) return NULL;
    y = dl__like(name, a);
    if (!y) return NULL;
    dl__K(a)->unary(a->ctx_, kop, (float *)y->data, (const float *)a->data, a->numel, fa, fb);
    if (op) {
        if (dl__record(y, op, 1, &a, &n) < 0) return NULL;
        if (n) { n->f[0] = fa; n->f[1] = fb; }
    }
    return dl__done(y, name);
}

/* A 0/1 (or slope) mask: not differentiable, never recorded. */
static dl_tensor *dl__mask(dl_tensor *x, int kop, float a, float b)
{
    return x ? dl__unary("mask", NULL, kop, x, a, b) : NULL;
}

#define DL__G (g)
#define DL__X (n->in[0])
#define DL__Y (n->out)

/* y = -x;  dx = -g */
static dl_result dl__neg_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { (void)n; gin[0] = dl_neg(g); return DL_OK; }
/* y = exp(x);  dx = g * y */
static dl_result dl__exp_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, DL__Y); return DL_OK; }
/* y = log(x);  dx = g / x */
static dl_result dl__log_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_div(g, DL__X); return DL_OK; }
/* y = sqrt(x);  dx = g / (2 y) */
static dl_result dl__sqrt_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_div(g, dl_mul_scalar(DL__Y, 2.0f)); return DL_OK; }
/* y = |x|;  dx = g * sign(x) */
static dl_result dl__abs_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl__mask(DL__X, DL__U_SIGN, 0, 0)); return DL_OK; }
/* y = erf(x);  dx = g * 2/sqrt(pi) * exp(-x^2) */
static dl_result dl__erf_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = DL__X;
    gin[0] = dl_mul(g, dl_mul_scalar(dl_exp(dl_neg(dl_mul(x, x))), 1.1283791670955126f));
    return DL_OK;
}
/* y = clamp(x, lo, hi);  dx = g where lo <= x <= hi, else 0 */
static dl_result dl__clamp_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl__mask(DL__X, DL__U_INRANGE, n->f[0], n->f[1])); return DL_OK; }
/* y = max(x, 0);  dx = g * (x > 0) */
static dl_result dl__relu_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl__mask(DL__X, DL__U_GT, 0, 0)); return DL_OK; }
/* y = x > 0 ? x : s x;  dx = g * (x > 0 ? 1 : s) */
static dl_result dl__leaky_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl__mask(DL__X, DL__U_LEAKY_MASK, n->f[0], 0)); return DL_OK; }
/* y = 1/(1+exp(-x));  dx = g * y * (1 - y) */
static dl_result dl__sigmoid_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl_mul(DL__Y, dl_rsub_scalar(DL__Y, 1.0f))); return DL_OK; }
/* y = tanh(x);  dx = g * (1 - y^2) */
static dl_result dl__tanh_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_mul(g, dl_rsub_scalar(dl_mul(DL__Y, DL__Y), 1.0f)); return DL_OK; }
/* y = x Phi(x);  dx = g * (Phi(x) + x phi(x)), Phi(x) = (1 + erf(x/sqrt2))/2,
   phi(x) = exp(-x^2/2)/sqrt(2 pi) */
static dl_result dl__gelu_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *x = DL__X;
    dl_tensor *cdf = dl_add_scalar(dl_mul_scalar(dl_erf(dl_mul_scalar(x, 0.70710678118654752f)), 0.5f), 0.5f);
    dl_tensor *pdf = dl_mul_scalar(dl_exp(dl_mul_scalar(dl_mul(x, x), -0.5f)), 0.3989422804014327f);
    gin[0] = dl_mul(g, dl_add(cdf, dl_mul(x, pdf)));
    return DL_OK;
}
/* y = x^p;  dx = g * p * x^(p-1)   (p = 0: dx = 0) */
static dl_result dl__pow_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    float p = n->f[0];
    if (p == 0.0f) gin[0] = dl_mul_scalar(g, 0.0f);
    else if (p == 1.0f) gin[0] = g;
    else gin[0] = dl_mul(g, dl_mul_scalar(dl_pow(DL__X, p - 1.0f), p));
    return DL_OK;
}
/* y = a x + b;  dx = a g */
static dl_result dl__affine_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = n->f[0] == 1.0f ? g : dl_mul_scalar(g, n->f[0]); return DL_OK; }
/* y = x / s;  dx = g / s */
static dl_result dl__divs_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { gin[0] = dl_div_scalar(g, n->f[0]); return DL_OK; }

static const dl__op dl__op_neg = {"dl_neg", dl__neg_bwd};
static const dl__op dl__op_exp = {"dl_exp", dl__exp_bwd};
static const dl__op dl__op_log = {"dl_log", dl__log_bwd};
static const dl__op dl__op_sqrt = {"dl_sqrt", dl__sqrt_bwd};
static const dl__op dl__op_abs = {"dl_abs", dl__abs_bwd};
static const dl__op dl__op_erf = {"dl_erf", dl__erf_bwd};
static const dl__op dl__op_clamp = {"dl_clamp", dl__clamp_bwd};
static const dl__op dl__op_relu = {"dl_relu", dl__relu_bwd};
static const dl__op dl__op_leaky = {"dl_leaky_relu", dl__leaky_bwd};
static const dl__op dl__op_sigmoid = {"dl_sigmoid", dl__sigmoid_bwd};
static const dl__op dl__op_tanh = {"dl_tanh", dl__tanh_bwd};
static const dl__op dl__op_gelu = {"dl_gelu", dl__gelu_bwd};
static const dl__op dl__op_pow = {"dl_pow", dl__pow_bwd};
static const dl__op dl__op_affine = {"dl_scalar_affine", dl__affine_bwd};
static const dl__op dl__op_divs = {"dl_div_scalar", dl__divs_bwd};

dl_tensor *dl_neg(dl_tensor *a) { return dl__unary("dl_neg", &dl__op_neg, DL__U_NEG, a, 0, 0); }
dl_tensor *dl_exp(dl_tensor *a) { return dl__unary("dl_exp", &dl__op_exp, DL__U_EXP, a, 0, 0); }
dl_tensor *dl_log(dl_tensor *a) { return dl__unary("dl_log", &dl__op_log, DL__U_LOG, a, 0, 0); }
dl_tensor *dl_sqrt(dl_tensor *a) { return dl__unary("dl_sqrt", &dl__op_sqrt, DL__U_SQRT, a, 0, 0); }
dl_tensor *dl_abs(dl_tensor *a) { return dl__unary("dl_abs", &dl__op_abs, DL__U_ABS, a, 0, 0); }
dl_tensor *dl_erf(dl_tensor *a) { return dl__unary("dl_erf", &dl__op_erf, DL__U_ERF, a, 0, 0); }
dl_tensor *dl_relu(dl_tensor *a) { return dl__unary("dl_relu", &dl__op_relu, DL__U_RELU, a, 0, 0); }
dl_tensor *dl_sigmoid(dl_tensor *a) { return dl__unary("dl_sigmoid", &dl__op_sigmoid, DL__U_SIGMOID, a, 0, 0); }
dl_tensor *dl_tanh(dl_tensor *a) { return dl__unary("dl_tanh", &dl__op_tanh, DL__U_TANH, a, 0, 0); }
dl_tensor *dl_gelu(dl_tensor *a) { return dl__unary("dl_gelu", &dl__op_gelu, DL__U_GELU, a, 0, 0); }
dl_tensor *dl_leaky_relu(dl_tensor *a, float s) { return dl__unary("dl_leaky_relu", &dl__op_leaky, DL__U_LEAKY, a, s, 0); }
dl_tensor *dl_pow(dl_tensor *a, float p) { return dl__unary("dl_pow", &dl__op_pow, DL__U_POW, a, p, 0); }
dl_tensor *dl_add_scalar(dl_tensor *a, float s) { return dl__unary("dl_add_scalar", &dl__op_affine, DL__U_AFFINE, a, 1.0f, s); }
dl_tensor *dl_sub_scalar(dl_tensor *a, float s) { return dl__unary("dl_sub_scalar", &dl__op_affine, DL__U_AFFINE, a, 1.0f, -s); }
dl_tensor *dl_mul_scalar(dl_tensor *a, float s) { return dl__unary("dl_mul_scalar", &dl__op_affine, DL__U_AFFINE, a, s, 0.0f); }
dl_tensor *dl_rsub_scalar(dl_tensor *a, float s) { return dl__unary("dl_rsub_scalar", &dl__op_affine, DL__U_AFFINE, a, -1.0f, s); }
dl_tensor *dl_div_scalar(dl_tensor *a, float s) { return dl__unary("dl_div_scalar", &dl__op_divs, DL__U_DIVS, a, s, 0); }

dl_tensor *dl_clamp(dl_tensor *a, float lo, float hi)
{
    if (a && a->magic_ == DL__MAGIC && !(lo <= hi)) {
        dl__err(a->ctx_, DL_ERR_ARG, "dl_clamp: lo=%g must be <= hi=%g", (double)lo, (double)hi);
        return NULL;
    }
    return dl__unary("dl_clamp", &dl__op_clamp, DL__U_CLAMP, a, lo, hi);
}

/* Broadcast plan: align shapes on the right; sizes must match or be 1. */
static bool dl__broadcast(const char *name, const dl_tensor *a, const dl_tensor *b, dl__bcast *bc)
{
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim, d;
    int64_t sa[DL_MAX_DIMS], sb[DL_MAX_DIMS];
    dl__strides(a->shape, a->ndim, sa);
    dl__strides(b->shape, b->ndim, sb);
    bc->ndim = nd;
    bc->n = 1;
    for (d = 0; d < nd; d++) {
        int ia = d - (nd - a->ndim), ib = d - (nd - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            dl__err(a->ctx_, DL_ERR_SHAPE, "%s: a %s and b %s do not broadcast: dim %d of the "
                    "result pairs size %lld with size %lld (sizes must match or one be 1)",
                    name, dl__sh(a), dl__sh(b), d, (long long)da, (long long)db);
            return false;
        }
        bc->shape[d] = da == 1 ? db : da;
        bc->sa[d] = (da == 1) ? 0 : sa[ia];
        bc->sb[d] = (db == 1) ? 0 : sb[ib];
        bc->n *= bc->shape[d];
    }
    return true;
}

static dl_tensor *dl__binary(const char *name, const dl__op *op, int kop, dl_tensor *a, dl_tensor *b)
{
    dl__bcast bc;
    dl_tensor *y, *in[2];
    dl__node *n;
    if (!a || !b) return NULL;
    if (!dl__live(name, "a", a) || !dl__live(name, "b", b)) return NULL;
    if (!dl__pair(name, a, b) || !dl__f32(name, "a", a) || !dl__f32(name, "b", b)) return NULL;
    if (!dl__broadcast(name, a, b, &bc)) return NULL;
    y = dl__new(a->ctx_, name, bc.ndim, bc.shape);
    if (!y) return NULL;
    y->device = a->device;
    dl__K(a)->binary(a->ctx_, kop, (float *)y->data, (const float *)a->data,
                     (const float *)b->data, &bc);
    in[0] = a;
    in[1] = b;
    if (op && dl__record(y, op, 2, in, &n) < 0) return NULL;
    return dl__done(y, name);
}

static dl_tensor *dl__bmask(dl_tensor *a, dl_tensor *b, int kop)
{
    return dl__binary("mask", NULL, kop, a, b);
}

#define DL__A (n->in[0])
#define DL__B (n->in[1])
/* y = a + b;  da = sum_to(g), db = sum_to(g) */
static dl_result dl__add_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(g, DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(g, DL__B);
    return DL_OK;
}
/* y = a - b;  da = g, db = -g */
static dl_result dl__sub_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(g, DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_neg(g), DL__B);
    return DL_OK;
}
/* y = a * b;  da = g b, db = g a */
static dl_result dl__mul_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_mul(g, DL__B), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_mul(g, DL__A), DL__B);
    return DL_OK;
}
/* y = a / b;  da = g / b, db = -g y / b */
static dl_result dl__div_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_div(g, DL__B), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_neg(dl_div(dl_mul(g, DL__Y), DL__B)), DL__B);
    return DL_OK;
}
/* y = max(a, b);  da = g [a > b] + g/2 [a == b] (as PyTorch), db likewise */
static dl_result dl__maximum_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_mul(g, dl__bmask(DL__A, DL__B, DL__B_GT_HALF)), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_mul(g, dl__bmask(DL__B, DL__A, DL__B_GT_HALF)), DL__B);
    return DL_OK;
}
static dl_result dl__minimum_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl__sum_like(dl_mul(g, dl__bmask(DL__A, DL__B, DL__B_LT_HALF)), DL__A);
    if (dl__need(n, 1)) gin[1] = dl__sum_like(dl_mul(g, dl__bmask(DL__B, DL__A, DL__B_LT_HALF)), DL__B);
    return DL_OK;
}

static const dl__op dl__op_add = {"dl_add", dl__add_bwd};
static const dl__op dl__op_sub = {"dl_sub", dl__sub_bwd};
static const dl__op dl__op_mul = {"dl_mul", dl__mul_bwd};
static const dl__op dl__op_div = {"dl_div", dl__div_bwd};
static const dl__op dl__op_maximum = {"dl_maximum", dl__maximum_bwd};
static const dl__op dl__op_minimum = {"dl_minimum", dl__minimum_bwd};

dl_tensor *dl_add(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_add", &dl__op_add, DL__B_ADD, a, b); }
dl_tensor *dl_sub(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_sub", &dl__op_sub, DL__B_SUB, a, b); }
dl_tensor *dl_mul(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_mul", &dl__op_mul, DL__B_MUL, a, b); }
dl_tensor *dl_div(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_div", &dl__op_div, DL__B_DIV, a, b); }
dl_tensor *dl_maximum(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_maximum", &dl__op_maximum, DL__B_MAX, a, b); }
dl_tensor *dl_minimum(dl_tensor *a, dl_tensor *b) { return dl__binary("dl_minimum", &dl__op_minimum, DL__B_MIN, a, b); }

// >>section ops: shape
/* reshape and friends make a new header over the same storage (a view);
   everything that reorders elements copies through the copy_nd kernel, so
   every kernel sees contiguous row-major data. */

static dl_tensor *dl__view(const char *name, const dl__op *op, dl_tensor *t, int ndim,
                           const int64_t *shape)
{
    dl_tensor *y;
    dl__node *n;
    y = dl__make(t->ctx_, name, t->dtype, ndim, shape, false, t->data);
    if (!y) return NULL;
    y->device = t->device;
    if (op && dl__record(y, op, 1, &t, &n) < 0) return NULL;
    return y;
}

/* view;  dx = reshape(g, x.shape) */
static dl_result dl__reshape_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl_reshape(g, dl__shape_of(DL__X));
    return DL_OK;
}
static const dl__op dl__op_reshape = {"dl_reshape", dl__reshape_bwd};

dl_tensor *dl_reshape(dl_tensor *t, dl_shape shape)
{
    int i, neg = -1;
    int64_t known = 1;
    int64_t out[DL_MAX_DIMS];
    if (!t) return NULL;
    if (!dl__live("dl_reshape", "t", t)) return NULL;
    if (shape.ndim < 0 || shape.ndim > DL_MAX_DIMS) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: %d dims requested; at most %d", shape.ndim, DL_MAX_DIMS);
        return NULL;
    }
    for (i = 0; i < shape.ndim; i++) {
        out[i] = shape.d[i];
        if (shape.d[i] == -1) {
            if (neg >= 0) {
                dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: shape %s has more than one -1",
                        dl__shp(t->ctx_, &shape));
                return NULL;
            }
            neg = i;
        } else if (shape.d[i] < 0) {
            dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: shape %s has a negative size other than -1",
                    dl__shp(t->ctx_, &shape));
            return NULL;
        } else {
            if (shape.d[i] && known > INT64_MAX / shape.d[i]) known = INT64_MAX;
            else known *= shape.d[i];
        }
    }
    if (neg >= 0) {
        if (known == 0 || t->numel % known != 0) {
            dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: cannot reshape %s (%lld elements) to %s: "
                    "the -1 has no whole-number size", dl__sh(t), (long long)t->numel,
                    dl__shp(t->ctx_, &shape));
            return NULL;
        }
        out[neg] = t->numel / known;
        known = t->numel;
    }
    if (known != t->numel) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_reshape: cannot reshape %s (%lld elements) to %s "
                "(%lld elements): the element counts must be equal", dl__sh(t),
                (long long)t->numel, dl__shp(t->ctx_, &shape), (long long)known);
        return NULL;
    }
    return dl__view("dl_reshape", &dl__op_reshape, t, shape.ndim, out);
}

dl_tensor *dl_flatten(dl_tensor *t, int start, int end)
{
    int64_t out[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_flatten", "t", t)) return NULL;
    if (t->ndim == 0) return dl_reshape(t, dl__dims1(1));
    if (!dl__dim("dl_flatten", t, &start, t->ndim) || !dl__dim("dl_flatten", t, &end, t->ndim)) return NULL;
    if (start > end) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_flatten: start_dim %d comes after end_dim %d", start, end);
        return NULL;
    }
    for (i = 0; i < start; i++) out[k++] = t->shape[i];
    out[k++] = dl__prod(t->shape + start, end - start + 1);
    for (i = end + 1; i < t->ndim; i++) out[k++] = t->shape[i];
    return dl_reshape(t, dl_shape_make(k, out));
}

dl_tensor *dl_squeeze(dl_tensor *t, int dim)
{
    int64_t out[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_squeeze", "t", t)) return NULL;
    if (!dl__dim("dl_squeeze", t, &dim, t->ndim)) return NULL;
    for (i = 0; i < t->ndim; i++)
        if (i != dim || t->shape[i] != 1) out[k++] = t->shape[i];   /* size != 1: no-op, as PyTorch */
    return dl_reshape(t, dl_shape_make(k, out));
}

dl_tensor *dl_unsqueeze(dl_tensor *t, int dim)
{
    int64_t out[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_unsqueeze", "t", t)) return NULL;
    if (t->ndim >= DL_MAX_DIMS) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_unsqueeze: t %s already has DL_MAX_DIMS=%d dims", dl__sh(t), DL_MAX_DIMS);
        return NULL;
    }
    if (!dl__dim("dl_unsqueeze", t, &dim, t->ndim + 1)) return NULL;
    for (i = 0; i <= t->ndim; i++) {
        if (i == dim) out[k++] = 1;
        if (i < t->ndim) out[k++] = t->shape[i];
    }
    return dl_reshape(t, dl_shape_make(k, out));
}

/* A copy of t with its elements read through src_strides (elements) and an offset. */
static dl_tensor *dl__gather_copy(const char *name, dl_tensor *t, int ndim, const int64_t *shape,
                                  const int64_t *src_strides, int64_t offset)
{
    int64_t ds[DL_MAX_DIMS];
    dl_tensor *y = dl__make(t->ctx_, name, t->dtype, ndim, shape, false, NULL);
    if (!y) return NULL;
    y->device = t->device;
    dl__strides(shape, ndim, ds);
    if (y->numel)
        dl__K(t)->copy_nd(t->ctx_, dl__esize(t->dtype), ndim, shape, y->data, ds,
                          (const char *)t->data + offset * (int64_t)dl__esize(t->dtype), src_strides);
    return y;
}

/* y = permute(x, p);  dx = permute(g, inverse(p)) */
static dl_result dl__permute_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_shape inv;
    int i;
    inv.ndim = n->ni;
    for (i = 0; i < n->ni; i++) inv.d[n->i[i]] = i;
    gin[0] = dl_permute(g, inv);
    return DL_OK;
}
static const dl__op dl__op_permute = {"dl_permute", dl__permute_bwd};

dl_tensor *dl_permute(dl_tensor *t, dl_shape perm)
{
    int64_t st[DL_MAX_DIMS], ss[DL_MAX_DIMS], shape[DL_MAX_DIMS];
    bool seen[DL_MAX_DIMS];
    int i;
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_permute", "t", t)) return NULL;
    if (perm.ndim != t->ndim) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_permute: t %s has %d dims but perm %s has %d", dl__sh(t),
                t->ndim, dl__shp(t->ctx_, &perm), perm.ndim);
        return NULL;
    }
    memset(seen, 0, sizeof seen);
    dl__strides(t->shape, t->ndim, st);
    for (i = 0; i < t->ndim; i++) {
        int d = (int)perm.d[i];
        if (perm.d[i] < -t->ndim || perm.d[i] >= t->ndim || seen[d < 0 ? d + t->ndim : d]) {
            dl__err(t->ctx_, DL_ERR_ARG, "dl_permute: perm %s is not a permutation of the %d dims of t %s",
                    dl__shp(t->ctx_, &perm), t->ndim, dl__sh(t));
            return NULL;
        }
        if (d < 0) d += t->ndim;
        seen[d] = true;
        perm.d[i] = d;
        shape[i] = t->shape[d];
        ss[i] = st[d];
    }
    y = dl__gather_copy("dl_permute", t, t->ndim, shape, ss, 0);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_permute, 1, &t, &n) < 0) return NULL;
    if (n) { n->ni = t->ndim; for (i = 0; i < t->ndim; i++) n->i[i] = perm.d[i]; }
    return dl__done(y, "dl_permute");
}

dl_tensor *dl_transpose(dl_tensor *t, int d0, int d1)
{
    dl_shape p;
    int i;
    if (!t) return NULL;
    if (!dl__live("dl_transpose", "t", t)) return NULL;
    if (!dl__dim("dl_transpose", t, &d0, t->ndim) || !dl__dim("dl_transpose", t, &d1, t->ndim)) return NULL;
    p.ndim = t->ndim;
    for (i = 0; i < t->ndim; i++) p.d[i] = i;
    p.d[d0] = d1;
    p.d[d1] = d0;
    return dl_permute(t, p);
}

/* Place g into zeros of the full shape at [start, start+len) along dim:
   the backward of narrow, itself differentiable (its backward is narrow). */
static dl_tensor *dl__unnarrow(dl_tensor *g, int dim, int64_t start, int64_t full);
/* y = narrow(x, dim, start, len);  dx = unnarrow(g) */
static dl_result dl__narrow_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unnarrow(g, (int)n->i[0], n->i[1], DL__X->shape[n->i[0]]);
    return DL_OK;
}
/* y = unnarrow(g);  dg = narrow(gy) */
static dl_result dl__unnarrow_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl_narrow(g, (int)n->i[0], n->i[1], DL__X->shape[n->i[0]]);
    return DL_OK;
}
static const dl__op dl__op_narrow = {"dl_narrow", dl__narrow_bwd};
static const dl__op dl__op_unnarrow = {"dl_narrow_backward", dl__unnarrow_bwd};

dl_tensor *dl_narrow(dl_tensor *t, int dim, int64_t start, int64_t len)
{
    int64_t st[DL_MAX_DIMS], shape[DL_MAX_DIMS];
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_narrow", "t", t)) return NULL;
    if (!dl__dim("dl_narrow", t, &dim, t->ndim)) return NULL;
    if (start < 0) start += t->shape[dim];
    if (start < 0 || len < 0 || start > t->shape[dim] || len > t->shape[dim] - start) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_narrow: start %lld, length %lld do not fit in dim %d of "
                "size %lld of t %s", (long long)start, (long long)len, dim,
                (long long)t->shape[dim], dl__sh(t));
        return NULL;
    }
    dl__strides(t->shape, t->ndim, st);
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    shape[dim] = len;
    y = dl__gather_copy("dl_narrow", t, t->ndim, shape, st, start * st[dim]);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_narrow, 1, &t, &n) < 0) return NULL;
    if (n) { n->i[0] = dim; n->i[1] = start; }
    return dl__done(y, "dl_narrow");
}

static dl_tensor *dl__unnarrow(dl_tensor *g, int dim, int64_t start, int64_t full)
{
    int64_t shape[DL_MAX_DIMS], ds[DL_MAX_DIMS], ss[DL_MAX_DIMS];
    dl_tensor *y;
    dl__node *n;
    if (!g) return NULL;
    memcpy(shape, g->shape, sizeof(int64_t) * (size_t)g->ndim);
    shape[dim] = full;
    y = dl__new(g->ctx_, "dl_narrow_backward", g->ndim, shape);
    if (!y) return NULL;
    dl__K(g)->fill(g->ctx_, (float *)y->data, y->numel, 0.0f);
    dl__strides(shape, g->ndim, ds);
    dl__strides(g->shape, g->ndim, ss);
    if (g->numel)
        dl__K(g)->copy_nd(g->ctx_, 4, g->ndim, g->shape, (float *)y->data + start * ds[dim], ds,
                          g->data, ss);
    if (dl__record(y, &dl__op_unnarrow, 1, &g, &n) < 0) return NULL;
    if (n) { n->i[0] = dim; n->i[1] = start; }
    return dl__done(y, "dl_narrow_backward");
}

/* y = cat(x_i, dim);  dx_i = narrow(g, dim, offset_i, size_i) */
static dl_result dl__cat_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int i, dim = (int)n->i[0];
    int64_t off = 0;
    for (i = 0; i < n->nin; i++) {
        if (dl__need(n, i)) gin[i] = dl_narrow(g, dim, off, n->in[i]->shape[dim]);
        off += n->in[i]->shape[dim];
    }
    return DL_OK;
}
static const dl__op dl__op_cat = {"dl_cat", dl__cat_bwd};

dl_tensor *dl_cat(int n, dl_tensor *const *ts, int dim)
{
    int i, d;
    int64_t shape[DL_MAX_DIMS], ds[DL_MAX_DIMS], ss[DL_MAX_DIMS], off = 0;
    dl_tensor *t0, *y;
    dl__node *node;
    if (!ts || n <= 0) return NULL;
    for (i = 0; i < n; i++) if (!ts[i]) return NULL;
    t0 = ts[0];
    for (i = 0; i < n; i++) if (!dl__live("dl_cat", "an input", ts[i])) return NULL;
    if (!dl__dim("dl_cat", t0, &dim, t0->ndim)) return NULL;
    memcpy(shape, t0->shape, sizeof(int64_t) * (size_t)t0->ndim);
    shape[dim] = 0;
    for (i = 0; i < n; i++) {
        const dl_tensor *t = ts[i];
        if (!dl__pair("dl_cat", t0, t)) return NULL;
        if (t->dtype != t0->dtype) {
            dl__err(t0->ctx_, DL_ERR_DTYPE, "dl_cat: input %d %s has dtype %s but input 0 %s has "
                    "%s; all inputs must share a dtype", i, dl__sh(t), dl__dtype_str(t->dtype),
                    dl__sh(t0), dl__dtype_str(t0->dtype));
            return NULL;
        }
        if (t->ndim != t0->ndim) goto bad;
        for (d = 0; d < t0->ndim; d++) if (d != dim && t->shape[d] != t0->shape[d]) goto bad;
        shape[dim] += t->shape[dim];
        continue;
    bad:
        dl__err(t0->ctx_, DL_ERR_SHAPE, "dl_cat: input %d %s %s does not fit input 0 %s %s: "
                "all dims but dim %d must match", i, dl__sh(t),
                dl__dtype_str(t->dtype), dl__sh(t0), dl__dtype_str(t0->dtype), dim);
        return NULL;
    }
    y = dl__make(t0->ctx_, "dl_cat", t0->dtype, t0->ndim, shape, false, NULL);
    if (!y) return NULL;
    y->device = t0->device;
    dl__strides(shape, t0->ndim, ds);
    for (i = 0; i < n; i++) {
        dl__strides(ts[i]->shape, t0->ndim, ss);
        if (ts[i]->numel)
            dl__K(t0)->copy_nd(t0->ctx_, dl__esize(t0->dtype), t0->ndim, ts[i]->shape,
                               (char *)y->data + off * ds[dim] * (int64_t)dl__esize(t0->dtype), ds,
                               ts[i]->data, ss);
        off += ts[i]->shape[dim];
    }
    if (dl__record(y, &dl__op_cat, n, ts, &node) < 0) return NULL;
    if (node) node->i[0] = dim;
    return dl__done(y, "dl_cat");
}

dl_tensor *dl_stack(int n, dl_tensor *const *ts, int dim)
{
    dl_tensor **u;
    dl_ctx *ctx;
    int i;
    if (!ts || n <= 0) return NULL;
    for (i = 0; i < n; i++) if (!ts[i]) return NULL;
    if (!dl__live("dl_stack", "input 0", ts[0])) return NULL;
    ctx = ts[0]->ctx_;
    for (i = 1; i < n; i++)
        if (!dl__live("dl_stack", "an input", ts[i])) return NULL;
        else if (!dl_same_shape(ts[i], ts[0])) {
            dl__err(ctx, DL_ERR_SHAPE, "dl_stack: input %d %s and input 0 %s: all inputs must have "
                    "the same shape", i, dl__sh(ts[i]), dl__sh(ts[0]));
            return NULL;
        }
    u = (dl_tensor **)dl__arena_alloc(ctx, &ctx->hdr[ctx->step & 1], sizeof(dl_tensor *) * (size_t)n, false);
    if (!u) { dl__err(ctx, DL_ERR_OOM, "dl_stack: out of memory"); return NULL; }
    if (dim < 0) dim += ts[0]->ndim + 1;   /* insert position counts the new dim */
    for (i = 0; i < n; i++) if (!(u[i] = dl_unsqueeze(ts[i], dim))) return NULL;
    return dl_cat(n, u, dim);
}

/* y = expand(x);  dx = sum_to(g, x.shape) */
static dl_result dl__expand_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__sum_like(g, DL__X);
    return DL_OK;
}
static const dl__op dl__op_expand = {"dl_expand", dl__expand_bwd};

dl_tensor *dl_expand(dl_tensor *t, dl_shape shape)
{
    int64_t st[DL_MAX_DIMS], ss[DL_MAX_DIMS], out[DL_MAX_DIMS];
    int d, nd = shape.ndim;
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_expand", "t", t)) return NULL;
    if (nd < t->ndim || nd > DL_MAX_DIMS) goto bad;
    dl__strides(t->shape, t->ndim, st);
    for (d = 0; d < nd; d++) {
        int it = d - (nd - t->ndim);
        int64_t dt = it >= 0 ? t->shape[it] : 1, want = shape.d[d];
        if (want == -1 && it >= 0) want = dt;
        if (want < 0 || (dt != want && dt != 1)) goto bad;
        out[d] = want;
        ss[d] = (it >= 0 && dt != 1) ? st[it] : 0;
    }
    y = dl__gather_copy("dl_expand", t, nd, out, ss, 0);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_expand, 1, &t, &n) < 0) return NULL;
    return dl__done(y, "dl_expand");
bad:
    dl__err(t->ctx_, DL_ERR_SHAPE, "dl_expand: t %s cannot be broadcast to %s (sizes must match "
            "or be 1, aligned from the right)", dl__sh(t), dl__shp(t->ctx_, &shape));
    return NULL;
}

dl_tensor *dl_sum_to(dl_tensor *t, dl_shape shape)
{
    dl_shape dims;
    int d, lead;
    if (!t) return NULL;
    if (!dl__live("dl_sum_to", "t", t)) return NULL;
    lead = t->ndim - shape.ndim;
    if (lead < 0) goto bad;
    dims.ndim = 0;
    for (d = 0; d < t->ndim; d++) {
        if (d < lead) { dims.d[dims.ndim++] = d; continue; }
        if (shape.d[d - lead] == t->shape[d]) continue;
        if (shape.d[d - lead] != 1) goto bad;
        dims.d[dims.ndim++] = d;
    }
    if (dims.ndim == 0) return t->ndim == shape.ndim ? t : dl_reshape(t, shape);
    return dl_reshape(dl_sum(t, dims, true), shape);
bad:
    dl__err(t->ctx_, DL_ERR_SHAPE, "dl_sum_to: t %s cannot be summed to %s (the target must "
            "broadcast to t's shape)", dl__sh(t), dl__shp(t->ctx_, &shape));
    return NULL;
}

// >>section ops: reductions
/* Reductions run one kernel pass per run of adjacent reduced dims, as
   (outer, reduced, inner) blocks. The result is computed with keepdim and
   viewed without the size-1 dims when keepdim is false. */

static bool dl__red_mask(const char *name, const dl_tensor *t, dl_shape dims, bool *mask)
{
    int i;
    memset(mask, 0, sizeof(bool) * DL_MAX_DIMS);
    if (dims.ndim == 0) { for (i = 0; i < t->ndim; i++) mask[i] = true; return true; }
    if (dims.ndim < 0 || dims.ndim > DL_MAX_DIMS) {
        dl__err(t->ctx_, DL_ERR_ARG, "%s: %d dims given", name, dims.ndim);
        return false;
    }
    for (i = 0; i < dims.ndim; i++) {
        int d = (int)dims.d[i];
        if (dims.d[i] < -t->ndim || dims.d[i] >= t->ndim) {
            dl__err(t->ctx_, DL_ERR_ARG, "%s: dim %lld is out of range for a tensor of shape %s "
                    "(valid: %d..%d)", name, (long long)dims.d[i], dl__sh(t), -t->ndim, t->ndim - 1);
            return false;
        }
        if (d < 0) d += t->ndim;
        if (mask[d]) {
            dl__err(t->ctx_, DL_ERR_ARG, "%s: dim %d appears twice in dims", name, d);
            return false;
        }
        mask[d] = true;
    }
    return true;
}

/* Reduce x over the masked dims into a new keepdim-shaped tensor (no tape). */
static dl_tensor *dl__reduce_raw(const char *name, int rop, dl_tensor *x, const bool *mask)
{
    int64_t shape[DL_MAX_DIMS];
    dl_tensor *cur = x;
    int d = x->ndim - 1;
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    while (d >= 0) {
        int hi, lo;
        int64_t outer, r, inner;
        dl_tensor *y;
        if (!mask[d]) { d--; continue; }
        hi = d;
        while (d >= 0 && mask[d]) d--;
        lo = d + 1;
        outer = dl__prod(shape, lo);
        r = dl__prod(shape + lo, hi - lo + 1);
        inner = dl__prod(shape + hi + 1, x->ndim - hi - 1);
        {
            int k;
            for (k = lo; k <= hi; k++) shape[k] = 1;
        }
        y = dl__new(x->ctx_, name, x->ndim, shape);
        if (!y) return NULL;
        y->device = x->device;
        dl__K(x)->reduce(x->ctx_, rop, (float *)y->data, (const float *)cur->data, outer, r, inner);
        cur = y;
    }
    if (cur == x) {   /* nothing to reduce: a copy */
        cur = dl__like(name, x);
        if (!cur) return NULL;
        if (x->numel) {
            int64_t st[DL_MAX_DIMS];
            dl__strides(x->shape, x->ndim, st);
            dl__K(x)->copy_nd(x->ctx_, 4, x->ndim, x->shape, cur->data, st, x->data, st);
        }
    }
    return cur;
}

/* keepdim-shaped tensor -> the shape without reduced dims (a plain view) */
static dl_tensor *dl__drop_dims(const char *name, dl_tensor *y, const bool *mask, bool keepdim)
{
    int64_t shape[DL_MAX_DIMS];
    int i, k = 0;
    if (!y || keepdim) return y;
    for (i = 0; i < y->ndim; i++) if (!mask[i]) shape[k++] = y->shape[i];
    return dl__view(name, NULL, y, k, shape);
}

static void dl__keep_shape(const dl__node *n, int64_t *shape)
{
    int i;
    const dl_tensor *x = n->in[0];
    for (i = 0; i < x->ndim; i++) shape[i] = (n->i[0] >> i) & 1 ? 1 : x->shape[i];
}

/* y = sum(x, dims);  dx = expand(reshape(g, keepdim shape), x.shape) */
static dl_result dl__sum_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int64_t ks[DL_MAX_DIMS];
    dl__keep_shape(n, ks);
    gin[0] = dl_expand(dl_reshape(g, dl_shape_make(DL__X->ndim, ks)), dl__shape_of(DL__X));
    return DL_OK;
}
static const dl__op dl__op_sum = {"dl_sum", dl__sum_bwd};

static int64_t dl__mask_bits(const bool *mask, int nd)
{
    int64_t b = 0;
    int i;
    for (i = 0; i < nd; i++) if (mask[i]) b |= (int64_t)1 << i;
    return b;
}

dl_tensor *dl_sum(dl_tensor *t, dl_shape dims, bool keepdim)
{
    bool mask[DL_MAX_DIMS];
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live("dl_sum", "t", t) || !dl__f32("dl_sum", "t", t)) return NULL;
    if (!dl__red_mask("dl_sum", t, dims, mask)) return NULL;
    y = dl__drop_dims("dl_sum", dl__reduce_raw("dl_sum", DL__R_SUM, t, mask), mask, keepdim);
    if (!y) return NULL;
    if (dl__record(y, &dl__op_sum, 1, &t, &n) < 0) return NULL;
    if (n) n->i[0] = dl__mask_bits(mask, t->ndim);
    return dl__done(y, "dl_sum");
}

dl_tensor *dl_mean(dl_tensor *t, dl_shape dims, bool keepdim)
{
    bool mask[DL_MAX_DIMS];
    int64_t cnt = 1;
    int i;
    if (!t) return NULL;
    if (!dl__live("dl_mean", "t", t) || !dl__f32("dl_mean", "t", t)) return NULL;
    if (!dl__red_mask("dl_mean", t, dims, mask)) return NULL;
    for (i = 0; i < t->ndim; i++) if (mask[i]) cnt *= t->shape[i];
    return dl_div_scalar(dl_sum(t, dims, keepdim), (float)cnt);
}

/* one dim:  y = max(x, dim);  dx = onehot(argmax) * g
   several:  y = amax(x, dims); dx = [x == y] * g / count([x == y])  (ties share) */
static dl_result dl__max_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int64_t ks[DL_MAX_DIMS];
    dl_tensor *gk, *x = DL__X;
    dl__keep_shape(n, ks);
    gk = dl_reshape(g, dl_shape_make(x->ndim, ks));
    if (n->nsaved) {   /* single dim: route to the recorded arg-max */
        dl_tensor *idx = n->saved[0], *mask;
        int dim = (int)n->i[1];
        mask = dl__new(x->ctx_, "dl_max", x->ndim, x->shape);
        if (!mask) return DL_ERR_OOM;
        dl__K(x)->onehot(x->ctx_, (float *)mask->data, (const int64_t *)idx->data,
                         dl__prod(x->shape, dim), x->shape[dim],
                         dl__prod(x->shape + dim + 1, x->ndim - dim - 1));
        gin[0] = dl_mul(mask, gk);
    } else {
        bool mask[DL_MAX_DIMS];
        int i;
        dl_tensor *eq, *cnt;
        for (i = 0; i < x->ndim; i++) mask[i] = (n->i[0] >> i) & 1;
        eq = dl__bmask(x, dl_reshape(DL__Y, dl_shape_make(x->ndim, ks)), DL__B_EQ);
        cnt = eq ? dl__reduce_raw("dl_max", DL__R_SUM, eq, mask) : NULL;
        gin[0] = dl_mul(eq, dl_div(gk, cnt));
    }
    return DL_OK;
}
static const dl__op dl__op_max = {"dl_max", dl__max_bwd};

dl_tensor *dl_max(dl_tensor *t, dl_shape dims, bool keepdim)
{
    bool mask[DL_MAX_DIMS];
    dl_tensor *y, *idx = NULL;
    dl__node *n;
    int i, nred = 0, dim = 0;
    if (!t) return NULL;
    if (!dl__live("dl_max", "t", t) || !dl__f32("dl_max", "t", t)) return NULL;
    if (!dl__red_mask("dl_max", t, dims, mask)) return NULL;
    for (i = 0; i < t->ndim; i++)
        if (mask[i]) {
            nred++;
            dim = i;
            if (t->shape[i] == 0) {
                dl__err(t->ctx_, DL_ERR_SHAPE, "dl_max: cannot reduce dim %d of size 0 of t %s "
                        "(max of nothing)", i, dl__sh(t));
                return NULL;
            }
        }
    y = dl__reduce_raw("dl_max", DL__R_MAX, t, mask);
    if (!y) return NULL;
    if (nred == 1 && dims.ndim == 1 && dl__grad_on(t->ctx_) && t->requires_grad) {
        idx = dl__make(t->ctx_, "dl_max", DL_DTYPE_I64, y->ndim, y->shape, false, NULL);
        if (!idx) return NULL;
        dl__K(t)->argmax(t->ctx_, (int64_t *)idx->data, (const float *)t->data,
                         dl__prod(t->shape, dim), t->shape[dim],
                         dl__prod(t->shape + dim + 1, t->ndim - dim - 1));
    }
    {   /* the node keeps the keepdim-shaped values for the tie mask */
        dl_tensor *yk = y;
        y = dl__drop_dims("dl_max", yk, mask, keepdim);
        if (!y) return NULL;
    }
    if (dl__record(y, &dl__op_max, 1, &t, &n) < 0) return NULL;
    if (n) {
        n->i[0] = dl__mask_bits(mask, t->ndim);
        n->i[1] = dim;
        if (idx) { n->saved[0] = idx; n->nsaved = 1; }
    }
    return dl__done(y, "dl_max");
}

dl_tensor *dl_min(dl_tensor *t, dl_shape dims, bool keepdim)
{
    return dl_neg(dl_max(dl_neg(t), dims, keepdim));
}

dl_tensor *dl_var(dl_tensor *t, dl_shape dims, int correction, bool keepdim)
{
    bool mask[DL_MAX_DIMS];
    int64_t cnt = 1;
    int i;
    dl_tensor *d;
    if (!t) return NULL;
    if (!dl__live("dl_var", "t", t) || !dl__f32("dl_var", "t", t)) return NULL;
    if (!dl__red_mask("dl_var", t, dims, mask)) return NULL;
    for (i = 0; i < t->ndim; i++) if (mask[i]) cnt *= t->shape[i];
    d = dl_sub(t, dl_mean(t, dims, true));
    return dl_div_scalar(dl_sum(dl_mul(d, d), dims, keepdim),
                         (float)(cnt - correction > 0 ? cnt - correction : 0));
}

dl_tensor *dl_argmax(dl_tensor *t, int dim, bool keepdim)
{
    dl_tensor *y;
    int64_t shape[DL_MAX_DIMS];
    int i, k = 0;
    if (!t) return NULL;
    if (!dl__live("dl_argmax", "t", t) || !dl__f32("dl_argmax", "t", t)) return NULL;
    if (!dl__dim("dl_argmax", t, &dim, t->ndim)) return NULL;
    if (t->shape[dim] == 0) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_argmax: dim %d of t %s has size 0", dim, dl__sh(t));
        return NULL;
    }
    for (i = 0; i < t->ndim; i++)
        if (i != dim) shape[k++] = t->shape[i];
        else if (keepdim) shape[k++] = 1;
    y = dl__make(t->ctx_, "dl_argmax", DL_DTYPE_I64, k, shape, false, NULL);
    if (!y) return NULL;
    y->device = t->device;
    dl__K(t)->argmax(t->ctx_, (int64_t *)y->data, (const float *)t->data, dl__prod(t->shape, dim),
                     t->shape[dim], dl__prod(t->shape + dim + 1, t->ndim - dim - 1));
    return y;
}

// >>section ops: matmul and softmax
/* dl__mm computes op(a) @ op(b) over broadcast batch dims, where op
   transposes the last two dims when asked. Keeping the transposes as flags
   lets each backward product be a single GEMM with no copies:
     C = op(A) op(B):  dA = g op(B)^T  (or op(B) g^T when A is transposed)
                       dB = op(A)^T g  (or g^T op(A) when B is transposed). */

static dl_tensor *dl__expand_raw(dl_tensor *t, int nd, const int64_t *shape)
{
    int64_t st[DL_MAX_DIMS], ss[DL_MAX_DIMS];
    int d;
    dl__strides(t->shape, t->ndim, st);
    for (d = 0; d < nd; d++) {
        int it = d - (nd - t->ndim);
        ss[d] = (it >= 0 && t->shape[it] != 1) ? st[it] : 0;
    }
    return dl__gather_copy("dl_matmul", t, nd, shape, ss, 0);
}

static dl_tensor *dl__mm(dl_tensor *a, dl_tensor *b, bool ta, bool tb);

static dl_result dl__mm_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl_tensor *a = DL__A, *b = DL__B;
    bool ta = n->i[0] != 0, tb = n->i[1] != 0;
    if (dl__need(n, 0))
        gin[0] = dl__sum_like(ta ? dl__mm(b, g, tb, true) : dl__mm(g, b, false, !tb), a);
    if (dl__need(n, 1))
        gin[1] = dl__sum_like(tb ? dl__mm(g, a, true, ta) : dl__mm(a, g, !ta, false), b);
    return DL_OK;
}
static const dl__op dl__op_mm = {"dl_matmul", dl__mm_bwd};

static dl_tensor *dl__mm(dl_tensor *a, dl_tensor *b, bool ta, bool tb)
{
    int na, nb, nd, d;
    int64_t M, K, K2, N, bshape[DL_MAX_DIMS], batch, batchA, batchB;
    dl_tensor *y, *in[2];
    dl__node *n;
    const dl__kernels *k;
    if (!a || !b) return NULL;
    na = a->ndim; nb = b->ndim;
    M = ta ? a->shape[na - 1] : a->shape[na - 2];
    K = ta ? a->shape[na - 2] : a->shape[na - 1];
    K2 = tb ? b->shape[nb - 1] : b->shape[nb - 2];
    N = tb ? b->shape[nb - 2] : b->shape[nb - 1];
    if (K != K2) {
        dl__err(a->ctx_, DL_ERR_SHAPE, "dl_matmul: a %s x b %s: a.shape[%d]=%lld must equal "
                "b.shape[%d]=%lld", dl__sh(a), dl__sh(b), ta ? na - 2 : na - 1, (long long)K,
                tb ? nb - 1 : nb - 2, (long long)K2);
        return NULL;
    }
    nd = (na > nb ? na : nb) - 2;
    for (d = 0; d < nd; d++) {
        int ia = d - (nd - (na - 2)), ib = d - (nd - (nb - 2));
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            dl__err(a->ctx_, DL_ERR_SHAPE, "dl_matmul: a %s x b %s: batch dims do not broadcast "
                    "(%lld vs %lld at batch dim %d)", dl__sh(a), dl__sh(b), (long long)da,
                    (long long)db, d);
            return NULL;
        }
        bshape[d] = da == 1 ? db : da;
    }
    bshape[nd] = M;
    bshape[nd + 1] = N;
    y = dl__new(a->ctx_, "dl_matmul", nd + 2, bshape);
    if (!y) return NULL;
    y->device = a->device;
    batch = dl__prod(bshape, nd);
    batchA = dl__prod(a->shape, na - 2);
    batchB = dl__prod(b->shape, nb - 2);
    k = dl__K(a);
    if (y->numel == 0) {
    } else if (K == 0) {
        k->fill(a->ctx_, (float *)y->data, y->numel, 0.0f);
    } else if (batchB == 1 && !ta && batchA == batch) {
        /* fold a's batch into its rows: one GEMM */
        k->gemm(a->ctx_, false, tb, batch * M, N, K, 1.0f, (const float *)a->data, K, 0,
                (const float *)b->data, tb ? K : N, 0, 0.0f, (float *)y->data, N, 0, 1);
    } else {
        int64_t sa[DL_MAX_DIMS], sb[DL_MAX_DIMS];
        dl_tensor *A = a, *B = b;
        memcpy(sa, bshape, sizeof(int64_t) * (size_t)nd);
        memcpy(sb, bshape, sizeof(int64_t) * (size_t)nd);
        sa[nd] = a->shape[na - 2]; sa[nd + 1] = a->shape[na - 1];
        sb[nd] = b->shape[nb - 2]; sb[nd + 1] = b->shape[nb - 1];
        if (batchA != batch && !(A = dl__expand_raw(a, nd + 2, sa))) return NULL;
        if (batchB != batch && !(B = dl__expand_raw(b, nd + 2, sb))) return NULL;
        k->gemm(a->ctx_, ta, tb, M, N, K, 1.0f, (const float *)A->data, ta ? M : K, M * K,
                (const float *)B->data, tb ? K : N, K * N, 0.0f, (float *)y->data, N, M * N, batch);
    }
    in[0] = a;
    in[1] = b;
    if (dl__record(y, &dl__op_mm, 2, in, &n) < 0) return NULL;
    if (n) { n->i[0] = ta; n->i[1] = tb; }
    return dl__done(y, "dl_matmul");
}

dl_tensor *dl_matmul(dl_tensor *a, dl_tensor *b)
{
    bool va, vb;
    dl_tensor *y;
    if (!a || !b) return NULL;
    if (!dl__live("dl_matmul", "a", a) || !dl__live("dl_matmul", "b", b)) return NULL;
    if (!dl__pair("dl_matmul", a, b) || !dl__f32("dl_matmul", "a", a) || !dl__f32("dl_matmul", "b", b)) return NULL;
    if (a->ndim == 0 || b->ndim == 0) {
        dl__err(a->ctx_, DL_ERR_SHAPE, "dl_matmul: a %s x b %s: both operands need at least 1 dim",
                dl__sh(a), dl__sh(b));
        return NULL;
    }
    va = a->ndim == 1;
    vb = b->ndim == 1;
    if (va) a = dl_unsqueeze(a, 0);
    if (vb) b = dl_unsqueeze(b, 1);
    y = dl__mm(a, b, false, false);
    if (va) y = dl_squeeze(y, -2);
    if (vb) y = dl_squeeze(y, -1);
    return y;
}

/* y = softmax(x);      dx = y * (g - sum(g * y, dim))
   y = log_softmax(x);  dx = g - exp(y) * sum(g, dim) */
static dl_result dl__softmax_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int dim = (int)n->i[0];
    gin[0] = dl_mul(DL__Y, dl_sub(g, dl_sum(dl_mul(g, DL__Y), dl__dims1(dim), true)));
    return DL_OK;
}
static dl_result dl__log_softmax_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    int dim = (int)n->i[0];
    gin[0] = dl_sub(g, dl_mul(dl_exp(DL__Y), dl_sum(g, dl__dims1(dim), true)));
    return DL_OK;
}
static const dl__op dl__op_softmax = {"dl_softmax", dl__softmax_bwd};
static const dl__op dl__op_log_softmax = {"dl_log_softmax", dl__log_softmax_bwd};

static dl_tensor *dl__softmax(const char *name, const dl__op *op, bool log, dl_tensor *t, int dim)
{
    dl_tensor *y;
    dl__node *n;
    if (!t) return NULL;
    if (!dl__live(name, "t", t) || !dl__f32(name, "t", t)) return NULL;
    if (t->ndim == 0) t = dl_reshape(t, dl__dims1(1));   /* as PyTorch: a scalar is one class */
    if (!t || !dl__dim(name, t, &dim, t->ndim)) return NULL;
    y = dl__like(name, t);
    if (!y) return NULL;
    if (y->numel)
        dl__K(t)->softmax(t->ctx_, log, (float *)y->data, (const float *)t->data,
                          dl__prod(t->shape, dim), t->shape[dim],
                          dl__prod(t->shape + dim + 1, t->ndim - dim - 1));
    if (dl__record(y, op, 1, &t, &n) < 0) return NULL;
    if (n) n->i[0] = dim;
    return dl__done(y, name);
}

dl_tensor *dl_softmax(dl_tensor *t, int dim) { return dl__softmax("dl_softmax", &dl__op_softmax, false, t, dim); }
dl_tensor *dl_log_softmax(dl_tensor *t, int dim) { return dl__softmax("dl_log_softmax", &dl__op_log_softmax, true, t, dim); }

// >>section tensors: creation and reading
static dl_tensor *dl__create(dl_ctx *ctx, const char *name, dl_shape shape)
{
    if (!ctx) return NULL;
    if (shape.ndim < 0 || shape.ndim > DL_MAX_DIMS) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: %d dims requested; at most DL_MAX_DIMS=%d", name,
                shape.ndim, DL_MAX_DIMS);
        return NULL;
    }
    return dl__new(ctx, name, shape.ndim, shape.d);
}

dl_tensor *dl_empty(dl_ctx *ctx, dl_shape shape) { return dl__create(ctx, "dl_empty", shape); }

static dl_tensor *dl__filled(dl_ctx *ctx, const char *name, dl_shape shape, float v)
{
    dl_tensor *t = dl__create(ctx, name, shape);
    if (t) dl__K(t)->fill(ctx, (float *)t->data, t->numel, v);
    return t;
}
dl_tensor *dl_full(dl_ctx *ctx, dl_shape shape, float v) { return dl__filled(ctx, "dl_full", shape, v); }
dl_tensor *dl_zeros(dl_ctx *ctx, dl_shape shape) { return dl__filled(ctx, "dl_zeros", shape, 0.0f); }
dl_tensor *dl_ones(dl_ctx *ctx, dl_shape shape) { return dl__filled(ctx, "dl_ones", shape, 1.0f); }

dl_tensor *dl_zeros_like(dl_tensor *t)
{
    if (!t || !dl__live("dl_zeros_like", "t", t)) return NULL;
    return dl__filled(t->ctx_, "dl_zeros_like", dl__shape_of(t), 0.0f);
}
dl_tensor *dl_ones_like(dl_tensor *t)
{
    if (!t || !dl__live("dl_ones_like", "t", t)) return NULL;
    return dl__filled(t->ctx_, "dl_ones_like", dl__shape_of(t), 1.0f);
}

dl_tensor *dl_arange(dl_ctx *ctx, float start, float end, float step)
{
    double n;
    int64_t i, cnt;
    dl_tensor *t;
    if (!ctx) return NULL;
    if (step == 0.0f || !(start == start) || !(end == end)) {
        dl__err(ctx, DL_ERR_ARG, "dl_arange: step must be non-zero and bounds finite (start %g, end %g, step %g)",
                (double)start, (double)end, (double)step);
        return NULL;
    }
    n = ceil(((double)end - (double)start) / (double)step);
    if (n < 0) n = 0;
    if (n > 1e15) {
        dl__err(ctx, DL_ERR_OOM, "dl_arange: %g elements is too many", n);
        return NULL;
    }
    cnt = (int64_t)n;
    t = dl__new(ctx, "dl_arange", 1, &cnt);
    if (!t) return NULL;
    for (i = 0; i < cnt; i++) ((float *)t->data)[i] = (float)((double)start + (double)i * (double)step);
    return t;
}

dl_tensor *dl_rand(dl_ctx *ctx, dl_shape shape)
{
    dl_tensor *t = dl__create(ctx, "dl_rand", shape);
    int64_t i;
    if (t) for (i = 0; i < t->numel; i++) ((float *)t->data)[i] = dl__rng_uniform(ctx->rng);
    return t;
}

dl_tensor *dl_randn(dl_ctx *ctx, dl_shape shape)
{
    dl_tensor *t = dl__create(ctx, "dl_randn", shape);
    int64_t i;
    if (t) for (i = 0; i < t->numel; i++) ((float *)t->data)[i] = dl__rng_normal(ctx->rng);
    return t;
}

static dl_tensor *dl__from(dl_ctx *ctx, const char *name, dl_dtype dt, dl_shape shape, const void *v)
{
    dl_tensor *t;
    if (!ctx) return NULL;
    if (!v) { dl__err(ctx, DL_ERR_ARG, "%s: values is NULL", name); return NULL; }
    if (shape.ndim < 0 || shape.ndim > DL_MAX_DIMS) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: %d dims requested; at most DL_MAX_DIMS=%d", name, shape.ndim, DL_MAX_DIMS);
        return NULL;
    }
    t = dl__make(ctx, name, dt, shape.ndim, shape.d, false, NULL);
    if (t && t->numel) memcpy(t->data, v, (size_t)t->numel * dl__esize(dt));
    return t;
}
dl_tensor *dl_from_array(dl_ctx *ctx, dl_shape s, const float *v) { return dl__from(ctx, "dl_from_array", DL_DTYPE_F32, s, v); }
dl_tensor *dl_from_int64(dl_ctx *ctx, dl_shape s, const int64_t *v) { return dl__from(ctx, "dl_from_int64", DL_DTYPE_I64, s, v); }
dl_tensor *dl_from_int32(dl_ctx *ctx, dl_shape s, const int32_t *v) { return dl__from(ctx, "dl_from_int32", DL_DTYPE_I32, s, v); }

/* y = copy(x);  dx = g */
static dl_result dl__copy_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin) { (void)n; gin[0] = g; return DL_OK; }
static const dl__op dl__op_copy = {"dl_copy", dl__copy_bwd};

static dl_tensor *dl__clone(const char *name, dl_tensor *t, bool persistent)
{
    int64_t st[DL_MAX_DIMS];
    dl_tensor *y = dl__make(t->ctx_, name, t->dtype, t->ndim, t->shape, persistent, NULL);
    if (!y) return NULL;
    y->device = t->device;
    dl__strides(t->shape, t->ndim, st);
    if (t->numel) dl__K(t)->copy_nd(t->ctx_, dl__esize(t->dtype), t->ndim, t->shape, y->data, st, t->data, st);
    return y;
}

dl_tensor *dl_copy(dl_tensor *t)
{
    dl_tensor *y;
    dl__node *n;
    if (!t || !dl__live("dl_copy", "t", t)) return NULL;
    y = dl__clone("dl_copy", t, false);
    if (!y || dl__record(y, &dl__op_copy, 1, &t, &n) < 0) return NULL;
    return dl__done(y, "dl_copy");
}

dl_tensor *dl_keep(dl_tensor *t)
{
    dl_tensor *y;
    if (!t || !dl__live("dl_keep", "t", t)) return NULL;
    y = dl__clone("dl_keep", t, true);
    if (y) memcpy(y->name, t->name, sizeof y->name);
    return y;
}

void dl_free(dl_tensor *t)
{
    if (!t || t->magic_ != DL__MAGIC) return;
    if (t->step_ != 0) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_free: t %s is a step tensor; dl_step_end() releases it", dl__sh(t));
        return;
    }
    if (t->grad && t->grad->step_ == 0) dl__persist_release(t->grad);
    dl__persist_release(t);
}

dl_tensor *dl_to(dl_tensor *t, dl_device dev)
{
    char b[32];
    if (!t || !dl__live("dl_to", "t", t)) return NULL;
    if (dev.type == t->device.type && dev.index == t->device.index) return t;
    dl__err(t->ctx_, DL_ERR_DEVICE, "dl_to: device %s is not available: this build has no CUDA "
            "support (compile with -DDL_CUDA)", dl__dev_str(dev, b, sizeof b));
    return NULL;
}

dl_tensor *dl_set_name(dl_tensor *t, const char *name)
{
    if (!t || t->magic_ != DL__MAGIC) return t;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    return t;
}

static bool dl__host_f32(const char *name, dl_tensor *t)
{
    char b[32];
    if (!t || !dl__live(name, "t", t)) return false;
    if (t->device.type != DL_DEVICE_CPU) {
        dl__err(t->ctx_, DL_ERR_DEVICE, "%s: t %s is on %s; copy it with dl_to(t, dl_cpu()) first",
                name, dl__sh(t), dl__dev_str(t->device, b, sizeof b));
        return false;
    }
    return true;
}

float dl_item(dl_tensor *t)
{
    if (!dl__host_f32("dl_item", t) || !dl__f32("dl_item", "t", t)) return NAN;
    if (t->numel != 1) {
        dl__err(t->ctx_, DL_ERR_SHAPE, "dl_item: t %s has %lld elements; dl_item needs exactly 1",
                dl__sh(t), (long long)t->numel);
        return NAN;
    }
    return ((const float *)t->data)[0];
}

dl_result dl_read(dl_tensor *t, float *dst, int64_t n)
{
    if (!t) return DL_ERR_ARG;
    if (!dl__host_f32("dl_read", t)) return t->magic_ == DL__MAGIC ? t->ctx_->err : DL_ERR_ARG;
    if (!dl__f32("dl_read", "t", t)) return DL_ERR_DTYPE;
    if (!dst || n != t->numel) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_read: t %s has %lld elements but dst holds %lld%s",
                dl__sh(t), (long long)t->numel, (long long)n, dst ? "" : " (dst is NULL)");
        return DL_ERR_ARG;
    }
    if (n) memcpy(dst, t->data, sizeof(float) * (size_t)n);
    return DL_OK;
}

dl_result dl_read_int64(dl_tensor *t, int64_t *dst, int64_t n)
{
    int64_t i;
    if (!t) return DL_ERR_ARG;
    if (!dl__host_f32("dl_read_int64", t)) return t->magic_ == DL__MAGIC ? t->ctx_->err : DL_ERR_ARG;
    if (!dst || n != t->numel) {
        dl__err(t->ctx_, DL_ERR_ARG, "dl_read_int64: t %s has %lld elements but dst holds %lld",
                dl__sh(t), (long long)t->numel, (long long)n);
        return DL_ERR_ARG;
    }
    for (i = 0; i < n; i++)
        dst[i] = t->dtype == DL_DTYPE_I64 ? ((const int64_t *)t->data)[i]
               : t->dtype == DL_DTYPE_I32 ? (int64_t)((const int32_t *)t->data)[i]
               : (int64_t)((const float *)t->data)[i];
    return DL_OK;
}

float *dl_data(dl_tensor *t)
{
    if (!dl__host_f32("dl_data", t) || !dl__f32("dl_data", "t", t)) return NULL;
    return (float *)t->data;
}

int64_t dl_size(const dl_tensor *t, int dim)
{
    if (!t || t->magic_ != DL__MAGIC) return -1;
    if (dim < 0) dim += t->ndim;
    if (dim < 0 || dim >= t->ndim) return -1;
    return t->shape[dim];
}

bool dl_same_shape(const dl_tensor *a, const dl_tensor *b)
{
    if (!a || !b || a->ndim != b->ndim) return false;
    return a->ndim == 0 || memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

void dl_print(dl_tensor *t)
{
    int64_t i;
    if (!t || !dl__host_f32("dl_print", t)) { printf("tensor(NULL)\n"); return; }
    printf("tensor%s %s%s [", dl__sh(t), dl__dtype_str(t->dtype), t->requires_grad ? " requires_grad" : "");
    for (i = 0; i < t->numel && i < 64; i++) {
        if (t->dtype == DL_DTYPE_F32) printf(i ? ", %.6g" : "%.6g", (double)((const float *)t->data)[i]);
        else if (t->dtype == DL_DTYPE_I64) printf(i ? ", %lld" : "%lld", (long long)((const int64_t *)t->data)[i]);
        else printf(i ? ", %d" : "%d", ((const int32_t *)t->data)[i]);
    }
    printf("%s]\n", t->numel > 64 ? ", ..." : "");
}

// >>section autograd: backward
/* dl_backward seeds the output's node with a gradient and walks the tape
   from that node down to 0. A node with an accumulated gradient runs its
   backward rule; the results go to the input's producing node (accumulated
   with dl_add) or, for leaves, into ->grad. Without create_graph the rules run
   with grad mode off; with it, they record onto the tape like any forward. */

dl_tensor *dl_requires_grad(dl_tensor *t, bool on)
{
    if (!t || !dl__live("dl_requires_grad", "t", t)) return NULL;
    if (t->node_) {
        dl__err(t->ctx_, DL_ERR_GRAPH, "dl_requires_grad: t %s is the output of %s, not a leaf; "
                "use dl_detach() to make a leaf", dl__sh(t), t->node_->op->name);
        return NULL;
    }
    if (on && t->dtype != DL_DTYPE_F32) {
        dl__err(t->ctx_, DL_ERR_DTYPE, "dl_requires_grad: t %s has dtype %s; only float32 tensors "
                "can require grad", dl__sh(t), dl__dtype_str(t->dtype));
        return NULL;
    }
    t->requires_grad = on;
    return t;
}

void dl_no_grad_begin(dl_ctx *ctx) { if (ctx) ctx->no_grad++; }
void dl_no_grad_end(dl_ctx *ctx) { if (ctx && ctx->no_grad > 0) ctx->no_grad--; }
bool dl_is_grad_enabled(const dl_ctx *ctx) { return ctx && dl__grad_on(ctx); }

dl_tensor *dl_detach(dl_tensor *t)
{
    if (!t || !dl__live("dl_detach", "t", t)) return NULL;
    return dl__view("dl_detach", NULL, t, t->ndim, t->shape);
}

void dl_zero_grad(dl_tensor *t)
{
    if (!t || t->magic_ != DL__MAGIC || !t->grad) return;
    dl__K(t)->fill(t->ctx_, (float *)t->grad->data, t->grad->numel, 0.0f);
}

void dl_sgd_update(dl_tensor *p, float lr)
{
    if (!p || !dl__live("dl_sgd_update", "p", p) || !p->grad) return;
    dl__K(p)->axpy(p->ctx_, (float *)p->data, (const float *)p->grad->data, p->numel, -lr);
    dl_zero_grad(p);
}

/* Accumulate g into leaf x's gradient. Persistent leaves keep a persistent
   ->grad updated in place; step leaves a step one (with history under
   create_graph, so it can be differentiated again). */
static bool dl__acc_leaf(dl_tensor *x, dl_tensor *g, bool create_graph)
{
    dl_ctx *ctx = x->ctx_;
    if (create_graph && x->step_ != 0) {
        x->grad = x->grad ? dl_add(x->grad, g) : g;
        return x->grad != NULL;
    }
    if (!x->grad) {
        x->grad = dl__make(ctx, "dl_backward", DL_DTYPE_F32, x->ndim, x->shape, x->step_ == 0, NULL);
        if (!x->grad) return false;
        x->grad->device = x->device;
        dl__K(x)->fill(ctx, (float *)x->grad->data, x->numel, 0.0f);
    }
    dl__K(x)->axpy(ctx, (float *)x->grad->data, (const float *)g->data, x->numel, 1.0f);
    return true;
}

static dl_result dl__run_backward(const char *name, dl_tensor *out, const dl_backward_desc *desc,
                                  int nt, dl_tensor *const *targets, dl_tensor **results)
{
    dl_ctx *ctx;
    dl_tensor *seed = NULL;
    bool retain, create;
    int64_t i, top;
    int j;
    dl_result rc = DL_OK;
    bool saved_bng;
    if (!out) return DL_ERR_ARG;
    if (!dl__live(name, "out", out)) return out->magic_ == DL__MAGIC ? out->ctx_->err : DL_ERR_ARG;
    ctx = out->ctx_;
    create = desc && desc->create_graph;
    retain = create || (desc && desc->retain_graph);
    if (!out->requires_grad) {
        dl__err(ctx, DL_ERR_GRAPH, "%s: out %s does not require grad: no input was marked with "
                "dl_requires_grad(), or it was computed under dl_no_grad_begin()", name, dl__sh(out));
        return DL_ERR_GRAPH;
    }
    if (desc && desc->grad) {
        seed = desc->grad;
        if (!dl__live(name, "grad", seed)) return ctx->err;
        if (!dl_same_shape(seed, out)) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: grad %s must have the shape of out %s", name,
                    dl__sh(seed), dl__sh(out));
            return DL_ERR_SHAPE;
        }
    } else {
        if (out->numel != 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: out %s has %lld elements; a gradient can be implied "
                    "only for one element: pass dl_backward_desc.grad", name, dl__sh(out),
                    (long long)out->numel);
            return DL_ERR_SHAPE;
        }
        seed = dl_ones_like(out);
        if (!seed) return ctx->err;
    }
    for (j = 0; j < nt; j++) results[j] = NULL;
    if (!out->node_) {   /* a leaf: its gradient is the seed */
        for (j = 0; j < nt; j++) if (targets[j] == out) results[j] = seed;
        if (nt == 0 && !dl__acc_leaf(out, seed, create)) return ctx->err;
        return DL_OK;
    }
    if (out->node_->released) goto freed;
    saved_bng = ctx->backward_nograd;
    ctx->backward_nograd = !create;
    top = out->node_->id;
    out->node_->gacc = seed;
    for (i = top; i >= 0; i--) {
        dl__node *n = ctx->tape[i];
        dl_tensor *gin[64], **gp = gin, *g = n->gacc;
        if (!g) continue;
        n->gacc = NULL;
        for (j = 0; j < nt; j++) if (targets[j] == n->out) results[j] = g;
        if (n->released) { ctx->backward_nograd = saved_bng; out = n->out; goto freed_n; }
        if (n->nin > 64) {
            gp = (dl_tensor **)dl__arena_alloc(ctx, &ctx->hdr[ctx->step & 1],
                                               sizeof(dl_tensor *) * (size_t)n->nin, false);
            if (!gp) { dl__err(ctx, DL_ERR_OOM, "%s: out of memory", name); rc = DL_ERR_OOM; break; }
        }
        for (j = 0; j < n->nin; j++) gp[j] = NULL;
        ctx->in_backward_of = n->op->name;
        if (n->fn) rc = n->fn->backward((dl_fn_ctx *)n, g, gp, n->user);
        else rc = n->op->backward(n, g, gp);
        if (!retain) n->released = true;
        for (j = 0; j < n->nin && rc == DL_OK; j++) {
            dl_tensor *x = n->in[j], *gj = gp[j];
            if (!x || !x->requires_grad) continue;
            if (!gj) {
                if (n->fn) continue;   /* a custom function may give no gradient */
                rc = ctx->err != DL_OK ? ctx->err : DL_ERR_GRAPH;
                if (ctx->err == DL_OK)
                    dl__err(ctx, DL_ERR_GRAPH, "%s: the backward rule gave no gradient for input %d", name, j);
                break;
            }
            if (gj->magic_ != DL__MAGIC || !dl_same_shape(gj, x)) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: the gradient for input %d has shape %s but the "
                        "input has shape %s", name, j, dl__sh(gj), dl__sh(x));
                rc = DL_ERR_SHAPE;
                break;
            }
            if (ctx->anomaly && !dl__done(gj, n->op->name)) { rc = DL_ERR_NAN; break; }
            if (x->node_) {
                if (x->node_->gacc) x->node_->gacc = dl_add(x->node_->gacc, gj);
                else x->node_->gacc = gj;
                if (!x->node_->gacc) { rc = ctx->err; break; }
            } else if (nt) {
                int k;
                for (k = 0; k < nt; k++)
                    if (targets[k] == x) {
                        results[k] = results[k] ? dl_add(results[k], gj) : gj;
                        if (!results[k]) rc = ctx->err;
                    }
            } else if (!dl__acc_leaf(x, gj, create)) {
                rc = ctx->err;
            }
        }
        ctx->in_backward_of = NULL;
        if (rc != DL_OK) break;
    }
    ctx->in_backward_of = NULL;
    ctx->backward_nograd = saved_bng;
    if (rc != DL_OK) for (; i >= 0; i--) ctx->tape[i]->gacc = NULL;
    return rc;
freed_n:
    for (; i >= 0; i--) ctx->tape[i]->gacc = NULL;
freed:
    dl__err(ctx, DL_ERR_GRAPH, "%s: the graph through %s was already freed by an earlier "
            "backward; pass retain_graph = true to the first one to backward twice", name,
            out->node_->op->name);
    return DL_ERR_GRAPH;
}

dl_result dl_backward(dl_tensor *loss) { return dl__run_backward("dl_backward", loss, NULL, 0, NULL, NULL); }
dl_result dl_backward_ex(dl_tensor *out, const dl_backward_desc *d)
{
    return dl__run_backward("dl_backward", out, d, 0, NULL, NULL);
}

dl_result dl_grad(dl_tensor *out, int n, dl_tensor *const *inputs, dl_tensor **grads,
                  const dl_backward_desc *d)
{
    int i;
    if (!out) return DL_ERR_ARG;
    if (n <= 0 || !inputs || !grads) {
        if (out->magic_ == DL__MAGIC)
            dl__err(out->ctx_, DL_ERR_ARG, "dl_grad: need at least one input and an output array");
        return DL_ERR_ARG;
    }
    for (i = 0; i < n; i++) {
        if (!inputs[i] || !dl__live("dl_grad", "an input", inputs[i])) return DL_ERR_ARG;
        if (!inputs[i]->requires_grad) {
            dl__err(out->ctx_, DL_ERR_GRAPH, "dl_grad: input %d %s does not require grad", i,
                    dl__sh(inputs[i]));
            return DL_ERR_GRAPH;
        }
    }
    return dl__run_backward("dl_grad", out, d, n, inputs, grads);
}

// >>section autograd: custom functions
dl_tensor *dl_function_apply(const dl_function *fn, int n, dl_tensor *const *inputs, void *user)
{
    dl_ctx *ctx;
    dl_tensor *y;
    dl__node *node;
    dl_fn_ctx tmp;
    int i;
    if (!fn || !inputs || n <= 0) return NULL;
    for (i = 0; i < n; i++) if (!inputs[i]) return NULL;
    for (i = 0; i < n; i++) if (!dl__live(fn->name ? fn->name : "dl_function_apply", "an input", inputs[i])) return NULL;
    ctx = inputs[0]->ctx_;
    if (!fn->forward || !fn->backward) {
        dl__err(ctx, DL_ERR_ARG, "dl_function_apply: %s needs both forward and backward",
                fn->name ? fn->name : "function");
        return NULL;
    }
    memset(&tmp, 0, sizeof tmp);
    tmp.node.in = (dl_tensor **)inputs;
    tmp.node.nin = n;
    dl_no_grad_begin(ctx);
    y = fn->forward(&tmp, n, inputs, user);
    dl_no_grad_end(ctx);
    if (!y) return NULL;
    if (y->node_ || y->step_ == 0) y = dl_detach(y);   /* the output must be a fresh step tensor */
    if (!y) return NULL;
    {
        static const dl__op custom = {"custom function", NULL};
        if (dl__record(y, &custom, n, inputs, &node) < 0) return NULL;
    }
    if (node) {
        node->fn = fn;
        node->user = user;
        node->nsaved = tmp.node.nsaved;
        memcpy(node->saved, tmp.node.saved, sizeof node->saved);
    }
    return dl__done(y, fn->name ? fn->name : "custom function");
}

void dl_fn_save(dl_fn_ctx *fc, dl_tensor *t)
{
    if (!fc) return;
    if (fc->node.nsaved >= DL__NSAVED) {
        if (t && t->magic_ == DL__MAGIC) dl__err(t->ctx_, DL_ERR_ARG, "dl_fn_save: at most %d tensors", DL__NSAVED);
        return;
    }
    fc->node.saved[fc->node.nsaved++] = t;
}
dl_tensor *dl_fn_saved(dl_fn_ctx *fc, int i) { return fc && i >= 0 && i < fc->node.nsaved ? fc->node.saved[i] : NULL; }
bool dl_fn_needs_grad(dl_fn_ctx *fc, int i) { return fc && i >= 0 && i < fc->node.nin && fc->node.in[i]->requires_grad; }

// >>section debug: gradcheck, graph, anomaly
void dl_set_anomaly(dl_ctx *ctx, bool on) { if (ctx) ctx->anomaly = on; }

/* sum(out * r) in double, on the host */
static double dl__proj(dl_tensor *out, const float *r)
{
    double s = 0;
    int64_t i;
    const float *o = (const float *)out->data;
    for (i = 0; i < out->numel; i++) s += (double)o[i] * (double)r[i];
    return s;
}

dl_result dl_gradcheck(dl_ctx *ctx, dl_gradcheck_fn f, void *user, int n, dl_tensor *const *inputs,
                       const dl_gradcheck_desc *desc, dl_gradcheck_result *res)
{
    double eps = desc && desc->eps > 0 ? desc->eps : 1e-3;
    double atol = desc && desc->atol > 0 ? desc->atol : 1e-3;
    double rtol = desc && desc->rtol > 0 ? desc->rtol : 1e-2;
    uint64_t rs[4];
    dl_tensor *out, *r, *L, *grads[DL_GRADCHECK_MAX_INPUTS];
    dl_tensor *need[DL_GRADCHECK_MAX_INPUTS];
    int k, nn = 0, map[DL_GRADCHECK_MAX_INPUTS];
    dl_result rc;
    if (!ctx || !f || !res || !inputs) return DL_ERR_ARG;
    memset(res, 0, sizeof *res);
    if (n <= 0 || n > DL_GRADCHECK_MAX_INPUTS) {
        dl__err(ctx, DL_ERR_ARG, "dl_gradcheck: %d inputs; 1..%d supported", n, DL_GRADCHECK_MAX_INPUTS);
        return DL_ERR_ARG;
    }
    for (k = 0; k < n; k++) {
        if (!inputs[k] || !dl__live("dl_gradcheck", "an input", inputs[k])) return DL_ERR_ARG;
        if (inputs[k]->requires_grad) { map[nn] = k; need[nn++] = inputs[k]; }
    }
    res->n = n;
    res->ok = true;
    out = f(user, inputs);
    if (!out) return ctx->err != DL_OK ? ctx->err : DL_ERR_ARG;
    if (!dl__f32("dl_gradcheck", "the output", out)) return DL_ERR_DTYPE;
    /* fixed random projection: checks J^T r, every input element */
    {
        uint64_t save[4];
        memcpy(save, ctx->rng, sizeof save);
        dl_manual_seed(ctx, desc && desc->seed ? desc->seed : 1);
        r = dl_randn(ctx, dl__shape_of(out));
        memcpy(rs, ctx->rng, sizeof rs);
        memcpy(ctx->rng, save, sizeof save);
        (void)rs;
    }
    if (!r) return ctx->err;
    if (nn == 0) return DL_OK;
    L = dl_sum(dl_mul(out, r), DL_ALL, false);
    if (!L) return ctx->err;
    if (!L->requires_grad) {
        for (k = 0; k < nn; k++) grads[k] = NULL;
    } else {
        rc = dl_grad(L, nn, need, grads, NULL);
        if (rc != DL_OK) return rc;
    }
    for (k = 0; k < nn; k++) {
        dl_tensor *x = need[k];
        float *xd = (float *)x->data;
        const float *ga = grads[k] ? (const float *)grads[k]->data : NULL;
        int64_t i;
        int slot = map[k];
        for (i = 0; i < x->numel; i++) {
            float orig = xd[i];
            double lp, lm, num, an, err, rel;
            dl__mark m1 = dl__arena_mark(&ctx->data), m2 = dl__arena_mark(&ctx->hdr[ctx->step & 1]);
            int64_t nt = ctx->ntape;
            dl_tensor *o;
            dl_no_grad_begin(ctx);
            xd[i] = (float)(orig + eps);
            o = f(user, inputs);
            lp = o ? dl__proj(o, (const float *)r->data) : NAN;
            xd[i] = (float)(orig - eps);
            o = o ? f(user, inputs) : NULL;
            lm = o ? dl__proj(o, (const float *)r->data) : NAN;
            xd[i] = orig;
            dl_no_grad_end(ctx);
            dl__arena_rewind(&ctx->data, m1);
            dl__arena_rewind(&ctx->hdr[ctx->step & 1], m2);
            ctx->ntape = nt;
            if (!o) return ctx->err;
            num = (lp - lm) / (2.0 * eps);
            an = ga ? ga[i] : 0.0;
            err = fabs(an - num);
            rel = (fabs(an) > atol || fabs(num) > atol) ? err / (fabs(an) > fabs(num) ? fabs(an) : fabs(num)) : 0.0;
            if (err > res->max_abs_err[slot]) { res->max_abs_err[slot] = err; res->worst_index[slot] = i; }
            if (rel > res->max_rel_err[slot]) res->max_rel_err[slot] = rel;
            if (!(err <= atol + rtol * fabs(num))) res->ok = false;
        }
    }
    return DL_OK;
}

static void dl__dot_tensor(FILE *f, const dl_tensor *t, const char *style)
{
    char sh[128];
    int i, k = 0;
    k += snprintf(sh + k, sizeof sh - (size_t)k, "(");
    for (i = 0; i < t->ndim && k < 100; i++) k += snprintf(sh + k, sizeof sh - (size_t)k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    snprintf(sh + k, sizeof sh - (size_t)k, ")");
    fprintf(f, "  t%p [shape=ellipse, %s, label=\"%s%s%s%s\"];\n", (const void *)t, style,
            t->name[0] ? t->name : "", t->name[0] ? "\\n" : "", sh,
            t->requires_grad ? "\\nrequires_grad" : "");
}

dl_result dl_graph_dot(dl_tensor *root, const char *path)
{
    dl_ctx *ctx;
    FILE *f;
    dl__node **stack;
    int64_t sp = 0, cap;
    if (!root) return DL_ERR_ARG;
    if (!dl__live("dl_graph_dot", "root", root)) return DL_ERR_ARG;
    ctx = root->ctx_;
    if (!path) { dl__err(ctx, DL_ERR_ARG, "dl_graph_dot: path is NULL"); return DL_ERR_ARG; }
    f = fopen(path, "w");
    if (!f) { dl__err(ctx, DL_ERR_IO, "dl_graph_dot: cannot open '%s' for writing", path); return DL_ERR_IO; }
    fprintf(f, "digraph dl {\n  rankdir=BT;\n  node [fontname=\"Helvetica\", fontsize=10];\n");
    dl__dot_tensor(f, root, "style=filled, fillcolor=\"#ffd9b3\"");
    cap = ctx->ntape + 1;
    stack = (dl__node **)DL_MALLOC(sizeof(dl__node *) * (size_t)cap);
    if (!stack) { fclose(f); dl__err(ctx, DL_ERR_OOM, "dl_graph_dot: out of memory"); return DL_ERR_OOM; }
    ctx->visit++;
    if (root->node_) { root->node_->visit = ctx->visit; stack[sp++] = root->node_; }
    while (sp > 0) {
        dl__node *n = stack[--sp];
        int j;
        fprintf(f, "  n%p [shape=box, style=filled, fillcolor=\"#cfe2f3\", label=\"%s\"];\n",
                (const void *)n, n->fn && n->fn->name ? n->fn->name : n->op->name);
        fprintf(f, "  n%p -> t%p;\n", (const void *)n, (const void *)n->out);
        for (j = 0; j < n->nin; j++) {
            dl_tensor *x = n->in[j];
            if (!x) continue;
            if (x->node_) {
                if (x->node_->visit != ctx->visit) {
                    x->node_->visit = ctx->visit;
                    if (sp < cap) stack[sp++] = x->node_;
                    dl__dot_tensor(f, x, "style=solid");
                }
            } else {
                dl__dot_tensor(f, x, x->requires_grad ? "style=filled, fillcolor=\"#d9ead3\"" : "style=dashed");
            }
            fprintf(f, "  t%p -> n%p;\n", (const void *)x, (const void *)n);
        }
    }
    fprintf(f, "}\n");
    DL_FREE(stack);
    if (fclose(f) != 0) { dl__err(ctx, DL_ERR_IO, "dl_graph_dot: error writing '%s'", path); return DL_ERR_IO; }
    return DL_OK;
}

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

/* parts/nn_ops_impl.h - normalization, dropout and losses (implementation).
   Appended to dl.h's implementation section. */
#if defined(DL_IMPLEMENTATION) && !defined(DL__NN_OPS_IMPLEMENTED)
#define DL__NN_OPS_IMPLEMENTED

// >>section ops: normalization, dropout, losses
/* Everything here but binary_cross_entropy_with_logits is a composite of
   differentiable dl.h ops, so gradients (and gradients of gradients) come
   from their rules. The non-differentiable pieces (class one-hot masks from
   integer targets, dropout masks) come from a small kernel table of their
   own, dispatched per device like dl__K, so a GPU backend can supply them. */

typedef struct dl__nn_kernels {
    const char *name;
    /* Class-index targets (outer*inner of them, int64 if i64 else int32) ->
       onehot (outer, C, inner): 1 at [o, target, i], 0 elsewhere and for
       ignored targets; valid (outer*inner): 1, or 0 where ignored. Returns
       -1, or the first flat index of a target outside [0,C) that is not
       ignore_index (its value in *bad); then the masks are undefined. */
    int64_t (*class_mask)(dl_ctx *c, float *onehot, float *valid, const void *target, bool i64,
                          int64_t outer, int64_t C, int64_t inner, int64_t ignore_index,
                          int64_t *bad);
    /* mask[i] = scale, or 0 with probability p; a counter-based hash of
       (seed, i), so any split of the work gives the same mask */
    void (*dropout_mask)(dl_ctx *c, float *mask, int64_t n, float p, float scale, uint64_t seed);
    /* out[i] = max(x,0) - x*y + log1p(exp(-|x|)) */
    void (*bce_logits)(dl_ctx *c, float *out, const float *x, const float *y, int64_t n);
} dl__nn_kernels;

static int64_t dl__nn_cpu_class_mask(dl_ctx *c, float *onehot, float *valid, const void *target,
                                     bool i64, int64_t outer, int64_t C, int64_t inner,
                                     int64_t ignore_index, int64_t *bad)
{
    int64_t o, i;
    (void)c;
    if (outer > 0 && C > 0 && inner > 0) memset(onehot, 0, sizeof(float) * (size_t)(outer * C * inner));
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            int64_t j = o * inner + i;
            int64_t t = i64 ? ((const int64_t *)target)[j] : (int64_t)((const int32_t *)target)[j];
            if (t == ignore_index) { valid[j] = 0.0f; continue; }
            if (t < 0 || t >= C) { *bad = t; return j; }
            valid[j] = 1.0f;
            onehot[(o * C + t) * inner + i] = 1.0f;
        }
    return -1;
}

static uint64_t dl__nn_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct dl__nn_drop_args { float *mask; float p, scale; uint64_t seed; } dl__nn_drop_args;

static void dl__nn_drop_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__nn_drop_args *u = (const dl__nn_drop_args *)arg;
    int64_t i;
    for (i = lo; i < hi; i++) {
        float r = (float)(dl__nn_mix(u->seed ^ dl__nn_mix((uint64_t)i)) >> 40) * (1.0f / 16777216.0f);
        u->mask[i] = r < u->p ? 0.0f : u->scale;
    }
}

static void dl__nn_cpu_dropout_mask(dl_ctx *c, float *mask, int64_t n, float p, float scale,
                                    uint64_t seed)
{
    dl__nn_drop_args u;
    u.mask = mask; u.p = p; u.scale = scale; u.seed = seed;
    dl__parallel_for(c->pool, n, 1 << 15, dl__nn_drop_task, &u);
}

typedef struct dl__nn_bce_args { float *out; const float *x, *y; } dl__nn_bce_args;

static void dl__nn_bce_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__nn_bce_args *u = (const dl__nn_bce_args *)arg;
    int64_t i;
    for (i = lo; i < hi; i++) {
        float x = u->x[i];
        u->out[i] = (x > 0 ? x : 0.0f) - x * u->y[i] + log1pf(expf(-fabsf(x)));
    }
}

static void dl__nn_cpu_bce_logits(dl_ctx *c, float *out, const float *x, const float *y, int64_t n)
{
    dl__nn_bce_args u;
    u.out = out; u.x = x; u.y = y;
    dl__parallel_for(c->pool, n, 1 << 15, dl__nn_bce_task, &u);
}

static const dl__nn_kernels dl__nn_cpu_kernels = {
    "cpu", dl__nn_cpu_class_mask, dl__nn_cpu_dropout_mask, dl__nn_cpu_bce_logits
};

static const dl__nn_kernels *dl__nnK(const dl_tensor *t)
{
    (void)t;   /* a CUDA build routes device tensors to its own table here */
    return &dl__nn_cpu_kernels;
}

/* ---------------------------------------------------------------- helpers */

/* An optional per-channel / per-feature tensor: live, same context and
   device as x, float32, shape exactly `want`. */
static bool dl__nn_param(const char *op, const char *arg, const dl_tensor *t, const dl_tensor *x,
                         const dl_shape *want, const char *rule)
{
    dl_shape s;
    if (!dl__live(op, arg, t) || !dl__pair(op, x, t) || !dl__f32(op, arg, t)) return false;
    s = dl__shape_of(t);
    if (s.ndim != want->ndim ||
        (s.ndim && memcmp(s.d, want->d, sizeof(int64_t) * (size_t)s.ndim) != 0)) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: %s %s must have shape %s (%s of x %s)", op, arg,
                dl__sh(t), dl__shp(x->ctx_, want), rule, dl__sh(x));
        return false;
    }
    return true;
}

static bool dl__nn_reduction_ok(const char *op, dl_ctx *ctx, dl_reduction r)
{
    if ((int)r == DL_REDUCTION_MEAN || (int)r == DL_REDUCTION_SUM || (int)r == DL_REDUCTION_NONE)
        return true;
    dl__err(ctx, DL_ERR_ARG, "%s: reduction %d is not one of DL_REDUCTION_MEAN (0), "
            "DL_REDUCTION_SUM (1), DL_REDUCTION_NONE (2)", op, (int)r);
    return false;
}

static dl_tensor *dl__nn_reduce(dl_tensor *t, dl_reduction r)
{
    if (r == DL_REDUCTION_NONE) return t;
    if (r == DL_REDUCTION_SUM) return dl_sum(t, DL_ALL, false);
    return dl_mean(t, DL_ALL, false);
}

/* (x - mean) / sqrt(var + eps) over dims (biased variance); mean and var
   (keepdim) are returned through the pointers when asked. */
static dl_tensor *dl__nn_normalize(dl_tensor *x, dl_shape dims, float eps, dl_tensor **pmean,
                                   dl_tensor **pvar)
{
    dl_tensor *mean = dl_mean(x, dims, true);
    dl_tensor *d = dl_sub(x, mean);
    dl_tensor *var = dl_mean(dl_mul(d, d), dims, true);
    if (pmean) *pmean = mean;
    if (pvar) *pvar = var;
    return dl_div(d, dl_sqrt(dl_add_scalar(var, eps)));
}

/* t (C) viewed as (1,C,1,...) to broadcast against an nd-dim x */
static dl_tensor *dl__nn_chan(dl_tensor *t, int nd)
{
    int64_t s[DL_MAX_DIMS];
    int i;
    if (!t) return NULL;
    for (i = 0; i < nd; i++) s[i] = 1;
    s[1] = t->shape[0];
    return dl_reshape(t, dl_shape_make(nd, s));
}

/* ---------------------------------------------------------- normalization */

dl_tensor *dl_batch_norm(dl_tensor *x, dl_tensor *running_mean, dl_tensor *running_var,
                         dl_tensor *weight, dl_tensor *bias, bool training, float momentum,
                         float eps)
{
    static const char *op = "dl_batch_norm";
    dl_ctx *ctx;
    dl_shape cs, dims;
    dl_tensor *y, *mean = NULL, *var = NULL;
    int64_t C, cnt;
    int i;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    ctx = x->ctx_;
    if (x->ndim < 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: x %s needs at least 2 dims, (N,C) or (N,C,d1,...)", op,
                dl__sh(x));
        return NULL;
    }
    C = x->shape[1];
    cs = dl__dims1(C);
    if ((running_mean == NULL) != (running_var == NULL)) {
        dl__err(ctx, DL_ERR_ARG, "%s: give both running_mean and running_var, or neither "
                "(running_%s is NULL)", op, running_mean ? "var" : "mean");
        return NULL;
    }
    if (!training && !running_mean) {
        dl__err(ctx, DL_ERR_ARG, "%s: eval mode (training false) normalizes with running_mean and "
                "running_var, which are NULL", op);
        return NULL;
    }
    if (running_mean && (!dl__nn_param(op, "running_mean", running_mean, x, &cs, "one value per channel, dim 1") ||
                         !dl__nn_param(op, "running_var", running_var, x, &cs, "one value per channel, dim 1")))
        return NULL;
    if (weight && !dl__nn_param(op, "weight", weight, x, &cs, "one value per channel, dim 1")) return NULL;
    if (bias && !dl__nn_param(op, "bias", bias, x, &cs, "one value per channel, dim 1")) return NULL;
    if (!(eps >= 0.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: eps=%g must be >= 0", op, (double)eps);
        return NULL;
    }
    cnt = C ? x->numel / C : 0;
    if (training) {
        if (running_mean && (running_mean->requires_grad || running_var->requires_grad)) {
            dl__err(ctx, DL_ERR_ARG, "%s: running_mean/running_var are updated in place in "
                    "training mode and must not require grad", op);
            return NULL;
        }
        if (cnt <= 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: training needs more than 1 value per channel; x %s "
                    "has %lld (use eval mode, or a larger batch)", op, dl__sh(x), (long long)cnt);
            return NULL;
        }
        dims = dl_shape_make(x->ndim - 1, NULL);
        for (i = 2; i < x->ndim; i++) dims.d[i - 1] = i;
        y = dl__nn_normalize(x, dims, eps, &mean, &var);
    } else {
        y = dl_div(dl_sub(x, dl__nn_chan(running_mean, x->ndim)),
                   dl_sqrt(dl_add_scalar(dl__nn_chan(running_var, x->ndim), eps)));
    }
    if (weight) y = dl_mul(y, dl__nn_chan(weight, x->ndim));
    if (bias) y = dl_add(y, dl__nn_chan(bias, x->ndim));
    if (!y) return NULL;
    if (training && running_mean && C) {
        /* r = (1-m) r + m stat, in place, no history; var unbiased: * n/(n-1) */
        const dl__kernels *k = dl__K(x);
        float *rm = (float *)running_mean->data, *rv = (float *)running_var->data;
        k->unary(ctx, DL__U_AFFINE, rm, rm, C, 1.0f - momentum, 0.0f);
        k->axpy(ctx, rm, (const float *)mean->data, C, momentum);
        k->unary(ctx, DL__U_AFFINE, rv, rv, C, 1.0f - momentum, 0.0f);
        k->axpy(ctx, rv, (const float *)var->data, C,
                (float)((double)momentum * (double)cnt / (double)(cnt - 1)));
    }
    return y;
}

dl_tensor *dl_layer_norm(dl_tensor *x, dl_shape normalized_shape, dl_tensor *weight,
                         dl_tensor *bias, float eps)
{
    static const char *op = "dl_layer_norm";
    dl_ctx *ctx;
    dl_shape dims;
    dl_tensor *y;
    int i, k = normalized_shape.ndim;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    ctx = x->ctx_;
    if (k < 1 || k > x->ndim) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: normalized_shape %s must have 1..%d dims (the last dims "
                "of x %s)", op, dl__shp(ctx, &normalized_shape), x->ndim, dl__sh(x));
        return NULL;
    }
    for (i = 0; i < k; i++)
        if (normalized_shape.d[i] != x->shape[x->ndim - k + i]) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: normalized_shape %s must equal the last %d dims of "
                    "x %s", op, dl__shp(ctx, &normalized_shape), k, dl__sh(x));
            return NULL;
        }
    if (weight && !dl__nn_param(op, "weight", weight, x, &normalized_shape, "normalized_shape, the last dims")) return NULL;
    if (bias && !dl__nn_param(op, "bias", bias, x, &normalized_shape, "normalized_shape, the last dims")) return NULL;
    if (!(eps >= 0.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: eps=%g must be >= 0", op, (double)eps);
        return NULL;
    }
    dims = dl_shape_make(k, NULL);
    for (i = 0; i < k; i++) dims.d[i] = x->ndim - k + i;
    y = dl__nn_normalize(x, dims, eps, NULL, NULL);
    if (weight) y = dl_mul(y, weight);
    if (bias) y = dl_add(y, bias);
    return y;
}

dl_tensor *dl_dropout(dl_tensor *x, float p, bool training)
{
    static const char *op = "dl_dropout";
    dl_tensor *mask;
    if (!x) return NULL;
    if (!dl__live(op, "x", x) || !dl__f32(op, "x", x)) return NULL;
    if (!(p >= 0.0f && p <= 1.0f)) {
        dl__err(x->ctx_, DL_ERR_ARG, "%s: p=%g must be in [0, 1] (the probability of zeroing)",
                op, (double)p);
        return NULL;
    }
    if (!training || p == 0.0f) return x;
    mask = dl__like(op, x);
    if (!mask) return NULL;
    if (p == 1.0f) dl__K(x)->fill(x->ctx_, (float *)mask->data, x->numel, 0.0f);
    else
        dl__nnK(x)->dropout_mask(x->ctx_, (float *)mask->data, x->numel, p,
                                 (float)(1.0 / (1.0 - (double)p)), dl__rng_next(x->ctx_->rng));
    return dl_mul(x, mask);
}

/* ----------------------------------------------------------------- losses */

dl_loss_desc dl_loss_desc_default(void)
{
    dl_loss_desc d;
    memset(&d, 0, sizeof d);
    d.reduction = DL_REDUCTION_MEAN;
    d.ignore_index = -100;
    d.label_smoothing = 0.0f;
    d.weight = NULL;
    return d;
}

/* nll of log-probabilities lp (N,C,*) (or (C)) with optional label smoothing:
   onehot/valid masks from the targets (no history), then
     nll_i    = -sum_c onehot w_c lp          (w_c = 1 without weights)
     smooth_i = -valid_i sum_c w_c lp
     mean: sum(.) / sum(onehot w)             sum: sum(.)    none: per sample
     loss = (1-e) nll + e/C smooth. */
static dl_tensor *dl__nn_class_loss(const char *op, dl_tensor *lp, dl_tensor *target,
                                    const dl_loss_desc *d, bool smoothing_allowed)
{
    dl_ctx *ctx = lp->ctx_;
    dl_tensor *onehot, *valid, *w = NULL, *ow, *nll, *den = NULL, *loss;
    int64_t C, outer, inner, bad_i, bad_v = 0;
    float e = d->label_smoothing;
    int i;
    bool scalar = false;
    if (!dl__live(op, "target", target) || !dl__pair(op, lp, target)) return NULL;
    if (!dl__nn_reduction_ok(op, ctx, d->reduction)) return NULL;
    if (target->dtype != DL_DTYPE_I64 && target->dtype != DL_DTYPE_I32) {
        dl__err(ctx, DL_ERR_DTYPE, "%s: target %s has dtype %s; class-index targets must be int64 "
                "or int32 (probability targets are not supported)", op, dl__sh(target),
                dl__dtype_str(target->dtype));
        return NULL;
    }
    if (!smoothing_allowed && e != 0.0f) {
        dl__err(ctx, DL_ERR_ARG, "%s: label_smoothing=%g: only dl_cross_entropy_ex smooths labels; "
                "set it to 0", op, (double)e);
        return NULL;
    }
    if (!(e >= 0.0f && e <= 1.0f)) {
        dl__err(ctx, DL_ERR_ARG, "%s: label_smoothing=%g must be in [0, 1]", op, (double)e);
        return NULL;
    }
    if (lp->ndim == 1 && target->ndim == 0) {   /* one sample: (C) and a 0-d target */
        scalar = true;
        lp = dl_unsqueeze(lp, 0);
        target = dl_unsqueeze(target, 0);
        if (!lp || !target) return NULL;
    }
    if (lp->ndim < 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: input %s must be (N,C) or (N,C,d1,...) (or (C) with a "
                "0-d target)", op, dl__sh(lp));
        return NULL;
    }
    {
        bool ok = target->ndim == lp->ndim - 1 && target->shape[0] == lp->shape[0];
        for (i = 1; ok && i < target->ndim; i++) ok = target->shape[i] == lp->shape[i + 1];
        if (!ok) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: target %s must be the input %s without its class dim 1 "
                    "((N,C,d1,...) -> (N,d1,...))", op, dl__sh(target), dl__sh(lp));
            return NULL;
        }
    }
    C = lp->shape[1];
    outer = lp->shape[0];
    inner = dl__prod(lp->shape + 2, lp->ndim - 2);
    if (d->weight) {
        dl_shape cs = dl__dims1(C);
        if (!dl__nn_param(op, "weight", d->weight, lp, &cs, "one weight per class, dim 1")) return NULL;
        w = dl__nn_chan(d->weight, lp->ndim);
        if (!w) return NULL;
    }
    onehot = dl__like(op, lp);
    valid = dl__make(ctx, op, DL_DTYPE_F32, target->ndim, target->shape, false, NULL);
    if (!onehot || !valid) return NULL;
    valid->device = lp->device;
    bad_i = dl__nnK(lp)->class_mask(ctx, (float *)onehot->data, (float *)valid->data, target->data,
                                    target->dtype == DL_DTYPE_I64, outer, C, inner,
                                    d->ignore_index, &bad_v);
    if (bad_i >= 0) {
        dl__err(ctx, DL_ERR_ARG, "%s: target %s holds %lld at flat index %lld: class indices must "
                "be in [0, %lld) (C = %lld, dim 1 of the input %s) or equal ignore_index %lld", op,
                dl__sh(target), (long long)bad_v, (long long)bad_i, (long long)C, (long long)C,
                dl__sh(lp), (long long)d->ignore_index);
        return NULL;
    }
    ow = w ? dl_mul(onehot, w) : onehot;
    nll = dl_neg(dl_sum(dl_mul(ow, lp), dl__dims1(1), false));
    if (d->reduction == DL_REDUCTION_MEAN) den = dl_sum(ow, DL_ALL, false);
    if (d->reduction == DL_REDUCTION_MEAN) loss = dl_div(dl_sum(nll, DL_ALL, false), den);
    else loss = dl__nn_reduce(nll, d->reduction);
    if (e > 0.0f) {
        dl_tensor *sm = dl_mul(dl_neg(dl_sum(w ? dl_mul(lp, w) : lp, dl__dims1(1), false)), valid);
        if (d->reduction == DL_REDUCTION_MEAN) sm = dl_div(dl_sum(sm, DL_ALL, false), den);
        else sm = dl__nn_reduce(sm, d->reduction);
        loss = dl_add(dl_mul_scalar(loss, 1.0f - e), dl_mul_scalar(sm, e / (float)C));
    }
    if (scalar && loss && d->reduction == DL_REDUCTION_NONE) loss = dl_squeeze(loss, 0);
    return loss;
}

dl_tensor *dl_nll_loss(dl_tensor *log_probs, dl_tensor *target, const dl_loss_desc *d)
{
    dl_loss_desc def = dl_loss_desc_default();
    if (!log_probs || !target) return NULL;
    if (!dl__live("dl_nll_loss", "log_probs", log_probs) || !dl__f32("dl_nll_loss", "log_probs", log_probs))
        return NULL;
    return dl__nn_class_loss("dl_nll_loss", log_probs, target, d ? d : &def, false);
}

dl_tensor *dl_cross_entropy_ex(dl_tensor *logits, dl_tensor *target, const dl_loss_desc *d)
{
    static const char *op = "dl_cross_entropy";
    dl_loss_desc def = dl_loss_desc_default();
    dl_tensor *lp;
    if (!logits || !target) return NULL;
    if (!dl__live(op, "logits", logits) || !dl__f32(op, "logits", logits)) return NULL;
    if (!dl__live(op, "target", target)) return NULL;
    if (logits->ndim == 0) {
        dl__err(logits->ctx_, DL_ERR_SHAPE, "%s: logits %s must be (N,C) or (N,C,d1,...)", op,
                dl__sh(logits));
        return NULL;
    }
    lp = dl_log_softmax(logits, logits->ndim == 1 ? 0 : 1);
    if (!lp) return NULL;
    return dl__nn_class_loss(op, lp, target, d ? d : &def, true);
}

dl_tensor *dl_cross_entropy(dl_tensor *logits, dl_tensor *target)
{
    return dl_cross_entropy_ex(logits, target, NULL);
}

/* a and b: same shape, float32, same context and device */
static bool dl__nn_same(const char *op, dl_tensor *a, dl_tensor *b, dl_reduction r)
{
    if (!dl__live(op, "a", a) || !dl__live(op, "b", b)) return false;
    if (!dl__pair(op, a, b) || !dl__f32(op, "a", a) || !dl__f32(op, "b", b)) return false;
    if (!dl__nn_reduction_ok(op, a->ctx_, r)) return false;
    if (!dl_same_shape(a, b)) {
        dl__err(a->ctx_, DL_ERR_SHAPE, "%s: a %s and b %s must have the same shape (dl.h does not "
                "broadcast loss operands)", op, dl__sh(a), dl__sh(b));
        return false;
    }
    return true;
}

dl_tensor *dl_mse_loss(dl_tensor *a, dl_tensor *b, dl_reduction r)
{
    dl_tensor *d;
    if (!a || !b || !dl__nn_same("dl_mse_loss", a, b, r)) return NULL;
    d = dl_sub(a, b);
    return dl__nn_reduce(dl_mul(d, d), r);
}

dl_tensor *dl_l1_loss(dl_tensor *a, dl_tensor *b, dl_reduction r)
{
    if (!a || !b || !dl__nn_same("dl_l1_loss", a, b, r)) return NULL;
    return dl__nn_reduce(dl_abs(dl_sub(a, b)), r);
}

/* l = max(x,0) - x y + log(1 + exp(-|x|));  dx = g (sigmoid(x) - y), dy = -g x */
static dl_result dl__nn_bce_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    if (dl__need(n, 0)) gin[0] = dl_mul(g, dl_sub(dl_sigmoid(n->in[0]), n->in[1]));
    if (dl__need(n, 1)) gin[1] = dl_neg(dl_mul(g, n->in[0]));
    return DL_OK;
}
static const dl__op dl__op_nn_bce = {"dl_binary_cross_entropy_with_logits", dl__nn_bce_bwd};

dl_tensor *dl_binary_cross_entropy_with_logits(dl_tensor *x, dl_tensor *y, dl_reduction r)
{
    static const char *op = "dl_binary_cross_entropy_with_logits";
    dl_tensor *l, *in[2];
    dl__node *n;
    if (!x || !y || !dl__nn_same(op, x, y, r)) return NULL;
    l = dl__like(op, x);
    if (!l) return NULL;
    dl__nnK(x)->bce_logits(x->ctx_, (float *)l->data, (const float *)x->data,
                           (const float *)y->data, x->numel);
    in[0] = x;
    in[1] = y;
    if (dl__record(l, &dl__op_nn_bce, 2, in, &n) < 0) return NULL;
    l = dl__done(l, op);
    return l ? dl__nn_reduce(l, r) : NULL;
}

#endif /* DL_IMPLEMENTATION && !DL__NN_OPS_IMPLEMENTED */

/* parts/conv_impl.h - convolution, transposed convolution and pooling:
   implementation (appended to dl.h's implementation; needs parts/conv_decl.h).

   Everything here is N-d (1, 2 or 3 spatial dims, missing dims padded with
   size 1); the 1d/2d/3d functions are thin wrappers.

   Convolution is im2col + GEMM, group by group. Three internal ops cover
   every product, with "a" the conv input side (N,Ca,ia...), "b" the conv
   output side (N,Cb,ib...) and w (Cb, Ca/G, k...):
       conv      b = conv(a, w)            im2col(a), w_g (Cbg,CagK) @ col_g
       convT     a = conv_transpose(b, w)  col_g = w_g^T @ b_g, col2im -> a
       convW     w = weight_grad(a, b)     sum_n b_g[n] @ col_g[n]^T
   They are each other's adjoints, so each backward is written with the
   other two (and create_graph gives gradients of any order):
       conv:   da = convT(g, w), dw = convW(a, g), dbias = sum(g, N and space)
       convT:  db = conv(g, w),  dw = convW(g, b), dbias = sum(g)
       convW:  da = convT(b, g), db = conv(a, g)
   Max pooling saves the arg-max of each window (int64, within the plane) and
   scatters the gradient there ("unpool"), whose backward gathers. Average
   pooling (fixed or adaptive windows) is linear: its backward is its
   adjoint, an op whose backward is the pooling again.

   Kernels (im2col, col2im, bias, pools) live in dl__conv_cpu_kernels, a
   table of raw-pointer functions like dl__kernels; dl__KC() picks the table
   for a tensor's device. The im2col matrix holds a chunk of samples side by
   side, col (Ca*K, n, Lb), so each group is one large GEMM (the output
   comes back (Cb, n, Lb) and is permuted to (n, Cb, Lb)). Scratch is step
   memory given back before the op returns; chunks keep it under 8 MiB. */
#if defined(DL_IMPLEMENTATION) && !defined(DL__CONV_IMPLEMENTED)
#define DL__CONV_IMPLEMENTED

// >>section ops: convolution and pooling

/* Geometry of one convolution, padded to 3 spatial dims: a 1-d/2-d conv
   gets leading dims of size 1 (kernel 1, stride 1, no padding, dilation 1). */
typedef struct dl__cgeom {
    int nsp;
    int64_t N, Ca, Cb, G;
    int64_t ia[3], ib[3], k[3], s[3], p[3], d[3];  /* p: left padding */
    int64_t La, Lb, K;                             /* products of ia, ib, k */
} dl__cgeom;

/* Geometry of one pooling: input ia, output ob, per-dim windows. */
typedef struct dl__pgeom {
    int64_t ia[3], ob[3], k[3], s[3], p[3], d[3];
    int64_t La, Lb;
    bool adaptive, count_include_pad;
} dl__pgeom;

typedef struct dl__conv_kernels {
    const char *name;
    /* col (Ca*K, n, Lb) <- patches of x (n, Ca, ia...): row (c,k) of sample j at
       col + ((c*K + k)*n + j)*Lb, so one GEMM covers the n samples */
    void (*im2col)(dl_ctx *c, float *col, const float *x, int64_t n, const dl__cgeom *g);
    /* x (n, Ca, ia...) = sum of col (Ca*K, n, Lb) over the patches (x overwritten) */
    void (*col2im)(dl_ctx *c, float *x, const float *col, int64_t n, const dl__cgeom *g);
    /* y (n, C, L) += b (C) */
    void (*bias_add)(dl_ctx *c, float *y, const float *b, int64_t n, int64_t C, int64_t L);
    /* y (planes, ob...) = window max of x (planes, ia...); idx (or NULL) = arg-max in plane */
    void (*max_pool)(dl_ctx *c, float *y, int64_t *idx, const float *x, int64_t planes,
                     const dl__pgeom *g);
    /* dx (planes, Lin) = 0, then dx[idx] += g (planes, Lout) */
    void (*unpool)(dl_ctx *c, float *dx, const float *g, const int64_t *idx, int64_t planes,
                   int64_t Lin, int64_t Lout);
    /* y (planes, Lout) = x (planes, Lin)[idx]  (0 where idx < 0) */
    void (*gather)(dl_ctx *c, float *y, const float *x, const int64_t *idx, int64_t planes,
                   int64_t Lin, int64_t Lout);
    /* y (planes, ob...) = window mean of x (planes, ia...) */
    void (*avg_pool)(dl_ctx *c, float *y, const float *x, int64_t planes, const dl__pgeom *g);
    /* dx (planes, ia...) = adjoint of avg_pool applied to g (planes, ob...) */
    void (*avg_pool_adj)(dl_ctx *c, float *dx, const float *gy, int64_t planes, const dl__pgeom *g);
} dl__conv_kernels;

/* ------------------------------------------------------------ CPU kernels */

/* Outputs o in [*lo, *hi) are those with 0 <= o*s + off < in (o < out). */
static void dl__crange(int64_t off, int64_t s, int64_t in, int64_t out, int64_t *lo, int64_t *hi)
{
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = in - off <= 0 ? 0 : (in - off - 1) / s + 1;
    if (b > out) b = out;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

typedef struct dl__i2c_args { float *col; const float *x; int64_t n; const dl__cgeom *g; } dl__i2c_args;

/* one task per row ((channel, kernel offset), sample) of col */
static void dl__im2col_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2c_args *u = (const dl__i2c_args *)arg;
    const dl__cgeom *g = u->g;
    int64_t r;
    for (r = lo; r < hi; r++) {
        int64_t n = r % u->n, q = r / u->n, c = q / g->K, kk = q % g->K;
        int64_t k2 = kk % g->k[2], k1 = (kk / g->k[2]) % g->k[1], k0 = kk / (g->k[2] * g->k[1]);
        int64_t off0 = k0 * g->d[0] - g->p[0], off1 = k1 * g->d[1] - g->p[1];
        int64_t off2 = k2 * g->d[2] - g->p[2];
        int64_t l0, h0, l1, h1, l2, h2, o0, o1, o2;
        const float *x = u->x + (n * g->Ca + c) * g->La;
        float *dst = u->col + r * g->Lb;
        dl__crange(off0, g->s[0], g->ia[0], g->ib[0], &l0, &h0);
        dl__crange(off1, g->s[1], g->ia[1], g->ib[1], &l1, &h1);
        dl__crange(off2, g->s[2], g->ia[2], g->ib[2], &l2, &h2);
        if (l0 > 0 || h0 < g->ib[0] || l1 > 0 || h1 < g->ib[1] || l2 > 0 || h2 < g->ib[2])
            memset(dst, 0, sizeof(float) * (size_t)g->Lb);
        if (l2 >= h2) continue;
        for (o0 = l0; o0 < h0; o0++)
            for (o1 = l1; o1 < h1; o1++) {
                int64_t base = ((o0 * g->s[0] + off0) * g->ia[1] + o1 * g->s[1] + off1) * g->ia[2] + off2;
                float *dr = dst + (o0 * g->ib[1] + o1) * g->ib[2];
                if (g->s[2] == 1) {
                    memcpy(dr + l2, x + base + l2, sizeof(float) * (size_t)(h2 - l2));
                } else {
                    int64_t s2 = g->s[2];
                    for (o2 = l2; o2 < h2; o2++) dr[o2] = x[base + o2 * s2];
                }
            }
    }
}

static void dl__cpu_im2col(dl_ctx *c, float *col, const float *x, int64_t n, const dl__cgeom *g)
{
    dl__i2c_args u;
    u.col = col; u.x = x; u.n = n; u.g = g;
    dl__parallel_for(c->pool, n * g->Ca * g->K, (1 << 14) / (g->Lb + 1) + 1, dl__im2col_task, &u);
}

/* one task per plane (sample, channel) of x: deterministic accumulation order */
static void dl__col2im_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__i2c_args *u = (const dl__i2c_args *)arg;
    const dl__cgeom *g = u->g;
    int64_t q, kk;
    for (q = lo; q < hi; q++) {
        float *x = u->col + q * g->La;          /* (the output here) */
        int64_t n = q / g->Ca, c = q % g->Ca;
        memset(x, 0, sizeof(float) * (size_t)g->La);
        for (kk = 0; kk < g->K; kk++) {
            int64_t k2 = kk % g->k[2], k1 = (kk / g->k[2]) % g->k[1], k0 = kk / (g->k[2] * g->k[1]);
            int64_t off0 = k0 * g->d[0] - g->p[0], off1 = k1 * g->d[1] - g->p[1];
            int64_t off2 = k2 * g->d[2] - g->p[2];
            int64_t l0, h0, l1, h1, l2, h2, o0, o1, o2;
            const float *src = u->x + ((c * g->K + kk) * u->n + n) * g->Lb;
            dl__crange(off0, g->s[0], g->ia[0], g->ib[0], &l0, &h0);
            dl__crange(off1, g->s[1], g->ia[1], g->ib[1], &l1, &h1);
            dl__crange(off2, g->s[2], g->ia[2], g->ib[2], &l2, &h2);
            for (o0 = l0; o0 < h0; o0++)
                for (o1 = l1; o1 < h1; o1++) {
                    int64_t base = ((o0 * g->s[0] + off0) * g->ia[1] + o1 * g->s[1] + off1) * g->ia[2] + off2;
                    const float *sr = src + (o0 * g->ib[1] + o1) * g->ib[2];
                    int64_t s2 = g->s[2];
                    for (o2 = l2; o2 < h2; o2++) x[base + o2 * s2] += sr[o2];
                }
        }
    }
}

static void dl__cpu_col2im(dl_ctx *c, float *x, const float *col, int64_t n, const dl__cgeom *g)
{
    dl__i2c_args u;
    u.col = x; u.x = col; u.n = n; u.g = g;
    dl__parallel_for(c->pool, n * g->Ca, (1 << 14) / (g->K * g->Lb + 1) + 1, dl__col2im_task, &u);
}

typedef struct dl__bias_args { float *y; const float *b; int64_t C, L; } dl__bias_args;

static void dl__bias_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__bias_args *u = (const dl__bias_args *)arg;
    int64_t r, i;
    for (r = lo; r < hi; r++) {
        float v = u->b[r % u->C], *y = u->y + r * u->L;
        for (i = 0; i < u->L; i++) y[i] += v;
    }
}

static void dl__cpu_bias_add(dl_ctx *c, float *y, const float *b, int64_t n, int64_t C, int64_t L)
{
    dl__bias_args u;
    u.y = y; u.b = b; u.C = C; u.L = L;
    dl__parallel_for(c->pool, n * C, (1 << 15) / (L + 1) + 1, dl__bias_task, &u);
}

/* Window of output o along dim i: [*lo, *hi) inside the input, and the count
   PyTorch divides by with count_include_pad (window clipped at in + pad). */
static void dl__pwin(const dl__pgeom *g, int i, int64_t o, int64_t *lo, int64_t *hi, int64_t *padded)
{
    if (g->adaptive) {
        *lo = o * g->ia[i] / g->ob[i];
        *hi = ((o + 1) * g->ia[i] + g->ob[i] - 1) / g->ob[i];
        *padded = *hi - *lo;
    } else {
        int64_t a = o * g->s[i] - g->p[i], b = a + g->k[i];
        if (b > g->ia[i] + g->p[i]) b = g->ia[i] + g->p[i];
        *padded = b - a;
        *lo = a < 0 ? 0 : a;
        *hi = b > g->ia[i] ? g->ia[i] : b;
    }
}

typedef struct dl__pool_args {
    float *y; int64_t *idx; const float *x; const dl__pgeom *g;
} dl__pool_args;

static void dl__maxpool_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__pool_args *u = (const dl__pool_args *)arg;
    const dl__pgeom *g = u->g;
    int64_t q, o0, o1, o2;
    for (q = lo; q < hi; q++) {
        const float *x = u->x + q * g->La;
        float *y = u->y + q * g->Lb;
        int64_t *idx = u->idx ? u->idx + q * g->Lb : NULL;
        for (o0 = 0; o0 < g->ob[0]; o0++)
            for (o1 = 0; o1 < g->ob[1]; o1++)
                for (o2 = 0; o2 < g->ob[2]; o2++) {
                    int64_t st[3], en[3], o[3], j0, j1, j2, best = -1;
                    float m = -INFINITY;
                    int i;
                    o[0] = o0; o[1] = o1; o[2] = o2;
                    for (i = 0; i < 3; i++) {
                        /* first in-range tap, and one past the last tap */
                        st[i] = o[i] * g->s[i] - g->p[i];
                        en[i] = st[i] + (g->k[i] - 1) * g->d[i] + 1;
                        if (en[i] > g->ia[i]) en[i] = g->ia[i];
                        while (st[i] < 0) st[i] += g->d[i];
                    }
                    for (j0 = st[0]; j0 < en[0]; j0 += g->d[0])
                        for (j1 = st[1]; j1 < en[1]; j1 += g->d[1])
                            for (j2 = st[2]; j2 < en[2]; j2 += g->d[2]) {
                                int64_t at = (j0 * g->ia[1] + j1) * g->ia[2] + j2;
                                float v = x[at];
                                if (best < 0 || v > m || v != v) { m = v; best = at; }
                            }
                    {
                        int64_t oi = (o0 * g->ob[1] + o1) * g->ob[2] + o2;
                        y[oi] = m;
                        if (idx) idx[oi] = best;
                    }
                }
    }
}

static void dl__cpu_max_pool(dl_ctx *c, float *y, int64_t *idx, const float *x, int64_t planes,
                             const dl__pgeom *g)
{
    dl__pool_args u;
    u.y = y; u.idx = idx; u.x = x; u.g = g;
    dl__parallel_for(c->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__maxpool_task, &u);
}

typedef struct dl__scat_args {
    float *dst; const float *src; const int64_t *idx; int64_t Lin, Lout; bool scatter;
} dl__scat_args;

static void dl__scat_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__scat_args *u = (const dl__scat_args *)arg;
    int64_t q, o;
    for (q = lo; q < hi; q++) {
        const int64_t *idx = u->idx + q * u->Lout;
        if (u->scatter) {
            float *dx = u->dst + q * u->Lin;
            const float *g = u->src + q * u->Lout;
            memset(dx, 0, sizeof(float) * (size_t)u->Lin);
            for (o = 0; o < u->Lout; o++)
                if (idx[o] >= 0 && idx[o] < u->Lin) dx[idx[o]] += g[o];
        } else {
            float *y = u->dst + q * u->Lout;
            const float *x = u->src + q * u->Lin;
            for (o = 0; o < u->Lout; o++)
                y[o] = (idx[o] >= 0 && idx[o] < u->Lin) ? x[idx[o]] : 0.0f;
        }
    }
}

static void dl__cpu_unpool(dl_ctx *c, float *dx, const float *g, const int64_t *idx, int64_t planes,
                           int64_t Lin, int64_t Lout)
{
    dl__scat_args u;
    u.dst = dx; u.src = g; u.idx = idx; u.Lin = Lin; u.Lout = Lout; u.scatter = true;
    dl__parallel_for(c->pool, planes, (1 << 14) / (Lin + Lout + 1) + 1, dl__scat_task, &u);
}

static void dl__cpu_gather(dl_ctx *c, float *y, const float *x, const int64_t *idx, int64_t planes,
                           int64_t Lin, int64_t Lout)
{
    dl__scat_args u;
    u.dst = y; u.src = x; u.idx = idx; u.Lin = Lin; u.Lout = Lout; u.scatter = false;
    dl__parallel_for(c->pool, planes, (1 << 14) / (Lout + 1) + 1, dl__scat_task, &u);
}

/* avg pooling, forward (adj = false: y = mean of window) or adjoint
   (adj = true: x[window] += y / divisor), one plane per task */
typedef struct dl__avg_args { float *x; float *y; const dl__pgeom *g; bool adj; } dl__avg_args;

static void dl__avgpool_task(void *arg, int64_t lo, int64_t hi)
{
    const dl__avg_args *u = (const dl__avg_args *)arg;
    const dl__pgeom *g = u->g;
    int64_t q, o0, o1, o2;
    for (q = lo; q < hi; q++) {
        float *x = u->x + q * g->La, *y = u->y + q * g->Lb;
        if (u->adj) memset(x, 0, sizeof(float) * (size_t)g->La);
        for (o0 = 0; o0 < g->ob[0]; o0++)
            for (o1 = 0; o1 < g->ob[1]; o1++)
                for (o2 = 0; o2 < g->ob[2]; o2++) {
                    int64_t l[3], h[3], pc[3], j0, j1, j2, div;
                    int64_t oi = (o0 * g->ob[1] + o1) * g->ob[2] + o2;
                    dl__pwin(g, 0, o0, &l[0], &h[0], &pc[0]);
                    dl__pwin(g, 1, o1, &l[1], &h[1], &pc[1]);
                    dl__pwin(g, 2, o2, &l[2], &h[2], &pc[2]);
                    if (l[0] >= h[0] || l[1] >= h[1] || l[2] >= h[2]) {
                        if (!u->adj) y[oi] = 0.0f;
                        continue;
                    }
                    div = (g->count_include_pad || g->adaptive)
                        ? pc[0] * pc[1] * pc[2]
                        : (h[0] - l[0]) * (h[1] - l[1]) * (h[2] - l[2]);
                    if (u->adj) {
                        float v = y[oi] / (float)div;
                        for (j0 = l[0]; j0 < h[0]; j0++)
                            for (j1 = l[1]; j1 < h[1]; j1++)
                                for (j2 = l[2]; j2 < h[2]; j2++)
                                    x[(j0 * g->ia[1] + j1) * g->ia[2] + j2] += v;
                    } else {
                        float s = 0.0f;
                        for (j0 = l[0]; j0 < h[0]; j0++)
                            for (j1 = l[1]; j1 < h[1]; j1++)
                                for (j2 = l[2]; j2 < h[2]; j2++)
                                    s += x[(j0 * g->ia[1] + j1) * g->ia[2] + j2];
                        y[oi] = s / (float)div;
                    }
                }
    }
}

static void dl__cpu_avg_pool(dl_ctx *c, float *y, const float *x, int64_t planes, const dl__pgeom *g)
{
    dl__avg_args u;
    u.x = (float *)(uintptr_t)x; u.y = y; u.g = g; u.adj = false;   /* x only read */
    dl__parallel_for(c->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__avgpool_task, &u);
}

static void dl__cpu_avg_pool_adj(dl_ctx *c, float *dx, const float *gy, int64_t planes,
                                 const dl__pgeom *g)
{
    dl__avg_args u;
    u.x = dx; u.y = (float *)(uintptr_t)gy; u.g = g; u.adj = true;  /* gy only read */
    dl__parallel_for(c->pool, planes, (1 << 14) / (g->La + 1) + 1, dl__avgpool_task, &u);
}

static const dl__conv_kernels dl__conv_cpu_kernels = {
    "cpu", dl__cpu_im2col, dl__cpu_col2im, dl__cpu_bias_add, dl__cpu_max_pool, dl__cpu_unpool,
    dl__cpu_gather, dl__cpu_avg_pool, dl__cpu_avg_pool_adj
};

static const dl__conv_kernels *dl__KC(const dl_tensor *t)
{
    (void)t;   /* the CUDA build routes device tensors to its own table here */
    return &dl__conv_cpu_kernels;
}

/* ------------------------------------------------------------ helpers */

/* Scratch of n floats in step memory on t's device, given back by
   dl__arena_rewind(&ctx->data, mark) before the op returns. */
static float *dl__conv_scratch(const char *op, dl_tensor *t, int64_t n)
{
    dl_ctx *ctx = t->ctx_;
    float *p;
    if (n < 0 || (uint64_t)n > (uint64_t)(((size_t)-1) / 16)) p = NULL;
    else p = (float *)dl__arena_alloc(ctx, &ctx->data, sizeof(float) * (size_t)(n ? n : 1), true);
    if (!p) {
        dl__err(ctx, DL_ERR_OOM, "%s: cannot allocate %lld floats of im2col scratch%s", op,
                (long long)n, ctx->memory_limit ? " (memory_limit reached?)" : "");
        return NULL;
    }
    dl__track_peak(ctx);
    return p;
}

/* samples per chunk so that the scratch stays under 8 MiB (measured best:
   the GEMMs are large and the data stays in the last-level cache) */
static int64_t dl__conv_chunk(int64_t N, int64_t per_sample)
{
    int64_t nb = per_sample > 0 ? ((int64_t)1 << 21) / per_sample : N;
    if (nb < 1) nb = 1;
    if (nb > N) nb = N;
    return nb;
}

/* Attributes packed into node->i[] (21 bits each, checked by the public
   functions): conv i[0] = groups, i[1+d] = stride | pad << 21 | dilation << 42;
   pooling i[0] = flags, i[1+d] = kernel | stride << 21 | pad << 42. */
#define DL__PACK_MAX (((int64_t)1 << 21) - 1)
static int64_t dl__pack3(int64_t a, int64_t b, int64_t c) { return a | (b << 21) | (c << 42); }
static int64_t dl__unpack(int64_t v, int k) { return (v >> (21 * k)) & DL__PACK_MAX; }

typedef struct dl__cparam { int nsp; int64_t G, s[3], p[3], d[3]; } dl__cparam;

static void dl__cparam_save(dl__node *n, const dl__cparam *cp)
{
    int i;
    n->i[0] = cp->G;
    for (i = 0; i < 3; i++) n->i[1 + i] = dl__pack3(cp->s[i], cp->p[i], cp->d[i]);
    n->ni = 4;
}

static void dl__cparam_load(const dl__node *n, int nsp, dl__cparam *cp)
{
    int i;
    cp->nsp = nsp;
    cp->G = n->i[0];
    for (i = 0; i < 3; i++) {
        cp->s[i] = dl__unpack(n->i[1 + i], 0);
        cp->p[i] = dl__unpack(n->i[1 + i], 1);
        cp->d[i] = dl__unpack(n->i[1 + i], 2);
    }
}

/* geometry from a-side, b-side and kernel spatial sizes */
static void dl__cgeom_make(dl__cgeom *g, const dl__cparam *cp, int64_t N, int64_t Ca, int64_t Cb,
                           const int64_t *ia, const int64_t *ib, const int64_t *k)
{
    int i;
    g->nsp = cp->nsp;
    g->N = N; g->Ca = Ca; g->Cb = Cb; g->G = cp->G;
    g->La = g->Lb = g->K = 1;
    for (i = 0; i < 3; i++) {   /* the real dims last, so rows stay long */
        int j = i - (3 - cp->nsp);
        bool on = j >= 0;
        g->ia[i] = on ? ia[j] : 1;
        g->ib[i] = on ? ib[j] : 1;
        g->k[i] = on ? k[j] : 1;
        g->s[i] = on ? cp->s[j] : 1;
        g->p[i] = on ? cp->p[j] : 0;
        g->d[i] = on ? cp->d[j] : 1;
        g->La *= g->ia[i];
        g->Lb *= g->ib[i];
        g->K *= g->k[i];
    }
}

/* (cnt, C, L) <-> (C, cnt, L): to_batch_major copies src (C, cnt, L) into
   dst (cnt, C, L); otherwise src (cnt, C, L) into dst (C, cnt, L) */
static void dl__conv_permute(const dl_tensor *t, float *dst, const float *src, int64_t cnt,
                             int64_t C, int64_t L, bool to_batch_major)
{
    int64_t shape[3], ds[3], ss[3];
    if (to_batch_major) {
        shape[0] = cnt; shape[1] = C; shape[2] = L;
        ds[0] = C * L; ds[1] = L; ds[2] = 1;
        ss[0] = L; ss[1] = cnt * L; ss[2] = 1;
    } else {
        shape[0] = C; shape[1] = cnt; shape[2] = L;
        ds[0] = cnt * L; ds[1] = L; ds[2] = 1;
        ss[0] = L; ss[1] = C * L; ss[2] = 1;
    }
    if (cnt > 0 && C > 0 && L > 0) dl__K(t)->copy_nd(t->ctx_, 4, 3, shape, dst, ds, src, ss);
}

static dl_tensor *dl__conv_run(dl_tensor *a, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                               const int64_t *ib);
static dl_tensor *dl__convT_run(dl_tensor *b, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                                const int64_t *ia);
static dl_tensor *dl__convW_run(dl_tensor *a, dl_tensor *b, const dl__cparam *cp, const int64_t *k);

/* dbias = sum of g over N and the spatial dims */
static dl_tensor *dl__bias_grad(dl_tensor *g)
{
    dl_shape dims;
    int i;
    if (!g) return NULL;
    dims.ndim = g->ndim - 1;
    dims.d[0] = 0;
    for (i = 2; i < g->ndim; i++) dims.d[i - 1] = i;
    return dl_sum(g, dims, false);
}

/* b = conv(a, w) + bias;  da = convT(g, w), dw = convW(a, g), dbias = sum(g) */
static dl_result dl__conv_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *a = n->in[0], *w = n->in[1];
    dl__cparam_load(n, w->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__convT_run(g, w, NULL, &cp, a->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__convW_run(a, g, &cp, w->shape + 2);
    if (dl__need(n, 2)) gin[2] = dl__bias_grad(g);
    return DL_OK;
}
/* a = convT(b, w) + bias;  db = conv(g, w), dw = convW(g, b), dbias = sum(g) */
static dl_result dl__convT_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *b = n->in[0], *w = n->in[1];
    dl__cparam_load(n, w->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__conv_run(g, w, NULL, &cp, b->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__convW_run(g, b, &cp, w->shape + 2);
    if (dl__need(n, 2)) gin[2] = dl__bias_grad(g);
    return DL_OK;
}
/* w = convW(a, b);  da = convT(b, g), db = conv(a, g) */
static dl_result dl__convW_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__cparam cp;
    dl_tensor *a = n->in[0], *b = n->in[1];
    dl__cparam_load(n, n->out->ndim - 2, &cp);
    if (dl__need(n, 0)) gin[0] = dl__convT_run(b, g, NULL, &cp, a->shape + 2);
    if (dl__need(n, 1)) gin[1] = dl__conv_run(a, g, NULL, &cp, b->shape + 2);
    return DL_OK;
}
static const dl__op dl__op_conv = {"dl_conv", dl__conv_bwd};
static const dl__op dl__op_convT = {"dl_conv_transpose", dl__convT_bwd};
static const dl__op dl__op_convW = {"dl_conv_weight_grad", dl__convW_bwd};

/* a (N,Ca,ia...), w (Cb, Ca/G, k...), bias (Cb) or NULL -> (N, Cb, ib...).
   Shapes were checked by the caller. */
static dl_tensor *dl__conv_run(dl_tensor *a, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                               const int64_t *ib)
{
    const char *name = "dl_conv";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[3];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp;
    if (!a || !w) return NULL;
    ctx = a->ctx_;
    dl__cgeom_make(&g, cp, a->shape[0], a->shape[1], w->shape[0], a->shape + 2, ib, w->shape + 2);
    shape[0] = g.N;
    shape[1] = g.Cb;
    for (i = 0; i < nsp; i++) shape[2 + i] = ib[i];
    y = dl__new(ctx, name, nsp + 2, shape);
    if (!y) return NULL;
    y->device = a->device;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    if (y->numel) {
        /* per chunk of cnt samples: col (CaK, cnt, Lb) = im2col(a);
           yt_g (Cbg, cnt*Lb) = w_g (Cbg, CagK) @ col_g; y = permute(yt) */
        const dl__kernels *k = dl__K(a);
        dl__mark m = dl__arena_mark(&ctx->data);
        float *col, *yt;
        nb = dl__conv_chunk(g.N, (g.Ca * g.K + g.Cb) * g.Lb);
        col = dl__conv_scratch(name, a, nb * (g.Ca * g.K + g.Cb) * g.Lb);
        if (!col) return NULL;
        yt = col + nb * g.Ca * g.K * g.Lb;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            dl__KC(a)->im2col(ctx, col, (const float *)a->data + n0 * g.Ca * g.La, cnt, &g);
            k->gemm(ctx, false, false, Cbg, L, CagK, 1.0f, (const float *)w->data, CagK, Cbg * CagK,
                    col, L, CagK * L, 0.0f, yt, L, Cbg * L, g.G);
            dl__conv_permute(a, (float *)y->data + n0 * g.Cb * g.Lb, yt, cnt, g.Cb, g.Lb, true);
        }
        dl__arena_rewind(&ctx->data, m);
        if (bias) dl__KC(a)->bias_add(ctx, (float *)y->data, (const float *)bias->data, g.N, g.Cb, g.Lb);
    }
    in[0] = a; in[1] = w; in[2] = bias;
    if (dl__record(y, &dl__op_conv, 3, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* b (N,Cb,ib...), w (Cb, Ca/G, k...), bias (Ca) or NULL -> (N, Ca, ia...) */
static dl_tensor *dl__convT_run(dl_tensor *b, dl_tensor *w, dl_tensor *bias, const dl__cparam *cp,
                                const int64_t *ia)
{
    const char *name = "dl_conv_transpose";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[3];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp;
    if (!b || !w) return NULL;
    ctx = b->ctx_;
    dl__cgeom_make(&g, cp, b->shape[0], w->shape[1] * cp->G, b->shape[1], ia, b->shape + 2,
                   w->shape + 2);
    shape[0] = g.N;
    shape[1] = g.Ca;
    for (i = 0; i < nsp; i++) shape[2 + i] = ia[i];
    y = dl__new(ctx, name, nsp + 2, shape);
    if (!y) return NULL;
    y->device = b->device;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    if (y->numel) {
        /* per chunk: bt (Cb, cnt, Lb) = permute(b); col_g (CagK, cnt*Lb) = w_g^T @ bt_g;
           y = col2im(col) */
        const dl__kernels *k = dl__K(b);
        dl__mark m = dl__arena_mark(&ctx->data);
        float *col, *bt;
        nb = dl__conv_chunk(g.N, (g.Ca * g.K + g.Cb) * g.Lb);
        col = dl__conv_scratch(name, b, nb * (g.Ca * g.K + g.Cb) * g.Lb);
        if (!col) return NULL;
        bt = col + nb * g.Ca * g.K * g.Lb;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            dl__conv_permute(b, bt, (const float *)b->data + n0 * g.Cb * g.Lb, cnt, g.Cb, g.Lb, false);
            k->gemm(ctx, true, false, CagK, L, Cbg, 1.0f, (const float *)w->data, CagK, Cbg * CagK,
                    bt, L, Cbg * L, 0.0f, col, L, CagK * L, g.G);
            dl__KC(b)->col2im(ctx, (float *)y->data + n0 * g.Ca * g.La, col, cnt, &g);
        }
        dl__arena_rewind(&ctx->data, m);
        if (bias) dl__KC(b)->bias_add(ctx, (float *)y->data, (const float *)bias->data, g.N, g.Ca, g.La);
    }
    in[0] = b; in[1] = w; in[2] = bias;
    if (dl__record(y, &dl__op_convT, 3, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* a (N,Ca,ia...), b (N,Cb,ib...) -> (Cb, Ca/G, k...) = sum_n b_g[n] col_g[n]^T */
static dl_tensor *dl__convW_run(dl_tensor *a, dl_tensor *b, const dl__cparam *cp, const int64_t *k)
{
    const char *name = "dl_conv_weight_grad";
    int64_t shape[DL_MAX_DIMS], nb, n0, CagK, Cbg;
    dl__cgeom g;
    dl_tensor *y, *in[2];
    dl__node *node;
    dl_ctx *ctx;
    int i, nsp = cp->nsp;
    if (!a || !b) return NULL;
    ctx = a->ctx_;
    dl__cgeom_make(&g, cp, a->shape[0], a->shape[1], b->shape[1], a->shape + 2, b->shape + 2, k);
    shape[0] = g.Cb;
    shape[1] = g.Ca / g.G;
    for (i = 0; i < nsp; i++) shape[2 + i] = k[i];
    y = dl__new(ctx, name, nsp + 2, shape);
    if (!y) return NULL;
    y->device = a->device;
    Cbg = g.Cb / g.G;
    CagK = g.Ca / g.G * g.K;
    if (y->numel) {
        /* per chunk: col = im2col(a), bt = permute(b);
           w_g (Cbg, CagK) += bt_g (Cbg, cnt*Lb) @ col_g^T */
        const dl__kernels *kt = dl__K(a);
        dl__mark m = dl__arena_mark(&ctx->data);
        float *col, *bt;
        if (g.N == 0) kt->fill(ctx, (float *)y->data, y->numel, 0.0f);
        nb = dl__conv_chunk(g.N, (g.Ca * g.K + g.Cb) * g.Lb);
        col = g.N ? dl__conv_scratch(name, a, nb * (g.Ca * g.K + g.Cb) * g.Lb) : NULL;
        if (g.N && !col) return NULL;
        bt = col ? col + nb * g.Ca * g.K * g.Lb : NULL;
        for (n0 = 0; n0 < g.N; n0 += nb) {
            int64_t cnt = g.N - n0 < nb ? g.N - n0 : nb, L = cnt * g.Lb;
            dl__KC(a)->im2col(ctx, col, (const float *)a->data + n0 * g.Ca * g.La, cnt, &g);
            dl__conv_permute(b, bt, (const float *)b->data + n0 * g.Cb * g.Lb, cnt, g.Cb, g.Lb, false);
            kt->gemm(ctx, false, true, Cbg, CagK, L, 1.0f, bt, L, Cbg * L, col, L, CagK * L,
                     n0 == 0 ? 0.0f : 1.0f, (float *)y->data, CagK, Cbg * CagK, g.G);
        }
        dl__arena_rewind(&ctx->data, m);
    }
    in[0] = a; in[1] = b;
    if (dl__record(y, &dl__op_convW, 2, in, &node) < 0) return NULL;
    if (node) dl__cparam_save(node, cp);
    return dl__done(y, name);
}

/* ------------------------------------------------------------ conv: public */

dl_conv_desc dl_conv_desc_make(int64_t stride, int64_t padding, int64_t dilation, int64_t groups)
{
    dl_conv_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < DL_MAX_SPATIAL; i++) {
        d.stride[i] = stride;
        d.padding[i] = padding;
        d.dilation[i] = dilation;
    }
    d.groups = groups;
    return d;
}

static bool dl__same_dev(const char *op, const char *an, const dl_tensor *a, const char *bn,
                         const dl_tensor *b)
{
    char da[32], db[32];
    if (a->ctx_ != b->ctx_) {
        dl__err(a->ctx_, DL_ERR_ARG, "%s: %s and %s belong to different contexts", op, an, bn);
        return false;
    }
    if (a->device.type != b->device.type || a->device.index != b->device.index) {
        dl__err(a->ctx_, DL_ERR_DEVICE, "%s: %s %s is on %s but %s %s is on %s; move one with dl_to()",
                op, an, dl__sh(a), dl__dev_str(a->device, da, sizeof da), bn, dl__sh(b),
                dl__dev_str(b->device, db, sizeof db));
        return false;
    }
    return true;
}

static const char *dl__sp_names(int nsp)
{
    return nsp == 1 ? "L" : nsp == 2 ? "H,W" : "D,H,W";
}

/* floor(a / b) for b > 0 */
static int64_t dl__floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static dl_tensor *dl__conv_api(const char *name, int nsp, bool transposed, dl_tensor *x,
                               dl_tensor *w, dl_tensor *b, const dl_conv_desc *d)
{
    dl_ctx *ctx;
    dl__cparam cp;
    int64_t out[3], C, OC, G;
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x || !w) return NULL;
    if (!dl__live(name, "x", x) || !dl__live(name, "w", w)) return NULL;
    if (b && !dl__live(name, "b", b)) return NULL;
    ctx = x->ctx_;
    if (!dl__same_dev(name, "x", x, "w", w) || (b && !dl__same_dev(name, "x", x, "b", b))) return NULL;
    if (!dl__f32(name, "x", x) || !dl__f32(name, "w", w) || (b && !dl__f32(name, "b", b))) return NULL;
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: x %s must have %d dims (N,C,%s) or %d unbatched (C,%s)",
                name, dl__sh(x), nsp + 2, dl__sp_names(nsp), nsp + 1, dl__sp_names(nsp));
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    if (w->ndim != nsp + 2) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: w %s must have %d dims (%s, %s)", name, dl__sh(w), nsp + 2,
                transposed ? "C_in, OC/groups" : "OC, C/groups", nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
        return NULL;
    }
    G = d && d->groups ? d->groups : 1;
    if (G < 1) {
        dl__err(ctx, DL_ERR_ARG, "%s: groups=%lld must be >= 1 (0 means 1)", name, (long long)G);
        return NULL;
    }
    memset(&cp, 0, sizeof cp);
    cp.nsp = nsp;
    cp.G = G;
    if (d && d->padding_same && transposed) {
        dl__err(ctx, DL_ERR_ARG, "%s: padding_same applies to dl_conv*d only (PyTorch has no "
                "padding='same' for transposed convolution)", name);
        return NULL;
    }
    for (i = 0; i < nsp; i++) {
        int64_t s = d ? d->stride[i] : 0, p = d ? d->padding[i] : 0, dil = d ? d->dilation[i] : 0;
        int64_t op = d ? d->output_padding[i] : 0;
        if (s < 0 || dil < 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 1 (0 means 1)", name,
                    s < 0 ? "stride" : "dilation", i, (long long)(s < 0 ? s : dil));
            return NULL;
        }
        if (s == 0) s = 1;
        if (dil == 0) dil = 1;
        if (p < 0 || op < 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 0", name,
                    p < 0 ? "padding" : "output_padding", i, (long long)(p < 0 ? p : op));
            return NULL;
        }
        if (s > DL__PACK_MAX || dil > DL__PACK_MAX || p > DL__PACK_MAX) {
            dl__err(ctx, DL_ERR_ARG, "%s: stride %lld, padding %lld, dilation %lld in dim %d: "
                    "each must be at most %lld", name, (long long)s, (long long)p, (long long)dil,
                    i, (long long)DL__PACK_MAX);
            return NULL;
        }
        if (!transposed && op != 0) {
            dl__err(ctx, DL_ERR_ARG, "%s: output_padding[%d]=%lld applies to transposed "
                    "convolution only", name, i, (long long)op);
            return NULL;
        }
        if (transposed && op >= s && op >= dil) {
            dl__err(ctx, DL_ERR_ARG, "%s: output_padding[%d]=%lld must be smaller than either "
                    "stride (%lld) or dilation (%lld)", name, i, (long long)op, (long long)s,
                    (long long)dil);
            return NULL;
        }
        if (d && d->padding_same && s != 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: padding_same needs stride 1 in every dim (as PyTorch's "
                    "padding='same'), but stride[%d]=%lld", name, i, (long long)s);
            return NULL;
        }
        cp.s[i] = s;
        cp.p[i] = p;
        cp.d[i] = dil;
    }
    C = x->shape[unbatched ? 0 : 1];
    if (!transposed) {
        OC = w->shape[0];
        if (C % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels, not divisible by groups=%lld",
                    name, dl__sh(x), (long long)C, (long long)G);
            return NULL;
        }
        if (OC % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: w %s has %lld output channels (dim 0), not divisible by "
                    "groups=%lld", name, dl__sh(w), (long long)OC, (long long)G);
            return NULL;
        }
        if (w->shape[1] * G != C) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels but w %s expects "
                    "w.shape[1]*groups = %lld*%lld = %lld (w is (OC, C/groups, %s))", name,
                    dl__sh(x), (long long)C, dl__sh(w), (long long)w->shape[1], (long long)G,
                    (long long)(w->shape[1] * G), nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
            return NULL;
        }
    } else {
        OC = w->shape[1] * G;
        if (w->shape[0] != C) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels but w %s expects w.shape[0] = "
                    "%lld (w is (C_in, OC/groups, %s))", name, dl__sh(x), (long long)C, dl__sh(w),
                    (long long)w->shape[0], nsp == 1 ? "k" : nsp == 2 ? "kH, kW" : "kD, kH, kW");
            return NULL;
        }
        if (C % G != 0) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s has %lld channels, not divisible by groups=%lld",
                    name, dl__sh(x), (long long)C, (long long)G);
            return NULL;
        }
    }
    if (b && (b->ndim != 1 || b->shape[0] != OC)) {
        dl__err(ctx, DL_ERR_SHAPE, "%s: b %s must be (OC) = (%lld), one value per output channel",
                name, dl__sh(b), (long long)OC);
        return NULL;
    }
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i], k = w->shape[2 + i];
        int64_t ek = cp.d[i] * (k - 1) + 1;
        if (k < 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: w %s has kernel size 0 in spatial dim %d", name,
                    dl__sh(w), i);
            return NULL;
        }
        if (d && d->padding_same) {
            int64_t total = cp.d[i] * (k - 1);
            cp.p[i] = total / 2;     /* the odd extra unit goes on the right, as PyTorch */
            out[i] = in;
            if (cp.p[i] > DL__PACK_MAX) {
                dl__err(ctx, DL_ERR_ARG, "%s: padding %lld in dim %d is larger than %lld", name,
                        (long long)cp.p[i], i, (long long)DL__PACK_MAX);
                return NULL;
            }
        } else if (!transposed) {
            int64_t num = in + 2 * cp.p[i] - ek;
            out[i] = num < 0 ? 0 : num / cp.s[i] + 1;
            if (out[i] < 1) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: x %s, w %s: spatial dim %d: the input padded to "
                        "%lld (in %lld + 2*padding %lld) is smaller than the dilated kernel %lld "
                        "(dilation %lld*(k %lld-1)+1): output size would be < 1", name, dl__sh(x),
                        dl__sh(w), i, (long long)(in + 2 * cp.p[i]), (long long)in,
                        (long long)cp.p[i], (long long)ek, (long long)cp.d[i], (long long)k);
                return NULL;
            }
        } else {
            out[i] = (in - 1) * cp.s[i] - 2 * cp.p[i] + ek + (d ? d->output_padding[i] : 0);
            if (out[i] < 1) {
                dl__err(ctx, DL_ERR_SHAPE, "%s: x %s, w %s: spatial dim %d: output size (in-1)*stride "
                        "- 2*padding + dilation*(k-1) + output_padding + 1 = %lld is < 1", name,
                        dl__sh(x), dl__sh(w), i, (long long)out[i]);
                return NULL;
            }
        }
    }
    if (unbatched) x = dl_unsqueeze(x, 0);
    if (!transposed) y = dl__conv_run(x, w, b, &cp, out);
    else y = dl__convT_run(x, w, b, &cp, out);
    return unbatched ? dl_squeeze(y, 0) : y;
}

dl_tensor *dl_conv1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv1d", 1, false, x, w, b, d); }
dl_tensor *dl_conv2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv2d", 2, false, x, w, b, d); }
dl_tensor *dl_conv3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv3d", 3, false, x, w, b, d); }
dl_tensor *dl_conv_transpose1d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose1d", 1, true, x, w, b, d); }
dl_tensor *dl_conv_transpose2d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose2d", 2, true, x, w, b, d); }
dl_tensor *dl_conv_transpose3d(dl_tensor *x, dl_tensor *w, dl_tensor *b, const dl_conv_desc *d) { return dl__conv_api("dl_conv_transpose3d", 3, true, x, w, b, d); }

/* ------------------------------------------------------------ pooling */

typedef struct dl__pparam { int nsp; int64_t k[3], s[3], p[3]; bool adaptive, cip; } dl__pparam;

static void dl__pparam_save(dl__node *n, const dl__pparam *pp)
{
    int i;
    n->i[0] = (pp->adaptive ? 1 : 0) | (pp->cip ? 2 : 0);
    for (i = 0; i < 3; i++) n->i[1 + i] = dl__pack3(pp->k[i], pp->s[i], pp->p[i]);
    n->ni = 4;
}

static void dl__pparam_load(const dl__node *n, int nsp, dl__pparam *pp)
{
    int i;
    pp->nsp = nsp;
    pp->adaptive = (n->i[0] & 1) != 0;
    pp->cip = (n->i[0] & 2) != 0;
    for (i = 0; i < 3; i++) {
        pp->k[i] = dl__unpack(n->i[1 + i], 0);
        pp->s[i] = dl__unpack(n->i[1 + i], 1);
        pp->p[i] = dl__unpack(n->i[1 + i], 2);
    }
}

static void dl__pgeom_make(dl__pgeom *g, int nsp, const int64_t *ia, const int64_t *ob,
                           const int64_t *k, const int64_t *s, const int64_t *p, const int64_t *d)
{
    int i;
    g->La = g->Lb = 1;
    for (i = 0; i < 3; i++) {   /* the real dims last */
        int j = i - (3 - nsp);
        bool on = j >= 0;
        g->ia[i] = on ? ia[j] : 1;
        g->ob[i] = on ? ob[j] : 1;
        g->k[i] = on && k ? k[j] : 1;
        g->s[i] = on && s ? s[j] : 1;
        g->p[i] = on && p ? p[j] : 0;
        g->d[i] = on && d ? d[j] : 1;
        g->La *= g->ia[i];
        g->Lb *= g->ob[i];
    }
    g->adaptive = false;
    g->count_include_pad = false;
}

/* --- max pooling: y = x[idx];  dx = unpool(g, idx);  unpool's backward: gather */
static dl_tensor *dl__unpool(dl_tensor *g, dl_tensor *idx, int ndim, const int64_t *xshape);
static dl_tensor *dl__pool_gather(dl_tensor *x, dl_tensor *idx);

static dl_result dl__maxpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unpool(g, n->saved[0], n->in[0]->ndim, n->in[0]->shape);
    return DL_OK;
}
static dl_result dl__unpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__pool_gather(g, n->saved[0]);
    return DL_OK;
}
static dl_result dl__gather_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    gin[0] = dl__unpool(g, n->saved[0], n->in[0]->ndim, n->in[0]->shape);
    return DL_OK;
}
static const dl__op dl__op_maxpool = {"dl_max_pool", dl__maxpool_bwd};
static const dl__op dl__op_unpool = {"dl_max_pool_backward", dl__unpool_bwd};
static const dl__op dl__op_pgather = {"dl_max_pool_gather", dl__gather_bwd};

/* g (N,C,ob...) scattered to (N,C,ia...) at idx (N,C,ob...) */
static dl_tensor *dl__unpool(dl_tensor *g, dl_tensor *idx, int ndim, const int64_t *xshape)
{
    dl_tensor *y;
    dl__node *n;
    int64_t planes;
    if (!g || !idx) return NULL;
    y = dl__new(g->ctx_, "dl_max_pool_backward", ndim, xshape);
    if (!y) return NULL;
    y->device = g->device;
    planes = xshape[0] * xshape[1];
    if (y->numel)
        dl__KC(g)->unpool(g->ctx_, (float *)y->data, (const float *)g->data,
                          (const int64_t *)idx->data, planes, y->numel / planes,
                          planes ? g->numel / planes : 0);
    if (dl__record(y, &dl__op_unpool, 1, &g, &n) < 0) return NULL;
    if (n) { n->saved[0] = idx; n->nsaved = 1; }
    return dl__done(y, "dl_max_pool_backward");
}

/* x (N,C,ia...) read at idx (N,C,ob...) */
static dl_tensor *dl__pool_gather(dl_tensor *x, dl_tensor *idx)
{
    dl_tensor *y;
    dl__node *n;
    int64_t planes;
    if (!x || !idx) return NULL;
    y = dl__new(x->ctx_, "dl_max_pool_gather", idx->ndim, idx->shape);
    if (!y) return NULL;
    y->device = x->device;
    planes = x->shape[0] * x->shape[1];
    if (y->numel)
        dl__KC(x)->gather(x->ctx_, (float *)y->data, (const float *)x->data,
                          (const int64_t *)idx->data, planes, x->numel / planes, y->numel / planes);
    if (dl__record(y, &dl__op_pgather, 1, &x, &n) < 0) return NULL;
    if (n) { n->saved[0] = idx; n->nsaved = 1; }
    return dl__done(y, "dl_max_pool_gather");
}

/* --- average pooling: y = A x (linear);  dx = A^T g;  A^T's backward is A */
static dl_tensor *dl__avgpool_run(dl_tensor *x, const dl__pparam *pp, const int64_t *ob);
static dl_tensor *dl__avgpool_adj(dl_tensor *g, const dl__pparam *pp, const int64_t *ia);

static dl_result dl__avgpool_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__pparam pp;
    dl__pparam_load(n, n->in[0]->ndim - 2, &pp);
    gin[0] = dl__avgpool_adj(g, &pp, n->in[0]->shape + 2);
    return DL_OK;
}
static dl_result dl__avgpool_adj_bwd(dl__node *n, dl_tensor *g, dl_tensor **gin)
{
    dl__pparam pp;
    dl__pparam_load(n, n->in[0]->ndim - 2, &pp);
    gin[0] = dl__avgpool_run(g, &pp, n->in[0]->shape + 2);
    return DL_OK;
}
static const dl__op dl__op_avgpool = {"dl_avg_pool", dl__avgpool_bwd};
static const dl__op dl__op_avgpool_adj = {"dl_avg_pool_backward", dl__avgpool_adj_bwd};

static void dl__pgeom_from(dl__pgeom *g, const dl__pparam *pp, const int64_t *ia, const int64_t *ob)
{
    dl__pgeom_make(g, pp->nsp, ia, ob, pp->k, pp->s, pp->p, NULL);
    g->adaptive = pp->adaptive;
    g->count_include_pad = pp->cip;
}

static dl_tensor *dl__avgpool_run(dl_tensor *x, const dl__pparam *pp, const int64_t *ob)
{
    const char *name = pp->adaptive ? "dl_adaptive_avg_pool" : "dl_avg_pool";
    int64_t shape[DL_MAX_DIMS];
    dl__pgeom g;
    dl_tensor *y;
    dl__node *n;
    int i;
    if (!x) return NULL;
    shape[0] = x->shape[0];
    shape[1] = x->shape[1];
    for (i = 0; i < pp->nsp; i++) shape[2 + i] = ob[i];
    y = dl__new(x->ctx_, name, pp->nsp + 2, shape);
    if (!y) return NULL;
    y->device = x->device;
    dl__pgeom_from(&g, pp, x->shape + 2, ob);
    if (y->numel)
        dl__KC(x)->avg_pool(x->ctx_, (float *)y->data, (const float *)x->data,
                            shape[0] * shape[1], &g);
    if (dl__record(y, &dl__op_avgpool, 1, &x, &n) < 0) return NULL;
    if (n) dl__pparam_save(n, pp);
    return dl__done(y, name);
}

static dl_tensor *dl__avgpool_adj(dl_tensor *g, const dl__pparam *pp, const int64_t *ia)
{
    const char *name = "dl_avg_pool_backward";
    int64_t shape[DL_MAX_DIMS];
    dl__pgeom pg;
    dl_tensor *y;
    dl__node *n;
    int i;
    if (!g) return NULL;
    shape[0] = g->shape[0];
    shape[1] = g->shape[1];
    for (i = 0; i < pp->nsp; i++) shape[2 + i] = ia[i];
    y = dl__new(g->ctx_, name, pp->nsp + 2, shape);
    if (!y) return NULL;
    y->device = g->device;
    dl__pgeom_from(&pg, pp, ia, g->shape + 2);
    if (y->numel)
        dl__KC(g)->avg_pool_adj(g->ctx_, (float *)y->data, (const float *)g->data,
                                shape[0] * shape[1], &pg);
    if (dl__record(y, &dl__op_avgpool_adj, 1, &g, &n) < 0) return NULL;
    if (n) dl__pparam_save(n, pp);
    return dl__done(y, name);
}

dl_pool_desc dl_pool_desc_make(int64_t kernel, int64_t stride, int64_t padding)
{
    dl_pool_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < DL_MAX_SPATIAL; i++) {
        d.kernel[i] = kernel;
        d.stride[i] = stride;
        d.padding[i] = padding;
        d.dilation[i] = 1;
    }
    d.count_include_pad = true;
    return d;
}

/* x must be (N,C,spatial...) or (C,spatial...); false + error otherwise */
static bool dl__pool_input(const char *name, int nsp, dl_tensor *x)
{
    if (!dl__live(name, "x", x) || !dl__f32(name, "x", x)) return false;
    if (x->ndim != nsp + 2 && x->ndim != nsp + 1) {
        dl__err(x->ctx_, DL_ERR_SHAPE, "%s: x %s must have %d dims (N,C,%s) or %d unbatched (C,%s)",
                name, dl__sh(x), nsp + 2, dl__sp_names(nsp), nsp + 1, dl__sp_names(nsp));
        return false;
    }
    return true;
}

static dl_tensor *dl__pool_api(const char *name, int nsp, bool is_max, dl_tensor *x,
                               const dl_pool_desc *d)
{
    dl_ctx *ctx;
    int64_t k[3], s[3], p[3], dil[3], ob[3];
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x) return NULL;
    if (!dl__pool_input(name, nsp, x)) return NULL;
    ctx = x->ctx_;
    if (!d) {
        dl__err(ctx, DL_ERR_ARG, "%s: desc is NULL; the kernel size is required "
                "(dl_pool_desc_make(kernel, stride, padding))", name);
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i], num;
        k[i] = d->kernel[i];
        s[i] = d->stride[i] ? d->stride[i] : k[i];
        p[i] = d->padding[i];
        dil[i] = d->dilation[i] ? d->dilation[i] : 1;
        if (k[i] < 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: kernel[%d]=%lld must be >= 1", name, i, (long long)k[i]);
            return NULL;
        }
        if (s[i] < 1 || dil[i] < 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: %s[%d]=%lld must be >= 1 (0 means %s)", name,
                    s[i] < 1 ? "stride" : "dilation", i, (long long)(s[i] < 1 ? s[i] : dil[i]),
                    s[i] < 1 ? "the kernel size" : "1");
            return NULL;
        }
        if (p[i] < 0 || p[i] > k[i] / 2) {
            dl__err(ctx, DL_ERR_ARG, "%s: padding[%d]=%lld must be between 0 and half the "
                    "kernel size (kernel[%d]=%lld)", name, i, (long long)p[i], i, (long long)k[i]);
            return NULL;
        }
        if (!is_max && dil[i] != 1) {
            dl__err(ctx, DL_ERR_ARG, "%s: dilation[%d]=%lld: dilation applies to max pooling only",
                    name, i, (long long)dil[i]);
            return NULL;
        }
        if (k[i] > DL__PACK_MAX || s[i] > DL__PACK_MAX || dil[i] > DL__PACK_MAX) {
            dl__err(ctx, DL_ERR_ARG, "%s: kernel %lld, stride %lld, dilation %lld in dim %d: each "
                    "must be at most %lld", name, (long long)k[i], (long long)s[i],
                    (long long)dil[i], i, (long long)DL__PACK_MAX);
            return NULL;
        }
        /* PyTorch's pooling_output_shape */
        num = in + 2 * p[i] - dil[i] * (k[i] - 1) - 1 + (d->ceil_mode ? s[i] - 1 : 0);
        ob[i] = dl__floordiv(num, s[i]) + 1;
        if (d->ceil_mode && (ob[i] - 1) * s[i] >= in + p[i]) ob[i]--;
        if (ob[i] < 1) {
            dl__err(ctx, DL_ERR_SHAPE, "%s: x %s: spatial dim %d of size %lld with padding %lld is "
                    "smaller than the %swindow %lld: output size %lld < 1", name, dl__sh(x), i,
                    (long long)in, (long long)p[i], is_max && dil[i] > 1 ? "dilated " : "",
                    (long long)(dil[i] * (k[i] - 1) + 1), (long long)ob[i]);
            return NULL;
        }
    }
    if (unbatched) x = dl_unsqueeze(x, 0);
    if (!x) return NULL;
    if (is_max) {
        dl__pgeom g;
        dl_tensor *idx = NULL, *in1 = x;
        dl__node *n;
        int64_t shape[DL_MAX_DIMS];
        bool rec = dl__grad_on(ctx) && x->requires_grad;
        shape[0] = x->shape[0];
        shape[1] = x->shape[1];
        for (i = 0; i < nsp; i++) shape[2 + i] = ob[i];
        y = dl__new(ctx, name, nsp + 2, shape);
        if (!y) return NULL;
        y->device = x->device;
        if (rec) {
            idx = dl__make(ctx, name, DL_DTYPE_I64, nsp + 2, shape, false, NULL);
            if (!idx) return NULL;
            idx->device = x->device;
        }
        dl__pgeom_make(&g, nsp, x->shape + 2, ob, k, s, p, dil);
        if (y->numel)
            dl__KC(x)->max_pool(ctx, (float *)y->data, idx ? (int64_t *)idx->data : NULL,
                                (const float *)x->data, shape[0] * shape[1], &g);
        if (dl__record(y, &dl__op_maxpool, 1, &in1, &n) < 0) return NULL;
        if (n) { n->saved[0] = idx; n->nsaved = 1; }
        y = dl__done(y, name);
    } else {
        dl__pparam pp;
        memset(&pp, 0, sizeof pp);
        pp.nsp = nsp;
        pp.cip = d->count_include_pad;
        for (i = 0; i < nsp; i++) { pp.k[i] = k[i]; pp.s[i] = s[i]; pp.p[i] = p[i]; }
        y = dl__avgpool_run(x, &pp, ob);
    }
    return unbatched ? dl_squeeze(y, 0) : y;
}

dl_tensor *dl_max_pool1d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool1d", 1, true, x, d); }
dl_tensor *dl_max_pool2d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool2d", 2, true, x, d); }
dl_tensor *dl_max_pool3d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_max_pool3d", 3, true, x, d); }
dl_tensor *dl_avg_pool1d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool1d", 1, false, x, d); }
dl_tensor *dl_avg_pool2d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool2d", 2, false, x, d); }
dl_tensor *dl_avg_pool3d(dl_tensor *x, const dl_pool_desc *d) { return dl__pool_api("dl_avg_pool3d", 3, false, x, d); }

static dl_tensor *dl__adaptive_api(const char *name, int nsp, dl_tensor *x, dl_shape os)
{
    dl__pparam pp;
    bool unbatched;
    int i;
    dl_tensor *y;
    if (!x) return NULL;
    if (!dl__pool_input(name, nsp, x)) return NULL;
    if (os.ndim != nsp) {
        dl__err(x->ctx_, DL_ERR_ARG, "%s: output_size %s has %d entries; it needs one per spatial "
                "dim (%d)", name, dl__shp(x->ctx_, &os), os.ndim, nsp);
        return NULL;
    }
    unbatched = x->ndim == nsp + 1;
    for (i = 0; i < nsp; i++) {
        int64_t in = x->shape[(unbatched ? 1 : 2) + i];
        if (os.d[i] < 0) {
            dl__err(x->ctx_, DL_ERR_ARG, "%s: output_size %s has a negative entry", name,
                    dl__shp(x->ctx_, &os));
            return NULL;
        }
        if (in < 1 && os.d[i] > 0) {
            dl__err(x->ctx_, DL_ERR_SHAPE, "%s: x %s has size 0 in spatial dim %d: nothing to "
                    "average", name, dl__sh(x), i);
            return NULL;
        }
    }
    memset(&pp, 0, sizeof pp);
    pp.nsp = nsp;
    pp.adaptive = true;
    for (i = 0; i < 3; i++) { pp.k[i] = 1; pp.s[i] = 1; }
    if (unbatched) x = dl_unsqueeze(x, 0);
    y = dl__avgpool_run(x, &pp, os.d);
    return unbatched ? dl_squeeze(y, 0) : y;
}

dl_tensor *dl_adaptive_avg_pool1d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool1d", 1, x, s); }
dl_tensor *dl_adaptive_avg_pool2d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool2d", 2, x, s); }
dl_tensor *dl_adaptive_avg_pool3d(dl_tensor *x, dl_shape s) { return dl__adaptive_api("dl_adaptive_avg_pool3d", 3, x, s); }

#endif /* DL_IMPLEMENTATION && !DL__CONV_IMPLEMENTED */

#endif /* DL__IMPLEMENTED */
#endif /* DL_IMPLEMENTATION */

/*
   LICENSE: MIT No Attribution

   Copyright 2026 the dl.h authors

   Permission is hereby granted, free of charge, to any person obtaining a copy
   of this software and associated documentation files (the "Software"), to
   deal in the Software without restriction, including without limitation the
   rights to use, copy, modify, merge, publish, distribute, sublicense, and/or
   sell copies of the Software, and to permit persons to whom the Software is
   furnished to do so.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
   IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
   FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
   AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
   LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
   FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS
   IN THE SOFTWARE.
*/
