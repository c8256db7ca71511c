"""``--overwrite`` on a local DST: the new pack is made beside the old one, which stays whole and
readable until the new one is complete, then takes its place.

The new shards are written to a hidden folder in DST (:data:`REPLACEMENT_DIR`), which is a pack
destination of its own: an interrupted or refused replacement (a skip budget exceeded, a writer
killed) leaves the old dataset as it was, and re-running the same command resumes the
replacement. Once every shard is written, :func:`publish_replacement` removes the old
``index.json`` (DST stops being a dataset), renames each new file into DST (a rename on one file
system: no byte is copied), removes the old pack's files the new one does not reuse, writes the
new ``index.json`` and removes the folder. Interrupted in that step, a re-run finds the
replacement's state in the folder and rewrites the shards already moved out of it.

The price is room for both packs until the new one is complete. An object store has no rename (a
move copies every byte), so there ``--overwrite`` removes the old pack before the new one is
written, as it always did; so does a local DST holding only an unfinished pack (no dataset to keep).
"""

from __future__ import annotations

import os
import shutil

from shardkit.format.dali_index import dali_index_name
from shardkit.format.spec import INDEX_NAME, PACK_STATE_DIR, SHARD_SUFFIX, offsets_name
from shardkit.index.manifest import Manifest
from shardkit.index.manifest_io import write_manifest
from shardkit.pack.resume import is_ours, is_temporary, recorded_plan
from shardkit.pack.write import REPLACEMENT_DIR
from shardkit.storage import Store

__all__ = ["REPLACEMENT_DIR", "discard_replacement", "publish_replacement", "replacement_fingerprint",
           "replacement_stage"]

def replacement_stage(store: Store) -> Store | None:
    """The folder a pack with ``--overwrite`` writes into: for a local DST holding a finished pack
    (a dataset to keep readable), or a replacement begun earlier, :data:`REPLACEMENT_DIR` inside
    it; else None (write into DST itself: there is no dataset to keep, or DST is an object store,
    and an unfinished pack there is removed first, taking no room beside the new one)."""
    if store.remote or store.process_local or not os.path.isdir(store.path("")):
        return None
    names = store.listdir()
    if REPLACEMENT_DIR in names or INDEX_NAME in names:
        return store.child(REPLACEMENT_DIR)
    return None


def publish_replacement(store: Store, stage: Store, manifest: Manifest) -> None:
    """Put the pack written in ``stage`` in the place of the one in ``store`` and publish
    ``manifest`` there (see the module doc). Each shard is moved before the files beside it, and no
    file the new pack names is removed: a re-run after an interruption here finishes the job."""
    store.remove(INDEX_NAME)  # first: DST is no dataset while its files change
    for name in sorted(stage.listdir(), key=lambda n: (not n.endswith(SHARD_SUFFIX), n)):
        if name != PACK_STATE_DIR and not is_temporary(name):
            _move(stage.path(name), store.path(name))
    beside = (offsets_name, dali_index_name) if manifest.options.get("dali_index") else (offsets_name,)
    kept = {name for shard in manifest.shards for name in (shard.url, *(f(shard.url) for f in beside))}
    for name in store.listdir():
        if name not in kept and name != REPLACEMENT_DIR and is_ours(name):
            store.remove(name)
    write_manifest(store, manifest)
    discard_replacement(stage)


def _move(src: str, target: str) -> None:
    os.replace(src, target)  # one file system: DST's folder and the one inside it


def replacement_fingerprint(stage: Store) -> str | None:
    """The fingerprint of the pack a replacement folder holds (its recorded plan), or None."""
    value = (recorded_plan(stage) or {}).get("fingerprint")
    return value if isinstance(value, str) else None


def discard_replacement(stage: Store) -> None:
    """Remove the replacement folder and whatever it holds."""
    shutil.rmtree(stage.path(""), ignore_errors=True)
