#!/usr/bin/env python3
"""tests/golden/gen_nn_ops.py - PyTorch golden values for dl.h's
normalization and loss ops (parts/nn_ops_*.h), read by tests/test_nn_ops.c.

Run from the repository root:   /usr/bin/python3 tests/golden/gen_nn_ops.py [out.bin]
(default output: tests/golden/nn_ops.bin). Works with torch 1.13 and newer.
Deterministic: torch.manual_seed(4321), CPU, float32.

FILE FORMAT: the same as tests/golden/core.bin (see gen.py):
    8 bytes "DLGOLD1\\0", uint32 version 1, uint32 record count, then records
    (uint32 name length, name, uint32 ndim, ndim x int64 shape, float32 values).

RECORD NAMES "<op>/<case>/<field>", a case's records consecutive, in order:
    inputs        by name (the C side looks them up by name):
                  x, target (class indices stored as floats), weight, rm, rv,
                  w, b, a, y
    params        op parameters as floats:
                    batch_norm   [training, momentum, eps]
                    layer_norm   [eps, normalized_shape...]
                    cross_entropy, nll_loss  [reduction, ignore_index, label_smoothing]
                    mse_loss, l1_loss, bce_logits  [reduction]
                  reduction: 0 mean, 1 sum, 2 none (dl_reduction)
    gout          upstream gradient (shape of out)
    v_<input>     direction for a Hessian-vector product
    out           forward result
    grad_<input>  torch.autograd.grad(out, inputs, gout)
    hv_<input>    grad of sum_i (grad_i * v_i).sum() (first grads with create_graph)
    after_<input> the input's value after the call (batch norm running stats,
                  updated in place in training mode)
"""
import struct
import goldfile
from goldfile import RECORDS, rec, randn, record_grads
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(4321)
torch.set_grad_enabled(True)

RED = {"mean": 0, "sum": 1, "none": 2}






def rand(*s):
    return torch.rand(tuple(s), dtype=torch.float32)


def case(name, inputs, fn, params, grad, dd=False, after=()):
    """inputs: list of (field, tensor); grad: fields that require grad;
    after: fields whose value after fn is recorded (in-place updates)."""
    ts = []
    for f, t in inputs:
        t = t.detach().clone().to(torch.float32)
        rec(name + "/" + f, t)
        if f in grad:
            t.requires_grad_(True)
        ts.append(t)
    rec(name + "/params", torch.tensor(params, dtype=torch.float32))
    req = [t for (f, _), t in zip(inputs, ts) if f in grad]
    reqf = [f for f, _ in inputs if f in grad]
    out = fn(*ts)
    record_grads(name, out, req, reqf, dd)
    for f in after:
        idx = [g for g, _ in inputs].index(f)
        rec(name + "/after_" + f, ts[idx])


# ------------------------------------------------------------ batch norm
def bn_case(cname, shape, training, rs, affine, dd=False, momentum=0.1, eps=1e-5, bias=True):
    C = shape[1]
    x = randn(*shape) * 1.5 + 0.3
    inputs = [("x", x)]
    if rs:
        inputs += [("rm", randn(C) * 0.5), ("rv", rand(C) + 0.5)]
    if affine:
        inputs += [("w", randn(C))]
        if bias:
            inputs += [("b", randn(C))]
    fields = [f for f, _ in inputs]
    grad = [f for f in fields if f in ("x", "w", "b")]

    def fn(*ts):
        d = dict(zip(fields, ts))
        return F.batch_norm(d["x"], d.get("rm"), d.get("rv"), d.get("w"), d.get("b"),
                            training=training, momentum=momentum, eps=eps)
    case("batch_norm/" + cname, inputs, fn, [float(training), momentum, eps], grad, dd=dd,
         after=("rm", "rv") if (rs and training) else ())


bn_case("train2d", (6, 4), True, True, True)
bn_case("train2d_noaff", (5, 3), True, False, False)
bn_case("train3d", (4, 3, 5), True, True, True)
bn_case("train3d_m03", (3, 2, 4), True, True, False, momentum=0.3, eps=1e-3)
bn_case("train4d", (3, 2, 4, 5), True, True, False)
bn_case("train4d_aff", (2, 3, 3, 4), True, False, True)
bn_case("train5d", (2, 3, 2, 3, 2), True, False, True)
bn_case("train5d_rs", (2, 2, 3, 2, 2), True, True, True)
bn_case("train_wonly", (4, 3, 2), True, False, True, bias=False)
bn_case("eval2d", (6, 4), False, True, True)
bn_case("eval3d", (3, 4, 5), False, True, True, bias=False)
bn_case("eval4d", (2, 3, 4, 4), False, True, False)
bn_case("eval5d", (2, 2, 2, 3, 2), False, True, True)
bn_case("train3d_dd", (4, 3, 5), True, False, True, dd=True)
bn_case("train2d_dd", (5, 3), True, True, True, dd=True)


