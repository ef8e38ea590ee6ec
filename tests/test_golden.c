/* tests/test_golden.c - dl.h's core ops against PyTorch golden values.

   The values come from tests/golden/gen.py (torch; regenerate with
   `python3 tests/golden/gen.py`). Run from the repository root:
       test_golden [path/to/core.bin]     (default tests/golden/core.bin)
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

/* params as integers; fails the case if fewer than need */
static int g_pi(const grec *params, int k) { return (int)params->v[k]; }

/* reduction params: [keepdim, correction, all_flag, dims...] */
static dl_shape g_red_dims(const grec *p)
{
    int64_t d[DL_MAX_DIMS];
    int i, n = (int)p->numel - 3;
    if (g_pi(p, 2)) return DL_ALL;
    if (n > DL_MAX_DIMS) n = DL_MAX_DIMS;
    for (i = 0; i < n; i++) d[i] = (int64_t)p->v[3 + i];
    return dl_shape_make(n, d);
}

static dl_shape g_param_shape(const grec *p, int from)
{
    int64_t d[DL_MAX_DIMS];
    int i, n = (int)p->numel - from;
    if (n > DL_MAX_DIMS) n = DL_MAX_DIMS;
    if (n < 0) n = 0;
    for (i = 0; i < n; i++) d[i] = (int64_t)p->v[from + i];
    return dl_shape_make(n, d);
}

/* ------------------------------------------------------------------ ops */

/* gen_fuzz.py's OPS, in the same order: a "prog" case's op indexes */
static const char *const g_prog_ops[] = {
    "add", "sub", "mul", "div", "maximum", "minimum", "matmul", "add_scalar", "mul_scalar",
    "rsub_scalar", "pow", "neg", "exp", "log", "sqrt", "abs", "erf", "relu", "sigmoid", "tanh",
    "gelu", "silu", "leaky_relu", "clamp", "sum", "mean", "max", "min", "var", "norm", "max_dim",
    "min_dim", "softmax", "log_softmax", "reshape", "squeeze", "unsqueeze", "permute",
    "transpose", "narrow", "cat", "stack", "expand", "sum_to", "flatten", "div_scalar",
    "sub_scalar"};
#define G_PROG_MAX 96

/* Runs op on the inputs. Sets *bad to a message when the case itself is
   malformed (unknown op, missing params). */
