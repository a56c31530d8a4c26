"""The drafters (n-grams, a draft model, the trained head), the chain that relays or merges them, trees of drafts,
the gate, the per-drafter statistics and the draft length policy.
"""
