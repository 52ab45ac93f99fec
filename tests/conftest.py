"""Session set-up shared by every test module.

``auto`` reads this machine's speed profile (``attnlab tune``; functional/profile.py) from the user's cache
directory. A developer who has tuned their machine would otherwise run the suite against their profile, and
tests that check auto's built-in rules would depend on it: every test process gets an empty cache directory
of its own (tests that need a profile write one there).
"""
import os
import tempfile

os.environ["ATTNLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnlab-test-cache-")
