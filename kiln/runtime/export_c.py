"""The C side of `kiln export`: the header users include, and the wrapper compiled into the library.

The wrapper holds what the program's entry point (kiln/codegen/program.py) takes from its
caller in Python: the ``ctx`` table (each constant's address in the weights section, then each
kernel's address), the argument tables, and the scratch stack. It exposes a C ABI of plain
pointers, one per tensor (tuples flattened), and turns status codes into messages. Everything
but the ``<prefix>_*`` functions is hidden by the linker's version script.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

import numpy as np

from kiln.ir.dtype import dtype_of
from kiln.ir.ty import TensorType

C_TYPES = {
    "bool": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "uint16_t", "float32": "float", "float64": "double",
}
_NOTES = {"bool": "one byte per element, 0 or 1", "float16": "IEEE half-precision bits"}

_C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum
extern float for goto if inline int long register restrict return short signed sizeof static
struct switch typedef union unsigned void volatile while _Bool _Complex _Imaginary bool true
false class new delete this template namespace operator private public protected virtual
workspace""".split())

# Statuses of the wrapper's own; a kernel's failure is (k + 1) << 16 | status, never below.
ERRORS = (("NULL_POINTER", "a tensor pointer is NULL"),
          ("NO_MEMORY", "out of memory: cannot allocate the workspace"),
          ("MISALIGNED_WORKSPACE", "the workspace is not aligned to 64 bytes"),
          ("NO_TILES", "Linux did not grant this process the AMX tile state its kernels use"))


@dataclass(frozen=True)
class CTensor:
    """An input or output of the C entry point: one pointer to a row-major array."""

    name: str  # as the model names it
    c_name: str  # the C parameter
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        # Static: emit_program refuses symbolic shapes before any CTensor is made.
        return self.type.static_shape

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.count * dtype_of(self.type.dtype).itemsize

    @property
    def c_type(self) -> str:
        return C_TYPES[self.type.dtype]

    def describe(self) -> str:
        """``data, float32[2, 64], 128 elements`` (and the model's name when it differs)."""
        shape = ", ".join(str(d) for d in self.shape)
        note = f"; {_NOTES[self.type.dtype]}" if self.type.dtype in _NOTES else ""
        named = (self.c_name if self.c_name == self.name else
                 f"{self.c_name} ({comment_text(self.name)})")
        return f"{named}, {self.type.dtype}[{shape}], {self.count} elements{note}"


def c_identifier(text: str, taken: set[str]) -> str:
    """A C identifier like ``text``, not a keyword and not in ``taken`` (which it joins)."""
    name = re.sub(r"\W", "_", text, flags=re.ASCII) or "t"
    if name[0].isdigit():
        name = "t" + name
    if name in _C_KEYWORDS or keyword.iskeyword(name):
        name += "_"
    base, n = name, 1
    while name in taken:
        name = f"{base}_{n}"
        n += 1
    taken.add(name)
    return name


def comment_text(text: str) -> str:
    """``text`` quoted for a C block comment: a model's names are untrusted, and one holding
    ``*/`` would otherwise end the comment and put its own code in the generated source (and
    ``/*`` inside a comment is a warning compilers may be asked to treat as an error)."""
    return c_string(text).replace("/*", "/\\*").replace("*/", "*\\/")


def c_string(text: str) -> str:
    """A C string literal of ``text`` (UTF-8; anything not plain ASCII as octal escapes)."""
    out = []
    for b in text.encode():
        ch = chr(b)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= b < 127 and ch != "?":  # "?" would make trigraphs in old compilers
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _params(inputs: list[CTensor], outputs: list[CTensor], workspace: bool) -> str:
    ps = [f"const {t.c_type} *{t.c_name}" for t in inputs]
    ps += [f"{t.c_type} *{t.c_name}" for t in outputs]
    if workspace:
        ps.append("void *workspace")
    return ", ".join(ps) or "void"


