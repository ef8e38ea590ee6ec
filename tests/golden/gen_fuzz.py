#!/usr/bin/env python3
"""tests/golden/gen_fuzz.py - random programs of core ops against PyTorch.

Run from the repository root:
    python3 tests/golden/gen_fuzz.py [out.bin [n [conv.bin [n [nn.bin [n [net.bin [n [optim.bin [n]]]]]]]]]]
(default output: tests/golden/fuzz.bin, 240 programs, read by test_golden.c,
tests/golden/fuzz_conv.bin, 120, read by test_conv.c,
tests/golden/fuzz_nn.bin, 100, tests/golden/fuzz_net.bin, 100 nets of
modules, and tests/golden/fuzz_optim.bin, 150 optimizer runs, all three
read by test_nn_ops.c).
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
inputs are 0 .. n-1, instruction k's result is n + k, -1 an optional
argument left out), its param count and params in the form the op's own
golden cases use (gen.py, gen_conv.py, gen_nn_ops.py, gen_losses.py). The
program's result is the last instruction's (tests/golden.h: g_prog).

The convolution programs (fuzz_conv.bin, test_conv.c; 120 of them) start
from a batch x (N, C, spatial 1-d to 3-d) and a bank P of 400 values that
every weight and bias is a narrow + reshape of (so P's gradient adds up
the weights'): convolutions and transposed convolutions (stride, padding,
'same', dilation, groups, output_padding), max, average and adaptive
pooling, activations, residual adds, channel cat, and views that hand a
convolution a non-contiguous input (a transpose of the spatial dims, a
narrow), then a reduction or a Linear from P.

The nn programs (fuzz_nn.bin, test_nn_ops.c; 100) are small nets and a
loss: x (N, F) or (N, C, H, W), the bank P, class indices, batch norm's
running statistics and a class weight (no gradient: torch refuses one for
nll_loss's and the bce weights); Linear layers, batch norm in training
and eval mode (the running statistics after the call checked), layer
norm over the last dims, with or without weight and bias, the convolution
programs' steps, activations; then cross entropy (class weights, label
smoothing, ignore_index), nll, mse, l1, smooth_l1, huber (their kinks kept
away), bce, bce_logits (weight, pos_weight) or kl_div, in every reduction.
The nets of modules (fuzz_net.bin, test_nn_ops.c; 100) are Sequentials
of torch.nn's Linear, Conv2d (stride, padding, dilation, groups, bias or
not), BatchNorm1d/2d, the activations, MaxPool2d, AvgPool2d,
AdaptiveAvgPool2d, LayerNorm and Flatten, built to meet dl.h's fused
paths (convolution + activation [+ 2x2 average pool], batch norm + ReLU
[+ 2x2 max pool], Linear + activation), with their norms' affine
parameters and running statistics away from the defaults, in training or
eval mode: records spec ([train, layer count, then per layer: code
(L_CODES), param count, params]), x, s_<name> (the state_dict), gout,
out, grad_x and grad_<parameter>, after_<buffer>, and for a third
v_*, greq and hv_*.

The optimizer runs (fuzz_optim.bin; 150): torch.optim's SGD (momentum,
dampening, nesterov, weight decay, maximize), Adam and AdamW (betas, eps,
weight decay, amsgrad, maximize), foreach=False, hyper-parameters that
are float32 values, over 1-3 parameters and 2-8 steps of given gradients
(of sizes 1e-3 to 10), the learning rate changed between steps: records
hyper ([kind 0 SGD / 1 Adam / 2 AdamW, steps, lr, momentum, dampening,
weight_decay, nesterov, maximize, beta1, beta2, eps, amsgrad]), lrs (each
step's), p<i>, g<t>_<i> and after<t>_<i> (the parameters after step t).

Left out: an eval-mode batch norm before a training-mode one on the same
statistics (torch 2.15's eval backward reads them again after the update;
dl.h's uses the forward's, the true derivative).

FILE FORMAT and record names: as tests/golden/core.bin (see gen.py):
prog/<k>/x0 .. x2 (nn: x0, x1, target, rm, rv, cw), params, gout, [v_*],
out, grad_*, [greq, hv_*], [after_rm, after_rv].
"""
import os
import random
import sys
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldfile  # noqa: E402

