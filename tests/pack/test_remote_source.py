"""Packing from a URL (S3 on the moto server, ``memory://``): the same shards and ``index.json``
as packing the same tree from disk, resumable, and clear errors."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from sample_data.coco_gen import make_coco
from shardkit.cli import cli
from shardkit.errors import PackError, StorageError
from shardkit.pack import PackOptions, pack, pack_coco
from shardkit.storage import Store
from tests.conftest import encode_image, upload_tree, write_tree
from tests.faultproxy import FaultProxy

OPTIONS = PackOptions(max_count=3, seed=5)

pytest.importorskip("s3fs")


@pytest.fixture
def tree(small_tree: Path) -> Path:
    """``small_tree`` plus inputs that are skipped (their reasons are in ``index.json`` too)."""
    write_tree(small_tree, {"class1/empty.jpg": b"", "class2/text.png": b"not an image",
                            "class0/deep/er.jpg": encode_image((7, 5))})
    return small_tree


def _files(store: Store) -> dict[str, str]:
    """sha256 of every file of a packed dataset (shards, offsets, index.json)."""
    return {name: hashlib.sha256(store.read_bytes(name)).hexdigest() for name in store.listdir()}


@pytest.fixture
def reference(tree: Path, tmp_path: Path) -> dict[str, str]:
    pack(str(tree), str(tmp_path / "local"), options=OPTIONS, workers=1)
    return _files(Store(str(tmp_path / "local")))


def _cli_options(options: dict[str, Any]) -> list[str]:
    return ["-o", f"client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}", "-o",
            "key=test", "-o", "secret=test", "-o", "skip_instance_cache=true"]


def test_s3_imagefolder_packs_to_the_same_bytes(tree: Path, reference: dict[str, str], tmp_path: Path,
                                                s3_server: dict[str, Any], s3_bucket: str) -> None:
    src = f"{s3_bucket}/train"
    upload_tree(tree, src, s3_server)
    local_dst = pack(src, str(tmp_path / "a"), options=OPTIONS, workers=2, source_options=s3_server)
    assert len(local_dst.manifest.skipped) == 2
    assert _files(Store(str(tmp_path / "a"))) == reference
    dst = f"{s3_bucket}/shards"
    pack(src, dst, options=OPTIONS, workers=2, storage_options=s3_server)  # options for both
    assert _files(Store(dst, s3_server)) == reference


def test_memory_source_packs_to_the_same_bytes(tree: Path, reference: dict[str, str],
                                               tmp_path: Path) -> None:
    src = f"memory://remote-source/{uuid.uuid4().hex}"
    upload_tree(tree, src)
    pack(src, str(tmp_path / "out"), options=OPTIONS, workers=2)  # one process: memory:// is its
    assert _files(Store(str(tmp_path / "out"))) == reference
    with pytest.raises(PackError, match="memory:// is per process"):
        pack(src, str(tmp_path / "ray"), options=OPTIONS, executor="ray")


def test_coco_with_remote_annotations(tmp_path: Path, s3_server: dict[str, Any],
                                      s3_bucket: str) -> None:
    images, ann = make_coco(tmp_path / "coco", images=10)
    (images / "img_0003.jpg").unlink()  # skipped with the same reason from disk and from S3
    upload_tree(tmp_path / "coco", f"{s3_bucket}/coco", s3_server)
    options = PackOptions(max_count=4)
    pack_coco(str(images), str(ann), str(tmp_path / "local"), options=options, workers=1)
    reference = _files(Store(str(tmp_path / "local")))
    for n, src in enumerate([f"{s3_bucket}/coco/images", str(images)]):
        dst = tmp_path / f"out{n}"
        result = pack_coco(src, f"{s3_bucket}/coco/instances.json", str(dst), options=options,
                           workers=2, source_options=s3_server)
        assert [s["source"] for s in result.manifest.skipped] == ["img_0003.jpg"]
        assert _files(Store(str(dst))) == reference


def test_cli_remote_source_and_a_missing_prefix(tree: Path, reference: dict[str, str], tmp_path: Path,
                                                s3_server: dict[str, Any], s3_bucket: str) -> None:
    upload_tree(tree, f"{s3_bucket}/train", s3_server)
    args = ["--max-count", "3", "--seed", "5", "--workers", "2", *_cli_options(s3_server)]
    out = CliRunner().invoke(cli, ["pack", f"{s3_bucket}/train", str(tmp_path / "out"), *args])
    assert out.exit_code == 0, out.output
    assert "samples   13" in out.output and "skipped   2" in out.output
    assert _files(Store(str(tmp_path / "out"))) == reference

    missing = f"{s3_bucket}/trian"
    out = CliRunner().invoke(cli, ["pack", missing, str(tmp_path / "typo"), *args])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert out.output == f"error: {missing}: source directory does not exist (no object under this prefix)\n"
    assert not (tmp_path / "typo").exists()


def test_unreadable_objects_stop_the_pack_naming_one(tree: Path, s3_server: dict[str, Any],
                                                     s3_bucket: str, tmp_path: Path) -> None:
    src = f"{s3_bucket}/train"
    upload_tree(tree, src, s3_server)
    # moto lists a bucket to anyone but serves its objects only with credentials (HTTP 403)
    anonymous = {"anon": True, "client_kwargs": s3_server["client_kwargs"], "skip_instance_cache": True}
    with pytest.raises(StorageError, match=rf"^{src}/class\d/.*: access denied \(Forbidden\)"):
        pack(src, str(tmp_path / "out"), options=OPTIONS, workers=1, source_options=anonymous)
    assert not (tmp_path / "out" / "index.json").exists()


def test_interrupted_remote_pack_resumes(tree: Path, reference: dict[str, str], tmp_path: Path,
                                         s3_server: dict[str, Any], s3_bucket: str) -> None:
    src, dst = f"{s3_bucket}/train", f"{s3_bucket}/out"
    upload_tree(tree, src, s3_server)
    done: list[int] = []

    def interrupt_in_shard_three(n: int) -> None:  # called per sample in one process
        done.append(n)
        if sum(done) == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(src, dst, options=OPTIONS, workers=1, storage_options=s3_server,
             progress=interrupt_in_shard_three)
    out = Store(dst, s3_server)
    assert "index.json" not in out.listdir()
    resumed = pack(src, dst, options=OPTIONS, workers=2, storage_options=s3_server)
    assert resumed.reused_shards == 2 < len(resumed.manifest.shards)
    assert _files(out) == reference


def test_changed_inputs_stop_a_resume(tree: Path, tmp_path: Path, s3_server: dict[str, Any],
                                      s3_bucket: str) -> None:
    src, dst = f"{s3_bucket}/train", str(tmp_path / "out")
    upload_tree(tree, src, s3_server)

    def stop(_n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(src, dst, options=OPTIONS, workers=1, source_options=s3_server, progress=stop)
    # same name and size, other bytes: the ETag changes, and so what was packed would be stale
    data = Store(src, s3_server).read_bytes("class0/img0.jpg")
    Store(src, s3_server).write_bytes("class0/img0.jpg", data[:-3] + b"\x00\xff\xd9")
    with pytest.raises(PackError, match="input files changed since it began"):
        pack(src, dst, options=OPTIONS, workers=1, source_options=s3_server)
    result = pack(src, dst, options=OPTIONS, workers=1, source_options=s3_server, overwrite=True)
    assert result.reused_shards == 0


@pytest.mark.timeout(120)
def test_source_reads_are_retried_through_faults(tree: Path, reference: dict[str, str], tmp_path: Path,
                                                 s3_server: dict[str, Any], s3_bucket: str) -> None:
    src = f"{s3_bucket}/train"
    upload_tree(tree, src, s3_server)
    endpoint = urlsplit(s3_server["client_kwargs"]["endpoint_url"])
    # every third connection is reset or cut short; the retries make the pack whole anyway
    proxy = FaultProxy((str(endpoint.hostname), int(endpoint.port or 0)),
                       lambda n: (("truncate", 200) if n % 2 else "reset") if n % 3 == 1 else None)
    try:
        faulty = {**s3_server, "client_kwargs": {"endpoint_url": proxy.url}}
        pack(src, str(tmp_path / "out"), options=OPTIONS, workers=1, source_options=faulty)
        assert proxy.injected >= 3
    finally:
        proxy.close()
    assert _files(Store(str(tmp_path / "out"))) == reference
