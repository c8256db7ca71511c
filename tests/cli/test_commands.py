import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from tests.conftest import encode_image, write_tree


@pytest.fixture
def runner():
    return CliRunner()


def _pack(runner, src, dst, *extra):
    return runner.invoke(cli,
                         ["pack", str(src), str(dst), "--max-count", "5", "--workers", "1", *extra])


def test_pack_summary_info_and_verify(runner, small_tree, tmp_path):
    (small_tree / "class1" / "broken.jpg").write_bytes(b"")
    result = _pack(runner, small_tree, tmp_path / "out")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "samples   12  (3 classes)" in out
    assert "shards    3" in out
    assert "skipped   1" in out and "class1/broken.jpg: empty file (0 bytes)" in out
    assert "images/s" in out
    again = _pack(runner, small_tree, tmp_path / "out")
    assert again.exit_code == 0 and "already packed" in again.output

    info = runner.invoke(cli, ["info", str(tmp_path / "out")])
    assert info.exit_code == 0
    assert "samples   12" in info.output and "classes   3: class0, class1, class2" in info.output
    assert "skipped   1: 1 empty file\n" in info.output
    index_json = str(tmp_path / "out" / "index.json")
    as_json = json.loads(runner.invoke(cli, ["info", index_json, "--json"]).output)
    assert as_json["num_samples"] == 12 and as_json["num_shards"] == 3 and as_json["skipped"] == 1
    assert as_json["options"]["max_count"] == 5

    verify = runner.invoke(cli, ["verify", str(tmp_path / "out"), "--decode"])
    assert verify.exit_code == 0
    assert (verify.output.strip()
            == f"OK {tmp_path / 'out'}: 3 shards, 12 samples, 12 images decoded")
    assert runner.invoke(cli, ["verify", "-q", str(tmp_path / "out")]).output == ""


def test_quiet_pack_prints_nothing(runner, small_tree, tmp_path):
    """Not even the warning that a mixed jpg/png tree (small_tree) loses samples in other readers."""
    result = _pack(runner, small_tree, tmp_path / "out", "--quiet")
    assert result.exit_code == 0 and result.output == ""
    loud = _pack(runner, small_tree, tmp_path / "loud")
    assert loud.output.startswith("shardkit: 12 images are 9 jpg and 3 png: ")  # on a line of its own
    assert (tmp_path / "out" / "index.json").exists()


def test_verify_warns_of_shards_without_offsets_files(runner, small_tree, tmp_path):
    """Allowed (the loader scans such a shard), but its samples go unchecked against their CRC-32."""
    assert _pack(runner, small_tree, tmp_path / "out").exit_code == 0
    (tmp_path / "out" / "shard-000001.idx").unlink()
    (tmp_path / "out" / "shard-000002.idx").unlink()
    verify = runner.invoke(cli, ["verify", str(tmp_path / "out")])
    assert verify.exit_code == 0
    assert (f"WARN no offsets file (.idx) beside 2 shards: {tmp_path / 'out' / 'shard-000001.tar'} and 1 more; "
            "the loader finds the samples of such a shard by reading it, and checks none against its CRC-32"
            in verify.output)


