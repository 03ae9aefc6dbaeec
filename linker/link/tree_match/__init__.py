"""Structural (approximate) matching of two ordered, labelled forests.

docs/linking.md, method 3: pair the ops of an ET call tree with the events of a Kineto call tree when
record-function ids and a plain order walk cannot be used.  The result is an *ordered tree mapping*,
the kind ordered tree edit distance produces: pairs only join equal labels, and for any two pairs
(a, b), (c, d): a is an ancestor of c iff b is an ancestor of d, and a precedes c in pre-order iff b
precedes d.  Wrong pairs are worse than missing ones, so whatever cannot be told apart is left
unpaired and counted.

How it works (n = nodes of both forests):

1. Indexing, O(n): pre-order validation, subtree sizes (the subtree of i is the index range
   [i, i + size[i])), depths, and a canonical *shape id* per subtree (label + ordered child shape
   ids, interned in one dict shared by both forests).  Equal shape ids mean identical labelled
   subtrees, paired wholesale by a slice assignment.
2. If Kineto holds clearly more than the ET (extra iterations, annotations), the stretch of Kineto
   roots the ET lands on is chosen by chaining equal root labels whose offset in pre-order positions
   drifts slowly (window.choose_kineto_window); Kineto roots outside it cost nothing (semi-global).
3. Top-down from the roots (explicit task stack), two sibling sequences are aligned on labels.  The
   common prefix/suffix and anchors (labels unique to both sides, subtree shapes unique to both
   sides, rare labels chained along one diagonal) cut them into gaps, so work follows the
   differences, not the sizes.  A gap is solved by the item DP: an ordered alignment where a pair
   scores by subtree size (identical subtrees most) and an item of either side may be *opened*,
   i.e. treated as a node missing on that side whose children stand in its place, which is exactly
   what a missing Kineto event does (one level of ordered tree edit distance).  Items whose label is
   absent from the other side are opened beforehand.  Large gaps are solved within a band around the
   diagonal or, failing that, chunk by chunk (counted).
4. Every sequence alignment is run twice, biased to the earliest and to the latest matches (the
   latter on the reversed sequences), and only the pairs both agree on are kept: which copy of a run
   of identical siblings went missing cannot be known, so such a run stays unpaired instead of being
   guessed.  A common prefix or suffix that ends inside a periodic run is handed back to the gap.
5. A non-identical pair gets its children aligned next (3).  Siblings left untouched on both sides of
   a gap get an exact Zhang-Shasha ordered tree edit distance when small (run on the mirrored
   forests too, keeping the agreed pairs), else their pre-order label sequences are aligned if short.
6. Below max_depth, the descendants of a paired node are aligned by order only: their pre-order
   label sequences, with the same two-sided alignment.
7. A final O(n) pass drops any pair breaking the ancestor or order rule, so the contract holds
   whatever the heuristics above did.

Why not networkx: the trees are ordered and labelled; general (unordered) graph isomorphism or graph
edit distance solves a much harder problem (exponential; the original tool exhausted 12 GB on 1.7k
nodes).  Nothing here needs a general graph algorithm.

Everything is iterative (explicit stacks; the gap solver nests at most MAX_EXPANSION_NESTING calls),
so trees thousands of levels deep are fine.  Memory: a few integer lists per node, O(n), plus DP
tables bounded by the caps below.  DP rows use itertools.accumulate for their running maximum, so the
Python work per row is proportional to the cells where a pair is possible.

Modules, in the order of the steps:

| module | what |
|---|---|
| ``forest`` | ``OrderedForest`` (input) and its index (``IndexedForest``: labels, sizes, depths, shape ids); step 1 |
| ``window`` | the stretch of Kineto roots the ET lands on; step 2 |
| ``sequences`` | two-sided alignment of token sequences: common ends, anchors, gaps, band, chunks; steps 3-4, 6 |
| ``items`` | the gap solver of a sibling alignment: opening absent items, the item DP; step 3 |
| ``edit_distance`` | Zhang-Shasha ordered tree edit distance for small leftover gaps; step 5 |
| ``matcher`` | the task stack pairing nodes (steps 3-6) and ``match_forests``, which ties everything together |
| ``mapping`` | the final ancestor/order check and the unmatched subtrees; step 7 |
| ``result`` | ``ForestMatch``, ``UnmatchedSubtree``, the work counters |
"""

from linker.link.tree_match.forest import OrderedForest
from linker.link.tree_match.matcher import match_forests
from linker.link.tree_match.result import ET_SIDE, KINETO_SIDE, ForestMatch, UnmatchedSubtree

__all__ = ["ET_SIDE", "KINETO_SIDE", "ForestMatch", "OrderedForest", "UnmatchedSubtree", "match_forests"]
