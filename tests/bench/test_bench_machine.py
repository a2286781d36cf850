"""The machine record: CPU generations that share a model name are told apart."""

from layoutlab.bench import machine

# Two processors of a first-generation and a fourth-generation AMD EPYC: both name
# themselves "AMD EPYC" (their flags differ on AVX-512 here, but Zen 2 and Zen 3 parts
# would have Zen 1's flags too).
_ZEN1 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu avx2 fma

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC
"""
_ZEN4 = _ZEN1.replace("cpu family\t: 23\nmodel\t\t: 1", "cpu family\t: 25\nmodel\t\t: 17")


def test_cpu_id_reads_vendor_family_and_model_of_the_first_processor():
    assert machine.cpu_id(_ZEN1) == "AuthenticAMD/23/1"
    assert machine.cpu_id(_ZEN4) == "AuthenticAMD/25/17"
    # An ARM cpuinfo has none of these fields: no id, not a wrong one.
    assert machine.cpu_id("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n") is None


def test_generations_with_one_model_name_get_different_fingerprints(monkeypatch):
    # An autotune cache entry is keyed by the fingerprint: a choice measured on one
    # generation must not be reused on another that calls itself the same.
    parse = machine.cpu_id
    fingerprints = set()
    for text in (_ZEN1, _ZEN4):
        monkeypatch.setattr(machine, "cpu_id", lambda text=text: parse(text))
        fingerprints.add(machine.machine_fingerprint())
    assert len(fingerprints) == 2, fingerprints
    assert all("AuthenticAMD/2" in f for f in fingerprints), fingerprints
