"""Build the optional region-of-interest JPEG decoder (needs libjpeg headers: Debian's
libjpeg62-turbo-dev). Without them the build is skipped and shardkit decodes whole images.
Everything else is configured in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("shardkit.loader._jpeg_roi", ["shardkit/loader/_jpeg_roi.c"], libraries=["jpeg"],
                  extra_compile_args=["-O2"], optional=True),
        Extension("shardkit.format._jpeg_restart", ["shardkit/format/_jpeg_restart.c"], libraries=["jpeg"],
                  extra_compile_args=["-O2"], optional=True),
    ]
)
