#!/usr/bin/env python3
"""tests/golden/gen_optim.py - PyTorch reference values for dl.h's optimizers,
LR schedules, gradient clipping and safetensors checkpoints.

Run from the repository root (torch 1.13 or newer):
    python3 tests/golden/gen_optim.py            writes tests/golden/optim.bin and
                                                 tests/golden/torch_written.safetensors
    python3 tests/golden/gen_optim.py --verify FILE
        checks that torch reads a checkpoint written by dl.h
        (tests/test_nn --write FILE writes one).

optim.bin has the format of tests/golden/core.bin (see gen.py): magic
"DLGOLD1\\0", uint32 version 1, uint32 count, then records (uint32 name
length, name, uint32 ndim, int64 shape[ndim], float32 values), little-endian.

RECORDS
    data/x (8,4), data/y (8,3)          the problem: Linear(4,3), loss = mean((x W^T + b - y)^2)
    init/weight (3,4), init/bias (3)    the starting parameters
    <cfg>/hyper                         sgd*:  [lr, momentum, dampening, weight_decay, nesterov]
                                        adam*: [lr, beta1, beta2, eps, weight_decay, amsgrad]
                                        (already rounded to float32, as dl.h stores them)
    <cfg>/weight (10,3,4), <cfg>/bias (10,3)
                                        parameters after each of 10 steps of
                                        zero_grad, forward, backward, step
    <cfg>_skip/...                      the same with steps that leave a parameter out of
                                        the loss (skip_loss: the bias at steps 1, 4, 7, the
                                        weight at step 5): PyTorch 2's zero_grad sets its
                                        grad to None and the step skips it
    clip/max_norm (2), clip/total_norm (2), clip/grad_weight (2,3,4), clip/grad_bias (2,3)
                                        clip_grad_norm_ of the gradients at init
    sched/step (20)                     StepLR(step_size=3, gamma=0.5), base 0.1, epochs 0..19
    sched/cosine (25)                   CosineAnnealingLR(T_max=10, eta_min=0.001), base 0.1
    sched/warmup (10)                   LinearLR(start_factor=1/5, total_iters=4), base 0.1
    torch_written/weight (3,5), torch_written/bias (3)
                                        the Linear(5,3) saved in torch_written.safetensors
<cfg> starts with "sgd", "adamw" or "adam" (the optimizer). The configs use
hyper-parameters rounded to float32 so both sides use identical scalars.
"""
import struct
import goldfile
from goldfile import RECORDS, rec
import sys

import torch





def f32(v):
    return struct.unpack("<f", struct.pack("<f", float(v)))[0]


def problem():
    torch.manual_seed(2024)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(8, 4)
    y = torch.randn(8, 3)
    return lin.weight.detach().clone(), lin.bias.detach().clone(), x, y


def skip_loss(lin, x, y, k):
    """step k's loss of a <cfg>_skip run: some steps leave a parameter out
    (zero_grad sets its grad to None, so the optimizer skips it)"""
    if k % 3 == 1:                          # the bias unused
        return ((x @ lin.weight.t() - y) ** 2).mean()
    if k == 5:                              # the weight unused
        return ((lin.bias - y) ** 2).mean()
    return ((lin(x) - y) ** 2).mean()


