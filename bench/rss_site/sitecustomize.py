"""Loaded by a process that has this directory on PYTHONPATH: bench/rss_probe.py's probe thread
(only when TIDEMQ_RSS_PROBE_DIR is set; see bench/load_test.py --probe)."""

import os
import sys

if os.environ.get("TIDEMQ_RSS_PROBE_DIR"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        import rss_probe

        rss_probe.install()
    finally:
        del sys.path[0]
