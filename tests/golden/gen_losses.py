#!/usr/bin/env python3
"""tests/golden/gen_losses.py - PyTorch golden values for dl.h's newer losses
(smooth_l1, huber, binary_cross_entropy, binary_cross_entropy_with_logits
with weight and pos_weight, kl_div), read by tests/test_nn_ops.c next to
nn_ops.bin (same runner: tests/golden.h).

Run from the repository root:   python3 tests/golden/gen_losses.py [out.bin]
(default output: tests/golden/losses.bin). Deterministic: torch.manual_seed(8642),
CPU, float32.

FILE FORMAT: tests/golden/goldfile.py (magic "DLGOLD1\\0", version 1, records).

RECORD NAMES "<op>/<case>/<field>", a case's records consecutive:
    inputs        a, b (smooth_l1_loss, huber_loss: input, target)
                  p, y, w (binary_cross_entropy: probabilities, target, weight)
                  x, y, w, pw (bce_logits: logits, target, weight, pos_weight)
                  x, y (kl_div: input log-probabilities, target)
                  (never "target": tests/golden.h reads that field as class indices)
                  weights never require grad (PyTorch refuses a grad for them)
    params        [reduction, option]
                    smooth_l1_loss  option = beta: 0.0 PyTorch's default (dl.h's zero
                                    field), -0.0 an explicit beta=0 (L1)
                    huber_loss      option = delta: 0.0 PyTorch's default
                    binary_cross_entropy, bce_logits   [reduction]
                    kl_div          option = log_target (0/1)
                  reduction: 0 mean, 1 sum, 2 none, 3 batchmean (dl_reduction)
    gout, v_<f>, out, grad_<f>, hv_<f>   as gen_nn_ops.py (goldfile.record_grads)
"""
import math
import sys
import warnings

import goldfile
from goldfile import rec, randn, record_grads

import torch
import torch.nn.functional as F

torch.manual_seed(8642)
torch.set_grad_enabled(True)
# kl_div's reduction='mean' warning (the mean is what is tested)
warnings.filterwarnings("ignore", message="reduction: 'mean' divides")

RED = {"mean": 0, "sum": 1, "none": 2, "batchmean": 3}
REDS = ("mean", "sum", "none")


def rand(*s):
    return torch.rand(tuple(s), dtype=torch.float32)


def case(name, inputs, fn, params, grad, dd=False):
    """inputs: list of (field, tensor); grad: the fields that require grad."""
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


# ------------------------------------------------------------ smooth L1 and Huber
def away_from(a, b, c):
    """a moved so that |a - b| is at least 0.05 away from the kink c (and from 0)"""
    d = a - b
    bad = ((d.abs() - c).abs() < 0.05) | (d.abs() < 0.05)
    return torch.where(bad, b + torch.sign(d + 1e-9) * (c + 0.2), a)


def piecewise_case(op, cname, shape, red, opt, dd=False, scale=1.5):
    """opt: beta / delta; 0.0 means the default (the keyword is not passed),
    -0.0 an explicit zero"""
    explicit = not (opt == 0.0 and math.copysign(1.0, opt) > 0)
    kink = opt if explicit else 1.0
    b = randn(*shape) * scale
    a = away_from(randn(*shape) * scale, b, kink)
    kw = {}
    if explicit:
        kw["beta" if op == "smooth_l1_loss" else "delta"] = float(opt)
    f = F.smooth_l1_loss if op == "smooth_l1_loss" else F.huber_loss

    def fn(p, q):
        return f(p, q, reduction=red, **kw)
    case(op + "/" + cname, [("a", a), ("b", b)], fn, [float(RED[red]), opt], ["a", "b"], dd=dd)


for red in REDS:
    piecewise_case("smooth_l1_loss", "default_" + red, (3, 4), red, 0.0)
    piecewise_case("smooth_l1_loss", "beta05_" + red, (3, 4), red, 0.5)
    piecewise_case("smooth_l1_loss", "beta2_" + red, (2, 3, 2), red, 2.0, scale=2.5)
    piecewise_case("smooth_l1_loss", "beta0_" + red, (3, 4), red, -0.0)
    piecewise_case("huber_loss", "default_" + red, (3, 4), red, 0.0)
    piecewise_case("huber_loss", "delta05_" + red, (3, 4), red, 0.5)
    piecewise_case("huber_loss", "delta3_" + red, (2, 3, 2), red, 3.0, scale=3.0)
piecewise_case("smooth_l1_loss", "dd_default", (3, 4), "mean", 0.0, dd=True)
piecewise_case("smooth_l1_loss", "dd_beta05", (4, 3), "sum", 0.5, dd=True)
piecewise_case("smooth_l1_loss", "dd_beta0", (3, 4), "none", -0.0, dd=True)
piecewise_case("huber_loss", "dd_default", (3, 4), "mean", 0.0, dd=True)
piecewise_case("huber_loss", "dd_delta3", (4, 3), "none", 3.0, dd=True, scale=3.0)


