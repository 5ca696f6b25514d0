"""A DDP loop ported from a DataLoader as it stands: the default Loader (no distributed
argument) and ``loss.mean()``. Every step's gradients equal one process's on the global batch.

mpiexec -n 3 python tests/mpi/default_gradients.py DATA.h5   (N: a short last step that the
ranks split evenly, e.g. N = 102 for P = 2 or 3 and B = 4)
"""

import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from solar import Loader, dist


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * 5 * 6, 2),
    ).double()  # fmt: skip


d = dist.init()
ld = Loader(sys.argv[1], batch_size=4, epochs=2, buffer=20)  # as a DataLoader user writes it
ddp = DDP(model())
single = model()
steps = 0
for e in range(2):
    ld.set_epoch(e)
    for b in ld:
        x, y = b["img"].double()[:, None], b["lab"].double()
        ddp.zero_grad()
        ((ddp(x) - y) ** 2).sum(dim=1).mean().backward()
        sizes = d.comm.allgather(len(x))
        xs, ys = d.comm.gather(x, root=0), d.comm.gather(y, root=0)
        grads = [p.grad.clone() for p in ddp.parameters()]
        if d.is_root:
            assert len(set(sizes)) == 1, f"local batches {sizes}"
            single.zero_grad()
            ((single(torch.cat(xs)) - torch.cat(ys)) ** 2).sum(dim=1).mean().backward()
            for g, p in zip(grads, single.parameters(), strict=True):
                assert torch.allclose(g, p.grad, rtol=1e-9, atol=1e-12), (g - p.grad).abs().max()
        steps += 1
assert steps == 2 * len(ld)
print(f"rank {d.rank}: gradients equal, {steps} steps", flush=True)
