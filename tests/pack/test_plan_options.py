import pytest

from shardkit.pack import PackOptions, parse_size
from shardkit.pack.plan import SAMPLE_OVERHEAD, plan_shards, sample_order


@pytest.mark.parametrize(("text", "n"), [("256MB", 256 * 10**6), ("1GiB", 2**30), ("4096", 4096),
                                         ("1.5kb", 1500), (" 2 MiB ", 2 * 2**20), (77, 77)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "MB", "12 parsecs", "-1", "1e3"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("kw", [{"max_count": 0}, {"max_size": 0}, {"quality": 0}, {"quality": 101},
                                {"resize_max": 0}, {"prefix": "a/b"}])
def test_options_validate(kw):
    with pytest.raises(ValueError):
        PackOptions(**kw)


def test_plan_respects_count_and_size_and_covers_everything():
    sizes = [100, 5000, 100, -1, 100, 100, 20000]
    plans = plan_shards(sizes, max_count=3, max_size=3 * SAMPLE_OVERHEAD + 5200, shuffle=False,
                        seed=0, prefix="p")
    # oversize sample: its own shard
    assert [p.members for p in plans] == [(0, 1, 2), (3, 4, 5), (6,)]
    assert [p.name for p in plans] == ["p-000000.tar", "p-000001.tar", "p-000002.tar"]
    shuffled = plan_shards(sizes, max_count=2, max_size=10**9, shuffle=True, seed=3, prefix="p")
    assert sorted(i for p in shuffled for i in p.members) == list(range(len(sizes)))
    assert (shuffled
            == plan_shards(sizes, max_count=2, max_size=10**9, shuffle=True, seed=3, prefix="p"))


def test_sample_order_is_a_seeded_permutation():
    assert sample_order(5, shuffle=False, seed=9) == [0, 1, 2, 3, 4]
    order = sample_order(1000, shuffle=True, seed=1)
    assert sorted(order) == list(range(1000)) and order != list(range(1000))
    assert (order == sample_order(1000, shuffle=True, seed=1)
            != sample_order(1000, shuffle=True, seed=2))
    assert plan_shards([], max_count=1, max_size=1, shuffle=True, seed=0, prefix="p") == []


def test_options_that_would_change_nothing_are_refused():
    """Recorded in index.json, an option without effect would refuse a later re-run without it."""
    with pytest.raises(ValueError, match="quality=50 applies with resize_max only"):
        PackOptions(quality=50)
    with pytest.raises(ValueError, match="seed=5 applies with shuffle=True only"):
        PackOptions(shuffle=False, seed=5)
    assert PackOptions(resize_max=64, quality=50).quality == 50
    assert PackOptions(shuffle=False).seed == 0
