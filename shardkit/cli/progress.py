"""Progress bars of the commands: tqdm on stderr when it is a terminal and not ``-q``, else nothing.

Every bar has a total, so tqdm shows a rate and an ETA. Code never tests a tqdm object for
truth (``if bar:``): a tqdm without a total raises on ``bool()``; :class:`Bar` holds ``None``
when disabled and checks ``is not None``.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any

#: Size used for a side the terminal reports as 0 (a pty nobody sized: ``script`` without a
#: terminal, some CI runners that set only the width, ``docker exec -t`` before its first
#: resize). tqdm draws nothing with 0 columns or 0 rows.
_FALLBACK_COLUMNS, _FALLBACK_ROWS = 80, 24


def _terminal_size() -> tuple[int, int]:
    """Columns and rows of the terminal on stderr (0 where unknown)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        return 0, 0
    return size.columns, size.lines


def bars_enabled(quiet: bool) -> bool:
    """Whether to draw progress: only for a person watching (stderr is a terminal) and not
    ``-q``."""
    return not quiet and sys.stderr.isatty()


#: A bar of bytes, in the binary units of the summaries (``1.5 MiB``; tqdm writes ``1.57MB``).
BYTES_FORMAT = ("{l_bar}{bar}| {bytes_n}/{bytes_total} [{elapsed}<{remaining}, {bytes_rate}/s{postfix}]")


def _bytes_tqdm() -> Any:
    """tqdm, its byte counts and rate as :func:`~shardkit.cli.report.human_bytes` writes them (the
    ``bytes_*`` fields of :data:`BYTES_FORMAT`)."""
    from tqdm import tqdm

    from shardkit.cli.report import human_bytes

    class BytesTqdm(tqdm):
        @property
        def format_dict(self) -> dict[str, Any]:
            d: dict[str, Any] = super().format_dict
            rate = d.get("rate")
            if rate is None and d.get("elapsed"):
                rate = d["n"] / d["elapsed"]
            d.update(bytes_n=human_bytes(d["n"]), bytes_total="?" if d.get("total") is None
                     else human_bytes(d["total"]), bytes_rate="?" if not rate else human_bytes(rate))
            return d

    return BytesTqdm


class Bar:
    """One tqdm bar on stderr, or a no-op when ``enabled`` is false.

    Example::

        with Bar(bars_enabled(quiet), desc="verifying", total=nbytes, unit="B") as bar:
            bar.update(4096)
    """

    def __init__(self, enabled: bool, *, desc: str, total: int | None, unit: str = "it") -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            in_bytes = unit == "B"
            columns, rows = _terminal_size()
            kind: Any = _bytes_tqdm() if in_bytes else tqdm
            self._bar = kind(total=total, desc=desc, unit=unit, unit_scale=in_bytes,
                             unit_divisor=1024 if in_bytes else 1000, dynamic_ncols=columns > 0 and rows > 0,
                             ncols=columns or _FALLBACK_COLUMNS, nrows=rows or _FALLBACK_ROWS, leave=False,
                             file=sys.stderr, **({"bar_format": BYTES_FORMAT} if in_bytes else {}))

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def note(self, text: str) -> None:
        """Show ``text`` after the bar (e.g. ``"3/9 shards"``)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class PackBar:
    """:class:`shardkit.pack.PackProgress` drawn as a bar of input bytes with an image count,
    after a ``listing SRC …`` line while the source is listed (a bucket or a network file
    system can take a while, and a silent terminal looks hung). A source whose samples have no
    file size to go by (a caption table's rows, a saved Hugging Face dataset: 0 input bytes) gets
    a bar of images instead, with the image count as its total."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = Bar(False, desc="", total=None)
        self.total = self.done = 0
        self.in_bytes = True
        self._status = False

    def listing(self, src: str) -> None:
        """Show ``listing SRC …`` until the bar starts (or the command ends)."""
        if self.enabled:
            sys.stderr.write(f"listing {src} …")
            sys.stderr.flush()
            self._status = True

    def clear_status(self) -> None:
        """Erase the ``listing SRC …`` status, if shown, so that a line can be printed in its place."""
        if self._status:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self._status = False

    def start(self, samples: int, nbytes: int) -> None:
        self.clear_status()
        self.bar.close()
        self.in_bytes = nbytes > 0 or samples == 0
        self.total, self.done = samples, 0
        if self.in_bytes:
            self.bar = Bar(self.enabled, desc="packing", total=nbytes, unit="B")
            self.bar.note(f"0/{samples:,} images")
        else:
            self.bar = Bar(self.enabled, desc="packing", total=samples, unit="img")

    def advance(self, samples: int, nbytes: int) -> None:
        self.done += samples
        if self.in_bytes:
            self.bar.note(f"{self.done:,}/{self.total:,} images")
            self.bar.update(nbytes)
        else:
            self.bar.update(samples)

    def close(self) -> None:
        self.clear_status()
        self.bar.close()


class BenchBar:
    """``shardkit.bench``'s progress sink: one bar per phase (packing, timing)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = Bar(False, desc="", total=None)

    def begin(self, what: str, total: int | None) -> None:
        self.bar.close()
        self.bar = Bar(self.enabled, desc=what, total=total,
                       unit="img" if what == "packing" else "batch")

    def advance(self, n: int) -> None:
        self.bar.update(n)

    def describe(self, text: str) -> None:
        self.bar.describe(text)

    def close(self) -> None:
        self.bar.close()
