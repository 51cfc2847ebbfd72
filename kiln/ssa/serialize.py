"""The SSA program as plain data (JSON-able dicts and lists) and back: what a saved
executable holds. No pickle: reading it builds only kiln's own objects, and every field is
checked as it is read — a malformed document is a `kiln.Error`, never a crash.

Types are written once each into a table and referred to by index:
``["tensor", [2, "n", "?"], "float32"]``, ``["tuple", [i, j]]``, ``["func", [args], ret,
[type params]]``, ``["adt", "List", [args]]``, ``["ref", i]``, ``["tvar", "A"]``. Values of a
function are numbered in block order (each block's parameters, then its instructions);
operands refer to those numbers. Constants are described (dtype, shape) but their bytes are
kept elsewhere (the artifact's constant section).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.ir.adt import Constructor
from kiln.ir.expr import Function as RelayFunction
from kiln.ir.module import IRModule
from kiln.ir.ty import (
    ANY,
    DTYPES,
    Dim,
    FuncType,
    GlobalTypeVar,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
    type_children,
)
from kiln.ssa.ir import (
    INSTRUCTIONS,
    TERMINATORS,
    Block,
    BlockArg,
    Function,
    Instr,
    KernelDecl,
    Program,
    Target,
    Terminator,
    Value,
)


class Malformed(Error):
    """A saved program that does not read back."""


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise Malformed(f"malformed program: {what}")


# --- types ---------------------------------------------------------------------------------------


class TypeWriter:
    """Numbers each distinct type; children are written before their parents."""

    def __init__(self) -> None:
        self.table: list[Any] = []
        self.index: dict[Any, int] = {}

    def __call__(self, ty: Type) -> int:
        stack: list[tuple[Type, bool]] = [(ty, False)]
        while stack:
            t, ready = stack.pop()
            key = self._key(t)
            if key in self.index:
                continue
            kids = type_children(t)
            if not ready and any(self._key(k) not in self.index for k in kids):
                stack.append((t, True))
                stack.extend((k, False) for k in kids)
                continue
            self.index[key] = len(self.table)
            self.table.append(self._entry(t))
        return self.index[self._key(ty)]

    @staticmethod
    def _key(t: Type) -> Any:
        if isinstance(t, TypeVar):
            return ("tvar", t.name)
        return t

    def _entry(self, t: Type) -> list[Any]:
        ix = self.index
        k = self._key
        match t:
            case TensorType():
                dims = [d if type(d) is int else (d.name if isinstance(d, SymDim) else "?")
                        for d in t.shape]
                return ["tensor", dims, t.dtype]
            case TupleType():
                return ["tuple", [ix[k(f)] for f in t.fields]]
            case FuncType():
                return ["func", [ix[k(a)] for a in t.arg_types], ix[k(t.ret_type)],
                        [v.name for v in t.type_params]]
            case TypeCall():
                return ["adt", t.func.name, [ix[k(a)] for a in t.args]]
            case RefType():
                return ["ref", ix[k(t.value)]]
            case TypeVar():
                return ["tvar", t.name]
            case GlobalTypeVar():
                return ["adt", t.name, []]
        raise Malformed(f"cannot save a value of type {t}")


def read_types(table: Any) -> list[Type]:
    """The types of a table written by `TypeWriter` (each entry refers only to earlier ones)."""
    _need(isinstance(table, list), "the type table is not a list")
    out: list[Type] = []
    tvars: dict[str, TypeVar] = {}

    def ref(i: Any) -> Type:
        _need(type(i) is int and 0 <= i < len(out), f"type reference {i!r}")
        return out[i]

    for entry in table:
        _need(isinstance(entry, list) and len(entry) > 0 and isinstance(entry[0], str),
              "a type entry")
        kind = entry[0]
        try:
            if kind == "tensor":
                _, dims, dtype = entry
                _need(isinstance(dims, list) and dtype in DTYPES, "a tensor type")
                shape: list[Dim] = []
                for d in dims:
                    if type(d) is int and d >= 0:
                        shape.append(d)
                    elif d == "?":
                        shape.append(ANY)
                    else:
                        _need(isinstance(d, str) and d.isidentifier(), f"a dimension {d!r}")
                        shape.append(SymDim(d))
                out.append(TensorType(tuple(shape), dtype))
            elif kind == "tuple":
                _need(isinstance(entry[1], list), "a tuple type")
                out.append(TupleType(tuple(ref(i) for i in entry[1])))
            elif kind == "func":
                _, args, ret, tps = entry
                _need(isinstance(args, list) and isinstance(tps, list), "a function type")
                params = tuple(tvars.setdefault(str(n), TypeVar(str(n))) for n in tps)
                out.append(FuncType(tuple(ref(i) for i in args), ref(ret), params))
            elif kind == "adt":
                _, name, args = entry
                _need(isinstance(name, str) and isinstance(args, list), "an ADT type")
                out.append(TypeCall(GlobalTypeVar(name), tuple(ref(i) for i in args)))
            elif kind == "ref":
                out.append(RefType(ref(entry[1])))
            elif kind == "tvar":
                _need(isinstance(entry[1], str), "a type variable")
                out.append(tvars.setdefault(entry[1], TypeVar(entry[1])))
            else:
                raise Malformed(f"malformed program: unknown type kind {kind!r}")
        except (ValueError, TypeError, IndexError) as e:
            raise Malformed(f"malformed program: a {kind} type entry ({e})") from None
    return out


# --- writing -------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    raise Malformed(f"cannot save an attribute value {value!r}")


def write_program(prog: Program, relay_text: Any = None) -> dict[str, Any]:
    """``prog`` as JSON-able data. ``relay_text(fn)`` writes a dynamic kernel's function."""
    types = TypeWriter()
    adts: dict[str, dict[str, Any]] = {}
    for name, tvs in prog.adt_params.items():
        adts[name] = {"name": name, "vars": [types(t) for t in tvs], "ctors": []}
    for c in prog.constructors.values():
        adt = adts.setdefault(c.belong_to.name, {"name": c.belong_to.name, "vars": [],
                                                 "ctors": []})
        adt["ctors"].append({"name": c.name, "inputs": [types(t) for t in c.inputs]})
    kernels = []
    for k in prog.kernels.values():
        entry = {"name": k.name, "inputs": [types(t) for t in k.inputs],
                 "outputs": [types(t) for t in k.outputs], "ops": list(k.ops), "func": None}
        if k.location is not None:
            entry["location"] = k.location
        if not k.is_static and k.func is not None and relay_text is not None:
            entry["func"] = relay_text(k.func)
        kernels.append(entry)
    functions = []
    for fn in prog.functions.values():
        ids: dict[Value, int] = {}
        for b in fn.blocks:
            for p in b.params:
                ids[p] = len(ids)
            for ins in b.instrs:
                ids[ins] = len(ids)
        bindex = {b: i for i, b in enumerate(fn.blocks)}
        blocks = []
        for b in fn.blocks:
            t = b.terminator
            term = None
            if t is not None:
                term = [t.op, [ids[v] for v in t.operands],
                        [[bindex[x.block], [ids[v] for v in x.args]] for x in t.targets],
                        {k: _jsonable(v) for k, v in t.attrs.items()}]
            blocks.append({
                "name": b.name,
                "params": [[types(p.type), p.hint] for p in b.params],
                "instrs": [[ins.op, types(ins.type), [ids[v] for v in ins.operands],
                            {k: _jsonable(v) for k, v in ins.attrs.items()}, ins.hint]
                           for ins in b.instrs],
                "term": term,
            })
        functions.append({"name": fn.name, "ret": types(fn.ret_type),
                          "type_params": list(fn.type_params), "arena_bytes": fn.arena_bytes,
                          "blocks": blocks})
    constants = [{"dtype": c.dtype.name, "shape": list(c.shape)} for c in prog.constants]
    return {"entry": prog.entry, "types": types.table, "adts": list(adts.values()),
            "kernels": kernels, "constants": constants, "functions": functions}


