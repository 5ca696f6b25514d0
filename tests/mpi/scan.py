"""Under mpiexec: one scan per job. Each rank opens only its share of the files, every rank
gets the identical table, and the Loader built on it serves h5py's (numpy's) bytes.

mpiexec -n P python tests/mpi/scan.py DIR [--npy] [DIR [--npy] ...]

Each DIR (of .npy files with --npy after it) is one case, checked one after the other in one
job (a launch costs more than a case); each rank's line ends a case, prefixed ``h5: `` or
``npy: ``.
"""

import hashlib
import sys
from pathlib import Path

import h5py
import numpy as np

import solar.io.hdf5 as hdf5_module
import solar.io.npy as npy_module
from solar import Loader, dist
from solar.config import ReaderConfig
from solar.io.sources import describe_source, expand_sources


def check(root: Path, npy: bool, d: dist.Dist) -> None:
    """One case: the tree at ``root``, of .npy files if ``npy``."""
    comm = d.comm
    opened = []  # files this rank opened (or whose header it read) to describe the dataset
    if npy:
        real = npy_module.npy_header
        npy_module.npy_header = lambda path: (opened.append(path), real(path))[1]
    else:
        real_open = hdf5_module.open_h5
        real_fid = hdf5_module.open_fid  # (the scan's low-level open; open_h5 when it falls back)
        hdf5_module.open_h5 = lambda path: (opened.append(path), real_open(path))[1]
        hdf5_module.open_fid = lambda path: (opened.append(path), real_fid(path))[1]
    info = describe_source(root, one_per_file=True, comm=comm)
    files = expand_sources(root)
    # Rank 0 may also open the first file to learn the keys: at most one file more than a share.
    share = len(files) // d.world_size + 1
    assert len(opened) <= share + 1, (d.rank, len(opened), share)
    assert comm.allreduce(len(set(opened))) >= len(files)  # every file scanned by some rank

    st = info.stored
    digest = hashlib.sha256(repr((info.files, info.keys, info.lengths, info.identity)).encode())
    for a in (st.offsets, st.chunk_rows, st.decodable, st.sizes):
        digest.update(np.ascontiguousarray(a).tobytes())
    assert len(set(comm.allgather(digest.hexdigest()))) == 1  # the identical table everywhere
    assert list(info.files) == files  # in the walk's sorted order

    ld = Loader(
        root, batch_size=3, epochs=2, buffer=4, comm=comm, reader=ReaderConfig(one_per_file=True)
    )
    seen = []
    for epoch in range(2):
        ld.set_epoch(epoch)
        for b in ld:
            for i, s in enumerate(b["index"].numpy()):
                path = files[s]
                if npy:
                    ref = {"data": np.load(path)}
                else:
                    with h5py.File(path) as f:
                        ref = {k.name: f[k.name][()] for k in info.keys}
                for k, v in ref.items():
                    assert b[k][i].numpy().tobytes() == np.asarray(v).tobytes(), (path, k)
            seen.append(b["index"].numpy())
    counts = np.bincount(np.concatenate(comm.allgather(np.concatenate(seen))), minlength=len(files))
    assert (counts == 2).all(), counts
    ld.close()
    print(
        f"{'npy' if npy else 'h5'}: rank {d.rank} of {d.world_size}: ok scanned {len(opened)}",
        flush=True,
    )

    # (the opens counted above were this case's: the modules' own functions back)
    npy_module.npy_header, hdf5_module.open_h5, hdf5_module.open_fid = saved


saved = (npy_module.npy_header, hdf5_module.open_h5, hdf5_module.open_fid)
args = sys.argv[1:]
cases = [(Path(a), args[i + 1 : i + 2] == ["--npy"]) for i, a in enumerate(args) if a != "--npy"]
job = dist.init()
for root, npy in cases:
    check(root, npy, job)
