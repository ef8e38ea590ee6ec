#!/usr/bin/env python3
"""tests/golden/gen.py - PyTorch golden values for dl.h's core ops.

Run from the repository root:   python3 tests/golden/gen.py [out.bin]
(default output: tests/golden/core.bin). Works with torch 1.13 and newer.
Deterministic: torch.manual_seed(1234), CPU, float32 (double where noted).

FILE FORMAT (all integers little-endian)
    8 bytes   magic "DLGOLD1\\0"
    uint32    version = 1
    uint32    record count
    records, each:
        uint32  name length, then the name bytes (no NUL)
        uint32  ndim, then ndim x int64 shape
        numel x float32 values (numel = product of shape; 1 for ndim 0)

RECORD NAMES are "<op>/<case>/<field>". The records of one case are
consecutive, in this order:
    inputs        any field name not listed below (a, b, x, x0, W1, ...),
                  in argument order
    params        op parameters as floats (meaning per op, see test_golden.c)
    gout          upstream gradient (shape of out)
    v_<input>     direction for a Hessian-vector product (double backward)
    out           the forward result (argmax: int64 indices stored as floats)
    grad_<input>  torch.autograd.grad(out, inputs, gout); an input without a
                  grad_ record does not require grad
    hv_<input>    torch.autograd.grad(sum_i (grad_i * v_i).sum(), inputs),
                  the first grads taken with create_graph=True; zeros where
                  torch reports the input unused
"""
import struct
import goldfile
from goldfile import RECORDS, rec, randn, record_grads
import sys

import torch

torch.manual_seed(1234)
torch.set_grad_enabled(True)







def rand(*s):
    return torch.rand(tuple(s), dtype=torch.float32)


def positive(*s, lo=0.3):
    return rand(*s) * 2.0 + lo


def away_from(x, points, eps=0.1):
    """move values within eps of any point to point +- 2*eps"""
    x = x.clone()
    for p in points:
        d = x - p
        near = d.abs() < eps
        sgn = torch.where(d >= 0, torch.ones_like(d), -torch.ones_like(d))
        x = torch.where(near, p + sgn * 2 * eps, x)
    return x


def nonzero(*s):
    """|x| >= 0.25, both signs"""
    x = randn(*s)
    sgn = torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))
    return sgn * (x.abs() + 0.25)


def case(name, inputs, fn, params=None, grad=None, dd=False, gout=None, v=None):
    """inputs: list of (field, tensor). grad: fields that require grad
    (default: all). dd: also record a Hessian-vector product."""
    if grad is None:
        grad = [f for f, _ in inputs]
    ts = []
    for f, t in inputs:
        t = t.detach().clone().to(torch.float32)
        if f in grad:
            t.requires_grad_(True)
        ts.append(t)
    req = [t for (f, _), t in zip(inputs, ts) if f in grad]
    reqf = [f for f, _ in inputs if f in grad]
    out = fn(*ts)
    for (f, _), t in zip(inputs, ts):
        rec(name + "/" + f, t)
    if params is not None:
        rec(name + "/params", torch.tensor(params, dtype=torch.float32))
    record_grads(name, out, req, reqf, dd, gout, v)


# ------------------------------------------------------------ elementwise binary
BIN = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum,
}
BIN_SHAPES = [
    ("same", (3, 4), (3, 4)),
    ("bcast1", (2, 3, 4), (4,)),          # trailing
    ("bcast2", (2, 1, 4), (3, 1)),        # both sides broadcast
    ("bcast3", (1, 3), (2, 1, 1)),        # b has more dims
    ("size1", (3, 1), (1, 1)),            # size-1 everywhere
    ("rank0", (2, 3), ()),                # 0-d operand
]
for op, fn in BIN.items():
    for cname, sa, sb in BIN_SHAPES:
        a = randn(*sa)
        b = nonzero(*sb) if op == "div" else randn(*sb)
        case("%s/%s" % (op, cname), [("a", a), ("b", b)], fn)

# ------------------------------------------------------------ scalar ops
SCALAR = [
    ("add_scalar", 2.5, lambda x, s: x + s),
    ("add_scalar", -0.75, lambda x, s: x + s),
    ("sub_scalar", 1.5, lambda x, s: x - s),
    ("mul_scalar", -3.0, lambda x, s: x * s),
    ("mul_scalar", 0.25, lambda x, s: x * s),
    ("div_scalar", 4.0, lambda x, s: x / s),
    ("div_scalar", -0.5, lambda x, s: x / s),
    ("rsub_scalar", 2.0, lambda x, s: s - x),
]
for i, (op, s, fn) in enumerate(SCALAR):
    case("%s/c%d" % (op, i), [("x", randn(2, 3))], (lambda fn, s: lambda x: fn(x, s))(fn, s),
         params=[s])

