"""What the loader says when Ray refuses to connect: one line with the cause, and the fix where
the cluster wants a token (Ray 2.60 gives the refusal as text inside "Failed to connect to GCS")."""

from __future__ import annotations

from shardkit._ray_reach import why_not_joined as _why


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def test_a_token_refusal_in_the_text_of_an_error_says_what_to_set() -> None:
    refused = RuntimeError("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                           '  File "ray/_private/gcs_utils.py", line 120, in check_health\n'
                           "ray.exceptions.RpcError: InvalidAuthToken: the token does not match\n")
    said = _why(_chained(ConnectionError("cannot connect"), refused))
    assert said.startswith("the cluster uses token authentication and refused this process: set RAY_AUTH_MODE=token")


def test_a_traceback_given_as_text_is_said_by_its_last_line() -> None:
    err = RuntimeError("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                       '  File "x.py", line 1, in f\n'
                       "ConnectionRefusedError: [Errno 111] Connection refused\n")
    assert _why(err) == ("RuntimeError: Failed to connect to GCS. Last connection error: "
                         "ConnectionRefusedError: [Errno 111] Connection refused")
    assert _why(ValueError("plain words\nmore")) == "ValueError: plain words"
