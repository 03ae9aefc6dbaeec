"""et-link: link a PyTorch Execution Trace with its Kineto trace into an enhanced ET (ET+).

Reading order for a newcomer, one trace from file to output:

1. ``et_reader`` / ``kineto_reader``: files -> ``ExecutionTrace`` / ``KineticTrace`` (typed, columnar).
2. ``windows``: which Kineto iteration(s) the ET covers.
3. ``match_rfid`` / ``match_exact`` (``align``) / ``match_approx`` (``tree_match``): ET op -> Kineto event.
4. ``intervals``, ``durations``, ``gpu``: times, exclusive times, GPU ops under their launching op.
5. ``link``: the pipeline tying 1-4 together into a ``LinkResult`` with a ``LinkReport``.
6. ``write_json`` / ``write_chakra``: ET+ JSON or Chakra protobuf out.
7. ``cli``: the ``et-link`` command.
"""

__version__ = "0.2.0"
