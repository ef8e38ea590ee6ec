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
