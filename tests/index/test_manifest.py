import json

import pytest

from shardkit.errors import ManifestError
from shardkit.index import Manifest, ShardEntry, locate_dataset, read_manifest, write_manifest
from shardkit.storage import Store

SHARDS = (ShardEntry("s-000000.tar", 2, 10240, "a" * 64),
          ShardEntry("s-000001.tar", 1, 10240, "b" * 64))


def _manifest(**kw):
    base = dict(kind="imagefolder", shards=SHARDS, classes=("cat", "dog"),
                skipped=({"source": "cat/x.jpg", "reason": "empty file (0 bytes)"},),
                options={"max_count": 2}, created_by="shardkit test")
    return Manifest(**{**base, **kw})


def test_round_trip_and_field_order():
    m = _manifest()
    data = m.to_json()
    assert Manifest.from_json(data, where="x") == m
    doc = json.loads(data)
    assert list(doc) == ["format", "version", "kind", "num_samples", "classes", "shards", "skipped",
                         "options", "created_by"]
    assert (doc["format"], doc["version"], doc["num_samples"]) == ("shardkit", 1, 3)
    assert m.to_json() == _manifest().to_json()


def _doc(**changes):
    doc = json.loads(_manifest().to_json())
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "not a shardkit manifest"),
        (_doc(format="webdataset"), "not a shardkit manifest"),
        (_doc(version=3), "version 3 is not supported \\(this shardkit reads versions 1 and 2\\)"),
        (_doc(version=True), "version True is not supported"),
        (_doc(version=2), "version 2 disagrees with options.uniform_names"),
        (_doc(version=1, options={"uniform_names": True}), "version 1 disagrees"),
        (_doc(version="1"), "not supported"),
        (_doc(kind="video"), "unknown kind 'video'"),
        (_doc(kind=None), 'no "kind" \\(expected one of imagefolder, coco, captions\\)'),
        (_doc(num_samples=4), "differs"),
        (_doc(shards="x"), "'shards' must be list"),
        (_doc(shards=[{"url": "a.tar"}]),
         "'shards\\[0\\].num_samples' must be an integer, not null"),
        (_doc(shards=["a.tar"]), "'shards\\[0\\]' must be an object"),
        (_doc(shards=[{"url": "a.tar", "num_samples": True, "num_bytes": 1, "sha256": ""}]),
         "num_samples' must be an integer, not bool"),
        (_doc(num_samples=True), "'num_samples' must be an integer, not bool"),
        (_doc(classes=5), "'classes' must be a list, not int"),
        (_doc(classes=["cat", 3]), "'classes\\[1\\]' must be a string"),
        (_doc(categories={"id": 1}), "'categories' must be a list"),
        (_doc(categories=[1]), "'categories\\[0\\]' must be an object"),
        (_doc(skipped="none"), "'skipped' must be a list"),
        (_doc(skipped=[["a", "b"]]), "'skipped\\[0\\]' must be an object"),
        (_doc(skipped=[{"source": "a"}]), "'skipped\\[0\\].reason' must be a string"),
        (_doc(options=[1]), "'options' must be an object, not list"),
        (_doc(created_by=3), "'created_by' must be a string"),
        (_doc(shards=[{"url": "../a.tar", "num_samples": 3, "num_bytes": 1, "sha256": ""}]),
         "relative"),
        (_doc(shards=[{"url": "s3://b/a.tar", "num_samples": 3, "num_bytes": 1, "sha256": ""}]),
         "relative"),
        (_doc(shards=[{"url": "a.tar", "num_samples": -1, "num_bytes": 1, "sha256": ""}]),
         "must not be negative"),
        (_doc(classes=None) .replace(b'"classes": null, ', b""), "needs"),
    ],
)
def test_invalid_manifests(data, message):
    with pytest.raises(ManifestError, match=message) as err:
        Manifest.from_json(data, where="somewhere/index.json")
    assert str(err.value).startswith("somewhere/index.json: ")


def test_missing_num_samples():
    doc = json.loads(_manifest().to_json())
    del doc["num_samples"]
    with pytest.raises(ManifestError, match="num_samples"):
        Manifest.from_json(json.dumps(doc).encode(), where="x")


def test_read_write_and_locate(tmp_path):
    store = Store(str(tmp_path))
    with pytest.raises(ManifestError, match="no index.json"):
        read_manifest(store)
    write_manifest(store, _manifest())
    assert read_manifest(store) == _manifest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.hashes", "index.json", "index.table"]
    assert locate_dataset(str(tmp_path / "index.json")).url == str(tmp_path)
    assert locate_dataset(str(tmp_path) + "/").url == str(tmp_path)
    assert locate_dataset("memory://a/b/index.json").url == "memory://a/b"


def test_lone_surrogates_are_written_as_json_escapes():
    m = _manifest(classes=("caf\udce9", "dog"))  # e.g. a COCO name given as a "\udce9" escape
    data = m.to_json()
    assert b'"caf\\udce9"' in data
    assert Manifest.from_json(data, where="x") == m


