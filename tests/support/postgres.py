"""The throwaway PostgreSQL cluster of the lake store's tests: cli/postgres.py's, which the demo
uses too."""

from cli.postgres import Cluster, bin_dir, cluster

__all__ = ["Cluster", "bin_dir", "cluster"]
