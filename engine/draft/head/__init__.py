"""The draft head, EAGLE style, and a published EAGLE-3 head that runs as one: the drafter (drafter.py, eagle3.py),
its network (net.py, eagle3_net.py), its C step (step.py), its per-sequence features (state.py) and the tree it
grows (tree.py). Checkpoints of EAGLE-3 are read by engine/load/eagle3.py."""
