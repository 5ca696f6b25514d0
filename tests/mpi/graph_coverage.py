"""Under mpiexec: a NeighborSampler's batches on every rank are h5py's feature rows, every
sampled node's labels and a subgraph of the graph; every training node seeds once per epoch; with
several ranks on this host, one node buffer by default (share="auto"), as planned; an epoch
of fewer seeds than a global batch is one short step, split evenly.

mpiexec -n P python tests/mpi/graph_coverage.py GRAPH.h5
"""

import sys

import h5py
import numpy as np
from planned import planned

from solar import Loader, NeighborSampler, dist

d = dist.init()
path = sys.argv[1]
with h5py.File(path) as f:
    feats, labels = f["features"][()], f["labels"][()]
    indptr, indices, train = f["indptr"][()], f["indices"][()], f["train_idx"][()]
sampler = NeighborSampler(path, (4, 2), batch_size=13)
ld = Loader(path, ["features"], sampler=sampler, epochs=2, buffer=60, comm=d.comm)
for e in range(2):
    ld.set_epoch(e)
    seeds = []
    for b in ld:
        n_id = b["n_id"].numpy()
        assert b["x"].numpy().tobytes() == feats[n_id].tobytes(), (d.rank, e)
        bs = b["batch_size"]
        assert np.array_equal(b["y"].numpy()[:bs], labels[n_id[:bs]])
        assert np.array_equal(b["y"].numpy(), labels[n_id])  # every sampled node's, as PyG's
        src, dst = n_id[b["edge_index"].numpy()]
        for s, t in zip(src.tolist(), dst.tolist(), strict=True):
            assert s in indices[indptr[t] : indptr[t + 1]]
        seeds.append(n_id[:bs])
    every = d.comm.gather(np.concatenate(seeds), root=0)
    if d.is_root:
        every = np.concatenate(every)
        assert np.array_equal(np.sort(every), train), f"epoch {e}: seeds not served once each"
# share="auto": one buffer for the ranks of this host (a GNN's accesses overlap), else per rank.
assert ld.share == ("node" if d.world_size > 1 else "rank") == ld.stats.share, ld.share
planned = planned(ld, d.comm)
served = ld.stats.epochs.values()
assert sum(s.hits for s in served) == planned.hits
assert sum(s.reads for s in served) == planned.reads
ld.close()

# Fewer seeds than a global batch (299 at 160 per rank): one short step split evenly over the
# ranks, every seed once, rows h5py's, y and the masks every sampled node's.
with h5py.File(path) as f:
    splits = {m: np.isin(np.arange(labels.size), f[s][()])
              for s, m in (("train_idx", "train_mask"), ("valid_idx", "val_mask"),
                           ("test_idx", "test_mask"))}  # fmt: skip
sampler = NeighborSampler(path, (4, 2), batch_size=160)
with Loader(path, ["features"], sampler=sampler, epochs=2, buffer=60, comm=d.comm) as ld:
    assert ld.run.steps_per_epoch == 1, ld.run
    for e in range(2):
        ld.set_epoch(e)
        got = list(ld)
        share = train.size // d.world_size + (d.rank < train.size % d.world_size)
        assert [b["batch_size"] for b in got] == [share], (d.rank, [b["batch_size"] for b in got])
        b = got[0]
        n_id = b["n_id"].numpy()
        assert b["x"].numpy().tobytes() == feats[n_id].tobytes(), (d.rank, e)
        assert np.array_equal(b["y"].numpy(), labels[n_id])
        for m, mask in splits.items():
            assert np.array_equal(b[m].numpy(), mask[n_id]), m
        assert np.array_equal(train[b["input_id"].numpy()], n_id[:share])
        every = d.comm.gather(n_id[:share], root=0)
        if d.is_root:
            assert np.array_equal(np.sort(np.concatenate(every)), train), f"short epoch {e}"
if d.is_root:
    print("ok", flush=True)
