"""The draft head of the embedded model: network (model.py), data, training (train.py, unroll.py), evaluation."""
