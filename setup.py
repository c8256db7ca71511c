"""Build the optional C extensions on the system libjpeg (needs its headers: Debian's
libjpeg62-turbo-dev): the region-of-interest JPEG decoder and restart-indexed JPEGs. Without
them the build is skipped: shardkit decodes whole images and ``pack --jpeg-restart`` refuses.
Everything else is configured in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(name, [source], libraries=["jpeg"], include_dirs=["shardkit"], depends=["shardkit/_jpeg_errors.h"],
                  extra_compile_args=["-O2"], optional=True)
        for name, source in [("shardkit.loader._jpeg_roi", "shardkit/loader/_jpeg_roi.c"),
                             ("shardkit.format._jpeg_restart", "shardkit/format/_jpeg_restart.c")]
    ]
)
