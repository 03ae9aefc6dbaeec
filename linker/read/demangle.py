"""Demangle the C++ (Itanium ABI) names of GPU kernels, as the GNU demangler prints them.

nvprof stores kernel names mangled (``_ZN2at6native18elementwise_kernelILi128ELi4E…``); Kineto
shows them through ``abi::__cxa_demangle`` (libstdc++'s demangler): ``void
at::native::elementwise_kernel<128, 4, …>(int, …)``. ``demangle`` gives that text, written here
without a dependency (no ``c++filt``, no ``cxxfilt``, no C library call): a recursive-descent
reader of the Itanium grammar, for the part of it kernel names use.

Covered: plain, nested (``N…E``, with ``const`` / ``volatile`` / ``&`` member qualifiers) and
local (``Z…E``) names; template arguments (types, integer and ``bool`` literals, literals of enum
types, template parameters as expressions, argument packs); template parameters ``T_`` and
substitutions ``S_`` (the ABI's candidates, in its order), the ``std::`` abbreviations (``St``,
``Sa``, ``Sb``, ``Ss``, ``Si``, ``So``, ``Sd``); builtin and vendor types, ``half``,
``_FloatN``, vectors; pointers, references, ``const`` / ``volatile`` / ``restrict``, arrays,
functions and pointers to them, pointers to members, pack expansions; lambdas
(``{lambda(float)#1}``), unnamed types, the anonymous namespace, ABI tags, operator names,
constructors and destructors, and clone suffixes (``[clone .part.0]``). Printed as libstdc++
prints them: ``T const*``, ``> >`` between closing template brackets, ``4u`` / ``2ul`` /
``(char)65`` literals, no return type on a function that encloses a local name.

Not covered (the name is then given back as it came, never half-demangled): expressions other
than a template parameter or a literal (``decltype``, ``sizeof``, operators), floating-point
literals, special names (vtables, typeinfo, guard variables), and any malformed name. Names
that are not mangled (``volta_sgemm_128x64_nn``, Triton kernels, Kineto's already demangled
names) come back unchanged.

How: the name is read into a small tree (one node per component; substitutions share the node
they stand for), then printed. A template parameter is printed from the template arguments of
the function being printed when it is met, as libstdc++ does: a substitution standing for
``T0_`` means the first argument of whichever function template it is used in.

Cost: one pass over the name with a recursion per nested component, then one walk of the tree
(a node without template parameters is printed once, then its text is reused); no cache across
names here (callers demangle each distinct name once: the readers map string ids).
"""

from __future__ import annotations

import re

MANGLED_PREFIX = "_Z"
_CLONE = re.compile(r"(\.[A-Za-z_]+(?:\.\d+)*)")

BUILTIN = {
    "v": "void", "w": "wchar_t", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char",
    "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long", "m": "unsigned long",
    "x": "long long", "y": "unsigned long long", "n": "__int128", "o": "unsigned __int128", "f": "float",
    "d": "double", "e": "long double", "g": "__float128", "z": "...",
}
BUILTIN_D = {"d": "decimal64", "e": "decimal128", "f": "decimal32", "h": "half", "i": "char32_t",
             "s": "char16_t", "u": "char8_t", "a": "auto", "c": "decltype(auto)", "n": "decltype(nullptr)"}
# Integer literal types printed with a suffix (else "(type)value"); bool prints true / false.
LITERAL_SUFFIX = {"i": "", "j": "u", "l": "l", "m": "ul", "x": "ll", "y": "ull"}
STD_ABBREVIATIONS = {"a": "std::allocator", "b": "std::basic_string", "s": "std::string", "i": "std::istream",
                     "o": "std::ostream", "d": "std::iostream", "t": "std"}
