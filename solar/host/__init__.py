"""The host subsystem: what the ranks of one host share and how they coordinate (see README.md
in this package)."""

from solar.host.place import Place, forced_grouping, host_comm, place

__all__ = ["Place", "forced_grouping", "host_comm", "place"]
