"""The recipes keep their promises: class names saved and checked, defaults in --help,
progress from the first step, advice only of options they take, output outside the checkout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pipelines import evaluate_classifier, train_classifier
from shardkit.pack import pack
from tests.pipelines.conftest import SAMPLE, refused


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed dataset of 2 of the sample's classes, 4 images each: other classes than the sample's."""
    root = tmp_path_factory.mktemp("two")
    for name in sorted(p.name for p in SAMPLE.iterdir())[:2]:
        (root / "tree" / name).mkdir(parents=True)
        for image in sorted((SAMPLE / name).iterdir())[:4]:
            shutil.copy(image, root / "tree" / name / image.name)
    pack(str(root / "tree"), str(root / "ds"), workers=1)
    return root / "ds"


def _train(*args: str) -> dict[str, object]:
    return train_classifier.main([*args, "--batch-size", "4", "--size", "16", "--workers", "0", "--device", "cpu"])


def test_the_checkpoint_names_its_classes_and_evaluation_refuses_other_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], packed_sample: Path, two_classes: Path) -> None:
    ckpt = tmp_path / "ck.pt"
    _train(str(packed_sample), "--steps", "1", "--checkpoint", str(ckpt))
    classes = sorted(p.name for p in SAMPLE.iterdir())
    assert torch.load(ckpt)["classes"] == classes
    capsys.readouterr()
    err = refused(evaluate_classifier.main, [str(two_classes), "--checkpoint", str(ckpt), "--device", "cpu",
                                              "--workers", "0", "--size", "16"], capsys)
    assert f"--checkpoint {ckpt} was not trained on the classes of {two_classes}: it has 10 classes, " \
           f"{two_classes} has 2" in err
    state = torch.load(ckpt)
    state["classes"] = ["a" + c for c in classes]  # as many classes, other names
    torch.save(state, ckpt)
    err = refused(evaluate_classifier.main, [str(packed_sample), "--checkpoint", str(ckpt), "--device", "cpu",
                                              "--workers", "0", "--size", "16"], capsys)
    assert f"at label 0: 'a{classes[0]}' in the checkpoint, '{classes[0]}' in the dataset" in err
    err = refused(train_classifier.main, [str(packed_sample), "--checkpoint", str(ckpt), "--device", "cpu",
                                           "--workers", "0", "--steps", "2"], capsys)
    assert f"{ckpt}: cannot resume from it: its classes differ from the training data's at label 0" in err


def test_evaluation_refuses_an_arch_other_than_the_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    """It built the checkpoint's model and said nothing: the score read as the --arch given."""
    ckpt = tmp_path / "ck.pt"
    _train(str(packed_sample), "--steps", "1", "--checkpoint", str(ckpt))
    evaluate = [str(packed_sample), "--checkpoint", str(ckpt), "--device", "cpu", "--workers", "0", "--size", "16"]
    err = refused(evaluate_classifier.main, [*evaluate, "--arch", "squeezenet1_1"], capsys)
    assert (f"--arch squeezenet1_1: --checkpoint {ckpt} holds a resnet18 model "
            "(leave --arch out, or give resnet18)") in err
    assert evaluate_classifier.main([*evaluate, "--arch", "resnet18"])["total"] == 300


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    for main, size in ((train_classifier.main, "[default: 224]"),
                       (evaluate_classifier.main, "[default: the checkpoint's training --size, else 224]")):
        with pytest.raises(SystemExit):
            main(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert size in text and "[default: auto]" in text


def test_progress_is_printed_from_the_first_step(capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    """--log-every 50 with fewer steps than that used to print nothing until the end (minutes on a CPU)."""
    _train(str(packed_sample), "--steps", "2")
    out = capsys.readouterr().out
    assert out.startswith("step 1  epoch 0  loss ") and "\nstep 2 " not in out


def test_a_mix_of_other_classes_advises_the_recipes_option_which_trains_it(
        capsys: pytest.CaptureFixture[str], packed_sample: Path, two_classes: Path) -> None:
    err = refused(train_classifier.main, [str(packed_sample), str(two_classes), "--device", "cpu", "--workers",
                                           "0", "--steps", "1"], capsys)
    # the two classes are two of the sample's: packing them with every class folder trains them as one class
    assert "class lists differ" in err and "--disjoint-labels would make classes of their own" in err
    assert "shardkit pack --allow-empty" in err and "disjoint_labels=True" not in err
    _train(str(packed_sample), str(two_classes), "--disjoint-labels", "--steps", "1")
    assert "step 1 " in capsys.readouterr().out


def test_resume_is_not_an_option_and_says_how_to_resume(capsys: pytest.CaptureFixture[str],
                                                         packed_sample: Path) -> None:
    err = refused(train_classifier.main, [str(packed_sample), "--resume"], capsys)
    assert "the same command with --checkpoint FILE resumes from it" in err


def test_throughput_packs_into_the_temporary_directory_not_beside_its_input(tmp_path: Path) -> None:
    import tempfile

    from pipelines import throughput

    args = throughput.parse_args([str(SAMPLE)])
    assert args.shards.startswith(tempfile.gettempdir()) and not args.shards.startswith(str(SAMPLE.parent))
    assert throughput.parse_args([str(SAMPLE)]).shards == args.shards  # the same tree: the pack is reused
    assert throughput.parse_args([str(SAMPLE), "--shards", str(tmp_path / "s")]).shards == str(tmp_path / "s")


@pytest.mark.parametrize("argv, message", [
    (["--lr", "-1"], "argument --lr: expected a finite number > 0, got '-1'"),
    (["--lr", "nan"], "argument --lr: expected a finite number > 0, got 'nan'"),
    (["--log-keys", "/proc/nope"], "--log-keys /proc/nope: cannot make this folder"),
])
def test_a_learning_rate_or_keys_folder_that_cannot_work_is_a_usage_error(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    if argv[0] == "--log-keys" and not Path("/proc/self").exists():
        pytest.skip("needs /proc, where no folder can be made")
    assert message in refused(train_classifier.main, [str(packed_sample), *argv, "--device", "cpu"], capsys)


def test_evaluation_names_a_keys_folder_it_cannot_make(capsys: pytest.CaptureFixture[str], packed_sample: Path) -> None:
    if not Path("/proc/self").exists():
        pytest.skip("needs /proc, where no folder can be made")
    err = refused(evaluate_classifier.main, [str(packed_sample), "--log-keys", "/proc/nope", "--device", "cpu",
                                             "--workers", "0"], capsys)
    assert "--log-keys /proc/nope: cannot make this folder" in err

