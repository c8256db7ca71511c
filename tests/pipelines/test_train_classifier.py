"""The training recipe runs on CPU and resumes from its checkpoint at the right step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipelines.train_classifier import main
from shardkit.pack import PackOptions, pack
from tests.pipelines.conftest import SAMPLE


def test_train_then_resume(tmp_path: Path, capsys, packed_sample: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    common = [str(packed_sample), "--batch-size", "8", "--size", "32", "--workers", "0", "--device",
              "cpu", "--checkpoint", str(ckpt)]
    main([*common, "--steps", "3"])
    assert torch.load(ckpt)["loader"]["batches_consumed"] == 3
    main([*common, "--steps", "5"])
    state = torch.load(ckpt)
    assert state["step"] == 5 and state["loader"]["batches_consumed"] == 5
    assert "step 5" in capsys.readouterr().out


def test_reports_the_fed_step_share(tmp_path: Path, capsys, packed_sample: Path) -> None:
    result = main([str(packed_sample), "--batch-size", "8", "--size", "32", "--workers", "0", "--device", "cpu",
                   "--steps", "4", "--share-steps", "2"])
    share = result["step_share"]
    assert share["share"] == share["fed_images_per_second"] / share["synthetic_images_per_second"] > 0
    assert f"fed-step share {share['share']:.0%}" in capsys.readouterr().out


def test_trains_on_a_mix_and_resumes_it(tmp_path: Path, capsys, packed_sample: Path) -> None:
    other = tmp_path / "other"
    pack(str(SAMPLE), str(other), options=PackOptions(max_count=32, seed=7), workers=1)
    ckpt = tmp_path / "mix.pt"
    common = [str(packed_sample), str(other), "--weights", "3", "1", "--batch-size", "8", "--size", "32",
              "--workers", "0", "--device", "cpu", "--checkpoint", str(ckpt)]
    main([*common, "--steps", "2"])
    state = torch.load(ckpt)["loader"]
    assert state["mix"] is not None and state["batches_consumed"] == 2
    main([*common, "--steps", "4"])
    assert torch.load(ckpt)["loader"]["batches_consumed"] == 4
    assert "resumed from" in capsys.readouterr().out


def test_dataset_mistakes_are_usage_errors_not_tracebacks(tmp_path: Path, capsys, packed_sample: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([str(packed_sample), str(packed_sample), "--weights", "1", "--device", "cpu"])
    assert exit_.value.code == 2 and "--weights takes one number per dataset: 2 datasets, 1 weights" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "nowhere"), "--device", "cpu", "--steps", "1", "--workers", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "nowhere" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_:
        main([str(packed_sample), "--device", "cpu", "--arch", "nosuch"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--arch: 'nosuch' is not a torchvision classification model" in err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_:
            main([str(packed_sample), "--device", "cuda"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "--device cuda: no CUDA device is available (use --device cpu)" in err
    for option, value in [("--workers", "many"), ("--workers", "-1"), ("--feeders", "x")]:
        with pytest.raises(SystemExit) as exit_:
            main([str(packed_sample), "--device", "cpu", option, value])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"{option}: expected 'auto' or a whole number >= 0, got '{value}'" in err
        assert err.count("\n") == 1 and "usage:" not in err  # one line, not argparse's usage block first


def test_a_finished_run_says_there_is_nothing_to_train(tmp_path: Path, capsys, packed_sample: Path) -> None:
    common = [str(packed_sample), "--batch-size", "8", "--size", "32", "--workers", "0", "--device", "cpu",
              "--checkpoint", str(tmp_path / "ck.pt"), "--steps", "2"]
    main(common)
    capsys.readouterr()
    main(common)
    out = capsys.readouterr().out
    assert "nothing to train: the checkpoint is at step 2, epoch 0 (--steps 2, --epochs 1)" in out
    assert "images/s" not in out  # no rate of a run that trained nothing


def test_val_runs_when_steps_end_the_run_inside_an_epoch(capsys, packed_sample: Path) -> None:
    result = main([str(packed_sample), "--val", str(packed_sample), "--batch-size", "8", "--size", "32",
                   "--workers", "0", "--device", "cpu", "--steps", "2"])
    assert result["top1"] is not None
    assert "step 2  top-1 " in capsys.readouterr().out


def test_ctrl_c_ends_the_run_with_one_line(capsys, packed_sample: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from pipelines import ddp, recipe_args

    def interrupted(_args: argparse.Namespace) -> dict[str, object]:
        raise KeyboardInterrupt

    parser = argparse.ArgumentParser(prog="train")
    ddp.add_dataset_arguments(parser, "dataset")
    recipe_args.add_run_arguments(parser, log_every=1)
    with pytest.raises(SystemExit) as exit_:
        ddp.run_training(parser, [str(packed_sample), "--device", "cpu"], interrupted)
    assert exit_.value.code == 130 and capsys.readouterr().err == "train: interrupted\n"


def test_the_evaluation_recipe_scores_at_the_checkpoints_training_size(tmp_path: Path, capsys,
                                                                        packed_sample: Path) -> None:
    """It evaluated at 224 whatever --size the model was trained at (0.20 top-1 against 0.44)."""
    from pipelines import evaluate_classifier

    ckpt = tmp_path / "s32.pt"
    main([str(packed_sample), "--batch-size", "8", "--size", "32", "--workers", "0", "--device", "cpu",
          "--checkpoint", str(ckpt), "--steps", "2"])
    capsys.readouterr()
    common = [str(packed_sample), "--checkpoint", str(ckpt), "--device", "cpu", "--workers", "0"]
    at_trained = evaluate_classifier.main(common)
    assert "; 32x32 crops)" in capsys.readouterr().out
    assert evaluate_classifier.main([*common, "--size", "32"]) == at_trained
    evaluate_classifier.main([*common, "--size", "40"])  # told otherwise: as told
    assert "; 40x40 crops)" in capsys.readouterr().out


@pytest.mark.parametrize(("option", "value", "low"), [
    ("--size", "0", 1), ("--batch-size", "-5", 1), ("--epochs", "0", 1), ("--steps", "-3", 0),
    ("--checkpoint-every", "-5", 0), ("--log-every", "-1", 0), ("--share-steps", "-1", 0)])
def test_numbers_out_of_range_are_usage_errors(option: str, value: str, low: int, capsys,
                                                packed_sample: Path) -> None:
    from tests.pipelines.conftest import refused

    err = refused(main, [str(packed_sample), "--device", "cpu", "--workers", "0", option, value], capsys)
    assert f"{option}: expected a whole number >= {low}, got {value}" in err


def test_a_checkpoint_that_cannot_be_saved_is_said_before_training(tmp_path: Path, capsys,
                                                                    packed_sample: Path) -> None:
    """It trained, then met a FileNotFoundError traceback saving the first checkpoint."""
    from tests.pipelines.conftest import refused

    (tmp_path / "file").write_text("")
    err = refused(main, [str(packed_sample), "--device", "cpu", "--workers", "0", "--size", "16",
                         "--checkpoint", str(tmp_path / "file" / "c.pt")], capsys)
    assert f"--checkpoint {tmp_path / 'file' / 'c.pt'}: cannot make its folder {tmp_path / 'file'} (" in err