# pow: 2 and 3 on any sign, 0.5 and -1.5 on positive input
case("pow/p2", [("x", randn(3, 4))], lambda x: torch.pow(x, 2.0), params=[2.0])
case("pow/p3", [("x", randn(2, 5))], lambda x: torch.pow(x, 3.0), params=[3.0])
case("pow/p05", [("x", positive(3, 4))], lambda x: torch.pow(x, 0.5), params=[0.5])
case("pow/pm15", [("x", positive(3, 4))], lambda x: torch.pow(x, -1.5), params=[-1.5])
case("pow/p1", [("x", randn(4))], lambda x: torch.pow(x, 1.0), params=[1.0])

# ------------------------------------------------------------ elementwise unary
case("neg/a", [("x", randn(3, 4))], torch.neg)
case("neg/b", [("x", randn(2, 1, 3))], torch.neg)
case("exp/a", [("x", randn(3, 4))], torch.exp)
case("exp/b", [("x", randn(5) * 3)], torch.exp)
case("log/a", [("x", positive(3, 4))], torch.log)
case("log/b", [("x", positive(2, 1, 5, lo=0.05) * 10)], torch.log)
case("sqrt/a", [("x", positive(3, 4))], torch.sqrt)
case("sqrt/b", [("x", positive(6, lo=1.0) * 5)], torch.sqrt)
case("abs/a", [("x", nonzero(3, 4))], torch.abs)
case("abs/b", [("x", nonzero(2, 1, 3))], torch.abs)
case("erf/a", [("x", randn(3, 4))], torch.erf)
case("erf/b", [("x", randn(7) * 2.5)], torch.erf)
case("clamp/a", [("x", away_from(randn(4, 5) * 1.5, [-0.5, 0.7]))],
     lambda x: torch.clamp(x, -0.5, 0.7), params=[-0.5, 0.7])
case("clamp/b", [("x", away_from(randn(3, 6) * 3, [0.0, 2.0]))],
     lambda x: torch.clamp(x, 0.0, 2.0), params=[0.0, 2.0])
case("relu/a", [("x", nonzero(3, 4))], torch.relu)
case("relu/b", [("x", nonzero(2, 3, 1))], torch.relu)
case("leaky_relu/a", [("x", nonzero(3, 4))],
     lambda x: torch.nn.functional.leaky_relu(x, 0.01), params=[0.01])
case("leaky_relu/b", [("x", nonzero(5, 2))],
     lambda x: torch.nn.functional.leaky_relu(x, 0.2), params=[0.2])
case("sigmoid/a", [("x", randn(3, 4))], torch.sigmoid)
case("sigmoid/b", [("x", randn(2, 6) * 4)], torch.sigmoid)
case("tanh/a", [("x", randn(3, 4))], torch.tanh)
case("tanh/b", [("x", randn(2, 6) * 3)], torch.tanh)
case("gelu/a", [("x", randn(3, 4))], torch.nn.functional.gelu)
case("gelu/b", [("x", randn(2, 6) * 3)], torch.nn.functional.gelu)

# ------------------------------------------------------------ reductions
# params: [keepdim, correction, all_flag, dims...]; all_flag -> DL_ALL in C


def reduction(op, x, dims, keepdim, correction=1):
    allf = dims is None
    nd = x.dim()
    tdims = tuple(range(nd)) if allf else tuple(dims)

    def fn(t):   # (max and min: random inputs have no ties)
        return goldfile.reduce(op, t, tdims, keepdim, correction)
    return fn, [float(keepdim), float(correction), float(allf)] + [float(d) for d in (dims or [])]


RED_CASES = [
    ("d1", (3, 4, 5), [1], False),
    ("d1k", (3, 4, 5), [1], True),
    ("dneg", (3, 4, 5), [-1], False),
    ("d0k", (4, 3), [0], True),
    ("d02", (3, 4, 5), [0, 2], False),
    ("d02k", (3, 4, 5), [0, 2], True),
    ("d12", (2, 3, 4), [1, 2], False),
    ("all", (3, 4), None, False),
    ("allk", (2, 3, 4), None, True),
    ("size1", (3, 1, 4), [1], False),
]
for op in ("sum", "mean", "max", "min", "var"):
    for cname, shp, dims, kd in RED_CASES:
        corrs = [1, 0] if op == "var" else [1]
        for c in corrs:
            if op == "var" and cname == "size1":
                continue   # variance of one element with correction 1 is NaN
            x = randn(*shp)
            fn, params = reduction(op, x, dims, kd, c)
            nm = "%s/%s%s" % (op, cname, "_c0" if (op == "var" and c == 0) else "")
            case(nm, [("x", x)], fn, params=params)

