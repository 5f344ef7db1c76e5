"""Small pieces the catalogs share (``capsnet models``, ``capsnet routings``): a class's summary from its docstring,
and text made safe for a Markdown table cell."""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap

__all__ = ["class_doc", "class_summary", "table_cell"]


def class_doc(cls: type) -> str:
    """``cls``'s docstring, cleaned (``inspect.getdoc``), or "". Under ``python -OO``, which strips docstrings (the
    catalogs listed every routing option with no note), read from the class's source, where there is one."""
    if sys.flags.optimize >= 2:
        try:
            node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
            if isinstance(node, ast.ClassDef) and (doc := ast.get_docstring(node)):
                return doc
        except (OSError, TypeError, SyntaxError, IndexError):  # no source (a frozen build): as -OO left it
            pass
    return inspect.getdoc(cls) or ""


def class_summary(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring on one line; "" for a dataclass's generated signature, which
    describes nothing."""
    doc = class_doc(cls)
    if doc.startswith(cls.__name__ + "("):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def table_cell(text: object) -> str:
    """``text`` for a Markdown table cell: its pipes escaped."""
    return str(text).replace("|", "\\|")
