"""et-link: link a PyTorch Execution Trace with its Kineto trace into an enhanced ET (ET+).

Reading order for a newcomer, one trace from file to output:

1. ``et_reader`` / ``kineto_reader``: files -> ``ExecutionTrace`` / ``KinetoTrace`` (typed, columnar;
   a large Kineto file is read by a forked child meanwhile, ``kineto_ahead`` over ``forked``);
   ``sanity`` checks them; without an ET, ``kineto_graph`` builds the host graph from Kineto.
2. ``windows``: which Kineto iteration(s) the ET covers.
3. ``match_rfid`` / ``match_exact`` (``align``) / ``match_approx`` (``tree_match``): ET op -> Kineto event.
4. ``intervals``, ``durations``, ``gpu``: times, exclusive times, GPU ops under their launching op.
5. ``link``: the pipeline tying 1-4 together into a ``LinkResult`` with a ``LinkReport``.
6. ``busy`` / ``chakra_deps`` / ``sim_fields``: busy durations, dependencies with causes (for simulators).
7. ``write_json`` / ``write_chakra`` (``chakra_encode``, ``chakra_comm``): ET+ JSON or Chakra protobuf out.
8. ``pipeline``, ``batch`` (``job_check``), ``cli``: files in and out, a whole job, the ``et-link`` command.
9. ``sim``: ``et-link simulate``, the replay of the output for one rank or a job.
"""

__version__ = "0.2.0"
