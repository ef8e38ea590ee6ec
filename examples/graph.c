/* examples/graph.c - the computation graph of one logistic-regression step,
   written as Graphviz DOT (--out FILE, default build/logreg.dot) and, when
   `dot` is installed, rendered to SVG next to it (x.dot -> x.svg): the
   picture a teacher draws on the board.
   Build: cc -std=c99 -O2 -I. examples/graph.c -o build/graph -lm -lpthread
   Run:   build/graph --out build/logreg.dot */
#define _POSIX_C_SOURCE 200809L
#define DL_IMPLEMENTATION
#include "dl.h"
#include "examples/common.h"
#include <sys/types.h>
#include <sys/wait.h>

static void usage(FILE *out, const char *prog)
{
    fprintf(out, "usage: %s [--out FILE (build/logreg.dot)]\n"
                 "  --out FILE  the graph as Graphviz DOT (not .svg); with Graphviz also FILE.svg\n"
                 "              (FILE's .dot replaced by .svg)\n"
                 "  --help      this text\n", prog);
}

/* Runs `dot -Tsvg dotfile -o svgfile`: 0 ok, 127 no Graphviz, else failed. */
static int run_dot(const char *dotfile, const char *svgfile)
{
    int status;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {   /* a relative name that starts with '-' would read as an option: ./-x */
        char in[4200], outf[4200];
        snprintf(in, sizeof in, "%s%.4096s", dotfile[0] == '-' ? "./" : "", dotfile);
        snprintf(outf, sizeof outf, "%s%.4096s", svgfile[0] == '-' ? "./" : "", svgfile);
        execlp("dot", "dot", "-Tsvg", in, "-o", outf, (char *)NULL);
        _exit(127);
    }
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 1;
    return WEXITSTATUS(status);
}

int main(int argc, char **argv)
{
    const char *out = "build/logreg.dot";
    char svg[4096];
    size_t n;
    int i, rc;
    dl_ctx *ctx;
    dl_tensor *w, *b, *x, *y, *p, *ll, *loss;
    ex_wfile f;
    EX_CHECK_STDOUT(argv[0]);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout, argv[0]); return 0; }
        if (!strcmp(argv[i], "--out") && i + 1 < argc && argv[i + 1][0] && strncmp(argv[i + 1], "--", 2)) {
            out = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--out")) fprintf(stderr, "%s: --out needs a file name\n", argv[0]);
        else fprintf(stderr, "%s: unknown flag %s\n", argv[0], argv[i]);
        usage(stderr, argv[0]);
        return 2;
    }
    n = strlen(out);
    if (n > 4 && !strcmp(out + n - 4, ".svg")) {   /* (the file holds DOT text, the SVG goes beside it) */
        fprintf(stderr, "%s: --out %s: the file is Graphviz DOT text, not SVG: name it .dot (the SVG is "
                "written beside it, x.dot -> x.svg)\n", argv[0], out);
        return 2;
    }
    if (n + 5 > sizeof svg) { fprintf(stderr, "%s: --out %s: path too long\n", argv[0], out); return 2; }
    strcpy(svg, out);
    if (n > 4 && !strcmp(out + n - 4, ".dot")) strcpy(svg + n - 4, ".svg");
    else strcat(svg, ".svg");
    if (!ex_output_ok(argv[0], "--out", out) || !ex_output_ok(argv[0], "--out (its .svg)", svg)) return 2;

    ctx = dl_ctx_init(NULL);
    if (!ctx) { fprintf(stderr, "%s: cannot create a context\n", argv[0]); return 1; }
    w = dl_set_name(dl_requires_grad(dl_keep(dl_zeros(ctx, DL_SHAPE(4, 1))), true), "w");
    b = dl_set_name(dl_requires_grad(dl_keep(dl_zeros(ctx, DL_SHAPE(1))), true), "b");
    x = dl_set_name(dl_randn(ctx, DL_SHAPE(8, 4)), "x");
    y = dl_set_name(dl_rand(ctx, DL_SHAPE(8, 1)), "y");
    /* p = sigmoid(x w + b); loss = -mean(y log p + (1 - y) log(1 - p)) */
    p = dl_sigmoid(dl_add(dl_matmul(x, w), b));
    ll = dl_add(dl_mul(y, dl_log(p)), dl_mul(dl_rsub_scalar(y, 1.0f), dl_log(dl_rsub_scalar(p, 1.0f))));
    loss = dl_set_name(dl_neg(dl_mean(ll, DL_ALL, false)), "loss");
    if (!loss) { fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(ctx)); dl_ctx_free(ctx); return 1; }
    printf("loss %.4f\n", dl_item(loss));

    /* the DOT file: written by dl_graph_dot into a temporary, renamed into place */
    if (!ex_wopen(&f, argv[0], "--out", out)) { dl_ctx_free(ctx); return 1; }
    fclose(f.f);
    f.f = NULL;
    rc = dl_graph_dot(loss, f.tmp) == DL_OK;
    if (!rc) fprintf(stderr, "%s: %s\n", argv[0], dl_error_message(ctx));
    if (!ex_wclose(&f, rc)) { dl_ctx_free(ctx); return 1; }
    dl_ctx_free(ctx);

    /* the SVG, when Graphviz is installed */
    if (!ex_wopen(&f, argv[0], "--out (its .svg)", svg)) return 1;
    fclose(f.f);
    f.f = NULL;
    rc = run_dot(out, f.tmp);
    if (rc == 127) {
        unlink(f.tmp);
        printf("Graphviz `dot` is not installed: view %s with any Graphviz viewer\n", out);
        return 0;
    }
    if (rc != 0) fprintf(stderr, "%s: dot -Tsvg %s failed (exit status %d)\n", argv[0], out, rc);
    return ex_wclose(&f, rc == 0) ? 0 : 1;
}
