"""The link wing: ET op -> Kineto event, GPU op -> launching CPU op, and the ET+ (``docs/linking.md``).

| module | what |
|---|---|
| ``recipe`` | ``link(et, kineto, LinkOptions) -> LinkResult``: same-run check, method choice, window, nesting, GPU attribution, report |
| ``threads`` | ``OpMatch`` (what every method returns) and the pairing of ET threads with Kineto threads by content |
| ``rfid`` | method 1: the join on record-function ids, validated before it is trusted |
| ``windows`` | which Kineto iteration(s) the ET covers (``--annotation``, ``ProfilerStep#N``, automatic) |
| ``exact`` | method 2: order alignment per thread, with shape-aware re-alignment around differences |
| ``align`` | the order-preserving alignment of two name sequences (shift detection, anchors, both-ways agreement) |
| ``approx`` | method 3: call-tree matching per thread, then children settled by name and shapes |
| ``tree_match/`` | ordered labelled forest matching (its own map in its ``__init__``) |
| ``intervals`` | Kineto CPU events as intervals: threads, nesting, which op covers time t |
| ``durations`` | nesting parents and exclusive durations in one sweep |
| ``gpu`` | every kernel / memcpy / memset under the CPU op that launched it, and the accounting of every GPU event |
| ``report`` | ``LinkReport``: the ``--report`` JSON and the stderr summary |
| ``kineto_only`` | no ET: the host graph built from the Kineto trace |
| ``etplus`` | ``EtPlus``: times on linked ET nodes, new GPU nodes under their launcher |
"""
