"""traces.csv rows say where they were measured: commit, CPU model and vector extensions, threads, date."""

from __future__ import annotations

from engine.bench.provenance import commit, cpu, provenance
from engine.bench.rows import COLUMNS, load_rows, write_rows

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16
processor\t: 1
model name\t: AMD EPYC 9B14
"""


def test_the_cpu_and_its_kernels_flags_are_read():
    assert cpu(CPUINFO) == ("AMD EPYC 9B14", "avx2;fma;avx512f;avx512_vnni;avx512_bf16")
    assert cpu("") == ("", "")


def test_rows_carry_provenance_unless_they_have_their_own(tmp_path):
    path = tmp_path / "traces.csv"
    here = provenance(threads=2)
    assert here["threads"] == 2 and here["date"].endswith("Z") and len(here["date"]) == 17
    write_rows([{"prompt_id": "a"}, {"prompt_id": "b", "cpu": "elsewhere"}], path, measured=here)
    rows = load_rows(path)
    assert set(("commit", "cpu", "cpu_flags", "threads", "date")) <= set(COLUMNS)
    assert rows[0]["threads"] == "2" and rows[0]["cpu"] == here["cpu"] and rows[0]["commit"] == here["commit"]
    assert rows[1]["cpu"] == "elsewhere"  # a row measured elsewhere keeps its own
    assert commit() == "" or len(commit().rstrip("+")) == 12  # this checkout's commit
