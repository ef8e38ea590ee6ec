#!/usr/bin/env python3
"""tests/golden/gen_fuzz.py - random programs of core ops against PyTorch.

Run from the repository root:   python3 tests/golden/gen_fuzz.py [out.bin [count [conv.bin [count]]]]
(default output: tests/golden/fuzz.bin, 240 programs, read by test_golden.c,
and tests/golden/fuzz_conv.bin, 120, read by test_conv.c).
Deterministic: random.seed(1357) and torch.manual_seed(1357), CPU, float32.

Each case is a program of 3 to 10 instructions over one to three inputs:
elementwise ops with broadcasting, scalars, reductions over dims, max/min
along a dim, softmax, matmul and the shape ops (views, cat, stack,
expand, sum_to), each instruction reading any earlier value, so a value
feeds several ops and a gradient adds up from several paths. The C runner
(test_golden.c's "prog" op) runs the same instructions with dl.h's ops and
checks the output, every input's gradient and, for a third of the
programs, the Hessian-vector product and which first gradients carry
history (create_graph), as for any golden case.

A program is kept only where it is well conditioned: its float32 results
(output, gradients, Hessian-vector products) within 1e-6 + 1e-5 |x| of
the same program in float64 and finite, with no ties where a gradient
picks one element (max along a dim) and no input near a kink or a pole
(log, sqrt, div, pow's bases kept at 0.1 or more; clamp's bounds away
from the values). A dl.h result outside the runner's tolerance (1e-5 +
1e-4 |x|, ten times wider) is then a difference in what the ops compute,
not in rounding.

Program encoding (the case's params record, floats): the instruction
count, then per instruction: the op's name (its length, then its
characters' codes), its input count, the input values' indexes (the
inputs are 0 .. n-1, instruction k's result is n + k), its param count
and params in the form the op's own golden cases use (gen.py, gen_conv.py).
The program's result is the last instruction's (tests/golden.h: g_prog).

The convolution programs (fuzz_conv.bin, test_conv.c; 120 of them) start
from a batch x (N, C, spatial 1-d or 2-d) and a bank P of 400 values that
every weight and bias is a narrow + reshape of (so P's gradient adds up
the weights'): convolutions and transposed convolutions (stride, padding,
'same', dilation, groups, output_padding), max, average and adaptive
pooling, activations, residual adds, channel cat, and views that hand a
convolution a non-contiguous input (a transpose of the spatial dims, a
narrow), then a reduction or a Linear from P.

FILE FORMAT and record names: as tests/golden/core.bin (see gen.py):
prog/<k>/x0 .. x2, params, gout, [v_*], out, grad_*, [greq, hv_*].
"""
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldfile  # noqa: E402