@pytest.mark.parametrize(
    "flaw",
    [
        {"url": "/abs.tar"}, {"url": "a/../../x.tar"}, {"url": ".."}, {"url": ""}, {"url": "s3://b/x.tar"},
        {"url": "a\0.tar"}, {"sha256": "../../x"}, {"sha256": "A" * 64}, {"num_samples": True},
        {"num_samples": -1}, {"num_bytes": -5}, {"num_samples": 3, "num_bytes": 1000}, {"url": 7},
    ],
)
def test_every_shard_flaw_is_named_among_many_valid_shards(flaw: dict[str, object]) -> None:
    """The whole-array fast path must never accept what the per-entry checks refuse."""
    shards = [{"url": f"s/{i}.tar", "num_samples": 2, "num_bytes": 4096, "sha256": f"{i:064x}"} for i in range(500)]
    shards[321] = {**shards[321], **flaw}
    doc = {"format": "shardkit", "version": 1, "kind": "imagefolder", "num_samples": 1000, "classes": ["a"],
           "shards": shards}
    with pytest.raises(ManifestError, match=r"shards\[321\]"):
        Manifest.from_json(json.dumps(doc).encode(), where="index.json")


def test_a_valid_many_shard_manifest_reads_as_entries() -> None:
    shards = [{"url": f"s/{i}.tar", "num_samples": 2, "num_bytes": 4096, "sha256": f"{i:064x}"} for i in range(500)]
    doc = {"format": "shardkit", "version": 1, "kind": "imagefolder", "num_samples": 1000, "classes": ["a"],
           "shards": shards}
    m = Manifest.from_json(json.dumps(doc).encode(), where="index.json")
    assert [s.to_dict() for s in m.shards] == shards


def test_a_folder_without_index_json_is_told_what_to_run(tmp_path):
    """An ImageFolder tree is packed (`shardkit index` would find no shards in it); tar files are
    indexed in place."""
    tree = tmp_path / "tree"
    (tree / "cat").mkdir(parents=True)
    (tree / "cat" / "a.jpg").write_bytes(b"x")
    with pytest.raises(ManifestError, match=r"holds folders, as an ImageFolder tree does: pack it first, "
                                            r"`shardkit pack DIR SHARDS`") as err:
        read_manifest(Store(str(tree)))
    assert "shardkit index" not in str(err.value)
    tars = tmp_path / "tars"
    tars.mkdir()
    (tars / "part-0.tar").write_bytes(b"")
    with pytest.raises(ManifestError, match=r"it holds .tar files: .*`shardkit index DIR`"):
        read_manifest(Store(str(tars)))


def test_shardloader_on_an_imagefolder_tree_suggests_pack(tmp_path):
    from shardkit import ShardLoader
    from shardkit.errors import ShardkitError

    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "a.jpg").write_bytes(b"x")
    with pytest.raises(ShardkitError, match="shardkit pack DIR SHARDS"):
        ShardLoader(str(tmp_path), batch_size=2)


def test_captioned_manifests_carry_a_kind_version_readers_check():
    m = _manifest(kind="captions", classes=None)
    doc = json.loads(m.to_json())
    assert list(doc)[:5] == ["format", "version", "kind", "kind_version", "num_samples"] and doc["kind_version"] == 1
    assert Manifest.from_json(m.to_json(), where="x") == m
    for version, message in ((2, "captions samples of kind_version 2 are not supported"),
                             (None, "captions samples of kind_version None are not supported"),
                             (True, "captions samples of kind_version True are not supported")):
        changed = {**doc, "kind_version": version} if version is not None else \
            {k: v for k, v in doc.items() if k != "kind_version"}
        with pytest.raises(ManifestError, match=message):
            Manifest.from_json(json.dumps(changed).encode(), where="x")
    labelled = json.loads(_manifest().to_json())
    with pytest.raises(ManifestError, match="kind 'imagefolder' has no kind_version"):
        Manifest.from_json(json.dumps({**labelled, "kind_version": 1}).encode(), where="x")


@pytest.mark.parametrize("pattern", ["raw/shard-{000000..000002}.tar", "raw/*.tar", "raw/shard-00000?.tar",
                                     "raw/shard-[0-9].tar"])
def test_a_webdataset_shard_pattern_is_told_to_pass_the_folder(tmp_path, pattern):
    from shardkit import ShardLoader

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "shard-000000.tar").write_bytes(b"")
    url = str(tmp_path / pattern)
    with pytest.raises(ManifestError, match=r"does not exist \(a packed dataset is a directory holding index.json\); "
                                            "a dataset is given as its folder, not a webdataset shard pattern: pass "
                                            r"the folder \(run `shardkit index FOLDER` first if it has no "
                                            r"index.json\)"):
        ShardLoader(url, batch_size=2)
    with pytest.raises(ManifestError, match="not a webdataset shard pattern"):
        read_manifest(Store("memory://no-such-bucket/" + pattern))
    for plain in ("missing", "exp[1]/ds", "what?"):  # folder names, not patterns
        with pytest.raises(ManifestError) as err:
            read_manifest(Store(str(tmp_path / "raw" / plain)))
        assert "pattern" not in str(err.value)
