"""The writers: the ET+ out as JSON or as a Chakra protobuf trace, and the checker of both.

| module | what |
|---|---|
| ``etplus_json`` | the ET+ JSON, streamed in pieces by a writer thread |
| ``chakra`` | the ``.et`` writer's entry points: ``GlobalMetadata``, then every node in the plan's write order, a chunk at a time |
| ``chakra_encode`` | ``NodeFrames``: one encoder of ``Node`` wire bytes for CPU and GPU ops (fields in field-number order) |
| ``chakra_fields`` | the part of a node the ET alone gives (inputs, outputs, a CPU op's own attributes), cached by text |
| ``chakra_attrs`` | ``Node.attr``: which ``AttributeProto`` kind a value is stored as, and the encoder that caches them |
| ``protobuf_wire`` | varints and field tags named from the schema (``model.et_def_pb2``) |
| ``chakra_wire`` | the ``.et`` file: framing, streaming reader, atomic writer, attribute values, dump |
| ``validate`` | ``et-link validate``: the invariants of a ``.et`` or ET / ET+ JSON file (a package) |

Lower modules first: ``protobuf_wire`` < ``chakra_wire`` < ``chakra_attrs`` < ``chakra_fields`` <
``chakra_encode`` < ``chakra``; ``validate`` reads files through ``chakra_wire`` and shares none of
the encoder's code (but ``protobuf_wire.is_int64``).
"""
