"""NVIDIA DALI's own ``fn.readers.webdataset`` on shardkit shards, through our ``.dali.idx`` files.

DALI reads the shards at the offsets our index files give (it does not scan the tars when
``index_paths`` is set), decodes every image, and must yield each sample once with its label,
pixel for pixel what ShardLoader yields. The decoder runs on the CPU here (``device_id=None``:
DALI needs no GPU for that) and on the GPU (``device="mixed"``) where CUDA is available.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from sample_data.generate import decode_index, index_color
from shardkit import ShardLoader
from shardkit.cli import cli
from shardkit.format.dali_index import dali_index_name
from shardkit.index import read_manifest
from shardkit.storage import Store
from tests.conftest import encode_image, write_tree

dali = pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install nvidia-dali-cuda130)")

CLASSES = 3
PER_CLASS = 7
DECODERS = ["cpu", pytest.param("mixed", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


def _indexed_tree(root: Path) -> dict[int, int]:
    """An ImageFolder tree of JPEG and PNG images whose colour encodes their index; index -> label."""
    files, labels = {}, {}
    for i in range(CLASSES * PER_CLASS):
        label = i // PER_CLASS
        fmt, ext = ("PNG", "png") if i % 4 == 0 else ("JPEG", "jpg")
        files[f"c{label}/{i:03d}.{ext}"] = encode_image((20 + i % 5, 16), fmt=fmt, color=index_color(i))
        labels[i] = label
    write_tree(root, files)
    return labels


def _dali_read(root: Path, decoder: str) -> list[tuple[int, int, np.ndarray]]:
    """One epoch of DALI's webdataset reader over the shards of ``root`` (in order, no shuffle):
    ``(pixel index, label, HWC uint8 image)`` per sample."""
    from nvidia.dali import fn, pipeline_def, types

    names = [s.url for s in read_manifest(Store(str(root))).shards]
    tars = [str(root / name) for name in names]
    index_paths = [str(root / dali_index_name(name)) for name in names]

    @pipeline_def(batch_size=4, num_threads=2, device_id=0 if decoder == "mixed" else None, seed=0)
    def pipe() -> Any:
        images, labels = fn.readers.webdataset(paths=tars, index_paths=index_paths, ext=["jpg;jpeg;png", "cls"],
                                               missing_component_behavior="error", name="reader")
        return fn.decoders.image(images, device=decoder, output_type=types.RGB), labels

    p = pipe()
    p.build()
    size = p.epoch_size("reader")
    out: list[tuple[int, int, np.ndarray]] = []
    while len(out) < size:  # the last batch runs into the next epoch: keep the first `size` samples
        images, labels = p.run()
        if decoder == "mixed":
            images = images.as_cpu()
        for i in range(len(images)):
            image = np.array(images.at(i))
            out.append((decode_index(image), int(bytes(np.array(labels.at(i))).decode("ascii")), image))
    return out[:size]


def _shardloader(root: Path) -> dict[int, tuple[int, np.ndarray]]:
    """pixel index -> (label, HWC uint8 image) as ShardLoader's CPU route decodes them."""
    out: dict[int, tuple[int, np.ndarray]] = {}
    with ShardLoader(str(root), batch_size=4, shuffle=False, drop_last=False) as loader:
        for images, labels in loader:
            for image, label in zip(images, labels, strict=True):
                out.setdefault(decode_index(image), (int(label), image.permute(1, 2, 0).numpy()))
    return out


def _check(read: Sequence[tuple[int, int, np.ndarray]], labels: dict[int, int],
           reference: dict[int, tuple[int, np.ndarray]], *, max_diff: int) -> None:
    assert sorted(index for index, _, _ in read) == sorted(labels)  # every sample, once
    assert {index: label for index, label, _ in read} == labels
    for index, label, image in read:
        assert reference[index][0] == label
        assert image.shape == reference[index][1].shape
        assert np.abs(image.astype(np.int16) - reference[index][1]).max() <= max_diff, index


