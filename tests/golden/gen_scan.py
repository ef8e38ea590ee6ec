#!/usr/bin/env python3
"""tests/golden/gen_scan.py - PyTorch golden values for dl_logsumexp
(torch.logsumexp(x, dims, keepdim)) and dl_cumsum (torch.cumsum(x, dim)),
added after core.bin was made, read by tests/test_golden.c in the format
and case layout of gen.py (see its docstring). logsumexp's params as
gen.py's reductions: [keepdim, 0, all_flag, dims...]; special values: rows
of -inf, a +inf, a NaN, 1e38 (torch's values and gradients, NaN where
torch's are), a dim of size 0 (-inf). Then Categorical's log_prob with a
+inf logit (gen.py's case layout). cumsum's params: [dim]; long lines
(torch's CPU adds in double, as dl.h), inf, NaN, overflow, -0, 0-d, empty.
Then Categorical's entropy with a +inf and a -inf logit.

Run from the repository root:   python3 tests/golden/gen_scan.py [out.bin]
(default output: tests/golden/scan.bin). Deterministic:
torch.manual_seed(2468), CPU, float32.
"""
import sys

import torch

import goldfile
from goldfile import RECORDS, rec, randn, record_grads

torch.manual_seed(2468)
INF = float("inf")
NAN = float("nan")


def lse_case(name, x, dims, keepdim, dd=False):
    t = x.detach().clone().to(torch.float32).requires_grad_(True)
    allf = dims is None
    tdims = tuple(range(t.dim())) if allf else tuple(dims)
    out = torch.logsumexp(t, dim=tdims, keepdim=keepdim) if tdims else t.clone()
    rec(name + "/x", t)
    rec(name + "/params", torch.tensor([float(keepdim), 0.0, float(allf)] + [float(d) for d in (dims or [])],
                                       dtype=torch.float32))
    record_grads(name, out, [t], ["x"], dd)


def special(*s):
    x = randn(*s)
    x[0, :] = -INF                 # all -inf: -inf
    x[1, 1] = INF                  # +inf: +inf
    x[2, 2] = NAN                  # NaN
    x[3, 0] = -INF                 # one -inf among finite values: adds 0
    x[4, :] = 1e38                 # near the top of float32
    x[5, 0] = INF
    x[5, 1] = -INF
    return x


lse_case("logsumexp/d1", randn(3, 4), [1], False)
lse_case("logsumexp/d1k", randn(3, 4), [1], True)
lse_case("logsumexp/d0", randn(3, 4) * 10, [0], False)
lse_case("logsumexp/dneg", randn(3, 4, 5), [-1], False)
lse_case("logsumexp/d02", randn(3, 4, 5), [0, 2], False)
lse_case("logsumexp/d02k", randn(3, 4, 5), [0, 2], True)
lse_case("logsumexp/d12", randn(2, 3, 4), [1, 2], False)
lse_case("logsumexp/all", randn(3, 4), None, False)
lse_case("logsumexp/allk", randn(2, 3, 4), None, True)
lse_case("logsumexp/size1", randn(3, 1, 4), [1], False)
lse_case("logsumexp/big", randn(4, 6) * 100 + 80, [1], False)    # exp overflows unshifted
lse_case("logsumexp/long", randn(2, 1000), [1], False)
lse_case("logsumexp/zero_d", randn(), [0], False)
lse_case("logsumexp/special", special(6, 3), [1], False)
lse_case("logsumexp/special_d0", special(6, 3).t().contiguous(), [0], True)
lse_case("logsumexp/empty", torch.zeros(0, 3), [0], False)
lse_case("logsumexp/dd", randn(3, 4), [1], False, dd=True)
lse_case("logsumexp/dd02", randn(3, 4, 2), [0, 2], True, dd=True)


def categorical_inf(name, x, value):
    """Categorical(logits=x, validate_args=False).log_prob(value) (params
    [0], as gen.py's): a +inf logit gives -inf at the other categories (NaN
    at itself)"""
    t = x.detach().clone().requires_grad_(True)
    out = torch.distributions.Categorical(logits=t, validate_args=False).log_prob(value)
    rec(name + "/x", t)
    rec(name + "/target", value.to(torch.float32))
    rec(name + "/params", torch.tensor([0.0]))
    record_grads(name, out, [t], ["x"])


xi = randn(3, 4)
xi[0, 1] = INF
categorical_inf("categorical_log_prob/inf_logit", xi, torch.tensor([2, 0, 3]))



def cumsum_case(name, x, dim, dd=False):
    """torch.cumsum(x, dim); params [dim]"""
    t = x.detach().clone().to(torch.float32).requires_grad_(True)
    out = torch.cumsum(t, dim)
    rec(name + "/x", t)
    rec(name + "/params", torch.tensor([float(dim)]))
    record_grads(name, out, [t], ["x"], dd)


def cum_special():
    x = randn(5, 4)
    x[0, 1] = INF                  # +inf, then +inf
    x[1, 0] = -INF
    x[1, 2] = INF                  # -inf + inf: NaN from there on
    x[2, 1] = NAN
    x[3, :] = 3e38                 # overflows to +inf at the second element
    x[4, 0] = -0.0
    return x


cumsum_case("cumsum/d1", randn(3, 4), 1)
cumsum_case("cumsum/d0", randn(3, 4), 0)
cumsum_case("cumsum/dneg", randn(2, 3, 5), -1)
cumsum_case("cumsum/dmid", randn(2, 3, 5), -2)
cumsum_case("cumsum/size1", randn(3, 1, 4), 1)
cumsum_case("cumsum/zero_d", randn(), 0)
cumsum_case("cumsum/zero_d_neg", randn(), -1)
cumsum_case("cumsum/long", randn(2, 2000), 1)      # torch's CPU adds in double: the same bits
cumsum_case("cumsum/long_d0", randn(150, 70), 0)   # columns in blocks of 64 and a remainder
cumsum_case("cumsum/special", cum_special(), 1)
cumsum_case("cumsum/special_d0", cum_special(), 0)
cumsum_case("cumsum/empty", torch.zeros(0, 3), 1)
cumsum_case("cumsum/dd", randn(3, 4), 1, dd=True)


# Categorical(logits=x, validate_args=False).entropy() with a +inf logit
# (NaN in its row, value and gradient) and a -inf one (adds 0); params [0]
xe = randn(3, 4)
xe[0, 1] = INF
xe[2, 3] = -INF
te = xe.clone().requires_grad_(True)
rec("categorical_entropy/inf_logit/x", te)
rec("categorical_entropy/inf_logit/params", torch.tensor([0.0]))
record_grads("categorical_entropy/inf_logit", torch.distributions.Categorical(logits=te, validate_args=False).entropy(),
             [te], ["x"])


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/scan.bin"
    goldfile.write(path, RECORDS)


if __name__ == "__main__":
    main()
