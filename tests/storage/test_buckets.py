"""A missing bucket is an error naming it (never created); an unreachable endpoint says so."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.errors import StorageError
from shardkit.pack import pack
from shardkit.storage import Store
from shardkit.storage.buckets import bucket_of

pytest.importorskip("s3fs")


def _buckets(options: dict[str, Any]) -> list[str]:
    import s3fs

    return sorted(b.rstrip("/") for b in s3fs.S3FileSystem(**options).ls(""))


def _cli_options(options: dict[str, Any]) -> list[str]:
    return ["-o", f"client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}", "-o",
            "key=test", "-o", "secret=test", "-o", "skip_instance_cache=true"]


def test_bucket_of() -> None:
    assert (bucket_of("s3://b/x/y") == "b" and bucket_of("gs://b") == "b"
            and bucket_of("s3://") is None)
    assert (bucket_of("memory://b/x") is None and bucket_of("/tmp/x") is None
            and bucket_of("file:///x") is None)


def test_pack_into_a_missing_bucket_names_it_and_creates_nothing(s3_server: dict[str, Any],
                                                                  small_tree: Path) -> None:
    typo = f"my-typo-bucket-{uuid.uuid4().hex[:8]}"
    before = _buckets(s3_server)
    with pytest.raises(StorageError,
                       match=f"bucket '{typo}' does not exist .* never creates buckets") as err:
        pack(str(small_tree), f"s3://{typo}/train", workers=1, storage_options=s3_server)
    assert err.value.where == f"s3://{typo}/train"
    assert _buckets(s3_server) == before  # s3fs makedirs used to create it

    result = CliRunner().invoke(cli, ["pack", str(small_tree), f"s3://{typo}/train", "--workers",
                                      "1", *_cli_options(s3_server)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"error: s3://{typo}/train: bucket '{typo}' does not exist")
    assert _buckets(s3_server) == before


@pytest.mark.parametrize("command", ["info", "verify"])
def test_reading_from_a_missing_bucket_names_it(s3_server: dict[str, Any], command: str) -> None:
    typo = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(cli, [command, f"s3://{typo}/train", *_cli_options(s3_server)])
    assert result.exit_code == 1, result.output
    assert (f"bucket '{typo}' does not exist" in result.output
            and "no index.json" not in result.output)


def test_an_existing_bucket_without_a_dataset_still_says_no_index(s3_server: dict[str, Any],
                                                                   s3_bucket: str) -> None:
    store = Store(f"{s3_bucket}/nothing-here", s3_server)
    assert not store.exists("index.json") and store.listdir() == []
    result = CliRunner().invoke(cli,
                                ["info", f"{s3_bucket}/nothing-here", *_cli_options(s3_server)])
    assert result.exit_code == 1 and "no index.json: not a shardkit dataset" in result.output


def _refusing_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections are refused at once
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_FAST = ["-o", "config_kwargs.retries.max_attempts=0", "-o", "config_kwargs.connect_timeout=2"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["info"], ["verify", "--decode"]])
def test_a_refused_connection_is_a_network_error(command: list[str]) -> None:
    port = _refusing_port()
    started = time.monotonic()
    result = CliRunner().invoke(cli, [*command, "s3://bucket/train", "-o",
                                      f"client_kwargs.endpoint_url=http://127.0.0.1:{port}", "-o",
                                      "key=k", "-o", "secret=s", "-o", "skip_instance_cache=true",
                                      *_FAST])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: s3://bucket/train")
    refused = f"network error: cannot connect to 127.0.0.1:{port} (Connection refused)"
    assert refused in result.output
    assert "no index.json" not in result.output and "Traceback" not in result.output
    assert time.monotonic() - started < 30


@pytest.mark.timeout(60)
def test_pack_to_a_refused_endpoint_is_a_network_error(small_tree: Path) -> None:
    port = _refusing_port()
    options = {"key": "k", "secret": "s", "skip_instance_cache": True,
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
               "config_kwargs": {"retries": {"max_attempts": 0}, "connect_timeout": 2}}
    with pytest.raises(StorageError,
                       match=f"cannot connect to 127.0.0.1:{port} \\(Connection refused\\)"):
        # bucket root: s3fs's exists() swallows errors
        pack(str(small_tree), "s3://bucket", workers=1, storage_options=options)


@pytest.mark.timeout(60)
def test_a_source_read_with_source_options_is_told_to_set_its_endpoint_there(tmp_path: Path) -> None:
    """With --source-option, the source ignores -o: its refused endpoint's message named
    ``-o client_kwargs.endpoint_url=…``, which the user had given."""
    port = _refusing_port()
    fast = [o.replace("-o", "--source-option") for o in _FAST]
    result = CliRunner().invoke(cli, ["pack", "s3://bucket/train", str(tmp_path / "out"), "--source-option",
                                      f"client_kwargs.endpoint_url=http://127.0.0.1:{port}", "--source-option",
                                      "key=k", "--source-option", "secret=s", *fast,
                                      "-o", "client_kwargs.endpoint_url=http://127.0.0.1:1"])
    assert result.exit_code == 1, result.output
    assert f"cannot connect to 127.0.0.1:{port} (Connection refused)" in result.output, result.output
    assert "(storage option client_kwargs.endpoint_url: --source-option client_kwargs.endpoint_url=… in " \
           "commands" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_an_endpoint_that_is_no_s3_server_is_named_as_such(tmp_path: Path) -> None:
    """A web server that answers 404 for everything is not a missing bucket (a wrong port, a proxy)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.server_address[1]}"}, "key": "test",
               "secret": "test", "skip_instance_cache": True}
    try:
        for touch in (lambda s: s.exists(), lambda s: s.read_optional("index.json")):
            with pytest.raises(StorageError, match=r"s3://bucket/x: the endpoint answered 'not found' without any of "
                                                   r"an S3 server's headers \(server: SimpleHTTP"):
                touch(Store("s3://bucket/x", options))
    finally:
        server.shutdown()


def test_an_endpoint_without_its_scheme_says_so() -> None:
    from shardkit.storage._remote import describe

    assert describe(ValueError("Invalid endpoint: 127.0.0.1:5123")) == (
        "invalid endpoint URL '127.0.0.1:5123': it needs its scheme, e.g. http://127.0.0.1:5123 "
        "(AWS_ENDPOINT_URL or client_kwargs.endpoint_url)")


def test_an_unreachable_https_host_gets_no_s3_advice() -> None:
    import socket

    import aiohttp
    from aiohttp.client_reqrep import ConnectionKey

    from shardkit.storage._remote import describe

    key = ConnectionKey("example.invalid", 443, True, True, None, None, None)
    err = aiohttp.ClientConnectorError(key, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert describe(err) == ("network error: cannot connect to example.invalid:443 (Name or service not known); "
                             "check the URL's host and that it is reachable")
