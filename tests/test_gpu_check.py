"""scripts/gpu_check.py on the CPU at toy widths: its checks pass and it writes its table and its curve."""

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_passes_on_the_cpu_and_writes_its_files(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main(["--device", "cpu", "--small", "--shapes", "embedded", "--tokens", "12",
                           "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "gpu_check.csv")))
    checks = {r["check"]: r for r in rows}
    for name in ("ngram chain", "trees", "checkpoint", "two slots", "grammar"):
        assert checks[f"lossless: {name}"]["ok"] == "True"
    assert checks["rejection sampling TV <= tolerance"]["ok"] == "True"
    assert float(checks["c(1)"]["value"]) == 1.0 and "oracle n_max 8 speedup" in checks
    assert (tmp_path / "cost_curve.png").stat().st_size > 1000
    assert gpu_check.main(["--device", "gpu"]) == 2  # a bad flag: a clear message, no traceback
