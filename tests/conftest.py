"""Settings for the whole test run."""

import os
import tempfile

# kiln keeps its local key (kiln/trust.py) in the user's config directory; the tests use one
# of their own, made fresh per run, so they neither read nor write the user's. Set before any
# test module runs, so subprocesses the tests start see it too.
if "KILN_CONFIG_DIR" not in os.environ:
    os.environ["KILN_CONFIG_DIR"] = tempfile.mkdtemp(prefix="kiln-test-config-")