# --- reading -------------------------------------------------------------------------------------


def _str(x: Any, what: str) -> str:
    _need(isinstance(x, str), what)
    return x


def _list(x: Any, what: str) -> list[Any]:
    _need(isinstance(x, list), what)
    return x


def read_program(doc: Any, constants: list[np.ndarray], parse_relay: Any = None) -> Program:
    """The program of a document written by `write_program`, with its constants' arrays."""
    try:
        return _read_program(doc, constants, parse_relay)
    except Malformed:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, InternalError,
            RecursionError) as e:
        raise Malformed(f"malformed program ({type(e).__name__}: {e})") from None


def _read_program(doc: Any, constants: list[np.ndarray], parse_relay: Any) -> Program:
    _need(isinstance(doc, dict), "the program is not an object")
    types = read_types(doc.get("types"))

    def ty(i: Any) -> Type:
        _need(type(i) is int and 0 <= i < len(types), f"type reference {i!r}")
        return types[i]

    prog = Program(entry=_str(doc.get("entry"), "the entry name"))
    descs = _list(doc.get("constants"), "the constant list")
    _need(len(descs) == len(constants), "the constants do not match their descriptions")
    for d, c in zip(descs, constants):
        _need(isinstance(d, dict) and d.get("dtype") == c.dtype.name
              and d.get("shape") == list(c.shape), "a constant's description")
        prog.constants.append(c)
    for adt in _list(doc.get("adts"), "the ADT list"):
        _need(isinstance(adt, dict), "an ADT")
        header = GlobalTypeVar(_str(adt.get("name"), "an ADT name"))
        params = tuple(ty(i) for i in _list(adt.get("vars"), "ADT type parameters"))
        tvs = tuple(t for t in params if isinstance(t, TypeVar))
        _need(len(tvs) == len(params), "ADT type parameters")
        prog.adt_params[header.name] = tvs
        for c in _list(adt.get("ctors"), "constructors"):
            _need(isinstance(c, dict), "a constructor")
            name = _str(c.get("name"), "a constructor name")
            inputs = tuple(ty(i) for i in _list(c.get("inputs"), "constructor fields"))
            _need(name not in prog.constructors, f"constructor {name} twice")
            prog.constructors[name] = Constructor(name, inputs, header)
    for k in _list(doc.get("kernels"), "the kernel list"):
        _need(isinstance(k, dict), "a kernel")
        name = _str(k.get("name"), "a kernel name")
        in_types = [ty(i) for i in _list(k.get("inputs"), "kernel inputs")]
        out_types = [ty(i) for i in _list(k.get("outputs"), "kernel outputs")]
        ins = tuple(t for t in in_types if isinstance(t, TensorType))
        outs = tuple(t for t in out_types if isinstance(t, TensorType))
        _need(len(ins) == len(in_types) and len(outs) == len(out_types), "kernel types")
        ops = tuple(_str(o, "an operator name") for o in _list(k.get("ops"), "kernel ops"))
        func: RelayFunction | None = None
        if k.get("func") is not None:
            _need(parse_relay is not None, "a dynamic kernel with no way to read it")
            func = parse_relay(_str(k["func"], "a kernel function"))
        location = k.get("location")  # optional: files written before it existed lack it
        if location is not None:
            location = _str(location, "a kernel's source location")
        _need(name not in prog.kernels, f"kernel {name} twice")
        prog.kernels[name] = KernelDecl(name, ins, outs, func, None, ops, location)
    for f in _list(doc.get("functions"), "the function list"):
        fn = _read_function(f, ty)
        _need(fn.name not in prog.functions, f"function {fn.name} twice")
        prog.functions[fn.name] = fn
    return prog


