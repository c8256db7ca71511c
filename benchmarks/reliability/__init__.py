"""Seeded adversarial experiments against pack, the loader and the manifest (R1-R11); they write the
reliability report: ``python -m benchmarks.reliability --out docs/concepts/reliability.md``
(``make reliability``).

- :mod:`.shards`: hostile pack inputs (R1), damaged shards (R2), integrity at read time (R3), hostile
  manifests and index files (R9), all in this process;
- :mod:`.codec`: the acceptance rule, what pack keeps against what the loader decodes (R1), and bounded
  fuzzing of the C extensions in a child process (R10);
- :mod:`.process`: ``kill -9`` during pack (R4), S3 faults through a fault-injecting proxy (R5);
- :mod:`.loader`: resume (R6), rank equality (R7), reproducibility of pack and loader (R11);
- :mod:`.death`: ``kill -9`` of a loader worker and of the training process (R8);
- :mod:`.report`: a row of the report, and the page the rows make.
"""
