"""``shardkit doctor``: each check's verdict and fix, and the command (CPU-only machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.doctor import LoaderPlan, diagnose, extensions
from shardkit.doctor.backends import check_backends
from shardkit.doctor.gpu import check_platform
from shardkit.doctor.resources import check_cores, check_open_files, check_shm
from tests.cli.terminal import run_in_pty, shardkit_argv

PLAN = LoaderPlan(workers=8, batch_size=256, size=224)
MEMFD = hasattr(os, "memfd_create")
SHARED = "shared memory" if MEMFD else "/dev/shm"  # where the loader's batches live (Linux: memfd segments)


def test_shm_need_follows_the_loader_rule() -> None:
    assert PLAN.shm_bytes == 8 * (2 + 3) * 256 * 3 * 224 * 224
    assert LoaderPlan(workers=2, batch_size=4, size=10, prefetch=5).shm_bytes == 2 * 8 * 4 * 3 * 100


def test_shm() -> None:
    need = PLAN.shm_bytes  # 1.5 GiB
    small = check_shm(PLAN, 64 * 2**20)  # Docker's default 64 MiB
    assert small.status == "problem" and "SIGBUS" in small.detail
    assert small.fix is not None and "--shm-size=2g" in small.fix and "fewer --workers" in small.fix
    assert check_shm(PLAN, need * 3 // 2).status == "note"
    assert check_shm(PLAN, need * 4).status == "ok"
    assert check_shm(PLAN, None).status == "note"


def test_shm_with_memfd_is_bounded_by_memory_not_by_dev_shm() -> None:
    """On Linux the batches are memfd segments: Docker's 64 MiB /dev/shm is no limit, memory is."""
    need = PLAN.shm_bytes
    docker = check_shm(PLAN, 64 * 2**20, memfd=True, available=need * 4)
    assert docker.check == "shared memory" and docker.status == "ok"
    assert "in memfd segments, not in /dev/shm; " in docker.detail
    short = check_shm(PLAN, 64 * 2**20, memfd=True, available=need // 2)
    assert short.status == "problem" and "killed for memory" in short.detail
    assert short.fix is not None and "fewer --workers" in short.fix and "--memory=" in short.fix
    assert check_shm(PLAN, None, memfd=True, available=need * 3 // 2).status == "note"
    assert check_shm(PLAN, None, memfd=True, available=None).status == "ok"


def test_open_files() -> None:
    low = check_open_files(PLAN, 256, 4096)
    assert low.status == "problem" and low.fix == "ulimit -n 4096 in the shell that starts training"
    capped = check_open_files(PLAN, 256, 512)
    assert (capped.status == "problem" and capped.fix is not None
            and "nofile=65536:65536" in capped.fix)
    assert (check_open_files(LoaderPlan(64, 8, 8), 1024, -1).fix
            == "ulimit -n 4096 in the shell that starts training")
    assert (check_open_files(PLAN, 1024, -1).status == "ok"
            and check_open_files(PLAN, -1, -1).status == "ok")


def test_cores() -> None:
    over = check_cores(PLAN, 4)
    assert (over.status == "problem"
            and over.fix == "--workers 3 (one core left for the training process)")
    assert check_cores(PLAN, 8).status == "note" and check_cores(PLAN, 16).status == "ok"


def test_missing_extension_names_the_headers_per_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extensions, "EXTENSIONS", (("shardkit._no_such_ext", True,
                                                    "region decode: lost"),
                                                   ("shardkit._no_such_planar", False,
                                                    "numpy fallback")))
    jpeg, planar = extensions.check_extensions()
    assert (jpeg.status == "problem" and jpeg.check == "_no_such_ext"
            and "region decode: lost" in jpeg.detail)
    assert jpeg.fix is not None
    for package in ("libjpeg62-turbo-dev", "libjpeg-turbo8-dev",
                    "conda install -c conda-forge libjpeg-turbo"):
        assert package in jpeg.fix
    assert planar.status == "problem" and planar.fix is not None and "libjpeg" not in planar.fix


def test_built_extensions_report_their_libjpeg() -> None:
    roi = pytest.importorskip("shardkit.codec._jpeg_region")
    linked = extensions.linked_libjpeg(roi.__file__)
    if linked is None:
        pytest.skip("no ldd, or libjpeg linked statically")
    lib, version = linked
    assert "libjpeg" in lib
    found = {f.check: f for f in extensions.check_extensions()}["_jpeg_region"]
    assert lib in found.detail
    assert (found.status == "ok") == (version is not None)


def test_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardkit.doctor import backends

    monkeypatch.setattr(backends, "BACKENDS",
                        (("s3://", "s3fs", "s3fs"), ("zz://", "shardkit_no_such_fs", "zzfs")))
    s3, missing = check_backends()
    assert (s3.status == "ok" and missing.status == "note"
            and missing.fix == "pip install zzfs (only if you read or write zz://)")


def test_gpu_checks_are_notes_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    found = {f.check: f for f in check_platform()}
    assert found["torch"].status == "ok" and found["CUDA"].status == "note"
    assert "nvJPEG" not in found and "Triton" not in found


def test_broken_gpu_route_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a real GPU is present: the failure path cannot be forced this way")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA claimed, nothing behind it
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    found = {f.check: f for f in check_platform()}
    assert found["GPUs"].status == "problem" and "no device" in found["GPUs"].detail
    assert (found["nvJPEG"].status == "problem"
            and "decodes JPEGs on the CPU instead" in found["nvJPEG"].detail)
    assert found["Triton"].status == "problem" and found["Triton"].fix is not None


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["doctor", *args])


