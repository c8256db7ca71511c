"""What an adopted sample's members must hold for ``shardkit index`` (docs/concepts/format.md §8): a
label in ``cls`` (and a ``json`` object that agrees with it), or a UTF-8 caption in ``txt``, and
exactly one image member. Each check names the shard and sample it refuses.
"""

from __future__ import annotations

from typing import Any

from shardkit.errors import FormatError
from shardkit.format.bounded import parse_json, parse_label
from shardkit.format.spec import IMAGE_MEMBER_EXTENSIONS

__all__ = ["caption_problem", "json_object", "kind_of", "label_of", "not_one_image"]


def label_of(key: str, fields: dict[str, bytes], where: str, limit: int) -> tuple[int, str | None]:
    """``(label, class name from json or None)`` of one sample; the label must be below ``limit``
    (checked here, before a class list up to it is built)."""
    here = f"{where}:{key}"
    if "cls" not in fields:
        raise FormatError(f"sample has no 'cls' member (has {sorted(fields)}); shardkit index "
                          "needs a class label per sample", where=here)
    try:
        label = parse_label(fields["cls"])
    except ValueError as err:
        raise FormatError(f"'cls' member {err}", where=here) from err
    if label >= limit:
        raise FormatError(f"label {label} is too large: shardkit index lists every class up to the largest "
                          f"label, at most {limit}", where=here)
    name = None
    if "json" in fields:
        meta = json_object(fields, here)
        if "label" in meta and meta["label"] != label:
            raise FormatError(f"'json' label {meta['label']!r:.40} differs from 'cls' {label}",
                              where=here)
        if isinstance(meta.get("class"), str):
            name = meta["class"]
    return label, name


def caption_problem(key: str, fields: dict[str, bytes], where: str) -> tuple[str, str] | None:
    """Check one captioned sample: a ``txt`` member, a ``json`` object if any. A caption that is
    not UTF-8 text (``"not_text"``) or holds none (``"empty_text"``: nothing, or only white
    space, which ``shardkit pack`` skips) is returned with its place (``SHARD:KEY (why)``), not
    refused: one of them should not stop a whole dataset."""
    here = f"{where}:{key}"
    if "txt" not in fields:
        raise FormatError(f"sample has no 'txt' member (has {sorted(fields)}); a captioned dataset needs a caption "
                          "per sample", where=here)
    if "json" in fields:
        json_object(fields, here)
    try:
        text = fields["txt"].decode("utf-8")
    except UnicodeDecodeError as err:
        return "not_text", f"{here}: {err.reason} at byte {err.start}"
    return ("empty_text", here) if not text.strip() else None


def json_object(fields: dict[str, bytes], here: str) -> dict[str, Any]:
    """The sample's ``json`` member, which must be a JSON object."""
    try:
        meta = parse_json(fields["json"])
    except ValueError as err:
        raise FormatError(f"'json' member is not valid JSON ({err})", where=here) from err
    if not isinstance(meta, dict):
        raise FormatError(f"'json' member must be a JSON object, not {type(meta).__name__}", where=here)
    return meta


def not_one_image(key: str, fields: dict[str, bytes]) -> str:
    """Why a sample does not have exactly one image member. Its members may be several samples
    whose keys hold a dot: a key is a member's name up to its first dot (docs/guides/interop.md,
    the keys rule), so webdataset's ShardWriter writes key ``img.3`` as ``img.3.jpg``, which
    reads as key ``img`` with extension ``3.jpg``."""
    dotted = sorted(ext for ext in fields if "." in ext)
    images = [ext for ext in dotted if ext.rsplit(".", 1)[1] in IMAGE_MEMBER_EXTENSIONS]
    if not any(ext in IMAGE_MEMBER_EXTENSIONS for ext in fields) and images and len(dotted) < len(fields):
        # members of one sample beside the image, so no dotted key: an extension of several parts
        ext, last = images[0], images[0].rsplit(".", 1)[1]
        return (f"member {f'{key}.{ext}'!r}: its extension is {ext!r} (everything after the key's first dot), not "
                f"an image extension ({', '.join(sorted(IMAGE_MEMBER_EXTENSIONS))}); write the image as "
                f"{f'{key}.{last}'!r}")
    if not any(ext in IMAGE_MEMBER_EXTENSIONS for ext in fields) and images:
        first = dotted[0].split(".", 1)[0]
        named = [ext for ext in dotted if ext.split(".", 1)[0] == first]
        more = len(fields) - len(named)
        return (f"members {', '.join(repr(f'{key}.{ext}') for ext in named)}"
                + (f" (and {more:,} more members like them)" if more else "")
                + ": a key must not contain a dot (webdataset splits a member's name at the first dot, so these "
                f"read as key {key!r} with extensions {', '.join(repr(ext) for ext in named)}); write the keys "
                "without dots")
    found = sorted(fields)
    message = f"expected one image member ({', '.join(sorted(IMAGE_MEMBER_EXTENSIONS))}), found {found}"
    other_case = [ext for ext in found if ext not in IMAGE_MEMBER_EXTENSIONS
                  and ext.lower() in IMAGE_MEMBER_EXTENSIONS]
    if other_case and not any(ext in IMAGE_MEMBER_EXTENSIONS for ext in found):
        ext = other_case[0]
        message += (f"; extensions are case-sensitive in shards: {ext} is not {ext.lower()}; rename the members "
                    "or repack")
    return message


def kind_of(fields: dict[str, bytes]) -> str:
    """The kind the first sample says the shards hold: captioned with a ``txt`` member and no ``cls``,
    else labelled (a sample without ``cls`` is then refused as such)."""
    return "captions" if "txt" in fields and "cls" not in fields else "imagefolder"
