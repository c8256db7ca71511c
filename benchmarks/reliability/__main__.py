"""Run every reliability experiment and write the report.

From the repository root: ``make reliability``, or
``python -m benchmarks.reliability --out docs/concepts/reliability.md``. Each experiment is seeded
and bounded (a few minutes in all on 2 cores).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.reliability.codec import r1_acceptance, r10_fuzz
from benchmarks.reliability.death import r8_death
from benchmarks.reliability.hostile import (
    r12_hostile_shards,
    r13_hostile_records,
    r14_dali_index,
    r15_concurrent_packs,
    r16_cache,
)
from benchmarks.reliability.loader import r6_resume, r7_ranks, r11_reproducibility
from benchmarks.reliability.process import r4_kill, r5_remote
from benchmarks.reliability.report import render
from benchmarks.reliability.shards import packed, r1_pack_inputs, r2_damaged, r3_integrity, r9_security


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="docs/concepts/reliability.md", help="the report to (re)write")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardkit-reliability-") as tmp:
        work = Path(tmp)
        ds = packed(work)
        rows = [r1_pack_inputs(work), r1_acceptance(work), *r2_damaged(work), r3_integrity(work), *r4_kill(work),
                *r5_remote(work), r6_resume(ds), r7_ranks(ds), *r8_death(ds, work), r9_security(work),
                r10_fuzz(), r11_reproducibility(work), r12_hostile_shards(work), r13_hostile_records(work),
                r14_dali_index(work), r15_concurrent_packs(work), r16_cache(work)]
    seconds = time.perf_counter() - started
    Path(args.out).write_text(render(rows, seconds))
    print(f"wrote {args.out} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
