"""Build the optional C extensions. Two need the system libjpeg's headers (Debian's
libjpeg62-turbo-dev): the region-of-interest JPEG decoder and restart-indexed JPEGs; without
them shardkit decodes whole images and ``pack --jpeg-restart`` refuses. Four need only a C
compiler: the HWC -> CHW repacking of resized crops (without it numpy does that, slower), the
parser of plain tar headers in a sample's bytes (without it the Python parser does all of them),
the reader of a JPEG's frame header (without it, the same walk in Python) and the random
resized crop's draws from a sample's seed (without them, Python's random.Random draws).
Everything else is configured in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(name, [source], libraries=["jpeg"], include_dirs=["shardkit/codec"],
                  depends=["shardkit/codec/_jpeg_errors.h"], extra_compile_args=["-O2"],
                  optional=True)
        for name, source in [("shardkit.codec._jpeg_region", "shardkit/codec/_jpeg_region.c"),
                             ("shardkit.codec._jpeg_restart", "shardkit/codec/_jpeg_restart.c")]
    ]
    # -O3: the repacking loops are only fast once the compiler vectorises them.
    + [Extension("shardkit.transforms._planar", ["shardkit/transforms/_planar.c"],
                 extra_compile_args=["-O3"], optional=True),
       Extension("shardkit.format._tarspan", ["shardkit/format/_tarspan.c"], extra_compile_args=["-O2"],
                 optional=True),
       Extension("shardkit.codec._jpeg_header", ["shardkit/codec/_jpeg_header.c"], extra_compile_args=["-O2"],
                 optional=True),
       # no contraction into fused multiply-adds: the draws must round as Python's float arithmetic does
       Extension("shardkit.transforms._draws", ["shardkit/transforms/_draws.c"],
                 extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"], optional=True)]
)
