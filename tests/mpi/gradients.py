"""A DDP step equals one process's on the global batch, two ways:

mpiexec -n 3 python tests/mpi/gradients.py DATA.h5 variable
    local batches that vary (the opt-in, slack 0.5) and the loss scaled by
    ``dist.scale_loss(loss_sum, loader)``;
mpiexec -n 3 python tests/mpi/gradients.py DATA.h5 default
    a loop ported from a DataLoader as it stands: the default Loader (no distributed
    argument: equal batches) and ``loss.mean()`` (N: a short last step that the ranks split
    evenly, e.g. N = 102 for P = 2 or 3 and B = 4);
mpiexec -n 3 python tests/mpi/gradients.py DATA.h5 variable DATA2.h5 default
    both in one job, one after the other (starting the ranks costs more than a check);
mpiexec -n 2 python tests/mpi/gradients.py ... DATA.h5 compiled
    tests/mpi/compiled.py's check (a torch.compile'd model under DDP) in the same job.
"""

import runpy
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from solar import Loader, dist
from solar.options import PlanningConfig


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * 5 * 6, 2),
    ).double()  # fmt: skip


def check(path: str, mode: str, d: dist.Dist) -> None:
    """One DDP check: ``mode`` "variable" or "default" (above) on ``path``."""
    if mode == "variable":
        ld = Loader(path, batch_size=4, epochs=2, buffer=20, comm=d.comm,
                    planning=PlanningConfig(slack=0.5, equal_batches=False))  # fmt: skip
    else:
        ld = Loader(path, batch_size=4, epochs=2, buffer=20)  # as a DataLoader user writes it
    ddp = DDP(model())
    single = model()
    uneven = steps = 0
    for e in range(2):
        ld.set_epoch(e)
        for b in ld:
            x, y = b["img"].double()[:, None], b["lab"].double()
            ddp.zero_grad()
            per_sample = ((ddp(x) - y) ** 2).sum(dim=1)  # summed over the 2 outputs
            if mode == "variable":
                dist.scale_loss(per_sample.sum(), ld).backward()
            else:
                per_sample.mean().backward()
            sizes = d.comm.allgather(len(x))
            uneven += len(set(sizes)) > 1
            xs, ys = d.comm.gather(x, root=0), d.comm.gather(y, root=0)
            grads = [p.grad.clone() for p in ddp.parameters()]
            if d.is_root:
                assert sum(sizes) == ld.global_batch
                single.zero_grad()
                # The global mean of the per-sample loss.
                ((single(torch.cat(xs)) - torch.cat(ys)) ** 2).sum(dim=1).mean().backward()
                for g, p in zip(grads, single.parameters(), strict=True):
                    assert torch.allclose(g, p.grad, rtol=1e-9, atol=1e-12), (
                        (g - p.grad).abs().max()
                    )
            steps += 1
    uneven = d.comm.allreduce(uneven)
    if mode == "variable":
        assert uneven > 0, "no step had uneven local batches: the test proves nothing"
    else:
        assert uneven == 0 and steps == 2 * len(ld), (uneven, steps)
    ld.close()
    print(f"rank {d.rank}: gradients equal, {steps} steps, {uneven} uneven", flush=True)


job = dist.init()
for path, mode in zip(sys.argv[1::2], sys.argv[2::2], strict=True):
    if mode == "compiled":  # (its dist.init() is this one's)
        compiled = Path(__file__).with_name("compiled.py")
        sys.argv = [str(compiled), path]
        runpy.run_path(str(compiled), run_name="__main__")
    else:
        check(path, mode, job)
