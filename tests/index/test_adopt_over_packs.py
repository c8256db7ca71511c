"""``shardkit index --overwrite`` over a pack made by ``shardkit pack``: a COCO pack is refused,
another is indexed again with a warning of what that replaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit.errors import ManifestError
from shardkit.index.adopt import adopt_shards
from tests.conftest import encode_image


def test_indexing_a_pack_again_says_what_it_replaces_and_a_coco_pack_is_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A COCO pack was refused for a sample without 'cls'; a pack's record of its options and
    skipped inputs went without a word, and its pack command then refused the folder."""
    from sample_data.coco_gen import make_coco
    from shardkit.pack import PackOptions, pack, pack_coco
    from tests.conftest import write_tree

    images, ann = make_coco(tmp_path / "coco", images=6)
    pack_coco(str(images), str(ann), str(tmp_path / "c"), options=PackOptions(), workers=1)
    with pytest.raises(ManifestError, match="holds a COCO pack made by shardkit pack: shardkit index takes"):
        adopt_shards(str(tmp_path / "c"), overwrite=True)
    write_tree(tmp_path / "src", {"a/x.jpg": encode_image(), "b/y.jpg": encode_image()})
    pack(str(tmp_path / "src"), str(tmp_path / "p"), options=PackOptions(), workers=1)
    with caplog.at_level("WARNING", logger="shardkit.index"):
        adopt_shards(str(tmp_path / "p"), overwrite=True)
    assert "was written by shardkit pack: indexing again replaces its record" in caplog.text
