"""Python, torch, torchvision, CUDA, cuDNN, the driver, GPUs, nvJPEG and Triton.

Everything CUDA-related is imported inside the checks, never at import time.
"""

from __future__ import annotations

import io
import platform
import shutil
import subprocess
import sys
import warnings
from typing import Any

from shardkit.doctor.findings import Finding

_TORCH_FIX = "pip install torch torchvision (matching builds: https://pytorch.org/get-started/locally/)"


def _nvidia_smi() -> list[str]:
    """``name, driver_version, memory.total`` per GPU from nvidia-smi, or ``[]``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return ([line.strip() for line in out.stdout.splitlines() if line.strip()]
            if out.returncode == 0 else [])


def _cudnn(torch: Any) -> str:
    try:
        return str(torch.backends.cudnn.version())
    except Exception as err:  # a doctor reports, never crashes
        return f"unknown ({type(err).__name__}: {err})"


def _gpus(torch: Any) -> list[Finding]:
    try:
        found = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            found.append(Finding(f"GPU {i}", "ok",
                                 f"{props.name}, {props.total_memory / 2**30:.0f} GiB, "
                                 f"compute capability {props.major}.{props.minor}"))
    except Exception as err:
        return [Finding("GPUs", "problem", f"cannot be listed: {type(err).__name__}: {err}",
                        fix="check the driver: nvidia-smi")]
    return (found or [Finding("GPUs", "problem", "CUDA reports no device",
                              fix="check the driver: nvidia-smi")])


def _tiny_jpeg() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 60)).save(out, "JPEG")
    return out.getvalue()


def _check_nvjpeg(torch: Any) -> Finding:
    try:
        # torchvision 0.29 deprecates torchvision.io in favour of torchcodec
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import torchvision.io

        data = torch.frombuffer(bytearray(_tiny_jpeg()), dtype=torch.uint8)
        image = torchvision.io.decode_jpeg(data, device="cuda")
        torch.cuda.synchronize()
        if tuple(image.shape) != (3, 16, 16) or image.device.type != "cuda":
            raise RuntimeError(f"decoded to {tuple(image.shape)} on {image.device}")
    except Exception as err:  # any failure means the GPU route decodes on the CPU
        return Finding("nvJPEG", "problem",
                       f"decode_jpeg(device='cuda') failed: {type(err).__name__}: {err}; "
                       "the GPU route decodes JPEGs on the CPU instead (slower)",
                       fix=f"install a torchvision built for this torch and CUDA ({_TORCH_FIX})")
    return Finding("nvJPEG", "ok", "decoded a test JPEG on the GPU; " + _gray_note(torch))


def _gray_note(torch: Any) -> str:
    """Where the GPU routes decode grayscale JPEGs on this device, said in a few words."""
    from shardkit.codec.nvjpeg import gpu_decode_unavailable, gpu_decodes_gray

    device = torch.device("cuda")
    try:
        why_not = gpu_decode_unavailable(device)
        on_device = why_not is None and gpu_decodes_gray(device)
    except Exception as err:  # the probe itself failed: the routes then decode them in the workers
        return f"grayscale JPEGs are decoded by the workers (the probe failed: {type(err).__name__})"
    if why_not is not None:
        return f"but the GPU routes' batched decoder does not run ({why_not})"
    if on_device:
        return "grayscale JPEGs too (three equal channels, as PIL converts them)"
    return "grayscale JPEGs are decoded by the workers (this decoder does not match PIL's conversion)"


def _check_triton(torch: Any) -> Finding:
    try:
        from shardkit.doctor import _triton_probe

        _triton_probe.probe(torch)
    except Exception as err:  # missing, or no compiler/driver for it
        return Finding("Triton", "problem",
                       f"{type(err).__name__}: {err}; GPU crop-resize falls back to "
                       "eager PyTorch (slower)",
                       fix="pip install triton (the version your torch pins)")
    import triton

    return Finding("Triton", "ok", f"{triton.__version__}: compiled and ran a test kernel")


def check_platform() -> list[Finding]:
    """Versions, GPUs and the GPU decode/resize route. Without CUDA, GPU checks are notes."""
    findings = [Finding("python", "ok", f"{platform.python_version()} ({sys.executable})")]
    try:
        import torch
    except Exception as err:
        return [*findings, Finding("torch", "problem",
                                   f"does not import: {type(err).__name__}: {err}", fix=_TORCH_FIX)]
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    findings.append(Finding("torch", "ok", f"{torch.__version__} ({build})"))
    try:
        # torchvision 0.29 deprecates torchvision.io in favour of torchcodec
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import torchvision

        findings.append(Finding("torchvision", "ok", torchvision.__version__))
    except Exception as err:
        findings.append(Finding("torchvision", "problem",
                                f"does not import: {type(err).__name__}: {err}", fix=_TORCH_FIX))
    smi = _nvidia_smi()
    if not torch.cuda.is_available():
        why = "torch is a CPU-only build" if not torch.version.cuda else "no GPU or driver visible"
        findings.append(Finding("CUDA", "note",
                                f"not available ({why}): the CPU route only; nvJPEG and Triton "
                                "not checked",
                                fix=None if not smi else "nvidia-smi sees GPUs: " + _TORCH_FIX))
        return findings
    driver = smi[0].split(", ")[1] if smi else "unknown (no nvidia-smi)"
    findings.append(Finding("CUDA", "ok", f"{torch.version.cuda}, cuDNN {_cudnn(torch)}, "
                            f"driver {driver}"))
    findings.extend(_gpus(torch))
    findings.append(_check_nvjpeg(torch))
    findings.append(_check_triton(torch))
    return findings
