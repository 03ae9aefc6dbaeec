"""The write wing: the ET+ out, and the checks of what was written (``docs/formats.md``).

| module | what |
|---|---|
| ``etplus_json`` | ET+ JSON: the input document with the ET+ fields and GPU nodes, untouched parts written back byte for byte |
| ``chakra`` | the Chakra ``.et`` writer: node types, attributes, dependencies from the plan, in topological order |
| ``chakra_encode`` | ``Node`` messages as protobuf wire bytes, chunk by chunk, what repeats encoded once |
| ``chakra_wire`` | ``.et`` framing (varint-length-prefixed messages, optional gzip): streaming reader and atomic writer |
| ``validate`` | ``et-link validate``: ids, dependencies, cycles and communication attributes of JSON or ``.et`` files |
| ``et_def_pb2`` | generated from ``schema/et_def.proto`` by ``scripts/gen_proto.py``; not edited by hand |
"""
