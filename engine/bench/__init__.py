"""The benchmark: plain against speculative decoding on the same prompts and seeds, written to traces.csv.

    python -m engine.bench --prompts P.jsonl [--out traces.csv] ...     (engine.bench.cli)
    python -m engine.bench.plot traces.csv [...] --out DIR               (engine.bench.plot)
    python -m engine.bench.dist [--target T --draft D ...]              (engine.bench.dist)

Modules, each importing only those listed before it:
    lossless   the token check against the plain run, and why rejection-sampled and synthetic rows are n/a
    run    one run of a group of prompts (ours plain or speculative, or transformers' generate) and its numbers
    rows   the traces.csv row: its columns, built from runs, written and read back
    sweep  the cross product n_max x concurrency x context length (x synthetic acceptance) on one engine
    live   a small run through a running Scheduler, for the UI's Benchmark tab
    stats  the curves of a sweep from rows (pure), and the sweep's summary lines
    png    a figure dict (plotly's JSON) drawn as a PNG file by matplotlib
    plot   those curves as plotly figures, an HTML page and PNGs
    cli    the command line: arguments, prompts, the summary, exit codes
    tiny_pair  a tiny random target and a draft near it, built and loaded through engine.load.models
    dist   what rejection sampling promises instead: the distribution of short continuations, against the exact one
"""
