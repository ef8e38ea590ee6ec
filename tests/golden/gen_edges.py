#!/usr/bin/env python3
"""tests/golden/gen_edges.py - PyTorch golden values for edge cases of core
ops, read by tests/test_golden.c in the format and case layout of gen.py
(see its docstring): ties in max/min over one dim (torch.amax splits the
gradient evenly) and torch.max(x, dim) with its indices, 0-d tensors in
reductions, softmax and argmax, ReLU's gradient at NaN, clamp's at its
bounds, pow's gradient where p - 1 is no float, and every elementwise op and
reduction over special values (NaN, +-inf, +-0, denormals, +-1e38). A NaN
in a record must be NaN in dl.h's result, an infinity the same infinity.

Run from the repository root:   python3 tests/golden/gen_edges.py [out.bin]
(default output: tests/golden/edges.bin). Deterministic:
torch.manual_seed(1357), CPU, float32.
"""
import sys

import torch

import goldfile
from goldfile import RECORDS, rec, randn, record_grads

torch.manual_seed(1357)
NAN = float("nan")


def case(name, x, fn, params, grad=True, dd=False):
    """one input x (requiring grad unless grad is False), params as floats;
    dd: with a Hessian-vector product"""
    t = x.detach().clone().to(torch.float32).requires_grad_(grad)
    out = fn(t)
    rec(name + "/x", t)
    rec(name + "/params", torch.tensor(params, dtype=torch.float32))
    record_grads(name, out, [t] if grad else [], ["x"] if grad else [], dd)


def ties(*s):
    """small integers: many ties"""
    return torch.randint(0, 3, s).to(torch.float32)


# reductions: params [keepdim, correction, all_flag, dims...] as in gen.py
def red(op, x, dims, keepdim):
    def fn(t):
        if op == "max":
            return torch.amax(t, dim=dims, keepdim=keepdim)
        if op == "min":
            return torch.amin(t, dim=dims, keepdim=keepdim)
        if op == "sum":
            return torch.sum(t, dim=dims, keepdim=keepdim)
        return torch.mean(t, dim=dims, keepdim=keepdim)
    return fn, [float(keepdim), 1.0, 0.0] + [float(d) for d in dims]


RED = [
    ("max", "tie1", torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]]), [1], False),
    ("max", "tie1k", ties(2, 3, 4), [1], True),
    ("max", "tie_neg", ties(3, 4, 5), [-1], False),
    ("max", "tie0", ties(4, 3), [0], False),
    ("max", "tie02", ties(3, 4, 5), [0, 2], False),
    ("min", "tie1", torch.tensor([[1.0, 1.0, 3.0], [0.0, 2.0, 0.0]]), [1], False),
    ("min", "tie_neg", ties(3, 4, 5), [-1], True),
    ("max", "scalar0", torch.tensor(2.5), [0], False),
    ("max", "scalar_m1k", torch.tensor(-1.5), [-1], True),
    ("min", "scalar0", torch.tensor(0.5), [0], False),
    ("sum", "scalar0", torch.tensor(2.5), [0], False),
    ("sum", "scalar_m1k", torch.tensor(2.5), [-1], True),
    ("mean", "scalar0", torch.tensor(-3.0), [0], True),
]
for op, cname, x, dims, kd in RED:
    fn, params = red(op, x, dims, kd)
    case("%s/%s" % (op, cname), x, fn, params)

# torch.max(x, dim) / torch.min(x, dim): params [dim, keepdim]; values with
# the gradient to the index (the first largest), and the indices (int64)
for op, f in (("max_dim", torch.max), ("min_dim", torch.min)):
    for cname, x, dim, kd in (("a", randn(3, 4, 5), 1, False), ("k", randn(3, 4), -1, True),
                              ("tie", ties(4, 6), 1, False), ("tie0k", ties(5, 3), 0, True),
                              ("scalar", torch.tensor(1.25), 0, False)):
        case("%s/%s" % (op, cname), x, lambda t, f=f, dim=dim, kd=kd: f(t, dim, kd).values,
             [float(dim), float(kd)])
        case("%s_idx/%s" % (op, cname), x, lambda t, f=f, dim=dim, kd=kd: f(t, dim, kd).indices,
             [float(dim), float(kd)], grad=False)

# softmax / log_softmax / argmax of a 0-d tensor: params [dim]; argmax [dim, keepdim]
case("softmax/scalar0", torch.tensor(0.7), lambda t: torch.softmax(t, 0), [0.0])
case("softmax/scalar_m1", torch.tensor(-2.0), lambda t: torch.softmax(t, -1), [-1.0])
case("log_softmax/scalar0", torch.tensor(0.7), lambda t: torch.log_softmax(t, 0), [0.0])
case("log_softmax/scalar_m1", torch.tensor(3.0), lambda t: torch.log_softmax(t, -1), [-1.0])
case("argmax/scalar0", torch.tensor(0.7), lambda t: torch.argmax(t, 0), [0.0, 0.0], grad=False)
case("argmax/scalar_m1k", torch.tensor(0.7), lambda t: torch.argmax(t, -1, True), [-1.0, 1.0], grad=False)