# ------------------------------------------------------------ binary cross entropy (probabilities)
def probs(*s):
    return rand(*s) * 0.96 + 0.02      # in (0.02, 0.98)


def bce_case(cname, shape, red, wshape=None, dd=False):
    inputs = [("p", probs(*shape)), ("y", rand(*shape))]
    if wshape is not None:
        inputs.append(("w", rand(*wshape) + 0.5))

    def fn(p, y, w=None):
        return F.binary_cross_entropy(p, y, weight=w, reduction=red)
    case("binary_cross_entropy/" + cname, inputs, fn, [float(RED[red])], ["p", "y"], dd=dd)


for red in REDS:
    bce_case(red, (3, 4), red)
    bce_case("w_" + red, (3, 4), red, wshape=(4,))
    bce_case("wcol_" + red, (3, 4), red, wshape=(3, 1))
    bce_case("wfull_3d_" + red, (2, 3, 2), red, wshape=(2, 3, 2))
bce_case("dd", (3, 4), "mean", dd=True)
bce_case("dd_w_sum", (3, 4), "sum", wshape=(4,), dd=True)
bce_case("dd_w_none", (2, 5), "none", wshape=(2, 1), dd=True)
# p exactly 0 or 1: each log clamped to >= -100 (forward only; PyTorch's
# gradient there is its own epsilon rule)
case("binary_cross_entropy/edges", [("p", torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5, 1e-30])),
                                    ("y", torch.tensor([1.0, 0.0, 0.0, 1.0, 0.25, 1.0]))],
     lambda p, y: F.binary_cross_entropy(p, y, reduction="none"), [float(RED["none"])], [])


# ------------------------------------------------------------ bce with logits: weight, pos_weight
def bcel_case(cname, shape, red, wshape=None, pwshape=None, dd=False, scale=2.0):
    inputs = [("x", randn(*shape) * scale), ("y", rand(*shape))]
    if wshape is not None:
        inputs.append(("w", rand(*wshape) + 0.5))
    if pwshape is not None:
        inputs.append(("pw", rand(*pwshape) * 3 + 0.2))
    fields = [f for f, _ in inputs]

    def fn(*ts):
        d = dict(zip(fields, ts))
        return F.binary_cross_entropy_with_logits(d["x"], d["y"], weight=d.get("w"),
                                                  pos_weight=d.get("pw"), reduction=red)
    case("bce_logits/" + cname, inputs, fn, [float(RED[red])], ["x", "y"], dd=dd)


for red in REDS:
    bcel_case("w_" + red, (3, 4), red, wshape=(4,))
    bcel_case("pw_" + red, (3, 4), red, pwshape=(4,))
    bcel_case("w_pw_" + red, (5, 3), red, wshape=(5, 1), pwshape=(3,))
    bcel_case("w_pw_full_" + red, (3, 4), red, wshape=(3, 4), pwshape=(4,))
    bcel_case("pw_3d_" + red, (2, 3, 4), red, wshape=(4,), pwshape=(3, 1))
bcel_case("w_pw_large", (2, 4), "sum", wshape=(4,), pwshape=(4,), scale=40.0)
bcel_case("dd_w_pw", (3, 4), "mean", wshape=(4,), pwshape=(4,), dd=True)
bcel_case("dd_pw_none", (4, 3), "none", pwshape=(3,), dd=True)


# ------------------------------------------------------------ KL divergence
def kl_case(cname, shape, red, log_target, dd=False, zeros=0):
    inp = torch.log_softmax(randn(*shape) * 1.5, 1)
    tgt = torch.softmax(randn(*shape) * 1.5, 1)
    grad = ["x", "y"]
    if zeros:   # some targets exactly 0: xlogy gives 0; PyTorch's target grad there is NaN
        flat = tgt.reshape(-1).clone()
        flat[torch.randperm(flat.numel())[:zeros]] = 0.0
        tgt = flat.reshape(shape)
        grad = ["x"]
    if log_target:
        tgt = torch.log(tgt)

    def fn(x, y):
        return F.kl_div(x, y, reduction=red, log_target=log_target)
    case("kl_div/" + cname, [("x", inp), ("y", tgt)], fn, [float(RED[red]), float(log_target)], grad,
         dd=dd)


for lt in (False, True):
    for red in ("mean", "sum", "none", "batchmean"):
        kl_case(("logt_" if lt else "") + red, (3, 5), red, lt)
    kl_case(("logt_" if lt else "") + "3d_batchmean", (2, 3, 4), "batchmean", lt)
    kl_case(("logt_" if lt else "") + "dd_batchmean", (4, 3), "batchmean", lt, dd=True)
    kl_case(("logt_" if lt else "") + "dd_none", (2, 4), "none", lt, dd=True)