# argmax: params [dim, keepdim]; forward only
for i, (shp, dim, kd) in enumerate([((3, 5), 1, False), ((3, 5), 0, True), ((2, 3, 4), -1, False),
                                     ((2, 3, 4), 1, True), ((6,), 0, False)]):
    x = randn(*shp)
    case("argmax/c%d" % i, [("x", x)], lambda t, dim=dim, kd=kd: torch.argmax(t, dim, kd),
         params=[float(dim), float(kd)], grad=[])

# ------------------------------------------------------------ matmul
MM = [
    ("vv", (4,), (4,)),
    ("vm", (3,), (3, 5)),
    ("mv", (4, 3), (3,)),
    ("mm", (3, 4), (4, 2)),
    ("bmm", (2, 3, 4), (2, 4, 5)),
    ("bbcast", (2, 1, 3, 4), (5, 4, 2)),
    ("3d2d", (2, 3, 4), (4, 5)),
    ("2d3d", (3, 4), (2, 4, 5)),
    ("vb", (4,), (2, 4, 3)),
    ("bv", (2, 3, 4), (4,)),
]
for cname, sa, sb in MM:
    case("matmul/" + cname, [("a", randn(*sa)), ("b", randn(*sb))], torch.matmul)

# ------------------------------------------------------------ softmax
for op, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
    for dim in (0, 1, -1):
        x = randn(3, 4, 5)
        x[1, 2, :] = torch.tensor([1000.0, 1001.0, 998.0, 1000.5, 999.0])
        x[2, 0, :] = torch.tensor([-1000.0, -1001.0, -998.0, -1000.5, -999.0])
        case("%s/%s" % (op, "d%d" % dim if dim >= 0 else "dm1"), [("x", x)],
             lambda t, fn=fn, dim=dim: fn(t, dim), params=[float(dim)])
    case("%s/2d" % op, [("x", randn(4, 6))], lambda t, fn=fn: fn(t, 1), params=[1.0])

# ------------------------------------------------------------ shape ops
case("reshape/a", [("x", randn(2, 3, 4))], lambda t: t.reshape(4, -1), params=[4, -1])
case("reshape/b", [("x", randn(2, 3, 4))], lambda t: t.reshape(-1), params=[-1])
case("reshape/c", [("x", randn(6))], lambda t: t.reshape(1, 2, 1, 3), params=[1, 2, 1, 3])
case("flatten/a", [("x", randn(2, 3, 4))], lambda t: torch.flatten(t, 1, 2), params=[1, 2])
case("flatten/b", [("x", randn(2, 3, 4))], lambda t: torch.flatten(t, 0, -1), params=[0, -1])
case("flatten/c", [("x", randn(2, 3, 4, 2))], lambda t: torch.flatten(t, 0, 1), params=[0, 1])
case("squeeze/a", [("x", randn(2, 1, 3))], lambda t: t.squeeze(1), params=[1])
case("squeeze/b", [("x", randn(3, 1, 1))], lambda t: t.squeeze(-2), params=[-2])
case("squeeze/c", [("x", randn(1, 4))], lambda t: t.squeeze(0), params=[0])
case("unsqueeze/a", [("x", randn(2, 3))], lambda t: t.unsqueeze(0), params=[0])
case("unsqueeze/b", [("x", randn(2, 3))], lambda t: t.unsqueeze(-1), params=[-1])
case("unsqueeze/c", [("x", randn(2, 3))], lambda t: t.unsqueeze(1), params=[1])
case("permute/a", [("x", randn(2, 3, 4))], lambda t: t.permute(2, 0, 1), params=[2, 0, 1])
case("permute/b", [("x", randn(2, 3, 4, 2))], lambda t: t.permute(1, 3, 0, 2), params=[1, 3, 0, 2])
case("permute/c", [("x", randn(3, 4))], lambda t: t.permute(1, 0), params=[1, 0])
case("transpose/a", [("x", randn(2, 3, 4))], lambda t: t.transpose(0, 2), params=[0, 2])
case("transpose/b", [("x", randn(2, 3, 4))], lambda t: t.transpose(-1, -2), params=[-1, -2])
case("transpose/c", [("x", randn(3, 5))], lambda t: t.transpose(0, 1), params=[0, 1])
case("narrow/a", [("x", randn(3, 5, 2))], lambda t: t.narrow(1, 1, 3), params=[1, 1, 3])
case("narrow/b", [("x", randn(4, 3))], lambda t: t.narrow(0, 0, 1), params=[0, 0, 1])
case("narrow/c", [("x", randn(2, 6))], lambda t: t.narrow(-1, 4, 2), params=[-1, 4, 2])
case("cat/mid", [("x0", randn(2, 1, 3)), ("x1", randn(2, 3, 3)), ("x2", randn(2, 2, 3))],
     lambda a, b, c: torch.cat([a, b, c], 1), params=[1])