OPERATORS = {
    "nw": "new", "na": "new[]", "dl": "delete", "da": "delete[]", "ps": "+", "ng": "-", "ad": "&", "de": "*",
    "co": "~", "pl": "+", "mi": "-", "ml": "*", "dv": "/", "rm": "%", "an": "&", "or": "|", "eo": "^",
    "aS": "=", "pL": "+=", "mI": "-=", "mL": "*=", "dV": "/=", "rM": "%=", "aN": "&=", "oR": "|=",
    "eO": "^=", "ls": "<<", "rs": ">>", "lS": "<<=", "rS": ">>=", "eq": "==", "ne": "!=", "lt": "<",
    "gt": ">", "le": "<=", "ge": ">=", "ss": "<=>", "nt": "!", "aa": "&&", "oo": "||", "pp": "++",
    "mm": "--", "cm": ",", "pm": "->*", "pt": "->", "cl": "()", "ix": "[]", "qu": "?",
}
ANONYMOUS_NAMESPACE = "(anonymous namespace)"


def demangle(name: str) -> str:
    """The GNU demangler's text for the mangled ``name`` (module docstring), or ``name`` itself
    when it is not a mangled name or uses something outside the subset. O(len(name))."""
    if not name.startswith(MANGLED_PREFIX):
        return name
    try:
        return _Parser(name).top()
    except (_Unsupported, IndexError, ValueError, RecursionError):
        return name


class _Unsupported(Exception):
    """The name uses a part of the grammar this reader does not cover (or is malformed)."""


class _Declarator:
    """A printed type that wraps its declarator: a function (``suffix`` its parameters and
    qualifiers) or an array (``suffix`` `` [N]``), with the pointers / references / member
    pointers applied to it so far (``decl``): ``void (* const*)(int)``, ``int (*) [10]``."""

    __slots__ = ("base", "decl", "suffix")

    def __init__(self, base: str, suffix: str, decl: str = ""):
        self.base, self.suffix, self.decl = base, suffix, decl

    def wrapped(self, more: str) -> _Declarator:
        return _Declarator(self.base, self.suffix, self.decl + more)

    def __str__(self) -> str:
        if not self.decl:
            return f"{self.base} {self.suffix}" if self.suffix.startswith("(") else f"{self.base}{self.suffix}"
        return f"{self.base} ({self.decl}){self.suffix}"


class _Pack(list):
    """A printed template argument pack: its elements, comma-separated."""

    def __str__(self) -> str:
        return _arglist(_flat(self))[0]


# -- the tree ---------------------------------------------------------------------------------
# A node is a str (printed as is) or a _Node. ``scope`` while printing: None, or (the template
# arguments of the function being printed, the scope around it).


def _render(node, scope):
    """A node printed: a str, a ``_Declarator`` or a ``_Pack``."""
    return node if isinstance(node, str) else node.render(scope)


def _text(node, scope) -> str:
    return str(_render(node, scope))


class _Node:
    """A component with children; printed by ``_print``. A node without a template parameter
    below it (``fixed``) prints the same everywhere: its text is kept after the first time."""

    __slots__ = ("children", "fixed", "_done")

    def __init__(self, *children):
        self.children = children
        self.fixed = all(isinstance(c, str) or c.fixed for c in self._nodes())
        self._done = None

    def _nodes(self):
        for child in self.children:
            if isinstance(child, list):
                yield from child
            else:
                yield child

    def render(self, scope):
        if self.fixed:
            if self._done is None:
                self._done = self._print(None)
            return self._done
        return self._print(scope)

    def params(self):
        """The template parameters below this node."""
        for child in self._nodes():
            if isinstance(child, _Param):
                yield child
            elif isinstance(child, _Node):
                yield from child.params()

    def _print(self, scope):
        raise NotImplementedError


class _Param(_Node):
    """``T_`` / ``T<n>_``: the n-th template argument of the function being printed (printed in
    the scope around that function)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        super().__init__()
        self.index, self.fixed = index, False

    def _print(self, scope):
        if scope is None or self.index >= len(scope[0]):
            raise _Unsupported("template parameter out of scope")
        return _render(scope[0][self.index], scope[1])


class _Join(_Node):
    """Its children's texts, one after the other (qualified names: ``a``, ``::``, ``b``)."""

    __slots__ = ()

    def _print(self, scope):
        return "".join(_text(c, scope) for c in self.children)


class _TemplateId(_Node):
    """``name<args>``."""

    __slots__ = ()

    def _print(self, scope):
        name, args = self.children
        return _template_text(_text(name, scope), [_render(a, scope) for a in args])


