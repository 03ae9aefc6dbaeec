"""Kernel names demangled as Kineto shows them (``linker.read.demangle``; nvprof stores them mangled).

Three independent checks: names written and demangled here by hand (one feature each, libstdc++'s
spelling); every mangled kernel name of the real captures in ../shared/traces/nsys (the nvprof
database's, the Nsight Systems exports' ``mangledName``) against libstdc++'s own
``__cxa_demangle``, called through ctypes when the library is there (what Kineto calls); and a
name of the nvprof capture that a Kineto trace of another run of the same kernel shows verbatim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gzip
import json
import sqlite3

import pytest

from conftest import shared_trace
from linker.read.demangle import demangle
from linker.read.timing import read_timing_trace

NVPROF = "profiling_lm_nvprof_d7f0424.sqlite"
NSYS = ["nsysai_h100_2gpu_1s.sqlite", "nsysai_mfu_2gpu_after.sqlite", "dlprof_lenet_nsys2022.sqlite"]

HAND_WORKED = [
    # plain function, a substitution for a repeated type
    ("_Z6kernelPfS_i", "kernel(float*, float*, int)"),
    # a function template: return type, int and bool literals, T_ and a substitution of PT_
    ("_Z6kernelIfLi128ELb1EEvPT_S1_", "void kernel<float, 128, true>(float*, float*)"),
    # the anonymous namespace, const pointers, a second template parameter
    ("_ZN2ns12_GLOBAL__N_17reduce_IdjEEvPKT_PS2_T0_",
     "void ns::(anonymous namespace)::reduce_<double, unsigned int>(double const*, double*, unsigned int)"),
    # a lambda in a local name as a template argument, used again through T0_
    ("_ZN2at6native6launchILi4EZNS0_3addERNS_8IteratorEEUlfE_EEviT0_",
     "void at::native::launch<4, at::native::add(at::Iterator&)::{lambda(float)#1}>"
     "(int, at::native::add(at::Iterator&)::{lambda(float)#1})"),
    # S5_ stands for T_ and means the first argument of the template it is used in (launch's 4)
    ("_ZN2at6native6launchILi4EZNS0_8pow_implIfEEvRNS_8IteratorET_EUlfE_EEviS5_",
     "void at::native::launch<4, at::native::pow_impl<float>(at::Iterator&, float)::{lambda(float)#1}>(int, 4)"),
    ("_Z1fSt5arrayIPcLm2EE", "f(std::array<char*, 2ul>)"),
    ("_Z1fI1AI1BIiEEEvv", "void f<A<B<int> > >()"),
    ("_Z1fILin2ELj4ELb0EEvv", "void f<-2, 4u, false>()"),
    ("_Z1fIN2ns4EnumELS1_2EEvv", "void f<ns::Enum, (ns::Enum)2>()"),
    ("_Z1fPFviE", "f(void (*)(int))"),
    ("_Z1fRA3_Kc", "f(char const (&) [3])"),
    ("_Z1fIRiEvOT_", "void f<int&>(int&)"),  # reference collapsing
    ("_Z1fIiEvPVKT_", "void f<int>(int const volatile*)"),
    ("_Z1fIJifEEvDpT_", "void f<int, float>(int, float)"),
    ("_Z1fIJEEvDpT_i", "void f<>(, int)"),  # an empty pack before a parameter: libstdc++'s spelling
    ("_Z12myKernel_Sum17KernelArgsStorageILm4096EE", "myKernel_Sum(KernelArgsStorage<4096ul>)"),
    ("_ZZ4mainENKUlvE_clEv", "main::{lambda()#1}::operator()() const"),
    ("_ZNK2ns5Model7forwardERKNS_6TensorE", "ns::Model::forward(ns::Tensor const&) const"),
    ("_ZN2ns1AIiED0Ev", "ns::A<int>::~A()"),
    ("_ZN2nsplERKNS_1VES2_", "ns::operator+(ns::V const&, ns::V const&)"),
    ("_Z1fIiEvT_Dv4_f", "void f<int>(int, float __vector(4))"),
    ("_ZN2ns1AIiE3runEv.part.0", "ns::A<int>::run() [clone .part.0]"),
]
AS_GIVEN = ["volta_sgemm_128x64_nn", "triton_poi_fused_add_0", "void f<int>(int)", "", "_Z", "_ZTV3Foo",
            "_ZN3foo", "_Z1fIXplT_Li1EEEvv", "_Z1fS0_", "_Z3fooILi1EEvv trailing"]


@pytest.mark.parametrize("mangled, expected", HAND_WORKED, ids=[m for m, _ in HAND_WORKED])
def test_hand_worked_names(mangled, expected):
    assert demangle(mangled) == expected


@pytest.mark.parametrize("name", AS_GIVEN)
def test_names_not_mangled_or_outside_the_subset_come_back_as_given(name):
    """Not mangled, a vtable, cut short, an expression argument, a substitution never defined,
    text after the name: never half-demangled."""
    assert demangle(name) == name


def _libstdcxx_demangler():
    """libstdc++'s ``abi::__cxa_demangle`` through ctypes, or None when the library is absent."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
    except OSError:
        return None
    function = lib.__cxa_demangle
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                         ctypes.POINTER(ctypes.c_int)]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]

    def run(name: str) -> str | None:
        status = ctypes.c_int()
        pointer = function(name.encode(), None, None, ctypes.byref(status))
        if not pointer:
            return None
        text = ctypes.string_at(pointer).decode()
        free(pointer)
        return text

    return run


def _names(path, sql: str) -> list[str]:
    with sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True) as db:
        return sorted({value for (value,) in db.execute(sql) if value})


def _nvprof_names() -> list[str]:
    return _names(shared_trace("nsys", NVPROF), "SELECT s.value FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL k "
                                               "JOIN StringTable s ON s._id_ = k.name")


def test_nvprof_reader_gives_every_kernel_its_demangled_name():
    path = shared_trace("nsys", NVPROF)
    raw = _nvprof_names()
    assert (len(raw), sum(name.startswith("_Z") for name in raw)) == (42, 31)  # 11 cuBLAS volta_* (C names)
    kernels = [e for e in read_timing_trace(path).gpu_events if e.cat == "kernel"]
    assert len(kernels) == 160
    assert not any(e.name.startswith("_Z") for e in kernels)
    assert {e.name for e in kernels} == {demangle(name) for name in raw}


@pytest.mark.parametrize("source", [NVPROF, *NSYS])
def test_real_kernel_names_demangle_as_libstdcxx_does(source):
    oracle = _libstdcxx_demangler()
    if oracle is None:
        pytest.skip("no libstdc++ to compare with")
    names = _nvprof_names() if source == NVPROF else _names(
        shared_trace("nsys", source), "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                      "JOIN StringIds s ON s.id = k.mangledName")
    mangled = [name for name in names if name.startswith("_Z")]
    assert mangled
    for name in mangled:
        assert demangle(name) == oracle(name), name


def test_a_kernel_of_the_nvprof_capture_is_named_as_a_kineto_trace_names_it():
    """The layer-norm statistics kernel of PyTorch's CUDA build, recorded mangled by nvprof in
    2020 and shown demangled by Kineto in another run: the same text."""
    kineto = shared_trace("sweep", "tl__perf_model__normalization__normalization_layer_test.json.gz")
    shown = {e.get("name") for e in json.loads(gzip.decompress(kineto.read_bytes()))["traceEvents"]
             if e.get("cat") == "kernel"}
    ours = {demangle(name) for name in _nvprof_names() if "RowwiseMoments" in name}
    assert len(ours) == 1 and ours <= shown
