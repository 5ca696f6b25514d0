"""MkDocs hook: the docstrings' Sphinx roles (``:func:`x```) shown as plain code.

solar's docstrings cross-reference in reStructuredText roles, which mkdocstrings renders as
text followed by the name; the role's prefix goes, and ``~a.b.c`` shows as ``c``.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:func|meth|mod|class|attr|data|exc|obj):<code>(~?)([^<]*)</code>")


def _plain(m: re.Match) -> str:
    name = m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)
    return f"<code>{name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub(_plain, html)
