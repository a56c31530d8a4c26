"""What a comparison with plain decoding says under an answer: the speedup and the lossless badge, why the
speedup is what it is (ui/lesson.py), and whether other generations shared the timed forwards.

Pure: ui/session.py runs the comparison's two timed runs and hands their records here.
"""

from __future__ import annotations

from ui.lesson import explain, explained_html, lesson_line, prefill_decode_line
from ui.render import compare_html
from ui.run import RunRecord


def load_note(spec: RunRecord, plain: RunRecord) -> str:
    """Why the speedup is not this prompt's own, when other generations shared the forwards of either run
    (each forward then costs more, and not equally for the two runs); empty when both ran alone."""
    shared = [r.shared_rounds() for r in (spec, plain)]
    if not any(n for n, _ in shared):
        return ""
    (ns, ms), (npl, mpl) = shared
    return (f"taken under load: other generations shared {ns} of {ms} speculative rounds and {npl} of {mpl} "
            f"plain steps, so this ratio is not the speedup of this prompt alone")


def verdict_html(run: RunRecord, timed: RunRecord | None, plain: RunRecord, sampled: bool,
                 checked: bool = True) -> str:
    """The comparison's lines: `run` the answer as it streamed, `timed` its unseen rerun (None: it did not end
    alike, and the streamed run is timed instead), `plain` plain decoding; sampled: rejection sampling ran at
    temperature > 0, so a difference is expected; checked: the model passed its load check."""
    spec = timed or run
    cut = " and ".join(name for name, r in (("speculative", run), ("plain", plain)) if r.stop_reason == "context")
    note = (f"both runs timed with the page idle; while it streamed to the page the speculative run made "
            f"{run.tps:.1f} tok/s" if timed is not None and run.tps else
            "the speculative run timed as it streamed to the page (its unseen run did not finish alike)")
    return (compare_html(run.ids, plain.ids, spec.tps, plain.tps, run.vocab, sampled=sampled,
                         load=load_note(spec, plain), cut=cut, note=note, checked=checked)
            + explained_html(explain(spec, plain)) + lesson_line(prefill_decode_line(run)))
