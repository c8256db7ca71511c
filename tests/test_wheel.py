"""The wheel, as a user gets it: ``python -m build`` makes an sdist and a wheel; the wheel installs
into a clean virtual environment and ``make demo``'s steps run from it, outside the checkout, with
the C extensions built into it.

The clean environment takes its dependencies (torch and the rest, gigabytes) from the test
environment through a ``.pth`` line placed after its own site-packages, so ``import shardkit``
finds the installed wheel and never the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"

pytestmark = pytest.mark.slow


def _outside() -> dict[str, str]:
    """The environment without what points into the checkout or the test environment."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: build with this environment's setuptools (no download); the project is
    # copied first so the build leaves nothing (build/, *.egg-info) in the checkout.
    src = tmp_path_factory.mktemp("src") / "shardkit"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_file():
            target.write_bytes((ROOT / rel).read_bytes())
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)], ROOT, dict(os.environ))
    return out


@pytest.fixture(scope="module")
def clean_env(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    [wheel] = dist.glob("*.whl")
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
         venv, _outside())
    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", ask], capture_output=True, text=True,
                             check=True).stdout.strip()
    # the dependencies, after the clean environment's own site-packages
    Path(purelib, "zz_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def test_build_gives_an_sdist_and_a_wheel_with_the_c_extensions(dist: Path) -> None:
    [sdist] = dist.glob("shardkit-*.tar.gz")
    [wheel] = dist.glob("shardkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "shardkit/py.typed" in names
    for ext in ("shardkit/codec/_jpeg_region", "shardkit/codec/_jpeg_restart", "shardkit/transforms/_planar"):
        assert any(n.startswith(ext) and n.endswith(".so") for n in names), ext
    assert not any(n.startswith(("tests/", "benchmarks/", "pipelines/")) for n in names)
    assert sdist.stat().st_size > 0


def test_the_wheel_runs_doctor_and_the_demo_outside_the_checkout(clean_env: Path, tmp_path: Path) -> None:
    env = _outside()
    bin_dir = clean_env / "bin"
    where = _run([str(bin_dir / "python"), "-c", "import shardkit; print(shardkit.__file__)"], tmp_path, env)
    assert where.startswith(str(clean_env)), where
    doctor = _run([str(bin_dir / "python"), "-m", "shardkit", "doctor"], tmp_path, env)
    for ext in ("_jpeg_region", "_jpeg_restart", "_planar"):
        assert any(line.startswith("ok") and ext in line and str(clean_env) in line
                   for line in doctor.splitlines()), doctor
    shardkit = [str(bin_dir / "shardkit")]
    _run([*shardkit, "pack", str(SAMPLE / "imagefolder"), "ifo", "--max-count", "64", "--seed", "0", "--uniform-names",
          "-q"], tmp_path, env)
    _run([*shardkit, "verify", "ifo", "--decode"], tmp_path, env)
    assert "samples" in _run([*shardkit, "info", "ifo"], tmp_path, env)
    _run([*shardkit, "pack", str(SAMPLE / "coco" / "images"), "--annotations", str(SAMPLE / "coco" / "instances.json"),
          "coco", "--max-count", "8", "-q"], tmp_path, env)
    _run([*shardkit, "verify", "coco", "--decode"], tmp_path, env)
    _run([*shardkit, "bench", str(SAMPLE / "imagefolder"), "--shards", "ifo", "--workers", "1", "--batch-size", "32",
          "--epochs", "1", "--repeats", "1", "--warmup", "1", "--size", "64", "--out", "bench.json"], tmp_path, env)
    assert (tmp_path / "bench.json").stat().st_size > 0
