"""What the target remembers: the unified cell cache with seq_rm, the context a batch is decoded in, per-sequence
states of recurrent layers, the probe of what rollback a model supports, checkpoints.
"""
