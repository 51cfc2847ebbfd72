"""The SSA verifier: a program is well formed, or the compiler has a bug.

It checks what every later stage (the memory planner, the executors, the file format)
relies on, as DLVM's verifier does:

- each block ends in exactly one terminator, its targets are blocks of the same function,
  and the entry block is nobody's target;
- every operand is defined in the same function, and its definition dominates the use;
- a branch passes as many arguments as its target has parameters, of agreeing types;
- every instruction's operand and result types agree with its opcode's rule (`_RULES`);
  calls and closures agree with the callee's signature, kernels with their declaration.

Types "agree" as inference would let them: type variables (polymorphic functions) and
symbolic or unknown dimensions match anything of the right form.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.errors import InternalError
from kiln.ir.ty import (
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
)
from kiln.ssa.analysis import DominatorTree, positions
from kiln.ssa.ir import INSTRUCTIONS, UNIT, Block, Function, Instr, Program, Value
from kiln.ssa.memory import tensor_bytes


def agrees(a: Type, b: Type) -> bool:
    """Whether two types can describe the same value (type variables match anything)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, (TypeVar, IncompleteType)) or isinstance(y, (TypeVar, IncompleteType)):
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, TensorType):
            if x.dtype != y.dtype or len(x.shape) != len(y.shape):  # type: ignore[attr-defined]
                return False
            for d, e in zip(x.shape, y.shape):  # type: ignore[attr-defined]
                if type(d) is int and type(e) is int and d != e:
                    return False
        elif isinstance(x, TupleType):
            if len(x.fields) != len(y.fields):  # type: ignore[attr-defined]
                return False
            stack.extend(zip(x.fields, y.fields))  # type: ignore[attr-defined]
        elif isinstance(x, FuncType):
            if len(x.arg_types) != len(y.arg_types):  # type: ignore[attr-defined]
                return False
            stack.extend(zip(x.arg_types, y.arg_types))  # type: ignore[attr-defined]
            stack.append((x.ret_type, y.ret_type))  # type: ignore[attr-defined]
        elif isinstance(x, TypeCall):
            if x.func.name != y.func.name or len(x.args) != len(y.args):  # type: ignore
                return False
            stack.extend(zip(x.args, y.args))  # type: ignore[attr-defined]
        elif isinstance(x, RefType):
            stack.append((x.value, y.value))  # type: ignore[attr-defined]
        elif isinstance(x, GlobalTypeVar):
            if x.name != y.name:  # type: ignore[attr-defined]
                return False
    return True


