"""Workload sources: trace readers and generators."""
