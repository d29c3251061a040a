"""tests/image: the node image's verifier (suite/) and the tests of build and verify.

suite/ is the testinfra suite `kilonode image verify` runs against a booted image; it needs
a target, so a plain `pytest` run does not collect it (verify sets KILONODE_VERIFY_CONTEXT).
"""

import os

collect_ignore = [] if os.environ.get("KILONODE_VERIFY_CONTEXT") else ["suite"]
