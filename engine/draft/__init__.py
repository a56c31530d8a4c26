"""The drafters (n-grams, a draft model, the trained head), the chain that relays or merges them, trees of drafts,
the per-drafter statistics and each sequence's record (the gate and the length policy are in engine/budget/).
"""
