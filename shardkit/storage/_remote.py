"""Remote (fsspec) specifics: bounded S3 timeouts/retries, and S3 client errors as messages.

botocore is imported lazily and only if installed, so local-only use never pays for it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from shardkit._compat import live_finalizers

#: Defaults for s3/s3a so that an unresponsive endpoint fails within minutes instead of
#: hanging (botocore's defaults are 60 s per read and s3fs retries 5 times on top of it).
_S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {"connect_timeout": 10, "read_timeout": 30, "retries": {"max_attempts": 3}},
}
#: s3fs's own retry loop around each call (a class attribute, not an option): one attempt,
#: since botocore already retries timeouts and throttling per ``config_kwargs.retries`` (s3fs's
#: loop nests in itself and would multiply every timeout). Transient faults that botocore does
#: not retry (a body cut short) are retried by :func:`retry`.
_S3FS_RETRIES = 1

#: Pauses between shardkit's own attempts of one remote operation after a transient fault
#: (seconds): 4 attempts, at most 2.1 s of waiting. Timeouts are not retried here (botocore
#: already did, and retrying them would turn a dead endpoint into a long hang).
RETRY_DELAYS: tuple[float, ...] = (0.1, 0.4, 1.6)

_T = TypeVar("_T")

#: Error codes of S3 replies that say "try again" (botocore retried them already).
_TRANSIENT_CODES = frozenset({"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
                              "500", "502", "503", "504"})

_NO_CREDENTIALS = (
    "no AWS credentials found (searched the standard AWS credential chain: AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws/credentials, instance metadata); "
    "give the storage options key and secret (commands: -o key=… -o secret=…; Python: "
    "storage_options={'key': …, 'secret': …}), or anon=true for a public bucket"
)


def _merge_defaults(options: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Fill ``options`` from ``defaults`` key by key (nested dicts too); the user's values win."""
    for key, value in defaults.items():
        if key not in options:
            options[key] = copy.deepcopy(value)
        elif isinstance(options[key], dict) and isinstance(value, dict):
            _merge_defaults(options[key], value)


_sessions: dict[tuple[int, str | None], Any] = {}


def _s3_session(profile: str | None) -> Any:
    """A botocore session (one per process and profile) whose S3 requests skip 100-continue.

    With ``Expect: 100-continue`` aiohttp waits for the server's go-ahead with no timeout at
    all, so an upload to an endpoint that accepts connections but never answers hangs for
    ever; without it the upload is bounded by ``read_timeout`` like every other request.
    Reusing the session keeps fsspec's instance cache (keyed on the options) effective.
    """
    key = (os.getpid(), profile)
    if key not in _sessions:
        from aiobotocore.session import AioSession
        from botocore.handlers import add_expect_header

        session = AioSession(profile=profile)
        session.unregister("before-call.s3", add_expect_header)
        _sessions[key] = session
    return _sessions[key]


def check_options(protocol: str, storage_options: dict[str, Any]) -> str | None:
    """What is wrong with ``storage_options`` for ``protocol``, in one line, or ``None``.

    Checked for s3/s3a, whose filesystem (s3fs) takes any keyword and ignores the ones it does
    not know (``anonn=true`` packed into whatever bucket the default credentials reach), and
    whose client and config options fail with a traceback at the first request. Other
    protocols' options go to fsspec as given.

    >>> check_options("s3", {"anonn": True})
    "unknown storage option 'anonn' for s3:// (did you mean 'anon'?)"
    >>> check_options("s3", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}) is None
    True
    """
    if protocol not in ("s3", "s3a"):
        return None
    try:
        known, client_known = _s3_option_names()
    except Exception:  # no s3fs (fsspec says so when the filesystem is made), or one unlike any checked against
        return None
    for key, value in storage_options.items():
        if key[:1].isupper():
            continue  # an S3 API parameter (RequestPayer, SSECustomerKey): s3fs passes it on per call
        if key not in known:
            return f"unknown storage option {key!r} for {protocol}://{_did_you_mean(key, known)}"
        if key in ("client_kwargs", "config_kwargs", "s3_additional_kwargs") and not isinstance(value, Mapping):
            return f"storage option {key} must be a mapping (-o {key}.NAME=VALUE), not {value!r}"
    client = storage_options.get("client_kwargs") or {}
    for key in client:
        if client_known and key not in client_known:
            return (f"unknown storage option 'client_kwargs.{key}' for {protocol}://"
                    f"{_did_you_mean(key, client_known)}")
    for key, (types, what) in _CLIENT_TYPES.items():  # botocore takes any value and fails at the first request
        given: Any = client.get(key)
        if given is not None and (not isinstance(given, types) or (key == "endpoint_url" and "://" not in str(given))
                                  or (key == "verify" and isinstance(given, str) and not os.path.isfile(given))):
            return f"storage option client_kwargs.{key} must be {what}, not {given!r}"
    if storage_options.get("config_kwargs"):
        return _config_problem(storage_options["config_kwargs"])
    return None


