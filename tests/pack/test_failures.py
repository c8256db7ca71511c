"""Inputs and events that must not abort a pack, or must abort it with a clear error."""

import io
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from shardkit.errors import PackError, StorageError
from shardkit.format import iter_samples
from shardkit.index import read_manifest, verify_dataset
from shardkit.pack import PackOptions, pack
from shardkit.pack.api import pack_listing
from shardkit.sources.base import SourceListing, SourceSample
from shardkit.sources.imagefolder import scan_imagefolder
from shardkit.storage import Store


def _garbled_jpeg() -> bytes:
    """A JPEG whose scan data is broken in the middle while its end-of-image marker is intact."""
    img = Image.frombytes("RGB", (64, 48),
                          bytes((i * 37 + i // 7) % 256 for i in range(64 * 48 * 3)))
    out = io.BytesIO()
    img.save(out, "JPEG")
    data = bytearray(out.getvalue())
    middle = len(data) // 2
    data[middle : middle + 64] = b"\xff\xc4" * 32
    return bytes(data)


def _sources(dst: Path) -> list[str]:
    sources = []
    for shard in read_manifest(Store(str(dst))).shards:
        with open(dst / shard.url, "rb") as f:
            sources += [json.loads(fields["json"])["source"]
                        for _, fields in iter_samples(f, where=shard.url)]
    return sources


def test_resize_max_skips_a_corrupt_jpeg(small_tree, tmp_path):
    (small_tree / "class0" / "garbled.jpg").write_bytes(_garbled_jpeg())
    result = pack(str(small_tree), str(tmp_path / "out"), options=PackOptions(resize_max=4),
                  workers=1)
    assert [s["source"] for s in result.manifest.skipped] == ["class0/garbled.jpg"]
    assert result.manifest.skipped[0]["reason"].startswith("corrupt image data (")
    assert result.manifest.num_samples == 12


def test_non_utf8_file_names_are_packed_with_escapes(small_tree, tmp_path):
    root = os.fsencode(small_tree)
    good = (small_tree / "class1" / "img0.jpg").read_bytes()
    with open(os.path.join(root, b"class1", b"caf\xe9.jpg"), "wb") as f:
        f.write(good)
    with open(os.path.join(root, b"class2", b"bad\xff.jpg"), "wb") as f:
        f.write(b"")  # skipped: its name goes into index.json's skipped list
    dst = tmp_path / "out"
    result = pack(str(small_tree), str(dst), workers=2, options=PackOptions(max_count=5))
    assert [s["source"] for s in result.manifest.skipped] == ["class2/bad\\xff.jpg"]
    assert "class1/caf\\xe9.jpg" in _sources(dst)
    assert result.manifest.num_samples == 13
    assert verify_dataset(str(dst)).ok
    listing = scan_imagefolder(str(small_tree))
    again = pack(str(small_tree), str(dst), workers=1, options=PackOptions(max_count=5))
    assert again.already_complete
    assert len(listing.samples) == 14  # torchvision's ImageFolder lists these files too


class _DieWhenUnpickled:
    """Unpickling this in a pack worker ends that process at once, like the OOM killer would."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return os._exit, (1,)


def test_a_dead_writer_process_is_a_pack_error(small_tree, tmp_path):
    listing = scan_imagefolder(str(small_tree))
    poisoned = SourceSample(listing.samples[0].path, listing.samples[0].rel,
                            listing.samples[0].size, listing.samples[0].label,
                            meta={"x": _DieWhenUnpickled()})
    samples = [poisoned, *listing.samples[1:]]
    # meta_digest stands for the metadata in the fingerprint, so the poison is never serialised
    # there.
    poisoned_listing = SourceListing(listing.kind, listing.root, samples, listing.classes,
                                     meta_digest="x")
    with pytest.raises(PackError,
                       match="a writer process died .*re-run the same command to resume"):
        pack_listing(poisoned_listing, str(tmp_path / "out"), options=PackOptions(max_count=2),
                     workers=2)


def test_packing_into_a_file_says_dst_is_a_file(small_tree, tmp_path):
    (tmp_path / "out").write_bytes(b"not a directory")
    with pytest.raises(StorageError, match="out: is a file, not a directory"):
        pack(str(small_tree), str(tmp_path / "out"), workers=1)


def test_pack_at_the_top_level_of_a_script_without_the_main_guard_says_so(small_tree: Path, tmp_path: Path) -> None:
    """Spawned writers import the script that started them: one calling pack() at its top level
    would pack again in each of them. The writers stop at once and the pack says what to write;
    nothing is published, and the same script with the guard packs (resuming)."""
    from tests.scripts import run_script_file

    dst = tmp_path / "out"
    call = f"pack({str(small_tree)!r}, {str(dst)!r}, workers=2, options=PackOptions(max_count=4))"
    script = tmp_path / "train.py"
    run = run_script_file(script, f"from shardkit.pack import PackOptions, pack\n{call}\n")
    assert run.returncode == 1 and not (dst / "index.json").exists()
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("shardkit.errors.PackError: the pack call ran again in the writer processes") and \
        "if __name__ == \"__main__\":" in last, run.stderr[-2000:]
    assert "another pack" not in run.stderr
    guarded = f"from shardkit.pack import PackOptions, pack\nif __name__ == '__main__':\n    {call}\n"
    again = run_script_file(script, guarded)
    assert again.returncode == 0, again.stderr[-2000:]
    assert verify_dataset(str(dst)).ok


def test_a_script_packing_at_its_top_level_keeps_its_own_spawned_processes(small_tree: Path, tmp_path: Path) -> None:
    """Only the pack's own writers stop when they meet the pack call: a spawn pool of the script's
    own imports the script too, and its processes find the dataset packed (they hung, restarted
    one after another, while every spawned process stopped there)."""
    from tests.scripts import run_script_file

    dst = tmp_path / "out"
    run = run_script_file(tmp_path / "job.py", "import multiprocessing\nfrom shardkit.pack import PackOptions, pack\n"
                          f"pack({str(small_tree)!r}, {str(dst)!r}, workers=1, options=PackOptions(max_count=4))\n"
                          "def double(x):\n    return 2 * x\n"
                          "if __name__ == '__main__':\n"
                          "    with multiprocessing.get_context('spawn').Pool(2) as pool:\n"
                          "        print(pool.map(double, [1, 2]))\n")
    assert run.returncode == 0 and run.stdout.strip() == "[2, 4]", run.stderr[-2000:]
    assert verify_dataset(str(dst)).ok
