#!/usr/bin/env python3
"""tests/golden/gen_defaults.py - PyTorch values for "a zeroed desc means
PyTorch's defaults" and for optimizer parameter groups, read by
tests/test_defaults.c.

Run from the repository root:   python3 tests/golden/gen_defaults.py [out.bin]
(default output: tests/golden/defaults.bin). Deterministic: torch.manual_seed(1357),
CPU, float32. FILE FORMAT: tests/golden/goldfile.py.

1. OPS, "<op>/<variant>/<field>", run by tests/golden.h's runner (inputs,
   params, gout, out, grad_<input>). PyTorch is called with its defaults
   (variant "default": no keyword arguments beyond the ones named below) or
   with the keywords that the C side's designated initializer sets:
     cross_entropy   x, target (with -100s: ignored by default)
                     default | sum {.reduction = SUM} | none | ls {.label_smoothing = 0.1f}
                     | ignore1 {.has_ignore_index = true, .ignore_index = 1}
     nll_loss        x, target (with -100s)       default | none
     mse_loss, l1_loss   a, b                      default | sum
     smooth_l1_loss  a, b     default (beta 1) | beta05 {.beta = 0.5f} | beta0 {.beta = -0.0f}
     huber_loss      a, b     default (delta 1) | delta2_sum {.delta = 2, .reduction = SUM}
     binary_cross_entropy  p, y, w       default | w {.weight = w}
     bce_logits      x, y, pw            default | pw {.pos_weight = pw}
     kl_div          x, y     default (mean, log_target False) | batchmean | logt {.log_target = true}
     avg_pool2d      x        default {.kernel = 3, .padding = 1}: stride = kernel,
                              count_include_pad True | k2 {.kernel = 2} | ceil
                              {.kernel = 3, .stride = 2, .padding = 1, .ceil_mode = true}
                              | nocip {.kernel = 3, .padding = 1, .no_count_include_pad = true}
     max_pool2d      x        default {.kernel = 2} | k3p1 {.kernel = 3, .padding = 1}
                              | dil {.kernel = 3, .stride = 1, .dilation = 2}
     conv2d          x, w, b  default | pad1 {.padding = 1} | stride2 {.stride = 2}
                              | groups2 {.groups = 2} | same {.padding_same = true}
                              | dil2 {.dilation = 2, .padding = 2}
   params is [0] (unused; the variant is in the name).

2. OPTIMIZER DEFAULTS, "optim/...": the Linear(4,3) problem of gen_optim.py
   (loss mean((x W^T + b - y)^2)):
     optim/data/x (8,4), optim/data/y (8,3), optim/init/weight (3,4), optim/init/bias (3)
     optim/<cfg>/weight (3,3,4), optim/<cfg>/bias (3,3)   after each of 3 steps
   cfg: sgd_default SGD() (lr 1e-3) | adam_default Adam() | adamw_default AdamW()
     (weight_decay 0.01) | sgd_lr01 SGD(lr=0.1) | sgd_momentum SGD(lr=0.1, momentum=0.9)
     | sgd_maximize SGD(lr=0.1, maximize=True) | adam_lr Adam(lr=0.01)
     | adam_beta1_zero Adam(betas=(0, 0.999)) | adam_beta2_zero Adam(lr=0.01, betas=(0.9, 0))
     | adam_eps_zero Adam(lr=0.01, eps=0) | adam_maximize Adam(maximize=True)
     | adamw_wd_zero AdamW(weight_decay=0)

3. PARAMETER GROUPS, "groups/...": Sequential(Linear(4,6), Tanh, Linear(6,3)),
   W = [0.weight, 2.weight], B = [0.bias, 2.bias], loss mean((net(x) - y)^2):
     groups/data/x (8,4), groups/data/y (8,3), groups/init/<param>
     groups/<cfg>/<param> (5, shape)   after each of 5 steps
     groups/<cfg>/lr (5, 2)            each group's lr during each step
   cfg (hyper-parameters already float32 values, as dl.h stores them):
     sgd_momentum   SGD([{W}, {B, lr .2, wd 0}], lr .05, momentum .9, wd .01), LambdaLR
     sgd_nesterov   SGD([{W, lr .02, wd .05}, {B}], lr .1, momentum .8, nesterov, wd .001), LambdaLR
     adam           Adam([{W}, {B, lr .003, wd 0}], lr .01, wd .02), LambdaLR
     adamw_decay    AdamW([{W}, {B, lr .02, wd 0}], lr .01) (wd 0.01), LambdaLR
     adamw_amsgrad  AdamW([{B, lr .005}, {W, wd .1}], lr .01, betas (.8, .99), amsgrad), LambdaLR
     sgd_group_lr   SGD([{W}, {B, lr .1}], lr .05, momentum .9), no scheduler: group 1's lr
                    set to .02 before step 3, group 0's to .01 before step 4
   LambdaLR factors FACTORS[e] (e = steps taken), lr = initial_lr * factor per group.
"""
import struct
import sys
import warnings

