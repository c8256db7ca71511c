"""pack_captions / ``shardkit pack --format captions``: image-text pairs from a folder of sidecars or a
CSV/JSONL/Parquet table (paths or http URLs), written as img2dataset writes them (image, txt, json),
byte-reproducible and resumable, with skips reported and bad tables refused before any work."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardkit.cli import cli
from shardkit.errors import SourceError
from shardkit.index.manifest_io import read_manifest
from shardkit.index.verify import verify_dataset
from shardkit.pack import PackOptions, SkipBudget, SkipBudgetError, pack_captions
from shardkit.storage import Store
from tests.conftest import encode_image
from tests.trees import make_caption_folder

OPTIONS = PackOptions(max_count=2, seed=3)


def _webdataset(dst: Path) -> dict[str, dict[str, Any]]:
    """Every sample, read with plain webdataset (no shardkit code)."""
    import webdataset as wds

    urls = sorted(str(p) for p in dst.glob("*.tar"))
    return {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)}


def _files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.iterdir()) if p.is_file()}


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "captioned"
    return root, make_caption_folder(root)


def test_folder_packs_image_txt_json(folder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, captions = folder
    (root / "brick" / "no_caption.jpg").write_bytes((root / "brick" / "brick_000.jpg").read_bytes())
    (root / "astronaut" / "latin1.jpg").write_bytes((root / "astronaut" / "astronaut_000.jpg").read_bytes())
    (root / "astronaut" / "latin1.txt").write_bytes(b"caf\xe9")
    (root / "astronaut" / "listjson.png").write_bytes((root / "astronaut" / "astronaut_000.jpg").read_bytes())
    (root / "astronaut" / "listjson.txt").write_text("fine")
    (root / "astronaut" / "listjson.json").write_text("[1, 2]")
    result = pack_captions(str(root), str(tmp_path / "out"), options=OPTIONS, workers=1)
    m = result.manifest
    assert m.kind == "captions" and m.num_samples == len(captions) == 6 and m.classes is None
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["kind_version"] == 1
    assert [(s["source"], s["reason"].split(" (")[0]) for s in m.skipped] == [
        ("astronaut/latin1.jpg", "caption is not UTF-8 text"),
        ("astronaut/listjson.png", "sidecar .json must hold a JSON object, not list"),
        ("brick/no_caption.jpg", "no caption"),
    ]
    samples = _webdataset(tmp_path / "out")
    assert len(samples) == 6
    for sample in samples.values():
        assert set(sample) - {"__key__", "__url__", "__local_path__"} == {"jpg", "txt", "json"}
        meta = json.loads(sample["json"])
        assert sample["txt"].decode() == captions[meta["source"]]  # the sidecar's trailing newline dropped
        assert sample["jpg"] == (root / meta["source"]).read_bytes()
        extra = json.loads((root / meta["source"]).with_suffix(".json").read_text()) \
            if (root / meta["source"]).with_suffix(".json").exists() else {}
        assert meta == {**extra, "source": meta["source"], "width": meta["width"], "height": meta["height"]}
    report = verify_dataset(str(tmp_path / "out"), decode=True)
    assert report.ok and report.images_decoded == 6


def test_folder_pack_is_byte_reproducible_over_workers(folder: tuple[Path, dict[str, str]],
                                                       tmp_path: Path) -> None:
    root, _ = folder
    pack_captions(str(root), str(tmp_path / "one"), options=OPTIONS, workers=1)
    pack_captions(str(root), str(tmp_path / "two"), options=OPTIONS, workers=2)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    before = read_manifest(Store(str(tmp_path / "one"))).options["fingerprint"]
    (root / "camera" / "camera_000.txt").write_text("another caption")
    again = pack_captions(str(root), str(tmp_path / "three"), options=OPTIONS, workers=1)
    assert again.manifest.options["fingerprint"] != before  # a caption is part of the input


@pytest.fixture
def table_dir(folder: tuple[Path, dict[str, str]]) -> tuple[Path, list[dict[str, Any]]]:
    """Rows over the captioned folder: relative paths, captions, two extra columns."""
    root, captions = folder
    rows = [{"image": rel, "caption": text, "score": i / 4, "tag": f"t{i}"}
            for i, (rel, text) in enumerate(captions.items())]
    return root, rows


def _write(kind: str, path: Path, rows: list[dict[str, Any]]) -> Path:
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif kind == "csv":
        import csv

        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_tables_of_each_format_pack_the_rows(table_dir: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    root, rows = table_dir
    rows = [*rows, {"image": "", "caption": "no image", "score": 0.0, "tag": "x"},
            {"image": "gone.jpg", "caption": "missing file", "score": 0.0, "tag": "y"}]
    packed = {}
    for kind in ("jsonl", "csv", "parquet"):
        table = _write(kind, root / f"pairs.{kind}", rows)
        result = pack_captions(str(table), str(tmp_path / kind), options=OPTIONS, workers=1)
        assert result.manifest.num_samples == 6
        assert [(s["source"], s["reason"].split(" (")[0]) for s in result.manifest.skipped] == [
            ("gone.jpg", "unreadable file"), ("row 7", "no image")]
        samples = _webdataset(tmp_path / kind)
        packed[kind] = {k: (s["txt"], json.loads(s["json"])) for k, s in samples.items()}
    for key, (text, meta) in packed["parquet"].items():
        row = rows[int(key)]
        assert text.decode() == row["caption"] and meta["source"] == row["image"]
        assert meta["score"] == row["score"] and meta["tag"] == row["tag"]
        assert packed["jsonl"][key] == (text, meta)
        assert packed["csv"][key][1]["score"] == str(row["score"])  # CSV columns stay text


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A real HTTP server (http.server, loopback) serving ``tmp_path / "www"``."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(www)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_urls_pack_like_local_paths_and_a_404_is_skipped(
        table_dir: tuple[Path, list[dict[str, Any]]], http_root: tuple[Path, str], tmp_path: Path) -> None:
    root, rows = table_dir
    www, base = http_root
    for row in rows:
        (www / row["image"]).parent.mkdir(parents=True, exist_ok=True)
        (www / row["image"]).write_bytes((root / row["image"]).read_bytes())
    local = _write("parquet", tmp_path / "local.parquet", rows)
    urls = [{**r, "image": f"{base}/{r['image']}"} for r in rows] + [
        {"image": f"{base}/missing.jpg", "caption": "404", "score": 1.0, "tag": "z"}]
    remote = _write("parquet", www / "urls.parquet", urls)
    pack_captions(str(local), str(tmp_path / "local"), images_root=str(root), options=OPTIONS, workers=1)
    result = pack_captions(f"{base}/urls.parquet", str(tmp_path / "http"), options=OPTIONS, workers=2)
    assert remote.exists() and result.manifest.num_samples == len(rows)
    assert [s["source"] for s in result.manifest.skipped] == [f"{base}/missing.jpg"]
    here, there = _webdataset(tmp_path / "local"), _webdataset(tmp_path / "http")
    assert sorted(here) == sorted(there)[: len(here)]
    for key, sample in here.items():
        assert there[key]["jpg"] == sample["jpg"] and there[key]["txt"] == sample["txt"]


def test_skip_budget_stop_then_resume_gives_the_same_bytes(
        table_dir: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    root, rows = table_dir
    rows = [*rows, {"image": "gone.jpg", "caption": "missing", "score": 0.0, "tag": "x"}]
    table = _write("jsonl", root / "pairs.jsonl", rows)
    options = PackOptions(max_count=2, shuffle=False)
    with pytest.raises(SkipBudgetError):  # the last shard's missing file ends the pack after the others
        pack_captions(str(table), str(tmp_path / "out"), options=options, workers=1, max_skipped=SkipBudget.parse("0"))
    assert not (tmp_path / "out" / "index.json").exists()
    (tmp_path / "out" / ".shardkit-pack" / "shard-000001.tar.done.json").unlink()  # as if cut off before it
    resumed = pack_captions(str(table), str(tmp_path / "out"), options=options, workers=1)
    assert resumed.reused_shards == 3 and resumed.manifest.num_samples == 6
    pack_captions(str(table), str(tmp_path / "fresh"), options=options, workers=1)
    assert _files(tmp_path / "out") == _files(tmp_path / "fresh")


@pytest.mark.parametrize(("content", "args", "message"), [
    (b'{"path": "a.jpg", "caption": "x"}\n', ["--image-column", "url"],
     "pairs.jsonl: no image column 'url' (columns: path, caption)"),
    (b'{"image": "a.jpg", "alt": "x"}\n', [],
     "pairs.jsonl: no caption column: none of caption, text, txt is there (columns: image, alt); name it with "
     "--caption-column (caption_column= in Python)"),
    (b'{"image": "a.jpg", "caption": 3}\n', [],
     "pairs.jsonl: row 1: the caption column 'caption' holds int 3, not text"),
    (b'{"image": "a.jpg", "caption": "x", "k": 1}\n', ["--extra-columns", "k,q"],
     "pairs.jsonl: no extra column 'q' (columns: image, caption, k)"),
    (b'{"image": "a.jpg", "caption": "x"}\n{"image": ', [],
     "pairs.jsonl: cannot parse the jsonl table (line 2: not JSON (Expecting value))"),
    (b'{"image": "a.jpg", "caption": "x"}\n{"image": "b.jpg", "caption": {"en": "y"}}\n', [],
     "pairs.jsonl: cannot parse the jsonl table (line 2: field 'caption' is an object, on line 1 a string)"),
])
def test_cli_refuses_a_bad_table_in_one_line(tmp_path: Path, content: bytes, args: list[str], message: str) -> None:
    (tmp_path / "pairs.jsonl").write_bytes(content)
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "pairs.jsonl"), str(tmp_path / "out"), *args])
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert "\n" not in line and line.startswith("error: ") and message in line
    assert not (tmp_path / "out").exists()


def test_cli_packs_a_folder_and_refuses_table_options_for_it(folder: tuple[Path, dict[str, str]],
                                                             tmp_path: Path) -> None:
    root, captions = folder
    runner = CliRunner()
    refused = runner.invoke(cli, ["pack", str(root), str(tmp_path / "out"), "--format", "captions",
                                  "--caption-column", "x"])
    assert refused.exit_code == 2 and "--caption-column: for a caption table" in refused.output
    done = runner.invoke(cli, ["pack", str(root), str(tmp_path / "out"), "--format", "captions", "--workers", "1"])
    assert done.exit_code == 0, done.output
    assert f"samples   {len(captions)}  (captioned images)" in done.output
    assert read_manifest(Store(str(tmp_path / "out"))).kind == "captions"


def test_scan_refuses_values_json_cannot_hold(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardkit.sources import scan_caption_table

    pq.write_table(pa.table({"image": ["a.jpg"], "caption": ["x"], "blob": [b"\x00"]}), tmp_path / "t.parquet")
    (tmp_path / "a.jpg").write_bytes(encode_image())
    with pytest.raises(SourceError, match=r"row 1: column 'blob' holds bytes b'\\x00', not written as JSON"):
        scan_caption_table(str(tmp_path / "t.parquet"))
    assert len(scan_caption_table(str(tmp_path / "t.parquet"), extra_columns=[]).samples) == 1


def test_a_folder_and_a_table_in_a_bucket_pack_as_on_disk(table_dir: tuple[Path, list[dict[str, Any]]],
                                                          tmp_path: Path) -> None:
    import uuid

    from tests.conftest import upload_tree

    root, rows = table_dir
    _write("parquet", root / "pairs.parquet", rows)
    bucket = f"memory://captions/{uuid.uuid4().hex}"
    upload_tree(root, bucket)
    pack_captions(str(root), str(tmp_path / "disk"), options=OPTIONS, workers=1)
    pack_captions(bucket, str(tmp_path / "bucket"), options=OPTIONS, workers=1)
    assert _files(tmp_path / "disk") == _files(tmp_path / "bucket")
    pack_captions(str(root / "pairs.parquet"), str(tmp_path / "table-disk"), options=OPTIONS, workers=1)
    pack_captions(f"{bucket}/pairs.parquet", str(tmp_path / "table-bucket"), options=OPTIONS, workers=1)
    assert _files(tmp_path / "table-disk") == _files(tmp_path / "table-bucket")


def test_a_saved_hf_dataset_packs_its_rows(folder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    root, captions = folder
    rels = list(captions)
    rows = datasets.Dataset.from_dict({"image": [str(root / r) for r in rels], "sentence": list(captions.values()),
                                       "score": [i / 2 for i in range(len(rels))]})
    rows = rows.cast_column("image", datasets.Image())
    datasets.DatasetDict({"train": rows, "val": rows.select([0])}).save_to_disk(str(tmp_path / "saved"))
    runner = CliRunner()
    unsplit = runner.invoke(cli, ["pack", str(tmp_path / "saved"), str(tmp_path / "out"), "--caption-column",
                                  "sentence"])
    assert unsplit.exit_code == 1 and "a DatasetDict: name its split (train, val) with --split" in unsplit.output
    wrong = runner.invoke(cli, ["pack", str(tmp_path / "saved"), str(tmp_path / "out"), "--split", "valid",
                                "--caption-column", "sentence"])
    assert wrong.exit_code == 1 and "no split 'valid' in this DatasetDict (it has train, val)" in wrong.output
    done = runner.invoke(cli, ["pack", str(tmp_path / "saved"), str(tmp_path / "out"), "--split", "train",
                               "--caption-column", "sentence", "--max-count", "4", "--workers", "2"])
    assert done.exit_code == 0, done.output
    samples = _webdataset(tmp_path / "out")
    assert len(samples) == len(rels)
    for key, sample in samples.items():
        row = int(key)
        meta = json.loads(sample["json"])
        assert sample["txt"].decode() == captions[rels[row]] and meta["score"] == row / 2
        assert sample["jpg"] == (root / rels[row]).read_bytes()
        assert meta["source"] in (str(root / rels[row]), rels[row].rsplit("/", 1)[-1])  # the image's stored path


def test_rows_that_repeat_an_earlier_row_are_said_and_still_packed(folder: tuple[Path, dict[str, str]],
                                                                   tmp_path: Path) -> None:
    root, captions = folder
    rel, caption = next(iter(captions.items()))
    table = tmp_path / "pairs.csv"
    table.write_text(f"image,caption\n{root / rel},{caption}\n{root / rel},another caption\n{root / rel},{caption}\n")
    result = CliRunner().invoke(cli, ["pack", str(table), str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert (f"shardkit: {table}: 1 row repeats the image and caption of an earlier row (row 3 repeats row 1); each is "
            "packed as a sample of its own") in result.output  # the second row is another caption: no repeat
    assert "samples   3" in result.output


def test_empty_captions_are_skipped_with_their_reason(folder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """An empty .txt, one of white space only, and an empty table cell were packed as captions ("" and
    "   "), unlike a missing one: they are skipped inputs, with the reason."""
    root, captions = folder
    for name, text in (("empty", b""), ("blank", b"  \n")):
        (root / "brick" / f"{name}.jpg").write_bytes((root / "brick" / "brick_000.jpg").read_bytes())
        (root / "brick" / f"{name}.txt").write_bytes(text)
    result = pack_captions(str(root), str(tmp_path / "out"), options=OPTIONS, workers=1)
    assert result.manifest.num_samples == len(captions)
    assert sorted((s["source"].rsplit("/", 1)[-1], s["reason"]) for s in result.manifest.skipped) == [
        ("blank.jpg", "empty caption (no text, or only white space)"),
        ("empty.jpg", "empty caption (no text, or only white space)")]
    image = next(root.rglob("*.jpg")).relative_to(root)
    rows = [{"image": str(image), "caption": "a brick"}, {"image": str(image), "caption": "   "},
            {"image": str(image), "caption": ""}]
    table = _write("csv", root / "pairs.csv", rows)
    packed = pack_captions(str(table), str(tmp_path / "table"), options=OPTIONS, workers=1).manifest
    assert packed.num_samples == 1
    assert [s["reason"] for s in packed.skipped] == [
        "row 2: no caption (the caption column is empty, or only white space)",
        "row 3: no caption (the caption column is empty, or only white space)"]


@pytest.mark.parametrize(("text", "encoding", "problem"), [
    ("image,caption\na.jpg,ok\nb.jpg,café\n", "latin-1", "not UTF-8 text: line 3 has the byte 0xe9"),
    ("image,caption\ra.jpg,ok\rb.jpg,café\r", "latin-1", "not UTF-8 text: line 3 has the byte 0xe9"),
    ("image,caption\na.jpg,café\n", "utf-16", "UTF-16 text"),
])
def test_cli_names_the_line_of_a_csv_that_is_not_utf8(tmp_path: Path, text: str, encoding: str, problem: str) -> None:
    """A table saved as Latin-1 (lines ended by LF or by CR alone) or UTF-16: where it stops being
    UTF-8, not pyarrow's 0-based column number or a column count."""
    (tmp_path / "pairs.csv").write_bytes(text.encode(encoding))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "pairs.csv"), str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (f"error: {tmp_path / 'pairs.csv'}: cannot parse the csv table ({problem}; "
                                     "save the table as UTF-8)"), result.output
    assert not (tmp_path / "out").exists()


