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


def test_the_model_files_sha256_is_recorded_and_kept_under_its_fingerprint(tmp_path, monkeypatch):
    import hashlib

    from engine.bench.provenance import model_sha256

    monkeypatch.setenv("SPECPLAY_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 1000)
    want = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert model_sha256(str(gguf)) == want
    (memo,) = (tmp_path / "cache" / "sha256").iterdir()
    assert memo.read_text() == want  # the next run reads it instead of hashing gigabytes again
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 100)
    first = model_sha256(str(folder))
    (folder / "model.safetensors").write_bytes(b"v" * 100)
    assert len(first) == 64 and model_sha256(str(folder)) != first  # other weights, another record
    assert model_sha256("org/some-hub-id") == ""


def test_the_launch_command_repeats_and_warmups_reach_every_row(tmp_path):
    path = tmp_path / "traces.csv"
    here = provenance(threads=1, device="cpu", command="python -m engine.bench --repeat 3", repeats=3, warmups=2)
    write_rows([{"prompt_id": "a"}], path, measured=here)
    (row,) = load_rows(path)
    assert row["command"] == "python -m engine.bench --repeat 3" and row["repeats"] == "3"
    assert row["warmups"] == "2" and row["device"] == "cpu" and row["model_sha256"] == ""
