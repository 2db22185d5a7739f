"""MkDocs hook: the API reference without Sphinx's roles. The docstrings name code as ``:class:`X``` (and
``:func:``, ``:data:``, ...), which Markdown renders as the role's text before a code span; the rendered page keeps
the code span alone."""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc|obj):(<code>)")


def on_page_content(html: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    return ROLE.sub(r"\1", html)
