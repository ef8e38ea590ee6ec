/* parts/nn_decl.h - modules, initializers, optimizers, LR schedules, gradient
   clipping, safetensors checkpoints. Goes into dl.h's declarations after
   "--- debug" (sections "--- nn", "--- optim", "--- io").

   MODULES (PyTorch nn.Module semantics)
     A module is a forward callback, a zeroed block of user state, named
     parameters and buffers, and named children. Everything is owned by the
     context (dl_ctx_free frees it); parameters and buffers are persistent
     tensors, so a forward inside a training loop only makes step tensors.
     Names follow PyTorch's state_dict: a module's own parameters, then its
     buffers, then each child's, recursively, joined with '.' ("0.weight",
     "layer1.0.conv1.weight", "bn.running_mean").

     Wrapping a functional op as a module (what the built-ins do):

         typedef struct { dl_module *fc1, *fc2; } mlp_state;
         static dl_tensor *mlp_forward(dl_module *m, dl_tensor *x) {
             mlp_state *s = (mlp_state *)dl_module_state(m);
             return dl_module_forward(s->fc2, dl_relu(dl_module_forward(s->fc1, x)));
         }
         dl_module *mlp(dl_ctx *ctx) {
             dl_module *m = dl_module_new(ctx, "MLP", mlp_forward, sizeof(mlp_state));
             mlp_state *s;
             if (!m) return NULL;
             s = (mlp_state *)dl_module_state(m);
             s->fc1 = dl_module_add(m, "fc1", dl_nn_linear(ctx, 784, 128, true));
             s->fc2 = dl_module_add(m, "fc2", dl_nn_linear(ctx, 128, 10, true));
             return s->fc1 && s->fc2 ? m : NULL;
         }

     A layer around a functional op (Conv2d, BatchNorm) keeps its settings and
     tensor pointers in the state block, registers parameters with
     dl_module_param (PyTorch's conv init: dl_init_kaiming_uniform(w, sqrt(5)),
     bias dl_init_uniform(b, -1/sqrt(fan_in), 1/sqrt(fan_in)) with
     fan_in = dl_fan_in(w)) and running statistics with dl_module_buffer, and
     branches on dl_module_training(m) in its forward.
*/
#ifndef DL_NN_DECL_H
#define DL_NN_DECL_H