def test_a_csv_that_is_not_utf8_keeps_a_parse_error_of_its_own(tmp_path: Path) -> None:
    """A Latin-1 table whose line 2 has a column too many: that is what the refusal says first."""
    (tmp_path / "pairs.csv").write_bytes("image,caption\na.jpg,a,extra\nb.jpg,café\n".encode("latin-1"))
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "pairs.csv"), str(tmp_path / "out")])
    assert result.exit_code == 1 and "Expected 2 columns, got 3: a.jpg,a,extra" in result.output, result.output


def test_captions_that_span_lines_are_read_whole_in_a_table_of_many_blocks(tmp_path: Path) -> None:
    """pyarrow reads a CSV in 1 MB blocks cut at newlines unless told that values hold newlines:
    a 6 MB table of two-line captions failed to parse ("Expected 2 columns, got 1")."""
    from shardkit.sources import scan_caption_table

    (tmp_path / "a.jpg").write_bytes(encode_image((8, 8)))
    rows = [{"image": "a.jpg", "caption": f"caption {i} of many words\nits second line, with a comma {i}"}
            for i in range(120_000)]
    table = _write("csv", tmp_path / "pairs.csv", rows)
    assert table.stat().st_size > 6 * 2**20
    listing = scan_caption_table(str(table))
    assert len(listing.samples) == len(rows)
    assert listing.samples[77_777].caption == rows[77_777]["caption"]