class _Checker:
    def __init__(self, prog: Program) -> None:
        self.prog = prog
        self.problems: list[str] = []

    def fail(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    # --- per-opcode rules: None when fine, else what is wrong ----------------------------------

    def rule_const(self, ins: Instr) -> str | None:
        i = ins.attrs.get("index")
        if not isinstance(i, int) or not 0 <= i < len(self.prog.constants):
            return f"constant #{i} is not in the table of {len(self.prog.constants)}"
        data = self.prog.constants[i]
        want = TensorType(data.shape, data.dtype.name)
        return None if agrees(want, ins.type) else f"constant #{i} is {want}, not {ins.type}"

    def rule_alloc(self, ins: Instr) -> str | None:
        if ins.operands:
            return "alloc takes no operands"
        if not isinstance(ins.type, TensorType) or not ins.type.is_static:
            return f"alloc needs a tensor type of static shape, not {ins.type}"
        off = ins.attrs.get("offset")
        if off is not None and (type(off) is not int or off < 0):
            return f"alloc has a bad offset {off!r}"
        return None

    def rule_kernel(self, ins: Instr) -> str | None:
        decl = self.prog.kernels.get(ins.attrs.get("kernel", ""))
        if decl is None:
            return f"no kernel @{ins.attrs.get('kernel')}"
        n = ins.attrs.get("num_inputs")
        if n != len(decl.inputs) or len(ins.operands) != len(decl.inputs) + len(decl.outputs):
            return (f"kernel @{decl.name} takes {len(decl.inputs)} inputs and "
                    f"{len(decl.outputs)} outputs, given {len(ins.operands)} operands")
        for k, (v, t) in enumerate(zip(ins.operands, (*decl.inputs, *decl.outputs))):
            if not agrees(t, v.type):
                return f"operand {k} of kernel @{decl.name} is {v.type}, expected {t}"
        for v in ins.operands[n:]:
            if not (isinstance(v, Instr) and v.op == "alloc"):
                return f"kernel @{decl.name} writes an output that is not an alloc"
        return None if ins.type == UNIT else "a kernel instruction has no result"

    def rule_host(self, ins: Instr) -> str | None:
        from kiln.op.registry import lookup

        opdef = lookup(str(ins.attrs.get("operator")))
        if opdef is None or not (opdef.host or opdef.needs_values):
            return f"{ins.attrs.get('operator')!r} is not an operator the host runs"
        if len(ins.operands) != len(opdef.inputs):
            return f"{opdef.name} takes {len(opdef.inputs)} operands"
        pairs = ins.attrs.get("op_attrs")
        if not isinstance(pairs, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str)
                for p in pairs):
            return f"{opdef.name} has malformed attributes"
        if not all(isinstance(v.type, TensorType) for v in ins.operands):
            return f"{opdef.name} takes tensors"
        return None if isinstance(ins.type, TensorType) else f"{opdef.name} gives a tensor"

    def rule_kernel_dyn(self, ins: Instr) -> str | None:
        decl = self.prog.kernels.get(ins.attrs.get("kernel", ""))
        if decl is None:
            return f"no kernel @{ins.attrs.get('kernel')}"
        if len(ins.operands) != len(decl.inputs):
            return f"kernel @{decl.name} takes {len(decl.inputs)} inputs"
        for k, (v, t) in enumerate(zip(ins.operands, decl.inputs)):
            if not agrees(t, v.type):
                return f"operand {k} of kernel @{decl.name} is {v.type}, expected {t}"
        outs = decl.outputs
        want: Type = outs[0] if len(outs) == 1 else TupleType(outs)
        if not isinstance(ins.type, TupleType) and len(outs) != 1:
            return f"kernel @{decl.name} has {len(outs)} results"
        if len(outs) == 1 and not agrees(want, ins.type):
            return f"kernel @{decl.name} gives {want}, not {ins.type}"
        return None

    def rule_view(self, ins: Instr) -> str | None:
        if len(ins.operands) != 1:
            return "view takes one operand"
        src, out = ins.operands[0].type, ins.type
        if not (isinstance(src, TensorType) and isinstance(out, TensorType) and src.is_static
                and out.is_static):
            return f"a view of a {src} as a {out}: both need static tensor types"
        if src.dtype != out.dtype or tensor_bytes(src) != tensor_bytes(out):
            return f"a view of a {src} as a {out}: not as many elements of one dtype"
        kernel = ins.attrs.get("kernel")
        if kernel is not None and kernel not in self.prog.kernels:
            return f"no kernel @{kernel}"
        return None

    def rule_tuple(self, ins: Instr) -> str | None:
        want = TupleType(tuple(v.type for v in ins.operands))
        return None if agrees(want, ins.type) else f"a tuple of {want} typed {ins.type}"

    def rule_get_field(self, ins: Instr) -> str | None:
        if len(ins.operands) != 1:
            return "get_field takes one operand"
        t, i = ins.operands[0].type, ins.attrs.get("index")
        if isinstance(t, (TypeVar, IncompleteType)):
            return None
        if not isinstance(t, TupleType) or not isinstance(i, int) or not 0 <= i < len(t.fields):
            return f"field {i} of a value of type {t}"
        return None if agrees(t.fields[i], ins.type) else f"field {i} of {t} typed {ins.type}"

    def _ctor(self, ins: Instr) -> tuple[object, str | None]:
        c = self.prog.constructors.get(ins.attrs.get("ctor", ""))
        return c, None if c is not None else f"no constructor {ins.attrs.get('ctor')}"

    def rule_construct(self, ins: Instr) -> str | None:
        c, problem = self._ctor(ins)
        if problem:
            return problem
        if len(ins.operands) != len(c.inputs):  # type: ignore[attr-defined]
            return f"{c.name} takes {len(c.inputs)} fields, given {len(ins.operands)}"  # type: ignore
        t = ins.type
        if not (isinstance(t, TypeCall) and t.func.name == c.belong_to.name):  # type: ignore
            return f"{c.name} builds a {c.belong_to.name}, typed {t}"  # type: ignore[attr-defined]
        return None

    def rule_get_tag(self, ins: Instr) -> str | None:
        if len(ins.operands) != 1 or not isinstance(ins.operands[0].type, (TypeCall, TypeVar)):
            return "get_tag takes one ADT value"
        return None if ins.type == TensorType((), "int32") else "get_tag gives an int32"

    def rule_adt_field(self, ins: Instr) -> str | None:
        c, problem = self._ctor(ins)
        if problem:
            return problem
        i = ins.attrs.get("index")
        if not isinstance(i, int) or not 0 <= i < len(c.inputs):  # type: ignore[attr-defined]
            return f"{c.name} has no field {i}"  # type: ignore[attr-defined]
        t = ins.operands[0].type if len(ins.operands) == 1 else None
        if not (isinstance(t, TypeVar) or (isinstance(t, TypeCall)
                                             and t.func.name == c.belong_to.name)):  # type: ignore
            return f"adt_field of {c.name} on a value of type {t}"  # type: ignore[attr-defined]
        return None

    def _signature(self, name: object) -> tuple[Function | None, str | None]:
        fn = self.prog.functions.get(name) if isinstance(name, str) else None
        return fn, None if fn is not None else f"no function @{name}"

    def rule_call(self, ins: Instr) -> str | None:
        fn, problem = self._signature(ins.attrs.get("func"))
        if problem:
            return problem
        return _args_agree(fn.params, ins.operands, fn.name) or (  # type: ignore[union-attr]
            None if agrees(fn.ret_type, ins.type) else  # type: ignore[union-attr]
            f"@{fn.name} returns {fn.ret_type}, typed {ins.type}")  # type: ignore[union-attr]

    def rule_make_closure(self, ins: Instr) -> str | None:
        fn, problem = self._signature(ins.attrs.get("func"))
        if problem:
            return problem
        params = fn.params  # type: ignore[union-attr]
        n = len(ins.operands)
        if n > len(params):
            return f"@{fn.name} takes {len(params)} arguments, {n} captured"  # type: ignore
        bad = _args_agree(params[:n], ins.operands, fn.name)  # type: ignore[union-attr]
        if bad:
            return bad
        want = FuncType(tuple(p.type for p in params[n:]), fn.ret_type)  # type: ignore
        return None if agrees(want, ins.type) else f"a closure {want} typed {ins.type}"

    def rule_invoke_closure(self, ins: Instr) -> str | None:
        if not ins.operands:
            return "invoke_closure needs a closure"
        ft = ins.operands[0].type
        if isinstance(ft, TypeVar):
            return None
        if not isinstance(ft, FuncType) or len(ft.arg_types) != len(ins.operands) - 1:
            return f"invoking a value of type {ft} with {len(ins.operands) - 1} arguments"
        for k, (t, v) in enumerate(zip(ft.arg_types, ins.operands[1:])):
            if not agrees(t, v.type):
                return f"argument {k} of the closure is {v.type}, expected {t}"
        return None if agrees(ft.ret_type, ins.type) else f"the closure gives {ft.ret_type}"

    def rule_ref_new(self, ins: Instr) -> str | None:
        t = ins.type
        ok = len(ins.operands) == 1 and isinstance(t, RefType) and agrees(t.value,
                                                                           ins.operands[0].type)
        return None if ok else f"ref_new of one value typed {t}"

    def rule_ref_read(self, ins: Instr) -> str | None:
        t = ins.operands[0].type if len(ins.operands) == 1 else None
        if isinstance(t, TypeVar):
            return None
        ok = isinstance(t, RefType) and agrees(t.value, ins.type)
        return None if ok else f"ref_read of a {t} typed {ins.type}"

    def rule_ref_write(self, ins: Instr) -> str | None:
        if len(ins.operands) != 2:
            return "ref_write takes a reference and a value"
        t = ins.operands[0].type
        if isinstance(t, RefType) and not agrees(t.value, ins.operands[1].type):
            return f"writing a {ins.operands[1].type} into a {t}"
        return None if ins.type == UNIT else "ref_write gives ()"

    # --- structure -----------------------------------------------------------------------------

    def function(self, fn: Function) -> None:
        where_fn = f"@{fn.name}"
        blocks = set(fn.blocks)
        if len(fn.blocks) != len(blocks):
            self.fail(where_fn, "a block appears twice")
        for b in fn.blocks:
            where = f"{where_fn} '{b.name}"
            for ins in b.instrs:
                if ins.block is not b:
                    self.fail(where, f"{ins.op} does not know its block")
            t = b.terminator
            if t is None:
                self.fail(where, "the block has no terminator")
                continue
            for tgt in t.targets:
                if tgt.block not in blocks:
                    self.fail(where, f"{t.op} goes to a block of another function")
                elif tgt.block is fn.entry:
                    self.fail(where, f"{t.op} goes to the entry block")
                elif len(tgt.args) != len(tgt.block.params):
                    self.fail(where, f"{t.op} passes {len(tgt.args)} arguments to "
                              f"'{tgt.block.name}, which takes {len(tgt.block.params)}")
                else:
                    for a, p in zip(tgt.args, tgt.block.params):
                        if not agrees(p.type, a.type):
                            self.fail(where, f"{t.op} passes a {a.type} to a parameter of "
                                      f"'{tgt.block.name} of type {p.type}")
            self.terminator(fn, b, where)
            for ins in b.instrs:
                rule: Callable[[Instr], str | None] = getattr(self, f"rule_{ins.op}")
                try:
                    problem = rule(ins)
                except (AttributeError, TypeError, IndexError) as e:
                    problem = f"malformed: {e}"
                if problem:
                    self.fail(where, f"{ins.op}: {problem}")
                missing = [a for a in INSTRUCTIONS[ins.op].attrs if a not in ins.attrs]
                if missing:
                    self.fail(where, f"{ins.op} lacks attribute(s) {', '.join(missing)}")
                elif ins.op == "alloc" and not problem and ins.attrs["offset"] is not None:
                    end = ins.attrs["offset"] + tensor_bytes(ins.type)
                    if end > fn.arena_bytes:
                        self.fail(where, f"an alloc ends at {end}, past the arena's "
                                  f"{fn.arena_bytes} bytes")
        self.dominance(fn, where_fn)

    def terminator(self, fn: Function, b: Block, where: str) -> None:
        t = b.terminator
        assert t is not None
        if t.op == "br" and (len(t.targets) != 1 or t.operands):
            self.fail(where, "br takes one target")
        elif t.op == "cond_br":
            c = t.operands[0].type if len(t.operands) == 1 else None
            if len(t.targets) != 2 or not (isinstance(c, TensorType) and c.shape == ()
                                           and c.dtype == "bool"):
                self.fail(where, f"cond_br needs a bool scalar and two targets, not {c}")
        elif t.op == "switch":
            cases = t.attrs.get("cases", [])
            extra = 1 if t.attrs.get("has_default") else 0
            if (not isinstance(cases, list) or not all(isinstance(c, str) for c in cases)
                    or not isinstance(t.attrs.get("has_default"), bool)):
                self.fail(where, "switch needs a list of constructor names")
                return
            if len(t.operands) != 1 or len(t.targets) != len(cases) + extra:
                self.fail(where, "switch needs one value and a target per case")
                return
            adt = t.operands[0].type
            for c in cases:
                ctor = self.prog.constructors.get(c)
                if ctor is None:
                    self.fail(where, f"switch on an unknown constructor {c}")
                elif isinstance(adt, TypeCall) and ctor.belong_to.name != adt.func.name:
                    self.fail(where, f"switch on {adt} has a case {c} of {ctor.belong_to.name}")
        elif t.op == "ret":
            if len(t.operands) != 1 or t.targets:
                self.fail(where, "ret takes one value")
            elif not agrees(fn.ret_type, t.operands[0].type):
                self.fail(where, f"ret of a {t.operands[0].type} from a function returning "
                          f"{fn.ret_type}")
        elif t.op == "fail" and (t.targets or not isinstance(t.attrs.get("message"), str)):
            self.fail(where, "fail takes a message and no targets")

    def dominance(self, fn: Function, where_fn: str) -> None:
        dom = DominatorTree(fn)
        where = positions(fn)
        for b in fn.blocks:
            if not dom.reachable(b):
                continue
            uses: list[tuple[int, Value]] = [(i, v) for i, ins in enumerate(b.instrs)
                                             for v in ins.operands]
            if b.terminator is not None:
                uses += [(len(b.instrs), v) for v in b.terminator.uses()]
            for i, v in uses:
                at = where.get(v)
                if at is None:
                    self.fail(f"{where_fn} '{b.name}", f"a value of type {v.type} is used but "
                              "not defined in this function")
                    continue
                db, di = at
                if db is b and di < i:
                    continue
                if db is not b and dom.dominates(db, b):
                    continue
                self.fail(f"{where_fn} '{b.name}", f"a use of a value defined in '{db.name} is "
                          "not dominated by its definition")


def _args_agree(params: list, values: list[Value], name: str) -> str | None:
    if len(params) != len(values):
        return f"@{name} takes {len(params)} arguments, given {len(values)}"
    for k, (p, v) in enumerate(zip(params, values)):
        if not agrees(p.type, v.type):
            return f"argument {k} of @{name} is {v.type}, expected {p.type}"
    return None


def problems(prog: Program) -> list[str]:
    """Everything wrong with ``prog`` (empty when it is well formed)."""
    checker = _Checker(prog)
    if prog.entry not in prog.functions:
        checker.fail("program", f"no entry function @{prog.entry}")
    for fn in prog.functions.values():
        try:
            checker.function(fn)
        except (AttributeError, TypeError, IndexError, KeyError, ValueError) as e:
            checker.fail(f"@{fn.name}", f"malformed ({type(e).__name__}: {e})")
    return checker.problems


def verify(prog: Program) -> Program:
    """``prog`` itself when it is well formed; otherwise an InternalError listing problems."""
    found = problems(prog)
    if found:
        shown = "\n  ".join(found[:10])
        more = f"\n  ... and {len(found) - 10} more" if len(found) > 10 else ""
        raise InternalError(f"the SSA program is malformed:\n  {shown}{more}")
    return prog
