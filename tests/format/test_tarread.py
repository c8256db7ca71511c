import gzip
import io
import tarfile

import pytest

from shardkit.errors import FormatError
from shardkit.format import TarShardWriter, iter_members, iter_samples, parse_span


def _tar(*members: tarfile.TarInfo, data: bytes = b"abc") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info in members:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_info("0.jpg", tarfile.SYMTYPE, "/etc/passwd"), r"not a regular file \(type b'2': a symbolic link, whose "
                                                         r"bytes the shard does not hold; write the shard with tar's "
                                                         r"--dereference --hard-dereference"),
        (_info("0.jpg", tarfile.LNKTYPE, "other.jpg"), r"not a regular file \(type b'1': a hard link"),
        (_info("0.jpg", tarfile.CHRTYPE), "not a regular file"),
        (_info("0.jpg", tarfile.FIFOTYPE), "not a regular file"),
        (_info("../x.jpg"), "unsafe"),
        (_info("a/../../x.jpg"), "unsafe"),
        (_info("/abs/x.jpg"), "unsafe"),
    ],
)
def test_unsafe_members_are_refused(member, message):
    data = _tar(_info("ok.cls"), member)
    with pytest.raises(FormatError, match=message) as err:
        list(iter_samples(io.BytesIO(data), where="bad.tar"))
    assert "bad.tar" in str(err.value)


def test_unsafe_names_refused_by_parse_span():
    for name in ["../x.jpg", "/x.jpg"]:
        with pytest.raises(FormatError, match="unsafe"):
            parse_span(_tar(_info(name)), where="s")
    with pytest.raises(FormatError, match="not a regular file"):
        parse_span(_tar(_info("x.jpg", tarfile.SYMTYPE, "y")), where="s")


def test_truncated_and_garbage_streams():
    buf = io.BytesIO()
    writer = TarShardWriter(buf)
    writer.add("k", [("jpg", b"x" * 5000)])
    writer.close()
    data = buf.getvalue()
    with pytest.raises(FormatError, match="s.tar"):
        list(iter_members(io.BytesIO(data[:3000]), where="s.tar"))
    with pytest.raises(FormatError, match="s.tar"):
        list(iter_members(io.BytesIO(b"not a tar file" * 100), where="s.tar"))


@pytest.mark.parametrize(("cut", "said"), [
    (lambda d: d[:300], "tar file is truncated"),  # an interrupted copy: its first header is a tar's
    (lambda d: d[:200], r"not a tar file \(200 bytes, less than one 512-byte tar header\)"),
    (lambda d: gzip.compress(d), r"not a tar file: gzip-compressed \(decompress it"),
    (lambda d: bytes(range(256)) * 4, r"not a tar file \(its first 512 bytes are no tar header\)"),
])
def test_a_file_that_is_no_tar_is_told_from_a_damaged_tar(cut, said):
    data = _tar(_info("k.cls"))
    with pytest.raises(FormatError, match=said):
        list(iter_members(io.BytesIO(cut(data)), where="s.tar"))
    damaged = bytearray(data)
    damaged[0] ^= 1  # a ustar header with a wrong checksum is a damaged tar, not another kind of file
    with pytest.raises(FormatError, match="corrupt tar header"):
        list(iter_members(io.BytesIO(bytes(damaged)), where="s.tar"))


def test_directories_are_ignored_and_subdir_keys_kept():
    data = _tar(_info("d", tarfile.DIRTYPE), _info("d/k.cls"), _info("d/k.jpg"))
    assert (list(iter_samples(io.BytesIO(data), where="s"))
            == [("d/k", {"cls": b"abc", "jpg": b"abc"})])


def test_split_samples_and_duplicate_fields_are_refused():
    with pytest.raises(FormatError, match="split"):
        list(iter_samples(io.BytesIO(_tar(_info("a.cls"), _info("b.cls"), _info("a.jpg"))),
                          where="s"))
    with pytest.raises(FormatError, match="twice"):
        list(iter_samples(io.BytesIO(_tar(_info("a.cls"), _info("a.cls"))), where="s"))
    with pytest.raises(FormatError, match="<key>.<ext>"):
        list(iter_samples(io.BytesIO(_tar(_info("noext"))), where="s"))


def test_a_span_ending_after_an_extension_header_is_said_so_without_the_zero_bytes_hint():
    """A span read by stale offsets that stops after a PAX header was told to append zero bytes to
    the shard, which cannot help."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("k.jpg")
        info.pax_headers = {"comment": "x"}
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    pax_only = buf.getvalue()[:1024]  # the extended header and its data block, not the member's header
    with pytest.raises(FormatError, match=r"^s: extension header at byte 0 is not followed by a member$"):
        parse_span(pax_only, where="s")
