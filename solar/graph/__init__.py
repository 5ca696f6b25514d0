"""Graphs whose node features solar serves: CSR topology, ingestion, a generator, neighbour
sampling."""

from solar.graph.csr import Graph
from solar.graph.generate import generate_graph
from solar.graph.ingest import write_graph
from solar.graph.neighbor import NeighborSampler, Subgraph

__all__ = ["Graph", "NeighborSampler", "Subgraph", "generate_graph", "write_graph"]
