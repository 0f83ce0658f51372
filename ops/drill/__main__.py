"""`python -m ops.drill ...`: the incident drills."""

import sys

from ops.drill import main

sys.exit(main())
