"""Rust's v0 symbol mangling (RFC 2603, ``_R...``), demangled.

A recursive-descent parser over the grammar in the RFC, printing what
rustc-demangle prints in its alternate form (``{:#}``: no crate hashes):
``<mycrate::Bar as core::fmt::Debug>::fmt``,
``std::mem::align_of::<usize>``, ``mycrate::main::{closure#0}``.
Back references (``B<n>_``) re-parse from an earlier offset, with a depth
limit; punycode identifiers are shown as ``punycode{...}``. Anything that
does not parse returns None and the caller keeps the mangled name.
"""

from __future__ import annotations

from collections.abc import Callable

_BASIC = {"a": "i8", "b": "bool", "c": "char", "d": "f64", "e": "str", "f": "f32",
          "h": "u8", "i": "isize", "j": "usize", "l": "i32", "m": "u32", "n": "i128",
          "o": "u128", "s": "i16", "t": "u16", "u": "()", "v": "...", "x": "i64",
          "y": "u64", "z": "!", "p": "_"}
_MAX_DEPTH = 200


class _Invalid(Exception):
    pass


class _Parser:
    def __init__(self, sym: str):
        self.s = sym
        self.i = 0
        self.depth = 0

    # -- lexing --
    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def eat(self, c: str) -> bool:
        if self.peek() == c:
            self.i += 1
            return True
        return False

    def next(self) -> str:
        c = self.peek()
        if not c:
            raise _Invalid
        self.i += 1
        return c

    def decimal(self) -> int:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        if start == self.i or (self.s[start] == "0" and self.i - start > 1):
            raise _Invalid
        return int(self.s[start:self.i])

    def base62(self) -> int:
        if self.eat("_"):
            return 0
        n = 0
        while not self.eat("_"):
            c = self.next()
            if c.isdigit():
                d = ord(c) - ord("0")
            elif c.islower():
                d = 10 + ord(c) - ord("a")
            elif c.isupper():
                d = 36 + ord(c) - ord("A")
            else:
                raise _Invalid
            n = n * 62 + d
        return n + 1

    def disambiguator(self) -> int:
        return self.base62() + 1 if self.eat("s") else 0

    def ident(self) -> str:
        puny = self.eat("u")
        n = self.decimal()
        self.eat("_")
        if self.i + n > len(self.s):
            raise _Invalid
        name = self.s[self.i:self.i + n]
        self.i += n
        return f"punycode{{{name}}}" if puny else name

    def backref(self, parse: Callable[[], str]) -> str:
        start = self.i - 1
        target = self.base62()
        if target >= start:
            raise _Invalid
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Invalid
        saved, self.i = self.i, target
        try:
            return parse()
        finally:
            self.i = saved
            self.depth -= 1

    # -- grammar --
    def path(self, in_value: bool = True) -> str:
        c = self.next()
        if c == "C":
            self.disambiguator()
            return self.ident()
        if c == "M":
            self.disambiguator()
            self.path()
            return f"<{self.type_()}>"
        if c == "X":
            self.disambiguator()
            self.path()
            ty = self.type_()
            return f"<{ty} as {self.path(False)}>"
        if c == "Y":
            ty = self.type_()
            return f"<{ty} as {self.path(False)}>"
        if c == "N":
            ns = self.next()
            parent = self.path(in_value)
            dis = self.disambiguator()
            name = self.ident()
            if ns.isupper():
                kind = {"C": "closure", "S": "shim"}.get(ns, ns)
                label = f"{kind}:{name}" if name else kind
                return f"{parent}::{{{label}#{dis}}}"
            return f"{parent}::{name}" if name else parent
        if c == "I":
            base = self.path(in_value)
            args = []
            while not self.eat("E"):
                args.append(self.generic_arg())
            return f"{base}{'::' if in_value else ''}<{', '.join(args)}>"
        if c == "B":
            return self.backref(lambda: self.path(in_value))
        raise _Invalid

    def generic_arg(self) -> str:
        if self.eat("L"):
            self.base62()
            return "'_"
        if self.eat("K"):
            return self.const()
        return self.type_()

    def type_(self) -> str:
        c = self.next()
        if c in _BASIC:
            return _BASIC[c]
        if c in "RQ":
            if self.eat("L"):
                self.base62()
            return ("&" if c == "R" else "&mut ") + self.type_()
        if c in "PO":
            return ("*const " if c == "P" else "*mut ") + self.type_()
        if c == "A":
            ty = self.type_()
            return f"[{ty}; {self.const()}]"
        if c == "S":
            return f"[{self.type_()}]"
        if c == "T":
            items = []
            while not self.eat("E"):
                items.append(self.type_())
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if c == "F":
            return self.fn_sig()
        if c == "D":
            if self.eat("G"):
                self.base62()
            traits = []
            while not self.eat("E"):
                t = self.path(False)
                bindings = []
                while self.eat("p"):
                    name = self.ident()
                    bindings.append(f"{name} = {self.type_()}")
                if bindings:
                    t = (t[:-1] + ", " if t.endswith(">") else t + "<") + \
                        ", ".join(bindings) + ">"
                traits.append(t)
            if self.eat("L"):
                self.base62()
            return "dyn " + " + ".join(traits)
        if c == "B":
            return self.backref(self.type_)
        self.i -= 1
        return self.path(False)

    def fn_sig(self) -> str:
        if self.eat("G"):
            self.base62()
        prefix = "unsafe " if self.eat("U") else ""
        if self.eat("K"):
            abi = "C" if self.eat("C") else self.ident().replace("_", "-")
            prefix += f'extern "{abi}" '
        args = []
        while not self.eat("E"):
            args.append(self.type_())
        ret = self.type_()
        return f"{prefix}fn({', '.join(args)})" + ("" if ret == "()" else f" -> {ret}")

    def const(self) -> str:
        if self.eat("p"):
            return "_"
        if self.eat("B"):
            return self.backref(self.const)
        ty = self.type_()
        neg = self.eat("n")
        start = self.i
        while not self.eat("_"):
            if self.next() not in "0123456789abcdef":  # next(): the end is invalid too
                raise _Invalid
        digits = self.s[start:self.i - 1]
        value = int(digits, 16) if digits else 0
        if ty == "bool":
            return "true" if value else "false"
        if ty == "char":
            return repr(chr(value))
        return f"{'-' if neg else ''}{value}"


def demangle_v0(name: str) -> str | None:
    """The demangled form of a v0 symbol (``_R...``), or None."""
    if not name.startswith("_R"):
        return None
    body = name[2:]
    # an optional encoding version (decimal) comes first; only 0 (absent) exists
    if body[:1].isdigit():
        return None
    p = _Parser(body)
    try:
        out = p.path()
        # the instantiating crate, and vendor suffixes (".llvm.123"), follow
        return out
    except (_Invalid, RecursionError, ValueError):
        return None
