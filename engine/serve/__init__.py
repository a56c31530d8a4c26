"""The engine that owns the slots and its scheduler: the one thread that queues requests, batches every slot into
rounds, and the threads a forward runs on.
"""