def run_op(op, xs, p):
    """op on tensors xs with params p (floats), as test_golden.c's g_run"""
    x = xs[0]
    pi = [int(v) for v in p]
    if op in ("add", "sub", "mul", "div", "maximum", "minimum", "matmul"):
        return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
                "maximum": torch.maximum, "minimum": torch.minimum, "matmul": torch.matmul}[op](x, xs[1])
    if op == "add_scalar":
        return x + p[0]
    if op == "sub_scalar":
        return x - p[0]
    if op == "mul_scalar":
        return x * p[0]
    if op == "div_scalar":
        return x / p[0]
    if op == "rsub_scalar":
        return p[0] - x
    if op == "pow":
        return torch.pow(x, p[0])
    un = {"neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs,
          "erf": torch.erf, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
          "gelu": F.gelu, "silu": F.silu}
    if op in un:
        return un[op](x)
    if op == "leaky_relu":
        return F.leaky_relu(x, p[0])
    if op == "clamp":
        return torch.clamp(x, p[0], p[1])
    if op in ("sum", "mean", "max", "min", "var", "norm"):
        keep, corr, allf = bool(pi[0]), pi[1], pi[2]
        return goldfile.reduce(op, x, tuple(range(x.dim())) if allf else tuple(pi[3:]), keep, corr)
    if op in ("max_dim", "min_dim"):
        f = torch.max if op == "max_dim" else torch.min
        return f(x, pi[0], keepdim=bool(pi[1])).values
    if op == "softmax":
        return torch.softmax(x, pi[0])
    if op == "log_softmax":
        return torch.log_softmax(x, pi[0])
    if op == "reshape":
        return x.reshape(pi)
    if op == "squeeze":
        return x.squeeze(pi[0])
    if op == "unsqueeze":
        return x.unsqueeze(pi[0])
    if op == "permute":
        return x.permute(pi)
    if op == "transpose":
        return x.transpose(pi[0], pi[1])
    if op == "narrow":
        return x.narrow(pi[0], pi[1], pi[2])
    if op == "cat":
        return torch.cat(xs, pi[0])
    if op == "stack":
        return torch.stack(xs, pi[0])
    if op == "expand":
        return x.expand(pi).contiguous()
    if op == "sum_to":
        return x.sum_to_size(pi)
    if op == "flatten":
        return torch.flatten(x, pi[0], pi[1])
    if op.startswith("conv"):   # gen_conv.py's params: stride, padding, dilation, output_padding, groups, same
        nsp = int(op[-2])
        st, pd, dl, opd = tuple(pi[0:nsp]), tuple(pi[3:3 + nsp]), tuple(pi[6:6 + nsp]), tuple(pi[9:9 + nsp])
        b = xs[2] if len(xs) > 2 else None
        if op.startswith("conv_transpose"):
            return CONVT[nsp](x, xs[1], b, stride=st, padding=pd, output_padding=opd, groups=pi[12], dilation=dl)
        return CONV[nsp](x, xs[1], b, stride=st, padding="same" if pi[13] else pd, dilation=dl, groups=pi[12])
    if "_pool" in op:   # kernel, stride (0: the kernel), padding, dilation, ceil_mode, count_include_pad
        nsp = int(op[-2])
        if op.startswith("adaptive"):
            return ADAP[nsp](x, tuple(pi[:nsp]))
        ks, pd, dl = tuple(pi[0:nsp]), tuple(pi[6:6 + nsp]), tuple(pi[9:9 + nsp])
        st = tuple(pi[3 + i] or pi[i] for i in range(nsp))
        if op.startswith("max"):
            return MAXP[nsp](x, ks, st, pd, dl, ceil_mode=bool(pi[12]))
        return AVGP[nsp](x, ks, st, pd, ceil_mode=bool(pi[12]), count_include_pad=bool(pi[13]))
    raise ValueError(op)


CONV = {1: F.conv1d, 2: F.conv2d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d}
MAXP = {1: F.max_pool1d, 2: F.max_pool2d}
AVGP = {1: F.avg_pool1d, 2: F.avg_pool2d}
ADAP = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d}


def run_prog(prog, inputs):
    vals = list(inputs)
    for op, ins, p in prog:
        vals.append(run_op(op, [vals[i] for i in ins], p))
    return vals[-1]


def encode(prog):
    code = [float(len(prog))]
    for op, ins, p in prog:
        code += [float(len(op))] + [float(ord(c)) for c in op] + [float(len(ins))] + [float(i) for i in ins] + \
            [float(len(p))] + [float(v) for v in p]
    return code


def rshape(rng):
    return [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]


def ties(t, dim):
    """two equal values along dim somewhere (max_dim's index would be a choice)"""
    s, _ = torch.sort(t, dim=dim)
    return bool((s.diff(dim=dim) == 0).any()) if t.shape[dim] > 1 else False


