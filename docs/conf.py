"""Sphinx configuration of shardkit's documentation (``make docs``)."""

from __future__ import annotations

import os
import re
import sys
import types

from sphinx.application import Sphinx

# Document the working tree (not an installed copy), as the tests do.
sys.path.insert(0, os.path.abspath(".."))
# autosummary imports every module it lists, and `shardkit/__main__.py` runs the CLI when imported
# (with sphinx-build's arguments): stand an empty module in for it.
sys.modules.setdefault("shardkit.__main__", types.ModuleType("shardkit.__main__"))

project = "shardkit"
author = "shardkit contributors"
copyright = "shardkit contributors"
release = version = "0.1.0"

extensions = [
    "myst_parser",  # the pages are MyST markdown
    "sphinx.ext.autodoc",  # the docstrings are reST with Google-style sections
    "sphinx.ext.autosummary",  # reference/internals: one page per module, found by walking the package
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_click",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # `[text](page.md#a-heading)` links resolve

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
autosummary_generate = True  # writes reference/generated/ (git-ignored) on every build
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = "shardkit"
html_static_path: list[str] = []


# The commands' help is plain text that sphinx-click reads as reST: a glob such as ``*.tar`` would
# open an emphasis. Escape the asterisk of globs (``*`` right before ``.ext``) in what it renders.
_GLOB_STAR = re.compile(r"(?<![\\*])\*(?=\.\w)")


def _escape_globs(app: Sphinx, ctx: object, lines: list[str]) -> None:
    lines[:] = [_GLOB_STAR.sub(r"\\*", line) for line in lines]


def setup(app: Sphinx) -> None:
    for event in ("description", "options", "arguments", "epilog"):
        app.connect(f"sphinx-click-process-{event}", _escape_globs)