warnings.filterwarnings("ignore", message="reduction: 'mean' divides")   # (kl_div's 'mean', as asked)

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
    if op in NN:
        return NN[op](xs, p, pi)
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


RED = ["mean", "sum", "none", "batchmean"]   # dl_reduction's order
# gen_nn_ops.py's and gen_losses.py's params; arguments by position (NULL: None)
NN = {
    "batch_norm": lambda xs, p, pi: F.batch_norm(xs[0], xs[1], xs[2], xs[3], xs[4], bool(pi[0]), p[1], p[2]),
    "layer_norm": lambda xs, p, pi: F.layer_norm(xs[0], pi[1:], xs[1], xs[2], p[0]),
    "cross_entropy": lambda xs, p, pi: F.cross_entropy(xs[0], xs[1].long(), xs[2], ignore_index=pi[1],
                                                       reduction=RED[pi[0]], label_smoothing=p[2]),
    "nll_loss": lambda xs, p, pi: F.nll_loss(xs[0], xs[1].long(), xs[2], ignore_index=pi[1], reduction=RED[pi[0]]),
    "mse_loss": lambda xs, p, pi: F.mse_loss(xs[0], xs[1], reduction=RED[pi[0]]),
    "l1_loss": lambda xs, p, pi: F.l1_loss(xs[0], xs[1], reduction=RED[pi[0]]),
    "smooth_l1_loss": lambda xs, p, pi: F.smooth_l1_loss(xs[0], xs[1], reduction=RED[pi[0]], beta=p[1] or 1.0),
    "huber_loss": lambda xs, p, pi: F.huber_loss(xs[0], xs[1], reduction=RED[pi[0]], delta=p[1] or 1.0),
    "bce_logits": lambda xs, p, pi: F.binary_cross_entropy_with_logits(xs[0], xs[1], xs[2], reduction=RED[pi[0]],
                                                                     pos_weight=xs[3]),
    "binary_cross_entropy": lambda xs, p, pi: F.binary_cross_entropy(xs[0], xs[1], xs[2], reduction=RED[pi[0]]),
    "kl_div": lambda xs, p, pi: F.kl_div(xs[0], xs[1], reduction=RED[pi[0]], log_target=bool(pi[1])),
}
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
MAXP = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVGP = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
ADAP = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


def run_prog(prog, inputs):
    vals = list(inputs)
    for op, ins, p in prog:
        vals.append(run_op(op, [vals[i] if i >= 0 else None for i in ins], p))
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
        y = run_op(op, [self.vals[i] if i >= 0 else None for i in ins], p)
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
        if n > self.BANK:
            raise RuntimeError("a weight larger than the bank")   # (the step is dropped)
        off = self.rng.randrange(0, self.BANK - n + 1)
        return self.emit("reshape", [self.emit("narrow", [1], [0, off, n])], list(shape))

    def maps(self):
        """the feature maps (batched, 1-d to 3-d), the later ones more often"""
        ok = [j for j in range(len(self.vals)) if j != 1 and self.vals[j].dim() in (3, 4, 5)]
        return max(self.rng.choice(ok), self.rng.choice(ok))

    def step(self):
        rng = self.rng
        i = self.maps()
        x = self.vals[i]
        if x.dim() not in (3, 4, 5):   # (NNGen's maps: a (N, F) value)
            return
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
            if kind < 0.80 and nsp >= 2:   # a transposed view into what follows
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
        if self.vals[i].dim() not in (3, 4, 5):
            i = self.maps()
        if self.rng.random() < 0.5:
            return self.emit("sum", [i], [0, 1, 1])
        f = self.emit("flatten", [i], [1, -1])
        nf = self.vals[f].shape[1]
        if nf * 3 > self.BANK:
            return self.emit("mean", [f], [0, 1, 1])
        return self.emit("matmul", [f, self.weight([nf, 3])], [])


