"""Train GraphSAGE node classification with DDP on solar's sampled GNN mini-batches.

    mpiexec -n 2 python examples/train_graphsage.py --data .demo/graph.h5 --epochs 3
    mpiexec -n 2 python examples/train_graphsage.py --data .demo/graph.h5 --epochs 3 --resume
    torchrun --nproc_per_node 2 examples/train_graphsage.py --data .demo/graph.h5 --epochs 3
    mpiexec -n 2 python examples/train_graphsage.py --data .demo/graph.h5 --epochs 3 --model mlp

The node features stay on storage; solar plans which rows each rank keeps in RAM (Belady over
the sampled subgraphs) and reads the rest. Each batch is laid out as PyTorch Geometric's
``NeighborLoader`` yields it (``x`` with the seeds first, ``edge_index`` in local ids from
neighbour to target, ``y`` of every node, ``batch_size``: the seeds' are ``y[:batch_size]``),
so a PyG model runs unchanged: ``SAGEConv`` where torch_geometric is installed, else the
plain-torch layer below (the same mean aggregation). The loss is the sum of the seeds' losses
scaled by ``solar.dist.scale_loss`` over the step's seeds on all ranks. Rank 0 logs loss, accuracy,
nodes/s and hit rate per epoch and checkpoints (model, optimizer, loader states) at each
epoch end and every ``--checkpoint-every`` steps; ``--resume`` continues exactly. At the end
rank 0 reports the accuracy on the graph's ``test_idx`` (a validation Loader of its own). On
the generated graph (``solar gen --preset graph``: labels are communities, features weakly
informative) GraphSAGE reaches far more than ``--model mlp``, the same batches with the edges
ignored: the edges matter. Where torch_geometric is installed the batches are PyG ``Data``
(``batch_format="pyg"``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from solar import Loader, NeighborSampler, dist
from solar.graph import generate_graph

try:  # PyG's layer where it is installed; the same computation in plain torch otherwise
    from torch_geometric.nn import SAGEConv

    BATCH_FORMAT = "pyg"  # batches as torch_geometric Data (batch.x or batch["x"] alike)
except ImportError:  # pragma: no cover - depends on the environment
    BATCH_FORMAT = "dict"

    class SAGEConv(nn.Module):  # type: ignore[no-redef]
        """``x_i' = W_root x_i + W_neigh · mean_{j → i} x_j`` (PyG's SAGEConv, mean aggr)."""

        def __init__(self, inputs: int, outputs: int) -> None:
            super().__init__()
            self.lin_l = nn.Linear(inputs, outputs)  # neighbours (PyG's names)
            self.lin_r = nn.Linear(inputs, outputs, bias=False)  # the node itself

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            src, dst = edge_index
            total = torch.zeros_like(x).index_add_(0, dst, x[src])
            count = torch.zeros(x.shape[0], dtype=x.dtype).index_add_(
                0, dst, torch.ones_like(dst, dtype=x.dtype)
            )
            return self.lin_l(total / count.clamp(min=1)[:, None]) + self.lin_r(x)


class GraphSAGE(nn.Module):
    def __init__(self, inputs: int, hidden: int, classes: int, layers: int) -> None:
        super().__init__()
        sizes = [inputs] + [hidden] * (layers - 1) + [classes]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = torch.relu(x)
        return x


class MLP(nn.Module):
    """The same features without the edges: what a GNN must beat."""

    def __init__(self, inputs: int, hidden: int, classes: int, layers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_accuracy(model: nn.Module, data: Path, fanouts: tuple, batch: int, test) -> float:
    """Accuracy on the test nodes, served by a Loader of rank 0 alone."""
    sampler = NeighborSampler(data, fanouts, batch_size=batch, train=test)
    correct = 0
    loader = Loader(data, ["features"], sampler=sampler, epochs=1, buffer="10%", rank=0,
                    world_size=1, batch_format=BATCH_FORMAT)  # fmt: skip
    with torch.no_grad(), loader as ld:
        for b in ld:
            n = b["batch_size"]
            correct += int((model(b["x"], b["edge_index"])[:n].argmax(1) == b["y"][:n]).sum())
    return correct / len(test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".demo/graph.h5"))
    parser.add_argument("--nodes", type=int, default=20000, help="generated if --data is absent")
    parser.add_argument("--features", type=int, default=64, help="generated graph's floats/node")
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="seeds per rank and step")
    parser.add_argument(
        "--buffer", default="20%", help="rows or bytes per rank, or %% of data over all ranks"
    )
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--model", choices=["sage", "mlp"], default="sage",
                        help="mlp: the same batches without the edges")  # fmt: skip
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=Path("graphsage.pt"))
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: epochs only")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each checkpoint as CHECKPOINT.stepN too")  # fmt: skip
    opts = parser.parse_args()

    d = dist.init()
    if d.is_root:
        print(f"training on {d.world_size} ranks ({d.launcher})", flush=True)
    if d.is_root and not opts.data.exists():
        opts.data.parent.mkdir(parents=True, exist_ok=True)
        generate_graph(opts.data, opts.nodes, 10.0, opts.features, seed=opts.seed)
    d.comm.Barrier()
    fanouts = tuple(int(f) for f in opts.fanouts.split(","))
    sampler = NeighborSampler(opts.data, fanouts, batch_size=opts.batch_size)
    loader = Loader(opts.data, ["features"], sampler=sampler, epochs=opts.epochs,
                    buffer=opts.buffer, seed=opts.seed, comm=d.comm, drop_last=True,
                    batch_format=BATCH_FORMAT)  # fmt: skip
    labels = sampler.graph.labels
    assert labels is not None, "the graph needs labels"
    classes = int(np.max(labels)) + 1

    torch.manual_seed(opts.seed)
    features = loader.info.keys[0].sample_shape[0]
    kind = GraphSAGE if opts.model == "sage" else MLP
    model = DDP(kind(features, opts.hidden, classes, len(fanouts)))
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr)
    start_epoch = 0
    if opts.resume:
        ckpt = torch.load(opts.checkpoint, weights_only=False)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loaders"][d.rank])
        start_epoch = ckpt["loaders"][d.rank]["epoch"]
        if d.is_root:
            print(f"resumed from {opts.checkpoint} at global step {ckpt['step']}", flush=True)

    def save(step: int) -> None:
        states = d.comm.gather(loader.state_dict(), root=0)
        if d.is_root:
            tmp = opts.checkpoint.with_name(opts.checkpoint.name + ".tmp")
            ckpt = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "loaders": states, "step": step}  # fmt: skip
            torch.save(ckpt, tmp)
            os.replace(tmp, opts.checkpoint)
            if opts.keep_checkpoints:
                shutil.copyfile(opts.checkpoint, f"{opts.checkpoint}.step{step}")

    for epoch in range(start_epoch, opts.epochs):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        loss_total = correct = seeds = nodes = 0.0
        for batch in loader:
            step = loader.state_dict()["next_step"] - 1  # the step just served (run-wide)
            n = batch["batch_size"]
            optimizer.zero_grad()
            logits = model(batch["x"], batch["edge_index"])[:n]
            losses = nn.functional.cross_entropy(logits, batch["y"][:n], reduction="sum")
            dist.scale_loss(losses, loader).backward()  # over the step's seeds on all ranks
            optimizer.step()
            loss_total += float(losses.detach())
            correct += float((logits.argmax(1) == batch["y"][:n]).sum())
            seeds += n
            nodes += batch["x"].shape[0]
            if opts.checkpoint_every and (step + 1) % opts.checkpoint_every == 0:
                save(step + 1)
        seconds = time.perf_counter() - t0
        st = loader.stats.epochs[epoch]
        totals = np.array([loss_total, correct, seeds, nodes, st.hits, st.samples], float)
        loss_total, correct, seeds, nodes, hits, rows = dist.allreduce(d.comm, totals).tolist()
        save(loader.state_dict()["next_step"])
        if d.is_root:
            print(
                f"epoch {epoch}: loss {loss_total / seeds:.5f}  accuracy {correct / seeds:.3f}  "
                f"{nodes / seconds:.0f} nodes/s  hit rate {100 * hits / rows:.1f} %",
                flush=True,
            )
    if d.is_root:
        test = sampler.graph.train_idx  # (the file's test split, else the training nodes)
        import h5py

        with h5py.File(opts.data) as f:
            if "test_idx" in f:
                test = f["test_idx"][()]
        acc = test_accuracy(model.module, opts.data, fanouts, opts.batch_size, test)
        print(f"{opts.model}: test accuracy {acc:.3f} on {len(test)} nodes", flush=True)
        digest = sum(float(p.detach().double().sum()) for p in model.module.parameters())
        print(f"done: parameter checksum {digest:.12e}", flush=True)


if __name__ == "__main__":
    main()
