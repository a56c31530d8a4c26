"""How a forward computes: the lean decoder loop, cell attention, the linears (float, bfloat16, Q4_1/Q8_0 blocks in
integers), their C kernels.
"""
