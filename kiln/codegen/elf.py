"""The symbol table of an ELF object file: what it defines, and what it needs from outside.

MCJIT resolves an external symbol it cannot find to address 0, so a call through it would
crash the process. Before machine code is loaded, the library checks that every symbol an
object needs is defined by another object of the library, registered with LLVM
(``kiln_num_threads``, ``kiln_parallel_for``), or present in the process (libc, libm).
Reading the table takes a few lines of `struct` over the ELF64 little-endian layout LLVM
emits on x86-64 Linux; anything else is reported as malformed rather than guessed at.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SHT_SYMTAB = 2
_STB_LOCAL = 0
_SHN_UNDEF = 0


class MalformedObject(ValueError):
    """The bytes are not an ELF64 little-endian object this reader understands."""


@dataclass(frozen=True)
class SymbolTable:
    defined: frozenset[str]  # global symbols with a definition in this object
    undefined: frozenset[str]  # symbols referenced but defined elsewhere


def _cstring(data: bytes, start: int, end: int) -> str:
    if not 0 <= start < end <= len(data):
        raise MalformedObject("a symbol name lies outside the file")
    stop = data.find(b"\0", start, end)
    if stop < 0:
        raise MalformedObject("an unterminated symbol name")
    return data[start:stop].decode("utf-8", "replace")


def symbols(data: bytes) -> SymbolTable:
    """The global symbols an object file defines and the ones it needs."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise MalformedObject("not an ELF64 little-endian object")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shentsize < 64 or shoff + shentsize * shnum > len(data):
        raise MalformedObject("the section table lies outside the file")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize)
                for k in range(shnum)]
    defined: set[str] = set()
    undefined: set[str] = set()
    for _name, stype, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if stype != _SHT_SYMTAB:
            continue
        if entsize < 24 or offset + size > len(data) or link >= shnum:
            raise MalformedObject("a symbol table lies outside the file")
        str_off, str_size = sections[link][4], sections[link][5]
        str_end = str_off + str_size
        for pos in range(offset, offset + size - entsize + 1, entsize):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, pos)
            if st_name == 0 or st_info >> 4 == _STB_LOCAL:
                continue
            name = _cstring(data, str_off + st_name, str_end)
            (undefined if st_shndx == _SHN_UNDEF else defined).add(name)
    return SymbolTable(frozenset(defined), frozenset(undefined - defined))