def run(cfg, make_opt, w0, b0, x, y, steps=10, skip=False):
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.copy_(w0)
        lin.bias.copy_(b0)
    opt = make_opt(lin.parameters())
    ws, bs = [], []
    for k in range(steps):
        opt.zero_grad()
        loss = skip_loss(lin, x, y, k) if skip else ((lin(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        ws.append(lin.weight.detach().clone())
        bs.append(lin.bias.detach().clone())
    rec(cfg + "/weight", torch.stack(ws))
    rec(cfg + "/bias", torch.stack(bs))


def optim_cases(w0, b0, x, y):
    sgd = [  # name, lr, momentum, dampening, weight_decay, nesterov
        ("sgd_plain", 0.1, 0.0, 0.0, 0.0, False),
        ("sgd_momentum", 0.1, 0.9, 0.0, 0.0, False),
        ("sgd_dampening", 0.1, 0.9, 0.3, 0.0, False),
        ("sgd_nesterov", 0.05, 0.9, 0.0, 0.0, True),
        ("sgd_weight_decay", 0.1, 0.0, 0.0, 0.1, False),
        ("sgd_all", 0.05, 0.8, 0.0, 0.05, True),
    ]
    for name, lr, mom, damp, wd, nest in sgd:
        lr, mom, damp, wd = f32(lr), f32(mom), f32(damp), f32(wd)
        rec(name + "/hyper", [lr, mom, damp, wd, 1.0 if nest else 0.0])
        make = lambda p: torch.optim.SGD(p, lr=lr, momentum=mom, dampening=damp, weight_decay=wd,
                                         nesterov=nest)
        run(name, make, w0, b0, x, y)
        if name in ("sgd_dampening", "sgd_all"):
            rec(name + "_skip/hyper", [lr, mom, damp, wd, 1.0 if nest else 0.0])
            run(name + "_skip", make, w0, b0, x, y, skip=True)
    adam = [  # name, lr, beta1, beta2, eps, weight_decay, amsgrad
        ("adam_default", 1e-3, 0.9, 0.999, 1e-8, 0.0, False),
        ("adam_lr", 0.05, 0.9, 0.999, 1e-8, 0.0, False),
        ("adam_weight_decay", 0.05, 0.9, 0.999, 1e-8, 0.1, False),
        ("adam_amsgrad", 0.05, 0.8, 0.99, 1e-6, 0.0, True),
        ("adamw_wd", 0.05, 0.9, 0.999, 1e-8, 0.01, False),
        ("adamw_amsgrad", 0.05, 0.85, 0.995, 1e-8, 0.1, True),
    ]
    for name, lr, b1, b2, eps, wd, ams in adam:
        lr, b1, b2, eps, wd = f32(lr), f32(b1), f32(b2), f32(eps), f32(wd)
        rec(name + "/hyper", [lr, b1, b2, eps, wd, 1.0 if ams else 0.0])
        cls = torch.optim.AdamW if name.startswith("adamw") else torch.optim.Adam
        make = lambda p: cls(p, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, amsgrad=ams)
        run(name, make, w0, b0, x, y)
        if name in ("adam_weight_decay", "adam_amsgrad", "adamw_amsgrad"):
            rec(name + "_skip/hyper", [lr, b1, b2, eps, wd, 1.0 if ams else 0.0])
            run(name + "_skip", make, w0, b0, x, y, skip=True)


def clip_cases(w0, b0, x, y):
    norms, gws, gbs = [], [], []
    for max_norm in (0.5, 100.0):
        lin = torch.nn.Linear(4, 3)
        with torch.no_grad():
            lin.weight.copy_(w0)
            lin.bias.copy_(b0)
        ((lin(x) - y) ** 2).mean().backward()
        total = torch.nn.utils.clip_grad_norm_(lin.parameters(), max_norm)
        norms.append(float(total))
        gws.append(lin.weight.grad.clone())
        gbs.append(lin.bias.grad.clone())
    rec("clip/max_norm", [0.5, 100.0])
    rec("clip/total_norm", norms)
    rec("clip/grad_weight", torch.stack(gws))
    rec("clip/grad_bias", torch.stack(gbs))


def sched_values(make, n):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    s = make(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


def sched_cases():
    L = torch.optim.lr_scheduler
    rec("sched/step", sched_values(lambda o: L.StepLR(o, step_size=3, gamma=0.5), 20))
    rec("sched/cosine", sched_values(lambda o: L.CosineAnnealingLR(o, T_max=10, eta_min=0.001), 25))
    rec("sched/warmup", sched_values(
        lambda o: L.LinearLR(o, start_factor=1.0 / 5, end_factor=1.0, total_iters=4), 10))


def write_safetensors_by_hand(tensors, path, metadata=None):
    """safetensors format: u64 LE header length, JSON header, raw LE data"""
    import json
    header, data, off = {}, [], 0
    for k, t in tensors.items():
        b = t.contiguous().numpy().astype("<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        data.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(data))


def torch_written(path):
    torch.manual_seed(7)
    lin = torch.nn.Linear(5, 3)
    sd = {k: v.detach().contiguous() for k, v in lin.state_dict().items()}
    try:
        from safetensors.torch import save_file
        save_file(sd, path)
        how = "safetensors.torch.save_file"
    except ImportError:
        write_safetensors_by_hand(sd, path)
        how = "a hand-written writer (safetensors is not installed)"
    print("%s: Linear(5,3) state_dict written with %s" % (path, how))
    rec("torch_written/weight", sd["weight"])
    rec("torch_written/bias", sd["bias"])


def verify(path):
    """torch reads a dl.h checkpoint (written by test_nn --write PATH)"""
    from safetensors import safe_open
    from safetensors.torch import load_file
    sd = load_file(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    print("tensors:", {k: (str(v.dtype), tuple(v.shape)) for k, v in sd.items()})
    print("metadata:", meta)
    assert meta.get("format") == "pt", meta
    assert meta.get("dl.optim") == "sgd", meta
    lin = torch.nn.Linear(5, 3)
    lin.load_state_dict({k: v for k, v in sd.items() if not k.startswith("optim.")}, strict=True)
    want_w = torch.arange(15, dtype=torch.float32).reshape(3, 5) * 0.125 - 1.0
    want_b = torch.tensor([0.5, -0.25, 2.0])
    assert torch.equal(lin.weight.detach(), want_w), lin.weight
    assert torch.equal(lin.bias.detach(), want_b), lin.bias
    assert sd["optim.step"].dtype == torch.int64 and sd["optim.step"].dim() == 0
    assert int(sd["optim.step"]) == 2 and int(sd["optim.weight.step"]) == 2
    # SGD momentum 0.5, lr 0.1, constant grads g: buffer after 2 steps = g*(1+0.5)
    assert torch.allclose(sd["optim.weight.momentum_buffer"], torch.full((3, 5), 1.5)), sd
    assert torch.allclose(sd["optim.bias.momentum_buffer"], torch.full((3,), 1.5)), sd
    print("OK: torch read %s (%d tensors)" % (path, len(sd)))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--verify":
        verify(sys.argv[2])
        return
    w0, b0, x, y = problem()
    rec("data/x", x)
    rec("data/y", y)
    rec("init/weight", w0)
    rec("init/bias", b0)
    optim_cases(w0, b0, x, y)
    clip_cases(w0, b0, x, y)
    sched_cases()
    torch_written("tests/golden/torch_written.safetensors")
    goldfile.write(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/optim.bin", RECORDS)


if __name__ == "__main__":
    main()
