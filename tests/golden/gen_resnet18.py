#!/usr/bin/env python3
"""tests/golden/gen_resnet18.py - d2l's ResNet-18 (the multiple-GPUs
chapter's resnet18(10, 1), as d2l writes it) in PyTorch, for
tests/test_resnet18.c, which builds examples/resnet18.h's twin and checks:

  resnet18/count                  the parameter count (11,175,818)
  resnet18/shape/NAME             each parameter's shape (as floats), in
                                  named_parameters() order: the names, the
                                  order and the shapes must match
  resnet18/x (2,1,28,28)          an input; parameters set by set_params
  resnet18/out (2,10)             the output in training mode (batch statistics)
  resnet18/gout (2,10)            the upstream gradient
  resnet18/grad/NAME              d sum(out * gout) / d NAME for three weights
  resnet18/err32/out, .../err32/NAME   the largest error of PyTorch's float32
                                  out and gradients against float64 (1 value)

out and the gradients are computed in float64 (from the same float32
parameters and input; rounded to float32 when written), so the test
compares dl.h's float32 results with the exact ones and allows a few
times PyTorch's own float32 error (err32): 17 layers of float32 sums,
with batch norm's backward subtracting means, differ from the exact
result by about 2e-5 at a gradient of 9 (any summation order).

set_params gives every parameter values from an integer hash of (parameter
index, element index), the same in C: u = h / 2^32 - 0.5 in [-0.5, 0.5),
with h = (k * 2654435761 + (p + 1) * 40503) mod 2^32 for element k of
parameter p; convolution and linear weights u * 2 / sqrt(fan_in), their
biases u / 5, batch-norm weights 1 + u / 5, batch-norm biases u / 5; the
input (p = -1) 2u. Computed in double, rounded once to float32.

Run from the repository root:   python3 tests/golden/gen_resnet18.py [out.bin]
(default output: tests/golden/resnet18.bin). CPU, float32.

On a machine with a GPU:   python3 tests/golden/gen_resnet18.py --cuda [out.bin]
(default tests/golden/resnet18_cuda.bin) writes resnet18/err32cuda/out and
.../err32cuda/NAME: PyTorch's float32 error on cuda:0 (TF32 off for both
convolutions and matrix products) against the same float64 values. A GPU
sums in other orders than a CPU, and the 17 batch norms on 2 samples
amplify the difference; test_resnet18 on a real GPU allows a few times the
larger of PyTorch's two errors when this file is there.
FILE FORMAT: tests/golden/goldfile.py.
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import goldfile
from goldfile import RECORDS, rec


class Residual(nn.Module):
    """d2l.Residual"""

    def __init__(self, input_channels, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2d(input_channels, num_channels, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        Y += X
        return F.relu(Y)


def resnet18(num_classes, in_channels=1):
    """d2l's resnet18 (chapter "Training on Multiple GPUs")"""
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


def hashed(p, n):
    """u in [-0.5, 0.5) for elements 0..n-1 of parameter p (float64)"""
    k = torch.arange(n, dtype=torch.int64)
    h = (k * 2654435761 + (p + 1) * 40503) % (1 << 32)
    return h.to(torch.float64) / 4294967296.0 - 0.5


def set_params(net):
    bn = {id(m) for m in net.modules() if isinstance(m, nn.BatchNorm2d)}
    owner = {}
    for m in net.modules():
        for pn, prm in m.named_parameters(recurse=False):
            owner[id(prm)] = (m, pn)
    with torch.no_grad():
        for p, (name, prm) in enumerate(net.named_parameters()):
            m, pn = owner[id(prm)]
            u = hashed(p, prm.numel())
            if id(m) in bn:
                v = 1.0 + u / 5.0 if pn == "weight" else u / 5.0
            elif pn == "weight":
                v = u * 2.0 / math.sqrt(prm[0].numel())
            else:
                v = u / 5.0
            prm.copy_(v.to(torch.float32).reshape(prm.shape))


def main():
    cuda = len(sys.argv) > 1 and sys.argv[1] == "--cuda"
    args = sys.argv[2:] if cuda else sys.argv[1:]
    path = args[0] if args else "tests/golden/resnet18_cuda.bin" if cuda else "tests/golden/resnet18.bin"
    net = resnet18(10, 1)
    count = sum(p.numel() for p in net.parameters())
    assert count == 11175818, count
    rec("resnet18/count", torch.tensor([float(count)]))
    for name, prm in net.named_parameters():
        rec("resnet18/shape/" + name, torch.tensor([float(d) for d in prm.shape]))
    set_params(net)
    net.train()
    x = (hashed(-1, 2 * 784) * 2.0).to(torch.float32).reshape(2, 1, 28, 28)
    gout = (hashed(-2, 20) * 2.0).to(torch.float32).reshape(2, 10)
    names = ["0.weight", "resnet_block2.0.conv3.weight", "fc.1.weight"]

    def run(net, x, gout):
        out = net(x)
        params = dict(net.named_parameters())
        return out, torch.autograd.grad((out * gout).sum(), [params[n] for n in names])

    if cuda:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        dev = torch.device("cuda:0")
        outc, gradsc = run(net.to(dev), x.to(dev), gout.to(dev))
        outc, gradsc = outc.cpu(), [g.cpu() for g in gradsc]
        out64, grads64 = run(net.cpu().double(), x.double(), gout.double())
        del RECORDS[:]   # this file holds the GPU's errors only
        rec("resnet18/err32cuda/out", torch.tensor([(outc.double() - out64).abs().max().item()]))
        for n, gc, g64 in zip(names, gradsc, grads64):
            rec("resnet18/err32cuda/" + n, torch.tensor([(gc.double() - g64).abs().max().item()]))
        goldfile.write(path, RECORDS)
        return
    out32, grads32 = run(net, x, gout)
    out64, grads64 = run(net.double(), x.double(), gout.double())
    rec("resnet18/x", x)
    rec("resnet18/out", out64)
    rec("resnet18/gout", gout)
    rec("resnet18/err32/out", torch.tensor([(out32.double() - out64).abs().max().item()]))
    for n, g32, g64 in zip(names, grads32, grads64):
        rec("resnet18/grad/" + n, g64)
        rec("resnet18/err32/" + n, torch.tensor([(g32.double() - g64).abs().max().item()]))
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