class _PackArg(_Node):
    """A template argument pack ``J…E``."""

    __slots__ = ()

    def _print(self, scope):
        return _Pack(_render(a, scope) for a in self.children[0])


class _Mod(_Node):
    """A pointer, reference, or cv-qualified type: ``inner`` and the text after it (``*``,
    ``&``, ``&&``, `` const``…)."""

    __slots__ = ("mark",)

    def __init__(self, inner, mark: str):
        super().__init__(inner)
        self.mark = mark

    def _print(self, scope):
        if self.mark in ("&", "&&"):  # reference collapsing: & & -> &, && & -> &, & && -> &
            sub, sub_scope = self.children[0], scope
            if isinstance(sub, _Param) and scope is not None and sub.index < len(scope[0]):
                sub, sub_scope = scope[0][sub.index], scope[1]
            if isinstance(sub, _Mod) and sub.mark in ("&", "&&"):
                if sub.mark == "&" or sub.mark == self.mark:
                    return _render(sub, sub_scope)
                return _Mod(sub.children[0], "&")._print(sub_scope)
        inner = _render(self.children[0], scope)
        if isinstance(inner, _Declarator):
            if self.mark.startswith(" ") and not inner.decl:  # cv on a function or an array type
                if inner.suffix.startswith("("):
                    return _Declarator(inner.base, inner.suffix + self.mark)
                return _Declarator(inner.base + self.mark, inner.suffix)
            return inner.wrapped(self.mark)
        if isinstance(inner, _Pack):
            return _Pack(f"{t}{self.mark}" for t in inner)
        return f"{inner}{self.mark}"


class _Function(_Node):
    """``F <return> <params> E``."""

    __slots__ = ("quals",)

    def __init__(self, ret, params: list, quals: str):
        super().__init__(ret, params)
        self.quals = quals

    def _print(self, scope):
        ret = _render(self.children[0], scope)
        if isinstance(ret, _Declarator):
            raise _Unsupported("function returning a function pointer or an array")
        return _Declarator(str(ret), f"({_param_text(self.children[1], scope)}){self.quals}")


class _Array(_Node):
    """``A <size> _ <element>``."""

    __slots__ = ("size",)

    def __init__(self, element, size: str):
        super().__init__(element)
        self.size = size

    def _print(self, scope):
        element = _render(self.children[0], scope)
        if isinstance(element, _Declarator):
            raise _Unsupported("array of functions or arrays")
        return _Declarator(str(element), f" [{self.size}]")


class _MemberPointer(_Node):
    """``M <class> <member type>``: ``int Foo::*``, ``void (Foo::*)(int)``."""

    __slots__ = ()

    def _print(self, scope):
        owner, member = _text(self.children[0], scope), _render(self.children[1], scope)
        if isinstance(member, _Declarator):
            return member.wrapped(f"{owner}::*")
        return f"{member} {owner}::*"


class _Expansion(_Node):
    """``Dp <type>``: the type once per element of the pack it names, comma-separated."""

    __slots__ = ()

    def _print(self, scope):
        inner = self.children[0]
        packs = [p for p in (inner.params() if isinstance(inner, _Node) else ())
                 if scope is not None and p.index < len(scope[0]) and isinstance(scope[0][p.index], _PackArg)]
        if isinstance(inner, _Param):
            packs.append(inner)
        packs = [p for p in packs if scope is not None and p.index < len(scope[0])
                 and isinstance(scope[0][p.index], _PackArg)]
        if not packs:
            return _render(inner, scope)
        args, outer = scope
        count = len(args[packs[0].index].children[0])
        return _Pack(_render(inner, ([a.children[0][k] if isinstance(a, _PackArg) else a for a in args], outer))
                     for k in range(count))


class _Lambda(_Node):
    """``{lambda(params)#n}``."""

    __slots__ = ("number",)

    def __init__(self, params: list, number: int):
        super().__init__(params)
        self.number = number

    def _print(self, scope):
        return f"{{lambda({_param_text(self.children[0], scope)})#{self.number}}}"


