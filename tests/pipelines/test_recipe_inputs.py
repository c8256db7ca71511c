"""The recipes refuse, in one line naming the file, checkpoints they cannot use (a bare
state_dict, a damaged file, another recipe's) and a batch size no epoch can fill, before they
train: a run that trains nothing must not save a checkpoint that later runs resume from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pipelines import evaluate_classifier, evaluate_detector, train_classifier
from shardkit.pack import PackOptions, pack, pack_coco
from tests.pipelines.conftest import SAMPLE, refused

COCO = SAMPLE.parent / "coco"

CPU = ["--device", "cpu", "--workers", "0", "--size", "16"]


def test_checkpoints_a_recipe_cannot_use_are_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    bare = tmp_path / "bare.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), bare)
    err = refused(evaluate_classifier.main, [str(packed_sample), "--checkpoint", str(bare), *CPU], capsys)
    assert f"{bare}: is not a checkpoint of train_classifier.py: it has no 'model', 'arch', 'num_classes'" in err
    assert "bare state_dict" in err
    err = refused(train_classifier.main, [str(packed_sample), "--checkpoint", str(bare), "--batch-size", "4",
                                           "--steps", "1", *CPU], capsys)
    assert (f"{bare}: is not a checkpoint of this training recipe: it has no 'model', 'optimizer', 'loader', "
            "'step'") in err

    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a torch file at all")
    err = refused(evaluate_classifier.main, [str(packed_sample), "--checkpoint", str(damaged), *CPU], capsys)
    assert f"{damaged}: cannot be read as a checkpoint: not a file torch.save wrote, or a damaged one (" in err
    damaged.write_bytes(b"junk\n")  # torch's error is a bare KeyError(174812789): named with its type
    err = refused(evaluate_classifier.main, [str(packed_sample), "--checkpoint", str(damaged), *CPU], capsys)
    assert err.rstrip().endswith("or a damaged one (KeyError: 174812789)"), err

    ckpt = tmp_path / "ck.pt"
    train_classifier.main([str(packed_sample), "--steps", "1", "--checkpoint", str(ckpt), "--batch-size", "4", *CPU])
    arch = torch.load(ckpt)["arch"]
    other = "resnet50" if arch != "resnet50" else "resnet18"
    err = refused(train_classifier.main, [str(packed_sample), "--steps", "2", "--checkpoint", str(ckpt),
                                           "--batch-size", "4", "--arch", other, *CPU], capsys)
    assert (f"{ckpt}: cannot resume from it: it holds a {arch} model, and --arch is {other} (the same command "
            f"with --arch {arch}, or another --checkpoint)") in err
    coco = tmp_path / "coco"
    pack_coco(str(COCO / "images"), str(COCO / "instances.json"), str(coco), options=PackOptions(max_count=8),
              workers=1)
    err = refused(evaluate_detector.main, [str(coco), "--checkpoint", str(ckpt), "--device", "cpu",
                                            "--workers", "0"], capsys)
    assert f"{ckpt}: is not a checkpoint of train_detector.py: it has no 'label_map'" in err

    state = torch.load(ckpt)
    state["model"] = torch.nn.Linear(2, 2).state_dict()  # another model's weights under the right keys
    torch.save(state, ckpt)
    err = refused(evaluate_classifier.main, [str(packed_sample), "--checkpoint", str(ckpt), *CPU], capsys)
    assert f"{ckpt}: its model does not fit this one (" in err


def test_a_validation_set_of_other_classes_is_refused_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    """Its top-1 counted labels that mean other classes: a number, not a score."""
    from sample_data.generate import make_indexed_imagefolder

    make_indexed_imagefolder(tmp_path / "src", classes=3, per_class=2, size=(16, 16))
    pack(str(tmp_path / "src"), str(tmp_path / "val"), workers=1)
    ckpt = tmp_path / "ck.pt"
    err = refused(train_classifier.main, [str(packed_sample), "--val", str(tmp_path / "val"), "--steps", "1",
                                           "--batch-size", "4", "--checkpoint", str(ckpt), *CPU], capsys)
    assert f"--val {tmp_path / 'val'} is not of the training classes: its classes differ from " in err
    assert "in training, 'c000' in the dataset" in err and not ckpt.exists()


def test_a_model_built_for_one_image_size_is_refused_at_another(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    """torchvision's ViTs take the size they are built for; another ended in an AssertionError's
    traceback at the first step."""
    err = refused(train_classifier.main, [str(packed_sample), "--arch", "vit_b_16", "--steps", "1",
                                           "--batch-size", "4", *CPU], capsys)
    assert "--arch vit_b_16 takes 224x224 images only (torchvision builds it for that size), not --size 16: " \
           "pass --size 224" in err


def test_a_batch_larger_than_an_epoch_is_refused_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
        packed_sample: Path) -> None:
    samples = sum(1 for d in SAMPLE.iterdir() for _ in d.iterdir())
    ckpt = tmp_path / "ck.pt"
    err = refused(train_classifier.main, [str(packed_sample), "--batch-size", str(samples + 1), "--epochs", "1",
                                           "--checkpoint", str(ckpt), *CPU], capsys)
    assert f"{packed_sample}: the {samples:,} samples of the training data make no full batch of --batch-size " \
           f"{samples + 1}: lower --batch-size" in err
    assert not [r for r in caplog.records if "no batch" in r.getMessage()]  # said once: the recipe's, before a loader
    assert not ckpt.exists()


def test_throughput_refuses_runs_with_nothing_to_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a small tree it printed 0 img/s for each loader, then a ZeroDivisionError; --repeats 0 a
    StatisticsError."""
    from pipelines import throughput

    samples = sum(1 for d in SAMPLE.iterdir() for _ in d.iterdir())
    for argv, expected in (
            ([str(SAMPLE), "--batch-size", str(samples // 2), "--epochs", "1"],
             f"{samples:,} images make 2 full batches of {samples // 2} per epoch, 2 in 1 epochs: none left to "
             "time after the 5 warm-up batches; lower --batch-size or raise --epochs"),
            ([str(SAMPLE), "--repeats", "0"], "--repeats: must be at least 1, not 0"),
            ([str(SAMPLE), "--workers", "two"], "--workers: invalid int value: 'two'"),
            ([str(tmp_path)], "not an ImageFolder tree"),
            ([str(tmp_path / "nothing")], "no such directory")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            throughput.parse_args(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and expected in err, err


def test_throughput_says_a_shards_folder_it_cannot_use_in_one_line(tmp_path: Path) -> None:
    """A --shards inside the tree, or a file: shardkit's error as one line, not its traceback."""
    from pipelines import throughput

    (tmp_path / "file.pt").write_bytes(b"")
    for shards, expected in ((SAMPLE / "inside", "is inside the source"), (tmp_path / "file.pt", "is a file")):
        with pytest.raises(SystemExit) as exit_:
            throughput.main([str(SAMPLE), "--shards", str(shards)])
        message = str(exit_.value.code)
        assert message.startswith(f"throughput.py: error: {shards}: ") and expected in message, message
    assert not (SAMPLE / "inside").exists()
    from sample_data.coco_gen import make_coco
    from shardkit.pack import pack_coco

    images, annotations = make_coco(tmp_path / "coco", images=5)
    pack_coco(str(images), str(annotations), str(tmp_path / "cocopk"), workers=1)
    with pytest.raises(SystemExit) as exit_:
        throughput.main([str(SAMPLE), "--shards", str(tmp_path / "cocopk")])
    assert f"{tmp_path / 'cocopk'} holds a coco pack, not one of an ImageFolder tree" in str(exit_.value.code)


def test_each_recipe_refuses_another_kind_of_dataset_naming_the_recipe_that_takes_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    """The classifier trained on captions until cross_entropy raised a TypeError; on COCO, and the
    detector on labelled images, the loader's error named its transform options, not the recipe."""
    from pipelines import train_contrastive, train_detector
    from shardkit.pack import pack_captions
    from tests.trees import make_caption_folder

    make_caption_folder(tmp_path / "src", classes=2, per_class=2)
    captions = tmp_path / "captions"
    pack_captions(str(tmp_path / "src"), str(captions), options=PackOptions(max_count=5), workers=1)
    coco = tmp_path / "coco"
    pack_coco(str(COCO / "images"), str(COCO / "instances.json"), str(coco), options=PackOptions(max_count=8),
              workers=1)
    for main, data, said in (
            (train_classifier.main, captions, "holds captioned images; train_classifier.py takes labelled images: "
                                              "pipelines/train_contrastive.py takes this dataset"),
            (train_classifier.main, coco, "holds a COCO detection dataset; train_classifier.py takes labelled "
                                          "images: pipelines/train_detector.py takes this dataset"),
            (evaluate_classifier.main, coco, "holds a COCO detection dataset; evaluate_classifier.py takes "
                                             "labelled images: pipelines/evaluate_detector.py takes this dataset"),
            (train_detector.main, packed_sample, "holds labelled images; train_detector.py takes a COCO detection "
                                                 "dataset: pipelines/train_classifier.py takes this dataset"),
            (evaluate_detector.main, packed_sample, "holds labelled images; evaluate_detector.py takes a COCO "
                                                    "detection dataset: pipelines/evaluate_classifier.py takes this "
                                                    "dataset"),
            (train_contrastive.main, packed_sample, "holds labelled images; train_contrastive.py takes captioned "
                                                    "images: pipelines/train_classifier.py takes this dataset")):
        argv = [str(data), "--batch-size", "2", "--device", "cpu", "--workers", "0"]
        err = refused(main, argv, capsys)
        assert f"{data}: {said}" in err, err


def test_throughput_times_the_same_data_on_every_side(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--shards of another tree was timed against DIR without a word, and the default folder's pack
    of an earlier state of the tree was reused."""
    from pipelines import throughput

    tree = tmp_path / "tree"
    shutil.copytree(SAMPLE, tree)
    other = tmp_path / "other"
    pack(str(tree), str(other), workers=1)
    first = sorted(tree.iterdir())[0]
    shutil.rmtree(first)
    with pytest.raises(SystemExit) as exit_:
        throughput.main([str(tree), "--shards", str(other), "--batch-size", "2"])
    assert str(exit_.value).startswith(f"throughput.py: error: {other} holds ")
    assert "the loaders would not read the same data" in str(exit_.value)

    monkeypatch.setattr(throughput, "default_shards", lambda root: str(other))  # the default folder, stale
    monkeypatch.setattr(throughput, "images_per_second", lambda make, epochs: 1.0)
    throughput.main([str(tree), "--batch-size", "2", "--repeats", "1"])
    out = capsys.readouterr().out
    assert f"{other} holds " in out and ": packing it again" in out
    assert throughput.other_data(str(tree), str(other)) is None
    (sorted(tree.iterdir())[0] / "empty.jpg").write_bytes(b"")  # ImageFolder lists it, the pack skips it
    pack(str(tree), str(other), workers=1, overwrite=True)
    assert throughput.other_data(str(tree), str(other)) is None  # the same data: not packed again each run
