"""Small pieces the catalogs share (``capsnet models``, ``capsnet routings``): a class's summary from its docstring,
and text made safe for a Markdown table cell."""
from __future__ import annotations

import inspect

__all__ = ["class_summary", "table_cell"]


def class_summary(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring on one line; "" for a dataclass's generated signature, which
    describes nothing."""
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(cls.__name__ + "("):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def table_cell(text: object) -> str:
    """``text`` for a Markdown table cell: its pipes escaped."""
    return str(text).replace("|", "\\|")
