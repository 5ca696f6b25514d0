"""solar: a clairvoyant data loader for distributed PyTorch training on HDF5 datasets."""

import os as _os

# numba caches compiled kernels beside the package; on a read-only install (common on HPC
# systems) point it at a user cache instead, before numba is first imported.
if "NUMBA_CACHE_DIR" not in _os.environ and not _os.access(_os.path.dirname(__file__), _os.W_OK):
    _os.environ["NUMBA_CACHE_DIR"] = _os.path.join(
        _os.environ.get("XDG_CACHE_HOME", _os.path.expanduser("~/.cache")), "solar", "numba"
    )

from solar.config import BufferConfig, ReaderConfig, RunConfig
from solar.errors import CorruptPlanError, PlanMismatchError, SolarError
from solar.graph import Graph, NeighborSampler
from solar.options import ExpertConfig, LoaderConfig, MemoryConfig, PackingConfig, PlanningConfig
from solar.remote import Remote
from solar.schedule import Plan, PlanSpec, load_plan, make_plan
from solar.schedule.draw.samplers import Shuffle, Trace, Weighted
from solar.transform import Transform

__all__ = [
    "BufferConfig",
    "CorruptPlanError",
    "ExpertConfig",
    "Graph",
    "Loader",
    "LoaderConfig",
    "MemoryConfig",
    "NeighborSampler",
    "PackingConfig",
    "Plan",
    "PlanMismatchError",
    "PlanSpec",
    "PlanningConfig",
    "ReaderConfig",
    "Remote",
    "RunConfig",
    "Shuffle",
    "SolarError",
    "Trace",
    "Transform",
    "Weighted",
    "load_plan",
    "make_plan",
]

from solar._version import __version__ as __version__


def __getattr__(name: str):
    # The loader imports torch (seconds); planning and the CLI do not need it.
    if name == "Loader":
        from solar.loader import Loader

        return Loader
    raise AttributeError(f"module 'solar' has no attribute {name!r}")
