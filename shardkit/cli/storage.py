"""``--storage-option KEY=VALUE`` (and ``AWS_ENDPOINT_URL``): fsspec options for remote URLs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from shardkit.storage import is_remote

F = TypeVar("F", bound=Callable[..., Any])


def storage_option_flag(func: F) -> F:
    """Add a repeatable ``--storage-option/-o KEY=VALUE`` to a command."""
    return click.option(
        "--storage-option", "-o", "storage_option", multiple=True, metavar="KEY=VALUE",
        help="fsspec option for a remote URL, repeatable; dotted keys nest "
             "(client_kwargs.endpoint_url=http://host:9000); values are parsed as JSON when "
             "possible. For s3:// the endpoint also comes from AWS_ENDPOINT_URL.",
    )(func)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def url_options(pairs: Sequence[str], url: str) -> dict[str, Any] | None:
    """:func:`storage_options` for a command of one location, refusing them for a local path
    (as ``shardkit pack`` does), where they would do nothing.

    Raises:
        click.UsageError: ``pairs`` given for a local ``url``.
    """
    if pairs and not is_remote(url):
        raise click.UsageError(f"--storage-option applies to URLs; {url} is a local path")
    return storage_options(pairs, url)


def storage_options(pairs: Sequence[str], url: str) -> dict[str, Any] | None:
    """Build fsspec ``storage_options`` from ``KEY=VALUE`` pairs (and the environment for S3).

    >>> storage_options(["anon=true", "client_kwargs.region_name=eu"], "s3://b/x")  # doctest: +SKIP
    {'anon': True, 'client_kwargs': {'region_name': 'eu'}}
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--storage-option")
        *parents, leaf = key.split(".")
        node = options
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise click.BadParameter(f"{key!r} nests under a plain value",
                                         param_hint="--storage-option")
        node[leaf] = _value(value)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if url.startswith(("s3://", "s3a://")) and endpoint:
        options.setdefault("client_kwargs", {}).setdefault("endpoint_url", endpoint)
    return options or None