class NNGen(ConvGen):
    """a small net and its loss: x (value 0), the bank P (1), class indices
    target (2), batch norm's running mean and variance rm, rv (3, 4), for
    dim 1 of x's size, a class weight cw (5; no gradient, as torch's
    nll_loss wants); every other weight a slice of P"""

    def __init__(self, rng, inputs, classes):
        super().__init__(rng, inputs)
        self.classes = classes
        self.bn = 0
        self.bn_eval = False
        self.inputs0 = inputs
        self.xd = [True] + [False] * (len(inputs) - 1)

    def maps(self):
        """the values computed from x with its batch (not from the weights alone)"""
        n = self.vals[0].shape[0]
        ok = [j for j in range(len(self.vals)) if self.fromx(j) and self.vals[j].dim() >= 2 and
              self.vals[j].shape[0] == n]
        return max(self.rng.choice(ok), self.rng.choice(ok))

    def fromx(self, j):
        while len(self.xd) < len(self.vals):
            k = len(self.xd) - len(self.inputs0)
            self.xd.append(any(i >= 0 and self.xd[i] for i in self.prog[k][1]))
        return self.xd[j]

    def linear(self, i, nout):
        f = self.vals[i].shape[-1]
        y = self.emit("matmul", [i, self.weight([f, nout])], [])
        return self.emit("add", [y, self.weight([nout])], []) if self.rng.random() < 0.7 else y

    def step(self):
        rng = self.rng
        i = self.maps()
        x = self.vals[i]
        kind = rng.random()
        try:
            if kind < 0.25 and x.shape[1] == self.vals[3].shape[0] and self.bn < 2:   # batch norm
                self.bn += 1
                c = x.shape[1]
                w = self.weight([c]) if rng.random() < 0.8 else -1
                b = self.weight([c]) if rng.random() < 0.8 else -1
                train = 1 if rng.random() < 0.7 and not self.bn_eval else 0
                self.bn_eval = self.bn_eval or not train   # (then no update: torch's eval backward would
                #                                             read the updated statistics, dl.h's not)
                return self.emit("batch_norm", [self.tame(i), 3, 4, w, b], [train, rng.choice([0.1, 0.3]),
                                                                           rng.choice([1e-5, 1e-3])])
            if kind < 0.40:   # layer norm over the last 1 or 2 dims
                nd = rng.randint(1, min(2, x.dim() - 1))
                shape = list(x.shape[x.dim() - nd:])
                w = self.weight(shape) if rng.random() < 0.7 else -1
                b = self.weight(shape) if rng.random() < 0.7 else -1
                return self.emit("layer_norm", [self.tame(i), w, b], [rng.choice([1e-5, 1e-3])] + shape)
            if kind < 0.55:   # Linear on the last dim
                if x.shape[-1] * 6 > self.BANK // 2:
                    return
                return self.linear(self.tame(i), rng.randint(2, 6))
            if kind < 0.70:
                return self.emit(rng.choice(["relu", "tanh", "sigmoid", "gelu", "silu"]), [i], [])
            if x.dim() in (3, 4):   # a convolution net's step
                return ConvGen.step(self)
        except RuntimeError:   # a size torch refuses (1 value per channel ...): another step
            return

    def finish(self):
        rng = self.rng
        i = self.maps()
        if self.vals[i].dim() > 2:
            i = self.emit("flatten", [i], [1, -1])
        if self.vals[i].shape[1] * self.classes * 2 > self.BANK:
            i = self.linear(self.emit("tanh", [self.emit("narrow", [i], [1, 0, 8])], []), 8) \
                if self.vals[i].shape[1] > 8 else i
        z = self.linear(self.tame(i), self.classes)   # logits (N, classes)
        loss = rng.choice(["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                           "bce_logits", "binary_cross_entropy", "kl_div"])
        red = rng.randrange(4 if loss == "kl_div" else 3)
        if loss in ("cross_entropy", "nll_loss"):   # (a class weight cannot require grad in torch: cw)
            w = 5 if rng.random() < 0.4 else -1
            ign = rng.choice([-100, -100, rng.randrange(self.classes)])
            ls = rng.choice([0.0, 0.0, 0.1, 0.25]) if loss == "cross_entropy" else 0.0
            if loss == "nll_loss":
                z = self.emit("log_softmax", [z], [1])
            return self.emit(loss, [z, 2, w], [red, ign, ls])
        flat = [j for j in range(len(self.vals)) if self.fromx(j) and self.vals[j].dim() == 2 and
                self.vals[j].shape[0] == self.vals[z].shape[0] and self.vals[j].shape[1] * self.classes * 2 <= self.BANK]
        other = self.linear(self.tame(rng.choice(flat) if flat and rng.random() < 0.5 else i), self.classes)
        if loss in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"):
            prm = [red] + ([rng.choice([0.0, 0.5, 2.0])] if loss in ("smooth_l1_loss", "huber_loss") else [])
            d = (self.vals[z] - self.vals[other]).abs()
            kink = prm[1] or 1.0 if len(prm) > 1 else 0.0
            if float((d - kink).abs().min()) < 0.02:   # at the kink: which side is a choice
                return None
            return self.emit(loss, [z, other], prm)
        if loss == "bce_logits":
            w = 5 if rng.random() < 0.4 else -1   # (weight and pos_weight: no gradient in torch either)
            pw = 5 if rng.random() < 0.4 else -1
            return self.emit(loss, [z, self.emit("sigmoid", [other], []), w, pw], [red])
        if loss == "binary_cross_entropy":
            w = 5 if rng.random() < 0.4 else -1
            return self.emit(loss, [self.emit("sigmoid", [z], []), self.emit("sigmoid", [other], []), w], [red])
        lt = rng.randrange(2)
        y = self.emit("log_softmax" if lt else "softmax", [other], [1])
        return self.emit(loss, [self.emit("log_softmax", [z], [1]), y], [red, lt])


def results(prog, inputs, gout, vs, dd, req=None):
    """out, the inputs' gradients (zeros where none), whether each carries
    history, and the Hessian-vector products, as goldfile.record_grads
    computes them, in the inputs' dtype"""
    ts = [t.detach().clone() for t in inputs]
    req = req or [True] * len(ts)
    out = run_prog(prog, [t.requires_grad_(True) if r else t for t, r in zip(ts, req)])
    ts = [t for t, r in zip(ts, req) if r]
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
    names = None
    req = None
    if conv == 2:
        classes = rng.randint(2, 5)
        n = rng.randint(2, 5)
        shape = [n, rng.randint(2, 6)] if rng.random() < 0.5 else [n, rng.randint(1, 3), rng.randint(3, 6),
                                                                  rng.randint(3, 6)]
        c = shape[1]
        inputs = [torch.randn(shape, dtype=torch.float64), torch.randn(ConvGen.BANK, dtype=torch.float64) * 0.5,
                  torch.tensor([float(rng.randrange(classes)) for _ in range(n)], dtype=torch.float64),
                  torch.randn(c, dtype=torch.float64) * 0.3, torch.rand(c, dtype=torch.float64) + 0.5,
                  torch.rand(classes, dtype=torch.float64) + 0.3]
        names = ["x0", "x1", "target", "rm", "rv", "cw"]
        req = [True, True, False, False, False, False]
        g = NNGen(rng, inputs, classes)
        steps = rng.randint(2, 6)
    elif conv:
        nsp = rng.choice([1, 2, 2, 3])
        x = torch.randn([rng.randint(1, 3), rng.randint(1, 4)] +
                        [rng.randint(3, 5) if nsp == 3 else rng.randint(4, 9) for _ in range(nsp)], dtype=torch.float64)
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
    if conv and g.finish() is None:
        return None
    if not g.prog or g.vals[-1].numel() == 0:
        return None
    out64 = g.vals[-1]
    names = names or ["x%d" % j for j in range(len(inputs))]
    req = req or [True] * len(inputs)
    gout = torch.randn(out64.shape, dtype=torch.float64).float()
    vs = [torch.randn(t.shape, dtype=torch.float64).float() for t, r in zip(inputs, req) if r]
    in32 = [t.float() for t in inputs]
    try:
        r32, q32 = results(g.prog, in32, gout, vs, dd, req)
        r64, q64 = results(g.prog, [t.double() for t in in32], gout.double(), [v.double() for v in vs], dd, req)
    except RuntimeError:   # torch itself fails (2.15: a double backward through layer norms without
        return None        # a weight, "Expected a proper Tensor but got None"): another program
    if q32 != q64 or not all(close(a, b) for a, b in zip(r32, r64)):
        return None
    return g.prog, in32, names, req, gout, vs


# ------------------------------------------------------------ nets of modules
# spec: [train, layer count, then per layer: code, param count, params]
L_CODES = {"linear": 0, "conv2d": 1, "bn2d": 2, "bn1d": 3, "relu": 4, "sigmoid": 5, "tanh": 6, "gelu": 7, "silu": 8,
           "leaky_relu": 9, "flatten": 10, "max_pool2d": 11, "avg_pool2d": 12, "adaptive2d": 13, "layer_norm": 14}


def torch_layer(kind, p):
    p = [int(v) if float(v).is_integer() else v for v in p]
    if kind == "linear":
        return torch.nn.Linear(p[0], p[1], bias=bool(p[2]))
    if kind == "conv2d":
        return torch.nn.Conv2d(p[0], p[1], p[2], stride=p[3], padding=p[4], dilation=p[5], groups=p[6],
                               bias=bool(p[7]))
    if kind in ("bn2d", "bn1d"):
        return (torch.nn.BatchNorm2d if kind == "bn2d" else torch.nn.BatchNorm1d)(p[0])
    if kind == "leaky_relu":
        return torch.nn.LeakyReLU(p[0])
    if kind == "max_pool2d":
        return torch.nn.MaxPool2d(p[0], p[1], p[2])
    if kind == "avg_pool2d":
        return torch.nn.AvgPool2d(p[0], p[1], p[2], ceil_mode=bool(p[3]), count_include_pad=bool(p[4]))
    if kind == "adaptive2d":
        return torch.nn.AdaptiveAvgPool2d((p[0], p[1]))
    if kind == "layer_norm":
        return torch.nn.LayerNorm(p[1:])
    return {"relu": torch.nn.ReLU, "sigmoid": torch.nn.Sigmoid, "tanh": torch.nn.Tanh, "gelu": torch.nn.GELU,
            "silu": torch.nn.SiLU, "flatten": torch.nn.Flatten}[kind]()


def make_net(rng):
    """a Sequential that takes the fused paths (conv + activation [+ 2x2
    average pool], batch norm + ReLU [+ 2x2 max pool], Linear +
    activation) and others; returns (layers, x) or None"""
    n = rng.randint(2, 4)
    x = torch.randn(n, rng.randint(1, 3), rng.choice([4, 6, 8, 10, 5, 7]), rng.choice([4, 6, 8, 10, 5, 7]),
                    dtype=torch.float64)
    layers = []
    seq = torch.nn.Sequential().double()
    y = x

    def add(kind, p):
        nonlocal y
        m = torch_layer(kind, p).double()
        y2 = m(y)   # (raises on a size torch refuses)
        layers.append((kind, [float(v) for v in p]))
        seq.append(m)
        y = y2

    acts = ["relu", "sigmoid", "tanh", "gelu", "silu", "leaky_relu"]

    def act():
        a = rng.choice(acts)
        add(a, [rng.choice([0.01, 0.2])] if a == "leaky_relu" else [])

    try:
        for _ in range(rng.randint(2, 5)):
            if y.dim() == 4:
                c, h, w = y.shape[1], y.shape[2], y.shape[3]
                k = rng.random()
                if k < 0.35:   # conv [+ act [+ 2x2 average pool]]
                    g = rng.choice([d for d in range(1, c + 1) if c % d == 0])
                    ks = rng.randint(1, 3)
                    add("conv2d", [c, g * rng.randint(1, 3), ks, rng.choice([1, 1, 2]), rng.randint(0, ks // 2 + 1),
                                   rng.choice([1, 1, 2]), g, rng.randrange(2)])
                    if rng.random() < 0.7:
                        act()
                        if rng.random() < 0.4 and y.shape[2] % 2 == 0 and y.shape[3] % 2 == 0:
                            add("avg_pool2d", [2, 2, 0, 0, 1])
                elif k < 0.65:   # batch norm [+ ReLU [+ 2x2 max pool]]
                    add("bn2d", [c])
                    if rng.random() < 0.7:
                        add("relu", [])
                        if rng.random() < 0.5 and h >= 2 and w >= 2:
                            add("max_pool2d", [2, 2, 0])
                elif k < 0.75:
                    kk = rng.randint(1, 3)
                    if rng.random() < 0.5:
                        add("max_pool2d", [kk, rng.randint(1, 2), rng.randint(0, kk // 2)])
                    else:
                        add("avg_pool2d", [kk, rng.randint(1, 2), rng.randint(0, kk // 2), rng.randrange(2),
                                           rng.randrange(2)])
                elif k < 0.82:
                    add("adaptive2d", [rng.randint(1, h), rng.randint(1, w)])
                elif k < 0.90:
                    add("layer_norm", [2, h, w] if rng.random() < 0.5 else [1, w])
                else:
                    act()
            else:
                f = y.shape[1]
                k = rng.random()
                if k < 0.5:
                    add("linear", [f, rng.randint(2, 8), rng.randrange(2) if rng.random() < 0.3 else 1])
                    if rng.random() < 0.7:
                        act()
                elif k < 0.7:
                    add("bn1d", [f])
                    if rng.random() < 0.5:
                        add("relu", [])
                elif k < 0.85:
                    add("layer_norm", [1, f])
                else:
                    act()
            if y.dim() == 4 and rng.random() < 0.15:
                add("flatten", [])
        if y.dim() == 4:
            add("flatten", [])
        if y.shape[1] > 400:
            return None
        add("linear", [y.shape[1], rng.randint(2, 5), 1])
    except RuntimeError:   # a size torch refuses, one value per channel ...
        return None
    return layers, x


def net_results(layers, state, x, train, gout, vs, dd):
    """out, the gradients of x and every parameter, their history, the
    Hessian-vector products and the buffers after, in x's dtype"""
    seq = torch.nn.Sequential(*[torch_layer(k, p) for k, p in layers]).to(x.dtype)
    seq.load_state_dict({k: v.to(x.dtype) if v.is_floating_point() else v for k, v in state.items()})
    seq.train(train)
    xs = x.detach().clone().requires_grad_(True)
    ps = [q for _, q in seq.named_parameters()]
    out = seq(xs)
    req = [xs] + ps
    grads = torch.autograd.grad(out, req, gout.to(out.dtype), create_graph=dd, allow_unused=True)
    greq = [g is not None and g.requires_grad for g in grads]
    hv = []
    if dd:
        s2 = None
        for g, v in zip(grads, vs):
            if g is not None and g.requires_grad:
                t = (g * v.to(g.dtype)).sum()
                s2 = t if s2 is None else s2 + t
        hv = [None] * len(req) if s2 is None else torch.autograd.grad(s2, req, allow_unused=True)
        hv = [h if h is not None else torch.zeros_like(t) for h, t in zip(hv, req)]
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, req)]
    bufs = [b.detach().clone() for _, b in seq.named_buffers()]
    return [out] + grads + hv + [b.double() for b in bufs], greq, seq


def fresh(seed):
    """an empty record list; torch's generator and a random.Random seeded"""
    goldfile.RECORDS.clear()
    torch.manual_seed(seed)
    return random.Random(seed)


def nets(path, count):
    rng = fresh(2468)
    k = tried = 0
    while k < count:
        tried += 1
        made = make_net(rng)
        if made is None:
            continue
        layers, x = made
        train = rng.random() < 0.7
        dd = k % 3 == 2
        seq = torch.nn.Sequential(*[torch_layer(kk, p) for kk, p in layers])
        with torch.no_grad():   # affine norms and running statistics away from their defaults
            for name, t in seq.named_parameters():
                if name.endswith("weight") and t.dim() == 1:
                    t.uniform_(0.5, 1.5)
                elif name.endswith("bias") and t.dim() == 1:
                    t.normal_(0, 0.5)
            for name, t in seq.named_buffers():
                if name.endswith("running_mean"):
                    t.normal_(0, 0.3)
                elif name.endswith("running_var"):
                    t.uniform_(0.5, 1.5)
        state = {kk: v.detach().clone() for kk, v in seq.state_dict().items()}
        x32 = x.float()
        outshape = torch.nn.Sequential(*[torch_layer(kk, p) for kk, p in layers]).double()(x).shape
        gout = torch.randn(outshape, dtype=torch.float64).float()
        vs = [torch.randn(x.shape, dtype=torch.float64).float()] + \
            [torch.randn(t.shape, dtype=torch.float64).float() for _, t in seq.named_parameters()]
        try:
            r32, q32, seq32 = net_results(layers, state, x32, train, gout, vs, dd)
            r64, q64, _ = net_results(layers, state, x32.double(), train, gout.double(), [v.double() for v in vs], dd)
        except RuntimeError:
            continue
        if q32 != q64 or not all(close(a, b) for a, b in zip(r32, r64)):
            continue
        name = "net/%d" % k
        spec = [1.0 if train else 0.0, float(len(layers))]
        for kk, p in layers:
            spec += [float(L_CODES[kk]), float(len(p))] + p
        goldfile.rec(name + "/spec", torch.tensor(spec))
        goldfile.rec(name + "/x", x32)
        for kk, v in state.items():
            goldfile.rec(name + "/s_" + kk, v.float())
        goldfile.rec(name + "/gout", gout)
        pnames = ["x"] + [kk for kk, _ in seq32.named_parameters()]
        if dd:
            for f, v in zip(pnames, vs):
                goldfile.rec(name + "/v_" + f, v)
        goldfile.rec(name + "/out", r32[0])
        for f, g in zip(pnames, r32[1:1 + len(pnames)]):
            goldfile.rec(name + "/grad_" + f, g)
        if dd:
            goldfile.rec(name + "/greq", torch.tensor([1.0 if q else 0.0 for q in q32]))
            for f, h in zip(pnames, r32[1 + len(pnames):1 + 2 * len(pnames)]):
                goldfile.rec(name + "/hv_" + f, h)
        for (bn, _), b in zip(seq32.named_buffers(), r32[len(r32) - len(list(seq32.named_buffers())):]):
            goldfile.rec(name + "/after_" + bn, b.float())
        k += 1
    print("gen_fuzz: %d nets kept of %d made (the rest ill-conditioned in float32)" % (count, tried))
    goldfile.write(path, goldfile.RECORDS)


# ------------------------------------------------------------ optimizers
# hyper: [kind (0 SGD, 1 Adam, 2 AdamW), steps, lr, momentum, dampening, weight_decay,
#         nesterov, maximize, beta1, beta2, eps, amsgrad]
def make_optim(rng):
    kind = rng.randrange(3)
    f = lambda v: float(torch.tensor(v, dtype=torch.float32))   # (the scalars dl.h stores)
    lr = f(rng.choice([1e-3, 0.01, 0.1, 0.5]))
    h = dict(lr=lr)
    if kind == 0:
        mom = f(rng.choice([0.0, 0.5, 0.9]))
        nest = mom > 0 and rng.random() < 0.4
        damp = 0.0 if nest else f(rng.choice([0.0, 0.0, 0.1, 0.5]))
        wd = f(rng.choice([0.0, 0.0, 1e-4, 0.01, 0.1]))
        h.update(momentum=mom, dampening=damp, weight_decay=wd, nesterov=nest, maximize=rng.random() < 0.25)
        hyper = [0, 0, lr, mom, damp, wd, float(nest), float(h["maximize"]), 0, 0, 0, 0]
    else:
        b1, b2 = f(rng.choice([0.9, 0.8, 0.5])), f(rng.choice([0.999, 0.99, 0.9]))
        eps = f(rng.choice([1e-8, 1e-6, 1e-3]))
        wd = f(rng.choice([0.0, 0.0, 1e-4, 0.01, 0.1]))
        h.update(betas=(b1, b2), eps=eps, weight_decay=wd, amsgrad=rng.random() < 0.4,
                 maximize=rng.random() < 0.25)
        hyper = [kind, 0, lr, 0, 0, wd, 0, float(h["maximize"]), b1, b2, eps, float(h["amsgrad"])]
    steps = rng.randint(2, 8)
    hyper[1] = float(steps)
    shapes = [[rng.randint(1, 5) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
    p0 = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) * rng.choice([1e-3, 1.0, 10.0]) for s in shapes] for _ in range(steps)]
    lrs = [f(lr * rng.choice([1.0, 1.0, 0.5, 0.1, 2.0])) if t else lr for t in range(steps)]   # a schedule
    return kind, h, hyper, p0, grads, lrs


def run_optim(kind, h, p0, grads, lrs, dtype):
    ps = [p.clone().to(dtype).requires_grad_(True) for p in p0]
    opt = [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW][kind](ps, foreach=False, **h)
    after = []
    for g, lr in zip(grads, lrs):
        opt.param_groups[0]["lr"] = lr
        for p, gi in zip(ps, g):
            p.grad = gi.clone().to(dtype)
        opt.step()
        after.append([p.detach().clone() for p in ps])
    return after


def optims(path, count):
    rng = fresh(3579)
    k = tried = 0
    while k < count:
        tried += 1
        kind, h, hyper, p0, grads, lrs = make_optim(rng)
        a32 = run_optim(kind, h, p0, grads, lrs, torch.float32)
        a64 = run_optim(kind, h, p0, grads, lrs, torch.float64)
        if not all(close(x, y) for s32, s64 in zip(a32, a64) for x, y in zip(s32, s64)):
            continue
        name = "opt/%d" % k
        goldfile.rec(name + "/hyper", torch.tensor(hyper))
        goldfile.rec(name + "/lrs", torch.tensor(lrs))
        for i, p in enumerate(p0):
            goldfile.rec(name + "/p%d" % i, p)
        for t in range(len(grads)):
            for i in range(len(p0)):
                goldfile.rec(name + "/g%d_%d" % (t, i), grads[t][i])
                goldfile.rec(name + "/after%d_%d" % (t, i), a32[t][i])
        k += 1
    print("gen_fuzz: %d optimizer runs kept of %d made (the rest ill-conditioned in float32)" % (count, tried))
    goldfile.write(path, goldfile.RECORDS)


def programs(path, count, conv):
    goldfile.RECORDS.clear()
    rng = random.Random(1357 + int(conv))
    k = tried = 0
    while k < count:
        tried += 1
        dd = k % 3 == 2
        made = make(rng, k, dd, conv)
        if made is None:
            continue
        prog, in32, names, req, gout, vs = made
        name = "prog/%d" % k
        ts = [t.clone().requires_grad_(True) if r else t.clone() for t, r in zip(in32, req)]
        for f, t in zip(names, ts):
            goldfile.rec(name + "/" + f, t)
        goldfile.rec(name + "/params", torch.tensor(encode(prog), dtype=torch.float32))
        out = run_prog(prog, ts)   # (batch norm's running statistics move: after_rm, after_rv)
        goldfile.record_grads(name, out, [t for t, r in zip(ts, req) if r], [f for f, r in zip(names, req) if r],
                              dd=dd, gout=gout, v=vs if dd else None, greq=dd)
        for f, t, r in zip(names, ts, req):
            if f in ("rm", "rv") and any(op == "batch_norm" and pr[0] for op, _, pr in prog):
                goldfile.rec(name + "/after_" + f, t)
        k += 1
    print("gen_fuzz: %d programs kept of %d made (the rest ill-conditioned in float32)" % (count, tried))
    goldfile.write(path, goldfile.RECORDS)


def main():
    a = sys.argv[1:]
    random.seed(1357)
    torch.manual_seed(1357)
    programs(a[0] if len(a) > 0 else "tests/golden/fuzz.bin", int(a[1]) if len(a) > 1 else 240, False)
    programs(a[2] if len(a) > 2 else "tests/golden/fuzz_conv.bin", int(a[3]) if len(a) > 3 else 120, True)
    programs(a[4] if len(a) > 4 else "tests/golden/fuzz_nn.bin", int(a[5]) if len(a) > 5 else 100, 2)
    nets(a[6] if len(a) > 6 else "tests/golden/fuzz_net.bin", int(a[7]) if len(a) > 7 else 100)
    optims(a[8] if len(a) > 8 else "tests/golden/fuzz_optim.bin", int(a[9]) if len(a) > 9 else 150)


if __name__ == "__main__":
    main()