def test_command_exit_code_follows_the_problems() -> None:
    result = _cli("--json", "--workers", "1", "--batch-size", "2", "--size", "8")
    doc = json.loads(result.output)
    problems = [f for f in doc["findings"] if f["status"] == "problem"]
    assert result.exit_code == (1 if problems else 0)
    assert doc["plan"] == {"workers": 1, "batch_size": 2, "size": 8, "prefetch": 2}
    checks = [f["check"] for f in doc["findings"]]
    for check in ("python", "torch", "torchvision", "CUDA", "_jpeg_region", "_jpeg_restart",
                  "_planar", SHARED, "ulimit -n", "cores", "s3fs"):
        assert check in checks


def test_command_reports_too_many_workers_and_too_little_shm() -> None:
    result = _cli("--workers", "4096", "--batch-size", "4096", "--size", "1024")
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.splitlines()
    assert any(line.startswith("PROBLEM  cores") for line in lines)
    assert any(line.startswith(f"PROBLEM  {SHARED}") for line in lines)
    if MEMFD:
        assert any("fix: fewer --workers or a smaller --batch-size" in line for line in lines)
    else:
        assert any("fix: give /dev/shm at least" in line and "--shm-size=" in line for line in lines)
    assert "problem(s) that break or slow training: " in lines[-1] and "cores" in lines[-1]


def test_import_pulls_in_no_torch() -> None:
    code = ("import sys, shardkit.doctor, shardkit.cli.doctor; "
            "print([m for m in ('torch', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    assert out.stdout.strip() == "[]"


def test_doctor_in_a_terminal() -> None:
    seen = run_in_pty(shardkit_argv("doctor", "--workers", "1", "--batch-size", "2", "--size", "8"),
                      columns=120)
    assert "Traceback" not in seen.text
    last = [line for line in seen.lines if line.strip()][-1]
    assert last == "no problems found" or "problem(s) that break or slow training" in last
    assert seen.returncode == (0 if last == "no problems found" else 1)
    assert any(line.startswith(("ok       python", "ok       torch")) for line in seen.lines)


def test_diagnose_runs_every_concern() -> None:
    checks = {f.check for f in diagnose(LoaderPlan(1, 2, 8))}
    assert {"python", "_planar", SHARED, "s3fs"} <= checks


def test_nvjpeg_finding_says_where_grayscale_jpegs_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nvJPEG line says whether the GPU routes send grayscale JPEGs to the device (the probe
    of shardkit.codec.nvjpeg.gpu_decodes_gray) or leave them to the workers, and why."""
    import torch

    from shardkit.codec import nvjpeg
    from shardkit.doctor.gpu import _gray_note

    def failing(_device: torch.device) -> bool:
        raise RuntimeError("driver gone")

    monkeypatch.setattr(nvjpeg, "gpu_decode_unavailable", lambda _d: None)
    for probe, words in ((lambda _d: True, "grayscale JPEGs too"),
                         (lambda _d: False, "decoded by the workers (this decoder does not match"),
                         (failing, "decoded by the workers (the probe failed: RuntimeError)")):
        monkeypatch.setattr(nvjpeg, "gpu_decodes_gray", probe)
        assert words in _gray_note(torch)
    monkeypatch.setattr(nvjpeg, "gpu_decode_unavailable", lambda _d: "nvJPEG decode failed: no op")
    assert "batched decoder does not run (nvJPEG decode failed: no op)" in _gray_note(torch)
