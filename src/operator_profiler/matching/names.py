"""Kernel names across tools: one normalisation ladder (exact, demangler-normalised, base name) for keys and
checks, because ncu, nsys and CUPTI demangle and abbreviate the same kernel differently.
Details: docs/modules.md#matching-names."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

RUNGS = ("mangled", "demangled", "normalized", "function")
#: The ``name_rung`` of a pair whose ncu name is a bare function name that fits several timeline kernels of the
#: scope (template instantiations): not a rung of the ladder, but the rows of that name were paired with those
#: kernels' launches by an order-preserving alignment that is unique (every row pinned, as many rows as launches).
ORDER_RUNG = "function_order"


def is_mangled(name) -> bool:
    """Whether ``name`` is an Itanium mangled name (``_Z...``)."""
    return isinstance(name, str) and name.startswith("_Z")


@functools.lru_cache(maxsize=1)
def _cxa_demangle():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    try:
        free = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").free
        free.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        free = None
    return fn, free


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str | None:
    """The demangled text of an Itanium mangled name, or None (not mangled, invalid, or no libstdc++)."""
    if not is_mangled(name):
        return None
    found = _cxa_demangle()
    if found is None:
        return None
    fn, free = found
    status = ctypes.c_int()
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", errors="replace") if status.value == 0 else None
    finally:
        if free is not None:
            free(ptr)


_CAST = re.compile(r"\((?:unsigned |signed )?(?:char|short|int|long|long long|__int128|bool)\)(-?\d+)")
_BOOL_CAST = re.compile(r"\(bool\)([01])\b")
_INT_SUFFIX = re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b", re.IGNORECASE)
_ANON = re.compile(r"\(anonymous namespace\)|<unnamed>|anonymous namespace")
_VOID = re.compile(r"\bvoid\b")
_BOOL_WORD = re.compile(r"\b(?:true|false)\b")
_CONST = re.compile(r"\bconst\b")
_LAMBDA = re.compile(r"\{lambda\(([^)]*)\)#(\d+)\}|\[lambda\(([^)]*)\) \(instance (\d+)\)\]")


def _strip_parameters(s: str) -> str:
    """Drop the top-level parameter list at the end (``f<int>(int, T2)`` -> ``f<int>``)."""
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        c = s[i]
        if c in ")>]}":
            depth += 1
        elif c in "(<[{":
            depth -= 1
            if depth == 0:
                return s[:i] if c == "(" and i > 0 else s
    return s


def normalize(demangled: str) -> str:
    """The ``normalized`` rung of a demangled name (module docstring)."""
    s = demangled.strip()
    if s.startswith("void "):
        s = s[5:]
    s = _BOOL_CAST.sub(r"\1", s)  # (bool)0, false and 0: three demanglers' spellings of one template argument
    s = _BOOL_WORD.sub(lambda m: "1" if m.group(0) == "true" else "0", s)
    s = _CAST.sub(r"\1", s)
    s = _ANON.sub("anon", s)
    s = _LAMBDA.sub(lambda m: f"lambda#{m.group(2) or m.group(4)}", s)
    s = _strip_parameters(s)
    # parameter lists anywhere (of functions named inside template arguments and lambda scopes): one demangler
    # writes the template parameters (`const T1 &`), another substitutes them; they follow from the template
    # arguments, which stay
    s = _drop_parenthesized(s)
    s = _VOID.sub("", s)  # return types of functions named inside template arguments: written or not
    s = _INT_SUFFIX.sub(r"\1", s)
    s = _CONST.sub("", s)  # `const T&` and `T const&`: where demanglers put const differs
    return re.sub(r"\s+", "", s)


def _drop_parenthesized(s: str) -> str:
    out, depth = [], 0
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _mangled_base(name: str) -> str | None:
    """Last unqualified source name of an Itanium mangled function name (``_ZN2at6native3fooIiEEvT_`` -> foo)."""
    s, i = name, 2
    if i < len(s) and s[i] == "L":
        i += 1
    nested = i < len(s) and s[i] == "N"
    if nested:
        i += 1
        while i < len(s) and s[i] in "rVKRO":
            i += 1
    last = None
    while i < len(s):
        if s.startswith("St", i):
            i += 2
            continue
        m = re.match(r"\d+", s[i:])
        if not m:
            break
        n = int(m.group())
        i += len(m.group())
        last = s[i:i + n]
        i += n
        if not nested or (i < len(s) and s[i] in "IE"):  # template arguments or the end of the nested name
            break
    return last


def _strip_balanced(s: str, open_: str, close: str) -> str:
    out, depth = [], 0
    for ch in s:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def base_name(name) -> str:
    """The ``function`` rung: the function name without return type, namespaces, template arguments and
    parameters (``void at::native::k<4>(int)`` -> ``k``; a mangled name -> its last source name)."""
    if not isinstance(name, str):
        return ""
    if is_mangled(name):
        return _mangled_base(name) or name
    s = _ANON.sub("anon", name)
    s = _strip_balanced(s, "<", ">")
    s = _strip_balanced(s, "(", ")")
    s = s.strip().split()[-1] if s.strip() else s
    return s.split("::")[-1]


def forms(name, mangled=None) -> dict[str, str | None]:
    """The ladder forms of one kernel name (``mangled`` given separately when the source has both)."""
    if not isinstance(name, str):
        name = None
    if mangled is None and is_mangled(name):
        mangled = name
    demangled = name if name is not None and not is_mangled(name) else None
    if demangled is None and mangled is not None:
        demangled = demangle(mangled)
    return {
        "mangled": mangled if is_mangled(mangled) else None,
        "demangled": demangled,
        "normalized": normalize(demangled) if demangled else None,
        "function": base_name(demangled or mangled or name) or None,
    }


def is_bare(name: str) -> bool:
    """Whether an ncu name is a bare function name (``--print-kernel-base function``): nothing but the name."""
    f = forms(name)
    return not is_mangled(name) and f["demangled"] is not None and f["demangled"].strip() == f["function"]


def names_agree(timeline_name, timeline_mangled, ncu_name) -> str | None:
    """The highest rung on which an ncu name and one timeline kernel's names agree, or None.

    Used where the position is already known (a replay's planned kernel), so uniqueness does not matter; the
    ``function`` rung only serves a bare function name (a templated name that differs is another kernel)."""
    if not isinstance(ncu_name, str):
        return None
    ours, theirs = forms(timeline_name, timeline_mangled), forms(ncu_name)
    if is_mangled(ncu_name) and ours["mangled"] is not None:
        return "mangled" if ours["mangled"] == ncu_name else None  # two mangled names: exact or nothing
    for rung in RUNGS:
        if rung == "function" and not is_bare(ncu_name):
            break
        if ours[rung] is not None and ours[rung] == theirs[rung]:
            return rung
    return None


def name_triples(kernels) -> list[tuple[str, str | None, str | None]]:
    """``(match_key, name, mangled_name)`` of a kernels table's distinct names (for :meth:`NameIndex.build`)."""
    sub = kernels[["match_key", "name", "mangled_name"]].drop_duplicates()
    return [(k, n if isinstance(n, str) else None, m if isinstance(m, str) else None)
            for k, n, m in zip(sub["match_key"], sub["name"], sub["mangled_name"])]


@dataclass
class NameIndex:
    """The timeline names of one scope, per rung: form -> the timeline keys (``match_key``) having it."""

    by_rung: dict[str, dict[str, set]] = field(default_factory=lambda: {r: {} for r in RUNGS})
    with_mangled: set = field(default_factory=set)  # keys whose kernels have a mangled name

    @classmethod
    def build(cls, keys: Iterable[tuple[str, str | None, str | None]]) -> NameIndex:
        """``keys``: ``(match_key, name, mangled_name)`` of the scope's distinct kernel names."""
        index = cls()
        for key, name, mangled in keys:
            if is_mangled(mangled):
                index.with_mangled.add(key)
            for rung, form in forms(name, mangled).items():
                if form is not None:
                    index.by_rung[rung].setdefault(form, set()).add(key)
            if isinstance(key, str) and key != name and key != mangled:  # a key that is a name of its own
                index.by_rung["demangled"].setdefault(key, set()).add(key)
        return index

    def _first_rung(self, ncu_name: str) -> tuple[str | None, set]:
        """The highest rung on which some timeline key of the scope has the ncu name's form, and those keys
        (``(None, set())`` when none has)."""
        mine = forms(ncu_name)
        bare = is_bare(ncu_name)
        for rung in RUNGS:
            form = mine[rung]
            if form is None or (rung == "function" and not bare):
                continue
            keys = self.by_rung[rung].get(form)
            if keys and rung != "mangled" and is_mangled(ncu_name):
                # a mangled ncu name that is not a timeline kernel's mangled name is another function (another
                # instantiation or overload), whatever its coarser forms say
                keys = keys - self.with_mangled
            if keys:
                return rung, set(keys)
        return None, set()

    def resolve(self, ncu_name: str) -> tuple[str | None, str, list]:
        """``(match_key, rung, [])`` for a unique resolution, ``(None, "name_ambiguous", candidates)``, or
        ``(None, "name_unmatched", [])``. The ``function`` rung is tried only for an ncu name that is a bare
        function name (``--print-kernel-base function``): a name that spells its template arguments or namespaces
        and differs on the ``normalized`` rung is another instantiation, whatever its function name."""
        rung, keys = self._first_rung(ncu_name)
        if rung is None:
            return None, "name_unmatched", []
        if len(keys) == 1:
            return next(iter(keys)), rung, []
        return None, "name_ambiguous", sorted(keys)

    def family(self, ncu_name: str) -> frozenset | None:
        """The timeline keys a bare function name (``--print-kernel-base function``) stands for when it is
        ambiguous on the ``function`` rung (``elementwise`` for ``elementwise<1>`` and ``elementwise<2>``), else
        None. Only the launch order can then tell its rows apart (:data:`ORDER_RUNG`)."""
        rung, keys = self._first_rung(ncu_name)
        return frozenset(keys) if rung == "function" and len(keys) > 1 else None
