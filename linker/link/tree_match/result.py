"""What ``match_forests`` returns (``ForestMatch``, ``UnmatchedSubtree``) and the work counters it
fills while matching (``MatchStats``). Plain data, no cost."""

from __future__ import annotations

from dataclasses import dataclass

ET_SIDE = "et"
KINETO_SIDE = "kineto"


@dataclass(frozen=True, slots=True)
class UnmatchedSubtree:
    """A maximal connected group of unpaired nodes: its root is unpaired and its parent is paired (or
    it is a root); it holds the unpaired nodes reachable from the root through unpaired children.
    A node missing on the other side whose children were paired is a group of size 1; an extra or
    unmatched subtree is one group of its full size.

    side: ET_SIDE or KINETO_SIDE; root: pre-order index of the group's root in that forest; label:
    the root's label; size: number of nodes in the group."""

    side: str
    root: int
    label: str
    size: int


@dataclass
class MatchStats:
    """Work and outcome counters of one match_forests call (see ``ForestMatch`` for each)."""

    paired_identical: int = 0
    paired_aligned: int = 0
    paired_by_order: int = 0
    item_cells: int = 0
    ted_cells: int = 0
    dp_cells: int = 0
    chunked_fallbacks: int = 0
    ambiguous_unpaired: int = 0
    gaps_unresolved: int = 0
    inconsistent_dropped: int = 0


@dataclass(kw_only=True)
class ForestMatch(MatchStats):
    """Result of match_forests: the pairs, and the counters of ``MatchStats``.

    pairs: (et index, kineto index), sorted by et index; each index occurs at most once; labels equal;
      together an ordered tree mapping (see module docstring).
    edit_cost: insertions + deletions needed: unpaired ET nodes + unpaired Kineto nodes inside
      kineto_span (Kineto roots before/after the stretch the ET landed on are free).  No relabels.
    tree_nodes: (ET nodes, Kineto nodes) of the whole input forests.
    unmatched_subtrees: groups of unpaired nodes (UnmatchedSubtree), ET side and Kineto side (inside
      kineto_span), largest first.
    kineto_span: [start, end) pre-order index range of the Kineto roots the ET landed on (from the first
      to the last Kineto root holding a pair); (0, 0) when nothing is paired.
    paired_identical: pairs made wholesale from identical subtrees (same shape id).
    paired_aligned: other pairs made by the structural alignment (sibling alignment, item DP, tree
      edit distance, pre-order alignment of a leftover gap).
    paired_by_order: pairs made below max_depth by pre-order label alignment under a paired ancestor.
    item_cells: cells of the sibling item DP (items.item_dp) computed in total.
    ted_cells: tree edit distance table cells computed in total (small leftover gaps).
    dp_cells: LCS table cells computed in total (pre-order alignments, rare-token anchors).
    chunked_fallbacks: gaps too large for one exact alignment and without anchors, aligned chunk by
      chunk instead (each chunk exactly, within a band; see sequences._chunked).
    ambiguous_unpaired: candidate pairs left out because the earliest and latest optimal alignments
      disagreed on them (e.g. a run of identical siblings with one copy missing).
    gaps_unresolved: leftover gaps too large for both the tree edit distance and the pre-order
      alignment; their nodes stay unpaired.
    inconsistent_dropped: pairs dropped by the final ancestor/order check.
    """

    pairs: list[tuple[int, int]]
    edit_cost: int
    tree_nodes: tuple[int, int]
    unmatched_subtrees: list[UnmatchedSubtree]
    kineto_span: tuple[int, int] = (0, 0)
