"""S3 failures become ``StorageError``: an endpoint that never answers, missing credentials."""

import socket
import threading
from collections.abc import Iterator

import pytest

from shardkit.errors import StorageError
from shardkit.storage import Store

pytest.importorskip("s3fs")

_FAST = {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 0}}


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP port that accepts connections (the kernel's backlog) and never replies."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)  # holds the socket open, reads nothing
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_ROLE_ARN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.timeout(60)  # before the fix: hung for minutes
def test_unresponsive_endpoint_times_out_as_storage_error(silent_endpoint):
    store = Store("s3://bucket/ds", {"key": "AKIDFAKEKEY", "secret": "FAKESECRET",
                                     "skip_instance_cache": True,
                                     "client_kwargs": {"endpoint_url": silent_endpoint},
                                     "config_kwargs": _FAST})
    with pytest.raises(StorageError, match="s3://bucket/ds/index.json: timed out") as err:
        store.read_bytes("index.json")
    assert "AKIDFAKEKEY" not in str(err.value) and "FAKESECRET" not in str(err.value)


@pytest.mark.timeout(60)  # before the fix: hung for ever
def test_upload_to_unresponsive_endpoint_times_out(silent_endpoint):
    # S3 uploads send "Expect: 100-continue"; aiohttp waits for the reply with no timeout.
    store = Store("s3://bucket/ds", {"key": "k", "secret": "s", "skip_instance_cache": True,
                                     "client_kwargs": {"endpoint_url": silent_endpoint},
                                     "config_kwargs": _FAST})
    with pytest.raises(StorageError, match="s3://bucket/ds/a.bin: timed out"):
        store.write_bytes("a.bin", b"x" * 100)


def test_missing_credentials_name_the_credential_chain(silent_endpoint, no_aws_credentials):
    store = Store("s3://bucket/ds", {"skip_instance_cache": True,
                                     "client_kwargs": {"endpoint_url": silent_endpoint},
                                     "config_kwargs": _FAST})
    with pytest.raises(StorageError, match="no AWS credentials") as err:
        store.exists("index.json")
    assert "standard AWS credential chain" in str(err.value) and "-o key=" in str(err.value)


def test_s3_defaults_bound_timeouts_but_user_values_win():
    from shardkit.storage._remote import filesystem_options

    options = filesystem_options("s3", {"config_kwargs": {"read_timeout": 5}})
    assert (options["config_kwargs"]
            == {"connect_timeout": 10, "read_timeout": 5, "retries": {"max_attempts": 3}})
    assert filesystem_options("memory", {}) == {}
    assert filesystem_options("s3", {"session": "mine"})["session"] == "mine"
