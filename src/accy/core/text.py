"""The text form of a Program: a printer, and a parser that reads it back.

    program grad_elementwise {
      %0 = parameter() {index=0} : f32[lane=4]
      %1 = mul(%0, %0) : f32[lane=4]
      %2 = constant() {value=0.0} : f32[]
      %3 = reduce(%1, %2) {axes=[lane], op=sum} : f32[]
      return %3
    }

Attributes print sorted by name; strings that are identifiers print bare; named shapes print as
`[name=extent, ...]`. An operation whose id differs from its position carries `@id` (a
generated one `@synthetic`). Printing what was parsed gives the same text, so this form is the
golden format of tests. Every malformed text raises `ParseError` with a line and column.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from ..errors import AccyError, ParseError
from .arrays import ConstantArray
from .builder import Builder
from .ir import SYNTHETIC_ID, Attrs, Program
from .kinds.registry import RULES
from .types import DTYPES, TensorType

# ---------------------------------------------------------------------------------------------
# parsing

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r]+|\#[^\n]*)
  | (?P<newline>\n)
  | (?P<value>%[0-9]+)
  | (?P<number>-?(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|[0-9]+)|-inf)
  | (?P<payload>base64"[A-Za-z0-9+/=]*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<punct>[{}()\[\],=:@])
    """,
    re.VERBOSE,
)


class _Token:
    __slots__ = ("kind", "text", "line", "column")

    def __init__(self, kind: str, text: str, line: int, column: int):
        self.kind, self.text, self.line, self.column = kind, text, line, column

    def __repr__(self) -> str:
        return repr(self.text) if self.kind != "end" else "end of text"


