"""solar: a clairvoyant data loader for distributed PyTorch training on HDF5 datasets."""

from solar.config import BufferConfig, RunConfig
from solar.errors import CorruptPlanError, PlanMismatchError, SolarError
from solar.schedule import Plan, PlanSpec, load_plan, make_plan

__all__ = [
    "BufferConfig",
    "CorruptPlanError",
    "Loader",
    "Plan",
    "PlanMismatchError",
    "PlanSpec",
    "RunConfig",
    "SolarError",
    "load_plan",
    "make_plan",
]

__version__ = "0.1.0"


def __getattr__(name: str):
    # The loader imports torch (seconds); planning and the CLI do not need it.
    if name == "Loader":
        from solar.loader import Loader

        return Loader
    raise AttributeError(f"module 'solar' has no attribute {name!r}")
