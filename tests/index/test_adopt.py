"""``shardkit index``: webdataset ShardWriter shards (PAX headers, no json) become a dataset."""

from __future__ import annotations

import io
import logging
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from sample_data.generate import decode_index, index_color
from shardkit import ShardLoader
from shardkit.cli import cli
from shardkit.errors import FormatError, ManifestError
from shardkit.format.dali_index import dali_index_name, load_dali_index
from shardkit.format.offsets import load_offsets
from shardkit.format.spec import offsets_name
from shardkit.format.tarread import sample_key
from shardkit.index import read_manifest, verify_dataset
from shardkit.index.adopt import adopt_shards
from shardkit.storage import Store
from tests.conftest import encode_image

wds = pytest.importorskip("webdataset")

CLASSES = ["cat", "dog", "eel"]
N = 24  # a multiple of the batch size: drop_last=False would pad with repeats otherwise


def _write_wds(root: Path, *, with_json: bool = False, n: int = N) -> Path:
    """webdataset's own ShardWriter: jpg and png images whose pixels encode their index."""
    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=10) as sink:
        for i in range(n):
            fmt, ext = ("PNG", "png") if i % 3 == 0 else ("JPEG", "jpeg" if i % 3 == 1 else "jpg")
            sample: dict[str, object] = {"__key__": f"s{i:05d}",
                                         ext: encode_image((16, 16), fmt=fmt, color=index_color(i)),
                      "cls": str(i % 3).encode()}
            if with_json:
                sample["json"] = {"class": CLASSES[i % 3]}
            sink.write(sample)
    return root


def test_shardwriter_shards_become_a_dataset(tmp_path: Path) -> None:
    root = _write_wds(tmp_path / "wds")
    assert b"PaxHeader" in (root / "train-000000.tar").read_bytes()
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(CLASSES) + "\n", encoding="utf-8-sig")  # with a BOM: no part of the first name
    result = CliRunner().invoke(cli, ["index", str(root), "--classes", str(classes)])
    assert result.exit_code == 0, result.output
    assert "3 shards, 24 samples, 3 classes" in result.output
    manifest = read_manifest(Store(str(root)))
    assert manifest.adopted and manifest.classes == tuple(CLASSES)
    assert [s.num_samples for s in manifest.shards] == [10, 10, 4]

    seen: dict[int, int] = {}
    with ShardLoader(str(root), batch_size=4, shuffle=False, drop_last=False, keys=True) as loader:
        for images, labels, keys in loader:
            for image, label, key in zip(images, labels, keys, strict=True):
                index = int(key[1:])
                assert index not in seen
                seen[index] = int(label)
                assert decode_index(image) == index
    assert seen == {i: i % 3 for i in range(N)}

    info = CliRunner().invoke(cli, ["info", str(root)])
    assert info.exit_code == 0 and "24" in info.output and "cat, dog, eel" in info.output
    ok = CliRunner().invoke(cli, ["verify", "--decode", str(root)])
    assert ok.exit_code == 0, ok.output

    shard = root / "train-000001.tar"
    data = bytearray(shard.read_bytes())
    data[3000] ^= 0x01  # one flipped byte (inside image data: only the hash can see it)
    shard.write_bytes(bytes(data))
    bad = CliRunner().invoke(cli, ["verify", str(root)])
    assert bad.exit_code == 1
    assert "train-000001.tar: sha256 differs from the manifest" in bad.output


def test_class_names_from_json_and_json_is_checked_when_present(tmp_path: Path) -> None:
    root = _write_wds(tmp_path / "wds", with_json=True)
    manifest = adopt_shards(str(root))
    assert manifest.classes == tuple(CLASSES)
    assert verify_dataset(str(root)).ok
    with pytest.raises(FormatError, match="label 0 is 'cat' in the shards' json but 'x'"):
        adopt_shards(str(root), classes=["x", "y", "z"], overwrite=True)


