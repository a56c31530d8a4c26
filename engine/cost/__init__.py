"""What a round costs: the cost curve of a forward by its rows, and its calibration on this machine.
"""
