"""fsspec backends for remote datasets: which import here (only those you use matter)."""

from __future__ import annotations

import importlib

from shardkit.doctor.findings import Finding

#: (URL schemes, module, pip package).
BACKENDS: tuple[tuple[str, str, str], ...] = (
    ("s3://", "s3fs", "s3fs"),
    ("gs:// gcs://", "gcsfs", "gcsfs"),
    ("az:// abfs://", "adlfs", "adlfs"),
)


def check_backends() -> list[Finding]:
    """Import each backend of :data:`BACKENDS`; a missing one is a note (needed only for its
    URLs)."""
    findings = []
    for schemes, module, package in BACKENDS:
        try:
            imported = importlib.import_module(module)
        except ImportError as err:
            findings.append(Finding(module, "note",
                                    f"not installed ({err}): {schemes} URLs unavailable",
                                    fix=f"pip install {package} (only if you read or write "
                                        f"{schemes})"))
        except Exception as err:  # a broken install (e.g. mismatched aiobotocore) is worth naming
            findings.append(Finding(module, "note",
                                    f"installed but fails to import: {type(err).__name__}: {err}",
                                    fix=f"pip install --upgrade {package} (its dependencies "
                                        "disagree)"))
        else:
            findings.append(Finding(module, "ok",
                                    f"{getattr(imported, '__version__', '?')}: {schemes}"))
    return findings