def test_labels_without_names_are_numbered(tmp_path: Path) -> None:
    manifest = adopt_shards(str(_write_wds(tmp_path / "wds", n=5)))
    assert manifest.classes == ("0", "1", "2")


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(
    ("members", "error", "message"),
    [
        ([("a.jpg", b"x")], FormatError, r"x-000000.tar:a: sample has no 'cls' member"),
        ([("a.cls", b"1")], FormatError, r"x-000000.tar:a: expected one image member"),
        ([("a.JPG", b"x"), ("a.cls", b"1")], FormatError,
         r"found \['JPG', 'cls'\]; extensions are case-sensitive in shards: JPG is not jpg; rename the members or "
         "repack"),
        ([("a.cls", b"one"), ("a.jpg", b"x")], FormatError, r"'cls' member is b'one'"),
        ([("a b.cls", b"1"), ("a b.jpg", b"x")], FormatError, "invalid sample key"),
        ([("a.cls", b"1"), ("a.jpg", b"x"), ("a.json", b"[1]")], FormatError,
         "must be a JSON object, not list"),
        ([("a.cls", b"1"), ("a.jpg", b"x"), ("a.json", b'{"label": 2}')], FormatError,
         "label 2 differs from 'cls' 1"),
        ([("a.cls", b"1"), ("a.jpg", b"x"), ("a.json", b"{")], FormatError,
         "'json' member is not valid JSON"),
        ([("a.cls", b"1"), ("a.jpg", b"x"), ("a.json", b"{not json")], FormatError,
         r"'json' member is not valid JSON \(Expecting property name enclosed in double quotes: line 1 column 2"),
        ([("a.cls", b"1"), ("a.jpg", b"x"), ("b.cls", b"1"), ("a.png", b"x")], FormatError,
         "split"),
        # `tar -cf x.tar -C dir .`: every key starts "./", and the members come in directory order
        ([("./b.cls", b"1"), ("./a.cls", b"1"), ("./b.jpg", b"x")], FormatError,
         r"x-000000.tar:./b: invalid sample key './b' \(allowed: A-Z a-z 0-9 _ -\): its members lie in a folder; "
         r"tar the files from inside it as docs/guides/interop.md says: \(cd DIR && ls \| LC_ALL=C sort \| tar -cf "
         r"../shard-000000.tar -T -\); from webdataset's ShardWriter, write each __key__ without a '/'"),
    ],
)
def test_bad_shards_are_refused_naming_the_sample(tmp_path: Path, members: list[tuple[str, bytes]],
                                                  error: type[Exception], message: str) -> None:
    _tar(tmp_path / "x-000000.tar", members)
    with pytest.raises(error, match=message):
        adopt_shards(str(tmp_path))
    assert not (tmp_path / "index.json").exists()


