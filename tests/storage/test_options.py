"""Storage options s3fs would ignore, or botocore would fail on at the first request, are refused
when the store is made, naming the option."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from shardkit import ShardLoader
from shardkit.errors import StorageError
from shardkit.storage import Store
from tests.cli.terminal import run_piped, shardkit_argv

pytest.importorskip("s3fs")


@pytest.mark.parametrize(("options", "message"), [
    ({"anonn": True}, "unknown storage option 'anonn' for s3:// (did you mean 'anon'?)"),
    ({"endpoint_urll": "http://h"}, "unknown storage option 'endpoint_urll' for s3:// (did you mean 'endpoint_url'?)"),
    ({"zzz": 1}, "unknown storage option 'zzz' for s3://"),
    ({"client_kwargs": {"regionname": "eu"}},
     "unknown storage option 'client_kwargs.regionname' for s3:// (did you mean 'region_name'?)"),
    ({"client_kwargs": 3}, "storage option client_kwargs must be a mapping"),
    ({"config_kwargs": {"retries": 3}}, "storage option config_kwargs.retries must be a mapping"),
    ({"config_kwargs": {"retries": {"max_attempt": 3}}}, 'retry configuration for "max_attempt"'),
    ({"config_kwargs": {"conect_timeout": 3}}, "unexpected keyword argument 'conect_timeout'"),
    ({"config_kwargs": {"connector_args": {"keepalive_timeoutt": 5}}}, "invalid connector_arg:keepalive_timeoutt"),
    ({"config_kwargs": {"read_timeout": "abc"}}, "config_kwargs.read_timeout must be a number of seconds above 0, "
                                                 "not 'abc'"),  # botocore failed at the first request
    ({"config_kwargs": {"connect_timeout": "5"}}, "config_kwargs.connect_timeout must be a number of seconds"),
    ({"config_kwargs": {"max_pool_connections": 2.5}}, "config_kwargs.max_pool_connections must be a count above 0"),
    ({"client_kwargs": {"endpoint_url": 5611}}, "client_kwargs.endpoint_url must be a URL with its scheme "
                                                "(http://host:port), not 5611"),  # a traceback at the first request
    ({"client_kwargs": {"endpoint_url": "127.0.0.1:5611"}}, "client_kwargs.endpoint_url must be a URL with its scheme"),
    ({"client_kwargs": {"verify": "maybe"}}, "client_kwargs.verify must be true, false or the path of a CA bundle"),
    ({"config_kwargs": {"retries": {"max_attempts": "x"}}}, "config_kwargs.retries.max_attempts must be a whole "
                                                            "number, not 'x'"),
    ({"session_vars": {}}, "unknown storage option 'session_vars'"),  # s3fs's session would take it; ours is given
])
def test_a_bad_s3_option_is_refused_naming_it(options: dict[str, Any], message: str) -> None:
    with pytest.raises(StorageError) as err:
        Store("s3://bucket/ds", options)
    assert str(err.value).startswith("s3://bucket/ds: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("options", [
    {"anon": True},
    {"key": "k", "secret": "s", "token": "t", "profile": "default", "skip_instance_cache": True},
    {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1", "verify": False}},
    {"config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 2, "mode": "standard"}}},
    {"use_listings_cache": False, "listings_expiry_time": 10, "max_concurrency": 4, "version_aware": True},
    {"RequestPayer": "requester", "s3_additional_kwargs": {"ServerSideEncryption": "AES256"}},
    {"config_kwargs": {"connector_args": {"keepalive_timeout": 5}}},  # aiobotocore's own, beside botocore's
    {"client_kwargs": MappingProxyType({"region_name": "eu-west-1"})},  # any mapping (a Hydra config's, say)
])
def test_options_s3fs_and_botocore_take_are_accepted(options: dict[str, Any]) -> None:
    assert Store("s3://bucket/ds", options).storage_options == options


def test_other_protocols_options_go_to_fsspec_unchecked() -> None:
    Store("memory://ds", {"anything": 1})
    Store("/tmp/ds", {"anonn": True})  # a local path takes no options


def test_the_loader_refuses_a_bad_option_when_built() -> None:
    with pytest.raises(StorageError, match="unknown storage option 'anonn'"):
        ShardLoader("s3://bucket/ds", batch_size=2, storage_options={"anonn": True})


def test_pack_refuses_a_bad_option_before_reading_anything(tmp_path: Path) -> None:
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(b"not read")
    code, _, stderr = run_piped(shardkit_argv("pack", str(tmp_path / "src"), "s3://bucket/ds", "-o", "anonn=true"))
    assert code != 0
    assert stderr.strip() == ("error: s3://bucket/ds: unknown storage option 'anonn' for s3:// "
                                   "(did you mean 'anon'?)")


def test_storage_options_that_are_not_a_mapping_are_refused_naming_them() -> None:
    """``storage_options="anon=True"`` (the command line's form) failed in dict() with "dictionary
    update sequence element #0 has length 1; 2 is required"."""
    with pytest.raises(StorageError, match=r"^s3://bucket/ds: storage_options must be a mapping of fsspec options "
                                           r"\(\{'anon': True\}\), not 'anon=True'"):
        Store("s3://bucket/ds", "anon=True")  # type: ignore[arg-type]
