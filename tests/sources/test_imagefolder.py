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
    with pytest.raises(SourceError, match="no class folders"):
        scan_imagefolder(str(tmp_path))


def test_class_folder_without_images(tmp_path):
    write_tree(tmp_path,
               {"cat/a.jpg": encode_image(), "dog/readme.txt": b"x", "emu/sub/b.txt": b"y"})
    with pytest.raises(SourceError, match="no image files in class folder\\(s\\): dog, emu"):
        scan_imagefolder(str(tmp_path))
