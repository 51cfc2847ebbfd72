"""The machine code is generated for, as a value: `Target`.

A target is an LLVM triple, a CPU name, the CPU's features (LLVM's names, without the sign:
``avx2``, ``avx512f``, ``avx512vnni``, ``avxvnni``, ``fma``, ``neon``), its data-cache sizes
and its core count. Everything a kernel's schedule depends on — vector width, register count,
cache blocking, whether a loop is worth a parallel region — is derived from it, and the code
generator builds for it (kiln/codegen/target.py), so one process can make code for another
machine (``Target.parse("aarch64-linux-gnu")``) or for a narrower one
(``Target.parse("llvm -mattr=-avx512f")``: this CPU without AVX-512, i.e. AVX2 code).

Spec strings, as LLVM's tools spell them::

    llvm                                  this machine (Target.host())
    llvm -mcpu=znver5                     another CPU of this architecture
    llvm -mattr=-avx512f,+avxvnni          this CPU with features removed or added
    llvm -mtriple=aarch64-linux-gnu        another architecture (a generic CPU of it)
    aarch64-linux-gnu                      the same, as a bare triple

Removing a feature removes the ones that need it (``-avx512f`` takes every ``avx512*`` with
it; ``-avx2`` takes AVX-512 and AVX-VNNI), so the result is a CPU that could exist. The
features of a CPU named by ``-mcpu`` come from the host when it is this CPU; llvmlite cannot
list the features of any other CPU name, so they come from `CPU_FEATURES`, a small table of
common names (an unknown name is an error rather than a guess).

`Target.fingerprint` hashes what changes the machine code for a given kernel (triple, CPU,
features); cache sizes and cores change the kernels' loop IR instead, which their own
fingerprint covers.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
from dataclasses import dataclass
from functools import cache

from kiln.errors import Error

# Architectures kiln generates code for, by the first component of a triple.
_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
_GENERIC_CPU = {"x86_64": "x86-64", "aarch64": "generic"}

_X86_64 = frozenset({"64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2"})
_X86_V2 = _X86_64 | {"cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3", "crc32"}
_X86_V3 = _X86_V2 | {"avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"}
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})
_X86_V4 = _X86_V3 | _AVX512
_ICELAKE = _X86_V4 | {"avx512vnni", "avx512vbmi", "avx512vbmi2", "avx512bitalg",
                      "avx512vpopcntdq", "avx512ifma", "gfni", "vaes", "vpclmulqdq", "aes",
                      "pclmul", "sha"}
_ZEN = _X86_V3 | {"aes", "pclmul", "sha", "adx", "clzero", "sse4a", "rdrnd", "rdseed"}
_ZEN4 = _ZEN | _ICELAKE | {"avx512bf16"}
_ARM_BASE = frozenset({"neon", "fp-armv8"})
_ARMV82 = _ARM_BASE | {"crc", "lse", "rdm", "rcpc", "dotprod", "fullfp16"}

# Features of common CPU names (what llvmlite cannot tell for a CPU other than the host's).
# Only what code generation cares about is listed: ISA levels and vector extensions.
CPU_FEATURES: dict[tuple[str, str], frozenset[str]] = {
    ("x86_64", "x86-64"): _X86_64,
    ("x86_64", "x86-64-v2"): frozenset(_X86_V2),
    ("x86_64", "x86-64-v3"): frozenset(_X86_V3),
    ("x86_64", "x86-64-v4"): frozenset(_X86_V4),
    ("x86_64", "haswell"): frozenset(_X86_V3),
    ("x86_64", "skylake"): frozenset(_X86_V3 | {"adx", "rdseed"}),
    ("x86_64", "skylake-avx512"): frozenset(_X86_V4 | {"adx", "rdseed"}),
    ("x86_64", "icelake-server"): frozenset(_ICELAKE),
    ("x86_64", "sapphirerapids"): frozenset(_ICELAKE | {"avx512bf16", "avx512fp16", "avxvnni",
                                                         "amx-tile", "amx-int8", "amx-bf16"}),
    ("x86_64", "znver2"): frozenset(_ZEN),
    ("x86_64", "znver3"): frozenset(_ZEN | {"vaes", "vpclmulqdq"}),
    ("x86_64", "znver4"): frozenset(_ZEN4),
    ("x86_64", "znver5"): frozenset(_ZEN4 | {"avxvnni", "avx512vp2intersect"}),
    ("aarch64", "generic"): _ARM_BASE,
    ("aarch64", "cortex-a72"): frozenset(_ARM_BASE | {"crc"}),
    ("aarch64", "neoverse-n1"): frozenset(_ARMV82),
    ("aarch64", "neoverse-v1"): frozenset(_ARMV82 | {"sve", "bf16", "i8mm"}),
    ("aarch64", "neoverse-v2"): frozenset(_ARMV82 | {"sve", "sve2", "bf16", "i8mm"}),
    ("aarch64", "apple-m1"): frozenset(_ARMV82 | {"sha3", "fp16fml"}),
}

# Which features need which: removing a key removes the features listed under it (and, in
# turn, theirs). Every avx512* feature also needs avx512f (see `_dependents`).
_NEEDED_BY: dict[str, tuple[str, ...]] = {
    "sse": ("sse2",), "sse2": ("sse3",), "sse3": ("ssse3",), "ssse3": ("sse4.1",),
    "sse4.1": ("sse4.2",), "sse4.2": ("avx",), "avx": ("avx2", "fma", "f16c", "vaes"),
    "avx2": ("avx512f", "avxvnni", "avxifma", "avxvnniint8", "avxvnniint16", "avxneconvert"),
    "fma": ("avx512f",), "f16c": ("avx512f",), "avx512f": ("amx-avx512",),
    "avx512bw": ("avx512bitalg", "avx512vbmi", "avx512vbmi2", "avx512fp16", "avx512bf16"),
    "neon": ("sve", "dotprod", "i8mm", "bf16", "fullfp16", "rdm", "sha3", "fp16fml"),
    "fp-armv8": ("neon",), "sve": ("sve2",), "fullfp16": ("fp16fml",),
    "amx-tile": ("amx-int8", "amx-bf16", "amx-fp16", "amx-complex", "amx-fp8", "amx-tf32",
                 "amx-movrs", "amx-avx512"),
}

# Default caches and cores of a machine kiln cannot look at (a CPU other than this one's).
_DEFAULT_CACHES = (32 * 1024, 1024 * 1024, 16 * 1024 * 1024)
_DEFAULT_CORES = 8

_DTYPE_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64, "int8": 8,
               "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32, "int64": 64,
               "uint64": 64, "bool": 8}


def _arch(triple: str) -> str | None:
    return _ARCH_ALIASES.get(triple.split("-", 1)[0].lower())


def _dependents(feature: str, present: frozenset[str]) -> set[str]:
    """``feature`` and every feature of ``present`` that needs it (iteratively)."""
    out: set[str] = set()
    stack = [feature]
    while stack:
        f = stack.pop()
        if f in out:
            continue
        out.add(f)
        stack.extend(_NEEDED_BY.get(f, ()))
        if f == "avx512f":
            stack.extend(p for p in present if p.startswith(("avx512", "avx10")))
    return out


@dataclass(frozen=True, repr=False)
class Target:
    """The machine code is generated for (see the module docstring)."""

    triple: str
    cpu: str
    features: frozenset[str]
    l1d: int = _DEFAULT_CACHES[0]  # bytes of L1 data cache, per core
    l2: int = _DEFAULT_CACHES[1]  # bytes of L2, per core
    l3: int = _DEFAULT_CACHES[2]  # bytes of L3 (shared)
    cores: int = _DEFAULT_CORES  # cores a parallel loop may be split over

    def __post_init__(self) -> None:
        if _arch(self.triple) is None:
            raise Error(f"kiln cannot generate code for the triple {self.triple!r}: it knows "
                        f"the architectures {', '.join(sorted(set(_ARCH_ALIASES.values())))}")
        object.__setattr__(self, "features", frozenset(self.features))

    # --- derived properties ------------------------------------------------------------------

    @property
    def arch(self) -> str:
        """``x86_64`` or ``aarch64``."""
        arch = _arch(self.triple)
        assert arch is not None  # checked in __post_init__
        return arch

    @property
    def vector_bits(self) -> int:
        """The width of a vector register: 512 (AVX-512), 256 (AVX, AVX2) or 128."""
        if self.arch == "x86_64":
            if "avx512f" in self.features:
                return 512
            if "avx" in self.features or "avx2" in self.features:
                return 256
        return 128  # SSE2 (every x86-64), NEON

    @property
    def registers(self) -> int:
        """How many vector registers there are: 32 with AVX-512 or on aarch64, else 16."""
        if self.arch == "aarch64" or "avx512f" in self.features:
            return 32
        return 16

    def lanes(self, dtype: str) -> int:
        """Elements of ``dtype`` in one vector register."""
        bits = _DTYPE_BITS.get(dtype)
        if bits is None:
            raise Error(f"unknown dtype {dtype!r}")
        return max(1, self.vector_bits // bits)

    def has(self, feature: str) -> bool:
        """Whether the CPU has ``feature`` (LLVM's name, with or without a leading +)."""
        return feature.lstrip("+") in self.features

    @property
    def is_host(self) -> bool:
        """Whether this machine can run code built for the target: the same architecture,
        and every feature of the target present in this CPU."""
        host = Target.host()
        return self.arch == host.arch and self.features <= host.features

    @property
    def llvm_features(self) -> str:
        """The feature string for LLVM: ``+f`` for each feature, ``-f`` for each other one
        LLVM knows of this architecture (so that the CPU name implies nothing removed)."""
        minus = sorted(_known_features(self.arch) - self.features)
        return ",".join([f"+{f}" for f in sorted(self.features)] + [f"-{f}" for f in minus])

    @property
    def fingerprint(self) -> str:
        """A short hash of what changes machine code: triple, CPU and features."""
        text = f"{self.triple}|{self.cpu}|{','.join(sorted(self.features))}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __str__(self) -> str:
        """The canonical spec: ``Target.parse(str(t))`` is ``t`` (the features spelled out,
        with every other known one removed, so the CPU name implies nothing more)."""
        return f"llvm -mtriple={self.triple} -mcpu={self.cpu} -mattr={self.llvm_features}"

    def __repr__(self) -> str:
        return (f"<Target {self.triple} {self.cpu}, {self.vector_bits}-bit, "
                f"{len(self.features)} features, {self.fingerprint}>")

    def describe(self) -> str:
        """One line for people: triple, CPU, vector width, registers, caches, cores."""
        return (f"{self.triple} {self.cpu}: {self.vector_bits}-bit vectors, {self.registers} "
                f"registers, L1d {self.l1d // 1024} KiB, L2 {self.l2 // 1024} KiB, "
                f"L3 {self.l3 // 1024} KiB, {self.cores} cores")

    def to_json(self) -> dict:
        """The target as JSON data (saved beside machine code; `from_json` reads it)."""
        return {"spec": str(self), "fingerprint": self.fingerprint, "triple": self.triple,
                "cpu": self.cpu, "features": sorted(self.features), "l1d": self.l1d,
                "l2": self.l2, "l3": self.l3, "cores": self.cores}

    @staticmethod
    def from_json(doc: dict) -> Target:
        """The target `to_json` wrote (its fields as saved: no table is consulted)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("features"), list):
            raise Error("a saved target must be an object with a list of features")
        sizes = [doc[k] for k in ("l1d", "l2", "l3", "cores")]
        if not all(type(n) is int and 0 <= n < 1 << 48 for n in sizes):
            raise Error(f"a saved target's cache sizes and cores must be integers, not {sizes}")
        t = Target(str(doc["triple"]), str(doc["cpu"]),
                   frozenset(str(f) for f in doc["features"]), *sizes)
        if "fingerprint" in doc and doc["fingerprint"] != t.fingerprint:
            raise Error(f"the saved target's fingerprint {doc['fingerprint']!r} does not match "
                        f"its fields ({t.fingerprint})")
        return t

    # --- constructors ------------------------------------------------------------------------

    @staticmethod
    def host() -> Target:
        """This machine: LLVM's name and features for its CPU, its caches and cores."""
        return _host()

    @staticmethod
    def parse(spec: str | Target) -> Target:
        """The target a spec string names (see the module docstring); a `Target` as is."""
        if isinstance(spec, Target):
            return spec
        if not isinstance(spec, str):
            raise Error(f"a target is a string such as 'llvm' or a kiln.Target, not "
                        f"{type(spec).__name__}")
        return _parse(spec)


def _parse(spec: str) -> Target:
    words = spec.split()
    if not words:
        raise Error("empty target; use 'llvm' (this machine), 'llvm -mcpu=NAME', "
                    "'llvm -mattr=+f,-g' or a triple such as 'aarch64-linux-gnu'")
    head, options = words[0], words[1:]
    triple = cpu = None
    if head != "llvm":
        if head == "evaluator":
            raise Error("'evaluator' is not a machine: it is a backend of "
                        "kiln.runtime.compiler.compile_kernels, not a Target")
        if "-" not in head or head.startswith("-"):
            raise Error(f"unknown target {spec!r}: it must start with 'llvm' or a triple such "
                        "as 'aarch64-linux-gnu'")
        triple = head
    attrs: list[str] = []
    for opt in options:
        name, eq, value = opt.partition("=")
        if not eq or not value:
            raise Error(f"malformed option {opt!r} in target {spec!r}; expected -mtriple=T, "
                        "-mcpu=NAME or -mattr=+f,-g")
        if name == "-mtriple":
            triple = value
        elif name == "-mcpu":
            cpu = value
        elif name == "-mattr":
            attrs.extend(a for a in value.split(",") if a)
        else:
            raise Error(f"unknown option {name!r} in target {spec!r}; kiln knows -mtriple, "
                        "-mcpu and -mattr")
    host = Target.host()
    triple = triple or host.triple
    arch = _arch(triple)
    if arch is None:
        raise Error(f"unknown target triple {triple!r} in {spec!r}: kiln generates code for "
                    "x86_64 and aarch64")
    _check_triple(triple, spec)
    if cpu == "native":
        cpu = host.cpu
    same_machine = arch == host.arch and cpu in (None, host.cpu)
    if same_machine:
        base = host
        features = host.features
        cpu = host.cpu
    else:
        cpu = cpu or _GENERIC_CPU[arch]
        known = CPU_FEATURES.get((arch, cpu))
        if known is None:
            names = sorted(c for a, c in CPU_FEATURES if a == arch)
            raise Error(f"unknown CPU {cpu!r} for {arch} in target {spec!r}; kiln knows "
                        f"the host's ({host.cpu}) and {', '.join(names)}")
        features = known
        base = None
    for a in attrs:
        sign, name = (a[0], a[1:]) if a[0] in "+-" else ("+", a)
        if not name:
            raise Error(f"malformed feature {a!r} in target {spec!r}")
        if sign == "+":
            features = features | {name}
        else:
            features = features - _dependents(name, features)
    if base is not None:
        return Target(triple, cpu, features, base.l1d, base.l2, base.l3, base.cores)
    return Target(triple, cpu, features)


_llvm_lock = threading.Lock()
_llvm_ready: set[str] = set()


def _llvm(all_targets: bool = False):  # noqa: ANN202 - the llvmlite.binding module
    """llvmlite's binding, with the native target (and with ``all_targets``, every target
    this LLVM was built with) initialized, once per process."""
    import llvmlite.binding as llvm

    want = "all" if all_targets else "native"
    if want not in _llvm_ready:
        with _llvm_lock:
            if "native" not in _llvm_ready:
                llvm.initialize_native_target()
                llvm.initialize_native_asmprinter()
                llvm.initialize_native_asmparser()
                _llvm_ready.add("native")
            if all_targets and "all" not in _llvm_ready:
                llvm.initialize_all_targets()
                llvm.initialize_all_asmprinters()
                _llvm_ready.add("all")
    return llvm


def _check_triple(triple: str, spec: str) -> None:
    """LLVM knows the triple (it is built with that architecture's back end)."""
    llvm = _llvm(all_targets=True)
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise Error(f"LLVM cannot generate code for {triple!r} (target {spec!r}): "
                    f"{str(exc).strip()}") from None


@cache
def _known_features(arch: str) -> frozenset[str]:
    """Every feature name of ``arch`` that kiln or this LLVM knows (for the ``-f`` list)."""
    names: set[str] = set()
    for (a, _), fs in CPU_FEATURES.items():
        if a == arch:
            names |= fs
    for parent, children in _NEEDED_BY.items():
        if (parent in names) or any(c in names for c in children):
            names.add(parent)
            names.update(children)
    host = Target.host()
    if host.arch == arch:
        names |= _host_feature_map().keys()
    if arch != "x86_64":
        names = {n for n in names if not n.startswith(("avx", "sse", "amx"))}
    else:
        names -= {"neon", "fp-armv8", "sve", "sve2", "dotprod", "i8mm", "bf16", "fullfp16",
                  "rdm", "sha3", "fp16fml", "crc", "lse", "rcpc"}
    return frozenset(names)


@cache
def _host_feature_map() -> dict[str, bool]:
    return {name: bool(on) for name, on in _llvm().get_host_cpu_features().items()}


def _cache_sizes() -> tuple[int, int, int]:
    """Per-core L1d and L2, and L3, in bytes: sysfs, else sysconf, else defaults."""
    found: dict[int, int] = {}
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            with open(f"{root}/{entry}/level") as f:
                level = int(f.read())
            with open(f"{root}/{entry}/type") as f:
                kind = f.read().strip()
            with open(f"{root}/{entry}/size") as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not text:
            continue
        scale = {"K": 1024, "M": 1024 * 1024, "G": 1024 ** 3}.get(text[-1], 1)
        try:
            found[level] = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
    for level, name in ((1, "SC_LEVEL1_DCACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE"),
                        (3, "SC_LEVEL3_CACHE_SIZE")):
        if level not in found:
            try:
                value = os.sysconf(name)
            except (ValueError, OSError):
                value = 0
            if value > 0:
                found[level] = value
    return (found.get(1, _DEFAULT_CACHES[0]), found.get(2, _DEFAULT_CACHES[1]),
            found.get(3, found.get(2, _DEFAULT_CACHES[2])))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Linux's arch_prctl: ask for the AMX tile data state (XFEATURE_XTILEDATA, 18), which a
# process must do before its first tile instruction (without it: SIGILL).
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@cache
def amx_usable() -> bool:
    """Whether this process may run AMX tile instructions: on x86-64 Linux, once the kernel
    grants the tile state (asked once, for the whole process and all its threads). The host
    Target has AMX's features only when it may."""
    if platform.system() != "Linux" or _arch(platform.machine()) != "x86_64":
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


@cache
def _host() -> Target:
    llvm = _llvm()
    triple = llvm.get_process_triple()
    if _arch(triple) is None:
        raise Error(f"kiln cannot generate code for this machine ({triple}, "
                    f"{platform.machine()})")
    features = frozenset(name for name, on in _host_feature_map().items() if on)
    if "amx-tile" in features and not amx_usable():
        features = frozenset(f for f in features if not f.startswith("amx-"))
    l1d, l2, l3 = _cache_sizes()
    return Target(triple, llvm.get_host_cpu_name(), features, l1d, l2, l3, _cores())


__all__ = ["CPU_FEATURES", "Target", "amx_usable"]
