"""Rewrites of a written output, whichever its format: a node's edits and later pieces
(``node_edits``), wait nodes before held ops (``wait_nodes``), or both in one copy of the file.

The format is told by the file's suffix, as the writer named it (``node_edits.is_chakra_path``).
Each format has its own module: the ET+ JSON side in ``node_edits`` and ``wait_nodes``, the
``.et`` side in ``chakra_node_edits``, imported only for a ``.et``, so that the wait step of a JSON
output loads no protobuf (20-30 ms of a small pair's run). Every rewrite is atomic: what fails
leaves the file as it was. Cost: one copy of the file (the modules' docstrings say what is
decoded).
"""

from __future__ import annotations

from pathlib import Path

from linker.write.node_edits import NodeEdit, Piece, edit_json, is_chakra_path
from linker.write.wait_nodes import Wait, edit_and_add_waits_json


def edit_nodes(path: str | Path, edits: dict[int, NodeEdit], pieces: list[Piece]) -> None:
    """Rewrite ``path`` (ET+ JSON or ``.et``) with ``edits`` (node id -> its edit) and ``pieces``
    appended. Raises TraceInputError when the file cannot be read or written or lacks a node
    named."""
    path = Path(path)
    if not edits and not pieces:
        return
    if is_chakra_path(path):
        from linker.write.chakra_node_edits import edit_chakra  # protobuf only for a .et (module docstring)
        edit_chakra(path, edits, pieces)
    else:
        edit_json(path, edits, pieces)


def add_wait_nodes(path: str | Path, waits: list[Wait], first_id: int) -> int:
    """Rewrite ``path`` (ET+ JSON or ``.et``) with a wait node before each held op of ``waits``;
    wait node ids from ``first_id`` (above every id of the file). Returns the nodes written.
    Raises TraceInputError when the file cannot be read or written, or already holds wait nodes
    (a file is rewritten once, right after it is linked)."""
    return edit_and_add_waits(path, {}, [], waits, first_id)


def edit_and_add_waits(path: str | Path, edits: dict[int, NodeEdit], pieces: list[Piece], waits: list[Wait],
                       first_id: int) -> int:
    """Rewrite ``path`` once with ``edits`` and ``pieces`` (``edit_nodes``) and then, on the nodes
    so edited, a wait node before each held op of ``waits`` (``add_wait_nodes``): the file
    ``edit_nodes`` then ``add_wait_nodes`` would leave, for one copy of it instead of two. Returns
    the wait nodes written. Raises TraceInputError as those do; the file is then left as it was."""
    path = Path(path)
    if not waits:
        edit_nodes(path, edits, pieces)
        return 0
    if is_chakra_path(path):
        from linker.write.chakra_node_edits import edit_and_add_waits as edit_and_add_waits_et  # as above
        return edit_and_add_waits_et(path, edits, pieces, waits, first_id)
    return edit_and_add_waits_json(path, edits, pieces, waits, first_id)
