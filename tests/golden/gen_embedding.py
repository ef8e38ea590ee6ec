#!/usr/bin/env python3
"""tests/golden/gen_embedding.py - PyTorch's side of dl_nn_embedding, read by
tests/test_nn.c: a character-level MLP language model (Bengio et al. 2003,
as in Karpathy's makemore part 2), trained a few steps.

    tests/golden/embedding_init.safetensors  the initial state_dict
                                             (safetensors.torch.save_file)
    tests/golden/embedding_data.safetensors
        X (32,3) int64      contexts of 3 characters (0 is '.', the padding)
        Y (32) int64        the next character
        losses (6)          the cross-entropy loss before each SGD step
        final.<name>        every parameter after the 6 steps
        eval (4,27)         the trained model's logits for X[:4]

The model: Sequential(Embedding(27, 10, padding_idx=0), Flatten, Linear(30,
64), Tanh, Linear(64, 27)); SGD(lr=0.1, momentum=0.9, weight_decay=1e-4).

Run from the repository root:   python3 tests/golden/gen_embedding.py
Deterministic: torch.manual_seed(2718), CPU, float32."""
import torch
from safetensors.torch import save_file

torch.manual_seed(2718)
model = torch.nn.Sequential(torch.nn.Embedding(27, 10, padding_idx=0), torch.nn.Flatten(),
                            torch.nn.Linear(30, 64), torch.nn.Tanh(), torch.nn.Linear(64, 27))
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, "tests/golden/embedding_init.safetensors")
X = torch.randint(0, 27, (32, 3))
X[:5, 0] = 0                      # contexts that start with padding
Y = torch.randint(1, 27, (32,))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
losses = []
for step in range(6):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), Y)
    losses.append(loss.item())
    loss.backward()
    opt.step()
out = {"X": X, "Y": Y, "losses": torch.tensor(losses, dtype=torch.float32)}
for k, v in model.state_dict().items():
    out["final." + k] = v.detach().clone().contiguous()
with torch.no_grad():
    out["eval"] = model(X[:4]).contiguous()
save_file(out, "tests/golden/embedding_data.safetensors")
print("losses", losses)
