"""llguidance's compile of a grammar, run first in a child process that can be killed.

llguidance bounds each mask it computes with fuel (LLParserLimits), but not the building of a grammar's lexer: a
JSON schema of 200 patternProperties with additionalProperties false takes seconds whatever the limits, 1,500 of
them minutes (docs/engine.md#a-grammars-compile-time), and a thread running that cannot be stopped. So a grammar
is compiled first in a child process that is killed at its deadline (engine/serve/grammars.py); only a grammar
that compiled there in time is compiled again in this process, into its matcher (about the same time again).

The child is a fresh interpreter (`python -I -c`) that imports llguidance alone: multiprocessing's spawn would
import this process's main module again (torch, in the scripts: 6 s on a shared 2-core host), and a fork would
copy a process full of threads.
"""

from __future__ import annotations

import subprocess
import sys

# reads the llguidance grammar string on stdin, writes llguidance's verdict: "" (compiles), "WARNING: ..." or the
# error; no tokenizer here (it takes 0.5 s to build): what depends on it is checked when the matcher is built.
# At a lower priority (nice 10): one visitor's compile must not take the cores from every answer's rounds
CHILD_NICE = 10
CHILD_CODE = (
    "import os, sys\n"
    f"os.nice({CHILD_NICE})\n"
    "from llguidance import LLMatcher\n"
    "sys.stdout.write(LLMatcher.validate_grammar(sys.stdin.read(), None))\n"
)


class ChildCompile:
    """One grammar being compiled in a child process. `verdict` waits for it (from one thread); `kill` stops it
    at once, from any thread."""

    def __init__(self, grammar: str):
        self.grammar = grammar
        self.timed_out = False  # killed because its deadline passed (not because it was abandoned)
        self.process = subprocess.Popen([sys.executable, "-I", "-c", CHILD_CODE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, encoding="utf-8")

    def verdict(self, timeout_s: float) -> str | None:
        """llguidance's message on the grammar ("" when it compiles), or None where the child gave none: its
        deadline passed (`timed_out`, and it is killed), it was killed, or it died (`returncode`)."""
        try:
            out, _ = self.process.communicate(self.grammar, timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill()
            self.process.communicate()  # reaps it
            return None
        except (BrokenPipeError, OSError):  # killed before it read the grammar
            self.kill()
            self.process.wait()
            return None
        return out if self.process.returncode == 0 else None

    def kill(self) -> None:
        self.process.kill()  # nothing happens once it has ended (Popen checks)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def pid(self) -> int:
        return self.process.pid
