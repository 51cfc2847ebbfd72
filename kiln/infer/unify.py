"""Unification of types: union-find over incomplete types, structural matching of the rest.

Relay's inference assigns every expression a type, possibly an `IncompleteType` (a
unification variable), and equates types as the program demands. Tensor dimensions unify
leniently: ``?`` matches anything, a symbolic ``n`` matches any dimension (checked at run
time), two known integers must be equal.
"""

from __future__ import annotations

from kiln.ir.ty import (
    AnyDim,
    Dim,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
    substitute,
    type_children,
    with_type_children,
)


class Mismatch(Exception):
    """Two types that cannot be made equal; ``detail`` says where inside them they differ."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


def instantiate(ft: FuncType) -> FuncType:
    """A polymorphic function type with its type parameters replaced by fresh unknowns."""
    if not ft.type_params:
        return ft
    fresh: dict[Type, Type] = {tv: IncompleteType() for tv in ft.type_params}
    return FuncType(
        tuple(substitute(a, fresh) for a in ft.arg_types), substitute(ft.ret_type, fresh)
    )


class Unifier:
    """The bindings of incomplete types found so far."""

    def __init__(self) -> None:
        self.binding: dict[IncompleteType, Type] = {}
        # Concrete types known to contain no unbound unknown, by id (kept alive beside it): the
        # occurs check skips them, so the type of a closure nested n deep is not walked again at
        # each of its n enclosing functions. Invariant: every unknown reachable from a type here
        # resolves to a type here.
        self._ground: dict[int, Type] = {}
        # resolve's answers, valid until a binding changes (rebuilding after the solve resolves
        # every node's type, and nested types share their parts).
        self._resolved: dict[int, tuple[Type, Type]] = {}
        self._resolved_version = -1
        self._version = 0
        self.steps = 0  # types visited by the occurs check and resolve: a measure of the work

    def instantiate(self, ft: FuncType) -> FuncType:
        """``ft``'s type parameters replaced by fresh unknowns, inside what its unknowns are
        bound to as well (an unannotated result type is an unknown bound to the body's type).
        """
        if not ft.type_params:
            return ft
        resolved = self.resolve(ft)
        assert isinstance(resolved, FuncType)  # resolving keeps the kind of type
        return instantiate(resolved)

    def _bind(self, v: IncompleteType, t: Type) -> None:
        self.binding[v] = t
        self._version += 1

    def find(self, t: Type) -> Type:
        """Follow the bindings of an incomplete type to a concrete type or an unbound unknown."""
        if not isinstance(t, IncompleteType):
            return t
        path = []
        while isinstance(t, IncompleteType) and t in self.binding:
            path.append(t)
            t = self.binding[t]
        for p in path[:-1]:
            self.binding[p] = t  # path compression
        return t

    def _root(self, t: Type) -> IncompleteType | None:
        """The last incomplete type on ``t``'s binding chain (the one to rebind), if any."""
        root = None
        while isinstance(t, IncompleteType):
            root = t
            if t not in self.binding:
                break
            t = self.binding[t]
        return root

    def resolve(self, t: Type) -> Type:
        """``t`` with every bound incomplete type replaced by what it is bound to."""
        t = self.find(t)
        if isinstance(t, TensorType):
            return t
        if self._resolved_version != self._version:
            self._resolved.clear()
            self._resolved_version = self._version
        memo = self._resolved
        hit = memo.get(id(t))
        if hit is not None:
            return hit[1]
        stack: list[tuple[Type, bool]] = [(t, False)]
        while stack:
            x, ready = stack.pop()
            if id(x) in memo:
                continue
            self.steps += 1
            if isinstance(x, IncompleteType):
                y = self.find(x)
                if y is x:
                    memo[id(x)] = (x, x)
                elif id(y) in memo:
                    memo[id(x)] = (x, memo[id(y)][1])
                else:
                    stack.append((x, True))
                    stack.append((y, False))
                continue
            kids = type_children(x)
            if not kids:
                memo[id(x)] = (x, x)
            elif not ready:
                stack.append((x, True))
                stack.extend((k, False) for k in kids if id(k) not in memo)
            else:
                memo[id(x)] = (x, with_type_children(x, [memo[id(k)][1] for k in kids]))
        return memo[id(t)][1]

    def _is_ground_kid(self, k: Type) -> bool:
        f = self.find(k)
        return not isinstance(f, IncompleteType) and id(f) in self._ground

    def occurs(self, v: IncompleteType | None, t: Type) -> bool:
        """Whether the unbound unknown ``v`` is inside ``t``; marks the parts found ground.

        With ``v`` None it only marks: afterwards ``t`` is in ``_ground`` if it is ground.
        """
        ground = self._ground
        seen: set[int] = set()
        stack: list[tuple[Type, bool]] = [(t, False)]
        while stack:
            x, ready = stack.pop()
            if ready:  # every part of x has been looked at
                if all(self._is_ground_kid(k) for k in type_children(x)):
                    ground[id(x)] = x
                continue
            x = self.find(x)
            if x is v:
                return True
            if isinstance(x, IncompleteType) or id(x) in ground or id(x) in seen:
                continue
            self.steps += 1
            seen.add(id(x))
            stack.append((x, True))
            stack.extend((k, False) for k in type_children(x))
        return False

    def is_ground(self, t: Type) -> bool:
        """Whether ``t``, its bindings followed, holds no unbound unknown (walks a DAG once)."""
        self.occurs(None, t)
        found = self.find(t)
        return not isinstance(found, IncompleteType) and id(found) in self._ground

    def _rebind_root(self, root: IncompleteType, old: Type, new: Type) -> None:
        """Point ``root`` (bound to ``old``) at the more precise ``new``; keep ``_ground`` true."""
        if id(old) in self._ground:
            self.occurs(None, new)
            if id(new) not in self._ground:
                # Types marked ground may reach ``root``, which no longer resolves to one
                # (a polymorphic function type unified with a monomorphic one): forget them.
                self._ground.clear()
        self._bind(root, new)

    def unify(self, a: Type, b: Type) -> Type:
        """Make ``a`` and ``b`` equal; the most precise common type, or raise Mismatch."""
        if a is b:
            return a
        ra, rb = self._root(a), self._root(b)
        fa, fb = self.find(a), self.find(b)
        if fa is fb:
            return fa
        if isinstance(fa, IncompleteType):
            if self.occurs(fa, fb):
                raise Mismatch(" (the type would contain itself)")
            self._bind(fa, fb)
            return fb
        if isinstance(fb, IncompleteType):
            if self.occurs(fb, fa):
                raise Mismatch(" (the type would contain itself)")
            self._bind(fb, fa)
            return fa
        u = self._unify_concrete(fa, fb)
        # Keep the more precise type where the unknowns point (``?`` refined to ``5``).
        if ra is not None and u is not fa:
            self._rebind_root(ra, fa, u)
        if rb is not None and u is not fb:
            self._rebind_root(rb, fb, u)
        return u

    def _unify_concrete(self, a: Type, b: Type) -> Type:
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            return _unify_tensor(a, b)
        if isinstance(a, FuncType) and isinstance(b, FuncType):
            return self._unify_func(a, b)
        if type(a) is not type(b):
            raise Mismatch()
        if isinstance(a, TupleType) and isinstance(b, TupleType):
            if len(a.fields) != len(b.fields):
                raise Mismatch(f" (a tuple of {len(a.fields)} fields against one of "
                               f"{len(b.fields)})")
            fields = [self.unify(x, y) for x, y in zip(a.fields, b.fields)]
            return _same_or(a, fields, a.fields) or TupleType(tuple(fields))
        if isinstance(a, TypeCall) and isinstance(b, TypeCall):
            if a.func != b.func or len(a.args) != len(b.args):
                raise Mismatch()
            args = [self.unify(x, y) for x, y in zip(a.args, b.args)]
            return _same_or(a, args, a.args) or TypeCall(a.func, tuple(args))
        if isinstance(a, RefType) and isinstance(b, RefType):
            value = self.unify(a.value, b.value)
            return a if value is a.value else RefType(value)
        if isinstance(a, (TypeVar, GlobalTypeVar)):
            if a == b:
                return a
            raise Mismatch()
        raise Mismatch()

    def _unify_func(self, a: FuncType, b: FuncType) -> Type:
        if a.type_params and b.type_params:
            if len(a.type_params) != len(b.type_params):
                raise Mismatch(" (different numbers of type parameters)")
            rename: dict[Type, Type] = dict(zip(b.type_params, a.type_params))
            resolved = self.resolve(b)
            assert isinstance(resolved, FuncType)
            b = FuncType(
                tuple(substitute(t, rename) for t in resolved.arg_types),
                substitute(resolved.ret_type, rename),
                a.type_params,
            )
        elif a.type_params:
            a = self.instantiate(a)
        elif b.type_params:
            b = self.instantiate(b)
        if len(a.arg_types) != len(b.arg_types):
            raise Mismatch(
                f" (a function of {len(a.arg_types)} parameters against one of "
                f"{len(b.arg_types)})"
            )
        args = [self.unify(x, y) for x, y in zip(a.arg_types, b.arg_types)]
        ret = self.unify(a.ret_type, b.ret_type)
        if ret is a.ret_type and _same_or(a, args, a.arg_types):
            return a
        return FuncType(tuple(args), ret, a.type_params)


def _same_or(t: Type, new: list[Type], old: tuple[Type, ...]) -> Type | None:
    return t if all(x is y for x, y in zip(new, old)) else None


def _unify_dim(x: Dim, y: Dim, i: int) -> Dim:
    if x == y:
        return x
    if isinstance(x, AnyDim):
        return y
    if isinstance(y, AnyDim):
        return x
    if isinstance(x, int) and isinstance(y, int):
        raise Mismatch(f" (dimension {i} is {x} in one and {y} in the other)")
    if isinstance(x, int):
        return x  # y is symbolic: it stands for this size here
    if isinstance(y, int):
        return y
    assert isinstance(x, SymDim)
    return x


def _unify_tensor(a: TensorType, b: TensorType) -> TensorType:
    if a == b:
        return a
    if a.dtype != b.dtype:
        raise Mismatch(f" (dtype {a.dtype} against {b.dtype})")
    if len(a.shape) != len(b.shape):
        raise Mismatch(f" (rank {len(a.shape)} against rank {len(b.shape)})")
    dims = tuple(_unify_dim(x, y, i) for i, (x, y) in enumerate(zip(a.shape, b.shape)))
    if dims == a.shape:
        return a
    if dims == b.shape:
        return b
    return TensorType(dims, a.dtype)