# ------------------------------------------------------------ layer norm
def ln_case(cname, shape, k, affine, dd=False, eps=1e-5):
    ns = tuple(shape[len(shape) - k:])
    inputs = [("x", randn(*shape) * 2 + 0.5)]
    if affine:
        inputs += [("w", randn(*ns)), ("b", randn(*ns))]
    fields = [f for f, _ in inputs]

    def fn(*ts):
        d = dict(zip(fields, ts))
        return F.layer_norm(d["x"], ns, d.get("w"), d.get("b"), eps)
    case("layer_norm/" + cname, inputs, fn, [eps] + [float(v) for v in ns], fields, dd=dd)


ln_case("d1", (4, 6), 1, True)
ln_case("d1_noaff", (2, 3, 5), 1, False)
ln_case("d2", (2, 3, 4), 2, True)
ln_case("d2_noaff", (3, 2, 5), 2, False)
ln_case("d3_all", (2, 3, 4), 3, True)
ln_case("eps", (3, 8), 1, True, eps=1e-2)
ln_case("d1_dd", (3, 5), 1, True, dd=True)
ln_case("d2_dd", (2, 3, 4), 2, True, dd=True)
ln_case("d1_noaff_dd", (4, 6), 1, False, dd=True)


# ------------------------------------------------------------ class losses
def targets(shape, C, ignore=None, nign=0):
    t = torch.randint(0, C, shape)
    if ignore is not None and nign:
        flat = t.reshape(-1)
        idx = torch.randperm(flat.numel())[:nign]
        flat[idx] = ignore
        t = flat.reshape(shape)
    return t


def class_case(op, cname, xshape, red="mean", ignore=-100, nign=0, weight=False, ls=0.0,
               dd=False, scale=1.0, xs=None, wvals=None, tvals=None):
    C = xshape[1] if len(xshape) > 1 else xshape[0]
    tshape = (xshape[0],) + tuple(xshape[2:]) if len(xshape) > 1 else ()
    x = xs if xs is not None else randn(*xshape) * scale
    if op == "nll_loss":
        x = torch.log_softmax(x, 1)
    t = targets(tshape, C, ignore, nign) if tvals is None else torch.tensor(tvals).reshape(tshape)
    inputs = [("x", x), ("target", t.float())]
    if weight or wvals is not None:
        inputs += [("weight", rand(C) + 0.2 if wvals is None else torch.tensor(wvals))]
    fields = [f for f, _ in inputs]

    def fn(*ts):
        d = dict(zip(fields, ts))
        tt = d["target"].long()
        if op == "cross_entropy":
            return F.cross_entropy(d["x"], tt, weight=d.get("weight"), ignore_index=ignore,
                                   reduction=red, label_smoothing=ls)
        return F.nll_loss(d["x"], tt, weight=d.get("weight"), ignore_index=ignore, reduction=red)
    case(op + "/" + cname, inputs, fn, [float(RED[red]), float(ignore), ls], ["x"], dd=dd)


for red in ("mean", "sum", "none"):
    class_case("cross_entropy", red, (5, 4), red)
    class_case("cross_entropy", "ign_" + red, (6, 5), red, nign=2)
    class_case("cross_entropy", "ign2_" + red, (6, 5), red, ignore=2, nign=2)
    class_case("cross_entropy", "w_" + red, (5, 4), red, weight=True)
    class_case("cross_entropy", "w_ign_" + red, (7, 4), red, weight=True, nign=3)
    class_case("cross_entropy", "ls_" + red, (5, 4), red, ls=0.1)
    class_case("cross_entropy", "ls_w_" + red, (5, 4), red, weight=True, ls=0.25)
    class_case("cross_entropy", "ls_w_ign_" + red, (6, 4), red, weight=True, ls=0.2, nign=2)
    class_case("cross_entropy", "ls_ign_" + red, (6, 4), red, ls=0.3, nign=2)
    class_case("cross_entropy", "nd_" + red, (3, 4, 5), red)
    class_case("cross_entropy", "nd2_w_ls_ign_" + red, (2, 3, 2, 2), red, weight=True, ls=0.15, nign=2)
    class_case("nll_loss", red, (5, 4), red)
    class_case("nll_loss", "w_ign_" + red, (6, 5), red, weight=True, nign=2)
    class_case("nll_loss", "nd_" + red, (3, 4, 2), red, ignore=1, nign=1)
