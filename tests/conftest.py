"""Test-wide settings, applied before numba is imported.

NUMBA_NUM_THREADS=16: numba's thread pool may run up to 16 threads, so the tests that run the
conv kernels at 16 threads (tests/test_conv_threads.py) really run 16 threads, oversubscribed on
a small machine. Every other test asks for the default thread count (the machine's cores).
"""
import os

os.environ.setdefault("NUMBA_NUM_THREADS", "16")

# TILEFUSE_TEST_RSS_LOG=FILE: after each test whose run raised this process's (or its children's) peak
# resident memory, append "peak_self_MiB peak_children_MiB pid test_id" to FILE (one line per raise; with
# pytest-xdist each worker appends its own lines). Finds the tests that make `make test` need its memory.
_RSS_LOG = os.environ.get("TILEFUSE_TEST_RSS_LOG")
_rss_peak = [0, 0]


def pytest_runtest_teardown(item):
    if not _RSS_LOG:
        return
    import resource
    now = [resource.getrusage(who).ru_maxrss // 1024 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    if now[0] > _rss_peak[0] or now[1] > _rss_peak[1]:
        _rss_peak[:] = now
        with open(_RSS_LOG, "a") as f:
            f.write(f"{now[0]} {now[1]} {os.getpid()} {item.nodeid}\n")
