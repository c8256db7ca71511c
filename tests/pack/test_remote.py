"""Pack to fsspec URLs: ``memory://`` and S3 on a moto server; read back with webdataset."""

import io
import uuid

import fsspec

from shardkit.format import iter_samples
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store


def _local_samples(small_tree, tmp_path):
    pack(str(small_tree), str(tmp_path / "local"), options=PackOptions(max_count=5), workers=1)
    store = Store(str(tmp_path / "local"))
    return store, read_manifest(store)


def test_memory_destination_packs_and_verifies_with_workers(small_tree, tmp_path):
    url = f"memory://shardkit-tests/{uuid.uuid4().hex}/ds"
    result = pack(str(small_tree), url, options=PackOptions(max_count=5), workers=2)
    assert verify_dataset(url, decode=True).ok
    local, manifest = _local_samples(small_tree, tmp_path)
    assert result.manifest == manifest
    remote = Store(url)
    for shard in manifest.shards:
        assert remote.read_bytes(shard.url) == local.read_bytes(shard.url)
    assert ".shardkit-pack" not in remote.listdir()


def test_s3_destination_round_trip(small_tree, tmp_path, s3_server, s3_bucket):
    import webdataset as wds

    url = f"{s3_bucket}/ds"
    result = pack(str(small_tree), url, options=PackOptions(max_count=5), workers=2,
                  storage_options=s3_server)
    report = verify_dataset(url, decode=True, storage_options=s3_server)
    assert report.ok, report.problems
    local, manifest = _local_samples(small_tree, tmp_path)
    assert result.manifest == manifest
    remote = Store(url, s3_server)
    assert sorted(remote.listdir()) == sorted(local.listdir())
    expected: dict[str, dict[str, bytes]] = {}
    for shard in manifest.shards:
        expected.update(iter_samples(io.BytesIO(local.read_bytes(shard.url)), where=shard.url))

    def open_s3(urls):  # webdataset reads through fsspec: no pipe:, no shell
        for u in urls:
            yield {"url": u["url"], "stream": fsspec.open(u["url"], "rb", **s3_server).open()}

    pipeline = wds.DataPipeline(
        wds.SimpleShardList([f"{url}/{s.url}" for s in manifest.shards]),
        open_s3, wds.tariterators.tar_file_expander, wds.tariterators.group_by_keys,
    )
    read = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in pipeline}
    assert read == expected
