"""The HCL2 functions a Nomad job file may call, as ``jobspec2/functions.go`` provides them.

Nomad's list is cty's ``function/stdlib`` plus HashiCorp's ``go-cty-funcs``; the ones here follow cty's
``stdlib`` (``string.go``, ``collection.go``, ``number.go``, ``format.go``) and ``go-cty-funcs/filesystem``
(``file`` reads relative to the job file's directory, as ``nomad job run`` sets its base directory).
A function Nomad has and this module lacks makes the value unknown (``Unknown``), so check-job says it
cannot tell; a name Nomad does not have is Nomad's "Call to unknown function" error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

#: Every name in ``jobspec2/functions.go``'s table.
NOMAD_FUNCTIONS = frozenset(
    "abs base64decode base64encode bcrypt can ceil chomp chunklist cidrhost cidrnetmask cidrsubnet cidrsubnets "
    "coalesce coalescelist compact concat contains convert csvdecode distinct element flatten floor format "
    "formatdate formatlist indent index join jsondecode jsonencode keys length log lookup lower max md5 merge min "
    "parseint pow range reverse replace regex_replace rsadecrypt setintersection setproduct setunion sha1 sha256 "
    "sha512 signum slice sort split strlen strrev substr timeadd title trim trimprefix trimspace trimsuffix try "
    "upper urlencode uuidv4 uuidv5 values yamldecode yamlencode zipmap abspath basename dirname file filebase64 "
    "fileexists fileset pathexpand".split()
)


class FunctionError(ValueError):
    """A call cty refuses; the message is cty's reason."""