class _Encoding(_Node):
    """A function: its name, return type (None: not shown) and parameters, printed with the
    name's template arguments (``args``, None when it is no template) as the scope of its ``T_``."""

    __slots__ = ("args", "quals")

    def __init__(self, name, args: list | None, ret, params: list, quals: str):
        super().__init__(name, ret if ret is not None else "", params)
        self.args, self.quals = args, quals

    def _print(self, scope):
        name, ret, params = self.children
        inner = (self.args, scope) if self.args is not None else scope
        text = f"{_text(name, inner)}({_param_text(params, inner)}){self.quals}"
        if ret != "":
            ret = _render(ret, inner)
            if isinstance(ret, _Declarator):
                raise _Unsupported("function returning a function pointer or an array")
            text = f"{ret} {text}"
        return text


def _flat(printed: list) -> list[str]:
    """Printed arguments as texts, packs spread out (an empty pack: one empty text)."""
    texts = []
    for value in printed:
        if isinstance(value, _Pack):
            texts += _flat(value) if value else [""]
        else:
            texts.append(str(value))
    return texts


def _arglist(texts: list[str]) -> tuple[str, str]:
    """(texts joined by ", ", the last character libstdc++ saw). libstdc++ prints a list as its
    head, ", " and its tail, and takes the ", " back when the tail printed nothing (an empty
    pack): ``(a, , b)`` keeps an empty pack in the middle, drops one at the end, and the last
    character seen is then the space it took back. ``""`` when nothing at all was printed."""
    text, last = "", ""
    for k in range(len(texts) - 1, -1, -1):
        head = texts[k]
        if k == len(texts) - 1:
            text, last = head, head[-1:]
        elif not text:
            text, last = head, " "
        else:
            text = f"{head}, {text}"
    return text, last


def _param_text(params: list, scope) -> str:
    """Parameter types as libstdc++ joins them (``_arglist``; packs spread out); ``(void)`` -> ``()``."""
    texts = _flat([_render(p, scope) for p in params])
    return "" if texts == ["void"] else _arglist(texts)[0]


def _template_text(name: str, args: list) -> str:
    """``name<a, b>`` as libstdc++ prints it: a space after an ``operator<``, and between two
    ``>`` when the last character it saw was ``>`` (``_arglist``)."""
    text, last = _arglist(_flat(args))
    return f"{name}{' ' if name.endswith('<') else ''}<{text}{' ' if last == '>' else ''}>"


class _Name:
    """A parsed name: its node, its last template arguments (None: not a template), whether it
    is a constructor, destructor or conversion (no return type), and member qualifiers."""

    __slots__ = ("node", "args", "no_return", "quals")

    def __init__(self, node, args: list | None = None, no_return: bool = False, quals: str = ""):
        self.node, self.args, self.no_return, self.quals = node, args, no_return, quals


# -- the reader ---------------------------------------------------------------------------------