case("cat/d0", [("x0", randn(1, 4)), ("x1", randn(3, 4)), ("x2", randn(2, 4))],
     lambda a, b, c: torch.cat([a, b, c], 0), params=[0])
case("cat/dlast", [("x0", randn(2, 3, 2)), ("x1", randn(2, 3, 1)), ("x2", randn(2, 3, 4))],
     lambda a, b, c: torch.cat([a, b, c], -1), params=[-1])
case("stack/d0", [("x0", randn(2, 3)), ("x1", randn(2, 3)), ("x2", randn(2, 3))],
     lambda a, b, c: torch.stack([a, b, c], 0), params=[0])
case("stack/d1", [("x0", randn(2, 3)), ("x1", randn(2, 3)), ("x2", randn(2, 3))],
     lambda a, b, c: torch.stack([a, b, c], 1), params=[1])
case("stack/dlast", [("x0", randn(2, 3)), ("x1", randn(2, 3))],
     lambda a, b: torch.stack([a, b], -1), params=[-1])
case("expand/a", [("x", randn(1, 3))], lambda t: t.expand(4, 3), params=[4, 3])
case("expand/b", [("x", randn(3, 1))], lambda t: t.expand(2, 3, 4), params=[2, 3, 4])
case("expand/c", [("x", randn(2, 1, 1))], lambda t: t.expand(2, 3, 2), params=[2, 3, 2])
case("sum_to/a", [("x", randn(2, 3, 4))], lambda t: t.sum(dim=(0, 2), keepdim=True).squeeze(0),
     params=[3, 1])

# ------------------------------------------------------------ double backward
# tanh'' elementwise: grad of sum(dtanh/dx): gout = ones, v = ones
x = randn(3, 4) * 1.5
case("tanh/d2", [("x", x)], torch.tanh, dd=True, gout=torch.ones(3, 4), v=[torch.ones(3, 4)])
# Hessian-vector products of sum(f(x) * gout)
case("sigmoid/dd", [("x", randn(3, 4) * 2)], torch.sigmoid, dd=True)
case("gelu/dd", [("x", randn(3, 4) * 2)], torch.nn.functional.gelu, dd=True)
case("softmax/dd", [("x", randn(2, 3, 4))], lambda t: torch.softmax(t, -1), params=[-1.0], dd=True)
case("softmax/dd0", [("x", randn(3, 4))], lambda t: torch.softmax(t, 0), params=[0.0], dd=True)
case("log_softmax/dd", [("x", randn(2, 3, 4))], lambda t: torch.log_softmax(t, -1),
     params=[-1.0], dd=True)
case("log_softmax/dd1", [("x", randn(2, 3, 4))], lambda t: torch.log_softmax(t, 1),
     params=[1.0], dd=True)
case("matmul/dd", [("a", randn(3, 4)), ("b", randn(4, 2))], torch.matmul, dd=True)
case("matmul/ddb", [("a", randn(2, 3, 4)), ("b", randn(4, 2))], torch.matmul, dd=True)
case("div/dd", [("a", randn(3, 4)), ("b", nonzero(3, 4))], torch.div, dd=True)
case("div/ddbc", [("a", randn(2, 3)), ("b", nonzero(3))], torch.div, dd=True)
case("mul/dd", [("a", randn(2, 3)), ("b", randn(2, 1))], torch.mul, dd=True)
case("exp/dd", [("x", randn(3, 4))], torch.exp, dd=True)
case("log/dd", [("x", positive(3, 4))], torch.log, dd=True)
case("pow/dd3", [("x", randn(3, 4))], lambda t: torch.pow(t, 3.0), params=[3.0], dd=True)
case("pow/dd05", [("x", positive(3, 4))], lambda t: torch.pow(t, 0.5), params=[0.5], dd=True)
case("pow/ddm15", [("x", positive(3, 4))], lambda t: torch.pow(t, -1.5), params=[-1.5], dd=True)
case("sqrt/dd", [("x", positive(3, 4))], torch.sqrt, dd=True)
case("erf/dd", [("x", randn(3, 4))], torch.erf, dd=True)
case("var/dd", [("x", randn(3, 4))], lambda t: torch.var(t, dim=1, correction=1),
     params=[0.0, 1.0, 0.0, 1.0], dd=True)
# linear: the HVP is zero (the first grad carries no history)
case("mean/dd", [("x", randn(3, 4))], lambda t: torch.mean(t, dim=0),
     params=[0.0, 1.0, 0.0, 0.0], dd=True)


