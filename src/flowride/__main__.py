import sys

from flowride.cli import main

sys.exit(main())