def _did_you_mean(key: str, known: Collection[str]) -> str:
    import difflib

    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


@functools.cache
def _s3_option_names() -> tuple[frozenset[str], frozenset[str]]:
    """The keywords s3fs's filesystem acts on (its own, fsspec's and the listings cache's, and
    ``profile``, which picks shardkit's session), and those of the S3 client (``client_kwargs``;
    empty where aiobotocore does not say)."""
    import inspect

    import s3fs
    from aiobotocore.session import AioSession
    from fsspec.dircache import DirCache

    def named(func: Any) -> set[str]:
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return {p.name for p in inspect.signature(func).parameters.values() if p.kind in kinds} - {"self"}

    # skip_instance_cache: taken by fsspec's instance cache before __init__. The session's own keywords
    # (session_vars, event_hooks) are not among them: s3fs passes them only to a session it makes, and
    # shardkit always gives it one (see filesystem_options).
    top = {"skip_instance_cache", "profile"}
    for cls in (*s3fs.S3FileSystem.__mro__, DirCache):
        if "__init__" in vars(cls) and cls is not object:
            top |= named(vars(cls)["__init__"])
    create = getattr(AioSession, "_create_client", None)  # the keywords create_client passes on
    return frozenset(top), frozenset(named(create) - {"service_name"}) if create is not None else frozenset()


#: S3 client options botocore checks only at the first request (a traceback there): their types.
_CLIENT_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "endpoint_url": (str, "a URL with its scheme (http://host:port)"),
    "region_name": (str, "a region's name (a string)"),
    "verify": ((bool, str), "true, false or the path of a CA bundle"),
}

#: botocore ``Config`` options that must be numbers, which it checks only when a request uses them.
_CONFIG_NUMBERS = {"connect_timeout": "a number of seconds", "read_timeout": "a number of seconds",
                   "max_pool_connections": "a count"}


def _config_problem(config_kwargs: Mapping[str, Any]) -> str | None:
    """What aiobotocore's ``AioConfig`` (botocore's ``Config`` and its own connection options),
    which s3fs builds from ``config_kwargs``, says of them (``-o config_kwargs.…``), or ``None``."""
    try:
        from aiobotocore.config import AioConfig
    except ImportError:
        return None
    for key, what in _CONFIG_NUMBERS.items():  # botocore takes any value here and fails at the first request
        value = config_kwargs.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
                                  or (what == "a count" and not isinstance(value, int))):
            return f"storage option config_kwargs.{key} must be {what} above 0, not {value!r}"
    retries = config_kwargs.get("retries")
    if retries is not None and not isinstance(retries, Mapping):
        return (f"storage option config_kwargs.retries must be a mapping "
                f"(-o config_kwargs.retries.max_attempts=N), not {retries!r}")
    for key in ("max_attempts", "total_max_attempts"):
        value = (retries or {}).get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"storage option config_kwargs.retries.{key} must be a whole number, not {value!r}"
    try:
        AioConfig(**config_kwargs)
    except Exception as err:  # botocore's TypeError / InvalidRetryConfigurationError / ParamValidationError
        return f"storage option config_kwargs: {' '.join(str(err).split()).rstrip('.')}"
    return None


