"""Quantized linear weights: one LinearMethod per checkpoint format (base.py), all repacked into
one int4 layout (int4.py) that the compute backends share (int4_linear.py).

Kept free of imports: shard/weights.py imports the torch-free config module from here.
"""