@pytest.mark.parametrize(("newline", "stray"), [("\n", 'a.jpg,"a cat'), ("\r\n", 'a.jpg,"a cat'),
                                               ("\r", 'a.jpg,"a cat'), ("\n", '"a.jpg,a cat')])
def test_a_quote_that_never_closes_is_refused_with_its_line(tmp_path: Path, newline: str, stray: str) -> None:
    """The rows after a stray quote were packed as one caption, without a word (or, in the image
    column, refused for a column count)."""
    (tmp_path / "a.jpg").write_bytes(encode_image((8, 8)))
    lines = ["image,caption", 'a.jpg,"a ""quoted"" word"', stray, "a.jpg,a dog", "a.jpg,a bird", ""]
    (tmp_path / "pairs.csv").write_text(newline.join(lines), encoding="utf-8", newline="")
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "pairs.csv"), str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (f"error: {tmp_path / 'pairs.csv'}: cannot parse the csv table (line 3: a quoted "
                                     'cell opens and never closes (a stray " ?); the lines after it would be read '
                                     "as its text)"), result.output
    assert not (tmp_path / "out").exists()
    lines[2] = 'a.jpg,"a cat"' if stray.startswith("a.jpg") else '"a.jpg",a cat'  # closed
    (tmp_path / "pairs.csv").write_text(newline.join(lines), encoding="utf-8", newline="")
    result = CliRunner().invoke(cli, ["pack", str(tmp_path / "pairs.csv"), str(tmp_path / "out")])
    assert result.exit_code == 0 and "samples   4" in result.output, result.output


