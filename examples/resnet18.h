/* examples/resnet18.h - d2l's ResNet-18 for Fashion-MNIST (the "resnet18" of
   d2l's multiple-GPUs chapter), in one place for everything that builds it:
   examples/resnet.c (--arch d2l), examples/data_parallel.c (--model
   resnet18), bench/bench.c (step_resnet18) and tests/test_resnet18.c, whose
   PyTorch twin (tests/golden/gen_resnet18.py, bench/torch_bench.py) must
   match it parameter for parameter. Include after dl.h.
     conv 3x3 (in -> 64, stride 1, pad 1) BN ReLU          (no 7x7, no max pool)
     | resnet_block1: 2 residual blocks of 64
     | resnet_block2, 3, 4: 2 blocks of 128, 256, 512; the first of each
       with stride 2 and a 1x1 conv (stride 2) on its shortcut
     | global_avg_pool (1x1) | fc: flatten, linear 512 -> classes
   A block (d2l.Residual): y = relu(bn2(conv2(relu(bn1(conv1(x))))) + s),
   s = conv3(x) (the 1x1 projection, no batch norm) or x; the convs are
   nn.Conv2d's defaults: with a bias. 11,175,818 parameters for 1 input
   channel and 10 classes; parameter names and order are PyTorch's
   state_dict of d2l's model ("0.weight", "resnet_block2.0.conv3.bias",
   "fc.1.weight"). */
#ifndef DL_EXAMPLES_RESNET18_H
#define DL_EXAMPLES_RESNET18_H

#define EX_RESNET18_PARAMS 11175818   /* in_channels 1, 10 classes */

/* d2l.Residual's state: children in its registration order (conv1, conv2,
   conv3, bn1, bn2), so state_dict names and order are PyTorch's */
typedef struct ex_residual { dl_module *conv1, *conv2, *conv3, *bn1, *bn2; } ex_residual;

static inline dl_tensor *ex_residual_forward(dl_module *m, dl_tensor *x)
{
    ex_residual *b = (ex_residual *)dl_module_state(m);
    dl_tensor *y = dl_module_forward_relu(b->bn1, dl_module_forward(b->conv1, x));   /* fused */
    if (b->conv3) x = dl_module_forward(b->conv3, x);
    return dl_module_forward_add_relu(b->bn2, dl_module_forward(b->conv2, y), x);   /* relu(bn2(.) + x), fused */
}

/* d2l.Residual(in, out, use_1x1conv, strides) */
static inline dl_module *ex_residual_block(dl_ctx *ctx, int64_t in, int64_t out, bool use_1x1conv, int64_t stride)
{
    dl_module *m = dl_module_new(ctx, "Residual", ex_residual_forward, sizeof(ex_residual));
    dl_conv_desc c1 = dl_conv_desc_make(stride, 1, 1, 1), c2 = dl_conv_desc_make(1, 1, 1, 1);
    dl_conv_desc c3 = dl_conv_desc_make(stride, 0, 1, 1);
    ex_residual *b;
    if (!m) return NULL;
    b = (ex_residual *)dl_module_state(m);
    b->conv1 = dl_module_add(m, "conv1", dl_nn_conv2d(ctx, in, out, 3, &c1, true));
    b->conv2 = dl_module_add(m, "conv2", dl_nn_conv2d(ctx, out, out, 3, &c2, true));
    if (use_1x1conv) b->conv3 = dl_module_add(m, "conv3", dl_nn_conv2d(ctx, in, out, 1, &c3, true));
    b->bn1 = dl_module_add(m, "bn1", dl_nn_batch_norm2d(ctx, out));
    b->bn2 = dl_module_add(m, "bn2", dl_nn_batch_norm2d(ctx, out));
    if (!b->conv1 || !b->conv2 || (use_1x1conv && !b->conv3) || !b->bn1 || !b->bn2) return NULL;
    return m;
}

/* d2l's resnet18(num_classes, in_channels); NULL on failure (the context
   says why) */
static inline dl_module *ex_resnet18(dl_ctx *ctx, int64_t in_channels, int64_t classes)
{
    static const int64_t width[4] = {64, 128, 256, 512};
    static const char *const stage_name[4] = {"resnet_block1", "resnet_block2", "resnet_block3", "resnet_block4"};
    dl_conv_desc stem = dl_conv_desc_make(1, 1, 1, 1);
    dl_module *m[3], *net, *fc[2], *blocks[2];
    int64_t in = 64;
    int s;
    m[0] = dl_nn_conv2d(ctx, in_channels, 64, 3, &stem, true);
    m[1] = dl_nn_batch_norm2d(ctx, 64);
    m[2] = dl_nn_relu(ctx);
    net = dl_nn_sequential(ctx, 3, m);       /* "0", "1", "2", then the named stages */
    for (s = 0; s < 4 && net; s++) {
        blocks[0] = s == 0 ? ex_residual_block(ctx, in, width[s], false, 1)   /* first_block: no projection */
                           : ex_residual_block(ctx, in, width[s], true, 2);
        blocks[1] = ex_residual_block(ctx, width[s], width[s], false, 1);
        if (!dl_module_add(net, stage_name[s], dl_nn_sequential(ctx, 2, blocks))) return NULL;
        in = width[s];
    }
    if (!net || !dl_module_add(net, "global_avg_pool", dl_nn_adaptive_avg_pool2d(ctx, DL_SHAPE(1, 1)))) return NULL;
    fc[0] = dl_nn_flatten(ctx);
    fc[1] = dl_nn_linear(ctx, 512, classes, true);
    if (!dl_module_add(net, "fc", dl_nn_sequential(ctx, 2, fc))) return NULL;
    return net;
}

#endif
