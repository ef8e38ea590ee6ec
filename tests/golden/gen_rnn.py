#!/usr/bin/env python3
"""tests/golden/gen_rnn.py - PyTorch golden values for dl_nn_rnn, dl_nn_lstm
and dl_nn_gru (torch.nn.RNN / LSTM / GRU), read by tests/test_layers.c.
Records of one case "rnn/<case>/<field>", in order: config [kind (0: RNN
tanh, 1: RNN relu, 2: LSTM, 3: GRU), input_size, hidden_size, num_layers,
bias, batch_first, bidirectional, h0 given]; the state_dict, one record
"p.<name>" each in torch's order; x, then h0 (and c0, LSTM) when given;
gout, gh (and gc): the weights of the loss sum(out gout) + sum(h_n gh)
[+ sum(c_n gc)]; out, h_n (c_n); grad_x, grad_h0 (grad_c0) when given,
and "grad_p.<name>" per parameter.

Run from the repository root:   python3 tests/golden/gen_rnn.py [out.bin]
(default output: tests/golden/rnn.bin). Deterministic:
torch.manual_seed(2024), CPU, float32.
"""
import sys

import torch

import goldfile
from goldfile import rec, randn

torch.manual_seed(2024)
KINDS = {"rnn": 0, "rnn_relu": 1, "lstm": 2, "gru": 3}


def case(name, kind, I, H, L=1, bias=True, batch_first=False, bidir=False, h0=True, shape=(5, 3)):
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU if kind == "gru" else torch.nn.RNN
    kw = dict(num_layers=L, bias=bias, batch_first=batch_first, bidirectional=bidir)
    if kind.startswith("rnn"):
        kw["nonlinearity"] = "relu" if kind == "rnn_relu" else "tanh"
    m = cls(I, H, **kw)
    n = "rnn/" + name
    D = 2 if bidir else 1
    rec(n + "/config", torch.tensor([KINDS[kind], I, H, L, bias, batch_first, bidir, h0], dtype=torch.float32))
    params = list(m.named_parameters())
    for pn, p in params:
        rec(n + "/p." + pn, p)
    x = randn(*shape, I).requires_grad_(True)
    unb = len(shape) == 1
    N = None if unb else shape[0] if batch_first else shape[1]
    sshape = (D * L, H) if unb else (D * L, N, H)
    req = [x]
    fields = ["x"]
    rec(n + "/x", x)
    st = None
    if h0:
        hh = randn(*sshape).requires_grad_(True)
        rec(n + "/h0", hh)
        req.append(hh)
        fields.append("h0")
        st = hh
        if kind == "lstm":
            cc = randn(*sshape).requires_grad_(True)
            rec(n + "/c0", cc)
            req.append(cc)
            fields.append("c0")
            st = (hh, cc)
    out, hn = m(x, st) if st is not None else m(x)
    cn = None
    if kind == "lstm":
        hn, cn = hn
    gout, gh = randn(*out.shape), randn(*hn.shape)
    rec(n + "/gout", gout)
    rec(n + "/gh", gh)
    loss = (out * gout).sum() + (hn * gh).sum()
    if cn is not None:
        gc = randn(*cn.shape)
        rec(n + "/gc", gc)
        loss = loss + (cn * gc).sum()
    rec(n + "/out", out)
    rec(n + "/h_n", hn)
    if cn is not None:
        rec(n + "/c_n", cn)
    gr = torch.autograd.grad(loss, req + [p for _, p in params])
    for f, g in zip(fields, gr):
        rec(n + "/grad_" + f, g)
    for (pn, _), g in zip(params, gr[len(req):]):
        rec(n + "/grad_p." + pn, g)


case("lstm_1l", "lstm", 4, 5)
case("lstm_2l_zero_state", "lstm", 3, 4, L=2, h0=False)
case("lstm_bidir_2l", "lstm", 3, 4, L=2, bidir=True)
case("lstm_batch_first", "lstm", 4, 3, batch_first=True, shape=(2, 6))
case("lstm_unbatched", "lstm", 3, 5, shape=(4,))
case("lstm_no_bias", "lstm", 3, 4, bias=False)
case("gru_1l", "gru", 4, 5)
case("gru_bidir_2l_bf", "gru", 3, 4, L=2, bidir=True, batch_first=True, shape=(3, 4))
case("gru_unbatched_no_bias", "gru", 3, 2, bias=False, shape=(5,))
case("rnn_tanh_2l", "rnn", 3, 4, L=2)
case("rnn_relu_bidir", "rnn_relu", 4, 3, bidir=True, h0=False)
case("rnn_relu_unbatched_2l", "rnn_relu", 2, 3, L=2, shape=(4,))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/rnn.bin"
    goldfile.write(path, goldfile.RECORDS)


if __name__ == "__main__":
    main()
