/* tests/test_golden.c - dl.h's core ops against PyTorch golden values.

   The values come from tests/golden/gen.py (torch; regenerate with
   `python3 tests/golden/gen.py`). Run from the repository root:
       test_golden [path/to/core.bin]     (default tests/golden/core.bin)
       test_golden --capture path/to/fuzz.bin   (gen_fuzz.py's programs captured)
   For every case it recomputes the forward result, the gradients for a
   fixed upstream gradient (dl_grad with dl_backward_desc.grad = gout) and,
   where the file has them, Hessian-vector products (dl_grad with
   create_graph, then dl_grad of sum_i sum(grad_i * v_i)), and compares with
   |got - want| <= 1e-5 + 1e-4 * |want| (argmax: exactly). A failure prints
   the worst element.

   FILE FORMAT (all integers little-endian)
       8 bytes   magic "DLGOLD1\0"
       uint32    version = 1
       uint32    record count
       records, each:
           uint32  name length, then the name bytes (no NUL)
           uint32  ndim, then ndim x int64 shape
           numel x float32 values (numel = product of shape; 1 for ndim 0)
   Record names are "<op>/<case>/<field>"; a case's records are consecutive:
   inputs (any other field name, in argument order), params (op parameters
   as floats), gout, v_<input>, out, grad_<input> (an input without one does
   not require grad), hv_<input>. See gen.py. */
#define DL_IMPLEMENTATION
#include "dl.h"
#include "harness.h"
#include <stdlib.h>

#define G_MAXIN 8

#include "golden.h"

/* ------------------------------------------------------------------ ops */

/* Runs op on the inputs. Sets *bad to a message when the case itself is
   malformed (unknown op, missing params). */
static dl_tensor *g_run(const char *op, int n, const grec *const *rs, dl_tensor **in,
                        const grec *p, const char **bad)
{
    (void)rs;
    *bad = NULL;
    if (!strcmp(op, "prog")) return g_prog(n, in, p, bad);
    if (!strcmp(op, "mlp")) {
        /* mean((tanh(x W1^T + b1) W2^T + b2 - y)^2); inputs x, y, W1, b1, W2, b2 */
        dl_tensor *h, *d;
        if (n < 6) { *bad = "mlp needs 6 inputs"; return NULL; }
        h = dl_tanh(dl_add(dl_matmul(in[0], dl_transpose(in[2], 0, 1)), in[3]));
        d = dl_sub(dl_add(dl_matmul(h, dl_transpose(in[4], 0, 1)), in[5]), in[1]);
        return dl_mean(dl_mul(d, d), DL_ALL, false);
    }
    return g_core(op, n, in, p, bad);
}

/* ------------------------------------------------------------------ one case */


/* one golden file: its cases, at least min_cases of them */
static void run_file(const char *path, int min_cases)
{
    int ncases = 0;
    if (!g_load(path)) {
        CHECK(0, "loading the golden file %s", path);
        return;
    }
    g_ctx = dl_ctx_init(NULL);
    CHECK(g_ctx != NULL, "dl_ctx_init");
    if (!g_ctx) { g_free_recs(); return; }
    ncases = g_run_cases();
    printf("golden: %d cases from %s (%ld records)\n", ncases, path, g_nrec);
    CHECK(ncases >= min_cases, "expected at least %d cases in %s, found %d", min_cases, path, ncases);
    dl_ctx_free(g_ctx);
    g_free_recs();
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--capture")) g_capture_file(argv[2]);
    else if (argc > 1) run_file(argv[1], 1);
    else {
        run_file("tests/golden/core.bin", 100);
        run_file("tests/golden/activations.bin", 6);   /* gen_activations.py: SiLU */
        run_file("tests/golden/edges.bin", 40);        /* gen_edges.py: ties, 0-d, NaN, bounds */
        run_file("tests/golden/norm.bin", 13);         /* gen_norm.py: dl_norm, zero rows */
        run_file("tests/golden/scan.bin", 33);         /* gen_scan.py: logsumexp, cumsum, special values */
        run_file("tests/golden/masks.bin", 6);         /* gen_masks.py: second derivatives through masks */
        run_file("tests/golden/fuzz.bin", 240);        /* gen_fuzz.py: random programs of the ops above */
        g_capture_file("tests/golden/fuzz.bin");        /* the same, captured and replayed */
    }
    TEST_END();
}
