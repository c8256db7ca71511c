"""``shardkit bench`` refuses what cannot run before it runs: batch and epoch plans with nothing to
time, shards of other data or damaged, outputs it cannot write, folders that are no pack."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.pack import PackOptions, pack


def test_bench_rejects_too_large_batch(tree: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", str(tree), "--batch-size", "100", "--workers", "0", "-q"])
    assert result.exit_code == 1
    assert result.output.startswith("error: 24 images make no full batch of 100")
    assert result.output.count("\n") == 1


def test_bench_refuses_a_timed_part_that_would_only_empty_the_queue(tree: Path) -> None:
    """A warm-up taking every batch was cut to leave one without a word, and a timed part no
    longer than the batches the workers prepare ahead printed rates of a full queue (143k img/s
    and 36 CPU cores on a 2-core machine)."""
    for args, left, fixes in [(["--batch-size", "8", "--epochs", "1", "--warmup", "3", "--workers", "0"],
                               "3 batches of 8 in 1 epoch of 24 images leave none to time after --warmup 3; ",
                               "raise --epochs to 2, or lower --warmup to 2"),
                              (["--batch-size", "8", "--epochs", "1", "--warmup", "0", "--workers", "2"],
                               "3 batches of 8 in 1 epoch of 24 images leave 3 batches to time after --warmup 0, no "
                               "more than the 4 that 2 workers prepare ahead",
                               "raise --epochs to 3")]:
        result = CliRunner().invoke(cli, ["bench", str(tree), *args, "-q"])
        assert result.exit_code == 1 and result.output.startswith(f"error: {left}"), result.output
        assert result.output.count("\n") == 1 and result.output.endswith(f"; {fixes}\n"), result.output


def test_a_refused_plan_names_values_that_run_at_the_first_retry(tree: Path) -> None:
    """--epochs 1 was refused with "raise --epochs, or lower --warmup or --batch-size", and --warmup 0
    then refused again. The error names the --epochs that passes every loader's check: 2 would
    pass ImageFolder's (6 batches after --warmup 0), not webdataset's, whose 2 workers each read 12
    images of the 3-image shards the bench packs and make 2 batches of 8 an epoch, not 3."""
    base = ["bench", str(tree), "--batch-size", "8", "--workers", "2", "--warmup", "0", "--size", "16",
            "--repeats", "1", "-q"]
    refused = CliRunner().invoke(cli, [*base, "--epochs", "1"])
    assert refused.exit_code == 1 and refused.output.endswith("; raise --epochs to 3\n"), refused.output
    again = CliRunner().invoke(cli, [*base, "--epochs", "3"])
    assert again.exit_code == 0, again.output


def test_bench_refuses_shards_of_other_data(tree: Path, tmp_path: Path) -> None:
    other = tmp_path / "other" / "only"
    other.mkdir(parents=True)
    shutil.copy(next(p for p in sorted(tree.rglob("*")) if p.is_file()), other / "x.jpg")
    shards = tmp_path / "shards"
    pack(str(other.parent), str(shards), workers=1)
    result = CliRunner().invoke(cli, ["bench", str(tree), "--shards", str(shards), "--workers", "0",
                                      "--batch-size", "2", "--repeats", "1", "--epochs", "1",
                                      "--warmup", "0"])
    assert result.exit_code != 0 and "not be on the same data" in result.output


def test_bench_refuses_shards_whose_images_were_resized_and_a_report_into_the_pack(tree: Path,
                                                                                   tmp_path: Path) -> None:
    """Shards packed with --resize-max were compared with the originals they came from (13x
    "faster"), and --out into the pack overwrote its index.json."""
    shards = tmp_path / "small"
    pack(str(tree), str(shards), options=PackOptions(resize_max=16), workers=1)
    args = ["bench", str(tree), "--workers", "0", "--batch-size", "2", "--repeats", "1", "--epochs", "1",
            "--warmup", "0", "-q"]
    result = CliRunner().invoke(cli, [*args, "--shards", str(shards)])
    assert result.exit_code == 1 and f"--shards {shards} was packed with resize_max=16" in result.output
    assert "the comparison would not be on the same images (pack it without --resize-max, or omit --shards)" \
        in result.output
    full = tmp_path / "full"
    pack(str(tree), str(full), workers=1)
    before = (full / "index.json").read_bytes()
    for where in (full / "index.json", full / "report.json"):
        result = CliRunner().invoke(cli, [*args, "--shards", str(full), "--out", str(where)])
        assert result.exit_code == 2 and f"is inside --shards {full}" in result.output, result.output
    assert (full / "index.json").read_bytes() == before and not (full / "report.json").exists()
    result = CliRunner().invoke(cli, [*args, "--shards", f"file://{full}", "--out", str(full / "index.json")])
    assert result.exit_code == 2 and "is inside --shards file://" in result.output, result.output


def test_bench_checks_its_inputs_and_outputs_before_running(tree: Path, tmp_path: Path) -> None:
    """Each bad path is one ``error:`` line and exit 1, as pack, info and verify say it, before
    anything is timed (a report lost after the run was the alternative)."""
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "index.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "notes.txt" / "r.json")  # a link into a file: no folder
    cases = {
        (str(tmp_path / "nope"),): f"error: {tmp_path / 'nope'}: does not exist",
        (str(tmp_path / "notes.txt"),): f"error: {tmp_path / 'notes.txt'}: is a file, not a directory of images",
        (str(tmp_path / "packed"),): f"error: {tmp_path / 'packed'}: is a packed dataset (it holds index.json); bench "
                                     f"takes the image folder it was packed from as SRC and the pack as --shards: "
                                     f"shardkit bench IMAGES --shards {tmp_path / 'packed'}",
        (str(tree), "--annotations", str(tmp_path / "no.json")): f"error: --annotations {tmp_path / 'no.json'}: "
                                                                  "does not exist",
        (str(tree), "--out", str(tmp_path / "notes.txt" / "r.json")): f"error: --out {tmp_path / 'notes.txt'}"
                                                                       f"/r.json: {tmp_path / 'notes.txt'} is a file, "
                                                                       "not a folder\n",
        (str(tree), "--out", str(tmp_path / "notes.txt" / "sub" / "r.json")): f"error: --out {tmp_path / 'notes.txt'}"
                                                                              f"/sub/r.json: {tmp_path / 'notes.txt'} "
                                                                              "is a file, not a folder\n",
        (str(tree), "--out", str(tmp_path / "link.json")): f"error: --out {tmp_path / 'link.json'}: "
                                                             f"{tmp_path / 'notes.txt'} is a file, not a folder\n",
        (str(tree), "--plot", str(tmp_path / "notes.txt" / "p.png")): f"error: --plot {tmp_path / 'notes.txt'}/p.png: "
                                                                        f"{tmp_path / 'notes.txt'} is a file, not a "
                                                                        "folder\n",
        (str(tree), "--out", f"{tmp_path / 'new'}/"): f"error: --out {tmp_path / 'new'}/: names a folder (it ends "
                                                       "in /); name the file",
        (str(tree), "--out", "/proc/r.json"): "error: --out /proc/r.json: cannot be written (",
    }
    for args, message in cases.items():
        result = CliRunner().invoke(cli, ["bench", *args, "-q"])
        assert result.exit_code == 1, (args, result.output)
        assert result.output.startswith(message) and result.output.count("\n") == 1, result.output


def test_train_names_shards_that_are_missing_or_no_pack(tree: Path, tmp_path: Path) -> None:
    """--shards given but wrong: said as such in one line (it read as if --shards had been left out)."""
    for shards, wrong in ((tmp_path / "nope", "does not exist"), (tmp_path, "holds no index.json")):
        result = CliRunner().invoke(cli, ["bench", str(tree), "--train", "resnet18", "--shards", str(shards)])
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"error: --shards {shards}: {wrong}; --train needs a packed dataset of "
                                        "SRC"), result.output


def test_bench_into_a_folder_that_is_no_pack_says_what_bench_takes(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("x")
    result = CliRunner().invoke(cli, ["bench", str(tree), "--shards", str(tmp_path / "used"), "--workers", "0",
                                      "--batch-size", "4", "-q"])
    assert result.exit_code == 1
    assert result.output == (f"error: {tmp_path / 'used'}: is not empty (1 entry, e.g. 'notes.txt'); give --shards an "
                             "empty or new folder (bench packs SRC there) or the folder of a finished pack of SRC\n")
    assert "--overwrite" not in result.output  # pack's option, which bench does not have


def test_bench_refuses_damaged_shards_before_it_runs(tree: Path, tmp_path: Path) -> None:
    """A shard missing or cut short: one error line naming it, before any run (the page-cache
    warm-up died on the missing one with a traceback, and the webdataset baseline on the short one)."""
    shards = tmp_path / "shards"
    pack(str(tree), str(shards), options=PackOptions(max_count=8, seed=0), workers=1)
    names = sorted(p.name for p in shards.glob("*.tar"))
    short = shards / names[1]
    short.write_bytes(short.read_bytes()[:1000])
    (shards / names[2]).unlink()
    base = ["bench", str(tree), "--shards", str(shards), "--workers", "1", "--batch-size", "4", "--size", "32",
            "--repeats", "1", "-q"]
    for extra in (["--epochs", "1", "--warmup", "1"], ["--train", "resnet18", "--steps", "2"]):
        result = CliRunner().invoke(cli, [*base, *extra])
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"error: --shards {shards} is damaged: {names[1]} has 1,000 bytes, "
                                        "index.json says "), result.output
        assert f"; {names[2]} is missing; shardkit verify {shards} tells more" in result.output, result.output


def test_max_size_given_as_bytes_is_told_apart_from_pixels(tree: Path) -> None:
    """``--max-size 256MB`` is pack's meaning (bytes per shard); bench's is the longer image side in
    pixels: the refusal says which (it read "'256MB' is not a valid integer range")."""
    bytes_said = "is a byte size: bench's --max-size is the longer image side in pixels (pack's is bytes per shard)"
    for value, said in (("256MB", f"'256MB' {bytes_said}"), ("1G", f"'1G' {bytes_said}"),
                        ("thumb", "'thumb' is not a whole number of pixels"),
                        ("1.5", "'1.5' is not a whole number of pixels"), ("0", "0 is below 1")):
        result = CliRunner().invoke(cli, ["bench", str(tree), "--max-size", value])
        assert result.exit_code == 2 and said in result.output, result.output


def test_an_option_of_another_source_kind_is_refused_and_a_refused_bench_leaves_no_out_folder(
        tree: Path, tmp_path: Path) -> None:
    for args, says in [(["--max-size", "500"], "--max-size applies with --annotations"),
                       (["--context-length", "10"], "--context-length applies with --captions")]:
        result = CliRunner().invoke(cli, ["bench", str(tree), *args, "-q"])
        assert result.exit_code == 2 and f"Error: {says}" in result.output, result.output
    out = tmp_path / "new" / "deeper" / "report.json"
    refused = CliRunner().invoke(cli, ["bench", str(tree), "--out", str(out), "--batch-size", "8", "--epochs", "1",
                                       "--warmup", "3", "--workers", "0", "-q"])
    assert refused.exit_code == 1 and refused.output.startswith("error: "), refused.output
    assert not (tmp_path / "new").exists()
