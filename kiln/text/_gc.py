"""Pausing Python's cyclic garbage collector while a large program is read or written."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (reference counting still frees memory).

    Parsing and printing allocate hundreds of thousands of small, long-lived objects and no
    reference cycles; the collector's full passes over that growing heap cost about a third of
    the time. It is switched back on afterwards only if it was on before.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
