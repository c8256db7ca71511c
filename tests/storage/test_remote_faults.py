"""Transient S3 faults are retried (bounded), permanent ones end in one clear line.

Faults are real: a TCP proxy (tests/faultproxy.py) in front of the moto server resets
connections and cuts responses short, which aiohttp reports as ``ClientPayloadError``.
"""

import random
import subprocess
import sys
import uuid
from urllib.parse import urlsplit

import pytest

from shardkit.errors import StorageError
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store
from tests.faultproxy import FaultProxy

pytest.importorskip("s3fs")

_PAYLOAD = bytes(range(256)) * 4000  # 1 MB: several reads, a response worth cutting short


def _proxied(s3_server, faults):
    endpoint = urlsplit(s3_server["client_kwargs"]["endpoint_url"])
    proxy = FaultProxy((endpoint.hostname, endpoint.port), faults)
    return proxy, {**s3_server, "client_kwargs": {"endpoint_url": proxy.url}}


def _seeded(rate, seed):
    rng = random.Random(seed)

    def faults(_number):
        if rng.random() >= rate:
            return None
        return rng.choice(["reset", ("truncate", rng.randrange(1, 3000))])

    return faults


@pytest.mark.timeout(60)
def test_cut_responses_and_resets_are_retried(s3_server, s3_bucket):
    url = f"{s3_bucket}/d"
    Store(url, s3_server).write_bytes("x.bin", _PAYLOAD)
    for fault in ("reset", ("truncate", 2000)):
        # every other connection fails: without retries the first GET dies (ClientPayloadError)
        proxy, options = _proxied(s3_server, lambda n, fault=fault: fault if n % 2 == 0 else None)
        try:
            store = Store(url, options)
            assert store.read_bytes("x.bin") == _PAYLOAD
            assert store.size("x.bin") == len(_PAYLOAD)
            with store.open_read("x.bin") as f:
                assert f.read() == _PAYLOAD
            store.write_bytes("y.bin", _PAYLOAD[:1000])
            assert Store(url, s3_server).read_bytes("y.bin") == _PAYLOAD[:1000]
            assert proxy.injected >= 2
        finally:
            proxy.close()


@pytest.mark.timeout(60)
def test_permanent_fault_is_one_storage_error(s3_server, s3_bucket):
    url = f"{s3_bucket}/d"
    Store(url, s3_server).write_bytes("x.bin", _PAYLOAD)
    proxy, options = _proxied(s3_server, lambda n: ("truncate", 2000))
    try:
        with pytest.raises(StorageError, match=r"x\.bin: network error.*mid-request"):
            Store(url, options).read_bytes("x.bin")
    finally:
        proxy.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rate", [0.05, 0.2])
def test_pack_and_verify_through_faults(small_tree, tmp_path, s3_server, s3_bucket, rate):
    """Pack to S3 and verify it back with a share of connections reset or cut short: both
    complete, and the shards are byte-identical to a local pack."""
    url = f"{s3_bucket}/{uuid.uuid4().hex}"
    proxy, options = _proxied(s3_server, _seeded(rate, 14))
    try:
        result = pack(str(small_tree), url, options=PackOptions(max_count=3), workers=1,
                      storage_options=options)
        report = verify_dataset(url, decode=True, storage_options=options)
        assert report.ok, report.problems
    finally:
        proxy.close()
    local = pack(str(small_tree), str(tmp_path / "local"), options=PackOptions(max_count=3),
                 workers=1)
    assert result.manifest.shards == local.manifest.shards
    assert read_manifest(Store(url, s3_server)).shards == local.manifest.shards


@pytest.mark.timeout(120)
def test_cli_permanent_fault_is_one_line(small_tree, s3_server, s3_bucket):
    url = f"{s3_bucket}/ds"
    pack(str(small_tree), url, workers=1, storage_options=s3_server)
    proxy, _options = _proxied(s3_server, lambda n: ("truncate", 300))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shardkit", "info", url, "-o", f"key={s3_server['key']}",
             "-o", f"secret={s3_server['secret']}", "-o", f"client_kwargs.endpoint_url={proxy.url}",
             "-o", "config_kwargs.retries.max_attempts=1"],  # botocore's backoff: seconds more
            capture_output=True, text=True, timeout=100)
    finally:
        proxy.close()
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "Task exception" not in done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "network error" in done.stderr and "index.json" in done.stderr, done.stderr
