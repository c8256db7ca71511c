"""The package version, in one leaf module: read by the package, the CLI, pack and index, and by the build
(pyproject.toml: ``[tool.setuptools.dynamic]``)."""

__version__ = "0.1.0"
