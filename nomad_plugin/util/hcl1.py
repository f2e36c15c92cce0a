"""HCL v1 as the Nomad agent reads its ``-config`` files: scanner, parser and decoder.

The agent decodes each file with HCL v1 (github.com/hashicorp/hcl, Nomad's fork v1.0.1-nomad-1;
command/agent/config_parse.go calls ``hcl.Decode``). No maintained Python package reads HCL v1 as Go
does: pyhcl accepts bare words, operators and ternaries that Go refuses, reads ``010`` as 10 and
keeps escapes such as ``\\n`` as written. This module follows Go's rules instead, token by token:
commas between attributes, heredocs, octal and hex numbers, quoted keys, case-insensitive field
names, an object under a key decoded as a list of one map, and Go's quirks (a file that ends in
``key =`` drops that attribute). tests/operator/test_agent_corpus.py checks it against Go's HCL v1
on real agent files and HCL v1's own fixtures.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

# -- tokens ---------------------------------------------------------------------------------

EOF, ILLEGAL, IDENT, NUMBER, FLOAT, BOOL, STRING, HEREDOC = "EOF ILLEGAL IDENT NUMBER FLOAT BOOL STRING HEREDOC".split()
COMMENT, LBRACK, RBRACK, LBRACE, RBRACE, COMMA, ASSIGN, PERIOD, ADD, SUB = (
    "COMMENT LBRACK RBRACK LBRACE RBRACE COMMA ASSIGN PERIOD ADD SUB".split()
)
_PUNCT = {"[": LBRACK, "]": RBRACK, "{": LBRACE, "}": RBRACE, ",": COMMA, "=": ASSIGN, "+": ADD}
_END = ""  # the scanner's end of input


class Hcl1Error(ValueError):
    """What Go's HCL v1 refuses, with its place: ``line``, ``column`` (1-based; 0 when unknown)."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"At {line}:{column}: {message}" if line else message)
        self.line, self.column, self.reason = line, column, message


@dataclass
class Token:
    type: str
    text: str
    line: int
    column: int


def _is_letter(ch: str) -> bool:
    return ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ch == "_" or (ch >= "\x80" and ch.isalpha())


def _is_digit(ch: str) -> bool:
    return "0" <= ch <= "9" or (ch >= "\x80" and unicodedata.category(ch) == "Nd")


def _is_decimal(ch: str) -> bool:
    return "0" <= ch <= "9"


def _digit_value(ch: str) -> int:
    for first, last, base in (("0", "9", 0), ("a", "f", 10), ("A", "F", 10)):
        if ch and first <= ch <= last:
            return ord(ch) - ord(first) + base
    return 16


