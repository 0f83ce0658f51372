"""`python -m ops.cli ...`: the `rollout` command without its console script."""

import sys

from ops.cli import main

sys.exit(main())