def run_prototype(prefix: str, inputs: list[CTensor], outputs: list[CTensor]) -> str:
    """``int <prefix>_run(...)``: the entry point's C prototype."""
    return f"int {prefix}_run({_params(inputs, outputs, False)})"


def render_header(prefix: str, library: str, inputs: list[CTensor], outputs: list[CTensor],
                  workspace_bytes: int, target: str, signature: str) -> str:
    """The header of an exported library: tensors, sizes, statuses and prototypes."""
    up = prefix.upper()
    guard = f"KILN_{up}_H"
    lines = [
        f"/* {prefix}.h: the C interface of {library}, exported by kiln from",
        f" *   {signature}",
        f" * for {target}.",
        " *",
        f" * Link with the library (cc main.c ./{library} -Wl,-rpath,'$ORIGIN'), include this",
        " * header, then:",
        " *",
    ]
    for i, t in enumerate(inputs):
        lines.append(f" *   {t.c_type} {t.c_name}[{up}_INPUT_{i}_COUNT];   // fill it")
    for i, t in enumerate(outputs):
        lines.append(f" *   {t.c_type} {t.c_name}[{up}_OUTPUT_{i}_COUNT];")
    args = ", ".join(t.c_name for t in inputs + outputs)
    lines += [
        f" *   int status = {prefix}_run({args});",
        f" *   if (status != {up}_OK) fprintf(stderr, \"%s\\n\", {prefix}_error(status));",
        " *",
        " * Buffers. Every pointer points to a C-contiguous (row-major) array of exactly the",
        " * element count below, aligned to its element type. The library reads exactly that",
        " * many elements of each input and writes exactly that many of each output; it",
        " * never keeps a pointer after the call. Outputs must not overlap inputs or each",
        " * other. Shapes are fixed when the library is made: there is nothing to check at",
        " * run time but that no pointer is NULL.",
        " *",
        f" * Memory. {prefix}_run allocates {up}_WORKSPACE_BYTES of scratch memory per call",
        f" * and frees it; {prefix}_run_with_workspace takes that memory from the caller",
        f" * instead (aligned to {up}_WORKSPACE_ALIGN bytes, private to the call). The",
        " * weights are a read-only section of the library.",
        " *",
        f" * Threads. {prefix}_run may be called from several threads at once. Parallel loops",
        " * run on the library's own thread pool: KILN_NUM_THREADS (read when the library is",
        f" * loaded; default: every core the process may use) or {prefix}_set_num_threads sets",
        " * how many; results do not depend on the count.",
        " *",
        f" * Statuses. 0 is success; {prefix}_error(status) says what any other one means.",
        " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define {up}_NUM_INPUTS {len(inputs)}",
        f"#define {up}_NUM_OUTPUTS {len(outputs)}",
    ]
    for kind, tensors in (("INPUT", inputs), ("OUTPUT", outputs)):
        for i, t in enumerate(tensors):
            m = f"{up}_{kind}_{i}"
            shape = ", ".join(str(d) for d in t.shape) or "1"
            lines += [
                "",
                f"/* {kind.lower()} {i}: {t.describe()} */",
                f"#define {m}_NAME {c_string(t.name)}",
                f'#define {m}_DTYPE "{t.type.dtype}"',
                f"#define {m}_NDIM {len(t.shape)}",
                f"#define {m}_SHAPE {{{shape}}}",
                f"#define {m}_COUNT {t.count}",
                f"#define {m}_BYTES {t.nbytes}",
            ]
    lines += ["", f"#define {up}_WORKSPACE_BYTES {workspace_bytes}",
              f"#define {up}_WORKSPACE_ALIGN 64", "", f"#define {up}_OK 0"]
    for code, (name, message) in enumerate(ERRORS, 1):
        lines.append(f"#define {up}_ERROR_{name} {code}  /* {message} */")
    lines += [
        f"/* Any other status: a check in the model failed at run time ({prefix}_error says",
        " * which), e.g. an index out of range. */",
        "",
        "/* Runs the model: reads every input, fills every output. 0 or an error status. */",
        f"{run_prototype(prefix, inputs, outputs)};",
        "",
        f"/* The same, with {up}_WORKSPACE_BYTES of caller memory, aligned to 64 bytes. */",
        f"int {prefix}_run_with_workspace({_params(inputs, outputs, True)});",
        "",
        "/* What a status means: a static string, never NULL. */",
        f"const char *{prefix}_error(int status);",
        "",
        "/* How many threads a parallel loop may use (process-wide; n >= 1). */",
        f"void {prefix}_set_num_threads(int n);",
        f"int {prefix}_num_threads(void);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {guard} */",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class WrapperParts:
    """What the wrapper binds together."""

    prefix: str
    header: str  # the header's file name
    entry_symbol: str
    kernel_symbols: list[str]  # the kernel part of ctx, in the entry point's order
    kernel_messages: list[list[str]]  # each kernel's status messages (status - 1)
    constant_offsets: list[int]  # each constant's offset in the weights section
    weights_file: str | None  # the raw weights, for .incbin; None when there are none
    tiles: bool = False  # a kernel uses AMX tiles: ask Linux for the tile state at load


def render_wrapper(parts: WrapperParts, inputs: list[CTensor], outputs: list[CTensor]) -> str:
    """The C source of the library's own code (compiled beside the kernels' objects)."""
    p = parts.prefix
    up = p.upper()
    out = [
        f"/* Generated by kiln export: the C entry points of {p}. */",
        "#define _GNU_SOURCE",
        "#include <sched.h>",
        "#include <stdint.h>",
        "#include <stdlib.h>",
        f'#include "{parts.header}"',
    ]
    out += ["", "/* Read by parallel loops each time one starts (kiln/codegen/outline.py). */",
            "int32_t kiln_num_threads = 1;", ""]
    if parts.tiles:
        out += [
            "/* AMX: a process must ask Linux for the tile state before its first tile",
            " * instruction (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), or that faults. */",
            "#include <sys/syscall.h>",
            "#include <unistd.h>",
            "static int kiln_tiles_granted;",
            "__attribute__((constructor)) static void kiln_init_tiles(void) {",
            "    kiln_tiles_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;",
            "}", ""]
    if parts.weights_file is not None:
        # A bare file name, resolved by the assembler in the directory the compiler runs in.
        assert re.fullmatch(r"[\w.-]+", parts.weights_file), parts.weights_file
        out += [
            "/* The weights: one read-only section, each constant 64-byte aligned. */",
            "__asm__(\".section .rodata.kiln_weights,\\\"a\\\"\\n\"",
            "        \".balign 64\\n\"",
            "        \".hidden kiln_weights\\n\"",
            "        \"kiln_weights:\\n\"",
            f"        \".incbin \\\"{parts.weights_file}\\\"\\n\"",
            "        \".previous\\n\");",
            "extern const unsigned char kiln_weights[] __attribute__((visibility(\"hidden\")));",
            "",
        ]
    out.append(f'extern int32_t kiln_entry(void *const *, const void *const *, void *const *, '
               f'void *) __asm__("{parts.entry_symbol}");')
    for i, s in enumerate(parts.kernel_symbols):
        out.append(f'extern int32_t kiln_kernel_{i}(void **) __asm__("{s}");')
    table = [f"(void *)(kiln_weights + {o})" for o in parts.constant_offsets]
    table += [f"(void *)&kiln_kernel_{i}" for i in range(len(parts.kernel_symbols))]
    out += ["", "static void *const kiln_ctx[] = {"]
    out += [f"    {t}," for t in table] or ["    0,"]
    out += ["};", ""]
    for i, msgs in enumerate(parts.kernel_messages):
        out.append(f"static const char *const kiln_messages_{i}[] = {{")
        out += [f"    {c_string(m)}," for m in msgs] or ["    0,"]
        out.append("};")
    out.append("static const struct { int count; const char *const *messages; } "
               "kiln_kernels[] = {")
    out += [f"    {{{len(m)}, kiln_messages_{i}}}," for i, m in enumerate(parts.kernel_messages)]
    out += ["    {0, 0},", "};", ""]
    # Entry points.
    args = ", ".join(t.c_name for t in inputs + outputs)
    checks = [t.c_name for t in inputs + outputs if t.nbytes]
    out += [f"int {p}_run_with_workspace({_params(inputs, outputs, True)}) {{"]
    if checks:
        out.append(f"    if ({' || '.join(f'!{c}' for c in checks)}) "
                   f"return {up}_ERROR_NULL_POINTER;")
    if parts.tiles:
        out.append(f"    if (!kiln_tiles_granted) return {up}_ERROR_NO_TILES;")
    out += [f"    if ((uintptr_t)workspace % 64 != 0) return {up}_ERROR_MISALIGNED_WORKSPACE;",
            "    const void *const ins[] = {" + ", ".join(
                [f"(const void *){t.c_name}" for t in inputs] or ["0"]) + "};",
            "    void *const outs[] = {" + ", ".join(
                [f"(void *){t.c_name}" for t in outputs] or ["0"]) + "};",
            "    return kiln_entry(kiln_ctx, ins, outs, workspace);", "}", "",
            f"int {p}_run({_params(inputs, outputs, False)}) {{",
            "    void *workspace = 0;",
            f"    size_t n = {up}_WORKSPACE_BYTES ? {up}_WORKSPACE_BYTES : 64;",
            f"    if (posix_memalign(&workspace, 64, n) != 0) return {up}_ERROR_NO_MEMORY;",
            f"    int status = {p}_run_with_workspace({args + ', ' if args else ''}workspace);",
            "    free(workspace);", "    return status;", "}", "",
            f"const char *{p}_error(int status) {{",
            '    if (status == 0) return "ok";']
    for code, (_name, message) in enumerate(ERRORS, 1):
        out.append(f"    if (status == {code}) return {c_string(message)};")
    out += [
        "    int k = (status >> 16) - 1, s = status & 0xffff;",
        f"    if (k >= 0 && k < {len(parts.kernel_messages)} && s >= 1 && "
        "s <= kiln_kernels[k].count)",
        "        return kiln_kernels[k].messages[s - 1];",
        '    return "unknown status";',
        "}", "",
        f"void {p}_set_num_threads(int n) {{ kiln_num_threads = n >= 1 ? n : 1; }}",
        f"int {p}_num_threads(void) {{ return kiln_num_threads; }}", "",
        "__attribute__((constructor)) static void kiln_init_threads(void) {",
        '    const char *text = getenv("KILN_NUM_THREADS");',
        "    long n = text ? strtol(text, 0, 10) : 0;",
    ]
    out += [
        "    cpu_set_t cores;",
        "    if (n < 1 && sched_getaffinity(0, sizeof cores, &cores) == 0) n = CPU_COUNT(&cores);",
        "    kiln_num_threads = n >= 1 && n <= 1 << 20 ? (int32_t)n : 1;", "}", ""]
    return "\n".join(out)


def version_script(prefix: str) -> str:
    """The linker's version script: only the ``<prefix>_*`` functions are exported."""
    names = [f"{prefix}_{n}" for n in ("run", "run_with_workspace", "error", "set_num_threads",
                                       "num_threads")]
    return "{\n  global:\n" + "".join(f"    {n};\n" for n in names) + "  local: *;\n};\n"


__all__ = ["C_TYPES", "CTensor", "WrapperParts", "c_identifier", "c_string", "render_header",
           "render_wrapper", "run_prototype", "version_script"]
