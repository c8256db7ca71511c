import io
import json

import pytest

from shardkit.errors import ManifestError
from shardkit.format import TarShardWriter, iter_samples, load_offsets
from shardkit.format.offsets import REPAIR
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import PackOptions, pack
from shardkit.storage import Store


@pytest.fixture
def packed(small_tree, tmp_path):
    dst = tmp_path / "out"
    pack(str(small_tree), str(dst), options=PackOptions(max_count=5), workers=1)
    return dst


def test_clean_dataset_verifies(packed):
    report = verify_dataset(str(packed), decode=True)
    assert report.ok, report.problems
    assert (report.shards_checked, report.samples_checked, report.images_decoded) == (3, 12, 12)


@pytest.mark.parametrize("cut", [1500, 1536])  # mid-header; at a block's end, as a copy stopped between blocks
def test_truncated_shard_is_named_by_its_size_not_as_a_tar_to_mend(packed, cut):
    """A shard cut short read as a tar without its end marker, and the hint to append one made a
    damaged shard look whole: its size against the manifest's is said instead."""
    shard = packed / "shard-000001.tar"
    whole = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:cut])
    report = verify_dataset(str(packed))
    assert report.problems == [f"{shard}: {cut:,} bytes, index.json says {whole:,} (cut short): copy it again from "
                               "where it was packed, or pack the dataset again"]


def test_tampered_bytes_give_a_hash_mismatch(packed):
    shard = packed / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[-1] = 1  # inside the end-of-archive padding: still a readable tar
    shard.write_bytes(bytes(data))
    report = verify_dataset(str(packed))
    assert report.problems == [f"{shard}: sha256 differs from the manifest"]


def _rewrite(shard, mutate):
    samples = list(iter_samples(io.BytesIO(shard.read_bytes()), where=str(shard)))
    buf = io.BytesIO()
    writer = TarShardWriter(buf)
    for key, fields in mutate(samples):
        writer.add(key, list(fields.items()))
    writer.close()
    shard.write_bytes(buf.getvalue())


def test_decode_catches_an_undecodable_image(packed):
    shard = packed / "shard-000002.tar"

    def corrupt(samples):
        key, fields = samples[0]
        ext = next(e for e in fields if e in ("jpg", "png"))
        fields[ext] = fields[ext][:40]
        return samples

    _rewrite(shard, corrupt)
    without = verify_dataset(str(packed))
    assert all("does not decode" not in p for p in without.problems)
    report = verify_dataset(str(packed), decode=True)
    decode_problems = [p for p in report.problems if "does not decode" in p]
    assert len(decode_problems) == 1 and str(shard) in decode_problems[0]


def test_label_count_and_offsets_mismatches(packed):
    shard = packed / "shard-000000.tar"

    def relabel_and_drop(samples):
        key, fields = samples[0]
        fields["cls"] = b"2" if fields["cls"] != b"2" else b"0"
        return samples[:-1]

    _rewrite(shard, relabel_and_drop)
    problems = "\n".join(verify_dataset(str(packed)).problems)
    assert "disagrees" in problems
    assert "samples, manifest says 5" in problems
    assert "lists 5 samples, the shard has 4" in problems
    assert "sha256 differs" in problems


def test_json_member_that_is_not_an_object_is_a_problem(packed):
    shard = packed / "shard-000000.tar"

    def listify(samples):
        samples[0][1]["json"] = b"[1, 2]"
        return samples

    _rewrite(shard, listify)
    problems = verify_dataset(str(packed)).problems
    assert any(p.startswith(f"{shard}:") and "json: must be a JSON object, not list" in p
               for p in problems), problems


def test_malformed_offsets_header_is_a_problem(packed):
    idx = packed / "shard-000000.idx"
    idx.write_bytes(idx.read_bytes().replace(b" 5\n", b" five\n", 1))
    problems = verify_dataset(str(packed)).problems
    assert problems == [f"{idx}: malformed sample count 'five' in the header; {REPAIR}"]


