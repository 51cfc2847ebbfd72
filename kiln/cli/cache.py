"""``kiln cache``: the machine-code cache on disk (kiln/codegen/cache.py).

    kiln cache info      where it is, how many entries, their total size and the cap
    kiln cache clear     remove every entry

The cache lives at ``$KILN_CACHE``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``;
``KILN_CACHE`` empty, ``0`` or ``off`` (also ``false``, ``no``, ``none``) turns it off.
``KILN_CACHE_MAX_BYTES`` caps it (default 1 GiB).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from kiln.cli.common import add_debug
from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.codegen.cache import DiskCache


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _cache_at() -> tuple[DiskCache | None, str]:
    """The cache directory's DiskCache (or None when off), and why it is off."""
    from kiln import trust
    from kiln.codegen.cache import DiskCache, default_max_bytes, default_root

    root = default_root()
    if root is None:
        value = os.environ.get("KILN_CACHE", "")
        return None, f"the cache is off (KILN_CACHE={value!r})"
    key = trust.local_key()
    if key is None:
        return None, (f"the cache is off: kiln has no local key (it can neither read nor "
                      f"create {trust.config_dir() / 'key'})")
    return DiskCache(root, key, default_max_bytes()), ""


def cmd_info(args: argparse.Namespace) -> int:
    cache, why = _cache_at()
    if cache is None:
        print(f"kiln: {why}")
        return 0
    info = cache.info()
    share = 100.0 * info.total_bytes / info.max_bytes
    print(f"location  {info.root}")
    print(f"entries   {info.entries}")
    print(f"size      {_size(info.total_bytes)} ({info.total_bytes} bytes, {share:.1f} % of "
          f"the cap)")
    print(f"cap       {_size(info.max_bytes)} (KILN_CACHE_MAX_BYTES)")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    cache, why = _cache_at()
    if cache is None:
        raise Error(f"nothing to clear: {why}")
    before = cache.info()
    removed = cache.clear()
    print(f"kiln: removed {removed} entries ({_size(before.total_bytes)}) from {cache.root}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="the machine-code cache: where it is, its size; clear it",
                       description="kiln keeps the machine code of every kernel it compiles "
                       "in a cache directory, sealed with this user's key: $KILN_CACHE, else "
                       "$XDG_CACHE_HOME/kiln, else ~/.cache/kiln (an empty KILN_CACHE turns it "
                       "off), at most KILN_CACHE_MAX_BYTES (default 1 GiB; the least recently "
                       "used entries go first).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="where the cache is, its entries, size and cap")
    add_debug(info)
    info.set_defaults(run=cmd_info)
    clear = actions.add_parser("clear", help="remove every entry")
    add_debug(clear)
    clear.set_defaults(run=cmd_clear)
    add_debug(p)