def _tokenize(text: str) -> list[_Token]:
    tokens, line, line_start, position = [], 1, 0, 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        column = position - line_start + 1
        if match is None:
            raise ParseError(f"unexpected character {text[position]!r}", line, column)
        kind = match.lastgroup
        if kind == "newline":
            line, line_start = line + 1, match.end()
        elif kind != "space":
            tokens.append(_Token(kind, match.group(), line, column))
        position = match.end()
    tokens.append(_Token("end", "", line, position - line_start + 1))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.position = 0

    @property
    def token(self) -> _Token:
        return self.tokens[self.position]

    def fail(self, message: str, token: _Token | None = None) -> ParseError:
        token = token or self.token
        return ParseError(message, token.line, token.column)

    def advance(self) -> _Token:
        token = self.token
        if token.kind != "end":
            self.position += 1
        return token

    def expect(self, text: str) -> _Token:
        if self.token.text != text or self.token.kind in ("string",):
            raise self.fail(f"expected {text!r}, found {self.token!r}")
        return self.advance()

    def accept(self, text: str) -> bool:
        if self.token.text == text and self.token.kind == "punct":
            self.advance()
            return True
        return False

    def name(self, what: str) -> str:
        token = self.token
        if token.kind == "name":
            return self.advance().text
        if token.kind == "string":
            return _unquote(self.advance().text)
        raise self.fail(f"expected {what}, found {token!r}")

    def integer(self, what: str) -> int:
        token = self.token
        if token.kind != "number" or not re.fullmatch(r"-?[0-9]+", token.text):
            raise self.fail(f"expected {what} (an integer), found {token!r}")
        return int(self.advance().text)

    # program := 'program' NAME '{' statement* 'return' values '}'
    def program(self, depth: int = 0) -> Program:
        if depth > 32:
            raise self.fail("programs are nested too deeply")
        start = self.token
        if start.text != "program" or start.kind != "name":
            raise self.fail(f"expected 'program', found {start!r}")
        self.advance()
        builder = Builder(self.name("a program name"))
        self.expect("{")
        values: dict[str, Any] = {}
        while not (self.token.kind == "name" and self.token.text == "return"):
            if self.token.kind == "end":
                raise self.fail("the program has no 'return'")
            self.statement(builder, values, depth)
        self.advance()
        outputs = []
        if self.token.kind == "value":
            outputs.append(self.reference(values))
            while self.accept(","):
                outputs.append(self.reference(values))
        close = self.token
        self.expect("}")
        try:
            return builder.build(outputs)
        except AccyError as error:
            raise self.fail(str(error), close) from None

    def reference(self, values: dict[str, Any]) -> Any:
        token = self.token
        if token.kind != "value":
            raise self.fail(f"expected a value such as %0, found {token!r}")
        self.advance()
        if token.text not in values:
            raise self.fail(f"value {token.text} is used before it is defined", token)
        return values[token.text]

    def statement(self, builder, values: dict[str, Any], depth: int) -> None:
        start = self.token
        results = [self.result_name(values)]
        while self.accept(","):
            results.append(self.result_name(values))
        self.expect("=")
        kind_token = self.token
        kind = self.name("an operation kind")
        if kind not in RULES:
            raise self.fail(f"unknown operation kind {kind!r}", kind_token)
        self.expect("(")
        operands = []
        if self.token.kind == "value":
            operands.append(self.reference(values))
            while self.accept(","):
                operands.append(self.reference(values))
        self.expect(")")
        attrs: dict[str, Any] = {}
        if self.accept("{") and not self.accept("}"):
            while True:
                key_token = self.token
                key = self.name("an attribute name")
                if key in attrs:
                    raise self.fail(f"attribute {key!r} is given twice", key_token)
                self.expect("=")
                attrs[key] = self.attribute_value(depth)
                if self.accept("}"):
                    break
                self.expect(",")
        self.expect(":")
        types = [self.tensor_type()]
        while self.accept(","):
            types.append(self.tensor_type())
        op_id = None
        if self.accept("@"):
            if self.token.kind == "name" and self.token.text == "synthetic":
                self.advance()
                op_id = SYNTHETIC_ID
            else:
                op_id = self.integer("an operation id")
                if op_id < 0:
                    raise self.fail("operation ids are >= 0 (or 'synthetic')")
        rule = RULES[kind]
        if rule.result_type_is_attr:
            if len(types) != 1:
                raise self.fail(f"{kind} has one result, {len(types)} types are declared", start)
            attrs["type"] = types[0]
        if kind == "constant" and isinstance(attrs.get("value"), tuple | _Payload):
            attrs["value"] = self.constant_array(attrs["value"], types[0], kind_token)
        if len(results) != len(types):
            raise self.fail(f"{len(results)} results but {len(types)} types are declared", start)
        try:
            produced = builder.emit(kind, operands, Attrs(attrs), id=op_id)
        except AccyError as error:
            raise self.fail(str(error), kind_token) from None
        produced = produced if isinstance(produced, tuple) else (produced,)
        if len(produced) != len(results):
            raise self.fail(
                f"{kind} gives {len(produced)} results, {len(results)} are named", start
            )
        for name, value, declared in zip(results, produced, types, strict=True):
            if value.ty != declared:
                raise self.fail(
                    f"{name} is declared {declared} but {kind} gives {value.ty}", kind_token
                )
            values[name] = value

    def constant_array(self, value, t: TensorType, token: _Token) -> ConstantArray:
        """A constant's list of literals or base64 payload as the array of its type."""
        try:
            if isinstance(value, _Payload):
                return ConstantArray.from_bytes(value.decode(), t.dtype, t.extents)
            if any(not isinstance(v, bool | int | float) for v in value):
                raise self.fail("a constant's values are numbers", token)
            return ConstantArray.of(list(value), t.dtype, t.extents)
        except (AccyError, binascii.Error) as error:
            raise self.fail(str(error), token) from None

    def result_name(self, values: dict[str, Any]) -> str:
        token = self.token
        if token.kind != "value":
            raise self.fail(f"expected a result such as %0, or 'return', found {token!r}")
        if token.text in values:
            raise self.fail(f"value {token.text} is defined twice")
        return self.advance().text

    def tensor_type(self) -> TensorType:
        token = self.token
        dtype = self.name("a dtype")
        if dtype not in DTYPES:
            raise self.fail(f"unknown dtype {dtype!r}; the dtypes are {', '.join(DTYPES)}", token)
        self.expect("[")
        named = []
        if not self.accept("]"):
            while True:
                axis = self.name("an axis name")
                self.expect("=")
                named.append((axis, self.integer("an extent")))
                if self.accept("]"):
                    break
                self.expect(",")
        try:
            return TensorType(DTYPES[dtype], tuple(named))
        except AccyError as error:
            raise self.fail(str(error), token) from None

    def attribute_value(self, depth: int) -> Any:
        token = self.token
        if token.kind == "number":
            self.advance()
            if token.text == "-inf":
                return float("-inf")
            if re.fullmatch(r"-?[0-9]+", token.text):
                return int(token.text)
            return float(token.text)
        if token.kind == "string":
            return _unquote(self.advance().text)
        if token.kind == "payload":  # base64"...": a large constant's bytes
            return _Payload(self.advance().text[len('base64"') : -1])
        if token.kind == "name":
            if token.text == "program":
                return self.program(depth + 1)
            self.advance()
            constants = {"true": True, "false": False, "inf": float("inf"), "nan": float("nan")}
            if token.text in constants:
                return constants[token.text]
            if token.text in DTYPES and self.token.text == "[":
                self.position -= 1
                return self.tensor_type()
            return token.text
        if self.accept("["):
            items: list[Any] = []
            if self.accept("]"):
                return ()
            while True:
                items.append(self.list_item(depth))
                if self.accept("]"):
                    return tuple(items)
                self.expect(",")
        raise self.fail(f"expected an attribute value, found {token!r}")

    def list_item(self, depth: int) -> Any:
        following = self.tokens[self.position + 1] if self.token.kind != "end" else self.token
        if self.token.kind in ("name", "string") and following.text == "=":
            name = self.name("a name")
            self.expect("=")
            return (name, self.integer("an extent"))
        return self.attribute_value(depth)


class _Payload(str):
    """The text of a `base64"..."` attribute value."""

    def decode(self) -> bytes:
        return base64.b64decode(self, validate=True)


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), body)


def parse(text: str) -> Program:
    """Read a Program back from its text form; raises ParseError with a line and column.

    >>> import accy
    >>> p = accy.trace.define("neg", [accy.spec(accy.f32, lane=2)], lambda b, a: -a[0])
    >>> str(accy.core.parse(str(p))) == str(p)
    True
    """
    if not isinstance(text, str):
        raise ParseError(f"expected program text (a str), got {type(text).__name__}", 1, 1)
    parser = _Parser(text)
    try:
        program = parser.program()
    except ParseError:
        raise
    except AccyError as error:
        raise parser.fail(str(error)) from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as error:
        raise parser.fail(f"malformed program text ({type(error).__name__}: {error})") from None
    if parser.token.kind != "end":
        raise parser.fail(f"unexpected {parser.token!r} after the program's closing brace")
    return program