@pytest.mark.parametrize("decoder", DECODERS)
def test_dali_reads_packed_shards_through_our_index(tmp_path: Path, decoder: str) -> None:
    labels = _indexed_tree(tmp_path / "src")
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--max-count", "5",
                                      "--dali-index", "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output
    assert len(read_manifest(Store(str(tmp_path / "out"))).shards) == 5  # the last one partial
    read = _dali_read(tmp_path / "out", decoder)
    # DALI's CPU decoder and ours are both libjpeg-turbo: identical; nvJPEG rounds differently
    _check(read, labels, _shardloader(tmp_path / "out"), max_diff=0 if decoder == "cpu" else 2)


@pytest.mark.parametrize("decoder", DECODERS)
def test_dali_reads_adopted_shardwriter_shards_through_our_index(tmp_path: Path, decoder: str) -> None:
    """webdataset's ShardWriter (PAX headers before every member, no json), adopted in place."""
    wds = pytest.importorskip("webdataset")
    root = tmp_path / "wds"
    root.mkdir()
    labels = {}
    with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=6, verbose=0) as sink:
        for i in range(CLASSES * PER_CLASS):
            ext, fmt = [("png", "PNG"), ("jpeg", "JPEG"), ("jpg", "JPEG")][i % 3]
            labels[i] = i % CLASSES
            sink.write({"__key__": f"s{i:04d}", ext: encode_image((16, 12), fmt=fmt, color=index_color(i)),
                        "cls": str(i % CLASSES).encode()})
    assert b"PaxHeader" in (root / "train-000000.tar").read_bytes()
    result = CliRunner().invoke(cli, ["index", str(root), "--dali-index"])
    assert result.exit_code == 0, result.output
    read = _dali_read(root, decoder)
    _check(read, labels, _shardloader(root), max_diff=0 if decoder == "cpu" else 2)


def test_dali_really_reads_our_offsets(tmp_path: Path) -> None:
    """The index is what DALI follows: offsets moved back to the member headers break its decode."""
    _indexed_tree(tmp_path / "src")
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--max-count", "5",
                                      "--dali-index", "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output
    for path in (tmp_path / "out").glob("*.dali.idx"):
        header, *lines = path.read_text().splitlines()
        moved = []
        for line in lines:
            parts = line.split()
            parts[1::4] = [str(int(offset) - 512) for offset in parts[1::4]]
            moved.append(" ".join(parts))
        path.write_text("\n".join([header, *moved]) + "\n")
    with pytest.raises(RuntimeError):
        _dali_read(tmp_path / "out", "cpu")


def test_dali_reads_captioned_shards_through_our_index(tmp_path: Path) -> None:
    """Packed image-text pairs with --dali-index: DALI's reader gives every image (the pixels
    ShardLoader decodes) with its caption."""
    from nvidia.dali import fn, pipeline_def, types

    from tests.trees import make_caption_folder

    captions = make_caption_folder(tmp_path / "src", classes=2, per_class=3)
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--format", "captions",
                                      "--max-count", "4", "--dali-index", "--workers", "1"])
    assert result.exit_code == 0, result.output
    names = [s.url for s in read_manifest(Store(str(tmp_path / "out"))).shards]

    @pipeline_def(batch_size=4, num_threads=2, device_id=None, seed=0)
    def pipe() -> Any:
        images, texts = fn.readers.webdataset(
            paths=[str(tmp_path / "out" / n) for n in names], ext=["jpg", "txt"], name="reader",
            index_paths=[str(tmp_path / "out" / dali_index_name(n)) for n in names], missing_component_behavior="error")
        return fn.decoders.image(images, device="cpu", output_type=types.RGB), texts

    p = pipe()
    p.build()
    size = p.epoch_size("reader")
    read: list[tuple[str, np.ndarray]] = []
    while len(read) < size:
        images, texts = p.run()
        read += [(bytes(np.array(texts.at(i))).decode("utf-8"), np.array(images.at(i))) for i in range(len(images))]
    read = read[:size]
    reference = {}
    with ShardLoader(str(tmp_path / "out"), batch_size=4, shuffle=False) as loader:
        for images, texts in loader:
            reference.update({text: image.permute(1, 2, 0).numpy() for image, text in zip(images, texts, strict=True)})
    assert sorted(text for text, _ in read) == sorted(captions.values())
    for text, image in read:
        assert image.shape == reference[text].shape
        assert np.abs(image.astype(np.int16) - reference[text]).max() <= 1, text