#ifdef __cplusplus
extern "C" {
#endif

/* --- nn */
typedef struct dl_module dl_module;
typedef dl_tensor *(*dl_module_fn)(dl_module *m, dl_tensor *x);

/* A new module of the given type name ("Linear"; shown in messages) whose
   forward is the callback, with state_bytes of zeroed state. Owned by ctx.
   NULL (with an error) on OOM. forward may be NULL for a pure container. */
DL_API dl_module *dl_module_new(dl_ctx *ctx, const char *type, dl_module_fn forward,
                                size_t state_bytes);
DL_API void *dl_module_state(dl_module *m);        /* the state_bytes block (NULL if 0) */
DL_API const char *dl_module_type(const dl_module *m);
DL_API dl_ctx *dl_module_ctx(const dl_module *m);
/* Registers a persistent float32 copy of init (step or persistent) as parameter
   `name` (no '.', unique in m), with requires_grad; returns it. NULL init: NULL. */
DL_API dl_tensor *dl_module_param(dl_module *m, const char *name, dl_tensor *init);
/* Same for a buffer: persistent, no grad, any dtype (bn.running_mean,
   bn.num_batches_tracked as int64); saved in checkpoints, not optimized. */
DL_API dl_tensor *dl_module_buffer(dl_module *m, const char *name, dl_tensor *init);
/* Adds child under `name` (unique in parent; digits for Sequential). Returns
   child; NULL child: NULL without a new message (its constructor failed). */
DL_API dl_module *dl_module_add(dl_module *parent, const char *name, dl_module *child);
DL_API dl_tensor *dl_module_forward(dl_module *m, dl_tensor *x);  /* NULL x -> NULL silently */
DL_API void dl_module_train(dl_module *m, bool on);   /* recursive: .train() / .eval() */
DL_API bool dl_module_training(const dl_module *m);   /* new modules are in training mode */
DL_API dl_module *dl_module_child(dl_module *m, const char *name);  /* direct child or NULL */
/* "layer1.0.conv1.weight" -> that parameter or buffer; NULL + DL_ERR_ARG naming
   the first part that does not exist. */
DL_API dl_tensor *dl_module_get(dl_module *m, const char *path);
/* state_dict order traversal (parameters and buffers, or parameters only as
   named_parameters without de-duplication): fills out[i] / names[i] (either may
   be NULL) for i < max, returns the total count (max = 0 counts). Names longer
   than 127 characters are truncated. */
DL_API int dl_module_named_tensors(dl_module *m, bool params_only, int max, dl_tensor **out,
                                   char (*names)[128]);
DL_API int64_t dl_module_num_params(dl_module *m);   /* elements; shared params once */
DL_API void dl_module_zero_grad(dl_module *m);       /* grads = 0 (kept allocated) */

/* built-ins */
/* Linear: x (*,in) -> x W^T + b (*,out); weight (out,in), bias (out).
   Init as PyTorch: W ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)),
   b ~ U(-1/sqrt(in), 1/sqrt(in)). */
DL_API dl_module *dl_nn_linear(dl_ctx *ctx, int64_t in, int64_t out, bool bias);
DL_API dl_module *dl_nn_sequential(dl_ctx *ctx, int n, dl_module *const *mods); /* "0","1",.. */
DL_API dl_module *dl_nn_relu(dl_ctx *ctx);
DL_API dl_module *dl_nn_sigmoid(dl_ctx *ctx);
DL_API dl_module *dl_nn_tanh(dl_ctx *ctx);
DL_API dl_module *dl_nn_gelu(dl_ctx *ctx);
DL_API dl_module *dl_nn_flatten(dl_ctx *ctx);        /* flatten(1,-1) */

/* init helpers, in place on a float32 CPU tensor, from the context RNG (as
   torch.nn.init). fan_in = shape[1]*prod(shape[2:]), fan_out = shape[0]*prod(shape[2:]);
   tensors with fewer than 2 dims get DL_ERR_SHAPE where a fan is needed. */
DL_API void dl_init_uniform(dl_tensor *t, float lo, float hi);          /* U(lo, hi) */
DL_API void dl_init_normal(dl_tensor *t, float mean, float std);
DL_API void dl_init_constant(dl_tensor *t, float v);
/* fan_in mode, leaky_relu gain sqrt(2/(1+a^2)): U(-b,b), b = gain*sqrt(3/fan_in) */
DL_API void dl_init_kaiming_uniform(dl_tensor *t, float a);
DL_API void dl_init_kaiming_normal(dl_tensor *t, float a);             /* std gain/sqrt(fan_in) */
DL_API void dl_init_xavier_uniform(dl_tensor *t, float gain); /* b = gain*sqrt(6/(in+out)) */
DL_API void dl_init_xavier_normal(dl_tensor *t, float gain);  /* std gain*sqrt(2/(in+out)) */
DL_API int64_t dl_fan_in(const dl_tensor *w);       /* -1 when w has fewer than 2 dims */
DL_API int64_t dl_fan_out(const dl_tensor *w);

/* --- optim
   Update math is PyTorch's single-tensor (for-loop) implementation
   (torch/optim/sgd.py, adam.py, adamw.py); scalars such as bias corrections
   are computed in double as Python does. State (momentum buffers, exp_avg,
   exp_avg_sq, max_exp_avg_sq, per-parameter step counts) is allocated when the
   optimizer is made, so a step never allocates. Parameters without a ->grad
   are skipped (and their step count does not advance). */
typedef struct dl_optim dl_optim;
/* zero = PyTorch defaults (momentum 0, dampening 0, weight_decay 0, no nesterov);
   lr is required (> 0). nesterov needs momentum > 0 and dampening 0. */
typedef struct dl_sgd_desc { float lr, momentum, dampening, weight_decay; bool nesterov; } dl_sgd_desc;
/* Every field is used as given (0 is meaningful): start from dl_adam_desc_default(). */
typedef struct dl_adam_desc { float lr, beta1, beta2, eps, weight_decay; bool amsgrad; } dl_adam_desc;
DL_API dl_adam_desc dl_adam_desc_default(void);  /* lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0 */
/* Optimizers over a module's parameters (state_dict order, shared ones once),
   or over a list of persistent float32 tensors. Owned by the context. */
DL_API dl_optim *dl_sgd(dl_module *m, const dl_sgd_desc *d);
DL_API dl_optim *dl_adam(dl_module *m, const dl_adam_desc *d);   /* NULL d: defaults */
/* AdamW: decoupled weight decay p *= 1 - lr*wd. PyTorch's default wd 0.01 is
   NOT implied by dl_adam_desc_default() (wd 0 there): set it. */
DL_API dl_optim *dl_adamw(dl_module *m, const dl_adam_desc *d);
DL_API dl_optim *dl_sgd_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_sgd_desc *d);
DL_API dl_optim *dl_adam_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d);
DL_API dl_optim *dl_adamw_params(dl_ctx *ctx, int n, dl_tensor *const *params, const dl_adam_desc *d);
DL_API dl_result dl_optim_step(dl_optim *o);   /* one update of every parameter with a grad */
DL_API void dl_optim_zero_grad(dl_optim *o);   /* grads = 0 (kept allocated) */
DL_API void dl_optim_set_lr(dl_optim *o, float lr);
DL_API float dl_optim_lr(const dl_optim *o);
DL_API int64_t dl_optim_steps(const dl_optim *o);  /* dl_optim_step calls so far */
DL_API void dl_optim_free(dl_optim *o);        /* early release (else dl_ctx_free); NULL ok */

