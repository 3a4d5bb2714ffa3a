"""Intermediate representation: data nodes, op nodes, networks, the op vocabulary."""
from .network import Network
from .node import DataNode, OpNode
from .ops import OPS, schema

__all__ = ["Network", "DataNode", "OpNode", "OPS", "schema"]
