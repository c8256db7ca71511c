import os

import pytest

from shardkit.errors import SourceError
from shardkit.sources import scan_imagefolder
from tests.conftest import encode_image, write_tree
from tests.trees import make_tricky_tree


def test_same_samples_classes_and_labels_as_torchvision(tmp_path):
    from torchvision.datasets import ImageFolder

    root = make_tricky_tree(tmp_path)
    listing = scan_imagefolder(str(root))
    reference = ImageFolder(str(root))
    assert listing.kind == "imagefolder"
    assert listing.classes == reference.classes == ["a cls", "b.dots", "plain", "zz linked class",
                                                    "ünïcødé"]
    assert [(s.path, s.label) for s in listing.samples] == reference.samples
    rels = [s.rel for s in listing.samples]
    assert "plain/sub/deeper/nested.jpg" in rels and "plain/linked_sub/in_linked_sub.jpg" in rels
    assert "zz linked class/linked.jpg" in rels and "a cls/.hidden.jpg" in rels
    assert not any(r.endswith(".txt") for r in rels)
    by_rel = {s.rel: s for s in listing.samples}
    assert by_rel["plain/zero.jpg"].size == 0
    assert by_rel["plain/dangling.jpg"].size == -1
    assert by_rel["plain/link.jpg"].size == os.path.getsize(root / "plain/link.jpg") > 0


