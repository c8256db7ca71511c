"""The one place that picks torchvision or TorchCodec: order, override, EXIF orientation."""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from shardkit.codec import backend
from shardkit.codec.decode import decode_backend, decode_rgb
from shardkit.codec.jpeg_header import exif_orientation
from shardkit.codec.nvjpeg import GpuJpegDecoder, gpu_decode_unavailable

STORED = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8))
# Smooth and asymmetric (every rotation or flip changes it): decoders that differ in chroma
# upsampling (nvJPEG vs libjpeg-turbo) agree closely on it, unlike on noise.
_y, _x = np.mgrid[0:24, 0:40]
SMOOTH = Image.fromarray(np.stack([_x * 6, _y * 10, (_x + 2 * _y) * 3], axis=-1).astype(np.uint8))


def jpeg(orientation: int | None = None, image: Image.Image = STORED, **kw: object) -> bytes:
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=95, exif=exif.tobytes(), **kw)
    return buf.getvalue()


def pil_rgb(data: bytes, transpose: bool = False) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as im:
        shown = ImageOps.exif_transpose(im) if transpose else im
        return torch.from_numpy(np.array(shown.convert("RGB"))).permute(2, 0, 1)


@pytest.fixture
def library() -> Iterator[object]:
    """Select a library through the documented switch; the default order is restored afterwards."""
    yield backend.prefer_decoder
    backend.prefer_decoder(None)


@pytest.mark.parametrize("orientation", [None, 1, 2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_is_read_from_the_header(orientation: int | None) -> None:
    assert exif_orientation(jpeg(orientation)) == (orientation or 0)


def test_exif_orientation_of_other_bytes_is_zero() -> None:
    buf = io.BytesIO()
    STORED.save(buf, "JPEG")
    assert exif_orientation(buf.getvalue()) == 0
    assert exif_orientation(b"\xff\xd8\xff\xe1\x00\x05Exi") == 0  # cut short
    assert exif_orientation(b"not a jpeg") == 0


@pytest.mark.parametrize("orientation", range(1, 9))
def test_undo_exif_orientation_inverts_what_pil_applies(orientation: int) -> None:
    data = jpeg(orientation)
    shown = pil_rgb(data, transpose=True)  # PIL applies the orientation independently of TorchCodec
    assert torch.equal(backend.undo_exif_orientation(shown, orientation), pil_rgb(data))


def test_default_order_takes_the_first_library_that_works() -> None:
    backend.cpu_decoder.cache_clear()
    name, decoder = backend.cpu_decoder()
    assert decode_backend() == (f"shardkit-libjpeg+{name}" if backend.jpeg_by_shardkit() else name)
    assert name in (*backend.CPU_ORDER, "pil")
    assert (decoder is None) == (name == "pil")


def test_pil_override_turns_native_decoding_off(library) -> None:
    library("pil")
    assert decode_backend() == "pil"
    data = jpeg(6)
    assert torch.equal(decode_rgb(data), pil_rgb(data))


def test_torchvision_override(library) -> None:
    pytest.importorskip("torchvision")
    library("torchvision")
    assert decode_backend() == "torchvision"


@pytest.mark.parametrize("orientation", [None, 1, 3, 6, 8])
def test_torchcodec_decodes_like_pil_and_does_not_rotate(library, orientation: int | None) -> None:
    pytest.importorskip("torchcodec.decoders")
    library("torchcodec")
    assert decode_backend() == "torchcodec"
    for data in (jpeg(orientation), jpeg(orientation, progressive=True), jpeg(orientation, subsampling=0)):
        assert torch.equal(decode_rgb(data), pil_rgb(data))


@pytest.mark.parametrize("orientation", range(2, 9))
def test_undo_exif_orientation_inverts_torchcodec(orientation: int) -> None:
    decoders = pytest.importorskip("torchcodec.decoders")
    data = jpeg(orientation)
    shown = decoders.decode_jpeg(data, mode="RGB")  # TorchCodec applies the orientation
    assert torch.equal(shown, pil_rgb(data, transpose=True))
    assert torch.equal(backend.undo_exif_orientation(shown, orientation), pil_rgb(data))


def test_no_gpu_decoder_off_cuda() -> None:
    name, decoder, why = backend.gpu_decoder(torch.device("cpu"))
    assert (name, decoder) == ("", None) and why
    assert gpu_decode_unavailable(torch.device("cpu")) == why


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["torchvision", "torchcodec"])
def test_gpu_libraries_decode_stored_pixels(library, name: str) -> None:
    if name == "torchcodec":
        pytest.importorskip("torchcodec.decoders")
    library(name)
    decoder = GpuJpegDecoder(torch.device("cuda"))
    assert decoder.library == name
    datas = [jpeg(k, image=SMOOTH) for k in (None, 1, 6, 3)]
    out = decoder.decode([torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas])
    for d, img in zip(datas, out, strict=True):
        assert img.is_cuda and img.is_contiguous() and img.shape == (3, SMOOTH.height, SMOOTH.width)
        stored = (img.cpu().int() - pil_rgb(d).int()).abs().float().mean()
        assert stored < 2.0, stored  # the stored pixels, not the EXIF-rotated view
        if exif_orientation(d) == 3:  # same shape rotated: make sure it is not the rotated one
            assert stored < (img.cpu().int() - pil_rgb(d, transpose=True).int()).abs().float().mean()


def test_the_decoders_do_not_import_the_torchvision_package() -> None:
    """torchvision's import loads torch._dynamo (seconds per process): the CPU decoder and the GPU
    route's decoder (run here on the CPU, as the tests run the device pipeline) load only its image
    library."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from shardkit.codec.backend import cpu_decoder, cpu_batch_decoder, _probe_jpeg\n"
            "probe = torch.frombuffer(bytearray(_probe_jpeg()), dtype=torch.uint8)\n"
            "name, one = cpu_decoder(); one(probe, 'jpeg')\n"
            "out = cpu_batch_decoder()([probe, probe], torch.device('cpu'))\n"
            "print(name, [tuple(x.shape) for x in out], 'torchvision' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["torchvision", "[(3,", "8,", "16),", "(3,", "8,", "16)]", "False"]