import goldfile
from goldfile import rec, randn, record_grads

import torch
import torch.nn.functional as F

torch.manual_seed(1357)
torch.set_grad_enabled(True)

FACTORS = [1.0, 0.5, 0.75, 0.25, 0.125, 0.0625]


def f32(v):
    return struct.unpack("<f", struct.pack("<f", float(v)))[0]


def rand(*s):
    return torch.rand(tuple(s), dtype=torch.float32)


def case(name, inputs, fn, grad):
    ts = []
    for f, t in inputs:
        t = t.detach().clone().to(torch.float32)
        rec(name + "/" + f, t)
        if f in grad:
            t.requires_grad_(True)
        ts.append(t)
    rec(name + "/params", torch.tensor([0.0]))
    req = [t for (f, _), t in zip(inputs, ts) if f in grad]
    reqf = [f for f, _ in inputs if f in grad]
    record_grads(name, fn(*ts), req, reqf)


# ------------------------------------------------------------ 1. ops with default descs
def targets(n, C, nign, ignore=-100):
    t = torch.randint(0, C, (n,))
    t[torch.randperm(n)[:nign]] = ignore
    return t.float()


for v, kw in (("default", {}), ("sum", {"reduction": "sum"}), ("none", {"reduction": "none"}),
              ("ls", {"label_smoothing": f32(0.1)})):
    case("cross_entropy/" + v, [("x", randn(6, 5)), ("target", targets(6, 5, 2))],
         lambda x, t, kw=kw: F.cross_entropy(x, t.long(), **kw), ["x"])
case("cross_entropy/ignore1", [("x", randn(6, 4)), ("target", targets(6, 4, 0))],
     lambda x, t: F.cross_entropy(x, t.long(), ignore_index=1), ["x"])
for v, kw in (("default", {}), ("none", {"reduction": "none"})):
    case("nll_loss/" + v, [("x", torch.log_softmax(randn(7, 4), 1)), ("target", targets(7, 4, 2))],
         lambda x, t, kw=kw: F.nll_loss(x, t.long(), **kw), ["x"])
for op, f in (("mse_loss", F.mse_loss), ("l1_loss", F.l1_loss)):
    for v, kw in (("default", {}), ("sum", {"reduction": "sum"})):
        b = randn(3, 4)
        a = b + (rand(3, 4) * 1.5 + 0.1) * torch.sign(randn(3, 4))   # |a - b| >= 0.1
        case(op + "/" + v, [("a", a), ("b", b)], lambda p, q, f=f, kw=kw: f(p, q, **kw), ["a", "b"])


def piecewise(kink):
    """a, b with |a - b| >= 0.1 away from 0 and from the kink"""
    b = randn(3, 4) * 1.5
    d = rand(3, 4) * 2.5 + 0.1
    d = torch.where((d - kink).abs() < 0.1, d + 0.25, d)
    return b + d * torch.sign(randn(3, 4)), b


for v, kw, kink in (("default", {}, 1.0), ("beta05", {"beta": 0.5}, 0.5), ("beta0", {"beta": 0.0}, 0.0)):
    a, b = piecewise(kink)
    case("smooth_l1_loss/" + v, [("a", a), ("b", b)],
         lambda p, q, kw=kw: F.smooth_l1_loss(p, q, **kw), ["a", "b"])
