#!/usr/bin/env python3
"""tests/golden/gen_masks.py - PyTorch golden values for second derivatives
through the masks of piecewise-linear ops.

Run from the repository root:   python3 tests/golden/gen_masks.py [out.bin]
(default output: tests/golden/masks.bin, read by test_golden.c; max
pooling's case is gen_conv_edges.py's). Works with torch 1.13 and newer.
Deterministic: torch.manual_seed(2468), CPU, float32.

The backwards of relu, leaky_relu, abs and max pooling are functions of
their input in PyTorch (threshold_backward, leaky_relu_backward, sgn,
max_pool2d_with_indices_backward) whose own derivative is zero: a first
gradient taken with create_graph=True carries history, and a gradient
through it alone (the second derivative of a ReLU net in its input) is
zeros. clamp's, amax's and maximum's backwards use boolean masks: their
first gradients carry none, and PyTorch refuses the second derivative.
Each case records greq (see goldfile.record_grads) with the Hessian-vector
product: the C runner checks both.

FILE FORMAT and record names: as tests/golden/core.bin (see gen.py), plus
<op>/<case>/greq.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldfile  # noqa: E402
from goldfile import randn  # noqa: E402

torch.manual_seed(2468)


def nonzero(*s):
    """|x| >= 0.25, both signs: no kinks within reach"""
    x = randn(*s)
    return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x)) * (x.abs() + 0.25)


def case(name, inputs, fn, params=None):
    goldfile.case(name, inputs, fn, params, dd=True, greq=True)


# history, zeros
case("relu/mask", [("x", nonzero(3, 4))], torch.relu)
case("leaky_relu/mask", [("x", nonzero(2, 5))], lambda x: F.leaky_relu(x, 0.1), params=[0.1])
case("abs/mask", [("x", nonzero(4, 3))], torch.abs)
# no history, refused (zeros recorded)
case("clamp/mask", [("x", nonzero(3, 4) * 2)], lambda x: torch.clamp(x, -0.5, 0.7), params=[-0.5, 0.7])
case("max/mask", [("x", randn(3, 4))], lambda x: torch.amax(x, dim=1), params=[0.0, 1.0, 0.0, 1.0])
case("maximum/mask", [("a", randn(3, 4)), ("b", randn(3, 4))], torch.maximum)
goldfile.write(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/masks.bin", goldfile.RECORDS)