# ReLU at NaN (threshold_backward passes the gradient), at 0 and -0; clamp
# at its bounds and at NaN (gradient 0), lo == hi, one-sided bounds,
edge = torch.tensor([NAN, -1.0, -0.0, 0.0, 1e-30, 0.5, 1.0, 2.0])
case("relu/nan", edge, torch.relu, [])
# lo > hi (hi everywhere: min(max(x, lo), hi)) and a NaN bound (NaN everywhere)
for cname, lo, hi in (("bounds", 0.0, 1.0), ("eq", 1.0, 1.0), ("lo", 0.0, float("inf")),
                      ("hi", float("-inf"), 1.0), ("crossed", 1.0, 0.0), ("nanlo", NAN, 1.0),
                      ("nanhi", 0.0, NAN)):
    case("clamp/" + cname, edge, lambda t, lo=lo, hi=hi: torch.clamp(t, lo, hi), [lo, hi])

# pow's gradient p x^(p-1) with p - 1 in double (PyTorch's Scalar): for
# |p| > 2^24, p - 1 in float would round to p (the other sign at x = -1);
# for |p| < 6e-8, to -1 (finite at negative x where PyTorch gives NaN);
# p = 0.3, whose p - 1 needs more than a float's bits. params [p], p a float32.
for cname, pv, xs in (("p2e25", 2.0 ** 25, [-1.0, 1.0, -0.5, 0.5, -0.999, 0.999]),
                      ("ptiny", 1e-9, [-2.0, -0.5, 0.5, 2.0]),
                      ("mtiny", -1e-9, [-2.0, -0.5, 0.5, 2.0]),
                      ("p03", 0.3, [0.5, 1.5, 2.0, 3.0])):
    pf = float(torch.tensor(pv, dtype=torch.float32))
    case("pow/" + cname, torch.tensor(xs), lambda t, pf=pf: torch.pow(t, pf), [pf])


# every elementwise op and reduction over special values (NaN, +-inf, +-0,
# denormals, +-1e38, exp's overflow): forward and gradient, NaN where
# PyTorch's is NaN and the same infinities. GELU at +inf: PyTorch's CPU
# kernel gives NaN (x * (1 + erf) is inf in exact arithmetic; dl.h gives
# inf), so its sweep leaves inf out.
INF = float("inf")
SPECIAL = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1e-38, 1e38, -1e38, 1.0, -1.0, 0.5, 1e-45, 88.8,
                        -104.0, 20.0, -20.0, 3.0, -0.3])
UNARY = {"neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs,
         "erf": torch.erf, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
         "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}
for op, fn in UNARY.items():
    case(op + "/special", SPECIAL if op != "gelu" else torch.cat([SPECIAL[:1], SPECIAL[2:]]), fn, [])
case("leaky_relu/special", SPECIAL, lambda t: torch.nn.functional.leaky_relu(t, 0.1), [0.1])
case("clamp/special", SPECIAL, lambda t: torch.clamp(t, -1.0, 2.0), [-1.0, 2.0])
for i, p in enumerate((2.0, 3.0, 0.5, -0.5, -1.0, 1.5, 0.0, 1.0, -2.0)):
    case("pow/special%d" % i, SPECIAL, lambda t, p=p: torch.pow(t, p), [p])
SCALAR = {"add_scalar": lambda t, v: t + v, "sub_scalar": lambda t, v: t - v, "mul_scalar": lambda t, v: t * v,
          "div_scalar": lambda t, v: t / v, "rsub_scalar": lambda t, v: v - t}
for op, fn in SCALAR.items():
    for i, v in enumerate((2.5, 0.0, -0.0, INF)):
        case("%s/special%d" % (op, i), SPECIAL, lambda t, fn=fn, v=v: fn(t, v), [v])


def pair(name, a, b, fn):
    ta, tb = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    out = fn(ta, tb)
    rec(name + "/a", ta)
    rec(name + "/b", tb)
    record_grads(name, out, [ta, tb], ["a", "b"])


n = SPECIAL.numel()
for op, fn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
               ("maximum", torch.maximum), ("minimum", torch.minimum)):
    pair(op + "/special", SPECIAL.repeat(n), SPECIAL.repeat_interleave(n), fn)
