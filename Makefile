# One command runs the app, one runs the tests; each sets up what it needs first.
.PHONY: run test bench setup setup-dev

run: setup
	.venv/bin/python app.py $(ARGS)

test: setup-dev
	.venv/bin/python -m pytest -q $(ARGS)

bench: setup
	.venv/bin/python -m engine.bench --prompts assets/prompts/all.jsonl --out traces.csv --compare hf $(ARGS)

setup:
	./scripts/setup.sh

setup-dev:
	./scripts/setup.sh --dev