static dl_tensor *g_run(const char *op, int n, const grec *const *rs, dl_tensor **in,
                        const grec *p, const char **bad)
{
    dl_tensor *x = n > 0 ? in[0] : NULL, *y = n > 1 ? in[1] : NULL;
    int np = p ? (int)p->numel : 0;
    (void)rs;
#define G_NEED(ni, npar) do { if (n < (ni) || np < (npar)) { *bad = "wrong number of inputs or params"; return NULL; } } while (0)
    *bad = NULL;
    if (!strcmp(op, "add")) { G_NEED(2, 0); return dl_add(x, y); }
    if (!strcmp(op, "sub")) { G_NEED(2, 0); return dl_sub(x, y); }
    if (!strcmp(op, "mul")) { G_NEED(2, 0); return dl_mul(x, y); }
    if (!strcmp(op, "div")) { G_NEED(2, 0); return dl_div(x, y); }
    if (!strcmp(op, "maximum")) { G_NEED(2, 0); return dl_maximum(x, y); }
    if (!strcmp(op, "minimum")) { G_NEED(2, 0); return dl_minimum(x, y); }
    if (!strcmp(op, "matmul")) { G_NEED(2, 0); return dl_matmul(x, y); }
    if (!strcmp(op, "add_scalar")) { G_NEED(1, 1); return dl_add_scalar(x, p->v[0]); }
    if (!strcmp(op, "sub_scalar")) { G_NEED(1, 1); return dl_sub_scalar(x, p->v[0]); }
    if (!strcmp(op, "mul_scalar")) { G_NEED(1, 1); return dl_mul_scalar(x, p->v[0]); }
    if (!strcmp(op, "div_scalar")) { G_NEED(1, 1); return dl_div_scalar(x, p->v[0]); }
    if (!strcmp(op, "rsub_scalar")) { G_NEED(1, 1); return dl_rsub_scalar(x, p->v[0]); }
    if (!strcmp(op, "pow")) { G_NEED(1, 1); return dl_pow(x, p->v[0]); }
    if (!strcmp(op, "neg")) { G_NEED(1, 0); return dl_neg(x); }
    if (!strcmp(op, "exp")) { G_NEED(1, 0); return dl_exp(x); }
    if (!strcmp(op, "log")) { G_NEED(1, 0); return dl_log(x); }
    if (!strcmp(op, "sqrt")) { G_NEED(1, 0); return dl_sqrt(x); }
    if (!strcmp(op, "abs")) { G_NEED(1, 0); return dl_abs(x); }
    if (!strcmp(op, "erf")) { G_NEED(1, 0); return dl_erf(x); }
    if (!strcmp(op, "relu")) { G_NEED(1, 0); return dl_relu(x); }
    if (!strcmp(op, "sigmoid")) { G_NEED(1, 0); return dl_sigmoid(x); }
    if (!strcmp(op, "tanh")) { G_NEED(1, 0); return dl_tanh(x); }
    if (!strcmp(op, "gelu")) { G_NEED(1, 0); return dl_gelu(x); }
    if (!strcmp(op, "silu")) { G_NEED(1, 0); return dl_silu(x); }
    if (!strcmp(op, "leaky_relu")) { G_NEED(1, 1); return dl_leaky_relu(x, p->v[0]); }
    if (!strcmp(op, "clamp")) { G_NEED(1, 2); return dl_clamp(x, p->v[0], p->v[1]); }
    if (!strcmp(op, "sum")) { G_NEED(1, 3); return dl_sum(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "mean")) { G_NEED(1, 3); return dl_mean(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "max")) { G_NEED(1, 3); return dl_max(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "min")) { G_NEED(1, 3); return dl_min(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "var")) { G_NEED(1, 3); return dl_var(x, g_red_dims(p), g_pi(p, 1), g_pi(p, 0) != 0); }
    if (!strcmp(op, "norm")) { G_NEED(1, 3); return dl_norm(x, g_red_dims(p), g_pi(p, 0) != 0); }
    if (!strcmp(op, "argmax")) { G_NEED(1, 2); return dl_argmax(x, g_pi(p, 0), g_pi(p, 1) != 0); }
    if (!strncmp(op, "max_dim", 7) || !strncmp(op, "min_dim", 7)) {   /* values, or "_idx": indices */
        dl_tensor *idx = NULL, *v;
        G_NEED(1, 2);
        v = op[1] == 'a' ? dl_max_dim(x, g_pi(p, 0), g_pi(p, 1) != 0, &idx)
                         : dl_min_dim(x, g_pi(p, 0), g_pi(p, 1) != 0, &idx);
        return op[7] ? idx : v;
    }
    if (!strcmp(op, "softmax")) { G_NEED(1, 1); return dl_softmax(x, g_pi(p, 0)); }
    if (!strcmp(op, "log_softmax")) { G_NEED(1, 1); return dl_log_softmax(x, g_pi(p, 0)); }
    if (!strcmp(op, "reshape")) { G_NEED(1, 1); return dl_reshape(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "flatten")) { G_NEED(1, 2); return dl_flatten(x, g_pi(p, 0), g_pi(p, 1)); }
    if (!strcmp(op, "squeeze")) { G_NEED(1, 1); return dl_squeeze(x, g_pi(p, 0)); }
    if (!strcmp(op, "unsqueeze")) { G_NEED(1, 1); return dl_unsqueeze(x, g_pi(p, 0)); }
    if (!strcmp(op, "permute")) { G_NEED(1, 1); return dl_permute(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "transpose")) { G_NEED(1, 2); return dl_transpose(x, g_pi(p, 0), g_pi(p, 1)); }
    if (!strcmp(op, "narrow")) { G_NEED(1, 3); return dl_narrow(x, g_pi(p, 0), (int64_t)p->v[1], (int64_t)p->v[2]); }
    if (!strcmp(op, "cat")) { G_NEED(1, 1); return dl_cat(n, in, g_pi(p, 0)); }
    if (!strcmp(op, "stack")) { G_NEED(1, 1); return dl_stack(n, in, g_pi(p, 0)); }
    if (!strcmp(op, "expand")) { G_NEED(1, 1); return dl_expand(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "sum_to")) { G_NEED(1, 1); return dl_sum_to(x, g_param_shape(p, 0)); }
    if (!strcmp(op, "prog")) {
        /* gen_fuzz.py's program: params = [count, then per instruction: op index,
           input count, input indexes (inputs 0 .. n-1, instruction k's result
           n + k), param count, params]; its result is the last instruction's */
        dl_tensor *vals[G_PROG_MAX], *args[G_MAXIN];
        int nv = n, k, j, ninstr;
        long pos = 1;
        G_NEED(1, 1);
        if (n > G_PROG_MAX) { *bad = "too many inputs"; return NULL; }
        for (k = 0; k < n; k++) vals[k] = in[k];
        ninstr = g_pi(p, 0);
        for (k = 0; k < ninstr; k++) {
            grec q;
            int opi, ni, npp;
            if (pos + 2 > np) { *bad = "program cut short"; return NULL; }
            opi = g_pi(p, (int)pos++);
            ni = g_pi(p, (int)pos++);
            if (opi < 0 || opi >= (int)(sizeof g_prog_ops / sizeof g_prog_ops[0]) || ni < 1 || ni > G_MAXIN ||
                pos + ni + 1 > np || nv == G_PROG_MAX) {
                *bad = "bad instruction";
                return NULL;
            }
            for (j = 0; j < ni; j++) {
                int r = g_pi(p, (int)pos++);
                if (r < 0 || r >= nv) { *bad = "an input index out of range"; return NULL; }
                args[j] = vals[r];
            }
            npp = g_pi(p, (int)pos++);
            if (npp < 0 || pos + npp > np) { *bad = "params cut short"; return NULL; }
            memset(&q, 0, sizeof q);
            q.ndim = 1;
            q.shape[0] = npp;
            q.numel = npp;
            q.v = p->v + pos;
            pos += npp;
            vals[nv] = g_run(g_prog_ops[opi], ni, NULL, args, &q, bad);
            if (*bad || !vals[nv]) return NULL;
            nv++;
        }
        return nv > n ? vals[nv - 1] : NULL;
    }
    if (!strcmp(op, "mlp")) {
        /* mean((tanh(x W1^T + b1) W2^T + b2 - y)^2); inputs x, y, W1, b1, W2, b2 */
        dl_tensor *h, *d;
        G_NEED(6, 0);
        h = dl_tanh(dl_add(dl_matmul(in[0], dl_transpose(in[2], 0, 1)), in[3]));
        d = dl_sub(dl_add(dl_matmul(h, dl_transpose(in[4], 0, 1)), in[5]), in[1]);
        return dl_mean(dl_mul(d, d), DL_ALL, false);
    }
#undef G_NEED
    *bad = "unknown op";
    return NULL;
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
    if (argc > 1) run_file(argv[1], 1);
    else {
        run_file("tests/golden/core.bin", 100);
        run_file("tests/golden/activations.bin", 6);   /* gen_activations.py: SiLU */
        run_file("tests/golden/edges.bin", 40);        /* gen_edges.py: ties, 0-d, NaN, bounds */
        run_file("tests/golden/norm.bin", 13);         /* gen_norm.py: dl_norm, zero rows */
        run_file("tests/golden/masks.bin", 6);         /* gen_masks.py: second derivatives through masks */
        run_file("tests/golden/fuzz.bin", 240);        /* gen_fuzz.py: random programs of the ops above */
    }
    TEST_END();
}
