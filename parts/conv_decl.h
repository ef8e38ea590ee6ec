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
