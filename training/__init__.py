"""Offline training of the draft head: data (data.py, prompts.py), training (train.py, unroll.py) and held-out
evaluation (eval.py). The network and its loading live with the drafter, in engine/draft/head/net.py; this
package imports the engine, the engine never imports it."""
