"""Under mpiexec -n 3: a DDP step with uneven local batches (the opt-in) and the loss scaled
by ``dist.scale_loss(loss_sum, loader)`` equals one process on the global batch.

mpiexec -n 3 python tests/mpi/gradients.py DATA.h5
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
ld = Loader(
    sys.argv[1], batch_size=4, epochs=2, buffer=20, slack=0.5, comm=d.comm, equal_batches=False
)
ddp = DDP(model())
single = model()
uneven = 0
for e in range(2):
    ld.set_epoch(e)
    for b in ld:
        x, y = b["img"].double()[:, None], b["lab"].double()
        ddp.zero_grad()
        loss_sum = ((ddp(x) - y) ** 2).sum()
        dist.scale_loss(loss_sum, ld).backward()
        sizes = d.comm.allgather(len(x))
        uneven += len(set(sizes)) > 1
        xs, ys = d.comm.gather(x, root=0), d.comm.gather(y, root=0)
        grads = [p.grad.clone() for p in ddp.parameters()]
        if d.is_root:
            assert sum(sizes) == ld.global_batch
            single.zero_grad()
            # The global mean of the per-sample loss (summed over the 2 outputs).
            per_sample = ((single(torch.cat(xs)) - torch.cat(ys)) ** 2).sum(dim=1)
            per_sample.mean().backward()
            for g, p in zip(grads, single.parameters(), strict=True):
                assert torch.allclose(g, p.grad, rtol=1e-9, atol=1e-12), (g - p.grad).abs().max()
assert d.comm.allreduce(uneven) > 0, "no step had uneven local batches: the test proves nothing"
print(f"rank {d.rank}: gradients equal, {uneven} uneven steps", flush=True)
