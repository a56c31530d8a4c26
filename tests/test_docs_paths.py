"""The docs name files that exist and link to headings that exist, and docs/measured.md stays a page of current
figures (at most 400 lines; what it replaced lives in docs/history.md).

A reference is a markdown link's target, or a word inside backticks (inline or in a fenced block) that looks like a
repo path: rooted at a top-level folder of the repo, or ending in a file extension. A rooted path must exist from
the repo root (or the doc's folder); a bare name (`gemm.py`) or a partial path (`head/net.py`) must be the name or
the tail of a file in the repo. Skipped: URLs, absolute paths, globs and placeholders, the virtualenv, and the
files a documented command writes (`--out traces.csv`)."""

import functools
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED_MAX_LINES = 400

EXTENSIONS = (".py", ".md", ".jsonl", ".json", ".csv", ".txt", ".toml", ".sh", ".c", ".h", ".png", ".html",
              ".css", ".ini", ".safetensors", ".gguf", ".yaml", ".yml", ".cfg")
# Files a run writes where the user asks it to, or that a reader makes for a command (a prompts file of their own).
OUTPUTS = {"traces.csv", "arena.csv", "arena.png", "plain.csv", "ctx.csv", "heldout4.jsonl", "two.jsonl", "p.jsonl",
           "p8.jsonl", "traces-remote.csv", "remote_acceptance.png"}
# Files of other projects, named as their reference code or a checkpoint's layout.
EXTERNAL = {"eagle/model/cnets.py", "vllm/model_executor/models/llama_eagle3.py", "config.json", "model.safetensors",
            "dflash/model.py", "convert_hf_to_gguf.py", "conversion/qwen.py", "common.h"}
OUTPUT_FLAGS = {"--out", "--png", "--html", "--csv", "--save", "-o", ">", ">>", "--output"}
PLACEHOLDER = re.compile(r"[*<>$?{}\[\]]|\.\.\.|^P\.jsonl$|/P\.jsonl$|^FILE|DIR")
SKIP_PREFIXES = ("http://", "https://", "mailto:", "/", "~", ".venv", "$")
_WALK_SKIP = {".git", ".venv", "__pycache__", ".pytest_cache", "node_modules", ".hypothesis"}


def _docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(ROOT.joinpath("docs").glob("*.md"))]


@functools.lru_cache(maxsize=1)
def repo_index() -> tuple[frozenset[str], frozenset[str]]:
    """(the repo's top-level folders, every trailing part of every file and folder path)."""
    files, dirs = set(), set()
    for here, subdirs, names in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in _WALK_SKIP]
        rel = Path(here).relative_to(ROOT).as_posix()
        if rel != ".":
            dirs.add(rel)
        files.update(n if rel == "." else f"{rel}/{n}" for n in names)
    return frozenset(d for d in dirs if "/" not in d), frozenset(_tails(files | dirs))


def _split_fences(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, fenced lines); a fence opens and closes with ``` or ~~~."""
    prose, fenced, inside = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            inside = not inside
            continue
        (fenced if inside else prose).append(line)
    return prose, fenced


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    return _anchors_in(path.read_text())


def _anchors_in(text: str) -> frozenset[str]:
    prose, _ = _split_fences(text)
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = line.startswith("#") and re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


_PATH_CHARS = re.compile(r"[\w.\-/]+")
_NOT_A_FILE = re.compile(r"\.\w+|[A-Z][a-z]\w*\.[a-z]")  # a bare extension (`.gguf`), an attribute (`RoundCost.c`)


def _looks_like_path(word: str, top: frozenset[str]) -> bool:
    if not word or word.startswith(SKIP_PREFIXES) or word.startswith("-") or PLACEHOLDER.search(word):
        return False
    if not _PATH_CHARS.fullmatch(word) or "//" in word or _NOT_A_FILE.fullmatch(word):
        return False
    head = word.split("/")[0]
    return ("/" in word and head in top) or word.lower().endswith(EXTENSIONS)


def _code_words(prose: list[str], fenced: list[str]) -> list[str]:
    """Words of backticked spans and fenced blocks, without the files a command writes."""
    spans = re.findall(r"`([^`]+)`", " ".join(prose)) + fenced  # a span may wrap onto the next line
    words = []
    for span in spans:
        tokens = span.split()
        for i, tok in enumerate(tokens):
            if i and tokens[i - 1] in OUTPUT_FLAGS:
                continue
            tok = tok.split("=", 1)[1] if tok.startswith("--") and "=" in tok else tok
            tok = tok.strip("\"'(),;:")
            tok = re.sub(r"(::|:)[\w\[\]\-.]*$", "", tok) if ".py:" in tok else tok
            words.append(tok)
    return words


def _links(prose: list[str]) -> list[str]:
    text = re.sub(r"`[^`]*`", "", "\n".join(prose))
    return re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


def _tails(paths: set[str]) -> set[str]:
    """Every trailing part of every path: engine/draft/head/net.py gives net.py, head/net.py, ..."""
    out = set()
    for p in paths:
        parts = p.split("/")
        out.update("/".join(parts[i:]) for i in range(len(parts)))
    return out


def _exists(word: str, doc: Path, tails: frozenset[str], top: frozenset[str]) -> bool:
    word = word.rstrip("/")
    if (ROOT / word).exists() or (doc.parent / word).exists():
        return True
    return word.split("/")[0] not in top and word in tails


def broken_references(doc: Path, text: str | None = None) -> list[str]:
    """Every path or anchor `doc` (or `text`, read as if it were `doc`) names that does not resolve."""
    top, tails = repo_index()
    text = doc.read_text() if text is None else text
    prose, fenced = _split_fences(text)
    bad = []
    for word in _code_words(prose, fenced):
        if word in OUTPUTS or word in EXTERNAL or not _looks_like_path(word, top):
            continue
        if not _exists(word, doc, tails, top):
            bad.append(f"{word} (no such file)")
    for target in _links(prose):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve()
        if path and not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and not path and anchor not in _anchors_in(text):
            bad.append(f"{target} (no heading #{anchor})")
        elif anchor and path and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor})")
    return bad


