"""shardkit's C extensions (built or not, what is lost without each, the libjpeg they link) and the
CRC-32 every sample read is checked with."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess

from shardkit.doctor.findings import Finding

#: (module, needs libjpeg headers, what is lost without it). Keep in step with setup.py.
EXTENSIONS: tuple[tuple[str, bool, str], ...] = (
    ("shardkit.codec._jpeg_region", True,
     "region decode: the loader decodes whole JPEGs instead of the crop"),
    ("shardkit.codec._jpeg_restart", True, "pack --jpeg-restart is refused"),
    ("shardkit.transforms._planar", False,
     "HWC->CHW repacking falls back to numpy (~90 us vs 15 us per 224px crop)"),
    ("shardkit.format._tarspan", False,
     "each sample's tar headers are parsed in Python (about 6x the CPU of that parse)"),
    ("shardkit.codec._jpeg_header", False,
     "each JPEG's frame header is read in Python (about 2x the CPU of that read)"),
    ("shardkit.transforms._draws", False,
     "each image's random crop is drawn in Python (about 2x the CPU of those draws)"),
)

LIBJPEG_HEADERS = ("Debian: apt install libjpeg62-turbo-dev; Ubuntu: apt install "
                   "libjpeg-turbo8-dev; Fedora: dnf install libjpeg-turbo-devel; conda: conda "
                   "install -c conda-forge libjpeg-turbo; macOS: brew install jpeg-turbo")
REBUILD = ("then reinstall shardkit so they compile: pip install --force-reinstall --no-deps . "
           "(in the repository)")
_TURBO = re.compile(rb"libjpeg-turbo version ([0-9][0-9.]*)")


def linked_libjpeg(path: str) -> tuple[str, str | None] | None:
    """The libjpeg the shared object at ``path`` loads (``ldd``) and its libjpeg-turbo version.

    Returns ``(library path, version)``, version ``None`` when the library does not carry a
    libjpeg-turbo version string (IJG libjpeg, or unknown); ``None`` when ``ldd`` is missing or
    names no libjpeg (e.g. macOS, or a static link).
    """
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        out = subprocess.run([ldd, path], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"libjpeg[^\s]*\s+=>\s+(\S+)", out)
    if match is None:
        return None
    lib = match.group(1)
    try:
        with open(lib, "rb") as f:
            found = _TURBO.search(f.read())
    except OSError:
        return lib, None
    return lib, found.group(1).decode() if found else None


def check_extensions() -> list[Finding]:
    """One finding per entry of :data:`EXTENSIONS`: built (and its libjpeg) or what is lost."""
    findings = []
    for name, needs_jpeg, lost in EXTENSIONS:
        short = name.rsplit(".", 1)[-1]
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            fix = (f"install the libjpeg-turbo headers ({LIBJPEG_HEADERS}), {REBUILD}" if needs_jpeg
                   else REBUILD)
            findings.append(Finding(short, "problem", f"not built ({err}): {lost}", fix=fix))
            continue
        detail = f"built ({module.__file__})"
        linked = linked_libjpeg(module.__file__ or "") if needs_jpeg else None
        if linked is not None:
            lib, version = linked
            detail += f", links {lib}" + (f" = libjpeg-turbo {version}" if version
                                          else " (not libjpeg-turbo?)")
            if version is None:
                findings.append(Finding(short, "problem",
                                        detail + ": IJG libjpeg decodes several times slower",
                                        fix=f"install libjpeg-turbo ({LIBJPEG_HEADERS}), "
                                        f"{REBUILD}"))
                continue
        findings.append(Finding(short, "ok", detail))
    return findings


def check_crc() -> Finding:
    """Whether the per-sample CRC-32 (:mod:`shardkit.format.crc`) is zlib-ng's or zlib's slower one."""
    from shardkit.format import crc

    if crc.FAST:
        return Finding("crc32", "ok", "zlib-ng (carry-less multiply)")
    return Finding("crc32", "problem",
                   "zlib's: the checksum of every sample read costs several times more CPU",
                   fix="pip install zlib-ng (a dependency of shardkit that this install lacks)")
