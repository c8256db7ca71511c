"""shardkit.transforms.rng.seeded: every generator a transform may draw from, seeded per sample and
restored; random and numpy on the main thread only (a loader thread runs beside the user's loop)."""

from __future__ import annotations

import random
import threading

import numpy as np
import torch

from shardkit.transforms.rng import seeded


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.random()), float(torch.rand(()))


def test_the_same_seed_draws_the_same_numbers_and_the_callers_draws_go_on() -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    expected = _draws()
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    with seeded(np.int64(7)):  # numpy's integers too
        first = _draws()
    with seeded(7):
        assert _draws() == first
    with seeded(8):
        assert all(a != b for a, b in zip(_draws(), first, strict=True))
    assert _draws() == expected  # as if no sample had drawn


def test_on_another_thread_only_torchs_generator_is_seeded() -> None:
    """A loader thread that builds batches beside the training loop must not reseed and roll back
    the loop's random and numpy draws."""
    random.seed(2)
    np.random.seed(2)
    before = random.getstate(), np.random.get_state(legacy=False)["state"]["key"].copy()
    got: list[float] = []
    untouched: list[bool] = []

    def on_a_thread() -> None:
        with seeded(7):
            got.append(float(torch.rand(())))
            untouched.append(random.getstate() == before[0]
                             and bool((np.random.get_state(legacy=False)["state"]["key"] == before[1]).all()))

    thread = threading.Thread(target=on_a_thread)
    thread.start()
    thread.join()
    assert untouched == [True]
    with seeded(7):
        assert got == [float(torch.rand(()))]