class Gen:
    """builds a program instruction by instruction, on float64 values"""

    def __init__(self, rng, inputs):
        self.rng = rng
        self.vals = list(inputs)
        self.prog = []

    def emit(self, op, ins, p):
        y = run_op(op, [self.vals[i] for i in ins], p)
        self.prog.append((op, ins, [float(v) for v in p]))
        self.vals.append(y)
        return len(self.vals) - 1

    def positive(self, i, lo=0.1):
        """an index of a value with every element >= lo: i itself, or |v| + 0.5 of it"""
        if self.vals[i].numel() and float(self.vals[i].min()) >= lo:
            return i
        return self.emit("add_scalar", [self.emit("abs", [i], [])], [0.5])

    def tame(self, i):
        """values of moderate size (tanh of it when any |v| > 8)"""
        if self.vals[i].numel() and float(self.vals[i].abs().max()) > 8:
            return self.emit("tanh", [i], [])
        return i

    def pick(self):
        # the later values more often: chains, with some reuse of early ones
        n = len(self.vals)
        return max(self.rng.randrange(n), self.rng.randrange(n))

    def step(self):
        rng = self.rng
        i = self.pick()
        x = self.vals[i]
        nd = x.dim()
        kind = rng.random()
        if kind < 0.30:   # binary, with another value it broadcasts against
            op = rng.choice(["add", "sub", "mul", "div", "maximum", "minimum"])
            js = [j for j in range(len(self.vals)) if self._bcast(x.shape, self.vals[j].shape)]
            j = rng.choice(js)
            if op == "div":
                j = self.positive(j, 0.2)
                if rng.random() < 0.5:   # either sign
                    j = self.emit("neg", [j], [])
            if op in ("maximum", "minimum") and i == j:
                return
            return self.emit(op, [i, j], [])
        if kind < 0.50:   # unary
            op = rng.choice(["neg", "exp", "log", "sqrt", "abs", "erf", "relu", "sigmoid", "tanh", "gelu",
                             "silu", "leaky_relu", "clamp", "pow", "add_scalar", "mul_scalar", "rsub_scalar",
                             "div_scalar", "sub_scalar"])
            if op in ("log", "sqrt"):
                return self.emit(op, [self.positive(i)], [])
            if op == "exp":
                return self.emit(op, [self.tame(i)], [])
            if op == "abs":   # away from 0: abs of x + c with |x + c| >= 0.1
                xs = x.reshape(-1)
                if xs.numel() and float(xs.abs().min()) < 0.1:
                    return
                return self.emit(op, [i], [])
            if op == "leaky_relu":
                return self.emit(op, [i], [rng.choice([0.01, 0.1, 0.3])])
            if op == "clamp":
                lo, hi = sorted([round(rng.uniform(-1.5, 1.5), 2) for _ in range(2)])
                if hi - lo < 0.2 or (x.numel() and float(torch.min((x - lo).abs().min(), (x - hi).abs().min())) < 0.02):
                    return
                return self.emit(op, [i], [lo, hi])
            if op == "pow":
                e = rng.choice([2.0, 3.0, -1.0, 0.5, 1.5, -0.5])
                if e in (2.0, 3.0):
                    return self.emit(op, [self.tame(i)], [e])
                return self.emit(op, [self.positive(i, 0.2)], [e])
            if op == "div_scalar":
                return self.emit(op, [i], [rng.choice([2.0, -0.5, 3.0])])
            if op.endswith("_scalar"):
                return self.emit(op, [i], [round(rng.uniform(-2, 2), 2) or 1.0])
            return self.emit(op, [i], [])
        if kind < 0.65 and nd >= 1:   # reductions
            op = rng.choice(["sum", "mean", "max", "min", "var", "norm", "max_dim", "min_dim"])
            if op in ("max_dim", "min_dim"):
                d = rng.randrange(nd)
                if ties(x, d):
                    return
                return self.emit(op, [i], [d, rng.randrange(2)])
            dims = sorted(rng.sample(range(nd), rng.randint(1, nd)))
            keep = rng.randrange(2)
            corr = rng.randrange(2) if op == "var" else 1
            cnt = 1
            for d in dims:
                cnt *= x.shape[d]
            if op == "var" and cnt - corr < 1:
                return
            if op in ("max", "min"):   # ties along the reduced dims split the gradient: keep them out
                flat = x.permute([d for d in range(nd) if d not in dims] + dims).reshape(-1, cnt)
                if cnt > 1 and bool((torch.sort(flat, 1)[0].diff(dim=1) == 0).any()):
                    return
            if op == "norm":
                nrm = torch.linalg.vector_norm(x, 2, dim=dims)
                if nrm.numel() and float(nrm.min()) < 0.1:
                    return
            allf = 1 if len(dims) == nd and rng.random() < 0.3 else 0
            return self.emit(op, [i], [keep, corr, allf] + ([] if allf else dims))
        if kind < 0.72 and nd >= 1:   # softmax
            return self.emit(rng.choice(["softmax", "log_softmax"]), [self.tame(i)], [rng.randrange(nd)])
        if kind < 0.80 and 1 <= nd <= 3:   # matmul with a value of a matching inner size, or a new product
            js = [j for j in range(len(self.vals)) if self._mm(x.shape, self.vals[j].shape)]
            if not js:
                return
            return self.emit("matmul", [i, rng.choice(js)], [])
        # shape ops
        op = rng.choice(["reshape", "squeeze", "unsqueeze", "permute", "transpose", "narrow", "cat", "stack",
                         "expand", "sum_to", "flatten"])
        if op == "reshape" and x.numel() > 0:
            n = x.numel()
            divs = [d for d in range(1, n + 1) if n % d == 0]
            a = rng.choice(divs)
            shape = [a, n // a] if rng.random() < 0.7 else [n]
            return self.emit(op, [i], shape)
        if op == "squeeze" and nd >= 1:
            ones = [d for d in range(nd) if x.shape[d] == 1]
            if ones:
                return self.emit(op, [i], [rng.choice(ones)])
            return
        if op == "unsqueeze" and nd < 4:
            return self.emit(op, [i], [rng.randrange(nd + 1)])
        if op == "permute" and nd >= 2:
            perm = list(range(nd))
            rng.shuffle(perm)
            return self.emit(op, [i], perm)
        if op == "transpose" and nd >= 2:
            a, b = rng.sample(range(nd), 2)
            return self.emit(op, [i], [a, b])
        if op == "narrow" and nd >= 1:
            d = rng.randrange(nd)
            if x.shape[d] < 2:
                return
            ln = rng.randint(1, x.shape[d] - 1)
            return self.emit(op, [i], [d, rng.randint(0, x.shape[d] - ln), ln])
        if op in ("cat", "stack") and nd >= 1:
            same = [j for j in range(len(self.vals)) if self.vals[j].shape == x.shape]
            ins = [i] + [rng.choice(same) for _ in range(rng.randint(1, 3))]
            if op == "cat":
                d = rng.randrange(nd)
                others = [j for j in range(len(self.vals)) if self.vals[j].dim() == nd and all(
                    self.vals[j].shape[k] == x.shape[k] for k in range(nd) if k != d)]
                ins = [i] + [rng.choice(others) for _ in range(rng.randint(1, 3))]
                return self.emit(op, ins, [d])
            return self.emit(op, ins, [rng.randrange(nd + 1)])
        if op == "expand" and nd >= 1 and any(s == 1 for s in x.shape):
            shape = [s if s != 1 else rng.randint(1, 3) for s in x.shape]
            if rng.random() < 0.3 and nd < 3:
                shape = [2] + shape
            return self.emit(op, [i], shape)
        if op == "sum_to" and nd >= 1:
            shape = [1 if rng.random() < 0.5 else s for s in x.shape]
            if rng.random() < 0.4 and nd >= 2:
                shape = shape[1:]
            return self.emit(op, [i], shape)
        if op == "flatten" and nd >= 2:
            a = rng.randrange(nd - 1)
            return self.emit(op, [i], [a, rng.randint(a + 1, nd - 1)])

    @staticmethod
    def _bcast(a, b):
        try:
            torch.broadcast_shapes(a, b)
            return True
        except RuntimeError:
            return False

    @staticmethod
    def _mm(a, b):
        if len(a) == 0 or len(b) == 0:
            return False
        if len(b) == 1:
            return a[-1] == b[0]
        if a[-1] != b[-2]:
            return False
        try:
            torch.broadcast_shapes(a[:-2], b[:-2])
            return True
        except RuntimeError:
            return False


def three(v, fill=0):
    return list(v) + [fill] * (3 - len(v))


class ConvGen(Gen):
    """a convolution net's program: x (value 0) and the bank P (value 1)"""
    BANK = 400

    def weight(self, shape):
        n = 1
        for d in shape:
            n *= d
        off = self.rng.randrange(0, self.BANK - n + 1)
        return self.emit("reshape", [self.emit("narrow", [1], [0, off, n])], list(shape))

    def maps(self):
        """the feature maps (batched, 1-d or 2-d), the later ones more often"""
        ok = [j for j in range(len(self.vals)) if j != 1 and self.vals[j].dim() in (3, 4) and j != 1]
        return max(self.rng.choice(ok), self.rng.choice(ok))

    def step(self):
        rng = self.rng
        i = self.maps()
        x = self.vals[i]
        nsp, C = x.dim() - 2, x.shape[1]
        kind = rng.random()
        try:
            if kind < 0.35:   # convolution, transposed one time in four
                t = rng.random() < 0.25
                g = rng.choice([d for d in range(1, C + 1) if C % d == 0])
                co = g * rng.randint(1, 3)
                ks = [rng.randint(1, 3) for _ in range(nsp)]
                st = [rng.randint(1, 2) for _ in range(nsp)]
                dl = [rng.randint(1, 2) for _ in range(nsp)]
                pd = [rng.randint(0, k - 1) for k in ks]
                same = 1 if not t and all(v == 1 for v in st) and rng.random() < 0.3 else 0
                opd = [rng.randint(0, max(a, b) - 1) for a, b in zip(st, dl)] if t else [0] * nsp
                w = self.weight([C, co // g] + ks if t else [co, C // g] + ks)
                ins = [self.tame(i), w]
                if rng.random() < 0.7:
                    ins.append(self.weight([co]))
                op = ("conv_transpose%dd" if t else "conv%dd") % nsp
                return self.emit(op, ins, three(st) + three(pd) + three(dl) + three(opd) + [g, same])
            if kind < 0.55:   # pooling
                k = rng.random()
                if k < 0.2:
                    return self.emit("adaptive_avg_pool%dd" % nsp, [i],
                                     three([rng.randint(1, s) for s in x.shape[2:]]))
                mx = k < 0.6
                if mx and torch.unique(x).numel() != x.numel():   # ties: which one takes the gradient
                    return
                ks = [rng.randint(1, 3) for _ in range(nsp)]
                dl = [rng.randint(1, 2) if mx else 1 for _ in range(nsp)]
                pd = [rng.randint(0, ((k_ - 1) * d + 1) // 2) for k_, d in zip(ks, dl)]
                st = [rng.randint(0, 2) for _ in range(nsp)]
                ceil = rng.randrange(2)
                cip = rng.randrange(2)
                op = ("max_pool%dd" if mx else "avg_pool%dd") % nsp
                prm = three(ks) + three(st) + three(pd) + three(dl, 1) + [ceil, cip]
                y = run_op(op, [x], prm)
                for d in range(nsp):   # a window in the padding only: torch 2.15's max pooling
                    L, s_ = x.shape[2 + d], st[d] or ks[d]   # gives -inf and an index past the input
                    if any(not any(0 <= j * s_ - pd[d] + t * dl[d] < L for t in range(ks[d]))
                           for j in range(y.shape[2 + d])):   # (its backward writes there)
                        return
                return self.emit(op, [i], prm)
            if kind < 0.70:   # activation
                op = rng.choice(["relu", "tanh", "sigmoid", "gelu", "silu"])
                return self.emit(op, [i], [])
            if kind < 0.80 and nsp == 2:   # a transposed view into what follows
                return self.emit("transpose", [i], [2, 3])
            if kind < 0.85:   # a narrow of the spatial dims
                d = rng.randrange(2, x.dim())
                if x.shape[d] < 3:
                    return
                ln = rng.randint(2, x.shape[d] - 1)
                return self.emit("narrow", [i], [d, rng.randint(0, x.shape[d] - ln), ln])
            same = [j for j in range(len(self.vals)) if j != 1 and self.vals[j].shape == x.shape and j != i]
            if kind < 0.93 and same:   # residual
                return self.emit("add", [i, rng.choice(same)], [])
            chan = [j for j in range(len(self.vals)) if j != 1 and self.vals[j].dim() == x.dim() and
                    self.vals[j].shape[0] == x.shape[0] and self.vals[j].shape[2:] == x.shape[2:]]
            return self.emit("cat", [i, rng.choice(chan)], [1])
        except RuntimeError:   # a size torch refuses (an output of size 0 ...): another step
            return

    def finish(self):
        i = len(self.vals) - 1
        if self.vals[i].dim() not in (3, 4):
            i = self.maps()
        if self.rng.random() < 0.5:
            return self.emit("sum", [i], [0, 1, 1])
        f = self.emit("flatten", [i], [1, -1])
        nf = self.vals[f].shape[1]
        if nf * 3 > self.BANK:
            return self.emit("mean", [f], [0, 1, 1])
        return self.emit("matmul", [f, self.weight([nf, 3])], [])


def results(prog, inputs, gout, vs, dd):
    """out, the inputs' gradients (zeros where none), whether each carries
    history, and the Hessian-vector products, as goldfile.record_grads
    computes them, in the inputs' dtype"""
    ts = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = run_prog(prog, ts)
    grads = torch.autograd.grad(out, ts, gout.to(out.dtype), create_graph=dd, allow_unused=True)
    greq = [g is not None and g.requires_grad for g in grads]
    hv = None
    if dd:
        s2 = None
        for g, v in zip(grads, vs):
            if g is None or not g.requires_grad:
                continue
            term = (g * v.to(g.dtype)).sum()
            s2 = term if s2 is None else s2 + term
        hv = [None] * len(ts) if s2 is None else torch.autograd.grad(s2, ts, allow_unused=True)
        hv = [h if h is not None else torch.zeros_like(t) for h, t in zip(hv, ts)]
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, ts)]
    return [out] + list(grads) + (hv or []), greq


def close(a, b):
    a = a.detach().double()
    b = b.detach().double()
    return bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()) and \
        bool(((a - b).abs() <= 1e-6 + 1e-5 * b.abs()).all())


def make(rng, k, dd, conv=False):
    if conv:
        nsp = rng.randint(1, 2)
        x = torch.randn([rng.randint(1, 3), rng.randint(1, 4)] + [rng.randint(4, 9) for _ in range(nsp)],
                        dtype=torch.float64)
        inputs = [x, torch.randn(ConvGen.BANK, dtype=torch.float64) * 0.5]
        g = ConvGen(rng, inputs)
        steps = rng.randint(3, 8)
    else:
        inputs = [torch.randn(rshape(rng), dtype=torch.float64) for _ in range(rng.randint(1, 3))]
        g = Gen(rng, inputs)
        steps = rng.randint(3, 10)
    tries = 0
    while len(g.prog) < steps and tries < 60:
        tries += 1
        try:
            g.step()
        except (RuntimeError, IndexError, ValueError) as e:   # a bug in the generator: stop loudly
            raise SystemExit("gen_fuzz: program %d: %s" % (k, e))
    if conv:
        g.finish()
    if not g.prog or g.vals[-1].numel() == 0:
        return None
    out64 = g.vals[-1]
    gout = torch.randn(out64.shape, dtype=torch.float64).float()
    vs = [torch.randn(t.shape, dtype=torch.float64).float() for t in inputs]
    in32 = [t.float() for t in inputs]
    r32, q32 = results(g.prog, in32, gout, vs, dd)
    r64, q64 = results(g.prog, [t.double() for t in in32], gout.double(), [v.double() for v in vs], dd)
    if q32 != q64 or not all(close(a, b) for a, b in zip(r32, r64)):
        return None
    return g.prog, in32, gout, vs


def programs(path, count, conv):
    goldfile.RECORDS.clear()
    rng = random.Random(1357 + conv)
    k = tried = 0
    while k < count:
        tried += 1
        dd = k % 3 == 2
        made = make(rng, k, dd, conv)
        if made is None:
            continue
        prog, in32, gout, vs = made
        name = "prog/%d" % k
        ts = [t.clone().requires_grad_(True) for t in in32]
        for j, t in enumerate(ts):
            goldfile.rec(name + "/x%d" % j, t)
        goldfile.rec(name + "/params", torch.tensor(encode(prog), dtype=torch.float32))
        goldfile.record_grads(name, run_prog(prog, ts), ts, ["x%d" % j for j in range(len(ts))], dd=dd,
                              gout=gout, v=vs if dd else None, greq=dd)
        k += 1
    print("gen_fuzz: %d programs kept of %d made (the rest ill-conditioned in float32)" % (count, tried))
    goldfile.write(path, goldfile.RECORDS)


def main():
    a = sys.argv[1:]
    random.seed(1357)
    torch.manual_seed(1357)
    programs(a[0] if len(a) > 0 else "tests/golden/fuzz.bin", int(a[1]) if len(a) > 1 else 240, False)
    programs(a[2] if len(a) > 2 else "tests/golden/fuzz_conv.bin", int(a[3]) if len(a) > 3 else 120, True)


if __name__ == "__main__":
    main()
