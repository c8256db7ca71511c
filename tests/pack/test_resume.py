"""Resume ``shardkit pack``: an unfinished destination is continued only by the same command over
the same files, a finished one is kept or refused, and what a resume writes is what an
uninterrupted run writes. Killing the pack: test_kill.py."""

import json
import os
import subprocess

import pytest

from shardkit.errors import PackError
from shardkit.pack import PackOptions, pack
from tests.pack.resume_checks import MAX_COUNT, command, visible


def test_different_command_into_unfinished_destination(many_images, reference, tmp_path):
    dst = tmp_path / "out"
    pack(str(many_images), str(dst), options=PackOptions(max_count=MAX_COUNT), workers=1)
    (dst / "index.json").unlink()
    (dst / ".shardkit-pack").mkdir()
    (dst / ".shardkit-pack" / "plan.json").write_text('{"fingerprint": "another run"}')
    refused = subprocess.run(command(many_images, dst, "--seed", "3"), capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert ("unfinished pack of different input or options" in refused.stderr
            and "--overwrite" in refused.stderr)
    done = subprocess.run(command(many_images, dst, "--overwrite"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert visible(dst) == reference


def test_complete_destination_is_kept_or_refused(small_tree, tmp_path):
    dst = str(tmp_path / "out")
    first = pack(str(small_tree), dst, workers=1)
    again = pack(str(small_tree), dst, workers=1)
    assert again.already_complete and again.manifest == first.manifest
    with pytest.raises(PackError, match=r"different packed dataset \(packed with seed=0, now 5\)"):
        pack(str(small_tree), dst, options=PackOptions(seed=5), workers=1)
    # the same pack asked for with DALI's index files: `shardkit index` adds them, no repack needed
    with pytest.raises(PackError, match=r"holds this pack without DALI index files \(packed with dali_index=False, "
                                        r"now True\); `shardkit index .* --dali-index` adds them without packing"):
        pack(str(small_tree), dst, options=PackOptions(dali_index=True), workers=1)
    from shardkit.index.dali import write_dali_indexes

    write_dali_indexes(dst)  # what that command does: the same pack with DALI's files is then complete
    assert pack(str(small_tree), dst, options=PackOptions(dali_index=True), workers=1).already_complete
    (small_tree / "class0" / "extra.jpg").write_bytes((small_tree / "class0" / "img0.jpg").read_bytes())
    with pytest.raises(PackError, match=r"\(same options, other input: its files or their order differ\)"):
        pack(str(small_tree), dst, workers=1)
    (small_tree / "class0" / "extra.jpg").unlink()
    redone = pack(str(small_tree), dst, options=PackOptions(seed=5), workers=1, overwrite=True)
    assert redone.manifest.options["seed"] == 5


def test_a_coco_pack_refused_over_drop_empty_says_so(tmp_path):
    """Packed with --drop-empty, packed again without (or the other way): the refusal says which,
    not that some input may differ."""
    from shardkit.pack import pack_coco

    coco = os.path.join(os.path.dirname(__file__), "..", "..", "sample_data", "coco")
    images, annotations = os.path.join(coco, "images"), os.path.join(coco, "instances.json")
    dst = str(tmp_path / "out")
    pack_coco(images, annotations, dst, drop_empty=True, workers=1)
    with pytest.raises(PackError, match=r"different packed dataset \(packed with --drop-empty, now without\)"):
        pack_coco(images, annotations, dst, workers=1)
    other = str(tmp_path / "other")
    pack_coco(images, annotations, other, workers=1)
    with pytest.raises(PackError, match=r"\(packed with seed=0, now 3; this run has --drop-empty, which the pack "
                                        r"there does not record\)"):
        pack_coco(images, annotations, other, drop_empty=True, options=PackOptions(seed=3), workers=1)


def test_a_damaged_finished_pack_is_not_called_complete(small_tree, tmp_path):
    dst = tmp_path / "out"
    first = pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    shards = [s.url for s in first.manifest.shards]
    (dst / shards[1]).unlink()
    with open(dst / shards[0], "r+b") as f:
        f.truncate(1000)
    with pytest.raises(PackError, match=rf"damaged: {shards[0]} has 1,000 bytes, index.json says "
                                        rf"[0-9,]+; {shards[1]} is missing; pass --overwrite"):
        pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    redone = pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1, overwrite=True)
    assert redone.manifest == first.manifest and (dst / shards[1]).exists()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_shard_rewritten_by_another_writer_stops_the_pack_before_it_publishes(small_tree, tmp_path, request,
                                                                                 where):
    """An object store has no lock: a second pack into the prefix rewrites shards under this one. The
    pack checks its shards' sizes before it writes index.json, and a re-run alone finishes it."""
    from shardkit.storage import Store

    options = {} if where == "local" else request.getfixturevalue("s3_server")
    dst = str(tmp_path / "out") if where == "local" else request.getfixturevalue("s3_bucket") + "/cc"
    store = Store(dst, options)
    done = []

    def other_writer(samples: int) -> None:  # per sample, in this process (workers=1)
        done.append(samples)
        if sum(done) == 5:  # the first shard (4 samples) is in place: another pack rewrites it
            store.write_bytes("shard-000000.tar", b"\0" * 10240)

    with pytest.raises(PackError, match=r"shard-000000.tar is 10,240 bytes, this pack wrote [0-9,]+: something "
                                        r"else wrote to the destination while this pack ran"):
        pack(str(small_tree), dst, options=PackOptions(max_count=4), workers=1, storage_options=options,
             progress=other_writer)
    assert "index.json" not in store.listdir()
    again = pack(str(small_tree), dst, options=PackOptions(max_count=4), workers=1, storage_options=options)
    assert not again.already_complete and again.reused_shards == len(again.manifest.shards) - 1
    assert store.file_sizes()["shard-000000.tar"] == again.manifest.shards[0].num_bytes  # a fresh listing


def test_an_unfinished_pack_does_not_resume_over_changed_files(small_tree, tmp_path):
    dst = str(tmp_path / "out")

    def stop(_n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1, progress=stop)
    image = small_tree / "class0" / "img1.jpg"
    st = image.stat()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten: same size, new mtime
    with pytest.raises(PackError, match="input files changed since it began"):
        pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1)
    pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1, overwrite=True)
    # A finished pack records no modification time: a touched tree is the same dataset.
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    again = pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1)
    assert again.already_complete


