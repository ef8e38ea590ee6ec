#!/usr/bin/env python3
"""tests/golden/gen_noaffine.py - PyTorch's side of dl_nn_norm_no_affine
(BatchNorm*d(affine=False), LayerNorm(elementwise_affine=False)), read by
tests/test_nn.c:

    tests/golden/noaffine.safetensors  the state_dict (safetensors.torch.save_file)
                                       of the model below after 3 SGD steps
                                       in train mode (so the running
                                       statistics are not the initial ones):
                                       no weight or bias for the three norms
    tests/golden/noaffine.bin          (the format of gen.py's files)
        x (4,1,6,6)        an input
        eval (4,8)         the loaded model's output in eval mode
        gout (4,8)         a gradient for the train-mode output
        train (4,8)        the output in train mode (batch statistics)
        grad_x (4,1,6,6)   x's gradient of train . gout
        rm1 (8)            the last BatchNorm1d's running_mean after that
                           train-mode forward (momentum 0.1)

The model: Sequential(Conv2d(1,3,3), BatchNorm2d(3, affine=False), ReLU,
Flatten, Linear(48,8), LayerNorm(8, elementwise_affine=False),
BatchNorm1d(8, affine=False)): state_dict keys 0.weight, 0.bias,
1.running_mean, 1.running_var, 1.num_batches_tracked, 4.weight, 4.bias,
6.running_mean, 6.running_var, 6.num_batches_tracked.

Run from the repository root (torch and safetensors):
    python3 tests/golden/gen_noaffine.py
Deterministic: torch.manual_seed(99), CPU, float32.
"""
import torch
from torch import nn
from safetensors.torch import save_file

import goldfile
from goldfile import RECORDS, rec, randn


def model():
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3, affine=False), nn.ReLU(), nn.Flatten(),
                         nn.Linear(48, 8), nn.LayerNorm(8, elementwise_affine=False),
                         nn.BatchNorm1d(8, affine=False))


def main():
    torch.manual_seed(99)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(3):
        xb = randn(4, 1, 6, 6)
        opt.zero_grad()
        (m(xb) ** 2).mean().backward()
        opt.step()
    sd = {k: v.detach().contiguous() for k, v in m.state_dict().items()}
    save_file(sd, "tests/golden/noaffine.safetensors")
    x = randn(4, 1, 6, 6)
    rec("x", x)
    m.eval()
    with torch.no_grad():
        rec("eval", m(x))
    m.train()
    xt = x.clone().requires_grad_(True)
    gout = randn(4, 8)
    y = m(xt)
    (g,) = torch.autograd.grad(y, [xt], gout)
    rec("gout", gout)
    rec("train", y)
    rec("grad_x", g)
    rec("rm1", m[6].running_mean)
    goldfile.write("tests/golden/noaffine.bin", RECORDS)
    print("tests/golden/noaffine.safetensors keys:", sorted(sd))


if __name__ == "__main__":
    main()