# MLP loss: mean((tanh(x W1^T + b1) W2^T + b2 - y)^2); HVP wrt (W1, b1, W2, b2)
def mlp(x, y, W1, b1, W2, b2):
    h = torch.tanh(torch.matmul(x, W1.t()) + b1)
    d = torch.matmul(h, W2.t()) + b2 - y
    return torch.mean(d * d)


case("mlp/hvp",
     [("x", randn(5, 3)), ("y", randn(5, 2)), ("W1", randn(4, 3)), ("b1", randn(4)),
      ("W2", randn(2, 4)), ("b2", randn(2))],
     mlp, grad=["W1", "b1", "W2", "b2"], dd=True, gout=torch.ones(()))

# cat's legacy rule: a 1-D empty input (0,) is skipped beside inputs with more
# dims, its gradient empty (acc = torch.tensor([]); acc = torch.cat([acc, x]))
case("cat/skip", [("x0", torch.empty(0)), ("x1", randn(2, 3)), ("x2", torch.empty(0)),
                  ("x3", randn(2, 2))], lambda a, b, c, d: torch.cat([a, b, c, d], 1), params=[1])
case("cat/skip_first", [("x0", torch.empty(0)), ("x1", randn(3, 2))],
     lambda a, b: torch.cat([a, b], -2), params=[-2])
case("cat/all_empty", [("x0", torch.empty(0)), ("x1", torch.empty(0))],
     lambda a, b: torch.cat([a, b], 0), params=[0])

# unflatten: params [dim, sizes...] (one size may be -1)
case("unflatten/mid", [("x", randn(2, 12, 3))], lambda t: t.unflatten(1, (3, -1)), params=[1, 3, -1])
case("unflatten/last", [("x", randn(3, 4))], lambda t: t.unflatten(-1, (2, 1, 2)), params=[-1, 2, 1, 2])
case("unflatten/first", [("x", randn(6, 2))], lambda t: torch.nn.Unflatten(0, (-1, 3))(t), params=[0, -1, 3])

# GELU's tanh approximation (nn.GELU(approximate="tanh")), with its second derivative
case("gelu_tanh/a", [("x", randn(4, 5) * 2)], lambda t: torch.nn.functional.gelu(t, approximate="tanh"), dd=True)


# embedding: inputs weight (V, D) and target (the indices, stored as floats;
# the runner makes them int64); params [has padding_idx, padding_idx, then 1:
# the output times itself, 2: times a third input x]
def emb_case(name, V, D, idx, pad=None, sq=False, dd=False):
    def fn(w, t):
        y = torch.nn.functional.embedding(t.long(), w, padding_idx=pad)
        return y * y if sq else y
    case("embedding/" + name, [("weight", randn(V, D)), ("target", idx.to(torch.float32))], fn,
         params=[0.0 if pad is None else 1.0, 0.0 if pad is None else float(pad), 1.0 if sq else 0.0],
         grad=["weight"], dd=dd)


emb_case("repeats", 6, 4, torch.randint(0, 6, (3, 5)))
emb_case("pad", 7, 3, torch.tensor([2, 0, 2, 6, 1, 2, 5, 0, 2, 3]), pad=2)
emb_case("negpad_sq", 5, 3, torch.tensor([[[4, 1], [0, 4]], [[3, 4], [2, 0]]]), pad=-1, sq=True, dd=True)
emb_case("scalar", 4, 5, torch.tensor(3))
emb_case("empty", 3, 4, torch.zeros(0, dtype=torch.long))
emb_case("wide", 10, 33, torch.randint(0, 10, (40,)), sq=True)
# the output times an input x: x's second derivative reads the backward's
# own backward, gathered rows of v, zeros at padding_idx (torch's)
idx = torch.tensor([[1, 3, 1], [0, 3, 2]])
case("embedding/pad_mul", [("weight", randn(4, 2)), ("target", idx.to(torch.float32)), ("x", randn(2, 3, 2))],
     lambda w, t, x: torch.nn.functional.embedding(t.long(), w, padding_idx=3) * x,
     params=[1.0, 3.0, 2.0], grad=["weight", "x"], dd=True)


# softplus: params [beta, threshold] (values past the threshold too); logsigmoid
case("softplus/default", [("x", randn(4, 6) * 12)], lambda t: torch.nn.functional.softplus(t),
     params=[1.0, 20.0], dd=True)
case("softplus/beta2", [("x", randn(3, 5) * 4)], lambda t: torch.nn.functional.softplus(t, beta=2.0, threshold=5.0),
     params=[2.0, 5.0], dd=True)
case("softplus/nn", [("x", randn(2, 7) * 3)], lambda t: torch.nn.Softplus(beta=0.5, threshold=1.0)(t),
     params=[0.5, 1.0])