def test_an_unfinished_pack_is_named_as_one_and_not_indexed_in_place(small_tree, tmp_path):
    from shardkit import ShardLoader
    from shardkit.errors import ManifestError
    from shardkit.index.adopt import adopt_shards

    dst = str(tmp_path / "out")

    done = []

    def stop(n: int) -> None:  # after the second shard's samples
        done.append(n)
        if sum(done) >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1, progress=stop)
    written = len([n for n in os.listdir(dst) if n.endswith(".tar")])
    assert written >= 1
    told = (f"a `shardkit pack` not finished \\(running, or stopped\\), {written} shard{'s' * (written != 1)} "
            r"written so far \(.shardkit-pack/ holds its state\): a stopped one resumes when the command that began "
            "it is run again")
    with pytest.raises(ManifestError, match=f"no index.json: not a shardkit dataset \\(it is {told}\\)") as err:
        ShardLoader(dst, batch_size=2)
    assert err.value.__suppress_context__  # alone: not "during handling of" the read that found it missing
    with pytest.raises(ManifestError, match=f"holds {told}; indexed now, it would be a dataset of that part"):
        adopt_shards(dst)
    assert "index.json" not in os.listdir(dst)
    assert not pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1).already_complete


def test_non_empty_unrelated_destination_is_refused(small_tree, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("mine")
    with pytest.raises(PackError, match="not empty"):
        pack(str(small_tree), str(tmp_path / "out"), workers=1)
    pack(str(small_tree), str(tmp_path / "out"), workers=1, overwrite=True)
    # --overwrite removes only our files
    assert (tmp_path / "out" / "precious.txt").read_text() == "mine"


def test_killed_before_the_plan_was_recorded(small_tree, tmp_path):
    (tmp_path / "out" / ".shardkit-pack").mkdir(parents=True)
    (tmp_path / "out" / ".shard-000000.tar.tmp-0123456789ab").write_bytes(b"partial")
    pack(str(small_tree), str(tmp_path / "out"), workers=1)
    reference = pack(str(small_tree), str(tmp_path / "ref"), workers=1)
    assert (sorted(p.name for p in (tmp_path / "out").iterdir())
            == sorted(p.name for p in (tmp_path / "ref").iterdir()))
    assert reference.manifest.num_samples == 12



def test_resumed_index_is_byte_identical_with_skipped_entries(many_images, reference, tmp_path):
    """Receipts reused by a resume come back from the pack state as JSON: the skipped entries
    they carry must reach index.json exactly as an uninterrupted run writes them (key order
    included). A skip budget stops the first run with receipts on disk that list skips."""
    dst = tmp_path / "out"
    stopped = subprocess.run(command(many_images, dst, "--max-skipped", "2"), capture_output=True,
                             text=True, timeout=120)
    assert stopped.returncode == 1 and "--max-skipped" in stopped.stderr, stopped.stderr
    receipts = [json.loads(p.read_text()) for p in (dst / ".shardkit-pack").glob("*.done.json")]
    assert sum(len(r["skipped"]) for r in receipts) >= 2  # the resume reuses receipts with skips
    resumed = subprocess.run(command(many_images, dst), capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert len(json.loads(reference["index.json"])["skipped"]) == 3
    assert (dst / "index.json").read_bytes() == reference["index.json"]
    assert sorted(p.name for p in dst.iterdir()) == sorted(reference)


def test_rerun_after_kill_between_index_and_cleanup(many_images, reference, tmp_path):
    """A kill after index.json is written but before the pack state is removed: the re-run
    ("already packed") removes the state and temporaries, and touches nothing else."""
    dst = tmp_path / "out"
    first = subprocess.run(command(many_images, dst), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    state = dst / ".shardkit-pack"  # what the killed run leaves: its state and a temporary
    state.mkdir()
    (state / "plan.json").write_text("{}")
    (state / "shard-000000.tar.done.json").write_text("{}")
    (dst / ".shard-000001.tar.tmp-0123456789ab").write_bytes(b"partial")
    again = subprocess.run(command(many_images, dst), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in dst.iterdir()) == sorted(reference)
    assert visible(dst) == reference


@pytest.mark.parametrize("inside", ["link", "link/shards", "link/class0/deeper"])
def test_a_destination_inside_the_source_is_refused(small_tree, tmp_path, inside):
    src = tmp_path / "link"
    src.symlink_to(small_tree, target_is_directory=True)  # a link to the tree: resolved, still inside
    dst = tmp_path / inside
    before = sorted(p.name for p in small_tree.rglob("*"))
    with pytest.raises(PackError, match="is inside the source .*: the shards would become part of the tree"):
        pack(str(src), str(dst), workers=1)
    assert sorted(p.name for p in small_tree.rglob("*")) == before  # nothing written into the tree
    pack(str(src), str(tmp_path / "next-to-it"), workers=1)  # beside it is fine


def _dataset_files(dst):
    return {p.name: p.read_bytes() for p in dst.iterdir() if p.is_file()}


def test_overwrite_keeps_the_old_pack_until_the_new_one_is_complete(small_tree, tmp_path):
    """--overwrite removed the old pack before writing the new one: a replacement refused on the
    way (a skip budget exceeded) left neither. Now the old pack stays whole until the new one
    takes its place, and the result is what packing into an empty folder gives."""
    from shardkit.index import verify_dataset
    from shardkit.pack import SkipBudget, SkipBudgetError
    from shardkit.pack.replace import REPLACEMENT_DIR

    dst = tmp_path / "out"
    pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    old = _dataset_files(dst)
    (small_tree / "class0" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(SkipBudgetError):
        pack(str(small_tree), str(dst), options=PackOptions(max_count=3), workers=1, overwrite=True,
             max_skipped=SkipBudget(count=0))
    assert _dataset_files(dst) == old and verify_dataset(str(dst)).ok  # the old pack, untouched
    assert (dst / REPLACEMENT_DIR).is_dir()  # what the replacement wrote: a re-run resumes it
    done = pack(str(small_tree), str(dst), options=PackOptions(max_count=3), workers=1, overwrite=True)
    assert done.manifest.options["max_count"] == 3 and done.manifest.num_samples > 0
    fresh = tmp_path / "fresh"
    pack(str(small_tree), str(fresh), options=PackOptions(max_count=3), workers=1)
    assert _dataset_files(dst) == _dataset_files(fresh)
    assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in fresh.iterdir())  # no folder left
    assert verify_dataset(str(dst)).ok


@pytest.mark.parametrize("after", [1, 2, 5])
def test_a_replacement_interrupted_while_it_takes_the_old_packs_place_is_finished_by_a_re_run(
        small_tree, tmp_path, monkeypatch, after):
    """Interrupted after some of its files were moved into DST (a shard, or a shard and the files
    beside it), a replacement re-run gives what packing into an empty folder gives; re-run without
    --overwrite, it is refused saying so."""
    import shardkit.pack.replace as replace

    dst = tmp_path / "out"
    pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    new = PackOptions(max_count=3, dali_index=True)
    moves: list[str] = []
    real = replace._move

    def interrupted(src, target):
        if len(moves) == after:
            raise KeyboardInterrupt
        moves.append(target)
        real(src, target)

    monkeypatch.setattr(replace, "_move", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pack(str(small_tree), str(dst), options=new, workers=1, overwrite=True)
    assert not (dst / "index.json").exists()  # no dataset while it changes
    monkeypatch.setattr(replace, "_move", real)
    with pytest.raises(PackError, match="holds a pack replacement .--overwrite. that was interrupted as it took"):
        pack(str(small_tree), str(dst), options=new, workers=1)
    pack(str(small_tree), str(dst), options=new, workers=1, overwrite=True)
    fresh = tmp_path / "fresh"
    pack(str(small_tree), str(fresh), options=new, workers=1)
    assert _dataset_files(dst) == _dataset_files(fresh)
    assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in fresh.iterdir())


def test_a_replacement_abandoned_for_the_old_command_is_removed(small_tree, tmp_path, caplog):
    from shardkit.pack import SkipBudget, SkipBudgetError
    from shardkit.pack.replace import REPLACEMENT_DIR

    dst = tmp_path / "out"
    pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    (small_tree / "class0" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(SkipBudgetError):
        pack(str(small_tree), str(dst), options=PackOptions(max_count=3), workers=1, overwrite=True,
             max_skipped=SkipBudget(count=0))
    (small_tree / "class0" / "broken.jpg").unlink()
    assert (dst / REPLACEMENT_DIR).is_dir()
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        again = pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    assert again.already_complete and not (dst / REPLACEMENT_DIR).exists()
    assert "removed the unfinished replacement" in caplog.text


def test_an_unfinished_pack_refused_to_another_command_says_what_differs(small_tree, tmp_path):
    """It said "different input or options", where a finished pack's refusal names them."""
    from shardkit.pack import SkipBudget, SkipBudgetError

    (small_tree / "class0" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    dst = str(tmp_path / "out")
    with pytest.raises(SkipBudgetError):  # stops unfinished, its state kept for a re-run
        pack(str(small_tree), dst, options=PackOptions(max_count=2), workers=1, max_skipped=SkipBudget(count=0))
    with pytest.raises(PackError, match=r"holds an unfinished pack \(begun with max_count=2, now 3\); re-run that "
                                        r"command to resume it, or pass --overwrite"):
        pack(str(small_tree), dst, options=PackOptions(max_count=3), workers=1)


def test_a_pack_made_with_an_option_that_changed_nothing_is_the_same_pack_without_it(small_tree, tmp_path):
    """Packs made before such options were refused (--quality 50 without --resize-max, a seed with
    --no-shuffle) are found complete, and resumed, by the same command without the option."""
    cases: list[tuple[str, int, dict[str, bool]]] = [("quality", 50, {}), ("seed", 7, {"shuffle": False})]
    for field, value, kept in cases:
        shuffle = kept.get("shuffle", True)
        made = PackOptions(max_count=2, shuffle=shuffle)
        object.__setattr__(made, field, value)  # as an earlier version took it
        dst = str(tmp_path / field)
        first = pack(str(small_tree), dst, options=made, workers=1)
        again = pack(str(small_tree), dst, options=PackOptions(max_count=2, shuffle=shuffle), workers=1)
        assert again.already_complete and again.manifest == first.manifest
        assert again.manifest.options[field] == value
        with pytest.raises(PackError, match="different packed dataset"):  # an option that does change bytes
            pack(str(small_tree), dst, options=PackOptions(max_count=3, shuffle=shuffle), workers=1)


def test_clearing_a_destination_removes_the_dali_indexes_beside_its_shards(small_tree, tmp_path):
    """--overwrite on an object store (or over an unfinished pack) clears DST first: DALI index
    files of shards the new pack no longer has were left behind."""
    from shardkit.pack.resume import clear_destination
    from shardkit.storage import Store

    dst = tmp_path / "out"
    pack(str(small_tree), str(dst), options=PackOptions(max_count=2, dali_index=True), workers=1)
    (dst / "notes.txt").write_text("mine")
    assert any(p.name.endswith(".dali.idx") for p in dst.iterdir())
    clear_destination(Store(str(dst)))
    assert [p.name for p in dst.iterdir()] == ["notes.txt"]


def test_a_replacement_without_dali_indexes_leaves_none_of_the_old_packs(small_tree, tmp_path):
    """The old pack's .dali.idx files kept their names and no longer matched the new shards."""
    from shardkit.index import verify_dataset

    dst, fresh = tmp_path / "out", tmp_path / "fresh"
    pack(str(small_tree), str(dst), options=PackOptions(max_count=2, dali_index=True), workers=1)
    pack(str(small_tree), str(dst), options=PackOptions(max_count=2, seed=5), workers=1, overwrite=True)
    pack(str(small_tree), str(fresh), options=PackOptions(max_count=2, seed=5), workers=1)
    assert _dataset_files(dst) == _dataset_files(fresh) and verify_dataset(str(dst)).ok


def test_a_replacement_killed_after_it_was_published_is_cleared_by_a_re_run(small_tree, tmp_path, monkeypatch,
                                                                             caplog):
    import shardkit.pack.replace as replace
    from shardkit.pack.replace import REPLACEMENT_DIR

    dst = tmp_path / "out"
    pack(str(small_tree), str(dst), options=PackOptions(max_count=2), workers=1)
    real = replace.discard_replacement

    def killed(stage):
        raise KeyboardInterrupt  # after index.json, before the folder is removed

    monkeypatch.setattr(replace, "discard_replacement", killed)
    with pytest.raises(KeyboardInterrupt):
        pack(str(small_tree), str(dst), options=PackOptions(max_count=3), workers=1, overwrite=True)
    monkeypatch.setattr(replace, "discard_replacement", real)
    assert (dst / REPLACEMENT_DIR).is_dir() and (dst / "index.json").exists()
    with caplog.at_level("WARNING", logger="shardkit.pack"):
        again = pack(str(small_tree), str(dst), options=PackOptions(max_count=3), workers=1)
    assert again.already_complete and not (dst / REPLACEMENT_DIR).exists()
    assert "removed the unfinished replacement" not in caplog.text  # its own, published: nothing to say
