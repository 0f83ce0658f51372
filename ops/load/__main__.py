"""`python -m ops.load`: the open-loop load test and soak (ops.load.loadtest)."""

import sys

from ops.load.loadtest import main

sys.exit(main())
