"""One speculative round for every generating slot: the batch of drafts, one forward, verification, the tree walk,
rollback of the rejected tail; the budget of draft rows is engine/budget/.
"""
