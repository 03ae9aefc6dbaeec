"""Ordered tree edit distance (Zhang-Shasha) for the small leftover gaps of a sibling alignment:
an optimal mapping with unit insert/delete costs where only equal labels map.
Cost: O(keyroot cells of one side x keyroot cells of the other), bounded by the matcher's cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from linker.link.tree_match.forest import IndexedForest, children

_NO_MATCH = 3
"""Cost of mapping two nodes with different labels: more than deleting one and inserting the other
(2), so such a mapping never occurs in an optimum."""


@dataclass
class _PostorderForest:
    """A small forest under a virtual root, numbered 1..n in postorder (n is the virtual root).

    label[k]: label id (-1 for the virtual root); leftmost[k]: postorder number of the leftmost leaf of
    k's subtree; origin[k]: index in the full forest (-1 for the virtual root); keyroots: Zhang-Shasha
    key roots (highest node of each distinct leftmost leaf), ascending.  Index 0 is unused."""

    label: list[int]
    leftmost: list[int]
    origin: list[int]
    keyroots: list[int]


def postorder_forest(forest: IndexedForest, items: list[int], mirror: bool) -> _PostorderForest:
    """Postorder numbering of the subtrees rooted at items (children and items reversed when mirror)
    under a virtual root.  Uses post(v) = pre(v) + size(v) - 1 - depth(v).  O(total size)."""
    total = 1 + sum(forest.size[x] for x in items)
    label = [0] * (total + 1)
    leftmost = [0] * (total + 1)
    origin = [-1] * (total + 1)
    label[total] = -1
    leftmost[total] = 1
    size = forest.size
    pre = 0
    stack = [(x, 1) for x in (items if mirror else reversed(items))]
    while stack:
        x, depth = stack.pop()
        pre += 1
        post = pre + size[x] - 1 - depth + 1  # 1-based
        label[post] = forest.label[x]
        leftmost[post] = post - size[x] + 1
        origin[post] = x
        kids = children(forest, x)
        stack.extend((c, depth + 1) for c in (kids if mirror else reversed(kids)))
    last: dict[int, int] = {}
    for k in range(1, total + 1):
        last[leftmost[k]] = k
    return _PostorderForest(label, leftmost, origin, sorted(last.values()))


def keyroot_cells(f: _PostorderForest) -> int:
    """Sum of the subtree sizes of the key roots: the rows (or columns) one side adds to the work."""
    return sum(k - f.leftmost[k] + 1 for k in f.keyroots)


def _forest_distance(a: _PostorderForest, b: _PostorderForest, i: int, j: int,
                     tree_distance: list[list[int]], fill: bool) -> list[list[int]]:
    """Zhang-Shasha forest distance table between the subtrees of i (in a) and j (in b), unit insert
    and delete costs, label-equal matches free.  fd[x][y] is the distance between the first x nodes
    (postorder) of i's subtree and the first y of j's.  When fill, records tree distances of node pairs
    whose subtrees are whole prefixes.  O(size(i) * size(j))."""
    la, lb, l1, l2 = a.label, b.label, a.leftmost, b.leftmost
    li, lj = l1[i], l2[j]
    rows, cols = i - li + 2, j - lj + 2
    fd = [list(range(cols))]
    for x in range(1, rows):
        gx = li + x - 1
        ax = la[gx]
        up = fd[x - 1]
        row = [x] * cols
        x_whole = l1[gx] == li
        base = fd[l1[gx] - li]
        tdx = tree_distance[gx]
        for y in range(1, cols):
            gy = lj + y - 1
            v = up[y] + 1
            w = row[y - 1] + 1
            if w < v:
                v = w
            ly = l2[gy]
            if x_whole and ly == lj:
                w = up[y - 1] + (0 if ax == lb[gy] else _NO_MATCH)
                if w < v:
                    v = w
                if fill:
                    tdx[gy] = v
            else:
                w = base[ly - lj] + tdx[gy]
                if w < v:
                    v = w
            row[y] = v
        fd.append(row)
    return fd


def tree_edit_pairs(a: _PostorderForest, b: _PostorderForest) -> list[tuple[int, int]]:
    """An optimal ordered tree edit mapping (insert/delete cost 1, only equal labels mapped) between
    two postorder forests, as pairs of original indices.  Traceback prefers deleting, then inserting,
    the last node, so matches lean towards the start.  O(keyroot_cells(a) * keyroot_cells(b))."""
    n1, n2 = len(a.label) - 1, len(b.label) - 1
    tree_distance = [[0] * (n2 + 1) for _ in range(n1 + 1)]
    for i in a.keyroots:
        for j in b.keyroots:
            _forest_distance(a, b, i, j, tree_distance, True)
    l1, l2 = a.leftmost, b.leftmost
    pairs: list[tuple[int, int]] = []
    stack = [(n1, n2)]
    while stack:
        i, j = stack.pop()
        fd = _forest_distance(a, b, i, j, tree_distance, False)
        li, lj = l1[i], l2[j]
        x, y = i - li + 1, j - lj + 1
        while x > 0 and y > 0:
            gx, gy = li + x - 1, lj + y - 1
            here = fd[x][y]
            if here == fd[x - 1][y] + 1:
                x -= 1
            elif here == fd[x][y - 1] + 1:
                y -= 1
            elif l1[gx] == li and l2[gy] == lj:
                if a.origin[gx] >= 0:
                    pairs.append((a.origin[gx], b.origin[gy]))
                x -= 1
                y -= 1
            else:
                stack.append((gx, gy))
                x, y = l1[gx] - li, l2[gy] - lj
    return pairs