class_case("cross_entropy", "ls_full", (4, 3), "mean", ls=1.0)
class_case("cross_entropy", "large", (4, 5), "mean", scale=1e4)
class_case("cross_entropy", "large_ls", (4, 5), "sum", scale=3e3, ls=0.1)
class_case("cross_entropy", "one", (5,), "mean")
class_case("cross_entropy", "one_none", (5,), "none")
class_case("cross_entropy", "dd", (4, 5), "mean", dd=True)
class_case("cross_entropy", "dd_w_ls_ign", (6, 4), "mean", weight=True, ls=0.1, nign=2, dd=True)
class_case("cross_entropy", "dd_nd_sum", (2, 3, 4), "sum", dd=True)
class_case("cross_entropy", "dd_none", (3, 4), "none", ls=0.2, dd=True)


# ------------------------------------------------------------ elementwise losses
def pair_case(op, cname, shape, red, dd=False, x=None, y=None):
    a = x if x is not None else randn(*shape)
    b = y if y is not None else (rand(*shape) if op == "bce_logits" else randn(*shape))
    if op == "l1_loss":   # keep |a - b| >= 0.05 (no kink within gradcheck steps)
        d = a - b
        a = torch.where(d.abs() < 0.05, b + 0.1 * torch.sign(d + 1e-9), a)
    field_b = "y" if op == "bce_logits" else "b"
    inputs = [("a" if op != "bce_logits" else "x", a), (field_b, b)]
    fns = {"mse_loss": F.mse_loss, "l1_loss": F.l1_loss,
           "bce_logits": F.binary_cross_entropy_with_logits}

    def fn(p, q):
        return fns[op](p, q, reduction=red)
    case(op + "/" + cname, inputs, fn, [float(RED[red])], [f for f, _ in inputs], dd=dd)


for red in ("mean", "sum", "none"):
    pair_case("mse_loss", red, (3, 4), red)
    pair_case("l1_loss", red, (3, 4), red)
    pair_case("bce_logits", red, (3, 4), red)
pair_case("mse_loss", "3d", (2, 3, 2), "mean")
pair_case("l1_loss", "3d", (2, 1, 4), "sum")
pair_case("bce_logits", "scaled", (4, 5), "mean", x=randn(4, 5) * 6)
pair_case("bce_logits", "large", (2, 4), "none",
          x=torch.tensor([[1e4, -1e4, 50.0, -50.0], [0.0, 88.0, -88.0, 1e3]]),
          y=torch.tensor([[0.0, 1.0, 0.3, 0.7], [0.5, 1.0, 0.0, 0.25]]))
pair_case("bce_logits", "large_mean", (2, 4), "mean",
          x=torch.tensor([[1e4, -1e4, 50.0, -50.0], [0.0, 88.0, -88.0, 1e3]]),
          y=torch.tensor([[1.0, 0.0, 0.3, 0.7], [0.5, 0.0, 1.0, 0.25]]))
pair_case("bce_logits", "dd", (3, 4), "mean", dd=True, x=randn(3, 4) * 2)
pair_case("mse_loss", "dd", (3, 4), "sum", dd=True)


# ------------------------------------------------------------ negative class weights
# (the mean divides by the targets' summed weight: negative here, and in (-1, 0))
class_case("cross_entropy", "negw_mean", (3, 4), "mean", wvals=[-2.0, 1.0, 0.5, 1.5], tvals=[0, 0, 1])
class_case("cross_entropy", "negw_frac_mean", (2, 3), "mean", wvals=[-0.75, 0.25, 1.0], tvals=[0, 1])
class_case("cross_entropy", "negw_ls_mean", (3, 4), "mean", wvals=[-2.0, 1.0, 0.5, 1.5], tvals=[0, 0, 1],
           ls=0.1)
class_case("nll_loss", "negw_frac_mean", (2, 3), "mean", wvals=[-0.75, 0.25, 1.0], tvals=[0, 1])


# ------------------------------------------------------------ write
def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/nn_ops.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
