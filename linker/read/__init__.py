"""The read wing: trace files into typed, columnar traces (formats in ``docs/formats.md``).

| module | what |
|---|---|
| ``files`` | input bytes (plain or gzip, ISA-L inflate when installed), output path checks, atomic outputs (hidden temporary file renamed when complete) |
| ``et`` | the ET reader and its types: ``ExecutionTrace`` (columns over msgspec ``EtNode`` structs, both node layouts, bulky fields kept raw) |
| ``kineto`` | the Kineto reader and its types: ``KinetoTrace``, ``KinetoEvent``, ``CpuColumns`` (only the categories and ``args`` et-link uses are decoded) |
| ``sanity`` | one pass after reading: refuse unusable ids, repair unusable parents, leave out unusable Kineto times, with warnings |
| ``rank_names`` | a file's rank from its name, for ``batch`` and ``simulate`` |
| ``demangle`` | C++ kernel names demangled as Kineto shows them (nvprof stores them mangled) |
| ``nccl_nvtx`` | NCCL kernels' message sizes from NCCL's NVTX payloads in an Nsight Systems capture |

A new timing source (Nsight Systems, nvprof) is a new reader here that produces the same
``KinetoTrace``; nothing after this wing needs to know where the times came from.
"""
