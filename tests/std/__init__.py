"""Tests of kiln.std."""