kl_case("zeros_sum", (3, 4), "sum", False, zeros=3)
kl_case("zeros_none", (3, 4), "none", False, zeros=4)


# infinite logits, per element: PyTorch's form (1 - y) x - log_sigmoid(x) gives
# +inf at x = +inf (y < 1) and NaN at x = -inf or at y = 1, x = +-inf; with
# pos_weight (> 1 here: at x = -inf and pos_weight <= 1 the target's gradient
# is NaN in dl.h's composite, +inf in PyTorch's fused rule)
INF = float("inf")
xi = torch.tensor([[INF, -INF, INF, -INF, INF, -INF, 3.0, -3.0, 0.0]] * 2)
yi = torch.tensor([[0.5, 0.5, 0.0, 0.0, 1.0, 1.0, 0.5, 0.25, 1.0], [0.0, 1.0, 0.5, 0.75, 0.0, 1.0, 1.0, 0.0, 0.5]])
case("bce_logits/inf_none", [("x", xi), ("y", yi)],
     lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none"), [float(RED["none"])], ["x", "y"])
pwi = torch.tensor([2.0, 1.5, 3.0, 1.5, 2.0, 2.0, 0.5, 4.0, 1.25])
case("bce_logits/inf_pw_none", [("x", xi), ("y", yi), ("pw", pwi)],
     lambda x, y, pw: F.binary_cross_entropy_with_logits(x, y, pos_weight=pw, reduction="none"),
     [float(RED["none"])], ["x", "y"])


# special values, per element: NaN, +-inf, +-1e38 in the logits and the
# differences (a NaN difference's gradient is NaN in smooth_l1 and huber,
# as PyTorch's kernels, 0 in l1 as its sign), p at 0 and 1, -inf
# log-probabilities. (layer_norm of a row holding +-1e38 is left out:
# PyTorch's float variance overflows to NaN there, dl.h's is finite.)
NAN = float("nan")
X = torch.tensor([[INF, 0., 1.], [-INF, 0., 1.], [NAN, 0., 1.], [-INF, -INF, 0.], [INF, INF, 0.],
                  [1e38, -1e38, 0.], [-INF, -INF, -INF], [0., 0., 0.]])
T = torch.tensor([0, 0, 1, 2, 2, 1, 0, 2]).float()
for red in ("none", "sum"):
    for ls in (0.0, 0.1):
        case("cross_entropy/special_%s_ls%g" % (red, ls), [("x", X), ("target", T)],
             lambda x, t, red=red, ls=ls: F.cross_entropy(x, t.long(), reduction=red, label_smoothing=ls),
             [float(RED[red]), -100.0, ls], ["x"])
    case("nll_loss/special_" + red, [("x", X), ("target", T)],
         lambda x, t, red=red: F.nll_loss(x, t.long(), reduction=red), [float(RED[red]), -100.0, 0.0], ["x"])
S = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1e38, -1e38, 1.0, -1.0, 0.5, 2.0])
SA, SB = S.repeat(S.numel()), S.repeat_interleave(S.numel())
case("mse_loss/special", [("a", SA), ("b", SB)], lambda a, b: F.mse_loss(a, b, reduction="none"),
     [float(RED["none"])], ["a", "b"])
case("l1_loss/special", [("a", SA), ("b", SB)], lambda a, b: F.l1_loss(a, b, reduction="none"),
     [float(RED["none"])], ["a", "b"])
case("smooth_l1_loss/special", [("a", SA), ("b", SB)], lambda a, b: F.smooth_l1_loss(a, b, reduction="none"),
     [float(RED["none"]), 0.0], ["a", "b"])
case("huber_loss/special", [("a", SA), ("b", SB)], lambda a, b: F.huber_loss(a, b, reduction="none"),
     [float(RED["none"]), 0.0], ["a", "b"])
case("binary_cross_entropy/special",
     [("p", torch.tensor([0.0, 1.0, 0.5, 1e-30, 1 - 1e-7, 0.0, 1.0])),
      ("y", torch.tensor([0.0, 1.0, 0.5, 1.0, 0.0, 1.0, 0.0]))],
     lambda p, y: F.binary_cross_entropy(p, y, reduction="none"), [float(RED["none"])], ["p", "y"])
case("kl_div/special", [("x", torch.tensor([[-INF, 0.0, -1.0], [0.0, -INF, -0.5], [NAN, -1.0, -2.0]])),
                        ("y", torch.tensor([[0.0, 1.0, 0.5], [0.5, 0.0, 0.2], [0.3, 0.3, 0.0]]))],
     lambda x, y: F.kl_div(x, y, reduction="none"), [float(RED["none"]), 0.0], ["x"])


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/losses.bin"
    goldfile.write(path, goldfile.RECORDS)


if __name__ == "__main__":
    main()
