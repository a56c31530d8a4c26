"""Models in: loading a target or a draft (local folder, hub id, GGUF, the embedded model) and choosing the dtype its
forwards compute in.
"""