def filesystem_options(protocol: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """``storage_options`` plus shardkit's defaults for ``protocol`` (a new dict).

    For s3/s3a: bounded timeouts and retries, and (unless the caller passes its own
    ``session``) a session without 100-continue; see :func:`_s3_session`.
    """
    options = copy.deepcopy(storage_options)
    if protocol in ("s3", "s3a"):
        _merge_defaults(options, _S3_DEFAULTS)
        if "session" not in options:
            # Without aiobotocore there is no s3fs: fsspec reports that when it builds the
            # filesystem.
            with contextlib.suppress(ImportError):
                options["session"] = _s3_session(options.get("profile"))
    return options


def tune(fs: Any, protocol: str) -> None:
    """Adjust a freshly created filesystem where no option exists for it (s3fs's retry loop),
    and make sure forked children leave it alone (:func:`_disown_inherited_filesystems`)."""
    if protocol in ("s3", "s3a") and isinstance(getattr(fs, "retries", None), int):
        fs.retries = min(fs.retries, _S3FS_RETRIES)
    global _fork_hooked
    if not _fork_hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_disown_inherited_filesystems)
        _fork_hooked = True  # children inherit both the hook and this flag


_fork_hooked = False
#: In a forked child: the filesystems copied from the parent, kept so that they are never freed.
_inherited: list[Any] = []


def _disown_inherited_filesystems() -> None:
    """In a child just forked (a DataLoader worker): keep the async fsspec filesystems (s3fs,
    gcsfs) copied from the parent alive and detach their finalizers, so that the child never
    closes them.

    s3fs registers ``weakref.finalize(fs, close_session, loop, client)`` to close the client's
    connection pool. The child inherits that finalizer with the parent's loop and client, and
    ran it whenever its garbage collector freed the copy (the child makes filesystems of its
    own). Run from fsspec's IO thread, it closed the pool on the child's loop, which awaits a
    future of the parent's loop and fails: "Task exception was never retrieved ... attached to
    a different loop" on stderr. Run from another thread, it waited a second on the
    parent's loop, which no thread runs in the child. And a freed copy's aiohttp session and
    connector say "Unclosed client session" on stderr. The sockets and the ``epoll`` instance
    such a close would touch are the parent's too. Kept, the copies are plain memory; their file
    descriptors close when the child exits.

    ``weakref.finalize`` offers no public list of live finalizers
    (:func:`shardkit._compat.live_finalizers`); without it nothing is done.
    """
    try:
        from fsspec.asyn import AsyncFileSystem
    except ImportError:
        return
    for finalizer in live_finalizers():
        held = finalizer.peek()
        if held is not None and isinstance(held[0], AsyncFileSystem):
            _inherited.append(held[0])
            finalizer.detach()