ROWS = torch.tensor([[NAN, 1.0, 2.0], [INF, 1.0, 2.0], [-INF, INF, 0.0], [1e38, 1e38, 1e38], [-0.0, 0.0, -0.0],
                     [5.0, 5.0, 5.0], [INF, INF, 1.0], [-INF, -INF, -INF]])
for op, fn in (("sum", lambda t: t.sum(1)), ("mean", lambda t: t.mean(1)), ("max", lambda t: t.amax(1)),
               ("min", lambda t: t.amin(1)), ("var", lambda t: torch.var(t, 1, correction=1))):
    case(op + "/special", ROWS, fn, [0.0, 1.0, 0.0, 1.0])
case("softmax/special", ROWS, lambda t: torch.softmax(t, 1), [1.0])
case("log_softmax/special", ROWS, lambda t: torch.log_softmax(t, 1), [1.0])
ROWS2 = torch.cat([ROWS, torch.tensor([[1.0, NAN, NAN], [2.0, 3.0, NAN]])])   # (NaN wins, the first one)
for op, f in (("max_dim", torch.max), ("min_dim", torch.min)):
    case(op + "/special", ROWS2, lambda t, f=f: f(t, 1).values, [1.0, 0.0])
    case(op + "_idx/special", ROWS2, lambda t, f=f: f(t, 1).indices, [1.0, 0.0], grad=False)
case("argmax/special", ROWS2, lambda t: torch.argmax(t, 1), [1.0, 0.0], grad=False)
case("norm/special", ROWS2, lambda t: torch.linalg.vector_norm(t, 2, dim=1), [0.0, 1.0, 0.0, 1.0])

# second order over the special values: Hessian-vector products (GELU's at
# +-1e38: PyTorch's x * x overflows to NaN, dl.h's is 0; left out with inf)
for op, fn in UNARY.items():
    x = SPECIAL if op != "gelu" else SPECIAL[torch.tensor([i for i in range(SPECIAL.numel()) if i not in (1, 6, 7)])]
    case(op + "/special_dd", x, fn, [], dd=True)
case("leaky_relu/special_dd", SPECIAL, lambda t: torch.nn.functional.leaky_relu(t, 0.1), [0.1], dd=True)
for i, p in enumerate((2.0, 3.0, 0.5, -1.0, 1.5)):
    case("pow/special_dd%d" % i, SPECIAL, lambda t, p=p: torch.pow(t, p), [p], dd=True)
ROWS3 = torch.tensor([[NAN, 1.0, 2.0], [INF, 1.0, 2.0], [-INF, INF, 0.0], [5.0, 5.0, 5.0], [INF, INF, 1.0],
                      [-INF, -INF, -INF], [1.0, 2.0, 3.0]])
case("softmax/special_dd", ROWS3, lambda t: torch.softmax(t, 1), [1.0], dd=True)
case("log_softmax/special_dd", ROWS3, lambda t: torch.log_softmax(t, 1), [1.0], dd=True)
case("var/special_dd", ROWS3, lambda t: torch.var(t, 1, correction=1), [0.0, 1.0, 0.0, 1.0], dd=True)

# GELU's tanh approximation over the special values, first and second order
# (last in the file: the cases above keep their random draws)
def gelu_tanh(t):
    return torch.nn.functional.gelu(t, approximate="tanh")


case("gelu_tanh/special", SPECIAL, gelu_tanh, [])
case("gelu_tanh/special_dd", SPECIAL, gelu_tanh, [], dd=True)

# softplus (torch's defaults beta 1, threshold 20) and logsigmoid over the
# special values (appended after the cases above)
case("softplus/special", SPECIAL, torch.nn.functional.softplus, [1.0, 20.0])
case("softplus/special_dd", SPECIAL, torch.nn.functional.softplus, [1.0, 20.0], dd=True)
case("logsigmoid/special", SPECIAL, torch.nn.functional.logsigmoid, [])

# sin, cos, log1p, expm1, rsqrt over the special values, first and second
# order, and their own edges: log1p at -1 (-inf) and below (NaN), +-0's
# sign, rsqrt(-0) = -inf, large sin / cos arguments (appended)
EDGE2 = torch.tensor([-1.0, -2.0, -1.0000001, -0.9999999, 1e-45, -1e-45, 1e-40, -0.0, 0.0, 1e4, 1e6, -1e6, 1e8,
                      1e30, -INF, INF, NAN, -88.0, 89.0, 1e-8, -3.0, 0.7])
for op, fn in (("sin", torch.sin), ("cos", torch.cos), ("log1p", torch.log1p), ("expm1", torch.expm1),
               ("rsqrt", torch.rsqrt)):
    case(op + "/special", SPECIAL, fn, [])
    case(op + "/special_dd", SPECIAL, fn, [], dd=True)
    case(op + "/edge", EDGE2, fn, [])


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/edges.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
