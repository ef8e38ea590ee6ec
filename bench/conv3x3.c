/* The ResNet's 3x3 stride-1 convolutions, forward and backward at batch
   256, through Winograd's F(2x2, 3x3) (the CPU backend's conv_wg) and
   through the direct paths (a second CPU device whose backend lacks
   conv_wg): best of 7 each, in ms. The backward includes the product with
   a fixed upstream gradient and its sum.
     build/bench_conv3x3 [threads]          (make build/bench_conv3x3) */
#define DL_IMPLEMENTATION
#include "dl.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static dl__backend g_direct;

int main(int argc, char **argv)
{
    static const int64_t sh[4][3] = {{16, 28, 28}, {32, 14, 14}, {64, 7, 7}, {128, 4, 4}};
    dl_ctx_desc cd;
    dl_ctx *c;
    int s, dev, r;
    memset(&cd, 0, sizeof cd);
    cd.cpu_devices = 2;
    cd.num_threads = argc > 1 ? atoi(argv[1]) : 1;
    c = dl_ctx_init(&cd);
    if (!c) return 1;
    if (!dl__cpu_be()->conv_wg) printf("# this build has no Winograd entries (they need AVX-512, or AVX2 and FMA): both rows are direct\n");
    g_direct = *dl__cpu_be();
    g_direct.conv_wg = NULL;
    g_direct.conv_wg_wgrad = NULL;
    c->cpu[1]->be = &g_direct;
    printf("# channels size threads path fwd_ms bwd_ms\n");
    for (s = 0; s < 4; s++)
        for (dev = 0; dev < 2; dev++) {
            double best[2] = {1e30, 1e30};
            dl_conv_desc d = dl_conv_desc_make(1, 1, 1, 1);
            dl_tensor *x, *w, *gy;
            dl_set_device(c, dl_cpu_device(dev));
            x = dl_requires_grad(dl_keep(dl_randn(c, DL_SHAPE(256, sh[s][0], sh[s][1], sh[s][2]))), true);
            w = dl_requires_grad(dl_keep(dl_randn(c, DL_SHAPE(sh[s][0], sh[s][0], 3, 3))), true);
            gy = dl_keep(dl_randn(c, DL_SHAPE(256, sh[s][0], sh[s][1], sh[s][2])));
            for (r = 0; r < 7; r++) {
                double t0 = now_ms(), t1, t2;
                dl_tensor *y = dl_conv2d(x, w, NULL, &d);
                dl_sync(c);
                t1 = now_ms();
                if (dl_backward(dl_sum(dl_mul(y, gy), DL_ALL, false)) != DL_OK) {
                    fprintf(stderr, "%s\n", dl_error_message(c));
                    return 1;
                }
                dl_sync(c);
                t2 = now_ms();
                if (t1 - t0 < best[0]) best[0] = t1 - t0;
                if (t2 - t1 < best[1]) best[1] = t2 - t1;
                dl_step_end(c);
            }
            printf("conv3x3 %3lld %2lldx%-2lld %d %-8s %6.2f %6.2f\n", (long long)sh[s][0], (long long)sh[s][1],
                   (long long)sh[s][2], dl_num_threads(c), dev ? "direct" : "winograd", best[0], best[1]);
        }
    dl_ctx_free(c);
    return 0;
}