def test_an_images_root_that_is_no_folder_or_holds_none_of_the_images_is_refused_before_packing(
        tmp_path: Path) -> None:
    """Each row was a skipped input ("unreadable file"), then "packed no sample"."""
    from shardkit.sources import scan_caption_table

    table = tmp_path / "t.csv"
    table.write_text("image,caption\na.jpg,x\nb.jpg,y\n", encoding="utf-8")
    with pytest.raises(SourceError, match="nowhere: does not exist: it is where the table.s relative image paths"):
        scan_caption_table(str(table), images_root=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"none of the 2 images the table names exists under .*empty \(e.g. "):
        scan_caption_table(str(table), images_root=str(tmp_path / "empty"))


def test_captions_with_no_image_are_said(folder: tuple[Path, dict[str, str]], tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A .txt whose image is of a format not packed (or gone) was left out without a word."""
    root, captions = folder
    (root / "brick" / "moving.gif").write_bytes(b"GIF89a")
    (root / "brick" / "moving.txt").write_text("a moving brick")
    (root / "brick" / "moving.json").write_text("{}")
    (root / "brick" / "NOTES.txt").write_text("not a caption: no json beside it")
    (root / "README.txt").write_text("nor this: no image in its folder")
    with caplog.at_level("WARNING", logger="shardkit.pack.sources"):
        result = pack_captions(str(root), str(tmp_path / "out"), options=OPTIONS, workers=1)
    assert result.manifest.num_samples == len(captions)
    assert ("1 caption with no image beside it (a .txt and a .json, no image of a format packed), not packed: "
            "brick/moving.txt") in caplog.text
    assert "NOTES" not in caplog.text and "README" not in caplog.text