def test_missing_source(tmp_path):
    with pytest.raises(SourceError, match="does not exist") as err:
        scan_imagefolder(str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in str(err.value)


def test_source_is_a_file(tmp_path):
    (tmp_path / "f.jpg").write_bytes(b"x")
    with pytest.raises(SourceError, match="not a directory"):
        scan_imagefolder(str(tmp_path / "f.jpg"))


def test_empty_source_and_no_class_folders(tmp_path):
    with pytest.raises(SourceError, match="no class folders"):
        scan_imagefolder(str(tmp_path))
    (tmp_path / "loose.jpg").write_bytes(encode_image())
    with pytest.raises(SourceError, match="no class folders.*; its image lies directly in it: put each class's "
                                          "images in a folder of its own$"):
        scan_imagefolder(str(tmp_path))
    (tmp_path / "loose.txt").write_text("a caption")  # img2dataset's layout, flat: the captions format's
    with pytest.raises(SourceError, match="; its image has a .txt caption beside it: pack captioned "
                                          "images with --format captions$"):
        scan_imagefolder(str(tmp_path))


def test_class_folder_without_images(tmp_path):
    write_tree(tmp_path,
               {"cat/a.jpg": encode_image(), "dog/readme.txt": b"x", "emu/sub/b.txt": b"y"})
    with pytest.raises(SourceError, match=r"no image files in class folders dog, emu \(pack --allow-empty, "
                                          r"allow_empty=True, keeps them as classes of no sample\)$"):
        scan_imagefolder(str(tmp_path))


def test_class_folders_without_images_are_kept_as_imagefolder_keeps_them_with_allow_empty(tmp_path):
    """torchvision's ImageFolder(allow_empty=True) keeps them in its class list; the pack refused
    them with a hint at an option it did not have."""
    from torchvision.datasets import ImageFolder

    write_tree(tmp_path, {"cat/a.jpg": encode_image(), "dog/readme.txt": b"x", "emu/b.jpg": encode_image(),
                          "fox/sub/c.txt": b"y"})
    listing = scan_imagefolder(str(tmp_path), allow_empty=True)
    reference = ImageFolder(str(tmp_path), allow_empty=True)
    assert listing.classes == reference.classes == ["cat", "dog", "emu", "fox"]
    assert [s.label for s in listing.samples] == reference.targets == [0, 2]
    write_tree(tmp_path / "none", {"dog/readme.txt": b"x"})
    with pytest.raises(SourceError, match="no image files in class folder dog$"):  # not a dataset at all
        scan_imagefolder(str(tmp_path / "none"), allow_empty=True)


def test_a_folder_of_many_folders_without_images_is_said_not_to_be_an_imagefolder_tree_in_one_short_line(tmp_path):
    write_tree(tmp_path, {f"doc{i:03d}/README": b"x" for i in range(600)})
    with pytest.raises(SourceError) as info:
        scan_imagefolder(str(tmp_path))
    assert str(info.value).endswith(
        "none of its 600 folders holds an image file (doc000, doc001, doc002, doc003, doc004 and 595 more): "
        "an ImageFolder tree is a folder of class folders of images")
    write_tree(tmp_path, {f"doc{i:03d}/a.jpg": encode_image() for i in range(590)})
    with pytest.raises(SourceError, match="no image files in class folders doc590, doc591, doc592, doc593, doc594 "
                                          r"and 5 more \(pack --allow-empty"):
        scan_imagefolder(str(tmp_path))


def test_a_link_back_to_a_folder_above_is_not_followed_and_is_reported(tmp_path):
    """``os.walk`` follows ``self -> .`` until the path is too long (each image listed dozens of
    times), and ``up -> ..`` beside it makes a walk that never ends: neither link is followed,
    and each is a skipped input with its reason. Other links are followed, as ImageFolder does."""
    write_tree(tmp_path, {"a/x.jpg": encode_image(), "b/y.jpg": encode_image()})
    os.symlink(".", tmp_path / "a" / "self")
    os.symlink("..", tmp_path / "a" / "up")
    listing = scan_imagefolder(str(tmp_path))
    assert [(s.rel, s.label) for s in listing.samples] == [("a/x.jpg", 0), ("b/y.jpg", 1)]
    assert listing.warnings == [
        {"source": "a/self", "reason": "leads back to a folder above it (a loop of links): not followed"},
        {"source": "a/up", "reason": "leads back to a folder above it (a loop of links): not followed"}]


def test_a_link_to_a_folder_above_the_top_by_the_path_it_was_named_by_is_a_loop(tmp_path):
    from shardkit.sources.local import walk_following_links

    write_tree(tmp_path, {"real/imgs/a/1.jpg": b"x", "data/other/x.jpg": b"y"})
    os.symlink("../real/imgs", tmp_path / "data" / "imgs")
    os.symlink(str(tmp_path / "data"), tmp_path / "real" / "imgs" / "a" / "up")
    found, problems = walk_following_links(str(tmp_path / "data" / "imgs"))
    assert [f for _, files in found for f in files] == ["1.jpg"]
    assert [os.path.basename(p) for p, _ in problems] == ["up"]


def test_the_walk_gives_os_walks_order_where_there_is_no_loop(tmp_path):
    from shardkit.sources.local import walk_following_links

    root = make_tricky_tree(tmp_path)
    found, problems = walk_following_links(str(root))
    assert problems == []
    assert [(d, sorted(f)) for d, f in found] == [(d, sorted(f)) for d, _, f in sorted(os.walk(root, followlinks=True))]


_SCAN = """
import json, sys
from shardkit.errors import SourceError
from shardkit import sources
try:
    listing = getattr(sources, sys.argv[2])(sys.argv[1])
except SourceError as err:
    print(json.dumps({"error": str(err)}))
else:
    print(json.dumps({"samples": [s.rel for s in listing.samples], "warnings": listing.warnings}))
"""


def _scan_without_root_override(root, scan="scan_imagefolder"):
    """``scan(root)`` in a process that file permissions apply to (as root: without the
    capabilities that override them)."""
    import json
    import shutil
    import subprocess
    import sys

    command = [sys.executable, "-c", _SCAN, str(root), scan]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file permissions cannot apply")
        drop = "-dac_override,-dac_read_search"
        command = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *command]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_an_unreadable_folder_is_a_skipped_input_and_an_unreadable_class_an_error(tmp_path):
    """``os.walk`` passes over a folder it cannot list without a word: its images would be
    missing from the pack with nothing said."""
    write_tree(tmp_path, {"a/x.jpg": encode_image(), "a/sub/y.jpg": encode_image(), "b/z.jpg": encode_image()})
    (tmp_path / "a" / "sub").chmod(0)
    try:
        got = _scan_without_root_override(tmp_path)
        assert got == {"samples": ["a/x.jpg", "b/z.jpg"],
                       "warnings": [{"source": "a/sub", "reason": "unreadable folder (Permission denied)"}]}
    finally:
        (tmp_path / "a" / "sub").chmod(0o755)
    (tmp_path / "b").chmod(0)
    try:
        got = _scan_without_root_override(tmp_path)
        assert got["error"].endswith("class folder b: unreadable folder (Permission denied)"), got
    finally:
        (tmp_path / "b").chmod(0o755)
    (tmp_path / "b").chmod(0)
    try:  # a captioned folder that cannot be read: said so, not "no image files here"
        got = _scan_without_root_override(tmp_path / "b", "scan_caption_folder")
        assert got["error"].endswith("b: unreadable folder (Permission denied)"), got
    finally:
        (tmp_path / "b").chmod(0o755)


def test_an_img2dataset_folder_read_as_classes_says_its_captions_are_left_out(tmp_path, caplog):
    """Folders of images with .txt beside them (img2dataset's layout) packed without --format
    captions became one class per folder and lost every caption without a word."""
    files = {f"00000/{i:04d}.jpg": encode_image((8, 8)) for i in range(4)}
    files.update({f"00000/{i:04d}.txt": b"a caption" for i in range(3)})
    write_tree(tmp_path / "pairs", files)
    with caplog.at_level("WARNING", logger="shardkit.pack.sources"):
        listing = scan_imagefolder(str(tmp_path / "pairs"))
    assert listing.classes == ["00000"] and len(listing.samples) == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"shardkit: {tmp_path / 'pairs'}: 3 of 4 images have a .txt caption beside them, which an ImageFolder pack "
        "leaves out (each folder is a class); pack with --format captions to keep them"]
    caplog.clear()
    (tmp_path / "pairs" / "00000" / "0000.txt").unlink()
    (tmp_path / "pairs" / "00000" / "0001.txt").unlink()  # a few notes beside images: an ImageFolder all the same
    with caplog.at_level("WARNING", logger="shardkit.pack.sources"):
        scan_imagefolder(str(tmp_path / "pairs"))
    assert caplog.records == []
