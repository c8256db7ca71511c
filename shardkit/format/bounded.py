"""Bounded parsing of the small texts a shard carries: ``json`` members and ``cls`` labels.

A shard may come from anyone (``shardkit index`` adopts shards written by other tools), so its
texts are parsed with limits that hold whatever they say: JSON nested deeper than
:data:`MAX_JSON_DEPTH` levels, or with a number of more digits than Python converts, is refused
with a ``ValueError`` saying so (never a ``RecursionError``); a label is at most
:data:`MAX_LABEL_DIGITS` ASCII digits (a 5,000-digit label is not a class index). Callers catch
``ValueError`` and name the shard and sample in their own error.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Sample metadata is a few levels deep (COCO's ``segmentation`` lists are the deepest, at 4).
MAX_JSON_DEPTH = 32
#: A label below 10**18 fits a signed 64-bit tensor; more digits are not a class index.
MAX_LABEL_DIGITS = 18

_STRINGS = re.compile(rb'"[^"]*"')
_INNERMOST = re.compile(rb"\{\}|\[\]")
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')


def json_depth_over(data: bytes, limit: int) -> bool:
    """Whether the JSON text ``data`` nests arrays and objects more than ``limit`` levels deep.

    Escapes go first (``\\\\`` pairs, then ``\\"``), then everything but quotes and brackets,
    then strings (no bracket inside one counts); then one level of innermost brackets per pass.
    Every step runs in C, so the check costs a few linear passes and never recurses.

    Text whose brackets do not pair up (``{not json``) is not over the limit: it is no JSON at
    all, and ``json.loads`` says where.

    >>> json_depth_over(rb'{"a": [[1], "]]]\\"]"]}', 3), json_depth_over(b'[[[[]]]]', 3)
    (False, True)
    >>> json_depth_over(b'{not json', 3), json_depth_over(b'[' * 5, 3)
    (False, True)
    """
    plain = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = _STRINGS.sub(b"", plain.translate(None, _NOT_STRUCTURE))
    for _ in range(limit):
        if not skeleton:
            return False
        skeleton, removed = _INNERMOST.subn(b"", skeleton)
        if not removed:  # unbalanced brackets or an open string: no JSON, which the parser says better,
            # unless so many open in a row that it would recurse that deep to say it
            return re.search(rb"[\[{]{%d}" % (limit + 1), skeleton) is not None
    return bool(skeleton)


def parse_json(data: bytes | str, *, max_depth: int | None = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)``, refusing nesting deeper than ``max_depth`` (None: the parser's own
    limit) and numbers too long to convert, both as ``ValueError``.

    >>> parse_json(b'{"label": 3}')
    {'label': 3}
    >>> parse_json(b'[' * 40 + b']' * 40)
    Traceback (most recent call last):
    ...
    ValueError: nested more than 32 levels deep
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if max_depth is not None and json_depth_over(raw, max_depth):
        raise ValueError(f"nested more than {max_depth} levels deep")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def parse_label(raw: bytes) -> int:
    """The class index in a ``cls`` member: ASCII digits, surrounding whitespace allowed, at most
    :data:`MAX_LABEL_DIGITS` of them. Raises ``ValueError`` naming what is wrong.

    >>> parse_label(b" 7\\n")
    7
    >>> parse_label("²".encode())
    Traceback (most recent call last):
    ...
    ValueError: is b'\\xc2\\xb2', not a non-negative integer
    """
    text = raw.strip()
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"is {text[:20]!r}, not a non-negative integer")
    if len(text) > MAX_LABEL_DIGITS:
        raise ValueError(f"has {len(text)} digits, more than the {MAX_LABEL_DIGITS} a label may have")
    return int(text)