class _Parser:
    """One mangled name, read left to right (``at``) into nodes, with the substitution
    candidates seen so far (``subs``, in the ABI's order)."""

    def __init__(self, text: str):
        self.text = text
        self.at = 0
        self.subs: list = []
        self.lambda_params = False  # inside a lambda's signature: T_ is "auto:N"

    # -- reading --------------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> str:
        at = self.at + ahead
        return self.text[at] if at < len(self.text) else ""

    def take(self, expected: str) -> None:
        if not self.text.startswith(expected, self.at):
            raise _Unsupported(f"expected {expected!r} at {self.at}")
        self.at += len(expected)

    def number(self) -> int:
        """A decimal ``<number>``, ``n`` for negative."""
        negative = self.peek() == "n"
        if negative:
            self.at += 1
        start = self.at
        while self.peek().isdigit():
            self.at += 1
        if start == self.at:
            raise _Unsupported("number expected")
        value = int(self.text[start:self.at])
        return -value if negative else value

    def seq_id(self) -> int:
        """``_`` -> 0, ``<base 36>_`` -> value + 1 (substitution and template parameter indexes)."""
        if self.peek() == "_":
            self.at += 1
            return 0
        start = self.at
        while self.peek() not in ("_", ""):
            self.at += 1
        value = int(self.text[start:self.at], 36)
        self.take("_")
        return value + 1

    def add(self, node):
        self.subs.append(node)
        return node

    # -- the whole name ---------------------------------------------------------------------
    def top(self) -> str:
        self.take(MANGLED_PREFIX)
        if self.peek() in ("T", "G"):
            raise _Unsupported("special name")
        text = _text(self.encoding(top=True), None)
        rest = self.text[self.at:]
        if rest:
            clones = _CLONE.findall(rest)
            if "".join(clones) != rest:
                raise _Unsupported("trailing characters")
            text += "".join(f" [clone {c}]" for c in clones)
        return text

    def encoding(self, top: bool = False):
        """``<name> [<bare-function-type>]``: a function (its return type shown when it is a
        template, unless ``top`` is False: a function around a local name), or data."""
        name = self.name()
        if self.peek() in ("", "E", "."):
            return name.node
        ret = self.type() if name.args is not None and not name.no_return else None
        params = self.param_list()
        return _Encoding(name.node, name.args, ret if top else None, params, name.quals)

    def param_list(self) -> list:
        types = []
        while self.peek() not in ("", "E", "."):
            types.append(self.type())
        return types

    # -- names ------------------------------------------------------------------------------
    def name(self) -> _Name:
        char = self.peek()
        if char == "N":
            return self.nested_name()
        if char == "Z":
            return self.local_name()
        if char == "S" and self.peek(1) != "t":
            sub = self.substitution()
            if self.peek() != "I":
                raise _Unsupported("a substitution as a whole name")
            args = self.template_args()
            return _Name(_TemplateId(sub, args), args)
        prefix = ""
        if char == "S":  # St: std::
            self.at += 2
            prefix = "std::"
        part, no_return = self.unqualified_name(None)
        node = _Join(prefix, part) if prefix else part
        if self.peek() == "I":
            self.add(node)
            args = self.template_args()
            return _Name(_TemplateId(node, args), args, no_return)
        return _Name(node, None, no_return)

    def nested_name(self) -> _Name:
        """``N [<CV-qualifiers>] [<ref-qualifier>] <prefix> <unqualified-name> E``: every
        prefix but the whole name is a substitution candidate (one that is itself a
        substitution is not added again)."""
        self.take("N")
        quals = self.member_quals()
        node = None
        args = None
        no_return = False
        plain = None  # the last component without template arguments (a constructor's name)
        while self.peek() != "E":
            char = self.peek()
            was_sub = False
            if char == "S":
                was_sub = True
                if self.peek(1) == "t":
                    self.at += 2
                    node = "std"
                else:
                    node = plain = self.substitution()
                args = None
            elif char == "I":
                if node is None:
                    raise _Unsupported("template arguments without a name")
                args = self.template_args()
                node = _TemplateId(node, args)
            elif char == "T":
                node, args = self.template_param(), None
            elif char == "M" or (char == "D" and self.peek(1) not in "0124"):
                raise _Unsupported("decltype or initializer scope in a prefix")
            else:
                part, no_return = self.unqualified_name(plain)
                plain = part
                node = part if node is None else _Join(node, "::", part)
                args = None
            if self.peek() != "E" and not was_sub:
                self.add(node)
        self.take("E")
        if node is None:
            raise _Unsupported("empty nested name")
        return _Name(node, args, no_return, quals)

    def member_quals(self) -> str:
        quals = ""
        for code, word in (("r", " restrict"), ("V", " volatile"), ("K", " const")):
            if self.peek() == code:
                self.at += 1
                quals = word + quals
        if self.peek() in ("R", "O"):
            quals += " &" if self.peek() == "R" else " &&"
            self.at += 1
        return quals

    def local_name(self) -> _Name:
        """``Z <function encoding> E <entity name> [<discriminator>]``: printed
        ``function(params)::entity`` (no return type); the entity keeps its own template
        arguments."""
        self.take("Z")
        function = self.encoding()
        self.take("E")
        if self.peek() == "s":
            self.at += 1
            self.discriminator()
            return _Name(_Join(function, "::string literal"))
        if self.peek() == "d":
            raise _Unsupported("default argument scope")
        entity = self.name()
        self.discriminator()
        return _Name(_Join(function, "::", entity.node), entity.args, entity.no_return, entity.quals)

    def discriminator(self) -> None:
        if self.peek() == "_":
            self.at += 1
            if self.peek() == "_":
                self.at += 1
                self.number()
                self.take("_")
            else:
                self.number()

    def unqualified_name(self, enclosing) -> tuple:
        """(node, whether it is a constructor / destructor / conversion) of one component."""
        char = self.peek()
        no_return = False
        if char.isdigit():
            node = self.source_name()
        elif char == "U":
            node = self.unnamed()
        elif char == "C" and self.peek(1) in "123I":
            self.at += 2 if self.peek(1) != "I" else 3
            node, no_return = self._ctor_name(enclosing), True
        elif char == "D" and self.peek(1) in "0124":
            self.at += 2
            node, no_return = "~" + self._ctor_name(enclosing), True
        elif char == "L" and self.peek(1).isdigit():
            self.at += 1
            node = self.source_name()
            self.discriminator()
        else:
            node, no_return = self.operator_name()
        tags = ""
        while self.peek() == "B":  # ABI tags
            self.at += 1
            tags += f"[abi:{self.source_name()}]"
        return (_Join(node, tags) if tags else node), no_return

    @staticmethod
    def _ctor_name(enclosing) -> str:
        if enclosing is None:
            raise _Unsupported("constructor outside a class")
        return _text(enclosing, None).rsplit("::", 1)[-1].split("<", 1)[0]

    def source_name(self) -> str:
        length = self.number()
        if length <= 0:
            raise _Unsupported("empty identifier")
        text = self.text[self.at:self.at + length]
        if len(text) != length:
            raise _Unsupported("identifier past the end")
        self.at += length
        if text.startswith("_GLOBAL_") and text[8:9] in ("_", ".", "$") and text[9:10] == "N":
            return ANONYMOUS_NAMESPACE
        return text

    def unnamed(self):
        """``Ul <params> E [<n>] _`` -> ``{lambda(params)#n+2}``; ``Ut [<n>] _`` -> ``{unnamed
        type#n+2}`` (the latter is a substitution candidate by itself, the former is not)."""
        kind = self.peek(1)
        self.at += 2
        if kind == "l":
            outer, self.lambda_params = self.lambda_params, True
            try:
                params = self.param_list()
            finally:
                self.lambda_params = outer
            self.take("E")
            return _Lambda(params, self._unnamed_number())
        if kind == "t":
            return self.add(f"{{unnamed type#{self._unnamed_number()}}}")
        raise _Unsupported("unnamed entity kind")

    def _unnamed_number(self) -> int:
        number = 1
        if self.peek().isdigit():
            number = self.number() + 2
        self.take("_")
        return number

    def operator_name(self) -> tuple:
        code = self.text[self.at:self.at + 2]
        if code == "cv":
            self.at += 2
            return _Join("operator ", self.type()), True
        if code == "li":
            self.at += 2
            return f'operator"" {self.source_name()}', False
        word = OPERATORS.get(code)
        if word is None:
            raise _Unsupported(f"name {code!r}")
        self.at += 2
        return ("operator " + word if word[0].isalpha() else "operator" + word), False

    # -- substitutions and template parameters ----------------------------------------------------
    def substitution(self):
        """``S_``, ``S<seq>_`` or a ``std::`` abbreviation (``Sa`` …)."""
        self.take("S")
        char = self.peek()
        if char in STD_ABBREVIATIONS and char.islower():
            self.at += 1
            return STD_ABBREVIATIONS[char]
        index = self.seq_id()
        if index >= len(self.subs):
            raise _Unsupported("substitution out of range")
        return self.subs[index]

    def template_param(self):
        """``T_`` / ``T<n>_`` (``auto:N`` in a lambda's signature)."""
        self.take("T")
        index = self.seq_id()
        return f"auto:{index + 1}" if self.lambda_params else _Param(index)

    def template_args(self) -> list:
        self.take("I")
        args = []
        while self.peek() != "E":
            args.append(self.template_arg())
        self.take("E")
        return args

    def template_arg(self):
        char = self.peek()
        if char == "L":
            return self.literal()
        if char == "X":
            self.at += 1
            if self.peek() == "T":
                value = self.template_param()
            elif self.peek() == "L":
                value = self.literal()
            else:
                raise _Unsupported("expression")
            self.take("E")
            return value
        if char in ("J", "I"):
            self.at += 1
            pack = []
            while self.peek() != "E":
                pack.append(self.template_arg())
            self.take("E")
            return _PackArg(pack)
        return self.type()

    def literal(self):
        """``L <type> <value> E`` as GNU prints it: ``512``, ``-2``, ``true``, ``4u``, ``2ul``,
        ``(char)65``, ``(Enum)3``; ``L_Z <encoding> E``: the entity."""
        self.take("L")
        if self.peek() == "_" and self.peek(1) == "Z":
            self.at += 2
            node = self.encoding()
            self.take("E")
            return node
        code = self.peek()
        if code in BUILTIN:
            self.at += 1
            type_node = BUILTIN[code]
        elif code.isdigit() or code in ("N", "S"):
            code, type_node = "", self.type()
        else:
            raise _Unsupported("literal type")
        if code in ("f", "d", "e", "g"):
            raise _Unsupported("floating-point literal")
        value = self.number()
        self.take("E")
        if code == "b" and value in (0, 1):
            return "true" if value else "false"
        if code in LITERAL_SUFFIX:
            return f"{value}{LITERAL_SUFFIX[code]}"
        return _Join("(", type_node, f"){value}")

    # -- types ------------------------------------------------------------------------------
    def type(self):
        """A type node; adds the ABI's substitution candidates (every type but builtins and a
        substitution used as is)."""
        char = self.peek()
        if char in BUILTIN:
            self.at += 1
            return BUILTIN[char]
        if char == "D":
            return self._d_type()
        if char == "u":
            self.at += 1
            return self.source_name()
        if char in ("r", "V", "K"):
            quals = []
            while self.peek() in ("r", "V", "K"):
                quals.append({"r": "restrict", "V": "volatile", "K": "const"}[self.peek()])
                self.at += 1
            return self.add(_Mod(self.type(), " " + " ".join(reversed(quals))))
        if char in ("P", "R", "O"):
            self.at += 1
            return self.add(_Mod(self.type(), {"P": "*", "R": "&", "O": "&&"}[char]))
        if char == "F":
            return self._function()
        if char == "A":
            self.at += 1
            size = str(self.number()) if self.peek().isdigit() else ""
            self.take("_")
            return self.add(_Array(self.type(), size))
        if char == "M":
            self.at += 1
            owner = self.type()
            return self.add(_MemberPointer(owner, self.type()))
        if char == "T":
            node = self.add(self.template_param())
            if self.peek() == "I":
                node = self.add(_TemplateId(node, self.template_args()))
            return node
        if char == "S" and self.peek(1) != "t":
            node = self.substitution()
            if self.peek() == "I":  # a substitution alone is no new candidate; with arguments it is
                node = self.add(_TemplateId(node, self.template_args()))
            return node
        if char in ("N", "Z", "S") or char.isdigit():
            return self.add(self.name().node)
        raise _Unsupported(f"type {char!r}")

    def _d_type(self):
        """``D…`` types: builtins (``Dh`` half…), ``DF<n>_``, ``Dp`` pack expansion, ``Dv``
        vector."""
        kind = self.peek(1)
        self.at += 2
        if kind in BUILTIN_D:
            return BUILTIN_D[kind]
        if kind == "F":
            bits = self.number()
            self.take("_")
            return f"_Float{bits}"
        if kind == "p":
            return self.add(_Expansion(self.type()))
        if kind == "v":
            count = self.number()
            self.take("_")
            return self.add(_Join(self.type(), f" __vector({count})"))
        raise _Unsupported(f"type D{kind}")

    def _function(self):
        self.take("F")
        if self.peek() == "Y":
            self.at += 1
        ret = self.type()
        params = self.param_list()
        quals = ""
        if self.peek() in ("R", "O"):
            quals = " &" if self.peek() == "R" else " &&"
            self.at += 1
        self.take("E")
        return self.add(_Function(ret, params, quals))
