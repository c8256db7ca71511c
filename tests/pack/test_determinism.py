import hashlib
import json

from shardkit.pack import PackOptions, pack
from tests.trees import make_tricky_tree


def _digests(root):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def test_same_bytes_for_any_worker_count_and_on_reruns(tmp_path):
    src = make_tricky_tree(tmp_path)
    options = PackOptions(max_count=3, seed=7)
    runs = [(1, "w1"), (3, "w3"), (1, "w1-again"), (2, "w2")]
    digests = []
    for workers, name in runs:
        result = pack(str(src), str(tmp_path / name), options=options, workers=workers)
        assert len(result.manifest.shards) >= 4
        digests.append(_digests(tmp_path / name))
    assert all(d == digests[0] for d in digests[1:])
    manifest = json.loads((tmp_path / "w1" / "index.json").read_bytes())
    assert {s["url"]: s["sha256"] for s in manifest["shards"]} == {
        k: v for k, v in digests[0].items() if k.endswith(".tar")}


def test_options_change_the_bytes(small_tree, tmp_path):
    pack(str(small_tree), str(tmp_path / "a"), options=PackOptions(max_count=5, seed=0), workers=1)
    pack(str(small_tree), str(tmp_path / "b"), options=PackOptions(max_count=5, seed=1), workers=1)
    assert (_digests(tmp_path / "a")["shard-000000.tar"]
            != _digests(tmp_path / "b")["shard-000000.tar"])