def test_refusals(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no .tar shards"):
        adopt_shards(str(tmp_path))
    with pytest.raises(ManifestError, match=f"{tmp_path / 'nope'}: does not exist"):
        adopt_shards(str(tmp_path / "nope"))
    (tmp_path / "one.tar").write_bytes(b"hi")
    with pytest.raises(ManifestError, match="one.tar: is a file, not a directory of .tar shards"):
        adopt_shards(str(tmp_path / "one.tar"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.tar").write_bytes(bytes(range(256)) * 8)
    with pytest.raises(FormatError, match=r"junk/a.tar: not a tar file \(its first 512 bytes are no tar header\)"):
        adopt_shards(str(tmp_path / "junk"))
    (tmp_path / "junk" / "a.tar").write_bytes(b"hi")
    with pytest.raises(FormatError, match=r"not a tar file \(2 bytes, less than one 512-byte tar header\)"):
        adopt_shards(str(tmp_path / "junk"))
    root = _write_wds(tmp_path / "wds", n=3)
    (root / "train-000000.idx").write_text("v1.2 3\n")  # DALI's wds2idx under its default name
    result = CliRunner().invoke(cli, ["index", str(root)])
    assert result.exit_code == 1 and "not a shardkit offsets file (a DALI index" in result.output
    adopt_shards(str(root), overwrite=True)
    with pytest.raises(ManifestError, match="already has index.json"):
        adopt_shards(str(root))
    (tmp_path / "dup").mkdir()
    _tar(tmp_path / "dup" / "a-000000.tar", [("k.cls", b"1"), ("k.jpg", b"x")])
    _tar(tmp_path / "dup" / "a-000001.tar", [("k.cls", b"1"), ("k.jpg", b"x")])
    with pytest.raises(FormatError, match=r"a-000001.tar: sample key 'k' is also a sample of \S*a-000000.tar: keys "
                       "must be unique in a dataset"):
        adopt_shards(str(tmp_path / "dup"))


def test_dali_index_matches_the_tar(tmp_path: Path) -> None:
    root = _write_wds(tmp_path / "wds")
    result = CliRunner().invoke(cli, ["index", str(root), "--dali-index"])
    assert result.exit_code == 0, result.output
    for shard in sorted(root.glob("*.tar")):
        text = (root / dali_index_name(shard.name)).read_bytes()
        assert text.startswith(b"v1.2 ")
        samples = load_dali_index(text, where=shard.name)
        data = shard.read_bytes()
        with tarfile.open(shard) as tar:
            expected = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
        listed = [(m.name, m.offset, m.size) for sample in samples for m in sample]
        assert listed == expected  # DALI's offsets are of the member data, as tarfile reports them
        for sample in samples:
            keys = {sample_key(m.name, where="t")[0] for m in sample}
            assert len(keys) == 1
            for m in sample:
                assert m.name.endswith("." + m.ext)
                with tarfile.open(shard) as tar:
                    handle = tar.extractfile(m.name)
                    assert handle is not None and handle.read() == data[m.offset:m.offset + m.size]
        spans = load_offsets((root / offsets_name(shard.name)).read_bytes(), where="o")
        assert len(spans) == len(samples)


def test_foreign_shards_without_offsets_files_and_info_hint(tmp_path: Path) -> None:
    root = _write_wds(tmp_path / "wds")
    info = CliRunner().invoke(cli, ["info", str(root)])
    assert info.exit_code == 1 and "shardkit index DIR" in info.output
    adopt_shards(str(root))
    for idx in root.glob("*.idx"):  # the loader then scans the PAX-headed tars itself
        idx.unlink()
    with ShardLoader(str(root), batch_size=4, shuffle=False, drop_last=False, keys=True) as loader:
        keys = [k for _, _, batch in loader for k in batch]
    assert sorted(keys) == [f"s{i:05d}" for i in range(N)]


def test_adopt_on_an_object_store_url(tmp_path: Path) -> None:
    import fsspec

    local = _write_wds(tmp_path / "wds", n=12)
    fs = fsspec.filesystem("memory")
    for shard in local.glob("*.tar"):
        fs.pipe(f"/adopt-test/{shard.name}", shard.read_bytes())
    manifest = adopt_shards("memory://adopt-test")
    assert manifest.num_samples == 12 and fs.exists("/adopt-test/index.json")
    assert verify_dataset("memory://adopt-test").ok


def test_class_name_file_errors(tmp_path: Path) -> None:
    root = _write_wds(tmp_path / "wds", n=6)
    short = tmp_path / "short.txt"
    short.write_text("cat\ndog\n")
    result = CliRunner().invoke(cli, ["index", str(root), "--classes", str(short)])
    assert (result.exit_code == 1
            and "label 2 is out of range for the 2 class names given (labels run from 0 to 1)" in result.output)
    assert ".tar:" in result.output.split(": label 2")[0], result.output  # names the first sample with it
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    result = CliRunner().invoke(cli, ["index", str(root), "--classes", str(empty)])
    assert result.exit_code == 2 and "lists no class names" in result.output
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9\n")
    result = CliRunner().invoke(cli, ["index", str(root), "--classes", str(latin)])
    assert result.exit_code == 2 and "as UTF-8 text" in result.output
    assert not (root / "index.json").exists()


def test_keys_with_a_dot_are_named_as_such(tmp_path: Path) -> None:
    root = tmp_path / "dotted"
    root.mkdir()
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=10) as sink:
        for i in range(4):
            sink.write({"__key__": f"img.{i}", "jpg": encode_image((8, 8)), "cls": b"0"})
    result = CliRunner().invoke(cli, ["index", str(root)])
    assert result.exit_code == 1, result.output
    assert ("shard-000000.tar:img: members 'img.0.cls', 'img.0.jpg' (and 6 more members like them): a key must "
            "not contain a dot (webdataset splits a member's name at the first dot, so these read as key 'img' "
            "with extensions '0.cls', '0.jpg')") in result.output


def test_an_image_extension_of_several_parts_is_named_as_such(tmp_path: Path) -> None:
    """``k0.input.jpg`` beside ``k0.cls``: one sample whose image's extension is ``input.jpg``; it
    was said to be a key with a dot, which ``k0`` is not."""
    _tar(tmp_path / "a-000000.tar", [("k0.cls", b"0"), ("k0.input.jpg", encode_image((8, 8)))])
    with pytest.raises(FormatError) as refused:
        adopt_shards(str(tmp_path))
    assert str(refused.value).endswith("a-000000.tar:k0: member 'k0.input.jpg': its extension is 'input.jpg' "
                                       "(everything after the key's first dot), not an image extension (bmp, jpeg, "
                                       "jpg, pgm, png, ppm, tif, tiff, webp); write the image as 'k0.jpg'")


def test_compressed_shards_are_named_when_there_is_no_tar(tmp_path: Path) -> None:
    (tmp_path / "shard-000000.tar.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(ManifestError, match=r"no .tar shards here to index \(found 1 compressed shard, "
                                            r"shard-000000.tar.gz: decompress them first\)"):
        adopt_shards(str(tmp_path))
    for name in ("shard-000001.tgz", "shard-000002.tar.zst"):
        (tmp_path / name).write_bytes(b"x")
    result = CliRunner().invoke(cli, ["index", str(tmp_path)])
    assert result.exit_code == 1 and ("(found 3 compressed shards, shard-000000.tar.gz, shard-000001.tgz, ...: "
                                      "decompress them first)") in result.output, result.output


def test_compressed_or_upper_case_shards_beside_tar_ones_are_refused_not_left_out(tmp_path: Path) -> None:
    """A .tar.gz or .TAR beside .tar shards was left out of the index, its samples lost, and
    verify said OK."""
    root = tmp_path / "mixed"
    root.mkdir()
    _tar(root / "shard-000000.tar", [("a.jpg", encode_image((8, 8))), ("a.cls", b"0")])
    (root / "shard-000001.tar.gz").write_bytes(b"\x1f\x8b")
    (root / "shard-000002.TAR").write_bytes(b"x")
    result = CliRunner().invoke(cli, ["index", str(root)])
    assert result.exit_code == 1
    assert result.output == (f"error: {root}: holds 1 .tar shard and beside it 1 compressed shard "
                             "(shard-000001.tar.gz: decompress it) and shard-000002.TAR (shard names end in .tar, in "
                             "lower case: rename it), which an index would leave out; or move them aside\n")
    assert not (root / "index.json").exists()
    (root / "shard-000001.tar.gz").unlink()
    (root / "shard-000002.TAR").rename(root / "elsewhere.TAR.bak")
    assert CliRunner().invoke(cli, ["index", str(root)]).exit_code == 0
    (root / "shard-000003.tgz").write_bytes(b"x")  # one that came later: verify names it
    result = CliRunner().invoke(cli, ["verify", str(root)])
    assert "1 tar file beside the shards not in index.json" in result.output, result.output
    assert str(root / "shard-000003.tgz") in result.output
    assert "(shardkit index adopts shards made elsewhere" in result.output  # compressed: no --overwrite takes it
    (root / "shard-000003.tgz").unlink()
    shutil.copy(root / "shard-000000.tar", root / "shard-000004.tar")
    result = CliRunner().invoke(cli, ["verify", str(root)])
    assert "no loader reads it (shardkit index --overwrite indexes it with the others)" in result.output  # adopted


def test_two_labels_of_one_class_name_in_the_json_are_refused_as_classes_are(tmp_path: Path) -> None:
    """Labels 0 and 1 both named "cat" in the samples' json were indexed as classes "cat, cat",
    where a --classes file naming "cat" twice is refused."""
    root = tmp_path / "dup"
    root.mkdir()
    _tar(root / "x-000000.tar", [("a.jpg", encode_image((8, 8))), ("a.cls", b"0"), ("a.json", b'{"class": "cat"}'),
                                 ("b.jpg", encode_image((8, 8))), ("b.cls", b"1"), ("b.json", b'{"class": "cat"}')])
    result = CliRunner().invoke(cli, ["index", str(root)])
    assert result.exit_code == 1
    assert result.output == (f"error: {root / 'x-000000.tar'}:b: labels 0 and 1 are both 'cat' in the shards' json "
                             f"(at {root / 'x-000000.tar'}:a and here): class names must differ; pass --classes FILE "
                             "naming the classes in label order\n"), result.output
    assert not (root / "index.json").exists()
    other = tmp_path / "numbers"  # json names "2" for label 0; label 2 has none: no two names alike in the json
    other.mkdir()
    _tar(other / "x-000000.tar", [("a.jpg", encode_image((8, 8))), ("a.cls", b"0"), ("a.json", b'{"class": "2"}'),
                                  ("c.jpg", encode_image((8, 8))), ("c.cls", b"2")])
    result = CliRunner().invoke(cli, ["index", str(other)])
    assert result.exit_code == 0, result.output


def test_an_unrelated_archive_beside_the_shards_is_said_and_left_out(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A backup.tar.gz (not named as the shards are) blocked indexing, with no way past it."""
    root = tmp_path / "set"
    root.mkdir()
    _tar(root / "shard-000000.tar", [("a.jpg", encode_image((8, 8))), ("a.cls", b"0")])
    (root / "backup.tar.gz").write_bytes(b"x")
    (root / "old-000001.tgz").mkdir()  # a folder so named is no archive
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        result = CliRunner().invoke(cli, ["index", str(root)])
    assert result.exit_code == 0, result.output
    assert [r.getMessage() for r in caplog.records] == [
        f"shardkit: {root}: left out 1 tar archive beside the .tar shards, backup.tar.gz: only .tar files are indexed "
        "(decompress or rename it and index again if it holds samples of this set)"]


def test_shards_listed_by_the_shell_are_told_to_name_their_folder(tmp_path: Path) -> None:
    """``shardkit index shards/*.tar`` got click's "Got unexpected extra argument"."""
    shards = [str(tmp_path / f"s-{i}.tar") for i in range(3)]
    result = CliRunner().invoke(cli, ["index", *shards, "--kind", "auto"])
    assert result.exit_code == 2
    assert (f"Error: index takes the folder that holds the shards, not 3 shards: shardkit index {tmp_path}\n"
            in result.output), result.output


def _labelled(root: Path, labels: list[int]) -> Path:
    root.mkdir()
    _tar(root / "x-000000.tar", [m for i, label in enumerate(labels)
                                 for m in ((f"s{i}.jpg", b"x"), (f"s{i}.cls", str(label).encode()))])
    return root


def test_a_mistyped_label_that_leaves_most_classes_unused_is_refused(tmp_path: Path) -> None:
    root = _labelled(tmp_path / "typo", [0, 1, 149999, 0])
    result = CliRunner().invoke(cli, ["index", str(root)])
    assert result.exit_code == 1 and result.output == (
        f"error: {root / 'x-000000.tar'}:s2: label 149999 leaves labels 2 to 149998 unused: 149,997 of the 150,000 "
        "classes its class list would hold, for 3 labels in use (a mistyped label?); if it is meant, pass "
        "--classes FILE naming the classes in label order\n")
    assert not (root / "index.json").exists()
    names = tmp_path / "classes.txt"
    names.write_text("".join(f"c{i}\n" for i in range(150000)))
    result = CliRunner().invoke(cli, ["index", str(root), "--classes", str(names)])
    assert result.exit_code == 0 and "150,000 classes" in result.output, result.output


@pytest.mark.parametrize("labels", [
    list(range(0, 21841, 99)),  # a sparse subset of ImageNet-21k's classes
    [*range(250), 21840],  # 250 classes and the last one
    list(range(15000, 21841, 10)),  # the upper classes only
    [0, 9999],  # a run of 9,998 unused: below the least refused
    [12345],  # one class of a large label space
    [*range(10), *range(50000, 50010)],  # two ends of a label space of 50,010
    list(range(15000, 15005)),  # one shard of ImageNet-21k sorted by class
    [*range(150), 21840],  # 150 classes and ImageNet-21k's last
], ids=["sparse", "last", "upper", "short-run", "one-large", "two-ends", "sorted-shard", "few-and-last"])
def test_real_label_spaces_with_unused_classes_are_indexed(tmp_path: Path, labels: list[int]) -> None:
    manifest = adopt_shards(str(_labelled(tmp_path / "ds", labels)))
    assert manifest.classes is not None and len(manifest.classes) == max(labels) + 1


def test_every_shard_with_a_problem_is_listed_in_one_run(tmp_path: Path) -> None:
    """One run names the first problem of every shard that has one, not only the first shard's:
    a set with bad samples in two of three shards needed a run per fix. No index is written."""
    _tar(tmp_path / "a-000000.tar", [("k0.cls", b"1"), ("k0.jpg", b"x"), ("k1.jpg", b"x")])
    _tar(tmp_path / "a-000001.tar", [("k2.cls", b"1"), ("k2.jpg", b"x")])
    _tar(tmp_path / "a-000002.tar", [("k3.cls", b"x1"), ("k3.jpg", b"x")])
    with pytest.raises(FormatError) as refused:
        adopt_shards(str(tmp_path))
    lines = str(refused.value).splitlines()
    assert lines[0] == (f"{tmp_path}: 2 of the 3 shards read cannot be indexed as they are (the first problem "
                        "of each):")
    assert lines[1].startswith(f"  - {tmp_path}/a-000000.tar:k1: sample has no 'cls' member")
    assert lines[2].startswith(f"  - {tmp_path}/a-000002.tar:k3: 'cls' member")
    assert len(lines) == 3 and not (tmp_path / "index.json").exists()
    result = CliRunner().invoke(cli, ["index", str(tmp_path)])
    assert result.exit_code == 1 and "a-000000.tar:k1" in result.output and "a-000002.tar:k3" in result.output


def test_listing_stops_after_so_many_shards_with_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardkit.index import adopt

    monkeypatch.setattr(adopt, "MAX_LISTED_PROBLEMS", 2)
    for i in range(4):
        _tar(tmp_path / f"a-{i:06d}.tar", [(f"k{i}.jpg", b"x")])
    with pytest.raises(FormatError, match=r"2 of the 2 shards read cannot be indexed as they are \(the first problem "
                                          r"of each\); stopped reading after 2 of the 4 shards:"):
        adopt_shards(str(tmp_path))


def test_image_members_that_are_no_image_of_their_kind_are_said_once(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A 0-byte jpg and text named .jpg were indexed with "indexed ..." and nothing more (verify
    without --decode said OK): they are indexed all the same (the loader replaces them), and one
    warning counts them and names the first."""
    import logging

    jpeg = b"\xff\xd8\xff\xe0" + b"\0" * 16
    _tar(tmp_path / "a-000000.tar", [("k0.cls", b"0"), ("k0.jpg", jpeg), ("k1.cls", b"1"), ("k1.jpg", b""),
                                     ("k2.cls", b"1"), ("k2.jpg", b"not a jpeg"), ("k3.cls", b"0"),
                                     ("k3.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 8)])
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        manifest = adopt_shards(str(tmp_path))
    assert manifest.num_samples == 4
    assert [r.getMessage() for r in caplog.records if "to_tuple" not in r.getMessage()] == [
        f"shardkit: 2 image members are no image ({tmp_path}/a-000000.tar:k1.jpg: empty (0 bytes), and 1 more); "
        "indexed all the same: the loader replaces such samples with others (on_error='replace'), and shardkit "
        "verify --decode reports them as problems"]


def test_image_members_under_several_extensions_are_said_as_pack_says_them(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """jpg and png members in one set: HF datasets' webdataset loader gives the png samples no
    image; pack warns of it, index said nothing."""
    import logging

    _tar(tmp_path / "a-000000.tar", [("k0.cls", b"0"), ("k0.jpg", encode_image((8, 8))), ("k1.cls", b"1"),
                                     ("k1.jpg", encode_image((8, 8))), ("k2.cls", b"1"),
                                     ("k2.png", encode_image((8, 8), fmt="PNG"))])
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        adopt_shards(str(tmp_path))
    assert [r.getMessage() for r in caplog.records] == [
        "shardkit: 3 images are 2 jpg and 1 png: HF datasets' webdataset loader and webdataset's to_tuple('jpg') give "
        "those samples no image (None, or a skipped sample); read them with to_tuple('jpg;png'), or write every "
        "image member under one extension"]


def test_real_images_of_every_member_kind_read_as_what_they_are(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Images PIL writes in each mode, under the extension shardkit pack gives them (a grayscale
    image becomes a .ppm starting P5, a bilevel one P4), BigTIFF included, index without a warning;
    a PNG named .jpg is said to be one, as decodable, apart from members that are no image."""
    import logging

    from PIL import Image

    def encoded(mode: str, fmt: str, **kw: object) -> bytes:
        out = io.BytesIO()
        Image.new(mode, (12, 10), 1 if mode == "1" else 90).save(out, fmt, **kw)
        return out.getvalue()

    members = [("jpg", encoded("RGB", "JPEG")), ("jpg", encoded("CMYK", "JPEG")),
               ("jpg", encoded("RGB", "JPEG", progressive=True)), ("png", encoded("LA", "PNG")),
               ("webp", encoded("RGB", "WEBP", lossless=True)), ("bmp", encoded("P", "BMP")),
               ("tif", encoded("RGB", "TIFF")), ("tiff", encoded("I;16B", "TIFF")),
               ("tif", encoded("RGB", "TIFF", big_tiff=True)), ("ppm", encoded("L", "PPM")),
               ("ppm", encoded("1", "PPM")), ("pgm", encoded("RGB", "PPM"))]
    _tar(tmp_path / "a-000000.tar", [m for i, (ext, data) in enumerate(members)
                                     for m in ((f"k{i}.cls", b"0"), (f"k{i}.{ext}", data))])
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        assert adopt_shards(str(tmp_path)).num_samples == len(members)
    assert [r for r in caplog.records if "to_tuple" not in r.getMessage()] == []  # but the extensions' mix
    caplog.clear()
    other = tmp_path / "other"
    other.mkdir()
    _tar(other / "a-000000.tar", [("k0.cls", b"0"), ("k0.jpg", encoded("RGB", "PNG")),
                                  ("k1.cls", b"0"), ("k1.jpg", b"")])
    with caplog.at_level(logging.WARNING, logger="shardkit"):
        adopt_shards(str(other))
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"shardkit: 1 image member is no image ({other}/a-000000.tar:k1.jpg: empty (0 bytes))")
    assert said[1].startswith(f"shardkit: 1 image is of another format than its extension says ({other}/"
                              "a-000000.tar:k0.jpg: a png named .jpg); indexed as it is: shardkit decodes images by "
                              "their content")


def test_a_refused_shard_leaves_its_keys_out_of_the_others_checks(tmp_path: Path) -> None:
    """Keys with a dot in three shards: each shard is named for its dotted keys, not the second and
    third for 'img' being also a sample of the first (the first's refusal had kept its keys)."""
    for i in range(3):
        _tar(tmp_path / f"a-{i:06d}.tar", [(f"img.{2 * i}.cls", b"0"), (f"img.{2 * i}.jpg", b"x"),
                                           (f"img.{2 * i + 1}.cls", b"0"), (f"img.{2 * i + 1}.jpg", b"x")])
    with pytest.raises(FormatError) as refused:
        adopt_shards(str(tmp_path))
    assert "is also a sample of" not in str(refused.value)
    assert str(refused.value).count("must not contain a dot") == 3, refused.value

