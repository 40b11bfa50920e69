"""claimbench: does an ML-systems paper's claimed speedup hold on your hardware, at equal quality?"""

__version__ = "0.1.0"