def number_text(number: Decimal) -> str:
    """cty's number-to-string conversion (``big.Float.Text('f', -1)``): no exponent, no trailing zeros."""
    text = format(number.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def to_string(value: Any) -> str:
    """cty's conversion of a primitive to string; FunctionError for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return number_text(value)
    raise FunctionError("string required" if value is not None else "a string is required, not null")


def to_number(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, str):
        try:
            number: Decimal | None = Decimal(value)
        except ArithmeticError:
            number = None
        if number is not None and number.is_finite() and re.fullmatch(r"-?[0-9.]+(?:[eE][-+]?[0-9]+)?", value):
            return number
        raise FunctionError("a number is required")
    raise FunctionError("number required")


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    raise FunctionError("a bool is required" if isinstance(value, str) else "bool required")


def _int(value: Any) -> int:
    number = to_number(value)
    if number != number.to_integral_value():
        raise FunctionError("value must be a whole number")
    return int(number)


def equal(a: Any, b: Any) -> bool:
    """cty's equality: values of different kinds are never equal (``1 == "1"`` and ``1 == true`` are false)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def _position(lst: Any, value: Any) -> int:
    return next((i for i, item in enumerate(_seq(lst)) if equal(item, value)), -1)


def _seq(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise FunctionError("a list or tuple is required")
    return value


def _map(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FunctionError("a map or object is required")
    return value


def _json(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return {str(k): _from_json(v) for k, v in value.items()}


_VERB = re.compile(r"%(?:(%)|([-+# 0]*)([0-9]*)(?:\.([0-9]+))?([a-zA-Z]))")


def _verb(flags: str, width: str, precision: str | None, verb: str, arg: Any) -> str:
    """One argument rendered by one Go verb; FunctionError with cty's reason."""
    if arg is None:
        raise FunctionError("null value cannot be formatted")
    pyflags = flags.replace("#", "")
    if verb in "vs":
        plain = verb == "s" or not isinstance(arg, (list, dict))
        body = to_string(arg) if plain else json.dumps(_json(arg), separators=(",", ":"), sort_keys=True)
        body = body[: int(precision)] if precision is not None else body
        return f"{body:{'<' if '-' in flags else '>'}{width}}" if width else body
    if verb == "q":
        return json.dumps(to_string(arg), ensure_ascii=False)
    if verb == "t":
        return "true" if to_bool(arg) else "false"
    if verb in "dxXob":
        number = to_number(arg)
        if number != number.to_integral_value():
            raise FunctionError("an integer is required")
        return format(int(number), f"{pyflags}{width}{verb}")
    if verb in "feE" or (verb in "gG" and precision is not None):  # Go's %g alone is the shortest form
        return format(float(to_number(arg)), f"{pyflags}{width}.{precision if precision is not None else 6}{verb}")
    raise NotImplementedError(f"format verb %{verb} as written here")


def _format(spec: Any, *args: Any) -> str:
    """cty's ``format``: Go verbs %v %d %f %s %q %t %e %g %x %X %o %b, with flags, width and precision."""
    text, out, index, pos = to_string(spec), [], 0, 0
    for match in _VERB.finditer(text):
        out.append(text[pos : match.start()])
        pos = match.end()
        if match.group(1):
            out.append("%")
            continue
        raw = f"{json.dumps(match.group(0))} at {match.start()}"
        if index >= len(args):
            raise FunctionError(f"not enough arguments for {raw}: need index {index + 1} but have {len(args)} total")
        try:
            out.append(_verb(match.group(2), match.group(3), match.group(4), match.group(5), args[index]))
        except FunctionError as exc:
            raise FunctionError(f"unsupported value for {raw}: {exc}") from None
        index += 1
    out.append(text[pos:])
    if index < len(args):
        raise FunctionError(f"too many arguments; only {index} used by format string")
    return "".join(out)


def _join(sep: Any, *lists: Any) -> str:
    if not lists:
        raise FunctionError("at least one list is required")
    items = [v for lst in lists for v in _seq(lst)]
    if any(v is None for v in items):
        raise FunctionError("cannot concatenate null values")
    return to_string(sep).join(to_string(v) for v in items)


def _lookup(inputMap: Any, key: Any, default: Any) -> Any:
    found = _map(inputMap)
    return found.get(to_string(key), default)


def _element(lst: Any, index: Any) -> Any:
    items, i = _seq(lst), _int(index)
    if i < 0:
        raise FunctionError("cannot use element function with a negative index")
    if not items:
        raise FunctionError("cannot use element function with an empty list")
    return items[i % len(items)]


def _index(collection: Any, key: Any) -> Any:
    if isinstance(collection, dict) and to_string(key) in collection:
        return collection[to_string(key)]
    if isinstance(collection, list) and not isinstance(key, Decimal):
        raise FunctionError("key for tuple must be number")
    if isinstance(collection, list) and 0 <= _int(key) < len(collection):
        return collection[_int(key)]
    raise FunctionError("invalid index")


def _length(collection: Any) -> Decimal:
    if isinstance(collection, dict):
        raise NotImplementedError("length of a map or an object (cty refuses an object's)")
    if not isinstance(collection, list):
        raise FunctionError("collection must be a list, a map or a tuple")
    return Decimal(len(collection))


def _coalesce(*args: Any) -> Any:
    """The first non-null argument, converted to the arguments' unified type (a string if any is one)."""
    for arg in args:
        if arg is not None:
            strings = any(isinstance(a, str) for a in args)
            return to_string(arg) if strings and isinstance(arg, (Decimal, bool)) else arg
    raise FunctionError("no non-null arguments")


def _range(*args: Any) -> list[Decimal]:
    if not 1 <= len(args) <= 3:
        raise FunctionError("must have one, two, or three arguments")
    nums = [to_number(a) for a in args]
    start, end, step = (
        (Decimal(0), nums[0], Decimal(1))
        if len(nums) == 1
        else (nums[0], nums[1], nums[2] if len(nums) == 3 else Decimal(1 if nums[1] >= nums[0] else -1))
    )
    if step == 0:
        raise FunctionError("step must not be zero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise FunctionError("step must be " + ("positive" if end > start else "negative") + " for a " + ("increasing" if end > start else "decreasing") + " range")  # fmt: skip
    out: list[Decimal] = []
    value = start
    while (value < end) if step > 0 else (value > end):
        out.append(value)
        value += step
        if len(out) > 1024:
            raise FunctionError("more than 1024 values were generated; either decrease the difference between start and end or use a smaller step")  # fmt: skip
    return out


def _replace(text: Any, old: Any, new: Any) -> str:
    return to_string(text).replace(to_string(old), to_string(new))


def _substr(text: Any, offset: Any, length: Any) -> str:
    s, off, n = to_string(text), _int(offset), _int(length)
    if off < 0:
        off = max(len(s) + off, 0)
    if off > len(s):
        return ""
    return s[off:] if n < 0 else s[off : off + n]


def _flatten(lst: Any) -> list[Any]:
    out: list[Any] = []
    for item in _seq(lst):
        out.extend(_flatten(item) if isinstance(item, list) else [item])
    return out


def _distinct(lst: Any) -> list[Any]:
    out: list[Any] = []
    for item in _seq(lst):
        if not any(equal(item, seen) for seen in out):
            out.append(item)
    return out


def _minmax(pick: Callable[..., Decimal]) -> Callable[..., Decimal]:
    def call(*args: Any) -> Decimal:
        if not args:
            raise FunctionError("must pass at least one number")
        return pick(to_number(a) for a in args)

    return call


def _merge(*maps: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        out.update(_map(m) if m is not None else {})
    return out


def _sorted_keys(m: Any) -> list[str]:
    return sorted(_map(m))


def _file(base: Path) -> Callable[[Any], str]:
    def read(path: Any) -> str:
        target = base / Path(to_string(path)).expanduser()
        try:
            return target.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise FunctionError(f"contents of {to_string(path)} are not valid UTF-8; use the filebase64 function to obtain the Base64 encoded contents or the other file functions (e.g. filemd5, filesha256) to obtain file hashing results instead") from None  # fmt: skip
        except OSError:
            raise FunctionError(f"no file exists at {target}; this function works only with files that are distributed as part of the configuration source code, so if this file will be created by a resource in this configuration you must instead obtain this result from an attribute of that resource") from None  # fmt: skip

    return read


def _digest(name: str) -> Callable[[Any], str]:
    return lambda s: hashlib.new(name, to_string(s).encode()).hexdigest()


def functions(base_dir: Path) -> dict[str, Callable[..., Any]]:
    """The implemented functions, by name; ``base_dir`` is where ``file`` reads from."""
    return {
        "abs": lambda n: abs(to_number(n)),
        "ceil": lambda n: to_number(n).to_integral_value(ROUND_CEILING),
        "floor": lambda n: to_number(n).to_integral_value(ROUND_FLOOR),
        "signum": lambda n: Decimal((to_number(n) > 0) - (to_number(n) < 0)),
        "pow": lambda a, b: Decimal(repr(math.pow(float(to_number(a)), float(to_number(b))))),
        "min": _minmax(min),
        "max": _minmax(max),
        "parseint": lambda s, b: Decimal(int(to_string(s), _int(b))),
        "format": _format,
        "formatlist": lambda spec, *lists: [_format(spec, *row) for row in zip(*(_seq(x) for x in lists), strict=True)],
        "join": _join,
        "split": lambda sep, s: to_string(s).split(to_string(sep)) if to_string(sep) else list(to_string(s)),
        "lower": lambda s: to_string(s).lower(),
        "upper": lambda s: to_string(s).upper(),
        "title": lambda s: re.sub(r"\b\w", lambda m: m.group(0).upper(), to_string(s)),
        "strlen": lambda s: Decimal(len(to_string(s))),
        "strrev": lambda s: to_string(s)[::-1],
        "replace": _replace,
        "substr": _substr,
        "chomp": lambda s: re.sub(r"(?:\r\n|\r|\n)+$", "", to_string(s)),
        "trimspace": lambda s: to_string(s).strip(" \t\n\r\v\f\x85\xa0"),
        "trim": lambda s, cut: to_string(s).strip(to_string(cut)),
        "trimprefix": lambda s, p: to_string(s).removeprefix(to_string(p)),
        "trimsuffix": lambda s, p: to_string(s).removesuffix(to_string(p)),
        "indent": lambda n, s: to_string(s).replace("\n", "\n" + " " * _int(n)),
        "concat": lambda *lists: [v for lst in lists for v in _seq(lst)],
        "length": _length,
        "lookup": _lookup,
        "merge": _merge,
        "element": _element,
        "contains": lambda lst, v: _position(lst, v) >= 0,
        "index": _index,  # stdlib.IndexFunc: the element at a key
        "coalesce": _coalesce,
        "coalescelist": lambda *lists: next((x for x in lists if _seq(x)), []),
        "compact": lambda lst: [to_string(v) for v in _seq(lst) if v is not None and v != ""],
        "range": _range,
        "reverse": lambda s: to_string(s)[::-1],  # jobspec2 names stdlib.ReverseFunc (strings) so
        "keys": _sorted_keys,
        "values": lambda m: [_map(m)[k] for k in _sorted_keys(m)],
        "zipmap": lambda ks, vs: dict(zip((to_string(k) for k in _seq(ks)), _seq(vs), strict=True)),
        "flatten": _flatten,
        "distinct": _distinct,
        "slice": lambda lst, a, b: _seq(lst)[_int(a) : _int(b)],
        "chunklist": lambda lst, n: [_seq(lst)[i : i + _int(n)] for i in range(0, len(_seq(lst)), _int(n) or 1)],
        "jsonencode": lambda v: json.dumps(_json(v), separators=(",", ":"), ensure_ascii=False, sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"),
        "jsondecode": lambda s: _from_json(json.loads(to_string(s))),
        "file": _file(base_dir),
        "base64encode": lambda s: base64.b64encode(to_string(s).encode()).decode(),
        "base64decode": lambda s: base64.b64decode(to_string(s), validate=True).decode(),
        **{n: _digest(n) for n in ("md5", "sha1", "sha256", "sha512")},
    }  # fmt: skip
