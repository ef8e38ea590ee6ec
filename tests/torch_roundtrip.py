#!/usr/bin/env python3
"""tests/torch_roundtrip.py DIR - the PyTorch side of tests/test_torch_roundtrip.c
(which runs it; DIR is a directory under build/ that the C test made).

(a) DIR/c_lenet.safetensors (dl_save_module of examples/lenet.c's LeNet-BN,
    trained a few steps in C) loads into the PyTorch twin below with
    safetensors.torch.load_file + load_state_dict(strict=True) (and the same
    dtypes); in eval mode its logits for DIR/input.f32 (float32 (N,1,28,28))
    equal DIR/c_logits.f32 (float32 (N,10)) to rtol 1e-4 (atol 1e-5).
(b) writes DIR/torch_lenet.safetensors (safetensors.torch.save_file of a
    twin's state_dict, trained 2 steps in train mode so the batch-norm
    statistics are not the initial ones) and DIR/torch_logits.f32, its eval
    logits for DIR/input.f32, for the C side to load with dl_load_module.
(c) writes files the C side must refuse with DL_ERR_FORMAT naming the key:
    DIR/missing.safetensors (no "12.bias"), DIR/extra.safetensors (an extra
    "16.weight"), DIR/misshaped.safetensors ("9.weight" of shape (120, 399)).
Prints "FAIL ..." lines and exits 1 on a mismatch; "torch_roundtrip.py: OK" and
exit 0 otherwise.
"""
import os
import sys

import torch
from torch import nn
from safetensors.torch import load_file, save_file


def lenet():
    """examples/lenet.c's make_lenet, layer for layer (state_dict names 0.weight ... 15.bias)"""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(400, 120), nn.BatchNorm1d(120), nn.ReLU(),
        nn.Linear(120, 84), nn.BatchNorm1d(84), nn.ReLU(),
        nn.Linear(84, 10))


def read_f32(path, *shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).clone().reshape(*shape)


def write_f32(path, t):
    with open(path, "wb") as f:
        f.write(t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes())


def main():
    d = sys.argv[1]
    fails = 0
    torch.set_num_threads(1)
    x = read_f32(os.path.join(d, "input.f32"), -1, 1, 28, 28)

    # (a) dl.h -> PyTorch
    sd = load_file(os.path.join(d, "c_lenet.safetensors"))
    model = lenet()
    want = model.state_dict()
    for k, v in sd.items():
        if k in want and v.dtype != want[k].dtype:
            print("FAIL torch_roundtrip.py (a): %s has dtype %s, PyTorch's is %s" % (k, v.dtype, want[k].dtype))
            fails += 1
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        print("FAIL torch_roundtrip.py (a): load_state_dict(strict=True): %s" % str(e).replace("\n", " "))
        return 1
    model.eval()
    with torch.no_grad():
        got = model(x)
    c_logits = read_f32(os.path.join(d, "c_logits.f32"), -1, 10)
    if got.shape != c_logits.shape or not torch.allclose(got, c_logits, rtol=1e-4, atol=1e-5):
        err = (got - c_logits).abs().max().item() if got.shape == c_logits.shape else float("nan")
        print("FAIL torch_roundtrip.py (a): PyTorch's logits of the dl.h checkpoint differ from dl.h's "
              "(max abs diff %g)" % err)
        fails += 1
    if int(sd["1.num_batches_tracked"]) <= 0:
        print("FAIL torch_roundtrip.py (a): 1.num_batches_tracked is %d after training" %
              int(sd["1.num_batches_tracked"]))
        fails += 1

    # (b) PyTorch -> dl.h
    torch.manual_seed(1234)
    model = lenet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(2):
        xb, yb = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        write_f32(os.path.join(d, "torch_logits.f32"), model(x))
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(d, "torch_lenet.safetensors"))

    # (c) files dl_load_module must refuse
    bad = dict(sd)
    del bad["12.bias"]
    save_file(bad, os.path.join(d, "missing.safetensors"))
    bad = dict(sd)
    bad["16.weight"] = torch.ones(3)
    save_file(bad, os.path.join(d, "extra.safetensors"))
    bad = dict(sd)
    bad["9.weight"] = torch.zeros(120, 399)
    save_file(bad, os.path.join(d, "misshaped.safetensors"))

    if fails:
        return 1
    print("torch_roundtrip.py: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
