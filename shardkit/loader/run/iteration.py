"""What ``iter(loader)`` returns: one iteration's batches, with ``len()`` as a ``DataLoader``
iterator has, and, once an error ended it, that error named again at the next ``next()`` instead
of a ``StopIteration`` that would look like the end of the epoch."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterator
from typing import Any

from shardkit.errors import LoaderError

__all__ = ["Iteration"]


class Iteration(Iterator[Any]):
    """The batches of ``batches`` (the loader's generator for one epoch); ``length``: what
    ``len()`` says (the loader's batches per epoch, as ``len(iter(dataloader))``), or a function
    giving it when asked.

    Example:
        >>> def broken():
        ...     yield 1
        ...     raise ValueError("a transform broke")
        >>> it = Iteration(broken(), 2)
        >>> next(it), len(it)
        (1, 2)
        >>> next(it)
        Traceback (most recent call last):
        ...
        ValueError: a transform broke
        >>> next(it)
        Traceback (most recent call last):
        ...
        shardkit.errors.LoaderError: this iteration already ended with an error (ValueError: a transform broke); ...
    """

    def __init__(self, batches: Generator[Any, None, None], length: int | Callable[[], int]) -> None:
        self._batches, self._length = batches, length
        self._ended_by: str | None = None

    def __iter__(self) -> Iteration:
        return self

    def __next__(self) -> Any:
        if self._ended_by is not None:
            raise LoaderError(f"this iteration already ended with an error ({self._ended_by}); a new iter(loader) "
                              "begins another: the next epoch, or where set_epoch or load_state_dict say")
        try:
            return next(self._batches)
        except StopIteration:
            raise
        except BaseException as err:  # KeyboardInterrupt too
            # only where it ended the generator: not a Ctrl-C after its yield, nor a second
            # thread's "generator already executing"
            if inspect.getgeneratorstate(self._batches) == inspect.GEN_CLOSED:
                text = " ".join(str(err).split())
                self._ended_by = f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__
            raise

    def __len__(self) -> int:
        return self._length if isinstance(self._length, int) else self._length()

    def close(self) -> None:
        """End the iteration now (its workers stay for the next one, as after a ``break``)."""
        self._batches.close()