def test_offsets_that_point_at_the_wrong_bytes_are_a_problem(packed):
    """An offsets line with the right key but a wrong offset or size passed verify (only keys were
    compared) while the loader then read the wrong bytes; each line is now compared with the span
    found in the shard."""
    idx = packed / "shard-000000.idx"
    lines = idx.read_text().splitlines()
    key, offset, size, crc = lines[2].split()
    lines[2] = f"{key} {offset} {int(size) + 512} {crc}"
    idx.write_text("\n".join(lines) + "\n")
    problems = verify_dataset(str(packed)).problems
    assert problems == [f"{idx}: line 3 says {key} {offset} {int(size) + 512}, the shard has {key} {offset} {size} "
                        "(the loader would read the wrong bytes)"]


def test_missing_shard_and_bad_manifest(packed):
    (packed / "shard-000001.tar").unlink()
    report = verify_dataset(str(packed))
    assert any("shard-000001.tar" in p and "no such file" in p for p in report.problems)
    doc = json.loads((packed / "index.json").read_bytes())
    doc["version"] = 99
    (packed / "index.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="version 99"):
        verify_dataset(str(packed))


def test_manifest_lists_all_shards(packed):
    m = read_manifest(Store(str(packed)))
    assert [s.url for s in m.shards] == [f"shard-00000{i}.tar" for i in range(3)]
    assert [s.num_samples for s in m.shards] == [5, 5, 2]


def test_ctrl_c_wrapped_by_a_lazy_plugin_import_is_not_a_corrupt_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C landing while PIL imports a plugin's class arrives wrapped in a RuntimeError
    ("Error calling __set_name__ ...", seen in a pty test): verify reported it as an image that
    does not decode. It is the interrupt."""
    from PIL import Image

    from shardkit.index import verify

    class SetName:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    def plugin_import(*_args: object, **_kwargs: object) -> None:
        type("GifImageFile", (), {"is_animated": SetName()})  # 3.11 wraps it in a RuntimeError; 3.12 does not

    monkeypatch.setattr(Image, "open", plugin_import)
    with pytest.raises(KeyboardInterrupt):
        verify._decodes(b"GIF89a")
    monkeypatch.setattr(Image, "open", lambda *_a, **_k: (_ for _ in ()).throw(OSError("broken data stream")))
    assert verify._decodes(b"GIF89a") == "OSError: broken data stream"  # a real decode failure is still one


def test_a_hash_mismatch_names_the_samples_whose_bytes_changed(packed):
    """Each sample's CRC-32 in the offsets file says which samples a flipped byte hit."""
    shard = packed / "shard-000000.tar"
    spans = load_offsets((packed / "shard-000000.idx").read_bytes(), where="idx")
    data = bytearray(shard.read_bytes())
    data[spans[1].offset + 600] ^= 0x55  # inside the second sample's first member's data
    shard.write_bytes(bytes(data))
    problems = verify_dataset(str(packed)).problems
    assert problems[:2] == [f"{shard}: sha256 differs from the manifest",
                            f"{shard}:{spans[1].key}: its bytes changed after packing or indexing (crc32 differs "
                            "from the offsets file)"]


def test_tar_files_the_index_does_not_name_are_listed_not_failed(packed):
    """A shard copied into the folder, or left from another pack: no loader reads it, so the
    dataset still verifies, but the files are named (and the CLI warns) instead of passing unseen."""
    from click.testing import CliRunner

    from shardkit.cli import cli

    extra = packed / "shard-999999.tar"
    extra.write_bytes((packed / read_manifest(Store(str(packed))).shards[0].url).read_bytes())
    (packed / "._shard-999999.tar").write_bytes(b"macOS metadata")  # hidden: left out, as index does
    report = verify_dataset(str(packed))
    assert report.ok and report.unlisted == [str(extra)]
    result = CliRunner().invoke(cli, ["verify", str(packed), "-q"])
    assert result.exit_code == 0 and result.stderr.startswith(
        f"WARN 1 tar file beside the shards not in index.json: {extra}; no loader reads it (shardkit index adopts "
        "shards made elsewhere, in a folder of their own, into a dataset of their own)"), result.output


def test_a_folder_that_cannot_be_listed_still_verifies(packed, monkeypatch):
    """Shards readable by name in a folder that cannot be listed (mode 0711, a bucket read without
    the right to list it): every shard is checked, only the look for unlisted files is given up."""
    import os

    def refused(_path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "listdir", refused)
    report = verify_dataset(str(packed))
    assert report.ok and report.shards_checked == 3 and report.unlisted == []


def test_an_image_member_that_is_no_image_is_said_so_without_an_object_address(tmp_path):
    import tarfile

    from shardkit.index.adopt import adopt_shards

    with tarfile.open(tmp_path / "shard-000000.tar", "w") as tar:
        for name, data in (("a.jpg", b"garbage bytes here"), ("a.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    adopt_shards(str(tmp_path))
    problems = verify_dataset(str(tmp_path), decode=True).problems
    assert problems == [f"{tmp_path / 'shard-000000.tar'}:a.jpg: does not decode (not an image file PIL can "
                        "identify (no image format's, or a damaged header); its first bytes are b'garbage byte')"]
    with tarfile.open(tmp_path / "shard-000000.tar", "w") as tar:
        for name, data in (("a.jpg", b""), ("a.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    adopt_shards(str(tmp_path), overwrite=True)
    assert verify_dataset(str(tmp_path), decode=True).problems == [
        f"{tmp_path / 'shard-000000.tar'}:a.jpg: does not decode (empty (0 bytes))"]
    with tarfile.open(tmp_path / "shard-000000.tar", "w") as tar:  # another tool's json: not taken for ours
        for name, data in (("a.jpg", b""), ("a.cls", b"1"), ("a.json", b'{"source": "cat/flipped.jpg"}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    adopt_shards(str(tmp_path), overwrite=True)
    assert verify_dataset(str(tmp_path), decode=True).problems == [
        f"{tmp_path / 'shard-000000.tar'}:a.jpg: does not decode (empty (0 bytes))"]
    # without decode, the first bytes still tell an empty member or one of no image format
    assert verify_dataset(str(tmp_path)).problems == [
        f"{tmp_path / 'shard-000000.tar'}:a.jpg: empty (0 bytes): no image the loader decodes"]


def test_a_dataset_of_no_sample_is_a_problem(tmp_path):
    """verify passed an index.json emptied by hand ("OK: 0 shards, 0 samples"); pack refuses to make one."""
    import json

    from shardkit.pack import PackOptions, pack
    from tests.conftest import encode_image, write_tree

    write_tree(tmp_path / "src", {"a/x.jpg": encode_image()})
    pack(str(tmp_path / "src"), str(tmp_path / "ds"), options=PackOptions(), workers=1)
    index = tmp_path / "ds" / "index.json"
    doc = json.loads(index.read_text())
    for shard in doc["shards"]:
        (tmp_path / "ds" / shard["url"]).unlink()
    doc.update(shards=[], num_samples=0)
    doc.pop("table", None)
    index.write_text(json.dumps(doc))
    problems = verify_dataset(str(tmp_path / "ds")).problems
    assert f"{index}: lists no sample: a dataset with nothing to load" in problems


def test_a_packed_image_that_does_not_decode_is_named_with_its_source_file(tmp_path):
    """A JPEG damaged inside its scan passes a default pack's checks; ``verify --decode`` names the
    file it was packed from, not only the shard and key."""
    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (64, 48), bytes(i % 251 for i in range(64 * 48 * 3))).save(out, "JPEG")
    data = bytearray(out.getvalue())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff\xc4" * 32  # a marker in the middle of the scan
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "flipped.jpg").write_bytes(bytes(data))
    pack(str(tmp_path / "src"), str(tmp_path / "out"), workers=1)
    problems = verify_dataset(str(tmp_path / "out"), decode=True).problems
    assert len(problems) == 1 and problems[0].endswith("; packed from cat/flipped.jpg"), problems
