"""The service client's window, order and fault handling, on a stand-in for Ray in this process
(:mod:`tests.loader.service.fakeray`): whatever worker builds a batch, and whichever dies, the loader
delivers the batches of local workers, each once, with at most ``in_flight`` asked for ahead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shardkit import LoaderError, RayService, ShardLoader, transforms
from shardkit.loader.service import client
from tests.loader.service.fakeray import FakeRay

SERVICE = RayService("10.0.0.5:6379", workers=3, in_flight=4)


@pytest.fixture
def ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    fake = FakeRay()
    monkeypatch.setattr(client, "connect", lambda address, timeout: fake)
    return fake


def _loader(dataset: Path, **kwargs: Any) -> ShardLoader:
    return ShardLoader(str(dataset), batch_size=8, transform=transforms.imagenet_train(16), seed=3, keys=True,
                       **kwargs)


@pytest.fixture(scope="module")
def local(packed: Path) -> list[list[tuple[Any, ...]]]:
    """Epochs 0 and 1 of the same loader in this process (its batches are those of any number of workers)."""
    with _loader(packed) as made:
        out = []
        for epoch in range(2):
            made.set_epoch(epoch)
            out.append(list(made))
        return out


def _same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for (x1, y1, k1), (x2, y2, k2) in zip(got, want, strict=True):
        assert k1 == k2 and torch.equal(x1, x2) and torch.equal(y1, y2)


def _epochs(loader: ShardLoader, epochs: int = 2) -> list[list[tuple[Any, ...]]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append(list(loader))
    return out


def test_batches_come_in_order_with_at_most_in_flight_asked_ahead(ray: FakeRay, packed: Path,
                                                                  local: list[list[Any]]) -> None:
    with _loader(packed, service=SERVICE) as served:
        got = _epochs(served)
        assert served.service is not None and served.service.restarts == 0
        assert sum(served.service.nodes.values()) == 18 and len(served.service.nodes) == 3
    for g, w in zip(got, local, strict=True):
        _same(g, w)
    assert ray.most_outstanding == 4
    assert ray.options["scheduling_strategy"] == "SPREAD" and ray.options["max_restarts"] == 0
    assert all(a.dead for a in ray.actors), "close() stops every worker"


def test_a_worker_that_dies_owing_batches_loses_none(ray: FakeRay, packed: Path, local: list[list[Any]]) -> None:
    ray.plans = [{"builds_left": 1}]  # the first worker dies after one batch, owing the others it was given
    with _loader(packed, service=SERVICE) as served:
        got = _epochs(served)
        assert served.service is not None and served.service.restarts == 1
        assert len(served.service.workers) == 3, "a replacement took its place"
    for g, w in zip(got, local, strict=True):
        _same(g, w)
    assert ray.actors[0].built == 1 and len(ray.actors) == 4


def test_a_stalled_worker_counts_as_lost(ray: FakeRay, packed: Path, local: list[list[Any]]) -> None:
    ray.plans = [{}, {"stalls": True}]
    with _loader(packed, service=SERVICE) as served:
        got = _epochs(served, 1)
        assert served.service is not None and served.service.restarts == 1
    _same(got[0], local[0])


def test_workers_that_keep_dying_end_the_epoch_naming_the_batch(ray: FakeRay, packed: Path) -> None:
    ray.plans = [{"builds_left": 0}] * 20
    with _loader(packed, service=RayService(workers=1, retries=2)) as served, \
            pytest.raises(LoaderError) as err:
        list(served)
    assert str(err.value) == ("batch 0 of epoch 0 was lost with its service worker 3 times "
                              "(last: ActorDiedError: actor 2 died); retries=2")


def test_no_worker_left_and_none_placed_is_an_error(ray: FakeRay, packed: Path) -> None:
    ray.plans = [{"builds_left": 0}, {"placed": False}]
    with _loader(packed, service=RayService(workers=1, start_timeout_s=0.1)) as served, \
            pytest.raises(LoaderError, match="every service worker was lost and none could be restarted within 0.1 s"):
        list(served)


def test_an_error_in_the_transform_is_raised_not_retried(ray: FakeRay, packed: Path) -> None:
    def broken(image: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad crop")

    with ShardLoader(str(packed), batch_size=8, transform=broken, service=SERVICE) as served, \
            pytest.raises(LoaderError) as err:
        list(served)
    assert str(err.value) == "a service worker failed building batch 0 of epoch 0 (ValueError: bad crop)"
    assert all(a.built == 0 for a in ray.actors) and len(ray.actors) == 3


def test_workers_that_cannot_start_are_named_when_the_loader_is_built(ray: FakeRay, packed: Path) -> None:
    ray.plans = [{"placed": False}]
    with pytest.raises(LoaderError) as err:
        _loader(packed, service=RayService(workers=2, start_timeout_s=0.1))
    assert str(err.value).startswith("1 of 2 service workers started within 0.1 s: the cluster has too few free CPUs")
    assert all(a.dead for a in ray.actors), "the ones started are stopped again"


def test_a_cluster_too_small_is_refused_before_any_worker_starts(ray: FakeRay, packed: Path) -> None:
    ray.cpus = 2
    with pytest.raises(LoaderError) as err:
        _loader(packed, service=SERVICE)
    assert str(err.value) == ("RayService(workers=3) needs 3 CPUs, the cluster at 10.0.0.5:6379 has 2 CPUs: "
                              "add nodes or ask for fewer workers")
    assert not ray.actors


def test_resume_mid_epoch_gives_exactly_the_remaining_batches(ray: FakeRay, packed: Path,
                                                              local: list[list[Any]]) -> None:
    with _loader(packed, service=SERVICE) as served:
        served.set_epoch(1)
        taken = [b for _, b in zip(range(3), served, strict=False)]
        state = served.state_dict()
    assert ray.cancelled > 0, "the batches asked for and not taken are cancelled"
    with _loader(packed, service=SERVICE) as resumed:
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        rest = list(resumed)
    _same(taken + rest, local[1])
    with _loader(packed, num_workers=2) as workers:  # a state saved with a service resumes with local workers
        workers.load_state_dict(state)
        workers.set_epoch(1)
        _same(list(workers), local[1][3:])


def test_read_ahead_carries_the_window_into_the_next_epoch(ray: FakeRay, packed: Path,
                                                          local: list[list[Any]]) -> None:
    with _loader(packed, service=SERVICE) as served:
        served.set_epoch(0)
        _same(list(served), local[0])
        assert len(ray.outstanding) == 3, "epoch 1's first batches are asked for as epoch 0 ends"
        served.set_epoch(1)
        _same(list(served), local[1])
        assert sum(a.built for a in ray.actors) == 18 and ray.cancelled == 0, "taken over, none built twice"
        served.set_epoch(5)  # not the epoch read ahead: its batches are cancelled
        assert len(list(served)) == 9 and ray.cancelled == 3
    assert ray.most_outstanding == 4


def test_without_read_ahead_an_epoch_asks_for_its_own_batches_only(ray: FakeRay, packed: Path) -> None:
    with _loader(packed, service=SERVICE, read_ahead=False) as served:
        assert len(list(served)) == 9 and not ray.outstanding


def test_a_rank_of_several_gets_its_own_share(ray: FakeRay, packed: Path) -> None:
    layout = {"rank": 1, "world_size": 2, "drop_last": True}
    with _loader(packed, service=SERVICE, **layout) as served, _loader(packed, num_workers=2, **layout) as workers:
        _same(list(served), list(workers))


def test_an_elastic_resume_continues_with_the_remainder(ray: FakeRay, packed: Path) -> None:
    with _loader(packed, num_workers=2) as before:  # saved by local workers, batch size 8
        taken = [b for _, b in zip(range(3), before, strict=False)]
        state = before.state_dict()
    assert len(taken) == 3
    resumed = {}
    for name, kwargs in (("service", {"service": SERVICE}), ("workers", {"num_workers": 2})):
        with ShardLoader(str(packed), batch_size=5, transform=transforms.imagenet_train(16), seed=3, keys=True,
                         **kwargs) as loader:
            loader.load_state_dict(state)
            resumed[name] = list(loader)
    assert sum(len(b[2]) for b in resumed["service"]) == 69 - 3 * 8
    _same(resumed["service"], resumed["workers"])
