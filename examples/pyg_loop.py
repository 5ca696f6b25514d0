"""A training loop as PyG's documentation writes one, on solar's Loader, unchanged.

    python examples/pyg_loop.py --data .demo/planetoid.h5
    mpiexec -n 2 python examples/pyg_loop.py --data .demo/planetoid.h5

The graph is a small Planetoid-like one made here with numpy (600 nodes, 6 classes, 120
training nodes as in CiteSeer, masks for the splits) and converted with ``write_graph``, as a
PyG ``Data`` would be. The loops below are PyG's (``batch.y[:batch.batch_size]``, the split
masks, ``input_id``) over ``Loader(..., batch_format="pyg")``: each batch is the ``Data``
``NeighborLoader`` yields. With 64 seeds per rank on 2 ranks a global batch (128) exceeds the
120 training nodes: the epoch is one short step, 60 seeds per rank, as DistributedSampler with
NeighborLoader serves it. Rank 0 prints each epoch's loss, the accuracy on each split, and
whether every input node was served once per epoch (``input_id`` over all ranks).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from solar import Loader, NeighborSampler, dist
from solar.graph import write_graph

try:
    from torch_geometric.nn import SAGEConv
except ImportError:  # the same layer in plain torch (mean aggregation)

    class SAGEConv(torch.nn.Module):  # type: ignore[no-redef]
        def __init__(self, i: int, o: int) -> None:
            super().__init__()
            self.lin_r, self.lin_l = torch.nn.Linear(i, o), torch.nn.Linear(i, o, bias=False)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            src, dst = edge_index
            agg = torch.zeros_like(x).index_add_(0, dst, x[src])
            deg = torch.bincount(dst, minlength=len(x)).clamp(min=1)[:, None]
            return self.lin_r(x) + self.lin_l(agg / deg)


class SAGE(torch.nn.Module):
    def __init__(self, i: int, hidden: int, o: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = SAGEConv(i, hidden), SAGEConv(hidden, o)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


def planetoid_like(path: Path, nodes: int = 600, classes: int = 6, seed: int = 0) -> None:
    """A homophilous graph with informative features, split as Planetoid's public split
    (20 training nodes per class, 100 validation, 200 test), written with ``write_graph``."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(nodes) % classes)
    x = (np.eye(classes, 16)[y] + rng.normal(0, 0.8, (nodes, 16))).astype(np.float32)
    dst = np.repeat(np.arange(nodes), 5)
    same = rng.random(dst.size) < 0.8
    by_class = [np.flatnonzero(y == c) for c in range(classes)]
    near = [rng.choice(by_class[y[v]]) for v in dst]
    src = np.where(same, near, rng.integers(0, nodes, dst.size))
    train = np.concatenate([c[:20] for c in by_class])
    rest = np.setdiff1d(np.arange(nodes), train)
    masks = {}
    splits = {"train_mask": train, "val_mask": rest[:100], "test_mask": rest[100:300]}
    for name, ids in splits.items():
        masks[name] = np.zeros(nodes, bool)
        masks[name][ids] = True
    write_graph({"edge_index": np.stack([src, dst]), "x": x, "y": y, **masks}, path, force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(".demo/planetoid.h5"))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="seeds per rank and step")
    opts = parser.parse_args()

    d = dist.init()
    if d.is_root:
        opts.data.parent.mkdir(parents=True, exist_ok=True)
        planetoid_like(opts.data)
    d.comm.Barrier()
    # NeighborLoader(data, num_neighbors=[10, 5], batch_size=64, input_nodes=data.train_mask)
    sampler = NeighborSampler(opts.data, [10, 5], batch_size=opts.batch_size)
    train_loader = Loader(opts.data, ["features"], sampler=sampler, epochs=opts.epochs,
                          buffer="50%", comm=d.comm, batch_format="pyg")  # fmt: skip
    # NeighborLoader(data, num_neighbors=[-1, -1], batch_size=128): every node, rank 0 alone
    every = NeighborSampler(opts.data, [-1, -1], batch_size=128, train=np.arange(600))
    test_loader = Loader(opts.data, ["features"], sampler=every, epochs=1, buffer="50%",
                         rank=0, world_size=1, batch_format="pyg")  # fmt: skip

    torch.manual_seed(0)
    model = SAGE(16, 32, 6)
    ddp = DDP(model) if d.world_size > 1 else model
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def train(epoch: int) -> tuple[float, np.ndarray]:
        ddp.train()
        total_loss = total_examples = 0
        served = []
        train_loader.set_epoch(epoch)
        for batch in train_loader:
            optimizer.zero_grad()
            out = ddp(batch.x, batch.edge_index)[: batch.batch_size]
            y = batch.y[: batch.batch_size]
            loss = F.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            total_loss += float(loss) * batch.batch_size
            total_examples += batch.batch_size
            assert bool(batch.train_mask[: batch.batch_size].all())  # the seeds: training nodes
            served.append(batch.input_id.numpy())
        return total_loss / total_examples, np.concatenate(served)

    @torch.no_grad()
    def test() -> list[float]:
        model.eval()
        pred = torch.full((600,), -1)
        y = torch.full((600,), -1)
        masks = {k: torch.zeros(600, dtype=torch.bool) for k in ("train_mask", "val_mask",
                                                                  "test_mask")}  # fmt: skip
        for batch in test_loader:
            out = model(batch.x, batch.edge_index)[: batch.batch_size]
            pred[batch.input_id] = out.argmax(dim=-1)
            y[batch.input_id] = batch.y[: batch.batch_size]
            for k in masks:
                masks[k][batch.input_id] = batch[k][: batch.batch_size]
        return [float((pred[m] == y[m]).float().mean()) for m in masks.values()]

    for epoch in range(opts.epochs):
        loss, served = train(epoch)
        ids = d.comm.gather(served, root=0)
        if d.is_root:
            once = np.array_equal(np.sort(np.concatenate(ids)), np.arange(sampler.train.size))
            steps = train_loader.run.steps_per_epoch
            print(f"epoch {epoch} loss {loss:.4f} steps {steps} input nodes once {once}",
                  flush=True)  # fmt: skip
    if d.is_root:
        train_acc, val_acc, test_acc = test()
        print(f"accuracy train {train_acc:.3f} val {val_acc:.3f} test {test_acc:.3f}", flush=True)
    train_loader.close()
    test_loader.close()


if __name__ == "__main__":
    main()
