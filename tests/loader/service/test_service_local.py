"""The service's parts that need no cluster: arguments, connecting (bad addresses fail in seconds, one
line), a batch on the wire, a worker's checks and builds, ``shardkit serve``'s command line.

No test here connects Ray in this process: every address refused is refused before ``ray.init``.
"""

from __future__ import annotations

import collections
import shlex
import shutil
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from shardkit import GpuOptions, LoaderError, RayService, ShardLoader, transforms
from shardkit._version import __version__
from shardkit.cli import cli
from shardkit.index.manifest_io import locate_dataset, read_manifest
from shardkit.index.shards import ShardTable
from shardkit.loader.epochs.seeds import sample_seeds
from shardkit.loader.read.reader import ReaderPart
from shardkit.loader.routes.choose import choose_route
from shardkit.loader.routes.cpu.worker import CpuBatchBuilder
from shardkit.loader.routes.spec import RouteSpec
from shardkit.loader.service.actor import BatchActor, DatasetCheck
from shardkit.loader.service.client import dataset_checks
from shardkit.loader.service.payload import Failure, from_payload, raise_failure
from shardkit.loader.stats import StageStats
from shardkit.serve import start_command
from tests.ports import free_port


def _loader(dataset: Path | str, **kwargs: object) -> ShardLoader:
    return ShardLoader(str(dataset), batch_size=8, transform=transforms.imagenet_train(16), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workers": 0}, "RayService workers must be a positive int, got 0"),
    ({"in_flight": 1.5}, "RayService in_flight must be a positive int, got 1.5"),
    ({"retries": -1}, "RayService retries must be an int >= 0, got -1"),
    ({"batch_timeout_s": 0}, "RayService batch_timeout_s must be a positive number, got 0"),
    ({"address": ""}, "RayService address must be 'auto', 'HOST:PORT' or 'ray://HOST:PORT', got ''"),
])
def test_bad_options_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(LoaderError) as err:
        RayService(**kwargs)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_the_window_is_two_batches_per_worker_unless_given() -> None:
    assert RayService(workers=3).window == 6 and RayService(workers=3, in_flight=4).window == 4


@pytest.mark.parametrize(("kwargs", "start"), [
    ({"num_workers": 2}, "with service= the workers are the service's (RayService(workers=4)): leave num_workers"),
    ({"feeders": 1}, "with service= batches arrive from the service, not from feeders"),
    ({"gpu": GpuOptions()}, "gpu= configures the GPU route"),
    ({"service": "127.0.0.1:6379"}, "service must be a shardkit.RayService (or None), got str"),
])
def test_local_work_beside_a_service_is_refused(packed: Path, kwargs: dict[str, object], start: str) -> None:
    kwargs = {"service": RayService(), **kwargs}
    with pytest.raises(LoaderError) as err:
        _loader(packed, **kwargs)
    assert str(err.value).startswith(start), err.value


def test_an_unreachable_address_fails_in_seconds(packed: Path) -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(LoaderError) as err:
        _loader(packed, service=RayService(f"127.0.0.1:{port}", connect_timeout_s=1.0))
    assert time.monotonic() - t0 < 5
    assert str(err.value).startswith(f"cannot reach the Ray cluster at 127.0.0.1:{port} within 1 s "
                                     "(ConnectionRefusedError: ")
    assert "\n" not in str(err.value)


def test_a_port_that_is_not_ray_fails_in_seconds(packed: Path) -> None:
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(LoaderError) as err:
            _loader(packed, service=RayService(address, connect_timeout_s=1.0))
    assert time.monotonic() - t0 < 5
    assert str(err.value) == (f"{address} accepts connections but did not answer as a Ray cluster within 1 s "
                              "(the GCS port of the head node, 6379 by default, or a ray:// client port, 10001, "
                              "is expected)")


@pytest.mark.parametrize("address", ["localhost", "host:port", "ray://10.0.0.1"])
def test_an_address_without_a_port_is_refused(packed: Path, address: str) -> None:
    with pytest.raises(LoaderError, match="a Ray address is 'auto', 'HOST:PORT' or 'ray://HOST:PORT'"):
        _loader(packed, service=RayService(address, connect_timeout_s=1.0))


