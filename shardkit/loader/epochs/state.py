"""Resume state of a loader: a tiny, versioned, JSON-able record and its compatibility check.

The state is the same on every rank (rank is not part of it), so rank 0 alone may save it.
``batches_consumed`` counts batches each rank has delivered in ``epoch``; resuming means
``worker_batch_indices(..., start_batch=batches_consumed)`` on the same epoch plan.

With ``even_batches=False`` ranks hold different batch counts (by one at most) and go in lock
step while they all have batches, so ``batches_consumed`` counts the steps of the epoch: rank
``r`` resumes at ``min(batches_consumed, its batch count)`` (see :meth:`LoaderState.resume_at`).
A rank whose shorter share is finished reports the next epoch; take the state at a step, or
after every rank has finished the epoch (after the all-reduce of the metrics, say).
Every state has every key (``torch.distributed.checkpoint`` loads into a fresh loader's keys):
``even_batches``, ``mix`` (a loader over several datasets, see :mod:`~shardkit.loader.epochs.mix`;
else None) and ``remainder`` (after an elastic resume; else None) too. A state without these three,
as the loader wrote them before, still loads with their defaults.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardkit.errors import LoaderError
from shardkit.loader.epochs.plan import num_batches
from shardkit.loader.epochs.remainder import Remainder

#: Version 2: states of plan version 2 (:data:`~shardkit.loader.epochs.plan.PLAN_VERSION`); a version-1
#: state points into plan version 1's orders, which this shardkit no longer draws.
STATE_VERSION = 2
_WHERE = "loader state"
_BOOLS = frozenset({"drop_last", "shuffle", "even_batches"})
_OPTIONAL: dict[str, Any] = {"even_batches": True, "remainder": None, "mix": None,  # keys a state may omit
                             "dataset": None}
_MIX_KEYS = ("num_samples", "quota", "shards_digest")
_PROGRESS = frozenset({"version", "epoch", "batches_consumed", "remainder"})
#: Compared by :func:`check_dataset`, not :func:`check_compatible` (a state may predate it).
_IDENTITY = frozenset({"dataset"})
#: Every count and the epoch stay below this: they travel in int64 tensors, and the epoch after the
#: state's (``epoch + 1``) must fit too. A seed may use all 64 bits (see :mod:`~shardkit.loader.epochs.seeds`).
MAX_INT = (1 << 63) - 1
_MAX_SEED = 1 << 64
#: The most ranks a state may name: an elastic resume walks the state's ranks, so a state claiming
#: 10**7 of them must be refused, not walked.
MAX_WORLD_SIZE = 1 << 20
#: The layout of an epoch over ranks: a state resumes under another one (elastic resume).
LAYOUT = frozenset({"world_size", "batch_size", "drop_last", "even_batches"})
_MINIMUM = {
    "seed": 0,
    "epoch": 0,
    "batches_consumed": 0,
    "num_samples": 1,
    "world_size": 1,
    "batch_size": 1,
    "window": 1,
}


_IDENTITY_RE = re.compile(r"[0-9a-f]{16}")


def dataset_identity(fingerprints: Sequence[str]) -> str:
    """The identity a state is bound to: a fingerprint of every shard's sha256, from each
    dataset's fingerprint of its hashes (one per dataset of a mix, in order;
    :attr:`shardkit.index.ShardTable.fingerprint`). Two datasets with equal shard sizes but
    other contents have different identities, so a state saved on one is refused by the other.

    >>> dataset_identity(["a" * 64]) != dataset_identity(["b" * 64])
    True
    """
    return hashlib.sha256("\n".join(fingerprints).encode()).hexdigest()[:16]


def shards_digest(shard_sizes: Sequence[int] | np.ndarray) -> str:
    """A short fingerprint of the shard layout (sizes, in manifest order) for :class:`LoaderState`.

    >>> shards_digest([3, 2]) == shards_digest([3, 2]) != shards_digest([2, 3])
    True
    """
    text = ",".join(map(str, np.asarray(shard_sizes).reshape(-1).tolist()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderState:
    """Where a loader stands: progress (``epoch``, ``batches_consumed``) plus the configuration
    the epoch plan depends on, so a resume with a different plan is refused, not silently wrong.

    Construction validates types and ranges (numpy ints/bools are converted to Python ones) and
    raises LoaderError. ``batches_consumed == num_batches`` means the epoch is complete.

    >>> s = LoaderState(seed=0, epoch=1, batches_consumed=2, num_samples=100,
    ...                 shards_digest=shards_digest([50, 50]), world_size=2, batch_size=8,
    ...                 drop_last=True, shuffle=True, window=8)
    >>> LoaderState.from_dict(s.to_dict()) == s
    True
    """

    version: int = STATE_VERSION
    seed: int
    epoch: int
    batches_consumed: int
    num_samples: int
    shards_digest: str
    world_size: int
    batch_size: int
    drop_last: bool
    shuffle: bool
    window: int
    even_batches: bool = True
    #: After an elastic resume: the epoch positions still to deliver in ``epoch`` when the state's
    #: layout started on them (``[[start, stop], ...]``, see :class:`Remainder`); None: all of them.
    remainder: list[list[int]] | None = None
    #: A loader over several datasets: per dataset (in order) ``{"num_samples", "quota",
    #: "shards_digest"}`` (see :meth:`~shardkit.loader.epochs.mix.Mix.record`); None: one dataset.
    mix: list[dict[str, Any]] | None = None
    #: The identity of the dataset (or mix) the state was saved on: :func:`dataset_identity` of its
    #: manifests (None: a state saved before states carried it; only its shard sizes are compared).
    dataset: str | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "mix":
                if value is not None:
                    value = _check_mix(value, num_samples=_as_int("num_samples", self.num_samples))
            elif f.name == "remainder":
                if value is not None:
                    value = Remainder.from_list(value, num_samples=_as_int("num_samples", self.num_samples),
                                                where=_WHERE).to_list()
            elif f.name in _BOOLS:
                if not isinstance(value, (bool, np.bool_)):
                    raise LoaderError(f"{f.name} must be a bool, got {value!r}", where=_WHERE)
                value = bool(value)
            elif f.name == "dataset":
                if value is not None and not (isinstance(value, str) and _IDENTITY_RE.fullmatch(value)):
                    raise LoaderError(f"dataset must be 16 lower-case hex digits, got {value!r}"[:200], where=_WHERE)
            elif f.name == "shards_digest":
                if not isinstance(value, str):
                    raise LoaderError(f"{f.name} must be a str, got {value!r}", where=_WHERE)
            else:
                value = _as_int(f.name, value)
            object.__setattr__(self, f.name, value)
        if self.version != STATE_VERSION:
            raise LoaderError(_version_message(self.version), where=_WHERE)
        for name, low in _MINIMUM.items():
            if getattr(self, name) < low:
                raise LoaderError(
                    f"{name} must be >= {low}, got {getattr(self, name)}", where=_WHERE
                )
            high = _MAX_SEED if name == "seed" else MAX_WORLD_SIZE + 1 if name == "world_size" else MAX_INT
            if getattr(self, name) >= high:
                raise LoaderError(f"{name} must be below {high}, got {_shown(getattr(self, name))}", where=_WHERE)
        nb = num_batches(
            self.layout_samples,
            world_size=self.world_size,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            even_batches=self.even_batches,
        )
        if self.batches_consumed > nb:
            raise LoaderError(
                f"batches_consumed {self.batches_consumed} exceeds the {nb} batches of an epoch",
                where=_WHERE,
            )

    @property
    def layout_samples(self) -> int:
        """The samples the state's layout cuts into batches: the remainder's, else the epoch's."""
        return len(Remainder(self.remainder)) if self.remainder is not None else self.num_samples

    @property
    def rest(self) -> Remainder:
        """The epoch positions not yet delivered (by every rank of the state's layout)."""
        start = Remainder(self.remainder) if self.remainder is not None else Remainder.whole(self.num_samples)
        return start.after(self.batches_consumed, world_size=self.world_size, batch_size=self.batch_size,
                           drop_last=self.drop_last, even_batches=self.even_batches)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field (``json.dumps`` works on it as is), the optional ones
        at their defaults too: the keys are the same in every state, which
        ``torch.distributed.checkpoint`` needs (it loads a checkpoint into the keys of the state a
        fresh loader gives, and drops the others: a ``remainder`` went missing in an elastic
        resume). :meth:`from_dict` still takes a state without them (an earlier shardkit's)."""
        return dataclasses.asdict(self)

    def resume_at(self, rank: int) -> tuple[int, int]:
        """``(epoch, next batch)`` where rank ``rank`` resumes: the next epoch's start once the
        epoch's steps are all done, else ``batches_consumed`` (capped at this rank's batch count
        with ``even_batches=False``, so a rank whose share is done waits out the epoch's last
        step with the others instead of running ahead into the next epoch).

        Raises LoaderError for a rank outside ``[0, world_size)``.
        """
        steps, mine = (
            num_batches(
                self.layout_samples,
                world_size=self.world_size,
                batch_size=self.batch_size,
                drop_last=self.drop_last,
                even_batches=self.even_batches,
                rank=r,
            )
            for r in (None, rank)
        )
        if self.batches_consumed >= steps:
            return self.epoch + 1, 0
        return self.epoch, min(self.batches_consumed, mine)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoaderState:
        """Rebuild a state from :meth:`to_dict` output (e.g. after ``json.loads``).

        Raises LoaderError for a non-mapping, an unknown ``version``, missing or unknown keys,
        or values of the wrong type or range.
        """
        if not isinstance(d, Mapping):
            raise LoaderError(f"expected a dict, got {type(d).__name__}", where=_WHERE)
        if "version" not in d or "batches_consumed" not in d:  # a checkpoint may hold a "version" of its own
            raise LoaderError(_not_a_state(d), where=_WHERE)
        if d["version"] != STATE_VERSION:
            raise LoaderError(_version_message(d.get("version")), where=_WHERE)
        names = {f.name for f in dataclasses.fields(cls)}
        if missing := sorted(names - d.keys() - _OPTIONAL.keys()):
            raise LoaderError(f"missing keys {missing}", where=_WHERE)
        if unknown := sorted(map(str, d.keys() - names)):
            raise LoaderError(f"unknown keys {unknown}", where=_WHERE)
        return cls(**d)


def _not_a_state(d: Mapping[Any, Any]) -> str:
    """What a mapping without a ``version`` is, for the error (a whole checkpoint, another library's state)."""
    keys = sorted(map(str, d))
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    inner = [k for k, v in d.items() if isinstance(v, Mapping) and "version" in v and "batches_consumed" in v]
    if inner:
        return (f"not a loader's state but a mapping holding one under {inner[0]!r} (keys: {shown}): "
                f"load_state_dict(checkpoint[{inner[0]!r}])")
    return (f"not a ShardLoader state ({'keys: ' + shown if keys else 'an empty dict'}); "
            "load_state_dict takes what ShardLoader.state_dict() returned")


def _version_message(version: object) -> str:
    if version == 1:
        return ("unsupported state version 1: it was saved by an older shardkit whose epoch plan "
                "(plan version 1) shuffles samples differently, so this shardkit (plan version "
                f"{STATE_VERSION}) cannot continue that epoch exactly; start the epoch afresh "
                "(set_epoch) or resume with the shardkit that saved it")
    return f"unsupported state version {version!r} (this shardkit reads version {STATE_VERSION})"


def _shown(value: int) -> str:
    """A number for an error message: itself, or its size when printing it would take long (or
    fail: Python refuses to print ints of more than 4,300 digits)."""
    return str(value) if value.bit_length() <= 128 else f"a number of {value.bit_length()} bits"


def _as_int(name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise LoaderError(f"{name} must be an int, got {value!r}", where=_WHERE)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise LoaderError(f"{name} must be an int, got {value!r}", where=_WHERE) from None


def _check_mix(value: object, *, num_samples: int) -> list[dict[str, Any]]:
    """Validate a state's ``mix``: two or more records with exactly the keys ``num_samples``,
    ``quota`` (ints >= 1, each summing to ``num_samples`` over the datasets) and ``shards_digest``
    (a str). Returns a copy with Python ints; raises LoaderError naming the flaw."""
    if not isinstance(value, list) or len(value) < 2:
        raise LoaderError(f"mix must be a list of two or more dataset records, got {value!r}"[:200], where=_WHERE)
    out: list[dict[str, Any]] = []
    for i, rec in enumerate(value):
        if not isinstance(rec, Mapping) or set(rec) != set(_MIX_KEYS):
            raise LoaderError(f"mix dataset {i} must be a dict with keys {list(_MIX_KEYS)}, got {rec!r}"[:200],
                              where=_WHERE)
        if not isinstance(rec["shards_digest"], str):
            raise LoaderError(f"mix dataset {i}: shards_digest must be a str, got {rec['shards_digest']!r}",
                              where=_WHERE)
        n, q = (_as_int(f"mix dataset {i}'s {k}", rec[k]) for k in ("num_samples", "quota"))
        if min(n, q) < 1:
            raise LoaderError(f"mix dataset {i}: num_samples and quota must be >= 1, got {n} and {q}", where=_WHERE)
        out.append({"num_samples": n, "quota": q, "shards_digest": rec["shards_digest"]})
    for key in ("num_samples", "quota"):
        if (total := sum(r[key] for r in out)) != num_samples:
            raise LoaderError(f"mix: the datasets' {key} sum to {total}, not the state's num_samples {num_samples}",
                              where=_WHERE)
    return out


def _mix_difference(saved: object, current: object) -> str:
    """Where two mixes (records, or None for one dataset) first differ, for check_compatible."""
    def shown(mix: object) -> str:
        return f"a mix of {len(mix)} datasets" if isinstance(mix, list) else "one dataset"
    if not isinstance(saved, list) or not isinstance(current, list) or len(saved) != len(current):
        return f"state has {shown(saved)}, loader has {shown(current)}"
    same_data = all(a.get(k) == b.get(k) for a, b in zip(saved, current, strict=True) for k in _MIX_KEYS
                    if k != "quota")
    for i, (a, b) in enumerate(zip(saved, current, strict=True)):
        for key in _MIX_KEYS:
            if a.get(key) != b.get(key):
                if key == "quota" and same_data:  # datasets of the same sizes: other weights, or another order
                    return (f"the weights differ: dataset {i} takes {a.get(key)!r} samples an epoch in the state, "
                            f"{b.get(key)!r} in this loader (resume with the datasets, in their order, and the "
                            "weights the state was saved with; new weights can start at an epoch: set_epoch)")
                return f"dataset {i}'s {key}: state has {a.get(key)!r}, loader has {b.get(key)!r}"
    return f"state has {saved!r}, loader has {current!r}"


def check_compatible(state: LoaderState, **current: object) -> None:
    """Refuse to resume ``state`` in a loader that plans its epochs differently.

    ``current`` must name every field the epoch's order depends on (``seed``, ``num_samples``,
    ``shards_digest``, ``shuffle``, ``window``, ``mix``) with the resuming loader's value; a missing,
    unknown or differing one raises LoaderError naming every mismatch. The layout over ranks
    (:data:`LAYOUT`: world size, batch size, ``drop_last``, ``even_batches``) may differ: that
    is an elastic resume (:meth:`LoaderState.rest`).

    >>> s = LoaderState(seed=0, epoch=0, batches_consumed=0, num_samples=10, shards_digest="x",
    ...                 world_size=1, batch_size=2, drop_last=False, shuffle=False, window=8)
    >>> check_compatible(s, seed=0, num_samples=10, shards_digest="x", shuffle=False, window=8, mix=None)
    """
    config = {f.name for f in dataclasses.fields(state)} - _PROGRESS - LAYOUT - _IDENTITY
    if unknown := sorted(current.keys() - config):
        raise LoaderError(f"not fields the order depends on: {unknown}", where=_WHERE)
    if missing := sorted(config - current.keys()):
        raise LoaderError(f"check_compatible needs {missing}", where=_WHERE)
    diffs = [
        f"mix: {_mix_difference(state.mix, current[k])}" if k == "mix"
        else f"{k}: state has {getattr(state, k)!r}, loader has {current[k]!r}"
        for k in sorted(config)
        if getattr(state, k) != current[k]
    ]
    if diffs:
        raise LoaderError(
            "cannot resume, the saved state was made for another dataset or order: " + "; ".join(diffs),
            where=_WHERE,
        )


def check_dataset(state: LoaderState, dataset: str | None) -> None:
    """Refuse ``state`` when it was saved on another dataset than the loader's (``dataset``: its
    :func:`dataset_identity`). A state without an identity (saved by an older shardkit) is
    accepted on the strength of its shard sizes, as it was then.

    >>> s = LoaderState(seed=0, epoch=0, batches_consumed=0, num_samples=10, shards_digest="x", world_size=1,
    ...                 batch_size=2, drop_last=False, shuffle=False, window=8, dataset="0123456789abcdef")
    >>> check_dataset(s, "0123456789abcdef")  # the same dataset: nothing to say
    >>> check_dataset(s, "fedcba9876543210")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardkit.errors.LoaderError: loader state: cannot resume, the saved state was made for another dataset: ...
    """
    if state.dataset is not None and dataset is not None and state.dataset != dataset:
        raise LoaderError("cannot resume, the saved state was made for another dataset: its shards' hashes differ "
                          f"(state's dataset {state.dataset}, loader's {dataset}), though their sizes agree",
                          where=_WHERE)
