"""The DALI contender of ``shardkit bench --train``, run as a CPU-only DALI pipeline: what it
delivers (ShardLoader's GPU-route batch: bf16, channels_last, normalised) and that each image
arrives with its own label. The CUDA run (mixed decode) is left to the GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from sample_data.generate import decode_index, make_indexed_imagefolder
from shardkit.bench.dali import MEAN, STD, ascii_labels
from shardkit.bench.train import TrainBenchConfig, format_train_table, run_train_bench
from shardkit.cli import cli
from shardkit.index.dali import write_dali_indexes
from shardkit.pack import PackOptions, pack

PER_CLASS = 6


def test_ascii_labels() -> None:
    rows = torch.tensor([[49, 48, 55], [57, 0, 0], [48, 0, 0]], dtype=torch.uint8)  # "107", "9", "0"
    assert ascii_labels(rows).tolist() == [107, 9, 0]
    for bad in ([[49, 32]], [[0, 0]], [[45, 49]]):  # a space, no digit, a minus sign
        with pytest.raises(ValueError, match="not ASCII digits"):
            ascii_labels(torch.tensor(bad, dtype=torch.uint8))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An indexed ImageFolder tree (3 classes x 6) and its packed shards with DALI index files."""
    root = tmp_path_factory.mktemp("dali")
    make_indexed_imagefolder(root / "tree", classes=3, per_class=PER_CLASS, size=(40, 30))
    pack(str(root / "tree"), str(root / "shards"), options=PackOptions(max_count=5), workers=1)
    write_dali_indexes(str(root / "shards"))
    return root / "tree", root / "shards"


@pytest.mark.parametrize("reader", ["webdataset", "file"])
def test_batches_are_shardloaders_format_with_each_images_label(indexed: tuple[Path, Path], reader: str) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    from shardkit.bench.dali import DaliTrainLoader

    tree, shards = indexed
    loader = DaliTrainLoader(reader, str(shards if reader == "webdataset" else tree), size=24, batch_size=4,
                             threads=2, device="cpu")
    assert loader.indexed == (reader == "webdataset")
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    batches = 0
    for _epoch in range(2):  # each iter() an epoch: 18 images, 4 whole batches
        for images, labels in loader:
            batches += 1
            assert images.shape == (4, 3, 24, 24) and images.dtype == torch.bfloat16
            assert images.is_contiguous(memory_format=torch.channels_last)
            assert labels.dtype == torch.int64
            for image, label in zip(images, labels, strict=True):
                pixels = (image.float() * std + mean).round().clamp(0, 255).to(torch.uint8)
                assert decode_index(pixels) // PER_CLASS == int(label)  # crop and flip keep a flat colour
    assert batches == 8
    loader.close()


def test_shards_without_index_files_get_temporary_ones(indexed: tuple[Path, Path], tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """DALI scanning unindexed tars prints a C++ log line nobody can turn off: the loader writes the
    index files into a temporary directory instead, and removes it when closed."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    from shardkit.bench.dali import DaliTrainLoader

    tree, _shards = indexed
    plain = tmp_path / "plain"
    pack(str(tree), str(plain), options=PackOptions(max_count=5), workers=1)
    loader = DaliTrainLoader("webdataset", str(plain), size=24, batch_size=4, threads=2, device="cpu")
    assert not loader.indexed and loader._made_indexes is not None
    made = Path(loader._made_indexes.name)
    assert len(list(made.glob("*.dali.idx"))) == len(list(plain.glob("*.tar")))
    assert sum(len(labels) for _images, labels in loader) == 16  # 18 images, whole batches of 4
    loader.close()
    assert not made.exists() and not list(plain.glob("*.dali.idx"))  # the dataset is left as it was
    assert "Index file not provided" not in capfd.readouterr().err


def test_train_bench_has_dali_rows(indexed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    from shardkit.bench import train

    tree, shards = indexed
    cfg = TrainBenchConfig(imagefolder=str(tree), shards=str(shards), model="resnet18", size=32, batch_size=4,
                           workers=1, steps=2, warmup=0, repeats=1, device="cpu", compile=False,
                           contenders=("dali", "dali_files"), dali_threads=(1, 2), isolate=False)
    report = run_train_bench(cfg)
    assert [(r["name"], r["label"]) for r in report["results"]] == [
        ("dali@1", "NVIDIA DALI webdataset (its .dali.idx), 1 thread"),
        ("dali@2", "NVIDIA DALI webdataset (its .dali.idx), 2 threads"),
        ("dali_files@1", "NVIDIA DALI readers.file (ImageFolder), 1 thread"),
        ("dali_files@2", "NVIDIA DALI readers.file (ImageFolder), 2 threads")]
    assert all(r["fed_images_per_second"]["median"] > 0 for r in report["results"])
    assert "NVIDIA DALI webdataset (its .dali.idx), 2 threads" in format_train_table(report)

    asked: list[tuple[str, ...]] = []

    def record(cfg: TrainBenchConfig, **_: object) -> dict[str, object]:
        asked.append(cfg.contenders)
        raise ValueError("recorded")

    monkeypatch.setattr(train, "run_train_bench", record)
    args = ["bench", str(tree), "--shards", str(shards), "--train", "resnet18", "-q"]
    assert CliRunner().invoke(cli, args).exit_code == 1  # "error: recorded"
    assert CliRunner().invoke(cli, [*args, "--contender", "dali_files", "--contender", "shardloader"]).exit_code == 1
    assert asked == [("imagefolder", "shardloader", "dali"), ("dali_files", "shardloader")]  # dali when installed