for v, kw, kink in (("default", {}, 1.0), ("delta2_sum", {"delta": 2.0, "reduction": "sum"}, 2.0)):
    a, b = piecewise(kink)
    case("huber_loss/" + v, [("a", a), ("b", b)], lambda p, q, kw=kw: F.huber_loss(p, q, **kw),
         ["a", "b"])
for v in ("default", "w"):
    p = rand(3, 4) * 0.9 + 0.05
    inputs = [("p", p), ("y", rand(3, 4))] + ([("w", rand(4) + 0.5)] if v == "w" else [])
    case("binary_cross_entropy/" + v, inputs,
         lambda p, y, w=None: F.binary_cross_entropy(p, y, weight=w), ["p", "y"])
for v in ("default", "pw"):
    inputs = [("x", randn(3, 4) * 2), ("y", rand(3, 4))] + ([("pw", rand(4) * 2 + 0.5)] if v == "pw" else [])
    case("bce_logits/" + v, inputs,
         lambda x, y, pw=None: F.binary_cross_entropy_with_logits(x, y, pos_weight=pw), ["x", "y"])
for v, kw in (("default", {}), ("batchmean", {"reduction": "batchmean"}), ("logt", {"log_target": True})):
    x = torch.log_softmax(randn(3, 5), 1)
    y = torch.softmax(randn(3, 5), 1)
    if v == "logt":
        y = torch.log(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # kl_div's reduction='mean' warning
        case("kl_div/" + v, [("x", x), ("y", y)], lambda p, q, kw=kw: F.kl_div(p, q, **kw), ["x", "y"])

for v, kw in (("default", dict(kernel_size=3, padding=1)), ("k2", dict(kernel_size=2)),
              ("ceil", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
              ("nocip", dict(kernel_size=3, padding=1, count_include_pad=False))):
    case("avg_pool2d/" + v, [("x", randn(2, 3, 7, 8))], lambda x, kw=kw: F.avg_pool2d(x, **kw), ["x"])
for v, kw in (("default", dict(kernel_size=2)), ("k3p1", dict(kernel_size=3, padding=1)),
              ("dil", dict(kernel_size=3, stride=1, dilation=2))):
    case("max_pool2d/" + v, [("x", randn(2, 3, 7, 8))], lambda x, kw=kw: F.max_pool2d(x, **kw), ["x"])
for v, kw in (("default", {}), ("pad1", dict(padding=1)), ("stride2", dict(stride=2)),
              ("groups2", dict(groups=2)), ("same", dict(padding="same")),
              ("dil2", dict(dilation=2, padding=2))):
    cin = 4 if v == "groups2" else 2
    wcin = cin // 2 if v == "groups2" else cin
    case("conv2d/" + v, [("x", randn(2, cin, 7, 6)), ("w", randn(4, wcin, 3, 3) * 0.5), ("b", randn(4))],
         lambda x, w, b, kw=kw: F.conv2d(x, w, b, **kw), ["x", "w", "b"])


# ------------------------------------------------------------ 2. optimizer defaults
def optim_defaults():
    torch.manual_seed(2024)
    lin = torch.nn.Linear(4, 3)
    w0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    rec("optim/data/x", x)
    rec("optim/data/y", y)
    rec("optim/init/weight", w0)
    rec("optim/init/bias", b0)
    O = torch.optim
    cfgs = [
        ("sgd_default", lambda p: O.SGD(p)),
        ("adam_default", lambda p: O.Adam(p)),
        ("adamw_default", lambda p: O.AdamW(p)),
        ("sgd_lr01", lambda p: O.SGD(p, lr=f32(0.1))),
        ("sgd_momentum", lambda p: O.SGD(p, lr=f32(0.1), momentum=f32(0.9))),
        ("sgd_maximize", lambda p: O.SGD(p, lr=f32(0.1), maximize=True)),
        ("adam_lr", lambda p: O.Adam(p, lr=f32(0.01))),
        ("adam_beta1_zero", lambda p: O.Adam(p, betas=(0.0, f32(0.999)))),
        ("adam_beta2_zero", lambda p: O.Adam(p, lr=f32(0.01), betas=(f32(0.9), 0.0))),
        ("adam_eps_zero", lambda p: O.Adam(p, lr=f32(0.01), eps=0.0)),
        ("adam_maximize", lambda p: O.Adam(p, maximize=True)),
        ("adamw_wd_zero", lambda p: O.AdamW(p, weight_decay=0.0)),
    ]
    for name, make in cfgs:
        lin = torch.nn.Linear(4, 3)
        with torch.no_grad():
            lin.weight.copy_(w0)
            lin.bias.copy_(b0)
        opt = make(lin.parameters())
        ws, bs = [], []
        for _ in range(3):
            opt.zero_grad()
            ((lin(x) - y) ** 2).mean().backward()
            opt.step()
            ws.append(lin.weight.detach().clone())
            bs.append(lin.bias.detach().clone())
        rec("optim/%s/weight" % name, torch.stack(ws))
        rec("optim/%s/bias" % name, torch.stack(bs))


# ------------------------------------------------------------ 3. parameter groups
def groups():
    torch.manual_seed(99)
    net0 = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    init = {k: v.detach().clone() for k, v in net0.state_dict().items()}
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    rec("groups/data/x", x)
    rec("groups/data/y", y)
    for k, v in init.items():
        rec("groups/init/" + k, v)
    O = torch.optim
    cfgs = [  # name, make(W, B), scheduler?
        ("sgd_momentum", lambda W, B: O.SGD([{"params": W}, {"params": B, "lr": f32(0.2), "weight_decay": 0.0}],
                                            lr=f32(0.05), momentum=f32(0.9), weight_decay=f32(0.01)), True),
        ("sgd_nesterov", lambda W, B: O.SGD([{"params": W, "lr": f32(0.02), "weight_decay": f32(0.05)},
                                             {"params": B}], lr=f32(0.1), momentum=f32(0.8), nesterov=True,
                                            weight_decay=f32(0.001)), True),
        ("adam", lambda W, B: O.Adam([{"params": W}, {"params": B, "lr": f32(0.003), "weight_decay": 0.0}],
                                     lr=f32(0.01), weight_decay=f32(0.02)), True),
        ("adamw_decay", lambda W, B: O.AdamW([{"params": W}, {"params": B, "lr": f32(0.02), "weight_decay": 0.0}],
                                             lr=f32(0.01)), True),
        ("adamw_amsgrad", lambda W, B: O.AdamW([{"params": B, "lr": f32(0.005)},
                                                {"params": W, "weight_decay": f32(0.1)}],
                                               lr=f32(0.01), betas=(f32(0.8), f32(0.99)), amsgrad=True), True),
        ("sgd_group_lr", lambda W, B: O.SGD([{"params": W}, {"params": B, "lr": f32(0.1)}], lr=f32(0.05),
                                            momentum=f32(0.9)), False),
    ]
    for name, make, sched in cfgs:
        net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
        net.load_state_dict(init)
        W = [net[0].weight, net[2].weight]
        B = [net[0].bias, net[2].bias]
        opt = make(W, B)
        s = O.lr_scheduler.LambdaLR(opt, lambda e: FACTORS[e]) if sched else None
        hist = {k: [] for k in init}
        lrs = []
        for step in range(5):
            if name == "sgd_group_lr" and step == 2:
                opt.param_groups[1]["lr"] = f32(0.02)
            if name == "sgd_group_lr" and step == 3:
                opt.param_groups[0]["lr"] = f32(0.01)
            lrs.append([g["lr"] for g in opt.param_groups])
            opt.zero_grad()
            ((net(x) - y) ** 2).mean().backward()
            opt.step()
            if s:
                s.step()
            for k, v in net.state_dict().items():
                hist[k].append(v.detach().clone())
        for k in init:
            rec("groups/%s/%s" % (name, k), torch.stack(hist[k]))
        rec("groups/%s/lr" % name, torch.tensor(lrs, dtype=torch.float64))


optim_defaults()
groups()


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/defaults.bin"
    goldfile.write(path, goldfile.RECORDS)


if __name__ == "__main__":
    main()
