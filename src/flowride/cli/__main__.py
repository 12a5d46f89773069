"""``python -m flowride.cli``, as tests and scripts run the command line."""

import sys

from flowride.cli import main

sys.exit(main())
