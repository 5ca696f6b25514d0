"""Under mpiexec -n 2: a torch.compile'd model trained by DDP for 2 epochs on solar's equal
batches compiles once (no recompilation after the first step) and its gradients equal one
process's over the same global batches, with no loss re-weighting.

mpiexec -n 2 python tests/mpi/compiled.py DATA.h5 [--backend count|inductor]

``count`` is dynamo with a backend that counts the graphs it is handed and runs them eagerly
(each graph handed over is one compilation); ``inductor`` compiles for real (slower: bench/).
"""

import argparse
import time

import torch
import torch._dynamo
from torch.nn.parallel import DistributedDataParallel as DDP

from solar import Loader, dist
from solar.options import PlanningConfig

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("--backend", choices=["count", "inductor"], default="count")
parser.add_argument("--epochs", type=int, default=2)
opts = parser.parse_args()

compiles = 0


def counting(gm, example_inputs):
    global compiles
    compiles += 1
    return gm.forward


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 6, 2),
    ).double()  # fmt: skip


d = dist.init()
ld = Loader(opts.data, batch_size=4, epochs=opts.epochs, buffer=20, comm=d.comm, drop_last=True,
            planning=PlanningConfig(slack=0.5, equal_batches=True))  # fmt: skip
if opts.backend == "inductor":
    torch._dynamo.reset()
    backend = "inductor"
    from torch._dynamo.utils import counters
else:
    backend = counting
net = model()
# The module compiled, then wrapped (dynamo does not trace into DDP's own forward here).
compiled = torch.compile(net, backend=backend)
ddp = DDP(compiled)
single = model()
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
opt1 = torch.optim.SGD(single.parameters(), lr=0.05)
after_first = None
moved = steps = 0
t0 = time.perf_counter()
for e in range(opts.epochs):
    ld.set_epoch(e)
    for b in ld:
        x, y = b["img"].double()[:, None], b["lab"].double()
        opt.zero_grad()
        # The plain mean over the local batch: equal batches make DDP's average the global mean.
        loss = ((ddp(x) - y) ** 2).sum(dim=1).mean()
        loss.backward()
        xs, ys = d.comm.gather(x, root=0), d.comm.gather(y, root=0)
        grads = [p.grad.clone() for p in ddp.parameters()]
        if d.is_root:
            opt1.zero_grad()
            ((single(torch.cat(xs)) - torch.cat(ys)) ** 2).sum(dim=1).mean().backward()
            # Eager graphs: the same arithmetic; inductor's kernels may sum in another order.
            tol = {"rtol": 1e-9, "atol": 1e-12} if opts.backend == "count" else {"rtol": 1e-6}
            for g, p in zip(grads, single.parameters(), strict=True):
                assert torch.allclose(g, p.grad, **tol), (steps, (g - p.grad).abs().max())
            opt1.step()
        opt.step()
        steps += 1
        moved += ld.stats.steps[-1].sent + ld.stats.steps[-1].received
        if after_first is None:
            graphs = compiles if opts.backend == "count" else counters["stats"]["unique_graphs"]
            after_first = graphs
seconds = time.perf_counter() - t0
graphs = compiles if opts.backend == "count" else counters["stats"]["unique_graphs"]
assert after_first >= 1 and graphs == after_first, (after_first, graphs)
assert d.comm.allreduce(moved) > 0, "no rows moved: the test proves nothing"
# The count does count: one batch of another size makes dynamo compile again.
with torch.no_grad():
    compiled(x[:-1])
again = compiles if opts.backend == "count" else counters["stats"]["unique_graphs"]
assert again > graphs, (again, graphs)
print(f"rank {d.rank}: {steps} steps, {graphs} graph(s) compiled, none after the first step, "
      f"gradients equal, {seconds:.1f} s", flush=True)  # fmt: skip
