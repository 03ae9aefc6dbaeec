"""The input forest (``OrderedForest``) and its index (``IndexedForest``): per-node label, size,
depth and subtree shape ids, plus the walks the matcher needs (children, pre-order of subtrees).
Indexing is O(n) time and memory; each walk is O(what it returns).
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass
class OrderedForest:
    """A rooted, ordered, labelled forest in pre-order.

    labels[i]: op name of node i; parent[i]: index of its parent, or -1 for a root.
    Nodes are in pre-order (a parent before its children; siblings in execution order)."""

    labels: list[str]
    parent: list[int]


@dataclass
class IndexedForest:
    """Per-node arrays derived from an OrderedForest (all indexed by pre-order position).

    label: interned label id; size: nodes in the subtree (the subtree of i is [i, i + size[i]));
    depth: 0 for roots; shape: interned id of the labelled ordered subtree; roots: root indices."""

    label: list[int]
    parent: list[int]
    size: list[int]
    depth: list[int]
    shape: list[int]
    roots: list[int]


def index_forest(forest: OrderedForest, label_ids: dict[str, int],
                 shape_ids: dict[tuple[int, ...], int]) -> IndexedForest:
    """Validate the pre-order layout and compute label/size/depth/shape arrays.  O(n) time and memory.

    label_ids and shape_ids are shared between both forests so ids compare across them.
    Raises ValueError when parent[] does not describe a forest in pre-order."""
    labels, parent = forest.labels, forest.parent
    n = len(labels)
    if len(parent) != n:
        raise ValueError(f"labels has {n} entries but parent has {len(parent)}")
    label = [label_ids.setdefault(name, len(label_ids)) for name in labels]
    depth = [0] * n
    path: list[int] = []  # current root-to-node path
    for i in range(n):
        p = parent[i]
        if p < -1 or p >= i:
            raise ValueError(f"node {i}: parent {p} is not an earlier node (input must be in pre-order)")
        if p == -1:
            path.clear()
        else:
            while path and path[-1] != p:
                path.pop()
            if not path:
                raise ValueError(f"node {i}: parent {p} is not on the current path (not pre-order)")
        depth[i] = len(path)
        path.append(i)
    size = [1] * n
    for i in range(n - 1, 0, -1):
        p = parent[i]
        if p >= 0:
            size[p] += size[i]
    shape = [0] * n
    for i in range(n - 1, -1, -1):
        end = i + size[i]
        c = i + 1
        if c == end:
            key: tuple[int, ...] = (label[i],)
        else:
            kids = [label[i]]
            while c < end:
                kids.append(shape[c])
                c += size[c]
            key = tuple(kids)
        shape[i] = shape_ids.setdefault(key, len(shape_ids))
    roots = []
    r = 0
    while r < n:
        roots.append(r)
        r += size[r]
    return IndexedForest(label=label, parent=list(parent), size=size, depth=depth, shape=shape,
                         roots=roots)


def children(forest: IndexedForest, node: int) -> list[int]:
    """Children of node in order.  O(number of children) via subtree sizes."""
    size = forest.size
    out = []
    c = node + 1
    end = node + size[node]
    while c < end:
        out.append(c)
        c += size[c]
    return out


def preorder_of(forest: IndexedForest, items: list[int]) -> list[int]:
    """All nodes of the subtrees rooted at items, in pre-order.  O(total size)."""
    size = forest.size
    out: list[int] = []
    for x in items:
        out.extend(range(x, x + size[x]))
    return out


def labels_with_children(forest: IndexedForest, items: list[int]) -> set[int]:
    """Labels of items and of their children.  O(items + children)."""
    found = set()
    label = forest.label
    for x in items:
        found.add(label[x])
        found.update(label[c] for c in children(forest, x))
    return found


def owner(forest: IndexedForest, node: int, index_of: dict[int, int]) -> int:
    """index_of[a] for the nearest ancestor-or-self a of node that is a key of index_of.
    O(levels walked)."""
    while node not in index_of:
        node = forest.parent[node]
    return index_of[node]