/* schedules: pure functions of the epoch/step t (0-based), as
   torch.optim.lr_scheduler's closed forms */
DL_API float dl_lr_step(float base, int64_t epoch, int64_t step_size, float gamma); /* StepLR: base*gamma^(epoch/step_size) */
DL_API float dl_lr_cosine(float base, int64_t t, int64_t t_max, float eta_min);
                /* CosineAnnealingLR: eta_min + (base-eta_min)*(1+cos(pi*t/t_max))/2 */
DL_API float dl_lr_warmup(float base, int64_t t, int64_t warmup);
                /* base*min(1,(t+1)/warmup): = LinearLR(start_factor=1/warmup, total_iters=warmup-1) */
/* torch.nn.utils.clip_grad_norm_: total = L2 norm of all grads (shared params
   once); grads *= min(1, max_norm/(total+1e-6)); returns total (0 without grads). */
DL_API float dl_clip_grad_norm(dl_module *m, float max_norm);

/* --- io: safetensors checkpoints
   File: 8-byte little-endian header length N, N bytes of JSON (padded with
   spaces to a multiple of 8), then the raw little-endian data:
     {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
      "__metadata__": {"format": "pt", "dl.optim": "adam", "dl.lr": "0.001", ...}}
   Tensors: the module's state_dict (its dtypes: F32, I64, I32), then with an
   optimizer "optim.step" (I64 scalar: dl_optim_steps) and per parameter
   "optim.<param>.step" (I64 scalar) and its state:
   "optim.<param>.momentum_buffer" (SGD with momentum), "optim.<param>.exp_avg",
   "optim.<param>.exp_avg_sq", "optim.<param>.max_exp_avg_sq" (amsgrad).
   <param> is the parameter's state_dict name in m ("param<i>" for an
   optimizer parameter that m does not hold). Hyper-parameters go in
   __metadata__ as strings; dl_load restores the learning rate only (the rest
   stay as the optimizer was made).
   dl_save writes path.tmp, flushes and closes it, then renames it over path.
   dl_load checks the whole file (header, every offset against the file size,
   dtypes, shapes, names: a missing or extra tensor is an error) before it
   changes anything, so a failed load leaves m and o as they were. With o NULL
   the optim.* tensors of a file are ignored; files written by
   safetensors.torch.save_file (no __metadata__) load into a module.
   Errors: DL_ERR_IO (open/read/write), DL_ERR_FORMAT (malformed, mismatched). */
DL_API dl_result dl_save(const char *path, dl_module *m, dl_optim *o);  /* o may be NULL */
DL_API dl_result dl_load(const char *path, dl_module *m, dl_optim *o);  /* o may be NULL */

#ifdef __cplusplus
}
#endif
#endif /* DL_NN_DECL_H */
