"""The sample reader: which tasks read a step's samples from the dataset's files.

Contiguous, uncompressed, native-endian datasets are read with ``preadv`` at computed byte
offsets straight into the destination rows (no intermediate copy), rows at most a page apart
one call (the bytes between read into a scratch page, never served); with ``direct_io``
through ``O_DIRECT`` and page-aligned bounce buffers. Chunked datasets whose filters solar
decodes (``solar.io.codecs``) are read chunk by chunk, decoded without the GIL on the
executor's threads; others through h5py, each chunk once per request.
One-sample files (HDF5 or ``.npy``) are read one open per file for all its keys.

What to read is decided by :func:`solar.io.tasks.plan_reads` (pure); the tasks run on the
executor (solar/io/executor.py) against this process's :class:`~solar.io.handles.Files`.
Files and chunk indexes are opened lazily in the process that reads, so a reader survives
fork and spawn.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any

import numpy as np

from solar._process import ProcessLocal
from solar.config import ReaderConfig
from solar.errors import SolarError
from solar.io.chunks import ChunkIndex, chunk_index
from solar.io.codecs import Decoder, decoder_for
from solar.io.executor import Executor, wait_all
from solar.io.fused import fused_codec
from solar.io.handles import Files
from solar.io.info import DatasetInfo
from solar.io.tasks import ChunkSource, FileLayouts, plan_reads


class Reader:
    """Reads samples (global ids over the concatenated files) into rows of numpy arrays.

    Its ``executor`` (``config.thread_count`` threads) runs them; the Loader's tier borrows it.
    """

    def __init__(
        self, info: DatasetInfo, config: ReaderConfig | None = None, throttle: Any = None
    ) -> None:
        config = config or ReaderConfig()
        self.info = info
        self.direct_io = bool(config.direct_io)  # (None, not chosen by a Loader: buffered)
        self.decode_chunks = config.decode_chunks
        self.page_gap = config.page_gap
        self.identity = config.identity
        self.throttle = throttle  # solar.io.throttle.Throttle: an emulated remote file system
        self.executor = Executor(config.thread_count)
        self._starts = np.concatenate([[0], np.cumsum(info.lengths)]).astype(np.int64)
        self._layouts = self._stored_layouts(info)
        self._decoded = self._layouts.decoded_count  # once: a sum over every (file, key)
        self._files: ProcessLocal[Files] = ProcessLocal(self._open)
        # Chunk indexes and decoders by (file, key), built on first use in each process.
        self._sources: ProcessLocal[dict[tuple[int, int], ChunkSource]] = ProcessLocal(dict)

    def _open(self) -> Files:
        return Files(self.info, self.direct_io, self.throttle, self.identity)

    def _stored_layouts(self, info: DatasetInfo) -> FileLayouts:
        """Layouts from what ``describe`` recorded: no file is opened again."""
        if info.stored is None:
            raise SolarError("reader: the dataset description lacks its storage layout")
        st = info.stored
        paths = None
        if info.key_files:
            n = len(info.files)
            paths = np.arange(len(info.keys), dtype=np.int64)[None, :] * n + np.arange(n)[:, None]
        return FileLayouts(
            st.offsets, tuple(k.row_bytes for k in info.keys), st.chunk_rows,
            st.decodable & self.decode_chunks, paths, info.one_per_file,
        )  # fmt: skip

    @property
    def files(self) -> Files:
        """This process's byte source over the dataset's files."""
        return self._files.get()

    def warm_up(self) -> None:
        """Compile the read kernels and open the files: one read of sample 0, discarded."""
        self.executor.warm_up()
        if self._starts[-1] == 0:
            return
        out = [np.empty((1, *k.sample_shape), k.native_dtype) for k in self.info.keys]
        self.read(np.zeros(1, np.int64), out)

    def check_files(self) -> None:
        """Refuse (one line) if a data file changed since it was described or opened: at
        each epoch's start (solar/io/identity.py; reads check their descriptors too)."""
        self.files.check_files()

    def close(self) -> None:
        """Close this process's descriptors and h5py handles, and stop the executor."""
        self.executor.close()
        files = self._files.drop()
        if files is not None:
            files.close()

    # -- reading ---------------------------------------------------------------------------
    def submit(self, samples: np.ndarray, out: list[np.ndarray], rows: np.ndarray) -> list[Future]:
        """Start reading ``samples[j]`` into ``out[key][rows[j]]`` for every key; returns futures.

        Each future's result is ``(bytes read, seconds busy)``.
        """
        return self.executor.start(self.files, self._tasks(samples, out, rows))

    def read(
        self, samples: np.ndarray, out: list[np.ndarray], rows: np.ndarray | None = None
    ) -> int:
        """Blocking :meth:`submit`; returns the bytes read."""
        rows = np.arange(len(samples)) if rows is None else rows
        tasks = self._tasks(samples, out, rows)
        here = self.executor.run_here(self.files, tasks)
        return here if here is not None else wait_all(self.executor.start(self.files, tasks))[0]

    def _tasks(self, samples: np.ndarray, out: list[np.ndarray], rows: np.ndarray) -> list:
        return plan_reads(
            self._layouts, self._starts, samples, out, rows, direct_io=self.direct_io,
            groups=self.executor.threads, chunks=self._chunk_sources(samples),
            page_gap=self.page_gap,
        )  # fmt: skip

    def _chunk_sources(self, samples: np.ndarray) -> dict[tuple[int, int], ChunkSource]:
        """The chunk indexes and decoders of the decoded keys of the files ``samples`` touch,
        built once per (file, key) in this process (an index costs a walk of the file's
        chunk B-tree, so only files actually read pay it)."""
        sources = self._sources.get()
        if len(sources) == self._decoded:
            return sources  # every one built already (or none to build)
        decoded = self._layouts.decoded  # (files, keys) bool
        ids = np.asarray(samples, np.int64)
        files = np.unique(np.searchsorted(self._starts, ids, side="right") - 1)
        files = files[(files >= 0) & (files < decoded.shape[0])]
        for f, k in zip(*np.nonzero(decoded[files]), strict=True):
            key = (int(files[f]), int(k))
            if key not in sources:
                sources[key] = self._chunk_source(*key)
        return sources

    def _chunk_source(self, f: int, k: int) -> ChunkSource:
        path, files = self.info.files[f], self.files
        try:
            with files.h5_lock:
                dset = files.h5file(f)[self.info.keys[k].name]
                index, decoder = chunk_index(dset), decoder_for(dset)
        except OSError as exc:
            raise SolarError(f"{path}: cannot read the chunk index ({exc})") from None
        if not isinstance(decoder, Decoder):  # decided when the reader was built
            raise SolarError(f"{path}: key {self.info.keys[k].name!r}: {decoder.reason}")
        if self.info.one_per_file:
            index, decoder = lift_one_sample(index, decoder)
        return ChunkSource(index, decoder, fused_codec(decoder))


def lift_one_sample(index: ChunkIndex, decoder: Decoder) -> tuple[ChunkIndex, Decoder]:
    """A one-sample file's chunk index and decoder with a leading sample axis of length 1,
    so that the whole dataset is row 0 of the chunk path."""
    starts = np.concatenate([np.zeros((index.starts.shape[0], 1), np.int64), index.starts], 1)
    shape, chunk = (1, *index.shape), (1, *index.chunk_shape)
    lifted = dataclasses.replace(index, shape=shape, chunk_shape=chunk, starts=starts)
    return lifted, dataclasses.replace(decoder, shape=shape, chunk_shape=chunk)
