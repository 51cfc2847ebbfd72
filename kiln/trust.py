"""Who made a file: the keys that seal kiln's artifacts and cache entries.

Machine code runs with the user's rights, so kiln runs native code from a file only when
the file is *sealed*: an HMAC-SHA256 over its bytes, made with a secret key. The **local
key** is 32 random bytes that kiln creates on first use in the user's config directory,
readable by the user alone; a file sealed with it was written by kiln on this machine, for
this user (or by someone who can already read the user's files). **Trusted keys** are
other secret keys the user chose to share — a team's build machine seals with one and the
users put a copy beside their local key — each a file under ``trusted-keys/``.

    <config>/kiln/key                 the local key (created 0600 when first needed)
    <config>/kiln/trusted-keys/*.key  keys whose seals the user accepts (``trust="key"``)

``<config>`` is ``$KILN_CONFIG_DIR`` if set, else ``$XDG_CONFIG_HOME``, else ``~/.config``.
A key file holds 64 hexadecimal digits (a key of 32 bytes), optionally followed by a
newline. A seal names its key by an *id* (a hash of the key, which reveals nothing about
it), so checking a seal tries one key, not all of them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from kiln.errors import Error

KEY_BYTES = 32
ID_BYTES = 16
MAC_BYTES = 32
NO_KEY = b"\0" * ID_BYTES  # the id field of an unsealed file

TRUST_LEVELS = ("local", "key", "any")


def config_dir() -> Path:
    """kiln's directory in the user's configuration (see the module docstring)."""
    root = os.environ.get("KILN_CONFIG_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "kiln"


def key_id(key: bytes) -> bytes:
    """The public name of a key: a hash of it, ID_BYTES long."""
    return hashlib.sha256(b"kiln key id\0" + key).digest()[:ID_BYTES]


def mac(key: bytes, data: bytes | bytearray | memoryview) -> bytes:
    """The HMAC-SHA256 of ``data`` under ``key``."""
    return hmac.new(key, data, hashlib.sha256).digest()


def read_key(path: str | os.PathLike) -> bytes:
    """The key in a key file (64 hex digits), or a `kiln.Error` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError as e:
        raise Error(f"{path}: cannot read the key ({e.strerror or e})") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise Error(f"{path}: not a kiln key (want {2 * KEY_BYTES} hexadecimal digits)")
    return key


def write_key(path: str | os.PathLike, key: bytes | None = None) -> bytes:
    """Write ``key`` (default: a new random one) to ``path``, readable by the user only."""
    key = secrets.token_bytes(KEY_BYTES) if key is None else key
    if len(key) != KEY_BYTES:
        raise Error(f"a kiln key is {KEY_BYTES} bytes, not {len(key)}")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".key.", dir=path.parent)  # created 0600
        with os.fdopen(fd, "w") as f:
            f.write(key.hex() + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise Error(f"{path}: cannot write the key ({e.strerror or e})") from None
    return key


_LOCAL: dict[Path, bytes] = {}


def local_key() -> bytes | None:
    """This user's key on this machine, created on first use; None when the config directory
    can be neither read nor written (nothing is then sealed, and nothing trusted as local)."""
    path = config_dir() / "key"
    key = _LOCAL.get(path)
    if key is not None:
        return key
    try:
        key = read_key(path) if path.exists() else _create(path)
    except Error:
        return None
    _LOCAL[path] = key
    return key


def _create(path: Path) -> bytes:
    """A new local key at ``path``; if another process made one first, that one."""
    key = secrets.token_bytes(KEY_BYTES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_key(path)
    except OSError as e:
        raise Error(f"{path}: cannot create the key ({e.strerror or e})") from None
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


def trusted_keys() -> dict[bytes, bytes]:
    """The keys whose seals ``trust="key"`` accepts, by id: the local key and every readable
    key file under ``trusted-keys/`` (files that are not keys are skipped)."""
    keys: dict[bytes, bytes] = {}
    local = local_key()
    if local is not None:
        keys[key_id(local)] = local
    folder = config_dir() / "trusted-keys"
    try:
        names = sorted(folder.iterdir())
    except OSError:
        names = []
    for p in names:
        if p.suffix == ".key":
            try:
                k = read_key(p)
            except Error:
                continue
            keys[key_id(k)] = k
    return keys


def check_trust(trust: str) -> str:
    """``trust`` if it is a trust level, else a `kiln.Error` listing them."""
    if trust not in TRUST_LEVELS:
        raise Error(f"trust={trust!r}: want one of {', '.join(map(repr, TRUST_LEVELS))}")
    return trust