case("logsigmoid/a", [("x", randn(4, 5) * 6)], torch.nn.functional.logsigmoid, dd=True)


# comparisons (no gradient; 1/0 as float): ties, NaN on either side, broadcast
cmp_a = torch.tensor([[1.0, -2.0, float("nan"), 0.5], [3.0, 0.0, -1.0, 2.0]])
cmp_b = torch.tensor([1.0, 0.0, 0.5, float("nan")])
for cname, cfn in [("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)]:
    case(cname + "/ties_nan", [("a", cmp_a), ("b", cmp_b)], (lambda f: lambda a, b: f(a, b).float())(cfn), grad=[])


# where: cond a 0/1 float mask (torch's .bool()), a and b broadcast; params
# [mode]: 0 where(c, a, b), 1 where(c, a * b, b * b) (a second derivative)
def where_fn(mode):
    def fn(c, a, b):
        return torch.where(c.bool(), a, b) if mode == 0 else torch.where(c.bool(), a * b, b * b)
    return fn


def mask(*s, p=0.5):
    return (torch.rand(tuple(s)) > p).float()


case("where/bcast", [("cond", mask(3, 4)), ("a", randn(3, 1)), ("b", randn(4))], where_fn(0),
     params=[0], grad=["a", "b"])
case("where/cond_bcast", [("cond", mask(3, 1)), ("a", randn(2, 3, 4)), ("b", randn())], where_fn(0),
     params=[0], grad=["a", "b"])
wa = randn(2, 5)
wc = mask(2, 5)
wa[wc == 0] = float("inf")   # the branch not taken: inf, kept out of the result and the gradient
case("where/inf_not_taken", [("cond", wc), ("a", wa), ("b", randn(2, 5))], where_fn(0), params=[0],
     grad=["a", "b"])
case("where/products", [("cond", mask(2, 3, p=0.4)), ("a", randn(2, 3)), ("b", randn(1, 3))], where_fn(1),
     params=[1], grad=["a", "b"], dd=True)


# masked_fill: params [value, mode]: 0 the fill, 1 softmax over the last dim
# of the fill with -inf (attention's causal mask)
case("masked_fill/bcast", [("x", randn(2, 3, 4)), ("mask", mask(3, 1))],
     lambda x, m: x.masked_fill(m.bool(), 2.5), params=[2.5, 0], grad=["x"])
causal = torch.triu(torch.ones(4, 4), 1)
case("masked_fill/causal_softmax", [("x", randn(2, 4, 4)), ("mask", causal)],
     lambda x, m: torch.softmax(x.masked_fill(m.bool(), float("-inf")), -1), params=[float("-inf"), 1],
     grad=["x"], dd=True)

# tril / triu: params [diagonal]
case("tril/k0", [("x", randn(3, 4))], lambda x: torch.tril(x), params=[0])
case("tril/km1_batch", [("x", randn(2, 3, 3))], lambda x: torch.tril(x, -1), params=[-1])
case("tril/k2_wide", [("x", randn(2, 5))], lambda x: torch.tril(x, 2), params=[2])
case("tril/far", [("x", randn(3, 2))], lambda x: torch.tril(x, -7), params=[-7])
case("triu/k1", [("x", randn(4, 3))], lambda x: torch.triu(x, 1), params=[1])
case("triu/km2_batch", [("x", randn(2, 1, 4, 4))], lambda x: torch.triu(x, -2), params=[-2])
case("triu/far", [("x", randn(2, 3))], lambda x: torch.triu(x, 9), params=[9])


# gather: inputs x and target (the index, stored as floats); params [dim,
# mode]: 0 the gather, 1 the gather squared (a second derivative)
def gather_case(name, xs, dim, idx, sq=False, dd=False):
    def fn(x, t):
        y = torch.gather(x, dim, t.long())
        return y * y if sq else y
    case("gather/" + name, [("x", randn(*xs)), ("target", idx.to(torch.float32))], fn,
         params=[dim, 1 if sq else 0], grad=["x"], dd=dd)


gather_case("dqn", (5, 3), 1, torch.randint(0, 3, (5, 1)))
gather_case("dim0_smaller", (4, 3), 0, torch.tensor([[0, 3, 1], [3, 3, 0]]))
gather_case("last_repeats", (2, 3, 4), -1, torch.randint(0, 4, (2, 2, 6)), sq=True, dd=True)
gather_case("mid_smaller", (2, 5, 3), 1, torch.randint(0, 5, (2, 4, 2)), sq=True, dd=True)
gather_case("scalar", (), 0, torch.tensor(0))
gather_case("empty", (3, 2), 1, torch.zeros(3, 0, dtype=torch.long))


# group_norm: inputs x[, weight, bias]; params [num_groups, eps]
case("group_norm/affine", [("x", randn(3, 6, 4) * 2 + 1), ("weight", randn(6)), ("bias", randn(6))],
     lambda x, w, b: torch.nn.functional.group_norm(x, 3, w, b, 1e-5), params=[3, 1e-5], dd=True)
case("group_norm/plain_2d", [("x", randn(2, 4, 3, 3))], lambda x: torch.nn.functional.group_norm(x, 2, eps=1e-3),
     params=[2, 1e-3], dd=True)
case("group_norm/one_group", [("x", randn(2, 3, 5)), ("weight", randn(3)), ("bias", randn(3))],
     lambda x, w, b: torch.nn.functional.group_norm(x, 1, w, b), params=[1, 1e-5])
case("group_norm/per_channel", [("x", randn(2, 3, 6) * 3)], lambda x: torch.nn.functional.group_norm(x, 3),
     params=[3, 1e-5])


# nearest upsampling: params [scale, 1: the output squared (a second derivative)]
F = torch.nn.functional
case("upsample_nearest/1d_s3", [("x", randn(2, 3, 4))], lambda x: F.interpolate(x, scale_factor=3, mode="nearest"),
     params=[3, 0])
case("upsample_nearest/2d_s2_sq", [("x", randn(2, 2, 3, 4))],
     lambda x: F.interpolate(x, scale_factor=2, mode="nearest") ** 2, params=[2, 1], dd=True)
case("upsample_nearest/3d_s2", [("x", randn(1, 2, 2, 3, 2))], lambda x: torch.nn.Upsample(scale_factor=2)(x),
     params=[2, 0])
case("upsample_nearest/s1", [("x", randn(1, 2, 3, 3))], lambda x: F.interpolate(x, scale_factor=1, mode="nearest"),
     params=[1, 0])


# std: params as the reductions' [keepdim, correction, all, dims...]; a
# second derivative; a row of equal values (a std of 0: a zero gradient, as torch's)
for cname, shp, dims, kd, c in [("d1", (3, 4, 5), [1], False, 1), ("d02k_c0", (3, 4, 5), [0, 2], True, 0),
                                ("all", (3, 4), None, False, 1), ("dneg_dd", (2, 6), [-1], False, 1)]:
    x = randn(*shp)
    fn, params = reduction("std", x, dims, kd, c)
    case("std/" + cname, [("x", x)], fn, params=params, dd=cname.endswith("_dd"))
case("std/const_row", [("x", torch.tensor([[1.5, 1.5, 1.5], [0.0, 1.0, 3.0]]))],
     lambda t: torch.std(t, dim=1), params=[0.0, 1.0, 0.0, 1.0])


# split / chunk / unbind: params [form (0: split(size), 1: split(sizes), 2:
# chunk, 3: unbind), dim, size or chunks, a mask of the pieces used, the
# sizes (form 1)]; out: cat of (k + 1) p_k^2 flattened over the pieces used
# (a piece left out: its gradient zeros; squared: a second derivative)
def split_case(name, x, form, dim, arg, used, sizes=()):
    def fn(t):
        ps = (torch.split(t, arg, dim) if form == 0 else torch.split(t, list(sizes), dim) if form == 1
              else torch.chunk(t, arg, dim) if form == 2 else torch.unbind(t, dim))
        return torch.cat([((k + 1) * p * p).reshape(-1) for k, p in enumerate(ps) if used >> k & 1])
    case(name, [("x", x)], fn, params=[form, dim, arg, used] + list(sizes), dd=True)


split_case("split/size2_d1", randn(3, 5, 2), 0, 1, 2, 0b111)
split_case("split/size3_d0_skip", randn(7, 3), 0, 0, 3, 0b101)
split_case("split/sizes_neg", randn(2, 3, 6), 1, -1, 0, 0b1011, sizes=(1, 0, 3, 2))
split_case("chunk/d1", randn(4, 8), 2, 1, 4, 0b1101)
split_case("chunk/fewer", randn(6, 2), 2, 0, 4, 0b111)
split_case("chunk/uneven_last", randn(2, 5, 3), 2, 1, 3, 0b110)
split_case("unbind/d0", randn(4, 3), 3, 0, 0, 0b1011)
split_case("unbind/mid", randn(2, 3, 4), 3, 1, 0, 0b111)


# var / std with correction past the reduced size (dims given): the value
# inf, the backward's factor 2 / (N - correction) negative and finite
for op in ("var", "std"):
    x = randn(3, 4)
    fn, params = reduction(op, x, [1], False, 6)
    case(op + "/corr_over", [("x", x)], fn, params=params)


# torch.distributions.Categorical(logits=x) (probs: Categorical(probs=x),
# op categorical_probs_*): log_prob(target) and entropy(); inputs x [and
# target, the values as floats]; params [0]
def categorical_case(name, x, value=None, dd=False, probs=False):
    op, dist = "categorical_", lambda t: torch.distributions.Categorical(logits=t)
    if probs:
        op, dist = "categorical_probs_", lambda t: torch.distributions.Categorical(probs=t)
    if value is None:
        case(op + "entropy/" + name, [("x", x)], lambda t: dist(t).entropy(), params=[0], dd=dd)
    else:
        case(op + "log_prob/" + name, [("x", x), ("target", value.to(torch.float32))],
             lambda t, v: dist(t).log_prob(v.long()), params=[0], grad=["x"], dd=dd)


categorical_case("rows", randn(5, 4) * 2, torch.randint(0, 4, (5,)), dd=True)
categorical_case("one", randn(6), torch.tensor(3))
categorical_case("batch2", randn(2, 3, 5), torch.randint(0, 5, (2, 3)), dd=True)
categorical_case("single_category", randn(3, 1), torch.zeros(3, dtype=torch.long))
categorical_case("rows", randn(5, 4) * 2, dd=True)
categorical_case("one", randn(6))
categorical_case("batch2", randn(2, 3, 5) * 3, dd=True)
categorical_case("neg_inf", torch.tensor([[0.5, float("-inf"), -1.0], [float("-inf"), 2.0, 0.0]]))
categorical_case("peaked", torch.tensor([[30.0, 0.0, -30.0, 1.0]]))


# sin, cos (x 3, and large arguments: 1e4, 1e6, past 2^24 where dl.h's
# reduction turns to libm's in double), log1p (down to near -1), expm1,
# rsqrt; small arguments (x itself), first and second order
big = torch.tensor([1e4, -1e4, 12345.678, 1e6, -1e6, 999999.5, 3e7, 1e8, -1e30, 3.4e38, 16777215.0, 16777216.0])
case("sin/a", [("x", randn(3, 4) * 3)], torch.sin, dd=True)
case("sin/big", [("x", big)], torch.sin)
case("cos/a", [("x", randn(3, 4) * 3)], torch.cos, dd=True)
case("cos/big", [("x", big)], torch.cos)
case("sin/tiny", [("x", randn(8) * 1e-5)], torch.sin)
case("log1p/a", [("x", rand(3, 4) * 3 - 0.99)], torch.log1p, dd=True)
case("log1p/tiny", [("x", randn(8) * 1e-6)], torch.log1p)
case("expm1/a", [("x", randn(3, 4) * 3)], torch.expm1, dd=True)
case("expm1/wide", [("x", randn(4, 5) * 30)], torch.expm1)
case("expm1/tiny", [("x", randn(8) * 1e-6)], torch.expm1)
case("rsqrt/a", [("x", positive(3, 4))], torch.rsqrt, dd=True)
case("rsqrt/wide", [("x", torch.exp(randn(10) * 20))], torch.rsqrt)

# Categorical(logits=x).log_prob(value) with value broadcast against the
# batch shape, and Categorical(probs=x): log_prob, entropy (gradients in x)
categorical_case("bcast_col", randn(4, 5), torch.randint(0, 5, (3, 1)), dd=True)
categorical_case("bcast_row", randn(3, 1, 4), torch.randint(0, 4, (5,)))
categorical_case("bcast_scalar", randn(2, 3, 4), torch.tensor(2))
categorical_case("rows", torch.rand(5, 4) + 0.1, torch.randint(0, 4, (5,)), dd=True, probs=True)
categorical_case("one", torch.rand(6) * 3 + 0.05, torch.tensor(3), probs=True)
categorical_case("bcast_col", torch.rand(4, 5) + 0.1, torch.randint(0, 5, (3, 1)), dd=True, probs=True)
categorical_case("zeros", torch.tensor([[0.0, 2.0, 1.0], [1.0, 0.0, 0.0]]), torch.tensor([0, 1]), probs=True)
categorical_case("single_category", torch.rand(3, 1) + 0.5, torch.zeros(3, dtype=torch.long), probs=True)
categorical_case("rows", torch.rand(5, 4) + 0.1, dd=True, probs=True)
categorical_case("batch2", torch.rand(2, 3, 5) * 2 + 0.01, dd=True, probs=True)
categorical_case("zeros", torch.tensor([[0.0, 2.0, 1.0], [1.0, 0.0, 0.0]]), probs=True)
categorical_case("one_hot", torch.tensor([[0.0] * 7 + [1.0] + [0.0] * 992]), probs=True)


# ------------------------------------------------------------ write
def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/core.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
