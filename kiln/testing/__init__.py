"""Helpers for kiln's tests: hypothesis strategies, random programs, oracles."""
