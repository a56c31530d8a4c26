# One command runs the app, one runs the tests; each sets up what it needs first.
.PHONY: run test bench setup setup-dev

run: setup
	@.venv/bin/python app.py $(ARGS)

# the engine's tests run again with bfloat16 weights where the CPU computes bfloat16 natively
BF16_TESTS = tests/test_engine.py tests/test_slots.py tests/test_round_defects.py tests/test_grammar.py \
	tests/test_draft_head.py tests/test_scheduler.py tests/test_embedded.py tests/test_ngram_drafters.py \
	tests/test_tree.py

# two test processes of one torch thread each (pytest-xdist; tests/conftest.py), each taking the next test as it
# finishes one: the suite's many tests that wait on a browser, a server or Python keep both cores busy
WORKERS ?= 2
XDIST = -n $(WORKERS) --dist worksteal

test: setup-dev
	.venv/bin/python -m pytest -q $(XDIST) --durations=25 $(ARGS)
	@if .venv/bin/python -c "from engine.load.dtype import native_bf16_flag as f; raise SystemExit(f() is None)"; then \
		echo "bfloat16 pass:"; SPECPLAY_TEST_DTYPE=bfloat16 .venv/bin/python -m pytest -q $(XDIST) $(BF16_TESTS); \
	else echo "no native bfloat16 on this CPU: the bfloat16 pass is skipped"; fi

bench: setup
	.venv/bin/python -m engine.bench --prompts assets/prompts/all.jsonl --out traces.csv --compare hf $(ARGS)

setup:
	./scripts/setup.sh

setup-dev:
	./scripts/setup.sh --dev
