"""What a captioned sample gives besides its image: its caption (the ``txt`` member) and the extra
fields asked for (from its ``json`` member), and how a batch of them is put together.

A route's worker half calls :meth:`CaptionTargets.read` per sample (a :class:`BadSample` when the
caption is missing or not UTF-8, or the ``json`` is malformed: replaced or raised by the loader's
``on_error`` policy like a corrupt image) and :meth:`CaptionTargets.collate` once per batch, in the
worker, where the optional ``text_transform`` (e.g. a tokenizer) runs on the batch's captions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkit.errors import LoaderError
from shardkit.format.bounded import parse_json
from shardkit.loader.read.bad_samples import BadSample
from shardkit.loader.read.samples import Sample
from shardkit.loader.read.user_errors import blame

__all__ = ["CaptionTargets", "TextTransform"]

TextTransform = Callable[[list[str]], Any]
"""Called in the workers with a batch's captions, in order; what it returns is the batch's text
(e.g. a tokenizer's tensor of token ids)."""

#: The caption's name in a batch's dict when extra fields are asked for.
TEXT = "text"

log = logging.getLogger("shardkit.loader")



class _Absent:
    """A field a sample's json does not have, told apart from one whose value is null (both are
    None in the batch)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


#: Samples without a field, none with it, before it is said to be missing (fewer where a worker
#: reads fewer an epoch: :attr:`CaptionTargets.absent_after`).
ABSENT_SAID_AFTER = 64


@dataclass(frozen=True)
class CaptionTargets:
    """The text side of captioned batches: ``fields`` (names of ``json`` fields to deliver) and
    ``text_transform`` (applied to each batch's captions in the workers). Picklable when
    ``text_transform`` is.

    Example:
        >>> targets = CaptionTargets(fields=("url",))
        >>> item = targets.read(Sample("k", {"txt": b"a cat", "json": b'{"url": "u"}'}, "s.tar:k"))
        >>> targets.collate([item, item])
        {'text': ['a cat', 'a cat'], 'url': ['u', 'u']}
    """

    fields: tuple[str, ...] = ()
    text_transform: TextTransform | None = None
    #: samples read without a field asked for, none with it, before the field is said to be
    #: missing: :data:`ABSENT_SAID_AFTER`, or what one worker reads of an epoch where that is fewer
    absent_after: int = field(default=ABSENT_SAID_AFTER, compare=False)
    #: json field names read by this process while a field asked for was not yet found (at most
    #: :data:`_KEYS_KEPT`; ``None`` among them: a sample with a json member): the warning about a
    #: missing field names them.
    _seen: set[str | None] = field(default_factory=set, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if TEXT in self.fields:
            raise ValueError(f"fields may not include {TEXT!r}: the caption is delivered under that name")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError(f"fields names a field twice: {list(self.fields)}")

    def read(self, sample: Sample) -> tuple[str, tuple[Any, ...]]:
        """``(caption, values of the fields asked for)`` of one sample; a field its ``json`` lacks
        (or a sample without ``json``, as adopted shards may be) gives :data:`ABSENT` (``None`` in
        the batch: :meth:`collate`).

        Raises:
            BadSample: no ``txt`` member, a caption that is not UTF-8, or (when fields are asked
                for) a ``json`` member that is not a JSON object.
        """
        raw = sample.fields.get("txt")
        if raw is None:
            raise BadSample(f"{sample.where}: txt member (the caption) missing")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadSample(f"{sample.where}: caption is not UTF-8 ({err.reason} at byte {err.start})") from err
        if not self.fields:
            return text, ()
        meta: Any = {}
        if "json" in sample.fields:
            try:
                meta = parse_json(sample.fields["json"])
            except ValueError as err:
                raise BadSample(f"{sample.where}: json member malformed ({err})") from err
            if not isinstance(meta, dict):
                raise BadSample(f"{sample.where}: json member is not a JSON object")
            if len(self._seen) <= _KEYS_KEPT and any(_absent.get(name, 0) >= 0 for name in self.fields):
                self._seen.update([None, *list(meta)[:_KEYS_KEPT + 1 - len(self._seen)]])
        return text, tuple(meta.get(name, ABSENT) for name in self.fields)

    @staticmethod
    def take(text: Any, rows: Sequence[int]) -> Any:
        """A collated batch text with its rows in the order ``rows`` (a batch whose undecodable
        images were replaced on the device: each row's text follows its image). Lists, tuples,
        tensors and numpy arrays (first dimension), and those in a dict, are taken row by row;
        anything else (a number in a dict: a value of the whole batch) is kept as it is.

        >>> CaptionTargets.take({"text": ["a", "b", "c"], "url": [1, 2, 3], "n": 3}, [0, 2, 2])
        {'text': ['a', 'c', 'c'], 'url': [1, 3, 3], 'n': 3}
        """
        if isinstance(text, dict):
            return {k: CaptionTargets.take(v, rows) for k, v in text.items()}
        if isinstance(text, (list, tuple)):
            return type(text)(text[i] for i in rows)
        if getattr(text, "ndim", 0) >= 1 and hasattr(text, "__getitem__"):  # a tensor or an array
            return text[list(rows)]
        return text

    def collate(self, items: Sequence[tuple[str, tuple[Any, ...]]], where: str = "") -> Any:
        """A batch's text: the captions (a list, or what ``text_transform`` makes of them); with
        ``fields``, a dict of it under ``"text"`` and a list of values per field. ``where``: the
        batch's first sample, named by errors of ``text_transform`` and by its refusal of a
        result with another number of rows than the batch has captions.

        Raises:
            LoaderError: ``text_transform`` returned None, or a list, tensor or array (or a dict of
                them) whose rows are not one per caption.
        """
        texts = [text for text, _ in items]
        if self.text_transform is None:
            out: Any = texts
        else:
            try:
                out = self.text_transform(texts)
            except Exception as err:
                blame(err, where, what="the text_transform on the batch that starts with")
                raise
            _check_rows(out, len(texts), where)
        if not self.fields:
            return out
        _say_if_absent(self.fields, items, self._seen, self.absent_after)
        return {TEXT: out, **{name: [None if values[i] is ABSENT else values[i] for _, values in items]
                              for i, name in enumerate(self.fields)}}


def _check_rows(out: Any, n: int, where: str, name: str = "") -> None:
    """Refuse a ``text_transform`` result of None (a function that forgot its ``return``), one
    given as a list (or a mapping of lists) whose items are not one per caption, and a tensor or
    array returned alone of which no dimension is one per caption, which cannot line up with the
    batch's images (a tokenizer's output cut to one row: ``zeros(1, L)`` for 4 captions).
    Otherwise a tensor's layout is the transform's own (batch-first or sequence-first; in a
    mapping, also flat tokens beside offsets, or a tokenizer's overflow rows beside their mapping
    to captions), and tuples are left alone (a pair of parts)."""
    if out is None and not name:
        raise LoaderError(f"text_transform returned None for a batch of {n} captions (a function without a "
                          "return?); it returns the batch's text: token ids, a dict of them, or a list", where=where)
    if isinstance(out, Mapping):
        for key, value in out.items():
            _check_rows(value, n, where, f"[{key!r}]")
    elif isinstance(out, list) and len(out) != n:
        raise LoaderError(f"text_transform returned a list of {len(out)}{' in ' + name if name else ''} for a batch "
                          f"of {n} captions: a list must give one item per caption, in order", where=where)
    elif not name and _is_array(out) and n > 1 and n not in tuple(out.shape):
        raise LoaderError(f"text_transform returned a tensor of shape {tuple(out.shape)} for a batch of {n} "
                          f"captions: no dimension is one per caption (batch-first [{n}, L] or sequence-first "
                          f"[L, {n}] lines up with the images)", where=where)


def _is_array(value: Any) -> bool:
    """A tensor or an array (anything with a ``shape`` tuple of ints and ``dtype``)."""
    shape = getattr(value, "shape", None)
    return hasattr(value, "dtype") and isinstance(shape, tuple)  # torch.Size is a tuple


#: Per field asked for, in this process: samples read without it, or -1 once one had it or it was said.
_absent: dict[str, int] = {}
#: The json field names a missing field's warning names, at most.
_KEYS_KEPT = 40


def _say_if_absent(fields: Sequence[str], items: Sequence[tuple[str, tuple[Any, ...]]],
                   seen: set[str | None], after: int = ABSENT_SAID_AFTER) -> None:
    """Warn once per process of a field that none of the first ``after`` samples has in its json
    at all (a misspelt name, most likely; a field whose value is null is there, and a sparse one
    shows up among them)."""
    for i, name in enumerate(fields):
        count = _absent.get(name, 0)
        if count < 0:
            continue
        if any(values[i] is not ABSENT for _, values in items):
            _absent[name] = -1
            continue
        _absent[name] = count + len(items)
        if _absent[name] >= after:
            _absent[name] = -1
            there = sorted(k for k in seen if k is not None)[:_KEYS_KEPT]
            log.warning("shardkit: none of %d samples has the field %r in its json (misspelt? %s); its values are None",
                        count + len(items), name,
                        f"their json has {', '.join(map(repr, there))}" if there
                        else "their json has no fields" if None in seen else "they have no json member")