def _chain(err: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in seen and len(seen) < 8:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def transient(err: BaseException) -> str | None:
    """Why ``err`` (or an error it was raised from) is a transient remote fault worth another
    attempt, or ``None``: a response cut short or a connection dropped mid-request (aiohttp's
    ``ClientPayloadError``, ``ServerDisconnectedError``, a reset), or a 5xx/slow-down reply."""
    for e in _chain(err):
        if isinstance(e, TimeoutError):
            return None  # bounded by botocore's timeouts and attempts already
        name = type(e).__name__
        if name in ("ClientPayloadError", "ContentLengthError", "TransferEncodingError",
                    "ServerDisconnectedError", "ClientOSError", "IncompleteRead",
                    "ConnectionClosedError", "ResponseStreamingError"):
            return f"{name}: {e}"
        if isinstance(e, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
            return f"{name}: {e}"
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500):
                return f"{code or status}: {e}"
    return None


def retry(call: Callable[[], _T], delays: tuple[float, ...] = RETRY_DELAYS) -> _T:
    """Run ``call`` (an idempotent remote operation); after a :func:`transient` fault, wait and
    try again, ``len(delays)`` times at most. The last fault is re-raised as is, with a note
    saying how many attempts were made (:func:`describe` includes it)."""
    for delay in delays:
        try:
            return call()
        except Exception as err:
            if transient(err) is None:
                raise
        time.sleep(delay)
    try:
        return call()
    except Exception as err:
        if transient(err) is not None:
            err.shardkit_attempts = len(delays) + 1  # type: ignore[attr-defined]
        raise


def _unreachable(host: str, cause: object, *, s3: bool = True) -> str:
    if isinstance(cause, OSError) and cause.errno and cause.errno > 0:
        # "Connection refused", not asyncio's "Connect call failed (…)"
        reason = os.strerror(cause.errno)
    elif isinstance(cause, OSError) and cause.strerror:
        reason = cause.strerror  # name resolution: "Name or service not known" (negative errno)
    else:
        reason = str(cause)
    if not s3:
        return f"network error: cannot connect to {host} ({reason}); check the URL's host and that it is reachable"
    return (f"network error: cannot connect to {host} ({reason}); check the endpoint URL (storage option "
            "client_kwargs.endpoint_url: -o client_kwargs.endpoint_url=… in commands; or AWS_ENDPOINT_URL) and that "
            "it is reachable")


def describe(err: BaseException) -> str | None:
    """A one-line message for a remote client error, or ``None`` if ``err`` is not one.

    Covers botocore's errors (no credentials, endpoint unreachable, timeouts, service
    errors), aiohttp's connection errors and asyncio timeouts. An unreachable endpoint is
    named (host and port) with the operating system's reason. Messages never include
    credentials: botocore's own texts name the endpoint and operation only.
    """
    if isinstance(err, TimeoutError):  # also asyncio.TimeoutError and fsspec's FSTimeoutError
        return f"timed out ({err or type(err).__name__})"
    if isinstance(err, ValueError) and str(err).startswith("Invalid endpoint: "):  # botocore's, for "host:port"
        given = str(err).removeprefix("Invalid endpoint: ")
        return (f"invalid endpoint URL {given!r}: it needs its scheme, e.g. http://{given} "
                "(AWS_ENDPOINT_URL or client_kwargs.endpoint_url)")
    fault = transient(err)
    if fault is not None:
        attempts = getattr(err, "shardkit_attempts", None)
        tried = f" after {attempts} attempts" if attempts else ""
        return f"network error{tried}: the connection failed mid-request ({fault}); try again later"
    if isinstance(err, PermissionError) and any(
            isinstance(getattr(e, "response", None), dict) for e in _chain(err)):
        # s3fs's translation of an HTTP 403 (the service's reply is its cause)
        return (f"access denied ({err.strerror or err}): check the credentials and the "
                "bucket's policy")
    host = getattr(err, "host", None)
    # aiohttp's ClientConnectorError (gcsfs, …)
    if isinstance(err, OSError) and isinstance(host, str):
        return _unreachable(f"{host}:{getattr(err, 'port', '?')}", getattr(err, "os_error", None) or err,
                            s3=False)  # http(s), gcsfs: no S3 endpoint to check (botocore's are below)
    try:
        from botocore import exceptions as boto
    except ImportError:
        return None
    if isinstance(err, boto.NoCredentialsError):
        return _NO_CREDENTIALS
    if isinstance(err, boto.EndpointConnectionError):
        kwargs = getattr(err, "kwargs", {})
        url = urlsplit(str(kwargs.get("endpoint_url", "")))
        cause = kwargs.get("error")
        return _unreachable(url.netloc or "the endpoint",
                            getattr(cause, "os_error", None) or cause or err)
    if isinstance(err, (boto.ConnectTimeoutError, boto.ReadTimeoutError)):
        return f"timed out ({err})"
    if isinstance(err, (boto.BotoCoreError, boto.ClientError)):
        return f"{type(err).__name__}: {err}"
    return None
