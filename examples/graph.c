/* examples/graph.c - the computation graph of one logistic-regression step,
   written as Graphviz DOT (build/logreg.dot) and, when `dot` is installed,
   rendered to build/logreg.svg: the picture a teacher draws on the board.
   Build: cc -std=c99 -O2 -I. examples/graph.c -o build/graph -lm -lpthread */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    dl_ctx *ctx = dl_ctx_init(NULL);
    dl_tensor *w = dl_set_name(dl_requires_grad(dl_keep(dl_zeros(ctx, DL_SHAPE(4, 1))), true), "w");
    dl_tensor *b = dl_set_name(dl_requires_grad(dl_keep(dl_zeros(ctx, DL_SHAPE(1))), true), "b");
    dl_tensor *x = dl_set_name(dl_randn(ctx, DL_SHAPE(8, 4)), "x");
    dl_tensor *y = dl_set_name(dl_rand(ctx, DL_SHAPE(8, 1)), "y");
    /* p = sigmoid(x w + b); loss = -mean(y log p + (1 - y) log(1 - p)) */
    dl_tensor *p = dl_sigmoid(dl_add(dl_matmul(x, w), b));
    dl_tensor *ll = dl_add(dl_mul(y, dl_log(p)), dl_mul(dl_rsub_scalar(y, 1.0f), dl_log(dl_rsub_scalar(p, 1.0f))));
    dl_tensor *loss = dl_set_name(dl_neg(dl_mean(ll, DL_ALL, false)), "loss");
    if (!loss || dl_graph_dot(loss, "build/logreg.dot") != DL_OK) { fprintf(stderr, "%s\n", dl_error_message(ctx)); return 1; }
    printf("wrote build/logreg.dot (loss %.4f)\n", dl_item(loss));
    if (system("command -v dot >/dev/null 2>&1") == 0) {
        if (system("dot -Tsvg build/logreg.dot -o build/logreg.svg") == 0) printf("wrote build/logreg.svg\n");
    } else {
        printf("Graphviz `dot` is not installed: view the .dot file with any Graphviz viewer\n");
    }
    dl_ctx_free(ctx);
    return 0;
}