def _read_function(f: Any, ty: Any) -> Function:
    _need(isinstance(f, dict), "a function")
    blocks_doc = _list(f.get("blocks"), "blocks")
    _need(len(blocks_doc) > 0, "a function with no blocks")
    values: list[Value] = []
    blocks: list[Block] = []
    pending: list[tuple[Any, list[Any]]] = []  # (instruction or block, operand ids)
    for bd in blocks_doc:
        _need(isinstance(bd, dict), "a block")
        params = []
        for p in _list(bd.get("params"), "block parameters"):
            _need(isinstance(p, list) and len(p) == 2, "a block parameter")
            arg = BlockArg(ty(p[0]), _str(p[1], "a parameter name"))
            params.append(arg)
            values.append(arg)
        b = Block(_str(bd.get("name"), "a block name"), params)
        for i in _list(bd.get("instrs"), "instructions"):
            _need(isinstance(i, list) and len(i) == 5, "an instruction")
            op, t, operands, attrs, hint = i
            _need(isinstance(op, str) and op in INSTRUCTIONS, f"unknown instruction {op!r}")
            _need(isinstance(attrs, dict), "instruction attributes")
            ins = b.append(Instr(op, [], ty(t), attrs, _str(hint, "a value name")))
            values.append(ins)
            pending.append((ins, _list(operands, "operands")))
        blocks.append(b)
    for ins, ids in pending:
        ins.operands = [_value(values, v) for v in ids]
    for b, bd in zip(blocks, blocks_doc):
        term = bd.get("term")
        if term is None:
            continue
        _need(isinstance(term, list) and len(term) == 4, "a terminator")
        op, operands, targets, attrs = term
        _need(isinstance(op, str) and op in TERMINATORS and isinstance(attrs, dict),
              f"terminator {op!r}")
        tgts = []
        for x in _list(targets, "branch targets"):
            _need(isinstance(x, list) and len(x) == 2 and type(x[0]) is int
                  and 0 <= x[0] < len(blocks), "a branch target")
            tgts.append(Target(blocks[x[0]], [_value(values, v) for v in _list(x[1], "args")]))
        b.terminate(Terminator(op, [_value(values, v) for v in _list(operands, "operands")],
                               tgts, attrs))
    entry = blocks[0]
    fn = Function(_str(f.get("name"), "a function name"), [], ty(f.get("ret")),
                  [_str(n, "a type parameter") for n in _list(f.get("type_params"), "tps")])
    fn.blocks = blocks
    _need(entry is fn.entry, "the entry block")
    arena = f.get("arena_bytes")
    _need(type(arena) is int and 0 <= arena < 1 << 40, "the arena size")
    fn.arena_bytes = arena
    return fn


def _value(values: list[Value], i: Any) -> Value:
    _need(type(i) is int and 0 <= i < len(values), f"value reference {i!r}")
    return values[i]


def relay_function_text(fn: RelayFunction) -> str:
    """A kernel's primitive function as Relay text (for kernels of symbolic shape)."""
    from kiln.text.printer import astext

    return astext(IRModule.from_expr(fn), show_types=False)


def parse_relay_function(text: str) -> RelayFunction:
    from kiln.infer import infer_types
    from kiln.text.parser import parse

    try:
        return infer_types(parse(text, "<saved kernel>"))["main"]
    except Error as e:
        raise Malformed(f"malformed program: a saved kernel function: {e.message}") from None