def test_docs_name_files_and_headings_that_exist():
    bad = {str(d.relative_to(ROOT)): b for d in _docs() if (b := broken_references(d))}
    assert not bad, f"stale references in the docs: {bad}"


_CODE_REF = re.compile(r"(?<!llama\.cpp's )docs/([\w.-]+\.md)(#[\w-]+)?")


def broken_code_pointers(path: Path, text: str | None = None) -> list[str]:
    """The docs a source file's comments point to that do not resolve; a pointer to measured.md or history.md
    must name its section, since those pages change by the figure."""
    bad = []
    for m in _CODE_REF.finditer(path.read_text() if text is None else text):
        name, anchor = m.group(1), (m.group(2) or "")[1:]
        doc = ROOT / "docs" / name
        if not doc.exists():
            bad.append(f"{m.group(0)} (no such file)")
        elif anchor and anchor not in anchors(doc):
            bad.append(f"{m.group(0)} (no such heading)")
        elif not anchor and name in ("measured.md", "history.md"):
            bad.append(f"{m.group(0)} (no section named)")
    return bad


def test_code_comments_point_at_sections_that_exist():
    sources = [ROOT / "app.py", *(p for d in ("engine", "ui", "training", "scripts", "tests")
                                  for p in ROOT.joinpath(d).rglob("*.py") if p.name != Path(__file__).name)]
    bad = {str(p.relative_to(ROOT)): b for p in sources if (b := broken_code_pointers(p))}
    assert not bad, f"code comments pointing at no section of the docs: {bad}"
    probe = "# see docs/measured.md, docs/history.md#no-such-heading and docs/measured.md#measured-figures"
    assert broken_code_pointers(ROOT / "app.py", probe) == ["docs/measured.md (no section named)",
                                                            "docs/history.md#no-such-heading (no such heading)"]


def test_measured_md_holds_current_figures_only():
    n = len(ROOT.joinpath("docs", "measured.md").read_text().splitlines())
    assert n <= MEASURED_MAX_LINES, f"docs/measured.md has {n} lines: move what is superseded to docs/history.md"


def test_the_check_finds_a_stale_path_and_a_stale_anchor():
    text = ("# A probe's `page`\n\nSee `engine/draft/draft_head.py`, `head_net.py`, [trees](trees.md#no-such-heading),"
            " [gone](gone.md) and [here](#nowhere); `engine/forward/gemm.py`, `gemm.py`, [trees](trees.md), [the top]"
            "(measured.md#measured-figures) and [here](#a-probes-page) are fine.\n"
            "```bash\n# not a heading\n.venv/bin/python scripts/no_such_script.py --out traces.csv\n```\n")
    bad = broken_references(ROOT / "docs" / "probe.md", text)
    assert bad == ["engine/draft/draft_head.py (no such file)", "head_net.py (no such file)",
                   "scripts/no_such_script.py (no such file)", "trees.md#no-such-heading (no heading #no-such-heading)",
                   "gone.md (no such file)", "#nowhere (no heading #nowhere)"]


def test_slugs_follow_github():
    assert slug("Block drafters (`draft-dflash`, `draft-dspark`)") == "block-drafters-draft-dflash-draft-dspark"
    assert slug("The page's speedup against the bench's") == "the-pages-speedup-against-the-benchs"
    assert slug("Xeon AMX: the app's chain, per prompt") == "xeon-amx-the-apps-chain-per-prompt"
    assert slug("Held-out acceptance (chains, fixed 4-token drafts)") == "held-out-acceptance-chains-fixed-4-token-drafts"