def test_auto_without_a_cluster_on_this_node_says_how_to_start_one(packed: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def none(address: str) -> str:
        raise ConnectionError("Could not find any running Ray instance.")

    from shardkit import _ray_reach

    monkeypatch.setattr(_ray_reach, "ray_bootstrap_address", none)
    with pytest.raises(LoaderError) as err:
        _loader(packed, service=RayService("auto", connect_timeout_s=1.0))
    assert str(err.value).startswith("no Ray cluster runs on this node (address='auto'): start one (`ray start "
                                     "--head`, or `shardkit serve --head`)")


def test_ray_missing_is_one_line_with_the_install_command(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(LoaderError) as err:
        _loader(packed, service=RayService("127.0.0.1:6379"))
    assert str(err.value).startswith("service= needs Ray in this environment and on the cluster's nodes: "
                                     "pip install 'shardkit[ray]'")


def test_a_dataset_only_this_process_can_read_is_refused() -> None:
    part = ReaderPart(locate_dataset("memory://only-here"), ShardTable.from_entries([]))
    with pytest.raises(LoaderError, match="memory:// is per process, so the service's workers cannot read it"):
        dataset_checks([part])


def test_a_coco_dataset_is_not_served() -> None:
    spec = RouteSpec(None, torch.device("cpu"), batch_size=2, service=True)
    with pytest.raises(LoaderError, match="service= serves ImageFolder and captioned datasets"):
        choose_route(SimpleNamespace(kind="coco"), None, spec)  # type: ignore[arg-type]


def _actor(packed: Path, fingerprint: str | None = None, version: str = __version__) -> BatchActor:
    loader = _loader(packed)
    store = locate_dataset(str(packed))
    check = DatasetCheck(store, fingerprint or read_manifest(store).table.fingerprint, 0)
    builder = loader.route.builder
    assert isinstance(builder, CpuBatchBuilder)
    return BatchActor(builder, [check], version)


def test_a_worker_builds_the_batch_the_local_builder_builds(packed: Path) -> None:
    actor = _actor(packed)
    assert actor.check() is None
    shards, indices, seeds = [0, 0, 3], [1, 2, 0], sample_seeds(3, 0, [5, 6, 7]).tolist()
    want = actor.builder.build(shards, indices, seeds)
    got = from_payload(actor.build(shards, indices, seeds), writable=True)  # type: ignore[arg-type]
    assert isinstance(got.images, torch.Tensor) and isinstance(want.images, torch.Tensor)
    assert torch.equal(got.images, want.images) and torch.equal(got.labels, want.labels)
    assert got.keys == want.keys and got.stats.samples == 3
    got.images += 1  # delivered on the CPU: the user's to change


def test_a_worker_refuses_other_shards_or_another_shardkit(packed: Path) -> None:
    assert "holds other shards on this node than in the training process" in str(_actor(packed, "0" * 64).check())
    assert _actor(packed, version="0.0.1").check() == (f"the node runs shardkit {__version__}, "
                                                       "the training process 0.0.1")


def test_an_error_building_a_batch_comes_back_with_its_type_and_where(packed: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(packed, broken)
    actor = _actor(broken)
    first = sorted(broken.glob("*.tar"))[0]
    first.unlink()
    failure = actor.build([0], [0], [1])
    assert isinstance(failure, Failure) and failure.kind == "LoaderError" and failure.where == str(first)
    assert failure.message.startswith("cannot read shard") and "Traceback" in failure.traceback
    record = Failure("ManifestError", "bad", "x/index.json", "tb")
    with pytest.raises(Exception) as err:
        raise_failure(record, "batch 3 of epoch 0")
    assert type(err.value).__name__ == "ManifestError" and str(err.value) == "x/index.json: bad"
    assert "batch 3 of epoch 0" in str(err.value.__cause__)
    with pytest.raises(LoaderError):  # a name shardkit does not have is never looked up elsewhere
        raise_failure(replace(record, kind="SystemExit"), "batch 0")


def test_stats_travel_as_numbers() -> None:
    from shardkit.loader.routes.cpu.worker import CpuBatch
    from shardkit.loader.service.payload import to_payload

    payload = to_payload(CpuBatch(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), {"text": torch.ones(1, 4)}, ["k"],
                                  StageStats(samples=1, decode_s=0.5)))
    assert payload.stats["decode_s"] == 0.5 and type(payload.labels["text"]).__name__ == "Array"


Views = collections.namedtuple("Views", "first second")  # a transform's output


def test_a_transforms_joined_named_tuples_travel_as_such() -> None:
    from shardkit.loader.routes.cpu.worker import CpuBatch
    from shardkit.loader.service.payload import to_payload

    views = Views(torch.zeros(2, 3, 2, 2, dtype=torch.uint8), [torch.ones(2), (torch.ones(2),)])
    payload = to_payload(CpuBatch(views, torch.tensor([0, 1]), ["a", "b"], StageStats()))
    assert type(payload.images.first).__name__ == "Array"  # carried as an array, not pickled with the tuple
    got = from_payload(payload, writable=True)
    assert type(got.images) is Views and torch.equal(got.images.first, views.first)
    assert isinstance(got.images.second, list) and isinstance(got.images.second[1], tuple)


def test_serve_prints_the_ray_start_command() -> None:
    done = CliRunner().invoke(cli, ["serve", "--head", "--port", "7000", "--num-cpus", "3", "--dry-run", "--",
                                    "--temp-dir", "/tmp/r"])
    assert done.exit_code == 0, done.output
    assert shlex.split(done.output)[3:] == ["start", "--block", "--disable-usage-stats", "--num-cpus", "3",
                                            "--resources", '{"shardkit_service": 3}', "--head", "--port", "7000",
                                            "--temp-dir", "/tmp/r"]
    assert start_command(head=False, address="h:1")[-2:] == ["--address", "h:1"]


@pytest.mark.parametrize("args", [[], ["--head", "--address", "h:1"]])
def test_serve_needs_head_or_address(args: list[str]) -> None:
    done = CliRunner().invoke(cli, ["serve", *args, "--dry-run"])
    assert done.exit_code == 1
    assert "give either --head (start a cluster) or --address HEAD:PORT (join one)" in done.output


@pytest.mark.parametrize(("args", "message"), [
    (["--address", "1.2.3.4", "--dry-run"], "--address: a node joins by HOST:PORT, got '1.2.3.4'"),  # a traceback
    (["--address", "ray://h:10001", "--dry-run"], "--address: a node joins by the head's address HOST:PORT (its GCS "
                                                  "port, 6379 by default), not a ray:// client address"),
    (["--head", "--port", "99999", "--dry-run"], "--port must be a port number (1 to 65535), got 99999"),
    (["--head", "--wait", "5", "--dry-run"], "--wait applies with --address"),  # it was taken and did nothing
])
def test_serve_refuses_an_address_or_port_that_is_none(args: list[str], message: str) -> None:
    done = CliRunner().invoke(cli, ["serve", *args])
    assert done.exit_code == 1 and message in done.output, done.output


def test_serve_refuses_an_address_no_head_answers_once_it_has_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ray start --address` printed Ray's warnings for minutes where no head answered; now the
    head has --wait seconds to answer (it may be starting beside this node), then one line."""
    import os
    import socket
    import time

    pytest.importorskip("ray")

    def no_exec(*_args: object) -> None:  # never replace the test process with `ray start --block`
        raise AssertionError("serve went on to start the node")

    monkeypatch.setattr(os, "execv", no_exec)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: connections are refused
        started = time.monotonic()
        done = CliRunner().invoke(cli, ["serve", "--address", f"127.0.0.1:{port}", "--wait", "2"])
    waited = time.monotonic() - started
    assert not isinstance(done.exception, AssertionError), done.exception  # it never went on to start a node
    assert done.exit_code == 1 and 2 <= waited < 10, (waited, done.output)
    assert f"--address: cannot reach the Ray cluster at 127.0.0.1:{port} within 5 s" in done.output
    assert "s; --wait SECONDS tries longer)" in done.output