class _Scanner:
    """Go's hcl/scanner: one token per ``scan``; errors are remembered and the last one wins."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0
        self.line, self.column = 1, 0
        self.previous = (0, 1, 0)
        self.last_line_length = 0
        self.error: Hcl1Error | None = None

    def next(self) -> str:
        if self.pos >= len(self.src):
            self.column += 1
            return _END
        ch = self.src[self.pos]
        self.previous = (self.pos, self.line, self.column)
        self.pos += 1
        self.column += 1
        if ch == "\n":
            self.line, self.column, self.last_line_length = self.line + 1, 0, self.column
        if ch == "\x00":
            self.err("unexpected null character (0x00)")
            return _END
        if ch == "\ue123":
            self.err("unicode code point U+E123 reserved for internal use")
        return ch

    def unread(self) -> None:
        self.pos, self.line, self.column = self.previous

    def peek(self) -> str:
        return self.src[self.pos] if self.pos < len(self.src) else _END

    def err(self, message: str) -> None:
        at_newline = self.column == 0 and self.line > 1  # Go names the end of the line just read
        line, column = (self.line - 1, self.last_line_length) if at_newline else (self.line, self.column)
        self.error = Hcl1Error(line, max(column, 1), message)

    def scan(self) -> Token:
        ch = self.next()
        while ch in (" ", "\t", "\n", "\r"):
            ch = self.next()
        start = self.pos - (1 if ch else 0)
        line, column = self.line, self.column
        kind = ILLEGAL
        if _is_letter(ch):
            while _is_letter(ch) or _is_digit(ch) or ch in "-.":
                ch = self.next()
                if not ch:
                    break
            if ch:
                self.unread()
            text = self.src[start : self.pos]
            kind = BOOL if text in ("true", "false") else IDENT
        elif _is_decimal(ch):
            kind = self.number(ch)
        elif ch == _END:
            kind = EOF
        elif ch == '"':
            kind = STRING
            self.string()
        elif ch in "#/":
            kind = COMMENT
            self.comment(ch)
        elif ch == ".":
            kind = PERIOD
            if _is_decimal(self.peek()):
                kind = FLOAT
                self.exponent(self.mantissa(self.peek()))
        elif ch == "<":
            kind = HEREDOC
            self.heredoc()
        elif ch in _PUNCT:
            kind = _PUNCT[ch]
        elif ch == "-":
            kind = self.number(self.next()) if _is_decimal(self.peek()) else SUB
        else:
            self.err("illegal char")
        return Token(kind, self.src[start : self.pos], line, column)

    def comment(self, ch: str) -> None:
        if ch == "#" or self.peek() != "*":
            if ch == "/" and self.peek() != "/":
                self.err("expected '/' for comment")
                return
            ch = self.next()
            while ch not in ("\n", _END):
                ch = self.next()
            if ch:
                self.unread()
            return
        self.next()
        ch = self.next()
        while True:
            if not ch:
                self.err("comment not terminated")
                return
            previous, ch = ch, self.next()
            if previous == "*" and ch == "/":
                return

    def number(self, ch: str) -> str:
        illegal_octal = False
        if ch == "0":
            ch = self.next()
            if ch in ("x", "X"):
                ch = self.next()
                found = False
                while ch and ch in "0123456789abcdefABCDEF":
                    ch, found = self.next(), True
                if not found:
                    self.err("illegal hexadecimal number")
                if ch:
                    self.unread()
                return NUMBER
            while _is_decimal(ch):
                ch = self.next()
                illegal_octal = illegal_octal or ch in ("8", "9")
        else:
            self.mantissa(ch)
            ch = self.next()
        if ch in ("e", "E"):
            self.exponent(ch)
            return FLOAT
        if ch == ".":
            ch = self.fraction(ch)
            if ch in ("e", "E"):
                self.exponent(self.next())
            return FLOAT
        if illegal_octal:
            self.err("illegal octal number")
        if ch:
            self.unread()
        return NUMBER

    def mantissa(self, ch: str) -> str:
        scanned = False
        while _is_decimal(ch):
            ch, scanned = self.next(), True
        if scanned and ch:
            self.unread()
        return ch

    def fraction(self, ch: str) -> str:
        return self.mantissa(self.peek()) if ch == "." else ch

    def exponent(self, ch: str) -> str:
        if ch in ("e", "E"):
            ch = self.next()
            if ch in ("-", "+"):
                ch = self.next()
            ch = self.mantissa(ch)
        return ch

    def heredoc(self) -> None:
        if self.next() != "<":
            self.err("heredoc expected second '<', didn't see it")
            return
        start = self.pos
        ch = self.next()
        if ch == "-":
            ch = self.next()
        while _is_letter(ch) or _is_digit(ch):
            ch = self.next()
        if not ch:
            self.err("heredoc not terminated")
            return
        if ch == "\r" and self.peek() == "\n":
            ch = self.next()
        if ch != "\n":
            self.err("invalid characters in heredoc anchor")
            return
        anchor = self.src[start : self.pos - 1]
        if anchor in ("", "-"):
            self.err("zero-length heredoc anchor")
            return
        word = anchor[1:] if anchor.startswith("-") else anchor
        closing = re.compile(r"[\t\n\v\f\r ]*" + re.escape(word) + r"\r*")
        line_start = self.pos
        while True:
            ch = self.next()
            if ch == "\n":
                line = self.src[line_start : self.pos - 1]
                if len(line.encode()) >= len(anchor.encode()) and closing.fullmatch(line):
                    return
                line_start = self.pos
            if not ch:
                self.err("heredoc not terminated")
                return

    def string(self) -> None:
        braces = 0
        while True:
            ch = self.next()
            if (ch == "\n" and braces == 0) or not ch:
                self.err("literal not terminated")
                return
            if ch == '"' and braces == 0:
                return
            if braces == 0 and ch == "$" and self.peek() == "{":
                braces += 1
                self.next()
            elif braces > 0 and ch == "{":
                braces += 1
            if braces > 0 and ch == "}":
                braces -= 1
            if ch == "\\":
                self.escape()

    def escape(self) -> None:
        ch = self.next()
        digits = {"x": (16, 2), "u": (16, 4), "U": (16, 8)}
        if ch and ch in 'abfnrtv\\"':
            return
        if ch and ch in "01234567":
            self.digits(ch, 8, 3)
        elif ch in digits:
            self.digits(self.next(), *digits[ch])
        else:
            self.err("illegal char escape")

    def digits(self, ch: str, base: int, count: int) -> None:
        start = count
        while count > 0 and _digit_value(ch) < base:
            ch = self.next()
            if not ch:
                break
            count -= 1
        if count > 0:
            self.err("illegal char escape")
        if count != start and ch:
            self.unread()


# -- syntax tree ----------------------------------------------------------------------------


@dataclass
class Literal:
    token: Token


@dataclass
class Item:
    keys: list[Token]
    value: Any  # Literal | ObjectType | ListType


@dataclass
class ObjectList:
    items: list[Item] = field(default_factory=list)

    def filter(self, key: str) -> ObjectList:
        """Items whose first key is ``key`` (any case, as Go's EqualFold), that key stripped."""
        return ObjectList(
            [Item(i.keys[1:], i.value) for i in self.items if i.keys and _fold_equal(key_value(i.keys[0]), key)]
        )


@dataclass
class ObjectType:
    list: ObjectList


@dataclass
class ListType:
    items: list[Any]


def _fold_equal(a: str, b: str) -> bool:
    return a == b or (len(a) == len(b) and a.lower() == b.lower())


# -- parser -----------------------------------------------------------------------------------


class _EndOfFile(Exception):
    """Go's errEofToken: ends an object list quietly."""


class _Parser:
    """Go's hcl/parser, with its one-token look-back and its error recovery at ``}``."""

    def __init__(self, src: str) -> None:
        self.scanner = _Scanner(src.replace("\r\n", "\n"))
        self.tok = Token(EOF, "", 0, 0)
        self.buffered = False

    def scan(self) -> Token:
        if self.buffered:
            self.buffered = False
            return self.tok
        self.tok = self.scanner.scan()
        while self.tok.type == COMMENT:
            self.tok = self.scanner.scan()
        return self.tok

    def unscan(self) -> None:
        self.buffered = True

    def fail(self, tok: Token, message: str) -> Hcl1Error:
        return Hcl1Error(tok.line, tok.column, message)

    def parse(self) -> ObjectList:
        root = ObjectList()
        error: Hcl1Error | None = None
        try:
            self.object_list(root, inside=False)
        except Hcl1Error as exc:
            error = exc
        if self.scanner.error is not None:
            raise self.scanner.error
        if error is not None:
            raise error
        return root

    def object_list(self, node: ObjectList, inside: bool) -> ObjectList:
        while True:
            if inside:
                tok = self.scan()
                self.unscan()
                if tok.type == RBRACE:
                    return node
            try:
                item = self.object_item()
            except _EndOfFile:
                return node
            node.items.append(item)
            if self.scan().type != COMMA:
                self.unscan()

    def object_item(self) -> Item:
        keys: list[Token] = []
        try:
            keys = self.object_key(keys)
        except _EndOfFile:
            if not keys:
                raise
        except Hcl1Error:
            if not keys or self.tok.type != RBRACE:
                raise
            self.tok.type = EOF
        if self.tok.type == ASSIGN:
            value: Any = self.value()
        elif self.tok.type == LBRACE:
            value = self.object_type()
        else:
            names = " ".join(k.text for k in keys)
            raise self.fail(self.tok, f"key '{names}' expected start of object ('{{') or assignment ('=')")
        self.scan()
        self.unscan()
        return Item(keys, value)

    def object_key(self, keys: list[Token]) -> list[Token]:
        while True:
            tok = self.scan()
            if tok.type == EOF:
                raise _EndOfFile
            if tok.type == ASSIGN:
                if len(keys) > 1:
                    raise self.fail(tok, f"nested object expected: LBRACE got: {tok.type}")
                if not keys:
                    raise self.fail(tok, "no object keys found!")
                return keys
            if tok.type == LBRACE:
                if not keys:
                    raise self.fail(tok, f"expected: IDENT | STRING got: {tok.type}")
                return keys
            if tok.type in (IDENT, STRING):
                keys.append(tok)
            elif tok.type == ILLEGAL:
                raise self.fail(tok, "illegal character")
            else:
                raise self.fail(tok, f"expected: IDENT | STRING | ASSIGN | LBRACE got: {tok.type}")

    def value(self) -> Any:
        tok = self.scan()
        if tok.type in (NUMBER, FLOAT, BOOL, STRING, HEREDOC):
            return Literal(tok)
        if tok.type == LBRACE:
            return self.object_type()
        if tok.type == LBRACK:
            return self.list_type()
        if tok.type == EOF:
            raise _EndOfFile
        raise self.fail(tok, f"Unknown token: {tok.line}:{tok.column} {tok.type} {tok.text}")

    def object_type(self) -> ObjectType:
        node = ObjectList()
        try:
            self.object_list(node, inside=True)
        except Hcl1Error:
            if self.tok.type != RBRACE:
                raise
        tok = self.scan()
        if tok.type != RBRACE:
            raise self.fail(tok, f"object expected closing RBRACE got: {tok.type}")
        return ObjectType(node)

    def list_type(self) -> ListType:
        items: list[Any] = []
        need_comma = False
        while True:
            tok = self.scan()
            if need_comma and tok.type not in (COMMA, RBRACK):
                raise self.fail(tok, f"error parsing list, expected comma or list end, got: {tok.type}")
            if tok.type in (BOOL, NUMBER, FLOAT, STRING, HEREDOC):
                items.append(Literal(tok))
                need_comma = True
            elif tok.type == COMMA:
                self.scan()
                self.unscan()
                need_comma = False
            elif tok.type == LBRACE:
                try:
                    items.append(self.object_type())
                except Hcl1Error as exc:
                    raise self.fail(tok, f"error while trying to parse object within list: {exc}") from None
                need_comma = True
            elif tok.type == LBRACK:
                try:
                    items.append(self.list_type())
                except Hcl1Error as exc:
                    raise self.fail(tok, f"error while trying to parse list within list: {exc}") from None
            elif tok.type == RBRACK:
                return ListType(items)
            else:
                raise self.fail(tok, f"unexpected token while parsing list: {tok.type}")


def parse(src: str) -> ObjectList:
    """The file's root object list; Hcl1Error where Go's parser refuses it."""
    return _Parser(src).parse()


# -- literal values (hcl/token Value, hcl/strconv Unquote) ----------------------------------------


def go_int(text: str) -> int:
    """strconv.ParseInt(text, 0, 64)."""
    sign, digits = (-1 if text[0] == "-" else 1, text[1:]) if text[:1] in ("+", "-") else (1, text)
    bases = {"0x": 16, "0X": 16, "0o": 8, "0O": 8, "0b": 2, "0B": 2}
    base = bases.get(digits[:2], 0)
    if base:
        digits = digits[2:]
    elif len(digits) > 1 and digits.startswith("0"):
        base, digits = 8, digits[1:]
    else:
        base = 10
    try:
        if not re.fullmatch(r"_?[0-9a-zA-Z]+(?:_[0-9a-zA-Z]+)*", digits):
            raise ValueError
        value = sign * int(digits.replace("_", ""), base)
    except ValueError:
        raise ValueError(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None
    if not -(2**63) <= value < 2**63:
        raise ValueError(f'strconv.ParseInt: parsing "{text}": value out of range')
    return value


def go_float(text: str) -> float:
    """strconv.ParseFloat(text, 64) for the decimal forms the scanner makes."""
    if not re.fullmatch(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", text):
        raise ValueError(f'strconv.ParseFloat: parsing "{text}": invalid syntax')
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f'strconv.ParseFloat: parsing "{text}": value out of range')
    return value


_SIMPLE = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


def unquote(text: str) -> str:
    """HCL v1's Unquote of a quoted string: Go escapes, ``${...}`` kept as written."""
    body = text[1:-1]
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError("invalid syntax")
    if "$" not in body and "{" not in body and "\n" in body:
        raise ValueError("invalid syntax")
    out = bytearray()
    i = 0
    while i < len(body):
        if body.startswith("${", i):
            depth, j = 1, i + 2
            while j < len(body) and depth:
                depth += {"{": 1, "}": -1}.get(body[j], 0)
                j += 1
            if depth:
                raise ValueError("invalid syntax")
            out += body[i:j].encode()
            i = j
            continue
        ch = body[i]
        if ch in ("\n", '"'):
            raise ValueError("invalid syntax")
        if ch != "\\":
            out += ch.encode()
            i += 1
            continue
        code, i = _escape(body, i + 1)
        out += code
    return out.decode(errors="replace")


def _escape(body: str, i: int) -> tuple[bytes, int]:
    ch = body[i : i + 1]
    if ch and ch in _SIMPLE:
        return bytes([_SIMPLE[ch]]), i + 1
    width = {"x": 2, "u": 4, "U": 8}.get(ch)
    if width:
        digits = body[i + 1 : i + 1 + width]
        if len(digits) < width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
            raise ValueError("invalid syntax")
        value = int(digits, 16)
        if ch == "x":
            return bytes([value]), i + 1 + width
        if value > 0x10FFFF:
            raise ValueError("invalid syntax")
        rune = "\ufffd" if 0xD800 <= value <= 0xDFFF else chr(value)  # utf8.EncodeRune
        return rune.encode(), i + 1 + width
    if ch and ch in "01234567":
        digits = body[i : i + 3]
        if len(digits) < 3 or not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) > 255:
            raise ValueError("invalid syntax")
        return bytes([int(digits, 8)]), i + 3
    raise ValueError("invalid syntax")


def _heredoc(text: str) -> str:
    """unindentHeredoc: the body less the closing line; ``<<-`` strips the closing line's indent."""
    raw = text.encode()
    idx = raw.index(b"\n")
    if raw[2:3] != b"-":
        return raw[idx + 1 : len(raw) - idx + 1].decode(errors="replace")
    lines = raw[idx + 1 : len(raw) - idx + 2].split(b"\n")
    prefix = lines[-1]
    if not all(line.startswith(prefix) for line in lines):
        return raw[idx + 1 : len(raw) - idx + 1].rstrip(b" \t").decode(errors="replace")
    return b"\n".join([line[len(prefix) :] for line in lines[:-1]] + [b""]).decode(errors="replace")


def literal_value(tok: Token) -> Any:
    """Token.Value(): where Go panics (a literal it scanned but cannot convert), Hcl1Error."""
    try:
        if tok.type == BOOL:
            return tok.text == "true"
        if tok.type == FLOAT:
            return go_float(tok.text)
        if tok.type == NUMBER:
            return go_int(tok.text)
        if tok.type == HEREDOC:
            return _heredoc(tok.text)
        if tok.type == IDENT:
            return tok.text
        return unquote(tok.text)
    except ValueError as exc:
        raise Hcl1Error(tok.line, tok.column, f"cannot read {tok.text}: {exc}") from None


def key_value(tok: Token) -> str:
    value = literal_value(tok)
    return value if isinstance(value, str) else tok.text
