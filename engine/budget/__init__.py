"""The draft budget: which drafters draft for which sequence and how far, which tree nodes go into the forward,
and what each round cost each slot against plain decoding (draft_budget.py, the one object the round and the
relay ask), with its parts: the gate, the length policy, the slots' budget over their trees and its fair share.
"""
