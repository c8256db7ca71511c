import pytest

from shardkit.errors import FormatError
from shardkit.format.spec import (
    check_key,
    check_prefix,
    is_shard_name,
    key_width,
    make_key,
    normalize_extension,
    offsets_name,
    shard_name,
    split_member,
)


def test_shard_and_offsets_names():
    assert shard_name("train", 0) == "train-000000.tar"
    assert shard_name("a-b", 1234567) == "a-b-1234567.tar"
    assert offsets_name("train-000003.tar") == "train-000003.idx"
    assert is_shard_name("train-000003.tar")
    assert not is_shard_name("train-03.tar")
    assert not is_shard_name("index.json")
    with pytest.raises(ValueError):
        shard_name("x", -1)


@pytest.mark.parametrize("prefix", ["", "a/b", ".hidden", "a\\b"])
def test_bad_prefixes(prefix):
    with pytest.raises(ValueError):
        check_prefix(prefix)


def test_keys():
    assert make_key(42, key_width(10)) == "00000042"
    assert key_width(10**9 + 1) == 10
    assert check_key("abc_1-2") == "abc_1-2"
    for bad in ["a.b", "a/b", "", "é", "a b"]:
        with pytest.raises(FormatError):
            check_key(bad)


def test_split_member_at_first_dot_like_webdataset():
    assert split_member("00000001.jpg") == ("00000001", "jpg")
    assert split_member("k.seg.png") == ("k", "seg.png")
    for bad in ["nodot", ".jpg", "key."]:
        with pytest.raises(FormatError):
            split_member(bad)


@pytest.mark.parametrize(("suffix", "ext"), [(".JPEG", "jpg"), (".jpeg", "jpg"), (".JPG", "jpg"),
                                             (".PNG", "png"), ("webp", "webp"), (".jpe", "jpg")])
def test_normalize_extension(suffix, ext):
    assert normalize_extension(suffix) == ext