def test_verify_reports_a_truncated_shard(runner, small_tree, tmp_path):
    _pack(runner, small_tree, tmp_path / "out", "-q")
    shard = tmp_path / "out" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:2000])
    result = runner.invoke(cli, ["verify", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert f"FAIL {shard}" in result.output and "problem(s)" in result.output


def _one_line_error(result, *fragments):
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output


def test_a_subset_of_the_classes_packs_with_allow_empty_and_mixes_with_the_whole_set(runner, tmp_path):
    """Its class folders without images were refused, with no way to keep them: the subset got a class
    list of its own and a mix with the whole set needed disjoint_labels, which split shared classes."""
    from shardkit import ShardLoader

    write_tree(tmp_path / "all", {f"{c}/{i}.jpg": encode_image() for c in ("ant", "bee", "cat") for i in range(2)})
    write_tree(tmp_path / "sub", {"ant/9.jpg": encode_image(), "bee/.keep": b"", "cat/8.jpg": encode_image()})
    assert _pack(runner, tmp_path / "all", tmp_path / "all-s").exit_code == 0
    _one_line_error(_pack(runner, tmp_path / "sub", tmp_path / "sub-s"), "class folder bee (pack --allow-empty")
    done = _pack(runner, tmp_path / "sub", tmp_path / "sub-s", "--allow-empty")
    assert done.exit_code == 0, done.output
    mix = ShardLoader([str(tmp_path / "all-s"), str(tmp_path / "sub-s")], batch_size=8, num_workers=0, shuffle=False)
    assert mix.classes == ("ant", "bee", "cat")
    assert sorted(int(label) for _, labels in mix for label in labels) == [0, 0, 0, 1, 1, 2, 2, 2]
    coco = runner.invoke(cli, ["pack", str(tmp_path / "sub"), str(tmp_path / "c"), "--annotations",
                               str(tmp_path / "x.json"), "--allow-empty"])
    assert coco.exit_code == 2 and "--allow-empty applies to an ImageFolder tree, not to --format coco" in coco.output


def test_source_errors_are_one_line(runner, tmp_path):
    write_tree(tmp_path, {"file.jpg": encode_image(), "notree/loose.jpg": encode_image(),
                          "emptyclass/a/x.jpg": encode_image(), "emptyclass/b/readme.txt": b"x"})
    (tmp_path / "empty").mkdir()
    cases = {"missing": "does not exist", "file.jpg": "not a directory",
             "empty": "no class folders", "notree": "no class folders",
             "emptyclass": "no image files in class folder b"}
    for name, message in cases.items():
        result = _pack(runner, tmp_path / name, tmp_path / f"out-{name}")
        _one_line_error(result, str(tmp_path / name), message)


def test_manifest_and_destination_errors_are_one_line(runner, small_tree, tmp_path):
    _one_line_error(runner.invoke(cli, ["info", str(tmp_path)]), f"error: {tmp_path}: no index.json")
    if Path("/proc/self").exists():  # a parent the system will not create a directory in
        _one_line_error(_pack(runner, small_tree, Path("/proc/nope/out")),
                        "error: /proc/nope/out: cannot create this directory (creating /proc/nope failed under /proc)")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "index.json").write_text('{"format": "shardkit", "version": 7}')
    _one_line_error(runner.invoke(cli, ["verify", str(tmp_path / "ds")]),
                    "format version 7 is not supported")
    (tmp_path / "ds" / "index.json").write_text("{oops")
    _one_line_error(runner.invoke(cli, ["info", str(tmp_path / "ds")]), "not valid JSON")
    _one_line_error(_pack(runner, small_tree, tmp_path / "ds"), "index.json: not valid JSON")
    (tmp_path / "ds" / "index.json").unlink()
    (tmp_path / "ds" / "mine.txt").write_text("x")
    _one_line_error(_pack(runner, small_tree, tmp_path / "ds"), "is not empty", "--overwrite")


def test_usage_errors_exit_2(runner, small_tree, tmp_path):
    assert _pack(runner, small_tree, tmp_path / "o", "--max-size", "lots").exit_code == 2
    assert _pack(runner, small_tree, tmp_path / "o", "--prefix", "a/b").exit_code == 2
    assert _pack(runner, small_tree, tmp_path / "o", "-o", "novalue").exit_code == 2
    empty = _pack(runner, small_tree, tmp_path / "o", "--prefix", "")
    assert empty.exit_code == 2 and "invalid shard prefix '': shards need a name to start with" in empty.output
    assert not (tmp_path / "o").exists()


def test_s3_through_the_cli(runner, small_tree, s3_server, s3_bucket, monkeypatch):
    url = f"{s3_bucket}/cli"
    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    creds = ["-o", "key=test", "-o", "secret=test", "-o", "skip_instance_cache=true"]
    result = _pack(runner, small_tree, url, "-o", f"client_kwargs.endpoint_url={endpoint}", *creds)
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    verify = runner.invoke(cli, ["verify", url, "--decode", *creds])
    assert verify.exit_code == 0, verify.output
    assert "12 images decoded" in verify.output
    info = runner.invoke(cli, ["info", url, "--json", *creds])
    assert json.loads(info.output)["num_samples"] == 12


def test_bench_reads_shards_from_s3_with_storage_options(runner, small_tree, s3_server, s3_bucket):
    """bench --shards s3://... -o ...: the options reach ShardLoader; the webdataset baseline,
    which opens local tar files, is left out with a note instead of without a word."""
    url = f"{s3_bucket}/bench"
    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    options = ["-o", f"client_kwargs.endpoint_url={endpoint}", "-o", "key=test", "-o", "secret=test",
               "-o", "skip_instance_cache=true"]
    assert _pack(runner, small_tree, url, *options).exit_code == 0
    result = runner.invoke(cli, ["bench", str(small_tree), "--shards", url, *options, "--workers", "0",
                                 "--batch-size", "4", "--size", "16", "--repeats", "1", "--epochs", "1",
                                 "--warmup", "0", "-q"])
    assert result.exit_code == 0, result.output
    assert "note: no webdataset row: its baseline opens local tar files, and --shards is a URL" in result.output
    assert "shardkit ShardLoader" in result.output and "webdataset + WebLoader" not in result.output
    local = runner.invoke(cli, ["bench", str(small_tree), "--shards", str(small_tree), "-o", "anon=true"])
    assert local.exit_code == 2 and "--storage-option (-o) applies to a --shards URL" in local.output


def test_console_entry_point_runs(small_tree, tmp_path):
    done = subprocess.run([sys.executable, "-m", "shardkit", "pack", str(small_tree),
                           str(tmp_path / "o"), "--workers", "1", "-q", "--uniform-names"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""


def test_s3_without_credentials_is_a_one_line_error(runner, monkeypatch):
    pytest.importorskip("s3fs")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = runner.invoke(cli, ["info", "s3://bucket/x", "-o",
                                 "client_kwargs.endpoint_url=http://127.0.0.1:9", "-o",
                                 "skip_instance_cache=true"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: s3://bucket/x/index.json: no AWS credentials found")
    assert "-o key=" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_dataset_path_that_is_missing_or_a_file_says_so(command: str, tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli, [command, str(tmp_path / "nope")])
    assert missing.exit_code == 1 and f"{tmp_path / 'nope'}: does not exist" in missing.output
    (tmp_path / "notes.txt").write_text("hi")
    a_file = runner.invoke(cli, [command, str(tmp_path / "notes.txt")])
    assert a_file.exit_code == 1 and "notes.txt: is a file, not a dataset directory" in a_file.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(cli, [command, str(tmp_path / "empty")])
    assert empty.exit_code == 1 and "no index.json: not a shardkit dataset" in empty.output


def test_images_directly_in_src_are_noted(runner, small_tree, tmp_path):
    (small_tree / "loose.jpg").write_bytes(encode_image())
    result = _pack(runner, small_tree, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert ("note: 1 image file(s) directly in " in result.output and "(e.g. loose.jpg) are in no class folder"
            in result.output and "pass --annotations" in result.output)
    (small_tree / "loose.jpg").unlink()
    clean = _pack(runner, small_tree, tmp_path / "out2")
    assert clean.exit_code == 0 and "note:" not in clean.output


def test_ctrl_c_delivered_wrapped_is_an_interrupt_not_a_traceback(runner, tmp_path, monkeypatch):
    """Python wraps Ctrl-C raised in a class body being built (a lazily imported PIL plugin) in a
    RuntimeError: the command still ends as interrupted (exit 130), without a traceback."""
    import shardkit.cli.info as info

    def wrapped(*_args, **_kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as err:
            raise RuntimeError("Error calling __set_name__ on 'cached_property' instance") from err

    monkeypatch.setattr(info, "locate_dataset", wrapped)
    result = runner.invoke(cli, ["info", str(tmp_path)])
    assert result.exit_code == 130 and result.output == "interrupted\n", result.output


def test_an_interrupted_command_run_in_process_leaves_the_signal_handlers_alone(runner, tmp_path, monkeypatch):
    """The handlers that end an exiting ``shardkit`` at a second Ctrl-C are the process's business
    (its entry point's): run in another program (a notebook, a test), an interrupted command left
    them behind, and that program's next Ctrl-C ended it at once, without a word."""
    import signal

    import shardkit.cli.info as info

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "locate_dataset", interrupted)
    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    assert runner.invoke(cli, ["info", str(tmp_path)]).exit_code == 130
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before


def test_a_url_with_one_slash_is_a_usage_error_with_the_url_meant(runner, tmp_path, monkeypatch):
    """``s3:/bucket/x`` was read as a local folder and said not to exist, without a word of the scheme."""
    for args, name in ((["info", "s3:/bucket/x"], "DATASET"), (["pack", "sample_data/imagefolder", "gs:/b/out"], "DST"),
                       (["index", "memory:/d"], "DATASET")):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, result.output
        url = args[-1].replace(":/", "://")
        assert f"Invalid value for '{name}': {args[-1]!r} is a local path as written; a URL needs two slashes: {url}" \
            in result.output, result.output
    (tmp_path / "s3:" / "x").mkdir(parents=True)  # a folder that is really named so is taken as it is
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli, ["info", "s3:/x"])
    assert "two slashes" not in result.output and "index.json" in result.output, result.output


def test_an_empty_path_argument_is_a_usage_error_naming_it(runner):
    """``shardkit pack "$SRC" "$DST"`` with a variable unset: said as such, not taken for the
    current folder (info, verify), no report at all (bench --out), nor a message about a
    directory with no name (pack)."""
    cases = {("pack", "sample_data/imagefolder", ""): ("DST", "a folder or a URL"),
             ("pack", "", "out"): ("SRC", "a folder or a URL"), ("info", ""): ("DATASET", "a folder or a URL"),
             ("verify", " "): ("DATASET", "a folder or a URL"), ("index", ""): ("DATASET", "a folder or a URL"),
             ("bench", ""): ("SRC", "a folder"),
             ("bench", "sample_data/imagefolder", "--shards", ""): ("--shards", "a folder or a URL"),
             ("bench", "sample_data/imagefolder", "--out", ""): ("--out", "a file"),
             ("pack", "sample_data/imagefolder", "out", "--annotations", ""): ("--annotations", "a file or a URL")}
    for args, (name, what) in cases.items():
        result = runner.invoke(cli, list(args))
        assert result.exit_code == 2, (args, result.output)
        assert f"Error: Invalid value for '{name}': is empty: name {what} (an unset" in result.output, result.output


def test_a_max_size_below_every_sample_is_noted(runner, small_tree, tmp_path):
    """--max-size 1KB on images of a few KB: a shard per image, which a loader reads slowly; said
    after the summary (a --max-count of 1, asked for as such, is not)."""
    tiny = _pack(runner, small_tree, tmp_path / "tiny", "--max-size", "100")
    assert tiny.exit_code == 0, tiny.output
    assert "note: every shard holds at most one sample: --max-size (100 bytes) is below the size of a sample (" \
        in tiny.output, tiny.output
    for dst, extra in (("plain", ()), ("one", ("--max-count", "1"))):
        result = _pack(runner, small_tree, tmp_path / dst, *extra)
        assert result.exit_code == 0 and "note:" not in result.output, result.output


def test_shards_left_with_a_sample_each_by_skipped_inputs_draw_no_note_on_max_size(runner, tmp_path):
    """Shards of 2 inputs, one of each pair skipped: a sample a shard, but --max-size (its default)
    is not why, as the note said."""
    from PIL import Image

    for i in range(3):
        Image.new("RGB", (20 + i, 10), (i, 80, 160)).save(tmp_path / f"good{i}.jpg")
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}a.jpg").write_bytes((tmp_path / f"good{i}.jpg").read_bytes())
        (src / f"{i}b.jpg").write_bytes(b"")
    result = runner.invoke(cli, ["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--max-count", "2",
                                 "--no-shuffle", "--workers", "1"])
    assert result.exit_code == 0 and "3 empty files" in result.output and "note:" not in result.output, result.output


def test_a_second_ctrl_c_while_the_shardkit_process_says_interrupted_keeps_130(tmp_path):
    """In the ``shardkit`` process itself (``main``), a Ctrl-C that comes while the first one's
    message is printed ends it at once with 130: the handlers are set before the message, as the
    process's own, not by the command run in-process (previous test)."""
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import os, signal\n"
        "import shardkit.cli as cli, shardkit.cli.info as info\n"
        "def interrupted(*args, **kwargs):\n"
        "    raise KeyboardInterrupt\n"
        "info.locate_dataset = interrupted\n"
        "cli._clear_line = lambda: os.kill(os.getpid(), signal.SIGINT)\n"
        f"import sys; sys.argv = ['shardkit', 'info', {str(tmp_path)!r}]\n"
        "cli.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 130 and "Aborted" not in done.stderr and "Traceback" not in done.stderr, done


def test_info_says_a_single_shards_samples_without_each(runner, small_tree, tmp_path):
    """One shard read "1  (12 samples each)"."""
    one = runner.invoke(cli, ["pack", str(small_tree), str(tmp_path / "one"), "--workers", "1"])
    assert one.exit_code == 0, one.output
    info = runner.invoke(cli, ["info", str(tmp_path / "one")])
    assert info.exit_code == 0 and "shards    1  (12 samples)\n" in info.output, info.output
    assert _pack(runner, small_tree, tmp_path / "three").exit_code == 0
    info = runner.invoke(cli, ["info", str(tmp_path / "three")])
    assert "shards    3  (2–5 samples each)\n" in info.output, info.output
    singles = runner.invoke(cli, ["pack", str(small_tree), str(tmp_path / "singles"), "--max-count", "1"])
    assert singles.exit_code == 0, singles.output
    info = runner.invoke(cli, ["info", str(tmp_path / "singles")])
    assert "shards    12  (1 sample each)\n" in info.output, info.output


def test_pack_takes_workers_auto_as_the_loaders_commands_do(runner, small_tree, tmp_path):
    """``--workers auto`` was refused by pack alone ("'auto' is not a valid integer range"); it is
    the default, the cores this process may use, and gives the same bytes as one writer."""
    from shardkit.cli.workers import WRITERS
    from shardkit.machine import usable_cores

    assert WRITERS.convert("auto", None, None) == usable_cores() and WRITERS.convert("2", None, None) == 2
    auto = runner.invoke(cli, ["pack", str(small_tree), str(tmp_path / "auto"), "--workers", "auto"])
    one = runner.invoke(cli, ["pack", str(small_tree), str(tmp_path / "one"), "--workers", "1"])
    assert auto.exit_code == 0 and one.exit_code == 0, (auto.output, one.output)
    assert ({p.name: p.read_bytes() for p in (tmp_path / "auto").iterdir()}
            == {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()})
    zero = runner.invoke(cli, ["pack", str(small_tree), str(tmp_path / "zero"), "--workers", "0"])
    assert zero.exit_code == 2 and "0 is below 1" in zero.output, zero.output


def test_an_option_this_pack_would_not_use_is_refused(runner, small_tree, tmp_path):
    """A pack records its options: one that did nothing (--quality without --resize-max, --seed
    with --no-shuffle, fsspec options where every path is local) still refused a re-run without it."""
    for args, says in [(["--quality", "50"], "--quality applies with --resize-max only"),
                       (["--no-shuffle", "--seed", "5"], "--seed applies with --shuffle only"),
                       (["--source-option", "anon=true"], "--source-option applies to a URL SRC"),
                       (["-o", "anon=true"], "--storage-option applies to URLs")]:
        result = _pack(runner, small_tree, tmp_path / "o", *args)
        assert result.exit_code == 2 and f"Error: {says}" in result.output, (args, result.output)
        assert not (tmp_path / "o").exists()
    assert _pack(runner, small_tree, tmp_path / "o", "--resize-max", "16", "--quality", "50").exit_code == 0


def test_a_storage_option_for_a_local_dataset_is_refused_by_every_command(runner, small_tree, tmp_path):
    """``pack`` and ``bench`` refused ``-o`` for local paths; ``info``, ``verify`` and ``index``
    took it and did nothing with it (a typo such as ``anonn=1`` went unseen)."""
    assert _pack(runner, small_tree, tmp_path / "out").exit_code == 0
    out = str(tmp_path / "out")
    for args in (["info", out], ["verify", out], ["index", out, "--table"]):
        result = runner.invoke(cli, [*args, "-o", "anonn=1"])
        assert result.exit_code == 2, (args, result.output)
        assert f"--storage-option applies to URLs; {out} is a local path" in result.output, (args, result.output)
