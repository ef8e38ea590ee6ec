/* examples/resnet_small.h - the small ResNet of examples/resnet.c, in one
   place for everything that builds it: the example, bench/bench.c
   (step_resnet_small) and tests/test_capture.c (a narrower net of the same
   blocks). Its block is a user module, PyTorch's custom nn.Module: state
   in a struct, children registered with dl_module_add so that parameters
   get PyTorch's names (3.0.conv1.weight ...). Include after dl.h.
     conv 3x3 (1->16) BN ReLU | 4 stages of 2 blocks, widths 16-32-64-128,
     stride 2 from the second stage | global average pool | linear 128->10 */
#ifndef DL_EXAMPLES_RESNET_SMALL_H
#define DL_EXAMPLES_RESNET_SMALL_H

/* one block's children; proj and proj_bn NULL where the shape stays */
typedef struct ex_small_block_state { dl_module *conv1, *bn1, *conv2, *bn2, *proj, *proj_bn; } ex_small_block_state;

/* y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)) */
static inline dl_tensor *ex_small_block_forward(dl_module *m, dl_tensor *x)
{
    ex_small_block_state *b = (ex_small_block_state *)dl_module_state(m);
    dl_tensor *h = dl_module_forward_relu(b->bn1, dl_module_forward(b->conv1, x));   /* one op */
    dl_tensor *sc = b->proj ? dl_module_forward(b->proj_bn, dl_module_forward(b->proj, x)) : x;
    return dl_module_forward_add_relu(b->bn2, dl_module_forward(b->conv2, h), sc);   /* one op */
}

/* a block from in to out channels; a 1x1 conv + BN shortcut where the
   shape changes (stride, or in != out). NULL on failure (the context's
   error says why) */
static inline dl_module *ex_small_block(dl_ctx *ctx, int64_t in, int64_t out, int64_t stride)
{
    dl_module *m = dl_module_new(ctx, "ResidualBlock", ex_small_block_forward, sizeof(ex_small_block_state));
    ex_small_block_state *b;
    dl_conv_desc c1 = dl_conv_desc_make(stride, 1, 1, 1), c2 = dl_conv_desc_make(1, 1, 1, 1);
    dl_conv_desc p = dl_conv_desc_make(stride, 0, 1, 1);
    if (!m) return NULL;
    b = (ex_small_block_state *)dl_module_state(m);
    b->conv1 = dl_module_add(m, "conv1", dl_nn_conv2d(ctx, in, out, 3, &c1, false));
    b->bn1 = dl_module_add(m, "bn1", dl_nn_batch_norm2d(ctx, out));
    b->conv2 = dl_module_add(m, "conv2", dl_nn_conv2d(ctx, out, out, 3, &c2, false));
    b->bn2 = dl_module_add(m, "bn2", dl_nn_batch_norm2d(ctx, out));
    if (stride != 1 || in != out) {
        b->proj = dl_module_add(m, "shortcut", dl_nn_conv2d(ctx, in, out, 1, &p, false));
        b->proj_bn = dl_module_add(m, "shortcut_bn", dl_nn_batch_norm2d(ctx, out));
    }
    return m;
}

/* the whole net, a Sequential of 7 */
static inline dl_module *ex_resnet_small(dl_ctx *ctx)
{
    static const int64_t width[4] = {16, 32, 64, 128};
    dl_conv_desc stem = dl_conv_desc_make(1, 1, 1, 1);
    dl_module *stage[4], *blocks[2], *m[7];
    int64_t in = 16;
    int s;
    for (s = 0; s < 4; s++) {
        blocks[0] = ex_small_block(ctx, in, width[s], s == 0 ? 1 : 2);
        blocks[1] = ex_small_block(ctx, width[s], width[s], 1);
        stage[s] = dl_nn_sequential(ctx, 2, blocks);
        in = width[s];
    }
    m[0] = dl_nn_conv2d(ctx, 1, 16, 3, &stem, false);
    m[1] = dl_nn_batch_norm2d(ctx, 16);
    m[2] = dl_nn_relu(ctx);
    m[3] = dl_nn_sequential(ctx, 4, stage);
    m[4] = dl_nn_adaptive_avg_pool2d(ctx, DL_SHAPE(1, 1));
    m[5] = dl_nn_flatten(ctx);
    m[6] = dl_nn_linear(ctx, 128, 10, true);
    return dl_nn_sequential(ctx, 7, m);
}

#endif
