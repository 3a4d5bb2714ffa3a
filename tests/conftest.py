"""Test-wide settings, applied before numba is imported.

NUMBA_NUM_THREADS=16: numba's thread pool may run up to 16 threads, so the tests that run the
conv kernels at 16 threads (tests/test_conv_threads.py) really run 16 threads, oversubscribed on
a small machine. Every other test asks for the default thread count (the machine's cores).
"""
import os

os.environ.setdefault("NUMBA_NUM_THREADS", "16")
