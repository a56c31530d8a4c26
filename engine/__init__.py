"""Speculative-decoding engine: llama.cpp-style drafting and verification on HF transformers models.

Nothing heavy is imported here; import the submodules you need.
"""
